"""What a shell build script names, read as text (nothing is run): its words after variable
expansion, through the files it ``source``\\ s and the functions it calls.

llamafile's GPU library script (``llamafile/cuda.sh`` of 0.10.x) names no CUDA source itself: it
``source``\\ s ``build-functions.sh``, whose ``collect_gpu_sources "$GGML_CUDA_DIR" ...`` globs
``"$ggml_cuda_dir"/*.cu``, with ``GGML_CUDA_DIR="$LLAMA_CPP_DIR/ggml/src/ggml-cuda"`` and
``LLAMA_CPP_DIR="$SCRIPT_DIR/../llama.cpp"``. :func:`scan` follows that: assignments (``local``,
``export`` ... included) give each variable its possible values, ``SCRIPT_DIR="$(cd "$(dirname
"$0")" && pwd)"`` (and the ``dirname``/``BASH_SOURCE`` forms) is the script's folder, a function's
``$1``... take the arguments of each call of it, and ``source FILE`` / ``. FILE`` read FILE too.
Every word is expanded against those values (several values give several words) and made
relative to the clean room's root (the script runs there: relative paths stay as they are).

It is a static over-approximation: a variable keeps every value any line gives it, and a branch
the script would not take still counts. Good for "which files does this script hand the compiler",
not for running it.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from dcaforge.feature.shelltokens import Token, tokens

#: How deep ``source`` is followed and how many words one expansion may give.
MAX_DEPTH = 8
MAX_EXPANSIONS = 64

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\+?=(.*)$", re.S)
_FUNC_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_:-]*$")
#: the script's own folder: "$(cd "$(dirname "$0")" && pwd)", "$(dirname "${BASH_SOURCE[0]}")", ...
_SCRIPT_DIR = re.compile(r"^\$\((?:cd\s+)?\"?\$\(\s*dirname\s+\"?\$(?:0|\{0\}|\{?BASH_SOURCE(?:\[0\])?\}?)\"?\s*\)\"?"
                         r"(?:\s*(?:&&|;)\s*pwd(?:\s+-P)?)?\s*\)$|^\$\(\s*dirname\s+\"?\$(?:0|\{0\}|\{?BASH_SOURCE"
                         r"(?:\[0\])?\}?)\"?\s*\)$")
_KEYWORDS = {"local", "export", "readonly", "declare", "typeset"}


def glob_regex(pattern: str) -> re.Pattern[str]:
    """A shell/make glob (``*``, ``?``, ``[...]``; ``*`` does not cross ``/``) as a regex."""
    out = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = pattern.find("]", i + 1)
            if j < 0:
                out.append(re.escape(c))
            else:
                out.append("[" + pattern[i + 1:j].replace("!", "^", 1) + "]")
                i = j
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out) + r"\Z")



@dataclass(frozen=True)
class Word:
    """One word a script names: ``value`` after expansion and made room-relative when it is a path."""

    file: str   # the script or a file it sources (room-relative)
    line: int
    value: str
    source: str  # the word as written (quotes removed)



@dataclass
class _Scope:
    values: dict[str, set[str]] = field(default_factory=dict)
    params: dict[str, dict[str, int]] = field(default_factory=dict)  # function -> its local var -> $N it takes
    calls: dict[str, list[list[str]]] = field(default_factory=dict)  # function -> the argument lists of its calls


@dataclass
class Scan:
    """The words of a script and of every file it sources."""

    script: str
    files: list[str] = field(default_factory=list)
    words: list[Word] = field(default_factory=list)

    def covers(self, path: str) -> Word | None:
        """The first word naming ``path`` (room-relative): the path itself or a glob matching it."""
        path = posixpath.normpath(path)
        for w in self.words:
            if w.value == path:
                return w
        for w in self.words:
            if any(ch in w.value for ch in "*?[") and glob_regex(w.value).match(path):
                return w
        return None

    def describe(self, w: Word) -> str:
        """``line N`` (or ``FILE line N`` for a sourced file), with the glob and its source when expanded."""
        where = f"line {w.line}" if w.file == self.script else f"sources {w.file}: line {w.line}"
        if any(ch in w.value for ch in "*?["):
            shown = w.value if w.value == w.source else f"{w.value} from {w.source}"
            return f"{where} (glob {shown})"
        return where if w.value == w.source else f"{where} ({w.source})"


def _script_dir_value(value: str, folder: str) -> str | None:
    return folder if _SCRIPT_DIR.match(value.strip()) else None


def _norm(value: str) -> str:
    if "/" not in value or value.startswith(("-", "/")) or "://" in value:
        return value
    out = posixpath.normpath(value)
    return out + ("/" if value.endswith("/") and out != "." else "")


def _find_var(text: str) -> tuple[int, int, str, str | None, bool] | None:
    """The first ``$NAME``, ``$N`` or ``${...}`` in ``text``: (start, end, name, default or None,
    understood). ``${NAME:-x}``, ``${NAME-x}``, ``${NAME:=x}``, ``${NAME=x}`` give a default; other
    operators (``${1#--x=}``, ``${V%/*}``...) are not understood."""
    i = 0
    while True:
        i = text.find("$", i)
        if i < 0 or i + 1 >= len(text):
            return None
        nxt = text[i + 1]
        if nxt == "{":
            depth, j = 1, i + 2
            while j < len(text) and depth:
                depth += {"{": 1, "}": -1}.get(text[j], 0)
                j += 1
            if depth:
                return None
            inner = text[i + 2:j - 1]
            m = re.match(r"([A-Za-z_][A-Za-z0-9_]*|[0-9]+)(.*)$", inner, re.S)
            if m is None:
                return i, j, "", None, False
            name, rest = m.group(1), m.group(2)
            if not rest:
                return i, j, name, None, True
            om = re.match(r"(:?[-=])(.*)$", rest, re.S)
            if om:
                return i, j, name, om.group(2), True
            return i, j, name, None, False
        m = re.match(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]", text[i + 1:])
        if m:
            return i, i + 1 + m.end(), m.group(0), None, True
        i += 1


def _expand(text: str, scope: _Scope, positional: list[list[str]] | None, depth: int = 0,
            active: frozenset[str] = frozenset()) -> list[str]:
    """Every value ``text`` may take (an unknown variable or operator: the word is dropped; a variable
    is not expanded again inside its own value)."""
    found = _find_var(text)
    if found is None:
        return [text]
    if depth > 12:
        return []
    start, end, name, default, understood = found
    if not understood or name in active:
        return []
    if name.isdigit():
        k = int(name)
        vals = sorted({args[k - 1] for args in positional or [] if 0 < k <= len(args)})
    else:
        vals = sorted(scope.values.get(name, set()))
    if not vals and default is not None:
        vals = [default]
    out: list[str] = []
    for v in vals:
        head = _expand(v, scope, positional, depth + 1, active | {name})
        for h in head:
            for tail in _expand(text[end:], scope, positional, depth + 1, active):
                out.append(text[:start] + h + tail)
                if len(out) >= MAX_EXPANSIONS:
                    return out
    return out


def scan(read: Callable[[str], str | None], script: str) -> Scan | None:
    """The words of ``script`` (room-relative) and of the files it sources; None when it is absent."""
    text = read(script)
    if text is None:
        return None
    result = Scan(script=script)
    scope = _Scope()
    parsed: list[tuple[str, list[_Command]]] = []
    todo = [(script, text, 0)]
    seen: set[str] = set()
    while todo:
        rel, body, depth = todo.pop(0)
        if rel in seen:
            continue
        seen.add(rel)
        result.files.append(rel)
        cmds = _read_commands(body, scope, posixpath.dirname(rel))
        parsed.append((rel, cmds))
        if depth < MAX_DEPTH:
            todo.extend((target, sub, depth + 1) for target, sub in _sourced(cmds, scope, read))
    _pass_arguments(parsed, scope)
    result.words = [w for rel, cmds in parsed for w in _words(rel, cmds, scope)]
    return result


_Command = tuple[str | None, list[Token]]  # (the function it is in or None, its words)


def _read_commands(body: str, scope: _Scope, folder: str) -> list[_Command]:
    """A file's commands, each with the function it is in; function definitions and assignments recorded
    in ``scope`` (``folder``: the file's own, for ``SCRIPT_DIR=...``)."""
    cmds: list[_Command] = []
    func: str | None = None
    brace = 0
    for cmd in tokens(body):
        words = [t.text for t in cmd]
        name = None
        if words[0] == "function" and len(words) >= 2 and _FUNC_NAME.match(words[1]):
            name, rest = words[1], words[2:]
        elif len(words) >= 2 and words[1] == "()" and _FUNC_NAME.match(words[0]):
            name, rest = words[0], words[2:]
        if name is not None and rest in ([], ["{"], ["()"], ["()", "{"]):
            func = name
            brace = 1 if "{" in rest else 0
            scope.params.setdefault(func, {})
            continue
        if func is not None:
            if words == ["{"]:
                brace += 1
                continue
            if words == ["}"]:
                brace -= 1
                if brace <= 0:
                    func = None
                continue
        cmds.append((func, cmd))
        _assign(words, func, scope, folder)
    return cmds


def _assign(words: list[str], func: str | None, scope: _Scope, folder: str) -> None:
    """The assignments a command makes (after ``local``, ``export`` ... and their options): a value for the
    variable, or (in a function) the ``$N`` a local takes."""
    k = 1 if words[0] in _KEYWORDS else 0
    while k < len(words) and words[k].startswith("-") and words[0] in _KEYWORDS:
        k += 1
    for tok in words[k:]:
        am = _ASSIGN.match(tok)
        if not am:
            break
        name, value = am.group(1), am.group(2)
        pm = re.fullmatch(r"\$\{?([0-9])\}?", value.strip())
        if func is not None and pm:
            scope.params[func][name] = int(pm.group(1))
            continue
        sd = _script_dir_value(value, folder)
        scope.values.setdefault(name, set()).add(sd if sd is not None else value)


def _sourced(cmds: list[_Command], scope: _Scope, read: Callable[[str], str | None]) -> list[tuple[str, str]]:
    """The files the commands source (expanded with what is known so far), with their text: only files of the tree."""
    out: list[tuple[str, str]] = []
    for _func, cmd in cmds:
        if cmd[0].text in ("source", ".") and len(cmd) > 1:
            for target in _expand(cmd[1].text, scope, None):
                target = _norm(target)
                if target.startswith(("/", "../", "-")) or target in ("", ".", "..") or "\0" in target:
                    continue  # only files of the tree are read
                sub = read(target)
                if sub is not None:
                    out.append((target, sub))
    return out


def _pass_arguments(parsed: list[tuple[str, list[_Command]]], scope: _Scope) -> None:
    """Function calls: their arguments, for the functions' $1...; a function's locals that take $N get the
    values of each call's argument N."""
    functions = set(scope.params)
    for _rel, cmds in parsed:
        for _func, cmd in cmds:
            if cmd[0].text in functions:
                scope.calls.setdefault(cmd[0].text, []).append([t.text for t in cmd[1:]])
    for _round in range(3):  # calls inside functions pass values on
        for fname, params in scope.params.items():
            for var, k in params.items():
                for args in scope.calls.get(fname, []):
                    if 0 < k <= len(args):
                        scope.values.setdefault(var, set()).update(_expand(args[k - 1], scope, None))


def _words(rel: str, cmds: list[_Command], scope: _Scope) -> list[Word]:
    """Every word of a file's commands, expanded (a value naming another variable resolved too)."""
    out: list[Word] = []
    for func, cmd in cmds:
        positional = scope.calls.get(func or "", []) if func else None
        for token in cmd:
            body = token.text
            sub_cmd = body.startswith("$(") and body.endswith(")")
            if sub_cmd:  # a command substitution: its words (quotes left inside it dropped)
                body = body[2:-1].replace('"', " ").replace("'", " ")
            for k, piece in enumerate(body.split("\n")):
                for sub in piece.split():
                    am = _ASSIGN.match(sub)
                    src = am.group(2) if am else sub
                    if not src or src.startswith("$(") and _script_dir_value(src, "") is not None:
                        continue
                    for v in _expand(src, scope, positional):
                        for part in v.split():
                            out.append(Word(rel, token.line + k, _norm(part), src))
    return out
