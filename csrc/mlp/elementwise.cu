// mlp.silu_and_mul, mlp.embedding, attn.output_gate: memory-bound elementwise kernels.
// Layouts: token-major rows, bf16. Thread mapping: the whole [rows, cols] output is one flat range
// of 8-element (16-byte) chunks when the row length, strides and pointers allow it (else single
// elements), one chunk per thread, grid-stride over the range; all offsets int64. (The earlier
// one-CTA-per-row mapping ran a decode step's single row on one SM: 41 us for a 12288-wide SwiGLU
// at 9B batch 1 on an H200, ncu 2026-12-01.)
// Rounding points mirror deltakit_ref::{mlp::silu_and_mul, mlp::embedding, attn::output_gate}.
#include <cuda_bf16.h>

#include "../common/bf16x8.cuh"
#include "../common/launch.cuh"

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGrid = 1 << 20;

__device__ __forceinline__ float silu(float x) { return x / (1.0f + __expf(-x)); }
__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + __expf(-x)); }
__device__ __forceinline__ float rbf(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

template <int VEC>
__device__ __forceinline__ void ld(const __nv_bfloat16* p, float (&f)[VEC]) {
  if constexpr (VEC == 8) {
    dk::load_bf16x8(p, f);
  } else {
    f[0] = __bfloat162float(*p);
  }
}

template <int VEC>
__device__ __forceinline__ void st(__nv_bfloat16* p, const float (&f)[VEC]) {
  if constexpr (VEC == 8) {
    dk::store_bf16x8(p, f);
  } else {
    *p = __float2bfloat16_rn(f[0]);
  }
}

// Chunk c of a [rows, cols] range in VEC-element chunks: row c / (cols / VEC), column offset.
template <int VEC>
__device__ __forceinline__ void chunk_pos(int64_t c, int64_t cols, int64_t& r, int64_t& i) {
  const int64_t per_row = cols / VEC;
  r = c / per_row;
  i = (c - r * per_row) * VEC;
}

template <int VEC>
__global__ void silu_and_mul_kernel(const __nv_bfloat16* __restrict__ x, __nv_bfloat16* __restrict__ out,
                                    int64_t rows, int64_t inter) {
  const int64_t chunks = rows * (inter / VEC);
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < chunks;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t r, i;
    chunk_pos<VEC>(c, inter, r, i);
    float g[VEC], u[VEC], o[VEC];
    ld<VEC>(x + r * 2 * inter + i, g);
    ld<VEC>(x + r * 2 * inter + inter + i, u);
#pragma unroll
    for (int j = 0; j < VEC; ++j) o[j] = rbf(silu(g[j])) * u[j];
    st<VEC>(out + r * inter + i, o);
  }
}

template <int VEC>
__global__ void embedding_kernel(const int32_t* __restrict__ ids, const __nv_bfloat16* __restrict__ table,
                                 __nv_bfloat16* __restrict__ out, int64_t rows, int64_t vocab, int64_t d) {
  const int64_t chunks = rows * (d / VEC);
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < chunks;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t r, i;
    chunk_pos<VEC>(c, d, r, i);
    const int64_t id = ids[r];
    float v[VEC];
    if (id < 0 || id >= vocab) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) v[j] = __int_as_float(0x7fc00000);
    } else {
      ld<VEC>(table + id * d + i, v);
    }
    st<VEC>(out + r * d + i, v);
  }
}

template <int VEC>
__global__ void output_gate_kernel(const __nv_bfloat16* attn, const __nv_bfloat16* __restrict__ gate,
                                   __nv_bfloat16* out, int64_t rows, int64_t width, int64_t gate_stride) {
  const int64_t chunks = rows * (width / VEC);
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < chunks;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t r, i;
    chunk_pos<VEC>(c, width, r, i);
    float a[VEC], g[VEC], o[VEC];
    ld<VEC>(attn + r * width + i, a);
    ld<VEC>(gate + r * gate_stride + i, g);
#pragma unroll
    for (int j = 0; j < VEC; ++j) o[j] = a[j] * rbf(sigmoid(g[j]));
    st<VEC>(out + r * width + i, o);
  }
}

unsigned grid_for(int64_t rows, int64_t cols, int vec) {
  const int64_t chunks = rows * (cols / vec);
  const int64_t g = dk::ceil_div(chunks, static_cast<int64_t>(kThreads));
  return static_cast<unsigned>(g < 1 ? 1 : (g < kMaxGrid ? g : kMaxGrid));
}

bool aligned16(uint64_t p) { return p % 16 == 0; }

}  // namespace

extern "C" dk_status dk_mlp_silu_and_mul(const DkSiluMulParams* p, dk_stream_t stream) {
  if (p == nullptr || p->rows < 0 || p->inter <= 0) return DK_ERR_INVALID_ARGUMENT;
  if (p->rows == 0) return DK_OK;
  if (p->x == 0 || p->out == 0) return DK_ERR_INVALID_ARGUMENT;
  const auto* x = reinterpret_cast<const __nv_bfloat16*>(p->x);
  auto* out = reinterpret_cast<__nv_bfloat16*>(p->out);
  if (p->inter % 8 == 0 && aligned16(p->x) && aligned16(p->out)) {
    silu_and_mul_kernel<8><<<grid_for(p->rows, p->inter, 8), kThreads, 0, stream>>>(x, out, p->rows, p->inter);
  } else {
    silu_and_mul_kernel<1><<<grid_for(p->rows, p->inter, 1), kThreads, 0, stream>>>(x, out, p->rows, p->inter);
  }
  return dk::launch_status();
}

extern "C" dk_status dk_mlp_embedding(const DkEmbeddingParams* p, dk_stream_t stream) {
  if (p == nullptr || p->rows < 0 || p->vocab <= 0 || p->d <= 0) return DK_ERR_INVALID_ARGUMENT;
  if (p->rows == 0) return DK_OK;
  if (p->ids == 0 || p->table == 0 || p->out == 0) return DK_ERR_INVALID_ARGUMENT;
  const auto* ids = reinterpret_cast<const int32_t*>(p->ids);
  const auto* table = reinterpret_cast<const __nv_bfloat16*>(p->table);
  auto* out = reinterpret_cast<__nv_bfloat16*>(p->out);
  if (p->d % 8 == 0 && aligned16(p->table) && aligned16(p->out)) {
    embedding_kernel<8><<<grid_for(p->rows, p->d, 8), kThreads, 0, stream>>>(ids, table, out, p->rows, p->vocab, p->d);
  } else {
    embedding_kernel<1><<<grid_for(p->rows, p->d, 1), kThreads, 0, stream>>>(ids, table, out, p->rows, p->vocab, p->d);
  }
  return dk::launch_status();
}

extern "C" dk_status dk_attn_output_gate(const DkOutputGateParams* p, dk_stream_t stream) {
  if (p == nullptr || p->rows < 0 || p->width <= 0 || p->gate_stride < p->width)
    return DK_ERR_INVALID_ARGUMENT;
  if (p->rows == 0) return DK_OK;
  if (p->attn == 0 || p->gate == 0 || p->out == 0) return DK_ERR_INVALID_ARGUMENT;
  const auto* attn = reinterpret_cast<const __nv_bfloat16*>(p->attn);
  const auto* gate = reinterpret_cast<const __nv_bfloat16*>(p->gate);
  auto* out = reinterpret_cast<__nv_bfloat16*>(p->out);
  if (p->width % 8 == 0 && p->gate_stride % 8 == 0 && aligned16(p->attn) && aligned16(p->gate) &&
      aligned16(p->out)) {
    output_gate_kernel<8><<<grid_for(p->rows, p->width, 8), kThreads, 0, stream>>>(attn, gate, out, p->rows, p->width,
                                                                                  p->gate_stride);
  } else {
    output_gate_kernel<1><<<grid_for(p->rows, p->width, 1), kThreads, 0, stream>>>(attn, gate, out, p->rows, p->width,
                                                                                  p->gate_stride);
  }
  return dk::launch_status();
}
