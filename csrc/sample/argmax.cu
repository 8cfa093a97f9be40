// sample.argmax: greedy token per row over a bf16 vocabulary (vocab 248320 for Qwen3.5).
// Layout: logits bf16 [rows, vocab] contiguous; ids i32 [rows]. Thread mapping: one CTA of 1024
// threads per row; each thread scans a strided slice keeping (value, lowest index), then a warp
// shuffle and a shared-memory reduction pick the maximum with ties to the lowest index. A NaN
// anywhere in the row makes the row's id -1 (torch.argmax would return the NaN's index; we refuse
// to turn a NaN into a plausible token).
#include <cuda_bf16.h>

#include "../common/launch.cuh"

namespace {

constexpr int kThreads = 1024;

struct Best {
  float v;
  int64_t i;
  int nan;
};

__device__ __forceinline__ Best better(Best a, Best b) {
  Best r;
  r.nan = a.nan | b.nan;
  const bool take_b = (b.v > a.v) || (b.v == a.v && b.i < a.i);
  r.v = take_b ? b.v : a.v;
  r.i = take_b ? b.i : a.i;
  return r;
}

// Max over the 32 lanes of a warp (ties to the lower index); lane 0 holds the result.
__device__ __forceinline__ Best warp_best(Best b) {
  for (int off = 16; off > 0; off >>= 1) {
    Best o;
    o.v = __shfl_down_sync(0xffffffffu, b.v, off);
    o.i = __shfl_down_sync(0xffffffffu, b.i, off);
    o.nan = __shfl_down_sync(0xffffffffu, b.nan, off);
    b = better(b, o);
  }
  return b;
}

__global__ void __launch_bounds__(kThreads) argmax_kernel(const __nv_bfloat16* __restrict__ logits,
                                                          int32_t* __restrict__ ids, int64_t vocab) {
  const int64_t r = blockIdx.x;
  const __nv_bfloat16* row = logits + r * vocab;
  Best b{-INFINITY, vocab, 0};
  for (int64_t j = threadIdx.x; j < vocab; j += kThreads) {
    const float v = __bfloat162float(row[j]);
    if (isnan(v)) {
      b.nan = 1;
    } else if (v > b.v || b.i == vocab) {
      b.v = v;
      b.i = j;
    }
  }
  b = warp_best(b);
  __shared__ float sv[kThreads / 32];
  __shared__ int64_t si[kThreads / 32];
  __shared__ int sn[kThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    sv[warp] = b.v;
    si[warp] = b.i;
    sn[warp] = b.nan;
  }
  __syncthreads();
  if (warp == 0) {
    b = warp_best(Best{sv[lane], si[lane], sn[lane]});  // kThreads / 32 == 32 partials
    if (lane == 0) ids[r] = (b.nan || b.i >= vocab) ? -1 : static_cast<int32_t>(b.i);
  }
}

}  // namespace

extern "C" dk_status dk_sample_argmax(const DkArgmaxParams* p, dk_stream_t stream) {
  if (p == nullptr || p->rows < 0 || p->vocab <= 0 || p->vocab > INT32_MAX) return DK_ERR_INVALID_ARGUMENT;
  if (p->rows == 0) return DK_OK;
  if (p->rows > 0x7fffffff || p->logits == 0 || p->ids == 0) return DK_ERR_INVALID_ARGUMENT;
  argmax_kernel<<<static_cast<unsigned>(p->rows), kThreads, 0, stream>>>(
      reinterpret_cast<const __nv_bfloat16*>(p->logits), reinterpret_cast<int32_t*>(p->ids), p->vocab);
  return dk::launch_status();
}
