"""The GPU bench scripts run where a mistake costs device minutes: check their syntax and the
setting names that bench/RESULTS.md quotes, here, with the real bash."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dcaforge.gate.results import GateResult

ROOT = Path(__file__).resolve().parents[2]
RUN_SH = ROOT / "bench" / "gpu" / "run.sh"


@pytest.mark.parametrize("script", ["run.sh", "pack.sh"])
def test_bench_script_parses(script: str) -> None:
    r = subprocess.run(["bash", "-n", str(ROOT / "bench" / "gpu" / script)], check=False, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def dca_cfg(name: str, ratio: str = "2.1") -> subprocess.CompletedProcess:
    # only the function, so nothing of the device steps runs
    script = f'source <(sed -n "/^dca_cfg()/,/^}}/p" "{RUN_SH}"); dca_cfg "$1" "$2"'
    return subprocess.run(["bash", "-c", script, "bash", name, ratio], check=False, capture_output=True, text=True)


@pytest.mark.parametrize("name, flags", [
    ("S24w4", "--dca on --dca-chunk-size 24576 --dca-local-size 4096"),
    ("S4w0.5", "--dca on --dca-chunk-size 4096 --dca-local-size 512"),
    ("S6w1", "--dca on --dca-chunk-size 6144 --dca-local-size 1024"),
    ("S24w4t", "--dca on --dca-chunk-size 24576 --dca-local-size 4096 --dca-yarn-factor 2.1"),
    ("S24w4tt", "--dca on --dca-chunk-size 24576 --dca-local-size 4096 --dca-yarn-factor 4.41"),
    # a logit scale of 1.2 is 0.1*ln(F) + 1 with F = e^2
    ("S8w1s1.2", "--dca on --dca-chunk-size 8192 --dca-local-size 1024 --dca-yarn-factor 7.38906"),
])
def test_dca_setting_names(name: str, flags: str) -> None:
    r = dca_cfg(name)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == flags


def test_dca_setting_name_rejected() -> None:
    r = dca_cfg("S24")
    assert r.returncode != 0
    assert "bad setting name S24" in r.stderr


def run_sh_functions(names: tuple[str, ...], call: str, *args: str) -> subprocess.CompletedProcess:
    """Only the named functions of run.sh (its globals left out), then ``call``."""
    pick = ";".join(f'/^{n}() {{/,/^}}/p' for n in names)
    script = f'source <(sed -n "{pick}" "{RUN_SH}"); {call}'
    return subprocess.run(["bash", "-c", script, "bash", *args], check=False, capture_output=True, text=True)


def test_chunk_local_gives_the_ruler_gates_sizes() -> None:
    r = run_sh_functions(("dca_cfg", "chunk_local"), 'chunk_local "$1"', "S4w0.5")
    assert r.returncode == 0 and r.stdout.strip() == '"chunk": 4096, "local": 512'
    assert json.loads("{" + run_sh_functions(("dca_cfg", "chunk_local"), "chunk_local S6w1").stdout + "}") == {"chunk": 6144, "local": 1024}


#: inputs the bench scripts read, kept from the lab notebook's runs (commit 4520127: run 2's llama-batched-bench log,
#: run 13's SmolLM2 passkey result)
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "bench"
BB_LOG = FIXTURES / "batched-bench-128k.log"


def test_batched_bench_rows_and_ratios(tmp_path: Path) -> None:
    """bb_rows reads a real llama-batched-bench log; speed_smol_ratios pairs DCA with plain per round, per
    sequence count, length and KV layout, and prints the CUDA-graph check."""
    r = run_sh_functions(("bb_rows",), 'bb_rows "$1"', str(BB_LOG))
    assert r.returncode == 0 and r.stdout.split() == ["131072", "32", "1", "33223.15", "600.08"]
    rows = ["round\tmode\tseqs\tpp\ttg\tb\ts_pp\ts_tg\trc"]
    for rnd, f in ((1, 1.0), (2, 1.2)):
        rows += [f"{rnd}\tplain\t1\t32768\t128\t1\t{40000 * f}\t{800 * f}\t0",
                 f"{rnd}\tdca\t1\t32768\t128\t1\t{30000 * f}\t{600 * f}\t0",
                 f"{rnd}\tplain-nographs\t1\t32768\t128\t1\t{40000 * f}\t{640 * f}\t0",
                 f"{rnd}\tdca-nographs\t1\t32768\t128\t1\t{30000 * f}\t{590 * f}\t0",
                 f"{rnd}\tplain-kvu\t4\t16384\t128\t4\t{50000 * f}\t{2000 * f}\t0",
                 f"{rnd}\tdca-kvu\t4\t16384\t128\t4\t{45000 * f}\t{920 * f}\t0"]
        rows += [f"{rnd}\tplain\t1\t131072\t128\t1\t{20000 * f}\t{350 * f}\t0",   # no run without graphs at 128k
                 f"{rnd}\tdca\t1\t131072\t128\t1\t{15000 * f}\t{340 * f}\t0"]
    rows.append("3\tdca\t1\t32768\t128\t1\t1\t1\t1")  # a failed run (rc 1) is left out
    tsv = tmp_path / "speed.tsv"
    tsv.write_text("\n".join(rows) + "\n")
    r = run_sh_functions(("speed_smol_ratios",), 'speed_smol_ratios "$1"', str(tsv))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    one = next(ln for ln in lines if ln.split()[:3] == ["1", "32768", "plain"])
    assert one.split()[3:] == ["0.750", "0.750", "0.75/0.75", "0.75/0.75"]
    nog = next(ln for ln in lines if ln.split()[:3] == ["1", "32768", "plain-nographs"])
    assert nog.split()[3:5] == ["0.750", "0.922"]
    kvu = next(ln for ln in lines if ln.split()[:3] == ["4", "16384", "plain-kvu"])
    assert kvu.split()[3:5] == ["0.900", "0.460"]
    assert "graphs check: pp 32768 plain tg without CUDA graphs / with = 0.800" in lines
    assert not any(ln.startswith("graphs check: pp 131072") for ln in lines)   # run 6 printed "= 0.000" there




def test_ruler_run_table_and_options(tmp_path: Path) -> None:
    res = GateResult("g", "ruler", True, "ok", {"methods": ["dca"], "model": "m.gguf", "trained": 32768,
                     "servers": [{"ctx": 1048576, "method": "dca", "load_seconds": 9.1, "gpu_mib_peak": 9000, "gpu_other_processes": 1}],
                     "samples": [{"task": "vt", "ctx": 1048576, "method": "dca", "index": 0, "prompt_tokens": 1048000,
                                  "score": 0.8, "prompt_per_second": 9800.5, "predicted_per_second": 120.0, "fit_seconds": 31.2}]},
                     [{"task": "vt", "ctx": 1048576, "tokens": 1048000, "dca": 0.8, "dca_all": 0.0, "dca_n": 1}])
    f = tmp_path / "ruler-g.json"
    f.write_text(json.dumps(dataclasses.asdict(res)))
    script = str(ROOT / "bench" / "gpu" / "ruler_run.py")
    r = subprocess.run([sys.executable, script, "table", str(f)], check=False, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "vt\t1048576\t1048000\t80%" in r.stdout
    assert "vt\t1048576\tdca\t0\t1048000\t0.80\t9800\t120.0\t31.2\t9000\t1" in r.stdout
    r = subprocess.run([sys.executable, script, "run", "--server", "x", "--model", "y", "--name", "n", "--out", str(tmp_path),
                        "--options", '{"taks": ["vt"]}'], check=False, capture_output=True, text=True)
    assert r.returncode == 2 and "unknown ruler option(s): taks" in r.stderr


def test_model_pieces_join_once_all_are_there(tmp_path: Path) -> None:
    """run.sh's assemble: the pieces of a model (pack.sh's split) are joined once their sha256 matches, not before."""
    import hashlib
    import os

    data = os.urandom(100_000)
    sha = hashlib.sha256(data).hexdigest()
    (tmp_path / "model").mkdir()
    pieces = [data[i:i + 30_000] for i in range(0, len(data), 30_000)]
    for k, p in enumerate(pieces[:-1]):
        (tmp_path / "model" / f"smol.{k:02d}").write_bytes(p)
    env = {**os.environ, "HOME": str(tmp_path)}
    call = f'assemble "$HOME/model/s.gguf" {sha} smol'

    def assemble() -> str:
        script = f'source <(sed -n "/^assemble() {{/,/^}}/p" "{RUN_SH}"); {call}'
        r = subprocess.run(["bash", "-c", script], check=False, capture_output=True, text=True, env=env)
        assert r.returncode == 0, r.stderr
        return r.stdout.strip()

    assert assemble() == "s.gguf: 3 pieces so far" and not (tmp_path / "model" / "s.gguf").exists()
    (tmp_path / "model" / "smol.03").write_bytes(pieces[-1])
    assert assemble() == "s.gguf: assembled, sha256 ok"
    assert (tmp_path / "model" / "s.gguf").read_bytes() == data and sorted(os.listdir(tmp_path / "model")) == ["s.gguf"]
    assert assemble() == "s.gguf: there"


KTRACE_DIFF = ROOT / "bench" / "gpu" / "ktrace_diff.py"


def ktrace_diff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(KTRACE_DIFF), *args], check=False, capture_output=True, text=True)


def test_ktrace_diff_puts_two_runs_side_by_side(tmp_path: Path) -> None:
    """Two ktrace tables (synthetic): every kernel of either run, its GPU time in each, the largest difference first;
    --minus takes each run's shorter run away."""
    head = "launches\ttotal_us\tmean_us\tkernel\n"
    (tmp_path / "plain.tsv").write_text(head + "10\t100.0\t10.0\tflash_attn\n5\t50.0\t10.0\tmul_mat\n")
    (tmp_path / "dca.tsv").write_text(head + "10\t130.0\t13.0\tflash_attn\n5\t50.0\t10.0\tmul_mat\n"
                                      "2\t8.0\t4.0\tlse_merge\n")
    r = ktrace_diff(str(tmp_path / "plain.tsv"), str(tmp_path / "dca.tsv"))
    assert r.returncode == 0, r.stderr
    rows = [ln for ln in r.stdout.splitlines() if any(k in ln for k in ("flash_attn", "mul_mat", "lse_merge"))]
    assert "flash_attn" in rows[0] and "lse_merge" in rows[1] and "mul_mat" in rows[-1], r.stdout
    assert rows[0].split("\t")[:5] == ["+0.03", "10", "0.10", "10", "0.13"]   # milliseconds: DCA - plain, then each run
    (tmp_path / "short.tsv").write_text(head + "5\t50.0\t10.0\tflash_attn\n")
    r = ktrace_diff(str(tmp_path / "plain.tsv"), str(tmp_path / "dca.tsv"), "--minus", str(tmp_path / "short.tsv"),
                    str(tmp_path / "short.tsv"))
    assert r.returncode == 0 and "lse_merge" in r.stdout, r.stderr
    assert r.stdout.splitlines()[0] == "total plain 0.1 ms, dca 0.1 ms, ratio 1.380", r.stdout


def test_ktrace_diff_refuses_what_is_not_a_table(tmp_path: Path) -> None:
    bad = tmp_path / "x.tsv"
    bad.write_text("launches\ttotal_us\tmean_us\tkernel\n")
    r = ktrace_diff(str(bad), str(bad))
    assert r.returncode == 2 and "no kernel rows" in r.stderr


@pytest.mark.skipif(not Path("/usr/local/cuda/include/cupti.h").exists(), reason="no CUPTI headers (CUDA toolkit)")
def test_ktrace_compiles_against_cupti(tmp_path: Path) -> None:
    """The tracer carried to the GPU machine builds here with the toolkit's CUPTI and exports the injection entry."""
    so = tmp_path / "ktrace.so"
    cuda = Path("/usr/local/cuda")
    libdir = next((d for d in (cuda / "lib64", cuda / "lib") if (d / "libcupti.so").exists()), None)
    if libdir is None:
        pytest.skip("no libcupti.so in the CUDA toolkit")
    r = subprocess.run(["g++", "-O2", "-std=c++17", "-shared", "-fPIC", "-Wall", "-Werror", "-o", str(so),
                        str(ROOT / "bench" / "gpu" / "ktrace.cpp"), f"-I{cuda / 'include'}", f"-L{libdir}", "-lcupti"],
                       check=False, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    nm = subprocess.run(["nm", "-D", "--defined-only", str(so)], check=True, capture_output=True, text=True)
    assert " T InitializeInjection" in nm.stdout


KTRACE_TIMELINE = ROOT / "bench" / "gpu" / "ktrace_timeline.py"


def ratios_of(tsv_text: str, tmp_path: Path) -> dict[tuple[str, str, str], tuple[str, str]]:
    tsv = tmp_path / "speed.tsv"
    tsv.write_text(tsv_text)
    r = run_sh_functions(("speed_smol_ratios",), 'speed_smol_ratios "$1"', str(tsv))
    assert r.returncode == 0, r.stderr
    return {tuple(ln.split()[:3]): tuple(ln.split()[3:5]) for ln in r.stdout.splitlines() if ln[:1].isdigit()}


def timeline_rows(path: Path) -> dict[str, list[str]]:
    """The prompt's rows (first block) and the decode kernels' rows of a ktrace_timeline report, by name."""
    rows: dict[str, list[str]] = {}
    for ln in path.read_text().splitlines():
        parts = ln.split("\t")
        if len(parts) == 4:
            rows.setdefault(parts[3] if parts[0][:1] in ("+", "-") else parts[0], parts)
    return rows


def write_timeline(path: Path, rows: list[tuple[str, int, int, int, str]]) -> None:
    path.write_text("type\tstart_ns\tend_ns\textra\tname\n" + "".join(f"{t}\t{a}\t{b}\t{x}\t{n}\n" for t, a, b, x, n in rows))


def test_ktrace_timeline_cuts_and_attributes(tmp_path: Path) -> None:
    """A hand-made timeline: a warm-up, a prompt of two 4-token ubatches, three decode steps. The prompt starts at its
    first upload of 4 x ubatch bytes of token ids and ends at the first logits copy; the GPU's busy time counts
    overlapping kernels once; each idle microsecond goes to what the host was doing then."""
    us = 1000
    rows = [
        ("k", 0, 50 * us, 0, "warmup"),                      # before the prompt: left out
        ("m", 100 * us, 101 * us, 16, "HtoD"),                # ubatch 1's ids (4 x 4 bytes): the prompt starts here
        ("k", 102 * us, 200 * us, 0, "attn"),
        ("k", 150 * us, 210 * us, 0, "ffn"),                  # overlaps attn: busy 102..210 once
        ("r", 210 * us, 240 * us, 1, "cudaStreamSynchronize_v3020"),  # idle 210..250: 30 us in a sync,
        ("r", 245 * us, 250 * us, 2, "cudaLaunchKernel_v7000"),       # 5 us in a launch, 5 us in no call
        ("m", 250 * us, 251 * us, 16, "HtoD"),                # ubatch 2's ids
        ("k", 251 * us, 400 * us, 0, "attn"),
        ("m", 400 * us, 402 * us, 1024, "DtoH"),              # the prompt's logits: the prompt ends at 402
        ("k", 410 * us, 420 * us, 5, "attn"),                 # decode step 1: 402..422
        ("m", 420 * us, 422 * us, 1024, "DtoH"),
        ("k", 430 * us, 436 * us, 5, "attn"),                 # decode step 2: 422..442
        ("k", 436 * us, 438 * us, 5, "fixup"),
        ("m", 440 * us, 442 * us, 1024, "DtoH"),
        ("k", 450 * us, 460 * us, 5, "attn"),                 # decode step 3: 442..462
        ("m", 460 * us, 462 * us, 1024, "DtoH"),
    ]
    a = tmp_path / "a.tsv"
    write_timeline(a, rows)
    r = subprocess.run([sys.executable, str(KTRACE_TIMELINE), str(a), str(a), "--skip", "1", "--min-out", "1000",
                        "--ubatch", "4", "--kernels", "5"], check=False, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    blocks = r.stdout.split("\n\n")
    prompt = {ln.split("\t")[0]: ln.split("\t")[1] for ln in blocks[1].splitlines()[1:]}
    assert prompt["wall"] == "302.0"                         # 100..402
    assert prompt["GPU busy"] == "261.0"                     # 100..101, 102..210, 250..400 (adjacent spans join), 400..402
    assert prompt["GPU idle"] == "41.0"                      # 101..102 and 210..250
    assert prompt["  host in a synchronisation"] == "30.0"
    assert prompt["  host in a launch call"] == "5.0"
    assert prompt["  host in no runtime call"] == "6.0"      # 101..102 and 240..245
    assert prompt["longest idle gap"] == "40.0"
    assert prompt["kernels"] == "3.0"
    decode = {ln.split("\t")[0]: ln.split("\t")[1] for ln in blocks[2].splitlines()[1:]}
    assert decode["wall"] == "20.0" and decode["kernels"] == "1.5"   # steps 2 and 3 (step 1 skipped)
    assert decode["GPU busy"] == "11.0"                      # step 2: 430..438 + its copy 2, step 3: 10 + 2
    # per kernel, what no earlier kernel covers: attn 6 and 10, fixup 2 and 0, per step
    kern = {ln.split("\t")[3]: ln.split("\t")[2] for ln in blocks[3].splitlines()[2:]}
    assert kern == {"attn": "8.0", "fixup": "1.0"}


def test_ktrace_timeline_refuses_what_is_not_a_timeline(tmp_path: Path) -> None:
    bad = tmp_path / "x.tsv"
    bad.write_text("launches\ttotal_us\tmean_us\tkernel\n")
    r = subprocess.run([sys.executable, str(KTRACE_TIMELINE), str(bad), str(bad)], check=False, capture_output=True,
                       text=True)
    assert r.returncode == 2 and "not a ktrace timeline" in r.stderr
    none = tmp_path / "y.tsv"
    write_timeline(none, [("k", 0, 10, 0, "a"), ("m", 10, 11, 64, "DtoH"), ("m", 20, 21, 64, "DtoH")])
    r = subprocess.run([sys.executable, str(KTRACE_TIMELINE), str(none), str(none)], check=False, capture_output=True,
                       text=True)
    assert r.returncode == 2 and "fewer than two logits copies" in r.stderr


def test_ktrace_bb_runs_the_bench_under_the_tracer(tmp_path: Path) -> None:
    """ktrace_bb (both traced steps' one run) hands llama-batched-bench the tracer, its two outputs and the arguments;
    an empty timeline path leaves KTRACE_TIMELINE empty, which ktrace.cpp reads as no timeline."""
    fake = tmp_path / "llama-batched-bench"
    fake.write_text('#!/bin/bash\necho "$CUDA_INJECTION64_PATH|$KTRACE_OUT|[$KTRACE_TIMELINE]|$*"\n')
    fake.chmod(0o755)
    log = tmp_path / "run.log"
    for timeline, shown in (("", "[]"), (str(tmp_path / "t.tsv"), f"[{tmp_path / 't.tsv'}]")):
        r = run_sh_functions(("ktrace_bb",), 'BIN="$1"; KTRACE_SO=/x/ktrace.so; ktrace_bb k.tsv "$2" "$3" -m q -c 9',
                             str(tmp_path), timeline, str(log))
        assert r.returncode == 0, r.stderr
        assert log.read_text() == f"/x/ktrace.so|k.tsv|{shown}|-m q -c 9\n"


def test_wait_queues_says_how_each_queue_stands(tmp_path: Path) -> None:
    """wait_queues (step_wait_ruler's wait): a finished queue with its exit status, a running one with its log's tail,
    and no longer than $WAIT."""
    import os

    (tmp_path / "llb").mkdir()
    (tmp_path / "llb" / "a.done").touch()
    (tmp_path / "llb" / "a.rc").write_text("0\n")
    (tmp_path / "llb" / "b.log").write_text("x\n  passkey #6: 130985 tokens, score 1.00\n")
    script = f'source <(sed -n "/^wait_queues() {{/,/^}}/p" "{RUN_SH}"); WAIT=0 wait_queues a b'
    r = subprocess.run(["bash", "-c", script], check=False, capture_output=True, text=True, env={**os.environ, "HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["queue a done (rc 0)", "queue b still running:", "x", "  passkey #6: 130985 tokens, score 1.00"]


def _gate_json(path: Path, model: str, method: str, ctx: int, answers: list[str], keys: list[str]) -> None:
    samples = [{"task": "passkey", "ctx": ctx, "method": method, "index": i, "prompt_tokens": ctx - 20,
                "prompt_sha256": f"sha-{ctx}-{i}", "expected": [k], "answer": a, "score": float(bool(re.search(rf"\b{k}\b", a))),
                "all": bool(re.search(rf"\b{k}\b", a))} for i, (a, k) in enumerate(zip(answers, keys, strict=True))]
    res = GateResult(path.stem, "ruler", True, "ok", {"model": model, "methods": [method], "samples": samples}, [])
    path.write_text(json.dumps(dataclasses.asdict(res)))


def test_ruler_run_compare_pairs_methods_over_the_same_prompts(tmp_path: Path) -> None:
    """compare: per cell found (whole word) and first (the first number is the key), then the paired split of two
    methods with its exact sign-test p; prompts that differ between methods are refused."""
    keys = ["39384", "1200", "777", "42"]
    _gate_json(tmp_path / "ruler-y.json", "g.gguf", "yarn", 131072, ["1. 2. 3.", "1200.", "9. 777", "x"], keys)
    _gate_json(tmp_path / "ruler-d.json", "g.gguf", "dca", 131072, ["19384. Remember it. 39384", "1200", "777", "42"], keys)
    script = str(ROOT / "bench" / "gpu" / "ruler_run.py")
    r = subprocess.run([sys.executable, script, "compare", str(tmp_path / "ruler-y.json"), str(tmp_path / "ruler-d.json")],
                       check=False, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rows = [ln.split("\t") for ln in r.stdout.splitlines() if not ln.startswith("#")]
    assert rows[0] == ["g.gguf", "passkey", "131072", "yarn", "4", "2", "1"]
    assert rows[1] == ["g.gguf", "passkey", "131072", "dca", "4", "4", "3"]
    # found: dca alone on #0 and #3, yarn alone on none: p = 2 * (1/4) = 0.5; first: dca alone on #2, #3
    assert rows[2] == ["g.gguf", "passkey", "131072", "dca vs yarn", "found", "4", "2", "0", "0.5"]
    assert rows[3] == ["g.gguf", "passkey", "131072", "dca vs yarn", "first", "4", "2", "0", "0.5"]
    bad = json.loads((tmp_path / "ruler-d.json").read_text())
    bad["metrics"]["samples"][1]["prompt_sha256"] = "other"
    (tmp_path / "ruler-d.json").write_text(json.dumps(bad))
    r = subprocess.run([sys.executable, script, "compare", str(tmp_path / "ruler-y.json"), str(tmp_path / "ruler-d.json")],
                       check=False, capture_output=True, text=True)
    assert r.returncode == 1 and "yarn and dca were sent different prompts" in r.stderr


def test_sign_test_values() -> None:
    sys.path.insert(0, str(ROOT / "bench" / "gpu"))
    try:
        import ruler_run
    finally:
        sys.path.pop(0)
    assert ruler_run.sign_test(0, 0) == 1.0
    assert abs(ruler_run.sign_test(5, 0) - 0.0625) < 1e-12
    assert abs(ruler_run.sign_test(8, 2) - 0.109375) < 1e-12
    assert ruler_run.sign_test(3, 3) == 1.0




def _results_compare(tmp_path: Path, tgzs: tuple[Path, ...]):
    """Unpacks the ruler_run.py results (*.json) of the committed archives into tmp_path and returns a function that runs
    ``ruler_run.py compare`` over the files matching the glob patterns given, in that order (each pattern sorted)."""
    import tarfile

    for tgz in tgzs:
        with tarfile.open(tgz) as t:
            for m in t.getmembers():
                if m.isfile() and m.name.endswith(".json"):
                    (tmp_path / Path(m.name).name).write_bytes(t.extractfile(m).read())  # type: ignore[union-attr]

    def compare(*patterns: str) -> str:
        names = [str(p) for pat in patterns for p in sorted(tmp_path.glob(pat))]
        r = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu" / "ruler_run.py"), "compare", *names],
                           check=False, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        return r.stdout
    return compare


def found(out: str, model: str, task: str, ctx: int, label: str) -> int:
    """The keys found in one row of a ``ruler_run.py compare`` output (model, task, context, method label)."""
    rows = [ln.split("\t") for ln in out.splitlines() if ln.startswith(f"{model}\t{task}\t{ctx}\t{label}\t")]
    assert len(rows) == 1, (model, task, ctx, label)
    return int(rows[0][5])


def pair_counts(out: str, model: str, task: str, ctx: int, a: str, b: str) -> tuple[int, int, int]:
    """One "a vs b" found-pair row of a ``ruler_run.py compare`` output: (n paired, only a, only b)."""
    rows = [ln.split("\t") for ln in out.splitlines() if ln.startswith(f"{model}\t{task}\t{ctx}\t{a} vs {b}\tfound\t")]
    assert len(rows) == 1, (model, task, ctx, a, b)
    return int(rows[0][5]), int(rows[0][6]), int(rows[0][7])


def sample_answers(results: Path) -> list[str]:
    """The answer text of every sample of a ruler_run.py result, in order."""
    return [x["answer"] for x in json.loads(results.read_text())["metrics"]["samples"]]


def ppl_rows(tsv: Path) -> dict[tuple[str, str], str]:
    """A committed perplexity table (run.sh's ppl_one rows): (name, context) -> the perplexity over all windows."""
    rows = [ln.split("\t") for ln in tsv.read_text().splitlines()[1:]]
    return {(r[0], r[1]): r[4].split()[0] for r in rows}




def test_ruler_run_replay_sends_only_the_recorded_prompts(tmp_path: Path) -> None:
    """replay regenerates each chosen prompt and refuses one whose sha256 is not the recorded one (another seed or
    sample count), an index the result does not hold, and a server that is not there; with the recorded seed the
    prompts pass and the server is started (here one that is not a server: a clean error, not a refusal)."""
    res = FIXTURES / "ruler-passkey-smol-32768-s7.json"
    from dcaforge.gate.gatetools import tiny

    model = tmp_path / "m.gguf"
    tiny.build("llama", str(model))
    fake = tmp_path / "llama-server"
    fake.write_text("#!/bin/sh\nexit 3\n")
    fake.chmod(0o755)

    def replay(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(ROOT / "bench" / "gpu" / "ruler_run.py"), "replay", str(res), "--model", str(model),
                               "--out", str(tmp_path / "o.json"), *args], check=False, capture_output=True, text=True)

    r = replay("--server", str(fake), "--seed", "42", "--samples", "60", "--indices", "7,8")
    assert r.returncode == 2 and "sample 7 with seed 42 and 60 samples is not the recorded prompt" in r.stderr
    r = replay("--server", str(fake), "--seed", "7", "--samples", "30", "--indices", "7")
    assert r.returncode == 2 and "not the recorded prompt" in r.stderr
    r = replay("--server", str(fake), "--seed", "7", "--samples", "60", "--indices", "7,99")
    assert r.returncode == 2 and "no DCA sample [99]" in r.stderr
    r = replay("--server", str(tmp_path / "none"), "--seed", "7", "--samples", "60", "--indices", "7")
    assert r.returncode == 2 and "replay: no " in r.stderr
    r = replay("--server", str(fake), "--seed", "7", "--samples", "60", "--indices", "7,8,41")
    assert r.returncode == 1 and "llama-server exited (status 3)" in r.stderr, r.stderr
    assert not (tmp_path / "o.json").exists()
    argv = (tmp_path / "o.server.log").read_text().splitlines()[0]
    assert " -c 32768 " in argv and "--dca on --dca-chunk-size 4096 --dca-local-size 1024 --override-kv" in argv
    # the arguments are gate.ruler_server_args' (measure_ruler's), without -t: 32768 is past the recorded L 8192
    from dcaforge.gate.rulergate import ruler_server_args

    old = json.loads(res.read_text())["metrics"]
    assert old["trained"] == 8192 and old["chunk"] == 4096 and old["local"] == 1024
    assert argv.split(" --host ")[0] == "$ " + " ".join([str(fake), *ruler_server_args(str(model), "dca", 32768, 8192, "llama",
                                                                                      4096, 1024)])
    assert " --override-kv llama.context_length=int:32768 --host " in argv and " -t " not in argv


def test_gpu_library_check_sees_what_cuda_sh_hides() -> None:
    """llamafile 0.10.x's cuda.sh links and says "Successfully built" when units failed to compile; the GPU library
    check reads the failed units out of its log, and reads symbols demangled (a C++ name has no word boundary in
    its mangled form)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "gpu"))
    import llamafile_real_lib as lib

    log = ('[35/139] Compiling: mmq.cu\n/t/llama.cpp/ggml/src/ggml-cuda/mmq.cu(140): error: identifier "q" is undefined\n'
           '2 errors detected in the compilation of "/t/llama.cpp/ggml/src/ggml-cuda/mmq.cu".\n'
           '[36/139] Compiling: norm.cu\nggml/src/ggml.c:12:3: error: unknown type name\n'
           'Linking...\nSuccessfully built: /t/ggml-cuda.so\n')
    assert lib.compile_errors(log) == ["ggml.c", "mmq.cu"]
    assert lib.compile_errors("[1/2] Compiling: a.cu\n[2/2] Compiling: b.cu\nSuccessfully built: x.so\n") == []


def test_gpu_library_host_is_built_as_llamafile_builds_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """llamafile compiles its GPU library with -DGGML_MULTIPLATFORM (GGML_CALL = the Microsoft ABI for every backend
    callback); a host built without it calls them with the System V ABI and crashes in the library (seen on the H100:
    ggml_backend_cuda_reg_get_device_count read reg from rcx). The check's ggml and its lse_dlopen both get it."""
    sys.path.insert(0, str(ROOT / "bench" / "gpu"))
    import llamafile_real_lib as lib

    calls: list[list[str]] = []

    def record(argv: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float | None = None):
        calls.append(argv)
        return 0, ""

    monkeypatch.setattr(lib, "sh", record)
    (tmp_path / "llama.cpp" / "ggml" / "include").mkdir(parents=True)
    exe, how = lib.build_host(tmp_path, tmp_path / "work", 2)
    assert how == "built"
    configure, _build, link = calls
    assert "-DCMAKE_C_FLAGS=-DGGML_MULTIPLATFORM" in configure and "-DCMAKE_CXX_FLAGS=-DGGML_MULTIPLATFORM" in configure
    assert link[0] == "g++" and "-DGGML_MULTIPLATFORM" in link and exe == tmp_path / "work" / "lse_dlopen"


@pytest.mark.skipif(not __import__("shutil").which("nvcc"), reason="nvcc not installed")
def test_realtree_compiles_for_the_architectures_nvcc_knows() -> None:
    """bench/realtree.py --archs: one -gencode per architecture this nvcc lists; one it does not know is left out and
    reported, never passed to nvcc."""
    import shutil

    sys.path.insert(0, str(ROOT / "bench"))
    import realtree

    flags, unknown = realtree.gencodes(shutil.which("nvcc") or "nvcc", "86, 90,999")
    assert flags == ["-gencode", "arch=compute_86,code=sm_86", "-gencode", "arch=compute_90,code=sm_90"]
    assert unknown == ["999"]


LONGCTX_SH = ROOT / "bench" / "longctx" / "gpu.sh"


def test_longctx_pipeline_starts_from_the_committed_trials(tmp_path: Path) -> None:
    """bench/longctx/gpu.sh's pipeline, with the real bash and a stand-in stage: with GEMMA_ONLY=1 it starts once the
    build and gemma-3 are there (SmolLM2 not carried), begins from the committed held-out and dev trials (so run.py
    skips what is measured and finds each set's ceiling) and never overwrites a passkey.jsonl a run already has; a failed build stops it."""
    assert subprocess.run(["bash", "-n", str(LONGCTX_SH)], check=False).returncode == 0
    home = tmp_path / "home"
    (home / "llb").mkdir(parents=True)
    (home / "model").mkdir()
    (home / "llb" / "build.rc").write_text("0\n")
    (home / "model" / "gemma3-270m-q4_k_m.gguf").write_bytes(b"")
    script = f'source "{LONGCTX_SH}"; stage_probe() {{ wc -l < ~/lc/out/passkey.jsonl; }}; pipeline'
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin", "GEMMA_ONLY": "1", "STAGES": "probe", "OUT": str(tmp_path / "out")}

    def pipeline() -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, check=False, capture_output=True, text=True,
                              timeout=60)

    r = pipeline()
    committed = b"".join((ROOT / "bench" / "longctx" / d / "passkey.jsonl").read_bytes() for d in ("heldout-results", "dev-results"))
    assert r.returncode == 0 and "== done" in r.stdout, r.stdout + r.stderr
    assert (home / "lc" / "out" / "passkey.jsonl").read_bytes() == committed
    assert str(committed.count(b"\n")) in r.stdout
    (home / "lc" / "out" / "passkey.jsonl").write_text("{}\n")
    r = pipeline()
    assert (home / "lc" / "out" / "passkey.jsonl").read_text() == "{}\n"
    (home / "llb" / "build.rc").write_text("2\n")
    r = pipeline()
    assert "build failed" in r.stdout and "== probe" not in r.stdout


def test_longctx_build_uses_a_prebuilt_bin_only_for_its_own_tree_and_a_cuda_device(tmp_path: Path) -> None:
    """gpu.sh's use_prebuilt (step build_bg), with the real bash and tar and a stand-in llama-server: prebuild.sh's
    bin.tar.gz is unpacked and taken as the build (build.rc 0, and the pipeline, sourcing gpu.sh again, finds its
    libraries) only when its stamp is the carried tree.tar.gz's sha256 and its server lists a CUDA device; built from
    another tree, or listing none (a device without the driver it needs), it is removed and the device builds as before."""
    home, pack, stage = tmp_path / "home", tmp_path / "pack", tmp_path / "stage"
    for d in (home, pack, stage):
        d.mkdir(exist_ok=True)
    (pack / "tree.tar.gz").write_bytes(b"the tree")
    tree_sha = hashlib.sha256(b"the tree").hexdigest()
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin", "PACK": str(pack), "OUT": str(tmp_path / "out")}

    def pack_bin(stamp: str, devices: str) -> None:
        server = stage / "llama-server"
        server.write_text(f'#!/bin/bash\n[ "$1" = --list-devices ] || exit 9\necho "Available devices:"\n{devices}\n')
        server.chmod(0o755)
        (stage / "tree.sha256").write_text(stamp + "\n")
        subprocess.run(["tar", "czf", str(pack / "bin.tar.gz"), "-C", str(stage), "llama-server", "tree.sha256"], check=True)

    def use() -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", f'source "{LONGCTX_SH}"; use_prebuilt'], cwd=ROOT, env=env, check=False,
                              capture_output=True, text=True, timeout=60)

    bindir = home / "llb" / "build" / "bin"
    assert use().returncode == 1 and not (home / "llb" / "build.rc").exists()          # none carried
    pack_bin("0" * 64, 'echo "  CUDA0: NVIDIA H100 80GB HBM3 (81079 MiB, 80000 MiB free)"')
    r = use()
    assert r.returncode == 1 and "not built from the carried tree.tar.gz" in r.stdout, r.stdout + r.stderr
    assert not bindir.exists() and not (home / "llb" / "build.rc").exists()
    pack_bin(tree_sha, "true")
    r = use()
    assert r.returncode == 1 and "lists no CUDA device" in r.stdout, r.stdout + r.stderr
    assert not bindir.exists() and not (home / "llb" / "prebuilt").exists()
    pack_bin(tree_sha, 'echo "  CUDA0: NVIDIA H100 80GB HBM3 (81079 MiB, 80000 MiB free)"')
    r = use()
    assert r.returncode == 0 and "build: prebuilt" in r.stdout and "CUDA0: NVIDIA H100" in r.stdout, r.stdout + r.stderr
    assert (home / "llb" / "build.rc").read_text() == "0\n" and (bindir / "llama-server").exists()
    r = subprocess.run(["bash", "-c", f'source "{LONGCTX_SH}"; echo "$LD_LIBRARY_PATH"'], cwd=ROOT, env=env, check=False,
                       capture_output=True, text=True, timeout=60)
    assert r.stdout.strip().split(":")[:2] == [str(bindir), "/usr/local/cuda/lib64"], r.stdout + r.stderr
    # carried alone by an earlier call: step pieces keeps it in ~/llb, where use_prebuilt finds it
    r = subprocess.run(["bash", "-c", f'source "{LONGCTX_SH}"; step_pieces'], cwd=ROOT, env=env, check=False,
                       capture_output=True, text=True, timeout=60)
    assert "bin.tar.gz: kept for build_bg" in r.stdout and (home / "llb" / "bin.tar.gz").exists(), r.stdout + r.stderr
    (pack / "bin.tar.gz").unlink()
    (home / "llb" / "build.rc").unlink()
    r = use()
    assert r.returncode == 0 and "build: prebuilt" in r.stdout and (home / "llb" / "build.rc").exists(), r.stdout + r.stderr


def test_longctx_build_unpacks_the_sources_for_calibrate_when_prebuilt(tmp_path: Path) -> None:
    """step build_bg with a prebuilt bin.tar.gz still unpacks tree.tar.gz into ~/llb/src (calibrate_gpu.sh's dev
    text), and calibrate_gpu.sh, sourced after it, finds the prebuilt tools' libraries as gpu.sh does."""
    home, pack, stage, tree = tmp_path / "home", tmp_path / "pack", tmp_path / "stage", tmp_path / "tree"
    for d in (home, pack, stage, tree / "src"):
        d.mkdir(parents=True, exist_ok=True)
    (tree / "src" / "llama.cpp").write_text("int main() {}\n")
    subprocess.run(["tar", "czf", str(pack / "tree.tar.gz"), "-C", str(tree), "src"], check=True)
    server = stage / "llama-server"
    server.write_text('#!/bin/bash\necho "  CUDA0: NVIDIA H100 80GB HBM3 (81079 MiB, 80000 MiB free)"\n')
    server.chmod(0o755)
    (stage / "tree.sha256").write_text(hashlib.sha256((pack / "tree.tar.gz").read_bytes()).hexdigest() + "\n")
    subprocess.run(["tar", "czf", str(pack / "bin.tar.gz"), "-C", str(stage), "llama-server", "tree.sha256"], check=True)
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin", "PACK": str(pack), "OUT": str(tmp_path / "out")}
    r = subprocess.run(["bash", "-c", f'source "{LONGCTX_SH}"; step_build_bg'], cwd=ROOT, env=env, check=False,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "build: prebuilt" in r.stdout, r.stdout + r.stderr
    assert (home / "llb" / "src" / "src" / "llama.cpp").read_text() == "int main() {}\n"
    cal_sh = ROOT / "bench" / "longctx" / "calibrate_gpu.sh"
    r = subprocess.run(["bash", "-c", f'source "{cal_sh}"; echo "$LD_LIBRARY_PATH"'], cwd=ROOT, env=env, check=False,
                       capture_output=True, text=True, timeout=60)
    assert r.stdout.strip().split(":")[:2] == [str(home / "llb" / "build" / "bin"), "/usr/local/cuda/lib64"], r.stdout + r.stderr


def test_longctx_prebuild_says_what_it_needs_before_it_builds(tmp_path: Path) -> None:
    """bench/longctx/prebuild.sh, with the real bash: without pack.sh's tree.tar.gz, or without the cuBLAS wheel, it
    stops before it removes or builds anything and names what to run; its build folder is left as it was."""
    script = ROOT / "bench" / "longctx" / "prebuild.sh"
    assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0
    pack, wheels, work = tmp_path / "pack", tmp_path / "wheels", tmp_path / "work"
    for d in (pack, wheels, work):
        d.mkdir()
    (work / "keep").write_text("x")
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "PACK": str(pack)}

    def prebuild() -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(script), str(wheels), str(work)], env=env, check=False, capture_output=True,
                              text=True, timeout=60)

    r = prebuild()
    assert r.returncode == 2 and f"no {pack}/tree.tar.gz: run bench/longctx/pack.sh first" in r.stderr, r.stderr
    (pack / "tree.tar.gz").write_bytes(b"")
    r = prebuild()
    assert r.returncode == 2 and f"no nvidia_cublas-13.*.whl in {wheels}" in r.stderr, r.stderr
    assert (work / "keep").read_text() == "x" and sorted(p.name for p in pack.iterdir()) == ["tree.tar.gz"]


def test_longctx_speed_times_dca_only_with_its_arguments(tmp_path: Path) -> None:
    """gpu.sh's speed step, with the real bash and run.py and a stand-in llama-batched-bench that records its arguments:
    with the chosen setting the dca rounds pass --dca on and its sizes and the plain rounds none; with an empty or unknown
    setting (a failed choice) it times nothing and says so, rather than timing plain twice with one row labelled dca
    (what an ad hoc call did on the device on 2026-12-07)."""
    home = tmp_path / "home"
    bindir = home / "llb" / "build" / "bin"
    bindir.mkdir(parents=True)
    (home / "lc" / "out").mkdir(parents=True)
    bench = bindir / "llama-batched-bench"
    bench.write_text('#!/bin/bash\necho "$*" >> "$HOME/calls"\necho "| 32768 |    128 |    1 |  32896 |    0.9 | 35000.00 |"\n')
    bench.chmod(0o755)
    env = {"HOME": str(home), "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "OUT": str(tmp_path / "out")}

    def speed(chosen: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", f'source "{LONGCTX_SH}"; ROUNDS=7 speed "{chosen}"'], cwd=ROOT, env=env,
                              check=False, capture_output=True, text=True, timeout=60)

    for bad in ("", "dca:6144"):
        r = speed(bad)
        assert r.returncode == 1 and f"no DCA arguments for '{bad}'" in r.stderr, r.stdout + r.stderr
        assert not (home / "calls").exists() and not (home / "lc" / "out" / "speed.txt").exists()
    r = speed("dca:6144:1024")
    assert r.returncode == 0, r.stdout + r.stderr
    plain, dca = (home / "calls").read_text().splitlines()
    assert "--dca" not in plain and "-npp 32768,65536" in plain
    assert dca.startswith(plain) and dca.endswith("--dca on --dca-chunk-size 6144 --dca-local-size 1024 --dca-yarn-factor 0")
    rows = (home / "lc" / "out" / "speed.txt").read_text().splitlines()
    assert [row.split(" |")[0] for row in rows] == ["plain r7", "dca r7"]


def test_longctx_devfar_falls_back_to_devfar2_only_when_devfars_ceiling_fails(tmp_path: Path) -> None:
    """gpu.sh's stage devfar, with the real bash and a stand-in run.py that records its calls: each set's ceiling runs
    first; where run.py refuses devfar's cell (exit 2: its ceiling failed), devfar2's ceiling and cell run, and where
    devfar's cell runs, devfar2 is not touched."""
    calls = tmp_path / "calls"
    stub = tmp_path / "run.py"
    stub.write_text(f'#!/bin/bash\necho "$*" >> "{calls}"\n'
                    '[[ "$*" == *"--set devfar "* && "$*" != *"--lengths inside"* ]] && exit "${DEVFAR_RC:-0}"\nexit 0\n')
    stub.chmod(0o755)
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "out")}
    (tmp_path / "lc" / "out").mkdir(parents=True)

    def stage(rc: int) -> list[str]:
        calls.unlink(missing_ok=True)
        r = subprocess.run(["bash", "-c", f'source "{LONGCTX_SH}"; RUN="{stub}"; stage_devfar'], cwd=ROOT,
                           env={**env, "DEVFAR_RC": str(rc)}, check=False, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        return [" ".join(line.split()[:10]) for line in calls.read_text().splitlines()]

    far = "--methods dca:16384:2048,dca:4096:512:pos"
    assert stage(0) == ["passkey --set devfar --model gemma-3-270m --methods plain --lengths inside --bin",
                        f"passkey --set devfar --model gemma-3-270m {far} --lengths 985000 --jobs"]
    assert stage(2) == ["passkey --set devfar --model gemma-3-270m --methods plain --lengths inside --bin",
                        f"passkey --set devfar --model gemma-3-270m {far} --lengths 985000 --jobs",
                        "passkey --set devfar2 --model gemma-3-270m --methods plain --lengths inside --bin",
                        f"passkey --set devfar2 --model gemma-3-270m {far} --lengths 988000 --jobs"]


def test_longctx_devlen_runs_dev_cells_then_the_1m_cell_one_candidate_after_the_other(tmp_path: Path) -> None:
    """gpu.sh's stage devlen (--dca-yarn-factor len), with the real bash and a stand-in run.py that records its calls:
    gemma-3's two dev cells and its dev perplexity for $GEMMA_LEN, devfar2's ceiling, then its 1M cell for each candidate
    alone, in the order written down (4096 / 512 first)."""
    calls = tmp_path / "calls"
    stub = tmp_path / "run.py"
    stub.write_text(f'#!/bin/bash\necho "$*" >> "{calls}"\nexit 0\n')
    stub.chmod(0o755)
    (tmp_path / "lc" / "out").mkdir(parents=True)
    r = subprocess.run(["bash", "-c", f'source "{LONGCTX_SH}"; RUN="{stub}"; stage_devlen'], cwd=ROOT, check=False,
                       env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "out")},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    got = [" ".join(line.split()[:9]) for line in calls.read_text().splitlines()]
    both = "--methods dca:4096:512:len,dca:16384:2048:len"
    assert got == [f"passkey --set dev --model gemma-3-270m {both} --lengths 81920,163840",
                   f"ppl --set dev --model gemma-3-270m {both} --chars 600000",
                   "passkey --set devfar2 --model gemma-3-270m --methods plain --lengths inside",
                   "passkey --set devfar2 --model gemma-3-270m --methods dca:4096:512:len --lengths 988000",
                   "passkey --set devfar2 --model gemma-3-270m --methods dca:16384:2048:len --lengths 988000"]


def test_longctx_devlenfar_runs_the_1m_cell_alone(tmp_path: Path) -> None:
    """gpu.sh's stage devlenfar: devfar2's ceiling, then its 1M cell for each of $GEMMA_LENFAR in order, and nothing
    else (no dev cell, no perplexity: those of 4096 / 512 len are committed)."""
    calls = tmp_path / "calls"
    stub = tmp_path / "run.py"
    stub.write_text(f'#!/bin/bash\necho "$*" >> "{calls}"\nexit 0\n')
    stub.chmod(0o755)
    (tmp_path / "lc" / "out").mkdir(parents=True)
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "out")}
    for lenfar, want in ((None, ["dca:4096:512:len"]), ("dca:4096:512:len,dca:8192:1024:len",
                                                        ["dca:4096:512:len", "dca:8192:1024:len"])):
        calls.unlink(missing_ok=True)
        r = subprocess.run(["bash", "-c", f'source "{LONGCTX_SH}"; RUN="{stub}"; stage_devlenfar'], cwd=ROOT,
                           check=False, env={**env, **({"GEMMA_LENFAR": lenfar} if lenfar else {})},
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        got = [" ".join(line.split()[:9]) for line in calls.read_text().splitlines()]
        assert got == ["passkey --set devfar2 --model gemma-3-270m --methods plain --lengths inside",
                       *(f"passkey --set devfar2 --model gemma-3-270m --methods {m} --lengths 988000" for m in want)]


def test_longctx_devfar_best2_runs_the_dev_rules_pick_and_runner_up(tmp_path: Path) -> None:
    """GEMMA_FAR=best2: stage devfar's 1M cell runs the dev rule's pick over $GEMMA_DEV on the dev set alone and the pick
    over the rest (a stand-in run.py whose choose answers the candidate it is told to, by the order given), both asked
    with --set dev; and where choose fails, no cell runs."""
    calls = tmp_path / "calls"
    stub = tmp_path / "run.py"
    stub.write_text(f'#!/bin/bash\necho "$*" >> "{calls}"\n'
                    'if [ "$1" = choose ]; then [ -n "$FAIL" ] && exit 1\n'
                    '  m=$(echo "$*" | sed "s/.*--methods \\([^ ]*\\).*/\\1/"); IFS=, read -ra a <<< "$m"\n'
                    '  for w in $PICK; do for x in "${a[@]}"; do [ "$x" = "$w" ] && { echo "$x"; exit 0; }; done; done; exit 1; fi\n'
                    'exit 0\n')
    stub.chmod(0o755)
    (tmp_path / "lc" / "out").mkdir(parents=True)
    cands = "dca:16384:2048,dca:4096:512:pos,dca:4096:512:chunk"

    def stage(**extra: str) -> tuple[int, list[str]]:
        calls.unlink(missing_ok=True)
        env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "out"), "GEMMA_FAR": "best2",
               "GEMMA_DEV": cands, "DEV_SETS": "dev,devfar,devfar2", **extra}
        r = subprocess.run(["bash", "-c", f'source "{LONGCTX_SH}"; RUN="{stub}"; stage_devfar'], cwd=ROOT, env=env,
                           check=False, capture_output=True, text=True, timeout=60)
        return r.returncode, [" ".join(line.split()[:10]) for line in calls.read_text().splitlines()] if calls.exists() else []

    rc, got = stage(PICK="dca:4096:512:chunk dca:16384:2048 dca:4096:512:pos")
    out = f"{tmp_path / 'lc' / 'out'} {ROOT / 'bench' / 'longctx' / 'dev-results'}"
    assert rc == 0 and got == [f"choose --set dev --model gemma-3-270m --methods {cands} {out}",
                               f"choose --set dev --model gemma-3-270m --methods dca:16384:2048,dca:4096:512:pos {out}",
                               "passkey --set devfar --model gemma-3-270m --methods plain --lengths inside --bin",
                               "passkey --set devfar --model gemma-3-270m --methods dca:4096:512:chunk,dca:16384:2048 "
                               "--lengths 985000 --jobs"], got
    assert "devfar: dca:4096:512:chunk,dca:16384:2048" in (tmp_path / "lc" / "out" / "choice.txt").read_text()
    rc, got = stage(PICK="x", FAIL="1")
    assert rc != 0 and not any(c.startswith("passkey") for c in got), got
