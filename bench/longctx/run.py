"""The long-context protocol's runner (sets.yaml; prompts and scoring: dcaforge/gate/longctx.py), on a machine with a
llama.cpp build (llama-server, llama-perplexity) and the models; no clean room needed.

    python bench/longctx/run.py passkey --set dev --model gemma-3-270m --methods plain,yarn,dca:4096:512 \
        --bin BIN --models DIR --texts DIR --out DIR [--lengths 81920,inside] [--trials N] [--jobs N]
        one llama-server per (method, length), every trial of the cell through it (greedy, the prompt as tokens);
        appends one JSON line per trial to DIR/passkey.jsonl (set, model, length, method, index, key, depth, answer,
        ok) and skips trials already there, so a run cut short goes on where it stopped
    python bench/longctx/run.py ppl --set heldout --model smollm2-135m --methods plain,dca:4096:512 ... [--ctx N]
        llama-perplexity over every window of the set's text at each of the set's contexts: DIR/ppl.jsonl
    python bench/longctx/run.py choose --set dev[,devfar] --model M --methods A,B,C DIR [DIR ...]
        the dev set's choice among the methods (written down before any run): the most exact answers over the dev
        cells (the trials every candidate answered); among those within 2 of the best (10% of 20 trials), the lowest
        mean dev perplexity; then the larger S
    python bench/longctx/run.py merge FROM.jsonl INTO.jsonl [--sets dev,...]
        appends to INTO the trials of FROM it lacks (a device run's passkey.jsonl starts from the committed held-out
        trials), only those of the given sets with --sets (dev trials go to dev-results/, the others to
        heldout-results/); a trial in both must have the same answer (greedy, same prompt), else nothing is written
    python bench/longctx/run.py report DIR [DIR ...] [--md FILE]
        the tables: per set, model and length, each method's k/n with its Wilson 95% interval; perplexities

Methods: ``plain``; ``yarn`` (--rope-scaling yarn, factor = context / trained, --yarn-orig-ctx trained); ``dca``
(--dca on and nothing else: the build's defaults); ``dca:S:W`` (chunk S, local window W, temperature off);
``dca:S:W:F`` (and --dca-yarn-factor F). ``inside`` as a length runs the set's inside-window length (plain only),
before any other cell: a set with ``ceiling_min`` runs no other cell until plain attention has answered that many of
its ``inside`` trials (exit 2, and the report marks such cells).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dcaforge.gate import longctx  # noqa: E402
from dcaforge.gate.perplexity import parse_perplexity, perplexity_from_logits  # noqa: E402
from dcaforge.gate.server import LlamaServer  # noqa: E402

HERE = Path(__file__).resolve().parent
SETS = yaml.safe_load((HERE / "sets.yaml").read_text())
_lock = threading.Lock()


def method_args(method: str, ctx: int, trained: int, arch: str = "") -> list[str]:
    """dcaforge.gate.longctx.method_args (the flags of a method, shared with ``dcaforge calibrate``); an unknown method
    stops the run."""
    try:
        return longctx.method_args(method, ctx, trained, arch)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None


ctx_for = longctx.ctx_for


def records(dirs: list[Path], name: str) -> list[dict[str, Any]]:
    """The JSON lines of ``name`` (passkey.jsonl, ppl.jsonl) in each of ``dirs`` that has it, in order."""
    return [json.loads(line) for d in dirs if (d / name).exists() for line in (d / name).read_text().splitlines()]


def trial_key(r: dict[str, Any]) -> tuple[str, ...]:
    """A passkey trial: its set, model, length, method and index (its key and depth come from the set's seed)."""
    return (r["set"], r["model"], str(r["length"]), r["method"], str(r["index"]))


def unique(recs: list[dict[str, Any]], key: Any) -> list[dict[str, Any]]:
    """``recs`` with each ``key`` once (the first): a device run starts from the committed records, so the same trial can
    be in two of the folders a choice or a report reads; counted twice, it would move the choice (2026-12-06: it did)."""
    seen: set[Any] = set()
    out = []
    for r in recs:
        k = key(r)
        if k not in seen:
            seen.add(k)
            out.append(r)
    return out


def ppl_key(r: dict[str, Any]) -> tuple[str, ...]:
    """A perplexity measurement: its set, model, context and method."""
    return (r["set"], r["model"], str(r["ctx"]), r["method"])


def done_keys(path: Path) -> set[tuple[str, ...]]:
    return {trial_key(r) for r in records([path.parent], path.name)}


def merge(src: Path, dst: Path, sets: set[str] | None = None) -> tuple[int, int]:
    """Appends to ``dst`` the trials of ``src`` that ``dst`` lacks (only those of ``sets`` when given: a device run holds
    dev and held-out trials, which live apart); returns (added, already there). A trial in both with a different answer
    stops it before anything is written: the run was not the same."""
    have = {trial_key(r): r for r in records([dst.parent], dst.name)}
    new: list[str] = []
    dup = 0
    for line in src.read_text().splitlines():
        r = json.loads(line)
        if sets is not None and r["set"] not in sets:
            continue
        k = trial_key(r)
        if k in have:
            if have[k]["answer"] != r["answer"]:
                raise SystemExit(f"{src}: trial {k} answers {r['answer']!r} where {dst} has {have[k]['answer']!r}")
            dup += 1
            continue
        have[k] = r
        new.append(line + "\n")
    with dst.open("a", encoding="utf-8") as fh:
        fh.writelines(new)
    return len(new), dup


def corpus_for(srv: LlamaServer, set_name: str, model: str, texts: Path, cache: Path) -> longctx.TokenizedCorpus:
    spec = SETS["sets"][set_name]["text"]
    cfile = cache / f"corpus-{model}-{spec['sha256'][:16]}.json"
    with _lock:
        if cfile.exists():
            d = json.loads(cfile.read_text())
            return longctx.TokenizedCorpus(d["name"], d["sha256"], d["paragraphs"], d["sep"])
        text = longctx.load_text(texts / spec["file"], spec["sha256"])

        def tok(s: str) -> list[int]:
            return list(srv.post("/tokenize", {"content": s, "add_special": False, "parse_special": False})["tokens"])

        t0 = time.monotonic()
        c = longctx.TokenizedCorpus.build(spec["file"], text, tok)
        print(f"  tokenized {spec['file']} for {model}: {c.total} tokens in {time.monotonic() - t0:.0f} s", flush=True)
        tmp = cfile.with_suffix(f".{os.getpid()}.tmp")   # another process may read it: whole or not at all
        tmp.write_text(json.dumps({"name": c.name, "sha256": c.sha256, "paragraphs": c.paragraphs, "sep": c.sep}))
        tmp.replace(cfile)
        return c


def cell_trials(set_name: str, length: int, override: int = 0) -> int:
    """Trials of a cell: ``override`` (--trials) when given, else the set's ``trials``, or for a 1M-class cell (>= 500,000
    tokens, a minute or more a trial) its ``far_trials`` (3 where the set names none)."""
    s = SETS["sets"][set_name]
    return override or (int(s.get("far_trials", 3)) if length >= 500_000 else int(s["trials"]))


def run_cell(a: argparse.Namespace, method: str, length: int, label: str) -> None:
    s = SETS["sets"][a.set]
    m = SETS["models"][a.model]
    out = Path(a.out)
    jsonl = out / "passkey.jsonl"
    n = cell_trials(a.set, length, a.trials)
    todo = [t for t in longctx.trials(a.set, s["seed"], length, n, tuple(s["depth"]))
            if (a.set, a.model, str(label), method, str(t.index)) not in done_keys(jsonl)]
    if not todo:
        print(f"{a.model} {method} {label}: done", flush=True)
        return
    ctx = ctx_for(length)
    args = ["-m", str(Path(a.models) / m["file"]), "-c", str(ctx), "-ngl", "99", "-fa", "on", "-np", "1",
            "-b", "2048", "-ub", "512", "--no-warmup", "--cache-ram", "0", "--no-webui",
            *method_args(method, ctx, m["trained"], m["arch"])]
    log = out / "logs" / f"{a.set}-{a.model}-{method.replace(':', '_')}-{label}.log"
    with LlamaServer(Path(a.bin) / "llama-server", args, log, request_timeout=3600) as srv:
        corpus = corpus_for(srv, a.set, a.model, Path(a.texts), out)
        frame = longctx.Frame.build(
            lambda t: list(srv.post("/tokenize", {"content": t, "add_special": True, "parse_special": False})["tokens"]),
            lambda t: list(srv.post("/tokenize", {"content": t, "add_special": False, "parse_special": False})["tokens"]))
        for t in todo:
            needle = list(srv.post("/tokenize", {"content": longctx.NEEDLE.format(key=t.key), "add_special": False,
                                                  "parse_special": False})["tokens"])
            toks = longctx.prompt_tokens(t, corpus, frame, needle)
            t0 = time.monotonic()
            r = srv.completion(toks, longctx.N_PREDICT)
            answer = str(r.get("content", ""))
            rec: dict[str, Any] = {
                "set": a.set, "model": a.model, "length": label, "tokens": len(toks), "method": method, "index": t.index,
                "key": t.key, "depth": round(longctx.needle_depth(t, toks, needle), 4), "answer": answer,
                "ok": longctx.passed(t.key, answer), "seconds": round(time.monotonic() - t0, 2),
                "ctx": ctx, "args": " ".join(args[4:]),
            }
            with _lock, open(jsonl, "a") as fh:
                fh.write(json.dumps(rec) + "\n")
            print(f"{a.model} {method} {label} #{t.index}: key {t.key} depth {rec['depth']:.2f} -> {answer.strip()[:24]!r}"
                  f" {'ok' if rec['ok'] else 'MISS'} ({rec['seconds']} s)", flush=True)


def ceiling(recs: list[dict[str, Any]], set_name: str, model: str) -> longctx.Score:
    """Plain attention's score on the set's ``inside`` cell for the model, from passkey records (scored strictly)."""
    sc = longctx.Score()
    for r in recs:
        if r["set"] == set_name and r["model"] == model and r["length"] == "inside" and r["method"] == "plain":
            sc.add(longctx.passed(r["key"], r["answer"]))
    return sc


def ceiling_verdict(set_name: str, model: str, sc: longctx.Score) -> str | None:
    """None when the set's ``ceiling_min`` holds (or the set has none), else why its extension cells judge nothing."""
    s = SETS["sets"][set_name]
    need = s.get("ceiling_min")
    if need is None:
        return None
    if sc.n < s["trials"]:
        return f"{set_name}/{model}: the inside-window ceiling is not measured yet ({sc.n} of {s['trials']} trials)"
    if sc.k < need:
        return (f"{set_name}/{model}: plain attention answers {sc.k}/{sc.n} inside the trained window, below the set's "
                f"ceiling_min {need}: this text cannot judge a method that extends the window")
    return None


def cmd_passkey(a: argparse.Namespace) -> int:
    s = SETS["sets"][a.set]
    cell = s["cells"][a.model]
    Path(a.out, "logs").mkdir(parents=True, exist_ok=True)
    lengths = [x for x in (a.lengths.split(",") if a.lengths else [str(v) for v in cell["lengths"]])]
    if "inside" in lengths:   # the ceiling first (sets.yaml): the set's sanity check
        run_cell(a, "plain", int(cell["inside"]), "inside")
    jobs = [(method, int(x), x) for method in a.methods.split(",") for x in lengths if x != "inside"]
    why = ceiling_verdict(a.set, a.model, ceiling(records([Path(a.out)], "passkey.jsonl"), a.set, a.model)) if jobs else None
    if why:
        print(f"refused: {why}; run `inside` first (--lengths inside,...)", file=sys.stderr, flush=True)
        return 2
    with cf.ThreadPoolExecutor(max_workers=a.jobs) as ex:
        for f in [ex.submit(run_cell, a, *j) for j in jobs]:
            f.result()
    return 0


def cmd_ppl(a: argparse.Namespace) -> int:
    s = SETS["sets"][a.set]
    m = SETS["models"][a.model]
    out = Path(a.out)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    spec = s["text"]
    text = longctx.load_text(Path(a.texts) / spec["file"], spec["sha256"])
    tfile = out / f"ppl-{a.set}.txt"
    tfile.write_text(text[: a.chars])  # llama-perplexity tokenizes slowly past ~1.4 MB with a 262k vocabulary
    ctxs = [int(x) for x in a.ctx.split(",")] if a.ctx else s["perplexity"][a.model]

    def one(method: str, ctx: int) -> None:
        tag = f"{a.set}-{a.model}-{method.replace(':', '_')}-{ctx}"
        logits = out / f"{tag}.kld"
        argv = [str(Path(a.bin) / "llama-perplexity"), "-m", str(Path(a.models) / m["file"]), "-f", str(tfile),
                "-c", str(ctx), "-b", "2048", "-ub", "512", "-ngl", "99", "-fa", "on",
                *(["--kl-divergence-base", str(logits)] if m.get("kld", True) else []),
                *method_args(method, ctx, m["trained"], m["arch"])]
        t0 = time.monotonic()
        p = subprocess.run(argv, capture_output=True, text=True, check=False,
                           env={k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")})
        (out / "logs" / f"ppl-{tag}.log").write_text(p.stdout + p.stderr)
        val = parse_perplexity(p.stdout + p.stderr)
        if val is None and logits.exists():
            val = perplexity_from_logits(logits)
        logits.unlink(missing_ok=True)
        rec = {"set": a.set, "model": a.model, "ctx": ctx, "method": method, "ppl": val, "rc": p.returncode,
               "chars": a.chars, "seconds": round(time.monotonic() - t0, 1)}
        with _lock, open(out / "ppl.jsonl", "a") as fh:
            fh.write(json.dumps(rec) + "\n")
        print(f"ppl {a.set} {a.model} {method} {ctx}: {val} (rc {p.returncode}, {rec['seconds']} s)", flush=True)

    with cf.ThreadPoolExecutor(max_workers=a.jobs) as ex:
        for f in [ex.submit(one, meth, c) for meth in a.methods.split(",") for c in ctxs]:
            f.result()
    return 0


def choose(set_name: str, model: str, methods: list[str], dirs: list[Path]) -> tuple[str, str]:
    """(the chosen method, why): dcaforge.gate.longctx.choose (the rule ``dcaforge calibrate`` uses too) over the
    passkey answers of ``set_name`` (one set, or several joined by commas: dev,devfar; every length but ``inside``)
    and its perplexities in ``dirs``, with the protocol's slack of 2. Paired: only the trials (set, length, index)
    that every candidate with any trial has answered are counted, so a candidate run on a cell the others were not
    (devfar's 1M cell holds two of them) cannot win or lose by its number of trials. A candidate with the former
    temperature rule (``:auto``) is measured but never chosen: it scales by n_ctx per sequence, so its answer moves
    with ``-c`` and the slot count, which a default may not (issue L, item 2)."""
    sets = set_name.split(",")
    unknown = [x for x in sets if x not in SETS["sets"]]
    if unknown:
        raise SystemExit(f"choose --set: no set {', '.join(unknown)} in sets.yaml (there: {', '.join(sorted(SETS['sets']))})")
    dropped = [m for m in methods if m.endswith(":auto")]
    methods = [m for m in methods if m not in dropped]
    if not methods:
        raise SystemExit(f"choose: only ':auto' candidates in {dropped}: a default may not depend on -c or the slot count")
    answers: dict[str, dict[tuple[str, str, str], bool]] = {m: {} for m in methods}
    for r in unique(records(dirs, "passkey.jsonl"), trial_key):
        if r["set"] in sets and r["model"] == model and r["method"] in answers and r["length"] != "inside":
            answers[r["method"]][(r["set"], str(r["length"]), str(r["index"]))] = bool(r["ok"])
    ran = [a for a in answers.values() if a]
    common = set.intersection(*(set(a) for a in ran)) if ran else set()
    scores = {m: longctx.Score() for m in methods}
    for m, a in answers.items():
        for t in sorted(common) if a else ():
            scores[m].add(a[t])
    left_out = len({t for a in ran for t in a} - common)
    ppl: dict[str, list[float]] = {m: [] for m in methods}
    for r in unique(records(dirs, "ppl.jsonl"), ppl_key):
        if r["set"] in sets and r["model"] == model and r["method"] in ppl and r["ppl"]:
            ppl[r["method"]].append(float(r["ppl"]))
    try:
        c = longctx.choose(scores, ppl, methods, slack=longctx.SLACK)
    except ValueError:
        raise SystemExit(f"choose: no {set_name} trials of {model} for {methods} that every one of them answered") from None
    return c.pick, (c.why + (f" (not a default, so not chosen: {', '.join(dropped)})" if dropped else "")
                    + (f" ({left_out} trials not answered by every candidate left out)" if left_out else ""))


def report(dirs: list[Path]) -> str:
    rows: dict[tuple[str, str, str], dict[str, longctx.Score]] = {}
    passkey = unique(records(dirs, "passkey.jsonl"), trial_key)
    for r in passkey:
        sc = rows.setdefault((r["set"], r["model"], str(r["length"])), {}).setdefault(r["method"], longctx.Score())
        sc.add(bool(r["ok"]))
    out = []
    for (set_name, model, length), methods in sorted(rows.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] != "inside",
                                                                                   int(kv[0][2]) if kv[0][2].isdigit() else 0)):
        trained = SETS["models"][model]["trained"]
        mult = "inside" if length == "inside" else f"{int(length) / trained:.1f}x"
        note, need = "", SETS["sets"][set_name].get("ceiling_min")
        if length != "inside" and need is not None:
            c = ceiling(passkey, set_name, model)
            note = (" (ceiling not measured)" if c.n == 0 else
                    f" (ceiling {c.k}/{c.n} < {need}: judges no method)" if ceiling_verdict(set_name, model, c) else "")
        out.append(f"| {set_name} | {model} | {length} ({mult}){note} | "
                   + " | ".join(f"{m}: {s}" for m, s in methods.items()) + " |")
    ppl: dict[tuple[str, str, int], dict[str, Any]] = {}
    for r in unique(records(dirs, "ppl.jsonl"), ppl_key):
        ppl.setdefault((r["set"], r["model"], r["ctx"]), {})[r["method"]] = r["ppl"]
    txt = "| set | model | length | method: exact first answers k/n [Wilson 95%] |\n|---|---|---|---|\n" + "\n".join(out)
    if ppl:
        txt += "\n\n| set | model | context | method: perplexity (every window) |\n|---|---|---|---|\n"
        txt += "\n".join(f"| {s} | {m} | {c} | " + " | ".join(f"{k}: {v:.4f}" if v else f"{k}: -" for k, v in meths.items()) + " |"
                         for (s, m, c), meths in sorted(ppl.items()))
    return txt + "\n"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("passkey", "ppl"):
        p = sub.add_parser(name)
        p.add_argument("--set", required=True, choices=sorted(SETS["sets"]))
        p.add_argument("--model", required=True, choices=sorted(SETS["models"]))
        p.add_argument("--methods", required=True)
        p.add_argument("--bin", required=True)
        p.add_argument("--models", required=True)
        p.add_argument("--texts", required=True)
        p.add_argument("--out", required=True)
        p.add_argument("--jobs", type=int, default=1)
        if name == "passkey":
            p.add_argument("--lengths", default="")
            p.add_argument("--trials", type=int, default=0)
        else:
            p.add_argument("--ctx", default="")
            p.add_argument("--chars", type=int, default=1_200_000)
    p = sub.add_parser("choose")
    p.add_argument("--set", required=True, help="a set of sets.yaml, or several joined by commas (dev,devfar)")
    p.add_argument("--model", required=True, choices=sorted(SETS["models"]))
    p.add_argument("--methods", required=True)
    p.add_argument("dirs", nargs="+")
    p = sub.add_parser("merge")
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--sets", default="", help="only the trials of these sets (comma-separated)")
    p = sub.add_parser("report")
    p.add_argument("dirs", nargs="+")
    p.add_argument("--md", default="")
    return ap.parse_args(argv)


def main() -> int:
    a = parse()
    if a.cmd == "passkey":
        return cmd_passkey(a)
    if a.cmd == "ppl":
        return cmd_ppl(a)
    if a.cmd == "choose":
        pick, why = choose(a.set, a.model, a.methods.split(","), [Path(d) for d in a.dirs])
        print(f"# {why}", file=sys.stderr)
        print(pick)
        return 0
    if a.cmd == "merge":
        sets = set(a.sets.split(",")) if a.sets else None
        unknown = sorted((sets or set()) - set(SETS["sets"]))
        if unknown:
            raise SystemExit(f"merge --sets: no set {', '.join(unknown)} in sets.yaml (there: {', '.join(sorted(SETS['sets']))})")
        added, dup = merge(Path(a.src), Path(a.dst), sets)
        print(f"{a.dst}: {added} trials added, {dup} already there")
        return 0
    txt = report([Path(d) for d in a.dirs])
    if a.md:
        Path(a.md).write_text(txt)
    print(txt)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
