"""A few end-to-end runs through the typer app: exit codes and what is printed."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from dcaforge.cli import app

from .conftest import UNANCHORED_EDIT, write_feature
from .helpers import make_patch_git, replace_line

runner = CliRunner()


def _run(*args: str):
    return runner.invoke(app, list(args))


def test_cli_main_job_exit_codes(project) -> None:
    c = str(project.config_path)
    r = _run("apply", "-c", c)
    assert r.exit_code == 0, r.output
    assert "baseline:" in r.output
    r = _run("capture", "-c", c)
    assert r.exit_code == 0 and "wrote" in r.output
    r = _run("verify", "-c", c, "--fresh-render")
    assert r.exit_code == 0 and "byte-identical" in r.output
    r = _run("status", "-c", c, "--json")
    data = json.loads(r.stdout)
    assert data["patch_state"] == "fresh" and data["phase"] == "applied"
    r = _run("render", "-c", c, "--check")
    assert r.exit_code == 0
    project.assert_source_untouched()


def test_cli_conflict_exits_3_and_says_how_to_resume(project) -> None:
    def edit(value: str):
        return lambda tree: replace_line(tree / "src/llama.cpp", "int line_010 = 10;", f"int line_010 = {value};")
    project.add_patch("0001-a.patch", make_patch_git(project.source, edit("0"), project.tmp, "a"))
    project.add_patch("0002-a-again.patch", make_patch_git(project.source, edit("1"), project.tmp, "b"))
    r = _run("apply", "-c", str(project.config_path))
    assert r.exit_code == 3
    assert "0002-a-again.patch does not apply" in r.output
    assert "hunk #1 @@ -7,7 +7,7 @@" in r.output
    assert "dcaforge apply --continue" in r.output
    project.assert_source_untouched()


def test_cli_config_error_exits_1_with_location(project) -> None:
    project.config_path.write_text(project.config_path.read_text().replace("  number: 78", "  numbr: 78"))
    r = _run("status", "-c", str(project.config_path))
    assert r.exit_code == 1
    assert "unknown key 'feature.numbr'" in r.output and f"{project.config_path}:" in r.output


def test_cli_render_check_exits_3_on_missing_anchor(project) -> None:
    c = str(project.config_path)
    assert _run("apply", "-c", c, "--no-render").exit_code == 0
    write_feature(project.work, UNANCHORED_EDIT)
    r = _run("render", "-c", c, "--check")
    assert r.exit_code == 3 and "missing" in r.output and "int line_010" in r.output
    r = _run("render", "-c", c)
    assert r.exit_code == 3 and "anchor matches nowhere" in r.output


def test_cli_render_check_says_which_alternative_fits(project) -> None:
    c = str(project.config_path)
    assert _run("apply", "-c", c, "--no-render").exit_code == 0
    write_feature(project.work, UNANCHORED_EDIT + (
        "    alternatives:\n"
        "      - anchor: 'int line_010 = 10;'\n"
        "  - file: src/llama.cpp\n"
        "    when: \"tree.has('src/old.cpp')\"\n"
        "    anchor: 'nothing'\n"
        "    action: replace\n"
        "    text: 'y'\n"))
    r = _run("render", "-c", c, "--check")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[1].split() == ["#", "file", "action", "fit", "matches", "status", "note"]
    assert lines[2].split() == ["0", "src/llama.cpp", "replace", "alt", "1", "1/1", "ok"]
    assert lines[3].split()[:6] == ["1", "-", "replace", "-", "0/1", "skipped"]
    assert "when: tree.has('src/old.cpp')" in lines[3]
    assert "1 fit (1 by an alternative), 1 skipped, 0 do not fit, of 2 edits" in r.output
    other = project.tmp / "other"
    (other / "src").mkdir(parents=True)
    (other / "src/llama.cpp").write_text("int line_011 = 11;\n")
    r = _run("render", "-c", c, "--check", "--tree", str(other))
    assert r.exit_code == 3
    out = r.output.splitlines()
    table = out.index("misfits: 0 drifted, 1 absent")
    assert out[table + 1].split() == ["#", "file", "class", "why"]
    row = table + 2
    # what the anchor hooks (line_0100) is in no file of the tree: absent, not drifted
    assert out[row].split()[:3] == ["0", "src/llama.cpp", "absent"] and "`line_0100` in no file of this tree" in out[row]
    # every anchor tried, with the nearest lines of the pristine baseline file
    assert out[row + 1].strip() == "anchor 'int line_0100 = 100;' (manifest line 2):"
    assert out[row + 3].strip() == "alternative 1 'int line_010 = 10;' (manifest line 2):"
    assert out[row + 4].strip() == "1: int line_011 = 11;"
