"""Hostile series patches: every path a patch names (git or GNU format, renames, copies, symlinks,
modes, quoted names, Index: lines) is confined to the clean room's tree before anything is applied;
formats neither tool should be left to guess at (ed scripts, normal and context diffs, hunks cut
short) are refused; empty and repeated patches are refused naming them; huge ones are not read.
A few well-formed patches with odd names are the controls: they apply."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from dcaforge.git import config_problems

from .conftest import Arena

FSMON = "[core]\n\trepositoryformatversion = 0\n"


def git_new(path: str, body: str = "x\n", mode: str = "100644", header_path: str | None = None) -> str:
    hp = header_path or path
    lines = body.splitlines(keepends=True)
    return (f"diff --git a/{hp} b/{hp}\nnew file mode {mode}\nindex 0000000..1111111\n--- /dev/null\n+++ b/{hp}\n"
            f"@@ -0,0 +1,{len(lines)} @@\n" + "".join("+" + ln for ln in lines))


def gnu_new(path: str, body: str = "x\n") -> str:
    lines = body.splitlines(keepends=True)
    return f"--- /dev/null\n+++ b/{path}\n@@ -0,0 +1,{len(lines)} @@\n" + "".join("+" + ln for ln in lines)


def gnu_config(path: str = ".git/config", payload: str = "touch RAN") -> str:
    """What issue 12 found: a plain diff -u that gives the room's git a command to run."""
    return (f"--- a/{path}\n+++ b/{path}\n@@ -1,2 +1,3 @@\n [core]\n \trepositoryformatversion = 0\n"
            f"+\tfsmonitor = {payload}\n")


def git_config(path: str = ".git/config", payload: str = "touch RAN") -> str:
    return f"diff --git a/{path} b/{path}\nindex 1111111..2222222 100644\n" + gnu_config(path, payload)


def rename(src: str, dst: str, kind: str = "rename") -> str:
    return f"diff --git a/{src} b/{dst}\nsimilarity index 100%\n{kind} from {src}\n{kind} to {dst}\n"


def symlink(path: str, target: str) -> str:
    return (f"diff --git a/{path} b/{path}\nnew file mode 120000\nindex 0000000..1111111\n--- /dev/null\n+++ b/{path}\n"
            f"@@ -0,0 +1 @@\n+{target}\n\\ No newline at end of file\n")


def llama_edit(old: str = "int line_005 = 5;", new: str = "int line_005 = 55;") -> str:
    return (f"diff --git a/src/llama.cpp b/src/llama.cpp\n--- a/src/llama.cpp\n+++ b/src/llama.cpp\n"
            f"@@ -4,3 +4,3 @@\n int line_004 = 4;\n-{old}\n+{new}\n int line_006 = 6;\n")


# (id, the patch (a function of the arena), what the error says)
REFUSED: list[tuple[str, Callable[[Arena], str], str]] = [
    ("gnu-dotgit-config", lambda a: gnu_config(payload=a.payload), "is under .git/"),
    ("git-dotgit-config", lambda a: git_config(payload=a.payload), "is under .git/"),
    ("gnu-hook", lambda a: gnu_new(".git/hooks/post-commit", f"#!/bin/sh\n{a.payload}\n"), "is under .git/"),
    ("git-hook", lambda a: git_new(".git/hooks/pre-commit", f"#!/bin/sh\n{a.payload}\n", "100755"), "is under .git/"),
    ("gnu-DOTGIT-upper", lambda a: gnu_config(".GIT/config", a.payload), "is under .git/"),
    ("gnu-dotgit-trailing-dot", lambda a: gnu_config(".git./config", a.payload), "is under .git/"),
    ("gnu-dotgit-trailing-space", lambda a: gnu_new(".git /hooks/x", a.payload), "is under .git/"),
    ("gnu-dotgit-zero-width", lambda a: gnu_config(".g\u200cit/config", a.payload), "is under .git/"),
    ("gnu-ntfs-short-name", lambda a: gnu_new("GIT~1/hooks/x", a.payload), "is under .git/"),
    ("gnu-dotdot-new", lambda a: gnu_new("../outside.txt"), "leaves the tree"),
    ("gnu-dotdot-canary", lambda a: "--- a/../../canary/secret.txt\n+++ b/../../canary/secret.txt\n@@ -1 +1 @@\n"
                                    "-the user's secret\n+stolen\n", "leaves the tree"),
    ("git-dotdot", lambda a: git_new("../../canary/new.txt"), "leaves the tree"),
    ("gnu-middle-dotdot", lambda a: gnu_new("src/../../x.txt"), "leaves the tree"),
    ("gnu-absolute", lambda a: f"--- {a.canary}/secret.txt\n+++ {a.canary}/secret.txt\n@@ -1 +1 @@\n"
                               "-the user's secret\n+stolen\n", "is an absolute path"),
    ("gnu-double-slash-dotgit", lambda a: gnu_config("/.git/config", a.payload).replace("--- a//", "--- a//"),
     "is under .git/"),
    ("git-quoted-octal-dotgit", lambda a: git_config(payload=a.payload).replace("a/.git/config", '"a/\\056git/config"')
     .replace("b/.git/config", '"b/\\056git/config"'), "is under .git/"),
    ("git-quoted-dotgit", lambda a: git_config(payload=a.payload).replace("a/.git/config", '"a/.git/config"')
     .replace("b/.git/config", '"b/.git/config"'), "is under .git/"),
    ("git-rename-to-dotgit", lambda a: rename("CMakeLists.txt", ".git/config"), "is under .git/"),
    ("git-rename-from-outside", lambda a: rename("../../canary/secret.txt", "stolen.txt"), "leaves the tree"),
    ("git-copy-from-outside", lambda a: rename("../../canary/secret.txt", "stolen.txt", "copy"), "leaves the tree"),
    ("git-copy-to-hook", lambda a: rename("scripts/run.sh", ".git/hooks/post-checkout", "copy"), "is under .git/"),
    ("git-rename-old-syntax", lambda a: rename("CMakeLists.txt", ".git/HEAD").replace("rename from", "rename old")
     .replace("rename to", "rename new"), "is under .git/"),
    ("gnu-index-line", lambda a: f"Index: .git/config\n{gnu_config('x.txt', a.payload)}", "is under .git/"),
    ("git-symlink-absolute", lambda a: symlink("etc", "/etc"), "points at the absolute path"),
    ("git-symlink-out", lambda a: symlink("out", "../../canary"), "points outside the tree"),
    ("git-symlink-dotgit", lambda a: symlink("g", ".git"), "points into .git"),
    ("git-symlink-deep-out", lambda a: symlink("src/deep/link", "../../../x"), "points outside the tree"),
    ("git-write-through-new-symlink", lambda a: symlink("lnk", "src") + git_new("lnk/evil.c"),
     "a symlink the same patch makes"),
    ("git-gitlink", lambda a: "diff --git a/sub b/sub\nnew file mode 160000\nindex 0000000..1111111\n--- /dev/null\n"
                              "+++ b/sub\n@@ -0,0 +1 @@\n+Subproject commit 1111111111111111111111111111111111111111\n",
     "a submodule (gitlink)"),
    ("git-bogus-mode", lambda a: "diff --git a/CMakeLists.txt b/CMakeLists.txt\nold mode 100644\nnew mode 104755\n",
     "gives mode 104755"),
    ("git-mode-on-dotgit", lambda a: "diff --git a/.git/HEAD b/.git/HEAD\nold mode 100644\nnew mode 100755\n",
     "is under .git/"),
    ("gnu-delete-outside", lambda a: "--- a/../../canary/keep.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-keep me\n",
     "leaves the tree"),
    ("git-delete-dotgit", lambda a: "diff --git a/.git/HEAD b/.git/HEAD\ndeleted file mode 100644\nindex 1111111..0000000\n"
                                    "--- a/.git/HEAD\n+++ /dev/null\n@@ -1 +0,0 @@\n-ref: refs/heads/main\n",
     "is under .git/"),
    ("gnu-old-ok-new-dotgit", lambda a: "--- a/src/llama.cpp\n+++ b/.git/config\n@@ -1 +1,2 @@\n [core]\n"
                                        f"+\tfsmonitor = {a.payload}\n", "is under .git/"),
    ("git-binary-dotgit", lambda a: "diff --git a/.git/index b/.git/index\nindex 1111111..2222222 100644\n"
                                    "GIT binary patch\nliteral 3\nKcmZ?wc>n+%00961\n\nliteral 0\nHcmV?d00001\n\n",
     "is under .git/"),
    ("git-crlf-dotgit", lambda a: git_config(payload=a.payload).replace("\n", "\r\n"), "is under .git/"),
    ("gnu-crlf-dotdot", lambda a: gnu_new("../x.txt").replace("\n", "\r\n"), "leaves the tree"),
    ("ed-script", lambda a: f"1a\n!{a.payload}\n.\nw\nq\n", "is empty"),
    ("normal-diff", lambda a: "Index: src/llama.cpp\n5c5\n< int line_005 = 5;\n---\n> int line_005 = 0;\n",
     "only unified diffs are accepted"),
    ("ed-after-header", lambda a: f"--- a/src/llama.cpp\n+++ b/src/llama.cpp\n5c\n!{a.payload}\n.\n",
     "only unified diffs are accepted"),
    ("context-diff", lambda a: "*** a/src/llama.cpp\n--- b/src/llama.cpp\n***************\n*** 5 ****\n"
                               "! int line_005 = 5;\n--- 5 ----\n! int line_005 = 0;\n", "only unified diffs are accepted"),
    ("hunk-cut-short-hides-header", lambda a: "--- a/src/llama.cpp\n+++ b/src/llama.cpp\n@@ -4,9 +4,9 @@\n"
                                              " int line_004 = 4;\n" + gnu_config(payload=a.payload),
     "is cut short"),
    ("hunk-cut-short", lambda a: "--- a/src/llama.cpp\n+++ b/src/llama.cpp\n@@ -4,9 +4,9 @@\n int line_004 = 4;\n",
     "is cut short"),
    ("hunk-without-header", lambda a: "@@ -1 +1 @@\n-a\n+b\n", "a hunk with no file header"),
    ("empty", lambda a: "", "is empty: it changes no file"),
    ("whitespace-only", lambda a: "\n\n   \n", "is empty: it changes no file"),
    ("message-only", lambda a: "From 1234 Mon Sep 17 00:00:00 2001\nSubject: [PATCH] nothing\n\nno diff here\n",
     "is empty: it changes no file"),
    ("headers-without-hunks", lambda a: "--- a/src/llama.cpp\n+++ b/src/llama.cpp\n", "is empty: it changes no file"),
    ("nul-in-name", lambda a: gnu_new("src/a\0b.c"), "holds a NUL byte"),
    ("git-mode-only-dotgit-header", lambda a: "diff --git a/.git/config b/.git/config\nold mode 100644\nnew mode 100755\n",
     "is under .git/"),
    ("git-dotgit-submodule-dir", lambda a: git_new("llama.cpp/.git/config"), "is under .git/"),
    ("git-header-names-disagree", lambda a: "diff --git a/src/llama.cpp b/.git/config\n--- a/src/llama.cpp\n"
                                            "+++ b/src/llama.cpp\n@@ -1 +1 @@\n-int line_001 = 1;\n+int line_001 = 0;\n",
     "is under .git/"),
]


@pytest.mark.parametrize(("make", "what"), [pytest.param(m, w, id=i) for i, m, w in REFUSED])
def test_refused_before_anything_is_applied(arena: Arena, make: Callable[[Arena], str], what: str) -> None:
    arena.patch("0001-ok.patch", llama_edit())
    bad = arena.patch("0002-hostile.patch", make(arena).replace("touch RAN", arena.payload))
    arena.run("apply", code=1, what=what, where=str(bad), next="dcaforge apply")
    assert not arena.room.exists()  # refused before the room was made
    arena.assert_source_untouched()


def test_symlink_committed_in_the_source_is_not_a_way_out_gnu(arena: Arena) -> None:
    arena.symlink_in_source("link", str(arena.canary))
    arena.patch("0001-through-link.patch", "--- a/link/secret.txt\n+++ b/link/secret.txt\n@@ -1 +1 @@\n"
                                         "-the user's secret\n+stolen\n")
    arena.run("apply", code=1, what="through the symlink link", where="0001-through-link.patch",
              next="dcaforge apply --continue")
    assert config_problems(arena.room / ".git" / "config") == []


def test_symlink_committed_in_the_source_is_not_a_way_out_git(arena: Arena) -> None:
    arena.symlink_in_source("link", str(arena.canary))
    arena.patch("0001-through-link.patch", git_new("link/new.txt"))
    arena.run("apply", code=1, what="outside the clean room", next="dcaforge apply --continue")


def test_relative_symlink_in_the_source_that_climbs_out(arena: Arena) -> None:
    arena.symlink_in_source("docs/up", "../../../canary")  # room/docs/up -> <tmp>/canary
    arena.patch("0001-up.patch", gnu_new("docs/up/planted.txt"))
    arena.run("apply", code=1, what="outside the clean room")
    assert not (arena.canary / "planted.txt").exists()


def test_repeated_patch_is_refused_naming_both(arena: Arena) -> None:
    arena.patch("0001-a.patch", llama_edit())
    arena.patch("0002-b.patch", "From 1 Mon Sep 17 00:00:00 2001\nSubject: [PATCH] again\n\n" + llama_edit())
    arena.run("apply", code=1, what="patches 0001-a.patch and 0002-b.patch make the same change",
              where="0002-b.patch", next="keep one of them")


def test_identical_files_twice_are_refused(arena: Arena) -> None:
    arena.patch("0001-a.patch", llama_edit())
    arena.patch("0005-a-copy.patch", llama_edit())
    arena.run("apply", code=1, what="0001-a.patch and 0005-a-copy.patch make the same change")


def test_huge_patch_is_not_read(arena: Arena) -> None:
    p = arena.patches / "0001-huge.patch"
    with open(p, "wb") as fh:
        fh.truncate(300 * 1024 * 1024)  # sparse: instant, and nothing is read
    arena.run("apply", code=1, what="more than dcaforge reads", where=str(p), next="split it")


def test_series_file_cannot_name_a_patch_outside(arena: Arena) -> None:
    (arena.canary / "evil.patch").write_text(gnu_config(payload=arena.payload))
    (arena.patches / "series").write_text("../../canary/evil.patch\n")
    arena.write_config(extra_series="file: series")
    arena.run("apply", code=1, what="leaves the tree", where="series:1")


def test_series_file_that_is_not_utf8(arena: Arena) -> None:
    (arena.patches / "series").write_bytes(b"0001-a.patch\n\xff\xfe.patch\n")
    arena.write_config(extra_series="file: series")
    arena.run("apply", code=1, what="not UTF-8", where="series:2")


def test_patch_that_does_not_fit_exits_3(arena: Arena) -> None:
    arena.patch("0001-a.patch", llama_edit(old="int line_005 = 500;"))
    arena.run("apply", code=3, what="0001-a.patch does not apply", where="hunk #1", next="dcaforge apply --continue")


def test_long_name_is_an_error_not_a_traceback(arena: Arena) -> None:
    arena.patch("0001-long.patch", gnu_new("src/" + "n" * 300 + ".c"))
    out = arena.run("apply", code=3, what="does not apply")
    assert "Traceback" not in out.output


# --- controls: hostile-looking but well-formed patches apply --------------------------------

@pytest.mark.parametrize(("name", "patch", "made"), [
    pytest.param("0001-spaces.patch", git_new("src/a file with spaces.c"), "src/a file with spaces.c", id="spaces"),
    pytest.param("0001-unicode.patch", git_new("src/ünïcödé.c"), "src/ünïcödé.c", id="unicode"),
    pytest.param("0001-gnu-new.patch", gnu_new("src/gnu-new.c"), "src/gnu-new.c", id="gnu-new-file"),
    pytest.param("0001-rename.patch", rename("docs/notes.txt", "docs/moved.txt"), "docs/moved.txt", id="rename-inside"),
    pytest.param("0001-link.patch", symlink("src/cmake-link", "../CMakeLists.txt"), "src/cmake-link", id="symlink-inside"),
    pytest.param("0001-gitfile-name.patch", gnu_new("src/.gitignore2"), "src/.gitignore2", id="dotgit-prefix-name"),
    pytest.param("0001-attributes.patch", gnu_new(".gitattributes", "* filter=evil diff=evil merge=evil\n"),
                 ".gitattributes", id="attributes-naming-undefined-drivers"),
])
def test_well_formed_patches_apply(arena: Arena, name: str, patch: str, made: str) -> None:
    arena.patch(name, patch)
    arena.run("apply", code=0)
    assert os.path.lexists(arena.room / made)
    # and the feature captures and round-trips on top of it
    arena.run("capture", code=0, changed=[arena.patches / "0078-dca.patch"])
    arena.run("verify", code=0)


def test_files_named_like_revisions_do_not_confuse_dcaforge(arena: Arena) -> None:
    """Found by the fuzzer: a series that adds files named HEAD (or like dcaforge's tags) made
    `git reset --hard HEAD` ambiguous; every revision dcaforge passes is now ended by `--`."""
    arena.patch("0001-names.patch", gnu_new("HEAD") + gnu_new("dcaforge/start") + gnu_new("dcaforge/baseline"))
    arena.patch("0002-misfit.patch", llama_edit(old="int line_005 = 500;"))
    arena.run("apply", code=3, what="0002-misfit.patch does not apply", next="dcaforge apply --continue")
    arena.patch("0002-misfit.patch", llama_edit())
    arena.run("apply", "--continue", code=0)
    assert (arena.room / "HEAD").read_text() == "x\n"
    arena.run("capture", code=0, changed=[arena.patches / "0078-dca.patch"])
    arena.run("verify", "--fresh-render", code=0)
