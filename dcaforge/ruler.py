"""RULER-style synthetic long-context tasks: deterministic prompt generators and exact-match scoring.

The tasks follow NVIDIA RULER's definitions (``scripts/data/synthetic``: ``variable_tracking.py``,
``niah.py`` and ``constants.py``), with the "noise" haystack (the repeated sentence below) for every
task, since RULER's essay haystack is a download; llama.cpp's ``llama-passkey`` prompt is added as
``passkey``:

- ``vt`` (variable tracking): one chain of 4 hops, ``VAR ABCDE = 12345`` then ``VAR FGHIJ = VAR ABCDE``
  ..., each line inserted at a random place in the noise; the question asks for every variable that
  holds the value, so the 5 names are the answer. RULER puts one solved example (3-letter names,
  a short haystack) before the question; ``fewshot=False`` leaves it out.
- ``niah_single`` (RULER ``niah_single_1``): one needle ``One of the special magic numbers for
  <adjective-noun> is: <7 digits>.``; the answer is its number.
- ``niah_multikey`` (``niah_multikey_1``): 4 needles with 4 different keys, the question names one.
- ``niah_multivalue`` (``niah_multivalue``): 4 needles with the same key; all 4 numbers are the answer.
- ``passkey``: ``llama-passkey``'s prompt (a 1-50000 key between junk sentences, "What is the pass
  key? The pass key is"); the n samples put the key at depths (i + 0.5) / n of the junk.

Every sample is a pure function of (seed, task, index, number of filler sentences): the keys, values,
names and positions come from ``random.Random("<seed>/<task>/<index>")``, so the same prompt is sent
to every method at a length, and again on every run. The filler count that fills a length is found
with the model's own tokenizer (:func:`fit`). The prompt ends with RULER's answer prefix, so the
model's continuation is the answer.

Scoring (:func:`score`): the fraction of the expected items (names, numbers) that appear in the
completion as whole words, RULER's ``string_match_all`` with word boundaries (``1234`` does not
match inside ``12345``); ``all_found`` is 1 when every item does.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
import string
from collections.abc import Callable
from dataclasses import dataclass

#: RULER's noise haystack sentence (also llama-passkey's junk).
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."

TASKS = ("vt", "niah_single", "niah_multikey", "niah_multivalue", "passkey")

#: RULER's tokens_to_generate per task (passkey: enough for a 5-digit key and a few words).
N_PREDICT = {"vt": 30, "niah_single": 128, "niah_multikey": 128, "niah_multivalue": 128, "passkey": 16}

#: (keys, values per key) of the needle tasks (RULER's num_needle_k, num_needle_v; num_needle_q = 1).
NIAH = {"niah_single": (1, 1), "niah_multikey": (4, 1), "niah_multivalue": (1, 4)}

VT_HOPS = 4
VT_TEMPLATE = ("Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
               "Question: Find all variables that are assigned the value {query} in the text above.")
VT_ANSWER = (" Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables "
             "are assigned the value {query}, they are: ")
NIAH_TEMPLATE = ("Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. "
                 "I will quiz you about the {type_needle_v} afterwards.\n{context}\n"
                 "What are all the special magic {type_needle_v} for {query} mentioned in the provided text?")
NIAH_ANSWER = " The special magic {type_needle_v} for {query} mentioned in the provided text are"
NIAH_NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."
PASSKEY_PREFIX = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
                  "I will quiz you about the important information there.")
PASSKEY_SUFFIX = " What is the pass key? The pass key is"

#: The needle keys are adjective-noun pairs, as RULER's (which draws them from the wonderwords lists).
ADJECTIVES = ("abandoned", "agreeable", "ancient", "angry", "bright", "broken", "calm", "careful", "cheerful", "clever",
              "curious", "damp", "eager", "elegant", "fancy", "fierce", "fragile", "gentle", "giant", "glossy",
              "hollow", "humble", "icy", "jolly", "lazy", "little", "lively", "lucky", "mellow", "misty", "modern",
              "narrow", "noisy", "obedient", "odd", "plain", "polite", "proud", "quiet", "rapid", "rustic", "shiny",
              "silent", "sleepy", "smooth", "steady", "tidy", "wooden")
NOUNS = ("anchor", "apple", "badge", "basket", "beacon", "bicycle", "blanket", "bridge", "bucket", "candle", "canyon",
         "castle", "cloud", "compass", "cottage", "crayon", "desert", "dolphin", "engine", "feather", "forest",
         "garden", "glacier", "harbor", "helmet", "island", "jacket", "kettle", "ladder", "lantern", "meadow",
         "mirror", "needle", "orchard", "pebble", "pencil", "planet", "pocket", "puzzle", "river", "saddle",
         "shovel", "tractor", "trumpet", "tunnel", "violin", "wagon", "whistle")


@dataclass(frozen=True)
class Sample:
    """One prompt: the text before the answer prefix (``question``, what a chat template wraps),
    the answer prefix, and the items a correct answer contains."""

    task: str
    index: int
    n_filler: int
    question: str
    answer_prefix: str
    expected: tuple[str, ...]
    depth: float  # where the (first) needle sits, 0 = start of the haystack, 1 = end

    @property
    def prompt(self) -> str:
        return self.question + self.answer_prefix


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _rng(seed: int, task: str, index: int) -> random.Random:
    return random.Random(f"{seed}/{task}/{index}")


def _names(rng: random.Random, n: int, k: int) -> list[str]:
    """n distinct upper-case names of k letters."""
    out: list[str] = []
    while len(out) < n:
        v = "".join(rng.choices(string.ascii_uppercase, k=k))
        if v not in out:
            out.append(v)
    return out


def _vt_chain(rng: random.Random, hops: int, k: int) -> tuple[list[str], list[str], str]:
    names = _names(rng, hops + 1, k)
    value = str(rng.randint(10000, 99999))
    chain = [f"VAR {names[0]} = {value}"] + [f"VAR {names[j + 1]} = VAR {names[j]} " for j in range(hops)]
    return names, chain, value


def _insert_chain(rng: random.Random, n_filler: int, chain: list[str]) -> tuple[str, float]:
    """RULER's noise insertion for vt: each line of the chain at a random place, in order."""
    sentences = [NOISE] * n_filler
    positions = sorted(rng.sample(range(len(sentences)), len(chain)))
    for j, pos in enumerate(positions):
        sentences.insert(pos + j, chain[j])
    return "\n".join(sentences), positions[0] / max(n_filler, 1)


def _vt(seed: int, index: int, n_filler: int, fewshot: bool) -> Sample:
    rng = _rng(seed, "vt", index)
    prefix = ""
    if fewshot:  # RULER's one solved example: 3-letter names, a short haystack, the answer after the prefix
        names, chain, value = _vt_chain(rng, VT_HOPS, 3)
        context, _ = _insert_chain(rng, 5, chain)
        prefix = (VT_TEMPLATE.format(context=context, query=value)
                  + VT_ANSWER.format(num_v=VT_HOPS + 1, query=value) + " ".join(names) + "\n\n")
    names, chain, value = _vt_chain(rng, VT_HOPS, 5)
    if n_filler < len(chain):
        raise ValueError(f"vt needs at least {len(chain)} filler sentences, got {n_filler}")
    context, depth = _insert_chain(rng, n_filler, chain)
    return Sample("vt", index, n_filler, prefix + VT_TEMPLATE.format(context=context, query=value),
                  VT_ANSWER.format(num_v=VT_HOPS + 1, query=value), tuple(names), depth)


def _niah(task: str, seed: int, index: int, n_filler: int) -> Sample:
    n_keys, n_values = NIAH[task]
    rng = _rng(seed, task, index)
    words = [f"{a}-{n}" for a in ADJECTIVES for n in NOUNS]
    keys: list[str] = []
    values: list[list[str]] = []
    needles: list[str] = []
    for _ in range(n_keys):
        key = rng.choice(words)
        while key in keys:
            key = rng.choice(words)
        keys.append(key)
        values.append([])
        for _ in range(n_values):
            values[-1].append(str(rng.randint(10 ** 6, 10 ** 7 - 1)))
            needles.append(NIAH_NEEDLE.format(type_needle_v="numbers", key=key, value=values[-1][-1]))
    random.Random(seed).shuffle(needles)  # RULER shuffles with a generator seeded by --random_seed
    if n_filler < len(needles):
        raise ValueError(f"{task} needs at least {len(needles)} filler sentences, got {n_filler}")
    sentences = [NOISE] * n_filler
    indexes = sorted(rng.sample(range(n_filler), len(needles)), reverse=True)
    for pos, needle in zip(indexes, needles, strict=True):
        sentences.insert(pos, needle)
    context = "\n".join(sentences)
    query_i = rng.randrange(n_keys)
    query, expected = keys[query_i], tuple(values[query_i])
    template, answer, type_v = NIAH_TEMPLATE, NIAH_ANSWER, "numbers"
    if n_values == 1:  # RULER's singular wording when one value is asked for
        template = template.replace("Some", "A").replace("are all", "is").replace("are", "is")
        answer = answer.replace("are all", "is").replace("are", "is")
        type_v = "number"
    depth = indexes[-1] / n_filler
    return Sample(task, index, n_filler, template.format(type_needle_v=type_v, context=context, query=query),
                  answer.format(type_needle_v=type_v, query=query), expected, depth)


def _passkey(seed: int, index: int, n_filler: int, n_samples: int) -> Sample:
    rng = _rng(seed, "passkey", index)
    key = str(rng.randint(1, 50000))
    if n_filler < 1:
        raise ValueError("passkey needs at least 1 junk sentence")
    pos = min(n_filler - 1, int((index % n_samples + 0.5) * n_filler / n_samples))
    parts = [PASSKEY_PREFIX]
    for i in range(n_filler):
        if i == pos:
            parts.append(f" The pass key is {key}. Remember it. {key} is the pass key.")
        parts.append(" " + NOISE)
    return Sample("passkey", index, n_filler, "".join(parts), PASSKEY_SUFFIX, (key,), pos / n_filler)


def generate(task: str, seed: int, index: int, n_filler: int, *, n_samples: int = 1, fewshot: bool = True) -> Sample:
    """Sample ``index`` of ``task`` with ``n_filler`` noise sentences (deterministic)."""
    if task == "vt":
        return _vt(seed, index, n_filler, fewshot)
    if task in NIAH:
        return _niah(task, seed, index, n_filler)
    if task == "passkey":
        return _passkey(seed, index, n_filler, n_samples)
    raise ValueError(f"unknown task {task!r} (tasks: {', '.join(TASKS)})")


def min_filler(task: str) -> int:
    """The fewest filler sentences a task's sample can hold."""
    if task == "vt":
        return VT_HOPS + 1
    if task in NIAH:
        k, v = NIAH[task]
        return k * v
    return 1


def fit(measure: Callable[[int], int], budget: int, *, probe: int = 1, slack: int = 0,
        max_tries: int = 6) -> tuple[int, int] | None:
    """The largest filler count n whose prompt takes at most ``budget`` tokens, ``measure(n)`` being
    that prompt's token count under the model's tokenizer, and the count; None when even ``probe``
    fillers (the fewest a task holds) do not fit.

    The prompt grows by about the same tokens per filler sentence (the haystack repeats one
    sentence), so two small counts give the slope; the estimate (aimed ``slack`` / 2 below the
    budget) is then checked on the prompt itself and corrected, so a long prompt is counted only a
    few times, and a prompt within ``slack`` tokens of the budget is taken as it is."""
    t0 = measure(probe)
    if t0 > budget:
        return None
    t1 = measure(2 * probe)
    per = max((t1 - t0) / probe, 1e-9)
    best = (probe, t0)
    if t1 <= budget:
        best = (2 * probe, t1)
    n = best[0] + int((budget - slack // 2 - best[1]) / per)
    tried: dict[int, int] = {probe: t0, 2 * probe: t1}
    for _ in range(max_tries):
        if n in tried:
            break
        t = tried[n] = measure(n)
        if t <= budget:
            if n > best[0]:
                best = (n, t)
            if budget - t < max(per, slack):  # one more sentence would not fit, or close enough
                break
            n += max(1, int((budget - t) / per))
        else:
            n -= max(1, math.ceil((t - budget) / per))
            if n <= best[0]:
                break
    return best


_WORD = "A-Za-z0-9"


def found(item: str, text: str) -> bool:
    """``item`` occurs in ``text`` as a whole word (not inside a longer name or number)."""
    return re.search(rf"(?<![{_WORD}]){re.escape(item)}(?![{_WORD}])", text) is not None


def score(expected: tuple[str, ...] | list[str], completion: str) -> tuple[float, bool]:
    """(the fraction of ``expected`` found in ``completion`` as whole words, whether all are)."""
    hits = sum(found(e, completion) for e in expected)
    return hits / len(expected), hits == len(expected)
