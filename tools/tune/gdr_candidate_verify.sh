#!/usr/bin/env bash
# One device call that decides whether a gdr.chunk_prefill split variant (CAND, default 12497) can become the
# library default: the GPU tests and memcheck / racecheck under it, the kernel bench under it vs 209, and the engine's
# prefill under it vs 209 (9B 64 x 512 and 27B 16 x 512 take the short-sequence regime, 9B 1 x 8192 in one prefill
# chunk context parallelism), and context parallelism forced (6353) with both sanitizers on the one test case long
# enough for it to run. ~200 s warm. Logs to $OUT (tests.log, bench.log, engine.log, summary.txt), a table last.
# Here: DELTAKIT_BUNDLE_DIR=.gpu-v DELTAKIT_BUNDLE_TESTS="-p deltakit --test gdr_chunk_prefill" \
#   DELTAKIT_BUNDLE_BENCHES="-p deltakit --bench gdr_chunk_prefill" tools/gpu-bundle
# There (carry .gpu-v): OUT=$OUT bash tools/tune/gdr_candidate_verify.sh
set -uo pipefail
B=${BUNDLE:-.gpu-v}
o=$OUT
export DELTAKIT_GDR_SPLIT_VARIANT_CAND=${CAND:-12497}
t0=$(date +%s)
S=()
el() { echo "$(( $(date +%s) - t0 ))s"; }
[ -d "$B/root/tests/fixtures" ] || cp -r tests/fixtures "$B/root/tests/"
DELTAKIT_GDR_SPLIT_VARIANT=$DELTAKIT_GDR_SPLIT_VARIANT_CAND timeout 90 "$B/run" gdr_chunk_prefill >"$o/tests.log" 2>&1; S+=("tests cand: rc $? $(el) | $(grep -E '^test result' "$o/tests.log" | tail -n 1)")
for tool in memcheck racecheck; do
  DELTAKIT_GDR_SPLIT_VARIANT=$DELTAKIT_GDR_SPLIT_VARIANT_CAND DELTAKIT_SANITIZE=1 timeout 60 "$B/run" --wrap "compute-sanitizer --tool $tool --error-exitcode 9" gdr_chunk_prefill -- varlen_initial_states gates_at_the_edge varlen_long_sequences ragged --test-threads 1 >>"$o/tests.log" 2>&1
  S+=("$tool cand: rc $? $(el) | $(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY' "$o/tests.log" | tail -n 1)")
done
# Context parallelism forced (6353) on the one test case long enough for it to run, with both sanitizers.
DELTAKIT_GDR_SPLIT_VARIANT=6353 timeout 40 "$B/run" gdr_chunk_prefill -- varlen_long_sequences >>"$o/tests.log" 2>&1
S+=("tests 6353 long: rc $? $(el) | $(grep -E '^test result' "$o/tests.log" | tail -n 1)")
for tool in memcheck racecheck; do
  DELTAKIT_GDR_SPLIT_VARIANT=6353 DELTAKIT_SANITIZE=1 timeout 40 "$B/run" --wrap "compute-sanitizer --tool $tool --error-exitcode 9" gdr_chunk_prefill -- varlen_long_sequences >>"$o/tests.log" 2>&1
  S+=("$tool 6353 long: rc $? $(el) | $(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY' "$o/tests.log" | tail -n 1)")
done
printf '%s\n' "${S[@]}" >"$o/summary.txt"
for v in $DELTAKIT_GDR_SPLIT_VARIANT_CAND 209; do
  ( export DELTAKIT_GDR_SPLIT_VARIANT=$v
    timeout 45 "$B/run" --bench gdr_chunk_prefill -- --warm-up-time 0.1 --measurement-time 0.4 ) >"/tmp/b_$v.log" 2>&1
  echo "=== $v" >>"$o/bench.log"; cat "/tmp/b_$v.log" >>"$o/bench.log"
  S+=("bench $v done $(el)")
done
for r in "9b 64 512 2048" "9b 1 8192 8192" "27b 16 512 2048"; do
  set -- $r
  for v in $DELTAKIT_GDR_SPLIT_VARIANT_CAND 209; do
    ( export DELTAKIT_GDR_SPLIT_VARIANT=$v
      timeout 35 "$B/run" --cli bench --device cuda:0 --config "tests/configs/qwen3.5-$1" --load-format dummy \
        --batch "$2" --prompt-len "$3" --prefill-chunk "$4" --gen-len 2 ) >"/tmp/e.log" 2>&1
    echo "=== $r $v" >>"$o/engine.log"; cat /tmp/e.log >>"$o/engine.log"
    S+=("engine $r $v: $(grep -E '^prefill' /tmp/e.log | cut -d'|' -f1) $(el)")
    printf '%s\n' "${S[@]}" >"$o/summary.txt"
  done
done
echo "==== verify ($(el))"; printf '%s\n' "${S[@]}"
grep -E "^=== |^gdr_chunk_prefill/|time:" "$o/bench.log" | sed 's/  */ /g' | cut -c1-110 | head -30
