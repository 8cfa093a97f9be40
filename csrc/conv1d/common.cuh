// Shared device helpers of the conv1d.* kernels (causal depthwise conv1d + SiLU).
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

namespace dk_conv1d {

// Stable logistic sigmoid and SiLU in f32, as deltakit_ref::check::{sigmoid, silu}.
__device__ __forceinline__ float silu(float x) {
  float s;
  if (x >= 0.f) {
    s = __fdiv_rn(1.f, __fadd_rn(1.f, expf(-x)));
  } else {
    const float e = expf(x);
    s = __fdiv_rn(e, __fadd_rn(1.f, e));
  }
  return __fmul_rn(x, s);
}

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
