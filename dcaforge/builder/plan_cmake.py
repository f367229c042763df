"""``dcaforge build --dry-run`` for ``build.backend: cmake``: the configure run into a scratch folder of the room's
metadata (the build folder is not touched), ninja's count of the steps the targets take (``-n``: nothing runs)
and where each target's file would land; nothing is compiled. Configuring runs the tree's CMake code, so only
with the user's consent."""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dcaforge import guard
from dcaforge.builder.cmake import STAMP, cmake_source, configure_argv, stamp_of, target_outputs
from dcaforge.builder.preflight import rendered_sources, require_baseline, require_rendered
from dcaforge.builder.runner import BuildHooks, Runner, log_path
from dcaforge.builder.toolchain import HOW, ccache_env, find_nvcc, require_tool, use_ccache
from dcaforge.config import Config
from dcaforge.errors import DcaforgeError
from dcaforge.room.cleanroom import Room, locked


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


def require_cmake_consent(cfg: Config, trust: bool) -> None:
    """cmake's configure step runs the tree's CMake code (``execute_process``, ``file(DOWNLOAD)``): the cmake dry run
    asks the same consent as llamafile's (:func:`~dcaforge.builder.plan_llamafile.require_dry_run_consent`); nothing
    runs before."""
    from dcaforge import trust as consent

    guard.require_consent(
        consent.trust_of(cfg, trust).trusted,
        "build --dry-run configures the tree with cmake, which runs the tree's CMake code; dcaforge runs it only when "
        "you trust the config; nothing was run",
        where=f"{cfg.describe()} (build.cmake)",
        hint=f"if you trust the tree, run `dcaforge build --dry-run --trust` (or add the config, or its folder ending "
             f"with /, to 'trusted:' in {consent.settings_label()}); `dcaforge render --check` checks the wiring "
             "without running anything")


def cmake_plan(cfg: Config, *, cuda: bool = False, targets: Sequence[str] | None = None,
               hooks: BuildHooks | None = None, trust: bool = False) -> CmakePlan:
    """``dcaforge build --dry-run`` for ``build.backend: cmake``: cmake configures into a scratch folder of the
    room's metadata (the build folder is not touched), ninja counts the steps the targets take (``-n``: nothing
    runs) and names each target's file; nothing is compiled. Configuring runs the tree's CMake code
    (``execute_process``), so, as llamafile's dry run, only for a trusted config (the built-in default is;
    ``trust``: --trust), and an unrendered room is refused as capture refuses it."""
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
        base = require_baseline(room)
        state = require_rendered(cfg, room)
        tree = room.path
        wiring = check_room(cfg, tree, base, rendered_sources(state))
        cmake = require_tool("cmake", HOW["cmake"])
        require_cmake_consent(cfg, trust)
        ninja = require_tool("ninja", HOW["ninja"]) if c.generator.lower() == "ninja" else None
        nvcc = find_nvcc() if cuda else None
        source = cmake_source(cfg, tree)
        build_dir = tree / (c.cuda_dir if cuda else c.dir)
        ccache = use_ccache(cfg)
        real = configure_argv(cfg, cmake, source, build_dir, cuda=cuda, ccache=ccache, nvcc=nvcc)
        stamp = build_dir / STAMP
        configured = stamp.is_file() and stamp.read_text() == stamp_of(real)
        scratch = room.meta / ("plan-cmake-cuda" if cuda else "plan-cmake")
        if scratch.exists():
            shutil.rmtree(scratch)
        scratch.mkdir(parents=True)
        log = log_path(room, "plan", cuda)
        runner = Runner(log, hooks, ccache_env(cfg, ccache))
        tgts = tuple(targets) if targets else c.targets
        try:
            args = configure_argv(cfg, cmake, source, scratch, cuda=cuda, ccache=ccache, nvcc=nvcc)
            steps, files = _plan_in(runner, args, tree, source, scratch, build_dir, tgts, ninja)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return CmakePlan(tree=tree, build_dir=build_dir, configure=real, targets=tgts, files=files, steps=steps,
                     configured=configured, wiring=wiring, log=log, cuda=cuda, seconds=time.monotonic() - t0)


def _plan_in(runner: Runner, args: list[str], tree: Path, source: Path, scratch: Path, build_dir: Path,
             tgts: tuple[str, ...], ninja: str | None) -> tuple[int | None, dict[str, Path | None]]:
    """Configure into ``scratch`` with ``args``, then ninja's steps for ``tgts`` (``-n``: nothing runs; None when
    the generator is not ninja) and each target's file, as it would land in ``build_dir``."""
    runner("configure", args, tree, diag_base=source)
    steps: int | None = None
    if ninja is not None:
        step = runner("plan", [ninja, "-C", str(scratch), "-n", *tgts], tree, diag_base=scratch)
        steps = step.progress.total if step.progress else 0
    files = {t: (build_dir / f.relative_to(scratch) if f is not None else None)
             for t, f in target_outputs(scratch, tgts, ninja=ninja).items()}
    return steps, files
