#!/usr/bin/env bash
# DCA's all-layer speed on the GPU machine (one H200): SmolLM2-135M-Instruct (llama, 30 layers, every one DCA,
# trained 8192), DCA chunk 6144 / local 1024 (3/4 and 1/8 of 8192, the automatic sizes until run 7) against plain attention, -fa on, same build.
# The build and the model are run.sh's: bench/gpu/pack.sh packs the tree and the smol.NN pieces (here, not on the
# device), then `run.sh build` (or build_bg + wait_build) and `run.sh model` on the device; the model is run.sh's
# $SMOL (~/model/smollm2-135m-instruct-q4_1.gguf), so one packing serves both scripts.
#
# Steps (any subset, in order):
#   model       run.sh's model step (copies the carried pieces to ~/model, joins each model once its sha256 matches)
#   ops         test-backend-ops -b CUDA0 for FLASH_ATTN_EXT_LSE_MERGE and FLASH_ATTN_EXT_LSE (against the CPU),
#               test-dca -b CUDA0 (every scenario in both layouts against the double reference, the device-built
#               decode masks against the host's), test-dca nodes (the core's graph nodes and kernels per layout),
#               test-dca perf -b CUDA0 (the DCA core, ranges and stacked, against one plain FA, decode and a
#               512-token ubatch at 16k)
#   speed1      1 sequence, prompt 32k and 64k, 128 generated; speed4: 4 sequences of 15k (-npl 4), one KV stream
#               each and unified (-kvu). Variants, alternating, $ROUNDS rounds (default 3; $VARIANTS1 and
#               $VARIANTS4 choose them):
#                 plain, dca (the default: per ubatch, a decode's regimes stacked in one FA launch + one merge op),
#                 dca-ranges (LLAMA_DCA_MODE=ranges: one FA launch per regime at every ubatch, then the merge op),
#                 and for 1 sequence plain-nog / dca-nog (GGML_CUDA_DISABLE_GRAPHS=1: does DCA keep CUDA graphs
#                 working?)
#   table       the ratio table (bench/gpu/perf_table.py) of every speed log in $OUT
#   profile     where the time goes: nsys (when installed) over plain, dca and dca-ranges, prompt 32k + 128
#               generated, per-kernel totals (CUDA graphs traced per node, $OUT/prof-<variant>_cuda_gpu_kern_sum.csv)
# Output: $OUT (default /tmp/out): the table in perf-table.txt, every log in one archive, perf-logs.tgz (the device tool
# brings back at most 8 files). With run.sh's build and model there, two calls of a few minutes each:
#   bash bench/gpu/perf.sh ops speed1 table        then        bash bench/gpu/perf.sh speed4 table profile
set -uo pipefail
OUT=${OUT:-/tmp/out}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
MODEL=~/model/smollm2-135m-instruct-q4_1.gguf   # run.sh's $SMOL (tests/core/test_bench_perf.py keeps them equal)
BIN=${BIN:-~/llb/build/bin}
COMMON=(-m "$MODEL" -ngl 99 -fa on -b 2048 -ub 512)
DCA=(--dca on --dca-chunk-size 6144 --dca-local-size 1024)

step_model() { # run.sh's, from the repository root (the pieces under cleanroom/gpu/)
    (cd "$ROOT" && OUT="$OUT" bash bench/gpu/run.sh model)
    [ -f "$MODEL" ] || { echo "model: no $MODEL yet (carry the smol.NN pieces of bench/gpu/pack.sh)"; return 1; }
}

step_ops() {
    for op in FLASH_ATTN_EXT_LSE_MERGE FLASH_ATTN_EXT_LSE; do
        "$BIN/test-backend-ops" -b CUDA0 -o "$op" > "$OUT/ops-$op.log" 2>&1
        echo "test-backend-ops -b CUDA0 -o $op rc=$?: $(grep -E "tests passed" "$OUT/ops-$op.log" | tail -1)"
        grep -m5 FAIL "$OUT/ops-$op.log"
    done
    "$BIN/test-dca" -b CUDA0 > "$OUT/test-dca-cuda.log" 2>&1
    echo "test-dca -b CUDA0 rc=$?: $(tail -2 "$OUT/test-dca-cuda.log" | tr '\n' ' ')"
    grep -m10 "^FAIL" "$OUT/test-dca-cuda.log"
    grep -E "^device-built stacked masks|^K-shift|^plan," "$OUT/test-dca-cuda.log"
    "$BIN/test-dca" nodes > "$OUT/test-dca-nodes.log" 2>&1
    echo "test-dca nodes rc=$?"; grep "^nodes:" "$OUT/test-dca-nodes.log"
    "$BIN/test-dca" perf -b CUDA0 > "$OUT/test-dca-perf-cuda.log" 2>&1
    echo "test-dca perf -b CUDA0 rc=$?"; grep "^perf: n_kv" "$OUT/test-dca-perf-cuda.log"
}

bench_one() { # setup variant round batched-bench-args...
    local setup=$1 variant=$2 round=$3; shift 3
    local env=() dca=()
    case $variant in
        plain)     ;;
        dca)       dca=("${DCA[@]}") ;;
        dca-ranges) dca=("${DCA[@]}"); env=(LLAMA_DCA_MODE=ranges) ;;
        plain-nog) env=(GGML_CUDA_DISABLE_GRAPHS=1) ;;
        dca-nog)   dca=("${DCA[@]}"); env=(GGML_CUDA_DISABLE_GRAPHS=1) ;;
        *) echo "bench_one: unknown variant $variant"; return 1 ;;
    esac
    local log="$OUT/speed-$setup-$variant-$round.log"
    env "${env[@]}" "$BIN/llama-batched-bench" "${COMMON[@]}" "${dca[@]}" "$@" > "$log" 2>&1
    local rc=$?
    echo "$setup $variant round $round rc=$rc: $(grep -E "^\|[ 0-9]" "$log" | awk -F'|' '{printf "[pp %s B %s: %s / %s t/s] ", $2, $4, $7, $9}')"
}

step_speed1() {
    for round in $(seq 1 "${ROUNDS:-3}"); do
        for v in ${VARIANTS1:-plain dca dca-ranges plain-nog dca-nog}; do
            bench_one 1seq "$v" "$round" -c 65792 -npp 32768,65536 -ntg 128 -npl 1
        done
    done
}

step_speed4() {
    for round in $(seq 1 "${ROUNDS:-3}"); do
        for v in ${VARIANTS4:-plain dca dca-ranges}; do
            bench_one 4seq     "$v" "$round" -c 61952 -npp 15360 -ntg 128 -npl 4
            bench_one 4seq-kvu "$v" "$round" -c 61952 -npp 15360 -ntg 128 -npl 4 -kvu
        done
    done
}

step_profile() {
    local nsys; nsys=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
    [ -n "$nsys" ] || { echo "profile: no nsys on this machine"; return 0; }
    mkdir -p ~/llb/prof
    for v in plain dca dca-ranges; do
        local env=() dca=()
        [ "$v" != plain ] && dca=("${DCA[@]}")
        [ "$v" = dca-ranges ] && env=(LLAMA_DCA_MODE=ranges)
        env "${env[@]}" "$nsys" profile --force-overwrite true --cuda-graph-trace=node -o ~/llb/prof/"$v" \
            "$BIN/llama-batched-bench" "${COMMON[@]}" "${dca[@]}" -c 33024 -npp 32768 -ntg 128 -npl 1 \
            > "$OUT/prof-$v.log" 2>&1
        "$nsys" stats --report cuda_gpu_kern_sum --format csv -o "$OUT/prof-$v" ~/llb/prof/"$v".nsys-rep \
            > "$OUT/prof-$v-stats.log" 2>&1
        echo "== profile $v: kernels by total GPU time"
        python3 - "$OUT/prof-$v"*cuda_gpu_kern_sum*.csv <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
tot = sum(float(r["Total Time (ns)"]) for r in rows)
print(f"kernels: {len(rows)} kinds, {sum(int(r['Instances']) for r in rows)} launches, {tot / 1e6:.1f} ms in all")
for r in rows[:15]:
    print(f"{float(r['Time (%)']):5.1f}% {float(r['Total Time (ns)']) / 1e6:9.2f} ms {int(r['Instances']):7d}x  {r['Name'][:110]}")
PY
    done
}

step_table() {
    python3 "$ROOT/bench/gpu/perf_table.py" "$OUT" | tee "$OUT/perf-table.txt"
}

pack_logs() { # every log and csv of $OUT into one archive (added to by later calls), the table stays
    local f=(); for x in "$OUT"/*.log "$OUT"/*.csv; do [ -f "$x" ] && f+=("${x##*/}"); done
    [ ${#f[@]} -gt 0 ] || return 0
    local dir; dir=$(mktemp -d)
    [ -f "$OUT/perf-logs.tgz" ] && tar xzf "$OUT/perf-logs.tgz" -C "$dir"
    cp "${f[@]/#/$OUT/}" "$dir/" && tar czf "$OUT/perf-logs.tgz" -C "$dir" . && rm -f "${f[@]/#/$OUT/}"
    rm -rf "$dir"
}

mkdir -p "$OUT"
trap pack_logs EXIT
for s in "$@"; do
    echo "== $s ($(date -u +%H:%M:%S))"
    "step_$s" || { echo "step $s failed"; exit 1; }
done
