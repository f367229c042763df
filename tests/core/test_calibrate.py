"""``dcaforge calibrate`` on the CPU, without a llama.cpp build: its refusals (a file that is not a GGUF or is cut
short, a model DCA cannot serve, no build, an output that exists or is the input), each through the real command line
with a message that says what, where and what next, exit 1, no traceback and the input's bytes unchanged; the copy of
the GGUF (the two dual_chunk keys set, every other key and every tensor byte as it was, a quantized tensor and a custom
alignment included); the plan (candidates and lengths); the selection rule the bench and calibrate share
(dcaforge.gate.longctx.choose) on synthetic records, through bench/longctx/run.py too; and the report's figure and JSON.

The sweep itself (llama-server answering trials) is tests/e2e/test_e2e_calibrate.py."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from dcaforge.cli import app
from dcaforge.errors import CalibrateError
from dcaforge.gate import calibrate as cal
from dcaforge.gate import longctx
from dcaforge.gate.calibrate_gguf import verify_copy
from dcaforge.gate.calibrate_plan import MAX_FAR
from dcaforge.gate.gatetools import tiny

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "tests" / "models" / "longctx-qwen2.gguf"
runner = CliRunner()


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fake_server(tmp: Path, dca: bool) -> Path:
    """A program that answers --help like a llama-server (with or without --dca) and does nothing else."""
    exe = tmp / ("llama-server-dca" if dca else "llama-server-plain")
    exe.write_text("#!/bin/sh\necho 'usage: llama-server [options]'\necho '  -c, --ctx-size N'\n"
                   + ("echo '  --dca on|off   dual chunk attention'\n" if dca else ""))
    exe.chmod(0o755)
    return exe


def cli(*args: str) -> tuple[int, str]:
    r = runner.invoke(app, ["calibrate", *args])
    return r.exit_code, r.output


def refused(model: Path, *args: str, out: Path | None = None) -> str:
    """The command's output for a refusal: exit 1, error / where / next, no traceback; ``model`` unchanged and no
    output written."""
    before = sha(model) if model.is_file() else None
    out = out or cal.default_out(model)
    existed = out.exists()
    code, text = cli(str(model), *args)
    assert code == 1, text
    assert "error:" in text and "next:" in text and "Traceback" not in text, text
    assert (sha(model) if model.is_file() else None) == before
    assert out.exists() == existed
    return text


# --- refusals -----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["text", "empty", "cut-in-header", "cut-in-tensors", "cut-by-one-byte", "folder", "missing"])
def test_refuses_a_file_that_is_not_a_whole_gguf(tmp_path: Path, case: str) -> None:
    data = MODEL.read_bytes()
    m = tmp_path / "m.gguf"
    if case == "text":
        m.write_text("this is not a model\n")
    elif case == "empty":
        m.write_bytes(b"")
    elif case == "cut-in-header":
        m.write_bytes(data[:3000])
    elif case == "cut-in-tensors":
        m.write_bytes(data[: len(data) // 2])
    elif case == "cut-by-one-byte":
        m.write_bytes(data[:-1])
    elif case == "folder":
        m.mkdir()
    text = refused(m, "--server", str(fake_server(tmp_path, True)))
    want = {"text": "is not a GGUF file", "empty": "is not a GGUF file", "cut-in-header": "truncated",
            "cut-in-tensors": "truncated", "cut-by-one-byte": "truncated", "folder": "is not a file",
            "missing": "does not exist"}[case]
    assert want in text and str(m) in text, text


def _other_arch(path: Path) -> Path:
    """A tiny GGUF of an architecture 0078 does not hook (phi3): tiny's qwen2 model's tensors, another name."""
    src = gguf.GGUFReader(tiny.build("qwen2", str(path.with_suffix(".src.gguf"))))
    w = gguf.GGUFWriter(path, "phi3")
    w.add_context_length(256)
    for t in src.tensors:
        w.add_tensor(t.name, np.asarray(t.data))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize(("arch", "want"), [
    ("phi3", "architecture 'phi3' is not one DCA serves (supported: gemma4, gemma3, qwen2, qwen3, qwen3moe, llama)"),
    ("llama+alibi", "architecture 'llama' uses ALiBi position biases (llama.attention.max_alibi_bias = 8)"),
    ("mpt", "architecture 'mpt' uses ALiBi position biases"),
    ("gpt-oss", "architecture 'gpt-oss' uses attention sinks (blk.0.attn_sinks.weight)"),
    ("deepseek2", "architecture 'deepseek2' uses multi-head latent attention (MLA: blk.0.attn_kv_a_mqa.weight)"),
    ("t5", "architecture 't5' uses relative position biases added to KQ"),
])
def test_refuses_a_model_dca_cannot_serve(tmp_path: Path, arch: str, want: str) -> None:
    from tests.models import unsupported

    m = tmp_path / "m.gguf"
    if arch == "phi3":
        _other_arch(m)
    elif arch == "llama+alibi":
        tiny.build("llama", str(m), kv={"{arch}.attention.max_alibi_bias": 8.0})
    else:
        unsupported.build(arch, str(m))
    text = refused(m, "--server", str(fake_server(tmp_path, True)))
    assert want in text, text
    assert "--dca off" in text  # what to do instead


def test_refuses_without_a_build(tmp_path: Path) -> None:
    m = tmp_path / "m.gguf"
    m.write_bytes(MODEL.read_bytes())
    # --server that is not there
    text = refused(m, "--server", str(tmp_path / "nowhere" / "llama-server"))
    assert "no llama-server at" in text and "dcaforge build" in text and "--server" in text, text
    # the clean room's build, when there is none: the config's room has no build/bin/llama-server
    cfg = tmp_path / "dcaforge.yaml"
    data = yaml.safe_load((REPO / "examples" / "upstream.yaml").read_text())
    data.update(root=str(REPO), cleanroom=str(tmp_path / "rooms"), gates=[])
    cfg.write_text(yaml.safe_dump(data))
    code, text = cli(str(m), "-c", str(cfg), "--dev-text", str(REPO / "docs" / "workflow.md"))
    assert code == 1 and "no llama-server at" in text and "the clean room's build" in text, text
    assert f"`dcaforge build --targets \"llama-server llama-perplexity\" -c {cfg}`" in text, text
    # a llama-server without the feature
    text = refused(m, "--server", str(fake_server(tmp_path, False)))
    assert "does not know --dca: it was not built with 0078-dca" in text, text


def test_refuses_an_output_that_exists_or_is_the_input(tmp_path: Path) -> None:
    m = tmp_path / "m.gguf"
    m.write_bytes(MODEL.read_bytes())
    srv = fake_server(tmp_path, True)
    out = tmp_path / "m.dca.gguf"
    out.write_bytes(b"the user's file")
    text = refused(m, "--server", str(srv), out=out)
    assert f"the output {out} exists" in text and "--force" in text, text
    assert out.read_bytes() == b"the user's file"
    for same in (str(m), str(tmp_path / "." / "m.gguf")):
        text = refused(m, "--server", str(srv), "-o", same, "--force", out=m)
        assert "is the input model" in text, text
    link = tmp_path / "link.gguf"
    link.symlink_to(m)
    text = refused(m, "--server", str(srv), "-o", str(link), "--force", out=link)
    assert "is the input model" in text, text
    # --force gets past the output's check: the next refusal is the texts' (no room here, no --dev-text)
    text = refused(m, "--server", str(srv), "--force", "--dev-text", str(tmp_path / "none.txt"), out=out)
    assert "the dev text" in text and "cannot be read" in text, text
    assert out.read_bytes() == b"the user's file"


def test_refuses_a_context_too_long_for_max_tokens() -> None:
    info = cal.inspect_gguf(MODEL)
    with pytest.raises(CalibrateError, match="leaves no room past the trained context L = 256"):
        cal.plan(info, max_tokens=500)
    with pytest.raises(CalibrateError, match=r"chunk size 300 is outside \(16, L = 256\]"):
        cal.plan(info, chunks=(64, 300))


# --- the copy -------------------------------------------------------------------------------------------------------------

def _model_with_quant_and_alignment(path: Path) -> Path:
    """A GGUF of gemma3 shape: an f32 tensor, a Q8_0 tensor (stored as bytes), alignment 64, its own dual_chunk
    chunk size (which the copy replaces), a string array and a float."""
    w = gguf.GGUFWriter(path, "gemma3")
    w.add_custom_alignment(64)
    w.add_context_length(32768)
    w.add_uint32("gemma3.attention.dual_chunk.chunk_size", 999)
    w.add_float32("gemma3.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_array("tokenizer.ggml.tokens", ["a", "b", "<s>"])
    rng = np.random.default_rng(5)
    w.add_tensor("output_norm.weight", rng.standard_normal(96).astype(np.float32))
    q = gguf.quants.quantize(rng.standard_normal((4, 64)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("token_embd.weight", q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("which", ["longctx-qwen2", "gemma3-q8_0-align64"])
def test_copy_sets_the_dca_keys_and_keeps_every_other_key_and_tensor_byte(tmp_path: Path, which: str) -> None:
    """The copy: chunk_size and local_size (uint32) and temperature (a string), every other key, the alignment and
    every tensor byte as in the source, which is only read; a copy of a copy says its own calibration's temperature."""
    src = MODEL if which == "longctx-qwen2" else _model_with_quant_and_alignment(tmp_path / "src.gguf")
    before = sha(src)
    dst = tmp_path / "out.gguf"
    temp = "pos" if which == "longctx-qwen2" else "off"
    res = cal.write_dca_copy(src, dst, 4096, 512, temp)
    assert sha(src) == before and res.temperature == temp
    a, b = gguf.GGUFReader(src), gguf.GGUFReader(dst)
    arch = a.fields["general.architecture"].contents()
    keys = {f"{arch}.attention.dual_chunk.chunk_size": 4096, f"{arch}.attention.dual_chunk.local_size": 512,
            f"{arch}.attention.dual_chunk.temperature": temp}
    for k, v in keys.items():
        want = gguf.GGUFValueType.STRING if isinstance(v, str) else gguf.GGUFValueType.UINT32
        assert b.fields[k].types == [want] and b.fields[k].contents() == v
    again = tmp_path / "again.gguf"
    cal.write_dca_copy(dst, again, 2048, 256, "chunk")
    assert gguf.GGUFReader(again).fields[f"{arch}.attention.dual_chunk.temperature"].contents() == "chunk"
    with pytest.raises(ValueError, match="temperature"):
        cal.write_dca_copy(src, tmp_path / "bad.gguf", 4096, 512, "auto")
    assert not (tmp_path / "bad.gguf").exists()
    fa = {f.name: (f.types, f.contents()) for f in a.fields.values() if not f.name.startswith("GGUF.") and f.name not in keys}
    fb = {f.name: (f.types, f.contents()) for f in b.fields.values() if not f.name.startswith("GGUF.") and f.name not in keys}
    assert fa == fb
    assert a.alignment == b.alignment == (64 if which != "longctx-qwen2" else 32)
    assert [t.name for t in a.tensors] == [t.name for t in b.tensors] and len(a.tensors) == res.n_tensors
    for ta, tb in zip(a.tensors, b.tensors, strict=True):
        assert ta.tensor_type == tb.tensor_type and list(ta.shape) == list(tb.shape)
        assert np.asarray(ta.data).tobytes() == np.asarray(tb.data).tobytes(), ta.name
        assert int(tb.data_offset) % b.alignment == 0
    info = cal.inspect_gguf(dst)
    assert (info.chunk, info.local) == (4096, 512)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.gguf.tmp")]


def test_copy_is_checked_by_reading_it_back(tmp_path: Path) -> None:
    """verify_copy catches a copy whose tensor bytes differ from the source's (one byte flipped)."""
    dst = tmp_path / "out.gguf"
    cal.write_dca_copy(MODEL, dst, 128, 16)
    r = gguf.GGUFReader(dst)
    off = int(r.tensors[3].data_offset) + 5
    del r
    data = bytearray(dst.read_bytes())
    data[off] ^= 0xFF
    dst.write_bytes(bytes(data))
    keys = {"qwen2.attention.dual_chunk.chunk_size": 128, "qwen2.attention.dual_chunk.local_size": 16}
    with pytest.raises(CalibrateError, match="does not read back as written") as exc:
        verify_copy(MODEL, dst, keys)
    assert "(bytes)" in (exc.value.details or "")
    with pytest.raises(CalibrateError, match="does not read back as written") as exc:
        verify_copy(MODEL, dst, {**keys, "qwen2.attention.dual_chunk.chunk_size": 64})
    assert "qwen2.attention.dual_chunk.chunk_size" in (exc.value.details or "")


# --- the plan -------------------------------------------------------------------------------------------------------------

def test_plan_candidates_and_lengths() -> None:
    def info(L: int, chunk: int | None = None) -> cal.GgufInfo:
        return cal.GgufInfo(MODEL, 0, "gemma3", L, L, "gemma3.context_length", chunk, None, 0, 0)

    p = cal.plan(info(32768))   # gemma-3-270m: L/16 .. L/2, w = S/8, temperature off; L/2 with the temperature by length
    assert p.candidates == ("dca:2048:256", "dca:4096:512", "dca:8192:1024", "dca:16384:2048", "dca:16384:2048:len")
    assert p.dev_lengths == (81920, 163840) and p.heldout_lengths == (98304, 196608)
    # plus each text's ceiling: plain attention inside L (0.9 L), as many trials as a candidate gets
    assert p.inside == 29491 and p.ceiling_trials == (20, 20)
    assert p.total_trials == 5 * 2 * 10 + 2 * 2 * 10 + 20 + 20 and p.slack == 2 and p.ppl_ctx == 81920
    assert p.estimate_seconds <= 15 * 60   # the budget for a 270M model on one H100, at 3 s per 100k tokens
    assert p.far_dev is None and p.finalists == 0 and p.dev_longest == 163840 and p.heldout_longest == 196608
    assert cal.plan(info(32768), temperature=False).candidates == p.candidates[:4]
    assert cal.plan(info(8192)).candidates == ("dca:512:64", "dca:1024:128", "dca:2048:256", "dca:4096:512", "dca:4096:512:len")
    assert cal.plan(info(4096), temperature=False).candidates == ("dca:512:64", "dca:1024:128", "dca:2048:256")   # at least 512
    assert cal.plan(info(4096)).candidates[-1] == "dca:2048:256:len"                               # the size nearest L/2
    assert cal.plan(info(256)).candidates == ("dca:32:4", "dca:64:8", "dca:128:16", "dca:128:16:len")  # small L: from L/8
    assert cal.plan(info(32768, chunk=6144)).candidates[2] == "dca:6144:768"                    # the GGUF's own, too
    assert cal.plan(info(32768), chunks=(3000,)).candidates == ("dca:3000:375", "dca:3000:375:len")
    assert cal.plan(info(32768), perplexity=False).ppl_ctx is None
    # a cap keeps every length past L, apart, dev below held-out
    p = cal.plan(info(131072))
    assert L_ok(p, 131072) and p.heldout_lengths[-1] == 262144
    p = cal.plan(info(32768), max_tokens=100000)
    assert L_ok(p, 32768) and max(p.heldout_lengths) == 100000


def test_plan_with_a_far_length() -> None:
    """--far N: the two best by the dev rule at 0.95 N on dev, the pick at N on held-out; counted in the trials and
    the estimate; refused where it is not past the held-out lengths, too long, or with no trials."""
    def info(L: int) -> cal.GgufInfo:
        return cal.GgufInfo(MODEL, 0, "gemma3", L, L, "gemma3.context_length", None, None, 0, 0)

    near = cal.plan(info(32768))
    p = cal.plan(info(32768), far=1048576)
    assert (p.far_dev, p.far_heldout, p.far_trials, p.far_heldout_trials, p.finalists) == (996147, 1048576, 6, 3, 2)
    assert p.candidates == near.candidates and p.dev_lengths == near.dev_lengths
    assert p.total_trials == near.total_trials + 2 * 6 + 3
    assert p.dev_longest == 996147 and p.heldout_longest == 1048576
    # 15 trials of ~1M tokens at 3 s per 100k: about 8 minutes more than the near sweep
    assert 7 * 60 < p.estimate_seconds - near.estimate_seconds < 10 * 60
    one = cal.plan(info(32768), chunks=(16384,), temperature=False, far=1048576, far_trials=2, far_heldout_trials=1)
    assert one.finalists == 1 and one.total_trials == 1 * 2 * 10 + 2 * 2 * 10 + 40 + 2 + 1
    for far, match in ((200000, "past the held-out lengths"), (MAX_FAR + 1, "at most"), (-5, "past the held-out")):
        with pytest.raises(CalibrateError, match=match) as exc:
            cal.plan(info(32768), far=far)
        assert "--far 1048576" in (exc.value.hint or "")
    with pytest.raises(CalibrateError, match="far trial counts"):
        cal.plan(info(32768), far=1048576, far_trials=0)


def test_far_cell_decides_between_the_dev_rule_s_two_best() -> None:
    """ranked: the dev rule's order (its pick, then its pick among the rest); far_pick: of those, the most found at
    the far length, a tie going to the rule's order."""
    from dcaforge.gate.calibrate_sweep import far_pick, ranked

    scores = {"dca:2048:256": S(10), "dca:16384:2048": S(15), "dca:16384:2048:len": S(15), "dca:4096:512": S(14)}
    ppl = {"dca:2048:256": [3.0], "dca:16384:2048": [2.56], "dca:16384:2048:len": [2.62], "dca:4096:512": [2.5]}
    cands = list(scores)
    choice = longctx.choose(scores, ppl, cands, slack=2)
    assert choice.pick == "dca:4096:512"                     # within 2 of the best, the lowest perplexity
    assert ranked(choice, cands, 2) == ["dca:4096:512", "dca:16384:2048"]
    assert ranked(choice, cands, 9) == ["dca:4096:512", "dca:16384:2048", "dca:16384:2048:len", "dca:2048:256"]
    fin = ranked(choice, cands, 2)
    got = far_pick(choice, fin, {"dca:4096:512": S(1, 6), "dca:16384:2048": S(4, 6)}, 996147)
    assert got.pick == "dca:16384:2048" and got.why.endswith("at 996147 tokens dca:4096:512 1/6, dca:16384:2048 4/6")
    assert got.scores == choice.scores and got.slack == choice.slack
    assert far_pick(choice, fin, {"dca:4096:512": S(2, 6), "dca:16384:2048": S(2, 6)}, 996147).pick == "dca:4096:512"


def L_ok(p: cal.Plan, L: int) -> bool:
    every = [*p.dev_lengths, *p.heldout_lengths]
    return min(every) > L and len(set(every)) == 4 and max(p.dev_lengths) < max(p.heldout_lengths)


def test_method_flags() -> None:
    assert longctx.method_args("plain", 1024, 256, "qwen2") == ["--override-kv", "qwen2.context_length=int:1024"]
    assert longctx.method_args("plain", 256, 256, "qwen2") == []
    assert longctx.method_args("yarn", 1024, 256) == ["--rope-scaling", "yarn", "--rope-scale", "4", "--yarn-orig-ctx", "256"]
    assert longctx.method_args("dca", 1024, 256, "qwen2") == ["--dca", "on"]
    assert longctx.method_args("dca:128:16", 1024, 256, "qwen2") == [
        "--dca", "on", "--dca-chunk-size", "128", "--dca-local-size", "16", "--dca-yarn-factor", "0"]
    assert longctx.method_args("dca:128:16:auto", 1024, 256)[-1] == "auto"
    assert longctx.method_args("dca:128:16:pos", 1024, 256)[-2:] == ["--dca-yarn-factor", "pos"]
    assert longctx.method_args("dca:128:16:chunk", 1024, 256)[-2:] == ["--dca-yarn-factor", "chunk"]
    assert longctx.method_args("dca:128:16:len", 1024, 256)[-2:] == ["--dca-yarn-factor", "len"]
    assert longctx.method_args("dca:128:16:2.5", 1024, 256)[-1] == "2.5"
    for bad in ("dca:128", "dca:x:16", "rope", "dca:0:0", "dca:128:16:-1", "dca:128:16:warm", "dca:128:16:chunky",
                "dca:128:16:CHUNK", "dca:128:16:lens", "dca:128:16:nan", "dca:128:16: 2",
                "se", "se:0", "se:1:64", "se:4:0", "se:4:64:2", "se:-4:64", "se:x"):
        with pytest.raises(ValueError, match="unknown method"):
            longctx.method_args(bad, 1024, 256)


def test_self_extend_flags() -> None:
    """se:G:W gives Self-Extend's flags as written; se:W the smallest group size whose farthest distance,
    (ctx - 1 - W)/G + W, stays within the trained context (and at least 2)."""
    assert longctx.method_args("se:4:64", 1024, 256) == ["--dca", "on", "--dca-self-extend", "4", "--dca-local-size", "64"]
    for ctx, trained, w in ((1024, 256, 64), (65792, 8192, 1024), (196864, 32768, 4096), (1042432, 32768, 4096), (300, 256, 32)):
        g = longctx.se_group(ctx, trained, w)
        assert g >= 2 and (ctx - 1 - w) // g + w < trained
        assert g == 2 or (ctx - 1 - w) // (g - 1) + w >= trained - 1, (ctx, trained, w, g)
        assert longctx.method_args(f"se:{w}", ctx, trained)[3] == str(g)
    assert longctx.se_group(65792, 8192, 1024) == 10
    with pytest.raises(ValueError, match="neighbour window"):
        longctx.se_group(1024, 256, 255)


# --- the selection rule ---------------------------------------------------------------------------------------------------

def S(k: int, n: int = 20) -> longctx.Score:
    return longctx.Score(k, n)


def test_choose_most_answers_then_perplexity_then_larger_chunk() -> None:
    ms = ["dca:2048:256", "dca:4096:512", "dca:8192:1024", "dca:16384:2048"]
    # the most answers wins outside the slack, whatever the perplexity
    c = longctx.choose({ms[0]: S(10), ms[1]: S(18), ms[2]: S(15), ms[3]: S(4)},
                       {ms[0]: [5.0], ms[1]: [9.0], ms[2]: [5.1], ms[3]: [4.0]}, ms)
    assert c.pick == ms[1] and c.near == (ms[1],)
    # within the slack (2), the lowest mean dev perplexity
    c = longctx.choose({ms[0]: S(17), ms[1]: S(18), ms[2]: S(16), ms[3]: S(4)},
                       {ms[0]: [6.0, 6.2], ms[1]: [6.5], ms[2]: [6.1, 6.3]}, ms)
    assert c.pick == ms[0] and c.near == (ms[0], ms[1], ms[2])
    assert c.why == ("dca:2048:256 17/20 ppl 6.1000, dca:4096:512 18/20 ppl 6.5000, dca:8192:1024 16/20 ppl 6.2000, "
                     "dca:16384:2048 4/20")
    assert longctx.choose({ms[0]: S(17), ms[1]: S(18), ms[2]: S(16)}, {ms[1]: [6.5]}, ms, slack=1).pick == ms[1]
    # no perplexity: the larger S among the near ones
    assert longctx.choose({ms[0]: S(18), ms[1]: S(17), ms[2]: S(16), ms[3]: S(12)}, {}, ms).pick == ms[2]
    # a method without trials is never chosen, even with the best perplexity
    assert longctx.choose({ms[0]: S(0), ms[1]: S(0, 0)}, {ms[1]: [1.0]}, ms[:2]).pick == ms[0]
    with pytest.raises(ValueError, match="no trials"):
        longctx.choose({}, {}, ms)


def test_bench_choose_is_the_library_rule(tmp_path: Path) -> None:
    """bench/longctx/run.py choose reads the runner's JSON lines and picks with dcaforge.gate.longctx.choose (slack 2)."""
    ms = ["dca:2048:256", "dca:4096:512", "dca:8192:1024"]
    oks = {ms[0]: [1] * 17 + [0] * 3, ms[1]: [1] * 18 + [0] * 2, ms[2]: [1] * 10 + [0] * 10}
    with open(tmp_path / "passkey.jsonl", "w") as fh:
        for m, seq in oks.items():
            for i, ok in enumerate(seq):
                fh.write(json.dumps({"set": "dev", "model": "smollm2-135m", "length": "24576", "method": m, "index": i,
                                     "ok": bool(ok)}) + "\n")
        fh.write(json.dumps({"set": "dev", "model": "smollm2-135m", "length": "inside", "method": ms[2], "index": 0,
                             "ok": True}) + "\n")
    with open(tmp_path / "ppl.jsonl", "w") as fh:
        for m, v in ((ms[0], 5.3), (ms[1], 5.4), (ms[2], 5.0)):
            fh.write(json.dumps({"set": "dev", "model": "smollm2-135m", "ctx": 24576, "method": m, "ppl": v}) + "\n")
    p = subprocess.run([sys.executable, str(REPO / "bench" / "longctx" / "run.py"), "choose", "--set", "dev", "--model",
                        "smollm2-135m", "--methods", ",".join(ms), str(tmp_path)], capture_output=True, text=True, check=False)
    assert p.returncode == 0, p.stderr
    lib = longctx.choose({m: longctx.Score(sum(v), len(v)) for m, v in oks.items()},
                         {ms[0]: [5.3], ms[1]: [5.4], ms[2]: [5.0]}, ms)
    assert p.stdout.strip() == lib.pick == ms[0]
    assert p.stderr.strip() == f"# {lib.why}"


def test_bench_runner_imports_only_the_standard_library_and_pyyaml() -> None:
    """run.py runs on the GPU machine with python3 and PyYAML: the dcaforge modules it imports need nothing else."""
    code = ("import sys; sys.path.insert(0, 'bench/longctx'); import run, corpus; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'gguf', 'numpy', 'typer', 'rich', 'click', 'matplotlib', 'git'}))")
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=False)
    assert p.returncode == 0 and p.stdout.strip() == "[]", p.stdout + p.stderr


@pytest.mark.skipif(sys.version_info[:3] != (3, 11, 7),
                    reason="the pinned held-out text is Python 3.11.7's documentation (another 3.11 release's differs)")
def test_heldout_text_is_the_pinned_one() -> None:
    """The held-out text's builder moved into dcaforge.gate.longctx: byte-identical to the text sets.yaml pins."""
    sets = yaml.safe_load((REPO / "bench" / "longctx" / "sets.yaml").read_text())
    assert longctx.sha256_text(longctx.heldout_text()) == sets["sets"]["heldout"]["text"]["sha256"]


def test_dev_text_of_a_tree(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "ggml" / "src").mkdir(parents=True)
    (tmp_path / "src" / "b.cpp").write_text("int b;\n")
    (tmp_path / "src" / "a.cpp").write_text("int a;\n")
    (tmp_path / "src" / "llama-dca.cpp").write_text("the feature's own\n")
    (tmp_path / "ggml" / "src" / "g.c").write_text("int g;\n")
    assert longctx.dev_text(tmp_path) == "int a;\n\n\nint b;\n\n\nint g;\n"
    with pytest.raises(ValueError, match="no src/"):
        longctx.dev_text(tmp_path / "ggml")


# --- the report -------------------------------------------------------------------------------------------------------

def test_report_json_figure_and_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dcaforge.commands.calibrate import print_report
    from dcaforge.gate.plot import plot_calibration

    info = cal.inspect_gguf(MODEL)
    pl = cal.plan(info, chunks=(64, 128), dev_trials=2, heldout_trials=2)
    assert pl.candidates[2] == "dca:128:16:len"   # the temperature by length, drawn as a marker of its own
    dev = {pl.candidates[0]: {640: S(1, 2), 1280: S(0, 2)}, pl.candidates[1]: {640: S(2, 2), 1280: S(1, 2)},
           pl.candidates[2]: {640: S(0, 2), 1280: S(1, 2)}}
    ppl: dict[str, float | None] = {pl.candidates[0]: 3.5, pl.candidates[1]: 3.1, pl.candidates[2]: 3.4}
    choice = longctx.choose({m: cal.Report.total(by) for m, by in dev.items()},
                            {m: [v] for m, v in ppl.items() if v is not None}, list(pl.candidates), slack=pl.slack)
    held = {choice.pick: {768: S(2, 2), 1536: S(1, 2)}, "yarn": {768: S(0, 2), 1536: S(0, 2)}}
    out = tmp_path / "m.dca.gguf"
    copy = cal.write_dca_copy(MODEL, out, 128, 16)
    rep = cal.Report(MODEL, out, tmp_path, info, pl, dev, ppl, choice, 128, 16, held, copy)
    assert choice.pick == "dca:128:16" and rep.verdict == "held-out: dca:128:16 3/4 [0.30, 0.95] above YaRN 0/4 [0.00, 0.49]"
    d = json.loads(json.dumps(rep.to_dict()))
    assert d["choice"]["chunk_size"] == 128 and d["dev"]["dca:64:8"]["total"] == {"k": 1, "n": 4, "wilson95": [0.0456, 0.6994]}
    png = plot_calibration(rep, tmp_path / "sweep.png")
    assert png is not None and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    print_report(rep)
    text = capsys.readouterr().out
    assert "pick:     dca:128:16: the most exact dev answers; among those within 1 of the best (dca:128:16)" in text
    assert "held-out: dca:128:16 3/4 [0.30, 0.95] above YaRN 0/4 [0.00, 0.49]" in text
    assert "qwen2.attention.dual_chunk.chunk_size = 128, local_size = 16, temperature = off; every other key and the 50 tensors" in text
    assert os.fspath(out) in text


def test_report_with_a_far_cell(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With --far: the far dev cell of the two finalists and the pick's far held-out score in the text, the verdict,
    the JSON and the figure."""
    from dcaforge.commands.calibrate import print_report
    from dcaforge.gate.calibrate_sweep import far_pick, pick, ranked
    from dcaforge.gate.plot import plot_calibration

    info = cal.inspect_gguf(MODEL)
    pl = cal.plan(info, chunks=(64, 128), dev_trials=2, heldout_trials=2, far=2560, far_trials=2, far_heldout_trials=1)
    assert (pl.far_dev, pl.far_heldout, pl.finalists) == (2432, 2560, 2)
    dev = {pl.candidates[0]: {640: S(2, 2), 1280: S(1, 2)}, pl.candidates[1]: {640: S(2, 2), 1280: S(1, 2)},
           pl.candidates[2]: {640: S(1, 2), 1280: S(1, 2)}}
    ppl: dict[str, float | None] = {pl.candidates[0]: 3.5, pl.candidates[1]: 3.1, pl.candidates[2]: 3.2}
    near = pick(pl, dev, ppl)
    fin = ranked(near, list(pl.candidates), pl.finalists)
    assert fin == ["dca:128:16", "dca:128:16:len"]
    choice = far_pick(near, fin, {"dca:128:16": S(0, 2), "dca:128:16:len": S(2, 2)}, 2432)
    assert choice.pick == "dca:128:16:len"
    held = {choice.pick: {768: S(2, 2), 1536: S(1, 2)}, "yarn": {768: S(0, 2), 1536: S(0, 2)}}
    out = tmp_path / "m.dca.gguf"
    copy = cal.write_dca_copy(MODEL, out, 128, 16, "len")
    rep = cal.Report(MODEL, out, tmp_path, info, pl, dev, ppl, choice, 128, 16, held, copy,
                     far={"dca:128:16": S(0, 2), "dca:128:16:len": S(2, 2)}, far_heldout=S(1, 1))
    assert rep.verdict.endswith("; at 2560 tokens 1/1 [0.21, 1.00]"), rep.verdict
    d = json.loads(json.dumps(rep.to_dict()))
    assert d["far"]["dev_length"] == 2432 and d["far"]["dev"]["dca:128:16:len"]["k"] == 2 and d["far"]["heldout"]["n"] == 1
    assert d["choice"]["temperature"] == "len"
    assert plot_calibration(rep, tmp_path / "sweep.png") is not None
    print_report(rep)
    text = capsys.readouterr().out
    assert "far dev:  dca:128:16 0/2 [0.00, 0.66], dca:128:16:len 2/2 [0.34, 1.00] at 2432 tokens (9.5x L)" in text
    assert "pick:     dca:128:16:len: of the dev rule's best 2, the most found at 2432 tokens" in text
    assert "far:      dca:128:16:len 1/1 [0.21, 1.00] at 2560 tokens (10.0x L) of the held-out text" in text
    assert "temperature = len" in text


def test_a_text_that_fails_its_ceiling_ranks_and_judges_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Plain attention inside L must find the key in 80% of the trials before a text ranks settings past L (the
    bench's ceiling_min): a failed dev ceiling makes the pick the lowest dev perplexity, a failed held-out ceiling makes
    the verdict "cannot judge" (no comparison with YaRN), and both are in the report, its JSON and its text."""
    from dcaforge.commands.calibrate import print_report
    from dcaforge.gate.calibrate_plan import ceiling_holds
    from dcaforge.gate.calibrate_sweep import pick
    from dcaforge.gate.plot import plot_calibration

    assert ceiling_holds(S(16, 20)) and not ceiling_holds(S(15, 20)) and not ceiling_holds(S(0, 0))
    info = cal.inspect_gguf(MODEL)
    pl = cal.plan(info, chunks=(64, 128), dev_trials=2, heldout_trials=2)
    assert pl.inside == 230 and pl.ceiling_trials == (4, 4)
    dev = {pl.candidates[0]: {640: S(2, 2), 1280: S(2, 2)}, pl.candidates[1]: {640: S(0, 2), 1280: S(0, 2)}}
    ppl: dict[str, float | None] = {pl.candidates[0]: 3.5, pl.candidates[1]: 3.1}
    assert pick(pl, dev, ppl).pick == "dca:64:8"                         # the answers rank: most answers
    choice = pick(pl, dev, ppl, answers_rank=False)
    assert choice.pick == "dca:128:16"                                   # they cannot: the lowest dev perplexity
    assert pick(pl, dev, {m: None for m in ppl}, answers_rank=False).pick == "dca:128:16"   # then the larger S
    out = tmp_path / "m.dca.gguf"
    copy = cal.write_dca_copy(MODEL, out, 128, 16)
    rep = cal.Report(MODEL, out, tmp_path, info, pl, dev, ppl, choice, 128, 16, {choice.pick: {}, "yarn": {}}, copy,
                     ceilings={"dev": S(1, 4), "heldout": S(3, 4)})
    assert rep.verdict.startswith("held-out: cannot judge: plain attention inside L (230 tokens) found the key 3/4")
    assert rep.ceiling_line("dev") is not None
    d = json.loads(json.dumps(rep.to_dict()))
    assert d["ceilings"]["heldout"]["holds"] is False and d["ceilings"]["dev"]["k"] == 1
    assert d["heldout"]["yarn"]["total"]["n"] == 0
    assert plot_calibration(rep, tmp_path / "sweep.png") is not None      # an empty held-out panel draws
    print_report(rep)
    text = capsys.readouterr().out
    assert "ceiling:  dev text, plain attention inside L (230 tokens): 1/4" in text and "BELOW the ceiling" in text
    rep.ceilings["heldout"] = S(4, 4)
    rep.heldout = {choice.pick: {768: S(1, 2), 1536: S(0, 2)}, "yarn": {768: S(2, 2), 1536: S(0, 2)}}
    assert rep.ceiling_line("heldout") is None and "BELOW YaRN" in rep.verdict


# --- --resume ---------------------------------------------------------------------------------------------------------

def _fp(tmp_path: Path, model: Path = MODEL) -> dict:
    from dcaforge.gate import calibrate_record as record

    server = tmp_path / "llama-server"
    if not server.exists():
        server.write_bytes(b"not run: only its bytes are fingerprinted")
    return record.fingerprint(model, server, ("-t", "2"), "d" * 64, "h" * 64)


def test_resume_takes_only_this_calibration_s_whole_records(tmp_path: Path) -> None:
    """load: None without a recorded run; the run's records when the fingerprint matches (a torn or foreign line
    dropped and counted, a record whose key is not the protocol's not taken); a differing model, server, options or
    text refused, naming it; start: the fingerprint and the kept records, or empty files for a fresh start."""
    from dcaforge.gate import calibrate_record as record

    work = tmp_path / "work"
    work.mkdir()
    fp = _fp(tmp_path)
    assert record.load(work, fp) is None
    record.start(work, fp, None)
    assert (work / "trials.jsonl").read_text() == "" and json.loads((work / "run.json").read_text()) == fp
    t = longctx.trials("calibrate-dev", 20261207, 640, 2)
    good = {"set": "calibrate-dev", "method": "dca:64:8", "length": 640, "index": 0, "key": t[0].key, "ok": True,
            "answer": t[0].key + "."}
    wrong_key = {**good, "index": 1, "key": "00000"}
    lines = [json.dumps(good), json.dumps(wrong_key), '{"set": "calibrate-dev", "method": "dca:64:8", "len',
             json.dumps({**good, "ok": "yes"}), "[1, 2]"]
    (work / "trials.jsonl").write_text("\n".join(lines) + "\n")
    (work / "ppl.jsonl").write_text(json.dumps({"method": "dca:64:8", "ctx": 640, "ppl": 3.25}) + "\n{\n")
    rec = record.load(work, fp)
    assert rec is not None and rec.dropped == 4 and rec.ppl == {("dca:64:8", 640): 3.25}
    assert rec.trial("calibrate-dev", "dca:64:8", 640, 0, t[0].key) == good
    assert rec.trial("calibrate-dev", "dca:64:8", 640, 1, t[1].key) is None       # not the protocol's key
    record.start(work, fp, rec)   # the kept records, rewritten whole
    assert [json.loads(x) for x in (work / "trials.jsonl").read_text().splitlines()] == [good, wrong_key]
    for change, named in ((("server_args", ["-t", "4"]), "--server-args"), (("dev_text", "e" * 64), "the dev text"),
                          (("model", "1:abc"), "the model file"), (("server", "0" * 64), "llama-server")):
        with pytest.raises(CalibrateError, match=f"--resume: {named}.* differs? from the run recorded in") as exc:
            record.load(work, {**fp, change[0]: change[1]})
        assert "leave out --resume" in (exc.value.hint or "")
    (work / "run.json").write_text("[]")
    with pytest.raises(CalibrateError, match="is not a calibration's record"):
        record.load(work, fp)
    # links in the work folder are replaced, never written through
    outside = tmp_path / "outside.txt"
    outside.write_text("keep")
    for name in ("trials.jsonl", "run.json.tmp", "ppl.jsonl.tmp"):
        (work / name).unlink(missing_ok=True)
        (work / name).symlink_to(outside)
    record.start(work, fp, None)
    assert outside.read_text() == "keep" and not (work / "trials.jsonl").is_symlink()


def test_model_fingerprint_sees_a_changed_header_or_tail(tmp_path: Path) -> None:
    from dcaforge.gate.calibrate_record import EDGE, model_fingerprint

    big = tmp_path / "big.gguf"
    data = bytearray(os.urandom(1024)) * (3 * EDGE // 1024)
    big.write_bytes(bytes(data))
    first = model_fingerprint(big)
    data[10] ^= 1
    big.write_bytes(bytes(data))
    second = model_fingerprint(big)
    data[-10] ^= 1
    big.write_bytes(bytes(data))
    third = model_fingerprint(big)
    assert len({first, second, third}) == 3 and first.startswith(f"{3 * EDGE}:")
    assert model_fingerprint(MODEL) == model_fingerprint(MODEL)


def test_a_resumed_cell_starts_no_server(tmp_path: Path) -> None:
    """Every trial of a cell recorded: the score comes from the records and no llama-server starts (the server here
    is not a program: starting it would fail)."""
    from dcaforge.gate import calibrate_record as record
    from dcaforge.gate.calibrate_sweep import Servers, Sweep, Text

    work = tmp_path / "work"
    work.mkdir()
    fp = _fp(tmp_path)
    trials = longctx.trials("calibrate-dev", 20261207, 640, 3)
    recs = [{"set": "calibrate-dev", "method": "dca:64:8", "length": 640, "index": t.index, "key": t.key,
             "ok": t.index != 1, "answer": "x"} for t in trials]
    (work / "run.json").write_text(json.dumps(fp))
    (work / "trials.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    rec = record.load(work, fp)
    record.start(work, fp, rec)
    seen: list[dict] = []
    sweep = Sweep(Servers(MODEL, tmp_path / "llama-server", None, (), 5.0), cal.inspect_gguf(MODEL), work,
                  on_trial=seen.append, recorded=rec)
    score = sweep.cell("calibrate-dev", 20261207, "dca:64:8", 640, 3, Text("t", "text " * 1000), 1280)
    assert (score.k, score.n) == (2, 3) and sweep.reused == 3 and len(seen) == 3
    assert not list((work / "logs").iterdir())   # no server log: none started
