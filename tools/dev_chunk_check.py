#!/usr/bin/env python3
"""Developer check of the gdr.chunk_prefill Triton kernels (triton_aot/gdr/chunk_prefill.py), JIT.

Runs the seven kernels in the order the Rust wrapper launches them, against a float64 numpy token
recurrence, over small varlen cases (padding / out-of-range slots, per-sequence initial state,
K != V, H_v/H_k = 1..3, g = 0 and -100, tiny q/k, fused gating), then times the Qwen3.5 shapes.

  python3 tools/dev_chunk_check.py                 # GPU (torch + triton)
  TRITON_INTERPRET=1 python3 tools/dev_chunk_check.py --cpu   # Triton interpreter, numpy only
Options: --prec W,S,O (dot precision of the W/U, state and output passes: 0 tf32, 1 tf32x3, 2 ieee,
         3 bf16, 4 bf16 hi/lo splits),
         --bench (time the Qwen3.5 shapes; GPU only), --quick.
"""
import argparse
import importlib.util
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("chunk_prefill", ROOT / "triton_aot/gdr/chunk_prefill.py")
CP = importlib.util.module_from_spec(spec)
spec.loader.exec_module(CP)


def to_bf16_bits(x):
    """f32 -> bf16 bits (round to nearest even), as uint16."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return b.astype(np.uint16)


def from_bf16_bits(u):
    return (u.astype(np.uint32) << 16).view(np.float32)


class Backend:
    """Device buffers: torch CUDA tensors, or numpy arrays behind a pointer shim (interpreter)."""

    def __init__(self, cpu):
        self.cpu = cpu
        if cpu:
            import triton.runtime.interpreter as interp
            interp.GridExecutor._init_args_hst = lambda self, a, k: (a, k)
            interp.GridExecutor._restore_args_dev = lambda self, *a: None
        else:
            import torch
            self.torch = torch

    class Ptr:
        def __init__(self, arr, dt):
            self.arr, self.dtype = arr, dt

        def data_ptr(self):
            return self.arr.ctypes.data

    def put(self, arr, kind):
        """kind: 'bf16' (arr f32 values), 'f32', 'i32'."""
        if kind == "bf16":
            host = to_bf16_bits(arr)
        elif kind == "f32":
            host = np.ascontiguousarray(arr, dtype=np.float32)
        else:
            host = np.ascontiguousarray(arr, dtype=np.int32)
        if self.cpu:
            host = host.copy()
            return Backend.Ptr(host, {"bf16": "torch.bfloat16", "f32": "torch.float32", "i32": "torch.int32"}[kind])
        t = self.torch.from_numpy(host.view(np.int16) if kind == "bf16" else host).cuda()
        return t.view(self.torch.bfloat16) if kind == "bf16" else t

    def get(self, buf, kind):
        if self.cpu:
            a = buf.arr
        else:
            t = buf.view(self.torch.int16) if kind == "bf16" else buf
            a = t.cpu().numpy()
        return from_bf16_bits(a.view(np.uint16)) if kind == "bf16" else a.copy()

    def sync(self):
        if not self.cpu:
            self.torch.cuda.synchronize()


PREP = "split"  # --prep
WSPLIT = 0  # --wsplit: W as bf16 hi / lo planes between the W/U and state passes
STATE_BV = 32  # --state-bv


def launch(be, d, bufs, n, t, nt, use_l2, fused, init_mode, scale, prec, bv=32, bvo=64, stages="mpso"):
    hk, hv, kd, vd = d
    if "m" in stages:
        _map(bufs, n, t, nt)
    if "p" in stages:
        _prep(d, bufs, t, nt, use_l2, fused, prec)
    if "s" in stages:
        _state(d, bufs, n, t, use_l2, init_mode, prec, bv)
    if "o" in stages:
        _out(d, bufs, t, nt, use_l2, scale, prec, bvo)


def _map(bufs, n, t, nt):
    CP.gdr_chunk_offsets_kernel[(1,)](bufs["cu"], bufs["coff"], n, t, nt, BLOCK=CP.OFFSETS_BLOCK)
    iters = max(1, int(n).bit_length())
    CP.gdr_chunk_map_kernel[((nt + CP.MAP_BLOCK - 1) // CP.MAP_BLOCK,)](bufs["coff"], bufs["cseq"], n, nt, iters,
                                                                        BLOCK=CP.MAP_BLOCK)


def _tile(dim):
    """Tile width of a head dim in the K and W/U passes: the dim itself, 64 for the small dims (as in
    triton_aot/manifest.toml: BK = max(K, 64), the W/U pass's BV = max(V, 64))."""
    return max(dim, 64)


def _prep(d, bufs, t, nt, use_l2, fused, prec):
    hk, hv, kd, vd = d
    bk = _tile(kd)
    if PREP in ("fused", "staged"):
        CP.gdr_chunk_kkt_solve_kernel[(nt, hv)](bufs["k"], bufs["g"], bufs["beta"], bufs["a"], bufs["b"], bufs["alog"],
                                                bufs["dtb"], bufs["cu"], bufs["slots"], bufs["coff"], bufs["cseq"],
                                                bufs["gcum"], bufs["betaw"], bufs["A"], t, bufs["num_slots"], hk, hv,
                                                hk * kd, hv, use_l2, fused, K=kd, BK=bk, PREC=1,
                                                STAGED=int(PREP == "staged"), num_warps=4 if PREP == "staged" else 1)
    else:
        _kkt_solve_split(d, bufs, t, nt, use_l2, fused, bk)
    CP.gdr_chunk_wu_kernel[(nt, hv)](bufs["k"], bufs["v"], bufs["betaw"], bufs["gcum"], bufs["A"], bufs["w"], bufs["u"],
                                     bufs["cu"], bufs["slots"], bufs["coff"], bufs["cseq"], t, bufs["num_slots"], hk, hv,
                                     hk * kd, hv * vd, use_l2, K=kd, V=vd, BK=bk, BV=_tile(vd), PREC=prec[0],
                                     WSPLIT=WSPLIT, num_warps=8)


def _kkt_solve_split(d, bufs, t, nt, use_l2, fused, bk):
    """The two-launch WY prep (gdr_chunk_kkt_kernel + gdr_chunk_solve_kernel), still selectable (--prep split)."""
    hk, hv, kd, vd = d
    CP.gdr_chunk_kkt_kernel[(nt, hv)](bufs["k"], bufs["g"], bufs["beta"], bufs["a"], bufs["b"], bufs["alog"],
                                      bufs["dtb"], bufs["cu"], bufs["slots"], bufs["coff"], bufs["cseq"], bufs["gcum"],
                                      bufs["betaw"], bufs["A"], t, bufs["num_slots"], hk, hv, hk * kd, hv, use_l2,
                                      fused, K=kd, BK=bk, num_warps=4)
    CP.gdr_chunk_solve_kernel[(nt, hv)](bufs["A"], bufs["cu"], bufs["slots"], bufs["coff"], bufs["cseq"], t,
                                        bufs["num_slots"], hv, PREC=1, num_warps=1)


def _state(d, bufs, n, t, use_l2, init_mode, prec, bv):
    hk, hv, kd, vd = d
    CP.gdr_chunk_state_kernel[(n, hv, (vd + bv - 1) // bv)](bufs["k"], bufs["w"], bufs["u"], bufs["gcum"], bufs["h"],
                                                bufs["state"], bufs["cu"], bufs["slots"], bufs["init"], bufs["coff"],
                                                t, bufs["num_slots"], hk, hv, hk * kd, use_l2, init_mode,
                                                K=kd, V=vd, BK=_tile(kd), BV=bv, PREC=prec[1],
                                                WSPLIT=WSPLIT, num_warps=4)


def _out(d, bufs, t, nt, use_l2, scale, prec, bvo):
    hk, hv, kd, vd = d
    CP.gdr_chunk_out_kernel[(nt, hv, (vd + bvo - 1) // bvo)](bufs["q"], bufs["k"], bufs["u"], bufs["gcum"], bufs["h"], bufs["o"],
                                                bufs["cu"], bufs["slots"], bufs["coff"], bufs["cseq"], t,
                                                bufs["num_slots"], hk, hv, hk * kd, hk * kd, use_l2, scale,
                                                K=kd, V=vd, BK=_tile(kd), BV=bvo, PREC=prec[2], num_warps=4)


def reference(q, k, v, g, beta, cu, slots, init, state, use_l2, scale, d):
    """float64 token recurrence; returns (out [T, HV, V], new state)."""
    hk, hv, kd, vd = d
    grp = hv // hk
    q = q.astype(np.float64)
    k = k.astype(np.float64)
    if use_l2:
        q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6)
        k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    q = q * scale
    out = np.zeros(v.shape, np.float64)
    st = state.astype(np.float64).copy()
    for i in range(len(slots)):
        bos, eos, sl = cu[i], cu[i + 1], slots[i]
        if sl < 0 or sl >= st.shape[0]:
            continue
        S = st[sl].copy() if init[i] else np.zeros(st.shape[1:])
        for t in range(bos, eos):
            kk = np.repeat(k[t], grp, axis=0)  # [HV, K]
            qq = np.repeat(q[t], grp, axis=0)
            S *= np.exp(g[t])[:, None, None]
            delta = beta[t][:, None] * (v[t] - np.einsum("hkv,hk->hv", S, kk))
            S += kk[:, :, None] * delta[:, None, :]
            out[t] = np.einsum("hkv,hk->hv", S, qq)
        st[sl] = S
    return out, st


def softplus(x):
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))


def rel(a, b):
    if not np.all(np.isfinite(a)):
        return float("inf")
    den = np.sqrt((b.astype(np.float64) ** 2).sum())
    num = np.sqrt(((a.astype(np.float64) - b) ** 2).sum())
    return num / den if den > 0 else (0.0 if num == 0 else float("inf"))


def run_case(be, name, d, lens, slots, num_slots, init_mode=1, init=None, use_l2=1, fused=0, gmode="rand",
             qk_scale=1.0, prec=(1, 1, 3), seed=0, scale=None):
    """gmode (precomputed gating): rand, zero, extreme (30% -100), neginf (25% -inf mixed with ordinary gates,
    plus one whole chunk of -inf when T > 128); fused gating with gmode "edge": head 0 has A_log = 87
    (exp(A_log) ~ 6.1e37: a in [7, 12] overflows g to -inf, ordinary a gives g ~ -1e37, a in [-87, -85] gives
    ordinary gates (softplus ~ e^a, still a normal f32), all mixed in each chunk) and the other heads get a = -300 on 30% of tokens (softplus underflows to 0: g = -0)."""
    rng = np.random.default_rng(seed)
    hk, hv, kd, vd = d
    n = len(lens)
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    t = int(cu[-1])
    nt = t // 64 + n
    q = rng.uniform(-1, 1, (t, hk, kd)).astype(np.float32) * qk_scale
    k = rng.uniform(-1, 1, (t, hk, kd)).astype(np.float32) * qk_scale
    v = rng.uniform(-1, 1, (t, hv, vd)).astype(np.float32)
    q, k, v = (from_bf16_bits(to_bf16_bits(x)).reshape(x.shape) for x in (q, k, v))
    a = from_bf16_bits(to_bf16_bits(rng.uniform(-3, 3, (t, hv)).astype(np.float32))).reshape(t, hv)
    b = from_bf16_bits(to_bf16_bits(rng.uniform(-3, 3, (t, hv)).astype(np.float32))).reshape(t, hv)
    alog = rng.uniform(-1, 1, hv).astype(np.float32)
    dtb = rng.uniform(-1, 1, hv).astype(np.float32)
    if fused and gmode == "edge":
        alog[0] = 87.0
        u = rng.uniform(size=(t,))
        hi = from_bf16_bits(to_bf16_bits(rng.uniform(7, 12, t).astype(np.float32)))
        lo = from_bf16_bits(to_bf16_bits(rng.uniform(-87, -85, t).astype(np.float32)))
        a[:, 0] = np.where(u < 0.3, hi, np.where(u < 0.7, lo, a[:, 0]))
        if hv > 1:
            a[:, 1:] = np.where(rng.uniform(size=(t, hv - 1)) < 0.3, -300.0, a[:, 1:])
    if fused:
        with np.errstate(over="ignore"):
                g = (-np.exp(alog.astype(np.float64)) * softplus(a.astype(np.float64) + dtb)).astype(np.float32)
        beta = (1 / (1 + np.exp(-b.astype(np.float64)))).astype(np.float32)
    else:
        g = -rng.uniform(0, 0.5, (t, hv)).astype(np.float32)
        if gmode == "zero":
            g[:] = 0
        elif gmode == "extreme":
            g[rng.uniform(size=g.shape) < 0.3] = -100.0
        elif gmode == "neginf":
            g[rng.uniform(size=g.shape) < 0.25] = -np.inf
            if t > 128:
                g[64:128] = -np.inf
        beta = rng.uniform(0, 1, (t, hv)).astype(np.float32)
    state = rng.uniform(-1, 1, (num_slots, hv, kd, vd)).astype(np.float32)
    if init is None:
        init = np.ones(n, np.int32) if init_mode != 0 else np.zeros(n, np.int32)
    init_eff = init if init_mode == 2 else np.full(n, 1 if init_mode == 1 else 0, np.int32)
    sc = kd ** -0.5 if scale is None else scale
    ref_o, ref_s = reference(q, k, v, g, beta, cu, slots, init_eff, state, use_l2, sc, d)
    bufs = {
        "q": be.put(q, "bf16"), "k": be.put(k, "bf16"), "v": be.put(v, "bf16"),
        "g": be.put(g, "f32"), "beta": be.put(beta, "f32"), "a": be.put(a, "bf16"), "b": be.put(b, "bf16"),
        "alog": be.put(alog, "f32"), "dtb": be.put(dtb, "f32"), "cu": be.put(cu, "i32"),
        "slots": be.put(np.array(slots), "i32"), "init": be.put(init, "i32"),
        "coff": be.put(np.full(n + 1, -7), "i32"), "cseq": be.put(np.full(nt, -7), "i32"),
        "gcum": be.put(np.full((t + 1) * hv, np.nan), "f32"), "betaw": be.put(np.full((t + 1) * hv, np.nan), "f32"),
        "A": be.put(np.full((t + 1) * hv * 64, np.nan), "f32"), "w": be.put(np.full((t + 1) * hv * kd * (1 + WSPLIT), np.nan), "bf16" if WSPLIT else "f32"),
        "u": be.put(np.full((t + 1) * hv * vd, np.nan), "f32"), "h": be.put(np.full(nt * hv * kd * vd, np.nan), os.environ.get("HDT", "bf16")),
        "state": be.put(state, "f32"), "o": be.put(np.full((t, hv, vd), np.nan), "bf16"), "num_slots": num_slots,
    }
    launch(be, d, bufs, n, t, nt, use_l2, fused, init_mode, sc, prec, bv=STATE_BV)
    be.sync()
    o = be.get(bufs["o"], "bf16").reshape(t, hv, vd)
    s = be.get(bufs["state"], "f32").reshape(state.shape)
    eo, es = rel(o, ref_o), rel(s, ref_s)
    live = [sl for sl in slots if 0 <= sl < num_slots]
    canary_ok = all(np.array_equal(s[i], state[i]) for i in range(num_slots) if i not in live)
    pad_ok = True
    for i, sl in enumerate(slots):
        if not (0 <= sl < num_slots):
            pad_ok &= bool(np.all(o[cu[i]:cu[i + 1]] == 0))
    ok = eo <= 1e-2 and es <= 1e-3 and canary_ok and pad_ok
    print(f"{'ok  ' if ok else 'FAIL'} {name:34s} d={d} T={t} N={n} out {eo:.2e} state {es:.2e} "
          f"canary {canary_ok} pad {pad_ok}", flush=True)
    return ok


def bench(be, prec):
    torch = be.torch
    import triton.testing
    for name, (hk, hv), n, L in [("27B-TP1 1x8192", (16, 48), 1, 8192), ("27B-TP2 1x8192", (8, 24), 1, 8192),
                                  ("9B 8x8192", (16, 32), 8, 8192), ("9B 1x65536", (16, 32), 1, 65536)]:
        kd = vd = 128
        t = n * L
        nt = t // 64 + n
        dev = "cuda"
        bufs = {
            "q": torch.randn(t, hk, kd, device=dev, dtype=torch.bfloat16),
            "k": torch.randn(t, hk, kd, device=dev, dtype=torch.bfloat16),
            "v": torch.randn(t, hv, vd, device=dev, dtype=torch.bfloat16),
            "g": -torch.rand(t, hv, device=dev) * 0.1, "beta": torch.rand(t, hv, device=dev),
            "a": torch.randn(t, hv, device=dev, dtype=torch.bfloat16),
            "b": torch.randn(t, hv, device=dev, dtype=torch.bfloat16),
            "alog": torch.zeros(hv, device=dev), "dtb": torch.zeros(hv, device=dev),
            "cu": torch.arange(0, n + 1, device=dev, dtype=torch.int32) * L,
            "slots": torch.arange(n, device=dev, dtype=torch.int32), "init": torch.ones(n, device=dev, dtype=torch.int32),
            "coff": torch.empty(n + 1, device=dev, dtype=torch.int32), "cseq": torch.empty(nt, device=dev, dtype=torch.int32),
            "gcum": torch.empty(t * hv, device=dev), "betaw": torch.empty(t * hv, device=dev),
            "A": torch.empty(t * hv * 64, device=dev), "w": torch.empty(t * hv * kd, device=dev),
            "u": torch.empty(t * hv * vd, device=dev), "h": torch.empty(nt * hv * kd * vd, device=dev, dtype=torch.bfloat16),
            "state": torch.zeros(n, hv, kd, vd, device=dev), "o": torch.empty(t, hv, vd, device=dev, dtype=torch.bfloat16),
            "num_slots": n,
        }
        fl = 4 * t * hv * kd * vd
        for bv in (32, 64):
            ms = triton.testing.do_bench(lambda: launch(be, (hk, hv, kd, vd), bufs, n, t, nt, 1, 1, 1, kd ** -0.5, prec,
                                                        bv=bv), warmup=50, rep=300)
            print(f"bench {name:16s} BV={bv}: {ms * 1e3:8.1f} us  {fl / ms / 1e9:6.1f} TFLOP/s (nominal 4*T*Hv*K*V)",
                  flush=True)
        for stage in "mpso":
            ms = triton.testing.do_bench(lambda: launch(be, (hk, hv, kd, vd), bufs, n, t, nt, 1, 1, 1, kd ** -0.5, prec,
                                                        stages=stage), warmup=20, rep=100)
            print(f"   stage {stage}: {ms * 1e3:8.1f} us", flush=True)
        if os.environ.get("FLA"):
            try:
                from fla.ops.gated_delta_rule import chunk_gated_delta_rule
                qf = bufs["q"].view(1, t, hk, kd).repeat_interleave(hv // hk, dim=2)
                kf = bufs["k"].view(1, t, hk, kd).repeat_interleave(hv // hk, dim=2)
                vf = bufs["v"].view(1, t, hv, vd)
                gf = bufs["g"].view(1, t, hv)
                bf = bufs["beta"].view(1, t, hv).to(torch.bfloat16)
                h0 = torch.zeros(n, hv, kd, vd, device=dev)
                cu = bufs["cu"].long()
                fn = lambda: chunk_gated_delta_rule(qf, kf, vf, gf, bf, initial_state=h0, output_final_state=True,
                                                    cu_seqlens=cu, use_qk_l2norm_in_kernel=True)
                fn()
                ms = triton.testing.do_bench(fn, warmup=50, rep=300)
                print(f"   FLA chunk_gated_delta_rule: {ms * 1e3:8.1f} us  {fl / ms / 1e9:6.1f} TFLOP/s", flush=True)
            except Exception as e:  # noqa: BLE001
                print(f"   FLA failed: {e!r}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--prec", default="4,4,4")
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--prep", choices=("fused", "staged", "split"), default="split",
                    help="WY prep: the two launches kkt + solve (default, as the library) or the fused kkt_solve "
                         "kernel (staged: A through L1/L2, 4 warps; fused: A blocks in registers, 1 warp)")
    ap.add_argument("--wsplit", type=int, choices=(0, 1), default=0,
                    help="1: W as bf16 hi / lo planes between the W/U and state passes (DELTAKIT_GDR_PREFILL=wsplit); "
                         "0: f32 W (default)")
    ap.add_argument("--state-bv", type=int, choices=(16, 32, 64), default=32, help="state-pass value columns")
    args = ap.parse_args()
    global PREP, WSPLIT, STATE_BV
    PREP, WSPLIT, STATE_BV = args.prep, args.wsplit, args.state_bv
    prec = tuple(int(x) for x in args.prec.split(","))
    be = Backend(args.cpu)
    ok = True
    ok &= run_case(be, "basic 1 seq", (2, 4, 64, 64), [150], [1], 3, prec=prec, seed=1)
    if not args.quick:
        ok &= run_case(be, "varlen pad/oob/init2", (1, 3, 64, 64), [1, 64, 0, 65, 63, 10, 70], [4, 0, 2, -1, 1, 9, 5], 8,
                       init_mode=2, init=np.array([1, 0, 1, 1, 0, 1, 1], np.int32), prec=prec, seed=2)
        ok &= run_case(be, "K!=V 64x128 grp2", (2, 4, 64, 128), [100, 30], [1, 0], 2, prec=prec, seed=3)
        ok &= run_case(be, "K!=V 128x64 grp1", (2, 2, 128, 64), [129], [0], 1, prec=prec, seed=4)
        ok &= run_case(be, "no init", (1, 2, 128, 128), [77, 64], [1, 0], 2, init_mode=0, prec=prec, seed=5)
        ok &= run_case(be, "g zero", (1, 2, 64, 64), [130], [0], 1, gmode="zero", prec=prec, seed=6)
        ok &= run_case(be, "g extreme", (1, 2, 64, 64), [130], [0], 1, gmode="extreme", prec=prec, seed=7)
        ok &= run_case(be, "tiny qk", (1, 2, 64, 64), [70], [0], 1, qk_scale=1e-4, prec=prec, seed=8)
        ok &= run_case(be, "fused gating", (2, 6, 128, 128), [200, 5], [1, 0], 2, fused=1, prec=prec, seed=9)
        ok &= run_case(be, "no l2 scale 0.3", (1, 1, 64, 64), [90], [0], 1, use_l2=0, qk_scale=0.1, scale=0.3,
                       prec=prec, seed=10)
        # Small head dims (the tiny HF test models: K = 32, V in {16, 32}): padded tiles.
        ok &= run_case(be, "small K=V=32 varlen", (2, 4, 32, 32), [1, 64, 0, 65, 63], [3, 0, -1, 1, 2], 4,
                       init_mode=2, init=np.array([1, 0, 1, 1, 0], np.int32), prec=prec, seed=12)
        ok &= run_case(be, "small K=32 V=16 fused", (2, 6, 32, 16), [130, 7], [1, 0], 2, fused=1, prec=prec, seed=13)
        ok &= run_case(be, "small K=64 V=16", (1, 3, 64, 16), [100], [0], 1, prec=prec, seed=14)
        ok &= run_case(be, "small K=128 V=32", (2, 2, 128, 32), [70], [0], 1, prec=prec, seed=15)
        ok &= run_case(be, "small K=32 V=128", (1, 2, 32, 128), [66], [0], 1, gmode="extreme", prec=prec, seed=16)
        # K = 16 (padded to the 64-wide key tile), every V.
        for i, vd in enumerate((16, 32, 64, 128)):
            ok &= run_case(be, f"K=16 V={vd} varlen", (2, 4, 16, vd), [1, 70, 0, 64], [2, 0, -1, 1], 3,
                           init_mode=2, init=np.array([1, 1, 0, 0], np.int32), fused=i % 2, prec=prec, seed=20 + i)
    # Gates at the edge of f32 (g = -inf: full decay; softplus underflow: g = -0), fused and precomputed.
    ok &= run_case(be, "g -inf mixed (precomputed)", (1, 2, 64, 64), [200, 30], [0, 1], 2, gmode="neginf", prec=prec,
                   seed=30)
    ok &= run_case(be, "g edge (fused)", (2, 4, 64, 64), [200, 30], [0, 1], 2, fused=1, gmode="edge", prec=prec,
                   seed=31)
    if not args.quick:
        ok &= run_case(be, "g -inf K=16 V=32", (1, 3, 16, 32), [130], [0], 1, gmode="neginf", prec=prec, seed=32)
        ok &= run_case(be, "g edge fused K=128 V=128", (1, 2, 128, 128), [150], [0], 1, fused=1, gmode="edge",
                       prec=prec, seed=33)
        if not args.cpu:
            ok &= run_case(be, "qwen 16/48 T=1000", (16, 48, 128, 128), [1000], [0], 1, fused=1, prec=prec, seed=11)
    print("ALL OK" if ok else "SOME FAILED", flush=True)
    if args.bench and not args.cpu:
        bench(be, prec)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
