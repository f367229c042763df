"""DCA through the RPC backend and with partial offload (issue 14), on the CPU: a real `ggml-rpc-server`
(the patched build's, CPU device) on 127.0.0.1.

- The new op round-trips through RPC: `test-backend-ops --rpc HOST:PORT -b RPC0 -o FLASH_ATTN_EXT_LSE`
  (the `--rpc` option is 0078-dca's) runs every LSE case on the RPC device against the local CPU; the
  op's packed O|LSE result and its views come back equal.
- The committed trained model (tests/models/longctx-qwen2.gguf, 4 layers, L = 256) at 600 tokens with
  DCA (S = 192, w = 32, three regimes in use), through dcaforge/gate/gatetools/dca_logits.cpp: all layers on the
  local CPU vs `--rpc` with `-ngl 3` (layers 2-3, their KV cache and the output layer on the RPC
  device: a partial offload, DCA's inputs crossing devices) and with `-ngl 99` (all layers): the
  logits are equal within RPC_TOL (measured: bit-identical), flash attention on (the LSE op) and
  off; a context shift (K of DCA layers re-roped by the DCA shift on the RPC device) as well.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from e2e_helpers import REPO, WORKSPACE, Process, free_port, run

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from dcaforge.gate.gatetools import build_logits  # noqa: E402

MODEL = REPO / "tests" / "models" / "longctx-qwen2.gguf"
N_VOCAB = 258
N_TOKENS = 600
DCA = ("--dca", "on", "--dca-chunk-size", "192", "--dca-local-size", "32")
RPC_TOL = 1e-4      # max |a-b| / max |b| per position; the RPC server runs the same CPU kernels
LOGS = WORKSPACE / "logs" / "rpc"


@pytest.fixture(scope="module")
def rpc_endpoint(serve_tree):
    port = free_port()
    with Process([serve_tree.bin("ggml-rpc-server"), "-H", "127.0.0.1", "-p", str(port), "-t", "2"],
                 LOGS / "rpc-server.log") as srv:
        srv.wait_port(port)
        yield f"127.0.0.1:{port}"


@pytest.fixture(scope="module")
def logits_exe(serve_tree) -> str:
    return build_logits.build(serve_tree.src, serve_tree.build, dca=True)


def logits(exe: str, out: Path, *args: str) -> np.ndarray:
    r = subprocess.run([exe, "-m", str(MODEL), "-o", str(out), "--seed", "3", "--n-tokens", str(N_TOKENS), "-c", "1024",
                        "-b", "256", "-ub", "256", "-t", "2", *DCA, *args],
                       capture_output=True, text=True, timeout=900, check=False)
    assert r.returncode == 0, f"{' '.join(args)}: rc={r.returncode}\n{r.stderr[-3000:]}"
    return np.fromfile(out, dtype="<f4").reshape(-1, N_VOCAB).astype(np.float64)


def rel_err(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.abs(a - b).max(axis=-1) / np.maximum(np.abs(b).max(axis=-1), 1e-30)


def test_backend_ops_lse_through_rpc(serve_tree, rpc_endpoint):
    log = LOGS / "test-backend-ops-rpc.log"
    p = run([str(serve_tree.bin("test-backend-ops")), "--rpc", rpc_endpoint, "-b", "RPC0", "-o", "FLASH_ATTN_EXT_LSE"],
            log=log, timeout=1800)
    assert p.returncode == 0, f"see {log}\n{p.stdout[-3000:]}{p.stderr[-2000:]}"
    m = re.search(r"(\d+)/(\d+) tests passed", p.stdout)
    assert m and m.group(1) == m.group(2) and int(m.group(2)) >= 20, p.stdout[-2000:]
    assert "RPC0" in p.stdout


@pytest.mark.parametrize("fa", ["on", "off"])
def test_partial_offload_and_rpc_equal_cpu(logits_exe, rpc_endpoint, tmp_path, fa):
    cpu = logits(logits_exe, tmp_path / "cpu.f32", "-fa", fa)
    errs = {}
    for ngl in (3, 99):
        x = logits(logits_exe, tmp_path / f"rpc{ngl}.f32", "-fa", fa, "--rpc", rpc_endpoint, "-ngl", str(ngl))
        assert np.isfinite(x).all()
        errs[ngl] = float(rel_err(x, cpu).max())
    print(f"fa {fa}: max rel err vs all-CPU: -ngl 3: {errs[3]:.2e}, -ngl 99: {errs[99]:.2e}")
    assert max(errs.values()) <= RPC_TOL, errs


def test_context_shift_through_rpc(logits_exe, rpc_endpoint, tmp_path):
    shift = ("-fa", "on", "--shift", "100", "--shift-at", "450")
    cpu = logits(logits_exe, tmp_path / "cpu.f32", *shift)
    x = logits(logits_exe, tmp_path / "rpc.f32", *shift, "--rpc", rpc_endpoint, "-ngl", "99")
    e = float(rel_err(x, cpu).max())
    assert e <= RPC_TOL, e


def test_dca_mask_crosses_to_the_device_once_per_graph(logits_exe, rpc_endpoint, tmp_path):
    """The scheduler copies a graph input to a device once per view it is read through: DCA's mask, read by every call
    of every layer through its own view, once crossed ~90 times a prompt ubatch (bench/RESULTS.md, DCA prompt ubatches: 450 MiB instead of
    16 MiB at 16k; on the H200, prompt 0.46x plain at 32k). A layer whose cache is off the host reads one shared
    contiguous copy (`dca_mask_dev`), so each split takes the mask itself as its only mask input."""
    env = {**os.environ, "GGML_SCHED_DEBUG": "1"}
    r = subprocess.run([logits_exe, "-m", str(MODEL), "-o", str(tmp_path / "x.f32"), "--seed", "3", "--n-tokens",
                        str(N_TOKENS), "-c", "1024", "-b", "256", "-ub", "256", "-t", "2", *DCA, "-fa", "on",
                        "--rpc", rpc_endpoint, "-ngl", "99", "-v"],
                       capture_output=True, text=True, timeout=900, check=False, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    splits = [ln for ln in r.stderr.splitlines() if "## SPLIT #" in ln and "RPC" in ln]
    assert splits, r.stderr[-3000:]  # the scheduler printed its splits (GGML_SCHED_DEBUG)
    inputs = "\n".join(splits)
    assert "dca_mask (view)" not in inputs, inputs[:3000]
    assert "dca_mask" in inputs, inputs[:3000]
