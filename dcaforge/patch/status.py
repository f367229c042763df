"""``dcaforge status``: where the clean room stands (reads only; evaluates nothing a user wrote:
no template, ``when:`` or bookkeeping row is rendered, and no git runs in a room whose
.git/config could make it run a command)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from dcaforge.checkout import inspect_checkout
from dcaforge.config import Config, GitSource
from dcaforge.errors import DcaforgeError
from dcaforge.feature.manifest import manifest_digest
from dcaforge.feature.render import hand_edited_files
from dcaforge.git import config_problems
from dcaforge.patch.discover import discover, series_record
from dcaforge.patch.series import applied_names
from dcaforge.room.cleanroom import Room
from dcaforge.room.state import Phase, RoomState
from dcaforge.room.trees import baseline_tree, tree_diff, worktree_tree


@dataclass
class StatusResult:
    config: str
    source: str
    room: str
    room_exists: bool
    phase: str | None = None
    base_commit: str | None = None
    series_total: int = 0
    series_applied: int = 0
    series_changed: bool = False
    failed: dict[str, Any] | None = None
    baseline: str | None = None
    rendered: bool = False
    templates_changed: bool = False
    render_error: str | None = None  # the last render stopped (capture refuses the room)
    dirty: list[str] = field(default_factory=list)  # hand edits beyond the last render
    source_uncommitted: list[str] = field(default_factory=list)
    source_submodules_wip: list[str] = field(default_factory=list)  # submodules of the source with uncommitted files
    unsafe_config: list[str] = field(default_factory=list)  # settings in the room's .git/config dcaforge refuses
    patch: str = ""
    patch_state: str = "unknown"  # fresh | stale | missing | unknown | interrupted (not compared: the room is half made)
    interrupted: str | None = None  # what an apply was doing when it stopped (Ctrl-C, a kill), e.g. "applying the series"
    next: str | None = None  # the command that goes on from here, when the room needs one

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def status(cfg: Config) -> StatusResult:
    room = Room.of(cfg)
    res = StatusResult(config=cfg.describe(), source=cfg.source.describe(), room=str(room.path),
                       room_exists=room.is_ours(), patch=str(cfg.feature_patch))
    if isinstance(cfg.source, GitSource) and cfg.source.local_path is not None:
        info = inspect_checkout(cfg.source.local_path)
        if info is not None:
            res.source_uncommitted = list(info.uncommitted) + list(info.deleted)
            res.source_submodules_wip = list(info.submodules_wip)
    patches = discover(cfg)
    res.series_total = len(patches)
    if not room.is_ours():
        res.patch_state = "missing" if not cfg.feature_patch.is_file() else "unknown"
        return res
    state = room.load_state()
    res.phase = state.phase.value if state.phase else None
    res.base_commit = state.base
    res.unsafe_config = config_problems(room.path / ".git" / "config")
    if res.unsafe_config:
        return res  # no git runs there until a command that takes the room has removed them
    res.series_changed = state.series not in (None, series_record(patches))
    res.failed = dataclasses.asdict(state.failed) if state.failed else None
    res.series_applied = len(applied_names(room.path))
    res.baseline = state.baseline
    res.rendered = bool(state.rendered)
    res.render_error = state.render_error
    if res.rendered and (cfg.feature.templates / "manifest.yaml").is_file():
        res.templates_changed = state.templates_digest != manifest_digest(cfg.feature.templates)
    res.dirty = hand_edited_files(room, state)
    res.interrupted = _interrupted(state)
    if res.interrupted is not None:
        # a half-made room says nothing about the patch (its diff is not the feature's yet): not "stale"
        res.patch_state = "interrupted" if cfg.feature_patch.is_file() else "missing"
        res.next = "`dcaforge apply --continue`"
        return res
    if res.phase == "failed":
        res.next = "`dcaforge apply --continue` once the patch is fixed (or resolved in the clean room)"
    if not cfg.feature_patch.is_file():
        res.patch_state = "missing"
    elif res.baseline:
        try:
            current = tree_diff(room.path, baseline_tree(room), worktree_tree(room.path))
        except DcaforgeError:
            res.patch_state = "unknown"
        else:
            same = current == cfg.feature_patch.read_bytes()
            # the room's diff is only the feature while the templates still render to it
            res.patch_state = "fresh" if same and not res.templates_changed and not res.render_error else "stale"
    return res


#: what an apply was doing when it stopped, by the phase it left in the room's state
_STOPPED = {Phase.INTERRUPTED: "applying the series", Phase.APPLYING: "applying the series",
            Phase.CREATED: "applying the series", Phase.CREATING: "making the clean room",
            Phase.RESETTING: "resetting the clean room"}


def _interrupted(state: RoomState) -> str | None:
    """What an interrupted ``apply`` was doing (None: it was not interrupted): the series (the room stays at its last
    patch), a reset, or the render (``rendering`` is set while the render writes and cleared when it is done)."""
    phase = state.phase
    if phase in _STOPPED:
        return _STOPPED[phase]
    if phase == Phase.APPLIED and state.rendering:
        return "rendering the feature"
    return None
