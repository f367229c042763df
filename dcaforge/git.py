"""The one place that runs git and patch.

Every command goes through :func:`run`: an argv list (never a shell), an explicit ``cwd``,
utf-8, logged, and a failure raises :class:`~dcaforge.errors.CommandError` with the stderr
tail. git always runs under an isolated configuration (no global or system config, a fixed
identity and date, no signing, hooks off) so what dcaforge commits and captures does not
depend on the user's git setup.

git can be made to run commands by its configuration (``core.fsmonitor``, hooks, filter and
diff/merge drivers, ``core.sshCommand``, ``ext::`` URLs, ``include``...). So every call pins the
settings that name commands (:data:`GIT_CONFIG_ARGS`), and before a call in a repository, that
repository's own ``.git/config`` is read (as data, never through git's include machinery) and
refused when it holds anything beyond what git itself writes there (:func:`config_problems`);
:func:`repair_repo_config` rewrites such a config with only those entries.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import re
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dcaforge.errors import CommandError, SafetyError, ToolchainError

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
    # settings that name commands: none may come from a repository's own config
    "-c", "core.fsmonitor=",
    "-c", "core.sshCommand=ssh",
    "-c", "credential.helper=",
    "-c", f"core.attributesFile={os.devnull}",
    "-c", "protocol.ext.allow=never",
    "-c", "submodule.recurse=false",
    "-c", "diff.noprefix=false",
)

#: Environment variables of GNU patch that change what it does (RCS/SCCS checkouts, POSIX mode,
#: backups, how it quotes the names it prints): dropped, then set to fixed values.
PATCH_ENV_DROP = ("POSIXLY_CORRECT", "PATCH_GET", "PATCH_VERSION_CONTROL", "VERSION_CONTROL", "SIMPLE_BACKUP_SUFFIX",
                  "QUOTING_STYLE")

#: What a clean room's .git/config may hold: what `git clone`, `git submodule` and the user's
#: identity write there. Everything else (fsmonitor, hooksPath, filters, drivers, include,
#: core.worktree, url rewrites, extensions that read more files...) is refused or removed.
_ALLOWED_CONFIG = re.compile(
    r"^(?:core\.(?:repositoryformatversion|filemode|bare|logallrefupdates|symlinks|ignorecase|precomposeunicode)"
    r"|remote\..+\.(?:url|fetch|pushurl)|branch\..+\.(?:remote|merge)"
    r"|submodule\..+\.(?:url|active|branch|ignore|fetchrecursesubmodules|shallow|update)"
    r"|user\.(?:name|email)|extensions\.objectformat)$")
#: ``submodule.X.update`` names a command when it starts with ``!``: only git's own modes pass.
_SUBMODULE_UPDATE = re.compile(r"^submodule\..+\.update$")
_UPDATE_MODES = frozenset({"checkout", "rebase", "merge", "none"})


def _allowed(key: str, value: str) -> bool:
    if not _ALLOWED_CONFIG.match(key):
        return False
    return not _SUBMODULE_UPDATE.match(key) or value.strip() in _UPDATE_MODES


#: A submodule's own git dir also records where its work tree is.
_ALLOWED_MODULE_CONFIG = re.compile(r"^core\.worktree$")


def isolated_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for every subprocess: no GIT_* from outside, isolated git config."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_") and k not in PATCH_ENV_DROP}
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
            "QUOTING_STYLE": "literal",
            "PATCH_GET": "0",
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


def tail(text: str, lines: int = 15) -> str:
    """The last ``lines`` lines of a command's output (an error's details)."""
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
    try:
        proc = subprocess.run(
            args,
            cwd=os.fspath(cwd),
            env=isolated_env(env),
            input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
            capture_output=True,
            check=False,
        )
    except FileNotFoundError:
        if not Path(cwd).is_dir():
            raise CommandError(f"cannot run {args[0]}: the folder {cwd} is gone", where=str(cwd),
                               hint=hint or "run the command again") from None
        raise missing_tool(args[0]) from None
    except PermissionError as exc:
        raise ToolchainError(f"cannot run {args[0]}: {exc.strerror}", where=str(args[0]),
                             hint=f"make {args[0]} executable, or put a working one first on PATH") from None
    if proc.returncode in (-signal.SIGINT, -signal.SIGTERM, -signal.SIGHUP):
        # the child died of the Ctrl-C (or kill) that is about to reach us: stop here, not with a
        # bogus "command failed"
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
            details=tail(res.stderr or res.stdout),
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


INSTALL_HINTS = {
    "git": "install git (e.g. `apt-get install git`, `dnf install git`, `brew install git`) and run the command again",
    "patch": "install GNU patch (e.g. `apt-get install patch`, `dnf install patch`, `brew install gpatch` and put its "
             "`patch` first on PATH) and run the command again",
    "bash": "install bash, or write the bootstrap step as an argv list",
}


def missing_tool(name: str) -> ToolchainError:
    base = os.path.basename(name)
    return ToolchainError(f"{base} is not installed (or not on PATH)", where=f"PATH={os.environ.get('PATH', '')}",
                          hint=INSTALL_HINTS.get(base, f"install {base}, or fix the command, and run again"))


# --- a repository's own config --------------------------------------------------------------

def _config_file(cwd: Path) -> tuple[Path, bool] | None:
    """The config git reads for a repository whose work tree is ``cwd`` (its .git folder, or the
    git dir a .git file points at, or that one's common dir), and whether it is a linked one."""
    dotgit = cwd / ".git"
    if dotgit.is_dir() and not dotgit.is_symlink():
        return dotgit / "config", False
    if dotgit.is_file():
        try:
            text = dotgit.read_text(encoding="utf-8", errors="replace").strip()
        except OSError:
            return None
        if not text.startswith("gitdir:"):
            return None
        gitdir = (cwd / text[len("gitdir:"):].strip())
        common = gitdir / "commondir"
        if common.is_file():
            gitdir = gitdir / common.read_text(encoding="utf-8", errors="replace").strip()
        return gitdir / "config", True
    return None


def read_config(path: Path) -> list[tuple[str, str]] | None:
    """The entries (key as git lists it, value) of a git config file, read by git's own parser as a
    plain file (``git config -f FILE --no-includes``: no include followed, nothing run); [] when
    there is no such file, None when git cannot read it (then no git call there would work)."""
    if not path.is_file():
        return []
    # from / : git would read the config of a repository around the working folder, the broken one included
    res = run(["git", "config", "-f", str(path), "--no-includes", "--list", "-z"], Path("/"), check=False)
    if not res.ok:
        return None
    entries = []
    for item in res.stdout_bytes.split(b"\0"):
        if not item:
            continue
        key, _, value = item.decode("utf-8", "surrogateescape").partition("\n")
        entries.append((key, value))
    return entries


def config_problems(path: Path, *, module: bool = False) -> list[str]:
    """Keys of the config at ``path`` that dcaforge does not allow in a repository it runs git in."""
    entries = read_config(path)
    if entries is None:
        return [f"(a line dcaforge cannot read in {path.name})"]
    bad = []
    for key, value in entries:
        if _allowed(key, value) or (module and _ALLOWED_MODULE_CONFIG.match(key)):
            continue
        bad.append(key)
    return sorted(set(bad))


_CLEAN_CONFIGS: set[tuple[str, bool]] = set()


def guard_repo(cwd: Path) -> None:
    """Refuse to run git in ``cwd`` when the repository's own config could make git run a command."""
    found = _config_file(Path(cwd))
    if found is None:
        return
    path, module = found
    try:
        data = path.read_bytes()
    except OSError:
        return
    key = (hashlib.sha256(data).hexdigest(), module)
    if key in _CLEAN_CONFIGS:
        return
    bad = config_problems(path, module=module)
    if bad:
        raise SafetyError(
            f"{path} holds settings dcaforge does not allow, which could make git run commands: {', '.join(bad[:8])}"
            + (" ..." if len(bad) > 8 else ""),
            where=str(path),
            hint="any dcaforge command that takes the clean room (apply, render, capture, verify) removes them and "
                 "says so; or `dcaforge apply --fresh` makes the room again")
    _CLEAN_CONFIGS.add(key)


def repair_repo_config(gitdir: Path) -> list[str]:
    """Rewrite ``gitdir/config`` with only the entries dcaforge allows; returns the keys removed."""
    path = gitdir / "config"
    entries = read_config(path)
    if entries is None:
        bad = config_problems(path)
        entries = [("core.repositoryformatversion", "0"), ("core.filemode", "true"), ("core.bare", "false"),
                   ("core.logallrefupdates", "true")]
    else:
        bad = sorted({k for k, v in entries if not _allowed(k, v)})
        entries = [(k, v) for k, v in entries if _allowed(k, v)]
    if not bad:
        return []
    tmp = gitdir / "config.dcaforge-repair"
    tmp.write_bytes(b"")
    try:
        for key, value in entries:
            run(["git", "config", "-f", str(tmp), "--add", key, value], Path("/"), what="git config (repairing the clean room)",
                hint="`dcaforge apply --fresh` makes the clean room again")
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return bad


def git(
    cwd: Path,
    *args: str | os.PathLike[str],
    env: Mapping[str, str] | None = None,
    input: bytes | None = None,
    check: bool = True,
    what: str | None = None,
    hint: str | None = None,
) -> Result:
    """Run git with the isolated configuration in ``cwd`` (refused when the repository's own
    config there could make git run a command: :func:`guard_repo`)."""
    guard_repo(Path(cwd))
    return run(["git", *GIT_CONFIG_ARGS, *args], cwd, env=env, input=input, check=check,
               what=what or f"git {args[0] if args else ''}".strip(), hint=hint)


def git_out(cwd: Path, *args: str | os.PathLike[str], env: Mapping[str, str] | None = None) -> str:
    """stdout of a git command, stripped."""
    return git(cwd, *args, env=env).stdout.strip()


@functools.lru_cache(maxsize=1)
def _gnu_patch() -> None:
    res = run(["patch", "--version"], Path.cwd() if Path.cwd().is_dir() else Path("/"), check=False)
    if "GNU patch" not in res.stdout:
        raise ToolchainError("`patch` on PATH is not GNU patch (dcaforge needs its options: --fuzz=0, --dry-run, -p)",
                             where=(res.stdout or res.stderr).strip().splitlines()[0] if (res.stdout or res.stderr).strip()
                             else "patch --version", hint=INSTALL_HINTS["patch"])


def patch_cmd(cwd: Path, patch_file: Path, *, dry_run: bool, strip: int = 1) -> Result:
    """GNU patch, never with fuzz, no backups, no questions, no version-control checkouts
    (``--get=0``); the result is not checked."""
    _gnu_patch()
    argv = ["patch", f"-p{strip}", "--fuzz=0", "--no-backup-if-mismatch", "--force", "--get=0",
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
