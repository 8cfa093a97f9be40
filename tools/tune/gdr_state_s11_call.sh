#!/usr/bin/env bash
# gdr-state (session 11): ONE device call deciding the split state kernel's opt-in variants 20934865 (= 4157649 +
# 16777216: the staged output tile's global stores deferred to the next chunk, under its X group) and 54489297
# (= 20934865 + 33554432: and the X / S Q^T product as two groups, s1's hi / lo split under the first) against the
# library default 4157649 (csrc/gdr/chunk_prefill_fused_sm90.cu split_wg_kernel kDeferO / kS2G).
#  1. criterion bench, interleaved A B C A B C (4157649 / 54489297 / 20934865), the 4 shapes of
#     benches/gdr_chunk_prefill.rs, DELTAKIT_GDR_ROUTE_LOG=1 on the first pass (routes taken);
#  2. tests/gdr_chunk_prefill.rs (whole binary) under each candidate, beside compute-sanitizer memcheck / racecheck
#     runs on the long / pair / context-parallel routing tests (two chains);
#  3. ncu (SpeedOfLight + WarpStateStats) of the state kernel at 27B TP1 (single) and 9B 8 x 8192 (pair), default vs
#     54489297, if time is left (DEADLINE seconds since the start).
# Here:  DELTAKIT_BUNDLE_DIR=.gpu-gdrstate DELTAKIT_BUNDLE_TESTS="--workspace --test gdr_chunk_prefill" \
#          DELTAKIT_BUNDLE_BENCHES="-p deltakit --bench gdr_chunk_prefill" tools/gpu-bundle
# There (carry .gpu-gdrstate): OUT=$OUT bash tools/tune/gdr_state_s11_call.sh
set -uo pipefail
B=${BUNDLE:-.gpu-gdrstate}
o=$OUT
D=4157649 C1=20934865 C2=54489297
DEADLINE=${DEADLINE:-230}
if [ "${CALL:-1}" = 2 ]; then  # call 2: 71266513 (the deferred store on the pair route only) = C1, 104820945 (+ the
  C1=71266513 C2=104820945   # single / context-parallel routes with two X groups) = C2; three bench passes
fi
PASSES=${PASSES:-2}
t0=$(date +%s)
el() { echo "$(( $(date +%s) - t0 ))"; }
[ -e "$B/root/tests" ] || ln -s "$PWD/tests" "$B/root/tests"
"$B/run" --bench __none__ >/dev/null 2>&1  # unpack once
bexe="$PWD/$B/bin/$(awk '$1 == "bench" && $3 ~ /^gdr_chunk_prefill-/ {print $3}' "$B/manifest.tsv" | head -n 1)"
texe="$PWD/$B/bin/$(awk '$1 == "test" && $3 ~ /^gdr_chunk_prefill-/ {print $3}' "$B/manifest.tsv" | head -n 1)"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader >"$o/summary.txt" 2>&1
export DELTAKIT_REQUIRE_GPU=1
# 1. bench
for r in $(seq "$PASSES"); do
  for v in $D $C2 $C1; do
    ( cd "$B/root" && DELTAKIT_GDR_SPLIT_VARIANT=$v DELTAKIT_GDR_ROUTE_LOG=$([ $r = 1 ] && echo 1 || echo 0) \
        timeout 45 "$bexe" --bench --warm-up-time 0.1 --measurement-time 0.4 ) >/tmp/b.log 2>/tmp/r.log
    echo "=== $v pass $r rc $? at $(el)s" >>"$o/bench.log"
    grep -E "^gdr_chunk_prefill/|time:" /tmp/b.log >>"$o/bench.log"
    [ "$r" = 1 ] && { echo "routes $v:"; sort /tmp/r.log | uniq -c | sort -rn | head -6; } >>"$o/routes.txt"
  done
done
echo "bench done at $(el)s" >>"$o/summary.txt"
# 2. tests + sanitizers (two chains)
( for v in $C2 $C1; do
    t1=$(date +%s)
    ( cd "$B/root" && DELTAKIT_GDR_SPLIT_VARIANT=$v timeout 100 "$texe" --test-threads 2 ) >/tmp/t_$v.log 2>&1
    echo "tests $v: rc $? $(( $(date +%s) - t1 ))s | $(grep -E '^test result' /tmp/t_$v.log | tail -n 1)" >>/tmp/sum_t
    grep -hE "panicked|FAILED" /tmp/t_$v.log | head -5 >>/tmp/sum_t
  done ) &
tp=$!
( for r in memcheck:$C2:default_routes,varlen_long,varlen_initial_states racecheck:$C2:default_routes,varlen_long \
           racecheck:$C1:default_routes racecheck:$C2:varlen_initial_states,ragged; do
    IFS=: read -r tool v filt <<<"$r"
    [ "$(el)" -gt $((DEADLINE - 40)) ] && { echo "$tool $v ($filt): skipped (time)" >>/tmp/sum_s; continue; }
    t1=$(date +%s)
    # shellcheck disable=SC2086
    ( cd "$B/root" && DELTAKIT_GDR_SPLIT_VARIANT=$v DELTAKIT_SANITIZE=1 timeout 70 compute-sanitizer --tool "$tool" \
        --error-exitcode 9 "$texe" ${filt//,/ } --test-threads 1 ) >/tmp/s_${tool}_$v.log 2>&1
    echo "$tool $v ($filt): rc $? $(( $(date +%s) - t1 ))s | $(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/s_${tool}_$v.log | tail -n 1) | ok $(grep -cE '^test .* ok$' /tmp/s_${tool}_$v.log)" >>/tmp/sum_s
    grep -m2 -A2 "Race reported\|Invalid" /tmp/s_${tool}_$v.log >>/tmp/sum_s
  done ) &
sp=$!
wait $tp; wait $sp
cat /tmp/sum_t /tmp/sum_s >>"$o/summary.txt"
for f in /tmp/t_*.log /tmp/s_*.log; do echo "##### $f"; tail -n 40 "$f"; done >"$o/tests.log" 2>&1
echo "tests done at $(el)s" >>"$o/summary.txt"
# 3. ncu of the state kernel
for sv in ${NCU_RUNS:-"27b_tp1:$D" "27b_tp1:$C2" "9b_16x32/8x8192:$D" "9b_16x32/8x8192:$C2"}; do
  IFS=: read -r shp v <<<"$sv"
  [ "$(el)" -gt $((DEADLINE - 15)) ] && { echo "ncu $shp $v skipped (time)" >>"$o/summary.txt"; continue; }
  ( cd "$B/root" && DELTAKIT_GDR_SPLIT_VARIANT=$v timeout 30 ncu --kernel-name regex:split_wg_kernel --launch-count 1 \
      --section SpeedOfLight --section WarpStateStats --section InstructionStats "$bexe" --bench "$shp" \
      --warm-up-time 0.02 --measurement-time 0.02 ) >/tmp/n.log 2>&1
  { echo "######## $shp $v rc $?"; grep -E "split_wg_kernel|Elapsed Cycles|Duration|SM Active Cycles|Compute \(SM\)|Issue Slots|Executed Instructions |Warp Cycles Per Issued|Stall" /tmp/n.log | head -20; } >>"$o/ncu.txt"
done
echo "all done at $(el)s" >>"$o/summary.txt"
echo "==== bench (ms, middle estimate, in run order)"
awk '/^=== /{v=$2} /^gdr_chunk_prefill\//{s=$1} /time:/ && s!="" {u=$5; x=$4; if (u=="µs" || u=="us") x/=1000; t[s]=t[s] sprintf(" %s=%.4f", v, x); s=""}
     END {for (k in t) print k t[k]}' "$o/bench.log" | sort | tee "$o/table.txt"
cat "$o/routes.txt"; cat "$o/summary.txt"; grep -E "######|Elapsed Cycles|Duration" "$o/ncu.txt" 2>/dev/null
