"""What every test run shares: it leaves the checkout as it found it.

At the end of the session the checkout's ``git status --porcelain`` (untracked files included,
ignored ones not) must be what it was at the start, and each file that was already changed must
hold the same bytes: a test or benchmark that writes a tracked file, or leaves a file that is not
ignored, fails the run, naming the files. Results go to ``build/`` (ignored); committed result
files are refreshed only on request, with ``--update-results`` (those files are then allowed to
change). Under pytest-xdist the check runs once, in the controlling process.

The suite runs in two pytest-xdist workers (pyproject's addopts: ``-n 2 --dist loadgroup``); tests that
share state are one ``xdist_group``, run by one worker in their order (:func:`xdist_group`).
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path
from typing import Any

import pytest

from dcaforge.checkout import porcelain_z

REPO = Path(__file__).resolve().parent.parent
#: Where tests and benchmarks write what they measure (build/ is ignored by git).
RESULTS = REPO / "build" / "results"
_START = pytest.StashKey[dict[str, str] | None]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-results", action="store_true", default=False,
                     help="write measured results into the committed result files (e.g. tests/models/RESULTS.md) "
                          "instead of build/results/")


#: tests/e2e modules that never touch the shared clean room cleanroom/e2e (their rooms are their own, under
#: pytest's tmp; the sdist cache they read is locked): a group of their own, or none
E2E_OWN_ROOMS: dict[str, str | None] = {
    "test_llamafile_build.py": "llamafile",  # module fixtures: the two pinned checkouts
    "test_llamafile_layout.py": "llamafile",
    "test_drift_canary.py": None,
    "test_series77.py": "series77",  # module fixture: the generated series and its rooms
}
#: modules whose tests share a room made by a module-scoped fixture
MODULE_ROOMS = ("tests/hostile/test_interrupts.py", "tests/hostile/test_fuzz.py")


#: test_e2e_drift's tests that use the upstream room (the ``cleanroom`` fixture); the module's others use the old
#: tree's own room (checked at collection: :func:`pytest_collection_modifyitems`)
DRIFT_UPSTREAM_TESTS = ("test_anchors_fit_the_default_tree",)


def xdist_group(nodeid: str) -> str | None:
    """The pytest-xdist group of a test, from its node id: every tests/e2e module shares the clean room cleanroom/e2e
    (one ``dcaforge apply`` and incremental builds, by session fixtures, some reached only through
    ``request.getfixturevalue``), so they are one group, "e2e-room", but those of :data:`E2E_OWN_ROOMS` and
    test_e2e_drift's tests of the old tree's own room ("e2e-drift"); a module of :data:`MODULE_ROOMS` is a group;
    any other test (None) goes to whichever worker is free."""
    rel, _, rest = nodeid.partition("::")
    name = rest.split("[", 1)[0]
    if rel in MODULE_ROOMS:
        return rel
    if rel == "tests/e2e/test_e2e_drift.py" and name not in DRIFT_UPSTREAM_TESTS:
        return "e2e-drift"  # the old tree's room (old_room), beside the upstream one in the workspace
    if rel.startswith("tests/e2e/"):
        return E2E_OWN_ROOMS.get(rel.rsplit("/", 1)[-1], "e2e-room")
    return None


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` with the groups of :func:`xdist_group`: each group is one unit of work, run by one worker
    in collection order. (pytest-xdist's own loadgroup reads ``xdist_group`` marks into the node ids, which no longer
    takes with pytest 9.2: the room's tests were spread over both workers and collided on the room's lock.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class RoomScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid) or nodeid

    return RoomScheduling(config, log)


#: the tests marked ``slow`` (``pytest -m "not slow"`` leaves them out): the end-to-end ones, which build llama.cpp
SLOW_PREFIXES = ("tests/e2e/",)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every tests/e2e test is marked ``slow``. A test_e2e_drift test that uses the upstream room must be in
    :data:`DRIFT_UPSTREAM_TESTS` (else it would run beside the room's other users)."""
    for item in items:
        if item.nodeid.startswith(SLOW_PREFIXES):
            item.add_marker(pytest.mark.slow)
        if "cleanroom" in getattr(item, "fixturenames", ()) and xdist_group(item.nodeid) == "e2e-drift":
            raise pytest.UsageError(f"{item.nodeid} uses the cleanroom fixture: add its name to DRIFT_UPSTREAM_TESTS "
                                    "in tests/conftest.py")


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
