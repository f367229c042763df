"""The key/values of a GGUF file's header, as the gates read them (the model's architecture, trained length, vocabulary
size)."""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dcaforge.errors import GateError

_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def gguf_metadata(path: Path, keys: Sequence[str] = ()) -> dict[str, Any]:
    """The scalar and string key/values of a GGUF file's header, or only ``keys``; of an array only its length,
    as ``<key>#count``."""
    want = set(keys)
    out: dict[str, Any] = {}
    with open(path, "rb") as fh:
        if fh.read(4) != b"GGUF":
            raise GateError(f"{path} is not a GGUF file", where=str(path))
        version, _n_tensors, n_kv = struct.unpack("<IQQ", fh.read(20))
        if version < 2:
            raise GateError(f"{path}: GGUF version {version} is too old", where=str(path))

        def rstr() -> str:
            (n,) = struct.unpack("<Q", fh.read(8))
            return fh.read(n).decode("utf-8", "replace")

        def rval(t: int) -> Any:
            if t in _GGUF_SCALARS:
                fmt = _GGUF_SCALARS[t]
                return struct.unpack(fmt, fh.read(struct.calcsize(fmt)))[0]
            if t == 8:
                return rstr()
            if t == 9:
                (et,) = struct.unpack("<I", fh.read(4))
                (n,) = struct.unpack("<Q", fh.read(8))
                if et in _GGUF_SCALARS:
                    fh.seek(struct.calcsize(_GGUF_SCALARS[et]) * n, os.SEEK_CUR)
                else:
                    for _ in range(n):
                        rval(et)
                return _ArrayLen(n)
            raise GateError(f"{path}: unknown GGUF value type {t}", where=str(path))

        for _ in range(n_kv):
            key = rstr()
            (t,) = struct.unpack("<I", fh.read(4))
            value = rval(t)
            if isinstance(value, _ArrayLen):
                key, value = f"{key}#count", int(value)
            if not want or key in want:
                out[key] = value
    return out


class _ArrayLen(int):
    """An array's length in gguf_metadata: the array itself is skipped, its length kept as "<key>#count"."""
