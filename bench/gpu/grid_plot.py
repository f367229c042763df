"""The chunk/local grid as the gates' figure: passkey accuracy and perplexity against context length, one line per
method (plain rope, YaRN, each DCA setting), one row per model, from the committed GPU results:

- SmolLM2-135M-Instruct (trained 8192): run 6 alone (`grid-smol-passkey.tsv`, `grid-smol-ppl.tsv`), every method in
  the same run;
- gemma-3-270m (trained 32768): plain, YaRN x4 and DCA S24w4 from run 2 (perplexity 8k-64k) and run 3 (passkey,
  YaRN at 128k over all windows, S4w0.5, S6w1), S8w2 and S6w1.5 from run 6.

A passkey cell is drawn at the context class its prompt fills: SmolLM2's 7.3k / 31k / 62k-token prompts at 8k / 32k /
64k, gemma's 16.9k (plain inside its window) at 32k and its 69.7k / 134k prompts at 64k / 128k. Perplexity is over all
windows of the same 1.4 MB text at each context.

    python bench/gpu/grid_plot.py --png bench/gpu/2026-12-02-run6/grid.png
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from dcaforge.gate import GateResult
from dcaforge.plot import plot

HERE = Path(__file__).resolve().parent
RUN2, RUN3, RUN6 = HERE / "2026-11-30-run2", HERE / "2026-11-30-run3", HERE / "2026-12-02-run6"


def method(name: str) -> str:
    """A run's row name -> the figure's method: plain, yarn (yarn, yarn4), dca-<setting>."""
    return "yarn" if name.startswith("yarn") else name


def rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


def passkey(paths: list[Path], ctx_of_junk: dict[str, int]) -> dict[tuple[str, int], float]:
    """(method, context class) -> fraction of exact answers."""
    hits: dict[tuple[str, int], list[int]] = defaultdict(list)
    for p in paths:
        for r in rows(p):
            if r["junk"] in ctx_of_junk and r["rc"] == "rc=0":
                hits[(method(r["name"]), ctx_of_junk[r["junk"]])].append(int(r["exact"]))
    return {k: sum(v) / len(v) for k, v in hits.items()}


def perplexity(paths: list[Path]) -> dict[tuple[str, int], float]:
    """(method, context) -> perplexity over all windows; a later file's figure wins; cut runs (rc != 0) left out."""
    out: dict[tuple[str, int], float] = {}
    for p in paths:
        for r in rows(p):
            if r["rc"] == "rc=0" and r["ppl_all_windows"]:
                out[(method(r["name"]), int(r["ctx"]))] = float(r["ppl_all_windows"].split()[0])
    return out


def figure(model: str, trained: int, pk: dict[tuple[str, int], float], ppl: dict[tuple[str, int], float]) -> GateResult:
    """One model's points as an extension gate's result, the form dcaforge.plot draws."""
    methods = sorted({m for m, _ in pk} | {m for m, _ in ppl})
    points = []
    for ctx in sorted({c for _, c in pk} | {c for _, c in ppl}):
        pt: dict[str, Any] = {"ctx": ctx}
        for m in methods:
            if (m, ctx) in ppl:
                pt[f"ppl_{m}"] = ppl[(m, ctx)]
            if (m, ctx) in pk:
                pt[f"passkey_{m}"] = pk[(m, ctx)]
        points.append(pt)
    return GateResult(model, "extension", True, "", {"model": model, "trained": trained, "methods": methods}, points)


def figures() -> list[GateResult]:
    smol = figure("SmolLM2-135M-Instruct Q4_1 (run 6)", 8192,
                  passkey([RUN6 / "grid-smol-passkey.tsv"], {"300": 8192, "1300": 32768, "2600": 65536}),
                  perplexity([RUN6 / "grid-smol-ppl.tsv"]))
    gemma_pk = passkey([RUN3 / "passkey.tsv", RUN3 / "passkey-S6w1.tsv", RUN6 / "gemma-grid-passkey.tsv"],
                       {"700": 32768, "2900": 65536, "5600": 131072})
    gemma_ppl = perplexity([RUN2 / "ppl.tsv", RUN3 / "ppl.tsv", RUN6 / "gemma-grid-ppl.tsv"])
    gemma_ppl = {k: v for k, v in gemma_ppl.items() if k[0] != "dca-S24w4t"}   # run 2's temperature variant (= S24w4)
    gemma = figure("gemma-3-270m Q4_K_M (runs 2, 3, 6)", 32768, gemma_pk, gemma_ppl)
    return [smol, gemma]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="grid_plot.py", description=__doc__.splitlines()[0])
    ap.add_argument("--png", required=True, type=Path)
    a = ap.parse_args(argv)
    out = plot(figures(), a.png, lambda s: print(s, file=sys.stderr),
               title="chunk/local grid: passkey and perplexity against context length (dotted: trained length)",
               ppl_max=4.2, dpi=110)
    if out is None:
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
