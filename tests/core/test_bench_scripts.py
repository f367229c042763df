"""The GPU bench scripts run where a mistake costs device minutes: check their syntax and the
setting names that bench/gpu/RESULTS.md quotes, here, with the real bash."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dcaforge.gate import GateResult

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


BB_LOG = ROOT / "bench" / "gpu" / "2026-11-30-run2" / "speed-dca-128k-tg32.log"


def test_batched_bench_rows_and_ratios(tmp_path: Path) -> None:
    """bb_rows reads a real llama-batched-bench log (run 2's); speed_smol_ratios pairs DCA with plain per round, per
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


RUN6 = ROOT / "bench" / "gpu" / "2026-12-02-run6"


def test_grid_tables_of_run6_give_the_figures_quoted() -> None:
    """RESULTS.md's run-6 grid table is what run.sh's summary makes of the committed passkey rows."""
    r = run_sh_functions(("summary",), 'OUT="$1"; summary grid-smol-passkey.tsv', str(RUN6))
    assert r.returncode == 0, r.stderr
    got = {" ".join(ln.split()[:3]): ln.split()[6] for ln in r.stdout.splitlines()}
    assert got["dca-S4w1 junk 1300"] == "4/10" and got["dca-S4w1 junk 2600"] == "5/10"
    assert got["plain junk 300"] == "4/10" and got["yarn junk 1300"] == "3/10" and got["dca-S6w1 junk 1300"] == "2/10"
    assert (RUN6 / "grid-smol-passkey-summary.txt").read_text().split() == r.stdout.split()


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


def test_passkey_jobs_lines() -> None:
    """passkey_jobs (run.sh's passkey and grid_smol): 10 positions inside, then per spec plain, YaRN with the spec's
    factor for {f}, each DCA setting; BASELINES=0 keeps only the DCA lines."""
    call = 'passkey_jobs t.tsv "300 8192" yarn "--rope-scale {f} --x" "S4w1 S2w0.25" "1300 40960 4"'
    lines = run_sh_functions(("passkey_jobs",), call).stdout.splitlines()
    assert len(lines) == 10 + 10 * 4
    assert lines[0] == "passkey_one t.tsv plain 300 15 8192" and lines[9] == "passkey_one t.tsv plain 300 285 8192"
    assert lines[10:14] == ["passkey_one t.tsv plain 1300 65 40960", "passkey_one t.tsv yarn 1300 65 40960 --rope-scale 4 --x",
                            "passkey_one t.tsv dca-S4w1 1300 65 40960 $(dca_cfg S4w1 4)",
                            "passkey_one t.tsv dca-S2w0.25 1300 65 40960 $(dca_cfg S2w0.25 4)"]
    only = run_sh_functions(("passkey_jobs",), "BASELINES=0 " + call).stdout.splitlines()
    assert len(only) == 20 and all(" dca-" in ln for ln in only)


RUN10_KTRACE = ROOT / "bench" / "gpu" / "2026-12-02-run10" / "ktrace"
KTRACE_DIFF = ROOT / "bench" / "gpu" / "ktrace_diff.py"


def ktrace_diff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(KTRACE_DIFF), *args], cwd=RUN10_KTRACE, check=False,
                          capture_output=True, text=True)


def test_ktrace_diff_of_run10_gives_the_figures_quoted() -> None:
    """RESULTS.md's run-10 kernel profile is what ktrace_diff.py makes of the committed ktrace tables."""
    prompt = ktrace_diff("smol-plain-tg32.tsv", "smol-dca-tg32.tsv")
    assert prompt.returncode == 0, prompt.stderr
    assert prompt.stdout.splitlines()[0] == "total plain 815.4 ms, dca 846.4 ms, ratio 1.038"
    rows = {ln.split("\t")[-1]: ln.split("\t") for ln in prompt.stdout.splitlines()[2:]}
    fixup = rows["flash_attn_stream_k_fixup_general<64, 16, 4>"]
    assert (int(fixup[1]), int(fixup[3])) == (1920, 3840)          # one stream-k fixup per flash attention call
    decode = ktrace_diff("smol-plain-tg160.tsv", "smol-dca-tg160.tsv", "--minus", "smol-plain-tg32.tsv",
                         "smol-dca-tg32.tsv", "--rows", "10")
    assert decode.stdout.splitlines()[0] == "total plain 380.6 ms, dca 246.7 ms, ratio 0.648"
    # 128 decode steps x 30 layers: DCA's one merge per layer and step
    assert "\t3840\t8.21\tk_fattn_lse_merge<2>" in decode.stdout
    # and no repeat of Q (one token: Q's row at a zero stride): the one repeat left runs once per step (the device
    # mask's cell indices), not once per layer
    every = ktrace_diff("smol-plain-tg160.tsv", "smol-dca-tg160.tsv", "--minus", "smol-plain-tg32.tsv",
                        "smol-dca-tg32.tsv", "--rows", "1000")
    repeats = [ln.split("\t") for ln in every.stdout.splitlines() if "op_repeat" in ln]
    assert [int(r[3]) for r in repeats] == [128]
    qwen = ktrace_diff("qwen05-plain.tsv", "qwen05-dca.tsv")
    assert qwen.stdout.splitlines()[0] == "total plain 1513.5 ms, dca 1645.3 ms, ratio 1.087"
    for f, out in (("diff-smol-prompt.txt", prompt), ("diff-smol-decode.txt", decode), ("diff-qwen05-prompt.txt", qwen)):
        assert (RUN10_KTRACE / f).read_text() == out.stdout


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


RUN11 = ROOT / "bench" / "gpu" / "2026-12-03-run11"
KTRACE_TIMELINE = ROOT / "bench" / "gpu" / "ktrace_timeline.py"


def ratios_of(tsv_text: str, tmp_path: Path) -> dict[tuple[str, str, str], tuple[str, str]]:
    tsv = tmp_path / "speed.tsv"
    tsv.write_text(tsv_text)
    r = run_sh_functions(("speed_smol_ratios",), 'speed_smol_ratios "$1"', str(tsv))
    assert r.returncode == 0, r.stderr
    return {tuple(ln.split()[:3]): tuple(ln.split()[3:5]) for ln in r.stdout.splitlines() if ln[:1].isdigit()}


def test_run11_speed_tables_give_the_figures_quoted(tmp_path: Path) -> None:
    """RESULTS.md's run-11 table is what run.sh's own ratio function makes of the committed tables: SmolLM2 over the
    4 rounds of speed_smol_cells and the plain/dca rounds of speed_modes, Qwen-shape over both speed_qwen05 calls."""
    smol = (RUN11 / "speed-smol-s2.tsv").read_text()
    modes = (RUN11 / "speed-modes-s2.tsv").read_text().splitlines()
    smol += "\n".join(ln for ln in modes[1:] if ln.split("\t")[1] in ("plain", "dca")) + "\n"
    s = ratios_of(smol, tmp_path)
    assert s[("1", "32768", "plain")] == ("0.908", "0.983")
    assert s[("1", "65536", "plain")] == ("0.953", "1.098")
    assert s[("4", "16384", "plain")] == ("0.913", "0.962")
    assert s[("4", "16384", "plain-kvu")] == ("1.423", "0.843")
    qwen = (RUN11 / "speed-qwen05-s2a.tsv").read_text()
    qwen += "".join((RUN11 / "speed-qwen05-s2b.tsv").read_text().splitlines(keepends=True)[1:])
    q = ratios_of(qwen, tmp_path)
    assert q[("1", "32768", "plain")] == ("0.899", "1.061")
    assert q[("1", "65536", "plain")] == ("0.933", "1.082")
    assert q[("1", "131072", "plain")] == ("0.975", "1.073")
    assert q[("4", "16384", "plain")] == ("0.924", "0.967")
    assert q[("4", "16384", "plain-kvu")] == ("1.514", "0.880")
    # the same-round A/B of the kept mask size (speed_modes' own ratio file)
    ab = (RUN11 / "speed-modes-s2-ratios.txt").read_text()
    assert "dca:        1      32768   plain            0.916        0.998" in ab
    assert "dca-nohw:   1      32768   plain            0.878        0.991" in ab
    text = (ROOT / "bench" / "gpu" / "RESULTS.md").read_text()
    for quoted in ("**0.908 / 0.983**", "**0.953 / 1.098**", "**0.899** / **1.061**", "**0.975 / 1.073**",
                   "prompt 0.916 / 0.953 at 32k /\n64k with the kept mask against 0.878 / 0.914"):
        assert quoted in text


def timeline_rows(path: Path) -> dict[str, list[str]]:
    """The prompt's rows (first block) and the decode kernels' rows of a ktrace_timeline report, by name."""
    rows: dict[str, list[str]] = {}
    for ln in path.read_text().splitlines():
        parts = ln.split("\t")
        if len(parts) == 4:
            rows.setdefault(parts[3] if parts[0][:1] in ("+", "-") else parts[0], parts)
    return rows


def test_run11_timelines_give_the_figures_quoted() -> None:
    s1 = timeline_rows(RUN11 / "timeline-s1-smol-32k.txt")
    assert s1["wall"][1:3] == ["845901.1", "940839.6"]
    assert s1["GPU idle"][1:3] == ["111313.1", "160765.6"]
    assert s1["idle gaps >= 500 us: count"][1:3] == ["19.0", "68.0"]
    assert s1["flash_attn_stream_k_fixup_uniform<64, 2, 4>"][2] == "248.5"
    s2 = timeline_rows(RUN11 / "timeline-s2-smol-32k.txt")
    assert s2["flash_attn_lse_fixup_uniform<64, 2, 4>"][2] == "99.7"
    assert "flash_attn_stream_k_fixup_uniform<64, 2, 4>" not in s2    # the LSE calls no longer run upstream's fixup
    text = (ROOT / "bench" / "gpu" / "RESULTS.md").read_text()
    for quoted in ("| wall | 845.9 ms | 940.8 ms | +94.9 ms |", "(**248.5**)", "the fixup 99.7 us a step (**2.5x** less)"):
        assert quoted in text


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


def test_default_queues_send_the_gate_each_cell(tmp_path: Path) -> None:
    """run 12's queues: each cell one ruler_run.py run (the default rule = the gate's chunk and local left out), the
    1x cells named so, SmolLM2's cells on its own model; an unknown queue is refused."""
    log = tmp_path / "calls"
    call = ('CALLS=$1; python3() { printf "%s\\n" "$*" >> "$CALLS"; }; MODEL=/m/gemma.gguf SMOL=/m/smol.gguf BIN=/b OUT=/o; '
            'DEFAULT_SAMPLES=30 DEFAULT_NIAH=12 DEFAULT_ARGS=\'"threads": 5\'; QUEUE=$2 step_default_queue')
    for queue in ("inside", "dca"):
        r = run_sh_functions(("default_cells", "cells_queue", "step_default_queue"), call, str(log), queue)
        assert r.returncode == 0, r.stderr
    lines = log.read_text().splitlines()
    assert len(lines) == 9
    names = [ln.split("--name ")[1].split()[0] for ln in lines]
    assert names == ["def-gemma-passkey-plain-1x", "def-gemma-passkey-dca-1x", "def-smol-passkey-plain-1x",
                     "def-smol-passkey-dca-1x", "def-gemma-niah_single-plain-1x", "def-gemma-niah_single-dca-1x",
                     "def-gemma-passkey-dca", "def-smol-passkey-dca", "def-gemma-niah_single-dca"]
    opts = [json.loads(ln.split("--options ", 1)[1]) for ln in lines]
    assert opts[6] == {"tasks": ["passkey"], "methods": ["dca"], "contexts": [65536, 131072], "samples": 30, "threads": 5}
    assert opts[7]["contexts"] == [16384, 32768] and "--model /m/smol.gguf" in lines[7]
    assert opts[8]["samples"] == 12 and opts[3]["contexts"] == [8192]
    assert all("chunk" not in o and "local" not in o for o in opts)
    assert all(ln.startswith("bench/gpu/ruler_run.py run --server /b/llama-server") and "--out /o " in ln for ln in lines)
    r = run_sh_functions(("default_cells", "cells_queue", "step_default_queue"), call, str(log), "plain")
    assert r.returncode == 1 and "no queue plain" in r.stderr


def test_wait_queues_says_how_each_queue_stands(tmp_path: Path) -> None:
    """wait_queues (step_wait_ruler's and step_wait_default's wait): a finished queue with its exit status, a running
    one with its log's tail, and no longer than $WAIT; the default queues' server options are the RULER queues' with
    5 threads each."""
    import os

    (tmp_path / "llb").mkdir()
    (tmp_path / "llb" / "a.done").touch()
    (tmp_path / "llb" / "a.rc").write_text("0\n")
    (tmp_path / "llb" / "b.log").write_text("x\n  passkey #6: 130985 tokens, score 1.00\n")
    script = f'source <(sed -n "/^wait_queues() {{/,/^}}/p" "{RUN_SH}"); WAIT=0 wait_queues a b'
    r = subprocess.run(["bash", "-c", script], check=False, capture_output=True, text=True, env={**os.environ, "HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["queue a done (rc 0)", "queue b still running:", "x", "  passkey #6: 130985 tokens, score 1.00"]
    lines = [ln for ln in RUN_SH.read_text().splitlines() if ln.startswith(("GPU_ARGS=", "DEFAULT_ARGS="))]
    r = subprocess.run(["bash", "-c", "\n".join(lines) + '\necho "$GPU_ARGS"; echo "$DEFAULT_ARGS"'], check=False,
                       capture_output=True, text=True)
    gpu, default = (json.loads("{" + ln + "}") for ln in r.stdout.splitlines())
    assert gpu["threads"] == 8 and default == {**gpu, "threads": 5}


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


RUN12 = ROOT / "bench" / "gpu" / "2026-12-03-run12"


def test_run12_results_give_the_figures_quoted(tmp_path: Path) -> None:
    """RESULTS.md's run-12 table: compare over the committed samples (every JSON of default.tgz and s7.tgz) gives the
    counts and p-values quoted, and the committed default-compare.txt byte for byte."""
    import tarfile

    script = str(ROOT / "bench" / "gpu" / "ruler_run.py")

    def compare(*names: str) -> str:
        r = subprocess.run([sys.executable, script, "compare", *(str(tmp_path / n) for n in names)],
                           check=False, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        return r.stdout

    for tgz in ("default.tgz", "s7.tgz"):
        with tarfile.open(RUN12 / tgz) as t:
            for m in t.getmembers():
                if m.isfile() and m.name.endswith(".json"):
                    (tmp_path / Path(m.name).name).write_bytes(t.extractfile(m).read())  # type: ignore[union-attr]
    default = sorted(p.name for p in tmp_path.glob("ruler-def-*.json"))
    assert len(default) == 12
    out = compare(*default)
    assert out == (RUN12 / "default-compare.txt").read_text()
    g, sm = "gemma3-270m-q4_k_m.gguf", "smollm2-135m-instruct-q4_1.gguf"
    cells = {tuple(ln.split("\t")[:4]): ln.split("\t")[4:] for ln in out.splitlines() if not ln.startswith("#")}
    assert cells[(g, "passkey", "32768", "plain")] == ["30", "15", "15"]
    assert cells[(g, "passkey", "131072", "dca")] == ["30", "19", "18"]
    assert cells[(g, "passkey", "131072", "yarn")] == ["30", "12", "11"]
    assert f"{g}\tpasskey\t131072\tdca vs yarn\tfound\t30\t8\t1\t0.0391" in out.splitlines()
    assert cells[(sm, "passkey", "8192", "plain")] == ["30", "24", "24"]
    assert cells[(sm, "passkey", "32768", "dca")] == ["30", "19", "19"]
    assert cells[(g, "niah_single", "65536", "dca")] == ["12", "6", "-"]
    s7 = compare("ruler-s7-plain-1x.json", "ruler-s7-dca-default.json", "ruler-s7-yarn.json")
    assert s7 == (RUN12 / "s7-compare.txt").read_text()
    assert f"{sm}\tpasskey\t32768\tdca vs yarn\tfound\t60\t20\t10\t0.0987" in s7
    assert f"{sm}\tpasskey\t8192\tplain\t60\t53\t53" in s7 and f"{sm}\tpasskey\t32768\tdca\t60\t36\t36" in s7


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


RUN13 = ROOT / "bench" / "gpu" / "2026-12-03-run13"


def test_run13_results_give_the_figures_quoted(tmp_path: Path) -> None:
    """RESULTS.md's run-13 table (DCA's attention temperature): compare over the committed samples of runs 12 and 13
    gives the committed compare-s7.txt / compare-s42.txt byte for byte and the counts quoted; run 13's control (the
    factor off) answers every prompt as run 12 did."""
    compare = _results_compare(tmp_path, (RUN12 / "default.tgz", RUN12 / "s7.tgz", RUN13 / "temp.tgz"))
    s7 = compare("ruler-temp-*-s7-*.json", "ruler-s7-plain-1x.json", "ruler-s7-yarn.json", "ruler-s7-dca-default.json")
    s42 = compare("ruler-temp-*-s42-*.json", "ruler-def-*.json")
    assert s7 == (RUN13 / "compare-s7.txt").read_text()
    assert s42 == (RUN13 / "compare-s42.txt").read_text()
    sm, g = "smollm2-135m-instruct-q4_1.gguf", "gemma3-270m-q4_k_m.gguf"

    dca = "dca[S4096 w1024 --dca-yarn-factor {}]"
    assert found(s7, sm, "passkey", 8192, "plain") == 53
    assert [found(s7, sm, "passkey", 32768, dca.format(f)) for f in ("0", "4", "7.389", "16")] == [36, 52, 55, 49]
    assert found(s7, sm, "passkey", 32768, "dca[S4096 w1024]") == 36
    assert f"{sm}\tpasskey\t32768\t{dca.format(0)} vs dca[S4096 w1024]\tfound\t60\t0\t0\t1" in s7   # run 12 again
    assert f"{sm}\tpasskey\t32768\t{dca.format(4)} vs {dca.format(0)}\tfound\t60\t21\t5\t0.00249" in s7
    assert found(s42, sm, "passkey", 8192, "plain") == 24
    assert [found(s42, sm, "passkey", 32768, dca.format(f)) for f in ("0", "4", "7.389", "16")] == [19, 24, 23, 26]
    assert [found(s42, sm, "passkey", 16384, dca.format(f)) for f in ("2", "4")] == [24, 29]
    assert found(s42, g, "passkey", 65536, "dca[S16384 w4096 --dca-yarn-factor 2]") == 19
    assert found(s42, g, "passkey", 131072, "dca[S16384 w4096 --dca-yarn-factor 4]") == 20
    assert found(s42, g, "niah_single", 65536, "dca[S16384 w4096 --dca-yarn-factor 2]") == 4
    assert found(s42, g, "niah_single", 131072, "dca[S16384 w4096 --dca-yarn-factor 4]") == 5


RUN14 = ROOT / "bench" / "gpu" / "2026-12-03-run14"


def test_run14_results_give_the_figures_quoted(tmp_path: Path) -> None:
    """RESULTS.md's run-14 table (run 13's per-token default on run 13's prompts): compare over the committed samples
    of runs 12, 13 and 14 gives the committed compare-s7.txt / compare-s42.txt byte for byte and the counts and
    paired tests quoted; the perplexity and speed figures quoted are the committed tables'."""
    compare = _results_compare(tmp_path, (RUN12 / "default.tgz", RUN12 / "s7.tgz", RUN13 / "temp.tgz", RUN14 / "temp.tgz"))
    s7 = compare("ruler-temp-*-s7*.json", "ruler-s7-plain-1x.json", "ruler-s7-yarn.json")
    s42 = compare("ruler-temp-*-s42*.json", "ruler-def-*-1x.json", "ruler-def-*-yarn.json")
    assert s7 == (RUN14 / "compare-s7.txt").read_text()
    assert s42 == (RUN14 / "compare-s42.txt").read_text()
    sm, g = "smollm2-135m-instruct-q4_1.gguf", "gemma3-270m-q4_k_m.gguf"

    per_token, static = "dca[S4096 w1024]", "dca[S4096 w1024 --dca-yarn-factor {}]"
    assert [found(s7, sm, "passkey", 32768, x) for x in (per_token, static.format(0), static.format(4))] == [34, 36, 52]
    assert [found(s42, sm, "passkey", 32768, x) for x in (per_token, static.format(0), static.format(4))] == [16, 19, 24]
    assert [found(s42, sm, "passkey", 16384, x) for x in (per_token, static.format(2))] == [23, 24]
    assert found(s7, sm, "passkey", 8192, "plain") == 53 and found(s42, sm, "passkey", 8192, "plain") == 24
    gd = "dca[S16384 w4096]"
    assert [found(s42, g, "passkey", c, gd) for c in (65536, 131072)] == [19, 19]
    assert [found(s42, g, "niah_single", c, gd) for c in (65536, 131072)] == [3, 5]
    assert f"{sm}\tpasskey\t32768\t{static.format(4)} vs {per_token}\tfound\t60\t20\t2\t0.000121" in s7
    assert f"{sm}\tpasskey\t32768\t{static.format(0)} vs {per_token}\tfound\t60\t7\t5\t0.774" in s7
    assert f"{sm}\tpasskey\t32768\t{static.format(4)} vs {per_token}\tfound\t30\t8\t0\t0.00781" in s42
    assert ppl_rows(RUN14 / "temp-ppl.tsv") == {
        ("smol-dca-auto", "32768"): "2.6866", ("smol-dca-auto", "16384"): "2.6929",
        ("gemma-dca-auto", "131072"): "2.8152", ("gemma-dca-auto", "65536"): "2.6450", ("smol-dca-F4", "16384"): "2.7295"}

    def ratios(name: str) -> list[tuple[str, str]]:
        rows = [ln.split() for ln in (RUN14 / name).read_text().splitlines() if ln[:1].isdigit()]
        return [(r[3], r[4]) for r in rows]
    assert ratios("speed-smol-auto-ratios.txt") == [("0.921", "0.826"), ("0.925", "0.909"), ("0.867", "0.868"), ("1.321", "0.821")]
    assert ratios("speed-smol-F0-ratios.txt") == [("0.978", "1.026"), ("0.995", "1.181"), ("0.895", "0.990"), ("1.392", "0.932")]


RUN15 = ROOT / "bench" / "gpu" / "2026-12-03-run15"


def test_run15_results_give_the_figures_quoted(tmp_path: Path) -> None:
    """RESULTS.md's run-15 table: compare over the committed samples gives the committed compare-*.txt byte for byte;
    the default answers run 13's F = 4 prompts with the same text; the counts, discordant pairs and perplexity quoted
    are the committed results'."""
    compare = _results_compare(tmp_path, (RUN13 / "temp.tgz", RUN15 / "temp.tgz", RUN15 / "temp-x12.tgz"))
    s42 = compare("ruler-temp-smol-passkey-dca-32768-s42.json", "ruler-temp-smol-passkey-dca-32768-s42-F4.json")
    assert s42 == (RUN15 / "compare-s42.txt").read_text()
    sm = "smollm2-135m-instruct-q4_1.gguf"
    assert f"{sm}\tpasskey\t32768\tdca[S4096 w1024 --dca-yarn-factor 4] vs dca[S4096 w1024]\tfound\t30\t0\t0\t1" in s42
    assert sample_answers(tmp_path / "ruler-temp-smol-passkey-dca-32768-s42.json") == \
        sample_answers(tmp_path / "ruler-temp-smol-passkey-dca-32768-s42-F4.json")

    x12 = "dca[S4096 w1024 --dca-yarn-factor 7.389]"
    table = {101: (49, 48, 52, 6, 2), 102: (51, 49, 57, 9, 1), 103: (46, 47, 55, 9, 1), 104: (51, 48, 57, 10, 1)}
    for seed, (inside, default, stronger, only_x12, only_default) in table.items():
        out = compare(f"ruler-temp-smol-passkey-*-s{seed}*.json")
        assert out == (RUN15 / f"compare-s{seed}.txt").read_text()
        assert (found(out, sm, "passkey", 8192, "plain"), found(out, sm, "passkey", 32768, "dca[S4096 w1024]"),
                found(out, sm, "passkey", 32768, x12)) == (inside, default, stronger)
        assert pair_counts(out, sm, "passkey", 32768, x12, "dca[S4096 w1024]") == (60, only_x12, only_default)
    assert [sum(v[i] for v in table.values()) for i in range(5)] == [197, 192, 221, 34, 5]
    assert ppl_rows(RUN15 / "temp-ppl.tsv") == {("smol-dca-F7.389", "32768"): "2.7590"}


RUN16 = ROOT / "bench" / "gpu" / "2026-12-03-run16"


def test_run16_results_give_the_figures_quoted(tmp_path: Path) -> None:
    """RESULTS.md's run-16 tables (the log2 rule): compare over the committed samples of runs 13, 15 and 16 gives the
    committed compare-*.txt byte for byte and the counts, pairs and perplexities quoted; the merged default (no flag)
    answers h101's explicit F = e prompts with the same text; the CPU's short-window perplexities are the logs'."""
    compare = _results_compare(tmp_path, (RUN13 / "temp.tgz", RUN15 / "temp.tgz", RUN15 / "temp-x12.tgz",
                                          *(RUN16 / f"temp-{q}.tgz" for q in "ghim")))
    gm = "gemma3-270m-q4_k_m.gguf"
    out = compare("ruler-temp-gemma-*-s42*.json")
    assert out == (RUN16 / "compare-gemma-s42.txt").read_text()

    def dca(f: str) -> str:
        return f"dca[S16384 w4096 --dca-yarn-factor {f}]"
    cells = {("passkey", 65536, "2"): 19, ("passkey", 65536, "2.71828"): 23, ("passkey", 131072, "4"): 20,
             ("passkey", 131072, "7.389"): 26, ("niah_single", 65536, "2"): 4, ("niah_single", 65536, "2.71828"): 3,
             ("niah_single", 131072, "4"): 5, ("niah_single", 131072, "7.389"): 4}
    assert {k: found(out, gm, k[0], k[1], dca(k[2])) for k in cells} == cells
    assert (found(out, gm, "passkey", 262144, "dca"), found(out, gm, "niah_single", 262144, "dca")) == (5, 0)
    assert pair_counts(out, gm, "passkey", 65536, dca("2.71828"), dca("2")) == (30, 4, 0)
    assert pair_counts(out, gm, "passkey", 131072, dca("7.389"), dca("4")) == (30, 6, 0)
    assert pair_counts(out, gm, "niah_single", 65536, dca("2.71828"), dca("2")) == (12, 0, 1)
    assert pair_counts(out, gm, "niah_single", 131072, dca("7.389"), dca("4")) == (12, 0, 1)

    sm = "smollm2-135m-instruct-q4_1.gguf"
    old, new = "dca[S4096 w1024 --dca-yarn-factor 2]", "dca[S4096 w1024 --dca-yarn-factor 2.71828]"
    table = {101: (49, 51, 53, 4, 2), 102: (51, 53, 55, 3, 1), 103: (46, 53, 55, 3, 1), 104: (51, 50, 56, 7, 1)}
    for seed, (inside, at_old, at_new, only_new, only_old) in table.items():
        out = compare(f"ruler-temp-smol-passkey-*-s{seed}*.json")
        assert out == (RUN16 / f"compare-s{seed}.txt").read_text()
        assert (found(out, sm, "passkey", 8192, "plain"), found(out, sm, "passkey", 16384, old),
                found(out, sm, "passkey", 16384, new)) == (inside, at_old, at_new)
        assert pair_counts(out, sm, "passkey", 16384, new, old) == (60, only_new, only_old)
    assert [sum(v[i] for v in table.values()) for i in range(5)] == [197, 207, 219, 17, 5]
    merged = sample_answers(tmp_path / "ruler-temp-smol-passkey-dca-16384-s101.json")
    assert len(merged) == 60 and merged == sample_answers(tmp_path / "ruler-temp-smol-passkey-dca-16384-s101-F2.71828.json")

    assert ppl_rows(RUN16 / "temp-ppl.tsv") == {("gemma-dca-F7.389", "131072"): "2.8442",
                                                ("gemma-dca-F2.71828", "65536"): "2.6520",
                                                ("smol-dca-F2.71828", "16384"): "2.7058"}
    final = {n: re.findall(r"Final estimate: PPL = ([0-9.]+)", (RUN16 / "cpu-short" / f"{n}.log").read_text())
             for n in ("off", "F32", "F148")}
    assert final == {"off": ["3.0875"], "F32": ["3.3719"], "F148": ["3.6370"]}


def test_temp_and_auto_ppl_run_each_model_with_its_arguments(tmp_path: Path) -> None:
    """step_temp_ppl / step_auto_ppl: each perplexity run gets its own model's common arguments and 4 threads, and the
    common arguments are the gemma ones again after a SmolLM2 run (llama-perplexity here is a script that logs its
    arguments)."""
    log = tmp_path / "calls"
    fake = tmp_path / "bin" / "llama-perplexity"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\necho "$*" >> {log}\n')
    fake.chmod(0o755)
    call = ('OUT="$1"; BIN="$2"; mkdir -p "$OUT/ppl"; ppl_text() { :; }; COMMON=(-m gemma.gguf -ngl 99); '
            'SMOL_COMMON=(-m smol.gguf -ngl 99); step_temp_ppl > /dev/null && step_auto_ppl > /dev/null && echo "${COMMON[*]}"')
    r = run_sh_functions(("ppl_one", "ppl_model", "step_temp_ppl", "step_auto_ppl"), call, str(tmp_path / "out"), str(fake.parent))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "-m gemma.gguf -ngl 99"
    calls = [ln.split(" -f ")[0] for ln in log.read_text().splitlines()]
    assert len(calls) == 10 + 5
    assert calls[0] == "-m smol.gguf -ngl 99 -t 4"
    assert calls[1] == "-m smol.gguf -ngl 99 -t 4 --dca on --dca-yarn-factor 0"
    assert calls[7] == "-m gemma.gguf -ngl 99 -t 4 --dca on --dca-yarn-factor 4"
    assert calls[10:] == ["-m smol.gguf -ngl 99 -t 4 --dca on"] * 2 + ["-m gemma.gguf -ngl 99 -t 4 --dca on"] * 2 \
        + ["-m smol.gguf -ngl 99 -t 4 --dca on --dca-yarn-factor 4"]
    names = [ln.split("\t")[:2] for ln in (tmp_path / "out" / "ppl.tsv").read_text().splitlines()]
    assert names[0] == ["smol-plain", "8192"] and names[-1] == ["smol-dca-F4", "16384"]
    log.unlink()
    r = run_sh_functions(("ppl_one", "ppl_model", "step_x12_ppl", "step_g12_ppl"),
                         call.replace("step_temp_ppl", "step_x12_ppl").replace("step_auto_ppl", "step_g12_ppl"),
                         str(tmp_path / "out2"), str(fake.parent))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "-m gemma.gguf -ngl 99"
    assert [ln.split(" -f ")[0] for ln in log.read_text().splitlines()] == [
        "-m smol.gguf -ngl 99 -t 4 --dca on --dca-yarn-factor 7.389",
        "-m gemma.gguf -ngl 99 -t 4 --dca on --dca-yarn-factor 7.389",
        "-m gemma.gguf -ngl 99 -t 4 --dca on --dca-yarn-factor 2.71828",
        "-m smol.gguf -ngl 99 -t 4 --dca on --dca-yarn-factor 2.71828"]
    assert [ln.split("\t")[1] for ln in (tmp_path / "out2" / "ppl.tsv").read_text().splitlines()] == \
        ["32768", "131072", "65536", "16384"]


def test_wait_temp_waits_for_the_perplexity_queue_unless_none(tmp_path: Path) -> None:
    """step_wait_temp waits for every temperature queue and for the perplexity one, which TEMP_PPL=none leaves out (as
    step_temp_bg then starts none)."""
    call = ('OUT="$1"; HOME="$1"; wait_queues() { echo "$*"; }; TEMP_QUEUES="a7 d42"; '
            'TEMP_PPL=auto_ppl step_wait_temp; TEMP_PPL=none step_wait_temp')
    r = run_sh_functions(("step_wait_temp",), call, str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["temp-ppl temp-a7 temp-d42", "temp-a7 temp-d42"]


def test_temp_queues_send_each_factor_and_seed(tmp_path: Path) -> None:
    """run 13's queues: one ruler_run.py run per cell with the seed and the factor as options, in names that never
    collide (the contexts are in them), 2 threads a server; an unknown queue is refused."""
    log = tmp_path / "calls"
    call = ('CALLS=$1; python3() { printf "%s\\n" "$*" >> "$CALLS"; }; MODEL=/m/gemma.gguf SMOL=/m/smol.gguf BIN=/b OUT=/o; '
            'GPU_ARGS=\'"threads": 8\'; for q in $TEMP_QUEUES; do QUEUE=$q step_temp_queue || exit 1; done')
    lines_sh = [ln for ln in RUN_SH.read_text().splitlines() if ln.startswith("TEMP_QUEUES=")]
    r = run_sh_functions(("temp_cells", "cells_queue", "step_temp_queue"), "\n".join(lines_sh) + "\n" + call, str(log))
    assert r.returncode == 0, r.stderr
    lines = log.read_text().splitlines()
    names = [ln.split("--name ")[1].split()[0] for ln in lines]
    assert len(names) == 14 and len(set(names)) == 14
    opts = {n: json.loads(ln.split("--options ", 1)[1]) for n, ln in zip(names, lines, strict=True)}
    assert opts["temp-smol-passkey-dca-32768-s7-F4"] == {
        "tasks": ["passkey"], "methods": ["dca"], "contexts": [32768], "samples": 60, "seed": 7,
        "dca_args": ["--dca-yarn-factor", "4"], "threads": 2}
    assert opts["temp-smol-passkey-dca-16384-s42-F4"]["contexts"] == [16384]
    assert opts["temp-gemma-passkey-dca-131072-s42-F4"]["contexts"] == [131072]
    assert all(o["threads"] == 2 and "chunk" not in o for o in opts.values())

    def queue_runs(queues: str) -> dict[str, tuple[str, dict]]:
        """Each ruler_run.py call the queues make: its name -> (model, options)."""
        log = tmp_path / queues.replace(" ", "-")
        r = run_sh_functions(("temp_cells", "cells_queue", "step_temp_queue"), call.replace("$TEMP_QUEUES", queues), str(log))
        assert r.returncode == 0, r.stderr
        return {ln.split("--name ")[1].split()[0]: (ln.split("--model ")[1].split()[0], json.loads(ln.split("--options ", 1)[1]))
                for ln in log.read_text().splitlines()}
    auto = {name: o for name, (_, o) in queue_runs("a7 a42 ag").items()}
    assert list(auto) == ["temp-smol-passkey-dca-32768-s7", "temp-smol-passkey-dca-32768-s42", "temp-smol-passkey-dca-16384-s42",
                          "temp-gemma-passkey-dca-65536-131072-s42", "temp-gemma-niah_single-dca-65536-131072-s42"]
    assert all("dca_args" not in o for o in auto.values())   # the default: no --dca-yarn-factor
    assert auto["temp-gemma-passkey-dca-65536-131072-s42"]["contexts"] == [65536, 131072]
    assert list(queue_runs("d42")) == ["temp-smol-passkey-dca-32768-s42"]
    e = {name: o for name, (_, o) in queue_runs("e101 e7").items()}
    assert list(e) == ["temp-smol-passkey-plain-8192-s101", "temp-smol-passkey-dca-32768-s101",
                       "temp-smol-passkey-plain-8192-s7", "temp-smol-passkey-dca-32768-s7"]
    assert e["temp-smol-passkey-plain-8192-s101"] == {
        "tasks": ["passkey"], "methods": ["plain"], "contexts": [8192], "samples": 60, "seed": 101, "threads": 2}
    assert e["temp-smol-passkey-dca-32768-s101"]["methods"] == ["dca"] and "dca_args" not in e["temp-smol-passkey-dca-32768-s101"]
    fg = queue_runs("f101 g11 g12")
    assert list(fg) == ["temp-smol-passkey-dca-32768-s101-F7.389", "temp-gemma-passkey-dca-65536-s42-F2.71828",
                        "temp-gemma-niah_single-dca-65536-s42-F2.71828", "temp-gemma-passkey-dca-131072-s42-F7.389",
                        "temp-gemma-niah_single-dca-131072-s42-F7.389"]
    assert fg["temp-smol-passkey-dca-32768-s101-F7.389"][0] == "/m/smol.gguf"
    assert fg["temp-gemma-passkey-dca-131072-s42-F7.389"] == ("/m/gemma.gguf", {
        "tasks": ["passkey"], "methods": ["dca"], "contexts": [131072], "samples": 30, "seed": 42,
        "dca_args": ["--dca-yarn-factor", "7.389"], "threads": 2})
    him = queue_runs("h101 i101 m42")
    assert list(him) == ["temp-smol-passkey-dca-16384-s101-F2", "temp-smol-passkey-dca-16384-s101-F2.71828",
                         "temp-smol-passkey-dca-16384-s101", "temp-gemma-passkey-dca-262144-s42",
                         "temp-gemma-niah_single-dca-262144-s42"]
    assert him["temp-smol-passkey-dca-16384-s101-F2.71828"][1]["dca_args"] == ["--dca-yarn-factor", "2.71828"]
    assert "dca_args" not in him["temp-smol-passkey-dca-16384-s101"][1]
    assert him["temp-gemma-niah_single-dca-262144-s42"] == ("/m/gemma.gguf", {
        "tasks": ["niah_single"], "methods": ["dca"], "contexts": [262144], "samples": 6, "seed": 42, "threads": 2})
    r = run_sh_functions(("temp_cells",), 'temp_cells zz', )
    assert r.returncode == 1 and "no queue zz" in r.stderr
    for bad in ("e1x", "f1-", "h7a", "i1-"):
        r = run_sh_functions(("temp_cells",), f'temp_cells {bad}', )
        assert r.returncode == 1 and f"{bad}: {bad[0]} and a seed" in r.stderr


def test_temp_bg_needs_each_model_only_for_its_queues(tmp_path: Path) -> None:
    """step_temp_bg starts SmolLM2-only queues without gemma-3-270m and gemma-only queues without SmolLM2, refuses,
    naming each file once, queues with a cell of a model that is not there, and starts none when one queue is unknown."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "llama-server").write_text("#!/bin/sh\n")
    (bin_dir / "llama-server").chmod(0o755)
    (tmp_path / "smol.gguf").write_text("")
    call = ('HOME="$1"; BIN="$1/bin"; SMOL="$1/smol.gguf"; MODEL="$1/gemma.gguf"; TEMP_PPL=none; '
            'detach() { echo "detach $1"; }; TEMP_QUEUES="$2" step_temp_bg')
    r = run_sh_functions(("temp_cells", "step_temp_bg"), call, str(tmp_path), "f101 e7")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[:2] == ["detach temp-f101", "detach temp-e7"]
    r = run_sh_functions(("temp_cells", "step_temp_bg"), call, str(tmp_path), "f101 g11 g12")
    assert r.returncode == 1 and "detach" not in r.stdout
    assert f"needs llama-server and {tmp_path}/smol.gguf {tmp_path}/gemma.gguf\n" in r.stdout
    r = run_sh_functions(("temp_cells", "step_temp_bg"), call, str(tmp_path), "t2x")   # gemma after two SmolLM2 cells
    assert r.returncode == 1 and f"{tmp_path}/gemma.gguf\n" in r.stdout
    r = run_sh_functions(("temp_cells", "step_temp_bg"), call, str(tmp_path), "f101 zz")
    assert r.returncode == 1 and "detach" not in r.stdout and "no queue zz" in r.stderr
    (tmp_path / "smol.gguf").unlink()
    (tmp_path / "gemma.gguf").write_text("")
    r = run_sh_functions(("temp_cells", "step_temp_bg"), call, str(tmp_path), "g11 m42")   # gemma only: no SmolLM2 needed
    assert r.returncode == 0, r.stdout
    assert r.stdout.splitlines()[:2] == ["detach temp-g11", "detach temp-m42"]
    r = run_sh_functions(("temp_cells", "step_temp_bg"), call, str(tmp_path), "m42 h101")
    assert r.returncode == 1 and "detach" not in r.stdout and f"needs llama-server and {tmp_path}/smol.gguf {tmp_path}/gemma.gguf\n" in r.stdout


def test_ruler_run_replay_sends_only_the_recorded_prompts(tmp_path: Path) -> None:
    """replay regenerates each chosen prompt and refuses one whose sha256 is not the recorded one (another seed or
    sample count), an index the result does not hold, and a server that is not there; with the recorded seed the
    prompts pass and the server is started (here one that is not a server: a clean error, not a refusal)."""
    import tarfile

    with tarfile.open(RUN13 / "temp.tgz") as t:
        m = t.getmember("ruler-temp-smol-passkey-dca-32768-s7-F0.json")
        res = tmp_path / "r.json"
        res.write_bytes(t.extractfile(m).read())  # type: ignore[union-attr]
    from dcaforge.gatetools import tiny

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
    from dcaforge.gate import ruler_server_args

    old = json.loads(res.read_text())["metrics"]
    assert old["trained"] == 8192 and old["chunk"] == 4096 and old["local"] == 1024
    assert argv.split(" --host ")[0] == "$ " + " ".join([str(fake), *ruler_server_args(str(model), "dca", 32768, 8192, "llama",
                                                                                      4096, 1024)])
    assert " --override-kv llama.context_length=int:32768 --host " in argv and " -t " not in argv
