"""Independent float64 numpy forward pass of the tiny models, with and without DCA.

Written from the model definitions (llama.cpp 0c1e57098 graphs: rope NORM for llama, NEOX for
the others; gemma's sqrt(E) embedding scale, post norms, tanh-GELU, query scale, final softcap;
gemma4's proportional rope through rope_freqs, V = K without attn_v, weightless RMS norm on V,
shared-KV layers) and DCA from ../../shared/reference/dca.md's table, not from the patch:

  query p_i, key p_j <= p_i, chunk length c = S - w, n(p) = p // c
  intra  n(j) == n(i)      q at p_i mod c               k at p_j mod c
  succ   n(j) == n(i) - 1  q at min(p_i mod c + c, S)   k at p_j mod c
  inter  n(j) <= n(i) - 2  q at S                       k at p_j mod c
  one softmax over the whole causal row.
  DCA layers' logits x (0.1 ln F + 1) for a factor F > 1: llama.cpp's attention temperature (--dca-yarn-factor;
  off by default; its opt-in auto is F = (n_ctx_seq / L)^(1/ln 2) past L, i.e. x (0.1 log2(n_ctx_seq / L) + 1):
  auto_factor()).

DCA applies to every layer of qwen2/qwen3/qwen3moe/llama and to the global (non-sliding)
layers of gemma3/gemma4. Single sequence, positions 0..n-1.

Input embeddings (`embd`): a span of positions takes given vectors instead of token embeddings (no
gemma sqrt(E) scale, as llama.cpp does for raw embeddings) and, when non-causal, its positions see
each other both ways (as a non-causal ubatch of image embeddings does), on every layer (gemma4: only
on its sliding layers, its dense layers stay causal). A key after the query in that span takes, under
DCA, the rule of llama-dca-impl.h: same chunk  q at p_i mod c (the true distance); later chunk  q at
(p_i mod c) - c.
"""

from __future__ import annotations

import math

import gguf
import numpy as np

from dcaforge.gate.gatetools import tiny


def auto_factor(n_ctx: int, n_seq: int = 1, unified: bool = False, n_ctx_train: int = tiny.N_CTX_TRAIN) -> float:
    """The factor --dca-yarn-factor auto (opt-in; the default is off) takes for a context made with -c n_ctx: n_ctx_seq
    (n_ctx padded to 256, per sequence unless unified, padded again) over the trained context, raised to 1/ln 2, past
    it (logits x 0.1 log2(n_ctx_seq / L) + 1), else 0 (off)."""
    def pad(x: int) -> int:
        return (x + 255) // 256 * 256
    n_ctx_seq = pad(n_ctx) if unified else pad(pad(n_ctx) // n_seq)
    return (n_ctx_seq / n_ctx_train) ** (1.0 / math.log(2.0)) if n_ctx_seq > n_ctx_train else 0.0


def pos_temp(pos: np.ndarray, n_ctx_train: int) -> np.ndarray:
    """--dca-yarn-factor pos: each query's scale, 0.1 log2((p + 1) / L) + 1 where p + 1 > L, else 1."""
    seen = (np.asarray(pos) + 1).astype(np.float64)
    return np.where(seen > n_ctx_train, 0.1 * np.log2(np.maximum(seen, 1.0) / n_ctx_train) + 1.0, 1.0)


def load_tensors(path: str) -> dict[str, np.ndarray]:
    r = gguf.GGUFReader(path)
    out = {}
    for t in r.tensors:
        a = np.asarray(t.data)
        if a.dtype == np.float16 or a.dtype == np.float32:
            out[t.name] = a.astype(np.float64).reshape([int(x) for x in reversed(t.shape)])
        else:
            raise ValueError(f"{t.name}: unsupported tensor type {t.tensor_type}")
    return out


def _rms(x: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)


def _rope(x: np.ndarray, pos: np.ndarray, n_rot: int, base: float, neox: bool,
          freq_factors: np.ndarray | None = None, freq_scale: float = 1.0) -> np.ndarray:
    """x [n, H, d], pos [n] -> roped copy (ggml_rope_ext, no YaRN; freq_scale: linear rope scaling)."""
    x = x.copy()
    half = n_rot // 2
    inv = base ** (-2.0 * np.arange(half) / n_rot)
    if freq_factors is not None:
        inv = inv / freq_factors[:half]
    theta = pos[:, None].astype(np.float64) * inv[None, :] * freq_scale   # [n, half]
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    if neox:
        x0, x1 = x[..., :half].copy(), x[..., half:n_rot].copy()
        x[..., :half] = x0 * cos - x1 * sin
        x[..., half:n_rot] = x0 * sin + x1 * cos
    else:
        x0, x1 = x[..., 0:n_rot:2].copy(), x[..., 1:n_rot:2].copy()
        x[..., 0:n_rot:2] = x0 * cos - x1 * sin
        x[..., 1:n_rot:2] = x0 * sin + x1 * cos
    return x


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * x * (1.0 + 0.044715 * x * x)))


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _softmax(s: np.ndarray, axis: int = -1) -> np.ndarray:
    m = s.max(axis=axis, keepdims=True)
    e = np.exp(s - m)
    return e / e.sum(axis=axis, keepdims=True)


def dca_regimes(n: int, S: int, W: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For positions 0..n-1: (regime [n, n] with 0 intra / 1 succ / 2 inter for a key at or before the
    query; for a key after it (attended only in a non-causal span) 0 in the query's chunk, 3 in a later
    one), the four query positions [4, n] (intra, succ, inter, next), the key positions [n])."""
    c = S - W
    p = np.arange(n)
    ni, nj = (p // c)[:, None], (p // c)[None, :]
    reg = np.where(nj == ni, 0, np.where(nj == ni - 1, 1, 2))
    reg = np.where(p[None, :] <= p[:, None], reg, np.where(nj == ni, 0, 3))
    qpos = np.stack([p % c, np.minimum(p % c + c, S), np.full(n, S), p % c - c])
    return reg, qpos, p % c


# K/V cache types whose effect the reference can reproduce: the cache holds round-tripped K and V;
# llama.cpp's CPU flash attention converts Q to K's vec_dot type (q8_0 for q8_0/q5_0/q4_0, q8_1
# for q5_1 - the same values up to its f16 row sum - and bf16 for bf16) and accumulates V in f32
# for these V types (f16 V accumulates in f16, which is not reproduced here).
_QTYPES = {
    "bf16": gguf.GGMLQuantizationType.BF16,
    "q8_0": gguf.GGMLQuantizationType.Q8_0,
    "q5_1": gguf.GGMLQuantizationType.Q5_1,
    "q5_0": gguf.GGMLQuantizationType.Q5_0,
    "q4_0": gguf.GGMLQuantizationType.Q4_0,
}
EMULATED_CACHE_TYPES = tuple(_QTYPES)


def _roundtrip(x: np.ndarray, type_name: str) -> np.ndarray:
    """x [..., d] (d a multiple of 32) through type_name and back, as float64."""
    from gguf import quants
    if type_name in ("f32", "f16"):
        return x.astype(np.float16 if type_name == "f16" else np.float32).astype(np.float64)
    qt = _QTYPES[type_name]
    x32 = np.ascontiguousarray(x, dtype=np.float32)
    return quants.dequantize(quants.quantize(x32, qt), qt).astype(np.float64).reshape(x.shape)


def _q_vec_dot_type(k_type: str) -> str:
    return k_type if k_type in ("bf16", "f16", "f32") else "q8_0"


def forward(path: str, arch: str, tokens: np.ndarray, dca: tuple[int, int] | None = None,
            cache_types: tuple[str, str] | None = None, variant: str = "normal", freq_scale: float = 1.0,
            embd: tuple[int, np.ndarray, bool] | None = None, dca_factor: float = 0.0, dca_pos_len: int = 0,
            self_extend: tuple[int, int] | None = None) -> np.ndarray:
    """Logits [n, n_vocab] (float64) of the tiny model at `path` for `tokens`; dca = (S, w) or None;
    cache_types = (K, V) from EMULATED_CACHE_TYPES to reproduce llama.cpp's flash attention over
    such a cache (None: exact attention); freq_scale = 1/factor of a linear rope scaling;
    embd = (P, vectors [M, n_embd], non_causal): positions [P, P + M) take the vectors instead of
    their tokens (see the module's docstring); dca_factor: F of the attention temperature on the DCA layers
    (0: off, as --dca-yarn-factor 0 or a scaled rope; auto_factor(n_ctx) for llama.cpp's default); dca_pos_len: L of
    --dca-yarn-factor pos (0: off): on the DCA layers a query at p with p + 1 > L scaled by 0.1 log2((p + 1) / L) + 1;
    self_extend = (G, W): Self-Extend on the layers DCA extends (--dca-self-extend G --dca-local-size W, in place of dca):
    a key at distance d = p - p_k < W seen at its true distance, one farther with the query roped at p//G + W - W//G and
    the key at p_k//G (the LongLM paper's grouped attention, written from it)."""
    spec = tiny.spec_for_variant(arch, variant)
    T = load_tensors(path)
    eps = spec.rms_eps
    gemma = arch in ("gemma3", "gemma4")
    neox = arch != "llama"
    n = len(tokens)
    pos = np.arange(n)
    E = spec.n_embd

    x = T["token_embd.weight"][np.asarray(tokens)]
    if gemma:
        x = x * np.sqrt(E)

    if dca is not None:
        reg, qpos_dca, kpos_dca = dca_regimes(n, *dca)
    causal = pos[None, :] <= pos[:, None]
    span_both = np.zeros((n, n), dtype=bool)   # pairs of the non-causal span (both ways)
    if embd is not None:
        e0, vecs, non_causal = embd
        e1 = e0 + len(vecs)
        x = x.copy()
        x[e0:e1] = np.asarray(vecs, dtype=np.float64)
        if non_causal:
            in_span = (pos >= e0) & (pos < e1)
            span_both = in_span[:, None] & in_span[None, :]

    n_layer_kv = spec.n_layer - spec.n_shared_kv
    kv: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    kv_far: dict[int, np.ndarray] = {}   # self_extend: the far keys of a layer whose cache later layers share

    for il in range(spec.n_layer):
        p = f"blk.{il}."
        swa = bool(spec.swa) and spec.swa[il]
        hd = spec.head_dim_swa if (arch == "gemma4" and swa) else spec.head_dim
        H, Hkv = spec.n_head, spec.n_head_kv
        is_se = self_extend is not None and not swa
        is_dca = dca is not None and not swa
        if arch == "gemma4":
            n_rot = spec.head_dim_swa if swa else spec.head_dim
            ff = None if swa else T["rope_freqs.weight"]
        else:
            n_rot, ff = hd, None
        base = spec.rope_base

        h = _rms(x, eps) * T[p + "attn_norm.weight"]
        q = h @ T[p + "attn_q.weight"].T
        if p + "attn_q.bias" in T:
            q = q + T[p + "attn_q.bias"]
        q = q.reshape(n, H, hd)
        if spec.qk_norm:
            q = _rms(q, eps) * T[p + "attn_q_norm.weight"]

        if il < n_layer_kv:
            k = h @ T[p + "attn_k.weight"].T
            if p + "attn_k.bias" in T:
                k = k + T[p + "attn_k.bias"]
            if p + "attn_v.weight" in T:
                v = h @ T[p + "attn_v.weight"].T
                if p + "attn_v.bias" in T:
                    v = v + T[p + "attn_v.bias"]
            else:
                v = k.copy()      # gemma4: V = K (taken before the K norm and rope)
            k = k.reshape(n, Hkv, hd)
            v = v.reshape(n, Hkv, hd)
            if spec.qk_norm:
                k = _rms(k, eps) * T[p + "attn_k_norm.weight"]
            if arch == "gemma4":
                v = _rms(v, eps)
            k_pre = k
            k = _rope(k, kpos_dca if is_dca else pos, n_rot, base, neox, ff, freq_scale)
            if is_se:   # the far keys at p_k // G
                k_far_l = _rope(k_pre, pos // self_extend[0], n_rot, base, neox, ff, freq_scale)
            if cache_types is not None:
                k = _roundtrip(k.reshape(n, Hkv * hd), cache_types[0]).reshape(n, Hkv, hd)
                v = _roundtrip(v.reshape(n, Hkv * hd), cache_types[1]).reshape(n, Hkv, hd)
            kv[il] = (k, v)
            if is_se:
                kv_far[il] = k_far_l
        else:
            k, v = kv[n_layer_kv - (2 if swa else 1)]
            k_far_l = kv_far.get(n_layer_kv - (2 if swa else 1))

        if is_dca:
            qs = [_rope(q, qpos_dca[r], n_rot, base, neox, ff, freq_scale) for r in range(4)]
        elif is_se:
            G, W = self_extend
            qs = [_rope(q, pos, n_rot, base, neox, ff, freq_scale),
                  _rope(q, pos // G + W - W // G, n_rot, base, neox, ff, freq_scale)]
        else:
            qs = [_rope(q, pos, n_rot, base, neox, ff, freq_scale)]

        if arch == "gemma3":
            qs = [qq / np.sqrt(hd) for qq in qs]
            kq_scale = 1.0
        elif arch == "gemma4":
            kq_scale = 1.0
        else:
            kq_scale = 1.0 / np.sqrt(hd)
        if is_dca and dca_factor > 1.0:   # in the attention's scale, as llama.cpp's kq_scale (after Q's rounding)
            kq_scale *= 0.1 * np.log(dca_factor) + 1.0
        if is_dca and dca_pos_len > 0:    # per query row, as llama.cpp's scale of Q's rows (before Q's rounding)
            m = pos_temp(pos, dca_pos_len)
            qs = [qq * m[:, None, None] for qq in qs]
        if cache_types is not None:
            qs = [_roundtrip(qq, _q_vec_dot_type(cache_types[0])) for qq in qs]

        allowed = causal
        if arch != "gemma4" or swa:
            allowed = allowed | span_both
        if swa:
            allowed = allowed & (pos[:, None] - pos[None, :] < spec.n_swa)

        out = np.empty((n, H, hd))
        g = H // Hkv
        for hh in range(H):
            kh, vh = k[:, hh // g, :], v[:, hh // g, :]
            if is_dca:
                s3 = np.stack([qq[:, hh, :] @ kh.T for qq in qs])        # [4, n, n]
                s = np.take_along_axis(s3, np.maximum(reg, 0)[None], axis=0)[0]
            elif is_se:
                near = pos[:, None] - pos[None, :] < self_extend[1]
                s = np.where(near, qs[0][:, hh, :] @ kh.T, qs[1][:, hh, :] @ k_far_l[:, hh // g, :].T)
            else:
                s = qs[0][:, hh, :] @ kh.T
            s = np.where(allowed, s * kq_scale, -np.inf)
            out[:, hh, :] = _softmax(s) @ vh
        o = out.reshape(n, H * hd) @ T[p + "attn_output.weight"].T
        if spec.post_norms:
            o = _rms(o, eps) * T[p + "post_attention_norm.weight"]
        x = x + o

        h = _rms(x, eps) * T[p + "ffn_norm.weight"]
        if spec.n_expert:
            logits_g = h @ T[p + "ffn_gate_inp.weight"].T
            probs = _softmax(logits_g)
            top = np.argsort(-probs, axis=-1, kind="stable")[:, : spec.n_expert_used]
            wts = np.take_along_axis(probs, top, axis=-1)
            wts = wts / wts.sum(axis=-1, keepdims=True)
            f = np.zeros_like(x)
            for e in range(spec.n_expert):
                sel = (top == e)
                rows = sel.any(axis=-1)
                if not rows.any():
                    continue
                he = h[rows]
                a = _silu(he @ T[p + "ffn_gate_exps.weight"][e].T) * (he @ T[p + "ffn_up_exps.weight"][e].T)
                y = a @ T[p + "ffn_down_exps.weight"][e].T
                f[rows] += (wts * sel).sum(axis=-1)[rows, None] * y
        else:
            act = _gelu_tanh if gemma else _silu
            f = (act(h @ T[p + "ffn_gate.weight"].T) * (h @ T[p + "ffn_up.weight"].T)) @ T[p + "ffn_down.weight"].T
        if spec.post_norms:
            f = _rms(f, eps) * T[p + "post_ffw_norm.weight"]
        x = x + f

    x = _rms(x, eps) * T["output_norm.weight"]
    W_out = T.get("output.weight", T["token_embd.weight"])
    logits = x @ W_out.T
    if spec.softcap:
        logits = spec.softcap * np.tanh(logits / spec.softcap)
    return logits


def embd_for(seed: int, n: int, n_embd: int) -> np.ndarray:
    """The vectors dcaforge/gate/gatetools/dca_embd.cpp generates for --embd-seed/--embd-n: [n, n_embd], uniform in
    [-1, 1) from a 64-bit LCG (float32 values, as float64)."""
    mask = (1 << 64) - 1
    a, b = 6364136223846793005, 1442695040888963407
    s = seed & mask
    out = np.empty(n * n_embd, dtype=np.float64)
    for i in range(n * n_embd):
        s = (s * a + b) & mask
        out[i] = np.float32((s >> 40) / 16777216.0 * 2.0 - 1.0)
    return out.reshape(n, n_embd)


def tokens_for(seed: int, n_tokens: int, bos: int = tiny.BOS_ID) -> np.ndarray:
    """The sequence dca_logits generates for --seed/--n-tokens: BOS, then LCG bytes."""
    mask = (1 << 64) - 1
    a, b = 6364136223846793005, 1442695040888963407
    s = (seed * a + b) & mask
    out = [bos]
    for _ in range(1, n_tokens):
        s = (s * a + b) & mask
        out.append((s >> 33) & 0xFF)
    return np.array(out, dtype=np.int64)
