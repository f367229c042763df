"""The gates' figure (``gates.png``): accuracy and perplexity against context length, one line per
method (plain rope, YaRN, DCA), one row per model, one panel per measure: passkey, the RULER
tasks (vt, niah_*), perplexity. A point not measured is left out (a gap), a panel without any point
says so; a measured 0 is drawn at 0.

matplotlib is an extra (``pip install 'dcaforge[plots]'``): without it the gates run, write their
results and say that the figure was left out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

#: label, colour, marker, line style, marker size: drawn in this order, largest first, so equal values stay visible
STYLE = {"plain": ("plain rope", "#7f7f7f", "o", "--", 9), "yarn": ("YaRN", "#ff7f0e", "^", "-.", 6.5),
         "dca": ("DCA", "#1f77b4", "s", "-", 4)}
PANELS = ("passkey", "vt", "niah_single", "niah_multikey", "niah_multivalue", "perplexity")
TITLES = {"passkey": "passkey", "vt": "variable tracking (vt)", "niah_single": "NIAH single",
          "niah_multikey": "NIAH multi-key", "niah_multivalue": "NIAH multi-value", "perplexity": "perplexity"}
#: further DCA settings (methods named "dca-<setting>", e.g. a chunk/local grid): colours and markers in turn
EXTRA_COLORS = ("#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")
EXTRA_MARKERS = ("D", "v", "P", "X", "*", "<", ">")
MISSING = ("the figure (gates.png) was left out: matplotlib is not installed; "
           "pip install 'dcaforge[plots]' (or matplotlib) to get it")


class _Result(Protocol):
    name: str
    kind: str
    passed: bool
    metrics: dict[str, Any]
    points: list[dict[str, Any]]


Series = dict[str, dict[int, float]]  # method -> context -> value


def _methods(r: _Result) -> list[str]:
    """plain, YaRN, DCA, then the further settings the result names in metrics["methods"]."""
    extra = [str(m) for m in r.metrics.get("methods", []) if str(m) not in STYLE]
    return [*STYLE, *extra]


def style(method: str, extras: Sequence[str] = ()) -> tuple[str, str, str, str, float]:
    """(label, colour, marker, line style, marker size) of a method; a further DCA setting "dca-S4w1" is drawn as
    "DCA S4w1" in the next colour of EXTRA_COLORS (its place in ``extras``)."""
    if method in STYLE:
        return STYLE[method]
    i = list(extras).index(method) if method in extras else 0
    label = "DCA " + method[4:] if method.startswith("dca-") else method
    return label, EXTRA_COLORS[i % len(EXTRA_COLORS)], EXTRA_MARKERS[i % len(EXTRA_MARKERS)], "-", 4.5


def labels(results: Sequence[_Result]) -> dict[str, dict[str, str]]:
    """{model: {method: label}} from the results' optional metrics["labels"]: a legend text that replaces the one
    ``style`` gives (e.g. "DCA S16w4: 1/2, 1/8 of L"); a method not named there keeps its own."""
    out: dict[str, dict[str, str]] = {}
    for r in results:
        if isinstance(r.metrics.get("labels"), dict):
            model = str(r.metrics.get("model") or r.name)
            out.setdefault(model, {}).update({str(k): str(v) for k, v in r.metrics["labels"].items()})
    return out


def collect(results: Sequence[_Result]) -> tuple[dict[str, dict[str, Series]], dict[str, int], dict[str, dict[str, set[int]]]]:
    """{model: {panel: {method: {ctx: value}}}} from the extension (perplexity, passkey) and ruler
    (its tasks, passkey included) gates, each model's trained length, and {model: {panel: contexts}}
    where the task's prompt does not fit the context."""
    data: dict[str, dict[str, Series]] = {}
    trained: dict[str, int] = {}
    nofit: dict[str, dict[str, set[int]]] = {}
    for r in results:
        if not r.points or r.kind not in ("extension", "ruler"):
            continue
        model = str(r.metrics.get("model") or r.name)
        if r.metrics.get("trained"):
            trained[model] = int(r.metrics["trained"])
        panels = data.setdefault(model, {})
        methods = _methods(r)
        for p in r.points:
            ctx = int(p["ctx"])
            if r.kind == "ruler":
                if p.get("tokens") is None:
                    nofit.setdefault(model, {}).setdefault(str(p["task"]), set()).add(ctx)
                    panels.setdefault(str(p["task"]), {})
                for m in methods:
                    if p.get(m) is not None:
                        panels.setdefault(str(p["task"]), {}).setdefault(m, {})[ctx] = float(p[m])
            else:
                if any(f"passkey_{m}" in p for m in methods) and all(p.get(f"passkey_{m}") is None for m in methods):
                    nofit.setdefault(model, {}).setdefault("passkey", set()).add(ctx)  # llama-passkey's prompt is longer
                    panels.setdefault("passkey", {})
                for m in methods:
                    if p.get(f"ppl_{m}") is not None:
                        panels.setdefault("perplexity", {}).setdefault(m, {})[ctx] = float(p[f"ppl_{m}"])
                    if p.get(f"passkey_{m}") is not None:
                        panels.setdefault("passkey", {}).setdefault(m, {})[ctx] = float(p[f"passkey_{m}"])
    return data, trained, nofit


def _ctx_label(x: int) -> str:
    if x >= 1 << 20 and x % (1 << 20) == 0:
        return f"{x >> 20}M"
    if x >= 1024 and x % 1024 == 0:
        return f"{x >> 10}k"
    return str(x)


def _draw_series(ax: Any, panel: str, series: dict[str, dict[int, float]], extras: list[str], names: dict[str, str],
                 ppl_max: float | None, handles: dict[str, tuple[int, Any]]) -> None:
    """A panel's lines, one a method (plain, YaRN, DCA, then the further settings), each label once in ``handles``;
    with ``ppl_max``, a perplexity above it drawn at the top edge with its value written."""
    for rank, m in enumerate([*STYLE, *extras]):
        s = series.get(m)
        if not s:
            continue
        label, color, marker, ls, size = style(m, extras)
        label = names.get(m, label)
        xs = sorted(s)
        ys = [s[x] for x in xs]
        if panel == "perplexity" and ppl_max is not None:
            for x, y in zip(xs, ys, strict=True):
                if y > ppl_max:
                    ax.annotate(f"{y:.4g}", (x, ppl_max), fontsize=6, color=color, ha="center", va="top",
                                xytext=(0, -6), textcoords="offset points")
            ys = [min(y, ppl_max) for y in ys]
        (line,) = ax.plot(xs, ys, marker=marker, ls=ls, color=color, label=label, ms=size, lw=1.4)
        handles.setdefault(label, (rank, line))


def _set_axes(ax: Any, panel: str, series: dict[str, dict[int, float]], xs_row: list[int], trained: int | None,
              ppl_max: float | None) -> None:
    """A measured panel's axes: the row's contexts on a log2 x axis, the trained length dotted, perplexity on a log
    axis (linear within a factor 10, or up to ``ppl_max``), scores on [0, 1]."""
    ax.set_xscale("log", base=2)  # every panel of a row on the same axis: the model's contexts
    ax.set_xlim(xs_row[0] / 1.25, xs_row[-1] * 1.25)
    ax.set_xticks(xs_row, [_ctx_label(x) for x in xs_row])
    ax.minorticks_off()
    if trained is not None:
        ax.axvline(trained, color="grey", lw=0.8, ls=":")
    if panel == "perplexity" and ppl_max is not None:
        lo = min(v for s in series.values() for v in s.values())
        ax.set_ylim(lo * 0.97, ppl_max * 1.01)
    elif panel == "perplexity":
        ax.set_yscale("log")
        vals = [v for s in series.values() for v in s.values() if v > 0 and math.isfinite(v)]
        if vals and max(vals) / min(vals) < 10:
            ax.set_yscale("linear")
    else:
        ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("context (tokens)", fontsize=7)


def plot(results: Sequence[_Result], path: Path, on_step: Callable[[str], None] | None = None,
         title: str | None = None, ppl_max: float | None = None, dpi: int = 72, row_legend: bool = False) -> Path | None:
    """Write the figure; None when no gate has points to draw, or matplotlib is missing (``on_step``
    is told why). ``title`` replaces the gates' own (which ends in PASS or FAIL). ``ppl_max``: a linear
    perplexity axis up to that value, a point above it drawn at the top edge with its value written. A result's
    metrics["labels"] ({method: text}) names its methods in the legend (``labels``). ``row_legend``: one legend per
    row, right of its last panel, instead of one inside each panel (for many methods with long labels)."""
    data, trained, nofit = collect(results)
    names = labels(results)
    if not data:
        return None
    try:
        import matplotlib
    except ImportError:
        if on_step:
            on_step(MISSING)
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [p for p in PANELS if any(p in d for d in data.values())]
    if "passkey" not in panels:  # always shown: an empty one says passkey was not measured
        panels.insert(0, "passkey")
    models = sorted(data)
    fig, axes = plt.subplots(len(models), len(panels),
                             figsize=(3.1 * len(panels) + (2.4 if row_legend else 0), 2.7 * len(models) + 0.5),
                             squeeze=False)
    for row, model in zip(axes, models, strict=True):
        extras = sorted({m for s in data[model].values() for m in s if m not in STYLE})   # one colour a setting per row
        handles: dict[str, tuple[int, Any]] = {}   # the row's legend: label -> (place in the drawing order, line)
        xs_row = sorted({x for s in data[model].values() for v in s.values() for x in v} | ({trained[model]} if model in trained else set()))
        for ax, panel in zip(row, panels, strict=True):
            series = data[model].get(panel, {})
            misses = sorted(nofit.get(model, {}).get(panel, set()))
            _draw_series(ax, panel, series, extras, names.get(model, {}), ppl_max, handles)
            if misses and panel != "perplexity":
                dots = ax.scatter(misses, [0.5] * len(misses), marker="x", color="#bbbbbb", s=30, label="prompt does not fit")
                handles.setdefault("prompt does not fit", (len(STYLE) + len(extras), dots))
            ax.set_title(f"{TITLES.get(panel, panel)}\n{model}", fontsize=8)
            ax.tick_params(labelsize=7)
            if not sorted({x for s in series.values() for x in s} | set(misses)):
                ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes, fontsize=8, color="grey")
                ax.set_xticks([])
                ax.set_yticks([])
                continue
            _set_axes(ax, panel, series, xs_row, trained.get(model), ppl_max)
            if not row_legend:
                ax.legend(fontsize=6, loc="best")
        if row_legend and handles:   # every method of the row once: plain, YaRN, DCA, the settings
            order = sorted(handles, key=lambda t: handles[t][0])
            row[-1].legend([handles[t][1] for t in order], order, fontsize=6.5, loc="center left",
                           bbox_to_anchor=(1.03, 0.5), frameon=False)
    fig.suptitle(title or ("accuracy and perplexity against context length (dotted: trained length); "
                           + ("PASS" if all(r.passed for r in results) else "FAIL")), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def plot_calibration(rep: Any, path: Path, on_step: Callable[[str], None] | None = None, dpi: int = 72) -> Path | None:
    """``dcaforge calibrate``'s figure (``sweep.png``): left, the dev sweep: exact answers (with Wilson 95% intervals)
    against the chunk size S, one line per dev length and one for all of them, the pick ringed; middle, the dev
    perplexity per S when measured; right, the held-out check: the pick and YaRN per held-out length. ``rep`` is a
    dcaforge.gate.calibrate_report.Report. None (``on_step`` told why) without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        if on_step:
            on_step(MISSING.replace("gates.png", path.name))
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def chunk(m: str) -> int:
        return int(m.split(":")[1])

    def frac(s: Any) -> tuple[float, float, float]:
        lo, hi = s.interval
        p = s.k / s.n if s.n else 0.0
        # clamped: Wilson's bound of k = n (or k = 0) can land a rounding error past p, and matplotlib refuses a
        # negative error bar (seen: 2/2 -> hi - p = -1.1e-16)
        return p, max(0.0, p - lo), max(0.0, hi - p)

    # the lines join the sizes with the temperature off; a candidate with a temperature (dca:S:W:len, dca:S:W:pos) is a
    # marker of its own at its S
    from dcaforge.gate.longctx import parse_method

    def temp(m: str) -> str:   # the candidate's temperature form, "" when off
        factor = parse_method(m).factor
        return "" if factor == "0" else factor

    cands = sorted((m for m in rep.dev if not temp(m)), key=chunk)
    temps = sorted((m for m in rep.dev if temp(m)), key=chunk)
    xs = [chunk(m) for m in cands]
    has_ppl = any(v is not None for v in rep.ppl.values())
    fig, axes = plt.subplots(1, 3 if has_ppl else 2, figsize=(10.5 if has_ppl else 7.5, 3.2), squeeze=False)
    ax = axes[0][0]
    lengths = sorted({n for by in rep.dev.values() for n in by})
    for i, n in enumerate(lengths):
        vals = [frac(rep.dev[m][n]) for m in cands]
        ax.errorbar(xs, [v[0] for v in vals], yerr=[[v[1] for v in vals], [v[2] for v in vals]], marker="o", ms=4,
                    capsize=2, lw=1, color=EXTRA_COLORS[i % len(EXTRA_COLORS)], label=f"{n} tokens ({n / rep.plan.trained:.1f}x L)")
    tot = [frac(rep.total(rep.dev[m])) for m in cands]
    ax.errorbar(xs, [v[0] for v in tot], yerr=[[v[1] for v in tot], [v[2] for v in tot]], marker="s", ms=5, capsize=3,
                lw=1.8, color=STYLE["dca"][1], label="all dev trials")
    if temps:
        tv = [frac(rep.total(rep.dev[m])) for m in temps]
        ax.errorbar([chunk(m) for m in temps], [v[0] for v in tv], yerr=[[v[1] for v in tv], [v[2] for v in tv]], marker="^",
                    ms=6, capsize=3, lw=0, elinewidth=1, color=STYLE["yarn"][1],
                    label="all dev trials, temperature " + "/".join(sorted({temp(m) for m in temps})))
    far = rep.far
    if far:   # the dev rule's best two at the far dev length: a marker each at its S
        fv = [frac(far[m]) for m in far]
        ax.errorbar([chunk(m) for m in far], [v[0] for v in fv], yerr=[[v[1] for v in fv], [v[2] for v in fv]], marker="D",
                    ms=5, capsize=3, lw=0, elinewidth=1, color="black", label=f"{rep.plan.far_dev} tokens, the best {len(far)}")
    pick_x = chunk(rep.choice.pick)
    ax.scatter([pick_x], [frac(rep.total(rep.dev[rep.choice.pick]))[0]], s=160, facecolors="none", edgecolors="black",
               zorder=5, label=f"pick: S {rep.chunk}, w {rep.local}" + (f", temperature {temp(rep.choice.pick)}" if temp(rep.choice.pick) else ""))
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [_ctx_label(x) for x in xs])
    ax.minorticks_off()
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("chunk size S (w = S/8)", fontsize=7)
    ax.set_title(f"dev: exact answers (L = {rep.plan.trained})", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=6, loc="best")
    if has_ppl:
        ax = axes[0][1]
        pts = [(chunk(m), rep.ppl[m]) for m in cands if rep.ppl.get(m) is not None]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="s", color=STYLE["dca"][1], lw=1.4)
        tp = [(chunk(m), rep.ppl[m]) for m in temps if rep.ppl.get(m) is not None]
        if tp:
            ax.plot([p[0] for p in tp], [p[1] for p in tp], marker="^", lw=0, color=STYLE["yarn"][1])
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [_ctx_label(x) for x in xs])
        ax.minorticks_off()
        ax.set_xlabel("chunk size S", fontsize=7)
        ax.set_title(f"dev perplexity at {rep.plan.ppl_ctx} tokens", fontsize=8)
        ax.tick_params(labelsize=7)
    ax = axes[0][-1]
    far_held = rep.far_heldout
    held = sorted({n for by in rep.heldout.values() for n in by})
    pick_label = f"DCA S {rep.chunk}, w {rep.local}" + (f", {temp(rep.choice.pick)}" if temp(rep.choice.pick) else "")
    for j, (m, label, color) in enumerate(((rep.choice.pick, pick_label, STYLE["dca"][1]),
                                           ("yarn", "YaRN", STYLE["yarn"][1]))):
        vals = [frac(rep.heldout[m][n]) for n in held]
        pos = [i + (j - 0.5) * 0.3 for i in range(len(held))]
        ax.bar(pos, [v[0] for v in vals], width=0.3, color=color, label=label,
               yerr=[[v[1] for v in vals], [v[2] for v in vals]], capsize=2, error_kw={"lw": 0.8})
    ticks = [f"{_ctx_label(n)}\n({n / rep.plan.trained:.1f}x L)" for n in held]
    if far_held is not None and rep.plan.far_heldout:   # the pick alone at the far length
        v = frac(far_held)
        ax.bar([len(held) - 0.15], [v[0]], width=0.3, color=STYLE["dca"][1], yerr=[[v[1]], [v[2]]], capsize=2,
               error_kw={"lw": 0.8})
        ticks.append(f"{_ctx_label(rep.plan.far_heldout)}\n({rep.plan.far_heldout / rep.plan.trained:.1f}x L)")
    ax.set_xticks(range(len(ticks)), ticks)
    ax.set_ylim(0, 1.05)
    ax.set_title("held-out: exact answers", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=6, loc="best")
    fig.suptitle(f"dcaforge calibrate {rep.model.name}: Wilson 95% intervals", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path
