"""``dcaforge calibrate MODEL.gguf``: DCA's sizes measured on the model, written into a copy of its GGUF (see
:mod:`dcaforge.gate.calibrate`), with a progress bar on a terminal, a report, or JSON."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from dcaforge.commands.common import ConfigOpt, call, err, load, out
from dcaforge.errors import CalibrateError
from dcaforge.gate.calibrate import (
    DEFAULT_DEV_TRIALS,
    DEFAULT_FAR_HELDOUT_TRIALS,
    DEFAULT_FAR_TRIALS,
    DEFAULT_HELDOUT_TRIALS,
    DEFAULT_MAX_TOKENS,
    DEFAULT_SERVER_ARGS,
    Hooks,
    Options,
    Plan,
    Report,
    file_text,
    plan,
    preflight,
    python_source_text,
    room_dev_text,
    room_server,
)
from dcaforge.gate.calibrate import calibrate as do_calibrate


def _chunks(value: str) -> tuple[int, ...]:
    try:
        chunks = tuple(int(x) for x in value.replace(" ", "").split(",") if x)
    except ValueError:
        raise CalibrateError(f"--chunks {value!r}: give chunk sizes as numbers, e.g. --chunks 2048,4096") from None
    if any(c <= 0 for c in chunks):
        raise CalibrateError(f"--chunks {value!r}: chunk sizes must be positive")
    return chunks


def _split_args(value: str) -> tuple[str, ...]:
    try:
        return tuple(shlex.split(value))
    except ValueError as exc:
        raise CalibrateError(f"--server-args {value!r}: {exc}", hint="quote it as a shell would") from None


def calibrate(
    model: Annotated[Path, typer.Argument(help="the GGUF model to calibrate (only read)")],
    output: Annotated[Path | None, typer.Option("-o", "--output", help="the copy to write (default: MODEL with "
                                                ".dca.gguf for .gguf, beside it)")] = None,
    force: Annotated[bool, typer.Option("--force", help="replace the output when it exists")] = False,
    server: Annotated[Path | None, typer.Option("--server", help="a llama-server built with 0078-dca (default: the "
                                                "clean room's build)")] = None,
    perplexity: Annotated[Path | None, typer.Option("--perplexity", help="llama-perplexity for the dev perplexity "
                                                    "(default: beside llama-server, when there)")] = None,
    no_perplexity: Annotated[bool, typer.Option("--no-perplexity", help="choose on the answers alone")] = False,
    dev_text: Annotated[Path | None, typer.Option("--dev-text", help="the dev text (default: the clean room's "
                                                  "llama.cpp sources)")] = None,
    heldout_text: Annotated[Path | None, typer.Option("--heldout-text", help="the held-out text (default: this "
                                                      "Python's standard library, as source code)")] = None,
    chunks: Annotated[str, typer.Option("--chunks", help="the chunk sizes to try, e.g. 2048,4096 (default: L/16, "
                                        "L/8, L/4, L/2)")] = "",
    temperature: Annotated[bool, typer.Option("--temperature/--no-temperature", help="also try the attention "
                                              "temperature from the prompt's length (one candidate more: the chunk "
                                              "size nearest L/2); the copy's dual_chunk.temperature says whether the "
                                              "pick has it")] = True,
    far: Annotated[int, typer.Option("--far", help="the context you will serve, in tokens (e.g. 1048576): the dev "
                                     "rule's two best also answer dev trials at 0.95 x it and the one that finds more "
                                     "there is the pick; the pick is checked at it on held-out text (0: no far cell)")] = 0,
    far_trials: Annotated[int, typer.Option("--far-trials", help="dev trials per finalist at the far length")] = DEFAULT_FAR_TRIALS,
    far_heldout_trials: Annotated[int, typer.Option("--far-heldout-trials", help="held-out trials of the pick at the "
                                                    "far length")] = DEFAULT_FAR_HELDOUT_TRIALS,
    dev_trials: Annotated[int, typer.Option("--dev-trials", help="passkey trials per dev length and candidate")] = DEFAULT_DEV_TRIALS,
    heldout_trials: Annotated[int, typer.Option("--heldout-trials", help="passkey trials per held-out length, for "
                                                "the pick and for YaRN")] = DEFAULT_HELDOUT_TRIALS,
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="the longest prompt")] = DEFAULT_MAX_TOKENS,
    server_args: Annotated[str, typer.Option("--server-args", help="more options for llama-server and "
                                             "llama-perplexity")] = shlex.join(DEFAULT_SERVER_ARGS),
    work: Annotated[Path | None, typer.Option("--work", help="logs, trials, report and figure (default: OUTPUT "
                                              "without .gguf, plus .calibrate)")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="go on from the trials an earlier run of the same "
                                         "calibration recorded in the work folder (the same model, llama-server, "
                                         "--server-args and texts)")] = False,
    config: ConfigOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the report as JSON")] = False,
) -> None:
    """Sweep DCA's chunk size on the model's own dev split, check the pick on held-out trials beside YaRN, and write a
    copy of the GGUF with its dual_chunk sizes so that --dca on alone uses them."""
    cfg = load(config) if server is None or dev_text is None else None
    srv, ppl, server_from = _binaries(cfg, server, perplexity, no_perplexity)
    chosen = call(lambda: _chunks(chunks))
    extra = call(lambda: _split_args(server_args))
    info, _, _ = call(lambda: preflight(model, output, force, srv, server_from, work))   # refusals first, before the texts load
    call(lambda: plan(info, chunks=chosen, dev_trials=dev_trials, heldout_trials=heldout_trials, max_tokens=max_tokens,
                      temperature=temperature, far=far, far_trials=far_trials, far_heldout_trials=far_heldout_trials))

    def texts() -> tuple[Any, Any]:
        dev = file_text(dev_text, "dev text") if dev_text is not None else room_dev_text(cfg)  # type: ignore[arg-type]
        held = file_text(heldout_text, "held-out text") if heldout_text is not None else python_source_text()
        return dev, held

    dev, held = call(texts)
    opts = Options(model=model, server=srv, dev=dev, heldout=held, out=output, force=force, perplexity=ppl,
                   chunks=chosen, temperature=temperature, dev_trials=dev_trials, heldout_trials=heldout_trials, max_tokens=max_tokens,
                   server_args=extra, work=work, server_from=server_from, far=far, far_trials=far_trials,
                   far_heldout_trials=far_heldout_trials, resume=resume)
    bar, hooks = _progress()
    with bar:
        rep = call(lambda: do_calibrate(opts, hooks),
                   interrupted="calibration stopped; no GGUF was written (the trials so far are in the work folder's "
                               "trials.jsonl); run the same command with --resume to go on from them")
    if as_json:
        sys.stdout.write(json.dumps(rep.to_dict(), indent=2, sort_keys=True) + "\n")
        return
    print_report(rep)


def _binaries(cfg: Any, server: Path | None, perplexity: Path | None, no_perplexity: bool) -> tuple[Path, Path | None, str]:
    """(llama-server, llama-perplexity or None, where the server came from): ``--server`` or the clean room's build;
    ``--perplexity``, else the room's, else the one beside llama-server; none with ``--no-perplexity``."""
    ppl: Path | None = None
    server_from = "--server"
    if server is None:
        assert cfg is not None
        server, room_ppl = room_server(cfg)
        server_from = "the clean room's build"
        ppl = room_ppl
    if perplexity is not None:
        ppl = perplexity
    elif ppl is None:
        ppl = server.parent / "llama-perplexity"
    if no_perplexity:
        ppl = None
    return server, ppl, server_from


def _progress() -> tuple[Progress, Hooks]:
    """The progress bar on stderr (a terminal's; elsewhere a line a step) and the hooks that move it."""
    bar = Progress(SpinnerColumn(), TextColumn("{task.description:<42}", markup=False), BarColumn(bar_width=30),
                   MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.fields[last]}", markup=False),
                   console=err, transient=False, disable=not err.is_terminal)
    task = bar.add_task("checks", total=None, last="")

    def on_plan(p: Plan) -> None:
        bar.update(task, total=p.total_trials)
        line = (f"plan: L = {p.trained}; {len(p.candidates)} candidates ({', '.join(p.candidates)}); dev lengths "
                f"{', '.join(map(str, p.dev_lengths))} x {p.dev_trials} trials; held-out "
                f"{', '.join(map(str, p.heldout_lengths))} x {p.heldout_trials} trials (pick and YaRN); "
                + (f"far: the {p.finalists} best at {p.far_dev} x {p.far_trials} trials, the pick at {p.far_heldout} x "
                   f"{p.far_heldout_trials} held-out; " if p.far_dev else "")
                + f"{p.total_trials} trials, about {p.estimate_seconds / 60:.0f} min on one H100")
        err.print(line, markup=False)

    def on_step(msg: str) -> None:
        bar.update(task, description=msg[:42])
        if not err.is_terminal:
            err.print(f"  {msg}", markup=False)

    def on_trial(rec: dict[str, Any]) -> None:
        bar.update(task, advance=1, last=f"{rec['method']} {rec['length']} #{rec['index']}: "
                                         f"{'ok' if rec['ok'] else 'miss'}")

    return bar, Hooks(on_plan=on_plan, on_step=on_step, on_trial=on_trial)


def print_report(rep: Report) -> None:
    info = rep.info
    out.print(f"model:    {rep.model} ({info.arch}, L = {info.trained} from {info.trained_key}"
              + (f"; its own sizes: S {info.chunk}, w {info.local}" if info.chunk else "") + ")")
    t = Table(title="dev: exact first answers k/n [Wilson 95%]")
    lengths = sorted({n for by in rep.dev.values() for n in by})
    for col in ("candidate", *[f"{n} ({n / info.trained:.1f}x L)" for n in lengths], "all", "dev ppl"):
        t.add_column(col)
    for m, by in rep.dev.items():
        v = rep.ppl.get(m)
        mark = " <- pick" if m == rep.choice.pick else ""
        t.add_row(m + mark, *[str(by[n]) for n in lengths], str(rep.total(by)), "-" if v is None else f"{v:.4f}")
    out.print(t)
    for which, sc in rep.ceilings.items():
        out.print(f"ceiling:  {which} text, plain attention inside L ({rep.plan.inside} tokens): {sc}"
                  + ("" if rep.ceiling_line(which) is None else "  BELOW the ceiling: this text cannot rank methods past L"))
    if rep.far:
        far_dev = rep.plan.far_dev or 0
        out.print(f"far dev:  {', '.join(f'{m} {s}' for m, s in rep.far.items())} at {far_dev} tokens "
                  f"({far_dev / info.trained:.1f}x L), the dev rule's best {len(rep.far)}")
        out.print(f"pick:     {rep.choice.pick}: of the dev rule's best {len(rep.far)}, the most found at "
                  f"{rep.plan.far_dev} tokens (a tie: the rule's order: the most exact dev answers, the lowest dev "
                  "perplexity within the slack, the larger S)")
    else:
        out.print(f"pick:     {rep.choice.pick}: the most exact dev answers; among those within {rep.choice.slack} of "
                  f"the best ({', '.join(rep.choice.near)}), the lowest dev perplexity, then the larger S")
    t = Table(title="held-out: exact first answers k/n [Wilson 95%] (reported, not used to choose)")
    held = sorted({n for by in rep.heldout.values() for n in by})
    for col in ("method", *[f"{n} ({n / info.trained:.1f}x L)" for n in held], "all"):
        t.add_column(col)
    for m, by in rep.heldout.items():
        t.add_row("YaRN" if m == "yarn" else m, *[str(by[n]) for n in held], str(rep.total(by)))
    out.print(t)
    if rep.far_heldout is not None and rep.plan.far_heldout:
        n = rep.plan.far_heldout
        out.print(f"far:      {rep.choice.pick} {rep.far_heldout} at {n} tokens ({n / info.trained:.1f}x L) of the "
                  "held-out text")
    out.print(rep.verdict)
    for note in rep.notes:
        out.print(f"note:     {note}")
    out.print(f"wrote:    {rep.out} ({info.arch}.attention.dual_chunk.chunk_size = {rep.chunk}, local_size = "
              f"{rep.local}, temperature = {rep.copy.temperature}; every other key and the {rep.copy.n_tensors} tensors "
              "unchanged, checked by reading it back)")
    out.print(f"use:      llama-server -m {shlex.quote(str(rep.out))} --dca on -c N   (N past {info.trained})")
    out.print(f"report:   {rep.json_path}")
    if rep.plot_path:
        out.print(f"plot:     {rep.plot_path}")
    out.print(f"time:     {rep.seconds / 60:.1f} min")
