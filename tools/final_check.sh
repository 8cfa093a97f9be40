#!/usr/bin/env bash
# The lead's end-of-session check on the GPU host (~6-9 min on an H200; split it over two calls
# with FINAL_PARTS if the per-call limit is near):
# every GPU test binary of a bundle, compute-sanitizer memcheck / racecheck on the kernels whose
# defaults a session changed (attn.prefill / attn.decode, gdr.chunk_prefill, gdr.decode; a graph
# replay of the engine), and the engine's decode / prefill table (9B / 27B, batch 1 / 16 / 64,
# graphs and --no-graphs at batch 1). Logs go to $OUT (<= 8 files), a short table is printed last.
#
# Here (no GPU): build a bundle with the test binaries and the CLI, no benches, e.g.
#   DELTAKIT_BUNDLE_DIR=.gpu-final DELTAKIT_BUNDLE_NO_BENCH=1 DELTAKIT_BUNDLE_TESTS="-p deltakit \
#     --test attn --test gdr_chunk_prefill --test gdr_decode --test conv1d_prefill --test conv1d_update \
#     --test norm_rms --test elementwise --test gemm_linear --test sample --test init_dummy \
#     -p deltakit-engine --test golden_cuda --test graph_cuda" tools/gpu-bundle
# There: `BUNDLE=.gpu-final bash tools/final_check.sh` (carry the bundle folder).
#   FINAL_PARTS   what to run (default "tests sanitize bench")
#   FINAL_BENCH   the bench rows, ";"-separated "model batch [extra flags]" (default below)
#   TEST_TIMEOUT, SAN_TIMEOUT, BENCH_TIMEOUT  per-step limits in seconds (300 / 60 / 60)
set -uo pipefail
B=${BUNDLE:-.gpu-final}
out=${OUT:-/tmp/final}
mkdir -p "$out"
parts=" ${FINAL_PARTS:-tests sanitize bench} "
S=()
t0=$(date +%s)
since() { echo "$(( $(date +%s) - $1 ))s"; }

# Session 9: racecheck of the gdr chunk-prefill sweeps (state kernels only), in the background while the tests run
# (RACE_BG="" turns it off; RACE_BG_TIMEOUT per process, default 220 s). Output to files only (no open stdout).
# Unpack the bundle's binaries once, before the background jobs and the tests use them (session 10: three racecheck
# processes and the tests unpacking at once failed with "Text file busy" and never ran).
"$B/run" --bench __none__ >/dev/null 2>&1
if [[ $parts == *" sanitize "* ]]; then
  for tname in ${RACE_BG-qwen_shapes_vs_recurrence heads_per_rank_sweep long_sequence_int64_offsets}; do
    ( DELTAKIT_SANITIZE=1 timeout "${RACE_BG_TIMEOUT:-220}" "$B/run" \
        --wrap "compute-sanitizer --tool racecheck --kernel-name kns=split_wg_kernel --error-exitcode 9" \
        gdr_chunk_prefill -- "$tname" --test-threads 1 >"$out/race_bg_$tname.log" 2>&1
      echo "rc $? (racecheck, state kernels, $tname)" >>"$out/race_bg_$tname.log" ) </dev/null >/dev/null 2>&1 &
  done
fi

if [[ $parts == *" tests "* ]]; then
  t=$(date +%s)
  timeout "${TEST_TIMEOUT:-300}" "$B/run" >"$out/tests.log" 2>&1
  S+=("tests: rc $? $(since "$t") | $(tail -n 1 "$out/tests.log")")
  # One line per binary: name and its "test result" line.
  grep -E "^=== |^test result" "$out/tests.log" | paste - - | awk '{print $2, $6, $7, $8, $9}' >"$out/tests.table"
fi

if [[ $parts == *" sanitize "* ]]; then
  t=$(date +%s)
  san() { # tool binary [-- filter]; extra env in SAN_ENV
    local tool=$1 bin=$2
    shift 2
    local one rc
    one=$(mktemp)
    env ${SAN_ENV:-} DELTAKIT_SANITIZE=1 timeout "${SAN_TIMEOUT:-60}" "$B/run" \
      --wrap "compute-sanitizer --tool $tool --error-exitcode 9" "$bin" "$@" >"$one" 2>&1
    rc=$?
    { echo "=== $tool $bin $*"; cat "$one"; } >>"$out/sanitize.log"
    S+=("$tool $bin $*: rc $rc | $(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY' "$one" | tail -n 1) | $(tail -n 1 "$one")")
    rm -f "$one"
  }
  san memcheck attn -- prefill_kernels_small_cases_for_sanitizer
  san racecheck attn -- prefill_kernels_small_cases_for_sanitizer
  san memcheck attn -- decode_kernels_small_cases_for_sanitizer
  san racecheck attn -- decode_kernels_small_cases_for_sanitizer
  san memcheck gdr_chunk_prefill -- varlen_initial_states_padding_and_flags
  san racecheck gdr_chunk_prefill -- varlen_initial_states_padding_and_flags
  # Session 8: CP forced (its records, varlen / padding / per-sequence init) and the default on the long test.
  SAN_ENV="DELTAKIT_GDR_SPLIT_VARIANT=6353" san memcheck gdr_chunk_prefill -- varlen_long_sequences_context_parallel
  san memcheck gdr_chunk_prefill -- varlen_long_sequences_context_parallel
  # Session 9: the default (94417) releases the state kernels' stages through mbarriers; racecheck on the test that
  # routes through the pair CTA and context parallelism, and on the long test. The three long sweeps run in the
  # background from the start (RACE_BG, state kernels only), collected here.
  san racecheck gdr_chunk_prefill -- varlen_long_sequences_context_parallel
  san racecheck gdr_chunk_prefill -- default_routes_pair_and_context_parallel
  wait
  for f in "$out"/race_bg_*.log; do
    [ -f "$f" ] || continue
    S+=("racecheck (bg) $(basename "$f" .log): $(tail -n 1 "$f") | $(grep -hE 'RACECHECK SUMMARY' "$f" | tail -n 1) | ok $(grep -cE '^test .* ok$' "$f") FAILED $(grep -cE '^test .* FAILED$' "$f")")
    cat "$f" >>"$out/sanitize.log"
    rm -f "$f"
  done
  san memcheck gdr_decode
  san racecheck gdr_decode -- decode_padding
  # Session 8: T = 4 at >= 384 (row, head) pairs takes the chunked multi-token tile (slc) by default.
  san racecheck gdr_decode -- decode_heads_per_rank_sweep
  san memcheck graph_cuda -- padded_rows --test-threads=1
  # Session 10: gdr.decode's small-batch PDL route behind conv1d.update (eager and in a graph); attn.prefill 48 (the
  # default) at groups 17..64; the opt-in 51 / 52 (K tile 0 issued first) on the small cases.
  san racecheck gdr_decode -- decode_pdl_pair_behind_conv1d_update
  san memcheck attn -- prefill_q_by_tma_variants_take_groups_above_16
  SAN_ENV="DELTAKIT_TEST_PREFILL_VARIANTS=51,52" san memcheck attn -- prefill_kernels_small_cases_for_sanitizer
  # Session 11: the default 71266513 (the pair CTA's deferred output store) and 83849425 (+ the local-pass bits
  # 4194304 / 8388608) on the test that routes through the pair CTA and context parallelism.
  san memcheck gdr_chunk_prefill -- default_routes_pair_and_context_parallel
  # Session 12: the default 620720337 (the stage image by one bulk copy on every route) is what the lines above run;
  # memcheck of its single-CTA route on the padding / flags test ran at the top. The previous default once more:
  SAN_ENV="DELTAKIT_GDR_SPLIT_VARIANT=83849425" san memcheck gdr_chunk_prefill -- default_routes_pair_and_context_parallel
  # Session 13: the default 1694462161 (K / Q / V of full chunks by tensor-map TMA on every route) is what the lines
  # above run; the previous default (its cp.async K / Q / V loads are also the fallback where no map can be encoded):
  SAN_ENV="DELTAKIT_GDR_SPLIT_VARIANT=620720337" san memcheck gdr_chunk_prefill -- default_routes_pair_and_context_parallel
  S+=("sanitizers: $(since "$t")")
fi

if [[ $parts == *" bench "* ]]; then
  IFS=';' read -ra rows <<<"${FINAL_BENCH:-9b 1;9b 1 --no-graphs;9b 16;9b 64;27b 1;27b 1 --no-graphs;27b 16;27b 64}"
  for r in "${rows[@]}"; do
    # shellcheck disable=SC2086
    set -- $r
    local_model=$1 batch=$2
    shift 2
    echo "=== $r" >>"$out/bench.log"
    DELTAKIT_REPLAY_TIMING=1 timeout "${BENCH_TIMEOUT:-60}" "$B/run" --cli bench --device cuda:0 \
      --config "tests/configs/qwen3.5-$local_model" --load-format dummy --batch "$batch" \
      --prompt-len 512 --gen-len 64 "$@" >>"$out/bench.log" 2>&1
    S+=("bench $r: rc $? | $(grep -E '^prefill' "$out/bench.log" | tail -n 1)")
  done
fi

echo "==== final check ($(since "$t0"))"
printf '%s\n' "${S[@]}"
[ -f "$out/tests.table" ] && cat "$out/tests.table"
exit 0
