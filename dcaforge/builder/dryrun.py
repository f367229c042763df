"""llamafile's build without its toolchain: the real Makefile in dry-run mode and the GPU library
script with a recording nvcc, so a machine without cosmocc (or without a GPU) still proves what
the build would compile and link.

- :func:`make_dry_run`: ``make -n`` in the tree with ``COSMOCC=<stand-in>`` on the command line (a
  folder of small scripts named like cosmocc's binaries; under ``-n`` make runs none of them except
  ``mkdeps``, which remakes the included ``o//depend``). The printed commands give, per object,
  its compile command, and per archive and program, its ``ar``/link command.
- :func:`script_dry_run`: the GPU library script run with a stand-in ``nvcc`` that records its
  arguments and writes an empty output, wherever the script looks for its compiler: first on PATH
  (and PATH's folders that hold a real ``nvcc`` or ``hipcc`` left out), ``CUDACXX`` and ``NVCC``,
  and ``$CUDA_PATH/bin/nvcc``, ``$CUDA_HOME/bin/nvcc`` and the like (llamafile 0.10's cuda.sh runs
  ``${CUDA_PATH:-/usr/local/cuda}/bin/nvcc``); ``HOME``, ``XDG_CACHE_HOME`` and ``TMPDIR`` point into
  the scratch folder too, so what the script cleans or caches under them stays there; gcc, g++, cc,
  c++ and strip (which 0.10.x's script calls for ggml's core) are stand-ins too. The recorded
  flags are what :func:`nvcc_compile_args` reuses to compile single translation units with the real nvcc.

Both run code of the tree (make evaluates the Makefile's ``$(shell ...)`` even under ``-n``), so
:func:`dcaforge.builder.plan_llamafile.dry_run` runs them only with the user's consent.
- :func:`host_compile_args`: a cosmocc compile command as the host's gcc/g++ takes it (cosmocc's
  own flags such as ``-mcosmo`` dropped), to compile a translation unit with the dry run's flags.

Everything the stand-ins write stays in a scratch folder or in the tree's ``o/`` (the build
folder the real build uses); nothing is downloaded.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
from dataclasses import dataclass, field
from pathlib import Path

from dcaforge.errors import CommandError
from dcaforge.git import run

#: cosmocc's binaries the Makefiles name (build/config.mk: $(COSMOCC)/bin/...).
COSMOCC_BINS = ("cosmocc", "cosmoc++", "ar.ape", "zipobj", "mkdeps", "make")

_RECORDER = """#!/bin/sh
# dcaforge stand-in for {name}: records its arguments, writes its -o output (empty)
log="{log}"
python3 - "$log" "{name}" "$@" <<'PY'
import json, os, sys
log, name, args = sys.argv[1], sys.argv[2], sys.argv[3:]
with open(log, "a") as fh:
    fh.write(json.dumps({{"tool": name, "cwd": os.getcwd(), "argv": args}}) + "\\n")
if "-o" in args and args.index("-o") + 1 < len(args):
    out = args[args.index("-o") + 1]
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    open(out, "ab").close()
PY
"""


def write_recorders(folder: Path, names: tuple[str, ...], log: Path) -> Path:
    """Stand-in executables ``folder/<name>`` that append ``{tool, cwd, argv}`` to ``log``."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        p = folder / name
        p.write_text(_RECORDER.format(name=name, log=log))
        p.chmod(p.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return folder


def cosmocc_standin(folder: Path) -> Path:
    """A folder laid out like cosmocc (``bin/cosmocc`` ...) whose tools only record their calls."""
    write_recorders(folder / "bin", COSMOCC_BINS, folder / "calls.jsonl")
    return folder


@dataclass
class Command:
    argv: list[str]
    output: str | None  # the -o argument (or the archive of `ar`)
    sources: list[str] = field(default_factory=list)  # .c/.cpp/.cu arguments

    @property
    def line(self) -> str:
        return shlex.join(self.argv)


@dataclass
class MakeDryRun:
    argv: list[str]
    commands: list[Command]
    output: str

    def compiles(self) -> dict[str, Command]:
        """source -> its compile command (``-c``)."""
        return {s: c for c in self.commands if "-c" in c.argv for s in c.sources}

    def producing(self, output: str) -> Command | None:
        norm = os.path.normpath(output)
        return next((c for c in self.commands if c.output and os.path.normpath(c.output) == norm), None)

    def archives(self) -> dict[str, Command]:
        return {c.output: c for c in self.commands if c.output and c.output.endswith(".a") and "-c" not in c.argv}

    def links(self) -> dict[str, Command]:
        """program -> its link command (an ``-o`` output that is neither an object nor an archive)."""
        return {c.output: c for c in self.commands
                if c.output and "-c" not in c.argv and not c.output.endswith((".o", ".a")) and c.sources == []}

    def linked_objects(self, program: str) -> set[str]:
        """The objects on ``program``'s link line, those inside the archives on it included."""
        cmd = self.links().get(program) or self.producing(program)
        if cmd is None:
            return set()
        archives = self.archives()
        objs: set[str] = set()
        for a in cmd.argv:
            n = os.path.normpath(a)
            if n.endswith(".o"):
                objs.add(n)
            elif a in archives or any(os.path.normpath(k) == n for k in archives):
                arc = archives.get(a) or next(v for k, v in archives.items() if os.path.normpath(k) == n)
                objs |= {os.path.normpath(x) for x in arc.argv if x.endswith(".o")}
        return objs


SOURCE_EXTS = (".c", ".cc", ".cpp", ".cu")


def parse_commands(text: str) -> list[Command]:
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("make", "#")):
            continue
        try:
            argv = shlex.split(line)
        except ValueError:
            continue
        if not argv:
            continue
        output = None
        if "-o" in argv and argv.index("-o") + 1 < len(argv):
            output = argv[argv.index("-o") + 1]
        elif os.path.basename(argv[0]).startswith(("ar", "ar.ape")) and len(argv) > 2:
            output = argv[2]
        sources = [a for a in argv[1:] if a.endswith(SOURCE_EXTS) and not a.startswith("-")]
        out.append(Command(argv=argv, output=output, sources=sources))
    return out


def scratch_env(scratch: Path) -> dict[str, str]:
    """``HOME``, ``XDG_CACHE_HOME`` and ``TMPDIR`` inside ``scratch``, and no make settings from the
    environment (``MAKEFLAGS``, ``MAKEFILES`` would add options and makefiles): what a dry run's
    commands write under them stays in the scratch folder."""
    home = scratch / "home"
    for d in (home / ".cache", scratch / "tmp"):
        d.mkdir(parents=True, exist_ok=True)
    return {"HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"), "TMPDIR": str(scratch / "tmp"),
            "MAKEFLAGS": "", "MFLAGS": "", "GNUMAKEFLAGS": "", "MAKEFILES": ""}


def make_dry_run(tree: Path, targets: list[str], *, cosmocc: Path, make: str = "make",
                 extra: list[str] | None = None, scratch: Path | None = None) -> MakeDryRun:
    """``make -n`` of ``targets`` in ``tree`` with the stand-in ``cosmocc`` (made by
    :func:`cosmocc_standin`; ``scratch``: the folder for :func:`scratch_env`, default beside it).
    Raises CommandError when make fails (e.g. a source it needs is missing)."""
    argv = [make, "-n", "--no-print-directory", f"COSMOCC={cosmocc}", *(extra or []), "--", *targets]
    env = {"LC_ALL": "C", **scratch_env(scratch or cosmocc.parent)}
    res = run(argv, tree, check=False, what="make -n (dry run)", env=env)
    if not res.ok:
        tail = "\n".join((res.stderr or res.stdout).strip().splitlines()[-15:])
        raise CommandError(f"make -n failed (exit {res.returncode}) in {tree}", where=shlex.join(argv),
                           details=tail, hint="the Makefile cannot plan the build: fix what it names, then run again")
    return MakeDryRun(argv=argv, commands=parse_commands(res.stdout), output=res.stdout)


def object_of(dry: MakeDryRun, source: str) -> str | None:
    cmd = dry.compiles().get(source)
    return os.path.normpath(cmd.output) if cmd and cmd.output else None


# --- the GPU library script ---------------------------------------------------------------

@dataclass
class ScriptDryRun:
    argv: list[str]
    calls: list[dict]  # {tool, cwd, argv} of each nvcc (and host compiler) call
    output: str
    tree: Path | None = None

    def nvcc_calls(self) -> list[list[str]]:
        return [c["argv"] for c in self.calls if c["tool"] == "nvcc"]

    def sources(self) -> list[str]:
        """Every .cu the script hands nvcc, relative to the tree (llamafile 0.10.x's script names them by
        absolute paths, "$SCRIPT_DIR/../llama.cpp/...")."""
        out = []
        for c in self.calls:
            if c["tool"] != "nvcc":
                continue
            for a in c["argv"]:
                if not a.endswith(".cu") or a.startswith("-"):
                    continue
                full = os.path.normpath(os.path.join(c.get("cwd") or "", a))
                if self.tree is not None and os.path.isabs(full):
                    root = os.path.realpath(self.tree)
                    real = os.path.realpath(full)
                    full = os.path.relpath(real, root) if real.startswith(root + os.sep) else full
                out.append(full)
        return out


#: stand-ins the GPU script finds: nvcc (everywhere: compiler_standins) and the host compilers and strip
#: (llamafile 0.10.x's script compiles ggml's core with gcc/g++ itself)
SCRIPT_TOOLS = ("nvcc", "gcc", "g++", "cc", "c++", "strip")


#: The GPU compilers a build script may find on PATH: folders holding one are left out of its PATH.
GPU_COMPILERS = ("nvcc", "hipcc")
#: Where build scripts look for a CUDA (or ROCm) toolkit besides PATH (``$X/bin/nvcc``): all the stand-in.
TOOLKIT_VARS = ("CUDA_PATH", "CUDA_HOME", "CUDA_ROOT", "CUDA_TOOLKIT_ROOT_DIR", "CUDAToolkit_ROOT", "CUDA_BIN_PATH",
                "HIP_PATH", "ROCM_PATH")


def _path_without_compilers(path: str) -> str:
    """``path`` without its folders that hold one of :data:`GPU_COMPILERS`."""
    keep = [d for d in path.split(os.pathsep)
            if d and not any(os.access(os.path.join(d, c), os.X_OK) for c in GPU_COMPILERS)]
    return os.pathsep.join(keep)


def compiler_standins(scratch: Path, log: Path) -> dict[str, str]:
    """The environment in which every way a script finds nvcc finds the recording stand-in: a toolkit
    folder ``scratch/toolkit`` (``bin/nvcc`` and the host compilers of :data:`SCRIPT_TOOLS`) first on PATH, as ``CUDACXX`` and ``NVCC``, and as every
    toolkit variable (:data:`TOOLKIT_VARS`); PATH's folders holding a real GPU compiler are left out;
    ``HOME`` and the rest inside ``scratch`` (:func:`scratch_env`)."""
    toolkit = scratch / "toolkit"
    bin_dir = write_recorders(toolkit / "bin", SCRIPT_TOOLS, log)
    nvcc = str(bin_dir / "nvcc")
    return {**scratch_env(scratch), "PATH": os.pathsep.join(p for p in (str(bin_dir), _path_without_compilers(
        os.environ.get("PATH", ""))) if p), "CUDACXX": nvcc, "NVCC": nvcc, **dict.fromkeys(TOOLKIT_VARS, str(toolkit))}


def script_dry_run(tree: Path, script: str, args: list[str], scratch: Path,
                   env: dict[str, str] | None = None) -> ScriptDryRun:
    """Run the GPU library script with the recording ``nvcc`` wherever it looks for one
    (:func:`compiler_standins`); the script itself runs for real (only with consent: see the
    module's doc), no compiler does. Pass no ``--clean`` in ``args``: a dry run deletes nothing."""
    log = scratch / "nvcc-calls.jsonl"
    if log.exists():
        log.unlink()
    path = tree / script
    argv = [str(path)] if os.access(path, os.X_OK) else ["sh", str(path)]
    argv += args
    full_env = {**(env or {}), **compiler_standins(scratch, log)}
    res = run(argv, tree, check=False, what=f"{script} (dry run)", env=full_env)
    if not res.ok:
        raise CommandError(f"{script} failed with the stand-in nvcc (exit {res.returncode})", where=str(path),
                           details="\n".join((res.stderr or res.stdout).strip().splitlines()[-15:]))
    calls = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
    return ScriptDryRun(argv=argv, calls=calls, output=res.stdout + res.stderr, tree=tree)


def nvcc_compile_args(call: list[str], source: str, obj: str) -> list[str]:
    """The flags of one recorded nvcc call, for compiling ``source`` alone into ``obj``: the same
    options, without its sources, output, libraries and ``--shared``."""
    out = [a for a in _without_output(call)
           if a not in ("--shared", "-shared") and not (a.endswith(".cu") and not a.startswith("-"))
           and not (a.startswith("-l") or a.endswith((".o", ".a", ".so")) and not a.startswith("-"))]
    return [*out, "-c", source, "-o", obj]


def _without_output(argv: list[str]) -> list[str]:
    """``argv`` without ``-o`` and the argument after it."""
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a == "-o":
            skip = True
        else:
            out.append(a)
    return out


# --- cosmocc commands for the host compiler -------------------------------------------------

#: cosmocc's own options, which gcc does not take (and the fat-binary cross options).
_COSMO_ONLY = ("-mcosmo", "-mclang", "-mgcc", "-mtiny", "-mdbg")


def host_compile_args(cmd: Command, source: str, obj: str) -> list[str]:
    """A cosmocc compile command as gcc/g++ takes it: cosmocc's own options and its ``-X<arch>-...``
    per-architecture options left out, the output moved to ``obj``."""
    cxx = source.endswith((".cpp", ".cc")) or os.path.basename(cmd.argv[0]).endswith("c++")
    flags = [a for a in _without_output(cmd.argv[1:])
             if a not in _COSMO_ONLY and not a.startswith(("-Xx86_64", "-Xaarch64")) and a != source]
    return ["g++" if cxx else "gcc", *flags, "-o", obj, source]
