"""``dcaforge capture``: the clean room's work tree against the baseline, as one git patch.

The bytes depend on nothing but the two trees (and git's diff algorithm): the isolated git
config, ``--full-index --binary --no-renames`` and fixed prefixes. Untracked files are
included through a temporary index (never the room's own index); ignored files are not.
"""

from __future__ import annotations

import hashlib
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from dcaforge.config import Config, is_packaged, read_only_default
from dcaforge.errors import DcaforgeError
from dcaforge.feature import bookkeeping
from dcaforge.feature.bookkeeping import DocUpdate, check_not_managed, check_outside_trees
from dcaforge.room.cleanroom import Room, locked, os_error, write_all_atomic
from dcaforge.room.state import Captured, Phase, RoomState
from dcaforge.room.trees import baseline_tree, changed_paths, tree_diff, worktree_tree


@dataclass
class CaptureResult:
    path: Path
    written: bool
    size: int
    sha256: str
    tree: str
    files: list[str] = field(default_factory=list)
    bookkeeping: list[DocUpdate] = field(default_factory=list)  # the README row / UPSTREAM_SYNC entry
    bookkeeping_skipped: bool = False  # configured, but -o wrote the patch outside the series


def check_whole(cfg: Config, room: Room, done: str = "nothing captured", then: str = "capture") -> RoomState:
    """The room must be "series applied and feature rendered": what capture writes is then the
    feature, not a half-made tree. Returns the room's state. ``done``/``then``: the message's start and the
    command to run after the fix (``build --dry-run`` refuses such a room the same way)."""
    state = room.load_state()
    phase = state.phase
    if phase != Phase.APPLIED:
        stopped: dict[Phase | None, str] = {
            Phase.FAILED: f"the series stopped at {state.failed.patch if state.failed else '?'}",
            Phase.INTERRUPTED: "an apply was interrupted", Phase.APPLYING: "an apply was interrupted",
            Phase.RESETTING: "a reset was interrupted", Phase.CREATED: "the series is not applied yet"}
        what = stopped.get(phase, f"the clean room is not fully applied ({phase})")
        raise DcaforgeError(f"{done}: {what}", where=str(room.path),
                            hint=f"`dcaforge apply --continue` finishes it; then {then}")
    if state.render_error:
        raise DcaforgeError(f"{done}: the last render stopped ({state.render_error})", where=str(room.path),
                            hint="fix the templates (`dcaforge render --check` shows what does not fit), run "
                                 f"`dcaforge render`, then {then}")
    if state.rendering:
        raise DcaforgeError(f"{done}: the last render was interrupted", where=str(room.path),
                            hint=f"`dcaforge render` (or `dcaforge apply --continue`) renders it again; then {then}")
    if (cfg.feature.templates / "manifest.yaml").is_file() and state.rendered is None:
        raise DcaforgeError(f"{done}: the feature is not rendered in the clean room", where=str(room.path),
                            hint=f"`dcaforge render` (or `dcaforge apply`), then {then}")
    return state


def capture(cfg: Config, out: Path | None = None) -> CaptureResult:
    """Write the feature patch (and, when configured and the patch goes to the series, the
    bookkeeping): everything is computed and checked first, then written, all or nothing. A room
    that is not "series applied and feature rendered" is refused, and so is an empty patch."""
    room = Room.of(cfg)
    room.require()
    dest = Path(os.path.abspath(out or cfg.feature_patch))
    check_outside_trees(cfg, dest, "the patch", workspace=False)
    to_series = dest == Path(os.path.abspath(cfg.feature_patch))
    if not to_series:
        check_not_managed(cfg, dest, "the patch's destination")
    if dest.is_dir():
        raise DcaforgeError(f"cannot write the patch to {dest}: it is a folder", where=str(dest),
                            hint=f"give a file name, e.g. `dcaforge capture -o {shlex.quote(str(dest / cfg.feature.patch_name))}`")
    with locked(room):
        check_whole(cfg, room)
        base = baseline_tree(room)
        tree = worktree_tree(room.path)
        data = tree_diff(room.path, base, tree)
        if not data:
            raise DcaforgeError("nothing captured: the clean room has no changes against the baseline, and an empty "
                                "patch is never written" + (f" (the existing {dest.name} is kept)" if dest.exists() else ""),
                                where=str(room.path),
                                hint="`dcaforge render` (or `dcaforge apply`) puts the feature into the clean room; then capture")
        files = changed_paths(room.path, base, tree)
        sha = hashlib.sha256(data).hexdigest()
        updates = bookkeeping.plan(cfg, dest, data, files, sha) if to_series else []
        try:
            old = dest.read_bytes() if dest.is_file() else None
        except OSError as exc:
            raise os_error(exc, dest, "the patch") from None
        writes = [(dest, data, 0o644)] if old != data else []
        if writes and is_packaged(dest):
            raise read_only_default("capture", dest)
        write_all_atomic(writes + bookkeeping.writes(updates), "the patch")
        room.update_state(captured=Captured(patch=str(dest), sha256=sha, tree=tree))
        return CaptureResult(path=dest, written=old != data, size=len(data), sha256=sha, tree=tree, files=files,
                             bookkeeping=updates, bookkeeping_skipped=bool(cfg.bookkeeping.docs) and not to_series)
