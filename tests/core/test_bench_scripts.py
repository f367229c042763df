"""The GPU bench scripts run where a mistake costs device minutes: check their syntax and the
setting names that bench/gpu/RESULTS.md quotes, here, with the real bash."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

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
