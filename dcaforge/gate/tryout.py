"""``dcaforge try MODEL.gguf``: the built llama-server answers one prompt longer than the model's trained context,
with Dual Chunk Attention on.

The clean room's ``llama-server`` (built first when missing, as ``dcaforge build --targets llama-server``) serves
the model at a context past its trained one (default: 1/8 more, rounded up to 256 tokens) with ``--dca on``; the
prompt is RULER's passkey task (a number hidden in filler text, asked for at the end) filled to the context under the
model's own tokenizer, or a text file of yours. The answer is the greedy continuation; the result says whether the
passkey is in it, and quotes the server's log line that says DCA serves past the trained context.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dcaforge import ruler
from dcaforge.config import Config
from dcaforge.errors import DcaforgeError, GateError
from dcaforge.gate.ggufmeta import gguf_metadata
from dcaforge.gate.server import LlamaServer
from dcaforge.room.cleanroom import Room

#: what the patched llama-server logs at its default verbosity when a slot extends past the trained context
#: with DCA on (its `-lv 4` log also has llama_dca_resolve's "DCA on: chunk size S = ..." line)
DCA_LOG = re.compile(r"Dual Chunk Attention: the slot context \(\d+\) extends past the training context[^\n]*|"
                     r"llama_dca_resolve: DCA on:[^\n]*")
PASSKEY_SEED = 7


@dataclass
class TryResult:
    model: Path
    server: Path
    argv: list[str]           # the server's command line
    log: Path                 # its output
    arch: str
    trained: int              # <arch>.context_length of the GGUF
    ctx: int                  # the context it was served at
    prompt_tokens: int
    answer: str
    expected: str | None      # the passkey (None for a prompt file)
    found: bool | None        # the passkey is in the answer (None for a prompt file)
    dca_log: list[str] = field(default_factory=list)  # the server's lines saying DCA is on
    load_seconds: float = 0.0
    answer_seconds: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)  # llama-server's own (prompt_per_second, ...)


def default_context(trained: int) -> int:
    """1/8 past the trained context, rounded up to a multiple of 256."""
    return -(-(trained + max(trained // 8, 1)) // 256) * 256


def try_model(cfg: Config, model: Path, *, ctx: int | None = None, prompt_file: Path | None = None,
              n_predict: int = 16, threads: int | None = None, extra_args: Sequence[str] = (),
              on_step: Callable[[str], None] | None = None) -> TryResult:
    step = on_step or (lambda _s: None)
    model = model.expanduser().absolute()
    if not model.is_file():
        raise DcaforgeError(f"no model file at {model}", where=str(model),
                            hint="pass a GGUF file, e.g. SmolLM2-135M-Instruct.Q4_1.gguf (the README says where to get it)")
    meta = gguf_metadata(model)
    arch = str(meta.get("general.architecture", ""))
    trained = int(meta.get(f"{arch}.context_length", 0) or 0)
    if not arch or trained <= 0:
        raise GateError(f"{model} names no architecture or {arch or '<arch>'}.context_length", where=str(model),
                        hint="pass a llama.cpp GGUF model")
    n_ctx = ctx or default_context(trained)
    if n_ctx < 64:
        raise DcaforgeError(f"--ctx {n_ctx} is too small for a prompt", hint="give a context past the trained one, e.g. "
                            f"--ctx {default_context(trained)}")
    room = Room.of(cfg)
    room.require()
    exe = cfg.room / cfg.build.cmake.dir / "bin" / "llama-server"
    if cfg.build.backend != "cmake":
        raise DcaforgeError("dcaforge try runs the cmake build's llama-server (build.backend: cmake)",
                            hint="serve the llamafile build's llama-server by hand with --dca on")
    if not exe.is_file():
        from dcaforge.builder.build import BuildHooks, build

        step("build llama-server (dcaforge build --targets llama-server)")
        build(cfg, targets=["llama-server"], hooks=BuildHooks(on_step=lambda what, argv: step(f"  {what}")))
    logs = room.meta / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"try-{time.strftime('%Y%m%d-%H%M%S')}.log"
    args = ["-m", str(model), "-c", str(n_ctx), "-np", "1", "--no-webui", "--dca", "on",
            *(["-t", str(threads)] if threads else []), *extra_args]
    step(f"serve {model.name} (trained context {trained}) at -c {n_ctx} with --dca on")
    t0 = time.monotonic()
    with LlamaServer(exe, args, log) as srv:
        loaded = time.monotonic() - t0
        budget = n_ctx - n_predict - 8
        expected: str | None = None
        if prompt_file is not None:
            text = prompt_file.read_text(encoding="utf-8", errors="replace")
            tokens = srv.tokenize(text)
            if len(tokens) > budget:
                raise DcaforgeError(f"{prompt_file} is {len(tokens)} tokens: more than the context {n_ctx} leaves "
                                    f"for the prompt ({budget})", where=str(prompt_file),
                                    hint=f"give a larger --ctx (at least {len(tokens) + n_predict + 8})")
        else:
            step(f"fill a passkey prompt to {budget} tokens")
            fitted = ruler.fit(lambda n: len(srv.tokenize(ruler.generate("passkey", PASSKEY_SEED, 0, n).prompt)), budget,
                               probe=1, slack=64)
            if fitted is None:
                raise DcaforgeError(f"the context {n_ctx} is too small for the passkey prompt", hint="give a larger --ctx")
            sample = ruler.generate("passkey", PASSKEY_SEED, 0, fitted[0])
            tokens = srv.tokenize(sample.prompt)
            expected = sample.expected[0]
        step(f"answer a {len(tokens)}-token prompt")
        t1 = time.monotonic()
        res = srv.completion(tokens, n_predict)
        answered = time.monotonic() - t1
        argv = list(srv.argv)
    answer = str(res.get("content", ""))
    text = log.read_text(encoding="utf-8", errors="replace")
    timings = {k: float(v) for k, v in (res.get("timings") or {}).items() if isinstance(v, (int, float))}
    return TryResult(model=model, server=exe, argv=argv, log=log, arch=arch, trained=trained, ctx=n_ctx,
                     prompt_tokens=len(tokens), answer=answer, expected=expected,
                     found=ruler.found(expected, answer) if expected is not None else None,
                     dca_log=[m.group(0).strip() for m in DCA_LOG.finditer(text)], load_seconds=loaded,
                     answer_seconds=answered, timings=timings)
