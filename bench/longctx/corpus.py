"""Builds the two texts of the long-context protocol (bench/longctx/sets.yaml), which differ in domain:

- dev: C++ and C source of llama.cpp (``src/*.cpp`` but the feature's ``llama-dca*.cpp``, then ``ggml/src/*.c`` of
  the tree given, sorted by name: upstream's code at the sdist the default config pins),
- held-out: English prose, Python 3.11's own documentation: ``pydoc_data.topics`` (the language reference, as
  ``help()`` shows it) then every module docstring and class/function docstring of the standard library's
  pure-Python modules (``Lib/*.py`` and ``Lib/*/__init__.py``, sorted), each paragraph once.

    python bench/longctx/corpus.py --tree cleanroom/upstream --out build/longctx
        writes build/longctx/dev.txt and heldout.txt and prints their sha256, which sets.yaml pins: a text that
        differs (another llama.cpp, another Python) is refused by the runner.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import sys
import sysconfig
from pathlib import Path


def dev_text(tree: Path) -> str:
    # upstream's files only: the feature's own (src/llama-dca*.cpp) change with the templates
    files = [f for f in sorted((tree / "src").glob("*.cpp")) if not f.name.startswith("llama-dca")]
    files += sorted((tree / "ggml" / "src").glob("*.c"))
    if not files:
        raise SystemExit(f"{tree}: no src/*.cpp (give a llama.cpp tree with --tree)")
    return "\n\n".join(f.read_text(encoding="utf-8", errors="replace") for f in files)


def heldout_text() -> str:
    if sys.version_info[:2] != (3, 11):
        raise SystemExit(f"the held-out text is Python 3.11's documentation; this is {sys.version.split()[0]}")
    import pydoc_data.topics as topics

    parts = [topics.topics[k] for k in sorted(topics.topics)]
    lib = Path(sysconfig.get_paths()["stdlib"])
    seen: set[str] = set()
    mods = sorted(p for p in lib.glob("*.py")) + sorted(lib.glob("*/__init__.py"))
    for f in mods:
        try:
            tree = ast.parse(f.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 200 and doc not in seen:
                    seen.add(doc)
                    parts.append(doc)
    return "\n\n".join(parts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", required=True, help="a llama.cpp tree (the clean room)")
    ap.add_argument("--out", default="build/longctx")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, text in (("dev", dev_text(Path(a.tree))), ("heldout", heldout_text())):
        (out / f"{name}.txt").write_text(text, encoding="utf-8")
        print(f"{name}: {len(text)} chars, sha256 {hashlib.sha256(text.encode()).hexdigest()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
