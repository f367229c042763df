"""Guards of `--dca on` that speak (issue 14), on the patched build through dcaforge/gate/gatetools/dca_logits.cpp
(a real llama_context per run) and tiny GGUFs written here with gguf-py:

- attention DCA cannot apply is refused at context creation naming the architecture and what it uses:
  ALiBi (mpt), attention sinks (gpt-oss), MLA (deepseek2), KQ biases (t5) (tests/models/unsupported.py);
  the decoder-only ones run with --dca off, so the refusal is DCA's;
- a chunk length c = S - w not larger than w is refused with the reason; c = w + 1 runs;
- a GGUF that carries the model's own DCA settings (`<arch>.attention.dual_chunk.chunk_size`,
  `.local_size`, `.original_context_length`, from HF's dual_chunk_attention_config) gets them as the
  defaults (the logits equal the same sizes given as flags), and its original context bounds S;
- a trained context of ~1M gets Qwen2.5-1M's chunk 262144 / local 8192 as the automatic sizes
  instead of 1/2 and 1/8 of 1M, one of 400000 gets 1/2 and 1/8 of it (200000 / 50000); with the Qwen2.5-1M keys, L is its original 262144;
- when the trained context covers the context (automatic sizes, n_ctx_seq <= L), DCA logs that it is
  a no-op and the logits are byte-identical to --dca off;
- rope scaling declared by the GGUF composes with DCA (the documented choice, llama-dca-context.h):
  linear scaling x4 with DCA matches the float64 numpy reference (tests/models/reference.py) with the
  scaled rope at DCA's positions; YaRN x4 with DCA below one chunk equals YaRN without DCA.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from e2e_helpers import REPO

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from dcaforge.gate.gatetools import build_logits, tiny  # noqa: E402
from tests.models import reference, unsupported  # noqa: E402

N_VOCAB = tiny.N_VOCAB
SEED = 7


@pytest.fixture(scope="module")
def exe(serve_tree) -> str:
    return build_logits.build(serve_tree.src, serve_tree.build, dca=True)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("guard-models")


def gguf_model(models: Path, name: str, arch: str = "qwen2", **kw) -> str:
    path = models / f"{name}.gguf"
    if not path.exists():
        tiny.build(arch, str(path), **kw)
    return str(path)


def run(exe: str, model: str, out: Path, *args: str, n_tokens: int = 400) -> tuple[subprocess.CompletedProcess, np.ndarray | None]:
    r = subprocess.run([exe, "-m", model, "-o", str(out), "--seed", str(SEED), "--n-tokens", str(n_tokens), "-t", "2",
                        "-v", *args], capture_output=True, text=True, timeout=600, check=False)
    x = None
    if r.returncode == 0:
        x = np.fromfile(out, dtype="<f4").reshape(-1, N_VOCAB)
    return r, x


def rel_err(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return np.abs(a - b).max(axis=-1) / np.maximum(np.abs(b).max(axis=-1), 1e-30)


@pytest.mark.parametrize(("arch", "what"), [("mpt", "ALiBi"), ("gpt-oss", "attention sinks"),
                                            ("deepseek2", "multi-head latent attention"),
                                            ("t5", "relative position biases added to KQ (kq_b")])
def test_attention_dca_cannot_apply_is_refused(exe, models, tmp_path, arch, what):
    m = unsupported.ensure(str(models), arch)
    r, _ = run(exe, m, tmp_path / "on.f32", "--dca", "on", n_tokens=8)
    assert r.returncode == 2, f"rc={r.returncode}\n{r.stderr[-3000:]}"
    assert f"architecture '{arch}' uses {what}" in r.stderr, r.stderr[-3000:]
    assert "--dca off" in r.stderr
    if arch != "t5":    # an encoder-decoder: dca_logits makes no encoder pass, so only the refusal is checked
        r, x = run(exe, m, tmp_path / "off.f32", "--dca", "off", n_tokens=8)
        assert r.returncode == 0 and np.isfinite(x).all(), r.stderr[-3000:]


@pytest.mark.parametrize(("S", "w"), [(192, 96), (192, 100), (100, 60)])
def test_chunk_length_not_above_local_window_is_refused(exe, models, tmp_path, S, w):
    r, _ = run(exe, gguf_model(models, "qwen2"), tmp_path / "x.f32", "--dca", "on", "--dca-chunk-size", str(S),
               "--dca-local-size", str(w), n_tokens=8)
    assert r.returncode == 2, r.stderr[-3000:]
    assert f"the chunk length c = S - w = {S - w} must be larger than the local window" in r.stderr, r.stderr[-3000:]
    assert "--dca-local-size" in r.stderr


def test_chunk_length_just_above_local_window_runs(exe, models, tmp_path):
    r, x = run(exe, gguf_model(models, "qwen2"), tmp_path / "x.f32", "--dca", "on", "--dca-chunk-size", "192",
               "--dca-local-size", "95")
    assert r.returncode == 0 and np.isfinite(x).all(), r.stderr[-3000:]


DCA_KEYS = {"{arch}.attention.dual_chunk.chunk_size": 128, "{arch}.attention.dual_chunk.local_size": 16}


def test_gguf_dca_settings_are_the_defaults(exe, models, tmp_path):
    m = gguf_model(models, "qwen2-dca-keys", kv=DCA_KEYS)
    r, auto = run(exe, m, tmp_path / "auto.f32", "--dca", "on")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "DCA on: chunk size S = 128, local window w = 16" in r.stderr, r.stderr[-3000:]
    assert "the model's own: qwen2.attention.dual_chunk.chunk_size, qwen2.attention.dual_chunk.local_size" in r.stderr
    _, expl = run(exe, m, tmp_path / "expl.f32", "--dca", "on", "--dca-chunk-size", "128", "--dca-local-size", "16")
    _, other = run(exe, m, tmp_path / "other.f32", "--dca", "on", "--dca-chunk-size", "192", "--dca-local-size", "32")
    assert np.array_equal(auto, expl)
    assert rel_err(auto, other)[200:].max() > 1e-3       # the sizes matter past c, so the keys were used


def test_gguf_original_context_bounds_the_chunk(exe, models, tmp_path):
    m = gguf_model(models, "qwen2-dca-orig", kv={**DCA_KEYS, "{arch}.attention.dual_chunk.original_context_length": 128})
    r, _ = run(exe, m, tmp_path / "x.f32", "--dca", "on", "--dca-chunk-size", "192", "--dca-local-size", "32", n_tokens=8)
    assert r.returncode == 2
    assert "--dca-chunk-size 192 exceeds the trained context of the model (128, " \
           "qwen2.attention.dual_chunk.original_context_length)" in r.stderr, r.stderr[-3000:]


def test_million_token_model_gets_a_meaningful_auto_chunk(exe, models, tmp_path):
    m = gguf_model(models, "qwen2-1m", n_ctx_train=1048576)
    r, on = run(exe, m, tmp_path / "on.f32", "--dca", "on")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "S = 262144, w = 8192" in r.stderr, r.stderr[-3000:]
    assert "DCA is a no-op: the trained context (1048576" in r.stderr
    _, off = run(exe, m, tmp_path / "off.f32", "--dca", "off")
    assert np.array_equal(on, off)
    # below twice the cap, 1/2 and 1/8 of L: 400000 (past the 349525 where 3/4 of L used to reach the cap)
    r, _ = run(exe, gguf_model(models, "qwen2-400k", n_ctx_train=400000), tmp_path / "k.f32", "--dca", "on", n_tokens=8)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "S = 200000, w = 50000" in r.stderr and "1/2 and 1/8 of the trained context" in r.stderr, r.stderr[-3000:]
    # Qwen2.5-1M's own settings: context 1010000, DCA keys chunk 262144 / local 8192 / original 262144
    q = gguf_model(models, "qwen2-qwen1m-keys", n_ctx_train=1010000, kv={
        "{arch}.attention.dual_chunk.chunk_size": 262144, "{arch}.attention.dual_chunk.local_size": 8192,
        "{arch}.attention.dual_chunk.original_context_length": 262144})
    r, _ = run(exe, q, tmp_path / "q.f32", "--dca", "on", n_tokens=8)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "the trained context (262144, qwen2.attention.dual_chunk.original_context_length)" in r.stderr, r.stderr[-3000:]


def test_noop_when_trained_context_covers_the_context(exe, models, tmp_path):
    m = gguf_model(models, "qwen2")
    r, on = run(exe, m, tmp_path / "on.f32", "--dca", "on", "-c", "256", n_tokens=250)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "DCA is a no-op: the trained context (256, qwen2.context_length) covers n_ctx_seq = 256" in r.stderr
    _, off = run(exe, m, tmp_path / "off.f32", "--dca", "off", "-c", "256", n_tokens=250)
    assert np.array_equal(on, off)
    # sizes given explicitly keep DCA on inside the trained context (it then changes positions past c = 160)
    r, expl = run(exe, m, tmp_path / "expl.f32", "--dca", "on", "--dca-chunk-size", "192", "--dca-local-size", "32",
                  "-c", "256", n_tokens=250)
    assert "DCA on: chunk size S = 192" in r.stderr
    assert rel_err(expl, off)[:160].max() < 1e-3 and rel_err(expl, off)[170:].max() > 1e-3


@pytest.mark.parametrize("fa", ["off", "on"])
def test_linear_rope_scaling_composes_with_dca(exe, models, tmp_path, fa):
    kv = {"{arch}.rope.scaling.type": "linear", "{arch}.rope.scaling.factor": 4.0}
    m = gguf_model(models, "qwen2-linear4", kv=kv)
    toks = reference.tokens_for(SEED, 400)
    args = ["-fa", fa, "-ctk", "f32", "-ctv", "f32"]
    r, on = run(exe, m, tmp_path / "on.f32", *args, "--dca", "on", "--dca-chunk-size", "192", "--dca-local-size", "32")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "DCA over the model's linear rope scaling (factor 4" in r.stderr, r.stderr[-3000:]
    _, off = run(exe, m, tmp_path / "off.f32", *args, "--dca", "off")
    ref_off = reference.forward(m, "qwen2", toks, None, freq_scale=0.25)
    ref_on = reference.forward(m, "qwen2", toks, (192, 32), freq_scale=0.25)   # no temperature over a scaled rope (auto)
    tol = 1e-3 if fa == "off" else 1e-2
    e_off = rel_err(off, ref_off).max()
    assert e_off < tol, f"the reference itself is off by {e_off:.3g} (scaled rope, no DCA)"
    e_on = rel_err(on, ref_on)
    assert e_on.max() < max(tol, 3 * e_off), f"DCA over linear x4 vs the reference: {e_on.max():.3g} at {e_on.argmax()}"
    # and not the unscaled rope: the reference without the scaling is far
    assert rel_err(on, reference.forward(m, "qwen2", toks, (192, 32)))[200:].max() > 10 * e_on.max()


def test_yarn_rope_scaling_composes_with_dca(exe, models, tmp_path):
    kv = {"{arch}.rope.scaling.type": "yarn", "{arch}.rope.scaling.factor": 4.0,
          "{arch}.rope.scaling.original_context_length": 256}
    m = gguf_model(models, "qwen2-yarn4", n_ctx_train=1024, kv=kv)
    r, on = run(exe, m, tmp_path / "on.f32", "--dca", "on", "-c", "512")
    assert r.returncode == 0, r.stderr[-3000:]
    # L is the original context of the scaling: the automatic sizes are L/2 = 128 / L/8 = 32 (c = 96)
    assert "DCA on: chunk size S = 128, local window w = 32" in r.stderr, r.stderr[-3000:]
    assert "DCA over the model's yarn rope scaling (factor 4" in r.stderr
    _, off = run(exe, m, tmp_path / "off.f32", "--dca", "off", "-c", "512")
    e = rel_err(on, off)
    assert np.isfinite(on).all()
    assert e[:96].max() < 1e-3, f"below one chunk DCA over YaRN differs from YaRN: {e[:96].max():.3g}"
    assert e[106:].max() > 1e-3
