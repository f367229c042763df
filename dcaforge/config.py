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
from dcaforge.confine import path_problem
from dcaforge.errors import ConfigError
from dcaforge.ruler import TASKS as RULER_TASKS
from dcaforge.yamlio import Reader, describe, load_yaml

DEFAULT_CONFIG_NAME = "dcaforge.yaml"
#: The built-in default in the checkout dcaforge runs from (an editable install, or the tests).
CHECKOUT_CONFIG = REPO_ROOT / "examples" / "upstream.yaml"
#: The same file as package data of a wheel (``pip install .``): setup.py copies it, the templates and the patch
#: it names into ``dcaforge/builtin/`` in the repository's layout, so its ``root: ..`` names that folder.
PACKAGED = Path(__file__).resolve().parent / "builtin"
PACKAGED_CONFIG = PACKAGED / "examples" / "upstream.yaml"
BUILTIN_CONFIG = CHECKOUT_CONFIG if CHECKOUT_CONFIG.is_file() else PACKAGED_CONFIG

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
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
class BootstrapStep:
    """One ``bootstrap:`` step, run in the new clean room (the tree's root) before the series.

    Exactly one of ``shell`` (a string, run by ``bash -euo pipefail -c``), ``argv`` (a list) or
    ``patches`` (a folder of the tree: every ``*.patch`` in it, in name order, applied with
    ``patch -p<strip> --fuzz=0`` from the root, as llamafile's ``make setup`` applies its own).
    """

    where: str  # file:line of the step, for messages
    shell: str | None = None
    argv: tuple[str, ...] | None = None
    patches: str | None = None
    strip: int = 1

    def record(self) -> Any:
        """What the room's state records (and ``apply --fresh`` compares)."""
        if self.patches is not None:
            return {"patches": self.patches, "strip": self.strip}
        return self.shell if self.shell is not None else list(self.argv or ())

    def describe(self) -> str:
        if self.patches is not None:
            return f"patches {self.patches}/*.patch (patch -p{self.strip} --fuzz=0)"
        if self.shell is not None:
            lines = [ln.strip() for ln in self.shell.strip().splitlines() if ln.strip()]
            code = [ln for ln in lines if not ln.startswith("#")] or lines
            return code[0] + (" ..." if len(lines) > 1 else "")
        return " ".join(self.argv or ())


@dataclass(frozen=True)
class BookkeepingDoc:
    """A Markdown file capture keeps up to date: one line (a table row or a list item) in one
    section, identified by the feature's number (series README) or its marker (UPSTREAM_SYNC)."""

    file: Path
    section: str     # the heading's text, any level (e.g. "Current series")
    template: str    # Jinja, renders to one line
    where: str       # file:line of the template in the config


@dataclass(frozen=True)
class BookkeepingConfig:
    series_readme: BookkeepingDoc | None = None
    upstream_sync: BookkeepingDoc | None = None

    @property
    def docs(self) -> tuple[BookkeepingDoc, ...]:
        return tuple(d for d in (self.series_readme, self.upstream_sync) if d is not None)


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


# --- build: and gates: (read by build.py and gate.py) -----------------------------------

BACKENDS = ("cmake", "llamafile")
GATE_KINDS = ("off-identity", "noop-below-chunk", "extension", "ruler")


@dataclass(frozen=True)
class CmakeBuildConfig:
    generator: str = "Ninja"
    dir: str = "build"              # relative to the tree (clean room or baseline worktree)
    cuda_dir: str = "build-cuda"    # the --cuda build's folder, same base
    defines: tuple[tuple[str, str], ...] = ()  # extra -D NAME=VALUE, over build.DEFAULT_DEFINES
    cuda_defines: tuple[tuple[str, str], ...] = ()  # more -D for the --cuda build only
    cuda_architectures: str = "86;90"
    targets: tuple[str, ...] = ()   # () = cmake's default target (everything)


@dataclass(frozen=True)
class LlamafileBuildConfig:
    make: str | None = None         # None: the cosmocc make in .cosmocc/<ver>/bin, else `make` on PATH
    targets: tuple[str, ...] = ()   # () = the Makefile's default goal
    cuda_flags: tuple[str, ...] = ()
    cuda_output: str = "o/cuda/ggml-cuda.so"  # relative to the clean room
    cuda_script: str = "llamafile/cuda.sh"  # the GPU library script, relative to the clean room
    # the programs whose link lines must carry the feature's objects (`build --dry-run` checks them)
    programs: tuple[str, ...] = ("o//llama.cpp/server/llama-server", "o//llamafile/llamafile")


@dataclass(frozen=True)
class BuildConfig:
    backend: str = "cmake"
    jobs: int | None = None         # None: the machine's cores
    ccache: bool = True             # use ccache when it is installed
    cmake: CmakeBuildConfig = field(default_factory=CmakeBuildConfig)
    llamafile: LlamafileBuildConfig = field(default_factory=LlamafileBuildConfig)


@dataclass(frozen=True)
class GateConfig:
    name: str
    kind: str                       # one of GATE_KINDS
    where: str                      # file:line of the entry, for messages
    model: Path | None = None       # a GGUF file
    recipe: str | None = None       # or "tiny:<arch>[:<variant>]" (dcaforge/gate/gatetools/tiny.py)
    options: dict[str, Any] = field(default_factory=dict)  # the kind's own settings


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


def _rel_path(value: str, base: Path) -> Path:
    p = Path(value).expanduser()
    return (p if p.is_absolute() else base / p).resolve()


def _clean_relpath(r: Reader, key: str, value: str) -> str:
    p = Path(value)
    problem = path_problem(value) if value.strip() not in ("", ".") else None
    if p.is_absolute() or ".." in p.parts or problem:
        raise r.error(key, f"'{r.key(key)}' must be a relative path inside the tree, got {value!r}"
                      + (f", which {problem}" if problem else ""),
                      hint="a folder of the tree relative to its root, e.g. llama.cpp (or . for the whole tree)")
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
                    raise src.error("submodules", f"'source.submodules[{i}]' must be a string path, got {describe(s)}",
                                    hint="list the submodules by their paths, e.g. submodules: [llama.cpp]")
            subs = tuple(subs)
        source = GitSource(url=url, ref=str(src.get("ref", (str, int), default="HEAD")), submodules=subs)
    else:
        src.check_keys({"pypi", "subdir"})
        req = src.get("pypi", str, required=True)
        if not is_requirement(req):
            raise src.error("pypi", f"'source.pypi' must be a package name with a version, like "
                                    f"llama-cpp-python==0.3.36, got {req!r}",
                            hint="a name and '==VERSION' (no URL, no pip option): the sdist is downloaded once and kept")
        subdir = _clean_relpath(src, "subdir", src.get("subdir", str, default="."))
        source = PypiSource(requirement=req, subdir=subdir)

    llama_cpp_dir = _clean_relpath(top, "llama_cpp_dir", top.get("llama_cpp_dir", str, default="."))

    bootstrap = _parse_bootstrap(top)

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
        where=feat.where("templates"),
    )
    cfg = Config(path=path, root=root, name=name, workspace=workspace, source=source,
                 llama_cpp_dir=llama_cpp_dir, bootstrap=bootstrap, series=series, feature=feature,
                 build=_parse_build(top), gates=_parse_gates(top, root),
                 bookkeeping=_parse_bookkeeping(top, root, feature))
    _check_room_in_tree(cfg, top)
    return cfg


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


# --- bootstrap: and bookkeeping: ----------------------------------------------------------

def _parse_bootstrap(top: Reader) -> tuple[BootstrapStep, ...]:
    steps: list[BootstrapStep] = []
    lines = top.list_lines("bootstrap")
    for i, step in enumerate(top.get("bootstrap", list, default=[])):
        where = f"{top.file}:{lines[i] if i < len(lines) else top.line}"
        if isinstance(step, str):
            if not step.strip():
                raise ConfigError(f"'bootstrap[{i}]' is an empty command", where=where)
            steps.append(BootstrapStep(where=where, shell=step))
        elif isinstance(step, list) and step and all(isinstance(a, str) for a in step):
            steps.append(BootstrapStep(where=where, argv=tuple(step)))
        elif isinstance(step, dict):
            r = Reader(step, top.file, f"bootstrap[{i}]", line=lines[i] if i < len(lines) else 0)
            r.check_keys({"patches", "strip"})
            folder = _clean_relpath(r, "patches", r.get("patches", str, required=True))
            strip = r.get("strip", int, default=1)
            if not 0 <= strip <= 9:
                raise r.error("strip", f"'bootstrap[{i}].strip' must be between 0 and 9, got {strip}")
            steps.append(BootstrapStep(where=where, patches=folder, strip=strip))
        else:
            raise ConfigError(f"'bootstrap[{i}]' must be a shell command string, an argv list or "
                              f"a mapping {{patches: FOLDER, strip: 1}}, got {describe(step)}", where=where,
                              hint="e.g. bootstrap: [\"make setup\", [make, -j2], {patches: llama.cpp.patches}]")
    return tuple(steps)


#: What the bookkeeping templates get (besides vars, marker, feature, llama_cpp_dir).
BOOKKEEPING_CONTEXT = ("feature", "marker", "vars", "llama_cpp_dir", "patch", "sha256", "files", "n_files",
                       "marked_files", "marker_sites")
DEFAULT_README_ROW = "| `{{ feature.id }}` | {{ n_files }} files | `{{ marker }}` |"
DEFAULT_SYNC_ENTRY = "- `{{ marker }}`: {{ feature.id }}, {{ marker_sites }} marked lines in {{ marked_files | length }} files"


def _parse_bookkeeping(top: Reader, root: Path, feature: FeatureConfig) -> BookkeepingConfig:
    import jinja2
    import jinja2.meta

    from dcaforge import sandbox

    bk = top.sub("bookkeeping")
    bk.check_keys({"series_readme", "upstream_sync"})
    docs: dict[str, BookkeepingDoc | None] = {}
    for key, tkey, default_section, default_template in (
            ("series_readme", "row", "Current series", DEFAULT_README_ROW),
            ("upstream_sync", "entry", "Markers", DEFAULT_SYNC_ENTRY)):
        if not bk.has(key):
            docs[key] = None
            continue
        d = bk.sub(key)
        d.check_keys({"file", "section", tkey})
        path = _rel_path(d.get("file", str, required=True), root)
        if path.suffix.lower() not in (".md", ".markdown"):
            raise d.error("file", f"'{d.key('file')}' must be a Markdown file (.md), got {path.name!r}")
        section = d.get("section", str, default=default_section).strip().lstrip("#").strip()
        if not section:
            raise d.error("section", f"'{d.key('section')}' must be a heading's text, e.g. {default_section!r}")
        template = d.get(tkey, str, default=default_template)
        where = d.where(tkey) if d.has(tkey) else d.where()
        # read, never run: a config is loaded by every command (status too), and its templates are
        # the user's text; capture renders them (sandboxed) and checks what they give
        try:
            names = jinja2.meta.find_undeclared_variables(sandbox.environment().parse(template))
        except jinja2.TemplateSyntaxError as exc:
            raise ConfigError(f"'{d.key(tkey)}' is not a usable template: {exc.message}", where=where,
                              hint="the context has: " + ", ".join(BOOKKEEPING_CONTEXT)) from None
        unknown = sorted(names - set(BOOKKEEPING_CONTEXT))
        if unknown:
            raise ConfigError(f"'{d.key(tkey)}' is not a usable template: '{unknown[0]}' is undefined", where=where,
                              hint="the context has: " + ", ".join(BOOKKEEPING_CONTEXT))
        docs[key] = BookkeepingDoc(file=path, section=section, template=template, where=where)
    return BookkeepingConfig(series_readme=docs["series_readme"], upstream_sync=docs["upstream_sync"])


# --- build: and gates: ------------------------------------------------------------------

def _str_list(r: Reader, key: str) -> tuple[str, ...]:
    value = r.get(key, list, default=[])
    for i, item in enumerate(value):
        if not isinstance(item, (str, int, float)) or isinstance(item, bool):
            raise r.error(key, f"'{r.key(key)}[{i}]' must be a string, got {describe(item)}",
                          hint=f"write each item of {key} as a string, e.g. {key}: [one, two]")
    return tuple(str(v) for v in value)


def _define_value(r: Reader, name: str, value: Any) -> str:
    if isinstance(value, bool):  # YAML reads OFF/ON as booleans
        return "ON" if value else "OFF"
    if isinstance(value, (str, int, float)):
        return str(value)
    raise r.error(name, f"'{r.key(name)}' must be a string, a number or ON/OFF, got {describe(value)}",
                  hint=f"write it as one value, e.g. {name}: ON")


def _parse_build(top: Reader) -> BuildConfig:
    b = top.sub("build")
    b.check_keys({"backend", "jobs", "ccache", "cmake", "llamafile"})
    backend = b.get("backend", str, default="cmake")
    if backend not in BACKENDS:
        raise b.error("backend", f"'build.backend' must be one of {', '.join(BACKENDS)}, got {backend!r}")
    jobs = b.get("jobs", int)
    if jobs is not None and jobs < 1:
        raise b.error("jobs", f"'build.jobs' must be at least 1, got {jobs}")

    c = b.sub("cmake")
    c.check_keys({"generator", "dir", "cuda_dir", "defines", "cuda_defines", "cuda_architectures", "targets"})

    def read_defines(key: str) -> tuple[tuple[str, str], ...]:
        d = c.sub(key)
        out: list[tuple[str, str]] = []
        for k in d.data:
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", k):
                raise d.error(k, f"'{d.key(k)}' is not a CMake variable name")
            out.append((k, _define_value(d, k, d.data[k])))
        return tuple(out)

    defines = read_defines("defines")
    archs = c.get("cuda_architectures", (str, int), default="86;90")
    cmake = CmakeBuildConfig(
        generator=c.get("generator", str, default="Ninja"),
        dir=_clean_relpath(c, "dir", c.get("dir", str, default="build")),
        cuda_dir=_clean_relpath(c, "cuda_dir", c.get("cuda_dir", str, default="build-cuda")),
        defines=defines,
        cuda_defines=read_defines("cuda_defines"),
        cuda_architectures=str(archs),
        targets=_str_list(c, "targets"),
    )

    lf = b.sub("llamafile")
    lf.check_keys({"make", "targets", "cuda_flags", "cuda_output", "cuda_script", "programs"})
    llamafile = LlamafileBuildConfig(
        make=lf.get("make", str),
        targets=_str_list(lf, "targets"),
        cuda_flags=_str_list(lf, "cuda_flags"),
        cuda_output=_clean_relpath(lf, "cuda_output", lf.get("cuda_output", str, default="o/cuda/ggml-cuda.so")),
        cuda_script=_clean_relpath(lf, "cuda_script", lf.get("cuda_script", str, default="llamafile/cuda.sh")),
        programs=_str_list(lf, "programs") or LlamafileBuildConfig.programs,
    )
    return BuildConfig(backend=backend, jobs=jobs, ccache=b.get("ccache", bool, default=True),
                       cmake=cmake, llamafile=llamafile)


#: Settings each gate kind takes besides name, kind, model, recipe (the defaults live in gate.py).
GATE_OPTIONS: dict[str, dict[str, type | tuple[type, ...]]] = {
    "off-identity": {"n_tokens": int, "flash_attn": list, "threads": int},
    "noop-below-chunk": {"chunk": int, "local": int, "n_tokens": int, "tolerance": float, "flash_attn": list,
                         "threads": int},
    "extension": {"text": str, "trained": int, "contexts": list, "chunk": int, "local": int, "dca_args": list,
                  "extra_args": list, "ppl_ratio_max": float, "plain_ratio_min": float, "passkey_trials": int,
                  "passkey_min": float, "threads": int, "methods": list, "yarn_factor": float},
    "ruler": {"tasks": list, "trained": int, "scales": list, "contexts": list, "methods": list, "samples": int,
              "seed": int, "chunk": int, "local": int, "dca_args": list, "extra_args": list, "yarn_factor": float,
              "n_predict": int, "fewshot": bool, "chat": bool, "send": str, "threads": int, "score_min": float,
              "yarn_margin": float, "vt_probe": bool, "load_timeout": float, "request_timeout": float},
}


#: The values the gates' list settings may hold.
GATE_CHOICES: dict[str, tuple[str, ...]] = {"methods": ("plain", "yarn", "dca"), "tasks": RULER_TASKS,
                                            "send": ("tokens", "text")}


def _check_gate_lists(g: Reader, i: int, options: dict[str, Any]) -> None:
    """methods/tasks name known things once each; scales and contexts are positive numbers."""
    for key, allowed in GATE_CHOICES.items():
        if key not in options:
            continue
        value = options[key]
        items = value if isinstance(value, list) else [value]
        for item in items:
            if not isinstance(item, str) or item not in allowed:
                raise g.error(key, f"'gates[{i}].{key}' takes {', '.join(allowed)}, got {item!r}")
        if isinstance(value, list) and (not items or len(set(items)) != len(items)):
            raise g.error(key, f"'gates[{i}].{key}' must name at least one of {', '.join(allowed)}, each once")
    for key, kind in (("scales", (int, float)), ("contexts", (int,))):
        for item in options.get(key, []):
            if not isinstance(item, kind) or isinstance(item, bool) or item <= 0:
                want = "positive numbers (multiples of the trained length)" if key == "scales" else "positive token counts"
                raise g.error(key, f"'gates[{i}].{key}' must be {want}, got {item!r}")


def _parse_gates(top: Reader, root: Path) -> tuple[GateConfig, ...]:
    items = top.get("gates", list, default=[])
    lines = top.list_lines("gates")
    out: list[GateConfig] = []
    seen: set[str] = set()
    for i, item in enumerate(items):
        line = lines[i] if i < len(lines) else 0
        if not isinstance(item, dict):
            raise ConfigError(f"'gates[{i}]' must be a mapping (name:, kind:, ...), got {describe(item)}",
                              where=f"{top.file}:{line}", hint="e.g. gates: [{name: ext, kind: extension, recipe: \"tiny:qwen2\"}]")
        g = Reader(item, top.file, f"gates[{i}]", line=line)
        kind = g.get("kind", str, required=True)
        if kind not in GATE_KINDS:
            raise g.error("kind", f"'gates[{i}].kind' must be one of {', '.join(GATE_KINDS)}, got {kind!r}")
        spec = GATE_OPTIONS[kind]
        g.check_keys({"name", "kind", "model", "recipe", *spec})
        name = g.get("name", str, required=True)
        if not _NAME_RE.match(name):
            raise g.error("name", f"'gates[{i}].name' must be a plain name (letters, digits, . _ -), got {name!r}")
        if name in seen:
            raise g.error("name", f"two gates are named {name!r}")
        seen.add(name)
        model, recipe = g.get("model", str), g.get("recipe", str)
        if (model is None) == (recipe is None):
            raise ConfigError(f"gate {name!r} needs exactly one of 'model:' (a GGUF file) or 'recipe:' (tiny:<arch>)",
                              where=g.where())
        if recipe is not None and not re.match(r"^tiny:[a-z0-9]+(:[a-z-]+)?$", recipe):
            raise g.error("recipe", f"'gates[{i}].recipe' must look like tiny:qwen2 or tiny:gemma3:zero-global, got {recipe!r}")
        options: dict[str, Any] = {}
        for key, types in sorted(spec.items()):
            value = g.get(key, types)
            if value is not None:
                options[key] = list(value) if isinstance(value, list) else value
        _check_gate_lists(g, i, options)
        if "text" in options:
            options["text"] = _rel_path(options["text"], root)
        out.append(GateConfig(name=name, kind=kind, where=g.where(), options=options, recipe=recipe,
                              model=_rel_path(model, root) if model is not None else None))
    return tuple(out)
