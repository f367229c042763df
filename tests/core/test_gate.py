"""dcaforge gate without builds: reading llama-perplexity / llama-passkey output and GGUF headers,
the plot (and its absence without matplotlib), the points tables, and the errors that say which
build or model is missing."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dcaforge.cli import app
from dcaforge.config import parse_config
from dcaforge.configsections import GateConfig
from dcaforge.errors import GateError
from dcaforge.gate.gate import points_table, run_gates
from dcaforge.gate.ggufmeta import gguf_metadata
from dcaforge.gate.passkey import parse_passkey
from dcaforge.gate.perplexity import parse_perplexity
from dcaforge.gate.plot import plot
from dcaforge.gate.results import GateResult

from .helpers import minimal_config

PPL_OUT = """\
perplexity: tokenizing the input ..
perplexity: tokenization took 2.1 ms
perplexity: calculating perplexity over 1 chunks, n_ctx=512, batch_size=512, n_seq=1
perplexity: 0.41 seconds per pass - ETA 0.00 minutes
[1]523.2970,
Final estimate: PPL = 523.2970 +/- 21.04711
"""

PASSKEY_OUT = """\
main: n_len = 460, n_ctx = 480, n_kv_req = 512, n_grp = 1, n_batch = 2048, n_junk = 2, i_pos = 1
prefix tokens: 149
prompt tokens: 444
main: passkey = 39384, inserted at position 1 / 2 (token pos: ~222)

 What is the pass key? The pass key is 39384. Remember it. 39384 is the pass key.
"""


def test_parse_perplexity_and_passkey() -> None:
    assert parse_perplexity(PPL_OUT) == pytest.approx(523.297)
    assert parse_perplexity("perplexity: you need at least 1024 tokens to evaluate perplexity with a context of 512") is None
    assert parse_passkey(PASSKEY_OUT) == (39384, 39384)
    wrong = PASSKEY_OUT.replace("is 39384. Remember", "is 19384. Remember")
    assert parse_passkey(wrong) == (39384, 19384)
    assert parse_passkey(PASSKEY_OUT.replace("is 39384. Remember it. 39384 is the pass key.", "is the the the")) == (39384, None)


def test_gguf_metadata_of_a_tiny_model(tmp_path: Path) -> None:
    from dcaforge.gate.gatetools import tiny

    path = tiny.ensure(str(tmp_path), "qwen2")
    meta = gguf_metadata(Path(path))
    assert meta["general.architecture"] == "qwen2" and meta["qwen2.context_length"] == tiny.N_CTX_TRAIN
    assert gguf_metadata(Path(path), ["qwen2.context_length"]) == {"qwen2.context_length": tiny.N_CTX_TRAIN}
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGML" + bytes(20))
    with pytest.raises(GateError, match="not a GGUF file"):
        gguf_metadata(bad)


EXT = [{"ctx": 256, "ppl_plain": 10.0, "ppl_yarn": 10.5, "ppl_dca": 10.1, "passkey_plain": 1.0, "passkey_dca": 1.0},
       {"ctx": 1024, "ppl_plain": 40.0, "ppl_yarn": 14.0, "ppl_dca": 11.0, "passkey_plain": 0.0, "passkey_dca": None}]
RUL = [{"task": "vt", "ctx": 256, "tokens": None, "plain": None, "yarn": None, "dca": None},
       {"task": "vt", "ctx": 1024, "tokens": 990, "plain": 0.0, "yarn": 0.2, "dca": 0.6},
       {"task": "passkey", "ctx": 1024, "tokens": 1000, "plain": 0.0, "yarn": 0.5, "dca": 1.0}]


def test_plot_writes_a_small_png_with_every_panel(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from dcaforge.gate.plot import collect

    res = [GateResult("ext", "extension", True, "ok", {"trained": 256, "model": "m.gguf", "methods": ["plain", "yarn", "dca"]}, EXT),
           GateResult("rul", "ruler", True, "ok", {"trained": 256, "model": "m.gguf", "methods": ["plain", "yarn", "dca"]}, RUL),
           GateResult("off", "off-identity", True, "ok")]
    data, trained, nofit = collect(res)
    assert trained == {"m.gguf": 256} and sorted(data["m.gguf"]) == ["passkey", "perplexity", "vt"]
    assert nofit == {"m.gguf": {"vt": {256}}}  # the ruler row without tokens
    # one model, both gates' passkeys in one panel: the extension's at 256 and 1024 (DCA's 1024 not measured), the ruler's
    # 1024 (the later gate's point wins); a measured 0 stays a point at 0
    assert data["m.gguf"]["passkey"] == {"plain": {256: 1.0, 1024: 0.0}, "dca": {256: 1.0, 1024: 1.0}, "yarn": {1024: 0.5}}
    assert data["m.gguf"]["vt"] == {"plain": {1024: 0.0}, "yarn": {1024: 0.2}, "dca": {1024: 0.6}}
    assert data["m.gguf"]["perplexity"]["yarn"] == {256: 10.5, 1024: 14.0}
    out = plot(res, tmp_path / "g.png")
    assert out == tmp_path / "g.png" and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.stat().st_size < 150_000  # small enough to commit with the results
    assert plot(res[2:], tmp_path / "none.png") is None and not (tmp_path / "none.png").exists()


def test_plot_without_matplotlib_says_how_to_get_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    said: list[str] = []
    res = [GateResult("rul", "ruler", True, "ok", {"trained": 256, "model": "m"}, RUL)]
    assert plot(res, tmp_path / "g.png", said.append) is None and not (tmp_path / "g.png").exists()
    assert said and "pip install 'dcaforge[plots]'" in said[0]


def test_points_tables() -> None:
    t = points_table(GateResult("rul", "ruler", True, "ok", {"methods": ["plain", "yarn", "dca"]}, RUL))
    assert t is not None
    title, cols, rows = t
    assert cols == ["task", "context", "tokens", "plain rope", "YaRN", "DCA"]
    assert rows[0] == ["vt", "256", "-", "does not fit", "does not fit", "does not fit"]
    assert rows[1] == ["vt", "1024", "990", "0%", "20%", "60%"]
    title, cols, rows = points_table(GateResult("ext", "extension", True, "ok", {"methods": ["plain", "dca"]}, EXT))
    assert cols == ["context", "ppl plain rope", "ppl DCA", "passkey plain rope", "passkey DCA"]
    assert rows[1] == ["1024", "40", "11", "0%", "-"]
    assert points_table(GateResult("off", "off-identity", True, "ok")) is None


CONFIG = minimal_config()


def test_gate_errors_name_what_is_missing(tmp_path: Path) -> None:
    p = tmp_path / "dcaforge.yaml"
    p.write_text(CONFIG)
    with pytest.raises(GateError, match="declares no gates"):
        run_gates(parse_config(p))
    p.write_text(CONFIG + "gates:\n  - name: ext\n    kind: noop-below-chunk\n    recipe: tiny:qwen2\n")
    with pytest.raises(GateError) as ei:
        run_gates(parse_config(p), only=["nope"])
    assert "no gate named 'nope'" in ei.value.message and ei.value.hint == "gates: ext"
    r = CliRunner().invoke(app, ["gate", "-c", str(p)])
    assert r.exit_code == 1 and "no clean room" in r.output


def test_gate_json_shape(tmp_path: Path) -> None:
    """The JSON the CLI writes: passed, gates (name, kind, passed, summary, metrics, points, seconds, failures), plot."""
    from dcaforge.gate.results import GateReport

    rep = GateReport([GateResult("a", "off-identity", False, "logits differ", {"fa_on": {"identical": False}})],
                     tmp_path, tmp_path / "results.json", None)
    d = json.loads(json.dumps(rep.to_dict()))
    assert d["passed"] is False and d["plot"] is None
    assert d["gates"][0] == {"name": "a", "kind": "off-identity", "passed": False, "summary": "logits differ",
                             "metrics": {"fa_on": {"identical": False}}, "points": [], "seconds": 0.0, "failures": []}


def test_method_flags() -> None:
    from dcaforge.gate.options import method_flags

    assert method_flags("plain", 4096, 1024, 768, 128) == []
    assert method_flags("yarn", 4096, 1024, 768, 128) == ["--rope-scaling", "yarn", "--rope-scale", "4", "--yarn-orig-ctx", "1024"]
    assert method_flags("yarn", 512, 1024, 768, 128)[3] == "1"  # never below 1
    assert method_flags("yarn", 4096, 1024, 768, 128, yarn_factor=8)[3] == "8"
    assert method_flags("dca", 4096, 1024, 768, 128, ["--dca-yarn-factor", "4"]) == [
        "--dca", "on", "--dca-chunk-size", "768", "--dca-local-size", "128", "--dca-yarn-factor", "4"]


def test_ruler_server_args() -> None:
    """One list for measure_ruler and ruler_run.py replay: past the trained length the context length is overridden,
    inside it not; -t only when threads are given; extra args before the method's flags."""
    from dcaforge.gate.rulergate import ruler_server_args

    assert ruler_server_args(Path("m.gguf"), "dca", 4096, 1024, "llama", 512, 128, ["--dca-yarn-factor", "4"], ["-fa", "on"],
                             threads=8) == [
        "-m", "m.gguf", "-c", "4096", "-np", "1", "-t", "8", "--cache-ram", "0", "--no-webui", "-fa", "on",
        "--dca", "on", "--dca-chunk-size", "512", "--dca-local-size", "128", "--dca-yarn-factor", "4",
        "--override-kv", "llama.context_length=int:4096"]
    assert ruler_server_args("m.gguf", "yarn", 1024, 1024, "qwen2", 512, 128, yarn_factor=2) == [
        "-m", "m.gguf", "-c", "1024", "-np", "1", "--cache-ram", "0", "--no-webui",
        "--rope-scaling", "yarn", "--rope-scale", "2", "--yarn-orig-ctx", "1024"]
    assert ruler_server_args("m.gguf", "plain", 512, 1024, "llama", 0, 0, threads=4) == [
        "-m", "m.gguf", "-c", "512", "-np", "1", "-t", "4", "--cache-ram", "0", "--no-webui"]


def test_plot_draws_further_dca_settings_each_in_its_own_style(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A chunk/local grid: methods named dca-<setting> beside plain / YaRN / DCA, each its own label and colour, and a
    capped perplexity axis that writes the values above the cap."""
    pytest.importorskip("matplotlib")
    from dcaforge.gate.plot import STYLE, collect, labels, style

    pts = [{"ctx": 256, "ppl_plain": 10.0, "ppl_dca-S4w1": 10.2, "passkey_dca-S4w1": 0.5, "passkey_dca-S2w0.5": 0.0},
           {"ctx": 1024, "ppl_plain": 400.0, "ppl_dca-S4w1": 11.0, "ppl_dca-S2w0.5": 12.0, "passkey_dca-S4w1": 1.0}]
    res = [GateResult("grid", "extension", True, "", {"trained": 256, "model": "m", "methods": ["plain", "dca-S2w0.5", "dca-S4w1"]}, pts)]
    data, _, _ = collect(res)
    assert data["m"]["passkey"] == {"dca-S4w1": {256: 0.5, 1024: 1.0}, "dca-S2w0.5": {256: 0.0}}
    assert data["m"]["perplexity"]["dca-S2w0.5"] == {1024: 12.0}
    extras = ["dca-S2w0.5", "dca-S4w1"]
    a, b = style("dca-S2w0.5", extras), style("dca-S4w1", extras)
    assert (a[0], b[0]) == ("DCA S2w0.5", "DCA S4w1") and a[1] != b[1] and a[2] != b[2]
    assert {a[1], b[1]}.isdisjoint({s[1] for s in STYLE.values()})   # not the colours of plain, YaRN, DCA
    # a method the result does not name is not drawn (a ruler row's "dca_all" is not a method)
    unnamed = collect([GateResult("g", "extension", True, "", {"model": "m"}, [{"ctx": 1, "ppl_dca-S9w1": 1.0}])])[0]
    assert "dca-S9w1" not in unnamed.get("m", {}).get("perplexity", {})
    out = plot(res, tmp_path / "grid.png", title="grid", ppl_max=20.0)
    assert out is not None and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a result's metrics["labels"] names its methods in the legend; others keep style's; one legend per row
    named = [GateResult("grid", "extension", True, "", {**res[0].metrics, "labels": {"dca-S4w1": "DCA S4w1: 1/2, 1/8 of L"}}, pts)]
    assert labels(named) == {"m": {"dca-S4w1": "DCA S4w1: 1/2, 1/8 of L"}} and labels(res) == {}
    import matplotlib.pyplot as plt
    seen: list[list[str]] = []
    monkeypatch.setattr(plt.Figure, "savefig", lambda fig, *a, **k: seen.extend(
        [t.get_text() for t in ax.get_legend().get_texts()] for ax in fig.axes if ax.get_legend()))
    plot(named, tmp_path / "named.png", row_legend=True)
    assert seen == [["plain rope", "DCA S2w0.5", "DCA S4w1: 1/2, 1/8 of L"]]   # the row's last panel only


def test_a_perplexity_run_whose_output_was_lost_is_run_again() -> None:
    """llama.cpp's logger may lose a run's tail, even from before "perplexity: calculating" (CI, 2026-12-02): an exit 0
    without a figure is run again; a failed run or a text too short for the context is not."""
    from dcaforge.gate.perplexity import ppl_output_lost

    head = "llama_model_loader: loaded meta data\nsystem_info: n_threads = 2\n"
    assert ppl_output_lost(head, None, 0)
    assert ppl_output_lost(head + "perplexity: calculating perplexity over 1 chunks\n", None, 0)
    assert not ppl_output_lost(head + "[1]12.5,\nFinal estimate: PPL = 12.5000 +/- 1.2\n", 12.5, 0)
    assert not ppl_output_lost(head + "perplexity: you need at least 512 tokens to evaluate perplexity with a context of 256\n",
                               None, 0)
    assert not ppl_output_lost(head + "error: failed to load model\n", None, 1)


def test_perplexity_from_a_logits_file_and_its_malformed_forms(tmp_path: Path) -> None:
    """The --kl-divergence-base layout, written here by hand: two scored tokens of known log-probabilities."""
    import math
    import struct

    import numpy as np

    from dcaforge.gate.perplexity import perplexity_from_logits

    n_ctx, n_vocab = 6, 3                   # scored: positions 3 and 4 (the second half of the window, less the last)
    tokens = [0, 1, 2, 0, 2, 1]             # targets: tokens[4] = 2, tokens[5] = 1
    nv = 2 * ((n_vocab + 1) // 2) + 4       # 8 uint16 per scored token
    rows = []
    for tok, logp in ((2, -0.5), (1, -2.0)):
        scale, lo = 0.25, logp - 0.25 * 4   # level 4 of the target token gives logp
        head = np.array([scale, lo], dtype="<f4").view("<u2")
        levels = np.zeros(nv - 4, dtype="<u2")
        levels[tok] = 4
        rows.append(np.concatenate([head, levels]))
    blob = b"_logits_" + struct.pack("<iii", n_ctx, n_vocab, 1) + np.array(tokens, dtype="<i4").tobytes() + \
        np.concatenate(rows).astype("<u2").tobytes()
    f = tmp_path / "l.bin"
    f.write_bytes(blob)
    assert perplexity_from_logits(f) == pytest.approx(math.exp((0.5 + 2.0) / 2))
    f.write_bytes(blob[:-2])                # a row cut short
    assert perplexity_from_logits(f) is None
    f.write_bytes(b"_notlog_" + blob[8:])
    assert perplexity_from_logits(f) is None
    assert perplexity_from_logits(tmp_path / "missing.bin") is None


# --- the gate decides: thresholds per cell, vt inside L first ----------------------------------------------------------

def _ruler_gate(**options: object) -> GateConfig:
    return GateConfig("rul", "ruler", "dcaforge.yaml:9", model=Path("m.gguf"), options=options)


def _records(scores: dict[tuple[str, int, str], list[float | None]]) -> list[dict]:
    """Sample records as measure_ruler writes them: (task, ctx, method) -> the samples' scores (None: does not fit)."""
    out = []
    for (task, ctx, method), vals in scores.items():
        for i, v in enumerate(vals):
            rec = {"task": task, "ctx": ctx, "method": method, "index": i, "score": v}
            if v is None:
                rec["error"] = "does not fit"
            else:
                rec.update(prompt_tokens=ctx - 40, all=v == 1.0)
            out.append(rec)
    return out


def test_ruler_thresholds_fail_per_cell_and_name_it() -> None:
    from dcaforge.gate.rulergate import ruler_result

    recs = _records({("niah_multikey", 256, "plain"): [1.0, 1.0], ("niah_multikey", 256, "yarn"): [1.0, 1.0],
                     ("niah_multikey", 256, "dca"): [1.0, 1.0],
                     ("niah_multikey", 1024, "plain"): [0.0, 0.0], ("niah_multikey", 1024, "yarn"): [0.5, 0.5],
                     ("niah_multikey", 1024, "dca"): [1.0, 1.0],
                     ("niah_multikey", 2048, "plain"): [0.0, 0.0], ("niah_multikey", 2048, "yarn"): [0.5, 1.0],
                     ("niah_multikey", 2048, "dca"): [0.5, 0.0]})
    args = (256, [256, 1024, 2048], ["plain", "yarn", "dca"], ["niah_multikey"], recs, 128, 32)
    # the mean past L (0.625) passes score_min 0.5; the cell at 2048 (0.25) does not: the cell is named
    res = ruler_result(_ruler_gate(score_min=0.5, yarn_margin=0.0), *args)
    assert not res.passed
    assert [(f["gate"], f["task"], f["ctx"], f["method"], f["rule"]) for f in res.failures] == [
        ("rul", "niah_multikey", 2048, "dca", "score_min"), ("rul", "niah_multikey", 2048, "dca", "yarn_margin")]
    assert res.failures[0]["score"] == 0.25 and res.failures[0]["threshold"] == 0.5
    assert res.failures[0]["text"] == "rul: niah_multikey at 2048 tokens: DCA 0.25 < score_min 0.5"
    assert res.failures[1]["text"] == "rul: niah_multikey at 2048 tokens: DCA 0.25 < YaRN 0.75 + yarn_margin 0"
    assert "niah_multikey at 2048 tokens: DCA 0.25 < score_min 0.5" in res.summary
    # the cells inside L are not judged; without thresholds nothing fails
    assert ruler_result(_ruler_gate(score_min=0.2), *args).passed
    res = ruler_result(_ruler_gate(), *args)
    assert res.passed and res.failures == [] and "no thresholds set" in res.summary
    # no DCA score past L at all (every prompt too long) is a failure of score_min, not a pass
    none = _records({("niah_multikey", 1024, m): [None, None] for m in ("yarn", "dca")})
    res = ruler_result(_ruler_gate(score_min=0.5), 256, [1024], ["yarn", "dca"], ["niah_multikey"], none, 128, 32)
    assert not res.passed and res.failures[0]["text"] == "rul: niah_multikey: no DCA score past 256"


def test_ruler_vt_is_not_measurable_when_plain_scores_0_inside_l() -> None:
    from dcaforge.gate.rulergate import VT_NOT_MEASURABLE, ruler_result

    past = {("vt", 1024, "yarn"): [0.0, 0.0], ("vt", 1024, "dca"): [0.0, 0.0],
            ("niah_multikey", 1024, "yarn"): [0.0, 0.5], ("niah_multikey", 1024, "dca"): [1.0, 1.0]}
    g = _ruler_gate(score_min=0.5, yarn_margin=0.0)
    # vt 0 inside L (the vt check: plain at L = 256): vt is left out of the thresholds, and says why
    recs = _records({("vt", 256, "plain"): [0.0, 0.0], **past})
    res = ruler_result(g, 256, [256, 1024], ["yarn", "dca"], ["vt", "niah_multikey"], recs, 128, 32)
    assert res.passed, res.summary
    assert VT_NOT_MEASURABLE in res.summary and res.metrics["vt_measurable"] is False
    assert VT_NOT_MEASURABLE == "vt: not measurable on this model (0 inside its trained window)"
    assert res.metrics["methods"] == ["plain", "yarn", "dca"]          # the vt check's plain row is shown
    assert {(p["task"], p["ctx"]) for p in res.points} == {("vt", 256), ("vt", 1024), ("niah_multikey", 1024)}
    # a model that does vt inside L keeps vt: DCA's 0 past L fails, named
    recs = _records({("vt", 256, "plain"): [0.4, 0.0], **past})
    res = ruler_result(g, 256, [256, 1024], ["yarn", "dca"], ["vt", "niah_multikey"], recs, 128, 32)
    assert not res.passed and res.metrics["vt_measurable"] is True
    assert [f["text"] for f in res.failures] == ["rul: vt at 1024 tokens: DCA 0.00 < score_min 0.5"]
    # no vt prompt fits inside L: nothing is known, vt is kept
    recs = _records({("vt", 256, "plain"): [None, None], **past})
    res = ruler_result(g, 256, [256, 1024], ["yarn", "dca"], ["vt", "niah_multikey"], recs, 128, 32)
    assert not res.passed and res.metrics["vt_measurable"] is None


def test_ruler_runs_vt_inside_l_first_and_skips_it_past_l_at_0() -> None:
    from dcaforge.gate.rulergate import ruler_job_tasks, ruler_jobs, vt_inside_score

    tasks = ["vt", "niah_multikey"]
    # no context inside L with plain: a plain server at L runs vt alone, first
    jobs = ruler_jobs([524288, 1048576], ["yarn", "dca"], tasks, 32768)
    assert jobs == [(32768, "plain", True), (524288, "yarn", False), (524288, "dca", False), (1048576, "yarn", False),
                    (1048576, "dca", False)]
    assert ruler_job_tasks(tasks, 32768, 32768, True, None) == ["vt"]
    # L among the contexts with plain: that is the check, no extra server; the contexts run in ascending order
    assert ruler_jobs([1024, 256], ["plain", "dca"], tasks, 256) == [(256, "plain", False), (256, "dca", False),
                                                                     (1024, "plain", False), (1024, "dca", False)]
    assert ruler_jobs([1024], ["dca"], ["niah_multikey"], 256) == [(1024, "dca", False)]           # no vt, no check
    assert ruler_jobs([1024], ["dca"], tasks, 256, vt_probe=False) == [(1024, "dca", False)]        # turned off
    # vt scored 0 inside L: past L vt is not run; a positive score or no fitting prompt keeps it
    zero = [{"task": "vt", "ctx": 256, "method": "plain", "score": 0.0}] * 2
    assert vt_inside_score(zero, 256) == 0.0
    assert ruler_job_tasks(tasks, 1024, 256, False, vt_inside_score(zero, 256)) == ["niah_multikey"]
    assert ruler_job_tasks(tasks, 256, 256, False, 0.0) == tasks
    assert ruler_job_tasks(tasks, 1024, 256, False, 0.2) == tasks
    assert ruler_job_tasks(tasks, 1024, 256, False, None) == tasks
    assert vt_inside_score([{"task": "vt", "ctx": 256, "method": "plain", "score": None}], 256) is None
