"""Real signals at 15 points of a real ``dcaforge apply`` (a child process, its own process group):
SIGINT (what Ctrl-C sends the whole group), SIGTERM, and SIGKILL to the whole group. The child
announces each point by creating a file and waits there (before a step, or inside the git or
patch child it is about to run); the test then signals the group.

After each: SIGINT and SIGTERM exit 130 and print the next command; after SIGKILL the documented
next command is ``dcaforge apply --continue``. That command succeeds, and the room ends with the
same baseline commit and the same work-tree tree hash as an uninterrupted run; no git lock is left,
no byte outside the clean room changed and no payload ran.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dcaforge.room.trees import worktree_tree
from tests.core.helpers import sh, sigint_default

from .conftest import Arena
from .test_patches import gnu_new, llama_edit

CHILD = r'''
import os, sys, time
import dcaforge.git as g
import dcaforge.room.cleanroom as c

point, nth, mark = os.environ["POINT"], int(os.environ["NTH"]), os.environ["MARK"]
kind, _, when = point.partition(":")
seen = 0


def hit():
    global seen
    seen += 1
    return seen == nth


def pause():
    open(mark, "w").close()
    time.sleep(120)


def name_of(a):
    if os.path.basename(a[0]) != "git":
        return os.path.basename(a[0])
    i = 1
    while i < len(a) and a[i] == "-c":
        i += 2
    while i < len(a) and a[i].startswith("-"):
        i += 1
    return "git " + (a[i] if i < len(a) else "")


orig_run = g.run


def run(argv, cwd, **kw):
    a = [os.fspath(x) for x in argv]
    if name_of(a) == kind and hit():
        if when == "before":
            pause()
        elif when == "holding-index-lock":  # what a git killed while it writes the index leaves
            argv = ["sh", "-c", ': > .git/index.lock; touch "$0"; sleep 120', mark]
        else:  # inside the child: the signal reaches it and us together, as Ctrl-C does
            argv = ["sh", "-c", 'touch "$0"; sleep 120; exec "$@"', mark, *a]
    return orig_run(argv, cwd, **kw)


g.run = run
orig_write = c.write_all_atomic


def write_all(items, what="the file"):
    if kind == "write" and when in what and hit():
        pause()
    return orig_write(items, what)


c.write_all_atomic = write_all
orig_rmtree = c.shutil.rmtree


class Shutil:
    def __getattr__(self, name):
        import shutil
        return getattr(shutil, name)

    @staticmethod
    def rmtree(path, *args, **kwargs):
        if kind == "rmtree" and hit():
            os.unlink(next(p for p in __import__("pathlib").Path(path).rglob("*") if p.is_file()))  # half deleted
            pause()
        return orig_rmtree(path, *args, **kwargs)


c.shutil = Shutil()
from dcaforge.cli import main

sys.argv = ["dcaforge", *sys.argv[1:]]
main()
'''

# (point, nth occurrence, signal, the room before the interrupted command, its arguments)
POINTS = [
    ("git clone:child", 1, signal.SIGINT, "none", ["apply"]),
    ("git checkout:child", 1, signal.SIGTERM, "none", ["apply"]),
    ("git tag:before", 1, signal.SIGKILL, "none", ["apply"]),
    ("write:marker", 1, signal.SIGKILL, "none", ["apply"]),
    ("git apply:child", 2, signal.SIGINT, "none", ["apply"]),
    ("git apply:holding-index-lock", 3, signal.SIGKILL, "none", ["apply"]),
    ("patch:child", 3, signal.SIGKILL, "none", ["apply"]),
    ("git commit-tree:child", 2, signal.SIGTERM, "none", ["apply"]),
    ("git update-ref:before", 1, signal.SIGKILL, "none", ["apply"]),
    ("git tag:child", 2, signal.SIGINT, "none", ["apply"]),
    ("write:state", 4, signal.SIGTERM, "none", ["apply"]),
    ("write:the file", 2, signal.SIGKILL, "none", ["apply"]),
    ("write:the file", 3, signal.SIGINT, "none", ["apply"]),
    ("git reset:child", 1, signal.SIGKILL, "pinned", ["apply", "--fresh", "--force"]),
    ("git clean:holding-index-lock", 1, signal.SIGTERM, "pinned", ["apply", "--fresh", "--force"]),
    ("rmtree:before", 1, signal.SIGKILL, "made", ["apply", "--fresh", "--force"]),
]


def _series(arena: Arena) -> None:
    arena.patch("0001-a.patch", llama_edit())
    arena.patch("0002-b.patch", llama_edit("int line_030 = 30;", "int line_030 = 33;").replace("@@ -4,3 +4,3 @@", "@@ -29,3 +29,3 @@")
                .replace("int line_004 = 4;", "int line_029 = 29;").replace("int line_006 = 6;", "int line_031 = 31;"))
    arena.patch("0003-c.patch", gnu_new("src/gnu-added.c", "int gnu = 1;\n"))
    arena.patch("0004-d.patch", gnu_new("docs/more.txt", "more\n"))


def _state(room: Path) -> tuple[str, str, str]:
    baseline = sh(["git", "rev-parse", "dcaforge/baseline"], room).stdout.decode().strip()
    head = sh(["git", "rev-parse", "HEAD"], room).stdout.decode().strip()
    return baseline, head, worktree_tree(room)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, source_template: Path) -> tuple[str, str, str]:
    """The room of an uninterrupted run of the same source, series and feature."""
    arena = Arena(tmp_path_factory.mktemp("reference"), source_template)
    _series(arena)
    out = arena.cli("apply", "-c", str(arena.config_path))
    assert out.code == 0, out.output
    return _state(arena.room)


def _lock_files(room: Path) -> list[str]:
    return sorted(str(p) for p in (room / ".git").rglob("*.lock")) if room.exists() else []


@pytest.mark.parametrize(("point", "nth", "sig", "before", "args"),
                         [pytest.param(*p, id=f"{p[0]}#{p[1]}-{signal.Signals(p[2]).name}-{p[3]}") for p in POINTS])
def test_signal_then_the_next_command_gives_the_same_room(arena: Arena, reference: tuple[str, str, str], point: str,
                                                          nth: int, sig: int, before: str, args: list[str]) -> None:
    _series(arena)
    if before == "pinned":
        arena.write_config(source=f"git: {arena.source}\nref: {arena.base}")
    if before in ("pinned", "made"):
        arena.applied()
        (arena.room / "hand-made.txt").write_text("dropped by --fresh --force\n")
    mark = arena.tmp / "at-point"
    snap = arena.snapshot()
    env = {**os.environ, "POINT": point, "NTH": str(nth), "MARK": str(mark), "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, *args, "-c", str(arena.config_path)], cwd=arena.tmp, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=sigint_default)
    try:
        deadline = time.time() + 90
        while not mark.exists():
            assert proc.poll() is None, f"{point} was never reached:\n{proc.stdout.read().decode() if proc.stdout else ''}"
            assert time.time() < deadline, f"{point} was never reached"
            time.sleep(0.02)
        time.sleep(0.05)
        os.killpg(proc.pid, sig)  # the whole group: dcaforge and the git or patch it runs
        output = proc.communicate(timeout=60)[0].decode()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if sig == signal.SIGKILL:
        assert proc.returncode == -signal.SIGKILL
        follow = ["apply", "--continue"]  # the README's next command after a hard kill
    else:
        assert proc.returncode == 130, output
        assert "interrupted:" in output and "Traceback" not in output, output
        m = re.search(r"next:.*?`dcaforge ([^`]+)`", output)
        assert m, output
        follow = m.group(1).split()
    mark.unlink()
    out = arena.run(*follow, code=0, may_change=[mark])
    if point.endswith("holding-index-lock") and sig == signal.SIGKILL:
        assert "warning: removed .git/index.lock left by an interrupted git" in out.output, out.output
    assert _lock_files(arena.room) == []
    assert not arena.ran.exists()
    assert _state(arena.room) == reference, out.output
    assert not (arena.room / "hand-made.txt").exists()
    assert sorted(p.name for p in arena.workspace.iterdir()) == ["room"], "leftovers in the workspace"
    after = arena.snapshot()
    assert {k: v for k, v in after.items() if k != "at-point"} == {k: v for k, v in snap.items() if k != "at-point"}
