"""The user's bookkeeping, kept by ``capture`` when the config has ``bookkeeping:``.

- ``series_readme``: the patch's row in the table of a section (default "Current series") of the
  series README. The row is found by the feature's number at the start of its first cell
  (``0078``, ``` `0078-dca` ```, ``[0078-dca](...)``), so a renamed patch keeps its row; a new row
  goes in number order.
- ``upstream_sync``: the marker's entry (a list item or a table row) in a section (default
  "Markers") of an UPSTREAM_SYNC-style document, found by the marker text.

Both lines are Jinja templates rendered from the captured patch (see ``context``); a line that
already says the same is left alone, so a second capture changes nothing. Every file is read and
every edit planned before anything is written, and the files must lie outside the source
checkout and the clean-room workspace (they are the user's records, never part of a tree).
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from dcaforge import confine, sandbox
from dcaforge.checkout import inspect_checkout
from dcaforge.config import Config, GitSource
from dcaforge.configsections import BOOKKEEPING_CONTEXT, DEFAULT_README_ROW, BookkeepingDoc
from dcaforge.errors import ConfigError, DcaforgeError, SafetyError
from dcaforge.git import is_inside
from dcaforge.room.cleanroom import Room, write_all_atomic

_HEADING = re.compile(r"^(#{1,6})[ \t]+(.*?)[ \t]*#*[ \t]*$")
_FENCE = re.compile(r"^\s*(```|~~~)")
_SEPARATOR = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")
_BULLET = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s")


@dataclass
class DocUpdate:
    doc: BookkeepingDoc
    kind: str        # "series_readme" | "upstream_sync"
    old: bytes
    new: bytes
    action: str      # "added" | "updated" | "unchanged"
    line: int        # 1-based line of the row/entry in the new text
    text: str        # the row/entry

    @property
    def path(self) -> Path:
        return self.doc.file

    @property
    def changed(self) -> bool:
        return self.old != self.new


# --- where the files may be ----------------------------------------------------------------

def check_outside_trees(cfg: Config, path: Path, what: str, *, workspace: bool = True, hint: str | None = None) -> None:
    """Refuse ``path`` inside a git directory (any repository's: git's own files), inside the source
    checkout or its git directory (a linked worktree's common one and main worktree included: the
    user's tree is only read), inside the clean room (it would end up in the next capture), or
    (``workspace``) anywhere in the workspace. Symlinks are followed."""
    hint = hint or "keep the series and its bookkeeping in a folder of their own, outside git directories, the " \
                   "source checkout and 'cleanroom:'; then run the command again"
    real = Path(os.path.realpath(path))
    for candidate in (path, real):
        gitdir = confine.git_dir_above(candidate)
        if gitdir is not None:
            raise SafetyError(f"{what} {path} is inside the git directory {gitdir} (git's own files)",
                              where=cfg.describe(), hint=hint)
    inside = cfg.workspace if workspace else cfg.room
    if is_inside(path, inside):
        raise SafetyError(f"{what} {path} is inside the clean-room {'workspace' if workspace else 'tree'} {inside}",
                          where=cfg.describe(),
                          hint=hint or "keep it beside the series (e.g. in the series folder), outside 'cleanroom:'")
    if isinstance(cfg.source, GitSource) and cfg.source.local_path is not None:
        info = inspect_checkout(cfg.source.local_path)
        for top in info.folders if info else [cfg.source.local_path]:
            if is_inside(path, top):
                raise SafetyError(f"{what} {path} is inside the source checkout {top}, which dcaforge never writes",
                                  where=cfg.describe(), hint=hint)


def check_not_managed(cfg: Config, path: Path, what: str) -> None:
    """Refuse ``path`` when it is (or is inside) a file dcaforge reads or keeps: the config, the
    bookkeeping documents, the feature folder, another patch of the series, or what dcaforge makes
    beside the clean room (its lock, the leftovers of an interrupted run, the baseline worktree, the
    gates' folder: :meth:`Room.own_paths`). Writing there would replace the user's input or be
    deleted by the next run. Symlinks are followed (the path as given and where it leads are both checked)."""
    managed: dict[Path, str] = {}
    if cfg.path is not None:
        managed[cfg.path] = "the config"
    for doc in cfg.bookkeeping.docs:
        managed[doc.file] = "a bookkeeping document (capture keeps its row or entry; -o writes only the patch)"
    managed[cfg.feature.templates] = "the feature folder"
    managed.update(Room.of(cfg).own_paths())
    series = cfg.series.dir
    if series.is_dir() and (is_inside(path, series)):
        for p in series.iterdir():
            if p.name.endswith(".patch") and p.name != cfg.feature.patch_name:
                managed[p] = "a patch of the series"
    forms = {Path(os.path.abspath(path)), Path(os.path.realpath(path))}
    for target, kind in managed.items():
        targets = {Path(os.path.abspath(target)), Path(os.path.realpath(target))}
        if any(f == t or t in f.parents for f in forms for t in targets):
            raise SafetyError(f"{what} {path} is {kind} ({target}); refusing to write there", where=cfg.describe(),
                              hint="write the patch to a file of its own (e.g. `dcaforge capture -o "
                                   f"{shlex.quote(str(cfg.series.dir.parent / cfg.feature.patch_name))}`), or run "
                                   "`dcaforge capture` without -o to update the series")


# --- the template context ------------------------------------------------------------------

def marked_lines(data: bytes, marker: str) -> tuple[list[str], int]:
    """Files whose added lines carry the marker, and how many such lines the patch adds."""
    files: set[str] = set()
    sites = 0
    cur = ""
    needle = marker.encode()
    for line in data.split(b"\n"):
        if line.startswith(b"diff --git "):
            m = re.match(rb'^diff --git "?a/.+?"? "?b/(.+?)"?$', line)
            cur = m.group(1).decode("utf-8", "replace") if m else ""
        elif line.startswith(b"+") and not line.startswith(b"+++ ") and needle in line:
            sites += 1
            files.add(cur)
    return sorted(files), sites


def context(cfg: Config, patch: Path, data: bytes, files: list[str], sha256: str) -> dict[str, Any]:
    f = cfg.feature
    marked, sites = marked_lines(data, f.marker)
    ctx = {"feature": {"number": f.number, "name": f.name, "id": f"{f.number:04d}-{f.name}"},
           "marker": f.marker, "vars": f.vars, "llama_cpp_dir": cfg.llama_cpp_dir, "patch": patch.name,
           "sha256": sha256, "files": list(files), "n_files": len(files), "marked_files": marked,
           "marker_sites": sites}
    assert set(ctx) == set(BOOKKEEPING_CONTEXT)
    return ctx


def _render(doc: BookkeepingDoc, ctx: dict[str, Any], key: str, marker: str) -> str:
    """The row or entry (sandboxed Jinja), checked: one line; a table row; holding the marker."""
    tkey = f"bookkeeping.{key}.{'row' if key == 'series_readme' else 'entry'}"
    try:
        line = sandbox.render(sandbox.environment().from_string(doc.template), ctx)
    except jinja2.TemplateError as exc:
        raise ConfigError(f"{tkey} template error: {exc}", where=doc.where,
                          hint="the context has: " + ", ".join(BOOKKEEPING_CONTEXT)) from None
    line = line.strip("\r\n")
    if not line.strip() or "\n" in line:
        raise ConfigError(f"'{tkey}' must render to exactly one line, got {line[:200]!r}", where=doc.where,
                          hint=f"fix {tkey} in the config, then capture again; nothing was written")
    if key == "series_readme" and not line.lstrip().startswith("|"):
        raise ConfigError(f"'{tkey}' must render to a Markdown table row (starting with '|')", where=doc.where,
                          hint=f"e.g. {DEFAULT_README_ROW!r}; nothing was written")
    if key == "upstream_sync" and marker not in line:
        raise ConfigError(f"'{tkey}' must contain the marker (it is how capture finds the entry again)",
                          where=doc.where, hint="put {{ marker }} in it; nothing was written")
    return line


# --- Markdown -------------------------------------------------------------------------------

def _read(doc: BookkeepingDoc, key: str) -> tuple[bytes, list[str], str, bool]:
    """(bytes, lines without line ends, the line end, ends with a line end)."""
    try:
        raw = doc.file.read_bytes()
    except FileNotFoundError:
        raise DcaforgeError(f"bookkeeping file not found: {doc.file}", where=f"bookkeeping.{key} ({doc.where})",
                            hint=f"create it with a '## {doc.section}' section"
                                 + (" holding a table (header and --- line)" if key == "series_readme" else "")
                                 + f", or remove bookkeeping.{key} from the config") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DcaforgeError(f"bookkeeping file is not UTF-8: {doc.file} ({exc.reason} at byte {exc.start})",
                            where=str(doc.file)) from None
    return (raw, *_split(text))


def _split(text: str) -> tuple[list[str], str, bool]:
    """Lines (split at the file's own line end only, so other bytes stay as they are), the line
    end, and whether the text ends with one."""
    eol = "\r\n" if "\r\n" in text else "\n"
    lines = text.split(eol)
    final = len(lines) > 1 and lines[-1] == ""
    if final:
        lines.pop()
    return lines, eol, final


def _section(lines: list[str], title: str, doc: BookkeepingDoc, key: str) -> tuple[int, int]:
    """(index of the heading, index past the section's last line)."""
    headings: list[tuple[int, int, str]] = []
    fence = False
    for i, line in enumerate(lines):
        if _FENCE.match(line):
            fence = not fence
            continue
        m = None if fence else _HEADING.match(line)
        if m:
            headings.append((i, len(m.group(1)), m.group(2)))
    want = title.strip().casefold()
    found = [h for h in headings if h[2].strip().casefold() == want]
    if not found:
        names = ", ".join(repr(h[2]) for h in headings[:8]) or "none"
        raise DcaforgeError(f"no section {title!r} in {doc.file}", where=f"bookkeeping.{key} ({doc.where})",
                            details=f"headings there: {names}",
                            hint=f"add a '## {title}' heading to {doc.file.name}, or set bookkeeping.{key}.section")
    if len(found) > 1:
        raise DcaforgeError(f"{len(found)} sections {title!r} in {doc.file} (lines "
                            f"{', '.join(str(h[0] + 1) for h in found)}): which one to keep up to date?",
                            where=str(doc.file), hint="rename or merge them")
    start, level, _t = found[0]
    end = len(lines)
    for i, lvl, _t2 in headings:
        if i > start and lvl <= level:
            end = i
            break
    return start, end


def _table(lines: list[str], start: int, end: int) -> tuple[int, int] | None:
    """(first row index, index past the last row) of the first table in lines[start:end]."""
    for i in range(start, end):
        if lines[i].lstrip().startswith("|"):
            j = i
            while j < end and lines[j].lstrip().startswith("|"):
                j += 1
            return i, j
    return None


def row_number(line: str) -> int | None:
    """The patch number a table row starts with: ``| 0078-dca |``, ``| `0078` |``, ``| [0078-x](...) |``."""
    s = line.strip()
    if not s.startswith("|"):
        return None
    first = s[1:].split("|", 1)[0]
    m = re.match(r"^[\s`*_\[(]*(\d{4})(?!\d)", first)
    return int(m.group(1)) if m else None


def _set_line(lines: list[str], i: int, text: str) -> tuple[str, int]:
    """Line i becomes text: ("unchanged" or "updated", its 1-based line number)."""
    if lines[i] == text:
        return "unchanged", i + 1
    lines[i] = text
    return "updated", i + 1


def _set_the_one(lines: list[str], same: list[int], text: str, doc: BookkeepingDoc, what: str, question: str,
                 hint: str) -> tuple[str, int] | None:
    """The one line of ``same`` set to ``text`` (None when there is none); two or more are an error naming them."""
    if len(same) > 1:
        raise DcaforgeError(f"{len(same)} {what} (lines {', '.join(str(i + 1) for i in same)}): {question}",
                            where=f"{doc.file}:{same[0] + 1}", hint=hint)
    return _set_line(lines, same[0], text) if same else None


def _upsert_row(lines: list[str], doc: BookkeepingDoc, row: str, number: int) -> tuple[str, int]:
    start, end = _section(lines, doc.section, doc, "series_readme")
    table = _table(lines, start + 1, end)
    if table is None or table[1] - table[0] < 2 or not _SEPARATOR.match(lines[table[0] + 1]):
        raise DcaforgeError(f"the section {doc.section!r} of {doc.file} has no table (a header row and a --- row)",
                            where=f"{doc.file}:{start + 1}",
                            hint="add a table under the heading, e.g.\n  | patch | what | marker |\n  |---|---|---|")
    first, past = table[0] + 2, table[1]
    same = [i for i in range(first, past) if row_number(lines[i]) == number]
    done = _set_the_one(lines, same, row, doc, f"rows for {number:04d} in {doc.file}", "which one is the patch's?",
                        hint="delete the extra rows, then capture again")
    if done is not None:
        return done
    at = past
    for i in range(first, past):
        n = row_number(lines[i])
        if n is not None and n > number:
            at = i
            break
    lines.insert(at, row)
    return "added", at + 1


def _has_marker(line: str, marker: str) -> bool:
    return re.search(re.escape(marker) + r"(?![\w-])", line) is not None


def _upsert_entry(lines: list[str], doc: BookkeepingDoc, entry: str, marker: str) -> tuple[str, int]:
    start, end = _section(lines, doc.section, doc, "upstream_sync")
    same = [i for i in range(start + 1, end)
            if (lines[i].lstrip().startswith("|") or _BULLET.match(lines[i])) and _has_marker(lines[i], marker)]
    done = _set_the_one(lines, same, entry, doc, f"entries for the marker {marker!r} in the section {doc.section!r} of "
                        f"{doc.file}", "which one is it?", hint="merge them into one, then capture again")
    if done is not None:
        return done
    if entry.lstrip().startswith("|"):
        table = _table(lines, start + 1, end)
        if table is None:
            raise DcaforgeError(f"the entry is a table row but the section {doc.section!r} of {doc.file} has no table",
                                where=f"{doc.file}:{start + 1}",
                                hint="add the table's header there, or make bookkeeping.upstream_sync.entry a list item")
        lines.insert(table[1], entry)
        return "added", table[1] + 1
    bullets = [i for i in range(start + 1, end) if _BULLET.match(lines[i])]
    if bullets:
        at = bullets[-1] + 1
        while at < end and lines[at].strip() and lines[at][:1] in (" ", "\t"):
            at += 1  # the last item's continuation lines
        lines.insert(at, entry)
        return "added", at + 1
    content = [i for i in range(start + 1, end) if lines[i].strip()]
    if content:
        at = content[-1] + 1
        lines[at:at] = ["", entry]
        return "added", at + 2
    lines[start + 1:start + 1] = ["", entry] + ([""] if start + 1 < len(lines) and lines[start + 1].strip() else [])
    return "added", start + 3


# --- planning and writing --------------------------------------------------------------------

def plan(cfg: Config, patch: Path, data: bytes, files: list[str], sha256: str) -> list[DocUpdate]:
    """What capture writes into the bookkeeping files (nothing is written; errors come first)."""
    docs = cfg.bookkeeping
    if not docs.docs:
        return []
    ctx = context(cfg, patch, data, files, sha256)
    out: list[DocUpdate] = []
    for key, doc in (("series_readme", docs.series_readme), ("upstream_sync", docs.upstream_sync)):
        if doc is None:
            continue
        check_outside_trees(cfg, doc.file, f"bookkeeping.{key} file")
        prior = next((u for u in out if u.path == doc.file), None)
        if prior is not None:  # both kept in one file: edit the text the first edit made
            raw = prior.new
            lines, eol, final = _split(raw.decode("utf-8"))
        else:
            raw, lines, eol, final = _read(doc, key)
        line = _render(doc, ctx, key, cfg.feature.marker)
        if key == "series_readme":
            action, lineno = _upsert_row(lines, doc, line, cfg.feature.number)
        else:
            action, lineno = _upsert_entry(lines, doc, line, cfg.feature.marker)
        new = (eol.join(lines) + (eol if final else "")).encode("utf-8")
        if action == "unchanged":
            new = raw
        out.append(DocUpdate(doc=doc, kind=key, old=prior.old if prior else raw, new=new, action=action,
                             line=lineno, text=line))
        if prior is not None:
            prior.new = new
    return out


def writes(updates: list[DocUpdate]) -> list[tuple[Path, bytes, int | None]]:
    """The files to write for ``updates`` (one per changed file, holding all of its edits)."""
    out: list[tuple[Path, bytes, int | None]] = []
    done: set[Path] = set()
    for u in reversed(updates):  # the last update of a file holds all of its edits
        if u.path in done:
            continue
        done.add(u.path)
        if u.new != u.old:
            out.append((u.path, u.new, None))
    return out


def write(updates: list[DocUpdate]) -> None:
    write_all_atomic(writes(updates), "the bookkeeping file")
