#!/usr/bin/env bash
# One device call for issue 14 (attn.prefill sm_90a kernel, attn.decode sm_90 kernel): GPU tests
# of tests/attn.rs, the compute-sanitizer memcheck + racecheck runs on the small prefill cases
# (default kernel) and the small decode cases (every decode kernel), the quick bench sweep
# (benches/attn.rs, DELTAKIT_BENCH_QUICK=1) with torch SDPA anchors in the same run
# (tools/bench_attn_anchors.py), ncu --set full of the sm_90a prefill kernel at one shape (step
# ncu) and of the sm_90 decode kernel at 27B TP1, 32k context, 16 rows (step ncudec).
#
# Binaries come from .attn-kit/ (git-ignored; built here by tools/attn_device_run.sh --pack):
#   tools/attn_device_run.sh --pack      # on the build host: cargo build + copy + strip
#   tools/attn_device_run.sh [steps]     # on the GPU host; steps: tma tests sanitize bench ncu
#                                        # ncudec ncuq (default: tests sanitize bench ncu); tma
#                                        # first tries prefill variant 9 and adds it if it passes
# DELTAKIT_BENCH_PART=decode (or prefill) runs half of the bench sweep.
# Order: tests, bench (+ SDPA anchors), sanitize, ncu. DELTAKIT_BENCH_FILTER=/ keeps every prefill
# shape and skips the decode sweep (round 2: the sm90 tile-variant sweep).
# Writes logs and tables to $OUT (<= 8 files) and prints a short summary last.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
kit=.attn-kit
if [[ "${1:-}" == "--pack" ]]; then
  json="$(mktemp)"
  cargo build --release -p deltakit --features cuda --test attn --bench attn \
    --message-format=json-render-diagnostics >"$json" || exit 1
  mkdir -p "$kit"
  for kind in test bench; do
    exe=$(python3 -c '
import json, sys
for l in open(sys.argv[1]):
    try: m = json.loads(l)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "attn" and m["package_id"].split("#")[0].rstrip("/").endswith(sys.argv[3]) and sys.argv[2] in m["target"]["kind"]:
        print(m["executable"])' "$json" "$kind" "$(pwd)" | tail -1)
    [[ -n "$exe" ]] || { echo "no $kind binary"; exit 1; }
    cp "$exe" "$kit/attn_$kind"
    strip --strip-debug "$kit/attn_$kind"
  done
  rm -f "$json"
  ls -la "$kit"
  exit 0
fi
OUT="${OUT:-/tmp/attn-out}"
mkdir -p "$OUT"
steps="${*:-tests sanitize bench ncu}"
export DELTAKIT_REQUIRE_GPU=1
export PATH="$PATH:/usr/local/cuda/bin:/usr/local/cuda-13.0/bin"
summary=()
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
if [[ " $steps " == *" tma "* ]]; then
  # Prefill variant 9 (TMA loads), first GPU runs: the small cases with it under a short timeout
  # (a byte-count mismatch would hang), then memcheck; if they pass, every later test and the
  # prefill bench include it (DELTAKIT_TEST_PREFILL_TMA / DELTAKIT_BENCH_PREFILL_TMA).
  DELTAKIT_TEST_PREFILL_TMA=1 DELTAKIT_TEST_PREFILL_DEFAULT_ONLY=0 timeout 30 "$kit/attn_test" \
    prefill_kernels_small_cases_for_sanitizer >"$OUT/tma.log" 2>&1
  rc=$?
  if [[ $rc -eq 0 ]]; then
    DELTAKIT_TEST_PREFILL_TMA=1 timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 \
      "$kit/attn_test" prefill_kernels_small_cases_for_sanitizer >>"$OUT/tma.log" 2>&1
    rc=$?
    [[ $rc -eq 0 ]] && export DELTAKIT_TEST_PREFILL_TMA=1 DELTAKIT_BENCH_PREFILL_TMA=1
  fi
  grep -E "panicked|ERROR SUMMARY|test result" "$OUT/tma.log" | head -5
  summary+=("tma (prefill variant 9) small cases + memcheck rc=$rc")
fi
if [[ " $steps " == *" tests "* ]]; then
  # Hang triage first: the small cases (every kernel and schedule) take ~1 s; if they time out,
  # rerun them without the ping-pong schedule and leave it out of everything after.
  timeout 25 "$kit/attn_test" prefill_kernels_small_cases_for_sanitizer >"$OUT/tests.log" 2>&1
  rc=$?
  if [[ $rc -eq 124 ]]; then
    export DELTAKIT_TEST_SKIP_PINGPONG=1
    timeout 40 "$kit/attn_test" prefill_kernels_small_cases_for_sanitizer >>"$OUT/tests.log" 2>&1
    rc=$?
    summary+=("small cases hung with ping-pong; without it rc=$rc")
    if [[ $rc -eq 124 ]]; then
      tail -20 "$OUT/tests.log"; echo "the default schedule hangs too: stopping"; exit 1
    fi
  fi
  # Decode triage: the small decode cases (every variant) take ~1 s; if they hang, leave the
  # bulk-copy variants (4-7) out of the tests and the bench.
  timeout 25 "$kit/attn_test" decode_kernels_small_cases_for_sanitizer >>"$OUT/tests.log" 2>&1
  rc=$?
  if [[ $rc -ne 0 ]]; then
    export DELTAKIT_TEST_DECODE_VARIANTS=3 DELTAKIT_BENCH_DECODE_VARIANTS=3
    timeout 25 "$kit/attn_test" decode_kernels_small_cases_for_sanitizer >>"$OUT/tests.log" 2>&1
    summary+=("small decode cases failed (rc=$rc) with variants 0-7; 0-3 only: rc=$?")
  fi
  t0=$(date +%s)
  timeout "${TEST_TIMEOUT:-150}" "$kit/attn_test" --test-threads 2 >>"$OUT/tests.log" 2>&1
  rc=$?
  grep -E "^test |INVARIANT|panicked|test result" "$OUT/tests.log" | cut -c1-400
  summary+=("tests rc=$rc ($(( $(date +%s) - t0 ))s)")
fi
if [[ " $steps " == *" bench "* ]]; then
  t0=$(date +%s)
  DELTAKIT_BENCH_QUICK=1 timeout "${BENCH_TIMEOUT:-120}" "$kit/attn_bench" >"$OUT/quick.jsonl" 2>"$OUT/bench.err"
  rc=$?
  summary+=("bench rc=$rc ($(( $(date +%s) - t0 ))s)")
  t0=$(date +%s)
  PYTHONUNBUFFERED=1 timeout 90 python3 tools/bench_attn_anchors.py --deltakit "$OUT/quick.jsonl" \
    --out "$OUT/table.md" >"$OUT/anchors.log" 2>&1
  rc=$?
  summary+=("anchors rc=$rc ($(( $(date +%s) - t0 ))s)")
  [[ -f "$OUT/table.md" ]] && cat "$OUT/table.md"
  printf '%s\n' "${summary[@]}"
fi
if [[ " $steps " == *" sanitize "* ]]; then
  # Prefill: the default kernel (variant 7) alone; decode: every decode kernel and variant.
  for tool in memcheck racecheck; do
    for t in decode_kernels_small_cases_for_sanitizer prefill_kernels_small_cases_for_sanitizer; do
      t0=$(date +%s)
      DELTAKIT_TEST_PREFILL_DEFAULT_ONLY=1 timeout "${SAN_TIMEOUT:-90}" compute-sanitizer \
        --tool "$tool" --error-exitcode 9 "$kit/attn_test" "$t" >>"$OUT/san_$tool.log" 2>&1
      rc=$?
      grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test result" "$OUT/san_$tool.log" | tail -2
      summary+=("$tool ${t%%_*} rc=$rc ($(( $(date +%s) - t0 ))s)")
    done
  done
fi
if [[ " $steps " == *" ncudec "* ]]; then
  t0=$(date +%s)
  DELTAKIT_BENCH_QUICK=1 DELTAKIT_BENCH_PART=decode DELTAKIT_BENCH_DECODE_FILTER=27b_tp1_ctx32768/16 \
    timeout "${NCU_TIMEOUT:-90}" ncu --set full --clock-control none --kernel-name-base mangled \
    -k "regex:${ATTN_NCU_DECODE:-attn_dec13decode_kernel}" -c "${ATTN_NCU_COUNT:-1}" -f \
    -o "$OUT/ncu_decode_sm90" "$kit/attn_bench" \
    >>"$OUT/bench.err" 2>&1
  rc=$?
  ncu --import "$OUT/ncu_decode_sm90.ncu-rep" --page details --section SpeedOfLight \
    --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
    --section WarpStateStats 2>/dev/null | grep -E "decode_kernel|Duration|Throughput|Registers|Achieved Occupancy|Block Limit|DRAM|Mem Busy|Max Bandwidth|Stall|Warp Cycles" | cut -c1-150 | head -60
  summary+=("ncudec rc=$rc ($(( $(date +%s) - t0 ))s)")
fi
if [[ " $steps " == *" ncu "* ]]; then
  t0=$(date +%s)
  DELTAKIT_BENCH_QUICK=1 DELTAKIT_BENCH_FILTER=27b_tp1/8192 timeout 60 \
    ncu --set full --clock-control none -k regex:prefill_kernel -c 1 -f -o "$OUT/ncu_prefill_sm90" \
    "$kit/attn_bench" >>"$OUT/bench.err" 2>&1
  rc=$?
  ncu --import "$OUT/ncu_prefill_sm90.ncu-rep" --page details --section SpeedOfLight \
    --section Occupancy --section LaunchStats 2>/dev/null | grep -E "Duration|Throughput|Registers|Shared Memory Config|Achieved Occupancy|Block Limit" | head -20
  summary+=("ncu rc=$rc ($(( $(date +%s) - t0 ))s)")
fi
if [[ " $steps " == *" ncuq "* ]]; then
  # Cheap profile of one kernel (ATTN_NCU_KERNEL: a regex on the mangled name, e.g. Li256ELb1ELi5E
  # for tile variant 5): speed of light, warp stall reasons, scheduler issue rates, as text.
  t0=$(date +%s)
  DELTAKIT_BENCH_QUICK=1 DELTAKIT_BENCH_FILTER=27b_tp1/8192 timeout 45 \
    ncu --clock-control none --kernel-name-base mangled -k "regex:${ATTN_NCU_KERNEL:-prefill_kernel}" \
    -c 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    "$kit/attn_bench" >"$OUT/ncu.txt" 2>&1
  rc=$?
  grep -E "Duration|Throughput|Stall|Warp Cycles|Issued|Eligible|Active Warps|No Eligible|One or More" \
    "$OUT/ncu.txt" | grep -v "^{" | cut -c1-120 | head -40
  summary+=("ncuq rc=$rc ($(( $(date +%s) - t0 ))s)")
fi
[[ -f "$OUT/table.md" ]] && cat "$OUT/table.md"
printf '%s\n' "${summary[@]}"
