"""apply -> render -> capture -> verify on a real git source, and the round trip of tricky changes."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from dcaforge.errors import MismatchError, SafetyError
from dcaforge.feature.render import render
from dcaforge.patch.capture import capture
from dcaforge.patch.series import apply
from dcaforge.patch.status import status
from dcaforge.patch.verify import verify
from dcaforge.room.cleanroom import BASELINE_TAG

from .helpers import make_patch_git, replace_line, sh


def _series(project, n: int = 3) -> None:
    for i in range(1, n + 1):
        def edit(tree: Path, i: int = i) -> None:
            replace_line(tree / "src/llama.cpp", f"int line_{i * 10:03d} = {i * 10};",
                         f"int line_{i * 10:03d} = {i * 1000}; // patch {i}")
        project.add_patch(f"{i:04d}-edit-{i}.patch", make_patch_git(project.source, edit, project.tmp, f"p{i}"))


def test_apply_render_capture_verify(project) -> None:
    _series(project)
    cfg = project.config
    res = apply(cfg)
    room = cfg.room
    assert res.created and res.total == 3 and res.applied_now == [f"{i:04d}-edit-{i}.patch" for i in (1, 2, 3)]
    log = sh(["git", "log", "--format=%s|%an <%ae>|%ad", "--date=iso"], room).stdout.decode().splitlines()
    assert log[0].startswith("0003-edit-3|dcaforge <dcaforge@localhost>|2000-01-01")
    assert sh(["git", "rev-parse", BASELINE_TAG], room).stdout.decode().strip() == res.baseline
    # rendered: a new file, an exec-bit file, edits; the when_exists file was skipped
    dca = (room / "src/llama-dca.cpp").read_text()
    assert dca == "// opencoti F5 dca\n// feature 78 dca in .\nint dca_chunk = 8192;\n"
    assert os.stat(room / "tools/dca.sh").st_mode & 0o111
    assert not (room / "src/never.cpp").exists()
    gemma = (room / "src/models/gemma4.cpp").read_text()
    assert '#include "models.h"\n#include "llama-dca.h" // opencoti F5 dca\n' in gemma
    assert "        Kcur = ggml_rope_ext(ctx0, Kcur, llm_dca_pos_k(inp_pos, il), // opencoti F5 dca\n" in gemma
    assert (room / "CMakeLists.txt").read_text().count("# 0078-dca chunk=8192\nadd_library") == 1

    cap = capture(cfg)
    patch = project.patches / "0078-dca.patch"
    assert cap.written and cap.path == patch
    text = patch.read_text()
    assert text.startswith("diff --git a/CMakeLists.txt b/CMakeLists.txt\nindex ")
    assert "new file mode 100755\n" in text  # tools/dca.sh
    v = verify(cfg)
    assert v.expected_from == "capture" and v.reverse_tree == v.baseline_tree
    verify(cfg, fresh_render=True)
    st = status(cfg)
    assert (st.series_applied, st.series_total, st.patch_state, st.rendered) == (3, 3, "fresh", True)
    assert st.dirty == []
    # capture again: same bytes, not rewritten
    assert not capture(cfg).written
    # apply again with nothing changed: no re-apply, render finds nothing to write
    again = apply(cfg)
    assert again.applied_now == [] and again.render.written == []
    project.assert_source_untouched()


def test_render_is_idempotent_and_guards_hand_edits(project) -> None:
    cfg = project.config
    apply(cfg)
    room = cfg.room
    first = {p: (room / p).read_bytes() for p in ("src/models/gemma4.cpp", "CMakeLists.txt", "src/llama-dca.cpp")}
    r = render(cfg)
    assert r.written == [] and len(r.unchanged) == 4
    assert {p: (room / p).read_bytes() for p in first} == first
    # a hand edit in a rendered file: render refuses, --force overwrites
    (room / "src/llama-dca.cpp").write_text("hand edit\n")
    with pytest.raises(SafetyError, match="hand edits in src/llama-dca.cpp"):
        render(cfg)
    r = render(cfg, force=True)
    assert r.written == ["src/llama-dca.cpp"]
    assert (room / "src/llama-dca.cpp").read_bytes() == first["src/llama-dca.cpp"]
    # a template change re-renders from the baseline, not on top of the last render
    (project.feature / "src/llama-dca.cpp.j2").write_text("v2 {{ marker }}\n")
    r = render(cfg)
    assert r.written == ["src/llama-dca.cpp"]
    assert (room / "src/llama-dca.cpp").read_text() == "v2 // opencoti F5 dca\n"
    # verify --fresh-render notices the committed patch is stale
    capture(cfg)
    (project.feature / "src/llama-dca.cpp.j2").write_text("v3\n")
    with pytest.raises(MismatchError, match="stale") as exc:
        verify(cfg, fresh_render=True)
    assert exc.value.exit_code == 3 and "src/llama-dca.cpp" in (exc.value.where or "")
    project.assert_source_untouched()


def test_round_trip_new_deleted_exec_no_final_newline_binary(project) -> None:
    cfg = project.config
    apply(cfg)
    room = cfg.room
    (room / "src/brand-new.h").write_text("#pragma once\n")          # new, untracked
    (room / "docs/notes.txt").write_text("still no final newline, changed")
    (room / "docs/added-no-newline.txt").write_text("x")
    os.unlink(room / "CMakeLists.txt")                                # deleted (was also rendered)
    os.chmod(room / "scripts/run.sh", 0o644)                          # exec bit removed
    os.chmod(room / "src/llama.cpp", 0o755)                           # exec bit added
    (room / "data/blob.bin").write_bytes(bytes(range(255, -1, -1)) * 4)  # binary change
    (room / "build").mkdir()
    (room / "build/out.o").write_bytes(b"\0ignored")                  # ignored: not captured
    cap = capture(cfg)
    text = cap.path.read_bytes()
    assert b"deleted file mode 100644\n" in text
    assert b"old mode 100755\nnew mode 100644\n" in text
    assert b"old mode 100644\nnew mode 100755\n" in text
    assert b"\\ No newline at end of file\n" in text
    assert b"GIT binary patch\n" in text
    assert b"build/out.o" not in text
    v = verify(cfg)
    assert v.forward_tree == cap.tree and v.reverse_tree == v.baseline_tree
    # the patch also applies with plain git apply to a fresh checkout of the baseline
    other = project.tmp / "other"
    sh(["git", "clone", "-q", str(room), str(other)], project.tmp)
    sh(["git", "checkout", "-q", BASELINE_TAG], other)
    sh(["git", "apply", "--index", str(cap.path)], other)
    tree = sh(["git", "write-tree"], other).stdout.decode().strip()
    assert tree == cap.tree
    # verify names the first differing file when the room moved on after the capture
    (room / "src/brand-new.h").write_text("#pragma twice\n")
    edited = project.tmp / "edited.patch"
    edited.write_bytes(text.replace(b"+#pragma once", b"+#pragma thrice"))
    with pytest.raises(MismatchError) as exc:
        verify(cfg, edited)
    assert "src/brand-new.h" in (exc.value.where or "")
    project.assert_source_untouched()


def test_capture_is_deterministic_under_hostile_git_config(project, isolated: Path) -> None:
    cfg_a = project.write_config(name="room-a")
    apply(cfg_a)
    (cfg_a.room / "src/extra.c").write_text("int extra;\n")
    cap_a = capture(cfg_a, project.tmp / "a.patch")
    (isolated / ".gitconfig").write_text(
        "[core]\n\tabbrev = 12\n[diff]\n\tnoprefix = true\n\tcontext = 5\n\tmnemonicPrefix = true\n"
        "\trenames = copies\n\talgorithm = patience\n[apply]\n\twhitespace = fix\n"
        "[color]\n\tui = always\n[user]\n\tname = Someone Else\n")
    cfg_b = project.write_config(name="room-b")
    apply(cfg_b)
    (cfg_b.room / "src/extra.c").write_text("int extra;\n")
    cap_b = capture(cfg_b, project.tmp / "b.patch")
    assert cap_a.path.read_bytes() == cap_b.path.read_bytes()
    head_a = sh(["git", "rev-parse", "HEAD"], cfg_a.room).stdout
    head_b = sh(["git", "rev-parse", "HEAD"], cfg_b.room).stdout
    assert head_a == head_b  # fixed identity and dates: same commit ids
    verify(cfg_b, cap_b.path)
    # the room's own index was never touched by capture
    assert "src/extra.c" not in sh(["git", "ls-files"], cfg_b.room).stdout.decode()


def test_status_reports_progress(project) -> None:
    st = status(project.config)
    assert not st.room_exists and st.patch_state == "missing"
    apply(project.config)
    st = status(project.config)
    assert st.phase == "applied" and st.patch_state == "missing" and st.rendered
    capture(project.config)
    (project.config.room / "src/llama.cpp").write_text("changed\n")
    st = status(project.config)
    assert st.patch_state == "stale" and st.dirty == ["src/llama.cpp"]


def test_llama_cpp_dir_prefixes_paths(project) -> None:
    """With llama_cpp_dir llama.cpp (llamafile's layout) the templates address paths under it and
    the captured patch's paths start with llama.cpp/."""
    from .helpers import git_init, snapshot, source_files

    sup = project.tmp / "llamafile"
    git_init(sup, {"Makefile": "all:\n", **{f"llama.cpp/{k}": v for k, v in source_files().items()}})
    project.source = sup
    project.before = snapshot(sup)
    cfg = project.write_config(source=f"git: {sup}", llama_cpp_dir="llama.cpp")
    apply(cfg)
    assert (cfg.room / "llama.cpp/src/llama-dca.cpp").is_file()
    project.assert_round_trip(cfg, "llama.cpp/")


def test_gnu_patch_available() -> None:
    assert subprocess.run(["patch", "--version"], capture_output=True, check=False).returncode == 0


def test_verify_gnu_patch(project) -> None:
    cfg = project.config
    apply(cfg)
    capture(cfg)
    res = verify(cfg, gnu=True)  # text files, an exec-bit new file: GNU patch agrees with git apply
    assert res.gnu_patch
    (cfg.room / "data/blob.bin").write_bytes(b"\0\1\2")
    capture(cfg)
    with pytest.raises(MismatchError, match="GNU patch"):
        verify(cfg, gnu=True)


def test_verify_names_the_first_file_that_differs_from_the_work_tree(project) -> None:
    """A patch that is not the last capture is checked against the room's work tree: forward-applied to the
    baseline it must give that tree, and the error names the first file that differs."""
    _series(project)
    cfg = project.config
    apply(cfg)
    capture(cfg)
    replace_line(cfg.room / "src/llama-dca.cpp", "int dca_chunk = 8192;", "int dca_chunk = 4096;")
    capture(cfg, project.tmp / "other.patch")  # the last capture is now another patch
    with pytest.raises(MismatchError) as exc:
        verify(cfg)
    err = exc.value
    assert err.message == "forward-applying 0078-dca.patch to the baseline does not give the work tree tree"
    assert err.where == "first differing file: src/llama-dca.cpp"
    assert (err.details or "").startswith("forward ") and " != expected " in (err.details or "")
    assert err.hint == "`dcaforge capture`, then `dcaforge verify`"
    assert verify(cfg, project.tmp / "other.patch").expected_from == "capture"
