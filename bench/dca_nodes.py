#!/usr/bin/env python3
"""Graph nodes and kernels per llama.cpp graph, plain attention against DCA, from a real build and a real model.

llama-batched-bench runs a prompt and a few generated tokens for 1 and 4 sequences (4 sequences: one KV stream each,
and with --kvu one unified cache), with GGML_SCHED_DEBUG=2 and -v: the scheduler then prints every graph it splits (each
graph llama builds anew; a reused graph is not printed again), one line per node that is not a view
("node #  12 (   MUL_MAT): ..."). Per distinct graph this script reports its size in tokens (the first node, the token
embedding lookup, is n_tokens x n_embd floats), the DCA layout it took (its flash attention nodes' names: dca_fa_stacked
or dca_fa_intra/succ/inter), the graph's nodes (the last node's index + 1) and its kernels (the nodes that are not
views: reshape, view, permute and transpose cost no kernel), and writes a markdown table.

Usage: python bench/dca_nodes.py BIN MODEL [--dca-chunk-size 192] [--dca-local-size 32] [--npp 512] [--out FILE]
BIN: a 0078-dca build's bin folder with llama-batched-bench; MODEL: a GGUF whose every layer DCA hooks (SmolLM2-135M:
llama, 30 layers). The small chunk (S 192, w 32: c = 160) puts a 512-token prompt across three chunks, so the prompt
ubatch and the decode after it see all three regimes.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

NODE = re.compile(r"node #\s*(\d+) \(\s*([A-Z0-9_]+)\):\s+(\S+) \(\s*(\d+)([KM])\)")
SPLIT0 = re.compile(r"## SPLIT #0:")


def graphs(text: str) -> list[list[tuple[int, str, str, int, str]]]:
    """The printed graphs: lists of (index, op (its first 10 characters), name, size, unit K or M) of their non-view
    nodes."""
    out: list[list[tuple[int, str, str, int, str]]] = []
    for line in text.splitlines():
        if SPLIT0.search(line):
            out.append([])
            continue
        m = NODE.search(line)
        if m and out:
            out[-1].append((int(m.group(1)), m.group(2), m.group(3), int(m.group(4)), m.group(5)))
    return [g for g in out if g]


def n_tokens(g: list[tuple[int, str, str, int, str]], embd_bytes: int, k_bytes: int) -> int:
    """The ubatch size: the token embeddings' size (n_embd floats a token) while the scheduler prints it in KiB, else
    the first layer's K (k_bytes a token); 0 when neither says."""
    for _, _, name, size, unit in g:
        if name == "inp_embd" and unit == "K":
            return max(1, round(size * 1024 / embd_bytes))
    for _, _, name, size, unit in g:
        if name == "Kcur-0":
            return round(size * (1024 if unit == "K" else 1024 * 1024) / k_bytes)
    return 0


def describe(g: list[tuple[int, str, str, int, str]], embd_bytes: int, k_bytes: int) -> dict:
    names = [name.rsplit("-", 1)[0] for _, _, name, _, _ in g]
    layout = "stacked" if "dca_fa_stacked" in names else ("ranges" if any(n.startswith("dca_fa_") for n in names) else
                                                          ("dca" if any(n.startswith("dca") for n in names) else "plain"))
    merge = sum(1 for n in names if n == "dca_merged")
    # the scheduler prints 10 characters of the op: FLASH_ATTN is FLASH_ATTN_EXT, _LSE or _LSE_MERGE
    fa = sum(1 for _, op, _, _, _ in g if op == "FLASH_ATTN") - merge
    return {"tokens": n_tokens(g, embd_bytes, k_bytes), "layout": layout, "nodes": g[-1][0] + 1, "kernels": len(g),
            "fa": fa, "merge": merge}


def run(bench: Path, model: str, kvu: bool, dca: list[str], npp: int, threads: int) -> tuple[list[str], str]:
    cmd = [str(bench), "-m", model, "-c", str(4 * (npp + 8) + 64), "-b", "2048", "-ub", "512", "-npp", str(npp),
           "-ntg", "3", "-npl", "1,4", "-fa", "on", "-t", str(threads), "-v", *(["-kvu"] if kvu else []), *dca]
    env = dict(os.environ, GGML_SCHED_DEBUG="2")
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"rc={r.returncode}: {' '.join(cmd)}\n{r.stderr[-3000:]}")
    return cmd, r.stdout + r.stderr


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bin")
    ap.add_argument("model")
    ap.add_argument("--dca-chunk-size", type=int, default=192)
    ap.add_argument("--dca-local-size", type=int, default=32)
    ap.add_argument("--npp", type=int, default=512)
    ap.add_argument("--n-embd", type=int, default=576, help="the model's embedding width (SmolLM2-135M: 576)")
    ap.add_argument("--n-embd-k", type=int, default=192, help="K floats a token in a layer (SmolLM2-135M: 3 x 64)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)

    bench = Path(a.bin) / "llama-batched-bench"
    dca_args = ["--dca", "on", "--dca-chunk-size", str(a.dca_chunk_size), "--dca-local-size", str(a.dca_local_size)]
    rows = []
    cmds = []
    for kvu in (False, True):
        for dca in (False, True):
            cmd, text = run(bench, a.model, kvu, dca_args if dca else [], a.npp, a.threads)
            cmds.append(" ".join(["GGML_SCHED_DEBUG=2", "llama-batched-bench", *cmd[1:]]).replace(a.model, "MODEL"))
            seen = set()
            for g in graphs(text):
                d = describe(g, 4 * a.n_embd, 4 * a.n_embd_k)
                key = (d["tokens"], d["layout"], d["nodes"], d["kernels"])
                if key in seen:
                    continue
                seen.add(key)
                rows.append({"kv": "unified" if kvu else "per-sequence", "attn": "DCA" if dca else "plain", **d})

    lines = [
        "# Graph nodes and kernels per graph: plain attention vs DCA",
        "",
        f"Written by `python bench/dca_nodes.py BIN MODEL` (DCA S = {a.dca_chunk_size}, w = {a.dca_local_size}; "
        "MODEL = SmolLM2-135M-Instruct Q4_1, 30 layers, all DCA; CPU build, -fa on). Every distinct graph the "
        "scheduler split, in the order of the run: the reserve graphs, the warm-up, the prompt ubatches (1 sequence; "
        "then 4 sequences of the same prompt), the decodes. tokens: the graph's ubatch size (0: not read); kernels: "
        "nodes that are not views; fa / merge: flash attention (with LSE) and LSE-merge nodes.",
        "",
        "Commands:",
        "",
        *[f"    {c}" for c in cmds],
        "",
        "| KV | attention | tokens | layout | nodes | kernels | fa | merge |",
        "|---|---|---:|---|---:|---:|---:|---:|",
        *[f"| {r['kv']} | {r['attn']} | {r['tokens']} | {r['layout']} | {r['nodes']} | {r['kernels']} | {r['fa']} | "
          f"{r['merge']} |" for r in rows],
        "",
    ]
    text = "\n".join(lines)
    if a.out:
        Path(a.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
