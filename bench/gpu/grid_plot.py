"""The chunk/local grid as the gates' figure: passkey accuracy and perplexity against context length, one line per
method (plain rope, YaRN, each DCA setting), one row per model, from the committed GPU results:

- SmolLM2-135M-Instruct (trained 8192): run 6 alone (`grid-smol-passkey.tsv`, `grid-smol-ppl.tsv`), every method in
  the same run;
- gemma-3-270m (trained 32768): plain, YaRN x4 and DCA S24w4 from run 2 (perplexity 8k-64k) and run 3 (passkey,
  YaRN at 128k over all windows, S4w0.5, S6w1), S8w2 and S6w1.5 from run 6; run 7 adds S16w4 and S12w3 (passkey and
  perplexity), S6w1.5's perplexity at 128k and plain's passkey at its whole trained length (`grid-gemma-*.tsv`).

A DCA setting SxwY is chunk x k, local y k tokens (k = 1024); its legend entry gives both as fractions of the model's
trained length L (gemma's S16w4 = 1/2, 1/8 of L is SmolLM2's S4w1, the rule that won run 6's grid there).

A passkey cell is drawn at the context class its prompt fills: SmolLM2's 7.3k / 31k / 62k-token prompts at 8k / 32k /
64k, gemma's 69.7k / 134k prompts at 64k / 128k. Gemma's plain point at 32k is run 7's 31.3k-token prompt (0/10): the
model over its whole trained window, as SmolLM2's 8k point is (7.3k of 8192). Run 3's 16.9k prompt (6/10, drawn there
in run 6's figure) is the model at half its window, where every position lies within its ~9k retrieval span; it is
left out of run 7's figure (two prompt lengths in one cell would be averaged into a figure neither measured).
``--run 6`` draws run 6's points (run 3's 16.9k at 32k, no run-7 data) in this layout (fraction labels, one
legend per row), not the committed run-6 PNG byte for byte.
Perplexity is over all windows of the same 1.4 MB text at each context.

    python bench/gpu/grid_plot.py --png bench/gpu/2026-12-02-run7/grid.png
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from collections import defaultdict
from fractions import Fraction
from pathlib import Path
from typing import Any

from dcaforge.gate import GateResult
from dcaforge.plot import plot

HERE = Path(__file__).resolve().parent
RUN2, RUN3, RUN6 = HERE / "2026-11-30-run2", HERE / "2026-11-30-run3", HERE / "2026-12-02-run6"
RUN7 = HERE / "2026-12-02-run7"


def method(name: str) -> str:
    """A run's row name -> the figure's method: plain (plain, plain-1x), yarn (yarn, yarn4), dca-<setting>."""
    if name.startswith("yarn"):
        return "yarn"
    return "plain" if name == "plain-1x" else name


def _of_l(f: Fraction) -> str:
    return "L" if f == 1 else f"{f.numerator}/{f.denominator}"


def label(m: str, trained: int) -> str | None:
    """The legend entry of a DCA setting: "dca-S16w4" at L = 32768 -> "DCA S16w4: 1/2, 1/8 of L"; None for others."""
    g = re.fullmatch(r"dca-S(\d+(?:\.\d+)?)w(\d+(?:\.\d+)?)", m)
    if not g:
        return None
    chunk, local = (Fraction(v) * 1024 / trained for v in g.groups())
    return f"DCA S{g[1]}w{g[2]}: {_of_l(chunk)}, {_of_l(local)} of L"


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
    names = {m: t for m in methods if (t := label(m, trained))}
    return GateResult(model, "extension", True, "",
                      {"model": model, "trained": trained, "methods": methods, "labels": names}, points)


def figures(run: int = 7) -> list[GateResult]:
    """Run 7's figure (the default) or run 6's (``run=6``: run 3's 16.9k plain passkey at 32k, no run-7 data)."""
    if run not in (6, 7):
        raise ValueError(f"run {run}: grid_plot draws run 6's or run 7's figure")
    smol = figure("SmolLM2-135M-Instruct Q4_1 (run 6)", 8192,
                  passkey([RUN6 / "grid-smol-passkey.tsv"], {"300": 8192, "1300": 32768, "2600": 65536}),
                  perplexity([RUN6 / "grid-smol-ppl.tsv"]))
    pk_files = [RUN3 / "passkey.tsv", RUN3 / "passkey-S6w1.tsv", RUN6 / "gemma-grid-passkey.tsv"]
    ppl_files = [RUN2 / "ppl.tsv", RUN3 / "ppl.tsv", RUN6 / "gemma-grid-ppl.tsv"]
    if run == 7:   # plain's 32k cell: run 7's 31.3k prompt (junk 1300), not run 3's 16.9k (junk 700)
        pk_files.append(RUN7 / "grid-gemma-passkey.tsv")
        ppl_files.append(RUN7 / "grid-gemma-ppl.tsv")
    gemma_pk = passkey(pk_files, {"1300" if run == 7 else "700": 32768, "2900": 65536, "5600": 131072})
    gemma_ppl = perplexity(ppl_files)
    gemma_ppl = {k: v for k, v in gemma_ppl.items() if k[0] != "dca-S24w4t"}   # run 2's temperature variant (= S24w4)
    runs = "2, 3, 6, 7" if run == 7 else "2, 3, 6"
    gemma = figure(f"gemma-3-270m Q4_K_M (runs {runs})", 32768, gemma_pk, gemma_ppl)
    return [smol, gemma]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="grid_plot.py", description=__doc__.splitlines()[0])
    ap.add_argument("--png", required=True, type=Path, help="where to write the figure (run 7's: "
                    "bench/gpu/2026-12-02-run7/grid.png)")
    ap.add_argument("--run", type=int, choices=(6, 7), default=7, help="run 6's figure or run 7's (default)")
    a = ap.parse_args(argv)
    out = plot(figures(a.run), a.png, lambda s: print(s, file=sys.stderr),
               title="chunk/local grid: passkey and perplexity against context length (dotted: trained length L)\n"
                     "DCA SxwY: chunk x k, local y k tokens, also as fractions of L",
               ppl_max=4.2, dpi=130, row_legend=True)
    if out is None:
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
