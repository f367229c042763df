"""The README's first screen and the docs it leads to: every relative link in README.md and docs/*.md names a file
of this repository, the README opens with what a machine needs and then the two commands, and it stays one screen
of prose with the rest in docs/."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_name_files_that_exist(page: Path) -> None:
    text = page.read_text()
    missing = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # a URL, or an anchor of the page itself
        path = (page.parent / target.split("#", 1)[0]).resolve()
        if not path.exists():
            missing.append(target)
    assert not missing, f"{page.relative_to(REPO)} links to files that do not exist: {missing}"


def test_readme_opens_with_prerequisites_then_the_commands() -> None:
    text = (REPO / "README.md").read_text()
    heads = re.findall(r"(?m)^## (.+)$", text)
    assert heads[:4] == ["Before you start", "The commands", "What just happened", "Use the result"], heads
    block = text[text.index("## The commands"):text.index("## What just happened")]
    assert "python3 -m venv .venv && . .venv/bin/activate" in block and "apt-get install python3-venv" in block
    assert "pip install -e . && dcaforge apply && dcaforge capture && dcaforge verify --fresh-render" in block
    assert "pip install -e '.[test]' && pytest -q" in block
    assert len(text.splitlines()) <= 120
    for doc in ("workflow", "config", "llamafile", "dca", "reliability", "development"):
        assert f"docs/{doc}.md" in text, doc
