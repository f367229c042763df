"""A PyPI-style sdist becomes one commit with the same id everywhere."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

from dcaforge.config import PypiSource
from dcaforge.source import _key, prepare_pypi, sdist_dir


def _sdist(path: Path) -> None:
    files = {
        "pkg-1.0/PKG-INFO": b"Name: pkg\n",
        "pkg-1.0/vendor/llama.cpp/.git": b"gitdir: ../../.git/modules/vendor/llama.cpp\n",
        "pkg-1.0/vendor/llama.cpp/CMakeLists.txt": b"project(llama)\n",
        "pkg-1.0/vendor/llama.cpp/.gitignore": b"*.o\nbuild/\n",
        "pkg-1.0/vendor/llama.cpp/src/kept.o": b"\0object listed in .gitignore\0",
        "pkg-1.0/vendor/llama.cpp/ggml/.git": b"gitdir: elsewhere\n",
        "pkg-1.0/vendor/llama.cpp/ggml/ggml.c": b"int ggml;\n",
    }
    with tarfile.open(path, "w:gz") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tf.addfile(info, io.BytesIO(data))
        info = tarfile.TarInfo("pkg-1.0/vendor/llama.cpp/convert.py")
        script = b"#!/usr/bin/env python3\n"
        info.size, info.mode = len(script), 0o755
        tf.addfile(info, io.BytesIO(script))


def _prepare(cache: Path, monkeypatch) -> tuple[str, str]:
    monkeypatch.setenv("DCAFORGE_CACHE", str(cache))
    src = PypiSource("pkg==1.0", "vendor/llama.cpp")
    sdists = sdist_dir(src.requirement)
    sdists.mkdir(parents=True)
    _sdist(sdists / "pkg-1.0.tar.gz")  # already "downloaded": pip is not called
    base = prepare_pypi(src)
    assert Path(base.clone_url) == cache / "bases" / f"{_key(src)}.git"
    files = subprocess.run(["git", "--git-dir", base.clone_url, "ls-tree", "-r", base.ref],
                           capture_output=True, check=True, text=True).stdout
    return base.ref, files


def test_import_is_one_deterministic_commit(tmp_path: Path, monkeypatch, isolated: Path) -> None:
    ref_a, files = _prepare(tmp_path / "cache-a", monkeypatch)
    assert "\tCMakeLists.txt" in files and "\tsrc/kept.o" in files and "\tggml/ggml.c" in files
    assert ".git\n" not in files and "ggml/.git" not in files  # dangling gitdir files dropped
    assert "100755 blob" in [ln for ln in files.splitlines() if ln.endswith("convert.py")][0]
    # another machine, hostile git config: the same commit id
    (isolated / ".gitconfig").write_text("[user]\n\tname = X\n[core]\n\tautocrlf = true\n[commit]\n\tgpgSign = true\n")
    ref_b, _ = _prepare(tmp_path / "cache-b", monkeypatch)
    assert ref_a == ref_b
    # a second call uses the cache
    src = PypiSource("pkg==1.0", "vendor/llama.cpp")
    assert prepare_pypi(src).ref == ref_b


def test_pypi_source_apply_and_fresh_reuses_the_room(tmp_path: Path, monkeypatch, project) -> None:
    from dcaforge.series import apply

    cache = tmp_path / "cache-c"
    _prepare(cache, monkeypatch)
    cfg = project.write_config(source="pypi: pkg==1.0\nsubdir: vendor/llama.cpp")
    # the project's feature edits files this tiny tree lacks: no render here
    res = apply(cfg, render=False)
    room = cfg.room
    assert res.created and (room / "ggml/ggml.c").read_text() == "int ggml;\n"
    (room / "ggml/ggml.c").write_text("hand edit\n")
    (room / "build").mkdir()
    (room / "build/x.o").write_text("obj")
    res = apply(cfg, fresh=True, render=False, force=True)  # --force: the hand edit goes
    assert not res.created and "fresh: reset the clean room to its start commit" in res.notes
    assert (room / "ggml/ggml.c").read_text() == "int ggml;\n" and not (room / "build").exists()
    assert (room / "src/kept.o").exists()  # tracked in the base even though .gitignore lists *.o
