"""The clean room's state (``.git/dcaforge/state.json``): one typed record, read and written here only.

On disk it is a JSON object, the keys of :class:`RoomState` (sorted, indented by two); a key
that is absent and a key that is ``null`` mean the same (the field is None), and a key this
version does not know is kept as it was. The file is input like any other (a hand edit, a
hostile room): it is read as a regular file of bounded size, never through a symlink, and every
value is checked for its type, so a bad one is an error that names the key, never a traceback.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from typing import Any

from dcaforge import guard
from dcaforge.errors import DcaforgeError

#: The most bytes the state file may hold (it records a few hashes per rendered file).
STATE_LIMIT = 16 * 1024 * 1024


class Phase(StrEnum):
    """Where ``dcaforge apply`` left the room (the state's ``phase``; none before the room is made)."""

    CREATING = "creating"  # read only: the room is made in a temporary folder and moved in whole
    CREATED = "created"  # cloned, bootstrapped and tagged dcaforge/start; no patch applied yet
    RESETTING = "resetting"  # going back to the start commit (an interrupted reset is done again)
    APPLYING = "applying"  # applying the series (interrupted by a hard kill when read)
    APPLIED = "applied"  # the series applied and the baseline tagged (the render has its own keys)
    FAILED = "failed"  # a patch did not apply: ``failed`` says which
    INTERRUPTED = "interrupted"  # Ctrl-C or SIGTERM while applying the series


@dataclass(frozen=True)
class Failed:
    """The patch that stopped the series, and where and why (the state's ``failed``)."""

    patch: str
    index: int | None = None
    file: str | None = None
    hunk: str | None = None
    reason: str | None = None


@dataclass(frozen=True)
class Captured:
    """The last patch ``capture`` wrote: where, its sha256 and the git tree it is the diff to (``captured``)."""

    patch: str
    sha256: str
    tree: str


@dataclass
class RoomState:
    """The room's state file, key by key; None is an absent key."""

    phase: Phase | None = None
    source: str | None = None  # the source's description (what the room was made from)
    base: str | None = None  # the source commit checked out
    start: str | None = None  # the start commit (tagged dcaforge/start)
    config: str | None = None  # the config that made the room, described
    bootstrap: list[Any] | None = None  # the bootstrap steps' records
    submodules: bool | list[str] | None = None  # which submodules were checked out
    wip: bool | None = None  # the source checkout's uncommitted files were copied in
    series: list[dict[str, str]] | None = None  # the series applied: name, sha256, style of each patch
    failed: Failed | None = None
    baseline: str | None = None  # the commit tagged dcaforge/baseline
    rendered: dict[str, str] | None = None  # file -> sha256 of what the last render wrote
    rendering: dict[str, str] | None = None  # the same, while a render writes (set: it was interrupted)
    render_error: str | None = None  # why the last render stopped
    templates_digest: str | None = None  # the templates' digest at the last render
    captured: Captured | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # keys this version does not know, kept as they were

    def to_json(self) -> dict[str, Any]:
        out = dict(self.extra)
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "extra" or value is None:
                continue
            if isinstance(value, Phase):
                value = value.value
            elif isinstance(value, Failed | Captured):
                value = {k.name: getattr(value, k.name) for k in fields(value)}
            out[f.name] = value
        return out

    def dump(self) -> bytes:
        return (json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n").encode()

    @classmethod
    def from_json(cls, data: Any) -> RoomState:
        """The state that ``data`` (a parsed state file) records; a value of the wrong type raises :class:`_Bad`."""
        if not isinstance(data, dict):
            raise _Bad(f"it holds a JSON {type(data).__name__}, not an object")
        known = {f.name for f in fields(cls)} - {"extra"}
        values: dict[str, Any] = {k: _check(k, v) for k, v in data.items() if k in known and v is not None}
        values["extra"] = {k: v for k, v in data.items() if k not in known}
        return cls(**values)


class _Bad(ValueError):
    """A state file that is not what this version writes (the message says which key and why)."""


def _str(key: str, v: Any) -> str:
    if not isinstance(v, str):
        raise _Bad(f"{key!r} is {json.dumps(v)[:60]}, not a string")
    return v


def _opt_str(key: str, v: Any) -> str | None:
    return None if v is None else _str(key, v)


def _str_map(key: str, v: Any) -> dict[str, str]:
    if not isinstance(v, dict) or not all(isinstance(x, str) for x in v.values()):
        raise _Bad(f"{key!r} is not an object of strings")
    return dict(v)


def _obj(key: str, v: Any, want: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(v, dict) or any(k not in v for k in want):
        raise _Bad(f"{key!r} is not an object with {', '.join(repr(k) for k in want)}")
    return v


def _phase(key: str, v: Any) -> Phase:
    text = _str(key, v)
    try:
        return Phase(text)
    except ValueError:
        raise _Bad(f"{key!r} is {v!r}, not one of {', '.join(p.value for p in Phase)}") from None


def _failed(key: str, v: Any) -> Failed:
    d = _obj(key, v, ("patch",))
    index = d.get("index")
    if index is not None and (not isinstance(index, int) or isinstance(index, bool)):
        raise _Bad(f"'{key}.index' is {json.dumps(index)[:60]}, not a number")
    return Failed(patch=_str(f"{key}.patch", d["patch"]), index=index, file=_opt_str(f"{key}.file", d.get("file")),
                  hunk=_opt_str(f"{key}.hunk", d.get("hunk")), reason=_opt_str(f"{key}.reason", d.get("reason")))


def _captured(key: str, v: Any) -> Captured:
    d = _obj(key, v, ("patch", "sha256", "tree"))
    return Captured(**{k: _str(f"{key}.{k}", d[k]) for k in ("patch", "sha256", "tree")})


def _list(key: str, v: Any) -> list[Any]:
    if not isinstance(v, list):
        raise _Bad(f"{key!r} is not a list")
    return v


def _series(key: str, v: Any) -> list[dict[str, str]]:
    return [_str_map(f"{key}[{i}]", x) for i, x in enumerate(_list(key, v))]


def _submodules(key: str, v: Any) -> bool | list[str]:
    if isinstance(v, bool):
        return v
    return [_str(f"{key}[{i}]", x) for i, x in enumerate(_list(key, v))]


def _bool(key: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise _Bad(f"{key!r} is {json.dumps(v)[:60]}, not true or false")
    return v


_CHECKS = {"phase": _phase, "source": _str, "base": _str, "start": _str, "config": _str, "bootstrap": _list,
           "submodules": _submodules, "wip": _bool, "series": _series, "failed": _failed, "baseline": _str,
           "rendered": _str_map, "rendering": _str_map, "render_error": _str, "templates_digest": _str,
           "captured": _captured}


def _check(key: str, v: Any) -> Any:
    return _CHECKS[key](key, v)


def read_state(path: Path) -> RoomState:
    """The state recorded at ``path`` (an empty one when there is no file); a file that cannot be read or
    holds something else than a state is an error that says so, and that ``apply --fresh`` makes the room again."""
    if not os.path.lexists(path):
        return RoomState()
    data = guard.read_regular(path, what="the clean room's state file", limit=STATE_LIMIT, follow=False)
    try:
        return RoomState.from_json(json.loads(data.decode("utf-8")))
    except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, or a value of the wrong type
        raise DcaforgeError(f"the clean room's state file is corrupt: {exc}", where=str(path),
                            hint="`dcaforge apply --fresh`") from None
