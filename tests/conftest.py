"""What every test run shares: it leaves the checkout as it found it.

At the end of the session the checkout's ``git status --porcelain`` (untracked files included,
ignored ones not) must be what it was at the start, and each file that was already changed must
hold the same bytes: a test or benchmark that writes a tracked file, or leaves a file that is not
ignored, fails the run, naming the files. Results go to ``build/`` (ignored); committed result
files are refreshed only on request, with ``--update-results`` (those files are then allowed to
change). Under pytest-xdist the check runs once, in the controlling process.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from dcaforge.git import porcelain_z

REPO = Path(__file__).resolve().parent.parent
#: Where tests and benchmarks write what they measure (build/ is ignored by git).
RESULTS = REPO / "build" / "results"
_START = pytest.StashKey[dict[str, str] | None]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-results", action="store_true", default=False,
                     help="write measured results into the committed result files (e.g. tests/models/RESULTS.md) "
                          "instead of build/results/")


def checkout_state(repo: Path = REPO) -> dict[str, str] | None:
    """Each path ``git status --porcelain`` lists, with its status and the sha256 of its bytes; None
    when ``repo`` is not a git checkout (an unpacked sdist, say)."""
    res = subprocess.run(["git", "-C", str(repo), "status", "--porcelain=v1", "-z", "--untracked-files=all"],
                         capture_output=True, check=False)
    if res.returncode != 0:
        return None
    state: dict[str, str] = {}
    for code, rel in porcelain_z(res.stdout.decode("utf-8", "surrogateescape")):
        path = repo / rel
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() and not path.is_symlink() else "-"
        state[rel] = f"{code} {digest}"
    return state


def changes(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """Paths whose status or bytes differ between two :func:`checkout_state` readings."""
    return sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))


def _controller(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput")  # pytest-xdist workers have it


def pytest_sessionstart(session: pytest.Session) -> None:
    if _controller(session.config):
        session.config.stash[_START] = checkout_state()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    before = config.stash.get(_START, None)
    if not _controller(config) or before is None:
        return
    after = checkout_state()
    if after is None:
        return
    changed = changes(before, after)
    if config.getoption("--update-results"):
        changed = [p for p in changed if not p.endswith("RESULTS.md")]
    if changed:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        lines = ["the test run changed the checkout (tests write results under build/, never tracked files):",
                 *(f"  {p}: {before.get(p, 'clean')} -> {after.get(p, 'clean')}" for p in changed)]
        if reporter is not None:
            reporter.write_sep("=", "checkout not clean", red=True)
            for line in lines:
                reporter.write_line(line, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
