"""What a newcomer meets first: ``dcaforge --version``, and every ``next:`` a message prints is a
command that works when pasted into a shell as it is printed: it keeps the ``-c CONFIG`` the user
gave (here a path with spaces), quotes paths, and uses only options the installed git and patch
take together. Each suggested command is run here exactly as printed (``bash -c``, a ``dcaforge``
on PATH that is this checkout's). Also: hand-edit advice names ``dcaforge templatize``; ``apply
--fresh`` keeps hand edits unless ``--force``; config type errors quote the key, the value and the
type."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

import dcaforge
from dcaforge import REPO_ROOT
from dcaforge.cli import app

from .conftest import Project
from .helpers import LLAMA, git_init, make_patch_git, make_patch_gnu, replace_line, sh, snapshot


class Shell:
    """Runs command lines as a user's shell does, with this checkout's ``dcaforge`` first on PATH."""

    def __init__(self, tmp: Path) -> None:
        bin_dir = tmp / "bin"
        bin_dir.mkdir()
        shim = bin_dir / "dcaforge"
        shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -c "from dcaforge.cli import main; main()" "$@"\n')
        shim.chmod(0o755)
        self.env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                    "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self.cwd = tmp

    def __call__(self, line: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "-c", line], cwd=self.cwd, env=self.env, capture_output=True, text=True,
                              check=False)


def suggested(output: str) -> list[str]:
    """The commands (in backquotes) of the output's ``next:`` lines, in order."""
    return [c for line in output.splitlines() if line.strip().startswith("next:") for c in re.findall(r"`([^`]+)`", line)]


def one(commands: list[str], start: str) -> str:
    """The one command suggested that is ``start`` (a dcaforge command: with its ``-c``), or starts
    with ``start`` (another tool: ``git ``, ``patch ``)."""
    if start.startswith("dcaforge "):
        found = {c for c in commands if re.sub(r" -c (?:'[^']*'|\S+)$", "", c) == start}
    else:
        found = {c for c in commands if c.startswith(start)}
    assert len(found) == 1, (start, commands)
    return found.pop()


def failed_apply(project: Project, config: Path, shell: Shell, how: str) -> tuple[list[str], str, Path]:
    """`dcaforge apply` stops on 0002-b.patch (exit 3); its suggestions, the one git command among them
    (checked: ``git -C <room> apply <how> <patch>``) and the room."""
    r = shell(f"dcaforge apply -c {shlex.quote(str(config))}")
    assert r.returncode == 3, r.stderr
    cmds = suggested(r.stderr)
    room = project.tmp / "clean room" / "room"
    by_hand = one(cmds, "git ")
    assert by_hand == f"git -C {shlex.quote(str(room))} apply {how} {shlex.quote(str(project.patches / '0002-b.patch'))}"
    return cmds, by_hand, room


@pytest.fixture
def shell(tmp_path: Path) -> Shell:
    return Shell(tmp_path)


@pytest.fixture
def spaced(project: Project) -> tuple[Project, Path]:
    """The project with its clean room and its config in folders whose names hold spaces."""
    project.write_config(cleanroom="../clean room")
    config = project.tmp / "my configs" / "dca forge.yaml"
    config.parent.mkdir()
    config.write_text(f"root: {project.work}\n" + project.config_path.read_text())
    return project, config


def test_version(shell: Shell) -> None:
    r = shell("dcaforge --version")
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"dcaforge {dcaforge.__version__}\n"
    meta = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    assert "version" in meta["project"]["dynamic"]
    assert meta["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "dcaforge.__version__"}


def edit(n: int, new: str) -> Callable[[Path], None]:
    return lambda tree: replace_line(tree / "src/llama.cpp", f"int line_{n:03d} = {n};", new)


def _conflict(project: Project) -> None:
    project.add_patch("0001-a.patch", make_patch_git(project.source, edit(10, "int line_010 = -1;"), project.tmp, "a"))
    # made against the base, it changes the line 0001 changed: a conflict
    project.add_patch("0002-b.patch", make_patch_git(project.source, edit(10, "int line_010 = -2;"), project.tmp, "b"))


def test_a_failed_patch_suggests_git_apply_3way_that_runs(spaced: tuple[Project, Path], shell: Shell) -> None:
    project, config = spaced
    _conflict(project)
    cmds, by_hand, room = failed_apply(project, config, shell, "--3way")
    assert "--reject" not in by_hand
    done = shell(by_hand)
    assert done.returncode == 1 and "cannot be used together" not in done.stderr, done.stderr
    text = (room / "src/llama.cpp").read_text()
    assert "<<<<<<<" in text and "int line_010 = -2;" in text  # conflict markers to resolve
    # resolved by hand, then the printed --continue (with the user's -c) commits it as 0002
    (room / "src/llama.cpp").write_text(LLAMA.replace("int line_010 = 10;", "int line_010 = -12;"))
    cont = one(cmds, "dcaforge apply --continue")
    assert cont == f"dcaforge apply --continue -c {shlex.quote(str(config))}"
    done = shell(cont)
    assert done.returncode == 0, done.stderr
    assert "int line_010 = -12;" in (room / "src/llama.cpp").read_text()
    assert sh(["git", "log", "-1", "--format=%s"], room).stdout.decode().strip() == "0002-b"
    project.assert_source_untouched()


def test_without_preimages_it_suggests_git_apply_reject(spaced: tuple[Project, Path], shell: Shell) -> None:
    project, config = spaced
    project.add_patch("0001-a.patch", make_patch_git(project.source, edit(10, "int line_010 = -1;"), project.tmp, "a"))

    def two(tree: Path) -> None:
        edit(10, "int line_010 = -2;")(tree)
        edit(40, "int line_040 = -4;")(tree)

    data = make_patch_git(project.source, two, project.tmp, "b").decode()
    # preimages the room does not have: no 3-way merge is possible
    data = re.sub(r"^index [0-9a-f]+\.\.", "index " + "1" * 40 + "..", data, flags=re.MULTILINE)
    project.add_patch("0002-b.patch", data.encode())
    cmds, by_hand, room = failed_apply(project, config, shell, "--reject")
    done = shell(by_hand)
    assert done.returncode == 1 and "Rejected hunk #1" in done.stderr, done.stderr
    assert "int line_040 = -4;" in (room / "src/llama.cpp").read_text()  # the hunk that fits is applied
    assert (room / "src/llama.cpp.rej").is_file()
    cont = one(cmds, "dcaforge apply --continue")
    refused = shell(cont)  # the reject file is still there: nothing is committed
    assert refused.returncode == 1 and "src/llama.cpp.rej" in refused.stderr, refused.stderr
    assert "1 reject file" in refused.stderr and one(suggested(refused.stderr), "dcaforge apply --continue") == cont
    (room / "src/llama.cpp.rej").unlink()
    replace_line(room / "src/llama.cpp", "int line_010 = -1;", "int line_010 = -12;")
    done = shell(cont)
    assert done.returncode == 0, done.stderr
    text = (room / "src/llama.cpp").read_text()
    assert "int line_010 = -12;" in text and "int line_040 = -4;" in text


def test_a_failed_gnu_patch_suggests_patch_that_runs(spaced: tuple[Project, Path], shell: Shell) -> None:
    project, config = spaced
    before = {"src/llama.cpp": LLAMA}
    project.add_patch("0001-a.patch", make_patch_gnu(before, {"src/llama.cpp": LLAMA.replace("int line_025 = 25;", "int line_025 = 0;")},
                                                     project.tmp))
    both = LLAMA.replace("int line_025 = 25;", "int line_025 = 1;").replace("int line_050 = 50;", "int line_050 = 5;")
    project.add_patch("0002-b.patch", make_patch_gnu(before, {"src/llama.cpp": both}, project.tmp))
    r = shell(f"dcaforge apply --no-render -c {shlex.quote(str(config))}")
    assert r.returncode == 3, r.stderr
    cmds = suggested(r.stderr)
    room = project.tmp / "clean room" / "room"
    by_hand = one(cmds, "patch ")
    assert by_hand == (f"patch -d {shlex.quote(str(room))} -p1 --no-backup-if-mismatch -i "
                       f"{shlex.quote(str(project.patches / '0002-b.patch'))}")
    done = shell(by_hand)
    assert done.returncode == 1 and "1 out of 2 hunks FAILED" in done.stdout, done.stdout + done.stderr
    assert "int line_050 = 5;" in (room / "src/llama.cpp").read_text() and (room / "src/llama.cpp.rej").is_file()
    (room / "src/llama.cpp.rej").unlink()
    done = shell(one(cmds, "dcaforge apply --continue"))
    assert done.returncode == 0, done.stderr


def test_the_trust_refusal_suggests_the_users_config(spaced: tuple[Project, Path], shell: Shell) -> None:
    project, config = spaced
    config.write_text(config.read_text() + "bootstrap:\n  - [touch, made-by-bootstrap.txt]\n")
    r = shell(f"dcaforge apply -c {shlex.quote(str(config))}")
    assert r.returncode == 1 and "nothing was run or made" in r.stderr, r.stderr
    trust = one(suggested(r.stderr), "dcaforge apply --trust")
    assert trust == f"dcaforge apply --trust -c {shlex.quote(str(config))}"
    done = shell(trust)
    assert done.returncode == 0, done.stderr
    assert (project.tmp / "clean room" / "room" / "made-by-bootstrap.txt").is_file()


def test_hand_edits_advice_names_templatize_and_goes_on(spaced: tuple[Project, Path], shell: Shell) -> None:
    """render refuses to overwrite a hand edit and names templatize; each printed command, pasted
    in turn, gets to a verified patch that holds the hand edit (no advice that leads back)."""
    project, config = spaced
    c = shlex.quote(str(config))
    assert shell(f"dcaforge apply -c {c}").returncode == 0
    room = project.tmp / "clean room" / "room"
    replace_line(room / "src/llama-dca.cpp", "int dca_chunk = 8192;", "int dca_chunk = 8192;  // tuned by hand")
    r = shell(f"dcaforge render -c {c}")
    assert r.returncode == 1 and "would overwrite hand edits in src/llama-dca.cpp" in r.stderr, r.stderr
    cmds = suggested(r.stderr)
    assert one(cmds, "dcaforge render --force") == f"dcaforge render --force -c {c}"
    done = shell(one(cmds, "dcaforge templatize"))
    assert done.returncode == 0, done.stderr
    assert "tuned by hand" in (project.feature / "src/llama-dca.cpp.j2").read_text()
    done2 = shell(one(cmds, "dcaforge render"))
    assert done2.returncode == 0 and "0 written" in done2.stdout, done2.stdout + done2.stderr
    # templatize's own next: capture, then verify --fresh-render
    then = suggested(done.stdout)
    assert then == [f"dcaforge capture -c {c}", f"dcaforge verify --fresh-render -c {c}"]
    for line in then:
        out = shell(line)
        assert out.returncode == 0, out.stderr
    assert "tuned by hand" in (project.patches / "0078-dca.patch").read_text()


def test_series_change_with_hand_edits_names_templatize(spaced: tuple[Project, Path], shell: Shell) -> None:
    project, config = spaced
    c = shlex.quote(str(config))
    assert shell(f"dcaforge apply -c {c}").returncode == 0
    room = project.tmp / "clean room" / "room"
    replace_line(room / "src/llama-dca.cpp", "int dca_chunk = 8192;", "int dca_chunk = 4096;")
    project.add_patch("0001-a.patch", make_patch_git(project.source, edit(50, "int line_050 = -5;"), project.tmp, "a"))
    r = shell(f"dcaforge apply -c {c}")
    assert r.returncode == 1 and "src/llama-dca.cpp" in r.stderr, r.stderr
    cmds = suggested(r.stderr)
    assert one(cmds, "dcaforge apply --fresh --force") == f"dcaforge apply --fresh --force -c {c}"
    assert shell(one(cmds, "dcaforge templatize")).returncode == 0
    again = shell(one(cmds, "dcaforge apply"))
    assert again.returncode == 0, again.stderr
    assert "int dca_chunk = 4096;" in (room / "src/llama-dca.cpp").read_text()
    assert "int line_050 = -5;" in (room / "src/llama.cpp").read_text()


def test_apply_fresh_keeps_hand_edits_unless_forced(spaced: tuple[Project, Path], shell: Shell) -> None:
    project, config = spaced
    c = shlex.quote(str(config))
    assert shell(f"dcaforge apply -c {c}").returncode == 0
    room = project.tmp / "clean room" / "room"
    replace_line(room / "src/llama.cpp", "int line_001 = 1;", "int line_001 = 100;")      # a tracked file
    replace_line(room / "src/llama-dca.cpp", "int dca_chunk = 8192;", "int dca_chunk = 1;")  # a rendered one
    (room / "notes.txt").write_text("mine\n")                                               # a new one
    (room / "build").mkdir()
    (room / "build" / "x.o").write_text("a build product, ignored: not a hand edit")
    before = snapshot(room)
    r = shell(f"dcaforge apply --fresh -c {c}")
    assert r.returncode == 1, r.stderr
    assert "--fresh would discard 3 hand-edited files in the clean room" in r.stderr
    listed = [ln.strip() for ln in r.stderr.splitlines() if ln.startswith("    ")]
    assert listed == ["notes.txt", "src/llama-dca.cpp", "src/llama.cpp"]
    assert snapshot(room) == before  # nothing was changed
    cmds = suggested(r.stderr)
    assert one(cmds, "dcaforge templatize") == f"dcaforge templatize -c {c}"
    done = shell(one(cmds, "dcaforge apply --fresh --force"))
    assert done.returncode == 0, done.stderr
    assert "int line_001 = 1;" in (room / "src/llama.cpp").read_text() and not (room / "notes.txt").exists()
    assert "int dca_chunk = 8192;" in (room / "src/llama-dca.cpp").read_text()
    # a room without hand edits needs no --force
    assert shell(f"dcaforge apply --fresh -c {c}").returncode == 0


@pytest.mark.parametrize(("yaml", "message", "hint"), [
    ("build:\n  jobs: \"4\"\n", "'build.jobs' must be an integer, got a string '4'", "without quotes (jobs: 4)"),
    ("build:\n  ccache: [on]\n", "'build.ccache' must be true or false, got a list [true]", "e.g. ccache: true"),
    ("series:\n  dir: {a: 1}\n", "'series.dir' must be a string, got a mapping {a: 1}", "e.g. dir: \"text\""),
    ("build:\n  cmake:\n    targets: [llama, [x]]\n", "'build.cmake.targets[1]' must be a string, got a list ['x']",
     "each item of targets as a string"),
    ("build:\n  cmake:\n    defines:\n      GGML_CUDA: {on: 1}\n",
     "'build.cmake.defines.GGML_CUDA' must be a string, a number or ON/OFF, got a mapping {True: 1}", "GGML_CUDA: ON"),
    ("bootstrap:\n  - 7\n", "'bootstrap[0]' must be a shell command string, an argv list or a mapping {patches: FOLDER, "
     "strip: 1}, got an integer 7", "e.g. bootstrap: ["),
])
def test_config_type_errors_quote_key_value_and_type(project: Project, yaml: str, message: str, hint: str) -> None:
    text = project.config_path.read_text().replace("series:\n  dir: patches\n", "") if "series:" in yaml \
        else project.config_path.read_text()
    project.config_path.write_text(text + yaml)
    r = CliRunner().invoke(app, ["status", "-c", str(project.config_path)])
    assert r.exit_code == 1
    assert message in r.output, r.output
    nexts = [ln for ln in r.output.splitlines() if ln.strip().startswith("next:")]
    assert len(nexts) == 1 and hint in nexts[0] and "-v" not in nexts[0], r.output


def test_the_cosmocc_hint_keeps_a_relative_config_valid(tmp_path: Path, shell: Shell) -> None:
    """Without cosmocc, build suggests llamafile's own download command, then the same `dcaforge build -c CONFIG`.
    Pasted one after the other into one shell, with a relative -c: the download runs in a subshell (it used to be
    `cd ROOM && ...`, after which the relative -c named nothing), so the build that follows finds its config."""
    src = tmp_path / "llamafile"
    # a stand-in for llamafile's downloader: makes the cosmocc folder it is given
    download = "#!/bin/sh\nmkdir -p \"$1/bin\" && : > \"$1/bin/cosmocc\"\n"
    git_init(src, {"Makefile": "all:\n\t@echo '[1/1] LINK o/llamafile'\n\t@mkdir -p o && echo built > o/llamafile\n",
                   "build/config.mk": "COSMOCC = .cosmocc/4.0.2\n.cosmocc/4.0.2:\n\tbuild/download-cosmocc.sh $@ 4.0.2 "
                                      + "ab" * 32 + "\n",
                   "build/download-cosmocc.sh": (download, 0o755), "llama.cpp/README.md": "vendored\n",
                   ".gitignore": "/o\n/.cosmocc\n"})
    work = tmp_path / "work"
    feat = work / "templates" / "feat"
    feat.mkdir(parents=True)
    (feat / "manifest.yaml").write_text("files: []\nedits: []\n")
    (work / "patches").mkdir()
    (work / "dcaforge.yaml").write_text(f"name: lf\ncleanroom: ../ws\nsource:\n  git: {src}\nllama_cpp_dir: llama.cpp\n"
                                        "feature:\n  number: 78\n  name: feat\n  templates: templates/feat\n  marker: '// m'\n"
                                        "build:\n  backend: llamafile\n  llamafile:\n    make: make\n")
    assert shell("dcaforge apply -c work/dcaforge.yaml").returncode == 0
    r = shell("dcaforge build -c work/dcaforge.yaml")
    assert r.returncode == 1 and "cosmocc is not in the tree" in r.stderr, r.stderr
    cmds = suggested(r.stderr)
    room = tmp_path / "ws" / "lf"
    get = one(cmds, "(cd ")
    assert get == f"(cd {shlex.quote(str(room))} && build/download-cosmocc.sh .cosmocc/4.0.2 4.0.2 {'ab' * 32})"
    again = one(cmds, "dcaforge build")
    assert again == "dcaforge build -c work/dcaforge.yaml"
    done = shell(f"{get}\n{again}")  # one shell, one line after the other, as pasted
    assert done.returncode == 0, done.stderr
    assert (room / "o" / "llamafile").read_text() == "built\n"
