// sample.top_p: seeded temperature / top-p (nucleus) sampling, one token per row, bitwise equal to
// deltakit_ref::sample::top_p_sample (the definition lives there; this file computes the same
// numbers with the same f32/f64 operations, written as explicitly rounded intrinsics so nvcc can
// neither contract nor reorder them).
//
// Layout: logits bf16 [rows, vocab] contiguous; temperature f32, top_p f32, seed u64, counter u64,
// ids i32, all [rows]. Thread mapping: one CTA of 1024 threads per row, up to four passes over the
// row (L2-resident after the first):
//   1. NaN flag, max m and argmax (ties to the lowest index). NaN row -> -1; greedy row
//      (temperature NaN / <= 0 / 1/T overflowing f32) -> argmax.
//   2. fixed-point weights q_j = weight(x_j, m, 1/T) (~2^32 exp((x_j - m)/T), u64), their total W,
//      and a 256-bin histogram of q by the high byte of the 16-bit order key (u64 shared atomics on
//      lane-private copies: integer sums, order independent).
//      need = clamp(trunc(f64(top_p) * f64(W)), 1, W); suffix scan -> high byte hb of the
//      threshold key (the largest key whose suffix mass reaches need).
//   3. low-byte histogram of q inside hb -> the threshold key Tk and the kept mass M (all tokens
//      with key >= Tk, ties at the threshold all kept).
//   4. draw: u = (splitmix64(seed ^ splitmix64(counter)) >> 11) * 2^-53,
//      target = min(trunc(u * f64(M)), M - 1); tiles in index order, block exclusive scan of the
//      per-thread kept mass; the thread whose range holds target rescans its <= 8 elements and
//      writes the first token whose inclusive prefix exceeds target.
#include <float.h>

#include "common.cuh"

namespace {

using namespace dk_sample;

constexpr int kCopies = 16;  // u64 histogram copies (32 KiB)

__device__ __forceinline__ uint64_t splitmix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// deltakit_ref::sample::weight, operation for operation (constants are the same f32 bit patterns).
__device__ __forceinline__ unsigned long long weight(float x, float m, float inv_t) {
  const float d = (x == m) ? 0.0f : __fsub_rn(x, m);
  const float e = __fmul_rn(d, inv_t);
  if (!(e >= -23.0f)) return 0ull;
  const float n = __fsub_rn(__fmaf_rn(e, 0x1.715476p+0f, 12582912.0f), 12582912.0f);
  float r = __fmaf_rn(-n, 0x1.63p-1f, e);
  r = __fmaf_rn(-n, -0x1.bd0106p-13f, r);
  float p = 0x1.a01a02p-13f;
  p = __fmaf_rn(p, r, 0x1.6c16c2p-10f);
  p = __fmaf_rn(p, r, 0x1.111112p-7f);
  p = __fmaf_rn(p, r, 0x1.555556p-5f);
  p = __fmaf_rn(p, r, 0x1.555556p-3f);
  p = __fmaf_rn(p, r, 0.5f);
  p = __fmaf_rn(p, r, 1.0f);
  p = __fmaf_rn(p, r, 1.0f);
  const float scale = __uint_as_float(static_cast<uint32_t>(static_cast<int>(n) + 32 + 127) << 23);
  return __float2ull_rz(__fmul_rn(p, scale));
}

// (value, index) with ties to the lower index; NaN-free values.
struct Best {
  float v;
  int64_t i;
};

__device__ __forceinline__ Best better(Best a, Best b) {
  const bool take_b = (b.v > a.v) || (b.v == a.v && b.i < a.i);
  return take_b ? b : a;
}

__device__ __forceinline__ Best warp_best(Best b) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    Best o;
    o.v = __shfl_xor_sync(0xffffffffu, b.v, off);
    o.i = __shfl_xor_sync(0xffffffffu, b.i, off);
    b = better(b, o);
  }
  return b;
}

// Block argmax (every thread gets the result). sv, si: kWarps + 1 entries.
__device__ __forceinline__ Best block_best(Best b, float* sv, int64_t* si) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  b = warp_best(b);
  if (lane == 0) {
    sv[warp] = b.v;
    si[warp] = b.i;
  }
  __syncthreads();
  if (warp == 0) {
    b = warp_best(Best{sv[lane], si[lane]});
    if (lane == 0) {
      sv[kWarps] = b.v;
      si[kWarps] = b.i;
    }
  }
  __syncthreads();
  const Best out{sv[kWarps], si[kWarps]};
  __syncthreads();
  return out;
}

__global__ void __launch_bounds__(kThreads, 1)
    top_p_kernel(const uint16_t* __restrict__ logits, const float* __restrict__ temperature,
                 const float* __restrict__ top_p, const uint64_t* __restrict__ seed,
                 const uint64_t* __restrict__ counter, int32_t* __restrict__ ids, int64_t vocab) {
  __shared__ unsigned long long hist[kBins * kCopies];
  __shared__ unsigned long long bins[kBins];
  __shared__ unsigned long long scan_ws[kWarps + 1];
  __shared__ unsigned long long sel_ws[kBins / 32];
  __shared__ float best_v[kWarps + 1];
  __shared__ int64_t best_i[kWarps + 1];
  __shared__ int sel_bin1, sel_bin2;
  __shared__ unsigned long long sel_above1, sel_above2, mass_base;
  __shared__ int done;

  const int t = threadIdx.x;
  const int64_t r = blockIdx.x;
  const uint16_t* row = logits + r * vocab;

  // Pass 1: NaN flag, max and argmax (a thread's indices increase, so `>` keeps the lowest).
  Best b{-INFINITY, vocab};
  int nan = 0;
  for_each_tile(row, vocab, [&](int64_t first, const uint32_t* v, int cnt) {
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      if (e < cnt) {
        if (is_nan_bits(v[e])) {
          nan = 1;
        } else {
          const float x = bf16_bits_to_float(v[e]);
          if (x > b.v || b.i == vocab) b = Best{x, first + e};
        }
      }
    }
  });
  if (__syncthreads_or(nan)) {
    if (t == 0) ids[r] = -1;
    return;
  }
  const Best best = block_best(b, best_v, best_i);
  const float m = best.v;

  // Per-row parameters (device data; out-of-range values have a defined meaning, see sample.h).
  const float temp = temperature[r];
  float pp = top_p[r];
  if (!(pp > 0.0f && pp <= 1.0f)) pp = 1.0f;
  float inv_t = 0.0f;
  bool greedy = isnan(temp) || temp <= 0.0f;
  if (!greedy) {
    inv_t = __fdiv_rn(1.0f, temp);
    greedy = isinf(inv_t);
    inv_t = fmaxf(inv_t, FLT_MIN);
  }
  if (greedy) {
    if (t == 0) ids[r] = static_cast<int32_t>(best.i);
    return;
  }

  // Pass 2: weights, total W, high-byte mass histogram.
  hist_clear<unsigned long long, kCopies>(hist);
  if (t == 0) {
    mass_base = 0;
    done = 0;
  }
  __syncthreads();
  unsigned long long w_sum = 0;
  for_each_tile(row, vocab, [&](int64_t, const uint32_t* v, int cnt) {
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      if (e < cnt) {
        const unsigned long long q = weight(bf16_bits_to_float(v[e]), m, inv_t);
        if (q != 0) {
          w_sum += q;
          hist_add<unsigned long long, kCopies>(hist, key16(v[e]) >> 8, q);
        }
      }
    }
  });
  const unsigned long long total = block_sum(w_sum, scan_ws);
  unsigned long long need = __double2ull_rz(__dmul_rn(static_cast<double>(pp), __ull2double_rn(total)));
  need = need < total ? need : total;
  need = need > 1ull ? need : 1ull;
  sum_copies<unsigned long long, kCopies>(hist, bins);
  select_bin<unsigned long long>(bins, need, sel_ws, &sel_bin1, &sel_above1);
  const int hb = sel_bin1;
  const unsigned long long above1 = sel_above1;
  hist_clear<unsigned long long, kCopies>(hist);
  __syncthreads();

  // Pass 3: low-byte mass histogram inside hb.
  for_each_tile(row, vocab, [&](int64_t, const uint32_t* v, int cnt) {
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      if (e < cnt) {
        const uint32_t key = key16(v[e]);
        if (static_cast<int>(key >> 8) == hb) {
          const unsigned long long q = weight(bf16_bits_to_float(v[e]), m, inv_t);
          if (q != 0) hist_add<unsigned long long, kCopies>(hist, key & 0xFFu, q);
        }
      }
    }
  });
  sum_copies<unsigned long long, kCopies>(hist, bins);
  select_bin<unsigned long long>(bins, need - above1, sel_ws, &sel_bin2, &sel_above2);
  const int lb = sel_bin2;
  if (hb < 0 || lb < 0) {  // unreachable (need <= W); fall back to the argmax
    if (t == 0) ids[r] = static_cast<int32_t>(best.i);
    return;
  }
  const uint32_t thr = (static_cast<uint32_t>(hb) << 8) | static_cast<uint32_t>(lb);
  const unsigned long long kept = above1 + sel_above2 + bins[lb];  // M
  const uint64_t bits = splitmix64(seed[r] ^ splitmix64(counter[r]));
  const double u = __dmul_rn(__ull2double_rn(bits >> 11), 0x1p-53);
  unsigned long long target = __double2ull_rz(__dmul_rn(u, __ull2double_rn(kept)));
  target = target < kept - 1 ? target : kept - 1;

  // Pass 4: the first kept token (index order) whose inclusive prefix mass exceeds target.
  for_each_tile(row, vocab, [&](int64_t first, const uint32_t* v, int cnt) {
    if (done) return;  // block-uniform: done changes only between the barriers below
    unsigned long long q[kVec];
    unsigned long long mine = 0;
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      q[e] = 0;
      if (e < cnt && key16(v[e]) >= thr) q[e] = weight(bf16_bits_to_float(v[e]), m, inv_t);
      mine += q[e];
    }
    unsigned long long tile_mass;
    const unsigned long long lo = mass_base + block_excl_scan(mine, scan_ws, &tile_mass);
    if (mine != 0 && target >= lo && target - lo < mine) {  // exactly one thread
      unsigned long long acc = lo;
      bool found = false;
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        acc += q[e];
        if (!found && acc > target) {
          found = true;
          ids[r] = static_cast<int32_t>(first + e);
        }
      }
      done = 1;
    }
    __syncthreads();  // every thread has read mass_base
    if (t == 0) mass_base += tile_mass;
    __syncthreads();
  });
  if (t == 0 && !done) ids[r] = static_cast<int32_t>(best.i);  // unreachable (kept == M)
}

}  // namespace

extern "C" dk_status dk_sample_top_p(const DkTopPParams* p, dk_stream_t stream) {
  if (p == nullptr || p->rows < 0 || p->vocab <= 0 || p->vocab > INT32_MAX) return DK_ERR_INVALID_ARGUMENT;
  if (p->rows == 0) return DK_OK;
  if (p->rows > 0x7fffffff || p->logits == 0 || p->temperature == 0 || p->top_p == 0 || p->seed == 0 ||
      p->counter == 0 || p->ids == 0)
    return DK_ERR_INVALID_ARGUMENT;
  if (p->logits % 2 != 0 || p->temperature % 4 != 0 || p->top_p % 4 != 0 || p->seed % 8 != 0 ||
      p->counter % 8 != 0 || p->ids % 4 != 0)
    return DK_ERR_INVALID_ARGUMENT;
  top_p_kernel<<<static_cast<unsigned>(p->rows), kThreads, 0, stream>>>(
      reinterpret_cast<const uint16_t*>(p->logits), reinterpret_cast<const float*>(p->temperature),
      reinterpret_cast<const float*>(p->top_p), reinterpret_cast<const uint64_t*>(p->seed),
      reinterpret_cast<const uint64_t*>(p->counter), reinterpret_cast<int32_t*>(p->ids), p->vocab);
  return dk::launch_status();
}
