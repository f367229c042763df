"""``dcaforge verify``: the round trip, checked by tree hashes in a scratch index.

Forward-applying the patch to the baseline must give exactly the captured tree, and
reverse-applying it to that tree exactly the baseline (``git write-tree`` hashes: bytes, exec
bits, missing final newlines, new and deleted files). The scratch is a temporary index in the
room's git dir, so nothing is checked out and the room's work tree and index stay untouched.
``fresh_render`` renders the templates again from the baseline into a scratch tree and requires
the patch to be byte-identical to what capture would write (the stale-patch check).
"""

from __future__ import annotations

import difflib
import hashlib
import os
import shlex
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from dcaforge import confine
from dcaforge.config import Config
from dcaforge.errors import DcaforgeError, MismatchError
from dcaforge.feature.manifest import load_manifest, manifest_digest
from dcaforge.feature.plan import plan
from dcaforge.feature.render import hand_edited_files
from dcaforge.git import git, git_out, patch_cmd
from dcaforge.patch.discover import discover, series_record
from dcaforge.patchfile import parse_patch
from dcaforge.room.cleanroom import Room, locked
from dcaforge.room.state import RoomState
from dcaforge.room.trees import (
    GitTree,
    baseline_commit,
    baseline_tree,
    changed_paths,
    first_difference,
    temp_index,
    tree_diff,
    worktree_tree,
    write_tree,
)


@dataclass
class VerifyResult:
    patch: Path
    baseline_tree: str
    expected_tree: str
    expected_from: str  # "capture" | "work tree" | "fresh render"
    forward_tree: str
    reverse_tree: str
    fresh_render: bool = False
    gnu_patch: bool = False
    notes: list[str] = field(default_factory=list)


def _apply_cached(room: Path, env: dict[str, str], patch: Path, reverse: bool) -> str:
    """Apply ``patch`` (``reverse``: backwards) to the temporary index ``env`` names; returns the tree it gives."""
    args = ["apply", "--cached", "--allow-empty", "--whitespace=nowarn"] + (["-R"] if reverse else []) + [str(patch)]
    res = git(room, *args, env=env, check=False)
    if not res.ok:
        raise MismatchError(
            f"{patch.name} does not {'reverse-' if reverse else ''}apply to the "
            f"{'captured tree' if reverse else 'baseline'}",
            where=str(patch), details=res.stderr.strip(),
            hint="`dcaforge capture` writes it again from the clean room (or `dcaforge apply --fresh` makes the room again)")
    return git_out(room, "write-tree", env=env)


def _same_tree(room: Path, got: str, want: str, message: str, details: str, hint: str) -> None:
    if got != want:
        raise MismatchError(message, where=f"first differing file: {first_difference(room, got, want)}",
                            details=details, hint=hint)


def rendered_tree(cfg: Config, room: Room) -> str:
    """The baseline with the feature rendered fresh from the templates, as a tree (no checkout)."""
    baseline = baseline_commit(room)
    p = plan(cfg, GitTree(room.path, baseline), load_manifest(cfg.feature.templates))
    return write_tree(room.path, baseline, [(rel, data, mode) for rel, (data, mode) in sorted(p.outputs.items())])


def _commands(cfg: Config, file: Path | None, fresh_render: bool, gnu: bool) -> tuple[str, str]:
    """The capture that writes the patch verified, and this verify again, as commands to paste."""
    own = file is None or file.resolve() == cfg.feature_patch.resolve()
    capture = "`dcaforge capture`" if own else f"`dcaforge capture -o {shlex.quote(str(file))}`"
    args = ([] if file is None else [shlex.quote(str(file))]) + (["--fresh-render"] if fresh_render else []) \
        + (["--gnu"] if gnu else [])
    return capture, f"`dcaforge verify{''.join(' ' + a for a in args)}`"


def _stale_hint(cfg: Config, room: Room, state: RoomState, capture: str, again: str) -> str:
    """What makes the committed patch what the templates render again, by why it differs."""
    if state.templates_digest != manifest_digest(cfg.feature.templates):
        return f"the templates changed since the clean room was rendered: `dcaforge render`, then {capture}, then {again}"
    hand = hand_edited_files(room, state)
    if hand:
        return (f"the clean room holds hand edits ({', '.join(hand[:3])}{' ...' if len(hand) > 3 else ''}): "
                f"`dcaforge templatize` writes them into the feature's templates; then {capture}, then {again}")
    return f"{capture} writes what the templates render; then {again}"


def _verify_gnu(room: Path, patch: Path, base: str, expected: str, capture: str, again: str) -> None:
    """``patch -p1 --fuzz=0`` on a scratch folder holding only the touched files of the baseline
    must give exactly the expected files (bytes and exec bits)."""
    base_tree = GitTree(room, base)
    want = GitTree(room, expected)
    paths = changed_paths(room, base, expected)
    with tempfile.TemporaryDirectory(prefix="dcaforge-gnu-") as tmp:
        scratch = Path(tmp)
        for rel in paths:
            if base_tree.is_file(rel):
                dest = scratch / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(base_tree.read(rel))
                os.chmod(dest, base_tree.mode(rel))
        res = patch_cmd(scratch, patch, dry_run=False)
        if not res.ok:
            raise MismatchError(f"{patch.name} does not apply with GNU patch -p1 --fuzz=0",
                                where=str(patch), details=(res.stdout + res.stderr).strip(),
                                hint="GNU patch cannot apply binary diffs; keep binary files out of the feature")
        for rel in paths:
            got = scratch / rel
            if want.is_file(rel):
                ok = got.is_file() and got.read_bytes() == want.read(rel) and \
                    (0o755 if got.stat().st_mode & 0o111 else 0o644) == want.mode(rel)
            else:
                ok = not got.exists()
            if not ok:
                raise MismatchError(f"GNU patch -p1 gives a different {rel} than git apply",
                                    where=f"first differing file: {rel}", hint=f"{capture}, then {again}")


def verify(cfg: Config, file: Path | None = None, *, fresh_render: bool = False, gnu: bool = False) -> VerifyResult:
    room = Room.of(cfg)
    room.require()
    patch = (file or cfg.feature_patch).resolve()
    capture, again = _commands(cfg, file, fresh_render, gnu)
    if not patch.is_file():
        raise DcaforgeError(f"no patch to verify at {patch}", where=str(patch), hint=f"{capture} writes it")
    data = patch.read_bytes()
    # a patch handed to verify is input too: every path it names must be a file of the tree
    confine.check_patch_text(confine.PatchRef(patch.name, patch), parse_patch(data),
                             f"fix or remove {patch} (a patch may only change files of the tree), then {again}")
    sha = hashlib.sha256(data).hexdigest()
    with locked(room):
        base = baseline_tree(room)
        state = room.load_state()
        notes: list[str] = []
        if fresh_render:
            if state.series != series_record(discover(cfg)):
                raise DcaforgeError("the series changed since the clean room was applied",
                                    where=str(room.path), hint=f"`dcaforge apply`, then {again}")
            expected = rendered_tree(cfg, room)
            expected_from = "fresh render"
            fresh = tree_diff(room.path, base, expected)
            if fresh != data:
                a = data.decode("utf-8", "replace").splitlines()
                b = fresh.decode("utf-8", "replace").splitlines()
                diff = list(difflib.unified_diff(a, b, "committed", "fresh render", n=1, lineterm=""))
                files = sorted(set(changed_paths(room.path, base, expected)))
                raise MismatchError(
                    f"{patch.name} is stale: rendering the templates again gives different bytes",
                    where=f"{patch} (fresh render touches: {', '.join(files) or 'nothing'})",
                    details="\n".join(diff[:40]) + ("\n..." if len(diff) > 40 else ""),
                    hint=_stale_hint(cfg, room, state, capture, again))
        else:
            cap = state.captured
            if cap is not None and cap.sha256 == sha and cap.tree:
                expected, expected_from = cap.tree, "capture"
            else:
                expected, expected_from = worktree_tree(room.path), "work tree"
                notes.append("the patch is not the last capture: compared with the room's work tree")
        with temp_index(room.path, seed=False) as env:
            git(room.path, "read-tree", base, env=env)
            forward = _apply_cached(room.path, env, patch, reverse=False)
            _same_tree(room.path, forward, expected, f"forward-applying {patch.name} to the baseline does not give the "
                       f"{expected_from} tree", f"forward {forward} != expected {expected}", f"{capture}, then {again}")
            reverse = _apply_cached(room.path, env, patch, reverse=True)
            _same_tree(room.path, reverse, base, f"reverse-applying {patch.name} does not give the baseline back",
                       f"reverse {reverse} != baseline {base}", f"{capture}, then {again}")
        if gnu:
            _verify_gnu(room.path, patch, base, expected, capture, again)
        return VerifyResult(patch=patch, baseline_tree=base, expected_tree=expected, expected_from=expected_from,
                            forward_tree=forward, reverse_tree=reverse, fresh_render=fresh_render, gnu_patch=gnu,
                            notes=notes)
