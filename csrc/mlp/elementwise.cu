// mlp.silu_and_mul, mlp.embedding, attn.output_gate: memory-bound elementwise kernels.
// Layouts: token-major rows, bf16. Thread mapping: one CTA per row (grid-stride over rows when
// rows exceed the grid), threads stride over the row's columns; all offsets int64.
// Rounding points mirror deltakit_ref::{mlp::silu_and_mul, mlp::embedding, attn::output_gate}.
#include <cuda_bf16.h>

#include "../common/launch.cuh"

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGrid = 65535;

__device__ __forceinline__ float silu(float x) { return x / (1.0f + __expf(-x)); }
__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + __expf(-x)); }

__global__ void silu_and_mul_kernel(const __nv_bfloat16* __restrict__ x,
                                    __nv_bfloat16* __restrict__ out, int64_t rows, int64_t inter) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const __nv_bfloat16* xr = x + r * 2 * inter;
    __nv_bfloat16* o = out + r * inter;
    for (int64_t i = threadIdx.x; i < inter; i += blockDim.x) {
      const float a = __bfloat162float(__float2bfloat16_rn(silu(__bfloat162float(xr[i]))));
      o[i] = __float2bfloat16_rn(a * __bfloat162float(xr[inter + i]));
    }
  }
}

__global__ void embedding_kernel(const int32_t* __restrict__ ids, const __nv_bfloat16* __restrict__ table,
                                 __nv_bfloat16* __restrict__ out, int64_t rows, int64_t vocab, int64_t d) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t id = ids[r];
    __nv_bfloat16* o = out + r * d;
    if (id < 0 || id >= vocab) {
      const __nv_bfloat16 nan = __float2bfloat16_rn(__int_as_float(0x7fc00000));
      for (int64_t i = threadIdx.x; i < d; i += blockDim.x) o[i] = nan;
      continue;
    }
    const __nv_bfloat16* src = table + id * d;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) o[i] = src[i];
  }
}

__global__ void output_gate_kernel(const __nv_bfloat16* attn, const __nv_bfloat16* __restrict__ gate,
                                   __nv_bfloat16* out, int64_t rows, int64_t width, int64_t gate_stride) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const __nv_bfloat16* a = attn + r * width;
    const __nv_bfloat16* g = gate + r * gate_stride;
    __nv_bfloat16* o = out + r * width;
    for (int64_t i = threadIdx.x; i < width; i += blockDim.x) {
      const float s = __bfloat162float(__float2bfloat16_rn(sigmoid(__bfloat162float(g[i]))));
      o[i] = __float2bfloat16_rn(__bfloat162float(a[i]) * s);
    }
  }
}

unsigned grid_for(int64_t rows) { return static_cast<unsigned>(rows < kMaxGrid ? rows : kMaxGrid); }

}  // namespace

extern "C" dk_status dk_mlp_silu_and_mul(const DkSiluMulParams* p, dk_stream_t stream) {
  if (p == nullptr || p->rows < 0 || p->inter <= 0) return DK_ERR_INVALID_ARGUMENT;
  if (p->rows == 0) return DK_OK;
  if (p->x == 0 || p->out == 0) return DK_ERR_INVALID_ARGUMENT;
  silu_and_mul_kernel<<<grid_for(p->rows), kThreads, 0, stream>>>(
      reinterpret_cast<const __nv_bfloat16*>(p->x), reinterpret_cast<__nv_bfloat16*>(p->out), p->rows,
      p->inter);
  return dk::launch_status();
}

extern "C" dk_status dk_mlp_embedding(const DkEmbeddingParams* p, dk_stream_t stream) {
  if (p == nullptr || p->rows < 0 || p->vocab <= 0 || p->d <= 0) return DK_ERR_INVALID_ARGUMENT;
  if (p->rows == 0) return DK_OK;
  if (p->ids == 0 || p->table == 0 || p->out == 0) return DK_ERR_INVALID_ARGUMENT;
  embedding_kernel<<<grid_for(p->rows), kThreads, 0, stream>>>(
      reinterpret_cast<const int32_t*>(p->ids), reinterpret_cast<const __nv_bfloat16*>(p->table),
      reinterpret_cast<__nv_bfloat16*>(p->out), p->rows, p->vocab, p->d);
  return dk::launch_status();
}

extern "C" dk_status dk_attn_output_gate(const DkOutputGateParams* p, dk_stream_t stream) {
  if (p == nullptr || p->rows < 0 || p->width <= 0 || p->gate_stride < p->width)
    return DK_ERR_INVALID_ARGUMENT;
  if (p->rows == 0) return DK_OK;
  if (p->attn == 0 || p->gate == 0 || p->out == 0) return DK_ERR_INVALID_ARGUMENT;
  output_gate_kernel<<<grid_for(p->rows), kThreads, 0, stream>>>(
      reinterpret_cast<const __nv_bfloat16*>(p->attn), reinterpret_cast<const __nv_bfloat16*>(p->gate),
      reinterpret_cast<__nv_bfloat16*>(p->out), p->rows, p->width, p->gate_stride);
  return dk::launch_status();
}
