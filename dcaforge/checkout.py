"""A user's own git checkout (the source, when it is a local one), read without writing to it: its top, HEAD,
git directories, and uncommitted files (its submodules' included). git runs there with every setting that could
make it run a command switched off (:func:`neutralizing_args`) and no optional locks."""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from dcaforge.errors import CommandError, SafetyError
from dcaforge.git import GIT_CONFIG_ARGS, Result, run, tail

_DRIVER_KEY = re.compile(r"^(?:filter\..+\.(?:clean|smudge|process)|diff\..+\.(?:textconv|command)|merge\..+\.driver)$")


def neutralizing_args(cwd: Path) -> list[str]:
    """``-c KEY=`` for every filter, diff or merge driver the repository at ``cwd`` configures (its
    config read by git, includes followed, nothing run): git then runs none of them there."""
    res = run(["git", *GIT_CONFIG_ARGS, "config", "--list", "-z"], cwd, check=False)
    args: list[str] = []
    for item in res.stdout_bytes.split(b"\0"):
        key = item.decode("utf-8", "surrogateescape").partition("\n")[0]
        if _DRIVER_KEY.match(key):
            if "=" in key:
                raise SafetyError(f"the git config of {cwd} names a driver dcaforge cannot switch off: {key!r}",
                                  where=str(cwd), hint="rename that filter/diff/merge driver (no '=' in its name)")
            args += ["-c", f"{key}="]
    return args


@dataclass(frozen=True)
class CheckoutInfo:
    """What dcaforge knows about a user's own git checkout (read only)."""

    toplevel: Path
    head: str | None
    uncommitted: tuple[str, ...]  # paths relative to toplevel, modified/added/untracked (submodules' included)
    deleted: tuple[str, ...]
    git_dir: Path | None = None     # its git directory (.git, or .git/worktrees/<name> of a linked worktree)
    common_dir: Path | None = None  # the repository's shared git directory (the main .git of linked worktrees)
    submodules_wip: tuple[str, ...] = ()  # submodules (paths) with uncommitted files inside them

    @property
    def folders(self) -> list[Path]:
        """The folders of the user's that dcaforge never writes: the work tree, its git directory and
        the repository's common one (a linked worktree's main worktree included)."""
        out = [self.toplevel] + [d for d in (self.git_dir, self.common_dir) if d is not None]
        if self.common_dir is not None and self.common_dir.name == ".git":
            out.append(self.common_dir.parent)  # the main worktree of a linked one
        return out


def _user_git(cwd: Path, args: list[str], *extra: str) -> Result:
    """git in the user's checkout: isolated config, every command-running setting switched off,
    no optional locks (nothing is written there)."""
    return run(["git", *GIT_CONFIG_ARGS, *args, "--no-optional-locks", *extra], cwd, check=False)


def porcelain_z(text: str) -> list[tuple[str, str]]:
    """The (XY status, path) entries of `git status --porcelain=v1 -z` output; a rename's or copy's source path,
    the entry after it, is skipped."""
    out: list[tuple[str, str]] = []
    items = text.split("\0")
    i = 0
    while i < len(items):
        entry = items[i]
        i += 1
        if not entry:
            continue
        code, rel = entry[:2], entry[3:]
        if code[0] in "RC":
            i += 1
        out.append((code, rel))
    return out


def _wip(top: Path, prefix: str, changed: list[str], deleted: list[str], subs: list[str], depth: int = 0) -> None:
    args = neutralizing_args(top)
    res = _user_git(top, args, "status", "--porcelain=v1", "-z", "--untracked-files=all", "--ignore-submodules=dirty")
    if not res.ok:
        raise CommandError(f"git status failed in {top}", where=str(top), details=tail(res.stderr),
                           hint=f"check the checkout with `git -C {shlex.quote(str(top))} status`")
    before = len(changed) + len(deleted)
    for code, rel in porcelain_z(res.stdout):
        if "D" in code and code[0] not in "RC":
            deleted.append(prefix + rel)
        else:
            changed.append(prefix + rel)
    if prefix and len(changed) + len(deleted) > before:
        subs.append(prefix.rstrip("/"))
    if depth > 8:
        return
    listing = _user_git(top, args, "ls-files", "-s", "-z")
    for item in listing.stdout.split("\0"):
        if item.startswith("160000 "):
            sub = item.split("\t", 1)[1]
            if (top / sub / ".git").exists():
                _wip(top / sub, f"{prefix}{sub}/", changed, deleted, subs, depth + 1)


def inspect_checkout(path: Path) -> CheckoutInfo | None:
    """Inspect a local git checkout without writing to it (no index refresh, no optional locks, no
    filter, hook or fsmonitor run), its submodules' uncommitted files included; None if not a
    work tree of a repository."""
    if not Path(path).is_dir():
        return None
    res = _user_git(Path(path), [], "rev-parse", "--is-bare-repository", "--show-toplevel", "--absolute-git-dir",
                    "--git-common-dir")
    lines = res.stdout.splitlines()
    if not res.ok or len(lines) < 4 or lines[0] == "true":
        return None
    top = Path(lines[1])
    git_dir = Path(lines[2])
    common = Path(lines[3]) if Path(lines[3]).is_absolute() else (Path(path) / lines[3])
    head_res = _user_git(top, [], "rev-parse", "--verify", "--quiet", "HEAD^{commit}")
    head = head_res.stdout.strip() or None if head_res.ok else None
    changed: list[str] = []
    deleted: list[str] = []
    subs: list[str] = []
    _wip(top, "", changed, deleted, subs)
    return CheckoutInfo(toplevel=top, head=head, uncommitted=tuple(sorted(changed)), deleted=tuple(sorted(deleted)),
                        git_dir=Path(os.path.realpath(git_dir)), common_dir=Path(os.path.realpath(common)),
                        submodules_wip=tuple(sorted(subs)))
