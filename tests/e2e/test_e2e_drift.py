"""Upstream drift: the 0078-dca templates on an older llama.cpp, taken from an older PyPI sdist of
llama-cpp-python: 0.3.21 (llama.cpp b8935-7, 2026-04-26, the sdist nearest to b8953, the pin of llamafile 0.10.1, the
oldest llama.cpp a llamafile 0.10.x release pins) next to the default's 0.3.36 (0c1e57098). (Until the templates fitted
llamafile's pin this was 0.3.30, e3a74b299: DCAFORGE_E2E_DRIFT_VERSION=0.3.30 runs it there.)

CI proves that every anchor fits both trees (`dcaforge render --check`, some by a hand-written
alternative or condition) and that the old tree's render compiles: every C/C++ file the feature
touches or adds in src/, ggml/src/ggml-cpu/ and ggml/src/ggml.c, and tests/test-dca.cpp, as single
objects through `dcaforge build --targets` (no link; about 15 objects instead of the 220 steps of a
full build), and the CUDA objects that take the old tree's alternatives (the MMA kernel's) with the new op.
DCAFORGE_E2E_DRIFT_FULL=1 (the scheduled job's, and what RESULTS-drift.md records) adds the full proof: builds
llama, test-dca and test-backend-ops there and runs test-dca (549 cases against its double-precision reference) and
the LSE and LSE-merge ops' test-backend-ops on the CPU (the older tree's DCA is exact, not only compiled), and
compiles every CUDA object test_e2e_cuda_compile does (10-15 min more on 2 cores without ccache hits: left out of the
default suite, which keeps to its 15-minute budget).
Results: tests/e2e/RESULTS-drift.md.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from e2e_helpers import REPO, WORKSPACE, dcaforge, e2e_config, run

OLD = os.environ.get("DCAFORGE_E2E_DRIFT_VERSION", "0.3.21")
NAME = f"drift-{OLD}"
CONFIG = WORKSPACE / f"{NAME}.yaml"
ROOM = WORKSPACE / NAME


def old_dcaforge(command: str, *args: str) -> subprocess.CompletedProcess:
    """The real command line with the old tree's config."""
    exe = [sys.executable, "-c", "from dcaforge.cli import main; main()"]
    return run([*exe, command, "-c", str(CONFIG), *args], cwd=REPO)


def _summary(out: str) -> tuple[int, int, int, int]:
    m = re.search(r"(\d+) fit \((\d+) by an alternative\), (\d+) skipped, (\d+) do not fit", out)
    assert m, out[-3000:]
    return int(m.group(1)), int(m.group(2)), int(m.group(3)), int(m.group(4))


@pytest.fixture(scope="session")
def old_room() -> str:
    """The e2e config with llama-cpp-python==OLD's sdist as the source: a room of its own in the workspace (the
    tests that use it are a pytest-xdist group of their own, tests/conftest.py: they never touch the upstream
    room)."""
    data = e2e_config()
    data["name"] = NAME
    data["source"] = {"pypi": f"llama-cpp-python=={OLD}", "subdir": "vendor/llama.cpp"}
    data["gates"] = []
    WORKSPACE.mkdir(parents=True, exist_ok=True)
    CONFIG.write_text(yaml.safe_dump(data, sort_keys=False))
    p = old_dcaforge("apply", "--no-render", "--trust")  # --trust: pip may download (and prepare) OLD's sdist
    assert p.returncode == 0, f"dcaforge apply failed:\n{p.stdout}\n{p.stderr}"
    return str(ROOM)


def test_anchors_fit_the_default_tree(cleanroom):
    p = dcaforge("render", "--check")
    assert p.returncode == 0, p.stdout + p.stderr
    fit, _alt, _skipped, bad = _summary(p.stdout)
    assert bad == 0 and fit >= 100


def test_anchors_fit_the_old_tree_by_alternatives(old_room):
    p = old_dcaforge("render", "--check")
    assert p.returncode == 0, p.stdout + p.stderr
    fit, alt, skipped, bad = _summary(p.stdout)
    assert bad == 0 and fit >= 100
    assert alt >= 5 and skipped >= 3, p.stdout  # the old tree needs the hand-written alternatives
    # e.g. the op count of the old ggml (96 on b8953, 97 on 0.3.30; + the two LSE ops), and no n_kv_max setter there
    assert re.search(r"ggml/src/ggml\.c\s+replace\s+alt 1\s+1/1\s+ok", p.stdout), p.stdout
    assert "when: tree.contains('ggml/src/ggml.c', 'void ggml_flash_attn_ext_set_n_kv_max(')" in p.stdout


def _objects(room: str) -> list[str]:
    """The object targets (CMake's names) of the C/C++ files the render touched or added."""
    out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=room, text=True,
                         capture_output=True, check=True).stdout
    objs = []
    for line in out.splitlines():
        rel = line[3:]
        if not rel.endswith((".c", ".cpp")):
            continue
        if rel.startswith("src/"):
            objs.append(f"src/CMakeFiles/llama.dir/{rel[4:]}.o")
        elif rel.startswith("ggml/src/ggml-cpu/"):
            objs.append(f"ggml/src/CMakeFiles/ggml-cpu.dir/{rel[9:]}.o")
        elif rel == "ggml/src/ggml.c":
            objs.append("ggml/src/CMakeFiles/ggml-base.dir/ggml.c.o")
        elif rel == "tests/test-dca.cpp":
            objs.append("tests/CMakeFiles/test-dca.dir/test-dca.cpp.o")
    assert Path(room, "src/llama-dca.cpp").is_file()
    return sorted(objs)


def test_old_tree_render_compiles(old_room):
    p = old_dcaforge("render")
    assert p.returncode == 0, p.stdout + p.stderr
    objs = _objects(old_room)
    assert "src/CMakeFiles/llama.dir/llama-dca.cpp.o" in objs and len(objs) >= 12, objs
    p = old_dcaforge("build", "--targets", " ".join(objs))
    assert p.returncode == 0, f"the old tree's render does not compile:\n{p.stdout}\n{p.stderr[-4000:]}"


FULL = os.environ.get("DCAFORGE_E2E_DRIFT_FULL") == "1"


@pytest.mark.skipif(not FULL, reason="the full build of the old tree: DCAFORGE_E2E_DRIFT_FULL=1 (scheduled job)")
def test_old_tree_builds_and_passes_test_dca_and_lse(old_room):
    assert old_dcaforge("render").returncode == 0
    p = old_dcaforge("build", "--targets", "llama test-dca test-backend-ops")
    assert p.returncode == 0, p.stdout + p.stderr[-4000:]
    bin_dir = ROOM / "build" / "bin"
    for op in ("FLASH_ATTN_EXT_LSE", "FLASH_ATTN_EXT_LSE_MERGE"):
        log = WORKSPACE / "logs" / f"{NAME}-test-backend-ops-{op.lower()}.log"
        p = run([str(bin_dir / "test-backend-ops"), "-b", "CPU", "-o", op], log=log)
        assert p.returncode == 0, f"see {log}"
        m = re.search(r"(\d+)/(\d+) tests passed", p.stdout)
        assert m and m.group(1) == m.group(2) and int(m.group(2)) >= 20, p.stdout[-2000:]
    log = WORKSPACE / "logs" / f"{NAME}-test-dca.log"
    p = run([str(bin_dir / "test-dca")], log=log, timeout=1800)
    m = re.search(r"(\d+)/(\d+) cases passed", p.stdout)
    assert p.returncode == 0 and m and m.group(1) == m.group(2) and int(m.group(2)) >= 549, f"see {log}"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed (CI has it)")
def test_old_tree_cuda_sources_compile(old_room):
    """The CUDA alternatives (the MMA kernel's older tile call and warp combine) compile, with the new op, for sm_86
    and sm_90; with DCAFORGE_E2E_DRIFT_FULL=1 every object test_e2e_cuda_compile compiles."""
    from test_e2e_cuda_compile import ALL_TARGETS, OBJ, cuda_stubs

    targets = ALL_TARGETS if FULL else ["fattn-lse.cu.o", "template-instances/fattn-mma-f16-instance-ncols1_1-ncols2_8.cu.o"]
    cuda_stubs()
    assert old_dcaforge("render").returncode == 0
    p = old_dcaforge("build", "--cuda", "-j", "2", "--targets", " ".join(OBJ + t for t in targets))
    assert p.returncode == 0, f"dcaforge build --cuda failed:\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}"
    for t in targets:
        assert (ROOM / "build-cuda" / OBJ / t).stat().st_size > 0
