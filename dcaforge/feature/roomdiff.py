"""The clean room's changes against its baseline as a feature (:class:`Feature`): new files, and
anchored edits of upstream files (:func:`file_edits`).

Anchors are whole lines, the fewest that are unique where the edit applies (edits are listed
bottom-up within a file, so every anchor is matched against untouched text above).
"""

from __future__ import annotations

import difflib
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from dcaforge import guard
from dcaforge.errors import DcaforgeError, SafetyError
from dcaforge.feature.anchors import apply_edit, find_anchor
from dcaforge.git import git
from dcaforge.room.cleanroom import BASELINE_TAG
from dcaforge.room.trees import changed_paths, tree_of, worktree_tree

JINJA_OPEN = re.compile(r"\{\{|\{%|\{#")
_SPECIAL = {c: "\\" + c for c in "()[]{}?*+|^$\\."}


@dataclass
class Edit:
    file: str
    anchor: str
    action: str  # insert_before | insert_after | replace
    text: str    # the literal text (before template escaping)


@dataclass
class Feature:
    files: list[tuple[str, str, str | None]] = field(default_factory=list)  # dest, text, mode
    edits: list[Edit] = field(default_factory=list)
    expected: dict[str, str] = field(default_factory=dict)  # room path -> the room's text (every changed file)


def rx_escape(s: str) -> str:
    """re.escape without escaping spaces, '#', '-' ... (anchors are not VERBOSE regexes)."""
    return "".join(_SPECIAL.get(c, c) for c in s)


def line_anchor(lines: list[str]) -> str:
    body = "".join(rx_escape(line.rstrip("\n")) + ("\\n" if line.endswith("\n") else "") for line in lines)
    return "(?m)^" + body


def _count(anchor: str, text: str) -> int:
    return sum(1 for _ in re.finditer(anchor, text))


def literal_body(e: Edit) -> str:
    """The edit's literal text as the renderer has it after Jinja (a replace text is a re template)."""
    return e.text.replace("\\", "\\\\") if e.action == "replace" else e.text


def _apply(text: str, e: Edit) -> str:
    """The renderer's own apply_edit, for one edit whose text is literal."""
    return apply_edit(text, find_anchor(text, e.anchor), e.action, literal_body(e))


def file_edits(path: str, old: str, new: str) -> list[Edit]:
    """Anchored edits turning old into new, bottom-up, each anchor unique when applied."""
    a = old.splitlines(keepends=True)
    b = new.splitlines(keepends=True)
    ops = [op for op in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes() if op[0] != "equal"]
    edits: list[Edit] = []
    cur = old
    for tag, i1, i2, j1, j2 in reversed(ops):
        added = "".join(b[j1:j2])
        if tag == "insert":
            lo = i1 - 1
            while lo >= 0 and not (a[lo].strip() and _count(line_anchor(a[lo:i1]), cur) == 1):
                lo -= 1
            if lo >= 0:
                e = Edit(path, line_anchor(a[lo:i1]), "insert_after", added)
            else:  # nothing unique above: anchor on the lines below
                hi = i1 + 1
                while _count(line_anchor(a[i1:hi]), cur) != 1:
                    hi += 1
                e = Edit(path, line_anchor(a[i1:hi]), "insert_before", added)
        else:
            lo = i1
            while _count(line_anchor(a[lo:i2]), cur) != 1:
                lo -= 1
                if lo < 0:
                    raise DcaforgeError(f"no unique anchor for the change at line {i1 + 1}", where=path)
            e = Edit(path, line_anchor(a[lo:i2]), "replace", "".join(a[lo:i1]) + added)
        cur = _apply(cur, e)
        edits.append(e)
    if cur != new:
        raise DcaforgeError("the generated edits do not reproduce the file", where=path)
    return edits


def escape_template(text: str, marker: str, *, for_replace: bool) -> str:
    """A Jinja template that renders to text, with every marker as {{ marker }}."""
    if for_replace:  # the renderer expands replace text as a re template
        text = text.replace("\\", "\\\\")
    out = []
    parts = text.split(marker) if marker else [text]
    for i, part in enumerate(parts):
        if JINJA_OPEN.search(part) or part.endswith("{"):
            out.append("{% raw %}" + part + "{% endraw %}")
        else:
            out.append(part)
        if i < len(parts) - 1:
            out.append("{{ marker }}")
    return "".join(out)


def feature_of(room: Path, base_rev: str, prefix: str) -> Feature:
    """The room's work tree against base_rev, for paths under prefix ('' for the whole tree)."""
    base_tree = tree_of(room, base_rev)
    work_tree = worktree_tree(room)
    feature = Feature()
    for path in changed_paths(room, base_tree, work_tree):
        if prefix and not path.startswith(prefix + "/"):
            raise DcaforgeError(f"{path} is outside llama_cpp_dir '{prefix}': templates cannot express it",
                                where=str(room / path), hint="move the change under llama_cpp_dir, or revert it")
        rel = path[len(prefix) + 1:] if prefix else path
        file = room / path
        old = git(room, "cat-file", "-p", f"{base_tree}:{path}", check=False)
        if not os.path.lexists(file):
            raise DcaforgeError(f"{path} was deleted: templates cannot delete files", where=str(file),
                                hint=f"restore it: `git -C {shlex.quote(str(room))} checkout {BASELINE_TAG} -- {shlex.quote(path)}`")
        _refuse_link(room, path, file)
        try:
            new = guard.read_regular(file, what="the clean room's file", follow=False).decode("utf-8")
        except UnicodeDecodeError as e:
            raise DcaforgeError(f"{path} is not UTF-8 text: templates hold text only", where=str(file)) from e
        feature.expected[path] = new
        if not old.ok:
            mode = "0755" if file.stat().st_mode & 0o111 else None
            feature.files.append((rel, new, mode))
            continue
        base_mode = git(room, "ls-tree", base_tree, "--", path).stdout.split(" ", 1)[0]
        if (base_mode == "100755") != bool(file.stat().st_mode & 0o111):
            raise DcaforgeError(f"{path} changed its exec bit: templates cannot express that", where=str(file))
        feature.edits.extend(file_edits(rel, old.stdout, new))
    return feature


def _refuse_link(room: Path, path: str, file: Path) -> None:
    """A symlink in the room is never followed into the templates (its target's bytes, a key or a
    token outside the room, would become part of the feature): refused, naming it and its target."""
    if not file.is_symlink():
        return
    target = os.readlink(file)
    out = not guard.inside(file, room) or guard.inside(file, room / ".git")
    raise SafetyError(
        f"{path} is a symlink to {target}" + (", outside the clean room" if out else "")
        + ": templates hold files' text, never a link, and templatize copies nothing a link points at",
        where=str(file),
        hint=f"replace the link with the file you mean (or remove it: `rm {shlex.quote(str(file))}`), then run "
             "`dcaforge templatize` again")
