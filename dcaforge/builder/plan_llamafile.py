"""``dcaforge build --dry-run`` for ``build.backend: llamafile`` (no cosmocc needed): the wiring check, then the
tree's real Makefile under ``make -n`` with a stand-in cosmocc and, with ``--cuda``, the GPU library script with
stand-in compilers (:mod:`dcaforge.builder.dryrun`): every file the feature adds must be compiled, linked into each
program, and handed to nvcc. Both run code of the tree and the config, so only with the user's consent."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from dcaforge import guard
from dcaforge.builder import dryrun
from dcaforge.builder.llamafile import gpu_script
from dcaforge.builder.preflight import rendered_sources, require_baseline, require_rendered
from dcaforge.builder.toolchain import HOW, require_tool
from dcaforge.builder.worktree import exclude_output
from dcaforge.config import Config
from dcaforge.errors import DcaforgeError
from dcaforge.room.cleanroom import Room, locked

if TYPE_CHECKING:
    from dcaforge.feature.wiring import WiringRow


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
    from dcaforge.feature.wiring import check_room

    if cfg.build.backend != "llamafile":
        raise DcaforgeError("--dry-run is for build.backend: llamafile (cosmocc's make without cosmocc)",
                            hint="for cmake, `dcaforge build` itself; `dcaforge render --check` shows the wiring")
    room = Room.of(cfg)
    room.require()
    progs = _programs(cfg, programs)
    lf = cfg.build.llamafile
    make = require_tool("make", HOW["make"], path=lf.make or "make", setting="build.llamafile.make" if lf.make else None,
                        where=f"{cfg.describe()} (build.llamafile.make)")
    with locked(room):
        base = require_baseline(room, "the clean room has no baseline yet")
        # an unrendered room would pass (the feature adds no file there): refused as capture refuses it
        state = require_rendered(cfg, room)
        require_dry_run_consent(cfg, trust, cuda)  # everything checked that needs nothing run; now the consent
        tree = room.path
        wiring = check_room(cfg, tree, base, rendered_sources(state))
        scratch = room.meta / "dry-run"
        guard.remove_leftover(scratch, "the dry run's scratch folder")
        cosmo = dryrun.cosmocc_standin(scratch / "cosmocc")
        exclude_output(room, tree, "o")
        dry = dryrun.make_dry_run(tree, list(progs), cosmocc=cosmo, make=make, scratch=scratch)
        rep = DryRunReport(tree=tree, wiring=wiring, make_argv=dry.argv, programs=progs)
        _check_make(rep, dry, wiring.rows)
        if cuda:
            _check_gpu_script(rep, cfg, scratch, wiring.rows)
    return rep


def _programs(cfg: Config, programs: Sequence[str] | None) -> tuple[str, ...]:
    """The programs whose link lines are checked (``--targets``, else ``build.llamafile.programs``), each a make
    goal and nothing else (:func:`guard.make_goal`)."""
    if programs:
        return tuple(guard.make_goal(t, what="--targets", where="the command line (--targets)") for t in programs)
    return tuple(guard.make_goal(t, what="build.llamafile.programs", where=f"{cfg.describe()} (build.llamafile.programs)")
                 for t in cfg.build.llamafile.programs)


def _check_make(rep: DryRunReport, dry: dryrun.MakeDryRun, rows: Sequence[WiringRow]) -> None:
    """For each added source make builds: its compile command, its object, and whether that object is on each
    program's link line; the added sources no build compiles go to ``rep.unbuilt``."""
    linked = {p: dry.linked_objects(p) for p in rep.programs}
    for row in rows:
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
        rep.linked[row.source] = {p: obj is not None and obj in linked[p] for p in rep.programs}


def _check_gpu_script(rep: DryRunReport, cfg: Config, scratch: Path, rows: Sequence[WiringRow]) -> None:
    """The GPU library script with stand-in compilers, never with ``--clean`` (a dry run deletes nothing; llamafile's
    script cleans a cache under $HOME): its nvcc calls, and whether it hands nvcc each added .cu file."""
    lf = cfg.build.llamafile
    gpu_script(cfg, rep.tree)
    out = scratch / "ggml-cuda.so"
    flags = [f for f in lf.cuda_flags if f != "--clean"]
    sd = dryrun.script_dry_run(rep.tree, lf.cuda_script, ["--output", str(out), *flags], scratch / "nvcc")
    rep.cuda_argv = sd.argv
    rep.nvcc_calls = sd.nvcc_calls()
    handed = {os.path.normpath(s) for s in sd.sources()}
    for row in rows:
        if row.source.endswith(".cu") and row.status != "unbuilt":
            rep.cuda_sources[row.source] = os.path.normpath(row.source) in handed
