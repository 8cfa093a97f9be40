#!/usr/bin/env bash
# Session 10 device calls of the gdr-anchor helper (issue 15 items 2 and 4): two calls to one warm machine, because
# FlashInfer's CuTe-DSL libraries (site-libs.tar.xz, 51.9 MB) and the tree (14.2 MB) leave no room for anything else.
#   call 1 (carry .anchor-kit-py/libs):            bash tools/tune/gdr_decode_s10_call.sh stash
#       copies site-libs.tar.xz to /tmp/dk-kit and unpacks it into /tmp/site in a detached session (outlives the call
#       while the machine stays warm)
#   call 2 (carry .anchor-kit-py/py .gpu-gdrdec/c2): bash tools/tune/gdr_decode_s10_call.sh main
#       (B) tools/gdr_anchor_accuracy.py: the float64 reference, deltakit (HEAD's split pipeline .so), FlashInfer (one
#           process per shape: their CuTe-DSL compiles run in parallel) and FLA, all at once, then the merge (CPU);
#       (A) after (B)'s GPU work: tools/bench_anchors_gdr.py decode rows (27B TP1 / TP2, B 1 / 16 / 64 / 256, T = 1)
#           with the session-9 prepared configurations (no slot + out of place, PDL early / late, the B = 1 PDL tile)
#           against FLA (also in place / [K, V], --fla-extra) and FlashInfer, timed alone.
# Logs under $OUT (<= 8 files); the tables print last.
set -uo pipefail
out="${OUT:-/tmp/s10out}"
mkdir -p "$out"
t0=$(date +%s)
el() { echo "$(( $(date +%s) - t0 ))s"; }
site=/tmp/site
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader

if [ "${1:-}" = stash ]; then
  mkdir -p /tmp/dk-kit "$site"
  cp .anchor-kit-py/libs/site-libs.tar.xz /tmp/dk-kit/ && ls -la /tmp/dk-kit
  setsid bash -c "tar -xJf /tmp/dk-kit/site-libs.tar.xz -C $site && touch $site/.libs_done" </dev/null >/dev/null 2>&1 &
  echo "stash done at $(el)"
  exit 0
fi

if [ "${1:-}" = extra ]; then
  # call 3 (optional; carry .anchor-kit-py/py .gpu-gdrdec/c2 after a stash call on the same warm machine): the prefill
  # three-way row of tools/bench_anchors_gdr.py with deltakit = the library default (--dk-split-lib) next to 209 (the
  # session-7 default: no CP / pair / wgmma local pass) and 465 (= 209 without the state kernel's bf16 lo-part
  # products: one bf16 product each, below the contract), FlashInfer timed in the same process; and the accuracy of
  # 225489 / 209 / 465 against float64 (tools/gdr_anchor_accuracy.py) on the six cases of call 2.
  acc=/tmp/acc3
  rm -rf "$acc" /tmp/acc3_done; mkdir -p "$acc" "$site"
  [ -f "$site/flashinfer/__init__.py" ] || tar -xJf .anchor-kit-py/py/site-py.tar.xz -C "$site"
  for _ in $(seq 80); do [ -f "$site/.libs_done" ] && break; sleep 0.5; done
  [ -f "$site/.libs_done" ] || echo "no site-libs on this machine: FlashInfer will fail (call 1 not on this machine)"
  export PYTHONUNBUFFERED=1 PYTHONPATH="$site:$site/nvidia_cutlass_dsl/dsl_packages"
  A=tools/gdr_anchor_accuracy.py
  L=.gpu-gdrdec/c2/libdk_gdr_prefill_head.so
  rm -rf /tmp/acc3_barrier /tmp/acc3.lock
  bpids=()
  # two processes: FlashInfer's compiles (non-CP / CP kernel sets) in parallel, the timed phases one at a time
  for grp in tp1,9b8 tp2,9b64k; do
    (timeout 200 python3 tools/bench_anchors_gdr.py --site "$site" --libs dk,fi --skip-decode --prefill "$grp" \
       --dk-split-lib "$L" --dk-split-variants 225489,209,465 --prepass --wait-file /tmp/acc3_done \
       --lock-file /tmp/acc3.lock --barrier /tmp/acc3_barrier:2 --budget-s 180 --out "/tmp/prefill3_${grp%%,*}.json" \
       >/dev/null 2>"/tmp/acc3_bench_${grp%%,*}.log"; echo "rc=$?" >>"/tmp/acc3_bench_${grp%%,*}.log") &
    bpids+=($!)
  done
  pids=()
  for r in "ref:--role ref" "dk:--role dk" "dk209:--role dk --variant 209" "dk465:--role dk --variant 465"; do
    (timeout 120 python3 "$A" --dir "$acc" --dk-lib "$L" ${r#*:} >"/tmp/acc3_${r%%:*}.log" 2>&1
     echo "rc=$?" >>"/tmp/acc3_${r%%:*}.log") &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  touch /tmp/acc3_done
  echo "accuracy roles done at $(el)"
  (CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=8 timeout 150 python3 "$A" --dir "$acc" --role merge --dev cpu \
     --libs dk,dk209,dk465 --out "$out/acc3.json" >"$out/acc3.txt" 2>/tmp/acc3_merge.log
   echo "rc=$?" >>/tmp/acc3_merge.log)
  echo "merge done at $(el)"
  for p in "${bpids[@]}"; do wait "$p"; done
  python3 tools/bench_anchors_gdr.py --merge /tmp/prefill3_*.json --out "$out/prefill3.json" >"$out/prefill3.txt" 2>&1
  echo "prefill timing done at $(el)"
  for f in /tmp/acc3_*.log; do echo "=== $f"; cat "$f"; done >"$out/logs3.txt" 2>&1
  for f in /tmp/acc3_*.log; do echo "--- $f"; grep -v "^\s*$" "$f" | tail -n 3; done
  echo "==== prefill (tools/bench_anchors_gdr.py, deltakit = the split pipeline)"
  cat "$out/prefill3.txt"
  echo "==== deltakit 225489 / 209 / 465 vs float64  [$(el)]"
  cat "$out/acc3.txt"
  exit 0
fi

acc=/tmp/acc
rm -rf "$acc" /tmp/acc_gpu_done
mkdir -p "$acc" "$site"
tar -xJf .anchor-kit-py/py/site-py.tar.xz -C "$site" && echo "site-py unpacked at $(el)"
fi_ok=0
if [ -f /tmp/dk-kit/site-libs.tar.xz ] || [ -f .anchor-kit-py/libs/site-libs.tar.xz ]; then
  for _ in $(seq 80); do [ -f "$site/.libs_done" ] && break; sleep 0.5; done
  if [ ! -f "$site/.libs_done" ]; then
    kit=/tmp/dk-kit/site-libs.tar.xz
    [ -f "$kit" ] || kit=.anchor-kit-py/libs/site-libs.tar.xz
    tar -xJf "$kit" -C "$site" && touch "$site/.libs_done"
  fi
  (cd "$site" && sha256sum -c "$OLDPWD/.anchor-kit-py/py/MANIFEST.sha256") 2>&1 | tail -n 2 && fi_ok=1
fi
echo "site-libs: fi_ok=$fi_ok at $(el)"
export PYTHONUNBUFFERED=1
pp="$site:$site/nvidia_cutlass_dsl/dsl_packages"
A=tools/gdr_anchor_accuracy.py
pids=()
role() {  # tag, environment (VAR=value[,VAR=value]), args..
  local tag=$1 envs=$2; shift 2
  (env ${envs//,/ } timeout "${ROLE_TIMEOUT:-170}" python3 "$A" --dir "$acc" "$@" >"/tmp/acc_$tag.log" 2>&1
   echo "rc=$?" >>"/tmp/acc_$tag.log") &
  pids+=($!)
}
role ref DK_NONE=1 --role ref
role dk DELTAKIT_GDR_ROUTE_LOG=1 --role dk --dk-lib .gpu-gdrdec/c2/libdk_gdr_prefill_head.so
role fla "PYTHONPATH=$pp" --role fla --site "$site"
if [ "$fi_ok" = 1 ]; then
  for grp in tp1_8k,tp1_8k_testgates tp2_8k,tp2_8k_corrk 9b_64k 9b_varlen; do
    role "fi_${grp%%,*}" "PYTHONPATH=$pp" --role fi --site "$site" --cases "$grp"
  done
fi
# (A) starts now (imports, libraries), times after (B)'s GPU work
libs=dk,fla
[ "$fi_ok" = 1 ] && libs=dk,fi,fla
(PYTHONPATH="$pp" timeout "${DECODE_TIMEOUT:-240}" python3 tools/bench_anchors_gdr.py --site "$site" --libs "$libs" \
   --lib .gpu-gdrdec/c2/libdk_gdr_decode.so --skip-prefill --sweep --graph-b2b --fla-extra --decode-t 1 \
   --sweep-only "${SWEEP_ONLY:-nw4_m5_pdl,nw4_m5_noslot_oop,kc_xs_rw8_nw1_m32,bv16_nw1_pre_fg_pdl}" \
   --wait-file /tmp/acc_gpu_done --budget-s 200 --out "$out/decode.json" >"$out/decode.txt" 2>"/tmp/decode.err"
 echo "rc=$?" >>/tmp/decode.err) &
dpid=$!
for p in "${pids[@]}"; do wait "$p"; done
touch /tmp/acc_gpu_done
echo "accuracy roles done at $(el)"
(CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=8 timeout 150 python3 "$A" --dir "$acc" --role merge --dev cpu \
   --out "$out/acc.json" >"$out/acc.txt" 2>/tmp/acc_merge.log; echo "rc=$?" >>/tmp/acc_merge.log)
echo "merge done at $(el)"
wait "$dpid"
echo "decode done at $(el)"
for f in /tmp/acc_*.log /tmp/decode.err; do echo "=== $f"; cat "$f"; done >"$out/logs.txt" 2>&1
echo "==== logs (tails)"
for f in /tmp/acc_*.log /tmp/decode.err; do echo "--- $f"; grep -v "^\s*$" "$f" | tail -n 4; done
grep -h "route" /tmp/acc_dk.log | sort | uniq -c | head -8
echo "==== decode (tools/bench_anchors_gdr.py)"
tail -n 60 "$out/decode.txt"
echo "==== accuracy vs float64 (rel. errors; contract: out 1e-2, state 1e-3)  [$(el)]"
cat "$out/acc.txt"
