// conv1d.update: decode step of the causal depthwise conv1d + SiLU: N rows with S >= 1 new tokens
// each, reading and updating the conv state pool in place. CPU twin: deltakit_ref::conv1d::update
// (HF torch_causal_conv1d_update / causal_conv1d_update with conv_state_indices, state of W-1).
//
// Layout: x bf16 [N*S, conv_dim] (token stride x_stride), out bf16 [N*S, conv_dim], weight bf16
// [conv_dim, W], bias bf16 [conv_dim] (optional), conv_state bf16 [num_slots, conv_dim, W-1]
// (oldest first), slots i32 [N].
// Thread mapping: one thread per (row, channel); grid.x = N * ceil(conv_dim / 128), channel
// blocks fastest, 128 threads. The thread keeps its channel's W-1 window in registers across the
// S tokens and writes the new window back at the end: each state element is read and written by
// the same thread only (no cross-thread hazard). Slots outside [0, num_slots) (incl. -1) are
// padding: zero output, state untouched.
#include "../common/launch.cuh"
#include "common.cuh"

namespace {

constexpr int kThreads = 128;

template <int W>
__global__ void __launch_bounds__(kThreads) conv1d_update_kernel(DkConv1dUpdateParams p, int64_t cblocks) {
  const int64_t row = blockIdx.x / cblocks;
  const int64_t c = (blockIdx.x % cblocks) * kThreads + threadIdx.x;
  if (c >= p.conv_dim) return;
  const auto* x = reinterpret_cast<const __nv_bfloat16*>(p.x);
  auto* out = reinterpret_cast<__nv_bfloat16*>(p.out);
  const int32_t slot = reinterpret_cast<const int32_t*>(p.slots)[row];
  if (slot < 0 || static_cast<int64_t>(slot) >= p.num_slots) {
    for (int64_t s = 0; s < p.s; ++s) out[(row * p.s + s) * p.conv_dim + c] = __float2bfloat16_rn(0.f);
    return;
  }
  const auto* weight = reinterpret_cast<const __nv_bfloat16*>(p.weight);
  float wt[W];
#pragma unroll
  for (int j = 0; j < W; ++j) wt[j] = __bfloat162float(weight[c * W + j]);
  const float bias = p.bias ? __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(p.bias)[c]) : 0.f;
  auto* st = reinterpret_cast<__nv_bfloat16*>(p.conv_state) + (static_cast<int64_t>(slot) * p.conv_dim + c) * (W - 1);
  float win[W - 1];
#pragma unroll
  for (int j = 0; j < W - 1; ++j) win[j] = __bfloat162float(st[j]);
  for (int64_t s = 0; s < p.s; ++s) {
    const int64_t tok = row * p.s + s;
    const float xv = __bfloat162float(x[tok * p.x_stride + c]);
    out[tok * p.conv_dim + c] = __float2bfloat16_rn(dk_conv1d::conv_out<W>(wt, bias, win, xv));
#pragma unroll
    for (int j = 0; j < W - 2; ++j) win[j] = win[j + 1];
    win[W - 2] = xv;
  }
#pragma unroll
  for (int j = 0; j < W - 1; ++j) st[j] = __float2bfloat16_rn(win[j]);  // exact: inputs are bf16
}

template <int W>
dk_status launch(const DkConv1dUpdateParams& p, cudaStream_t stream) {
  const int64_t cblocks = dk::ceil_div(p.conv_dim, kThreads);
  const int64_t blocks = p.n * cblocks;
  if (blocks > 0x7fffffffLL) return DK_ERR_INVALID_ARGUMENT;
  conv1d_update_kernel<W><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p, cblocks);
  return dk::launch_status();
}

}  // namespace

extern "C" dk_status dk_conv1d_update(const DkConv1dUpdateParams* p, dk_stream_t stream) {
  if (p == nullptr) return DK_ERR_INVALID_ARGUMENT;
  if (p->n < 0 || p->s < 1 || p->conv_dim < 1 || p->num_slots < 0 || p->x_stride < p->conv_dim)
    return DK_ERR_INVALID_ARGUMENT;
  if (p->width < 2 || p->width > 4) return DK_ERR_UNSUPPORTED;
  if (p->n == 0) return DK_OK;
  if (p->x == 0 || p->weight == 0 || p->slots == 0 || p->conv_state == 0 || p->out == 0) return DK_ERR_INVALID_ARGUMENT;
  if (p->x % 2 || p->weight % 2 || p->bias % 2 || p->slots % 4 || p->conv_state % 2 || p->out % 2)
    return DK_ERR_INVALID_ARGUMENT;
  switch (p->width) {
    case 2: return launch<2>(*p, stream);
    case 3: return launch<3>(*p, stream);
    default: return launch<4>(*p, stream);
  }
}
