"""The one place that runs git and patch (and the only module importing GitPython).

Every command goes through :func:`run`: an argv list (never a shell), an explicit ``cwd``,
utf-8, logged, and a failure raises :class:`~dcaforge.errors.CommandError` with the stderr
tail. git always runs under an isolated configuration (no global or system config, a fixed
identity and date, no signing, hooks off) so what dcaforge commits and captures does not
depend on the user's git setup.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .errors import CommandError

log = logging.getLogger("dcaforge")

IDENTITY_NAME = "dcaforge"
IDENTITY_EMAIL = "dcaforge@localhost"
#: Every commit dcaforge makes carries this date, so commit ids are the same everywhere.
FIXED_DATE = "2000-01-01T00:00:00+0000"

#: ``-c`` settings given to every git call (after the isolated environment).
GIT_CONFIG_ARGS: tuple[str, ...] = (
    "-c", "core.hooksPath=/dev/null",
    "-c", "commit.gpgSign=false",
    "-c", "tag.gpgSign=false",
    "-c", "core.autocrlf=false",
    "-c", "core.safecrlf=false",
    "-c", "core.fileMode=true",
    "-c", "gc.auto=0",
    "-c", "maintenance.auto=false",
    "-c", "advice.detachedHead=false",
    "-c", "init.defaultBranch=main",
    "-c", "protocol.file.allow=always",
    "-c", "checkout.workers=0",
    "-c", "core.untrackedCache=false",
)


def isolated_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for every subprocess: no GIT_* from outside, isolated git config."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(
        {
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_AUTHOR_NAME": IDENTITY_NAME,
            "GIT_AUTHOR_EMAIL": IDENTITY_EMAIL,
            "GIT_AUTHOR_DATE": FIXED_DATE,
            "GIT_COMMITTER_NAME": IDENTITY_NAME,
            "GIT_COMMITTER_EMAIL": IDENTITY_EMAIL,
            "GIT_COMMITTER_DATE": FIXED_DATE,
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_OPTIONAL_LOCKS": "0",
            "LC_ALL": "C",
            "LANGUAGE": "C",
            "TZ": "UTC",
        }
    )
    if extra:
        env.update(extra)
    return env


@dataclass(frozen=True)
class Result:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    stdout_bytes: bytes

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def run(
    argv: Sequence[str | os.PathLike[str]],
    cwd: Path,
    *,
    env: Mapping[str, str] | None = None,
    input: bytes | None = None,
    check: bool = True,
    what: str | None = None,
    hint: str | None = None,
) -> Result:
    """Run ``argv`` in ``cwd`` under :func:`isolated_env` (plus ``env``).

    ``check``: a non-zero exit raises :class:`CommandError` naming ``what`` with the stderr tail.
    """
    args = tuple(os.fspath(a) for a in argv)
    log.debug("run %s (cwd=%s)", " ".join(args), cwd)
    proc = subprocess.run(
        args,
        cwd=os.fspath(cwd),
        env=isolated_env(env),
        input=input,
        stdin=None if input is not None else subprocess.DEVNULL,
        capture_output=True,
        check=False,
    )
    if proc.returncode == -signal.SIGINT:
        # the child died of the Ctrl-C that is about to reach us: stop here, not with a bogus
        # "command failed"
        raise KeyboardInterrupt
    res = Result(
        argv=args,
        returncode=proc.returncode,
        stdout=proc.stdout.decode("utf-8", "replace"),
        stderr=proc.stderr.decode("utf-8", "replace"),
        stdout_bytes=proc.stdout,
    )
    if check and not res.ok:
        raise CommandError(
            f"{what or args[0]} failed (exit {res.returncode})",
            where=f"{' '.join(args)}  (in {cwd})",
            details=_tail(res.stderr or res.stdout),
            hint=hint,
        )
    return res


def run_streaming(
    argv: Sequence[str | os.PathLike[str]],
    cwd: Path,
    *,
    log_file: Path,
    on_line: Callable[[str], None] | None = None,
    env: Mapping[str, str] | None = None,
) -> int:
    """Run a long command (a build) in ``cwd``: stdout and stderr merged, every line appended to
    ``log_file`` and handed to ``on_line``. Returns the exit status (checking is the caller's job:
    it knows how to read the log). Ctrl-C stops the whole process group, then re-raises.
    The user's locale is kept (ccache hashes LANG/LC_*: builds made by hand then share objects)."""
    args = tuple(os.fspath(a) for a in argv)
    full_env = isolated_env(env)
    for key in ("LC_ALL", "LANGUAGE"):
        full_env.pop(key, None)
        if key in os.environ:
            full_env[key] = os.environ[key]
    log.debug("run %s (cwd=%s, log=%s)", " ".join(args), cwd, log_file)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "a", encoding="utf-8") as fh:
        fh.write(f"$ {' '.join(args)}\n# cwd: {cwd}\n")
        fh.flush()
        proc = subprocess.Popen(args, cwd=os.fspath(cwd), env=full_env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        assert proc.stdout is not None
        try:
            for raw in proc.stdout:
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                fh.write(line + "\n")
                if on_line is not None:
                    on_line(line)
            rc = proc.wait()
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            fh.write("# interrupted\n")
            raise
        fh.write(f"# exit {rc}\n")
    return rc


def git(
    cwd: Path,
    *args: str | os.PathLike[str],
    env: Mapping[str, str] | None = None,
    input: bytes | None = None,
    check: bool = True,
    what: str | None = None,
    hint: str | None = None,
) -> Result:
    """Run git with the isolated configuration in ``cwd``."""
    return run(["git", *GIT_CONFIG_ARGS, *args], cwd, env=env, input=input, check=check,
               what=what or f"git {args[0] if args else ''}".strip(), hint=hint)


def git_out(cwd: Path, *args: str | os.PathLike[str], env: Mapping[str, str] | None = None) -> str:
    """stdout of a git command, stripped."""
    return git(cwd, *args, env=env).stdout.strip()


def patch_cmd(cwd: Path, patch_file: Path, *, dry_run: bool, strip: int = 1) -> Result:
    """GNU patch, never with fuzz, no backups, no questions; the result is not checked."""
    argv = ["patch", f"-p{strip}", "--fuzz=0", "--no-backup-if-mismatch", "--force",
            "--forward", "-i", os.fspath(patch_file)]
    if dry_run:
        argv.append("--dry-run")
    else:
        argv += ["--reject-file=-"]
    return run(argv, cwd, check=False, what="patch")


# --- small helpers over git -------------------------------------------------------------

def rev_parse(cwd: Path, rev: str) -> str | None:
    res = git(cwd, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", check=False)
    return res.stdout.strip() or None if res.ok else None


def tree_of(cwd: Path, rev: str) -> str:
    return git_out(cwd, "rev-parse", f"{rev}^{{tree}}")


def commit_all(cwd: Path, message: str, *, allow_empty: bool = True) -> str:
    """Stage everything in the work tree (respecting .gitignore) and commit it."""
    git(cwd, "add", "-A", ".")
    args = ["commit", "-q", "--no-verify", "-m", message]
    if allow_empty:
        args.insert(2, "--allow-empty")
    git(cwd, *args)
    return git_out(cwd, "rev-parse", "HEAD")


def status_porcelain(cwd: Path) -> list[str]:
    """``git status --porcelain`` lines (untracked files listed one by one), read-only."""
    res = git(cwd, "--no-optional-locks", "status", "--porcelain=v1", "-z", "--untracked-files=all")
    items = res.stdout.split("\0")
    out: list[str] = []
    i = 0
    while i < len(items):
        entry = items[i]
        if not entry:
            i += 1
            continue
        out.append(entry)
        # a rename/copy is followed by its source path
        if entry[:1] in ("R", "C"):
            i += 1
        i += 1
    return out


def is_inside(child: Path, parent: Path) -> bool:
    child, parent = child.resolve(), parent.resolve()
    return child == parent or parent in child.parents


# --- GitPython: reading a user's checkout -----------------------------------------------

@dataclass(frozen=True)
class CheckoutInfo:
    """What dcaforge knows about a user's own git checkout (read only)."""

    toplevel: Path
    head: str | None
    uncommitted: tuple[str, ...]  # paths relative to toplevel, modified/added/untracked/deleted
    deleted: tuple[str, ...]


def inspect_checkout(path: Path) -> CheckoutInfo | None:
    """Inspect a local git checkout without writing to it (no index refresh); None if not a repo."""
    import git as gitpython  # GitPython: only imported here

    try:
        repo = gitpython.Repo(os.fspath(path), search_parent_directories=True)
    except (gitpython.InvalidGitRepositoryError, gitpython.NoSuchPathError):
        return None
    if repo.bare or repo.working_tree_dir is None:
        return None
    top = Path(repo.working_tree_dir)
    try:
        head = repo.head.commit.hexsha
    except ValueError:
        head = None
    env = {k: v for k, v in isolated_env().items() if k.startswith(("GIT_", "LC_"))}
    # GitPython merges os.environ: pin the repository so an outside GIT_DIR/GIT_INDEX_FILE cannot redirect it
    env.update(GIT_DIR=str(repo.git_dir), GIT_WORK_TREE=str(top),
               GIT_INDEX_FILE=os.path.join(str(repo.git_dir), "index"))
    with repo.git.custom_environment(**env):
        raw = repo.git.execute(
            ["git", "--no-optional-locks", "status", "--porcelain=v1", "-z", "--untracked-files=all",
             "--ignore-submodules=dirty"],
            strip_newline_in_stdout=False,
        )
    assert isinstance(raw, str)
    changed: list[str] = []
    deleted: list[str] = []
    items = raw.split("\0")
    i = 0
    while i < len(items):
        entry = items[i]
        i += 1
        if not entry:
            continue
        code, rel = entry[:2], entry[3:]
        if code[0] in "RC":
            i += 1  # skip the source path of a rename
        if "D" in code and code[0] not in "RC":
            deleted.append(rel)
        else:
            changed.append(rel)
    return CheckoutInfo(toplevel=top, head=head, uncommitted=tuple(sorted(changed)),
                        deleted=tuple(sorted(deleted)))
