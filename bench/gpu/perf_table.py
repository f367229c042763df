"""The ratio table of bench/gpu/perf.sh: llama-batched-bench logs of plain and DCA variants, DCA / plain.

Logs are named ``speed-<setup>-<variant>-<round>.log`` (setup e.g. ``1seq``, ``4seq``, ``4seq-kvu``; variant
``plain``, ``dca``, ``dca-ranges``, ``plain-nog``, ``dca-nog``). For every setup, prompt length (PP) and
batch (B) the table gives each variant's prompt and generation rates (mean over rounds) and its ratio to plain's
in the same setup: the ratio of the summed rates of the rounds where both ran, and each round's own ratio.

usage: python3 bench/gpu/perf_table.py DIR
"""

from __future__ import annotations

import re
import sys
from collections import defaultdict
from pathlib import Path

LOG = re.compile(r"^speed-(?P<setup>.+)-(?P<variant>plain(?:-nog)?|dca(?:-ranges)?(?:-nog)?)-(?P<round>\d+)\.log$")
ORDER = ["plain", "dca", "dca-ranges", "plain-nog", "dca-nog"]


def parse_rows(text: str) -> list[dict[str, float]]:
    """The result rows of llama-batched-bench's table: PP, TG, B, N_KV, T_PP s, S_PP t/s, T_TG s, S_TG t/s, ..."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 8 or not cells[0].isdigit():
            continue
        try:
            pp, tg, b, n_kv = (int(c) for c in cells[:4])
            s_pp, s_tg = float(cells[5]), float(cells[7])
        except ValueError:
            continue
        rows.append({"pp": pp, "tg": tg, "b": b, "n_kv": n_kv, "s_pp": s_pp, "s_tg": s_tg})
    return rows


def collect(folder: Path) -> dict[tuple[str, int, int], dict[str, dict[int, dict[str, float]]]]:
    """(setup, PP, B) -> variant -> round -> row."""
    data: dict[tuple[str, int, int], dict[str, dict[int, dict[str, float]]]] = defaultdict(lambda: defaultdict(dict))
    for path in sorted(folder.glob("speed-*.log")):
        m = LOG.match(path.name)
        if not m:
            continue
        for row in parse_rows(path.read_text(errors="replace")):
            data[(m["setup"], row["pp"], row["b"])][m["variant"]][int(m["round"])] = row
    return data


def ratio(num: dict[int, dict[str, float]], den: dict[int, dict[str, float]], key: str) -> tuple[float | None, list[float]]:
    rounds = sorted(set(num) & set(den))
    if not rounds:
        return None, []
    per = [num[r][key] / den[r][key] for r in rounds if den[r][key] > 0]
    sn = sum(num[r][key] for r in rounds)
    sd = sum(den[r][key] for r in rounds)
    return (sn / sd if sd > 0 else None), per


def table(data: dict[tuple[str, int, int], dict[str, dict[int, dict[str, float]]]]) -> str:
    out = [f"{'setup':<9} {'PP':>6} {'B':>2} {'variant':<10} {'pp t/s':>10} {'tg t/s':>9} {'pp/plain':>8} "
           f"{'tg/plain':>8}  per-round pp | tg"]
    for (setup, pp, b) in sorted(data):
        variants = data[(setup, pp, b)]
        base = variants.get("plain", {})
        for v in sorted(variants, key=lambda x: ORDER.index(x) if x in ORDER else len(ORDER)):
            runs = variants[v]
            mean_pp = sum(r["s_pp"] for r in runs.values()) / len(runs)
            mean_tg = sum(r["s_tg"] for r in runs.values()) / len(runs)
            rp, per_p = ratio(runs, base, "s_pp")
            rt, per_t = ratio(runs, base, "s_tg")
            fmt = lambda x: f"{x:8.3f}" if x is not None else f"{'-':>8}"  # noqa: E731
            rounds = " ".join(f"{x:.2f}" for x in per_p) + " | " + " ".join(f"{x:.2f}" for x in per_t)
            out.append(f"{setup:<9} {pp:>6} {b:>2} {v:<10} {mean_pp:>10.1f} {mean_tg:>9.1f} {fmt(rp)} {fmt(rt)}  "
                       f"{rounds if v != 'plain' else ''}".rstrip())
    return "\n".join(out)


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    data = collect(Path(argv[0]))
    if not data:
        print(f"no speed-*.log with a result table in {argv[0]}", file=sys.stderr)
        return 1
    print(table(data))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
