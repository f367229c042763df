"""The clean room: a git repository dcaforge made, with a marker, a lock and a state file.

Layout of a room ``<workspace>/<name>``:

- ``.git/dcaforge/marker.json``: says dcaforge made this folder; only such folders are ever
  reset or deleted.
- ``.git/dcaforge/state.json``: source, start commit, series, progress, baseline, rendered
  files, last capture (written atomically).
- ``<workspace>/<name>.lock`` beside the room: the pid of the run that owns it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import Config
from .errors import DcaforgeError, LockedError, SafetyError
from .git import git, git_out

MARKER_VERSION = 1
BASELINE_TAG = "dcaforge/baseline"
START_TAG = "dcaforge/start"


def write_atomic(path: Path, data: bytes, mode: int | None = None) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
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
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


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

    def exists(self) -> bool:
        return self.path.exists()

    def is_ours(self) -> bool:
        return self.marker.is_file()

    def require(self) -> None:
        """The room must exist and be dcaforge's."""
        if not self.exists():
            raise DcaforgeError(f"no clean room at {self.path}", where=str(self.path),
                                hint="dcaforge apply")
        if not self.is_ours():
            raise SafetyError(f"{self.path} exists but was not made by dcaforge (no marker)",
                              where=str(self.marker),
                              hint="move that folder away, or choose another 'name:'/'cleanroom:'")

    def check_can_create(self) -> None:
        if self.exists() and not self.is_ours() and any(self.path.iterdir()):
            raise SafetyError(
                f"{self.path} exists, is not empty and was not made by dcaforge; refusing to touch it",
                where=str(self.path),
                hint="move that folder away, or choose another 'name:'/'cleanroom:' in the config")

    # --- state ----------------------------------------------------------------------
    def load_state(self) -> dict[str, Any]:
        try:
            return dict(json.loads(self.state_file.read_text()))
        except FileNotFoundError:
            return {}
        except ValueError as exc:
            raise DcaforgeError(f"the clean room's state file is corrupt: {exc}", where=str(self.state_file),
                                hint="dcaforge apply --fresh") from None

    def save_state(self, state: dict[str, Any]) -> None:
        write_atomic(self.state_file, dump_json(state))

    def update_state(self, **changes: Any) -> dict[str, Any]:
        state = self.load_state()
        state.update(changes)
        self.save_state(state)
        return state

    # --- making and removing ----------------------------------------------------------
    def mark(self, info: dict[str, Any]) -> None:
        write_atomic(self.marker, dump_json({"dcaforge": MARKER_VERSION, **info}))

    def delete(self) -> None:
        """Delete the room; only ever a folder with dcaforge's marker."""
        if not self.exists():
            return
        if not self.is_ours():
            raise SafetyError(f"refusing to delete {self.path}: it has no dcaforge marker",
                              where=str(self.path), hint="move that folder away by hand if you mean it")
        trash = self.workspace / f".{self.path.name}.deleting"
        if trash.exists():
            shutil.rmtree(trash)
        os.replace(self.path, trash)
        shutil.rmtree(trash)

    def reset_hard(self, rev: str = "HEAD", *, everything: bool = False) -> None:
        """Back to ``rev``: tracked changes dropped, untracked files removed (ignored ones,
        such as build folders, only with ``everything``)."""
        if not self.is_ours():
            raise SafetyError(f"refusing to reset {self.path}: it has no dcaforge marker",
                              where=str(self.path))
        git(self.path, "reset", "-q", "--hard", rev)
        git(self.path, "clean", "-q", "-ffdx" if everything else "-fd")

    def head(self) -> str:
        return git_out(self.path, "rev-parse", "HEAD")


@contextlib.contextmanager
def locked(room: Room) -> Iterator[None]:
    """Hold the room's lock (a file with our pid) for the duration; a stale lock is taken over."""
    room.workspace.mkdir(parents=True, exist_ok=True)
    path = room.lock_file
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                pid = int(path.read_text().strip() or "0")
            except (OSError, ValueError):
                pid = 0
            if pid and pid != os.getpid() and _alive(pid):
                raise LockedError(f"another dcaforge run (pid {pid}) holds the clean room {room.path}",
                                  where=str(path),
                                  hint=f"wait for it to finish; if pid {pid} is not dcaforge, delete {path}") from None
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)  # stale
            continue
        with os.fdopen(fd, "w") as fh:
            fh.write(f"{os.getpid()}\n")
        break
    else:  # pragma: no cover - raced twice
        raise LockedError(f"could not take the lock {path}", where=str(path), hint="try again")
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError as exc:
        return exc.errno == errno.EPERM
    return True
