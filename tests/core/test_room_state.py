"""The clean room's typed state (dcaforge.room.state): the on-disk format older dcaforge wrote still
loads (and a room whose state it wrote goes on working), and a hand-edited or hostile state file is an
error that names the file and says what to do, never a traceback."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dcaforge.errors import DcaforgeError
from dcaforge.patch.capture import capture
from dcaforge.patch.series import apply
from dcaforge.patch.status import status
from dcaforge.patch.verify import verify
from dcaforge.room.cleanroom import Room
from dcaforge.room.state import Captured, Failed, Phase, RoomState, read_state


def _old_dump(data: dict) -> bytes:
    """How dcaforge wrote the state file before it was typed (cleanroom.dump_json of a dict)."""
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()


#: an applied, rendered, captured room's state as the untyped code wrote it: ``update_state(failed=None,
#: rendering=None, render_error=None)`` left those keys as null
OLD_APPLIED = {
    "base": "a" * 40, "baseline": "b" * 40, "bootstrap": [], "config": "/w/dcaforge.yaml", "failed": None,
    "phase": "applied", "render_error": None, "rendered": {"src/llama-dca.cpp": "c" * 64}, "rendering": None,
    "series": [{"name": "0001-a.patch", "sha256": "d" * 64, "style": "git"}], "source": "git /src @ main",
    "start": "e" * 40, "submodules": False, "templates_digest": "f" * 64, "wip": False,
    "captured": {"patch": "/w/patches/0078-dca.patch", "sha256": "0" * 64, "tree": "1" * 40},
}


def test_the_old_format_loads_typed(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_bytes(_old_dump(OLD_APPLIED | {"failed": {"patch": "0002-b.patch", "index": 1, "file": "src/x.c",
                                                           "hunk": "@@ -7,7 +7,7 @@", "reason": "patch failed"},
                                             "phase": "failed"}))
    st = read_state(path)
    assert st.phase is Phase.FAILED and st.phase == "failed"
    assert st.failed == Failed(patch="0002-b.patch", index=1, file="src/x.c", hunk="@@ -7,7 +7,7 @@", reason="patch failed")
    assert st.captured == Captured(patch="/w/patches/0078-dca.patch", sha256="0" * 64, tree="1" * 40)
    assert st.rendered == {"src/llama-dca.cpp": "c" * 64} and st.rendering is None and st.render_error is None
    assert st.submodules is False and st.wip is False and st.bootstrap == []
    assert st.series == OLD_APPLIED["series"] and st.start == "e" * 40 and st.extra == {}


def test_the_same_bytes_are_written_back(tmp_path: Path) -> None:
    """Without null keys, what the typed state writes is byte for byte what the untyped code wrote; a null key
    (the same as an absent one to every reader, old and new) is left out; a key it does not know is kept."""
    no_nulls = {k: v for k, v in OLD_APPLIED.items() if v is not None}
    assert RoomState.from_json(json.loads(_old_dump(no_nulls))).dump() == _old_dump(no_nulls)
    assert RoomState.from_json(OLD_APPLIED).dump() == _old_dump(no_nulls)
    created = {"phase": "created", "source": "git /src @ main", "base": "a" * 40, "start": "e" * 40, "config": "c",
               "bootstrap": [{"run": "true"}], "submodules": ["ggml"], "wip": True, "from_the_future": {"x": 1}}
    assert RoomState.from_json(created).dump() == _old_dump(created)


def test_an_applied_room_whose_state_the_old_code_wrote_goes_on(project) -> None:
    cfg = project.config
    apply(cfg)
    capture(cfg)
    room = Room.of(cfg)
    old = json.loads(room.state_file.read_text())
    # the untyped code's nulls, and a room made before the state recorded its submodules
    old |= {"failed": None, "rendering": None, "render_error": None}
    del old["submodules"]
    room.state_file.write_bytes(_old_dump(old))
    res = status(cfg)
    assert res.phase == "applied" and res.patch_state == "fresh" and res.failed is None and res.interrupted is None
    assert verify(cfg).expected_from == "capture"
    again = apply(cfg)
    assert "series unchanged since the last apply" in again.notes
    assert room.load_state().phase is Phase.APPLIED


def test_a_failed_room_the_old_code_left_resumes(project) -> None:
    cfg = project.config
    apply(cfg)
    room = Room.of(cfg)
    old = json.loads(room.state_file.read_text())
    old |= {"phase": "interrupted", "failed": None}
    room.state_file.write_bytes(_old_dump(old))
    assert status(cfg).interrupted == "applying the series"
    with pytest.raises(DcaforgeError, match="was interrupted"):
        apply(cfg)
    assert apply(cfg, cont=True).baseline == old["baseline"]
    assert room.load_state().phase is Phase.APPLIED


@pytest.mark.parametrize(("text", "says"), [
    ("{not json", "Expecting property name"),
    ("[]", "it holds a JSON list, not an object"),
    ('"applied"', "it holds a JSON str, not an object"),
    ('{"phase": "rendered"}', "'phase' is 'rendered', not one of creating, created, resetting"),
    ('{"phase": 5}', "'phase' is 5, not a string"),
    ('{"phase": "applied", "start": ["x"]}', "'start' is [\"x\"], not a string"),
    ('{"rendered": ["a"]}', "'rendered' is not an object of strings"),
    ('{"rendering": {"a": 1}}', "'rendering' is not an object of strings"),
    ('{"failed": "0002-b.patch"}', "'failed' is not an object with 'patch'"),
    ('{"failed": {"patch": "p", "index": "1"}}', "'failed.index' is \"1\", not a number"),
    ('{"failed": {"patch": "p", "hunk": 7}}', "'failed.hunk' is 7, not a string"),
    ('{"captured": {"patch": "p", "sha256": "s"}}', "'captured' is not an object with 'patch', 'sha256', 'tree'"),
    ('{"series": {"name": "x"}}', "'series' is not a list"),
    ('{"series": [["x"]]}', "'series[0]' is not an object of strings"),
    ('{"submodules": "yes"}', "'submodules' is not a list"),
    ('{"wip": "no"}', "'wip' is \"no\", not true or false"),
    ('{"bootstrap": {}}', "'bootstrap' is not a list"),
    ("[" * 100000 + "]" * 100000, "maximum recursion depth"),
])
def test_a_hostile_state_file_is_a_clear_error(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "state.json"
    path.write_text(text)
    with pytest.raises(DcaforgeError) as exc:
        read_state(path)
    assert exc.value.message.startswith("the clean room's state file is corrupt: ")
    assert says in exc.value.message
    assert exc.value.where == str(path) and exc.value.hint == "`dcaforge apply --fresh`"


def test_a_state_file_that_is_no_regular_file_is_not_read(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.json"
    target.write_text('{"phase": "applied"}')
    link = tmp_path / "state.json"
    link.symlink_to(target)
    with pytest.raises(DcaforgeError, match="symlink"):
        read_state(link)
    link.unlink()
    os.mkfifo(link)  # would block a plain read
    with pytest.raises(DcaforgeError, match="reads only regular files"):
        read_state(link)
    link.unlink()
    link.write_bytes(b'{"source": "\xff"}')
    with pytest.raises(DcaforgeError, match="corrupt: 'utf-8' codec can't decode"):
        read_state(link)
    link.unlink()
    assert read_state(link) == RoomState()  # no file: a room with no state yet


def test_a_hostile_state_in_a_room_stops_every_command_cleanly(project) -> None:
    cfg = project.config
    apply(cfg)
    capture(cfg)
    room = Room.of(cfg)
    room.state_file.write_text('{"phase": "applied", "start": "x", "failed": {"index": 1}}')
    for run in (lambda: apply(cfg), lambda: status(cfg), lambda: capture(cfg), lambda: verify(cfg)):
        with pytest.raises(DcaforgeError, match="state file is corrupt: 'failed' is not an object with 'patch'"):
            run()
    room.state_file.write_text('{"phase": "created"}')  # no start commit recorded
    with pytest.raises(DcaforgeError, match="state file is corrupt: it records no start commit"):
        apply(cfg)
    assert apply(cfg, fresh=True, force=True).baseline
