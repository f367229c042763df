"""CUDA compile check of the rendered tree (CI has nvcc but no GPU): the new LSE flash-attention
files and every upstream CUDA file the feature edits compile for sm_86 (the users' RTX 3090) and
sm_90 (H200). Objects only: this machine has no libcuda, and cuBLAS comes as headers from PyPI."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from e2e_helpers import WORKSPACE, build_env, cmake_flags, run

CUBLAS = "nvidia-cublas==13.0.0.19"
OBJ = "ggml/src/ggml-cuda/CMakeFiles/ggml-cuda.dir/"
TARGETS = [
    "fattn-lse.cu.o",                     # new: the op
    "fattn.cu.o",                         # kernel selection, launch
    "ggml-cuda.cu.o",                     # dispatch, supports_op, alloc size
    "fattn-tile.cu.o",                    # tile kernel
    "template-instances/fattn-vec-instance-f16-f16.cu.o",
    "template-instances/fattn-vec-instance-q8_0-q8_0.cu.o",
    "template-instances/fattn-mma-f16-instance-ncols1_1-ncols2_8.cu.o",
]


def cuda_stubs() -> Path:
    """cuBLAS headers from the PyPI wheel and an empty libcuda, inside the workspace (so ccache keys
    stay relative); enough for CMake to generate and for nvcc to compile, not to link."""
    root = WORKSPACE / "cuda-stubs"
    if (root / "include" / "cublas_v2.h").exists():
        return root
    whl_dir = root / "whl"
    p = run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(whl_dir), CUBLAS])
    assert p.returncode == 0, f"pip download {CUBLAS} failed:\n{p.stderr[-2000:]}"
    whl = next(whl_dir.glob("*.whl"))
    (root / "lib").mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(whl) as z:
        for name in z.namelist():
            parts = Path(name).parts
            if "include" in parts:
                dest = root / "include" / Path(*parts[parts.index("include") + 1:])
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(z.read(name))
    for lib in ("libcublas.so", "libcublasLt.so", "libcuda.so"):
        (root / "lib" / lib).touch()
    return root


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed (CI has it)")
def test_cuda_sources_compile_sm86_sm90(cleanroom):
    stubs = cuda_stubs()
    build = cleanroom / "build-cuda"
    logs = WORKSPACE / "logs"
    env = build_env()
    if not (build / "build.ninja").exists():
        flags = [f for f in cmake_flags() if not f.startswith("-DGGML_A") and not f.startswith("-DGGML_F")]
        p = run(["cmake", "-S", str(cleanroom), "-B", str(build), *flags, "-DGGML_CUDA=ON",
                 "-DCMAKE_CUDA_ARCHITECTURES=86;90", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_TOOLS=OFF",
                 "-DLLAMA_BUILD_EXAMPLES=OFF",
                 f"-DCUDA_cublas_LIBRARY={stubs / 'lib' / 'libcublas.so'}",
                 f"-DCUDA_cublasLt_LIBRARY={stubs / 'lib' / 'libcublasLt.so'}",
                 f"-DCUDA_cuda_driver_LIBRARY={stubs / 'lib' / 'libcuda.so'}",
                 f"-DCMAKE_CUDA_FLAGS=-I{stubs / 'include'}"],
                env=env, log=logs / "cuda-cmake.log")
        assert p.returncode == 0, f"see {logs / 'cuda-cmake.log'}\n{p.stdout[-2000:]}{p.stderr[-3000:]}"
    p = run(["ninja", "-C", str(build), "-j2", *[OBJ + t for t in TARGETS]], env=env,
            log=logs / "cuda-build.log", timeout=5400)
    assert p.returncode == 0, f"CUDA compile failed, see {logs / 'cuda-build.log'}\n{p.stdout[-5000:]}"
    for t in TARGETS:
        assert (build / OBJ / t).stat().st_size > 0
