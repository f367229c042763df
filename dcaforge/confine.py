"""Confinement: every path an input names stays inside the clean room's work tree.

Patches (git or GNU format, renames, copies, symlinks and mode changes included), template
destinations, manifest edits, ``llama_cpp_dir`` and the user's WIP are untrusted. Before anything is
applied or written, each path they name is checked here:

- as text (:func:`path_problem`): no absolute path, no ``..``, nothing under ``.git/`` (in any of
  the spellings a file system may fold to it: ``.GIT``, ``.git.``, ``git~1``, zero-width code points),
  no NUL byte;
- against the tree it lands in (:func:`resolve_in`): its resolution, symlinks followed, must stay
  inside the tree and outside its ``.git``.

:func:`parse_patch` reads a patch the way ``git apply`` and GNU ``patch`` read it (headers, hunks
counted line by line, C-quoted names, ``rename``/``copy``/mode lines, symlink targets), so
:func:`check_patch` can refuse it before a tool sees it; the tools' own reading of the patch (``git
apply --numstat``, ``patch --dry-run``) is then compared with it (:func:`check_tool_paths`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from .errors import SafetyError

# code points HFS+ ignores in file names, so ".g\u200cit" is ".git" there (git refuses them too)
_IGNORED = dict.fromkeys(map(ord, "\u200b\u200c\u200d\u200e\u200f\u202a\u202b\u202c\u202d\u202e"
                                   "\u206a\u206b\u206c\u206d\u206e\u206f\ufeff"))
#: File modes a patch may give a file (what git records for files and symlinks).
ALLOWED_MODES = frozenset({"100644", "100755", "100664", "120000"})
SYMLINK_MODE = "120000"


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


# --- reading patches as the tools do ------------------------------------------------------

_C_ESCAPES = {ord("a"): 7, ord("b"): 8, ord("f"): 12, ord("n"): 10, ord("r"): 13, ord("t"): 9, ord("v"): 11,
              ord("\\"): 92, ord('"'): 34}


def unquote_c(text: str) -> tuple[str, str] | None:
    """A C-quoted name at the start of ``text`` (git's and GNU patch's quoting): (name, rest), or
    None when ``text`` does not start with a well-formed quoted name."""
    if not text.startswith('"'):
        return None
    raw = text.encode("utf-8", "surrogateescape")
    out = bytearray()
    i = 1
    while i < len(raw):
        c = raw[i]
        if c == 34:  # closing quote
            return out.decode("utf-8", "surrogateescape"), raw[i + 1:].decode("utf-8", "surrogateescape")
        if c == 92:
            i += 1
            if i >= len(raw):
                return None
            e = raw[i]
            if 48 <= e <= 55:  # octal
                digits = raw[i:i + 3]
                if len(digits) < 3 or not all(48 <= d <= 55 for d in digits):
                    return None
                out.append(int(digits, 8) & 0xFF)
                i += 3
                continue
            if e not in _C_ESCAPES:
                return None
            out.append(_C_ESCAPES[e])
            i += 1
            continue
        out.append(c)
        i += 1
    return None


def strip_components(name: str, strip: int) -> str | None:
    """``name`` without its first ``strip`` components, as ``patch -pN`` and ``git apply -pN`` count
    them (a run of slashes is one separator); None when it has too few."""
    if strip == 0:
        return name
    parts = re.split(r"/+", name)
    if len(parts) <= strip:
        return None
    return "/".join(parts[strip:])


@dataclass
class PatchPath:
    raw: str    # the name as the patch writes it (unquoted)
    path: str | None  # as the tool takes it (after -p), None when it has too few components
    line: int   # 1-based line of the patch
    role: str   # "---", "+++", "***", "Index:", "diff --git", "rename from", ...


@dataclass
class PatchEntry:
    line: int
    header: str
    paths: list[PatchPath] = field(default_factory=list)
    modes: list[tuple[str, int]] = field(default_factory=list)  # (mode, line)
    hunks: int = 0
    binary: bool = False
    added: list[str] = field(default_factory=list)  # '+' lines (a symlink's target)
    deleted_file: bool = False

    @property
    def symlink(self) -> bool:
        return any(m == SYMLINK_MODE for m, _l in self.modes)

    @property
    def names(self) -> set[str]:
        return {p.path for p in self.paths if p.path and p.path != "/dev/null"}


@dataclass
class ParsedPatch:
    entries: list[PatchEntry]
    problems: list[tuple[int, str]]  # (line, what): content neither tool should be left to guess at
    body: bytes  # from the first header on, without a trailing mail signature (for "same content")


_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_NORMAL_CMD = re.compile(r"^\d+(?:,\d+)?[acd]\d+(?:,\d+)?\s*$")
_ED_CMD = re.compile(r"^\d+(?:,\d+)?[acdis](?:/.*)?\s*$")
_MODE_LINE = re.compile(r"^(old mode|new mode|new file mode|deleted file mode) (\d+)\s*$")
_INDEX_LINE = re.compile(r"^index [0-9a-fA-F]+\.\.[0-9a-fA-F]+(?: (\d+))?\s*$")
_EXT = ("similarity index ", "dissimilarity index ", "index ", "old mode ", "new mode ", "new file mode ",
        "deleted file mode ", "rename from ", "rename to ", "copy from ", "copy to ", "rename old ", "rename new ",
        "Binary files ", "GIT binary patch")


def _header_name(text: str) -> list[str]:
    """The name(s) a ``---``/``+++``/``***``/``Index:`` header gives: quoted, or up to a tab (git), or
    up to the first whitespace (GNU patch); both readings are returned when they differ."""
    text = text.rstrip("\r\n")
    q = unquote_c(text)
    if q is not None:
        return [q[0]]
    by_tab = text.split("\t", 1)[0].rstrip(" \r")
    by_space = re.split(r"\s", text.strip(), maxsplit=1)[0] if text.strip() else ""
    return list(dict.fromkeys(n for n in (by_tab, by_space) if n))


def _git_header_names(rest: str, strip: int) -> list[str]:
    """Both names of a ``diff --git A B`` line: quoted ones parsed; unquoted ones split where the
    two halves name the same file after the strip (git's own rule), else every split (a superset,
    for checking only)."""
    rest = rest.rstrip("\r\n")
    q = unquote_c(rest)
    if q is not None:
        first, tail = q
        tail = tail.lstrip(" ")
        q2 = unquote_c(tail)
        return [first, q2[0] if q2 is not None else tail]
    spaces = [m.start() for m in re.finditer(" ", rest)]
    same = []
    halves: list[str] = []
    for i in spaces:
        a, b = rest[:i], rest[i + 1:]
        q2 = unquote_c(b)
        if q2 is not None:
            b = q2[0]
        halves += [a, b]
        if strip_components(a, strip) == strip_components(b, strip):
            same = [a, b]
    return same or halves


def parse_patch(data: bytes, strip: int = 1) -> ParsedPatch:
    """Every file a patch names, hunk lines counted as the tools count them."""
    text = data.decode("utf-8", "surrogateescape")
    lines = text.split("\n")
    entries: list[PatchEntry] = []
    problems: list[tuple[int, str]] = []
    cur: PatchEntry | None = None
    first_header: int | None = None
    i = 0
    n = len(lines)

    def add(raw: str, line: int, role: str, do_strip: bool = True) -> None:
        assert cur is not None
        cur.paths.append(PatchPath(raw=raw, path=strip_components(raw, strip) if do_strip else raw, line=line,
                                   role=role))

    def new_entry(line: int, header: str) -> PatchEntry:
        nonlocal first_header
        if first_header is None:
            first_header = line
        e = PatchEntry(line=line, header=header)
        entries.append(e)
        return e

    while i < n:
        line = lines[i]
        ln = i + 1
        bare = line.rstrip("\r")
        if bare.startswith("diff --git "):
            cur = new_entry(ln, bare)
            for name in _git_header_names(bare[len("diff --git "):], strip):
                add(name, ln, "diff --git")
        elif bare.startswith(("--- ", "*** ")) and not bare.startswith("****"):
            role = bare[:3]
            # a traditional diff's next file (a git entry or an Index: line may come first)
            if cur is None or cur.hunks or cur.binary or any(p.role in ("---", "***", "+++") for p in cur.paths):
                cur = new_entry(ln, bare)
            for name in _header_name(bare[4:]):
                if name != "/dev/null":
                    add(name, ln, role)
            if role == "***":
                problems.append((ln, "a context-diff header ('*** '): only unified diffs are accepted"))
        elif bare.startswith("+++ "):
            if cur is None or cur.hunks or cur.binary:
                cur = new_entry(ln, bare)
            for name in _header_name(bare[4:]):
                if name != "/dev/null":
                    add(name, ln, "+++")
        elif bare.startswith("Index: "):
            cur = new_entry(ln, bare)
            for name in _header_name(bare[len("Index: "):]):
                add(name, ln, "Index:")
        elif cur is not None and bare.startswith(("rename from ", "rename to ", "copy from ", "copy to ",
                                                  "rename old ", "rename new ")):
            key, _, rest = bare.partition(" ")
            which, _, rest = rest.partition(" ")
            q = unquote_c(rest)
            add(q[0] if q is not None else rest, ln, f"{key} {which}", do_strip=False)
        elif cur is not None and _MODE_LINE.match(bare):
            m = _MODE_LINE.match(bare)
            assert m is not None
            cur.modes.append((m.group(2), ln))
            if m.group(1) == "deleted file mode":
                cur.deleted_file = True
        elif cur is not None and _INDEX_LINE.match(bare):
            m = _INDEX_LINE.match(bare)
            assert m is not None
            if m.group(1):
                cur.modes.append((m.group(1), ln))
        elif cur is not None and bare.startswith("GIT binary patch"):
            cur.binary = True
            # literal/delta chunks, each ended by an empty line
            i += 1
            chunks = 0
            while i < n and chunks < 2:
                b = lines[i].rstrip("\r")
                if not b:
                    chunks += 1
                    i += 1
                    if i < n and not lines[i].rstrip("\r").startswith(("literal ", "delta ")):
                        break
                    continue
                i += 1
            continue
        elif cur is not None and bare.startswith("Binary files "):
            cur.binary = True
        elif _HUNK.match(bare):
            m = _HUNK.match(bare)
            assert m is not None
            if cur is None:
                problems.append((ln, "a hunk with no file header before it"))
                cur = new_entry(ln, bare)
            cur.hunks += 1
            old_n = int(m.group(2)) if m.group(2) is not None else 1
            new_n = int(m.group(4)) if m.group(4) is not None else 1
            while (old_n > 0 or new_n > 0) and i + 1 < n:
                body = lines[i + 1]
                c = body[:1]
                if c == " " or body in ("", "\r"):
                    old_n -= 1
                    new_n -= 1
                elif c == "-":
                    old_n -= 1
                elif c == "+":
                    new_n -= 1
                    cur.added.append(body[1:].rstrip("\r"))
                elif c == "\\":
                    pass
                else:
                    break  # the tools stop here too ("corrupt patch" / "malformed patch")
                i += 1
            if old_n > 0 or new_n > 0:
                problems.append((ln, f"hunk {bare.split('@@')[1].strip()!r} is cut short (its line counts are wrong)"))
            while i + 1 < n and lines[i + 1].startswith("\\"):
                i += 1
        elif bare.startswith("***************"):
            problems.append((ln, "a context-diff hunk: only unified diffs are accepted"))
        elif _NORMAL_CMD.match(bare) or (_ED_CMD.match(bare) and first_header is not None):
            problems.append((ln, f"{bare!r} is a normal-diff or ed command: only unified diffs are accepted"))
        i += 1
    body_lines = lines[(first_header or 1) - 1:] if first_header else []
    # a format-patch signature ("-- \n2.39.0\n") is not content
    while body_lines and body_lines[-1].strip() == "":
        body_lines.pop()
    if len(body_lines) >= 2 and body_lines[-2] == "-- ":
        body_lines = body_lines[:-2]
    return ParsedPatch(entries=entries, problems=problems, body="\n".join(body_lines).encode("utf-8", "surrogateescape"))


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
