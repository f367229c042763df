"""The wiring check: every ``.c``, ``.cpp`` and ``.cu`` file a render adds is compiled and linked
by the build the config selects, read from the build files themselves (nothing is run).

- ``cmake`` (upstream llama.cpp): the nearest ``CMakeLists.txt`` above the file names it (a source
  list) or globs it (``file(GLOB ... "*.cu")``).
- ``llamafile``: its make files, from the root ``Makefile`` through every literal ``include``: the
  file is a word of a variable's value (an explicit list such as ``LLAMA_SRCS_CPP``) or matches a
  ``$(wildcard ...)`` there, and that variable reaches, through the variables and rules that use
  it, an archive or a program (``llama.cpp.a``, ``llama-server``, ``main``, ``llamafile``): so its
  object is compiled and linked. CUDA files may instead be built by the GPU library script
  (``build.llamafile.cuda_script``, e.g. ``llamafile/cuda.sh``): a literal path or a glob there.

A file whose folder the build builds (a list names a sibling of the same kind) but which no list
names is an error naming the file and the list it must join (the list holding most of its
siblings, with its file and line). A file in a folder the build does not build at all (llamafile's
make builds no ``tests/``; a tree without a GPU library script builds no CUDA) is reported as
``unbuilt``, not an error. The dynamic counterpart (the real Makefile in dry-run mode, the GPU
script with a stand-in nvcc) is :mod:`dcaforge.builder.dryrun`.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from dcaforge import guard
from dcaforge.config import Config
from dcaforge.feature import shellscan
from dcaforge.feature.shellscan import Scan, glob_regex
from dcaforge.room.trees import GitTree, Overlay, Tree

SOURCE_EXTS = (".c", ".cpp", ".cu")


@dataclass(frozen=True)
class WiringRow:
    source: str     # relative to the clean room (llama.cpp/src/llama-dca.cpp in llamafile's layout)
    build: str      # "cmake" | "make" | "gpu script"
    status: str     # "ok" | "missing" | "unbuilt"
    how: str        # ok: the list and what it reaches; unbuilt: why
    join: str = ""  # missing: the list it must join, with file:line

    @property
    def ok(self) -> bool:
        return self.status != "missing"


@dataclass
class WiringReport:
    backend: str
    rows: list[WiringRow] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.rows)

    @property
    def missing(self) -> list[WiringRow]:
        return [r for r in self.rows if not r.ok]

    def describe_missing(self) -> str:
        return "\n".join(f"{r.source}: not built by {r.build}; add it to {r.join}" for r in self.missing)


def added_sources(tree: Tree, outputs: dict[str, tuple[bytes, int]]) -> list[str]:
    """Room-relative paths of the C, C++ and CUDA files the render adds (absent from the baseline)."""
    return sorted(p for p in outputs if p.endswith(SOURCE_EXTS) and not tree.exists(p))


def _siblings(path: str) -> tuple[str, str]:
    return posixpath.dirname(path), posixpath.splitext(path)[1]


def _is_sibling(word: str, path: str) -> bool:
    d, ext = _siblings(path)
    return posixpath.dirname(word) == d and word.endswith(ext) and word != path


# --- make -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class MakeVar:
    name: str
    op: str
    value: str
    file: str
    line: int

    def where(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True)
class MakeRule:
    targets: str
    prereqs: str
    file: str
    line: int


@dataclass
class MakeDb:
    files: list[str] = field(default_factory=list)
    vars: list[MakeVar] = field(default_factory=list)
    rules: list[MakeRule] = field(default_factory=list)


_ASSIGN = re.compile(r"^(?:(?:override|export|private)\s+)*([A-Za-z0-9_.-]+)\s*(:::=|::=|:=|\+=|\?=|!=|=)\s*(.*)$", re.S)
_REF = re.compile(r"\$[({]([A-Za-z0-9_.-]+)(?::[^)}]*)?[)}]")
_WILDCARD = re.compile(r"\$\(wildcard\s+([^)]*)\)")
_INCLUDE = re.compile(r"^-?(?:include|sinclude)\s+(.+)$")
_DIRECTIVE = re.compile(r"^(?:ifeq|ifneq|ifdef|ifndef|else|endif|define|endef|undefine|vpath|unexport)\b")


def _logical_lines(text: str) -> Iterable[tuple[int, str, bool]]:
    """(first line number, logical line with continuations joined, is a recipe line)."""
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        start = i
        line = lines[i]
        recipe = line.startswith("\t")
        while line.endswith("\\") and i + 1 < len(lines):
            i += 1
            line = line[:-1] + " " + lines[i].lstrip()
        i += 1
        yield start + 1, line, recipe


def _outside_brackets(line: str) -> Iterator[tuple[int, str]]:
    """Each character of a make line (with its index) outside (...) and {...}, the brackets left out."""
    depth = 0
    for k, c in enumerate(line):
        if c in "({":
            depth += 1
        elif c in ")}":
            depth = max(0, depth - 1)
        elif depth == 0:
            yield k, c


def _strip_comment(line: str) -> str:
    for k, c in _outside_brackets(line):
        if c == "#" and (k == 0 or line[k - 1] != "\\"):
            return line[:k]
    return line


def _split_rule(line: str) -> tuple[str, str] | None:
    """``targets: prereqs`` split at the first ':' outside $(...), or None."""
    for k, c in _outside_brackets(line):
        if c == ":":
            rest = line[k + 1:]
            if rest.startswith("="):
                return None
            rest = rest[1:] if rest.startswith(":") else rest
            return line[:k].strip(), rest.split(";", 1)[0].strip()
    return None


def _each_once(todo: list[str]) -> Iterator[str]:
    """The items of ``todo`` in order, each once, including those appended to it meanwhile (a work list)."""
    seen: set[str] = set()
    while todo:
        item = todo.pop(0)
        if item in seen:
            continue
        seen.add(item)
        yield item


def read_make(view: Overlay, root: str = "Makefile") -> MakeDb:
    """The variables and rules of ``root`` and every make file it includes by a literal path
    (variables in an include path are not expanded: such includes are left out)."""
    db = MakeDb()
    todo = [root]
    for rel in _each_once(todo):
        text = view.text(rel)
        if text is None:
            continue
        db.files.append(rel)
        for lineno, raw, recipe in _logical_lines(text):
            if recipe:
                continue
            line = _strip_comment(raw).strip()
            if not line or _DIRECTIVE.match(line):
                continue
            m = _INCLUDE.match(line)
            if m:
                todo.extend(w for w in m.group(1).split() if "$" not in w)
                continue
            m = _ASSIGN.match(line)
            if m:
                db.vars.append(MakeVar(m.group(1), m.group(2), m.group(3).strip(), rel, lineno))
                continue
            split = _split_rule(line)
            if split is None:
                continue
            targets, prereqs = split
            if _ASSIGN.match(prereqs):  # target-specific variable (x.o: private CFLAGS += ...)
                continue
            db.rules.append(MakeRule(targets, prereqs, rel, lineno))
    return db


def _words(value: str) -> tuple[list[str], list[str]]:
    """(literal words, wildcard patterns) of a make value."""
    patterns = [p for group in _WILDCARD.findall(value) for p in group.split()]
    rest = _WILDCARD.sub(" ", value)
    return [w for w in rest.split() if "$" not in w], patterns


def _norm_target(t: str) -> str:
    return re.sub(r"\$[({]MODE[)}]", "", t).replace("//", "/")


def make_coverage(db: MakeDb, path: str) -> tuple[MakeVar | None, str]:
    """The variable listing ``path`` (explicitly or by a wildcard) and how it is built, or
    (None, "")."""
    for var in db.vars:
        words, patterns = _words(var.value)
        kind = "explicit" if path in words else ("wildcard" if any(glob_regex(p).match(path) for p in patterns) else None)
        if kind is None:
            continue
        chain, finals = _reach(db, var.name)
        if finals:
            shown = ", ".join(finals[:6]) + (f" and {len(finals) - 6} more" if len(finals) > 6 else "")
            return var, f"{var.name} ({kind}, {var.where()})" + (" -> " + " -> ".join(chain) if chain else "") \
                + " -> " + shown
    return None, ""


def _reach(db: MakeDb, name: str) -> tuple[list[str], list[str]]:
    """Variables that take in ``name`` (transitively) and the archives/programs whose rules need any of them."""
    names = [name]
    chain: list[str] = []
    frontier = {name}
    while frontier:
        nxt = set()
        for var in db.vars:
            if var.name in names:
                continue
            if set(_REF.findall(var.value)) & frontier:
                names.append(var.name)
                chain.append(var.name)
                nxt.add(var.name)
        frontier = nxt
    targets: list[str] = []
    for rule in db.rules:
        if set(_REF.findall(rule.prereqs)) & set(names):
            targets.extend(t for t in rule.targets.split() if "%" not in t)
    # archives feed programs: follow targets named literally in other rules' prerequisites
    phony = {_norm_target(p) for r in db.rules if r.targets.strip() == ".PHONY" for p in r.prereqs.split()}
    finals: list[str] = []
    todo = list(dict.fromkeys(targets))
    for t in _each_once(todo):
        nt = _norm_target(t)
        if not nt.endswith((".o", "/")) and "$" not in nt and not nt.startswith(".") and nt not in phony:
            finals.append(nt)
        for rule in db.rules:
            if nt in {_norm_target(p) for p in rule.prereqs.split()}:
                todo.extend(x for x in rule.targets.split() if "%" not in x)
    return chain, list(dict.fromkeys(finals))


def make_join_hint(db: MakeDb, path: str) -> str | None:
    """The list holding most siblings of ``path`` (same folder and extension), as ``NAME in file:line``."""
    best: tuple[int, MakeVar] | None = None
    for var in db.vars:
        words, _patterns = _words(var.value)
        n = sum(1 for w in words if _is_sibling(w, path))
        if n and (best is None or n > best[0]):
            best = (n, var)
    if best is None:
        return None
    return f"{best[1].name} in {best[1].where()} (it lists {best[0]} other files of {posixpath.dirname(path)}/)"


# --- shell scripts (the GPU library script) --------------------------------------------------

def script_join_hint(scan: Scan, path: str) -> str | None:
    """The script's words naming siblings of ``path`` (same folder and extension), as the list to join."""
    hits = [w for w in scan.words if _is_sibling(w.value, path)]
    hits = [w for w in hits if w.value == w.source] or hits  # the list as written, not where it is expanded
    if not hits:
        return None
    file = hits[0].file
    lines = [w.line for w in hits if w.file == file]
    return (f"the source list of {file}:{min(lines)}-{max(lines)} (it names {len(lines)} other files of "
            f"{posixpath.dirname(path)}/)")


# --- cmake ----------------------------------------------------------------------------------

_GLOB = re.compile(r"file\s*\(\s*GLOB(?:_RECURSE)?\s+\w+\s+([^)]*)\)", re.I)


def cmake_coverage(view: Overlay, path: str, top: str) -> tuple[str | None, str | None]:
    """(how it is built, or None; the CMakeLists.txt line naming a sibling, for the hint)."""
    folder = posixpath.dirname(path)
    while True:
        cml = posixpath.join(folder, "CMakeLists.txt") if folder else "CMakeLists.txt"
        text = view.text(cml)
        if text is not None:
            rel = posixpath.relpath(path, folder or ".")
            m = re.search(r"(?<![\w./-])" + re.escape(rel) + r"(?![\w.-])", text)
            if m:
                return f"{cml}:{text.count(chr(10), 0, m.start()) + 1}", None
            for g in _GLOB.finditer(text):
                for pat in g.group(1).split():
                    pat = pat.strip('"')
                    pat = re.sub(r"\$\{CMAKE_CURRENT_SOURCE_DIR\}/?", "", pat)
                    if "$" not in pat and glob_regex(pat).match(rel):
                        return f"{cml}:{text.count(chr(10), 0, g.start()) + 1} (GLOB {pat})", None
            ext = posixpath.splitext(path)[1]
            sib = re.search(r"(?<![\w.-])([\w./-]+" + re.escape(ext) + r")(?![\w.-])", text)
            if sib is None:  # this CMakeLists.txt builds no such file: the folder is not built
                return None, None
            return None, f"{cml}:{text.count(chr(10), 0, sib.start()) + 1} (next to {sib.group(1)})"
        if folder in ("", top.strip("/")) or folder == ".":
            return None, None
        folder = posixpath.dirname(folder)


# --- the check ------------------------------------------------------------------------------

def check_wiring(cfg: Config, tree: Tree, outputs: dict[str, tuple[bytes, int]]) -> WiringReport:
    """Whether every C, C++ and CUDA file the render adds is built by ``cfg.build.backend``."""
    view = Overlay(tree, outputs)
    prefix = "" if cfg.llama_cpp_dir in ("", ".") else cfg.llama_cpp_dir.rstrip("/") + "/"
    backend = cfg.build.backend
    report = WiringReport(backend=backend)
    sources = added_sources(tree, outputs)
    if backend == "cmake":
        for src in sources:
            how, hint = cmake_coverage(view, src, prefix)
            if how:
                report.rows.append(WiringRow(src, "cmake", "ok", how))
            elif hint:
                report.rows.append(WiringRow(src, "cmake", "missing", "", hint))
            else:
                report.rows.append(WiringRow(src, "cmake", "unbuilt",
                                             f"the nearest CMakeLists.txt above it names no {posixpath.splitext(src)[1]} "
                                             "file and globs none"))
        return report
    db = read_make(view)
    script = cfg.build.llamafile.cuda_script
    scanned = shellscan.scan(view.text, script) if script else None
    for src in sources:
        var, how = make_coverage(db, src)
        if var is not None:
            report.rows.append(WiringRow(src, "make", "ok", how))
            continue
        make_hint = make_join_hint(db, src)
        if src.endswith(".cu"):
            if scanned is not None:
                word = scanned.covers(src)
                if word is not None:
                    report.rows.append(WiringRow(src, "gpu script", "ok", f"{script} {scanned.describe(word)}"))
                    continue
                hint = script_join_hint(scanned, src) or make_hint
                if hint:
                    report.rows.append(WiringRow(src, "gpu script", "missing", "", hint))
                    continue
            elif make_hint:
                report.rows.append(WiringRow(src, "make", "missing", "", make_hint))
                continue
            why = (f"neither the make files nor {script} name a file of {posixpath.dirname(src)}/"
                   if scanned is not None else
                   f"the tree has no GPU library script ({script}) and its make files build no CUDA")
            report.rows.append(WiringRow(src, "gpu script", "unbuilt", why))
            continue
        if make_hint:
            report.rows.append(WiringRow(src, "make", "missing", "", make_hint))
        else:
            report.rows.append(WiringRow(src, "make", "unbuilt",
                                         f"no make list names a file of {posixpath.dirname(src)}/ "
                                         f"(the make files read: {', '.join(db.files) or 'none'})"))
    return report


def check_room(cfg: Config, tree_path: Path, baseline_rev: str, rendered: Iterable[str]) -> WiringReport:
    """The wiring check of a rendered work tree on disk (``rendered``: the files the render wrote,
    room-relative), against the baseline commit ``baseline_rev`` of the clean room."""
    outputs: dict[str, tuple[bytes, int]] = {}
    for rel in rendered:
        p = tree_path / rel
        if guard.regular_file(p) and not p.is_symlink():
            outputs[rel] = (guard.read_regular(p, what="the rendered file", follow=False), 0o644)
    return check_wiring(cfg, GitTree(tree_path, baseline_rev), outputs)
