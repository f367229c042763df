#!/usr/bin/env python3
"""The whole chain on the user's real tree, offline: llamafile 0.10.1 (18db09f) with its real submodules, made
into a checkout as the user has it (``make setup`` run in it), a 77-patch series made from real upstream llama.cpp
history, then with examples/llamafile.yaml (pointed at that checkout): apply -> render --check -> capture -> verify
(--fresh-render --gnu) -> build --dry-run --cuda, inside a network namespace without network (``unshare -rn``;
without it, through a proxy that refuses every connection). Results (exit codes, counts, seconds) in
``WORK/results.json`` and on stdout; docs/llamafile.md quotes them. Then (unless ``--no-compile``) each C++ unit
0078 adds is compiled with g++ and the dry run's make flags, and the CUDA units it adds or edits with nvcc (sm_86)
and the flags the real GPU script hands nvcc for them: llamafile's own patches and the series included.
``--archs 86,89,90,120`` compiles those CUDA units for each of the architectures (those this nvcc knows).

    python3 bench/realtree.py --mirrors /work/.mirror --work /tmp/realtree [--pin b8953] [--pin b10454]

The sources are fetched, never committed: ``--mirrors`` holds bare git repositories named ``owner+name/repo`` (the
session's fetch tool makes them; a plain ``git clone --mirror`` of each works too): shaneholloman/llamafile,
ngxson/llama.cpp, ggml-org/whisper.cpp, leejet/stable-diffusion.cpp, jart/zipalign. A mirror may lack large blobs
(llama.cpp's vocab GGUFs and web UI bundle): each submodule is imported as one commit of its pinned tree, such a file
replaced by a one-line stand-in (listed in results.json), and the superproject's gitlinks pointed at those commits
(the commit ids differ from upstream's; the trees do not, but for those files).

Pins:
- ``b8953``: llamafile 0.10.1 as released (its llama.cpp submodule is 7b8443ac, b8953), the config as documented.
- ``b10454``: the same llamafile with its llama.cpp bumped to b10454 (4df29be4f) by a commit of the user's, which
  also refreshes llama.cpp/BUILD.mk's source lists (what llamafile's maintainers do at a bump); llamafile 0.10.1's
  32 per-file patches are for b8953 (17 do not apply to b10454), so that run leaves the config's ``patches:`` step
  out (a release pinning b10454 ships its own).

The series (vendors/patches/llamafile layout, 0001-0077, git-format and GNU mixed): tests/e2e/series77.py on the
upstream llama.cpp changes (in src/, common/, include/, ggml/, tools/, tests/) from the pin to a later build
(b8953 -> b9093; b10454 -> b10573, the newest the mirror has), paths ``llama.cpp/...``,
leaving out the files llamafile's patches and llamafile-files change, stable-diffusion's ggml and the Gemma-4 graph
files (upstream renamed gemma4-iswa.cpp in that range: the room keeps 0.10.1's), and no deletions (llamafile's make
lists every source).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "e2e"))
sys.path.insert(0, str(REPO / "bench" / "gpu"))
sys.path.insert(0, str(REPO))

import yaml  # noqa: E402
from llamafile_fixture import port_build_mk  # noqa: E402
from llamafile_real_lib import gencodes  # noqa: E402  (the GPU library check's -gencode list, one definition)
from series77 import INCLUDE, make_series  # noqa: E402

LLAMAFILE = ("shaneholloman+llamafile", "18db09f5ca08a033fe0f58cdc20efcc81ae3c087")  # 0.10.1, 2026-05-14
SUBMODULES = {  # path in llamafile -> mirror (the commit is the one llamafile pins)
    "llama.cpp": "ngxson+llama.cpp",
    "whisper.cpp": "ggml-org+whisper.cpp",
    "stable-diffusion.cpp": "leejet+stable-diffusion.cpp",
    "third_party/zipalign": "jart+zipalign",
}
PINS = {"b8953": ("7b8443ac786c06438e0f407b7adaa72c220b5099", "b9093"),
        "b10454": ("4df29be4f4c3673f428170fda944a5b19f743bb8", "b10573")}
ENV = {"GIT_AUTHOR_NAME": "realtree", "GIT_AUTHOR_EMAIL": "realtree@localhost", "GIT_AUTHOR_DATE": "2026-05-14T00:00:00+0000",
       "GIT_COMMITTER_NAME": "realtree", "GIT_COMMITTER_EMAIL": "realtree@localhost",
       "GIT_COMMITTER_DATE": "2026-05-14T00:00:00+0000", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1",
       "LC_ALL": "C"}


def sh(argv: list[str], cwd: Path, *, check: bool = True, env: dict[str, str] | None = None,
       input: bytes | None = None) -> subprocess.CompletedProcess:
    p = subprocess.run(argv, cwd=cwd, capture_output=True, input=input, check=False,
                       env={**os.environ, **ENV, **(env or {})})
    if check and p.returncode != 0:
        raise SystemExit(f"failed ({p.returncode}): {' '.join(argv)} in {cwd}\n{p.stderr.decode(errors='replace')[-3000:]}")
    return p


def git(cwd: Path, *args: str, **kw) -> str:
    return sh(["git", "-c", "protocol.file.allow=always", *args], cwd, **kw).stdout.decode().strip()


def export(mirror: Path, commit: str, dest: Path) -> list[str]:
    """The tree of ``commit`` into ``dest`` (files only; gitlinks are returned by :func:`gitlinks`); blobs the
    mirror lacks become one-line stand-ins, returned."""
    dest.mkdir(parents=True, exist_ok=True)
    entries = git(mirror, "--git-dir", str(mirror), "ls-tree", "-r", "-z", commit).split("\0")
    missing, exclude = [], []
    batch = "\n".join(e.split()[2] for e in entries if e and e.split()[1] == "blob") + "\n"
    check = sh(["git", "--git-dir", str(mirror), "cat-file", "--batch-check"], mirror, input=batch.encode()).stdout.decode()
    absent = {ln.split()[0] for ln in check.splitlines() if ln.endswith(" missing")}
    for e in entries:
        if not e:
            continue
        meta, path = e.split("\t", 1)
        if meta.split()[1] == "blob" and meta.split()[2] in absent:
            missing.append(path)
            exclude.append(f":(exclude,literal){path}")
    archive = sh(["git", "--git-dir", str(mirror), "archive", commit, "--", ".", *exclude], mirror).stdout
    sh(["tar", "x", "-C", str(dest)], dest, input=archive)
    for path in missing:
        (dest / path).parent.mkdir(parents=True, exist_ok=True)
        (dest / path).write_text(f"stand-in: this blob is absent from the mirror the tree was fetched from ({path})\n")
    return missing


def gitlinks(mirror: Path, commit: str) -> dict[str, str]:
    out = git(mirror, "--git-dir", str(mirror), "ls-tree", "-r", commit)
    return {ln.split("\t", 1)[1]: ln.split()[2] for ln in out.splitlines() if ln.startswith("160000 ")}


def import_repo(mirror: Path, commit: str, dest: Path, links: dict[str, str] | None = None, tag: str | None = None) -> tuple[str, list[str]]:
    """One commit holding ``commit``'s tree (and its gitlinks, remapped by ``links``) in a new repository ``dest``."""
    if dest.exists():
        shutil.rmtree(dest)
    missing = export(mirror, commit, dest)
    git(dest, "init", "-q")
    git(dest, "add", "-A", "-f", ".")
    for path, sha in gitlinks(mirror, commit).items():
        git(dest, "update-index", "--add", "--cacheinfo", f"160000,{(links or {}).get(path, sha)},{path}")
    git(dest, "commit", "-q", "-m", f"import of {mirror.parent.name.replace('+', '/')} {commit} (the tree as fetched; "
                                     f"{len(missing)} blobs absent from the mirror are stand-ins)")
    if tag:
        git(dest, "tag", tag)
    return git(dest, "rev-parse", "HEAD"), missing


def make_checkout(mirrors: Path, work: Path, pin: str, log: dict) -> Path:
    """The user's checkout: llamafile 0.10.1 cloned, its submodules updated as make setup does (not recursively),
    ``make setup`` run in it; for another pin, a commit of the user's that bumps llama.cpp (and BUILD.mk's lists)."""
    up = work / "upstream"
    up.mkdir(parents=True, exist_ok=True)
    mod_commits, missing = {}, {}
    lf_mirror = mirrors / LLAMAFILE[0] / "repo"
    pinned = gitlinks(lf_mirror, LLAMAFILE[1])
    for path, name in SUBMODULES.items():
        mirror = mirrors / name / "repo"
        commit = pinned[path]
        links = None
        if path == "stable-diffusion.cpp":  # its own ggml submodule: imported too (the checkout never clones it)
            ggml = mirrors / "ggml-org+ggml" / "repo"
            sd_links = gitlinks(mirror, commit)
            if ggml.is_dir() and "ggml" in sd_links:
                g, _ = import_repo(ggml, sd_links["ggml"], up / "ggml")
                links = {"ggml": g}
        tag = "b8953" if path == "llama.cpp" else None
        mod_commits[path], missing[path] = import_repo(mirror, commit, up / path.replace("/", "_"), links, tag)
    lf, missing["llamafile"] = import_repo(lf_mirror, LLAMAFILE[1], up / "llamafile", mod_commits)
    log["missing_blobs"] = {k: v for k, v in missing.items() if v}
    co = work / "checkout"
    if co.exists():
        shutil.rmtree(co)
    git(work, "clone", "-q", str(up / "llamafile"), str(co))
    for path in SUBMODULES:
        git(co, "submodule", "init", "--", path)
        git(co, "config", f"submodule.{path}.url", str(up / path.replace("/", "_")))
    git(co, "submodule", "update", "-q", "--", *SUBMODULES)
    if pin != "b8953":
        commit, _ = PINS[pin]
        new = up / f"llama.cpp-{pin}"
        c, miss = import_repo(mirrors / SUBMODULES["llama.cpp"] / "repo", commit, new, tag=pin)
        log["missing_blobs"][f"llama.cpp@{pin}"] = miss
        git(co / "llama.cpp", "fetch", "-q", str(new), f"refs/tags/{pin}:refs/tags/{pin}")
        git(co / "llama.cpp", "checkout", "-q", c)
        bm = co / "llama.cpp.patches/llamafile-files/BUILD.mk"
        bm.write_text(port_build_mk(bm.read_text(), co))
        git(co, "add", "-A")
        git(co, "commit", "-q", "-m", f"bump llama.cpp to {pin}; BUILD.mk's source lists refreshed")
    # make setup, as the user runs it (its submodules are there: it fetches nothing); its work stays uncommitted. The
    # Makefile includes o//depend, made by cosmocc's mkdeps: dcaforge's recording stand-in of cosmocc writes it empty
    from dcaforge.builder.dryrun import cosmocc_standin

    cosmo = cosmocc_standin(work / "cosmocc-standin")
    t0 = time.monotonic()
    p = sh(["make", f"COSMOCC={cosmo}", "setup"], co, check=False)
    log["make_setup"] = {"exit": p.returncode, "seconds": round(time.monotonic() - t0, 1),
                         "tail": p.stdout.decode(errors="replace").strip().splitlines()[-3:]}
    return co


def make_config(co: Path, work: Path, pin: str, series: Path) -> Path:
    data = yaml.safe_load((REPO / "examples" / "llamafile.yaml").read_text())
    data["root"] = str(REPO)
    data["name"] = f"lf-{pin}"
    data["cleanroom"] = str(work / "cleanroom")
    data["source"]["git"] = str(co)
    data["source"]["ref"] = git(co, "rev-parse", "HEAD")
    data["series"]["dir"] = str(series)
    for key in ("series_readme", "upstream_sync"):
        doc = data["bookkeeping"][key]
        doc["file"] = str(series / Path(doc["file"]).name)
    if pin != "b8953":  # llamafile 0.10.1's per-file patches are for b8953
        data["bootstrap"] = [s for s in data["bootstrap"] if not (isinstance(s, dict) and "patches" in s)]
    path = work / f"lf-{pin}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def make_user_series(mirrors: Path, work: Path, co: Path, pin: str) -> tuple[Path, int]:
    llama = mirrors / SUBMODULES["llama.cpp"] / "repo"
    old_c, later = PINS[pin]
    old, new = work / "trees" / pin, work / "trees" / later
    for c, d in ((old_c, old), (later, new)):
        if not d.exists():
            export(llama, c, d)
    touched = set()
    for patch in (co / "llama.cpp.patches" / "patches").glob("*.patch"):
        touched |= {m.group(1) for m in re.finditer(r"(?m)^\+\+\+ b/llama\.cpp/(\S+)", patch.read_text(errors="replace"))}
    for f in (co / "llama.cpp.patches" / "llamafile-files").rglob("*"):
        if f.is_file():
            touched.add(str(f.relative_to(co / "llama.cpp.patches" / "llamafile-files")))
    exclude = re.compile("^(" + "|".join(re.escape(t) for t in sorted(touched)) + r")$|^src/models/gemma4")
    series = work / f"series-{pin}"
    if series.exists():
        shutil.rmtree(series)
    wider = (*INCLUDE, "ggml/src/", "tools/", "tests/")  # b10454 -> b10573 changes fewer files of INCLUDE than 77
    paths = make_series(old, new, series, prefix="llama.cpp/", exclude=exclude, deletions=False, include=wider)
    copy_series_docs(series)
    return series, len(paths)


def make_empty_series(work: Path) -> tuple[Path, int]:
    """A series of no patch (--no-series), with the layout's documents."""
    series = work / "series-none"
    shutil.rmtree(series, ignore_errors=True)
    series.mkdir()
    copy_series_docs(series)
    return series, 0


def copy_series_docs(series: Path) -> None:
    """The series folder's README.md and UPSTREAM_SYNC.md, as this repository's llamafile layout has them."""
    for name in ("README.md", "UPSTREAM_SYNC.md"):
        shutil.copy(REPO / "vendors" / "patches" / "llamafile" / name, series / name)


def offline(argv: list[str]) -> list[str]:
    if shutil.which("unshare") and subprocess.run(["unshare", "-rn", "true"], check=False, capture_output=True).returncode == 0:
        return ["unshare", "-rn", *argv]
    return argv


def dcaforge(*args: str) -> tuple[int, str, float]:
    exe = [sys.executable, "-c", "from dcaforge.cli import main; main()"]
    dead = "http://127.0.0.1:9"  # belt and braces: no proxy answers there
    env = {**os.environ, "COLUMNS": "250", "HTTPS_PROXY": dead, "HTTP_PROXY": dead, "ALL_PROXY": dead,
           "https_proxy": dead, "http_proxy": dead}
    t0 = time.monotonic()
    p = subprocess.run(offline([*exe, *args]), cwd=REPO, text=True, capture_output=True, env=env, check=False)
    return p.returncode, p.stdout + p.stderr, time.monotonic() - t0


def run_chain(cfg: Path, co: Path, log: dict) -> bool:
    steps = [("apply", ["apply", "--trust"]), ("render --check", ["render", "--check"]), ("capture", ["capture"]),
             ("verify", ["verify"]), ("verify --fresh-render --gnu", ["verify", "--fresh-render", "--gnu"]),
             ("build --dry-run --cuda", ["build", "--dry-run", "--cuda", "--trust"])]
    before = git(co, "status", "--porcelain", "--ignore-submodules=none")
    ok = True
    for name, args in steps:
        code, out, secs = dcaforge(*args, "-c", str(cfg))
        entry: dict = {"exit": code, "seconds": round(secs, 1)}
        m = re.search(r"series:\s+(\d+) patches \((\d+) applied now\)", out)
        if m:
            entry["series"] = f"{m.group(2)}/{m.group(1)}"
        m = re.search(r"bootstrap: (\d+) patch(?:es)? of the tree applied", out)
        if m:
            entry["llamafile_patches"] = int(m.group(1))
        m = re.search(r"(\d+) fit \((\d+) by an alternative\), (\d+) skipped, (\d+) do not fit", out)
        if m:
            entry["edits"] = dict(zip(("fit", "by_alternative", "skipped", "misfit"), map(int, m.groups()), strict=True))
        for pat, key in ((r"wrote .*?\((\d+) bytes, (\d+) files", "patch"), (r"unchanged .*?\((\d+) bytes, (\d+) files", "patch")):
            m = re.search(pat, out)
            if m:
                entry[key] = {"bytes": int(m.group(1)), "files": int(m.group(2))}
        gem = re.findall(r"(?m)^\s*\d+\s+(src/models/gemma4[\w-]*\.cpp)\s", out)
        if gem:
            entry["gemma4_file"] = sorted(set(gem))
        if name.startswith("build"):
            entry["lines"] = [ln for ln in out.splitlines() if "->" in ln or "handed to nvcc" in ln or ln.startswith("ok:")
                              or " ok " in ln and "gpu script" in ln][:12]
        if code != 0:
            entry["tail"] = out.strip().splitlines()[-25:]
            ok = False
        if name == "apply":
            entry["notes"] = [ln.strip() for ln in out.splitlines() if ln.strip().startswith(("note:", "submodule", "flattened",
                                                                                               "bootstrap:"))][:20]
        if name == "render --check":
            entry["wiring"] = [ln.strip() for ln in out.splitlines() if re.match(r"^\s+(ok|missing|unbuilt)\s", ln)]
        log[name] = entry
        print(f"  {name:<28} exit {code}  {secs:6.1f} s  " + json.dumps({k: v for k, v in entry.items()
                                                                     if k in ("series", "edits", "patch", "gemma4_file")}))
        if code != 0:
            print("\n".join("    " + ln for ln in entry["tail"]))
            break
    log["checkout_untouched"] = git(co, "status", "--porcelain", "--ignore-submodules=none") == before
    return ok and log["checkout_untouched"]


CUDA_UNITS = ("fattn-lse.cu", "fattn-lse-merge.cu", "fattn.cu", "ggml-cuda.cu",
              "fattn-mma-f16-instance-ncols1_1-ncols2_8.cu", "fattn-wmma-f16.cu")


def compile_units(cfg: Path, out: Path, log: dict, cuda_include: Path | None = None, archs: str = "86") -> bool:
    """Past the chain: each C++ unit 0078 adds, with g++ and exactly the flags the dry run's make -n gives it
    (cosmocc's own left out), and the CUDA units it adds or edits with nvcc and exactly the flags the real GPU
    script hands nvcc for them, for ``archs`` (default sm_86 only: one architecture is the check, not the library;
    ``--archs 86,89,90,120`` the user's RTX 3090, Ada, Hopper and Blackwell, those this nvcc knows)."""
    from dcaforge.builder import dryrun
    from dcaforge.builder.build import dry_run
    from dcaforge.config import parse_config

    config = parse_config(cfg)
    rep = dry_run(config, cuda=True, trust=True)  # the script made this config and the tree (from the mirrors)
    out.mkdir(parents=True, exist_ok=True)
    res: dict = {}
    for src, argv in rep.compiles.items():
        args = dryrun.host_compile_args(dryrun.Command(argv=argv, output=None, sources=[src]), src,
                                        str(out / (Path(src).name + ".o")))
        t0 = time.monotonic()
        p = subprocess.run(args, cwd=config.room, capture_output=True, text=True, check=False)
        res[src] = {"g++": p.returncode, "seconds": round(time.monotonic() - t0, 1)}
        if p.returncode:
            res[src]["tail"] = p.stderr.strip().splitlines()[-10:]
    nvcc = shutil.which("nvcc")
    gen, unknown = gencodes(nvcc, archs) if nvcc else ([], [])
    key = "nvcc sm_" + ",".join(g.split("sm_")[1] for g in gen if g.startswith("arch="))
    if unknown:
        log["archs_unknown_to_nvcc"] = unknown
    for unit in CUDA_UNITS if nvcc else ():
        call = next((c for c in rep.nvcc_calls if any(a.endswith("/" + unit) for a in c)), None)
        if call is None:
            continue
        src = next(a for a in call if a.endswith("/" + unit))
        args = [a for a in dryrun.nvcc_compile_args(call, src, str(out / (unit + ".o"))) if not a.startswith("arch=")
                and a != "-gencode"]
        t0 = time.monotonic()
        extra = [f"-I{cuda_include}"] if cuda_include else []  # cuBLAS headers (b10454 runs without llamafile's TinyBLAS patch)
        p = subprocess.run([nvcc, *gen, *extra, *args], cwd=config.room, capture_output=True, text=True, check=False)
        res[unit] = {key: p.returncode, "seconds": round(time.monotonic() - t0, 1)}
        if p.returncode:
            res[unit]["tail"] = p.stderr.strip().splitlines()[-10:]
    log["compile"] = res
    bad = [k for k, v in res.items() if any(isinstance(x, int) and x != 0 for key, x in v.items() if key != "seconds")]
    print(f"  compile (g++ {len(rep.compiles)} units, nvcc {sum(1 for k in res if k.endswith('.cu'))} units {key[5:]})"
          f"    {'ok' if not bad else 'FAILED: ' + ', '.join(bad)}")
    return not bad


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mirrors", type=Path, default=Path("/work/.mirror"))
    ap.add_argument("--work", type=Path, default=Path("/tmp/realtree"))
    ap.add_argument("--pin", action="append", choices=sorted(PINS))
    ap.add_argument("--no-compile", action="store_true", help="skip the g++/nvcc compile of the units 0078 touches")
    ap.add_argument("--no-series", action="store_true",
                    help="leave the 77-patch series out (an empty series): the room is llamafile + its own patches + 0078, "
                    "the tree the GPU library check compiles whole (the series is upstream's later diff minus the files "
                    "llamafile's patches touch, so its CUDA sources need not compile together: 0006 renames "
                    "quantize_mmq_mxfp4_cuda in quantize.cuh, mmq.cu, which llamafile patches, is left out)")
    ap.add_argument("--cuda-include", type=Path, help="a folder with cuBLAS headers (cublas_v2.h) when the toolkit has none, "
                    "e.g. from the nvidia-cublas wheel (tests/e2e/test_e2e_cuda_compile.py's cuda_stubs)")
    ap.add_argument("--archs", default="86", help="the architectures the compile step builds the CUDA units for "
                    "(comma-separated; one -gencode each, an architecture this nvcc does not know left out and reported)")
    args = ap.parse_args(argv)
    results: dict = {}
    ok = True
    for pin in args.pin or ["b8953", "b10454"]:
        work = args.work / pin
        work.mkdir(parents=True, exist_ok=True)
        if (work / "cleanroom").exists():
            shutil.rmtree(work / "cleanroom")
        log: dict = {}
        print(f"{pin}: making the checkout and the series")
        t0 = time.monotonic()
        co = make_checkout(args.mirrors, work, pin, log)
        series, n = make_empty_series(work) if args.no_series else make_user_series(args.mirrors, work, co, pin)
        log["series_patches"] = n
        log["prepare_seconds"] = round(time.monotonic() - t0, 1)
        cfg = make_config(co, work, pin, series)
        print(f"  make setup exit {log['make_setup']['exit']}; series {n} patches; config {cfg}")
        chain_ok = run_chain(cfg, co, log)
        ok &= chain_ok
        if chain_ok and not args.no_compile:
            ok &= compile_units(cfg, work / "objects", log, args.cuda_include, args.archs)
        results[pin] = log
    (args.work / "results.json").write_text(json.dumps(results, indent=1))
    print(f"results: {args.work / 'results.json'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
