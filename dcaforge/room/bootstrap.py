"""Making the clean room's start tree: submodules, then the ``bootstrap:`` steps.

Submodules of a local checkout are cloned from the checkout's own submodule repositories (the
submodule's ``.git`` file, else ``.git/modules/<name>``; nested ones from their parent's
``modules/<name>``, which keeps the clone after its work tree was deleted) when they hold the
pinned commit, so a llamafile checkout whose ``.gitmodules`` names GitHub is made into a room
offline, in seconds, and without sharing a file with the user's repositories (``file://`` clones
copy objects, never hardlink them). A submodule no clone of the checkout holds is never fetched
from its URL: it is left out, which is right when the bootstrap deletes it (llamafile's setup
deletes ``stable-diffusion.cpp/ggml``) and an error naming the cause otherwise.

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
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dcaforge import confine
from dcaforge.checkout import CheckoutInfo
from dcaforge.config import Config
from dcaforge.configsections import BootstrapStep
from dcaforge.errors import CommandError, ConfigError, MismatchError
from dcaforge.git import git, git_out, patch_cmd, run
from dcaforge.patchfile import gnu_failure, gnu_names, load_patch, read_patch

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


def _read_gitdir(path: Path) -> Path | None:
    """The git directory a work tree's ``.git`` (a folder, or a ``gitdir:`` file) names, read as data
    (never by running git there), when it looks like a repository."""
    if path.is_dir() and not path.is_symlink():
        gitdir = path
    elif path.is_file():
        text = path.read_text(encoding="utf-8", errors="replace").strip()
        if not text.startswith("gitdir:"):
            return None
        gitdir = (path.parent / text[len("gitdir:"):].strip()).resolve()
    else:
        return None
    if (gitdir / "HEAD").is_file() and (gitdir / "objects").is_dir():
        return gitdir
    return None


def local_module_dir(checkout: Path, path: str) -> Path | None:
    """The git directory of the user's own clone of the submodule at ``path`` of ``checkout``
    (read from its ``.git`` file, never by running git there), or None."""
    return _read_gitdir(checkout / path / ".git")


def _has_commit(gitdir: Path, commit: str) -> bool:
    # --work-tree: a submodule's clone records its work tree (core.worktree), which may be deleted
    return git(gitdir, "--git-dir", str(gitdir), "--work-tree", str(gitdir), "cat-file", "-e", f"{commit}^{{commit}}",
               check=False).ok


@dataclass(frozen=True)
class LocalModules:
    """Where the user's clones of the submodules at one level live: the parent's work tree in the
    checkout (its submodules' ``.git`` files) and the parent's git directories (their ``modules/``
    folders, which keep a clone after its work tree was deleted, e.g. by llamafile's setup)."""

    worktree: Path | None
    gitdirs: tuple[Path, ...]

    def candidates(self, name: str, path: str) -> list[Path]:
        out: list[Path] = []
        if self.worktree is not None:
            out.append(self.worktree / path / ".git")
        out += [d / "modules" / name for d in self.gitdirs]
        return out

    def find(self, name: str, path: str, commit: str) -> Path | None:
        for cand in self.candidates(name, path):
            gitdir = _read_gitdir(cand)
            if gitdir is not None and _has_commit(gitdir, commit):
                return gitdir
        return None


@dataclass(frozen=True)
class AbsentModule:
    """A submodule whose pinned commit no clone in the user's checkout holds: not checked out (a room
    of a local checkout is made offline); fine when the bootstrap deletes its folder."""

    path: str
    commit: str
    url: str
    looked_in: tuple[str, ...]


@dataclass
class SubmoduleReport:
    paths: list[str] = field(default_factory=list)      # checked out, parents before their submodules
    local: dict[str, str] = field(default_factory=dict)  # path -> the user's module repository used
    absent: list[AbsentModule] = field(default_factory=list)  # left out: no local clone holds the commit
    listed: set[str] = field(default_factory=set)       # entries of an explicit list that were found
    declared: set[str] = field(default_factory=set)     # every submodule of the levels visited


def _proxy(gitdir: Path, scratch: Path, key: str) -> Path:
    """A bare repository in ``scratch`` that borrows the objects of the user's clone ``gitdir``
    (``objects/info/alternates``, read only) and copies its branches and tags: the room's submodule
    is cloned from it. Cloning the user's clone itself would make git's upload-pack change into
    the work tree that clone records (``core.worktree``), which llamafile's setup may have deleted
    (``stable-diffusion.cpp/ggml``); nothing is written in the user's repository either way."""
    proxy = scratch / (re.sub(r"[^A-Za-z0-9._-]+", "_", key) + ".git")
    scratch.mkdir(parents=True, exist_ok=True)
    git(scratch, "init", "-q", "--bare", str(proxy))
    (proxy / "objects" / "info" / "alternates").write_text(str(gitdir / "objects") + "\n")
    refs = git(gitdir, "--git-dir", str(gitdir), "--work-tree", str(gitdir), "for-each-ref",
               "--format=%(objectname) %(refname)", "refs/heads", "refs/tags").stdout
    lines = "".join(f"update {ref} {oid}\n" for oid, _, ref in (ln.partition(" ") for ln in refs.splitlines()) if ref)
    if lines:
        git(proxy, "--git-dir", str(proxy), "update-ref", "--stdin", input=lines.encode())
    return proxy


def checkout_modules(checkout: CheckoutInfo | None) -> LocalModules | None:
    """Where the top-level submodules of a local checkout have their clones."""
    if checkout is None:
        return None
    dirs = tuple(dict.fromkeys(d for d in (checkout.git_dir, checkout.common_dir) if d is not None))
    return LocalModules(worktree=checkout.toplevel, gitdirs=dirs)


def init_submodules(room: Path, paths: list[str] | None, local: LocalModules | None, report: SubmoduleReport,
                    scratch: Path, prefix: str = "") -> None:
    """Check out the submodules of ``room`` (``paths``: an explicit list of full paths, nested ones
    as ``parent/path``; None: every one, recursively).

    From a local checkout (``local``), each comes from the checkout's own clone of it (its work
    tree's ``.git`` file, else the parent's ``modules/<name>``) when that holds the pinned commit;
    one that no clone holds is not checked out but recorded in ``report.absent`` (offline: never
    fetched from its URL). From a URL source, each comes from the URL in .gitmodules. ``scratch``: a
    folder for the stand-in repositories of :func:`_proxy` (the caller removes it)."""
    declared = _gitmodules(room)
    chosen = [(n, p) for n, p in declared if paths is None or prefix + p in paths]
    report.declared |= {prefix + p for _n, p in declared}
    report.listed |= {prefix + p for _n, p in chosen}
    if not chosen:
        return
    git(room, "submodule", "init", "--", *[p for _n, p in chosen],
        hint="check the submodules' entries (url, update) in the source's .gitmodules; the clean room was not created")
    fetch: list[tuple[str, str]] = []
    found: dict[str, Path] = {}
    for name, path in chosen:
        commit = _gitlink(room, path)
        if local is None or commit is None:
            fetch.append((name, path))
            continue
        gitdir = local.find(name, path, commit)
        if gitdir is None:
            url = git(room, "config", "-f", ".gitmodules", f"submodule.{name}.url", check=False).stdout.strip()
            report.absent.append(AbsentModule(prefix + path, commit, url,
                                              tuple(str(c) for c in local.candidates(name, path))))
            continue
        git(room, "config", f"submodule.{name}.url", _proxy(gitdir, scratch, prefix + path).as_uri())
        report.local[prefix + path] = str(gitdir)
        found[path] = gitdir
        fetch.append((name, path))
    if not fetch:
        return
    git(room, "submodule", "update", "--", *[p for _n, p in fetch],
        hint="check the submodules' URLs in .gitmodules (and that the pinned commits exist there): from a URL source "
             "they are fetched from there; a source that is a local checkout uses its own clones, offline")
    for _name, path in fetch:
        report.paths.append(prefix + path)
        sub_local = None
        if local is not None:
            sub_local = LocalModules(worktree=local.worktree / path if local.worktree is not None else None,
                                     gitdirs=(found[path],) if path in found else ())
        init_submodules(room / path, paths, sub_local, report, scratch, prefix=f"{prefix}{path}/")


def absent_error(absent: list[AbsentModule], checkout: Path | None, why: str) -> ConfigError:
    """The error for submodules no clone of the checkout holds (after the bootstrap left their folders)."""
    first = absent[0]
    parent = first.path.split("/", 1)[0]
    details = "\n".join(f"{a.path}: commit {a.commit} (url {a.url or '?'}); looked in " + ", ".join(a.looked_in)
                         for a in absent)
    top = shlex.quote(str(checkout)) if checkout else "<your checkout>"
    return ConfigError(
        f"submodule{'s' if len(absent) > 1 else ''} {', '.join(a.path for a in absent)}: the pinned commit is in no "
        f"clone of your checkout (a room of a local checkout is made offline, never from the URL) {why}",
        where="source.submodules", details=details,
        hint=f"check it out in your checkout (`git -C {top} submodule update --init --recursive {shlex.quote(parent)}`) "
             "and run apply again, or leave it out: list the submodules the room needs (source.submodules: [path, "
             "...]; a listed submodule's own submodules are left out unless listed as parent/path)")


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
