"""Where a build runs: the clean room itself, or the baseline's git worktree ``<workspace>/<name>-baseline``
(the ``dcaforge/baseline`` tag checked out next to the room; moving it to a new baseline checks out only the
files that changed, so its build stays incremental too); and the build outputs inside a tree kept out of
``capture``."""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from dcaforge import guard
from dcaforge.config import Config
from dcaforge.errors import DcaforgeError, SafetyError
from dcaforge.git import git, rev_parse
from dcaforge.room.cleanroom import BASELINE_TAG, Room


def baseline_path(cfg: Config) -> Path:
    return cfg.workspace / f"{cfg.name}-baseline"


def _worktree_gitdir(wt: Path) -> Path | None:
    """The gitdir a worktree's ``.git`` file points to, or None when it is not such a file."""
    dotgit = wt / ".git"
    if not dotgit.is_file():
        return None
    text = dotgit.read_text(errors="replace").strip()
    if not text.startswith("gitdir:"):
        return None
    return Path(text.split(":", 1)[1].strip())


def ensure_baseline_worktree(cfg: Config, room: Room, keep: Sequence[str] = ()) -> Path:
    """``<workspace>/<name>-baseline``: a detached worktree of the room at the baseline tag.
    A worktree at an older baseline is checked out forward (only changed files are written); one
    whose room was re-made is re-added, its build folders (``keep``) moved over."""
    rev = rev_parse(room.path, BASELINE_TAG)
    if rev is None:
        raise DcaforgeError("the clean room has no baseline (the series is not fully applied)",
                            where=str(room.path), hint="`dcaforge apply --continue`")
    wt = guard.own_folder(baseline_path(cfg), "the baseline worktree",
                          hint="move it away: dcaforge makes the baseline worktree itself (a git worktree of the "
                               "clean room); then run the same `dcaforge build --baseline` again")
    if wt.exists():
        gitdir = _worktree_gitdir(wt)
        ours = gitdir is not None and (room.path / ".git" / "worktrees") in gitdir.parents
        if not ours:
            if any(wt.iterdir()):
                raise SafetyError(f"{wt} exists and is not a worktree of the clean room; refusing to touch it",
                                  where=str(wt), hint="move that folder away, or choose another 'name:'")
            wt.rmdir()
        elif gitdir is not None and gitdir.is_dir():
            _move_forward(wt, rev)
            return wt
        else:  # the room was made again: its worktree record is gone
            _add_again(room, wt, rev, keep)
            return wt
    git(room.path, "worktree", "prune")
    git(room.path, "worktree", "add", "-q", "--detach", wt, rev)
    return wt


def _move_forward(wt: Path, rev: str) -> None:
    """The worktree checked out at ``rev`` (only the files that changed are written)."""
    head = rev_parse(wt, "HEAD")
    if head != rev:
        git(wt, "checkout", "-q", "--detach", "--force", rev)
        git(wt, "clean", "-q", "-fd")


def _add_again(room: Room, wt: Path, rev: str, keep: Sequence[str]) -> None:
    """A worktree whose room was made again (its worktree record is gone): added again at ``rev``, its build
    folders (``keep``) parked beside it meanwhile and moved back."""
    parked = room.workspace / f".{wt.name}.parked"
    guard.remove_leftover(parked, "the baseline's build folders while its worktree is made again")
    parked.mkdir()
    _move_folders(wt, parked, keep)
    shutil.rmtree(wt)
    git(room.path, "worktree", "prune")
    git(room.path, "worktree", "add", "-q", "--detach", wt, rev)
    _move_folders(parked, wt, keep)
    shutil.rmtree(parked)


def _move_folders(src: Path, dst: Path, rels: Sequence[str]) -> None:
    for rel in rels:
        if (src / rel).is_dir():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            os.replace(src / rel, dst / rel)


def exclude_output(room: Room, tree: Path, rel: str, *, folder: bool = True) -> None:
    """Keep a build output inside the tree out of ``capture``: add it to the room's
    ``.git/info/exclude`` (shared by its worktrees) unless git already ignores it."""
    probe = rel.rstrip("/") + ("/" if folder else "")
    if git(tree, "check-ignore", "-q", "--no-index", probe, check=False).returncode == 0:
        return
    info = room.path / ".git" / "info" / "exclude"
    info.parent.mkdir(parents=True, exist_ok=True)
    line = "/" + probe
    text = info.read_text() if info.exists() else ""
    if line not in text.splitlines():
        with open(info, "a", encoding="utf-8") as fh:
            fh.write(("\n" if text and not text.endswith("\n") else "") + line + "\n")
