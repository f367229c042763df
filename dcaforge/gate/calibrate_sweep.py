"""``dcaforge calibrate``'s measurements: passkey trials through llama-server (a server per method and length, the texts
tokenized once), the dev perplexity through llama-perplexity, the pick and the held-out check beside YaRN."""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dcaforge.errors import CalibrateError, GateError
from dcaforge.gate import longctx
from dcaforge.gate.calibrate_gguf import GgufInfo
from dcaforge.gate.calibrate_plan import DEV_SEED, DEV_SET, HELDOUT_SEED, HELDOUT_SET, Plan
from dcaforge.gate.calibrate_record import PPL_FILE, TRIALS_FILE, Recorded
from dcaforge.gate.calibrate_report import Report
from dcaforge.gate.perplexity import parse_perplexity
from dcaforge.gate.server import HttpError, LlamaServer
from dcaforge.git import run

#: the text tokenized for prompts: this many characters per token of the longest prompt (at least MIN_TEXT_CHARS)
TEXT_CHARS_PER_TOKEN = 6
MIN_TEXT_CHARS = 50_000


class NoRoom(CalibrateError):
    """A prompt length too short for the frame, the needle and a haystack (a tiny L's ceiling)."""


@dataclass(frozen=True)
class Text:
    """A text of the protocol: where it came from (a file, the room's llama.cpp sources, Python's standard library
    source)."""

    name: str
    text: str


@dataclass(frozen=True)
class Servers:
    """What the sweep runs: the model, a llama-server built with 0078-dca, llama-perplexity (None: the dev perplexity
    is not measured), their options beyond the sweep's own, a server's load timeout."""

    model: Path
    server: Path
    perplexity: Path | None
    args: tuple[str, ...]
    load_timeout: float


class Sweep:
    """One calibration: the servers, the tokenized texts (once per text), the trial records."""

    def __init__(self, servers: Servers, info: GgufInfo, work: Path, on_step: Callable[[str], None] | None = None,
                 on_trial: Callable[[dict[str, Any]], None] | None = None, recorded: Recorded | None = None) -> None:
        """``work`` holds this run's record (:func:`dcaforge.gate.calibrate_record.start` wrote it); ``recorded``: an
        earlier run's trials and perplexities to take again (``--resume``)."""
        self.servers, self.info, self.work, self.on_step, self.on_trial = servers, info, work, on_step, on_trial
        self.recorded = recorded or Recorded()
        self.reused = 0       # trials taken from ``recorded``
        self.reused_ppl = 0   # dev perplexities taken from ``recorded``
        self.logs = work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)   # a run's logs are numbered; a later run writes over them
        self.trials_path = work / TRIALS_FILE
        self.corpora: dict[str, longctx.TokenizedCorpus] = {}
        self.corpus_chars: dict[str, int] = {}
        self.frame: longctx.Frame | None = None
        self.n_log = 0

    def step(self, msg: str) -> None:
        if self.on_step:
            self.on_step(msg)

    def log(self, what: str) -> Path:
        self.n_log += 1
        return self.logs / f"{self.n_log:03d}-{re.sub(r'[^A-Za-z0-9._-]+', '_', what)[:60]}.log"

    def corpus(self, srv: LlamaServer, text: Text, longest: int) -> longctx.TokenizedCorpus:
        if text.name not in self.corpora:
            chars = max(MIN_TEXT_CHARS, TEXT_CHARS_PER_TOKEN * longest)
            self.step(f"tokenize {text.name} ({min(chars, len(text.text))} characters)")
            tok = self.tokenizer(srv, special=False)
            self.corpora[text.name] = longctx.TokenizedCorpus.build(text.name, text.text[:chars], tok)
            self.corpus_chars[text.name] = len(text.text[:chars])
        return self.corpora[text.name]

    def tokenize(self, text: Text, longest: int) -> None:
        """``text``'s tokens through a short-lived llama-server (plain, a small context), where no cell has run."""
        args = ["-m", str(self.servers.model.resolve()), "-c", "512", "-np", "1", "--no-warmup", "--cache-ram", "0",
                "--no-webui", *self.servers.args]
        srv = LlamaServer(self.servers.server, args, self.log(f"tokenize-{text.name}"), load_timeout=self.servers.load_timeout)
        try:
            srv.start()
            self.corpus(srv, text, longest)
        except GateError as exc:
            raise CalibrateError(f"tokenizing {text.name}: {exc.message}", where=exc.where, details=exc.details,
                                 hint="read the server's log") from None
        finally:
            srv.stop()

    def chars_per_token(self, name: str) -> float:
        return self.corpus_chars[name] / max(1, self.corpora[name].total)

    @staticmethod
    def tokenizer(srv: LlamaServer, special: bool) -> Callable[[str], list[int]]:
        def tok(s: str) -> list[int]:
            return list(srv.post("/tokenize", {"content": s, "add_special": special, "parse_special": False})["tokens"])
        return tok

    def cell(self, set_name: str, seed: int, method: str, length: int, n: int, text: Text, longest: int) -> longctx.Score:
        """``n`` trials of (set, length) through one llama-server running ``method``."""
        L, arch = self.info.trained, self.info.arch
        todo = longctx.trials(set_name, seed, length, n)
        done = {t.index: self.recorded.trial(set_name, method, length, t.index, t.key) for t in todo}
        score = longctx.Score()
        for t in todo:   # what an earlier run of the same calibration measured (--resume)
            old = done[t.index]
            if old is not None:
                self.reused += 1
                score.add(bool(old["ok"]))
                if self.on_trial:
                    self.on_trial(old)
        todo = [t for t in todo if done[t.index] is None]
        if not todo:
            return score
        ctx = longctx.ctx_for(length)
        args = ["-m", str(self.servers.model.resolve()), "-c", str(ctx), "-np", "1", "--no-warmup", "--cache-ram", "0", "--no-webui",
                *self.servers.args, *longctx.method_args(method, ctx, L, arch)]
        self.step(f"{set_name}: {method} at {length} tokens")
        srv = LlamaServer(self.servers.server, args, self.log(f"{set_name}-{method}-{length}"),
                          load_timeout=self.servers.load_timeout)
        try:
            srv.start()
            corpus = self.corpus(srv, text, longest)
            if self.frame is None:
                self.frame = longctx.Frame.build(self.tokenizer(srv, True), self.tokenizer(srv, False))
            tok = self.tokenizer(srv, False)
            for t in todo:
                needle = tok(longctx.NEEDLE.format(key=t.key))
                try:
                    toks = longctx.prompt_tokens(t, corpus, self.frame, needle)
                except ValueError as exc:   # the frame and the needle fill the length: no haystack fits
                    raise NoRoom(f"{set_name} {method} at {length} tokens: {exc}", where=text.name,
                                 hint="a longer prompt is needed: this model's trained context is too small for "
                                      "this measurement") from None
                t0 = time.monotonic()
                rec: dict[str, Any] = {"set": set_name, "method": method, "length": length, "index": t.index,
                                       "key": t.key, "depth": round(longctx.needle_depth(t, toks, needle), 4)}
                try:
                    answer = str(srv.completion(toks, longctx.N_PREDICT).get("content", ""))
                    rec.update(answer=answer, ok=longctx.passed(t.key, answer))
                except HttpError as exc:   # a request the server refused: a miss, with the reason
                    rec.update(answer="", ok=False, error=str(exc)[:300])
                rec["seconds"] = round(time.monotonic() - t0, 2)
                score.add(bool(rec["ok"]))
                with open(self.trials_path, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(rec, sort_keys=True) + "\n")
                if self.on_trial:
                    self.on_trial(rec)
        except GateError as exc:   # the server did not start, or died: its log says why
            raise CalibrateError(f"{set_name} {method} at {length} tokens: {exc.message}", where=exc.where,
                                 details=exc.details, hint="read the server's log; a context this long may not fit "
                                 "the GPU's memory (lower --max-tokens or --far), or --server-args has an option llama-server "
                                 "does not take; --resume then keeps the trials so far") from None
        finally:
            srv.stop()
        return score

    def recorded_ppl(self, method: str, ctx: int) -> float | None:
        """The earlier run's perplexity of ``method`` at ``ctx`` (--resume), counted; None when it has none."""
        value = self.recorded.ppl.get((method, ctx))
        self.reused_ppl += value is not None
        return value

    def perplexity(self, method: str, ctx: int, text_file: Path) -> float | None:
        assert self.servers.perplexity is not None
        value = self.recorded_ppl(method, ctx)
        if value is not None:
            return value
        argv = [str(self.servers.perplexity.resolve()), "-m", str(self.servers.model.resolve()), "-f", str(text_file.resolve()),
                "-c", str(ctx), "-b", str(min(ctx, 2048)),
                *self.servers.args, *longctx.method_args(method, ctx, self.info.trained)]
        self.step(f"dev perplexity: {method} at {ctx}")
        value = None
        for attempt in range(3):   # llama-perplexity now and then loses its output's tail (perplexity.py says why)
            res = run(argv, self.work, check=False)
            text = res.stdout + res.stderr
            self.log(f"ppl-{method}-{ctx}-{attempt}").write_text(f"$ {' '.join(argv)}\n# exit {res.returncode}\n{text}")
            value = parse_perplexity(text) or last_chunk_perplexity(text)
            if value is not None or res.returncode != 0 or "you need at least" in text:
                break
        if value is not None:
            with open(self.work / PPL_FILE, "a", encoding="utf-8") as fh:
                fh.write(json.dumps({"method": method, "ctx": ctx, "ppl": value}) + "\n")
        return value

    def dev_cells(self, pl: Plan, text: Text) -> dict[str, dict[int, longctx.Score]]:
        """Every candidate at every dev length: candidate -> length -> score."""
        dev: dict[str, dict[int, longctx.Score]] = {}
        for m in pl.candidates:
            for n in pl.dev_lengths:
                dev.setdefault(m, {})[n] = self.cell(DEV_SET, DEV_SEED, m, n, pl.dev_trials, text, pl.dev_longest)
        return dev

    def dev_perplexity(self, pl: Plan, text: Text, notes: list[str]) -> dict[str, float | None]:
        """Each candidate's perplexity of the dev text at the plan's context (None where not measured; ``notes`` say
        why)."""
        ppl: dict[str, float | None] = {m: None for m in pl.candidates}
        if not pl.ppl_ctx:
            return ppl
        if all((m, pl.ppl_ctx) in self.recorded.ppl for m in pl.candidates):   # --resume: all measured, no text needed
            return {m: self.recorded_ppl(m, pl.ppl_ctx) for m in pl.candidates}
        if text.name not in self.corpora:   # every cell was resumed: the text's tokens per character still count
            self.tokenize(text, pl.dev_longest)
        # two windows of the context, in characters at the dev text's own characters per token
        need = int(2.3 * pl.ppl_ctx * self.chars_per_token(text.name)) + 1000
        if len(text.text) < need:
            notes.append(f"the dev text ({len(text.text)} characters) is too short for two windows of {pl.ppl_ctx} "
                         "tokens: the dev perplexity was not measured")
            return ppl
        text_file = self.work / "ppl-dev.txt"
        text_file.write_text(text.text[:need], encoding="utf-8")
        for m in pl.candidates:
            ppl[m] = self.perplexity(m, pl.ppl_ctx, text_file)
        if all(v is None for v in ppl.values()):
            notes.append("llama-perplexity gave no result (see the logs): the pick used the answers alone")
        return ppl

    def ceiling(self, pl: Plan, which: str, text: Text, notes: list[str]) -> longctx.Score | None:
        """Plain attention inside L (``pl.inside`` tokens) on the dev or the held-out text: whether that text can rank
        methods past L for this model (:func:`dcaforge.gate.calibrate_plan.ceiling_holds`). None, with a note, where
        L is too small for a prompt inside it to hold the question, the needle and some text."""
        set_name, seed = (DEV_SET, DEV_SEED) if which == "dev" else (HELDOUT_SET, HELDOUT_SEED)
        n = pl.ceiling_trials[0 if which == "dev" else 1]
        longest = pl.dev_longest if which == "dev" else pl.heldout_longest
        try:
            return self.cell(set_name, seed, "plain", pl.inside, n, text, longest)
        except NoRoom:
            notes.append(f"the {which} text's ceiling was not measured: a prompt inside L ({pl.inside} tokens) has no "
                         "room for text beside the question and the needle")
            return None

    def heldout_cells(self, pl: Plan, pick: str, text: Text) -> dict[str, dict[int, longctx.Score]]:
        """The pick beside YaRN at every held-out length (reported only): method -> length -> score."""
        heldout: dict[str, dict[int, longctx.Score]] = {pick: {}, "yarn": {}}
        for m in (pick, "yarn"):
            for n in pl.heldout_lengths:
                heldout[m][n] = self.cell(HELDOUT_SET, HELDOUT_SEED, m, n, pl.heldout_trials, text, pl.heldout_longest)
        return heldout

    def far_cells(self, pl: Plan, finalists: list[str], text: Text) -> dict[str, longctx.Score]:
        """The finalists at the far dev length (the same trials for each): finalist -> score."""
        assert pl.far_dev is not None
        return {m: self.cell(DEV_SET, DEV_SEED, m, pl.far_dev, pl.far_trials, text, pl.dev_longest) for m in finalists}

    def far_heldout_cell(self, pl: Plan, pick: str, text: Text) -> longctx.Score:
        """The pick at the far held-out length (reported only)."""
        assert pl.far_heldout is not None
        return self.cell(HELDOUT_SET, HELDOUT_SEED, pick, pl.far_heldout, pl.far_heldout_trials, text, pl.heldout_longest)


def pick(pl: Plan, dev: dict[str, dict[int, longctx.Score]], ppl: dict[str, float | None],
         answers_rank: bool = True) -> longctx.Choice:
    """The bench's rule (:func:`dcaforge.gate.longctx.choose`) over the dev sweep. ``answers_rank`` False (the dev
    text failed its ceiling): every candidate counts as near the best (a slack of a candidate's whole dev trials), so
    the lowest dev perplexity picks, then the larger S."""
    slack = pl.slack if answers_rank else pl.dev_trials * len(pl.dev_lengths)
    return longctx.choose({m: Report.total(by) for m, by in dev.items()},
                          {m: [v] for m, v in ppl.items() if v is not None}, list(pl.candidates), slack=slack)


def ranked(choice: longctx.Choice, candidates: list[str], n: int) -> list[str]:
    """The dev rule's first ``n`` in order: its pick, then its pick among the rest, and so on (the same slack and
    perplexities; candidates without trials last)."""
    order, rest = [choice.pick], [m for m in candidates if m != choice.pick]
    while rest and len(order) < n:
        scored = [m for m in rest if choice.scores.get(m, longctx.Score()).n]
        if not scored:
            break
        nxt = longctx.choose(choice.scores, {m: [v] for m, v in choice.ppl.items() if v is not None}, scored,
                             slack=choice.slack).pick
        order.append(nxt)
        rest.remove(nxt)
    return order


def far_pick(choice: longctx.Choice, finalists: list[str], far: dict[str, longctx.Score], far_len: int) -> longctx.Choice:
    """The pick with a far dev cell: the finalist that found the key most often at ``far_len`` tokens; on a tie the
    first in the dev rule's order (``finalists`` is that order). ``choice`` is the dev rule's over the shorter cells."""
    best = max(far[m].k for m in finalists)
    pick = next(m for m in finalists if far[m].k == best)
    why = f"{choice.why}; at {far_len} tokens " + ", ".join(f"{m} {far[m].k}/{far[m].n}" for m in finalists)
    return dataclasses.replace(choice, pick=pick, why=why)


def last_chunk_perplexity(text: str) -> float | None:
    """The last running estimate ``[N]value`` of llama-perplexity: the final one when every chunk was printed but
    the "Final estimate" line was lost."""
    vals = re.findall(r"\[(\d+)\]([0-9]+\.[0-9]+)", text)
    return float(vals[-1][1]) if vals else None
