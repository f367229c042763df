"""The one rule of dcaforge's safety, enforced here:

    Nothing that came from a config, a tree, a patch, a template or a command-line value is
    executed, followed out of the room, or opened for writing through a link, unless the user
    consented (``--trust``, or a config listed in the settings file: :mod:`dcaforge.trust`).

Each part of the rule has its functions here, and every call site goes through them:

- **executed**: :func:`require_consent` before anything a config or a tree names runs (a
  ``bootstrap:`` command, a download that runs an sdist's build backend, the tree's Makefile under
  ``make -n`` and its GPU script in ``build --dry-run``); values handed to a tool are data, never
  options or code: :func:`make_goal` (a make target: no ``-option``, no ``VAR=value``, no ``$(...)``)
  and :func:`pep440_version` (``drift --sdist``: a version, not a pip argument). What dcaforge runs
  as its own job (git, GNU patch) is confined elsewhere (:mod:`dcaforge.git`, :mod:`dcaforge.confine`);
  asking for ``dcaforge build`` (not a dry run) or ``dcaforge gate`` is the consent to run the
  tree's build system and what it builds.
- **followed out**: :func:`read_regular` reads regular files only (never a FIFO, a device or a
  socket: opened non-blocking, checked with ``fstat``), bounded, and says which file could not be
  read and why; :func:`inside` tells whether a path resolves inside a folder (tree readers never
  follow a symlink out of the tree they read; paths a patch or manifest names: :mod:`dcaforge.confine`).
- **opened for writing through a link**: :func:`open_lock` (``O_NOFOLLOW``, a regular file with one
  link), :func:`release_lock` (deletes the lock only while it is still the file this run made),
  :func:`own_folder` (a folder dcaforge writes or deletes in is a real folder, not a symlink) and
  :func:`remove_leftover` (only a real folder an interrupted run left is ever removed). Files are
  written through a temporary file and a rename (:func:`dcaforge.room.cleanroom.write_all_atomic`),
  which replaces a link instead of writing through it.

Every refusal is a :class:`~dcaforge.errors.DcaforgeError` that says what, where and what to do next.
"""

from __future__ import annotations

import errno
import os
import re
import shlex
import shutil
import stat
from pathlib import Path

from dcaforge.errors import ConfigError, DcaforgeError, SafetyError

#: The most bytes a tree reader reads from one file (llama.cpp's largest sources are a few MB).
TREE_FILE_LIMIT = 64 * 1024 * 1024


class ConsentError(DcaforgeError):
    """Something a config, a tree or a command-line value names would run, and the user did not consent."""


# --- executed ---------------------------------------------------------------------------------

def require_consent(consented: bool, message: str, *, where: str, hint: str, details: str | None = None) -> None:
    """Nothing runs without consent: a :class:`ConsentError` (``message``, ``where``, ``hint``, which
    names ``--trust`` or the settings file) unless ``consented``."""
    if not consented:
        raise ConsentError(message, where=where, details=details, hint=hint)


# PEP 440's canonical public version (its appendix B): no local part, no leading "v", no spaces.
_PEP440 = re.compile(r"(?:[1-9][0-9]*!)?(?:0|[1-9][0-9]*)(?:\.(?:0|[1-9][0-9]*))*(?:(?:a|b|rc)(?:0|[1-9][0-9]*))?"
                     r"(?:\.post(?:0|[1-9][0-9]*))?(?:\.dev(?:0|[1-9][0-9]*))?")


def pep440_version(value: str, *, what: str, where: str, hint: str) -> str:
    """``value`` when it is a version (PEP 440's canonical form, e.g. ``0.3.36``, ``1.0rc1``); else a
    ConfigError: anything else (``==``, a path, a URL, a pip option) would be read by pip as more
    than a version."""
    if len(value) <= 64 and _PEP440.fullmatch(value):
        return value
    raise ConfigError(f"{what} must be a version like 0.3.36 (PEP 440), got {value!r}", where=where, hint=hint)


_GOAL_BAD = re.compile(r"[\s$=;&|<>`\\'\"\x00-\x1f\x7f]")


def make_goal(value: str, *, what: str, where: str) -> str:
    """``value`` when make can only read it as a target (a path such as ``o//llamafile/llamafile``):
    never an option (``-f``, ``--eval=...``), an assignment (``VAR=...``) or an expansion (``$(shell ...)``)."""
    if value and not value.startswith("-") and not _GOAL_BAD.search(value):
        return value
    raise ConfigError(f"{what} {value!r} is not a make target: make would read it as "
                      + ("an option" if value.startswith("-") else "an assignment or a function call" if "=" in value or "$" in value
                         else "more than one target"),
                      where=where, hint=f"give the path of a target, e.g. o//llamafile/llamafile, in {what}")


# --- followed out -----------------------------------------------------------------------------

def inside(path: Path | str, folder: Path | str) -> bool:
    """Whether ``path`` resolves (symlinks followed) to ``folder`` or something under it."""
    real, top = os.path.realpath(path), os.path.realpath(folder)
    return real == top or real.startswith(top.rstrip(os.sep) + os.sep)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISLNK, "a symlink")):
        if test(mode):
            return name
    return "not a regular file"


def _size(n: int) -> str:
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k:
            return f"{n / k:.1f} {unit}".replace(".0 ", " ")
    return f"{n} bytes"


def read_error(exc: OSError, path: Path, what: str) -> DcaforgeError:
    """An OS error while reading ``what`` at ``path``, as an error that names the file and says what to do."""
    reason = {errno.EACCES: "permission denied", errno.EPERM: "permission denied",
              errno.ELOOP: "it is a symlink (or a symlink loop), which dcaforge does not follow here",
              errno.ENOENT: "it does not exist (a dangling symlink?)", errno.EISDIR: "it is a folder",
              errno.ENXIO: "it is a socket or a device", errno.EIO: "an I/O error"}.get(exc.errno or 0, exc.strerror or str(exc))
    fix = (f"make it readable for you (`chmod u+r {shlex.quote(str(path))}`) or move it out of the way"
           if exc.errno in (errno.EACCES, errno.EPERM) else f"replace {shlex.quote(str(path))} with a regular file, or remove it")
    return DcaforgeError(f"cannot read {what} {path}: {reason}", where=str(path), hint=f"{fix}; then run the command again")


def read_regular(path: Path, *, what: str, limit: int = TREE_FILE_LIMIT, follow: bool = True) -> bytes:
    """The bytes of ``path``, a regular file (a FIFO, a device, a socket or a folder is an error, and
    never blocks: it is stat'ed first and opened non-blocking), at most ``limit`` bytes (more is an
    error naming the file and the limit); ``follow=False``: a symlink is an error too. Every OS error
    names the file (:func:`read_error`)."""
    try:
        st = os.stat(path) if follow else os.lstat(path)
        if not stat.S_ISREG(st.st_mode):
            raise DcaforgeError(f"cannot read {what} {path}: it is {_kind(st.st_mode)}, and dcaforge reads only regular files",
                                where=str(path), hint=f"replace {shlex.quote(str(path))} with a regular file, or remove it; "
                                                      "then run the command again")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW))
    except OSError as exc:
        raise read_error(exc, path, what) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # swapped between the stat and the open
            raise DcaforgeError(f"cannot read {what} {path}: it is {_kind(st.st_mode)}, and dcaforge reads only regular files",
                                where=str(path), hint=f"replace {shlex.quote(str(path))} with a regular file")
        if st.st_size > limit:
            raise DcaforgeError(f"{what} {path} is {_size(st.st_size)}, more than the {_size(limit)} dcaforge reads from one file",
                                where=str(path), hint="check that it is the file you meant (a generated or binary file?); "
                                                      "remove it from the tree or make it smaller, then run the command again")
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise DcaforgeError(f"{what} {path} grew past the {_size(limit)} dcaforge reads from one file",
                                    where=str(path), hint="check that nothing is writing to it, then run the command again")
        return b"".join(chunks)
    except OSError as exc:
        raise read_error(exc, path, what) from None
    finally:
        os.close(fd)


def regular_file(path: Path) -> bool:
    """Whether ``path`` is (resolves to) a regular file; never raises (a loop, a dangling link or a
    folder that cannot be entered is no file)."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


# --- opened for writing through a link --------------------------------------------------------

def _refuse_link(path: Path, what: str, hint: str) -> SafetyError:
    try:
        st = os.lstat(path)
        is_link = stat.S_ISLNK(st.st_mode)
        kind = f"a symlink to {os.readlink(path)}" if is_link else _kind(st.st_mode)
    except OSError:
        kind = "not a regular file"
    return SafetyError(f"{what} {path} is {kind}; dcaforge never writes or deletes through a link or into "
                       "something it did not make", where=str(path), hint=hint)


def open_lock(path: Path, what: str) -> int:
    """A read-write descriptor of the lock file ``path`` (made when missing): never through a symlink
    (``O_NOFOLLOW``), never a FIFO, device or socket (non-blocking, checked), never a file with
    another name (a hard link: writing the record would change that file too)."""
    q = shlex.quote(str(path))
    hint = (f"that is not a lock dcaforge made: move it away (`mv {q} {q}.moved`) and run the command again; "
            "dcaforge removes only what it made")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR, errno.EMLINK):
            raise _refuse_link(path, what, hint) from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        kind = _kind(st.st_mode) if not stat.S_ISREG(st.st_mode) else f"a file with {st.st_nlink} names (a hard link)"
        raise SafetyError(f"{what} {path} is {kind}; dcaforge never writes through it", where=str(path), hint=hint)
    os.set_blocking(fd, True)
    return fd


def release_lock(path: Path, fd: int) -> None:
    """Close the lock and delete its file, only while the path still names the file this run made
    (whatever was put there since, a patch written with ``capture -o`` say, stays)."""
    try:
        if os.path.samestat(os.fstat(fd), os.lstat(path)):
            os.unlink(path)
    except FileNotFoundError:
        pass
    finally:
        os.close(fd)


def own_folder(path: Path, what: str, *, hint: str | None = None) -> Path:
    """``path`` when it is a real folder or does not exist yet: dcaforge writes and deletes in it, so
    a symlink (or a file) there is refused, naming it."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return path
    if stat.S_ISDIR(st.st_mode):
        return path
    q = shlex.quote(str(path))
    raise _refuse_link(path, what, hint or f"move it away (`mv {q} {q}.moved`): dcaforge makes {what} itself; "
                                           "then run the command again")


def remove_leftover(path: Path, what: str) -> bool:
    """Remove ``path``, a folder an interrupted run of dcaforge left (a partial clone, a room being
    deleted): only a real folder, its links removed as links; anything else (a symlink, a file, a
    FIFO) is refused, naming it. Returns whether something was removed."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(st.st_mode):
        q = shlex.quote(str(path))
        raise _refuse_link(path, what, f"dcaforge keeps {what} there; move that away (`mv {q} {q}.moved`) and run "
                                       "the command again")
    shutil.rmtree(path)  # never follows a link inside (it unlinks the link)
    return True


def no_link_between(folder: Path, rel: str, what: str) -> Path:
    """``folder/rel`` for writing: every folder between ``folder`` and the file is a real folder (made
    when missing), so the write cannot leave ``folder`` through a symlinked folder."""
    cur = folder
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    for part in parts[:-1]:
        cur = cur / part
        own_folder(cur, f"the folder of {what}")
        if not cur.exists():
            cur.mkdir()
    return folder.joinpath(*parts)
