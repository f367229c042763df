"""The feature's ``manifest.yaml``: the files a render writes and the anchored edits it makes,
read and checked (every key, type, path and regex) before anything is rendered.

Trees differ between llama.cpp versions, so a manifest can choose by what the tree has: a file
list (``[a, b]`` or ``"a | b"``: the first that exists in which the edit fits, else the first that
exists), ``when_exists``, ``when`` (a Jinja expression over ``tree``, e.g.
``tree.has(path)`` or ``tree.contains(path, text)``) on files, edits and alternatives, and per
edit ``alternatives`` (other anchors, with their own text if needed; the first that fits wins).
An edit's body is inline (``text``) or a template of the feature folder (``text_file``).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import jinja2

from dcaforge import confine, guard, sandbox
from dcaforge.errors import ConfigError
from dcaforge.yamlio import Reader, load_yaml

ACTIONS = ("insert_before", "insert_after", "replace")
#: What an edit's paths are relative to: llama.cpp's folder (default) or the clean room's root
#: (e.g. llamafile's GPU library script, llamafile/cuda.sh, beside llama.cpp/).
BASES = ("llama_cpp_dir", "room")


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
    base: str = "llama_cpp_dir"  # or "room": file and when_exists are relative to the clean room's root


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
    problem = confine.path_problem(value)
    if problem:
        raise r.error(key, f"'{r.key(key)}' must be a relative path under llama_cpp_dir, got {value!r}, which {problem}",
                      hint="name a file of the tree relative to llama_cpp_dir, e.g. src/llama-dca.cpp")
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
        source = guard.read_regular(folder / rel, what="the text file").decode("utf-8")
    except UnicodeDecodeError as exc:
        raise r.error("text_file", f"'{r.key('text_file')}': {folder / rel} is not UTF-8 text ({exc.reason})") from None
    return source, rel


def _when(r: Reader) -> str | None:
    when = r.get("when", str)
    if when is None:
        return None
    try:
        sandbox.environment().compile_expression(when)
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
        r.check_keys({"file", "when_exists", "when", "anchor", "count", "action", "text", "text_file", "alternatives",
                      "base"})
        base = r.get("base", str, default="llama_cpp_dir")
        if base not in BASES:
            raise r.error("base", f"'{r.key('base')}' must be one of {', '.join(BASES)}, got {base!r}")
        target = r.get("file", (str, list), required=True)
        # candidates: a list, or one string "a | b" (upstream renamed a file: the edit goes where it fits)
        cands = [c.strip() for c in target.split("|")] if isinstance(target, str) else list(target)
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
                              text=text, when=_when(r), alternatives=tuple(alts), text_file=text_file,
                              base=base))
    return Manifest(path=path, folder=folder, files=tuple(files), edits=tuple(edits))


def manifest_digest(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if guard.regular_file(p) and guard.inside(p, folder):  # (a link out of the folder is no template)
            h.update(p.relative_to(folder).as_posix().encode() + b"\0" + guard.read_regular(p, what="the feature's file")
                     + b"\0")
    return h.hexdigest()
