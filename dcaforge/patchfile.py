"""Patch files: reading one, telling its format, every file and hunk it names, and what the tools
say about it.

A patch is ``git``-style when it holds a ``diff --git`` line (``git apply``), else a plain unified
diff (GNU ``patch -p1``). :func:`parse_patch` reads a patch the way ``git apply`` and GNU ``patch``
read it (headers, hunks counted line by line, C-quoted names, ``rename``/``copy``/mode lines,
symlink targets), for :mod:`dcaforge.confine` to check before a tool sees it and for error
reports to name the file and hunk that failed. :func:`git_failure` and :func:`gnu_failure` read
the tools' own failure output; :func:`gnu_names` and :func:`numstat_names` the files the tools
say they touch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from dcaforge.errors import ConfigError

NUMBERED = re.compile(r"^(\d{4})-.+\.(?:patch|diff)$")
#: Larger patch files are refused before they are read (the whole llamafile series is a few MiB).
MAX_PATCH_BYTES = 256 * 1024 * 1024
SYMLINK_MODE = "120000"


@dataclass(frozen=True)
class Patch:
    name: str
    path: Path
    number: int | None
    style: str  # "git" (git apply) or "gnu" (patch -p1)
    sha256: str

    @property
    def stem(self) -> str:
        return self.name.rsplit(".", 1)[0]


@dataclass(frozen=True)
class Hunk:
    file: str
    index: int  # 1-based, within its file
    header: str
    old_start: int
    line: int  # line in the patch file


def load_patch(path: Path, name: str) -> Patch:
    """The patch file at ``path`` (named ``name`` in reports): its format, number and digest."""
    try:
        size = path.stat().st_size
        if size > MAX_PATCH_BYTES:
            raise ConfigError(f"patch {name} is {size / 2**20:.0f} MiB, more than dcaforge reads "
                              f"({MAX_PATCH_BYTES // 2**20} MiB)", where=str(path),
                              hint="split it into several patches, or check that it is the file you meant")
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read patch {name}: {exc.strerror}", where=str(path),
                          hint=f"check that {path} is a readable file") from None
    m = NUMBERED.match(path.name)
    style = "git" if re.search(rb"^diff --git ", data, re.MULTILINE) else "gnu"
    return Patch(name=name, path=path, number=int(m.group(1)) if m else None, style=style,
                 sha256=hashlib.sha256(data).hexdigest())


def read_patch(patch: Patch, strip: int = 1) -> ParsedPatch:
    """:func:`parse_patch` of the patch's file."""
    try:
        return parse_patch(patch.path.read_bytes(), strip)
    except OSError as exc:
        raise ConfigError(f"cannot read patch {patch.name}: {exc.strerror}", where=str(patch.path),
                          hint=f"check that {patch.path} is a readable file") from None


# --- every file and hunk a patch names, as the tools read it --------------------------------

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
    hunks: list[Hunk] = field(default_factory=list)
    binary: bool = False
    added: list[str] = field(default_factory=list)  # '+' lines (a symlink's target)
    deleted_file: bool = False

    @property
    def symlink(self) -> bool:
        return any(m == SYMLINK_MODE for m, _l in self.modes)

    @property
    def names(self) -> set[str]:
        return {p.path for p in self.paths if p.path and p.path != "/dev/null"}

    @property
    def file(self) -> str:
        """The file the entry's hunks change, as the tools name it in their messages: the new name
        (``+++``), else the old one (a deletion), else the second name of ``diff --git``."""
        for role in ("+++", "---", "diff --git"):
            named = [p.path for p in self.paths if p.role == role and p.path]
            if named:
                return named[-1] if role == "diff --git" else named[0]
        return "?"


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
    reader = _PatchReader(data.decode("utf-8", "surrogateescape").split("\n"), strip)
    while reader.i < len(reader.lines):
        reader.step()
    return reader.result()


class _PatchReader:
    """Reading one patch for :func:`parse_patch`, a line (and the lines it owns) at a time."""

    def __init__(self, lines: list[str], strip: int) -> None:
        self.lines = lines
        self.strip = strip
        self.entries: list[PatchEntry] = []
        self.problems: list[tuple[int, str]] = []
        self.cur: PatchEntry | None = None
        self.first_header: int | None = None
        self.i = 0  # the line being read (0-based)

    def add(self, raw: str, line: int, role: str, do_strip: bool = True) -> None:
        assert self.cur is not None
        self.cur.paths.append(PatchPath(raw=raw, path=strip_components(raw, self.strip) if do_strip else raw, line=line,
                                        role=role))

    def new_entry(self, line: int, header: str) -> PatchEntry:
        if self.first_header is None:
            self.first_header = line
        self.cur = PatchEntry(line=line, header=header)
        self.entries.append(self.cur)
        return self.cur

    def step(self) -> None:
        """Read the line at ``i``, and move past it (and past the lines a hunk or a binary patch owns)."""
        bare = self.lines[self.i].rstrip("\r")
        ln = self.i + 1
        hunk = _HUNK.match(bare)
        if self._file_header(bare, ln) or self._extended_header(bare, ln):
            pass
        elif self.cur is not None and bare.startswith("GIT binary patch"):
            self.cur.binary = True
            self._skip_binary()
            return
        elif self.cur is not None and bare.startswith("Binary files "):
            self.cur.binary = True
        elif hunk:
            self._hunk(bare, ln, hunk)
        elif bare.startswith("***************"):
            self.problems.append((ln, "a context-diff hunk: only unified diffs are accepted"))
        elif _NORMAL_CMD.match(bare) or (_ED_CMD.match(bare) and self.first_header is not None):
            self.problems.append((ln, f"{bare!r} is a normal-diff or ed command: only unified diffs are accepted"))
        self.i += 1

    def _file_header(self, bare: str, ln: int) -> bool:
        """A ``diff --git``, ``---``/``***``, ``+++`` or ``Index:`` line: a new entry when it starts one, its names."""
        if bare.startswith("diff --git "):
            self.new_entry(ln, bare)
            for name in _git_header_names(bare[len("diff --git "):], self.strip):
                self.add(name, ln, "diff --git")
        elif bare.startswith(("--- ", "*** ")) and not bare.startswith("****"):
            role = bare[:3]
            cur = self.cur
            # a traditional diff's next file (a git entry or an Index: line may come first)
            if cur is None or cur.hunks or cur.binary or any(p.role in ("---", "***", "+++") for p in cur.paths):
                self.new_entry(ln, bare)
            for name in _header_name(bare[4:]):
                if name != "/dev/null":
                    self.add(name, ln, role)
            if role == "***":
                self.problems.append((ln, "a context-diff header ('*** '): only unified diffs are accepted"))
        elif bare.startswith("+++ "):
            if self.cur is None or self.cur.hunks or self.cur.binary:
                self.new_entry(ln, bare)
            for name in _header_name(bare[4:]):
                if name != "/dev/null":
                    self.add(name, ln, "+++")
        elif bare.startswith("Index: "):
            self.new_entry(ln, bare)
            for name in _header_name(bare[len("Index: "):]):
                self.add(name, ln, "Index:")
        else:
            return False
        return True

    def _extended_header(self, bare: str, ln: int) -> bool:
        """A git entry's rename/copy, mode or ``index`` line."""
        cur = self.cur
        if cur is None:
            return False
        if bare.startswith(("rename from ", "rename to ", "copy from ", "copy to ", "rename old ", "rename new ")):
            key, _, rest = bare.partition(" ")
            which, _, rest = rest.partition(" ")
            q = unquote_c(rest)
            self.add(q[0] if q is not None else rest, ln, f"{key} {which}", do_strip=False)
        elif m := _MODE_LINE.match(bare):
            cur.modes.append((m.group(2), ln))
            if m.group(1) == "deleted file mode":
                cur.deleted_file = True
        elif m := _INDEX_LINE.match(bare):
            if m.group(1):
                cur.modes.append((m.group(1), ln))
        else:
            return False
        return True

    def _skip_binary(self) -> None:
        """Past a ``GIT binary patch``: its literal/delta chunks, each ended by an empty line."""
        lines, n = self.lines, len(self.lines)
        self.i += 1
        chunks = 0
        while self.i < n and chunks < 2:
            b = lines[self.i].rstrip("\r")
            if not b:
                chunks += 1
                self.i += 1
                if self.i < n and not lines[self.i].rstrip("\r").startswith(("literal ", "delta ")):
                    break
                continue
            self.i += 1

    def _hunk(self, bare: str, ln: int, m: re.Match[str]) -> None:
        """A ``@@`` hunk and its lines, counted as the tools count them (a hunk cut short is a problem)."""
        cur = self.cur
        if cur is None:
            self.problems.append((ln, "a hunk with no file header before it"))
            cur = self.new_entry(ln, bare)
        cur.hunks.append(Hunk(file="?", index=len(cur.hunks) + 1, header=bare, old_start=int(m.group(1)), line=ln))
        old_n = int(m.group(2)) if m.group(2) is not None else 1
        new_n = int(m.group(4)) if m.group(4) is not None else 1
        lines, n = self.lines, len(self.lines)
        while (old_n > 0 or new_n > 0) and self.i + 1 < n:
            body = lines[self.i + 1]
            c = body[:1]
            if c == " " or body in ("", "\r"):
                old_n -= 1
                new_n -= 1
            elif c == "-":
                old_n -= 1
            elif c == "+":
                new_n -= 1
                cur.added.append(body[1:].rstrip("\r"))
            elif c != "\\":
                break  # the tools stop here too ("corrupt patch" / "malformed patch")
            self.i += 1
        if old_n > 0 or new_n > 0:
            self.problems.append((ln, f"hunk {bare.split('@@')[1].strip()!r} is cut short (its line counts are wrong)"))
        while self.i + 1 < n and lines[self.i + 1].startswith("\\"):
            self.i += 1

    def result(self) -> ParsedPatch:
        body_lines = self.lines[(self.first_header or 1) - 1:] if self.first_header else []
        # a format-patch signature ("-- \n2.39.0\n") is not content
        while body_lines and body_lines[-1].strip() == "":
            body_lines.pop()
        if len(body_lines) >= 2 and body_lines[-2] == "-- ":
            body_lines = body_lines[:-2]
        for e in self.entries:
            e.hunks = [dataclasses.replace(h, file=e.file) for h in e.hunks]
        return ParsedPatch(entries=self.entries, problems=self.problems,
                           body="\n".join(body_lines).encode("utf-8", "surrogateescape"))


def parse_hunks(text: str, strip: int = 1) -> list[Hunk]:
    """Every hunk of a patch, in order, with the file it changes."""
    return [h for e in parse_patch(text.encode("utf-8", "surrogateescape"), strip).entries for h in e.hunks]


def preimage_blobs(patch: Patch) -> list[str]:
    """The blob ids of the ``index`` lines' preimages (what ``git apply --3way`` needs), new files' left out."""
    text = patch.path.read_text(encoding="utf-8", errors="replace")
    olds = re.findall(r"^index ([0-9a-f]{7,64})\.\.[0-9a-f]+", text, re.MULTILINE)
    return [o for o in olds if set(o) != {"0"}]


# --- what the tools say ---------------------------------------------------------------------

@dataclass(frozen=True)
class Failure:
    patch: Patch
    file: str | None
    hunk: Hunk | None
    reason: str

    def where(self, head: str) -> str:
        """``head``, then the failing file and hunk when known (the ``where:`` line of the error)."""
        where = head
        if self.file:
            where += f", file {self.file}"
        if self.hunk:
            where += f", hunk #{self.hunk.index} {self.hunk.header} (patch line {self.hunk.line})"
        return where


def _find_hunk(hunks: list[Hunk], file: str | None, *, old_start: int | None = None,
               index: int | None = None) -> Hunk | None:
    cands = [h for h in hunks if h.file == file]
    for h in cands:
        if (old_start is not None and h.old_start == old_start) or (index is not None and h.index == index):
            return h
    return cands[0] if cands else None


def _hunks_of(patch: Patch, strip: int) -> list[Hunk]:
    try:
        return parse_hunks(patch.path.read_bytes().decode("utf-8", "replace"), strip)
    except OSError:
        return []


def git_failure(patch: Patch, stderr: str, strip: int = 1) -> Failure:
    """The file and hunk ``git apply`` names in ``stderr``, and its reason."""
    hunks = _hunks_of(patch, strip)
    reason_lines = [ln for ln in stderr.splitlines() if ln.strip()]
    m = re.search(r"^error: patch failed: (.+):(\d+)$", stderr, re.MULTILINE)
    if m:
        file = m.group(1)
        return Failure(patch, file, _find_hunk(hunks, file, old_start=int(m.group(2))), "\n".join(reason_lines))
    m = re.search(r"^error: (.+?): (.+)$", stderr, re.MULTILINE)
    if m and not m.group(1).startswith(("corrupt patch", "unrecognized input", "No valid patches")):
        file = m.group(1)
        return Failure(patch, file, _find_hunk(hunks, file), "\n".join(reason_lines))
    return Failure(patch, None, None, "\n".join(reason_lines) or "git apply failed")


def gnu_failure(patch: Patch, output: str, strip: int = 1) -> Failure:
    """The file and hunk GNU ``patch`` names in ``output``, and its reason."""
    hunks = _hunks_of(patch, strip)
    cur: str | None = None
    for line in output.splitlines():
        m = re.match(r"^(?:checking|patching) file (.+)$", line)
        if m:
            cur = m.group(1).strip().strip("'")
            continue
        m = re.match(r"^Hunk #(\d+) FAILED at (\d+)", line)
        if m:
            return Failure(patch, cur, _find_hunk(hunks, cur, index=int(m.group(1))), output.strip())
        if "can't find file to patch" in line or "No file to patch" in line or "Skipping patch" in line \
                or "already exists" in line or "Only garbage" in line or "malformed patch" in line:
            return Failure(patch, cur, _find_hunk(hunks, cur) if cur else None, output.strip())
    return Failure(patch, cur, None, output.strip() or "patch failed")


def numstat_names(out: bytes) -> list[str]:
    """Paths of ``git apply --numstat -z`` (a rename gives both)."""
    items = out.split(b"\0")
    names: list[str] = []
    i = 0
    while i < len(items):
        item = items[i]
        i += 1
        if not item:
            continue
        fields = item.split(b"\t", 2)
        if len(fields) == 3 and fields[2]:
            names.append(fields[2].decode("utf-8", "surrogateescape"))
        elif len(fields) == 3:  # a rename: the two names follow
            names += [x.decode("utf-8", "surrogateescape") for x in items[i:i + 2]]
            i += 2
    return names


_GNU_NAME = re.compile(r"^(?:checking|patching) (?:file|symbolic link) (.+?)(?: \((?:renamed|copied) from (.+)\))?"
                       r"(?: \(read-only\))?$")


def gnu_names(output: str) -> list[str]:
    """The files GNU patch says it checks or patches (QUOTING_STYLE=literal: names as they are)."""
    names: list[str] = []
    for line in output.splitlines():
        m = _GNU_NAME.match(line)
        if m:
            names += [n for n in m.groups() if n]
    return names
