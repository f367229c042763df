"""Real git repositories for the tests: no mocks of git or patch."""

from __future__ import annotations

import hashlib
import os
import signal
import stat
import subprocess
import textwrap
from pathlib import Path

USER_GIT = ["git", "-c", "user.name=Test User", "-c", "user.email=test@example.com",
            "-c", "commit.gpgSign=false", "-c", "init.defaultBranch=main"]


def minimal_config(cleanroom: str | None = "ws") -> str:
    """The text of a dcaforge.yaml with only what every config needs (a source that is never read, the feature),
    and ``cleanroom: <cleanroom>`` unless None; tests add their sections after it."""
    room = f"cleanroom: {cleanroom}\n" if cleanroom is not None else ""
    return (f"name: room\n{room}source:\n  git: /nowhere\n"
            'feature:\n  number: 78\n  name: dca\n  templates: templates/dca\n  marker: "// m"\n')


def sh(argv: list[str], cwd: Path, check: bool = True, input: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, check=check, capture_output=True, input=input)


def ugit(cwd: Path, *args: str) -> str:
    """git as the user runs it (their environment, their config)."""
    return sh([*USER_GIT, *args], cwd).stdout.decode()


def build_tree(root: Path, files: dict[str, str | bytes | tuple[str | bytes, int]]) -> None:
    for rel, spec in files.items():
        content, mode = spec if isinstance(spec, tuple) else (spec, 0o644)
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content.encode() if isinstance(content, str) else content)
        os.chmod(p, mode)


def git_init(root: Path, files: dict[str, str | bytes | tuple[str | bytes, int]], message: str = "init") -> str:
    root.mkdir(parents=True, exist_ok=True)
    ugit(root, "init", "-q")
    build_tree(root, files)
    ugit(root, "add", "-A")
    ugit(root, "commit", "-q", "-m", message)
    return ugit(root, "rev-parse", "HEAD").strip()


LLAMA = "\n".join(f"int line_{i:03d} = {i};" for i in range(1, 61)) + "\n"
GEMMA = textwrap.dedent("""\
    #include "models.h"

    llm_build_gemma4::llm_build_gemma4(const llama_model & model, const llm_graph_params & params) {
        for (int il = 0; il < n_layer; ++il) {
            Qcur = ggml_rope_ext(ctx0, Qcur, inp_pos, nullptr, n_rot, rope_type);
            Kcur = ggml_rope_ext(ctx0, Kcur, inp_pos, nullptr, n_rot, rope_type);
            cur = build_attn(inp_attn, Qcur, Kcur, Vcur, il);
        }
    }
    """)


def source_files() -> dict[str, str | bytes | tuple[str | bytes, int]]:
    return {
        "CMakeLists.txt": "project(llama)\nadd_library(llama src/llama.cpp)\n",
        "src/llama.cpp": LLAMA,
        "src/models/gemma4.cpp": GEMMA,
        "scripts/run.sh": ("#!/bin/sh\necho run\n", 0o755),
        "docs/notes.txt": "no final newline here",
        "data/blob.bin": bytes(range(256)) * 4,
        ".gitignore": "build/\n",
    }


def file_snapshot(root: Path) -> dict[str, tuple[int, str]]:
    """Mode and sha256 of every file under root, .git (and .git/modules) included."""
    files: dict[str, tuple[int, str]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            p = Path(dirpath) / name
            st = p.lstat()
            data = os.readlink(p).encode() if stat.S_ISLNK(st.st_mode) else p.read_bytes()
            files[str(p.relative_to(root))] = (st.st_mode, hashlib.sha256(data).hexdigest())
    return files


def snapshot(root: Path) -> dict[str, object]:
    """Bytes and modes of every file under root (.git included) and git status --porcelain."""
    porcelain = sh(["git", "status", "--porcelain", "--untracked-files=all"], root).stdout.decode()
    return {"files": file_snapshot(root), "porcelain": porcelain}


def make_patch_git(source: Path, edit, workdir: Path, name: str, base_rev: str = "HEAD") -> bytes:
    """A git-style patch: clone ``source`` at ``base_rev``, run ``edit(tree)``, ``git diff``."""
    scratch = workdir / f"scratch-{name}"
    sh(["git", "clone", "-q", str(source), str(scratch)], workdir)
    sh(["git", "checkout", "-q", base_rev], scratch)
    edit(scratch)
    sh(["git", "add", "-A"], scratch)
    return sh(["git", "diff", "--cached", "--full-index", "--binary", "--src-prefix=a/", "--dst-prefix=b/"],
              scratch).stdout


def make_patch_gnu(before: dict[str, str], after: dict[str, str], workdir: Path) -> bytes:
    """A plain ``diff -u`` patch (what GNU patch -p1 applies), from two file maps."""
    base = workdir / "gnu"
    a, b = base / "a", base / "b"
    import shutil

    for d in (a, b):
        shutil.rmtree(d, ignore_errors=True)
    build_tree(a, before)  # type: ignore[arg-type]
    build_tree(b, after)  # type: ignore[arg-type]
    res = sh(["diff", "-ruN", "a", "b"], base, check=False)
    assert res.returncode in (0, 1), res.stderr
    return res.stdout


def replace_line(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (old, path)
    path.write_text(text.replace(old, new, 1))


def sigint_default() -> None:
    """preexec_fn for a child that must see Ctrl-C as a terminal user's process would: a shell that starts the test
    run in the background without job control (nohup ... &, some CI runners) leaves SIGINT ignored, and Python keeps
    an inherited SIG_IGN instead of installing its KeyboardInterrupt handler."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
