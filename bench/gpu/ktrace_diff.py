#!/usr/bin/env python3
"""Plain against DCA, kernel by kernel, from the tables of bench/gpu/ktrace.cpp (GPU time per CUDA kernel of a run).

    python bench/gpu/ktrace_diff.py PLAIN.tsv DCA.tsv [--rows N]
        the two runs' kernels side by side, the largest differences first
    python bench/gpu/ktrace_diff.py PLAIN.tsv DCA.tsv --minus PLAIN_SHORT.tsv DCA_SHORT.tsv [--rows N]
        the same for the part of each run that its shorter run lacks (e.g. 160 against 32 generated tokens: 128
        decode steps), each table minus its short one

Kernel time is GPU time, not wall time: kernels that overlap (back-to-back launches in a CUDA graph) each count their
whole span, and time the GPU spends waiting for the host is in no kernel.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

Table = dict[str, tuple[int, float]]  # kernel -> (launches, total microseconds)


def load(path: Path) -> Table:
    table: Table = {}
    with path.open(newline="") as f:
        for row in csv.DictReader(f, delimiter="\t"):
            name = row["kernel"]
            if name == "(all kernels)":
                continue
            n, t = table.get(name, (0, 0.0))
            table[name] = (n + int(row["launches"]), t + float(row["total_us"]))
    if not table:
        raise ValueError(f"{path}: no kernel rows (is it a ktrace table?)")
    return table


def minus(a: Table, b: Table) -> Table:
    return {k: (a.get(k, (0, 0.0))[0] - b.get(k, (0, 0.0))[0], a.get(k, (0, 0.0))[1] - b.get(k, (0, 0.0))[1])
            for k in set(a) | set(b)}


def total_us(t: Table) -> float:
    return sum(v[1] for v in t.values())


def report(plain: Table, dca: Table, rows: int) -> str:
    tp, td = total_us(plain), total_us(dca)
    lines = [f"total plain {tp / 1e3:.1f} ms, dca {td / 1e3:.1f} ms, ratio {td / tp:.3f}",
             "delta_ms\tplain_n\tplain_ms\tdca_n\tdca_ms\tkernel"]
    diff = []
    for k in set(plain) | set(dca):
        pn, pt = plain.get(k, (0, 0.0))
        dn, dt = dca.get(k, (0, 0.0))
        diff.append((dt - pt, k, pn, pt, dn, dt))
    diff.sort(key=lambda r: (-abs(r[0]), r[1]))
    for d, k, pn, pt, dn, dt in diff[:rows]:
        lines.append(f"{d / 1e3:+.2f}\t{pn}\t{pt / 1e3:.2f}\t{dn}\t{dt / 1e3:.2f}\t{k[:90]}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plain", type=Path)
    ap.add_argument("dca", type=Path)
    ap.add_argument("--minus", nargs=2, type=Path, metavar=("PLAIN_SHORT", "DCA_SHORT"))
    ap.add_argument("--rows", type=int, default=12)
    a = ap.parse_args(argv)
    try:
        plain, dca = load(a.plain), load(a.dca)
        if a.minus:
            plain, dca = minus(plain, load(a.minus[0])), minus(dca, load(a.minus[1]))
    except (OSError, KeyError, ValueError) as e:
        print(f"ktrace_diff: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(report(plain, dca, a.rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
