"""The clean room: a git repository dcaforge made, with a marker, a lock and a state file.

Layout of a room ``<workspace>/<name>``:

- ``.git/dcaforge/marker.json``: says dcaforge made this folder; only such folders are ever
  reset or deleted.
- ``.git/dcaforge/state.json``: source, start commit, series, progress, baseline, rendered
  files, last capture (written atomically; :mod:`dcaforge.room.state`).
- ``<workspace>/<name>.lock`` beside the room: held (``flock``) by the run that owns the room and
  recording it (pid, host, start, command); the kernel drops the hold when that process ends, however
  it ends, so a lock is never stale and two runs can never both hold it.

Taking the lock also recovers from an interrupted run: git's own ``*.lock`` files that no live
process holds open are removed (and the user is told), temporary indexes of dead runs go, and a
``.git/config`` holding settings that could make git run commands is rewritten without them.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dcaforge import guard
from dcaforge.config import Config
from dcaforge.errors import DcaforgeError, LockedError, SafetyError
from dcaforge.git import git, git_out, repair_repo_config
from dcaforge.room.state import RoomState, read_state

log = logging.getLogger("dcaforge")

MARKER_VERSION = 1
BASELINE_TAG = "dcaforge/baseline"
START_TAG = "dcaforge/start"


_OS_REASONS = {
    errno.EACCES: ("permission denied", "make {dir} writable for you, or choose another place"),
    errno.EPERM: ("operation not permitted", "make {dir} writable for you, or choose another place"),
    errno.ENOSPC: ("the disk is full", "free some space on that disk (`df -h {dir}`)"),
    errno.EDQUOT: ("the disk quota is used up", "free some space within your quota (`quota -s`)"),
    errno.EFBIG: ("the file would be larger than this process may write (`ulimit -f`)", "raise the limit (`ulimit -f unlimited`)"),
    errno.EROFS: ("the file system is read-only", "choose a place on a writable file system"),
    errno.EISDIR: ("it is a folder", "give the path of a file, not of a folder"),
    errno.ENOTDIR: ("a part of its path is a file, not a folder", "check the path"),
    errno.ENAMETOOLONG: ("the name is too long", "choose a shorter path"),
    errno.EEXIST: ("something else is there", "move it away"),
}


def os_error(exc: OSError, path: Path, what: str) -> DcaforgeError:
    """An OS error while writing ``what`` at ``path``, as an error that says what, where and what next."""
    reason, fix = _OS_REASONS.get(exc.errno or 0, (exc.strerror or str(exc), "fix that and run the command again"))
    return DcaforgeError(f"cannot write {what} {path}: {reason}; nothing was written",
                         where=str(exc.filename or path),
                         hint=fix.format(dir=path.parent) + ", then run the same command again")


def write_all_atomic(items: Sequence[tuple[Path, bytes, int | None]], what: str = "the file") -> None:
    """Write every ``(path, data, mode)`` through a temporary file beside it: all are written and
    synced before the first rename, so an OS error (EACCES, ENOSPC, EISDIR, EROFS, EFBIG...) leaves
    every destination as it was (and raises :func:`os_error`). ``mode`` None keeps the old file's."""
    temps: list[tuple[str, Path]] = []
    current = items[0][0] if items else Path(".")
    try:
        for path, data, mode in items:
            current = path
            if path.is_dir() and not path.is_symlink():
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            temps.append((tmp, path))
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            if mode is not None:
                os.chmod(tmp, mode)
            elif path.exists():
                os.chmod(tmp, path.stat().st_mode & 0o7777)
            else:
                os.chmod(tmp, 0o644)
        for tmp, path in temps:
            current = path
            os.replace(tmp, path)
    except OSError as exc:
        for tmp, _path in temps:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise os_error(exc, current, what) from None
    except BaseException:
        for tmp, _path in temps:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise


def write_atomic(path: Path, data: bytes, mode: int | None = None, what: str = "the file") -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename."""
    write_all_atomic([(path, data, mode)], what)


def dump_json(data: Any) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()


@dataclass(frozen=True)
class Room:
    path: Path
    workspace: Path

    @classmethod
    def of(cls, cfg: Config) -> Room:
        return cls(path=cfg.room, workspace=cfg.workspace)

    @property
    def meta(self) -> Path:
        return self.path / ".git" / "dcaforge"

    @property
    def marker(self) -> Path:
        return self.meta / "marker.json"

    @property
    def state_file(self) -> Path:
        return self.meta / "state.json"

    @property
    def lock_file(self) -> Path:
        return self.workspace / f"{self.path.name}.lock"

    def own_paths(self) -> dict[Path, str]:
        """What dcaforge makes beside the room in the workspace, by what it is: nothing else may be
        written there (``capture -o`` onto one of them would be deleted or replaced by the next run)."""
        ws, name = self.workspace, self.path.name
        return {self.lock_file: "the clean room's lock", ws / f".{name}.creating": "a clean room being made",
                ws / f".{name}.deleting": "a clean room being deleted", ws / f"{name}-baseline": "the baseline worktree",
                ws / f".{name}-baseline.parked": "the baseline's parked build folders",
                ws / f"{name}-gates": "the gates' output folder"}

    def exists(self) -> bool:
        return self.path.exists()

    def is_ours(self) -> bool:
        """A real folder (never a symlink to one) holding dcaforge's marker."""
        return not self.path.is_symlink() and guard.regular_file(self.marker)

    def require(self) -> None:
        """The room must exist and be dcaforge's (a real folder, not a symlink to one)."""
        guard.own_folder(self.path, "the clean room")
        if not self.exists():
            raise DcaforgeError(f"no clean room at {self.path}", where=str(self.path),
                                hint="`dcaforge apply`")
        if not self.is_ours():
            raise SafetyError(f"{self.path} exists but was not made by dcaforge (no marker)",
                              where=str(self.marker),
                              hint="move that folder away, or choose another 'name:'/'cleanroom:'")

    def check_can_create(self) -> None:
        guard.own_folder(self.path, "the clean room")
        if self.exists() and not self.is_ours() and any(self.path.iterdir()):
            raise SafetyError(
                f"{self.path} exists, is not empty and was not made by dcaforge; refusing to touch it",
                where=str(self.path),
                hint="move that folder away, or choose another 'name:'/'cleanroom:' in the config")

    # --- state ----------------------------------------------------------------------
    def load_state(self) -> RoomState:
        return read_state(self.state_file)

    def save_state(self, state: RoomState) -> None:
        write_atomic(self.state_file, state.dump(), what="the clean room's state")

    def update_state(self, **changes: Any) -> RoomState:
        """Set the fields named (:class:`RoomState`'s) and write the state file."""
        state = replace(self.load_state(), **changes)
        self.save_state(state)
        return state

    # --- making and removing ----------------------------------------------------------
    def mark(self, info: dict[str, Any]) -> None:
        write_atomic(self.marker, dump_json({"dcaforge": MARKER_VERSION, **info}), what="the clean room's marker")

    def delete(self) -> None:
        """Delete the room; only ever a folder with dcaforge's marker."""
        if not self.exists():
            return
        if not self.is_ours():
            raise SafetyError(f"refusing to delete {self.path}: it has no dcaforge marker",
                              where=str(self.path), hint="move that folder away by hand if you mean it")
        trash = self.workspace / f".{self.path.name}.deleting"
        guard.remove_leftover(trash, "a clean room being deleted")
        guard.own_folder(self.path, "the clean room")
        os.replace(self.path, trash)
        shutil.rmtree(trash)

    def reset_hard(self, rev: str = "HEAD", *, everything: bool = False) -> None:
        """Back to ``rev``: tracked changes dropped, untracked files removed (ignored ones,
        such as build folders, only with ``everything``)."""
        if not self.is_ours():
            raise SafetyError(f"refusing to reset {self.path}: it has no dcaforge marker",
                              where=str(self.path))
        git(self.path, "reset", "-q", "--hard", rev, "--")
        git(self.path, "clean", "-q", "-ffdx" if everything else "-fd")

    def head(self) -> str:
        return git_out(self.path, "rev-parse", "HEAD")


    def recover(self) -> list[str]:
        """After an interrupted run (called with the room locked): remove git's lock files that no
        live process holds, temporary indexes of runs that are gone, and settings in .git/config
        that could make git run commands. Returns what it did, as messages (also logged)."""
        if not self.is_ours():
            return []
        done: list[str] = []
        gitdir = self.path / ".git"
        stale = [p for p in _git_lock_files(gitdir)]
        if stale:
            held = _open_by_someone(stale)
            if held is None:  # no /proc: only locks older than an hour are surely stale
                held = {p for p in stale if time.time() - p.stat().st_mtime < 3600}
            busy = [p for p in stale if p in held]
            if busy:
                raise LockedError(f"git is running in the clean room (it holds {busy[0].relative_to(self.path)})",
                                  where=str(busy[0]),
                                  hint=f"wait for that git command to finish; if none runs, delete {busy[0]}")
            for p in stale:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(p)
            done.append("removed " + ", ".join(str(p.relative_to(self.path)) for p in stale)
                        + " left by an interrupted git (no process held it)")
        for p in self.meta.glob("index.tmp.*") if self.meta.is_dir() else []:
            pid = p.name.rsplit(".", 1)[-1]
            if pid.isdigit() and not _alive(int(pid)):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(p)
        removed = repair_repo_config(gitdir)
        if removed:
            done.append(f"removed from {gitdir / 'config'} settings that could make git run commands: "
                        + ", ".join(removed[:8]) + (" ..." if len(removed) > 8 else ""))
        for msg in done:
            log.warning("%s", msg)
        return done


def _git_lock_files(gitdir: Path) -> list[Path]:
    """git's ``*.lock`` files in a git dir (its objects left out), submodules' git dirs included."""
    out: list[Path] = []
    if not gitdir.is_dir():
        return out
    for dirpath, dirnames, filenames in os.walk(gitdir):
        if dirpath == str(gitdir):
            dirnames[:] = [d for d in dirnames if d not in ("objects", "dcaforge")]
        else:
            dirnames[:] = [d for d in dirnames if d != "objects"]
        out += [Path(dirpath) / f for f in filenames if f.endswith(".lock")]
    return sorted(out)


def _open_by_someone(paths: list[Path]) -> set[Path] | None:
    """Which of ``paths`` some live process has open (read from /proc), or None without /proc."""
    proc = Path("/proc")
    if not (proc / "self" / "fd").is_dir():
        return None
    want = {os.path.realpath(p): p for p in paths}
    held: set[Path] = set()
    for pid_dir in proc.iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            fds = list((pid_dir / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target in want:
                held.add(want[target])
    return held


_HELD: dict[str, tuple[int, int]] = {}  # lock path -> (fd, depth): this process holds it


def _describe_holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode("utf-8", "replace") or "{}")
    except (OSError, ValueError):
        info = {}
    if not isinstance(info, dict) or "pid" not in info:
        return "another dcaforge run"
    return (f"another dcaforge run (pid {info.get('pid')} on {info.get('host', '?')}, since {info.get('start', '?')}"
            + (f": {info['command']}" if info.get("command") else "") + ")")


@contextlib.contextmanager
def locked(room: Room) -> Iterator[None]:
    """Hold the room's lock for the duration (re-entrant within one process). The lock is an
    ``flock`` on ``<workspace>/<name>.lock``, so the kernel releases it when the holder dies, however
    it dies, and two runs can never both take it; the file records the holder (pid, host, start).
    It is opened without following a link and must be a regular file of one name (:func:`guard.open_lock`),
    and deleted on release only while it is still the file this run locked (:func:`guard.release_lock`).
    Taking it runs :meth:`Room.recover`, and clears leftovers of an interrupted creation or deletion
    (only real folders: :func:`guard.remove_leftover`)."""
    path = room.lock_file
    try:
        guard.own_folder(room.workspace, "the clean-room workspace")
        room.workspace.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise os_error(exc, room.workspace, "the clean-room workspace") from None
    key = str(path)
    if key in _HELD:
        fd, depth = _HELD[key]
        _HELD[key] = (fd, depth + 1)
        try:
            yield
        finally:
            _HELD[key] = (fd, _HELD[key][1] - 1)
        return
    for _attempt in range(100):
        try:
            fd = guard.open_lock(path, "the clean room's lock")
        except OSError as exc:
            raise os_error(exc, path, "the clean room's lock") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _describe_holder(fd)
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
                raise LockedError(f"{holder} holds the clean room {room.path}", where=str(path),
                                  hint="wait for it to finish and run the command again (the lock goes with its "
                                       "process, even a killed one)") from None
            raise os_error(exc, path, "the clean room's lock") from None
        # the file we locked must still be the one at the path (a holder unlinks it on release)
        try:
            same = os.path.samestat(os.fstat(fd), os.lstat(path))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    else:  # pragma: no cover - lost the race a hundred times
        raise LockedError(f"could not take the lock {path}", where=str(path), hint="run the command again")
    record = {"pid": os.getpid(), "host": socket.gethostname(),
              "start": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": " ".join(sys.argv)[:300]}
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
    except OSError as exc:
        guard.release_lock(path, fd)
        raise os_error(exc, path, "the clean room's lock") from None
    _HELD[key] = (fd, 1)
    try:
        for leftover in (room.workspace / f".{room.path.name}.deleting", room.workspace / f".{room.path.name}.creating"):
            if guard.remove_leftover(leftover, "what an interrupted run leaves"):
                log.warning("removed %s, left by an interrupted run", leftover)
        room.recover()
        yield
    finally:
        del _HELD[key]
        guard.release_lock(path, fd)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError as exc:
        return exc.errno == errno.EPERM
    return True
