"""``dcaforge build``: build the clean room (or the baseline, in its own worktree) with the
configured backend.

- ``cmake`` (upstream llama.cpp): configure once into ``build.cmake.dir`` (``--cuda``:
  ``build.cmake.cuda_dir`` with ``-DGGML_CUDA=ON`` and the configured architectures), with ccache
  when installed (``CCACHE_BASEDIR`` = the workspace, so another checkout of the same layout
  reuses the objects), then the generator (Ninja) builds the targets. A configure runs again
  only when its arguments change; ninja itself re-runs cmake when a CMakeLists.txt changes.
- ``llamafile``: the ``make`` llamafile's Makefile drives with its cosmocc toolchain
  (``.cosmocc/<version>`` in the tree, which dcaforge never downloads), and for ``--cuda``
  ``llamafile/cuda.sh --clean --output <inside the clean room>`` with the configured flags.

``--baseline`` builds the ``dcaforge/baseline`` tag (series applied, no feature) in a git
worktree ``<workspace>/<name>-baseline`` next to the clean room; moving it to a new baseline
checks out only the files that changed, so its build stays incremental too.

Every command's output goes to a log under ``<room>/.git/dcaforge/logs/``; progress is read from
the ``[n/N]`` (ninja, cosmocc make) or ``[ NN%]`` (cmake's Makefiles) lines; a failure raises
:class:`~dcaforge.errors.BuildError` with the first compiler error and the log's path.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dcaforge import guard
from dcaforge.room.cleanroom import BASELINE_TAG, Room, locked
from dcaforge.config import Config
from dcaforge.errors import BuildError, ConfigError, DcaforgeError, MismatchError, SafetyError, ToolchainError
from dcaforge.git import git, rev_parse, run, run_streaming

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
LOGS_KEPT = 20

# --- reading build output ------------------------------------------------------------------

_NINJA_STATUS = re.compile(r"^\[(\d+)/(\d+)\]\s*(.*)$")
_PERCENT = re.compile(r"^\[\s*(\d{1,3})%\]\s*(.*)$")


@dataclass(frozen=True)
class Progress:
    done: int
    total: int
    text: str


def parse_progress(line: str) -> Progress | None:
    """``[12/345] Building CXX object ...`` (ninja, cosmocc make) or ``[ 45%] Building ...``
    (cmake's Makefiles, as 45/100); None for any other line."""
    m = _NINJA_STATUS.match(line)
    if m:
        done, total = int(m.group(1)), int(m.group(2))
        if 0 <= done <= total and total > 0:
            return Progress(done, total, m.group(3).strip())
        return None
    m = _PERCENT.match(line)
    if m and int(m.group(1)) <= 100:
        return Progress(int(m.group(1)), 100, m.group(2).strip())
    return None


@dataclass(frozen=True)
class Diagnostic:
    """The first error of a failed build."""

    message: str
    file: str | None = None
    line: int | None = None
    column: int | None = None
    context: tuple[str, ...] = ()  # the lines after it (the compiler's excerpt, CMake's message)
    target: str | None = None  # ninja's FAILED: line

    def location(self) -> str | None:
        if self.file is None:
            return None
        loc = self.file
        if self.line is not None:
            loc += f":{self.line}"
            if self.column is not None:
                loc += f":{self.column}"
        return loc


_GCC_ERROR = re.compile(
    r"^(?P<file>[^\s:][^:]*?):(?P<line>\d+)(?::(?P<col>\d+))?:\s+(?:fatal\s+)?error:\s*(?P<msg>.+)$")
_NVCC_ERROR = re.compile(
    r"^(?P<file>[^\s(][^(]*?)\((?P<line>\d+)\):\s+(?:catastrophic\s+)?error:?\s*(?P<msg>.+)$")
_CMAKE_ERROR = re.compile(r"^CMake Error(?: at (?P<file>[^:]+?):(?P<line>\d+))?(?:\s*\([^)]*\))?:\s*(?P<msg>.*)$")
_LINK_ERROR = re.compile(r"(?P<msg>undefined reference to .+|multiple definition of .+|"
                         r"(?:ld|ld\.\w+|lld|collect2)(?:\.exe)?: (?:fatal )?error: .+|cannot find -l\S+)")
_FAILED = re.compile(r"^FAILED: (?:\[code=\d+\] )?(?P<target>.+)$")
_MAKE_ERROR = re.compile(r"^g?make(?:\[\d+\])?: \*\*\* (?P<msg>.+)$")


def first_error(lines: Iterable[str], *, base: Path | None = None) -> Diagnostic | None:
    """The first compiler, linker or CMake error in build output (``file:line: message``), else
    the first failed target or make error; relative paths are made absolute against ``base``."""
    seq = list(lines)
    target: str | None = None
    fallback: Diagnostic | None = None
    for i, line in enumerate(seq):
        m = _FAILED.match(line)
        if m:
            target = target or m.group("target").strip()
            continue
        for rx in (_GCC_ERROR, _NVCC_ERROR):
            m = rx.match(line)
            if m:
                return Diagnostic(message=m.group("msg").strip(), file=_abs(m.group("file"), base),
                                  line=int(m.group("line")),
                                  column=int(m.group("col")) if "col" in m.groupdict() and m.group("col") else None,
                                  context=_context(seq, i + 1, stop_at_blank=False), target=target)
        m = _CMAKE_ERROR.match(line)
        if m:
            ctx = _context(seq, i + 1, stop_at_blank=True, n=8)
            msg = m.group("msg").strip() or " ".join(c.strip() for c in ctx[:2]) or "CMake Error"
            return Diagnostic(message=msg, file=_abs(m.group("file"), base) if m.group("file") else None,
                              line=int(m.group("line")) if m.group("line") else None, context=ctx, target=target)
        m = _LINK_ERROR.search(line)
        if m:
            return Diagnostic(message=m.group("msg").strip(), context=_context(seq, i + 1, stop_at_blank=False, n=3),
                              target=target)
        m = _MAKE_ERROR.match(line)
        if m and fallback is None:
            fallback = Diagnostic(message=m.group("msg").strip(), target=target)
    if fallback is not None:
        return fallback
    if target is not None:
        return Diagnostic(message=f"{target} failed", target=target)
    return None


def _abs(path: str, base: Path | None) -> str:
    p = Path(path)
    if base is not None and not p.is_absolute():
        return os.path.normpath(base / p)
    return path


def _context(seq: list[str], start: int, *, stop_at_blank: bool, n: int = 4) -> tuple[str, ...]:
    out: list[str] = []
    for line in seq[start:start + n]:
        if stop_at_blank and not line.strip() and out:
            break
        if _FAILED.match(line) or _NINJA_STATUS.match(line) or _GCC_ERROR.match(line) or line.startswith(("ninja: ", "make")):
            break
        out.append(line)
    return tuple(out)


# --- toolchains ----------------------------------------------------------------------------

def _which(name: str) -> str | None:
    return shutil.which(name)


def require_tool(name: str, how: str, *, path: str | None = None, setting: str | None = None,
                 where: str | None = None) -> str:
    """The path of ``name`` (or ``path`` when given and executable); a ToolchainError otherwise.
    ``setting``/``where``: the config key that gave ``path`` and its file, for the error (the fix is
    the config then, not an install)."""
    if path is not None:
        found = path if os.access(path, os.X_OK) and not os.path.isdir(path) else _which(path)
    else:
        found = _which(name)
    if not found and setting is not None:
        raise ConfigError(f"{setting} is {path!r}, which is neither an executable file nor a program on PATH",
                          where=where,
                          hint=f"set {setting} to the path of {name} (an executable file), or remove it to use the "
                               f"tree's own {name} (else {name} on PATH); then run the same command again")
    if not found:
        raise ToolchainError(f"{path or name} is not installed (or not on PATH); the build needs it",
                             where="$PATH", hint=how)
    return found


HOW = {
    "cmake": "install CMake >= 3.14: `apt-get install cmake` or `pip install cmake`",
    "ninja": "install Ninja: `apt-get install ninja-build` or `pip install ninja` "
             "(or set build.cmake.generator: 'Unix Makefiles' in the config)",
    "make": "install GNU make: `apt-get install make`",
    "nvcc": "install the CUDA toolkit (https://developer.nvidia.com/cuda-downloads) and put its bin/ on PATH, "
            "or point CUDACXX at nvcc; or build without --cuda",
}


#: Where the CUDA toolkit puts nvcc when it is not on PATH.
CUDA_NVCC = "/usr/local/cuda/bin/nvcc"


def find_nvcc() -> str:
    env = os.environ.get("CUDACXX")
    for cand in (env, _which("nvcc"), CUDA_NVCC):
        if cand and os.access(cand, os.X_OK):
            return cand
    raise ToolchainError("nvcc (the CUDA compiler) is not installed; --cuda needs it", hint=HOW["nvcc"])


_COSMOCC_LINE = re.compile(r"^COSMOCC\s*[:?]?=\s*(\S+)\s*$", re.MULTILINE)
_COSMOCC_RULE = r"(?m)^{target}:[^\n]*\n\t(build/download-cosmocc\.sh) \$@ (\S+) ([0-9a-f]{{64}})"


def cosmocc_rel(tree: Path) -> str:
    """``.cosmocc/<version>`` as llamafile's build/config.mk names it."""
    mk = tree / "build" / "config.mk"
    if not mk.is_file():
        raise DcaforgeError(f"{tree} has no build/config.mk: not a llamafile tree", where=str(mk),
                            hint="set build.backend: cmake for upstream llama.cpp")
    m = _COSMOCC_LINE.search(mk.read_text(encoding="utf-8", errors="replace"))
    return m.group(1) if m else ".cosmocc"


def cosmocc_download_command(tree: Path, rel: str) -> str | None:
    """The download command llamafile's own rule for ``rel`` runs (``build/download-cosmocc.sh
    .cosmocc/4.0.2 4.0.2 <sha256>``), read from build/config.mk; None when there is no such rule."""
    mk = tree / "build" / "config.mk"
    text = mk.read_text(encoding="utf-8", errors="replace") if mk.is_file() else ""
    m = re.search(_COSMOCC_RULE.format(target=re.escape(rel)), text)
    return f"{m.group(1)} {rel} {m.group(2)} {m.group(3)}" if m else None


def cosmocc_dir(tree: Path, would_run: Sequence[str] = ()) -> Path:
    """The cosmocc folder llamafile's build/config.mk names (``.cosmocc/<version>``), which must
    already hold bin/cosmocc: dcaforge never downloads it. ``would_run``: the commands the build
    would run, for the error."""
    rel = cosmocc_rel(tree)
    folder = tree / rel
    if not (folder / "bin" / "cosmocc").exists():
        dl = cosmocc_download_command(tree, rel)
        # a subshell: the shell that pastes it stays in its folder, where the `dcaforge build -c CONFIG` after it
        # (a relative CONFIG too) still names the config
        how = (f"`(cd {shlex.quote(str(tree))} && {dl})` (llamafile's own rule for {rel} in build/config.mk; it downloads "
               "cosmocc.zip and checks its sha256)" if dl else
               f"`(cd {shlex.quote(str(tree))} && build/download-cosmocc.sh {rel} VERSION SHA256)` (the values are in "
               "llamafile's build/config.mk)")
        raise ToolchainError(
            f"cosmocc is not in the tree: {folder}/bin/cosmocc is missing, so llamafile's make cannot run "
            "(its Makefile would download cosmocc; dcaforge never downloads it for you)",
            where=str(tree / "build" / "config.mk"),
            details="\n".join(["it would run, in " + str(tree) + ":", *("  " + c for c in would_run)]) if would_run else None,
            hint=f"get cosmocc yourself: {how}, or unzip cosmocc.zip from https://cosmo.zip/pub/cosmocc/ into {folder}; "
                 "then run the same `dcaforge build` again. Without cosmocc, `dcaforge build --dry-run` runs the "
                 "Makefile in dry-run mode with a stand-in toolchain and checks that the feature is compiled and linked")
    return folder


# --- where to build ------------------------------------------------------------------------

def baseline_path(cfg: Config) -> Path:
    return cfg.workspace / f"{cfg.name}-baseline"


def _worktree_gitdir(wt: Path) -> Path | None:
    """The gitdir a worktree's ``.git`` file points to, or None when it is not such a file."""
    dotgit = wt / ".git"
    if not dotgit.is_file():
        return None
    text = dotgit.read_text(errors="replace").strip()
    if not text.startswith("gitdir:"):
        return None
    return Path(text.split(":", 1)[1].strip())


def ensure_baseline_worktree(cfg: Config, room: Room, keep: Sequence[str] = ()) -> Path:
    """``<workspace>/<name>-baseline``: a detached worktree of the room at the baseline tag.
    A worktree at an older baseline is checked out forward (only changed files are written); one
    whose room was re-made is re-added, its build folders (``keep``) moved over."""
    rev = rev_parse(room.path, BASELINE_TAG)
    if rev is None:
        raise DcaforgeError("the clean room has no baseline (the series is not fully applied)",
                            where=str(room.path), hint="`dcaforge apply --continue`")
    wt = guard.own_folder(baseline_path(cfg), "the baseline worktree",
                          hint="move it away: dcaforge makes the baseline worktree itself (a git worktree of the "
                               "clean room); then run the same `dcaforge build --baseline` again")
    if wt.exists():
        gitdir = _worktree_gitdir(wt)
        ours = gitdir is not None and (room.path / ".git" / "worktrees") in gitdir.parents
        if not ours:
            if any(wt.iterdir()):
                raise SafetyError(f"{wt} exists and is not a worktree of the clean room; refusing to touch it",
                                  where=str(wt), hint="move that folder away, or choose another 'name:'")
            wt.rmdir()
        elif gitdir is not None and gitdir.is_dir():
            head = rev_parse(wt, "HEAD")
            if head != rev:
                git(wt, "checkout", "-q", "--detach", "--force", rev)
                git(wt, "clean", "-q", "-fd")
            return wt
        else:  # the room was made again: its worktree record is gone
            parked = room.workspace / f".{wt.name}.parked"
            guard.remove_leftover(parked, "the baseline's build folders while its worktree is made again")
            parked.mkdir()
            for rel in keep:
                if (wt / rel).is_dir():
                    (parked / rel).parent.mkdir(parents=True, exist_ok=True)
                    os.replace(wt / rel, parked / rel)
            shutil.rmtree(wt)
            git(room.path, "worktree", "prune")
            git(room.path, "worktree", "add", "-q", "--detach", wt, rev)
            for rel in keep:
                if (parked / rel).is_dir():
                    (wt / rel).parent.mkdir(parents=True, exist_ok=True)
                    os.replace(parked / rel, wt / rel)
            shutil.rmtree(parked)
            return wt
    git(room.path, "worktree", "prune")
    git(room.path, "worktree", "add", "-q", "--detach", wt, rev)
    return wt


def _exclude(room: Room, tree: Path, rel: str, *, folder: bool = True) -> None:
    """Keep a build output inside the tree out of ``capture``: add it to the room's
    ``.git/info/exclude`` (shared by its worktrees) unless git already ignores it."""
    probe = rel.rstrip("/") + ("/" if folder else "")
    if git(tree, "check-ignore", "-q", "--no-index", probe, check=False).returncode == 0:
        return
    info = room.path / ".git" / "info" / "exclude"
    info.parent.mkdir(parents=True, exist_ok=True)
    line = "/" + probe
    text = info.read_text() if info.exists() else ""
    if line not in text.splitlines():
        with open(info, "a", encoding="utf-8") as fh:
            fh.write(("\n" if text and not text.endswith("\n") else "") + line + "\n")


# --- the build -----------------------------------------------------------------------------

@dataclass
class BuildHooks:
    """Callbacks the CLI uses for live progress."""

    on_step: Callable[[str, tuple[str, ...]], None] | None = None  # (what, argv) before each command
    on_progress: Callable[[Progress], None] | None = None
    on_line: Callable[[str], None] | None = None


@dataclass(frozen=True)
class Step:
    what: str
    argv: tuple[str, ...]
    seconds: float
    progress: Progress | None  # the last [n/N] seen
    skipped: bool = False  # a configure that was up to date


@dataclass
class BuildResult:
    backend: str
    variant: str  # "feature" (the clean room) or "baseline"
    tree: Path  # the clean room or the baseline worktree
    source: Path  # where CMakeLists.txt / the Makefile is
    build_dir: Path
    cuda: bool
    targets: tuple[str, ...]
    jobs: int
    log: Path
    ccache: bool
    seconds: float = 0.0
    steps: list[Step] = field(default_factory=list)
    outputs: list[Path] = field(default_factory=list)
    programs: dict[str, Path] = field(default_factory=dict)  # each target built as an executable -> its file

    @property
    def compiled(self) -> int:
        """Edges ninja/make ran in the build step(s) (0: everything was up to date)."""
        return sum(s.progress.done for s in self.steps if s.progress and s.what != "configure")

    @property
    def bin_dir(self) -> Path:
        return self.build_dir / "bin"


def _log_path(room: Room, variant: str, cuda: bool) -> Path:
    logs = room.meta / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    prefix = f"build-{variant}{'-cuda' if cuda else ''}"
    old = sorted(logs.glob(f"{prefix}-*.log"))
    for p in old[:-(LOGS_KEPT - 1)] if len(old) >= LOGS_KEPT else []:
        p.unlink()
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime())
    path = logs / f"{prefix}-{stamp}.log"
    n = 1
    while path.exists():
        n += 1
        path = logs / f"{prefix}-{stamp}-{n}.log"
    return path


class _Runner:
    def __init__(self, log: Path, hooks: BuildHooks, env: dict[str, str]) -> None:
        self.log, self.hooks, self.env = log, hooks, env
        self.steps: list[Step] = []

    def __call__(self, what: str, argv: Sequence[str | os.PathLike[str]], cwd: Path, *, diag_base: Path) -> Step:
        args = tuple(os.fspath(a) for a in argv)
        if self.hooks.on_step:
            self.hooks.on_step(what, args)
        last: list[Progress] = []
        start_at = self.log.stat().st_size if self.log.exists() else 0

        def on_line(line: str) -> None:
            p = parse_progress(line)
            if p is not None:
                last[:] = [p]
                if self.hooks.on_progress:
                    self.hooks.on_progress(p)
            if self.hooks.on_line:
                self.hooks.on_line(line)

        t0 = time.monotonic()
        rc = run_streaming(args, cwd, log_file=self.log, on_line=on_line, env=self.env)
        step = Step(what=what, argv=args, seconds=time.monotonic() - t0, progress=last[0] if last else None)
        self.steps.append(step)
        if rc != 0:
            with open(self.log, encoding="utf-8", errors="replace") as fh:
                fh.seek(start_at)
                lines = fh.read().splitlines()
            d = first_error(lines, base=diag_base)
            details = []
            if d is not None:
                if d.target:
                    details.append(f"target: {d.target}")
                details.append(f"{d.location() or '(no file)'}: error: {d.message}")
                details.extend(d.context)
            else:
                details.extend(lines[-15:])
            raise BuildError(f"{what} failed (exit {rc})" + (f" at {d.location()}" if d and d.location() else ""),
                             where=f"log: {self.log}", details="\n".join(details),
                             hint=f"fix it (the full output is in {self.log}), then run the same `dcaforge build` again: "
                                  "only what changed is rebuilt")
        return step

    def skipped(self, what: str, argv: Sequence[str]) -> None:
        self.steps.append(Step(what=what, argv=tuple(argv), seconds=0.0, progress=None, skipped=True))


def build(cfg: Config, *, cuda: bool = False, baseline: bool = False, targets: Sequence[str] | None = None,
          jobs: int | None = None, hooks: BuildHooks | None = None) -> BuildResult:
    """``dcaforge build``."""
    hooks = hooks or BuildHooks()
    room = Room.of(cfg)
    room.require()
    bc = cfg.build
    njobs = jobs or bc.jobs or os.cpu_count() or 1
    t0 = time.monotonic()
    with locked(room):
        if rev_parse(room.path, BASELINE_TAG) is None:
            raise DcaforgeError("the clean room has no baseline yet (the series is not fully applied)",
                                where=str(room.path), hint="`dcaforge apply --continue`")
        keep: tuple[str, ...] = (bc.cmake.dir, bc.cmake.cuda_dir) if bc.backend == "cmake" else ("o",)
        tree = ensure_baseline_worktree(cfg, room, keep) if baseline else room.path
        variant = "baseline" if baseline else "feature"
        log = _log_path(room, variant, cuda)
        use_ccache = bc.ccache and _which("ccache") is not None
        env = {"CCACHE_BASEDIR": str(cfg.workspace)} if use_ccache else {}
        runner = _Runner(log, hooks, env)
        if bc.backend == "cmake":
            res = _build_cmake(cfg, room, tree, variant, cuda, targets, njobs, log, use_ccache, runner)
        else:
            res = _build_llamafile(cfg, room, tree, variant, cuda, targets, njobs, log, use_ccache, runner)
    res.steps = runner.steps
    res.seconds = time.monotonic() - t0
    return res


def cmake_configure_args(cfg: Config, source: Path, build_dir: Path, *, cuda: bool, ccache: bool,
                         nvcc: str | None = None) -> list[str]:
    """The cmake configure command line (defaults, then the config's defines, then CUDA and the
    config's cuda_defines)."""
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
    return ["cmake", "-S", str(source), "-B", str(build_dir), "-G", c.generator,
            *[f"-D{k}={v}" for k, v in defines.items()]]


def _build_cmake(cfg: Config, room: Room, tree: Path, variant: str, cuda: bool, targets: Sequence[str] | None,
                 jobs: int, log: Path, ccache: bool, runner: _Runner) -> BuildResult:
    c = cfg.build.cmake
    tgts = _targets(cfg, targets, c.targets, "build.cmake.targets")
    cmake = require_tool("cmake", HOW["cmake"])
    gen = c.generator.lower()
    if gen == "ninja":
        tool = require_tool("ninja", HOW["ninja"])
    elif "makefiles" in gen:
        tool = require_tool("make", HOW["make"])
    else:
        tool = ""
    nvcc = find_nvcc() if cuda else None
    if variant == "feature":
        require_wiring(cfg, room, tree)
    source = tree / cfg.llama_cpp_dir
    if not (source / "CMakeLists.txt").is_file():
        raise DcaforgeError(f"no CMakeLists.txt in {source}", where=str(source),
                            hint="check 'llama_cpp_dir:' in the config, or use build.backend: llamafile")
    rel_dir = c.cuda_dir if cuda else c.dir
    build_dir = tree / rel_dir
    _exclude(room, tree, rel_dir)
    res = BuildResult(backend="cmake", variant=variant, tree=tree, source=source, build_dir=build_dir, cuda=cuda,
                      targets=tgts, jobs=jobs, log=log, ccache=ccache)

    args = cmake_configure_args(cfg, source, build_dir, cuda=cuda, ccache=ccache, nvcc=nvcc)
    args[0] = cmake
    stamp = build_dir / STAMP
    generated = (build_dir / "build.ninja").exists() if gen == "ninja" else (build_dir / "CMakeCache.txt").exists()
    want = json.dumps({"argv": args[1:]}, sort_keys=True)
    if generated and stamp.is_file() and stamp.read_text() == want:
        runner.skipped("configure", args)
    else:
        build_dir.mkdir(parents=True, exist_ok=True)
        runner("configure", args, tree, diag_base=source)
        stamp.write_text(want)
    if gen == "ninja":
        argv = [tool, "-C", str(build_dir), f"-j{jobs}", *tgts]
    else:
        argv = [cmake, "--build", str(build_dir), "-j", str(jobs), *([a for t in tgts for a in ("--target", t)])]
    runner("build", argv, tree, diag_base=build_dir)
    res.outputs = [build_dir / "bin"]
    files = target_outputs(build_dir, tgts, ninja=tool if gen == "ninja" else None)
    res.programs = {t: f for t, f in files.items() if f is not None and _is_program(f)}
    return res


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


def _targets(cfg: Config, given: Sequence[str] | None, configured: tuple[str, ...], key: str) -> tuple[str, ...]:
    """The targets to build (``--targets``, else the config's), each one a target name and nothing
    else (:func:`guard.make_goal`: never an option, an assignment or ``$(...)``)."""
    if given:
        return tuple(guard.make_goal(t, what="--targets", where="the command line (--targets)") for t in given)
    return tuple(guard.make_goal(t, what=key, where=f"{cfg.describe()} ({key})") for t in configured)


def _cuda_argv(cfg: Config, tree: Path) -> list[str]:
    lf = cfg.build.llamafile
    script = tree / lf.cuda_script
    argv = [str(script)] if os.access(script, os.X_OK) else ["sh", str(script)]
    return [*argv, "--clean", "--output", str(tree / lf.cuda_output), *lf.cuda_flags]


def require_wiring(cfg: Config, room: Room, tree: Path) -> None:
    """The wiring check of the rendered room (see :mod:`dcaforge.feature.wiring`): a file the feature adds
    that the build leaves out stops the build before anything runs."""
    from dcaforge.feature.wiring import check_room

    rendered = sorted((room.load_state().rendered or {}).keys())
    base = rev_parse(room.path, BASELINE_TAG)
    if not rendered or base is None:
        return
    rep = check_room(cfg, tree, base, rendered)
    if not rep.ok:
        raise MismatchError(
            f"the {cfg.build.backend} build leaves out {len(rep.missing)} file(s) the feature adds: "
            + ", ".join(r.source for r in rep.missing),
            where=str(tree), details=rep.describe_missing(),
            hint="wire them in the feature's templates (the build lists, rendered as part of the patch), "
                 "then `dcaforge render` and build again; `dcaforge render --check` shows the wiring")


def _build_llamafile(cfg: Config, room: Room, tree: Path, variant: str, cuda: bool, targets: Sequence[str] | None,
                     jobs: int, log: Path, ccache: bool, runner: _Runner) -> BuildResult:
    lf = cfg.build.llamafile
    tgts = _targets(cfg, targets, lf.targets, "build.llamafile.targets")
    if variant == "feature":
        require_wiring(cfg, room, tree)
    rel = cosmocc_rel(tree)
    would = [shlex.join([lf.make or f"{rel}/bin/make", f"-j{jobs}", *tgts])]
    if cuda:
        would.append(shlex.join(_cuda_argv(cfg, tree)))
    cosmo = cosmocc_dir(tree, would)
    make = lf.make
    if make is None:
        make = str(cosmo / "bin" / "make") if (cosmo / "bin" / "make").exists() else "make"
    make = require_tool("make", HOW["make"], path=make, setting="build.llamafile.make" if lf.make else None,
                        where=f"{cfg.describe()} (build.llamafile.make)")
    nvcc = find_nvcc() if cuda else None
    _exclude(room, tree, "o")
    res = BuildResult(backend="llamafile", variant=variant, tree=tree, source=tree, build_dir=tree / "o", cuda=cuda,
                      targets=tgts, jobs=jobs, log=log, ccache=ccache)
    runner("make", [make, f"-j{jobs}", *tgts], tree, diag_base=tree)
    res.outputs = [tree / "o"]
    if cuda:
        script = tree / lf.cuda_script
        if not script.is_file():
            raise DcaforgeError(f"{script} does not exist: this llamafile tree has no GPU library script",
                                where=str(script), hint="set build.llamafile.cuda_script to the tree's script")
        output = tree / lf.cuda_output
        _exclude(room, tree, lf.cuda_output, folder=False)
        output.parent.mkdir(parents=True, exist_ok=True)
        env_path = os.path.dirname(nvcc or "")
        runner.env = {**runner.env, "PATH": f"{env_path}:{os.environ.get('PATH', '')}"} if env_path else runner.env
        runner(script.name, _cuda_argv(cfg, tree), tree, diag_base=tree)
        res.outputs.append(output)
    return res


# --- the cmake build's plan: configure only ------------------------------------------------

@dataclass
class CmakePlan:
    """``dcaforge build --dry-run`` on a cmake config: the configure run into a scratch folder (the build folder
    is not touched), and what a build of the targets would do there and where each target's file would land."""

    tree: Path
    build_dir: Path                 # where `dcaforge build` builds (and the files below land)
    configure: list[str]            # the configure command `dcaforge build` runs (into build_dir)
    targets: tuple[str, ...]        # () = cmake's default target (everything)
    files: dict[str, Path | None]   # target -> its file in build_dir (None: several files, or not known)
    steps: int | None               # ninja's steps for the targets from scratch (None: not ninja)
    configured: bool                # build_dir is already configured with this command
    wiring: object                  # wiring.WiringReport: every file the feature adds is compiled
    log: Path
    cuda: bool = False
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return bool(getattr(self.wiring, "ok", True))


def cmake_plan(cfg: Config, *, cuda: bool = False, targets: Sequence[str] | None = None,
               hooks: BuildHooks | None = None, trust: bool = False) -> CmakePlan:
    """``dcaforge build --dry-run`` for ``build.backend: cmake``: cmake configures into a scratch folder of the
    room's metadata (the build folder is not touched), ninja counts the steps the targets take (``-n``: nothing
    runs) and names each target's file; nothing is compiled. Configuring runs the tree's CMake code
    (``execute_process``), so, as llamafile's dry run, only for a trusted config (the built-in default is;
    ``trust``: --trust), and an unrendered room is refused as capture refuses it."""
    from dcaforge.patch.capture import check_whole
    from dcaforge.feature.wiring import check_room

    if cfg.build.backend != "cmake":
        raise DcaforgeError("the configure-only plan is for build.backend: cmake",
                            hint="`dcaforge build --dry-run` runs llamafile's make -n for build.backend: llamafile")
    hooks = hooks or BuildHooks()
    room = Room.of(cfg)
    room.require()
    c = cfg.build.cmake
    t0 = time.monotonic()
    with locked(room):
        base = rev_parse(room.path, BASELINE_TAG)
        if base is None:
            raise DcaforgeError("the clean room has no baseline yet (the series is not fully applied)",
                                where=str(room.path), hint="`dcaforge apply --continue`")
        state = check_whole(cfg, room, "nothing checked by the dry run", "`dcaforge build --dry-run`")
        tree = room.path
        rendered = sorted((state.rendered or {}).keys())
        wiring = check_room(cfg, tree, base, rendered)
        cmake = require_tool("cmake", HOW["cmake"])
        require_cmake_consent(cfg, trust)
        gen = c.generator.lower()
        ninja = require_tool("ninja", HOW["ninja"]) if gen == "ninja" else None
        nvcc = find_nvcc() if cuda else None
        source = tree / cfg.llama_cpp_dir
        if not (source / "CMakeLists.txt").is_file():
            raise DcaforgeError(f"no CMakeLists.txt in {source}", where=str(source),
                                hint="check 'llama_cpp_dir:' in the config, or use build.backend: llamafile")
        build_dir = tree / (c.cuda_dir if cuda else c.dir)
        use_ccache = cfg.build.ccache and _which("ccache") is not None
        real = cmake_configure_args(cfg, source, build_dir, cuda=cuda, ccache=use_ccache, nvcc=nvcc)
        real[0] = cmake
        stamp = build_dir / STAMP
        configured = stamp.is_file() and stamp.read_text() == json.dumps({"argv": real[1:]}, sort_keys=True)
        scratch = room.meta / ("plan-cmake-cuda" if cuda else "plan-cmake")
        if scratch.exists():
            shutil.rmtree(scratch)
        scratch.mkdir(parents=True)
        log = _log_path(room, "plan", cuda)
        runner = _Runner(log, hooks, {"CCACHE_BASEDIR": str(cfg.workspace)} if use_ccache else {})
        tgts = tuple(targets) if targets else c.targets
        try:
            args = cmake_configure_args(cfg, source, scratch, cuda=cuda, ccache=use_ccache, nvcc=nvcc)
            args[0] = cmake
            runner("configure", args, tree, diag_base=source)
            steps: int | None = None
            if ninja is not None:
                step = runner("plan", [ninja, "-C", str(scratch), "-n", *tgts], tree, diag_base=scratch)
                steps = step.progress.total if step.progress else 0
            files = {t: (build_dir / f.relative_to(scratch) if f is not None else None)
                     for t, f in target_outputs(scratch, tgts, ninja=ninja).items()}
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return CmakePlan(tree=tree, build_dir=build_dir, configure=real, targets=tgts, files=files, steps=steps,
                     configured=configured, wiring=wiring, log=log, cuda=cuda, seconds=time.monotonic() - t0)


# --- llamafile's build without cosmocc: the dry run ----------------------------------------

@dataclass
class DryRunReport:
    tree: Path
    wiring: object  # wiring.WiringReport
    make_argv: list[str]
    programs: tuple[str, ...]
    compiles: dict[str, list[str]] = field(default_factory=dict)  # added source -> its compile command
    objects: dict[str, str | None] = field(default_factory=dict)  # added source -> its object (None: not compiled)
    linked: dict[str, dict[str, bool]] = field(default_factory=dict)  # added source -> program -> on its link line
    unbuilt: list[str] = field(default_factory=list)  # added sources the wiring check found in no built folder
    cuda_argv: list[str] | None = None
    nvcc_calls: list[list[str]] = field(default_factory=list)
    cuda_sources: dict[str, bool] = field(default_factory=dict)  # added .cu -> handed to nvcc

    @property
    def problems(self) -> list[str]:
        out = []
        for src, obj in self.objects.items():
            if obj is None:
                out.append(f"{src}: make would not compile it")
                continue
            out += [f"{src}: {obj} is not on the link line of {p}" for p, ok in self.linked[src].items() if not ok]
        out += [f"{src}: {self.cuda_argv and self.cuda_argv[0]} does not hand it to nvcc"
                for src, ok in self.cuda_sources.items() if not ok]
        return out

    @property
    def ok(self) -> bool:
        return bool(getattr(self.wiring, "ok", True)) and not self.problems


def require_dry_run_consent(cfg: Config, trust: bool, cuda: bool) -> None:
    """The dry run runs code of the tree and the config: make evaluates the Makefile (its ``$(shell
    ...)`` run for real under ``make -n``), the config may name the make, and ``--cuda`` runs the GPU
    script. So it needs the same consent as a config's commands (:mod:`dcaforge.trust`); nothing runs before."""
    from dcaforge import trust as consent

    lf = cfg.build.llamafile
    t = consent.trust_of(cfg, trust)
    what = "its Makefile under make -n (make runs the Makefile's $(shell ...) even then)" + (
        f" and its GPU script {lf.cuda_script} (with stand-in compilers)" if cuda else "")
    guard.require_consent(
        t.trusted,
        f"build --dry-run runs code of the tree and the config: {what}; dcaforge runs it only when you trust the "
        "config; nothing was run",
        where=f"{cfg.describe()} (build.llamafile)",
        hint=f"read the tree's Makefile{' and ' + lf.cuda_script if cuda else ''}; if you trust them, run "
             f"`dcaforge build --dry-run{' --cuda' if cuda else ''} --trust` (or add the config, or its folder ending "
             f"with /, to 'trusted:' in {consent.settings_label()}); `dcaforge render --check` checks the wiring "
             "without running anything")


def require_cmake_consent(cfg: Config, trust: bool) -> None:
    """cmake's configure step runs the tree's CMake code (``execute_process``, ``file(DOWNLOAD)``): the cmake dry run
    asks the same consent as llamafile's (:func:`require_dry_run_consent`); nothing runs before."""
    from dcaforge import trust as consent

    guard.require_consent(
        consent.trust_of(cfg, trust).trusted,
        "build --dry-run configures the tree with cmake, which runs the tree's CMake code; dcaforge runs it only when "
        "you trust the config; nothing was run",
        where=f"{cfg.describe()} (build.cmake)",
        hint=f"if you trust the tree, run `dcaforge build --dry-run --trust` (or add the config, or its folder ending "
             f"with /, to 'trusted:' in {consent.settings_label()}); `dcaforge render --check` checks the wiring "
             "without running anything")


def dry_run(cfg: Config, *, cuda: bool = False, programs: Sequence[str] | None = None,
            trust: bool = False) -> DryRunReport:
    """``dcaforge build --dry-run`` (llamafile): the wiring check, then the tree's real Makefile with
    ``make -n`` and a stand-in cosmocc: every C/C++ file the feature adds must be compiled and its
    object be on the link line of each of ``programs`` (archives on it included); with ``cuda``
    the GPU library script runs with stand-in compilers (:func:`dryrun.script_dry_run`: PATH,
    CUDACXX, CUDA_PATH, CUDA_HOME ... and HOME all point into a scratch folder) and without
    ``--clean``, and must hand nvcc every added .cu file. It runs code of the tree and the config,
    so only for a trusted config (``trust``: --trust; :func:`require_dry_run_consent`). A dry run
    starts no compiler and deletes nothing outside its scratch folder."""
    from dcaforge.build import dryrun
    from dcaforge.patch.capture import check_whole
    from dcaforge.feature.wiring import check_room

    if cfg.build.backend != "llamafile":
        raise DcaforgeError("--dry-run is for build.backend: llamafile (cosmocc's make without cosmocc)",
                            hint="for cmake, `dcaforge build` itself; `dcaforge render --check` shows the wiring")
    room = Room.of(cfg)
    room.require()
    lf = cfg.build.llamafile
    progs = (tuple(guard.make_goal(t, what="--targets", where="the command line (--targets)") for t in programs)
             if programs else
             tuple(guard.make_goal(t, what="build.llamafile.programs", where=f"{cfg.describe()} (build.llamafile.programs)")
                   for t in lf.programs))
    make = require_tool("make", HOW["make"], path=lf.make or "make", setting="build.llamafile.make" if lf.make else None,
                        where=f"{cfg.describe()} (build.llamafile.make)")
    with locked(room):
        base = rev_parse(room.path, BASELINE_TAG)
        if base is None:
            raise DcaforgeError("the clean room has no baseline yet", where=str(room.path), hint="`dcaforge apply --continue`")
        # an unrendered room would pass (the feature adds no file there): refused as capture refuses it
        state = check_whole(cfg, room, "nothing checked by the dry run", "`dcaforge build --dry-run`")
        require_dry_run_consent(cfg, trust, cuda)  # everything checked that needs nothing run; now the consent
        tree = room.path
        rendered = sorted((state.rendered or {}).keys())
        wiring = check_room(cfg, tree, base, rendered)
        scratch = room.meta / "dry-run"
        guard.remove_leftover(scratch, "the dry run's scratch folder")
        cosmo = dryrun.cosmocc_standin(scratch / "cosmocc")
        _exclude(room, tree, "o")
        dry = dryrun.make_dry_run(tree, list(progs), cosmocc=cosmo, make=make, scratch=scratch)
        rep = DryRunReport(tree=tree, wiring=wiring, make_argv=dry.argv, programs=progs)
        linked = {p: dry.linked_objects(p) for p in progs}
        for row in wiring.rows:
            if row.status == "unbuilt":
                rep.unbuilt.append(row.source)
                continue
            if row.build != "make":
                continue
            cmd = dry.compiles().get(row.source)
            obj = os.path.normpath(cmd.output) if cmd is not None and cmd.output else None
            rep.objects[row.source] = obj
            if cmd is not None:
                rep.compiles[row.source] = cmd.argv
            rep.linked[row.source] = {p: obj is not None and obj in linked[p] for p in progs}
        if cuda:
            script = tree / lf.cuda_script
            if not script.is_file():
                raise DcaforgeError(f"{script} does not exist: this llamafile tree has no GPU library script",
                                    where=str(script), hint="set build.llamafile.cuda_script to the tree's script")
            out = scratch / "ggml-cuda.so"
            # never --clean: a dry run deletes nothing (llamafile's script cleans a cache under $HOME)
            flags = [f for f in lf.cuda_flags if f != "--clean"]
            sd = dryrun.script_dry_run(tree, lf.cuda_script, ["--output", str(out), *flags], scratch / "nvcc")
            rep.cuda_argv = sd.argv
            rep.nvcc_calls = sd.nvcc_calls()
            handed = {os.path.normpath(s) for s in sd.sources()}
            for row in wiring.rows:
                if row.source.endswith(".cu") and row.status != "unbuilt":
                    rep.cuda_sources[row.source] = os.path.normpath(row.source) in handed
    return rep
