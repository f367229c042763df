#!/usr/bin/env python3
"""Does `--dca on` alone on a calibrated copy answer exactly as the measured setting's flags do on the original?

`dcaforge calibrate` writes the pick into a copy of the GGUF (`<arch>.attention.dual_chunk.chunk_size`,
`.local_size`, `.temperature`); the bench measured the pick with flags (`--dca-chunk-size S --dca-local-size W
--dca-yarn-factor F`). This runs the same passkey prompts (dcaforge/gate/longctx.py: the set's seed, a fresh key and
depth per trial) through one llama-server per configuration, greedy, and compares the answer and the top
probabilities of every generated token, as the server prints them (JSON floats), between:
  A: the copy (written here with dcaforge.gate.calibrate_gguf.write_dca_copy) with `--dca on` and nothing else
  B: the original with `--dca on --dca-chunk-size S --dca-local-size W --dca-yarn-factor F`
Prints one line per trial and `EQUAL k/n`; exit 0 only when every trial is equal.

    python bench/longctx/keys_equal.py --server BIN/llama-server --model M.gguf --text build/longctx/dev.txt \
        --method dca:16384:2048:len --length 36000 --trials 2 --work /tmp/keys-equal [--args "-t 2"]
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dcaforge.gate import longctx  # noqa: E402
from dcaforge.gate.calibrate_gguf import inspect_gguf, write_dca_copy  # noqa: E402
from dcaforge.gate.calibrate_sweep import Sweep  # noqa: E402
from dcaforge.gate.server import LlamaServer  # noqa: E402

N_PROBS = 5


def run(server: Path, model: Path, extra: list[str], text: str, length: int, trials: list[longctx.Trial],
        log: Path) -> list[dict]:
    ctx = longctx.ctx_for(length)
    args = ["-m", str(model), "-c", str(ctx), "-np", "1", "--no-warmup", "--cache-ram", "0", "--no-webui", *extra]
    out = []
    with LlamaServer(server, args, log, load_timeout=900) as srv:
        tok = Sweep.tokenizer(srv, False)   # the tokenizer calls calibrate's sweep makes
        corpus = longctx.TokenizedCorpus.build("text", text[: 6 * length], tok)
        frame = longctx.Frame.build(Sweep.tokenizer(srv, True), tok)
        for t in trials:
            needle = tok(longctx.NEEDLE.format(key=t.key))
            toks = longctx.prompt_tokens(t, corpus, frame, needle)
            r = srv.post("/completion", {"prompt": toks, "n_predict": longctx.N_PREDICT, "temperature": 0.0, "top_k": 1,
                                         "seed": 0, "cache_prompt": False, "n_probs": N_PROBS, "stream": False})
            out.append({"key": t.key, "answer": r.get("content", ""), "probs": r.get("completion_probabilities")})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", type=Path, required=True)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--text", type=Path, required=True)
    ap.add_argument("--method", required=True, help="dca:S:W:F (F: len, pos, chunk or off)")
    ap.add_argument("--length", type=int, required=True)
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument("--set", default="keys-equal")
    ap.add_argument("--seed", type=int, default=20261208)
    ap.add_argument("--args", default="-t 2", help="more llama-server options, for both")
    ap.add_argument("--work", type=Path, required=True)
    a = ap.parse_args()
    m = longctx.parse_method(a.method)
    temp = m.factor if m.factor in ("len", "pos", "chunk") else "off"
    a.work.mkdir(parents=True, exist_ok=True)
    copy = a.work / "copy.dca.gguf"
    copy.unlink(missing_ok=True)   # this script's own scratch file
    write_dca_copy(a.model, copy, m.chunk, m.local, temp)
    info = inspect_gguf(copy)
    assert (info.chunk, info.local) == (m.chunk, m.local), info
    text = a.text.read_text(encoding="utf-8", errors="replace")
    trials = longctx.trials(a.set, a.seed, a.length, a.trials)
    extra = shlex.split(a.args)
    got_a = run(a.server, copy, [*extra, "--dca", "on"], text, a.length, trials, a.work / "a.log")
    flags = ["--dca", "on", "--dca-chunk-size", str(m.chunk), "--dca-local-size", str(m.local), "--dca-yarn-factor",
             m.factor if temp != "off" else "0"]
    got_b = run(a.server, a.model, [*extra, *flags], text, a.length, trials, a.work / "b.log")
    equal = 0
    for t, x, y in zip(trials, got_a, got_b, strict=True):
        same = json.dumps(x, sort_keys=True) == json.dumps(y, sort_keys=True)
        equal += same
        verdict = f"equal (answer and top-{N_PROBS} probabilities of every token)" if same else "DIFFERENT"
        print(f"#{t.index} key {t.key}: A {x['answer'][:16]!r} B {y['answer'][:16]!r} {verdict}", flush=True)
    log_a = (a.work / "a.log").read_text(errors="replace")
    own = [line.strip() for line in log_a.splitlines() if "llama_dca_resolve" in line]
    print("A's DCA line:", own[0] if own else "(not logged: add -lv 4 to --args)")
    print(f"EQUAL {equal}/{len(trials)} ({a.method} at {a.length} tokens; A: the copy with --dca on alone, B: the flags)")
    return 0 if equal == len(trials) else 1


if __name__ == "__main__":
    sys.exit(main())
