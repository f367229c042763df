"""Long-context retrieval trials that cannot fit their own test: a pass key in real text, a fresh random key per
trial, and a score with its Wilson interval.

A *trial set* (dev or held-out) is a pure function of its definition: a seed, the lengths in tokens, the number of
trials per length and a text corpus. Trial ``i`` at length ``n`` draws, from ``random.Random("<set>/<seed>/<n>/<i>")``,

- its key: five random digits (10000-99999), never one fixed number (``llama-passkey`` hides the same key in every
  run, so a setting that favours one number would look good),
- its depth: where the needle sits in the haystack, uniform in ``[depth_lo, depth_hi]``,
- its text: where in the corpus the haystack starts (the corpus is read as a ring).

The prompt is assembled from tokens, so every length is exact whatever the tokenizer: the corpus is tokenized once
in paragraphs (:class:`TokenizedCorpus`), the haystack is a slice of those tokens, and the needle
``The pass key is K. Remember it. K is the pass key.`` goes between two paragraphs at the drawn depth, in
``llama-passkey``'s frame (its opening instruction and its closing question, "What is the pass key? The pass key is").

Scoring is strict: the trial passes when the first number of the greedy answer is the key (a near miss, one digit
off, fails). :func:`wilson` gives the 95% interval of a score k/n.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
          "I will quiz you about the important information there.\n\n")
NEEDLE = "\n\nThe pass key is {key}. Remember it. {key} is the pass key.\n\n"
QUESTION = "\n\nWhat is the pass key? The pass key is"
N_PREDICT = 8

#: paragraphs longer than this many characters are cut (the tokenizer sees bounded pieces)
MAX_PIECE = 4000


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """The Wilson score interval (95% by default) of k successes in n trials; (0, 1) for n = 0."""
    if n <= 0:
        return 0.0, 1.0
    if not 0 <= k <= n:
        raise ValueError(f"wilson: k = {k} outside [0, {n}]")
    p = k / n
    d = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / d
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, centre - half), min(1.0, centre + half)


def first_number(text: str) -> str | None:
    m = re.search(r"\d+", text)
    return m.group(0) if m else None


def passed(key: str, answer: str) -> bool:
    """The first number of the answer is the key (exact: a near miss fails)."""
    return first_number(answer) == key


def pieces(text: str) -> list[str]:
    """The corpus as paragraphs (blank-line separated), each at most :data:`MAX_PIECE` characters, none empty."""
    out: list[str] = []
    for para in re.split(r"\n\s*\n", text):
        para = para.strip()
        while len(para) > MAX_PIECE:
            cut = para.rfind("\n", 0, MAX_PIECE)
            cut = cut if cut > MAX_PIECE // 2 else MAX_PIECE
            out.append(para[:cut].strip())
            para = para[cut:].strip()
        if para:
            out.append(para)
    return out


@dataclass
class TokenizedCorpus:
    """A corpus as token paragraphs (tokenized once, without BOS), read as a ring."""

    name: str
    sha256: str
    paragraphs: list[list[int]]
    sep: list[int]  # the tokens of the blank line between paragraphs
    total: int = field(init=False)

    def __post_init__(self) -> None:
        if not self.paragraphs:
            raise ValueError(f"corpus {self.name}: no text")
        self.total = sum(len(p) + len(self.sep) for p in self.paragraphs)

    @classmethod
    def build(cls, name: str, text: str, tokenize: Callable[[str], list[int]]) -> TokenizedCorpus:
        paras = [tokenize(p) for p in pieces(text)]
        return cls(name, sha256_text(text), [p for p in paras if p], tokenize("\n\n"))

    def take(self, start_para: int, n_tokens: int) -> list[list[int]]:
        """Whole paragraphs from ``start_para`` on (wrapping), at least ``n_tokens`` tokens with separators; the
        last one cut to fit exactly."""
        out: list[list[int]] = []
        got = 0
        i = start_para % len(self.paragraphs)
        while got < n_tokens:
            p = self.paragraphs[i] + self.sep
            if got + len(p) > n_tokens:
                p = p[: n_tokens - got]
            out.append(p)
            got += len(p)
            i = (i + 1) % len(self.paragraphs)
        return out


@dataclass(frozen=True)
class Trial:
    set: str
    seed: int
    length: int  # the prompt's tokens, BOS included
    index: int
    key: str
    depth: float
    start: float  # where the haystack starts in the corpus, as a fraction of its paragraphs

    @property
    def id(self) -> str:
        return f"{self.set}/{self.seed}/{self.length}/{self.index}"


def trials(set_name: str, seed: int, length: int, n: int, depth: tuple[float, float] = (0.02, 0.98)) -> list[Trial]:
    """The ``n`` trials of one (set, seed, length) cell: each its own key, depth and text (see the module)."""
    out = []
    for i in range(n):
        rng = random.Random(f"{set_name}/{seed}/{length}/{i}")
        key = str(rng.randint(10000, 99999))
        d = rng.uniform(*depth)
        start = rng.random()
        out.append(Trial(set_name, seed, length, i, key, d, start))
    return out


@dataclass(frozen=True)
class Frame:
    """The tokens around the haystack: BOS (if the model adds one) + instruction, and the question."""

    head: list[int]
    question: list[int]

    @classmethod
    def build(cls, tokenize_special: Callable[[str], list[int]], tokenize: Callable[[str], list[int]]) -> Frame:
        return cls(tokenize_special(PREFIX), tokenize(QUESTION))


def prompt_tokens(trial: Trial, corpus: TokenizedCorpus, frame: Frame, needle: list[int]) -> list[int]:
    """The trial's prompt, exactly ``trial.length`` tokens: frame head, haystack with the needle between two
    paragraphs at the trial's depth, question."""
    hay = trial.length - len(frame.head) - len(frame.question) - len(needle)
    if hay < 16:
        raise ValueError(f"trial {trial.id}: length {trial.length} leaves no room for a haystack")
    paras = corpus.take(int(trial.start * len(corpus.paragraphs)), hay)
    # the needle after the paragraph whose end is nearest the depth (never inside a paragraph)
    target = trial.depth * hay
    ends = []
    acc = 0
    for p in paras:
        acc += len(p)
        ends.append(acc)
    cut = min(range(len(ends) + 1), key=lambda j: abs((ends[j - 1] if j else 0) - target))
    toks = list(frame.head)
    for p in paras[:cut]:
        toks += p
    toks += needle
    for p in paras[cut:]:
        toks += p
    toks += frame.question
    assert len(toks) == trial.length, (len(toks), trial.length)
    return toks


def needle_depth(trial: Trial, toks: Sequence[int], needle: Sequence[int]) -> float:
    """Where the needle actually sits: its first token's index over the prompt's length."""
    n = len(needle)
    for i in range(len(toks) - n + 1):
        if list(toks[i:i + n]) == list(needle):
            return i / len(toks)
    raise ValueError(f"trial {trial.id}: needle not found in its own prompt")


@dataclass
class Score:
    k: int = 0
    n: int = 0

    def add(self, ok: bool) -> None:
        self.k += int(ok)
        self.n += 1

    @property
    def interval(self) -> tuple[float, float]:
        return wilson(self.k, self.n)

    def __str__(self) -> str:
        lo, hi = self.interval
        return f"{self.k}/{self.n} [{lo:.2f}, {hi:.2f}]"


def load_text(path: Path, sha256: str | None = None) -> str:
    text = path.read_text(encoding="utf-8")
    if sha256 and sha256_text(text) != sha256:
        raise ValueError(f"{path}: sha256 {sha256_text(text)[:16]}... is not the set's {sha256[:16]}... "
                         "(rebuild it with bench/longctx/corpus.py)")
    return text
