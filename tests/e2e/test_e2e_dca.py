"""The shipped feature end to end on the real llama.cpp tree: the committed patch is fresh and
round-trips, the patched tree builds with cmake, the LSE op and the LSE merge op pass test-backend-ops on the CPU,
and DCA matches a double-precision reference of dca.md (tests/test-dca.cpp in the patch)."""

from __future__ import annotations

import re

import pytest
from e2e_helpers import REPO, WORKSPACE, dcaforge, run

PATCH = REPO / "patches" / "0078-dca.patch"


def test_committed_patch_is_fresh_and_round_trips(cleanroom):
    """CI's stale-patch check: templates rendered afresh give the committed patch byte for byte."""
    p = dcaforge("verify", str(PATCH), "--fresh-render")
    assert p.returncode == 0, p.stdout + p.stderr


@pytest.mark.parametrize("op", ["FLASH_ATTN_EXT_LSE", "FLASH_ATTN_EXT_LSE_MERGE"])
def test_backend_ops_lse_cpu(dca_tree, op):
    log = WORKSPACE / "logs" / f"test-backend-ops-{op.lower()}.log"
    p = run([str(dca_tree.bin("test-backend-ops")), "-b", "CPU", "-o", op], log=log)
    assert p.returncode == 0, f"see {log}\n{p.stdout[-3000:]}"
    m = re.search(r"(\d+)/(\d+) tests passed", p.stdout)
    assert m and m.group(1) == m.group(2) and int(m.group(2)) >= 20, p.stdout[-2000:]


def test_dca_matches_double_reference(dca_tree):
    log = WORKSPACE / "logs" / "test-dca.log"
    p = run([str(dca_tree.bin("test-dca"))], log=log, timeout=1800)
    assert p.returncode == 0, f"see {log}\n{p.stdout[-4000:]}{p.stderr[-2000:]}"
    m = re.search(r"(\d+)/(\d+) cases passed", p.stdout)
    assert m and m.group(1) == m.group(2) and int(m.group(2)) >= 549, p.stdout[-2000:]
