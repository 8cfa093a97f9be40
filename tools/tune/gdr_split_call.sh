#!/usr/bin/env bash
# Device call for the split sm_90a chunk prefill (DELTAKIT_GDR_PREFILL=split, the default since session 5: local
# pass + state kernel, csrc/gdr/chunk_prefill_fused_sm90.cu), carry .gpu-gdr built by
# `GDR_BUNDLE_BENCH=1 GDR_BUNDLE_NO_DECODE=1 bash tools/tune/gdr_bundle.sh`. Logs in $OUT; a summary prints last.
# Runs are "label:DELTAKIT_GDR_PREFILL:DELTAKIT_GDR_SPLIT_VARIANT" ("-" = unset, i.e. the library default).
#   1. concurrently: the chunk-prefill tests for each run in $TEST_RUNS, compute-sanitizer for each
#      "tool:label:prefill:variant" in $SAN_RUNS (gates_at_the_edge + varlen_initial_states; racecheck: varlen only)
#   2. which kernels each pipeline in $PROBE_PIPES launches (ncu kernel list at 27B TP1): an sm_90a opt-in whose
#      sm90a_image probe were wrong would fall back silently to the Triton pipeline
#   3. alone: clock64 phase profiles at 27B TP1 for each run in $PROF_RUNS (split variants with bit 2)
#   4. alone: the criterion bench (all shapes) for each run in $BENCH_RUNS
set -uo pipefail
out="${OUT:-/tmp/split-call}"; mkdir -p "$out"
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 ))s; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader >"$out/summary.txt"
mkdir -p /tmp/gdrbin && tar -xJf .gpu-gdr/bin.tar.xz -C /tmp/gdrbin
xz -dc .gpu-gdr/bench_gdr_chunk_prefill.xz >/tmp/bench_gdr_cp && chmod +x /tmp/bench_gdr_cp
bin=$(ls /tmp/gdrbin/gdr_chunk_prefill-* | head -n 1)
export DELTAKIT_REQUIRE_GPU=1
runenv() {  # prefill variant -> env assignments
  local a=()
  [ "$1" != - ] && a+=("DELTAKIT_GDR_PREFILL=$1")
  [ "$2" != - ] && a+=("DELTAKIT_GDR_SPLIT_VARIANT=$2")
  echo "${a[@]}"
}
pids=()
for r in ${TEST_RUNS:-default:-:- split48:split:48}; do
  IFS=: read -r label pipe var <<<"$r"
  (env $(runenv "$pipe" "$var") timeout "${TEST_TIMEOUT:-150}" "$bin" --test-threads 4 --nocapture >"/tmp/t_$label.log" 2>&1
   echo "rc=$?" >>"/tmp/t_$label.log") & pids+=($!)
done
for r in ${SAN_RUNS:-memcheck:default:-:- memcheck:split48:split:48 racecheck:default:-:-}; do
  IFS=: read -r tool label pipe var <<<"$r"
  filt="gates_at_the_edge varlen_initial_states"; [ "$tool" = racecheck ] && filt=varlen_initial_states
  (env $(runenv "$pipe" "$var") DELTAKIT_SANITIZE=1 timeout "${SAN_TIMEOUT:-150}" compute-sanitizer --tool "$tool" \
     --error-exitcode 9 "$bin" $filt --test-threads 1 >"/tmp/san_${tool}_$label.log" 2>&1
   echo "rc=$?" >>"/tmp/san_${tool}_$label.log") & pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
echo "tests + sanitizers done at $(el)" >>"$out/summary.txt"
for f in /tmp/t_*.log /tmp/san_*.log; do
  [ -f "$f" ] || continue
  cat "$f" >>"$out/tests.log"
  echo "$(basename "$f"): $(tail -n 1 "$f") $(grep -hE '^test result|ERROR SUMMARY|RACECHECK SUMMARY' "$f" | tail -n 1)" >>"$out/summary.txt"
done
grep -hE "panicked|FAILED" /tmp/t_*.log | head -10 >>"$out/summary.txt"
grep -hm3 -A2 "Race reported" /tmp/san_racecheck_*.log >>"$out/summary.txt" 2>/dev/null
awk '/^case .*out_err/ { for (i = 1; i <= NF; i++) { if ($i == "out_err" && $(i+1) > mo) mo = $(i+1); if ($i == "state_err" && $(i+1) > ms) ms = $(i+1) } n++ }
     END { printf "cases %d max out_err %s max state_err %s\n", n, mo, ms }' /tmp/t_*.log >>"$out/summary.txt"
for pipe in ${PROBE_PIPES-}; do
  env $(runenv "$pipe" -) timeout 60 ncu --launch-skip 0 --launch-count 12 --metrics gpu__time_duration.sum \
    /tmp/bench_gdr_cp --bench 27b_tp1 --warm-up-time 0.05 --measurement-time 0.05 >"/tmp/ncu_$pipe.log" 2>&1
  echo "kernels under $pipe: $(grep -E 'x\([0-9]+, [0-9]+, [0-9]+\), Context' "/tmp/ncu_$pipe.log" | sed -E 's/^ +//; s/ \(.*//; s/^void //' | cut -c1-48 | sort -u | tr '\n' ' ')" >>"$out/summary.txt"
done
for r in ${PROF_RUNS:-wg50:split:50}; do
  IFS=: read -r label pipe var <<<"$r"
  echo "=== prof $label" >>"$out/prof.log"
  env $(runenv "$pipe" "$var") timeout 40 /tmp/bench_gdr_cp --bench 27b_tp1 --warm-up-time 0.3 --measurement-time 0.5 2>&1 | grep -E "prof|time:" >>"$out/prof.log"
done
ba=${BENCH_ARGS:---warm-up-time 0.3 --measurement-time 1.0}
for r in ${BENCH_RUNS:-default:-:- triton:wsplit_splitz:- split48:split:48 split56:split:56 local4:split:4}; do
  IFS=: read -r label pipe var <<<"$r"
  echo "=== $label" >>"$out/bench.log"
  env $(runenv "$pipe" "$var") timeout 90 /tmp/bench_gdr_cp --bench $ba >>"$out/bench.log" 2>&1; echo "rc=$?" >>"$out/bench.log"
done
echo "bench done at $(el)" >>"$out/summary.txt"
cat "$out/prof.log" >>"$out/summary.txt"
grep -E "^=== |^gdr_chunk_prefill/|time:" "$out/bench.log" | grep -v "%" >>"$out/summary.txt"
cat "$out/summary.txt"
