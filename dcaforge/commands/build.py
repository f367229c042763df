"""``dcaforge build``: the clean room (or the baseline) built, with a progress bar on a terminal, then
where the programs are; ``--dry-run``: cmake, configure only (into a scratch folder) and the plan;
llamafile, its make and GPU script run dry (with consent: ``--trust``), to show every added file is built."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.progress import Progress

from dcaforge.builder.build import BuildHooks, BuildResult, CmakePlan, DryRunReport, cmake_plan, dry_run
from dcaforge.builder.build import Progress as BuildProgress
from dcaforge.builder.build import build as do_build
from dcaforge.commands.common import ConfigOpt, JsonOpt, call, err, load, out, pasteable, print_json, progress_bar, shorten
from dcaforge.commands.render import print_wiring
from dcaforge.config import Config
from dcaforge.errors import EXIT_MISMATCH
from dcaforge.feature.wiring import WiringReport


def build(
    config: ConfigOpt = None,
    cuda: Annotated[bool, typer.Option("--cuda", help="build with CUDA (cmake: GGML_CUDA=ON with the configured "
                                       "architectures; llamafile: also llamafile/cuda.sh)")] = False,
    baseline: Annotated[bool, typer.Option("--baseline", help="build the baseline (series applied, no feature) "
                                           "in its own worktree <workspace>/<name>-baseline")] = False,
    targets: Annotated[list[str] | None, typer.Option("--targets", "-t", metavar="'T ...'", help="targets to build (repeat, "
                                                      "or space-separated); default: build.*.targets of the config")] = None,
    jobs: Annotated[int | None, typer.Option("-j", "--jobs", metavar="N", help="parallel jobs (default: build.jobs, else the cores)")] = None,
    dry: Annotated[bool, typer.Option("--dry-run", help="build nothing: cmake configures into a scratch folder and prints "
                                      "the plan (targets, where each lands, ninja's steps); llamafile runs its Makefile "
                                      "with make -n and a stand-in cosmocc (and, with --cuda, the GPU script with "
                                      "stand-in compilers, without --clean) and checks that the feature's files are "
                                      "compiled and linked; deletes nothing, starts no compiler; llamafile's runs the "
                                      "tree's code, so only with --trust or a trusted config")] = False,
    trust: Annotated[bool, typer.Option("--trust", help="with --dry-run: run the tree's Makefile (make -n evaluates "
                                        "its $(shell ...)) and GPU script although the config is not in your "
                                        "settings' trusted list")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Build the clean room (or the baseline) with cmake+ninja or llamafile's cosmocc make; print where the
    programs are (the built-in default builds llama-server, llama-cli, llama-completion, llama-perplexity,
    llama-passkey and libllama)."""
    if dry:
        _dry_run(config, cuda, targets, as_json, trust)
        return
    cfg = load(config)
    tgts = _split(targets)
    what = "baseline" if baseline else "clean room"
    err.print(f"[bold]dcaforge build[/] {what} ({cfg.build.backend}{', cuda' if cuda else ''}) {escape(str(cfg.room))}",
              markup=True)
    bar, hooks = _progress()
    with bar:
        res = call(lambda: do_build(cfg, cuda=cuda, baseline=baseline, targets=tgts or None, jobs=jobs, hooks=hooks),
                   interrupted="the build was stopped; run the same `dcaforge build` again to resume (only what is "
                               "left is built)")
    if as_json:
        print_json("build", res, compiled=res.compiled, bin_dir=res.bin_dir)
        return
    _print_result(res)


def _split(targets: list[str] | None) -> list[str]:
    """``--targets`` given as several options or one space-separated list (or both)."""
    return [t for group in (targets or []) for t in group.split()]


def _print_result(res: BuildResult) -> None:
    """What was built: each step, where the tree, outputs and log are, the programs and what to run next."""
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
    for note in res.notes:
        out.print(f"note:      {escape(note)}")
    out.print(f"total:     {res.seconds:.1f} s" + ("  (nothing to rebuild)" if res.compiled == 0 else ""))
    if res.programs:
        out.print("programs:")
        for name, path in res.programs.items():
            out.print(f"  {name:<18} {path}")
        server = res.programs.get("llama-server")
        if server is not None and not res.cuda and res.variant == "feature":
            out.print(pasteable(f"next:      serve a GGUF past its trained context with DCA: `{shlex.quote(str(server))} "
                                "-m MODEL.gguf -c 32768 --dca on` (its log then says \"Dual Chunk Attention: the slot context (32768) extends "
                                "past the training context of the model\"), "
                                "or let `dcaforge try MODEL.gguf` answer a long prompt"), markup=False)


def _progress() -> tuple[Progress, BuildHooks]:
    """The build's live progress: a bar on a terminal (at most its width: the step's text is shortened to what is
    left of the line), else a line per step and per 50 compiled files, each cut to 80 columns."""
    bar = progress_bar(err)
    task = bar.add_task("build", total=None, step="", item="")

    def on_step(step: str, argv: tuple[str, ...]) -> None:
        bar.update(task, step=step, item=" ".join(argv), completed=0, total=None)
        if not err.is_terminal:
            err.print(shorten(f"  {step}: {' '.join(argv)}"), markup=False)

    def on_progress(p: BuildProgress) -> None:
        bar.update(task, completed=p.done, total=p.total, item=p.text)
        if not err.is_terminal and (p.done == p.total or p.done % 50 == 0):
            err.print(shorten(f"  [{p.done}/{p.total}] {p.text}"), markup=False)

    return bar, BuildHooks(on_step=on_step, on_progress=on_progress)


def _dry_run(config: Path | None, cuda: bool, targets: list[str] | None, as_json: bool, trust: bool) -> None:
    cfg = load(config)
    tgts = _split(targets)
    if cfg.build.backend == "cmake":
        _cmake_plan(cfg, cuda, tgts, as_json, trust)
        return
    rep = call(lambda: dry_run(cfg, cuda=cuda, programs=tgts or None, trust=trust))
    wiring = rep.wiring
    assert isinstance(wiring, WiringReport)
    if as_json:
        _print_plan_json(rep, rep.ok, problems=rep.problems)
        return
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


def _print_plan_json(plan: CmakePlan | DryRunReport, ok: bool, **extra: object) -> None:
    """A dry run's --json: the plan with ``dry_run`` and ``ok`` (and ``extra``); exit 3 when it is not ok."""
    print_json("build", plan, dry_run=True, ok=ok, **extra)
    if not ok:
        raise typer.Exit(EXIT_MISMATCH)


def _cmake_plan(cfg: Config, cuda: bool, tgts: list[str], as_json: bool, trust: bool) -> None:
    err.print(f"[bold]dcaforge build --dry-run[/] (cmake{', cuda' if cuda else ''}: configure only, into a scratch "
              f"folder) {escape(str(cfg.room))}", markup=True)
    bar, hooks = _progress()
    with bar:
        plan = call(lambda: cmake_plan(cfg, cuda=cuda, targets=tgts or None, hooks=hooks, trust=trust))
    wiring = plan.wiring
    assert isinstance(wiring, WiringReport)
    if as_json:
        _print_plan_json(plan, plan.ok)
        return
    print_wiring(wiring)
    out.print(f"configure: {shlex.join(plan.configure)}", markup=False)
    out.print(f"           ({'the build folder is configured so already' if plan.configured else 'run by the build'})")
    out.print(f"targets:   {' '.join(plan.targets) or '(default: everything)'}")
    for name, path in plan.files.items():
        out.print(f"  {name:<18} -> {path if path is not None else '(several files)'}", markup=False)
    if plan.steps is not None:
        out.print(f"steps:     {plan.steps} (ninja, from scratch; a build again compiles only what changed)")
    out.print(f"log:       {plan.log}")
    if not plan.ok:
        err.print("the build leaves out files the feature adds", style="red")
        raise typer.Exit(EXIT_MISMATCH)
    out.print(pasteable(f"ok: nothing was built (dry run); `dcaforge build{' --cuda' if cuda else ''}` builds it"), markup=False)
