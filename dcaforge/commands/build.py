"""``dcaforge build``: the clean room (or the baseline) built, with a progress bar on a terminal;
``--dry-run``: llamafile's make and GPU script run dry (with consent: ``--trust``), to show every
added file is built."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from ..build import BuildHooks, dry_run
from ..build import Progress as BuildProgress
from ..build import build as do_build
from ..errors import EXIT_MISMATCH
from ..wiring import WiringReport
from .common import ConfigOpt, call, err, load, out
from .render import print_wiring


def build(
    config: ConfigOpt = None,
    cuda: Annotated[bool, typer.Option("--cuda", help="build with CUDA (cmake: GGML_CUDA=ON with the configured "
                                       "architectures; llamafile: also llamafile/cuda.sh)")] = False,
    baseline: Annotated[bool, typer.Option("--baseline", help="build the baseline (series applied, no feature) "
                                           "in its own worktree <workspace>/<name>-baseline")] = False,
    targets: Annotated[list[str] | None, typer.Option("--targets", "-t", help="targets to build (repeat, or "
                                                      "space-separated); default: build.*.targets of the config")] = None,
    jobs: Annotated[int | None, typer.Option("-j", "--jobs", help="parallel jobs (default: build.jobs, else the cores)")] = None,
    dry: Annotated[bool, typer.Option("--dry-run", help="llamafile: run its Makefile with make -n and a stand-in "
                                      "cosmocc (and, with --cuda, the GPU script with stand-in compilers, without "
                                      "--clean) and check that the feature's files are compiled and linked; builds "
                                      "and deletes nothing, starts no compiler; runs the tree's code, so only with "
                                      "--trust or a trusted config")] = False,
    trust: Annotated[bool, typer.Option("--trust", help="with --dry-run: run the tree's Makefile (make -n evaluates "
                                        "its $(shell ...)) and GPU script although the config is not in your "
                                        "settings' trusted list")] = False,
) -> None:
    """Build the clean room (or the baseline) with cmake+ninja or llamafile's cosmocc make."""
    if dry:
        _dry_run(config, cuda, targets, trust)
        return
    cfg = load(config)
    tgts = [t for group in (targets or []) for t in group.split()]
    what = "baseline" if baseline else "clean room"
    err.print(f"[bold]dcaforge build[/] {what} ({cfg.build.backend}{', cuda' if cuda else ''}) {escape(str(cfg.room))}",
              markup=True)
    bar = Progress(SpinnerColumn(), TextColumn("{task.fields[step]:<9}"), BarColumn(bar_width=30), MofNCompleteColumn(),
                   TimeElapsedColumn(), TextColumn("{task.fields[item]}", markup=False),
                   console=err, transient=False, disable=not err.is_terminal)
    task = bar.add_task("build", total=None, step="", item="")

    def on_step(step: str, argv: tuple[str, ...]) -> None:
        bar.update(task, step=step, item=" ".join(argv)[-70:], completed=0, total=None)
        if not err.is_terminal:
            err.print(f"  {step}: {' '.join(argv)}", markup=False)

    def on_progress(p: BuildProgress) -> None:
        bar.update(task, completed=p.done, total=p.total, item=p.text[-70:])
        if not err.is_terminal and (p.done == p.total or p.done % 50 == 0):
            err.print(f"  [{p.done}/{p.total}] {p.text}", markup=False)

    with bar:
        res = call(lambda: do_build(cfg, cuda=cuda, baseline=baseline, targets=tgts or None, jobs=jobs,
                                    hooks=BuildHooks(on_step=on_step, on_progress=on_progress)),
                   interrupted="the build was stopped; run the same `dcaforge build` again to resume (only what is "
                               "left is built)")
    for s in res.steps:
        if s.skipped:
            out.print(f"{s.what:<10} up to date")
        else:
            prog = f", {s.progress.done}/{s.progress.total} steps" if s.progress else ""
            out.print(f"{s.what:<10} {s.seconds:.1f} s{prog}")
    out.print(f"built:     {res.variant} tree {res.tree}")
    out.print(f"output:    {', '.join(str(o) for o in res.outputs)}")
    out.print(f"targets:   {' '.join(res.targets) or '(default)'}  -j{res.jobs}  ccache {'on' if res.ccache else 'off'}")
    out.print(f"log:       {res.log}")
    out.print(f"total:     {res.seconds:.1f} s" + ("  (nothing to rebuild)" if res.compiled == 0 else ""))


def _dry_run(config: Path | None, cuda: bool, targets: list[str] | None, trust: bool) -> None:
    cfg = load(config)
    progs = [t for group in (targets or []) for t in group.split()]
    rep = call(lambda: dry_run(cfg, cuda=cuda, programs=progs or None, trust=trust))
    wiring = rep.wiring
    assert isinstance(wiring, WiringReport)
    print_wiring(wiring)
    out.print(f"make -n: {' '.join(rep.make_argv)}", markup=False)
    for src, obj in rep.objects.items():
        if obj is None:
            out.print(f"  {src}: not compiled", style="red", markup=False)
            continue
        on = [p for p, ok in rep.linked[src].items() if ok]
        off = [p for p, ok in rep.linked[src].items() if not ok]
        out.print(f"  {src} -> {obj}; linked into {', '.join(on) or 'nothing'}"
                  + (f"; NOT into {', '.join(off)}" if off else ""), style="red" if off else None, markup=False)
    for src in rep.unbuilt:
        out.print(f"  {src}: not built by this build (see the wiring above)", style="dim", markup=False)
    if rep.cuda_argv is not None:
        out.print(f"gpu script (stand-in nvcc): {' '.join(rep.cuda_argv)}: {len(rep.nvcc_calls)} nvcc call(s)", markup=False)
        for src, ok in rep.cuda_sources.items():
            out.print(f"  {src}: {'handed to nvcc' if ok else 'NOT handed to nvcc'}", style=None if ok else "red",
                      markup=False)
    if not rep.ok:
        for p in rep.problems:
            err.print(f"dry run: {p}", style="red", markup=False)
        if not wiring.ok:
            err.print("the build leaves out files the feature adds", style="red")
        raise typer.Exit(EXIT_MISMATCH)
    out.print("ok: every file the feature adds is compiled and linked (dry run; nothing was built)")
