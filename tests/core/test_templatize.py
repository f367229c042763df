"""templatize: the clean room's hand-made changes become templates that render them back exactly."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from dcaforge.errors import DcaforgeError
from dcaforge.feature.manifest import load_manifest
from dcaforge.feature.roomdiff import file_edits
from dcaforge.feature.templatize import templatize
from dcaforge.patch.capture import capture
from dcaforge.patch.series import apply
from dcaforge.patch.verify import verify

MARKER = "// opencoti F5 dca"


def _edit_room(room: Path) -> dict[str, str]:
    """Hand edits of every kind the templates must express; returns the expected file texts."""
    llama = room / "src/llama.cpp"
    text = llama.read_text()
    lines = text.splitlines(keepends=True)
    # an insertion after a repeated line, a replaced line with a backslash and jinja-looking text,
    # an insertion at the very top, one at the end
    lines.insert(5, f"int dca_inserted = 1; {MARKER}\n")
    lines[9] = 'const char * s = "a\\\\nb {{ not jinja }} {% raw %}"; ' + MARKER + "\n"
    lines.insert(0, f"{MARKER}: top\n")
    lines.append(f"}} // closing brace then {MARKER}\n")
    llama.write_text("".join(lines))
    new = room / "src/llama-new.cpp"
    new.write_text(f"{MARKER}\nstruct s {{ int a[2] = {{{{0}}}}; }};\n#define X(a) {{% a %}}\n")
    return {"src/llama.cpp": llama.read_text(), "src/llama-new.cpp": new.read_text()}


def test_templatize_round_trips_through_render(project) -> None:
    cfg = project.config
    apply(cfg)
    expected = _edit_room(cfg.room)
    res = templatize(cfg)
    assert res.files >= 1 and res.edits >= 1
    manifest = load_manifest(cfg.feature.templates)
    assert any(f.dest == "src/llama-new.cpp" for f in manifest.files)
    # the marker became a template variable, the rest renders literally
    assert "{{ marker }}" in (cfg.feature.templates / "files/src/llama-new.cpp.j2").read_text()
    patch = capture(cfg).path
    patch_bytes = patch.read_bytes()
    # a fresh room renders the new templates into exactly the hand-edited tree
    apply(cfg, fresh=True)
    for rel, text in expected.items():
        assert (cfg.room / rel).read_text() == text
    verify(cfg, patch, fresh_render=True)
    assert capture(cfg).path.read_bytes() == patch_bytes
    project.assert_source_untouched()


def test_file_edits_anchor_uniquely_and_reproduce() -> None:
    old = "a\nx\nb\nx\nc\n"
    new = "a\nx\nINS\nb\nx\nc\nEND\n"
    edits = file_edits("f", old, new)
    cur = old
    import re
    for e in edits:
        assert len(re.findall(e.anchor, cur)) == 1
        m = re.search(e.anchor, cur)
        assert m
        if e.action == "insert_after":
            cur = cur[:m.end()] + e.text + cur[m.end():]
        elif e.action == "insert_before":
            cur = cur[:m.start()] + e.text + cur[m.start():]
        else:
            cur = cur[:m.start()] + e.text + cur[m.end():]
    assert cur == new


def test_templatize_refuses_deleted_files(project) -> None:
    cfg = project.config
    apply(cfg)
    (cfg.room / "src/llama.cpp").unlink()
    with pytest.raises(DcaforgeError, match="deleted"):
        templatize(cfg)


def test_render_after_templatize_is_not_blocked_by_the_templated_edits(project) -> None:
    """The hand-edit guard must not fire for edits that templatize has turned into templates."""
    from dcaforge.feature.render import render

    cfg = project.config
    apply(cfg)
    expected = _edit_room(cfg.room)
    templatize(cfg)
    res = render(cfg)
    assert not res.written
    for rel, text in expected.items():
        assert (cfg.room / rel).read_text() == text
    # a real hand edit made afterwards is still guarded
    (cfg.room / "src/llama-new.cpp").write_text("changed by hand\n")
    with pytest.raises(DcaforgeError, match="hand edits"):
        render(cfg)


def _hand_write(cfg) -> str:
    """What a user adds by hand to a generated manifest for other trees: alternatives, a condition,
    an edit only for trees without a file, a template with a tree condition. Returns the manifest."""
    import yaml

    folder = cfg.feature.templates
    doc = yaml.safe_load((folder / "manifest.yaml").read_text())
    edits = doc["edits"]
    cmake = next(k for k, e in enumerate(edits) if e["file"] == "CMakeLists.txt")  # conftest's feature made it
    edits[cmake]["alternatives"] = [{"anchor": "(?m)^project\\(llama-old\\)\\n"},
                                    {"when": "tree.has('src/old.cpp')", "anchor": "x", "text": "y\\n"}]
    top = next(k for k, e in enumerate(edits) if e["anchor"] == "(?m)^int line_060 = 60;\\n")
    edits[top] = {"file": "src/llama.cpp", "when": "tree.has('src/llama.cpp')",
                  **{k: v for k, v in edits[top].items() if k != "file"}}  # templatize's order of keys
    edits.insert(top, {"file": "src/llama.cpp", "when": "not tree.has('src/models/gemma4.cpp')",
                       "anchor": "(?m)^int line_030 = 30;\\n", "action": "insert_after",
                       "text": "int only_on_old_trees = 1; {{ marker }}\\n"})
    new = folder / "files/src/llama-new.cpp.j2"
    text = new.read_text()
    # a tree condition in a new file, rendering the same on the room's tree
    assert text.startswith("{{ marker }}{% raw %}\n")
    new.write_text(text.replace("{{ marker }}", "{{ marker }}{% if not tree.has('src/models/gemma4.cpp') %}\n"
                                "int old_tree = 1;{% endif %}", 1))
    from dcaforge.feature.templatize import HEADER, _Dumper
    (folder / "manifest.yaml").write_text(HEADER + yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=1000))
    return (folder / "manifest.yaml").read_text()


def test_templatize_keeps_what_was_written_by_hand(project) -> None:
    """alternatives, when, edits and template conditions for other trees survive templatize, also
    after more changes in the room; a fresh render still gives the room's files exactly."""
    cfg = project.config
    apply(cfg)
    _edit_room(cfg.room)
    templatize(cfg)
    manifest = _hand_write(cfg)
    new_tpl = (cfg.feature.templates / "files/src/llama-new.cpp.j2").read_text()
    # nothing changed in the room: templatize gives the same folder, byte for byte
    res = templatize(cfg)
    assert (res.kept, res.notes) == (3, ())  # with the two of conftest's manifest (src/never.cpp, llama-iswa.cpp)
    assert (cfg.feature.templates / "manifest.yaml").read_text() == manifest
    assert (cfg.feature.templates / "files/src/llama-new.cpp.j2").read_text() == new_tpl
    # the room changes: a line of the new file (not the conditional one) and another edit's text
    new = cfg.room / "src/llama-new.cpp"
    new.write_text(new.read_text() + "int appended = 2;\n")
    llama = cfg.room / "src/llama.cpp"
    llama.write_text(llama.read_text().replace("int dca_inserted = 1;", "int dca_inserted = 2;"))
    expected = {rel: (cfg.room / rel).read_text() for rel in ("src/llama.cpp", "src/llama-new.cpp")}
    res = templatize(cfg)
    assert res.kept == 3
    assert res.notes == ("merged the room's changes into the hand-written template files/src/llama-new.cpp.j2: review it",)
    m = load_manifest(cfg.feature.templates)
    cmake = next(e for e in m.edits if e.files == ("CMakeLists.txt",))
    assert [a.anchor for a in cmake.alternatives] == ["(?m)^project\\(llama-old\\)\\n", "x"]
    assert cmake.alternatives[1].when == "tree.has('src/old.cpp')" and cmake.alternatives[1].text == "y\\n"
    top = next(k for k, e in enumerate(m.edits) if e.anchor == "(?m)^int line_060 = 60;\\n")
    assert m.edits[top].when == "tree.has('src/llama.cpp')"
    assert m.edits[top - 1].when == "not tree.has('src/models/gemma4.cpp')" and "only_on_old_trees" in m.edits[top - 1].text
    tpl = (cfg.feature.templates / "files/src/llama-new.cpp.j2").read_text()
    assert tpl.startswith("{{ marker }}{% if not tree.has('src/models/gemma4.cpp') %}\nint old_tree = 1;{% endif %}")
    assert tpl.endswith("int appended = 2;\n{% endraw %}")
    # the templates render the room's files exactly, and on a tree without gemma4.cpp the hand-written parts apply
    patch = capture(cfg).path
    apply(cfg, fresh=True)
    for rel, text in expected.items():
        assert (cfg.room / rel).read_text() == text
    verify(cfg, patch, fresh_render=True)
    from dcaforge.feature.drift import check
    other = project.tmp / "old-tree"
    (other / "src").mkdir(parents=True)
    (other / "src/llama.cpp").write_text((project.source / "src/llama.cpp").read_text())
    res2 = check(cfg, other)
    assert [e.status for e in res2.edits if "only_on_old_trees" in m.edits[e.index].text] == ["ok"]


def test_templatize_notes_hand_written_parts_it_cannot_keep(project) -> None:
    cfg = project.config
    apply(cfg)
    _edit_room(cfg.room)
    templatize(cfg)
    _hand_write(cfg)
    # the room drops the change that the edit with the alternatives made
    (cfg.room / "CMakeLists.txt").write_text((project.source / "CMakeLists.txt").read_text())
    res = templatize(cfg)
    assert len(res.notes) == 1 and "(CMakeLists.txt, manifest line " in res.notes[0]
    assert "alternatives, when, file list) are dropped" in res.notes[0]
    m = load_manifest(cfg.feature.templates)
    assert not any(e.alternatives for e in m.edits)
    assert any(e.when == "not tree.has('src/models/gemma4.cpp')" for e in m.edits)  # the other-tree edit stays


def test_templatize_refuses_a_hand_written_part_that_breaks_the_room(project) -> None:
    cfg = project.config
    apply(cfg)
    _edit_room(cfg.room)
    templatize(cfg)
    before = (cfg.feature.templates / "manifest.yaml").read_text()
    # an edit kept for other trees whose condition is true on the room's tree, anchored nowhere
    (cfg.feature.templates / "manifest.yaml").write_text(before + textwrap.dedent("""\
        - file: src/llama.cpp
          when: "tree.has('src/models/gemma4.cpp')"
          anchor: 'no such line'
          action: replace
          text: x
        """))
    broken = (cfg.feature.templates / "manifest.yaml").read_text()
    # it does not fit the room's tree, so it is not kept, and that is said
    res = templatize(cfg)
    assert any("no longer what the room's change needs" in n for n in res.notes)
    assert (cfg.feature.templates / "manifest.yaml").read_text() == before
    assert broken != before


def _multi_line_edit(room: Path) -> str:
    """A hand edit of several lines (a block with a leading blank line and the marker) in src/llama.cpp."""
    llama = room / "src/llama.cpp"
    block = f"\n{MARKER}: begin\nstatic int dca_block(int x) {{\n    return x + 1;\n}}\n"
    llama.write_text(llama.read_text().replace("int line_040 = 40;\n", "int line_040 = 40;\n" + block, 1))
    return llama.read_text()


def _body_files(folder: Path, under: str = "edits/src/llama.cpp") -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): p.read_text() for p in sorted((folder / under).rglob("*"))
            if p.is_file()}


def test_templatize_writes_a_multi_line_body_as_a_file_and_keeps_its_name(project) -> None:
    cfg = project.config
    apply(cfg)
    expected = _multi_line_edit(cfg.room)
    templatize(cfg)
    folder = cfg.feature.templates
    m = load_manifest(folder)
    # the body is a template file named after its first identifier, the manifest holds no multi-line text
    assert _body_files(folder) == {"edits/src/llama.cpp/dca-block.inc.j2":
                                   "\n{{ marker }}: begin\nstatic int dca_block(int x) {\n"
                                   "    return x + 1;\n}\n"}
    edit = next(e for e in m.edits if e.text_file is not None)
    assert edit.files == ("src/llama.cpp",) and edit.action == "insert_after"
    assert all(len(x.text.splitlines()) <= 1 for e in m.edits for x in (e, *e.alternatives)
               if x.text_file is None and x.text is not None)
    assert "text_file: edits/src/llama.cpp/dca-block.inc.j2\n" in (folder / "manifest.yaml").read_text()
    # a name given by hand survives templatize, byte for byte, while the room is unchanged
    (folder / "edits/src/llama.cpp/dca-block.inc.j2").rename(folder / "edits/src/llama.cpp/helper.inc.j2")
    manifest = (folder / "manifest.yaml").read_text().replace("dca-block.inc.j2", "helper.inc.j2")
    (folder / "manifest.yaml").write_text(manifest)
    templatize(cfg)
    assert (folder / "manifest.yaml").read_text() == manifest
    assert list(_body_files(folder)) == ["edits/src/llama.cpp/helper.inc.j2"]
    # the room changes the body: the same file gets the new text, the manifest stays as it was
    llama = cfg.room / "src/llama.cpp"
    llama.write_text(llama.read_text().replace("return x + 1;", "return x + 2;"))
    expected = llama.read_text()
    templatize(cfg)
    assert (folder / "manifest.yaml").read_text() == manifest
    assert "    return x + 2;\n" in (folder / "edits/src/llama.cpp/helper.inc.j2").read_text()
    # a fresh room renders exactly the room's file from it, and the round trip holds
    patch = capture(cfg).path
    apply(cfg, fresh=True)
    assert (cfg.room / "src/llama.cpp").read_text() == expected
    verify(cfg, patch, fresh_render=True)
    # the room drops the change: its body file goes with the edit (no file is left that nothing uses)
    llama.write_text((project.source / "src/llama.cpp").read_text())
    templatize(cfg)
    assert _body_files(folder) == {}
    assert "edits/src/llama.cpp/" not in (folder / "manifest.yaml").read_text()
    # (conftest's two-line gemma4 replace is a body file too, named after its first C name)
    assert "text_file: edits/src/models/gemma4.cpp/ggml-rope-ext.inc.j2\n" in (folder / "manifest.yaml").read_text()
    project.assert_source_untouched()


def test_templatize_keeps_body_files_of_alternatives_and_edits_for_other_trees(project) -> None:
    """Hand-written body files (an alternative's own body; an edit skipped on the room's tree)
    are kept, with their names, when templatize runs again."""
    import yaml

    cfg = project.config
    apply(cfg)
    _multi_line_edit(cfg.room)
    templatize(cfg)
    folder = cfg.feature.templates
    doc = yaml.safe_load((folder / "manifest.yaml").read_text())
    mine = next(e for e in doc["edits"] if "text_file" in e)
    mine["alternatives"] = [{"anchor": "(?m)^int line_041 = 41;\\n",
                             "text_file": "edits/src/llama.cpp/dca-block.older-trees.inc.j2"}]
    doc["edits"].append({"file": "src/llama.cpp", "when": "not tree.has('src/models/gemma4.cpp')",
                         "anchor": "(?m)^int line_050 = 50;\\n", "action": "insert_after",
                         "text_file": "edits/src/llama.cpp/old-trees-only.inc.j2"})
    (folder / "edits/src/llama.cpp/dca-block.older-trees.inc.j2").write_text("int older = 1; {{ marker }}\n\n")
    (folder / "edits/src/llama.cpp/old-trees-only.inc.j2").write_text(
        "{% if vars.chunk > 0 %}\nint old_only = {{ vars.chunk }};\n{% endif %}\n")
    from dcaforge.feature.templatize import HEADER, _Dumper
    (folder / "manifest.yaml").write_text(HEADER + yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=1000))
    manifest = (folder / "manifest.yaml").read_text()
    bodies = _body_files(folder)
    res = templatize(cfg)
    assert res.notes == ()
    assert (folder / "manifest.yaml").read_text() == manifest
    assert _body_files(folder) == bodies and len(bodies) == 3
    m = load_manifest(folder)
    assert m.edits[-1].text_file == "edits/src/llama.cpp/old-trees-only.inc.j2"
    alt = next(e for e in m.edits if e.alternatives).alternatives[0]
    assert (alt.text_file, alt.text) == ("edits/src/llama.cpp/dca-block.older-trees.inc.j2",
                                         "int older = 1; {{ marker }}\n\n")
