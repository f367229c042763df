"""Hostile or unusual source trees: dirty checkouts, submodules with work in progress, linked
worktrees, bare and shallow repositories, a checkout whose own git config would run commands,
symlinks that point out, .gitmodules with command URLs."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.core.helpers import USER_GIT, git_init, sh, snapshot, ugit

from .conftest import Arena


def _with_submodule(arena: Arena) -> str:
    lib = arena.tmp / "lib-upstream"
    git_init(lib, {"lib.c": "int lib = 1;\n", "lib.h": "int lib(void);\n"})
    sh([*USER_GIT, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(lib), "vendor/lib"], arena.source)
    sh([*USER_GIT, "commit", "-q", "-m", "lib as a submodule"], arena.source)
    arena.before = snapshot(arena.source)
    return "vendor/lib"


def test_dirty_source_is_listed_not_copied_then_copied_on_request(arena: Arena) -> None:
    (arena.source / "src" / "llama.cpp").write_text("int wip;\n")
    (arena.source / "untracked.c").write_text("new\n")
    os.unlink(arena.source / "docs" / "notes.txt")
    arena.before = snapshot(arena.source)
    out = arena.run("apply", code=0, what="left behind")
    assert "untracked.c" in out.output and not (arena.room / "untracked.c").exists()
    out = arena.run("status", code=0, what="source wip")
    arena.run("apply", "--fresh", "--include-wip", code=0, what="included uncommitted files")
    assert (arena.room / "untracked.c").read_text() == "new\n" and not (arena.room / "docs" / "notes.txt").exists()
    arena.assert_source_untouched()


def test_submodule_wip_is_listed_and_copied(arena: Arena) -> None:
    sub = _with_submodule(arena)
    arena.write_config(source=f"git: {arena.source}\nref: main\nsubmodules: true")
    (arena.source / sub / "lib.c").write_text("int lib = 2; // wip\n")
    (arena.source / sub / "new.c").write_text("int added;\n")
    arena.before = snapshot(arena.source)
    out = arena.run("status", code=0, what="submodule wip")
    assert "vendor/lib/lib.c" in out.output and "vendor/lib/new.c" in out.output
    out = arena.run("apply", code=0, what="the source's submodule vendor/lib has uncommitted files")
    assert (arena.room / sub / "lib.c").read_text() == "int lib = 1;\n"
    arena.run("apply", "--fresh", "--include-wip", code=0, what="vendor/lib/lib.c")
    assert (arena.room / sub / "lib.c").read_text() == "int lib = 2; // wip\n"
    assert (arena.room / sub / "new.c").read_text() == "int added;\n"
    arena.assert_source_untouched()


def test_submodule_wip_without_submodules_in_the_room(arena: Arena) -> None:
    sub = _with_submodule(arena)
    (arena.source / sub / "lib.c").write_text("int lib = 2; // wip\n")
    arena.before = snapshot(arena.source)
    out = arena.run("apply", "--include-wip", code=0, what="left out the uncommitted files of submodule vendor/lib")
    assert "set source.submodules" in out.output
    assert not (arena.room / sub / "lib.c").exists()


def test_linked_worktree_as_the_source(arena: Arena) -> None:
    linked = arena.tmp / "linked"
    ugit(arena.source, "worktree", "add", "-q", str(linked), "-b", "side")
    (linked / "wip.c").write_text("wip\n")
    arena.write_config(source=f"git: {linked}\nref: side")
    out = arena.run("apply", code=0, what="left behind")
    assert "wip.c" in out.output
    arena.run("capture", code=0, changed=[arena.patches / "0078-dca.patch"])


def test_bare_repository_path_says_what_to_do(arena: Arena) -> None:
    bare = arena.tmp / "bare.git"
    sh(["git", "clone", "-q", "--bare", str(arena.source), str(bare)], arena.tmp)
    arena.write_config(source=f"git: {bare}\nref: main")
    arena.run("apply", code=1, what="is not a git checkout", next="file://")
    arena.write_config(source=f"git: file://{bare}\nref: main")
    arena.run("apply", code=0)


def test_shallow_clone_as_the_source(arena: Arena) -> None:
    shallow = arena.tmp / "shallow"
    sh(["git", "clone", "-q", "--depth", "1", f"file://{arena.source}", str(shallow)], arena.tmp)
    arena.write_config(source=f"git: {shallow}\nref: HEAD")
    arena.run("apply", code=0)
    assert (arena.room / "src" / "llama.cpp").is_file()


def test_source_whose_own_git_config_would_run_commands(arena: Arena) -> None:
    """The user's checkout is only read: its fsmonitor, filters and hooks never run."""
    ugit(arena.source, "config", "core.fsmonitor", arena.payload)
    ugit(arena.source, "config", "filter.evil.clean", arena.payload)
    ugit(arena.source, "config", "filter.evil.smudge", arena.payload)
    ugit(arena.source, "config", "filter.evil.process", arena.payload)
    (arena.source / ".git" / "info").mkdir(exist_ok=True)
    (arena.source / ".git" / "info" / "attributes").write_text("* filter=evil\n")
    hooks = arena.source / ".git" / "hooks"
    for name in ("post-checkout", "post-index-change", "reference-transaction"):
        (hooks / name).write_text(f"#!/bin/sh\n{arena.payload}\n")
        (hooks / name).chmod(0o755)
    os.utime(arena.source / "src" / "llama.cpp", (1, 1))  # stat-dirty: git status would call the clean filter
    # (no git of the test's own runs in that checkout from here on: it would run them; every arena.run hashes its bytes)
    arena.run("apply", code=0)
    arena.run("status", code=0)
    arena.run("capture", code=0, changed=[arena.patches / "0078-dca.patch"])


def test_wip_under_a_folder_that_is_a_symlink_out_in_head(arena: Arena) -> None:
    arena.symlink_in_source("d", str(arena.canary))
    os.unlink(arena.source / "d")
    (arena.source / "d").mkdir()
    (arena.source / "d" / "secret.txt").write_text("planted\n")
    arena.before = snapshot(arena.source)
    arena.run("apply", "--include-wip", code=1, what="outside the clean room", next="--include-wip")
    assert (arena.canary / "secret.txt").read_text() == "the user's secret\n"


@pytest.mark.parametrize("url", ["ext::sh -c touch% {ran}", "-u{ran}"])
def test_gitmodules_with_command_urls(arena: Arena, url: str) -> None:
    sub = _with_submodule(arena)
    ugit(arena.source, "config", "-f", ".gitmodules", f"submodule.{sub}.url", url.format(ran=arena.ran))
    ugit(arena.source, "commit", "-q", "-am", "hostile url")
    shutil.rmtree(arena.source / ".git" / "modules")  # no local copy: the URL would be used
    arena.write_config(source=f"git: {arena.source}\nref: main\nsubmodules: true")
    arena.run("apply", code=1, what="")


def test_gitmodules_with_an_update_command(arena: Arena) -> None:
    sub = _with_submodule(arena)
    ugit(arena.source, "config", "-f", ".gitmodules", f"submodule.{sub}.update", f"!{arena.payload}")
    ugit(arena.source, "commit", "-q", "-am", "hostile update")
    arena.write_config(source=f"git: {arena.source}\nref: main\nsubmodules: true")
    arena.run("apply", code=1, what="invalid value for 'submodule.vendor/lib.update'", next="the clean room was not created")


def test_attributes_in_the_tree_name_undefined_drivers(arena: Arena) -> None:
    arena.commit_in_source({".gitattributes": "* filter=lfs diff=lfs merge=lfs -text\n*.c filter=evil\n"})
    arena.before = snapshot(arena.source)
    arena.run("apply", code=0)
    arena.run("capture", code=0, changed=[arena.patches / "0078-dca.patch"])
    arena.run("verify", "--fresh-render", "--gnu", code=0)


def test_gitmodules_with_a_plain_update_mode(arena: Arena) -> None:
    """`update = rebase` is git's own mode (copied into the room's config by `git submodule init`): allowed."""
    sub = _with_submodule(arena)
    ugit(arena.source, "config", "-f", ".gitmodules", f"submodule.{sub}.update", "rebase")
    ugit(arena.source, "config", "-f", ".gitmodules", f"submodule.{sub}.branch", "main")
    ugit(arena.source, "commit", "-q", "-am", "update mode")
    arena.before = snapshot(arena.source)
    arena.write_config(source=f"git: {arena.source}\nref: main\nsubmodules: true")
    arena.run("apply", code=0)
    assert (arena.room / sub / "lib.c").is_file()
