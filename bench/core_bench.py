#!/usr/bin/env python3
"""Benchmark of dcaforge's core on the real llama.cpp tree (PyPI sdist of llama-cpp-python).

Makes an 80-patch synthetic series (small edits spread over many files; every 10th patch a
plain ``diff -u`` that GNU patch applies, a few new files, some files edited twice) and a small
feature (a new file and anchored edits), then times, through the CLI:

  apply --fresh   (clone the cached base, apply 80 patches, tag, render)
  capture
  verify

The one-time download and import of the sdist is timed separately and excluded.
Usage: python bench/core_bench.py [--work DIR] [--patches 80] [--out FILE] [--update-results]

The results go to build/bench/core.md (ignored by git), or --out FILE; --update-results writes them into the
core section of the committed bench/RESULTS.md (between its core-bench markers) and the table between the bench
markers of docs/development.md instead.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dcaforge.config import parse_config
from dcaforge.room.source import prepare

REQUIREMENT = "llama-cpp-python==0.3.36"

FEATURE_MANIFEST = """\
files:
  - template: src/llama-bench-feature.cpp.j2
    dest: src/llama-bench-feature.cpp
edits:
  - file: src/llama.cpp
    anchor: '(?m)^#include "llama-impl.h"\\n'
    action: insert_after
    text: "#include \\"llama-bench-feature.h\\" {{ marker }}\\n"
  - file: [src/models/gemma4-iswa.cpp, src/models/gemma4.cpp, src/llama-graph.cpp]
    anchor: '\\A'
    action: insert_before
    text: "// {{ feature.id }} {{ marker }}\\n"
"""


def blob_sha(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def git_patch(path: str, old: bytes, new: bytes) -> str:
    a = old.decode().splitlines(keepends=True)
    b = new.decode().splitlines(keepends=True)
    body = "".join(difflib.unified_diff(a, b, f"a/{path}", f"b/{path}", n=3))
    if not old:
        return (f"diff --git a/{path} b/{path}\nnew file mode 100644\nindex {'0' * 40}..{blob_sha(new)}\n"
                + body.replace(f"--- a/{path}", "--- /dev/null", 1))
    return f"diff --git a/{path} b/{path}\nindex {blob_sha(old)}..{blob_sha(new)} 100644\n" + body


def gnu_patch(path: str, old: bytes, new: bytes) -> str:
    a = old.decode().splitlines(keepends=True)
    b = new.decode().splitlines(keepends=True)
    return "".join(difflib.unified_diff(a, b, f"a/{path}", f"b/{path}", n=3))


def make_series(base_repo: str, ref: str, out: Path, count: int) -> None:
    files = subprocess.run(["git", "--git-dir", base_repo, "ls-tree", "-r", "--name-only", ref],
                           capture_output=True, text=True, check=True).stdout.split()
    sources = sorted(f for f in files if f.endswith((".c", ".cpp", ".h")) and f.startswith(("src/", "ggml/src/", "common/", "tools/")))
    stride = max(1, len(sources) // (count * 3 // 4))
    picks = sources[::stride]
    contents: dict[str, bytes] = {}
    out.mkdir(parents=True, exist_ok=True)
    for i in range(1, count + 1):
        if i % 20 == 0:  # a new file
            path, old = f"src/bench-new-{i:02d}.h", b""
            new = f"#pragma once\n// bench {i}\nint bench_{i} = {i};\n".encode()
        else:
            path = picks[(i * 7) % len(picks)] if i > count // 2 else picks[i % len(picks)]
            if path not in contents:
                contents[path] = subprocess.run(["git", "--git-dir", base_repo, "cat-file", "blob", f"{ref}:{path}"],
                                                capture_output=True, check=True).stdout
            old = contents[path]
            lines = old.decode().splitlines(keepends=True)
            at = (len(lines) * (i % 5 + 1)) // 7
            lines.insert(at, f"// dcaforge bench patch {i}\n")
            new = "".join(lines).encode()
        contents[path] = new
        text = gnu_patch(path, old, new) if (i % 10 == 5 and old) else git_patch(path, old, new)
        (out / f"{i:04d}-bench-{i:02d}.patch").write_text(text)


CPU: dict[str, float] = {}


def timed(argv: list[str], cwd: Path, label: str) -> float:
    import resource

    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    res = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    dt = time.perf_counter() - t
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    CPU[label] = min(CPU.get(label, cpu), cpu)
    if res.returncode != 0:
        sys.exit(f"failed: {' '.join(argv)}\n{res.stdout}\n{res.stderr}")
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temp dir)")
    ap.add_argument("--patches", type=int, default=80)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None, help="results file (default: build/bench/core.md)")
    ap.add_argument("--update-results", action="store_true",
                    help="write bench/RESULTS.md's core section and docs/development.md's table (a separate, explicit step)")
    args = ap.parse_args()
    if args.out is None:
        args.out = REPO / "build" / "bench" / "core.md"
    work = args.work or Path(tempfile.mkdtemp(prefix="dcaforge-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    (work / "feature" / "src").mkdir(parents=True, exist_ok=True)
    (work / "feature" / "manifest.yaml").write_text(FEATURE_MANIFEST)
    (work / "feature" / "src" / "llama-bench-feature.cpp.j2").write_text(
        "{{ marker }}\n" + "".join(f"int bench_feature_{i} = {i};\n" for i in range(200)))
    cfg_path = work / "dcaforge.yaml"
    cfg_path.write_text(
        f"name: bench\ncleanroom: rooms\nsource:\n  pypi: {REQUIREMENT}\n  subdir: vendor/llama.cpp\n"
        "series:\n  dir: patches\n  range: 0001-0999\nfeature:\n  number: 1000\n  name: bench-feature\n"
        "  templates: feature\n  marker: \"// dcaforge bench\"\n")
    cfg = parse_config(cfg_path)
    t = time.perf_counter()
    base = prepare(cfg, trust=True)  # our own bench config: its sdist may be downloaded
    t_prepare = time.perf_counter() - t
    shutil.rmtree(work / "patches", ignore_errors=True)
    make_series(base.clone_url, base.ref, work / "patches", args.patches)

    cli = [sys.executable, "-m", "dcaforge.cli"]
    rows = []
    for _ in range(args.runs):
        shutil.rmtree(work / "rooms" / "bench", ignore_errors=True)  # untimed: a new room each run
        t_new = timed([*cli, "apply", "-c", str(cfg_path)], work, "new")
        t_capture = timed([*cli, "capture", "-c", str(cfg_path)], work, "capture")
        t_verify = timed([*cli, "verify", "-c", str(cfg_path)], work, "verify")
        t_fresh = timed([*cli, "apply", "--fresh", "-c", str(cfg_path)], work, "fresh")
        rows.append((t_new, t_capture, t_verify, t_fresh))
    t_freshr = timed([*cli, "verify", "--fresh-render", "-c", str(cfg_path)], work, "fresh-render")
    t_rerun = timed([*cli, "apply", "-c", str(cfg_path)], work, "rerun")
    load = os.getloadavg()
    patch = work / "patches" / "1000-bench-feature.patch"
    best = [min(r[i] for r in rows) for i in range(4)]
    tree = subprocess.run(["git", "-C", str(work / "rooms" / "bench"), "ls-files"], capture_output=True, text=True, check=True).stdout
    nfiles = len(tree.splitlines())
    cpus = os.cpu_count()
    lines = [
        "# dcaforge core benchmark",
        "",
        f"Command: `python bench/core_bench.py{' --update-results' if args.update_results else ''}` "
        f"(this run: {args.patches} patches, {args.runs} runs, best of each step).",
        "",
        f"Machine: {platform.machine()}, {cpus} cores, Python {platform.python_version()}, "
        f"{subprocess.run(['git', '--version'], capture_output=True, text=True, check=False).stdout.strip()}.",
        f"Tree: {REQUIREMENT} `vendor/llama.cpp` ({nfiles} files), base commit `{base.ref}`.",
        f"Series: {args.patches} synthetic patches (small edits over many files; every 10th a plain `diff -u` "
        "applied by GNU patch; a new file every 20th); feature: one new file + 2 anchored edits.",
        "",
        "| step (CLI) | wall s | CPU s (user+sys, all processes) | target (wall) |",
        "|---|---|---|---|",
        f"| apply, new room (clone cached base, checkout, {args.patches} patches, baseline tag, render) "
        f"| {best[0]:.2f} | {CPU['new']:.2f} | < 10 |",
        f"| apply --fresh, existing room (reset to start, {args.patches} patches, baseline tag, render) "
        f"| {best[3]:.2f} | {CPU['fresh']:.2f} | < 10 |",
        f"| capture | {best[1]:.2f} | {CPU['capture']:.2f} | |",
        f"| verify | {best[2]:.2f} | {CPU['verify']:.2f} | |",
        f"| **capture + verify** | **{best[1] + best[2]:.2f}** | {CPU['capture'] + CPU['verify']:.2f} | < 5 |",
        f"| verify --fresh-render | {t_freshr:.2f} | {CPU['fresh-render']:.2f} | |",
        f"| apply again, nothing changed (re-render only) | {t_rerun:.2f} | {CPU['rerun']:.2f} | |",
        f"| sdist download + import (one-time; this run: {'cached' if t_prepare < 2 else 'cold'}) | {t_prepare:.2f} | | excluded |",
        "",
        "All runs (apply new / capture / verify / apply --fresh): "
        + "; ".join(f"{a:.2f}/{c:.2f}/{v:.2f}/{f:.2f}" for a, c, v, f in rows),
        f"Load average during the run: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} (the machine is shared; "
        "numbers are wall clock, best of the runs).",
        "",
        f"Captured patch: {patch.stat().st_size} bytes.",
        "",
    ]
    text = "\n".join(lines)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    results = REPO / "bench" / "RESULTS.md"
    if args.update_results and results.is_file():
        start, end = "<!-- core-bench:start -->", "<!-- core-bench:end -->"
        body = results.read_text()
        if start in body and end in body:
            section = re.sub(r"(?m)^(#{1,5}) ", r"#\1 ", text).rstrip()
            head, rest = body.split(start, 1)
            results.write_text(f"{head}{start}\n{section}\n{end}{rest.split(end, 1)[1]}")
    readme = REPO / "docs" / "development.md"
    if args.update_results and readme.is_file():
        start, end = "<!-- bench:start -->", "<!-- bench:end -->"
        body = readme.read_text()
        if start in body and end in body:
            table = "\n".join(ln for ln in lines if ln.startswith("|") or ln.startswith("Load average"))
            head, rest = body.split(start, 1)
            readme.write_text(f"{head}{start}\n{table}\n{end}{rest.split(end, 1)[1]}")
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
