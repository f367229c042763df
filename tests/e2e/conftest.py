"""Session fixtures of the end-to-end tests (see e2e_helpers for the how)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from e2e_helpers import WORKSPACE, GateRun, Tree, _write_config, dcaforge


@pytest.fixture(scope="session")
def cleanroom() -> Path:
    """The clean room with the shipped series applied and the feature rendered."""
    for tool in ("cmake", "ninja", "git"):
        assert shutil.which(tool), f"{tool} is not installed: .ci/run installs it (apt-get install {tool})"
    _write_config()
    p = dcaforge("apply")
    assert p.returncode == 0, f"dcaforge apply failed:\n{p.stdout}\n{p.stderr}"
    room = WORKSPACE / "upstream"
    assert (room / "src" / "llama-dca.cpp").exists()
    return room


@pytest.fixture(scope="session")
def dca_tree(cleanroom: Path) -> Tree:
    p = dcaforge("build", "--targets", "llama test-backend-ops test-dca llama-perplexity llama-passkey")
    assert p.returncode == 0, f"dcaforge build failed:\n{p.stdout}\n{p.stderr[-4000:]}"
    return Tree(cleanroom, cleanroom / "build")


@pytest.fixture(scope="session")
def base_tree(cleanroom: Path) -> Tree:
    """The baseline (series applied, no feature): `dcaforge build --baseline` builds it in the git
    worktree <workspace>/upstream-baseline of the baseline tag. Only the library: what uses the baseline
    (the gates' off-identity, test_models_dca) links dca_logits against it; the tools run from the feature's build."""
    p = dcaforge("build", "--baseline", "--targets", "llama")
    assert p.returncode == 0, f"dcaforge build --baseline failed:\n{p.stdout}\n{p.stderr[-4000:]}"
    base = WORKSPACE / "upstream-baseline"
    return Tree(base, base / "build")


@pytest.fixture(scope="session")
def e2e_env(dca_tree: Tree, base_tree: Tree):
    """Point the model-level tests (tests/test_models_dca.py) at the two builds."""
    os.environ["DCAFORGE_LLAMA_TREE"] = str(dca_tree.src)
    os.environ["DCAFORGE_LLAMA_BUILD"] = str(dca_tree.build)
    os.environ["DCAFORGE_BASE_TREE"] = str(base_tree.src)
    os.environ["DCAFORGE_BASE_BUILD"] = str(base_tree.build)
    return dca_tree, base_tree


#: what the serving tests need from the clean room's build (tests/e2e/test_e2e_serve.py, test_e2e_rpc.py;
#: `dcaforge gate` tasks that drive llama-server can build the same list)
SERVE_TARGETS = "llama llama-server ggml-rpc-server test-backend-ops"


@pytest.fixture(scope="session")
def serve_tree(cleanroom: Path) -> Tree:
    """The patched build with `llama-server` and `ggml-rpc-server` (LLAMA_BUILD_SERVER=ON with the web UI left
    out, GGML_RPC=ON: e2e_helpers.cmake_flags), built once per session with ccache, incrementally."""
    p = dcaforge("build", "--targets", SERVE_TARGETS)
    assert p.returncode == 0, f"dcaforge build failed:\n{p.stdout}\n{p.stderr[-4000:]}"
    tree = Tree(cleanroom, cleanroom / "build")
    for exe in ("llama-server", "ggml-rpc-server"):
        assert tree.bin(exe).exists(), f"{tree.bin(exe)} was not built"
    return tree


@pytest.fixture(scope="session")
def gate_run(e2e_env, tmp_path_factory: pytest.TempPathFactory) -> GateRun:
    """`dcaforge gate` with the e2e config's gates (off-identity, noop-below-chunk, extension, ruler,
    extension-smoke), run once: test_e2e_build_gate checks the whole run, test_e2e_ruler the ruler gate's
    rows, samples, figure and server logs (llama-server is built by the gate on first use)."""
    p = dcaforge("gate")
    assert p.returncode == 0, p.stdout + p.stderr[-4000:]
    out = WORKSPACE / "upstream-gates"
    keep = tmp_path_factory.mktemp("gates")
    for name in ("results.json", "gates.png"):
        shutil.copy2(out / name, keep / name)
    shutil.copytree(out / "logs", keep / "logs")
    return GateRun(p, json.loads((keep / "results.json").read_text()), keep)
