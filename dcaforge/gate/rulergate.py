"""The ``ruler`` gate: RULER's vt / niah (and passkey) tasks through llama-server, one server per context and
method, the same prompts to every method at a context, exact-match scores."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dcaforge import ruler
from dcaforge.configsections import GateConfig
from dcaforge.errors import GateError
from dcaforge.gate.context import GateContext
from dcaforge.gate.options import METHOD_LABEL, gate_methods, method_flags, model_label, opt, trained_length
from dcaforge.gate.results import GateResult, failure
from dcaforge.gate.server import HttpError, LlamaServer


def _ruler_contexts(g: GateConfig, trained: int) -> list[int]:
    if "contexts" in g.options:
        ctxs = [int(x) for x in g.options["contexts"]]
    else:
        ctxs = [int(round(float(s) * trained)) for s in opt(g, "scales")]
    if not ctxs or min(ctxs) < 16:
        raise GateError(f"gate {g.name!r}: the contexts must be at least 16 tokens, got {ctxs}", where=g.where)
    return sorted(set(ctxs))


def ruler_server_args(model: str | os.PathLike[str], method: str, ctx: int, trained: int, arch: str, chunk: int,
                      local: int, dca_args: Sequence[str] = (), extra_args: Sequence[str] = (), *,
                      threads: int | None = None, yarn_factor: float = 0.0) -> list[str]:
    """llama-server's arguments (after the binary) for one RULER server: ``model`` at context ``ctx``, one
    slot, no prompt cache, no web UI, ``-t threads`` when given, ``extra_args``, the method's flags (see
    :func:`method_flags`) and, past the trained length, ``--override-kv <arch>.context_length=int:<ctx>``
    (llama-server caps a slot at the trained length: past it, say the length is ctx)."""
    args = ["-m", str(model), "-c", str(ctx), "-np", "1", *(["-t", str(threads)] if threads is not None else []),
            "--cache-ram", "0", "--no-webui", *extra_args,
            *method_flags(method, ctx, trained, chunk, local, dca_args, yarn_factor)]
    if ctx > trained:
        args += ["--override-kv", f"{arch}.context_length=int:{ctx}"]
    return args


def ruler_prompt_fields(sample: ruler.Sample, text: str, toks: Sequence[int]) -> dict[str, Any]:
    """A RULER sample record's prompt fields (what ``ruler_run.py compare`` pairs samples by: the prompt's sha256)."""
    return {"prompt_sha256": ruler.sha256(text), "prompt_tokens": len(toks), "n_filler": sample.n_filler,
            "depth": round(sample.depth, 4), "expected": list(sample.expected)}


def ruler_answer_fields(sample: ruler.Sample, answer: str) -> dict[str, Any]:
    """A RULER sample record's answer fields: the exact-match score, whether every expected item was found, the
    answer (its first 2000 characters)."""
    score, all_found = ruler.score(sample.expected, answer)
    return {"score": score, "all": all_found, "answer": answer[:2000]}


def gate_ruler(c: GateContext, g: GateConfig) -> GateResult:
    """RULER tasks served by the clean room's llama-server (see :func:`measure_ruler`)."""
    model = c.model(g)
    return measure_ruler(c.server(), model, g, c.log_path, c.step)


#: (sample, prompt text, its tokens) of a RULER prompt, or None when it does not fit the context
_Built = tuple[ruler.Sample, str, list[int]]


@dataclass
class _Ruler:
    """One ruler measurement: its settings, the prompts built so far, the sample records, the servers run."""

    g: GateConfig
    model: Path
    arch: str
    trained: int
    contexts: list[int]
    methods: list[str]
    tasks: list[str]
    samples: int
    seed: int
    threads: int
    n_predict: int
    chunk: int
    local: int
    fewshot: bool
    chat: bool
    send: str
    extra: list[str]
    log_path: Callable[[str], Path]
    step: Callable[[str], None]
    # (task, ctx, index) -> the prompt or None when it does not fit; built by the first server at a context (the
    # tokenizer is the model's, whatever the method) and sent to every method
    prompts: dict[tuple[str, int, int], _Built | None] = field(default_factory=dict)
    records: list[dict[str, Any]] = field(default_factory=list)
    servers: list[dict[str, Any]] = field(default_factory=list)  # per server: load time, peak GPU memory
    wrap: tuple[str, str] | None = None

    def chat_wrap(self, srv: LlamaServer) -> None:
        """The chat template around one user turn, split at a marker (once)."""
        mark = "\u2063DCAFORGE\u2063"
        templated = srv.apply_template(mark)
        if templated.count(mark) != 1:
            raise GateError(f"gate {self.g.name!r}: the model's chat template does not keep the user's text as it is",
                            where=str(self.model), details=templated[:500], hint="set 'chat: false'")
        pre, _, post = templated.partition(mark)
        self.wrap = (pre, post)

    def build(self, srv: LlamaServer, task: str, ctx: int, i: int, budget: int) -> _Built | None:
        if self.chat and self.wrap is None:
            self.chat_wrap(srv)
        wrap = self.wrap
        seen: dict[int, _Built] = {}

        def measure(n: int) -> int:
            s = ruler.generate(task, self.seed, i, n, n_samples=self.samples, fewshot=self.fewshot)
            text = (wrap[0] + s.question + wrap[1] + s.answer_prefix) if wrap else s.prompt
            toks = srv.tokenize(text)
            seen.clear()
            seen[n] = (s, text, toks)
            return len(toks)

        fitted = ruler.fit(measure, budget, probe=ruler.min_filler(task), slack=budget // 1000)
        if fitted is None:
            return None
        n, _ = fitted
        if n not in seen:
            measure(n)
        return seen[n]

    def serve(self, exe: Path, ctx: int, method: str, probe: bool) -> None:
        """One llama-server (``method`` at ``ctx``) and its samples; a server that does not start or dies is recorded
        as the error of its samples, and the next server tries."""
        job_tasks = ruler_job_tasks(self.tasks, ctx, self.trained, probe, vt_inside_score(self.records, self.trained))
        if not job_tasks:
            return
        g = self.g
        args = ruler_server_args(self.model, method, ctx, self.trained, self.arch, self.chunk, self.local,
                                 [str(a) for a in opt(g, "dca_args")], self.extra, threads=self.threads,
                                 yarn_factor=float(opt(g, "yarn_factor")))
        self.step(f"{g.name}: llama-server {METHOD_LABEL[method]} at {ctx}" + (" (vt inside the trained window)" if probe else ""))
        server_error: str | None = None
        t_server = time.monotonic()
        srv = LlamaServer(exe, args, self.log_path(f"server-{method}-{ctx}"), load_timeout=float(opt(g, "load_timeout")),
                          request_timeout=float(opt(g, "request_timeout")))
        self.servers.append({"ctx": ctx, "method": method})
        try:
            srv.start()
            self.servers[-1]["load_seconds"] = round(time.monotonic() - t_server, 2)
        except GateError as exc:  # e.g. out of memory at this context: recorded, and the next server tries
            server_error = f"llama-server did not start: {exc.message}"
            self.step(f"  {server_error}")
        try:
            for task in job_tasks:
                npred = self.n_predict or ruler.N_PREDICT[task]
                for i in range(self.samples):
                    server_error = self.sample(srv, task, ctx, method, i, npred, server_error)
        finally:
            srv.stop()
        self.servers[-1].update(srv.gpu or {})

    def sample(self, srv: LlamaServer, task: str, ctx: int, method: str, i: int, npred: int,
               server_error: str | None) -> str | None:
        """One sample's record (appended to the records); returns the server's error, if it has one now."""
        rec: dict[str, Any] = {"task": task, "ctx": ctx, "method": method, "index": i, "score": None}
        self.records.append(rec)
        if server_error is not None:
            rec["error"] = server_error
            return server_error
        try:
            self.ask(srv, rec, npred)
        except HttpError as exc:
            rec["error"] = str(exc)[:300]
        except GateError as exc:  # the server died: the rest of this server's samples too
            rec["error"] = exc.message
            return exc.message
        return None

    def ask(self, srv: LlamaServer, rec: dict[str, Any], npred: int) -> None:
        """The sample's prompt (built when its context has none yet) sent, its answer scored into ``rec``."""
        task, ctx, i = rec["task"], rec["ctx"], rec["index"]
        key = (task, ctx, i)
        if key not in self.prompts:
            t_fit = time.monotonic()
            self.prompts[key] = self.build(srv, task, ctx, i, ctx - npred)
            rec["fit_seconds"] = round(time.monotonic() - t_fit, 3)
        built = self.prompts[key]
        if built is None:
            rec["error"] = "does not fit"
            return
        sample, text, toks = built
        rec.update(ruler_prompt_fields(sample, text, toks))
        t0 = time.monotonic()
        reply = srv.completion(toks if self.send == "tokens" else text, npred)
        answer = str(reply.get("content", ""))
        tm = reply.get("timings") or {}
        rec.update({**ruler_answer_fields(sample, answer), "seconds": round(time.monotonic() - t0, 3),
                    "tokens_evaluated": reply.get("tokens_evaluated"),
                    "prompt_per_second": tm.get("prompt_per_second"),
                    "predicted_per_second": tm.get("predicted_per_second")})
        self.step(f"  {task} #{i}: {len(toks)} tokens, score {rec['score']:.2f}")


def _ruler_setup(model: Path, g: GateConfig, log_path: Callable[[str], Path], step: Callable[[str], None]) -> _Ruler:
    """The ruler gate's settings checked (GateError otherwise), before any server runs."""
    arch, trained = trained_length(g, model)
    contexts = _ruler_contexts(g, trained)
    methods = gate_methods(g)
    tasks = [str(t) for t in opt(g, "tasks")]
    bad = [t for t in tasks if t not in ruler.TASKS]
    if bad or not tasks:
        raise GateError(f"gate {g.name!r}: unknown task(s) {bad or tasks}", where=g.where, hint=f"tasks: {', '.join(ruler.TASKS)}")
    samples, seed = int(opt(g, "samples")), int(opt(g, "seed"))
    if samples < 1:
        raise GateError(f"gate {g.name!r}: 'samples:' must be at least 1", where=g.where)
    threads, n_predict = int(opt(g, "threads")), int(opt(g, "n_predict"))
    chunk = int(opt(g, "chunk")) or trained // 2  # explicit: past L the server runs with an overridden trained length
    local = int(opt(g, "local")) or trained // 8
    fewshot, chat, send = bool(opt(g, "fewshot")), bool(opt(g, "chat")), str(opt(g, "send"))
    if send not in ("tokens", "text"):
        raise GateError(f"gate {g.name!r}: 'send:' must be tokens or text, got {send!r}", where=g.where)
    extra = [str(a) for a in opt(g, "extra_args")]
    return _Ruler(g, model, arch, trained, contexts, methods, tasks, samples, seed, threads, n_predict, chunk, local,
                  fewshot, chat, send, extra, log_path, step)


def measure_ruler(exe: Path, model: Path, g: GateConfig, log_path: Callable[[str], Path],
                  step: Callable[[str], None]) -> GateResult:
    """RULER tasks served by ``exe`` (llama-server) on ``model``: one server per (context, method),
    the same prompts to every method at a context, exact-match scores per task, context and method;
    with an NVIDIA GPU, each server's peak GPU memory (nvidia-smi, sampled)."""
    r = _ruler_setup(model, g, log_path, step)
    jobs = ruler_jobs(r.contexts, r.methods, r.tasks, r.trained, bool(opt(g, "vt_probe")))
    for ctx, method, probe in jobs:
        r.serve(exe, ctx, method, probe)
    contexts_run = sorted({ctx for ctx, _, _ in jobs})
    res = ruler_result(g, r.trained, contexts_run, r.methods, r.tasks, r.records, r.chunk, r.local)
    res.metrics["servers"] = r.servers
    return res


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def ruler_jobs(contexts: Sequence[int], methods: Sequence[str], tasks: Sequence[str], trained: int,
               vt_probe: bool = True) -> list[tuple[int, str, bool]]:
    """The ruler gate's servers in order, (context, method, is the vt check): vt inside the trained window comes
    first (plain): a model that scores 0 there cannot do vt, so vt past L is then not measured (nor counted against
    DCA). The contexts run in ascending order, so one inside L with plain among the methods is that measurement; else
    (``vt_probe``) a plain server at L runs vt alone before the rest."""
    jobs = [(ctx, m, False) for ctx in sorted(contexts) for m in methods]
    if "vt" in tasks and vt_probe and not any(c <= trained and m == "plain" for c, m, _ in jobs):
        jobs.insert(0, (trained, "plain", True))
    return jobs


def vt_inside_score(records: Sequence[dict[str, Any]], trained: int) -> float | None:
    """Plain's mean vt score at contexts <= L in the records so far; None when none was scored there (not run yet,
    or no vt prompt fits inside L: then vt is measured past L as any task)."""
    return _mean([r["score"] for r in records if r["task"] == "vt" and r["ctx"] <= trained and r["method"] == "plain"
                  and r["score"] is not None])


def ruler_job_tasks(tasks: Sequence[str], ctx: int, trained: int, probe: bool, vt_inside: float | None) -> list[str]:
    """The tasks one server of :func:`ruler_jobs` runs: vt alone for the vt check; every task but vt past L when vt
    scored 0 inside L."""
    if probe:
        return ["vt"]
    return [t for t in tasks if not (t == "vt" and ctx > trained and vt_inside == 0.0)]


#: the ruler gate's line for a model that scores 0 at vt inside its trained window
VT_NOT_MEASURABLE = "vt: not measurable on this model (0 inside its trained window)"


def ruler_points(records: list[dict[str, Any]], tasks: list[str], contexts: list[int], methods: list[str]) -> list[dict[str, Any]]:
    """A row per task and context that has samples: the mean prompt tokens, and per method the mean score, the share
    of samples with every item found, and how many samples were scored."""
    points: list[dict[str, Any]] = []
    for task in tasks:
        for ctx in contexts:
            rows = [r for r in records if r["task"] == task and r["ctx"] == ctx]
            if not rows:
                continue   # not run: vt past L on a model that cannot do vt, or the other tasks at the vt check's L
            row: dict[str, Any] = {"task": task, "ctx": ctx}
            toks = [r["prompt_tokens"] for r in rows if r.get("prompt_tokens")]
            row["tokens"] = round(sum(toks) / len(toks)) if toks else None
            for m in methods:
                scored = [r for r in rows if r["method"] == m and r["score"] is not None]
                row[m] = _mean([r["score"] for r in scored])
                row[f"{m}_all"] = _mean([float(r["all"]) for r in scored])
                row[f"{m}_n"] = len(scored)
            points.append(row)
    return points


def _ruler_failures(g: GateConfig, trained: int, points: list[dict[str, Any]], counted: list[str]) -> list[dict[str, Any]]:
    """The cells past the trained length that fail ``score_min`` (DCA's score) or ``yarn_margin`` (DCA's score minus
    YaRN's), for the tasks ``counted``."""
    score_min, margin = g.options.get("score_min"), g.options.get("yarn_margin")
    failures: list[dict[str, Any]] = []

    def fail(task: str, ctx: int | None, score: float | None, threshold: float | None, rule: str, text: str) -> None:
        failures.append(failure(g.name, task, ctx, "dca", score, threshold, rule, text))

    for task in counted:
        cells = [p for p in points if p["task"] == task and p["ctx"] > trained]
        if score_min is not None and not any(p.get("dca") is not None for p in cells):
            fail(task, None, None, float(score_min), "score_min", f"{task}: no DCA score past {trained}")
        for p in cells:
            d, y = p.get("dca"), p.get("yarn")
            if d is None:
                continue
            if score_min is not None and d < float(score_min):
                fail(task, p["ctx"], d, float(score_min), "score_min",
                     f"{task} at {p['ctx']} tokens: DCA {d:.2f} < score_min {float(score_min):g}")
            if margin is not None and y is not None and d < y + float(margin):
                fail(task, p["ctx"], d, y + float(margin), "yarn_margin",
                     f"{task} at {p['ctx']} tokens: DCA {d:.2f} < YaRN {y:.2f} + yarn_margin {float(margin):g}")
    return failures


def ruler_result(g: GateConfig, trained: int, contexts: list[int], methods: list[str], tasks: list[str],
                  records: list[dict[str, Any]], chunk: int, local: int) -> GateResult:
    """The points (a row per task and context that has samples), the thresholds checked per cell past the trained
    length (``score_min``: DCA's score; ``yarn_margin``: DCA's score minus YaRN's), and vt's inside-L check: plain's
    vt score at contexts <= L; 0 there makes vt "not measurable" and leaves it out of the thresholds."""
    if any(r["method"] == "plain" for r in records) and "plain" not in methods:
        methods = ["plain", *methods]   # the vt check inside L ran plain
    points = ruler_points(records, tasks, contexts, methods)
    vt_inside = vt_inside_score(records, trained) if "vt" in tasks else None
    counted = [t for t in tasks if not (t == "vt" and vt_inside == 0.0)]
    errors = [r for r in records if r.get("error") and r["error"] != "does not fit"]
    checks: list[str] = []
    if errors:
        checks.append(f"{len(errors)} request(s) failed, e.g. {errors[0]['method']} at {errors[0]['ctx']}: {errors[0]['error'][:120]}")
    past: dict[str, dict[str, float | None]] = {}
    for task in tasks:
        past[task] = {m: _mean([p[m] for p in points if p["task"] == task and p["ctx"] > trained and p[m] is not None])
                      for m in methods}
    score_min, margin = g.options.get("score_min"), g.options.get("yarn_margin")
    failures = _ruler_failures(g, trained, points, counted)
    ok = not errors and not failures
    parts = []
    for task, by in past.items():
        if task == "vt" and vt_inside == 0.0:
            parts.append(VT_NOT_MEASURABLE)
            continue
        parts.append(f"{task} " + " / ".join(f"{m} {'-' if v is None else f'{v:.2f}'}" for m, v in by.items()))
    summary = f"past {trained} (mean score): " + "; ".join(parts)
    if score_min is None and margin is None:
        summary += " (no thresholds set: measured only)"
    checks += [f["text"].split(": ", 1)[1] for f in failures]
    if checks:
        summary += "; " + "; ".join(checks)
    metrics = {"model": model_label(g), "trained": trained, "methods": methods, "tasks": tasks, "contexts": contexts,
               "chunk": chunk, "local": local, "dca_args": [str(a) for a in opt(g, "dca_args")], "past_trained": past,
               "score_min": score_min, "yarn_margin": margin, "vt_inside": vt_inside,
               "vt_measurable": None if vt_inside is None else vt_inside > 0.0, "samples": records}
    return GateResult(g.name, g.kind, ok, summary, metrics, points, failures=failures)
