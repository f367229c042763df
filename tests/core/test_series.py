"""Series application: conflicts, GNU-style patches, 3-way, resume, interrupts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dcaforge.errors import DcaforgeError, MismatchError
from dcaforge.patch.series import ApplyHooks, applied_names, apply
from dcaforge.patchfile import parse_hunks
from dcaforge.room.cleanroom import Room
from dcaforge.room.state import Phase

from .helpers import LLAMA, make_patch_git, make_patch_gnu, replace_line, sh, sigint_default


def _edit_line(n: int, new: str):
    def edit(tree: Path) -> None:
        replace_line(tree / "src/llama.cpp", f"int line_{n:03d} = {n};", new)
    return edit


def _head_subject(room: Path) -> str:
    return sh(["git", "log", "-1", "--format=%s"], room).stdout.decode().strip()


def test_conflicting_hunk_is_reported_and_resumable(project) -> None:
    project.add_patch("0001-a.patch", make_patch_git(project.source, _edit_line(10, "int line_010 = -1;"), project.tmp, "a"))
    # 0002 was made against the base but touches the same line: a real conflict
    bad = make_patch_git(project.source, _edit_line(10, "int line_010 = -2;"), project.tmp, "b")
    project.add_patch("0002-b.patch", bad)
    project.add_patch("0003-c.patch", make_patch_git(project.source, _edit_line(50, "int line_050 = -3;"), project.tmp, "c"))
    cfg = project.config
    with pytest.raises(MismatchError) as exc:
        apply(cfg)
    err = exc.value
    assert err.exit_code == 3
    assert "patch 2/3 0002-b.patch does not apply" in err.message
    assert "file src/llama.cpp" in (err.where or "")
    assert "hunk #1 @@ -7,7 +7,7 @@" in (err.where or "")
    assert "patch failed: src/llama.cpp:7" in (err.details or "")
    assert "dcaforge apply --continue" in (err.hint or "")
    room = cfg.room
    assert _head_subject(room) == "0001-a"
    assert sh(["git", "status", "--porcelain"], room).stdout == b""
    assert Room.of(cfg).load_state().phase == Phase.FAILED
    # a plain apply refuses and says how to resume
    with pytest.raises(DcaforgeError, match="stopped at 0002-b.patch"):
        apply(cfg)
    # resolve by hand in the room, then --continue commits the resolution as 0002
    replace_line(room / "src/llama.cpp", "int line_010 = -1;", "int line_010 = -12;")
    res = apply(cfg, cont=True)
    assert res.applied_now == ["0002-b.patch", "0003-c.patch"]
    assert res.methods["0002-b.patch"] == "resolved by hand"
    assert applied_names(room) == ["0001-a.patch", "0002-b.patch", "0003-c.patch"]
    assert "int line_010 = -12;" in (room / "src/llama.cpp").read_text()
    project.assert_source_untouched()


def test_continue_after_fixing_the_patch_file(project) -> None:
    project.add_patch("0001-a.patch", make_patch_git(project.source, _edit_line(10, "int line_010 = -1;"), project.tmp, "a"))
    project.add_patch("0002-b.patch", b"diff --git a/src/llama.cpp b/src/llama.cpp\n--- a/src/llama.cpp\n"
                      b"+++ b/src/llama.cpp\n@@ -30,1 +30,1 @@\n-int nothing = 0;\n+int nothing = 1;\n")
    cfg = project.config
    with pytest.raises(MismatchError):
        apply(cfg)
    project.add_patch("0002-b.patch", make_patch_git(project.source, _edit_line(30, "int line_030 = 3;"), project.tmp, "b2"))
    res = apply(cfg, cont=True)
    assert res.applied_now == ["0002-b.patch"] and res.baseline
    project.assert_source_untouched()


def test_three_way_fallback_when_preimages_exist(project) -> None:
    project.add_patch("0001-a.patch", make_patch_git(project.source, _edit_line(10, "int line_010 = -1;"), project.tmp, "a"))
    # made against the base: its context includes line 10, which 0001 changed; 3-way merges it
    project.add_patch("0002-b.patch", make_patch_git(project.source, _edit_line(13, "int line_013 = -2;"), project.tmp, "b"))
    res = apply(project.config)
    assert res.methods == {"0001-a.patch": "git apply", "0002-b.patch": "git apply --3way"}
    text = (project.config.room / "src/llama.cpp").read_text()
    assert "int line_010 = -1;" in text and "int line_013 = -2;" in text


def test_gnu_style_series(project) -> None:
    before = {"src/llama.cpp": LLAMA}
    after = {"src/llama.cpp": LLAMA.replace("int line_020 = 20;", "int line_020 = 200;"),
             "src/llamafile-extra.c": "int extra = 1;\n"}
    p1 = make_patch_gnu(before, after, project.tmp)
    assert b"diff --git" not in p1 and b"--- a/src/llama.cpp" in p1
    project.add_patch("0001-gnu.patch", p1)
    after2 = {"src/llama.cpp": LLAMA.replace("int line_040 = 40;", "int line_040 = 400;")}
    project.add_patch("0002-gnu.diff", make_patch_gnu(before, after2, project.tmp))
    cfg = project.config
    res = apply(cfg, render=False)
    assert res.methods == {"0001-gnu.patch": "patch -p1", "0002-gnu.diff": "patch -p1"}
    room = cfg.room
    assert (room / "src/llamafile-extra.c").read_text() == "int extra = 1;\n"
    assert sh(["git", "status", "--porcelain"], room).stdout == b""
    assert not list(room.rglob("*.orig")) and not list(room.rglob("*.rej"))
    project.assert_source_untouched()


def test_gnu_style_failure_names_hunk_and_never_fuzzes(project) -> None:
    before = {"src/llama.cpp": LLAMA}
    # context that is almost right (one line differs): fuzz would apply it, we must not
    fuzzy = LLAMA.replace("int line_023 = 23;", "int line_023 = 23; // drifted")
    patch = make_patch_gnu({"src/llama.cpp": fuzzy},
                           {"src/llama.cpp": fuzzy.replace("int line_025 = 25;", "int line_025 = 0;")}, project.tmp)
    project.add_patch("0001-ok.patch", make_patch_gnu(
        before, {"src/llama.cpp": LLAMA.replace("int line_001 = 1;", "int line_001 = 0;")}, project.tmp))
    project.add_patch("0002-fuzzy.patch", patch)
    cfg = project.config
    with pytest.raises(MismatchError) as exc:
        apply(cfg)
    where = exc.value.where or ""
    assert "0002-fuzzy.patch" in exc.value.message
    assert "file src/llama.cpp" in where and "hunk #1 @@ -22,7 +22,7 @@" in where
    assert "Hunk #1 FAILED at 22" in (exc.value.details or "")
    room = cfg.room
    assert _head_subject(room) == "0001-ok"
    assert sh(["git", "status", "--porcelain"], room).stdout == b""
    assert "int line_025 = 25;" in (room / "src/llama.cpp").read_text()


def test_series_file_and_range(project) -> None:
    for i, n in ((1, 10), (2, 20), (3, 30)):
        project.add_patch(f"000{i}-p.patch", make_patch_git(project.source, _edit_line(n, f"int line_{n:03d} = 0;"),
                                                            project.tmp, f"p{i}"))
    cfg = project.write_config(extra_series="range: 0002-0003")
    assert apply(cfg).applied_now == ["0002-p.patch", "0003-p.patch"]
    (project.patches / "series").write_text("# order\n0003-p.patch\n\n0001-p.patch -p1\n")
    cfg = project.write_config(extra_series="file: series", name="room2")
    assert apply(cfg).applied_now == ["0003-p.patch", "0001-p.patch"]


def test_interrupt_mid_series_leaves_a_resumable_room(project) -> None:
    for i in range(1, 7):
        project.add_patch(f"{i:04d}-p.patch", make_patch_git(
            project.source, _edit_line(i * 8, f"int line_{i * 8:03d} = 0;"), project.tmp, f"p{i}"))
    cfg = project.config

    def boom(i: int, n: int, patch) -> None:
        if i == 3:
            (cfg.room / "src/llama.cpp").write_text("half-written\n")  # as if mid-patch
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        apply(cfg, hooks=ApplyHooks(on_patch=boom))
    room = cfg.room
    assert applied_names(room) == ["0001-p.patch", "0002-p.patch", "0003-p.patch"]
    assert sh(["git", "status", "--porcelain"], room).stdout == b""
    assert Room.of(cfg).load_state().phase == Phase.INTERRUPTED
    assert not Room.of(cfg).lock_file.exists()
    with pytest.raises(DcaforgeError, match="interrupted"):
        apply(cfg)
    res = apply(cfg, cont=True)
    assert res.skipped_to == 3 and len(res.applied_now) == 3 and res.baseline
    project.assert_source_untouched()


SLOW_CLI = """
import sys, time
import dcaforge.patch.series as s
orig = s.apply_one
def slow(room, patch):
    print(f"APPLYING {patch.name}", file=sys.stderr, flush=True)
    time.sleep(0.15)
    return orig(room, patch)
s.apply_one = slow
from dcaforge.cli import main
sys.argv = ["dcaforge", "apply", "-c", sys.argv[1]]
main()
"""


def test_real_sigint_to_the_cli_mid_series(project) -> None:
    for i in range(1, 21):
        project.add_patch(f"{i:04d}-p.patch", make_patch_git(
            project.source, _edit_line(i * 3, f"int line_{i * 3:03d} = 0;"), project.tmp, f"p{i}"))
    cfg = project.config
    proc = subprocess.Popen([sys.executable, "-c", SLOW_CLI, str(project.config_path)], cwd=project.tmp,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=sigint_default)
    assert proc.stderr is not None
    seen = 0
    deadline = time.time() + 60
    while time.time() < deadline:
        line = proc.stderr.readline().decode()
        if line.startswith("APPLYING"):
            seen += 1
            if seen == 6:
                time.sleep(0.05)
                os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
                break
    rest = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 130, rest
    assert "interrupted" in rest and "apply --continue" in rest
    room = cfg.room
    names = applied_names(room)
    assert 4 <= len(names) <= 6
    assert sh(["git", "status", "--porcelain"], room).stdout == b""
    res = apply(cfg, cont=True)
    assert len(names) + len(res.applied_now) == 20
    project.assert_source_untouched()


def test_parse_hunks_counts_lines() -> None:
    text = ("diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1,3 +1,3 @@\n a\n--- not a header\n+b\n c\n"
            "@@ -10 +10 @@\n-q\n+r\n")
    hunks = parse_hunks(text)
    assert [(h.file, h.index, h.old_start) for h in hunks] == [("x", 1, 1), ("x", 2, 10)]


def test_continue_on_a_finished_room_keeps_hand_edits(project) -> None:
    cfg = project.config
    apply(cfg)
    (cfg.room / "src/llama.cpp").write_text("hand edit\n")
    res = apply(cfg, cont=True)
    assert "nothing to continue: the series is fully applied" in res.notes
    assert (cfg.room / "src/llama.cpp").read_text() == "hand edit\n"


def test_series_change_reapplies_and_source_change_needs_fresh(project) -> None:
    project.add_patch("0001-a.patch", make_patch_git(project.source, _edit_line(10, "int line_010 = -1;"), project.tmp, "a"))
    cfg = project.config
    apply(cfg)
    project.add_patch("0002-b.patch", make_patch_git(project.source, _edit_line(40, "int line_040 = -4;"), project.tmp, "b"))
    res = apply(cfg)
    assert "series changed: re-applied from the start" in res.notes
    assert res.applied_now == ["0001-a.patch", "0002-b.patch"]
    other = project.tmp / "other-source"
    sh(["git", "clone", "-q", str(project.source), str(other)], project.tmp)
    cfg2 = project.write_config(source=f"git: {other}\nref: main")
    with pytest.raises(DcaforgeError, match="the config now says") as exc:
        apply(cfg2)
    assert exc.value.hint == "`dcaforge apply --fresh`"
    assert apply(cfg2, fresh=True).created
