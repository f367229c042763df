"""Edit bodies in template files (``text_file:``): the shipped manifest keeps no multi-line body,
a body file renders exactly as the same text inline, and a bad ``text_file`` is refused at load
naming the manifest line, the key and the value."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from dcaforge.errors import ConfigError
from dcaforge.feature.manifest import load_manifest, manifest_digest
from dcaforge.feature.plan import plan
from dcaforge.room.trees import DirTree

from .conftest import write_feature
from .helpers import build_tree, source_files

SHIPPED = Path(__file__).resolve().parents[2] / "templates" / "dca"


def test_the_shipped_manifest_keeps_no_multi_line_body_and_every_body_file_is_used() -> None:
    m = load_manifest(SHIPPED)  # also checks that every text_file exists inside the folder
    bodies = [(e.index, x) for e in m.edits for x in (e, *e.alternatives)]
    inline = [(i, x.text) for i, x in bodies if x.text_file is None and x.text is not None]
    assert inline, "the one-line bodies stay inline"
    assert [(i, t) for i, t in inline if len(t.splitlines()) > 1] == []
    files = [x.text_file for _i, x in bodies if x.text_file is not None]
    assert len(files) >= 60 and len(set(files)) == len(files)
    on_disk = {p.relative_to(SHIPPED).as_posix() for p in (SHIPPED / "edits").rglob("*") if p.is_file()}
    assert on_disk == set(files), "a body file that no edit uses, or a text_file outside edits/"
    # and the manifest's own text says so: no block scalar under a text key
    raw = (SHIPPED / "manifest.yaml").read_text()
    lines = raw.splitlines()
    for k, line in enumerate(lines):
        if line.lstrip().startswith(("text: |", "text: >")):
            body = []
            indent = len(line) - len(line.lstrip())
            for nxt in lines[k + 1:]:
                if nxt.strip() and len(nxt) - len(nxt.lstrip()) <= indent:
                    break
                body.append(nxt)
            assert len([b for b in body if b.strip()]) <= 1, f"manifest.yaml:{k + 1} holds a multi-line body"


def _feature(tmp: Path, manifest: str, bodies: dict[str, str]) -> Path:
    folder = write_feature(tmp / "work", textwrap.dedent(manifest))
    for rel, text in bodies.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text, newline="")
    return folder


def _source_tree(project) -> Path:
    """project.tmp/tree: the source's files as a plain folder (read through DirTree)."""
    tree_dir = project.tmp / "tree"
    build_tree(tree_dir, source_files())
    return tree_dir


def _tricky_with(after: str) -> dict[str, str]:
    """The TRICKY bodies with ``after`` as edits/src/llama.cpp/after.inc.j2."""
    return {**TRICKY, "edits/src/llama.cpp/after.inc.j2": after}


TRICKY = {  # leading blank line, no final newline, trailing blank lines, a group reference, Jinja
    "edits/src/llama.cpp/after.inc.j2": "\n    int dca = {{ vars.chunk }}; {{ marker }}\n\n",
    "edits/src/llama.cpp/replace.inc.j2": "\\1int line_010 = -10; {{ marker }}\n\\1int extra = 1;\n",
    "edits/src/llama.cpp/before.inc.j2": "// {{ feature.id }}: no final newline",
}

AS_FILES = """\
    edits:
      - file: src/llama.cpp
        anchor: '(?m)^int line_005 = 5;\\n'
        action: insert_after
        text_file: edits/src/llama.cpp/after.inc.j2
      - file: src/llama.cpp
        anchor: '(?m)^()int line_010 = 10;\\n'
        action: replace
        text_file: edits/src/llama.cpp/replace.inc.j2
      - file: src/llama.cpp
        anchor: 'no such line'
        action: insert_before
        text: 'unused'
        alternatives:
          - anchor: '(?m)^int line_020'
            text_file: edits/src/llama.cpp/before.inc.j2
    """


def test_a_body_file_renders_exactly_as_the_same_text_inline(project) -> None:
    cfg = project.config
    tree_dir = _source_tree(project)
    folder = _feature(project.tmp, AS_FILES, TRICKY)
    got = plan(cfg, DirTree(tree_dir), load_manifest(folder)).outputs
    text = got["src/llama.cpp"][0].decode()
    assert "int line_005 = 5;\n\n    int dca = 8192; // opencoti F5 dca\n\nint line_006" in text
    assert "int line_010 = -10; // opencoti F5 dca\nint extra = 1;\nint line_011" in text
    assert "// 0078-dca: no final newlineint line_020 = 20;" in text
    # the same bodies inline (as YAML double-quoted strings) give the same bytes
    inline = AS_FILES
    for rel, body in TRICKY.items():
        quoted = '"' + body.replace("\\", "\\\\").replace("\n", "\\n") + '"'
        inline = inline.replace(f"text_file: {rel}", f"text: {quoted}")
    assert "text_file" not in inline
    folder2 = _feature(project.tmp / "inline", inline, {})
    assert plan(cfg, DirTree(tree_dir), load_manifest(folder2)).outputs == got


def test_a_template_error_in_a_body_file_names_the_file_and_line(project) -> None:
    cfg = project.config
    tree_dir = _source_tree(project)
    bodies = _tricky_with("line one\nline two {{ vars.no_such_var }}\n")
    folder = _feature(project.tmp, AS_FILES, bodies)
    with pytest.raises(ConfigError, match="no_such_var") as exc:
        plan(cfg, DirTree(tree_dir), load_manifest(folder))
    assert exc.value.where == f"{folder / 'edits/src/llama.cpp/after.inc.j2'}:2"
    assert f"edits[0].text_file of {folder / 'manifest.yaml'}:2" in exc.value.message
    bodies["edits/src/llama.cpp/after.inc.j2"] = "line one\n\n{% if x %}never closed\n"
    folder = _feature(project.tmp / "syntax", AS_FILES, bodies)
    with pytest.raises(ConfigError, match="syntax error") as exc:
        plan(cfg, DirTree(tree_dir), load_manifest(folder))
    assert (exc.value.where or "").startswith(f"{folder / 'edits/src/llama.cpp/after.inc.j2'}:")


def _load_error(folder: Path, old: str, new: str) -> ConfigError:
    manifest = folder / "manifest.yaml"
    text = manifest.read_text()
    assert old in text
    manifest.write_text(text.replace(old, new, 1))
    with pytest.raises(ConfigError) as exc:
        load_manifest(folder)
    return exc.value


@pytest.mark.parametrize(("value", "message"), [
    ("edits/src/llama.cpp/missing.inc.j2", "no such file"),
    ("../outside.inc.j2", "must be a relative path inside the feature folder"),
    ("edits/../edits/src/llama.cpp/after.inc.j2", "must be a relative path inside the feature folder"),
    ("/etc/hostname", "must be a relative path inside the feature folder"),
    ("edits/src/llama.cpp/link.inc.j2", "leads out of the feature folder"),
])
def test_a_bad_text_file_is_refused_naming_line_key_and_value(tmp_path: Path, value: str, message: str) -> None:
    folder = _feature(tmp_path, AS_FILES, TRICKY)
    (tmp_path / "outside.inc.j2").write_text("outside\n")
    os.symlink(tmp_path / "outside.inc.j2", folder / "edits/src/llama.cpp/link.inc.j2")
    err = _load_error(folder, "text_file: edits/src/llama.cpp/replace.inc.j2", f"text_file: {value}")
    assert message in err.message
    assert "'edits[1].text_file'" in err.message
    assert err.where == f"{folder / 'manifest.yaml'}:9"
    if "no such file" not in message:
        assert repr(value) in err.message


def test_a_link_inside_the_folder_is_fine(tmp_path: Path) -> None:
    folder = _feature(tmp_path, AS_FILES, TRICKY)
    os.symlink("replace.inc.j2", folder / "edits/src/llama.cpp/same.inc.j2")
    (folder / "manifest.yaml").write_text((folder / "manifest.yaml").read_text().replace(
        "edits/src/llama.cpp/replace.inc.j2", "edits/src/llama.cpp/same.inc.j2"))
    m = load_manifest(folder)
    assert m.edits[1].text == TRICKY["edits/src/llama.cpp/replace.inc.j2"]


def test_text_and_text_file_together_or_neither(tmp_path: Path) -> None:
    folder = _feature(tmp_path, AS_FILES, TRICKY)
    err = _load_error(folder, "text_file: edits/src/llama.cpp/replace.inc.j2",
                      "text: 'x'\n    text_file: edits/src/llama.cpp/replace.inc.j2")
    assert err.message == "'edits[1].text' and 'edits[1].text_file' are both set"
    assert err.where == f"{folder / 'manifest.yaml'}:10"
    folder = _feature(tmp_path / "alt", AS_FILES, TRICKY)
    err = _load_error(folder, "        text_file: edits/src/llama.cpp/before.inc.j2",
                      "        text: 'y'\n        text_file: edits/src/llama.cpp/before.inc.j2")
    assert err.message == "'edits[2].alternatives[0].text' and 'edits[2].alternatives[0].text_file' are both set"
    folder = _feature(tmp_path / "neither", AS_FILES, TRICKY)
    err = _load_error(folder, "    text_file: edits/src/llama.cpp/replace.inc.j2\n", "")
    assert err.message == "missing key 'edits[1].text'" and "text_file" in (err.hint or "")
    folder = _feature(tmp_path / "type", AS_FILES, TRICKY)
    err = _load_error(folder, "text_file: edits/src/llama.cpp/replace.inc.j2", "text_file: [a, b]")
    assert err.message == "'edits[1].text_file' must be a string, got a list ['a', 'b']"


def test_a_files_template_may_not_leave_the_folder_either(tmp_path: Path) -> None:
    folder = _feature(tmp_path, AS_FILES, TRICKY)
    (tmp_path / "outside.j2").write_text("outside\n")
    os.symlink(tmp_path / "outside.j2", folder / "src/llama-dca.cpp.j2.link")
    err = _load_error(folder, "edits:\n", "files:\n  - template: src/llama-dca.cpp.j2.link\n    dest: x.cpp\nedits:\n")
    assert "'files[0].template'" in err.message and "leads out of the feature folder" in err.message


def test_an_include_may_not_leave_the_folder_through_a_link(project) -> None:
    cfg = project.config
    tree_dir = _source_tree(project)
    folder = _feature(project.tmp, AS_FILES, _tricky_with("{% include 'edits/common.inc.j2' %}\n"))
    (project.tmp / "secret.txt").write_text("outside\n")
    os.symlink(project.tmp / "secret.txt", folder / "edits/common.inc.j2")
    with pytest.raises(ConfigError, match="'edits/common.inc.j2' resolves to .*, outside the feature folder"):
        plan(cfg, DirTree(tree_dir), load_manifest(folder))
    (folder / "edits/common.inc.j2").unlink()
    (folder / "edits/common.inc.j2").write_text("inside\n")
    text = plan(cfg, DirTree(tree_dir), load_manifest(folder)).outputs["src/llama.cpp"][0].decode()
    assert "int line_005 = 5;\ninside\n\nint line_006" in text


def test_status_sees_a_changed_body_file_as_changed_templates(project) -> None:
    from dcaforge.feature.render import render
    from dcaforge.patch.series import apply
    from dcaforge.patch.status import status

    cfg = project.config
    apply(cfg, render=False)
    _feature(project.tmp, AS_FILES, TRICKY)  # the project's own feature folder (tmp/work/templates/dca)
    render(cfg)
    assert status(cfg).templates_changed is False
    body = cfg.feature.templates / "edits/src/llama.cpp/after.inc.j2"
    before = manifest_digest(cfg.feature.templates)
    body.write_text(body.read_text() + "// more\n")
    assert manifest_digest(cfg.feature.templates) != before
    assert status(cfg).templates_changed is True
    render(cfg)
    assert status(cfg).templates_changed is False
    assert "int line_005 = 5;\n\n    int dca = 8192; // opencoti F5 dca\n\n// more\nint line_006" in \
        (cfg.room / "src/llama.cpp").read_text()
