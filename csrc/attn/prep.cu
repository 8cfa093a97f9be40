// attn.prep: q/gate split + q/k RMSNorm (1+w) + partial NeoX RoPE + paged KV write, one pass.
// Layouts: see csrc/include/attn.h. Thread mapping: grid (tokens, head groups): a CTA of 4 warps
// takes one token's heads h = blockIdx.y * 4 + warp (+ 4 * gridDim.y ...), so a decode step's few
// tokens still spread over many SMs (one CTA per token took 27 us per layer at 9B batch 1 on an
// H200: 24 heads walked by 4 warps of one SM, ncu 2026-12-01); thread 0 finds
// the token's sequence by binary search over cu_seqlens and the position; the first rotary_dim/2
// threads compute the (cos, sin) pairs once per token into shared memory; then each warp takes
// whole heads (HQ query heads, HKV key heads, HKV value heads): every lane holds HD/32 elements
// (strided by 32), the sum of squares is reduced in f64 with warp shuffles, the normalized row
// goes through a per-warp shared buffer so RoPE can pair element i with i + rotary_dim/2.
// Rounding points match deltakit_ref::attn::{qk_norm, rope_neox} exactly.
#include <cuda_bf16.h>

#include "../common/launch.cuh"

namespace {

constexpr int kWarps = 4;
constexpr int kMaxHd = 256;

__device__ __forceinline__ float bf16_round(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

template <int E>  // elements per lane: HD / 32
__device__ void norm_rope_store(const __nv_bfloat16* __restrict__ src, const __nv_bfloat16* __restrict__ w,
                                float eps, int hd, int rot_half, const float2* cs, float* buf,
                                __nv_bfloat16* __restrict__ dst, int lane) {
  float x[E];
  double ss = 0.0;
#pragma unroll
  for (int j = 0; j < E; ++j) {
    x[j] = __bfloat162float(src[lane + 32 * j]);
    ss += static_cast<double>(x[j]) * static_cast<double>(x[j]);
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
  const float ms = static_cast<float>(ss / static_cast<double>(hd));
  const float inv = 1.0f / sqrtf(ms + eps);
#pragma unroll
  for (int j = 0; j < E; ++j) {
    const int i = lane + 32 * j;
    const float w1 = 1.0f + __bfloat162float(w[i]);
    buf[i] = bf16_round(__fmul_rn(__fmul_rn(x[j], inv), w1));
  }
  __syncwarp();
#pragma unroll
  for (int j = 0; j < E; ++j) {
    const int i = lane + 32 * j;
    float y = buf[i];
    if (i < rot_half) {
      const float2 c = cs[i];
      const float x1 = buf[i], x2 = buf[i + rot_half];
      y = bf16_round(__fmul_rn(x1, c.x)) + bf16_round(__fmul_rn(-x2, c.y));
    } else if (i < 2 * rot_half) {
      const float2 c = cs[i - rot_half];
      const float x1 = buf[i - rot_half], x2 = buf[i];
      y = bf16_round(__fmul_rn(x2, c.x)) + bf16_round(__fmul_rn(x1, c.y));
    }
    dst[i] = __float2bfloat16_rn(y);
  }
  __syncwarp();  // buf is reused by the warp's next head
}

template <int E>
__global__ void __launch_bounds__(kWarps * 32) attn_prep_kernel(DkAttnPrepParams p) {
  __shared__ float2 cs[kMaxHd / 2];
  __shared__ float bufs[kWarps][kMaxHd];
  __shared__ int64_t s_pos;  // absolute position, or -1 for a padding token
  __shared__ int64_t s_seq;
  const int64_t t = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int hd = static_cast<int>(p.head_dim);
  const int rot_half = static_cast<int>(p.rotary_dim / 2);
  if (threadIdx.x == 0) {
    const int32_t* cu = reinterpret_cast<const int32_t*>(p.cu_seqlens);
    // Last sequence s with cu[s] <= t (cu is non-decreasing; validated by the wrapper).
    int64_t lo = 0, hi = p.num_seqs - 1;
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      if (cu[mid] <= t) lo = mid; else hi = mid - 1;
    }
    const int64_t ctx = reinterpret_cast<const int32_t*>(p.ctx_lens)[lo];
    s_seq = lo;
    s_pos = ctx < 0 ? -1 : ctx + (t - cu[lo]);
  }
  __syncthreads();
  const int64_t pos = s_pos;
  const int64_t nq = p.n_q_heads, nkv = p.n_kv_heads;
  auto* q_out = reinterpret_cast<__nv_bfloat16*>(p.q_out) + t * nq * hd;
  auto* gate_out = reinterpret_cast<__nv_bfloat16*>(p.gate_out) + t * nq * hd;
  const int64_t h0 = static_cast<int64_t>(blockIdx.y) * kWarps + warp;
  const int64_t hstep = static_cast<int64_t>(gridDim.y) * kWarps;
  if (pos < 0) {
    for (int64_t h = h0; h < nq; h += hstep) {
      for (int i = lane; i < hd; i += 32) {
        q_out[h * hd + i] = __float2bfloat16_rn(0.0f);
        gate_out[h * hd + i] = __float2bfloat16_rn(0.0f);
      }
    }
    return;
  }
  if (threadIdx.x < rot_half) {
    const int i = threadIdx.x;
    const float inv_freq = static_cast<float>(
        1.0 / pow(static_cast<double>(p.theta), static_cast<double>(2 * i) / static_cast<double>(p.rotary_dim)));
    const double ang = static_cast<double>(__fmul_rn(static_cast<float>(pos), inv_freq));
    cs[i] = make_float2(bf16_round(static_cast<float>(cos(ang))), bf16_round(static_cast<float>(sin(ang))));
  }
  __syncthreads();
  // Cache row of this token (or -1 when its page entry is invalid).
  const int64_t page_idx = pos / p.page_size;
  int64_t cache_row = -1;
  if (page_idx < p.max_pages) {
    const int64_t page = reinterpret_cast<const int32_t*>(p.page_table)[s_seq * p.max_pages + page_idx];
    if (page >= 0 && page < p.num_pages) cache_row = page * p.page_size + pos % p.page_size;
  }
  const auto* qg = reinterpret_cast<const __nv_bfloat16*>(p.qg) + t * p.sqg;
  const auto* kin = reinterpret_cast<const __nv_bfloat16*>(p.k) + t * p.sk;
  const auto* vin = reinterpret_cast<const __nv_bfloat16*>(p.v) + t * p.sv;
  const auto* qw = reinterpret_cast<const __nv_bfloat16*>(p.q_norm_w);
  const auto* kw = reinterpret_cast<const __nv_bfloat16*>(p.k_norm_w);
  auto* kc = reinterpret_cast<__nv_bfloat16*>(p.k_cache);
  auto* vc = reinterpret_cast<__nv_bfloat16*>(p.v_cache);
  float* buf = bufs[warp];
  for (int64_t h = h0; h < nq + 2 * nkv; h += hstep) {
    if (h < nq) {
      const __nv_bfloat16* src = qg + h * 2 * hd;
      norm_rope_store<E>(src, qw, p.eps, hd, rot_half, cs, buf, q_out + h * hd, lane);
#pragma unroll
      for (int j = 0; j < E; ++j) gate_out[h * hd + lane + 32 * j] = src[hd + lane + 32 * j];
    } else if (h < nq + nkv) {
      if (cache_row < 0) continue;
      const int64_t kh = h - nq;
      norm_rope_store<E>(kin + kh * hd, kw, p.eps, hd, rot_half, cs, buf, kc + (cache_row * nkv + kh) * hd, lane);
    } else {
      if (cache_row < 0) continue;
      const int64_t vh = h - nq - nkv;
#pragma unroll
      for (int j = 0; j < E; ++j) vc[(cache_row * nkv + vh) * hd + lane + 32 * j] = vin[vh * hd + lane + 32 * j];
    }
  }
}

}  // namespace

extern "C" dk_status dk_attn_prep(const DkAttnPrepParams* p, dk_stream_t stream) {
  if (p == nullptr || p->num_tokens < 0 || p->num_seqs <= 0 || p->n_q_heads <= 0 || p->n_kv_heads <= 0 ||
      p->rotary_dim <= 0 || p->rotary_dim % 2 != 0 || p->rotary_dim > p->head_dim || p->page_size <= 0 ||
      p->max_pages <= 0 || p->num_pages <= 0 || p->sqg < 2 * p->n_q_heads * p->head_dim ||
      p->sk < p->n_kv_heads * p->head_dim || p->sv < p->n_kv_heads * p->head_dim || !(p->theta > 0.0f) ||
      !(p->eps >= 0.0f) || p->num_tokens > 0x7fffffff)
    return DK_ERR_INVALID_ARGUMENT;
  if (p->num_tokens == 0) return DK_OK;
  if (!p->qg || !p->k || !p->v || !p->q_norm_w || !p->k_norm_w || !p->q_out || !p->gate_out || !p->k_cache ||
      !p->v_cache || !p->cu_seqlens || !p->ctx_lens || !p->page_table)
    return DK_ERR_INVALID_ARGUMENT;
  const int64_t groups = dk::ceil_div(p->n_q_heads + 2 * p->n_kv_heads, static_cast<int64_t>(kWarps));
  if (groups > 65535) return DK_ERR_INVALID_ARGUMENT;
  const dim3 grid(static_cast<unsigned>(p->num_tokens), static_cast<unsigned>(groups));
  switch (p->head_dim) {
    case 64: attn_prep_kernel<2><<<grid, kWarps * 32, 0, stream>>>(*p); break;
    case 128: attn_prep_kernel<4><<<grid, kWarps * 32, 0, stream>>>(*p); break;
    case 256: attn_prep_kernel<8><<<grid, kWarps * 32, 0, stream>>>(*p); break;
    default: return DK_ERR_UNSUPPORTED;
  }
  return dk::launch_status();
}
