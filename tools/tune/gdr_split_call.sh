#!/usr/bin/env bash
# Device call for the split sm_90a chunk prefill (DELTAKIT_GDR_PREFILL=split, the default since session 5: local
# pass + state kernel, csrc/gdr/chunk_prefill_fused_sm90.cu), carry $BD (default .gpu-gdr) built by
# `GDR_BUNDLE_DIR=$BD GDR_BUNDLE_TESTS=gdr_chunk_prefill GDR_BUNDLE_BENCH=1 GDR_BUNDLE_NO_DECODE=1 GDR_BUNDLE_NO_AOT=1
#  bash tools/tune/gdr_bundle.sh`. Logs in $OUT; a summary prints last.
# Runs are "label:DELTAKIT_GDR_PREFILL:DELTAKIT_GDR_SPLIT_VARIANT" ("-" = unset, i.e. the library default).
#   0. `stash` as the only argument: copy .anchor-kit-libs/site-libs.tar.xz to /tmp/dk-kit and exit (a first call that
#      carries the kit; the second, carrying $BD and .anchor-kit-py, must follow while the machine is warm)
#   1. concurrently: the chunk-prefill tests for each run in $TEST_RUNS, compute-sanitizer for each
#      "tool:label:prefill:variant" in $SAN_RUNS (gates_at_the_edge + varlen_initial_states; racecheck: varlen only);
#      with ANCHORS=1 also the first calls of FlashInfer (all $ANCHOR_SHAPES) and FLA ($FLA_SHAPES) in one
#      tools/bench_anchors_gdr.py process per shape (FlashInfer only where /tmp/dk-kit holds the stashed libraries)
#   2. ANCHORS=1: the anchors timed, one process at a time, after the tests (same inputs / timing as the kit)
#   3. which kernels each pipeline in $PROBE_PIPES launches (ncu kernel list at 27B TP1): an sm_90a opt-in whose
#      sm90a_image probe were wrong would fall back silently to the Triton pipeline
#   4. alone: clock64 phase profiles at 27B TP1 for each run in $PROF_RUNS (split variants with bit 2)
#   5. alone: the criterion bench (all shapes) for each run in $BENCH_RUNS
#   6. $NCU_RUN ("label:prefill:variant:kernel-regex"): one ncu profile (launch 3 of that kernel, 27B TP1)
#   4b. $KTIME_RUNS ("label:prefill:variant:bench-filter"): ncu GPU time of each of the first $KTIME_COUNT (14) kernel
#      launches of that bench (e.g. the context-parallel passes: local, plan, pass 1, scan, pass 3)
# Options (session 7 round 2): SERIAL=1 runs the tests one at a time (one chain) and the sanitizers one at a time in a
#   second chain beside it (at most two GPU processes: no crowding, no OOM as 2769's long test had with 13 processes;
#   a SAN_RUNS entry "test:label:prefill:variant" runs a whole test binary in the sanitizer chain);
#   TEST_THREADS (4) per test binary; BUDGET_S: a bench / ktime run is skipped (noted in the summary) once the call has
#   run BUDGET_S - 15 s, and no run's timeout reaches past BUDGET_S (at least 5 s each); ONE_LOG=1: every log ends in $OUT/log and the summary in $OUT/summary.txt (nothing else),
#   the summary ending in a table of the bench (ms, middle estimate) per shape and run.
# Defaults (session 6, round 2): the default (209) against the overlap variant 721 (= 209 + 512: local pass overlapped
# with the state kernel where N H_v V / 64 <= SMs - 16 and its cost model expects a gain; 2769 = 721 + 2048 without the
# cost model, so that the tests' small shapes take the overlap path; 3793 = 2769 + 1024 forces its fix-up path) in
# tests, sanitizers and the bench; every run goes through `timeout` (a hang fails the run with rc=124).
set -uo pipefail
out="${OUT:-/tmp/split-call}"; mkdir -p "$out"
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 ))s; }
cap() {  # a run's timeout: $1 s, or what is left of BUDGET_S (at least 5 s) if that is less
  local left=$(( ${BUDGET_S:-100000} - ($(date +%s) - t0) )); [ "$left" -lt 5 ] && left=5
  [ "$left" -lt "$1" ] && echo "$left" || echo "$1"
}
if [ "${1:-}" = stash ]; then
  mkdir -p /tmp/dk-kit && cp .anchor-kit-libs/site-libs.tar.xz /tmp/dk-kit/ && ls -la /tmp/dk-kit; echo "stash $(el)"; exit 0
fi
bd="${BD:-.gpu-gdr}"
tmp=$(mktemp -d /tmp/gdrsplit.XXXX)  # this call's binaries and test / sanitizer / ktime logs
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader >"$out/summary.txt"
mkdir -p "$tmp"/bin && tar -xJf "$bd"/bin.tar.xz -C "$tmp"/bin
xz -dc "$bd"/bench_gdr_chunk_prefill.xz >$tmp/bench_gdr_cp && chmod +x $tmp/bench_gdr_cp
rm -f /tmp/split_tests_done /tmp/split_unpack_done /tmp/split_anchor.lock; rm -rf /tmp/split_barrier
site=/tmp/anchor-site apids=()
if [ -n "${ANCHORS:-}" ]; then
  (mkdir -p "$site"
   [ -f /tmp/dk-kit/site-libs.tar.xz ] && tar -xJf /tmp/dk-kit/site-libs.tar.xz -C "$site" && echo "site-libs unpacked"
   tar -xJf .anchor-kit-py/site-py.tar.xz -C "$site" && echo "site-py unpacked"
   echo "unpack done at $(el)"; touch /tmp/split_unpack_done) >/tmp/unpack.log 2>&1 &
  libs=fi,fla; [ -f /tmp/dk-kit/site-libs.tar.xz ] || libs=fla
  shapes=(${ANCHOR_SHAPES:-tp1 tp2 9b8 9b64k})
  for shape in "${shapes[@]}"; do
    fla=""; for f in ${FLA_SHAPES:-tp1 tp2}; do [ "$f" = "$shape" ] && fla="--fla-prefill $shape"; done
    (while [ ! -f /tmp/split_unpack_done ]; do sleep 0.5; done
     PYTHONUNBUFFERED=1 PYTHONPATH="$site:$site/nvidia_cutlass_dsl/dsl_packages" timeout "${ANCHOR_TIMEOUT:-300}" \
       python3 tools/bench_anchors_gdr.py --site "$site" --out "/tmp/anchors_$shape.json" --libs "$libs" --skip-decode \
       --prefill "$shape" $fla --prepass --budget-s 280 --wait-file /tmp/split_tests_done \
       --lock-file /tmp/split_anchor.lock --barrier "/tmp/split_barrier:${#shapes[@]}" >"/tmp/anchors_$shape.txt" \
       2>"/tmp/anchors_$shape.err"; echo "rc=$?" >>"/tmp/anchors_$shape.err") & apids+=($!)
  done
fi
bin=$(ls "$tmp"/bin/gdr_chunk_prefill-* | head -n 1)
export DELTAKIT_REQUIRE_GPU=1
runenv() {  # prefill variant -> env assignments
  local a=()
  [ "$1" != - ] && a+=("DELTAKIT_GDR_PREFILL=$1")
  [ "$2" != - ] && a+=("DELTAKIT_GDR_SPLIT_VARIANT=$2")
  echo "${a[@]}"
}
pids=()
test_one() {  # label pipe var
  local t1=$(date +%s)
  env $(runenv "$2" "$3") timeout "$(cap "${TEST_TIMEOUT:-150}")" "$bin" --test-threads "${TEST_THREADS:-4}" --nocapture >"$tmp/t_$1.log" 2>&1
  echo "rc=$? wall $(( $(date +%s) - t1 ))s" >>"$tmp/t_$1.log"
}
san_one() {  # tool label pipe var (tool "test": the whole test binary, as in TEST_RUNS, in this chain)
  [ "$1" = test ] && { test_one "$2" "$3" "$4"; return; }
  local filt="gates_at_the_edge varlen_initial_states" t1=$(date +%s)
  [ "$1" = racecheck ] && filt=varlen_initial_states
  env $(runenv "$3" "$4") DELTAKIT_SANITIZE=1 timeout "$(cap "${SAN_TIMEOUT:-150}")" compute-sanitizer --tool "$1" \
    --error-exitcode 9 "$bin" $filt --test-threads 1 >"$tmp/san_$1_$2.log" 2>&1
  echo "rc=$? wall $(( $(date +%s) - t1 ))s" >>"$tmp/san_$1_$2.log"
}
truns=(${TEST_RUNS:-default:-:- ovl2769:split:2769 ovlfix3793:split:3793})
sruns=(${SAN_RUNS:-memcheck:default:-:- memcheck:ovl2769:split:2769 racecheck:ovl2769:split:2769 synccheck:ovl2769:split:2769 memcheck:ovlfix3793:split:3793 synccheck:ovlfix3793:split:3793})
if [ -n "${SERIAL:-}" ]; then
  (for r in "${truns[@]}"; do IFS=: read -r label pipe var <<<"$r"; test_one "$label" "$pipe" "$var"; done) & pids+=($!)
  (for r in "${sruns[@]}"; do IFS=: read -r tool label pipe var <<<"$r"; san_one "$tool" "$label" "$pipe" "$var"; done) & pids+=($!)
else
  for r in "${truns[@]}"; do IFS=: read -r label pipe var <<<"$r"; test_one "$label" "$pipe" "$var" & pids+=($!); done
  for r in "${sruns[@]}"; do IFS=: read -r tool label pipe var <<<"$r"; san_one "$tool" "$label" "$pipe" "$var" & pids+=($!); done
fi
for p in "${pids[@]}"; do wait "$p"; done
echo "tests + sanitizers done at $(el)" >>"$out/summary.txt"
touch /tmp/split_tests_done
for p in "${apids[@]}"; do wait "$p"; done
if [ -n "${ANCHORS:-}" ]; then
  echo "anchors done at $(el)" >>"$out/summary.txt"
  cat /tmp/unpack.log /tmp/anchors_*.err | grep -vE "^\s*$" | tail -n 40 >"$out/anchors.log"
  python3 tools/bench_anchors_gdr.py --merge /tmp/anchors_*.json >>"$out/anchors.log" 2>&1
fi
for f in $tmp/t_*.log $tmp/san_*.log; do
  [ -f "$f" ] || continue
  cat "$f" >>"$out/tests.log"
  echo "$(basename "$f"): $(tail -n 1 "$f") $(grep -hE '^test result|ERROR SUMMARY|RACECHECK SUMMARY' "$f" | tail -n 1 | sed -E 's/ 0 ignored; 0 measured;//')" >>"$out/summary.txt"
done
grep -hE "panicked|FAILED" $tmp/t_*.log | head -10 >>"$out/summary.txt"
grep -hm3 -A2 "Race reported" $tmp/san_racecheck_*.log >>"$out/summary.txt" 2>/dev/null
awk '/^case .*out_err/ { for (i = 1; i <= NF; i++) { if ($i == "out_err" && $(i+1) > mo) mo = $(i+1); if ($i == "state_err" && $(i+1) > ms) ms = $(i+1) } n++ }
     END { printf "cases %d max out_err %s max state_err %s\n", n, mo, ms }' $tmp/t_*.log >>"$out/summary.txt"
for pipe in ${PROBE_PIPES-}; do
  env $(runenv "$pipe" -) timeout 60 ncu --launch-skip 0 --launch-count 12 --metrics gpu__time_duration.sum \
    $tmp/bench_gdr_cp --bench 27b_tp1 --warm-up-time 0.05 --measurement-time 0.05 >"/tmp/ncu_$pipe.log" 2>&1
  echo "kernels under $pipe: $(grep -E 'x\([0-9]+, [0-9]+, [0-9]+\), Context' "/tmp/ncu_$pipe.log" | sed -E 's/^ +//; s/ \(.*//; s/^void //' | cut -c1-48 | sort -u | tr '\n' ' ')" >>"$out/summary.txt"
done
late() {  # BUDGET_S set and less than 15 s of it left: skip (noted in the summary)
  [ -n "${BUDGET_S:-}" ] && [ $(( $(date +%s) - t0 )) -gt $(( BUDGET_S - 15 )) ] && echo "SKIPPED $1 (budget) at $(el)" >>"$out/summary.txt"
}
for r in ${KTIME_RUNS-}; do  # "label:prefill:variant:bench-filter": ncu per-kernel GPU times of the first calls
  IFS=: read -r label pipe var filt <<<"$r"
  late "ktime $label" && continue
  env $(runenv "$pipe" "$var") timeout "$(cap 90)" ncu --launch-skip 0 --launch-count "${KTIME_COUNT:-14}" \
    --metrics gpu__time_duration.sum $tmp/bench_gdr_cp --bench "$filt" --warm-up-time 0.05 --measurement-time 0.05 \
    >"$tmp/ktime_$label.log" 2>&1
  echo "=== ktime $label ($filt)" >>"$out/summary.txt"
  grep -E 'x\([0-9]+, [0-9]+, [0-9]+\), Context|gpu__time_duration' "$tmp/ktime_$label.log" |
    sed -E 's/^ +//; s/^void //; s/\(dk::gdr_fused::SplitArgs[^)]*\)//; s/, Context.*//; s/gpu__time_duration.sum +//' |
    paste - - >>"$out/summary.txt"
done
for r in ${PROF_RUNS-}; do
  IFS=: read -r label pipe var <<<"$r"
  echo "=== prof $label" >>"$out/prof.log"
  env $(runenv "$pipe" "$var") timeout 40 $tmp/bench_gdr_cp --bench 27b_tp1 --warm-up-time 0.3 --measurement-time 0.5 2>&1 | grep -E "prof|time:" >>"$out/prof.log"
done
ba=${BENCH_ARGS:---warm-up-time 0.3 --measurement-time 1.0}
for r in ${BENCH_RUNS:-default:-:- ovl721:split:721 ovl2769:split:2769 ovlfix3793:split:3793 state152:split:152}; do
  IFS=: read -r label pipe var <<<"$r"
  late "bench $label" && continue
  echo "=== $label" >>"$out/bench.log"
  env $(runenv "$pipe" "$var") timeout "$(cap 90)" $tmp/bench_gdr_cp --bench $ba >>"$out/bench.log" 2>&1; echo "rc=$?" >>"$out/bench.log"
done
echo "bench done at $(el)" >>"$out/summary.txt"
if [ -n "${NCU_RUN:-}" ]; then
  IFS=: read -r label pipe var kre <<<"$NCU_RUN"
  env $(runenv "$pipe" "$var") timeout 120 ncu --kernel-name "regex:$kre" --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
    --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section InstructionStats \
    $tmp/bench_gdr_cp --bench 27b_tp1 --warm-up-time 0.05 --measurement-time 0.05 >"$out/ncu_$label.txt" 2>&1
  echo "ncu $label done at $(el)" >>"$out/summary.txt"
fi
[ -f "$out/prof.log" ] && cat "$out/prof.log" >>"$out/summary.txt"
[ -f "$out/anchors.log" ] && grep -E "prefill|ms" "$out/anchors.log" | tail -n 12 >>"$out/summary.txt"
if [ -f "$out/bench.log" ]; then  # table: shape x run, middle estimate in ms
  echo "bench (ms, middle of criterion's interval; runs in the order measured)" >>"$out/summary.txt"
  awk '/^=== / { run = $2; if (!(run in seen)) { seen[run] = 1; runs[++nr] = run } }
       /^gdr_chunk_prefill\// { id = $1; sub(/^gdr_chunk_prefill\//, "", id); if (!(id in sid)) { sid[id] = 1; ids[++ni] = id } }
       /time:/ && !/%/ { for (i = 1; i <= NF; i++) if ($i == "time:") { v = $(i + 3); u = $(i + 4); break }
                 gsub(/[^0-9.]/, "", v); f = (u ~ /^ns/) ? 1e-6 : (u ~ /^ms/) ? 1 : (u ~ /^s/) ? 1e3 : 1e-3
                 t[id, run] = sprintf("%.3f", v * f) }
       END { h = "| shape |"; s = "| --- |"; for (j = 1; j <= nr; j++) { h = h " " runs[j] " |"; s = s " --- |" }
             print h; print s
             for (i = 1; i <= ni; i++) { l = "| " ids[i] " |"; for (j = 1; j <= nr; j++) l = l " " ((ids[i], runs[j]) in t ? t[ids[i], runs[j]] : "-") " |"; print l } }' \
    "$out/bench.log" >>"$out/summary.txt"
fi
echo "done at $(el)" >>"$out/summary.txt"
if [ -n "${ONE_LOG:-}" ]; then  # everything in $out/log, the summary in $out/summary.txt, nothing else
  for f in "$out"/tests.log "$out"/anchors.log "$out"/prof.log "$out"/bench.log "$out"/ncu_*.txt $tmp/ktime_*.log; do
    [ -f "$f" ] || continue
    echo "##### $(basename "$f")" >>"$out/log"; cat "$f" >>"$out/log"
    case "$f" in "$out"/*) rm -f "$f" ;; esac
  done
fi
cat "$out/summary.txt"
