// Shared device helpers of the conv1d.* kernels (causal depthwise conv1d + SiLU).
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

namespace dk_conv1d {

// SiLU in f32 with the fast exponential and division: x / (1 + e^-x) through __expf and __fdividef
// (MUFU ex2 / rcp, a few ulp of f32 before the bf16 rounding of the output). The IEEE division and
// expf of the reference formula (deltakit_ref::check::silu) made the conv1d kernels issue-bound
// (~55 instructions per output, a divergent slow-path check per division: 16-25% of the copy
// ceiling at 8192 tokens on an H200); outputs stay within the tests' 1e-2 (seen: ~2e-5) and a
// bf16 output differs from the exact formula's only where the f32 value sits within a few ulp of
// a bf16 rounding boundary. Limits: x -> -inf gives -0 (e^-x = inf, x / inf), x = NaN gives NaN.
__device__ __forceinline__ float silu(float x) { return __fdividef(x, __fadd_rn(1.f, __expf(-x))); }

// One output: silu(bias + sum_w weight[w] * xe[w]) with xe = window (W-1 oldest first) + newest
// input, accumulated in tap order with separate f32 multiply and add (no FMA contraction), as
// the reference does.
template <int W>
__device__ __forceinline__ float conv_out(const float (&wt)[W], float bias, const float (&win)[W - 1], float xv) {
  float acc = bias;
#pragma unroll
  for (int j = 0; j < W - 1; ++j) acc = __fadd_rn(acc, __fmul_rn(wt[j], win[j]));
  acc = __fadd_rn(acc, __fmul_rn(wt[W - 1], xv));
  return silu(acc);
}

}  // namespace dk_conv1d
