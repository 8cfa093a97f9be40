#!/usr/bin/env bash
# CPU check of attn.prefill sm_90a tile variants without building all 36: a copy of
# csrc/attn/prefill_sm90.cu whose hd-256 dispatch keeps only the given variants (plus the
# fallbacks their launchers name), compiled with nvcc -arch=sm_90a -Xptxas -v; prints the ptxas
# lines (registers, spills) of every kernel and, per variant, the SASS counts that matter here
# (HGMMA, R2UR, UTMALDG, LDL/STL, instructions) of its prefill kernel.
#   tools/attn_sass.sh 30 36        # -> /tmp/attn_sass/{prefill.cubin,ptxas.txt,v<N>.sass}
# ATTN_SASS_SRC=<file> compiles another version of the source (e.g. `git show HEAD:...` to diff
# the default's SASS), ATTN_SASS_OUT=<dir> the output folder. tools/attn_sass_loops.py <v.sass>
# prints the per-loop counts (instructions, HGMMA, R2UR, LDL/STL of each loop with HGMMA).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${ATTN_SASS_OUT:-/tmp/attn_sass}"
mkdir -p "$out"
keep="${*:-30}"
python3 - "$out/prefill_sm90.cu" $keep <<'PY'
import re, sys
src = open(__import__("os").environ.get("ATTN_SASS_SRC", "csrc/attn/prefill_sm90.cu")).read()
keep = set(sys.argv[2:])
# Drop the `case N:` arms of the hd-256 variant switch whose N is not kept (an arm runs from its
# `case` line to the next `case`/`default`).
head, sw = src.split("      switch (p->variant) {", 1)
body, tail = sw.split("        default:\n          return DK_ERR_INVALID_ARGUMENT;", 1)
arms = re.split(r"(?m)^(?=        case \d+:)", body)
kept = [a for a in arms if not re.match(r"        case (\d+):", a) or re.match(r"        case (\d+):", a).group(1) in keep]
out = head + "      switch (p->variant) {" + "".join(kept) + "        default:\n          return DK_ERR_INVALID_ARGUMENT;" + tail
out = out.replace('#include "../common/launch.cuh"', '#include "%s/csrc/common/launch.cuh"' % __import__("os").getcwd())
out = out.replace('#include "sm90_wgmma.cuh"', '#include "%s/csrc/attn/sm90_wgmma.cuh"' % __import__("os").getcwd())
open(sys.argv[1], "w").write(out)
PY
nvcc=.toolchain/cuda/bin/nvcc
cuobjdump=$(ls .toolchain/cuda/bin/cuobjdump .toolchain/venv/lib/python3*/site-packages/triton/backends/nvidia/bin/cuobjdump 2>/dev/null | head -1)
$nvcc -cubin -O3 -std=c++17 -arch=sm_90a -lineinfo --expt-relaxed-constexpr -Icsrc/include -Xptxas -v \
  -o "$out/prefill.cubin" "$out/prefill_sm90.cu" >"$out/ptxas.txt" 2>&1 || { tail -30 "$out/ptxas.txt"; exit 1; }
awk '/Compiling entry/ {match($0, /_Z[A-Za-z0-9_]+/); k=substr($0, RSTART, RLENGTH)} /spill stores/ {sp=$0; sub(/.*: +/, "", sp)} /Used [0-9]+ registers/ {r=$0; sub(/.*Used /, "", r); sub(/,.*/, "", r); if (k ~ /Li256|persist/) print k ": " r ", " sp}' "$out/ptxas.txt"
for v in $keep; do
  name=$("$cuobjdump" -sass "$out/prefill.cubin" | grep -E "Function : .*(Li256ELb[01]ELi${v}EEEv|persist.*ILi${v}EEEv)" | head -1 | awk '{print $3}')
  [[ -n "$name" ]] || { echo "v$v: kernel not found"; continue; }
  "$cuobjdump" -sass -fun "$name" "$out/prefill.cubin" >"$out/v$v.sass"
  f="$out/v$v.sass"
  echo "v$v $name: instr $(grep -cE '^\s+/\*[0-9a-f]{4,}\*/' "$f") HGMMA $(grep -c HGMMA "$f") R2UR $(grep -c R2UR "$f") UTMALDG $(grep -c UTMALDG "$f") LDL $(grep -c 'LDL' "$f") STL $(grep -c 'STL' "$f") LDGSTS $(grep -c LDGSTS "$f")"
done
