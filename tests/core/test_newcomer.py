"""The newcomer's path, from a clone to a long-context answer (issue 34): the README's venv step run as pasted,
its test count against pytest's, the fast-test marker, the examples copied elsewhere, the built-in default in a
wheel (no ``-e``), plain ``--help`` and shell completion, ``--json`` on every command that reports, ``status``
after an interrupted apply, and the docs' claims about the default (0 patches, the baseline id, what ``build``
builds)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dcaforge import REPO_ROOT
from dcaforge.cli import app
from dcaforge.config import BUILTIN_CONFIG, load_config, parse_config
from dcaforge.errors import ConfigError, InterruptedRun
from dcaforge.feature.drift import Canary
from dcaforge.feature.render import RenderResult
from dcaforge.feature.templatize import TemplatizeResult
from dcaforge.patch.capture import CaptureResult
from dcaforge.patch.discover import discover
from dcaforge.patch.series import ApplyHooks, ApplyResult, apply
from dcaforge.patch.status import StatusResult, status
from dcaforge.patch.verify import VerifyResult

from .conftest import Project
from .helpers import git_init, make_patch_git, replace_line

README = (REPO_ROOT / "README.md").read_text()
COMMANDS = ("apply", "render", "capture", "verify", "status", "build", "try", "drift", "gate", "templatize")


def _block(heading: str) -> str:
    start = README.index(f"## {heading}")
    return README[start:README.index("\n## ", start + 1)]


# --- the README ---------------------------------------------------------------------------------------------

def test_the_venv_step_works_as_pasted(tmp_path: Path) -> None:
    """The README's venv line, run by bash as pasted in a fresh folder: the environment is made and active (its
    python and pip first on PATH), so the pip install after it goes into it, not into the system Python."""
    line = next(ln for ln in _block("The commands").splitlines() if ln.startswith("python3 -m venv"))
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME")}
    # python3 on PATH is the one running the tests (a system Python on Debian 12 / Ubuntu >= 23.04)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python3").symlink_to(getattr(sys, "_base_executable", sys.executable))
    env["PATH"] = f"{bindir}{os.pathsep}{env['PATH']}"
    r = subprocess.run(["bash", "-c", f"{line} && command -v python pip && python -c 'import sys; print(sys.prefix)'"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr
    python, pip, prefix = r.stdout.split()
    venv = tmp_path / ".venv"
    assert python == str(venv / "bin" / "python") and pip == str(venv / "bin" / "pip") and Path(prefix) == venv
    assert "sudo apt-get install python3-venv" in _block("Before you start")


def _collect(*args: str) -> list[str]:
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider",
                        *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return [ln for ln in r.stdout.splitlines() if "::" in ln]


def test_the_readme_counts_the_tests_and_slow_marks_the_e2e_ones() -> None:
    """The README's number of tests is pytest's within 5% (update the number between its markers when it is
    not); `pytest -m "not slow"` leaves out exactly tests/e2e."""
    stated = int(re.search(r"<!-- test-count -->about (\d+)<!-- /test-count -->", README).group(1))  # type: ignore[union-attr]
    every = _collect()
    assert abs(len(every) - stated) <= 0.05 * stated, f"README says about {stated} tests, pytest collects {len(every)}"
    fast = _collect("-m", "not slow")
    assert set(every) - set(fast) == {t for t in every if t.startswith("tests/e2e/")}
    assert fast and all(t.startswith(("tests/core/", "tests/hostile/")) for t in fast)
    assert 'pytest -m "not slow"' in README


def test_what_just_happened_says_what_the_default_applies() -> None:
    """The default's series has no patch below the feature: README says 0 patches, and so does the config."""
    cfg = parse_config(BUILTIN_CONFIG)
    assert discover(cfg) == []
    assert "here 0 patches" in _block("What just happened")
    # the baseline id docs/dca.md quotes is the import commit docs/config.md names (tests/e2e checks a real apply)
    dca = re.search(r"<!-- baseline -->([0-9a-f]{12})<!-- /baseline -->", (REPO_ROOT / "docs" / "dca.md").read_text())
    full = re.search(r"`([0-9a-f]{40})`", (REPO_ROOT / "docs" / "config.md").read_text())
    assert dca and full and full.group(1).startswith(dca.group(1))


def test_the_default_build_makes_what_a_user_runs() -> None:
    targets = parse_config(BUILTIN_CONFIG).build.cmake.targets
    assert {"llama-server", "llama-perplexity"} <= set(targets) and {"llama-cli", "llama-completion"} & set(targets)
    use = _block("Use the result")
    assert "dcaforge build" in use and "--dca on" in use and "Dual Chunk Attention: the slot context" in use
    assert "dcaforge try " in use


# --- configs copied out of examples/ --------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["upstream", "llamafile"])
def test_examples_say_how_to_copy_them(tmp_path: Path, name: str) -> None:
    """Each example says how to use it from elsewhere, and doing what it says gives the same paths."""
    original = REPO_ROOT / "examples" / f"{name}.yaml"
    text = original.read_text()
    assert f"dcaforge apply -c /path/to/dcaforge/examples/{name}.yaml" in text and "root: /path/to/dcaforge" in text
    copy = tmp_path / "mine" / "dcaforge.yaml"
    copy.parent.mkdir()
    copy.write_text(text.replace("\nroot: ..\n", f"\nroot: {REPO_ROOT}\n"))
    a, b = parse_config(original), parse_config(copy)
    assert (b.root, b.room, b.series.dir, b.feature.templates) == (a.root, a.room, a.series.dir, a.feature.templates)


def test_a_copy_that_climbs_out_of_its_checkout_is_refused(tmp_path: Path) -> None:
    """examples/upstream.yaml copied into another git checkout: its `root: ..` names the folder above that checkout,
    where the clean room would land. Refused, naming where root and the room resolved; nothing is made."""
    proj = tmp_path / "work" / "proj"
    git_init(proj, {"README": "mine\n"})
    cfgp = proj / "dcaforge.yaml"
    shutil.copy(REPO_ROOT / "examples" / "upstream.yaml", cfgp)
    with pytest.raises(ConfigError) as ei:
        parse_config(cfgp)
    e = ei.value
    assert "the clean room would land outside the working tree that holds this config" in e.message
    assert f"root: .. resolves to {tmp_path / 'work'}, above {proj}" in e.message
    assert str(tmp_path / "work" / "cleanroom" / "upstream") in e.message
    assert e.where == f"{cfgp}:{next(i for i, ln in enumerate(cfgp.read_text().splitlines(), 1) if ln == 'root: ..')}"
    assert "set root:" in (e.hint or "")
    r = CliRunner().invoke(app, ["apply", "-c", str(cfgp)])
    assert r.exit_code == 1 and "outside the working tree" in r.output
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == ["proj"]  # no cleanroom/ above it
    # the room kept inside the checkout on purpose: allowed
    cfgp.write_text(cfgp.read_text().replace("cleanroom: cleanroom", f"cleanroom: {proj / 'rooms'}"))
    assert parse_config(cfgp).room == proj / "rooms" / "upstream"


def test_a_copy_whose_templates_are_elsewhere_is_refused_before_anything_is_made(tmp_path: Path) -> None:
    """Copied into a plain folder, `root: ..` names its parent, which has no templates/dca: apply used to exit 0
    and render nothing; now it stops before the download or the room, naming the folder and the config's line."""
    cfgp = tmp_path / "copies" / "up.yaml"
    cfgp.parent.mkdir()
    shutil.copy(REPO_ROOT / "examples" / "upstream.yaml", cfgp)
    r = CliRunner().invoke(app, ["apply", "-c", str(cfgp)])
    assert r.exit_code == 1, r.output
    assert f"error: the feature folder {tmp_path / 'templates' / 'dca'} does not exist" in r.output
    line = next(i for i, ln in enumerate(cfgp.read_text().splitlines(), 1) if ln.strip().startswith("templates:"))
    assert f"where: {cfgp}:{line}" in r.output and f"root: {tmp_path}" in r.output
    assert not (tmp_path / "cleanroom").exists()


# --- the built-in default without -e ------------------------------------------------------------------------

def test_a_wheel_carries_the_builtin_default(tmp_path: Path) -> None:
    """`pip install .` (a wheel, no -e) used to lose the default config: the wheel now carries it, with the
    templates and the patch it names, byte for byte; run from elsewhere it keeps its rooms in ./cleanroom there,
    and capture/templatize refuse to write into the installed package."""
    src = tmp_path / "src"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO_ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for rel in files:
        if rel and (REPO_ROOT / rel).is_file() and not rel.startswith(("tests/", "bench/", "vendors/")):
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO_ROOT / rel, src / rel)
    # offline where this Python has setuptools >= 64 (else pip fetches the build backend, as for any install)
    offline = ["--no-build-isolation"] if _has_setuptools() else []
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", *offline, "-w", str(tmp_path / "wheels"),
                        str(src)], cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    (whl,) = (tmp_path / "wheels").glob("dcaforge-*.whl")
    unpacked = tmp_path / "site"
    with zipfile.ZipFile(whl) as zf:
        zf.extractall(unpacked)
    builtin = unpacked / "dcaforge" / "builtin"
    assert (builtin / "examples" / "upstream.yaml").read_bytes() == (REPO_ROOT / "examples" / "upstream.yaml").read_bytes()
    assert (builtin / "patches" / "0078-dca.patch").read_bytes() == (REPO_ROOT / "patches" / "0078-dca.patch").read_bytes()
    shipped = {p.relative_to(builtin / "templates").as_posix() for p in (builtin / "templates").rglob("*") if p.is_file()}
    ours = {p.relative_to(REPO_ROOT / "templates").as_posix() for p in (REPO_ROOT / "templates" / "dca").rglob("*") if p.is_file()}
    assert shipped == ours
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    probe = ("import dcaforge, json; from dcaforge.config import load_config; c = load_config(); "
             "print(json.dumps([dcaforge.__file__, str(c.path), str(c.room), str(c.feature.templates), str(c.feature_patch)]))")
    env = {**os.environ, "PYTHONPATH": str(unpacked)}
    r = subprocess.run([sys.executable, "-c", probe], cwd=elsewhere, env=env, capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    init, path, room, templates, patch = json.loads(r.stdout)
    assert init == str(unpacked / "dcaforge" / "__init__.py") and path == str(builtin / "examples" / "upstream.yaml")
    assert room == str(elsewhere / "cleanroom" / "upstream")
    assert templates == str(builtin / "templates" / "dca") and patch == str(builtin / "patches" / "0078-dca.patch")
    refusal = ("from pathlib import Path; from dcaforge.config import load_config, read_only_default, is_packaged; "
               "c = load_config(); print(is_packaged(c.feature_patch), is_packaged(c.feature.templates))")
    r = subprocess.run([sys.executable, "-c", refusal], cwd=elsewhere, env=env, capture_output=True, text=True, check=False)
    assert r.stdout.split() == ["True", "True"], r.stderr


def _has_setuptools() -> bool:
    """setuptools >= 64 that builds wheels here (with its own bdist_wheel from 70.1, else the wheel package)."""
    import importlib.util

    try:
        import setuptools
    except ImportError:
        return False
    version = tuple(int(x) for x in re.findall(r"\d+", setuptools.__version__)[:2])
    return version >= (70, 1) or (version >= (64, 0) and importlib.util.find_spec("wheel") is not None)


def test_without_a_builtin_default_the_hint_says_what_to_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("dcaforge.config.BUILTIN_CONFIG", tmp_path / "gone" / "upstream.yaml")
    r = CliRunner().invoke(app, ["status"])
    assert r.exit_code == 1 and "no built-in default" in r.output
    nexts = [ln for ln in r.output.splitlines() if ln.strip().startswith("next:")]
    assert nexts and "pass your config with -c" in nexts[0] and "CONFIG" not in nexts[0]


# --- the command line --------------------------------------------------------------------------------------

@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_reads_as_plain_flags_within_80_columns(command: str | None) -> None:
    r = CliRunner().invoke(app, [*([command] if command else []), "--help"], terminal_width=80)
    assert r.exit_code == 0, r.output
    assert "<bool>" not in r.output and "<int>" not in r.output and "<list" not in r.output
    assert max(len(ln) for ln in r.output.splitlines()) <= 80, r.output
    assert "╭" not in r.output  # no boxes
    if command is None:
        assert "--install-completion" in r.output
        assert all(re.search(rf"(?m)^  {c}\s+\S", r.output) for c in COMMANDS), r.output
    else:
        assert "-c, --config CONFIG" in r.output


def test_shell_completion_is_on(tmp_path: Path) -> None:
    """bash's completion protocol against the real entry point: commands and options complete."""
    def complete(words: str) -> list[str]:
        env = {**os.environ, "_DCAFORGE_COMPLETE": "complete_bash", "COMP_WORDS": words,
               "COMP_CWORD": str(len(words.split()) - 1)}
        r = subprocess.run([sys.executable, "-c", "from dcaforge.cli import main; main()"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, check=False)
        assert r.returncode == 0, r.stderr
        return r.stdout.split()

    assert complete("dcaforge bu") == ["build"]
    assert "--targets" in complete("dcaforge build --ta") and "--dry-run" in complete("dcaforge build --")
    assert complete("dcaforge st") == ["status"]


def test_every_command_that_reports_prints_json(project: Project, tmp_path: Path) -> None:
    """--json on each command (build's in test_build, try's and gate's in tests/e2e): one object on stdout, every
    field of the library's result by its name, and "command"."""
    c = str(project.config_path)

    def run(*args: str, code: int = 0) -> dict:
        r = CliRunner().invoke(app, [*args, "-c", c, "--json"])
        assert r.exit_code == code, r.output
        data = json.loads(r.stdout)
        assert data["command"] == args[0]
        return data

    def fields(cls: type) -> set[str]:
        return {f.name for f in dataclasses.fields(cls)}

    data = run("apply")
    assert set(data) >= fields(ApplyResult) and data["render"]["written"] and data["total"] == 0
    assert set(data["render"]) >= fields(RenderResult)
    data = run("capture")
    assert set(data) >= fields(CaptureResult) and data["written"] is True and data["path"] == str(project.patches / "0078-dca.patch")
    data = run("verify")
    assert set(data) >= fields(VerifyResult) and data["ok"] is True
    data = run("status")
    assert set(data) >= fields(StatusResult) and data["patch_state"] == "fresh"
    data = run("render")
    assert data["check"] is False and data["written"] == [] and data["unchanged"]
    data = run("render", "--check")
    assert data["ok"] is True and data["edits"][0]["status"] in ("ok", "skipped")
    data = run("templatize")
    assert set(data) >= fields(TemplatizeResult)
    data = run("drift", "--tree", str(project.source))
    assert set(data) >= fields(Canary) and data["ok"] is True and data["fit"] >= 1


# --- status after an interrupted apply ----------------------------------------------------------------------

def _edit(n: int, value: int):
    return lambda tree: replace_line(tree / "src/llama.cpp", f"int line_{n:03d} = {n};", f"int line_{n:03d} = {value};")


def test_status_after_an_interrupted_apply_says_interrupted_not_stale(project: Project) -> None:
    """A fresh patch, then a series change whose apply is interrupted (Ctrl-C at its second patch): status used to
    call the patch stale (the half-made room's diff against the old baseline); now it says the apply was
    interrupted and prints the command that goes on, which, pasted, leaves the patch fresh again."""
    cfg = project.config
    apply(cfg)
    assert CliRunner().invoke(app, ["capture", "-c", str(project.config_path)]).exit_code == 0
    assert status(cfg).patch_state == "fresh"
    project.add_patch("0001-a.patch", make_patch_git(project.source, _edit(10, -1), project.tmp, "a"))
    project.add_patch("0002-b.patch", make_patch_git(project.source, _edit(20, -2), project.tmp, "b"))

    def stop_at_second(i: int, n: int, patch: object) -> None:
        if i == 1:
            raise KeyboardInterrupt

    with pytest.raises(InterruptedRun):
        apply(cfg, hooks=ApplyHooks(on_patch=stop_at_second))
    res = status(cfg)
    assert (res.phase, res.patch_state, res.interrupted) == ("interrupted", "interrupted", "applying the series")
    assert res.series_applied == 1 and res.next == "`dcaforge apply --continue`"
    r = CliRunner().invoke(app, ["status", "-c", str(project.config_path)])
    assert r.exit_code == 0 and "stale" not in r.output, r.output
    assert "(interrupted)" in r.output and "apply stopped while applying the series" in r.output
    nxt = next(ln for ln in r.output.splitlines() if ln.startswith("next"))
    assert "interrupted, run apply again" in nxt and f"`dcaforge apply --continue -c {project.config_path}`" in nxt
    assert CliRunner().invoke(app, ["apply", "--continue", "-c", str(project.config_path)]).exit_code == 0
    res = status(cfg)
    assert res.interrupted is None and res.next is None and res.patch_state == "fresh"  # the series' edits are elsewhere


def test_the_default_config_loads_from_anywhere(tmp_path: Path) -> None:
    """Without -c and ./dcaforge.yaml: the built-in default of this checkout (an editable install)."""
    cfg = load_config(None, tmp_path)
    assert cfg.path == BUILTIN_CONFIG.resolve() and cfg.room == REPO_ROOT / "cleanroom" / "upstream"
