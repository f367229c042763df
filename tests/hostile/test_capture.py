"""Capture writes only what is whole: never from a room that is not "series applied and feature
rendered", never an empty patch, never over a patch with an empty one, never into a git
directory or the source checkout; OS errors (EACCES, ENOSPC, EFBIG, EISDIR, EROFS) are clear errors
and leave every file as it was (the patch and the bookkeeping are written all or nothing)."""

from __future__ import annotations

import contextlib
import os
import resource
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.core.helpers import ugit

from .conftest import Arena


def _captured(arena: Arena) -> bytes:
    arena.applied()
    arena.run("capture", code=0, changed=[arena.patches / "0078-dca.patch"])
    return (arena.patches / "0078-dca.patch").read_bytes()


def test_render_that_stopped_keeps_the_patch(arena: Arena) -> None:
    """Issue 12, point 6: capture after a render that stopped overwrote the patch with 0 bytes."""
    old = _captured(arena)
    manifest = arena.feature / "manifest.yaml"
    manifest.write_text(manifest.read_text().replace("'(?m)^add_library'", "'(?m)^add_nothing'"))
    arena.run("apply", code=3, what="anchor matches nowhere")
    arena.run("capture", code=1, what="the last render stopped", next="render --check")
    assert (arena.patches / "0078-dca.patch").read_bytes() == old
    out = arena.run("status", code=0)
    assert "(the last render stopped:" in out.output and out.output.rstrip().endswith("(stale)"), out.output


def test_room_without_the_feature_rendered(arena: Arena) -> None:
    arena.run("apply", "--no-render", code=0)
    arena.run("capture", code=1, what="the feature is not rendered", next="dcaforge render")
    assert not (arena.patches / "0078-dca.patch").exists()


def test_room_whose_series_stopped(arena: Arena) -> None:
    arena.patch("0001-bad.patch", "--- a/src/llama.cpp\n+++ b/src/llama.cpp\n@@ -1 +1 @@\n-int nope;\n+int nope2;\n")
    arena.run("apply", code=3)
    arena.run("capture", code=1, what="the series stopped at 0001-bad.patch", next="dcaforge apply --continue")


def test_no_empty_patch_and_never_over_a_patch(arena: Arena) -> None:
    old = _captured(arena)
    arena.manifest("files: []\nedits: []\n")
    arena.run("apply", code=0)
    arena.run("capture", code=1, what="an empty patch is never written", next="dcaforge render")
    assert (arena.patches / "0078-dca.patch").read_bytes() == old
    arena.run("capture", "-o", str(arena.work / "empty.patch"), code=1, what="never written")
    assert not (arena.work / "empty.patch").exists()


def test_output_onto_a_folder(arena: Arena) -> None:
    arena.applied()
    (arena.work / "out").mkdir()
    arena.run("capture", "-o", str(arena.work / "out"), code=1, what="it is a folder", next="give a file name")


@pytest.mark.parametrize("where", ["source-dotgit", "source-config", "other-repo-config", "bare-repo", "source-tree",
                                   "room", "symlink-to-config"])
def test_output_into_git_dirs_and_user_trees(arena: Arena, where: str) -> None:
    arena.applied()
    other = arena.tmp / "other"
    ugit(arena.tmp, "init", "-q", str(other))
    bare = arena.tmp / "bare.git"
    ugit(arena.tmp, "init", "-q", "--bare", str(bare))
    link = arena.work / "innocent.patch"
    os.symlink(arena.source / ".git" / "config", link)
    dest = {"source-dotgit": arena.source / ".git" / "x.patch", "source-config": arena.source / ".git" / "config",
            "other-repo-config": other / ".git" / "config", "bare-repo": bare / "hooks" / "x.patch",
            "source-tree": arena.source / "x.patch", "room": arena.room / "x.patch", "symlink-to-config": link}[where]
    arena.run("capture", "-o", str(dest), code=1, what="inside the", next="outside")
    assert not (arena.room / "x.patch").exists()


def test_output_into_a_linked_worktrees_common_dir(arena: Arena) -> None:
    linked = arena.tmp / "linked"
    ugit(arena.source, "worktree", "add", "-q", str(linked), "HEAD")
    arena.write_config(source=f"git: {linked}\nref: HEAD")
    arena.applied()
    for dest in (arena.source / ".git" / "worktrees" / "x.patch", arena.source / "x.patch",
                 arena.source / ".git" / "worktrees" / "linked" / "x.patch"):
        arena.run("capture", "-o", str(dest), code=1, what="inside the")


@contextlib.contextmanager
def unwritable_folder(tmp: Path) -> Iterator[tuple[Path, str]]:
    """A folder nothing can be written into, for real: a read-only tmpfs when we may mount (EROFS),
    a mode-0555 folder when we are not root (EACCES), else /sys (EACCES even for root)."""
    target = tmp / "ro"
    target.mkdir()
    if os.geteuid() == 0 and subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(target)],
                                            capture_output=True, check=False).returncode == 0:
        try:
            yield target, "read-only"
        finally:
            subprocess.run(["umount", str(target)], check=False)
        return
    if os.geteuid() != 0:
        os.chmod(target, 0o555)
        try:
            yield target, "permission denied"
        finally:
            os.chmod(target, 0o755)
        return
    yield Path("/sys"), "permission denied"


def test_output_into_an_unwritable_folder(arena: Arena) -> None:
    arena.applied()
    with unwritable_folder(arena.tmp) as (folder, reason):
        arena.run("capture", "-o", str(folder / "0078-dca.patch"), code=1, what=reason, next="then run the same command")
        assert not (folder / "0078-dca.patch").exists()


def test_bookkeeping_that_cannot_be_written_leaves_the_patch_unwritten(arena: Arena) -> None:
    """All or nothing: the patch's temp file is written, the bookkeeping's fails, nothing is renamed."""
    arena.applied()
    with unwritable_folder(arena.tmp) as (folder, reason):
        if folder == Path("/sys"):
            pytest.skip("no folder to hold a readable, unwritable README")  # pragma: no cover
        arena.config_path.write_text(arena.config_path.read_text() + textwrap.dedent(f"""\
            bookkeeping:
              series_readme:
                file: {folder}/README.md
            """))
        if reason == "read-only":
            subprocess.run(["mount", "-o", "remount,rw", str(folder)], check=True)
            (folder / "README.md").write_text("## Current series\n\n| patch | what |\n|---|---|\n")
            subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)
        arena.skip.append(folder)
        arena.run("capture", code=1, what=reason)
        assert not (arena.patches / "0078-dca.patch").exists()
        assert not [p for p in arena.patches.iterdir() if p.name.endswith(".tmp")]


def test_full_disk(arena: Arena) -> None:
    """ENOSPC for real: a 64 KiB tmpfs when we may mount one; where we may not (not root), a
    file-size limit (`ulimit -f`, EFBIG) is the full disk: the same write fails the same way."""
    (arena.feature / "src" / "llama-dca.cpp.j2").write_text(
        "{% for i in range(3000) %}// a large rendered line {{ i }} of the feature\n{% endfor %}")
    arena.applied()
    small = arena.tmp / "small"
    small.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(small)],
                                           capture_output=True, check=False).returncode != 0:
        _capture_with_file_size_limit(arena, small / "0078-dca.patch")  # pragma: no cover (root here)
        return
    try:
        (small / "filler").write_bytes(b"x" * 60 * 1024)  # the disk is now (nearly) full
        arena.skip.append(small)
        arena.run("capture", "-o", str(small / "0078-dca.patch"), code=1, what="the disk is full", next="free some space")
        assert sorted(p.name for p in small.iterdir()) == ["filler"]
    finally:
        subprocess.run(["umount", str(small)], check=False)


def _capture_with_file_size_limit(arena: Arena, dest: Path) -> None:
    arena.run("capture", "-o", str(arena.tmp / "first.patch"), code=0, changed=[arena.tmp / "first.patch"])
    limit = 32 * 1024
    assert (arena.tmp / "first.patch").stat().st_size > 2 * limit  # the objects exist: only the patch is big

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    before = arena.snapshot()
    proc = subprocess.run([sys.executable, "-m", "dcaforge.cli", "capture", "-c", str(arena.config_path), "-o", str(dest)],
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}, capture_output=True,
                          preexec_fn=small_files, check=False)
    out = (proc.stdout + proc.stderr).decode()
    assert proc.returncode == 1, out
    assert "larger than this process may write" in out and "nothing was written" in out and "next:" in out, out
    assert arena.snapshot() == before
    assert not arena.ran.exists()


def test_file_size_limit(arena: Arena) -> None:
    """`ulimit -f`: the patch is larger than the process may write (EFBIG, as a full quota is)."""
    (arena.feature / "src" / "llama-dca.cpp.j2").write_text(
        "{% for i in range(3000) %}// a large rendered line {{ i }} of the feature\n{% endfor %}")
    arena.applied()
    _capture_with_file_size_limit(arena, arena.patches / "0078-dca.patch")


def test_capture_twice_does_not_rewrite(arena: Arena) -> None:
    _captured(arena)
    out = arena.run("capture", code=0)
    assert "unchanged" in out.output


@pytest.mark.parametrize("gnu", [False, True])
def test_verify_of_a_hostile_patch_file(arena: Arena, gnu: bool) -> None:
    _captured(arena)
    hostile = arena.work / "hostile.patch"
    hostile.write_text("--- a/../../canary/keep.txt\n+++ b/../../canary/keep.txt\n@@ -1 +1 @@\n-keep me\n+gone\n")
    arena.run("verify", str(hostile), *(["--gnu"] if gnu else []), code=1, what="leaves the tree", where="hostile.patch:1")
