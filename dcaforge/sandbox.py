"""The one Jinja environment dcaforge renders user-written text with (templates, ``when:``, the
bookkeeping row and entry): Jinja's ``ImmutableSandboxedEnvironment``, so no attribute walk
(``cycler.__init__.__globals__``...) reaches Python's internals and no list or dict of the
context can be changed, plus bounds a sandbox alone leaves open: a string or list may not be
multiplied past :data:`MAX_OUTPUT`, powers and call arguments stay small, a render stops at
:data:`MAX_OUTPUT` characters and after :data:`MAX_SECONDS`, and templates load only from files
inside their folder (a symlink out of it is refused).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

from dcaforge import guard

#: Characters a render may produce (the largest shipped template renders to about 40 KiB).
MAX_OUTPUT = 64 * 1024 * 1024
#: Seconds one render may take.
MAX_SECONDS = 60.0
#: Largest integer argument a template may hand to a call or a filter (a width, a count).
MAX_ARG = 10**8


def _size(value: Any) -> int:
    try:
        return len(value)
    except TypeError:
        return 0


class _ConfinedLoader(jinja2.FileSystemLoader):
    """Templates (and their includes) only from files whose real path is inside the folder."""

    def get_source(self, environment: jinja2.Environment, template: str) -> tuple[str, str, Callable[[], bool]]:
        # checked before anything is read: the file resolves inside the folder and is a regular file
        # (a FIFO would block, a device never end), read bounded (dcaforge.guard)
        pieces = jinja2.loaders.split_template_path(template)
        for search in self.searchpath:
            filename = os.path.join(search, *pieces)
            if not os.path.lexists(filename):
                continue
            real = os.path.realpath(filename)
            if not guard.inside(real, search):
                raise SecurityError(f"template {template!r} resolves to {real}, outside the feature folder")
            try:
                source = guard.read_regular(Path(filename), what="the template").decode(self.encoding)
            except UnicodeDecodeError as exc:
                raise SecurityError(f"template {template!r} is not {self.encoding} text ({exc.reason})") from None
            mtime = os.path.getmtime(filename)

            def uptodate(filename: str = filename, mtime: float = mtime) -> bool:
                try:
                    return os.path.getmtime(filename) == mtime
                except OSError:
                    return False

            return source, os.path.normpath(filename), uptodate
        raise jinja2.TemplateNotFound(template)


class BoundedSandbox(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset(["*", "**", "%"])

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deadline = time.monotonic() + MAX_SECONDS
        for name, fn in list(self.filters.items()):
            self.filters[name] = self._checked_filter(name, fn)

    def _tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise SecurityError(f"rendering took longer than {MAX_SECONDS:.0f} s")

    @staticmethod
    def _check_args(args: Iterable[Any]) -> None:
        for a in args:
            if isinstance(a, int) and not isinstance(a, bool) and abs(a) > MAX_ARG:
                raise SecurityError(f"the number {a} is larger than a template may use ({MAX_ARG})")

    def _checked_filter(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        env = self

        def checked(*args: Any, **kwargs: Any) -> Any:
            env._tick()
            env._check_args(args)
            env._check_args(kwargs.values())
            return fn(*args, **kwargs)

        for attr in ("jinja_pass_arg",):
            if hasattr(fn, attr):
                setattr(checked, attr, getattr(fn, attr))
        return checked

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 (jinja's signature)
        __self._tick()
        __self._check_args(args)
        __self._check_args(kwargs.values())
        return super().call(__context, __obj, *args, **kwargs)

    def getattr(self, obj: Any, attribute: str) -> Any:
        self._tick()
        return super().getattr(obj, attribute)

    def call_binop(self, context: Any, op: str, left: Any, right: Any) -> Any:
        self._tick()
        if op == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(n, int) and _size(seq) * max(n, 0) > MAX_OUTPUT:
                    raise SecurityError(f"a repetition of {_size(seq)} x {n} is larger than a render may be")
        if op == "**" and isinstance(left, int) and isinstance(right, int) and \
                abs(left) > 1 and right > 0 and abs(left).bit_length() * right > 4096:
            raise SecurityError(f"{left} ** {right} is larger than a template may compute")
        if op == "%" and isinstance(left, str):
            for width in re.findall(r"%[-+ #0]*(\d+)", left):
                if int(width) > MAX_ARG:
                    raise SecurityError(f"the width {width} is larger than a template may use")
        return super().call_binop(context, op, left, right)


def environment(folder: Path | None = None) -> BoundedSandbox:
    """The sandbox (StrictUndefined, trailing newline kept, no autoescape); ``folder``: where
    ``{% include %}`` and file templates load from."""
    loader = _ConfinedLoader(str(folder)) if folder is not None else None
    return BoundedSandbox(loader=loader, undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                          autoescape=False)


def restart_clock(env: jinja2.Environment) -> None:
    """A new :data:`MAX_SECONDS` for the next render or expression of ``env``."""
    if isinstance(env, BoundedSandbox):
        env.deadline = time.monotonic() + MAX_SECONDS


def render(template: jinja2.Template, ctx: dict[str, Any]) -> str:
    """Render with the output bounded by :data:`MAX_OUTPUT` (raises SecurityError past it)."""
    restart_clock(template.environment)
    out: list[str] = []
    total = 0
    for chunk in template.generate(ctx):
        total += len(chunk)
        if total > MAX_OUTPUT:
            raise SecurityError(f"the render is larger than {MAX_OUTPUT // 2**20} MiB")
        out.append(chunk)
    return "".join(out)
