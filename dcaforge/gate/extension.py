"""The ``extension`` gate: ``llama-perplexity`` and ``llama-passkey`` past the trained context, plain rope against
DCA (and YaRN when listed)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dcaforge.configsections import GateConfig
from dcaforge.errors import GateError
from dcaforge.gate.context import GateContext
from dcaforge.gate.ggufmeta import gguf_metadata
from dcaforge.gate.options import METHOD_LABEL, gate_methods, method_flags, model_label, opt, trained_of
from dcaforge.gate.passkey import PREFIX_TOKENS, PROMPT_TOKENS, parse_passkey
from dcaforge.gate.perplexity import RETRIES, run_perplexity
from dcaforge.gate.results import GateResult, failure


@dataclass
class _Extension:
    """One extension gate: its settings, the model, the binaries, and the passkey prompt's size once measured."""

    c: GateContext
    g: GateConfig
    model: Path
    text: Any
    arch: str
    trained: int
    contexts: list[int]
    methods: list[str]
    threads: int
    chunk: int
    local: int
    extra: list[str]
    ppl_exe: Path
    pk_exe: Path
    trials: int
    n_vocab: int        # sizes the --kl-divergence-base fallback of run_perplexity()
    per_junk: float = 0.0
    prefix: int = 0

    def flags(self, method: str, ctx: int) -> list[str]:
        return method_flags(method, ctx, self.trained, self.chunk, self.local, [str(a) for a in opt(self.g, "dca_args")],
                            float(opt(self.g, "yarn_factor")))

    def ppl(self, ctx: int, method: str) -> float | None:
        self.c.step(f"{self.g.name}: perplexity {METHOD_LABEL[method]} at {ctx}")
        argv: list[str | os.PathLike[str]] = [self.ppl_exe, "-m", self.model, "-f", self.text, "-c", str(ctx),
                                              "-b", str(min(ctx, 2048)), "--chunks", "1", "-t", str(self.threads),
                                              *self.extra, *self.flags(method, ctx)]
        return run_perplexity(self.c, argv, f"ppl-{method}-{ctx}", ctx, self.n_vocab)

    def measure_prompt(self) -> None:
        """How many tokens a junk sentence takes: 5 junk + the passkey sentence, in a context made big enough."""
        self.c.step(f"{self.g.name}: passkey calibration")
        out = self.c.run([self.pk_exe, "-m", self.model, "--junk", "5", "--pos", "0", "-t", str(self.threads), *self.extra,
                          "--override-kv", f"{self.arch}.context_length=int:{max(self.trained, 8192)}"], "passkey-calibrate")
        pt, pf = PROMPT_TOKENS.search(out), PREFIX_TOKENS.search(out)
        if not pt or not pf:
            raise GateError("llama-passkey did not print its prompt size", where=str(self.c.logs))
        self.prefix = int(pf.group(1))
        self.per_junk = (int(pt.group(1)) - self.prefix) / 6.0

    def passkey(self, ctx: int, method: str) -> float | None:
        junk = int((ctx - self.prefix - 40) / self.per_junk) - 1
        if junk < 2:
            return None  # the prompt alone does not fit this context
        hits = 0
        for k in range(self.trials):
            pos = int((k + 0.5) * junk / self.trials)
            self.c.step(f"{self.g.name}: passkey {METHOD_LABEL[method]} at {ctx} (pos {pos}/{junk})")
            argv: list[str | os.PathLike[str]] = [self.pk_exe, "-m", self.model, "--junk", str(junk), "--pos", str(pos),
                                                  "-t", str(self.threads), *self.extra, *self.flags(method, ctx)]
            if method == "dca":
                argv += ["-c", str(ctx + 64)]
            elif ctx > self.trained:  # llama-passkey sizes its context from the trained length
                argv += ["--override-kv", f"{self.arch}.context_length=int:{ctx + 64}"]
            for attempt in range(RETRIES):  # see run_perplexity(): a lost output tail is run again
                out = self.c.run(argv, f"passkey-{method}-{ctx}-{k}"
                                 + (f"-retry{attempt}" if attempt else ""), check=False)
                key, answer = parse_passkey(out)
                if key is not None and "decoded" in out:  # the run's last line ("decoded N tokens in ...") is there
                    break
            hits += int(key is not None and key == answer)
        return hits / self.trials

    def point(self, ctx: int) -> dict[str, Any]:
        """A context's row: each method's perplexity, then (passkey_trials > 0) each method's passkey accuracy."""
        row: dict[str, Any] = {"ctx": ctx}
        for m in self.methods:
            row[f"ppl_{m}"] = self.ppl(ctx, m)
        if self.trials > 0:
            for m in self.methods:
                row[f"passkey_{m}"] = self.passkey(ctx, m)
        return row


def _setup(c: GateContext, g: GateConfig) -> _Extension:
    """The gate's settings checked, its model and binaries found (GateError otherwise), before anything runs."""
    model = c.model(g)
    text = g.options.get("text")
    if text is None or not Path(text).is_file():
        raise GateError(f"gate {g.name!r} needs 'text:', an existing text file for llama-perplexity", where=g.where)
    meta = gguf_metadata(model)
    arch, trained = trained_of(g, meta)
    contexts = sorted({int(x) for x in g.options.get("contexts", [trained, 2 * trained, 4 * trained, 8 * trained])})
    if trained not in contexts:
        contexts.insert(0, trained)
    threads = int(opt(g, "threads"))
    chunk, local = int(opt(g, "chunk")), int(opt(g, "local"))
    methods = gate_methods(g)
    if "plain" not in methods or "dca" not in methods:
        raise GateError(f"gate {g.name!r}: 'methods:' must include plain and dca (the gate compares them)", where=g.where)
    extra = [str(a) for a in opt(g, "extra_args")]
    ppl_exe = c.binary(c.feature_build, "llama-perplexity", "feature")
    pk_exe = c.binary(c.feature_build, "llama-passkey", "feature")
    return _Extension(c, g, model, text, arch, trained, contexts, methods, threads, chunk, local, extra, ppl_exe, pk_exe,
                      int(opt(g, "passkey_trials")), int(meta.get("tokenizer.ggml.tokens#count") or 0))


def gate_extension(c: GateContext, g: GateConfig) -> GateResult:
    x = _setup(c, g)
    if x.trials > 0:
        x.measure_prompt()
    points = [x.point(ctx) for ctx in x.contexts]
    base = points[x.contexts.index(x.trained)]["ppl_plain"]
    if base is None:
        raise GateError(f"gate {g.name!r}: llama-perplexity gave no result at the trained context {x.trained}",
                        where=str(c.logs), hint="is the text long enough (2 x the context in tokens)?")
    longer = [p for p in points if p["ctx"] > x.trained]
    acc = None
    if x.trials > 0 and longer:
        accs = [p["passkey_dca"] for p in longer if p["passkey_dca"] is not None]
        acc = sum(accs) / len(accs) if accs else None
    failures = _ppl_failures(g, x.trained, longer, base) + _passkey_failures(g, longer, acc)
    checks = [f["text"].split(": ", 1)[1] for f in failures]
    worst = max((p["ppl_dca"] or math.inf) for p in longer) if longer else None
    summary = (f"trained {x.trained}: plain ppl {base:.4g}; DCA worst {worst:.4g} up to {x.contexts[-1]}"
               if worst is not None else f"trained {x.trained}: plain ppl {base:.4g}")
    if acc is not None:
        summary += f"; DCA passkey {acc:.0%}"
    if checks:
        summary += "; " + "; ".join(checks)
    metrics = {"model": model_label(g), "methods": x.methods, "trained": x.trained, "ppl_trained": base,
               "ppl_ratio_max": float(opt(g, "ppl_ratio_max")), "plain_ratio_min": g.options.get("plain_ratio_min"),
               "passkey_min": g.options.get("passkey_min"), "passkey_dca_past_trained": acc}
    return GateResult(g.name, g.kind, not failures, summary, metrics, points, failures=failures)


def _ppl_failures(g: GateConfig, trained: int, longer: list[dict[str, Any]], base: float) -> list[dict[str, Any]]:
    """The perplexity cells past the trained context that fail ``ppl_ratio_max`` (DCA's) or ``plain_ratio_min``
    (plain's at the longest: the test is hard enough)."""
    ratio_max = float(opt(g, "ppl_ratio_max"))
    out = []
    for p in longer:
        v = p["ppl_dca"]
        if v is None or v > ratio_max * base:
            out.append(failure(g.name, "perplexity", p["ctx"], "dca", v, ratio_max * base, "ppl_ratio_max",
                               f"perplexity at {p['ctx']} tokens: DCA {'no result' if v is None else f'{v:.4g}'} > "
                               f"ppl_ratio_max {ratio_max:g} x {base:.4g} (plain at {trained})"))
    plain_min = g.options.get("plain_ratio_min")
    if plain_min is not None and longer:
        v = longer[-1]["ppl_plain"]
        if v is not None and v < float(plain_min) * base:
            out.append(failure(g.name, "perplexity", longer[-1]["ctx"], "plain", v, float(plain_min) * base,
                               "plain_ratio_min",
                               f"perplexity at {longer[-1]['ctx']} tokens: plain {v:.4g} < plain_ratio_min "
                               f"{float(plain_min):g} x {base:.4g} (the test is not hard enough)"))
    return out


def _passkey_failures(g: GateConfig, longer: list[dict[str, Any]], acc: float | None) -> list[dict[str, Any]]:
    """DCA's passkey cells past the trained context below ``passkey_min``, or none measured there."""
    pk_min = g.options.get("passkey_min")
    if pk_min is None:
        return []
    out = []
    if acc is None:
        out.append(failure(g.name, "passkey", None, "dca", None, float(pk_min), "passkey_min",
                           "passkey: no measurement past the trained context (passkey_trials 0, or the prompt does not fit)"))
    for p in longer:
        v = p.get("passkey_dca")
        if v is not None and v < float(pk_min):
            out.append(failure(g.name, "passkey", p["ctx"], "dca", v, float(pk_min), "passkey_min",
                               f"passkey at {p['ctx']} tokens: DCA {v:.2f} < passkey_min {float(pk_min):g}"))
    return out
