"""Session fixtures of the end-to-end tests (see e2e_helpers for the how)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from e2e_helpers import CONFIG, WORKSPACE, Tree, _write_config, cmake_build, dcaforge, run

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
    tree = Tree(cleanroom, cleanroom / "build")
    cmake_build(tree.src, tree.build, ["llama", "test-backend-ops", "test-dca", "llama-perplexity"], "dca")
    return tree


@pytest.fixture(scope="session")
def base_tree(cleanroom: Path) -> Tree:
    """The baseline (series applied, no feature) as a git worktree of the baseline tag."""
    base = WORKSPACE / "baseline"
    rev = run(["git", "-C", str(cleanroom), "rev-parse", "dcaforge/baseline"]).stdout.strip()
    assert rev, "the clean room has no dcaforge/baseline tag"
    if base.exists() and run(["git", "-C", str(base), "rev-parse", "HEAD"]).stdout.strip() != rev:
        run(["git", "-C", str(cleanroom), "worktree", "remove", "--force", str(base)])
        shutil.rmtree(base, ignore_errors=True)
    if not base.exists():
        run(["git", "-C", str(cleanroom), "worktree", "prune"])
        p = run(["git", "-C", str(cleanroom), "worktree", "add", "--detach", str(base), rev])
        assert p.returncode == 0, p.stderr
    tree = Tree(base, base / "build")
    cmake_build(tree.src, tree.build, ["llama"], "base")
    return tree


@pytest.fixture(scope="session")
def e2e_env(dca_tree: Tree, base_tree: Tree):
    """Point the model-level tests (tests/test_models_dca.py) at the two builds."""
    os.environ["DCAFORGE_LLAMA_TREE"] = str(dca_tree.src)
    os.environ["DCAFORGE_LLAMA_BUILD"] = str(dca_tree.build)
    os.environ["DCAFORGE_BASE_TREE"] = str(base_tree.src)
    os.environ["DCAFORGE_BASE_BUILD"] = str(base_tree.build)
    return dca_tree, base_tree
