"""bench/gpu/perf.sh (DCA's all-layer speed on the GPU) and its ratio table: the script parses, reads the model run.sh
assembles, knows its variants, and the table computes DCA / plain from llama-batched-bench's own row format."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PERF_SH = ROOT / "bench" / "gpu" / "perf.sh"
RUN_SH = ROOT / "bench" / "gpu" / "run.sh"
TABLE = ROOT / "bench" / "gpu" / "perf_table.py"

# the row format of tools/batched-bench/batched-bench.cpp (LOG("|%6d | %6d | %4d | %6d | %8.3f | %8.2f | ..."))
ROW = "|%6d | %6d | %4d | %6d | %8.3f | %8.2f | %8.3f | %8.2f | %8.3f | %8.2f |\n"
HEADER = ("|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |\n"
          "|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|\n")


def bench_log(rows: list[tuple[int, int, float, float]]) -> str:
    """A batched-bench log: rows of (PP, B, prompt t/s, generation t/s), 128 generated tokens."""
    text = "main: n_kv_max = 65792, n_batch = 2048, n_ubatch = 512, flash_attn = 1\n\n" + HEADER
    for pp, b, s_pp, s_tg in rows:
        t_pp, t_tg = b * pp / s_pp, b * 128 / s_tg
        text += ROW % (pp, 128, b, b * (pp + 128), t_pp, s_pp, t_tg, s_tg, t_pp + t_tg, b * (pp + 128) / (t_pp + t_tg))
    return text + "\nllama_perf_context_print:        load time =     123.45 ms\n"


def test_perf_sh_parses() -> None:
    r = subprocess.run(["bash", "-n", str(PERF_SH)], check=False, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_table_ratios(tmp_path: Path) -> None:
    # two rounds; plain 1000/500 then 1200/600 t/s, DCA 900/450 then 1200/540: ratio of sums (2100/2200, 990/1100)
    (tmp_path / "speed-1seq-plain-1.log").write_text(bench_log([(32768, 1, 1000.0, 500.0), (65536, 1, 800.0, 400.0)]))
    (tmp_path / "speed-1seq-plain-2.log").write_text(bench_log([(32768, 1, 1200.0, 600.0), (65536, 1, 800.0, 400.0)]))
    (tmp_path / "speed-1seq-dca-1.log").write_text(bench_log([(32768, 1, 900.0, 450.0), (65536, 1, 400.0, 100.0)]))
    (tmp_path / "speed-1seq-dca-2.log").write_text(bench_log([(32768, 1, 1200.0, 540.0), (65536, 1, 400.0, 300.0)]))
    (tmp_path / "speed-4seq-kvu-dca-ranges-1.log").write_text(bench_log([(15360, 4, 100.0, 10.0)]))
    (tmp_path / "speed-4seq-kvu-plain-1.log").write_text(bench_log([(15360, 4, 200.0, 40.0)]))
    (tmp_path / "speed-1seq-dca-3.log").write_text("llama-batched-bench: error: failed to load model\n")  # no rows
    (tmp_path / "notes.txt").write_text("not a log\n")

    r = subprocess.run([sys.executable, str(TABLE), str(tmp_path)], check=False, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = {tuple(ln.split()[:4]): ln.split() for ln in r.stdout.splitlines()[1:]}

    dca32 = lines[("1seq", "32768", "1", "dca")]
    assert dca32[4:8] == ["1050.0", "495.0", f"{2100 / 2200:.3f}", f"{990 / 1100:.3f}"]
    assert dca32[8:] == ["0.90", "1.00", "|", "0.90", "0.90"]
    dca64 = lines[("1seq", "65536", "1", "dca")]
    assert dca64[6:8] == ["0.500", "0.500"]
    plain = lines[("1seq", "32768", "1", "plain")]
    assert plain[6:8] == ["1.000", "1.000"]
    # the setup name may hold a dash; the unified-KV rows compare with their own plain
    assert lines[("4seq-kvu", "15360", "4", "dca-ranges")][6:8] == ["0.500", "0.250"]


def test_table_without_logs(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, str(TABLE), str(tmp_path)], check=False, capture_output=True, text=True)
    assert r.returncode == 1
    assert "no speed-*.log" in r.stderr


def _assigned(script: Path, name: str) -> str:
    m = re.search(rf"^{name}=(\S+)", script.read_text(), re.M)
    assert m, f"{script.name} assigns no {name}"
    return m.group(1)


def test_model_is_run_sh_smol() -> None:
    # one packing (pack.sh's smol.NN pieces, joined by run.sh's model step) serves both scripts
    assert _assigned(PERF_SH, "MODEL") == _assigned(RUN_SH, "SMOL") == "~/model/smollm2-135m-instruct-q4_1.gguf"
    assert "bench/gpu/run.sh model" in PERF_SH.read_text()


@pytest.mark.parametrize("variant", ["dca7", "dca-x", "dca0", "dca1"])
def test_unknown_variant(variant: str, tmp_path: Path) -> None:
    script = f'source <(sed -n "/^bench_one()/,/^}}/p" "{PERF_SH}"); OUT={tmp_path} bench_one 1seq {variant} 1'
    r = subprocess.run(["bash", "-c", script], check=False, capture_output=True, text=True)
    assert "unknown variant" in r.stdout


def test_default_variants_are_known() -> None:
    # every variant the speed steps run by default is one bench_one knows (and the switch it sets is DCA's own)
    text = PERF_SH.read_text()
    known = set(re.findall(r"^ +([a-z-]+)\)", text[text.index("bench_one()"):], re.M))
    for var in ("VARIANTS1", "VARIANTS4"):
        m = re.search(rf"\${{{var}:-([^}}]+)}}", text)
        assert m and set(m.group(1).split()) <= known, (var, known)
    assert "LLAMA_DCA_MODE=ranges" in text and "LLAMA_DCA_FUSED" not in text
