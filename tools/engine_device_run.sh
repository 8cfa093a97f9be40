#!/usr/bin/env bash
# One device call for the engine (tensor parallelism, CUDA graphs, device sampling, dummy
# weights on the device, the trained fixture's CUDA gate): run on the GPU host from the repository
# root with the bundle (tools/gpu-bundle; `.gpu`, or the folder DELTAKIT_BUNDLE_DIR names) carried.
# Logs go to $OUT (one or two files per step, plus gpu.txt); a summary prints last.
#
#   tools/engine_device_run.sh [tests] [bench] [memcheck] [breakdown] [ab] [tunelog] [tunemodes]
#                              [gemmab] [proc1] [ncustep] [ncugraph]
#                                                          (default: tests bench memcheck)
#
#   tests     graph_cuda (graph == eager, join/leave, padding, device sampler), golden_cuda (HF
#             fixtures incl. tiny-trained, TP=1 through the executor + NCCL), init_dummy and the
#             engine's dummy_init::device_equals_host
#   bench     `deltakit bench` (dummy weights, prompt 512, 64 new tokens): 9B / 27B, batch 1 / 16
#             / 64, graphs vs --no-graphs, 27B through the executor (--devices 0, NCCL TP=1); graph
#             runs with DELTAKIT_REPLAY_TIMING=1 (GPU time per replay; the host turnaround is the bench's wall ms/step minus it)
#   memcheck  compute-sanitizer memcheck over graph_cuda's padded-rows test (graph replay)
#   breakdown `deltakit bench --breakdown` at 9B b1 / b16 and 27B b1 (per-op-family GPU time)
#   ab        skinny-GEMM autotune A/B: the default tuner (16 candidates + split-K + legacy,
#             each launch timed alone over a rotation of weight copies) vs DELTAKIT_GEMM_TUNE=hot
#             with 8 candidates (back-to-back launches of the real weights), 9B b1 / b16 and 27B
#             b1, graphs
#   tunelog   the skinny-GEMM tuning log (DELTAKIT_GEMM_TUNE_LOG=1) of a 9B b1 run: best candidate per
#             M = 1 shape
#   tunemodes skinny-GEMM tuning modes A/B (DELTAKIT_GEMM_TUNE=single, the default, vs stream):
#             9B / 27B b1 / b16 / b64 with graphs, the tuner's choice per shape logged
#             (DELTAKIT_GEMM_TUNE_LOG=1) into tunemodes.log / tunemodes.best
#   gemmab    decode step (graphs) with the default tuner vs DELTAKIT_GEMM_LEGACY=0 vs cuBLASLt's
#             first heuristic choice only: 9B b1 / b16 / b64, 27B b64
#   proc1     one process per rank on the one GPU (--nproc-per-node 1: TCP rendezvous, NCCL id
#             handed over, the scheduler's batch broadcast): greedy tokens + log-probabilities of
#             the tiny-trained fixture vs the in-process engine, and 9B b16 decode vs in-process
#   ncustep   ncu over ONE whole graph replay (--graph-profiling graph) of the decode step at
#             $NCUSTEP_RUNS ("model,batch;..."; default 9b,1): GPU time, DRAM bytes read / written, L2
#             hit rate of the whole step (does the step read its floor's bytes, and only those?)
#   ncugraph  ncu on ONE graph replay of the 9B b1 decode step (DELTAKIT_NCU_REPLAY, every kernel
#             node profiled alone, caches flushed before each: duration + DRAM bytes per kernel),
#             summarised per kernel family by tools/ncu_step_table.py
set -uo pipefail
out="${OUT:-/tmp/engine-run}"
mkdir -p "$out"
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(tests bench memcheck)
summary=()
t_start=$(date +%s)
B="${DELTAKIT_BUNDLE_DIR:-.gpu}"

tests() {
  local f="$out/tests.log"
  : >"$f"
  local list=("graph_cuda -- --test-threads=1 --nocapture" "golden_cuda -- --nocapture" "norm_rms" "gemm_linear" "elementwise"
              "sample" "attn -- prep" "init_dummy -- --nocapture" "deltakit_engine -- dummy_init")
  # ENGINE_TESTS="a;b -- filter" runs only those (same syntax as the list above).
  [ -n "${ENGINE_TESTS:-}" ] && IFS=';' read -ra list <<<"$ENGINE_TESTS"
  for t in "${list[@]}"; do
    local t0; t0=$(date +%s)
    # shellcheck disable=SC2086
    timeout 240 "$B/run" $t >>"$f" 2>&1
    local rc=$?
    summary+=("test ${t%% *}: rc $rc, $(( $(date +%s) - t0 ))s, $(grep -E '^[0-9]+ passed, [0-9]+ failed' "$f" | tail -n 1)")
  done
}

bench() {
  local f="$out/bench.log"
  : >"$f"
  local runs=(
    "9b 1 graphs" "9b 1 --no-graphs" "9b 16 graphs" "9b 16 --no-graphs" "9b 64 graphs"
    "27b 1 graphs" "27b 1 --no-graphs" "27b 16 graphs" "27b 64 graphs" "27b 1 executor"
  )
  for r in "${runs[@]}"; do
    # shellcheck disable=SC2086
    set -- $r
    local model=$1 batch=$2 mode=$3 extra=()
    [ "$mode" = "--no-graphs" ] && extra=(--no-graphs)
    [ "$mode" = "executor" ] && extra=(--devices 0)
    echo "=== $r" >>"$f"
    local t0; t0=$(date +%s)
    DELTAKIT_REPLAY_TIMING=1 timeout 150 "$B/run" --cli bench --device cuda:0 --config "tests/configs/qwen3.5-$model" \
      --load-format dummy --batch "$batch" --prompt-len 512 --gen-len 64 "${extra[@]}" >>"$f" 2>&1
    local rc=$?
    local line; line=$(grep -E '^prefill' "$f" | tail -n 1)
    [ "$mode" = graphs ] && line="$line | $(grep -E '^replay timing' "$f" | tail -n 1)"
    local head; head=$(grep -E '^bench' "$f" | tail -n 1 | grep -Eo 'device [^|]*\| |load [0-9.]+s')
    summary+=("bench $r: rc $rc, $(( $(date +%s) - t0 ))s | ${head//$'\n'/ } | $line")
    if [ "$mode" = executor ]; then
      while IFS= read -r l; do summary+=("  $l"); done < <(grep -E '^rank|^process' "$f" | tail -n 2)
    fi
  done
}

breakdown() {
  local f="$out/breakdown.log"
  : >"$f"
  for r in "9b 1" "9b 16" "27b 1"; do
    # shellcheck disable=SC2086
    set -- $r
    echo "=== $r" >>"$f"
    timeout 150 "$B/run" --cli bench --device cuda:0 --config "tests/configs/qwen3.5-$1" \
      --load-format dummy --batch "$2" --prompt-len 512 --gen-len 64 --breakdown >>"$f" 2>&1
    summary+=("breakdown $r: rc $?")
  done
}

memcheck() {
  local f="$out/memcheck.log"
  timeout 200 "$B/run" --wrap "compute-sanitizer --tool memcheck --error-exitcode 9" graph_cuda \
    -- padded_rows --test-threads=1 >"$f" 2>&1
  summary+=("memcheck graph_cuda padded_rows: rc $?, $(grep -hE 'ERROR SUMMARY' "$f" | tail -n 1) | $(tail -n 1 "$f")")
}

# One `deltakit bench` decode run appended to log $1 under label $2 (model $3, batch $4), with the
# environment assignments that follow (e.g. DELTAKIT_GEMM_LEGACY=0), then after `--` extra CLI
# arguments; adds a summary line.
bench_env() {
  local f=$1 label=$2 model=$3 batch=$4 envs=() args=()
  shift 4
  while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
  [ $# -gt 0 ] && shift && args=("$@")
  echo "=== $label" >>"$f"
  env "${envs[@]}" timeout 150 "$B/run" --cli bench --device cuda:0 --config "tests/configs/qwen3.5-$model" \
    --load-format dummy --batch "$batch" --prompt-len 512 --gen-len 64 "${args[@]}" >>"$f" 2>&1
  summary+=("$label: rc $? | $(grep -E '^prefill' "$f" | tail -n 1)")
}

ab() {
  local f="$out/ab.log" r
  : >"$f"
  for r in "9b 1" "9b 16" "27b 1"; do
    # shellcheck disable=SC2086
    set -- $r
    bench_env "$f" "ab $r tune=cold" "$1" "$2"
    bench_env "$f" "ab $r tune=hot" "$1" "$2" DELTAKIT_GEMM_TUNE=hot DELTAKIT_GEMM_TUNE_CANDIDATES=8
  done
}

tunelog() {
  local f="$out/tunelog.log"
  DELTAKIT_GEMM_TUNE_LOG=1 timeout 150 "$B/run" --cli bench --device cuda:0 --config tests/configs/qwen3.5-9b \
    --load-format dummy --batch 1 --prompt-len 64 --gen-len 16 >"$f" 2>&1
  summary+=("tunelog 9b b1: rc $?")
  # The fastest candidate per M = 1 shape (and how many were timed).
  awk '/^gemm tune M=1 /{key=$3" "$4" "$5; t=$(NF-1)+0; n[key]++; if (!(key in best) || t < best[key]) {best[key]=t; line[key]=$0}}
       END {for (k in best) print "  best of " n[k] ": " line[k]}' "$f" | sort >>"$out/tunelog.best"
}

tunemodes() {
  local f="$out/tunemodes.log" r mode
  : >"$f"
  for r in "9b 1" "9b 16" "9b 64" "27b 1" "27b 16" "27b 64"; do
    # shellcheck disable=SC2086
    set -- $r
    for mode in single stream; do
      bench_env "$f" "tunemodes $r $mode" "$1" "$2" DELTAKIT_GEMM_TUNE=$mode DELTAKIT_GEMM_TUNE_LOG=1
    done
  done
  # The chosen algorithm per (run, shape): "=== run" headers and "gemm tuned" lines only.
  grep -E '^===|^gemm tuned' "$f" >"$out/tunemodes.best"
}

# The decode step under GEMM-candidate variants (graphs): the default tuner, the legacy cuBLAS
# candidate left out, and cuBLASLt's first heuristic choice only (no tuning).
gemmab() {
  local f="$out/gemmab.log" r
  : >"$f"
  for r in "9b 1" "9b 16" "9b 64" "27b 64"; do
    # shellcheck disable=SC2086
    set -- $r
    bench_env "$f" "gemmab $r default" "$1" "$2"
    bench_env "$f" "gemmab $r nolegacy" "$1" "$2" DELTAKIT_GEMM_LEGACY=0
    bench_env "$f" "gemmab $r heuronly" "$1" "$2" DELTAKIT_GEMM_TUNE_CANDIDATES=1
  done
}

proc1() {
  local f="$out/proc1.log" mode
  : >"$f"
  for mode in inproc proc1; do
    local extra=()
    [ "$mode" = proc1 ] && extra=(--nproc-per-node 1)
    timeout 120 "$B/run" --cli generate --device cuda:0 --model tests/fixtures/tiny-trained --token-ids 1,2,3 \
      --json --logprobs 5 --max-tokens 32 "${extra[@]}" >"/tmp/proc1-$mode.jsonl" 2>>"$f"
    summary+=("proc1 generate $mode: rc $?")
  done
  summary+=("proc1 compare: $(python3 tools/compare_jsonl.py /tmp/proc1-inproc.jsonl /tmp/proc1-proc1.jsonl)")
  bench_env "$f" "proc1 bench 9b 16 inproc" 9b 16
  bench_env "$f" "proc1 bench 9b 16 --nproc-per-node 1" 9b 16 -- --nproc-per-node 1
}

ncustep() {
  local f="$out/ncustep.log" r model batch
  : >"$f"
  IFS=';' read -ra rs <<<"${NCUSTEP_RUNS:-9b,1}"
  for r in "${rs[@]}"; do
    IFS=',' read -r model batch <<<"$r"
    echo "=== $r" >>"$f"
    DELTAKIT_NCU_REPLAY=40 timeout 200 ncu --clock-control none --profile-from-start off --graph-profiling graph \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct \
      "$B/run" --cli bench --device cuda:0 --config "tests/configs/qwen3.5-$model" --load-format dummy \
      --batch "$batch" --prompt-len 64 --gen-len 48 >>"$f" 2>&1
    summary+=("ncustep $r: rc $? | $(grep -E '(gpu__time_duration|dram__bytes_read|dram__bytes_write).sum|lts__t_sector_hit_rate.pct' "$f" | tail -n 4 | awk '{print $1, $(NF-1), $NF}' | tr '\n' ' ')")
  done
}

ncugraph() {
  local f="$out/ncugraph.log"
  DELTAKIT_NCU_REPLAY=40 timeout 400 ncu --clock-control none --profile-from-start off \
    --graph-profiling node --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
    --csv --page raw --log-file "$out/ncugraph.csv" "$B/run" --cli bench --device cuda:0 \
    --config tests/configs/qwen3.5-9b --load-format dummy --batch 1 --prompt-len 64 --gen-len 48 >"$f" 2>&1
  summary+=("ncugraph 9b b1: rc $? | $(grep -E '^prefill' "$f" | tail -n 1)")
  python3 tools/ncu_step_table.py "$out/ncugraph.csv" >>"$f" 2>&1
}

for s in "${steps[@]}"; do
  case "$s" in
    tests) tests ;;
    bench) bench ;;
    memcheck) memcheck ;;
    breakdown) breakdown ;;
    ab) ab ;;
    ncugraph) ncugraph ;;
    tunelog) tunelog ;;
    tunemodes) tunemodes ;;
    gemmab) gemmab ;;
    ncustep) ncustep ;;
    proc1) proc1 ;;
    *) echo "unknown step $s" >&2; exit 2 ;;
  esac
done
nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv,noheader >"$out/gpu.txt" 2>&1
echo "==== engine device run ($(( $(date +%s) - t_start ))s; logs in $out)"
printf '%s\n' "${summary[@]}"
[ -f "$out/breakdown.log" ] && grep -E "^===|^breakdown|^  " "$out/breakdown.log"
[ -f "$out/tunelog.best" ] && cat "$out/tunelog.best"
[ -f "$out/tunemodes.best" ] && grep -E '^===|M=1 ' "$out/tunemodes.best" | head -n 60
[ -f "$out/ncugraph.log" ] && grep -A60 "^ncu step table" "$out/ncugraph.log"
