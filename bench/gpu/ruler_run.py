"""The ruler gate's measurement (dcaforge.gate.rulergate.measure_ruler) on a machine without a clean room: the
GPU box has a llama.cpp build and models, not the git room that `dcaforge gate` needs.

    python bench/gpu/ruler_run.py run --server BIN/llama-server --model M.gguf --name NAME --out DIR \
        [--options '{"tasks": ["vt"], "scales": [1, 4, 8], ...}']
        writes DIR/ruler-NAME.json (the gate's result: points, per-sample records, per-server GPU memory)
        and prints the table
    python bench/gpu/ruler_run.py plot DIR/ruler-*.json --png gates.png
        the gates' figure from those results (needs matplotlib; run it where the results come back)
    python bench/gpu/ruler_run.py table DIR/ruler-*.json
        one line per task, context and method: score, prompt tokens, prompt speed, peak GPU memory
    python bench/gpu/ruler_run.py replay DIR/ruler-NAME.json --seed N --samples N --indices 7,8 --server BIN/llama-server \
        --model M.gguf --out DIR/ruler-NEW.json [--dca-args "--dca-yarn-factor 0"] [--extra-args "-t 2"]
        chosen DCA samples of an earlier result again, with other DCA flags: each prompt regenerated from (seed, task,
        index, the record's filler count, samples) and refused unless its sha256 is the recorded one; the result's
        chunk and local window; writes a result that compare pairs with the earlier one
    python bench/gpu/ruler_run.py compare DIR/ruler-*.json
        per model, task and context: each method's samples found (the gate's score: every expected item as a whole
        word) and, for passkey, answered first (the answer's first number is the key: llama-passkey's "exact"); then
        each pair of methods over the same prompts (same prompt sha256): found by one and not the other, and the
        exact two-sided sign-test p-value of that split (McNemar's exact test)

The options are the ruler gate's settings (README, "ruler"); the same code runs as in `dcaforge gate`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dcaforge import ruler
from dcaforge.configsections import GATE_OPTIONS, GateConfig
from dcaforge.errors import DcaforgeError
from dcaforge.gate.gate import points_table
from dcaforge.gate.ggufmeta import gguf_metadata
from dcaforge.gate.options import METHODS
from dcaforge.gate.plot import plot
from dcaforge.gate.results import GateResult
from dcaforge.gate.rulergate import measure_ruler, ruler_answer_fields, ruler_prompt_fields, ruler_server_args
from dcaforge.gate.server import LlamaServer


def _load(paths: list[str]) -> list[GateResult]:
    out = []
    for p in paths:
        d = json.loads(Path(p).read_text())
        out.append(GateResult(**{f.name: d[f.name] for f in dataclasses.fields(GateResult) if f.name in d}))
    return out


def cmd_run(a: argparse.Namespace) -> int:
    options = json.loads(a.options)
    unknown = set(options) - set(GATE_OPTIONS["ruler"])
    if unknown:
        print(f"unknown ruler option(s): {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    out = Path(a.out)
    logs = out / f"logs-{a.name}"
    logs.mkdir(parents=True, exist_ok=True)
    n = [0]

    def log_path(what: str) -> Path:
        n[0] += 1
        return logs / f"{n[0]:03d}-{what}.log"

    g = GateConfig(name=a.name, kind="ruler", where="ruler_run.py", model=Path(a.model), options=options)
    try:
        res = measure_ruler(Path(a.server), Path(a.model), g, log_path, lambda s: print(s, flush=True))
    except DcaforgeError as exc:
        print(f"error: {exc.message} ({exc.where})\n{exc.details or ''}", file=sys.stderr)
        return 1
    (out / f"ruler-{a.name}.json").write_text(json.dumps(dataclasses.asdict(res), indent=1, sort_keys=True) + "\n")
    print(f"{res.name}: {'PASS' if res.passed else 'FAIL'}: {res.summary}")
    print_table([res])
    return 0 if res.passed else 1


def cmd_replay(a: argparse.Namespace) -> int:
    if not Path(a.server).is_file() or not Path(a.model).is_file():
        print(f"replay: no {a.server if not Path(a.server).is_file() else a.model}", file=sys.stderr)
        return 2
    old = _load([a.result])[0]
    want = [int(x) for x in a.indices.split(",")]
    recs = {x["index"]: x for x in old.metrics.get("samples", []) if x.get("method") == "dca" and x.get("prompt_sha256")}
    missing = [i for i in want if i not in recs]
    if missing or len({recs[i]["ctx"] for i in want}) != 1 or len({recs[i]["task"] for i in want}) != 1:
        print(f"replay: {a.result} has no DCA sample {missing} or they span several lengths or tasks", file=sys.stderr)
        return 2
    ctx, task = int(recs[want[0]]["ctx"]), str(recs[want[0]]["task"])
    texts = {}
    for i in want:
        s = ruler.generate(task, a.seed, i, int(recs[i]["n_filler"]), n_samples=a.samples)
        if ruler.sha256(s.prompt) != recs[i]["prompt_sha256"]:
            print(f"replay: sample {i} with seed {a.seed} and {a.samples} samples is not the recorded prompt "
                  "(another seed or sample count, or a chat-wrapped result)", file=sys.stderr)
            return 2
        texts[i] = s
    try:
        meta = gguf_metadata(Path(a.model))
    except DcaforgeError as exc:
        print(f"replay: {exc.message}", file=sys.stderr)
        return 2
    arch = str(meta.get("general.architecture", ""))
    trained = int(old.metrics.get("trained") or meta.get(f"{arch}.context_length", 0))
    dca_args = a.dca_args.split()
    # no -t (llama-server picks its threads) and the default YaRN factor, unlike measure_ruler's gate options
    args = ruler_server_args(a.model, "dca", ctx, trained, arch, int(old.metrics["chunk"]), int(old.metrics["local"]),
                             dca_args, a.extra_args.split())
    out = Path(a.out)
    samples = []
    try:
        srv = LlamaServer(Path(a.server), args, out.with_suffix(".server.log"), load_timeout=900, request_timeout=7200)
        srv.start()
    except DcaforgeError as exc:
        print(f"replay: {exc.message}", file=sys.stderr)
        return 1
    try:
        for i in want:
            s = texts[i]
            toks = srv.tokenize(s.prompt)
            reply = srv.completion(toks, ruler.N_PREDICT[task])
            answer = str(reply.get("content", ""))
            rec = {"task": task, "ctx": ctx, "method": "dca", "index": i, **ruler_prompt_fields(s, s.prompt, toks),
                   **ruler_answer_fields(s, answer)}
            samples.append(rec)
            print(f"{task} #{i}: {len(toks)} tokens, score {rec['score']:.2f} (was {recs[i]['score']:.2f}): {answer[:60]!r}",
                  flush=True)
    finally:
        srv.stop()
    metrics = {"model": old.metrics.get("model"), "trained": trained, "methods": ["dca"], "tasks": [task], "contexts": [ctx],
               "chunk": old.metrics["chunk"], "local": old.metrics["local"], "dca_args": dca_args,
               "replay_of": Path(a.result).name, "samples": samples}
    res = GateResult(out.stem, "ruler", True, f"replay of {len(want)} samples of {Path(a.result).name}", metrics)
    out.write_text(json.dumps(dataclasses.asdict(res), indent=1, sort_keys=True) + "\n")
    return 0


def print_table(results: list[GateResult]) -> None:
    for r in results:
        t = points_table(r)
        if t is None:
            continue
        title, cols, rows = t
        print(f"# {title}")
        print("\t".join(cols))
        for row in rows:
            print("\t".join(row))
        mem = {(s["ctx"], s["method"]): s for s in r.metrics.get("servers", [])}
        recs = [x for x in r.metrics.get("samples", []) if x.get("score") is not None]
        if recs:
            print("# per sample: task ctx method idx tokens score prompt_t/s gen_t/s fit_s gpu_MiB_peak other_gpu_procs")
            for x in recs:
                s = mem.get((x["ctx"], x["method"]), {})
                print(f"{x['task']}\t{x['ctx']}\t{x['method']}\t{x['index']}\t{x['prompt_tokens']}\t{x['score']:.2f}\t"
                      f"{x.get('prompt_per_second') or 0:.0f}\t{x.get('predicted_per_second') or 0:.1f}\t"
                      f"{x.get('fit_seconds', '')}\t{s.get('gpu_mib_peak', '-')}\t{s.get('gpu_other_processes', '-')}")
        errs = [x for x in r.metrics.get("samples", []) if x.get("error")]
        for x in errs[:10]:
            print(f"# {x['task']} {x['ctx']} {x['method']} #{x['index']}: {x['error'][:160]}")


def _first_is_key(rec: dict) -> bool:
    m = re.search(r"[0-9]+", str(rec.get("answer", "")))
    return m is not None and [m.group(0)] == list(rec.get("expected", []))


def sign_test(b: int, c: int) -> float:
    """Exact two-sided p-value of b against c discordant pairs under p = 1/2 (McNemar's exact test)."""
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(b, c) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def _variant(r: GateResult, method: str) -> str:
    """What sets a result's method apart from the same method in another result: DCA's sizes and extra flags."""
    if method != "dca":
        return ""
    m = r.metrics
    return " ".join([f"S{m.get('chunk', '?')} w{m.get('local', '?')}", *(str(a) for a in m.get("dca_args", []))])


def compare(results: list[GateResult]) -> list[str]:
    """The lines of `compare` (see the module's docstring). Results that run one method with different settings (DCA's
    chunk, local window or extra flags) stay apart: in a cell where a method has several, each is "method[settings]"."""
    cells: dict[tuple[str, str, int], dict[tuple[str, str], dict[int, dict]]] = {}
    for r in results:
        model = str(r.metrics.get("model", r.name))
        for x in r.metrics.get("samples", []):
            if x.get("score") is None:
                continue
            by_method = cells.setdefault((model, x["task"], int(x["ctx"])), {})
            key = (x["method"], _variant(r, x["method"]))
            if x["index"] in by_method.setdefault(key, {}):
                raise ValueError(f"{r.name}: {model} {x['task']} {x['ctx']} {x['method']} #{x['index']} twice")
            by_method[key][x["index"]] = x
    out = ["# model\ttask\tctx\tmethod\tn\tfound\tfirst (passkey: the first number is the key)"]
    pairs = []
    for (model, task, ctx), by_key in sorted(cells.items()):
        keys = sorted(by_key, key=lambda k: (METHODS.index(k[0]) if k[0] in METHODS else 99, k))
        several = {m for m, _ in by_key if sum(k[0] == m for k in by_key) > 1}
        label = {k: f"{k[0]}[{k[1]}]" if k[0] in several else k[0] for k in keys}
        for k in keys:
            recs = by_key[k].values()
            first = f"{sum(_first_is_key(x) for x in recs)}" if task == "passkey" else "-"
            out.append(f"{model}\t{task}\t{ctx}\t{label[k]}\t{len(recs)}\t{sum(bool(x.get('all')) for x in recs)}\t{first}")
        names = [k for k in keys if k[0] in METHODS]
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                common = sorted(set(by_key[a]) & set(by_key[b]))
                for j in common:
                    if by_key[a][j].get("prompt_sha256") != by_key[b][j].get("prompt_sha256"):
                        raise ValueError(f"{model} {task} {ctx} #{j}: {label[a]} and {label[b]} were sent different prompts")
                for what, hit in (("found", lambda x: bool(x.get("all"))), ("first", _first_is_key)):
                    if what == "first" and task != "passkey":
                        continue
                    only_a = sum(hit(by_key[a][j]) and not hit(by_key[b][j]) for j in common)
                    only_b = sum(hit(by_key[b][j]) and not hit(by_key[a][j]) for j in common)
                    pairs.append(f"{model}\t{task}\t{ctx}\t{label[b]} vs {label[a]}\t{what}\t{len(common)}\t{only_b}\t"
                                 f"{only_a}\t{sign_test(only_b, only_a):.3g}")
    if pairs:
        out.append("# model\ttask\tctx\tpair\tscore\tn paired\tonly the first of the pair\tonly the second\tsign-test p")
        out += pairs
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="ruler_run.py")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--server", required=True)
    r.add_argument("--model", required=True)
    r.add_argument("--name", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--options", default="{}")
    p = sub.add_parser("plot")
    p.add_argument("results", nargs="+")
    p.add_argument("--png", required=True)
    t = sub.add_parser("table")
    t.add_argument("results", nargs="+")
    c = sub.add_parser("compare")
    c.add_argument("results", nargs="+")
    rp = sub.add_parser("replay")
    rp.add_argument("result")
    for opt in ("--server", "--model", "--out", "--indices"):
        rp.add_argument(opt, required=True)
    rp.add_argument("--seed", type=int, required=True)
    rp.add_argument("--samples", type=int, required=True)
    rp.add_argument("--dca-args", default="")
    rp.add_argument("--extra-args", default="")
    a = ap.parse_args(argv)
    if a.cmd == "run":
        return cmd_run(a)
    if a.cmd == "replay":
        return cmd_replay(a)
    results = _load(a.results)
    if a.cmd == "table":
        print_table(results)
        return 0
    if a.cmd == "compare":
        try:
            print("\n".join(compare(results)))
        except ValueError as exc:
            print(f"compare: {exc}", file=sys.stderr)
            return 1
        return 0
    path = plot(results, Path(a.png), lambda s: print(s, file=sys.stderr))
    print(path or "no figure")
    return 0 if path else 1


if __name__ == "__main__":
    sys.exit(main())
