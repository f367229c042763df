"""dcaforge build: reading ninja/make progress and compiler errors (from real gcc, cmake and ninja
runs), toolchain checks, the build: config, and real builds of a tiny CMake project and a
llamafile-shaped tree in a clean room (no mocks: real git, cmake, ninja, make, gcc)."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dcaforge.builder import build as bmod
from dcaforge.builder import toolchain
from dcaforge.builder.build import Progress, first_error, parse_progress
from dcaforge.cli import app
from dcaforge.config import parse_config
from dcaforge.errors import BuildError, ConfigError, DcaforgeError, ToolchainError
from dcaforge.patch.series import apply

from .helpers import git_init, minimal_config, sigint_default

needs = pytest.mark.skipif(not all(shutil.which(t) for t in ("cmake", "ninja", "gcc", "make")),
                           reason="cmake, ninja, gcc and make are needed (.ci/run installs them)")

# --- progress -------------------------------------------------------------------------------


def test_parse_progress_ninja_cmake_make_and_others() -> None:
    # lines copied from real logs: ninja (cmake's Ninja generator), cmake's Makefiles
    assert parse_progress("[12/137] Building CXX object src/CMakeFiles/llama.dir/llama-dca.cpp.o") == \
        Progress(12, 137, "Building CXX object src/CMakeFiles/llama.dir/llama-dca.cpp.o")
    assert parse_progress("[137/137] Linking CXX executable bin/llama-perplexity") == \
        Progress(137, 137, "Linking CXX executable bin/llama-perplexity")
    assert parse_progress("[ 45%] Building C object CMakeFiles/llama.dir/src/a.c.o") == \
        Progress(45, 100, "Building C object CMakeFiles/llama.dir/src/a.c.o")
    assert parse_progress("[100%] Built target hello") == Progress(100, 100, "Built target hello")
    for line in ("ninja: no work to do.", "-- Configuring done (0.4s)", "[0/0] nothing", "[5/3] odd",
                 "src/a.c:3:5: error: x", "[ 145%] nope", ""):
        assert parse_progress(line) is None, line


# --- errors from real tools ------------------------------------------------------------------

def _out(argv: list[str], cwd: Path) -> list[str]:
    p = subprocess.run(argv, check=False, cwd=cwd, capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"})
    assert p.returncode != 0
    return (p.stdout + p.stderr).splitlines()


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")
def test_first_error_of_real_gcc_skips_warnings(tmp_path: Path) -> None:
    (tmp_path / "broken.c").write_text("int f(void) {\n    int unused;\n    return 1\n}\n")
    lines = ["[1/2] Building C object CMakeFiles/x.dir/broken.c.o", "FAILED: CMakeFiles/x.dir/broken.c.o",
             *_out(["gcc", "-Wall", "-c", "broken.c", "-o", "/dev/null"], tmp_path)]
    d = first_error(lines, base=tmp_path)
    assert d is not None
    assert d.file == str(tmp_path / "broken.c") and d.line == 3 and d.column is not None
    assert "expected ';'" in d.message
    assert d.target == "CMakeFiles/x.dir/broken.c.o"
    assert d.location() == f"{tmp_path / 'broken.c'}:3:{d.column}"


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")
def test_first_error_of_real_link_failure(tmp_path: Path) -> None:
    (tmp_path / "main.c").write_text("int missing_fn(void);\nint main(void) { return missing_fn(); }\n")
    d = first_error(_out(["gcc", "main.c", "-o", "main"], tmp_path))
    assert d is not None and "undefined reference to" in d.message and "missing_fn" in d.message


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed")
def test_first_error_of_real_cmake_failure(tmp_path: Path) -> None:
    src = tmp_path / "proj"
    src.mkdir()
    (src / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.14)\nproject(p NONE)\nmessage(FATAL_ERROR \"GGML_CUDA needs nvcc\")\n")
    d = first_error(_out(["cmake", "-S", str(src), "-B", str(tmp_path / "b")], tmp_path))
    assert d is not None and d.file is not None
    assert d.file.endswith("CMakeLists.txt") and d.line == 3
    assert "GGML_CUDA needs nvcc" in " ".join([d.message, *d.context])


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_first_error_of_real_nvcc(tmp_path: Path) -> None:
    (tmp_path / "k.cu").write_text("__global__ void k(float * x) {\n    x[0] = undefined_name;\n}\n")
    d = first_error(_out(["nvcc", "-c", "k.cu", "-o", "k.o"], tmp_path), base=tmp_path)
    assert d is not None and (d.file, d.line) == (str(tmp_path / "k.cu"), 2)
    assert d.message == 'identifier "undefined_name" is undefined'
    assert d.context[0].strip() == "x[0] = undefined_name;"


def test_first_error_of_nvcc_and_make_lines() -> None:
    # nvcc's own format (EDG front end), then GNU make's summary as the fallback
    d = first_error(["[3/9] Building CUDA object fattn-lse.cu.o", "FAILED: fattn-lse.cu.o",
                     "/r/ggml/src/ggml-cuda/fattn-lse.cu(42): error: identifier \"lse\" is undefined",
                     "      float x = lse[0];", "                ^"])
    assert d is not None and (d.file, d.line) == ("/r/ggml/src/ggml-cuda/fattn-lse.cu", 42)
    assert d.message == 'identifier "lse" is undefined' and d.context[0].strip() == "float x = lse[0];"
    d = first_error(["make: *** [Makefile:12: o//llamafile/x.o] Error 1"])
    assert d is not None and d.file is None and "Error 1" in d.message
    assert first_error(["all fine", "ninja: build stopped"]) is None


# --- config ----------------------------------------------------------------------------------

BASE = minimal_config(cleanroom=None)


def _cfg(tmp_path: Path, extra: str):
    p = tmp_path / "dcaforge.yaml"
    p.write_text(BASE + textwrap.dedent(extra))
    return parse_config(p)


def test_build_config_defaults_and_values(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, "")
    assert cfg.build.backend == "cmake" and cfg.build.cmake.generator == "Ninja"
    assert cfg.build.cmake.dir == "build" and cfg.build.cmake.cuda_architectures == "86;90"
    cfg = _cfg(tmp_path, """\
        build:
          backend: cmake
          jobs: 2
          cmake:
            defines: {GGML_NATIVE: OFF, GGML_CUDA_FA: ON, N: 3}
            cuda_defines: {GGML_CUDA_FA_ALL_QUANTS: ON, GGML_NATIVE: ON}
            cuda_architectures: 90
            targets: [llama, llama-perplexity]
        """)
    assert cfg.build.jobs == 2 and cfg.build.cmake.targets == ("llama", "llama-perplexity")
    assert dict(cfg.build.cmake.defines) == {"GGML_NATIVE": "OFF", "GGML_CUDA_FA": "ON", "N": "3"}
    assert cfg.build.cmake.cuda_architectures == "90"
    args = bmod.cmake_configure_args(cfg, Path("/s"), Path("/b"), cuda=True, ccache=False, nvcc="/x/nvcc")
    assert args[:7] == ["cmake", "-S", "/s", "-B", "/b", "-G", "Ninja"]
    assert "-DBUILD_SHARED_LIBS=OFF" in args and "-DGGML_CCACHE=OFF" in args
    assert "-DGGML_CUDA=ON" in args and "-DCMAKE_CUDA_ARCHITECTURES=90" in args and "-DCMAKE_CUDA_COMPILER=/x/nvcc" in args
    assert "-DGGML_CUDA_FA_ALL_QUANTS=ON" in args and "-DGGML_NATIVE=ON" in args and "-DGGML_NATIVE=OFF" not in args
    cpu = bmod.cmake_configure_args(cfg, Path("/s"), Path("/b"), cuda=False, ccache=True)
    assert "-DGGML_NATIVE=OFF" in cpu and "-DGGML_CCACHE=ON" in cpu and "-DGGML_CUDA=ON" not in cpu
    assert not any("ARCHITECTURES" in a or "ALL_QUANTS" in a for a in cpu)


def test_a_native_build_on_a_cpu_with_amx_leaves_amx_out(tmp_path: Path) -> None:
    """On a CPU with AMX, a native build (GGML_NATIVE unset or on, after cuda_defines) gets -mno-amx-*: upstream
    ggml's AMX kernels stop with SIGILL as GCC 12 builds them. A config that turns native off or sets its own C/C++
    flags builds as it says; without AMX nothing changes. And the host check reads /proc/cpuinfo's flags line."""
    flag = f"-DCMAKE_CXX_FLAGS={bmod.NO_AMX_FLAGS}"
    plain = _cfg(tmp_path, "")
    assert flag in bmod.cmake_configure_args(plain, Path("/s"), Path("/b"), cuda=False, ccache=False, amx=True)
    assert f"-DCMAKE_C_FLAGS={bmod.NO_AMX_FLAGS}" in bmod.cmake_configure_args(plain, Path("/s"), Path("/b"),
                                                                                cuda=True, ccache=False, amx=True)
    assert not any("amx" in a for a in bmod.cmake_configure_args(plain, Path("/s"), Path("/b"), cuda=False,
                                                                  ccache=False, amx=False))
    for defines, cuda, out in (("{GGML_NATIVE: OFF}", False, False), ("{GGML_NATIVE: false}", False, False),
                               ("{GGML_NATIVE: ON}", False, True), ("{CMAKE_CXX_FLAGS: -O2}", False, False),
                               ("{CMAKE_C_FLAGS: -O2}", False, False)):
        cfg = _cfg(tmp_path, f"build:\n  cmake:\n    defines: {defines}\n")
        args = bmod.cmake_configure_args(cfg, Path("/s"), Path("/b"), cuda=cuda, ccache=False, amx=True)
        assert (flag in args) is out, defines
    cfg = _cfg(tmp_path, "build:\n  cmake:\n    defines: {GGML_NATIVE: OFF}\n    cuda_defines: {GGML_NATIVE: ON}\n")
    assert flag in bmod.cmake_configure_args(cfg, Path("/s"), Path("/b"), cuda=True, ccache=False, amx=True)
    assert flag not in bmod.cmake_configure_args(cfg, Path("/s"), Path("/b"), cuda=False, ccache=False, amx=True)
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f amx_bf16 amx_tile amx_int8\n")
    assert bmod.host_has_amx(info)
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f\nbugs\t\t: amx_tile_spectre\n")
    assert not bmod.host_has_amx(info)
    assert not bmod.host_has_amx(tmp_path / "missing")


@pytest.mark.parametrize("extra, message, line", [
    ("build:\n  backend: bazel\n", "'build.backend' must be one of cmake, llamafile, got 'bazel'", 10),
    ("build:\n  cmake:\n    genrator: Ninja\n", "unknown key 'build.cmake.genrator'", 11),
    ("build:\n  jobs: many\n", "'build.jobs' must be an integer, got a string 'many'", 10),
    ("build:\n  jobs: 0\n", "'build.jobs' must be at least 1", 10),
    ("build:\n  cmake:\n    dir: /abs\n", "'build.cmake.dir' must be a relative path inside the tree", 11),
    ("build:\n  cmake:\n    targets: llama\n", "'build.cmake.targets' must be a list", 11),
    ("build:\n  llamafile:\n    cuda_flags: [1, [2]]\n", "'build.llamafile.cuda_flags[1]' must be a string", 11),
    ("gates:\n  - name: g\n    kind: speed\n    recipe: tiny:qwen2\n",
     "'gates[0].kind' must be one of off-identity, noop-below-chunk, extension", 11),
    ("gates:\n  - name: g\n    kind: extension\n", "needs exactly one of 'model:'", 10),
    ("gates:\n  - name: g\n    kind: noop-below-chunk\n    recipe: tiny:qwen2\n    tolerence: 1\n",
     "unknown key 'gates[0].tolerence'", 13),
    ("gates:\n  - name: g\n    kind: noop-below-chunk\n    recipe: big:qwen2\n", "'gates[0].recipe' must look like", 12),
    ("gates:\n  - name: g\n    kind: off-identity\n    recipe: tiny:qwen2\n"
     "  - name: g\n    kind: off-identity\n    recipe: tiny:llama\n", "two gates are named 'g'", 13),
])
def test_build_and_gate_config_errors_name_key_file_line(tmp_path: Path, extra: str, message: str, line: int) -> None:
    with pytest.raises(ConfigError) as ei:
        _cfg(tmp_path, extra)
    assert message in ei.value.message
    assert ei.value.where == f"{tmp_path / 'dcaforge.yaml'}:{line}"


def test_unknown_build_key_suggests_the_right_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as ei:
        _cfg(tmp_path, "build:\n  backnd: cmake\n")
    assert ei.value.hint is not None and "did you mean 'backend'?" in ei.value.hint


def test_gate_config_parsed(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, """\
        gates:
          - name: ext
            kind: extension
            model: models/m.gguf
            text: data/text.txt
            contexts: [256, 512]
            ppl_ratio_max: 1.15
            plain_ratio_min: 2
        """)
    (g,) = cfg.gates
    assert g.model == tmp_path / "models" / "m.gguf" and g.recipe is None
    assert g.options == {"contexts": [256, 512], "ppl_ratio_max": 1.15, "plain_ratio_min": 2,
                         "text": tmp_path / "data" / "text.txt"}
    assert g.where == f"{tmp_path / 'dcaforge.yaml'}:10"


# --- toolchains ------------------------------------------------------------------------------

REAL_PATH = os.environ.get("PATH", "")


def _path_with(tmp_path: Path, tools: list[str]) -> str:
    """A PATH holding only these tools (symlinks to the real ones)."""
    d = tmp_path / "onlybin"
    d.mkdir(parents=True, exist_ok=True)
    for t in tools:
        real = shutil.which(t, path=REAL_PATH)
        if real and not (d / t).exists():
            (d / t).symlink_to(real)
    return str(d)


@needs
def test_missing_ninja_and_cmake_and_nvcc_say_how_to_get_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               tiny_room) -> None:
    cfg = tiny_room
    monkeypatch.setenv("PATH", _path_with(tmp_path, ["git", "cmake", "gcc", "cc", "make"]))
    with pytest.raises(ToolchainError) as ei:
        bmod.build(cfg, jobs=1)
    assert "ninja is not installed" in ei.value.message and "apt-get install ninja-build" in (ei.value.hint or "")
    monkeypatch.setenv("PATH", _path_with(tmp_path / "x", ["git"]))
    with pytest.raises(ToolchainError) as ei:
        bmod.build(cfg, jobs=1)
    assert "cmake is not installed" in ei.value.message and "pip install cmake" in (ei.value.hint or "")
    monkeypatch.setenv("PATH", _path_with(tmp_path, ["git", "cmake", "ninja", "gcc", "cc"]))
    monkeypatch.delenv("CUDACXX", raising=False)
    monkeypatch.setattr(toolchain, "CUDA_NVCC", str(tmp_path / "no-cuda" / "nvcc"))
    with pytest.raises(ToolchainError) as ei:
        bmod.build(cfg, cuda=True, jobs=1)
    assert "nvcc" in ei.value.message and "CUDA toolkit" in (ei.value.hint or "")
    # nothing was configured or built
    assert not (cfg.room / "build").exists() and not (cfg.room / "build-cuda").exists()


# --- a real build of a tiny CMake project ----------------------------------------------------

TINY_CMAKE = """\
cmake_minimum_required(VERSION 3.14)
project(tiny C)
add_library(llama STATIC src/a.c src/b.c)
add_executable(hello src/main.c)
target_link_libraries(hello llama)
"""

MANIFEST = """\
files:
  - template: feature.c.j2
    dest: src/feature.c
edits:
  - file: CMakeLists.txt
    anchor: 'src/b\\.c\\)'
    action: replace
    text: 'src/b.c src/feature.c)'
"""


def _feature_room(tmp_path: Path, feature: dict[str, str], config: str, render: bool = True):
    """work/templates/feat (``feature``: its files by path, manifest.yaml among them), work/patches and
    work/dcaforge.yaml (``config``) under ``tmp_path``; then a real apply. Returns the parsed config."""
    feat = tmp_path / "work" / "templates" / "feat"
    for rel, text in feature.items():
        (feat / rel).parent.mkdir(parents=True, exist_ok=True)
        (feat / rel).write_text(text)
    (tmp_path / "work" / "patches").mkdir()
    cfgp = tmp_path / "work" / "dcaforge.yaml"
    cfgp.write_text(config)
    cfg = parse_config(cfgp)
    apply(cfg, render=render)
    return cfg


@pytest.fixture
def tiny_room(tmp_path: Path):
    """A clean room (real apply) of a tiny C project with a one-file feature; ccache off."""
    src = tmp_path / "upstream"
    git_init(src, {"CMakeLists.txt": TINY_CMAKE, "src/a.c": "int a(void) { return 1; }\n",
                   "src/b.c": "int b(void) { return 2; }\n",
                   "src/main.c": "int a(void); int b(void);\nint main(void) { return a() + b() - 3; }\n"})
    return _feature_room(
        tmp_path, {"manifest.yaml": MANIFEST,
                   "feature.c.j2": "{{ marker }}\nint feature(void) { return {{ vars.value }}; }\n"},
        f"name: room\ncleanroom: ../ws\nsource:\n  git: {src}\nfeature:\n  number: 78\n  name: feat\n"
        "  templates: templates/feat\n  marker: '// m'\n  vars: {value: 7}\n"
        "build:\n  ccache: false\n  jobs: 2\n  cmake:\n    targets: [hello, llama]\n")


@needs
def test_build_rebuild_change_failure_and_baseline(tiny_room, tmp_path: Path) -> None:
    cfg = tiny_room
    seen: list[Progress] = []
    res = bmod.build(cfg, hooks=bmod.BuildHooks(on_progress=seen.append))
    assert (cfg.room / "build" / "hello").is_file() and res.build_dir == cfg.room / "build"
    assert [s.what for s in res.steps] == ["configure", "build"] and not res.steps[0].skipped
    assert seen and seen[-1].done == seen[-1].total and res.compiled == seen[-1].total
    assert res.log.parent == cfg.room / ".git" / "dcaforge" / "logs" and "Linking C executable" in res.log.read_text()
    # the build folder is kept out of capture: excluded (this tree has no .gitignore)
    assert "/build/" in (cfg.room / ".git" / "info" / "exclude").read_text().splitlines()
    assert subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "build"], check=False, cwd=cfg.room,
                          capture_output=True, text=True).stdout == ""

    # again: configure up to date, nothing compiled
    res = bmod.build(cfg)
    assert res.steps[0].skipped and res.compiled == 0

    # a template change re-renders one file: only it is recompiled (then the library, the link)
    feat = cfg.feature.templates / "feature.c.j2"
    mtime_a = (cfg.room / "src" / "a.c").stat().st_mtime_ns
    feat.write_text("{{ marker }}\nint feature(void) { return {{ vars.value }} + 1; }\n")
    runner = CliRunner()
    r = runner.invoke(app, ["render", "-c", str(cfg.path)])
    assert r.exit_code == 0, r.output
    assert (cfg.room / "src" / "a.c").stat().st_mtime_ns == mtime_a
    log_lines: list[str] = []
    res = bmod.build(cfg, hooks=bmod.BuildHooks(on_line=log_lines.append))
    compiled = [ln for ln in log_lines if "Building C object" in ln]
    assert len(compiled) == 1 and "feature.c" in compiled[0], log_lines

    # a broken template: exit 1, the first compiler error (file:line) and the log's path
    feat.write_text("{{ marker }}\nint feature(void) { return {{ vars.value }} }\n")
    assert runner.invoke(app, ["render", "-c", str(cfg.path)]).exit_code == 0
    with pytest.raises(BuildError) as ei:
        bmod.build(cfg)
    e = ei.value
    assert f"{cfg.room / 'src' / 'feature.c'}:2" in e.message
    assert e.where is not None and e.where.startswith("log: ") and Path(e.where[5:]).is_file()
    assert "error: expected" in (e.details or "") and "ninja: build stopped" not in (e.details or "")
    r = runner.invoke(app, ["build", "-c", str(cfg.path)])
    assert r.exit_code == 1
    assert "feature.c:2" in r.output and "log:" in r.output

    # the baseline: its own worktree next to the room, no feature, its own build
    res = bmod.build(cfg, baseline=True, targets=["hello"])
    wt = cfg.workspace / "room-baseline"
    assert res.tree == wt and (wt / "build" / "hello").is_file()
    assert not (wt / "src" / "feature.c").exists() and "feature.c" not in (wt / "CMakeLists.txt").read_text()
    # the room itself is unchanged by it
    assert (cfg.room / "src" / "feature.c").exists()
    # the room made again (its worktree records gone): the worktree is re-added, its build kept
    (wt / "build" / "keep.txt").write_text("kept")
    shutil.rmtree(cfg.room / ".git" / "worktrees")
    res = bmod.build(cfg, baseline=True, targets=["hello"])
    assert (wt / "build" / "keep.txt").read_text() == "kept" and res.steps[0].skipped
    assert subprocess.run(["git", "status", "--porcelain"], check=False, cwd=wt, capture_output=True, text=True).stdout == ""
    # a folder in the way that is not our worktree is refused
    shutil.rmtree(wt)
    wt.mkdir()
    (wt / "mine.txt").write_text("user data")
    with pytest.raises(DcaforgeError) as ei:
        bmod.build(cfg, baseline=True)
    assert "not a worktree of the clean room" in ei.value.message
    assert (wt / "mine.txt").read_text() == "user data"


@needs
def test_cli_build_prints_summary(tiny_room) -> None:
    r = CliRunner().invoke(app, ["build", "-c", str(tiny_room.path), "-j", "1", "--targets", "hello llama"])
    assert r.exit_code == 0, r.output
    assert "configure" in r.output and "targets:   hello llama  -j1  ccache off" in r.output
    assert "log:" in r.output


# --- the llamafile backend --------------------------------------------------------------------

LF_MAKEFILE = """\
all: o/llamafile
\t@echo "[1/2] CC llamafile/main.c"
\t@echo "[2/2] LINK o/llamafile"
o/llamafile:
\t@mkdir -p o && echo built > o/llamafile
"""

CUDA_SH = """\
#!/bin/sh
# fake llamafile/cuda.sh: records its arguments, writes --output
out=""
while [ $# -gt 0 ]; do
  case "$1" in --output) out="$2"; shift;; esac
  shift
done
nvcc --version >/dev/null || exit 3
echo module > "$out"
"""


@needs
def test_llamafile_backend_needs_cosmocc_then_runs_make_and_cuda_sh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "llamafile"
    git_init(src, {"Makefile": LF_MAKEFILE, "build/config.mk": "PREFIX = /usr/local\nCOSMOCC = .cosmocc/4.0.2\n",
                   "llamafile/cuda.sh": (CUDA_SH, 0o755), "llama.cpp/README.md": "vendored\n",
                   ".gitignore": "/o\n/.cosmocc\n"})
    cfg = _feature_room(
        tmp_path, {"manifest.yaml": "files: []\nedits: []\n"},
        f"name: lf\ncleanroom: ../ws\nsource:\n  git: {src}\nllama_cpp_dir: llama.cpp\n"
        "feature:\n  number: 78\n  name: feat\n  templates: templates/feat\n  marker: '// m'\n"
        "build:\n  backend: llamafile\n  llamafile:\n    cuda_flags: [--arch, sm_86]\n")
    with pytest.raises(ToolchainError) as ei:
        bmod.build(cfg)
    assert "cosmocc is not in the tree" in ei.value.message and "dcaforge never downloads it" in ei.value.message
    assert f"it would run, in {cfg.room}:\n  .cosmocc/4.0.2/bin/make -j" in (ei.value.details or "")  # what it would run
    assert "build/download-cosmocc.sh .cosmocc/4.0.2" in (ei.value.hint or "")
    assert not (cfg.room / ".cosmocc").exists()  # nothing downloaded

    (cfg.room / ".cosmocc" / "4.0.2" / "bin").mkdir(parents=True)
    (cfg.room / ".cosmocc" / "4.0.2" / "bin" / "cosmocc").write_text("#!/bin/sh\n")
    seen: list[Progress] = []
    res = bmod.build(cfg, hooks=bmod.BuildHooks(on_progress=seen.append))
    assert (cfg.room / "o" / "llamafile").read_text() == "built\n"
    assert [(p.done, p.total) for p in seen] == [(1, 2), (2, 2)]
    assert res.backend == "llamafile" and res.steps[0].what == "make"

    # --cuda: nvcc required, then cuda.sh --clean --output <inside the room> <flags>
    fake = tmp_path / "cuda" / "bin"
    fake.mkdir(parents=True)
    (fake / "nvcc").write_text("#!/bin/sh\necho 'nvcc fake'\n")
    (fake / "nvcc").chmod(0o755)
    monkeypatch.setenv("CUDACXX", str(fake / "nvcc"))
    res = bmod.build(cfg, cuda=True)
    cuda_step = res.steps[-1]
    out = cfg.room / "o" / "cuda" / "ggml-cuda.so"
    assert cuda_step.what == "cuda.sh" and cuda_step.argv[-5:] == ("--clean", "--output", str(out), "--arch", "sm_86")
    assert out.read_text() == "module\n" and out in res.outputs


@needs
def test_ctrl_c_stops_the_whole_build_and_frees_the_room(tiny_room, tmp_path: Path) -> None:
    """A real SIGINT to `dcaforge build`: exit 130, the compiler's process group is gone, the log
    says so, the lock is released (a second build runs)."""
    import signal
    import sys
    import time

    cfg = tiny_room
    pidfile = tmp_path / "slow.pid"
    cm = cfg.room / "CMakeLists.txt"
    (cfg.room / "slow.sh").write_text(f"echo $$ > {pidfile}\nexec sleep 60\n")
    cm.write_text(cm.read_text() + "add_custom_target(slow COMMAND sh ${CMAKE_SOURCE_DIR}/slow.sh)\n")
    proc = subprocess.Popen([sys.executable, "-c", "from dcaforge.cli import main; main()", "build", "-c", str(cfg.path),
                             "--targets", "slow"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=sigint_default)
    deadline = time.monotonic() + 120
    while not pidfile.exists() or not pidfile.read_text().strip():
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    slow = int(pidfile.read_text())
    proc.send_signal(signal.SIGINT)
    _out_, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "the build was stopped" in err
    time.sleep(0.5)
    stat = Path(f"/proc/{slow}/stat")
    assert not stat.exists() or stat.read_text().split(")")[-1].split()[0] == "Z", stat.read_text()  # gone (or a zombie)
    log = sorted((cfg.room / ".git" / "dcaforge" / "logs").glob("build-feature-*.log"))[-1]
    assert log.read_text().rstrip().endswith("# interrupted")
    assert not (cfg.workspace / "room.lock").exists()
    cm.write_text(TINY_CMAKE.replace("src/b.c)", "src/b.c src/feature.c)"))
    assert bmod.build(cfg, targets=["hello"]).steps[-1].what == "build"


# --- what a user runs: the programs, the plan (--dry-run on cmake), progress in 80 columns, --json ----------------

@needs
def test_build_names_the_programs_it_built(tiny_room) -> None:
    """The summary ends with each program's path (ninja's own record of the target), read from the real build;
    the library's result carries them too, and --json prints that result."""
    cfg = tiny_room
    r = CliRunner().invoke(app, ["build", "-c", str(cfg.path), "-j", "1"])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    at = lines.index("programs:")
    assert lines[at + 1].split() == ["hello", str(cfg.room / "build" / "hello")]  # llama is a library: not listed
    assert (cfg.room / "build" / "hello").is_file()
    # every progress line of a log (no terminal) fits 80 columns, whatever the command line's length
    assert all(len(ln) <= 80 for ln in lines if ln.startswith(("  configure:", "  build:", "  [")))
    assert any(ln.startswith("  build: ") and ln.endswith("...") for ln in lines), lines
    r = CliRunner().invoke(app, ["build", "-c", str(cfg.path), "-j", "1", "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["command"] == "build" and data["programs"] == {"hello": str(cfg.room / "build" / "hello")}
    assert data["compiled"] == 0 and data["targets"] == ["hello", "llama"] and data["steps"][0]["skipped"] is True
    assert set(data) >= {f.name for f in dataclasses.fields(bmod.BuildResult)}


@needs
def test_dry_run_on_cmake_configures_a_scratch_folder_and_prints_the_plan(tiny_room) -> None:
    """`build --dry-run` on a cmake config (it used to exit 1: llamafile only): cmake configures into a scratch
    folder, ninja counts the steps and names where each target lands; nothing is built, the build folder is not
    made, and the scratch folder is gone afterwards."""
    cfg = tiny_room
    # configuring runs the tree's CMake code: a config that is not trusted is refused before anything runs
    r = CliRunner().invoke(app, ["build", "-c", str(cfg.path), "--dry-run"])
    assert r.exit_code == 1 and "runs the tree's CMake code" in r.output and "--trust" in r.output, r.output
    assert not (cfg.room / ".git" / "dcaforge" / "plan-cmake").exists()
    r = CliRunner().invoke(app, ["build", "-c", str(cfg.path), "--dry-run", "--trust"])
    assert r.exit_code == 0, r.output
    out = r.output
    assert f"  hello              -> {cfg.room / 'build' / 'hello'}" in out
    assert f"  llama              -> {cfg.room / 'build' / 'libllama.a'}" in out
    steps = int(re.search(r"^steps:     (\d+) ", out, re.M).group(1))  # type: ignore[union-attr]
    assert steps >= 5  # 4 compiles, an archive, a link
    assert "configure: " in out and f"-B {cfg.room / 'build'}" in out and "run by the build" in out
    assert "wiring (cmake): 1 of 1 added sources built" in out
    assert not (cfg.room / "build").exists()
    assert not (cfg.room / ".git" / "dcaforge" / "plan-cmake").exists()
    # once built, the plan says the build folder is configured so; --targets and --json
    assert CliRunner().invoke(app, ["build", "-c", str(cfg.path), "-j", "1"]).exit_code == 0
    r = CliRunner().invoke(app, ["build", "-c", str(cfg.path), "--dry-run", "--trust", "--targets", "hello", "--json"])
    assert r.exit_code == 0, r.output
    plan = json.loads(r.stdout)
    assert plan["command"] == "build" and plan["dry_run"] is True and plan["ok"] is True and plan["configured"] is True
    assert plan["files"] == {"hello": str(cfg.room / "build" / "hello")} and plan["targets"] == ["hello"]
    # an unknown target: ninja's own words, exit 1
    r = CliRunner().invoke(app, ["build", "-c", str(cfg.path), "--dry-run", "--trust", "--targets", "no-such-target"])
    assert r.exit_code == 1 and "unknown target 'no-such-target'" in r.output, r.output


def test_the_progress_bar_fits_the_terminal() -> None:
    """The live bar (a real rich Progress on a terminal 80 columns wide, and narrower) never wraps: the file being
    built is cut to what is left of the line."""
    from rich.console import Console

    from dcaforge.commands.common import DownloadBar, progress_bar

    for width in (80, 60):
        buf = io.StringIO()
        console = Console(file=buf, width=width, force_terminal=True, color_system=None)
        bar = progress_bar(console)
        task = bar.add_task("build", total=None, step="configure", item="/usr/bin/cmake -S " + "x" * 200)
        with bar:
            bar.update(task, completed=1234, total=4567, step="build",
                       item="Building CXX object tools/server/CMakeFiles/llama-server-impl.dir/" + "y" * 200)
            bar.refresh()
        lines = [re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", ln) for ln in buf.getvalue().replace("\r", "\n").splitlines()]
        assert lines and max(len(ln) for ln in lines) <= width, lines
        assert any("1234/4567" in ln and "Building CXX" in ln for ln in lines), lines
    # the download's lines in a log: a line at each tenth, within 80 columns
    buf = io.StringIO()
    bar_ = DownloadBar(Console(file=buf, width=200, force_terminal=False))
    for done in range(0, 76_600_001, 7_660_000):
        bar_(done, 76_600_000)
    bar_.close()
    said = buf.getvalue().splitlines()
    assert said[0] == "  download: 0.0 MB of 76.6 MB" and said[-1] == "  download: 76.6 MB of 76.6 MB"
    assert len(said) == 11 and all(len(ln) <= 80 for ln in said)


def test_e2e_builds_name_their_targets() -> None:
    """The default build grew (llama-server, llama-cli, ...): every build of the shared e2e room names its targets,
    so the suite compiles only what its tests need, whatever the default is."""
    import ast

    calls = []
    for path in sorted((Path(__file__).resolve().parents[1] / "e2e").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("dcaforge", "old_dcaforge")
                    and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value == "build"):
                args = [a.value for a in node.args if isinstance(a, ast.Constant)]
                calls.append((path.name, node.lineno, args))
    assert len(calls) >= 8, calls
    missing = [(name, line) for name, line, args in calls if "--targets" not in args and "--dry-run" not in args]
    assert not missing, f"e2e builds without --targets: {missing}"

@needs
def test_dry_run_refuses_an_unrendered_room(tmp_path: Path) -> None:
    """`build --dry-run` on a room whose feature is not rendered said "ok: every file the feature adds is
    compiled and linked" (nothing was added, so nothing was missing): now refused as capture refuses it."""
    src = tmp_path / "llamafile"
    git_init(src, {"Makefile": "o//llamafile/llamafile:\n\t@true\n", "llama.cpp/src/llama.cpp": "int x;\n", ".gitignore": "/o\n"})
    cfg = _feature_room(
        tmp_path, {"src/added.cpp.j2": "int added;\n",
                   "manifest.yaml": "files:\n- template: src/added.cpp.j2\n  dest: src/added.cpp\nedits: []\n"},
        f"name: lf\ncleanroom: ../ws\nsource:\n  git: {src}\nllama_cpp_dir: llama.cpp\n"
        "feature:\n  number: 78\n  name: feat\n  templates: templates/feat\n  marker: '// m'\n"
        "build:\n  backend: llamafile\n  llamafile:\n    programs: [o//llamafile/llamafile]\n", render=False)
    cfgp = tmp_path / "work" / "dcaforge.yaml"
    with pytest.raises(DcaforgeError) as ei:
        bmod.dry_run(cfg)
    assert ei.value.message == "nothing checked by the dry run: the feature is not rendered in the clean room"
    assert ei.value.hint == "`dcaforge render` (or `dcaforge apply`), then `dcaforge build --dry-run`"
    r = CliRunner().invoke(app, ["build", "--dry-run", "-c", str(cfgp)])
    assert r.exit_code == 1 and "ok: every file" not in r.output
    apply(cfg)  # rendered: the dry run runs (make -n) and finds the added file in no make list
    rep = bmod.dry_run(cfg, trust=True)
    assert [(r.source, r.status) for r in rep.wiring.rows] == [("llama.cpp/src/added.cpp", "unbuilt")]  # type: ignore[attr-defined]
