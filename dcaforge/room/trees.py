"""Trees: what dcaforge reads files from, and the clean room's trees as git sees them.

- :class:`Tree` is what the renderer, the drift check and the wiring check read: a commit
  (:class:`GitTree`, read with ``ls-tree``/``cat-file``, nothing checked out), a plain folder
  (:class:`DirTree`, ``render --check --tree DIR``), or a tree with a render's outputs laid over
  it (:class:`Overlay`, the tree as rendered, never written).
- The clean room's trees as tree ids: its baseline (:func:`baseline_commit`,
  :func:`baseline_tree`) and its work tree, untracked files included (:func:`worktree_tree`,
  through a temporary index: never the room's own); the diff between two trees with fixed
  options (:func:`tree_diff`, the bytes ``capture`` writes) and the paths it changes.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import re
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Protocol

from dcaforge import guard
from dcaforge.errors import DcaforgeError, SafetyError
from dcaforge.git import git, git_out, rev_parse
from dcaforge.room.cleanroom import BASELINE_TAG, Room

#: Files the drift check searches for an identifier.
CODE_EXTS = (".c", ".cc", ".cpp", ".h", ".hpp", ".cu", ".cuh", ".m", ".txt", ".cmake", ".mk", ".sh", ".py")


class Tree(Protocol):
    def exists(self, rel: str) -> bool: ...
    def is_file(self, rel: str) -> bool: ...
    def read(self, rel: str) -> bytes: ...
    def mode(self, rel: str) -> int: ...
    def listdir(self, folder: str) -> list[str]: ...
    def files_with(self, word: str, prefix: str) -> list[str]: ...


class GitTree:
    """A commit of a repository, read with ls-tree / cat-file (no checkout)."""

    def __init__(self, repo: Path, rev: str) -> None:
        self.repo = repo
        self.rev = rev
        out = git(repo, "ls-tree", "-r", "-z", "--full-tree", rev).stdout
        self.entries: dict[str, tuple[int, str]] = {}
        self.dirs: set[str] = set()
        for item in out.split("\0"):
            if not item:
                continue
            meta, path = item.split("\t", 1)
            mode, _kind, sha = meta.split()
            self.entries[path] = (int(mode, 8), sha)
            parts = path.split("/")
            for j in range(1, len(parts)):
                self.dirs.add("/".join(parts[:j]))

    def exists(self, rel: str) -> bool:
        return rel in self.entries or rel in self.dirs

    def is_file(self, rel: str) -> bool:
        return rel in self.entries

    def read(self, rel: str) -> bytes:
        return git(self.repo, "cat-file", "blob", self.entries[rel][1]).stdout_bytes

    def mode(self, rel: str) -> int:
        return 0o755 if self.entries[rel][0] & 0o111 else 0o644

    def listdir(self, folder: str) -> list[str]:
        """Names of the files directly in ``folder``."""
        folder = folder.strip("/")
        return sorted(posixpath.basename(p) for p in self.entries if posixpath.dirname(p) == folder)

    def files_with(self, word: str, prefix: str) -> list[str]:
        """Code files under ``prefix`` (``""`` or ``dir/``) holding ``word`` as a word, relative to ``prefix``."""
        res = git(self.repo, "grep", "-l", "-w", "-F", "-e", word, self.rev, "--",
                  *(f"{prefix}*{e}" for e in CODE_EXTS), check=False)
        return sorted(line.split(":", 1)[1][len(prefix):] for line in res.stdout.splitlines() if ":" in line)


class DirTree:
    """A plain folder (``render --check --tree DIR``, ``drift --tree DIR``), read as a tree is: regular
    files inside the folder only (:mod:`dcaforge.guard`). A symlink that leads out of the folder is
    refused when a file is asked for by name and left out of listings and searches; a FIFO, device
    or socket is never opened (no hang); a file past :data:`dcaforge.guard.TREE_FILE_LIMIT` or one
    that cannot be read is an error naming it; dangling and looping symlinks are no files."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._real = Path(os.path.realpath(root))
        self._texts: dict[str, dict[str, str]] = {}

    def _path(self, rel: str) -> Path:
        """``root/rel``, or a SafetyError when it resolves out of the folder (through a symlink)."""
        path = self.root / rel
        if not guard.inside(path, self._real):
            raise SafetyError(f"{path} leads out of the tree {self.root} (to {os.path.realpath(path)}); dcaforge reads "
                              "no file outside the tree it checks", where=str(path),
                              hint="check a copy of the tree without that symlink (or with what it points at copied in)")
        return path

    def exists(self, rel: str) -> bool:
        return os.path.exists(self._path(rel))

    def is_file(self, rel: str) -> bool:
        return guard.regular_file(self._path(rel))

    def read(self, rel: str) -> bytes:
        return guard.read_regular(self._path(rel), what="the tree's file")

    def mode(self, rel: str) -> int:
        try:
            st = os.stat(self._path(rel))
        except OSError as exc:
            raise guard.read_error(exc, self.root / rel, "the tree's file") from None
        return 0o755 if st.st_mode & 0o111 else 0o644

    def _inside_file(self, path: Path) -> bool:
        return guard.regular_file(path) and guard.inside(path, self._real)

    def listdir(self, folder: str) -> list[str]:
        """Names of the (regular, inside) files directly in ``folder``."""
        path = self._path(folder.strip("/")) if folder.strip("/") else self.root
        try:
            names = os.listdir(path)
        except OSError:
            return []
        return sorted(n for n in names if self._inside_file(path / n))

    def files_with(self, word: str, prefix: str) -> list[str]:
        """Code files under ``prefix`` (``""`` or ``dir/``) holding ``word`` as a word, relative to ``prefix``
        (hidden folders, files of 4 MB or more, and anything but regular files inside the tree left out;
        the texts are read once)."""
        if prefix not in self._texts:
            texts = self._texts[prefix] = {}
            root = self._path(prefix.strip("/")) if prefix.strip("/") else self.root
            for dirpath, dirnames, filenames in os.walk(root):  # (os.walk does not enter symlinked folders)
                dirnames[:] = [d for d in dirnames if not d.startswith(".")]
                for n in filenames:
                    p = Path(dirpath) / n
                    if not n.endswith(CODE_EXTS) or not self._inside_file(p):
                        continue
                    try:
                        if os.stat(p).st_size >= 4_000_000:
                            continue
                    except OSError:
                        continue
                    data = guard.read_regular(p, what="the tree's file", limit=4_000_000)
                    texts[p.relative_to(root).as_posix()] = data.decode("utf-8", errors="replace")
        rx = re.compile(r"\b" + re.escape(word) + r"\b")
        return sorted(rel for rel, text in self._texts[prefix].items() if rx.search(text))


class Overlay:
    """A tree with a render's ``outputs`` (room-relative path -> (bytes, mode)) laid over it: the
    tree as rendered, read without writing it."""

    def __init__(self, tree: Tree, outputs: dict[str, tuple[bytes, int]]) -> None:
        self.tree = tree
        self.outputs = outputs

    def exists(self, rel: str) -> bool:
        return rel in self.outputs or self.tree.exists(rel)

    def is_file(self, rel: str) -> bool:
        return rel in self.outputs or self.tree.is_file(rel)

    def read(self, rel: str) -> bytes:
        return self.outputs[rel][0] if rel in self.outputs else self.tree.read(rel)

    def mode(self, rel: str) -> int:
        return self.outputs[rel][1] if rel in self.outputs else self.tree.mode(rel)

    def text(self, rel: str) -> str | None:
        """The file's text (undecodable bytes replaced), or None when it is not a file."""
        return self.read(rel).decode("utf-8", errors="replace") if self.is_file(rel) else None

    def listdir(self, folder: str) -> list[str]:
        """Names of the files directly in ``folder`` (room-relative)."""
        folder = folder.strip("/")
        names = {posixpath.basename(p) for p in self.outputs if posixpath.dirname(p) == folder}
        return sorted(names | set(self.tree.listdir(folder)))


# --- the clean room's trees ---------------------------------------------------------------

#: How every diff dcaforge writes or compares is made: its bytes depend on the two trees alone.
DIFF_ARGS: tuple[str, ...] = (
    "--full-index", "--binary", "--no-ext-diff", "--no-color", "--no-textconv", "--no-renames",
    "--src-prefix=a/", "--dst-prefix=b/",
)


@contextlib.contextmanager
def temp_index(room: Path, seed: bool = True) -> Iterator[dict[str, str]]:
    """An index file of our own inside the room's git dir; yields the env that selects it."""
    meta = room / ".git" / "dcaforge"
    meta.mkdir(parents=True, exist_ok=True)
    path = meta / f"index.tmp.{os.getpid()}"
    src = room / ".git" / "index"
    if seed and src.is_file():
        # its stat cache makes `add -A` fast; copy2 keeps its mtime, which git needs to spot
        # "racy" entries (files changed in the same second the index was written)
        shutil.copy2(src, path)
    try:
        yield {"GIT_INDEX_FILE": str(path)}
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def worktree_tree(room: Path) -> str:
    """The tree of the room's work tree (tracked + untracked, not ignored), via a temp index."""
    with temp_index(room) as env:
        git(room, "add", "-A", ".", env=env)
        return git_out(room, "write-tree", env=env)


def tree_diff(repo: Path, old_tree: str, new_tree: str) -> bytes:
    return git(repo, "diff-tree", "-p", *DIFF_ARGS, old_tree, new_tree, "--").stdout_bytes


def changed_paths(repo: Path, old_tree: str, new_tree: str) -> list[str]:
    out = git(repo, "diff-tree", "-r", "-z", "--no-renames", "--name-only", old_tree, new_tree, "--").stdout
    return [p for p in out.split("\0") if p]


def first_difference(repo: Path, a: str, b: str) -> str:
    paths = changed_paths(repo, a, b)
    return paths[0] if paths else "(none)"


def tree_of(repo: Path, rev: str) -> str:
    return git_out(repo, "rev-parse", f"{rev}^{{tree}}")


def baseline_commit(room: Room) -> str:
    """The commit tagged as the room's baseline (the series applied), or an error saying how to get one."""
    sha = rev_parse(room.path, BASELINE_TAG)
    if sha is None:
        raise DcaforgeError("the clean room has no baseline yet (the series is not fully applied)",
                            where=str(room.path), hint="`dcaforge apply --continue`")
    return sha


def baseline_tree(room: Room) -> str:
    return tree_of(room.path, baseline_commit(room))


def write_tree(room: Path, base: str, files: Sequence[tuple[str, bytes, int]]) -> str:
    """The tree ``base`` (a commit or tree) with ``files`` (path, bytes, mode) written over it, as a
    tree id (blobs go into the room's object store; nothing is checked out)."""
    with temp_index(room, seed=False) as env:
        git(room, "read-tree", base, env=env)
        for rel, data, mode in files:
            sha = git(room, "hash-object", "-w", "--stdin", input=data).stdout.strip()
            kind = "100755" if mode & 0o111 else "100644"
            git(room, "update-index", "--add", "--cacheinfo", f"{kind},{sha},{rel}", env=env)
        return git_out(room, "write-tree", env=env)
