"""YAML that remembers where each key came from, and a small checked reader over it.

Errors name the key (dotted path), the file and the line, e.g.
``unknown key 'series.rnage'`` at ``dcaforge.yaml:7``.

Every file is untrusted: it is read only up to :data:`MAX_YAML_BYTES`, aliases may expand to at
most :data:`MAX_YAML_NODES` values and nest :data:`MAX_YAML_DEPTH` deep (no "billion laughs", no
recursive alias), only YAML's plain types are made (an unknown tag is an error), and every problem
(syntax, encoding, a bomb, a tag) is reported as ``file:line:col: what`` with the next step.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml

from dcaforge import guard
from dcaforge.errors import ConfigError, DcaforgeError

#: Larger YAML files are refused unread (the shipped manifest is about 60 KiB).
MAX_YAML_BYTES = 8 * 1024 * 1024
#: Values a file may expand to, aliases counted each time they are used.
MAX_YAML_NODES = 200_000
#: How deep mappings and lists may nest.
MAX_YAML_DEPTH = 64
_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_YAML_HINT = "fix the file at that place (YAML: https://yaml.org/spec/1.2.2/), then run the command again"


def _problem(file: str, line: int, col: int, what: str, hint: str = _YAML_HINT) -> ConfigError:
    return ConfigError(f"{file}:{line}:{col}: {what}", where=f"{file}:{line}:{col}", hint=hint)


class _Budget:
    def __init__(self, file: str) -> None:
        self.file = file
        self.nodes = 0
        self.active: set[int] = set()


class YDict(dict):  # type: ignore[type-arg]
    """A mapping from YAML with the line of each key (1-based) and of itself."""

    line: int = 0
    key_lines: dict[str, int]


class YList(list):  # type: ignore[type-arg]
    line: int = 0
    item_lines: list[int]


def _convert(node: yaml.Node, budget: _Budget, depth: int = 0) -> Any:
    file = budget.file
    mark = node.start_mark
    budget.nodes += 1
    if budget.nodes > MAX_YAML_NODES:
        raise _problem(file, mark.line + 1, mark.column + 1,
                       f"the file expands to more than {MAX_YAML_NODES} values (aliases used over and over: a "
                       "'billion laughs' bomb?)", hint="write the values out, or use fewer aliases")
    if depth > MAX_YAML_DEPTH:
        raise _problem(file, mark.line + 1, mark.column + 1, f"mappings and lists nest deeper than {MAX_YAML_DEPTH}")
    if id(node) in budget.active:
        raise _problem(file, mark.line + 1, mark.column + 1, "a recursive alias (an anchor used inside itself)",
                       hint="remove the alias that refers to its own anchor")
    if isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
        want = _MAP_TAG if isinstance(node, yaml.MappingNode) else _SEQ_TAG
        if node.tag != want:
            raise _problem(file, mark.line + 1, mark.column + 1, f"unknown tag {node.tag!r}: only plain mappings and "
                           "lists are read", hint="remove the tag")
    budget.active.add(id(node))
    try:
        if isinstance(node, yaml.MappingNode):
            out = YDict()
            out.line = mark.line + 1
            out.key_lines = {}
            for knode, vnode in node.value:
                if knode.tag == "tag:yaml.org,2002:merge":
                    raise ConfigError("YAML merge keys (<<) are not supported",
                                      where=f"{file}:{knode.start_mark.line + 1}", hint="write the keys out")
                key = _convert(knode, budget, depth + 1)
                if not isinstance(key, str):
                    key = str(key)
                if key in out:
                    raise ConfigError(f"duplicate key '{key}'", where=f"{file}:{knode.start_mark.line + 1}",
                                      hint="keep one of them")
                out[key] = _convert(vnode, budget, depth + 1)
                out.key_lines[key] = knode.start_mark.line + 1
            return out
        if isinstance(node, yaml.SequenceNode):
            lst = YList(_convert(v, budget, depth + 1) for v in node.value)
            lst.line = mark.line + 1
            lst.item_lines = [v.start_mark.line + 1 for v in node.value]
            return lst
        assert isinstance(node, yaml.ScalarNode)
        try:
            return _scalar(node)
        except (yaml.YAMLError, ValueError) as exc:
            what = getattr(exc, "problem", None) or str(exc)
            raise _problem(file, mark.line + 1, mark.column + 1, f"cannot read this value: {what}",
                           hint="quote it to make it a string, or remove its tag") from None
    finally:
        budget.active.discard(id(node))


_LOADER = yaml.SafeLoader("")


def _scalar(node: yaml.ScalarNode) -> Any:
    return _LOADER.construct_object(node, deep=True)


def load_yaml(path: Path) -> Any:
    """Parse ``path`` (bounded; see the module's doc); every problem names the file, line and column."""
    try:
        size = path.stat().st_size
        if size > MAX_YAML_BYTES:
            raise ConfigError(f"{path}: {size} bytes, more than dcaforge reads as YAML ({MAX_YAML_BYTES})",
                              where=str(path), hint="check that it is the file you meant")
        # a regular file only (a FIFO would block), bounded, every problem naming the file
        data = guard.read_regular(path, what="the YAML file", limit=MAX_YAML_BYTES)
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}", where=str(path),
                          hint=f"check that {path} exists and is a readable file") from None
    except DcaforgeError as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(exc.message, where=exc.where, hint=exc.hint) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        col = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise _problem(str(path), line, col, f"not UTF-8 text (byte {data[exc.start]:#04x})",
                       hint="save the file as UTF-8") from None
    return load_yaml_text(text, str(path))


def _line_col(text: str, pos: int) -> tuple[int, int]:
    line = text.count("\n", 0, pos) + 1
    return line, pos - (text.rfind("\n", 0, pos) + 1) + 1


def load_yaml_text(text: str, file: str) -> Any:
    if len(text) > MAX_YAML_BYTES:
        raise ConfigError(f"{file}: more than {MAX_YAML_BYTES} characters of YAML", where=file,
                          hint="check that it is the file you meant")
    try:
        try:
            node = yaml.compose(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        except yaml.YAMLError:
            node = yaml.compose(text, Loader=yaml.SafeLoader)  # the same error, with the pure loader's words
    except yaml.reader.ReaderError as exc:
        line, col = _line_col(text, exc.position)
        char = exc.character if isinstance(exc.character, int) else ord(str(exc.character)[:1] or "\0")
        raise _problem(file, line, col, f"invalid YAML: {exc.reason} (character {char:#04x})",
                       hint="remove that character (control characters are not allowed in YAML)") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        what = getattr(exc, "problem", None) or str(exc)
        context = getattr(exc, "context", None)
        if mark is None:
            raise ConfigError(f"{file}: invalid YAML: {what}", where=file, hint=_YAML_HINT) from None
        raise _problem(file, mark.line + 1, mark.column + 1,
                       f"invalid YAML: {what}" + (f" ({context})" if context else "")) from None
    except RecursionError:
        raise ConfigError(f"{file}: invalid YAML: mappings and lists nest too deeply", where=file,
                          hint="flatten the file") from None
    if node is None:
        return YDict()
    _expanded_size(node, file, {}, set())
    return _convert(node, _Budget(file))


def _expanded_size(node: yaml.Node, file: str, memo: dict[int, int], active: set[int], depth: int = 0) -> int:
    """How many values ``node`` expands to, aliases counted each time (linear in the file's nodes:
    a bomb is refused before it is expanded)."""
    key = id(node)
    if key in memo:
        return memo[key]
    mark = node.start_mark
    if key in active:
        raise _problem(file, mark.line + 1, mark.column + 1, "a recursive alias (an anchor used inside itself)",
                       hint="remove the alias that refers to its own anchor")
    if depth > MAX_YAML_DEPTH:
        raise _problem(file, mark.line + 1, mark.column + 1, f"mappings and lists nest deeper than {MAX_YAML_DEPTH}")
    active.add(key)
    total = 1
    if isinstance(node, yaml.MappingNode):
        children = [n for pair in node.value for n in pair]
    elif isinstance(node, yaml.SequenceNode):
        children = list(node.value)
    else:
        children = []
    for child in children:
        total += _expanded_size(child, file, memo, active, depth + 1)
        if total > MAX_YAML_NODES:
            raise _problem(file, mark.line + 1, mark.column + 1,
                           f"the file expands to more than {MAX_YAML_NODES} values (aliases used over and over: a "
                           "'billion laughs' bomb?)", hint="write the values out, or use fewer aliases")
    active.discard(key)
    memo[key] = total
    return total


_TYPE_NAMES = {str: "a string", int: "an integer", bool: "true or false", dict: "a mapping",
               list: "a list", float: "a number"}
#: How each type is written in YAML, for hints.
_EXAMPLES = {str: '"text"', int: "4", bool: "true", dict: "{key: value}", list: "[a, b]", float: "1.5"}


def show(value: Any, limit: int = 60) -> str:
    """``value`` as YAML writes it (flow style), cut to about ``limit`` characters."""
    if value is None:
        text = "null"
    elif isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, str):
        text = repr(value)
    elif isinstance(value, dict):
        text = "{" + ", ".join(f"{k}: {show(v, limit)}" for k, v in value.items()) + "}"
    elif isinstance(value, list):
        text = "[" + ", ".join(show(v, limit) for v in value) + "]"
    else:
        text = str(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def describe(value: Any) -> str:
    """The type and the value a config holds, for a message: ``a string '4'``, ``a list [1, 2]``."""
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return f"a boolean {show(value)}"
    for t, name in _TYPE_NAMES.items():
        if t is not bool and isinstance(value, t):
            return f"{name} {show(value)}"
    return f"{type(value).__name__} {show(value)}"


def type_hint(name: str, value: Any, types: tuple[type, ...]) -> str:
    """The next step for a value of the wrong type: the key written with a value of a type it takes."""
    if isinstance(value, str):
        raw = value.strip()
        if (int in types and raw.lstrip("-").isdigit()) or (bool in types and raw.lower() in ("true", "false")):
            return f"write it without quotes ({name}: {raw.lower() if bool in types else raw}), then run the command again"
    example = _EXAMPLES.get(types[0], "...")
    return f"write it as {' or '.join(_TYPE_NAMES.get(t, t.__name__) for t in types)} (e.g. {name}: {example}), " \
           "then run the command again"


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
            raise ConfigError(f"'{prefix or '(top level)'}' must be a mapping, got {describe(data)}",
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
            raise ConfigError(f"'{self.key(name)}' must be {want}, got {describe(value)}",
                              where=self.where(name), hint=type_hint(name, value, tup))
        return value

    def sub(self, name: str, *, required: bool = False) -> Reader:
        value = self.get(name, dict, required=required)
        return Reader(value, self.file, self.key(name), line=getattr(self.data, "key_lines", {}).get(name, 0))

    def list_lines(self, name: str) -> list[int]:
        value = self.data.get(name)
        return list(getattr(value, "item_lines", []))

    def error(self, name: str, message: str, hint: str | None = None) -> ConfigError:
        return ConfigError(message, where=self.where(name), hint=hint)
