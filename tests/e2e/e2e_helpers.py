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


@dataclass(frozen=True)
class GateRun:
    """One `dcaforge gate` of every configured gate (conftest.gate_run): its process, results.json, and a copy
    of what it wrote."""
    proc: subprocess.CompletedProcess
    results: dict
    out: Path  # results.json, gates.png and logs/, copied before another test's gate run writes there


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
    """Write :func:`e2e_config` to CONFIG."""
    import yaml

    WORKSPACE.mkdir(parents=True, exist_ok=True)
    CONFIG.write_text(yaml.safe_dump(e2e_config(), sort_keys=False))


def e2e_config() -> dict:
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
        "text": str(REPO / "docs" / "workflow.md"), "contexts": [256, 512, 1024],
        "chunk": 192, "local": 32, "ppl_ratio_max": 100.0, "passkey_trials": 1})
    return data


def cmake_flags() -> list[str]:
    flags = ["-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_OPENSSL=OFF",
             # llama-server (the ruler gate, tests/e2e/test_e2e_serve.py) without its web UI (no npm build, no
             # download of prebuilt assets), and the RPC backend with rpc-server (tests/e2e/test_e2e_rpc.py)
             "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DGGML_RPC=ON",
             "-DLLAMA_BUILD_APP=OFF", "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=OFF", "-DLLAMA_BUILD_EXAMPLES=ON",
             "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_TESTS=ON"]
    cpu = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    for feat, opt in (("avx2", "GGML_AVX2"), ("fma", "GGML_FMA"), ("f16c", "GGML_F16C"), ("avx", "GGML_AVX")):
        if f" {feat}" in cpu:
            flags.append(f"-D{opt}=ON")
    if shutil.which("ccache"):
        flags.append("-DGGML_CCACHE=ON")
    return flags


# ----------------------------------------------------------------------------- servers

def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    import socket
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Process:
    """A real server process (llama-server, ggml-rpc-server) started by a test: output to a log file,
    stopped (SIGTERM, then SIGKILL) by its own pid when the `with` block ends."""

    def __init__(self, argv: list[str], log: Path, env: dict | None = None):
        self.argv = [str(a) for a in argv]
        self.log = log
        log.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(log, "w")  # noqa: SIM115 (closed in stop)
        self._fh.write(f"$ {' '.join(self.argv)}\n")
        self._fh.flush()
        self.proc = subprocess.Popen(self.argv, stdout=self._fh, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {})})

    def output(self) -> str:
        self._fh.flush()
        return self.log.read_text(errors="replace")

    def wait_output(self, text: str, timeout: float = 20.0) -> bool:
        """True once `text` is in the log (the servers log from a thread of their own, so a line can
        land after the HTTP answer that caused it); False after timeout."""
        import time
        t0 = time.monotonic()
        while text not in self.output():
            if time.monotonic() - t0 > timeout:
                return False
            time.sleep(0.1)
        return True

    def wait_port(self, port: int, timeout: float = 120.0) -> None:
        import socket
        import time
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.argv[0]} exited with {self.proc.returncode}:\n{self.output()[-4000:]}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        raise TimeoutError(f"{self.argv[0]} does not listen on {port} after {timeout}s:\n{self.output()[-4000:]}")

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=20)
        self._fh.close()
        return self.proc.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class LlamaServer(Process):
    """`llama-server` on 127.0.0.1 (a free port), ready when /health answers 200.

        with LlamaServer(tree.bin("llama-server"), ["-m", model, "--dca", "on"], log) as srv:
            srv.post("/completion", {"prompt": [256, 65], "n_predict": 4})
    """

    def __init__(self, exe: Path, args: list[str], log: Path, timeout: float = 180.0):
        self.port = free_port()
        super().__init__([str(exe), "--host", "127.0.0.1", "--port", str(self.port), *map(str, args)], log)
        self._wait_health(timeout)

    def _wait_health(self, timeout: float) -> None:
        import time
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.proc.returncode}:\n{self.output()[-4000:]}")
            try:
                status, _ = self.request("GET", "/health", timeout=2)
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"llama-server not healthy after {timeout}s:\n{self.output()[-4000:]}")

    def request(self, method: str, path: str, body: dict | None = None, timeout: float = 600) -> tuple[int, dict]:
        import json
        import urllib.error
        import urllib.request
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 (localhost)
                return r.status, json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                return e.code, json.loads(raw)
            except ValueError:
                return e.code, {"raw": raw.decode(errors="replace")}

    def post(self, path: str, body: dict, timeout: float = 600) -> dict:
        status, out = self.request("POST", path, body, timeout)
        if status != 200:
            raise RuntimeError(f"POST {path} -> {status}: {out}\n{self.output()[-3000:]}")
        return out
