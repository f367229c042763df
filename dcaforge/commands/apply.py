"""``dcaforge apply``: make or refresh the clean room, apply the series, tag the baseline, render."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from dcaforge.commands.common import ConfigOpt, DownloadBar, JsonOpt, call, err, load, out, print_json
from dcaforge.patch.series import ApplyHooks
from dcaforge.patch.series import apply as do_apply
from dcaforge.patchfile import Patch


def apply(
    config: ConfigOpt = None,
    fresh: Annotated[bool, typer.Option("--fresh", help="delete the clean room (only one dcaforge made) and start over")] = False,
    cont: Annotated[bool, typer.Option("--continue", help="resume after a failed or interrupted apply")] = False,
    include_wip: Annotated[bool, typer.Option("--include-wip", help="copy the source checkout's uncommitted files into the new clean room")] = False,
    no_render: Annotated[bool, typer.Option("--no-render", help="stop at the baseline")] = False,
    trust: Annotated[bool, typer.Option("--trust", help="run the config's bootstrap commands (shown before they run); "
                                        "without it they run only from a config listed in the settings file")] = False,
    force: Annotated[bool, typer.Option("--force", help="with --fresh: discard hand edits in the clean room "
                                        "(without it, --fresh refuses a room that has them and lists them)")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Make or refresh the clean room, apply the series, tag the baseline, render the feature."""
    cfg = load(config)
    err.print(f"[bold]dcaforge apply[/] {escape(str(cfg.describe()))} -> {escape(str(cfg.room))}", markup=True)

    def on_patch(i: int, n: int, p: Patch) -> None:
        err.print(f"  [{i + 1}/{n}] {p.name} ({p.style})", markup=False)

    def on_step(s: str) -> None:
        err.print(f"  {s}", markup=False)

    download = DownloadBar(err)
    try:
        res = call(lambda: do_apply(cfg, fresh=fresh, cont=cont, include_wip=include_wip, render=not no_render,
                                    hooks=ApplyHooks(on_patch=on_patch, on_step=on_step, on_download=download),
                                    trust=trust, force=force))
    finally:
        download.close()
    if as_json:
        print_json("apply", res)
        return
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
