"""The package's shape, read from its code with ``ast`` (nothing is imported or run): no import
circle between its modules, no private name (``_x``) taken from another module, and a library
that never talks to the terminal (only ``dcaforge/cli.py`` and ``dcaforge/commands/`` do).

Imports inside functions count: a circle closed by a late import is still a circle."""

from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import dcaforge

PACKAGE = Path(dcaforge.__file__).resolve().parent
#: The modules that may print, and import the terminal libraries.
COMMAND_LAYER = ("dcaforge.cli", "dcaforge.commands")
TERMINAL_LIBRARIES = {"rich", "typer", "click"}


@dataclass
class Shape:
    edges: dict[str, set[str]] = field(default_factory=dict)          # module -> the modules it imports
    private: list[str] = field(default_factory=list)                  # "a.py:12 takes _x from b"
    printing: list[str] = field(default_factory=list)                 # "a.py:3 print(...)"


def module_names(root: Path) -> dict[str, Path]:
    """Every module of the package under ``root`` by its dotted name (a package by its __init__)."""
    out: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = [root.name, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _is_dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


def _main_script_functions(tree: ast.Module) -> set[ast.AST]:
    """The ``main`` function of a module run as a script (``if __name__ == "__main__"``): a tool of its own."""
    runs_as_script = any(isinstance(n, ast.If) and "__main__" in ast.unparse(n.test) for n in tree.body)
    return {n for n in tree.body if runs_as_script and isinstance(n, ast.FunctionDef) and n.name == "main"}


def read_shape(root: Path) -> Shape:
    mods = module_names(root)
    shape = Shape(edges={m: set() for m in mods})
    for name, path in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        rel = path.relative_to(root.parent)
        aliases: dict[str, str] = {}  # local name -> the package module it stands for
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    base = f"{base}.{node.module}" if node.module else base
                else:
                    base = node.module or ""
                if base.split(".")[0] in TERMINAL_LIBRARIES and not name.startswith(COMMAND_LAYER):
                    shape.printing.append(f"{rel}:{node.lineno} imports {base}")
                if base != root.name and not base.startswith(root.name + "."):
                    continue
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    if sub in mods:
                        shape.edges[name].add(sub)
                        aliases[alias.asname or alias.name] = sub
                        continue
                    if base in mods and base != name:
                        shape.edges[name].add(base)
                    if alias.name.startswith("_") and not _is_dunder(alias.name) and base != name:
                        shape.private.append(f"{rel}:{node.lineno} takes {alias.name} from {base}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    top = alias.name.split(".")[0]
                    if top in TERMINAL_LIBRARIES and not name.startswith(COMMAND_LAYER):
                        shape.printing.append(f"{rel}:{node.lineno} imports {alias.name}")
                    if top == root.name:
                        target = alias.name
                        while target not in mods and "." in target:
                            target = target.rsplit(".", 1)[0]
                        shape.edges[name].add(target)
                        aliases[alias.asname or alias.name] = target
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and node.attr.startswith("_") and not _is_dunder(node.attr) and aliases[node.value.id] != name):
                shape.private.append(f"{rel}:{node.lineno} takes {node.attr} from {aliases[node.value.id]}")
        if name.startswith(COMMAND_LAYER):
            continue
        scripts = _main_script_functions(tree)
        allowed = {id(n) for f in scripts for n in ast.walk(f)}
        for node in ast.walk(tree):
            if id(node) in allowed:
                continue
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                shape.printing.append(f"{rel}:{node.lineno} print(...)")
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "sys"
                    and node.attr in ("stdout", "stderr")):
                shape.printing.append(f"{rel}:{node.lineno} sys.{node.attr}")
    for name in shape.edges:
        shape.edges[name].discard(name)
    return shape


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle() -> None:
    shape = read_shape(PACKAGE)
    assert len(shape.edges) > 20, "the package's modules were not found"
    assert sum(len(v) for v in shape.edges.values()) > 50, "no imports were read"
    found = circles(shape.edges)
    assert found == [], "modules that import each other (in a loop):\n" + "\n".join(" <-> ".join(c) for c in found)


def test_no_private_name_crosses_a_module() -> None:
    shape = read_shape(PACKAGE)
    assert shape.private == [], ("private names taken from another module (make them public where they belong, or "
                                 "move them):\n" + "\n".join(shape.private))


def test_the_library_never_prints() -> None:
    shape = read_shape(PACKAGE)
    assert shape.printing == [], ("only dcaforge/cli.py and dcaforge/commands/ may print or use rich/typer/click; "
                                  "return the data instead:\n" + "\n".join(shape.printing))


def test_the_checks_find_what_they_look_for(tmp_path: Path) -> None:
    """The same reading on a small package that has each fault: a circle closed by a late import,
    a private name taken across modules (by import and by attribute), and a library that prints."""
    pkg = tmp_path / "dcaforge"
    (pkg / "commands").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "a.py": "from .b import helper, _hidden\n",
        "b.py": "def helper():\n    from . import c\n    return c\n_hidden = 1\n",
        "c.py": "from . import a\nimport rich\n",
        "d.py": "from . import b\nx = b._hidden\nprint(x)\n",
        "tool.py": "def main():\n    print('ok')\n\nif __name__ == '__main__':\n    main()\n",
        "commands/__init__.py": "",
        "commands/show.py": "import typer\nfrom ..a import helper\nprint(helper)\n",
    }
    for rel, text in files.items():
        (pkg / rel).write_text(textwrap.dedent(text))
    shape = read_shape(pkg)
    assert circles(shape.edges) == [["dcaforge.a", "dcaforge.b", "dcaforge.c"]]
    assert shape.private == ["dcaforge/a.py:1 takes _hidden from dcaforge.b", "dcaforge/d.py:2 takes _hidden from dcaforge.b"]
    assert shape.printing == ["dcaforge/c.py:2 imports rich", "dcaforge/d.py:3 print(...)"]
    assert shape.edges["dcaforge.commands.show"] == {"dcaforge.a"}


# --- the walls between the wings (docs/development.md, "The wings") -----------------------------------------------
#: The command line: the only layer that may import every wing (and nothing imports it).
CLI_LAYER = ("cli", "commands")


def wing_fronts(root: Path) -> dict[str, set[str]]:
    """Each wing (a sub-package whose __init__ names a FRONT) with the modules code outside it may import."""
    out: dict[str, set[str]] = {}
    for init in sorted(root.glob("*/__init__.py")):
        for node in ast.parse(init.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["FRONT"]:
                out[init.parent.name] = set(ast.literal_eval(node.value))
    return out


def part_of(module: str, wings: dict[str, set[str]]) -> str:
    """``room``/``feature``/... for a wing's module, ``cli`` for the command line, ``core`` for the flat shared modules."""
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in wings:
        return parts[1]
    return "cli" if len(parts) > 1 and parts[1] in CLI_LAYER else "core"


def wall_breaches(root: Path) -> list[str]:
    """Imports that cross a wall: into a wing's inside (not its FRONT), from the core into a wing or the command
    line, or from a wing into the command line."""
    wings = wing_fronts(root)
    out = []
    for src, targets in sorted(read_shape(root).edges.items()):
        here = part_of(src, wings)
        for dst in sorted(targets):
            there = part_of(dst, wings)
            if here == there or there == "core":
                continue
            if there == "cli" or here == "core":
                out.append(f"{src} -> {dst} ({here} may not import {there})")
            elif dst.split(".")[2:3] and dst.split(".")[2] not in wings[there]:
                out.append(f"{src} -> {dst} (inside the {there} wing; its front: {', '.join(sorted(wings[there]))})")
    return out


def wing_edges(root: Path) -> dict[str, set[str]]:
    """The import graph folded to the wings (and the core and the command line)."""
    wings = wing_fronts(root)
    out: dict[str, set[str]] = {}
    for src, targets in read_shape(root).edges.items():
        here = part_of(src, wings)
        out.setdefault(here, set()).update(part_of(t, wings) for t in targets)
        out[here].discard(here)
    return out


def test_the_wings_are_there() -> None:
    assert set(wing_fronts(PACKAGE)) == {"room", "feature", "patch", "builder", "gate"}
    for wing, front in wing_fronts(PACKAGE).items():
        missing = {m for m in front if not (PACKAGE / wing / f"{m}.py").is_file()}
        assert not missing, f"{wing}'s FRONT names modules it does not have: {sorted(missing)}"


def test_no_import_through_a_wall() -> None:
    found = wall_breaches(PACKAGE)
    assert found == [], ("imports through a wall (import the wing's front, add the module to its FRONT, or move the "
                         "code):\n" + "\n".join(found))


def test_no_circle_between_wings() -> None:
    edges = wing_edges(PACKAGE)
    assert {"room", "feature", "patch", "builder", "gate", "core", "cli"} <= set(edges)
    found = circles(edges)
    assert found == [], "wings that import each other (in a loop):\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_walls_find_what_they_look_for(tmp_path: Path) -> None:
    """A small package with each breach: an import of a wing's inside, the core importing a wing, a wing
    importing the command line, and two wings in a loop (through their fronts)."""
    pkg = tmp_path / "dcaforge"
    files = {
        "__init__.py": "",
        "errors.py": "from dcaforge.room import front\n",
        "cli.py": "from dcaforge.room import front\n",
        "room/__init__.py": "FRONT = ('front',)\n",
        "room/front.py": "from dcaforge.room import inside\nfrom dcaforge.patch import series\n",
        "room/inside.py": "from dcaforge import errors\n",
        "patch/__init__.py": "FRONT = ('series',)\n",
        "patch/series.py": "from dcaforge.room.front import x\nfrom dcaforge.room import inside\nfrom .. import cli\n",
    }
    for rel, text in files.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    assert wall_breaches(pkg) == [
        "dcaforge.errors -> dcaforge.room.front (core may not import room)",
        "dcaforge.patch.series -> dcaforge.cli (patch may not import cli)",
        "dcaforge.patch.series -> dcaforge.room.inside (inside the room wing; its front: front)",
    ]
    assert circles(wing_edges(pkg)) == [["cli", "core", "patch", "room"]]  # room -> patch -> cli -> room, core -> room
