#!/usr/bin/env bash
# Device call: engine GPU tests + `deltakit bench --breakdown` at 9B/27B + ncu on the decode
# GEMMs (cuBLASLt at M = 1). Logs to $OUT; summary last.
set -uo pipefail
out="${OUT:-/tmp/engine-prof}"; mkdir -p "$out"
sum=()
for t in "graph_cuda -- --test-threads=1" "golden_cuda"; do
  timeout 240 .gpu/run $t >>"$out/tests.log" 2>&1
  sum+=("test ${t%% *}: rc $? $(grep -E '^[0-9]+ passed, [0-9]+ failed' "$out/tests.log" | tail -n 1)")
done
for r in "9b 1" "9b 16" "9b 64" "27b 1" "27b 16"; do
  set -- $r
  echo "=== $r" >>"$out/bench.log"
  timeout 150 .gpu/run --cli bench --device cuda:0 --config "tests/configs/qwen3.5-$1" --load-format dummy \
    --batch "$2" --prompt-len 512 --gen-len 64 --breakdown >>"$out/bench.log" 2>&1
  sum+=("bench $r --breakdown: rc $?")
done
timeout 200 ncu --clock-control none --set full -k 'regex:nvjet|gemv|gemm|Kernel' --launch-skip 400 --launch-count 8 \
  -o "$out/gemv" .gpu/run --cli bench --device cuda:0 --config tests/configs/qwen3.5-9b --load-format dummy \
  --batch 1 --prompt-len 16 --gen-len 8 --no-graphs >"$out/ncu.log" 2>&1
sum+=("ncu: rc $?")
ncu --import "$out/gemv.ncu-rep" --page raw --csv --metrics \
  gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes.sum,launch__grid_size,launch__block_size \
  >"$out/ncu_summary.csv" 2>&1
echo "==== engine profile run"
printf '%s\n' "${sum[@]}"
grep -E "^===|^breakdown|^  |^prefill" "$out/bench.log"
cut -c1-400 "$out/ncu_summary.csv" | head -20
