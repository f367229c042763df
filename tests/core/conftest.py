from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from dcaforge.config import Config, parse_config
from dcaforge.patch.capture import capture
from dcaforge.patch.verify import verify

from .helpers import git_init, snapshot, source_files


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No user HOME, git config or GIT_* variables leak into the tests."""
    home = tmp_path / "home"
    home.mkdir()
    for key in list(os.environ):
        if key.startswith("GIT_"):
            monkeypatch.delenv(key)
    gitconfig = home / ".gitconfig"
    gitconfig.write_text("")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(gitconfig))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("DCAFORGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.chdir(tmp_path)
    return home


FEATURE_MANIFEST = textwrap.dedent("""\
    files:
      - template: src/llama-dca.cpp.j2
        dest: src/llama-dca.cpp
      - template: tools/dca.sh.j2
        dest: tools/dca.sh
        mode: "0755"
      - template: src/never.cpp.j2
        dest: src/never.cpp
        when_exists: src/does-not-exist.cpp
    edits:
      - file: [src/models/gemma4-iswa.cpp, src/models/gemma4.cpp]
        anchor: '(?m)^(\\s*)Kcur = ggml_rope_ext\\(ctx0, Kcur, inp_pos,'
        action: replace
        text: "\\\\1Kcur = ggml_rope_ext(ctx0, Kcur, llm_dca_pos_k(inp_pos, il), {{ marker_comment }}\\n\\\\1    "
      - file: src/models/gemma4.cpp
        anchor: '#include "models.h"\\n'
        action: insert_after
        text: "#include \\"llama-dca.h\\" {{ marker }}\\n"
      - file: src/models/llama-iswa.cpp
        when_exists: src/models/llama-iswa.cpp
        anchor: 'nothing'
        action: replace
        text: 'x'
      - file: CMakeLists.txt
        anchor: '(?m)^add_library'
        action: insert_before
        text: "# {{ feature.id }} chunk={{ vars.chunk }}\\n"
      - file: CMakeLists.txt
        anchor: '(?m)^add_library\\(llama src/llama\\.cpp\\)\\n'
        action: insert_after
        text: "target_sources(llama PRIVATE src/llama-dca.cpp)\\n"
    """)


# an edit whose anchor (line_0100) is in no file of the source; tests add alternatives (indented 4) after it
UNANCHORED_EDIT = """\
edits:
  - file: src/llama.cpp
    anchor: 'int line_0100 = 100;'
    action: replace
    text: 'x'
"""


def write_feature(root: Path, manifest: str = FEATURE_MANIFEST) -> Path:
    feat = root / "templates" / "dca"
    (feat / "src").mkdir(parents=True, exist_ok=True)
    (feat / "tools").mkdir(parents=True, exist_ok=True)
    (feat / "manifest.yaml").write_text(manifest)
    (feat / "src" / "llama-dca.cpp.j2").write_text(
        "{{ marker }}\n// feature {{ feature.number }} {{ feature.name }} in {{ llama_cpp_dir }}\n"
        "int dca_chunk = {{ vars.chunk }};\n")
    (feat / "tools" / "dca.sh.j2").write_text("#!/bin/sh\necho {{ feature.name }}\n")
    (feat / "src" / "never.cpp.j2").write_text("never\n")
    return feat


@pytest.fixture
def project(tmp_path: Path):
    """A source checkout, a series folder, a feature folder and a config, all under tmp_path."""
    return Project(tmp_path)


class Project:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.source = tmp / "src-checkout"
        self.base = git_init(self.source, source_files())
        self._set_up_work()

    def _set_up_work(self) -> None:
        """The work folder (patches, feature, config) beside ``self.source``; the source's snapshot."""
        self.work = self.tmp / "work"
        self.work.mkdir()
        self.patches = self.work / "patches"
        self.patches.mkdir()
        self.feature = write_feature(self.work)
        self.config_path = self.work / "dcaforge.yaml"
        self.write_config()
        self.before = snapshot(self.source)

    def write_config(self, extra_series: str = "", name: str = "room", source: str | None = None,
                     llama_cpp_dir: str = ".", cleanroom: str = "../cleanroom") -> Config:
        src = source or f"git: {self.source}\nref: main"
        src_block = "\n".join("  " + ln for ln in src.splitlines())
        series_block = "\n".join("  " + ln for ln in extra_series.splitlines())
        self.config_path.write_text(
            f"name: {name}\ncleanroom: {cleanroom}\nsource:\n{src_block}\nllama_cpp_dir: {llama_cpp_dir}\n"
            f"series:\n  dir: patches\n{series_block}\n"
            "feature:\n  number: 78\n  name: dca\n  templates: templates/dca\n"
            '  marker: "// opencoti F5 dca"\n  vars:\n    chunk: 8192\n')
        return self.config

    @property
    def config(self) -> Config:
        return parse_config(self.config_path)

    def add_patch(self, name: str, data: bytes) -> Path:
        p = self.patches / name
        p.write_bytes(data)
        return p

    def assert_source_untouched(self) -> None:
        assert snapshot(self.source) == self.before

    def assert_round_trip(self, cfg: Config, under: str) -> None:
        """capture writes a patch whose every file is under ``under`` (a folder, with its slash); verify passes,
        also from a fresh render; the source is untouched."""
        cap = capture(cfg)
        diffs = [ln for ln in cap.path.read_text().splitlines() if ln.startswith("diff --git")]
        assert diffs and all(d.startswith(f"diff --git a/{under}") for d in diffs)
        verify(cfg)
        verify(cfg, fresh_render=True)
        self.assert_source_untouched()
