"""``dcaforge calibrate MODEL.gguf``: DCA's sizes measured on the user's own model, written into a copy of its GGUF so
that ``--dca on`` alone uses them.

1. **Checks first** (nothing is run before they pass; the input is only ever read): the file is a GGUF that reads
   whole (:func:`inspect_gguf`), its architecture is one 0078 serves (:data:`SUPPORTED_ARCHS`, as
   ``llama_dca_arch_supported``) and its attention is one DCA's regimes reproduce (no ALiBi, attention sinks, MLA or
   KQ bias: the keys and tensor names ``llama_dca_unsupported_attn`` reads), the output is a new path (``force`` to
   replace one; never the input), and the llama-server given knows ``--dca``.
2. **Dev sweep** (:func:`plan`): chunk sizes S in {L/16, L/8, L/4, L/2} (at least 512, at most 262144 and L; the
   GGUF's own sizes too, when it has some), local window w = S/8, attention temperature off, and the size nearest L/2
   with the temperature from the prompt's length (``--dca-yarn-factor len``; ``temperature=False`` leaves it out);
   passkey trials (dcaforge/gate/longctx.py: a fresh random key and depth per trial, a token-exact prompt in real text,
   strict scoring) at ~2.5x and ~5x L of the dev text, and, when llama-perplexity is there, the dev text's perplexity
   at ~2.5x L.
3. **Pick** with the rule the bench uses (:func:`dcaforge.gate.longctx.choose`): the most exact answers; among those
   within 10% of the trials of the best, the lowest dev perplexity; then the larger S. First, the dev text's
   **ceiling**: plain attention inside L (0.9 L) must find the key in 80% of as many trials as a candidate gets
   (bench/longctx/sets.yaml's ceiling_min); below it the answers cannot rank settings, the pick is the lowest dev
   perplexity (then the larger S), and a note says so. With ``far`` (the length the user will serve, e.g. 1048576):
   the rule's two best also answer dev trials at 0.95 x far, and the one that found the key more often there is the
   pick (a tie: the rule's order); what a setting does at 30x L does not show at 5x (calibrate_plan.FAR_FINALISTS).
4. **Held-out check**: its text's ceiling the same way, then, only if it holds, the pick beside YaRN at ~3x and ~6x
   L of another text (its own seed, keys, depths and lengths), and with ``far`` the pick alone at far tokens. It is
   reported, never used to choose; a failed ceiling makes the verdict "cannot judge" instead of a comparison that
   means nothing.
5. **Write** a copy of the GGUF with ``<arch>.attention.dual_chunk.chunk_size`` and ``.local_size`` (uint32) and
   ``.temperature`` (``len`` or ``off``, which 0078 reads when ``--dca-yarn-factor`` is left at its default) set,
   every other key and every tensor as they were (:func:`write_dca_copy`, checked by reading the copy back), through
   a temporary file, so an interrupted run leaves no half-written output.

L is the context 0078 derives DCA's sizes from: ``<arch>.attention.dual_chunk.original_context_length``, else
``<arch>.rope.scaling.original_context_length``, else ``<arch>.context_length`` (``llama_dca_resolve``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dcaforge.config import Config
from dcaforge.errors import CalibrateError
from dcaforge.gate import calibrate_record as record
from dcaforge.gate import longctx
from dcaforge.gate.calibrate_gguf import TEMPERATURES, GgufInfo, inspect_gguf, write_dca_copy
from dcaforge.gate.calibrate_plan import (
    CEILING_MIN,
    DEFAULT_DEV_TRIALS,
    DEFAULT_FAR_HELDOUT_TRIALS,
    DEFAULT_FAR_TRIALS,
    DEFAULT_HELDOUT_TRIALS,
    DEFAULT_MAX_TOKENS,
    Plan,
    ceiling_holds,
    plan,
)
from dcaforge.gate.calibrate_report import Report
from dcaforge.gate.calibrate_sweep import Servers, Sweep, Text, far_pick, pick, ranked
from dcaforge.git import run
from dcaforge.room.cleanroom import Room

#: llama-server's and llama-perplexity's options beyond the sweep's own (``--server-args``)
DEFAULT_SERVER_ARGS = ("-ngl", "99", "-fa", "on")


@dataclass(frozen=True)
class Options:
    model: Path
    server: Path                       # a llama-server built with 0078-dca
    dev: Text
    heldout: Text
    out: Path | None = None            # default: <model dir>/<stem>.dca.gguf
    force: bool = False                # replace an existing output
    perplexity: Path | None = None     # llama-perplexity, for the dev perplexity (None: not measured)
    chunks: tuple[int, ...] = ()       # the candidates' chunk sizes (default: candidate_chunks)
    temperature: bool = True           # also try the temperature from the prompt's length (one candidate: calibrate_plan)
    far: int = 0                       # the length the user will serve (0: none): a far dev cell decides between two
    far_trials: int = DEFAULT_FAR_TRIALS
    far_heldout_trials: int = DEFAULT_FAR_HELDOUT_TRIALS
    resume: bool = False               # take again what an earlier run of the same calibration measured (its work folder)
    dev_trials: int = DEFAULT_DEV_TRIALS
    heldout_trials: int = DEFAULT_HELDOUT_TRIALS
    max_tokens: int = DEFAULT_MAX_TOKENS
    server_args: tuple[str, ...] = DEFAULT_SERVER_ARGS
    work: Path | None = None           # logs, trials, report, figure; default <out without .gguf>.calibrate/
    load_timeout: float = 600.0
    server_from: str = "--server"      # where ``server`` came from, for messages


@dataclass
class Hooks:
    on_plan: Callable[[Plan], None] | None = None
    on_step: Callable[[str], None] | None = None
    on_trial: Callable[[dict[str, Any]], None] | None = None   # each trial's record, as it is scored


def default_out(model: Path) -> Path:
    return model.with_name((model.name[:-5] if model.name.endswith(".gguf") else model.name) + ".dca.gguf")


def default_work(out: Path) -> Path:
    return out.with_name((out.name[:-5] if out.name.endswith(".gguf") else out.name) + ".calibrate")


def check_output(model: Path, out: Path, force: bool) -> None:
    """The output must be a new file (``force``: or a file to replace), never the input, in a folder that exists."""
    same = out.resolve() == model.resolve() or (out.exists() and model.exists() and os.path.samefile(out, model))
    if same:
        raise CalibrateError(f"the output {out} is the input model", where=str(out),
                             hint="give another output path with -o (the input is never changed)")
    if out.is_dir():
        raise CalibrateError(f"the output {out} is a folder", where=str(out), hint="give a file path with -o")
    if out.exists() and not force:
        raise CalibrateError(f"the output {out} exists", where=str(out),
                             hint="pass --force to replace it, or give another path with -o")
    if not out.parent.is_dir():
        raise CalibrateError(f"the output's folder {out.parent} does not exist", where=str(out),
                             hint="create it, or give another path with -o")


def check_server(exe: Path, source: str) -> None:
    """``exe`` must be a llama-server that knows ``--dca`` (built with 0078-dca)."""
    hint = ('`dcaforge build --targets "llama-server llama-perplexity"` (the clean room\'s build), or pass --server '
            'PATH to a llama-server built with 0078-dca')
    if not exe.is_file() or not os.access(exe, os.X_OK):
        raise CalibrateError(f"no llama-server at {exe} ({source})", where=str(exe), hint=hint)
    res = run([exe, "--help"], exe.parent, check=False)
    text = res.stdout + res.stderr
    if "--dca" not in text:
        raise CalibrateError(f"{exe} does not know --dca: it was not built with 0078-dca", where=str(exe),
                             details="\n".join(text.strip().splitlines()[-5:]), hint=hint)


def room_server(cfg: Config) -> tuple[Path, Path]:
    """(llama-server, llama-perplexity) of the clean room's build (``dcaforge build``); they may not exist."""
    bin_dir = Room.of(cfg).path / cfg.build.cmake.dir / "bin"
    return bin_dir / "llama-server", bin_dir / "llama-perplexity"


def room_dev_text(cfg: Config) -> Text:
    """The dev text from the clean room's llama.cpp sources (:func:`dcaforge.gate.longctx.dev_text`)."""
    room = Room.of(cfg)
    tree = room.path / cfg.llama_cpp_dir
    if not room.exists():
        raise CalibrateError(f"no clean room at {room.path} to take the dev text from (its llama.cpp sources)",
                             where=cfg.describe(), hint="`dcaforge apply`, or pass --dev-text FILE (any long text)")
    try:
        return Text(f"llama.cpp sources of {tree}", longctx.dev_text(tree))
    except ValueError as exc:
        raise CalibrateError(str(exc), where=str(tree), hint="pass --dev-text FILE (any long text)") from None


def python_source_text() -> Text:
    """The held-out text: this Python's standard library as source code, needle-free
    (:func:`dcaforge.gate.longctx.code_heldout_text`). Code other than the dev text's: small models cannot be searched
    in prose even inside their window (Python's documentation, 2026-12-06: gemma-3-270m 2/20 and 4/20, SmolLM2 9/20
    and 15/20 with plain attention), and could in this text (SmolLM2 18/20 on the CPU, bench/RESULTS.md)."""
    import sys

    return Text(f"Python {sys.version.split()[0]} standard library source", longctx.code_heldout_text())


def file_text(path: Path, what: str) -> Text:
    try:
        return Text(str(path), path.read_text(encoding="utf-8", errors="replace"))
    except OSError as exc:
        raise CalibrateError(f"the {what} {path} cannot be read: {exc.strerror}", where=str(path)) from None



def preflight(model: Path, out: Path | None, force: bool, server: Path, server_from: str = "--server",
              work: Path | None = None) -> tuple[GgufInfo, Path, Path]:
    """The checks that need no text (the model, the output, the work folder, the server), before anything runs:
    (what the model is, the output, the work folder)."""
    info = inspect_gguf(model)
    out = out or default_out(model)
    check_output(model, out, force)
    work = work or default_work(out)
    if work.exists() and not work.is_dir():
        raise CalibrateError(f"the work folder {work} is a file", where=str(work), hint="give another with --work")
    check_server(server, server_from)
    return info, out, work


def check_texts(dev: Text, heldout: Text) -> None:
    """Both texts long enough, and not the same text."""
    for t in (dev, heldout):
        if len(t.text.strip()) < 1000:
            raise CalibrateError(f"the text {t.name} is too short ({len(t.text)} characters; give at least 1000)",
                                 where=t.name)
    if longctx.sha256_text(dev.text) == longctx.sha256_text(heldout.text):
        raise CalibrateError("the dev and held-out texts are the same: the held-out check must use another text",
                             where=heldout.name, hint="give another --heldout-text")


def calibrate(opts: Options, hooks: Hooks | None = None) -> Report:
    """``dcaforge calibrate`` (see the module): checks, the dev sweep, the pick, the held-out check, the copy."""
    hooks = hooks or Hooks()
    t_start = time.monotonic()
    info, out, work = preflight(opts.model, opts.out, opts.force, opts.server, opts.server_from, opts.work)
    check_texts(opts.dev, opts.heldout)
    notes: list[str] = []
    ppl_exe = opts.perplexity if opts.perplexity is not None and opts.perplexity.is_file() else None
    if opts.perplexity is not None and ppl_exe is None:
        notes.append(f"no llama-perplexity at {opts.perplexity}: the dev perplexity was not measured")
    pl = plan(info, chunks=opts.chunks, dev_trials=opts.dev_trials, heldout_trials=opts.heldout_trials,
              max_tokens=opts.max_tokens, perplexity=ppl_exe is not None, temperature=opts.temperature, far=opts.far,
              far_trials=opts.far_trials, far_heldout_trials=opts.far_heldout_trials)
    if hooks.on_plan:
        hooks.on_plan(pl)
    work.mkdir(parents=True, exist_ok=True)
    fp = record.fingerprint(opts.model, opts.server, opts.server_args, longctx.sha256_text(opts.dev.text),
                            longctx.sha256_text(opts.heldout.text))
    recorded = record.load(work, fp) if opts.resume else None
    if opts.resume and recorded is None:
        notes.append(f"--resume: no earlier run recorded in {work}; this one started afresh")
    record.start(work, fp, recorded)
    r = Sweep(Servers(opts.model, opts.server, ppl_exe, opts.server_args, opts.load_timeout), info, work,
              hooks.on_step, hooks.on_trial, recorded)
    ceilings: dict[str, longctx.Score] = {}
    measured = r.ceiling(pl, "dev", opts.dev, notes)   # can the dev text rank settings for this model?
    if measured is not None:
        ceilings["dev"] = measured
    dev = r.dev_cells(pl, opts.dev)   # every candidate at every dev length, then its dev perplexity
    ppl = r.dev_perplexity(pl, opts.dev, notes)
    answers_rank = "dev" not in ceilings or ceiling_holds(ceilings["dev"])
    choice = pick(pl, dev, ppl, answers_rank)
    if not answers_rank:
        notes.append(f"plain attention inside L found the key {ceilings['dev']} on the dev text, below the ceiling of "
                     f"{CEILING_MIN:.0%}: the dev answers cannot rank the settings, so the pick is the lowest dev "
                     "perplexity (then the larger S); give a --dev-text this model can be searched in")
    far: dict[str, longctx.Score] = {}
    if pl.far_dev and answers_rank:   # the rule's two best at the far dev length: the more found there is the pick
        finalists = ranked(choice, list(pl.candidates), pl.finalists)
        r.step(f"dev rule: {', '.join(finalists)} to the far cell ({pl.far_dev} tokens)")
        far = r.far_cells(pl, finalists, opts.dev)
        choice = far_pick(choice, finalists, far, pl.far_dev)
    elif pl.far_dev:
        notes.append("the far dev cell was not run: a text that fails its ceiling cannot rank settings at any length")
    mp = longctx.parse_method(choice.pick)
    r.step(f"pick: {choice.pick} ({choice.why})")
    measured = r.ceiling(pl, "heldout", opts.heldout, notes)
    if measured is not None:
        ceilings["heldout"] = measured
    far_heldout: longctx.Score | None = None
    if "heldout" not in ceilings or ceiling_holds(ceilings["heldout"]):
        heldout = r.heldout_cells(pl, choice.pick, opts.heldout)   # the pick beside YaRN, reported only
        if pl.far_heldout:
            far_heldout = r.far_heldout_cell(pl, choice.pick, opts.heldout)
    else:   # as bench/longctx/run.py: a text that fails its ceiling judges no method; its cells are not run
        heldout = {choice.pick: {}, "yarn": {}}

    temp = mp.factor if mp.factor in TEMPERATURES else "off"   # what the GGUF key can say; any other factor: off
    r.step(f"write {out} (chunk_size {mp.chunk}, local_size {mp.local}, temperature {temp})")
    check_output(opts.model, out, opts.force)   # again: a file may have appeared there during the sweep
    copy = write_dca_copy(opts.model, out, mp.chunk, mp.local, temp)
    if recorded is not None:
        notes.append(f"--resume: {r.reused} trials and {r.reused_ppl} dev perplexities taken from the run recorded in "
                     f"{work}"
                     + (f"; {recorded.dropped} unreadable records dropped" if recorded.dropped else ""))
    rep = Report(model=opts.model, out=out, work=work, info=info, plan=pl, dev=dev, ppl=ppl, choice=choice,
                 chunk=mp.chunk, local=mp.local, heldout=heldout, copy=copy, notes=notes, ceilings=ceilings,
                 far=far, far_heldout=far_heldout)
    failed = rep.ceiling_line("heldout")
    if failed:
        notes.append(f"{failed}; its cells were not run: give a --heldout-text this model can be "
                     "searched in (another text than the dev one)")
    elif Report.total(heldout[choice.pick]).k < Report.total(heldout["yarn"]).k:
        notes.append("the pick scored below YaRN on the held-out trials: DCA past L is not better than YaRN on this "
                     "model at these lengths")
    from dcaforge.gate.plot import plot_calibration

    rep.plot_path = plot_calibration(rep, work / "sweep.png", r.step)
    rep.seconds = time.monotonic() - t_start
    rep.json_path = work / "report.json"
    rep.json_path.write_text(json.dumps(rep.to_dict(), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return rep
