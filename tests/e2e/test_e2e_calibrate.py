"""`dcaforge calibrate` end to end on the committed trained model (tests/models/longctx-qwen2.gguf: qwen2, byte-level,
L = 256), through the clean room's llama-server (the `serve_tree` build) as a user runs it: `-c CONFIG` and nothing
else about the build (the server is the room's, the dev text the room's llama.cpp sources, the held-out text Python's
standard library source), tiny trial counts and two chunk sizes; the dev perplexity when the room's build has llama-perplexity.
The copy is written next to the work folder with the pick's
sizes and temperature, the input is unchanged, and `--dca on` alone on the copy logs that DCA takes "the model's own"
sizes (and temperature, when the pick has one) from the GGUF (llama_dca_resolve in the 0078 C++)."""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

from e2e_helpers import REPO, WORKSPACE, LlamaServer, dcaforge

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from dcaforge.gate import calibrate  # noqa: E402

MODEL = REPO / "tests" / "models" / "longctx-qwen2.gguf"
LOGS = WORKSPACE / "logs" / "calibrate"


def test_calibrate_writes_a_copy_that_dca_on_alone_uses(serve_tree, tmp_path: Path) -> None:
    before = hashlib.sha256(MODEL.read_bytes()).hexdigest()
    out = tmp_path / "longctx.dca.gguf"
    t0 = time.monotonic()
    # the model as a path relative to the working directory (the repository), as a user types it
    p = dcaforge("calibrate", str(MODEL.relative_to(REPO)), "-o", str(out), "--chunks", "64,128", "--dev-trials", "2",
                 "--heldout-trials", "2", "--far", "2560", "--far-trials", "1", "--far-heldout-trials", "1",
                 "--server-args", "-t 2 -fa on", "--json")
    seconds = time.monotonic() - t0
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    assert hashlib.sha256(MODEL.read_bytes()).hexdigest() == before
    rep = json.loads(p.stdout)
    assert rep["plan"]["candidates"] == ["dca:64:8", "dca:128:16", "dca:128:16:len"]   # the size nearest L/2 with the temperature
    assert rep["plan"]["dev_lengths"] == [640, 1280] and rep["plan"]["heldout_lengths"] == [768, 1536]
    pick = rep["choice"]["pick"]
    chunk, local, temp = rep["choice"]["chunk_size"], rep["choice"]["local_size"], rep["choice"]["temperature"]
    assert pick == f"dca:{chunk}:{local}" + (":len" if temp == "len" else "") and chunk in (64, 128) and temp in ("off", "len")
    for m in ("dca:64:8", "dca:128:16", "dca:128:16:len"):
        assert rep["dev"][m]["total"]["n"] == 4
    # --far 2560: the dev rule's two best at 0.95 x 2560 tokens (one trial each, the same prompt), the pick among
    # them; the pick at 2560 on the held-out text
    far = rep["far"]
    assert far["dev_length"] == 2432 and far["heldout_length"] == 2560 and len(far["dev"]) == 2 and pick in far["dev"]
    assert all(v["n"] == 1 for v in far["dev"].values()) and far["heldout"]["n"] == 1
    best = max(v["k"] for v in far["dev"].values())
    assert far["dev"][pick]["k"] == best and "at 2432 tokens" in rep["choice"]["why"]
    assert f"; at 2560 tokens {far['heldout']['k']}/1 [" in rep["verdict"], rep["verdict"]
    # L = 256 bytes: a prompt inside L (230) has no room beside the question and the needle, so neither text's ceiling
    # is measured (said in the notes) and the held-out cells run as before
    assert rep["ceilings"] == {} and sum("ceiling was not measured" in n for n in rep["notes"]) == 2, rep["notes"]
    assert set(rep["heldout"]) == {pick, "yarn"} and rep["heldout"]["yarn"]["total"]["n"] == 4
    assert rep["gguf"]["trained"] == 256 and rep["gguf"]["chunk"] is None
    if serve_tree.bin("llama-perplexity").exists():   # built by the room's other tests (dca_tree): the dev perplexity
        assert all(v is not None and v > 1 for v in rep["dev_perplexity"].values()), rep["dev_perplexity"]
    else:
        assert any("no llama-perplexity" in n for n in rep["notes"]), rep["notes"]
    # every trial recorded, each prompt exactly its length (the needle's depth inside it)
    work = Path(rep["work"])
    trials = [json.loads(line) for line in (work / "trials.jsonl").read_text().splitlines()]
    assert len(trials) == 23 and all(0 < t["depth"] < 1 for t in trials)
    assert sorted(t["length"] for t in trials if t["length"] > 2000) == [2432, 2432, 2560]
    assert len({t["key"] for t in trials if t["set"] == "calibrate-dev"}) >= 3   # a fresh key per trial
    assert (work / "report.json").is_file() and (work / "sweep.png").is_file()
    info = calibrate.inspect_gguf(out)
    assert (info.chunk, info.local) == (chunk, local)
    # --dca on and nothing else: the GGUF's sizes and its temperature
    log = _dca_on_log(serve_tree, out, "dca-on.log")
    assert f"chunk size S = {chunk}, local window w = {local}" in log, log[-3000:]
    assert ("the model's own: qwen2.attention.dual_chunk.chunk_size, qwen2.attention.dual_chunk.local_size") in log
    assert ("by the prompt's length (len, the model's own: qwen2.attention.dual_chunk.temperature" in log) == (temp == "len"), log[-3000:]
    print(f"calibrate: {seconds:.1f} s, pick {pick}, {rep['verdict']}")
    _resume(out, rep, trials)


def _resume(out: Path, rep: dict, trials: list[dict]) -> None:
    """--resume after a run that lost its last three records and left half a line (killed while writing): the
    twenty whole records are taken again, the rest measured, the pick the same."""
    work = Path(rep["work"])
    lines = (work / "trials.jsonl").read_text().splitlines()
    (work / "trials.jsonl").write_text("\n".join(lines[:20]) + "\n" + lines[20][:25])
    p = dcaforge("calibrate", str(MODEL), "-o", str(out), "--force", "--chunks", "64,128", "--dev-trials", "2",
                 "--heldout-trials", "2", "--far", "2560", "--far-trials", "1", "--far-heldout-trials", "1",
                 "--server-args", "-t 2 -fa on", "--resume", "--json")
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    again = json.loads(p.stdout)
    assert any(n.startswith("--resume: 20 trials and ") and n.endswith("; 1 unreadable records dropped")
               for n in again["notes"]), again["notes"]
    assert again["dev"] == rep["dev"] and again["far"]["dev"] == rep["far"]["dev"] and again["choice"] == rep["choice"]
    assert again["dev_perplexity"] == rep["dev_perplexity"]
    now = [json.loads(line) for line in (work / "trials.jsonl").read_text().splitlines()]
    assert now[:20] == trials[:20] and len(now) == 23
    assert [(t["set"], t["method"], t["length"], t["index"], t["key"]) for t in now[20:]] == \
        [(t["set"], t["method"], t["length"], t["index"], t["key"]) for t in trials[20:]]


def _dca_on_log(serve_tree, model: Path, name: str, *extra: str) -> str:
    LOGS.mkdir(parents=True, exist_ok=True)
    args = ["-m", model, "-c", "1024", "--parallel", "1", "-t", "2", "--no-warmup", "-lv", "4", "--dca", "on", *extra]
    with LlamaServer(serve_tree.bin("llama-server"), args, LOGS / name) as srv:
        status, _ = srv.request("POST", "/completion", {"prompt": [256, *b"int main(void) {"], "n_predict": 2})
        assert status == 200
        return srv.output()


def test_the_copy_s_temperature_is_what_dca_on_alone_uses(serve_tree, tmp_path: Path) -> None:
    """A copy whose dual_chunk.temperature is len (what calibrate writes when its pick has the temperature) or pos:
    --dca on alone runs that temperature, naming the key; --dca-yarn-factor 0 turns it off; a copy with off, or the
    original without the key, runs none."""
    pos, off, by_len = tmp_path / "pos.gguf", tmp_path / "off.gguf", tmp_path / "len.gguf"
    calibrate.write_dca_copy(MODEL, by_len, 128, 16, "len")
    assert "by the prompt's length (len, the model's own: qwen2.attention.dual_chunk.temperature" in _dca_on_log(
        serve_tree, by_len, "temp-len.log")
    calibrate.write_dca_copy(MODEL, pos, 128, 16, "pos")
    calibrate.write_dca_copy(MODEL, off, 128, 16, "off")
    own = "by position (pos, the model's own: qwen2.attention.dual_chunk.temperature"
    assert own in _dca_on_log(serve_tree, pos, "temp-pos.log")
    log = _dca_on_log(serve_tree, pos, "temp-pos-0.log", "--dca-yarn-factor", "0")
    assert own not in log and "attention temperature off" in log, log[-3000:]
    for m, name in ((off, "temp-off.log"), (MODEL, "temp-none.log")):
        log = _dca_on_log(serve_tree, m, name)
        assert "attention temperature off" in log and "by position" not in log, log[-3000:]


def test_calibrate_on_a_model_that_cannot_be_searched(serve_tree, tmp_path: Path) -> None:
    """A model that cannot find the key inside its own window (random weights, L = 1024): both texts' ceilings fail
    (plain attention at 0.9 L), so the dev answers rank nothing (the pick is the lowest dev perplexity, else the
    larger S), the held-out cells are not run and the verdict says the held-out text cannot judge; the copy is
    still written with the pick."""
    from dcaforge.gate.gatetools import tiny

    model = tmp_path / "random-qwen2.gguf"
    tiny.build("qwen2", str(model), n_ctx_train=1024)
    out = tmp_path / "random.dca.gguf"
    p = dcaforge("calibrate", str(model), "-o", str(out), "--chunks", "128,256", "--dev-trials", "1",
                 "--heldout-trials", "1", "--no-temperature", "--server-args", "-t 2 -fa on", "--json")
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    rep = json.loads(p.stdout)
    assert rep["plan"]["inside"] == 921
    for which in ("dev", "heldout"):
        c = rep["ceilings"][which]
        assert c["n"] == 2 and c["k"] < 2 and c["holds"] is False, rep["ceilings"]
    assert any("the dev answers cannot rank the settings" in n for n in rep["notes"]), rep["notes"]
    assert rep["verdict"].startswith("held-out: cannot judge: plain attention inside L (921 tokens)"), rep["verdict"]
    assert all(cell["total"]["n"] == 0 for cell in rep["heldout"].values())
    ppl = {m: v for m, v in rep["dev_perplexity"].items() if v is not None}
    want = min(ppl, key=lambda m: ppl[m]) if ppl else "dca:256:32"
    assert rep["choice"]["pick"] == want, (rep["choice"], ppl)
    trials = [json.loads(line) for line in (Path(rep["work"]) / "trials.jsonl").read_text().splitlines()]
    assert len(trials) == 2 + 4 + 2 and sum(t["method"] == "plain" for t in trials) == 4
    assert calibrate.inspect_gguf(out).chunk == rep["choice"]["chunk_size"]


def test_calibrate_refuses_a_far_length_before_anything_runs(serve_tree, tmp_path: Path) -> None:
    """--far must lie past the held-out lengths (6 L): refused with what, where and what next, before a text loads
    or a server starts; no output, no work folder."""
    out = tmp_path / "far.dca.gguf"
    p = dcaforge("calibrate", str(MODEL), "-o", str(out), "--far", "1000")
    assert p.returncode == 1, p.stdout[-2000:] + p.stderr[-2000:]
    assert "--far 1000: the length you will serve must lie past the held-out lengths (768, 1536 tokens" in p.stderr, p.stderr
    assert "--far 1048576" in p.stderr and "Traceback" not in p.stderr
    assert not out.exists() and not (tmp_path / "far.dca.calibrate").exists()


def test_a_calibrated_copy_answers_as_the_measured_flags(serve_tree, tmp_path: Path) -> None:
    """bench/longctx/keys_equal.py on the trained tiny model: the copy with `--dca on` alone and the original with
    the pick's flags (chunk, local, the temperature by the prompt's length) give the same answers and the same top
    probabilities for every generated token, past L (700 tokens, L = 256)."""
    import subprocess

    p = subprocess.run([sys.executable, str(REPO / "bench" / "longctx" / "keys_equal.py"), "--server",
                        str(serve_tree.bin("llama-server")), "--model", str(MODEL), "--text", str(REPO / "docs" / "dca.md"),
                        "--method", "dca:128:16:len", "--length", "700", "--trials", "2", "--work", str(tmp_path / "w"),
                        "--args", "-t 2 -lv 4"], capture_output=True, text=True, timeout=600, check=False)
    assert p.returncode == 0 and "EQUAL 2/2" in p.stdout, p.stdout[-3000:] + p.stderr[-3000:]
    assert "the model's own: qwen2.attention.dual_chunk.chunk_size" in p.stdout, p.stdout[-3000:]
    assert MODEL.read_bytes()[:4] == b"GGUF"
