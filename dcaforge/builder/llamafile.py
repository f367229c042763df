"""llamafile's build: the ``make`` its Makefile drives with its cosmocc toolchain (``.cosmocc/<version>`` in the
tree, which dcaforge never downloads), and for ``--cuda`` the GPU library script
(``llamafile/cuda.sh --clean --output <inside the clean room>``) with the configured flags."""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from pathlib import Path

from dcaforge.builder.preflight import build_targets, require_wiring
from dcaforge.builder.runner import BuildResult, Runner
from dcaforge.builder.toolchain import HOW, cosmocc_dir, cosmocc_rel, find_nvcc, require_tool
from dcaforge.builder.worktree import exclude_output
from dcaforge.config import Config
from dcaforge.errors import DcaforgeError
from dcaforge.room.cleanroom import Room


def cuda_argv(cfg: Config, tree: Path) -> list[str]:
    """The GPU library script's command line (``--clean --output <tree>/<cuda_output>`` and the configured flags)."""
    lf = cfg.build.llamafile
    script = tree / lf.cuda_script
    argv = [str(script)] if os.access(script, os.X_OK) else ["sh", str(script)]
    return [*argv, "--clean", "--output", str(tree / lf.cuda_output), *lf.cuda_flags]


def gpu_script(cfg: Config, tree: Path) -> Path:
    """The tree's GPU library script (``build.llamafile.cuda_script``); a DcaforgeError when the tree has none."""
    script = tree / cfg.build.llamafile.cuda_script
    if not script.is_file():
        raise DcaforgeError(f"{script} does not exist: this llamafile tree has no GPU library script",
                            where=str(script), hint="set build.llamafile.cuda_script to the tree's script")
    return script


def build_llamafile(cfg: Config, room: Room, tree: Path, variant: str, cuda: bool, targets: Sequence[str] | None,
                    jobs: int, log: Path, ccache: bool, runner: Runner) -> BuildResult:
    """llamafile's make of the targets in ``tree`` (the room or the baseline's worktree), then with ``cuda`` its
    GPU library script; cosmocc must be in the tree (the error says what would run and how to get it)."""
    lf = cfg.build.llamafile
    tgts = build_targets(cfg, targets, lf.targets, "build.llamafile.targets")
    if variant == "feature":
        require_wiring(cfg, room, tree)
    rel = cosmocc_rel(tree)
    would = [shlex.join([lf.make or f"{rel}/bin/make", f"-j{jobs}", *tgts])]
    if cuda:
        would.append(shlex.join(cuda_argv(cfg, tree)))
    cosmo = cosmocc_dir(tree, would)
    make = _make_of(cfg, cosmo)
    nvcc = find_nvcc() if cuda else None
    exclude_output(room, tree, "o")
    res = BuildResult(backend="llamafile", variant=variant, tree=tree, source=tree, build_dir=tree / "o", cuda=cuda,
                      targets=tgts, jobs=jobs, log=log, ccache=ccache)
    runner("make", [make, f"-j{jobs}", *tgts], tree, diag_base=tree)
    res.outputs = [tree / "o"]
    if cuda:
        res.outputs.append(_run_gpu_script(cfg, room, tree, nvcc, runner))
    return res


def _make_of(cfg: Config, cosmo: Path) -> str:
    """The make to run: ``build.llamafile.make``, else cosmocc's own, else make on PATH."""
    lf = cfg.build.llamafile
    make = lf.make
    if make is None:
        make = str(cosmo / "bin" / "make") if (cosmo / "bin" / "make").exists() else "make"
    return require_tool("make", HOW["make"], path=make, setting="build.llamafile.make" if lf.make else None,
                        where=f"{cfg.describe()} (build.llamafile.make)")


def _run_gpu_script(cfg: Config, room: Room, tree: Path, nvcc: str | None, runner: Runner) -> Path:
    """The GPU library script run with nvcc's folder first on PATH; returns the library it writes."""
    lf = cfg.build.llamafile
    script = gpu_script(cfg, tree)
    output = tree / lf.cuda_output
    exclude_output(room, tree, lf.cuda_output, folder=False)
    output.parent.mkdir(parents=True, exist_ok=True)
    env_path = os.path.dirname(nvcc or "")
    runner.env = {**runner.env, "PATH": f"{env_path}:{os.environ.get('PATH', '')}"} if env_path else runner.env
    runner(script.name, cuda_argv(cfg, tree), tree, diag_base=tree)
    return output
