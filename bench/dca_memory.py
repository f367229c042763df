#!/usr/bin/env python3
"""Compute-buffer memory of the reserve graphs with DCA against plain attention at a long context.

llama.cpp sizes its compute buffers once, at context creation, from worst-case ("reserve") graphs
of a full cache; the scheduler reports them as "<buffer type> compute buffer size = X MiB" and the
graphs as "graph ...: nodes = ...". This script creates a context with dcaforge/gate/gatetools/dca_logits.cpp
(built against the tree by dcaforge/gate/gatetools/build_logits.py) on a tiny model of dcaforge/gate/gatetools/tiny.py
(trained context 256) at --n-ctx cells, with and without --dca on (S = 192, w = 32), flash attention
on (at --n-ctx) and off (at --n-ctx-nofa: without flash attention plain llama.cpp itself needs an F32
KQ of n_ctx x ubatch x n_head, 8 GiB at 1M cells), evaluates a few tokens, and writes those figures as
a markdown table.

Usage: python bench/dca_memory.py TREE BUILD [--n-ctx 1048576] [--n-ctx-nofa 131072] [--arch qwen2 gemma3]
       [--ubatch 512] [--out FILE]   (its table: bench/RESULTS.md, "DCA reserve-graph memory")
TREE/BUILD: a 0078-dca llama.cpp tree and its cmake build (static libraries, target llama).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dcaforge.gate.gatetools import build_logits, tiny  # noqa: E402

S, W = 192, 32
BUF = re.compile(r"(\S+) compute buffer size =\s+([\d.]+) MiB")
NODES = re.compile(r"graph(?: \(pp bs=(\d+), tg bs=(\d+)\))?: nodes = ([\d /]+), splits")


def measure(exe: str, model: str, n_ctx: int, ub: int, fa: bool, dca: bool) -> dict:
    with tempfile.TemporaryDirectory() as td:
        cmd = [exe, "-m", model, "-o", os.path.join(td, "out.f32"), "--n-tokens", "8", "-c", str(n_ctx),
               "-b", str(ub), "-ub", str(ub), "-fa", "on" if fa else "off", "-t", "2", "-v"]
        if dca:
            cmd += ["--dca", "on", "--dca-chunk-size", str(S), "--dca-local-size", str(W)]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"rc={r.returncode}: {' '.join(cmd)}\n{r.stderr[-3000:]}")
    bufs = {m.group(1): float(m.group(2)) for m in BUF.finditer(r.stderr)}
    nodes = NODES.search(r.stderr)
    return {"bufs": bufs, "nodes": nodes.group(3).strip() if nodes else "?", "cmd": cmd}


def _placeholders(args: list[str]) -> list[str]:
    """The command line with the temporary model and output paths as MODEL and OUT."""
    out = list(args)
    for flag, name in (("-m", "MODEL"), ("-o", "OUT")):
        if flag in out:
            out[out.index(flag) + 1] = name
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python bench/dca_memory.py")
    ap.add_argument("tree")
    ap.add_argument("build")
    ap.add_argument("--n-ctx", type=int, default=1048576)
    ap.add_argument("--n-ctx-nofa", type=int, default=131072)
    ap.add_argument("--ubatch", type=int, default=512)
    ap.add_argument("--arch", nargs="+", default=["qwen2", "gemma3"])
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)

    exe = build_logits.build(a.tree, a.build, dca=True)
    rows = []
    with tempfile.TemporaryDirectory() as md:
        for arch in a.arch:
            model = tiny.ensure(md, arch)
            for fa, n_ctx in ((True, a.n_ctx), (False, a.n_ctx_nofa)):
                if n_ctx <= 0:
                    continue
                res = {dca: measure(exe, model, n_ctx, a.ubatch, fa, dca) for dca in (False, True)}
                total = {dca: sum(res[dca]["bufs"].values()) for dca in res}
                rows.append((arch, fa, n_ctx, res, total))
                print(f"{arch} n_ctx={n_ctx} fa={'on' if fa else 'off'}: plain {total[False]:.2f} MiB, DCA {total[True]:.2f} MiB "
                      f"({total[True] / total[False]:.3f}x); nodes plain {res[False]['nodes']}, DCA {res[True]['nodes']}",
                      flush=True)

    lines = [
        "# DCA reserve-graph memory at a long context (CPU)",
        "",
        f"Command: `python bench/dca_memory.py TREE BUILD --n-ctx {a.n_ctx} --n-ctx-nofa {a.n_ctx_nofa} --ubatch {a.ubatch} "
        f"--arch {' '.join(a.arch)}`",
        f"(per run: `dca_logits {' '.join(_placeholders(rows[0][3][True]['cmd'][1:]))}`, with "
        "`-m` a tiny model of dcaforge/gate/gatetools/tiny.py, trained context 256; without `--dca ...` for plain).",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores. Figures: the scheduler's \"compute buffer size\" lines "
        "at context creation (the reserve graphs of a full cache: they size the buffers for every later ubatch), "
        "and its \"graph: nodes\" line (prompt / generation reserve graphs).",
        "",
        "| model | n_ctx | flash attn | buffer | plain MiB | DCA MiB | DCA / plain | nodes plain (pp / tg) | nodes DCA (pp / tg) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for arch, fa, n_ctx, res, total in rows:
        for buf in sorted(set(res[False]["bufs"]) | set(res[True]["bufs"])):
            p, d = res[False]["bufs"].get(buf, 0.0), res[True]["bufs"].get(buf, 0.0)
            lines.append(f"| {arch} | {n_ctx} | {'on' if fa else 'off'} | {buf} | {p:.2f} | {d:.2f} | "
                         f"{d / p if p else float('nan'):.3f} | {res[False]['nodes']} | {res[True]['nodes']} |")
        lines.append(f"| {arch} | {n_ctx} | {'on' if fa else 'off'} | **all** | {total[False]:.2f} | {total[True]:.2f} | "
                     f"**{total[True] / total[False]:.3f}** | | |")
    text = "\n".join(lines) + "\n"
    if a.out:
        Path(a.out).write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
