#!/usr/bin/env bash
# One device call that decides whether CAND (default 94417 = 28881 + the mbarrier stage release in every state
# kernel) can replace BASE (default 28881) as the gdr.chunk_prefill split default (session 9, racecheck item of
# issue 15): (1) the criterion bench alone on the idle GPU, BASE / CAND alternated BENCH_ROUNDS (2) times;
# (2) in parallel: the whole gdr_chunk_prefill test binary under CAND, and compute-sanitizer racecheck + memcheck of
# the whole binary under CAND and under BASE (DELTAKIT_SANITIZE=1: the ragged test repeats 5 times, not 100).
# Every run sets DELTAKIT_GDR_ROUTE_LOG=1, so each log counts the state kernels launched per route (single / pair /
# cp pass 1 / cp pass 3, by template variant). Logs to $OUT (bench.log, t_*.log, s_*.log, summary.txt), a table last.
# Here: DELTAKIT_BUNDLE_DIR=.gpu-race DELTAKIT_BUNDLE_TESTS="--workspace --test gdr_chunk_prefill" \
#         DELTAKIT_BUNDLE_BENCHES="-p deltakit --bench gdr_chunk_prefill" tools/gpu-bundle
# There (carry .gpu-race): OUT=$OUT bash tools/tune/gdr_race_call.sh
set -uo pipefail
B=${BUNDLE:-.gpu-race}
o=$OUT
CAND=${CAND:-94417}
BASE=${BASE:-28881}
t0=$(date +%s)
el() { echo "$(( $(date +%s) - t0 ))s"; }
[ -d "$B/root/tests/fixtures" ] || cp -r tests/fixtures "$B/root/tests/"
"$B/run" --bench __none__ >/dev/null 2>&1  # unpack the binaries once
S=()
# (1) bench, alone on the GPU
for r in $(seq 1 "${BENCH_ROUNDS:-2}"); do
  for v in $BASE $CAND; do
    ( export DELTAKIT_GDR_SPLIT_VARIANT=$v
      timeout 45 "$B/run" --bench gdr_chunk_prefill -- --warm-up-time 0.1 --measurement-time 0.4 ) >"$o/b.tmp" 2>&1
    { echo "=== $v round $r"; cat "$o/b.tmp"; } >>"$o/bench.log"
  done
done
rm -f "$o/b.tmp"
S+=("bench done $(el)")
# (2) tests + sanitizers, in parallel
run_t() {  # variant
  DELTAKIT_GDR_ROUTE_LOG=1 DELTAKIT_GDR_SPLIT_VARIANT=$1 timeout "${TEST_TIMEOUT:-110}" "$B/run" gdr_chunk_prefill \
    >"$o/t_$1.log" 2>&1
  echo "rc $? at $(el)" >>"$o/t_$1.log"
}
run_s() {  # tool variant
  DELTAKIT_GDR_ROUTE_LOG=1 DELTAKIT_GDR_SPLIT_VARIANT=$2 DELTAKIT_SANITIZE=1 timeout "${SAN_TIMEOUT:-115}" "$B/run" \
    --wrap "compute-sanitizer --tool $1 --error-exitcode 9" gdr_chunk_prefill -- --test-threads 1 >"$o/s_$1_$2.log" 2>&1
  echo "rc $? at $(el)" >>"$o/s_$1_$2.log"
}
run_t "$CAND" &
for v in $CAND $BASE; do run_s racecheck "$v" & run_s memcheck "$v" & done
wait
routes() {  # log -> "route<variant> count ..."
  grep -oE 'dk gdr route: [a-z0-9 ]+ split_wg_kernel<[0-9]+>' "$1" | sed -E 's/dk gdr route: //; s/ split_wg_kernel//' |
    sort | uniq -c | awk '{c=$1; $1=""; printf "%s=%d ", substr($0, 2), c}'
}
for f in "$o/t_$CAND.log" "$o"/s_*.log; do
  [ -f "$f" ] || continue
  S+=("$(basename "$f" .log): $(tail -n 1 "$f") | $(grep -hE '^test result|passed, .* failed' "$f" | tail -n 1 | cut -c1-90) | $(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY' "$f" | tail -n 1) | tests ok $(grep -cE '^test .* ok$' "$f") FAILED $(grep -cE '^test .* FAILED$' "$f") | $(routes "$f")")
  grep -q "Race reported" "$f" && S+=("  $(grep -m1 -A1 'Race reported' "$f" | tr -s ' =' ' ' | tr '\n' ' ' | cut -c1-240)")
done
grep -hE "panicked" "$o"/t_*.log "$o"/s_*.log 2>/dev/null | head -5 | while read -r l; do echo "  $l"; done >>"$o/fail.txt"
printf '%s\n' "${S[@]}" >"$o/summary.txt"
cat "$o/fail.txt" >>"$o/summary.txt" 2>/dev/null
echo "==== race call ($(el))"; cat "$o/summary.txt"
echo "==== bench (ms, middle estimate; per variant in run order)"
awk '/^=== [0-9]+ round/{v=$2} /^gdr_chunk_prefill\//{s=$1} /time:/ && s!="" {u=$5; x=$4; if (u=="µs" || u=="us") x/=1000; t[s]=t[s] sprintf(" %s=%.4f", v, x); s=""}
     END {for (k in t) print k t[k]}' "$o/bench.log" | sort
