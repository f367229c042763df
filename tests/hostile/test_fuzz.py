"""Property-based fuzzing of series patches (Hypothesis): patches built from hostile parts (paths
with .., .git in its spellings, absolute paths, quoted names, symlinks, modes, renames, copies,
binary, CRLF, wrong hunk counts, stray lines) go through what ``dcaforge apply`` does with a patch
(:func:`check_series`, then :func:`apply_one` with git or GNU patch) on a real clean room. Whatever
the patch, either it is refused with an error that says what, where and what next (exit code 1 or
3), or it applies and every file it changed is a file of the room's tree; and never does a byte
change outside the room, a command run, or the room's git configuration, hooks or HEAD change.

The examples are derandomized (the same ones on every run), so the suite's count holds.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dcaforge.confine import path_problem
from dcaforge.errors import DcaforgeError
from dcaforge.git import config_problems, status_porcelain
from dcaforge.patch.discover import check_series
from dcaforge.patch.series import apply_one
from dcaforge.patchfile import load_patch
from dcaforge.room.cleanroom import Room

from .conftest import Arena, tree_hashes

SAFE = ["src", "x.c", "a b", "ünï", "models", "new.h", "link", "CMakeLists.txt", "llama.cpp", "hooks", "config", "HEAD"]
DANGER = ["..", ".", ".git", ".GIT", ".git.", "git~1", ".g\u200cit", "", "canary"]
EXISTING = ["src/llama.cpp", "CMakeLists.txt", "docs/notes.txt", "scripts/run.sh", "src/models/gemma4.cpp", "link"]
component = st.one_of(st.sampled_from(SAFE), st.sampled_from(SAFE), st.sampled_from(SAFE), st.sampled_from(DANGER))

paths = st.one_of(
    st.sampled_from(EXISTING),
    st.sampled_from(EXISTING + [".git/config", ".git/hooks/post-commit", "../canary/secret.txt", "../../canary/x"]),
    st.lists(component, min_size=1, max_size=4).map("/".join),
    st.lists(component, min_size=1, max_size=3).map(lambda c: "/" + "/".join(c)),
)


def quote(name: str) -> str:
    return '"' + "".join(f"\\{b:03o}" if b < 0x20 or b > 0x7E or b in (0x22, 0x5C) or b == 0x2E else chr(b)
                         for b in name.encode()) + '"'


plausible = st.one_of(st.sampled_from(EXISTING), st.lists(st.sampled_from(SAFE), min_size=1, max_size=3).map("/".join))


@st.composite
def names(draw: st.DrawFn, prefix: str, pool: st.SearchStrategy[str] = paths) -> str:
    p = draw(pool)
    if draw(st.booleans()) and draw(st.booleans()):
        return quote(f"{prefix}/{p}")
    return f"{prefix}/{p}" if not p.startswith("/") or draw(st.integers(0, 3)) else p


@st.composite
def hunk(draw: st.DrawFn) -> str:
    old = draw(st.lists(st.sampled_from(["int line_005 = 5;", "int line_004 = 4;", "[core]", "x", ""]), max_size=3))
    new = draw(st.lists(st.sampled_from(["int line_005 = 0;", "\tfsmonitor = touch RAN", "x", "../../canary"]),
                        max_size=3))
    d_old = draw(st.integers(-1, 1)) if draw(st.integers(0, 9)) == 0 else 0
    d_new = draw(st.integers(-1, 1)) if draw(st.integers(0, 9)) == 0 else 0
    start = draw(st.integers(0, 6))
    body = "".join(f"-{ln}\n" for ln in old) + "".join(f"+{ln}\n" for ln in new)
    return f"@@ -{start},{max(len(old) + d_old, 0)} +{start},{max(len(new) + d_new, 0)} @@\n{body}"


@st.composite
def git_entry(draw: st.DrawFn, pool: st.SearchStrategy[str] = paths) -> str:
    a = draw(names("a", pool))
    b = draw(st.one_of(st.just(a.replace("a/", "b/", 1)), names("b", pool)))
    kind = draw(st.sampled_from(["modify", "new", "delete", "rename", "copy", "mode", "symlink", "binary"]))
    head = f"diff --git {a} {b}\n"
    if kind == "modify":
        return head + f"index 1111111..2222222 100644\n--- {a}\n+++ {b}\n" + draw(hunk())
    if kind == "new":
        mode = draw(st.sampled_from(["100644", "100755", "120000", "160000", "100600"]))
        return head + f"new file mode {mode}\nindex 0000000..1111111\n--- /dev/null\n+++ {b}\n" + draw(hunk())
    if kind == "delete":
        return head + f"deleted file mode 100644\nindex 1111111..0000000\n--- {a}\n+++ /dev/null\n" + draw(hunk())
    if kind in ("rename", "copy"):
        return head + f"similarity index 100%\n{kind} from {a[2:]}\n{kind} to {b[2:]}\n"
    if kind == "mode":
        return head + "old mode 100644\nnew mode " + draw(st.sampled_from(["100755", "120000", "040000"])) + "\n"
    if kind == "symlink":
        target = draw(st.sampled_from(["../canary", "/etc", ".git", "src", "../../..", "x/../../y", "CMakeLists.txt"]))
        return head + f"new file mode 120000\nindex 0000000..1111111\n--- /dev/null\n+++ {b}\n@@ -0,0 +1 @@\n+{target}\n" \
            "\\ No newline at end of file\n"
    return head + "index 1111111..2222222 100644\nGIT binary patch\nliteral 3\nKcmZ?wc>n+%00961\n\nliteral 0\nHcmV?d00001\n\n"


@st.composite
def gnu_entry(draw: st.DrawFn, pool: st.SearchStrategy[str] = paths) -> str:
    a = draw(names("a", pool))
    b = draw(st.one_of(st.just(a.replace("a/", "b/", 1)), names("b", pool), st.just("/dev/null")))
    index = f"Index: {draw(paths)}\n" if draw(st.integers(0, 7)) == 0 else ""
    old = "/dev/null" if draw(st.integers(0, 3)) == 0 else a
    return index + f"--- {old}\t2024-01-01\n+++ {b}\t2024-01-01\n" + draw(hunk())


STRAY = st.sampled_from(["", "garbage text", "5c5", "1a", "***************", "*** a/x", "\\ No newline at end of file",
                         "-- ", "2.39.0", "Only in a: x", "diff -ruN a/x b/x"])


@st.composite
def patches(draw: st.DrawFn, entry: st.SearchStrategy[str]) -> bytes:
    parts = []
    for e in draw(st.lists(entry, min_size=1, max_size=3)):
        if draw(st.integers(0, 7)) == 0:
            parts.append(draw(STRAY) + "\n")
        parts.append(e)
    text = "".join(parts)
    if draw(st.integers(0, 5)) == 0:
        text = text.replace("\n", "\r\n")
    return text.encode("utf-8", "surrogateescape")


@pytest.fixture(scope="module")
def fuzz_room(tmp_path_factory: pytest.TempPathFactory, source_template: Path) -> Arena:
    arena = Arena(tmp_path_factory.mktemp("fuzz"), source_template)
    arena.symlink_in_source("link", str(arena.canary))  # a way out for a patch to try
    out = arena.cli("apply", "-c", str(arena.config_path), "--no-render")
    assert out.code == 0, out.output
    return arena


def _git_state(room: Path) -> dict[str, tuple[int, str]]:
    """What of the room's .git could make git run commands or point elsewhere."""
    git = room / ".git"
    keep = {"config", "HEAD", "commondir", "info", "hooks", "modules"}
    return {k: v for k, v in tree_hashes(git).items() if k.split("/", 1)[0].rstrip("/") in keep}


def _check_one(arena: Arena, data: bytes) -> None:
    room = arena.room
    patch_file = arena.patches / "0001-fuzz.patch"
    patch_file.write_bytes(data)
    payload = data.replace(b"touch RAN", arena.payload.encode())
    patch_file.write_bytes(payload)
    outside = arena.snapshot()
    git_before = _git_state(room)
    patch = load_patch(patch_file, patch_file.name)
    try:
        check_series([patch])
        fail, _method = apply_one(room, patch)
    except DcaforgeError as exc:
        assert exc.exit_code in (1, 3), exc
        assert exc.message and exc.where and exc.hint, exc
    else:
        if fail is None:
            for entry in status_porcelain(room):
                rel = entry[3:]
                assert path_problem(rel) is None, (rel, data)
                assert os.path.realpath(room / rel).startswith(str(room) + os.sep), (rel, data)
        else:
            assert fail.reason
    finally:
        Room.of(arena.config).reset_hard("HEAD", everything=True)
    assert not arena.ran.exists(), data
    assert _git_state(room) == git_before, data
    assert config_problems(room / ".git" / "config") == []
    patch_file.unlink()
    assert arena.snapshot() == {k: v for k, v in outside.items() if k != os.path.relpath(patch_file, arena.tmp)}, data


FUZZ = settings(max_examples=45, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large, HealthCheck.filter_too_much])


@FUZZ
@given(data=patches(git_entry()))
def test_fuzzed_git_patches_stay_in_the_room(fuzz_room: Arena, data: bytes) -> None:
    _check_one(fuzz_room, data)


@FUZZ
@given(data=patches(gnu_entry()))
def test_fuzzed_gnu_patches_stay_in_the_room(fuzz_room: Arena, data: bytes) -> None:
    _check_one(fuzz_room, data)


@FUZZ
@given(data=patches(st.one_of(git_entry(), gnu_entry())))
def test_fuzzed_mixed_patches_stay_in_the_room(fuzz_room: Arena, data: bytes) -> None:
    _check_one(fuzz_room, data)


@FUZZ
@given(data=patches(st.one_of(git_entry(plausible), gnu_entry(plausible))))
def test_fuzzed_plausible_patches_stay_in_the_room(fuzz_room: Arena, data: bytes) -> None:
    """Names of the tree (and the symlink out of it): most reach git apply or GNU patch."""
    _check_one(fuzz_room, data)


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(data=st.binary(max_size=400))
def test_random_bytes_never_crash_the_patch_reader(data: bytes) -> None:
    """The reader itself on arbitrary bytes: a parse, never an exception."""
    from dcaforge.confine import PatchRef, check_patch_text
    from dcaforge.errors import SafetyError
    from dcaforge.patchfile import parse_patch

    parsed = parse_patch(data)
    try:
        check_patch_text(PatchRef("x.patch", Path("x.patch")), parsed, "fix it")
    except SafetyError as exc:
        assert exc.where and exc.hint
