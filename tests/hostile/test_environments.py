"""Hostile environments: a user git configuration full of commands (global, XDG, system, env-var
config, GIT_* variables), a clean room whose .git/config was tampered with, tools missing or not
GNU on PATH, git's own lock files left behind or held, a room held by another run, leftovers of a
killed clone."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.core.helpers import ugit

from .conftest import Arena


def _hooks(folder: Path, payload: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("pre-commit", "post-commit", "post-checkout", "post-merge", "reference-transaction", "pre-auto-gc",
                 "fsmonitor-watchman", "post-index-change", "post-rewrite"):
        hook = folder / name
        hook.write_text(f"#!/bin/sh\n{payload}\n")
        hook.chmod(0o755)
    return folder


def hostile_gitconfig(arena: Arena, path: Path) -> None:
    hooks = _hooks(arena.tmp / "evil-hooks", arena.payload)
    template = arena.tmp / "evil-template"
    _hooks(template / "hooks", arena.payload)
    attrs = arena.tmp / "evil-attributes"
    attrs.write_text("* filter=evil diff=evil merge=evil\n")
    include = arena.tmp / "evil-include"
    include.write_text(f"[core]\n\tfsmonitor = {arena.payload}\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(f"""\
        [core]
        \tfsmonitor = {arena.payload}
        \thooksPath = {hooks}
        \tattributesFile = {attrs}
        \tsshCommand = {arena.payload}
        \tpager = {arena.payload}
        \tautocrlf = true
        [init]
        \ttemplateDir = {template}
        [filter "evil"]
        \tclean = {arena.payload}
        \tsmudge = {arena.payload}
        \tprocess = {arena.payload}
        \trequired = true
        [diff "evil"]
        \ttextconv = {arena.payload}
        [diff]
        \texternal = {arena.payload}
        \tnoprefix = true
        [merge "evil"]
        \tdriver = {arena.payload}
        [credential]
        \thelper = !{arena.payload}
        [alias]
        \tstatus = !{arena.payload}
        [commit]
        \tgpgSign = true
        [gpg]
        \tprogram = {arena.payload}
        [includeIf "gitdir:/"]
        \tpath = {include}
        [include]
        \tpath = {include}
        """))


def test_hostile_user_git_config_changes_nothing(arena: Arena, monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole job under a user git setup that would run a command at every turn; and the patch is
    byte-identical to the one made without it."""
    arena.patch("0001-a.patch", "--- a/src/llama.cpp\n+++ b/src/llama.cpp\n@@ -5 +5 @@\n-int line_005 = 5;\n"
                              "+int line_005 = 55;\n")
    arena.patch("0002-b.patch", "diff --git a/docs/x.txt b/docs/x.txt\nnew file mode 100644\n--- /dev/null\n"
                              "+++ b/docs/x.txt\n@@ -0,0 +1 @@\n+x\n")
    arena.applied()
    arena.run("capture", code=0, changed=[arena.patches / "0078-dca.patch"])
    clean = (arena.patches / "0078-dca.patch").read_bytes()
    (arena.patches / "0078-dca.patch").unlink()
    hostile_gitconfig(arena, Path(os.environ["GIT_CONFIG_GLOBAL"]))
    hostile_gitconfig(arena, Path(os.environ["HOME"]) / ".gitconfig")
    hostile_gitconfig(arena, arena.tmp / "xdg" / "git" / "config")
    hostile_gitconfig(arena, arena.tmp / "system-gitconfig")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(arena.tmp / "xdg"))
    monkeypatch.setenv("GIT_CONFIG_SYSTEM", str(arena.tmp / "system-gitconfig"))
    monkeypatch.delenv("GIT_CONFIG_NOSYSTEM")
    monkeypatch.setenv("GIT_CONFIG_COUNT", "1")
    monkeypatch.setenv("GIT_CONFIG_KEY_0", "core.fsmonitor")
    monkeypatch.setenv("GIT_CONFIG_VALUE_0", arena.payload)
    monkeypatch.setenv("GIT_CONFIG_PARAMETERS", f"'core.fsmonitor'='{arena.payload}'")
    for var in ("GIT_SSH_COMMAND", "GIT_EXTERNAL_DIFF", "GIT_PAGER", "GIT_ASKPASS", "GIT_EDITOR", "GIT_SEQUENCE_EDITOR"):
        monkeypatch.setenv(var, arena.payload)
    monkeypatch.setenv("GIT_TEMPLATE_DIR", str(arena.tmp / "evil-template"))
    monkeypatch.setenv("GIT_EXEC_PATH", str(arena.tmp / "evil-hooks"))
    monkeypatch.setenv("GIT_DIR", str(arena.source / ".git"))
    monkeypatch.setenv("GIT_WORK_TREE", str(arena.source))
    monkeypatch.setenv("GIT_INDEX_FILE", str(arena.source / ".git" / "index"))
    monkeypatch.setenv("POSIXLY_CORRECT", "1")
    monkeypatch.setenv("PATCH_GET", "1")
    monkeypatch.setenv("QUOTING_STYLE", "c")
    may = [Path(os.environ["GIT_CONFIG_GLOBAL"])]
    arena.run("apply", "--fresh", code=0, may_change=may)
    arena.run("render", code=0)
    arena.run("capture", code=0, changed=[arena.patches / "0078-dca.patch"])
    arena.run("verify", "--fresh-render", "--gnu", code=0)
    arena.run("status", code=0)
    assert (arena.patches / "0078-dca.patch").read_bytes() == clean  # (the source's bytes: checked by every run)


TAMPERED = {
    "fsmonitor": "[core]\n\tfsmonitor = {payload}\n",
    "hooks-path": "[core]\n\thooksPath = {hooks}\n",
    "filter": "[filter \"evil\"]\n\tclean = {payload}\n\tsmudge = {payload}\n\tprocess = {payload}\n",
    "textconv": "[diff \"evil\"]\n\ttextconv = {payload}\n\tcommand = {payload}\n",
    "merge-driver": "[merge \"evil\"]\n\tdriver = {payload}\n",
    "include": "[include]\n\tpath = {include}\n",
    "include-if": "[includeIf \"gitdir:/\"]\n\tpath = {include}\n",
    "worktree": "[core]\n\tworktree = {canary}\n",
    "ssh-command": "[core]\n\tsshCommand = {payload}\n[remote \"origin\"]\n\tuploadpack = {payload}\n",
    "worktree-config": "[extensions]\n\tworktreeConfig = true\n",
    "unparseable": "[core\n\tfsmonitor = {payload}\n",
}


@pytest.mark.parametrize("command", [["apply"], ["render"], ["capture"], ["verify"]])
@pytest.mark.parametrize("kind", sorted(TAMPERED))
def test_tampered_room_config_is_repaired_before_git_runs(arena: Arena, kind: str, command: list[str]) -> None:
    arena.applied()
    if command == ["verify"]:
        arena.run("capture", code=0, changed=[arena.patches / "0078-dca.patch"])
    _tamper(arena, kind)
    changed = [arena.patches / "0078-dca.patch"] if command == ["capture"] else []
    out = arena.run(*command, code=0, changed=changed)
    assert "warning: removed from" in out.output and "could make git run commands" in out.output, out.output
    from dcaforge.git import config_problems

    assert config_problems(arena.room / ".git" / "config") == []


def _tamper(arena: Arena, kind: str) -> None:
    include = arena.tmp / "evil-include"
    include.write_text(f"[core]\n\tfsmonitor = {arena.payload}\n")
    hooks = _hooks(arena.tmp / "evil-hooks", arena.payload)
    (arena.room / ".gitattributes").write_text("* filter=evil diff=evil merge=evil\n")
    (arena.room / ".git" / "info").mkdir(exist_ok=True)
    (arena.room / ".git" / "info" / "attributes").write_text("* filter=evil diff=evil merge=evil\n")
    (arena.room / ".git" / "config.worktree").write_text(f"[core]\n\tfsmonitor = {arena.payload}\n")
    _hooks(arena.room / ".git" / "hooks", arena.payload)
    with open(arena.room / ".git" / "config", "a") as fh:
        fh.write(TAMPERED[kind].format(payload=arena.payload, hooks=hooks, include=include, canary=arena.canary))
    (arena.room / ".gitattributes").unlink()  # a hand edit the next capture would carry: not the point here


@pytest.mark.parametrize("kind", sorted(TAMPERED))
def test_status_reports_a_tampered_room_and_runs_no_git_there(arena: Arena, kind: str) -> None:
    arena.applied()
    _tamper(arena, kind)
    out = arena.run("status", code=0)
    assert "UNSAFE: .git/config sets" in out.output and f"`dcaforge apply -c {arena.config_path}` removes them" in out.output
    arena.run("render", "--check", code=1, what="holds settings dcaforge does not allow", next="removes them")


def test_hooks_in_the_room_never_run(arena: Arena) -> None:
    arena.applied()
    _hooks(arena.room / ".git" / "hooks", arena.payload)
    arena.patch("0001-a.patch", "--- a/src/llama.cpp\n+++ b/src/llama.cpp\n@@ -5 +5 @@\n-int line_005 = 5;\n"
                              "+int line_005 = 55;\n")
    arena.run("apply", code=0)  # the series changed: re-applied, committed, tagged, rendered


def _path_without(tool: str, tmp: Path) -> str:
    """PATH with ``tool`` hidden (the folders that hold it are left out; the others are kept)."""
    keep = [d for d in os.environ["PATH"].split(os.pathsep) if d and not os.path.exists(os.path.join(d, tool))]
    if tool == "patch":  # git usually sits beside patch in /usr/bin: give it its own folder
        bin_dir = tmp / "git-only"
        bin_dir.mkdir(exist_ok=True)
        for name in ("git", "sh", "bash", "diff"):
            for d in os.environ["PATH"].split(os.pathsep):
                if os.path.exists(os.path.join(d, name)) and not (bin_dir / name).exists():
                    os.symlink(os.path.join(d, name), bin_dir / name)
        keep.insert(0, str(bin_dir))
    return os.pathsep.join(keep)


@pytest.mark.parametrize(("tool", "what"), [("git", "git is not installed"), ("patch", "patch is not installed")])
def test_missing_tools_say_how_to_install_them(arena: Arena, monkeypatch: pytest.MonkeyPatch, tool: str, what: str) -> None:
    arena.patch("0001-gnu.patch", "--- a/src/llama.cpp\n+++ b/src/llama.cpp\n@@ -5 +5 @@\n-int line_005 = 5;\n"
                                "+int line_005 = 55;\n")
    from dcaforge import git as dgit

    dgit._gnu_patch.cache_clear()
    monkeypatch.setenv("PATH", _path_without(tool, arena.tmp))
    arena.run("apply", code=1, what=what, next=f"install {'GNU patch' if tool == 'patch' else 'git'}")
    dgit._gnu_patch.cache_clear()


def test_a_patch_that_is_not_gnu_patch(arena: Arena, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = arena.tmp / "bsd-bin"
    fake.mkdir()
    (fake / "patch").write_text("#!/bin/sh\necho 'patch 2.0-12u11 FreeBSD'\n")
    (fake / "patch").chmod(0o755)
    arena.patch("0001-gnu.patch", "--- a/src/llama.cpp\n+++ b/src/llama.cpp\n@@ -5 +5 @@\n-int line_005 = 5;\n"
                                "+int line_005 = 55;\n")
    from dcaforge import git as dgit

    dgit._gnu_patch.cache_clear()
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    arena.run("apply", code=1, what="is not GNU patch", next="install GNU patch")
    dgit._gnu_patch.cache_clear()


def test_stale_index_lock_is_removed_and_the_user_told(arena: Arena) -> None:
    arena.applied()
    (arena.room / ".git" / "index.lock").write_text("")
    (arena.room / ".git" / "refs" / "tags" / "x.lock").write_text("")
    out = arena.run("apply", "--continue", code=0)
    assert "warning: removed .git/index.lock, .git/refs/tags/x.lock left by an interrupted git" in out.output
    assert not (arena.room / ".git" / "index.lock").exists()


def test_index_lock_held_by_a_live_git_is_left_alone(arena: Arena) -> None:
    arena.applied()
    lock = arena.room / ".git" / "index.lock"
    holder = subprocess.Popen([sys.executable, "-c", f"f = open({str(lock)!r}, 'w'); import time; time.sleep(60)"])
    try:
        for _ in range(200):
            if lock.exists():
                break
            import time

            time.sleep(0.01)
        arena.run("apply", code=1, what="git is running in the clean room", next="wait for that git command")
        assert lock.exists()
    finally:
        holder.kill()
        holder.wait()


def test_a_room_held_by_another_run(arena: Arena) -> None:
    arena.applied()
    code = (f"import sys; from pathlib import Path; from dcaforge.room.cleanroom import Room, locked\n"
            f"with locked(Room(Path({str(arena.room)!r}), Path({str(arena.workspace)!r}))):\n"
            f"    print('held', flush=True); import time; time.sleep(60)\n")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        for cmd in (["apply"], ["render"], ["capture"], ["apply", "--fresh"]):
            arena.run(*cmd, code=1, what=f"(pid {holder.pid} on", next="wait for it to finish")
    finally:
        holder.kill()
        holder.wait()
    arena.run("apply", code=0)


def test_leftovers_of_a_killed_clone_are_cleaned(arena: Arena) -> None:
    arena.workspace.mkdir()
    (arena.workspace / ".room.creating" / ".git").mkdir(parents=True)
    (arena.workspace / ".room.creating" / "half.c").write_text("half\n")
    (arena.workspace / ".room.deleting").mkdir()
    out = arena.run("apply", "--continue", code=0, what="nothing to continue")
    assert "warning: removed" in out.output and ".room.creating, left by an interrupted run" in out.output
    assert sorted(p.name for p in arena.workspace.iterdir()) == ["room"]


def test_corrupt_state_file(arena: Arena) -> None:
    arena.applied()
    (arena.room / ".git" / "dcaforge" / "state.json").write_text("{not json")
    arena.run("apply", code=1, what="state file is corrupt", next="dcaforge apply --fresh")
    arena.run("apply", "--fresh", code=0)


def test_a_folder_that_is_not_a_room(arena: Arena) -> None:
    arena.room.mkdir(parents=True)
    (arena.room / "precious.txt").write_text("mine\n")
    arena.skip.remove(arena.workspace)  # the user's folder: every byte of it must stay
    for cmd in (["apply"], ["apply", "--fresh"], ["capture"], ["render"], ["verify"]):
        arena.run(*cmd, code=1, what="not made by dcaforge")
    assert (arena.room / "precious.txt").read_text() == "mine\n"


def test_read_only_workspace(arena: Arena) -> None:
    ws = arena.tmp / "ro-ws"
    ws.mkdir()
    if os.geteuid() == 0:
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(ws)], capture_output=True,
                          check=False).returncode != 0:
            pytest.skip("cannot mount here")  # pragma: no cover
    else:  # pragma: no cover (root here)
        ws.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        arena.write_config(cleanroom=str(ws))
        arena.skip.append(ws)
        out = arena.run("apply", code=1, what="cannot write")
        assert "Traceback" not in out.output
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", str(ws)], check=False)
        else:  # pragma: no cover
            ws.chmod(0o755)


def test_linked_worktree_of_the_room_keeps_the_guard(arena: Arena) -> None:
    """A git dir reached through a .git file (a linked worktree) is checked too."""
    arena.applied()
    wt = arena.tmp / "cleanroom" / "room-wt"
    ugit(arena.room, "worktree", "add", "-q", "--detach", str(wt), "HEAD")
    with open(arena.room / ".git" / "config", "a") as fh:
        fh.write(f"[core]\n\tfsmonitor = {arena.payload}\n")
    from dcaforge.errors import SafetyError
    from dcaforge.git import git

    with pytest.raises(SafetyError, match="core.fsmonitor"):
        git(wt, "status")
    assert not arena.ran.exists()


RACER = r'''
import os, sys, time
from pathlib import Path
from dcaforge.room.cleanroom import Room, locked
from dcaforge.errors import LockedError
room = Room(Path(sys.argv[1]), Path(sys.argv[2]))
log = sys.argv[3]
while time.time() < float(sys.argv[4]):
    pass  # all start together
try:
    with locked(room):
        with open(log, "a") as fh:
            fh.write(f"{time.monotonic():.6f} in {os.getpid()}\n")
        time.sleep(0.15)
        with open(log, "a") as fh:
            fh.write(f"{time.monotonic():.6f} out {os.getpid()}\n")
except LockedError:
    sys.exit(3)
'''


def test_two_runs_never_hold_one_room_together(arena: Arena) -> None:
    """Issue 12, point 7: two runs could both take over a stale lock. Eight racers start together on a
    room whose lock file names a dead run: the holds never overlap, every other racer is refused."""
    import time

    arena.workspace.mkdir()
    (arena.workspace / "room.lock").write_text('{"pid": 999999999, "host": "gone"}\n')  # a dead run's
    log = arena.tmp / "holds.log"
    start = time.time() + 1.5
    procs = [subprocess.Popen([sys.executable, "-c", RACER, str(arena.room), str(arena.workspace), str(log), str(start)],
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}) for _ in range(8)]
    codes = [p.wait(timeout=60) for p in procs]
    events = [ln.split() for ln in log.read_text().splitlines()]
    assert codes.count(0) >= 1 and set(codes) <= {0, 3}, codes
    depth = 0
    for _t, what, _pid in sorted(events, key=lambda e: float(e[0])):
        depth += 1 if what == "in" else -1
        assert depth <= 1, events
    assert len(events) == 2 * codes.count(0)
    assert not (arena.workspace / "room.lock").exists()


@pytest.mark.parametrize(("args", "code"), [(["apply", "--no-such-option"], 2), (["capture", "extra-argument"], 2),
                                            (["no-such-command"], 2), (["verify"], 1)])
def test_exit_codes_usage_is_2_error_is_1(arena: Arena, args: list[str], code: int) -> None:
    out = arena.cli(*args, *(["-c", str(arena.config_path)] if args[0] in ("verify",) else []))
    assert out.code == code, out.output
    assert not arena.ran.exists()
