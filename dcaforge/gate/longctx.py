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

What the bench (bench/longctx/run.py) and ``dcaforge calibrate`` (dcaforge/gate/calibrate.py) share lives here too: the
methods and their llama.cpp flags (:func:`method_args`), the selection rule (:func:`choose`) and the two texts
(:func:`dev_text`, :func:`heldout_text`). Standard library only: the bench runs where only python3 and PyYAML are.
"""

from __future__ import annotations

import ast
import hashlib
import math
import random
import re
import sysconfig
from collections.abc import Callable, Iterable, Mapping, Sequence
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


# --- methods: what a trial's server runs ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Method:
    """A method as the bench and calibrate name it: ``plain``; ``yarn`` (factor = context / trained); ``dca`` (``--dca
    on`` and nothing else: the build's or the GGUF's own sizes); ``dca:S:W`` (chunk S, local window W, temperature
    off); ``dca:S:W:F`` (and ``--dca-yarn-factor F``: ``auto``, ``pos``, ``chunk``, ``len`` or a number >= 0); ``se:G:W`` (Self-Extend, the
    baseline: group size G, neighbour window W) and ``se:W`` (G the smallest that keeps every distance within the
    trained context, :func:`se_group`)."""

    name: str
    kind: str          # plain | yarn | dca | se
    chunk: int = 0     # 0: the build's choice (``dca``); se: the group size G (0: se_group)
    local: int = 0
    factor: str = "0"


def _factor_ok(f: str) -> bool:
    """--dca-yarn-factor's values: auto, pos, chunk, len, or a number >= 0 (0: off)."""
    if f in ("auto", "pos", "chunk", "len"):
        return True
    try:
        return math.isfinite(float(f)) and float(f) >= 0 and f.strip() == f
    except ValueError:
        return False


def parse_method(method: str) -> Method:
    if method in ("plain", "yarn", "dca"):
        return Method(method, method)
    parts = method.split(":")
    if parts[0] == "se" and len(parts) in (2, 3) and all(x.isdigit() and int(x) > 0 for x in parts[1:]) \
            and (len(parts) == 2 or int(parts[1]) >= 2):
        return Method(method, "se", int(parts[1]) if len(parts) == 3 else 0, int(parts[-1]))
    if parts[0] != "dca" or len(parts) not in (3, 4) or not all(x.isdigit() and int(x) > 0 for x in parts[1:3]) \
            or (len(parts) == 4 and not _factor_ok(parts[3])):
        raise ValueError(f"unknown method {method!r} (plain, yarn, dca, dca:S:W, dca:S:W:F with F auto, pos, chunk, len or a number >= 0, "
                         "se:W, se:G:W with G >= 2)")
    return Method(method, "dca", int(parts[1]), int(parts[2]), parts[3] if len(parts) == 4 else "0")


def dca_method(chunk: int, local: int) -> str:
    """The name of DCA at chunk ``chunk`` and local window ``local``, temperature off."""
    return f"dca:{chunk}:{local}"


def se_group(ctx: int, trained: int, window: int) -> int:
    """Self-Extend's group size for a context of ``ctx`` tokens: the smallest G >= 2 with which a query's farthest key,
    at (ctx - 1 - W)/G + W, stays within the trained context (the rule of the Self-Extend paper)."""
    if window >= trained - 1:
        raise ValueError(f"se: the neighbour window {window} must be below the trained context {trained} - 1")
    return max(2, -(-(ctx - 1 - window) // (trained - 1 - window)))


def method_args(method: str, ctx: int, trained: int, arch: str = "") -> list[str]:
    """llama.cpp's flags of a method at context ``ctx`` for a model trained at ``trained`` tokens. llama-server caps a
    slot at the trained length: past it, plain and YaRN are told the length is ``ctx`` (``--override-kv
    <arch>.context_length``, when ``arch`` is given); DCA reads its L from the GGUF as written, so the override would
    not move its sizes, and ``--dca on`` lifts the cap itself."""
    m = parse_method(method)
    over = ["--override-kv", f"{arch}.context_length=int:{ctx}"] if arch and ctx > trained else []
    if m.kind == "plain":
        return over
    if m.kind == "yarn":
        f = max(1.0, ctx / trained)
        return ["--rope-scaling", "yarn", "--rope-scale", f"{f:.4g}", "--yarn-orig-ctx", str(trained), *over]
    if m.kind == "se":
        g = m.chunk or se_group(ctx, trained, m.local)
        return ["--dca", "on", "--dca-self-extend", str(g), "--dca-local-size", str(m.local)]
    if not m.chunk:
        return ["--dca", "on"]
    return ["--dca", "on", "--dca-chunk-size", str(m.chunk), "--dca-local-size", str(m.local), "--dca-yarn-factor", m.factor]


def ctx_for(length: int) -> int:
    """The server context of a prompt of ``length`` tokens: room for the answer, rounded up to 256."""
    return int(math.ceil((length + N_PREDICT + 8) / 256) * 256)


# --- the selection rule -----------------------------------------------------------------------------------------------

#: the bench's slack (sets.yaml's protocol, written down before any run): 2 answers, 10% of a 20-trial cell
SLACK = 2


@dataclass(frozen=True)
class Choice:
    pick: str
    why: str                      # every method's k/n (and mean perplexity), in the order given
    near: tuple[str, ...]         # the methods within ``slack`` answers of the best, the pick among them
    slack: int
    scores: dict[str, Score]
    ppl: dict[str, float | None]  # the mean dev perplexity, None when not measured


def choose(scores: Mapping[str, Score], ppl: Mapping[str, Sequence[float]], methods: Sequence[str],
           slack: int = SLACK) -> Choice:
    """The dev set's choice among ``methods``: the most exact answers (``scores``: over every dev cell); among those
    within ``slack`` of the best, the lowest mean dev perplexity (a method without one counts as infinite); then the
    larger chunk S. A method without trials is never chosen; ValueError when none has any."""
    sc = {m: scores.get(m, Score()) for m in methods}
    if not any(s.n for s in sc.values()):
        raise ValueError(f"choose: no trials of {', '.join(methods)}")
    mean = {m: (sum(ppl[m]) / len(ppl[m]) if ppl.get(m) else None) for m in methods}
    best = max(s.k for s in sc.values() if s.n)
    near = [m for m in methods if sc[m].n and sc[m].k >= best - slack]

    def key(m: str) -> tuple[float, int]:
        v = mean[m]
        return (v if v is not None else float("inf"), -parse_method(m).chunk)

    pick = min(near, key=key)
    why = ", ".join(f"{m} {sc[m].k}/{sc[m].n}" + (f" ppl {mean[m]:.4f}" if mean[m] is not None else "") for m in methods)
    return Choice(pick, why, tuple(near), slack, sc, mean)


# --- the two texts ------------------------------------------------------------------------------------------------------

def dev_text(tree: Path) -> str:
    """The dev text: C++ and C source of a llama.cpp tree (``src/*.cpp`` but the feature's own ``llama-dca*.cpp``,
    which change with the templates, then ``ggml/src/*.c``, sorted by name), joined by blank lines. ValueError when
    the tree has none."""
    files = [f for f in sorted((tree / "src").glob("*.cpp")) if not f.name.startswith("llama-dca")]
    files += sorted((tree / "ggml" / "src").glob("*.c"))
    if not files:
        raise ValueError(f"{tree}: no src/*.cpp (not a llama.cpp tree)")
    return "\n\n".join(f.read_text(encoding="utf-8", errors="replace") for f in files)


# the needle's and the question's own words: a paragraph that uses them answers "What is the pass key?" for a small
# model ("used to pass the value to the ..."; heldout of 2026-12-06: gemma-3-270m 2/20 inside its trained window)
NEEDLE_WORDS = re.compile(r"\b(pass|key|remember|important|info|hidden|memorize)", re.IGNORECASE)


def needle_free(text: str) -> str:
    """``text`` without the paragraphs (blank-line separated) that use a word of the needle or the question
    (:data:`NEEDLE_WORDS`, as a word start: "passed", "keys", "keyword" too), so that the haystack cannot answer for
    the needle."""
    return "\n\n".join(p for p in re.split(r"\n\s*\n", text) if p.strip() and not NEEDLE_WORDS.search(p))


#: the code held-out text's length: enough for a 1M-token prompt of these tokenizers (~3.5 characters a token of code)
CODE_TEXT_CHARS = 4_000_000


def code_heldout_text(limit: int = CODE_TEXT_CHARS) -> str:
    """A held-out text of source code that is not llama.cpp's: this Python's standard library as Python source
    (``Lib/*.py`` then ``Lib/*/*.py``, sorted, without the ``test``, ``idlelib``, ``lib2to3`` and ``site-packages``
    folders), each file once, joined by blank lines, then :func:`needle_free`, at most ``limit`` characters (whole
    paragraphs). Code, the one genre these small models can be searched in inside their window (the dev text is
    code; Python's documentation failed the ceiling twice, 2026-12-06), but other code than the dev text's. The
    bench pins Python 3.11's (bench/longctx/corpus.py); another Python gives another text."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "idlelib", "lib2to3", "site-packages", "tkinter", "turtledemo", "ensurepip"}
    files = sorted(lib.glob("*.py")) + sorted(f for f in lib.glob("*/*.py") if f.parent.name not in skip)
    parts: list[str] = []
    for f in files:
        try:
            parts.append(f.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, OSError):
            continue
    return capped_paragraphs(needle_free("\n\n".join(parts)).split("\n\n"), limit)


def capped_paragraphs(paras: Iterable[str], limit: int) -> str:
    """The paragraphs joined by blank lines, up to the first that would take the text past ``limit`` characters (whole
    paragraphs only; reads ``paras`` no further than that)."""
    out: list[str] = []
    size = 0
    for para in paras:
        if size + len(para) + 2 > limit:
            break
        out.append(para)
        size += len(para) + 2
    return "\n\n".join(out)


def heldout_text() -> str:
    """The held-out text: English prose, this Python's own documentation: ``pydoc_data.topics`` (the language
    reference, as ``help()`` shows it), then every module, class and function docstring over 200 characters of the
    standard library's pure-Python modules (``Lib/*.py``, ``Lib/*/__init__.py``, sorted), each once. The bench pins
    Python 3.11's (bench/longctx/corpus.py checks the version); another Python gives another text."""
    import pydoc_data.topics as topics

    parts = [topics.topics[k] for k in sorted(topics.topics)]
    lib = Path(sysconfig.get_paths()["stdlib"])
    seen: set[str] = set()
    mods = sorted(p for p in lib.glob("*.py")) + sorted(lib.glob("*/__init__.py"))
    for f in mods:
        try:
            tree = ast.parse(f.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 200 and doc not in seen:
                    seen.add(doc)
                    parts.append(doc)
    return "\n\n".join(parts)
