// Shared kernel of the norm.* ops: one row of d elements per group of TPR threads.
//
// Layout: row-major bf16 [rows, d] (contiguous), weight bf16 [d].
// Thread mapping: 256-thread CTAs; TPR threads per row (8 / 16 / 32: a group of lanes of one warp
// per row; 256: a CTA per row), VEC = 8 (16-byte bf16x8 accesses when d % 8 == 0 and every pointer
// is 16-byte aligned) or 1. Pass 1 reads the row (fused_add: adds x into residual, rounds to bf16
// and stores it) and sums squares in f64 (like the reference, so the f32 mean matches it), keeping
// up to CACHE chunks per thread in registers; the sum is reduced with shuffles inside the row's
// lane group (+ smem across warps for TPR = 256). Pass 2 takes the row from registers (or re-reads
// it, an L1/L2 hit, each thread only the elements it wrote itself) and writes the output. Rounding
// points and operation order follow deltakit_ref::norm exactly (f32, no FMA contraction), except
// SiLU (fast exponential and division, see silu below).
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

#include <cstdlib>

#include "../common/bf16x8.cuh"
#include "../common/launch.cuh"

namespace dk_norm {

enum Mode { kRms = 0, kFusedAdd = 1, kGated = 2 };

struct Args {
  const __nv_bfloat16* x;
  __nv_bfloat16* residual;  // kFusedAdd: read + written
  const __nv_bfloat16* z;   // kGated
  // kGated: row r's z starts at (r / z_heads) * z_token_stride + (r % z_heads) * d (z as a strided
  // column view of a merged projection: token rows of z_token_stride elements holding z_heads
  // rows of d). z_heads = 1, z_token_stride = d: contiguous [rows, d].
  int64_t z_token_stride, z_heads;
  const __nv_bfloat16* w;
  __nv_bfloat16* out;
  int64_t rows, d;
  float eps;
};

constexpr int kBlock = 256;

__device__ __forceinline__ float round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

// SiLU through the hardware approximations, x * rcp(1 + 2^(-x log2 e)) (MUFU ex2 / rcp, ftz forms:
// 5 instructions, no range-check branches): the IEEE division + expf of the reference formula made
// norm.rms_gated issue-bound (36% of the copy ceiling at 27B prefill on an H200); the output (rounded
// to bf16) stays within the tests' 1e-2. As csrc/conv1d/common.cuh: x in about [-88.7, -87.3] gives
// -0 instead of ~-1e-36; x -> -inf gives -0 (x = -inf: NaN), NaN gives NaN.
__device__ __forceinline__ float silu(float x) {
  float e, r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(x * -1.4426950408889634f));
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(1.f + e));
  return x * r;
}

template <int VEC>
__device__ __forceinline__ void load(const __nv_bfloat16* p, float (&f)[VEC]) {
  if constexpr (VEC == 8) {
    dk::load_bf16x8(p, f);
  } else {
    f[0] = __bfloat162float(*p);
  }
}

template <int VEC>
__device__ __forceinline__ void store(__nv_bfloat16* p, const float (&f)[VEC]) {
  if constexpr (VEC == 8) {
    dk::store_bf16x8(p, f);
  } else {
    *p = __float2bfloat16_rn(f[0]);
  }
}

// CACHE > 0: the thread's first CACHE chunks stay in registers between the passes (d <=
// CACHE * TPR * VEC is then a single read of the row); chunks beyond CACHE are re-read.
// PREZ (kGated with CACHE > 0; tune configuration, not dispatched yet): z's cached chunks are loaded in
// pass 1 with x, before the row reduction, instead of after it (two loads in flight per thread).
template <int TPR, int VEC, int MODE, int CACHE, bool PREZ = false>
__global__ void __launch_bounds__(kBlock) norm_kernel(const Args a) {
  constexpr int RPB = kBlock / TPR;
  static_assert(TPR == 8 || TPR == 16 || TPR == 32 || TPR == kBlock, "TPR");
  constexpr int C = CACHE > 0 ? CACHE : 1;
  __shared__ double red[kBlock / 32];
  const int sub = threadIdx.x / TPR;
  const int tid = threadIdx.x % TPR;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * RPB + sub;
  const bool active = row < a.rows;
  const int64_t nvec = a.d / VEC;
  const int64_t base = row * a.d;
  float cache[C][VEC];
  [[maybe_unused]] float zcache[PREZ ? C : 1][VEC];
  double ss = 0.0;
  if (active) {
    int ci = 0;
    for (int64_t i = tid; i < nvec; i += TPR, ++ci) {
      float xv[VEC];
      load<VEC>(a.x + base + i * VEC, xv);
      if constexpr (MODE == kFusedAdd) {
        float rv[VEC];
        load<VEC>(a.residual + base + i * VEC, rv);
#pragma unroll
        for (int j = 0; j < VEC; ++j) xv[j] = round_bf16(__fadd_rn(rv[j], xv[j]));
        store<VEC>(a.residual + base + i * VEC, xv);
      }
#pragma unroll
      for (int j = 0; j < VEC; ++j) ss += static_cast<double>(xv[j]) * static_cast<double>(xv[j]);
      if constexpr (CACHE > 0) {
        [[maybe_unused]] float zv[VEC];
        if constexpr (PREZ && MODE == kGated) {
          load<VEC>(a.z + (row / a.z_heads) * a.z_token_stride + (row % a.z_heads) * a.d + i * VEC, zv);
        }
#pragma unroll
        for (int c = 0; c < C; ++c) {
          if (c == ci) {
#pragma unroll
            for (int j = 0; j < VEC; ++j) cache[c][j] = xv[j];
            if constexpr (PREZ && MODE == kGated) {
#pragma unroll
              for (int j = 0; j < VEC; ++j) zcache[c][j] = zv[j];
            }
          }
        }
      }
    }
  }
  // Reduce over the TPR threads of the row (lanes tid ^ off stay inside the row's group).
#pragma unroll
  for (int off = (TPR < 32 ? TPR : 32) / 2; off >= 1; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
  if constexpr (TPR == kBlock) {
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
    __syncthreads();
    ss = 0.0;
#pragma unroll
    for (int i = 0; i < kBlock / 32; ++i) ss += red[i];
  }
  if (!active) return;
  const float ms = static_cast<float>(ss / static_cast<double>(a.d));
  const float inv = __fdiv_rn(1.f, __fsqrt_rn(__fadd_rn(ms, a.eps)));
  const __nv_bfloat16* src = MODE == kFusedAdd ? a.residual : a.x;
  const int64_t zbase = MODE == kGated ? (row / a.z_heads) * a.z_token_stride + (row % a.z_heads) * a.d : 0;
  int ci = 0;
  for (int64_t i = tid; i < nvec; i += TPR, ++ci) {
    float xv[VEC], wv[VEC], o[VEC];
    bool cached = false;
    if constexpr (CACHE > 0) {
#pragma unroll
      for (int c = 0; c < C; ++c) {
        if (c == ci) {
#pragma unroll
          for (int j = 0; j < VEC; ++j) xv[j] = cache[c][j];
          cached = true;
        }
      }
    }
    if (!cached) load<VEC>(src + base + i * VEC, xv);
    load<VEC>(a.w + i * VEC, wv);
    if constexpr (MODE == kGated) {
      float zv[VEC];
      bool zc = false;
      if constexpr (PREZ && CACHE > 0) {
#pragma unroll
        for (int c = 0; c < C; ++c) {
          if (c == ci) {
#pragma unroll
            for (int j = 0; j < VEC; ++j) zv[j] = zcache[c][j];
            zc = true;
          }
        }
      }
      if (!zc) load<VEC>(a.z + zbase + i * VEC, zv);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float n = round_bf16(__fmul_rn(xv[j], inv));
        const float y = round_bf16(__fmul_rn(wv[j], n));
        o[j] = __fmul_rn(y, silu(zv[j]));
      }
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) o[j] = __fmul_rn(__fmul_rn(xv[j], inv), __fadd_rn(1.f, wv[j]));
    }
    store<VEC>(a.out + base + i * VEC, o);
  }
}

template <int TPR, int VEC, int MODE, int CACHE, bool PREZ = false>
dk_status launch_tv(const Args& a, cudaStream_t stream) {
  constexpr int RPB = kBlock / TPR;
  const int64_t blocks = dk::ceil_div(a.rows, RPB);
  if (blocks > 0x7fffffffLL) return DK_ERR_INVALID_ARGUMENT;
  norm_kernel<TPR, VEC, MODE, CACHE, PREZ><<<static_cast<unsigned>(blocks), kBlock, 0, stream>>>(a);
  return dk::launch_status();
}

// norm.rms_gated for d = 128 (the Qwen3.5 value head dim) on the vector path: 16 lanes per row,
// each lane one 16-byte chunk of x, z and w; a 256-thread CTA is 16 lane groups and each group
// handles U rows (row of slot u = blockIdx.x * 16U + u * 16 + group, so a warp's two groups touch
// two adjacent rows per access). All U rows' x and z loads are issued before any arithmetic (2U
// 16-byte loads in flight per thread), w is loaded once per thread (its chunk index is the same in
// every row). The U sums of squares (f64, as the generic kernel) are reduced with shuffles inside
// the group; lane u of the group then computes row u's 1 / sqrt(mean + eps) (IEEE, as the
// reference) and broadcasts it, so the U divisions cost one pass. y = bf16(w * bf16(x * inv)) as one
// bf16x2 multiply per pair (the product of two bf16 is exact in f32, so rounding it once to bf16 is
// the reference's rounding); out = bf16(y * silu(z)). Same values as the generic kernel.
template <int U>
__global__ void __launch_bounds__(kBlock) rms_gated_d128_kernel(const Args a) {
  static_assert(U >= 1 && U <= 16, "U");
  constexpr int kGroups = kBlock / 16;
  const int lane = threadIdx.x & 31;
  const int sub = threadIdx.x / 16;
  const int tid = threadIdx.x % 16;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kGroups * U + sub;
  uint4 xr[U], zr[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t row = row0 + u * kGroups;
    if (row < a.rows) {
      xr[u] = *reinterpret_cast<const uint4*>(a.x + row * 128 + tid * 8);
      const int64_t zrow = a.z_heads == 1 ? row * a.z_token_stride
                                          : (row / a.z_heads) * a.z_token_stride + (row % a.z_heads) * 128;
      zr[u] = *reinterpret_cast<const uint4*>(a.z + zrow + tid * 8);
    } else {
      xr[u] = make_uint4(0u, 0u, 0u, 0u);
      zr[u] = xr[u];
    }
  }
  const uint4 wr = *reinterpret_cast<const uint4*>(a.w + tid * 8);
  double ss[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    float xv[8];
    dk::unpack_bf16x8(xr[u], xv);
    double acc = 0.0;
#pragma unroll
    for (int j = 0; j < 8; ++j) acc += static_cast<double>(xv[j]) * static_cast<double>(xv[j]);
    ss[u] = acc;
  }
#pragma unroll
  for (int off = 8; off >= 1; off >>= 1) {
#pragma unroll
    for (int u = 0; u < U; ++u) ss[u] += __shfl_xor_sync(0xffffffffu, ss[u], off);
  }
  double mine = ss[0];
#pragma unroll
  for (int u = 1; u < U; ++u) mine = (tid % U == u) ? ss[u] : mine;
  const float ms = static_cast<float>(mine * (1.0 / 128.0));  // = mine / 128 exactly
  const float inv_mine = __fdiv_rn(1.f, __fsqrt_rn(__fadd_rn(ms, a.eps)));
  const __nv_bfloat162* w2 = reinterpret_cast<const __nv_bfloat162*>(&wr);
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const float inv = __shfl_sync(0xffffffffu, inv_mine, (lane & 16) + u);
    const int64_t row = row0 + u * kGroups;
    if (row >= a.rows) continue;
    const __nv_bfloat162* x2 = reinterpret_cast<const __nv_bfloat162*>(&xr[u]);
    const __nv_bfloat162* z2 = reinterpret_cast<const __nv_bfloat162*>(&zr[u]);
    uint4 o;
    __nv_bfloat162* o2 = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 xv = __bfloat1622float2(x2[j]);
      const __nv_bfloat162 n = __floats2bfloat162_rn(__fmul_rn(xv.x, inv), __fmul_rn(xv.y, inv));
      const float2 y = __bfloat1622float2(__hmul2(w2[j], n));
      const float2 zv = __bfloat1622float2(z2[j]);
      o2[j] = __floats2bfloat162_rn(__fmul_rn(y.x, silu(zv.x)), __fmul_rn(y.y, silu(zv.y)));
    }
    *reinterpret_cast<uint4*>(a.out + row * 128 + tid * 8) = o;
  }
}

// Rows per lane group of rms_gated_d128_kernel in the dispatch (DELTAKIT_RMS_GATED_ROWS = 1 / 2 / 4 / 8
// overrides it, read once per process; for tests and measurements). U = 1: 75.1 us vs 82.6 for U = 4
// at 27B 8192 tokens on an H200 (95% vs 86% of the copy ceiling; 9B 51.4 vs 56.9; decode batch 64
// 4.1 vs 5.0 us), bit-identical; passed the norm GPU tests and memcheck under DELTAKIT_RMS_GATED_ROWS=1.
constexpr int kGatedD128Rows = 1;

inline int gated_d128_rows() {
  static const int rows = [] {
    const char* e = std::getenv("DELTAKIT_RMS_GATED_ROWS");
    if (e == nullptr) return kGatedD128Rows;
    const int u = std::atoi(e);
    return u == 1 || u == 2 || u == 4 || u == 8 ? u : kGatedD128Rows;
  }();
  return rows;
}

template <int U>
dk_status launch_gated_d128(const Args& a, cudaStream_t stream) {
  const int64_t blocks = dk::ceil_div(a.rows, (kBlock / 16) * U);
  if (blocks > 0x7fffffffLL) return DK_ERR_INVALID_ARGUMENT;
  rms_gated_d128_kernel<U><<<static_cast<unsigned>(blocks), kBlock, 0, stream>>>(a);
  return dk::launch_status();
}

// Validates, picks (TPR, VEC, CACHE) and launches. Pointers needed by MODE must be non-null.
// Vector path (d % 8 == 0, 16-byte aligned): d <= 64 -> 8 threads per row, <= 128 -> 16 (one
// 16-byte chunk per thread, kept in registers: the row is read once), <= 1024 -> 32 (a warp),
// else a 256-thread CTA per row (both re-read the row in pass 2: caching 2-4 chunks per thread in
// registers measured slower at d = 5120 on an H200); kGated with d = 128: rms_gated_d128_kernel
// (gated_d128 = false: the generic kernel, for comparisons). Scalar path: a warp or a CTA per row.
template <int MODE, bool PREZ = false>
dk_status launch(const Args& a, cudaStream_t stream, bool gated_d128 = true) {
  if (a.rows < 0 || a.d < 1) return DK_ERR_INVALID_ARGUMENT;
  if (!(a.eps >= 0.f)) return DK_ERR_INVALID_ARGUMENT;
  if (MODE == kGated && (a.z_heads < 1 || a.rows % a.z_heads != 0 || a.z_token_stride < a.z_heads * a.d))
    return DK_ERR_INVALID_ARGUMENT;
  if (a.rows == 0) return DK_OK;
  const uint64_t ptrs[] = {reinterpret_cast<uint64_t>(a.x), reinterpret_cast<uint64_t>(a.w),
                           reinterpret_cast<uint64_t>(a.out),
                           MODE == kFusedAdd ? reinterpret_cast<uint64_t>(a.residual) : 16u,
                           MODE == kGated ? reinterpret_cast<uint64_t>(a.z) : 16u};
  bool vec = a.d % 8 == 0 && (MODE != kGated || a.z_token_stride % 8 == 0);
  for (uint64_t p : ptrs) {
    if (p == 0 || p % 2 != 0) return DK_ERR_INVALID_ARGUMENT;
    vec = vec && p % 16 == 0;
  }
  if (vec) {
    if constexpr (MODE == kGated && !PREZ) {
      if (a.d == 128 && gated_d128) {
        switch (gated_d128_rows()) {
          case 1: return launch_gated_d128<1>(a, stream);
          case 2: return launch_gated_d128<2>(a, stream);
          case 8: return launch_gated_d128<8>(a, stream);
          default: return launch_gated_d128<4>(a, stream);
        }
      }
    }
    if (a.d <= 64) return launch_tv<8, 8, MODE, 1, PREZ>(a, stream);
    if (a.d <= 128) return launch_tv<16, 8, MODE, 1, PREZ>(a, stream);
    if (a.d <= 1024) return launch_tv<32, 8, MODE, 0>(a, stream);
    return launch_tv<kBlock, 8, MODE, 0>(a, stream);
  }
  return a.d <= 1024 ? launch_tv<32, 1, MODE, 0>(a, stream) : launch_tv<kBlock, 1, MODE, 0>(a, stream);
}

}  // namespace dk_norm
