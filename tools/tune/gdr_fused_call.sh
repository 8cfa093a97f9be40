#!/usr/bin/env bash
# Device call for the fused sm_90a chunk prefill (csrc/gdr/chunk_prefill_fused_sm90.cu), carry .gpu-gdr built by
# `GDR_BUNDLE_BENCH=1 GDR_BUNDLE_NO_DECODE=1 bash tools/tune/gdr_bundle.sh`. Logs in $OUT; a summary prints last.
#   1. concurrently: chunk-prefill tests under DELTAKIT_GDR_PREFILL=fused with kernel variant $TEST_VARIANT,
#      memcheck (variant $TEST_VARIANT), racecheck of variants $RACE_VARIANTS (9 = FULL hand-off by bar.sync)
#   2. alone: the criterion bench at 27B TP1 with the profiling variants $PROF_VARIANTS (clock64 phase table)
#   3. alone: the criterion bench (all shapes) for variants $BENCH_VARIANTS
#   4. ncu (SpeedOfLight, ComputeWorkloadAnalysis, WarpStateStats, Occupancy) on variant $NCU_VARIANT at 27B TP1
#   RACE_PROBE=1 (with step 1): racecheck on tools/tune/racecheck_probe.cu modes 0-3 (.gpu-gdr/racecheck_probe, built
#      here by `nvcc -arch=sm_90a -O2 -L.toolchain/cuda/lib -o .gpu-gdr/racecheck_probe tools/tune/racecheck_probe.cu`):
#      does the tool flag a textbook bar.arrive / bar.sync or mbarrier hand-off?
set -uo pipefail
out="${OUT:-/tmp/fused-call}"; mkdir -p "$out"
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 ))s; }
mkdir -p /tmp/gdrbin && tar -xJf .gpu-gdr/bin.tar.xz -C /tmp/gdrbin
xz -dc .gpu-gdr/bench_gdr_chunk_prefill.xz >/tmp/bench_gdr_cp && chmod +x /tmp/bench_gdr_cp
bin=$(ls /tmp/gdrbin/gdr_chunk_prefill-* | head -n 1)
export DELTAKIT_REQUIRE_GPU=1 DELTAKIT_GDR_PREFILL=fused
tv=${TEST_VARIANT:-5}
pids=()
(DELTAKIT_GDR_FUSED_VARIANT=$tv timeout 150 "$bin" --test-threads 4 --nocapture >"$out/tests_v$tv.log" 2>&1
 echo "rc=$?" >>"$out/tests_v$tv.log") & pids+=($!)
(DELTAKIT_GDR_FUSED_VARIANT=$tv DELTAKIT_SANITIZE=1 timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 \
   "$bin" gates_at_the_edge varlen_initial_states --test-threads 1 >"$out/san_memcheck_v$tv.log" 2>&1
 echo "rc=$?" >>"$out/san_memcheck_v$tv.log") & pids+=($!)
for rv in ${RACE_VARIANTS:-9}; do
  (DELTAKIT_GDR_FUSED_VARIANT=$rv DELTAKIT_SANITIZE=1 timeout 150 compute-sanitizer --tool racecheck --error-exitcode 9 \
     "$bin" varlen_initial_states --test-threads 1 >"$out/san_racecheck_v$rv.log" 2>&1
   echo "rc=$?" >>"$out/san_racecheck_v$rv.log") & pids+=($!)
done
if [ -n "${RACE_PROBE:-}" ] && [ -x .gpu-gdr/racecheck_probe ]; then
  (for m in 0 1 2 3; do
     timeout 60 compute-sanitizer --tool racecheck .gpu-gdr/racecheck_probe $m 2>&1 | grep -E "mode|RACECHECK SUMMARY"
   done >"$out/race_probe.log" 2>&1) & pids+=($!)
fi
for p in "${pids[@]}"; do wait "$p"; done
echo "tests + sanitizers done at $(el)" >>"$out/summary.txt"
for pv in ${PROF_VARIANTS-3 7}; do
  echo "=== profile variant $pv" >>"$out/prof.log"
  DELTAKIT_GDR_FUSED_VARIANT=$pv timeout 40 /tmp/bench_gdr_cp --bench 27b_tp1 2>&1 | grep -E "fused-prof|time:" >>"$out/prof.log"
done
for bv in ${BENCH_VARIANTS:-5}; do
  echo "=== bench variant $bv" >>"$out/bench.log"
  DELTAKIT_GDR_FUSED_VARIANT=$bv timeout 60 /tmp/bench_gdr_cp --bench ${BENCH_ARGS:-} >>"$out/bench.log" 2>&1; echo "rc=$?" >>"$out/bench.log"
done
echo "bench done at $(el)" >>"$out/summary.txt"
if [ -n "${NCU_VARIANT-1}" ]; then
  stalls=sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor_op_hmma.sum
  for r in barrier long_scoreboard short_scoreboard math_pipe_throttle mio_throttle wait not_selected selected \
           dispatch_stall no_instruction branch_resolving lg_throttle; do
    stalls="$stalls,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"
  done
  DELTAKIT_GDR_FUSED_VARIANT=${NCU_VARIANT:-1} timeout 120 ncu --section SpeedOfLight --section ComputeWorkloadAnalysis \
    --section WarpStateStats --section Occupancy --section InstructionStats --metrics "$stalls" \
    -k regex:fused_kernel --launch-skip 2 \
    --launch-count 1 /tmp/bench_gdr_cp --bench 27b_tp1 --warm-up-time 0.1 --measurement-time 0.2 >"$out/ncu.log" 2>&1
  echo "ncu rc=$? at $(el)" >>"$out/summary.txt"
fi
cd "$out"
for f in tests_v*.log san_*.log; do echo "$f: $(tail -n 1 "$f") $(grep -hE '^test result|ERROR SUMMARY|RACECHECK SUMMARY' "$f" | tail -n 1)"; done >>summary.txt
grep -hE "panicked|FAILED" tests_v*.log | head -10 >>summary.txt
awk '/^case .*out_err/ { for (i = 1; i <= NF; i++) { if ($i == "out_err" && $(i+1) > mo) mo = $(i+1); if ($i == "state_err" && $(i+1) > ms) ms = $(i+1) } n++ }
     END { printf "cases %d max out_err %s max state_err %s\n", n, mo, ms }' tests_v*.log >>summary.txt
grep -m3 -A1 "Race reported" san_racecheck_v*.log >>summary.txt 2>/dev/null
cat race_probe.log >>summary.txt 2>/dev/null
cat prof.log >>summary.txt
grep -E "^=== |^gdr_chunk_prefill/|time:" bench.log | grep -v "%" >>summary.txt
grep -E "Duration|Throughput|Pipe|Issue|Warp Cycles|Stall|stalled|hmma|Registers|Achieved|Eligible|Executed Ipc|No Eligible" ncu.log | head -50 >>summary.txt
cat summary.txt
