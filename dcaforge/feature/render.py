"""Render a feature folder (``manifest.yaml`` + Jinja templates) into the clean room.

Every touched file starts from its content in the baseline commit, so rendering twice gives
the same bytes. Anchors are Python regexes that must match exactly ``count`` times; a missing
or ambiguous anchor names the manifest, the edit, the target file, the anchor and the
closest lines found. :func:`plan` computes what a render writes, writing nothing (``render
--check`` reports it per edit: :mod:`dcaforge.feature.drift`).
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import os
import posixpath
import re
import stat
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import SecurityError

from dcaforge import confine, guard, sandbox
from dcaforge.config import Config
from dcaforge.errors import ConfigError, DcaforgeError, MismatchError, SafetyError
from dcaforge.feature import shellscan
from dcaforge.feature.manifest import EditSpec, Manifest, load_manifest, manifest_digest
from dcaforge.git import rev_parse, status_porcelain
from dcaforge.room.blame import attribute
from dcaforge.room.cleanroom import START_TAG, Room, locked, write_atomic
from dcaforge.room.state import RoomState
from dcaforge.room.trees import GitTree, Tree, baseline_commit

# --- planning -----------------------------------------------------------------------------

@dataclass
class EditReport:
    index: int
    manifest_line: int
    action: str
    anchor: str
    count: int
    file: str | None = None  # the file chosen, relative to llama_cpp_dir
    matches: int = 0
    status: str = "ok"  # ok | skipped | missing | ambiguous | no-file
    match_lines: list[int] = field(default_factory=list)
    closest: list[str] = field(default_factory=list)
    note: str = ""
    variant: int | None = None  # what fitted: 0 = the edit's own anchor, k = alternatives[k - 1]
    tried: list[tuple[int, str, int, list[str]]] = field(default_factory=list)  # (variant, anchor, matches, closest)

    @property
    def fit(self) -> str:
        """``anchor``, ``alt K`` or ``-``: which anchor fitted, as `render --check` shows it."""
        if self.variant is None:
            return "-"
        return "anchor" if self.variant == 0 else f"alt {self.variant}"

    @property
    def fits(self) -> bool:
        return self.status in ("ok", "skipped")


@dataclass
class Plan:
    outputs: dict[str, tuple[bytes, int]]  # path relative to the room -> (bytes, mode)
    edits: list[EditReport]
    files: list[tuple[str, str]]  # (dest, "rendered" | "skipped")


def anchor_literal(anchor: str) -> str:
    s = re.sub(r"\(\?[aiLmsux]+\)", "", anchor)
    s = re.sub(r"\(\?P<\w+>|\(\?:|\(\?=|\(\?!", "", s)
    s = re.sub(r"\\[sS][*+?]?|\\[dDwW][*+?]?", " ", s)
    s = re.sub(r"(?<!\\)[\^$()]", "", s)
    s = re.sub(r"\\(.)", r"\1", s)
    return re.sub(r"\s+", " ", s).strip()


def closest_lines(text: str, anchor: str, n: int = 3) -> list[str]:
    """The ``n`` lines of ``text`` most like the anchor's literal text (difflib's ratio, ties to the
    earlier line), as ``"LINE: text"``; a line whose quick upper bound is below 0.3 is never one."""
    return list(_closest_lines(text, anchor, n)) if n > 0 else []


@functools.lru_cache(maxsize=64)  # render --check and the drift table ask again for the same file and anchor
def _closest_lines(text: str, anchor: str, n: int) -> tuple[str, ...]:
    literal = anchor_literal(anchor)
    la = len(literal)
    have = Counter(literal)
    # difflib's quick_ratio for each line, an upper bound of its ratio computed without a SequenceMatcher
    # (real_quick_ratio, the cheaper bound on lengths alone, first); lines below 0.3 are never candidates
    candidates: list[tuple[float, int, str, str]] = []
    for i, line in enumerate(text.splitlines(), 1):
        norm = re.sub(r"\s+", " ", line).strip()
        if not norm:
            continue
        length = la + len(norm)
        if 2.0 * min(la, len(norm)) / length < 0.3:
            continue
        bound = 2.0 * sum((have & Counter(norm)).values()) / length
        if bound >= 0.3:
            candidates.append((bound, i, norm, line))
    # the ratio, best bound first, until no bound left can beat the n-th best (ties go to the earlier line)
    candidates.sort(key=lambda t: (-t[0], t[1]))
    best: list[tuple[float, int, str]] = []
    for bound, i, norm, line in candidates:
        if len(best) == n and bound < best[-1][0]:
            break
        r = difflib.SequenceMatcher(None, literal, norm, autojunk=False).ratio()
        best.append((r, i, line.rstrip()))
        best.sort(key=lambda t: (-t[0], t[1]))
        del best[n:]
    return tuple(f"{i}: {line}" for _r, i, line in best)


class TreeFacts:
    """What a template or a ``when:`` may ask about the tree being rendered onto (the baseline,
    before this render's own files and edits); paths are relative to llama_cpp_dir."""

    def __init__(self, tree: Tree, prefix: str) -> None:
        self._tree = tree
        self._prefix = prefix
        self._texts: dict[str, str | None] = {}

    @staticmethod
    def _check(path: Any) -> None:
        problem = confine.path_problem(path) if isinstance(path, str) else "is not a string"
        if problem:
            raise SecurityError(f"tree: the path {path!r} {problem}")

    def _full(self, path: str, root: bool) -> str | None:
        self._check(path)
        full = posixpath.normpath(path if root else self._prefix + path)
        return None if full.startswith("../") or full == ".." or full.startswith("/") else full

    def has(self, path: str, root: bool = False) -> bool:
        """The file or folder exists (``root=True``: ``path`` is relative to the clean room's root)."""
        full = self._full(path, root)
        return full is not None and self._tree.exists(full)

    def text(self, path: str, root: bool = False) -> str | None:
        """The file's text, or None when it is absent (or not UTF-8)."""
        full = self._full(path, root)
        if full is None:
            return None
        if full not in self._texts:
            try:
                self._texts[full] = self._tree.read(full).decode("utf-8") if self._tree.is_file(full) else None
            except UnicodeDecodeError:
                self._texts[full] = None
        return self._texts[full]

    def contains(self, path: str, text: str, root: bool = False) -> bool:
        """The file exists and holds ``text`` (a literal string, not a regex)."""
        got = self.text(path, root)
        return got is not None and text in got

    def matches(self, path: str, regex: str, root: bool = False) -> bool:
        """The file exists and the Python regex ``regex`` matches somewhere in it (MULTILINE)."""
        got = self.text(path, root)
        return got is not None and re.search(regex, got, re.MULTILINE) is not None

    def search(self, path: str, regex: str, root: bool = False) -> str | None:
        """The first match of the Python regex ``regex`` (MULTILINE) in the file: its first group when it
        has one, else the whole match; None when the file is absent or nothing matches. E.g. the op count
        of this ggml: ``tree.search('ggml/src/ggml.c', 'GGML_OP_COUNT == ([0-9]+)') | int``."""
        got = self.text(path, root)
        m = re.search(regex, got, re.MULTILINE) if got is not None else None
        if m is None:
            return None
        return m.group(1) if m.re.groups else m.group(0)

    def script_builds(self, script: str, path: str, root: bool = False) -> bool:
        """The shell script ``script`` names ``path`` (both relative to llama_cpp_dir, or to the room's root
        with ``root=True``), literally or by a glob, after expanding its variables and following the
        files it ``source``\\ s and the functions it calls (:mod:`dcaforge.feature.shellscan`): e.g. llamafile's
        cuda.sh, whose build-functions.sh globs ``$ggml_cuda_dir/*.cu``."""
        full = self._full(script, root)
        target = self._full(path, root)
        if full is None or target is None:
            return False
        scanned = shellscan.scan(lambda rel: self.text(rel, root=True), full)
        return scanned is not None and scanned.covers(target) is not None

    def __repr__(self) -> str:
        return ("tree (has(path), contains(path, text), matches(path, regex), search(path, regex), script_builds(script, path); "
                "root=True: from the room's root)")


CONTEXT_HINT = ("fix the template there (templates see, in a sandbox: vars, marker, marker_comment, feature, llama_cpp_dir, "
                "tree (tree.has(path), tree.contains(path, text), tree.matches(path, regex), tree.search(path, regex), "
                "tree.script_builds(script, path), "
                "each with root=True for room-relative paths)), then run the command again")


def _context(cfg: Config, tree: Tree | None = None) -> dict[str, Any]:
    return {
        "tree": TreeFacts(tree, cfg.llama_prefix) if tree is not None else None,
        "vars": cfg.feature.vars,
        "marker": cfg.feature.marker,
        "marker_comment": cfg.feature.marker,
        "feature": {"number": cfg.feature.number, "name": cfg.feature.name,
                    "id": f"{cfg.feature.number:04d}-{cfg.feature.name}"},
        "llama_cpp_dir": cfg.llama_cpp_dir,
    }


def _env(folder: Path) -> jinja2.Environment:
    """Jinja's ImmutableSandboxedEnvironment, bounded (see :mod:`dcaforge.sandbox`); it loads templates (and
    includes) only from files whose real path is inside the feature folder."""
    return sandbox.environment(folder)


def _render_str(env: jinja2.Environment, source: str, ctx: dict[str, Any], where: str) -> str:
    try:
        return sandbox.render(env.from_string(source), ctx)
    except jinja2.TemplateError as exc:
        raise ConfigError(f"template error: {exc}", where=where,
                          hint=CONTEXT_HINT) from None


def render_template(cfg: Config, tree: Tree, folder: Path, source: str, where: str) -> str:
    """Render one template string as the renderer does (folder: for includes; tree: for ``tree``)."""
    return _render_str(_env(folder), source, _context(cfg, tree), where)


def _template_line(exc: BaseException, filename: str) -> int | None:
    """The template line a Jinja runtime error came from (Jinja rewrites the traceback to it)."""
    line = None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == filename:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _render_file(env: jinja2.Environment, template: str, ctx: dict[str, Any], folder: Path,
                 used_by: str | None = None) -> str:
    """Render a template of the feature folder; errors name its file and line (and ``used_by``,
    the manifest key that names it)."""
    path = folder / template
    also = f" (the body of {used_by})" if used_by else ""
    try:
        return sandbox.render(env.get_template(template), ctx)
    except jinja2.TemplateSyntaxError as exc:
        raise ConfigError(f"template syntax error: {exc.message}{also}", where=f"{path}:{exc.lineno}") from None
    except jinja2.TemplateError as exc:
        line = _template_line(exc, str(path))
        raise ConfigError(f"template error: {exc}{also}", where=f"{path}:{line}" if line else str(path),
                          hint=CONTEXT_HINT) from None


def _true(env: jinja2.Environment, when: str | None, ctx: dict[str, Any], where: str) -> bool:
    """Evaluate a ``when:`` expression (None: true)."""
    if when is None:
        return True
    try:
        sandbox.restart_clock(env)
        return bool(env.compile_expression(when)(**ctx))
    except jinja2.TemplateError as exc:
        raise ConfigError(f"'when: {when}' failed: {exc}", where=where, hint=CONTEXT_HINT) from None


def find_anchor(text: str, anchor: str) -> list[re.Match[str]]:
    return list(re.finditer(anchor, text))


def apply_edit(text: str, found: list[re.Match[str]], action: str, body: str) -> str:
    """Apply one edit at every match of its anchor (``found``, matched against ``text``): the
    rendered ``body`` is inserted before or after each match, or replaces it; for ``replace`` the
    body is expanded as a ``re`` replacement template (``\\1``, ``\\g<name>``, escapes).
    Raises re.error / IndexError on a bad group reference."""
    for m in reversed(found):
        if action == "insert_before":
            text = text[: m.start()] + body + text[m.start():]
        elif action == "insert_after":
            text = text[: m.end()] + body + text[m.end():]
        else:
            text = text[: m.start()] + m.expand(body) + text[m.end():]
    return text


Body = tuple[str, str | None, str]  # (Jinja source, text_file or None, the manifest key that holds it)


def _variants(edit: EditSpec) -> list[tuple[int, str, str, int, Body, str | None, int]]:
    """(variant, anchor, action, count, body, when, manifest line): the edit's own anchor, then its alternatives."""
    own: Body = (edit.text, edit.text_file, f"edits[{edit.index}].{'text_file' if edit.text_file else 'text'}")
    out: list[tuple[int, str, str, int, Body, str | None, int]] = [
        (0, edit.anchor, edit.action, edit.count, own, None, edit.line)]
    for a in edit.alternatives:
        key = f"edits[{edit.index}].alternatives[{a.index - 1}].{'text_file' if a.text_file else 'text'}"
        body = own if a.text is None else (a.text, a.text_file, key)
        out.append((a.index, a.anchor, a.action or edit.action, a.count or edit.count, body, a.when, a.line))
    return out


def _label(variant: int) -> str:
    return "anchor" if variant == 0 else f"alternatives[{variant - 1}]"


def plan(cfg: Config, tree: Tree, manifest: Manifest, *, check: bool = False) -> Plan:
    """Compute what rendering writes (nothing is written). ``check``: collect every edit's
    report instead of raising at the first that does not fit."""
    env = _env(manifest.folder)
    ctx = _context(cfg, tree)
    prefix = cfg.llama_prefix
    outputs: dict[str, tuple[bytes, int]] = {}
    files_report: list[tuple[str, str]] = []

    def exists(rel: str, pre: str = prefix) -> bool:
        return (pre + rel) in outputs or tree.exists(pre + rel)

    for spec in manifest.files:
        if spec.when_exists and not exists(spec.when_exists):
            files_report.append((spec.dest, "skipped"))
            continue
        if not _true(env, spec.when, ctx, f"{manifest.where(spec.line)} (files[{spec.index}].when)"):
            files_report.append((spec.dest, "skipped"))
            continue
        text = _render_file(env, spec.template, ctx, manifest.folder)
        full = prefix + spec.dest
        mode = spec.mode if spec.mode is not None else (tree.mode(full) if tree.exists(full) else 0o644)
        outputs[full] = (text.encode("utf-8"), mode)
        files_report.append((spec.dest, "rendered"))

    texts: dict[str, str] = {}
    pristine: dict[str, str] = {}  # each file before this render's edits: where the closest lines come from
    reports: list[EditReport] = []
    for edit in manifest.edits:
        rep = EditReport(index=edit.index, manifest_line=edit.line, action=edit.action, anchor=edit.anchor,
                         count=edit.count)
        reports.append(rep)
        pre = "" if edit.base == "room" else prefix
        if edit.when_exists and not exists(edit.when_exists, pre):
            rep.status = "skipped"
            rep.note = f"{edit.when_exists} does not exist"
            continue
        if not _true(env, edit.when, ctx, f"{manifest.where(edit.line)} (edits[{edit.index}].when)"):
            rep.status = "skipped"
            rep.note = f"when: {edit.when}"
            continue
        present = [c for c in edit.files if exists(c, pre)]
        if not present:
            rep.status = "no-file"
            rep.note = "none of " + ", ".join(edit.files) + " exists"
            if not check:
                raise MismatchError(
                    f"edit #{edit.index} of {manifest.path.name}: no target file exists ({', '.join(edit.files)})",
                    where=manifest.where(edit.line),
                    hint="add the file's new name to the edit's 'file:' list, or guard it with 'when_exists:' or 'when:'")
            continue
        # the candidates that exist, in order: the first in which an anchor fits is the edit's file (upstream
        # renamed gemma4-iswa.cpp to gemma4.cpp; a tree that has both keeps the edit where its code is)
        fitted = None
        first: EditReport | None = None
        for chosen in present:
            cand = EditReport(index=edit.index, manifest_line=edit.line, action=edit.action, anchor=edit.anchor,
                              count=edit.count, file=chosen)
            first = first or cand
            full = pre + chosen
            if full not in texts:
                if full in outputs:
                    texts[full] = outputs[full][0].decode("utf-8")
                else:
                    try:
                        texts[full] = tree.read(full).decode("utf-8")
                    except UnicodeDecodeError as exc:
                        raise ConfigError(f"edit #{edit.index}: {full} is not UTF-8 text ({exc.reason})",
                                          where=manifest.where(edit.line)) from None
                pristine[full] = texts[full]
            text = texts[full]
            for variant, anchor, action, count, body_spec, when, line in _variants(edit):
                if not _true(env, when, ctx, f"{manifest.where(line)} (edits[{edit.index}].alternatives[{variant - 1}].when)"):
                    continue
                found = find_anchor(text, anchor)
                lines = [text.count("\n", 0, m.start()) + 1 for m in found]
                if len(found) == count:
                    fitted = (variant, anchor, action, count, body_spec, found, lines)
                    break
                if found:  # matches, but not as often as required: an error, never a reason to try the next
                    cand.status = "ambiguous"
                    cand.variant, cand.anchor, cand.action, cand.count = variant, anchor, action, count
                    cand.matches, cand.match_lines = len(found), lines
                    cand.closest = [f"{ln}: {text.splitlines()[ln - 1].rstrip()}" for ln in lines[:5]]
                    cand.note = f"{_label(variant)} matches {len(found)} times" if edit.alternatives else ""
                    break
                cand.tried.append((variant, anchor, 0, closest_lines(pristine[full], anchor)))
            if fitted is not None or cand.status == "ambiguous":
                break
        assert first is not None
        if fitted is None and cand.status != "ambiguous":
            cand = first  # nothing fits anywhere: reported on the first candidate that exists
        rep = cand
        reports[-1] = rep
        full = pre + rep.file if rep.file else ""
        text = texts[full]
        if fitted is None:
            if rep.status != "ambiguous":
                rep.status = "missing"
                rep.closest = rep.tried[0][3] if rep.tried else []
                if edit.alternatives:
                    rep.note = f"none of {len(rep.tried)} anchors matches"
                if not rep.tried:
                    rep.note = "no alternative's 'when' holds"
            if not check:
                if rep.status == "ambiguous":
                    raise MismatchError(
                        f"edit #{edit.index} of {manifest.path.name}: {'anchor' if not rep.variant else _label(rep.variant)} "
                        f"matches {rep.matches} times, expected {rep.count} in {full}",
                        where=f"{manifest.where(edit.line)} -> {full}",
                        details=f"anchor: {rep.anchor}\nmatched lines:\n" + "\n".join("  " + c for c in rep.closest),
                        hint="make the anchor unique (try `dcaforge render --check`), or set 'count:'")
                what = "anchor matches nowhere" if not edit.alternatives else \
                    f"neither the anchor nor its {len(edit.alternatives)} alternatives match"
                details = "\n".join(f"{_label(v) + ': ' if edit.alternatives else 'anchor: '}{a}\nclosest lines:\n"
                                    + "\n".join("  " + c for c in close) for v, a, _n, close in rep.tried)
                raise MismatchError(
                    f"edit #{edit.index} of {manifest.path.name}: {what} in {full}",
                    where=f"{manifest.where(edit.line)} -> {full}", details=details or rep.note,
                    hint="adjust the anchor or add one to 'alternatives:' (try `dcaforge render --check`), "
                         "or guard the edit with 'when_exists:' or 'when:'")
            continue
        variant, anchor, action, count, (body_src, body_file, key), found, lines = fitted
        rep.variant, rep.anchor, rep.action, rep.count = variant, anchor, action, count
        rep.matches, rep.match_lines = len(found), lines
        if body_file is not None:  # through the folder's loader, so an error names the body's file and line
            body = _render_file(env, body_file, ctx, manifest.folder, f"{key} of {manifest.where(edit.line)}")
        else:
            body = _render_str(env, body_src, ctx, f"{manifest.where(edit.line)} ({key})")
        try:
            texts[full] = apply_edit(text, found, action, body)
        except (re.error, IndexError) as exc:
            raise ConfigError(f"edit #{edit.index}: bad group reference in '{key}'"
                              + (f" ({manifest.folder / body_file})" if body_file else "") + f": {exc}",
                              where=manifest.where(edit.line),
                              hint="a replace body is a `re` replacement template: write a literal backslash as \\\\") from None
    for full, text in texts.items():
        mode = outputs[full][1] if full in outputs else tree.mode(full)
        outputs[full] = (text.encode("utf-8"), mode)
    return Plan(outputs=outputs, edits=reports, files=files_report)


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
