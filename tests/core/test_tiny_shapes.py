"""dcaforge/gate/gatetools/tiny.py's named shapes (issue 15's Qwen-architecture speed: a random-weight model of
Qwen2.5-0.5B's shape, bench/gpu/run.sh speed_qwen05), read back with gguf-py's reader; and the tiny models of the
gates and e2e tests unchanged by the shapes' addition (their tensors, digested)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import gguf
import numpy as np
import pytest

from dcaforge.gate.gatetools import tiny


def field(r: gguf.GGUFReader, key: str):
    return r.get_field(key).contents()


def test_qwen2_0_5b_shape_metadata_and_types(tmp_path: Path) -> None:
    """One layer of the shape (n_layer=1; every other size Qwen2.5-0.5B's): the keys llama.cpp reads, F16 matrices,
    F32 norms and biases, ggml shapes of a 14-head / 2-KV-head / head-dim-64 attention."""
    path = tiny.build_shape("qwen2-0.5b", str(tmp_path / "q.gguf"), n_layer=1)
    r = gguf.GGUFReader(path)
    assert field(r, "general.architecture") == "qwen2"
    assert field(r, "general.name") == "dcaforge-shape-qwen2-0.5b"
    assert field(r, "general.file_type") == gguf.LlamaFileType.MOSTLY_F16
    want = {"context_length": 32768, "embedding_length": 896, "block_count": 1, "feed_forward_length": 4864,
            "attention.head_count": 14, "attention.head_count_kv": 2, "attention.key_length": 64,
            "attention.value_length": 64, "rope.freq_base": 1e6}
    assert {k: field(r, f"qwen2.{k}") for k in want} == want
    assert len(field(r, "tokenizer.ggml.tokens")) == tiny.N_VOCAB
    tensors = {t.name: t for t in r.tensors}
    shapes = {"attn_q.weight": [896, 896], "attn_k.weight": [896, 128], "attn_v.weight": [896, 128],
              "attn_output.weight": [896, 896], "ffn_gate.weight": [896, 4864], "ffn_up.weight": [896, 4864],
              "ffn_down.weight": [4864, 896]}
    for name, ne in shapes.items():
        t = tensors["blk.0." + name]
        assert (t.tensor_type, list(t.shape)) == (gguf.GGMLQuantizationType.F16, ne), name
    for name, ne in {"attn_q.bias": [896], "attn_k.bias": [128], "attn_v.bias": [128], "attn_norm.weight": [896],
                     "ffn_norm.weight": [896]}.items():
        t = tensors["blk.0." + name]
        assert (t.tensor_type, list(t.shape)) == (gguf.GGMLQuantizationType.F32, ne), name
    assert tensors["token_embd.weight"].tensor_type == gguf.GGMLQuantizationType.F16
    assert list(tensors["output.weight"].shape) == [896, tiny.N_VOCAB]
    assert len(tensors) == 3 + 12   # token_embd, output_norm, output; 12 per layer
    w = np.asarray(tensors["blk.0.ffn_up.weight"].data, dtype=np.float32)
    assert np.isfinite(w).all() and 0.8 < w.std() * np.sqrt(896) < 1.2   # std 1/sqrt(n_embd), F16 keeps it


def test_full_shape_has_qwen2_0_5b_sizes_and_f32_option(tmp_path: Path) -> None:
    """The full shape's sizes (24 layers: ~358M parameters, ~717 MB at F16) without writing it; dtype f32 writes
    F32 matrices; wrong names and override fields are refused with what is known."""
    spec = tiny.Spec("qwen2", **tiny.SHAPES["qwen2-0.5b"]["spec"])
    per_layer = 2 * 896 * 896 + 2 * 896 * 128 + 3 * 896 * 4864 + 896 + 2 * 128 + 2 * 896
    assert (spec.n_layer, spec.n_head * spec.head_dim) == (24, spec.n_embd)
    assert 355e6 < spec.n_layer * per_layer < 360e6
    path = tiny.build_shape("qwen2-0.5b", str(tmp_path / "q32.gguf"), dtype="f32", n_layer=1, n_ff=64)
    r = gguf.GGUFReader(path)
    assert {t.tensor_type for t in r.tensors} == {gguf.GGMLQuantizationType.F32}
    assert field(r, "qwen2.feed_forward_length") == 64
    with pytest.raises(ValueError, match="unknown shape 'qwen9'.*qwen2-0.5b"):
        tiny.build_shape("qwen9", str(tmp_path / "x.gguf"))
    with pytest.raises(ValueError, match="unknown Spec field.*n_layers"):
        tiny.build_shape("qwen2-0.5b", str(tmp_path / "x.gguf"), n_layers=1)
    with pytest.raises(ValueError, match="unknown dtype"):
        tiny.build_shape("qwen2-0.5b", str(tmp_path / "x.gguf"), dtype="q8")
    assert not (tmp_path / "x.gguf").exists()


def test_cli_refuses_shape_with_arch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        tiny.main([str(tmp_path / "m"), "--shape", "qwen2-0.5b", "--arch", "llama"])
    assert e.value.code == 2 and "no --arch or --variant" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


# sha256 over every tiny model's tensors (name, type, shape, data), written before the named shapes were added
# (main 300c90f); it moves only if a model's weights move: then every test reading their logits needs a look
TINY_TENSORS_SHA256 = "65a770911829737c395f18159de6f47cd4cadad4329e792216a25bb16347c8a7"


def test_tiny_models_tensors_unchanged(tmp_path: Path) -> None:
    tiny.main([str(tmp_path), "--variant", "normal", "--variant", "zero-global", "--variant", "one-layer"])
    h = hashlib.sha256()
    paths = sorted(tmp_path.glob("*.gguf"))
    assert len(paths) == 13
    for p in paths:
        h.update(p.name.encode())
        for t in gguf.GGUFReader(p).tensors:
            h.update(f"{t.name}/{t.tensor_type.name}/{list(t.shape)}".encode())
            h.update(t.data.tobytes())
    assert h.hexdigest() == TINY_TENSORS_SHA256
