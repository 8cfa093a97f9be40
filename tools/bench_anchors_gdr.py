#!/usr/bin/env python3
"""Three-way GDR anchor table: deltakit, FlashInfer 0.7.2 and FLA 0.6.0 measured in one process, one harness.

Sibling of tools/bench_anchors.py (which reads deltakit's criterion numbers): here deltakit's kernels run
inside the same Python process as the anchors, on the same inputs, timed the same way:
  - gdr.decode: csrc/gdr/decode.cu built as a shared library (tools/tune/gdr_decode_lib.cu; the library's
    own dk_gdr_decode dispatch, plus fixed tile configurations for the sweep), called through ctypes on
    torch's stream;
  - gdr.chunk_prefill: the Triton kernels of triton_aot/gdr/chunk_prefill.py, JIT-compiled with the
    constexprs / warps / stages of triton_aot/manifest.toml and launched in the order and grids of
    src/ops/gdr/chunk_prefill.rs (same source as the AOT cubins).
Anchors: FlashInfer (gated_delta_rule_decode_pretranspose; gdn_prefill.chunk_gated_delta_rule, use_cp
"auto") and FLA (fused_recurrent_gated_delta_rule / chunk_gated_delta_rule with state_v_first=True,
timed on a pre-gathered state: "kernel alone"). Their state layout is [slots, H_v, V, K]; deltakit's is
[slots, H_v, K, V] (the same values, transposed, so outputs are compared across libraries).

Timing (as ../shared/anchor-kit/bench_fi_fla.py): CUDA events around one call queued behind a ~1 ms
torch.cuda._sleep (host launch overhead hidden, as under CUDA graphs), 5 warm-ups, median of 20.
Decode runs twice per shape: "warm" = a pool of 2B+1 slots and the same B slots every call (the kit's
setup; at small B the state stays in the 50 MB L2), and "cold" = B fresh slots every call, rotating over
a pool of >= 1.5 GB (every byte from HBM: what a model step sees, since the other layers' states and
weights evict it). Units: decode f32 state TB/s = 2*B*H_v*K*V*4 / t; prefill nominal TFLOP/s =
4*T*H_v*K*V / t.

deltakit's prefill: with --dk-split-lib, the library's default on sm_90a (the split pipeline of
csrc/gdr/chunk_prefill_fused_sm90.cu, launched as src/ops/gdr/chunk_prefill.rs does: tools/dk_split_prefill.py; the
.so command is in docs/benchmarks/2026-12-02-gdr-anchor-s10.md). Without it, the portable Triton pipeline (not the
sm_90a default since session 4) from .gpu-gdr/libdk_gdr_bench.so (tools/tune/gdr_bundle.sh: the library's AOT
cubins of triton_aot/manifest.toml + the variants of tools/tune/gdr_prefill_variants.toml, called through their C
launchers); --dk-jit JIT-compiles triton_aot/gdr/chunk_prefill.py instead (for source variants not in any manifest).
--streaming times conv1d.prefill / conv1d.update / norm.rms_gated / norm.fused_add_rms (same library, same method)
as a fraction of the copy ceiling measured in the same process (a 2 GB torch device-to-device copy) and of a
size-matched copy. Several harness processes can share one GPU: --prepass runs every first call (FlashInfer's
CuTe-DSL compile, FLA's autotune) first, --wait-file waits for a file (e.g. the tests finishing) before timing, and
--lock-file serializes the timed phases of the processes (flock) and --barrier DIR:N holds every timed phase until all N
processes are past their first calls. --merge A.json B.json .. prints one table.

  python3 .anchor-kit/unpack.py /tmp/site
  python3 tools/bench_anchors_gdr.py --site /tmp/site --lib .gpu-gdr/libdk_gdr_decode.so --out r.json \
      [--only SUBSTR,..] [--skip-prefill] [--skip-decode] [--sweep] [--libs dk,fi,fla] [--budget-s 200]
      [--prefill tp1,tp2,9b8,9b64k] [--fla-prefill tp2] [--prefill-variants] [--streaming]
      [--prepass] [--wait-file F] [--lock-file L] [--dk-split-lib SO [--dk-split-variants 2060497,209]]
  python3 tools/bench_anchors_gdr.py --merge r1.json r2.json ..
"""
import argparse
import ctypes
import importlib.util
import json
import os
import site
import sys
import time
import tomllib
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
T0 = time.time()


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--site", default="")
    p.add_argument("--lib", default=str(ROOT / ".gpu-gdr/libdk_gdr_decode.so"))
    p.add_argument("--out", default="anchors_gdr.json")
    p.add_argument("--only", default="")
    p.add_argument("--skip-prefill", action="store_true")
    p.add_argument("--skip-decode", action="store_true")
    p.add_argument("--sweep", action="store_true", help="also time every fixed decode tile configuration")
    p.add_argument("--sweep-only", default="", help="comma-separated substrings: sweep only these configurations")
    p.add_argument("--graph-b2b", action="store_true", help="decode: also time 20 back-to-back calls in a CUDA graph")
    p.add_argument("--fla-extra", action="store_true",
                   help="decode: also time FLA's kernel on the [K, V] (V-contiguous) state (state_v_first=False) and "
                   "in place (its Triton kernel launched with ht = h0): what FLA's lead over deltakit is made of")
    p.add_argument("--graph-b2b-max-b", type=int, default=16, help="--graph-b2b only up to this batch")
    p.add_argument("--decode-t", default="1", help="decode tokens per row: comma-separated T values (T > 1: B 16/64)")
    p.add_argument("--libs", default="dk,fi,fla")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--budget-s", type=float, default=200.0)
    p.add_argument("--prefill", default="tp1,tp2,9b8,9b64k", help="prefill shapes: tp1,tp2,9b8,9b64k")
    p.add_argument("--fla-prefill", default="", help="prefill shapes (keys as --prefill) that also run FLA "
                   "(its Triton autotune takes ~45 s a shape)")
    p.add_argument("--prefill-variants", action="store_true",
                   help="also time the deltakit prefill variants of PREFILL_VARIANTS (W-split, W/U over grid z, state tiles)")
    p.add_argument("--dk-lib", default=str(ROOT / ".gpu-gdr/libdk_gdr_bench.so"),
                   help="AOT chunk-prefill launchers + conv1d / norm (tools/tune/gdr_bundle.sh)")
    p.add_argument("--dk-jit", action="store_true", help="JIT-compile deltakit's prefill kernels instead of --dk-lib")
    p.add_argument("--dk-split-lib", default="",
                   help="deltakit's prefill = the library default on sm_90a (the split pipeline, "
                   "tools/dk_split_prefill.py) from this .so instead of the Triton pipeline of --dk-lib / --dk-jit")
    p.add_argument("--dk-split-variants", default="",
                   help="--dk-split-lib: split variants (default: the library's SPLIT_VARIANT, read from "
                   "src/ops/gdr/chunk_prefill.rs); the first is the row's deltakit, the others rows "
                   "dk:v<variant>")
    p.add_argument("--streaming", action="store_true", help="time conv1d.* / norm.* against the copy ceiling")
    p.add_argument("--prepass", action="store_true", help="run every anchor's first (compiling) call before timing")
    p.add_argument("--wait-file", default="", help="wait until this file exists before the timed phase")
    p.add_argument("--lock-file", default="", help="flock this file around the timed phase")
    p.add_argument("--barrier", default="", help="DIR:N: after the first calls, wait until N processes reached DIR "
                   "(so that no process times while another still compiles / autotunes on the GPU)")
    p.add_argument("--merge", nargs="*", default=None, help="print one table of these result files and exit")
    p.add_argument("--sm90-state", action="store_true",
                   help="check + time the sm_90a CUDA state pass (csrc/gdr/chunk_prefill_sm90.cu, in --dk-lib) against "
                   "the Triton W-split state pass on the same workspace")
    return p.parse_args()


ARGS = parse_args()
if ARGS.merge is not None:
    RES = {"meta": {}, "rows": []}
else:
    RES = None
if ARGS.site:
    site.addsitedir(ARGS.site)
    sys.path.insert(0, ARGS.site)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

DEV = "cuda"
K = V = 128
LIBS = set(ARGS.libs.split(","))
if RES is None:
    RES = {"meta": {"torch": torch.__version__}, "rows": []}


def elapsed():
    return time.time() - T0


def save():
    with open(ARGS.out, "w") as f:
        json.dump(RES, f, indent=1, default=str)


def err_text(e):
    return " ".join(f"{type(e).__name__}: {e}".split())[:300]


def gpu_ms(fn, warmup=None, reps=None):
    """Median GPU time (ms) of fn() queued behind a ~1 ms spin (host overhead hidden)."""
    warmup = ARGS.warmup if warmup is None else warmup
    reps = ARGS.reps if reps is None else reps
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(2_000_000)
        s.record()
        fn()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e))
    ts.sort()
    return ts[len(ts) // 2]


def rel(a, b):
    a, b = a.float().reshape(-1), b.float().reshape(-1)
    if not torch.isfinite(a).all():
        return float("nan")
    return (torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b).clamp_min(1e-30)).item()


# ------------------------------------------------------------------------------------------ libraries
def load_anchors():
    libs = {}
    if "fi" in LIBS:
        try:
            import flashinfer.gdn_decode as fid
            import flashinfer.gdn_prefill as fip
            libs["fi_decode"] = fid.gated_delta_rule_decode_pretranspose
            libs["fi_prefill"] = fip.chunk_gated_delta_rule
        except Exception as e:  # noqa: BLE001
            RES["meta"]["fi_import_error"] = err_text(e)
            print(traceback.format_exc()[-2000:], file=sys.stderr)
    if "fla" in LIBS:
        try:
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
            libs["fla_decode"] = fused_recurrent_gated_delta_rule
            libs["fla_prefill"] = chunk_gated_delta_rule
        except Exception as e:  # noqa: BLE001
            RES["meta"]["fla_import_error"] = err_text(e)
    return libs


class DecodeParams(ctypes.Structure):
    """csrc/include/gdr.h DkGdrDecodeParams."""
    _fields_ = [(n, ctypes.c_uint64) for n in ("q", "k", "v", "a", "b", "a_log", "dt_bias", "slots", "state", "out")] + \
        [(n, ctypes.c_int64) for n in ("n", "t", "h_k", "h_v", "k_dim", "v_dim", "num_slots", "q_stride", "k_stride",
                                       "v_stride", "ab_stride")] + [("scale", ctypes.c_float), ("use_qk_l2norm", ctypes.c_int32)]


class DkDecode:
    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        self.lib.dk_gdr_decode.argtypes = [ctypes.POINTER(DecodeParams), ctypes.c_void_p]
        self.lib.dk_tune_gdr_decode_cfg.argtypes = [ctypes.POINTER(DecodeParams), ctypes.c_int, ctypes.c_void_p]
        self.lib.dk_tune_gdr_decode_cfg_name.restype = ctypes.c_char_p
        self.cfgs = [self.lib.dk_tune_gdr_decode_cfg_name(i).decode()
                     for i in range(self.lib.dk_tune_gdr_decode_num_cfgs())]

    def params(self, q, k, v, a, b, a_log, dt_bias, slots, state, out, hk, hv, t=1):
        n = slots.numel()
        p = DecodeParams(q.data_ptr(), k.data_ptr(), v.data_ptr(), a.data_ptr(), b.data_ptr(), a_log.data_ptr(),
                         dt_bias.data_ptr(), slots.data_ptr(), state.data_ptr(), out.data_ptr(), n, t, hk, hv, K, V,
                         state.shape[0], hk * K, hk * K, hv * V, hv, K ** -0.5, 1)
        return p

    @staticmethod
    def params_like(p, slots):
        """A copy of p with other slots (same n)."""
        c = DecodeParams()
        ctypes.pointer(c)[0] = p
        c.slots = slots.data_ptr()
        return c

    def call(self, p, cfg=None):
        s = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        st = self.lib.dk_gdr_decode(ctypes.byref(p), s) if cfg is None else \
            self.lib.dk_tune_gdr_decode_cfg(ctypes.byref(p), cfg, s)
        if st != 0:
            raise RuntimeError(f"dk_gdr_decode status {st}")


def load_chunk_module():
    spec = importlib.util.spec_from_file_location("dk_chunk_prefill", ROOT / "triton_aot/gdr/chunk_prefill.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    man = tomllib.loads((ROOT / "triton_aot/manifest.toml").read_text())
    ents = {e["name"]: e for e in man["kernel"]}
    return m, ents


# ------------------------------------------------------------------------------------------ decode
def sx_check(dk, ci, sx, par, pool, pool_vk, out, slots_warm, ref_dk, B, T, hv, cpool, cpool_oop, kc=False):
    """Correctness of a measurement-only configuration with SX bits (csrc/gdr/decode.cu decode_sl_kernel SX; kc_*:
    tools/tune/gdr_decode_lib.cu decode_kcx_kernel on the K-contiguous pool): *_oop writes the state to slot + num_slots
    of a doubled pool cpool_oop (compared with the dispatch on the same slots), *_noslot has row n use slot n (compared
    with the dispatch on slots 0..B-1). cpool / cpool_oop are the configuration's pools ([K, V] pool / pool_oop, or the
    K-contiguous ones for kc); pool is the dispatch's. Leaves the pools holding the initial states."""
    init = pool_vk.transpose(-1, -2)
    cinit = pool_vk if kc else init
    P = cpool.shape[0]
    if "noslot" in sx:
        ident = torch.arange(B, device=DEV, dtype=torch.int32)
        pool.copy_(init)
        dk.call(dk.params_like(par(slots_warm), ident))
        torch.cuda.synchronize()
        ref = (out.clone().view(B, T, hv, V), pool[:B].transpose(-1, -2).clone())
        pool.copy_(init)
    else:
        ref = ref_dk
    cpool.copy_(cinit)
    if cpool_oop is not None:
        cpool_oop[:P].copy_(cinit)
    out.fill_(float("nan"))
    dk.call(par(slots_warm, kc, sx), ci)
    torch.cuda.synchronize()
    o_c = out.clone().view(B, T, hv, V)
    if sx == "noslot":
        s_c = cpool[:B]
    elif sx == "oop":
        s_c = cpool_oop[P + slots_warm.long()]
    else:  # noslot_oop: the window-0 view (slots 0..B-1) writes to slots B..2B-1
        s_c = cpool_oop[B:2 * B]
    r = {"relerr_o_vs_dk": rel(o_c, ref[0]), "relerr_s_vs_dk": rel(s_c if kc else s_c.transpose(-1, -2), ref[1]),
         "note": "measurement only: " + sx}
    cpool.copy_(cinit)
    if cpool_oop is not None:
        cpool_oop[:P].copy_(cinit)
    return r


def fla_extra(row, timed, fla, kw, ref, q, k, v, a, b, A_log, dt_bias, pool_vk, slots_warm, wins, hk, hv, B, T):
    """FLA's fused_recurrent kernel on the [K, V] state (state_v_first=False: 128 rows x 8 columns = 32-byte pieces per
    program) and in place on the K-contiguous state (its Triton kernel launched with ht = h0, as the wrapper launches
    it otherwise): separates FLA's layout and its out-of-place state write from its work shape."""
    kw_kv = dict(kw, state_v_first=False)
    try:
        h0 = pool_vk[slots_warm.long()].transpose(-1, -2).contiguous()
        o, ht = fla(q, k, v, initial_state=h0, **kw_kv)
        torch.cuda.synchronize()
        h0s = {id(sl): pool_vk[sl.long()].transpose(-1, -2).contiguous() for sl in [slots_warm] + wins}
        timed("fla_kv", lambda sl: (lambda h0=h0s[id(sl)]: fla(q, k, v, initial_state=h0, **kw_kv)))
        row["fla_kv"].update(relerr_o_vs_fla=rel(o, ref[0]), relerr_s_vs_fla=rel(ht.transpose(-1, -2), ref[1]))
        del h0s
    except Exception as e:  # noqa: BLE001
        row["fla_kv"] = {"error": err_text(e)}
    try:
        from fla.ops.gated_delta_rule.fused_recurrent import fused_recurrent_gated_delta_rule_fwd_kernel as fk
        o_ip = torch.empty_like(v)

        def inplace(h0):
            fk[((V // 8) * B * hv,)](
                q=q, k=k, v=v, g=a, gk=None, gv=None, beta=b, A_log=A_log, dt_bias=dt_bias, o=o_ip, h0=h0, ht=h0,
                cu_seqlens=None, scale=K ** -0.5, T=T, H=hk, HV=hv, K=K, V=V, BK=K, BV=8, IS_BETA_HEADWISE=True,
                USE_QK_L2NORM_IN_KERNEL=True, APPLY_BETA_SIGMOID=True, ALLOW_NEG_EIGVAL=False, STATE_V_FIRST=True,
                num_warps=1, num_stages=3)
        h0 = pool_vk[slots_warm.long()].contiguous()
        inplace(h0)
        torch.cuda.synchronize()
        err = (rel(o_ip, ref[0]), rel(h0, ref[1]))
        h0s = {id(sl): pool_vk[sl.long()].contiguous() for sl in [slots_warm] + wins}
        timed("fla_inplace", lambda sl: (lambda h0=h0s[id(sl)]: inplace(h0)))
        row["fla_inplace"].update(relerr_o_vs_fla=err[0], relerr_s_vs_fla=err[1])
        del h0s
    except Exception as e:  # noqa: BLE001
        row["fla_inplace"] = {"error": err_text(e)}


def decode_row(libs, dk, name, hk, hv, B, T=1):
    row = {"kind": "decode", "case": name, "B": B, "T": T}
    RES["rows"].append(row)
    byts = 2.0 * B * hv * K * V * 4
    tbps = lambda ms: byts / (ms * 1e-3) / 1e12  # noqa: E731
    g = torch.Generator(device=DEV).manual_seed(B * 7 + hv + 1000 * (T - 1))
    rn = lambda *s: torch.randn(*s, device=DEV, generator=g)  # noqa: E731
    q, k = rn(B, T, hk, K).bfloat16(), rn(B, T, hk, K).bfloat16()
    v = rn(B, T, hv, V).bfloat16()
    a, b = rn(B, T, hv).bfloat16(), rn(B, T, hv).bfloat16()
    A_log = torch.log(torch.empty(hv, device=DEV).uniform_(1, 16, generator=g))
    dt_bias = (0.5 * rn(hv)).contiguous()
    per_slot = hv * K * V * 4
    P_warm = 2 * B + 1
    n_win = max(2, min(64, int(1.5e9 // (B * per_slot)) + 1))  # cold: windows of B fresh slots
    P_cold = n_win * B
    pool_vk = (0.05 * rn(max(P_warm, P_cold), hv, V, K)).contiguous()  # [slot, Hv, V, K]
    slots_warm = torch.randperm(P_warm, device=DEV, generator=g)[:B].to(torch.int32)
    perm = torch.randperm(P_cold, device=DEV, generator=g).to(torch.int32)
    wins = [perm[i * B:(i + 1) * B].clone() for i in range(n_win)]  # own allocations (FlashInfer wants aligned ones)
    row["cold_pool_slots"] = P_cold
    outs = {}

    def timed(key, mk):  # mk(slots) -> callable; warm and cold timings
        r = row.setdefault(key, {})
        try:
            fw = mk(slots_warm)
            r["warm_ms"] = gpu_ms(fw)
            r["warm_TBps"] = tbps(r["warm_ms"])
            calls = [mk(w) for w in wins]
            it = [0]

            def fc():
                it[0] = (it[0] + 1) % len(calls)
                calls[it[0]]()
            r["cold_ms"] = gpu_ms(fc)
            r["cold_TBps"] = tbps(r["cold_ms"])
            if ARGS.graph_b2b and B <= ARGS.graph_b2b_max_b and (key.startswith("dk") or key == "fla_kernel"):
                # Back-to-back: 20 calls (cold windows) captured in one CUDA graph, replay time / 20 (what a model
                # step's graph sees: no launch gaps, no lone-kernel event overhead).
                gr = torch.cuda.CUDAGraph()
                with torch.cuda.graph(gr):
                    for i in range(20):
                        calls[i % len(calls)]()
                r["b2b_us"] = gpu_ms(gr.replay, warmup=3, reps=10) * 1e3 / 20
                del gr
        except Exception as e:  # noqa: BLE001
            r["error"] = err_text(e)

    if "fi_decode" in libs and T == 1:
        fi = libs["fi_decode"]
        pool = pool_vk.clone()
        out = torch.empty(B, 1, hv, V, device=DEV, dtype=torch.bfloat16)
        try:
            fi(q, k, v, None, A_log, a, dt_bias, b, output=out, use_qk_l2norm=True, initial_state=pool,
               initial_state_indices=slots_warm)
            torch.cuda.synchronize()
            outs["fi"] = (out.clone(), pool[slots_warm.long()].clone())
        except Exception as e:  # noqa: BLE001
            row["fi"] = {"error": err_text(e)}
        if "fi" not in row:
            timed("fi", lambda sl: (lambda: fi(q, k, v, None, A_log, a, dt_bias, b, output=out, use_qk_l2norm=True,
                                               initial_state=pool, initial_state_indices=sl)))
        del pool
    if "fla_decode" in libs:
        fla = libs["fla_decode"]
        kw = dict(g=a, beta=b, A_log=A_log, dt_bias=dt_bias, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                  output_final_state=True, use_qk_l2norm_in_kernel=True, state_v_first=True)
        try:
            o, ht = fla(q, k, v, initial_state=pool_vk[slots_warm.long()].contiguous(), **kw)
            torch.cuda.synchronize()
            outs["fla"] = (o.clone(), ht.clone())
            h0s = {id(sl): pool_vk[sl.long()].contiguous() for sl in [slots_warm] + wins}
            timed("fla_kernel", lambda sl: (lambda h0=h0s[id(sl)]: fla(q, k, v, initial_state=h0, **kw)))
            row["fla_kernel"]["note"] = "kernel alone on a pre-gathered state"
            del h0s
        except Exception as e:  # noqa: BLE001
            row["fla_kernel"] = {"error": err_text(e)}
        if ARGS.fla_extra and "fla" in outs:
            fla_extra(row, timed, fla, kw, outs["fla"], q, k, v, a, b, A_log, dt_bias, pool_vk, slots_warm, wins,
                      hk, hv, B, T)
    if dk is not None:
        pool = pool_vk.transpose(-1, -2).contiguous()  # [slot, Hv, K, V]
        out = torch.empty(B * T, hv, V, device=DEV, dtype=torch.bfloat16)
        ps = {}
        pool_kc = None  # K-contiguous pool for the kc_* sweep configurations (created on first use)
        pool_oop = None  # twice the pool for the *_oop configurations (state written to slot + num_slots)
        pool_kc_oop = None  # the same for the K-contiguous kc_*_oop configurations
        win_of = {id(slots_warm): 0}
        win_of.update({id(w_): i for i, w_ in enumerate(wins)})

        def par(sl, kc=False, sx=""):
            key = (id(sl), kc, sx)
            if key not in ps:
                base, base_oop = (pool_kc, pool_kc_oop) if kc else (pool, pool_oop)
                if "noslot" in sx:  # row n reads slot n of a window-sized view: fresh rows for every cold window
                    # (out of place: views at 2 w B, written at (2 w + 1) B, so no window reads what another wrote)
                    w_ = win_of[id(sl)] * (2 if "oop" in sx else 1)
                    st_ = (base_oop if "oop" in sx else base)[w_ * B:(w_ + 1) * B]
                    ps[key] = dk.params(q, k, v, a, b, A_log, dt_bias, sl, st_, out, hk, hv, T)
                elif "oop" in sx:
                    ps[key] = dk.params(q, k, v, a, b, A_log, dt_bias, sl, base_oop, out, hk, hv, T)
                    ps[key].num_slots = base_oop.shape[0] // 2
                else:
                    ps[key] = dk.params(q, k, v, a, b, A_log, dt_bias, sl, pool_kc if kc else pool, out, hk, hv, T)
            return ps[key]
        try:
            dk.call(par(slots_warm))
            torch.cuda.synchronize()
            outs["dk"] = (out.clone().view(B, T, hv, V), pool[slots_warm.long()].transpose(-1, -2).clone())
            pool.copy_(pool_vk.transpose(-1, -2))
            timed("dk", lambda sl: (lambda p=par(sl): dk.call(p)))
            if ARGS.sweep:
                for ci, cn in enumerate(dk.cfgs):
                    if ARGS.sweep_only and not any(x in cn for x in ARGS.sweep_only.split(",")):
                        continue
                    kc = cn.startswith("kc_")
                    if kc and pool_kc is None:
                        pool_kc = pool_vk.clone()  # [slot, Hv, V, K]
                    sx = "_".join(x_ for x_ in ("noslot", "oop") if "_" + x_ in cn)
                    if sx:
                        try:
                            if "oop" in sx and not kc and pool_oop is None:
                                pool_oop = torch.empty((2 * pool.shape[0],) + tuple(pool.shape[1:]), device=DEV)
                            if "oop" in sx and kc and pool_kc_oop is None:
                                pool_kc_oop = torch.empty((2 * pool_kc.shape[0],) + tuple(pool_kc.shape[1:]),
                                                          device=DEV)
                            cp_, cpo_ = (pool_kc, pool_kc_oop) if kc else (pool, pool_oop)
                            row["dk:" + cn] = sx_check(dk, ci, sx, par, pool, pool_vk, out, slots_warm, outs["dk"],
                                                       B, T, hv, cp_, cpo_, kc)
                        except Exception as e:  # noqa: BLE001
                            row["dk:" + cn] = {"error": err_text(e)}
                            continue
                        timed("dk:" + cn, lambda sl, ci=ci, sx=sx, kc=kc: (lambda p=par(sl, kc, sx): dk.call(p, ci)))
                        continue
                    # correctness of the configuration vs the dispatch (same inputs, same initial states: the timing
                    # calls before this one updated the pool in place, so restore it first)
                    try:
                        if kc:
                            pool_kc.copy_(pool_vk)
                        else:
                            pool.copy_(pool_vk.transpose(-1, -2))
                        out.fill_(float("nan"))
                        dk.call(par(slots_warm, kc), ci)
                        torch.cuda.synchronize()
                        o_c = out.clone().view(B, T, hv, V)
                        if kc:
                            s_c = pool_kc[slots_warm.long()].clone()
                            pool_kc.copy_(pool_vk)
                        else:
                            s_c = pool[slots_warm.long()].transpose(-1, -2).clone()
                            pool.copy_(pool_vk.transpose(-1, -2))
                        row["dk:" + cn] = {"relerr_o_vs_dk": rel(o_c, outs["dk"][0]),
                                           "relerr_s_vs_dk": rel(s_c, outs["dk"][1])}
                    except Exception as e:  # noqa: BLE001
                        row["dk:" + cn] = {"error": err_text(e)}
                        continue
                    timed("dk:" + cn, lambda sl, ci=ci, kc=kc: (lambda p=par(sl, kc): dk.call(p, ci)))
                    if cn.startswith("prof_") and T == 1:
                        try:
                            row["dk:" + cn]["timeline"] = timeline(dk, par(wins[0]), ci, B * hv * 2, 64 * K * 4)
                        except Exception as e:  # noqa: BLE001
                            row["dk:" + cn]["timeline"] = {"error": err_text(e)}
        except Exception as e:  # noqa: BLE001
            row["dk"] = {"error": err_text(e)}
        del pool, pool_kc, pool_oop, pool_kc_oop
    ref = outs.get("fi") or outs.get("fla")
    for key in ("dk", "fla"):
        if key in outs and ref is not None and outs[key] is not ref:
            row[f"relerr_o_{key}"] = rel(outs[key][0], ref[0])
            row[f"relerr_s_{key}"] = rel(outs[key][1], ref[1])
    del pool_vk
    torch.cuda.empty_cache()


def timeline(dk, p, ci, ctas, tile_bytes):
    """One cold call of a prof_* configuration (per-CTA %globaltimer stamps: start, state loaded, tokens done, end,
    SM id; tools/tune/gdr_decode_lib.cu decode_prof_kernel) -> phase statistics, resident CTAs and the state read
    (attributed at 'loaded') / write (at 'end') rates over time, the tail after the last CTA start."""
    import numpy as np
    torch.cuda._sleep(2_000_000)
    dk.call(p, ci)
    torch.cuda.synchronize()
    buf = (ctypes.c_ulonglong * (ctas * 5))()
    f = dk.lib.dk_tune_gdr_decode_prof
    f.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    if f(ctypes.cast(buf, ctypes.c_void_p), ctas) != 0:
        raise RuntimeError("dk_tune_gdr_decode_prof failed")
    a = np.frombuffer(buf, dtype=np.uint64).reshape(ctas, 5).astype(np.float64)
    t0 = a[:, 0].min()
    s, l, c, e = ((a[:, i] - t0) / 1e3 for i in range(4))  # us
    sm = a[:, 4].astype(int)
    span = e.max()
    stamps = np.unique(np.concatenate([s, l, c, e]))
    res = {"ctas": ctas, "span_us": span, "timer_step_us": float(np.diff(stamps)[np.diff(stamps) > 0].min())
           if stamps.size > 1 else float("nan")}
    pct = lambda x: [float(np.percentile(x, q)) for q in (10, 50, 90)]  # noqa: E731
    res["load_us_p10_50_90"] = pct(l - s)
    res["compute_us_p10_50_90"] = pct(c - l)
    res["store_issue_us_p10_50_90"] = pct(e - c)
    res["life_us_p10_50_90"] = pct(e - s)
    first = s < 1.0
    res["first_wave_ctas"] = int(first.sum())
    res["first_wave_load_us_median"] = float(np.median((l - s)[first])) if first.any() else float("nan")
    res["later_load_us_median"] = float(np.median((l - s)[~first])) if (~first).any() else float("nan")
    last_start = s.max()
    res["last_start_us"] = float(last_start)
    res["tail_us"] = float(span - last_start)
    cnt = np.bincount(sm, minlength=sm.max() + 1)
    res["ctas_per_sm_min_max"] = [int(cnt[cnt > 0].min()), int(cnt.max())]
    res["sm_end_us_min_med_max"] = [float(x) for x in np.percentile(
        [e[sm == i].max() for i in np.unique(sm)], [0, 50, 100])]
    bins = np.arange(0.0, span + 2.0, 2.0)
    rd = np.histogram(l, bins)[0] * tile_bytes / 2e-6 / 1e12
    wr = np.histogram(e, bins)[0] * tile_bytes / 2e-6 / 1e12
    mid = np.arange(len(bins) - 1) * 2.0 + 1.0
    act = [int(((s <= m) & (e > m)).sum()) for m in mid]
    res["per2us_read_write_TBps_resident"] = [[round(float(x), 2), round(float(y), 2), z] for x, y, z in zip(rd, wr, act)]
    lo, hi = 0.1 * span, 0.9 * span
    sel = (mid > lo) & (mid < hi)
    res["mid80_read_plus_write_TBps"] = float((rd[sel] + wr[sel]).mean()) if sel.any() else float("nan")
    res["resident_max"] = int(max(act)) if act else 0
    res["time_below_90pct_resident_us"] = float(2.0 * sum(1 for x in act if x < 0.9 * max(act)))
    return res


# ------------------------------------------------------------------------------------------ prefill
PREFILL = {
    "tp1": ("prefill 27B-TP1 16/48 1x8192", 16, 48, [8192]),
    "tp2": ("prefill 27B-TP2 8/24 1x8192", 8, 24, [8192]),
    "9b8": ("prefill 9B 16/32 8x8192", 16, 32, [8192] * 8),
    "9b64k": ("prefill 9B 16/32 1x65536", 16, 32, [65536]),
}


# deltakit prefill pipelines. A config: pipe = the K = V = 128 pipeline of src/ops/gdr/chunk_prefill.rs
# (PrefillPipeline: f32w | wsplit | splitz | wsplit_splitz), wu_w8 (the W/U-over-z entries at 8 warps,
# tools/tune/gdr_prefill_variants.toml), state_bv (None: the wrapper's rule, W planes at BV 16 where N * H_v <= 33).
# JIT only (--dk-jit): prep (split | staged | fused), state_nw / state_ns / state_maxnreg, wu_nw / wu_maxnreg.
# LIB_CFG = what the library dispatches by default (DEFAULT_PIPELINE of src/ops/gdr/chunk_prefill.rs).
LIB_CFG = {"pipe": "wsplit_splitz"}
# Variants timed with --prefill-variants (whole call + the wu / state stages; relative errors vs LIB_CFG).
PREFILL_VARIANTS = {
    "f32w": {"pipe": "f32w"},
    "wsplit": {"pipe": "wsplit"},
    "splitz": {"pipe": "splitz"},
    "splitz_w8": {"pipe": "splitz", "wu_w8": 1},
    "wsplit_splitz": {"pipe": "wsplit_splitz"},
    "wsplit_splitz_w8": {"pipe": "wsplit_splitz", "wu_w8": 1},
    "ws_bv16": {"pipe": "wsplit", "state_bv": 16},
    "ws_bv32": {"pipe": "wsplit", "state_bv": 32},
}
NARROW_MAX_ROWS = 33  # STATE_NARROW_MAX_ROWS of the wrapper


class StateSm90Params(ctypes.Structure):
    """csrc/gdr/chunk_prefill_sm90.h DkGdrStateSm90Params."""
    _fields_ = [(n, ctypes.c_uint64) for n in ("k", "w", "u", "gcum", "h", "state", "cu_seqlens", "slots", "init",
                                               "coff")] + \
        [(n, ctypes.c_int64) for n in ("num_tokens", "num_seqs", "num_slots", "h_k", "h_v", "k_dim", "v_dim",
                                       "k_stride")] + [("use_l2", ctypes.c_int32), ("init_mode", ctypes.c_int32)]


def sm90_state_check(aot, cp, ents, q, k, v, glog, beta, cu, slots, pool, o, hk, hv, n, t, lens):
    """The sm_90a CUDA state pass vs the Triton W-split state pass (BV 32) on one workspace: relative errors of h
    (per-chunk states), D (over U) and the final states, and both GPU times."""
    res = {}
    f = getattr(aot.lib, "dk_gdr_chunk_state_sm90", None)
    if f is None:
        return {"error": "dk_gdr_chunk_state_sm90 not in the library"}
    f.argtypes = [ctypes.POINTER(StateSm90Params), ctypes.c_void_p]
    sv = dk_prefill_fn(cp, ents, q, k, v, glog, beta, cu, slots, pool, o, hk, hv, n, t, {"pipe": "wsplit", "state_bv": 32},
                       aot=aot)
    ws = sv.ws
    sv("mkvw")
    torch.cuda.synchronize()
    u0, p0 = ws["u"].clone(), pool.clone()
    nch = sum((L + 63) // 64 for L in lens)
    hsz = nch * hv * K * V
    ws["h"].fill_(float("nan"))
    sv("s")
    torch.cuda.synchronize()
    ref = (ws["h"][:hsz].clone(), ws["u"].clone(), pool.clone())
    ws["u"].copy_(u0)
    pool.copy_(p0)
    ws["h"].fill_(float("nan"))
    prm = StateSm90Params(k.data_ptr(), sv.wbuf.data_ptr(), ws["u"].data_ptr(), ws["gcum"].data_ptr(), ws["h"].data_ptr(),
                          pool.data_ptr(), cu.data_ptr(), slots.data_ptr(), slots.data_ptr(), ws["coff"].data_ptr(),
                          t, n, pool.shape[0], hk, hv, K, V, hk * K, 1, 1)

    fv = getattr(aot.lib, "dk_gdr_chunk_state_sm90_variant", None)
    if fv is not None:
        fv.argtypes = [ctypes.POINTER(StateSm90Params), ctypes.c_int, ctypes.c_void_p]

    def call(var=0):
        s_ = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        st = f(ctypes.byref(prm), s_) if var == 0 else fv(ctypes.byref(prm), var, s_)
        if st != 0:
            raise RuntimeError(f"dk_gdr_chunk_state_sm90 variant {var} status {st}")
    for var in (0, 1, 2) if fv is not None else (0,):
        sfx = "" if var == 0 else f"_v{var}"
        ws["u"].copy_(u0)
        pool.copy_(p0)
        ws["h"].fill_(float("nan"))
        try:
            call(var)
            torch.cuda.synchronize()
            res["relerr_h" + sfx] = rel(ws["h"][:hsz], ref[0])
            res["relerr_d" + sfx] = rel(ws["u"], ref[1])
            res["relerr_state" + sfx] = rel(pool, ref[2])
            res["sm90_state" + sfx + "_ms"] = gpu_ms(lambda var=var: call(var), reps=10)
        except Exception as e:  # noqa: BLE001
            res["error" + sfx] = err_text(e)
    res["triton_state_ms"] = gpu_ms(lambda: sv("s"), reps=10)
    return res


class DkAot:
    """The AOT C launchers of libdk_gdr_bench.so (dk_triton_<name>(stream, gx, gy, gz, args..) -> status), with
    argument types from the manifests' signatures in the kernels' declaration order (as triton_aot/aot.py)."""
    CT = {"i32": ctypes.c_int32, "i64": ctypes.c_int64, "fp32": ctypes.c_float}

    def __init__(self, path, cp):
        self.lib = ctypes.CDLL(path)
        ents = {}
        for mf in (ROOT / "triton_aot/manifest.toml", ROOT / "tools/tune/gdr_prefill_variants.toml"):
            for e in tomllib.loads(mf.read_text())["kernel"]:
                ents[e["name"]] = e
        self.ents, self.fns = ents, {}
        for name, e in ents.items():
            if not name.startswith("gdr_chunk_") or not hasattr(self.lib, "dk_triton_" + name):
                continue
            fn = getattr(cp, e["function"])
            order = [a for a in fn.arg_names if a not in e.get("constexprs", {})]
            f = getattr(self.lib, "dk_triton_" + name)
            f.argtypes = [ctypes.c_void_p] + [ctypes.c_uint32] * 3 + [
                ctypes.c_uint64 if e["signature"][a].startswith("*") else self.CT[e["signature"][a]] for a in order]
            f.restype = ctypes.c_int
            self.fns[name] = f

    def __call__(self, name, grid, *args):
        g = tuple(grid) + (1,) * (3 - len(grid))
        a = [x.data_ptr() if isinstance(x, torch.Tensor) else x for x in args]
        st = self.fns[name](ctypes.c_void_p(torch.cuda.current_stream().cuda_stream), *g, *a)
        if st != 0:
            raise RuntimeError(f"dk_triton_{name} status {st}")


def dk_prefill_fn(cp, ents, q, k, v, glog, beta, cu, slots, pool, o, hk, hv, n, t, cfg=None, aot=None):
    """deltakit chunk prefill: the launches of src/ops/gdr/chunk_prefill.rs (precomputed gating, l2 norm,
    initial state from the slots) for the pipeline config `cfg` (default LIB_CFG), workspace allocated once,
    through the AOT launchers (`aot`, the library's cubins) or JIT-compiled (`aot` None).
    Returns stages(which): which = letters of m (offsets + map), k (kkt), v (solve), w (wu), s (state),
    o (out); p = kvw."""
    cfg = {**LIB_CFG, **(cfg or {})}
    pipe = cfg["pipe"]
    nt = t // 64 + n
    dev = q.device
    ws_ = int(pipe in ("wsplit", "wsplit_splitz"))
    wz = int(pipe in ("splitz", "wsplit_splitz"))
    ws = dict(coff=torch.empty(n + 1, device=dev, dtype=torch.int32), cseq=torch.empty(nt, device=dev, dtype=torch.int32),
              gcum=torch.empty(t * hv, device=dev), betaw=torch.empty(t * hv, device=dev),
              A=torch.empty(t * hv * 64, device=dev), w=torch.empty(t * hv * K, device=dev),
              u=torch.empty(t * hv * V, device=dev), h=torch.empty(nt * hv * K * V, device=dev, dtype=torch.bfloat16))
    wbuf = ws["w"].view(torch.bfloat16) if ws_ else ws["w"]
    ns = pool.shape[0]
    iters = max(1, int(n).bit_length())
    a_dummy = q  # fused = 0: a/b/A_log/dt_bias unused (bf16 / f32 pointers of any live buffer)
    sbv = cfg.get("state_bv") or (16 if (ws_ and n * hv <= NARROW_MAX_ROWS) else 32)
    wu_name = "gdr_chunk_wu_k128v128" + ("_ws" if ws_ else "") + ("_splitz" if wz else "") + \
        ("_w8" if wz and cfg.get("wu_w8") else "")
    st_name = f"gdr_chunk_state_k128v128_ws_bv{sbv}" if ws_ else "gdr_chunk_state_k128v128"
    if not ws_ and sbv != 32:
        st_name = None  # f32 W at another BV: JIT only
    bvo = ents["gdr_chunk_out_k128v128"]["constexprs"]["BV"]
    kargs = (k, glog, beta, a_dummy, a_dummy, glog, glog, cu, slots, ws["coff"], ws["cseq"], ws["gcum"], ws["betaw"],
             ws["A"], t, ns, hk, hv, hk * K, hv, 1, 0)
    wargs = (k, v, ws["betaw"], ws["gcum"], ws["A"], wbuf, ws["u"], cu, slots, ws["coff"], ws["cseq"], t, ns, hk, hv,
             hk * K, hv * V, 1)
    sargs = (k, wbuf, ws["u"], ws["gcum"], ws["h"], pool, cu, slots, slots, ws["coff"], t, ns, hk, hv, hk * K, 1, 1)
    oargs = (q, k, ws["u"], ws["gcum"], ws["h"], o, cu, slots, ws["coff"], ws["cseq"], t, ns, hk, hv, hk * K, hk * K, 1,
             K ** -0.5)
    if aot is not None:
        if st_name is None or wu_name not in aot.fns:
            raise RuntimeError(f"no AOT entry for {cfg} (wu {wu_name}, state {st_name})")

        def stages(which="mkvwso"):
            which = which.replace("p", "kvw")
            if "m" in which:
                aot("gdr_chunk_offsets", (1,), cu, ws["coff"], n, t, nt)
                aot("gdr_chunk_map", ((nt + 127) // 128,), ws["coff"], ws["cseq"], n, nt, iters)
            if "k" in which:
                aot("gdr_chunk_kkt_k128", (nt, hv), *kargs)
            if "v" in which:
                aot("gdr_chunk_solve", (nt, hv), ws["A"], cu, slots, ws["coff"], ws["cseq"], t, ns, hv)
            if "w" in which:
                aot(wu_name, (nt, hv, 2 if wz else 1), *wargs)
            if "s" in which:
                aot(st_name, (n, hv, V // sbv), *sargs)
            if "o" in which:
                aot("gdr_chunk_out_k128v128", (nt, hv, V // bvo), *oargs)
        stages.ws, stages.wbuf = ws, wbuf
        return stages

    def opt(name, extra=None, nw=None, ns_=None, maxnreg=None):
        ent = ents[name]
        o_ = dict(num_warps=nw or ent["num_warps"], num_stages=ns_ or ent["num_stages"], **ent.get("constexprs", {}))
        o_.update(extra or {})
        if maxnreg:
            o_["maxnreg"] = maxnreg
        return o_
    s_opt = opt("gdr_chunk_state_k128v128", {"BV": sbv, "WSPLIT": ws_}, cfg.get("state_nw"), cfg.get("state_ns"),
                cfg.get("state_maxnreg"))
    w_opt = opt("gdr_chunk_wu_k128v128", {"WSPLIT": ws_, "SPLITZ": wz}, cfg.get("wu_nw") or (8 if cfg.get("wu_w8") else
                (4 if wz else None)), None, cfg.get("wu_maxnreg"))
    prep = cfg.get("prep", "split")
    if prep == "split":
        k_opt = opt("gdr_chunk_kkt_k128")
    else:
        # gdr_chunk_kkt_solve_kernel is not in the manifest: the kkt entry's constexprs + the solve's PREC.
        k_opt = opt("gdr_chunk_kkt_k128", {"PREC": 1, "STAGED": int(prep == "staged")},
                    nw=1 if prep == "fused" else 4, ns_=1)

    def stages(which="mkvwso"):
        which = which.replace("p", "kvw")
        if "m" in which:
            cp.gdr_chunk_offsets_kernel[(1,)](cu, ws["coff"], n, t, nt, **opt("gdr_chunk_offsets"))
            cp.gdr_chunk_map_kernel[((nt + 127) // 128,)](ws["coff"], ws["cseq"], n, nt, iters, **opt("gdr_chunk_map"))
        if "k" in which:
            kfn = cp.gdr_chunk_kkt_kernel if prep == "split" else cp.gdr_chunk_kkt_solve_kernel
            kfn[(nt, hv)](*kargs, **k_opt)
        if "v" in which and prep == "split":
            cp.gdr_chunk_solve_kernel[(nt, hv)](ws["A"], cu, slots, ws["coff"], ws["cseq"], t, ns, hv,
                                                **opt("gdr_chunk_solve"))
        if "w" in which:
            cp.gdr_chunk_wu_kernel[(nt, hv, 2 if wz else 1)](*wargs, **w_opt)
        if "s" in which:
            cp.gdr_chunk_state_kernel[(n, hv, V // sbv)](*sargs, **s_opt)
        if "o" in which:
            cp.gdr_chunk_out_kernel[(nt, hv, V // bvo)](*oargs, **opt("gdr_chunk_out_k128v128"))
    return stages


DK_SPLIT = None  # tools/dk_split_prefill.py DkSplitPrefill (--dk-split-lib)


def dk_split_row(row, outs, tf, q, k, v, glog, beta32, cu32, slots, pool_vk, hk, hv, t):
    """deltakit's prefill row from the library default (the sm_90a split pipeline, --dk-split-lib): the first of
    --dk-split-variants is "dk" (time, output and final states for the comparison with the anchors); the others are
    "dk:v<variant>" rows (time, relative errors vs "dk")."""
    import dk_split_prefill  # imported with DK_SPLIT (sys.path holds tools/)

    vars_ = [int(x) for x in ARGS.dk_split_variants.split(",") if x] or [dk_split_prefill.SPLIT_VARIANT]
    pool = pool_vk.transpose(-1, -2).contiguous()  # [slot, Hv, K, V]
    o = torch.empty(t, hv, V, device=DEV, dtype=torch.bfloat16)
    for i, var in enumerate(vars_):
        r = row.setdefault("dk" if i == 0 else f"dk:v{var}", {})
        r["path"] = f"split {var} (tools/dk_split_prefill.py)"
        try:
            pool.copy_(pool_vk.transpose(-1, -2))
            o.fill_(float("nan"))
            call = DK_SPLIT.make(q, k, v, glog, beta32, cu32, slots, pool, o, hk, hv, var)
            t1 = time.time()
            call()
            torch.cuda.synchronize()
            r["first_s"] = round(time.time() - t1, 1)
            res = (o.clone(), pool[slots.long()].transpose(-1, -2).clone())
            if i == 0:
                outs["dk"] = res
            else:
                r["relerr_o_vs_dk"] = rel(res[0], outs["dk"][0]) if "dk" in outs else float("nan")
                r["relerr_s_vs_dk"] = rel(res[1], outs["dk"][1]) if "dk" in outs else float("nan")
            r["ms"] = gpu_ms(call)
            r["TFLOPs"] = tf(r["ms"])
        except Exception as e:  # noqa: BLE001
            r["error"] = err_text(e)
            print(traceback.format_exc()[-2000:], file=sys.stderr)
    del pool, o


def prefill_row(libs, chunk, key, name, hk, hv, lens, prepass=False):
    """One prefill shape: deltakit (library default + variants), FlashInfer, FLA. prepass: only the anchors' first
    (compiling / autotuning) calls, nothing timed or recorded."""
    row = {"kind": "prefill", "case": name}
    if not prepass:
        RES["rows"].append(row)
    t, n = sum(lens), len(lens)
    flop = 4.0 * t * hv * K * V
    tf = lambda ms: flop / (ms * 1e-3) / 1e12  # noqa: E731
    g = torch.Generator(device=DEV).manual_seed(t + hv)
    rn = lambda *s: torch.randn(*s, device=DEV, generator=g)  # noqa: E731
    q, k, v = rn(t, hk, K).bfloat16(), rn(t, hk, K).bfloat16(), rn(t, hv, V).bfloat16()
    glog = F.logsigmoid(rn(t, hv)).contiguous()
    alpha = glog.exp().contiguous()
    beta32 = torch.sigmoid(rn(t, hv)).bfloat16().float().contiguous()
    P = 2 * n + 1
    slots = torch.randperm(P, device=DEV, generator=g)[:n].to(torch.int32)
    pool_vk = (0.05 * rn(P, hv, V, K)).contiguous()
    cu_l = [0]
    for L in lens:
        cu_l.append(cu_l[-1] + L)
    cu32 = torch.tensor(cu_l, device=DEV, dtype=torch.int32)
    outs = {}
    if DK_SPLIT is not None and not prepass:
        dk_split_row(row, outs, tf, q, k, v, glog, beta32, cu32, slots, pool_vk, hk, hv, t)
    if chunk is not None and not prepass:
        cp, ents, aot = chunk
        pool = pool_vk.transpose(-1, -2).contiguous()
        o = torch.empty(t, hv, V, device=DEV, dtype=torch.bfloat16)
        r = row.setdefault("dk", {})
        r["path"] = "aot" if aot is not None else "jit"
        r["pipe"] = LIB_CFG["pipe"]
        try:
            try:
                st = dk_prefill_fn(cp, ents, q, k, v, glog, beta32, cu32, slots, pool, o, hk, hv, n, t, aot=aot)
                t1 = time.time()
                st()
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001
                if aot is None:
                    raise
                # Fallback: the JIT path (same source), so that the row still gets numbers.
                r["aot_error"], r["path"], aot = err_text(e), "jit (aot failed)", None
                pool.copy_(pool_vk.transpose(-1, -2))
                st = dk_prefill_fn(cp, ents, q, k, v, glog, beta32, cu32, slots, pool, o, hk, hv, n, t)
                t1 = time.time()
                st()
                torch.cuda.synchronize()
            r["first_s"] = round(time.time() - t1, 1)
            outs["dk"] = (o.clone(), pool[slots.long()].transpose(-1, -2).clone())
            r["ms"] = gpu_ms(st)
            r["TFLOPs"] = tf(r["ms"])
            for s_ in "mkvwso":
                r[f"stage_{s_}_ms"] = gpu_ms(lambda s_=s_: st(s_), reps=10)
            if ARGS.prefill_variants:
                for vn, cfg in PREFILL_VARIANTS.items():
                    if cfg == LIB_CFG:
                        continue
                    rv = row.setdefault("dk:" + vn, {})
                    try:
                        pool.copy_(pool_vk.transpose(-1, -2))
                        o.fill_(float("nan"))
                        sv = dk_prefill_fn(cp, ents, q, k, v, glog, beta32, cu32, slots, pool, o, hk, hv, n, t, cfg,
                                           aot=aot)
                        sv()
                        torch.cuda.synchronize()
                        rv["relerr_o_vs_dk"] = rel(o, outs["dk"][0])
                        rv["relerr_s_vs_dk"] = rel(pool[slots.long()].transpose(-1, -2), outs["dk"][1])
                        rv["ms"] = gpu_ms(sv)
                        rv["stage_w_ms"] = gpu_ms(lambda: sv("w"), reps=10)
                        rv["stage_s_ms"] = gpu_ms(lambda: sv("s"), reps=10)
                    except Exception as e:  # noqa: BLE001
                        rv["error"] = err_text(e)
            if ARGS.sm90_state and aot is not None:
                try:
                    row["dk:sm90_state"] = sm90_state_check(aot, cp, ents, q, k, v, glog, beta32, cu32, slots, pool, o,
                                                            hk, hv, n, t, lens)
                except Exception as e:  # noqa: BLE001
                    row["dk:sm90_state"] = {"error": err_text(e)}
        except Exception as e:  # noqa: BLE001
            r["error"] = err_text(e)
            print(traceback.format_exc()[-2000:], file=sys.stderr)
        del pool
    if "fi_prefill" in libs:
        fi = libs["fi_prefill"]
        pool = pool_vk.clone()
        o = torch.empty(t, hv, V, device=DEV, dtype=torch.bfloat16)
        r = row.setdefault("fi", {})
        call = lambda: fi(q, k, v, alpha, beta32, None, initial_state=pool, output_final_state=True,  # noqa: E731
                          cu_seqlens=cu32, use_qk_l2norm_in_kernel=True, output=o, output_state=pool,
                          state_indices=slots, max_seqlen=max(lens), use_cp="auto")
        try:
            t1 = time.time()
            call()
            torch.cuda.synchronize()
            r["first_s"] = round(time.time() - t1, 1)
            if prepass:
                RES["meta"][f"fi_prepass_s_{key}"] = r["first_s"]
            else:
                pool.copy_(pool_vk)
                call()
                torch.cuda.synchronize()
                outs["fi"] = (o.clone(), pool[slots.long()].clone())
                r["ms"] = gpu_ms(call)
                r["TFLOPs"] = tf(r["ms"])
        except Exception as e:  # noqa: BLE001
            r["error"] = err_text(e)
            if prepass:
                RES["meta"][f"fi_prepass_error_{key}"] = err_text(e)
        del pool
    if "fla_prefill" in libs and key in ARGS.fla_prefill.split(",") and (prepass or elapsed() < ARGS.budget_s * 0.8):
        fla = libs["fla_prefill"]
        h0 = pool_vk[slots.long()].contiguous()
        kw = dict(output_final_state=True, cu_seqlens=cu32.long(), cu_seqlens_cpu=torch.tensor(cu_l),
                  use_qk_l2norm_in_kernel=True, state_v_first=True)
        bb = beta32.bfloat16()
        r = row.setdefault("fla_kernel", {})
        try:
            t1 = time.time()
            o2, ht = fla(q[None], k[None], v[None], glog[None], bb[None], initial_state=h0, **kw)
            torch.cuda.synchronize()
            r["first_s"] = round(time.time() - t1, 1)
            if prepass:
                RES["meta"][f"fla_prepass_s_{key}"] = r["first_s"]
                return
            outs["fla"] = (o2[0].clone(), ht.clone())
            r["ms"] = gpu_ms(lambda: fla(q[None], k[None], v[None], glog[None], bb[None], initial_state=h0, **kw))
            r["TFLOPs"] = tf(r["ms"])
        except Exception as e:  # noqa: BLE001
            r["error"] = err_text(e)
    ref = outs.get("fi") or outs.get("fla")
    if "dk" in outs and ref is not None:
        row["relerr_o_dk"] = rel(outs["dk"][0], ref[0])
        row["relerr_s_dk"] = rel(outs["dk"][1], ref[1])
    torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------ streaming ops
class Conv1dPrefillParams(ctypes.Structure):
    """csrc/include/conv1d.h DkConv1dPrefillParams."""
    _fields_ = [(n, ctypes.c_uint64) for n in ("x", "weight", "bias", "cu_seqlens", "slots", "has_initial_state",
                                               "conv_state", "out")] + \
        [(n, ctypes.c_int64) for n in ("num_tokens", "num_seqs", "conv_dim", "width", "num_slots", "x_stride")]


class Conv1dUpdateParams(ctypes.Structure):
    """csrc/include/conv1d.h DkConv1dUpdateParams."""
    _fields_ = [(n, ctypes.c_uint64) for n in ("x", "weight", "bias", "slots", "conv_state", "out")] + \
        [(n, ctypes.c_int64) for n in ("n", "s", "conv_dim", "width", "num_slots", "x_stride")]


class RmsNormParams(ctypes.Structure):
    """csrc/include/norm.h DkRmsNormParams."""
    _fields_ = [(n, ctypes.c_uint64) for n in ("x", "residual", "w", "out")] + \
        [("rows", ctypes.c_int64), ("d", ctypes.c_int64), ("eps", ctypes.c_float)]


class RmsNormGatedParams(ctypes.Structure):
    """csrc/include/norm.h DkRmsNormGatedParams."""
    _fields_ = [(n, ctypes.c_uint64) for n in ("x", "z", "w", "out")] + \
        [("rows", ctypes.c_int64), ("d", ctypes.c_int64), ("eps", ctypes.c_float), ("z_token_stride", ctypes.c_int64),
         ("z_heads", ctypes.c_int64)]


COPY_CEILING_TBPS = 4.25  # issue 15's copy ceiling (H200, torch device-to-device copy, read + write)
# (name, conv_dim, H_v, hidden): per-rank GDR shapes of Qwen3.5-27B (TP1) and 9B; K = V = 128, conv width 4.
STREAM_MODELS = (("27B", 10240, 48, 5120), ("9B", 8192, 32, 4096))
# csrc/conv1d/prefill.cu Cfg (vecCxT: C channels x T tokens per thread; _ref: the reference's multiply + add taps)
CONV1D_PREFILL_CFGS = {0: "dispatch", 1: "scalar", 2: "vec8x8", 3: "vec8x16", 4: "vec8x32", 5: "vec8x8_ref",
                       6: "vec4x8", 7: "vec4x16", 8: "vec8x4", 9: "vec4x8_ref", 10: "vec4x8_cf", 11: "vec4x16_cf",
                       12: "vec8x8_cf", 13: "vec8x16_cf"}
# DK_CONV_CFGS=1,2,6,..: time only these conv1d.prefill configurations (the dispatch and scalar always)
if os.environ.get("DK_CONV_CFGS"):
    _keep = {0, 1} | {int(x) for x in os.environ["DK_CONV_CFGS"].split(",")}
    CONV1D_PREFILL_CFGS = {k: v for k, v in CONV1D_PREFILL_CFGS.items() if k in _keep}
RMS_GATED_CFGS = {0: "dispatch", 1: "prefetch_z", 2: "generic", 3: "d128_u1", 4: "d128_u2", 5: "d128_u4", 6: "d128_u8"}
CONV1D_UPDATE_CFGS = {0: "dispatch", 1: "scalar", 2: "vec8"}


def streaming_rows(path):
    """conv1d.prefill (8192 tokens, one sequence and 8 x 1024), conv1d.update (batch 64, S = 1), norm.rms_gated
    (rows = tokens * H_v, d = 128) and norm.fused_add_rms (d = hidden) at 8192 tokens / batch 64: bytes moved per
    call / GPU time, as a fraction of the copy ceiling (COPY_CEILING_TBPS, and the 2 GB copy measured here) and of a
    torch copy moving the same bytes. Forced configurations of conv1d are checked bit-exact against the scalar
    path."""
    lib = ctypes.CDLL(path)
    sd = ctypes.c_void_p
    for fn, pt in (("dk_conv1d_prefill", Conv1dPrefillParams), ("dk_conv1d_update", Conv1dUpdateParams),
                   ("dk_norm_fused_add_rms", RmsNormParams), ("dk_norm_rms_gated", RmsNormGatedParams)):
        getattr(lib, fn).argtypes = [ctypes.POINTER(pt), sd]
    lib.dk_tune_conv1d_prefill_cfg.argtypes = [ctypes.POINTER(Conv1dPrefillParams), ctypes.c_int, sd]
    lib.dk_tune_conv1d_update_cfg.argtypes = [ctypes.POINTER(Conv1dUpdateParams), ctypes.c_int, sd]
    tune_rg = getattr(lib, "dk_tune_norm_rms_gated_cfg", None)
    if tune_rg is not None:
        tune_rg.argtypes = [ctypes.POINTER(RmsNormGatedParams), ctypes.c_int, sd]
    stream = lambda: sd(torch.cuda.current_stream().cuda_stream)  # noqa: E731

    def ok(st, what):
        if st != 0:
            raise RuntimeError(f"{what} status {st}")

    def copy_ms(nbytes):
        """GPU ms of a torch device-to-device copy moving nbytes (read + write)."""
        a = torch.empty(max(1, int(nbytes // 2)), device=DEV, dtype=torch.uint8)
        b = torch.empty_like(a)
        return gpu_ms(lambda: b.copy_(a))
    RES["meta"]["copy_2GB_TBps"] = 2.0 * 2 ** 30 / (copy_ms(2.0 * 2 ** 30) * 1e-3) / 1e12

    def add(op, case, cfg, fn, nbytes, extra=None):
        row = {"kind": "stream", "op": op, "case": case, "cfg": cfg, "bytes": nbytes}
        try:
            row["ms"] = gpu_ms(fn)
            row["TBps"] = nbytes / (row["ms"] * 1e-3) / 1e12
            row["frac_ceiling"] = row["TBps"] / COPY_CEILING_TBPS
            row["copy_same_bytes_ms"] = copy_ms(nbytes)
            row["frac_same_size_copy"] = row["copy_same_bytes_ms"] / row["ms"]
        except Exception as e:  # noqa: BLE001
            row["error"] = err_text(e)
        row.update(extra or {})
        RES["rows"].append(row)
        return row

    g = torch.Generator(device=DEV).manual_seed(7)
    rnd = lambda *s: torch.randn(*s, device=DEV, generator=g).bfloat16()  # noqa: E731
    W = 4
    for mname, cd, hv, hidden in STREAM_MODELS:
        wt, bias = rnd(cd, W), rnd(cd)
        # conv1d.prefill
        for lens in ([8192], [1024] * 8):
            t, n = sum(lens), len(lens)
            x, out = rnd(t, cd), torch.empty(t, cd, device=DEV, dtype=torch.bfloat16)
            state = rnd(2 * n + 1, cd, W - 1)
            slots = torch.arange(n, device=DEV, dtype=torch.int32) * 2
            cu = torch.tensor([0] + [sum(lens[:i + 1]) for i in range(n)], device=DEV, dtype=torch.int32)
            p = Conv1dPrefillParams(x.data_ptr(), wt.data_ptr(), bias.data_ptr(), cu.data_ptr(), slots.data_ptr(), 0,
                                    state.data_ptr(), out.data_ptr(), t, n, cd, W, state.shape[0], cd)
            nbytes = 2.0 * t * cd * 2 + cd * (W + 1) * 2 + 2.0 * n * cd * (W - 1) * 2
            ref = None
            st0 = state.clone()  # every configuration starts from these states (timing calls update them)
            for cfg, cn in CONV1D_PREFILL_CFGS.items():
                state.copy_(st0)
                fn = lambda cfg=cfg: ok(lib.dk_tune_conv1d_prefill_cfg(ctypes.byref(p), cfg, stream()), "conv1d")  # noqa: E731
                try:
                    out.fill_(float("nan"))
                    fn()
                    torch.cuda.synchronize()
                    res = (out.clone(), state.clone())
                    state.copy_(st0)
                    if cfg == 1:
                        ref = res
                except Exception as e:  # noqa: BLE001
                    RES["rows"].append({"kind": "stream", "op": "conv1d.prefill", "case": f"{mname} {n}x{lens[0]}",
                                        "cfg": cn, "error": err_text(e)})
                    continue
                r = add("conv1d.prefill", f"{mname} cd{cd} {n}x{lens[0]}", cn, fn, nbytes)
                r["_res"] = res
            for r in RES["rows"]:
                if r.get("op") == "conv1d.prefill" and "_res" in r and ref is not None:
                    r["bitexact_vs_scalar"] = bool(torch.equal(r["_res"][0], ref[0]) and torch.equal(r["_res"][1], ref[1]))
                r.pop("_res", None)
            del x, out, state
        if os.environ.get("DK_STREAM_CONV_ONLY"):  # conv1d.prefill only (the norms / conv1d.update met their targets)
            torch.cuda.empty_cache()
            continue
        # conv1d.update (decode, batch 64, S = 1)
        B = 64
        x, out = rnd(B, cd), torch.empty(B, cd, device=DEV, dtype=torch.bfloat16)
        state = rnd(2 * B + 1, cd, W - 1)
        slots = torch.randperm(2 * B + 1, device=DEV, generator=g)[:B].to(torch.int32)
        p = Conv1dUpdateParams(x.data_ptr(), wt.data_ptr(), bias.data_ptr(), slots.data_ptr(), state.data_ptr(),
                               out.data_ptr(), B, 1, cd, W, state.shape[0], cd)
        nbytes = B * cd * (2 + 2 + 2 * (W - 1) * 2) + cd * (W + 1) * 2
        ref = None
        st0 = state.clone()  # every configuration starts from these states (timing calls update them)
        for cfg, cn in CONV1D_UPDATE_CFGS.items():
            state.copy_(st0)
            fn = lambda cfg=cfg: ok(lib.dk_tune_conv1d_update_cfg(ctypes.byref(p), cfg, stream()), "conv1d.update")  # noqa: E731
            try:
                fn()
                torch.cuda.synchronize()
                res = (out.clone(), state.clone())
                state.copy_(st0)
            except Exception as e:  # noqa: BLE001
                RES["rows"].append({"kind": "stream", "op": "conv1d.update", "case": f"{mname} B{B}", "cfg": cn,
                                    "error": err_text(e)})
                continue
            if cfg == 1:
                ref = res
            r = add("conv1d.update", f"{mname} cd{cd} B{B}", cn, fn, nbytes)
            r["_res"] = res
        for r in RES["rows"]:
            if r.get("op") == "conv1d.update" and "_res" in r and ref is not None:
                r["bitexact_vs_scalar"] = bool(torch.equal(r["_res"][0], ref[0]) and torch.equal(r["_res"][1], ref[1]))
            r.pop("_res", None)
        # norm.rms_gated (d = V = 128) and norm.fused_add_rms (d = hidden)
        for toks, tag in ((8192, "prefill 8192"), (64, "decode B64")):
            rows = toks * hv
            xg, zg, og = rnd(rows, 128), rnd(rows, 128), torch.empty(rows, 128, device=DEV, dtype=torch.bfloat16)
            wg = rnd(128)
            pg = RmsNormGatedParams(xg.data_ptr(), zg.data_ptr(), wg.data_ptr(), og.data_ptr(), rows, 128, 1e-6, 0, 1)
            add("norm.rms_gated", f"{mname} {tag} rows {rows}x128", "dispatch",
                lambda: ok(lib.dk_norm_rms_gated(ctypes.byref(pg), stream()), "rms_gated"), 3.0 * rows * 128 * 2)
            if tune_rg is not None:
                og.fill_(float("nan"))
                ok(lib.dk_norm_rms_gated(ctypes.byref(pg), stream()), "rms_gated")
                ref_g = og.clone()
                for cfg, cn in RMS_GATED_CFGS.items():
                    if cfg == 0:
                        continue
                    og.fill_(float("nan"))
                    r = add("norm.rms_gated", f"{mname} {tag} rows {rows}x128", cn,
                            lambda cfg=cfg: ok(tune_rg(ctypes.byref(pg), cfg, stream()), "rms_gated"), 3.0 * rows * 128 * 2)
                    r["bitexact_vs_scalar"] = bool(torch.equal(og, ref_g))  # here: vs the dispatch
            xr, res_, orr = rnd(toks, hidden), rnd(toks, hidden), torch.empty(toks, hidden, device=DEV, dtype=torch.bfloat16)
            wr = rnd(hidden)
            pr = RmsNormParams(xr.data_ptr(), res_.data_ptr(), wr.data_ptr(), orr.data_ptr(), toks, hidden, 1e-6)
            add("norm.fused_add_rms", f"{mname} {tag} {toks}x{hidden}", "dispatch",
                lambda: ok(lib.dk_norm_fused_add_rms(ctypes.byref(pr), stream()), "fused_add_rms"),
                4.0 * toks * hidden * 2)
        torch.cuda.empty_cache()


def stream_table():
    rows = [r for r in RES["rows"] if r.get("kind") == "stream"]
    if not rows:
        return ""
    ceil = RES["meta"].get("copy_2GB_TBps", float("nan"))
    out = [f"streaming ops (copy ceiling {COPY_CEILING_TBPS} TB/s; 2 GB torch copy here {ceil:.2f} TB/s)",
           "| op | case | cfg | us | TB/s | of 4.25 | of same-size copy | bit-exact |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if "ms" not in r:
            out.append(f"| {r['op']} | {r['case']} | {r['cfg']} | {r.get('error', '-')[:60]} | | | | |")
            continue
        out.append(f"| {r['op']} | {r['case']} | {r['cfg']} | {r['ms'] * 1e3:.1f} | {r['TBps']:.2f} | "
                   f"{r['frac_ceiling'] * 100:.0f}% | {r['frac_same_size_copy'] * 100:.0f}% | "
                   f"{r.get('bitexact_vs_scalar', '-')} |")
    return "\n".join(out)


# ------------------------------------------------------------------------------------------ table
def nanmax(vals):
    """max of vals, NaN if any is NaN (a NaN must never look like a pass)."""
    return float("nan") if any(v != v for v in vals) else max(vals + [0.0])


def table():
    notes = []
    lines = ["| case | deltakit | FlashInfer | FLA (kernel) | dk/FI | dk/FLA | relerr o / S (dk vs FI) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for row in RES["rows"]:
        if row["kind"] == "prefill":
            f = lambda r: f"{r['ms']:.3f} ms ({r['TFLOPs']:.1f})" if "ms" in r else r.get("error", "-")[:40]  # noqa: E731
            dk, fi, fl = row.get("dk", {}), row.get("fi", {}), row.get("fla_kernel", {})
            sp = lambda x: f"{x['ms'] / dk['ms']:.2f}x" if "ms" in x and "ms" in dk else "-"  # noqa: E731
            er = f"{row.get('relerr_o_dk', float('nan')):.1e} / {row.get('relerr_s_dk', float('nan')):.1e}"
            lines.append(f"| {row['case']} | {f(dk)} | {f(fi)} | {f(fl)} | {sp(fi)} | {sp(fl)} | {er} |")
            st_ = " ".join(f"{s_}={dk[f'stage_{s_}_ms'] * 1e3:.0f}us" for s_ in "mkvwso" if f"stage_{s_}_ms" in dk)
            vs = "; ".join(f"{k_[3:]}: " + " ".join(f"{x}={row[k_][x] * 1e3:.0f}us" for x in ("ms", "stage_k_ms", "stage_v_ms",
                                                                                              "stage_w_ms", "stage_s_ms",
                                                                                              "triton_state_ms", "sm90_state_ms",
                                                                                              "sm90_state_v1_ms", "sm90_state_v2_ms")
                                                     if x in row[k_]) +
                           (f" (err h {row[k_].get('relerr_h', -1):.1e} D {row[k_].get('relerr_d', -1):.1e} S "
                            f"{row[k_].get('relerr_state', -1):.1e}; v1 h {row[k_].get('relerr_h_v1', -1):.1e} D "
                            f"{row[k_].get('relerr_d_v1', -1):.1e} S {row[k_].get('relerr_state_v1', -1):.1e}; v2 h "
                            f"{row[k_].get('relerr_h_v2', -1):.1e} D {row[k_].get('relerr_d_v2', -1):.1e} S "
                            f"{row[k_].get('relerr_state_v2', -1):.1e})"
                            if k_ == "dk:sm90_state" else
                            f" (err o {row[k_].get('relerr_o_vs_dk', -1):.1e} S {row[k_].get('relerr_s_vs_dk', -1):.1e})") +
                           f"{' ' + row[k_]['error'][:60] if 'error' in row[k_] else ''}"
                           for k_ in row if k_.startswith("dk:"))
            notes.append(f"{row['case']}: deltakit stages (m map, k kkt_solve, v solve, w wu, s state, o out) {st_}; "
                         f"variants: {vs}")
        elif row["kind"] == "decode":
            for mode in ("warm", "cold"):
                f = lambda r: (f"{r[mode + '_TBps']:.2f} ({r[mode + '_ms'] * 1e3:.1f} us)"  # noqa: E731
                               if mode + "_ms" in r else r.get("error", "-")[:40])
                dk, fi, fl = row.get("dk", {}), row.get("fi", {}), row.get("fla_kernel", {})
                sp = lambda x: (f"{x[mode + '_ms'] / dk[mode + '_ms']:.2f}x"  # noqa: E731
                                if mode + "_ms" in x and mode + "_ms" in dk else "-")
                er = f"{row.get('relerr_o_dk', float('nan')):.1e} / {row.get('relerr_s_dk', float('nan')):.1e}"
                lines.append(f"| {row['case']} {mode} | {f(dk)} | {f(fi)} | {f(fl)} | {sp(fi)} | {sp(fl)} | {er} |")
            if "b2b_us" in row.get("dk", {}):
                lines.append(f"| {row['case']} graph b2b | {row['dk']['b2b_us']:.2f} us | "
                             f"{row.get('fi', {}).get('b2b_us', float('nan')):.2f} us | "
                             f"{row.get('fla_kernel', {}).get('b2b_us', float('nan')):.2f} us | | | |")
    out = "\n".join(lines)
    out += "\nprefill: GPU ms (nominal TFLOP/s); decode: f32 state TB/s (GPU us); ratios = anchor time / deltakit time"
    if notes:
        out += "\n" + "\n".join(notes)
    sweep = []
    for row in RES["rows"]:
        ks = [k_ for k_ in row if k_.startswith("dk:") and row["kind"] == "decode"]
        if ks:
            best = {m: min(ks, key=lambda k_: row[k_].get(m + "_ms", 1e9)) for m in ("warm", "cold")}
            sweep.append(f"{row['case']}: dk {row['dk'].get('cold_ms', 0) * 1e3:.1f}/{row['dk'].get('warm_ms', 0) * 1e3:.1f} us"
                         f" cold/warm; best cold {best['cold']} {row[best['cold']].get('cold_ms', 0) * 1e3:.1f} us,"
                         f" best warm {best['warm']} {row[best['warm']].get('warm_ms', 0) * 1e3:.1f} us; all cold us: " +
                         " ".join(f"{k_[3:]}={row[k_].get('cold_ms', 0) * 1e3:.1f}" for k_ in ks) +
                         "; all warm us: " + " ".join(f"{k_[3:]}={row[k_].get('warm_ms', 0) * 1e3:.1f}" for k_ in ks) +
                         "; max relerr vs dispatch o/S: " +
                         f"{nanmax([row[k_].get('relerr_o_vs_dk', float('nan')) for k_ in ks if 'error' not in row[k_]]):.1e}/"
                         f"{nanmax([row[k_].get('relerr_s_vs_dk', float('nan')) for k_ in ks if 'error' not in row[k_]]):.1e}" +
                         "".join(f"; {k_[3:]} ERROR {row[k_]['error'][:80]}" for k_ in ks if "error" in row[k_]) +
                         "".join(f"; {k_[3:]} MISMATCH o {row[k_].get('relerr_o_vs_dk', float('nan')):.1e} S "
                                 f"{row[k_].get('relerr_s_vs_dk', float('nan')):.1e}" for k_ in ks if "error" not in row[k_]
                                 and not (row[k_].get("relerr_o_vs_dk", 1.0) <= 1e-3 and row[k_].get("relerr_s_vs_dk", 1.0) <= 1e-4)))
    for row in RES["rows"]:
        xs = [k_ for k_ in ("fla_kv", "fla_inplace") if k_ in row]
        if xs and row["kind"] == "decode":
            sweep.append(f"{row['case']}: FLA extra (cold/warm us): fla {row.get('fla_kernel', {}).get('cold_ms', 0) * 1e3:.1f}/"
                         f"{row.get('fla_kernel', {}).get('warm_ms', 0) * 1e3:.1f} " +
                         " ".join(f"{k_} {row[k_].get('cold_ms', 0) * 1e3:.1f}/{row[k_].get('warm_ms', 0) * 1e3:.1f}"
                                  f" (vs fla o {row[k_].get('relerr_o_vs_fla', float('nan')):.1e} S "
                                  f"{row[k_].get('relerr_s_vs_fla', float('nan')):.1e})"
                                  f"{' ERROR ' + row[k_]['error'][:80] if 'error' in row[k_] else ''}" for k_ in xs))
    if sweep:
        out += "\ndecode tile sweep (same harness):\n" + "\n".join(sweep)
    tls = []
    for row in RES["rows"]:
        for k_ in row:
            tl = row[k_].get("timeline") if k_.startswith("dk:prof") and isinstance(row[k_], dict) else None
            if not tl:
                continue
            if "error" in tl:
                tls.append(f"{row['case']} {k_[3:]}: {tl['error']}")
                continue
            ser = tl["per2us_read_write_TBps_resident"]
            tls.append(f"{row['case']} {k_[3:]}: span {tl['span_us']:.1f} us, {tl['ctas']} CTAs, timer step "
                       f"{tl['timer_step_us']:.3f} us; phases p10/50/90 us: load {tl['load_us_p10_50_90']}, compute "
                       f"{tl['compute_us_p10_50_90']}, store issue {tl['store_issue_us_p10_50_90']}, life "
                       f"{tl['life_us_p10_50_90']}; first wave {tl['first_wave_ctas']} CTAs load median "
                       f"{tl['first_wave_load_us_median']:.2f} us vs later {tl['later_load_us_median']:.2f}; last start "
                       f"{tl['last_start_us']:.1f} us, tail {tl['tail_us']:.1f} us; CTAs/SM {tl['ctas_per_sm_min_max']}, "
                       f"SM end min/med/max {[round(x, 1) for x in tl['sm_end_us_min_med_max']]}; resident max "
                       f"{tl['resident_max']}; mid-80% read+write {tl['mid80_read_plus_write_TBps']:.2f} TB/s\n"
                       "  per 2 us [read TB/s, write TB/s, resident CTAs]: " + " ".join(f"{x[0]}/{x[1]}/{x[2]}" for x in ser))
    if tls:
        out += "\ndecode timeline (per-CTA %globaltimer stamps, one cold call):\n" + "\n".join(tls)
    st = stream_table()
    if st:
        out += "\n" + st
    return out


def main():
    if ARGS.merge is not None:
        for f in ARGS.merge:
            try:
                r = json.load(open(f))
            except (OSError, ValueError) as e:
                print(f"merge: {f}: {e}", file=sys.stderr)
                continue
            RES["meta"].update(r.get("meta", {}))
            RES["rows"] += r.get("rows", [])
        save()
        print(table())
        return
    torch.set_grad_enabled(False)
    libs = load_anchors()
    dk = None
    if "dk" in LIBS and not ARGS.skip_decode:
        try:
            dk = DkDecode(ARGS.lib)
        except Exception as e:  # noqa: BLE001
            RES["meta"]["dk_decode_error"] = err_text(e)
    chunk = None
    global DK_SPLIT
    if "dk" in LIBS and not ARGS.skip_prefill and ARGS.dk_split_lib:
        try:
            sys.path.insert(0, str(ROOT / "tools"))
            from dk_split_prefill import DkSplitPrefill
            DK_SPLIT = DkSplitPrefill(ARGS.dk_split_lib)
        except Exception as e:  # noqa: BLE001
            RES["meta"]["dk_split_error"] = err_text(e)
            print(traceback.format_exc()[-2000:], file=sys.stderr)
    elif "dk" in LIBS and not ARGS.skip_prefill:
        cp, ents = load_chunk_module()
        aot = None
        if not ARGS.dk_jit:
            try:
                aot = DkAot(ARGS.dk_lib, cp)
            except Exception as e:  # noqa: BLE001
                RES["meta"]["dk_aot_error"] = err_text(e)
                print(traceback.format_exc()[-2000:], file=sys.stderr)
        chunk = (cp, ents, aot)
    print(json.dumps(RES["meta"]), flush=True)
    only = [s for s in ARGS.only.split(",") if s]
    jobs = []
    if not ARGS.skip_decode:
        for t_ in [int(x) for x in ARGS.decode_t.split(",") if x]:
            for tp, hk, hv in (("TP1", 16, 48), ("TP2", 8, 24)):
                for b in ((1, 16, 64, 256) if t_ == 1 else (16, 64)):
                    tt = "" if t_ == 1 else f" T={t_}"
                    jobs.append(("decode", f"decode 27B-{tp} {hk}/{hv} B={b}{tt}", (hk, hv, b, t_)))
    if not ARGS.skip_prefill:
        for key in [k_ for k_ in ARGS.prefill.split(",") if k_]:
            c = PREFILL[key]
            jobs.append(("prefill", c[0], (key,) + c[1:]))
    jobs = [j for j in jobs if not only or any(s_ in j[1] for s_ in only)]
    if ARGS.prepass:
        for kind, name, a in jobs:
            if kind != "prefill":
                continue
            t1 = time.time()
            try:
                prefill_row(libs, chunk, a[0], name, *a[1:], prepass=True)
            except Exception as e:  # noqa: BLE001
                RES["meta"][f"prepass_error_{a[0]}"] = err_text(e)
            print(f"[{elapsed():6.1f}s] prepass {name} ({time.time() - t1:.1f}s)", file=sys.stderr, flush=True)
            torch.cuda.empty_cache()
    if ARGS.wait_file:
        while not os.path.exists(ARGS.wait_file):
            time.sleep(0.5)
    if ARGS.barrier:
        bdir, bn = ARGS.barrier.rsplit(":", 1)
        os.makedirs(bdir, exist_ok=True)
        open(os.path.join(bdir, str(os.getpid())), "w").close()
        tb = time.time()
        while len(os.listdir(bdir)) < int(bn) and time.time() - tb < 300:  # a crashed sibling: time anyway
            time.sleep(0.5)
    lock = None
    if ARGS.lock_file:
        import fcntl
        lock = open(ARGS.lock_file, "a")
        fcntl.flock(lock, fcntl.LOCK_EX)
    RES["meta"]["timed_from_s"] = round(elapsed(), 1)
    print(f"[{elapsed():6.1f}s] timed phase", file=sys.stderr, flush=True)
    for kind, name, a in jobs:
        if elapsed() > ARGS.budget_s:
            RES["rows"].append({"kind": kind, "case": name, "skipped": "budget"})
            continue
        t1 = time.time()
        try:
            if kind == "decode":
                decode_row(libs, dk, name, *a)
            else:
                prefill_row(libs, chunk, a[0], name, *a[1:])
        except Exception as e:  # noqa: BLE001
            RES["rows"].append({"kind": kind, "case": name, "error": err_text(e)})
            print(traceback.format_exc()[-2000:], file=sys.stderr)
        print(f"[{elapsed():6.1f}s] {name} ({time.time() - t1:.1f}s)", file=sys.stderr, flush=True)
        save()
    if ARGS.streaming:
        t1 = time.time()
        try:
            streaming_rows(ARGS.dk_lib)
        except Exception as e:  # noqa: BLE001
            RES["meta"]["streaming_error"] = err_text(e)
            print(traceback.format_exc()[-2000:], file=sys.stderr)
        print(f"[{elapsed():6.1f}s] streaming ({time.time() - t1:.1f}s)", file=sys.stderr, flush=True)
    RES["meta"]["timed_to_s"] = round(elapsed(), 1)
    if lock is not None:
        lock.close()
    RES["rows"] = [r for r in RES["rows"] if "skipped" not in r] + [r for r in RES["rows"] if "skipped" in r]
    save()
    print(table())


if __name__ == "__main__":
    main()
