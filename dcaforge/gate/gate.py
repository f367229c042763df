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
import math
import os
import re
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dcaforge import guard, ruler
from dcaforge.build.build import baseline_path
from dcaforge.config import Config
from dcaforge.configsections import GateConfig
from dcaforge.errors import GateError
from dcaforge.gate.plot import plot
from dcaforge.gate.server import HttpError, LlamaServer
from dcaforge.git import run
from dcaforge.room.cleanroom import Room, write_atomic

DEFAULTS: dict[str, dict[str, Any]] = {
    "off-identity": {"n_tokens": 400, "flash_attn": [True, False], "threads": 2},
    "noop-below-chunk": {"chunk": 192, "local": 32, "tolerance": 1e-3, "flash_attn": [True, False], "threads": 2},
    "extension": {"chunk": 0, "local": 0, "dca_args": [], "extra_args": [], "ppl_ratio_max": 1.15,
                  "passkey_trials": 3, "threads": 2, "methods": ["plain", "dca"], "yarn_factor": 0.0},
    "ruler": {"tasks": ["vt", "niah_multikey", "niah_multivalue"], "scales": [1, 4, 8], "methods": ["plain", "yarn", "dca"],
              "samples": 4, "seed": 42, "vt_probe": True, "chunk": 0, "local": 0, "dca_args": [], "extra_args": [], "yarn_factor": 0.0,
              "n_predict": 0, "fewshot": True, "chat": False, "send": "tokens", "threads": 2,
              "load_timeout": 600.0, "request_timeout": 3600.0},
}

#: Runs of llama-perplexity / llama-passkey whose output lost its tail are run again this many times.
RETRIES = 8


@dataclass
class GateResult:
    name: str
    kind: str
    passed: bool
    summary: str
    metrics: dict[str, Any] = field(default_factory=dict)
    points: list[dict[str, Any]] = field(default_factory=list)  # extension: one row per context
    seconds: float = 0.0
    #: the cells that failed a threshold: gate, task, ctx, method, score, threshold, rule and a line that says it
    failures: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class GateReport:
    results: list[GateResult]
    out_dir: Path
    json_path: Path
    plot_path: Path | None

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "gates": [asdict(r) for r in self.results],
                "plot": str(self.plot_path) if self.plot_path else None}


@dataclass
class GateHooks:
    on_gate: Callable[[GateConfig], None] | None = None
    on_step: Callable[[str], None] | None = None


# --- small readers ---------------------------------------------------------------------------

_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def gguf_metadata(path: Path, keys: Sequence[str] = ()) -> dict[str, Any]:
    """The scalar and string key/values of a GGUF file's header, or only ``keys``; of an array only its length,
    as ``<key>#count``."""
    want = set(keys)
    out: dict[str, Any] = {}
    with open(path, "rb") as fh:
        if fh.read(4) != b"GGUF":
            raise GateError(f"{path} is not a GGUF file", where=str(path))
        version, _n_tensors, n_kv = struct.unpack("<IQQ", fh.read(20))
        if version < 2:
            raise GateError(f"{path}: GGUF version {version} is too old", where=str(path))

        def rstr() -> str:
            (n,) = struct.unpack("<Q", fh.read(8))
            return fh.read(n).decode("utf-8", "replace")

        def rval(t: int) -> Any:
            if t in _GGUF_SCALARS:
                fmt = _GGUF_SCALARS[t]
                return struct.unpack(fmt, fh.read(struct.calcsize(fmt)))[0]
            if t == 8:
                return rstr()
            if t == 9:
                (et,) = struct.unpack("<I", fh.read(4))
                (n,) = struct.unpack("<Q", fh.read(8))
                if et in _GGUF_SCALARS:
                    fh.seek(struct.calcsize(_GGUF_SCALARS[et]) * n, os.SEEK_CUR)
                else:
                    for _ in range(n):
                        rval(et)
                return _ArrayLen(n)
            raise GateError(f"{path}: unknown GGUF value type {t}", where=str(path))

        for _ in range(n_kv):
            key = rstr()
            (t,) = struct.unpack("<I", fh.read(4))
            value = rval(t)
            if isinstance(value, _ArrayLen):
                key, value = f"{key}#count", int(value)
            if not want or key in want:
                out[key] = value
    return out


class _ArrayLen(int):
    """An array's length in gguf_metadata: the array itself is skipped, its length kept as "<key>#count"."""


_PPL = re.compile(r"Final estimate: PPL = ([0-9.]+|nan|inf)")
_PASSKEY = re.compile(r"passkey = (\d+)")
_SUFFIX = "What is the pass key? The pass key is"
_PROMPT_TOKENS = re.compile(r"prompt tokens: (\d+)")
_PREFIX_TOKENS = re.compile(r"prefix tokens: (\d+)")


def parse_perplexity(text: str) -> float | None:
    """``Final estimate: PPL = 12.3456 +/- ...`` of llama-perplexity."""
    m = _PPL.search(text)
    return float(m.group(1)) if m else None


#: the largest --kl-divergence-base file the extension gate writes to recover a perplexity its logger lost
LOGITS_FILE_MAX = 256 << 20


def perplexity_from_logits(path: Path) -> float | None:
    """The perplexity of a llama-perplexity run from its ``--kl-divergence-base`` file (tools/perplexity: "_logits_",
    int32 n_ctx, n_vocab, n_chunk, the tokens, then per chunk the second half of its window: per scored token two F32
    (scale, min log-prob) and n_vocab uint16 levels, nv = 2*ceil(n_vocab/2) + 4 uint16 in all); log p of the next
    token = min log-prob + scale * level. None when the file is short or malformed."""
    import numpy as np

    try:
        data = path.read_bytes()
    except OSError:
        return None
    if len(data) < 20 or data[:8] != b"_logits_":
        return None
    n_ctx, n_vocab, n_chunk = struct.unpack_from("<iii", data, 8)
    if n_ctx < 2 or n_vocab < 1 or n_chunk < 1:
        return None
    off = 20
    tokens = np.frombuffer(data, dtype="<i4", count=n_ctx*n_chunk, offset=off) if len(data) >= off + 4*n_ctx*n_chunk else None
    if tokens is None:
        return None
    off += 4*n_ctx*n_chunk
    nv = 2*((n_vocab + 1)//2) + 4
    first = n_ctx//2
    n_tok = n_ctx - 1 - first
    rows = (len(data) - off)//(2*nv)
    if n_tok <= 0 or rows < n_tok or rows % n_tok:
        return None
    lp = np.frombuffer(data, dtype="<u2", count=rows*nv, offset=off).reshape(rows, nv)
    scale_min = lp[:, :4].copy().view("<f4")           # [rows, 2]: scale, min log-prob
    nll = 0.0
    for r in range(rows):
        chunk, i = divmod(r, n_tok)
        tok = int(tokens[chunk*n_ctx + first + i + 1])
        if not 0 <= tok < n_vocab:
            return None
        nll -= float(scale_min[r, 1]) + float(scale_min[r, 0])*float(lp[r, 4 + tok])
    return math.exp(nll/rows)


def parse_passkey(text: str) -> tuple[int | None, int | None]:
    """(the passkey hidden, the first number answered after the question) from llama-passkey."""
    m = _PASSKEY.search(text)
    key = int(m.group(1)) if m else None
    i = text.rfind(_SUFFIX)
    answer = None
    if i >= 0:
        a = re.search(r"\d+", text[i + len(_SUFFIX):i + len(_SUFFIX) + 200])
        answer = int(a.group(0)) if a else None
    return key, answer


# --- running ---------------------------------------------------------------------------------

class _Ctx:
    """What the gates share: folders, builds, the log of every command."""

    def __init__(self, cfg: Config, hooks: GateHooks) -> None:
        self.cfg, self.hooks = cfg, hooks
        self.out = cfg.workspace / f"{cfg.name}-gates"
        self.logs = self.out / "logs"
        self.last_rc = 0  # the exit status of the last run()
        self.models = self.out / "models"
        # dcaforge's own folders: never a symlink out (the old logs are deleted, models written there)
        for folder, what in ((self.out, "the gates' output folder"), (self.logs, "the gates' log folder"),
                             (self.models, "the gates' model folder")):
            guard.own_folder(folder, what, hint=f"move it away: dcaforge makes {what} itself, in the workspace "
                                                "(<workspace>/<name>-gates); then run the same `dcaforge gate` again")
        if self.logs.is_dir():  # this run's logs only (a link is removed as a link)
            for old in self.logs.glob("*.log"):
                old.unlink()
        self.logs.mkdir(parents=True, exist_ok=True)
        self.room = Room.of(cfg)
        self.feature_tree = self.room.path
        self.feature_build = self.room.path / cfg.build.cmake.dir
        self.base_tree = baseline_path(cfg)
        self.base_build = self.base_tree / cfg.build.cmake.dir
        self.n = 0
        self.m = 0

    def step(self, msg: str) -> None:
        if self.hooks.on_step:
            self.hooks.on_step(msg)

    def run(self, argv: Sequence[str | os.PathLike[str]], what: str, *, check: bool = True) -> str:
        args = [os.fspath(a) for a in argv]
        res = run(args, self.cfg.root, check=False)
        text = res.stdout + res.stderr
        log = self.log_path(what)
        log.write_text(f"$ {' '.join(args)}\n# exit {res.returncode}\n{text}")
        self.last_rc = res.returncode
        if check and not res.ok:
            tail = "\n".join(text.strip().splitlines()[-12:])
            raise GateError(f"{what} failed (exit {res.returncode})", where=f"log: {log}", details=tail)
        return text

    def binary(self, build: Path, name: str, variant: str) -> Path:
        exe = build / "bin" / name
        if not exe.is_file():
            flag = " --baseline" if variant == "baseline" else ""
            raise GateError(f"{exe} is missing: the {variant} build has no {name}", where=str(build),
                            hint=f'`dcaforge build{flag} --targets "llama llama-perplexity llama-passkey"`')
        return exe

    def dumper(self, variant: str) -> Path:
        """dca_logits (package data of dcaforge.gate.gatetools) compiled against the build's static libraries, cached."""
        from dcaforge.gate.gatetools import build_logits

        tree, build = ((self.feature_tree, self.feature_build) if variant == "feature"
                       else (self.base_tree, self.base_build))
        if not (build / "src" / "libllama.a").exists() and not list(build.glob("**/libllama.a")):
            flag = " --baseline" if variant == "baseline" else ""
            raise GateError(f"no libllama.a in the {variant} build {build}", where=str(build),
                            hint=f"`dcaforge build{flag} --targets llama` (static libraries: BUILD_SHARED_LIBS=OFF)")
        self.step(f"compile dca_logits against the {variant} build")
        try:
            exe = build_logits.build(tree, build, variant == "feature")
        except (OSError, RuntimeError) as exc:
            raise GateError(f"dca_logits does not compile against the {variant} build", where=str(build),
                            details=str(exc)[-3000:]) from None
        self.log_path(f"dca_logits-{variant}").write_text(f"{build_logits.SRC} against {build}:\n{exe}\n")
        return Path(exe)

    def server(self) -> Path:
        """The clean room's llama-server, built first (as ``dcaforge build --targets llama-server``) when missing."""
        exe = self.feature_build / "bin" / "llama-server"
        if not exe.is_file():
            from dcaforge.build.build import BuildHooks, build

            self.step("build llama-server (dcaforge build --targets llama-server)")
            build(self.cfg, targets=["llama-server"],
                  hooks=BuildHooks(on_step=lambda what, argv: self.step(f"  {what}: {' '.join(argv[:3])} ...")))
        if not exe.is_file():
            raise GateError(f"{exe} is missing after the build", where=str(self.feature_build),
                            hint="`dcaforge build --targets llama-server` (the configure needs LLAMA_BUILD_SERVER=ON, "
                                 "dcaforge's default)")
        return exe

    def log_path(self, what: str) -> Path:
        """A new file in the logs folder, numbered in the order of the run."""
        self.n += 1
        return self.logs / f"{self.n:03d}-{re.sub(r'[^A-Za-z0-9._-]+', '_', what)[:60]}.log"

    def model(self, g: GateConfig) -> Path:
        if g.model is not None:
            if not g.model.is_file():
                raise GateError(f"gate {g.name!r}: model {g.model} does not exist", where=g.where)
            return g.model
        assert g.recipe is not None
        from dcaforge.gate.gatetools import tiny

        _, arch, *rest = g.recipe.split(":")
        variant = rest[0] if rest else "normal"
        if arch not in tiny.ARCHS or variant not in tiny.VARIANTS:
            raise GateError(f"gate {g.name!r}: no recipe {g.recipe}", where=g.where,
                            hint=f"tiny:<arch>[:<variant>], arch one of {', '.join(tiny.ARCHS)}, "
                                 f"variant one of {', '.join(tiny.VARIANTS)}")
        path = Path(tiny.model_path(str(self.models), arch, variant))
        if not path.is_file():
            self.step(f"write the tiny model {g.recipe}")
            tiny.ensure(str(self.models), arch, variant)
        return path

    def logits(self, exe: Path, model: Path, n_tokens: int, fa: bool, threads: int, dca: str | None,
               chunk: int = 0, local: int = 0) -> tuple[bytes, int]:
        """(raw f32 logits, n_vocab) from dca_logits."""
        self.m += 1
        out = self.out / "logits" / f"{self.m:03d}.f32"
        out.parent.mkdir(parents=True, exist_ok=True)
        argv: list[str | os.PathLike[str]] = [exe, "-m", model, "-o", out, "--seed", "7", "--n-tokens", str(n_tokens),
                                              "-c", str(n_tokens), "-b", str(n_tokens), "-ub", "64",
                                              "-fa", "on" if fa else "off", "-t", str(threads)]
        if dca is not None:
            argv += ["--dca", dca]
            if dca == "on":
                argv += ["--dca-chunk-size", str(chunk), "--dca-local-size", str(local)]
        text = self.run(argv, f"logits-{exe.name[:20]}-{dca}-fa{int(fa)}")
        info: dict[str, Any] = next((json.loads(line) for line in text.splitlines() if line.startswith('{"n_tokens"')), {})
        data = out.read_bytes()
        out.unlink()
        return data, int(info.get("n_vocab") or len(data) // 4 // n_tokens)


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


def _opt(g: GateConfig, key: str) -> Any:
    return g.options.get(key, DEFAULTS[g.kind].get(key))


def gate_off_identity(c: _Ctx, g: GateConfig) -> GateResult:
    model = c.model(g)
    patched, base = c.dumper("feature"), c.dumper("baseline")
    n, threads = int(_opt(g, "n_tokens")), int(_opt(g, "threads"))
    metrics: dict[str, Any] = {"n_tokens": n}
    ok = True
    for fa in _opt(g, "flash_attn"):
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
    return GateResult(g.name, g.kind, ok, summary + f" ({n} tokens, fa {'/'.join('on' if f else 'off' for f in _opt(g, 'flash_attn'))})",
                      metrics)


def gate_noop(c: _Ctx, g: GateConfig) -> GateResult:
    model = c.model(g)
    chunk, local = int(_opt(g, "chunk")), int(_opt(g, "local"))
    cmax = chunk - local
    n = int(g.options.get("n_tokens", cmax))
    if n > cmax:
        raise GateError(f"gate {g.name!r}: n_tokens {n} is not below c = chunk - local = {cmax}", where=g.where)
    tol, threads = float(_opt(g, "tolerance")), int(_opt(g, "threads"))
    exe = c.dumper("feature")
    metrics: dict[str, Any] = {"n_tokens": n, "chunk": chunk, "local": local, "tolerance": tol}
    ok = True
    worst = 0.0
    for fa in _opt(g, "flash_attn"):
        c.step(f"{g.name}: logits, fa {'on' if fa else 'off'}: DCA on vs off, {n} tokens < c = {cmax}")
        on, vocab = c.logits(exe, model, n, bool(fa), threads, "on", chunk, local)
        off, _ = c.logits(exe, model, n, bool(fa), threads, "off")
        err = max(_rel_err_per_row(on, off, vocab))
        metrics[f"fa_{'on' if fa else 'off'}"] = {"max_rel_err": err}
        worst = max(worst, err)
        ok = ok and err <= tol and not math.isnan(err)
    return GateResult(g.name, g.kind, ok, f"max rel err {worst:.3g} (tolerance {tol:g}) below c = {cmax}", metrics)


def ppl_output_lost(out: str, value: float | None, rc: int) -> bool:
    """True when a llama-perplexity run exited 0 without a figure and without saying why: its logger lost the
    output's tail (the loss can begin before the "perplexity: calculating" line: CI, 2026-12-02), so it is run again.
    A failed run (exit != 0) and a text too short for the context ("you need at least N tokens") are not."""
    return value is None and rc == 0 and "you need at least" not in out


def gate_extension(c: _Ctx, g: GateConfig) -> GateResult:
    model = c.model(g)
    text = g.options.get("text")
    if text is None or not Path(text).is_file():
        raise GateError(f"gate {g.name!r} needs 'text:', an existing text file for llama-perplexity", where=g.where)
    meta = gguf_metadata(model)
    arch = str(meta.get("general.architecture", ""))
    trained = int(g.options.get("trained") or meta.get(f"{arch}.context_length", 0))
    if trained <= 0:
        raise GateError(f"gate {g.name!r}: the model has no {arch}.context_length; set 'trained:'", where=g.where)
    contexts = sorted({int(x) for x in g.options.get("contexts", [trained, 2 * trained, 4 * trained, 8 * trained])})
    if trained not in contexts:
        contexts.insert(0, trained)
    threads = int(_opt(g, "threads"))
    chunk, local = int(_opt(g, "chunk")), int(_opt(g, "local"))
    methods = _methods(g)
    if "plain" not in methods or "dca" not in methods:
        raise GateError(f"gate {g.name!r}: 'methods:' must include plain and dca (the gate compares them)", where=g.where)
    extra = [str(a) for a in _opt(g, "extra_args")]
    ppl_exe = c.binary(c.feature_build, "llama-perplexity", "feature")
    pk_exe = c.binary(c.feature_build, "llama-passkey", "feature")
    trials = int(_opt(g, "passkey_trials"))

    def flags(method: str, ctx: int) -> list[str]:
        return method_flags(method, ctx, trained, chunk, local, [str(a) for a in _opt(g, "dca_args")],
                            float(_opt(g, "yarn_factor")))

    n_vocab = int(meta.get("tokenizer.ggml.tokens#count") or 0)  # sizes the --kl-divergence-base fallback of ppl()

    def ppl(ctx: int, method: str) -> float | None:
        c.step(f"{g.name}: perplexity {METHOD_LABEL[method]} at {ctx}")
        argv: list[str | os.PathLike[str]] = [ppl_exe, "-m", model, "-f", text, "-c", str(ctx), "-b", str(min(ctx, 2048)), "--chunks", "1",
                "-t", str(threads), *extra, *flags(method, ctx)]
        # llama.cpp's common logger is leaked at exit and the tools do not call common_log_flush()
        # (common/log.cpp, ggml-org/llama.cpp#22142), so the tail of the output (the "[1]..." and
        # "Final estimate" lines) is now and then lost, exit status 0: in 1 of 2 to 20 runs on the
        # loaded 2-core machine, baseline and patched builds alike. Run again, at most RETRIES times.
        # Under load the loss can become the rule (CI, 2026-12-02: 8 runs of 8 lost), so after two lost tails a model
        # whose scored log-probabilities fit LOGITS_FILE_MAX bytes runs once more with --kl-divergence-base, which the
        # tool's main thread writes (not its logger): the perplexity comes from that file (perplexity_from_logits).
        for attempt in range(RETRIES):
            name = f"ppl-{method}-{ctx}" + (f"-retry{attempt}" if attempt else "")
            if attempt == 2 and 0 < n_vocab and (ctx // 2)*(n_vocab + 6)*2 <= LOGITS_FILE_MAX:
                lf = c.logs / f"{name}-logits.bin"
                out = c.run([*argv, "--kl-divergence-base", lf], name, check=False)
                try:
                    value = parse_perplexity(out) or (perplexity_from_logits(lf) if c.last_rc == 0 else None)
                finally:
                    lf.unlink(missing_ok=True)
                return value
            out = c.run(argv, name, check=False)
            value = parse_perplexity(out)
            if not ppl_output_lost(out, value, c.last_rc):
                return value
        return None

    per_junk, prefix = 0.0, 0
    if trials > 0:
        # how many tokens a junk sentence takes: 5 junk + the passkey sentence, in a context made big enough
        c.step(f"{g.name}: passkey calibration")
        out = c.run([pk_exe, "-m", model, "--junk", "5", "--pos", "0", "-t", str(threads), *extra,
                     "--override-kv", f"{arch}.context_length=int:{max(trained, 8192)}"], "passkey-calibrate")
        pt, pf = _PROMPT_TOKENS.search(out), _PREFIX_TOKENS.search(out)
        if not pt or not pf:
            raise GateError("llama-passkey did not print its prompt size", where=str(c.logs))
        prefix = int(pf.group(1))
        per_junk = (int(pt.group(1)) - prefix) / 6.0

    def passkey(ctx: int, method: str) -> float | None:
        junk = int((ctx - prefix - 40) / per_junk) - 1
        if junk < 2:
            return None  # the prompt alone does not fit this context
        hits = 0
        for k in range(trials):
            pos = int((k + 0.5) * junk / trials)
            c.step(f"{g.name}: passkey {METHOD_LABEL[method]} at {ctx} (pos {pos}/{junk})")
            argv: list[str | os.PathLike[str]] = [pk_exe, "-m", model, "--junk", str(junk), "--pos", str(pos), "-t", str(threads), *extra,
                                                  *flags(method, ctx)]
            if method == "dca":
                argv += ["-c", str(ctx + 64)]
            elif ctx > trained:  # llama-passkey sizes its context from the trained length
                argv += ["--override-kv", f"{arch}.context_length=int:{ctx + 64}"]
            for attempt in range(RETRIES):  # see ppl(): a lost output tail is run again
                out = c.run(argv, f"passkey-{method}-{ctx}-{k}"
                            + (f"-retry{attempt}" if attempt else ""), check=False)
                key, answer = parse_passkey(out)
                if key is not None and "decoded" in out:  # the run's last line ("decoded N tokens in ...") is there
                    break
            hits += int(key is not None and key == answer)
        return hits / trials

    points = []
    for ctx in contexts:
        row: dict[str, Any] = {"ctx": ctx}
        for m in methods:
            row[f"ppl_{m}"] = ppl(ctx, m)
        if trials > 0:
            for m in methods:
                row[f"passkey_{m}"] = passkey(ctx, m)
        points.append(row)

    base = points[contexts.index(trained)]["ppl_plain"]
    if base is None:
        raise GateError(f"gate {g.name!r}: llama-perplexity gave no result at the trained context {trained}",
                        where=str(c.logs), hint="is the text long enough (2 x the context in tokens)?")
    ratio_max = float(_opt(g, "ppl_ratio_max"))
    failures: list[dict[str, Any]] = []

    def fail(task: str, ctx: int | None, method: str, score: float | None, threshold: float | None, rule: str,
             text: str) -> None:
        failures.append({"gate": g.name, "task": task, "ctx": ctx, "method": method, "score": score,
                         "threshold": threshold, "rule": rule, "text": f"{g.name}: {text}"})

    longer = [p for p in points if p["ctx"] > trained]
    for p in longer:
        v = p["ppl_dca"]
        if v is None or v > ratio_max * base:
            fail("perplexity", p["ctx"], "dca", v, ratio_max * base, "ppl_ratio_max",
                 f"perplexity at {p['ctx']} tokens: DCA {'no result' if v is None else f'{v:.4g}'} > ppl_ratio_max {ratio_max:g} "
                 f"x {base:.4g} (plain at {trained})")
    plain_min = g.options.get("plain_ratio_min")
    if plain_min is not None and longer:
        v = longer[-1]["ppl_plain"]
        if v is not None and v < float(plain_min) * base:
            fail("perplexity", longer[-1]["ctx"], "plain", v, float(plain_min) * base, "plain_ratio_min",
                 f"perplexity at {longer[-1]['ctx']} tokens: plain {v:.4g} < plain_ratio_min {float(plain_min):g} x "
                 f"{base:.4g} (the test is not hard enough)")
    pk_min = g.options.get("passkey_min")
    acc = None
    if trials > 0 and longer:
        accs = [p["passkey_dca"] for p in longer if p["passkey_dca"] is not None]
        acc = sum(accs) / len(accs) if accs else None
    if pk_min is not None:
        if acc is None:
            fail("passkey", None, "dca", None, float(pk_min), "passkey_min",
                 "passkey: no measurement past the trained context (passkey_trials 0, or the prompt does not fit)")
        for p in longer:
            v = p.get("passkey_dca")
            if v is not None and v < float(pk_min):
                fail("passkey", p["ctx"], "dca", v, float(pk_min), "passkey_min",
                     f"passkey at {p['ctx']} tokens: DCA {v:.2f} < passkey_min {float(pk_min):g}")
    ok = not failures
    checks = [f["text"].split(": ", 1)[1] for f in failures]
    worst = max((p["ppl_dca"] or math.inf) for p in longer) if longer else None
    summary = (f"trained {trained}: plain ppl {base:.4g}; DCA worst {worst:.4g} up to {contexts[-1]}"
               if worst is not None else f"trained {trained}: plain ppl {base:.4g}")
    if acc is not None:
        summary += f"; DCA passkey {acc:.0%}"
    if checks:
        summary += "; " + "; ".join(checks)
    metrics = {"model": _model_label(g), "methods": methods, "trained": trained, "ppl_trained": base,
               "ppl_ratio_max": ratio_max, "plain_ratio_min": plain_min,
               "passkey_min": pk_min, "passkey_dca_past_trained": acc}
    return GateResult(g.name, g.kind, ok, summary, metrics, points, failures=failures)


# --- methods shared by extension and ruler ----------------------------------------------------

METHODS = ("plain", "yarn", "dca")
METHOD_LABEL = {"plain": "plain rope", "yarn": "YaRN", "dca": "DCA"}


def _methods(g: GateConfig) -> list[str]:
    methods = [str(m) for m in _opt(g, "methods")]
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods or len(set(methods)) != len(methods):
        raise GateError(f"gate {g.name!r}: 'methods:' must list some of {', '.join(METHODS)} once each, got {methods}",
                        where=g.where)
    return methods


def _model_label(g: GateConfig) -> str:
    return g.model.name if g.model is not None else str(g.recipe)


def method_flags(method: str, ctx: int, trained: int, chunk: int, local: int, dca_args: Sequence[str] = (),
                 yarn_factor: float = 0.0) -> list[str]:
    """The llama.cpp options of a method at a context: plain rope (none); YaRN with the factor
    ``ctx / trained`` (or ``yarn_factor``) and the trained length as its original context; DCA with
    the chunk size and local window (0 lets llama.cpp take 1/2 and 1/8 of the trained length)."""
    if method == "plain":
        return []
    if method == "yarn":
        factor = yarn_factor if yarn_factor > 0 else max(1.0, ctx / trained)
        return ["--rope-scaling", "yarn", "--rope-scale", f"{factor:g}", "--yarn-orig-ctx", str(trained)]
    if method == "dca":
        return ["--dca", "on", "--dca-chunk-size", str(chunk), "--dca-local-size", str(local), *dca_args]
    raise ValueError(method)


def _trained(g: GateConfig, model: Path) -> tuple[str, int]:
    meta = gguf_metadata(model)
    arch = str(meta.get("general.architecture", ""))
    trained = int(g.options.get("trained") or meta.get(f"{arch}.context_length", 0))
    if trained <= 0:
        raise GateError(f"gate {g.name!r}: the model has no {arch}.context_length; set 'trained:'", where=g.where)
    return arch, trained


# --- ruler: RULER's vt / niah (and passkey) through llama-server --------------------------------

def _ruler_contexts(g: GateConfig, trained: int) -> list[int]:
    if "contexts" in g.options:
        ctxs = [int(x) for x in g.options["contexts"]]
    else:
        ctxs = [int(round(float(s) * trained)) for s in _opt(g, "scales")]
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


def gate_ruler(c: _Ctx, g: GateConfig) -> GateResult:
    """RULER tasks served by the clean room's llama-server (see :func:`measure_ruler`)."""
    model = c.model(g)
    return measure_ruler(c.server(), model, g, c.log_path, c.step)


def measure_ruler(exe: Path, model: Path, g: GateConfig, log_path: Callable[[str], Path],
                  step: Callable[[str], None]) -> GateResult:
    """RULER tasks served by ``exe`` (llama-server) on ``model``: one server per (context, method),
    the same prompts to every method at a context, exact-match scores per task, context and method;
    with an NVIDIA GPU, each server's peak GPU memory (nvidia-smi, sampled)."""
    arch, trained = _trained(g, model)
    contexts = _ruler_contexts(g, trained)
    methods = _methods(g)
    tasks = [str(t) for t in _opt(g, "tasks")]
    bad = [t for t in tasks if t not in ruler.TASKS]
    if bad or not tasks:
        raise GateError(f"gate {g.name!r}: unknown task(s) {bad or tasks}", where=g.where, hint=f"tasks: {', '.join(ruler.TASKS)}")
    samples, seed = int(_opt(g, "samples")), int(_opt(g, "seed"))
    if samples < 1:
        raise GateError(f"gate {g.name!r}: 'samples:' must be at least 1", where=g.where)
    threads, n_predict = int(_opt(g, "threads")), int(_opt(g, "n_predict"))
    chunk = int(_opt(g, "chunk")) or trained // 2  # explicit: past L the server runs with an overridden trained length
    local = int(_opt(g, "local")) or trained // 8
    fewshot, chat, send = bool(_opt(g, "fewshot")), bool(_opt(g, "chat")), str(_opt(g, "send"))
    if send not in ("tokens", "text"):
        raise GateError(f"gate {g.name!r}: 'send:' must be tokens or text, got {send!r}", where=g.where)
    extra = [str(a) for a in _opt(g, "extra_args")]

    # (task, ctx, index) -> (sample, prompt text, its tokens) or None when it does not fit; built by the
    # first server at a context (the tokenizer is the model's, whatever the method) and sent to every method
    prompts: dict[tuple[str, int, int], tuple[ruler.Sample, str, list[int]] | None] = {}
    records: list[dict[str, Any]] = []
    servers: list[dict[str, Any]] = []  # per server: load time, peak GPU memory
    wrap: tuple[str, str] | None = None

    def build(srv: LlamaServer, task: str, ctx: int, i: int, budget: int) -> tuple[ruler.Sample, str, list[int]] | None:
        nonlocal wrap
        if chat and wrap is None:  # the chat template around one user turn, split at a marker
            mark = "\u2063DCAFORGE\u2063"
            templated = srv.apply_template(mark)
            if templated.count(mark) != 1:
                raise GateError(f"gate {g.name!r}: the model's chat template does not keep the user's text as it is",
                                where=str(model), details=templated[:500], hint="set 'chat: false'")
            pre, _, post = templated.partition(mark)
            wrap = (pre, post)
        seen: dict[int, tuple[ruler.Sample, str, list[int]]] = {}

        def measure(n: int) -> int:
            s = ruler.generate(task, seed, i, n, n_samples=samples, fewshot=fewshot)
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

    jobs = ruler_jobs(contexts, methods, tasks, trained, bool(_opt(g, "vt_probe")))
    for ctx, method, probe in jobs:
        job_tasks = ruler_job_tasks(tasks, ctx, trained, probe, vt_inside_score(records, trained))
        if not job_tasks:
            continue
        args = ruler_server_args(model, method, ctx, trained, arch, chunk, local, [str(a) for a in _opt(g, "dca_args")],
                                 extra, threads=threads, yarn_factor=float(_opt(g, "yarn_factor")))
        step(f"{g.name}: llama-server {METHOD_LABEL[method]} at {ctx}" + (" (vt inside the trained window)" if probe else ""))
        server_error: str | None = None
        t_server = time.monotonic()
        srv = LlamaServer(exe, args, log_path(f"server-{method}-{ctx}"), load_timeout=float(_opt(g, "load_timeout")),
                          request_timeout=float(_opt(g, "request_timeout")))
        servers.append({"ctx": ctx, "method": method})
        try:
            srv.start()
            servers[-1]["load_seconds"] = round(time.monotonic() - t_server, 2)
        except GateError as exc:  # e.g. out of memory at this context: recorded, and the next server tries
            server_error = f"llama-server did not start: {exc.message}"
            step(f"  {server_error}")
        try:
            for task in job_tasks:
                npred = n_predict or ruler.N_PREDICT[task]
                for i in range(samples):
                    rec: dict[str, Any] = {"task": task, "ctx": ctx, "method": method, "index": i, "score": None}
                    records.append(rec)
                    if server_error is not None:
                        rec["error"] = server_error
                        continue
                    try:
                        key = (task, ctx, i)
                        if key not in prompts:
                            t_fit = time.monotonic()
                            prompts[key] = build(srv, task, ctx, i, ctx - npred)
                            rec["fit_seconds"] = round(time.monotonic() - t_fit, 3)
                        built = prompts[key]
                        if built is None:
                            rec["error"] = "does not fit"
                            continue
                        sample, text, toks = built
                        rec.update(ruler_prompt_fields(sample, text, toks))
                        t0 = time.monotonic()
                        reply = srv.completion(toks if send == "tokens" else text, npred)
                        answer = str(reply.get("content", ""))
                        tm = reply.get("timings") or {}
                        rec.update({**ruler_answer_fields(sample, answer), "seconds": round(time.monotonic() - t0, 3),
                                    "tokens_evaluated": reply.get("tokens_evaluated"),
                                    "prompt_per_second": tm.get("prompt_per_second"),
                                    "predicted_per_second": tm.get("predicted_per_second")})
                        step(f"  {task} #{i}: {len(toks)} tokens, score {rec['score']:.2f}")
                    except HttpError as exc:
                        rec["error"] = str(exc)[:300]
                    except GateError as exc:  # the server died: the rest of this server's samples too
                        server_error = exc.message
                        rec["error"] = exc.message
        finally:
            srv.stop()
        servers[-1].update(srv.gpu or {})
    contexts_run = sorted({ctx for ctx, _, _ in jobs})
    res = ruler_result(g, trained, contexts_run, methods, tasks, records, chunk, local)
    res.metrics["servers"] = servers
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


def ruler_result(g: GateConfig, trained: int, contexts: list[int], methods: list[str], tasks: list[str],
                  records: list[dict[str, Any]], chunk: int, local: int) -> GateResult:
    """The points (a row per task and context that has samples), the thresholds checked per cell past the trained
    length (``score_min``: DCA's score; ``yarn_margin``: DCA's score minus YaRN's), and vt's inside-L check: plain's
    vt score at contexts <= L; 0 there makes vt "not measurable" and leaves it out of the thresholds."""
    if any(r["method"] == "plain" for r in records) and "plain" not in methods:
        methods = ["plain", *methods]   # the vt check inside L ran plain
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
    vt_inside = vt_inside_score(records, trained) if "vt" in tasks else None
    counted = [t for t in tasks if not (t == "vt" and vt_inside == 0.0)]
    errors = [r for r in records if r.get("error") and r["error"] != "does not fit"]
    checks: list[str] = []
    failures: list[dict[str, Any]] = []
    if errors:
        checks.append(f"{len(errors)} request(s) failed, e.g. {errors[0]['method']} at {errors[0]['ctx']}: {errors[0]['error'][:120]}")
    past: dict[str, dict[str, float | None]] = {}
    for task in tasks:
        past[task] = {m: _mean([p[m] for p in points if p["task"] == task and p["ctx"] > trained and p[m] is not None])
                      for m in methods}
    score_min, margin = g.options.get("score_min"), g.options.get("yarn_margin")

    def fail(task: str, ctx: int | None, score: float | None, threshold: float | None, rule: str, text: str) -> None:
        failures.append({"gate": g.name, "task": task, "ctx": ctx, "method": "dca", "score": score,
                         "threshold": threshold, "rule": rule, "text": f"{g.name}: {text}"})

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
    metrics = {"model": _model_label(g), "trained": trained, "methods": methods, "tasks": tasks, "contexts": contexts,
               "chunk": chunk, "local": local, "dca_args": [str(a) for a in _opt(g, "dca_args")], "past_trained": past,
               "score_min": score_min, "yarn_margin": margin, "vt_inside": vt_inside,
               "vt_measurable": None if vt_inside is None else vt_inside > 0.0, "samples": records}
    return GateResult(g.name, g.kind, ok, summary, metrics, points, failures=failures)


RUNNERS: dict[str, Callable[[_Ctx, GateConfig], GateResult]] = {
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
    c = _Ctx(cfg, hooks)
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
