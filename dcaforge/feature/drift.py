"""Does the feature fit a tree: ``render --check`` and the drift canary.

:func:`check` plans the render onto the clean room's baseline (or any llama.cpp folder), writing
nothing, and reports per edit whether it fits, why each that does not fit fails, and whether the
build compiles and links every file the render adds (:mod:`dcaforge.feature.wiring`).

Each edit that does not fit is classified from the **pristine** baseline file (never from a file
the same render already changed):

- ``drifted``: what the anchor hooks is still there, the anchor text moved or changed (every
  identifier of the anchor is in the file, or the anchor matches more often than it should): the
  nearest lines of the file are shown, for every anchor tried.
- ``absent``: the file does not exist (an alternative file is named when the folder has one of the
  same stem, e.g. ``gemma3-iswa.cpp`` for ``gemma3.cpp``), or an identifier the anchor needs is in
  no line of the file. When another file of the tree has it, that file is named; otherwise the
  feature needs the upstream change that adds it.

:func:`canary` runs that check against a llama.cpp tree (a folder, or a PyPI sdist of
llama-cpp-python) and counts fit / drifted / absent, so a scheduled job can watch upstream.
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path

from dcaforge import guard
from dcaforge.config import Config, PypiSource, is_requirement
from dcaforge.errors import ConfigError, DcaforgeError
from dcaforge.feature.anchors import anchor_literal, closest_lines
from dcaforge.feature.manifest import load_manifest
from dcaforge.feature.plan import EditReport, plan
from dcaforge.feature.wiring import WiringReport, check_wiring
from dcaforge.room.cleanroom import BASELINE_TAG, Room
from dcaforge.room.source import prepare_pypi
from dcaforge.room.trees import DirTree, GitTree, Tree, baseline_commit

#: Words of an anchor that say nothing about what it hooks.
_COMMON = frozenset("""
auto bool break case char class const constexpr continue default define delete do double else endif enum
explicit extern false float for friend if ifdef ifndef include inline int int32_t int64_t long namespace new
nullptr operator override private protected public return short signed size_t sizeof static static_assert
struct switch template this true typedef typename uint32_t uint64_t union unsigned using virtual void
volatile while std
""".split())


def anchor_identifiers(anchor: str) -> list[str]:
    """The identifiers an anchor hooks (``GGML_OP_COUNT``, ``ctx_other``), common words left out."""
    words = re.findall(r"[A-Za-z_][A-Za-z0-9_]*", anchor_literal(re.sub(r"\\[ntrfv]", " ", anchor)))
    return list(dict.fromkeys(w for w in words if len(w) >= 3 and w not in _COMMON))


@dataclass
class Misfit:
    index: int
    manifest_line: int
    file: str                # the target (or the first candidate when none exists)
    kind: str                # "drifted" | "absent"
    reason: str
    nearest: list[tuple[str, list[str]]] = field(default_factory=list)  # (anchor label, nearest baseline lines)


class _Search:
    """Which files of a tree hold an identifier, each identifier searched once."""

    def __init__(self, tree: Tree, prefix: str) -> None:
        self.tree, self.prefix = tree, prefix
        self._found: dict[str, list[str]] = {}

    def files_with(self, word: str) -> list[str]:
        if word not in self._found:
            self._found[word] = self.tree.files_with(word, self.prefix)
        return self._found[word]


def _alternative_file(tree: Tree, prefix: str, wanted: str) -> str | None:
    """A file of the same folder whose stem extends or shortens the wanted one by a ``-suffix``
    (``gemma3-iswa.cpp`` for ``gemma3.cpp``, ``llama.cpp`` for ``llama-iswa.cpp``)."""
    folder, name = posixpath.split(wanted)
    stem, ext = posixpath.splitext(name)
    for n in tree.listdir(prefix + folder):
        s, e = posixpath.splitext(n)
        if e == ext and n != name and (s.startswith(stem + "-") or stem.startswith(s + "-")):
            return posixpath.join(folder, n)
    return None


@dataclass
class CheckResult:
    tree: str
    edits: list[EditReport]
    files: list[tuple[str, str]]
    misfits: list[Misfit] = field(default_factory=list)  # why each edit that does not fit fails
    wiring: WiringReport | None = None  # whether the build compiles and links every added source

    @property
    def anchors_ok(self) -> bool:
        return all(e.fits for e in self.edits)

    @property
    def ok(self) -> bool:
        return self.anchors_ok and (self.wiring is None or self.wiring.ok)



def folder_tree(tree_dir: Path) -> tuple[Tree, str]:
    """A llama.cpp tree given as a folder (``--tree DIR``), and its label."""
    if not tree_dir.is_dir():
        raise DcaforgeError(f"not a folder: {tree_dir}", where=str(tree_dir))
    return DirTree(tree_dir), str(tree_dir)


def check(cfg: Config, tree_dir: Path | None = None) -> CheckResult:
    """``dcaforge render --check``: which edits fit the baseline (or ``tree_dir``); writes nothing."""
    manifest = load_manifest(cfg.feature.templates)
    tree: Tree
    if tree_dir is not None:
        tree, label = folder_tree(tree_dir)
    else:
        room = Room.of(cfg)
        room.require()
        tree, label = GitTree(room.path, baseline_commit(room)), f"{room.path} @ {BASELINE_TAG}"
    p = plan(cfg, tree, manifest, check=True)
    res = CheckResult(tree=label, edits=p.edits, files=p.files)
    res.misfits = classify(res, tree, cfg.llama_prefix, {e.index: e.files for e in manifest.edits})
    res.wiring = check_wiring(cfg, tree, p.outputs)
    return res


def classify(check: CheckResult, tree: Tree, prefix: str, edits_files: dict[int, tuple[str, ...]]) -> list[Misfit]:
    """One :class:`Misfit` per edit that does not fit (``edits_files``: edit index -> its candidates)."""
    search = _Search(tree, prefix)
    out: list[Misfit] = []
    for rep in check.edits:
        if rep.fits:
            continue
        out.append(_classify_one(rep, tree, prefix, edits_files.get(rep.index, ()), search))
    return out


def _pristine(tree: Tree, prefix: str, rel: str) -> str | None:
    full = prefix + rel
    if not tree.is_file(full):
        return None
    return tree.read(full).decode("utf-8", errors="replace")


def _classify_one(rep: EditReport, tree: Tree, prefix: str, files: tuple[str, ...], search: _Search) -> Misfit:
    if rep.status == "no-file":
        wanted = files[0] if files else "?"
        alt = next((a for f in files if (a := _alternative_file(tree, prefix, f))), None)
        if alt:
            reason = (f"{' / '.join(files)} does not exist; this tree has {alt}: add it to the edit's 'file:' "
                      "list, with an alternative anchor if its code differs")
        else:
            reason = (f"{' / '.join(files)} does not exist in this tree (no file of that name in its folder): the "
                      "feature needs the upstream change that adds it (a newer llama.cpp), or guard the edit with "
                      "'when_exists:'")
        return Misfit(rep.index, rep.manifest_line, wanted, "absent", reason)
    rel = rep.file or (files[0] if files else "?")
    text = _pristine(tree, prefix, rel)
    m = Misfit(rep.index, rep.manifest_line, rel, "drifted", "")
    if rep.status == "ambiguous":
        m.reason = (f"{'the anchor' if not rep.variant else f'alternative {rep.variant}'} matches {rep.matches} times, "
                    f"expected {rep.count}: make it unique")
        m.nearest = [("matched", rep.closest)]
        return m
    if text is None:  # a file the render itself creates
        m.reason = "the anchor matches nowhere in the file this render creates"
        return m
    anchors = [(v, a) for v, a, _n, _c in rep.tried] or [(0, rep.anchor)]
    m.nearest = [("anchor" if v == 0 else f"alternative {v}", closest_lines(text, a)) for v, a in anchors]
    # the anchor fits another file of the same folder: the code moved there
    moved = _anchor_elsewhere(tree, prefix, rel, [a for _v, a in anchors], rep.count)
    if moved:
        m.reason = f"the anchor fits {moved} instead: add it to the edit's 'file:' list (an alternative file)"
        return m
    # identifiers the anchor needs that no file of the tree has: what the edit hooks does not exist yet
    gone = [w for w in anchor_identifiers(anchors[0][1])
            if not re.search(r"\b" + re.escape(w) + r"\b", text) and not search.files_with(w)]
    if gone:
        m.kind = "absent"
        names = ", ".join(f"`{w}`" for w in gone[:4])
        m.reason = (f"{names} in no file of this tree: the feature needs the upstream change that adds "
                    f"{'it' if len(gone) == 1 else 'them'} (a newer llama.cpp), or a 'when:' for trees without; "
                    "nearest lines in the baseline file:")
        return m
    m.reason = "the anchor moved or changed; nearest lines in the baseline file:"
    return m


def _anchor_elsewhere(tree: Tree, prefix: str, rel: str, anchors: list[str], count: int) -> str | None:
    folder, name = posixpath.split(rel)
    ext = posixpath.splitext(name)[1]
    for n in tree.listdir(prefix + folder):
        if n == name or not n.endswith(ext):
            continue
        other = _pristine(tree, prefix, posixpath.join(folder, n))
        if other is not None and any(len(re.findall(a, other)) == count for a in anchors):
            return posixpath.join(folder, n)
    return None


@dataclass
class Canary:
    tree: str
    check: CheckResult
    misfits: list[Misfit]

    @property
    def fit(self) -> int:
        return sum(1 for e in self.check.edits if e.status == "ok")

    @property
    def skipped(self) -> int:
        return sum(1 for e in self.check.edits if e.status == "skipped")

    @property
    def drifted(self) -> int:
        return sum(1 for m in self.misfits if m.kind == "drifted")

    @property
    def absent(self) -> int:
        return sum(1 for m in self.misfits if m.kind == "absent")

    def summary(self) -> str:
        return (f"fit {self.fit}, drifted {self.drifted}, absent {self.absent} (skipped {self.skipped}) "
                f"of {len(self.check.edits)} edits on {self.tree}")


def files_of(cfg: Config) -> dict[int, tuple[str, ...]]:
    return {e.index: e.files for e in load_manifest(cfg.feature.templates).edits}


def sdist_requirement(sdist: str, trust: bool) -> str:
    """The pip requirement of ``drift --sdist``: a llama-cpp-python version (PEP 440, checked:
    :func:`dcaforge.guard.pep440_version`), nothing else pip could read as a path, a URL or an
    option; with ``trust`` (--trust) also a package name with version specifiers
    (``llama-cpp-python==0.3.36``, ``my-fork>=1.0``), never a URL, a file or an option."""
    hint = ("give a llama-cpp-python version, e.g. `dcaforge drift --sdist 0.3.36`; a package name with version "
            "specifiers (llama-cpp-python==0.3.36) needs --trust")
    if trust and ("=" in sdist or "<" in sdist or ">" in sdist or not sdist[:1].isdigit()):
        if not is_requirement(sdist):
            raise ConfigError(f"--sdist must be a version or a package name with version specifiers, got {sdist!r}",
                              where="the command line (--sdist)",
                              hint="e.g. `dcaforge drift --sdist 0.3.36` or --sdist llama-cpp-python==0.3.36 (no URL, file or "
                                   "pip option)")
        return sdist
    version = guard.pep440_version(sdist, what="--sdist", where="the command line (--sdist)", hint=hint)
    return f"llama-cpp-python=={version}"


def canary(cfg: Config, *, tree_dir: Path | None = None, sdist: str | None = None, trust: bool = False) -> Canary:
    """``dcaforge drift``: the feature's anchors against a llama.cpp tree (a folder or the
    ``vendor/llama.cpp`` of the llama-cpp-python sdist ``sdist``, a version: :func:`sdist_requirement`),
    classified."""
    if (tree_dir is None) == (sdist is None):
        raise DcaforgeError("give exactly one of --tree DIR and --sdist VERSION",
                            hint="e.g. `dcaforge drift --sdist 0.3.36`")
    flat = dataclasses.replace(cfg, llama_cpp_dir=".")  # a llama.cpp tree itself, whatever the config's layout
    tree: Tree
    if tree_dir is not None:
        tree, label = folder_tree(tree_dir)
    else:
        req = sdist_requirement(sdist or "", trust)
        base = prepare_pypi(PypiSource(req, "vendor/llama.cpp"))
        tree, label = GitTree(Path(base.clone_url), base.ref), f"{req} [vendor/llama.cpp]"
    manifest = load_manifest(cfg.feature.templates)
    p = plan(flat, tree, manifest, check=True)
    res = CheckResult(tree=label, edits=p.edits, files=p.files)
    return Canary(tree=label, check=res, misfits=classify(res, tree, flat.llama_prefix, files_of(cfg)))
