"""Making the clean room's start tree: submodules, then the ``bootstrap:`` steps.

Submodules of a local checkout are cloned from the checkout's own submodule repositories
(``.git/modules/<name>``) when they hold the pinned commit, so a llamafile checkout whose
``.gitmodules`` names GitHub is made into a room offline, in seconds, and without sharing a
file with the user's repositories (``file://`` clones copy objects, never hardlink them).

Bootstrap steps run in the new room (its root) after checkout and flattening, before the series:
a shell string, an argv list, or ``{patches: FOLDER}``: every ``*.patch`` in that folder of the
tree, in name order (bytewise, as ``LC_ALL=C`` globbing sorts), applied with
``patch -p1 --fuzz=0`` from the root, a dry run first: llamafile's ``make setup`` applies
``llama.cpp.patches/patches/*.patch`` that way (without ``--fuzz=0``: dcaforge never fuzzes).
Everything the steps leave in the tree, files the tree's ``.gitignore`` ignores included, is
committed as ``dcaforge: bootstrap`` (the steps listed in the message), so the start commit,
the baseline and every reset room hold exactly what the steps made.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import confine
from .config import BootstrapStep, Config
from .errors import CommandError, ConfigError, MismatchError
from .git import git, git_out, patch_cmd, run
from .patchfile import gnu_failure, gnu_names, load_patch, read_patch

BOOTSTRAP_MESSAGE = "dcaforge: bootstrap"


# --- submodules ---------------------------------------------------------------------------

def _gitmodules(repo: Path) -> list[tuple[str, str]]:
    """(name, path) of the submodules .gitmodules declares, in file order."""
    if not (repo / ".gitmodules").is_file():
        return []
    res = git(repo, "config", "-f", ".gitmodules", "--get-regexp", r"^submodule\..*\.path$", check=False)
    out = []
    for line in res.stdout.splitlines():
        key, _, path = line.partition(" ")
        out.append((key[len("submodule."):-len(".path")], path.strip()))
    return out


def _gitlink(repo: Path, path: str) -> str | None:
    """The commit the checked-out superproject commit pins for the submodule at ``path``."""
    out = git_out(repo, "ls-tree", "HEAD", "--", path)
    m = re.match(r"^160000 commit ([0-9a-f]{40,64})\t", out)
    return m.group(1) if m else None


def local_module_dir(checkout: Path, path: str) -> Path | None:
    """The git directory of the user's own clone of the submodule at ``path`` of ``checkout``
    (read from its ``.git`` file, never by running git there), or None."""
    dotgit = checkout / path / ".git"
    if dotgit.is_dir() and not dotgit.is_symlink():
        gitdir = dotgit
    elif dotgit.is_file():
        text = dotgit.read_text(encoding="utf-8", errors="replace").strip()
        if not text.startswith("gitdir:"):
            return None
        gitdir = (checkout / path / text[len("gitdir:"):].strip()).resolve()
    else:
        return None
    if (gitdir / "HEAD").is_file() and (gitdir / "objects").is_dir():
        return gitdir
    return None


def _has_commit(gitdir: Path, commit: str) -> bool:
    return git(gitdir, "--git-dir", str(gitdir), "cat-file", "-e", f"{commit}^{{commit}}", check=False).ok


@dataclass
class SubmoduleReport:
    paths: list[str] = field(default_factory=list)
    local: dict[str, str] = field(default_factory=dict)  # path -> the user's module repository used


def init_submodules(room: Path, paths: list[str], checkout: Path | None, report: SubmoduleReport,
                    prefix: str = "") -> None:
    """``git submodule update --init`` in ``room`` (``paths``: all when empty), recursively, with
    each submodule fetched from ``checkout``'s own clone of it when that clone has the pinned
    commit (else from the URL in .gitmodules)."""
    declared = _gitmodules(room)
    if not declared:
        return
    chosen = [(n, p) for n, p in declared if not paths or p in paths]
    unknown = [p for p in paths if p not in {p2 for _n, p2 in declared}]
    if unknown and not prefix:
        raise ConfigError(f"source.submodules names {', '.join(unknown)}, which .gitmodules does not declare",
                          where="source.submodules",
                          hint="declared: " + ", ".join(p for _n, p in declared))
    if not chosen:
        return
    git(room, "submodule", "init", "--", *[p for _n, p in chosen],
        hint="check the submodules' entries (url, update) in the source's .gitmodules; the clean room was not created")
    for name, path in chosen:
        commit = _gitlink(room, path)
        if checkout is None or commit is None:
            continue
        local = local_module_dir(checkout, path)
        if local is not None and _has_commit(local, commit):
            git(room, "config", f"submodule.{name}.url", local.as_uri())
            report.local[prefix + path] = str(local)
    git(room, "submodule", "update", "--", *[p for _n, p in chosen],
        hint="check the submodules' URLs in .gitmodules (and that the pinned commits exist there)")
    for _name, path in chosen:
        report.paths.append(prefix + path)
        init_submodules(room / path, [], checkout / path if checkout is not None else None, report,
                        prefix=f"{prefix}{path}/")


# --- bootstrap ----------------------------------------------------------------------------

@dataclass
class BootstrapReport:
    steps: int = 0
    patches: list[str] = field(default_factory=list)   # the tree's own patches applied, in order
    ignored_committed: list[str] = field(default_factory=list)  # ignored files made, committed all the same
    ignored_folders: list[str] = field(default_factory=list)    # ignored folders made (o/, build/): not committed
    committed: bool = False


def _step_hint(cfg: Config, step: BootstrapStep) -> str:
    return (f"nothing was made: the clean room was not created and the source is untouched; fix the step at "
            f"{step.where} (or the source at {getattr(cfg.source, 'ref', '')!s}) and run `dcaforge apply` again")


def _apply_patches(cfg: Config, room: Path, index: int, step: BootstrapStep, report: BootstrapReport,
                   on_step: Callable[[str], None], total: int) -> None:
    assert step.patches is not None
    folder = room / step.patches
    confine.resolve_in(room, step.patches, what="bootstrap patches folder", where=step.where,
                       hint="name a folder of the tree (relative to its root); the clean room was not created")
    if not folder.is_dir():
        raise ConfigError(f"bootstrap step {index}: folder {step.patches} is not in the source tree",
                          where=step.where,
                          hint="check the path (relative to the tree's root) and source.ref; "
                               "the clean room was not created")
    files = sorted((p for p in folder.iterdir() if p.name.endswith(".patch") and p.is_file()),
                   key=lambda p: p.name.encode())
    for k, path in enumerate(files, 1):
        rel = f"{step.patches}/{path.name}"
        on_step(f"bootstrap {index}/{total}: [{k}/{len(files)}] {rel}")
        patch = load_patch(path, rel)
        hint = (f"the clean room was not created and the source is untouched. This patch belongs to the source (at "
                f"{getattr(cfg.source, 'ref', '?')}): a patch may only change files of the tree; fix it in the source, "
                "then run `dcaforge apply` again")
        ref = confine.PatchRef(rel, path)
        parsed = read_patch(patch, step.strip)
        confine.check_patch_text(ref, parsed, hint)
        confine.check_patch_tree(ref, parsed, room, hint)
        for dry in (True, False):
            res = patch_cmd(room, path, dry_run=dry, strip=step.strip)
            if dry:
                confine.check_tool_paths(ref, parsed, "GNU patch", gnu_names(res.stdout), hint)
            if not res.ok:
                fail = gnu_failure(patch, res.stdout + res.stderr, step.strip)
                raise MismatchError(
                    f"bootstrap step {index} ({step.where}): the tree's own patch {k}/{len(files)} {path.name} does "
                    f"not apply with patch -p{step.strip} --fuzz=0",
                    where=fail.where(f"{rel} (in the source tree)"), details=fail.reason,
                    hint=f"the clean room was not created and the source is untouched. This patch belongs to the "
                         f"source (at {getattr(cfg.source, 'ref', '?')}): check source.ref and the submodule commit "
                         f"it pins; fix and commit the patch in the source, then run `dcaforge apply` again")
        report.patches.append(rel)


def _ignored(room: Path) -> tuple[list[str], list[str]]:
    """Files, and whole folders, that the tree's .gitignore files ignore (the fresh checkout has
    none, so the bootstrap made them)."""
    out = git(room, "status", "--porcelain=v1", "-z", "--ignored=matching", "--untracked-files=all").stdout
    entries = [e[3:] for e in out.split("\0") if e.startswith("!! ")]
    return sorted(e for e in entries if not e.endswith("/")), sorted(e for e in entries if e.endswith("/"))


def run_bootstrap(cfg: Config, room: Path, on_step: Callable[[str], None] | None = None) -> BootstrapReport:
    """Run the bootstrap steps in ``room`` and commit what they made (nothing when there are none)."""
    report = BootstrapReport()
    step_cb = on_step or (lambda s: None)
    total = len(cfg.bootstrap)
    for i, step in enumerate(cfg.bootstrap, 1):
        report.steps += 1
        if step.patches is not None:
            _apply_patches(cfg, room, i, step, report, step_cb, total)
            continue
        step_cb(f"bootstrap {i}/{total}: {step.describe()}")
        argv = ["bash", "-euo", "pipefail", "-c", step.shell] if step.shell is not None else list(step.argv or ())
        try:
            res = run(argv, room, check=False, what=f"bootstrap step {i}/{total}")
        except FileNotFoundError:
            raise CommandError(f"bootstrap step {i}/{total}: command not found: {argv[0]}",
                               where=step.where, hint=_step_hint(cfg, step)) from None
        if not res.ok:
            tail = "\n".join((res.stderr.strip() or res.stdout.strip()).splitlines()[-15:])
            raise CommandError(f"bootstrap step {i}/{total} failed (exit {res.returncode}): {step.describe()}",
                               where=f"{step.where} (run in the new clean room's root)",
                               details=tail or None, hint=_step_hint(cfg, step))
    if not cfg.bootstrap:
        return report
    report.ignored_committed, report.ignored_folders = _ignored(room)
    git(room, "add", "-A", ".")
    if report.ignored_committed:
        git(room, "add", "-f", "--", *report.ignored_committed)
    if git(room, "diff", "--cached", "--quiet", check=False).returncode != 0:
        lines = "".join(f"- {s.describe()}\n" for s in cfg.bootstrap)
        git(room, "commit", "-q", "--no-verify", "-m", f"{BOOTSTRAP_MESSAGE}\n\n{lines}")
        report.committed = True
    return report
