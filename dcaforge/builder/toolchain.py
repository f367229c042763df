"""The build's tools: cmake, ninja, make and nvcc found (or a :class:`~dcaforge.errors.ToolchainError` that
says how to get them), ccache when installed, and llamafile's cosmocc, which must already be in the tree
(``.cosmocc/<version>``, as its build/config.mk names it): dcaforge never downloads it."""

from __future__ import annotations

import os
import re
import shlex
import shutil
from collections.abc import Sequence
from pathlib import Path

from dcaforge.config import Config
from dcaforge.errors import ConfigError, DcaforgeError, ToolchainError


def _which(name: str) -> str | None:
    return shutil.which(name)


def use_ccache(cfg: Config) -> bool:
    """ccache for the build: the config wants it (``build.ccache``) and it is installed."""
    return cfg.build.ccache and _which("ccache") is not None


def ccache_env(cfg: Config, on: bool) -> dict[str, str]:
    """The environment of the build's commands: with ccache, ``CCACHE_BASEDIR`` = the workspace, so another
    checkout of the same layout reuses the objects."""
    return {"CCACHE_BASEDIR": str(cfg.workspace)} if on else {}


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
