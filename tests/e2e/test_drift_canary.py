"""The drift canary, `dcaforge drift`, on llama-cpp-python sdists: the sdist matrix of the templates.

Fit: 0.3.36 (the default), 0.3.22 and 0.3.30. 0.3.21 and 0.3.22 are the PyPI sdists nearest to b8953 (7b8443ac),
the llama.cpp llamafile 0.10.1 pins (0.3.21 is b8925-4..b8935-7, 2026-04-25/26, 18 builds before it; 0.3.22 is
b8994-5, 2026-05-01, after it): the oldest llama.cpp a llamafile 0.10.x release pins is fitted by the same templates
as today's. 0.3.21's fit is test_e2e_drift's `render --check`, which also compiles that render (not run twice).
Does not fit: 0.3.16 (older than any 0.10.x pin, the old pin of test_llamafile_build), and the counts say how. Each
is `render --check`'s anchor check only: no build (tests/e2e/RESULTS-drift.md has the builds)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOES_NOT_FIT = 3  # the exit code of "does not fit"


def drift(*args: str) -> subprocess.CompletedProcess:
    exe = [sys.executable, "-c", "from dcaforge.cli import main; main()"]
    return subprocess.run([*exe, "drift", *args], cwd=REPO, text=True, capture_output=True, check=False, timeout=1800,
                          env={**os.environ, "COLUMNS": "250"})


def counts(out: str) -> tuple[int, int, int, int, int]:
    m = re.search(r"(?m)^fit (\d+), drifted (\d+), absent (\d+) \(skipped (\d+)\) of (\d+) edits on ", out)
    assert m, out[-3000:]
    return tuple(int(x) for x in m.groups())  # type: ignore[return-value]


@pytest.mark.parametrize("version", ["0.3.36", "0.3.22", "0.3.30"])
def test_canary_counts_a_tree_the_templates_fit(version: str) -> None:
    p = drift("--sdist", version)
    assert p.returncode == 0, p.stdout + p.stderr
    fit, drifted, absent, skipped, total = counts(p.stdout)
    assert (drifted, absent) == (0, 0) and fit + skipped == total and fit >= 100
    assert f"llama-cpp-python=={version} [vendor/llama.cpp]" in p.stdout
    assert "misfits:" not in p.stdout


def test_canary_counts_drifted_and_absent_on_an_old_tree() -> None:
    p = drift("--sdist", "0.3.16")
    assert p.returncode == DOES_NOT_FIT, p.stdout + p.stderr
    fit, drifted, absent, skipped, total = counts(p.stdout)
    assert drifted >= 3 and absent >= 5 and fit + skipped + drifted + absent == total
    table = p.stdout[p.stdout.index("misfits:"):]
    assert f"misfits: {drifted} drifted, {absent} absent" in table
    assert re.search(r"(?m)^\d+\s+include/llama\.h\s+absent\s+`ctx_other` in no file of this tree", table), table


def test_canary_needs_one_tree(tmp_path: Path) -> None:
    p = drift()
    assert p.returncode == 1 and "give exactly one of --tree DIR and --sdist VERSION" in p.stderr
    p = drift("--tree", str(tmp_path / "nowhere"))
    assert p.returncode == 1 and "not a folder" in p.stderr
