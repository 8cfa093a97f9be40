#!/usr/bin/env bash
# Builds what tools/tune/gdr_decode_call.sh needs into .gpu-gdrdec/ (git-ignored; carry it; GDR_DECODE_BUNDLE_DIR
# picks another folder). The decode / conv1d / norm share of tools/tune/gdr_bundle.sh (whose .gpu-gdr the chunk-prefill
# work uses), without the chunk-prefill AOT launchers:
#   bin.tar.xz           the GPU test binaries gdr_decode, conv1d_prefill, conv1d_update, norm_rms (stripped;
#                        GDR_DECODE_BUNDLE_TESTS picks others)
#   libdk_gdr_decode.so  gdr.decode (library dispatch + the fixed configurations of tools/tune/gdr_decode_lib.cu)
#   libdk_stream.so      conv1d.prefill / conv1d.update / norm.* with their forced configurations
#                        (tools/tune/{conv1d,conv1d_update,norm}_tune_lib.cu) for tools/bench_anchors_gdr.py --streaming
#   libdk_gdr_prefill_head.so  (GDR_DECODE_BUNDLE_PREFILL=1) gdr.chunk_prefill's sm_90a split pipeline from the csrc/ of
#                        a commit (GDR_DECODE_BUNDLE_PREFILL_REV, default HEAD: git archive, so other uncommitted work
#                        in a shared checkout stays out) for tools/dk_split_prefill.py (tools/bench_anchors_gdr.py
#                        --dk-split-lib, tools/gdr_anchor_accuracy.py)
# Run from the repository root after `tools/setup-toolchain`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
cu="${DELTAKIT_CUDA_HOME:-.toolchain/cuda}"
bd="${GDR_DECODE_BUNDLE_DIR:-.gpu-gdrdec}"
mkdir -p "$bd"
nv=("$cu/bin/nvcc" -O3 -std=c++17 -shared -Xcompiler -fPIC -gencode=arch=compute_90a,code=sm_90a -Icsrc/include
    -L"$cu/lib")
if [ -z "${GDR_DECODE_BUNDLE_SKIP_TESTS:-}" ]; then
  json="$(mktemp)"
  trap 'rm -f "$json"' EXIT
  args=()
  for t in ${GDR_DECODE_BUNDLE_TESTS:-gdr_decode conv1d_prefill conv1d_update norm_rms}; do args+=(--test "$t"); done
  cargo test --release --features cuda "${args[@]}" --no-run --message-format=json-render-diagnostics >"$json"
  rm -rf "$bd/bin" && mkdir -p "$bd/bin"
  python3 - "$json" <<'PY' | while read -r exe; do cp "$exe" "$bd/bin/"; done
import json, sys
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])
PY
  strip "$bd"/bin/* || true
  tar -cf - -C "$bd/bin" . | xz -9 -T1 >"$bd/bin.tar.xz"
  rm -rf "$bd/bin"
fi
dpid=
if [ -z "${GDR_DECODE_BUNDLE_SKIP_LIB:-}" ]; then  # set: keep the libdk_gdr_decode.so already there
  "${nv[@]}" -o "$bd/libdk_gdr_decode.so" tools/tune/gdr_decode_lib.cu csrc/common/status.cu &
  dpid=$!
fi
if [ -z "${GDR_DECODE_BUNDLE_SKIP_STREAM:-}" ]; then  # set: no libdk_stream.so (a decode-only call)
  "${nv[@]}" -o "$bd/libdk_stream.so" tools/tune/conv1d_tune_lib.cu tools/tune/conv1d_update_tune_lib.cu \
    csrc/norm/rms.cu tools/tune/norm_tune_lib.cu csrc/common/status.cu
fi
if [ -n "${GDR_DECODE_BUNDLE_PREFILL:-}" ]; then
  src="$(mktemp -d)"
  git archive "${GDR_DECODE_BUNDLE_PREFILL_REV:-HEAD}" csrc | tar -x -C "$src"
  "${nv[@]/-Icsrc\/include/-I$src/csrc/include}" -lineinfo --expt-relaxed-constexpr -Xptxas -warn-spills \
    -o "$bd/libdk_gdr_prefill_head.so" "$src/csrc/gdr/chunk_prefill_fused_sm90.cu" \
    "$src/csrc/gdr/chunk_local_wgmma_sm90.cu" "$src/csrc/common/status.cu"
  rm -rf "$src"
fi
[ -n "$dpid" ] && wait "$dpid"
strip "$bd"/*.so || true
du -sh "$bd"/*
