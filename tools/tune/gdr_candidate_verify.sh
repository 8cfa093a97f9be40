#!/usr/bin/env bash
# One device call that decides whether a gdr.chunk_prefill split variant (CAND, default 12497) can become the
# library default: the GPU tests and memcheck / racecheck under it, the kernel bench under it vs 209, and the engine's
# prefill under it vs 209 (9B 64 x 512 and 27B 16 x 512 take the short-sequence regime, 9B 1 x 8192 in one prefill
# chunk context parallelism), and context parallelism forced (6353) with both sanitizers on the one test case long
# enough for it to run. ~200 s warm. Logs to $OUT (tests.log, bench.log, engine.log, summary.txt), a table last.
# Here (the test selection must name the workspace: gpu-bundle adds the feature deltakit-engine/cuda, which
# `-p deltakit` refuses):
#   DELTAKIT_BUNDLE_DIR=.gpu-v DELTAKIT_BUNDLE_TESTS="--workspace --test gdr_chunk_prefill" \
#   DELTAKIT_BUNDLE_BENCHES="-p deltakit --bench gdr_chunk_prefill" tools/gpu-bundle
# There (carry .gpu-v): OUT=$OUT bash tools/tune/gdr_candidate_verify.sh
# Options (session 8; each a space-separated list, defaults = the session-7 form of the call):
#   TEST_VARS      variants whose whole test binary runs (default: $CAND), one at a time
#   SAN_RUNS       "tool:variant:filter[,filter...]" sanitizer runs, one at a time in a second chain beside the tests
#                  (default: memcheck + racecheck of $CAND on varlen_initial_states, gates_at_the_edge,
#                  varlen_long_sequences, ragged; memcheck + racecheck of 6353 on varlen_long_sequences)
#   SAN_TIMEOUT    per sanitizer run (default 60 s); TEST_TIMEOUT per test run (default 90 s)
#   BENCH_VARS     criterion bench per variant, alone, after the tests (default: $CAND 209)
#   ENGINE_ROWS    "config:batch:prompt:prefill_chunk" engine prefill rows (default: 9b:64:512:2048 9b:1:8192:8192
#                  27b:16:512:2048), each run once per variant of ENGINE_VARS in that order (default: $CAND 209;
#                  a variant listed twice runs twice: run-to-run noise)
#   KTIME_RUNS     "variant:bench-filter" ncu GPU time of each of the first KTIME_COUNT (4) kernel launches of that
#                  bench (chunk_offsets, chunk_map, local pass, state kernel for the plain variants), after the engine
set -uo pipefail
B=${BUNDLE:-.gpu-v}
o=$OUT; mkdir -p "$o"  # (session 12: with TEST_VARS=" " nothing else created it and the bench logs were lost)
CAND=${CAND:-12497}
t0=$(date +%s)
el() { echo "$(( $(date +%s) - t0 ))s"; }
[ -d "$B/root/tests/fixtures" ] || cp -r tests/fixtures "$B/root/tests/"
"$B/run" --bench __none__ >/dev/null 2>&1  # unpack the binaries once, before two chains use them
san_def="memcheck:$CAND:varlen_initial_states,gates_at_the_edge,varlen_long_sequences,ragged racecheck:$CAND:varlen_initial_states,gates_at_the_edge,varlen_long_sequences,ragged memcheck:6353:varlen_long_sequences racecheck:6353:varlen_long_sequences"
tmp=$(mktemp -d /tmp/gdrverify.XXXX)
( for v in ${TEST_VARS:-$CAND}; do
    t1=$(date +%s)
    DELTAKIT_GDR_SPLIT_VARIANT=$v timeout "${TEST_TIMEOUT:-90}" "$B/run" gdr_chunk_prefill >"$tmp/t_$v.log" 2>&1
    echo "tests $v: rc $? $(( $(date +%s) - t1 ))s at $(el) | $(grep -E '^test result' "$tmp/t_$v.log" | tail -n 1 | sed -E 's/ 0 ignored; 0 measured;//')" >>"$tmp/sum_t"
  done ) &
tp=$!
( i=0
  for r in ${SAN_RUNS:-$san_def}; do
    IFS=: read -r tool v filt <<<"$r"; i=$((i + 1)); t1=$(date +%s)
    # shellcheck disable=SC2086
    DELTAKIT_GDR_SPLIT_VARIANT=$v DELTAKIT_SANITIZE=1 timeout "${SAN_TIMEOUT:-60}" "$B/run" \
      --wrap "compute-sanitizer --tool $tool --error-exitcode 9" gdr_chunk_prefill -- ${filt//,/ } --test-threads 1 \
      >"$tmp/s_${i}_${tool}_$v.log" 2>&1
    echo "$tool $v ($filt): rc $? $(( $(date +%s) - t1 ))s at $(el) | $(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY' "$tmp/s_${i}_${tool}_$v.log" | tail -n 1) | tests ok: $(grep -cE '^test .* ok$' "$tmp/s_${i}_${tool}_$v.log")" >>"$tmp/sum_s"
  done ) &
sp=$!
wait $tp; wait $sp
S=()
mapfile -t -O 0 S < <(cat "$tmp/sum_t" "$tmp/sum_s" 2>/dev/null)
for f in "$tmp"/t_*.log "$tmp"/s_*.log; do [ -f "$f" ] && { echo "##### $(basename "$f")"; cat "$f"; } >>"$o/tests.log"; done
grep -hE "panicked|FAILED" "$tmp"/t_*.log | head -10 >>"$tmp/fail"
mapfile -t -O "${#S[@]}" S < <(cat "$tmp/fail")
for f in "$tmp"/s_*racecheck*.log; do
  [ -f "$f" ] && grep -q "Race reported" "$f" && S+=("$(basename "$f"): $(grep -m1 -A1 'Race reported' "$f" | tr -s ' =' ' ' | tr '\n' ' ' | cut -c1-220)")
done
printf '%s\n' "${S[@]}" >"$o/summary.txt"
for v in ${BENCH_VARS:-$CAND 209}; do
  ( export DELTAKIT_GDR_SPLIT_VARIANT=$v
    timeout 45 "$B/run" --bench gdr_chunk_prefill -- --warm-up-time 0.1 --measurement-time 0.4 ) >"$tmp/b_$v.log" 2>&1
  echo "=== $v" >>"$o/bench.log"; cat "$tmp/b_$v.log" >>"$o/bench.log"
  S+=("bench $v done $(el)")
done
for r in ${ENGINE_ROWS:-9b:64:512:2048 9b:1:8192:8192 27b:16:512:2048}; do
  IFS=: read -r cfg bat pl pc <<<"$r"
  for v in ${ENGINE_VARS:-$CAND 209}; do
    ( export DELTAKIT_GDR_SPLIT_VARIANT=$v
      timeout 35 "$B/run" --cli bench --device cuda:0 --config "tests/configs/qwen3.5-$cfg" --load-format dummy \
        --batch "$bat" --prompt-len "$pl" --prefill-chunk "$pc" --gen-len 2 ) >"$tmp/e.log" 2>&1
    echo "=== $r $v" >>"$o/engine.log"; cat "$tmp/e.log" >>"$o/engine.log"
    S+=("engine $r $v: $(grep -E '^prefill' "$tmp/e.log" | cut -d'|' -f1) $(el)")
    printf '%s\n' "${S[@]}" >"$o/summary.txt"
  done
done
for r in ${KTIME_RUNS-}; do
  IFS=: read -r v filt <<<"$r"
  bexe="$PWD/$B/bin/$(awk '$1 == "bench" && $3 ~ /^gdr_chunk_prefill-/ {print $3}' "$B/manifest.tsv" | head -n 1)"
  ( cd "$B/root" && DELTAKIT_REQUIRE_GPU=1 DELTAKIT_GDR_SPLIT_VARIANT=$v timeout 60 ncu --launch-skip 0 \
      --launch-count "${KTIME_COUNT:-4}" --metrics gpu__time_duration.sum "$bexe" --bench "$filt" --warm-up-time 0.05 \
      --measurement-time 0.05 ) >"$tmp/k.log" 2>&1
  echo "=== ktime $v $filt" >>"$o/engine.log"; cat "$tmp/k.log" >>"$o/engine.log"
  S+=("ktime $v $filt: $(grep -E 'x\([0-9]+, [0-9]+, [0-9]+\), Context|gpu__time_duration' "$tmp/k.log" |
    sed -E 's/^ +//; s/^void //; s/\(dk::gdr_fused::SplitArgs[^)]*\)//; s/, Context.*//; s/gpu__time_duration.sum +//; s/dk::gdr_fused:://' |
    paste -sd' ' | tr -s ' ' | cut -c1-300) $(el)")
done
printf '%s\n' "${S[@]}" >"$o/summary.txt"
echo "==== verify ($(el))"; printf '%s\n' "${S[@]}"
echo "==== bench (ms, middle estimate)"
awk '/^=== [0-9]+$/{v=$2} /^gdr_chunk_prefill\//{s=$1} /time:/ && s!="" {u=$5; x=$4; if (u=="µs" || u=="us") x/=1000; t[s]=t[s] sprintf(" %s=%.4f", v, x); s=""}
     END {for (k in t) print k t[k]}' "$o/bench.log" | sort
