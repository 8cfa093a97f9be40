#!/usr/bin/env bash
# gdr-state (session 12): ONE device call deciding the pair state CTA's ping-pong (split_wg_kernel kPP, variant bit
# 134217728): P = 218067153 (= the default 83849425 + 134217728) against D = 83849425.
#  1. criterion bench, interleaved D P D P (PASSES), the 4 shapes of benches/gdr_chunk_prefill.rs,
#     DELTAKIT_GDR_ROUTE_LOG=1 on the first pass (routes taken; P's pair kernel is <153165968>);
#  2. tests/gdr_chunk_prefill.rs (whole binary) under P, beside compute-sanitizer memcheck / racecheck under P on the
#     pair routing test (default_routes_pair_and_context_parallel) and racecheck on the ragged batch (also the pair);
#  3. ncu (SpeedOfLight + WarpStateStats) of the pair state kernel at 9B 8 x 8192, D vs P.
# Here:  DELTAKIT_BUNDLE_DIR=.gpu-gdrstate DELTAKIT_BUNDLE_TESTS="--workspace --test gdr_chunk_prefill" \
#          DELTAKIT_BUNDLE_BENCHES="-p deltakit --bench gdr_chunk_prefill" tools/gpu-bundle
# There (carry .gpu-gdrstate): OUT=$OUT bash .gpu-gdrstate/call.sh  (this file)
set -uo pipefail
B=${BUNDLE:-.gpu-gdrstate}
o=$OUT
D=${D:-83849425} P=${P:-218067153}
DEADLINE=${DEADLINE:-200}
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
  for v in $D $P; do
    ( cd "$B/root" && DELTAKIT_GDR_SPLIT_VARIANT=$v DELTAKIT_GDR_ROUTE_LOG=$([ $r = 1 ] && echo 1 || echo 0) \
        timeout 45 "$bexe" --bench --warm-up-time 0.1 --measurement-time 0.4 ) >/tmp/b.log 2>/tmp/r.log
    echo "=== $v pass $r rc $? at $(el)s" >>"$o/bench.log"
    grep -E "^gdr_chunk_prefill/|time:" /tmp/b.log >>"$o/bench.log"
    [ "$r" = 1 ] && { echo "routes $v:"; sort /tmp/r.log | uniq -c | sort -rn | head -6; } >>"$o/routes.txt"
  done
done
echo "bench done at $(el)s" >>"$o/summary.txt"
# 2. tests + sanitizers (two chains)
( t1=$(date +%s)
  ( cd "$B/root" && DELTAKIT_GDR_SPLIT_VARIANT=$P DELTAKIT_GDR_ROUTE_LOG=1 timeout 110 "$texe" --test-threads 2 ) >/tmp/t_$P.log 2>&1
  echo "tests $P: rc $? $(( $(date +%s) - t1 ))s | $(grep -E '^test result' /tmp/t_$P.log | tail -n 1)" >>/tmp/sum_t
  grep -hE "panicked|FAILED" /tmp/t_$P.log | head -5 >>/tmp/sum_t
  echo "test routes: $(grep -o 'pair split_wg_kernel<[0-9]*>' /tmp/t_$P.log | sort | uniq -c | tr '\n' ' ')" >>/tmp/sum_t
) &
tp=$!
( for r in memcheck:$P:default_routes racecheck:$P:default_routes racecheck:$P:ragged; do
    IFS=: read -r tool v filt <<<"$r"
    [ "$(el)" -gt $((DEADLINE - 50)) ] && { echo "$tool $v ($filt): skipped (time)" >>/tmp/sum_s; continue; }
    t1=$(date +%s)
    # shellcheck disable=SC2086
    ( cd "$B/root" && DELTAKIT_GDR_SPLIT_VARIANT=$v DELTAKIT_SANITIZE=1 DELTAKIT_GDR_ROUTE_LOG=1 timeout 80 \
        compute-sanitizer --tool "$tool" --error-exitcode 9 "$texe" ${filt//,/ } --test-threads 1 ) >/tmp/s_${tool}_$filt.log 2>&1
    echo "$tool $v ($filt): rc $? $(( $(date +%s) - t1 ))s | $(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/s_${tool}_$filt.log | tail -n 1) | ok $(grep -cE '^test .* ok$' /tmp/s_${tool}_$filt.log) | $(grep -o 'pair split_wg_kernel<[0-9]*>' /tmp/s_${tool}_$filt.log | sort | uniq -c | tr '\n' ' ')" >>/tmp/sum_s
    grep -m2 -A2 "Race reported\|Invalid" /tmp/s_${tool}_$filt.log >>/tmp/sum_s
  done ) &
sp=$!
wait $tp; wait $sp
cat /tmp/sum_t /tmp/sum_s >>"$o/summary.txt"
for f in /tmp/t_*.log /tmp/s_*.log; do echo "##### $f"; grep -v "dk gdr route" "$f" | tail -n 30; done >"$o/tests.log" 2>&1
echo "tests done at $(el)s" >>"$o/summary.txt"
# 3. ncu of the pair state kernel
for sv in ${NCU_RUNS:-"9b_16x32/8x8192:$D" "9b_16x32/8x8192:$P"}; do
  IFS=: read -r shp v <<<"$sv"
  [ "$(el)" -gt $((DEADLINE - 15)) ] && { echo "ncu $shp $v skipped (time)" >>"$o/summary.txt"; continue; }
  ( cd "$B/root" && DELTAKIT_GDR_SPLIT_VARIANT=$v timeout 30 ncu --kernel-name regex:split_wg_kernel --launch-count 1 \
      --section SpeedOfLight --section WarpStateStats "$bexe" --bench "$shp" \
      --warm-up-time 0.02 --measurement-time 0.02 ) >/tmp/n.log 2>&1
  { echo "######## $shp $v rc $?"; grep -E "split_wg_kernel|Elapsed Cycles|Duration|SM Active Cycles|Compute \(SM\)|Memory Throughput|Issue Slots|Warp Cycles Per Issued|Stall" /tmp/n.log | head -20; } >>"$o/ncu.txt"
done
echo "all done at $(el)s" >>"$o/summary.txt"
echo "==== bench (ms, middle estimate, in run order)"
awk '/^=== /{v=$2} /^gdr_chunk_prefill\//{s=$1} /time:/ && s!="" {u=$5; x=$4; if (u=="µs" || u=="us") x/=1000; t[s]=t[s] sprintf(" %s=%.4f", v, x); s=""}
     END {for (k in t) print k t[k]}' "$o/bench.log" | sort | tee "$o/table.txt"
cat "$o/routes.txt"; cat "$o/summary.txt"; grep -E "######|Elapsed Cycles|Duration" "$o/ncu.txt" 2>/dev/null
