"""What ``--json`` prints: a result of the library (its dataclasses) as plain JSON values.

Every command that reports takes ``--json`` and prints one object: the fields of the dataclass the
library returned, by their names, recursively (paths as strings, tuples as lists, nested results
as objects), plus ``"command"``, so a script reads the same keys as the code does. Hooks
(callables) are left out; nothing is computed here.
"""

from __future__ import annotations

import dataclasses
from pathlib import PurePath
from typing import Any


def to_jsonable(obj: Any) -> Any:
    """``obj`` as JSON values: dataclasses (their fields), mappings, sequences, paths, scalars."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                if not callable(getattr(obj, f.name))}
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        items = [to_jsonable(v) for v in obj]
        return sorted(items, key=repr) if isinstance(obj, (set, frozenset)) else items
    if isinstance(obj, PurePath):
        return str(obj)
    if isinstance(obj, bytes):
        return obj.decode("utf-8", "replace")
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    to_dict = getattr(obj, "to_dict", None)
    if callable(to_dict):
        return to_jsonable(to_dict())
    return str(obj)


def report(command: str, result: Any, **extra: Any) -> dict[str, Any]:
    """The object ``dcaforge COMMAND --json`` prints: ``result``'s fields, ``extra`` (values the
    command derives, e.g. ``ok``), and ``command``."""
    data = to_jsonable(result)
    if not isinstance(data, dict):
        data = {"result": data}
    data.update({k: to_jsonable(v) for k, v in extra.items()})
    data["command"] = command
    return data
