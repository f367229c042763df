"""Anchors: the literal text of an anchor regex, the lines of a file most like it, and one edit applied at
every match (the renderer's, :mod:`dcaforge.feature.plan`; ``templatize`` and the drift table use them too)."""

from __future__ import annotations

import difflib
import functools
import re
from collections import Counter


def anchor_literal(anchor: str) -> str:
    s = re.sub(r"\(\?[aiLmsux]+\)", "", anchor)
    s = re.sub(r"\(\?P<\w+>|\(\?:|\(\?=|\(\?!", "", s)
    s = re.sub(r"\\[sS][*+?]?|\\[dDwW][*+?]?", " ", s)
    s = re.sub(r"(?<!\\)[\^$()]", "", s)
    s = re.sub(r"\\(.)", r"\1", s)
    return re.sub(r"\s+", " ", s).strip()


def closest_lines(text: str, anchor: str, n: int = 3) -> list[str]:
    """The ``n`` lines of ``text`` most like the anchor's literal text (difflib's ratio, ties to the
    earlier line), as ``"LINE: text"``; a line whose quick upper bound is below 0.3 is never one."""
    return list(_closest_lines(text, anchor, n)) if n > 0 else []


@functools.lru_cache(maxsize=64)  # render --check and the drift table ask again for the same file and anchor
def _closest_lines(text: str, anchor: str, n: int) -> tuple[str, ...]:
    literal = anchor_literal(anchor)
    la = len(literal)
    have = Counter(literal)
    # difflib's quick_ratio for each line, an upper bound of its ratio computed without a SequenceMatcher
    # (real_quick_ratio, the cheaper bound on lengths alone, first); lines below 0.3 are never candidates
    candidates: list[tuple[float, int, str, str]] = []
    for i, line in enumerate(text.splitlines(), 1):
        norm = re.sub(r"\s+", " ", line).strip()
        if not norm:
            continue
        length = la + len(norm)
        if 2.0 * min(la, len(norm)) / length < 0.3:
            continue
        bound = 2.0 * sum((have & Counter(norm)).values()) / length
        if bound >= 0.3:
            candidates.append((bound, i, norm, line))
    # the ratio, best bound first, until no bound left can beat the n-th best (ties go to the earlier line)
    candidates.sort(key=lambda t: (-t[0], t[1]))
    best: list[tuple[float, int, str]] = []
    for bound, i, norm, line in candidates:
        if len(best) == n and bound < best[-1][0]:
            break
        r = difflib.SequenceMatcher(None, literal, norm, autojunk=False).ratio()
        best.append((r, i, line.rstrip()))
        best.sort(key=lambda t: (-t[0], t[1]))
        del best[n:]
    return tuple(f"{i}: {line}" for _r, i, line in best)


def find_anchor(text: str, anchor: str) -> list[re.Match[str]]:
    return list(re.finditer(anchor, text))


def apply_edit(text: str, found: list[re.Match[str]], action: str, body: str) -> str:
    """Apply one edit at every match of its anchor (``found``, matched against ``text``): the
    rendered ``body`` is inserted before or after each match, or replaces it; for ``replace`` the
    body is expanded as a ``re`` replacement template (``\\1``, ``\\g<name>``, escapes).
    Raises re.error / IndexError on a bad group reference."""
    for m in reversed(found):
        if action == "insert_before":
            text = text[: m.start()] + body + text[m.start():]
        elif action == "insert_after":
            text = text[: m.end()] + body + text[m.end():]
        else:
            text = text[: m.start()] + m.expand(body) + text[m.end():]
    return text
