"""llama-passkey's output: the passkey hidden and the answer given."""

from __future__ import annotations

import re

_PASSKEY = re.compile(r"passkey = (\d+)")
_SUFFIX = "What is the pass key? The pass key is"
PROMPT_TOKENS = re.compile(r"prompt tokens: (\d+)")
PREFIX_TOKENS = re.compile(r"prefix tokens: (\d+)")


def parse_passkey(text: str) -> tuple[int | None, int | None]:
    """(the passkey hidden, the first number answered after the question) from llama-passkey."""
    m = _PASSKEY.search(text)
    key = int(m.group(1)) if m else None
    i = text.rfind(_SUFFIX)
    answer = None
    if i >= 0:
        a = re.search(r"\d+", text[i + len(_SUFFIX):i + len(_SUFFIX) + 200])
        answer = int(a.group(0)) if a else None
    return key, answer
