// smoke.axpy: y = alpha * x + y over bf16 vectors (pipeline smoke op, issue 2).
// Layout: x, y contiguous bf16 [n]. Thread mapping: grid-stride loop, 8 elements (16 bytes) per
// thread per step when both pointers are 16-byte aligned, scalar tail otherwise. f32 FMA, one
// rounding to bf16 (round to nearest even), matching deltakit_ref::smoke::axpy_bf16.
#include <cuda_bf16.h>

#include "../common/launch.cuh"

namespace {

__global__ void axpy_bf16_vec8(const __nv_bfloat16* __restrict__ x, __nv_bfloat16* __restrict__ y,
                               int64_t n8, float alpha) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n8; i += stride) {
    uint4 xv = reinterpret_cast<const uint4*>(x)[i];
    uint4 yv = reinterpret_cast<uint4*>(y)[i];
    const __nv_bfloat162* xp = reinterpret_cast<const __nv_bfloat162*>(&xv);
    __nv_bfloat162* yp = reinterpret_cast<__nv_bfloat162*>(&yv);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float2 xf = __bfloat1622float2(xp[j]);
      float2 yf = __bfloat1622float2(yp[j]);
      yp[j] = __floats2bfloat162_rn(fmaf(alpha, xf.x, yf.x), fmaf(alpha, xf.y, yf.y));
    }
    reinterpret_cast<uint4*>(y)[i] = yv;
  }
}

__global__ void axpy_bf16_scalar(const __nv_bfloat16* __restrict__ x, __nv_bfloat16* __restrict__ y,
                                 int64_t begin, int64_t n, float alpha) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = begin + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    y[i] = __float2bfloat16_rn(fmaf(alpha, __bfloat162float(x[i]), __bfloat162float(y[i])));
  }
}

}  // namespace

extern "C" dk_status dk_smoke_axpy_bf16(const DkAxpyParams* p, dk_stream_t stream) {
  if (p == nullptr || p->n < 0) return DK_ERR_INVALID_ARGUMENT;
  if (p->n == 0) return DK_OK;
  if (p->x == 0 || p->y == 0) return DK_ERR_INVALID_ARGUMENT;
  const auto* x = reinterpret_cast<const __nv_bfloat16*>(p->x);
  auto* y = reinterpret_cast<__nv_bfloat16*>(p->y);
  const int threads = 256;
  const int64_t max_blocks = 132 * 16;  // a few waves on an H200; grid-stride covers the rest
  int64_t tail_begin = 0;
  if ((p->x % 16 == 0) && (p->y % 16 == 0)) {
    const int64_t n8 = p->n / 8;
    if (n8 > 0) {
      const int64_t blocks = dk::ceil_div(n8, threads) < max_blocks ? dk::ceil_div(n8, threads) : max_blocks;
      axpy_bf16_vec8<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(x, y, n8, p->alpha);
      if (dk_status s = dk::launch_status(); s != DK_OK) return s;
    }
    tail_begin = n8 * 8;
  }
  const int64_t rest = p->n - tail_begin;
  if (rest > 0) {
    const int64_t blocks = dk::ceil_div(rest, threads) < max_blocks ? dk::ceil_div(rest, threads) : max_blocks;
    axpy_bf16_scalar<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(x, y, tail_begin, p->n,
                                                                           p->alpha);
    return dk::launch_status();
  }
  return DK_OK;
}
