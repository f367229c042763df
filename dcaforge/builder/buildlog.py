"""Reading a build's output: the progress lines (``[n/N]`` of ninja and cosmocc's make, ``[ NN%]`` of cmake's
Makefiles) and the first compiler, linker or CMake error of a failed build."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

_NINJA_STATUS = re.compile(r"^\[(\d+)/(\d+)\]\s*(.*)$")
_PERCENT = re.compile(r"^\[\s*(\d{1,3})%\]\s*(.*)$")


@dataclass(frozen=True)
class Progress:
    done: int
    total: int
    text: str


def parse_progress(line: str) -> Progress | None:
    """``[12/345] Building CXX object ...`` (ninja, cosmocc make) or ``[ 45%] Building ...``
    (cmake's Makefiles, as 45/100); None for any other line."""
    m = _NINJA_STATUS.match(line)
    if m:
        done, total = int(m.group(1)), int(m.group(2))
        if 0 <= done <= total and total > 0:
            return Progress(done, total, m.group(3).strip())
        return None
    m = _PERCENT.match(line)
    if m and int(m.group(1)) <= 100:
        return Progress(int(m.group(1)), 100, m.group(2).strip())
    return None


@dataclass(frozen=True)
class Diagnostic:
    """The first error of a failed build."""

    message: str
    file: str | None = None
    line: int | None = None
    column: int | None = None
    context: tuple[str, ...] = ()  # the lines after it (the compiler's excerpt, CMake's message)
    target: str | None = None  # ninja's FAILED: line

    def location(self) -> str | None:
        if self.file is None:
            return None
        loc = self.file
        if self.line is not None:
            loc += f":{self.line}"
            if self.column is not None:
                loc += f":{self.column}"
        return loc


_GCC_ERROR = re.compile(
    r"^(?P<file>[^\s:][^:]*?):(?P<line>\d+)(?::(?P<col>\d+))?:\s+(?:fatal\s+)?error:\s*(?P<msg>.+)$")
_NVCC_ERROR = re.compile(
    r"^(?P<file>[^\s(][^(]*?)\((?P<line>\d+)\):\s+(?:catastrophic\s+)?error:?\s*(?P<msg>.+)$")
_CMAKE_ERROR = re.compile(r"^CMake Error(?: at (?P<file>[^:]+?):(?P<line>\d+))?(?:\s*\([^)]*\))?:\s*(?P<msg>.*)$")
_LINK_ERROR = re.compile(r"(?P<msg>undefined reference to .+|multiple definition of .+|"
                         r"(?:ld|ld\.\w+|lld|collect2)(?:\.exe)?: (?:fatal )?error: .+|cannot find -l\S+)")
_FAILED = re.compile(r"^FAILED: (?:\[code=\d+\] )?(?P<target>.+)$")
_MAKE_ERROR = re.compile(r"^g?make(?:\[\d+\])?: \*\*\* (?P<msg>.+)$")


def first_error(lines: Iterable[str], *, base: Path | None = None) -> Diagnostic | None:
    """The first compiler, linker or CMake error in build output (``file:line: message``), else
    the first failed target or make error; relative paths are made absolute against ``base``."""
    seq = list(lines)
    target: str | None = None
    fallback: Diagnostic | None = None
    for i, line in enumerate(seq):
        m = _FAILED.match(line)
        if m:
            target = target or m.group("target").strip()
            continue
        for rx in (_GCC_ERROR, _NVCC_ERROR):
            m = rx.match(line)
            if m:
                return Diagnostic(message=m.group("msg").strip(), file=_abs(m.group("file"), base),
                                  line=int(m.group("line")),
                                  column=int(m.group("col")) if "col" in m.groupdict() and m.group("col") else None,
                                  context=_context(seq, i + 1, stop_at_blank=False), target=target)
        m = _CMAKE_ERROR.match(line)
        if m:
            ctx = _context(seq, i + 1, stop_at_blank=True, n=8)
            msg = m.group("msg").strip() or " ".join(c.strip() for c in ctx[:2]) or "CMake Error"
            return Diagnostic(message=msg, file=_abs(m.group("file"), base) if m.group("file") else None,
                              line=int(m.group("line")) if m.group("line") else None, context=ctx, target=target)
        m = _LINK_ERROR.search(line)
        if m:
            return Diagnostic(message=m.group("msg").strip(), context=_context(seq, i + 1, stop_at_blank=False, n=3),
                              target=target)
        m = _MAKE_ERROR.match(line)
        if m and fallback is None:
            fallback = Diagnostic(message=m.group("msg").strip(), target=target)
    if fallback is not None:
        return fallback
    if target is not None:
        return Diagnostic(message=f"{target} failed", target=target)
    return None


def _abs(path: str, base: Path | None) -> str:
    p = Path(path)
    if base is not None and not p.is_absolute():
        return os.path.normpath(base / p)
    return path


def _context(seq: list[str], start: int, *, stop_at_blank: bool, n: int = 4) -> tuple[str, ...]:
    out: list[str] = []
    for line in seq[start:start + n]:
        if stop_at_blank and not line.strip() and out:
            break
        if _FAILED.match(line) or _NINJA_STATUS.match(line) or _GCC_ERROR.match(line) or line.startswith(("ninja: ", "make")):
            break
        out.append(line)
    return tuple(out)
