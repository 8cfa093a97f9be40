// conv1d.update: decode step of the causal depthwise conv1d + SiLU: N rows with S >= 1 new tokens
// each, reading and updating the conv state pool in place. CPU twin: deltakit_ref::conv1d::update
// (HF torch_causal_conv1d_update / causal_conv1d_update with conv_state_indices, state of W-1).
//
// Layout: x bf16 [N*S, conv_dim] (token stride x_stride), out bf16 [N*S, conv_dim], weight bf16
// [conv_dim, W], bias bf16 [conv_dim] (optional), conv_state bf16 [num_slots, conv_dim, W-1]
// (oldest first), slots i32 [N].
// Thread mapping: one thread per (row, channel) (scalar path), or per (row, 8 channels) with
// 16-byte loads / stores of x, out, weight, bias and the state (vector path: conv_dim and
// x_stride multiples of 8, x / out / weight / bias / conv_state 16-byte aligned); grid.x = N *
// channel blocks, channel blocks fastest, 128 threads. The thread keeps its channels' W-1 windows
// in registers across the S tokens and writes the new windows back at the end: each state
// element is read and written by the same thread only (no cross-thread hazard). Slots outside
// [0, num_slots) (incl. -1) are padding: zero output, state untouched. Same f32 operations per
// output in both paths (bit-identical results). Both kernels execute griddepcontrol.launch_dependents at entry
// (trigger_dependents: the programmatic-dependent-launch pair with gdr.decode, session 10).
#include "../common/bf16x8.cuh"
#include "../common/launch.cuh"
#include "common.cuh"

namespace {

constexpr int kThreads = 128;

// griddepcontrol.launch_dependents at kernel entry (sm_90+; compiled out for older archs): a kernel launched after
// this one on the stream with the programmatic-stream-serialization attribute (the engine: gdr.decode's small-batch
// route) may start at once and overlap its launch and prologue with this kernel; it must execute griddepcontrol.wait
// before reading anything this kernel (or one before it) writes -- the wait returns only once this grid has completed
// and its memory is visible. No effect on dependents launched without the attribute (they start after this grid
// completes, as always).
__device__ __forceinline__ void trigger_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

template <int W>
__global__ void __launch_bounds__(kThreads) conv1d_update_kernel(DkConv1dUpdateParams p, int64_t cblocks) {
  trigger_dependents();
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

constexpr int kVec = 8;

// 8 bf16 <-> f32 through one 16-byte access (csrc/common/bf16x8.cuh).
__device__ __forceinline__ void load8(const __nv_bfloat16* p, float (&f)[kVec]) { dk::load_bf16x8(p, f); }
__device__ __forceinline__ void store8(__nv_bfloat16* p, const float (&f)[kVec]) { dk::store_bf16x8(p, f); }

// Vector path: one thread per (row, channels c0..c0+7). The 8 channels' weights (8 * W values),
// state windows (8 * (W-1) values, oldest first per channel) are contiguous: W and W-1 16-byte
// accesses.
template <int W>
__global__ void __launch_bounds__(kThreads) conv1d_update_vec_kernel(DkConv1dUpdateParams p, int64_t cblocks) {
  trigger_dependents();
  const int64_t row = blockIdx.x / cblocks;
  const int64_t c0 = ((blockIdx.x % cblocks) * kThreads + threadIdx.x) * kVec;
  if (c0 >= p.conv_dim) return;
  const auto* x = reinterpret_cast<const __nv_bfloat16*>(p.x);
  auto* out = reinterpret_cast<__nv_bfloat16*>(p.out);
  const int32_t slot = reinterpret_cast<const int32_t*>(p.slots)[row];
  if (slot < 0 || static_cast<int64_t>(slot) >= p.num_slots) {
    const float z[kVec] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    for (int64_t s = 0; s < p.s; ++s) store8(out + (row * p.s + s) * p.conv_dim + c0, z);
    return;
  }
  float xv0[kVec];
  load8(x + (row * p.s) * p.x_stride + c0, xv0);  // first token: issued before the state read
  const auto* weight = reinterpret_cast<const __nv_bfloat16*>(p.weight) + c0 * W;
  float wt[kVec][W];
#pragma unroll
  for (int q = 0; q < W; ++q) {
    float f[kVec];
    load8(weight + q * kVec, f);
#pragma unroll
    for (int e = 0; e < kVec; ++e) wt[(q * kVec + e) / W][(q * kVec + e) % W] = f[e];
  }
  float bias[kVec];
  if (p.bias) {
    load8(reinterpret_cast<const __nv_bfloat16*>(p.bias) + c0, bias);
  } else {
#pragma unroll
    for (int i = 0; i < kVec; ++i) bias[i] = 0.f;
  }
  auto* st = reinterpret_cast<__nv_bfloat16*>(p.conv_state) + (static_cast<int64_t>(slot) * p.conv_dim + c0) * (W - 1);
  float win[kVec][W - 1];
#pragma unroll
  for (int q = 0; q < W - 1; ++q) {
    float f[kVec];
    load8(st + q * kVec, f);
#pragma unroll
    for (int e = 0; e < kVec; ++e) win[(q * kVec + e) / (W - 1)][(q * kVec + e) % (W - 1)] = f[e];
  }
  for (int64_t s = 0; s < p.s; ++s) {
    const int64_t tok = row * p.s + s;
    float xv[kVec], o[kVec];
    if (s == 0) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) xv[i] = xv0[i];
    } else {
      load8(x + tok * p.x_stride + c0, xv);
    }
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      o[i] = dk_conv1d::conv_out<W>(wt[i], bias[i], win[i], xv[i]);
#pragma unroll
      for (int j = 0; j < W - 2; ++j) win[i][j] = win[i][j + 1];
      win[i][W - 2] = xv[i];
    }
    store8(out + tok * p.conv_dim + c0, o);
  }
#pragma unroll
  for (int q = 0; q < W - 1; ++q) {
    float f[kVec];
#pragma unroll
    for (int e = 0; e < kVec; ++e) f[e] = win[(q * kVec + e) / (W - 1)][(q * kVec + e) % (W - 1)];
    store8(st + q * kVec, f);  // exact: the window holds bf16 inputs
  }
}

// kAuto = the dispatch (vector path when the shape allows it); the others force one (tools/tune).
enum Cfg { kAuto = 0, kScalar = 1, kVector = 2, kNumCfgs = 3 };

bool vec_ok(const DkConv1dUpdateParams& p) {
  return p.conv_dim % kVec == 0 && p.x_stride % kVec == 0 && p.x % 16 == 0 && p.out % 16 == 0 &&
         p.weight % 16 == 0 && p.bias % 16 == 0 && p.conv_state % 16 == 0;
}

template <int W>
dk_status launch(const DkConv1dUpdateParams& p, cudaStream_t stream, int cfg) {
  if (cfg == kAuto) cfg = vec_ok(p) ? kVector : kScalar;
  if (cfg == kVector && !vec_ok(p)) return DK_ERR_UNSUPPORTED;
  const int64_t cblocks = dk::ceil_div(p.conv_dim, cfg == kVector ? kThreads * kVec : kThreads);
  const int64_t blocks = p.n * cblocks;
  if (blocks > 0x7fffffffLL) return DK_ERR_INVALID_ARGUMENT;
  if (cfg == kVector) {
    conv1d_update_vec_kernel<W><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p, cblocks);
  } else {
    conv1d_update_kernel<W><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p, cblocks);
  }
  return dk::launch_status();
}

dk_status update_cfg(const DkConv1dUpdateParams* p, dk_stream_t stream, int cfg) {
  if (p == nullptr) return DK_ERR_INVALID_ARGUMENT;
  if (p->n < 0 || p->s < 1 || p->conv_dim < 1 || p->num_slots < 0 || p->x_stride < p->conv_dim)
    return DK_ERR_INVALID_ARGUMENT;
  if (p->width < 2 || p->width > 4) return DK_ERR_UNSUPPORTED;
  if (cfg < 0 || cfg >= kNumCfgs) return DK_ERR_INVALID_ARGUMENT;
  if (p->n == 0) return DK_OK;
  if (p->x == 0 || p->weight == 0 || p->slots == 0 || p->conv_state == 0 || p->out == 0) return DK_ERR_INVALID_ARGUMENT;
  if (p->x % 2 || p->weight % 2 || p->bias % 2 || p->slots % 4 || p->conv_state % 2 || p->out % 2)
    return DK_ERR_INVALID_ARGUMENT;
  auto* s = static_cast<cudaStream_t>(stream);
  switch (p->width) {
    case 2: return launch<2>(*p, s, cfg);
    case 3: return launch<3>(*p, s, cfg);
    default: return launch<4>(*p, s, cfg);
  }
}

}  // namespace

extern "C" dk_status dk_conv1d_update(const DkConv1dUpdateParams* p, dk_stream_t stream) {
  return update_cfg(p, stream, kAuto);
}
