"""Deterministic writer of tiny random-weight GGUF models for the DCA tests.

One model per architecture that patch 0078-dca hooks: qwen2, qwen3, qwen3moe, llama,
gemma3 (sliding/global mix), gemma4 (sliding/global mix, head dim 512 on the global layers and
64 on the sliding ones, a global layer without attn_v (K = V), two shared-KV layers).
Keys and tensors follow the project's tiny-gguf reference notes (llama.cpp 0c1e57098).

Every model has the same byte-level tokenizer (258 tokens: the 256 GPT-2 byte characters, then
<|bos|> = 256 and <|endoftext|> = 257) and a trained context of 256 tokens.
Weights are seeded from (seed, arch, variant, tensor name), so a file is byte-identical across
runs and machines.

Variant "zero-global": the attention output projection (attn_output) of every global
(non-sliding) layer is zero, so the global layers contribute nothing; with DCA touching only
global layers, such a model must give the same logits with DCA on and off at any length. Only
meaningful for gemma3 / gemma4 (for the other archs every layer is global).

Variant "one-layer": the first layer alone (gemma3: one global layer, no sliding window; not for
gemma4, whose shared-KV layout needs four layers). With one layer the K and V of a token depend
on that token only, so a context shift (cells removed and positions moved) must give exactly the
cache a fresh evaluation at the new positions gives: the K-shift check of the DCA tests.

Named shapes (SHAPES, build_shape): the layer shapes of a real model with random weights, for speed measurements
(speed does not depend on weight values). "qwen2-0.5b" is Qwen2.5-0.5B's shape: n_embd 896, 24 layers, 14 heads,
2 KV heads, head dim 64, n_ff 4864, q/k/v biases, rope base 1e6, trained context 32768; 2-D weights F16 by default
(norms and biases F32). The vocabulary stays the 258-token byte tokenizer, so the model lacks Qwen's 151,936-token
output matmul: attention is a larger share of the time than in the real model.

CLI: python -m dcaforge.gate.gatetools.tiny OUTDIR [--arch A ...] [--variant normal|zero-global|one-layer] [--seed N]
     python -m dcaforge.gate.gatetools.tiny OUTDIR --shape qwen2-0.5b [--dtype f16|f32] [--seed N]
       (writes OUTDIR/qwen2-0.5b-shape-f16.gguf, through a temporary file)
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import gguf
import numpy as np

ARCHS = ("qwen2", "qwen3", "qwen3moe", "llama", "gemma3", "gemma4")
SWA_ARCHS = ("gemma3", "gemma4")
VARIANTS = ("normal", "zero-global", "one-layer")

N_CTX_TRAIN = 256
N_VOCAB = 258
BOS_ID = 256
EOS_ID = 257
DEFAULT_SEED = 1234


def bytes_to_unicode() -> list[str]:
    """GPT-2's byte -> printable unicode character table; index = byte value."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, (chr(c) for c in cs), strict=True))
    return [table[b] for b in range(256)]


@dataclass
class Spec:
    arch: str
    n_embd: int = 128
    n_layer: int = 3
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 32
    n_ff: int = 256
    rope_base: float = 10000.0
    rms_eps: float = 1e-6
    qkv_bias: bool = False
    qk_norm: bool = False
    post_norms: bool = False            # gemma: post_attention_norm / post_ffw_norm
    # MoE (qwen3moe)
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    # sliding window (gemma)
    swa: list[bool] = field(default_factory=list)   # per layer, True = sliding
    n_swa: int = 0
    head_dim_swa: int = 0               # gemma4
    n_shared_kv: int = 0                # gemma4
    no_v_layers: tuple[int, ...] = ()   # gemma4: layers without attn_v (V = K)
    rope_dims_global: int = 0           # gemma4: rotated dims on global layers (rope_freqs)
    qk_norm_scale: float = 1.0          # weight of q/k norms (gemma4 has attention scale 1)
    softcap: float | None = None


#: Real models' shapes: arch, Spec fields, trained context. Random weights; only the shapes are the real model's.
SHAPES: dict[str, dict] = {
    "qwen2-0.5b": {   # Qwen2.5-0.5B (config.json of Qwen/Qwen2.5-0.5B); tied embeddings there, untied (V = 258) here
        "arch": "qwen2", "n_ctx_train": 32768,
        "spec": {"n_embd": 896, "n_layer": 24, "n_head": 14, "n_head_kv": 2, "head_dim": 64, "n_ff": 4864,
                 "rope_base": 1000000.0, "qkv_bias": True},
    },
}
DTYPES = ("f16", "f32")


def spec_for(arch: str) -> Spec:
    if arch == "llama":
        return Spec(arch, n_embd=128, n_layer=3, n_head=4, n_head_kv=2, head_dim=32, n_ff=256)
    if arch == "qwen2":
        return Spec(arch, n_embd=128, n_layer=3, n_head=4, n_head_kv=2, head_dim=32, n_ff=256,
                    qkv_bias=True)
    if arch == "qwen3":
        # head_dim * n_head != n_embd, as in the real Qwen3 models
        return Spec(arch, n_embd=128, n_layer=3, n_head=4, n_head_kv=2, head_dim=64, n_ff=256,
                    qk_norm=True)
    if arch == "qwen3moe":
        return Spec(arch, n_embd=128, n_layer=3, n_head=4, n_head_kv=2, head_dim=64, n_ff=256,
                    qk_norm=True, n_expert=4, n_expert_used=2, n_ff_exp=64)
    if arch == "gemma3":
        # layers: sliding, global, sliding, global (pattern 2: layer i slides if i % 2 < 1)
        return Spec(arch, n_embd=128, n_layer=4, n_head=2, n_head_kv=1, head_dim=64, n_ff=256,
                    qk_norm=True, post_norms=True, swa=[True, False, True, False], n_swa=64,
                    softcap=None)
    if arch == "gemma4":
        # layers 0..5: S G S G S G; layers 4, 5 share the KV of layers 2 (sliding) and 3 (global);
        # layer 1 (global) has no attn_v (V = K)
        return Spec(arch, n_embd=128, n_layer=6, n_head=2, n_head_kv=1, head_dim=512, n_ff=256,
                    qk_norm=True, post_norms=True, swa=[True, False, True, False, True, False],
                    n_swa=64, head_dim_swa=64, n_shared_kv=2, no_v_layers=(1,),
                    rope_dims_global=128, qk_norm_scale=0.25, softcap=30.0)
    raise ValueError(f"unknown arch {arch!r} (known: {', '.join(ARCHS)})")


class _Rng:
    """Per-tensor deterministic generator: independent of the order tensors are written in."""

    def __init__(self, seed: int, arch: str):
        # the variant is not part of the seed: variants differ only where they say they do
        self.base = f"{seed}/{arch}"

    def gen(self, name: str) -> np.random.Generator:
        h = hashlib.sha256(f"{self.base}/{name}".encode()).digest()
        return np.random.default_rng(int.from_bytes(h[:8], "little"))

    def normal(self, name: str, shape: tuple[int, ...], std: float) -> np.ndarray:
        return (self.gen(name).standard_normal(shape) * std).astype(np.float32)

    def norm_w(self, name: str, n: int, scale: float = 1.0) -> np.ndarray:
        # norm weights around `scale` (llama.cpp multiplies by the stored value as is)
        return (scale * (1.0 + 0.1 * self.gen(name).standard_normal(n))).astype(np.float32)


def spec_for_variant(arch: str, variant: str = "normal") -> Spec:
    spec = spec_for(arch)
    if variant == "one-layer":
        if arch == "gemma4":
            raise ValueError("no one-layer variant of gemma4 (shared-KV layers need n_layer >= 4)")
        spec.n_layer = 1
        spec.swa = []
        spec.n_swa = 0
    return spec


def _is_swa(spec: Spec, il: int) -> bool:
    return bool(spec.swa) and spec.swa[il]


def build(arch: str, path: str, variant: str = "normal", seed: int = DEFAULT_SEED,
          n_ctx_train: int = N_CTX_TRAIN, kv: dict[str, int | float | str] | None = None) -> str:
    """Write the tiny model of `arch` to `path`; returns path. n_ctx_train: the GGUF's context_length;
    kv: more metadata, "{arch}" in a key replaced by the arch (int -> uint32, float -> float32, str)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}")
    return _write(spec_for_variant(arch, variant), path, f"dcaforge-tiny-{arch}-{variant}", _Rng(seed, arch),
                  n_ctx_train, kv, zero_global=variant == "zero-global")


def build_shape(shape: str, path: str, seed: int = DEFAULT_SEED, dtype: str = "f16",
                **overrides: int | float | bool) -> str:
    """Write a random-weight model of the named real model's shape (SHAPES) to `path`; returns path.
    dtype: of the 2-D weights (norms and biases stay F32); overrides: Spec fields to change (n_layer=1, ...),
    for a smaller model of the same kind."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r} (known: {', '.join(SHAPES)})")
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r} (known: {', '.join(DTYPES)})")
    entry = SHAPES[shape]
    fields = {f.name for f in dataclasses.fields(Spec)} - {"arch"}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(f"unknown Spec field(s) {', '.join(unknown)} (known: {', '.join(sorted(fields))})")
    spec = Spec(entry["arch"], **{**entry["spec"], **overrides})
    return _write(spec, path, f"dcaforge-shape-{shape}", _Rng(seed, f"shape-{shape}"), entry["n_ctx_train"],
                  f16=dtype == "f16")


def _write(spec: Spec, path: str, name: str, rng: _Rng, n_ctx_train: int,
           kv: dict[str, int | float | str] | None = None, zero_global: bool = False, f16: bool = False) -> str:
    w = gguf.GGUFWriter(path, spec.arch)
    _add_hparams(w, spec, name, n_ctx_train, f16)
    _add_kv(w, spec.arch, kv or {})
    _add_tokenizer(w)

    def t(name: str, arr: np.ndarray) -> None:
        # numpy shapes are the reverse of ggml's ne; with f16, matrices are F16 (norms, biases: F32)
        dtype = np.float16 if f16 and arr.ndim >= 2 else np.float32
        w.add_tensor(name, np.ascontiguousarray(arr, dtype=dtype))

    _add_global_tensors(t, spec, rng)
    for il in range(spec.n_layer):
        _add_layer_tensors(t, spec, rng, il, zero_global)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _add_hparams(w: gguf.GGUFWriter, spec: Spec, name: str, n_ctx_train: int, f16: bool) -> None:
    """The architecture's hyperparameters (and, per architecture, its experts, sliding window, softcap)."""
    arch = spec.arch
    w.add_name(name)
    w.add_context_length(n_ctx_train)
    w.add_embedding_length(spec.n_embd)
    w.add_block_count(spec.n_layer)
    w.add_feed_forward_length(spec.n_ff)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(spec.n_head_kv)
    w.add_layer_norm_rms_eps(spec.rms_eps)
    w.add_rope_freq_base(spec.rope_base)
    w.add_key_length(spec.head_dim)
    w.add_value_length(spec.head_dim)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if f16 else gguf.LlamaFileType.ALL_F32)
    if arch == "llama":
        w.add_rope_dimension_count(spec.head_dim)
    if arch == "qwen3moe":
        w.add_expert_count(spec.n_expert)
        w.add_expert_used_count(spec.n_expert_used)
        w.add_expert_feed_forward_length(spec.n_ff_exp)
    if arch == "gemma3" and spec.n_swa:
        w.add_sliding_window(spec.n_swa)
        w.add_sliding_window_pattern(2)          # layer i slides if i % 2 < 1
        w.add_rope_freq_base_swa(spec.rope_base)
    if arch == "gemma4":
        w.add_sliding_window(spec.n_swa)
        w.add_sliding_window_pattern(list(spec.swa))   # must be a bool array for gemma4
        w.add_embedding_length_per_layer_input(0)
        w.add_key_length_swa(spec.head_dim_swa)
        w.add_value_length_swa(spec.head_dim_swa)
        w.add_rope_dimension_count(spec.head_dim)
        w.add_rope_dimension_count_swa(spec.head_dim_swa)
        w.add_rope_freq_base_swa(spec.rope_base)
        w.add_shared_kv_layers(spec.n_shared_kv)
    if spec.softcap is not None:
        w.add_final_logit_softcapping(spec.softcap)


def _add_kv(w: gguf.GGUFWriter, arch: str, kv: dict[str, int | float | str]) -> None:
    """Further keys (``{arch}`` in a key is the architecture): bool, uint32, float32 or string by the value's type."""
    for key, value in kv.items():
        key = key.replace("{arch}", arch)
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        else:
            w.add_string(key, str(value))


def _add_tokenizer(w: gguf.GGUFWriter) -> None:
    """The tokenizer: BOS + raw bytes."""
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(bytes_to_unicode() + ["<|bos|>", "<|endoftext|>"])
    w.add_token_types([gguf.TokenType.NORMAL] * 256 + [gguf.TokenType.CONTROL] * 2)
    w.add_token_merges(["<|bos|> <|endoftext|>"])   # never fires; an empty list is dropped
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(EOS_ID)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)


def _add_global_tensors(t: Callable[[str, np.ndarray], None], spec: Spec, rng: _Rng) -> None:
    """The embedding, the output norm and head, and gemma4's rope frequencies."""
    arch, E = spec.arch, spec.n_embd
    emb_std = 1.0 / np.sqrt(E) if arch in SWA_ARCHS else 0.5   # gemma scales embeddings by sqrt(E)
    t("token_embd.weight", rng.normal("token_embd", (N_VOCAB, E), emb_std))
    t("output_norm.weight", rng.norm_w("output_norm", E))
    if arch not in SWA_ARCHS:
        # untied output head; gemma ties it to the embedding
        t("output.weight", rng.normal("output", (N_VOCAB, E), 0.1))
    if arch == "gemma4":
        # proportional rope of the global layers: the first rope_dims_global dims rotate
        nf = spec.head_dim // 2
        ff = np.full(nf, 1e30, dtype=np.float32)
        ff[: spec.rope_dims_global // 2] = 1.0
        t("rope_freqs.weight", ff)


def _add_layer_tensors(t: Callable[[str, np.ndarray], None], spec: Spec, rng: _Rng, il: int, zero_global: bool) -> None:
    """Layer ``il``'s attention (K and V only on layers that have their own KV) and its feed-forward or experts;
    ``zero_global``: a global layer's attention output is zero."""
    arch, E, F = spec.arch, spec.n_embd, spec.n_ff
    p = f"blk.{il}."
    swa = _is_swa(spec, il)
    hd = spec.head_dim_swa if (arch == "gemma4" and swa) else spec.head_dim
    q_dim = hd * spec.n_head
    kv_dim = hd * spec.n_head_kv
    has_kv = il < spec.n_layer - spec.n_shared_kv
    proj_std = 1.0 / np.sqrt(E)

    t(p + "attn_norm.weight", rng.norm_w(p + "attn_norm", E))
    t(p + "attn_q.weight", rng.normal(p + "attn_q", (q_dim, E), proj_std))
    if has_kv:
        t(p + "attn_k.weight", rng.normal(p + "attn_k", (kv_dim, E), proj_std))
        if il not in spec.no_v_layers:
            t(p + "attn_v.weight", rng.normal(p + "attn_v", (kv_dim, E), proj_std))
    if spec.qkv_bias:
        t(p + "attn_q.bias", rng.normal(p + "attn_q.bias", (q_dim,), 0.1))
        t(p + "attn_k.bias", rng.normal(p + "attn_k.bias", (kv_dim,), 0.1))
        t(p + "attn_v.bias", rng.normal(p + "attn_v.bias", (kv_dim,), 0.1))
    wo = rng.normal(p + "attn_output", (E, q_dim), 1.0 / np.sqrt(q_dim))
    if zero_global and not swa:
        wo[...] = 0.0
    t(p + "attn_output.weight", wo)
    if spec.qk_norm:
        t(p + "attn_q_norm.weight", rng.norm_w(p + "attn_q_norm", hd, spec.qk_norm_scale))
        if has_kv:
            t(p + "attn_k_norm.weight", rng.norm_w(p + "attn_k_norm", hd, spec.qk_norm_scale))
    if spec.post_norms:
        t(p + "post_attention_norm.weight", rng.norm_w(p + "post_attention_norm", E))
        t(p + "post_ffw_norm.weight", rng.norm_w(p + "post_ffw_norm", E))

    t(p + "ffn_norm.weight", rng.norm_w(p + "ffn_norm", E))
    if spec.n_expert:
        ne, fe = spec.n_expert, spec.n_ff_exp
        t(p + "ffn_gate_inp.weight", rng.normal(p + "ffn_gate_inp", (ne, E), 0.5))
        t(p + "ffn_gate_exps.weight", rng.normal(p + "ffn_gate_exps", (ne, fe, E), 1.0 / np.sqrt(E)))
        t(p + "ffn_up_exps.weight", rng.normal(p + "ffn_up_exps", (ne, fe, E), 1.0 / np.sqrt(E)))
        t(p + "ffn_down_exps.weight", rng.normal(p + "ffn_down_exps", (ne, E, fe), 1.0 / np.sqrt(fe)))
    else:
        t(p + "ffn_gate.weight", rng.normal(p + "ffn_gate", (F, E), 1.0 / np.sqrt(E)))
        t(p + "ffn_up.weight", rng.normal(p + "ffn_up", (F, E), 1.0 / np.sqrt(E)))
        t(p + "ffn_down.weight", rng.normal(p + "ffn_down", (E, F), 1.0 / np.sqrt(F)))


def model_path(outdir: str, arch: str, variant: str = "normal") -> str:
    suffix = "" if variant == "normal" else f"-{variant}"
    return os.path.join(outdir, f"tiny-{arch}{suffix}.gguf")


def ensure(outdir: str, arch: str, variant: str = "normal", seed: int = DEFAULT_SEED) -> str:
    """Write the model into outdir unless it is already there; returns its path."""
    os.makedirs(outdir, exist_ok=True)
    path = model_path(outdir, arch, variant)
    if not os.path.exists(path):
        tmp = path + f".tmp{os.getpid()}"
        build(arch, tmp, variant, seed)
        os.replace(tmp, path)
    return path


def shape_path(outdir: str, shape: str, dtype: str = "f16") -> str:
    return os.path.join(outdir, f"{shape}-shape-{dtype}.gguf")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dcaforge.gate.gatetools.tiny", description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--arch", action="append", choices=ARCHS, help="repeatable; default: all")
    ap.add_argument("--variant", action="append", choices=VARIANTS,
                    help="repeatable; default: normal (zero-global is written for gemma3/gemma4 only)")
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    ap.add_argument("--shape", choices=tuple(SHAPES),
                    help="instead of the tiny models: one model of this real model's shape (random weights)")
    ap.add_argument("--dtype", choices=DTYPES, default="f16", help="with --shape: type of the 2-D weights")
    a = ap.parse_args(argv)
    if a.shape and (a.arch or a.variant):
        ap.error("--shape writes one model of its own: no --arch or --variant with it")
    os.makedirs(a.outdir, exist_ok=True)
    if a.shape:
        # through a temporary file: an interrupted write leaves no model behind that looks whole
        path = shape_path(a.outdir, a.shape, a.dtype)
        tmp = path + f".tmp{os.getpid()}"
        try:
            build_shape(a.shape, tmp, a.seed, a.dtype)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        print(f"{path}  {os.path.getsize(path)} bytes")
        return 0
    for arch in a.arch or ARCHS:
        for variant in a.variant or ["normal"]:
            if variant == "zero-global" and arch not in SWA_ARCHS:
                continue
            if variant == "one-layer" and arch == "gemma4":
                continue
            path = model_path(a.outdir, arch, variant)
            build(arch, path, variant, a.seed)
            print(f"{path}  {os.path.getsize(path)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
