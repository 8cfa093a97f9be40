"""gdr.chunk_prefill: chunkwise (chunk 64, WY / UT form) gated delta rule prefill over a varlen batch.

Mirrors HF `torch_chunk_gated_delta_rule` / FLA `chunk_gated_delta_rule` (cu_seqlens mode: chunks
restart at every sequence start), with Qwen3.5's in-kernel q/k L2 norm and fused gating. The CPU
twin is `deltakit_ref::gdr::chunk_prefill`; the oracle is the token recurrence
`S *= exp(g); delta = beta (v - S^T k); S += k (x) delta; o = S^T q` (per value head, f32 S [K, V]).

Shapes (T packed tokens, N sequences, BT = 64 tokens per chunk):
  q, k      bf16 [T, HK, K]          v, out   bf16 [T, HV, V]   (value head hv reads key head hv / (HV / HK))
            (q, k, v, a, b may be token-strided views: sq, sk, sv, sab elements between tokens; out is contiguous)
  g, beta   f32  [T, HV]  (precomputed gating, g <= 0)   or   a, b bf16 [T, HV] + A_log, dt_bias f32 [HV]
  cu_seqlens i32 [N + 1]   slots i32 [N]   init i32 [N] (used only when init_mode == 2)
  state     f32  [num_slots, HV, K, V] (V contiguous)

Workspace (caller-provided, see the Rust wrapper for the byte layout), NT = T // BT + N chunks at most:
  coff  i32 [N + 1]   first chunk id of each sequence (clamped, so it never exceeds NT)
  cseq  i32 [NT]      sequence of each chunk id (-1 = no chunk)
  gcum  f32 [T, HV]   chunk-local cumulative log-decay;  beta f32 [T, HV]
  A     f32 [T, HV, 64]  per chunk row t: A[t, s] (kkt pass), then Tm[t, s] (solve pass)
  w     f32 [T, HV, K]  W = Tm (beta e^gcum k);  u f32 [T, HV, V]: U = Tm (beta v), overwritten with
                        D = U - W S0 (the per-token corrections) by the state pass
  h     bf16 [NT, HV, K, V]  the state at the start of each chunk (for the output pass)

Kernels, in launch order (all offsets int64; bad cu_seqlens / slots never index out of bounds:
cu_seqlens are clamped to [0, T], slots outside [0, num_slots) behave like -1 = padding):
  1. gdr_chunk_offsets_kernel  grid (1,):               coff from cu_seqlens (chunks per sequence)
  2. gdr_chunk_map_kernel      grid (cdiv(NT, 128),):   cseq by a vectorized binary search over coff
  3. gdr_chunk_kkt_kernel      grid (NT, HV):           gating -> gcum, beta; A = beta K K^T decay (strictly
        lower) -> A [T, HV, 64] f32
  4. gdr_chunk_solve_kernel    grid (NT, HV):           A <- Tm = (I + A)^-1 in place: 16x16 diagonal blocks by
        forward substitution, then the block merge (FLA's solve_tril idea, written here from the algebra)
  5. gdr_chunk_wu_kernel       grid (NT, HV):           W = Tm (beta e^gcum k), U = Tm (beta v)
  6. gdr_chunk_state_kernel    grid (N, HV, cdiv(V, BV)): sequential over a sequence's chunks: stores h,
        D = U - W S, S = e^{g_last} S + K^T (e^{g_last - gcum} D); reads / writes the state slot
  7. gdr_chunk_out_kernel      grid (NT, HV, cdiv(V, BVO)): o = e^gcum (Q S0) + (Q K^T * decay, causal) D
Variants (issue 15 round 2): WSPLIT = 1 in the wu + state kernels stores W as bf16 hi / lo planes, bf16
[T, HV, 2, K] in the same bytes, and feeds them to the state pass's tensor cores from shared memory (the same
three bf16 products as _mm_ff; opt-in in the library, DELTAKIT_GDR_PREFILL=wsplit). gdr_chunk_kkt_solve_kernel
fuses launches 3 and 4 (not in the manifest: 3x slower than kkt + solve on an H200, 595 vs 199 us at 27B TP1 in
either form; kept for the harness, tools/bench_anchors_gdr.py --prefill-variants).
Tiles: BK (key tile, = K for the tuned K in {64, 128}, 64 for K = 32) and BV (value tile) may be wider than
the head dim; padding rows / columns are loaded as 0 (so every product and L2 norm is unchanged) and never
stored; the masking is a constexpr branch taken only when D % tile != 0 (every tuned entry compiles without
it). BK >= K always; BV >= V or V % BV == 0 (static_assert in each kernel). The small dims thus run the
tuned kernels' tile shapes (a first build with BV = 16 / K = 32 tiles read past its shared memory on an H200).
Only non-positive exponents are exponentiated (differences of cumulative log-decays, masked), through _dexp:
gates are clamped at -G_FLOOR (g = -inf / NaN = full decay) and factors at or below e^-(G_FLOOR-1) flush to 0.
Products: raw bf16 q / k / v enter the tensor cores exactly (the L2-norm factors and beta / decays are
applied on the f32 side); f32 operands (Tm, W, S, D) are split into bf16 hi + lo (PREC 4), ~2^-16 relative.
The H200 tests see final-state errors ~4e-6 (4e-5 with g = -100) and bf16 outputs ~2.5e-3.
"""
import os

import triton
import triton.language as tl

BT = 64  # chunk size (tokens)
# Full-decay floor: every gate is clamped to g >= -G_FLOOR (g = -inf, from exp(A_log) overflowing, and a NaN g,
# from -inf * 0 when softplus also underflows, both become -G_FLOOR), and every decay factor exp(x) with
# x <= -(G_FLOOR - 1) is flushed to exactly 0 (_dexp). So a token with g <= -G_FLOOR zeroes every term that spans
# it, as exp(-inf) = 0 does in the recurrence, and the chunk-local cumulative sums stay finite (>= -64 * G_FLOOR,
# no inf - inf). The flush changes an ordinary decay only below e^-63 ~ 4e-28 (relative to the terms it scales).
# Rounding: cumulative log-decays are f32, so a pair's exponent carries an absolute error of ~ulp(|gcum|):
# <= 4.9e-4 after 64 clamped tokens in one chunk, ~1e-5 after one (the -100 gates of the tests already do that).
G_FLOOR = tl.constexpr(64.0)
MAP_BLOCK = 128  # chunk ids per program of gdr_chunk_map_kernel
OFFSETS_BLOCK = 1024  # sequences per loop step of gdr_chunk_offsets_kernel


@triton.jit
def _mm(a, b, PREC: tl.constexpr):
    """a @ b (f32 operands) with f32 accumulation. PREC: 0 tf32, 1 tf32x3 (~f32), 2 ieee fp32, 3 bf16
    operands (one rounding each), 4 = 1 here (the _mm_* helpers implement 4 as bf16 hi/lo splits)."""
    if PREC == 0:
        r = tl.dot(a, b, input_precision="tf32")
    elif PREC == 1 or PREC == 4:
        r = tl.dot(a, b, input_precision="tf32x3")
    elif PREC == 2:
        r = tl.dot(a, b, input_precision="ieee")
    else:
        r = _dot_bb(a.to(tl.bfloat16), b.to(tl.bfloat16))
    return r


# The Triton interpreter (TRITON_INTERPRET=1, used by tools/dev_chunk_check.py --cpu) has no bf16 matmul:
# there bf16 operands are widened to f32 first (exact), which computes the same products.
_INTERP = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")


@triton.jit
def _dot_bb(a, b):
    """bf16 @ bf16 with f32 accumulation (products exact)."""
    if _INTERP:
        r = tl.dot(a.to(tl.float32), b.to(tl.float32))
    else:
        r = tl.dot(a, b)
    return r


@triton.jit
def _split(x):
    """f32 -> (hi, lo) bf16 with hi + lo = x to ~2^-17 relative."""
    hi = x.to(tl.bfloat16)
    lo = (x - hi.to(tl.float32)).to(tl.bfloat16)
    return hi, lo


@triton.jit
def _mm_ff(a, b, PREC: tl.constexpr):
    """f32 @ f32. PREC 4: three bf16 passes (hi.hi + hi.lo + lo.hi, ~2^-16); else _mm's precision."""
    if PREC == 4:
        ah, al = _split(a)
        bh, bl = _split(b)
        r = _dot_bb(ah, bh) + (_dot_bb(ah, bl) + _dot_bb(al, bh))
    else:
        r = _mm(a, b, PREC)
    return r


@triton.jit
def _mm_fb(a, b, PREC: tl.constexpr):
    """f32 a @ bf16 b (b exact). PREC 4: two bf16 passes over a's hi / lo parts."""
    if PREC == 4:
        ah, al = _split(a)
        r = _dot_bb(ah, b) + _dot_bb(al, b)
    else:
        r = _mm(a, b.to(tl.float32), PREC)
    return r


@triton.jit
def _mm_bf(a, b, PREC: tl.constexpr):
    """bf16 a (exact) @ f32 b. PREC 4: two bf16 passes over b's hi / lo parts."""
    if PREC == 4:
        bh, bl = _split(b)
        r = _dot_bb(a, bh) + _dot_bb(a, bl)
    else:
        r = _mm(a.to(tl.float32), b, PREC)
    return r


@triton.jit
def _load_raw(ptr, rows, m, head, stride, D: tl.constexpr, BD: tl.constexpr, use_l2):
    """Rows `rows` of head `head` of a bf16 [T, H, D] tensor (token stride `stride`) as they are (bf16
    [len(rows), BD], masked rows and the padding columns D..BD are 0) plus the per-row L2-norm factor
    rsqrt(sum x^2 + 1e-6) (1 when use_l2 == 0): the normalised rows are x * rn[:, None], applied to the f32
    side of each product so that the bf16 values enter the tensor cores exactly."""
    cols = tl.arange(0, BD)
    off = (rows * stride + head * D)[:, None] + cols[None, :]
    x = _ld(ptr, off, m, cols, D, BD)
    xf = x.to(tl.float32)
    rn = tl.rsqrt(tl.sum(xf * xf, axis=1) + 1e-6)
    rn = tl.where(use_l2 != 0, rn, 1.0)
    return x, rn


@triton.jit
def _ld(ptr, off, m, cols, D: tl.constexpr, BD: tl.constexpr):
    """Load a [rows, BD] tile at ptr + off (f32 / bf16), 0 where the row mask m is off. Columns `cols` of a
    padded tile (D % BD != 0: the small head dims, whose tile is wider than D) are masked to cols < D; the
    unpadded (tuned) specializations compile to the plain row-masked load."""
    if D % BD == 0:
        x = tl.load(ptr + off, mask=m[:, None], other=0.0)
    else:
        x = tl.load(ptr + off, mask=m[:, None] & (cols[None, :] < D), other=0.0)
    return x


@triton.jit
def _st(ptr, off, x, m, cols, D: tl.constexpr, BD: tl.constexpr):
    """Store the [rows, BD] tile x at ptr + off where the row mask m is on (and cols < D when padded)."""
    if D % BD == 0:
        tl.store(ptr + off, x, mask=m[:, None])
    else:
        tl.store(ptr + off, x, mask=m[:, None] & (cols[None, :] < D))


@triton.jit
def _kv_tile_mask(rk, cv, K: tl.constexpr, BK: tl.constexpr, V: tl.constexpr, BV: tl.constexpr):
    """In-range mask of a padded [BK, BV] tile of a [K, V] state (only called when one side is padded)."""
    return (rk < K)[:, None] & (cv < V)[None, :]


@triton.jit
def _seq_bounds(cu_ptr, seq, T):
    """Clamped [bos, eos) of sequence `seq` (int64): 0 <= bos <= eos <= T."""
    bos = tl.load(cu_ptr + seq).to(tl.int64)
    eos = tl.load(cu_ptr + seq + 1).to(tl.int64)
    bos = tl.minimum(tl.maximum(bos, 0), T)
    eos = tl.minimum(tl.maximum(eos, bos), T)
    return bos, eos


@triton.jit
def _gating(g_ptr, beta_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, rows, m, hv, HV, sab, fused):
    """(g, beta) f32 for `rows` of value head hv; 0 on masked rows. g/beta are [T, HV]; a/b have
    token stride `sab`."""
    off = rows * HV + hv
    if fused != 0:
        ab_off = rows * sab + hv
        a = tl.load(a_ptr + ab_off, mask=m, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + ab_off, mask=m, other=0.0).to(tl.float32)
        x = a + tl.load(dtb_ptr + hv)
        # softplus with torch's threshold 20; exp argument clamped so it never overflows.
        e = tl.exp(tl.minimum(x, 20.0))
        one_e = 1.0 + e
        # log1p(e) without libdevice: log(1 + e) * e / ((1 + e) - 1) is accurate to a few ulp.
        lp = tl.where(one_e == 1.0, e, tl.log(one_e) * (e / tl.where(one_e == 1.0, 1.0, one_e - 1.0)))
        sp = tl.where(x > 20.0, x, lp)
        g = -tl.exp(tl.load(alog_ptr + hv)) * sp
        beta = 1.0 / (1.0 + tl.exp(-b))
    else:
        g = tl.load(g_ptr + off, mask=m, other=0.0)
        beta = tl.load(beta_ptr + off, mask=m, other=0.0)
    # Full decay: g = -inf (exp(A_log) overflow) and NaN (-inf * 0) clamp to -G_FLOOR (see _dexp).
    g = tl.where(g > -G_FLOOR, g, -G_FLOOR)
    g = tl.where(m, g, 0.0)
    beta = tl.where(m, beta, 0.0)
    return g, beta


@triton.jit
def _dexp(x):
    """exp(x) for a decay exponent x <= 0 (a difference of cumulative log-decays), flushed to exactly 0 at or below
    -(G_FLOOR - 1) (so a clamped full-decay gate in between gives 0) and for NaN."""
    return tl.where(x > 1.0 - G_FLOOR, tl.exp(x), 0.0)


@triton.jit
def _inv_unit_lower16(A):
    """(I + A)^-1 for a strictly lower-triangular f32 [16, 16] A, by forward substitution:
    row i of the inverse is e_i - sum_m A[i, m] * row m."""
    r = tl.arange(0, 16)
    inv = (r[:, None] == r[None, :]).to(tl.float32)
    for i in tl.static_range(1, 16):
        a_i = tl.sum(tl.where(r[:, None] == i, A, 0.0), axis=0)  # A[i, :] indexed by m
        t = tl.sum(a_i[:, None] * inv, axis=0)  # sum_m A[i, m] inv[m, :]
        inv = tl.where(r[:, None] == i, inv - t[None, :], inv)
    return inv


@triton.jit
def gdr_chunk_offsets_kernel(cu_ptr, coff_ptr, num_seqs, T, nt_max, BLOCK: tl.constexpr):
    """coff[i] = first chunk id of sequence i (coff[N] = total chunks), clamped to nt_max."""
    carry = tl.full([], 0, tl.int64)
    idx = tl.arange(0, BLOCK)
    for b0 in range(0, num_seqs, BLOCK):
        i = b0 + idx
        m = i < num_seqs
        bos = tl.load(cu_ptr + i, mask=m, other=0).to(tl.int64)
        eos = tl.load(cu_ptr + i + 1, mask=m, other=0).to(tl.int64)
        bos = tl.minimum(tl.maximum(bos, 0), T)
        eos = tl.minimum(tl.maximum(eos, bos), T)
        nc = tl.where(m, (eos - bos + 63) // 64, 0)
        cs = tl.cumsum(nc, axis=0) + carry
        tl.store(coff_ptr + 1 + i, tl.minimum(cs, nt_max).to(tl.int32), mask=m)
        carry += tl.sum(nc, axis=0)
    tl.store(coff_ptr, 0)


@triton.jit
def gdr_chunk_map_kernel(coff_ptr, cseq_ptr, num_seqs, nt_max, search_iters, BLOCK: tl.constexpr):
    """cseq[p] = the sequence i with coff[i] <= p < coff[i + 1], or -1 past the last chunk."""
    p = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = p < nt_max
    total = tl.load(coff_ptr + num_seqs).to(tl.int64)
    lo = tl.zeros([BLOCK], tl.int64)
    hi = tl.zeros([BLOCK], tl.int64) + num_seqs
    for _ in range(search_iters):
        open_ = (hi - lo) > 1
        mid = (lo + hi) // 2
        at_mid = tl.load(coff_ptr + mid, mask=m & open_, other=0).to(tl.int64)
        go = at_mid <= p
        lo = tl.where(open_ & go, mid, lo)
        hi = tl.where(open_ & (~go), mid, hi)
    seq = tl.where(p < total, lo, -1)
    tl.store(cseq_ptr + p, seq.to(tl.int32), mask=m)


@triton.jit
def _chunk_of(p, cseq_ptr, cu_ptr, coff_ptr, slots_ptr, T, num_slots):
    """(seq, live, t0, eos) of chunk id p: seq -1 = no chunk; live = the slot is in range."""
    seq = tl.load(cseq_ptr + p)
    seq_c = tl.maximum(seq, 0)
    slot = tl.load(slots_ptr + seq_c)
    live = (slot >= 0) & (slot < num_slots)
    bos, eos = _seq_bounds(cu_ptr, seq_c, T)
    j = p - tl.load(coff_ptr + seq_c).to(tl.int64)
    t0 = bos + j * 64
    return seq, live, t0, eos


@triton.jit
def gdr_chunk_kkt_kernel(k_ptr, g_ptr, beta_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, cu_ptr, slots_ptr, coff_ptr, cseq_ptr,
                         gcum_ptr, betaw_ptr, A_ptr, T, num_slots, HK, HV, sk, sab, use_l2, fused,
                         K: tl.constexpr, BK: tl.constexpr):
    """Per (chunk, value head): gating, gcum, beta, and A = beta_t (k_t . k_s) e^{gc_t - gc_s} for s < t
    (0 elsewhere), stored f32 [T, HV, 64] (row t, column s of the chunk). BK: key tile width (K, or 64 for
    K = 32: the padding columns load as 0)."""
    p = tl.program_id(0).to(tl.int64)
    hv = tl.program_id(1)
    tl.static_assert(BK >= K)
    seq, live, t0, eos = _chunk_of(p, cseq_ptr, cu_ptr, coff_ptr, slots_ptr, T, num_slots)
    if (seq >= 0) & live:
        hk = hv // (HV // HK)
        r = tl.arange(0, 64)
        rows = t0 + r.to(tl.int64)
        m = rows < eos
        g, beta = _gating(g_ptr, beta_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, rows, m, hv, HV, sab, fused)
        gc = tl.cumsum(g, axis=0)  # masked rows carry g = 0
        tl.store(gcum_ptr + rows * HV + hv, gc, mask=m)
        tl.store(betaw_ptr + rows * HV + hv, beta, mask=m)
        kk, rn = _load_raw(k_ptr, rows, m, hk, sk, K, BK, use_l2)
        att = _dot_bb(kk, tl.trans(kk)) * (beta * rn)[:, None] * rn[None, :]
        low = r[:, None] > r[None, :]
        att = tl.where(low, att * _dexp(tl.where(low, gc[:, None] - gc[None, :], 0.0)), 0.0)
        tl.store(A_ptr + (rows * HV + hv)[:, None] * 64 + r[None, :], att, mask=m[:, None])


@triton.jit
def _ld16(A_ptr, t0, eos, hv, HV, bi: tl.constexpr, bj: tl.constexpr):
    """Block (bi, bj) (16 x 16) of a chunk's [64, 64] matrix stored as [T, HV, 64]; rows past eos are 0."""
    r = tl.arange(0, 16)
    rows = t0 + bi * 16 + r.to(tl.int64)
    return tl.load(A_ptr + (rows * HV + hv)[:, None] * 64 + (bj * 16 + r)[None, :], mask=(rows < eos)[:, None],
                   other=0.0)


@triton.jit
def _st16(A_ptr, x, t0, eos, hv, HV, bi: tl.constexpr, bj: tl.constexpr):
    r = tl.arange(0, 16)
    rows = t0 + bi * 16 + r.to(tl.int64)
    tl.store(A_ptr + (rows * HV + hv)[:, None] * 64 + (bj * 16 + r)[None, :], x, mask=(rows < eos)[:, None])


@triton.jit
def gdr_chunk_solve_kernel(A_ptr, cu_ptr, slots_ptr, coff_ptr, cseq_ptr, T, num_slots, HV, PREC: tl.constexpr):
    """Per (chunk, value head): overwrites A with Tm = (I + A)^-1 (lower triangular, same layout): 16 x 16
    diagonal blocks by forward substitution, then Tm_ij = -D_i sum_{j <= m < i} A_im Tm_mj. Blocks above
    the diagonal are left as they are (the reader masks them)."""
    p = tl.program_id(0).to(tl.int64)
    hv = tl.program_id(1)
    seq, live, t0, eos = _chunk_of(p, cseq_ptr, cu_ptr, coff_ptr, slots_ptr, T, num_slots)
    if (seq >= 0) & live:
        _solve_blocks(A_ptr, t0, eos, hv, HV, PREC)


@triton.jit
def _solve_blocks(A_ptr, t0, eos, hv, HV, PREC: tl.constexpr):
    """A <- Tm = (I + A)^-1 in place for the chunk at t0 (see gdr_chunk_solve_kernel)."""
    d0 = _inv_unit_lower16(_ld16(A_ptr, t0, eos, hv, HV, 0, 0))
    d1 = _inv_unit_lower16(_ld16(A_ptr, t0, eos, hv, HV, 1, 1))
    d2 = _inv_unit_lower16(_ld16(A_ptr, t0, eos, hv, HV, 2, 2))
    d3 = _inv_unit_lower16(_ld16(A_ptr, t0, eos, hv, HV, 3, 3))
    a10 = _ld16(A_ptr, t0, eos, hv, HV, 1, 0)
    a20 = _ld16(A_ptr, t0, eos, hv, HV, 2, 0)
    a21 = _ld16(A_ptr, t0, eos, hv, HV, 2, 1)
    a30 = _ld16(A_ptr, t0, eos, hv, HV, 3, 0)
    a31 = _ld16(A_ptr, t0, eos, hv, HV, 3, 1)
    a32 = _ld16(A_ptr, t0, eos, hv, HV, 3, 2)
    t10 = -_mm(d1, _mm(a10, d0, PREC), PREC)
    t21 = -_mm(d2, _mm(a21, d1, PREC), PREC)
    t20 = -_mm(d2, _mm(a20, d0, PREC) + _mm(a21, t10, PREC), PREC)
    t32 = -_mm(d3, _mm(a32, d2, PREC), PREC)
    t31 = -_mm(d3, _mm(a31, d1, PREC) + _mm(a32, t21, PREC), PREC)
    t30 = -_mm(d3, _mm(a30, d0, PREC) + _mm(a31, t10, PREC) + _mm(a32, t20, PREC), PREC)
    _st16(A_ptr, d0, t0, eos, hv, HV, 0, 0)
    _st16(A_ptr, d1, t0, eos, hv, HV, 1, 1)
    _st16(A_ptr, d2, t0, eos, hv, HV, 2, 2)
    _st16(A_ptr, d3, t0, eos, hv, HV, 3, 3)
    _st16(A_ptr, t10, t0, eos, hv, HV, 1, 0)
    _st16(A_ptr, t20, t0, eos, hv, HV, 2, 0)
    _st16(A_ptr, t21, t0, eos, hv, HV, 2, 1)
    _st16(A_ptr, t30, t0, eos, hv, HV, 3, 0)
    _st16(A_ptr, t31, t0, eos, hv, HV, 3, 1)
    _st16(A_ptr, t32, t0, eos, hv, HV, 3, 2)


@triton.jit
def _kblk(k_ptr, t0, eos, hk, sk, use_l2, K: tl.constexpr, BK: tl.constexpr, b: tl.constexpr):
    """Rows 16 b .. 16 b + 15 of a chunk's keys: raw bf16 [16, BK] and their L2-norm factors (see _load_raw)."""
    rows = t0 + b * 16 + tl.arange(0, 16).to(tl.int64)
    return _load_raw(k_ptr, rows, rows < eos, hk, sk, K, BK, use_l2)


@triton.jit
def _gblk(g_ptr, beta_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, gcum_ptr, betaw_ptr, t0, eos, hv, HV, sab, fused, carry,
          b: tl.constexpr):
    """Gating of rows 16 b .. 16 b + 15 of a chunk: (chunk-local cumulative log-decay, beta), both stored, and
    the carry (sum of the chunk's gates so far) for the next block."""
    rows = t0 + b * 16 + tl.arange(0, 16).to(tl.int64)
    m = rows < eos
    g, beta = _gating(g_ptr, beta_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, rows, m, hv, HV, sab, fused)
    gc = tl.cumsum(g, axis=0) + carry  # masked rows carry g = 0
    tl.store(gcum_ptr + rows * HV + hv, gc, mask=m)
    tl.store(betaw_ptr + rows * HV + hv, beta, mask=m)
    return gc, beta, carry + tl.sum(g, axis=0)


@triton.jit
def _ablk(ki, rni, bei, gci, kj, rnj, gcj, DIAG: tl.constexpr):
    """Block (i, j) of A = beta_t (k_t . k_s) e^{gc_t - gc_s} (s < t): strictly lower on the diagonal."""
    att = _dot_bb(ki, tl.trans(kj)) * (bei * rni)[:, None] * rnj[None, :]
    if DIAG:
        r = tl.arange(0, 16)
        low = r[:, None] > r[None, :]
        att = tl.where(low, att * _dexp(tl.where(low, gci[:, None] - gcj[None, :], 0.0)), 0.0)
    else:
        att = att * _dexp(gci[:, None] - gcj[None, :])  # every s < t here: the exponent is <= 0
    return att


@triton.jit
def gdr_chunk_kkt_solve_kernel(k_ptr, g_ptr, beta_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, cu_ptr, slots_ptr, coff_ptr,
                               cseq_ptr, gcum_ptr, betaw_ptr, A_ptr, T, num_slots, HK, HV, sk, sab, use_l2, fused,
                               K: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr, STAGED: tl.constexpr = 0):
    """gdr_chunk_kkt_kernel + gdr_chunk_solve_kernel in one launch (per chunk and value head): gating -> gcum,
    beta; A, then Tm = (I + A)^-1 by the same block forward substitution / merge as the solve kernel, stored f32
    [T, HV, 64] (blocks above the diagonal are not rewritten: gdr_chunk_wu_kernel masks them). One launch
    fewer and no second pass over A. STAGED = 0: the ten 16 x 16 blocks of A on or below the diagonal straight
    from 16-row key tiles (A never stored; one warp); STAGED = 1: A as one 64 x 64 tensor-core product, stored
    as gdr_chunk_kkt_kernel does, then (after a CTA barrier) read back by 16 x 16 blocks from L1 / L2 and
    inverted in place (several warps)."""
    p = tl.program_id(0).to(tl.int64)
    hv = tl.program_id(1)
    tl.static_assert(BK >= K)
    seq, live, t0, eos = _chunk_of(p, cseq_ptr, cu_ptr, coff_ptr, slots_ptr, T, num_slots)
    if STAGED:
        if (seq >= 0) & live:
            hk = hv // (HV // HK)
            r = tl.arange(0, 64)
            rows = t0 + r.to(tl.int64)
            m = rows < eos
            g, beta = _gating(g_ptr, beta_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, rows, m, hv, HV, sab, fused)
            gc = tl.cumsum(g, axis=0)  # masked rows carry g = 0
            tl.store(gcum_ptr + rows * HV + hv, gc, mask=m)
            tl.store(betaw_ptr + rows * HV + hv, beta, mask=m)
            kk, rn = _load_raw(k_ptr, rows, m, hk, sk, K, BK, use_l2)
            att = _dot_bb(kk, tl.trans(kk)) * (beta * rn)[:, None] * rn[None, :]
            low = r[:, None] > r[None, :]
            att = tl.where(low, att * _dexp(tl.where(low, gc[:, None] - gc[None, :], 0.0)), 0.0)
            tl.store(A_ptr + (rows * HV + hv)[:, None] * 64 + r[None, :], att, mask=m[:, None])
            tl.debug_barrier()  # the block reads below cross threads: A must be complete
            _solve_blocks(A_ptr, t0, eos, hv, HV, PREC)
    elif (seq >= 0) & live:
        hk = hv // (HV // HK)
        c = tl.zeros([], tl.float32)
        gc0, be0, c = _gblk(g_ptr, beta_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, gcum_ptr, betaw_ptr, t0, eos, hv, HV,
                            sab, fused, c, 0)
        gc1, be1, c = _gblk(g_ptr, beta_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, gcum_ptr, betaw_ptr, t0, eos, hv, HV,
                            sab, fused, c, 1)
        gc2, be2, c = _gblk(g_ptr, beta_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, gcum_ptr, betaw_ptr, t0, eos, hv, HV,
                            sab, fused, c, 2)
        gc3, be3, c = _gblk(g_ptr, beta_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, gcum_ptr, betaw_ptr, t0, eos, hv, HV,
                            sab, fused, c, 3)
        k0, r0 = _kblk(k_ptr, t0, eos, hk, sk, use_l2, K, BK, 0)
        k1, r1 = _kblk(k_ptr, t0, eos, hk, sk, use_l2, K, BK, 1)
        d0 = _inv_unit_lower16(_ablk(k0, r0, be0, gc0, k0, r0, gc0, True))
        d1 = _inv_unit_lower16(_ablk(k1, r1, be1, gc1, k1, r1, gc1, True))
        t10 = -_mm(d1, _mm(_ablk(k1, r1, be1, gc1, k0, r0, gc0, False), d0, PREC), PREC)
        k2, r2 = _kblk(k_ptr, t0, eos, hk, sk, use_l2, K, BK, 2)
        d2 = _inv_unit_lower16(_ablk(k2, r2, be2, gc2, k2, r2, gc2, True))
        a21 = _ablk(k2, r2, be2, gc2, k1, r1, gc1, False)
        t21 = -_mm(d2, _mm(a21, d1, PREC), PREC)
        t20 = -_mm(d2, _mm(_ablk(k2, r2, be2, gc2, k0, r0, gc0, False), d0, PREC) + _mm(a21, t10, PREC), PREC)
        k3, r3 = _kblk(k_ptr, t0, eos, hk, sk, use_l2, K, BK, 3)
        d3 = _inv_unit_lower16(_ablk(k3, r3, be3, gc3, k3, r3, gc3, True))
        a32 = _ablk(k3, r3, be3, gc3, k2, r2, gc2, False)
        a31 = _ablk(k3, r3, be3, gc3, k1, r1, gc1, False)
        a30 = _ablk(k3, r3, be3, gc3, k0, r0, gc0, False)
        t32 = -_mm(d3, _mm(a32, d2, PREC), PREC)
        t31 = -_mm(d3, _mm(a31, d1, PREC) + _mm(a32, t21, PREC), PREC)
        t30 = -_mm(d3, _mm(a30, d0, PREC) + _mm(a31, t10, PREC) + _mm(a32, t20, PREC), PREC)
        _st16(A_ptr, d0, t0, eos, hv, HV, 0, 0)
        _st16(A_ptr, d1, t0, eos, hv, HV, 1, 1)
        _st16(A_ptr, d2, t0, eos, hv, HV, 2, 2)
        _st16(A_ptr, d3, t0, eos, hv, HV, 3, 3)
        _st16(A_ptr, t10, t0, eos, hv, HV, 1, 0)
        _st16(A_ptr, t20, t0, eos, hv, HV, 2, 0)
        _st16(A_ptr, t21, t0, eos, hv, HV, 2, 1)
        _st16(A_ptr, t30, t0, eos, hv, HV, 3, 0)
        _st16(A_ptr, t31, t0, eos, hv, HV, 3, 1)
        _st16(A_ptr, t32, t0, eos, hv, HV, 3, 2)


@triton.jit
def gdr_chunk_wu_kernel(k_ptr, v_ptr, betaw_ptr, gcum_ptr, A_ptr, w_ptr, u_ptr, cu_ptr, slots_ptr, coff_ptr, cseq_ptr,
                        T, num_slots, HK, HV, sk, sv, use_l2,
                        K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
                        WSPLIT: tl.constexpr = 0, SPLITZ: tl.constexpr = 0):
    """Per (chunk, value head): W = Tm (beta e^gc k) f32 [T, HV, K] and U = Tm (beta v) f32 [T, HV, V].
    BK, BV: tile widths (K, V, or 64 for the small dims: padding columns are 0 and never stored).
    WSPLIT = 1: W is stored pre-split as bf16 hi / lo planes, bf16 [T, HV, 2, K] (hi + lo = W to ~2^-17, the
    split _mm_ff makes; same bytes as f32), so that the state pass feeds them to the tensor cores straight from
    memory (no f32 W tile and no split in its registers); w_ptr is then a bf16 pointer.
    SPLITZ = 1: grid (NT, HV, 2), program z = 0 computes W and z = 1 computes U (Tm read twice; the live set of
    one product instead of both, for more programs per SM). Not in the manifest (harness variant)."""
    tl.static_assert((BK >= K) & (BV >= V))
    p = tl.program_id(0).to(tl.int64)
    hv = tl.program_id(1)
    seq, live, t0, eos = _chunk_of(p, cseq_ptr, cu_ptr, coff_ptr, slots_ptr, T, num_slots)
    if (seq >= 0) & live:
        hk = hv // (HV // HK)
        r = tl.arange(0, 64)
        rows = t0 + r.to(tl.int64)
        m = rows < eos
        tm = tl.load(A_ptr + (rows * HV + hv)[:, None] * 64 + r[None, :],
                     mask=m[:, None] & (r[None, :] <= r[:, None]), other=0.0)
        beta = tl.load(betaw_ptr + rows * HV + hv, mask=m, other=0.0)
        gc = tl.load(gcum_ptr + rows * HV + hv, mask=m, other=0.0)
        z = tl.program_id(2) if SPLITZ else 0
        if (SPLITZ == 0) | (z == 0):
            kk, rn = _load_raw(k_ptr, rows, m, hk, sk, K, BK, use_l2)
            # Per-column factors of Tm fold the row scalings of k / v, which then enter exactly as bf16.
            ww = _mm_fb(tm * (beta * _dexp(gc) * rn)[None, :], kk, PREC)
            ck = tl.arange(0, BK)
            if WSPLIT:
                w_hi, w_lo = _split(ww)
                _st(w_ptr, (rows * HV + hv)[:, None] * (2 * K) + ck[None, :], w_hi, m, ck, K, BK)
                _st(w_ptr, (rows * HV + hv)[:, None] * (2 * K) + K + ck[None, :], w_lo, m, ck, K, BK)
            else:
                _st(w_ptr, (rows * HV + hv)[:, None] * K + ck[None, :], ww, m, ck, K, BK)
        if (SPLITZ == 0) | (z == 1):
            vv, _ = _load_raw(v_ptr, rows, m, hv, sv, V, BV, 0)
            uu = _mm_fb(tm * beta[None, :], vv, PREC)
            cv = tl.arange(0, BV)
            _st(u_ptr, (rows * HV + hv)[:, None] * V + cv[None, :], uu, m, cv, V, BV)


@triton.jit
def gdr_chunk_state_kernel(k_ptr, w_ptr, u_ptr, gcum_ptr, h_ptr, state_ptr, cu_ptr, slots_ptr, init_ptr, coff_ptr,
                           T, num_slots, HK, HV, sk, use_l2, init_mode,
                           K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                           PREC: tl.constexpr, WSPLIT: tl.constexpr = 0):
    """Per (sequence, value head, BV value columns). BK: key tile width (K, or 64 for K = 32); a tile wider
    than the state (BK > K or BV > V) keeps its padding rows / columns at 0 and never stores them.
    WSPLIT = 1: W comes as the bf16 hi / lo planes of gdr_chunk_wu_kernel (WSPLIT = 1) and W S is
    W_hi S_hi + (W_hi S_lo + W_lo S_hi), the same three bf16 products as _mm_ff at PREC 4."""
    PAD: tl.constexpr = (K % BK != 0) or (V % BV != 0)
    tl.static_assert((BK >= K) & ((BV >= V) | (V % BV == 0)))
    seq = tl.program_id(0).to(tl.int64)
    hv = tl.program_id(1)
    vb = tl.program_id(2)
    slot = tl.load(slots_ptr + seq).to(tl.int64)
    if (slot >= 0) & (slot < num_slots):
        hk = hv // (HV // HK)
        bos, eos = _seq_bounds(cu_ptr, seq, T)
        c0 = tl.load(coff_ptr + seq).to(tl.int64)
        nc = tl.load(coff_ptr + seq + 1).to(tl.int64) - c0
        rk = tl.arange(0, BK)
        cv = vb * BV + tl.arange(0, BV)
        kv = rk[:, None] * V + cv[None, :]
        s_off = (slot * HV + hv) * (K * V) + kv
        read = init_mode == 1
        if init_mode == 2:
            read = tl.load(init_ptr + seq) != 0
        if read:
            if PAD:
                S = tl.load(state_ptr + s_off, mask=_kv_tile_mask(rk, cv, K, BK, V, BV), other=0.0)
            else:
                S = tl.load(state_ptr + s_off)
        else:
            S = tl.zeros([BK, BV], tl.float32)
        r64 = tl.arange(0, 64).to(tl.int64)
        for j in range(0, nc):
            t0 = bos + j * 64
            rows = t0 + r64
            m = rows < eos
            if PAD:
                tl.store(h_ptr + ((c0 + j) * HV + hv) * (K * V) + kv, S.to(h_ptr.dtype.element_ty),
                         mask=_kv_tile_mask(rk, cv, K, BK, V, BV))
            else:
                tl.store(h_ptr + ((c0 + j) * HV + hv) * (K * V) + kv, S.to(h_ptr.dtype.element_ty))
            # f32 W: W before U, as in round 1 (loading U first gave another SASS schedule and an 8% slower
            # state pass on an H200, 632 vs 584 us at 27B TP1). W planes: U first (the measured order: 562 us,
            # 49 local accesses; W first compiles to 63).
            if WSPLIT:
                u_off = (rows * HV + hv)[:, None] * V + cv[None, :]
                uu = _ld(u_ptr, u_off, m, cv, V, BV)
                w_off = (rows * HV + hv)[:, None] * (2 * K) + rk[None, :]
                w_hi = _ld(w_ptr, w_off, m, rk, K, BK)
                w_lo = _ld(w_ptr, w_off + K, m, rk, K, BK)
                s_hi, s_lo = _split(S)
                dd = uu - (_dot_bb(w_hi, s_hi) + (_dot_bb(w_hi, s_lo) + _dot_bb(w_lo, s_hi)))
            else:
                wv = _ld(w_ptr, (rows * HV + hv)[:, None] * K + rk[None, :], m, rk, K, BK)
                u_off = (rows * HV + hv)[:, None] * V + cv[None, :]
                uu = _ld(u_ptr, u_off, m, cv, V, BV)
                dd = uu - _mm_ff(wv, S, PREC)
            _st(u_ptr, u_off, dd, m, cv, V, BV)
            gc = tl.load(gcum_ptr + rows * HV + hv, mask=m, other=0.0)
            g_last = tl.load(gcum_ptr + (tl.minimum(t0 + 63, eos - 1)) * HV + hv)
            kk, rn = _load_raw(k_ptr, rows, m, hk, sk, K, BK, use_l2)
            dec = tl.where(m, _dexp(tl.where(m, g_last - gc, 0.0)), 0.0) * rn
            S = S * _dexp(g_last) + _mm_bf(tl.trans(kk), dd * dec[:, None], PREC)
        if PAD:
            tl.store(state_ptr + s_off, S, mask=_kv_tile_mask(rk, cv, K, BK, V, BV))
        else:
            tl.store(state_ptr + s_off, S)


@triton.jit
def gdr_chunk_out_kernel(q_ptr, k_ptr, u_ptr, gcum_ptr, h_ptr, o_ptr, cu_ptr, slots_ptr, coff_ptr, cseq_ptr,
                         T, num_slots, HK, HV, sq, sk, use_l2, scale,
                         K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                         PREC: tl.constexpr):
    """Per (chunk, value head, BV value columns). BK: key tile width (K, or 64 for K = 32); padding
    rows / columns of a tile wider than the state are 0 and never stored."""
    PAD: tl.constexpr = (K % BK != 0) or (V % BV != 0)
    tl.static_assert((BK >= K) & ((BV >= V) | (V % BV == 0)))
    p = tl.program_id(0).to(tl.int64)
    hv = tl.program_id(1)
    vb = tl.program_id(2)
    seq, live, t0, eos = _chunk_of(p, cseq_ptr, cu_ptr, coff_ptr, slots_ptr, T, num_slots)
    if seq >= 0:
        r64 = tl.arange(0, 64).to(tl.int64)
        rows = t0 + r64
        m = rows < eos
        cv = vb * BV + tl.arange(0, BV)
        o_off = (rows * HV + hv)[:, None] * V + cv[None, :]
        if live:
            hk = hv // (HV // HK)
            rk = tl.arange(0, BK)
            qq, rq = _load_raw(q_ptr, rows, m, hk, sq, K, BK, use_l2)
            kk, rk_n = _load_raw(k_ptr, rows, m, hk, sk, K, BK, use_l2)
            rq = rq * scale
            gc = tl.load(gcum_ptr + rows * HV + hv, mask=m, other=0.0)
            h_off = (p * HV + hv) * (K * V) + rk[:, None] * V + cv[None, :]
            if PAD:
                hh = tl.load(h_ptr + h_off, mask=_kv_tile_mask(rk, cv, K, BK, V, BV), other=0.0)
            else:
                hh = tl.load(h_ptr + h_off)
            o = _dot_bb(qq, hh.to(tl.bfloat16)) * (rq * _dexp(gc))[:, None]
            causal = (r64[:, None] >= r64[None, :]) & m[:, None]
            att = _dot_bb(qq, tl.trans(kk)) * rq[:, None] * rk_n[None, :]
            att = tl.where(causal, att * _dexp(tl.where(causal, gc[:, None] - gc[None, :], 0.0)), 0.0)
            dd = _ld(u_ptr, o_off, m, cv, V, BV)
            o += _mm_ff(att, dd, PREC)
            _st(o_ptr, o_off, o.to(tl.bfloat16), m, cv, V, BV)
        else:
            _st(o_ptr, o_off, tl.zeros([64, BV], tl.bfloat16), m, cv, V, BV)
