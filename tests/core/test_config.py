"""Config errors name the key, the file and the line; the built-in default resolves to the repo."""

from __future__ import annotations

from pathlib import Path

import pytest

from dcaforge import REPO_ROOT
from dcaforge.config import BUILTIN_CONFIG, PypiSource, find_config, load_config, parse_config
from dcaforge.errors import ConfigError

GOOD = """\
name: upstream
source:
  pypi: llama-cpp-python==0.3.36
  subdir: vendor/llama.cpp
series:
  dir: patches
  range: 0001-0077
feature:
  number: 78
  name: dca
  templates: templates/dca
  marker: "// opencoti F5 dca"
  vars: {chunk: 8192}
"""


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "dcaforge.yaml"
    p.write_text(text)
    return p


def test_good_config_resolves_paths_relative_to_the_file(tmp_path: Path) -> None:
    cfg = parse_config(_write(tmp_path, GOOD))
    assert cfg.series.dir == tmp_path / "patches" and cfg.series.range == (1, 77)
    assert cfg.workspace == tmp_path / "cleanroom" and cfg.room == tmp_path / "cleanroom" / "upstream"
    assert cfg.feature.templates == tmp_path / "templates" / "dca"
    assert cfg.feature_patch == tmp_path / "patches" / "0078-dca.patch"
    assert cfg.source == PypiSource("llama-cpp-python==0.3.36", "vendor/llama.cpp")
    assert cfg.feature.vars == {"chunk": 8192}


@pytest.mark.parametrize(("text", "message", "line"), [
    (GOOD.replace("  range: 0001-0077", "  rnage: 0001-0077"), "unknown key 'series.rnage'", 7),
    (GOOD.replace("name: upstream", "name: upstream\ncolour: red"), "unknown key 'colour'", 2),
    (GOOD.replace("  number: 78", "  number: seventy-eight"),
     "'feature.number' must be an integer, got a string 'seventy-eight'", 9),
    (GOOD.replace("  vars: {chunk: 8192}", "  vars: [1, 2]"), "'feature.vars' must be a mapping, got a list", 13),
    (GOOD.replace("  range: 0001-0077", "  range: first-to-last"), "'series.range' must look like 0001-0077", 7),
    (GOOD.replace("  marker: \"// opencoti F5 dca\"\n", ""), "missing key 'feature.marker'", 8),
    (GOOD.replace("  pypi: llama-cpp-python==0.3.36", "  pypi: [a]"), "'source.pypi' must be a string, got a list", 3),
    (GOOD.replace("  subdir: vendor/llama.cpp", "  subdir: vendor/llama.cpp\n  ref: main"), "unknown key 'source.ref'", 5),
    (GOOD.replace("series:\n", "series:\n  dir: x\n"), "duplicate key 'dir'", 7),
    (GOOD.replace("  dir: patches", "  dir: [patches"), "invalid YAML", "7:8"),
])
def test_errors_name_key_file_and_line(tmp_path: Path, text: str, message: str, line: int | str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as exc:
        parse_config(path)
    assert message in exc.value.message
    assert exc.value.where == f"{path}:{line}"
    assert exc.value.exit_code == 1


def test_builtin_default(tmp_path: Path) -> None:
    assert find_config(None, tmp_path) == BUILTIN_CONFIG
    cfg = load_config(None, tmp_path)
    assert cfg.name == "upstream" and cfg.root == REPO_ROOT
    assert cfg.series.dir == REPO_ROOT / "patches" and cfg.series.range is None
    assert cfg.feature.templates == REPO_ROOT / "templates" / "dca"
    assert cfg.feature.marker == "// opencoti F5 dca" and cfg.feature.number == 78
    assert cfg.room == REPO_ROOT / "cleanroom" / "upstream"
    assert cfg.source == PypiSource("llama-cpp-python==0.3.36", "vendor/llama.cpp")
    # a dcaforge.yaml in the current folder wins
    _write(tmp_path, GOOD)
    assert find_config(None, tmp_path) == tmp_path / "dcaforge.yaml"
