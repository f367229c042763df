#!/usr/bin/env python3
"""The GPU library loads: llamafile 0.10.x's own GPU script builds ggml-cuda.so from a rendered clean room of the
user's real tree, a host program dlopen()s it the way llamafile does and runs one DCA attention step through it
(three GGML_OP_FLASH_ATTN_EXT_LSE calls and their GGML_OP_FLASH_ATTN_EXT_LSE_MERGE), against the CPU backend and a
double-precision reference (bench/gpu/lse_dlopen.cpp).

    # here: a rendered room of the real tree without the synthetic series (bench/realtree.py --no-series makes one;
    # the series is upstream's later diff minus the files llamafile patches: its CUDA sources do not compile together),
    # trimmed to what the GPU machine needs
    python3 bench/realtree.py --pin b8953 --work /tmp/realtree-ns --no-compile --no-series
    python3 bench/gpu/llamafile_real_lib.py pack /tmp/realtree-ns/b8953/cleanroom/lf-b8953   # -> cleanroom/gpu-realtree/
    # on the GPU machine, carry cleanroom/gpu-realtree (about 6 MB); resumable: run it again after a timeout
    python3 bench/gpu/llamafile_real_lib.py run cleanroom/gpu-realtree --jobs 16 --budget 540

``run``:
1. the host: the room's ggml (its CPU backend, static) with CMake, and lse_dlopen linked against it, both with
   ``-DGGML_MULTIPLATFORM`` as llamafile builds its host and its library (GGML_CALL is then the Microsoft ABI, which
   every callback the library hands the host uses); ``lse_dlopen --cpu-only`` must pass first;
2. the library: the tree's real ``llamafile/cuda.sh`` (0.10.x: it sources build-functions.sh, globs the ggml-cuda
   sources, compiles each with nvcc in parallel, ggml's core with gcc/g++, links with nvcc; TinyBLAS, as llamafile
   ships it), with ``HOME`` and ``CUDA_PATH`` set for it: ``llamafile/cuda.sh -jN --output ggml-cuda.so``. One change:
   ``--archs`` (default ``86,89,90,120``: the user's RTX 3090, Ada, Hopper, Blackwell; an architecture this nvcc does
   not know is left out) replaces the script's ARCH_FLAGS (75, 80, 86, 89, 90, and 120f with CUDA 13) by one
   ``-gencode arch=compute_X,code=sm_X`` each, set just before its ``COMMON_FLAGS``: the script's own list takes
   twice as long. ``--archs script`` keeps the script's list. The script skips objects newer than their sources, so
   a run stopped by ``--budget`` (seconds; the device runs commands up to 600 s) continues where it stopped;
3. the checks: ``nm -D`` exports ggml_backend_cuda_init/_reg/_get_device_count and ggml_cuda_flash_attn_ext_lse and
   leaves no ggml_cuda_* symbol undefined; ``cuobjdump -lelf`` lists a cubin for each architecture;
4. ``lse_dlopen ggml-cuda.so``: dlopen + dlsym as llamafile/cuda.c's LinkCuda(), ggml_backend_register, then the
   DCA step on the GPU and the CPU, each against the reference (O NMSE < 5e-4, LSE RMS < 3e-3).

Everything it makes goes to ``FOLDER-build`` beside the carried folder (kept between calls on a warm machine, so a
second call resumes); ``results.json`` there (and in ``$OUT`` when set); exit 0 when every check passed, 3 when the
budget ran out (run the same command again).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HOST_SRC = REPO / "bench" / "gpu" / "lse_dlopen.cpp"
KEEP = ("llamafile/cuda.sh", "llamafile/build-functions.sh", "llamafile/tinyblas.h", "llamafile/tinyblas.cu",
        "llamafile/tinyblas-compat.h", "llama.cpp/ggml/")
MULTIPLATFORM = "-DGGML_MULTIPLATFORM"  # as llamafile/build-functions.sh compiles the library
EXPORTS = ("ggml_backend_cuda_init", "ggml_backend_cuda_reg", "ggml_backend_cuda_get_device_count",
           "ggml_cuda_flash_attn_ext_lse", "ggml_cuda_flash_attn_ext_lse_merge")


def pack(room: Path, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    dest = out / "tree.tar.gz"
    with tarfile.open(dest, "w:gz") as tar:
        for rel in KEEP:
            p = room / rel
            if not p.exists():
                raise SystemExit(f"{p} is missing: not a rendered clean room of llamafile 0.10.x")
            tar.add(p, arcname=rel.rstrip("/"), filter=lambda ti: None if ti.name.endswith((".o", ".so")) else ti)
    print(f"{dest} ({dest.stat().st_size / 1e6:.1f} MB)")
    return dest


def sh(argv: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float | None = None) -> tuple[int, str]:
    """Run ``argv`` in its own process group; at ``timeout`` the whole group (the script's background nvcc jobs
    too) is stopped and 124 returned."""
    import signal

    try:
        proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, **(env or {})}, start_new_session=True)
    except FileNotFoundError:
        return 127, f"{argv[0]}: not found"
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate()
        return 124, out


def tool(name: str) -> str:
    return shutil.which(name) or next((str(p) for p in sorted(Path("/usr/local").glob(f"cuda*/bin/{name}"))), name)


def build_host(tree: Path, work: Path, jobs: int) -> tuple[Path | None, str]:
    """The room's ggml (CPU backend, static) and lse_dlopen against it."""
    build = work / "host-build"
    exe = work / "lse_dlopen"
    if exe.exists() and exe.stat().st_mtime > HOST_SRC.stat().st_mtime:
        return exe, "up to date"
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    pc = tree / "llama.cpp" / "ggml" / "ggml.pc.in"  # only ggml's own repository has it (a pkg-config file, not built)
    if not pc.exists():
        pc.write_text("# empty: llama.cpp's copy of ggml has no ggml.pc.in, which ggml's CMakeLists.txt configures\n")
    code, out = sh(["cmake", "-S", str(tree / "llama.cpp" / "ggml"), "-B", str(build), *gen, "-DCMAKE_BUILD_TYPE=Release",
                    "-DBUILD_SHARED_LIBS=OFF", "-DGGML_CUDA=OFF", "-DGGML_NATIVE=ON", "-DGGML_OPENMP=OFF",
                    "-DGGML_BUILD_TESTS=OFF", "-DGGML_BUILD_EXAMPLES=OFF",
                    # llamafile's host and its GPU library are both built with GGML_MULTIPLATFORM: GGML_CALL is then
                    # the Microsoft ABI, and every backend callback the library hands the host (reg->iface.*) uses
                    # it; a host built without it calls them with the System V ABI (seen: a crash in
                    # ggml_backend_cuda_reg_get_device_count, reading reg from rcx)
                    f"-DCMAKE_C_FLAGS={MULTIPLATFORM}", f"-DCMAKE_CXX_FLAGS={MULTIPLATFORM}"], work)
    if code:
        return None, "cmake: " + out[-3000:]
    code, out = sh(["cmake", "--build", str(build), "-j", str(jobs), "--target", "ggml"], work)
    if code:
        return None, "build ggml: " + out[-3000:]
    libs = sorted(str(p) for p in build.rglob("*.a"))
    order = sorted(libs, key=lambda x: ("ggml-base" in x, x))  # dependants first, ggml-base last
    inc = tree / "llama.cpp" / "ggml" / "include"
    code, out = sh(["g++", "-std=c++17", "-O2", MULTIPLATFORM, f"-I{inc}", str(HOST_SRC), "-o", str(exe), "-Wl,--start-group", *order,
                    "-Wl,--end-group", "-ldl", "-lpthread", "-lm"], work)
    if code:
        return None, "link lse_dlopen: " + out[-3000:]
    return exe, "built"


def gencodes(nvcc: str, archs: str) -> tuple[list[str], list[str]]:
    """``-gencode`` flags for each of ``archs`` (comma-separated, e.g. ``86,89,90,120``) that this nvcc knows, and
    the ones it does not (left out, and reported). bench/realtree.py's compile step uses it too."""
    _, listed = sh([nvcc, "--list-gpu-arch"], Path.cwd())
    known = set(re.findall(r"compute_(\d+)", listed))
    wanted = [a.strip() for a in archs.split(",") if a.strip()]
    flags = [f for a in wanted if a in known for f in ("-gencode", f"arch=compute_{a},code=sm_{a}")]
    return flags, [a for a in wanted if a not in known]


def arch_flags(archs: str, nvcc: str) -> str | None:
    """The script's ARCH_FLAGS for ``archs`` (None: ``script``, the script's own list)."""
    return None if archs == "script" else " ".join(gencodes(nvcc, archs)[0])


def build_library(tree: Path, work: Path, jobs: int, archs: str, budget: float) -> tuple[int, str, list[str]]:
    nvcc = tool("nvcc")
    cuda_path = str(Path(nvcc).resolve().parent.parent)
    script = tree / "llamafile" / "cuda.sh"
    flags = arch_flags(archs, nvcc)
    run_script = script
    if flags is not None:
        text = script.read_text()
        i = text.index("\nCOMMON_FLAGS=")
        run_script = script.with_name("cuda.dcaforge-archs.sh")
        run_script.write_text(text[:i] + f'\nARCH_FLAGS="{flags}"  # dcaforge bench: the architectures asked for\n' + text[i:])
        run_script.chmod(0o755)
    home = work / "home"
    home.mkdir(parents=True, exist_ok=True)
    out = work / "ggml-cuda.so"
    # -lcuda at link time: the toolkit's stub when the driver has no libcuda.so link (the library loads the driver's
    # libcuda.so.1 at run time either way)
    stubs = [str(d) for d in sorted(Path("/usr/local").glob("cuda*/lib64/stubs"))
             + sorted(Path("/usr/local").glob("cuda*/targets/*/lib/stubs"))]
    lib_path = ":".join([*stubs, os.environ.get("LIBRARY_PATH", "")]).strip(":")
    code, log = sh(["bash", str(run_script), f"-j{jobs}", "--output", str(out)], tree,
                   env={"HOME": str(home), "CUDA_PATH": cuda_path, "LIBRARY_PATH": lib_path}, timeout=budget)
    (work / "cuda-sh.log").write_text(log)
    if code == 124:  # stopped mid-compile: an object written in the last half minute may be cut short; made again
        build = home / ".cache" / "llamafile-cuda-build"
        cutoff = time.time() - 30
        for obj in build.glob("*.o"):
            if obj.stat().st_mtime >= cutoff:
                obj.unlink()
    return code, log[-4000:], (flags or "script's own").split()


def compile_errors(log: str) -> list[str]:
    """The units nvcc/g++ failed on, from the script's log: llamafile 0.10.x's cuda.sh links and reports success
    without them (seen: mmq.cu failed, the library linked, dlopen then failed on ggml_cuda_op_mul_mat_q)."""
    return sorted(set(re.findall(r'errors? detected in the compilation of "[^"]*?([\w.-]+\.cu)"', log))
                  | set(re.findall(r"([\w.-]+\.(?:cu|cpp|c))(?::\d+)+: (?:fatal )?error:", log)))


def check_library(lib: Path) -> dict:
    res: dict = {}
    # demangled (-C): a C++ function's symbol is _Z<len><name>..., where no word boundary precedes the name
    _, dyn = sh(["nm", "-DC", "--defined-only", str(lib)], lib.parent)
    res["exports"] = {s: bool(re.search(rf"\b{s}\b", dyn)) for s in EXPORTS}
    _, und = sh(["nm", "-DC", "--undefined-only", str(lib)], lib.parent)
    res["undefined_ggml_cuda"] = sorted(set(re.findall(r"\b(ggml_cuda_\w+)", und)))
    code, elf = sh([tool("cuobjdump"), "-lelf", str(lib)], lib.parent)
    res["cubins"] = sorted(set(re.findall(r"sm_(\d+[af]?)", elf))) if code == 0 else f"cuobjdump failed: {elf[-300:]}"
    return res


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack")
    p.add_argument("room", type=Path)
    p.add_argument("--out", type=Path, default=REPO / "cleanroom" / "gpu-realtree")
    r = sub.add_parser("run")
    r.add_argument("folder", type=Path)
    r.add_argument("--jobs", type=int, default=os.cpu_count() or 8)
    r.add_argument("--archs", default="86,89,90,120")
    r.add_argument("--budget", type=float, default=540.0, help="seconds for the whole run (stops the build in time)")
    r.add_argument("--cpu-only", action="store_true", help="the host program alone (no GPU library): the check here")
    args = ap.parse_args(argv)
    if args.cmd == "pack":
        pack(args.room, args.out)
        return 0
    t0 = time.monotonic()
    # the carried folder holds only the tarball; everything made goes beside it, in FOLDER-build, which the device
    # keeps between calls of a warm machine (carrying FOLDER again replaces FOLDER only): the build resumes there
    folder = args.folder.resolve().parent / (args.folder.resolve().name + "-build")
    folder.mkdir(parents=True, exist_ok=True)
    tree = folder / "tree"
    if not tree.is_dir():
        tree.mkdir()
        with tarfile.open(args.folder.resolve() / "tree.tar.gz") as tar:
            tar.extractall(tree, filter="data")
    results: dict = {}
    exe, how = build_host(tree, folder, args.jobs)
    results["host"] = how
    if exe is None:
        print(how)
        return 1
    code, out = sh([str(exe), "--cpu-only"], folder)
    results["cpu_only"] = {"exit": code, "out": out.splitlines()}
    print(out)
    if code or args.cpu_only:
        (folder / "results.json").write_text(json.dumps(results, indent=1))
        return code
    left = args.budget - (time.monotonic() - t0) - 60  # a minute for the checks and the run
    code, log, archs = build_library(tree, folder, args.jobs, args.archs, max(left, 1.0))
    results["library"] = {"exit": code, "archs": archs, "seconds": round(time.monotonic() - t0, 1), "tail": log.splitlines()[-8:]}
    print(f"llamafile/cuda.sh: exit {code} ({'budget reached: run the same command again, it goes on' if code == 124 else ''})")
    if code:
        (folder / "results.json").write_text(json.dumps(results, indent=1))
        print(log[-3000:])
        return 3 if code == 124 else 1
    lib = folder / "ggml-cuda.so"
    results["checks"] = check_library(lib)
    results["checks"]["compile_errors"] = compile_errors((folder / "cuda-sh.log").read_text(errors="replace"))
    print(json.dumps(results["checks"], indent=1))
    code, out = sh([str(exe), str(lib)], folder)
    results["dlopen_run"] = {"exit": code, "out": out.splitlines()}
    print(out)
    ok = (code == 0 and all(results["checks"]["exports"].values()) and not results["checks"]["undefined_ggml_cuda"]
          and not results["checks"]["compile_errors"])
    results["ok"] = ok
    (folder / "results.json").write_text(json.dumps(results, indent=1))
    if os.environ.get("OUT"):  # the device machine's folder that comes back
        shutil.copy(folder / "results.json", Path(os.environ["OUT"]) / "results.json")
        shutil.copy(folder / "cuda-sh.log", Path(os.environ["OUT"]) / "cuda-sh.log")
    print("ok: the library llamafile's script builds loads as llamafile loads it and runs DCA's ops" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
