"""Running a build's commands: each one's output appended to a log under ``<room>/.git/dcaforge/logs/`` (the last
:data:`LOGS_KEPT` kept) while the caller's hooks see each step, its progress and its lines; a command that fails
raises :class:`~dcaforge.errors.BuildError` with the first compiler error and the log's path. And what a build
gives back (:class:`BuildResult`)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dcaforge.builder.buildlog import Progress, first_error, parse_progress
from dcaforge.errors import BuildError
from dcaforge.git import run_streaming
from dcaforge.room.cleanroom import Room

LOGS_KEPT = 20

@dataclass
class BuildHooks:
    """Callbacks the CLI uses for live progress."""

    on_step: Callable[[str, tuple[str, ...]], None] | None = None  # (what, argv) before each command
    on_progress: Callable[[Progress], None] | None = None
    on_line: Callable[[str], None] | None = None


@dataclass(frozen=True)
class Step:
    what: str
    argv: tuple[str, ...]
    seconds: float
    progress: Progress | None  # the last [n/N] seen
    skipped: bool = False  # a configure that was up to date


@dataclass
class BuildResult:
    backend: str
    variant: str  # "feature" (the clean room) or "baseline"
    tree: Path  # the clean room or the baseline worktree
    source: Path  # where CMakeLists.txt / the Makefile is
    build_dir: Path
    cuda: bool
    targets: tuple[str, ...]
    jobs: int
    log: Path
    ccache: bool
    seconds: float = 0.0
    steps: list[Step] = field(default_factory=list)
    outputs: list[Path] = field(default_factory=list)
    programs: dict[str, Path] = field(default_factory=dict)  # each target built as an executable -> its file
    notes: list[str] = field(default_factory=list)  # what the build did that the config did not say (printed)

    @property
    def compiled(self) -> int:
        """Edges ninja/make ran in the build step(s) (0: everything was up to date)."""
        return sum(s.progress.done for s in self.steps if s.progress and s.what != "configure")

    @property
    def bin_dir(self) -> Path:
        return self.build_dir / "bin"


def log_path(room: Room, variant: str, cuda: bool) -> Path:
    """A new log ``<room>/.git/dcaforge/logs/build-<variant>[-cuda]-<time>.log``; the oldest of its kind go so that
    :data:`LOGS_KEPT` remain with it."""
    logs = room.meta / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    prefix = f"build-{variant}{'-cuda' if cuda else ''}"
    old = sorted(logs.glob(f"{prefix}-*.log"))
    for p in old[:-(LOGS_KEPT - 1)] if len(old) >= LOGS_KEPT else []:
        p.unlink()
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime())
    path = logs / f"{prefix}-{stamp}.log"
    n = 1
    while path.exists():
        n += 1
        path = logs / f"{prefix}-{stamp}-{n}.log"
    return path


class Runner:
    """Runs a build's commands one after the other into one log (:meth:`__call__`), keeping their steps."""

    def __init__(self, log: Path, hooks: BuildHooks, env: dict[str, str]) -> None:
        self.log, self.hooks, self.env = log, hooks, env
        self.steps: list[Step] = []

    def __call__(self, what: str, argv: Sequence[str | os.PathLike[str]], cwd: Path, *, diag_base: Path) -> Step:
        args = tuple(os.fspath(a) for a in argv)
        if self.hooks.on_step:
            self.hooks.on_step(what, args)
        last: list[Progress] = []
        start_at = self.log.stat().st_size if self.log.exists() else 0

        def on_line(line: str) -> None:
            p = parse_progress(line)
            if p is not None:
                last[:] = [p]
                if self.hooks.on_progress:
                    self.hooks.on_progress(p)
            if self.hooks.on_line:
                self.hooks.on_line(line)

        t0 = time.monotonic()
        rc = run_streaming(args, cwd, log_file=self.log, on_line=on_line, env=self.env)
        step = Step(what=what, argv=args, seconds=time.monotonic() - t0, progress=last[0] if last else None)
        self.steps.append(step)
        if rc != 0:
            raise self._failure(what, rc, start_at, diag_base)
        return step

    def _failure(self, what: str, rc: int, start_at: int, diag_base: Path) -> BuildError:
        """The error of a step that exited ``rc``: the first error in its part of the log (from ``start_at``),
        else the part's last lines."""
        with open(self.log, encoding="utf-8", errors="replace") as fh:
            fh.seek(start_at)
            lines = fh.read().splitlines()
        d = first_error(lines, base=diag_base)
        details = []
        if d is not None:
            if d.target:
                details.append(f"target: {d.target}")
            details.append(f"{d.location() or '(no file)'}: error: {d.message}")
            details.extend(d.context)
        else:
            details.extend(lines[-15:])
        return BuildError(f"{what} failed (exit {rc})" + (f" at {d.location()}" if d and d.location() else ""),
                          where=f"log: {self.log}", details="\n".join(details),
                          hint=f"fix it (the full output is in {self.log}), then run the same `dcaforge build` again: "
                               "only what changed is rebuilt")

    def skipped(self, what: str, argv: Sequence[str]) -> None:
        self.steps.append(Step(what=what, argv=tuple(argv), seconds=0.0, progress=None, skipped=True))
