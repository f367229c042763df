"""Where the base tree comes from: a git repository (URL or local checkout) or a PyPI sdist.

A PyPI source is downloaded once with pip into dcaforge's cache, unpacked, and its ``subdir``
imported into a bare repository there as ONE commit with a fixed author, committer, date and
message: the base commit id is the same on every machine. Clean rooms clone from that cache.

A local git checkout is only ever read: dcaforge clones its committed state and lists the
uncommitted files it left behind (``--include-wip`` copies them into the clean room).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shlex
import shutil
import sys
import tarfile
import tempfile
import threading
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dcaforge import confine
from dcaforge import trust as consent
from dcaforge.checkout import CheckoutInfo, inspect_checkout
from dcaforge.config import Config, GitSource, PypiSource
from dcaforge.errors import CommandError, ConfigError, SafetyError
from dcaforge.git import git, git_out, is_inside, run_streaming


def cache_root() -> Path:
    """``$DCAFORGE_CACHE``, else ``$XDG_CACHE_HOME/dcaforge``, else ``~/.cache/dcaforge``; a relative
    ``XDG_CACHE_HOME`` is ignored (the XDG spec: it is invalid), so the cache never lands in the
    folder the user stands in (a checkout)."""
    env = os.environ.get("DCAFORGE_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    return (Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache") / "dcaforge"


@dataclass(frozen=True)
class BaseSource:
    """A repository to clone the clean room from, and what it is."""

    clone_url: str
    ref: str
    description: str
    checkout: CheckoutInfo | None = None  # the user's local checkout, when the source is one
    submodules: bool | tuple[str, ...] = False


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")[:60]


def sdist_dir(requirement: str) -> Path:
    """Where the sdist of ``requirement`` is kept in the cache (put it there to skip the download)."""
    return cache_root() / "sdists" / _slug(requirement)


def _key(src: PypiSource) -> str:
    digest = hashlib.sha256(f"{src.requirement}\0{src.subdir}".encode()).hexdigest()[:12]
    return f"{_slug(src.requirement)}-{digest}"


def import_message(src: PypiSource) -> str:
    return f"dcaforge: import {src.requirement} ({src.subdir})\n"


#: pip's line naming the file it downloads and its size: "  Downloading llama_cpp_python-0.3.36.tar.gz (76.6 MB)"
_PIP_DOWNLOADING = re.compile(r"Downloading \S+ \((\d+(?:\.\d+)?) (bytes|kB|MB|GB)\)")
_UNITS = {"bytes": 1, "kB": 10**3, "MB": 10**6, "GB": 10**9}
ARCHIVES = (".tar.gz", ".zip", ".tgz")

#: ``(bytes so far, total or None)``, called from another thread while pip downloads
DownloadProgress = Callable[[int, "int | None"], None]


def pip_download_size(line: str) -> int | None:
    """The size pip announces on its ``Downloading NAME (76.6 MB)`` line, in bytes; None for other lines."""
    m = _PIP_DOWNLOADING.search(line)
    return int(float(m.group(1)) * _UNITS[m.group(2)]) if m else None


def downloaded_bytes(pip_tmp: Path) -> int:
    """What pip has written so far of the archive it downloads: pip downloads into a folder of its own under its
    temporary folder (``pip-unpack-*``), then copies the file to ``-d``."""
    total = 0
    for folder in pip_tmp.glob("pip-unpack-*"):
        for f in folder.iterdir():
            if f.name.endswith(ARCHIVES):
                with contextlib.suppress(OSError):
                    total += f.stat().st_size
    return total


def download_sdist(requirement: str, dest: Path, may_run: Callable[[str], None] | None = None,
                   on_progress: DownloadProgress | None = None) -> Path:
    """The sdist of ``requirement`` in ``dest`` (downloaded with pip unless already there).

    pip prepares an sdist's metadata by running its build backend (the package's own code), so a
    download is a command: ``may_run(requirement)`` raises when the config is not trusted.
    ``on_progress``: the bytes pip has downloaded (read from its temporary folder a few times a second) and the
    size it announced."""
    found = sorted(p for p in dest.glob("*") if p.name.endswith(ARCHIVES))
    if found:
        return found[0]
    if may_run is not None:
        may_run(requirement)
    dest.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".dl-", dir=dest))
    pip_tmp = tmp / "pip-tmp"
    pip_tmp.mkdir()
    log_file = tmp / "pip.log"
    size: list[int | None] = [None]
    stop = threading.Event()

    def watch() -> None:
        last = -1
        while not stop.wait(0.2):
            done = max(downloaded_bytes(pip_tmp), last)  # pip moves the whole file on: never backwards
            if done != last and on_progress is not None:
                on_progress(done, size[0])
                last = done

    def on_line(line: str) -> None:
        announced = pip_download_size(line)
        if announced is not None:
            size[0] = announced

    watcher = threading.Thread(target=watch, name="dcaforge-download", daemon=True)
    try:
        if on_progress is not None:
            watcher.start()
        rc = run_streaming([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                            "--disable-pip-version-check", "--progress-bar", "off", "-d", str(tmp), "--", requirement],
                           dest, log_file=log_file, on_line=on_line, env={"TMPDIR": str(pip_tmp)})
        stop.set()
        if watcher.is_alive():
            watcher.join()
        if rc != 0:
            tail = "\n".join(log_file.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-15:])
            raise CommandError(f"pip download {requirement} failed (exit {rc})", where=str(dest), details=tail,
                               hint="check the requirement and your network or pip index; the sdist is cached after "
                                    "one success")
        got = sorted(p for p in tmp.iterdir() if p.name.endswith(ARCHIVES))
        if not got:
            raise CommandError(f"pip downloaded no sdist for {requirement}", where=str(tmp),
                               hint="the package may ship wheels only; use a git source instead")
        if on_progress is not None:
            n = got[0].stat().st_size
            on_progress(n, n)
        final = dest / got[0].name
        os.replace(got[0], final)
        return final
    finally:
        stop.set()
        if watcher.is_alive():
            watcher.join()
        shutil.rmtree(tmp, ignore_errors=True)


def _unpack(archive: Path, into: Path) -> Path:
    """Unpack an sdist; returns its single top folder (or ``into``)."""
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(into)
    else:
        with tarfile.open(archive) as tf:
            if hasattr(tarfile, "data_filter"):
                tf.extractall(into, filter="data")
            else:  # pragma: no cover - Python < 3.11.4
                tf.extractall(into)
    entries = list(into.iterdir())
    return entries[0] if len(entries) == 1 and entries[0].is_dir() else into


def _drop_nested_git(tree: Path) -> None:
    """Remove ``.git`` files and folders inside an unpacked tree (sdists carry dangling
    ``gitdir:`` files of the submodules they were made from)."""
    for dirpath, dirnames, filenames in os.walk(tree):
        if ".git" in filenames:
            os.unlink(os.path.join(dirpath, ".git"))
        if ".git" in dirnames:
            shutil.rmtree(os.path.join(dirpath, ".git"))
            dirnames.remove(".git")


def prepare_pypi(src: PypiSource, may_run: Callable[[str], None] | None = None,
                 on_download: DownloadProgress | None = None) -> BaseSource:
    """Download (once) and import (once) a PyPI sdist's subdir as a one-commit repository
    (``may_run``: see :func:`download_sdist`)."""
    root = cache_root()
    key = _key(src)
    bare = root / "bases" / f"{key}.git"
    bare.parent.mkdir(parents=True, exist_ok=True)
    with open(bare.parent / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two runs importing the same sdist take turns
        return _prepare_pypi_locked(src, root, bare, may_run, on_download)


def _prepare_pypi_locked(src: PypiSource, root: Path, bare: Path, may_run: Callable[[str], None] | None,
                         on_download: DownloadProgress | None = None) -> BaseSource:
    if (bare / "dcaforge-import-done").is_file():
        commit = (bare / "dcaforge-import-done").read_text().strip()
        return BaseSource(clone_url=str(bare), ref=commit, description=src.describe())
    archive = download_sdist(src.requirement, sdist_dir(src.requirement), may_run, on_download)
    (root / "tmp").mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="import-", dir=root / "tmp"))
    try:
        top = _unpack(archive, work / "unpacked")
        tree = (top / src.subdir).resolve()
        if not is_inside(tree, top) or not tree.is_dir():
            raise ConfigError(f"subdir {src.subdir!r} is not a folder of {archive.name}",
                              where=f"source.subdir ({archive})",
                              hint=f"look inside: `tar tzf {shlex.quote(str(archive))} | head`")
        _drop_nested_git(tree)
        tmp_bare = work / "base.git"
        git(work, "init", "-q", "--bare", str(tmp_bare))
        gd = ["--git-dir", str(tmp_bare), "--work-tree", str(tree)]
        git(work, *gd, "add", "-A", "-f", ".")
        git(work, *gd, "commit", "-q", "--no-verify", "-m", import_message(src))
        commit = git_out(work, "--git-dir", str(tmp_bare), "rev-parse", "HEAD")
        os.unlink(tmp_bare / "index")
        (tmp_bare / "dcaforge-import-done").write_text(commit + "\n")
        bare.parent.mkdir(parents=True, exist_ok=True)
        if bare.exists():
            shutil.rmtree(bare)
        os.replace(tmp_bare, bare)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return BaseSource(clone_url=str(bare), ref=commit, description=src.describe())


def prepare_git(src: GitSource) -> BaseSource:
    checkout = None
    local = Path(src.url)
    if local.is_absolute():
        if not local.exists():
            raise ConfigError(f"source path does not exist: {src.url}", where="source.git",
                              hint="point source.git at a git checkout or a URL")
        checkout = inspect_checkout(local)
        if checkout is None:
            bare = (local / "HEAD").is_file() and (local / "objects").is_dir()
            raise ConfigError(f"source path is not a git checkout: {src.url}" + (" (a bare repository)" if bare else ""),
                              where="source.git",
                              hint=f"to clone a bare repository, write it as a URL: `git: {local.as_uri()}`" if bare
                              else f"point source.git at a checkout (see `git -C {shlex.quote(src.url)} status`) or a URL")
    return BaseSource(clone_url=src.url, ref=src.ref, description=src.describe(), checkout=checkout,
                      submodules=src.submodules)


def prepare(cfg: Config, trust: bool = False, on_download: DownloadProgress | None = None) -> BaseSource:
    """The source to clone from; a PyPI sdist that is not in the cache yet is downloaded only for a
    trusted config (``trust``: --trust; see :mod:`dcaforge.trust`), ``on_download`` told its progress."""
    if isinstance(cfg.source, PypiSource):
        base = prepare_pypi(cfg.source, lambda req: consent.require_download(cfg, trust, req, sdist_dir(req)), on_download)
    else:
        base = prepare_git(cfg.source)
    check_workspace(cfg, base)
    return base


def check_workspace(cfg: Config, base: BaseSource | None = None) -> None:
    """Refuse a workspace inside the source checkout, its git directory (a linked worktree's
    common one and its main worktree included) or any git directory: it would dirty the user's tree."""
    for p in (cfg.workspace, cfg.room):
        gitdir = confine.git_dir_above(Path(os.path.realpath(p)))
        if gitdir is not None:
            raise SafetyError(f"the clean-room workspace {cfg.workspace} is inside the git directory {gitdir}",
                              where=f"cleanroom: in {cfg.describe()}",
                              hint="set 'cleanroom:' to a folder outside git directories and the source checkout")
    if isinstance(cfg.source, GitSource) and cfg.source.local_path is not None:
        info = base.checkout if base else inspect_checkout(cfg.source.local_path)
        for top in info.folders if info else [cfg.source.local_path]:
            if is_inside(cfg.workspace, top) or is_inside(cfg.room, top):
                raise SafetyError(
                    f"the clean-room workspace {cfg.workspace} is inside the source checkout {top}",
                    where=f"cleanroom: in {cfg.describe()}",
                    hint="set 'cleanroom:' to a folder outside the source checkout")
