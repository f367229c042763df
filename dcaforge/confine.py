"""Confinement: every path an input names stays inside the clean room's work tree.

Patches (git or GNU format, renames, copies, symlinks and mode changes included), template
destinations, manifest edits, ``llama_cpp_dir`` and the user's WIP are untrusted. Before anything is
applied or written, each path they name is checked here:

- as text (:func:`path_problem`): no absolute path, no ``..``, nothing under ``.git/`` (in any of
  the spellings a file system may fold to it: ``.GIT``, ``.git.``, ``git~1``, zero-width code points),
  no NUL byte;
- against the tree it lands in (:func:`resolve_in`): its resolution, symlinks followed, must stay
  inside the tree and outside its ``.git``.

A patch, as :func:`dcaforge.patchfile.parse_patch` reads it, is checked before a tool sees it
(:func:`check_patch_text`, :func:`check_patch_tree`); the tools' own reading of the patch (``git
apply --numstat``, ``patch --dry-run``) is then compared with it (:func:`check_tool_paths`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from dcaforge.errors import SafetyError
from dcaforge.patchfile import ParsedPatch

# code points HFS+ ignores in file names, so ".g\u200cit" is ".git" there (git refuses them too)
_IGNORED = dict.fromkeys(map(ord, "\u200b\u200c\u200d\u200e\u200f\u202a\u202b\u202c\u202d\u202e"
                                   "\u206a\u206b\u206c\u206d\u206e\u206f\ufeff"))
#: File modes a patch may give a file (what git records for files and symlinks).
ALLOWED_MODES = frozenset({"100644", "100755", "100664", "120000"})


def is_dotgit(component: str) -> bool:
    """``component`` names git's own folder on some file system (NTFS drops trailing dots and
    spaces and knows ``GIT~1``; HFS+ ignores some code points; both fold case)."""
    c = component.translate(_IGNORED).rstrip(" .").casefold()
    return c in (".git", "git~1")


def path_problem(rel: str) -> str | None:
    """Why ``rel`` (a relative path, ``/``-separated) may not name a file of a tree, or None."""
    if "\0" in rel:
        return "holds a NUL byte"
    if not rel.strip("/").strip():
        return "is empty"
    if rel.startswith("/"):
        return "is an absolute path"
    if re.match(r"^[A-Za-z]:[\\/]", rel):
        return "is an absolute (drive) path"
    for part in rel.split("/"):
        if part == "..":
            return "leaves the tree ('..')"
        if is_dotgit(part):
            return "is under .git/ (git's own files, which would let it run commands)"
    return None


def normalize(rel: str) -> str:
    """``rel`` without empty and ``.`` components (call after :func:`path_problem` said None)."""
    return "/".join(p for p in rel.split("/") if p not in ("", "."))


def check_rel(rel: str, *, what: str, where: str, hint: str) -> str:
    """``rel`` normalized, or a SafetyError naming ``what`` and why it may not be written."""
    problem = path_problem(rel)
    if problem:
        raise SafetyError(f"{what} {rel!r} {problem}; refusing it", where=where, hint=hint)
    return normalize(rel)


def _real(p: Path) -> Path:
    return Path(os.path.realpath(p))


def _inside(child: Path, parent: Path) -> bool:
    return child == parent or parent in child.parents


def escape_reason(root: Path, rel: str) -> str | None:
    """Why ``root/rel`` resolves outside ``root``'s work tree (symlinks followed), or None."""
    base = _real(root)
    target = _real(root / rel)
    if not _inside(target, base):
        via = _first_symlink(root, rel)
        link = f" through the symlink {via} -> {os.readlink(root / via)}" if via else ""
        return f"resolves to {target}{link}, outside the clean room"
    if _inside(target, base / ".git"):
        via = _first_symlink(root, rel)
        return f"resolves into the clean room's .git ({target}){' through the symlink ' + via if via else ''}"
    return None


def _first_symlink(root: Path, rel: str) -> str | None:
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    for k in range(1, len(parts) + 1):
        sub = "/".join(parts[:k])
        if (root / sub).is_symlink():
            return sub
    return None


def resolve_in(root: Path, rel: str, *, what: str, where: str, hint: str) -> Path:
    """``root/rel`` once ``rel`` passed :func:`check_rel` and its resolution stays in ``root``'s work tree."""
    rel = check_rel(rel, what=what, where=where, hint=hint)
    reason = escape_reason(root, rel)
    if reason:
        raise SafetyError(f"{what} {rel!r} {reason}; refusing it", where=where, hint=hint)
    return root / rel


def git_dir_above(path: Path) -> Path | None:
    """The git directory ``path`` is in (a ``.git`` folder, a bare repository, a linked worktree's
    git dir), or None."""
    for part in path.parts:
        if is_dotgit(part):
            return path
    for anc in [path, *path.parents]:
        if (anc / "HEAD").is_file() and (anc / "objects").is_dir() and (anc / "refs").is_dir():
            return anc
        if (anc / "HEAD").is_file() and (anc / "commondir").is_file() and (anc / "gitdir").is_file():
            return anc
    return None


def symlink_target_problem(link: str, target: str) -> str | None:
    """Why a symlink at ``link`` (relative to the tree) pointing at ``target`` leaves the tree, or None."""
    if not target:
        return "has an empty target"
    if target.startswith("/"):
        return f"points at the absolute path {target!r}"
    joined = os.path.normpath(os.path.join(os.path.dirname(link), target))
    if joined == ".." or joined.startswith("../"):
        return f"points outside the tree ({target!r})"
    if any(is_dotgit(p) for p in joined.split("/")):
        return f"points into .git ({target!r})"
    return None


@dataclass(frozen=True)
class PatchRef:
    """How errors name a patch: its name and file."""

    name: str
    path: Path


def _raise(ref: PatchRef, line: int, header: str, what: str, hint: str) -> None:
    head = header.strip()[:120]
    raise SafetyError(f"patch {ref.name} {what}; refusing it before it is applied",
                      where=f"{ref.path}:{line}" + (f" ({head})" if head else ""), hint=hint)


def check_patch_text(ref: PatchRef, parsed: ParsedPatch, hint: str) -> None:
    """What needs no tree: every name passes :func:`path_problem`, modes are a file's or a symlink's,
    symlink targets stay inside, no name goes through a symlink the same patch makes, and nothing
    in it is left for a tool to guess at (not a unified diff, hunks cut short)."""
    for line, what in parsed.problems:
        raise SafetyError(f"patch {ref.name}: {what}; refusing it before it is applied", where=f"{ref.path}:{line}",
                          hint=hint)
    made_links: dict[str, int] = {}
    for e in parsed.entries:
        for p in e.paths:
            if p.raw == "/dev/null":
                continue
            # the name as written (a strip never makes a bad name good), then as the tool takes it
            problem = path_problem(p.raw)
            if problem:
                _raise(ref, p.line, e.header, f"names {p.raw!r} ({p.role}), which {problem}", hint)
            if p.path is not None and p.path != p.raw:
                problem = path_problem(p.path)
                if problem:
                    _raise(ref, p.line, e.header, f"names {p.path!r} ({p.role}), which {problem}", hint)
        for mode, line in e.modes:
            if mode not in ALLOWED_MODES:
                what = "a submodule (gitlink)" if mode == "160000" else "not a file's or a symlink's"
                _raise(ref, line, e.header, f"gives mode {mode} ({what}) to {', '.join(sorted(e.names)) or '?'}", hint)
        if e.symlink and not e.deleted_file:
            targets = [t for t in e.added if t]
            for name in sorted(e.names):
                for target in targets[-1:]:
                    problem = symlink_target_problem(name, target)
                    if problem:
                        _raise(ref, e.line, e.header, f"makes {name!r} a symlink that {problem}", hint)
                made_links[name] = e.line
    for e in parsed.entries:
        for name in sorted(e.names):
            for link, line in made_links.items():
                if name.startswith(link + "/"):
                    _raise(ref, e.line, e.header,
                           f"writes {name!r} through {link!r}, a symlink the same patch makes (line {line})", hint)


def check_patch_tree(ref: PatchRef, parsed: ParsedPatch, root: Path, hint: str) -> None:
    """What needs the tree the patch is about to be applied to: no name resolves (through a
    symlink already in the tree) outside it or into its .git."""
    for e in parsed.entries:
        for p in e.paths:
            if p.path is None or p.path == "/dev/null" or path_problem(p.path):
                continue
            reason = escape_reason(root, normalize(p.path))
            if reason:
                _raise(ref, p.line, e.header, f"names {p.path!r} ({p.role}), which {reason}", hint)


def check_tool_paths(ref: PatchRef, parsed: ParsedPatch, tool: str, names: Iterable[str], hint: str) -> None:
    """The files the tool itself says it will touch must be files this module read and confined."""
    known = set()
    for e in parsed.entries:
        for p in e.paths:
            for cand in (p.path, p.raw):
                if cand:
                    known.add(cand.rstrip("\r"))
                    known.add(normalize(cand.rstrip("\r")))
    for name in names:
        clean = name.rstrip("\r")
        if clean not in known and normalize(clean) not in known:
            raise SafetyError(
                f"{tool} reads patch {ref.name} as touching {name!r}, a file dcaforge did not find in it; refusing it",
                where=str(ref.path), hint=hint)
