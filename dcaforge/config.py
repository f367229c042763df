"""dcaforge.yaml: the schema, its defaults, and where relative paths resolve.

Paths in a config resolve relative to ``root`` (default ``.``), which itself resolves relative
to the config file. The built-in default is ``examples/upstream.yaml`` of the repository
dcaforge is installed from (``root: ..``, so its paths resolve to the repository).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import REPO_ROOT
from .errors import ConfigError
from .yamlio import Reader, load_yaml

DEFAULT_CONFIG_NAME = "dcaforge.yaml"
BUILTIN_CONFIG = REPO_ROOT / "examples" / "upstream.yaml"

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_RANGE_RE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+))?\s*$")


@dataclass(frozen=True)
class GitSource:
    url: str  # a URL, or an absolute path to a local checkout
    ref: str = "HEAD"
    submodules: bool | tuple[str, ...] = False

    @property
    def local_path(self) -> Path | None:
        p = Path(self.url)
        return p if p.is_absolute() and p.exists() else None

    def describe(self) -> str:
        return f"git {self.url} @ {self.ref}"


@dataclass(frozen=True)
class PypiSource:
    requirement: str
    subdir: str = "."

    def describe(self) -> str:
        return f"pypi {self.requirement} [{self.subdir}]"


Source = GitSource | PypiSource


@dataclass(frozen=True)
class SeriesConfig:
    dir: Path
    range: tuple[int, int] | None = None
    file: Path | None = None  # a quilt-style series file listing the order


@dataclass(frozen=True)
class FeatureConfig:
    number: int
    name: str
    templates: Path
    marker: str
    vars: dict[str, Any] = field(default_factory=dict)

    @property
    def patch_name(self) -> str:
        return f"{self.number:04d}-{self.name}.patch"


@dataclass(frozen=True)
class Config:
    path: Path | None  # the config file (None for a config built in code)
    root: Path
    name: str
    workspace: Path
    source: Source
    llama_cpp_dir: str
    bootstrap: tuple[str | tuple[str, ...], ...]
    series: SeriesConfig
    feature: FeatureConfig

    @property
    def room(self) -> Path:
        return self.workspace / self.name

    @property
    def feature_patch(self) -> Path:
        return self.series.dir / self.feature.patch_name

    def describe(self) -> str:
        return str(self.path) if self.path else "(built in)"


TOP_KEYS = {"root", "name", "cleanroom", "source", "llama_cpp_dir", "bootstrap", "series", "feature"}


def find_config(explicit: Path | None, cwd: Path | None = None) -> Path:
    """The config to use: ``-c``, else ./dcaforge.yaml, else the built-in default."""
    if explicit is not None:
        if not explicit.is_file():
            raise ConfigError(f"config file not found: {explicit}", where=str(explicit),
                              hint="pass an existing file to -c/--config, or omit it to use ./dcaforge.yaml")
        return explicit
    local = (cwd or Path.cwd()) / DEFAULT_CONFIG_NAME
    if local.is_file():
        return local
    return BUILTIN_CONFIG


def load_config(explicit: Path | None = None, cwd: Path | None = None) -> Config:
    return parse_config(find_config(explicit, cwd))


def _rel_path(value: str, base: Path) -> Path:
    p = Path(value).expanduser()
    return (p if p.is_absolute() else base / p).resolve()


def _clean_relpath(r: Reader, key: str, value: str) -> str:
    p = Path(value)
    if p.is_absolute() or ".." in p.parts:
        raise r.error(key, f"'{r.key(key)}' must be a relative path inside the tree, got {value!r}")
    norm = p.as_posix()
    return "." if norm in ("", ".") else norm


def parse_config(path: Path) -> Config:
    path = path.resolve()
    file = str(path)
    top = Reader(load_yaml(path), file)
    top.check_keys(TOP_KEYS)
    root = _rel_path(top.get("root", str, default="."), path.parent)

    name = top.get("name", str, required=True)
    if not _NAME_RE.match(name):
        raise top.error("name", f"'name' must be a plain folder name (letters, digits, . _ -), got {name!r}")
    workspace = _rel_path(top.get("cleanroom", str, default="cleanroom"), root)

    src = top.sub("source", required=True)
    source: Source
    if src.has("git") == src.has("pypi"):
        raise ConfigError("'source' needs exactly one of 'git:' or 'pypi:'", where=src.where())
    if src.has("git"):
        src.check_keys({"git", "ref", "submodules"})
        url = src.get("git", str, required=True)
        if "://" not in url and not url.startswith("git@") and not Path(url).is_absolute():
            url = str(_rel_path(url, root))
        subs = src.get("submodules", (bool, list), default=False)
        if isinstance(subs, list):
            for i, s in enumerate(subs):
                if not isinstance(s, str):
                    raise src.error("submodules", f"'source.submodules[{i}]' must be a string path")
            subs = tuple(subs)
        source = GitSource(url=url, ref=str(src.get("ref", (str, int), default="HEAD")), submodules=subs)
    else:
        src.check_keys({"pypi", "subdir"})
        req = src.get("pypi", str, required=True)
        subdir = _clean_relpath(src, "subdir", src.get("subdir", str, default="."))
        source = PypiSource(requirement=req, subdir=subdir)

    llama_cpp_dir = _clean_relpath(top, "llama_cpp_dir", top.get("llama_cpp_dir", str, default="."))

    bootstrap: list[str | tuple[str, ...]] = []
    for i, step in enumerate(top.get("bootstrap", list, default=[])):
        if isinstance(step, str):
            bootstrap.append(step)
        elif isinstance(step, list) and all(isinstance(a, str) for a in step):
            bootstrap.append(tuple(step))
        else:
            raise ConfigError(f"'bootstrap[{i}]' must be a shell command string or an argv list",
                              where=f"{file}:{top.list_lines('bootstrap')[i]}")

    ser = top.sub("series")
    ser.check_keys({"dir", "range", "file"})
    series_dir = _rel_path(ser.get("dir", str, default="patches"), root)
    rng: tuple[int, int] | None = None
    raw_range = ser.get("range", (str, int))
    if raw_range is not None:
        m = _RANGE_RE.match(str(raw_range))
        if not m:
            raise ser.error("range", f"'series.range' must look like 0001-0077, got {raw_range!r}")
        lo = int(m.group(1))
        hi = int(m.group(2) or m.group(1))
        if hi < lo:
            raise ser.error("range", f"'series.range' is empty: {raw_range!r} ends before it starts")
        rng = (lo, hi)
    series_file = ser.get("file", str)
    if series_file is not None and rng is not None:
        raise ser.error("file", "'series' takes either 'range:' or 'file:', not both")
    series = SeriesConfig(dir=series_dir, range=rng,
                          file=_rel_path(series_file, series_dir) if series_file else None)

    feat = top.sub("feature", required=True)
    feat.check_keys({"number", "name", "templates", "marker", "vars"})
    number = feat.get("number", int, required=True)
    if not 0 < number < 10000:
        raise feat.error("number", f"'feature.number' must be between 1 and 9999, got {number}")
    fname = feat.get("name", str, required=True)
    if not _NAME_RE.match(fname):
        raise feat.error("name", f"'feature.name' must be a plain name (letters, digits, . _ -), got {fname!r}")
    feature = FeatureConfig(
        number=number,
        name=fname,
        templates=_rel_path(feat.get("templates", str, required=True), root),
        marker=feat.get("marker", str, required=True),
        vars=dict(feat.get("vars", dict, default={})),
    )
    return Config(path=path, root=root, name=name, workspace=workspace, source=source,
                  llama_cpp_dir=llama_cpp_dir, bootstrap=tuple(bootstrap), series=series, feature=feature)
