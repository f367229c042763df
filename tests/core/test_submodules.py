"""llamafile's shape: llama.cpp as a real git submodule, flattened into the clean room's tree."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dcaforge.errors import CommandError, ConfigError
from dcaforge.patch.capture import capture
from dcaforge.patch.series import apply
from dcaforge.patch.verify import verify

from .helpers import git_init, make_patch_gnu, snapshot, source_files, ugit


def test_submodule_source_is_flattened_and_captured_under_llama_cpp(project) -> None:
    llama = project.tmp / "llama.cpp-upstream"
    git_init(llama, source_files())
    sup = project.tmp / "llamafile"
    git_init(sup, {"Makefile": "all:\n\t@echo build\n", "llamafile/main.c": "int main(void) { return 0; }\n"})
    ugit(sup, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(llama), "llama.cpp")
    ugit(sup, "commit", "-q", "-m", "add llama.cpp submodule")
    project.source = sup
    project.before = snapshot(sup)
    # a llamafile-style per-file patch (paths a/llama.cpp/...), applied with patch -p1 from the root
    before = {"llama.cpp/CMakeLists.txt": "project(llama)\nadd_library(llama src/llama.cpp)\n"}
    after = {"llama.cpp/CMakeLists.txt": "project(llama)\nadd_library(llama src/llama.cpp)\n# llamafile\n"}
    project.add_patch("0001-llamafile-cmake.patch", make_patch_gnu(before, after, project.tmp))
    cfg = project.write_config(source=f"git: {sup}\nsubmodules: true", llama_cpp_dir="llama.cpp")
    res = apply(cfg)
    room = cfg.room
    assert any(n.startswith("flattened submodules: llama.cpp") for n in res.notes)
    assert not (room / "llama.cpp/.git").exists()
    assert (room / "llama.cpp/CMakeLists.txt").read_text().endswith("# llamafile\n")
    assert (room / "llama.cpp/src/llama-dca.cpp").is_file()
    tracked = ugit(room, "ls-files", "llama.cpp/src/llama.cpp")
    assert tracked.strip() == "llama.cpp/src/llama.cpp"  # a plain file of the room's tree, not a gitlink
    project.assert_round_trip(cfg, "llama.cpp/")


REPO = Path(__file__).resolve().parents[2]
UNREACHABLE = "https://git.invalid/{}.git"  # .invalid never resolves: a fetch from a URL would fail


def _nested(project, *, clone_nested: bool, delete_worktree: bool):
    """llamafile's shape with a nested submodule: stable-diffusion.cpp has ggml as its own submodule.
    The user's checkout has clones of llama.cpp and stable-diffusion.cpp in .git/modules; with
    ``clone_nested`` also of stable-diffusion.cpp/ggml (.git/modules/stable-diffusion.cpp/modules/ggml),
    whose work tree ``delete_worktree`` removes (as llamafile's setup does). Every .gitmodules names an
    unreachable URL and the upstream repositories are deleted: only the checkout's own clones exist."""
    up = project.tmp / "upstream"
    git_init(up / "ggml", {"ggml.c": "int ggml(void) { return 0; }\n"})
    sd = up / "sd"
    git_init(sd, {"sd.cpp": "int sd(void) { return 1; }\n"})
    ugit(sd, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(up / "ggml"), "ggml")
    ugit(sd, "config", "-f", ".gitmodules", "submodule.ggml.url", UNREACHABLE.format("ggml"))
    ugit(sd, "add", "-A")
    ugit(sd, "commit", "-q", "-m", "ggml as a submodule")
    git_init(up / "llama", source_files())
    sup = project.tmp / "llamafile"
    git_init(sup, {"Makefile": "all:\n"})
    for url, path in ((up / "llama", "llama.cpp"), (sd, "stable-diffusion.cpp")):
        ugit(sup, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(url), path)
        ugit(sup, "config", "-f", ".gitmodules", f"submodule.{path}.url", UNREACHABLE.format(path))
    ugit(sup, "add", "-A")
    ugit(sup, "commit", "-q", "-m", "llamafile-like, nested submodules")
    if clone_nested:
        ugit(sup / "stable-diffusion.cpp", "submodule", "init")
        ugit(sup / "stable-diffusion.cpp", "config", "submodule.ggml.url", str(up / "ggml"))
        ugit(sup / "stable-diffusion.cpp", "-c", "protocol.file.allow=always", "submodule", "update", "-q")
        assert (sup / ".git/modules/stable-diffusion.cpp/modules/ggml/HEAD").is_file()
    if delete_worktree:
        shutil.rmtree(sup / "stable-diffusion.cpp" / "ggml")
    shutil.rmtree(up)
    project.source = sup
    project.before = snapshot(sup)
    return sup


def _gitlinks(room) -> list[str]:
    return [ln for ln in ugit(room, "ls-files", "-s").splitlines() if ln.startswith("160000 ")]


def test_nested_submodule_from_its_parents_modules_offline(project) -> None:
    """The nested clone lives in .git/modules/stable-diffusion.cpp/modules/ggml (its work tree deleted);
    it is found there and flattened in its parent, stable-diffusion.cpp (today's main removed it from
    the superproject's index: `pathspec 'stable-diffusion.cpp/ggml' did not match`)."""
    sup = _nested(project, clone_nested=True, delete_worktree=True)
    cfg = project.write_config(source=f"git: {sup}\nsubmodules: true", llama_cpp_dir="llama.cpp")
    res = apply(cfg)
    notes = "\n".join(res.notes)
    nested = sup / ".git" / "modules" / "stable-diffusion.cpp" / "modules" / "ggml"
    assert f"submodule stable-diffusion.cpp/ggml cloned from your checkout's {nested}" in notes
    assert "flattened submodules: llama.cpp, stable-diffusion.cpp, stable-diffusion.cpp/ggml" in notes
    room = cfg.room
    files = set(ugit(room, "ls-files").split())
    assert {"stable-diffusion.cpp/sd.cpp", "stable-diffusion.cpp/ggml/ggml.c", "llama.cpp/src/llama.cpp"} <= files
    assert _gitlinks(room) == [] and not (room / "stable-diffusion.cpp/ggml/.git").exists()
    capture(cfg)
    verify(cfg)
    project.assert_source_untouched()


def test_a_submodule_the_bootstrap_deletes_is_not_fetched(project) -> None:
    """No clone of stable-diffusion.cpp/ggml in the checkout (make setup never inits it) and the
    bootstrap deletes its folder, as llamafile's stable-diffusion.cpp setup does: not fetched (today's
    main cloned it from its URL: offline, that fails)."""
    sup = _nested(project, clone_nested=False, delete_worktree=False)
    project.write_config(source=f"git: {sup}\nsubmodules: true", llama_cpp_dir="llama.cpp")
    project.config_path.write_text(project.config_path.read_text()
                                   + "bootstrap:\n  - cd stable-diffusion.cpp && rm -rf ggml\n")
    cfg = project.config
    res = apply(cfg, trust=True)
    notes = "\n".join(res.notes)
    assert ("submodules the bootstrap deletes, not checked out (in no clone of your checkout): "
            "stable-diffusion.cpp/ggml") in notes
    assert "flattened submodules: llama.cpp, stable-diffusion.cpp\n" in notes + "\n"
    assert _gitlinks(cfg.room) == [] and not (cfg.room / "stable-diffusion.cpp/ggml").exists()
    project.assert_source_untouched()


def test_a_submodule_absent_offline_and_kept_names_the_cause(project) -> None:
    sup = _nested(project, clone_nested=False, delete_worktree=False)
    cfg = project.write_config(source=f"git: {sup}\nsubmodules: true", llama_cpp_dir="llama.cpp")
    with pytest.raises(ConfigError) as exc:
        apply(cfg)
    err = exc.value
    commit = ugit(sup / "stable-diffusion.cpp", "ls-tree", "HEAD", "ggml").split()[2]
    assert err.message.startswith("submodule stable-diffusion.cpp/ggml: the pinned commit is in no clone of your "
                                  "checkout (a room of a local checkout is made offline, never from the URL)")
    assert err.details is not None and f"commit {commit}" in err.details and "git.invalid/ggml.git" in err.details
    assert str(sup / ".git/modules/stable-diffusion.cpp/modules/ggml") in err.details
    assert err.hint is not None and "submodule update --init --recursive stable-diffusion.cpp" in err.hint
    assert not cfg.room.exists() and [p.name for p in cfg.workspace.iterdir()] == []
    project.assert_source_untouched()


@pytest.mark.parametrize(("listed", "nested"), [
    ("[llama.cpp, stable-diffusion.cpp]", False),
    ("[llama.cpp, stable-diffusion.cpp, stable-diffusion.cpp/ggml]", True),
])
def test_an_explicit_list_does_not_recurse_into_unlisted_ones(project, listed: str, nested: bool) -> None:
    sup = _nested(project, clone_nested=True, delete_worktree=False)
    cfg = project.write_config(source=f"git: {sup}\nsubmodules: {listed}", llama_cpp_dir="llama.cpp")
    res = apply(cfg)
    files = set(ugit(cfg.room, "ls-files").split())
    assert ("stable-diffusion.cpp/ggml/ggml.c" in files) is nested
    assert ("stable-diffusion.cpp/ggml" in "\n".join(res.notes)) is nested
    assert "stable-diffusion.cpp/sd.cpp" in files and _gitlinks(cfg.room) == []
    project.assert_source_untouched()


def test_an_explicit_list_naming_an_undeclared_submodule(project) -> None:
    sup = _nested(project, clone_nested=True, delete_worktree=False)
    cfg = project.write_config(source=f"git: {sup}\nsubmodules: [llama.cpp, stable-diffusion.cpp, ggml]", llama_cpp_dir="llama.cpp")
    with pytest.raises(ConfigError, match="source.submodules names ggml, which no .gitmodules declares") as exc:
        apply(cfg)
    assert "stable-diffusion.cpp/ggml" in (exc.value.hint or "")
    assert not cfg.room.exists()


# llamafile 0.10.x's make setup, as its scripts behave (written for the tests, modelled on 0.10.1's
# whisper.cpp.patches/apply-patches.sh and stable-diffusion.cpp.patches/apply-patches.sh)
WHISPER_SETUP = """\
#!/bin/bash
set -e
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$SCRIPT_DIR/../whisper.cpp"
if [ -n "$(git status --porcelain)" ]; then
    echo "Git status is dirty. Please commit or stash your changes before applying patches."
    exit 1
fi
cp -r "$SCRIPT_DIR"/llamafile-files/* .
rm -f Makefile
"""
SD_SETUP = """\
#!/bin/bash
set -e
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$SCRIPT_DIR/../stable-diffusion.cpp"
if [ -f "BUILD.mk" ]; then exit 0; fi
cp "$SCRIPT_DIR/llamafile-files/BUILD.mk" .
rm -rf ggml
rm -f .gitmodules
"""


def _llamafile_setup(project) -> Path:
    """_nested's checkout (no clone of stable-diffusion.cpp/ggml, as make setup leaves it) plus whisper.cpp and
    the three setup folders of llamafile 0.10.x."""
    sup = _nested(project, clone_nested=False, delete_worktree=False)
    up = project.tmp / "upstream2"
    git_init(up / "whisper", {"Makefile": "all:\n", "whisper.cpp": "int w;\n"})
    ugit(sup, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(up / "whisper"), "whisper.cpp")
    ugit(sup, "config", "-f", ".gitmodules", "submodule.whisper.cpp.url", UNREACHABLE.format("whisper.cpp"))
    files = {"whisper.cpp.patches/apply-patches.sh": WHISPER_SETUP,
             "whisper.cpp.patches/llamafile-files/BUILD.mk": "# whisper\n",
             "stable-diffusion.cpp.patches/apply-patches.sh": SD_SETUP,
             "stable-diffusion.cpp.patches/llamafile-files/BUILD.mk": "# sd\n",
             "llama.cpp.patches/llamafile-files/BUILD.mk": "LLAMA_SRCS_CPP := llama.cpp/src/llama.cpp\n",
             "llama.cpp.patches/renames.sh": "#!/usr/bin/env bash\nset -euo pipefail\n"}
    for rel, text in files.items():
        (sup / rel).parent.mkdir(parents=True, exist_ok=True)
        (sup / rel).write_text(text)
        if rel.endswith(".sh"):
            (sup / rel).chmod(0o755)
    cmake = (sup / "llama.cpp" / "CMakeLists.txt").read_text()
    (sup / "llama.cpp.patches" / "patches").mkdir()
    (sup / "llama.cpp.patches" / "patches" / "CMakeLists.txt.patch").write_bytes(make_patch_gnu(
        {"llama.cpp/CMakeLists.txt": cmake}, {"llama.cpp/CMakeLists.txt": cmake + "# llamafile\n"}, project.tmp))
    ugit(sup, "add", "-A")
    ugit(sup, "commit", "-q", "-m", "make setup's folders")
    shutil.rmtree(up)
    project.before = snapshot(sup)
    return sup


def _example_bootstrap(project, sup: Path, order=lambda steps: steps) -> None:
    import yaml

    steps = yaml.safe_load((REPO / "examples" / "llamafile.yaml").read_text())["bootstrap"]
    project.write_config(source=f"git: {sup}\nsubmodules: true", llama_cpp_dir="llama.cpp")
    project.config_path.write_text(project.config_path.read_text()
                                   + yaml.safe_dump({"bootstrap": order(steps)}, sort_keys=False))


def test_the_example_bootstrap_runs_make_setup_in_its_order_offline(project) -> None:
    """examples/llamafile.yaml's steps on a checkout as make setup leaves it: whisper.cpp first (its script
    refuses a dirty tree), stable-diffusion.cpp's deletes its ggml (never fetched), then llama.cpp's."""
    sup = _llamafile_setup(project)
    _example_bootstrap(project, sup)
    cfg = project.config
    res = apply(cfg, trust=True)
    room = cfg.room
    notes = "\n".join(res.notes)
    assert "not checked out (in no clone of your checkout): stable-diffusion.cpp/ggml" in notes
    start = set(ugit(room, "ls-tree", "-r", "--name-only", "dcaforge/start").split())
    assert {"whisper.cpp/BUILD.mk", "stable-diffusion.cpp/BUILD.mk", "llama.cpp/BUILD.mk"} <= start
    assert (room / "llama.cpp/CMakeLists.txt").read_text().endswith("# llamafile\n")
    assert "whisper.cpp/Makefile" not in start and not any(p.startswith("stable-diffusion.cpp/ggml/") for p in start)
    project.assert_source_untouched()


def test_the_llama_cpp_steps_first_make_whispers_setup_refuse(project) -> None:
    """The order the example had before: llama.cpp's steps dirty the tree, whisper.cpp's script refuses it."""
    sup = _llamafile_setup(project)
    _example_bootstrap(project, sup, order=lambda steps: steps[2:] + steps[:2])
    cfg = project.config
    with pytest.raises(CommandError) as exc:
        apply(cfg, trust=True)
    assert "Git status is dirty" in (exc.value.details or "")
    assert not cfg.room.exists()
    project.assert_source_untouched()
