"""The wiring check (dcaforge.feature.wiring), the shipped templates' build wiring on each build-file form,
and the misfit classification of dcaforge.feature.drift, on small real trees (folders) in tmp_path."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

from dcaforge.config import Config, parse_config
from dcaforge.feature.drift import canary
from dcaforge.feature.manifest import load_manifest
from dcaforge.feature.plan import plan
from dcaforge.feature.wiring import check_wiring
from dcaforge.room.trees import DirTree

REPO = Path(__file__).resolve().parents[2]
NEW = {"llama.cpp/src/llama-dca.cpp": (b"int dca;\n", 0o644),
       "llama.cpp/ggml/src/ggml-cuda/fattn-lse.cu": (b"// lse\n", 0o644),
       "llama.cpp/tests/test-dca.cpp": (b"int main() {}\n", 0o644)}

MAKEFILE = "include build/config.mk\ninclude llama.cpp/BUILD.mk\n"
BUILD_MK = """\
LLAMA_SRCS_CPP := \\
\tllama.cpp/src/llama.cpp \\
\tllama.cpp/src/llama-graph.cpp
{extra}
LLAMA_OBJS := $(LLAMA_SRCS_CPP:%.cpp=o/$(MODE)/%.cpp.o)
LLAMA_CPP_OBJS := $(LLAMA_OBJS)

o/$(MODE)/llama.cpp/llama.cpp.a: $(LLAMA_CPP_OBJS)

o/$(MODE)/llama.cpp/server/llama-server: o/$(MODE)/server.o o/$(MODE)/llama.cpp/llama.cpp.a
\t$(LINK.o) $^ -o $@
"""
SCRIPT = """\
#!/bin/sh
SRCS="
  llama.cpp/ggml/src/ggml-cuda/acc.cu \\
  llama.cpp/ggml/src/ggml-cuda/fattn.cu \\
  llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu \\
"
exec build/cudacc --shared -o "$OUT" $SRCS -lcublas
"""


def _tree(root: Path, files: dict[str, str]) -> DirTree:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return DirTree(root)


def _config(tmp: Path, backend: str = "llamafile", llama_cpp_dir: str = "llama.cpp") -> Config:
    p = tmp / "cfg.yaml"
    p.write_text(f"name: w\nsource:\n  git: {tmp}\nllama_cpp_dir: {llama_cpp_dir}\n"
                 f"feature:\n  number: 78\n  name: dca\n  templates: {REPO / 'templates' / 'dca'}\n"
                 f"  marker: '// opencoti F5 dca'\nbuild:\n  backend: {backend}\n")
    return parse_config(p)


def _llamafile(tmp: Path, build_mk_extra: str = "", script: str | None = SCRIPT) -> DirTree:
    files = {"Makefile": MAKEFILE, "build/config.mk": "COSMOCC = .cosmocc/4.0.2\n",
             "llama.cpp/BUILD.mk": BUILD_MK.format(extra=build_mk_extra),
             "llama.cpp/src/llama.cpp": "", "llama.cpp/src/llama-graph.cpp": "",
             "llama.cpp/ggml/src/ggml-cuda/fattn.cu": "", "llama.cpp/tests/test-rope.cpp": ""}
    if script is not None:
        files["llamafile/cuda.sh"] = script
    return _tree(tmp / "tree", files)


def _rows(rep) -> dict[str, tuple[str, str, str]]:
    return {r.source: (r.status, r.build, r.how or r.join) for r in rep.rows}


def test_make_list_left_out_names_the_list_and_its_line(tmp_path: Path) -> None:
    rep = check_wiring(_config(tmp_path), _llamafile(tmp_path), NEW)
    rows = _rows(rep)
    assert not rep.ok
    assert rows["llama.cpp/src/llama-dca.cpp"] == (
        "missing", "make", "LLAMA_SRCS_CPP in llama.cpp/BUILD.mk:1 (it lists 2 other files of llama.cpp/src/)")
    assert rows["llama.cpp/ggml/src/ggml-cuda/fattn-lse.cu"] == (
        "missing", "gpu script",
        "the source list of llamafile/cuda.sh:3-5 (it names 3 other files of llama.cpp/ggml/src/ggml-cuda/)")
    # llamafile's make builds no llama.cpp tests: not an error
    assert rows["llama.cpp/tests/test-dca.cpp"][0] == "unbuilt"
    assert "src/llama-dca.cpp: not built by make; add it to LLAMA_SRCS_CPP" in rep.describe_missing()


def test_make_list_joined_reaches_the_archive_and_the_server(tmp_path: Path) -> None:
    tree = _llamafile(tmp_path, "LLAMA_SRCS_CPP += llama.cpp/src/llama-dca.cpp",
                      SCRIPT.replace("  llama.cpp/ggml/src/ggml-cuda/fattn.cu", "  llama.cpp/ggml/src/ggml-cuda/fattn-lse.cu \\\n"
                                     "  llama.cpp/ggml/src/ggml-cuda/fattn.cu"))
    rep = check_wiring(_config(tmp_path), tree, NEW)
    rows = _rows(rep)
    assert rep.ok
    assert rows["llama.cpp/src/llama-dca.cpp"] == (
        "ok", "make", "LLAMA_SRCS_CPP (explicit, llama.cpp/BUILD.mk:4) -> LLAMA_OBJS -> LLAMA_CPP_OBJS -> "
                      "o/llama.cpp/llama.cpp.a, o/llama.cpp/server/llama-server")
    assert rows["llama.cpp/ggml/src/ggml-cuda/fattn-lse.cu"] == ("ok", "gpu script", "llamafile/cuda.sh line 4")


def test_wildcards_cover_new_files_and_a_list_nothing_links_does_not(tmp_path: Path) -> None:
    tree = _llamafile(tmp_path, "", SCRIPT.replace("  llama.cpp/ggml/src/ggml-cuda/acc.cu", "  llama.cpp/ggml/src/ggml-cuda/*.cu"))
    bm = tree.root / "llama.cpp/BUILD.mk"
    bm.write_text(bm.read_text().replace("\tllama.cpp/src/llama.cpp \\\n\tllama.cpp/src/llama-graph.cpp",
                                         "\t$(wildcard llama.cpp/src/*.cpp)"))
    rows = _rows(check_wiring(_config(tmp_path), tree, NEW))
    assert rows["llama.cpp/src/llama-dca.cpp"][:2] == ("ok", "make")
    assert rows["llama.cpp/src/llama-dca.cpp"][2].startswith("LLAMA_SRCS_CPP (wildcard, llama.cpp/BUILD.mk:1)")
    assert rows["llama.cpp/ggml/src/ggml-cuda/fattn-lse.cu"] == (
        "ok", "gpu script", "llamafile/cuda.sh line 3 (glob llama.cpp/ggml/src/ggml-cuda/*.cu)")
    # a list that no rule uses compiles nothing: the file is still left out
    bm.write_text(BUILD_MK.format(extra="UNUSED_SRCS := llama.cpp/src/llama-dca.cpp"))
    rows = _rows(check_wiring(_config(tmp_path), tree, NEW))
    assert rows["llama.cpp/src/llama-dca.cpp"][0] == "missing"


def test_no_gpu_script_means_no_cuda_build(tmp_path: Path) -> None:
    rows = _rows(check_wiring(_config(tmp_path), _llamafile(tmp_path, script=None), NEW))
    assert rows["llama.cpp/ggml/src/ggml-cuda/fattn-lse.cu"] == (
        "unbuilt", "gpu script",
        "the tree has no GPU library script (llamafile/cuda.sh) and its make files build no CUDA")


def test_cmake_lists_and_globs(tmp_path: Path) -> None:
    tree = _tree(tmp_path / "up", {
        "src/CMakeLists.txt": "add_library(llama\n    llama.cpp\n    llama-graph.cpp\n)\n",
        "ggml/src/ggml-cuda/CMakeLists.txt": 'file(GLOB   GGML_SOURCES_CUDA "*.cu")\n',
        "tests/CMakeLists.txt": "llama_build_and_test(test-rope.cpp)\n"})
    new = {"src/llama-dca.cpp": (b"", 0o644), "ggml/src/ggml-cuda/fattn-lse.cu": (b"", 0o644),
           "tests/test-dca.cpp": (b"", 0o644)}
    rows = _rows(check_wiring(_config(tmp_path, "cmake", "."), tree, new))
    assert rows["src/llama-dca.cpp"] == ("missing", "cmake", "src/CMakeLists.txt:2 (next to llama.cpp)")
    assert rows["ggml/src/ggml-cuda/fattn-lse.cu"] == ("ok", "cmake", "ggml/src/ggml-cuda/CMakeLists.txt:1 (GLOB *.cu)")
    assert rows["tests/test-dca.cpp"] == ("missing", "cmake", "tests/CMakeLists.txt:1 (next to test-rope.cpp)")
    (tree.root / "src/CMakeLists.txt").write_text("add_library(llama\n    llama.cpp\n    llama-dca.cpp\n)\n")
    assert _rows(check_wiring(_config(tmp_path, "cmake", "."), tree, new))["src/llama-dca.cpp"] == (
        "ok", "cmake", "src/CMakeLists.txt:3")


def _wiring_edits(cfg: Config):
    m = load_manifest(cfg.feature.templates)
    edits = tuple(e for e in m.edits if e.files in (("BUILD.mk",), ("llamafile/cuda.sh",)))
    assert len(edits) == 2
    return dataclasses.replace(m, files=(), edits=edits)


def test_shipped_templates_wire_explicit_lists_and_leave_globs_alone(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    manifest = _wiring_edits(cfg)
    tree = _llamafile(tmp_path)
    p = plan(cfg, tree, manifest)
    assert [(e.file, e.status) for e in p.edits] == [("BUILD.mk", "ok"), ("llamafile/cuda.sh", "ok")]
    build_mk = p.outputs["llama.cpp/BUILD.mk"][0].decode()
    assert ("# opencoti F5 dca: the feature's sources (llamafile's BUILD.mk lists every llama.cpp source)\n"
            "LLAMA_SRCS_CPP += \\\n\tllama.cpp/src/llama-dca.cpp \\\n\tllama.cpp/src/llama-dca-context.cpp \\\n"
            "\tllama.cpp/src/llama-dca-plan.cpp\n\n"
            "LLAMA_OBJS :=") in build_mk
    script = p.outputs["llamafile/cuda.sh"][0].decode()
    assert ("  llama.cpp/ggml/src/ggml-cuda/acc.cu \\\n  llama.cpp/ggml/src/ggml-cuda/fattn-lse-merge.cu \\\n"
            "  llama.cpp/ggml/src/ggml-cuda/fattn-lse.cu \\\n"
            "  llama.cpp/ggml/src/ggml-cuda/fattn.cu \\\n  llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu") in script
    new = {**NEW, "llama.cpp/src/llama-dca-context.cpp": (b"", 0o644), "llama.cpp/src/llama-dca-plan.cpp": (b"", 0o644),
           **p.outputs}
    assert check_wiring(cfg, tree, new).ok
    # glob forms: both edits are skipped, the globs build the files
    glob = _llamafile(tmp_path / "g", "", SCRIPT.replace("  llama.cpp/ggml/src/ggml-cuda/acc.cu",
                                                         "  llama.cpp/ggml/src/ggml-cuda/*.cu"))
    bm = glob.root / "llama.cpp/BUILD.mk"
    bm.write_text(bm.read_text().replace("LLAMA_SRCS_CPP := \\\n\tllama.cpp/src/llama.cpp \\\n\tllama.cpp/src/llama-graph.cpp",
                                         "LLAMA_SRCS_CPP := $(wildcard llama.cpp/src/*.cpp)"))
    p = plan(cfg, glob, manifest)
    assert [e.status for e in p.edits] == ["skipped", "skipped"] and p.outputs == {}
    assert check_wiring(cfg, glob, NEW).rows[0].status == "ok"
    # upstream llama.cpp (cmake): neither file exists, both skip
    up = _tree(tmp_path / "up", {"CMakeLists.txt": "project(llama)\n"})
    p = plan(_config(tmp_path, "cmake", "."), up, manifest)
    assert [e.status for e in p.edits] == ["skipped", "skipped"]


def test_shipped_script_edit_misfits_loudly_on_a_script_it_does_not_know(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    tree = _llamafile(tmp_path, script="#!/bin/sh\nnvcc -o x.so $(cat sources.txt)\n")
    p = plan(cfg, tree, _wiring_edits(cfg), check=True)
    assert [(e.file, e.status) for e in p.edits] == [("BUILD.mk", "ok"), ("llamafile/cuda.sh", "missing")]



GPU_FIXTURE = REPO / "tests" / "e2e" / "fixtures" / "llamafile-gpu"  # cuda.sh + build-functions.sh, as 0.10.x has them


def _sourced(tmp: Path) -> DirTree:
    """A llamafile tree whose GPU script is structured like 0.10.x's: cuda.sh sources build-functions.sh,
    whose collect_gpu_sources globs "$ggml_cuda_dir"/*.cu (the folder reaches it as $1 of a call)."""
    tree = _llamafile(tmp, script=None)
    for rel in ("llamafile/cuda.sh", "llamafile/build-functions.sh"):
        dest = tree.root / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes((GPU_FIXTURE / rel).read_bytes())
        dest.chmod(0o755)
    for rel in ("llama.cpp/ggml/CMakeLists.txt", "llama.cpp/ggml/src/ggml.c",
                "llama.cpp/ggml/src/ggml-cuda/template-instances/fattn-mma-f16-instance-ncols1_1-ncols2_8.cu"):
        (tree.root / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree.root / rel).write_text("set(GGML_VERSION_MAJOR 0)\n" if rel.endswith(".txt") else "")
    return tree


def test_a_script_that_sources_its_functions_builds_by_their_glob(tmp_path: Path) -> None:
    """0.10.x's cuda.sh names no .cu file: the wiring check follows `source`, the function's $1 and the
    glob (today's main reported fattn-lse.cu as unbuilt), and the manifest's edit of the script is skipped
    (today's main tried it and misfit: edit #124 on b10454)."""
    cfg = _config(tmp_path)
    tree = _sourced(tmp_path)
    rows = _rows(check_wiring(cfg, tree, NEW))
    assert rows["llama.cpp/ggml/src/ggml-cuda/fattn-lse.cu"] == (
        "ok", "gpu script", "llamafile/cuda.sh sources llamafile/build-functions.sh: line 43 "
        "(glob llama.cpp/ggml/src/ggml-cuda/*.cu from $ggml_cuda_dir/*.cu)")
    p = plan(cfg, tree, _wiring_edits(cfg), check=True)
    assert [(e.file, e.status) for e in p.edits] == [("BUILD.mk", "ok"), (None, "skipped")]
    assert "script_builds('llamafile/cuda.sh'" in p.edits[1].note and "llamafile/cuda.sh" not in p.outputs
    # without the sourced file, nothing globs the folder: the edit is tried (and misfits: no list to join)
    (tree.root / "llamafile/build-functions.sh").unlink()
    assert _rows(check_wiring(cfg, tree, NEW))["llama.cpp/ggml/src/ggml-cuda/fattn-lse.cu"][0] == "unbuilt"
    assert [e.status for e in plan(cfg, tree, _wiring_edits(cfg), check=True).edits] == ["ok", "missing"]


def test_a_script_sourcing_files_outside_the_tree_is_not_followed_there(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    outside = tmp_path / "outside.sh"
    outside.write_text('for f in llama.cpp/ggml/src/ggml-cuda/*.cu; do :; done\n')
    tree = _llamafile(tmp_path, script=f"#!/bin/sh\nsource {outside}\n. ../outside.sh\nD=../..\nsource $D/outside.sh\n")
    assert _rows(check_wiring(cfg, tree, NEW))["llama.cpp/ggml/src/ggml-cuda/fattn-lse.cu"][0] == "unbuilt"


def test_the_script_dry_run_records_a_sourced_scripts_calls(tmp_path: Path) -> None:
    """The 0.10.x-shaped script run for real with recording stand-ins: nvcc found at $CUDA_PATH/bin, one
    nvcc call per source by absolute path (made tree-relative), gcc/g++ for ggml's core, the build in
    $HOME/.cache of the scratch folder (never the user's HOME)."""
    from dcaforge.builder.dryrun import script_dry_run

    tree = _sourced(tmp_path)
    (tree.root / "llama.cpp/ggml/src/ggml-cuda/fattn-lse.cu").write_text("")
    home = Path.home()
    before = sorted(p.name for p in home.iterdir())
    sd = script_dry_run(tree.root, "llamafile/cuda.sh", ["--clean", "--output", str(tmp_path / "lib.so"), "-j2"],
                        tmp_path / "scratch")
    assert sorted(p.name for p in home.iterdir()) == before
    assert sorted(set(sd.sources())) == ["llama.cpp/ggml/src/ggml-cuda/fattn-lse.cu", "llama.cpp/ggml/src/ggml-cuda/fattn.cu",
                                         "llama.cpp/ggml/src/ggml-cuda/template-instances/"
                                         "fattn-mma-f16-instance-ncols1_1-ncols2_8.cu"]
    compiles = [c for c in sd.nvcc_calls() if "-c" in c]
    assert len(compiles) == 3 and all("arch=compute_86,code=sm_86" in c for c in compiles)
    assert sd.nvcc_calls()[-1][:1] == ["--shared"] and (tmp_path / "lib.so").exists()
    assert [c["tool"] for c in sd.calls if c["tool"] != "nvcc"] == ["gcc"]  # ggml.c (the only core file here)
    assert (tmp_path / "scratch" / "home" / ".cache" / "llamafile-cuda-build").is_dir()


DRIFT_MANIFEST = """\
files: []
edits:
  - file: src/ops.c
    anchor: 'static_assert\\(OP_COUNT == 101\\);'
    action: replace
    text: 'static_assert(OP_COUNT == 102);'
  - file: src/ctx.h
    anchor: '(?m)^    void \\* ctx_other;\\n'
    action: insert_after
    text: "    int dca;\\n"
  - file: [src/models/gemma3.cpp]
    anchor: 'Kcur'
    action: replace
    text: 'Kdca'
  - file: src/graph.cpp
    anchor: 'build_attn_mha\\(q, k\\)'
    action: replace
    text: 'build_attn_dca(q, k)'
"""


def test_drift_classifies_each_misfit_from_the_pristine_file(tmp_path: Path) -> None:
    tree = tmp_path / "llama.cpp"
    _tree(tree, {"src/ops.c": "int x;\nstatic_assert(OP_COUNT == 96);\n",
                 "src/ctx.h": "struct ctx {\n    void * ctx;\n};\n",
                 "src/models/gemma3-iswa.cpp": "Kcur = rope(Kcur);\n",
                 "src/graph.cpp": "// graph\n", "src/graph-attn.cpp": "x = build_attn_mha(q, k);\n"})
    feat = tmp_path / "feat"
    feat.mkdir()
    (feat / "manifest.yaml").write_text(textwrap.dedent(DRIFT_MANIFEST))
    cfg = dataclasses.replace(_config(tmp_path, "cmake", "llama.cpp"),
                              feature=dataclasses.replace(_config(tmp_path).feature, templates=feat))
    res = canary(cfg, tree_dir=tree)  # a llama.cpp tree: llama_cpp_dir is "." whatever the config says
    by = {m.index: m for m in res.misfits}
    assert (res.fit, res.drifted, res.absent) == (0, 2, 2)
    assert res.summary() == f"fit 0, drifted 2, absent 2 (skipped 0) of 4 edits on {tree}"
    assert by[0].kind == "drifted" and by[0].nearest == [("anchor", ["2: static_assert(OP_COUNT == 96);"])]
    assert by[1].kind == "absent" and by[1].reason.startswith("`ctx_other` in no file of this tree: the feature "
                                                               "needs the upstream change that adds it")
    assert by[2].kind == "absent" and "this tree has src/models/gemma3-iswa.cpp" in by[2].reason
    assert by[3].kind == "drifted" and by[3].reason.startswith("the anchor fits src/graph-attn.cpp instead")


def test_a_hostile_script_is_read_in_bounded_time(tmp_path: Path) -> None:
    """Nesting, variable bombs, self-references and a source loop: read without an error, in bounded time."""
    import time

    cfg = _config(tmp_path)
    bomb = "".join(f"V{i}=$V{i - 1}/a\nV{i}=$V{i - 1}/b\n" for i in range(1, 40)) + "V0=x\nA=$A$A\n"
    script = ("#!/bin/sh\n" + "echo \"$(" * 5000 + "\n" + ")\"" * 5000 + "\n" + bomb
              + "source llamafile/cuda.sh\nfor f in $V39/*.cu; do :; done\n" + "X=\"$(cd \"$(" * 300 + "\n")
    tree = _llamafile(tmp_path, script=script)
    t0 = time.monotonic()
    rows = _rows(check_wiring(cfg, tree, NEW))
    assert time.monotonic() - t0 < 10
    assert rows["llama.cpp/ggml/src/ggml-cuda/fattn-lse.cu"][0] == "unbuilt"
