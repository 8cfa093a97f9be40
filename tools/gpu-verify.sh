#!/usr/bin/env bash
# One device call that verifies a GPU bundle end to end, for the session's record. Run on the GPU
# host from the repository root, with `.gpu` (from tools/gpu-bundle) and, for the anchors, `.whl`
# (fla-core wheel, see README) carried. Logs go to $OUT (or /tmp/gpu-verify); a summary prints last.
#
#   tools/gpu-verify.sh [tests] [sanitize] [bench] [anchors]      (default: all four, in that order)
#
#   tests     .gpu/run over every test binary (DELTAKIT_REQUIRE_GPU=1)
#   sanitize  compute-sanitizer memcheck and racecheck over each GPU test binary (root package);
#             SANITIZE_SKIP="name1 name2" is passed as libtest --skip filters (very long tests)
#   bench     every criterion bench (.gpu/run --bench)
#   anchors   tools/bench_anchors.py: deltakit's criterion numbers next to FLA at the same shapes
set -uo pipefail
out="${OUT:-/tmp/gpu-verify}"
mkdir -p "$out"
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(tests sanitize bench anchors)
summary=()

gpu_test_bins() { awk -F'\t' '$1 == "test" && $2 == "." { print $3 }' .gpu/manifest.tsv; }

for step in "${steps[@]}"; do
  case "$step" in
    tests)
      .gpu/run >"$out/tests.log" 2>&1
      summary+=("tests: $(tail -n 1 "$out/tests.log")")
      ;;
    sanitize)
      .gpu/run --bench __none__ >/dev/null 2>&1  # unpacks the binaries if needed
      skip=()
      for s in ${SANITIZE_SKIP:-}; do skip+=(--skip "$s"); done
      for bin in $(gpu_test_bins); do
        for tool in memcheck racecheck; do
          log="$out/san_${tool}_${bin%%-*}.log"
          .gpu/run --wrap "compute-sanitizer --tool $tool --error-exitcode 9" "$bin" -- "${skip[@]}" >"$log" 2>&1
          res=$(grep -hE "ERROR SUMMARY|RACECHECK SUMMARY" "$log" | tail -n 1)
          summary+=("$tool ${bin%%-*}: ${res:-no summary} | $(tail -n 1 "$log")")
        done
      done
      ;;
    bench)
      .gpu/run --bench >"$out/bench.log" 2>&1
      summary+=("bench: $(tail -n 1 "$out/bench.log")")
      ;;
    anchors)
      if ls .whl/*.whl >/dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
        export PYTHONPATH=/tmp/site
      fi
      PYTHONUNBUFFERED=1 python3 tools/bench_anchors.py --criterion-dir .gpu/root/target/criterion \
        >"$out/anchors.md" 2>"$out/anchors.err"
      summary+=("anchors: exit $? (table in anchors.md)")
      ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
echo "==== gpu-verify summary (logs in $out)"
printf '%s\n' "${summary[@]}"
[ -f "$out/anchors.md" ] && cat "$out/anchors.md"
