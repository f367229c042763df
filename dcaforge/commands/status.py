"""``dcaforge status``: where the clean room stands, as lines or JSON."""

from __future__ import annotations

from typing import Any

from dcaforge.commands.common import ConfigOpt, JsonOpt, call, load, out, pasteable, print_json
from dcaforge.patch.status import status as do_status


def status(
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Source, series progress, baseline, render and patch freshness."""
    cfg = load(config)
    res = call(lambda: do_status(cfg))
    if as_json:
        print_json("status", res)
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
    if res.interrupted:
        rows.append(("interrupted", f"apply stopped while {res.interrupted}"))
    if res.failed:
        rows.append(("failed at", f"{res.failed.get('patch')} {res.failed.get('file') or ''} {res.failed.get('hunk') or ''}"))
    if res.source_uncommitted:
        rows.append(("source wip", ", ".join(res.source_uncommitted)))
    if res.source_submodules_wip:
        rows.append(("submodule wip", ", ".join(res.source_submodules_wip) + " (uncommitted files inside; "
                     "--include-wip copies them)"))
    if res.unsafe_config:
        rows.append(("room config", "UNSAFE: .git/config sets " + ", ".join(res.unsafe_config)
                     + pasteable(" (could run commands); `dcaforge apply` removes them")))
    if res.next:
        rows.append(("next", pasteable(res.next) if not res.interrupted else
                     pasteable(f"interrupted, run apply again: {res.next} goes on from where it stopped")))
    for k, v in rows:
        out.print(f"{k:<11} {v}", markup=False)
