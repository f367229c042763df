"""``dcaforge render`` (and ``render --check``) and ``dcaforge drift``: the feature's anchors against
a tree, each edit that does not fit and why, and the wiring of the files it adds."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from dcaforge.commands.common import ConfigOpt, JsonOpt, call, err, load, out, print_json
from dcaforge.errors import EXIT_MISMATCH
from dcaforge.feature.drift import Misfit, canary
from dcaforge.feature.drift import check as do_check
from dcaforge.feature.plan import EditReport
from dcaforge.feature.render import render as do_render
from dcaforge.feature.wiring import WiringReport


def render(
    config: ConfigOpt = None,
    check: Annotated[bool, typer.Option("--check", help="change nothing; report whether each anchor fits")] = False,
    tree: Annotated[Path | None, typer.Option("--tree", metavar="DIR", help="with --check: check this folder instead of the baseline")] = None,
    force: Annotated[bool, typer.Option("--force", help="overwrite hand edits in rendered files")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Render the feature templates into the clean room (idempotent)."""
    cfg = load(config)
    if check or tree is not None:
        res = call(lambda: do_check(cfg, tree))
        if as_json:
            print_json("render", res, check=True, ok=res.ok, anchors_ok=res.anchors_ok)
            if not res.ok:
                raise typer.Exit(EXIT_MISMATCH)
            return
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
        print_misfits(res.misfits, {e.index: e for e in res.edits})
        for dest, what in res.files:
            out.print(f"file {dest}: {what}")
        if res.wiring is not None:
            print_wiring(res.wiring)
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
    r = call(lambda: do_render(cfg, force=force))
    if as_json:
        print_json("render", r, check=False)
        return
    for rel in r.written:
        out.print(f"written   {rel}")
    for rel in r.restored:
        out.print(f"restored  {rel}")
    out.print(f"{len(r.written)} written, {len(r.unchanged)} unchanged, {len(r.restored)} restored")


def print_misfits(misfits: list[Misfit], edits: dict[int, EditReport]) -> None:
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


def print_wiring(w: WiringReport) -> None:
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


def drift(
    config: ConfigOpt = None,
    sdist: Annotated[str | None, typer.Option("--sdist", metavar="VERSION", help="a llama-cpp-python version (its vendor/llama.cpp)")] = None,
    tree: Annotated[Path | None, typer.Option("--tree", metavar="DIR", help="a llama.cpp tree (a folder)")] = None,
    trust: Annotated[bool, typer.Option("--trust", help="let --sdist also be a package name with version specifiers "
                                        "(pip runs that package's build backend)")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Drift canary: count the feature's edits that fit, drifted or are absent on a llama.cpp tree."""
    cfg = load(config)
    res = call(lambda: canary(cfg, tree_dir=tree, sdist=sdist, trust=trust))
    if as_json:
        print_json("drift", res, fit=res.fit, drifted=res.drifted, absent=res.absent, skipped=res.skipped,
                   summary=res.summary(), ok=not res.misfits)
        if res.misfits:
            raise typer.Exit(EXIT_MISMATCH)
        return
    print_misfits(res.misfits, {e.index: e for e in res.check.edits})
    out.print(res.summary())
    if res.misfits:
        raise typer.Exit(EXIT_MISMATCH)
