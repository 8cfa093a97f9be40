#!/usr/bin/env bash
# Second, short device call of the session-9 racecheck work (after gdr_race_call.sh, whose whole-binary racecheck runs
# got through 5 of the 18 GPU tests in 105 s): racecheck of CAND (default 94417) over the REST of the
# gdr_chunk_prefill binary, one compute-sanitizer process per group of tests, all in parallel, --test-threads 1,
# DELTAKIT_SANITIZE=1, route log on. The three big sweeps (qwen shapes, heads per rank, the int64 sequence) check only
# the state kernels (--kernel-name kns=split_wg_kernel: the kernels this variant changes); the other groups every
# kernel. If compute-sanitizer refuses the filter option (rc != 0 within 5 s), that group reruns without it.
# There (carry .gpu-race): OUT=$OUT bash tools/tune/gdr_race_rest.sh
set -uo pipefail
B=${BUNDLE:-.gpu-race}
o=$OUT
CAND=${CAND:-94417}
t0=$(date +%s)
el() { echo "$(( $(date +%s) - t0 ))s"; }
[ -d "$B/root/tests/fixtures" ] || cp -r tests/fixtures "$B/root/tests/"
"$B/run" --bench __none__ >/dev/null 2>&1
grp() {  # name kernel-filter(or -) tests...
  local n=$1 kf=$2; shift 2
  local opt=""; [ "$kf" != "-" ] && opt="--kernel-name $kf"
  local t1; t1=$(date +%s)
  DELTAKIT_GDR_ROUTE_LOG=1 DELTAKIT_GDR_SPLIT_VARIANT=$CAND DELTAKIT_SANITIZE=1 timeout "${SAN_TIMEOUT:-70}" "$B/run" \
    --wrap "compute-sanitizer --tool racecheck $opt --error-exitcode 9" gdr_chunk_prefill -- "$@" --test-threads 1 \
    >"$o/r_$n.log" 2>&1
  local rc=$?
  if [ $rc -ne 0 ] && [ $(( $(date +%s) - t1 )) -lt 5 ] && [ -n "$opt" ]; then
    echo "filter refused (rc $rc), rerun without" >>"$o/notes.txt"
    DELTAKIT_GDR_ROUTE_LOG=1 DELTAKIT_GDR_SPLIT_VARIANT=$CAND DELTAKIT_SANITIZE=1 timeout "${SAN_TIMEOUT:-70}" "$B/run" \
      --wrap "compute-sanitizer --tool racecheck --error-exitcode 9" gdr_chunk_prefill -- "$@" --test-threads 1 \
      >"$o/r_$n.log" 2>&1
    rc=$?
  fi
  echo "rc $rc at $(el) filter $kf" >>"$o/r_$n.log"
}
grp varlen - varlen_initial_states varlen_long_sequences varlen_equals ragged &
grp misc - precomputed split_prefill strided rejects &
grp triton - k16_every small_head_dims &
grp qwen kns=split_wg_kernel qwen_shapes &
grp heads kns=split_wg_kernel heads_per_rank &
grp int64 kns=split_wg_kernel long_sequence_int64 &
wait
routes() {
  grep -oE 'dk gdr route: [a-z0-9 ]+ split_wg_kernel<[0-9]+>' "$1" | sed -E 's/dk gdr route: //; s/ split_wg_kernel//' |
    sort | uniq -c | awk '{c=$1; $1=""; printf "%s=%d ", substr($0, 2), c}'
}
echo "==== race rest ($(el))"
for f in "$o"/r_*.log; do
  echo "$(basename "$f" .log): $(tail -n 1 "$f") | $(grep -hE 'passed, .* failed' "$f" | tail -n 1) | $(grep -hE 'RACECHECK SUMMARY' "$f" | tail -n 1) | ok $(grep -cE '^test .* ok$' "$f") FAILED $(grep -cE '^test .* FAILED$' "$f") | $(routes "$f")"
  grep -m1 -A1 "Race reported" "$f" | tr -s ' =' ' ' | tr '\n' ' ' | cut -c1-240
done | tee "$o/summary.txt"
cat "$o/notes.txt" 2>/dev/null
