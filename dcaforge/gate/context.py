"""What the gates of one ``dcaforge gate`` run share (:class:`GateContext`): the output folders, the builds, the
binaries, the models and the log of every command."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dcaforge import guard
from dcaforge.builder.build import baseline_path
from dcaforge.config import Config
from dcaforge.configsections import GateConfig
from dcaforge.errors import GateError
from dcaforge.gate.results import GateHooks
from dcaforge.git import run
from dcaforge.room.cleanroom import Room


class GateContext:
    """What the gates share: folders, builds, the log of every command."""

    def __init__(self, cfg: Config, hooks: GateHooks) -> None:
        self.cfg, self.hooks = cfg, hooks
        self.out = cfg.workspace / f"{cfg.name}-gates"
        self.logs = self.out / "logs"
        self.last_rc = 0  # the exit status of the last run()
        self.models = self.out / "models"
        # dcaforge's own folders: never a symlink out (the old logs are deleted, models written there)
        for folder, what in ((self.out, "the gates' output folder"), (self.logs, "the gates' log folder"),
                             (self.models, "the gates' model folder")):
            guard.own_folder(folder, what, hint=f"move it away: dcaforge makes {what} itself, in the workspace "
                                                "(<workspace>/<name>-gates); then run the same `dcaforge gate` again")
        if self.logs.is_dir():  # this run's logs only (a link is removed as a link)
            for old in self.logs.glob("*.log"):
                old.unlink()
        self.logs.mkdir(parents=True, exist_ok=True)
        self.room = Room.of(cfg)
        self.feature_tree = self.room.path
        self.feature_build = self.room.path / cfg.build.cmake.dir
        self.base_tree = baseline_path(cfg)
        self.base_build = self.base_tree / cfg.build.cmake.dir
        self.n = 0
        self.m = 0

    def step(self, msg: str) -> None:
        if self.hooks.on_step:
            self.hooks.on_step(msg)

    def run(self, argv: Sequence[str | os.PathLike[str]], what: str, *, check: bool = True) -> str:
        args = [os.fspath(a) for a in argv]
        res = run(args, self.cfg.root, check=False)
        text = res.stdout + res.stderr
        log = self.log_path(what)
        log.write_text(f"$ {' '.join(args)}\n# exit {res.returncode}\n{text}")
        self.last_rc = res.returncode
        if check and not res.ok:
            tail = "\n".join(text.strip().splitlines()[-12:])
            raise GateError(f"{what} failed (exit {res.returncode})", where=f"log: {log}", details=tail)
        return text

    def binary(self, build: Path, name: str, variant: str) -> Path:
        exe = build / "bin" / name
        if not exe.is_file():
            flag = " --baseline" if variant == "baseline" else ""
            raise GateError(f"{exe} is missing: the {variant} build has no {name}", where=str(build),
                            hint=f'`dcaforge build{flag} --targets "llama llama-perplexity llama-passkey"`')
        return exe

    def dumper(self, variant: str) -> Path:
        """dca_logits (package data of dcaforge.gate.gatetools) compiled against the build's static libraries, cached."""
        from dcaforge.gate.gatetools import build_logits

        tree, build = ((self.feature_tree, self.feature_build) if variant == "feature"
                       else (self.base_tree, self.base_build))
        if not (build / "src" / "libllama.a").exists() and not list(build.glob("**/libllama.a")):
            flag = " --baseline" if variant == "baseline" else ""
            raise GateError(f"no libllama.a in the {variant} build {build}", where=str(build),
                            hint=f"`dcaforge build{flag} --targets llama` (static libraries: BUILD_SHARED_LIBS=OFF)")
        self.step(f"compile dca_logits against the {variant} build")
        try:
            exe = build_logits.build(tree, build, variant == "feature")
        except (OSError, RuntimeError) as exc:
            raise GateError(f"dca_logits does not compile against the {variant} build", where=str(build),
                            details=str(exc)[-3000:]) from None
        self.log_path(f"dca_logits-{variant}").write_text(f"{build_logits.SRC} against {build}:\n{exe}\n")
        return Path(exe)

    def server(self) -> Path:
        """The clean room's llama-server, built first (as ``dcaforge build --targets llama-server``) when missing."""
        exe = self.feature_build / "bin" / "llama-server"
        if not exe.is_file():
            from dcaforge.builder.build import BuildHooks, build

            self.step("build llama-server (dcaforge build --targets llama-server)")
            build(self.cfg, targets=["llama-server"],
                  hooks=BuildHooks(on_step=lambda what, argv: self.step(f"  {what}: {' '.join(argv[:3])} ...")))
        if not exe.is_file():
            raise GateError(f"{exe} is missing after the build", where=str(self.feature_build),
                            hint="`dcaforge build --targets llama-server` (the configure needs LLAMA_BUILD_SERVER=ON, "
                                 "dcaforge's default)")
        return exe

    def log_path(self, what: str) -> Path:
        """A new file in the logs folder, numbered in the order of the run."""
        self.n += 1
        return self.logs / f"{self.n:03d}-{re.sub(r'[^A-Za-z0-9._-]+', '_', what)[:60]}.log"

    def model(self, g: GateConfig) -> Path:
        if g.model is not None:
            if not g.model.is_file():
                raise GateError(f"gate {g.name!r}: model {g.model} does not exist", where=g.where)
            return g.model
        assert g.recipe is not None
        from dcaforge.gate.gatetools import tiny

        _, arch, *rest = g.recipe.split(":")
        variant = rest[0] if rest else "normal"
        if arch not in tiny.ARCHS or variant not in tiny.VARIANTS:
            raise GateError(f"gate {g.name!r}: no recipe {g.recipe}", where=g.where,
                            hint=f"tiny:<arch>[:<variant>], arch one of {', '.join(tiny.ARCHS)}, "
                                 f"variant one of {', '.join(tiny.VARIANTS)}")
        path = Path(tiny.model_path(str(self.models), arch, variant))
        if not path.is_file():
            self.step(f"write the tiny model {g.recipe}")
            tiny.ensure(str(self.models), arch, variant)
        return path

    def logits(self, exe: Path, model: Path, n_tokens: int, fa: bool, threads: int, dca: str | None,
               chunk: int = 0, local: int = 0) -> tuple[bytes, int]:
        """(raw f32 logits, n_vocab) from dca_logits."""
        self.m += 1
        out = self.out / "logits" / f"{self.m:03d}.f32"
        out.parent.mkdir(parents=True, exist_ok=True)
        argv: list[str | os.PathLike[str]] = [exe, "-m", model, "-o", out, "--seed", "7", "--n-tokens", str(n_tokens),
                                              "-c", str(n_tokens), "-b", str(n_tokens), "-ub", "64",
                                              "-fa", "on" if fa else "off", "-t", str(threads)]
        if dca is not None:
            argv += ["--dca", dca]
            if dca == "on":
                argv += ["--dca-chunk-size", str(chunk), "--dca-local-size", str(local)]
        text = self.run(argv, f"logits-{exe.name[:20]}-{dca}-fa{int(fa)}")
        info: dict[str, Any] = next((json.loads(line) for line in text.splitlines() if line.startswith('{"n_tokens"')), {})
        data = out.read_bytes()
        out.unlink()
        return data, int(info.get("n_vocab") or len(data) // 4 // n_tokens)
