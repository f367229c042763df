"""YAML that remembers where each key came from, and a small checked reader over it.

Errors name the key (dotted path), the file and the line, e.g.
``unknown key 'series.rnage'`` at ``dcaforge.yaml:7``.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError


class YDict(dict):  # type: ignore[type-arg]
    """A mapping from YAML with the line of each key (1-based) and of itself."""

    line: int = 0
    key_lines: dict[str, int]


class YList(list):  # type: ignore[type-arg]
    line: int = 0
    item_lines: list[int]


def _convert(node: yaml.Node, file: str) -> Any:
    if isinstance(node, yaml.MappingNode):
        out = YDict()
        out.line = node.start_mark.line + 1
        out.key_lines = {}
        for knode, vnode in node.value:
            if knode.tag == "tag:yaml.org,2002:merge":
                raise ConfigError("YAML merge keys (<<) are not supported",
                                  where=f"{file}:{knode.start_mark.line + 1}")
            key = _convert(knode, file)
            if not isinstance(key, str):
                key = str(key)
            if key in out:
                raise ConfigError(f"duplicate key '{key}'", where=f"{file}:{knode.start_mark.line + 1}")
            out[key] = _convert(vnode, file)
            out.key_lines[key] = knode.start_mark.line + 1
        return out
    if isinstance(node, yaml.SequenceNode):
        lst = YList(_convert(v, file) for v in node.value)
        lst.line = node.start_mark.line + 1
        lst.item_lines = [v.start_mark.line + 1 for v in node.value]
        return lst
    assert isinstance(node, yaml.ScalarNode)
    return _scalar(node)


_LOADER = yaml.SafeLoader("")


def _scalar(node: yaml.ScalarNode) -> Any:
    return _LOADER.construct_object(node, deep=True)


def load_yaml(path: Path) -> Any:
    """Parse ``path``; syntax errors name the file and line."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}", where=str(path)) from None
    return load_yaml_text(text, str(path))


def load_yaml_text(text: str, file: str) -> Any:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{file}:{mark.line + 1}" if mark is not None else file
        raise ConfigError(f"invalid YAML: {getattr(exc, 'problem', exc)}", where=where) from None
    if node is None:
        return YDict()
    return _convert(node, file)


_TYPE_NAMES = {str: "a string", int: "an integer", bool: "true or false", dict: "a mapping",
               list: "a list", float: "a number"}


def _describe(value: Any) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return f"boolean {value}"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return f"{type(value).__name__} {value!r}"


class Reader:
    """Checked access to one YAML mapping: unknown keys and wrong types raise ConfigError."""

    def __init__(self, data: Any, file: str, prefix: str = "", line: int = 0) -> None:
        self.file = file
        self.prefix = prefix
        if data is None:
            data = YDict()
            data.key_lines = {}
            data.line = line
        if not isinstance(data, dict):
            raise ConfigError(f"'{prefix or '(top level)'}' must be a mapping, got {_describe(data)}",
                              where=f"{file}:{getattr(data, 'line', line) or line}")
        self.data = data
        self.line = line or getattr(data, "line", 0)

    def key(self, name: str) -> str:
        return f"{self.prefix}.{name}" if self.prefix else name

    def where(self, name: str | None = None) -> str:
        lines = getattr(self.data, "key_lines", {})
        line = lines.get(name, self.line) if name else self.line
        return f"{self.file}:{line}" if line else self.file

    def check_keys(self, allowed: set[str] | list[str]) -> None:
        for k in self.data:
            if k not in allowed:
                close = difflib.get_close_matches(k, list(allowed), n=1)
                hint = (f"did you mean '{close[0]}'? " if close else "") + \
                    f"allowed here: {', '.join(sorted(allowed))}"
                raise ConfigError(f"unknown key '{self.key(k)}'", where=self.where(k), hint=hint)

    def has(self, name: str) -> bool:
        return name in self.data

    def get(self, name: str, types: type | tuple[type, ...], *, required: bool = False,
            default: Any = None) -> Any:
        if name not in self.data or (self.data[name] is None and not required):
            if required:
                raise ConfigError(f"missing key '{self.key(name)}'", where=self.where(),
                                  hint=f"add '{name}:' to {self.prefix or 'the top level'}")
            return default
        value = self.data[name]
        tup = types if isinstance(types, tuple) else (types,)
        ok = isinstance(value, tup) and not (isinstance(value, bool) and bool not in tup)
        if not ok and float in tup and isinstance(value, int) and not isinstance(value, bool):
            ok = True
        if not ok:
            want = " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in tup)
            raise ConfigError(f"'{self.key(name)}' must be {want}, got {_describe(value)}",
                              where=self.where(name))
        return value

    def sub(self, name: str, *, required: bool = False) -> Reader:
        value = self.get(name, dict, required=required)
        return Reader(value, self.file, self.key(name), line=getattr(self.data, "key_lines", {}).get(name, 0))

    def list_lines(self, name: str) -> list[int]:
        value = self.data.get(name)
        return list(getattr(value, "item_lines", []))

    def error(self, name: str, message: str, hint: str | None = None) -> ConfigError:
        return ConfigError(message, where=self.where(name), hint=hint)
