#!/usr/bin/env bash
# Device calls for the GDR / conv1d / norm kernels (issue 15): tests, sanitizers, the three-way prefill table
# (deltakit / FlashInfer / FLA, tools/bench_anchors_gdr.py) and the streaming-op bandwidth table.
# Run on the GPU host from the repository root with `.gpu-gdr` (tools/tune/gdr_bundle.sh) carried. Logs go to $OUT
# (<= 8 files); a short table prints last.
#
# The anchor kit (../shared/anchor-kit, 54 MiB) does not fit beside the ~13 MB tree in one call (64 MiB), so it
# travels in two calls to one warm machine:
#   call 1: carry .anchor-kit-libs (site-libs.tar.xz, 49.5 MiB):  bash tools/tune/gdr_device_call.sh stash
#           (copies it to /tmp/dk-kit, which outlives the call while the machine stays warm, ~30 s)
#   call 2: carry .gpu-gdr and .anchor-kit-py (site-py.tar.xz + unpack.py + MANIFEST.sha256), at once:
#           bash tools/tune/gdr_device_call.sh tests pipes sanitize anchors streaming
#           (FlashInfer only if /tmp/dk-kit/site-libs.tar.xz is there; FLA needs site-py alone)
#
#   stash      see above
#   tests      the GPU test binaries in .gpu-gdr/bin (DELTAKIT_REQUIRE_GPU=1)
#   pipes      the chunk-prefill test binary again under DELTAKIT_GDR_PREFILL=$PIPES (default: f32w sm90 --
#              the round-1 entries and the opt-in sm_90a CUDA state pass; the int64 test only under wsplit / sm90 /
#              split)
#   sanitize   compute-sanitizer memcheck / racecheck (SAN_SPECS: ;-separated tool:binary:DELTAKIT_GDR_PREFILL:filters)
#   anchors    one harness process per prefill shape ($PREFILL_SHAPES), each: first calls (FlashInfer compile, FLA
#              autotune for $FLA_SHAPES) while the tests run, then -- after the tests, one process at a time
#              (flock, after every process's first calls: --barrier) -- deltakit (library default + variants, AOT
#              cubins), FlashInfer, FLA timed; HARNESS_ARGS are added (e.g. --sm90-state)
#   streaming  conv1d / norm bandwidth vs the copy ceiling (in its own process, timed under the same lock)
#   decode     gdr.decode rows (warm + cold, 27B TP1 / TP2, batch 1..256) + the tile sweep, same lock
#   ncu        ncu --set full on gdr.decode at 27B TP2 batch 16
#   benchpipes the criterion bench of gdr.chunk_prefill (.gpu-gdr/bench_gdr_chunk_prefill.xz, GDR_BUNDLE_BENCH=1)
#              once per DELTAKIT_GDR_PREFILL in $BENCH_PIPES (default: wsplit_splitz split), after the tests, alone
set -uo pipefail
out="${OUT:-/tmp/gdr-call}"
mkdir -p "$out"
steps=("$@")
has() { local s; for s in "${steps[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
summary=()
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 ))s; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader

if has stash; then
  mkdir -p /tmp/dk-kit
  cp .anchor-kit-libs/site-libs.tar.xz /tmp/dk-kit/ && ls -la /tmp/dk-kit
  echo "stash done at $(el)"
  exit 0
fi

mkdir -p /tmp/gdrbin
tar -xJf .gpu-gdr/bin.tar.xz -C /tmp/gdrbin
rm -f /tmp/gdr_tests_done /tmp/gdr_unpack_done /tmp/gdr_anchor.lock
site=/tmp/anchor-site
if has anchors || has decode; then
  # site-py (FLA, FlashInfer's Python) from the carried .anchor-kit-py; site-libs (CuTe-DSL libraries) from call 1.
  (mkdir -p "$site"
   [ -f /tmp/dk-kit/site-libs.tar.xz ] && tar -xJf /tmp/dk-kit/site-libs.tar.xz -C "$site" && echo "site-libs unpacked"
   tar -xJf .anchor-kit-py/site-py.tar.xz -C "$site" && echo "site-py unpacked"
   (cd "$site" && sha256sum -c "$OLDPWD/.anchor-kit-py/MANIFEST.sha256") 2>&1
   echo "unpack done at $(el)"; touch /tmp/gdr_unpack_done) >"$out/unpack.log" 2>&1 &
fi
export DELTAKIT_REQUIRE_GPU=1

# Harness processes start now (their first calls compile on the CPU while the tests run) and time after the tests.
apids=()
if has anchors || has streaming || has decode; then
  libs="${ANCHOR_LIBS:-dk,fi,fla}"
  [ -f /tmp/dk-kit/site-libs.tar.xz ] || libs="${libs/fi,/}"
  hpy() {  # name, wait-for-the-kit (0/1), args..: one harness process
    local name=$1 kit=$2; shift 2
    (while [ "$kit" = 1 ] && [ ! -f /tmp/gdr_unpack_done ]; do sleep 0.5; done
     PYTHONUNBUFFERED=1 PYTHONPATH="$site:$site/nvidia_cutlass_dsl/dsl_packages" timeout "${ANCHOR_TIMEOUT:-420}" \
       python3 tools/bench_anchors_gdr.py --site "$site" --out "/tmp/anchors_$name.json" \
       --wait-file /tmp/gdr_tests_done --lock-file /tmp/gdr_anchor.lock --barrier "/tmp/gdr_barrier:$nproc_h" "$@" >"/tmp/anchors_$name.txt" 2>"/tmp/anchors_$name.err"
     echo "rc=$?" >>"/tmp/anchors_$name.err") &
    apids+=($!)
  }
  nproc_h=0
  has anchors && for shape in ${PREFILL_SHAPES:-tp1 tp2 9b64k 9b8}; do nproc_h=$((nproc_h + 1)); done
  has streaming && nproc_h=$((nproc_h + 1))
  has decode && nproc_h=$((nproc_h + 1))
  rm -rf /tmp/gdr_barrier
  if has anchors; then
    for shape in ${PREFILL_SHAPES:-tp1 tp2 9b64k 9b8}; do
      fla=""
      for f in ${FLA_SHAPES:-tp1 tp2}; do [ "$f" = "$shape" ] && fla="--fla-prefill $shape"; done
      hpy "$shape" 1 --libs "$libs" --prefill "$shape" --prefill-variants --prepass $fla --budget-s 400 --skip-decode \
        ${HARNESS_ARGS:-}
    done
  fi
  # gdr.decode rows (warm + cold) and the tile sweep (tools/tune/gdr_decode_lib.cu), as before this session.
  has decode && hpy decode 1 --libs "$libs" --lib .gpu-gdr/libdk_gdr_decode.so --skip-prefill --sweep --budget-s 400 \
    ${DECODE_ARGS:-}
  has streaming && hpy streaming 0 --skip-decode --libs dk --skip-prefill --streaming --budget-s 400
fi

# Tests and sanitizers run concurrently (correctness only), then the harness processes time one at a time.
pids=()
if has tests; then
  for bin in /tmp/gdrbin/*; do
    name=$(basename "$bin")
    (timeout "${TEST_TIMEOUT:-200}" "$bin" --test-threads 4 --nocapture >"/tmp/gdrlog_test_${name%%-*}.log" 2>&1
     echo "rc=$?" >>"/tmp/gdrlog_test_${name%%-*}.log") &
    pids+=($!)
  done
fi
if has pipes; then
  bin=$(ls /tmp/gdrbin/gdr_chunk_prefill-* | head -n 1)
  for pipe in ${PIPES:-f32w sm90}; do
    skip="--skip long_sequence_int64_offsets"
    [ "$pipe" = wsplit ] || [ "$pipe" = sm90 ] || [ "$pipe" = split ] && skip=""
    (DELTAKIT_GDR_PREFILL=$pipe timeout "${TEST_TIMEOUT:-200}" "$bin" --test-threads 4 --nocapture $skip \
       >"/tmp/gdrlog_test_pipe_$pipe.log" 2>&1; echo "rc=$?" >>"/tmp/gdrlog_test_pipe_$pipe.log") &
    pids+=($!)
  done
fi
if has sanitize; then
  specs=("memcheck:gdr_chunk_prefill:wsplit:gates_at_the_edge varlen_initial_states"
         "memcheck:gdr_chunk_prefill:wsplit_splitz:gates_at_the_edge k16_every_v"
         "memcheck:gdr_chunk_prefill:splitz:varlen_initial_states"
         "racecheck:gdr_chunk_prefill:wsplit:k16_every_v"
         "memcheck:conv1d_prefill::prefill_" "memcheck:conv1d_update::update_" "memcheck:norm_rms::")
  [ -n "${SAN_SPECS:-}" ] && IFS=';' read -r -a specs <<<"$SAN_SPECS"  # ;-separated specs
  for spec in "${specs[@]}"; do
    IFS=: read -r tool stem pipe filters <<<"$spec"
    bin=$(ls /tmp/gdrbin/${stem}-* | head -n 1)
    tag="${tool}_${stem}_${pipe:-default}"
    (env DELTAKIT_GDR_PREFILL="${pipe:-default}" DELTAKIT_SANITIZE=1 timeout "${SAN_TIMEOUT:-200}" \
       compute-sanitizer --tool "$tool" --error-exitcode 9 "$bin" $filters --test-threads 1 \
       >"/tmp/gdrlog_san_$tag.log" 2>&1; echo "rc=$?" >>"/tmp/gdrlog_san_$tag.log") &
    pids+=($!)
  done
fi
for p in "${pids[@]}"; do wait "$p"; done
touch /tmp/gdr_tests_done
summary+=("tests + sanitizers done at $(el)")
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

for p in "${apids[@]}"; do wait "$p"; done
summary+=("harness done at $(el)")
if has benchpipes; then
  xz -dc .gpu-gdr/bench_gdr_chunk_prefill.xz >/tmp/bench_gdr_cp && chmod +x /tmp/bench_gdr_cp
  for pipe in ${BENCH_PIPES:-wsplit_splitz split}; do
    echo "=== DELTAKIT_GDR_PREFILL=$pipe" >>"$out/bench.log"
    DELTAKIT_GDR_PREFILL=$pipe timeout "${BENCH_TIMEOUT:-120}" /tmp/bench_gdr_cp --bench >>"$out/bench.log" 2>&1
    echo "rc=$?" >>"$out/bench.log"
  done
  summary+=("benchpipes done at $(el)")
fi
if has ncu; then  # gdr.decode at 27B TP2 batch 16 (the shape of the tail wave)
  PYTHONUNBUFFERED=1 PYTHONPATH="$site:$site/nvidia_cutlass_dsl/dsl_packages" timeout 200 ncu --set full \
    --clock-control none -k regex:decode_kernel --launch-skip 5 --launch-count 1 -o "$out/ncu_decode_tp2_b16" \
    python3 tools/bench_anchors_gdr.py --site "$site" --lib .gpu-gdr/libdk_gdr_decode.so --out /tmp/ncu.json --libs dk \
    --skip-prefill --only "TP2 8/24 B=16" --warmup 1 --reps 2 >"$out/ncu.log" 2>&1
  summary+=("ncu decode: rc=$? at $(el)")
  ncu --import "$out/ncu_decode_tp2_b16.ncu-rep" --page details --section SpeedOfLight --section Occupancy \
    --section LaunchStats --section MemoryWorkloadAnalysis 2>/dev/null | \
    grep -E "Duration|Throughput|Registers|Occupancy|Block Size|Grid Size|Waves|Bandwidth" | head -30 >>"$out/ncu.log"
fi
if [ ${#apids[@]} -gt 0 ]; then
  for f in /tmp/anchors_*.err; do echo "=== $f"; cat "$f"; done >"$out/anchors.err" 2>&1
  python3 tools/bench_anchors_gdr.py --merge /tmp/anchors_*.json --out "$out/anchors.json" >"$out/anchors.txt" 2>>"$out/anchors.err"
fi

echo "==== gdr device call summary ($(el); logs in $out)"
printf '%s\n' "${summary[@]}"
grep -hE "MAXERR|panicked|FAILED|^case (long|ragged|varlen ==|precomputed|split)" "$out/tests.log" 2>/dev/null | head -40
awk '/^case .*out_err/ { for (i = 1; i <= NF; i++) { if ($i == "out_err" && $(i+1) > mo) mo = $(i+1); if ($i == "state_err" && $(i+1) > ms) ms = $(i+1) } n++ }
     END { printf "chunk_prefill cases: %d, max out_err %s, max state_err %s\n", n, mo, ms }' "$out/tests.log" 2>/dev/null
tail -n 3 "$out/unpack.log" 2>/dev/null
grep -E "rc=|Error|error" "$out/anchors.err" 2>/dev/null | head -12
cat "$out/anchors.txt" 2>/dev/null | tail -n 60
grep -E "^=== DELTAKIT|^gdr_chunk_prefill/|time:|thrpt:|rc=" "$out/bench.log" 2>/dev/null | head -40
