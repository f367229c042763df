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
#: the attention temperature is tried with one chunk size, the candidate nearest L / TEMPERATURE_FRACTION, in the form
#: TEMPERATURE (--dca-yarn-factor len: every query of a sequence scaled from its prompt's length, 1 within L). On the
#: bench's dev set (gemma-3-270m, 2.5x, 5x and 30x L) the dev rule picked 16384 / 2048 `len` (L/2) over the former
#: candidate, 4096 / 512 `pos` (L/8), and over the same sizes without a temperature: 35/50 against 29/50 and 30/50
#: (chosen on dev alone; held-out, reported after the choice: 35/40 at ~3x, 34/40 at ~6x, 5/6 at 1M against 31/40,
#: 25/40 and 1/6 without it; bench/RESULTS.md, eleventh round). One candidate more, not one per size: the sweep of a
#: 270M model stays within ~15 minutes
TEMPERATURE = "len"
TEMPERATURE_FRACTION = 2
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
#: ``far``, the length the user will serve (e.g. 1048576): the sweep's FAR_FINALISTS best candidates by the dev rule
#: also answer DEFAULT_FAR_TRIALS dev trials at FAR_DEV_SHARE x far tokens, the most found there picks (a tie: the dev
#: rule's order), and the pick answers DEFAULT_FAR_HELDOUT_TRIALS held-out trials at far itself (reported only). What a
#: chunk size and a temperature do at 30x L does not show at 2.5x and 5x: on the bench's dev set 16384 / 2048 found
#: 29/40 there with `len` and without it, and 6/10 against 1/10 at 30x (bench/RESULTS.md, tenth and eleventh rounds)
FAR_FINALISTS = 2
FAR_DEV_SHARE = 0.95
DEFAULT_FAR_TRIALS = 6
DEFAULT_FAR_HELDOUT_TRIALS = 3
#: the longest prompt ``far`` may ask for (a 16M-token context is past what any GPU here holds for a small model)
MAX_FAR = 16 * 1024 * 1024
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
    candidates: tuple[str, ...]       # dca:S:W (temperature off), and dca:S:W:len for one S unless turned off
    dev_lengths: tuple[int, ...]
    heldout_lengths: tuple[int, ...]
    dev_trials: int                   # per dev length and candidate
    heldout_trials: int               # per held-out length and method
    ppl_ctx: int | None               # the dev perplexity's context (None: not measured)
    slack: int                        # the rule's slack: 10% of a candidate's dev trials
    estimate_seconds: float
    inside: int                       # the ceiling's prompt length, inside L (INSIDE_SHARE x L)
    far_dev: int | None = None        # the far dev length (FAR_DEV_SHARE x far), None without ``far``
    far_heldout: int | None = None    # the far held-out length (``far`` itself)
    far_trials: int = 0               # per finalist at far_dev
    far_heldout_trials: int = 0       # the pick's at far_heldout

    @property
    def finalists(self) -> int:
        """How many candidates answer the far dev cell (0 without ``far``)."""
        return min(FAR_FINALISTS, len(self.candidates)) if self.far_dev else 0

    @property
    def dev_longest(self) -> int:
        return max((*self.dev_lengths, self.far_dev or 0))

    @property
    def heldout_longest(self) -> int:
        return max((*self.heldout_lengths, self.far_heldout or 0))

    @property
    def ceiling_trials(self) -> tuple[int, int]:
        """Plain attention's trials inside L on the dev and on the held-out text: as many as a candidate gets."""
        return self.dev_trials * len(self.dev_lengths), self.heldout_trials * len(self.heldout_lengths)

    @property
    def total_trials(self) -> int:
        return (len(self.candidates) * len(self.dev_lengths) * self.dev_trials
                + 2 * len(self.heldout_lengths) * self.heldout_trials + sum(self.ceiling_trials)
                + self.finalists * self.far_trials + (self.far_heldout_trials if self.far_heldout else 0))


def plan(info: GgufInfo, *, chunks: Sequence[int] = (), dev_trials: int = DEFAULT_DEV_TRIALS,
         heldout_trials: int = DEFAULT_HELDOUT_TRIALS, max_tokens: int = DEFAULT_MAX_TOKENS,
         perplexity: bool = True, temperature: bool = True, far: int = 0, far_trials: int = DEFAULT_FAR_TRIALS,
         far_heldout_trials: int = DEFAULT_FAR_HELDOUT_TRIALS) -> Plan:
    """The sweep for ``info``'s model (see the module), or the refusal when it cannot go past L. ``far`` (0: none):
    the length the user will serve, measured as FAR_FINALISTS's comment says."""
    L = info.trained
    if dev_trials < 1 or heldout_trials < 1:
        raise CalibrateError(f"the trial counts must be at least 1 (dev {dev_trials}, held-out {heldout_trials})")
    if far and (far_trials < 1 or far_heldout_trials < 1):
        raise CalibrateError(f"the far trial counts must be at least 1 (dev {far_trials}, held-out {far_heldout_trials})")
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
    far_dev = int(FAR_DEV_SHARE * far) if far else None
    if far and (far < 0 or far > MAX_FAR or far_dev is None or far_dev <= max(held)):
        raise CalibrateError(f"--far {far}: the length you will serve must lie past the held-out lengths "
                             f"({', '.join(map(str, held))} tokens, up to 6 L) and at most {MAX_FAR}; its dev cell runs "
                             f"at {FAR_DEV_SHARE:g} x it", where=str(info.path),
                             hint=f"give the context you will serve, e.g. --far 1048576 (more than "
                                  f"{int(max(held) / FAR_DEV_SHARE) + 1}), or leave --far out")
    cands = tuple(longctx.dca_method(s, local_for(s)) for s in sizes)
    if temperature:   # the temperature, with the size nearest L / TEMPERATURE_FRACTION (the smaller on a tie)
        s_t = min(sizes, key=lambda s: (abs(s - L // TEMPERATURE_FRACTION), s))
        cands += (longctx.dca_method(s_t, local_for(s_t)) + ":" + TEMPERATURE,)
    inside = int(INSIDE_SHARE * L)
    n_final = min(FAR_FINALISTS, len(cands)) if far else 0
    tokens = (len(cands) * dev_trials * sum(dev) + 2 * heldout_trials * sum(held)
              + inside * (dev_trials * len(dev) + heldout_trials * len(held))
              + (n_final * far_trials * (far_dev or 0) + far_heldout_trials * far if far else 0))
    servers = len(cands) * len(dev) + 2 * len(held) + 2 + (n_final + 1 if far else 0)
    ppl_ctx = dev[0] if perplexity else None
    est = tokens / 100_000 * SECONDS_PER_100K_TOKENS + servers * SECONDS_PER_SERVER + (len(cands) * SECONDS_PER_PPL if ppl_ctx else 0)
    slack = max(1, round(0.1 * dev_trials * len(dev)))
    return Plan(L, cands, dev, held, dev_trials, heldout_trials, ppl_ctx, slack, round(est), inside,
                far_dev, far or None, far_trials if far else 0, far_heldout_trials if far else 0)


def ceiling_holds(score: longctx.Score) -> bool:
    """Whether plain attention inside L found the key often enough for the text to rank methods past L."""
    return score.n > 0 and score.k >= CEILING_MIN * score.n
