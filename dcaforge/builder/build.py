"""``dcaforge build``: build the clean room (or the baseline, in its own worktree) with the
configured backend, and its dry run. This module is the build wing's front: what code outside the wing
imports (``__all__``); the work is done by the wing's other modules, one job each:

- :mod:`~dcaforge.builder.cmake` (upstream llama.cpp): configure once into ``build.cmake.dir`` (``--cuda``:
  ``build.cmake.cuda_dir`` with ``-DGGML_CUDA=ON`` and the configured architectures), with ccache
  when installed (``CCACHE_BASEDIR`` = the workspace, so another checkout of the same layout
  reuses the objects), then the generator (Ninja) builds the targets. A configure runs again
  only when its arguments change; ninja itself re-runs cmake when a CMakeLists.txt changes.
- :mod:`~dcaforge.builder.llamafile`: the ``make`` llamafile's Makefile drives with its cosmocc toolchain
  (``.cosmocc/<version>`` in the tree, which dcaforge never downloads: :mod:`~dcaforge.builder.toolchain`), and
  for ``--cuda`` ``llamafile/cuda.sh --clean --output <inside the clean room>`` with the configured flags.
- ``--dry-run``: :mod:`~dcaforge.builder.plan_cmake` (configure only, into a scratch folder) and
  :mod:`~dcaforge.builder.plan_llamafile` (make -n and the GPU script with stand-ins: :mod:`~dcaforge.builder.dryrun`).

``--baseline`` builds the ``dcaforge/baseline`` tag (series applied, no feature) in a git
worktree ``<workspace>/<name>-baseline`` next to the clean room (:mod:`~dcaforge.builder.worktree`); moving it
to a new baseline checks out only the files that changed, so its build stays incremental too.

Every command's output goes to a log under ``<room>/.git/dcaforge/logs/`` (:mod:`~dcaforge.builder.runner`);
progress is read from the ``[n/N]`` (ninja, cosmocc make) or ``[ NN%]`` (cmake's Makefiles) lines; a failure
raises :class:`~dcaforge.errors.BuildError` with the first compiler error and the log's path
(:mod:`~dcaforge.builder.buildlog`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from dcaforge.builder.buildlog import Progress, first_error, parse_progress
from dcaforge.builder.cmake import NO_AMX_FLAGS, build_cmake, cmake_configure_args, host_has_amx
from dcaforge.builder.llamafile import build_llamafile
from dcaforge.builder.plan_cmake import CmakePlan, cmake_plan
from dcaforge.builder.plan_llamafile import DryRunReport, dry_run
from dcaforge.builder.preflight import require_baseline
from dcaforge.builder.runner import BuildHooks, BuildResult, Runner, Step, log_path
from dcaforge.builder.toolchain import ccache_env, use_ccache
from dcaforge.builder.worktree import baseline_path, ensure_baseline_worktree
from dcaforge.config import Config
from dcaforge.room.cleanroom import Room, locked

__all__ = ["NO_AMX_FLAGS", "BuildHooks", "BuildResult", "CmakePlan", "DryRunReport", "Progress", "Step", "baseline_path",
           "build", "cmake_configure_args", "cmake_plan", "dry_run", "first_error", "host_has_amx", "parse_progress"]


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
        require_baseline(room)
        keep: tuple[str, ...] = (bc.cmake.dir, bc.cmake.cuda_dir) if bc.backend == "cmake" else ("o",)
        tree = ensure_baseline_worktree(cfg, room, keep) if baseline else room.path
        variant = "baseline" if baseline else "feature"
        log = log_path(room, variant, cuda)
        ccache = use_ccache(cfg)
        runner = Runner(log, hooks, ccache_env(cfg, ccache))
        backend = build_cmake if bc.backend == "cmake" else build_llamafile
        res = backend(cfg, room, tree, variant, cuda, targets, njobs, log, ccache, runner)
    res.steps = runner.steps
    res.seconds = time.monotonic() - t0
    return res
