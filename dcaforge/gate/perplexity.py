"""llama-perplexity's figure: parsed from its output, or recovered from its ``--kl-divergence-base`` file when its
logger lost the output's tail."""

from __future__ import annotations

import math
import os
import re
import struct
from collections.abc import Sequence
from pathlib import Path

from dcaforge.gate.context import GateContext

#: Runs of llama-perplexity / llama-passkey whose output lost its tail are run again this many times.
RETRIES = 8

_PPL = re.compile(r"Final estimate: PPL = ([0-9.]+|nan|inf)")


def parse_perplexity(text: str) -> float | None:
    """``Final estimate: PPL = 12.3456 +/- ...`` of llama-perplexity."""
    m = _PPL.search(text)
    return float(m.group(1)) if m else None


#: the largest --kl-divergence-base file the extension gate writes to recover a perplexity its logger lost
LOGITS_FILE_MAX = 256 << 20


def perplexity_from_logits(path: Path) -> float | None:
    """The perplexity of a llama-perplexity run from its ``--kl-divergence-base`` file (tools/perplexity: "_logits_",
    int32 n_ctx, n_vocab, n_chunk, the tokens, then per chunk the second half of its window: per scored token two F32
    (scale, min log-prob) and n_vocab uint16 levels, nv = 2*ceil(n_vocab/2) + 4 uint16 in all); log p of the next
    token = min log-prob + scale * level. None when the file is short or malformed."""
    import numpy as np

    try:
        data = path.read_bytes()
    except OSError:
        return None
    if len(data) < 20 or data[:8] != b"_logits_":
        return None
    n_ctx, n_vocab, n_chunk = struct.unpack_from("<iii", data, 8)
    if n_ctx < 2 or n_vocab < 1 or n_chunk < 1:
        return None
    off = 20
    tokens = np.frombuffer(data, dtype="<i4", count=n_ctx*n_chunk, offset=off) if len(data) >= off + 4*n_ctx*n_chunk else None
    if tokens is None:
        return None
    off += 4*n_ctx*n_chunk
    nv = 2*((n_vocab + 1)//2) + 4
    first = n_ctx//2
    n_tok = n_ctx - 1 - first
    rows = (len(data) - off)//(2*nv)
    if n_tok <= 0 or rows < n_tok or rows % n_tok:
        return None
    lp = np.frombuffer(data, dtype="<u2", count=rows*nv, offset=off).reshape(rows, nv)
    scale_min = lp[:, :4].copy().view("<f4")           # [rows, 2]: scale, min log-prob
    nll = 0.0
    for r in range(rows):
        chunk, i = divmod(r, n_tok)
        tok = int(tokens[chunk*n_ctx + first + i + 1])
        if not 0 <= tok < n_vocab:
            return None
        nll -= float(scale_min[r, 1]) + float(scale_min[r, 0])*float(lp[r, 4 + tok])
    return math.exp(nll/rows)



def ppl_output_lost(out: str, value: float | None, rc: int) -> bool:
    """True when a llama-perplexity run exited 0 without a figure and without saying why: its logger lost the
    output's tail (the loss can begin before the "perplexity: calculating" line: CI, 2026-12-02), so it is run again.
    A failed run (exit != 0) and a text too short for the context ("you need at least N tokens") are not."""
    return value is None and rc == 0 and "you need at least" not in out


def run_perplexity(c: GateContext, argv: Sequence[str | os.PathLike[str]], name: str, ctx: int, n_vocab: int) -> float | None:
    """The perplexity of a llama-perplexity run (``argv``) at context ``ctx``, its logs named after ``name``.

    llama.cpp's common logger is leaked at exit and the tools do not call common_log_flush()
    (common/log.cpp, ggml-org/llama.cpp#22142), so the tail of the output (the "[1]..." and
    "Final estimate" lines) is now and then lost, exit status 0: in 1 of 2 to 20 runs on the
    loaded 2-core machine, baseline and patched builds alike. Run again, at most RETRIES times.
    Under load the loss can become the rule (CI, 2026-12-02: 8 runs of 8 lost), so after two lost tails a model
    whose scored log-probabilities fit LOGITS_FILE_MAX bytes (``n_vocab`` known) runs once more with
    --kl-divergence-base, which the tool's main thread writes (not its logger): the perplexity comes from that file
    (perplexity_from_logits)."""
    for attempt in range(RETRIES):
        log_name = name + (f"-retry{attempt}" if attempt else "")
        if attempt == 2 and 0 < n_vocab and (ctx // 2)*(n_vocab + 6)*2 <= LOGITS_FILE_MAX:
            lf = c.logs / f"{log_name}-logits.bin"
            out = c.run([*argv, "--kl-divergence-base", lf], log_name, check=False)
            try:
                value = parse_perplexity(out) or (perplexity_from_logits(lf) if c.last_rc == 0 else None)
            finally:
                lf.unlink(missing_ok=True)
            return value
        out = c.run(argv, log_name, check=False)
        value = parse_perplexity(out)
        if not ppl_output_lost(out, value, c.last_rc):
            return value
    return None
