"""The clean room's start: making it (clone, checkout, submodules flattened into the tree, the
source's uncommitted files when asked, the bootstrap steps), tagged ``dcaforge/start``, and going
back to it (``apply --fresh`` on a room made from the same pinned commit, submodules and steps).

The room is made in a temporary folder beside its place and moved there only when whole, so an
interrupt or an error leaves nothing half made.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dcaforge import confine, guard
from dcaforge import trust as consent
from dcaforge.config import Config
from dcaforge.errors import ConfigError, DcaforgeError, SafetyError
from dcaforge.git import git, git_out, repair_repo_config, rev_parse
from dcaforge.room.bootstrap import BootstrapReport, SubmoduleReport, absent_error, checkout_modules, init_submodules, run_bootstrap
from dcaforge.room.cleanroom import BASELINE_TAG, START_TAG, Room
from dcaforge.room.source import BaseSource
from dcaforge.room.state import Phase, RoomState


def _copy_wip(base: BaseSource, room: Path, notes: list[str]) -> list[str]:
    """Copy the source checkout's uncommitted files (its submodules' included, when the room has
    their files) into the new room; every destination confined to the room's tree."""
    info = base.checkout
    if info is None:
        return []
    copied: list[str] = []
    hint = "commit or remove that file in the source checkout, or make the room without --include-wip"
    skipped_subs: set[str] = set()
    for rel in info.uncommitted:
        sub = next((s for s in info.submodules_wip if rel.startswith(s + "/")), None)
        if sub is not None and (not (room / sub).is_dir() or not any((room / sub).iterdir())):
            skipped_subs.add(sub)
            continue
        src = info.toplevel / rel
        if src.is_dir() and not src.is_symlink():
            continue  # a submodule at another commit (its files are listed one by one when they differ)
        dst = confine.resolve_in(room, rel, what="uncommitted file", where=f"{src} (--include-wip)", hint=hint)
        dst.parent.mkdir(parents=True, exist_ok=True)
        if dst.is_symlink() or dst.exists():
            dst.unlink()
        if src.is_symlink():
            target = os.readlink(src)
            problem = confine.symlink_target_problem(rel, target)
            if problem:
                raise SafetyError(f"uncommitted symlink {rel} {problem}; refusing to copy it", where=str(src), hint=hint)
            os.symlink(target, dst)
        else:
            shutil.copy2(src, dst)  # reads the source, writes only the room
        copied.append(rel)
    for rel in info.deleted:
        if any(rel.startswith(s + "/") for s in skipped_subs):
            continue
        dst = confine.resolve_in(room, rel, what="file deleted in the source checkout", where=f"{info.toplevel / rel}",
                                 hint=hint)
        if dst.is_file() or dst.is_symlink():
            dst.unlink()
            copied.append(rel)
    for sub in sorted(skipped_subs):
        notes.append(f"--include-wip: left out the uncommitted files of submodule {sub} (the clean room does not "
                     "check out submodules: set source.submodules)")
    return copied


def _flatten_submodules(room: Path, subs: SubmoduleReport) -> list[str]:
    """Make submodules plain folders of the room's tree, so one diff covers everything: each one's
    gitlink is removed from its PARENT's index (the superproject's, or the enclosing submodule's:
    ``stable-diffusion.cpp/ggml`` is an entry of stable-diffusion.cpp's index), deepest first; the
    top-level ones' files are then added to the superproject (a nested one's come with its parent's).
    A submodule left out (``subs.absent``) keeps an empty folder and no index entry."""
    checked = list(subs.paths)
    every = checked + [a.path for a in subs.absent]

    def parent(path: str) -> str:
        return max((p for p in checked if path.startswith(p + "/")), key=len, default="")

    for sub in sorted(every, key=lambda p: -p.count("/")):
        gitfile = room / sub / ".git"
        up = parent(sub)
        repo = room / up if up else room
        rel = sub[len(up) + 1:] if up else sub
        git(repo, "rm", "-q", "--cached", "--", rel)
        if gitfile.is_file() or gitfile.is_symlink():
            gitfile.unlink()
        elif gitfile.is_dir():
            shutil.rmtree(gitfile)
    for sub in sorted(p for p in checked if not parent(p)):
        git(room, "add", "-f", "--", sub)
    if every:
        git(room, "commit", "-q", "--no-verify", "-m", "dcaforge: flatten submodules into the tree\n")
    return checked


def _check_absent(subs: SubmoduleReport, room: Path, base: BaseSource, cfg: Config, notes: list[str]) -> None:
    """Submodules left out (no clone of the checkout holds their commit): fine when the bootstrap
    deleted their folders, an error naming the cause when a folder is still there."""
    if not subs.absent:
        return
    kept = [a for a in subs.absent if (room / a.path).exists()]
    if kept:
        raise absent_error(kept, base.checkout.toplevel if base.checkout else None,
                           "and no bootstrap step deletes its folder" if cfg.bootstrap else "and there is no bootstrap "
                           "that deletes its folder")
    notes.append("submodules the bootstrap deletes, not checked out (in no clone of your checkout): "
                 + ", ".join(a.path for a in subs.absent))


@dataclass
class Started:
    """What making the room found worth telling (notes), and the source's uncommitted files it copied."""

    notes: list[str] = field(default_factory=list)
    wip_included: list[str] = field(default_factory=list)


def create(cfg: Config, room: Room, base: BaseSource, *, include_wip: bool, trust: bool,
           on_step: Callable[[str], None] | None = None) -> Started:
    """Make the clean room: clone ``base`` (committed state only) into a temporary folder beside it,
    check out the ref, its submodules (flattened into the tree), the source's uncommitted files
    (``include_wip``), run the bootstrap steps (commands only when ``trust``ed, see
    :mod:`dcaforge.trust`), tag the start commit and mark the folder as dcaforge's; then move it
    into place. Whatever stops it leaves nothing behind."""
    result = Started()
    room.check_can_create()
    trusted = consent.require(cfg, trust)  # before anything is made: a refusal leaves nothing behind
    room.workspace.mkdir(parents=True, exist_ok=True)
    tmp = room.workspace / f".{room.path.name}.creating"
    modules = room.workspace / f".{room.path.name}.modules"  # stand-ins for the checkout's submodule clones
    guard.remove_leftover(tmp, "a clean room being made")
    guard.remove_leftover(modules, "the stand-ins for the source checkout's submodule clones")
    step = on_step or (lambda s: None)
    try:
        commit = _clone(base, room, tmp, result, step)
        subs = _submodules(base, tmp, modules, result, step)
        check_llama_cpp_dir(cfg, tmp)
        (tmp / ".git" / "dcaforge").mkdir(parents=True, exist_ok=True)
        if include_wip:
            result.wip_included = _copy_wip(base, tmp, result.notes)
            git(tmp, "add", "-A", ".")
            git(tmp, "commit", "-q", "--no-verify", "--allow-empty", "-m",
                "dcaforge: uncommitted work copied from the source checkout\n")
        _bootstrap(cfg, base, tmp, subs, trusted, result, step)
        git(tmp, "tag", "-f", START_TAG, "HEAD")
        marker = Room(tmp, room.workspace)
        marker.mark({"config": cfg.describe(), "source": base.description})
        marker.save_state(RoomState(phase=Phase.CREATED, source=base.description, base=commit,
                                    start=git_out(tmp, "rev-parse", "HEAD"), config=cfg.describe(),
                                    bootstrap=bootstrap_record(cfg), submodules=submodules_record(base),
                                    wip=bool(include_wip)))
        if room.path.exists():
            room.path.rmdir()  # an empty folder (check_can_create) or nothing
        os.replace(tmp, room.path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(modules, ignore_errors=True)
        raise
    return result


def _clone(base: BaseSource, room: Room, tmp: Path, result: Started, step: Callable[[str], None]) -> str:
    """Clone ``base`` into ``tmp`` and check out its ref; returns the commit."""
    step(f"cloning {base.description}")
    clone = ["clone", "-q", "--no-checkout"]
    if base.checkout is not None:
        clone.append("--no-hardlinks")  # never share inodes with the user's repository
    git(room.workspace, *clone, "--", base.clone_url, str(tmp),
        hint="check source.git / source.ref in the config")
    commit = rev_parse(tmp, base.ref) or rev_parse(tmp, f"origin/{base.ref}")
    if commit is None:
        raise ConfigError(f"ref {base.ref!r} not found in {base.clone_url}", where="source.ref",
                          hint=f"see the refs it has: `git ls-remote {shlex.quote(base.clone_url)}`")
    step(f"checking out {commit[:12]}")
    git(tmp, "checkout", "-q", "--detach", commit, "--")
    if not re.fullmatch(r"[0-9a-f]{40}", base.ref) and base.ref != commit:
        result.notes.append(f"source.ref {base.ref!r} is {commit}; pin that commit in the config "
                            "(a branch or tag can move)")
    return commit


def _submodules(base: BaseSource, tmp: Path, modules: Path, result: Started,
                step: Callable[[str], None]) -> SubmoduleReport:
    """The submodules the source names, checked out and flattened into the tree (none: an empty report)."""
    subs = SubmoduleReport()
    if not base.submodules:
        return subs
    paths = list(base.submodules) if isinstance(base.submodules, tuple) else None
    step("checking out submodules")
    try:
        init_submodules(tmp, paths, checkout_modules(base.checkout), subs, modules)
    finally:
        shutil.rmtree(modules, ignore_errors=True)
    unknown = [p for p in paths or [] if p not in subs.listed]
    if unknown:
        raise ConfigError(f"source.submodules names {', '.join(unknown)}, which no .gitmodules declares",
                          where="source.submodules",
                          hint="declared: " + (", ".join(sorted(subs.declared)) or "none") + " (a nested one "
                          "as parent/path, with its parent listed)")
    for sub, local in sorted(subs.local.items()):
        result.notes.append(f"submodule {sub} cloned from your checkout's {local}")
    result.notes.append("flattened submodules: " + ", ".join(_flatten_submodules(tmp, subs)))
    return subs


def _bootstrap(cfg: Config, base: BaseSource, tmp: Path, subs: SubmoduleReport, trusted: consent.Trust | None,
               result: Started, step: Callable[[str], None]) -> None:
    """Run the bootstrap steps in ``tmp`` (its commands shown first, when trusted), then check what they left."""
    if trusted is not None:
        cmds = consent.commands(cfg)
        step(f"bootstrap: running {len(cmds)} command{'s' if len(cmds) != 1 else ''} of {cfg.describe()} "
             f"(trusted: {trusted.why}):")
        for c in cmds:
            for k, line in enumerate(consent.full_text(c).splitlines()):
                step(("  $ " if k == 0 else "    ") + line)
    try:
        boot = run_bootstrap(cfg, tmp, on_step=step)
    except DcaforgeError as exc:
        if subs.absent:
            exc.hint = (exc.hint or "") + ("; note: not checked out (in no clone of your checkout): "
                                           + ", ".join(a.path for a in subs.absent))
        raise
    _check_absent(subs, tmp, base, cfg, result.notes)
    removed = repair_repo_config(tmp / ".git")
    if removed:
        result.notes.append("bootstrap: removed settings from the room's .git/config that could make git run "
                            f"commands: {', '.join(removed)}")
    check_llama_cpp_dir(cfg, tmp)
    _bootstrap_notes(boot, result.notes)


def _bootstrap_notes(boot: BootstrapReport, notes: list[str]) -> None:
    if boot.patches:
        n = len(boot.patches)
        notes.append(f"bootstrap: {n} patch{'es' if n != 1 else ''} of the tree applied (patch -p1 --fuzz=0)")
    if boot.ignored_committed:
        n = len(boot.ignored_committed)
        notes.append(f"bootstrap: committed {n} file{'s' if n != 1 else ''} the tree's .gitignore "
                     f"ignores: {', '.join(boot.ignored_committed[:5])}"
                     + (" ..." if len(boot.ignored_committed) > 5 else ""))
    if boot.ignored_folders:
        notes.append(f"bootstrap: left ignored folders out of the start commit: {', '.join(boot.ignored_folders[:5])}")


def check_llama_cpp_dir(cfg: Config, tree: Path) -> None:
    where = f"llama_cpp_dir in {cfg.describe()}"
    hint = "set llama_cpp_dir to the folder of the tree that holds llama.cpp (`.` when it is the whole tree)"
    if cfg.llama_cpp_dir not in ("", "."):
        confine.resolve_in(tree, cfg.llama_cpp_dir, what="llama_cpp_dir", where=where, hint=hint)
    if not (tree / cfg.llama_cpp_dir).is_dir():
        raise ConfigError(f"llama_cpp_dir {cfg.llama_cpp_dir!r} is not a folder of the source tree", where=where,
                          hint=hint)


def bootstrap_record(cfg: Config) -> list[Any]:
    return [s.record() for s in cfg.bootstrap]


def submodules_record(base: BaseSource) -> bool | list[str]:
    return list(base.submodules) if isinstance(base.submodules, tuple) else bool(base.submodules)


def can_reset(cfg: Config, state: RoomState, base: BaseSource, include_wip: bool) -> bool:
    """Can ``--fresh`` reuse this room (reset to its start) instead of cloning again? Only when
    the same pinned commit, submodules and bootstrap made it: the start commit is then exactly
    what a new clone would give (submodule commits are pinned by the superproject commit)."""
    if include_wip or state.wip or not state.start:
        return False
    if state.source != base.description or state.bootstrap != bootstrap_record(cfg):
        return False
    if (state.submodules if state.submodules is not None else False) != submodules_record(base):
        return False
    if not re.fullmatch(r"[0-9a-f]{40}", base.ref):  # a branch or tag may have moved
        return False
    return state.base == base.ref and rev_parse(cfg.room, START_TAG) == state.start


def reset_to_start(room: Room, state: RoomState) -> None:
    """Back to the start commit, every other file (ignored ones included) removed; recorded as
    ``resetting`` first, so an interrupted reset is done again by the next apply."""
    keep = RoomState(source=state.source, base=state.base, start=state.start, config=state.config,
                     bootstrap=state.bootstrap, submodules=state.submodules)
    room.save_state(replace(keep, phase=Phase.RESETTING))
    git(room.path, "tag", "-d", BASELINE_TAG, check=False)
    room.reset_hard(START_TAG, everything=True)
    room.save_state(replace(keep, phase=Phase.CREATED))
