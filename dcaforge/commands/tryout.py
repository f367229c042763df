"""``dcaforge try MODEL.gguf``: the built llama-server answers a prompt past the model's trained context, DCA on."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from dcaforge.commands.common import ConfigOpt, JsonOpt, call, err, load, out, print_json
from dcaforge.gate.tryout import try_model


def try_(
    model: Annotated[Path, typer.Argument(metavar="MODEL", help="MODEL.gguf: a GGUF model (llama.cpp's format)")],
    config: ConfigOpt = None,
    ctx: Annotated[int | None, typer.Option("--ctx", metavar="N", help="the context to serve at (default: 1/8 past "
                                            "the model's trained context, rounded up to 256)")] = None,
    prompt: Annotated[Path | None, typer.Option("--prompt-file", metavar="FILE", help="answer this text instead "
                                                "of a passkey prompt filled to the context")] = None,
    n_predict: Annotated[int, typer.Option("-n", "--n-predict", metavar="N", help="tokens to answer with")] = 16,
    threads: Annotated[int | None, typer.Option("-t", "--threads", metavar="N", help="llama-server's -t")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Serve MODEL.gguf with the clean room's llama-server past its trained context with --dca on (building
    llama-server first when it is missing) and answer one long prompt: by default RULER's passkey task filled
    to the context."""
    cfg = load(config)
    err.print(f"[bold]dcaforge try[/] {escape(str(model))}", markup=True)
    res = call(lambda: try_model(cfg, model, ctx=ctx, prompt_file=prompt, n_predict=n_predict, threads=threads,
                                 on_step=lambda s: err.print(f"  {s}", markup=False)),
               interrupted="stopped; the server was stopped too")
    if as_json:
        print_json("try", res)
        return
    out.print(f"model:     {res.model} ({res.arch}, trained context {res.trained})")
    out.print(f"served:    {shlex.join(res.argv)}")
    for line in res.dca_log or ["(no line of the server's log says DCA is on: is the context past the trained one?)"]:
        out.print(f"log:       {line}")
    out.print(f"prompt:    {res.prompt_tokens} tokens ({res.prompt_tokens / res.trained:.2f}x the trained context), "
              f"answered in {res.answer_seconds:.1f} s"
              + (f" ({res.timings['prompt_per_second']:.0f} prompt tokens/s)" if "prompt_per_second" in res.timings else ""))
    out.print(f"answer:    {res.answer.strip()!r}")
    if res.expected is not None:
        out.print(f"passkey:   {res.expected}: {'found in the answer' if res.found else 'NOT in the answer'}")
    out.print(f"server log: {res.log}")
