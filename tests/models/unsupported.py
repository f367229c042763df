"""Tiny random-weight GGUFs of architectures whose attention DCA cannot apply, for the guard tests of
patch 0078-dca (`--dca on` must refuse them, naming the architecture and what it uses):

  mpt        ALiBi position biases (mpt.attention.max_alibi_bias)
  gpt-oss    attention sinks (blk.N.attn_sinks) on its full-attention layers
  deepseek2  multi-head latent attention (MLA: attention.key_length_mla / value_length_mla,
             attn_k_b / attn_v_b)
  t5         relative position biases added to KQ (kq_b: attention.relative_buckets_count)

Each is the smallest model llama.cpp 0c1e57098 loads for that architecture (the tensors its loader
requires, nothing more), with the byte-level tokenizer of dcaforge/gate/gatetools/tiny.py. Weights are small
seeded normals: these models are loaded, never judged on their output.

CLI: python -m tests.models.unsupported OUTDIR [--arch A ...]
"""

from __future__ import annotations

import argparse
import os
import sys

import gguf
import numpy as np

from dcaforge.gate.gatetools import tiny

ARCHS = ("mpt", "gpt-oss", "deepseek2", "t5")

E, F, H, HKV, HD = 64, 128, 2, 1, 32
N_CTX = 256


def _writer(path: str, arch: str) -> gguf.GGUFWriter:
    w = gguf.GGUFWriter(path, arch)
    w.add_name(f"dcaforge-unsupported-{arch}")
    w.add_context_length(N_CTX)
    w.add_embedding_length(E)
    w.add_feed_forward_length(F)
    w.add_head_count(H)
    w.add_head_count_kv(H if arch == "t5" else HKV)   # t5: q, k, v all n_embd_k_gqa wide
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tiny.bytes_to_unicode() + ["<|bos|>", "<|endoftext|>"])
    w.add_token_types([gguf.TokenType.NORMAL] * 256 + [gguf.TokenType.CONTROL] * 2)
    w.add_token_merges(["<|bos|> <|endoftext|>"])
    w.add_bos_token_id(tiny.BOS_ID)
    w.add_eos_token_id(tiny.EOS_ID)
    return w


def build(arch: str, path: str) -> str:
    """Write the model of `arch` to `path`; returns path."""
    rng = np.random.default_rng(sum(map(ord, arch)))   # deterministic per arch
    tensors: dict[str, np.ndarray] = {}

    def t(name: str, *shape: int, std: float = 0.05) -> None:
        # numpy shapes are the reverse of ggml's ne
        tensors[name] = (rng.standard_normal(shape) * std).astype(np.float32)

    def ones(name: str, n: int) -> None:
        tensors[name] = np.ones(n, dtype=np.float32)

    V = tiny.N_VOCAB
    w = _writer(path, arch)
    t("token_embd.weight", V, E)
    ones("output_norm.weight", E)

    if arch == "mpt":
        w.add_block_count(1)
        w.add_layer_norm_eps(1e-5)
        w.add_max_alibi_bias(8.0)
        ones("blk.0.attn_norm.weight", E)
        t("blk.0.attn_qkv.weight", E + 2 * HKV * HD, E)
        t("blk.0.attn_output.weight", E, E)
        ones("blk.0.ffn_norm.weight", E)
        t("blk.0.ffn_up.weight", F, E)
        t("blk.0.ffn_down.weight", E, F)
    elif arch == "gpt-oss":
        # two layers: layer 0 slides (pattern 2), layer 1 is a full-attention layer with sinks
        n_exp, n_ff_exp = 2, 64
        w.add_block_count(2)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_key_length(HD)
        w.add_value_length(HD)
        w.add_rope_dimension_count(HD)
        w.add_sliding_window(64)
        w.add_expert_count(n_exp)
        w.add_expert_used_count(1)
        w.add_expert_feed_forward_length(n_ff_exp)
        t("output.weight", V, E)
        for il in range(2):
            p = f"blk.{il}."
            ones(p + "attn_norm.weight", E)
            ones(p + "post_attention_norm.weight", E)
            t(p + "attn_q.weight", H * HD, E)
            t(p + "attn_k.weight", HKV * HD, E)
            t(p + "attn_v.weight", HKV * HD, E)
            t(p + "attn_q.bias", H * HD)
            t(p + "attn_k.bias", HKV * HD)
            t(p + "attn_v.bias", HKV * HD)
            t(p + "attn_output.weight", E, H * HD)
            t(p + "attn_output.bias", E)
            t(p + "attn_sinks.weight", H)
            t(p + "ffn_gate_inp.weight", n_exp, E)
            t(p + "ffn_gate_inp.bias", n_exp)
            t(p + "ffn_gate_exps.weight", n_exp, n_ff_exp, E)
            t(p + "ffn_up_exps.weight", n_exp, n_ff_exp, E)
            t(p + "ffn_down_exps.weight", n_exp, E, n_ff_exp)
            t(p + "ffn_gate_exps.bias", n_exp, n_ff_exp)
            t(p + "ffn_up_exps.bias", n_exp, n_ff_exp)
            t(p + "ffn_down_exps.bias", n_exp, E)
    elif arch == "deepseek2":
        # one dense layer, no q LoRA, MLA: latent rank 32, rope dims 16, nope dims 16, v dims 16
        kv_rank, rope, nope, vd = 32, 16, 16, 16
        w.add_block_count(1)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_leading_dense_block_count(1)
        w.add_q_lora_rank(0)
        w.add_kv_lora_rank(kv_rank)
        w.add_key_length(kv_rank + rope)
        w.add_value_length(kv_rank)
        w.add_uint32(f"{arch}.attention.key_length_mla", nope + rope)
        w.add_uint32(f"{arch}.attention.value_length_mla", vd)
        w.add_rope_dimension_count(rope)
        w.add_expert_feed_forward_length(F)
        w.add_expert_shared_count(0)
        w.add_expert_count(0)
        w.add_expert_used_count(0)
        p = "blk.0."
        ones(p + "attn_norm.weight", E)
        ones(p + "attn_kv_a_norm.weight", kv_rank)
        t(p + "attn_q.weight", H * (nope + rope), E)
        t(p + "attn_kv_a_mqa.weight", kv_rank + rope, E)
        t(p + "attn_k_b.weight", H, kv_rank, nope)
        t(p + "attn_v_b.weight", H, vd, kv_rank)
        t(p + "attn_output.weight", E, H * vd)
        ones(p + "ffn_norm.weight", E)
        t(p + "ffn_gate.weight", F, E)
        t(p + "ffn_up.weight", F, E)
        t(p + "ffn_down.weight", E, F)
    elif arch == "t5":
        # one encoder and one decoder layer, relative position buckets (the decoder's self-attention bias)
        del tensors["output_norm.weight"]
        w.add_block_count(1)
        w.add_layer_norm_rms_eps(1e-6)
        w.add_relative_attn_buckets_count(32)
        ones("enc.output_norm.weight", E)
        ones("dec.output_norm.weight", E)
        for part in ("enc", "dec"):
            p = f"{part}.blk.0."
            ones(p + "attn_norm.weight", E)
            for m in ("q", "k", "v", "o"):
                t(p + f"attn_{m}.weight", E, E)
            t(p + "attn_rel_b.weight", 32, H)
            ones(p + "ffn_norm.weight", E)
            t(p + "ffn_up.weight", F, E)
            t(p + "ffn_down.weight", E, F)
        ones("dec.blk.0.cross_attn_norm.weight", E)
        for m in ("q", "k", "v", "o"):
            t(f"dec.blk.0.cross_attn_{m}.weight", E, E)
    else:
        raise ValueError(f"unknown arch {arch!r} (known: {', '.join(ARCHS)})")

    for name, arr in tensors.items():
        w.add_tensor(name, np.ascontiguousarray(arr))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def ensure(outdir: str, arch: str) -> str:
    os.makedirs(outdir, exist_ok=True)
    path = os.path.join(outdir, f"unsupported-{arch}.gguf")
    if not os.path.exists(path):
        tmp = path + f".tmp{os.getpid()}"
        build(arch, tmp)
        os.replace(tmp, path)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.models.unsupported", description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--arch", action="append", choices=ARCHS, help="repeatable; default: all")
    a = ap.parse_args(argv)
    for arch in a.arch or ARCHS:
        path = ensure(a.outdir, arch)
        print(f"{path}  {os.path.getsize(path)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
