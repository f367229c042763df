"""Consent (dcaforge/trust.py): a config's commands run only from a trusted config; the pip download
of an sdist that is not cached yet is such a command (pip runs the package's build backend)."""

from __future__ import annotations

import os
import tarfile
import textwrap
from pathlib import Path

import pytest

from dcaforge.config import parse_config
from dcaforge.patch.series import apply
from dcaforge.trust import TrustError, settings_path, trust_of


def evil_sdist(folder: Path, marker: Path) -> None:
    """A real sdist whose in-tree build backend writes ``marker`` when pip prepares its metadata."""
    src = folder / "build" / "evilpkg-1.0"
    src.mkdir(parents=True)
    (src / "pyproject.toml").write_text('[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n')
    (src / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: evilpkg\nVersion: 1.0\n")
    (src / "backend.py").write_text(textwrap.dedent(f"""\
        import os
        open({str(marker)!r}, "w").write("the build backend ran")
        def get_requires_for_build_wheel(config_settings=None):
            return []
        def prepare_metadata_for_build_wheel(d, config_settings=None):
            os.makedirs(os.path.join(d, "evilpkg-1.0.dist-info"))
            with open(os.path.join(d, "evilpkg-1.0.dist-info", "METADATA"), "w") as fh:
                fh.write("Metadata-Version: 2.1\\nName: evilpkg\\nVersion: 1.0\\n")
            return "evilpkg-1.0.dist-info"
        """))
    with tarfile.open(folder / "evilpkg-1.0.tar.gz", "w:gz") as tf:
        tf.add(src, arcname="evilpkg-1.0")


@pytest.fixture
def evil_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    links = tmp_path / "links"
    links.mkdir()
    marker = tmp_path / "backend-ran"
    evil_sdist(links, marker)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("PIP_CONSTRAINT", "")
    return marker


def test_an_uncached_sdist_is_downloaded_only_with_consent(project, evil_index: Path) -> None:
    cfg = project.write_config(source="pypi: evilpkg==1.0\nsubdir: .")
    with pytest.raises(TrustError) as exc:
        apply(cfg)
    assert "downloading it runs its build backend" in exc.value.message
    assert "--trust" in (exc.value.hint or "") and not evil_index.exists()
    assert not (project.tmp / "cache" / "sdists").exists() or not any((project.tmp / "cache" / "sdists").rglob("*.tar.gz"))
    # with consent pip runs, and so does the package's backend: that is what --trust allows
    apply(cfg, trust=True, render=False)
    assert evil_index.read_text() == "the build backend ran"
    # cached now: no pip, no consent needed
    evil_index.unlink()
    apply(cfg, fresh=True, render=False)
    assert not evil_index.exists()


def test_settings_file_and_flag(project, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = project.config
    monkeypatch.setenv("XDG_CONFIG_HOME", str(project.tmp / "xdg"))
    assert settings_path() == project.tmp / "xdg" / "dcaforge" / "settings.yaml"
    assert not trust_of(cfg, False).trusted and trust_of(cfg, True).why == "--trust"
    settings_path().parent.mkdir(parents=True)
    settings_path().write_text(f"trusted:\n  - {project.work}/\n")
    assert trust_of(cfg, False).trusted
    settings_path().write_text(f"trusted:\n  - {project.work}\n")  # a folder without / : only that exact path
    assert not trust_of(cfg, False).trusted
    settings_path().write_text(f"trusted:\n  - {project.config_path}\n")
    assert trust_of(parse_config(project.config_path), False).why.endswith(str(project.config_path))
    monkeypatch.delenv("XDG_CONFIG_HOME")
    assert settings_path() == Path(os.environ["HOME"]) / ".config" / "dcaforge" / "settings.yaml"
