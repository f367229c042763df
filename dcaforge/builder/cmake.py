"""The cmake build (upstream llama.cpp): configure once into ``build.cmake.dir`` (``--cuda``:
``build.cmake.cuda_dir`` with ``-DGGML_CUDA=ON`` and the configured architectures), with ccache when installed,
then the generator (Ninja) builds the targets. A configure runs again only when its arguments change (they are
stamped in the build folder); ninja itself re-runs cmake when a CMakeLists.txt changes. And where each target's
file lands (ninja's own record of it)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from dcaforge.builder.preflight import build_targets, require_wiring
from dcaforge.builder.runner import BuildResult, Runner
from dcaforge.builder.toolchain import HOW, find_nvcc, require_tool
from dcaforge.builder.worktree import exclude_output
from dcaforge.config import Config
from dcaforge.errors import DcaforgeError
from dcaforge.git import run
from dcaforge.room.cleanroom import Room

#: -D settings every cmake build gets unless the config's ``build.cmake.defines`` says otherwise:
#: static libraries (the gates link the logits dumper against libllama.a), no network pieces.
#: llama-server is configured (the RULER gates drive it over HTTP) but built only when a target names
#: it; its web UI is left out (no npm build, no download of prebuilt assets at build time: the server
#: then serves the API without the UI pages).
DEFAULT_DEFINES: tuple[tuple[str, str], ...] = (
    ("CMAKE_BUILD_TYPE", "Release"),
    ("BUILD_SHARED_LIBS", "OFF"),
    ("LLAMA_CURL", "OFF"),
    ("LLAMA_OPENSSL", "OFF"),
    ("LLAMA_BUILD_SERVER", "ON"),
    ("LLAMA_BUILD_UI", "OFF"),
    ("LLAMA_USE_PREBUILT_UI", "OFF"),
    ("LLAMA_BUILD_TESTS", "ON"),
)
STAMP = "dcaforge-configure.json"

#: What a native build leaves out on a CPU with AMX. Upstream ggml's AMX kernels (ggml-cpu/amx, compiled when
#: -march=native turns AMX on) load a tile configuration that the compiler has reduced to its palette byte (GCC 12:
#: the stores of rows and colsb before ldtilecfg are dropped), so the first ``tilezero`` stops the program with SIGILL
#: (llama.cpp pull request 26954). Without AMX, ggml uses its AVX-512 kernels. A config that sets GGML_NATIVE, or
#: CMAKE_C_FLAGS / CMAKE_CXX_FLAGS, builds as it says instead.
NO_AMX_FLAGS = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


def host_has_amx(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this machine's CPU reports AMX tiles (Linux's /proc/cpuinfo flag ``amx_tile``)."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return False
    return any(line.startswith("flags") and "amx_tile" in line.split() for line in text.splitlines())


def _on(value: str) -> bool:
    return value.strip().upper() in ("ON", "TRUE", "1", "YES", "Y")


def leaves_out_amx(defines: dict[str, str], *, amx: bool) -> bool:
    """Whether a configure with ``defines`` (everything merged) on a host with ``amx`` gets :data:`NO_AMX_FLAGS`:
    a native build (GGML_NATIVE unset or on) whose C and C++ flags the config leaves alone."""
    return (amx and _on(defines.get("GGML_NATIVE", "ON"))
            and "CMAKE_C_FLAGS" not in defines and "CMAKE_CXX_FLAGS" not in defines)


def cmake_configure_args(cfg: Config, source: Path, build_dir: Path, *, cuda: bool, ccache: bool,
                         nvcc: str | None = None, amx: bool = False) -> list[str]:
    """The cmake configure command line (defaults, then the config's defines, then CUDA and the
    config's cuda_defines; on a host with ``amx``, a native build without AMX: :data:`NO_AMX_FLAGS`)."""
    c = cfg.build.cmake
    defines = dict(DEFAULT_DEFINES)
    defines["GGML_CCACHE"] = "ON" if ccache else "OFF"
    defines.update(dict(c.defines))
    if cuda:
        defines["GGML_CUDA"] = "ON"
        defines["CMAKE_CUDA_ARCHITECTURES"] = c.cuda_architectures
        defines.update(dict(c.cuda_defines))
        if nvcc:
            defines.setdefault("CMAKE_CUDA_COMPILER", nvcc)
    if leaves_out_amx(defines, amx=amx):
        defines["CMAKE_C_FLAGS"] = defines["CMAKE_CXX_FLAGS"] = NO_AMX_FLAGS
    return ["cmake", "-S", str(source), "-B", str(build_dir), "-G", c.generator,
            *[f"-D{k}={v}" for k, v in defines.items()]]


def configure_argv(cfg: Config, cmake: str, source: Path, build_dir: Path, *, cuda: bool, ccache: bool,
                   nvcc: str | None) -> list[str]:
    """:func:`cmake_configure_args` with the cmake found on this machine, for this machine's CPU."""
    args = cmake_configure_args(cfg, source, build_dir, cuda=cuda, ccache=ccache, nvcc=nvcc, amx=host_has_amx())
    args[0] = cmake
    return args


def stamp_of(args: Sequence[str]) -> str:
    """What :data:`STAMP` holds for a configure with ``args``: the build folder is configured so when it matches."""
    return json.dumps({"argv": list(args[1:])}, sort_keys=True)


def cmake_source(cfg: Config, tree: Path) -> Path:
    """The folder of llama.cpp's CMakeLists.txt in ``tree``; a DcaforgeError when there is none."""
    source = tree / cfg.llama_cpp_dir
    if not (source / "CMakeLists.txt").is_file():
        raise DcaforgeError(f"no CMakeLists.txt in {source}", where=str(source),
                            hint="check 'llama_cpp_dir:' in the config, or use build.backend: llamafile")
    return source


def build_cmake(cfg: Config, room: Room, tree: Path, variant: str, cuda: bool, targets: Sequence[str] | None,
                jobs: int, log: Path, ccache: bool, runner: Runner) -> BuildResult:
    """Configure (when its arguments changed) and build the targets in ``tree`` (the room or the baseline's
    worktree); the result names the programs built."""
    c = cfg.build.cmake
    tgts = build_targets(cfg, targets, c.targets, "build.cmake.targets")
    cmake = require_tool("cmake", HOW["cmake"])
    gen = c.generator.lower()
    tool = _generator_tool(gen)
    nvcc = find_nvcc() if cuda else None
    if variant == "feature":
        require_wiring(cfg, room, tree)
    source = cmake_source(cfg, tree)
    rel_dir = c.cuda_dir if cuda else c.dir
    build_dir = tree / rel_dir
    exclude_output(room, tree, rel_dir)
    res = BuildResult(backend="cmake", variant=variant, tree=tree, source=source, build_dir=build_dir, cuda=cuda,
                      targets=tgts, jobs=jobs, log=log, ccache=ccache)
    args = configure_argv(cfg, cmake, source, build_dir, cuda=cuda, ccache=ccache, nvcc=nvcc)
    if f"-DCMAKE_CXX_FLAGS={NO_AMX_FLAGS}" in args:
        res.notes.append(f"this CPU has AMX: built native without it ({NO_AMX_FLAGS}), since upstream ggml's AMX "
                         "kernels stop with SIGILL as GCC builds them (llama.cpp pull request 26954); set GGML_NATIVE "
                         "or CMAKE_CXX_FLAGS in build.cmake.defines to build otherwise")
    _configure(runner, args, tree, source, build_dir, ninja=gen == "ninja")
    if gen == "ninja":
        argv = [tool, "-C", str(build_dir), f"-j{jobs}", *tgts]
    else:
        argv = [cmake, "--build", str(build_dir), "-j", str(jobs), *([a for t in tgts for a in ("--target", t)])]
    runner("build", argv, tree, diag_base=build_dir)
    res.outputs = [build_dir / "bin"]
    files = target_outputs(build_dir, tgts, ninja=tool if gen == "ninja" else None)
    res.programs = {t: f for t, f in files.items() if f is not None and _is_program(f)}
    return res


def _generator_tool(gen: str) -> str:
    """The program that runs the generator's build files (ninja, make), found; "" for another generator."""
    if gen == "ninja":
        return require_tool("ninja", HOW["ninja"])
    if "makefiles" in gen:
        return require_tool("make", HOW["make"])
    return ""


def _configure(runner: Runner, args: list[str], tree: Path, source: Path, build_dir: Path, *, ninja: bool) -> None:
    """The configure step, skipped when the build folder is generated and stamped with the same ``args``."""
    stamp = build_dir / STAMP
    generated = (build_dir / "build.ninja").exists() if ninja else (build_dir / "CMakeCache.txt").exists()
    want = stamp_of(args)
    if generated and stamp.is_file() and stamp.read_text() == want:
        runner.skipped("configure", args)
    else:
        build_dir.mkdir(parents=True, exist_ok=True)
        runner("configure", args, tree, diag_base=source)
        stamp.write_text(want)


def _is_program(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK) and path.suffix not in (".a", ".so", ".dylib", ".o")


def target_outputs(build_dir: Path, targets: Sequence[str], *, ninja: str | None) -> dict[str, Path | None]:
    """Where each target's file is (or will be) in ``build_dir``: ninja's own record of it (``ninja -t query``: a
    phony target's one input, e.g. ``bin/llama-server``), else ``bin/T`` or ``T`` where such a file exists; None
    when neither tells (a target of several files, or not built yet under Makefiles)."""
    found: dict[str, Path | None] = {}
    if ninja is not None and targets and (build_dir / "build.ninja").is_file():
        res = run([ninja, "-C", str(build_dir), "-t", "query", *targets], build_dir, check=False)
        found = _parse_query(res.stdout, build_dir)
        for t in targets:  # an unknown target ends the query (exit 1): those after it, one at a time
            if t not in found and not res.ok:
                found.update(_parse_query(run([ninja, "-C", str(build_dir), "-t", "query", t], build_dir,
                                              check=False).stdout, build_dir))
    for t in targets:
        if found.get(t) is None:
            found[t] = next((p for p in (build_dir / "bin" / t, build_dir / t) if p.is_file()), None)
    return {t: found.get(t) for t in targets}


def _parse_query(text: str, build_dir: Path) -> dict[str, Path | None]:
    """``ninja -t query`` blocks: ``T:``, ``  input: RULE``, its inputs (4 spaces), ``  outputs:``, ..."""
    out: dict[str, Path | None] = {}
    target: str | None = None
    rule: str | None = None
    inputs: list[str] = []
    section = ""

    def close() -> None:
        if target is None:
            return
        if rule == "phony":
            files = [i for i in inputs if not i.startswith(("|", "||"))]
            out[target] = build_dir / files[0] if len(files) == 1 else None
        else:
            out[target] = build_dir / target  # built by a rule of its own: the target is the file
    for line in text.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            close()
            target, rule, inputs, section = line[:-1], None, [], ""
        elif line.startswith("  input: "):
            rule, section = line.split(":", 1)[1].strip(), "input"
        elif line.startswith("  outputs:") or line.startswith("  validations:"):
            section = "outputs"
        elif line.startswith("    ") and section == "input":
            inputs.append(line.strip())
    close()
    return out
