// conv1d.prefill: varlen causal depthwise conv1d + SiLU with per-sequence conv state (initial
// state read from the slot, final state written back). CPU twin: deltakit_ref::conv1d::prefill
// (HF causal_conv1d_fn with initial states / vLLM cache_indices + has_initial_state).
//
// Layout: x bf16 [T, conv_dim] (token stride x_stride), out bf16 [T, conv_dim], weight bf16
// [conv_dim, W], bias bf16 [conv_dim] (optional), cu_seqlens i32 [N+1], slots i32 [N],
// has_initial_state u8 [N] (optional, 0 = start from zeros), conv_state bf16
// [num_slots, conv_dim, W-1] (oldest first).
// Two kernels on the stream, so no kernel reads a state another thread is writing:
// 1. outputs. Vector path (conv_dim, x_stride multiples of 8, x / out / weight / bias 16-byte
//    aligned): one thread per (CV channels, chunk of CT tokens), dispatched CV = 8 (16-byte loads /
//    stores: a warp reads 512 contiguous bytes per token), CT = 16, on a 1-D grid with the channel
//    block fastest (kVecDefault = vec8x16_cf; other CV / CT / grid orders are tune configurations);
//    a chunk inside one live sequence whose window lies in x (every chunk but those at a sequence
//    start) loads all its CT + W-1 inputs up front (many bytes in flight per thread), others walk
//    token by token as the scalar path.
//    Scalar path (any other shape): one thread per (channel, chunk of 16 tokens); grid.x = token
//    chunks, grid.y = channel blocks of 128 (a warp reads 64 contiguous bytes per token). Either
//    thread finds the chunk's first sequence by binary search over cu_seqlens, keeps a W-1 window
//    in registers (re-initialised from the slot's state or zeros at a sequence start) and walks
//    its tokens. It only READS the state pool. Same f32 operations per output in both paths and in
//    conv1d.update (dk_conv1d::conv_out: FMA taps, hardware SiLU; bit-identical results).
// 2. final states: one thread per (sequence, channel); grid.x = N * channel blocks. It reads the
//    old W-1 history (if the sequence is shorter than W-1 part of it survives) and the last inputs,
//    then writes the new history, all in that one thread.
// Slots outside [0, num_slots) (incl. -1) are padding: zero output, state untouched. cu_seqlens
// values are clamped to [0, T], so bad values cannot make the kernels read outside x.
#include <cstdlib>
#include <cstring>

#include "../common/bf16x8.cuh"
#include "../common/launch.cuh"
#include "common.cuh"

namespace {

constexpr int kThreads = 128;
constexpr int kChunk = 16;

struct Seq {
  int64_t start, end;
  int32_t slot;  // -1 if padding / out of range
  bool init;
};

__device__ __forceinline__ int64_t cu_at(const DkConv1dPrefillParams& p, int64_t i) {
  int64_t v = reinterpret_cast<const int32_t*>(p.cu_seqlens)[i];
  return v < 0 ? 0 : (v > p.num_tokens ? p.num_tokens : v);
}

__device__ __forceinline__ Seq load_seq(const DkConv1dPrefillParams& p, int64_t i) {
  Seq s;
  s.start = cu_at(p, i);
  s.end = cu_at(p, i + 1);
  const int32_t slot = reinterpret_cast<const int32_t*>(p.slots)[i];
  s.slot = (slot < 0 || static_cast<int64_t>(slot) >= p.num_slots) ? -1 : slot;
  s.init = p.has_initial_state == 0 || reinterpret_cast<const uint8_t*>(p.has_initial_state)[i] != 0;
  return s;
}

// Window for token t of sequence s: inputs t-(W-1) .. t-1, from x inside the sequence, else from
// the slot's history (or zeros).
template <int W>
__device__ __forceinline__ void init_window(const DkConv1dPrefillParams& p, const Seq& s, int64_t t, int64_t c,
                                            float (&win)[W - 1]) {
  const auto* x = reinterpret_cast<const __nv_bfloat16*>(p.x);
  const auto* st = reinterpret_cast<const __nv_bfloat16*>(p.conv_state);
#pragma unroll
  for (int j = 0; j < W - 1; ++j) {
    const int64_t pos = t - (W - 1) + j;
    if (pos >= s.start) {
      win[j] = __bfloat162float(x[pos * p.x_stride + c]);
    } else if (s.init) {
      win[j] = __bfloat162float(st[(static_cast<int64_t>(s.slot) * p.conv_dim + c) * (W - 1) + (W - 1) + (pos - s.start)]);
    } else {
      win[j] = 0.f;
    }
  }
}

template <int W>
__global__ void __launch_bounds__(kThreads) conv1d_prefill_out_kernel(DkConv1dPrefillParams p) {
  const int64_t c = static_cast<int64_t>(blockIdx.y) * kThreads + threadIdx.x;
  if (c >= p.conv_dim) return;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kChunk;
  const int64_t t1 = t0 + kChunk < p.num_tokens ? t0 + kChunk : p.num_tokens;
  const auto* x = reinterpret_cast<const __nv_bfloat16*>(p.x);
  auto* out = reinterpret_cast<__nv_bfloat16*>(p.out);
  // Largest i in [0, N) with cu[i] <= t0.
  int64_t lo = 0, hi = p.num_seqs - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (cu_at(p, mid) <= t0) lo = mid; else hi = mid - 1;
  }
  int64_t seq = lo;
  while (seq + 1 < p.num_seqs && cu_at(p, seq + 1) <= t0) ++seq;
  const auto* weight = reinterpret_cast<const __nv_bfloat16*>(p.weight);
  float wt[W];
#pragma unroll
  for (int j = 0; j < W; ++j) wt[j] = __bfloat162float(weight[c * W + j]);
  const float bias = p.bias ? __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(p.bias)[c]) : 0.f;
  Seq s = load_seq(p, seq);
  float win[W - 1];
  bool have_window = false;
  for (int64_t t = t0; t < t1; ++t) {
    while (t >= s.end && seq + 1 < p.num_seqs) {
      ++seq;
      s = load_seq(p, seq);
      have_window = false;
    }
    if (t < s.start || t >= s.end || s.slot < 0) {  // padding (or a token no sequence covers)
      out[t * p.conv_dim + c] = __float2bfloat16_rn(0.f);
      continue;
    }
    if (!have_window) {
      init_window<W>(p, s, t, c, win);
      have_window = true;
    }
    const float xv = __bfloat162float(x[t * p.x_stride + c]);
    out[t * p.conv_dim + c] = __float2bfloat16_rn(dk_conv1d::conv_out<W>(wt, bias, win, xv));
#pragma unroll
    for (int j = 0; j < W - 2; ++j) win[j] = win[j + 1];
    win[W - 2] = xv;
  }
}

// ---- vector path: CV = 8 (16-byte accesses) or 4 (8-byte accesses) channels per thread ---------
constexpr int kVec = 8;  // channel multiple the vector path requires (and CV of the dispatched kernels)

// CV bf16 <-> f32 through one 16-byte (CV = 8, csrc/common/bf16x8.cuh) or 8-byte (CV = 4) access.
template <int CV>
struct RawV {
  using T = uint4;
};
template <>
struct RawV<4> {
  using T = uint2;
};
template <int CV>
__device__ __forceinline__ void unpackv(const typename RawV<CV>::T& raw, float (&f)[CV]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int j = 0; j < CV / 2; ++j) {
    const float2 v = __bfloat1622float2(h[j]);
    f[2 * j] = v.x;
    f[2 * j + 1] = v.y;
  }
}
template <int CV>
__device__ __forceinline__ void loadv(const __nv_bfloat16* p, float (&f)[CV]) {
  const typename RawV<CV>::T raw = *reinterpret_cast<const typename RawV<CV>::T*>(p);
  unpackv<CV>(raw, f);
}
template <int CV>
__device__ __forceinline__ void storev(__nv_bfloat16* p, const float (&f)[CV]) {
  typename RawV<CV>::T raw;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
  for (int j = 0; j < CV / 2; ++j) h[j] = __floats2bfloat162_rn(f[2 * j], f[2 * j + 1]);
  *reinterpret_cast<typename RawV<CV>::T*>(p) = raw;
}

// Outputs of one token for CV channels: silu(bias + taps) per channel, as conv_out<W, FMA>.
template <int W, bool FMA = true, int CV = kVec>
__device__ __forceinline__ void conv8(const float (&wt)[CV][W], const float (&bias)[CV],
                                      const float (&win)[W - 1][CV], const float (&xv)[CV], float (&o)[CV]) {
#pragma unroll
  for (int i = 0; i < CV; ++i) {
    float w1[W - 1];
#pragma unroll
    for (int j = 0; j < W - 1; ++j) w1[j] = win[j][i];
    o[i] = dk_conv1d::conv_out<W, FMA>(wt[i], bias[i], w1, xv[i]);
  }
}

// One thread per (CV channels c0..c0+CV-1, chunk of CT tokens). Requires conv_dim % 8 == 0,
// x_stride % 8 == 0 and 16-byte aligned x / out / weight / bias (checked by the launcher).
// CF (channel block fastest): a 1-D grid whose consecutive CTAs take the consecutive channel blocks of one
// token chunk (blockIdx.x = chunk * cblocks + channel block), so the CTAs resident at a time read and
// write whole token rows (x_stride * 2 contiguous bytes) instead of one channel block's column of many
// rows (the 2-D grid: grid.x = token chunks, grid.y = channel blocks).
template <int W, int CT, bool FMA = true, int CV = kVec, bool CF = false>
__global__ void __launch_bounds__(kThreads) conv1d_prefill_out_vec_kernel(DkConv1dPrefillParams p) {
  using Raw = typename RawV<CV>::T;
  int64_t cb, chunk;
  if constexpr (CF) {
    const uint32_t cblocks = static_cast<uint32_t>((p.conv_dim + kThreads * CV - 1) / (kThreads * CV));
    cb = blockIdx.x % cblocks;
    chunk = blockIdx.x / cblocks;
  } else {
    cb = blockIdx.y;
    chunk = blockIdx.x;
  }
  const int64_t c0 = (cb * kThreads + threadIdx.x) * CV;
  if (c0 >= p.conv_dim) return;
  const int64_t t0 = chunk * CT;
  const int64_t t1 = t0 + CT < p.num_tokens ? t0 + CT : p.num_tokens;
  const auto* x = reinterpret_cast<const __nv_bfloat16*>(p.x);
  auto* out = reinterpret_cast<__nv_bfloat16*>(p.out);
  // Largest i in [0, N) with cu[i] <= t0.
  int64_t lo = 0, hi = p.num_seqs - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (cu_at(p, mid) <= t0) lo = mid; else hi = mid - 1;
  }
  int64_t seq = lo;
  while (seq + 1 < p.num_seqs && cu_at(p, seq + 1) <= t0) ++seq;
  // weight [conv_dim, W]: the CV channels' taps are CV * W contiguous values (CV = 8: W 16-byte loads).
  const auto* weight = reinterpret_cast<const __nv_bfloat16*>(p.weight) + c0 * W;
  float wt[CV][W];
  if constexpr (CV == 8) {
#pragma unroll
    for (int q = 0; q < W; ++q) {
      float f[8];
      dk::load_bf16x8(weight + q * 8, f);
#pragma unroll
      for (int e = 0; e < 8; ++e) wt[(q * 8 + e) / W][(q * 8 + e) % W] = f[e];
    }
  } else {
#pragma unroll
    for (int e = 0; e < CV * W; ++e) wt[e / W][e % W] = __bfloat162float(weight[e]);
  }
  float bias[CV];
  if (p.bias) {
    loadv<CV>(reinterpret_cast<const __nv_bfloat16*>(p.bias) + c0, bias);
  } else {
#pragma unroll
    for (int i = 0; i < CV; ++i) bias[i] = 0.f;
  }
  Seq s = load_seq(p, seq);
  // Fast path: the whole chunk is one live sequence's and its window lies in x.
  if (t1 - t0 == CT && s.slot >= 0 && t0 - (W - 1) >= s.start && t1 <= s.end) {
    // All CT + W - 1 input rows in flight at once (raw bf16: CV / 2 registers a row).
    Raw xs[CT + W - 1];
#pragma unroll
    for (int j = 0; j < CT + W - 1; ++j) xs[j] = *reinterpret_cast<const Raw*>(x + (t0 - (W - 1) + j) * p.x_stride + c0);
    float win[W - 1][CV];
#pragma unroll
    for (int q = 0; q < W - 1; ++q) unpackv<CV>(xs[q], win[q]);
#pragma unroll
    for (int j = 0; j < CT; ++j) {
      float xv[CV], o[CV];
      unpackv<CV>(xs[j + W - 1], xv);
      conv8<W, FMA, CV>(wt, bias, win, xv, o);
      storev<CV>(out + (t0 + j) * p.conv_dim + c0, o);
#pragma unroll
      for (int q = 0; q < W - 2; ++q)
#pragma unroll
        for (int i = 0; i < CV; ++i) win[q][i] = win[q + 1][i];
#pragma unroll
      for (int i = 0; i < CV; ++i) win[W - 2][i] = xv[i];
    }
    return;
  }
  float win[W - 1][CV];
  bool have_window = false;
  for (int64_t t = t0; t < t1; ++t) {
    while (t >= s.end && seq + 1 < p.num_seqs) {
      ++seq;
      s = load_seq(p, seq);
      have_window = false;
    }
    if (t < s.start || t >= s.end || s.slot < 0) {  // padding (or a token no sequence covers)
      float z[CV];
#pragma unroll
      for (int i = 0; i < CV; ++i) z[i] = 0.f;
      storev<CV>(out + t * p.conv_dim + c0, z);
      continue;
    }
    if (!have_window) {
#pragma unroll
      for (int i = 0; i < CV; ++i) {
        float w1[W - 1];
        init_window<W>(p, s, t, c0 + i, w1);
#pragma unroll
        for (int j = 0; j < W - 1; ++j) win[j][i] = w1[j];
      }
      have_window = true;
    }
    float xv[CV], o[CV];
    loadv<CV>(x + t * p.x_stride + c0, xv);
    conv8<W, FMA, CV>(wt, bias, win, xv, o);
    storev<CV>(out + t * p.conv_dim + c0, o);
#pragma unroll
    for (int j = 0; j < W - 2; ++j)
#pragma unroll
      for (int i = 0; i < CV; ++i) win[j][i] = win[j + 1][i];
#pragma unroll
    for (int i = 0; i < CV; ++i) win[W - 2][i] = xv[i];
  }
}

template <int W>
__global__ void __launch_bounds__(kThreads) conv1d_prefill_state_kernel(DkConv1dPrefillParams p, int64_t cblocks) {
  const int64_t i = blockIdx.x / cblocks;
  const int64_t c = (blockIdx.x % cblocks) * kThreads + threadIdx.x;
  if (c >= p.conv_dim) return;
  const Seq s = load_seq(p, i);
  if (s.slot < 0) return;
  const auto* x = reinterpret_cast<const __nv_bfloat16*>(p.x);
  auto* st = reinterpret_cast<__nv_bfloat16*>(p.conv_state) + (static_cast<int64_t>(s.slot) * p.conv_dim + c) * (W - 1);
  const int64_t len = s.end > s.start ? s.end - s.start : 0;
  __nv_bfloat16 old[W - 1], nw[W - 1];
#pragma unroll
  for (int j = 0; j < W - 1; ++j) old[j] = s.init ? st[j] : __float2bfloat16_rn(0.f);
#pragma unroll
  for (int j = 0; j < W - 1; ++j) {
    const int64_t idx = len - (W - 1) + j;  // position in the sequence; < 0: from the old history
    nw[j] = idx >= 0 ? x[(s.start + idx) * p.x_stride + c] : old[(W - 1) + idx];
  }
#pragma unroll
  for (int j = 0; j < W - 1; ++j) st[j] = nw[j];
}

// Output-kernel configurations: kAuto = the dispatch (kVecDefault when the shape allows the vector
// path, else scalar; DELTAKIT_CONV1D_PREFILL=<name of another configuration> forces that one where it
// applies, for tests and measurements); the others force one (tools/tune: same-process comparisons).
// Names: vecCxT = C channels x T tokens per thread; _ref = the reference's separate multiply and add
// per tap instead of FMA.
// _cf = the channel-block-fastest 1-D grid (see conv1d_prefill_out_vec_kernel's CF).
enum Cfg {
  kAuto = 0, kScalar = 1, kVec8 = 2, kVec16 = 3, kVec32 = 4, kVec8Ref = 5,
  kC4Vec8 = 6, kC4Vec16 = 7, kVec4 = 8, kC4Vec8Ref = 9,
  kC4Vec8Cf = 10, kC4Vec16Cf = 11, kVec8Cf = 12, kVec16Cf = 13, kNumCfgs = 14
};
constexpr const char* kCfgNames[kNumCfgs] = {"auto",    "scalar",    "vec8x8", "vec8x16",   "vec8x32",
                                             "vec8x8_ref", "vec4x8", "vec4x16", "vec8x4", "vec4x8_ref",
                                             "vec4x8_cf", "vec4x16_cf", "vec8x8_cf", "vec8x16_cf"};
// The dispatched vector configuration: 8 channels (16-byte accesses) x 16 tokens per thread on the
// channel-block-fastest grid (vec8x16_cf). H200, 2026-12-01 session 5 (tools/bench_anchors_gdr.py
// --streaming, us, 27B 1x8192 / 8x1024, 9B 1x8192 / 8x1024): vec8x16_cf 92.2 / 100.1 / 75.9 / 84.0 vs the
// previous default vec4x8 (2-D grid, chunk fastest) 101.1 / 105.7 / 83.2 / 86.0 (86% vs 78% of the 4.25 TB/s
// copy ceiling at 27B 1x8192); vec4x16_cf 96.0 / 101.3 / 79.2 / 84.5, vec4x8_cf 100.0 / 102.8 / 82.2 / 83.8;
// every configuration bit-exact vs the scalar path. With the 2-D grid the CTAs resident at a time read a
// 1 KB channel column of ~1000 token rows; with CF they read whole token rows, and 16 tokens per thread
// halve the W-1 halo rows re-read per output.
constexpr Cfg kVecDefault = kVec16Cf;

Cfg cfg_selected() {
  static const Cfg cfg = [] {
    const char* e = std::getenv("DELTAKIT_CONV1D_PREFILL");
    if (e == nullptr) return kAuto;
    for (int i = 1; i < kNumCfgs; ++i) {
      if (std::strcmp(e, kCfgNames[i]) == 0) return static_cast<Cfg>(i);
    }
    return kAuto;
  }();
  return cfg;
}

bool vec_ok(const DkConv1dPrefillParams& p) {
  return p.conv_dim % kVec == 0 && p.x_stride % kVec == 0 && p.x % 16 == 0 && p.out % 16 == 0 &&
         p.weight % 16 == 0 && p.bias % 16 == 0;
}

template <int W, int CT, bool FMA = true, int CV = kVec, bool CF = false>
dk_status launch_vec(const DkConv1dPrefillParams& p, cudaStream_t stream) {
  const int64_t cblocks = dk::ceil_div(p.conv_dim, kThreads * CV);
  const int64_t chunks = dk::ceil_div(p.num_tokens, CT);
  if (chunks > 0x7fffffffLL) return DK_ERR_INVALID_ARGUMENT;
  if (CF && chunks * cblocks <= 0x7fffffffLL) {
    conv1d_prefill_out_vec_kernel<W, CT, FMA, CV, true>
        <<<static_cast<unsigned>(chunks * cblocks), kThreads, 0, stream>>>(p);
    return dk::launch_status();
  }
  dim3 grid(static_cast<unsigned>(chunks), static_cast<unsigned>(cblocks));
  conv1d_prefill_out_vec_kernel<W, CT, FMA, CV><<<grid, kThreads, 0, stream>>>(p);
  return dk::launch_status();
}

template <int W>
dk_status launch(const DkConv1dPrefillParams& p, cudaStream_t stream, int cfg) {
  const int64_t cblocks = dk::ceil_div(p.conv_dim, kThreads);
  if (cblocks > 65535) return DK_ERR_INVALID_ARGUMENT;
  const int64_t chunks = dk::ceil_div(p.num_tokens, kChunk);
  if (chunks > 0x7fffffffLL || p.num_seqs * cblocks > 0x7fffffffLL) return DK_ERR_INVALID_ARGUMENT;
  if (cfg == kAuto) {
    const Cfg forced = cfg_selected();
    cfg = forced == kScalar || (forced != kAuto && vec_ok(p)) ? forced : vec_ok(p) ? kVecDefault : kScalar;
  }
  if (cfg != kScalar && !vec_ok(p)) return DK_ERR_UNSUPPORTED;
  if (chunks > 0) {
    dk_status st = DK_OK;
    if (cfg == kVec8) {
      st = launch_vec<W, 8>(p, stream);
    } else if (cfg == kVec16) {
      st = launch_vec<W, 16>(p, stream);
    } else if (cfg == kVec32) {
      st = launch_vec<W, 32>(p, stream);
    } else if (cfg == kVec8Ref) {
      st = launch_vec<W, 8, false>(p, stream);
    } else if (cfg == kC4Vec8) {
      st = launch_vec<W, 8, true, 4>(p, stream);
    } else if (cfg == kC4Vec16) {
      st = launch_vec<W, 16, true, 4>(p, stream);
    } else if (cfg == kVec4) {
      st = launch_vec<W, 4>(p, stream);
    } else if (cfg == kC4Vec8Ref) {
      st = launch_vec<W, 8, false, 4>(p, stream);
    } else if (cfg == kC4Vec8Cf) {
      st = launch_vec<W, 8, true, 4, true>(p, stream);
    } else if (cfg == kC4Vec16Cf) {
      st = launch_vec<W, 16, true, 4, true>(p, stream);
    } else if (cfg == kVec8Cf) {
      st = launch_vec<W, 8, true, kVec, true>(p, stream);
    } else if (cfg == kVec16Cf) {
      st = launch_vec<W, 16, true, kVec, true>(p, stream);
    } else {
      dim3 grid(static_cast<unsigned>(chunks), static_cast<unsigned>(cblocks));
      conv1d_prefill_out_kernel<W><<<grid, kThreads, 0, stream>>>(p);
      st = dk::launch_status();
    }
    if (st != DK_OK) return st;
  }
  conv1d_prefill_state_kernel<W><<<static_cast<unsigned>(p.num_seqs * cblocks), kThreads, 0, stream>>>(p, cblocks);
  return dk::launch_status();
}

dk_status prefill_cfg(const DkConv1dPrefillParams* p, dk_stream_t stream, int cfg) {
  if (p == nullptr) return DK_ERR_INVALID_ARGUMENT;
  if (p->num_tokens < 0 || p->num_seqs < 0 || p->conv_dim < 1 || p->num_slots < 0 || p->x_stride < p->conv_dim)
    return DK_ERR_INVALID_ARGUMENT;
  if (p->width < 2 || p->width > 4) return DK_ERR_UNSUPPORTED;
  if (cfg < 0 || cfg >= kNumCfgs) return DK_ERR_INVALID_ARGUMENT;
  if (p->num_seqs == 0) return p->num_tokens == 0 ? DK_OK : DK_ERR_INVALID_ARGUMENT;
  if (p->cu_seqlens == 0 || p->slots == 0 || p->weight == 0 || p->conv_state == 0) return DK_ERR_INVALID_ARGUMENT;
  if (p->num_tokens > 0 && (p->x == 0 || p->out == 0)) return DK_ERR_INVALID_ARGUMENT;
  if (p->x % 2 || p->weight % 2 || p->bias % 2 || p->cu_seqlens % 4 || p->slots % 4 || p->conv_state % 2 || p->out % 2)
    return DK_ERR_INVALID_ARGUMENT;
  auto* s = static_cast<cudaStream_t>(stream);
  switch (p->width) {
    case 2: return launch<2>(*p, s, cfg);
    case 3: return launch<3>(*p, s, cfg);
    default: return launch<4>(*p, s, cfg);
  }
}

}  // namespace

extern "C" dk_status dk_conv1d_prefill(const DkConv1dPrefillParams* p, dk_stream_t stream) {
  return prefill_cfg(p, stream, kAuto);
}
