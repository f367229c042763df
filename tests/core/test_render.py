"""Anchored edits: missing, ambiguous, candidates, when_exists, replace groups, --check."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from dcaforge.errors import ConfigError, MismatchError
from dcaforge.render import _anchor_literal, check, render
from dcaforge.series import apply

from .conftest import write_feature


def _manifest(project, body: str) -> None:
    write_feature(project.work, textwrap.dedent(body))


def test_missing_anchor_names_manifest_edit_file_anchor_and_closest_lines(project) -> None:
    cfg = project.config
    apply(cfg, render=False)
    _manifest(project, """\
        edits:
          - file: CMakeLists.txt
            anchor: '(?m)^project\\('
            action: insert_after
            text: "x"
          - file: src/models/gemma4.cpp
            anchor: '(?m)^(\\s*)Kcur = ggml_rope_ext\\(ctx0, Kcur, inp_pos, rope_factors,'
            action: replace
            text: "y"
        """)
    with pytest.raises(MismatchError) as exc:
        render(cfg)
    e = exc.value
    assert e.exit_code == 2
    assert e.message == "edit #1 of manifest.yaml: anchor matches nowhere in src/models/gemma4.cpp"
    assert e.where == f"{project.feature / 'manifest.yaml'}:6 -> src/models/gemma4.cpp"
    assert "anchor: (?m)^(\\s*)Kcur = ggml_rope_ext\\(ctx0, Kcur, inp_pos, rope_factors," in (e.details or "")
    assert "  6:         Kcur = ggml_rope_ext(ctx0, Kcur, inp_pos, nullptr, n_rot, rope_type);" in (e.details or "")
    # nothing was written: the first edit's file is untouched
    assert (cfg.room / "CMakeLists.txt").read_text() == "project(llama)\nadd_library(llama src/llama.cpp)\n"


def test_ambiguous_anchor_and_count(project) -> None:
    cfg = project.config
    apply(cfg, render=False)
    _manifest(project, """\
        edits:
          - file: src/models/gemma4.cpp
            anchor: 'ggml_rope_ext\\('
            action: insert_before
            text: "/*dca*/"
        """)
    with pytest.raises(MismatchError, match="matches 2 times, expected 1") as exc:
        render(cfg)
    assert "5:         Qcur = ggml_rope_ext" in (exc.value.details or "")
    _manifest(project, """\
        edits:
          - file: src/models/gemma4.cpp
            anchor: 'ggml_rope_ext\\('
            count: 2
            action: insert_before
            text: "/*{{ feature.name }}*/"
        """)
    render(cfg)
    assert (cfg.room / "src/models/gemma4.cpp").read_text().count("/*dca*/ggml_rope_ext(") == 2


def test_candidates_when_exists_and_check(project) -> None:
    cfg = project.config
    apply(cfg, render=False)
    _manifest(project, """\
        edits:
          - file: [src/models/gemma4-iswa.cpp, src/models/gemma4.cpp]
            anchor: '(?P<indent>[ ]*)cur = build_attn'
            action: replace
            text: '\\g<indent>cur = build_attn_dca'
          - file: src/models/gemma4-iswa.cpp
            when_exists: src/models/gemma4-iswa.cpp
            anchor: 'never'
            action: replace
            text: 'x'
          - file: [src/a.cpp, src/b.cpp]
            anchor: 'x'
            action: replace
            text: 'y'
          - file: src/llama.cpp
            anchor: 'int line_999'
            action: replace
            text: 'y'
        """)
    res = check(cfg)
    assert [(e.index, e.file, e.status, e.matches) for e in res.edits] == [
        (0, "src/models/gemma4.cpp", "ok", 1),
        (1, None, "skipped", 0),
        (2, None, "no-file", 0),
        (3, "src/llama.cpp", "missing", 0),
    ]
    assert not res.ok
    assert res.edits[3].closest and res.edits[3].closest[0].startswith("9")  # e.g. "9: int line_009 = 9;"
    # --check wrote nothing
    assert "build_attn_dca" not in (cfg.room / "src/models/gemma4.cpp").read_text()
    # on a plain folder (another llama.cpp tree), without a clean room
    other = project.tmp / "other-tree" / "src" / "models"
    other.mkdir(parents=True)
    (other / "gemma4-iswa.cpp").write_text("    cur = build_attn(x);\nnever\n")
    res2 = check(cfg, project.tmp / "other-tree")
    assert [(e.file, e.status) for e in res2.edits][:2] == [
        ("src/models/gemma4-iswa.cpp", "ok"), ("src/models/gemma4-iswa.cpp", "ok")]


def test_replace_expands_groups_and_jinja_is_strict(project) -> None:
    cfg = project.config
    apply(cfg, render=False)
    _manifest(project, """\
        edits:
          - file: src/models/gemma4.cpp
            anchor: '(?m)^(\\s*)cur = build_attn\\((\\w+),'
            action: replace
            text: '\\1cur = build_attn_dca(\\2, {{ vars.chunk }}, {{ marker }}'
        """)
    render(cfg)
    assert "        cur = build_attn_dca(inp_attn, 8192, // opencoti F5 dca Qcur" in \
        (cfg.room / "src/models/gemma4.cpp").read_text()
    _manifest(project, """\
        edits:
          - file: src/models/gemma4.cpp
            anchor: 'cur = build_attn'
            action: insert_before
            text: '{{ vars.no_such_var }}'
        """)
    with pytest.raises(ConfigError, match="no_such_var") as exc:
        render(cfg)
    assert (exc.value.where or "").endswith("manifest.yaml:2 (edits[0].text)")


def test_manifest_errors_name_key_and_line(project) -> None:
    cfg = project.config
    apply(cfg, render=False)
    _manifest(project, """\
        edits:
          - file: src/llama.cpp
            anchor: 'x'
            action: replace
            text: 'y'
          - file: src/llama.cpp
            anchor: 'x'
            acton: replace
        """)
    with pytest.raises(ConfigError) as exc:
        render(cfg)
    assert exc.value.message == "unknown key 'edits[1].acton'"
    assert exc.value.where == f"{project.feature / 'manifest.yaml'}:8"
    assert "did you mean 'action'" in (exc.value.hint or "")
    _manifest(project, "edits:\n  - file: src/llama.cpp\n    anchor: '(unclosed'\n    action: replace\n    text: y\n")
    with pytest.raises(ConfigError, match="not a valid regex") as exc:
        render(cfg)
    assert exc.value.where == f"{project.feature / 'manifest.yaml'}:3"


def test_anchor_literal() -> None:
    assert _anchor_literal(r"(?m)^(\s*)Kcur = ggml_rope_ext\(ctx0, Kcur, inp_pos,") == \
        "Kcur = ggml_rope_ext(ctx0, Kcur, inp_pos,"


def test_removed_render_outputs_are_restored(project) -> None:
    cfg = project.config
    apply(cfg)
    room = cfg.room
    assert (room / "src/llama-dca.cpp").exists()
    _manifest(project, """\
        edits:
          - file: src/llama.cpp
            anchor: 'int line_001 = 1;'
            action: replace
            text: 'int line_001 = 2;'
        """)
    r = render(cfg)
    assert "src/llama-dca.cpp" in r.restored and not (room / "src/llama-dca.cpp").exists()
    assert (room / "CMakeLists.txt").read_text() == "project(llama)\nadd_library(llama src/llama.cpp)\n"
    assert Path(room / "src/llama.cpp").read_text().startswith("int line_001 = 2;\n")


def test_interrupted_render_is_not_mistaken_for_hand_edits(project, monkeypatch) -> None:
    import dcaforge.render as rmod

    cfg = project.config
    apply(cfg)
    (project.feature / "src/llama-dca.cpp.j2").write_text("v2\n")
    (project.feature / "tools/dca.sh.j2").write_text("#!/bin/sh\necho v2\n")
    real = rmod.write_atomic
    calls = []

    def flaky(path, data, mode=None):
        calls.append(path)
        if len(calls) == 2:
            raise KeyboardInterrupt
        real(path, data, mode)

    monkeypatch.setattr(rmod, "write_atomic", flaky)
    with pytest.raises(KeyboardInterrupt):
        render(cfg)
    monkeypatch.setattr(rmod, "write_atomic", real)
    r = render(cfg)  # no "hand edits" refusal
    assert (cfg.room / "src/llama-dca.cpp").read_text() == "v2\n"
    assert (cfg.room / "tools/dca.sh").read_text() == "#!/bin/sh\necho v2\n" and r.written
