"""What a feature's templates see and how they are rendered: the ``tree`` facts about the baseline, the
context (vars, marker, feature, llama_cpp_dir), the bounded Jinja sandbox, ``when:`` expressions, and
template errors that name their file and line."""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import SecurityError

from dcaforge import confine, sandbox
from dcaforge.config import Config
from dcaforge.errors import ConfigError
from dcaforge.feature import shellscan
from dcaforge.room.trees import Tree


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


def template_context(cfg: Config, tree: Tree | None = None) -> dict[str, Any]:
    return {
        "tree": TreeFacts(tree, cfg.llama_prefix) if tree is not None else None,
        "vars": cfg.feature.vars,
        "marker": cfg.feature.marker,
        "marker_comment": cfg.feature.marker,
        "feature": {"number": cfg.feature.number, "name": cfg.feature.name,
                    "id": f"{cfg.feature.number:04d}-{cfg.feature.name}"},
        "llama_cpp_dir": cfg.llama_cpp_dir,
    }


def environment(folder: Path) -> jinja2.Environment:
    """Jinja's ImmutableSandboxedEnvironment, bounded (see :mod:`dcaforge.sandbox`); it loads templates (and
    includes) only from files whose real path is inside the feature folder."""
    return sandbox.environment(folder)


def render_str(env: jinja2.Environment, source: str, ctx: dict[str, Any], where: str) -> str:
    try:
        return sandbox.render(env.from_string(source), ctx)
    except jinja2.TemplateError as exc:
        raise ConfigError(f"template error: {exc}", where=where,
                          hint=CONTEXT_HINT) from None


def render_template(cfg: Config, tree: Tree, folder: Path, source: str, where: str) -> str:
    """Render one template string as the renderer does (folder: for includes; tree: for ``tree``)."""
    return render_str(environment(folder), source, template_context(cfg, tree), where)


def _template_line(exc: BaseException, filename: str) -> int | None:
    """The template line a Jinja runtime error came from (Jinja rewrites the traceback to it)."""
    line = None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == filename:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def render_file(env: jinja2.Environment, template: str, ctx: dict[str, Any], folder: Path,
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


def when_holds(env: jinja2.Environment, when: str | None, ctx: dict[str, Any], where: str) -> bool:
    """Evaluate a ``when:`` expression (None: true)."""
    if when is None:
        return True
    try:
        sandbox.restart_clock(env)
        return bool(env.compile_expression(when)(**ctx))
    except jinja2.TemplateError as exc:
        raise ConfigError(f"'when: {when}' failed: {exc}", where=where, hint=CONTEXT_HINT) from None
