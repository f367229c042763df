"""A PyPI-style sdist becomes one commit with the same id everywhere."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from pathlib import Path

from dcaforge.config import PypiSource
from dcaforge.room.source import _key, prepare_pypi, sdist_dir


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
    from dcaforge.patch.series import apply

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


def _metadata_only_sdist(path: Path, pad: int) -> None:
    """A real sdist pip can prepare: an in-tree build backend with no requirements (nothing to fetch) that writes
    the metadata, and ``pad`` bytes of incompressible data to download."""
    import os as _os

    backend = (b"import os\n"
               b"def prepare_metadata_for_build_wheel(d, config_settings=None):\n"
               b"    p = os.path.join(d, 'pkgdl-1.0.dist-info'); os.makedirs(p)\n"
               b"    with open(os.path.join(p, 'METADATA'), 'w') as f:\n"
               b"        f.write('Metadata-Version: 2.1\\nName: pkgdl\\nVersion: 1.0\\n')\n"
               b"    return 'pkgdl-1.0.dist-info'\n"
               b"def build_wheel(*a, **k):\n    raise RuntimeError('metadata only')\n")
    files = {"pkgdl-1.0/pyproject.toml": b'[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n',
             "pkgdl-1.0/backend.py": backend, "pkgdl-1.0/PKG-INFO": b"Metadata-Version: 2.1\nName: pkgdl\nVersion: 1.0\n",
             "pkgdl-1.0/pad.bin": _os.urandom(pad)}
    with tarfile.open(path, "w:gz") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tf.addfile(info, io.BytesIO(data))


def test_the_sdist_download_reports_its_progress(tmp_path: Path, monkeypatch) -> None:
    """A real `pip download` over HTTP from a local index that sends the 2 MB archive in slices: the progress
    callback sees the bytes grow (read from pip's own temporary folder) and the size pip announced, then the
    whole file; the archive lands in the cache."""
    import http.server
    import threading
    import time

    from dcaforge.room.source import download_sdist, pip_download_size

    root = tmp_path / "index"
    (root / "simple" / "pkgdl").mkdir(parents=True)
    _metadata_only_sdist(root / "pkgdl-1.0.tar.gz", 2_000_000)
    data = (root / "pkgdl-1.0.tar.gz").read_bytes()
    (root / "simple" / "pkgdl" / "index.html").write_text('<a href="/pkgdl-1.0.tar.gz">pkgdl-1.0.tar.gz</a>\n')

    class Slow(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **k) -> None:
            super().__init__(*a, directory=str(root), **k)

        def log_message(self, *a) -> None:
            pass

        def do_GET(self) -> None:
            if not self.path.endswith(".tar.gz"):
                return super().do_GET()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Content-Type", "application/octet-stream")
            self.end_headers()
            for i in range(0, len(data), 250_000):
                self.wfile.write(data[i:i + 250_000])
                self.wfile.flush()
                time.sleep(0.15)

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        for key in [k for k in os.environ if k.startswith("PIP_")]:
            monkeypatch.delenv(key)
        monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # no pip.conf: only this index
        monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{srv.server_port}/simple")
        seen: list[tuple[int, int | None]] = []
        got = download_sdist("pkgdl==1.0", tmp_path / "cache", on_progress=lambda d, t: seen.append((d, t)))
    finally:
        srv.shutdown()
    assert got == tmp_path / "cache" / "pkgdl-1.0.tar.gz" and got.read_bytes() == data
    partial = [d for d, _t in seen if 0 < d < len(data)]
    assert len(partial) >= 3, seen  # it grew while pip downloaded
    assert [d for d, _t in seen] == sorted(d for d, _t in seen)  # never backwards
    assert seen[-1] == (len(data), len(data)) and any(t == 2_000_000 for _d, t in seen)  # pip said "(2.0 MB)"
    assert pip_download_size("  Downloading llama_cpp_python-0.3.36.tar.gz (76.6 MB)") == 76_600_000
    assert pip_download_size("Collecting llama-cpp-python==0.3.36") is None
