#!/usr/bin/env bash
# Builds what tools/tune/gdr_device_call.sh needs into .gpu-gdr/ (git-ignored; carry it): the GPU test
# binaries of the GDR / conv1d / norm ops (stripped, one tar.xz) and gdr.decode as a shared library for the
# Python three-way harness (tools/bench_anchors_gdr.py). Run from the repository root after
# `tools/setup-toolchain`. Keep .gpu-gdr + .anchor-kit + the tree under the 64 MiB a device call carries.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
json="$(mktemp)"
trap 'rm -f "$json"' EXIT
tests=(gdr_decode gdr_chunk_prefill ${GDR_BUNDLE_EXTRA_TESTS:-})
args=()
for t in "${tests[@]}"; do args+=(--test "$t"); done
cargo test --release --features cuda "${args[@]}" --no-run --message-format=json-render-diagnostics >"$json"
rm -rf .gpu-gdr/bin && mkdir -p .gpu-gdr/bin
python3 - "$json" <<'PY' | while read -r exe; do cp "$exe" .gpu-gdr/bin/; done
import json, sys
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])
PY
strip .gpu-gdr/bin/* || true
tar -cJf .gpu-gdr/bin.tar.xz -C .gpu-gdr/bin .
rm -rf .gpu-gdr/bin
cu="${DELTAKIT_CUDA_HOME:-.toolchain/cuda}"
"$cu/bin/nvcc" -O3 -std=c++17 -shared -Xcompiler -fPIC -gencode=arch=compute_90a,code=sm_90a -Icsrc/include \
  -L"$cu/lib" -o .gpu-gdr/libdk_gdr_decode.so tools/tune/gdr_decode_lib.cu csrc/common/status.cu
strip .gpu-gdr/libdk_gdr_decode.so || true
du -sh .gpu-gdr/*
