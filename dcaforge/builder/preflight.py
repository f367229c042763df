"""What a build (and its dry run) checks before anything runs: the room has a baseline, the targets are
target names and nothing else, and every file the feature adds is wired into the build."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from dcaforge import guard
from dcaforge.config import Config
from dcaforge.errors import DcaforgeError, MismatchError
from dcaforge.git import rev_parse
from dcaforge.room.cleanroom import BASELINE_TAG, Room
from dcaforge.room.state import RoomState

NO_BASELINE = "the clean room has no baseline yet (the series is not fully applied)"


def require_baseline(room: Room, message: str = NO_BASELINE) -> str:
    """The baseline tag's commit; a DcaforgeError (``message``) when the series is not fully applied."""
    base = rev_parse(room.path, BASELINE_TAG)
    if base is None:
        raise DcaforgeError(message, where=str(room.path), hint="`dcaforge apply --continue`")
    return base


def rendered_sources(state: RoomState) -> list[str]:
    """The files the room's last render wrote (its state's ``rendered``), sorted."""
    return sorted((state.rendered or {}).keys())


def build_targets(cfg: Config, given: Sequence[str] | None, configured: tuple[str, ...], key: str) -> tuple[str, ...]:
    """The targets to build (``--targets``, else the config's), each one a target name and nothing
    else (:func:`guard.make_goal`: never an option, an assignment or ``$(...)``)."""
    if given:
        return tuple(guard.make_goal(t, what="--targets", where="the command line (--targets)") for t in given)
    return tuple(guard.make_goal(t, what=key, where=f"{cfg.describe()} ({key})") for t in configured)


def require_wiring(cfg: Config, room: Room, tree: Path) -> None:
    """The wiring check of the rendered room (see :mod:`dcaforge.feature.wiring`): a file the feature adds
    that the build leaves out stops the build before anything runs."""
    from dcaforge.feature.wiring import check_room

    rendered = rendered_sources(room.load_state())
    base = rev_parse(room.path, BASELINE_TAG)
    if not rendered or base is None:
        return
    rep = check_room(cfg, tree, base, rendered)
    if not rep.ok:
        raise MismatchError(
            f"the {cfg.build.backend} build leaves out {len(rep.missing)} file(s) the feature adds: "
            + ", ".join(r.source for r in rep.missing),
            where=str(tree), details=rep.describe_missing(),
            hint="wire them in the feature's templates (the build lists, rendered as part of the patch), "
                 "then `dcaforge render` and build again; `dcaforge render --check` shows the wiring")


def require_rendered(cfg: Config, room: Room) -> RoomState:
    """A dry run's room must be "series applied and feature rendered", as capture requires it (an unrendered room
    would pass: the feature adds no file there); returns the room's state."""
    from dcaforge.patch.capture import check_whole

    return check_whole(cfg, room, "nothing checked by the dry run", "`dcaforge build --dry-run`")
