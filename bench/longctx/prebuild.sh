#!/usr/bin/env bash
# Builds what bench/longctx/gpu.sh runs (llama-server, llama-perplexity, llama-batched-bench with CUDA for sm_90) here,
# on a machine with nvcc and no GPU, from cleanroom/gpu/tree.tar.gz (pack.sh), into cleanroom/gpu/bin.tar.gz: the
# device's own build takes ~6 of a session's 30 minutes on 16 cores; this one took 35 minutes on 2 cores (2026-12-07;
# 3 minutes again with ccache warm) and costs no device time.
# gpu.sh's build_bg uses it only when its stamp names the carried tree.tar.gz and its llama-server lists a CUDA device
# there; otherwise it builds on the device as before.
#   - cuBLAS comes from the PyPI wheel nvidia-cublas (CUDA 13, WHEEL_DIR): headers and link-time libraries only; on the
#     device the toolkit's own libcublas.so.13 is loaded (gpu.sh puts the toolkit's lib folders on LD_LIBRARY_PATH)
#   - libcuda.so (the driver, absent where there is no GPU) is a link-time stand-in with the driver's soname and no
#     symbols, kept by --no-as-needed: libggml-cuda.so names libcuda.so.1 (checked below), which the device's driver
#     provides when it loads
#   - the CPU backend is built for AVX2/FMA/F16C (the device's build is -march=native; with -ngl 99 the CPU does the
#     token embedding's rows and sampling)
# usage: bench/longctx/prebuild.sh WHEEL_DIR [BUILD_DIR]   (BUILD_DIR default /tmp/dcaforge-prebuild, removed first;
#        ccache is used where there is one)
set -euo pipefail
wheels=${1:?usage: prebuild.sh WHEEL_DIR [BUILD_DIR]}; work=${2:-/tmp/dcaforge-prebuild}
gpu=${PACK:-$(cd "$(dirname "$0")/../.." && pwd)/cleanroom/gpu}   # where pack.sh put tree.tar.gz
[ -f "$gpu/tree.tar.gz" ] || { echo "prebuild.sh: no $gpu/tree.tar.gz: run bench/longctx/pack.sh first" >&2; exit 2; }
whl=$(ls "$wheels"/nvidia_cublas-13.*.whl 2>/dev/null | head -1 || true)
[ -n "$whl" ] || { echo "prebuild.sh: no nvidia_cublas-13.*.whl in $wheels (pip download nvidia-cublas==13.0.0.19 --no-deps)" >&2; exit 2; }
command -v nvcc >/dev/null || { echo "prebuild.sh: nvcc is not on PATH" >&2; exit 2; }
rm -rf "$work" && mkdir -p "$work/src" "$work/cublas" "$work/stub"
tar xzf "$gpu/tree.tar.gz" -C "$work/src"
python3 -m zipfile -e "$whl" "$work/cublas"
cu="$work/cublas/nvidia/cu13"
ln -s libcublas.so.13 "$cu/lib/libcublas.so" && ln -s libcublasLt.so.13 "$cu/lib/libcublasLt.so"
echo 'void dcaforge_libcuda_link_stand_in(void) {}' > "$work/stub/stub.c"
cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$work/stub/libcuda.so" "$work/stub/stub.c"
launch=(); command -v ccache >/dev/null && launch=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
                                                 -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
source "$(dirname "$0")/cuda-build.sh"   # gpu.sh's own: CUDA_BUILD_DEFINES, CUDA_BUILD_TARGETS
cmake -S "$work/src" -B "$work/build" -G Ninja "${CUDA_BUILD_DEFINES[@]}" -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
    -DCUDA_cublas_LIBRARY="$cu/lib/libcublas.so" -DCUDA_cublasLt_LIBRARY="$cu/lib/libcublasLt.so" \
    -DCUDA_cuda_driver_LIBRARY="$work/stub/libcuda.so" -DCMAKE_CUDA_FLAGS="-I$cu/include" -DCMAKE_CXX_FLAGS="-I$cu/include" \
    -DCMAKE_EXE_LINKER_FLAGS="-Wl,--allow-shlib-undefined" -DCMAKE_SHARED_LINKER_FLAGS="-Wl,--no-as-needed" \
    -DCMAKE_SKIP_RPATH=ON "${launch[@]}" > "$work/cmake.log"
ninja -C "$work/build" "${CUDA_BUILD_TARGETS[@]}"
bin="$work/build/bin"
# the driver calls (cuMemCreate, ...) stay undefined in libggml-cuda.so: it must name libcuda.so.1, whose symbols the
# stand-in does not have (--no-as-needed keeps the name), or the device's loader has nothing to bind them to
if [ "$(nm -D --undefined-only "$bin/libggml-cuda.so" | grep -c ' cu[A-Z]')" != 0 ] &&
   [ "$(readelf -d "$bin/libggml-cuda.so" | grep -c 'NEEDED.*\[libcuda\.so\.1\]')" = 0 ]; then
    echo "prebuild.sh: libggml-cuda.so calls the driver but does not name libcuda.so.1" >&2; exit 1
fi
sha256sum "$gpu/tree.tar.gz" | cut -d' ' -f1 > "$bin/tree.sha256"
(cd "$bin" && tar czf "$gpu/bin.tar.gz" "${CUDA_BUILD_TARGETS[@]}" ./*.so* tree.sha256)
ls -la "$gpu/bin.tar.gz"
