"""llamafile's real layout for the tests, made at test time from the small extract in
fixtures/llamafile/ (llamafile's own build files, verbatim; see its SOURCE.md) and a llama.cpp tree
the tests can obtain (the PyPI sdist of llama-cpp-python).

What is made here and not taken from llamafile:
- the source lists of llama.cpp's BUILD.mk are refreshed for the pinned llama.cpp (what llamafile's
  maintainers do at each llama.cpp bump): each list keeps its folders and gets their current files;
- ``llamafile/cuda.sh``, the GPU library script: the public tree has none (the user's 0.10.x script
  is not public); this one builds ``ggml-cuda.so`` with nvcc (through llamafile's ``build/cudacc``)
  from an explicit list of llama.cpp's ggml-cuda sources plus globs of its template instances, with
  the flags llama.cpp's CMake gives them, for sm_86 and sm_90;
- empty stand-ins for llamafile's own C/C++ sources and third_party's build files, which the
  Makefile names but these tests never compile (they are not llama.cpp).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.core.helpers import file_snapshot, ugit  # noqa: E402

UNREACHABLE = "https://git.invalid/ggml-org/llama.cpp.git"  # .invalid never resolves: no network use

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "llamafile"
#: the GPU library script as llamafile 0.10.x structures it (cuda.sh sources build-functions.sh, which globs the
#: CUDA sources), written for the tests: fixtures/llamafile-gpu/SOURCE.md
GPU_FIXTURE = Path(__file__).resolve().parent / "fixtures" / "llamafile-gpu"

#: lists whose folders are refreshed from the tree (every file of the same folder and extension)
REFRESH = ("GGML_SRCS_C", "GGML_SRCS_CPP", "LLAMA_SRCS_CPP", "COMMON_SRCS_CPP", "TOOL_SERVER_SRCS")
#: llama.cpp moved these tools; the list follows them
MOVED = {"llama.cpp/tools/main/": "llama.cpp/tools/cli/"}
SKIP = {"llama.cpp/common/build-info.cpp"}  # generated from build-info.cpp.in by the Makefile


def _list_re(name: str) -> re.Pattern[str]:
    return re.compile(r"(?m)^" + name + r" :=((?:[^\n]*\\\n)*[^\n]*\n)")


def _format(name: str, items: list[str]) -> str:
    return f"{name} :=" + "".join(f" \\\n\t{x}" for x in items) + "\n"


def port_build_mk(text: str, root: Path) -> str:
    """llama.cpp.patches/llamafile-files/BUILD.mk with its source lists made to fit the llama.cpp
    at ``root / 'llama.cpp'`` (llama.cpp-relative folders of the old entries, their current files)."""
    for m in re.finditer(r"(?m)^([A-Z_]+_SRCS(?:_C|_CPP)?) :=", text):
        name = m.group(1)
        lm = _list_re(name).search(text)
        if lm is None:
            continue
        old = [w for w in lm.group(1).replace("\\", " ").split() if not w.startswith("$")]
        new: list[str] = []
        for w in old:
            for a, b in MOVED.items():
                if w.startswith(a):
                    w = b + w[len(a):]
            if name in REFRESH or w.startswith(tuple(MOVED.values())):
                folder, ext = w.rsplit("/", 1)[0], "." + w.rsplit(".", 1)[1]
                new += sorted(f"{folder}/{p.name}" for p in (root / folder).glob(f"*{ext}") if p.is_file())
            elif (root / w).is_file():
                new.append(w)
        new = [x for x in dict.fromkeys(new) if x not in SKIP]
        text = text[:lm.start()] + _format(name, new) + text[lm.end():]
    if not (root / "llama.cpp/tools/server/public").is_dir():  # the web UI moved out (llamafile fetches it)
        text = re.sub(r"(?m)^SERVER_ASSETS :=(?:[^\n]*\\\n)*[^\n]*\n", "SERVER_ASSETS :=\n", text)
    return text


def port_llamafile_mk(text: str, root: Path) -> str:
    """llamafile/BUILD.mk: the Metal sources it embeds, kept where the tree still has them."""
    lm = _list_re("LLAMAFILE_METAL_SOURCES").search(text)
    if lm is None:
        return text
    keep = [w for w in lm.group(1).replace("\\", " ").split()
            if (root / re.sub(r"^o/\$\(MODE\)/", "", w).removesuffix(".zip.o")).is_file()]
    return text[:lm.start()] + _format("LLAMAFILE_METAL_SOURCES", keep) + text[lm.end():]


FA_TYPES = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "bf16", "f16")


def gpu_script(root: Path) -> str:
    """llamafile/cuda.sh for the llama.cpp at ``root / 'llama.cpp'``: explicit sources, nvcc flags
    as llama.cpp's CMake gives ggml-cuda (its default flash-attention vec instances)."""
    cuda = root / "llama.cpp/ggml/src/ggml-cuda"
    srcs = sorted(f"llama.cpp/ggml/src/ggml-cuda/{p.name}" for p in cuda.glob("*.cu"))
    cmake = (root / "llama.cpp/ggml/CMakeLists.txt").read_text()
    m = re.search(r'GGML_CUDA_FA_QUANTS\s+"([^"]+)"', cmake)
    if m:  # llama.cpp picks the flash-attention vec instances by GGML_CUDA_FA_<K>_<V> (b11000 and later)
        combos = set(m.group(1).split(";")) | {"f16-f16"}
        fa = [f"-DGGML_CUDA_FA_{k.upper()}_{v.upper()}={int(f'{k}-{v}' in combos)}" for v in FA_TYPES for k in FA_TYPES]
        fa.append(f"-DGGML_CUDA_FA_QUANTS='\"{','.join(sorted(combos))}\"'")
        vec = " ".join(f"$T/fattn-vec-instance-{c}.cu" for c in sorted(combos))
    else:  # older: every vec instance, all quants
        fa, vec = ["-DGGML_CUDA_FA_ALL_QUANTS"], "$(ls $T/fattn-vec*.cu)"
    lines = "".join(f"  {s} \\\n" for s in srcs)
    fa_flags = " \\\n  ".join(" ".join(fa[i:i + 4]) for i in range(0, len(fa), 4))
    return f"""#!/bin/sh
# llamafile's GPU library: ggml-cuda.so from llama.cpp's ggml-cuda sources, with nvcc through
# build/cudacc (nvcc on PATH, else $CUDA_PATH, /opt/cuda, /usr/local/cuda).
#   llamafile/cuda.sh [--clean] [--output FILE]    (default o/cuda/ggml-cuda.so; CUBLAS_INCLUDE: extra -I)
set -e
OUTPUT=o/cuda/ggml-cuda.so
while [ $# -gt 0 ]; do
  case "$1" in
    --clean) CLEAN=1; shift ;;
    --output) OUTPUT="$2"; shift 2 ;;
    *) echo "usage: $0 [--clean] [--output FILE]" >&2; exit 2 ;;
  esac
done
[ -n "$CLEAN" ] && rm -f "$OUTPUT"
mkdir -p "$(dirname "$OUTPUT")"
SRCS="
{lines}"
T=llama.cpp/ggml/src/ggml-cuda/template-instances
INSTANCES="$(ls $T/fattn-tile*.cu $T/fattn-mma*.cu $T/mmq*.cu $T/mmf*.cu) {vec}"
exec build/cudacc --shared -Xcompiler -fPIC -O3 -std=c++17 -use_fast_math -extended-lambda \\
  -gencode arch=compute_86,code=sm_86 -gencode arch=compute_90,code=sm_90 \\
  -DNDEBUG -DGGML_BUILD -DGGML_SHARED -DGGML_BACKEND_BUILD -DGGML_BACKEND_SHARED -DGGML_USE_CUDA \\
  -DGGML_CUDA_PEER_MAX_BATCH_SIZE=128 -DGGML_SCHED_MAX_COPIES=4 \\
  {fa_flags} \\
  -Illama.cpp/ggml/include -Illama.cpp/ggml/src -Illama.cpp/ggml/src/ggml-cuda ${{CUBLAS_INCLUDE:+-I$CUBLAS_INCLUDE}} \\
  -o "$OUTPUT" $SRCS $INSTANCES -lcublas -lcuda
"""


STANDIN = "// stand-in for one of llamafile's own sources (named by its Makefile; these tests do not compile it)\n"


def write_llamafile(src: Path) -> None:
    """llamafile's files (the extract, the GPU script is written by :func:`finish_llamafile`) and
    stand-ins for what its Makefile names but the tests do not build."""
    for p in FIXTURE.rglob("*"):
        if p.is_file() and p.name != "SOURCE.md":
            dest = src / p.relative_to(FIXTURE)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(p, dest)
    mk = (src / "llamafile/BUILD.mk").read_text()
    names = set(re.findall(r"\bllamafile/[\w/]+\.(?:c|cpp)\b", mk))
    names |= {"llamafile/main.cpp", "llamafile/llamafile.c", "llamafile/metal.c", "llamafile/zip.c"}
    for rel in sorted(names) + ["llamafile/llamafile.h", "third_party/stb/stb_image_resize2.c"]:
        p = src / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(STANDIN)
    for sub in ("double-conversion", "mbedtls", "sqlite", "stb"):
        (src / "third_party" / sub).mkdir(parents=True, exist_ok=True)
        (src / "third_party" / sub / "BUILD.mk").write_text(f"# stand-in for third_party/{sub}/BUILD.mk\n")


def finish_llamafile(src: Path, gpu: str = "explicit") -> None:
    """Fit the build files to the llama.cpp checked out at ``src / 'llama.cpp'`` and write the GPU script:
    ``explicit`` (:func:`gpu_script`, a source list the feature's edit joins) or ``sourced`` (0.10.x's
    structure, fixtures/llamafile-gpu: it globs, the edit is skipped)."""
    bm = src / "llama.cpp.patches/llamafile-files/BUILD.mk"
    bm.write_text(port_build_mk(bm.read_text(), src))
    lm = src / "llamafile/BUILD.mk"
    lm.write_text(port_llamafile_mk(lm.read_text(), src))
    if gpu == "sourced":
        for rel in ("llamafile/cuda.sh", "llamafile/build-functions.sh"):
            (src / rel).write_bytes((GPU_FIXTURE / rel).read_bytes())
            (src / rel).chmod(0o755)
        return
    script = src / "llamafile/cuda.sh"
    script.write_text(gpu_script(src))
    script.chmod(0o755)


@dataclass
class Checkout:
    tmp: Path
    source: Path
    series: Path
    before: dict[str, tuple[int, str]]

    def config(self, name: str) -> Path:
        """examples/llamafile.yaml pointed at this checkout, its series and a workspace under tmp."""
        data = yaml.safe_load((REPO / "examples" / "llamafile.yaml").read_text())
        data["root"] = str(REPO)
        data["name"] = name
        data["cleanroom"] = str(self.tmp / "cleanroom")
        data["source"] = {"git": str(self.source), "ref": ugit(self.source, "rev-parse", "HEAD").strip(),
                          "submodules": True}
        data["series"]["dir"] = str(self.series)
        for key in ("series_readme", "upstream_sync"):
            doc = data["bookkeeping"][key]
            doc["file"] = str(self.series / Path(doc["file"]).name)
        path = self.tmp / f"{name}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path


def make_checkout(tmp: Path, base_url: str, base_ref: str, *, gpu: str = "explicit",
                  llamafile_patches: bool = True) -> Checkout:
    """The user's checkout (``gpu``: see :func:`finish_llamafile`; ``llamafile_patches=False`` leaves
    llamafile's per-file patches out, for a llama.cpp they were not made for)."""
    src = tmp / "llamafile"
    src.mkdir()
    ugit(src, "init", "-q")
    write_llamafile(src)
    if not llamafile_patches:
        for patch in (src / "llama.cpp.patches" / "patches").glob("*.patch"):
            patch.unlink()
        (src / "llama.cpp.patches" / "patches" / "README").write_text("llamafile's patches are for another llama.cpp\n")
    ugit(src, "-c", "protocol.file.allow=always", "submodule", "add", "-q", Path(base_url).as_uri(), "llama.cpp")
    ugit(src / "llama.cpp", "checkout", "-q", base_ref)
    finish_llamafile(src, gpu)
    ugit(src, "config", "-f", ".gitmodules", "submodule.llama.cpp.url", UNREACHABLE)
    ugit(src, "add", "-A")
    ugit(src, "commit", "-q", "-m", "llamafile 0.10.x layout, llama.cpp as a submodule")
    series = tmp / "work" / "vendors" / "patches" / "llamafile"
    series.mkdir(parents=True)
    for name in ("README.md", "UPSTREAM_SYNC.md"):
        shutil.copy(REPO / "vendors" / "patches" / "llamafile" / name, series / name)
    # the user's series: one plain diff on top of make setup (paths a/llama.cpp/...)
    old = (src / "llama.cpp/src/llama.cpp").read_text()
    (tmp / "a.txt").write_text(old)
    (tmp / "b.txt").write_text("// opencoti: the user's series\n" + old)
    diff = subprocess.run(["diff", "-u", "--label", "a/llama.cpp/src/llama.cpp", "--label", "b/llama.cpp/src/llama.cpp",
                           str(tmp / "a.txt"), str(tmp / "b.txt")], capture_output=True, check=False).stdout
    (series / "0001-opencoti-note.patch").write_bytes(diff)
    return Checkout(tmp=tmp, source=src, series=series, before=file_snapshot(src))


def main(argv: list[str]) -> int:
    """``python tests/e2e/llamafile_fixture.py DIR``: the same checkout and config in DIR (llama.cpp
    from llama-cpp-python 0.3.36), then ``dcaforge apply``: a rendered llamafile clean room, e.g.
    for ``bench/gpu/llamafile_cuda_lib.py pack``."""
    from dcaforge.config import PypiSource
    from dcaforge.room.source import prepare_pypi

    out = Path(argv[1] if len(argv) > 1 else "cleanroom/llamafile-fixture").resolve()
    out.mkdir(parents=True, exist_ok=False)
    base = prepare_pypi(PypiSource("llama-cpp-python==0.3.36", "vendor/llama.cpp"))
    co = make_checkout(out, base.clone_url, base.ref)
    cfg = co.config("lf")
    p = subprocess.run([sys.executable, "-c", "from dcaforge.cli import main; main()", "apply", "--trust", "-c", str(cfg)],
                       cwd=REPO, check=False)
    if p.returncode == 0:
        print(f"room: {out / 'cleanroom' / 'lf'}\nnext: python3 bench/gpu/llamafile_cuda_lib.py pack {out / 'cleanroom' / 'lf'}")
    return p.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv))
