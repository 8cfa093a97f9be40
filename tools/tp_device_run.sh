#!/usr/bin/env bash
# One device call for issue 16 (tensor parallelism on 2 / 4 / 8 GPUs, one process per rank):
# run on a multi-GPU host (nvidia-h200-x2 / x4 / x8) from the repository root with the bundle
# (tools/gpu-bundle with at least the golden_cuda test and the CLI; `.gpu`, or the folder
# DELTAKIT_BUNDLE_DIR names) carried. Logs go to $OUT (<= 6 files); a summary prints last.
# Leaves NCCL's multicast switches (NCCL_NVLS_ENABLE=0) as the host sets them.
#
#   tools/tp_device_run.sh [tests] [gen] [tp27b] [bench] [fault]      (default: all five)
#
#   tests  golden_cuda's cuda_tp_multi_gpu (every HF fixture at TP = 2 / 4 / 8 as the GPU count
#          allows, graphs on and off, HF f32 gate; refusals where the head counts do not divide),
#          with DELTAKIT_REQUIRE_GPUS = the GPU count (a skip is a failure here)
#   gen    tiny-trained greedy generation with log-probabilities: in-process --tp N vs one process
#          per GPU (--nproc-per-node N): same tokens, |d logprob| (N = 2, and 4 where available)
#   tp27b  Qwen3.5-27B config, dummy weights, short prompt: greedy tokens at TP = 2 (and 4 / 8) vs
#          TP = 1
#   bench  27B decode at concurrency 1 / 16 / 64, TP = 2 (and 4 / 8): graphs vs --no-graphs,
#          in-process vs one process per GPU; per-rank weight / state memory from the bench lines
#   fault  one process per GPU (RANK / WORLD_SIZE env, 2 ranks, --step-timeout 30): kill rank 1
#          mid-decode; rank 0 must exit non-zero within the watchdog time
set -uo pipefail
out="${OUT:-/tmp/tp-run}"
mkdir -p "$out"
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(tests gen tp27b bench fault)
summary=()
t_start=$(date +%s)
B="${DELTAKIT_BUNDLE_DIR:-.gpu}"
ngpu=${TP_NGPU:-$(nvidia-smi -L 2>/dev/null | grep -c "^GPU")}
tps=()
for t in 2 4 8; do [ "$t" -le "$ngpu" ] && tps+=("$t"); done
summary+=("host: $ngpu GPUs, NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-unset}; TP sizes run: ${tps[*]:-none}")

tests() {
  local f="$out/tests.log" t0
  t0=$(date +%s)
  DELTAKIT_REQUIRE_GPUS=$ngpu timeout 900 "$B/run" golden_cuda -- cuda_tp_multi_gpu --test-threads=1 --nocapture >"$f" 2>&1
  summary+=("test golden_cuda cuda_tp_multi_gpu: rc $?, $(( $(date +%s) - t0 ))s, $(grep -E '^[0-9]+ passed, [0-9]+ failed' "$f" | tail -n 1)")
}

# Greedy tokens and log-probabilities of two JSON-lines generate outputs.
compare_jsonl() {
  python3 tools/compare_jsonl.py "$1" "$2"
}

gen() {
  local f="$out/gen.log" tp
  : >"$f"
  local args=(generate --device cuda:0 --model tests/fixtures/tiny-trained --token-ids 1,2,3 --token-ids 7
              --json --logprobs 5 --max-tokens 32 --ignore-eos)
  for tp in "${tps[@]}"; do
    timeout 300 "$B/run" --cli "${args[@]}" --tp "$tp" >"/tmp/gen-inproc-$tp.jsonl" 2>>"$f"
    local rc1=$?
    timeout 300 "$B/run" --cli "${args[@]}" --nproc-per-node "$tp" >"/tmp/gen-proc-$tp.jsonl" 2>>"$f"
    local rc2=$?
    summary+=("gen tiny-trained tp $tp: in-process rc $rc1, --nproc-per-node rc $rc2: $(compare_jsonl "/tmp/gen-inproc-$tp.jsonl" "/tmp/gen-proc-$tp.jsonl")")
  done
}

tp27b() {
  local f="$out/tp27b.log" tp
  : >"$f"
  local args=(generate --device cuda:0 --model tests/configs/qwen3.5-27b --load-format dummy
              --token-ids 11,22,33,44,55,66,77,88 --json --logprobs 1 --max-tokens 16 --ignore-eos)
  timeout 300 "$B/run" --cli "${args[@]}" >/tmp/tp27b-1.jsonl 2>>"$f"
  summary+=("tp27b tp 1: rc $?")
  for tp in "${tps[@]}"; do
    timeout 300 "$B/run" --cli "${args[@]}" --tp "$tp" >"/tmp/tp27b-$tp.jsonl" 2>>"$f"
    summary+=("tp27b tp $tp: rc $? vs tp 1: $(compare_jsonl /tmp/tp27b-1.jsonl "/tmp/tp27b-$tp.jsonl")")
  done
}

bench() {
  local f="$out/bench.log" tp batch mode
  : >"$f"
  for tp in "${tps[@]}"; do
    for batch in 1 16 64; do
      for mode in graphs eager procs; do
        local extra=(--tp "$tp")
        [ "$mode" = eager ] && extra+=(--no-graphs)
        [ "$mode" = procs ] && extra=(--nproc-per-node "$tp")
        echo "=== 27b tp $tp batch $batch $mode" >>"$f"
        timeout 300 "$B/run" --cli bench --device cuda:0 --config tests/configs/qwen3.5-27b --load-format dummy \
          --batch "$batch" --prompt-len 512 --gen-len 64 "${extra[@]}" >>"$f" 2>&1
        local rc=$?
        summary+=("bench 27b tp $tp b$batch $mode: rc $rc | $(grep -E '^prefill' "$f" | tail -n 1)")
      done
      while IFS= read -r l; do summary+=("  $l"); done < <(grep -E '^rank [0-9]+ on' "$f" | tail -n "$tp")
    done
  done
}

fault() {
  local f="$out/fault.log" port=$((20000 + RANDOM % 20000)) r
  : >"$f"
  local args=(generate --device cuda --model tests/fixtures/tiny-trained --token-ids 1,2,3 --json
              --max-tokens 4000 --ignore-eos --no-graphs --step-timeout 30)
  # (4000 eager steps of the tiny model outlast the poll below; rank 0 exiting 0 = the kill came late.)
  local pids=()
  for r in 0 1; do
    RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      "$B/run" --cli "${args[@]}" >"/tmp/fault-$r.out" 2>"/tmp/fault-$r.err" &
    pids+=($!)
  done
  # Wait for rank 0's decode to be under way, then kill rank 1.
  local waited=0
  until grep -q '"kind":"token"' /tmp/fault-0.out 2>/dev/null || [ $waited -ge 120 ]; do sleep 1; waited=$((waited + 1)); done
  local victim
  victim=$(pgrep -P "${pids[1]}" -f deltakit | head -n 1)
  kill -9 "${victim:-${pids[1]}}" 2>/dev/null
  local t_kill; t_kill=$(date +%s)
  wait "${pids[0]}"
  local rc0=$?
  local after=$(( $(date +%s) - t_kill ))
  wait "${pids[1]}" 2>/dev/null
  { echo "--- rank 0 stderr"; head -n 5 /tmp/fault-0.err; echo "--- rank 1 stderr"; head -n 5 /tmp/fault-1.err; } >>"$f"
  summary+=("fault: rank 1 killed after ${waited}s of start-up; rank 0 exit $rc0 ${after}s after the kill (must be non-zero, < 35 s): $(grep -m1 -E "^Error" /tmp/fault-0.err)")
}

for s in "${steps[@]}"; do
  case "$s" in
    tests) tests ;;
    gen) gen ;;
    tp27b) tp27b ;;
    bench) bench ;;
    fault) fault ;;
    *) echo "unknown step $s" >&2; exit 2 ;;
  esac
done
nvidia-smi --query-gpu=index,name,memory.used,clocks.sm --format=csv,noheader >"$out/gpu.txt" 2>&1
echo "==== tp device run ($(( $(date +%s) - t_start ))s; logs in $out)"
printf '%s\n' "${summary[@]}"
