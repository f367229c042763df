#!/usr/bin/env bash
# The long-context protocol on the GPU machine, through the device tool, in the repository root. Steps, in order:
#   pieces     copy the carried pieces (cleanroom/gpu/{gemma,smol}.NN, bench/longctx/pack.sh) to ~/model and join each
#              model once all its pieces are there (sha256 checked)
#   build_bg   unpack cleanroom/gpu/tree.tar.gz (the clean room, rendered) and texts.tar.gz, and build llama-server,
#              llama-perplexity and llama-batched-bench with CUDA (sm_90), detached; or, where the call carries
#              cleanroom/gpu/bin.tar.gz (bench/longctx/prebuild.sh, the same three built here without a GPU from the
#              same tree.tar.gz), take those when their stamp and a CUDA device check out (use_prebuilt): ~6 device
#              minutes saved. With the repository (~11 MB) bin.tar.gz (~49 MB) leaves no room for the tree and
#              texts, so it goes first, alone, with `pieces` (which keeps it in ~/llb), then build_bg as before
#   run_bg     the protocol's $STAGES (default "dev heldout ppl speed"), detached, once the build and both models are
#              there (below); results in ~/lc. The machine is handed back 30 s after a call ends, detached work with
#              it: keep calling `wait` back to back. Committed: dev (2026-12-05, dev-results/, its perplexities
#              completed 2026-12-06), heldout and heldout2 (2026-12-06, heldout-results/: both ceilings failed, see
#              sets.yaml), gemmappl and speed (2026-12-06), and devtext's 3x/4x/8x cells, so the next session runs
#              STAGES="heldout3 devtextrest devdefault" ran 2026-12-06 (heldout3 whole; devtextrest 14 trials at 6x, 1 at
#              1M: the machine was handed back between two calls and the second one started bare), so the next
#              session runs GEMMA_ONLY=1 STAGES="devlong devtextrest" (gemma-3's 5x dev cell, then its 6x and 1M held-out cells
#              with the choice that cell makes; the committed trials are skipped), then heldout4g (gemma-3 on Boost's C++);
#              all three ran 2026-12-06 (fourth round), so the next session runs GEMMA_ONLY=1
#              GEMMA_DEV="<the default below>,$GEMMA_POS" STAGES="devpos heldout4g" (the temperature by position on
#              gemma-3's dev cells; the dev rule then chooses among all seven, and heldout4g runs a new choice's cells);
#              with the SmolLM2 pieces carried too, STAGES="devpos heldout4" adds SmolLM2's heldout4 cells (4x, 8x);
#              2026-12-06 late (fifth round) ran STAGES="se heldout4 devpos" with GEMMA_SE=se:4096 SMOL_SE=se:1024 until
#              the device time ran out (se whole, heldout4 12 trials of SmolLM2's, devpos none), so the next session runs
#              GEMMA_DEV="<the default below>,$GEMMA_POS" STAGES="devpos heldout4" (the committed trials are skipped);
#              2026-12-07 got no machine (every start failed; the 30 minutes went to them) and wrote down heldout5 and
#              heldout6 (texts no run has read; heldout5's ceilings checked on the CPU), so the next session runs,
#              gemma-3 alone, GEMMA_ONLY=1 STAGES="devpos heldout5g heldout6g" (each held-out text's cells run only where its
#              ceiling holds on the GPU: heldout5's gemma-3 ceiling was 15/20 on the CPU), or with the SmolLM2
#              pieces carried STAGES="devpos+smolheldout4 heldout5 heldout6" (run.py choose never picks `auto`: a
#              setting that moves with -c and the slot count cannot be a default, item 2 of issue L);
#              2026-12-07 (sixth round, H200) ran those three (devpos kept 16384/2048; heldout5 judged; heldout6's
#              gemma-3 ceiling failed) and smolheldout4 and speed by hand, so the next session runs
#              GEMMA_ONLY=1 GEMMA_DEV=dca:16384:2048,dca:4096:512:pos DEV_SETS=dev,devfar,devfar2 STAGES="devfar heldout5g"
#              (gemma-3's 30x dev cell for the dev choice and 4096/512 pos, the choice over dev and devfar, then
#              heldout5's cells for a new choice; what is measured is skipped); on an H200 with the SmolLM2 pieces
#              carried too, the same without GEMMA_ONLY and with ROUNDS="1 2 3 4 5" STAGES="speed devfar heldout5g"
#              (two paired rounds could not settle DCA's prompt ratio at 32k)
#              2026-12-07 (seventh round) got no machine (every start failed) and wrote down --dca-yarn-factor chunk, so
#              the next session runs GEMMA_ONLY=1 GEMMA_DEV=dca:16384:2048,dca:16384:2048:pos,dca:4096:512:pos,
#              dca:4096:512,dca:8192:1024,dca:2048:256,dca:4096:512:chunk,dca:16384:2048:chunk GEMMA_FAR=best2
#              STAGES="devchunk devfar" (the chunk form on gemma-3's two dev cells and its dev perplexity, then devfar's
#              1M cell for the dev rule's pick over all eight and its runner-up; the choice is then made offline with
#              run.py choose --set dev,devfar,devfar2 over those two); 2026-12-07 late (eighth round), after a failed
#              start left too little device time for both stages, reordered before any run: GEMMA_ONLY=1
#              GEMMA_FAR=dca:16384:2048,dca:4096:512:pos STAGES="devfar devchunk" (the sixth round's 1M dev cell first,
#              since only it can move the choice: over the six measured candidates best2 would send two S=16384 forms,
#              the sizes that found 1 of 12 at 1M; the chunk form, 5/7 like pos on the CPU, after it as time allows);
#              it ran whole on an H100 (devfar2 at 1M: 16384/2048 1/10, 4096/512 pos 4/10; the dev choice stays), so the
#              next session first builds the prompt-length temperature written down in bench/RESULTS.md ("Eighth
#              round"), then runs its dev cells and devfar2's 1M cell beside the dev choice; 2026-12-07 (ninth round)
#              built it (--dca-yarn-factor len) and runs GEMMA_ONLY=1 STAGES=devlen; after three failed starts left
#              22 minutes, GEMMA_LEN=dca:4096:512:len alone (written down before the run, RESULTS.md "Ninth round");
#              it ran on an H200 with 581 s left (dev cells and perplexity whole, 1 trial of the 1M cell; the choice
#              stays), so the next session runs GEMMA_ONLY=1 GEMMA_LEN=dca:4096:512:len STAGES=devlen again (what is
#              measured is skipped: the 1M cell's other nine trials) and then dca:16384:2048:len; 2026-12-07 late
#              (tenth round, written down before the run) runs GEMMA_ONLY=1 GEMMA_LENFAR=dca:4096:512:len
#              GEMMA_LEN=dca:16384:2048:len GEMMA_DEV=dca:16384:2048,dca:4096:512:pos,dca:4096:512:len
#              DEV_SETS=dev,devfar,devfar2 STAGES="devlenfar heldout5g devlen" (the 1M dev cell of 4096/512 len; the
#              dev rule over the three candidates with all three dev cells, and heldout5's cells only if it moves;
#              then 16384/2048 len's dev cells, perplexity and 1M cell for a later choice); it ran in the next session
#              on an H100 (4096/512 len 4/10 at 1M: the choice stays; 16384/2048 len 29/40 on dev, 3/3 of its first
#              1M trials, cut there by the device time), so the next session (eleventh round, written down before the
#              run) runs GEMMA_ONLY=1 GEMMA_LENFAR=dca:16384:2048:len GEMMA_DEV=dca:16384:2048,dca:4096:512:pos,
#              dca:4096:512:len,dca:16384:2048:len DEV_SETS=dev,devfar,devfar2 STAGES="devlenfar heldout5g heldout4g"
#              (the 1M cell's seven trials not run; one found makes the rule pick 16384/2048 len, whose heldout5 and
#              heldout4 cells then run; none found keeps the choice and nothing else runs); it ran 2026-12-08 (H100,
#              prebuilt tools taken): 6/10, the rule picks 16384/2048 len, held-out cells run; the same session then
#              runs (twelfth round, written down before the run) GEMMA_ONLY=1 GEMMA_PPL_JOBS=4
#              GEMMA_PPL_METHODS=dca:16384:2048:len,dca:16384:2048,dca,yarn STAGES=gemmappl (held-out perplexity);
#              it did not run (a failed start left too little device time), so the next session runs it first, then
#              bench/longctx/calibrate_gpu.sh with CAL_ARGS="--far 1048576" (RESULTS.md, "Thirteenth round")
#   wait       at most $WAIT s (default 540) for run_bg; what it has so far comes back in $OUT either way
#
# The protocol (sets.yaml; choices written down before the run):
#   1. dev: passkey, gemma-3-270m at 81920 tokens (2.5x) and SmolLM2 at 24576 and 49152 (3x, 6x), 20 trials a cell,
#      for every candidate of $GEMMA_DEV / $SMOL_DEV; dev perplexity of every candidate (gemma at 65536, SmolLM2 at
#      24576 and 49152)
#   2. the choice per model: run.py choose (most dev answers; within 2 of the best, the lowest dev perplexity), over
#      this run's dev results and the committed ones (bench/longctx/dev-results)
#   3. held-out, with the chosen setting beside the uncalibrated default (`dca`: --dca on alone), YaRN and plain: passkey at every held-out length (gemma 98000, 196000,
#      1040000: 3 trials at 1M; SmolLM2 32500, 65000), each model's inside-window ceiling, perplexity of every candidate
#   4. speed: llama-batched-bench, SmolLM2 1 sequence at 32k and 64k, plain and the chosen DCA, 2 rounds alternating
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" ~/model ~/llb ~/lc
REPO=$(pwd)
BIN=~/llb/build/bin
GEMMA_SHA=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
SMOL_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
GEMMA_DEV=${GEMMA_DEV:-dca:2048:256,dca:4096:512,dca:8192:1024,dca:16384:2048,dca:4096:512:pos,dca:16384:2048:pos}
GEMMA_POS=${GEMMA_POS:-dca:4096:512:pos,dca:16384:2048:pos}   # --dca-yarn-factor pos (stage devpos)
GEMMA_FAR=${GEMMA_FAR:-dca:16384:2048,dca:4096:512:pos}   # devfar's 1M dev cell: the dev choice and its challenger
# (best2: the dev rule's pick over $GEMMA_DEV on the 2.5x and 5x dev cells and its runner-up, far_methods)
GEMMA_CHUNK=${GEMMA_CHUNK:-dca:4096:512:chunk,dca:16384:2048:chunk}   # --dca-yarn-factor chunk (stage devchunk)
GEMMA_LEN=${GEMMA_LEN:-dca:4096:512:len,dca:16384:2048:len}   # --dca-yarn-factor len (stage devlen; the 1M cell in this order)
GEMMA_LENFAR=${GEMMA_LENFAR:-dca:4096:512:len}   # stage devlenfar: devfar2's 1M cell alone, in this order
DEV_SETS=${DEV_SETS:-dev}   # the sets a choice reads (dev,devfar,devfar2 with stage devfar: GEMMA_DEV=$GEMMA_FAR then)
GEMMA_SE=${GEMMA_SE:-se:4096,se:2048}   # Self-Extend, the baseline row (stage se): W = L/8, L/16, G by longctx.se_group
SMOL_SE=${SMOL_SE:-se:1024,se:512}
SMOL_DEV=${SMOL_DEV:-dca:2048:256,dca:4096:512,dca:4096:1024,dca:6144:1024,dca:4096:1024:auto}
PACK=${PACK:-cleanroom/gpu}   # what the calls carry (pack.sh's pieces; prebuild.sh's bin.tar.gz)
source "$(dirname "${BASH_SOURCE[0]}")/cuda-build.sh"   # CUDA_BUILD_DEFINES, CUDA_BUILD_TARGETS, prebuilt_libs
# a prebuilt bin (prebuild.sh, step build_bg) finds its own libraries there and the toolkit's cuBLAS
PREBUILT_LIBS=$(prebuilt_libs "$BIN")
if [ -f ~/llb/prebuilt ]; then export LD_LIBRARY_PATH=$PREBUILT_LIBS; fi
RUN="python3 $REPO/bench/longctx/run.py"
COMMON=(--bin "$BIN" --models ~/model --texts ~/lc/texts --out ~/lc/out)

join_model() { # file sha prefix
    local file=~/model/$1 sha=$2 prefix=$3
    [ -f "$file" ] && { echo "$1: there"; return; }
    ls ~/model/"$prefix".* >/dev/null 2>&1 || { echo "$1: no pieces"; return; }
    cat $(ls ~/model/"$prefix".* | sort) > "$file.part"
    if echo "$sha  $file.part" | sha256sum -c - >/dev/null 2>&1; then mv "$file.part" "$file"; rm -f ~/model/"$prefix".*; echo "$1: joined"
    else rm -f "$file.part"; echo "$1: $(ls ~/model/"$prefix".* | wc -l) pieces so far"; fi
}

step_pieces() {
    cp "$PACK"/gemma.* "$PACK"/smol.* ~/model/ 2>/dev/null
    # prebuild.sh's bin.tar.gz (~49 MB) goes up in a call of its own; kept outside the work tree for build_bg
    if [ -f "$PACK/bin.tar.gz" ]; then cp "$PACK/bin.tar.gz" ~/llb/bin.tar.gz && echo "bin.tar.gz: kept for build_bg"; fi
    join_model gemma3-270m-q4_k_m.gguf $GEMMA_SHA gemma
    join_model smollm2-135m-instruct-q4_1.gguf $SMOL_SHA smol
}

use_prebuilt() { # $PACK/bin.tar.gz (bench/longctx/prebuild.sh: built without a GPU from the same tree.tar.gz, no device
    # minutes): used when its stamp names the carried tree.tar.gz and its llama-server lists a CUDA device here;
    # otherwise (return 1) build_bg builds on the device as before
    local pb=$PACK/bin.tar.gz want why=""
    [ -f "$pb" ] || pb=~/llb/bin.tar.gz   # carried by an earlier call (step pieces)
    [ -f "$pb" ] || return 1
    want=$(sha256sum "$PACK/tree.tar.gz" 2>/dev/null | cut -d' ' -f1)
    rm -rf ~/llb/build ~/llb/prebuilt && mkdir -p "$BIN"
    if ! tar xzf "$pb" -C "$BIN"; then why="it does not unpack"
    elif [ -z "$want" ] || [ "$(cat "$BIN/tree.sha256" 2>/dev/null)" != "$want" ]; then why="not built from the carried tree.tar.gz"
    elif ! LD_LIBRARY_PATH=$PREBUILT_LIBS "$BIN/llama-server" --list-devices > ~/llb/build.log 2>&1 ||
         ! grep -q "CUDA0" ~/llb/build.log; then why="its llama-server lists no CUDA device here"; tail -3 ~/llb/build.log
    fi
    if [ -n "$why" ]; then echo "prebuilt: $why; building here"; rm -rf ~/llb/build; return 1; fi
    touch ~/llb/prebuilt; echo 0 > ~/llb/build.rc
    echo "build: prebuilt (prebuild.sh):$(grep -m1 "CUDA0" ~/llb/build.log)"
}

step_build_bg() {
    if [ -f "$PACK"/texts.tar.gz ]; then mkdir -p ~/lc/texts && tar xzf "$PACK"/texts.tar.gz -C ~/lc/texts; fi
    # the sources, prebuilt or not: calibrate_gpu.sh takes its dev text from them
    rm -rf ~/llb/src && mkdir -p ~/llb/src && tar xzf "$PACK"/tree.tar.gz -C ~/llb/src || { echo "no tree"; return 1; }
    use_prebuilt && return 0
    setsid nohup bash -c "cmake -S ~/llb/src -B ~/llb/build -G Ninja ${CUDA_BUILD_DEFINES[*]} \
        > ~/llb/build.log 2>&1 && ninja -C ~/llb/build -j16 ${CUDA_BUILD_TARGETS[*]} \
        >> ~/llb/build.log 2>&1; echo \$? > ~/llb/build.rc" >/dev/null 2>&1 </dev/null &
    echo "build started"
}

speed() { # CHOSEN: SmolLM2's DCA setting (a run.py method); $ROUNDS rounds (default "1 2"), plain then DCA in each
    local smol=~/model/smollm2-135m-instruct-q4_1.gguf chosen=$1 r dca
    # no DCA arguments (an empty or unknown method: choose failed) would time plain twice and label one of them dca
    dca=$(python3 -c "import sys; sys.path.insert(0, '$REPO/bench/longctx'); import run; print(' '.join(run.method_args('$chosen', 65600, 8192)))") &&
        [[ " $dca " == *" --dca on "* ]] || { echo "speed: no DCA arguments for '$chosen'; nothing timed" >&2; return 1; }
    for r in ${ROUNDS:-1 2}; do
        for m in plain dca; do
            local extra=""; [ $m = dca ] && extra=$dca
            $BIN/llama-batched-bench -m $smol -c 65792 -b 2048 -ub 512 -npp 32768,65536 -ntg 128 -npl 1 -ngl 99 -fa on \
                $extra > ~/lc/out/speed-$m-r$r.log 2>&1
            grep -E '^\|[ ]+[0-9]' ~/lc/out/speed-$m-r$r.log | sed "s/^/$m r$r /" >> ~/lc/out/speed.txt
        done
    done
}

stage_dev() {
    $RUN passkey --set dev --model gemma-3-270m --methods $GEMMA_DEV --lengths 81920 --jobs 3 "${COMMON[@]}" &
    $RUN passkey --set dev --model smollm2-135m --methods $SMOL_DEV --jobs 2 "${COMMON[@]}" &
    wait
    $RUN ppl --set dev --model smollm2-135m --methods $SMOL_DEV --jobs 3 "${COMMON[@]}" &
    $RUN ppl --set dev --model gemma-3-270m --methods $GEMMA_DEV --chars 600000 --jobs 2 "${COMMON[@]}" &
    wait
}

stage_devlong() { # gemma-3's dev cell at 5x (163,840; sets.yaml), which no run had measured: its dev choice of 2026-12-06
    # (16384 / 2048) was made at 2.5x alone, where every candidate found 13-18/20, and held only at 3x (6x: 9/14)
    # the dev set's ceiling first (sets.yaml ceiling_min; its 2026-12-05 run measured none, so run.py refuses otherwise)
    $RUN passkey --set dev --model gemma-3-270m --methods plain --lengths inside "${COMMON[@]}"
    $RUN passkey --set dev --model gemma-3-270m --methods $GEMMA_DEV --lengths 163840 --jobs 3 "${COMMON[@]}"
}

stage_devpos() { # the temperature by position (--dca-yarn-factor pos) on gemma-3's two dev cells and its dev perplexity: the
    # 5x dev cell found 13/20 for 4096 / 512 with the former temperature (auto) against 7/20 without (fourth round)
    $RUN passkey --set dev --model gemma-3-270m --methods $GEMMA_POS --lengths 81920,163840 --jobs 2 "${COMMON[@]}"
    $RUN ppl --set dev --model gemma-3-270m --methods $GEMMA_POS --chars 600000 --jobs 2 "${COMMON[@]}"
}

stage_devchunk() { # the temperature from the chunk length on (--dca-yarn-factor chunk: 0.1 log2((p + 1) / c) + 1 past
    # c = S - w, where DCA's regimes begin) on gemma-3's two dev cells and its dev perplexity: the temperature by position
    # from L (pos) lost to the former rule (auto) on 6 paired dev trials of 6 that they split, each a needle the
    # temperature reaches with auto and not with pos (p < L, or past L where pos is cooler)
    $RUN passkey --set dev --model gemma-3-270m --methods $GEMMA_CHUNK --lengths 81920,163840 --jobs 3 "${COMMON[@]}"
    $RUN ppl --set dev --model gemma-3-270m --methods $GEMMA_CHUNK --chars 600000 --jobs 2 "${COMMON[@]}"
}

stage_devlen() { # the temperature from the prompt's length (--dca-yarn-factor len: every query of a prompt of n > L tokens
    # x 0.1 log2(n / L) + 1, as Qwen2.5-1M's DCA; llama-server gives each slot's prompt length, llama-perplexity the window)
    # on gemma-3's two dev cells and its dev perplexity (the dev rule's whole input over --set dev), then devfar2's 1M
    # cell (its ceiling first; one candidate after the other in $GEMMA_LEN's order, written down before the run:
    # 4096 / 512 first, the sizes of auto's dev 18/20 and held-out 3/3 at 1M, whose scale len equals on the bench to
    # within 0.1 log2(1.003)); run.py choose compares candidates on the trials all of them answered, so a 1M cell cut
    # short still counts for what it holds
    $RUN passkey --set dev --model gemma-3-270m --methods $GEMMA_LEN --lengths 81920,163840 --jobs 4 "${COMMON[@]}"
    $RUN ppl --set dev --model gemma-3-270m --methods $GEMMA_LEN --chars 600000 --jobs 2 "${COMMON[@]}"
    devfar2_one_by_one "$GEMMA_LEN"
}

stage_devlenfar() { # devfar2's 1M cell alone for $GEMMA_LENFAR (default: dca:4096:512:len, whose dev cells and dev
    # perplexity are committed and whose 1M cell holds 1 of 10 trials): the one cell that can still move the dev choice
    # among the measured candidates (tenth round, RESULTS.md), so it runs before any new candidate's dev cells
    devfar2_one_by_one "$GEMMA_LENFAR"
}

devfar2_one_by_one() { # METHODS (comma-separated): devfar2's ceiling, then its 1M cell (988,000) for each method alone, in order
    $RUN passkey --set devfar2 --model gemma-3-270m --methods plain --lengths inside "${COMMON[@]}"
    local m
    for m in ${1//,/ }; do
        $RUN passkey --set devfar2 --model gemma-3-270m --methods $m --lengths 988000 "${COMMON[@]}"
    done
}

far_methods() { # the candidates of devfar's cell: $GEMMA_FAR, or with GEMMA_FAR=best2 the dev rule's pick over $GEMMA_DEV
    # on the dev set alone (2.5x and 5x) and the pick over the rest (written down before the run: the 1M cell, ~1 minute a
    # trial, is run for two candidates, and the choice is then made between those two over all three dev cells)
    [ "$GEMMA_FAR" = best2 ] || { echo "$GEMMA_FAR"; return; }
    local a b rest
    a=$(DEV_SETS=dev choose gemma-3-270m "$GEMMA_DEV") || return 1
    rest=$(echo ",$GEMMA_DEV," | sed "s/,$a,/,/; s/^,//; s/,$//")
    b=$(DEV_SETS=dev choose gemma-3-270m "$rest") || return 1
    echo "$a,$b"
}

stage_devfar() { # gemma-3's dev cell at ~30x (sets.yaml devfar, 985,000 tokens, 10 trials) for $GEMMA_FAR: every 1M
    # answer so far is held-out, so no default has been chosen for the headline length. Each set's ceiling first; where
    # devfar's fails (its CPU ceiling did: at most 15/20), run.py refuses its cell (exit 2) and devfar2's runs instead
    local set len far
    far=$(far_methods) || { echo "devfar: no candidates (choose failed)" >&2; return 1; }
    echo "devfar: $far" >> ~/lc/out/choice.txt
    for set in devfar:985000 devfar2:988000; do
        len=${set#*:}; set=${set%:*}
        $RUN passkey --set $set --model gemma-3-270m --methods plain --lengths inside "${COMMON[@]}"
        $RUN passkey --set $set --model gemma-3-270m --methods $far --lengths $len --jobs 2 "${COMMON[@]}" && return
    done
}

stage_se() { # Self-Extend (--dca-self-extend, the issue's baseline row) on heldout4, beside the DCA, YaRN and plain rows there
    # (each model's ceiling first). Several candidates in GEMMA_SE / SMOL_SE: the window W chosen on the dev cells by the
    # rule of DCA's sizes first; one: that setting as given (G: the smallest that keeps every distance within L at the
    # cell's context, longctx.se_group)
    local G=$GEMMA_SE S=$SMOL_SE
    $RUN passkey --set heldout4 --model smollm2-135m --methods plain --lengths inside "${COMMON[@]}"
    if [[ $GEMMA_SE == *,* || $SMOL_SE == *,* ]]; then
        $RUN passkey --set dev --model smollm2-135m --methods plain --lengths inside "${COMMON[@]}"
        $RUN passkey --set dev --model gemma-3-270m --methods $GEMMA_SE --lengths 81920,163840 --jobs 3 "${COMMON[@]}" &
        $RUN passkey --set dev --model smollm2-135m --methods $SMOL_SE --jobs 2 "${COMMON[@]}" &
        wait
        G=$(choose gemma-3-270m $GEMMA_SE); S=$(choose smollm2-135m $SMOL_SE)
    fi
    echo "self-extend: gemma-3-270m $G, smollm2-135m $S" >> ~/lc/out/choice.txt
    $RUN passkey --set heldout4 --model gemma-3-270m --methods $G --lengths 98500,192500 --jobs 3 "${COMMON[@]}" &
    $RUN passkey --set heldout4 --model smollm2-135m --methods $S --lengths 32800,65200 --jobs 2 "${COMMON[@]}" &
    wait
}

stage_devdefault() { # the automatic sizes (L/2, L/8 = 16384/4096) on gemma's dev set, never measured there: with them the
    # dev rule can say whether the default's w should be L/16 (gemma's dev choice) on dev numbers, not held-out ones
    $RUN passkey --set dev --model gemma-3-270m --methods plain --lengths inside "${COMMON[@]}"
    $RUN passkey --set dev --model gemma-3-270m --methods dca:16384:4096 --lengths 81920 "${COMMON[@]}"
    $RUN ppl --set dev --model gemma-3-270m --methods dca:16384:4096 --chars 600000 "${COMMON[@]}"
}

stage_devppl() { # gemma's dev perplexities, which the 2026-12-05 dev stage lost (host memory) for 4 of its 5 candidates
    $RUN ppl --set dev --model gemma-3-270m --methods dca:2048:256,dca:4096:512,dca:8192:1024,dca:4096:512:auto --chars 600000 \
        --jobs 2 "${COMMON[@]}"
}

choose() { # model methods: the dev choice over this run's results and the committed ones (bench/longctx/dev-results)
    $RUN choose --set "$DEV_SETS" --model "$1" --methods "$2" ~/lc/out "$REPO/bench/longctx/dev-results" 2>>~/lc/out/choice.txt
}

heldout_passkey() { # SET G3 G6 G1M S4 S8: each model's ceiling first (run.py stops a model whose ceiling fails), then
    # the dev choice beside the uncalibrated default (dca), YaRN and plain (10 trials: it has answered 0 at every
    # extension length so far); gemma-3 first (the issue's headline cells), its 1M cell beside the others, SmolLM2 last
    local set=$1 G
    G=$(choose gemma-3-270m $GEMMA_DEV); echo "gemma-3-270m: $G" >> ~/lc/out/choice.txt
    $RUN passkey --set $set --model gemma-3-270m --methods plain --lengths inside "${COMMON[@]}"
    $RUN passkey --set $set --model gemma-3-270m --methods $G --lengths $4 "${COMMON[@]}" > ~/lc/out/$set-1m.log 2>&1 &
    local one_m=$!
    $RUN passkey --set $set --model gemma-3-270m --methods $G,dca,yarn --lengths $2 --jobs 3 "${COMMON[@]}"
    $RUN passkey --set $set --model gemma-3-270m --methods $G,dca,yarn --lengths $3 --jobs 3 "${COMMON[@]}"
    heldout_smol $set $5 $6
    $RUN passkey --set $set --model gemma-3-270m --methods plain --lengths $2 --trials 10 "${COMMON[@]}"
    wait $one_m
}

heldout_smol() { # SET S4 S8: one set's SmolLM2 cells: its ceiling, then its dev choice beside --dca on alone and YaRN,
    # and plain (10 trials); they wait on no gemma-3 choice, so they can run beside gemma's dev stages
    local set=$1 S; S=$(choose smollm2-135m $SMOL_DEV); echo "smollm2-135m: $S" >> ~/lc/out/choice.txt
    $RUN passkey --set $set --model smollm2-135m --methods plain --lengths inside "${COMMON[@]}"
    $RUN passkey --set $set --model smollm2-135m --methods $S,dca,yarn --lengths $2,$3 --jobs 3 "${COMMON[@]}"
    $RUN passkey --set $set --model smollm2-135m --methods plain --lengths $2,$3 --trials 10 --jobs 2 "${COMMON[@]}"
}

stage_heldout() { heldout_passkey heldout 98000 196000 1040000 32500 65000; }

stage_heldout2() { heldout_passkey heldout2 100000 190000 1048000 33000 66000; } # the needle-free held-out text (sets.yaml)

stage_heldout3() { heldout_passkey heldout3 97000 195000 1046000 32000 64500; } # code other than llama.cpp's (sets.yaml)

stage_devtext() { heldout_passkey devtext-heldout 99000 188000 1044000 33500 65500; } # dev text, new seed/keys/depths/lengths

stage_devtextrest() { # devtext's cells that 2026-12-06 did not reach: gemma-3 at 6x and 1M (its 3x and SmolLM2's are in
    # heldout-results/); run.py skips the trials already in ~/lc/out, so after heldout3 this adds only these
    local G; G=$(choose gemma-3-270m $GEMMA_DEV)
    $RUN passkey --set devtext-heldout --model gemma-3-270m --methods plain --lengths inside "${COMMON[@]}"
    $RUN passkey --set devtext-heldout --model gemma-3-270m --methods $G --lengths 1044000 "${COMMON[@]}" \
        > ~/lc/out/devtext-heldout-1m.log 2>&1 &
    local one_m=$!
    $RUN passkey --set devtext-heldout --model gemma-3-270m --methods $G,dca,yarn --lengths 188000 --jobs 3 "${COMMON[@]}"
    wait $one_m
}

stage_heldout4() { heldout_passkey heldout4 98500 192500 1042000 32800 65200; } # both models (SmolLM2's CPU ceiling: 20/20)

stage_smolheldout4() { heldout_smol heldout4 32800 65200; } # SmolLM2's heldout4 cells alone (STAGES="devpos+smolheldout4 ...")

stage_heldout5() { heldout_passkey heldout5 97500 193500 1038000 33200 65800; } # NVIDIA CCCL's C++ (sets.yaml), both models

heldout_gemma() { # SET G3 G6 G1M: one set's cells for gemma-3 alone: its ceiling first (run.py runs no other cell of a
    # set whose ceiling fails), then the dev choice beside --dca on alone and YaRN at ~3x and ~6x, and the dev choice's
    # 3 trials at 1M beside them; SmolLM2's cells wait for a run that carries its pieces
    local set=$1 G; G=$(choose gemma-3-270m $GEMMA_DEV); echo "gemma-3-270m: $G" >> ~/lc/out/choice.txt
    $RUN passkey --set $set --model gemma-3-270m --methods plain --lengths inside "${COMMON[@]}"
    $RUN passkey --set $set --model gemma-3-270m --methods $G --lengths $4 "${COMMON[@]}" > ~/lc/out/$set-1m.log 2>&1 &
    local one_m=$!
    $RUN passkey --set $set --model gemma-3-270m --methods $G,dca,yarn --lengths $2,$3 --jobs 3 "${COMMON[@]}"
    wait $one_m
}

stage_heldout4g() { heldout_gemma heldout4 98500 192500 1042000; } # heldout4 (Boost's C++ headers) for gemma-3 alone

stage_heldout5g() { heldout_gemma heldout5 97500 193500 1038000; } # heldout5 (NVIDIA CCCL's C++) for gemma-3 alone

stage_heldout6g() { heldout_gemma heldout6 99500 197000 1050000; } # heldout6 (Apache Arrow's C++) for gemma-3 alone

stage_heldout6() { heldout_passkey heldout6 99500 197000 1050000 33800 64800; } # both models

# gemma's held-out perplexity: two windows of 98304 tokens need ~791k characters of the prose (600k gave 149k tokens:
# llama-perplexity refused, 2026-12-06)
GEMMA_PPL_CHARS=850000

stage_gemmappl() { # GEMMA_PPL_METHODS (default: the dev choice, dca, yarn) and GEMMA_PPL_JOBS (default 2) to override
    $RUN ppl --set heldout --model gemma-3-270m --methods "${GEMMA_PPL_METHODS:-$(choose gemma-3-270m $GEMMA_DEV),dca,yarn}" \
        --chars $GEMMA_PPL_CHARS --jobs "${GEMMA_PPL_JOBS:-2}" "${COMMON[@]}"
}

stage_ppl() {
    $RUN ppl --set heldout --model smollm2-135m --methods $SMOL_DEV,dca,yarn,plain --jobs 3 "${COMMON[@]}"
    stage_gemmappl
}

stage_speed() { speed "$(choose smollm2-135m $SMOL_DEV)"; }

pipeline() { # $STAGES (default: dev heldout ppl speed), each once the build and both models are there (only gemma-3
    # with GEMMA_ONLY=1, for stages that run no SmolLM2 cell: devlong, devpos, devtextrest, devdefault, heldout4g,
    # heldout5g, heldout6g; saves three carries)
    local t0=$SECONDS st smol=~/model/smollm2-135m-instruct-q4_1.gguf
    [ "${GEMMA_ONLY:-0}" = 1 ] && smol=~/model/gemma3-270m-q4_k_m.gguf
    until [ -f ~/llb/build.rc ] && [ -f ~/model/gemma3-270m-q4_k_m.gguf ] && [ -f $smol ]; do
        sleep 5; [ $((SECONDS - t0)) -gt 1500 ] && { echo "gave up waiting for build/models"; return 1; }
    done
    [ "$(cat ~/llb/build.rc)" = 0 ] || { echo "build failed"; tail -30 ~/llb/build.log; return 1; }
    mkdir -p ~/lc/out
    # the committed held-out trials, so that run.py skips what is measured (a trial is its set, model, length, method
    # and index; its key and depth come from the set's seed) and a cell cut short goes on where it stopped
    # (dev's too: run.py reads a set's ceiling from there)
    [ -f ~/lc/out/passkey.jsonl ] || cat "$REPO/bench/longctx/heldout-results/passkey.jsonl" \
        "$REPO/bench/longctx/dev-results/passkey.jsonl" > ~/lc/out/passkey.jsonl
    # a stage written a+b runs a and b side by side (on one GPU: cells that do not wait on each other's choice)
    for st in ${STAGES:-dev heldout ppl speed}; do
        echo "== $st $(date +%T)"
        local part; for part in ${st//+/ }; do "stage_$part" & done; wait
    done
    echo "== done $(date +%T)"
}

step_run_bg() {
    setsid nohup bash -c "cd $REPO && STAGES='${STAGES:-dev heldout ppl speed}' && GEMMA_ONLY='${GEMMA_ONLY:-0}' && source bench/longctx/gpu.sh && pipeline > ~/lc/pipeline.log 2>&1; touch ~/lc/pipeline.done" \
        >/dev/null 2>&1 </dev/null &
    echo "pipeline started"
}

collect() {
    cp ~/lc/out/*.jsonl ~/lc/out/choice.txt ~/lc/out/speed.txt "$OUT"/ 2>/dev/null
    cp ~/lc/pipeline.log "$OUT"/ 2>/dev/null
    [ -f ~/lc/out/passkey.jsonl ] && python3 bench/longctx/run.py report ~/lc/out --md "$OUT/report.md" >/dev/null
    (cd ~/lc/out && tar czf "$OUT/logs.tar.gz" logs *-1m.log speed-*.log 2>/dev/null)
}

step_wait() {
    local t0=$SECONDS limit=${WAIT:-540}
    while [ ! -f ~/lc/pipeline.done ] && [ $((SECONDS - t0)) -lt "$limit" ]; do sleep 10; done
    collect
    [ -f ~/llb/build.rc ] || { echo "build: running"; tail -2 ~/llb/build.log; }
    tail -25 ~/lc/pipeline.log 2>/dev/null
    [ -f ~/lc/pipeline.done ] && echo "PIPELINE DONE" || echo "pipeline still running"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    for s in "$@"; do "step_$s" || exit $?; done
fi
