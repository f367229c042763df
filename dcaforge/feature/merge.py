"""Merging ``templatize``'s new feature with the old manifest: what was written by hand survives.

An edit whose anchor is generated again keeps its ``file`` candidates, ``when_exists``, ``when`` and
``alternatives``, and its text while that still renders to the room's text; edits and files that do
not apply to the room's tree (skipped by ``when``/``when_exists``) are kept in place; a template that
renders to the room's file is kept as it is (its Jinja survives), and a changed one holding
hand-written Jinja is merged line by line (``git merge-file``). What could not be kept is listed in
the result's ``notes``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dcaforge import guard
from dcaforge.config import Config
from dcaforge.errors import SafetyError
from dcaforge.feature.anchors import apply_edit, find_anchor
from dcaforge.feature.context import render_template
from dcaforge.feature.manifest import EditSpec, Manifest
from dcaforge.feature.plan import Plan, plan
from dcaforge.feature.roomdiff import JINJA_OPEN, Edit, Feature, escape_template, literal_body
from dcaforge.git import run
from dcaforge.room.trees import Tree

_GENERATED = re.compile(r"\{% raw %\}.*?\{% endraw %\}|\{\{ marker(?:_comment)? \}\}", re.S)


def hand_written(template: str) -> bool:
    """Whether a template holds Jinja that templatize does not write (conditions, expressions)."""
    return bool(JINJA_OPEN.search(_GENERATED.sub("", template)))


# While merging, an entry's body is under "text" (its Jinja source) and, when the old manifest kept
# it in a file, that file's name is under _BODY_FILE; _bodies_to_files then decides text or text_file.
_BODY_FILE = "_text_file"


def _alt_dict(a: Any) -> dict[str, Any]:
    d: dict[str, Any] = {}
    if a.when is not None:
        d["when"] = a.when
    d["anchor"] = a.anchor
    for key in ("action", "count", "text"):
        if getattr(a, key) is not None:
            d[key] = getattr(a, key)
    if a.text_file is not None:
        d[_BODY_FILE] = a.text_file
    return d


def _edit_dict(e: EditSpec, file: str | None = None, anchor: str | None = None, action: str | None = None,
               text: str | None = None) -> dict[str, Any]:
    d: dict[str, Any] = {"file": list(e.files) if len(e.files) > 1 else (file or e.files[0])}
    if e.base != "llama_cpp_dir":
        d["base"] = e.base
    if e.when_exists:
        d["when_exists"] = e.when_exists
    if e.when is not None:
        d["when"] = e.when
    d["anchor"] = anchor if anchor is not None else e.anchor
    if e.count != 1 and anchor is None:
        d["count"] = e.count
    d["action"] = action or e.action
    d["text"] = text if text is not None else e.text
    if e.text_file is not None:  # the body stays in its file (with the room's text, if that changed)
        d[_BODY_FILE] = e.text_file
    if e.alternatives:
        d["alternatives"] = [_alt_dict(a) for a in e.alternatives]
    return d


def _file_dict(template: str, dest: str, mode: str | None, old: Any = None) -> dict[str, Any]:
    d: dict[str, Any] = {"template": template, "dest": dest}
    if mode:
        d["mode"] = mode
    if old is not None and old.when_exists:
        d["when_exists"] = old.when_exists
    if old is not None and old.when is not None:
        d["when"] = old.when
    return d


def _edit_name(e: EditSpec) -> str:
    return f"edit #{e.index} ({e.files[0]}, manifest line {e.line})"


@dataclass
class Merged:
    files: list[dict[str, Any]] = field(default_factory=list)
    edits: list[dict[str, Any]] = field(default_factory=list)
    templates: dict[str, str] = field(default_factory=dict)  # template path -> text to write
    extra: list[str] = field(default_factory=list)  # other files of the old folder (includes), copied
    kept: int = 0
    notes: list[str] = field(default_factory=list)


def _merge_file(ours: str, base: str, theirs: str, scratch: Path) -> str | None:
    """``git merge-file``: the hand-written template with the room's change applied; None on a conflict."""
    paths = []
    for name, text in (("ours", ours), ("base", base), ("theirs", theirs)):
        path = scratch / name
        path.write_text(text, encoding="utf-8", newline="")
        paths.append(str(path))
    p = run(["git", "merge-file", "-p", *paths], scratch, check=False, what="git merge-file")
    return p.stdout if p.returncode == 0 else None


def merge(cfg: Config, feature: Feature, old: Manifest | None, tree: Tree, scratch: Path) -> Merged:
    """The new manifest: the room's changes (feature), with the old manifest's hand-written parts."""
    m = _Merger(cfg, old, tree, scratch)
    m.merge_files(feature)
    m.merge_edits(feature)
    _bodies_to_files(m.out)
    return m.out


class _Merger:
    """One merge's state: the old manifest, its report on the baseline (``check``), and the new manifest so far."""

    def __init__(self, cfg: Config, old: Manifest | None, tree: Tree, scratch: Path) -> None:
        self.cfg = cfg
        self.marker = cfg.feature.marker
        self.old = old
        self.tree = tree
        self.scratch = scratch
        self.out = Merged()
        self.old_report: Plan | None = plan(cfg, tree, old, check=True) if old is not None else None

    def render(self, folder: Path, source: str, where: str) -> str:
        return render_template(self.cfg, self.tree, folder, source, where)

    # --- files: ---------------------------------------------------------------------------

    def merge_files(self, feature: Feature) -> None:
        """The new files' templates (the old ones kept where they still render the room's file), then the old
        manifest's files for other trees and the old folder's other files."""
        old, out = self.old, self.out
        old_files = {f.dest: f for f in old.files} if old is not None else {}
        for dest, text, mode in sorted(feature.files):
            o = old_files.get(dest)
            tpl = o.template if o is not None else (Path("files") / f"{dest}.j2").as_posix()
            out.templates[tpl] = self.file_body(tpl, text, o)
            out.files.append(_file_dict(tpl, dest, mode, o))
        if old is not None and self.old_report is not None:
            self.keep_other_files(feature, old, self.old_report)

    def file_body(self, tpl: str, text: str, o: Any) -> str:
        """A new file's template: the old one when it renders to the room's file, else merged with its
        hand-written Jinja when that merges cleanly, else generated."""
        old, out = self.old, self.out
        generated = escape_template(text, self.marker, for_replace=False)
        if o is None or old is None:
            return generated
        source = _read_feature_file(old.folder, o.template)
        where = str(old.folder / o.template)
        if source != generated and self.render(old.folder, source, where) == text:
            return source  # renders to the room's file as it is: keep it, Jinja and all
        if source != generated and hand_written(source):
            base = escape_template(self.render(old.folder, source, where), self.marker, for_replace=False)
            merged = _merge_file(source, base, generated, self.scratch)
            if merged is not None and self.render(old.folder, merged, where) == text:
                out.notes.append(f"merged the room's changes into the hand-written template {tpl}: review it")
                return merged
            out.notes.append(f"{tpl}: the room's changes conflict with its hand-written Jinja, which is lost: "
                             f"re-add it (the old template: git show HEAD:<feature folder>/{tpl})")
        return generated

    def keep_other_files(self, feature: Feature, old: Manifest, old_report: Plan) -> None:
        out = self.out
        generated_dests = {d for d, _t, _m in feature.files}
        for spec, (_dest, status) in zip(old.files, old_report.files, strict=True):
            if spec.dest not in generated_dests and status == "skipped":  # for other trees: keep
                out.templates[spec.template] = _read_feature_file(old.folder, spec.template)
                out.files.append(_file_dict(spec.template, spec.dest, None if spec.mode is None else f"0{spec.mode:o}", spec))
                out.kept += 1
        # the old bodies are written again from the entries that still use them (_bodies_to_files)
        used = {f.template for f in old.files} | {e.text_file for e in old.edits if e.text_file is not None} \
            | {a.text_file for e in old.edits for a in e.alternatives if a.text_file is not None}
        for p in sorted(old.folder.rglob("*")):
            rel = p.relative_to(old.folder).as_posix()
            if (p.is_symlink() or guard.regular_file(p)) and rel != "manifest.yaml" and rel not in used \
                    and rel not in out.templates:
                out.extra.append(rel)  # kept where it is, as it is (a link stays a link)

    # --- edits: ---------------------------------------------------------------------------

    def merge_edits(self, feature: Feature) -> None:
        """Edits, file by file in the order templatize lists them; then the old edits for other trees."""
        old, out, cfg = self.old, self.out, self.cfg
        old_edits = list(old.edits) if old is not None else []
        used_old: dict[int, dict[str, Any]] = {}
        base_texts: dict[str, str] = {}
        prefix = "" if cfg.llama_cpp_dir in ("", ".") else cfg.llama_cpp_dir.rstrip("/") + "/"
        for g in feature.edits:
            generated = escape_template(g.text, self.marker, for_replace=g.action == "replace")
            cur = base_texts[g.file] if g.file in base_texts else self.tree.read(prefix + g.file).decode("utf-8")
            found = find_anchor(cur, g.anchor)
            base_texts[g.file] = apply_edit(cur, found, g.action, literal_body(g))
            oe = next((e for e in old_edits if e.index not in used_old and g.file in e.files and e.anchor == g.anchor), None)
            if oe is None:
                entry = {"file": g.file, "anchor": g.anchor, "action": g.action, "text": generated}
                out.edits.append(entry)
                continue
            text = self.edit_text(g, oe, generated, cur, found, base_texts[g.file])
            entry = _edit_dict(oe, file=g.file, anchor=g.anchor, action=g.action, text=text)
            used_old[oe.index] = entry
            out.edits.append(entry)
        if old is not None and self.old_report is not None:
            self.keep_other_edits(old_edits, self.old_report, used_old)

    def edit_text(self, g: Edit, oe: EditSpec, generated: str, cur: str, found: list[re.Match[str]], want: str) -> str:
        """An old edit's text when it still renders to the room's text (``want``), else the generated one."""
        old, out = self.old, self.out
        text = generated
        if oe.text != generated and old is not None:
            try:
                kept = apply_edit(cur, found, g.action,
                                  self.render(old.folder, oe.text, f"{old.where(oe.line)} (edits[{oe.index}].text)"))
            except (re.error, IndexError):
                kept = None
            if kept == want:
                text = oe.text
            elif hand_written(oe.text):
                out.notes.append(f"{_edit_name(oe)}: the room changed its text, so its hand-written Jinja is lost: re-add it")
        if text == generated and oe.text != text and any(a.text is not None for a in oe.alternatives):
            out.notes.append(f"{_edit_name(oe)}: the room changed its text; its alternatives' own texts are kept "
                             "as they were: review them")
        return text

    def keep_other_edits(self, old_edits: list[EditSpec], old_report: Plan, used_old: dict[int, dict[str, Any]]) -> None:
        """The old edits not generated again: kept in place when skipped on this tree (for other trees), else
        dropped, with a note when they held hand-written parts."""
        out = self.out
        for oe, rep in zip(old_edits, old_report.edits, strict=True):
            if oe.index in used_old:
                continue
            if rep.status == "skipped":  # written for other trees: keep it where it was
                entry = _edit_dict(oe)
                # after the edit that preceded it; else before the first edit of its file; else last
                prev = next((used_old[j] for j in range(oe.index - 1, -1, -1) if j in used_old), None)
                if prev is not None:
                    pos = next(k for k, x in enumerate(out.edits) if x is prev) + 1
                else:
                    pos = next((k for k, x in enumerate(out.edits) if x["file"] == entry["file"]), len(out.edits))
                out.edits.insert(pos, entry)
                used_old[oe.index] = entry
                out.kept += 1
            elif oe.alternatives or oe.when is not None or oe.when_exists or len(oe.files) > 1 or hand_written(oe.text):
                out.notes.append(f"{_edit_name(oe)}: its anchor is no longer what the room's change needs; the edit and "
                                 "what was written by hand in it (alternatives, when, file list) are dropped: re-add them")


_NOT_A_NAME = frozenset("""
    auto bool break case char class const constexpr continue default define double else endif endraw enum
    extern false float for ifdef ifndef include inline int8_t int16_t int32_t int64_t long mutable nullptr
    override private public raw return short signed size_t static struct switch template true typedef
    typename uint8_t uint16_t uint32_t uint64_t unsigned virtual void while GGML_API LLAMA_API
""".split())


def body_name(file: str, text: str, taken: set[str] | dict[str, str | None]) -> str:
    """A new body's template name, ``edits/<target file>/<its first C name, e.g. dca-flags>.inc.j2``,
    not one of ``taken`` (rename it at will: templatize keeps the names it finds)."""
    plain = re.sub(r"\{\{.*?\}\}|\{%.*?%\}|\{#.*?#\}", " ", text, flags=re.S)
    words = [w for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]{3,}", plain) if w not in _NOT_A_NAME]
    code = [w for w in words if "_" in w.strip("_")]  # a C name rather than a word of a comment
    stem = re.sub(r"[^a-z0-9]+", "-", (code or words or ["edit"])[0].lower()).strip("-") or "edit"
    name, k = f"edits/{file}/{stem}.inc.j2", 1
    while name in taken:
        k += 1
        name = f"edits/{file}/{stem}-{k}.inc.j2"
    return name


def _bodies_to_files(out: Merged) -> None:
    """Each edit's and alternative's body: in the file it had (kept, with the room's text), else in
    a new file when it is longer than one line, else inline (``text``)."""
    entries = [(e, e["file"] if isinstance(e["file"], str) else e["file"][0]) for e in out.edits]
    entries += [(a, f) for e, f in list(entries) for a in e.get("alternatives", [])]
    taken: dict[str, str | None] = {**{rel: None for rel in out.extra}, **out.templates}
    names: list[str | None] = []
    for d, _file in entries:  # first the names the old manifest gave, so new names never take them
        name = d.pop(_BODY_FILE, None)
        if name is not None and taken.get(name, d.get("text")) != d.get("text"):
            name = None  # shared by two bodies that the room made different: the second gets a new file
        if name is not None:
            taken[name] = d["text"]
        names.append(name)
    for (d, file), name in zip(entries, names, strict=True):
        if "text" not in d:
            continue
        if name is None and len(d["text"].splitlines()) > 1:
            name = body_name(file, d["text"], taken)
            taken[name] = d["text"]
        if name is not None:
            out.templates[name] = d["text"]
            items = [("text_file", name) if k == "text" else (k, v) for k, v in d.items()]
            d.clear()
            d.update(items)


def _read_feature_file(folder: Path, rel: str) -> str:
    """A file of the feature folder, read only when it is (resolves to) a regular file inside it."""
    path = folder / rel
    if not guard.inside(path, folder):
        raise SafetyError(f"{path} leads out of the feature folder (to {os.path.realpath(path)}); refusing to read it",
                          where=str(path), hint="replace the link with the file itself, then run `dcaforge templatize` again")
    return guard.read_regular(path, what="the feature's file").decode("utf-8")
