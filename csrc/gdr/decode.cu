// gdr.decode: recurrent gated-delta-rule decode (N rows x T >= 1 tokens), slot-indexed in-place
// update of the f32 state pool, with the gating (a, b, A_log, dt_bias -> g, beta), the q/k L2 norm
// and the q scale fused. CPU twin: deltakit_ref::gdr::{gating, decode, recurrent_prefill}; mirrors
// HF `torch_recurrent_gated_delta_rule` / FLA `fused_recurrent_gated_delta_rule` (decode).
//
// Layout: see csrc/include/gdr.h. state f32 [num_slots, H_v, K, V], V contiguous.
//
// Thread mapping: one CTA per (row n, value head hv, V tile of BV columns); grid.x enumerates
// (n, hv, tile) with the tile fastest so neighbouring CTAs stream neighbouring state memory. A CTA
// has NW warps. A thread owns 4 consecutive V columns (one 16-byte float4 per state row): lane =
// kq * LV + cg with LV = BV/4 lanes along V and KW = 32/LV lanes along K per warp; its K-thread
// index is kt = warp * KW + kq (KT = NW * KW of them) and it owns the rows kt + i*KT, i < R = K/KT.
// So the state tile [K, BV] lives in registers (R float4 per thread), is read from HBM once and
// written once per call, for any T (the T tokens of a row are processed with the tile resident).
//
// Per token, with the identity o = S'^T q = exp(g) (S^T q) + (k.q) delta, both K-reductions
// (S^T k and S^T q, on the pre-decay state) happen in one pass: per-thread partial sums over its R
// rows, warp shuffles across the KW lanes sharing columns, then (NW > 1) one smem exchange across
// warps with one __syncthreads (double-buffered by token parity, so one barrier per token). Each
// warp computes the token's q/k norms itself with shuffles (K/32 elements per lane) and stages the
// normalised q, k in a per-warp smem buffer (double-buffered, __syncwarp), so no extra CTA barrier.
// Gating is computed per thread (two scalars). Slots outside [0, num_slots) (incl. -1) are padding:
// the CTA writes zero output and touches no state. State loads/stores use the evict-first (.cs)
// cache policy.
// Two kernels share run_tokens: decode_kernel (one-shot CTAs, the tile loaded straight into
// registers) and decode_tma_kernel (persistent CTAs fed by bulk copies into a
// shared-memory ring, NS items ahead: see its comment; opt-in, measured slower). One more K = V = 128
// kernel has its own token loop, built from the same per-token helpers: decode_sl_kernel (the tile landed in
// shared memory by cp.async, streamed from there; the default for T = 1 from kSlMinHeads (row, head) pairs,
// 2-3% faster than the register tile there on an H200). A persistent shared-memory ring kernel (decode_ps_kernel,
// sessions 7-8: 3-21% slower than decode_sl_kernel) and a cluster split-K kernel (a cluster of CTAs per head, partials
// through distributed shared memory: 1.03-2x slower) were measured on an H200 and removed
// (docs/benchmarks/2026-12-02-gdrdec-s8.md, 2026-12-01-gdrdec-s5.md).
// Dispatch (launch_kv /
// launch_reg, K, V in {64, 128}): K = V = 128, T = 1 with >= 384 (row, head) pairs: decode_sl_kernel, BV = 64,
// NW = 4, 5 CTAs per SM (launch_sl); T = 4 from 384 pairs and T = 8 from 3,072: decode_slc_kernel (4 tokens per
// state pass, slc_default; sm_90 images only). Else K = V = 128 (any T; the PRE + FG kernels, see below) with
// 256..400 (row, head) pairs (one wave; T = 1 only below 384): BV = 128 (a whole head per CTA), NW = 4, 3 CTAs per SM;
// else >= 256 64-column tiles (128 pairs): BV = 64, NW = 2; else BV = 16, NW = 1 (K = V = 128: launched as a
// programmatic dependent of the previous kernel, see decode_kernel's PDL and pdl_enabled; session 10). Other K, V in
// {64, 128}: exact kernels, the same tiles for T = 1 only with the 64-column one from 512 tiles (T > 1:
// BV = 16, NW = 1). DELTAKIT_GDR_DECODE forces a path (path_selected). A
// persistent variant with a per-thread cp.async prefetch of the next tile (tools/tune/gdr_decode_lib.cu,
// sweep only) measured 2-8% slower than the register kernel.
// Small head dims (K in {16, 32} and / or V in {16, 32}; the tiny test models) always take the
// BV = 16, NW = 1 configuration (launch_small): K = 32 gives EK = 1 q/k element per lane for the
// norms and R = K/8 = 4 state rows per thread; K = 16 gives lanes 0..15 one element each (lanes
// 16..31 load nothing) and R = 2; V = 16 is a single V tile per head.
// Gates at the edge of f32: g = -inf or NaN (exp(A_log) overflow, times a softplus that
// underflowed to 0) and g <= -64 decay the state fully (factor 0).
#include <cuda_bf16.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "../common/launch.cuh"

namespace gdr_decode_impl {

struct Args {
  const __nv_bfloat16* q;
  const __nv_bfloat16* k;
  const __nv_bfloat16* v;
  const __nv_bfloat16* a;
  const __nv_bfloat16* b;
  const float* a_log;
  const float* dt_bias;
  const int32_t* slots;
  float* state;
  __nv_bfloat16* out;
  int64_t n, t, h_k, h_v, num_slots, q_stride, k_stride, v_stride, ab_stride;
  float scale;
};

__device__ __forceinline__ float softplus_f(float x) {
  // torch.nn.functional.softplus(beta=1, threshold=20)
  return x > 20.f ? x : log1pf(expf(x));
}

__device__ __forceinline__ float sigmoid_f(float x) {
  if (x >= 0.f) return 1.f / (1.f + expf(-x));
  const float e = expf(x);
  return e / (1.f + e);
}

// FG (the K = V = 128 dispatch; H200 2026-12-01: 0..-7% at T = 1 (the most at B = 1), -3..-7% at T = 4
// over the exact PRE kernels; the GPU tests' errors vs the f64 reference unchanged in magnitude): the gating and norm
// math through the hardware approximations.
// softplus: x > 20 -> x; x <= -3 -> the series e - e^2/2 + e^3/3 - e^4/4 of log1p(e), e = e^x
// (relative error <= e^4/5 < 1e-6); else log(1 + e) with __logf (argument >= 1.05: relative error
// < 1e-5). sigmoid: 1 / (1 + e^-x) with __expf / __fdividef. Edge behaviour as the exact forms
// (x = -inf: 0 / 0; exp overflow: softplus = x, sigmoid = 0).
__device__ __forceinline__ float softplus_fast(float x) {
  if (x > 20.f) return x;
  const float e = __expf(x);
  if (x <= -3.f) return e * (1.f - e * (0.5f - e * (1.f / 3.f - 0.25f * e)));
  return __logf(1.f + e);
}
__device__ __forceinline__ float sigmoid_fast(float x) { return __fdividef(1.f, 1.f + __expf(-x)); }

// Loads E consecutive bf16 (E in {1, 2, 4}) as f32.
template <int E>
__device__ __forceinline__ void load_bf16(const __nv_bfloat16* p, float (&f)[E]) {
  if constexpr (E == 1) {
    f[0] = __bfloat162float(*p);
  } else if constexpr (E == 4) {
    const uint2 raw = *reinterpret_cast<const uint2*>(p);
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
    const float2 x0 = __bfloat1622float2(h[0]);
    const float2 x1 = __bfloat1622float2(h[1]);
    f[0] = x0.x; f[1] = x0.y; f[2] = x1.x; f[3] = x1.y;
  } else {
    static_assert(E == 2, "E");
    const __nv_bfloat162 h = *reinterpret_cast<const __nv_bfloat162*>(p);
    const float2 x0 = __bfloat1622float2(h);
    f[0] = x0.x; f[1] = x0.y;
  }
}

__device__ __forceinline__ void store_bf16x4(__nv_bfloat16* p, float x0, float x1, float x2, float x3) {
  uint2 raw;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
  h[0] = __floats2bfloat162_rn(x0, x1);
  h[1] = __floats2bfloat162_rn(x2, x3);
  *reinterpret_cast<uint2*>(p) = raw;
}

// State tile accesses. LD: 0 = ld.global.cs (evict-first), 1 = ld.global.L2::256B,
// 2 = ld.global.cs.L2::256B, 3 = ld.global.L1::no_allocate.L2::256B. ST: 0 = st.global.cs, 1 = st.global.
template <int LD>
__device__ __forceinline__ float4 load_state(const float* p) {
  float4 r;
  if constexpr (LD == 0) {
    r = __ldcs(reinterpret_cast<const float4*>(p));
  } else if constexpr (LD == 1) {
    asm("ld.global.L2::256B.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(r.x), "=f"(r.y), "=f"(r.z), "=f"(r.w) : "l"(p));
  } else if constexpr (LD == 2) {
    asm("ld.global.cs.L2::256B.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(r.x), "=f"(r.y), "=f"(r.z), "=f"(r.w) : "l"(p));
  } else {
    asm("ld.global.L1::no_allocate.L2::256B.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(r.x), "=f"(r.y), "=f"(r.z), "=f"(r.w) : "l"(p));
  }
  return r;
}

template <int ST>
__device__ __forceinline__ void store_state(float* p, float4 v) {
  if constexpr (ST == 0) {
    __stcs(reinterpret_cast<float4*>(p), v);
  } else {
    *reinterpret_cast<float4*>(p) = v;
  }
}

// Tile geometry of one (K, V, BV, NW) configuration (see the file comment).
template <int K, int V, int BV, int NW>
struct Geo {
  static constexpr int LV = BV / 4;   // lanes along V in a warp
  static constexpr int KW = 32 / LV;  // lanes along K in a warp
  static constexpr int KT = NW * KW;  // K-threads per CTA
  static constexpr int R = K / KT;    // state rows per thread
  static constexpr int NVB = V / BV;  // V tiles per head
  static constexpr int EK = K >= 32 ? K / 32 : 1;  // q/k elements per lane for the norms
  static constexpr bool KL = K < 32;                 // K = 16: lanes K.. hold no q/k element
  static_assert(BV % 4 == 0 && LV >= 1 && LV <= 32 && 32 % LV == 0, "BV");
  static_assert(V % BV == 0 && K % KT == 0 && R >= 1, "tile");
  static_assert(EK == 1 || EK == 2 || EK == 4, "K in {16, 32, 64, 128}");
  static_assert(!KL || K == 16, "K in {16, 32, 64, 128}");
};

// Shared memory of one CTA: per-warp q/k staging and the cross-warp reduction buffer.
template <int K, int BV, int NW>
struct Smem {
  __align__(16) float qk[NW][2][2][K];               // [warp][parity][q|k][K]
  __align__(16) float red[NW > 1 ? 2 : 1][NW][2][BV];  // [parity][warp][k|q][BV]
};

// A token's inputs for one thread, loaded ahead of the state (decode_kernel with PRE: the first
// token's, issued before the slot load, so their latency and the gating math hide under the state's).
template <int EK>
struct TokIn {
  float av, bv, a_log, dt_bias;
  float qf[EK], kf[EK], vf[4];
};

// ---- per-token pieces shared by every kernel (run_tokens, decode_sl_kernel, tools/tune/gdr_decode_lib.cu) ----

// True for a live slot; slots outside [0, num_slots) (incl. -1) are padding.
__device__ __forceinline__ bool slot_live(const Args& p, int32_t slot) {
  return slot >= 0 && static_cast<int64_t>(slot) < p.num_slots;
}

// First float of value head hv's state [K, V] in slot `slot`.
template <int K, int V>
__device__ __forceinline__ float* head_state(const Args& p, int32_t slot, int64_t hv) {
  return p.state + (static_cast<int64_t>(slot) * p.h_v + hv) * (static_cast<int64_t>(K) * V);
}

// Padding row n: zero output of every token for this thread's columns col0..col0+3 of head hv.
template <int V>
__device__ __forceinline__ void write_zero_rows(const Args& p, int64_t n, int64_t hv, int col0) {
  for (int64_t t = 0; t < p.t; ++t) {
    store_bf16x4(p.out + (n * p.t + t) * (p.h_v * V) + hv * V + col0, 0.f, 0.f, 0.f, 0.f);
  }
}

// Token tok's gate input x (a or b) of head hv.
__device__ __forceinline__ float gate_in(const Args& p, const __nv_bfloat16* x, int64_t tok, int64_t hv) {
  return __bfloat162float(x[tok * p.ab_stride + hv]);
}

// Token tok's q and k elements lane*EK.. of key head kh (load_qk: zeros for the lanes past K when K = 16).
template <int K, int EK>
__device__ __forceinline__ void load_qk_lane(const Args& p, int64_t tok, int64_t kh, int lane, float (&qf)[EK],
                                             float (&kf)[EK]) {
  load_bf16<EK>(p.q + tok * p.q_stride + kh * K + lane * EK, qf);
  load_bf16<EK>(p.k + tok * p.k_stride + kh * K + lane * EK, kf);
}
template <int K, int EK, bool KL>
__device__ __forceinline__ void load_qk(const Args& p, int64_t tok, int64_t kh, int lane, float (&qf)[EK],
                                        float (&kf)[EK]) {
  if (!KL || lane * EK < K) {
    load_qk_lane<K, EK>(p, tok, kh, lane, qf, kf);
  } else {
#pragma unroll
    for (int e = 0; e < EK; ++e) qf[e] = kf[e] = 0.f;
  }
}

// Token tok's v columns col0..col0+3 of head hv.
template <int V>
__device__ __forceinline__ void load_v(const Args& p, int64_t tok, int64_t hv, int col0, float (&vf)[4]) {
  load_bf16<4>(p.v + tok * p.v_stride + hv * V + col0, vf);
}

// -exp(A_log), the factor of softplus(a + dt_bias) in g.
template <bool FG>
__device__ __forceinline__ float gate_neg_a(float a_log) {
  return FG ? -__expf(a_log) : -expf(a_log);
}

// Gating of one token (f32, as deltakit_ref::gdr::gating): decay = exp(g), g = neg_a softplus(a + dt_bias),
// beta = sigmoid(b). FG: the hardware approximations.
template <bool FG>
__device__ __forceinline__ void token_gates(float neg_a, float dt_bias, float av, float bv, float& decay, float& beta) {
  const float g = neg_a * (FG ? softplus_fast(av + dt_bias) : softplus_f(av + dt_bias));
  // Full decay at the edge of f32: g = -inf (exp(A_log) overflow) and g = NaN (-inf * 0, when
  // softplus underflows too) give 0, as do g <= -64 (e^-64 ~ 1.6e-28), the same rule as the
  // chunk prefill's clamp / flush (triton_aot/gdr/chunk_prefill.py, G_FLOOR).
  decay = g > -64.f ? (FG ? __expf(g) : expf(g)) : 0.f;
  beta = FG ? sigmoid_fast(bv) : sigmoid_f(bv);
}

// q/k L2 norms of one token by a warp whose lanes hold EK elements each of q and k (zeros where none):
// sums of squares and q.k through shuffles over the 32 lanes. Sets iq = scale / ||q||, ik = 1 / ||k||
// (L2; else scale and 1) and returns (normalised, scaled q) . (normalised k).
template <int EK, bool L2, bool FG>
__device__ __forceinline__ float qk_norms(const float (&qf)[EK], const float (&kf)[EK], float scale, float& iq,
                                          float& ik) {
  float ssq = 0.f, ssk = 0.f, sqk = 0.f;
#pragma unroll
  for (int e = 0; e < EK; ++e) {
    ssq = fmaf(qf[e], qf[e], ssq);
    ssk = fmaf(kf[e], kf[e], ssk);
    sqk = fmaf(qf[e], kf[e], sqk);
  }
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) {
    ssq += __shfl_xor_sync(0xffffffffu, ssq, off);
    ssk += __shfl_xor_sync(0xffffffffu, ssk, off);
    sqk += __shfl_xor_sync(0xffffffffu, sqk, off);
  }
  iq = scale;
  ik = 1.f;
  if constexpr (L2) {
    if constexpr (FG) {
      iq = scale * rsqrtf(ssq + 1e-6f);
      ik = rsqrtf(ssk + 1e-6f);
    } else {
      iq = scale / sqrtf(ssq + 1e-6f);
      ik = 1.f / sqrtf(ssk + 1e-6f);
    }
  }
  return sqk * iq * ik;
}

// Stages the lane's normalised q, k elements in the warp's buffers qs, ks.
template <int EK>
__device__ __forceinline__ void stage_qk(float* qs, float* ks, const float (&qf)[EK], const float (&kf)[EK], float iq,
                                         float ik, int lane) {
#pragma unroll
  for (int e = 0; e < EK; ++e) {
    qs[lane * EK + e] = qf[e] * iq;
    ks[lane * EK + e] = kf[e] * ik;
  }
}

// Adds one state row's contributions (k element kk, q element qq) to the partial S^T k / S^T q of 4 columns.
__device__ __forceinline__ void acc_row(float (&pk)[4], float (&pq)[4], const float4& s, float kk, float qq) {
  pk[0] = fmaf(s.x, kk, pk[0]); pk[1] = fmaf(s.y, kk, pk[1]);
  pk[2] = fmaf(s.z, kk, pk[2]); pk[3] = fmaf(s.w, kk, pk[3]);
  pq[0] = fmaf(s.x, qq, pq[0]); pq[1] = fmaf(s.y, qq, pq[1]);
  pq[2] = fmaf(s.z, qq, pq[2]); pq[3] = fmaf(s.w, qq, pq[3]);
}

// Completes the partial sums: shuffles across the KW lanes sharing columns, then (NW > 1) the warps through
// red[par] with one __syncthreads; every thread ends with the CTA's S^T k / S^T q of its 4 columns.
template <int K, int BV, int NW, int LV>
__device__ __forceinline__ void reduce_cols(float (&pk)[4], float (&pq)[4], Smem<K, BV, NW>& sm, int par, int warp,
                                            int kq, int cg) {
#pragma unroll
  for (int off = LV; off < 32; off <<= 1) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      pk[j] += __shfl_xor_sync(0xffffffffu, pk[j], off);
      pq[j] += __shfl_xor_sync(0xffffffffu, pq[j], off);
    }
  }
  if constexpr (NW > 1) {
    auto& red_s = sm.red;
    const int rp = NW > 1 ? par : 0;
    if (kq == 0) {
      *reinterpret_cast<float4*>(&red_s[rp][warp][0][cg * 4]) = make_float4(pk[0], pk[1], pk[2], pk[3]);
      *reinterpret_cast<float4*>(&red_s[rp][warp][1][cg * 4]) = make_float4(pq[0], pq[1], pq[2], pq[3]);
    }
    __syncthreads();
    float4 sk = *reinterpret_cast<const float4*>(&red_s[rp][0][0][cg * 4]);
    float4 sq = *reinterpret_cast<const float4*>(&red_s[rp][0][1][cg * 4]);
#pragma unroll
    for (int w = 1; w < NW; ++w) {
      const float4 xk = *reinterpret_cast<const float4*>(&red_s[rp][w][0][cg * 4]);
      const float4 xq = *reinterpret_cast<const float4*>(&red_s[rp][w][1][cg * 4]);
      sk.x += xk.x; sk.y += xk.y; sk.z += xk.z; sk.w += xk.w;
      sq.x += xq.x; sq.y += xq.y; sq.z += xq.z; sq.w += xq.w;
    }
    pk[0] = sk.x; pk[1] = sk.y; pk[2] = sk.z; pk[3] = sk.w;
    pq[0] = sq.x; pq[1] = sq.y; pq[2] = sq.z; pq[3] = sq.w;
  }
}

// delta = beta (v - decay S^T k) and out = decay S^T q + (q.k) delta of 4 columns (the identity of the file comment).
__device__ __forceinline__ void delta_out(const float (&vf)[4], const float (&sk)[4], const float (&sq)[4], float decay,
                                          float beta, float qk, float (&d)[4], float (&o)[4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    d[j] = beta * (vf[j] - decay * sk[j]);
    o[j] = fmaf(decay, sq[j], qk * d[j]);
  }
}

// One state row after the token: decay S + k delta^T (k element kk).
__device__ __forceinline__ void update_row(float4& s, float decay, float kk, const float (&d)[4]) {
  s.x = fmaf(decay, s.x, kk * d[0]);
  s.y = fmaf(decay, s.y, kk * d[1]);
  s.z = fmaf(decay, s.z, kk * d[2]);
  s.w = fmaf(decay, s.w, kk * d[3]);
}

// A one-shot CTA's (row n, value head hv, key head kh) and this thread's first column col0, in 32-bit index
// math (the PRE kernels).
struct Place {
  int64_t hv, n, kh;
  int col0;
};
// The (row, value head, key head, first column) of tile `tile` (tiles ordered value block fastest, then value head,
// then row) for this thread's column group cg.
template <int V, int BV>
__device__ __forceinline__ Place place_of(const Args& p, uint32_t tile, int cg) {
  constexpr int NVB = V / BV;
  const uint32_t hv32 = static_cast<uint32_t>(p.h_v);
  const int vb = static_cast<int>(tile % NVB);
  const uint32_t rest = tile / NVB;
  Place c;
  c.hv = rest % hv32;
  c.n = rest / hv32;
  c.kh = static_cast<uint32_t>(c.hv) / (hv32 / static_cast<uint32_t>(p.h_k));
  c.col0 = vb * BV + cg * 4;
  return c;
}
// The tile of this CTA (one tile per CTA: blockIdx.x).
template <int V, int BV>
__device__ __forceinline__ Place place32(const Args& p, int cg) {
  return place_of<V, BV>(p, blockIdx.x, cg);
}

// Token 0's inputs of row c.n for this thread (and a_log, dt_bias), issued before the slot load (PRE).
template <int K, int V, int EK, bool KL>
__device__ __forceinline__ void load_tok0(const Args& p, const Place& c, int lane, TokIn<EK>& in0) {
  const int64_t tok = c.n * p.t;
  in0.av = gate_in(p, p.a, tok, c.hv);
      in0.bv = gate_in(p, p.b, tok, c.hv);
  in0.a_log = p.a_log[c.hv];
  in0.dt_bias = p.dt_bias[c.hv];
  load_qk<K, EK, KL>(p, tok, c.kh, lane, in0.qf, in0.kf);
  load_v<V>(p, tok, c.hv, c.col0, in0.vf);
}

// The thread's R state rows kt + i*KT (4 columns from st) into / from registers.
template <int LD, int V, int KT, int R>
__device__ __forceinline__ void load_rows(const float* st, int kt, float4 (&s)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) s[i] = load_state<LD>(st + static_cast<int64_t>(kt + i * KT) * V);
}
template <int ST, int V, int KT, int R>
__device__ __forceinline__ void store_rows(float* st, int kt, const float4 (&s)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) store_state<ST>(st + static_cast<int64_t>(kt + i * KT) * V, s[i]);
}

// The T tokens of row n on the state tile s (registers) of value head hv, columns col0..col0+3 of
// this thread. Updates s in place and writes the outputs. PRE: token 0's inputs (and a_log, dt_bias)
// come from *in0 and the key head is kh_pre (else everything is loaded / computed here).
template <int K, int V, int BV, int NW, bool L2, bool PRE = false, bool FG = false>
__device__ __forceinline__ void run_tokens(const Args& p, int64_t n, int64_t hv, int col0,
                                           float4 (&s)[Geo<K, V, BV, NW>::R], Smem<K, BV, NW>& sm,
                                           const TokIn<Geo<K, V, BV, NW>::EK>* in0 = nullptr,
                                           int64_t kh_pre = 0) {
  using G = Geo<K, V, BV, NW>;
  constexpr int LV = G::LV, KW = G::KW, KT = G::KT, R = G::R, EK = G::EK;
  constexpr bool KL = G::KL;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int cg = lane % LV;
  const int kq = lane / LV;
  const int kt = warp * KW + kq;
  int64_t kh;
  if constexpr (PRE) {
    kh = kh_pre;
  } else {
    kh = hv / (p.h_v / p.h_k);
  }
  const int64_t out_row = p.h_v * V;
  auto& qk_s = sm.qk;
  float a_log, dt_bias;
  if constexpr (PRE) {
    a_log = in0->a_log;
    dt_bias = in0->dt_bias;
  } else {
    a_log = p.a_log[hv];
    dt_bias = p.dt_bias[hv];
  }
  const float neg_a = gate_neg_a<FG>(a_log);

  for (int64_t t = 0; t < p.t; ++t) {
    const int64_t tok = n * p.t + t;
    const int par = static_cast<int>(t & 1);
    const bool use0 = PRE && t == 0;
    float av, bv;
    if (use0) {
      av = in0->av;
      bv = in0->bv;
    } else {
      av = gate_in(p, p.a, tok, hv);
      bv = gate_in(p, p.b, tok, hv);
    }
    float decay, beta;
    token_gates<FG>(neg_a, dt_bias, av, bv, decay, beta);

    // q/k norms of key head kh, computed by each warp with shuffles, staged in its smem slice. (The same
    // math as qk_norms + stage_qk, written out here: through those helpers the K = 16 instantiations
    // compile to a different register assignment -- same results, not the same SASS.)
    float qf[EK], kf[EK];
    const bool has_qk = !KL || lane * EK < K;
    if (use0) {
#pragma unroll
      for (int e = 0; e < EK; ++e) {
        qf[e] = in0->qf[e];
        kf[e] = in0->kf[e];
      }
    } else if (has_qk) {
      load_qk_lane<K, EK>(p, tok, kh, lane, qf, kf);
    } else {
#pragma unroll
      for (int e = 0; e < EK; ++e) qf[e] = kf[e] = 0.f;
    }
    float ssq = 0.f, ssk = 0.f, sqk = 0.f;
#pragma unroll
    for (int e = 0; e < EK; ++e) {
      ssq = fmaf(qf[e], qf[e], ssq);
      ssk = fmaf(kf[e], kf[e], ssk);
      sqk = fmaf(qf[e], kf[e], sqk);
    }
#pragma unroll
    for (int off = 16; off >= 1; off >>= 1) {
      ssq += __shfl_xor_sync(0xffffffffu, ssq, off);
      ssk += __shfl_xor_sync(0xffffffffu, ssk, off);
      sqk += __shfl_xor_sync(0xffffffffu, sqk, off);
    }
    float iq = p.scale, ik = 1.f;
    if constexpr (L2) {
      if constexpr (FG) {
        iq = p.scale * rsqrtf(ssq + 1e-6f);
        ik = rsqrtf(ssk + 1e-6f);
      } else {
        iq = p.scale / sqrtf(ssq + 1e-6f);
        ik = 1.f / sqrtf(ssk + 1e-6f);
      }
    }
    const float qk = sqk * iq * ik;
    float* qs = qk_s[warp][par][0];
    float* ks = qk_s[warp][par][1];
    if (has_qk) {
#pragma unroll
      for (int e = 0; e < EK; ++e) {
        qs[lane * EK + e] = qf[e] * iq;
        ks[lane * EK + e] = kf[e] * ik;
      }
    }
    float vf[4];
    if (use0) {
#pragma unroll
      for (int j = 0; j < 4; ++j) vf[j] = in0->vf[j];
    } else {
      load_v<V>(p, tok, hv, col0, vf);
    }
    __syncwarp();

    // Partial S^T k and S^T q over this thread's rows (pre-decay state), then over the CTA.
    float pk[4] = {0.f, 0.f, 0.f, 0.f}, pq[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int row = kt + i * KT;
      acc_row(pk, pq, s[i], ks[row], qs[row]);
    }
    reduce_cols<K, BV, NW, LV>(pk, pq, sm, par, warp, kq, cg);

    float d[4], o[4];
    delta_out(vf, pk, pq, decay, beta, qk, d, o);
    if (kt == 0) {
      store_bf16x4(p.out + tok * out_row + hv * V + col0, o[0], o[1], o[2], o[3]);
    }
#pragma unroll
    for (int i = 0; i < R; ++i) update_row(s[i], decay, ks[kt + i * KT], d);
  }

}

// griddepcontrol.wait (sm_90+; compiled out for older archs, whose launchers never set the PDL attribute).
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// PRE (the K = V = 128 dispatch, with FG): 32-bit index math (no int64 division calls) and
// token 0's inputs (a, b, q, k, v, a_log, dt_bias) loaded before the slot, so the state load is the
// only global latency on the way to the first state FMA (the default kernel waits for the slot, then
// for a / b behind the state loads, then -- after the gating math -- for q / k).
//
// PDL (with PRE; the small-batch route of the default, launched by launch_cfg with dk::launch_pdl): a programmatic
// dependent of the previous kernel on the stream (the engine: conv1d.update, which executes
// griddepcontrol.launch_dependents at entry, so this grid may start while it drains). Only the slot indices and the
// state pool are read before griddepcontrol.wait (the slot, then the state tile into registers); everything else --
// token 0's inputs q / k / v / a / b, a_log, dt_bias, every later token, and every global write (outputs, zero rows
// of padding, the state) -- comes after it. griddepcontrol.wait returns once the previous grid has completed and its
// memory is visible (at once when launched without the attribute). Contract (src/ops/gdr/decode.rs): the state pool
// and the slots must not be written by the kernel immediately before this one in the stream if that kernel
// triggers early. This kernel does not trigger (the implicit trigger at exit): a following gdr.decode on the same
// pool stays ordered after its state stores.
template <int K, int V, int BV, int NW, bool L2, int LD = 0, int ST = 0, int MINB = 1, bool PRE = false,
          bool FG = false, bool PDL = false>
__global__ void __launch_bounds__(NW * 32, MINB) decode_kernel(const Args p) {
  using G = Geo<K, V, BV, NW>;
  constexpr int KW = G::KW, KT = G::KT, R = G::R, NVB = G::NVB, LV = G::LV;
  static_assert(PRE || !PDL, "PDL only with PRE");
  __shared__ Smem<K, BV, NW> sm;
  if constexpr (PRE) {
    constexpr int EK = G::EK;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int cg = lane % LV;
    const int kq = lane / LV;
    const int kt = warp * KW + kq;
    const Place c = place32<V, BV>(p, cg);
    TokIn<EK> in0;
    float4 s[R];
    int32_t slot;
    bool live;
    if constexpr (PDL) {  // the slot and the state tile before the wait (contract above), the inputs after it
      slot = p.slots[c.n];
      live = slot_live(p, slot);
      if (live) load_rows<LD, V, KT>(head_state<K, V>(p, slot, c.hv) + c.col0, kt, s);
      pdl_wait();
      load_tok0<K, V, EK, G::KL>(p, c, lane, in0);
    } else {  // token 0's inputs first
      load_tok0<K, V, EK, G::KL>(p, c, lane, in0);
      slot = p.slots[c.n];
      live = slot_live(p, slot);
    }
    if (!live) {
      if (kt == 0) write_zero_rows<V>(p, c.n, c.hv, c.col0);
      return;
    }
    float* st = head_state<K, V>(p, slot, c.hv) + c.col0;
    if constexpr (!PDL) load_rows<LD, V, KT>(st, kt, s);
    run_tokens<K, V, BV, NW, L2, true, FG>(p, c.n, c.hv, c.col0, s, sm, &in0, c.kh);
    store_rows<ST, V, KT>(st, kt, s);
    return;
  }

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int cg = lane % LV;
  const int kq = lane / LV;
  const int kt = warp * KW + kq;

  const int64_t bid = blockIdx.x;
  const int vb = static_cast<int>(bid % NVB);
  const int64_t rest = bid / NVB;
  const int64_t hv = rest % p.h_v;
  const int64_t n = rest / p.h_v;
  const int col0 = vb * BV + cg * 4;

  const int32_t slot = p.slots[n];
  if (!slot_live(p, slot)) {
    if (kt == 0) write_zero_rows<V>(p, n, hv, col0);
    return;
  }

  float* st = head_state<K, V>(p, slot, hv) + col0;
  float4 s[R];
  load_rows<LD, V, KT>(st, kt, s);
  run_tokens<K, V, BV, NW, L2>(p, n, hv, col0, s, sm);
  store_rows<ST, V, KT>(st, kt, s);
}


// ---- TMA-fed persistent variant ------------------------------------------------------------------
// Persistent CTAs (as many as fit on the device, at most one per item) walk the (row, head, V tile)
// items with stride gridDim.x. The state tile [K, BV] of an item travels global -> shared memory by
// the bulk-copy (TMA) engine, NS items ahead: a ring of NS stages, each with an mbarrier whose
// transaction count the copies complete (BV == V: one contiguous K*V*4-byte copy per item; BV < V: K
// row copies of BV*4 bytes issued by the lanes of warp 0). Each thread moves its float4s of the
// stage into registers (the same ownership as decode_kernel), the CTA synchronises once, the stage
// is refilled with item + NS*gridDim.x, and the tokens run on the register tile (run_tokens); the
// updated tile is stored straight from registers (st.global.cs). So every SM keeps up to NS-1
// items' state reads in flight while it computes and writes another: the load / compute / store
// phases of the one-shot kernel overlap inside each SM instead of only across CTAs.
// Padding rows: the stage's barrier is completed by a plain arrive (no copy), the CTA writes zeros.
// The bulk-copy / mbarrier PTX below needs sm_90. Device passes for older archs (the portable
// `80;90a` build) compile these helpers and the TMA kernel to a trap; launch_tma never launches it
// on a device below compute capability 9.0.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define DK_GDR_DECODE_NO_TMA 1
#endif
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
#ifndef DK_GDR_DECODE_NO_TMA
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
#endif
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
#ifndef DK_GDR_DECODE_NO_TMA
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
#endif
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
#ifndef DK_GDR_DECODE_NO_TMA
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
#endif
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
#ifdef DK_GDR_DECODE_NO_TMA
  __trap();
#else
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done) : "r"(smem_addr(bar)), "r"(parity) : "memory");
  } while (!done);
#endif
}
// Bulk copy global -> shared completing `bytes` on bar. EF: L2 evict-first policy on the read.
template <bool EF>
__device__ __forceinline__ void bulk_g2s(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
#ifdef DK_GDR_DECODE_NO_TMA
  __trap();
#else
  if constexpr (EF) {
    uint64_t pol;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
        ::"r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(bar)), "l"(pol) : "memory");
  } else {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(bar)) : "memory");
  }
#endif
}

template <int K, int BV, int NW, int NS>
constexpr size_t tma_smem_bytes() {
  return static_cast<size_t>(NS) * K * BV * sizeof(float) + sizeof(Smem<K, BV, NW>);
}

template <int K, int V, int BV, int NW, int NS, bool L2, bool EF>
__global__ void __launch_bounds__(NW * 32, 1) decode_tma_kernel(const Args p, int64_t num_items) {
#ifdef DK_GDR_DECODE_NO_TMA
  __trap();
#else
  using G = Geo<K, V, BV, NW>;
  constexpr int KW = G::KW, KT = G::KT, R = G::R, NVB = G::NVB, LV = G::LV;
  constexpr uint32_t kStageFloats = K * BV;
  extern __shared__ __align__(128) unsigned char dsm[];
  float* ring = reinterpret_cast<float*>(dsm);
  auto& sm = *reinterpret_cast<Smem<K, BV, NW>*>(dsm + static_cast<size_t>(NS) * kStageFloats * sizeof(float));
  __shared__ __align__(8) uint64_t bar[NS];

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int cg = lane % LV;
  const int kq = lane / LV;
  const int kt = warp * KW + kq;
  const int64_t out_row = p.h_v * V;
  const int64_t stride = gridDim.x;

  // Issues the copies of item `item` into stage `st` (warp 0 only; lane 0 alone for BV == V).
  auto issue = [&](int st, int64_t item, int32_t slot) {
    if (item >= num_items) return;
    if (slot < 0 || static_cast<int64_t>(slot) >= p.num_slots) {
      if (lane == 0) mbar_arrive(&bar[st]);
      return;
    }
    const int vb = static_cast<int>(item % NVB);
    const int64_t hv = (item / NVB) % p.h_v;
    const float* src = p.state + (static_cast<int64_t>(slot) * p.h_v + hv) * (static_cast<int64_t>(K) * V) + vb * BV;
    float* dst = ring + st * kStageFloats;
    if constexpr (BV == V) {
      if (lane == 0) {
        mbar_arrive_expect_tx(&bar[st], kStageFloats * sizeof(float));
        bulk_g2s<EF>(dst, src, kStageFloats * sizeof(float), &bar[st]);
      }
    } else {
      if (lane == 0) mbar_arrive_expect_tx(&bar[st], kStageFloats * sizeof(float));
      for (int r = lane; r < K; r += 32) {
        bulk_g2s<EF>(dst + r * BV, src + static_cast<int64_t>(r) * V, BV * sizeof(float), &bar[st]);
      }
    }
  };
  auto slot_of = [&](int64_t item) -> int32_t {
    return item < num_items ? __ldg(p.slots + item / (NVB * p.h_v)) : -1;
  };

  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < NS; ++s) mbar_init(&bar[s], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (warp == 0) {
#pragma unroll
    for (int s = 0; s < NS; ++s) {
      const int64_t item = blockIdx.x + s * stride;
      issue(s, item, slot_of(item));
    }
  }

  int it = 0;
  for (int64_t item = blockIdx.x; item < num_items; item += stride, ++it) {
    const int st = it % NS;
    const uint32_t parity = static_cast<uint32_t>((it / NS) & 1);
    const int vb = static_cast<int>(item % NVB);
    const int64_t rest = item / NVB;
    const int64_t hv = rest % p.h_v;
    const int64_t n = rest / p.h_v;
    const int col0 = vb * BV + cg * 4;
    const int32_t slot = __ldg(p.slots + n);
    const bool live = slot >= 0 && static_cast<int64_t>(slot) < p.num_slots;
    const int64_t next = item + NS * stride;
    const int32_t next_slot = warp == 0 ? slot_of(next) : -1;  // in flight during the wait
    mbar_wait(&bar[st], parity);
    float4 s[R];
    if (live) {
      const float* stage = ring + st * kStageFloats + cg * 4;
#pragma unroll
      for (int i = 0; i < R; ++i) s[i] = *reinterpret_cast<const float4*>(stage + (kt + i * KT) * BV);
    }
    __syncthreads();  // every thread has its part of the stage in registers
    if (warp == 0) {
      if (lane == 0) asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      __syncwarp();
      issue(st, next, next_slot);
    }
    if (!live) {
      if (kt == 0) {
        for (int64_t t = 0; t < p.t; ++t) {
          store_bf16x4(p.out + (n * p.t + t) * out_row + hv * V + col0, 0.f, 0.f, 0.f, 0.f);
        }
      }
      continue;
    }
    run_tokens<K, V, BV, NW, L2>(p, n, hv, col0, s, sm);
    float* gst = p.state + (static_cast<int64_t>(slot) * p.h_v + hv) * (static_cast<int64_t>(K) * V) + col0;
#pragma unroll
    for (int i = 0; i < R; ++i) store_state<0>(gst + static_cast<int64_t>(kt + i * KT) * V, s[i]);
  }
#endif
}

// ---- shared-memory-landed one-shot variant (the T = 1 default from kSlMinHeads pairs with 4 warps; forced for every
// K = V = 128 call by DELTAKIT_GDR_DECODE=sl_bv64_nw1 | sl_bv64_nw2 | sl_bv64_nw4) -------------------------------------
// K = V = 128. The register kernel parks its 32 KB tile in registers for the CTA's whole life (255 registers, 4
// CTAs per SM), but has loads in flight only during the load phase: the H200 timeline (2026-12-01 session 5,
// docs/benchmarks/2026-12-01-gdrdec-s5.md) shows load 3.8 us, compute 2.8 us, store issue 1.0 us per CTA, i.e.
// ~47% of the 128 KB per SM in flight, ~3.9 TB/s. Here the tile lands in shared memory by cp.async (16 bytes,
// each thread copies exactly the float4s it owns, so no CTA barrier guards the tile), the tokens stream it from
// shared memory (dots, then update in place / store), and registers stay small: shared memory (<= 227 KB per
// SM: 6 CTAs of 34.5 KB for BV = 64, 1 warp) bounds the CTAs per SM instead of the register file. Same thread
// mapping, reductions, gating (FG) and token-0 prefetch (PRE) as decode_kernel<..., PRE, FG>.
// H200 2026-12-01 session 6 (27B, T = 1, L2-cold): BV = 64 with 2 warps (5 CTAs/SM, 160 KB of tiles per SM) 1.6-2.7%
// faster than the register tile at >= 768 (row, head) pairs (TP1 B=256 402.2 vs 413.3 us, 4.00 TB/s; FLA 387.7),
// 1 warp (6 CTAs/SM) 0.3-1% behind it, BV = 32 3-7% slower; T = 4: 12-27% slower than the register tile at B = 16 / 64.
// ncu (TP1 B=256): DRAM active cycles equal to the register kernel's and FLA's (1.037 M for the same 1.59 GB), the
// elapsed cycles not: DRAM busy 83% of the kernel (register tile 81%, FLA 86%). The gap is DRAM idle time, i.e. too
// few requests outstanding part of the time: a CTA's tile buffer is held for its whole life but has loads in flight
// only before its compute / store phases, and the single-warp compute streams 2 x 32 KB from shared memory
// (short-scoreboard stalls 3.7 per issue vs 1.3 in the register kernel) at 5.9 warps per SM (FLA: 30).
// Session 8 (2026-12-02): 4 warps (R = 16 rows per thread, 96 registers, 44 KB: 5 CTAs/SM = 19 active warps per SM
// instead of 9.6, the same 160 KB of tile) ties 2 warps at B >= 64 (TP1 B=256 399.5 vs 400.0 us) and is 1.7-3% faster
// at 384-768 pairs; ncu (TP1 B=64): DRAM busy 79.3% vs 80.0%, same bytes -- twice the resident warps do not shorten
// the DRAM idle time, so resident warps are not what the gap to FLA (4.17 TB/s) is made of either.
// SX (measurement only, tools/tune/gdr_decode_lib.cu; 0 in the library): bit 0 = no slot load (row n uses slot n:
// the state address no longer waits for a dependent load at the CTA's start, as for FLA's kernel on a pre-gathered
// state), bit 1 = out of place (the updated tile goes to slot + num_slots of a pool twice as large, as FLA writes
// its final state to a separate tensor). Both break the op's contract; they isolate what the gap to FLA is made of.
// Bit 2 = programmatic dependent launch (sm_90; launched with the programmatic-serialization attribute by the harness):
// the CTA lets the next grid launch at once (griddepcontrol.launch_dependents), loads the slot and issues the state
// copies, and only then waits for the previous grid (griddepcontrol.wait) before token 0's inputs (which a previous
// kernel produces; the state and slots do not): in a graph the next call's state streams during this one's tail.
// H200 session 9 (20 back-to-back calls in a CUDA graph): 3.35 / 2.44 us at 27B TP1 / TP2 B = 1 (default 3.69 / 3.21,
// FLA 3.62 / 2.76) but 0.5-14% slower from B = 16 (the early CTAs hold their tiles in griddepcontrol.wait); unused.
// Bit 3 (with bit 2): no griddepcontrol.launch_dependents (the trigger is implicit at CTA exit: the next grid only
// skips the launch gap, no early CTAs; not yet measured).
// The shared-memory tiles' landing (decode_sl_kernel, decode_slc_kernel): thread x copies its R 16-byte pieces of the
// state tile (rows kt, kt + KT, ... of the V-contiguous head state at `st`, already offset to the tile's first column)
// into tile[i][x] by cp.async, as one commit group.
template <int KT, int V, int R, int NT>
__device__ __forceinline__ void land_tile(float4 (&tile)[R][NT], const float* st, int kt) {
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const uint32_t dst = smem_addr(&tile[i][threadIdx.x]);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(st + static_cast<int64_t>(kt + i * KT) * V)
                 : "memory");
  }
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int K, int V, int BV, int NW, bool L2, int MINB = 1, int SX = 0>
__global__ void __launch_bounds__(NW * 32, MINB) decode_sl_kernel(const Args p) {
  using G = Geo<K, V, BV, NW>;
  constexpr int KW = G::KW, KT = G::KT, R = G::R, LV = G::LV, EK = G::EK;
  constexpr int NT = NW * 32;
  static_assert(K == 128 && V == 128, "sl path: K = V = 128");
  __shared__ __align__(16) float4 tile[R][NT];  // [row i of the thread][thread]: conflict-free 16-byte accesses
  __shared__ Smem<K, BV, NW> sm;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int cg = lane % LV;
  const int kq = lane / LV;
  const int kt = warp * KW + kq;
  const Place c = place32<V, BV>(p, cg);
  TokIn<EK> in;  // token 0's inputs first (PRE), then each token's
  if constexpr ((SX & 4) == 0) load_tok0<K, V, EK, false>(p, c, lane, in);
  const int32_t slot = (SX & 1) ? static_cast<int32_t>(c.n) : p.slots[c.n];
  if constexpr ((SX & 4) != 0) {
    if constexpr ((SX & 8) == 0) asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    if (slot_live(p, slot)) land_tile<KT, V>(tile, head_state<K, V>(p, slot, c.hv) + c.col0, kt);
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    load_tok0<K, V, EK, false>(p, c, lane, in);
  }
  if (!slot_live(p, slot)) {
    if (kt == 0) write_zero_rows<V>(p, c.n, c.hv, c.col0);
    return;
  }
  float* st = head_state<K, V>(p, slot, c.hv) + c.col0;
  float* st_out = (SX & 2) ? st + p.num_slots * p.h_v * (static_cast<int64_t>(K) * V) : st;
  if constexpr ((SX & 4) == 0) land_tile<KT, V>(tile, st, kt);
  const float neg_a = gate_neg_a<true>(in.a_log);
  const int64_t out_row = p.h_v * V;
  for (int64_t t = 0; t < p.t; ++t) {
    const int64_t tok = c.n * p.t + t;
    const int par = static_cast<int>(t & 1);
    if (t > 0) {
      in.av = gate_in(p, p.a, tok, c.hv);
      in.bv = gate_in(p, p.b, tok, c.hv);
      load_qk<K, EK, false>(p, tok, c.kh, lane, in.qf, in.kf);
      load_v<V>(p, tok, c.hv, c.col0, in.vf);
    }
    float decay, beta;
    token_gates<true>(neg_a, in.dt_bias, in.av, in.bv, decay, beta);
    float iq, ik;
    const float qk = qk_norms<EK, L2, true>(in.qf, in.kf, p.scale, iq, ik);
    float* qs = sm.qk[warp][par][0];
    float* ks = sm.qk[warp][par][1];
    stage_qk<EK>(qs, ks, in.qf, in.kf, iq, ik, lane);
    __syncwarp();
    if (t == 0) asm volatile("cp.async.wait_all;\n" ::: "memory");  // this thread's own copies
    float pk[4] = {0.f, 0.f, 0.f, 0.f}, pq[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int row = kt + i * KT;
      acc_row(pk, pq, tile[i][threadIdx.x], ks[row], qs[row]);
    }
    reduce_cols<K, BV, NW, LV>(pk, pq, sm, par, warp, kq, cg);
    float d[4], o[4];
    delta_out(in.vf, pk, pq, decay, beta, qk, d, o);
    if (kt == 0) store_bf16x4(p.out + tok * out_row + c.hv * V + c.col0, o[0], o[1], o[2], o[3]);
    const bool last = t + 1 == p.t;
#pragma unroll
    for (int i = 0; i < R; ++i) {
      float4 s = tile[i][threadIdx.x];
      update_row(s, decay, ks[kt + i * KT], d);
      if (last) {
        store_state<0>(st_out + static_cast<int64_t>(kt + i * KT) * V, s);
      } else {
        tile[i][threadIdx.x] = s;
      }
    }
  }
}

// ---- chunked multi-token shared-memory tile (opt-in: DELTAKIT_GDR_DECODE=slc_bv64_nw4; harness slc_*) ---------------
// K = V = 128, for T > 1 (speculative verification; any T works). decode_sl_kernel re-reads and rewrites the shared-
// memory tile for every token (2 tile passes and 2 CTA barriers per token: 12-27% slower than the register tile at
// T = 4, session 6). Here the tokens of a row go through the tile in chunks of up to TC: the chunk's S^T k_t and S^T q_t
// (t < TC) all come from ONE pass over the tile at the chunk's start state S, and the deltas / outputs from a TC x TC
// forward substitution per column on scalars that need no state (k_j.k_t, k_j.q_t and the decay products, computed
// while the state is in flight):
//   S_{t-1}^T k_t = D(0, t-1) S^T k_t + sum_{j<t} D(j+1, t-1) (k_j.k_t) delta_j,   delta_t = beta_t (v_t - decay_t (that))
//   o_t = D(0, t) S^T q_t + sum_{j<=t} D(j+1, t) (k_j.q_t) delta_j,   S' = D(0, n-1) S + sum_j D(j+1, n-1) k_j delta_j^T
// with D(a, b) the product of the chunk's decays a..b (1 when a > b; products only, no division, so a decay of 0 at the
// edge of f32 needs no special case). One more tile pass applies S'. So the tile is read twice and written once per
// chunk (per T <= TC call: as at T = 1) and the CTA synchronises twice per chunk instead of twice per token. Tokens
// past T in the last chunk are staged as k = q = 0, beta = 0, decay = 1 (no effect). Warp w normalises token t0 + w
// (+ NW ...) and stages q, k in shared memory (double-buffered by chunk parity); the reduction buffer is single: its
// next writes follow the next chunk's staging barrier. H200 session 8: the tests, memcheck and racecheck pass forced;
// the default for T = 4 / 8 (slc_default).
template <int K, int V, int BV, int NW, bool L2, int MINB, int TC>
__global__ void __launch_bounds__(NW * 32, MINB) decode_slc_kernel(const Args p) {
#ifdef DK_GDR_DECODE_NO_TMA
  __trap();  // 49.4 KB of static shared memory: more than the 48 KB of sm_80 / sm_89 (launch_slc never launches it there)
#else
  using G = Geo<K, V, BV, NW>;
  constexpr int KW = G::KW, KT = G::KT, R = G::R, LV = G::LV, EK = G::EK;
  constexpr int NT = NW * 32;
  static_assert(K == 128 && V == 128 && EK == 4, "slc path: K = V = 128");
  static_assert(TC >= 1 && TC <= 8, "TC");
  __shared__ __align__(16) float4 tile[R][NT];
  __shared__ __align__(16) float qk[2][TC][2][K];   // [chunk parity][token][q | k][K], normalised (q scaled)
  __shared__ float gt[2][TC][2];                      // [chunk parity][token][decay | beta]
  __shared__ __align__(16) float red[2 * TC][NW][BV];  // [2 t + (k | q)][warp][column]
  __shared__ float sc[2][TC][TC];                      // [k.k | k.q][j][t]: the chunk's Gram scalars
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int cg = lane % LV;
  const int kq = lane / LV;
  const int kt = warp * KW + kq;
  const Place c = place32<V, BV>(p, cg);
  const int64_t out_row = p.h_v * V;
  const float neg_a = gate_neg_a<true>(p.a_log[c.hv]);
  const float dt_bias = p.dt_bias[c.hv];

  // The chunk's inputs in registers: this warp's tokens (q, k, a, b) and this thread's v columns of every token.
  float qf[(TC + NW - 1) / NW][EK], kf[(TC + NW - 1) / NW][EK], av[(TC + NW - 1) / NW], bv[(TC + NW - 1) / NW];
  float vf[TC][4];
  auto load_chunk = [&](int64_t t0) {
#pragma unroll
    for (int u = 0; u < (TC + NW - 1) / NW; ++u) {
      if (u * NW + warp >= TC) break;
      const int64_t t = t0 + u * NW + warp;
      if (t < p.t) {
        const int64_t tok = c.n * p.t + t;
        load_qk_lane<K, EK>(p, tok, c.kh, lane, qf[u], kf[u]);
        av[u] = gate_in(p, p.a, tok, c.hv);
        bv[u] = gate_in(p, p.b, tok, c.hv);
      }
    }
#pragma unroll
    for (int t = 0; t < TC; ++t) {
      if (t0 + t < p.t) {
        load_v<V>(p, c.n * p.t + t0 + t, c.hv, c.col0, vf[t]);
      } else {
        vf[t][0] = vf[t][1] = vf[t][2] = vf[t][3] = 0.f;
      }
    }
  };
  load_chunk(0);
  const int32_t slot = p.slots[c.n];
  if (!slot_live(p, slot)) {
    if (kt == 0) write_zero_rows<V>(p, c.n, c.hv, c.col0);
    return;
  }
  float* st = head_state<K, V>(p, slot, c.hv) + c.col0;
  land_tile<KT, V>(tile, st, kt);

  int par = 0;
  for (int64_t t0 = 0; t0 < p.t; t0 += TC, par ^= 1) {
    if (t0 > 0) load_chunk(t0);
    // 1. This warp's tokens: gates, q/k norms, staging (zeros / decay 1 / beta 0 past T).
#pragma unroll
    for (int u = 0; u < (TC + NW - 1) / NW; ++u) {
      const int tl = u * NW + warp;
      if (tl >= TC) break;
      float decay = 1.f, beta = 0.f, iq = 0.f, ik = 0.f;
      if (t0 + tl < p.t) {
        token_gates<true>(neg_a, dt_bias, av[u], bv[u], decay, beta);
        qk_norms<EK, L2, true>(qf[u], kf[u], p.scale, iq, ik);
      } else {
#pragma unroll
        for (int e = 0; e < EK; ++e) qf[u][e] = kf[u][e] = 0.f;
      }
      stage_qk<EK>(qk[par][tl][0], qk[par][tl][1], qf[u], kf[u], iq, ik, lane);
      if (lane == 0) {
        gt[par][tl][0] = decay;
        gt[par][tl][1] = beta;
      }
    }
    __syncthreads();  // B1: the chunk's staging is visible; the previous chunk's reads of red are done
    // 2. The chunk's Gram scalars k_j.k_t (j < t) and k_j.q_t (j <= t): warp w those of token t = w (+ NW ...), into
    //    sc (read after the reduction barrier B2; the next writes follow the next chunk's B1).
#pragma unroll
    for (int u = 0; u < (TC + NW - 1) / NW; ++u) {
      const int t = u * NW + warp;
      if (t >= TC) break;
      const float4 qt = *reinterpret_cast<const float4*>(&qk[par][t][0][lane * EK]);
      const float4 kt4 = *reinterpret_cast<const float4*>(&qk[par][t][1][lane * EK]);
      float gkk[TC], gkq[TC];
#pragma unroll
      for (int j = 0; j < TC; ++j) {
        if (j > t) break;
        const float4 kj = *reinterpret_cast<const float4*>(&qk[par][j][1][lane * EK]);
        gkk[j] = kj.x * kt4.x + kj.y * kt4.y + kj.z * kt4.z + kj.w * kt4.w;
        gkq[j] = kj.x * qt.x + kj.y * qt.y + kj.z * qt.z + kj.w * qt.w;
      }
#pragma unroll
      for (int off = 16; off >= 1; off >>= 1) {
#pragma unroll
        for (int j = 0; j < TC; ++j) {
          if (j > t) break;
          gkk[j] += __shfl_xor_sync(0xffffffffu, gkk[j], off);
          gkq[j] += __shfl_xor_sync(0xffffffffu, gkq[j], off);
        }
      }
      if (lane == 0) {
#pragma unroll
        for (int j = 0; j < TC; ++j) {
          if (j > t) break;
          sc[0][j][t] = gkk[j];  // (j = t: unused)
          sc[1][j][t] = gkq[j];
        }
      }
    }
    if (t0 == 0) asm volatile("cp.async.wait_all;\n" ::: "memory");  // this thread's own copies
    // 3. One pass over the tile: S^T k_t and S^T q_t of every token of the chunk (partial over this thread's rows).
    float pk[TC][4], pq[TC][4];
#pragma unroll
    for (int t = 0; t < TC; ++t) {
#pragma unroll
      for (int e = 0; e < 4; ++e) pk[t][e] = pq[t][e] = 0.f;
    }
#pragma unroll 4
    for (int i = 0; i < R; ++i) {
      const int row = kt + i * KT;
      const float4 s = tile[i][threadIdx.x];
#pragma unroll
      for (int t = 0; t < TC; ++t) acc_row(pk[t], pq[t], s, qk[par][t][1][row], qk[par][t][0][row]);
    }
    // 4. Over the CTA: shuffles across the KW lanes sharing columns, then the warps through red (one barrier).
#pragma unroll
    for (int off = LV; off < 32; off <<= 1) {
#pragma unroll
      for (int t = 0; t < TC; ++t) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          pk[t][e] += __shfl_xor_sync(0xffffffffu, pk[t][e], off);
          pq[t][e] += __shfl_xor_sync(0xffffffffu, pq[t][e], off);
        }
      }
    }
    if constexpr (NW > 1) {
      if (kq == 0) {
#pragma unroll
        for (int t = 0; t < TC; ++t) {
          *reinterpret_cast<float4*>(&red[2 * t][warp][cg * 4]) = make_float4(pk[t][0], pk[t][1], pk[t][2], pk[t][3]);
          *reinterpret_cast<float4*>(&red[2 * t + 1][warp][cg * 4]) = make_float4(pq[t][0], pq[t][1], pq[t][2], pq[t][3]);
        }
      }
      __syncthreads();  // B2
#pragma unroll
      for (int t = 0; t < TC; ++t) {
        float4 sk = *reinterpret_cast<const float4*>(&red[2 * t][0][cg * 4]);
        float4 sq = *reinterpret_cast<const float4*>(&red[2 * t + 1][0][cg * 4]);
#pragma unroll
        for (int w = 1; w < NW; ++w) {
          const float4 xk = *reinterpret_cast<const float4*>(&red[2 * t][w][cg * 4]);
          const float4 xq = *reinterpret_cast<const float4*>(&red[2 * t + 1][w][cg * 4]);
          sk.x += xk.x; sk.y += xk.y; sk.z += xk.z; sk.w += xk.w;
          sq.x += xq.x; sq.y += xq.y; sq.z += xq.z; sq.w += xq.w;
        }
        pk[t][0] = sk.x; pk[t][1] = sk.y; pk[t][2] = sk.z; pk[t][3] = sk.w;
        pq[t][0] = sq.x; pq[t][1] = sq.y; pq[t][2] = sq.z; pq[t][3] = sq.w;
      }
    }
    // 5. Forward substitution per column: deltas and outputs of the chunk's tokens. dp[j][t] = D(j, t) = dec_j ...
    //    dec_t (1 when j > t).
    float dp[TC + 1][TC];
#pragma unroll
    for (int t = 0; t < TC; ++t) {
      dp[t + 1][t] = 1.f;
#pragma unroll
      for (int j = t; j >= 0; --j) dp[j][t] = gt[par][j][0] * dp[j + 1][t];
    }
    float dl[TC][4];
#pragma unroll
    for (int t = 0; t < TC; ++t) {
      float o[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float acc = dp[0][t] * pk[t][e];  // decay_t S_{t-1}^T k_t
#pragma unroll
        for (int j = 0; j < t; ++j) acc = fmaf(dp[j + 1][t] * sc[0][j][t], dl[j][e], acc);
        dl[t][e] = gt[par][t][1] * (vf[t][e] - acc);
        float ov = dp[0][t] * pq[t][e];
#pragma unroll
        for (int j = 0; j <= t; ++j) ov = fmaf(dp[j + 1][t] * sc[1][j][t], dl[j][e], ov);
        o[e] = ov;
      }
      if (kt == 0 && t0 + t < p.t)
        store_bf16x4(p.out + (c.n * p.t + t0 + t) * out_row + c.hv * V + c.col0, o[0], o[1], o[2], o[3]);
    }
    // 6. The tile after the chunk: D(0, TC-1) S + sum_j D(j+1, TC-1) k_j delta_j^T (tokens past T: decay 1, delta 0).
    const bool last = t0 + TC >= p.t;
#pragma unroll 4
    for (int i = 0; i < R; ++i) {
      const int row = kt + i * KT;
      float4 s = tile[i][threadIdx.x];
      const float d0 = dp[0][TC - 1];
      s.x *= d0; s.y *= d0; s.z *= d0; s.w *= d0;
#pragma unroll
      for (int j = 0; j < TC; ++j) {
        const float w = dp[j + 1][TC - 1] * qk[par][j][1][row];
        s.x = fmaf(w, dl[j][0], s.x);
        s.y = fmaf(w, dl[j][1], s.y);
        s.z = fmaf(w, dl[j][2], s.z);
        s.w = fmaf(w, dl[j][3], s.w);
      }
      if (last) {
        store_state<0>(st + static_cast<int64_t>(kt + i * KT) * V, s);
      } else {
        tile[i][threadIdx.x] = s;
      }
    }
  }
#endif
}

// ---- removed: persistent shared-memory ring variant (decode_ps_kernel, DELTAKIT_GDR_DECODE=ps_*, harness ps_*) ----
// Persistent CTAs walking the tiles through a 2- or 3-stage cp.async ring of tile buffers, the next token's inputs
// prefetched (session 7). It passed the GPU tests, memcheck and racecheck but measured SLOWER than decode_sl_kernel at
// every shape on an H200: session 7 +3..+21% at T = 1 (bv64_nw1/nw2/nw4 with 2-3 stages, bv128_nw4_s3), +4..+60% at
// T = 4; session 8 (2026-12-02) bv64_nw8_s2 +4..+10% and bv64_nw4_s3 +3..+12% again, B = 1 included
// (docs/benchmarks/2026-12-01-gdrdec-s7.md, 2026-12-02-gdrdec-s8.md). Removed in session 8: it duplicated the sl
// kernel's token body. Those DELTAKIT_GDR_DECODE values now select the default dispatch, like any unknown value.

template <int K, int V, bool PRE = false, bool FG = false, bool WH = false, bool ALLT = false, bool PDL = false>
dk_status launch_reg(const Args& a, bool l2, cudaStream_t stream);

// The route log (DELTAKIT_GDR_DECODE_LOG=1, read once per process): one stderr line per routed call
// ("gdr.decode route: <kernel> n=.. t=.. h_v=.."), so tests and device calls can check which path a case takes.
inline bool route_log_on();
inline void route_log(const char* kernel, const Args& a);

// Whether the default's small-batch register tile (K = V = 128, the 16-column FG tile: < 128 (row, head) pairs, any
// T; 27B TP1 B <= 2, TP2 B <= 5, 9B TP1 B <= 3) runs as a programmatic dependent launch (decode_kernel's PDL; H200
// session 10, 20 calls in a CUDA graph behind an early-triggering kernel, B = 1: 2.94 / 2.01 us at 27B TP1 / TP2 vs
// 3.69 / 3.20 plain): on unless DELTAKIT_GDR_DECODE_NO_PDL=1 (kill switch, read once per process), and only where
// this library's image on the current device is the sm_90a one (griddepcontrol, the PDL attribute).
inline bool pdl_enabled() {
  static const bool off = dk::env_flag("DELTAKIT_GDR_DECODE_NO_PDL");
  if (off) return false;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return dk::sm90a_image(dev);
}

// Launches the TMA-fed persistent kernel: grid = min(items, SMs x resident CTAs per SM).
template <int K, int V, int BV, int NW, int NS, bool EF = false>
dk_status launch_tma(const Args& a, bool l2, cudaStream_t stream) {
  constexpr size_t smem = tma_smem_bytes<K, BV, NW, NS>();
  static_assert(smem <= 227 * 1024, "shared memory");
  const int64_t items = a.n * a.h_v * (V / BV);
  if (items == 0) return DK_OK;
  auto kern = l2 ? decode_tma_kernel<K, V, BV, NW, NS, true, EF> : decode_tma_kernel<K, V, BV, NW, NS, false, EF>;
  // Resident CTAs of this instantiation per device (shared-memory attribute set, SMs x CTAs per SM),
  // computed on the first call on each device; 0 = not yet known.
  constexpr int kMaxDevices = 64;
  static std::atomic<int64_t> caps[2][kMaxDevices];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return dk::launch_status();
  if (dev < 0 || dev >= kMaxDevices) return DK_ERR_UNSUPPORTED;
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return dk::launch_status();
  // Bulk copies need sm_90: the opt-in TMA path runs the default register kernel elsewhere, and wherever the loaded
  // image is not an sm_90a one (a JIT of an older arch's PTX compiles the kernel to a trap).
  if (major < 9 || !dk::sm90a_image(dev)) return launch_reg<K, V>(a, l2, stream);
  int64_t cap = caps[l2][dev].load(std::memory_order_relaxed);
  if (cap == 0) {
    int sms = 0, per_sm = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, NW * 32, smem) != cudaSuccess)
      return dk::launch_status();
    if (per_sm < 1) return DK_ERR_UNSUPPORTED;
    cap = static_cast<int64_t>(sms) * per_sm;
    caps[l2][dev].store(cap, std::memory_order_relaxed);
  }
  const int64_t grid = items < cap ? items : cap;
  kern<<<static_cast<unsigned>(grid), NW * 32, smem, stream>>>(a, items);
  return dk::launch_status();
}

// Launches one (K, V, BV, NW) configuration.
// PDL: the programmatic-dependent form (decode_kernel's PDL) where pdl_enabled() says so, else the plain kernel.
template <int K, int V, int BV, int NW, int LD = 0, int ST = 0, int MINB = 1, bool PRE = false, bool FG = false,
          bool PDL = false>
dk_status launch_cfg(const Args& a, bool l2, cudaStream_t stream) {
  static_assert(PRE || !FG, "FG only with PRE");
  const int64_t blocks = a.n * a.h_v * (V / BV);
  if (blocks == 0) return DK_OK;
  if (blocks > 0x7fffffffLL) return DK_ERR_INVALID_ARGUMENT;
  if constexpr (PDL) {
    if (pdl_enabled()) {
      route_log("register tile bv16_nw1 (PDL)", a);
      auto kern = l2 ? decode_kernel<K, V, BV, NW, true, LD, ST, MINB, PRE, FG, true>
                     : decode_kernel<K, V, BV, NW, false, LD, ST, MINB, PRE, FG, true>;
      (void)dk::launch_pdl(kern, dim3(static_cast<unsigned>(blocks)), dim3(NW * 32), 0, stream, a);
      return dk::launch_status();
    }
  }
  if (l2) {
    decode_kernel<K, V, BV, NW, true, LD, ST, MINB, PRE, FG><<<static_cast<unsigned>(blocks), NW * 32, 0, stream>>>(a);
  } else {
    decode_kernel<K, V, BV, NW, false, LD, ST, MINB, PRE, FG><<<static_cast<unsigned>(blocks), NW * 32, 0, stream>>>(a);
  }
  return dk::launch_status();
}


// Sets kern's preferred shared-memory carveout to the maximum on device dev, once per (kernel, device): `done` holds
// one bit per device (devices past 63 set it on every call). A per-function, per-device attribute: a driver call on
// every decode launch would cost host time in eager mode.
template <typename Kern>
cudaError_t max_carveout_once(Kern kern, int dev, std::atomic<uint64_t>& done) {
  const uint64_t bit = dev >= 0 && dev < 64 ? (uint64_t{1} << dev) : 0;
  if (bit != 0 && (done.load(std::memory_order_relaxed) & bit) != 0) return cudaSuccess;
  const cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributePreferredSharedMemoryCarveout, 100);
  if (e == cudaSuccess) done.fetch_or(bit, std::memory_order_relaxed);
  return e;
}

// Launches the shared-memory-landed kernel (K = V = 128), shared-memory carveout set to the maximum so that the
// tile (K * BV * 4 bytes per CTA) bounds the CTAs per SM.
template <int K, int V, int BV, int NW, int MINB = 1, int SX = 0>
dk_status launch_sl(const Args& a, bool l2, cudaStream_t stream) {
  static_assert(K == 128 && V == 128, "sl path: K = V = 128");
  const int64_t blocks = a.n * a.h_v * (V / BV);
  if (blocks == 0) return DK_OK;
  if (blocks > 0x7fffffffLL) return DK_ERR_INVALID_ARGUMENT;
  auto kern = l2 ? decode_sl_kernel<K, V, BV, NW, true, MINB, SX> : decode_sl_kernel<K, V, BV, NW, false, MINB, SX>;
  static std::atomic<uint64_t> carveout_set[2];  // per l2 instantiation: max_carveout_once's device bits
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return dk::launch_status();
  if (max_carveout_once(kern, dev, carveout_set[l2]) != cudaSuccess) return dk::launch_status();
  kern<<<static_cast<unsigned>(blocks), NW * 32, 0, stream>>>(a);
  return dk::launch_status();
}

// DELTAKIT_GDR_DECODE_LOG=1 (read once per process): every K = V = 128 call prints the kernel it launches to stderr
// ("gdr.decode route: <kernel> n=.. t=.. h_v=.."), so tests and device calls can check which path a case takes.
inline bool route_log_on() {
  static const bool on = dk::env_flag("DELTAKIT_GDR_DECODE_LOG");
  return on;
}
inline void route_log(const char* kernel, const Args& a) {
  if (route_log_on())
    std::fprintf(stderr, "gdr.decode route: %s n=%lld t=%lld h_v=%lld\n", kernel, static_cast<long long>(a.n),
                 static_cast<long long>(a.t), static_cast<long long>(a.h_v));
}

// Launches the chunked multi-token shared-memory kernel (K = V = 128; carveout as launch_sl).
template <int K, int V, int BV, int NW, int MINB, int TC>
dk_status launch_slc(const Args& a, bool l2, cudaStream_t stream) {
  static_assert(K == 128 && V == 128, "slc path: K = V = 128");
  const int64_t blocks = a.n * a.h_v * (V / BV);
  if (blocks == 0) return DK_OK;
  if (blocks > 0x7fffffffLL) return DK_ERR_INVALID_ARGUMENT;
  auto kern = l2 ? decode_slc_kernel<K, V, BV, NW, true, MINB, TC> : decode_slc_kernel<K, V, BV, NW, false, MINB, TC>;
  static std::atomic<uint64_t> carveout_set[2];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return dk::launch_status();
  // The kernel's 49.4 KB of static shared memory only fit sm_90: images for older archs compile it to a trap. Whether
  // the image loaded on this device has the body (not: a device below 9.0, or any device JIT-compiling an older arch's
  // PTX, e.g. a DELTAKIT_CUDA_ARCHS=80 build on an H100 or an 80;90a build on a newer GPU) is read from the kernel's
  // static shared memory (0 in the trap stub), once per (instantiation, device); without the body the default
  // register tiles run instead (the forced path included).
  static std::atomic<int> body[2][64];  // 0 unknown, 1 body compiled in, 2 trap stub
  int has_body = dev >= 0 && dev < 64 ? body[l2][dev].load(std::memory_order_relaxed) : 0;
  if (has_body == 0) {
    cudaFuncAttributes attr;
    if (cudaFuncGetAttributes(&attr, kern) != cudaSuccess) return dk::launch_status();
    has_body = attr.sharedSizeBytes > 0 ? 1 : 2;
    if (dev >= 0 && dev < 64) body[l2][dev].store(has_body, std::memory_order_relaxed);
  }
  if (has_body != 1) {
    route_log("register tiles (slc not in this image)", a);
    return launch_reg<K, V, true, true, false, true>(a, l2, stream);
  }
  if (max_carveout_once(kern, dev, carveout_set[l2]) != cudaSuccess) return dk::launch_status();
  route_log("slc_bv64_nw4", a);
  kern<<<static_cast<unsigned>(blocks), NW * 32, 0, stream>>>(a);
  return dk::launch_status();
}

// Below this many (row, head, 64-column) tiles a T = 1 call is latency-bound and the small tile
// (more, lighter CTAs) wins; above it the 64-column tile streams closest to the copy ceiling.
constexpr int64_t kWideTileMinTiles = 512;
// The same threshold for the FG kernels (the K = V = 128 default): the 64-column FG tile already wins at
// 192 (row, head) pairs = 384 tiles (27B TP1 B=4: 11.1 vs 12.4 us for the 16-column FG tile, 11.3 for the
// old exact 16-column one; T = 4: 15.1 vs 18.2 / 15.5), the 16-column FG tile at 96 pairs = 192 tiles
// (7.3 vs 8.5 us; T = 4: 10.5 vs 11.9); in between unmeasured (H200, 2026-12-01 session 4).
constexpr int64_t kWideTileMinTilesFg = 256;

// Configuration choice, from the sweep of tools/tune/gdr_decode_tune.cu on an H200 (KERNELS.md):
// T = 1 with enough tiles: BV = 64, 2 warps (R = K/4 rows per thread, ~250 registers, 4 CTAs/SM,
// 32 KB of state in flight per CTA); otherwise (small batches, and T > 1 where the per-token
// chain dominates) BV = 16, 1 warp (no CTA barrier at all).
//
// K = V = 128 with T = 1 and kWholeHeadMinHeads..kWholeHeadMaxHeads (row, head) pairs: one CTA per
// whole head (BV = 128, 4 warps, R = 32 rows per thread), register use capped for 3 CTAs per SM
// (168 registers; the kernels without PRE spill nothing, the PRE ones -- the dispatched FG tile, and the exact
// one with the q/k L2 norm -- 16 bytes (ptxas, sm_90a): four of token 0's prefetched inputs, 4 STL before the
// token loop and 4 LDL at token 0, once per thread, L1-resident), so the grid is one wave of <= 396 CTAs on an
// H200: 27B TP2 batch 16 (384 heads) 17.7 us vs 18.9 us L2-cold (13.7 vs 14.4 us warm). With more heads (several waves)
// it is 1-3.5% slower than the 64-column tile (tools/bench_anchors_gdr.py sweep, 2026-12-01).
constexpr int64_t kWholeHeadMinHeads = 256;
constexpr int64_t kWholeHeadMaxHeads = 400;

// K = V = 128, T = 1, from this many (row, head) pairs (768 64-column tiles, 27B TP2 batch 16 / TP1 batch 8): the
// shared-memory-landed tile decode_sl_kernel<64 columns, 4 warps, 5 CTAs/SM> (launch_sl<64, 4, 5>) instead of the
// register tiles (the whole-head one at 384..400 pairs, the 64-column one above). H200, L2-cold us:
// session 6, register tile -> sl with 2 warps: TP1 B=16 30.8 -> 30.0, B=64 106.1 -> 104.4, B=256 413.3 -> 402.2; TP2
// B=64 56.5 -> 55.4, B=256 211.1 -> 206.0 (that was the default from 768 pairs, sessions 6-7). Session 8
// (2026-12-02, one call), sl 2 warps -> 4 warps (20 instead of 10 warps per SM, the same 160 KB of tile per SM):
// TP1 B=16 29.6 -> 29.1, B=64 103.6 -> 103.4, B=256 400.0 -> 399.5; TP2 B=64 55.3 -> 54.6, B=256 204.5 -> 204.4 (a tie
// from 64 rows, warm within +0.1%); TP2 B=16 (384 pairs) whole-head tile 17.1 -> 16.6 (warm 14.0 -> 12.4). 385..767
// pairs unmeasured (both ends in favour). T > 1 keeps the register tiles (sl 12-27% slower at T = 4 B = 16 / 64,
// session 6: the tile is re-read from shared memory every token).
constexpr int64_t kSlMinHeads = 384;

// K = V = 128, T > 1: the chunked multi-token tile decode_slc_kernel (4 tokens per chunk: one state pass per chunk)
// where it measured faster than the register tiles, H200 2026-12-02 (session 8, L2-cold us, slc vs the dispatch):
// T = 4: TP1 B=16 33.2 vs 40.4, B=64 115.1 vs 130.3, B=256 434.7 vs 543.2; TP2 B=16 (384 pairs) 20.4 vs 22.8, B=64
// 61.1 vs 70.6, B=256 223.3 vs 274.6 (T = 4 at 1.09-1.11x the T = 1 time; FLA 46.1 / 152.6 / 27.4 / 81.9 at TP1 B=16,
// B=64, TP2 B=16, B=64). T = 8: TP1 B=64 (3,072 pairs) 186.9 vs 214.1, but TP2 B=16 (384 pairs) 32.3 vs 31.0. T = 2
// loses (109.7 vs 108.5 at TP1 B=64: half the chunk is padding); other T not measured (a partial chunk costs a whole
// one, so T = 5..7 would pay for 8). Hence: T = 4 from kSlMinHeads pairs, T = 8 from 3,072 pairs.
constexpr int64_t kSlcT8MinHeads = 3072;
inline bool slc_default(int64_t t, int64_t heads) {
  return (t == 4 && heads >= kSlMinHeads) || (t == 8 && heads >= kSlcT8MinHeads);
}

// Decode path override, DELTAKIT_GDR_DECODE (read once per process; unset or any other value =
// kAuto, the tuned dispatch of launch_kv: for K = V = 128 the PRE + FG kernels with the tile rule
// for every T); "reg" = the exact register kernels with the T = 1-only tile rule (the dispatch
// before 2026-12-01 session 4); "reg_exact" = the default's tiles with the exact PRE kernels
// (K = V = 128; libm expf / log1pf / IEEE divisions in the gating); "tma_bv64_nw4_s3", "tma_bv64_nw4_s2", "tma_bv128_nw8_s2",
// "tma_bv32_nw2_s4" = the TMA-fed persistent kernel in that configuration for every call with K, V in
// {64, 128} (any T, any batch; V = 64 takes BV = 64 where the named BV is 128; K = 64 or V = 64
// always take tma_bv64_nw4_s3's tile); "reg_pre" = the register dispatch with the PRE kernels
// (decode_kernel<..., PRE = true>; K = V = 128 only, other dims as "reg"); "reg_bv128" = the whole-head
// register tile (BV = 128, 4 warps, 3 CTAs/SM) for every K = V = 128 call (any T, any batch; measured
// 6-16% ahead of FLA at T = 4); "reg_pre_bv128" = "reg_pre" for T = 1 and the whole-head PRE tile for
// T > 1 with >= 256 (row, head) pairs (K = V = 128; a candidate default); "reg_fg" = the same tiles with the FG kernels (PRE + gating /
// norm math through the hardware approximations; a candidate default); "sl_bv64_nw1", "sl_bv64_nw2", "sl_bv64_nw4" = the
// shared-memory-landed kernel (decode_sl_kernel: 64-column tile, 1 / 2 / 4 warps; nw4 is the default's T = 1 tile from
// kSlMinHeads pairs, nw2 the one before 2026-12-02) for every K = V = 128 call (other K, V: the default dispatch);
// "reg_tiles" = the default without its sl route (the register-tile dispatch that was the default until 2026-12-01
// session 5); "slc_bv64_nw4" = the chunked multi-token shared-memory kernel (decode_slc_kernel, 4 tokens per chunk;
// session 8; the default for T = 4 from kSlMinHeads pairs and T = 8 from kSlcT8MinHeads) for every K = V = 128 call. Small head dims are unaffected. (A cluster split-K kernel, "cl*_nw*", measured 1.03-2x slower on an H200
// and was removed: docs/benchmarks/2026-12-01-gdrdec-s5.md; the persistent ring kernel "ps_*" measured 3-21% slower
// and was removed in session 8: docs/benchmarks/2026-12-02-gdrdec-s8.md.)
// For tests and measurements.
enum class Path {
  kAuto, kReg, kTma64S3, kTma64S2, kTma128S2, kTma32S4, kRegPre, kRegBv128, kRegPreBv128, kRegFg, kRegExact,
  kSl64Nw1, kSl64Nw2, kSl64Nw4, kRegTiles, kSlc64Nw4
};

inline Path path_selected() {
  static const Path path = [] {
    const char* e = std::getenv("DELTAKIT_GDR_DECODE");
    if (e == nullptr) return Path::kAuto;
    if (std::strcmp(e, "reg") == 0) return Path::kReg;
    if (std::strcmp(e, "tma_bv64_nw4_s3") == 0) return Path::kTma64S3;
    if (std::strcmp(e, "tma_bv64_nw4_s2") == 0) return Path::kTma64S2;
    if (std::strcmp(e, "tma_bv128_nw8_s2") == 0) return Path::kTma128S2;
    if (std::strcmp(e, "tma_bv32_nw2_s4") == 0) return Path::kTma32S4;
    if (std::strcmp(e, "reg_pre") == 0) return Path::kRegPre;
    if (std::strcmp(e, "reg_bv128") == 0) return Path::kRegBv128;
    if (std::strcmp(e, "reg_pre_bv128") == 0) return Path::kRegPreBv128;
    if (std::strcmp(e, "reg_fg") == 0) return Path::kRegFg;
    if (std::strcmp(e, "reg_exact") == 0) return Path::kRegExact;
    if (std::strcmp(e, "sl_bv64_nw1") == 0) return Path::kSl64Nw1;
    if (std::strcmp(e, "sl_bv64_nw2") == 0) return Path::kSl64Nw2;
    if (std::strcmp(e, "sl_bv64_nw4") == 0) return Path::kSl64Nw4;
    if (std::strcmp(e, "slc_bv64_nw4") == 0) return Path::kSlc64Nw4;
    if (std::strcmp(e, "reg_tiles") == 0) return Path::kRegTiles;
    return Path::kAuto;
  }();
  return path;
}

// The register-tile dispatch (see kWideTileMinTiles / kWholeHeadMinHeads); PRE selects the
// decode_kernel variant that loads token 0's inputs first (path "reg_pre").
// WH: T > 1 with K = V = 128 and >= kWholeHeadMinHeads (row, head) pairs takes the whole-head tile
// (paths "reg_pre_bv128", "reg_fg"). ALLT: the T = 1 tile rule for every T (the default for
// K = V = 128: at T = 4 the 64-column FG tile is 4% faster than the whole-head one from 1536 pairs,
// the whole-head one 9% faster at 384 pairs; both 15-20% faster than BV = 16, which the earlier
// dispatch took for every T > 1). FG: the FG kernels (with PRE).
template <int K, int V, bool PRE, bool FG, bool WH, bool ALLT, bool PDL>
dk_status launch_reg(const Args& a, bool l2, cudaStream_t stream) {
  const bool wide_t = a.t == 1 || ALLT;
  if constexpr (K == 128 && V == 128) {
    const int64_t heads = a.n * a.h_v;
    if ((WH && a.t > 1 && heads >= kWholeHeadMinHeads) ||
        (wide_t && heads >= kWholeHeadMinHeads && heads <= kWholeHeadMaxHeads))
      return launch_cfg<K, V, 128, 4, 0, 0, 3, PRE, FG>(a, l2, stream);
  }
  if (wide_t && a.n * a.h_v * (V / 64) >= (FG ? kWideTileMinTilesFg : kWideTileMinTiles))
    return launch_cfg<K, V, 64, 2, 0, 0, 1, PRE, FG>(a, l2, stream);
  return launch_cfg<K, V, 16, 1, 0, 0, 1, PRE, FG, PDL && PRE && K == 128 && V == 128>(a, l2, stream);
}

// The default (kAuto) is the register-tile dispatch (K = V = 128: PRE + FG kernels, tile rule for every
// T; H200 2026-12-01 vs the previous dispatch: T = 1 -1..-14%, T = 4 -3..-21%) with the shared-memory-landed
// tile for K = V = 128, T = 1 from kSlMinHeads (row, head) pairs (session 6: -1.6..-2.7%) and the chunked
// multi-token tile where slc_default says (T = 4 / 8, session 8: -10..-20%): the TMA-fed kernel
// passed every test but measured
// 1.2-1.5x slower at every 27B shape (H200, 2026-12-01 session 4: TP1 B=64 163.9 us for 64/4/3, 129.8 for
// 128/4/2 vs 107.2 for the register 64-column tile; ncu: DRAM 48%, 12.5% occupancy — each CTA's per-item
// chain (stage wait, q/k/v/gate loads issued only then, gating math, reductions, barriers) is serial, so
// 2 CTAs per SM cannot keep the bandwidth up however deep the ring).
template <int K, int V>
dk_status launch_kv(const Args& a, bool l2, cudaStream_t stream) {
  const Path path = path_selected();
  if (path == Path::kAuto || path == Path::kRegExact || path == Path::kRegTiles) {
    if constexpr (K == 128 && V == 128) {
      if (path == Path::kRegExact) return launch_reg<K, V, true, false, false, true>(a, l2, stream);
      if (path == Path::kAuto && a.t == 1 && a.n * a.h_v >= kSlMinHeads) {
        route_log("sl_bv64_nw4", a);
        return launch_sl<K, V, 64, 4, 5>(a, l2, stream);
      }
      if (path == Path::kAuto && slc_default(a.t, a.n * a.h_v)) return launch_slc<K, V, 64, 4, 3, 4>(a, l2, stream);
      route_log("register tiles", a);
      return launch_reg<K, V, true, true, false, true, true>(a, l2, stream);
    }
    return launch_reg<K, V>(a, l2, stream);
  }
  if (path == Path::kReg) return launch_reg<K, V>(a, l2, stream);
  if (path == Path::kSlc64Nw4) {
    if constexpr (K == 128 && V == 128) return launch_slc<K, V, 64, 4, 3, 4>(a, l2, stream);  // 123 registers, 0 spills: 4 CTAs/SM
    return launch_reg<K, V>(a, l2, stream);  // other head dims: the default register dispatch
  }
  if (path == Path::kSl64Nw1 || path == Path::kSl64Nw2 || path == Path::kSl64Nw4) {
    if constexpr (K == 128 && V == 128) {
      if (path == Path::kSl64Nw1) return launch_sl<K, V, 64, 1>(a, l2, stream);
      if (path == Path::kSl64Nw4) return launch_sl<K, V, 64, 4, 5>(a, l2, stream);
      return launch_sl<K, V, 64, 2, 5>(a, l2, stream);
    }
    return launch_reg<K, V>(a, l2, stream);  // other head dims: the default register dispatch
  }
  if (path == Path::kRegPre || path == Path::kRegBv128 || path == Path::kRegPreBv128 || path == Path::kRegFg) {
    if constexpr (K == 128 && V == 128) {
      if (path == Path::kRegPre) return launch_reg<K, V, true>(a, l2, stream);
      if (path == Path::kRegPreBv128) return launch_reg<K, V, true, false, true>(a, l2, stream);
      if (path == Path::kRegFg) return launch_reg<K, V, true, true, true>(a, l2, stream);
      return launch_cfg<K, V, 128, 4, 0, 0, 3>(a, l2, stream);
    }
    return launch_reg<K, V>(a, l2, stream);
  }
  if constexpr (K == 128 && V == 128) {
    if (path == Path::kTma64S2) return launch_tma<K, V, 64, 4, 2>(a, l2, stream);
    if (path == Path::kTma128S2) return launch_tma<K, V, 128, 8, 2>(a, l2, stream);
    if (path == Path::kTma32S4) return launch_tma<K, V, 32, 2, 4>(a, l2, stream);
  }
  return launch_tma<K, V, 64, 4, 3>(a, l2, stream);
}

// Small head dims (K in {16, 32} and / or V in {16, 32}): always the BV = 16, 1-warp configuration (the
// only one whose V tile fits V = 16; performance is irrelevant at these sizes).
template <int K, int V>
dk_status launch_small(const Args& a, bool l2, cudaStream_t stream) {
  return launch_cfg<K, V, 16, 1>(a, l2, stream);
}

// The kernels' arguments from the C ABI parameters (pointers reinterpreted, nothing checked: callers validate).
inline Args args_of(const DkGdrDecodeParams* p) {
  Args a;
  a.q = reinterpret_cast<const __nv_bfloat16*>(p->q);
  a.k = reinterpret_cast<const __nv_bfloat16*>(p->k);
  a.v = reinterpret_cast<const __nv_bfloat16*>(p->v);
  a.a = reinterpret_cast<const __nv_bfloat16*>(p->a);
  a.b = reinterpret_cast<const __nv_bfloat16*>(p->b);
  a.a_log = reinterpret_cast<const float*>(p->a_log);
  a.dt_bias = reinterpret_cast<const float*>(p->dt_bias);
  a.slots = reinterpret_cast<const int32_t*>(p->slots);
  a.state = reinterpret_cast<float*>(p->state);
  a.out = reinterpret_cast<__nv_bfloat16*>(p->out);
  a.n = p->n;
  a.t = p->t;
  a.h_k = p->h_k;
  a.h_v = p->h_v;
  a.num_slots = p->num_slots;
  a.q_stride = p->q_stride;
  a.k_stride = p->k_stride;
  a.v_stride = p->v_stride;
  a.ab_stride = p->ab_stride;
  a.scale = p->scale;
  return a;
}

}  // namespace gdr_decode_impl

extern "C" dk_status dk_gdr_decode(const DkGdrDecodeParams* p, dk_stream_t stream) {
  using namespace gdr_decode_impl;
  if (p == nullptr) return DK_ERR_INVALID_ARGUMENT;
  if (p->n < 0 || p->t < 1 || p->h_k < 1 || p->h_v < 1 || p->num_slots < 0) return DK_ERR_INVALID_ARGUMENT;
  if (p->h_v % p->h_k != 0) return DK_ERR_INVALID_ARGUMENT;
  const bool k_ok = p->k_dim == 16 || p->k_dim == 32 || p->k_dim == 64 || p->k_dim == 128;
  const bool v_ok = p->v_dim == 16 || p->v_dim == 32 || p->v_dim == 64 || p->v_dim == 128;
  if (!k_ok || !v_ok) return DK_ERR_UNSUPPORTED;
  if (p->n == 0) return DK_OK;
  // Vector accesses: q, k, v, out (8-byte bf16x4 / 4-byte bf16x2), state (16-byte float4).
  const uint64_t vec_ptrs[] = {p->q, p->k, p->v, p->state, p->out};
  for (uint64_t x : vec_ptrs) {
    if (x == 0 || x % 16 != 0) return DK_ERR_INVALID_ARGUMENT;
  }
  if (p->a == 0 || p->b == 0 || p->a % 2 != 0 || p->b % 2 != 0) return DK_ERR_INVALID_ARGUMENT;
  const uint64_t f32_ptrs[] = {p->a_log, p->dt_bias, p->slots};
  for (uint64_t x : f32_ptrs) {
    if (x == 0 || x % 4 != 0) return DK_ERR_INVALID_ARGUMENT;
  }
  if (p->q_stride < p->h_k * p->k_dim || p->k_stride < p->h_k * p->k_dim ||
      p->v_stride < p->h_v * p->v_dim || p->ab_stride < p->h_v)
    return DK_ERR_INVALID_ARGUMENT;
  if (p->q_stride % 8 != 0 || p->k_stride % 8 != 0 || p->v_stride % 8 != 0) return DK_ERR_INVALID_ARGUMENT;
  const Args a = args_of(p);
  const bool l2 = p->use_qk_l2norm != 0;
  if (p->k_dim < 64 || p->v_dim < 64) {
    switch (p->k_dim * 1000 + p->v_dim) {
      case 16016: return launch_small<16, 16>(a, l2, stream);
      case 16032: return launch_small<16, 32>(a, l2, stream);
      case 16064: return launch_small<16, 64>(a, l2, stream);
      case 16128: return launch_small<16, 128>(a, l2, stream);
      case 32016: return launch_small<32, 16>(a, l2, stream);
      case 32032: return launch_small<32, 32>(a, l2, stream);
      case 32064: return launch_small<32, 64>(a, l2, stream);
      case 32128: return launch_small<32, 128>(a, l2, stream);
      case 64016: return launch_small<64, 16>(a, l2, stream);
      case 64032: return launch_small<64, 32>(a, l2, stream);
      case 128016: return launch_small<128, 16>(a, l2, stream);
      case 128032: return launch_small<128, 32>(a, l2, stream);
      default: return DK_ERR_UNSUPPORTED;
    }
  }
  if (p->k_dim == 128 && p->v_dim == 128) return launch_kv<128, 128>(a, l2, stream);
  if (p->k_dim == 128 && p->v_dim == 64) return launch_kv<128, 64>(a, l2, stream);
  if (p->k_dim == 64 && p->v_dim == 128) return launch_kv<64, 128>(a, l2, stream);
  return launch_kv<64, 64>(a, l2, stream);
}
