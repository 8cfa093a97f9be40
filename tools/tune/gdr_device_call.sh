#!/usr/bin/env bash
# One device call for the GDR kernels (issue 15): tests, sanitizers, the three-way anchor table
# (deltakit / FlashInfer / FLA, tools/bench_anchors_gdr.py), the decode tile sweep and an ncu profile.
# Run on the GPU host from the repository root with `.gpu-gdr` (built by tools/tune/gdr_bundle.sh) and
# `.anchor-kit` (../shared/anchor-kit) carried. Logs go to $OUT (<= 8 files); a short table prints last.
#
#   tools/tune/gdr_device_call.sh [tests] [sanitize] [anchors] [ncu] [prefill]     (default: all but prefill)
#
#   tests     the GPU test binaries in .gpu-gdr/bin (DELTAKIT_REQUIRE_GPU=1)
#   tests_wsplit  the chunk-prefill test binary again with DELTAKIT_GDR_PREFILL=wsplit (opt-in W-split path);
#             SAN_ENV=DELTAKIT_GDR_PREFILL=wsplit runs the sanitizers on that path
#   sanitize  compute-sanitizer memcheck + racecheck over the new tests of both kernels (small cases)
#   anchors   decode rows (warm + cold, tile sweep) and prefill rows (deltakit + FlashInfer; FLA where the
#             time budget allows: its Triton autotune takes ~45 s a shape)
#   ncu       ncu --set full on gdr.decode at 27B TP2 batch 16 (the shape of the tail wave)
set -uo pipefail
out="${OUT:-/tmp/gdr-call}"
mkdir -p "$out"
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(tests sanitize anchors ncu)
has() { local s; for s in "${steps[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
summary=()
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 ))s; }

# Unpack the test binaries and the anchor kit (CPU) while nothing else runs.
mkdir -p /tmp/gdrbin
tar -xJf .gpu-gdr/bin.tar.xz -C /tmp/gdrbin
site=/tmp/anchor-site
if has anchors || has ncu; then
  # The full kit (.anchor-kit, 54 MiB: FlashInfer needs the CuTe-DSL libraries) when it was carried, else
  # .anchor-kit-py (site-py.tar.xz alone, 4.6 MiB: FLA, no FlashInfer kernels) when the tree leaves no room.
  kit=.anchor-kit
  [ -f "$kit/unpack.py" ] || kit=.anchor-kit-py
  echo "anchor kit: $kit"
  (python3 "$kit/unpack.py" "$site" >"$out/unpack.log" 2>&1; echo "unpack rc=$?" >>"$out/unpack.log") &
  unpack_pid=$!
fi
export DELTAKIT_REQUIRE_GPU=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader

# Tests and sanitizers run concurrently (correctness only; the GPU has room for all of them), then
# the timed steps run alone.
pids=()
if has tests; then
  for bin in /tmp/gdrbin/*; do
    name=$(basename "$bin")
    (timeout "${TEST_TIMEOUT:-400}" "$bin" --test-threads 4 --nocapture >"/tmp/gdrlog_test_${name%%-*}.log" 2>&1
     echo "rc=$?" >>"/tmp/gdrlog_test_${name%%-*}.log") &
    pids+=($!)
  done
fi
if has tests_wsplit; then
  # The opt-in W-split chunk-prefill path (DELTAKIT_GDR_PREFILL=wsplit, K = V = 128).
  bin=$(ls /tmp/gdrbin/gdr_chunk_prefill-* | head -n 1)
  (DELTAKIT_GDR_PREFILL=wsplit timeout "${TEST_TIMEOUT:-400}" "$bin" --test-threads 4 --nocapture >/tmp/gdrlog_test_wsplit_chunk.log 2>&1
   echo "rc=$?" >>/tmp/gdrlog_test_wsplit_chunk.log) &
  pids+=($!)
fi
if has sanitize; then
  # tool:binary stem:test filters
  specs=("memcheck:gdr_chunk_prefill:${SAN_CHUNK:-gates_at_the_edge k16_every_v}"
         "memcheck:gdr_decode:${SAN_DECODE:-decode_gates_at_the_edge decode_k16}"
         "racecheck:gdr_decode:${SAN_DECODE:-decode_gates_at_the_edge decode_k16}"
         "racecheck:gdr_chunk_prefill:${SAN_CHUNK_RACE:-k16_every_v}")
  for spec in "${specs[@]}"; do
    tool=${spec%%:*}; rest=${spec#*:}; stem=${rest%%:*}; filters=${rest#*:}
    bin=$(ls /tmp/gdrbin/${stem}-* | head -n 1)
    (env ${SAN_ENV:-} DELTAKIT_SANITIZE=1 timeout "${SAN_TIMEOUT:-300}" compute-sanitizer --tool "$tool" --error-exitcode 9 "$bin" $filters --test-threads 1 \
       >"/tmp/gdrlog_san_${tool}_${stem}.log" 2>&1; echo "rc=$?" >>"/tmp/gdrlog_san_${tool}_${stem}.log") &
    pids+=($!)
  done
fi
for p in "${pids[@]}"; do wait "$p"; done
for f in /tmp/gdrlog_test_*.log; do
  [ -f "$f" ] || continue
  echo "=== $f" >>"$out/tests.log"; cat "$f" >>"$out/tests.log"
  summary+=("$(basename "$f" .log): $(tail -n 1 "$f") $(grep -E '^test result' "$f" | tail -n 1)")
done
for f in /tmp/gdrlog_san_*.log; do
  [ -f "$f" ] || continue
  echo "=== $f" >>"$out/sanitize.log"; cat "$f" >>"$out/sanitize.log"
  summary+=("$(basename "$f" .log): $(tail -n 1 "$f") $(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY' "$f" | tail -n 1)")
done
summary+=("tests + sanitizers done at $(el)")

if has anchors || has ncu; then
  wait "$unpack_pid"
  tail -n 1 "$out/unpack.log"
  export PYTHONPATH="$site:$site/nvidia_cutlass_dsl/dsl_packages"
fi

if has anchors; then
  pre=""
  has prefill || pre="--skip-prefill"
  PYTHONUNBUFFERED=1 timeout "${ANCHOR_TIMEOUT:-420}" python3 tools/bench_anchors_gdr.py --site "$site" --lib .gpu-gdr/libdk_gdr_decode.so \
    --out "$out/anchors.json" --sweep --budget-s "${ANCHOR_BUDGET_S:-150}" ${PREFILL_ARGS:-} $pre \
    --libs "${ANCHOR_LIBS:-dk,fi,fla}" \
    >"$out/anchors.txt" 2>"$out/anchors.err"
  summary+=("anchors: rc=$? at $(el)")
fi

if has ncu_state; then
  PYTHONUNBUFFERED=1 timeout 150 ncu --clock-control none -k regex:gdr_chunk_state --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
    --section MemoryWorkloadAnalysis --page details python3 tools/bench_anchors_gdr.py --lib .gpu-gdr/libdk_gdr_decode.so \
    --out /tmp/ncu2.json --libs dk --skip-decode --prefill tp1 --warmup 0 --reps 1 >"$out/ncu_state.log" 2>&1
  summary+=("ncu state pass: rc=$? at $(el)")
fi

if has ncu; then
  PYTHONUNBUFFERED=1 timeout 200 ncu --set full --clock-control none -k regex:decode_kernel --launch-skip 5 --launch-count 1 \
    -o "$out/ncu_decode_tp2_b16" python3 tools/bench_anchors_gdr.py --site "$site" --lib .gpu-gdr/libdk_gdr_decode.so \
    --out /tmp/ncu.json --libs dk --skip-prefill --only "TP2 8/24 B=16" --warmup 1 --reps 2 >"$out/ncu.log" 2>&1
  summary+=("ncu decode: rc=$? at $(el)")
  ncu --import "$out/ncu_decode_tp2_b16.ncu-rep" --page details --section SpeedOfLight --section Occupancy \
    --section LaunchStats --section MemoryWorkloadAnalysis 2>/dev/null | grep -E "Duration|Throughput|Registers|Occupancy|Block Size|Grid Size|Waves|Bandwidth" | head -30 >>"$out/ncu.log"
fi

echo "==== gdr device call summary ($(el); logs in $out)"
printf '%s\n' "${summary[@]}"
grep -hE "MAXERR|panicked|FAILED|^case (long|ragged|varlen ==|precomputed|split)" "$out/tests.log" 2>/dev/null | head -40
awk '/^case .*out_err/ { for (i = 1; i <= NF; i++) { if ($i == "out_err" && $(i+1) > mo) mo = $(i+1); if ($i == "state_err" && $(i+1) > ms) ms = $(i+1) } n++ }
     END { printf "chunk_prefill cases: %d, max out_err %s, max state_err %s\n", n, mo, ms }' "$out/tests.log" 2>/dev/null
grep -E "Duration|DRAM Throughput|Memory Throughput|Registers|Achieved Occupancy|Waves" "$out/ncu.log" 2>/dev/null | head -12
grep -E "Duration|DRAM Throughput|Compute \(SM\)|Registers Per|Achieved Occupancy|Waves Per|No Eligible|Issued Warp|Warp Cycles Per Issued|Stall" "$out/ncu_state.log" 2>/dev/null | head -16
cat "$out/anchors.txt" 2>/dev/null | tail -n 40
