#!/usr/bin/env python3
"""Lane-level CPU emulation of csrc/gdr/chunk_prefill_fused_sm90.cu (one CTA = one sequence, value head, 64 value
columns): shared memory as bytes with the kernel's swizzled addresses, ldmatrix (x4, .trans) from per-lane addresses,
mma.sync m16n8k16 from per-lane fragments, the same loops and index math as the CUDA source. Checks the fragment /
swizzle / barrier-free data flow against the float64 token recurrence of tools/dev_fused_plan.py.
  python3 tools/dev_fused_lanes.py
"""
import numpy as np
import importlib.util, pathlib
spec = importlib.util.spec_from_file_location("plan", pathlib.Path(__file__).with_name("dev_fused_plan.py"))
plan = importlib.util.module_from_spec(spec); spec.loader.exec_module(plan)

L = np.arange(32)
G, Q = L >> 2, L & 3
f32 = np.float32

def bf16_bits(x):
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return (((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF).astype(np.uint32)
def bits_f(u):
    return (np.asarray(u, np.uint32) << 16).view(np.float32)
def pack(x, y):
    return bf16_bits(x) | (bf16_bits(y) << 16)
def unpack(u):
    u = np.asarray(u, np.uint32)
    return bits_f(u & 0xFFFF), bits_f(u >> 16)
def split2(x, y):
    hi = pack(x, y)
    hx, hy = unpack(hi)
    lo = pack((np.asarray(x, f32) - hx).astype(f32), (np.asarray(y, f32) - hy).astype(f32))
    return hi, lo

class Smem:
    def __init__(self, n):
        self.b = np.zeros(n, np.uint8)
    def u16(self, addr):
        return self.b[addr].astype(np.uint32) | (self.b[addr + 1].astype(np.uint32) << 8)
    def put16(self, addr, bits):
        self.b[addr] = bits & 0xFF; self.b[addr + 1] = (bits >> 8) & 0xFF
    def ldsm4(self, addrs, trans=False):
        r = np.zeros((4, 32), np.uint32)
        for i in range(4):
            rows = addrs[8 * i:8 * i + 8]
            m = np.array([[self.u16(rows[rr] + 2 * cc) for cc in range(8)] for rr in range(8)], np.uint32)
            for l in range(32):
                if not trans:
                    e0, e1 = m[l // 4, 2 * (l % 4)], m[l // 4, 2 * (l % 4) + 1]
                else:
                    e0, e1 = m[2 * (l % 4), l // 4], m[2 * (l % 4) + 1, l // 4]
                r[i, l] = e0 | (e1 << 16)
        return r

def mma(c, a, b0, b1):
    """c [4][32] f32 += A(16x16 from a[4][32]) B(16x8 from b0, b1)."""
    A = np.zeros((16, 16)); B = np.zeros((16, 8))
    for l in range(32):
        g, q = l >> 2, l & 3
        for (reg, r, k) in [(0, g, 2 * q), (1, g + 8, 2 * q), (2, g, 2 * q + 8), (3, g + 8, 2 * q + 8)]:
            x, y = unpack(a[reg][l]); A[r, k] = x; A[r, k + 1] = y
        x, y = unpack(b0[l]); B[2 * q, g] = x; B[2 * q + 1, g] = y
        x, y = unpack(b1[l]); B[2 * q + 8, g] = x; B[2 * q + 9, g] = y
    C = A @ B
    out = c.copy()
    out[0] = (c[0] + C[G, 2 * Q]).astype(f32); out[1] = (c[1] + C[G, 2 * Q + 1]).astype(f32)
    out[2] = (c[2] + C[G + 8, 2 * Q]).astype(f32); out[3] = (c[3] + C[G + 8, 2 * Q + 1]).astype(f32)
    return out

def swz(base, row, col, rb):
    return base + row * rb + (((col >> 3) ^ (row & 7)) << 4)
def a_b_nk(base, n0, k0, rb):
    return swz(base, n0 + ((L >> 4) << 3) + (L & 7), k0 + (((L >> 3) & 1) << 3), rb)
def a_a_mk(base, m0, k0, rb):
    return swz(base, m0 + (((L >> 3) & 1) << 3) + (L & 7), k0 + ((L >> 4) << 3), rb)
def a_b_kn(base, k0, n0, rb):
    return swz(base, k0 + (((L >> 3) & 1) << 3) + (L & 7), n0 + ((L >> 4) << 3), rb)
def a_a_km(base, k0, m0, rb):
    return swz(base, k0 + ((L >> 4) << 3) + (L & 7), m0 + (((L >> 3) & 1) << 3), rb)

kOK, kOQ, kOV, kOTh, kOTl, kOP, kOVec = 0, 16384, 32768, 40960, 49152, 57344, 65536
GPART, BETA, GC, RNK, RNQ, XSC, QSC, KDEC, MISC = range(9)

def dexp(x):
    x = np.asarray(x, f32)
    return np.where(x > -63.0, np.exp(np.minimum(x, 0)).astype(f32), f32(0))

def mm16_f32(acc, A, B):
    """acc [2][4][32] += A (16x16 f32 array) x B (16x16 f32 [k][n]), three bf16 products, kernel fragments."""
    ah = [None] * 4; al = [None] * 4
    for reg, (r, k) in enumerate([(G, 2 * Q), (G + 8, 2 * Q), (G, 2 * Q + 8), (G + 8, 2 * Q + 8)]):
        ah[reg], al[reg] = split2(A[r, k], A[r, k + 1])
    for nt in range(2):
        n = 8 * nt + G
        bh0, bl0 = split2(B[2 * Q, n], B[2 * Q + 1, n])
        bh1, bl1 = split2(B[2 * Q + 8, n], B[2 * Q + 9, n])
        acc[nt] = mma(acc[nt], ah, bh0, bh1)
        acc[nt] = mma(acc[nt], ah, bl0, bl1)
        acc[nt] = mma(acc[nt], al, bh0, bh1)

def run_cta(q, k, v, g, beta, S0, scale, col0=0):
    """q, k [T, 128] f32 (bf16 values), v [T, V], g, beta [T]; S0 [128, V]. Returns out [T, 64], S [128, 64]."""
    T = q.shape[0]
    nc = (T + 63) // 64
    st_mem = Smem(65536 + 9 * 256)
    vecv = lambda i: None
    # state warps' registers: s[sw][nt][i][lane]
    s = np.zeros((4, 16, 4, 32), f32)
    for sw in range(4):
        for nt in range(16):
            for i in range(4):
                kk = 8 * nt + 2 * Q + (i & 1); vv = 16 * sw + G + 8 * (i >> 1)
                s[sw, nt, i] = S0[kk, col0 + vv]
    out = np.zeros((T, 64), f32)
    for c in range(nc):
        sm = Smem(65536 + 9 * 256)
        vec = np.zeros((9, 64), f32)
        t0 = 64 * c; n = min(64, T - t0)
        # ---- local: loads (cp.async with the kernel's offsets)
        for lt in range(128):
            for i in range(8):
                idx = lt + 128 * i; row = idx >> 4; ch = idx & 15
                off = row * 256 + ((ch ^ (row & 7)) << 4)
                for e in range(8):
                    kv = k[t0 + row, ch * 8 + e] if row < n else 0.0
                    qv = q[t0 + row, ch * 8 + e] if row < n else 0.0
                    sm.put16(kOK + off + 2 * e, int(bf16_bits(kv)))
                    sm.put16(kOQ + off + 2 * e, int(bf16_bits(qv)))
            for i in range(4):
                idx = lt + 128 * i; row = idx >> 3; ch = idx & 7
                off = row * 128 + ((ch ^ (row & 7)) << 4)
                for e in range(8):
                    vv = v[t0 + row, col0 + ch * 8 + e] if row < n else 0.0
                    sm.put16(kOV + off + 2 * e, int(bf16_bits(vv)))
        gg = np.zeros(64, f32); be = np.zeros(64, f32)
        gg[:n] = np.maximum(g[t0:t0 + n], -64.0); be[:n] = beta[t0:t0 + n]
        part = np.zeros(64, f32)
        for w in range(2):
            part[32 * w:32 * w + 32] = np.cumsum(gg[32 * w:32 * w + 32], dtype=f32)
        vec[GPART] = part; vec[BETA] = be
        for lt in range(128):
            row = lt & 63
            base = (kOK if lt < 64 else kOQ) + row * 256
            ss = f32(0)
            for e in range(128):
                x = bits_f(sm.u16(base + 2 * e)); ss = f32(ss + x * x)
            rn = f32(1.0 / np.sqrt(ss + 1e-6))
            gc = f32(part[row] + (part[31] if row >= 32 else 0))
            gl = f32(part[63] + part[31])
            valid = row < n
            if lt < 64:
                vec[GC, row] = gc; vec[RNK, row] = rn
                vec[XSC, row] = dexp(gc) * rn if valid else 0
                vec[KDEC, row] = dexp(gl - gc) * rn if valid else 0
                if row == 0: vec[MISC, 0] = dexp(gl)
            else:
                rq = f32(rn * scale); vec[RNQ, row] = rq
                vec[QSC, row] = rq * dexp(gc) if valid else 0
        sA = np.zeros((64, 64), f32); sT = np.full((64, 64), np.nan, f32)
        for lw in range(4):
            a = np.zeros((8, 4, 32), f32); pp = np.zeros((8, 4, 32), f32)
            m0 = 16 * lw
            for kb in range(8):
                ka = sm.ldsm4(a_a_mk(kOK, m0, 16 * kb, 256)); qa = sm.ldsm4(a_a_mk(kOQ, m0, 16 * kb, 256))
                for np_ in range(4):
                    if np_ <= lw:
                        b = sm.ldsm4(a_b_nk(kOK, 16 * np_, 16 * kb, 256))
                        a[2 * np_] = mma(a[2 * np_], ka, b[0], b[1]); a[2 * np_ + 1] = mma(a[2 * np_ + 1], ka, b[2], b[3])
                        pp[2 * np_] = mma(pp[2 * np_], qa, b[0], b[1]); pp[2 * np_ + 1] = mma(pp[2 * np_ + 1], qa, b[2], b[3])
            for h in range(2):
                for l in range(32):
                    t = m0 + G[l] + 8 * h
                    bt = f32(vec[BETA, t] * vec[RNK, t]); rq = vec[RNQ, t]; gct = vec[GC, t]
                    for nt in range(8):
                        s_ = 8 * nt + 2 * Q[l]
                        pv = [0, 0]
                        for e in range(2):
                            rks = vec[RNK, s_ + e]
                            dx = dexp(gct - vec[GC, s_ + e]) if s_ + e <= t else 0
                            sA[t, s_ + e] = a[nt, 2 * h + e, l] * bt * rks * dx if s_ + e < t else 0
                            pv[e] = pp[nt, 2 * h + e, l] * rq * rks * dx if s_ + e <= t else 0
                        u = pack(pv[0], pv[1])
                        addr = kOP + t * 128 + (((s_ >> 3) ^ (t & 7)) << 4) + (s_ & 7) * 2
                        sm.put16(addr, int(u & 0xFFFF)); sm.put16(addr + 2, int(u >> 16))
        for lw in range(4):
            Ab = sA[16 * lw:16 * lw + 16, 16 * lw:16 * lw + 16]
            for cidx in range(16):
                col = np.zeros(16, f32)
                for i in range(16):
                    x = f32(1.0 if i == cidx else 0.0)
                    for m in range(i):
                        x = f32(x - f32(Ab[i, m] * col[m]))
                    col[i] = x
                sT[16 * lw:16 * lw + 16, 16 * lw + cidx] = col
        for lvl in range(1, 4):
            for lw in range(4):
                j, i = lw, lw + lvl
                if i < 4:
                    acc = np.zeros((2, 4, 32), f32)
                    for m in range(j, i):
                        mm16_f32(acc, sA[16 * i:16 * i + 16, 16 * m:16 * m + 16], sT[16 * m:16 * m + 16, 16 * j:16 * j + 16])
                    X = np.zeros((16, 16), f32)
                    for nt in range(2):
                        X[G, 8 * nt + 2 * Q] = acc[nt, 0]; X[G, 8 * nt + 2 * Q + 1] = acc[nt, 1]
                        X[G + 8, 8 * nt + 2 * Q] = acc[nt, 2]; X[G + 8, 8 * nt + 2 * Q + 1] = acc[nt, 3]
                    r = np.zeros((2, 4, 32), f32)
                    mm16_f32(r, sT[16 * i:16 * i + 16, 16 * i:16 * i + 16], X)
                    for nt in range(2):
                        sT[16 * i + G, 16 * j + 8 * nt + 2 * Q] = -r[nt, 0]; sT[16 * i + G, 16 * j + 8 * nt + 2 * Q + 1] = -r[nt, 1]
                        sT[16 * i + G + 8, 16 * j + 8 * nt + 2 * Q] = -r[nt, 2]; sT[16 * i + G + 8, 16 * j + 8 * nt + 2 * Q + 1] = -r[nt, 3]
        for lt in range(128):
            for it in range(4):
                idx = lt + 128 * it; t = idx >> 3; ch = idx & 7; s0 = ch * 8
                off = t * 128 + ((ch ^ (t & 7)) << 4)
                for e in range(4):
                    s_ = s0 + 2 * e
                    y0 = sT[t, s_] * vec[BETA, s_] if s_ <= t else 0
                    y1 = sT[t, s_ + 1] * vec[BETA, s_ + 1] if s_ + 1 <= t else 0
                    hi, lo = split2(y0, y1)
                    for (base, u) in [(kOTh, hi), (kOTl, lo)]:
                        sm.put16(base + off + 4 * e, int(u & 0xFFFF)); sm.put16(base + off + 4 * e + 2, int(u >> 16))
        # ---- state warps
        for sw in range(4):
            ss_ = s[sw]
            x = np.zeros((8, 4, 32), f32); o = np.zeros((8, 4, 32), f32)
            for kb in range(8):
                ah = [None] * 4; al = [None] * 4
                ah[0], al[0] = split2(ss_[2 * kb, 0], ss_[2 * kb, 1]); ah[1], al[1] = split2(ss_[2 * kb, 2], ss_[2 * kb, 3])
                ah[2], al[2] = split2(ss_[2 * kb + 1, 0], ss_[2 * kb + 1, 1]); ah[3], al[3] = split2(ss_[2 * kb + 1, 2], ss_[2 * kb + 1, 3])
                for np_ in range(4):
                    b = sm.ldsm4(a_b_nk(kOK, 16 * np_, 16 * kb, 256))
                    x[2 * np_] = mma(x[2 * np_], ah, b[0], b[1]); x[2 * np_ + 1] = mma(x[2 * np_ + 1], ah, b[2], b[3])
                    x[2 * np_] = mma(x[2 * np_], al, b[0], b[1]); x[2 * np_ + 1] = mma(x[2 * np_ + 1], al, b[2], b[3])
                    b = sm.ldsm4(a_b_nk(kOQ, 16 * np_, 16 * kb, 256))
                    o[2 * np_] = mma(o[2 * np_], ah, b[0], b[1]); o[2 * np_ + 1] = mma(o[2 * np_ + 1], ah, b[2], b[3])
            for kb in range(4):
                vr = sm.ldsm4(a_a_km(kOV, 16 * kb, 16 * sw, 128), trans=True)
                for hh in range(2):
                    nt = 2 * kb + hh
                    xs0 = vec[XSC, 8 * nt + 2 * Q]; xs1 = vec[XSC, 8 * nt + 2 * Q + 1]
                    v0x, v0y = unpack(vr[2 * hh]); v1x, v1y = unpack(vr[2 * hh + 1])
                    x[nt, 0] = v0x - x[nt, 0] * xs0; x[nt, 1] = v0y - x[nt, 1] * xs1
                    x[nt, 2] = v1x - x[nt, 2] * xs0; x[nt, 3] = v1y - x[nt, 3] * xs1
            vn = np.zeros((8, 4, 32), f32)
            for kb in range(4):
                eh = [None] * 4; el = [None] * 4
                eh[0], el[0] = split2(x[2 * kb, 0], x[2 * kb, 1]); eh[1], el[1] = split2(x[2 * kb, 2], x[2 * kb, 3])
                eh[2], el[2] = split2(x[2 * kb + 1, 0], x[2 * kb + 1, 1]); eh[3], el[3] = split2(x[2 * kb + 1, 2], x[2 * kb + 1, 3])
                for np_ in range(4):
                    if kb <= np_:
                        th = sm.ldsm4(a_b_nk(kOTh, 16 * np_, 16 * kb, 128)); tl = sm.ldsm4(a_b_nk(kOTl, 16 * np_, 16 * kb, 128))
                        for (aa, bb) in [(eh, th), (eh, tl), (el, th)]:
                            vn[2 * np_] = mma(vn[2 * np_], aa, bb[0], bb[1]); vn[2 * np_ + 1] = mma(vn[2 * np_ + 1], aa, bb[2], bb[3])
            for nt in range(8):
                q0 = vec[QSC, 8 * nt + 2 * Q]; q1 = vec[QSC, 8 * nt + 2 * Q + 1]
                o[nt, 0] *= q0; o[nt, 1] *= q1; o[nt, 2] *= q0; o[nt, 3] *= q1
            for kb in range(4):
                a = [pack(vn[2 * kb, 0], vn[2 * kb, 1]), pack(vn[2 * kb, 2], vn[2 * kb, 3]),
                     pack(vn[2 * kb + 1, 0], vn[2 * kb + 1, 1]), pack(vn[2 * kb + 1, 2], vn[2 * kb + 1, 3])]
                for np_ in range(4):
                    if kb <= np_:
                        b = sm.ldsm4(a_b_nk(kOP, 16 * np_, 16 * kb, 128))
                        o[2 * np_] = mma(o[2 * np_], a, b[0], b[1]); o[2 * np_ + 1] = mma(o[2 * np_ + 1], a, b[2], b[3])
            so = np.zeros((64, 16), f32)
            for nt in range(8):
                t = 8 * nt + 2 * Q
                so[t, G] = bits_f(bf16_bits(o[nt, 0])); so[t + 1, G] = bits_f(bf16_bits(o[nt, 1]))
                so[t, G + 8] = bits_f(bf16_bits(o[nt, 2])); so[t + 1, G + 8] = bits_f(bf16_bits(o[nt, 3]))
            out[t0:t0 + n, 16 * sw:16 * sw + 16] = so[:n]
            gl = vec[MISC, 0]
            ss_ *= gl
            for kb in range(4):
                wh = [None] * 4; wl = [None] * 4
                for hh in range(2):
                    nt = 2 * kb + hh
                    kd0 = vec[KDEC, 8 * nt + 2 * Q]; kd1 = vec[KDEC, 8 * nt + 2 * Q + 1]
                    wh[2 * hh], wl[2 * hh] = split2(vn[nt, 0] * kd0, vn[nt, 1] * kd1)
                    wh[2 * hh + 1], wl[2 * hh + 1] = split2(vn[nt, 2] * kd0, vn[nt, 3] * kd1)
                for np_ in range(8):
                    b = sm.ldsm4(a_b_kn(kOK, 16 * kb, 16 * np_, 256), trans=True)
                    for aa in (wh, wl):
                        ss_[2 * np_] = mma(ss_[2 * np_], aa, b[0], b[1]); ss_[2 * np_ + 1] = mma(ss_[2 * np_ + 1], aa, b[2], b[3])
            s[sw] = ss_
    S = np.zeros((128, 64), f32)
    for sw in range(4):
        for nt in range(16):
            for i in range(4):
                S[8 * nt + 2 * Q + (i & 1), 16 * sw + G + 8 * (i >> 1)] = s[sw, nt, i]
    return out, S

def main():
    rng = np.random.default_rng(1)
    for T, gmode in [(100, 'norm'), (64, 'edge')]:
        K, V = 128, 128
        q = plan.bf(rng.standard_normal((T, K)).astype(f32)).astype(f32)
        k = plan.bf(rng.standard_normal((T, K)).astype(f32)).astype(f32)
        v = plan.bf(rng.standard_normal((T, V)).astype(f32)).astype(f32)
        g = -np.abs(rng.standard_normal(T) * 0.3).astype(f32)
        if gmode == 'edge':
            g[[3, 40]] = -np.inf; g[17] = -100.0
        beta = (1 / (1 + np.exp(-rng.standard_normal(T)))).astype(f32)
        S0 = (rng.standard_normal((K, V)) * 0.5).astype(f32)
        scale = K ** -0.5
        ro, rS = plan.recurrence(q, k, v, np.maximum(g, -1e30), beta, S0, scale)
        for col0 in (0, 64):
            fo, fS = run_cta(q, k, v, g, beta, S0, scale, col0)
            eo = np.linalg.norm(fo - ro[:, col0:col0 + 64]) / np.linalg.norm(ro[:, col0:col0 + 64])
            es = np.linalg.norm(fS - rS[:, col0:col0 + 64]) / np.linalg.norm(rS[:, col0:col0 + 64])
            print(f"T={T} g={gmode} col0={col0}: out {eo:.2e} state {es:.2e}", flush=True)

if __name__ == '__main__':
    main()
