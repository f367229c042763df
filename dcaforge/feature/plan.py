"""Plan a render: what rendering the feature folder onto a tree writes, computed without writing anything.

Every touched file starts from its content in the tree (the baseline), so planning twice gives the same
bytes. Anchors are Python regexes that must match exactly ``count`` times; a missing or ambiguous anchor
names the manifest, the edit, the target file, the anchor and the closest lines found (``render --check``
reports each edit instead: :mod:`dcaforge.feature.drift`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from dcaforge.config import Config
from dcaforge.errors import ConfigError, MismatchError
from dcaforge.feature.anchors import apply_edit, closest_lines, find_anchor
from dcaforge.feature.context import environment, render_file, render_str, template_context, when_holds
from dcaforge.feature.manifest import EditSpec, Manifest
from dcaforge.room.trees import Tree


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


# a fitted variant: (variant, anchor, action, count, body, the matches, their lines)
Fitted = tuple[int, str, str, int, Body, list[re.Match[str]], list[int]]


def plan(cfg: Config, tree: Tree, manifest: Manifest, *, check: bool = False) -> Plan:
    """Compute what rendering writes (nothing is written). ``check``: collect every edit's
    report instead of raising at the first that does not fit."""
    planner = _Planner(cfg, tree, manifest, check)
    files_report = planner.render_files()
    reports = [planner.plan_edit(edit) for edit in manifest.edits]
    return Plan(outputs=planner.finish(), edits=reports, files=files_report)


class _Planner:
    """One plan's state: the rendered files, each edited file's text (and its text before this render's edits)."""

    def __init__(self, cfg: Config, tree: Tree, manifest: Manifest, check: bool) -> None:
        self.env = environment(manifest.folder)
        self.ctx = template_context(cfg, tree)
        self.prefix = cfg.llama_prefix
        self.tree = tree
        self.manifest = manifest
        self.check = check
        self.outputs: dict[str, tuple[bytes, int]] = {}
        self.texts: dict[str, str] = {}
        self.pristine: dict[str, str] = {}  # each file before this render's edits: where the closest lines come from

    def exists(self, rel: str, pre: str | None = None) -> bool:
        pre = self.prefix if pre is None else pre
        return (pre + rel) in self.outputs or self.tree.exists(pre + rel)

    # --- files: ---------------------------------------------------------------------------

    def render_files(self) -> list[tuple[str, str]]:
        """Render the manifest's ``files:`` into outputs; (dest, "rendered" | "skipped") for each."""
        manifest, tree, prefix = self.manifest, self.tree, self.prefix
        files_report: list[tuple[str, str]] = []
        for spec in manifest.files:
            if spec.when_exists and not self.exists(spec.when_exists):
                files_report.append((spec.dest, "skipped"))
                continue
            if not when_holds(self.env, spec.when, self.ctx, f"{manifest.where(spec.line)} (files[{spec.index}].when)"):
                files_report.append((spec.dest, "skipped"))
                continue
            text = render_file(self.env, spec.template, self.ctx, manifest.folder)
            full = prefix + spec.dest
            mode = spec.mode if spec.mode is not None else (tree.mode(full) if tree.exists(full) else 0o644)
            self.outputs[full] = (text.encode("utf-8"), mode)
            files_report.append((spec.dest, "rendered"))
        return files_report

    # --- edits: ---------------------------------------------------------------------------

    def plan_edit(self, edit: EditSpec) -> EditReport:
        """Skip, fit and apply one edit; its report (or a MismatchError when not ``check``)."""
        manifest = self.manifest
        rep = _report(edit)
        pre = "" if edit.base == "room" else self.prefix
        if edit.when_exists and not self.exists(edit.when_exists, pre):
            rep.status = "skipped"
            rep.note = f"{edit.when_exists} does not exist"
            return rep
        if not when_holds(self.env, edit.when, self.ctx, f"{manifest.where(edit.line)} (edits[{edit.index}].when)"):
            rep.status = "skipped"
            rep.note = f"when: {edit.when}"
            return rep
        present = [c for c in edit.files if self.exists(c, pre)]
        if not present:
            rep.status = "no-file"
            rep.note = "none of " + ", ".join(edit.files) + " exists"
            if not self.check:
                raise MismatchError(
                    f"edit #{edit.index} of {manifest.path.name}: no target file exists ({', '.join(edit.files)})",
                    where=manifest.where(edit.line),
                    hint="add the file's new name to the edit's 'file:' list, or guard it with 'when_exists:' or 'when:'")
            return rep
        rep, fitted = self.choose_file(edit, pre, present)
        full = pre + rep.file if rep.file else ""
        if fitted is None:
            self.unfitted(edit, rep, full)
        else:
            self.apply(edit, rep, full, fitted)
        return rep

    def choose_file(self, edit: EditSpec, pre: str, present: list[str]) -> tuple[EditReport, Fitted | None]:
        """The candidates that exist, in order: the first in which an anchor fits is the edit's file (upstream
        renamed gemma4-iswa.cpp to gemma4.cpp; a tree that has both keeps the edit where its code is)."""
        fitted = None
        first: EditReport | None = None
        cand: EditReport | None = None
        for chosen in present:
            cand = _report(edit, chosen)
            first = first or cand
            full = pre + chosen
            self.load(edit, full)
            fitted = self.try_variants(edit, cand, full)
            if fitted is not None or cand.status == "ambiguous":
                break
        assert first is not None and cand is not None
        if fitted is None and cand.status != "ambiguous":
            cand = first  # nothing fits anywhere: reported on the first candidate that exists
        return cand, fitted

    def load(self, edit: EditSpec, full: str) -> None:
        """The file's text before the edits that follow (this render's output or the tree's), once."""
        if full in self.texts:
            return
        if full in self.outputs:
            self.texts[full] = self.outputs[full][0].decode("utf-8")
        else:
            try:
                self.texts[full] = self.tree.read(full).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ConfigError(f"edit #{edit.index}: {full} is not UTF-8 text ({exc.reason})",
                                  where=self.manifest.where(edit.line)) from None
        self.pristine[full] = self.texts[full]

    def try_variants(self, edit: EditSpec, cand: EditReport, full: str) -> Fitted | None:
        """The first variant whose anchor matches ``count`` times in the file; one that matches another number
        of times marks ``cand`` ambiguous (never a reason to try the next); each that matches nowhere is tried."""
        text = self.texts[full]
        for variant, anchor, action, count, body_spec, when, line in _variants(edit):
            if not when_holds(self.env, when, self.ctx,
                         f"{self.manifest.where(line)} (edits[{edit.index}].alternatives[{variant - 1}].when)"):
                continue
            found = find_anchor(text, anchor)
            lines = [text.count("\n", 0, m.start()) + 1 for m in found]
            if len(found) == count:
                return (variant, anchor, action, count, body_spec, found, lines)
            if found:  # matches, but not as often as required: an error, never a reason to try the next
                cand.status = "ambiguous"
                cand.variant, cand.anchor, cand.action, cand.count = variant, anchor, action, count
                cand.matches, cand.match_lines = len(found), lines
                cand.closest = [f"{ln}: {text.splitlines()[ln - 1].rstrip()}" for ln in lines[:5]]
                cand.note = f"{_label(variant)} matches {len(found)} times" if edit.alternatives else ""
                return None
            cand.tried.append((variant, anchor, 0, closest_lines(self.pristine[full], anchor)))
        return None

    def unfitted(self, edit: EditSpec, rep: EditReport, full: str) -> None:
        """An edit no anchor fits: its report says why; without ``check`` a MismatchError."""
        manifest = self.manifest
        if rep.status != "ambiguous":
            rep.status = "missing"
            rep.closest = rep.tried[0][3] if rep.tried else []
            if edit.alternatives:
                rep.note = f"none of {len(rep.tried)} anchors matches"
            if not rep.tried:
                rep.note = "no alternative's 'when' holds"
        if self.check:
            return
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

    def apply(self, edit: EditSpec, rep: EditReport, full: str, fitted: Fitted) -> None:
        """Render the fitted variant's body and apply it at each match."""
        manifest = self.manifest
        variant, anchor, action, count, (body_src, body_file, key), found, lines = fitted
        rep.variant, rep.anchor, rep.action, rep.count = variant, anchor, action, count
        rep.matches, rep.match_lines = len(found), lines
        if body_file is not None:  # through the folder's loader, so an error names the body's file and line
            body = render_file(self.env, body_file, self.ctx, manifest.folder, f"{key} of {manifest.where(edit.line)}")
        else:
            body = render_str(self.env, body_src, self.ctx, f"{manifest.where(edit.line)} ({key})")
        try:
            self.texts[full] = apply_edit(self.texts[full], found, action, body)
        except (re.error, IndexError) as exc:
            raise ConfigError(f"edit #{edit.index}: bad group reference in '{key}'"
                              + (f" ({manifest.folder / body_file})" if body_file else "") + f": {exc}",
                              where=manifest.where(edit.line),
                              hint="a replace body is a `re` replacement template: write a literal backslash as \\\\") from None

    def finish(self) -> dict[str, tuple[bytes, int]]:
        """The outputs: the rendered files and every edited file's final text."""
        for full, text in self.texts.items():
            mode = self.outputs[full][1] if full in self.outputs else self.tree.mode(full)
            self.outputs[full] = (text.encode("utf-8"), mode)
        return self.outputs


def _report(edit: EditSpec, file: str | None = None) -> EditReport:
    return EditReport(index=edit.index, manifest_line=edit.line, action=edit.action, anchor=edit.anchor,
                      count=edit.count, file=file)
