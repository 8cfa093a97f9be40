#!/usr/bin/env bash
# Builds what tools/tune/gdr_device_call.sh needs into .gpu-gdr/ (git-ignored; carry it):
#   bin.tar.xz            the GPU test binaries of the GDR / conv1d / norm ops (stripped)
#   libdk_gdr_decode.so   gdr.decode (+ its tile sweep) for tools/bench_anchors_gdr.py (GDR_BUNDLE_NO_DECODE=1: skip)
#   libdk_gdr_bench.so    the AOT Triton launchers of gdr.chunk_prefill's K = V = 128 entries (the library's
#                         cubins, from triton_aot/manifest.toml, plus the pipeline variants of
#                         tools/tune/gdr_prefill_variants.toml), conv1d.prefill / conv1d.update (with their forced
#                         configurations), norm.* and the sm_90a CUDA state pass (csrc/gdr/chunk_prefill_sm90.cu,
#                         not dispatched yet) — so the harness times the library's own kernels with no
#                         Triton JIT compile on the GPU host.
# GDR_BUNDLE_TESTS: the test binaries (default: the five above); GDR_BUNDLE_NO_AOT=1: skip libdk_gdr_bench.so.
# Run from the repository root after `tools/setup-toolchain`. Keep .gpu-gdr + the anchor kit + the tree under the
# 64 MiB a device call carries (the full kit does not fit beside the tree: tools/tune/gdr_device_call.sh stash).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
cu="${DELTAKIT_CUDA_HOME:-.toolchain/cuda}"
py="${DELTAKIT_PYTHON:-.toolchain/venv/bin/python}"
bd="${GDR_BUNDLE_DIR:-.gpu-gdr}"  # output folder (git-ignored: .gpu*)
mkdir -p "$bd"
if [ -z "${GDR_BUNDLE_SKIP_TESTS:-}" ]; then
  json="$(mktemp)"
  trap 'rm -f "$json"' EXIT
  tests=(${GDR_BUNDLE_TESTS:-gdr_decode gdr_chunk_prefill conv1d_prefill conv1d_update norm_rms} ${GDR_BUNDLE_EXTRA_TESTS:-})
  args=()
  for t in "${tests[@]}"; do args+=(--test "$t"); done
  cargo test --release --features cuda "${args[@]}" --no-run --message-format=json-render-diagnostics >"$json"
  rm -rf "$bd"/bin && mkdir -p "$bd"/bin
  python3 - "$json" <<'PY' | while read -r exe; do cp "$exe" "$bd"/bin/; done
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
  tar -cf - -C "$bd"/bin . | xz -9 -T1 >"$bd"/bin.tar.xz
  rm -rf "$bd"/bin
fi
# The criterion bench of gdr.chunk_prefill (library dispatch, per DELTAKIT_GDR_PREFILL: step `benchpipes`).
rm -f "$bd"/bench_gdr_chunk_prefill.xz
if [ -n "${GDR_BUNDLE_BENCH:-}" ]; then
  bjson="$(mktemp)"
  cargo bench --features cuda --bench gdr_chunk_prefill --no-run --message-format=json-render-diagnostics >"$bjson"
  exe=$(python3 -c 'import json,sys
for l in open(sys.argv[1]):
    try: m = json.loads(l)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "gdr_chunk_prefill" and "bench" in m["target"]["kind"]: print(m["executable"])' "$bjson" | tail -n 1)
  rm -f "$bjson"
  cp "$exe" "$bd"/bench_gdr_chunk_prefill && strip "$bd"/bench_gdr_chunk_prefill || true
  xz -9 -T1 -f "$bd"/bench_gdr_chunk_prefill
fi
rm -f "$bd"/libdk_gdr_decode.so
if [ -z "${GDR_BUNDLE_NO_DECODE:-}" ]; then  # the decode rows of the harness (not needed for prefill / streaming)
  "$cu/bin/nvcc" -O3 -std=c++17 -shared -Xcompiler -fPIC -gencode=arch=compute_90a,code=sm_90a -Icsrc/include \
    -L"$cu/lib" -o "$bd"/libdk_gdr_decode.so tools/tune/gdr_decode_lib.cu csrc/common/status.cu
fi

if [ -n "${GDR_BUNDLE_NO_AOT:-}" ]; then  # only the test / bench binaries (the split pipeline's calls need no AOT lib)
  rm -f "$bd"/libdk_gdr_bench.so
  du -sh "$bd"/*
  exit 0
fi
# AOT launchers of the K = V = 128 chunk-prefill entries + variants (aot.py, the library's compiler). The
# cubin cache of the library build is reused when present (same keys: entry, arch, Triton version, source).
gen="$bd"/aot
rm -rf "$gen" && mkdir -p "$gen/cache"
for c in target/release/build/deltakit-*/out/triton/cache; do [ -d "$c" ] && cp -n "$c"/* "$gen/cache/" 2>/dev/null || true; done
"$py" - "$gen/lib_manifest.toml" <<'PY'
import sys, tomllib
ents = tomllib.loads(open("triton_aot/manifest.toml").read())["kernel"]
keep = [e for e in ents if e["name"].startswith("gdr_chunk_") and
        ("_k" not in e["name"] or "k128v128" in e["name"] or e["name"].endswith("kkt_k128"))]
def val(v):
    if isinstance(v, str):
        return '"' + v + '"'
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, list):
        return "[" + ", ".join(val(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {val(x)}" for k, x in v.items()) + " }"
    raise SystemExit(f"unsupported manifest value {v!r}")
with open(sys.argv[1], "w") as f:
    for e in keep:
        f.write("[[kernel]]\n" + "".join(f"{k} = {val(v)}\n" for k, v in e.items()) + "\n")
print(f"{len(keep)} library entries: {' '.join(e['name'] for e in keep)}")
PY
"$py" triton_aot/aot.py --out "$gen" --archs 90a --manifest "$gen/lib_manifest.toml" \
  --manifest tools/tune/gdr_prefill_variants.toml | sed 's/^/  /'
"$cu/bin/nvcc" -O3 -std=c++17 -shared -Xcompiler -fPIC -gencode=arch=compute_90a,code=sm_90a -Icsrc/include \
  -Itriton_aot/runtime -I"$gen" -I"$cu/include" -L"$cu/lib" -o "$bd"/libdk_gdr_bench.so \
  "$gen"/dk_triton_*.c triton_aot/runtime/dk_triton_runtime.c tools/tune/conv1d_tune_lib.cu \
  tools/tune/conv1d_update_tune_lib.cu csrc/norm/rms.cu tools/tune/norm_tune_lib.cu csrc/gdr/chunk_prefill_sm90.cu csrc/gdr/chunk_prefill_fused_sm90.cu \
  csrc/common/status.cu -lpthread
rm -rf "$gen"
strip "$bd"/*.so || true
du -sh "$bd"/*
