"""``dcaforge capture``, ``verify`` and ``templatize``: the clean room's changes as the feature's
patch, that patch proved, and the changes written back into the templates."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dcaforge.commands.common import ConfigOpt, JsonOpt, call, err, load, out, pasteable, print_json
from dcaforge.feature.templatize import templatize as do_templatize
from dcaforge.patch.capture import capture as do_capture
from dcaforge.patch.verify import verify as do_verify


def capture(
    config: ConfigOpt = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", metavar="FILE", help="write here instead of the series folder")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Diff baseline -> clean-room work tree into patches/NNNN-name.patch (deterministic bytes)."""
    cfg = load(config)
    res = call(lambda: do_capture(cfg, output))
    if as_json:
        print_json("capture", res)
        return
    out.print(f"{'wrote' if res.written else 'unchanged'} {res.path} ({res.size} bytes, {len(res.files)} files, "
              f"sha256 {res.sha256[:16]})")
    for u in res.bookkeeping:
        what = "row" if u.kind == "series_readme" else "entry"
        out.print(f"{u.action:<9} {u.path}:{u.line} ({what} for {cfg.feature.number:04d})")
    if res.bookkeeping_skipped:
        out.print("note: bookkeeping not updated (-o writes the patch outside the series)")


def templatize(config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """Write the clean room's changes (against the baseline) back into the feature's templates."""
    cfg = load(config)
    res = call(lambda: do_templatize(cfg))
    if as_json:
        print_json("templatize", res)
        return
    out.print(f"wrote {res.folder}: {res.files} new files, {res.edits} anchored edits in {res.edited_files} files"
              + (f"; kept {res.kept} hand-written edits/files for other trees" if res.kept else ""))
    for note in res.notes:
        err.print(f"note: {note}", style="yellow")
    out.print(pasteable("next: `dcaforge capture`, then `dcaforge verify --fresh-render`"))


def verify(
    file: Annotated[Path | None, typer.Argument(metavar="FILE", help="patch to verify (default: the feature's patch)")] = None,
    config: ConfigOpt = None,
    fresh_render: Annotated[bool, typer.Option("--fresh-render", help="also require the patch to equal a fresh render of the templates")] = False,
    gnu: Annotated[bool, typer.Option("--gnu", help="also require GNU patch -p1 --fuzz=0 to give the same files")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Round-trip check: forward-apply gives the captured tree, reverse-apply the baseline."""
    cfg = load(config)
    res = call(lambda: do_verify(cfg, file, fresh_render=fresh_render, gnu=gnu))
    if as_json:
        print_json("verify", res, ok=True)
        return
    out.print(f"ok: {res.patch.name} forward-applies to the {res.expected_from} tree {res.forward_tree[:12]} "
              f"and reverse-applies to the baseline tree {res.reverse_tree[:12]}")
    if res.fresh_render:
        out.print("ok: byte-identical to a fresh render of the templates")
    if res.gnu_patch:
        out.print("ok: GNU patch -p1 --fuzz=0 gives the same files")
    for n in res.notes:
        out.print(f"note: {n}")
