"""llamafile's real layout built as far as this machine allows (no cosmocc here, no GPU in CI).

The user's checkout is made from llamafile's own build files (fixtures/llamafile: the extract of the
public 0.10.x tree, branch new_build_wip; llamafile_fixture.py says what is made at test time) with
llama.cpp as a real git submodule at the llama.cpp of a llama-cpp-python sdist:

- 0.3.36 (b11448), which the templates fit: bootstrap (llamafile's make setup, its own patches) ->
  the user's series -> render (0078 wires its files into llama.cpp/BUILD.mk and llamafile/cuda.sh) ->
  the wiring check (`render --check`) -> `dcaforge build` says cosmocc is missing, what it would
  run and how to get it -> `dcaforge build --dry-run --cuda`: llamafile's real Makefile under
  `make -n` with a stand-in cosmocc (the DCA objects are compiled and on the link lines of
  llama-server and llamafile) and the GPU script with a recording nvcc (fattn-lse.cu is handed to
  nvcc) -> each DCA translation unit compiled with g++ and the dry run's flags -> the CUDA
  translation units the patch adds or changes compiled with the real nvcc and exactly the script's
  flags (sm_86, sm_90) -> capture (the wiring is part of 0078) -> verify, git and GNU patch;
- 0.3.16 (older than any llama.cpp a llamafile 0.10.x release pins, older than code the templates need;
  llamafile's per-file patches left out, they are for another llama.cpp): `apply` stops before writing
  any of the render, and `render --check` prints the table of drifted and absent edits.

The checkout's bytes are compared before and after. Set DCAFORGE_E2E_LLAMAFILE_CUDA=added to compile
only the CUDA file the patch adds (the full set takes several minutes on 2 cores).
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from llamafile_fixture import Checkout, make_checkout

from dcaforge.config import PypiSource, parse_config
from dcaforge.room.source import cache_root, prepare_pypi

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.core.helpers import file_snapshot, ugit  # noqa: E402

NEW = PypiSource("llama-cpp-python==0.3.36", "vendor/llama.cpp")
#: older than any llama.cpp a llamafile 0.10.x release pins (0.10.1's b8953 is between 0.3.21 and 0.3.22, which the
#: templates fit: tests/e2e/test_drift_canary.py); llamafile's per-file patches were not made for it (left out)
OLD = PypiSource("llama-cpp-python==0.3.16", "vendor/llama.cpp")
#: the exit code of "does not fit" (a patch, an anchor, the wiring)
DOES_NOT_FIT = 3
#: `dcaforge apply` for a config with bootstrap steps (add --trust here once apply asks for it)
APPLY = ["apply", "--trust"]
PROGRAMS = ("o//llama.cpp/server/llama-server", "o//llamafile/llamafile")


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    exe = [sys.executable, "-c", "from dcaforge.cli import main; main()"]
    return subprocess.run([*exe, *args], cwd=REPO, text=True, capture_output=True, check=False, timeout=3600,
                          env={**os.environ, "COLUMNS": "250", **(env or {})})


def _isolated(tmp: Path, mp: pytest.MonkeyPatch, cache: Path) -> None:
    home = tmp / "home"
    home.mkdir()
    (home / ".gitconfig").write_text("")
    for key in list(os.environ):
        if key.startswith("GIT_"):
            mp.delenv(key)
    mp.setenv("HOME", str(home))
    mp.setenv("GIT_CONFIG_GLOBAL", str(home / ".gitconfig"))
    mp.setenv("GIT_CONFIG_NOSYSTEM", "1")
    mp.setenv("DCAFORGE_CACHE", str(cache))


@pytest.fixture(scope="module")
def new_pin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Checkout]:
    cache = cache_root()
    tmp = tmp_path_factory.mktemp("llamafile-new")
    with pytest.MonkeyPatch.context() as mp:
        _isolated(tmp, mp, cache)
        base = prepare_pypi(NEW)
        yield make_checkout(tmp, base.clone_url, base.ref)


@pytest.fixture(scope="module")
def old_pin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Checkout]:
    cache = cache_root()
    tmp = tmp_path_factory.mktemp("llamafile-old")
    with pytest.MonkeyPatch.context() as mp:
        _isolated(tmp, mp, cache)
        base = prepare_pypi(OLD)
        yield make_checkout(tmp, base.clone_url, base.ref, llamafile_patches=False)


def _wiring_lines(out: str) -> dict[str, str]:
    return {m.group(2): m.group(1) + " " + m.group(3)
            for m in re.finditer(r"(?m)^  (ok|missing|unbuilt)\s+(\S+?):? (.*)$", out)}


def test_llamafile_real_layout_builds_as_far_as_this_machine_allows(new_pin: Checkout, tmp_path: Path) -> None:
    cfg_path = new_pin.config("lf")
    c = str(cfg_path)
    p = cli(*APPLY, "-c", c)
    assert p.returncode == 0, p.stdout + p.stderr
    cfg = parse_config(cfg_path)
    room = cfg.room
    assert "bootstrap: 2 patches of the tree applied" in p.stdout, p.stdout
    # the wiring is rendered: llamafile's explicit list and the GPU script's source list
    build_mk = (room / "llama.cpp/BUILD.mk").read_text()
    assert "LLAMA_SRCS_CPP += \\\n\tllama.cpp/src/llama-dca.cpp \\\n\tllama.cpp/src/llama-dca-context.cpp\n" in build_mk
    assert build_mk.index("LLAMA_SRCS_CPP += ") < build_mk.index("LLAMA_OBJS :=")
    script = (room / "llamafile/cuda.sh").read_text()
    assert ("  llama.cpp/ggml/src/ggml-cuda/fattn-lse.cu \\\n  llama.cpp/ggml/src/ggml-cuda/fattn.cu \\\n") in script

    # render --check: every anchor fits, and the wiring check finds each added source in a built list
    p = cli("render", "-c", c, "--check")
    assert p.returncode == 0, p.stdout + p.stderr
    rows = _wiring_lines(p.stdout)
    assert rows["llama.cpp/src/llama-dca.cpp"].startswith("ok LLAMA_SRCS_CPP (explicit, llama.cpp/BUILD.mk:")
    assert "o/llama.cpp/llama.cpp.a" in rows["llama.cpp/src/llama-dca-context.cpp"]
    assert rows["llama.cpp/ggml/src/ggml-cuda/fattn-lse.cu"].startswith("ok llamafile/cuda.sh line ")
    assert rows["llama.cpp/ggml/src/ggml-cuda/fattn-lse-merge.cu"].startswith("ok llamafile/cuda.sh line ")
    assert not any(r.startswith("missing") for r in rows.values()), rows
    assert rows["llama.cpp/tests/test-dca.cpp"].startswith("unbuilt no make list names a file of llama.cpp/tests/")

    # no cosmocc here: build says so, what it would run, how to get it; nothing is downloaded
    p = cli("build", "-c", c, "--cuda")
    err = " ".join(p.stderr.split())
    assert p.returncode == 1, p.stdout + p.stderr
    assert "cosmocc is not in the tree" in err and "dcaforge never downloads it for you" in err
    assert f"it would run, in {room}: .cosmocc/4.0.2/bin/make -j" in err
    assert f"{room}/llamafile/cuda.sh --clean --output {room}/o/cuda/ggml-cuda.so" in err
    assert ("build/download-cosmocc.sh .cosmocc/4.0.2 4.0.2 "
            "85b8c37a406d862e656ad4ec14be9f6ce474c1b436b9615e91a55208aced3f44") in err
    assert not (room / ".cosmocc").exists()

    # the real Makefile in dry-run mode, the GPU script with a recording nvcc
    p = cli("build", "-c", c, "--dry-run", "--cuda", "--trust")
    assert p.returncode == 0, p.stdout + p.stderr
    for src in ("llama.cpp/src/llama-dca.cpp", "llama.cpp/src/llama-dca-context.cpp"):
        obj = "o/" + src + ".o"
        assert f"  {src} -> {obj}; linked into {', '.join(PROGRAMS)}\n" in p.stdout, p.stdout
    assert "  llama.cpp/ggml/src/ggml-cuda/fattn-lse.cu: handed to nvcc" in p.stdout
    assert "ok: every file the feature adds is compiled and linked" in p.stdout

    from dcaforge.build import dryrun
    from dcaforge.build.build import dry_run

    if shutil.which("nvcc"):
        from test_e2e_cuda_compile import cuda_stubs

        os.environ["CUBLAS_INCLUDE"] = str(cuda_stubs() / "include")  # the toolkit here has no cuBLAS headers
    try:
        rep = dry_run(cfg, cuda=True, trust=True)
    finally:
        os.environ.pop("CUBLAS_INCLUDE", None)
    assert rep.ok and set(rep.compiles) == {"llama.cpp/src/llama-dca.cpp", "llama.cpp/src/llama-dca-context.cpp"}

    # each DCA translation unit with the host compiler and the flags of the dry run
    objs = tmp_path / "objs"
    objs.mkdir()
    for src, argv in rep.compiles.items():
        obj = objs / (Path(src).name + ".o")
        args = dryrun.host_compile_args(dryrun.Command(argv=argv, output=None, sources=[src]), src, str(obj))
        assert "-mcosmo" not in args and "-std=gnu++23" in args and "-DCOSMOCC=1" in args
        res = subprocess.run(args, cwd=room, capture_output=True, text=True, check=False, timeout=1800)
        assert res.returncode == 0, f"{' '.join(args)}\n{res.stderr[-4000:]}"
        syms = subprocess.run(["nm", "-C", "--defined-only", str(obj)], capture_output=True, text=True, check=True).stdout
        assert re.search(r" T .*dca", syms, re.IGNORECASE), syms[:2000]

    # the CUDA translation units the patch adds or changes, with exactly the script's nvcc flags
    if shutil.which("nvcc"):
        (call,) = rep.nvcc_calls
        assert {"-gencode", "arch=compute_86,code=sm_86", "arch=compute_90,code=sm_90"} <= set(call)
        changed = ugit(room, "diff", "--name-only", "dcaforge/baseline", "--", "*.cu").split()
        added = ["llama.cpp/ggml/src/ggml-cuda/fattn-lse.cu", "llama.cpp/ggml/src/ggml-cuda/fattn-lse-merge.cu"]
        # the edited upstream units first (fattn.cu alone takes about as long as the other three on two cores)
        tus = added if os.environ.get("DCAFORGE_E2E_LLAMAFILE_CUDA") == "added" else sorted(set(changed) - set(added)) + added
        assert "llama.cpp/ggml/src/ggml-cuda/fattn.cu" in changed and "llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu" in changed
        nvcc = shutil.which("nvcc") or "nvcc"

        def compile_tu(tu: str) -> tuple[list[str], subprocess.CompletedProcess]:
            args = [nvcc, *dryrun.nvcc_compile_args(call, tu, str(objs / (Path(tu).name + ".o")))]
            return args, subprocess.run(args, cwd=room, capture_output=True, text=True, check=False, timeout=3600)

        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:  # CI's two cores
            compiled = list(pool.map(compile_tu, tus))
        for tu, (args, res) in zip(tus, compiled, strict=True):
            obj = objs / (Path(tu).name + ".o")
            assert res.returncode == 0, f"{' '.join(args)}\n{res.stderr[-4000:]}"
            if tu.endswith("fattn-lse.cu"):  # the op's entry point, for both architectures (one fat object)
                syms = subprocess.run(["nm", "-C", "--defined-only", str(obj)], capture_output=True, text=True,
                                      check=True).stdout
                assert re.search(r"(?m) T ggml_cuda_flash_attn_ext_lse\(ggml_backend_cuda_context&, ggml_tensor\*\)$",
                                 syms), syms[:3000]
                if shutil.which("cuobjdump"):  # the GPU machine's toolkit has it; CI's nvcc does not
                    elf = subprocess.run(["cuobjdump", "-lelf", str(obj)], capture_output=True, text=True, check=True)
                    assert "sm_86" in elf.stdout and "sm_90" in elf.stdout, elf.stdout

    # capture: the wiring is part of 0078; verify both ways
    p = cli("capture", "-c", c)
    assert p.returncode == 0, p.stdout + p.stderr
    patch = (new_pin.series / "0078-dca.patch").read_text()
    assert "diff --git a/llama.cpp/BUILD.mk b/llama.cpp/BUILD.mk\n" in patch
    assert "diff --git a/llamafile/cuda.sh b/llamafile/cuda.sh\n" in patch
    assert "+\tllama.cpp/src/llama-dca.cpp \\\n" in patch and "+  llama.cpp/ggml/src/ggml-cuda/fattn-lse.cu \\\n" in patch
    p = cli("verify", "-c", c)
    assert p.returncode == 0, p.stdout + p.stderr
    p = cli("verify", "-c", c, "--fresh-render", "--gnu")
    assert p.returncode == 0 and "GNU patch -p1 --fuzz=0 gives the same files" in p.stdout, p.stdout + p.stderr
    assert file_snapshot(new_pin.source) == new_pin.before


def test_llamafile_wiring_left_out_is_named_with_its_list(new_pin: Checkout, tmp_path: Path) -> None:
    """The same templates without their two wiring edits: render --check and build name each file
    and the list it must join."""
    feat = tmp_path / "dca"
    shutil.copytree(REPO / "templates" / "dca", feat)
    manifest = (feat / "manifest.yaml").read_text()
    cut = manifest.index("# llamafile's build (llama_cpp_dir: llama.cpp)")
    (feat / "manifest.yaml").write_text(manifest[:cut])
    cfg_path = new_pin.config("lf-unwired")
    data = yaml.safe_load(cfg_path.read_text())
    data["feature"]["templates"] = str(feat)
    cfg_path.write_text(yaml.safe_dump(data, sort_keys=False))
    c = str(cfg_path)
    p = cli(*APPLY, "-c", c)
    assert p.returncode == 0, p.stdout + p.stderr
    p = cli("render", "-c", c, "--check")
    assert p.returncode == DOES_NOT_FIT, p.stdout + p.stderr
    rows = _wiring_lines(p.stdout)
    assert re.match(r"missing not built by make; add it to LLAMA_SRCS_CPP in llama\.cpp/BUILD\.mk:\d+ \(it lists \d+ "
                    r"other files of llama\.cpp/src/\)", rows["llama.cpp/src/llama-dca.cpp"]), rows
    assert re.match(r"missing not built by gpu script; add it to the source list of llamafile/cuda\.sh:\d+-\d+",
                    rows["llama.cpp/ggml/src/ggml-cuda/fattn-lse.cu"]), rows
    assert "the build leaves out files the feature adds" in p.stderr
    p = cli("build", "-c", c)
    n_missing = sum(r.startswith("missing") for r in rows.values())
    assert n_missing >= 4, rows  # llama-dca.cpp, llama-dca-context.cpp, fattn-lse.cu, fattn-lse-merge.cu
    assert p.returncode == DOES_NOT_FIT
    assert f"the llamafile build leaves out {n_missing} file(s) the feature adds" in " ".join(p.stderr.split())


def test_old_pin_stops_before_rendering_and_classifies_each_misfit(old_pin: Checkout) -> None:
    cfg_path = old_pin.config("lf-old")
    c = str(cfg_path)
    p = cli(*APPLY, "-c", c)
    assert p.returncode == DOES_NOT_FIT, p.stdout + p.stderr
    cfg = parse_config(cfg_path)
    room = cfg.room
    # the series is applied and the baseline tagged, but not one byte of the render is written
    assert ugit(room, "rev-parse", "dcaforge/baseline").strip()
    assert ugit(room, "status", "--porcelain", "--untracked-files=all").strip() == ""
    assert not (room / "llama.cpp/src/llama-dca.cpp").exists()
    p = cli("render", "-c", c, "--check")
    assert p.returncode == DOES_NOT_FIT
    out = p.stdout
    m = re.search(r"misfits: (\d+) drifted, (\d+) absent", out)
    assert m and int(m.group(1)) >= 3 and int(m.group(2)) >= 5, out[-5000:]
    table = out[m.start():]
    # absent: the field the feature hooks does not exist yet (the upstream change it needs)
    assert re.search(r"(?m)^\d+\s+include/llama\.h\s+absent\s+`ctx_other` in no file of this tree: the feature needs "
                     r"the upstream change that adds it", table), table
    # absent file, with the file this tree has instead
    assert re.search(r"(?m)^\d+\s+tools/server/server-context\.cpp\s+absent\s+tools/server/server-context\.cpp does not "
                     r"exist; this tree has tools/server/server\.cpp", table), table
    # drifted: the CPU flash attention's code moved; the nearest lines come from the pristine baseline file
    assert re.search(r"(?m)^\d+\s+ggml/src/ggml-cpu/ops\.cpp\s+drifted\s+the anchor moved or changed", table), table
    assert "ggml_compute_forward_flash_attn_ext_f16(params, dst);" in table
    assert "opencoti F5 dca" not in table  # never a line of a partly rendered file
    assert ugit(room, "status", "--porcelain").strip() == ""
    assert file_snapshot(old_pin.source) == old_pin.before
