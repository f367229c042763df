#!/usr/bin/env bash
# `dcaforge calibrate` on the GPU machine, through the device tool, in the repository root, once gpu.sh's build_bg has
# built llama-server and llama-perplexity in ~/llb/build/bin and the model is in ~/model. The machine's python3 has
# everything dcaforge needs but gguf-py: carry its wheel as .whl/gguf-0.19.0-py3-none-any.whl (pure Python; here:
# mkdir -p .whl && cp /opt/pypi/files/gguf-0.19.0-py3-none-any.whl .whl/ && echo /.whl/ >> .git/info/exclude).
# A calibration takes longer than one command may run (10 min), so it runs detached; steps, in order:
#   start   install gguf into /tmp/site, write the dev text (the llama.cpp sources in ~/llb/src), start calibrate
#           detached: ~/cal/<name>.dca.gguf, its work folder ~/cal/<name>.dca.calibrate, the log ~/cal/calibrate.log
#   wait    at most $WAIT s (default 540) for it; what it has so far comes back in $OUT either way (report.json,
#           trials.jsonl, sweep.png, the log and the servers' logs; not the copy itself)
#   check   --dca on alone with the copy at 96k tokens: llama-server's log must take "the model's own" sizes
# Settings: MODEL (default ~/model/gemma3-270m-q4_k_m.gguf), CAL_ARGS (more calibrate options, e.g. --dev-trials 8),
# BIN (~/llb/build/bin), SRC (the llama.cpp tree of the dev text, ~/llb/src), RESUME_FROM (a folder carried in with
# an earlier machine's run.json, trials.jsonl and ppl.jsonl, which `wait` brings back: start copies them into the
# work folder and passes --resume, so a calibration cut off with its machine goes on where it stopped).
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" ~/cal
REPO=$(pwd)
BIN=${BIN:-~/llb/build/bin}
SRC=${SRC:-~/llb/src}
MODEL=${MODEL:-~/model/gemma3-270m-q4_k_m.gguf}
NAME=$(basename "$MODEL" .gguf)
export PYTHONPATH=/tmp/site:$REPO PYTHONUNBUFFERED=1
source "$(dirname "${BASH_SOURCE[0]}")/cuda-build.sh"   # prebuilt_libs: the prebuilt tools' library path, as gpu.sh's
if [ -f ~/llb/prebuilt ]; then export LD_LIBRARY_PATH=$(prebuilt_libs "$BIN"); fi

step_start() {
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "no gguf wheel in .whl/"; return 1; }
    [ -x $BIN/llama-server ] || { echo "no $BIN/llama-server: run gpu.sh build_bg first"; return 1; }
    [ -f "$MODEL" ] || { echo "no $MODEL: run gpu.sh pieces first"; return 1; }
    python3 -c "import sys; from pathlib import Path; from dcaforge.gate import longctx
Path(sys.argv[2]).write_text(longctx.dev_text(Path(sys.argv[1])), encoding='utf-8')" "$SRC" ~/cal/dev.txt || return 1
    rm -f ~/cal/calibrate.done
    local resume=""
    if [ -n "${RESUME_FROM:-}" ]; then
        [ -f "$RESUME_FROM/run.json" ] || { echo "no run.json in $RESUME_FROM"; return 1; }
        mkdir -p ~/cal/$NAME.dca.calibrate && cp "$RESUME_FROM"/run.json "$RESUME_FROM"/trials.jsonl ~/cal/$NAME.dca.calibrate/ \
            && { cp "$RESUME_FROM"/ppl.jsonl ~/cal/$NAME.dca.calibrate/ 2>/dev/null; resume=--resume; }
    fi
    setsid nohup bash -c "cd $REPO && python3 -c 'from dcaforge.cli import main; main()' calibrate '$MODEL' \
        -o ~/cal/$NAME.dca.gguf --force --server $BIN/llama-server --dev-text ~/cal/dev.txt ${CAL_ARGS:-} $resume \
        > ~/cal/report.txt 2> ~/cal/calibrate.log; echo \$? > ~/cal/calibrate.done" >/dev/null 2>&1 </dev/null &
    echo "calibrate started: ~/cal/calibrate.log"
}

step_wait() {
    local t0=$SECONDS limit=${WAIT:-540}
    while [ ! -f ~/cal/calibrate.done ] && [ $((SECONDS - t0)) -lt "$limit" ]; do sleep 10; done
    local work=~/cal/$NAME.dca.calibrate
    cp ~/cal/report.txt ~/cal/calibrate.log "$OUT"/ 2>/dev/null
    cp "$work"/report.json "$work"/trials.jsonl "$work"/ppl.jsonl "$work"/run.json "$work"/sweep.png "$OUT"/ 2>/dev/null
    (cd "$work" 2>/dev/null && tar czf "$OUT/logs.tar.gz" logs)
    tail -5 ~/cal/calibrate.log
    cat ~/cal/report.txt 2>/dev/null
    if [ -f ~/cal/calibrate.done ]; then echo "CALIBRATE DONE: exit $(cat ~/cal/calibrate.done)"; else echo "calibrate still running"; fi
}

step_check() {
    local copy=~/cal/$NAME.dca.gguf
    [ -f "$copy" ] || { echo "no $copy"; return 1; }
    timeout 300 $BIN/llama-server -m "$copy" -c ${CHECK_CTX:-98304} -np 1 -ngl 99 -fa on --no-webui --port 18080 -lv 4 --dca on \
        > ~/cal/check.log 2>&1 &
    local pid=$!
    for _ in $(seq 120); do grep -q "llama_dca_resolve: DCA on" ~/cal/check.log && break; sleep 1; done
    kill $pid 2>/dev/null; wait $pid 2>/dev/null
    grep "llama_dca_resolve" ~/cal/check.log | tee "$OUT/check.txt"
    grep -q "the model's own" ~/cal/check.log && echo "CHECK OK: --dca on alone takes the GGUF's sizes"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    for s in "$@"; do "step_$s" || exit $?; done
fi
