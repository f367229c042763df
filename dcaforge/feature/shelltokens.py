"""A shell script as simple commands of words (read as text, nothing is run): the tokenizer that
:mod:`dcaforge.feature.shellscan` reads build scripts with."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Token:
    line: int
    text: str   # quotes removed, except inside $( )
    raw: str


#: how deep ``$(`` and ``"`` may nest before the rest of the file is taken as one piece (a hostile script)
MAX_NESTING = 64


def _subst_end(text: str, i: int, depth_in: int = 0) -> int:
    """The index after the ``)`` closing a ``$(`` whose body starts at ``i`` (quotes, escapes and
    nested substitutions skipped)."""
    n = len(text)
    if depth_in > MAX_NESTING:
        return n
    depth = 1
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "'":
            j = text.find("'", i + 1)
            i = j + 1 if j >= 0 else n
            continue
        if c == '"':
            i = _dq_end(text, i + 1, depth_in + 1)
            continue
        if text.startswith("$(", i):
            i = _subst_end(text, i + 2, depth_in + 1)
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return n


def _dq_end(text: str, i: int, depth_in: int = 0) -> int:
    """The index after the ``"`` closing a double-quoted string whose body starts at ``i``."""
    n = len(text)
    if depth_in > MAX_NESTING:
        return n
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == '"':
            return i + 1
        if text.startswith("$(", i):
            i = _subst_end(text, i + 2, depth_in + 1)
            continue
        i += 1
    return n


def tokens(text: str) -> list[list[Token]]:
    """The script's simple commands (split at unquoted newlines, ``;``, ``|``, ``&``), each a list of
    words with their line; quotes removed (kept inside ``$(...)``, which stays one piece), a
    backslash-newline joins lines, comments dropped."""
    return _Tokenizer(text).run()


class _Tokenizer:
    """One pass over a script: the word being read (``buf``: quotes removed; ``raw``: as written), the
    command being read (``cur``) and the open quote."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.n = len(text)
        self.commands: list[list[Token]] = []
        self.cur: list[Token] = []
        self.buf: list[str] = []
        self.raw: list[str] = []
        self.line = 1
        self.start = 1
        self.i = 0
        self.quote = ""

    def run(self) -> list[list[Token]]:
        text, n = self.text, self.n
        while self.i < n:
            c = text[self.i]
            if self.quote == "'":
                self.quoted(c)
            elif c == "\\" and self.i + 1 < n:
                self.backslash()
            elif text.startswith("$(", self.i):
                self.substitution()
            elif self.quote == '"':
                self.quoted(c)
            else:
                self.unquoted(c)
        self.end_command()
        return self.commands

    def flush(self) -> None:
        if self.buf or self.raw:
            self.cur.append(Token(self.start, "".join(self.buf), "".join(self.raw)))
        self.buf, self.raw = [], []

    def end_command(self) -> None:
        self.flush()
        if self.cur:
            self.commands.append(self.cur)
        self.cur = []

    def mark_start(self) -> None:
        """A word starts here: it has this line."""
        if not self.buf and not self.raw:
            self.start = self.line

    def quoted(self, c: str) -> None:
        """A character inside quotes: the closing quote, or part of the word."""
        if c == self.quote:
            self.quote = ""
        else:
            self.buf.append(c)
            self.line += c == "\n"
        self.raw.append(c)
        self.i += 1

    def backslash(self) -> None:
        text, i = self.text, self.i
        if text[i + 1] == "\n":  # a continuation: inside quotes kept as a newline (words keep their lines)
            self.line += 1
            if self.quote:
                self.buf.append("\n")
                self.raw.append("\n")
            else:
                self.flush()
            self.i += 2
            return
        self.mark_start()
        self.buf.append(text[i + 1] if not self.quote or text[i + 1] in '"$`\\' else text[i:i + 2])
        self.raw.append(text[i:i + 2])
        self.i += 2

    def substitution(self) -> None:
        """``$(...)``: one piece of the word, as written."""
        self.mark_start()
        j = _subst_end(self.text, self.i + 2)
        piece = self.text[self.i:j]
        self.buf.append(piece)
        self.raw.append(piece)
        self.line += self.text.count("\n", self.i, j)
        self.i = j

    def unquoted(self, c: str) -> None:
        text = self.text
        if c == "\n":
            self.end_command()
            self.line += 1
            self.i += 1
            return
        if c in " \t":
            self.flush()
            self.i += 1
            return
        if c in ";|&":
            self.end_command()
            self.i += 1
            return
        if c == "#" and not self.buf and not self.raw:
            while self.i < self.n and text[self.i] != "\n":
                self.i += 1
            return
        self.mark_start()
        if c in "'\"":
            self.quote = c
            self.raw.append(c)
            self.i += 1
            return
        if c in "()":
            self.flush()
            if text.startswith("()", self.i):  # a function definition: name () {
                self.cur.append(Token(self.line, "()", "()"))
                self.i += 1
            self.i += 1
            return
        self.buf.append(c)
        self.raw.append(c)
        self.i += 1
