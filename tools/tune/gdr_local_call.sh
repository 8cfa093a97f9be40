#!/usr/bin/env bash
# gdr-local (session 9): one device call for the wgmma local pass (variant 159953 = 28881 + 131072,
# csrc/gdr/chunk_local_wgmma_sm90.cu): the gdr_chunk_prefill tests under it, memcheck + racecheck on two tests, the
# kernel bench 28881 vs 159953 (same call), and an ncu profile of both local-pass kernels at 27B TP1 1 x 8192.
# Here:  DELTAKIT_BUNDLE_DIR=.gpu-lw DELTAKIT_BUNDLE_TESTS="--workspace --test gdr_chunk_prefill" \
#          DELTAKIT_BUNDLE_BENCHES="-p deltakit --bench gdr_chunk_prefill" tools/gpu-bundle
# There (carry .gpu-lw): OUT=$OUT bash tools/tune/gdr_local_call.sh     (~40 s warm)
# CAND (default 159953) / BASE (default 28881): the variant under test and the one it is benched / profiled against
# (e.g. CAND=225489 BASE=94417: the wgmma local pass on the session-9 default's routes).
set -uo pipefail
B=${BUNDLE:-.gpu-lw}
o=$OUT
t0=$(date +%s)
C=${CAND:-159953}
BS=${BASE:-28881}
# Session 10: TEST_VARS / SAN_RUNS / BENCH_VARS (gdr_candidate_verify.sh's meaning) and NCU_VARS override the defaults
# below (several candidates in one call).
BUNDLE=$B CAND=$C TEST_VARS="${TEST_VARS:-$C}" TEST_TIMEOUT=100 SAN_TIMEOUT=60 \
  SAN_RUNS="${SAN_RUNS:-memcheck:$C:varlen_initial_states,gates_at_the_edge racecheck:$C:varlen_initial_states,gates_at_the_edge}" \
  BENCH_VARS="${BENCH_VARS:-$BS $C}" ENGINE_ROWS=" " KTIME_RUNS="" bash tools/tune/gdr_candidate_verify.sh >"$o/verify.log" 2>&1
bexe="$PWD/$B/bin/$(awk '$1 == "bench" && $3 ~ /^gdr_chunk_prefill-/ {print $3}' "$B/manifest.tsv" | head -n 1)"
for v in ${NCU_VARS:-$BS $C}; do
  ( cd "$B/root" && DELTAKIT_REQUIRE_GPU=1 DELTAKIT_GDR_SPLIT_VARIANT=$v timeout 45 ncu --kernel-name regex:local \
      --launch-count 1 --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
      --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
      --section InstructionStats --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' "$bexe" --bench 27b_tp1 --warm-up-time 0.05 --measurement-time 0.05 ) \
    >"$o/ncu_$v.txt" 2>&1
  echo "ncu $v rc $? at $(( $(date +%s) - t0 ))s"
done
echo "==== summary"
cat "$o/summary.txt" 2>/dev/null
tail -n 12 "$o/verify.log"
for v in ${NCU_VARS:-$BS $C}; do
  echo "== ncu $v"
  grep -E "stalled_[a-z_]+_per_issue_active.ratio +[0-9.]+" "$o/ncu_$v.txt" | awk '$NF > 0.05 {sub(/smsp__average_warps_issue_stalled_/, "", $1); sub(/_per_issue_active.ratio/, "", $1); printf "%s %s; ", $1, $NF} END {print ""}'
  grep -E "local|Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Issue Slots Busy|No Eligible|Eligible Warps|Stall|Compute \(SM\) Throughput|Memory Throughput|L1/TEX Hit|Executed Ipc A" "$o/ncu_$v.txt" | head -24
done
