"""The source checkout is never written; only marked folders are reset; one run per room."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from dcaforge.errors import LockedError, MismatchError, SafetyError
from dcaforge.feature.drift import check
from dcaforge.feature.render import render
from dcaforge.patch.capture import capture
from dcaforge.patch.series import apply
from dcaforge.patch.status import status
from dcaforge.patch.verify import verify
from dcaforge.room.cleanroom import Room, locked

from .helpers import make_patch_git, replace_line, snapshot


def test_every_command_leaves_the_source_untouched_even_with_wip(project) -> None:
    src = project.source
    # the user's held tree: uncommitted edits, a staged new file, an untracked file, a deletion
    replace_line(src / "src/llama.cpp", "int line_005 = 5;", "int line_005 = 55; // wip")
    (src / "src/staged.h").write_text("staged\n")
    subprocess.run(["git", "add", "src/staged.h"], cwd=src, check=True)
    (src / "notes-untracked.md").write_text("only here\n")
    os.unlink(src / "docs/notes.txt")
    project.before = snapshot(src)

    def broken(tree) -> None:
        replace_line(tree / "src/llama.cpp", "int line_030 = 30;", "int line_030 = 0;")

    project.add_patch("0001-ok.patch", make_patch_git(src, broken, project.tmp, "ok"))
    cfg = project.config
    res = apply(cfg)
    assert sorted(res.wip_left_behind) == ["docs/notes.txt", "notes-untracked.md", "src/llama.cpp", "src/staged.h"]
    assert res.wip_included == []
    assert "// wip" not in (cfg.room / "src/llama.cpp").read_text()
    project.assert_source_untouched()
    for fn in (lambda: render(cfg), lambda: check(cfg), lambda: capture(cfg), lambda: verify(cfg),
               lambda: verify(cfg, fresh_render=True), lambda: status(cfg)):
        fn()
        project.assert_source_untouched()
    # --include-wip copies them into a fresh room (committed before the series)
    res = apply(cfg, fresh=True, include_wip=True)
    assert sorted(res.wip_included) == ["docs/notes.txt", "notes-untracked.md", "src/llama.cpp", "src/staged.h"]
    room = cfg.room
    assert "// wip" in (room / "src/llama.cpp").read_text() and "int line_030 = 0;" in (room / "src/llama.cpp").read_text()
    assert (room / "notes-untracked.md").read_text() == "only here\n" and not (room / "docs/notes.txt").exists()
    project.assert_source_untouched()
    # a failing series
    project.add_patch("0002-bad.patch", b"diff --git a/nope b/nope\n--- a/nope\n+++ b/nope\n@@ -1 +1 @@\n-a\n+b\n")
    with pytest.raises(MismatchError):
        apply(cfg, fresh=True)
    project.assert_source_untouched()


def test_refuses_a_workspace_inside_the_source(project) -> None:
    cfg = project.write_config(cleanroom=str(project.source / "rooms"))
    with pytest.raises(SafetyError, match="inside the source checkout"):
        apply(cfg)
    assert not (project.source / "rooms").exists()
    project.assert_source_untouched()


def test_only_marked_folders_are_reset(project) -> None:
    cfg = project.config
    cfg.room.mkdir(parents=True)
    (cfg.room / "precious.txt").write_text("mine\n")
    with pytest.raises(SafetyError, match="not made by dcaforge"):
        apply(cfg)
    with pytest.raises(SafetyError):
        apply(cfg, fresh=True)
    assert (cfg.room / "precious.txt").read_text() == "mine\n"
    with pytest.raises(SafetyError):
        Room.of(cfg).delete()
    assert (cfg.room / "precious.txt").exists()


HOLDER = """
import sys, time
from dcaforge.room.cleanroom import Room, locked
from pathlib import Path
room = Room(Path(sys.argv[1]), Path(sys.argv[2]))
with locked(room):
    print("held", flush=True)
    time.sleep(60)
"""


def test_lock_keeps_two_runs_off_one_room(project) -> None:
    cfg = project.config
    room = Room.of(cfg)
    # a lock file naming a live process that does not hold it (an old run's, a copy) is no lock
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        room.workspace.mkdir(parents=True, exist_ok=True)
        room.lock_file.write_text(f"{sleeper.pid}\n")
        apply(cfg)
        capture(cfg)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert not room.lock_file.exists()
    # a run that holds it keeps every other run off, and the error names it
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(room.path), str(room.workspace)],
                              stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        info = json.loads(room.lock_file.read_text())
        assert info["pid"] == holder.pid and info["host"] == socket.gethostname() and info["start"]
        for fn in (lambda: apply(cfg), lambda: capture(cfg), lambda: render(cfg), lambda: verify(cfg)):
            with pytest.raises(LockedError, match=f"pid {holder.pid} on {socket.gethostname()}"):
                fn()
    finally:
        holder.kill()  # SIGKILL: the kernel drops its lock
        holder.wait()
    with locked(room):
        assert json.loads(room.lock_file.read_text())["pid"] == os.getpid()
        with locked(room):  # re-entrant within one process
            pass
    assert not room.lock_file.exists()
    assert apply(cfg).baseline


def test_outside_git_env_cannot_redirect_dcaforge(project, monkeypatch) -> None:
    """GIT_DIR / GIT_INDEX_FILE / GIT_WORK_TREE from a hook or a shell do not leak into dcaforge's git."""
    decoy = project.tmp / "decoy"
    decoy.mkdir()
    subprocess.run(["git", "init", "-q", str(decoy)], check=True)
    monkeypatch.setenv("GIT_DIR", str(decoy / ".git"))
    monkeypatch.setenv("GIT_WORK_TREE", str(decoy))
    monkeypatch.setenv("GIT_INDEX_FILE", str(decoy / ".git" / "index"))
    res = apply(project.config)
    assert res.baseline and (project.config.room / "src/llama-dca.cpp").is_file()
    assert sorted(p.name for p in decoy.iterdir()) == [".git"]
    monkeypatch.delenv("GIT_DIR")
    monkeypatch.delenv("GIT_WORK_TREE")
    monkeypatch.delenv("GIT_INDEX_FILE")
    project.assert_source_untouched()
