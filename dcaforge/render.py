"""Render a feature folder (``manifest.yaml`` + Jinja templates) into the clean room.

Every touched file starts from its content in the baseline commit, so rendering twice gives
the same bytes. Anchors are Python regexes that must match exactly ``count`` times; a missing
or ambiguous anchor names the manifest, the edit, the target file, the anchor and the
closest lines found. ``check`` reports per edit whether it fits, writing nothing.

Trees differ between llama.cpp versions, so a manifest can choose by what the tree has: a file
list (the first that exists), ``when_exists``, ``when`` (a Jinja expression over ``tree``, e.g.
``tree.has(path)`` or ``tree.contains(path, text)``) on files, edits and alternatives, and per
edit ``alternatives`` (other anchors, with their own text if needed; the first that fits wins).
"""

from __future__ import annotations

import difflib
import hashlib
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

import jinja2

from .cleanroom import BASELINE_TAG, Room, locked, write_atomic
from .config import Config
from .errors import ConfigError, DcaforgeError, MismatchError, SafetyError
from .git import git, rev_parse, status_porcelain
from .yamlio import Reader, load_yaml

ACTIONS = ("insert_before", "insert_after", "replace")


@dataclass(frozen=True)
class FileSpec:
    index: int
    line: int
    template: str
    dest: str
    mode: int | None
    when_exists: str | None
    when: str | None = None


@dataclass(frozen=True)
class AltSpec:
    """One of an edit's ``alternatives``: tried in order when the anchors before it match nowhere."""

    index: int  # 1-based, as `render --check` shows it
    line: int
    anchor: str
    action: str | None = None  # None: the edit's
    count: int | None = None
    text: str | None = None  # the body's Jinja source (read from text_file when that is set)
    when: str | None = None
    text_file: str | None = None  # the body's template, relative to the feature folder


@dataclass(frozen=True)
class EditSpec:
    index: int
    line: int
    files: tuple[str, ...]
    when_exists: str | None
    anchor: str
    count: int
    action: str
    text: str  # the body's Jinja source (read from text_file when that is set)
    when: str | None = None
    alternatives: tuple[AltSpec, ...] = ()
    text_file: str | None = None  # the body's template, relative to the feature folder


@dataclass(frozen=True)
class Manifest:
    path: Path
    folder: Path
    files: tuple[FileSpec, ...]
    edits: tuple[EditSpec, ...]

    def where(self, line: int) -> str:
        return f"{self.path}:{line}"


def _mode(r: Reader, value: Any) -> int | None:
    if value is None:
        return None
    try:
        mode = int(str(value), 8)
    except ValueError:
        raise r.error("mode", f"'{r.key('mode')}' must be an octal string like \"0644\", got {value!r}") from None
    if mode not in (0o644, 0o755):
        raise r.error("mode", f"'{r.key('mode')}' must be \"0644\" or \"0755\" (what git records), got {value!r}")
    return mode


def _relpath(r: Reader, key: str, value: str) -> str:
    p = PurePosixPath(value)
    if p.is_absolute() or ".." in p.parts or not value.strip():
        raise r.error(key, f"'{r.key(key)}' must be a relative path under llama_cpp_dir, got {value!r}")
    return p.as_posix()


def _feature_file(r: Reader, key: str, value: str, folder: Path) -> str:
    """A file of the feature folder named by ``key``: relative, no '..', there, and (symlinks
    resolved) still inside the folder."""
    p = PurePosixPath(value)
    if p.is_absolute() or ".." in p.parts or not value.strip():
        raise r.error(key, f"'{r.key(key)}' must be a relative path inside the feature folder {folder}, got {value!r}",
                      hint="write it relative to the folder of manifest.yaml, without '..'")
    path = folder / p
    if not path.is_file():
        raise r.error(key, f"'{r.key(key)}': no such file {path}",
                      hint=f"create it, or fix the path (relative to {folder})")
    if not path.resolve().is_relative_to(folder.resolve()):
        raise r.error(key, f"'{r.key(key)}' = {value!r} leads out of the feature folder (to {path.resolve()})",
                      hint="templates must live inside the feature folder: copy the file there instead of linking it")
    return p.as_posix()


def _text(r: Reader, folder: Path, *, required: bool) -> tuple[str | None, str | None]:
    """An edit's or alternative's body: ``text`` (inline) or ``text_file`` (a template of the
    feature folder): (the Jinja source, text_file or None)."""
    if r.has("text") and r.has("text_file"):
        raise r.error("text_file", f"'{r.key('text')}' and '{r.key('text_file')}' are both set",
                      hint="keep one: the body inline (text) or in a template file (text_file)")
    name = r.get("text_file", str)
    if name is None:
        if required and r.get("text", str) is None:
            raise ConfigError(f"missing key '{r.key('text')}'", where=r.where(),
                              hint="add 'text:' (the body inline) or 'text_file:' (a template of the feature folder)")
        return r.get("text", str), None
    rel = _feature_file(r, "text_file", name, folder)
    try:
        source = (folder / rel).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise r.error("text_file", f"'{r.key('text_file')}': {folder / rel} is not UTF-8 text ({exc.reason})") from None
    return source, rel


def _when(r: Reader) -> str | None:
    when = r.get("when", str)
    if when is None:
        return None
    try:
        _env(Path(".")).compile_expression(when)
    except jinja2.TemplateSyntaxError as exc:
        raise r.error("when", f"'{r.key('when')}' is not a valid Jinja expression: {exc.message}",
                      hint="e.g. when: \"tree.has('src/models/gemma4.cpp')\"") from None
    return when


def _anchor(r: Reader) -> str:
    anchor = r.get("anchor", str, required=True)
    try:
        re.compile(anchor)
    except re.error as exc:
        raise r.error("anchor", f"'{r.key('anchor')}' is not a valid regex: {exc}") from None
    return anchor


def _action(r: Reader, required: bool) -> str | None:
    action = r.get("action", str, required=required)
    if action is not None and action not in ACTIONS:
        raise r.error("action", f"'{r.key('action')}' must be one of {', '.join(ACTIONS)}, got {action!r}")
    return action


def _count(r: Reader) -> int | None:
    count = r.get("count", int)
    if count is not None and count < 1:
        raise r.error("count", f"'{r.key('count')}' must be at least 1, got {count}")
    return count


def load_manifest(folder: Path) -> Manifest:
    path = folder / "manifest.yaml"
    if not path.is_file():
        raise ConfigError(f"no manifest.yaml in the feature folder {folder}", where=str(path),
                          hint="check feature.templates in the config")
    file = str(path)
    top = Reader(load_yaml(path), file)
    top.check_keys({"files", "edits"})
    files: list[FileSpec] = []
    raw_files = top.get("files", list, default=[])
    for i, item in enumerate(raw_files):
        line = top.list_lines("files")[i]
        r = Reader(item, file, f"files[{i}]", line)
        r.check_keys({"template", "dest", "mode", "when_exists", "when"})
        template = _feature_file(r, "template", r.get("template", str, required=True), folder)
        when = r.get("when_exists", str)
        files.append(FileSpec(index=i, line=line, template=template,
                              dest=_relpath(r, "dest", r.get("dest", str, required=True)),
                              mode=_mode(r, r.get("mode", (str, int))),
                              when_exists=_relpath(r, "when_exists", when) if when else None,
                              when=_when(r)))
    edits: list[EditSpec] = []
    for i, item in enumerate(top.get("edits", list, default=[])):
        line = top.list_lines("edits")[i]
        r = Reader(item, file, f"edits[{i}]", line)
        r.check_keys({"file", "when_exists", "when", "anchor", "count", "action", "text", "text_file", "alternatives"})
        target = r.get("file", (str, list), required=True)
        cands = [target] if isinstance(target, str) else list(target)
        if not cands or not all(isinstance(c, str) for c in cands):
            raise r.error("file", f"'{r.key('file')}' must be a path or a non-empty list of paths")
        anchor = _anchor(r)
        action = _action(r, required=True)
        count = _count(r) or 1
        when = r.get("when_exists", str)
        alts: list[AltSpec] = []
        raw_alts = r.get("alternatives", list, default=[])
        for k, alt in enumerate(raw_alts):
            ar = Reader(alt, file, f"edits[{i}].alternatives[{k}]", r.list_lines("alternatives")[k])
            ar.check_keys({"anchor", "action", "count", "text", "text_file", "when"})
            alt_text, alt_file = _text(ar, folder, required=False)
            alts.append(AltSpec(index=k + 1, line=ar.line, anchor=_anchor(ar), action=_action(ar, required=False),
                                count=_count(ar), text=alt_text, when=_when(ar), text_file=alt_file))
        text, text_file = _text(r, folder, required=True)
        assert text is not None
        edits.append(EditSpec(index=i, line=line, files=tuple(_relpath(r, "file", c) for c in cands),
                              when_exists=_relpath(r, "when_exists", when) if when else None,
                              anchor=anchor, count=count, action=action or "",
                              text=text, when=_when(r), alternatives=tuple(alts), text_file=text_file))
    return Manifest(path=path, folder=folder, files=tuple(files), edits=tuple(edits))


def manifest_digest(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            h.update(p.relative_to(folder).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


# --- trees the renderer reads from ------------------------------------------------------

class Tree(Protocol):
    def exists(self, rel: str) -> bool: ...
    def is_file(self, rel: str) -> bool: ...
    def read(self, rel: str) -> bytes: ...
    def mode(self, rel: str) -> int: ...


class GitTree:
    """A commit of a repository, read with ls-tree / cat-file (no checkout)."""

    def __init__(self, repo: Path, rev: str) -> None:
        self.repo = repo
        self.rev = rev
        out = git(repo, "ls-tree", "-r", "-z", "--full-tree", rev).stdout
        self.entries: dict[str, tuple[int, str]] = {}
        self.dirs: set[str] = set()
        for item in out.split("\0"):
            if not item:
                continue
            meta, path = item.split("\t", 1)
            mode, _kind, sha = meta.split()
            self.entries[path] = (int(mode, 8), sha)
            parts = path.split("/")
            for j in range(1, len(parts)):
                self.dirs.add("/".join(parts[:j]))

    def exists(self, rel: str) -> bool:
        return rel in self.entries or rel in self.dirs

    def is_file(self, rel: str) -> bool:
        return rel in self.entries

    def read(self, rel: str) -> bytes:
        return git(self.repo, "cat-file", "blob", self.entries[rel][1]).stdout_bytes

    def mode(self, rel: str) -> int:
        return 0o755 if self.entries[rel][0] & 0o111 else 0o644


class DirTree:
    """A plain folder (``render --check --tree DIR``)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def exists(self, rel: str) -> bool:
        return (self.root / rel).exists()

    def is_file(self, rel: str) -> bool:
        return (self.root / rel).is_file()

    def read(self, rel: str) -> bytes:
        return (self.root / rel).read_bytes()

    def mode(self, rel: str) -> int:
        return 0o755 if (self.root / rel).stat().st_mode & 0o111 else 0o644


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


def _anchor_literal(anchor: str) -> str:
    s = re.sub(r"\(\?[aiLmsux]+\)", "", anchor)
    s = re.sub(r"\(\?P<\w+>|\(\?:|\(\?=|\(\?!", "", s)
    s = re.sub(r"\\[sS][*+?]?|\\[dDwW][*+?]?", " ", s)
    s = re.sub(r"(?<!\\)[\^$()]", "", s)
    s = re.sub(r"\\(.)", r"\1", s)
    return re.sub(r"\s+", " ", s).strip()


def closest_lines(text: str, anchor: str, n: int = 3) -> list[str]:
    literal = _anchor_literal(anchor)
    scored = []
    for i, line in enumerate(text.splitlines(), 1):
        norm = re.sub(r"\s+", " ", line).strip()
        if not norm:
            continue
        sm = difflib.SequenceMatcher(None, literal, norm, autojunk=False)
        if sm.real_quick_ratio() < 0.3 or sm.quick_ratio() < 0.3:
            continue
        scored.append((sm.ratio(), i, line.rstrip()))
    scored.sort(key=lambda t: (-t[0], t[1]))
    return [f"{i}: {line}" for _r, i, line in scored[:n]]


class TreeFacts:
    """What a template or a ``when:`` may ask about the tree being rendered onto (the baseline,
    before this render's own files and edits); paths are relative to llama_cpp_dir."""

    def __init__(self, tree: Tree, prefix: str) -> None:
        self._tree = tree
        self._prefix = prefix
        self._texts: dict[str, str | None] = {}

    def has(self, path: str) -> bool:
        """The file or folder exists."""
        return self._tree.exists(self._prefix + path)

    def text(self, path: str) -> str | None:
        """The file's text, or None when it is absent (or not UTF-8)."""
        if path not in self._texts:
            full = self._prefix + path
            try:
                self._texts[path] = self._tree.read(full).decode("utf-8") if self._tree.is_file(full) else None
            except UnicodeDecodeError:
                self._texts[path] = None
        return self._texts[path]

    def contains(self, path: str, text: str) -> bool:
        """The file exists and holds ``text`` (a literal string, not a regex)."""
        got = self.text(path)
        return got is not None and text in got

    def __repr__(self) -> str:
        return "tree (has(path), contains(path, text))"


CONTEXT_HINT = "the context has: vars, marker, marker_comment, feature, llama_cpp_dir, tree (tree.has(path), tree.contains(path, text))"


def _prefix(cfg: Config) -> str:
    return "" if cfg.llama_cpp_dir in ("", ".") else cfg.llama_cpp_dir.rstrip("/") + "/"


def _context(cfg: Config, tree: Tree | None = None) -> dict[str, Any]:
    return {
        "tree": TreeFacts(tree, _prefix(cfg)) if tree is not None else None,
        "vars": cfg.feature.vars,
        "marker": cfg.feature.marker,
        "marker_comment": cfg.feature.marker,
        "feature": {"number": cfg.feature.number, "name": cfg.feature.name,
                    "id": f"{cfg.feature.number:04d}-{cfg.feature.name}"},
        "llama_cpp_dir": cfg.llama_cpp_dir,
    }


class _FolderLoader(jinja2.FileSystemLoader):
    """The feature folder's templates, and nothing a link inside it points to outside of it (a
    ``text_file``, a ``files:`` template or an ``{% include %}``)."""

    def __init__(self, folder: Path) -> None:
        super().__init__(str(folder))
        self.folder = folder.resolve()

    def get_source(self, environment: jinja2.Environment, template: str) -> tuple[str, str, Any]:
        source, filename, uptodate = super().get_source(environment, template)
        if not Path(filename).resolve().is_relative_to(self.folder):
            raise ConfigError(f"template {template!r} leads out of the feature folder (to {Path(filename).resolve()})",
                              where=filename, hint="templates must live inside the feature folder: copy the file "
                                                   "there instead of linking it")
        return source, filename, uptodate


def _env(folder: Path) -> jinja2.Environment:
    return jinja2.Environment(loader=_FolderLoader(folder), undefined=jinja2.StrictUndefined,
                              keep_trailing_newline=True, autoescape=False)


def _render_str(env: jinja2.Environment, source: str, ctx: dict[str, Any], where: str) -> str:
    try:
        return env.from_string(source).render(ctx)
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
        return env.get_template(template).render(ctx)
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
    prefix = _prefix(cfg)
    outputs: dict[str, tuple[bytes, int]] = {}
    files_report: list[tuple[str, str]] = []

    def exists(rel: str) -> bool:
        return (prefix + rel) in outputs or tree.exists(prefix + rel)

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
    reports: list[EditReport] = []
    for edit in manifest.edits:
        rep = EditReport(index=edit.index, manifest_line=edit.line, action=edit.action, anchor=edit.anchor,
                         count=edit.count)
        reports.append(rep)
        if edit.when_exists and not exists(edit.when_exists):
            rep.status = "skipped"
            rep.note = f"{edit.when_exists} does not exist"
            continue
        if not _true(env, edit.when, ctx, f"{manifest.where(edit.line)} (edits[{edit.index}].when)"):
            rep.status = "skipped"
            rep.note = f"when: {edit.when}"
            continue
        chosen = next((c for c in edit.files if exists(c)), None)
        if chosen is None:
            rep.status = "no-file"
            rep.note = "none of " + ", ".join(edit.files) + " exists"
            if not check:
                raise MismatchError(
                    f"edit #{edit.index} of {manifest.path.name}: no target file exists ({', '.join(edit.files)})",
                    where=manifest.where(edit.line),
                    hint="add the file's new name to the edit's 'file:' list, or guard it with 'when_exists:' or 'when:'")
            continue
        rep.file = chosen
        full = prefix + chosen
        if full not in texts:
            if full in outputs:
                texts[full] = outputs[full][0].decode("utf-8")
            else:
                try:
                    texts[full] = tree.read(full).decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise ConfigError(f"edit #{edit.index}: {full} is not UTF-8 text ({exc.reason})",
                                      where=manifest.where(edit.line)) from None
        text = texts[full]
        fitted = None
        for variant, anchor, action, count, body_src, when, line in _variants(edit):
            if not _true(env, when, ctx, f"{manifest.where(line)} (edits[{edit.index}].alternatives[{variant - 1}].when)"):
                continue
            found = find_anchor(text, anchor)
            lines = [text.count("\n", 0, m.start()) + 1 for m in found]
            if len(found) == count:
                fitted = (variant, anchor, action, count, body_src, found, lines)
                break
            if found:  # matches, but not as often as required: an error, never a reason to try the next
                rep.status = "ambiguous"
                rep.variant, rep.anchor, rep.action, rep.count = variant, anchor, action, count
                rep.matches, rep.match_lines = len(found), lines
                rep.closest = [f"{ln}: {text.splitlines()[ln - 1].rstrip()}" for ln in lines[:5]]
                rep.note = f"{_label(variant)} matches {len(found)} times" if edit.alternatives else ""
                break
            rep.tried.append((variant, anchor, 0, closest_lines(text, anchor)))
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


@dataclass
class CheckResult:
    tree: str
    edits: list[EditReport]
    files: list[tuple[str, str]]

    @property
    def ok(self) -> bool:
        return all(e.fits for e in self.edits)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _current(path: Path) -> tuple[bytes, int] | None:
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return path.read_bytes(), (0o755 if st.st_mode & 0o111 else 0o644)


def hand_edited_files(room: Room, state: dict[str, Any]) -> list[str]:
    """Files that differ from HEAD in the room and are not exactly what the last render wrote."""
    rendered: dict[str, str] = state.get("rendered") or {}
    pending: dict[str, str] = state.get("rendering") or {}  # a render that was interrupted
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
    baseline = rev_parse(room.path, BASELINE_TAG)
    if baseline is None:
        raise DcaforgeError("the clean room has no baseline (the series is not fully applied)",
                            where=str(room.path), hint="dcaforge apply --continue")
    tree = GitTree(room.path, baseline)
    p = plan(cfg, tree, manifest)
    state = room.load_state()
    previous: dict[str, str] = state.get("rendered") or {}
    touched = set(p.outputs) | set(previous)
    if not force:
        # a file that already holds exactly what this render writes loses nothing (e.g. after
        # `dcaforge templatize` turned the hand edits into templates)
        hand = [f for f in hand_edited_files(room, state)
                if f in touched and not (f in p.outputs and _current(room.path / f) == p.outputs[f])]
        if hand:
            raise SafetyError(f"rendering would overwrite hand edits in {', '.join(hand)}",
                              where=str(room.path),
                              hint="`dcaforge capture` them first (then render), or `dcaforge render --force`")
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
    room.update_state(rendered=new_hashes, rendering=None,
                      templates_digest=manifest_digest(cfg.feature.templates))
    return result


def render(cfg: Config, *, force: bool = False) -> RenderResult:
    """``dcaforge render``."""
    room = Room.of(cfg)
    room.require()
    with locked(room):
        return render_feature(cfg, room, force=force)


def check(cfg: Config, tree_dir: Path | None = None) -> CheckResult:
    """``dcaforge render --check``: which edits fit the baseline (or ``tree_dir``); writes nothing."""
    manifest = load_manifest(cfg.feature.templates)
    tree: Tree
    if tree_dir is not None:
        if not tree_dir.is_dir():
            raise DcaforgeError(f"not a folder: {tree_dir}", where=str(tree_dir))
        tree, label = DirTree(tree_dir), str(tree_dir)
    else:
        room = Room.of(cfg)
        room.require()
        baseline = rev_parse(room.path, BASELINE_TAG)
        if baseline is None:
            raise DcaforgeError("the clean room has no baseline yet", where=str(room.path),
                                hint="dcaforge apply --continue")
        tree, label = GitTree(room.path, baseline), f"{room.path} @ {BASELINE_TAG}"
    p = plan(cfg, tree, manifest, check=True)
    return CheckResult(tree=label, edits=p.edits, files=p.files)
