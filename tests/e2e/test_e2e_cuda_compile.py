"""CUDA compile check of the rendered tree (CI has nvcc but no GPU): the CUDA objects of the feature compile for sm_86
(the users' RTX 3090) and sm_90 (H200). Objects only: this machine has no libcuda, and cuBLAS comes as headers from
PyPI. The suite compiles each object once: the translation units the patch adds or edits (fattn-lse.cu,
fattn-lse-merge.cu, fattn.cu, ggml-cuda.cu) are compiled by tests/e2e/test_llamafile_build.py with the llamafile GPU
script's exact nvcc flags (same llama.cpp pin), so here go the ones that only include an edited header (the tile,
vector and MMA kernels); DCAFORGE_E2E_CUDA=all compiles all eight here too, with CMake's flags."""

from __future__ import annotations

import os
import shutil
import sys
import zipfile
from pathlib import Path

import pytest
from e2e_helpers import WORKSPACE, dcaforge, run

CUBLAS = "nvidia-cublas==13.0.0.19"
OBJ = "ggml/src/ggml-cuda/CMakeFiles/ggml-cuda.dir/"
EDITED = [
    "fattn-lse.cu.o",                     # new: the op
    "fattn-lse-merge.cu.o",               # new: the LSE merge op
    "fattn.cu.o",                         # kernel selection, launch
    "ggml-cuda.cu.o",                     # dispatch, supports_op, alloc size
]
INCLUDERS = [
    "fattn-tile.cu.o",                    # tile kernel
    "template-instances/fattn-vec-instance-f16-f16.cu.o",
    "template-instances/fattn-vec-instance-q8_0-q8_0.cu.o",
    "template-instances/fattn-mma-f16-instance-ncols1_1-ncols2_8.cu.o",
]
ALL_TARGETS = EDITED + INCLUDERS
TARGETS = ALL_TARGETS if os.environ.get("DCAFORGE_E2E_CUDA") == "all" else INCLUDERS


def cuda_stubs() -> Path:
    """cuBLAS headers from the PyPI wheel and an empty libcuda, inside the workspace (so ccache keys
    stay relative); enough for CMake to generate and for nvcc to compile, not to link. The llamafile
    test asks for them too, maybe at the same time from the other pytest-xdist worker: made under a
    lock, in a folder beside, moved into place whole."""
    import fcntl
    import tempfile

    root = WORKSPACE / "cuda-stubs"
    if (root / "include" / "cublas_v2.h").exists():
        return root
    WORKSPACE.mkdir(parents=True, exist_ok=True)
    with open(WORKSPACE / "cuda-stubs.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (root / "include" / "cublas_v2.h").exists():  # the other worker made them while this one waited
            return root
        new = Path(tempfile.mkdtemp(prefix="cuda-stubs.", dir=WORKSPACE))
        whl_dir = new / "whl"
        p = run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(whl_dir), CUBLAS])
        assert p.returncode == 0, f"pip download {CUBLAS} failed:\n{p.stderr[-2000:]}"
        whl = next(whl_dir.glob("*.whl"))
        (new / "lib").mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(whl) as z:
            for name in z.namelist():
                parts = Path(name).parts
                if "include" in parts:
                    dest = new / "include" / Path(*parts[parts.index("include") + 1:])
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    dest.write_bytes(z.read(name))
        for lib in ("libcublas.so", "libcublasLt.so", "libcuda.so"):
            (new / "lib" / lib).touch()
        if root.exists():  # a partial folder of an interrupted run
            shutil.rmtree(root)
        new.rename(root)
    return root


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed (CI has it)")
def test_cuda_sources_compile_sm86_sm90(cleanroom):
    cuda_stubs()
    build = cleanroom / "build-cuda"
    # build.cmake.cuda_defines of the e2e config (e2e_helpers._write_config) point at the stubs
    p = dcaforge("build", "--cuda", "-j", "2", "--targets", " ".join(OBJ + t for t in TARGETS))
    assert p.returncode == 0, f"dcaforge build --cuda failed:\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}"
    for t in TARGETS:
        assert (build / OBJ / t).stat().st_size > 0
