// Shared device helpers of the conv1d.* kernels (causal depthwise conv1d + SiLU).
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

namespace dk_conv1d {

// SiLU in f32 with the hardware approximations: x * rcp(1 + 2^(-x log2 e)) through MUFU ex2 and
// rcp (ex2.approx.ftz / rcp.approx.ftz: 5 instructions, no range-check branches), a few ulp of f32
// before the bf16 rounding of the output. The IEEE division and expf of the reference formula
// (deltakit_ref::check::silu) made the conv1d kernels issue-bound (~55 instructions per output,
// a divergent slow-path check per division: 16-25% of the copy ceiling at 8192 tokens on an H200);
// outputs stay within the tests' 1e-2 (seen: ~2e-5) and a bf16 output differs from the exact
// formula's only where the f32 value sits within a few ulp of a bf16 rounding boundary. Same values
// as __fdividef(x, 1 + __expf(-x)) (the previous form) except for x in about [-88.7, -87.3], where
// 1 + e^-x >= 2^126 and the flushed reciprocal gives -0 instead of ~-1e-36. Limits: x -> -inf gives
// -0 (x = -inf: NaN), x = NaN gives NaN.
__device__ __forceinline__ float silu(float x) {
  float e, r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(x * -1.4426950408889634f));
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(1.f + e));
  return x * r;
}

// One output: silu(bias + sum_w weight[w] * xe[w]) with xe = window (W-1 oldest first) + newest
// input, accumulated in tap order. FMA (what every dispatched conv1d kernel uses): each tap one fused
// multiply-add (W instructions); !FMA: a separate f32 multiply and add per tap as the reference writes
// it (2W instructions; tune configurations only). Same bits either way: weight and input are bf16, so
// their product is exact in f32 and both forms round once per tap (bit-identical on an H200 over 84M
// outputs, 2026-12-01).
template <int W, bool FMA = true>
__device__ __forceinline__ float conv_out(const float (&wt)[W], float bias, const float (&win)[W - 1], float xv) {
  float acc = bias;
  if constexpr (FMA) {
#pragma unroll
    for (int j = 0; j < W - 1; ++j) acc = fmaf(wt[j], win[j], acc);
    acc = fmaf(wt[W - 1], xv, acc);
  } else {
#pragma unroll
    for (int j = 0; j < W - 1; ++j) acc = __fadd_rn(acc, __fmul_rn(wt[j], win[j]));
    acc = __fadd_rn(acc, __fmul_rn(wt[W - 1], xv));
  }
  return silu(acc);
}

}  // namespace dk_conv1d
