"""End-to-end checks of patch 0078-dca (Dual Chunk Attention) on tiny random-weight models.

Issue 3, tests 3 and 4. Every hooked architecture (tests/models/tiny.py) is evaluated with
tests/cpp/dca_logits.cpp linked against
  DCAFORGE_LLAMA_TREE / DCAFORGE_LLAMA_BUILD  the patched (0078-dca) llama.cpp and its cmake build
  DCAFORGE_BASE_TREE  / DCAFORGE_BASE_BUILD   unpatched upstream 0c1e57098 and its cmake build
(static libraries: BUILD_SHARED_LIBS=OFF, target `llama` built). Tests that need a missing pair
skip with the reason.

Trained context L = 256; DCA S = 192, w = 32 (the defaults 3L/4, L/8), so c = S - w = 160.
  (a) positions < c: --dca on equals --dca off within 1e-3 (max |a-b| / max |b| per position),
      flash attention on and off.
  (b) 800 tokens, ubatch 64 (ubatches 128..191 and 448..511 straddle the chunk boundaries 160
      and 480): DCA runs and gives finite logits; the prefix < c still equals --dca off; FA on and
      off agree; other ubatch sizes and two interleaved sequences (the masked fallback) agree; DCA
      changes the logits past c; gemma3/gemma4 models whose global layers have a zero attention
      output projection give the same logits with DCA on and off at any length (the sliding layers
      are untouched by DCA).
  (c) --dca off on the patched build is byte-identical to the unpatched build (FA on and off).
  (d) quantized caches at 800 tokens with FA on: the argmax disagreement of type+DCA against
      f16+DCA is no larger than that of type against f16 without DCA; the rates are written to
      tests/models/RESULTS.md (path overridable with DCAFORGE_RESULTS).

Run: DCAFORGE_LLAMA_TREE=... DCAFORGE_LLAMA_BUILD=... DCAFORGE_BASE_TREE=... DCAFORGE_BASE_BUILD=... \
     python -m pytest -q tests/test_models_dca.py
Threads: DCAFORGE_THREADS (default 2).
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.models import build_logits, tiny  # noqa: E402

ARCHS = list(tiny.ARCHS)
SWA_ARCHS = list(tiny.SWA_ARCHS)
N_VOCAB = tiny.N_VOCAB

S, W = 192, 32
C = S - W                    # 160
N_LONG = 800                 # five chunks: boundaries at 160, 320, 480, 640
UB = 64
THREADS = int(os.environ.get("DCAFORGE_THREADS", "2"))
SEED = 7                     # token sequence seed

CACHE_TYPES = [("f16", "f16"), ("bf16", "bf16"), ("q8_0", "q8_0"), ("q5_1", "q5_1"),
               ("q5_0", "q5_0"), ("q4_0", "q4_0"), ("q8_0", "q4_0")]

RESULTS_PATH = Path(os.environ.get("DCAFORGE_RESULTS", ROOT / "tests" / "models" / "RESULTS.md"))

# filled by the tests, written to RESULTS_PATH at the end of the session
_RESULTS: dict[str, list] = {"a": [], "b": [], "c": [], "d": []}


# ----------------------------------------------------------------------------- fixtures

def _env_pair(tree_var: str, build_var: str) -> tuple[str, str]:
    tree, build = os.environ.get(tree_var), os.environ.get(build_var)
    if not tree or not build:
        pytest.skip(f"{tree_var} and {build_var} are not both set "
                    f"(a llama.cpp tree and its cmake build dir with static libs)")
    for p in (tree, build):
        if not os.path.isdir(p):
            pytest.skip(f"{p} does not exist")
    return tree, build


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tiny-models")
    for arch in ARCHS:
        tiny.ensure(str(d), arch)
    for arch in SWA_ARCHS:
        tiny.ensure(str(d), arch, "zero-global")
    return d


@pytest.fixture(scope="session")
def dca_exe() -> str:
    tree, build = _env_pair("DCAFORGE_LLAMA_TREE", "DCAFORGE_LLAMA_BUILD")
    if not build_logits.tree_has_dca(tree):
        pytest.fail(f"{tree}/include/llama.h has no dca_chunk_size: not a 0078-dca tree")
    return build_logits.build(tree, build, dca=True)


@pytest.fixture(scope="session")
def base_exe() -> str:
    tree, build = _env_pair("DCAFORGE_BASE_TREE", "DCAFORGE_BASE_BUILD")
    return build_logits.build(tree, build, dca=False)


@pytest.fixture(scope="session")
def runner(tmp_path_factory):
    return Runner(tmp_path_factory.mktemp("logits"))


@pytest.fixture(scope="session", autouse=True)
def _write_results():
    yield
    if any(_RESULTS.values()):
        write_results(RESULTS_PATH)


# ----------------------------------------------------------------------------- running

class RunError(RuntimeError):
    pass


class Runner:
    """Runs dca_logits and caches the logits of each distinct configuration."""

    def __init__(self, outdir: Path):
        self.outdir = outdir
        self.cache: dict[tuple, tuple[Path, np.ndarray]] = {}
        self.n = 0

    def run(self, exe: str, model: str, n_tokens: int, *, ub: int = UB, fa: bool = True,
            ctk: str = "f16", ctv: str = "f16", dca: bool | None = None, chunk: int = S,
            local: int = W, n_seq: int = 1, n_batch: int | None = None) -> tuple[Path, np.ndarray]:
        """Returns (file, logits [n_seq, n_tokens, n_vocab]). dca None: pass no --dca flags."""
        key = (exe, model, n_tokens, ub, fa, ctk, ctv, dca, chunk if dca else None,
               local if dca else None, n_seq, n_batch)
        if key in self.cache:
            return self.cache[key]
        self.n += 1
        out = self.outdir / f"run{self.n}.f32"
        nb = n_batch or max(n_tokens * n_seq, 1)
        cmd = [exe, "-m", model, "-o", str(out), "--seed", str(SEED), "--n-tokens", str(n_tokens),
               "-c", str(n_tokens * n_seq), "-b", str(nb), "-ub", str(ub),
               "-fa", "on" if fa else "off", "-ctk", ctk, "-ctv", ctv, "-t", str(THREADS),
               "--n-seq", str(n_seq)]
        if dca is not None:
            cmd += ["--dca", "on" if dca else "off"]
            if dca:
                cmd += ["--dca-chunk-size", str(chunk), "--dca-local-size", str(local)]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
        if r.returncode != 0:
            raise RunError(f"rc={r.returncode}: {' '.join(cmd)}\n{r.stderr[-3000:]}")
        info = json.loads(r.stdout.strip().splitlines()[-1])
        assert info["n_vocab"] == N_VOCAB and info["n_tokens"] == n_tokens
        x = np.fromfile(out, dtype="<f4").reshape(n_seq, n_tokens, N_VOCAB)
        self.cache[key] = (out, x)
        return out, x


def rel_err(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per position: max |a-b| / max |b| (inputs [..., n_vocab])."""
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    return np.abs(a - b).max(axis=-1) / np.maximum(np.abs(b).max(axis=-1), 1e-30)


def model(models_dir: Path, arch: str, variant: str = "normal") -> str:
    return tiny.model_path(str(models_dir), arch, variant)


# ----------------------------------------------------------------------------- (a) below one chunk

@pytest.mark.parametrize("fa", [True, False], ids=["fa-on", "fa-off"])
@pytest.mark.parametrize("arch", ARCHS)
def test_a_below_chunk_equals_plain(runner, dca_exe, models_dir, arch, fa):
    m = model(models_dir, arch)
    _, off = runner.run(dca_exe, m, C, fa=fa, dca=False)
    _, on = runner.run(dca_exe, m, C, fa=fa, dca=True)
    e = rel_err(on[0], off[0])
    _RESULTS["a"].append((arch, "on" if fa else "off", C, float(e.max()), int(e.argmax())))
    assert np.isfinite(on).all()
    assert e.max() < 1e-3, f"{arch} fa={fa}: max rel err {e.max():.3g} at position {e.argmax()} (< c = {C})"


@pytest.mark.parametrize("arch", ARCHS)
def test_a_auto_sizes_are_three_quarters_and_one_eighth(runner, dca_exe, models_dir, arch):
    """--dca-chunk-size 0 --dca-local-size 0 resolve to 3L/4 = 192 and L/8 = 32."""
    m = model(models_dir, arch)
    _, auto = runner.run(dca_exe, m, 400, dca=True, chunk=0, local=0)
    _, expl = runner.run(dca_exe, m, 400, dca=True)
    assert np.array_equal(auto, expl), f"{arch}: auto sizes differ from S=192 w=32: rel {rel_err(auto, expl).max():.3g}"


# ----------------------------------------------------------------------------- (b) past one chunk

@pytest.mark.parametrize("fa", [True, False], ids=["fa-on", "fa-off"])
@pytest.mark.parametrize("arch", ARCHS)
def test_b_long_runs_finite_and_prefix_exact(runner, dca_exe, models_dir, arch, fa):
    m = model(models_dir, arch)
    _, on = runner.run(dca_exe, m, N_LONG, fa=fa, dca=True)
    _, off = runner.run(dca_exe, m, N_LONG, fa=fa, dca=False)
    assert np.isfinite(on).all(), f"{arch} fa={fa}: non-finite logits with DCA"
    e = rel_err(on[0], off[0])
    pre, post = e[:C], e[C:]
    # DCA changes the attention of every position >= c + 1 (positions that see a previous chunk)
    changed = float((post[1:] > 1e-3).mean())
    _RESULTS["b"].append((arch, "on" if fa else "off", "dca on vs off", float(pre.max()),
                          float(np.median(post)), changed))
    assert pre.max() < 1e-3, f"{arch} fa={fa}: prefix < c differs from --dca off: {pre.max():.3g} at {pre.argmax()}"
    assert changed > 0.5, f"{arch} fa={fa}: DCA changed only {changed:.0%} of positions past c (is it active?)"


@pytest.mark.parametrize("arch", ARCHS)
def test_b_fa_on_equals_fa_off(runner, dca_exe, models_dir, arch):
    m = model(models_dir, arch)
    _, fa_on = runner.run(dca_exe, m, N_LONG, fa=True, dca=True)
    _, fa_off = runner.run(dca_exe, m, N_LONG, fa=False, dca=True)
    _, ref_on = runner.run(dca_exe, m, N_LONG, fa=True, dca=False)
    _, ref_off = runner.run(dca_exe, m, N_LONG, fa=False, dca=False)
    e = rel_err(fa_on[0], fa_off[0])
    e_ref = rel_err(ref_on[0], ref_off[0])   # what the two upstream paths differ by
    _RESULTS["b"].append((arch, "on/off", f"FA on vs FA off with DCA (plain: {e_ref.max():.2g})",
                          float(e[:C].max()), float(e[C:].max()), None))
    assert e.max() < max(1e-3, 4 * e_ref.max()), \
        f"{arch}: DCA FA path vs non-FA path: {e.max():.3g} at {e.argmax()} (without DCA: {e_ref.max():.3g})"


@pytest.mark.parametrize("ub", [1, 7, 256])
@pytest.mark.parametrize("arch", ARCHS)
def test_b_ubatch_size_invariance(runner, dca_exe, models_dir, arch, ub):
    """ubatch 1 (decode), 7 (odd, straddles every boundary), 256 vs 64: same logits."""
    n = 400 if ub == 1 else N_LONG
    m = model(models_dir, arch)
    _, ref = runner.run(dca_exe, m, n, dca=True)
    _, x = runner.run(dca_exe, m, n, ub=ub, dca=True)
    e = rel_err(x[0], ref[0])
    _RESULTS["b"].append((arch, "on", f"ubatch {ub} vs {UB}", float(e[:C].max()), float(e[C:].max()), None))
    assert e.max() < 1e-3, f"{arch}: ubatch {ub} vs {UB}: {e.max():.3g} at position {e.argmax()}"


@pytest.mark.parametrize("fa", [True, False], ids=["fa-on", "fa-off"])
@pytest.mark.parametrize("arch", ARCHS)
def test_b_two_sequences(runner, dca_exe, models_dir, arch, fa):
    """Two identical sequences interleaved in one unified cache (cells out of position order:
    the masked fallback) give each the single-sequence logits."""
    m = model(models_dir, arch)
    _, one = runner.run(dca_exe, m, 400, fa=fa, dca=True)
    _, two = runner.run(dca_exe, m, 400, fa=fa, dca=True, n_seq=2)
    e = np.maximum(rel_err(two[0], one[0]), rel_err(two[1], one[0]))
    _RESULTS["b"].append((arch, "on" if fa else "off", "2 sequences vs 1", float(e[:C].max()), float(e[C:].max()), None))
    assert e.max() < 1e-3, f"{arch} fa={fa}: 2 sequences vs 1: {e.max():.3g} at position {e.argmax()}"


@pytest.mark.parametrize("fa", [True, False], ids=["fa-on", "fa-off"])
@pytest.mark.parametrize("arch", SWA_ARCHS)
def test_b_sliding_layers_untouched(runner, dca_exe, models_dir, arch, fa):
    """With the global layers' attention output zeroed, only the sliding layers shape the
    logits: DCA must then change nothing, at any length."""
    m = model(models_dir, arch, "zero-global")
    _, on = runner.run(dca_exe, m, N_LONG, fa=fa, dca=True)
    _, off = runner.run(dca_exe, m, N_LONG, fa=fa, dca=False)
    e = rel_err(on[0], off[0])
    bitwise = np.array_equal(on, off)
    _RESULTS["b"].append((arch, "on" if fa else "off", f"zero-global model: dca on vs off (bitwise: {bitwise})",
                          float(e[:C].max()), float(e[C:].max()), None))
    assert np.isfinite(on).all()
    assert e.max() < 1e-5, f"{arch} fa={fa}: sliding layers changed by DCA: {e.max():.3g} at position {e.argmax()}"


N_REF = 400                  # chunks 0, 1, 2: all three regimes


@pytest.fixture(scope="session")
def reference_logits(models_dir):
    from tests.models import reference
    cache = {}

    def get(arch: str, dca: bool) -> np.ndarray:
        if (arch, dca) not in cache:
            toks = reference.tokens_for(SEED, N_REF)
            cache[(arch, dca)] = reference.forward(model(models_dir, arch), arch, toks, (S, W) if dca else None)
        return cache[(arch, dca)]
    return get


@pytest.mark.parametrize("fa", [False, True], ids=["fa-off", "fa-on"])
@pytest.mark.parametrize("arch", ARCHS)
def test_b_matches_numpy_reference(runner, dca_exe, models_dir, reference_logits, arch, fa):
    """f32 cache, 400 tokens: llama.cpp with DCA against tests/models/reference.py (a float64
    forward pass written from dca.md's regime table), no worse than llama.cpp without DCA
    against the same reference without DCA (which checks the reference itself)."""
    m = model(models_dir, arch)
    _, on = runner.run(dca_exe, m, N_REF, fa=fa, ctk="f32", ctv="f32", dca=True)
    _, off = runner.run(dca_exe, m, N_REF, fa=fa, ctk="f32", ctv="f32", dca=False)
    e_on = rel_err(on[0], reference_logits(arch, True))
    e_off = rel_err(off[0], reference_logits(arch, False))
    tol = max(1e-3 if not fa else 1e-2, 3 * e_off.max())
    _RESULTS["b"].append((arch, "on" if fa else "off",
                          f"f32 cache, {N_REF} tokens: vs numpy DCA reference (without DCA vs reference: {e_off.max():.2g})",
                          float(e_on[:C].max()), float(e_on[C:].max()), None))
    assert e_off.max() < (1e-3 if not fa else 1e-2), f"{arch}: the reference itself is off by {e_off.max():.3g} without DCA"
    assert e_on.max() < tol, (f"{arch} fa={fa}: DCA vs numpy reference: {e_on.max():.3g} at position {e_on.argmax()} "
                              f"(positions < c: {e_on[:C].max():.3g}, >= c: {e_on[C:].max():.3g}; tolerance {tol:.3g})")


# ----------------------------------------------------------------------------- (c) bit-identity

@pytest.mark.parametrize("fa", [True, False], ids=["fa-on", "fa-off"])
@pytest.mark.parametrize("arch", ARCHS)
def test_c_dca_off_bit_identical_to_upstream(runner, dca_exe, base_exe, models_dir, arch, fa):
    m = model(models_dir, arch)
    f_base, x_base = runner.run(base_exe, m, N_LONG, fa=fa)
    f_off, x_off = runner.run(dca_exe, m, N_LONG, fa=fa, dca=False)
    same = f_base.read_bytes() == f_off.read_bytes()
    _RESULTS["c"].append((arch, "on" if fa else "off", same, float(rel_err(x_off[0], x_base[0]).max())))
    assert same, f"{arch} fa={fa}: --dca off differs from upstream: rel {rel_err(x_off[0], x_base[0]).max():.3g}"


@pytest.mark.parametrize("arch", ["qwen2", "gemma4"])
def test_c_default_params_bit_identical_to_upstream(runner, dca_exe, base_exe, models_dir, arch):
    """No --dca flag at all (llama_context_default_params) is upstream too."""
    m = model(models_dir, arch)
    f_base, _ = runner.run(base_exe, m, N_LONG, fa=True, ctk="q8_0", ctv="q8_0")
    f_def, _ = runner.run(dca_exe, m, N_LONG, fa=True, ctk="q8_0", ctv="q8_0", dca=None)
    assert f_base.read_bytes() == f_def.read_bytes()


# ----------------------------------------------------------------------------- (d) quantized caches

def _argmax_disagreement(x: np.ndarray, ref: np.ndarray) -> float:
    return float((x[0].argmax(-1) != ref[0].argmax(-1)).mean())


@pytest.mark.parametrize("arch", ARCHS)
def test_d_quantized_caches(runner, dca_exe, models_dir, arch):
    m = model(models_dir, arch)
    ref = {d: runner.run(dca_exe, m, N_LONG, fa=True, dca=d)[1] for d in (False, True)}
    failures = []
    for ctk, ctv in CACHE_TYPES:
        rates = {}
        for d in (False, True):
            _, x = runner.run(dca_exe, m, N_LONG, fa=True, ctk=ctk, ctv=ctv, dca=d)
            assert np.isfinite(x).all(), f"{arch} {ctk}/{ctv} dca={d}: non-finite logits"
            rates[d] = _argmax_disagreement(x, ref[d])
            rates[(d, "rel")] = float(np.median(rel_err(x[0], ref[d][0])))
        _RESULTS["d"].append((arch, ctk, ctv, rates[False], rates[True], rates[(False, "rel")], rates[(True, "rel")]))
        if rates[True] > rates[False]:
            failures.append(f"{ctk}/{ctv}: with DCA {rates[True]:.4f} > without {rates[False]:.4f}")
    assert not failures, f"{arch}: " + "; ".join(failures)


# ----------------------------------------------------------------------------- results file

def write_results(path: Path) -> None:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    env = {k: os.environ.get(k, "") for k in ("DCAFORGE_LLAMA_TREE", "DCAFORGE_LLAMA_BUILD",
                                               "DCAFORGE_BASE_TREE", "DCAFORGE_BASE_BUILD")}
    L = []
    L.append("# DCA on tiny random-weight models: measured results\n")
    L.append(f"Written by `tests/test_models_dca.py` on {now}. Command:\n")
    L.append("```")
    L.append(" ".join(f"{k}={v}" for k, v in env.items() if v) + f" DCAFORGE_THREADS={THREADS} \\")
    L.append("  python -m pytest -q tests/test_models_dca.py")
    L.append("```\n")
    L.append(f"Models: `python -m tests.models.tiny OUTDIR` (trained context 256, 258-token byte vocabulary). "
             f"DCA: S = {S}, w = {W}, c = {C}; tokens: BOS + {N_LONG - 1} pseudo-random bytes "
             f"(seed {SEED}), ubatch {UB}, {THREADS} threads. Errors are max |a-b| / max |b| per position.\n")
    if _RESULTS["a"]:
        L.append(f"## (a) positions < c: --dca on vs --dca off ({C} tokens)\n")
        L.append("| arch | FA | max rel err | at position |")
        L.append("|---|---|---|---|")
        for arch, fa, _n, e, pos in _RESULTS["a"]:
            L.append(f"| {arch} | {fa} | {e:.3g} | {pos} |")
        L.append("")
    if _RESULTS["b"]:
        L.append(f"## (b) past c ({N_LONG} tokens unless noted; ubatch 400 tokens for ubatch 1 and 2 sequences)\n")
        L.append("| arch | FA | comparison | max rel err, positions < c | positions >= c (max; median for dca on vs off) "
                 "| share of positions > c changed |")
        L.append("|---|---|---|---|---|---|")
        for arch, fa, what, pre, post, changed in _RESULTS["b"]:
            ch = "" if changed is None else f"{changed:.1%}"
            L.append(f"| {arch} | {fa} | {what} | {pre:.3g} | {post:.3g} | {ch} |")
        L.append("")
    if _RESULTS["c"]:
        L.append(f"## (c) --dca off vs unpatched upstream ({N_LONG} tokens, f16 cache)\n")
        L.append("| arch | FA | byte-identical | max rel err |")
        L.append("|---|---|---|---|")
        for arch, fa, same, e in _RESULTS["c"]:
            L.append(f"| {arch} | {fa} | {'yes' if same else 'NO'} | {e:.3g} |")
        L.append("")
    if _RESULTS["d"]:
        L.append(f"## (d) quantized caches, {N_LONG} tokens, FA on: argmax disagreement vs f16 cache\n")
        L.append("Without DCA: type vs f16 (both without DCA). With DCA: type+DCA vs f16+DCA. "
                 "Median rel err of the logits in parentheses.\n")
        L.append("| arch | K | V | without DCA | with DCA | ok |")
        L.append("|---|---|---|---|---|---|")
        tot: dict[tuple[str, str], list] = {}
        for arch, ctk, ctv, r0, r1, e0, e1 in _RESULTS["d"]:
            L.append(f"| {arch} | {ctk} | {ctv} | {r0:.4f} ({e0:.2g}) | {r1:.4f} ({e1:.2g}) | {'yes' if r1 <= r0 else 'NO'} |")
            t = tot.setdefault((ctk, ctv), [0.0, 0.0, 0])
            t[0] += r0
            t[1] += r1
            t[2] += 1
        L.append("")
        L.append("Mean over the architectures:\n")
        L.append("| K | V | without DCA | with DCA |")
        L.append("|---|---|---|---|")
        for (ctk, ctv), (r0, r1, k) in tot.items():
            L.append(f"| {ctk} | {ctv} | {r0 / k:.4f} | {r1 / k:.4f} |")
        L.append("")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(L) + "\n")
