"""The hostile-input suite's arena: a small real source checkout, a series folder, a feature folder,
a canary folder, and a canary file that any payload of this suite would create if dcaforge ran it.

Every case runs dcaforge (through its CLI, in process) on something hostile and checks, through
:meth:`Arena.run`: the exit code; for an error, that it says what (``error:``), where (``where:``)
and what to do next (``next:``, a real step, not the generic fallback); that no command ran (the
canary file does not exist); and that no byte outside the clean-room workspace changed (every file
under the test's folder is hashed before and after, the source checkout's .git included), except
the files a case names as its expected output.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dcaforge.cli import app
from tests.core.conftest import FEATURE_MANIFEST, Project, isolated, write_feature  # noqa: F401 (the autouse fixture)
from tests.core.helpers import USER_GIT, build_tree, git_init, sh, source_files

GENERIC_HINT = "run it again with -v to see every git/patch command"
_RUNNER = CliRunner()


def tree_hashes(root: Path, skip: Iterable[Path] = ()) -> dict[str, tuple[int, str]]:
    """Mode and sha256 of every file and symlink under ``root`` (folders included by mode), but ``skip``."""
    skipped = {str(p) for p in skip}
    out: dict[str, tuple[int, str]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if os.path.join(dirpath, d) not in skipped)
        for name in sorted(filenames) + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            p = os.path.join(dirpath, name)
            if p in skipped:
                continue
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                data = os.readlink(p).encode("utf-8", "surrogateescape")
            elif stat.S_ISREG(st.st_mode) and st.st_size > 16 * 1024 * 1024:
                data = f"{st.st_size}:{st.st_mtime_ns}".encode()  # a huge (sparse) input: not read back
            elif stat.S_ISREG(st.st_mode):
                with open(p, "rb") as fh:
                    data = fh.read()
            else:
                data = b""
            out[os.path.relpath(p, root)] = (st.st_mode, hashlib.sha256(data).hexdigest())
        for d in dirnames:
            p = os.path.join(dirpath, d)
            out[os.path.relpath(p, root) + "/"] = (os.lstat(p).st_mode, "")
    return out


@dataclass
class Outcome:
    code: int
    output: str


class Arena(Project):
    """A :class:`~tests.core.conftest.Project` with a canary folder and a canary file. ``template``:
    a source checkout to copy (bytes and .git) instead of making one with git init + commit."""

    def __init__(self, tmp: Path, template: Path | None = None) -> None:
        if template is None:
            super().__init__(tmp)
        else:
            self.tmp = tmp
            self.source = tmp / "src-checkout"
            shutil.copytree(template, self.source, symlinks=True)
            self.base = sh(["git", "rev-parse", "HEAD"], self.source).stdout.decode().strip()
            self._set_up_work()
        self.canary = tmp / "canary"
        self.canary.mkdir()
        (self.canary / "secret.txt").write_text("the user's secret\n")
        (self.canary / "keep.txt").write_text("keep me\n")
        self.ran = self.canary / "RAN"  # what every payload of the suite creates
        self.payload = f"touch {self.ran}"
        self.workspace = tmp / "cleanroom"
        self.skip = [self.workspace, tmp / "cache"]

    @property
    def room(self) -> Path:
        return self.workspace / "room"

    def snapshot(self) -> dict[str, tuple[int, str]]:
        return tree_hashes(self.tmp, self.skip)

    def evil_index(self, monkeypatch: pytest.MonkeyPatch) -> Path:
        """A local index (pip's only one, through PIP_NO_INDEX and PIP_FIND_LINKS) holding an sdist whose
        build backend creates the canary when pip prepares it; returns its folder."""
        from tests.core.test_trust import evil_sdist

        links = self.tmp / "links"
        links.mkdir()
        evil_sdist(links, self.ran)
        monkeypatch.setenv("PIP_NO_INDEX", "1")
        monkeypatch.setenv("PIP_FIND_LINKS", str(links))
        return links

    def cli(self, *args: str) -> Outcome:
        r = _RUNNER.invoke(app, [str(a) for a in args])
        if r.exception is not None and not isinstance(r.exception, SystemExit):
            raise r.exception
        return Outcome(r.exit_code, r.output)

    def run(self, *args: str, code: int, what: str | None = None, where: str | None = None,
            next: str | None = None, changed: Iterable[Path] = (), may_change: Iterable[Path] = ()) -> Outcome:
        """Run ``dcaforge ARGS`` (``-c`` the arena's config unless given) and check the outcome."""
        argv = list(args)
        if "-c" not in argv and argv and argv[0] in ("apply", "render", "capture", "verify", "status", "templatize"):
            argv[1:1] = ["-c", str(self.config_path)]
        before = self.snapshot()
        out = self.cli(*argv)
        after = self.snapshot()
        self.check(out, code, what=what, where=where, next=next)
        allowed = {os.path.relpath(p, self.tmp) for p in (*changed, *may_change)}
        diff = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k) and k not in allowed)
        assert diff == [], f"bytes changed outside the clean room: {diff}\n{out.output}"
        for p in changed:
            rel = os.path.relpath(p, self.tmp)
            assert before.get(rel) != after.get(rel), f"{rel} was not written\n{out.output}"
        return out

    def check(self, out: Outcome, code: int, *, what: str | None = None, where: str | None = None,
              next: str | None = None) -> None:
        assert out.code == code, f"exit {out.code}, expected {code}\n{out.output}"
        assert not self.ran.exists(), f"a payload ran\n{out.output}"
        text = out.output
        if code != 0:
            head = "interrupted:" if code == 130 else "error:"
            assert head in text, text
            if code != 130:
                assert "  where: " in text, text
            nexts = [ln for ln in text.splitlines() if ln.strip().startswith("next:")]
            assert nexts and GENERIC_HINT not in nexts[-1], f"no real next step:\n{text}"
            if where is not None:
                wheres = "\n".join(ln for ln in text.splitlines() if ln.strip().startswith("where:"))
                assert where in wheres, f"{where!r} not in the where: line\n{text}"
        if what is not None:
            assert what in text, f"{what!r} not in\n{text}"
        if next is not None:
            assert next in text, f"{next!r} not in\n{text}"

    # --- building hostile inputs -----------------------------------------------------------
    def patch(self, name: str, data: bytes | str) -> Path:
        return self.add_patch(name, data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data)

    def commit_in_source(self, files: dict, message: str = "more") -> None:
        build_tree(self.source, files)
        sh([*USER_GIT, "add", "-A"], self.source)
        sh([*USER_GIT, "commit", "-q", "-m", message], self.source)

    def symlink_in_source(self, rel: str, target: str) -> None:
        link = self.source / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, link)
        sh([*USER_GIT, "add", "-A"], self.source)
        sh([*USER_GIT, "commit", "-q", "-m", f"symlink {rel}"], self.source)

    def manifest(self, text: str) -> None:
        write_feature(self.work, text)

    def applied(self) -> None:
        """A room with the series applied and the feature rendered (through the CLI)."""
        out = self.cli("apply", "-c", str(self.config_path))
        assert out.code == 0, out.output


@pytest.fixture(scope="session")
def source_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One source checkout for the session (copied into every case)."""
    base = tmp_path_factory.mktemp("hostile-template")
    env = {"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        git_init(base / "src-checkout", source_files())
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return base / "src-checkout"


@pytest.fixture
def arena(tmp_path: Path, source_template: Path) -> Arena:
    return Arena(tmp_path, source_template)


__all__ = ["FEATURE_MANIFEST", "Arena", "arena", "isolated", "source_files"]
