"""The key/values of a GGUF file's header, as the gates read them (the model's architecture, trained length, vocabulary
size), through gguf-py's reader (the ``gguf`` package, as ``dcaforge calibrate`` reads and writes GGUFs)."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dcaforge.errors import GateError


def gguf_metadata(path: Path, keys: Sequence[str] = ()) -> dict[str, Any]:
    """The scalar and string key/values of a GGUF file's header, or only ``keys``; of an array only its length,
    as ``<key>#count``."""
    import gguf

    with open(path, "rb") as fh:
        head = fh.read(8)
    if head[:4] != b"GGUF":
        raise GateError(f"{path} is not a GGUF file", where=str(path))
    (version,) = struct.unpack("<I", head[4:8].ljust(4, b"\0"))
    if version & 0xFFFF == 0:  # a big-endian file (gguf-py reads both)
        version = int.from_bytes(head[4:8], "big")
    if version < 2:
        raise GateError(f"{path}: GGUF version {version} is too old", where=str(path))
    try:
        reader = gguf.GGUFReader(path, "r")
    except Exception as exc:  # gguf-py raises ValueError, IndexError, struct errors... on a short or damaged file
        raise GateError(f"{path}: its GGUF header does not read", where=str(path),
                        details=f"{type(exc).__name__}: {exc}"[:500]) from None
    want = set(keys)
    out: dict[str, Any] = {}
    for f in reader.fields.values():
        if f.name.startswith("GGUF."):  # the reader's own fields (version, tensor and key counts)
            continue
        key, value = _key_value(f, gguf.GGUFValueType)
        if not want or key in want:
            out[key] = value
    return out


def _key_value(f: Any, types: Any) -> tuple[str, Any]:
    """(key, value) of a gguf-py ReaderField: a scalar as a Python value, a string decoded (bad UTF-8 replaced), an
    array as ``<key>#count`` and its length (a field's parts: key length, key, value type, then for an array the item
    type, the item count and the items)."""
    kind = f.types[0]
    if kind == types.ARRAY:
        return f"{f.name}#count", int(f.parts[4][0])
    if kind == types.STRING:
        return f.name, bytes(f.parts[-1]).decode("utf-8", "replace")
    return f.name, f.parts[-1].tolist()[0]
