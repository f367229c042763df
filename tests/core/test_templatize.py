"""templatize: the clean room's hand-made changes become templates that render them back exactly."""

from __future__ import annotations

from pathlib import Path

import pytest

from dcaforge.capture import capture
from dcaforge.errors import DcaforgeError
from dcaforge.render import load_manifest
from dcaforge.series import apply
from dcaforge.templatize import file_edits, templatize
from dcaforge.verify import verify

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
    from dcaforge.render import render

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
