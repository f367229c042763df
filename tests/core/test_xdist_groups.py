"""The suite's scheduling, tests/conftest.py: under pytest-xdist every test of a group runs in one worker, in
order; the shared clean room's tests must never run on two workers at once (they would collide on its lock, as
they did with pytest 9.2 when the groups were marks). Shown with that conftest in a small real project, run by a
real pytest with two workers."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import USER_GIT, sh

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
try:
    from conftest import xdist_group  # noqa: E402  (tests/conftest.py, the suite's own)
finally:
    sys.path.pop(0)


@pytest.mark.parametrize(("nodeid", "group"), [
    ("tests/e2e/test_e2e_dca.py::test_dca_matches_double_reference", "e2e-room"),
    ("tests/e2e/test_models_dca.py::test_d_quantized_cache[f16-f16]", "e2e-room"),
    ("tests/e2e/test_e2e_drift.py::test_anchors_fit_the_default_tree", "e2e-room"),
    ("tests/e2e/test_e2e_drift.py::test_old_tree_render_compiles", "e2e-drift"),
    ("tests/e2e/test_llamafile_build.py::test_old_pin_stops_before_rendering_and_classifies_each_misfit", "llamafile"),
    ("tests/e2e/test_drift_canary.py::test_canary_counts_drifted_and_absent_on_an_old_tree", None),
    ("tests/hostile/test_interrupts.py::test_x[SIGINT-3]", "tests/hostile/test_interrupts.py"),
    ("tests/core/test_gate.py::test_method_flags", None),
])
def test_group_of_a_test_id(nodeid: str, group: str | None) -> None:
    assert xdist_group(nodeid) == group


def test_a_groups_tests_run_in_one_worker_in_order(tmp_path: Path) -> None:
    pytest.importorskip("xdist")
    repo = tmp_path / "project"
    (repo / "tests" / "e2e").mkdir(parents=True)
    (repo / "tests" / "core").mkdir()
    shutil.copy(ROOT / "tests" / "conftest.py", repo / "tests" / "conftest.py")
    shutil.copy(ROOT / "pyproject.toml", repo / "pyproject.toml")   # its addopts: -n 2 --dist loadgroup
    (repo / ".gitignore").write_text("__pycache__/\nlog/\n")
    (repo / "log").mkdir()
    record = ("import os, time\nfrom pathlib import Path\n\n"
              "def note(name):\n"
              "    time.sleep(0.05)\n"
              "    with open(Path(__file__).resolve().parents[2] / 'log' / 'order.txt', 'a') as f:\n"
              "        f.write(os.environ.get('PYTEST_XDIST_WORKER', '-') + ' ' + name + '\\n')\n\n")
    for mod in ("test_e2e_a.py", "test_e2e_b.py"):
        (repo / "tests" / "e2e" / mod).write_text(record + "".join(
            f"def test_{i}():\n    note('{mod}:{i}')\n\n\n" for i in range(6)))
    (repo / "tests" / "core" / "test_free.py").write_text(record + "".join(
        f"def test_{i}():\n    note('core:{i}')\n\n\n" for i in range(12)))
    sh([*USER_GIT, "init", "-q"], repo)
    sh([*USER_GIT, "add", "-A"], repo)
    sh([*USER_GIT, "commit", "-q", "-m", "init"], repo)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=repo,
                       capture_output=True, text=True, check=False)
    assert r.returncode == 0 and "24 passed" in r.stdout, r.stdout + r.stderr
    rows = [ln.split() for ln in (repo / "log" / "order.txt").read_text().splitlines()]
    room = [(w, t) for w, t in rows if t.startswith("test_e2e_")]
    assert len(room) == 12 and len({w for w, _ in room}) == 1, rows   # the room's tests: one worker
    assert [t for _, t in room] == [f"test_e2e_{m}.py:{i}" for m in "ab" for i in range(6)]   # in collection order
    assert {w for w, _ in rows} == {"gw0", "gw1"}, rows   # and the other worker had the free tests
