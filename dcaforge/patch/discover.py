"""The patch series: finding it (the series file, a range, or the numbered patches below the
feature's) and what can be checked of it before anything is made or applied."""

from __future__ import annotations

import hashlib
from pathlib import Path

from dcaforge import confine
from dcaforge.config import Config
from dcaforge.errors import ConfigError
from dcaforge.patchfile import NUMBERED, Patch, load_patch, read_patch


def discover(cfg: Config) -> list[Patch]:
    """The series in order: the series file, else the numbered patches in ``range``, else
    every numbered patch below the feature's number (an empty series is fine)."""
    sdir = cfg.series.dir
    feature_name = cfg.feature.patch_name
    if cfg.series.file is not None:
        sfile = cfg.series.file
        if not sfile.is_file():
            raise ConfigError(f"series file not found: {sfile}", where="series.file",
                              hint=f"create {sfile} listing one patch per line, or use series.range")
        out: list[Patch] = []
        try:
            text = sfile.read_bytes().decode("utf-8")
        except UnicodeDecodeError as exc:
            bad_line = sfile.read_bytes()[:exc.start].count(b"\n") + 1
            raise ConfigError(f"the series file is not UTF-8 text (byte {exc.object[exc.start]:#04x})",
                              where=f"{sfile}:{bad_line}", hint="save it as UTF-8: one patch file name per line") from None
        for lineno, raw in enumerate(text.splitlines(), 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            name, *opts = line.split()
            if any(o != "-p1" for o in opts):
                raise ConfigError(f"unsupported option in series file: {' '.join(opts)}",
                                  where=f"{sfile}:{lineno}", hint="only -p1 patches are supported")
            problem = confine.path_problem(name)
            if problem:
                raise ConfigError(f"the series file names {name!r}, which {problem}", where=f"{sfile}:{lineno}",
                                  hint=f"list patch files of {sdir} by their names relative to it")
            p = sdir / name
            if not p.is_file():
                raise ConfigError(f"patch listed in the series file does not exist: {name}",
                                  where=f"{sfile}:{lineno}")
            out.append(load_patch(p, name))
        return out
    if not sdir.is_dir():
        if cfg.series.range is not None:
            raise ConfigError(f"series folder not found: {sdir}", where="series.dir")
        return []
    by_number: dict[int, Path] = {}
    for p in sorted(sdir.iterdir()):
        m = NUMBERED.match(p.name)
        if not m or not p.is_file() or p.name == feature_name:
            continue
        n = int(m.group(1))
        if cfg.series.range is not None:
            lo, hi = cfg.series.range
            if not lo <= n <= hi:
                continue
        elif n >= cfg.feature.number:
            continue
        if n in by_number:
            raise ConfigError(f"two patches numbered {n:04d}: {by_number[n].name} and {p.name}",
                              where=str(sdir), hint="renumber one of them")
        by_number[n] = p
    return [load_patch(by_number[n], by_number[n].name) for n in sorted(by_number)]


def series_record(patches: list[Patch]) -> list[dict[str, str]]:
    return [{"name": p.name, "sha256": p.sha256, "style": p.style} for p in patches]


def confine_hint(patch: Patch, resume: bool) -> str:
    then = "`dcaforge apply --continue`" if resume else "`dcaforge apply` again"
    return (f"fix or remove {patch.path} (a patch may only change files of the tree, never git's own files or "
            f"anything outside it), then run {then}")


def check_series(patches: list[Patch], strip: int = 1) -> None:
    """What can be checked of a series before anything is made or applied: every path each patch
    names (:mod:`confine`), no empty patch, no patch twice (same content under two names)."""
    seen: dict[str, Patch] = {}
    for patch in patches:
        parsed = read_patch(patch, strip)
        confine.check_patch_text(confine.PatchRef(patch.name, patch.path), parsed, confine_hint(patch, resume=False))
        if not any(e.hunks or e.binary or e.modes or any(p.role.startswith(("rename", "copy")) for p in e.paths)
                   for e in parsed.entries):
            raise ConfigError(f"patch {patch.name} is empty: it changes no file", where=str(patch.path),
                              hint=f"remove {patch.path} from the series (or fill it), then run `dcaforge apply` again")
        key = hashlib.sha256(parsed.body).hexdigest()
        if key in seen:
            first = seen[key]
            raise ConfigError(f"patches {first.name} and {patch.name} make the same change (same content)",
                              where=f"{first.path} and {patch.path}",
                              hint="keep one of them in the series (the second would apply as nothing or conflict), "
                                   "then run `dcaforge apply` again")
        seen[key] = patch
