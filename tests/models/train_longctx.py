"""Train the long-context test model: a small qwen2-shape byte-level model with a 256-token
trained context, written as GGUF (f32) for the DCA extension test (tests/e2e/test_longctx_model.py).

CPU only, seeded, a fixed number of steps (about 10 minutes on 2 cores). Recipe and figures:
tests/models/longctx.md.

Data: the top-level .py files of the running Python's standard library (sorted by name,
concatenated, each preceded by a "# file: NAME" line). The files whose sorted index is a multiple
of HOLDOUT_EVERY are held out: they never enter training; their text is written to
--heldout (committed as tests/models/longctx-heldout.txt, so the test does not depend on the
Python version of the machine that runs it).

Model: qwen2 shape (RMSNorm, NEOX rope theta 1e4, q/k/v biases, SwiGLU, GQA, tied embeddings),
byte-level vocabulary of dcaforge/gate/gatetools/tiny.py (BOS 256 + the 256 raw bytes, EOS 257). Each
training sequence is BOS + 255 bytes (what llama-perplexity feeds: it puts BOS first in each chunk).

Usage: python -m tests.models.train_longctx [--out tests/models/longctx-qwen2.gguf]
         [--heldout tests/models/longctx-heldout.txt] [--steps N] [--log FILE]
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import sys
import sysconfig
import time

import gguf
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from dcaforge.gate.gatetools.tiny import BOS_ID, EOS_ID, N_VOCAB, bytes_to_unicode

SEED = 20261130
CTX = 256            # trained context (tokens, BOS included)
HOLDOUT_EVERY = 12   # held-out files: sorted index % HOLDOUT_EVERY == 0

# architecture
N_EMBD = 192
N_LAYER = 4
N_HEAD = 4
N_HEAD_KV = 2
HEAD_DIM = 48
N_FF = 512
ROPE_BASE = 10000.0
RMS_EPS = 1e-6

# optimisation
BATCH = 16
LR = 3e-3
WARMUP = 50
WEIGHT_DECAY = 0.05


def load_text() -> tuple[bytes, bytes, list[str]]:
    stdlib = sysconfig.get_paths()["stdlib"]
    files = sorted(glob.glob(os.path.join(stdlib, "*.py")))
    train, held, names = [], [], []
    for i, f in enumerate(files):
        name = os.path.basename(f)
        with open(f, "rb") as fh:
            data = b"# file: " + name.encode() + b"\n" + fh.read() + b"\n"
        if i % HOLDOUT_EVERY == 0:
            held.append(data)
            names.append(name)
        else:
            train.append(data)
    return b"".join(train), b"".join(held), names


class RMSNorm(nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + RMS_EPS) * self.weight


def rope_tables(n: int):
    inv = 1.0 / (ROPE_BASE ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float32) / HEAD_DIM))
    ang = torch.arange(n, dtype=torch.float32)[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], dim=-1)            # NEOX: halves, not interleaved pairs
    return ang.cos(), ang.sin()


def rotate_half(x):
    a, b = x[..., : HEAD_DIM // 2], x[..., HEAD_DIM // 2:]
    return torch.cat([-b, a], dim=-1)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn_norm = RMSNorm(N_EMBD)
        self.q = nn.Linear(N_EMBD, N_HEAD * HEAD_DIM, bias=True)
        self.k = nn.Linear(N_EMBD, N_HEAD_KV * HEAD_DIM, bias=True)
        self.v = nn.Linear(N_EMBD, N_HEAD_KV * HEAD_DIM, bias=True)
        self.o = nn.Linear(N_HEAD * HEAD_DIM, N_EMBD, bias=False)
        self.ffn_norm = RMSNorm(N_EMBD)
        self.gate = nn.Linear(N_EMBD, N_FF, bias=False)
        self.up = nn.Linear(N_EMBD, N_FF, bias=False)
        self.down = nn.Linear(N_FF, N_EMBD, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        h = self.attn_norm(x)
        q = self.q(h).view(B, T, N_HEAD, HEAD_DIM).transpose(1, 2)
        k = self.k(h).view(B, T, N_HEAD_KV, HEAD_DIM).transpose(1, 2)
        v = self.v(h).view(B, T, N_HEAD_KV, HEAD_DIM).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = N_HEAD // N_HEAD_KV
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(B, T, N_HEAD * HEAD_DIM))
        h = self.ffn_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embd = nn.Embedding(N_VOCAB, N_EMBD)
        self.blocks = nn.ModuleList(Block() for _ in range(N_LAYER))
        self.norm = RMSNorm(N_EMBD)
        nn.init.normal_(self.embd.weight, std=0.02)
        for b in self.blocks:
            for lin in (b.q, b.k, b.v, b.gate, b.up):
                nn.init.normal_(lin.weight, std=0.02)
            for lin in (b.o, b.down):
                nn.init.normal_(lin.weight, std=0.02 / math.sqrt(2 * N_LAYER))
            for lin in (b.q, b.k, b.v):
                nn.init.zeros_(lin.bias)

    def forward(self, idx):
        T = idx.shape[1]
        cos, sin = rope_tables(T)
        x = self.embd(idx)
        for b in self.blocks:
            x = b(x, cos, sin)
        return self.norm(x) @ self.embd.weight.T      # tied output head


def batch_from(data: np.ndarray, rng: np.random.Generator, n: int):
    """Inputs BOS + CTX-1 bytes (positions 0..CTX-1, as a llama-perplexity chunk of CTX), targets
    the next byte at every position."""
    starts = rng.integers(0, len(data) - CTX - 1, size=n)
    seq = np.stack([data[s: s + CTX + 1] for s in starts]).astype(np.int64)
    seq[:, 0] = BOS_ID
    return torch.from_numpy(seq[:, :-1].copy()), torch.from_numpy(seq[:, 1:].copy())


def loss_of(model, data, rng, n):
    x, y = batch_from(data, rng, n)
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, N_VOCAB), y.reshape(-1))


def write_gguf(model: Model, path: str) -> None:
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    w = gguf.GGUFWriter(path, "qwen2")
    w.add_name("dcaforge-longctx-qwen2")
    w.add_context_length(CTX)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_layer_norm_rms_eps(RMS_EPS)
    w.add_rope_freq_base(ROPE_BASE)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(bytes_to_unicode() + ["<|bos|>", "<|endoftext|>"])
    w.add_token_types([gguf.TokenType.NORMAL] * 256 + [gguf.TokenType.CONTROL] * 2)
    w.add_token_merges(["<|bos|> <|endoftext|>"])
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(EOS_ID)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)

    def t(name, arr):
        w.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))

    # torch Linear weight is [out, in] = numpy shape of ggml [in, out]: no transpose needed.
    # qwen2 is NEOX rope in llama.cpp, as in this model: no q/k row permutation.
    t("token_embd.weight", sd["embd.weight"])
    t("output_norm.weight", sd["norm.weight"])
    for i in range(N_LAYER):
        p, s = f"blk.{i}.", f"blocks.{i}."
        t(p + "attn_norm.weight", sd[s + "attn_norm.weight"])
        for g, m in (("attn_q", "q"), ("attn_k", "k"), ("attn_v", "v")):
            t(p + g + ".weight", sd[s + m + ".weight"])
            t(p + g + ".bias", sd[s + m + ".bias"])
        t(p + "attn_output.weight", sd[s + "o.weight"])
        t(p + "ffn_norm.weight", sd[s + "ffn_norm.weight"])
        t(p + "ffn_gate.weight", sd[s + "gate.weight"])
        t(p + "ffn_up.weight", sd[s + "up.weight"])
        t(p + "ffn_down.weight", sd[s + "down.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "longctx-qwen2.gguf"))
    ap.add_argument("--heldout", default=os.path.join(here, "longctx-heldout.txt"))
    ap.add_argument("--heldout-bytes", type=int, default=40000,
                    help="bytes of held-out text written to --heldout")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--log", default=None, help="JSON lines of the loss curve")
    a = ap.parse_args(argv)

    torch.manual_seed(SEED)
    torch.set_num_threads(a.threads)
    torch.use_deterministic_algorithms(True)
    rng = np.random.default_rng(SEED)

    train, held, held_names = load_text()
    with open(a.heldout, "wb") as fh:
        fh.write(held[: a.heldout_bytes])
    print(f"train {len(train)} bytes, held out {len(held)} bytes ({len(held_names)} files), "
          f"wrote {min(len(held), a.heldout_bytes)} to {a.heldout}", flush=True)
    tr = np.frombuffer(train, dtype=np.uint8)
    he = np.frombuffer(held, dtype=np.uint8)

    model = Model()
    n_param = sum(p.numel() for p in model.parameters())
    print(f"params {n_param}", flush=True)
    decay = [p for n, p in model.named_parameters() if p.dim() == 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                             {"params": no_decay, "weight_decay": 0.0}], lr=LR, betas=(0.9, 0.95))

    def lr_at(step):
        if step < WARMUP:
            return LR * (step + 1) / WARMUP
        pr = (step - WARMUP) / max(1, a.steps - WARMUP)
        return LR * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * pr)))

    log = open(a.log, "w") if a.log else None
    t0 = time.time()
    ema = None
    for step in range(a.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        model.train()
        loss = loss_of(model, tr, rng, BATCH)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        rec = {"step": step + 1, "loss": round(loss.item(), 4), "t": round(time.time() - t0, 1)}
        if (step + 1) % 100 == 0 or step + 1 == a.steps:
            model.eval()
            with torch.no_grad():
                vl = loss_of(model, he, np.random.default_rng(1), 16).item()
            rec["heldout_loss"] = round(vl, 4)
            print(f"step {step + 1} loss {loss.item():.4f} ema {ema:.4f} held-out {vl:.4f} "
                  f"(ppl {math.exp(vl):.3f}) {time.time() - t0:.0f}s", flush=True)
        if log:
            log.write(json.dumps(rec) + "\n")
    if log:
        log.close()
    write_gguf(model, a.out)
    print(f"wrote {a.out} ({os.path.getsize(a.out)} bytes) in {time.time() - t0:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
