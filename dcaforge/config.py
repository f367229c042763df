"""dcaforge.yaml: the schema, its defaults, and where relative paths resolve.

Paths in a config resolve relative to ``root`` (default ``.``), which itself resolves relative
to the config file. The built-in default is ``examples/upstream.yaml`` of the repository
dcaforge is installed from (``root: ..``, so its paths resolve to the repository).
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dcaforge import REPO_ROOT
from dcaforge.configsections import (
    NAME_RE,
    BookkeepingConfig,
    BootstrapStep,
    BuildConfig,
    GateConfig,
    clean_relpath,
    parse_bookkeeping,
    parse_bootstrap,
    parse_build,
    parse_gates,
    rel_path,
)
from dcaforge.errors import ConfigError
from dcaforge.yamlio import Reader, describe, load_yaml

DEFAULT_CONFIG_NAME = "dcaforge.yaml"
#: The built-in default in the checkout dcaforge runs from (an editable install, or the tests).
CHECKOUT_CONFIG = REPO_ROOT / "examples" / "upstream.yaml"
#: The same file as package data of a wheel (``pip install .``): setup.py copies it, the templates and the patch
#: it names into ``dcaforge/builtin/`` in the repository's layout, so its ``root: ..`` names that folder.
PACKAGED = Path(__file__).resolve().parent / "builtin"
PACKAGED_CONFIG = PACKAGED / "examples" / "upstream.yaml"
BUILTIN_CONFIG = CHECKOUT_CONFIG if CHECKOUT_CONFIG.is_file() else PACKAGED_CONFIG

_RANGE_RE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+))?\s*$")
#: A PyPI requirement dcaforge hands to pip: a name (extras allowed) and version specifiers, never
#: a URL, a file or an option.
_REQUIREMENT_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?(?:\[[A-Za-z0-9._,-]+\])?"
                             r"(?:\s*(?:===|==|~=|!=|>=|<=|<|>)\s*[A-Za-z0-9.*+!_-]+)?"
                             r"(?:\s*,\s*(?:===|==|~=|!=|>=|<=|<|>)\s*[A-Za-z0-9.*+!_-]+)*$")


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
    where: str = ""  # file:line of 'templates:' in the config, for messages

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
    bootstrap: tuple[BootstrapStep, ...]
    series: SeriesConfig
    feature: FeatureConfig
    build: BuildConfig = field(default_factory=lambda: BuildConfig())
    gates: tuple[GateConfig, ...] = ()
    bookkeeping: BookkeepingConfig = field(default_factory=BookkeepingConfig)

    @property
    def room(self) -> Path:
        return self.workspace / self.name

    @property
    def feature_patch(self) -> Path:
        return self.series.dir / self.feature.patch_name

    @property
    def llama_prefix(self) -> str:
        """``llama_cpp_dir`` as a prefix of room-relative paths: ``""`` or ``"dir/"``."""
        return "" if self.llama_cpp_dir in ("", ".") else self.llama_cpp_dir.rstrip("/") + "/"

    def describe(self) -> str:
        return str(self.path) if self.path else "(built in)"


TOP_KEYS = {"root", "name", "cleanroom", "source", "llama_cpp_dir", "bootstrap", "series", "feature",
            "build", "gates", "bookkeeping"}


def find_config(explicit: Path | None, cwd: Path | None = None) -> Path:
    """The config to use: ``-c``, else ./dcaforge.yaml, else the built-in default."""
    if explicit is not None:
        if not _config_file(explicit):
            raise ConfigError(f"config file not found: {explicit}", where=str(explicit),
                              hint="pass an existing file to -c/--config, or omit it to use ./dcaforge.yaml")
        return explicit
    local = (cwd or Path.cwd()) / DEFAULT_CONFIG_NAME
    if _config_file(local):
        return local
    if not BUILTIN_CONFIG.is_file():
        raise ConfigError(f"no {DEFAULT_CONFIG_NAME} here and no built-in default at {BUILTIN_CONFIG} (this dcaforge "
                          "was installed without it)", where=str(local),
                          hint="pass your config with -c (every command takes it), e.g. the examples/upstream.yaml "
                               "of a dcaforge checkout; or install dcaforge again from its checkout (pip install . "
                               "there), which carries the built-in default")
    return BUILTIN_CONFIG


def is_requirement(text: str) -> bool:
    """Whether ``text`` is a PyPI requirement dcaforge hands to pip: a package name (extras allowed)
    and version specifiers, never a URL, a file or a pip option."""
    return len(text) <= 200 and _REQUIREMENT_RE.match(text) is not None


def _config_file(path: Path) -> bool:
    """Whether ``path`` is a regular file; a folder on its way that cannot be entered is an error
    that says so (not "not found")."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except PermissionError:
        raise ConfigError(f"cannot read the config {path}: permission denied (a folder on its path cannot be entered)",
                          where=str(path), hint="make that folder enterable for you (`chmod u+x` on it), or pass a "
                                                "config you can read with -c") from None
    except (OSError, ValueError):
        return False


def load_config(explicit: Path | None = None, cwd: Path | None = None) -> Config:
    """The config :func:`find_config` finds, parsed. The built-in default from package data (a wheel's
    ``dcaforge/builtin/``) keeps its clean rooms in ``./cleanroom`` of the current folder (``cwd``), not in the
    installed package; its templates and patch are the package's, read only."""
    path = find_config(explicit, cwd)
    cfg = parse_config(path)
    if is_packaged(path):
        cfg = replace(cfg, workspace=(cwd or Path.cwd()).resolve() / "cleanroom")
    return cfg


def read_only_default(command: str, path: Path) -> ConfigError:
    """The error of a command that would write the built-in default's templates or patch inside the installed
    package (a wheel's dcaforge/builtin/): they are what the package ships, not the user's."""
    return ConfigError(f"{command} would write {path}, which is part of the installed dcaforge (the built-in "
                       "default's package data), not yours", where=str(path),
                       hint="to change the feature, work in a clone of dcaforge installed with `pip install -e .` (its "
                            "templates/ and patches/ are then yours), or copy examples/upstream.yaml, templates/dca and "
                            "patches/ to a folder of yours and pass -c")


def is_packaged(path: Path) -> bool:
    """Whether ``path`` is package data of the installed dcaforge (the built-in default's files in a wheel)."""
    return is_within(path, PACKAGED)



def parse_config(path: Path) -> Config:
    path = path.resolve()
    file = str(path)
    top = Reader(load_yaml(path), file)
    top.check_keys(TOP_KEYS)
    root = rel_path(top.get("root", str, default="."), path.parent)

    name = top.get("name", str, required=True)
    if not NAME_RE.match(name):
        raise top.error("name", f"'name' must be a plain folder name (letters, digits, . _ -), got {name!r}")
    workspace = rel_path(top.get("cleanroom", str, default="cleanroom"), root)
    source = _parse_source(top, root)
    llama_cpp_dir = clean_relpath(top, "llama_cpp_dir", top.get("llama_cpp_dir", str, default="."))
    bootstrap = parse_bootstrap(top)
    series = _parse_series(top, root)
    feature = _parse_feature(top, root)
    cfg = Config(path=path, root=root, name=name, workspace=workspace, source=source,
                 llama_cpp_dir=llama_cpp_dir, bootstrap=bootstrap, series=series, feature=feature,
                 build=parse_build(top), gates=parse_gates(top, root),
                 bookkeeping=parse_bookkeeping(top, root))
    _check_room_in_tree(cfg, top)
    return cfg


def _parse_source(top: Reader, root: Path) -> Source:
    src = top.sub("source", required=True)
    if src.has("git") == src.has("pypi"):
        raise ConfigError("'source' needs exactly one of 'git:' or 'pypi:'", where=src.where())
    if src.has("git"):
        src.check_keys({"git", "ref", "submodules"})
        url = src.get("git", str, required=True)
        if "://" not in url and not url.startswith("git@") and not Path(url).is_absolute():
            url = str(rel_path(url, root))
        subs = src.get("submodules", (bool, list), default=False)
        if isinstance(subs, list):
            for i, s in enumerate(subs):
                if not isinstance(s, str):
                    raise src.error("submodules", f"'source.submodules[{i}]' must be a string path, got {describe(s)}",
                                    hint="list the submodules by their paths, e.g. submodules: [llama.cpp]")
            subs = tuple(subs)
        return GitSource(url=url, ref=str(src.get("ref", (str, int), default="HEAD")), submodules=subs)
    src.check_keys({"pypi", "subdir"})
    req = src.get("pypi", str, required=True)
    if not is_requirement(req):
        raise src.error("pypi", f"'source.pypi' must be a package name with a version, like "
                                f"llama-cpp-python==0.3.36, got {req!r}",
                        hint="a name and '==VERSION' (no URL, no pip option): the sdist is downloaded once and kept")
    subdir = clean_relpath(src, "subdir", src.get("subdir", str, default="."))
    return PypiSource(requirement=req, subdir=subdir)


def _parse_series(top: Reader, root: Path) -> SeriesConfig:
    ser = top.sub("series")
    ser.check_keys({"dir", "range", "file"})
    series_dir = rel_path(ser.get("dir", str, default="patches"), root)
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
    return SeriesConfig(dir=series_dir, range=rng,
                        file=rel_path(series_file, series_dir) if series_file else None)


def _parse_feature(top: Reader, root: Path) -> FeatureConfig:
    feat = top.sub("feature", required=True)
    feat.check_keys({"number", "name", "templates", "marker", "vars"})
    number = feat.get("number", int, required=True)
    if not 0 < number < 10000:
        raise feat.error("number", f"'feature.number' must be between 1 and 9999, got {number}")
    fname = feat.get("name", str, required=True)
    if not NAME_RE.match(fname):
        raise feat.error("name", f"'feature.name' must be a plain name (letters, digits, . _ -), got {fname!r}")
    return FeatureConfig(
        number=number,
        name=fname,
        templates=rel_path(feat.get("templates", str, required=True), root),
        marker=feat.get("marker", str, required=True),
        vars=dict(feat.get("vars", dict, default={})),
        where=feat.where("templates"),
    )



def working_tree_of(path: Path) -> Path | None:
    """The git working tree that holds ``path`` (the nearest folder above it with a ``.git``), or None."""
    for folder in (path, *path.parents):
        if (folder / ".git").exists():
            return folder
    return None


def _check_room_in_tree(cfg: Config, top: Reader) -> None:
    """A relative ``root:`` that climbs out of the git working tree holding the config (``root: ..`` of
    examples/upstream.yaml, copied into another checkout) would put the clean room in the folder above that tree:
    refused, with what it resolved to. A config that puts its room elsewhere on purpose (an absolute ``root:`` or
    ``cleanroom:``, a room inside the tree) is left alone."""
    raw = top.get("root", str, default=".")
    if cfg.path is None or Path(raw).expanduser().is_absolute() or ".." not in Path(raw).parts:
        return
    tree = working_tree_of(cfg.path.parent)
    if tree is None or is_within(cfg.root, tree) or is_within(cfg.room, tree):
        return
    copy = cfg.path.parent.name != "examples"
    raise ConfigError(
        f"the clean room would land outside the working tree that holds this config: root: {raw} resolves to "
        f"{cfg.root}, above {tree}, so the clean room would be {cfg.room}", where=top.where("root"),
        details=f"paths in a config resolve against root:, and a relative root: against the config's folder "
                f"({cfg.path.parent})",
        hint=("this looks like a copy of one of dcaforge's examples/ (root: .. names the dcaforge checkout from its "
              "examples/ folder): " if copy else "")
             + "set root: to the folder that holds the templates/ and patches/ it means (an absolute path, or . for "
               "the config's own folder), or set cleanroom: to where the clean room should go")


def is_within(child: Path, parent: Path) -> bool:
    try:
        child.resolve().relative_to(parent.resolve())
    except ValueError:
        return False
    return True

