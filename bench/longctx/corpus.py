"""Builds the two texts of the long-context protocol (bench/longctx/sets.yaml), which differ in domain:

- dev: C++ and C source of llama.cpp (``src/*.cpp`` but the feature's ``llama-dca*.cpp``, then ``ggml/src/*.c``,
  sorted by name) as upstream has them at the sdist the default config pins: of a clean room, its baseline
  (the ``dcaforge/baseline`` tag, before the feature's hooks, which change with the templates),
- devfar (the 30x dev cell's text): llama.cpp's own C, C++ and CUDA source that the dev text leaves out, of the same
  baseline (every file but ``src/*.cpp``, ``ggml/src/*.c`` and ``vendor/``, sorted by path), needle-free, 4M characters:
  the dev text is 2.4M characters and would wrap around at 1M tokens (``devfar_text``); devfar2: the next 4M characters
  of the same (devfar's gemma-3 ceiling failed on the CPU),
- held-out: English prose, Python 3.11's own documentation: ``pydoc_data.topics`` (the language reference, as
  ``help()`` shows it) then every module docstring and class/function docstring of the standard library's
  pure-Python modules (``Lib/*.py`` and ``Lib/*/__init__.py``, sorted), each paragraph once,
- held-out 2: the same prose without every paragraph that uses a word of the needle or the question (pass, key,
  remember, ...: ``longctx.needle_free``): the first held-out text answered the question itself for these models
  ("The pass key is" -> "used to pass the value"), inside their trained windows too (sets.yaml),
- held-out 3: source code other than llama.cpp's, Python 3.11's standard library as Python source, needle-free, 4M
  characters (``longctx.code_heldout_text``): heldout2's prose failed its ceiling as well (gemma-3-270m 4/20),
- held-out 4 (with ``--boost-wheel``): C++ that is not llama.cpp's, Boost 1.90's headers from the PyPI wheel
  cmeel-boost 1.90.0 (``cmeel.prefix/include/boost/**/*.hpp``, sorted by path, each file once), needle-free, 4M
  characters: heldout3's Python failed gemma-3-270m's ceiling (7/20), and C++ (the dev text) is the one genre
  gemma-3 was seen to search in,
- held-out 5 (with ``--cccl-wheel``): C++ that is neither llama.cpp's nor Boost's, NVIDIA CCCL 13.0's headers from the
  PyPI wheel nvidia-cuda-cccl 13.0.85 (every file under ``nvidia/cu13/include/cccl/``, sorted by path, each file once:
  the 4M characters are cub's headers and the first of libcu++'s), needle-free:
  heldout4's cells were seen by a candidate the dev rule did not pick (a double-counting bug, 2026-12-06), so a
  choice that moves toward it is checked on a text no run has read,
- held-out 6 (with ``--arrow-wheel``): Apache Arrow's and Parquet's C++ headers from the PyPI wheel pyarrow 25.0.1
  (``pyarrow/include/**/*.h``, sorted by path, each file once), needle-free, ~3.9M characters: heldout5's gemma-3
  ceiling on the CPU was 15/20, one short of its minimum, so a second unread text is written down beside it.

The builders are dcaforge.gate.longctx's ``dev_text``, ``heldout_text`` and ``code_heldout_text`` (``dcaforge calibrate``
uses the first and the last); this
script adds the Python 3.11 check and writes the files.

    python bench/longctx/corpus.py --tree cleanroom/upstream --out build/longctx   (after `dcaforge apply`)
        [--boost-wheel cmeel_boost-1.90.0-0-cp311-cp311-manylinux_2_28_x86_64.whl]   (`pip download --no-deps
        cmeel-boost==1.90.0`: about 36 MB)
        [--cccl-wheel nvidia_cuda_cccl-13.0.85-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl]   (`pip
        download --no-deps nvidia-cuda-cccl==13.0.85`: about 3 MB)
        [--arrow-wheel pyarrow-25.0.1-cp311-cp311-manylinux_2_28_x86_64.whl]   (`pip download --no-deps
        pyarrow==25.0.1`: about 50 MB)
        writes build/longctx/dev.txt, devfar.txt, devfar2.txt, heldout.txt, heldout2.txt, heldout3.txt (and heldout4-6.txt) and prints their
        sha256, which sets.yaml pins: a text that differs (another llama.cpp, another Python) is refused by the runner.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dcaforge.gate import longctx  # noqa: E402


@contextlib.contextmanager
def baseline(tree: Path, *pathspecs: str) -> Iterator[Path]:
    """A clean room's dcaforge/baseline (the upstream files before the feature's hooks, which the work tree carries and
    which change with the templates), only ``pathspecs`` of it, exported to a temporary folder; SystemExit naming the
    room where it has no baseline."""
    with tempfile.TemporaryDirectory() as tmp:
        arc = subprocess.run(["git", "-C", str(tree), "archive", "dcaforge/baseline", "--", *pathspecs],
                             capture_output=True, check=False)
        if arc.returncode != 0:
            raise SystemExit(f"{tree}: no dcaforge/baseline to read, or nothing of {' '.join(pathspecs)} in it "
                             f"({arc.stderr.decode().strip()})")
        subprocess.run(["tar", "-x", "-C", tmp], input=arc.stdout, check=True)
        yield Path(tmp)


def dev_text(tree: Path) -> str:
    if (tree / ".git").exists():   # a clean room: its baseline
        with baseline(tree, "src", "ggml/src") as base:
            return dev_text(base)
    try:
        return longctx.dev_text(tree)
    except ValueError as exc:
        raise SystemExit(f"{exc} (give a llama.cpp tree with --tree)") from None


DEVFAR_SUFFIXES = (".c", ".cc", ".cpp", ".h", ".hpp", ".cu", ".cuh")


def devfar_text(tree: Path, limit: int = longctx.CODE_TEXT_CHARS, part: int = 1) -> str:
    """The 30x dev cell's text (sets.yaml `devfar`): llama.cpp's own C, C++ and CUDA source like the dev text, but the
    files the dev text leaves out (everything but src/*.cpp, ggml/src/*.c and the third-party vendor/), of the clean
    room's baseline, sorted by path, needle-free, at most ``limit`` characters: the dev text wraps around at 1M tokens
    (2.4M characters), a cell there would read the same code twice. ``part`` 2 (`devfar2`) is the next ``limit``
    characters of the same paragraphs, after the one that ended part 1."""
    if not (tree / ".git").exists():
        raise SystemExit(f"{tree}: not a clean room (the devfar text is read from its dcaforge/baseline)")
    # every DEVFAR_SUFFIXES name matches one of the two (git archive refuses a pathspec that matches nothing)
    with baseline(tree, ":(glob)**/*.c*", ":(glob)**/*.h*") as base:
        names = sorted(n for n in (p.relative_to(base).as_posix() for p in base.rglob("*") if p.is_file())
                       if n.endswith(DEVFAR_SUFFIXES) and not n.startswith("vendor/")
                       and not (n.count("/") == 1 and n.startswith("src/") and n.endswith(".cpp"))
                       and not (n.count("/") == 2 and n.startswith("ggml/src/") and n.endswith(".c")))
        paras = (para for name in names
                 for para in longctx.needle_free((base / name).read_bytes().decode("utf-8", errors="replace")).split("\n\n"))
        for _ in range(part - 1):
            longctx.capped_paragraphs(paras, limit)   # the parts before (and the paragraph that ended each)
        return longctx.capped_paragraphs(paras, limit)


def heldout_text() -> str:
    if sys.version_info[:3] != (3, 11, 7):   # another 3.11 release's documentation differs (3.11.2's does)
        raise SystemExit(f"the held-out texts are Python 3.11.7's documentation and standard library (sets.yaml pins "
                         f"their sha256); this is {sys.version.split()[0]}: run corpus.py with Python 3.11.7")
    return longctx.heldout_text()


def wheel_headers(wheel: Path, prefix: str, suffixes: tuple[str, ...], what: str,
                  limit: int = longctx.CODE_TEXT_CHARS) -> str:
    """The headers of a wheel under ``prefix`` (names ending in one of ``suffixes``; "" takes every file), sorted by
    path, each file once, joined by blank lines, needle-free, at most ``limit`` characters (whole paragraphs)."""
    import zipfile

    try:
        zf = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as exc:
        raise SystemExit(f"{wheel}: not a readable wheel ({exc}); give {what}'s wheel") from None
    with zf:
        names = sorted(n for n in zf.namelist() if n.startswith(prefix) and not n.endswith("/")
                       and n.endswith(suffixes))
        if not names:
            raise SystemExit(f"{wheel}: no {prefix}* headers in it; give {what}'s wheel")
        # needle_free per file, and no file read past the limit
        return longctx.capped_paragraphs((para for name in names
                                          for para in longctx.needle_free(zf.read(name).decode("utf-8", errors="replace")).split("\n\n")),
                                         limit)


def boost_text(wheel: Path) -> str:
    """Held-out 4: the Boost headers of a cmeel-boost wheel (cmeel.prefix/include/boost/**/*.hpp)."""
    return wheel_headers(wheel, "cmeel.prefix/include/boost/", (".hpp",), "cmeel-boost 1.90.0")


def cccl_text(wheel: Path) -> str:
    """Held-out 5: NVIDIA CCCL's headers of the nvidia-cuda-cccl 13.0.85 wheel, every file under
    nvidia/cu13/include/cccl/ (libcu++'s standard headers have no extension); 4M characters take cub's and the first
    of libcu++'s."""
    return wheel_headers(wheel, "nvidia/cu13/include/cccl/", ("",), "nvidia-cuda-cccl 13.0.85")


def arrow_text(wheel: Path) -> str:
    """Held-out 6: Apache Arrow's and Parquet's C++ headers of the pyarrow 25.0.1 wheel (pyarrow/include/**/*.h)."""
    return wheel_headers(wheel, "pyarrow/include/", (".h",), "pyarrow 25.0.1")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", required=True, help="a llama.cpp tree (the clean room)")
    ap.add_argument("--out", default="build/longctx")
    ap.add_argument("--boost-wheel", default="", help="cmeel-boost 1.90.0's wheel: also writes heldout4.txt")
    ap.add_argument("--cccl-wheel", default="", help="nvidia-cuda-cccl 13.0.85's wheel: also writes heldout5.txt")
    ap.add_argument("--arrow-wheel", default="", help="pyarrow 25.0.1's wheel: also writes heldout6.txt")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    held = heldout_text()
    tree = Path(a.tree)
    texts: tuple[tuple[str, str], ...] = (("dev", dev_text(tree)), ("devfar", devfar_text(tree)),
                                          ("devfar2", devfar_text(tree, part=2)), ("heldout", held),
                                          ("heldout2", longctx.needle_free(held)), ("heldout3", longctx.code_heldout_text()))
    if a.boost_wheel:
        texts += (("heldout4", boost_text(Path(a.boost_wheel))),)
    if a.cccl_wheel:
        texts += (("heldout5", cccl_text(Path(a.cccl_wheel))),)
    if a.arrow_wheel:
        texts += (("heldout6", arrow_text(Path(a.arrow_wheel))),)
    for name, text in texts:
        (out / f"{name}.txt").write_text(text, encoding="utf-8")
        print(f"{name}: {len(text)} chars, sha256 {hashlib.sha256(text.encode()).hexdigest()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
