#!/usr/bin/env bash
# Device call for gdr.decode / conv1d.* / norm.* (issue 15 items 2 and 3): tests (also under forced decode /
# conv1d paths), compute-sanitizer, the decode three-way table + configuration sweep (tools/bench_anchors_gdr.py:
# deltakit / FlashInfer / FLA in one process), the streaming-op bandwidth table and one ncu profile of the decode
# kernel. Run on the GPU host from the repository root with the bundle of tools/tune/gdr_decode_bundle.sh carried
# ($BD, default .gpu-gdrdec). Logs go to $OUT (<= 8 files); a short table prints last.
#
# FlashInfer's CuTe-DSL libraries (49.5 MiB) do not fit beside the tree in one call, so (as
# tools/tune/gdr_device_call.sh):
#   call 1: carry .anchor-kit-libs (site-libs.tar.xz):  bash tools/tune/gdr_decode_call.sh stash
#   call 2 (at once, the machine stays warm ~30 s): carry $BD and .anchor-kit-py:
#           bash tools/tune/gdr_decode_call.sh tests sanitize decode streaming ncu
# Steps:
#   stash      copy .anchor-kit-libs/site-libs.tar.xz to /tmp/dk-kit (outlives the call while the machine is warm)
#   tests      every test binary of the bundle; gdr_decode again under DELTAKIT_GDR_DECODE=$DECODE_PIPES, $TEST_SPECS,
#              conv1d_prefill under DELTAKIT_CONV1D_PREFILL=$CONV_PIPES and norm_rms under
#              DELTAKIT_RMS_GATED_ROWS=$NORM_ROWS (forced paths; the int64 decode test only in the default run)
#   sanitize   compute-sanitizer ($SAN_SPECS: ;-separated tool:binary:ENV=value[,ENV2=value2] or -:test filters)
#   decode     decode rows (27B TP1 / TP2, T = $DECODE_T, warm + cold + CUDA-graph back-to-back at small batch) and
#              the configuration sweep ($SWEEP_ONLY), after the tests, under a lock
#   bsweep     decode rows at other batches / T ($BSWEEP_CASES, TP:B:T,..; tools/tune/gdr_decode_bsweep.py), the
#              sweep restricted to $BSWEEP_ONLY, after the tests, under the same lock
#   streaming  conv1d / norm bandwidth vs the copy ceiling, after the tests, under the same lock
#   ncu        ncu --set full on the runs of $NCU_RUNS (default: FLA's kernel and the deltakit dispatch at 27B TP1
#              B=256); tools/tune/gdr_decode_ncu.py prints the DRAM / L2 / occupancy metrics side by side and the
#              PM-sampling (DRAM throughput over time) series where the report has them
set -uo pipefail
out="${OUT:-/tmp/gdrdec-call}"
bd="${BD:-.gpu-gdrdec}"
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

mkdir -p /tmp/gdbin
tar -xJf "$bd/bin.tar.xz" -C /tmp/gdbin
rm -f /tmp/gd_tests_done /tmp/gd_unpack_done /tmp/gd_anchor.lock
rm -rf /tmp/gd_barrier
site=/tmp/anchor-site
if has decode || has bsweep; then
  (mkdir -p "$site"
   [ -f /tmp/dk-kit/site-libs.tar.xz ] && tar -xJf /tmp/dk-kit/site-libs.tar.xz -C "$site" && echo "site-libs unpacked"
   tar -xJf .anchor-kit-py/site-py.tar.xz -C "$site" && echo "site-py unpacked"
   (cd "$site" && sha256sum -c "$OLDPWD/.anchor-kit-py/MANIFEST.sha256") 2>&1 | tail -n 3
   echo "unpack done at $(el)"; touch /tmp/gd_unpack_done) >/tmp/gd_unpack.log 2>&1 &
fi
export DELTAKIT_REQUIRE_GPU=1

apids=()
nproc_h=0
has decode && nproc_h=$((nproc_h + 1))
has streaming && nproc_h=$((nproc_h + 1))
has bsweep && nproc_h=$((nproc_h + 1))
hpy() {  # name, wait-for-the-kit (0/1), args..: one harness process, timed after the tests under the lock
  local name=$1 kit=$2; shift 2
  local script=tools/bench_anchors_gdr.py
  [ "$name" = bsweep ] && script=tools/tune/gdr_decode_bsweep.py
  (while [ "$kit" = 1 ] && [ ! -f /tmp/gd_unpack_done ]; do sleep 0.5; done
   PYTHONUNBUFFERED=1 PYTHONPATH="$site:$site/nvidia_cutlass_dsl/dsl_packages" timeout "${ANCHOR_TIMEOUT:-300}" \
     python3 "$script" --site "$site" --out "/tmp/gd_$name.json" --wait-file /tmp/gd_tests_done \
     --lock-file /tmp/gd_anchor.lock --barrier "/tmp/gd_barrier:$nproc_h" "$@" >"/tmp/gd_$name.txt" 2>"/tmp/gd_$name.err"
   echo "rc=$?" >>"/tmp/gd_$name.err") &
  apids+=($!)
}
if has decode; then
  libs="${ANCHOR_LIBS:-dk,fi,fla}"
  [ -f /tmp/dk-kit/site-libs.tar.xz ] || libs="${libs/fi,/}"
  hpy decode 1 --libs "$libs" --lib "$bd/libdk_gdr_decode.so" --skip-prefill --sweep --graph-b2b \
    --sweep-only "${SWEEP_ONLY:-bv64_nw2,bv128_nw4_m3,bv16_nw1,bv16_nw2,_pre,tma_bv128_nw4_s2,kc_rw4}" \
    --decode-t "${DECODE_T:-1,4}" \
    --budget-s "${DECODE_BUDGET_S:-200}" ${DECODE_ARGS:-}
fi
if has bsweep; then  # decode rows at other batches / T (tools/tune/gdr_decode_bsweep.py), FLA + the sweep
  blibs="${ANCHOR_LIBS:-dk,fi,fla}"
  [ -f /tmp/dk-kit/site-libs.tar.xz ] || blibs="${blibs/fi,/}"
  hpy bsweep 1 --libs "$blibs" --lib "$bd/libdk_gdr_decode.so" --skip-prefill --sweep --graph-b2b \
    --sweep-only "${BSWEEP_ONLY:-bv16_nw1,bv64_nw2,bv128_nw4_m3}" --budget-s "${DECODE_BUDGET_S:-200}" \
    ${BSWEEP_CASES:+--cases "$BSWEEP_CASES"}
fi
has streaming && hpy streaming 0 --libs dk --skip-decode --skip-prefill --streaming --dk-lib "$bd/libdk_stream.so" \
  --budget-s 200

# Tests and sanitizers run concurrently (correctness only); the harness processes time afterwards.
pids=()
run_log() {  # tag, env assignment or -, command..
  local tag=$1 envs=$2; shift 2
  [ "$envs" = - ] && envs=DK_NONE=1
  (env ${envs//,/ } timeout "${TEST_TIMEOUT:-150}" "$@" >"/tmp/gdlog_$tag.log" 2>&1; echo "rc=$?" >>"/tmp/gdlog_$tag.log") &
  pids+=($!)
}
if has tests; then
  for bin in /tmp/gdbin/*; do
    name=$(basename "$bin")
    run_log "test_${name%%-*}" - "$bin" --test-threads 4 --nocapture
  done
  dbin=$(ls /tmp/gdbin/gdr_decode-* | head -n 1)
  for pipe in ${DECODE_PIPES:-reg_pre reg_bv128 tma_bv64_nw4_s3}; do
    run_log "test_decode_$pipe" "DELTAKIT_GDR_DECODE=$pipe" "$dbin" --test-threads 4 --nocapture \
      --skip decode_long_row_int64_offsets
  done
  # TEST_SPECS: ;-separated tag:binary stem:ENV=value[,ENV2=value2] or -:test filters (extra runs, e.g. one test with
  # DELTAKIT_GDR_DECODE_LOG=1 so that the log shows the route every call takes)
  IFS=';' read -r -a tspecs <<<"${TEST_SPECS:-}"
  for spec in "${tspecs[@]}"; do
    IFS=: read -r ttag tstem tenvs tfilters <<<"$spec"
    tbin=$(ls /tmp/gdbin/${tstem}-* | head -n 1)
    run_log "test_$ttag" "$tenvs" "$tbin" $tfilters --test-threads 4 --nocapture
  done
  cbin=$(ls /tmp/gdbin/conv1d_prefill-* 2>/dev/null | head -n 1)
  for pipe in ${CONV_PIPES:-vec8x8 scalar}; do
    run_log "test_conv_$pipe" "DELTAKIT_CONV1D_PREFILL=$pipe" "$cbin" --test-threads 4 --nocapture
  done
  nbin=$(ls /tmp/gdbin/norm_rms-* 2>/dev/null | head -n 1)
  for rows in ${NORM_ROWS:-1 2}; do
    run_log "test_norm_rows$rows" "DELTAKIT_RMS_GATED_ROWS=$rows" "$nbin" --test-threads 4 --nocapture
  done
fi
if has sanitize; then
  specs=("memcheck:gdr_decode:-:decode_qwen35 decode_heads_per_rank decode_gates_at_the_edge decode_padding"
         "memcheck:gdr_decode:DELTAKIT_GDR_DECODE=reg_pre:decode_qwen35 decode_heads_per_rank decode_padding"
         "memcheck:gdr_decode:DELTAKIT_GDR_DECODE=reg_bv128:decode_qwen35 decode_heads_per_rank decode_padding"
         "racecheck:gdr_decode:DELTAKIT_GDR_DECODE=reg_bv128:decode_qwen35"
         "memcheck:norm_rms:DELTAKIT_RMS_GATED_ROWS=1:"
         "memcheck:conv1d_prefill:-:" "memcheck:conv1d_update:-:" "memcheck:norm_rms:-:")
  [ -n "${SAN_SPECS:-}" ] && IFS=';' read -r -a specs <<<"$SAN_SPECS"
  i=0
  for spec in "${specs[@]}"; do
    IFS=: read -r tool stem envs filters <<<"$spec"
    bin=$(ls /tmp/gdbin/${stem}-* | head -n 1)
    i=$((i + 1))
    [ "$envs" = - ] && envs=DK_NONE=1
    (env ${envs//,/ } DELTAKIT_SANITIZE=1 timeout "${SAN_TIMEOUT:-150}" \
       compute-sanitizer --tool "$tool" --error-exitcode 9 "$bin" $filters --test-threads 1 \
       >"/tmp/gdlog_san_${i}_${tool}_${stem}.log" 2>&1; echo "rc=$? ($spec)" >>"/tmp/gdlog_san_${i}_${tool}_${stem}.log") &
    pids+=($!)
  done
fi
for p in "${pids[@]}"; do wait "$p"; done
touch /tmp/gd_tests_done
summary+=("tests + sanitizers done at $(el)")
for f in /tmp/gdlog_test_*.log; do
  [ -f "$f" ] || continue
  echo "=== $f" >>"$out/tests.log"; cat "$f" >>"$out/tests.log"
  summary+=("$(basename "$f" .log): $(tail -n 1 "$f") $(grep -E '^test result' "$f" | tail -n 1)")
done
for f in /tmp/gdlog_san_*.log; do
  [ -f "$f" ] || continue
  echo "=== $f" >>"$out/sanitize.log"; cat "$f" >>"$out/sanitize.log"
  summary+=("$(basename "$f" .log): $(tail -n 1 "$f") $(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY' "$f" | tail -n 1)")
done

for p in "${apids[@]}"; do wait "$p"; done
summary+=("harness done at $(el)")
if has ncu; then
  # NCU_RUNS: @-separated runs "label;libs;kernel regex;--only case;launch-skip;launch-count;env" (one ncu process each,
  # the harness with --warmup 0 --reps 1: per library 1 correctness + 1 warm + 1 cold launch, in the order FI, FLA, dk).
  # Default: FLA's kernel and the deltakit dispatch at 27B TP1 B=256 (both cold launches and dk's first two).
  # NCU_ARGS: extra harness arguments of every ncu run (e.g. "--sweep --sweep-only sl_bv64_nw1": a sweep
  # configuration's correctness / warm / cold launches follow the dispatch's three).
  runs="${NCU_RUNS:-dkfla;dk,fla;regex:decode_kernel|fused_recurrent;TP1 16/48 B=256;2;4;DK_NONE=1}"
  IFS='@' read -r -a nruns <<<"$runs"  # not '|': kernel regexes use it (the 16:50 call lost its ncu step so)
  for spec in "${nruns[@]}"; do
    IFS=';' read -r lab nlibs nk nonly nskip ncount nenv <<<"$spec"
    (env ${nenv:-DK_NONE=1} PYTHONUNBUFFERED=1 PYTHONPATH="$site:$site/nvidia_cutlass_dsl/dsl_packages" \
       timeout "${NCU_TIMEOUT:-90}" \
       ncu --set full --clock-control none -k "$nk" --launch-skip "$nskip" --launch-count "$ncount" \
       -o "/tmp/ncu_$lab" python3 tools/bench_anchors_gdr.py --site "$site" --lib "$bd/libdk_gdr_decode.so" \
       --out /tmp/ncu_$lab.json --libs "$nlibs" --skip-prefill --only "$nonly" --decode-t 1 --warmup 0 --reps 1 \
       ${NCU_ARGS:-} >"/tmp/ncu_$lab.log" 2>&1)
    summary+=("ncu $lab: rc=$? at $(el)")
    ncu --import "/tmp/ncu_$lab.ncu-rep" --page raw --csv >"/tmp/ncu_${lab}_raw.csv" 2>/dev/null
    ncu --import "/tmp/ncu_$lab.ncu-rep" --page raw --csv --print-metric-instances values 2>/dev/null | \
      python3 tools/tune/gdr_decode_ncu.py --instances >"/tmp/ncu_${lab}_pm.txt" 2>&1
    python3 tools/tune/gdr_decode_ncu.py "/tmp/ncu_${lab}_raw.csv" >>"$out/ncu.log" 2>&1
    tail -n 30 "/tmp/ncu_$lab.log" >>"$out/ncu.log"
    cat "/tmp/ncu_${lab}_pm.txt" >>"$out/ncu_pm.txt"
  done
  cat /tmp/ncu_*_raw.csv >"$out/ncu_raw.csv" 2>/dev/null
fi
if [ ${#apids[@]} -gt 0 ]; then
  for f in /tmp/gd_unpack.log /tmp/gd_*.err; do echo "=== $f"; cat "$f"; done >"$out/anchors.err" 2>&1
  python3 tools/bench_anchors_gdr.py --merge /tmp/gd_*.json --out "$out/anchors.json" >"$out/anchors.txt" 2>>"$out/anchors.err"
fi

echo "==== gdr.decode / conv1d / norm device call summary ($(el); logs in $out)"
printf '%s\n' "${summary[@]}"
grep -hE "MAXERR|panicked|FAILED" "$out/tests.log" 2>/dev/null | sort | uniq -c | head -40
grep -h "gdr.decode route" "$out/tests.log" 2>/dev/null | sort | uniq -c | head -20
tail -n 3 /tmp/gd_unpack.log 2>/dev/null
grep -E "rc=|Error|error" "$out/anchors.err" 2>/dev/null | head -12
tail -n 12 "$out/ncu.log" 2>/dev/null
cat "$out/anchors.txt" 2>/dev/null | tail -n 70
