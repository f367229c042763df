"""The gates on dca_logits' raw logits: ``off-identity`` (the patched build with ``--dca off`` byte-identical to the
baseline build) and ``noop-below-chunk`` (DCA on equals DCA off below c = chunk - local, within a tolerance)."""

from __future__ import annotations

import math
import struct
from typing import Any

from dcaforge.configsections import GateConfig
from dcaforge.errors import GateError
from dcaforge.gate.context import GateContext
from dcaforge.gate.options import opt
from dcaforge.gate.results import GateResult


def _floats(data: bytes) -> list[float]:
    return list(struct.unpack(f"<{len(data) // 4}f", data))


def _rel_err_per_row(a: bytes, b: bytes, n_vocab: int) -> list[float]:
    fa, fb = _floats(a), _floats(b)
    out = []
    for i in range(0, len(fa), n_vocab):
        ra, rb = fa[i:i + n_vocab], fb[i:i + n_vocab]
        denom = max(max(abs(x) for x in rb), 1e-30)
        out.append(max(abs(x - y) for x, y in zip(ra, rb, strict=True)) / denom)
    return out



def gate_off_identity(c: GateContext, g: GateConfig) -> GateResult:
    model = c.model(g)
    patched, base = c.dumper("feature"), c.dumper("baseline")
    n, threads = int(opt(g, "n_tokens")), int(opt(g, "threads"))
    metrics: dict[str, Any] = {"n_tokens": n}
    ok = True
    for fa in opt(g, "flash_attn"):
        c.step(f"{g.name}: logits, fa {'on' if fa else 'off'}: patched --dca off vs baseline")
        a, _ = c.logits(patched, model, n, bool(fa), threads, "off")
        b, _ = c.logits(base, model, n, bool(fa), threads, None)
        same = a == b
        key = f"fa_{'on' if fa else 'off'}"
        metrics[key] = {"identical": same, "bytes": len(a)}
        if not same:
            ok = False
            if len(a) == len(b):
                fa_, fb_ = _floats(a), _floats(b)
                metrics[key]["max_abs_diff"] = max(abs(x - y) for x, y in zip(fa_, fb_, strict=True))
    summary = "byte-identical logits" if ok else "logits differ from the baseline build"
    return GateResult(g.name, g.kind, ok, summary + f" ({n} tokens, fa {'/'.join('on' if f else 'off' for f in opt(g, 'flash_attn'))})",
                      metrics)


def gate_noop(c: GateContext, g: GateConfig) -> GateResult:
    model = c.model(g)
    chunk, local = int(opt(g, "chunk")), int(opt(g, "local"))
    cmax = chunk - local
    n = int(g.options.get("n_tokens", cmax))
    if n > cmax:
        raise GateError(f"gate {g.name!r}: n_tokens {n} is not below c = chunk - local = {cmax}", where=g.where)
    tol, threads = float(opt(g, "tolerance")), int(opt(g, "threads"))
    exe = c.dumper("feature")
    metrics: dict[str, Any] = {"n_tokens": n, "chunk": chunk, "local": local, "tolerance": tol}
    ok = True
    worst = 0.0
    for fa in opt(g, "flash_attn"):
        c.step(f"{g.name}: logits, fa {'on' if fa else 'off'}: DCA on vs off, {n} tokens < c = {cmax}")
        on, vocab = c.logits(exe, model, n, bool(fa), threads, "on", chunk, local)
        off, _ = c.logits(exe, model, n, bool(fa), threads, "off")
        err = max(_rel_err_per_row(on, off, vocab))
        metrics[f"fa_{'on' if fa else 'off'}"] = {"max_rel_err": err}
        worst = max(worst, err)
        ok = ok and err <= tol and not math.isnan(err)
    return GateResult(g.name, g.kind, ok, f"max rel err {worst:.3g} (tolerance {tol:g}) below c = {cmax}", metrics)
