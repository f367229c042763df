"""The user's bookkeeping, kept by capture: the series README's row and the UPSTREAM_SYNC entry."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from dcaforge import REPO_ROOT
from dcaforge.config import parse_config
from dcaforge.configsections import BookkeepingDoc
from dcaforge.errors import ConfigError, DcaforgeError, SafetyError
from dcaforge.patch.capture import capture
from dcaforge.patch.series import apply
from dcaforge.patch.status import status
from dcaforge.patch.verify import verify

from .helpers import snapshot
from .test_config import GOOD, _write

README = textwrap.dedent("""\
    # Series

    ## Current series

    | patch | what | marker |
    |---|---|---|
    | `0001-a` | first | - |
    | [0077-b](0077-b.patch) | seventy-seven | - |
    | 0080-later | after us | - |

    ## Older

    | patch | what |
    |---|---|
    | 0078-gone | an old row in another section |
    """)
SYNC = textwrap.dedent("""\
    # Sync

    ## Markers

    - `// opencoti F5 rolling-kv`: 0070
    - `// opencoti F5 dca-lse`: not ours (a longer marker)
      continued on a second line

    ## Other
    """)


def _bookkeeping(readme: str = "README.md", sync: str = "SYNC.md", extra: str = "") -> str:
    return textwrap.dedent(f"""\
        bookkeeping:
          series_readme:
            file: {readme}
            row: "| `{{{{ feature.id }}}}` | {{{{ n_files }}}} files | `{{{{ marker }}}}` |"
          upstream_sync:
            file: {sync}
            entry: "- `{{{{ marker }}}}`: {{{{ feature.id }}}}, {{{{ marker_sites }}}} lines"
        """) + extra


@pytest.fixture
def bk_project(project):
    """The core project with a series README and an UPSTREAM_SYNC document beside its series."""
    (project.work / "README.md").write_text(README)
    (project.work / "SYNC.md").write_text(SYNC)
    project.config_path.write_text(project.config_path.read_text() + _bookkeeping())
    return project


def test_capture_adds_then_keeps_the_row_and_the_entry(bk_project) -> None:
    cfg = bk_project.config
    apply(cfg)
    cap = capture(cfg)
    readme = (bk_project.work / "README.md").read_text()
    row = f"| `0078-dca` | {len(cap.files)} files | `// opencoti F5 dca` |"
    # in number order, in its own section's table; the other section's 0078 row is not ours
    assert readme == README.replace("| 0080-later", row + "\n| 0080-later")
    sync = (bk_project.work / "SYNC.md").read_text()
    sites = cap.path.read_text().count("// opencoti F5 dca\n")  # the rendered lines that carry the marker
    assert sync == SYNC.replace("  continued on a second line\n",
                                f"  continued on a second line\n- `// opencoti F5 dca`: 0078-dca, {sites} lines\n")
    assert [(u.kind, u.action) for u in cap.bookkeeping] == [("series_readme", "added"), ("upstream_sync", "added")]
    # a second capture: nothing written, nothing duplicated
    again = capture(cfg)
    assert [u.action for u in again.bookkeeping] == ["unchanged", "unchanged"]
    assert (bk_project.work / "README.md").read_text() == readme
    assert (bk_project.work / "SYNC.md").read_text() == sync
    # verify, status and apply do not mistake the files beside the series for anything
    verify(cfg)
    verify(cfg, fresh_render=True)
    assert status(cfg).patch_state == "fresh"
    assert "series unchanged since the last apply" in apply(cfg).notes
    bk_project.assert_source_untouched()


def test_capture_updates_a_renamed_row_and_keeps_crlf(bk_project) -> None:
    crlf = README.replace("| 0080-later", "| `0078-gemma4-dca` | the old name | x |\n| 0080-later").replace("\n", "\r\n")
    (bk_project.work / "README.md").write_bytes(crlf.encode())
    cfg = bk_project.config
    apply(cfg)
    cap = capture(cfg)
    data = (bk_project.work / "README.md").read_bytes()
    assert data.count(b"0078-") == 2 and b"0078-gemma4-dca" not in data.split(b"## Older")[0]
    assert b"\r\n| `0078-dca` |" in data and data.count(b"\r\n") == crlf.count("\r\n") and b"\n\n" not in data
    assert cap.bookkeeping[0].action == "updated"


def test_bookkeeping_errors_come_before_anything_is_written(bk_project) -> None:
    (bk_project.work / "SYNC.md").write_text("# Sync\n\n## Something else\n")
    cfg = bk_project.config
    apply(cfg)
    readme = (bk_project.work / "README.md").read_bytes()
    with pytest.raises(DcaforgeError) as exc:
        capture(cfg)
    assert "no section 'Markers'" in exc.value.message and "Something else" in (exc.value.details or "")
    assert "## Markers" in (exc.value.hint or "")
    assert not cfg.feature_patch.exists() and (bk_project.work / "README.md").read_bytes() == readme
    # -o writes the patch elsewhere and leaves the bookkeeping alone
    res = capture(cfg, bk_project.tmp / "elsewhere.patch")
    assert res.bookkeeping == [] and res.bookkeeping_skipped


def test_two_rows_for_the_patch_are_refused(bk_project) -> None:
    (bk_project.work / "README.md").write_text(README.replace("| 0080-later", "| 0078-a | x | y |\n| `0078-b` | x | y |\n| 0080"))
    cfg = bk_project.config
    apply(cfg)
    with pytest.raises(DcaforgeError, match="2 rows for 0078"):
        capture(cfg)


def test_bookkeeping_inside_the_source_checkout_is_refused(bk_project) -> None:
    (bk_project.source / "README.md").write_text(README)  # an untracked file in the user's checkout
    bk_project.before = snapshot(bk_project.source)
    text = bk_project.config_path.read_text().replace("file: README.md", f"file: {bk_project.source / 'README.md'}")
    bk_project.config_path.write_text(text)
    cfg = bk_project.config
    apply(cfg)
    with pytest.raises(SafetyError, match="inside the source checkout"):
        capture(cfg)
    assert not cfg.feature_patch.exists()
    bk_project.assert_source_untouched()


def test_entry_goes_into_a_table_or_an_empty_section(tmp_path: Path) -> None:
    from dcaforge.feature.bookkeeping import _split, _upsert_entry

    def run(text: str, entry: str) -> str:
        doc = BookkeepingDoc(file=tmp_path / "S.md", section="Markers", template="", where="x")
        lines, eol, final = _split(text)
        _upsert_entry(lines, doc, entry, "// m")
        return eol.join(lines) + (eol if final else "")

    table = "## Markers\n\n| marker | patch |\n|---|---|\n| `// m0` | 0070 |\n\nprose\n"
    assert run(table, "| `// m` | 0078 |") == table.replace("0070 |\n", "0070 |\n| `// m` | 0078 |\n")
    assert run("## Markers\n## Next\n", "- `// m`") == "## Markers\n\n- `// m`\n\n## Next\n"
    assert run("## Markers\n\nSome prose.\n\n## Next\n", "- `// m`") == "## Markers\n\nSome prose.\n\n- `// m`\n\n## Next\n"
    # updated in place, found by the marker (not by a longer marker that starts the same)
    assert run("## Markers\n- `// m-x`: other\n- old `// m`\n", "- `// m`: new") == "## Markers\n- `// m-x`: other\n- `// m`: new\n"


@pytest.mark.parametrize(("extra", "message", "line"), [
    ("  colour: red\n", "unknown key 'bookkeeping.colour'", 21),
    ("", "'bookkeeping.series_readme.row' is not a usable template: 'n_lines' is undefined", 17),
    ("", "'bookkeeping.series_readme.row' is not a usable template: unexpected 'end of print statement'", 17),
    ("", "'bookkeeping.series_readme.file' must be a Markdown file (.md)", 16),
])
def test_bookkeeping_config_errors_name_key_file_and_line(tmp_path: Path, extra: str, message: str, line: int) -> None:
    text = GOOD + _bookkeeping(extra=extra)
    if "table row" in message:
        text = text.replace('row: "| `', 'row: "* `')
    if "contain the marker" in message:
        text = text.replace("- `{{ marker }}`:", "-")
    if "n_lines" in message:
        text = text.replace("{{ n_files }}", "{{ n_lines }}")
    if "unexpected" in message:
        text = text.replace("{{ n_files }}", "{{ n_files + }}")
    if "Markdown file" in message:
        text = text.replace("file: README.md", "file: README.txt")
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as exc:
        parse_config(path)
    assert message in exc.value.message
    assert exc.value.where == f"{path}:{line}"


@pytest.mark.parametrize(("change", "message", "line"), [
    (('row: "| `', 'row: "* `'), "'bookkeeping.series_readme.row' must render to a Markdown table row", 4),
    (("- `{{ marker }}`:", "-"), "'bookkeeping.upstream_sync.entry' must contain the marker", 7),
    (("{{ n_files }} files", "{{ '\\n' }}"), "'bookkeeping.series_readme.row' must render to exactly one line", 4),
])
def test_bookkeeping_templates_are_checked_by_capture_before_anything_is_written(bk_project, change, message, line) -> None:
    """A config is read by every command (status too): its templates are only parsed then, and
    rendered (sandboxed) and checked by capture, before anything is written."""
    text = bk_project.config_path.read_text()
    bk_project.config_path.write_text(text.replace(*change))
    cfg = bk_project.config  # parses: nothing of the template is run here
    status(cfg)
    apply(cfg)
    with pytest.raises(ConfigError) as exc:
        capture(cfg)
    assert message in exc.value.message
    assert exc.value.where == f"{bk_project.config_path}:{text.count(chr(10), 0, text.index('bookkeeping:')) + line}"
    assert exc.value.hint and "nothing was written" in exc.value.hint
    assert not (bk_project.patches / "0078-dca.patch").exists()
    assert (bk_project.work / "README.md").read_text() == README and (bk_project.work / "SYNC.md").read_text() == SYNC


def test_shipped_llamafile_example_parses() -> None:
    cfg = parse_config(REPO_ROOT / "examples" / "llamafile.yaml")
    assert cfg.llama_cpp_dir == "llama.cpp" and cfg.source.submodules is True  # type: ignore[union-attr]
    assert [s.patches for s in cfg.bootstrap if s.patches] == ["llama.cpp.patches/patches"]
    assert cfg.series.dir == REPO_ROOT / "vendors" / "patches" / "llamafile" and cfg.series.range == (1, 77)
    assert cfg.bookkeeping.series_readme and cfg.bookkeeping.series_readme.file.is_file()
    assert cfg.bookkeeping.upstream_sync and cfg.bookkeeping.upstream_sync.file.is_file()
    assert cfg.build.backend == "llamafile"


def test_both_in_one_file(bk_project) -> None:
    (bk_project.work / "README.md").write_text(README + "\n## Markers\n")
    text = bk_project.config_path.read_text().replace("file: SYNC.md", "file: README.md")
    bk_project.config_path.write_text(text)
    cfg = bk_project.config
    apply(cfg)
    capture(cfg)
    data = (bk_project.work / "README.md").read_text()
    assert data.count("| `0078-dca` |") == 1 and data.endswith("## Markers\n\n- `// opencoti F5 dca`: 0078-dca, 3 lines\n")
    assert [u.action for u in capture(cfg).bookkeeping] == ["unchanged", "unchanged"]
    assert (bk_project.work / "README.md").read_text() == data


def test_capture_never_writes_into_the_source_or_the_room(bk_project) -> None:
    cfg = bk_project.config
    apply(cfg)
    with pytest.raises(SafetyError, match="inside the source checkout"):
        capture(cfg, bk_project.source / "0078-dca.patch")
    with pytest.raises(SafetyError, match="inside the clean-room tree"):
        capture(cfg, cfg.room / "0078-dca.patch")
    bk_project.assert_source_untouched()
