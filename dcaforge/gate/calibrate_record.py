"""``dcaforge calibrate --resume``: what a calibration run measured, kept in its work folder so that a run stopped by
an interrupt, a lost machine or a crash goes on where it stopped.

- ``run.json``: the fingerprint of what the trials depend on: the model (size and the SHA-256 of its first and last
  16 MiB: a multi-GB GGUF is not read whole), llama-server's SHA-256, the server options, and both texts' SHA-256.
  A resumed run must match it in every field; what differs is named.
- ``trials.jsonl``: one passkey trial a line (the sweep writes it as it scores). A trial is taken again only where
  the set, method, length, index **and** key agree (the key follows from the first four: a record whose key
  disagrees is not this protocol's and is measured again); a line that is not a whole record (a run killed while
  writing) is dropped and counted.
- ``ppl.jsonl``: one dev perplexity a line (method, context, value).

The work folder is the user's input like any other: a record only ever becomes a score, never a command or a path.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dcaforge.errors import CalibrateError

RUN_FILE = "run.json"
TRIALS_FILE = "trials.jsonl"
PPL_FILE = "ppl.jsonl"
#: the model's fingerprint reads this much of each end
EDGE = 16 << 20


def model_fingerprint(path: Path) -> str:
    """``size:sha256(first EDGE bytes + last EDGE bytes)``: a changed GGUF (a new quantization, an edited key, another
    file at the same path) changes its header or its tensors' tail, and the size of any rewrite that moves data."""
    size = path.stat().st_size
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        h.update(fh.read(EDGE))
        if size > EDGE:
            fh.seek(max(EDGE, size - EDGE))
            h.update(fh.read(EDGE))
    return f"{size}:{h.hexdigest()}"


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fingerprint(model: Path, server: Path, server_args: tuple[str, ...], dev_sha: str, heldout_sha: str) -> dict[str, Any]:
    return {"model": model_fingerprint(model), "server": file_sha256(server), "server_args": list(server_args),
            "dev_text": dev_sha, "heldout_text": heldout_sha}


FIELDS = {"model": "the model file", "server": "llama-server (another build)", "server_args": "--server-args",
          "dev_text": "the dev text", "heldout_text": "the held-out text"}


@dataclass
class Recorded:
    """The trials and perplexities of an earlier run of the same calibration, and what was dropped."""

    trials: dict[tuple[str, str, int, int], dict[str, Any]] = field(default_factory=dict)
    ppl: dict[tuple[str, int], float] = field(default_factory=dict)
    dropped: int = 0

    def trial(self, set_name: str, method: str, length: int, index: int, key: str) -> dict[str, Any] | None:
        rec = self.trials.get((set_name, method, length, index))
        return rec if rec is not None and rec.get("key") == key else None


def _trial_ok(rec: Any) -> bool:
    return (isinstance(rec, dict) and isinstance(rec.get("set"), str) and isinstance(rec.get("method"), str)
            and type(rec.get("length")) is int and type(rec.get("index")) is int and isinstance(rec.get("key"), str)
            and type(rec.get("ok")) is bool and isinstance(rec.get("answer"), str))


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise CalibrateError(f"{path} cannot be read: {exc.strerror}", where=str(path),
                             hint="leave out --resume to start over") from None


def load(work: Path, fp: dict[str, Any]) -> Recorded | None:
    """The earlier run in ``work`` when its fingerprint is ``fp``; None when ``work`` holds no run; CalibrateError,
    naming what differs, when it holds another calibration's."""
    run_path = work / RUN_FILE
    if not run_path.is_file():
        return None
    try:
        old = json.loads(run_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        old = None
    if not isinstance(old, dict):
        raise CalibrateError(f"{run_path} is not a calibration's record", where=str(run_path),
                             hint="leave out --resume to start over (the work folder's trials are then replaced)")
    differ = [FIELDS[k] for k in FIELDS if old.get(k) != fp[k]]
    if differ:
        raise CalibrateError(f"--resume: {', '.join(differ)} differ{'s' if len(differ) == 1 else ''} from the run "
                             f"recorded in {work}", where=str(run_path),
                             hint="run with what that run had, or leave out --resume to start over (the work "
                                  "folder's trials are then replaced)")
    rec = Recorded()
    for line in _lines(work / TRIALS_FILE):
        try:
            r = json.loads(line)
        except ValueError:
            r = None
        if not _trial_ok(r):
            rec.dropped += 1
            continue
        rec.trials[(r["set"], r["method"], r["length"], r["index"])] = r
    for line in _lines(work / PPL_FILE):
        try:
            r = json.loads(line)
        except ValueError:
            r = None
        if (isinstance(r, dict) and isinstance(r.get("method"), str) and type(r.get("ctx")) is int
                and isinstance(r.get("ppl"), (int, float)) and not isinstance(r.get("ppl"), bool)):
            rec.ppl[(r["method"], r["ctx"])] = float(r["ppl"])
        else:
            rec.dropped += 1
    return rec


def start(work: Path, fp: dict[str, Any], recorded: Recorded | None) -> None:
    """Write this run's fingerprint and the records it keeps (``recorded``: a resumed run's; None: a fresh start, the
    files emptied), each file through a temporary one."""
    def put(name: str, text: str) -> None:
        tmp = work / (name + ".tmp")
        tmp.unlink(missing_ok=True)   # a link left there is removed, never written through
        with open(tmp, "x", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, work / name)   # replaces a link at the name itself, not its target

    put(RUN_FILE, json.dumps(fp, indent=2, sort_keys=True) + "\n")
    trials = "".join(json.dumps(r, sort_keys=True) + "\n" for r in recorded.trials.values()) if recorded else ""
    ppl = "".join(json.dumps({"method": m, "ctx": c, "ppl": v}) + "\n" for (m, c), v in recorded.ppl.items()) if recorded else ""
    put(TRIALS_FILE, trials)
    put(PPL_FILE, ppl)
