"""Compile dca_logits.cpp (or another driver next to it: dca_embd.cpp; package data, next to this module) against a
llama.cpp tree and its cmake build dir.

The program links llama.cpp's static libraries (BUILD_SHARED_LIBS=OFF): libllama.a and the
libggml*.a found under the build dir. The binary is cached under
$DCAFORGE_CACHE_DIR/dca_logits (default ~/.cache/dcaforge/dca_logits), keyed by a hash of the
source, the tree's public headers, the libraries' contents and the flags, so a rebuilt
library gives a new binary.

    python -m dcaforge.gate.gatetools.build_logits TREE BUILD [--dca|--no-dca]
prints the binary's path.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent / "dca_logits.cpp"
EMBD_SRC = SRC.with_name("dca_embd.cpp")
GATETOOL_H = SRC.with_name("gatetool.h")   # what both drivers include


def cache_dir() -> Path:
    base = os.environ.get("DCAFORGE_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "dcaforge")
    return Path(base) / "dca_logits"


def tree_has_dca(tree: str | os.PathLike) -> bool:
    """True when the tree's llama.h has the 0078-dca context params."""
    h = Path(tree) / "include" / "llama.h"
    return "dca_chunk_size" in h.read_text(errors="replace")


def find_libs(build: str | os.PathLike) -> list[str]:
    """libllama.a first, then the ggml libraries (ggml-base last)."""
    build = str(build)
    found = sorted(set(glob.glob(os.path.join(build, "**", "lib*.a"), recursive=True)))
    by_name: dict[str, str] = {}
    for p in found:
        by_name.setdefault(os.path.basename(p), p)   # first (shortest sorted) path per name
    if "libllama.a" not in by_name:
        raise FileNotFoundError(f"no libllama.a under {build} (needs BUILD_SHARED_LIBS=OFF and target llama)")
    for need in ("libggml.a", "libggml-base.a", "libggml-cpu.a"):
        if need not in by_name:
            raise FileNotFoundError(f"no {need} under {build}")
    ggml = [p for n, p in by_name.items() if n.startswith("libggml") and n not in ("libggml.a", "libggml-base.a")]
    return [by_name["libllama.a"], by_name["libggml.a"], *sorted(ggml), by_name["libggml-base.a"]]


def _digest(paths: list[str], extra: list[str]) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.encode())
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    for e in extra:
        h.update(e.encode())
    return h.hexdigest()[:16]


def build(tree: str | os.PathLike, build_dir: str | os.PathLike, dca: bool | None = None,
          cxx: str | None = None, src: str | os.PathLike = SRC) -> str:
    """Compile (or reuse) dca_logits (or another driver, src: EMBD_SRC) for tree/build_dir; dca None = detect from
    llama.h."""
    src = Path(src)
    tree, build_dir = Path(tree).resolve(), Path(build_dir).resolve()
    if dca is None:
        dca = tree_has_dca(tree)
    libs = find_libs(build_dir)
    cxx = cxx or os.environ.get("CXX") or "g++"
    flags = ["-O2", "-std=c++17", f"-I{tree / 'include'}", f"-I{tree / 'ggml' / 'include'}"]
    if dca:
        flags.append("-DDCA")
    headers = [str(tree / "include" / "llama.h"), str(tree / "ggml" / "include" / "ggml.h")]
    key = _digest([str(src), str(GATETOOL_H), *headers, *libs], [cxx, *flags])
    out_dir = cache_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    exe = out_dir / f"{src.stem}-{'dca' if dca else 'plain'}-{key}"
    if exe.exists():
        return str(exe)
    tmp = out_dir / f".{exe.name}.{os.getpid()}"
    cmd = [cxx, *flags, str(src), "-o", str(tmp),
           "-Wl,--start-group", *libs, "-Wl,--end-group", "-fopenmp", "-lpthread", "-ldl", "-lm"]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"compiling {src.name} failed:\n" + " ".join(cmd) + "\n" + r.stderr[-4000:])
    os.replace(tmp, exe)
    return str(exe)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dcaforge.gate.gatetools.build_logits")
    ap.add_argument("tree")
    ap.add_argument("build")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--dca", dest="dca", action="store_true", default=None)
    g.add_argument("--no-dca", dest="dca", action="store_false")
    a = ap.parse_args(argv)
    print(build(a.tree, a.build, a.dca))
    return 0


if __name__ == "__main__":
    sys.exit(main())
