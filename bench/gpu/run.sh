#!/usr/bin/env bash
# Runs on the GPU machine (one H200), in the repository root, through the device tool.
# Steps (any subset, in order): model build ops speed passkey ppl
#   model    copy the carried model parts (cleanroom/gpu/part*) to ~/model and reassemble the GGUF
#   build    unpack the carried clean-room tree (cleanroom/gpu/tree.tar.gz) and build it with CUDA (sm_90)
#   ops      test-backend-ops: FLASH_ATTN_EXT_LSE against the CPU, and perf next to FLASH_ATTN_EXT
#   speed    llama-batched-bench, plain vs DCA, -fa on, at 32k and 128k (prompt processing, generation, memory)
#   passkey  llama-passkey at ~64k and ~128k tokens, 10 positions each, plain vs YaRN x4 vs DCA
#   ppl      llama-perplexity at 8k/32k/64k/128k, plain vs YaRN x4 vs DCA
# Results (tsv + logs) go to $OUT; bench/gpu/RESULTS.md is written from them on the workstation.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" ~/model ~/llb
MODEL=~/model/gemma3-270m-q4_k_m.gguf
SHA=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
BIN=~/llb/build/bin
COMMON=(-m "$MODEL" -ngl 99 -fa on -b 2048 -ub 512)
DCA=(--dca on --dca-chunk-size 24576 --dca-local-size 4096)   # 3/4 and 1/8 of the trained 32768
YARN=(--rope-scaling yarn --rope-scale 4 --yarn-orig-ctx 32768)

step_model() {
    for p in cleanroom/gpu/part*; do [ -f "$p" ] && cp "$p" ~/model/; done
    if ls ~/model/part00 ~/model/part01 ~/model/part02 ~/model/part03 >/dev/null 2>&1; then
        cat ~/model/part00 ~/model/part01 ~/model/part02 ~/model/part03 > "$MODEL"
        echo "$SHA  $MODEL" | sha256sum -c - && rm -f ~/model/part0*
    fi
    ls -la ~/model
}

step_build_bg() { # start the build detached, so the model transfers can run meanwhile
    rm -f ~/llb/build.done ~/llb/build.rc
    setsid nohup bash -c "OUT=\$HOME/llb/logs bash $PWD/bench/gpu/run.sh build > ~/llb/build-step.log 2>&1; echo \$? > ~/llb/build.rc; touch ~/llb/build.done" \
        >/dev/null 2>&1 </dev/null &
    echo "build started in the background"
}

step_wait_build() {
    while [ ! -f ~/llb/build.done ]; do sleep 5; done
    cat ~/llb/build-step.log; cp ~/llb/logs/*.log "$OUT/" 2>/dev/null
    [ "$(cat ~/llb/build.rc)" = 0 ]
}

step_build() {
    if [ cleanroom/gpu/tree.tar.gz -nt ~/llb/.unpacked ] || [ ! -d ~/llb/src ]; then
        rm -rf ~/llb/src && mkdir -p ~/llb/src && tar xzf cleanroom/gpu/tree.tar.gz -C ~/llb/src && touch ~/llb/.unpacked
    fi
    cmake -S ~/llb/src -B ~/llb/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_BUILD_SERVER=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_APP=OFF \
        > "$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; return 1; }
    local t0=$SECONDS
    ninja -C ~/llb/build -j16 test-backend-ops test-dca llama-passkey llama-perplexity llama-batched-bench \
        > "$OUT/build.log" 2>&1 || { grep -m5 -A5 "error" "$OUT/build.log"; tail -5 "$OUT/build.log"; return 1; }
    echo "build: $((SECONDS - t0)) s"
}

step_ops() {
    "$BIN/test-backend-ops" -b CUDA0 -o FLASH_ATTN_EXT_LSE > "$OUT/ops-test.log" 2>&1
    echo "test-backend-ops FLASH_ATTN_EXT_LSE rc=$?"; grep -E "tests passed|FAIL" "$OUT/ops-test.log" | tail -5
    "$BIN/test-backend-ops" perf -b CUDA0 -o FLASH_ATTN_EXT_LSE > "$OUT/ops-perf-lse.log" 2>&1
    "$BIN/test-backend-ops" perf -b CUDA0 -o FLASH_ATTN_EXT > "$OUT/ops-perf-fa.log" 2>&1
    "$BIN/test-dca" > "$OUT/test-dca.log" 2>&1; echo "test-dca rc=$?"; tail -3 "$OUT/test-dca.log"
}

step_speed() {
    for mode in plain dca; do
        local extra=(); [ $mode = dca ] && extra=("${DCA[@]}")
        "$BIN/llama-batched-bench" "${COMMON[@]}" "${extra[@]}" -c 135168 -npp 32768,131072 -ntg 128 -npl 1 \
            > "$OUT/speed-$mode.log" 2>&1
        echo "speed $mode rc=$?"; grep -E "^\|" "$OUT/speed-$mode.log"
        grep -E "KV buffer size|compute buffer size|model buffer size" "$OUT/speed-$mode.log" | sed "s/^/  $mode: /"
    done
}

passkey_one() { # name junk pos ctx_override extra...
    local name=$1 junk=$2 pos=$3 ovr=$4; shift 4
    local log="$OUT/passkey/$name-$pos.log"
    "$BIN/llama-passkey" "${COMMON[@]}" --junk "$junk" --pos "$pos" --override-kv "gemma3.context_length=int:$ovr" "$@" \
        > "$log" 2>"$log.err"
    local rc=$?
    local answer; answer=$(tr '\n' ' ' < "$log" | sed 's/.*The pass key is//' | head -c 40)
    local tokens; tokens=$(grep -o "prompt tokens: [0-9]*" "$log.err" | grep -o "[0-9]*$")
    local first; first=$(echo "$answer" | grep -oE "[0-9]+" | head -1)
    local exact=0; [ "$first" = "39384" ] && exact=1
    printf "%s\t%s\t%s\t%s\t%s\t%s\trc=%s\n" "$name" "$junk" "$pos" "$tokens" "$answer" "$exact" "$rc" >> "$OUT/passkey.tsv"
}

step_passkey() {
    mkdir -p "$OUT/passkey"
    printf "name\tjunk\tpos\ttokens\tanswer\texact\trc\n" > "$OUT/passkey.tsv"
    for spec in "64k 2900 131072" "128k 5600 262144"; do
        set -- $spec; local len=$1 junk=$2 ovr=$3
        for k in 0 1 2 3 4 5 6 7 8 9; do
            local pos=$(( junk * (2 * k + 1) / 20 ))
            passkey_one "dca_$len" "$junk" "$pos" "$ovr" "${DCA[@]}"
            passkey_one "yarn4_$len" "$junk" "$pos" "$ovr" "${YARN[@]}"
            passkey_one "plain_$len" "$junk" "$pos" "$ovr"
        done
    done
    awk -F'\t' 'NR>1 {n[$1]++; e[$1]+=$6} END {for (k in n) printf "%s %d/%d exact\n", k, e[k], n[k]}' "$OUT/passkey.tsv" | sort
}

step_ppl() {
    # the baseline's text: the first bytes of llama.cpp's own src/*.cpp, upstream files only
    ls ~/llb/src/src/*.cpp | grep -v llama-dca | xargs cat > ~/llb/text-all.txt
    printf "name\tctx\tppl\trc\n" > "$OUT/ppl.tsv"
    for spec in "8k 8192 100000" "32k 32768 360000" "64k 65536 720000" "128k 131072 1400000"; do
        set -- $spec; local len=$1 ctx=$2 bytes=$3
        head -c "$bytes" ~/llb/text-all.txt > ~/llb/text-$len.txt
        for mode in plain yarn4 dca; do
            local extra=()
            [ $mode = dca ] && extra=("${DCA[@]}")
            [ $mode = yarn4 ] && extra=("${YARN[@]}")
            [ $mode = yarn4 ] && [ $ctx -le 32768 ] && continue
            local log="$OUT/ppl/$mode-$len.log"; mkdir -p "$OUT/ppl"
            "$BIN/llama-perplexity" "${COMMON[@]}" "${extra[@]}" -f ~/llb/text-$len.txt -c "$ctx" --chunks 1 > "$log" 2>&1
            local rc=$?
            local ppl; ppl=$(grep -oE "\[1\][0-9.]+" "$log" | tail -1 | sed 's/^\[1\]//')
            printf "%s_%s\t%s\t%s\trc=%s\n" "$mode" "$len" "$ctx" "$ppl" "$rc" | tee -a "$OUT/ppl.tsv"
        done
    done
}

for s in "$@"; do
    echo "== $s ($(date -u +%H:%M:%S))"
    "step_$s" || { echo "step $s failed"; exit 1; }
done
