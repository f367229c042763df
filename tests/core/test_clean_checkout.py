"""The suite's own rule, tests/conftest.py: a test run that changes the checkout (a tracked file
rewritten, a file left that git does not ignore) fails, naming the file; results under build/ are
fine; what was already changed before the run is the developer's; ``--update-results`` may rewrite
the committed RESULTS.md files. Shown with that conftest in a small real git checkout, run by a
real pytest."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .helpers import USER_GIT, sh

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    repo = tmp_path / "checkout"
    (repo / "tests").mkdir(parents=True)
    shutil.copy(CONFTEST, repo / "tests" / "conftest.py")
    (repo / ".gitignore").write_text("build/\n__pycache__/\n")
    (repo / "data.txt").write_text("committed\n")
    (repo / "RESULTS.md").write_text("old numbers\n")
    sh([*USER_GIT, "init", "-q"], repo)
    sh([*USER_GIT, "add", "-A"], repo)
    sh([*USER_GIT, "commit", "-q", "-m", "init"], repo)
    return repo


def run(repo: Path, body: str, *args: str) -> subprocess.CompletedProcess[str]:
    (repo / "tests" / "test_it.py").write_text("from pathlib import Path\n\nREPO = Path(__file__).resolve().parents[1]\n\n\n"
                                             "def test_it():\n" + textwrap.indent(body, "    ") + "\n")
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_it.py", *args],
                          cwd=repo, capture_output=True, text=True, check=False)


def test_rewriting_a_tracked_file_fails_the_run(checkout: Path) -> None:
    r = run(checkout, '(REPO / "data.txt").write_text("rewritten by a test\\n")')
    assert r.returncode == 1, r.stdout
    assert "1 passed" in r.stdout and "checkout not clean" in r.stdout and "data.txt" in r.stdout, r.stdout


def test_leaving_a_file_git_does_not_ignore_fails_the_run(checkout: Path) -> None:
    r = run(checkout, '(REPO / "out.md").write_text("results\\n")')
    assert r.returncode == 1 and "out.md" in r.stdout, r.stdout


def test_results_under_build_are_fine(checkout: Path) -> None:
    r = run(checkout, '(REPO / "build" / "results").mkdir(parents=True)\n(REPO / "build" / "results" / "x.md").write_text("1\\n")')
    assert r.returncode == 0, r.stdout
    assert (checkout / "build" / "results" / "x.md").is_file()


def test_changes_made_before_the_run_are_the_developers(checkout: Path) -> None:
    (checkout / "data.txt").write_text("being edited\n")
    (checkout / "notes.md").write_text("mine\n")
    assert run(checkout, "assert True").returncode == 0
    r = run(checkout, '(REPO / "data.txt").write_text("and then rewritten by a test\\n")')
    assert r.returncode == 1 and "data.txt" in r.stdout, r.stdout


def test_update_results_may_rewrite_the_committed_results(checkout: Path) -> None:
    body = '(REPO / "RESULTS.md").write_text("new numbers\\n")'
    assert run(checkout, body).returncode == 1
    sh([*USER_GIT, "checkout", "--", "RESULTS.md"], checkout)
    r = run(checkout, body, "--update-results")
    assert r.returncode == 0, r.stdout
