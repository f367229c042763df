"""``dcaforge calibrate``'s plan: the chunk sizes tried (:func:`candidate_chunks`), the dev and held-out lengths, the
trial counts and the time estimate (:func:`plan`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dcaforge.errors import CalibrateError
from dcaforge.gate import longctx
from dcaforge.gate.calibrate_gguf import GgufInfo

#: the chunk sizes tried: these fractions of L, clamped to [MIN_CHUNK, MAX_CHUNK] (for L < 4096: [L/8, L/2])
FRACTIONS = (16, 8, 4, 2)
MIN_CHUNK = 512
MAX_CHUNK = 262144
#: the local window of a chunk size S: S / LOCAL_DIV
LOCAL_DIV = 8
#: the attention temperature by position (--dca-yarn-factor pos) is tried with one chunk size, the candidate nearest
#: L / TEMPERATURE_FRACTION: on the bench's dev set (gemma-3-270m at 5x L) it lifted short chunks' retrieval (4096 / 512:
#: 7/20 without, 13/20 with the temperature) where the longest chunks needed none (bench/RESULTS.md, fourth round). One
#: candidate more, not one per size: the sweep of a 270M model stays within ~15 minutes
TEMPERATURE_FRACTION = 8
#: prompt lengths as multiples of L: dev and held-out never share one. Under the cap (max_tokens) each is at most
#: L + share x (cap - L), so that capped lengths stay past L, apart, and dev below held-out
DEV_MULTS = (2.5, 5.0)
HELDOUT_MULTS = (3.0, 6.0)
DEV_CAP_SHARE = (0.42, 0.83)
HELDOUT_CAP_SHARE = (0.5, 1.0)
#: the trial sets' seeds (and names): their own, apart from the bench's (bench/longctx/sets.yaml)
DEV_SET, DEV_SEED = "calibrate-dev", 20261207
HELDOUT_SET, HELDOUT_SEED = "calibrate-heldout", 5550123
DEFAULT_DEV_TRIALS = 10           # per dev length: 20 per candidate
DEFAULT_HELDOUT_TRIALS = 10       # per held-out length: 20 for the pick, 20 for YaRN
DEFAULT_MAX_TOKENS = 262144
#: the ceiling (bench/longctx/sets.yaml's ceiling_min, 16 of 20): before a text ranks settings past L, plain attention
#: must find the key in at least this share of trials inside L (prompts of INSIDE_SHARE x L). A text a model cannot be
#: searched in inside its own window (held-out prose for gemma-3-270m: 2/20 and 4/20, 2026-12-06) says nothing about
#: a method that extends the window.
CEILING_MIN = 0.8
INSIDE_SHARE = 0.9
#: the plan's time estimate: prompt processing on one H100/H200 for a model of ~300M parameters, and a server start
SECONDS_PER_100K_TOKENS = 3.0
SECONDS_PER_SERVER = 8.0
SECONDS_PER_PPL = 25.0


def candidate_chunks(trained: int, explicit: Sequence[int] = (), own: int | None = None) -> list[int]:
    """The chunk sizes of the sweep: ``explicit`` when given, else L/16, L/8, L/4, L/2 clamped to
    [min(MIN_CHUNK, L/8), min(MAX_CHUNK, L)]; plus the GGUF's own chunk size when it fits L. Sorted, each once."""
    if explicit:
        chunks = {int(s) for s in explicit}
    else:
        lo, hi = min(MIN_CHUNK, trained // 8), min(MAX_CHUNK, trained)
        chunks = {max(lo, min(hi, trained // f)) for f in FRACTIONS}
    if own is not None and own <= trained:
        chunks.add(own)
    return sorted(s for s in chunks if s > 0)


def local_for(chunk: int) -> int:
    return max(1, chunk // LOCAL_DIV)


@dataclass(frozen=True)
class Plan:
    trained: int
    candidates: tuple[str, ...]       # dca:S:W (temperature off), and dca:S:W:pos for one S unless turned off
    dev_lengths: tuple[int, ...]
    heldout_lengths: tuple[int, ...]
    dev_trials: int                   # per dev length and candidate
    heldout_trials: int               # per held-out length and method
    ppl_ctx: int | None               # the dev perplexity's context (None: not measured)
    slack: int                        # the rule's slack: 10% of a candidate's dev trials
    estimate_seconds: float
    inside: int                       # the ceiling's prompt length, inside L (INSIDE_SHARE x L)

    @property
    def ceiling_trials(self) -> tuple[int, int]:
        """Plain attention's trials inside L on the dev and on the held-out text: as many as a candidate gets."""
        return self.dev_trials * len(self.dev_lengths), self.heldout_trials * len(self.heldout_lengths)

    @property
    def total_trials(self) -> int:
        return (len(self.candidates) * len(self.dev_lengths) * self.dev_trials
                + 2 * len(self.heldout_lengths) * self.heldout_trials + sum(self.ceiling_trials))


def plan(info: GgufInfo, *, chunks: Sequence[int] = (), dev_trials: int = DEFAULT_DEV_TRIALS,
         heldout_trials: int = DEFAULT_HELDOUT_TRIALS, max_tokens: int = DEFAULT_MAX_TOKENS,
         perplexity: bool = True, temperature: bool = True) -> Plan:
    """The sweep for ``info``'s model (see the module), or the refusal when it cannot go past L."""
    L = info.trained
    if dev_trials < 1 or heldout_trials < 1:
        raise CalibrateError(f"the trial counts must be at least 1 (dev {dev_trials}, held-out {heldout_trials})")
    for s in chunks:
        if s <= 2 * LOCAL_DIV or s > L:
            raise CalibrateError(f"chunk size {s} is outside (16, L = {L}] ({info.trained_key})",
                                 hint=f"give chunk sizes between 17 and {L}, e.g. --chunks {max(17, L // 8)},{max(17, L // 2)}")
    sizes = candidate_chunks(L, chunks, info.chunk)
    if not sizes or sizes[-1] <= 2 * LOCAL_DIV:
        raise CalibrateError(f"the trained context L = {L} ({info.trained_key}) is too small for DCA", where=str(info.path))
    if max_tokens < 2 * L:
        raise CalibrateError(f"--max-tokens {max_tokens} leaves no room past the trained context L = {L} "
                             f"({info.trained_key}): calibration measures prompts past L, up to 6 L",
                             where=str(info.path), hint=f"raise --max-tokens to at least {2 * L} ({6 * L} measures "
                                                        "every length)")

    def lengths(mults: Sequence[float], shares: Sequence[float]) -> tuple[int, ...]:
        return tuple(sorted({int(min(m * L, L + s * (max_tokens - L))) for m, s in zip(mults, shares, strict=True)}))

    dev, held = lengths(DEV_MULTS, DEV_CAP_SHARE), lengths(HELDOUT_MULTS, HELDOUT_CAP_SHARE)
    cands = tuple(longctx.dca_method(s, local_for(s)) for s in sizes)
    if temperature:   # the temperature by position, with the size nearest L / TEMPERATURE_FRACTION (the smaller on a tie)
        s_t = min(sizes, key=lambda s: (abs(s - L // TEMPERATURE_FRACTION), s))
        cands += (longctx.dca_method(s_t, local_for(s_t)) + ":pos",)
    inside = int(INSIDE_SHARE * L)
    tokens = (len(cands) * dev_trials * sum(dev) + 2 * heldout_trials * sum(held)
              + inside * (dev_trials * len(dev) + heldout_trials * len(held)))
    servers = len(cands) * len(dev) + 2 * len(held) + 2
    ppl_ctx = dev[0] if perplexity else None
    est = tokens / 100_000 * SECONDS_PER_100K_TOKENS + servers * SECONDS_PER_SERVER + (len(cands) * SECONDS_PER_PPL if ppl_ctx else 0)
    slack = max(1, round(0.1 * dev_trials * len(dev)))
    return Plan(L, cands, dev, held, dev_trials, heldout_trials, ppl_ctx, slack, round(est), inside)


def ceiling_holds(score: longctx.Score) -> bool:
    """Whether plain attention inside L found the key often enough for the text to rank methods past L."""
    return score.n > 0 and score.k >= CEILING_MIN * score.n
