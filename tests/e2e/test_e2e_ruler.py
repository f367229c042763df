"""The RULER gate for real, on the CPU: the clean room's llama-server (built by `dcaforge build
--targets llama-server`), the committed trained model tests/models/longctx-qwen2.gguf (qwen2 shape,
L = 256, byte-level vocabulary: a text is BOS + its bytes), plain / YaRN / DCA at 1x, 4x and 8x.

A 1.7M-parameter code model retrieves nothing, so what is asserted is the machinery: the server
round trip (its tokenizer is the byte-level one, greedy answers repeat, text and tokens give the
same answer), prompts that fit each context exactly and are the same for every method, prompts the
generator rebuilds byte for byte from the recorded seed and filler count, scores that are the
exact-match scores of the recorded answers against the known ones, a result per task and length
for each method, the table, and the figure."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_helpers import REPO, GateRun, dcaforge

from dcaforge import ruler
from dcaforge.gate.server import LlamaServer

MODEL = REPO / "tests" / "models" / "longctx-qwen2.gguf"
TASKS = ["passkey", "vt", "niah_multikey", "niah_multivalue"]


@pytest.fixture(scope="module")
def server_exe(cleanroom: Path) -> Path:
    p = dcaforge("build", "--targets", "llama-server")
    assert p.returncode == 0, p.stdout + p.stderr[-4000:]
    exe = cleanroom / "build" / "bin" / "llama-server"
    assert exe.is_file()
    return exe


def test_llama_server_round_trip(server_exe: Path, tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    with LlamaServer(server_exe, ["-m", str(MODEL), "-c", "1024", "-np", "1", "-t", "2", "--cache-ram", "0",
                                  "--no-webui", "--override-kv", "qwen2.context_length=int:1024"], log) as srv:
        assert srv.tokenize("def f(x):") == [256, *b"def f(x):"]
        prompt = ruler.generate("passkey", 42, 0, 8).prompt
        toks = srv.tokenize(prompt)
        assert len(toks) == 1 + len(prompt.encode())
        a = srv.completion(prompt, 24)
        b = srv.completion(toks, 24)
        c = srv.completion(toks, 24)
        assert a["content"] == b["content"] == c["content"]  # greedy, and text == its tokens
        assert a["tokens_evaluated"] == len(toks) and a["tokens_predicted"] <= 24
        assert srv.proc is not None
        pid = srv.proc.pid
    assert srv.proc is None  # stopped
    with pytest.raises(ProcessLookupError):
        import os
        os.kill(pid, 0)
    assert "--override-kv qwen2.context_length=int:1024 --host 127.0.0.1 --port" in log.read_text()


def test_ruler_gate_plain_yarn_dca(gate_run: GateRun) -> None:
    """The ruler gate of the session's one `dcaforge gate` run (conftest.gate_run; test_e2e_build_gate checks
    the other gates of that run)."""
    p, res, out = gate_run.proc, gate_run.results, gate_run.out
    (g,) = [g for g in res["gates"] if g["kind"] == "ruler"]
    assert g["kind"] == "ruler" and g["passed"] is True
    m = g["metrics"]
    assert m["trained"] == 256 and m["contexts"] == [256, 1024, 2048] and m["methods"] == ["plain", "yarn", "dca"]
    assert m["tasks"] == TASKS and (m["chunk"], m["local"]) == (192, 32)

    # one row per task and context, a score per method where the prompt fits
    pts = {(pt["task"], pt["ctx"]): pt for pt in g["points"]}
    assert sorted(pts) == sorted((t, c) for t in TASKS for c in (256, 1024, 2048))
    for t in TASKS:
        assert pts[(t, 256)]["tokens"] is None  # RULER's templates alone are longer than 256 bytes
        assert all(pts[(t, 256)][mm] is None for mm in m["methods"])
        row = pts[(t, 2048)]
        assert 1024 < row["tokens"] <= 2048
        for mm in m["methods"]:
            assert row[f"{mm}_n"] == 2 and 0.0 <= row[mm] <= 1.0 and 0.0 <= row[f"{mm}_all"] <= row[mm]
    for t in ("passkey", "niah_multikey", "niah_multivalue"):
        assert pts[(t, 1024)]["tokens"] is not None and pts[(t, 1024)]["dca"] is not None
    assert pts[("vt", 1024)]["tokens"] is None  # vt with RULER's solved example before the question: 1.7k bytes

    # every sample: the same prompt for every method, rebuilt byte for byte by the generator, filling its context
    recs = m["samples"]
    assert len(recs) == len(TASKS) * 3 * 3 * 2
    by_prompt: dict[tuple[str, int, int], set[str]] = {}
    for r in recs:
        if r.get("error") == "does not fit":
            continue
        assert "error" not in r, r
        by_prompt.setdefault((r["task"], r["ctx"], r["index"]), set()).add(r["prompt_sha256"])
        s = ruler.generate(r["task"], 42, r["index"], r["n_filler"], n_samples=2)
        assert ruler.sha256(s.prompt) == r["prompt_sha256"]
        assert list(s.expected) == r["expected"]
        n_predict = 40  # the config's
        assert r["prompt_tokens"] == 1 + len(s.prompt.encode()) == r["tokens_evaluated"]  # what the server evaluated
        assert r["prompt_tokens"] <= r["ctx"] - n_predict
        longer = ruler.generate(r["task"], 42, r["index"], r["n_filler"] + 1, n_samples=2)
        assert 1 + len(longer.prompt.encode()) > r["ctx"] - n_predict  # the longest that fits
        assert (r["score"], r["all"]) == ruler.score(r["expected"], r["answer"])
    assert by_prompt and all(len(v) == 1 for v in by_prompt.values())
    assert {k for k in by_prompt} == {(t, c, i) for t in TASKS for c in (1024, 2048) for i in (0, 1)} - {("vt", 1024, 0), ("vt", 1024, 1)}

    assert "does not fit" in p.stdout and "ruler: exact-match score" in p.stdout
    png = out / "gates.png"
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size < 150_000
    logs = sorted((out / "logs").glob("*-server-*.log"))
    assert len(logs) == 9 and all("--host 127.0.0.1" in f.read_text() for f in logs)
