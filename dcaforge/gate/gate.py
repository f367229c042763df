"""``dcaforge gate``: the acceptance gates declared in the config (``gates:``), run on the builds
``dcaforge build`` made (the clean room's and, for ``off-identity``, the baseline's).

- ``off-identity``: with ``--dca off`` the patched build's logits are byte-identical to the
  baseline build's (so greedy output is too), flash attention on and off. The logits come from
  ``dcaforge/gate/gatetools/dca_logits.cpp`` compiled against each build (``gatetools/build_logits.py``).
- ``noop-below-chunk``: with every position below ``c = chunk - local``, DCA on equals DCA off
  within ``tolerance`` (max |a-b| / max |b| per position).
- ``extension``: ``llama-perplexity`` and ``llama-passkey`` past the trained context, plain rope
  against DCA: DCA's perplexity at every longer context stays within ``ppl_ratio_max`` of plain's
  at the trained context; optionally plain's at the longest is at least ``plain_ratio_min`` times
  worse (the test is meaningful); DCA's passkey accuracy past the trained context is at least
  ``passkey_min``.

A model is a GGUF file (``model:``) or a recipe (``recipe: tiny:<arch>[:<variant>]``, the tiny
random-weight models of ``dcaforge/gate/gatetools/tiny.py``). Results, logs, models and the plot go to
``<workspace>/<name>-gates/``: ``results.json`` and ``gates.png``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from dcaforge.config import Config
from dcaforge.configsections import GateConfig
from dcaforge.errors import GateError
from dcaforge.gate.context import GateContext
from dcaforge.gate.extension import gate_extension
from dcaforge.gate.logits import gate_noop, gate_off_identity
from dcaforge.gate.options import METHOD_LABEL, METHODS
from dcaforge.gate.plot import plot
from dcaforge.gate.results import GateHooks, GateReport, GateResult
from dcaforge.gate.rulergate import gate_ruler
from dcaforge.room.cleanroom import Room, write_atomic

RUNNERS: dict[str, Callable[[GateContext, GateConfig], GateResult]] = {
    "off-identity": gate_off_identity,
    "noop-below-chunk": gate_noop,
    "extension": gate_extension,
    "ruler": gate_ruler,
}


def points_table(r: GateResult) -> tuple[str, list[str], list[list[str]]] | None:
    """(title, columns, rows) of a gate's points for the CLI's table; None when it has none."""
    if not r.points:
        return None

    def f(v: Any, pct: bool = False) -> str:
        return "-" if v is None else (f"{v:.0%}" if pct else f"{v:.4g}")

    methods = [m for m in METHODS if m in r.metrics.get("methods", ["plain", "dca"])]
    if r.kind == "ruler":
        cols = ["task", "context", "tokens", *[METHOD_LABEL[m] for m in methods]]
        rows = [[p["task"], str(p["ctx"]), "-" if p.get("tokens") is None else str(p["tokens"]),
                 *[("does not fit" if p.get("tokens") is None else f(p.get(m), True)) for m in methods]] for p in r.points]
        return f"{r.name}: exact-match score (RULER string_match_all)", cols, rows
    cols = ["context", *[f"ppl {METHOD_LABEL[m]}" for m in methods]]
    has_pk = any(k.startswith("passkey_") for p in r.points for k in p)
    if has_pk:
        cols += [f"passkey {METHOD_LABEL[m]}" for m in methods]
    rows = []
    for p in r.points:
        row = [str(p["ctx"]), *[f(p.get(f"ppl_{m}")) for m in methods]]
        if has_pk:
            row += [f(p.get(f"passkey_{m}"), True) for m in methods]
        rows.append(row)
    return f"{r.name}: {' vs '.join(METHOD_LABEL[m] for m in methods)}", cols, rows


def run_gates(cfg: Config, *, only: Sequence[str] = (), hooks: GateHooks | None = None) -> GateReport:
    """``dcaforge gate``: run the configured gates (or ``only`` those named)."""
    hooks = hooks or GateHooks()
    if not cfg.gates:
        raise GateError("the config declares no gates", where=cfg.describe(),
                        hint="add a 'gates:' list (name, kind, model or recipe, thresholds); see docs/workflow.md (gate) and docs/config.md")
    names = [g.name for g in cfg.gates]
    for n in only:
        if n not in names:
            raise GateError(f"no gate named {n!r}", where=cfg.describe(), hint=f"gates: {', '.join(names)}")
    if cfg.build.backend != "cmake":
        raise GateError("the gates run on cmake builds (build.backend: cmake)", where=cfg.describe())
    Room.of(cfg).require()
    c = GateContext(cfg, hooks)
    results: list[GateResult] = []
    for g in cfg.gates:
        if only and g.name not in only:
            continue
        if hooks.on_gate:
            hooks.on_gate(g)
        t0 = time.monotonic()
        res = RUNNERS[g.kind](c, g)
        res.seconds = round(time.monotonic() - t0, 2)
        results.append(res)
    report = GateReport(results=results, out_dir=c.out, json_path=c.out / "results.json", plot_path=None)
    report.plot_path = plot(results, c.out / "gates.png", hooks.on_step)
    write_atomic(report.json_path, (json.dumps(report.to_dict(), indent=2, sort_keys=True) + "\n").encode())
    return report
