"""Bootstrap steps (shell, argv, the tree's own patches) and submodules from the user's checkout."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dcaforge.cli import app
from dcaforge.config import parse_config
from dcaforge.errors import CommandError, ConfigError, DcaforgeError
from dcaforge.patch.series import apply

from .helpers import git_init, make_patch_gnu, snapshot, source_files, ugit
from .test_config import GOOD, _write

LLAMA_CMAKE = "project(llama)\nadd_library(llama src/llama.cpp)\n"


def llamafile_like(project, url: str = "https://git.invalid/ggml-org/llama.cpp.git") -> Path:
    """A superproject with llama.cpp as a real submodule whose .gitmodules names ``url`` (the
    user's names GitHub), llamafile's per-file patches and files, as the project's source."""
    llama = project.tmp / "llama.cpp-upstream"
    git_init(llama, source_files())
    sup = project.tmp / "llamafile"
    git_init(sup, {"Makefile": "all:\n", ".gitignore": "/o\n*.gen\n"})
    ugit(sup, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(llama), "llama.cpp")
    p1 = make_patch_gnu({"llama.cpp/CMakeLists.txt": LLAMA_CMAKE},
                        {"llama.cpp/CMakeLists.txt": LLAMA_CMAKE + "# llamafile 1\n"}, project.tmp)
    p2 = make_patch_gnu({"llama.cpp/CMakeLists.txt": LLAMA_CMAKE + "# llamafile 1\n"},
                        {"llama.cpp/CMakeLists.txt": LLAMA_CMAKE + "# llamafile 1\n# llamafile 2\n"}, project.tmp)
    patches = sup / "llama.cpp.patches" / "patches"
    patches.mkdir(parents=True)
    (patches / "a_first.patch").write_bytes(p1)   # name order matters: b_ applies on top of a_
    (patches / "b_second.patch").write_bytes(p2)
    (patches / "README.md").write_text("not a patch\n")
    files = sup / "llama.cpp.patches" / "llamafile-files"
    files.mkdir(parents=True)
    (files / "BUILD.mk").write_text("# llamafile\n")
    ugit(sup, "config", "-f", ".gitmodules", "submodule.llama.cpp.url", url)
    ugit(sup, "add", "-A")
    ugit(sup, "commit", "-q", "-m", "llamafile-like")
    project.source = sup
    project.before = snapshot(sup)
    return sup


def write_bootstrap(project, steps: str) -> None:
    cfg = project.config_path.read_text()
    project.config_path.write_text(cfg + "bootstrap:\n" + textwrap.indent(textwrap.dedent(steps), "  "))


def test_llamafile_setup_offline_from_the_checkouts_modules(project) -> None:
    sup = llamafile_like(project)
    project.write_config(source=f"git: {sup}\nsubmodules: true", llama_cpp_dir="llama.cpp")
    write_bootstrap(project, """\
        - cp -r llama.cpp.patches/llamafile-files/* llama.cpp/
        - patches: llama.cpp.patches/patches
        - echo generated > llama.cpp/version.gen && mkdir -p o/tmp && echo junk > o/tmp/x
        """)
    cfg = project.config
    res = apply(cfg, trust=True)
    notes = "\n".join(res.notes)
    # .gitmodules names an unreachable URL: the submodule came from the checkout's .git/modules
    assert f"submodule llama.cpp cloned from your checkout's {sup / '.git' / 'modules' / 'llama.cpp'}" in notes
    assert "source.ref 'HEAD' is " in notes  # not pinned: says which commit to pin
    assert "bootstrap: 2 patches of the tree applied" in notes
    assert "committed 1 file the tree's .gitignore ignores: llama.cpp/version.gen" in notes
    assert "left ignored folders out of the start commit: o/" in notes
    room = cfg.room
    assert (room / "llama.cpp/CMakeLists.txt").read_text().endswith("# llamafile 1\n# llamafile 2\n")
    start = set(ugit(room, "ls-tree", "-r", "--name-only", "dcaforge/start").split())
    assert {"llama.cpp/BUILD.mk", "llama.cpp/version.gen"} <= start and "o/tmp/x" not in start
    msg = ugit(room, "log", "-1", "--format=%B", "dcaforge/start")
    assert msg == ("dcaforge: bootstrap\n\n- cp -r llama.cpp.patches/llamafile-files/* llama.cpp/\n"
                   "- patches llama.cpp.patches/patches/*.patch (patch -p1 --fuzz=0)\n"
                   "- echo generated > llama.cpp/version.gen && mkdir -p o/tmp && echo junk > o/tmp/x\n\n")
    project.assert_source_untouched()


def test_a_failing_bootstrap_step_makes_nothing_and_says_where(project) -> None:
    sup = llamafile_like(project)
    project.write_config(source=f"git: {sup}\nsubmodules: true", llama_cpp_dir="llama.cpp")
    write_bootstrap(project, """\
        - ["true"]
        - |
          # llamafile's renames
          echo "renames.sh: no such file" >&2; exit 3
        """)
    cfg = project.config
    with pytest.raises(CommandError) as exc:
        apply(cfg, trust=True)
    err = exc.value
    assert err.message == 'bootstrap step 2/2 failed (exit 3): echo "renames.sh: no such file" >&2; exit 3 ...'
    assert err.where is not None and err.where.startswith(f"{project.config_path}:19")
    assert err.details == "renames.sh: no such file"
    assert err.hint is not None and "the clean room was not created and the source is untouched" in err.hint
    assert not cfg.room.exists() and [p.name for p in cfg.workspace.iterdir()] == []
    r = CliRunner().invoke(app, ["apply", "--trust", "-c", str(project.config_path)])
    assert r.exit_code == 1 and "bootstrap step 2/2 failed (exit 3)" in r.output
    project.assert_source_untouched()


def test_a_bootstrap_patches_folder_that_is_not_there(project) -> None:
    sup = llamafile_like(project)
    project.write_config(source=f"git: {sup}\nsubmodules: true", llama_cpp_dir="llama.cpp")
    write_bootstrap(project, "- patches: llama.cpp.patches/patchs\n")
    with pytest.raises(ConfigError, match="folder llama.cpp.patches/patchs is not in the source tree") as exc:
        apply(project.config)
    assert exc.value.where == f"{project.config_path}:18"
    project.assert_source_untouched()


@pytest.mark.parametrize(("steps", "message", "line"), [
    ("- patchs: x\n", "unknown key 'bootstrap[0].patchs'", 6),
    ("- make\n- patches: /abs/patches\n", "'bootstrap[1].patches' must be a relative path inside the tree", 7),
    ("- patches: p\n  strip: one\n", "'bootstrap[0].strip' must be an integer", 7),
    ("- [make, 1]\n", "'bootstrap[0]' must be a shell command string, an argv list or a mapping", 6),
    ("- ''\n", "'bootstrap[0]' is an empty command", 6),
])
def test_bootstrap_config_errors(tmp_path: Path, steps: str, message: str, line: int) -> None:
    text = GOOD.replace("series:", "bootstrap:\n" + textwrap.indent(steps, "  ") + "series:")
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as exc:
        parse_config(path)
    assert message in exc.value.message
    assert exc.value.where == f"{path}:{line}"


def test_a_changed_bootstrap_asks_for_fresh(project) -> None:
    write_bootstrap(project, "- echo one > one.txt\n")
    apply(project.config, trust=True)
    assert (project.config.room / "one.txt").read_text() == "one\n"
    project.config_path.write_text(project.config_path.read_text().replace("echo one", "echo two"))
    with pytest.raises(DcaforgeError, match="other bootstrap steps") as exc:
        apply(project.config, trust=True)
    assert "dcaforge apply --fresh" in (exc.value.hint or "")
    res = apply(project.config, fresh=True, trust=True)  # made again (not reset: the bootstrap differs)
    assert "fresh: reset the clean room to its start commit" not in res.notes
    assert (project.config.room / "one.txt").read_text() == "two\n"
    project.assert_source_untouched()
