#!/usr/bin/env bash
# gdr-state (session 10): one device call that measures what bounds the split pipeline's STATE kernel
# (split_wg_kernel, csrc/gdr/chunk_prefill_fused_sm90.cu) under the library default:
#  1. routes + same-call times (criterion, DELTAKIT_GDR_ROUTE_LOG=1) at 27B TP1 / TP2 / 9B 8 x 8192;
#  2. the kernel's clock64 phase profile (variant 210 = the single-CTA chain state kernel <146> + profile bit 2, old
#     local pass) at 27B TP1 (96 CTAs) and 9B 8 x 8192 (512 CTAs, 4 waves): cycles per chunk of CTA (0, 0, 0);
#  3. ncu --set full (+ SourceCounters' stall sampling per SASS instruction) of the default's state kernel launches:
#     27B TP1 (single route), 9B 8 x 8192 (pair route), 27B TP2 (context-parallel pass 1 + pass 3, fewer sections).
# Here:  DELTAKIT_BUNDLE_DIR=.gpu-st DELTAKIT_BUNDLE_TESTS="-p deltakit --test gdr_chunk_prefill" \
#          DELTAKIT_BUNDLE_BENCHES="-p deltakit --bench gdr_chunk_prefill" tools/gpu-bundle
# There (carry .gpu-st): OUT=$OUT bash tools/tune/gdr_state_call.sh
set -uo pipefail
B=${BUNDLE:-.gpu-st}
o=$OUT
t0=$(date +%s)
if [ "${MODE:-}" = verify ]; then  # call 2: see the end of this file
  C=4157649
  "$B/run" --bench __none__ >/dev/null 2>&1
  ( cd "$B/root" && DELTAKIT_REQUIRE_GPU=1 DELTAKIT_GDR_SPLIT_VARIANT=$C DELTAKIT_GDR_ROUTE_LOG=1 timeout 60 \
      "$PWD/../bin/$(awk '$1 == "test" && $3 ~ /^gdr_chunk_prefill-/ {print $3}' ../manifest.tsv | head -n 1)" \
      default_routes varlen_long --test-threads 1 ) 2>&1 | grep -E "route|test result" | sort | uniq -c >"$o/routes.txt"
  BUNDLE=$B CAND=$C TEST_VARS=$C TEST_TIMEOUT=100 SAN_TIMEOUT=70 \
    SAN_RUNS="${SAN_RUNS:-memcheck:$C:varlen_initial_states,default_routes}" \
    BENCH_VARS="${BENCH_VARS:-2060497 $C}" ENGINE_ROWS=" " KTIME_RUNS="" bash tools/tune/gdr_candidate_verify.sh \
    >"$o/verify.log" 2>&1
  cat "$o/routes.txt"; tail -n 30 "$o/verify.log"
  exit 0
fi
el() { echo "$(( $(date +%s) - t0 ))s"; }
[ -d "$B/bin" ] || python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$B/bin.tar.xz" "$B"
bexe="$PWD/$B/bin/$(awk '$1 == "bench" && $3 ~ /^gdr_chunk_prefill-/ {print $3}' "$B/manifest.tsv" | head -n 1)"
echo "bench exe $bexe" >"$o/log"
ls -la "$bexe" >>"$o/log" 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv >>"$o/log" 2>&1
ncu --version >>"$o/log" 2>&1
cd "$B/root" || exit 1
export DELTAKIT_REQUIRE_GPU=1
# 1. routes + times (default)
for s in 27b_tp1 27b_tp2 9b_16x32/8x8192; do
  DELTAKIT_GDR_ROUTE_LOG=1 timeout 60 "$bexe" --bench "$s" --warm-up-time 0.3 --measurement-time 1.5 \
    >"$o/b.tmp" 2>"$o/r.tmp"
  echo "== bench $s rc $? at $(el)" >>"$o/bench.txt"
  grep -E "time:|gdr_chunk_prefill/" "$o/b.tmp" >>"$o/bench.txt"
  sort "$o/r.tmp" | uniq -c | sort -rn | head -8 >>"$o/bench.txt"
done
rm -f "$o/b.tmp" "$o/r.tmp"
# 2. clock64 phase profile (single-CTA chain kernel)
for s in 27b_tp1 9b_16x32/8x8192; do
  DELTAKIT_GDR_SPLIT_VARIANT=210 DELTAKIT_GDR_ROUTE_LOG=1 timeout 40 "$bexe" --bench "$s" --warm-up-time 0.1 \
    --measurement-time 0.3 >"$o/b.tmp" 2>&1
  echo "== prof 210 $s rc $? at $(el)" >>"$o/prof.txt"
  grep -E "prof|time:" "$o/b.tmp" | sort | uniq -c | head -12 >>"$o/prof.txt"
done
rm -f "$o/b.tmp"
# 3. ncu of the default's state kernel(s)
run_ncu() {  # label shape count sections...
  local lab=$1 shp=$2 cnt=$3; shift 3
  timeout 55 ncu --kernel-name regex:split_wg_kernel --launch-count "$cnt" "$@" -f -o "/tmp/$lab" \
    "$bexe" --bench "$shp" --warm-up-time 0.02 --measurement-time 0.02 >"/tmp/$lab.log" 2>&1
  echo "ncu $lab rc $? at $(el)" >>"$o/log"
  tail -n 4 "/tmp/$lab.log" >>"$o/log"
  { echo "######## $lab"; ncu -i "/tmp/$lab.ncu-rep" --page details --print-units base 2>&1; } >>"$o/ncu_details.txt"
  ncu -i "/tmp/$lab.ncu-rep" --page raw --csv 2>/dev/null | python3 -c '
import csv, sys
rows = list(csv.reader(sys.stdin))
if len(rows) < 3: sys.exit(0)
h, u = rows[0], rows[1]
for r in rows[2:]:
    print("#### launch", r[h.index("Kernel Name")] if "Kernel Name" in h else "?")
    for i, n in enumerate(h):
        if i < len(r) and r[i] not in ("", "n/a"): print(n, r[i], u[i] if i < len(u) else "")
' | sed "s/^####/#### $lab/" | gzip -9 >>"$o/raw.txt.gz"
  echo "raw $lab at $(el)" >>"$o/log"
}
run_ncu tp1 27b_tp1 1 --set full --import-source no
{ echo "######## tp1"; ncu -i /tmp/tp1.ncu-rep --page source --csv --print-source sass 2>&1; } | gzip -9 >>"$o/src.csv.gz"
run_ncu pair 9b_16x32/8x8192 1 --set full --import-source no
{ echo "######## pair"; ncu -i /tmp/pair.ncu-rep --page source --csv --print-source sass 2>&1; } | gzip -9 >>"$o/src.csv.gz"
run_ncu cp 27b_tp2 2 --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  --section SchedulerStats --section ComputeWorkloadAnalysis --section InstructionStats
echo "done at $(el)" >>"$o/log"
ls -la "$o" >>"$o/log"
cat "$o/bench.txt" "$o/prof.txt"
tail -n 30 "$o/log"
# ---------------------------------------------------------------------------------------------------------------------
# Call 2 (MODE=verify, session 10): the opt-in 4157649 (= 2060497 + 2097152, split_wg_kernel kStsmO: the output tile by
# stmatrix .trans): the routes it takes on the route test, the whole test binary under it, memcheck + racecheck on two
# tests, the bench 2060497 / 4157649 twice each (same call). Runs INSTEAD of the measurement above when MODE=verify
# (the script exits before reaching here otherwise; see the top).
