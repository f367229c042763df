"""The sections of dcaforge.yaml beside the tree and the feature: ``bootstrap:``, ``bookkeeping:``,
``build:`` and ``gates:`` (their schema and their parsers), and the path rules every section's paths
follow (:mod:`dcaforge.config` reads the file and the rest of it)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dcaforge.confine import path_problem
from dcaforge.errors import ConfigError
from dcaforge.ruler import TASKS as RULER_TASKS
from dcaforge.yamlio import Reader, describe

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def rel_path(value: str, base: Path) -> Path:
    p = Path(value).expanduser()
    return (p if p.is_absolute() else base / p).resolve()


def clean_relpath(r: Reader, key: str, value: str) -> str:
    p = Path(value)
    problem = path_problem(value) if value.strip() not in ("", ".") else None
    if p.is_absolute() or ".." in p.parts or problem:
        raise r.error(key, f"'{r.key(key)}' must be a relative path inside the tree, got {value!r}"
                      + (f", which {problem}" if problem else ""),
                      hint="a folder of the tree relative to its root, e.g. llama.cpp (or . for the whole tree)")
    norm = p.as_posix()
    return "." if norm in ("", ".") else norm


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


# --- bootstrap: and bookkeeping: ----------------------------------------------------------

def parse_bootstrap(top: Reader) -> tuple[BootstrapStep, ...]:
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
            folder = clean_relpath(r, "patches", r.get("patches", str, required=True))
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


def parse_bookkeeping(top: Reader, root: Path) -> BookkeepingConfig:
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
        path = rel_path(d.get("file", str, required=True), root)
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


def parse_build(top: Reader) -> BuildConfig:
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
        dir=clean_relpath(c, "dir", c.get("dir", str, default="build")),
        cuda_dir=clean_relpath(c, "cuda_dir", c.get("cuda_dir", str, default="build-cuda")),
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
        cuda_output=clean_relpath(lf, "cuda_output", lf.get("cuda_output", str, default="o/cuda/ggml-cuda.so")),
        cuda_script=clean_relpath(lf, "cuda_script", lf.get("cuda_script", str, default="llamafile/cuda.sh")),
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


def parse_gates(top: Reader, root: Path) -> tuple[GateConfig, ...]:
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
        if not NAME_RE.match(name):
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
            options["text"] = rel_path(options["text"], root)
        out.append(GateConfig(name=name, kind=kind, where=g.where(), options=options, recipe=recipe,
                              model=rel_path(model, root) if model is not None else None))
    return tuple(out)
