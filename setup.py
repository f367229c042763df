"""The build's one addition to pyproject.toml: the built-in default ships inside the package.

``dcaforge`` without ``-c`` (and without a ./dcaforge.yaml) uses examples/upstream.yaml, which names this
repository's templates/dca and patches/. An editable install reads them from the checkout; a wheel (``pip install
.``) carries copies under ``dcaforge/builtin/`` in the same layout (examples/, templates/, patches/), so ``root: ..``
of the copied examples/upstream.yaml names that folder (dcaforge.config.BUILTIN_CONFIG).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
#: what the built-in default names, copied into dcaforge/builtin/ of a wheel (paths relative to the repository)
BUILTIN = ("examples/upstream.yaml", "templates/dca", "patches/0078-dca.patch")


class BuildPyWithDefault(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads the checkout itself
        dest = Path(self.build_lib) / "dcaforge" / "builtin"
        for rel in BUILTIN:
            src, out = HERE / rel, dest / rel
            if not src.exists():
                raise SystemExit(f"dcaforge's built-in default needs {rel} (missing from {HERE})")
            out.parent.mkdir(parents=True, exist_ok=True)
            if src.is_dir():
                shutil.rmtree(out, ignore_errors=True)
                shutil.copytree(src, out, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                shutil.copy2(src, out)


setup(cmdclass={"build_py": BuildPyWithDefault})
