"""llamafile's layout end to end on the real llama.cpp tree (no build): a superproject with the
llama-cpp-python 0.3.36 sdist's llama.cpp as a real git submodule (its .gitmodules names an
unreachable URL, as the user's names GitHub: the room is made from the checkout's own
.git/modules), llamafile's own per-file patch applied with patch -p1 and its llamafile-files
copied by the bootstrap of examples/llamafile.yaml, a two-patch user series, the real 0078-dca
templates, then apply, render, capture (with the bookkeeping), verify and verify --fresh-render.
The source checkout's bytes are compared before and after everything.

The sdist comes from dcaforge's cache ($DCAFORGE_CACHE, else ~/.cache/dcaforge; downloaded once
with pip when missing), like the other e2e tests.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from dcaforge.cli import app
from dcaforge.config import Config, PypiSource, parse_config
from dcaforge.feature.render import render
from dcaforge.patch.capture import capture
from dcaforge.patch.series import apply
from dcaforge.patch.status import status
from dcaforge.patch.verify import verify
from dcaforge.room.source import cache_root, prepare_pypi

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.core.helpers import USER_GIT, file_snapshot, ugit  # noqa: E402

SDIST = PypiSource("llama-cpp-python==0.3.36", "vendor/llama.cpp")
UNREACHABLE = "https://git.invalid/ggml-org/llama.cpp.git"  # .invalid never resolves: no network use


def unified(path: str, old: str, new: str, workdir: Path) -> bytes:
    """A plain `diff -u` of one file, labelled a/<path> b/<path> (what llamafile's patches are)."""
    a, b = workdir / "a.txt", workdir / "b.txt"
    a.write_text(old)
    b.write_text(new)
    res = subprocess.run(["diff", "-u", "--label", f"a/{path}", "--label", f"b/{path}", str(a), str(b)],
                         check=False, capture_output=True)
    assert res.returncode == 1, res.stderr
    return res.stdout


def insert_after(text: str, anchor: str, added: str) -> str:
    assert text.count(anchor) >= 1, anchor
    return text.replace(anchor, anchor + added, 1)


@dataclass
class Llamafile:
    tmp: Path
    source: Path        # the user's llamafile checkout (superproject)
    good: str           # its commit with llamafile's patch that applies
    broken: str         # a commit whose llamafile patches include one that does not apply
    series: Path        # the user's series folder (with README.md and UPSTREAM_SYNC.md)
    before: dict[str, tuple[int, str]]

    def config(self, name: str, ref: str) -> Config:
        """examples/llamafile.yaml, pointed at this checkout, series and workspace."""
        data = yaml.safe_load((REPO / "examples" / "llamafile.yaml").read_text())
        data["root"] = str(REPO)
        data["name"] = name
        data["cleanroom"] = str(self.tmp / "cleanroom")
        data["source"] = {"git": str(self.source), "ref": ref, "submodules": True}
        data["series"]["dir"] = str(self.series)
        for key in ("series_readme", "upstream_sync"):
            doc = data["bookkeeping"][key]
            doc["file"] = str(self.series / Path(doc["file"]).name)
        path = self.tmp / f"{name}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return parse_config(path)


@pytest.fixture(scope="module")
def llamafile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Llamafile]:
    cache = cache_root()  # the real cache, read before the environment is isolated
    tmp = tmp_path_factory.mktemp("llamafile")
    home = tmp / "home"
    home.mkdir()
    (home / ".gitconfig").write_text("")
    with pytest.MonkeyPatch.context() as mp:
        for key in list(os.environ):
            if key.startswith("GIT_"):
                mp.delenv(key)
        mp.setenv("HOME", str(home))
        mp.setenv("GIT_CONFIG_GLOBAL", str(home / ".gitconfig"))
        mp.setenv("GIT_CONFIG_NOSYSTEM", "1")
        mp.setenv("DCAFORGE_CACHE", str(cache))
        base = prepare_pypi(SDIST)  # the one-commit repository of the sdist's llama.cpp (cached)
        yield _make_llamafile(tmp, base.clone_url, base.ref)


def _make_llamafile(tmp: Path, llama_url: str, llama_commit: str) -> Llamafile:
    src = tmp / "llamafile"
    src.mkdir()
    ugit(src, "init", "-q")
    # llama.cpp as a real submodule, copied (file://, no hardlinks into the cache)
    ugit(src, "-c", "protocol.file.allow=always", "submodule", "add", "-q", Path(llama_url).as_uri(), "llama.cpp")
    ugit(src / "llama.cpp", "checkout", "-q", llama_commit)
    llama = src / "llama.cpp"
    arg_cpp = (llama / "common/arg.cpp").read_text()
    # llamafile's own files and its per-file patch (paths a/llama.cpp/..., applied with patch -p1 from the root)
    files = {
        "Makefile": "include build/config.mk\ninclude llama.cpp/BUILD.mk\n",
        "build/config.mk": "COSMOCC = .cosmocc/4.0.2\n",
        "llamafile/main.c": "int main(void) { return 0; }\n",
        ".gitignore": "/o\n/.cosmocc\n",
        # llamafile's build of llama.cpp lists its sources (0078 adds its own; tests/e2e/test_llamafile_build.py
        # runs llamafile's real Makefile)
        "llama.cpp.patches/llamafile-files/BUILD.mk": ("LLAMA_SRCS_CPP := \\\n\tllama.cpp/src/llama.cpp\n\n"
                                                       "LLAMA_OBJS := $(LLAMA_SRCS_CPP:%.cpp=o/$(MODE)/%.cpp.o)\n"),
        "llama.cpp.patches/llamafile-files/README.llamafile": "llamafile's changes to llama.cpp\n",
        # llama.cpp's .gitignore ignores this one: the bootstrap must commit it all the same
        "llama.cpp.patches/llamafile-files/common/build-info.cpp": 'int LLAMA_BUILD_NUMBER = 0;\n',
    }
    for rel, text in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    lf_arg = insert_after(arg_cpp, '#include "arg.h"\n', '\n#ifdef COSMOCC\n#include <linux/limits.h>  // llamafile\n#endif\n')
    patches = src / "llama.cpp.patches" / "patches"
    patches.mkdir(parents=True)
    (patches / "common_arg.cpp.patch").write_bytes(unified("llama.cpp/common/arg.cpp", arg_cpp, lf_arg, tmp))
    # the user's checkout names the upstream URL (GitHub there; unreachable here)
    ugit(src, "config", "-f", ".gitmodules", "submodule.llama.cpp.url", UNREACHABLE)
    ugit(src, "add", "-A")
    ugit(src, "commit", "-q", "-m", "llamafile 0.10.x with llama.cpp as a submodule")
    good = ugit(src, "rev-parse", "HEAD").strip()
    # a commit whose second llamafile patch was made for another llama.cpp: its context is not there
    vocab = (llama / "src/llama-vocab.cpp").read_text()
    stale = vocab.replace("\n", "\n// a line this llama.cpp does not have\n", 1)
    (patches / "src_llama-vocab.cpp.patch").write_bytes(
        unified("llama.cpp/src/llama-vocab.cpp", stale, insert_after(stale, "have\n", "// llamafile\n"), tmp))
    ugit(src, "add", "-A")
    ugit(src, "commit", "-q", "-m", "a llamafile patch for another llama.cpp")
    broken = ugit(src, "rev-parse", "HEAD").strip()
    ugit(src, "checkout", "-q", good)  # the user's work tree at the good commit, submodule pristine

    # the user's series, laid out like vendors/patches/llamafile: two patches on top of make setup
    series = tmp / "work" / "vendors" / "patches" / "llamafile"
    series.mkdir(parents=True)
    for name in ("README.md", "UPSTREAM_SYNC.md"):
        shutil.copy(REPO / "vendors" / "patches" / "llamafile" / name, series / name)
    scratch = tmp / "scratch"
    # 0001 (git style, a/llama.cpp/...): a new header of the user's
    (scratch / "llama.cpp" / "src").mkdir(parents=True)
    ugit(scratch, "init", "-q")
    (scratch / "llama.cpp" / "src" / "opencoti.h").write_text("#pragma once\n#define OPENCOTI 1\n")
    ugit(scratch, "add", "-A")
    p1 = subprocess.run([*USER_GIT, "diff", "--cached", "--full-index", "--src-prefix=a/", "--dst-prefix=b/"],
                        cwd=scratch, check=True, capture_output=True).stdout
    (series / "0001-opencoti-header.patch").write_bytes(p1)
    # 0002 (plain diff -u, as the user's own patches are made): on top of llamafile's patch in arg.cpp
    user_arg = insert_after(lf_arg, "#endif\n", '#include "opencoti.h"  // opencoti\n')
    (series / "0002-opencoti-arg.patch").write_bytes(unified("llama.cpp/common/arg.cpp", lf_arg, user_arg, tmp))
    return Llamafile(tmp=tmp, source=src, good=good, broken=broken, series=series, before=file_snapshot(src))


def _table_rows(readme: Path) -> list[str]:
    return [ln for ln in readme.read_text().splitlines() if ln.startswith("| `0078")]


def test_llamafile_apply_render_capture_verify(llamafile: Llamafile) -> None:
    cfg = llamafile.config("llamafile", llamafile.good)
    res = apply(cfg, trust=True)
    room = cfg.room
    notes = "\n".join(res.notes)
    assert "submodule llama.cpp cloned from your checkout's" in notes  # offline: .gitmodules names git.invalid
    assert "flattened submodules: llama.cpp" in notes
    assert "bootstrap: 1 patch of the tree applied" in notes
    assert "llama.cpp/common/build-info.cpp" in notes  # an ignored file the bootstrap made, committed
    assert res.applied_now == ["0001-opencoti-header.patch", "0002-opencoti-arg.patch"]
    assert res.methods["0002-opencoti-arg.patch"] == "patch -p1"

    # make setup's work, committed before the series (start tag), with the steps in the message
    start = "dcaforge/start"
    msg = ugit(room, "log", "-1", "--format=%B", start)
    assert msg.startswith("dcaforge: bootstrap\n") and "patches llama.cpp.patches/patches/*.patch" in msg
    tracked = set(ugit(room, "ls-tree", "-r", "--name-only", start, "llama.cpp/").split())
    assert {"llama.cpp/BUILD.mk", "llama.cpp/README.llamafile", "llama.cpp/common/build-info.cpp",
            "llama.cpp/ggml/src/ggml-version.h", "llama.cpp/src/llama-version.h"} <= tracked
    assert "llama.cpp/Makefile" not in tracked
    arg = (room / "llama.cpp/common/arg.cpp").read_text()
    assert "#include <linux/limits.h>  // llamafile\n#endif\n#include \"opencoti.h\"" in arg
    assert "--dca" in arg  # the feature rendered on top
    commit = ugit(room, "--git-dir=.git/modules/llama.cpp", "rev-parse", "--short", "HEAD").strip()
    assert f'#define GGML_COMMIT  "{commit}"' in (room / "llama.cpp/ggml/src/ggml-version.h").read_text()

    assert render(cfg).written == []  # rendering again changes nothing

    cap = capture(cfg)
    data = cap.path.read_bytes()
    assert cap.path == llamafile.series / "0078-dca.patch"
    diffs = re.findall(rb"^diff --git (\S+) (\S+)$", data, re.MULTILINE)
    assert len(diffs) > 20 and all(a.startswith(b"a/llama.cpp/") and b.startswith(b"b/llama.cpp/") for a, b in diffs)
    assert b"opencoti.h" not in data and b"linux/limits.h" not in data  # the series and bootstrap are baseline
    readme = llamafile.series / "README.md"
    sync = llamafile.series / "UPSTREAM_SYNC.md"
    rows = _table_rows(readme)
    assert rows == [f"| `0078-dca` | Dual Chunk Attention: training-free long context (`--dca`), {len(cap.files)} files "
                    "| `// opencoti F5 dca` | opencoti-original |"]
    entry = [ln for ln in sync.read_text().splitlines() if "opencoti F5 dca" in ln]
    assert len(entry) == 1 and entry[0].startswith("- `// opencoti F5 dca`: 0078-dca, ")
    assert {u.action for u in cap.bookkeeping} == {"added"}

    # idempotent: a second capture writes nothing and keeps one row, one entry
    before = (readme.read_bytes(), sync.read_bytes())
    again = capture(cfg)
    assert not again.written and {u.action for u in again.bookkeeping} == {"unchanged"}
    assert (readme.read_bytes(), sync.read_bytes()) == before

    # the bookkeeping files beside the series confuse neither verify nor status nor apply
    assert verify(cfg).expected_from == "capture"
    assert verify(cfg, fresh_render=True, gnu=True).fresh_render
    st = status(cfg)
    assert st.patch_state == "fresh" and not st.series_changed and st.series_applied == 2
    assert "series unchanged since the last apply" in apply(cfg, trust=True).notes

    # --fresh on a pinned submodule source resets to the start commit (no new clone) and the
    # bootstrap's files, the ignored one included, are all there again
    res = apply(cfg, fresh=True, trust=True)
    assert "fresh: reset the clean room to its start commit" in res.notes
    assert (room / "llama.cpp/common/build-info.cpp").is_file()
    assert capture(cfg).written is False and _table_rows(readme) == rows

    assert file_snapshot(llamafile.source) == llamafile.before  # the user's checkout: not one byte changed


def test_llamafile_bootstrap_patch_that_does_not_apply(llamafile: Llamafile) -> None:
    """Through the CLI (one apply: each attempt clones and flattens the real tree): exit 3, the
    patch, file and hunk, GNU patch's reason, what to do; nothing made, the source untouched."""
    cfg = llamafile.config("broken", llamafile.broken)
    r = CliRunner().invoke(app, ["apply", "--trust", "-c", str(cfg.path)])
    assert r.exit_code == 3, r.output
    out = " ".join(r.output.split())  # rich wraps long lines
    assert f"bootstrap step 7 ({cfg.path}:" in out
    assert "the tree's own patch 2/2 src_llama-vocab.cpp.patch does not apply with patch -p1 --fuzz=0" in out
    assert ("where: llama.cpp.patches/patches/src_llama-vocab.cpp.patch (in the source tree), "
            "file llama.cpp/src/llama-vocab.cpp, hunk #1 @@") in out
    assert "Hunk #1 FAILED" in out
    assert "the clean room was not created and the source is untouched" in out and "source.ref" in out
    assert not cfg.room.exists() and not list(cfg.workspace.glob(".broken*"))
    assert file_snapshot(llamafile.source) == llamafile.before
