"""llamafile's shape: llama.cpp as a real git submodule, flattened into the clean room's tree."""

from __future__ import annotations

from dcaforge.capture import capture
from dcaforge.series import apply
from dcaforge.verify import verify

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
    cap = capture(cfg)
    diffs = [ln for ln in cap.path.read_text().splitlines() if ln.startswith("diff --git")]
    assert diffs and all(d.startswith("diff --git a/llama.cpp/") for d in diffs)
    verify(cfg)
    verify(cfg, fresh_render=True)
    project.assert_source_untouched()
