#!/usr/bin/env python3
"""CPU check of the plan of the sm_90a CUDA state pass (csrc/gdr/chunk_prefill_sm90.cu), numpy only.

Two checks, no GPU:
 1. Numerics of the plan: the chunked state pass exactly as the kernel computes it (W as bf16 hi / lo planes,
    S split into bf16 hi / lo for W S, D * dec split for K^T D', bf16 h = S_hi, f32 accumulation) on W / U built
    from the WY algebra in float64, against the float64 token recurrence: final state and the output
    reconstructed from h and D (o = e^gc (q S0) + (q K^T * decay, causal) D, as the output pass does).
 2. Indexing of the plan: the kernel's register-fragment -> 128-byte-swizzled shared-memory writes (S, D') and
    its cp.async tile writes (W, K) are replayed into byte buffers, then read back the way the wgmma descriptors
    of the kernel address them (K-major A: panel kc / 4, +32 bytes per k16 step, 8-row groups 1024 bytes apart;
    MN-major A / B: +2048 bytes per k16 step, rows of 128 bytes), and the products are compared with plain
    matrix products. The descriptor semantics are those attn.prefill (csrc/attn/prefill_sm90.cu) relies on and
    passed its H200 tests with; this checks that the state pass writes what its descriptors read.

  python3 tools/dev_sm90_state_plan.py [--seed N] [--tokens 300] [--chunks-check 3]
"""
import argparse

import numpy as np

K = V = 128
BV = 64
BT = 64
G_FLOOR = 64.0


def bf16(x):
    """Round f32 -> bf16 (nearest even), returned as f32."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint32) << 16
    return b.view(np.float32)


def split(x):
    x = np.asarray(x, dtype=np.float32)
    hi = bf16(x)
    lo = bf16(x - hi)
    return hi, lo


def dexp(x):
    return np.where(x > 1.0 - G_FLOOR, np.exp(np.minimum(x, 0.0)), 0.0)


def make_case(rng, T):
    q = bf16(rng.standard_normal((T, K)).astype(np.float32))
    k = bf16(rng.standard_normal((T, K)).astype(np.float32))
    v = bf16(rng.standard_normal((T, V)).astype(np.float32))
    g = np.log(1.0 / (1.0 + np.exp(-rng.standard_normal(T)))).astype(np.float32)  # logsigmoid
    g[rng.random(T) < 0.02] = -np.inf  # full decays mixed in (clamped at -G_FLOOR as the kkt pass does)
    beta = (1.0 / (1.0 + np.exp(-rng.standard_normal(T)))).astype(np.float32)
    s0 = (0.05 * rng.standard_normal((K, V))).astype(np.float32)
    return q, k, v, g, beta, s0


def recurrence(q, k, v, g, beta, s0, scale):
    """float64 token recurrence with q/k L2 norm: S *= e^g; d = beta (v - S^T k); S += k d^T; o = S^T q."""
    S = s0.astype(np.float64).copy()
    kn = k / np.sqrt((k.astype(np.float64) ** 2).sum(1, keepdims=True) + 1e-6)
    qn = q / np.sqrt((q.astype(np.float64) ** 2).sum(1, keepdims=True) + 1e-6) * scale
    o = np.zeros((len(q), V))
    for t in range(len(q)):
        S *= np.exp(max(g[t], -G_FLOOR)) if g[t] > -G_FLOOR else 0.0
        d = beta[t] * (v[t] - S.T @ kn[t])
        S += np.outer(kn[t], d)
        o[t] = S.T @ qn[t]
    return o, S


def plan(q, k, v, g, beta, s0, scale):
    """The chunked pass as the kernels compute it: W / U from the WY algebra (float64 here; the GPU's W/U pass
    is checked elsewhere), then the sm_90a state pass's operations and roundings, then the output pass."""
    T = len(q)
    gc_all = np.zeros(T, np.float32)
    rnk = (1.0 / np.sqrt((k.astype(np.float64) ** 2).sum(1) + 1e-6)).astype(np.float32)
    rnq = (1.0 / np.sqrt((q.astype(np.float64) ** 2).sum(1) + 1e-6)).astype(np.float32)
    S = s0.astype(np.float32).copy()
    hs, ds = [], []
    for c0 in range(0, T, BT):
        rows = slice(c0, min(c0 + BT, T))
        n = rows.stop - rows.start
        gg = np.maximum(g[rows], -G_FLOOR).astype(np.float64)
        gc = np.cumsum(gg)
        gc_all[rows] = gc
        kk = k[rows].astype(np.float64) * rnk[rows, None]
        A = np.tril((beta[rows, None] * (kk @ kk.T)) * dexp(gc[:, None] - gc[None, :]), -1)
        Tm = np.linalg.inv(np.eye(n) + A)
        W = (Tm @ (beta[rows, None] * np.exp(gc)[:, None] * kk)).astype(np.float32)
        U = (Tm @ (beta[rows, None] * v[rows].astype(np.float64))).astype(np.float32)
        w_hi, w_lo = split(W)  # the W/U pass stores these planes
        # --- the sm_90a kernel, one chunk:
        s_hi, s_lo = split(S)
        hs.append(s_hi.copy())  # h = bf16(S)
        WS = (w_hi.astype(np.float64) @ s_hi + w_hi.astype(np.float64) @ s_lo + w_lo.astype(np.float64) @ s_hi)
        D = (U - WS.astype(np.float32)).astype(np.float32)
        ds.append(D)
        g_last = np.float32(gc[-1])
        dec = (dexp(g_last - gc) * rnk[rows]).astype(np.float32)
        d_hi, d_lo = split(D * dec[:, None])
        KT = k[rows].T.astype(np.float64)  # raw bf16 keys, exact
        S = (S * np.float32(dexp(g_last)) + (KT @ d_hi + KT @ d_lo).astype(np.float32)).astype(np.float32)
    # output pass (as gdr_chunk_out_kernel, f64 here): o = e^gc (q S0) + (q K^T * decay, causal) D
    o = np.zeros((T, V))
    for ci, c0 in enumerate(range(0, T, BT)):
        rows = slice(c0, min(c0 + BT, T))
        qq = q[rows].astype(np.float64) * (rnq[rows] * scale)[:, None]
        kk = k[rows].astype(np.float64) * rnk[rows, None]
        gc = gc_all[rows].astype(np.float64)
        att = np.tril((qq @ kk.T) * dexp(gc[:, None] - gc[None, :]))
        o[rows] = np.exp(gc)[:, None] * (qq @ hs[ci]) + att @ ds[ci]
    return o, S


# ------------------------------------------------------------------------------------------ indexing check
def swz(row, col):
    """Byte offset of bf16 element (row, col) of a 128-byte-swizzled panel (as swz() in the kernel)."""
    return row * 128 + ((((col * 2) >> 4) ^ (row & 7)) << 4) + ((col * 2) & 15)


def frag(m_rows, n_cols):
    """(register index, row, col) of the wgmma m64nN f32 accumulator for all 128 threads of a warpgroup."""
    out = []
    for t in range(128):
        w, l = t // 32, t % 32
        ra, cb = 16 * w + l // 4, 2 * (l % 4)
        for i in range(n_cols // 8):
            for hh in range(2):
                for e in range(2):
                    out.append((t, 4 * i + 2 * hh + e, ra + 8 * hh, 8 * i + cb + e))
    return out


def read_kmajor(buf, base, rows, kdim):
    """Matrix [rows, kdim] as a K-major SW128 operand: panel kc // 4 (of 64 columns, rows * 128 bytes), + 32 bytes
    per k16 step inside the row, rows 128 bytes apart (the 8-row groups 1024 bytes apart)."""
    m = np.zeros((rows, kdim), np.float32)
    for r in range(rows):
        for c in range(kdim):
            panel, cc = c // 64, c % 64
            off = base + panel * rows * 128 + swz(r, cc)
            m[r, c] = buf[off // 2]
    return m


def read_mnmajor(buf, base, kdim, ndim, panel_rows):
    """Operand [kdim, ndim] stored MN-major (rows = the K dimension, 128 bytes = 64 N elements per row, N panels of
    panel_rows rows), + 2048 bytes per k16 step: element (kk, n) at base + (n // 64) * panel_rows * 128 +
    swz(kk, n % 64)."""
    m = np.zeros((kdim, ndim), np.float32)
    for kk in range(kdim):
        for n in range(ndim):
            m[kk, n] = buf[(base + (n // 64) * panel_rows * 128 + swz(kk, n % 64)) // 2]
    return m


def indexing_check(rng):
    """Replays the kernel's shared-memory writes and reads the operands back through the descriptor layout."""
    # S tile [128 k, 64 v] written from two m64 accumulator tiles at rows 64 m + frag row.
    S = rng.standard_normal((K, BV)).astype(np.float32)
    sbuf = np.full(K * 128 // 2, np.nan, np.float32)
    for m in range(2):
        for (_, _, r, c) in frag(64, BV):
            sbuf[swz(64 * m + r, c) // 2] = S[64 * m + r, c]
    got_s = read_mnmajor(sbuf, 0, K, BV, K)
    ok_s = np.array_equal(got_s, S)
    # W tile [64 t, 128 k] by the producer's cp.async 16-byte chunks: chunk c16 of row r at panel c16 // 8.
    Wm = rng.standard_normal((BT, K)).astype(np.float32)
    wbuf = np.full(BT * K, np.nan, np.float32)
    for r in range(BT):
        for c16 in range(16):
            off = (c16 // 8) * BT * 128 + swz(r, (c16 % 8) * 8)
            wbuf[off // 2: off // 2 + 8] = Wm[r, c16 * 8: c16 * 8 + 8]
    got_w = read_kmajor(wbuf, 0, BT, K)
    ok_w = np.array_equal(got_w, Wm)
    # K tile (same writes as W) read as K^T, MN-major A of m-tile m: panel m, rows = tokens (the K dimension).
    # (read_mnmajor gives [t, k'] = K[t, 64 m + k']; the wgmma A operand is its transpose, K^T rows 64 m ..)
    ok_kt = all(np.array_equal(read_mnmajor(wbuf, m * BT * 128, BT, 64, BT), Wm[:, 64 * m: 64 * m + 64])
                for m in range(2))
    # D' tile [64 t, 64 v] from the accumulator of D.
    Dm = rng.standard_normal((BT, BV)).astype(np.float32)
    dbuf = np.full(BT * 128 // 2, np.nan, np.float32)
    for (_, _, r, c) in frag(64, BV):
        dbuf[swz(r, c) // 2] = Dm[r, c]
    ok_d = np.array_equal(read_mnmajor(dbuf, 0, BT, BV, BT), Dm)
    # The products the descriptors then form: W S (64 x 64) and K^T D' per m-tile.
    ws = got_w.astype(np.float64) @ got_s
    ok_ws = np.allclose(ws, Wm.astype(np.float64) @ S)
    return {"S (MN-major B)": ok_s, "W (K-major A)": ok_w, "K^T (MN-major A)": ok_kt, "D' (MN-major B)": ok_d,
            "W S product": ok_ws}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=300)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    bad = 0
    for name, ok in indexing_check(rng).items():
        print(f"indexing {name}: {'ok' if ok else 'MISMATCH'}")
        bad += not ok
    scale = K ** -0.5
    for T in (1, 63, 64, 65, args.tokens):
        q, k, v, g, beta, s0 = make_case(rng, T)
        o_ref, s_ref = recurrence(q, k, v, g, beta, s0, scale)
        o, s = plan(q, k, v, g, beta, s0, scale)
        eo = np.linalg.norm(o - o_ref) / np.linalg.norm(o_ref)
        es = np.linalg.norm(s - s_ref) / np.linalg.norm(s_ref)
        # out: the output pass reads h = bf16(S) (as the library does; its GPU tests see ~2.5e-3 with bf16 outputs)
        ok = eo < 2e-3 and es < 1e-4 and np.isfinite(o).all() and np.isfinite(s).all()
        bad += not ok
        print(f"plan T={T:5d}: out rel err {eo:.2e}, state rel err {es:.2e} {'ok' if ok else 'FAIL'}")
    print("all ok" if not bad else f"{bad} FAILED")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
