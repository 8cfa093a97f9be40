#!/usr/bin/env python3
"""CPU emulation (numpy) of the fused sm_90a chunk-prefill kernel's algorithm
(csrc/gdr/chunk_prefill_fused_sm90.cu) at the precision of each operand it feeds the tensor cores,
against a float64 token recurrence. Per chunk (64 tokens), value columns transposed (S^T [V, K]):
  X^T  = S^T K^T                       (S^T as bf16 hi + lo, K raw bf16)
  E^T  = V^T - X^T diag(e^gc rn_k)      (f32)
  v^T  = E^T Tb^T,  Tb = (I + A)^-1 diag(beta)   (E hi/lo x Tb hi/lo: 3 products)
  O^T  = (S_hi^T Q^T) diag(rn_q scale e^gc) + v^T P^T,  P = QK^T rn_q scale rn_k e^{gc_t-gc_s} (s <= t)
  S^T  = e^{g_last} S^T + (v^T diag(e^{g_last-gc} rn_k)) K     (hi/lo of the scaled v)
Usage: python3 tools/dev_fused_plan.py [--seed N]
"""
import argparse
import numpy as np

def bf(x):
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint32) << 16
    return b.astype(np.uint32).view(np.float32).astype(np.float64)

def split(x):
    x = np.asarray(x, np.float32)
    hi = bf(x)
    lo = bf((x.astype(np.float64) - hi).astype(np.float32))
    return hi, lo

def dexp(x):
    return np.where(x > -63.0, np.exp(np.minimum(x, 0.0)), 0.0)

def recurrence(q, k, v, g, beta, S0, scale):
    S = S0.astype(np.float64).copy()
    T = q.shape[0]
    o = np.zeros((T, v.shape[1]))
    for t in range(T):
        qq = q[t] / np.sqrt((q[t] ** 2).sum() + 1e-6) * scale
        kk = k[t] / np.sqrt((k[t] ** 2).sum() + 1e-6)
        S *= np.exp(g[t])
        d = beta[t] * (v[t] - S.T @ kk)
        S += np.outer(kk, d)
        o[t] = S.T @ qq
    return o, S

def inv_blocks(A, tri_prec):
    """(I + A)^-1 as the kernel: 16x16 diagonal blocks in f32 forward substitution, off-diagonal
    blocks T_ij = -D_i sum_m A_im T_mj with hi/lo products (3) when tri_prec == 'hilo'."""
    n = 64
    A = A.astype(np.float32)
    Tm = np.zeros((n, n), np.float32)
    D = []
    for b in range(4):
        a = A[16*b:16*b+16, 16*b:16*b+16]
        inv = np.eye(16, dtype=np.float32)
        for i in range(1, 16):
            inv[i] = inv[i] - (a[i, :i, None] * inv[:i]).sum(0, dtype=np.float32)
        D.append(inv)
        Tm[16*b:16*b+16, 16*b:16*b+16] = inv
    def mm(x, y):
        if tri_prec == 'hilo':
            xh, xl = split(x); yh, yl = split(y)
            return (xh @ yh + (xh @ yl + xl @ yh)).astype(np.float32)
        return (x.astype(np.float64) @ y).astype(np.float32)
    for i in range(1, 4):
        for j in range(i - 1, -1, -1):
            pass
    blk = lambda M, i, j: M[16*i:16*i+16, 16*j:16*j+16]
    for lvl in range(1, 4):
        for j in range(0, 4 - lvl):
            i = j + lvl
            X = np.zeros((16, 16), np.float32)
            for m in range(j, i):
                X = X + mm(blk(A, i, m), blk(Tm, m, j))
            Tm[16*i:16*i+16, 16*j:16*j+16] = -mm(D[i], X)
    return Tm

def fused(q, k, v, g, beta, S0, scale, pv='hilo3', tri='hilo'):
    T, K = k.shape
    V = v.shape[1]
    St = S0.T.astype(np.float32).copy()  # [V, K]
    o = np.zeros((T, V))
    qb, kb, vb = bf(q), bf(k), bf(v)
    for c0 in range(0, T, 64):
        n = min(64, T - c0)
        Kc = np.zeros((64, K)); Kc[:n] = kb[c0:c0+n]
        Qc = np.zeros((64, K)); Qc[:n] = qb[c0:c0+n]
        Vc = np.zeros((64, V)); Vc[:n] = vb[c0:c0+n]
        gg = np.zeros(64, np.float32); gg[:n] = np.maximum(g[c0:c0+n], -64.0)
        be = np.zeros(64, np.float32); be[:n] = beta[c0:c0+n]
        gc = np.cumsum(gg, dtype=np.float32)
        rk = (1.0 / np.sqrt((Kc ** 2).sum(1) + 1e-6)).astype(np.float32)
        rq = (1.0 / np.sqrt((Qc ** 2).sum(1) + 1e-6)).astype(np.float32)
        m = np.arange(64) < n
        r = np.arange(64)
        low = r[:, None] > r[None, :]
        A = (Kc @ Kc.T).astype(np.float32) * (be * rk)[:, None] * rk[None, :]
        A = np.where(low, A * dexp(np.where(low, gc[:, None] - gc[None, :], 0.0)), 0.0).astype(np.float32)
        Tm = inv_blocks(A, tri)
        Tb = (Tm * be[None, :]).astype(np.float32)
        cz = r[:, None] >= r[None, :]
        P = (Qc @ Kc.T).astype(np.float32) * (rq * scale)[:, None] * rk[None, :]
        P = np.where(cz, P * dexp(np.where(cz, gc[:, None] - gc[None, :], 0.0)), 0.0).astype(np.float32)
        sh, sl = split(St)
        Xt = (sh @ Kc.T + sl @ Kc.T).astype(np.float32)  # [V, 64]
        xsc = np.where(m, dexp(gc) * rk, 0.0).astype(np.float32)
        Et = (Vc.T - Xt * xsc[None, :]).astype(np.float32)
        eh, el = split(Et); th, tl = split(Tb)
        vn = (eh @ th.T + (eh @ tl.T + el @ th.T)).astype(np.float32)  # [V, 64 t]
        O1 = (sh @ Qc.T).astype(np.float32) * (np.where(m, rq * scale * dexp(gc), 0.0))[None, :]
        ph, pl = split(P); vh, vl = split(vn)
        if pv == 'hilo3':
            O2 = vh @ ph.T + (vh @ pl.T + vl @ ph.T)
        elif pv == 'vhilo':
            O2 = vh @ ph.T + vl @ ph.T
        else:
            O2 = vh @ ph.T
        Ot = O1 + O2
        o[c0:c0+n] = bf(Ot.T[:n].astype(np.float32))
        kdec = np.where(m, dexp(gc[63] - gc) * rk, 0.0).astype(np.float32)
        wh, wl = split(vn * kdec[None, :])
        St = (St * np.float32(dexp(gc[63])) + (wh @ Kc + wl @ Kc)).astype(np.float32)
    return o, St.T

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--seed', type=int, default=0)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    for (T, K, V, gmode) in [(200, 128, 128, 'norm'), (513, 128, 64, 'norm'), (130, 128, 128, 'edge'), (64, 128, 128, 'zero'), (1000, 128, 128, 'norm')]:
        q = bf(rng.standard_normal((T, K)).astype(np.float32))
        k = bf(rng.standard_normal((T, K)).astype(np.float32))
        v = bf(rng.standard_normal((T, V)).astype(np.float32))
        if gmode == 'norm':
            g = -np.abs(rng.standard_normal(T) * 0.3).astype(np.float32)
        elif gmode == 'zero':
            g = np.zeros(T, np.float32)
        else:
            g = -np.abs(rng.standard_normal(T) * 0.3).astype(np.float32)
            g[rng.integers(0, T, 6)] = -np.inf
            g[rng.integers(0, T, 6)] = -100.0
        beta = (1 / (1 + np.exp(-rng.standard_normal(T)))).astype(np.float32)
        S0 = rng.standard_normal((K, V)).astype(np.float32) * 0.5
        scale = K ** -0.5
        ro, rS = recurrence(q, k, v, np.maximum(g, -1e30), beta, S0, scale)
        for pv in ['hilo3', 'vhilo', 'hi']:
            for tri in ['hilo', 'f64']:
                fo, fS = fused(q, k, v, g, beta, S0, scale, pv, tri)
                eo = np.linalg.norm(fo - ro) / np.linalg.norm(ro)
                es = np.linalg.norm(fS - rS) / np.linalg.norm(rS)
                print(f"T={T} K={K} V={V} g={gmode} pv={pv} tri={tri}: out {eo:.2e} state {es:.2e}")

if __name__ == '__main__':
    main()
