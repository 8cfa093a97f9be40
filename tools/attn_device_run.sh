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
#   tools/attn_device_run.sh [steps]     # on the GPU host; steps: triage tests sanitize bench
#                                        # ncu ncudec ncuq (default: tests sanitize bench ncu);
#                                        # triage first runs the small prefill cases of the
#                                        # new tile variants (NEW_VARIANTS) under a short timeout and
#                                        # leaves a variant that hangs or fails out of every
#                                        # later step (tests, sanitizers, bench)
# DELTAKIT_BENCH_PART=decode (or prefill) runs half of the bench sweep.
# Timing protocols: table.md ends with a "protocol parity" table: the default kernel (every sm90
# kernel with DELTAKIT_BENCH_DOBENCH=all, none with 0) and SDPA each under both the back-to-back
# quick protocol and triton do_bench's (L2 flush + median), ratio per protocol.
# ATTN_TIMELINE=1 (bench step): the timeline variants' per-block records (prefill 26 / 33 / 35 unless
# DELTAKIT_BENCH_TIMELINE_VARIANTS says otherwise, 12 fields with the Q-path stamps; decode 12;
# benches/attn.rs DELTAKIT_BENCH_TIMELINE) summarized into $OUT/timeline.txt, raw in tl.tgz.
# ATTN_NCU_FILTER (ncu step, default 27b_tp1/8192) picks the prefill shape profiled;
# ATTN_NCU_DECODE_FILTER / ATTN_NCU_DECODE / ATTN_NCU_COUNT / ATTN_NCU_DECODE_SET the ncudec run.
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
# Prefill tile variants under test this session (SAN_PREFILL_VARIANTS: the sanitizer list).
NEW_VARIANTS="${NEW_VARIANTS:-30,31,32,33,34,35}"
if [[ " $steps " == *" triage "* ]]; then
  # The small prefill cases of every new variant together (~2 s); on a hang or failure, each
  # variant alone, and only the passing ones stay in the tests, sanitizers and bench.
  DELTAKIT_TEST_PREFILL_VARIANTS="$NEW_VARIANTS" timeout 30 "$kit/attn_test" \
    prefill_kernels_small_cases_for_sanitizer >"$OUT/tests.log" 2>&1
  rc=$?
  if [[ $rc -ne 0 ]]; then
    good=""
    for v in ${NEW_VARIANTS//,/ }; do
      DELTAKIT_TEST_PREFILL_VARIANTS="$v" timeout 15 "$kit/attn_test" \
        prefill_kernels_small_cases_for_sanitizer >>"$OUT/tests.log" 2>&1 && good="$good,$v"
    done
    good="${good#,}"
    summary+=("triage: new variants together rc=$rc; passing alone: ${good:-none}")
    # The failed ones leave the given lists (default lists: 25 + the passing ones; 25 = the session-6 default, the baseline).
    keep() {
      local out="" x
      for x in ${1//,/ }; do
        [[ ",$NEW_VARIANTS," == *",$x,"* && ",$good," != *",$x,"* ]] || out="$out,$x"
      done
      echo "${out#,}"
    }
    export DELTAKIT_TEST_PREFILL_VARIANTS="$(keep "${DELTAKIT_TEST_PREFILL_VARIANTS:-25,$NEW_VARIANTS}")"
    export DELTAKIT_BENCH_PREFILL_VARIANTS="$(keep "${DELTAKIT_BENCH_PREFILL_VARIANTS:-25,$NEW_VARIANTS}")"
    NEW_VARIANTS="$good"
    # The bench's timeline records run 26, 33 and 35 (DELTAKIT_BENCH_TIMELINE_VARIANTS): only
    # those that passed.
    tlv=26
    for v in 33 35 38 40 43 45 47 49 50 52 54 56; do [[ ",$good," == *",$v,"* ]] && tlv="$tlv,$v"; done
    export DELTAKIT_BENCH_TIMELINE_VARIANTS="$tlv"
  else
    summary+=("triage: new variants $NEW_VARIANTS small cases rc=0")
  fi
fi
if [[ " $steps " == *" tests "* ]]; then
  # Hang triage first: the small cases (every kernel and schedule) take ~1 s; if they time out,
  # rerun them without the ping-pong schedule and leave it out of everything after.
  timeout 25 "$kit/attn_test" prefill_kernels_small_cases_for_sanitizer >>"$OUT/tests.log" 2>&1
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
  if [[ "${ATTN_TIMELINE:-0}" == 1 ]]; then
    mkdir -p "$OUT/tl"
    export DELTAKIT_BENCH_TIMELINE="$OUT/tl"
  fi
  DELTAKIT_BENCH_QUICK=1 timeout "${BENCH_TIMEOUT:-120}" "$kit/attn_bench" >"$OUT/quick.jsonl" 2>>"$OUT/tests.log"
  rc=$?
  summary+=("bench rc=$rc ($(( $(date +%s) - t0 ))s)")
  if [[ "${ATTN_TIMELINE:-0}" == 1 ]]; then
    unset DELTAKIT_BENCH_TIMELINE
    { python3 tools/dev_attn_check.py timeline "$OUT"/tl/tl_*.txt
      python3 tools/dev_attn_check.py timeline-dec "$OUT"/tl/tld_*.txt; } >"$OUT/timeline.txt" 2>&1
    cat "$OUT/timeline.txt"
    tar czf "$OUT/tl.tgz" -C "$OUT" tl && rm -rf "$OUT/tl"
  fi
  t0=$(date +%s)
  PYTHONUNBUFFERED=1 timeout "${ANCHOR_TIMEOUT:-120}" python3 tools/bench_attn_anchors.py --deltakit "$OUT/quick.jsonl" \
    --out "$OUT/table.md" >"$OUT/anchors.log" 2>&1
  rc=$?
  summary+=("anchors rc=$rc ($(( $(date +%s) - t0 ))s)")
  [[ -f "$OUT/table.md" ]] && cat "$OUT/table.md"
  printf '%s\n' "${summary[@]}"
fi
if [[ " $steps " == *" sanitize "* ]]; then
  # Prefill: the default kernel and the new tile variants (SAN_PREFILL_VARIANTS, default the
  # triaged NEW_VARIANTS); decode (unless SAN_SKIP_DECODE=1): every decode kernel and variant.
  san_tests="prefill_kernels_small_cases_for_sanitizer"
  [[ "${SAN_SKIP_DECODE:-0}" == 1 ]] || san_tests="decode_kernels_small_cases_for_sanitizer $san_tests"
  for tool in memcheck racecheck; do
    for t in $san_tests; do
      t0=$(date +%s)
      DELTAKIT_TEST_PREFILL_VARIANTS="${SAN_PREFILL_VARIANTS:-$NEW_VARIANTS}" \
        DELTAKIT_TEST_DECODE_VARIANTS="${SAN_DECODE_VARIANTS:-${DELTAKIT_TEST_DECODE_VARIANTS:-}}" \
        timeout "${SAN_TIMEOUT:-90}" compute-sanitizer \
        --tool "$tool" --error-exitcode 9 "$kit/attn_test" "$t" >>"$OUT/san.log" 2>&1
      rc=$?
      grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test result" "$OUT/san.log" | tail -2
      summary+=("$tool ${t%%_*} rc=$rc ($(( $(date +%s) - t0 ))s)")
    done
  done
fi
if [[ " $steps " == *" ncudec "* ]]; then
  t0=$(date +%s)
  DELTAKIT_BENCH_QUICK=1 DELTAKIT_BENCH_PART=decode \
    DELTAKIT_BENCH_DECODE_FILTER="${ATTN_NCU_DECODE_FILTER:-27b_tp1_ctx32768/16}" \
    timeout "${NCU_TIMEOUT:-90}" ncu --set "${ATTN_NCU_DECODE_SET:-full}" --clock-control none \
    --kernel-name-base mangled \
    -k "regex:${ATTN_NCU_DECODE:-attn_dec13decode_kernel}" -c "${ATTN_NCU_COUNT:-1}" -f \
    -o "$OUT/ncu_decode_sm90" "$kit/attn_bench" \
    >>"$OUT/bench.err" 2>&1
  rc=$?
  ncu --import "$OUT/ncu_decode_sm90.ncu-rep" --page details --section SpeedOfLight \
    --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
    --section WarpStateStats 2>/dev/null | grep -E "decode_kernel|decode_merge|Duration|Throughput|Registers|Achieved Occupancy|Block Limit|DRAM|Mem Busy|Max Bandwidth|Stall|Warp Cycles" | cut -c1-150 | head -60
  summary+=("ncudec rc=$rc ($(( $(date +%s) - t0 ))s)")
fi
if [[ " $steps " == *" ncu "* ]]; then
  # ncu --set full of one prefill kernel at 27B TP1 T=8192: ATTN_NCU_VARIANT, else the fastest
  # sm90 kernel of this run's bench at that shape (quick.jsonl), else the default. The bench
  # runs that variant alone (DELTAKIT_BENCH_PREFILL_VARIANTS) so ncu's first match is it.
  t0=$(date +%s)
  var="${ATTN_NCU_VARIANT:-}"
  if [[ -z "$var" && -f "$OUT/quick.jsonl" ]]; then
    var=$(python3 -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
rows = [r for r in rows if r["id"] == "27b_tp1/8192" and r["kernel"].startswith("sm90")]  # (default shape)
best = min(rows, key=lambda r: r["us"], default=None)
print("" if best is None or best["kernel"] == "sm90" else best["kernel"][len("sm90v"):])' "$OUT/quick.jsonl")
  fi
  # Auto = the wrapper's SM90_DEFAULT_VARIANT, read from src/ops/attn.rs (not repeated here)
  var="${var:-$(sed -n 's/^const SM90_DEFAULT_VARIANT: i32 = \([0-9_]*\);.*/\1/p' src/ops/attn.rs)}"
  echo "ncu: prefill variant $var"
  DELTAKIT_BENCH_QUICK=1 DELTAKIT_BENCH_FILTER="${ATTN_NCU_FILTER:-27b_tp1/8192}" \
    DELTAKIT_BENCH_PREFILL_VARIANTS="${var:-}" \
    timeout "${NCU_TIMEOUT:-90}" ncu --set full --import-source yes --clock-control none \
    --kernel-name-base mangled -k "regex:Li256ELb[01]ELi${var:-7}E" -c 1 -f \
    -o "$OUT/ncu_prefill_sm90" "$kit/attn_bench" >>"$OUT/tests.log" 2>&1
  rc=$?
  ncu --import "$OUT/ncu_prefill_sm90.ncu-rep" --page details --section SpeedOfLight \
    --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
    --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis >"$OUT/ncu.txt" 2>&1
  grep -E "prefill_kernel|Duration|Throughput|Registers|Achieved Occupancy|Issued|Eligible|No Eligible|Warp Cycles|Stall|Pipe" \
    "$OUT/ncu.txt" | cut -c1-130 | head -40
  # Per-SASS-instruction warp stall samples (source page), then the top lines by samples.
  ncu --import "$OUT/ncu_prefill_sm90.ncu-rep" --page source --csv --print-source sass \
    >"$OUT/ncu_src.csv" 2>>"$OUT/ncu.txt"
  python3 tools/dev_attn_check.py ncu-src "$OUT/ncu_src.csv" 2>&1 | head -70
  summary+=("ncu variant ${var:-default} rc=$rc ($(( $(date +%s) - t0 ))s)")
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
