"""docs/reliability.md (Reliability) states the hostile suite's size as collected (see count.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import count  # noqa: E402


def test_readme_states_how_many_cases_there_are() -> None:
    n = count.count()
    assert n >= 150
    assert count.stated() == n, f"docs/reliability.md says {count.stated()}, pytest collects {n}: python tests/hostile/count.py --write"
