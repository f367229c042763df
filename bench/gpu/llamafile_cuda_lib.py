#!/usr/bin/env python3
"""llamafile's GPU library (ggml-cuda.so) of a rendered llamafile clean room, built for real with
nvcc, and the check that it holds the LSE op (the GPU machine's part of issue 13).

    # here: a llamafile-layout clean room (e.g. the one tests/e2e/test_llamafile_build.py makes, or
    # `dcaforge apply -c examples/llamafile.yaml`), trimmed to what the GPU script reads
    python3 bench/gpu/llamafile_cuda_lib.py pack ROOM            # -> cleanroom/gpu-llamafile/tree.tar.gz
    # there (the repository travels with the command; carry cleanroom/gpu-llamafile):
    python3 bench/gpu/llamafile_cuda_lib.py build cleanroom/gpu-llamafile/tree.tar.gz --jobs 16

``build`` unpacks the tree, records the one nvcc call the tree's GPU script makes (the script runs
for real, with a recording nvcc first on PATH: dcaforge.builder.dryrun), compiles every source of that call
with exactly its flags (``-c``, in parallel: the script's single nvcc call compiles them one after
the other, hours for ~150 sources), links them with the call's own flags and libraries into the
script's output, then checks:

- ``nm -D``: the ops' host entries ``ggml_cuda_flash_attn_ext_lse`` and ``ggml_cuda_flash_attn_ext_lse_merge`` are
  defined and exported, and no ``ggml_cuda_*`` symbol is left undefined (a source the script leaves out);
- ``cuobjdump -lelf``: cubins for sm_86 and sm_90;
- ``cuobjdump -symbols``: ``flash_attn_combine_results`` with the LSE output parameter
  (``(float const*, float2 const*, float*, int, float*)``), i.e. the kernels write the LSE.

``--serial`` runs the tree's script itself instead (``llamafile/cuda.sh --clean --output OUT``),
as the user does on their own machine. Prints a table and writes ``results.json`` next to the
library; exit 1 when a check fails.
"""

from __future__ import annotations

import argparse
import concurrent.futures
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
sys.path.insert(0, str(REPO))

from dcaforge.builder.dryrun import nvcc_compile_args, script_dry_run  # noqa: E402

SCRIPT = "llamafile/cuda.sh"
KEEP = ("llamafile/cuda.sh", "build/cudacc", "llama.cpp/ggml/")
COMBINE_LSE = re.compile(r"flash_attn_combine_results<\d+>\(float const\*, float2 const\*, float\*, int, float\*\)")


def pack(room: Path, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    dest = out / "tree.tar.gz"
    with tarfile.open(dest, "w:gz") as tar:
        for rel in KEEP:
            p = room / rel
            if not p.exists():
                raise SystemExit(f"{p} is missing: not a rendered llamafile clean room")
            tar.add(p, arcname=rel.rstrip("/"),
                    filter=lambda ti: None if ti.name.endswith((".o", ".so")) or "/build" in ti.name else ti)
    print(f"{dest} ({dest.stat().st_size / 1e6:.1f} MB)")
    return dest


def _run(argv: list[str], cwd: Path) -> tuple[int, str]:
    try:
        p = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        return 127, f"{argv[0]}: not found"
    return p.returncode, p.stdout + p.stderr


def _tool(name: str) -> str:
    """A CUDA toolkit program: on PATH, else in /usr/local/cuda*/bin."""
    found = shutil.which(name) or next((str(p) for p in sorted(Path("/usr/local").glob(f"cuda*/bin/{name}"))), None)
    return found or name


def build(tarball: Path, jobs: int, output: str, serial: bool) -> int:
    work = tarball.parent / "tree"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir()
    with tarfile.open(tarball) as tar:
        tar.extractall(work)  # our own tarball, made by `pack`
    out = work / output
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    log = work / "build.log"
    if serial:
        rc, text = _run(["sh", SCRIPT, "--clean", "--output", output], work)
        log.write_text(text)
        if rc != 0:
            print(text[-4000:])
            return 1
        n_sources = -1
    else:
        rec = script_dry_run(work, SCRIPT, ["--clean", "--output", output], work / ".record")
        (call,) = rec.nvcc_calls()
        sources = [a for a in call if a.endswith(".cu") and not a.startswith("-")]
        n_sources = len(sources)
        nvcc = _tool("nvcc")
        objs = work / "o" / "objs"
        objs.mkdir(parents=True, exist_ok=True)

        def one(src: str) -> tuple[str, int, str]:
            obj = objs / (src.replace("/", "_") + ".o")
            rc, text = _run([nvcc, *nvcc_compile_args(call, src, str(obj))], work)
            return src, rc, text

        failed = []
        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool, open(log, "w") as fh:
            for src, rc, text in pool.map(one, sources):
                fh.write(f"== {src}: {rc}\n{text}\n")
                if rc != 0:
                    failed.append(src)
        if failed:
            print(f"{len(failed)} of {n_sources} sources failed, first: {failed[0]} (see {log})")
            return 1
        link = [a for a in call if not (a.endswith(".cu") and not a.startswith("-"))]
        i = link.index("-o")
        link[i + 1] = str(out)
        link[i + 2:i + 2] = [str(objs / (s.replace("/", "_") + ".o")) for s in sources]
        rc, text = _run([nvcc, *link], work)
        with open(log, "a") as fh:
            fh.write(f"== link: {rc}\n{' '.join(link)}\n{text}\n")
        if rc != 0:
            print(text[-4000:])
            return 1
    seconds = time.monotonic() - t0
    _rc, nm = _run(["nm", "-DC", "--defined-only", str(out)], work)
    _rc, undef = _run(["nm", "-DC", "--undefined-only", str(out)], work)
    # ggml's own symbols the library needs and nobody defines (a source left out of the script): the library would
    # not load (llamafile dlopens it); libggml-base's ggml_* are defined by the host program, ggml_cuda_* must be here
    missing = sorted(set(re.findall(r" U (ggml_cuda_\w+)", undef)))
    cuobjdump = _tool("cuobjdump")
    _rc, elf = _run([cuobjdump, "-lelf", str(out)], work)
    _rc, syms = _run(["sh", "-c", f"'{cuobjdump}' -symbols '{out}' | c++filt"], work)
    checks = {
        "host entry ggml_cuda_flash_attn_ext_lse exported (nm -D)":
            bool(re.search(r" T ggml_cuda_flash_attn_ext_lse\(", nm)),
        "host entry ggml_cuda_flash_attn_ext_lse_merge exported (nm -D)":
            bool(re.search(r" T ggml_cuda_flash_attn_ext_lse_merge\(", nm)),
        "no ggml_cuda_* symbol left undefined (nm -D --undefined-only)": not missing,
        "cubins for sm_86 and sm_90 (cuobjdump -lelf)": "sm_86" in elf and "sm_90" in elf,
        "combine kernel with the LSE output (cuobjdump -symbols)": bool(COMBINE_LSE.search(syms)),
    }
    res = {"library": str(out), "bytes": out.stat().st_size, "seconds": round(seconds, 1),
           "sources": n_sources, "mode": "script" if serial else f"parallel -j{jobs}", "checks": checks,
           "lse_symbols": sorted(set(COMBINE_LSE.findall(syms)))[:4], "undefined_ggml_cuda": missing}
    (out.parent / "results.json").write_text(json.dumps(res, indent=2) + "\n")
    print(f"| library | {out.name}, {res['bytes'] / 1e6:.1f} MB, {n_sources} sources, {seconds:.0f} s ({res['mode']}) |")
    for what, ok in checks.items():
        print(f"| {what} | {'yes' if ok else 'NO'} |")
    return 0 if all(checks.values()) else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack")
    p.add_argument("room", type=Path)
    p.add_argument("--out", type=Path, default=REPO / "cleanroom" / "gpu-llamafile")
    b = sub.add_parser("build")
    b.add_argument("tarball", type=Path)
    b.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    b.add_argument("--output", default="o/cuda/ggml-cuda.so")
    b.add_argument("--serial", action="store_true", help="run the tree's script itself (one nvcc call)")
    a = ap.parse_args()
    if a.cmd == "pack":
        pack(a.room, a.out)
        return 0
    return build(a.tarball, a.jobs, a.output, a.serial)


if __name__ == "__main__":
    sys.exit(main())
