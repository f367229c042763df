"""What every command shares: the two consoles, the ``-c`` option, and the way an error is told:
``error:`` what failed, ``where:``, the tool's own words, and ``next:``, a command that works when
pasted (the ``-c CONFIG`` the user gave is kept, paths are quoted); then the exit code.

The library writes each command it suggests in backquotes (```dcaforge apply --continue```);
:func:`pasteable` adds the user's ``-c`` to each. Warnings the library logs (what it repaired or
removed after an interrupted run) are printed on stderr; ``-v`` logs every command it runs.
"""

from __future__ import annotations

import json
import logging
import re
import shlex
import sys
from collections.abc import Callable
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Column

from dcaforge.config import Config, load_config
from dcaforge.errors import EXIT_INTERRUPTED, DcaforgeError, InterruptedRun
from dcaforge.jsonable import report

out = Console(highlight=False, soft_wrap=True, markup=False)
err = Console(stderr=True, highlight=False, soft_wrap=True, markup=False)

ConfigOpt = Annotated[Path | None, typer.Option("-c", "--config", metavar="CONFIG", help="dcaforge.yaml to use "
                                                "(default: ./dcaforge.yaml, else the built-in upstream default)")]
#: ``--json``: the command's result as one JSON object on stdout (:func:`print_json`), its progress still on stderr
JsonOpt = Annotated[bool, typer.Option("--json", help="print the result as one JSON object (the library's result, "
                                       "field by field) instead of lines")]
T = TypeVar("T")

#: The commands that take ``-c CONFIG``.
TAKES_CONFIG = frozenset({"apply", "render", "drift", "capture", "templatize", "verify", "status", "build", "gate", "try",
                          "calibrate"})
_SUGGESTED = re.compile(r"`dcaforge ([a-z]+)((?: [^`]*)?)`")
_HAS_CONFIG = re.compile(r"(?:^|\s)(?:-c|--config)(?:[\s=]|$)")
_config: ContextVar[Path | None] = ContextVar("config", default=None)     # the -c of the command being run
_argv: ContextVar[list[str] | None] = ContextVar("argv", default=None)    # its command line, when run from a shell
_told: list[bool] = [False]  # an interrupt was told (by call()), so dcaforge.cli does not tell it again


def run_from(argv: list[str]) -> None:
    """Record the command line as the user typed it (after ``dcaforge``), for :func:`call`'s generic next step."""
    _argv.set(list(argv))


def interrupt_told() -> bool:
    """Whether :func:`call` already told the user about an interrupt (and its next step)."""
    return _told[0]


def pasteable(text: str, config: Path | None = None) -> str:
    """``text`` with the ``-c`` the user gave added to every ```dcaforge COMMAND ...``` it suggests."""
    config = config if config is not None else _config.get()
    if config is None:
        return text

    def add(m: re.Match[str]) -> str:
        command, rest = m.group(1), m.group(2)
        if command not in TAKES_CONFIG or _HAS_CONFIG.search(rest):
            return m.group(0)
        return f"`dcaforge {command}{rest} -c {shlex.quote(str(config))}`"

    return _SUGGESTED.sub(add, text)


def _again_verbose() -> str:
    """The command being run, with -v: the generic next step when the library names none."""
    argv = _argv.get()
    if argv is None:
        return "`dcaforge -v` and the same command"
    return "`" + shlex.join(["dcaforge", *([] if {"-v", "--verbose"} & set(argv) else ["-v"]), *argv]) + "`"


def call(fn: Callable[[], T], interrupted: str | None = None) -> T:
    """``fn()``; a DcaforgeError is told (error, where, details, next) and exits with its code."""
    try:
        return fn()
    except InterruptedRun as exc:
        _told[0] = True
        err.print(f"[bold yellow]interrupted:[/] {escape(str(exc.message))}", markup=True)
        err.print(f"  [bold]next:[/] {escape(pasteable(str(exc.hint)))}", markup=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except DcaforgeError as exc:
        err.print(f"[bold red]error:[/] {escape(str(exc.message))}", markup=True)
        if exc.where:
            err.print(f"  [dim]where:[/] {escape(str(exc.where))}", markup=True)
        if exc.details:
            for line in exc.details.rstrip().splitlines():
                err.print(f"    {line}", markup=False)
        hint = exc.hint or f"run it again with -v to see every git/patch command it runs: {_again_verbose()}"
        err.print(f"  [bold]next:[/] {escape(pasteable(str(hint)))}", markup=True)
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        _told[0] = True
        err.print("[bold yellow]interrupted:[/] " + escape(interrupted or "nothing was left half-written; run the same "
                  "command again"), markup=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except OSError as exc:  # one the library did not turn into a DcaforgeError: still what, where, next
        name = exc.filename if exc.filename is not None else "?"
        err.print(f"[bold red]error:[/] {escape(exc.strerror or str(exc))}: {escape(str(name))}", markup=True)
        err.print(f"  [dim]where:[/] {escape(str(name))}", markup=True)
        err.print("  [bold]next:[/] check that path (that it exists, is a regular file or folder you may read and "
                  "write, and is not a link out of your folders), then run the same command again", markup=True)
        raise typer.Exit(1) from None


def print_json(command: str, result: Any, **extra: Any) -> None:
    """``--json``: :func:`dcaforge.jsonable.report` of the result, sorted keys, on stdout."""
    sys.stdout.write(json.dumps(report(command, result, **extra), indent=2, sort_keys=True) + "\n")
    sys.stdout.flush()


#: the widest line a progress line takes where no terminal tells its width (a log, CI)
LINE = 80


def shorten(text: str, width: int = LINE) -> str:
    """``text`` cut to ``width`` columns (the end replaced by ``...``)."""
    return text if len(text) <= width else text[:width - 3] + "..."


def progress_bar(console: Console) -> Progress:
    """A live progress line that fits the terminal (80 columns and narrower): a spinner, the step, a bar, n/N and
    the time, then the item's text in what is left of the line, cut with an ellipsis. Off where ``console`` is not
    a terminal (the commands print a line per step there instead)."""
    return Progress(SpinnerColumn(), TextColumn("{task.fields[step]:<9.9}"), BarColumn(bar_width=16),
                    MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("{task.fields[item]}", markup=False,
                               table_column=Column(ratio=1, no_wrap=True, overflow="ellipsis", min_width=0)),
                    console=console, transient=False, expand=True, disable=not console.is_terminal)


class DownloadBar:
    """The sdist download's progress (``ApplyHooks.on_download``, called from the download's thread): a bar on a
    terminal, started on the first call; elsewhere a line at each tenth of the size (or each 10 MB)."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.bar: Progress | None = None
        self.task: Any = None
        self.said = -1
        self.last = ""

    def __call__(self, done: int, total: int | None) -> None:
        if not self.console.is_terminal:
            step = total // 10 if total else 10 * 10**6
            mark = done // step if step else 0
            line = shorten(f"  download: {done / 1e6:.1f} MB" + (f" of {total / 1e6:.1f} MB" if total else ""))
            if mark != self.said and (done > 0 or total) and line != self.last:
                self.said, self.last = mark, line
                self.console.print(line, markup=False)
            return
        if self.bar is None:
            self.bar = progress_bar(self.console)
            self.task = self.bar.add_task("download", total=None, step="download", item="sdist (MB)")
            self.bar.start()
        self.bar.update(self.task, completed=round(done / 1e6, 1), total=round(total / 1e6, 1) if total else None)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


def load(path: Path | None) -> Config:
    """The config (``-c``, else ./dcaforge.yaml, else the built-in default), or the error told; the
    ``-c`` given is kept for the commands that messages suggest."""
    _config.set(path)
    return call(lambda: load_config(path))


class _Warnings(logging.Handler):
    """dcaforge's warnings (what it repaired or removed after an interrupted run) on stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        err.print(f"[yellow]warning:[/] {escape(record.getMessage())}", markup=True)


def setup_logging(verbose: bool) -> None:
    """Warnings always; with ``-v``, every command run (the library logs to the ``dcaforge`` logger)."""
    logger = logging.getLogger("dcaforge")
    for h in [h for h in logger.handlers if isinstance(h, _Warnings)]:
        logger.removeHandler(h)
    logger.addHandler(_Warnings(level=logging.WARNING))
    if verbose:
        logging.basicConfig(level=logging.DEBUG, format="%(message)s", stream=sys.stderr)
    elif logger.level == logging.NOTSET:
        logger.setLevel(logging.WARNING)
