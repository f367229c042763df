"""A real 77-patch series under 0078, made at test time from upstream history the project can reach:
the llama.cpp changes between two PyPI sdists of llama-cpp-python (by default 0.3.30 -> 0.3.36, the two
the e2e tests download anyway), cut into 77 ordered patches, git-format and GNU ``diff -u`` mixed, as a
user's series 0001-0077 is. Nothing of upstream is committed: the same inputs give the same bytes.

- Files: the changed text files under :data:`INCLUDE` (the folders 0078 edits, src/models/* included).
- Several patches touch the same file: each :data:`HOT` file (the flash-attention CUDA files,
  llama-graph.cpp, common/arg.cpp, three model graphs) changes in 3 stages, each a third of its
  ``diff -U0`` hunks applied to the previous stage, in patches far apart.
- Steps are ordered by (stage, path) and cut into 77 contiguous groups, one patch each, named
  ``NNNN-<first path>.patch``. Odd numbers are GNU ``diff -u`` (labels ``a/P``, ``b/P``), even numbers
  ``git format-patch`` (fixed author and date); a patch that creates or deletes a file is always
  git-format (GNU diff has no notation for it that every tool reads the same).
- ``break_anchor=(path, old, new)``: the last stage of ``path`` also replaces the line ``old`` by
  ``new``, so the patch that last touches it moves an anchor of 0078 (the test's broken series).

``python tests/e2e/series77.py OLD NEW OUT [--prefix llama.cpp/]`` writes the series into OUT.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

N_PATCHES = 77
INCLUDE = ("src/", "common/", "include/", "ggml/include/", "ggml/src/ggml.c", "ggml/src/ggml-cpu/",
           "ggml/src/ggml-cuda/fattn", "ggml/src/ggml-cuda/ggml-cuda.cu", "ggml/src/ggml-backend.cpp",
           "tests/CMakeLists.txt", "tests/test-backend-ops.cpp", "tools/server/server-context.cpp",
           "examples/passkey/")
HOT = ("ggml/src/ggml-cuda/fattn-common.cuh", "ggml/src/ggml-cuda/fattn-mma-f16.cuh", "ggml/src/ggml-cuda/fattn.cu",
       "src/llama-graph.cpp", "common/arg.cpp", "src/models/gemma3.cpp", "src/models/llama.cpp", "src/models/qwen2.cpp")
STAGES = 3
ENV = {"GIT_AUTHOR_NAME": "upstream", "GIT_AUTHOR_EMAIL": "upstream@llama.cpp", "GIT_AUTHOR_DATE": "2026-06-14T00:00:00+0000",
       "GIT_COMMITTER_NAME": "upstream", "GIT_COMMITTER_EMAIL": "upstream@llama.cpp",
       "GIT_COMMITTER_DATE": "2026-06-14T00:00:00+0000", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1",
       "LC_ALL": "C", "TZ": "UTC"}


@dataclass(frozen=True)
class Step:
    stage: int
    path: str
    old: str | None  # None: the file does not exist before
    new: str | None  # None: deleted


def _text(p: Path) -> str | None:
    if not p.is_file() or p.is_symlink():
        return None
    data = p.read_bytes()
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _files(root: Path, include: tuple[str, ...] = INCLUDE) -> set[str]:
    out = set()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != ".git"]
        for name in filenames:
            rel = os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/")
            if rel.startswith(include):
                out.add(rel)
    return out


_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def _hunks(old: str, new: str, tmp: Path) -> list[tuple[int, int, list[str]]]:
    """``diff -U0`` hunks: (first old line 0-based, old line count, new lines)."""
    a, b = tmp / "a", tmp / "b"
    a.write_text(old)
    b.write_text(new)
    out = subprocess.run(["diff", "-U0", str(a), str(b)], capture_output=True, text=True, check=False,
                         env={**os.environ, "LC_ALL": "C"}).stdout
    hunks: list[tuple[int, int, list[str]]] = []
    for line in out.splitlines(keepends=True):
        m = _HUNK.match(line)
        if m:
            start, count = int(m.group(1)), int(m.group(2) or "1")
            hunks.append((start if count == 0 else start - 1, count, []))
        elif line.startswith("+") and hunks and not line.startswith("+++"):
            hunks[-1][2].append(line[1:])
    return hunks


def _stages(old: str, new: str, tmp: Path) -> list[str]:
    """``old`` -> ... -> ``new`` in up to STAGES steps, each adding the next third of the hunks."""
    if not old.endswith("\n") or not new.endswith("\n"):
        return [new]
    hunks = _hunks(old, new, tmp)
    if len(hunks) < STAGES:
        return [new]
    lines = old.splitlines(keepends=True)
    out = []
    for k in range(1, STAGES + 1):
        chosen = hunks[:len(hunks) * k // STAGES]
        text: list[str] = []
        pos = 0
        for start, count, added in chosen:
            text += lines[pos:start] + added
            pos = start + count
        text += lines[pos:]
        out.append("".join(text))
    assert out[-1] == new
    return out


def steps_between(old_root: Path, new_root: Path, tmp: Path, break_anchor: tuple[str, str, str] | None = None,
                  exclude: re.Pattern[str] | None = None, deletions: bool = True,
                  include: tuple[str, ...] = INCLUDE) -> list[Step]:
    steps: list[Step] = []
    for rel in sorted(_files(old_root, include) | _files(new_root, include)):
        if exclude is not None and exclude.search(rel):
            continue
        old, new = _text(old_root / rel), _text(new_root / rel)
        if old == new or (old is None and (old_root / rel).exists()) or (new is None and (new_root / rel).exists()):
            continue  # unchanged, or binary
        if new is None and not deletions:
            continue
        texts: list[str | None] = _stages(old, new, tmp) if rel in HOT and old is not None and new is not None else [new]
        if break_anchor and rel == break_anchor[0]:
            last = texts[-1]
            assert last is not None and last.count(break_anchor[1]) == 1, f"{break_anchor[1]!r} is not once in {rel}"
            texts[-1] = last.replace(break_anchor[1], break_anchor[2])
        prev = old
        for stage, text in enumerate(texts):
            steps.append(Step(stage, rel, prev, text))
            prev = text
    return sorted(steps, key=lambda s: (s.stage, s.path))


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "core.autocrlf=false", "-c", "diff.noprefix=false", *args], cwd=repo,
                          env={**os.environ, **ENV}, capture_output=True, check=True).stdout.decode("utf-8")


def _slug(path: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", path).strip("-")[:40]


def make_series(old_root: Path, new_root: Path, out: Path, *, prefix: str = "", n: int = N_PATCHES,
                break_anchor: tuple[str, str, str] | None = None, exclude: re.Pattern[str] | None = None,
                deletions: bool = True, include: tuple[str, ...] = INCLUDE) -> list[Path]:
    """Write the series into ``out`` (``prefix``: the paths' folder in the tree, e.g. ``llama.cpp/``; ``exclude``:
    paths left out, e.g. those llamafile's own patches change; ``deletions=False``: no file is deleted, e.g. for a
    tree whose make lists name every source; ``include``: the folders read, :data:`INCLUDE` by default)."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        steps = steps_between(old_root, new_root, tmp, break_anchor, exclude, deletions, include)
        assert len(steps) >= n, f"only {len(steps)} changes between the trees"
        repo = tmp / "repo"
        repo.mkdir()
        _git(repo, "init", "-q")
        for s in steps:  # the old state of every file the series touches
            if s.stage == 0 and s.old is not None:
                dest = repo / prefix / s.path
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_text(s.old)
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "--allow-empty", "-m", "base")
        written = []
        for i in range(n):
            group = steps[i * len(steps) // n:(i + 1) * len(steps) // n]
            number = i + 1
            name = f"{number:04d}-{_slug(group[0].path)}.patch"
            gnu = number % 2 == 1 and all(s.old is not None and s.new is not None for s in group)
            parts = []
            for s in group:
                dest = repo / prefix / s.path
                if s.new is None:
                    dest.unlink()
                    continue
                if gnu:
                    a, b = tmp / "a", tmp / "b"
                    a.write_text(s.old or "")
                    b.write_text(s.new)
                    label = f"{prefix}{s.path}"
                    d = subprocess.run(["diff", "-u", "--label", f"a/{label}", "--label", f"b/{label}", str(a), str(b)],
                                       capture_output=True, check=False, env={**os.environ, "LC_ALL": "C"}).stdout
                    parts.append(d.decode("utf-8"))
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_text(s.new)
            _git(repo, "add", "-A")
            subject = f"{name[:-6]}: upstream llama.cpp {', '.join(sorted({s.path for s in group}))[:120]}"
            _git(repo, "commit", "-q", "-m", subject)
            if gnu:
                text = f"{subject}\n(plain diff -u, as the user makes them)\n\n" + "".join(parts)
            else:
                text = _git(repo, "format-patch", "-1", "--stdout", "--full-index", "--no-signature", "HEAD")
            (out / name).write_text(text)
            written.append(out / name)
    return written


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--prefix", default="")
    args = ap.parse_args(argv)
    if args.out.exists():
        shutil.rmtree(args.out)
    paths = make_series(args.old, args.new, args.out, prefix=args.prefix)
    print(f"{len(paths)} patches in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
