"""The README's path on the real tree (issue 34): a fresh apply prints the baseline docs/dca.md quotes and 0
patches; `dcaforge build --dry-run` plans the default targets (what a user runs) without compiling; `dcaforge try`
serves a model past its trained context with DCA through the room's llama-server (built once, by serve_tree) and
answers a prompt longer than that context."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from e2e_helpers import REPO, Tree, dcaforge

DOC_BASELINE = re.search(r"<!-- baseline -->([0-9a-f]{12})<!-- /baseline -->",
                         (REPO / "docs" / "dca.md").read_text()).group(1)  # type: ignore[union-attr]


def test_apply_prints_the_baseline_the_docs_quote(cleanroom: Path) -> None:
    p = dcaforge("apply")
    assert p.returncode == 0, p.stderr
    assert re.search(r"(?m)^series:     0 patches", p.stdout), p.stdout
    baseline = re.search(r"(?m)^baseline:   ([0-9a-f]{40})", p.stdout).group(1)  # type: ignore[union-attr]
    assert baseline.startswith(DOC_BASELINE)
    tag = subprocess.run(["git", "-C", str(cleanroom), "rev-parse", "dcaforge/baseline"], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert tag == baseline


def test_dry_run_plans_the_programs_a_user_runs(cleanroom: Path) -> None:
    """The default targets (no --targets): configure only, into a scratch folder; nothing is compiled."""
    p = dcaforge("build", "--dry-run", "--trust", "--json")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    plan = json.loads(p.stdout)
    bin_dir = cleanroom / "build" / "bin"
    for name in ("llama-server", "llama-cli", "llama-completion", "llama-perplexity", "llama-passkey"):
        assert plan["files"][name] == str(bin_dir / name), plan["files"]
    assert plan["steps"] > 100 and plan["ok"] is True
    assert not (cleanroom / ".git" / "dcaforge" / "plan-cmake").exists()


def test_try_answers_past_the_trained_context_with_dca(serve_tree: Tree) -> None:
    model = REPO / "tests" / "models" / "longctx-qwen2.gguf"  # trained on 256 tokens
    p = dcaforge("try", str(model), "--json")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    res = json.loads(p.stdout)
    assert res["command"] == "try" and res["trained"] == 256 and res["ctx"] == 512
    assert 256 < res["prompt_tokens"] <= 512 - 16
    assert "--dca" in res["argv"] and res["argv"][res["argv"].index("--dca") + 1] == "on"
    assert res["server"] == str(serve_tree.bin("llama-server"))
    assert res["dca_log"] == ["Dual Chunk Attention: the slot context (512) extends past the training context of the "
                              "model (256)"]
    assert res["expected"] and res["found"] in (True, False)  # a 1.7M-parameter byte model: the machinery, not the score
    assert Path(res["log"]).is_file()
