"""Render a feature folder (``manifest.yaml`` + Jinja templates) into the clean room.

Every touched file starts from its content in the baseline commit, so rendering twice gives
the same bytes. Anchors are Python regexes that must match exactly ``count`` times; a missing
or ambiguous anchor names the manifest, the edit, the target file, the anchor and the
closest lines found. :func:`dcaforge.feature.plan.plan` computes what a render writes, writing nothing (``render
--check`` reports it per edit: :mod:`dcaforge.feature.drift`).
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from dcaforge import confine, guard
from dcaforge.config import Config
from dcaforge.errors import DcaforgeError, MismatchError, SafetyError
from dcaforge.feature.manifest import Manifest, load_manifest, manifest_digest
from dcaforge.feature.plan import EditReport, plan
from dcaforge.git import rev_parse, status_porcelain
from dcaforge.room.blame import attribute
from dcaforge.room.cleanroom import START_TAG, Room, locked, write_atomic
from dcaforge.room.state import RoomState
from dcaforge.room.trees import GitTree, Tree, baseline_commit

# --- render into the room, and check ------------------------------------------------------

@dataclass
class RenderResult:
    room: Path
    written: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)
    edits: list[EditReport] = field(default_factory=list)
    files: list[tuple[str, str]] = field(default_factory=list)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _current(path: Path) -> tuple[bytes, int] | None:
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return guard.read_regular(path, what="the clean room's file", follow=False), (0o755 if st.st_mode & 0o111 else 0o644)


def hand_edited_files(room: Room, state: RoomState) -> list[str]:
    """Files that differ from HEAD in the room and are not exactly what the last render wrote."""
    rendered: dict[str, str] = state.rendered or {}
    pending: dict[str, str] = state.rendering or {}  # a render that was interrupted
    out = []
    for entry in status_porcelain(room.path):
        rel = entry[3:]
        cur = _current(room.path / rel)
        if cur is not None and _sha(cur[0]) in (rendered.get(rel), pending.get(rel)):
            continue
        out.append(rel)
    return sorted(out)


def render_feature(cfg: Config, room: Room, *, force: bool = False) -> RenderResult:
    """Render the feature into the clean room's work tree (called with the room locked)."""
    manifest = load_manifest(cfg.feature.templates)
    tree = GitTree(room.path, baseline_commit(room))
    try:
        p = plan(cfg, tree, manifest)
    except DcaforgeError as exc:
        room.update_state(render_error=exc.message)  # capture refuses a room whose render stopped
        if isinstance(exc, MismatchError):
            _name_the_patch(cfg, room, tree, manifest, exc)
        raise
    state = room.load_state()
    previous_paths = set(state.rendered or {})
    for rel in sorted(set(p.outputs) | previous_paths):  # every path checked before the first write
        confine.resolve_in(room.path, rel, what="render target", where=f"{manifest.path} -> {room.path / rel}",
                           hint="fix the manifest's dest/file (a path under llama_cpp_dir), or remove the symlink from "
                                "the tree; nothing was written")
    previous: dict[str, str] = state.rendered or {}
    touched = set(p.outputs) | set(previous)
    if not force:
        # a file that already holds exactly what this render writes loses nothing (e.g. after
        # `dcaforge templatize` turned the hand edits into templates)
        hand = [f for f in hand_edited_files(room, state)
                if f in touched and not (f in p.outputs and _current(room.path / f) == p.outputs[f])]
        if hand:
            raise SafetyError(f"rendering would overwrite hand edits in {', '.join(hand)}",
                              where=str(room.path),
                              hint="`dcaforge templatize` writes them into the feature's templates (then `dcaforge render` "
                                   "has nothing to overwrite); `dcaforge render --force` discards them")
    result = RenderResult(room=room.path, edits=p.edits, files=p.files)
    new_hashes = {rel: _sha(d) for rel, (d, _m) in sorted(p.outputs.items())}
    room.update_state(rendering=new_hashes)  # so an interrupted render is not taken for hand edits
    for rel in sorted(p.outputs):
        data, mode = p.outputs[rel]
        dest = room.path / rel
        if _current(dest) == (data, mode):
            result.unchanged.append(rel)
            continue
        if dest.is_symlink() or dest.is_dir():
            raise SafetyError(f"render target {rel} is a symlink or a folder", where=str(dest))
        write_atomic(dest, data, mode)
        result.written.append(rel)
    for rel in sorted(set(previous) - set(p.outputs)):
        dest = room.path / rel
        if tree.is_file(rel):
            data = tree.read(rel)
            mode = tree.mode(rel)
            if _current(dest) != (data, mode):
                write_atomic(dest, data, mode)
        elif dest.exists() or dest.is_symlink():
            os.unlink(dest)
        result.restored.append(rel)
    room.update_state(rendered=new_hashes, rendering=None, render_error=None,
                      templates_digest=manifest_digest(cfg.feature.templates))
    return result


def _name_the_patch(cfg: Config, room: Room, tree: Tree, manifest: Manifest, exc: MismatchError) -> None:
    """An anchor that does not fit a file the series changed: add which patch changed it (and which last
    changed the anchor's closest line) to the error, so the report names patch, file and anchor."""
    try:
        reports = plan(cfg, tree, manifest, check=True).edits
    except DcaforgeError:
        return
    bad = next((r for r in reports if r.status in ("missing", "ambiguous") and r.file), None)
    start = rev_parse(room.path, START_TAG)
    base = baseline_commit(room)
    if bad is None or bad.file is None or start is None:
        return
    full = ("" if manifest.edits[bad.index].base == "room" else cfg.llama_prefix) + bad.file
    line = None
    if bad.closest:
        head = bad.closest[0].split(":", 1)[0]
        line = int(head) if head.isdigit() else None
    who = attribute(room.path, start, base, full, line)
    exc.details = ((exc.details or "").rstrip("\n") + "\n" + who.describe()).lstrip("\n")
    if who.patches:
        culprit = who.line_patch or who.patches[-1]
        exc.hint = (f"the patch {culprit} of the series changed {full} where edit #{bad.index} anchors: fix that patch, "
                    "or " + (exc.hint or "adjust the anchor"))


def render(cfg: Config, *, force: bool = False) -> RenderResult:
    """``dcaforge render``."""
    room = Room.of(cfg)
    room.require()
    with locked(room):
        return render_feature(cfg, room, force=force)
