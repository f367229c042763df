"""The command line (the only module that knows typer and rich): parse, call, print."""

from __future__ import annotations

import json
import logging
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from . import __version__
from .config import Config, load_config
from .errors import EXIT_INTERRUPTED, EXIT_MISMATCH, DcaforgeError, InterruptedRun

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Keep a patch series and a templated feature on top of llama.cpp, in a clean room.")
out = Console(highlight=False, soft_wrap=True, markup=False)
err = Console(stderr=True, highlight=False, soft_wrap=True, markup=False)

ConfigOpt = Annotated[Path | None, typer.Option("-c", "--config", help="dcaforge.yaml to use "
                                                "(default: ./dcaforge.yaml, else the built-in upstream default)")]
T = TypeVar("T")


def _call(fn: Callable[[], T], interrupted: str | None = None) -> T:
    try:
        return fn()
    except InterruptedRun as exc:
        err.print(f"[bold yellow]interrupted:[/] {escape(str(exc.message))}", markup=True)
        err.print(f"  [bold]next:[/] {escape(str(exc.hint))}", markup=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except DcaforgeError as exc:
        err.print(f"[bold red]error:[/] {escape(str(exc.message))}", markup=True)
        if exc.where:
            err.print(f"  [dim]where:[/] {escape(str(exc.where))}", markup=True)
        if exc.details:
            for line in exc.details.rstrip().splitlines():
                err.print(f"    {line}", markup=False)
        hint = exc.hint or "run it again with `dcaforge -v ...` to see every git/patch command it runs"
        err.print(f"  [bold]next:[/] {escape(str(hint))}", markup=True)
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        err.print("[bold yellow]interrupted:[/] " + escape(interrupted or "nothing was left half-written; run the same "
                  "command again"), markup=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None


def _config(path: Path | None) -> Config:
    return _call(lambda: load_config(path))


class _Warnings(logging.Handler):
    """dcaforge's warnings (what it repaired or removed after an interrupted run) on stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        err.print(f"[yellow]warning:[/] {escape(record.getMessage())}", markup=True)


def _on_sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # the same cleanup as Ctrl-C: the room is left at its last completed step


@app.callback()
def _main(verbose: Annotated[bool, typer.Option("-v", "--verbose", help="log every command run")] = False,
          version: Annotated[bool, typer.Option("--version", help="print the version")] = False) -> None:
    if version:
        out.print(f"dcaforge {__version__}")
        raise typer.Exit(0)
    logger = logging.getLogger("dcaforge")
    for h in [h for h in logger.handlers if isinstance(h, _Warnings)]:
        logger.removeHandler(h)
    handler = _Warnings(level=logging.WARNING)
    logger.addHandler(handler)
    if verbose:
        logging.basicConfig(level=logging.DEBUG, format="%(message)s", stream=sys.stderr)
    elif logger.level == logging.NOTSET:
        logger.setLevel(logging.WARNING)


@app.command()
def apply(
    config: ConfigOpt = None,
    fresh: Annotated[bool, typer.Option("--fresh", help="delete the clean room (only one dcaforge made) and start over")] = False,
    cont: Annotated[bool, typer.Option("--continue", help="resume after a failed or interrupted apply")] = False,
    include_wip: Annotated[bool, typer.Option("--include-wip", help="copy the source checkout's uncommitted files into the new clean room")] = False,
    no_render: Annotated[bool, typer.Option("--no-render", help="stop at the baseline")] = False,
    trust: Annotated[bool, typer.Option("--trust", help="run the config's bootstrap commands (shown before they run); "
                                        "without it they run only from a config listed in the settings file")] = False,
) -> None:
    """Make or refresh the clean room, apply the series, tag the baseline, render the feature."""
    from .series import ApplyHooks, Patch
    from .series import apply as do_apply

    cfg = _config(config)
    err.print(f"[bold]dcaforge apply[/] {escape(str(cfg.describe()))} -> {escape(str(cfg.room))}", markup=True)

    def on_patch(i: int, n: int, p: Patch) -> None:
        err.print(f"  [{i + 1}/{n}] {p.name} ({p.style})", markup=False)

    def on_step(s: str) -> None:
        err.print(f"  {s}", markup=False)

    res = _call(lambda: do_apply(cfg, fresh=fresh, cont=cont, include_wip=include_wip, render=not no_render,
                                 hooks=ApplyHooks(on_patch=on_patch, on_step=on_step), trust=trust))
    out.print(f"clean room: {res.room}")
    out.print(f"source:     {res.source}")
    out.print(f"series:     {res.total} patches ({len(res.applied_now)} applied now"
              + (f", {res.skipped_to} already" if res.skipped_to else "") + ")")
    out.print(f"baseline:   {res.baseline}  (tag dcaforge/baseline)")
    if res.render is not None:
        r = res.render
        out.print(f"rendered:   {len(r.written)} written, {len(r.unchanged)} unchanged, {len(r.restored)} restored")
    for note in res.notes:
        out.print(f"note:       {note}")
    if res.wip_included:
        out.print(f"included uncommitted files: {', '.join(res.wip_included)}")
    elif res.wip_left_behind:
        out.print(f"[yellow]left behind[/] (uncommitted in the source checkout; --include-wip copies them): "
                  f"{escape(str(', '.join(res.wip_left_behind)))}", markup=True)


@app.command()
def render(
    config: ConfigOpt = None,
    check: Annotated[bool, typer.Option("--check", help="change nothing; report whether each anchor fits")] = False,
    tree: Annotated[Path | None, typer.Option("--tree", help="with --check: check this folder instead of the baseline")] = None,
    force: Annotated[bool, typer.Option("--force", help="overwrite hand edits in rendered files")] = False,
) -> None:
    """Render the feature templates into the clean room (idempotent)."""
    from . import render as rmod
    from .drift import check as do_check

    cfg = _config(config)
    if check or tree is not None:
        res = _call(lambda: do_check(cfg, tree))
        # plain aligned lines (not a table that folds long paths): greppable in logs and CI
        rows = [("#", "file", "action", "fit", "matches", "status", "note")]
        rows += [(str(e.index), e.file or "-", e.action, e.fit, f"{e.matches}/{e.count}", e.status, e.note)
                 for e in res.edits]
        widths = [max(len(r[i]) for r in rows) for i in range(6)]
        out.print(f"anchors on {res.tree}")
        for k, row in enumerate(rows):
            line = "  ".join(c.ljust(w) for c, w in zip(row[:6], widths, strict=True)) + ("  " + row[6] if row[6] else "")
            style = None if k == 0 or row[5] == "ok" else ("dim" if row[5] == "skipped" else "red")
            out.print(line.rstrip(), style=style)
        fitted = [e for e in res.edits if e.status == "ok"]
        alts = sum(1 for e in fitted if e.variant)
        out.print(f"{len(fitted)} fit ({alts} by an alternative), "
                  f"{sum(1 for e in res.edits if e.status == 'skipped')} skipped, "
                  f"{sum(1 for e in res.edits if not e.fits)} do not fit, of {len(res.edits)} edits")
        _print_misfits(res.misfits, {e.index: e for e in res.edits})
        for dest, what in res.files:
            out.print(f"file {dest}: {what}")
        if res.wiring is not None:
            _print_wiring(res.wiring)
        if not res.ok:
            where = escape(str(cfg.feature.templates / 'manifest.yaml'))
            if not res.anchors_ok:
                bad = sum(1 for e in res.edits if not e.fits)
                err.print(f"[bold red]error:[/] {bad} of {len(res.edits)} edits do not fit {escape(res.tree)}", markup=True)
                err.print(f"  [dim]where:[/] {where} (the edits listed above)", markup=True)
                err.print("  [bold]next:[/] adjust those anchors or add 'alternatives:' (the closest lines are shown above), "
                          "or guard the edits with 'when_exists:' or 'when:'; then check again", markup=True)
            if res.wiring is not None and not res.wiring.ok:
                err.print("[bold red]error:[/] the build leaves out files the feature adds (listed above)", markup=True)
                err.print("  [bold]next:[/] add each file to the list named above (or render the feature's wiring edits); "
                          "then check again", markup=True)
            raise typer.Exit(EXIT_MISMATCH)
        return
    r = _call(lambda: rmod.render(cfg, force=force))
    for rel in r.written:
        out.print(f"written   {rel}")
    for rel in r.restored:
        out.print(f"restored  {rel}")
    out.print(f"{len(r.written)} written, {len(r.unchanged)} unchanged, {len(r.restored)} restored")


def _print_misfits(misfits: list[Any], edits: dict[int, Any]) -> None:
    """One table: each edit that does not fit, drifted or absent, and why (nearest lines from the
    pristine baseline file)."""
    if not misfits:
        return
    drifted = sum(1 for m in misfits if m.kind == "drifted")
    out.print(f"misfits: {drifted} drifted, {len(misfits) - drifted} absent")
    rows = [("#", "file", "class", "why")] + [(str(m.index), m.file, m.kind, m.reason) for m in misfits]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    pad = " " * (sum(widths) + 6)
    for k, row in enumerate(rows):
        out.print("  ".join(c.ljust(w) for c, w in zip(row[:3], widths, strict=True)) + "  " + row[3],
                  style=None if k == 0 else "red", markup=False)
        if k == 0:
            continue
        m = misfits[k - 1]
        e = edits.get(m.index)
        for label, lines in m.nearest:
            anchor = e.anchor if e is not None and label in ("anchor", "matched") else next(
                (a for v, a, _n, _c in (e.tried if e is not None else []) if f"alternative {v}" == label), "")
            out.print(f"{pad}{label} {anchor!r} (manifest line {m.manifest_line}):", markup=False)
            for c in lines:
                out.print(f"{pad}    {c}", markup=False)


def _print_wiring(w: Any) -> None:
    if not w.rows:
        out.print(f"wiring ({w.backend}): the feature adds no .c/.cpp/.cu file")
        return
    n_ok = sum(1 for r in w.rows if r.status == "ok")
    out.print(f"wiring ({w.backend}): {n_ok} of {len(w.rows)} added sources built"
              + (f", {len(w.missing)} left out" if w.missing else ""))
    for r in w.rows:
        if r.status == "missing":
            out.print(f"  missing  {r.source}: not built by {r.build}; add it to {r.join}", style="red", markup=False)
        else:
            out.print(f"  {r.status:<8} {r.source}: {r.how}", style=None if r.status == "ok" else "dim", markup=False)


@app.command()
def drift(
    config: ConfigOpt = None,
    sdist: Annotated[str | None, typer.Option("--sdist", help="a llama-cpp-python version (its vendor/llama.cpp)")] = None,
    tree: Annotated[Path | None, typer.Option("--tree", help="a llama.cpp tree (a folder)")] = None,
) -> None:
    """Drift canary: count the feature's edits that fit, drifted or are absent on a llama.cpp tree."""
    from .drift import canary

    cfg = _config(config)
    res = _call(lambda: canary(cfg, tree_dir=tree, sdist=sdist))
    _print_misfits(res.misfits, {e.index: e for e in res.check.edits})
    out.print(res.summary())
    if res.misfits:
        raise typer.Exit(EXIT_MISMATCH)


@app.command()
def capture(
    config: ConfigOpt = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="write here instead of the series folder")] = None,
) -> None:
    """Diff baseline -> clean-room work tree into patches/NNNN-name.patch (deterministic bytes)."""
    from .capture import capture as do_capture

    cfg = _config(config)
    res = _call(lambda: do_capture(cfg, output))
    out.print(f"{'wrote' if res.written else 'unchanged'} {res.path} ({res.size} bytes, {len(res.files)} files, "
              f"sha256 {res.sha256[:16]})")
    for u in res.bookkeeping:
        what = "row" if u.kind == "series_readme" else "entry"
        out.print(f"{u.action:<9} {u.path}:{u.line} ({what} for {cfg.feature.number:04d})")
    if res.bookkeeping_skipped:
        out.print("note: bookkeeping not updated (-o writes the patch outside the series)")


@app.command()
def templatize(config: ConfigOpt = None) -> None:
    """Write the clean room's changes (against the baseline) back into the feature's templates."""
    from .templatize import templatize as do_templatize

    cfg = _config(config)
    res = _call(lambda: do_templatize(cfg))
    out.print(f"wrote {res.folder}: {res.files} new files, {res.edits} anchored edits in {res.edited_files} files"
              + (f"; kept {res.kept} hand-written edits/files for other trees" if res.kept else ""))
    for note in res.notes:
        err.print(f"note: {note}", style="yellow")
    out.print("next: dcaforge capture, then dcaforge verify --fresh-render")


@app.command()
def verify(
    file: Annotated[Path | None, typer.Argument(help="patch to verify (default: the feature's patch)")] = None,
    config: ConfigOpt = None,
    fresh_render: Annotated[bool, typer.Option("--fresh-render", help="also require the patch to equal a fresh render of the templates")] = False,
    gnu: Annotated[bool, typer.Option("--gnu", help="also require GNU patch -p1 --fuzz=0 to give the same files")] = False,
) -> None:
    """Round-trip check: forward-apply gives the captured tree, reverse-apply the baseline."""
    from .verify import verify as do_verify

    cfg = _config(config)
    res = _call(lambda: do_verify(cfg, file, fresh_render=fresh_render, gnu=gnu))
    out.print(f"ok: {res.patch.name} forward-applies to the {res.expected_from} tree {res.forward_tree[:12]} "
              f"and reverse-applies to the baseline tree {res.reverse_tree[:12]}")
    if res.fresh_render:
        out.print("ok: byte-identical to a fresh render of the templates")
    if res.gnu_patch:
        out.print("ok: GNU patch -p1 --fuzz=0 gives the same files")
    for n in res.notes:
        out.print(f"note: {n}")


@app.command()
def status(
    config: ConfigOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Source, series progress, baseline, render and patch freshness."""
    from .status import status as do_status

    cfg = _config(config)
    res = _call(lambda: do_status(cfg))
    if as_json:
        sys.stdout.write(json.dumps(res.to_dict(), indent=2, sort_keys=True) + "\n")
        return
    rows: list[tuple[str, Any]] = [
        ("config", res.config), ("source", res.source), ("clean room", res.room + ("" if res.room_exists else " (none)")),
        ("base", res.base_commit or "-"), ("phase", res.phase or "-"), ("series", f"{res.series_applied}/{res.series_total} applied"
                                      + (" (series changed since apply)" if res.series_changed else "")),
        ("baseline", res.baseline or "-"),
        ("rendered", ("yes" if res.rendered else "no") + (" (templates changed since)" if res.templates_changed else "")
         + (f" (the last render stopped: {res.render_error})" if res.render_error else "")),
        ("hand edits", ", ".join(res.dirty) or "none"),
        ("patch", f"{res.patch} ({res.patch_state})"),
    ]
    if res.failed:
        rows.append(("failed at", f"{res.failed.get('patch')} {res.failed.get('file') or ''} {res.failed.get('hunk') or ''}"))
    if res.source_uncommitted:
        rows.append(("source wip", ", ".join(res.source_uncommitted)))
    if res.source_submodules_wip:
        rows.append(("submodule wip", ", ".join(res.source_submodules_wip) + " (uncommitted files inside; "
                     "--include-wip copies them)"))
    if res.unsafe_config:
        rows.append(("room config", "UNSAFE: .git/config sets " + ", ".join(res.unsafe_config)
                     + " (could run commands); `dcaforge apply` removes them"))
    for k, v in rows:
        out.print(f"{k:<11} {v}", markup=False)



@app.command()
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
                                      "cosmocc (and, with --cuda, the GPU script with a recording nvcc) and check "
                                      "that the feature's files are compiled and linked; builds nothing")] = False,
) -> None:
    """Build the clean room (or the baseline) with cmake+ninja or llamafile's cosmocc make."""
    if dry:
        _dry_run(config, cuda, targets)
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from .build import BuildHooks
    from .build import Progress as BuildProgress
    from .build import build as do_build

    cfg = _config(config)
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
        res = _call(lambda: do_build(cfg, cuda=cuda, baseline=baseline, targets=tgts or None, jobs=jobs,
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



def _dry_run(config: Path | None, cuda: bool, targets: list[str] | None) -> None:
    from .build import dry_run

    cfg = _config(config)
    progs = [t for group in (targets or []) for t in group.split()]
    rep = _call(lambda: dry_run(cfg, cuda=cuda, programs=progs or None))
    _print_wiring(rep.wiring)
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
        if not rep.wiring.ok:
            err.print("the build leaves out files the feature adds", style="red")
        raise typer.Exit(EXIT_MISMATCH)
    out.print("ok: every file the feature adds is compiled and linked (dry run; nothing was built)")


@app.command()
def gate(
    config: ConfigOpt = None,
    only: Annotated[list[str] | None, typer.Option("--only", help="run only this gate (repeatable)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the results as JSON")] = False,
) -> None:
    """Run the acceptance gates of the config on the builds; exit 1 when one fails."""
    from .gate import GateHooks, points_table, run_gates

    cfg = _config(config)
    hooks = GateHooks(on_gate=lambda g: err.print(f"[bold]gate[/] {escape(g.name)} ({g.kind})", markup=True),
                      on_step=lambda s: err.print(f"  {s}", markup=False))
    rep = _call(lambda: run_gates(cfg, only=only or (), hooks=hooks), interrupted="the gates were stopped; no results written")
    if as_json:
        sys.stdout.write(json.dumps(rep.to_dict(), indent=2, sort_keys=True) + "\n")
    else:
        table = Table(title="gates")
        for col in ("gate", "kind", "result", "seconds", "details"):
            table.add_column(col)
        for r in rep.results:
            table.add_row(r.name, r.kind, Text("PASS" if r.passed else "FAIL", style="green" if r.passed else "bold red"),
                          f"{r.seconds:.0f}", r.summary)
        out.print(table)
        for r in rep.results:
            pts = points_table(r)
            if pts is not None:
                title, cols, rows = pts
                t = Table(title=title)
                for col in cols:
                    t.add_column(col, justify="right")
                for row in rows:
                    t.add_row(*row)
                out.print(t)
        out.print(f"results: {rep.json_path}")
        if rep.plot_path:
            out.print(f"plot:    {rep.plot_path}")
    if not rep.passed:
        err.print(f"gate failed: {', '.join(r.name for r in rep.results if not r.passed)}", style="red")
        raise typer.Exit(1)


def main() -> None:
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)
    app()


if __name__ == "__main__":
    main()
