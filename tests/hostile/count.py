"""How many cases the hostile-input suite has, counted by pytest's own collection.

    python tests/hostile/count.py          # prints the number
    python tests/hostile/count.py --write  # and puts it into docs/reliability.md (Reliability)

``test_count.py`` fails when the number in docs/reliability.md is not the collected one.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "docs" / "reliability.md"
MARK = re.compile(r"<!-- hostile-count -->\*\*(\d+) cases\*\*<!-- /hostile-count -->")


def count() -> int:
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          "tests/hostile"], capture_output=True, text=True, cwd=REPO, check=True).stdout
    m = re.search(r"^(\d+) tests? collected", out, re.MULTILINE)
    if m is None:
        raise SystemExit(f"pytest collected nothing:\n{out}")
    return int(m.group(1))


def stated() -> int | None:
    m = MARK.search(README.read_text(encoding="utf-8"))
    return int(m.group(1)) if m else None


def main() -> None:
    n = count()
    print(n)
    if "--write" in sys.argv[1:]:
        text = README.read_text(encoding="utf-8")
        new, k = MARK.subn(f"<!-- hostile-count -->**{n} cases**<!-- /hostile-count -->", text)
        if k != 1:
            raise SystemExit("docs/reliability.md has no <!-- hostile-count --> mark")
        if new != text:
            README.write_text(new, encoding="utf-8")


if __name__ == "__main__":
    main()
