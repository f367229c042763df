"""End-to-end fixtures: the shipped default (PyPI sdist, patches/, templates/dca) applied by the
real `dcaforge` command into a workspace under cleanroom/e2e, and real builds (`dcaforge build`) of the
patched tree and of the baseline (upstream, no feature).

The workspace persists between runs (cleanroom/ is git-ignored), so a second run rebuilds only
what changed; ccache (when installed) is keyed on paths relative to the workspace, so a fresh
clone elsewhere reuses the objects too.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WORKSPACE = Path(os.environ.get("DCAFORGE_E2E_WORKSPACE", REPO / "cleanroom" / "e2e"))
CONFIG = WORKSPACE / "dcaforge.yaml"
JOBS = os.environ.get("DCAFORGE_JOBS", str(os.cpu_count() or 2))


@dataclass(frozen=True)
class Tree:
    src: Path
    build: Path

    def bin(self, name: str) -> Path:
        return self.build / "bin" / name


def run(argv: list[str], cwd: Path | None = None, env: dict | None = None, log: Path | None = None,
        timeout: int = 3600) -> subprocess.CompletedProcess:
    p = subprocess.run(argv, cwd=cwd, env=env, text=True, capture_output=True, timeout=timeout, check=False)
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"$ {' '.join(map(str, argv))}\n{p.stdout}\n{p.stderr}")
    return p


def dcaforge(command: str, *args: str) -> subprocess.CompletedProcess:
    """The real command line, as a user runs it."""
    exe = [sys.executable, "-c", "from dcaforge.cli import main; main()"]
    return run([*exe, command, "-c", str(CONFIG), *args], cwd=REPO)


def _write_config() -> None:
    """The built-in default (examples/upstream.yaml) with the workspace moved to cleanroom/e2e and
    the build set up as cmake_flags() says (portable, static, tests and tools, ccache), plus a smoke
    run of the extension gate's machinery on a tiny model."""
    import yaml

    data = yaml.safe_load((REPO / "examples" / "upstream.yaml").read_text())
    data["root"] = str(REPO)
    data["cleanroom"] = str(WORKSPACE)
    defines = {}
    for flag in cmake_flags():
        if flag.startswith("-D") and "=" in flag and not flag.startswith("-DGGML_CCACHE"):
            k, v = flag[2:].split("=", 1)
            defines[k] = v
    build = data.setdefault("build", {})
    build["jobs"] = int(JOBS)
    build.setdefault("cmake", {})["defines"] = defines
    # --cuda on a machine with nvcc but no GPU stack (CI): cuBLAS headers from PyPI and empty
    # libraries in <workspace>/cuda-stubs (test_e2e_cuda_compile.cuda_stubs makes them), only the library
    stubs = WORKSPACE / "cuda-stubs"
    build["cmake"]["cuda_defines"] = {
        "LLAMA_BUILD_TESTS": "OFF", "LLAMA_BUILD_TOOLS": "OFF", "LLAMA_BUILD_EXAMPLES": "OFF",
        "CUDA_cublas_LIBRARY": str(stubs / "lib" / "libcublas.so"),
        "CUDA_cublasLt_LIBRARY": str(stubs / "lib" / "libcublasLt.so"),
        "CUDA_cuda_driver_LIBRARY": str(stubs / "lib" / "libcuda.so"),
        "CMAKE_CUDA_FLAGS": f"-I{stubs / 'include'}"}
    data.setdefault("gates", []).append({
        "name": "extension-smoke", "kind": "extension", "recipe": "tiny:qwen2",
        "text": str(REPO / "README.md"), "contexts": [256, 512, 1024],
        "chunk": 192, "local": 32, "ppl_ratio_max": 100.0, "passkey_trials": 1})
    WORKSPACE.mkdir(parents=True, exist_ok=True)
    CONFIG.write_text(yaml.safe_dump(data, sort_keys=False))


def cmake_flags() -> list[str]:
    flags = ["-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_SERVER=ON",
             "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
             "-DLLAMA_BUILD_APP=OFF", "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=OFF", "-DLLAMA_BUILD_EXAMPLES=ON",
             "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_TESTS=ON"]
    cpu = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    for feat, opt in (("avx2", "GGML_AVX2"), ("fma", "GGML_FMA"), ("f16c", "GGML_F16C"), ("avx", "GGML_AVX")):
        if f" {feat}" in cpu:
            flags.append(f"-D{opt}=ON")
    if shutil.which("ccache"):
        flags.append("-DGGML_CCACHE=ON")
    return flags
