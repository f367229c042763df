"""Anchored edits: missing, ambiguous, candidates, when_exists, replace groups, --check."""

from __future__ import annotations

import difflib
import re
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcaforge.errors import ConfigError, MismatchError
from dcaforge.feature.anchors import anchor_literal, closest_lines
from dcaforge.feature.drift import check
from dcaforge.feature.render import render
from dcaforge.patch.series import apply

from .conftest import UNANCHORED_EDIT, write_feature


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
    assert e.exit_code == 3
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



def test_file_candidates_go_to_the_first_where_the_edit_fits(project) -> None:
    """`file: "a | b"` (or a list): the first candidate that exists AND in which an anchor fits. Upstream's Gemma-4
    file was gemma4-iswa.cpp (b8953, llamafile 0.10.1's pin), then gemma4.cpp; a tree with both keeps the edit
    where its code is (today's main took the first that exists and misfit there)."""
    cfg = project.config
    _manifest(project, """\
        edits:
          - file: src/models/gemma4.cpp | src/models/gemma4-iswa.cpp
            anchor: '(?m)^  Kcur = ggml_rope_ext\\(ctx0, Kcur, inp_pos,'
            action: replace
            text: '  Kcur = ggml_rope_ext(ctx0, Kcur, llm_dca_pos_k(inp_pos), {{ marker }}'
        """)
    rope = "  Kcur = ggml_rope_ext(ctx0, Kcur, inp_pos, freq_factors, n_rot);\n"
    trees = {"iswa-only": {"gemma4-iswa.cpp": rope},
             "both, code in the iswa file": {"gemma4.cpp": "// an assistant model\n", "gemma4-iswa.cpp": rope},
             "both, code in gemma4.cpp": {"gemma4.cpp": rope, "gemma4-iswa.cpp": rope}}
    got = {}
    for name, files in trees.items():
        other = project.tmp / name.replace(" ", "_").replace(",", "")
        (other / "src/models").mkdir(parents=True)
        for f, text in files.items():
            (other / "src/models" / f).write_text(text)
        res = check(cfg, other)
        got[name] = [(e.file, e.status) for e in res.edits]
    assert got == {"iswa-only": [("src/models/gemma4-iswa.cpp", "ok")],
                   "both, code in the iswa file": [("src/models/gemma4-iswa.cpp", "ok")],
                   "both, code in gemma4.cpp": [("src/models/gemma4.cpp", "ok")]}
    # fits nowhere: reported on the first candidate that exists, with its closest lines
    other = project.tmp / "neither"
    (other / "src/models").mkdir(parents=True)
    (other / "src/models/gemma4-iswa.cpp").write_text("  Kcur = something_else(ctx0);\n")
    (rep,) = check(cfg, other).edits
    assert (rep.file, rep.status) == ("src/models/gemma4-iswa.cpp", "missing") and rep.closest

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


def testanchor_literal() -> None:
    assert anchor_literal(r"(?m)^(\s*)Kcur = ggml_rope_ext\(ctx0, Kcur, inp_pos,") == \
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
    import dcaforge.feature.render as rmod

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


# --- trees that differ: alternatives and conditions over tree facts ------------------------

DRIFT_MANIFEST = """\
    files:
      - template: src/llama-dca.cpp.j2
        dest: src/llama-dca.cpp
        when: "tree.has('src/models/gemma4.cpp')"
      - template: tools/dca.sh.j2
        dest: tools/dca.sh
        when: "tree.has('src/models/gemma4-iswa.cpp')"
    edits:
      - file: src/models/gemma4.cpp
        anchor: 'Kcur = ggml_rope_ext\\(ctx0, Kcur, inp_pos, rope_factors,'
        action: replace
        text: 'Kcur = dca_rope(rope_factors,'
        alternatives:
          - anchor: 'Kcur = ggml_rope_ext\\(ctx0, Kcur, inp_pos, freq_factors,'
          - anchor: 'Kcur = ggml_rope_ext\\(ctx0, Kcur, inp_pos, nullptr,'
            text: 'Kcur = dca_rope(nullptr, /* {{ feature.id }} */'
      - file: src/llama.cpp
        when: "tree.contains('src/models/gemma4.cpp', 'build_attn(inp_attn')"
        anchor: '(?m)^int line_001 = 1;\\n'
        action: insert_after
        text: "{% if tree.contains('CMakeLists.txt', 'add_library') %}int lib = 1;{% else %}int lib = 0;{% endif %}\\n"
      - file: src/llama.cpp
        when: "not tree.has('src/models/gemma4.cpp')"
        anchor: 'never matches'
        action: replace
        text: 'x'
    """


def test_alternatives_first_fit_wins_and_when_reads_the_tree(project) -> None:
    cfg = project.config
    apply(cfg, render=False)
    _manifest(project, DRIFT_MANIFEST)
    res = check(cfg)
    assert res.anchors_ok
    assert [(e.index, e.status, e.fit, e.matches) for e in res.edits] == [
        (0, "ok", "alt 2", 1), (1, "ok", "anchor", 1), (2, "skipped", "-", 0)]
    # the new file is not in CMakeLists.txt's add_library: the wiring check names it and where it goes
    assert not res.ok and [(w.source, w.status, w.join) for w in res.wiring.rows] == [
        ("src/llama-dca.cpp", "missing", "CMakeLists.txt:2 (next to src/llama.cpp)")]
    assert res.edits[0].anchor == "Kcur = ggml_rope_ext\\(ctx0, Kcur, inp_pos, nullptr,"  # what fitted
    assert [a for _v, a, _n, _c in res.edits[0].tried][:1] == ["Kcur = ggml_rope_ext\\(ctx0, Kcur, inp_pos, rope_factors,"]
    assert res.edits[2].note == "when: not tree.has('src/models/gemma4.cpp')"
    assert res.files == [("src/llama-dca.cpp", "rendered"), ("tools/dca.sh", "skipped")]
    render(cfg)
    assert "        Kcur = dca_rope(nullptr, /* 0078-dca */ n_rot, rope_type);\n" in \
        (cfg.room / "src/models/gemma4.cpp").read_text()
    assert (cfg.room / "src/llama.cpp").read_text().startswith("int line_001 = 1;\nint lib = 1;\nint line_002")
    assert not (cfg.room / "tools/dca.sh").exists()



def test_an_alternative_computes_its_text_from_the_tree(project) -> None:
    """The op count of whatever ggml the tree has (96 on b8953, 98 on 0.3.34, 101 on 0.3.35): one alternative whose
    text reads the count with tree.search and adds the feature's ops, instead of one alternative per count."""
    cfg = project.config
    _manifest(project, """\
        edits:
          - file: src/llama.cpp
            anchor: '(?m)^static_assert[(]OP_COUNT == 101[)];\\n'
            action: replace
            text: "static_assert(OP_COUNT == 103);\\n"
            alternatives:
              - anchor: '(?m)^static_assert[(]OP_COUNT == [0-9]+[)];\\n'
                text: "{% set n = tree.search('src/llama.cpp', '^static_assert[(]OP_COUNT == ([0-9]+)') | int + 2 %}\
static_assert(OP_COUNT == {{ n }}); {{ marker }}\\n"
        """)
    for count, want in ((101, "static_assert(OP_COUNT == 103);\n"), (96, "static_assert(OP_COUNT == 98); // opencoti F5 dca\n"),
                        (98, "static_assert(OP_COUNT == 100); // opencoti F5 dca\n")):
        other = project.tmp / f"ops-{count}"
        (other / "src").mkdir(parents=True)
        (other / "src/llama.cpp").write_text(f"int x;\nstatic_assert(OP_COUNT == {count});\n")
        from dcaforge.feature.manifest import load_manifest
        from dcaforge.feature.plan import plan
        from dcaforge.room.trees import DirTree

        out = plan(cfg, DirTree(other), load_manifest(cfg.feature.templates)).outputs["src/llama.cpp"][0].decode()
        assert out == "int x;\n" + want, (count, out)

def test_alternatives_on_another_tree_and_an_alternative_inherits_the_text(project) -> None:
    cfg = project.config
    _manifest(project, DRIFT_MANIFEST)
    other = project.tmp / "other-tree"
    (other / "src/models").mkdir(parents=True)
    (other / "src/models/gemma4-iswa.cpp").write_text("  Kcur = ggml_rope_ext(ctx0, Kcur, inp_pos, freq_factors, n_rot);\n")
    (other / "src/llama.cpp").write_text("int line_001 = 1;\n")
    (other / "CMakeLists.txt").write_text("project(x)\n")
    # gemma4.cpp is absent here: the first edit's file list does not name the -iswa file
    res = check(cfg, other)
    assert [(e.status, e.note) for e in res.edits] == [
        ("no-file", "none of src/models/gemma4.cpp exists"), ("skipped", "when: tree.contains('src/models/gemma4.cpp', "
                                                            "'build_attn(inp_attn')"), ("missing", "")]
    assert res.files == [("src/llama-dca.cpp", "skipped"), ("tools/dca.sh", "rendered")]
    (other / "src/models/gemma4.cpp").write_text("  Kcur = ggml_rope_ext(ctx0, Kcur, inp_pos, freq_factors, n_rot);\n")
    res = check(cfg, other)
    assert [(e.status, e.fit) for e in res.edits][:1] == [("ok", "alt 1")]
    # the tree is only read
    assert (other / "src/models/gemma4.cpp").read_text().startswith("  Kcur = ggml_rope_ext(")


def test_ambiguous_alternative_stops_even_when_a_later_one_fits(project) -> None:
    cfg = project.config
    apply(cfg, render=False)
    _manifest(project, """\
        edits:
          - file: src/models/gemma4.cpp
            anchor: 'no such line'
            action: insert_before
            text: '/*dca*/'
            alternatives:
              - anchor: 'ggml_rope_ext\\('
              - anchor: 'Kcur = ggml_rope_ext\\('
        """)
    res = check(cfg)
    e = res.edits[0]
    assert (e.status, e.fit, e.matches, e.count) == ("ambiguous", "alt 1", 2, 1)
    assert e.note == "alternatives[0] matches 2 times"
    with pytest.raises(MismatchError) as exc:
        render(cfg)
    assert exc.value.message == ("edit #0 of manifest.yaml: alternatives[0] matches 2 times, expected 1 "
                                 "in src/models/gemma4.cpp")
    assert "5:         Qcur = ggml_rope_ext" in (exc.value.details or "")


def test_no_alternative_fits_names_each_with_its_closest_lines(project) -> None:
    cfg = project.config
    apply(cfg, render=False)
    write_feature(project.work, UNANCHORED_EDIT + "    alternatives:\n      - anchor: 'int line_0200 = 200;'\n"
                  "        text: 'y'\n")
    with pytest.raises(MismatchError) as exc:
        render(cfg)
    e = exc.value
    assert e.exit_code == 3
    assert e.message == "edit #0 of manifest.yaml: neither the anchor nor its 1 alternatives match in src/llama.cpp"
    details = e.details or ""
    assert details.startswith("anchor: int line_0100 = 100;\nclosest lines:\n  ")
    assert "\nalternatives[0]: int line_0200 = 200;\nclosest lines:\n  " in details
    assert "add one to 'alternatives:'" in (e.hint or "")


def test_when_errors_name_the_manifest_line(project) -> None:
    cfg = project.config
    apply(cfg, render=False)
    _manifest(project, """\
        edits:
          - file: src/llama.cpp
            when: "tree.has('x'"
            anchor: 'x'
            action: replace
            text: 'y'
        """)
    with pytest.raises(ConfigError, match="not a valid Jinja expression") as exc:
        render(cfg)
    assert exc.value.where == f"{project.feature / 'manifest.yaml'}:3"
    _manifest(project, """\
        edits:
          - file: src/llama.cpp
            anchor: 'int line_001 = 1;'
            action: replace
            text: 'y'
            alternatives:
              - anchor: 'x'
                when: "tree.exists('x')"
                colour: red
        """)
    with pytest.raises(ConfigError) as exc:
        render(cfg)
    assert exc.value.message == "unknown key 'edits[0].alternatives[0].colour'"
    _manifest(project, """\
        edits:
          - file: src/llama.cpp
            when: "tree.exists('x')"
            anchor: 'int line_001 = 1;'
            action: replace
            text: 'y'
        """)
    with pytest.raises(ConfigError, match="'when: tree.exists\\('x'\\)' failed") as exc:
        render(cfg)
    assert (exc.value.where or "").endswith("manifest.yaml:2 (edits[0].when)")
    assert "tree.has(path), tree.contains(path, text)" in (exc.value.hint or "")


def _closest_by_definition(text: str, anchor: str, n: int) -> list[str]:
    """closest_lines as first written: every line's difflib ratio, sorted (ratio descending, line ascending)."""
    literal = anchor_literal(anchor)
    scored = []
    for i, line in enumerate(text.splitlines(), 1):
        norm = re.sub(r"\s+", " ", line).strip()
        if not norm:
            continue
        sm = difflib.SequenceMatcher(None, literal, norm, autojunk=False)
        if sm.real_quick_ratio() < 0.3 or sm.quick_ratio() < 0.3:
            continue
        scored.append((sm.ratio(), i, line.rstrip()))
    scored.sort(key=lambda t: (-t[0], t[1]))
    return [f"{i}: {line}" for _r, i, line in scored[:n]]


_CHARS = st.text(alphabet="ab c(){};x_\t", max_size=14)


@settings(max_examples=400, deadline=None)
@given(lines=st.lists(_CHARS, max_size=14), anchor=_CHARS, n=st.integers(1, 5))
def test_closest_lines_is_the_ratio_ranking_whatever_it_skips(lines: list[str], anchor: str, n: int) -> None:
    """closest_lines skips lines whose difflib bound cannot beat the n-th best; the answer is still every
    line's ratio ranked, ties to the earlier line (small alphabets make ties and near-ties common)."""
    text = "\n".join(lines)
    assert closest_lines(text, re.escape(anchor), n) == _closest_by_definition(text, re.escape(anchor), n)
