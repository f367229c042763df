"""The patch series applied one commit per patch, and ``dcaforge apply`` (the series is found and checked
by :mod:`dcaforge.patch.discover`; the room's start is made, or gone back to, by :mod:`dcaforge.room.start`;
the feature rendered on top).

git-style patches go through ``git apply --index --whitespace=nowarn`` and, when the blobs
of their ``index`` lines exist, a ``--3way`` retry; plain unified diffs (llamafile's own
patches) through ``patch -p1 --fuzz=0`` (dry run first, so a failure writes nothing). Never
fuzz. On failure the room is put back at the last good patch and the error names the patch,
the file, the hunk header and the tool's reason, and how to resume.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dcaforge import confine
from dcaforge.config import Config
from dcaforge.errors import CommandError, ConfigError, DcaforgeError, InterruptedRun, MismatchError, SafetyError
from dcaforge.feature.render import hand_edited_files, render_feature
from dcaforge.git import git, git_out, patch_cmd, status_porcelain
from dcaforge.patch.discover import check_series, confine_hint, discover, series_record
from dcaforge.patchfile import Failure, Patch, git_failure, gnu_failure, gnu_names, numstat_names, preimage_blobs, read_patch
from dcaforge.room.blame import TRAILER
from dcaforge.room.cleanroom import BASELINE_TAG, START_TAG, Room, locked
from dcaforge.room.source import BaseSource, prepare
from dcaforge.room.start import bootstrap_record, can_reset, create, reset_to_start, submodules_record
from dcaforge.room.state import Failed, Phase, RoomState


def _preimages_exist(room: Path, patch: Patch) -> bool:
    olds = preimage_blobs(patch)
    if not olds:
        return False
    res = git(room, "cat-file", "--batch-check", input="".join(f"{o}\n" for o in olds).encode(), check=False)
    return res.ok and "missing" not in res.stdout


# --- what a patch may touch ------------------------------------------------------------------

def confine_patch(room: Path, patch: Patch, *, strip: int = 1, resume: bool = True) -> confine.ParsedPatch:
    """Refuse ``patch`` (before it is applied to ``room``) when a path it names is not a file of the
    tree: as text, and as resolved in the room's tree as it is now (symlinks followed); for a git
    patch, git's own reading of it (``git apply --numstat``) must name nothing else."""
    hint = confine_hint(patch, resume)
    ref = confine.PatchRef(patch.name, patch.path)
    parsed = read_patch(patch, strip)
    confine.check_patch_text(ref, parsed, hint)
    confine.check_patch_tree(ref, parsed, room, hint)
    if patch.style == "git":
        res = git(room, "apply", "--numstat", "-z", str(patch.path), check=False)
        if res.ok:
            confine.check_tool_paths(ref, parsed, "git apply", numstat_names(res.stdout_bytes), hint)
    return parsed


def apply_one(room: Path, patch: Patch) -> tuple[Failure | None, str]:
    """Apply ``patch`` to the work tree and index of ``room`` (not committed), once
    :func:`confine_patch` found every path it names inside the tree.

    Returns (failure, method); on failure nothing was changed that a reset would not undo.
    """
    parsed = confine_patch(room, patch)
    if patch.style == "git":
        res = git(room, "apply", "--index", "--whitespace=nowarn", str(patch.path), check=False)
        if res.ok:
            return None, "git apply"
        if _preimages_exist(room, patch):
            three = git(room, "apply", "--index", "--3way", "--whitespace=nowarn", str(patch.path), check=False)
            if three.ok:
                return None, "git apply --3way"
            fail = git_failure(patch, res.stderr)
            return Failure(fail.patch, fail.file, fail.hunk,
                           fail.reason + "\n3-way merge: " + (three.stderr.strip() or "conflicts")), "git apply --3way"
        return git_failure(patch, res.stderr), "git apply"
    dry = patch_cmd(room, patch.path, dry_run=True)
    confine.check_tool_paths(confine.PatchRef(patch.name, patch.path), parsed, "GNU patch", gnu_names(dry.stdout),
                             confine_hint(patch, resume=True))
    if not dry.ok:
        return gnu_failure(patch, dry.stdout + dry.stderr), "patch -p1"
    real = patch_cmd(room, patch.path, dry_run=False)
    if not real.ok:
        return gnu_failure(patch, real.stdout + real.stderr), "patch -p1"
    touched = sorted(set(gnu_names(real.stdout)))
    # stage what the patch touched (all of the tree when GNU patch named no file)
    git(room, "--literal-pathspecs", "add", "-A", "--", *(touched or ["."]))
    return None, "patch -p1"


def commit_message(patch: Patch, note: str = "") -> str:
    msg = f"{patch.stem}\n\n{TRAILER}: {patch.name}\ndcaforge-sha256: {patch.sha256}\n"
    if note:
        msg += f"dcaforge-note: {note}\n"
    return msg


def applied_names(room: Path) -> list[str]:
    """Names of the patches committed on top of the start tag, in order."""
    out = git_out(room, "log", "--reverse", "--format=%B%x00", f"{START_TAG}..HEAD", "--")
    names = []
    for body in out.split("\0"):
        m = re.search(rf"^{TRAILER}: (.+)$", body, re.MULTILINE)
        if m:
            names.append(m.group(1).strip())
    return names


# --- the apply command ------------------------------------------------------------------

@dataclass
class ApplyHooks:
    """Callbacks the CLI uses for progress (and tests to interrupt at a chosen patch)."""

    on_patch: Callable[[int, int, Patch], None] | None = None
    on_step: Callable[[str], None] | None = None
    on_download: Callable[[int, int | None], None] | None = None  # the sdist's bytes so far, its size (another thread)


@dataclass
class ApplyResult:
    room: Path
    source: str
    start: str
    total: int
    applied_now: list[str] = field(default_factory=list)
    skipped_to: int = 0  # patches already applied before this run
    methods: dict[str, str] = field(default_factory=dict)
    baseline: str | None = None
    created: bool = False
    wip_included: list[str] = field(default_factory=list)
    wip_left_behind: list[str] = field(default_factory=list)
    render: Any = None  # render.RenderResult, or None when the feature has no templates yet
    notes: list[str] = field(default_factory=list)


def by_hand(room: Path, patch: Patch, three_way: bool) -> str:
    """A command that applies what it can of ``patch`` in ``room`` and leaves the rest to resolve by
    hand (only options the tools take together: git refuses ``--3way`` with ``--reject``)."""
    r, p = shlex.quote(str(room)), shlex.quote(str(patch.path))
    if patch.style == "git" and three_way:
        return f"`git -C {r} apply --3way {p}` leaves conflict markers in the files to resolve"
    rejects = ("applies the hunks that fit and leaves each other one in a FILE.rej beside its file (apply those by "
               "hand, then delete the .rej files)")
    if patch.style == "git":
        return f"`git -C {r} apply --reject {p}` {rejects}"
    return f"`patch -d {r} -p1 --no-backup-if-mismatch -i {p}` {rejects}"


def _failure_error(fail: Failure, room: Path, index: int, total: int, three_way: bool) -> MismatchError:
    return MismatchError(
        f"patch {index + 1}/{total} {fail.patch.name} does not apply; the clean room stays at the last good "
        f"patch ({index}/{total})",
        where=fail.where(f"{fail.patch.path}"),
        details=fail.reason,
        hint=(f"fix {fail.patch.path} and run `dcaforge apply --continue`; or resolve it by hand in the clean room "
              f"({by_hand(room, fail.patch, three_way)}) and run `dcaforge apply --continue` to commit your "
              f"resolution as this patch; `dcaforge apply --fresh` starts over"),
    )


def _dirty_beyond_render(room: Room, state: RoomState) -> list[str]:
    """Changes in the room that the last render did not make (hand edits)."""
    return hand_edited_files(room, state)


def _refuse_to_discard(room: Room, state: RoomState) -> None:
    """``--fresh`` without ``--force``: refuse when the room holds hand edits, naming every file."""
    try:
        hand = _dirty_beyond_render(room, state)
    except DcaforgeError:
        return  # a room git cannot read: --fresh is how it is made again
    if not hand:
        return
    keep = ("`dcaforge templatize` writes them into the feature's templates" if state.phase == Phase.APPLIED else
            "`dcaforge apply --continue` commits them as the patch that stopped")
    raise SafetyError(f"--fresh would discard {len(hand)} hand-edited file{'s' if len(hand) != 1 else ''} in the clean "
                      "room (changes the last render did not make); nothing was changed",
                      where=str(room.path), details="\n".join(hand),
                      hint=f"{keep}; `dcaforge apply --fresh --force` discards them")


_NEXT_AFTER_INTERRUPT = {
    "preparing": "nothing was changed; run `dcaforge apply` again",
    "creating": "nothing was made (the partial clean room was removed); run `dcaforge apply` again",
    "resetting": "run `dcaforge apply --continue`: it finishes the reset, then applies the series",
    "applying": "the clean room is at the last completed patch; `dcaforge apply --continue` resumes from there",
    "rendering": "the series is applied; run `dcaforge apply --continue` to render the feature again",
}


def apply(cfg: Config, *, fresh: bool = False, cont: bool = False, include_wip: bool = False,
          render: bool = True, hooks: ApplyHooks | None = None, trust: bool = False, force: bool = False) -> ApplyResult:
    """``dcaforge apply``: make or refresh the clean room, apply the series, tag the baseline,
    render the feature. ``trust``: the config's bootstrap commands may run (see :mod:`dcaforge.trust`).
    ``fresh`` refuses a room with hand edits (changes the last render did not make) unless ``force``.

    An interrupt (Ctrl-C, SIGTERM) leaves the room at its last completed step and raises
    :class:`InterruptedRun`, whose hint is the command that carries on; after a hard kill,
    ``apply --continue`` carries on from wherever the room is (and starts when no room was made)."""
    hooks = hooks or ApplyHooks()
    if fresh and cont:
        raise DcaforgeError("--fresh and --continue exclude each other", hint="`dcaforge apply --fresh`")
    stage = ["preparing"]
    try:
        return _apply(cfg, fresh, cont, include_wip, render, hooks, trust, force, stage)
    except InterruptedRun:
        raise
    except KeyboardInterrupt:
        what = {"preparing": "preparing the source", "creating": "making the clean room",
                "resetting": "resetting the clean room", "applying": "applying the series",
                "rendering": "rendering the feature"}[stage[0]]
        raise InterruptedRun(f"stopped while {what}", where=str(cfg.room),
                             hint=_NEXT_AFTER_INTERRUPT[stage[0]]) from None


def require_feature(cfg: Config) -> None:
    """The feature folder the config names must be there (a manifest.yaml in it): a config whose paths resolve
    elsewhere than meant (a copied config's root:) is refused before anything is made, naming where they went."""
    folder = cfg.feature.templates
    if (folder / "manifest.yaml").is_file():
        return
    what = "has no manifest.yaml" if folder.is_dir() else "does not exist"
    raise ConfigError(
        f"the feature folder {folder} {what}", where=cfg.feature.where or cfg.describe(),
        details=f"feature.templates resolves against root: {cfg.root} (a relative root: against the config's folder)",
        hint="point feature.templates (or root:) at the folder that holds manifest.yaml, e.g. the templates/dca of "
             "the dcaforge checkout; `dcaforge apply --no-render` applies the series alone")


def _apply(cfg: Config, fresh: bool, cont: bool, include_wip: bool, render: bool, hooks: ApplyHooks, trust: bool,
           force: bool, stage: list[str]) -> ApplyResult:
    if render:
        require_feature(cfg)
    patches = discover(cfg)  # check first: the series is readable, and names nothing outside the tree
    check_series(patches)
    room = Room.of(cfg)
    base = prepare(cfg, trust, hooks.on_download)
    result = _new_result(room, base, patches, include_wip)
    with locked(room):
        cont = _take_room(cfg, room, base, result, stage, fresh=fresh, cont=cont, include_wip=include_wip, force=force)
        if not room.is_ours():
            stage[0] = "creating"
            _make_room(cfg, room, base, result, include_wip=include_wip, trust=trust, hooks=hooks)
        stage[0] = "applying"
        state = room.load_state()
        result.start = _start_commit(room, state)
        phase = state.phase
        if cont and phase == Phase.APPLIED:
            cont = False  # nothing to resume; never reset a finished room (it may hold hand edits)
            result.notes.append("nothing to continue: the series is fully applied")
        names = applied_names(room.path)
        _check_made_alike(cfg, room, state, base)
        if phase == Phase.APPLIED and not cont:
            if state.series == series_record(patches):
                result.skipped_to = len(patches)
                result.baseline = state.baseline
                result.notes.append("series unchanged since the last apply")
                stage[0] = "rendering"
                return _finish(cfg, room, result, render, rebuilt=False)
            names = _restart_series(room, state, result)
        elif phase in (Phase.FAILED, Phase.INTERRUPTED, Phase.APPLYING) and not cont:
            raise _unfinished_error(room, state, names, patches)
        k = _resume_point(room, patches, names, result, cont=cont, phase=phase)
        _apply_series(room, patches, k, result, hooks)
        stage[0] = "rendering"
        return _finish(cfg, room, result, render, rebuilt=True)


def _new_result(room: Room, base: BaseSource, patches: list[Patch], include_wip: bool) -> ApplyResult:
    """The result as far as the source tells it: the checkout's uncommitted files left behind."""
    result = ApplyResult(room=room.path, source=base.description, start="", total=len(patches))
    if base.checkout is not None:
        result.wip_left_behind = list(base.checkout.uncommitted) + list(base.checkout.deleted)
        for sub in base.checkout.submodules_wip:
            result.notes.append(f"the source's submodule {sub} has uncommitted files"
                                + (" (--include-wip copies them)" if not include_wip else ""))
    return result


def _take_room(cfg: Config, room: Room, base: BaseSource, result: ApplyResult, stage: list[str], *, fresh: bool,
               cont: bool, include_wip: bool, force: bool) -> bool:
    """An existing room (called with it locked): an interrupted reset finished, ``--fresh`` resets or deletes it, a
    room never finished is deleted. Returns ``cont``, turned off when there was no room to continue."""
    if room.exists() and room.is_ours():
        try:
            state = room.load_state()
        except DcaforgeError:
            if not fresh:
                raise
            state = RoomState()  # --fresh makes it again
        if fresh and not force and state.phase not in (None, Phase.RESETTING, Phase.CREATING):
            _refuse_to_discard(room, state)
        if state.phase == Phase.RESETTING:
            stage[0] = "resetting"
            reset_to_start(room, state)
            result.notes.append("finished an interrupted reset of the clean room to its start commit")
        elif fresh and can_reset(cfg, state, base, include_wip):
            # same base, bootstrap and no wip: back to the start commit, every other file
            # (ignored ones included) removed; much faster than a new clone and checkout
            stage[0] = "resetting"
            reset_to_start(room, state)
            result.notes.append("fresh: reset the clean room to its start commit")
        elif fresh or state.phase in (None, Phase.CREATING):
            room.delete()
        elif include_wip:
            raise SafetyError("--include-wip only applies when the clean room is made",
                              where=str(room.path), hint="`dcaforge apply --fresh --include-wip`")
    elif cont:
        result.notes.append("nothing to continue: there was no clean room yet, so it is made now")
        cont = False
    return cont


def _make_room(cfg: Config, room: Room, base: BaseSource, result: ApplyResult, *, include_wip: bool, trust: bool,
               hooks: ApplyHooks) -> None:
    made = create(cfg, room, base, include_wip=include_wip, trust=trust, on_step=hooks.on_step)
    result.notes += made.notes
    result.wip_included = made.wip_included
    result.created = True


def _start_commit(room: Room, state: RoomState) -> str:
    """The room's start commit, as its state records it (a state without one is refused, as a corrupt one is)."""
    if state.start is None:
        raise DcaforgeError("the clean room's state file is corrupt: it records no start commit",
                            where=str(room.state_file), hint="`dcaforge apply --fresh`")
    return state.start


def _check_made_alike(cfg: Config, room: Room, state: RoomState, base: BaseSource) -> None:
    """The room must have been made from the source, bootstrap steps and submodules the config now names."""
    if state.source != base.description:
        raise DcaforgeError(
            f"the clean room was made from {state.source}, the config now says {base.description}",
            where=str(room.path), hint="`dcaforge apply --fresh`")
    made_with_submodules = state.submodules if state.submodules is not None else submodules_record(base)
    if (state.bootstrap if state.bootstrap is not None else []) != bootstrap_record(cfg) or \
            made_with_submodules != submodules_record(base):
        raise DcaforgeError(
            "the clean room was made with other bootstrap steps or submodules than the config now has",
            where=f"{room.path} (made with: {state.config})",
            hint="`dcaforge apply --fresh` makes it again with the config's (hand edits in it: `dcaforge templatize` "
                 "writes them into the feature's templates first)")


def _restart_series(room: Room, state: RoomState, result: ApplyResult) -> list[str]:
    """The series changed under an applied room: back to the start (refused while it holds hand edits).
    Returns the names now applied (none)."""
    hand = _dirty_beyond_render(room, state)
    if hand:
        raise SafetyError(
            f"the series changed, and the clean room has changes the last render did not make: "
            f"{', '.join(hand[:5])}{' ...' if len(hand) > 5 else ''}",
            where=str(room.path),
            hint="`dcaforge templatize` writes them into the feature's templates (then run `dcaforge apply` "
                 "again); `dcaforge apply --fresh --force` discards them")
    room.update_state(phase=Phase.APPLYING)
    room.reset_hard(START_TAG)
    result.notes.append("series changed: re-applied from the start")
    return []


def _unfinished_error(room: Room, state: RoomState, names: list[str], patches: list[Patch]) -> DcaforgeError:
    """A previous apply stopped (failed or interrupted) and this one is not ``--continue``."""
    at = state.failed.patch if state.phase == Phase.FAILED and state.failed else None
    return DcaforgeError(
        f"a previous apply {'stopped at ' + at if at else 'was interrupted'} "
        f"({len(names)}/{len(patches)} patches applied)",
        where=str(room.path),
        hint="`dcaforge apply --continue` resumes from there; `dcaforge apply --fresh` starts over")


def _resume_point(room: Room, patches: list[Patch], names: list[str], result: ApplyResult, *, cont: bool,
                  phase: Phase | None) -> int:
    """Where the series goes on: after the patches already applied (a prefix of the series), and after the one
    that failed when ``--continue`` finds it resolved by hand; an interrupted room is reset to its last patch."""
    if names != [p.name for p in patches[: len(names)]]:
        raise DcaforgeError(
            "the series changed under a half-applied clean room",
            where=str(room.path),
            details=f"applied: {', '.join(names[-3:]) or '(none)'}",
            hint="`dcaforge apply --fresh`")
    k = len(names)
    if cont and phase == Phase.FAILED and k < len(patches):
        if _commit_resolution(room, patches[k], result):
            k += 1
    elif cont or phase in (Phase.INTERRUPTED, Phase.APPLYING):
        room.reset_hard("HEAD")
    return k


def _commit_resolution(room: Room, patch: Patch, result: ApplyResult) -> bool:
    """``--continue`` after a failed patch: what the user changed in the room is committed as that patch
    (refused while reject files are left). Returns whether there was anything to commit."""
    changed = status_porcelain(room.path)
    rejects = sorted(e[3:] for e in changed if e.startswith("?? ") and e.endswith(".rej"))
    if rejects:
        raise DcaforgeError(f"the clean room holds {len(rejects)} reject file(s) of a resolution by hand; "
                            "nothing was committed", where=str(room.path), details="\n".join(rejects),
                            hint="apply their hunks by hand and delete the .rej files, then run "
                                 "`dcaforge apply --continue` again")
    if not changed:
        return False
    git(room.path, "add", "-A", ".")
    git(room.path, "commit", "-q", "--no-verify", "--allow-empty", "-m", commit_message(patch, "resolved by hand"))
    result.applied_now.append(patch.name)
    result.methods[patch.name] = "resolved by hand"
    return True


def _apply_series(room: Room, patches: list[Patch], k: int, result: ApplyResult, hooks: ApplyHooks) -> None:
    """Apply patches[k:] and tag the baseline, recording each phase in the room's state."""
    result.skipped_to = k
    room.update_state(phase=Phase.APPLYING, series=series_record(patches), failed=None, rendered=None)
    _apply_range(room, patches, k, result, hooks)
    baseline = room.head()
    git(room.path, "tag", "-f", BASELINE_TAG, baseline)
    room.update_state(phase=Phase.APPLIED, baseline=baseline)
    result.baseline = baseline


def _apply_range(room: Room, patches: list[Patch], k: int, result: ApplyResult, hooks: ApplyHooks) -> None:
    """Apply patches[k:], one commit each. Commits are chained with commit-tree and HEAD is
    moved every few patches (and always before returning or raising), so the room is always
    at a committed patch; a hard kill leaves HEAD behind the index, which `--continue` resets."""
    total = len(patches)
    head = room.head()
    moved = head
    i = k

    def move_head() -> None:
        nonlocal moved
        if moved != head:
            git(room.path, "update-ref", "-m", "dcaforge: series", "HEAD", head)
            moved = head

    try:
        for i in range(k, total):
            patch = patches[i]
            if hooks.on_patch:
                hooks.on_patch(i, total, patch)
            fail, method = apply_one(room.path, patch)
            if fail is not None:
                move_head()
                room.reset_hard("HEAD")
                room.update_state(phase=Phase.FAILED, failed=Failed(
                    patch=patch.name, index=i, file=fail.file, hunk=fail.hunk.header if fail.hunk else None,
                    reason=fail.reason))
                raise _failure_error(fail, room.path, i, total, method == "git apply --3way")
            tree = git_out(room.path, "write-tree")
            head = git_out(room.path, "commit-tree", tree, "-p", head, "-m", commit_message(patch))
            result.applied_now.append(patch.name)
            result.methods[patch.name] = method
            if (i - k) % 10 == 9:
                move_head()
        move_head()
    except KeyboardInterrupt:
        # leave the room at the last committed patch; `apply --continue` resumes there
        move_head()
        room.reset_hard("HEAD")
        room.update_state(phase=Phase.INTERRUPTED, failed=None)
        raise
    except (CommandError, SafetyError, ConfigError) as exc:
        # a command failed, or the patch names a path outside the tree (nothing of it was applied)
        move_head()
        room.reset_hard("HEAD")
        room.update_state(phase=Phase.FAILED, failed=Failed(patch=patches[i].name, index=i, reason=exc.message))
        raise


def _finish(cfg: Config, room: Room, result: ApplyResult, render: bool, rebuilt: bool) -> ApplyResult:
    if not render:
        return result
    if not (cfg.feature.templates / "manifest.yaml").is_file():
        result.notes.append(f"no feature templates at {cfg.feature.templates}: nothing rendered")
        return result
    result.render = render_feature(cfg, room, force=rebuilt)
    return result
