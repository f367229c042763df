"""No back doors (issue 33): the paths around ``--trust``, the lock, templatize and the tree readers.

The rule (docs/reliability.md, dcaforge/guard.py): nothing that came from a config, a tree, a patch,
a template or a command-line value is executed, followed out of the room, or opened for writing
through a link, unless the user consented. Each case below got through before:

1. the room lock followed a symlink (truncating its target) and was deleted on release whatever was there;
2. ``build --dry-run`` ran ``$(shell ...)`` of the Makefile and of config values, and its GPU script
   found the real nvcc through ``$CUDA_PATH`` and deleted a cache under ``$HOME`` (``--clean``);
3. ``drift --sdist`` handed any value to pip;
4. templatize copied what room symlinks point at, rewrote the feature folder (links, empty folders)
   and wrote beside it or into a source checkout;
5. a relative ``XDG_CONFIG_HOME`` (or ``HOME``) granted trust from the current folder;
6. tree readers hung on FIFOs, crashed on unreadable, huge, dangling or looping files, followed links out;
7. tracebacks: leftovers of interrupted runs, configs in folders that cannot be entered, signals at start-up;
8. ``gate`` deleted and wrote through a symlinked output folder; ``capture -o`` onto dcaforge's own
   files; a bad ``build.llamafile.make`` without ``where:``.

Cases that need a separate process (a hang, a signal, a file root may not read) run dcaforge as its
console script does, with the same checks as :meth:`Arena.run`.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import tomllib
from pathlib import Path

import pytest

from tests.core.helpers import sigint_default

from .conftest import Arena, Outcome

REPO = Path(__file__).resolve().parents[2]
_SCRIPTS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
_MODULE, _FUNC = _SCRIPTS["dcaforge"].split(":")
#: what the installed `dcaforge` script runs
ENTRY = f"import sys; from {_MODULE} import {_FUNC}; sys.exit({_FUNC}())"
NO_DAC = ["setpriv", "--inh-caps=-dac_override,-dac_read_search", "--bounding-set=-dac_override,-dac_read_search", "--"]


def child(arena: Arena, *args: str, code: int, what: str | None = None, where: str | None = None,
          next: str | None = None, unreadable: bool = False, env: dict[str, str] | None = None,
          timeout: float = 60, changed: tuple[Path, ...] = ()) -> Outcome:
    """``dcaforge ARGS`` as a process of its own, checked as :meth:`Arena.run` checks (and: no
    traceback, no hang). ``unreadable``: without root's power to read any file (files of mode 000
    are then unreadable for root too)."""
    argv = [sys.executable, "-c", ENTRY, *args]
    if unreadable and os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("root without setpriv: every file is readable")  # pragma: no cover
        argv = [*NO_DAC, *argv]
    before = arena.snapshot()
    try:
        proc = subprocess.run(argv, cwd=arena.tmp, capture_output=True, timeout=timeout, check=False,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "COLUMNS": "200", **(env or {})})
    except subprocess.TimeoutExpired:
        pytest.fail(f"dcaforge {' '.join(args)} hung (still running after {timeout} s)")
    out = Outcome(proc.returncode, proc.stdout.decode(errors="replace") + proc.stderr.decode(errors="replace"))
    assert "Traceback" not in out.output, out.output
    _check(arena, out, code, what=what, where=where, next=next)
    after = arena.snapshot()
    allowed = {os.path.relpath(p, arena.tmp) for p in changed}
    diff = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k) and k not in allowed)
    assert diff == [], f"bytes changed outside the clean room: {diff}\n{out.output}"
    return out


def _check(arena: Arena, out: Outcome, code: int, **kw: str | None) -> None:
    """:meth:`Arena.check`, but exit 3 of ``drift`` is a result (a table and a summary), not an error."""
    if code == 3 and "error:" not in out.output:
        assert out.code == 3 and not arena.ran.exists() and "of 5 edits on" in out.output, out.output
        return
    arena.check(out, code, **kw)


def tree_run(arena: Arena, *args: str, code: int, **kw: str | None) -> Outcome:
    """``dcaforge ARGS`` in process, checked as :meth:`Arena.run` checks (:func:`_check`)."""
    before = arena.snapshot()
    out = arena.cli(*args)
    _check(arena, out, code, **kw)
    assert arena.snapshot() == before, out.output
    return out


def _append_config(arena: Arena, text: str) -> None:
    arena.config_path.write_text(arena.config_path.read_text() + textwrap.dedent(text))


def _rel(arena: Arena, p: Path) -> str:
    return os.path.relpath(p, arena.tmp)


# --- 1. the lock --------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["symlink-to-a-file", "dangling-symlink", "hard-link", "fifo"])
def test_lock_is_never_written_through(arena: Arena, kind: str) -> None:
    """`ln -s ~/.bashrc <workspace>/<room>.lock` truncated ~/.bashrc; a dangling link made its target,
    a hard link is the same file, a FIFO gave a traceback."""
    arena.workspace.mkdir()
    lock = arena.workspace / "room.lock"
    target = arena.canary / "secret.txt"
    if kind == "symlink-to-a-file":
        os.symlink(target, lock)
    elif kind == "dangling-symlink":
        os.symlink(arena.canary / "made-by-the-lock", lock)
    elif kind == "hard-link":
        os.link(target, lock)
    else:
        os.mkfifo(lock)
    what = {"symlink-to-a-file": "is a symlink to", "dangling-symlink": "is a symlink to", "hard-link": "hard link",
            "fifo": "FIFO"}[kind]
    arena.run("apply", code=1, what=what, where=str(lock), next="move it away")
    assert target.read_text() == "the user's secret\n" and not (arena.canary / "made-by-the-lock").exists()
    assert os.path.lexists(lock)  # never deleted: dcaforge did not make it


def test_capture_onto_the_lock_is_refused_and_kept(arena: Arena) -> None:
    """`capture -o <workspace>/<room>.lock` wrote the patch there, and releasing the lock deleted it."""
    arena.applied()
    arena.run("capture", "-o", str(arena.workspace / "room.lock"), code=1, what="the clean room's lock",
              next="capture -o")
    assert not (arena.workspace / "room.lock").exists()


def test_a_file_put_where_the_lock_was_outlives_the_release(arena: Arena) -> None:
    """The lock is deleted on release only while it is still the file this run made."""
    from dcaforge.room.cleanroom import Room, locked

    room = Room.of(arena.config)
    mine = arena.tmp / "mine.txt"
    mine.write_text("put here while the lock was held\n")
    with locked(room):
        os.replace(mine, room.lock_file)
    assert room.lock_file.read_text() == "put here while the lock was held\n"


# --- 2. build --dry-run -----------------------------------------------------------------------

LLAMAFILE_BUILD = """\
build:
  backend: llamafile
  llamafile:
    programs: [o//prog]
"""
MAKEFILE = "o//prog: o//main.o\n\techo link o//main.o -o o//prog\no//main.o: src/llama.cpp\n\techo cc -c src/llama.cpp -o o//main.o\n"


def _llamafile_room(arena: Arena, makefile: str = MAKEFILE, script: str | None = None, build: str = LLAMAFILE_BUILD) -> None:
    files = {"Makefile": makefile}
    if script is not None:
        files["llamafile/cuda.sh"] = script
        files["src/kernel.cu"] = "__global__ void k() {}\n"
    arena.commit_in_source(files)
    _append_config(arena, build)
    arena.applied()


@pytest.mark.parametrize("cuda", [False, True])
def test_dry_run_without_consent_runs_nothing_of_the_tree(arena: Arena, cuda: bool) -> None:
    """make -n still runs the Makefile's $(shell ...): the dry run needs consent, and says how to give it."""
    _llamafile_room(arena, f"X := $(shell {arena.payload})\n" + MAKEFILE,
                    script=f"#!/bin/sh\n{arena.payload}\n" if cuda else None)
    out = arena.run("build", "-c", str(arena.config_path), "--dry-run", *(["--cuda"] if cuda else []), code=1,
                    what="runs code of the tree and the config", where="build.llamafile", next="--dry-run")
    assert "--trust" in out.output and "render --check" in out.output


@pytest.mark.parametrize("value", ["--eval=$(shell {payload})", "COSMOCC=$(shell {payload})", "-f{tmp}/evil.mk",
                                   "$(shell {payload})", "o//prog; {payload}", "..\\evil", "o//prog o//other"])
def test_dry_run_config_values_are_targets_not_make_code(arena: Arena, value: str) -> None:
    """build.llamafile.programs went to make as they were: an option, an assignment or a function ran."""
    (arena.tmp / "evil.mk").write_text(f"$(shell {arena.payload})\n")
    _llamafile_room(arena, "X = $(COSMOCC)\nY := $(X)\n" + MAKEFILE)
    v = value.format(payload=arena.payload, tmp=arena.tmp)
    quoted = "'" + v.replace("'", "''") + "'"
    arena.config_path.write_text(arena.config_path.read_text().replace("programs: [o//prog]", f"programs: [{quoted}]"))
    arena.run("build", "-c", str(arena.config_path), "--dry-run", code=1, what="is not a make target",
              where="build.llamafile.programs", next="give the path of a target")


@pytest.mark.parametrize("dry", [True, False])
def test_targets_on_the_command_line_are_targets_only(arena: Arena, dry: bool) -> None:
    _llamafile_room(arena)
    arena.run("build", "-c", str(arena.config_path), *(["--dry-run"] if dry else []), "--targets",
              f"--eval=$(shell {arena.payload})", code=1, what="is not a make target", where="--targets")


CUDA_SCRIPT = """\
#!/bin/sh
# as llamafile 0.10.1's cuda.sh: --clean deletes its cache under $HOME; nvcc found as {how}
OUT=o/cuda/ggml-cuda.so
while [ $# -gt 0 ]; do
  case "$1" in
    --clean) rm -rf "$HOME/.cache/llamafile-cuda-build"; shift ;;
    --output) OUT="$2"; shift 2 ;;
    *) shift ;;
  esac
done
mkdir -p "$(dirname "$OUT")" "$HOME/.cache/llamafile-cuda-build"
exec {finder} --shared -o "$OUT" src/kernel.cu
"""
FINDERS = {"CUDA_PATH-default": '"${CUDA_PATH:-/usr/local/cuda}/bin/nvcc"', "CUDA_HOME": '"$CUDA_HOME/bin/nvcc"',
           "NVCC": '"$NVCC"', "CUDACXX": '"${CUDACXX:-nvcc}"', "PATH": "nvcc", "CUDA_ROOT": '"$CUDA_ROOT/bin/nvcc"'}


@pytest.mark.parametrize("how", sorted(FINDERS))
def test_dry_run_cuda_starts_no_compiler_and_deletes_nothing(arena: Arena, monkeypatch: pytest.MonkeyPatch,
                                                             how: str) -> None:
    """With consent the GPU script runs, but every way it finds nvcc leads to the recording stand-in
    (the real one here would create the canary), and no --clean: the cache under $HOME stays."""
    _llamafile_room(arena, script=CUDA_SCRIPT.format(how=how, finder=FINDERS[how]))
    real = arena.tmp / "real-cuda"
    (real / "bin").mkdir(parents=True)
    (real / "bin" / "nvcc").write_text(f"#!/bin/sh\n{arena.payload}\n")
    (real / "bin" / "nvcc").chmod(0o755)
    for var in ("CUDA_PATH", "CUDA_HOME", "CUDA_ROOT"):
        monkeypatch.setenv(var, str(real))
    monkeypatch.setenv("NVCC", str(real / "bin" / "nvcc"))
    monkeypatch.setenv("CUDACXX", str(real / "bin" / "nvcc"))
    monkeypatch.setenv("PATH", f"{real / 'bin'}{os.pathsep}{os.environ['PATH']}")
    cache = Path(os.environ["HOME"]) / ".cache" / "llamafile-cuda-build"
    cache.mkdir(parents=True)
    (cache / "kept.o").write_text("a compiled object of the user's\n")
    out = arena.run("build", "-c", str(arena.config_path), "--dry-run", "--cuda", "--trust", code=0)
    assert "1 nvcc call(s)" in out.output and "--clean" not in out.output, out.output
    assert (cache / "kept.o").is_file()


def test_dry_run_make_path_of_the_config_names_the_setting(arena: Arena) -> None:
    """A bad build.llamafile.make had no where: and its next: said to install make."""
    _llamafile_room(arena, build=LLAMAFILE_BUILD + "    make: ../no/such/make\n")
    out = arena.run("build", "-c", str(arena.config_path), "--dry-run", code=1, what="build.llamafile.make",
                    where=str(arena.config_path), next="set build.llamafile.make")
    assert "apt-get install make" not in out.output


@pytest.mark.parametrize("make", ["{tmp}", "{tmp}/not-executable", "C:\\tools\\make.exe"])
def test_build_make_path_that_is_no_program(arena: Arena, make: str) -> None:
    (arena.tmp / "not-executable").write_text("#!/bin/sh\n")
    _llamafile_room(arena, build=LLAMAFILE_BUILD + f"    make: '{make.format(tmp=arena.tmp)}'\n")
    arena.run("build", "-c", str(arena.config_path), "--dry-run", "--trust", code=1, what="build.llamafile.make",
              where=str(arena.config_path), next="set build.llamafile.make")


# --- 3. drift --sdist ---------------------------------------------------------------------------

SDIST_VALUES = ["evilpkg==1.0", "llama-cpp-python==0.3.36", "{links}/evilpkg-1.0.tar.gz", "./evilpkg-1.0.tar.gz",
                "../evilpkg", "file://{links}/evilpkg-1.0.tar.gz", "https://user:secret@127.0.0.1:9/evilpkg-1.0.tar.gz",
                "--index-url=http://127.0.0.1:9/simple", "0.3.36 --pre", "0.3.36; os_name == 'posix'",
                "C:\\evilpkg-1.0.tar.gz", "..\\evilpkg", "v0.3.36", " 0.3.36", "0.3.36\n", "0.3.36+local"]


@pytest.fixture
def evil_links(arena: Arena, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A local index holding an sdist whose build backend creates the canary when pip prepares it."""
    links = arena.evil_index(monkeypatch)
    monkeypatch.chdir(links)
    return links


@pytest.mark.parametrize("value", SDIST_VALUES)
def test_drift_sdist_takes_a_version_only(arena: Arena, evil_links: Path, value: str) -> None:
    arena.run("drift", "-c", str(arena.config_path), "--sdist", value.format(links=evil_links), code=1,
              what="--sdist must be a version like 0.3.36", where="--sdist", next="needs --trust")
    assert not (arena.tmp / "cache").exists()


@pytest.mark.parametrize("value", ["{links}/evilpkg-1.0.tar.gz", "file://{links}/evilpkg-1.0.tar.gz",
                                   "evilpkg @ file://{links}/evilpkg-1.0.tar.gz", "-r /etc/passwd",
                                   "https://user:secret@127.0.0.1:9/evilpkg-1.0.tar.gz"])
def test_drift_sdist_with_trust_is_still_no_path_url_or_option(arena: Arena, evil_links: Path, value: str) -> None:
    out = arena.run("drift", "-c", str(arena.config_path), "--trust", "--sdist", value.format(links=evil_links), code=1,
                    what="--sdist must be a version or a package name", where="--sdist")
    assert "secret@" not in out.output.split("got", 1)[0]


# --- 4. templatize --------------------------------------------------------------------------

@pytest.mark.parametrize("target", ["canary/secret.txt", "room-git-config", "in-room"])
def test_templatize_never_copies_what_a_room_symlink_points_at(arena: Arena, target: str) -> None:
    """A symlink in the room to a key outside ended up, as content, in the feature's templates."""
    arena.applied()
    link = arena.room / "src" / "leak.cpp"
    dest = {"canary/secret.txt": arena.canary / "secret.txt", "room-git-config": arena.room / ".git" / "config",
            "in-room": arena.room / "src" / "llama.cpp"}[target]
    os.symlink(dest, link)
    out = arena.run("templatize", code=1, what="src/leak.cpp is a symlink to", where=str(link), next="templatize")
    if target != "in-room":
        assert "outside the clean room" in out.output
    assert not any("the user's secret" in p.read_text(errors="replace") for p in arena.feature.rglob("*") if p.is_file())


def test_templatize_keeps_the_feature_folders_links_and_empty_folders(arena: Arena) -> None:
    """The folder was rebuilt: its symlinks became copies (of what they point at, outside too) and
    empty folders vanished; a folder of the user's beside it (.dca.old) was deleted."""
    (arena.feature / "empty").mkdir()
    os.symlink("src/llama-dca.cpp.j2", arena.feature / "notes.j2")
    os.symlink(arena.canary / "keep.txt", arena.feature / "outside.txt")
    beside = arena.work / "templates" / ".dca.old"
    beside.mkdir()
    (beside / "mine.txt").write_text("the user's\n")
    arena.applied()
    (arena.room / "src" / "llama-dca.cpp").write_text((arena.room / "src" / "llama-dca.cpp").read_text() + "// more\n")
    arena.skip.append(arena.feature)  # rewritten by design; checked below
    arena.run("templatize", code=0)
    assert (arena.feature / "empty").is_dir()
    assert os.readlink(arena.feature / "notes.j2") == "src/llama-dca.cpp.j2"
    assert os.readlink(arena.feature / "outside.txt") == str(arena.canary / "keep.txt")
    assert (beside / "mine.txt").read_text() == "the user's\n"
    assert sorted(p.name for p in (arena.work / "templates").iterdir()) == [".dca.old", "dca"]
    assert "// more" in (arena.feature / "src" / "llama-dca.cpp.j2").read_text()


def test_templatize_writes_nothing_through_a_symlinked_folder(arena: Arena) -> None:
    arena.applied()
    outside = arena.canary / "edits"
    outside.mkdir()
    os.symlink(outside, arena.feature / "edits")
    text = (arena.room / "src" / "llama.cpp").read_text()
    (arena.room / "src" / "llama.cpp").write_text(text.replace("int line_010 = 10;\n", "int line_010 = 10;\nint a = 1;\nint b = 2;\n"))
    arena.run("templatize", code=1, what="is a symlink to", next="move it away")
    assert list(outside.iterdir()) == []


def test_templatize_never_writes_into_the_source_checkout(arena: Arena) -> None:
    inside = arena.source / "tpl" / "dca"
    shutil.copytree(arena.feature, inside)
    arena.config_path.write_text(arena.config_path.read_text().replace("templates: templates/dca", f"templates: {inside}"))
    arena.applied()
    arena.run("templatize", code=1, what="inside the source checkout", next="outside")


# --- 5. trust never comes from a relative settings path ----------------------------------------

@pytest.mark.parametrize(("var", "value", "folder"), [("XDG_CONFIG_HOME", ".cfg", ".cfg"), ("XDG_CONFIG_HOME", "./", "."),
                                                      ("HOME", ".", ".config")])
def test_relative_settings_path_trusts_nothing(arena: Arena, monkeypatch: pytest.MonkeyPatch, var: str, value: str,
                                               folder: str) -> None:
    """A relative XDG_CONFIG_HOME granted trust from the checkout the user stands in."""
    _append_config(arena, f"bootstrap:\n  - {arena.payload}\n")
    settings = arena.work / folder / "dcaforge" / "settings.yaml"
    settings.parent.mkdir(parents=True)
    settings.write_text(f"trusted:\n  - {arena.work}/\n")
    monkeypatch.chdir(arena.work)
    if var == "HOME":
        monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.setenv(var, value)
    arena.run("apply", code=1, what="only when you trust it", next="--trust")


# --- 6. tree readers ----------------------------------------------------------------------------

def _plain_tree(arena: Arena) -> Path:
    """A copy of the source checkout's files (no .git) in which one edit's anchor fits nowhere, so
    the drift check searches the whole tree for its identifiers."""
    tree = arena.tmp / "tree"
    shutil.copytree(arena.source, tree, ignore=shutil.ignore_patterns(".git"))
    cm = tree / "CMakeLists.txt"
    cm.write_text(cm.read_text().replace("add_library", "add_libraryx"))
    return tree


COMMANDS = {"drift": ["drift", "--tree"], "render": ["render", "--check", "--tree"]}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_tree_reader_never_opens_a_fifo(arena: Arena, command: str) -> None:
    tree = _plain_tree(arena)
    os.mkfifo(tree / "src" / "pipe.h")
    child(arena, *COMMANDS[command], str(tree), "-c", str(arena.config_path), code=3, timeout=45)


@pytest.mark.parametrize(("where", "command"), [("edit-target", "drift"), ("edit-target", "render"),
                                                ("searched", "drift"), ("searched", "render")])
def test_tree_reader_names_an_unreadable_file(arena: Arena, where: str, command: str) -> None:
    tree = _plain_tree(arena)
    bad = tree / ("src/models/gemma4.cpp" if where == "edit-target" else "src/secret.h")
    bad.write_text("int ctx_other;\n")
    bad.chmod(0)
    try:
        child(arena, *COMMANDS[command], str(tree), "-c", str(arena.config_path), code=1, what="permission denied",
              where=str(bad), next="chmod u+r", unreadable=True)
    finally:
        bad.chmod(0o644)


def test_tree_reader_bounds_what_it_reads(arena: Arena) -> None:
    """A 1 GiB file of the tree gave a MemoryError (here: a process that may not map 1 GiB)."""
    tree = _plain_tree(arena)
    big = tree / "src" / "models" / "gemma4.cpp"
    with open(big, "r+b") as fh:
        fh.truncate(1 << 30)
    argv = [sys.executable, "-c", "import resource; resource.setrlimit(resource.RLIMIT_AS, (900 << 20, 900 << 20)); "
            + ENTRY, "drift", "--tree", str(tree), "-c", str(arena.config_path)]
    proc = subprocess.run(argv, cwd=arena.tmp, capture_output=True, timeout=120, check=False,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "COLUMNS": "200"})
    out = proc.stdout.decode() + proc.stderr.decode()
    assert proc.returncode == 1 and "Traceback" not in out, out
    assert "1 GiB, more than the 64 MiB dcaforge reads from one file" in out and f"where: {big}" in out, out


@pytest.mark.parametrize("kind", ["dangling", "loop", "to-a-folder-outside"])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_tree_reader_skips_links_it_cannot_or_may_not_follow(arena: Arena, command: str, kind: str) -> None:
    tree = _plain_tree(arena)
    link = tree / "src" / "link.h"
    if kind == "dangling":
        os.symlink("no-such-file.h", link)
    elif kind == "loop":
        os.symlink("link.h", link)
    else:
        os.symlink(arena.canary, tree / "src" / "outside")
        os.symlink(arena.canary / "secret.txt", link)
    out = tree_run(arena, *COMMANDS[command], str(tree), "-c", str(arena.config_path), code=3)
    assert "the user's secret" not in out.output


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_tree_reader_never_reads_an_edit_target_out_of_the_tree(arena: Arena, command: str) -> None:
    """The edit's file was a link to a secret: its "nearest lines" were printed."""
    tree = _plain_tree(arena)
    target = tree / "src" / "models" / "gemma4.cpp"
    target.unlink()
    os.symlink(arena.canary / "secret.txt", target)
    out = arena.run(*COMMANDS[command], str(tree), "-c", str(arena.config_path), code=1, what="leads out of the tree",
                    where=str(target))
    assert "the user's secret" not in out.output


def test_template_include_that_is_a_fifo(arena: Arena) -> None:
    os.mkfifo(arena.feature / "src" / "inc.j2")
    (arena.feature / "src" / "llama-dca.cpp.j2").write_text("{% include 'src/inc.j2' %}\n")
    child(arena, "render", "--check", "-c", str(arena.config_path), "--tree", str(_plain_tree(arena)), code=1,
          what="FIFO", timeout=45)


# --- 7. no traceback -----------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "kind"), [(".room.creating", "symlink"), (".room.creating", "file"),
                                            (".room.creating", "fifo"), (".room.deleting", "symlink"),
                                            (".room.deleting", "file")])
def test_leftovers_that_dcaforge_did_not_leave(arena: Arena, name: str, kind: str) -> None:
    """What an interrupted run leaves is a folder; anything else there is not removed, nor followed."""
    args = ["apply"]
    if name.endswith(".deleting"):
        arena.applied()  # apply --fresh --force of a room made from a branch: deleted, through .deleting
        args = ["apply", "--fresh", "--force"]
    else:
        arena.workspace.mkdir()
    leftover = arena.workspace / name
    if kind == "symlink":
        os.symlink(arena.canary, leftover)
    elif kind == "file":
        leftover.write_text("a patch someone wrote here\n")
    else:
        os.mkfifo(leftover)
    arena.run(*args, code=1, what=str(leftover), where=str(leftover), next="move that away")
    assert os.path.lexists(leftover) and (arena.canary / "secret.txt").is_file()


def test_baseline_worktree_that_is_a_symlink(arena: Arena) -> None:
    arena.applied()
    empty = arena.tmp / "empty"
    empty.mkdir()
    os.symlink(empty, arena.workspace / "room-baseline")
    arena.run("build", "-c", str(arena.config_path), "--baseline", code=1, what="the baseline worktree",
              where="room-baseline", next="move it away")
    assert empty.is_dir()


def test_config_in_a_folder_that_cannot_be_entered(arena: Arena) -> None:
    locked = arena.tmp / "locked"
    locked.mkdir()
    shutil.copy(arena.config_path, locked / "dcaforge.yaml")
    locked.chmod(0)
    try:
        child(arena, "status", "-c", str(locked / "dcaforge.yaml"), code=1, what="permission denied",
              where=str(locked / "dcaforge.yaml"), next="chmod u+x", unreadable=True)
    finally:
        locked.chmod(0o755)


def test_unreadable_file_in_the_room_is_named(arena: Arena) -> None:
    """A rendered file the user made unreadable: render names it (it gave a PermissionError traceback)."""
    arena.applied()
    bad = arena.room / "src" / "llama-dca.cpp"
    bad.chmod(0)
    try:
        child(arena, "render", "-c", str(arena.config_path), code=1, what="permission denied", where=str(bad),
              unreadable=True)
    finally:
        bad.chmod(0o644)


SITE = """\
import os, sys, time
mark = os.environ.get("DCAFORGE_STALL_MARK")
if mark:
    class _Stall:
        def find_spec(self, name, path=None, target=None):
            if name == "typer":  # dcaforge's first heavy import
                sys.meta_path.remove(self)
                open(mark, "w").close()
                time.sleep(60)
            return None
    sys.meta_path.insert(0, _Stall())
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_while_python_still_imports(arena: Arena, sig: int) -> None:
    """Ctrl-C during the imports printed a KeyboardInterrupt traceback; SIGTERM killed it silently."""
    site = arena.tmp / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITE)
    mark = arena.tmp / "importing"
    env = {**os.environ, "DCAFORGE_STALL_MARK": str(mark), "PYTHONPATH": os.pathsep.join([str(site), *sys.path])}
    proc = subprocess.Popen([sys.executable, "-c", ENTRY, "status", "-c", str(arena.config_path)], cwd=arena.tmp, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=sigint_default)
    try:
        deadline = time.time() + 60
        while not mark.exists():
            assert proc.poll() is None and time.time() < deadline, "the import was never reached"
            time.sleep(0.02)
        proc.send_signal(sig)
        output = proc.communicate(timeout=60)[0].decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, output
    assert "Traceback" not in output and "interrupted:" in output and "next:" in output, output


# --- 8. more writes through links ------------------------------------------------------------------

GATES = """\
gates:
  - name: g
    kind: noop-below-chunk
    recipe: tiny:qwen2
"""


@pytest.mark.parametrize("link", ["room-gates", "room-gates/logs", "room-gates/models"])
def test_gate_output_through_a_symlink(arena: Arena, link: str) -> None:
    """gate deleted logs/*.log (and wrote models) through a symlinked <workspace>/<room>-gates."""
    _append_config(arena, GATES)
    arena.applied()
    outside = arena.canary / "elsewhere"
    (outside / "logs").mkdir(parents=True)
    (outside / "logs" / "mine.log").write_text("the user's log\n")
    path = arena.workspace / link
    path.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(outside if link == "room-gates" else outside / "logs", path)
    arena.run("gate", "-c", str(arena.config_path), code=1, what="is a symlink to", where=link, next="move it away")
    assert (outside / "logs" / "mine.log").read_text() == "the user's log\n"


@pytest.mark.parametrize("dest", [".room.creating", ".room.deleting", "room-gates", "room-baseline/x.patch",
                                  "README.md", "config", "series-patch", "feature-folder"])
def test_capture_output_onto_what_dcaforge_keeps(arena: Arena, dest: str) -> None:
    """capture -o onto .creating broke the next apply --fresh --force; onto the bookkeeping README it
    replaced the table; the config, another patch of the series and the feature folder are inputs."""
    readme = arena.work / "README.md"
    readme.write_text("## Current series\n\n| patch | what |\n|---|---|\n")
    _append_config(arena, f"bookkeeping:\n  series_readme:\n    file: {readme}\n")
    arena.patch("0001-a.patch", "--- a/docs/notes.txt\n+++ b/docs/notes.txt\n@@ -1 +1 @@\n-no final newline here\n"
                              "\\ No newline at end of file\n+patched\n")
    arena.applied()
    path = {"README.md": readme, "config": arena.config_path, "series-patch": arena.patches / "0001-a.patch",
            "feature-folder": arena.feature / "x.patch"}.get(dest, arena.workspace / dest)
    kind = {"README.md": "bookkeeping document", "config": "the config", "series-patch": "a patch of the series",
            "feature-folder": "the feature folder", ".room.creating": "a clean room being made",
            ".room.deleting": "a clean room being deleted", "room-gates": "the gates' output folder",
            "room-baseline/x.patch": "the baseline worktree"}[dest]
    arena.run("capture", "-o", str(path), code=1, what=kind, next="capture -o")
    assert not os.path.lexists(arena.workspace / ".room.creating")
    arena.run("apply", "--fresh", "--force", code=0)
