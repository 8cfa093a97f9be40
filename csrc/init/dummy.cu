// init.dummy: seeded dummy weights generated on the device (issue 13, item 8).
//
// Every element is a pure function of (seed, tensor_id, full-tensor index): the splitmix64 stream
// of key = mix(seed + mix(tensor_id + GAMMA)), element i drawing mix(key + (i + 1) * GAMMA),
// mapped to a unit variate (uniform on a 24-bit grid, or Irwin-Hall of four 16-bit lanes), then
// fma(scale, x, offset) (and a fixed-operation ln for LogUniform), rounded to bf16 (RNE). The CPU
// twin deltakit_ref::init computes the same bits: every f32 operation here is an explicit
// IEEE-rounded intrinsic (__fmul_rn, __fadd_rn, __fdiv_rn, __fmaf_rn), so nvcc cannot contract
// or reassociate it.
//
// Layout: out bf16 [rows, cols] contiguous; element (r, c) is full-tensor index base + r * ld + c
// (int64). Thread mapping: 2-D grid-stride, blockIdx.y over rows, x over groups of 8 columns; a
// thread computes 8 consecutive elements (the counter advances by GAMMA per element) and writes
// them with one 16-byte store when the group is whole and its address 16-byte aligned, else with
// scalar stores. Pure integer hashing (two 64-bit multiplies per element) + one store: a fill is
// bound by the integer pipe and HBM writes together.
#include <cuda_bf16.h>
#include <float.h>
#include <math.h>

#include "../common/launch.cuh"

namespace {

constexpr uint64_t kGamma = 0x9E3779B97F4A7C15ull;
constexpr uint32_t kNormalScaleBits = 0x375DB3D7u;  // sqrt(3) * 2^-17
constexpr uint32_t kSqrt2Bits = 0x3FB504F3u;
constexpr uint32_t kLn2Bits = 0x3F317218u;
constexpr uint32_t kInv3Bits = 0x3EAAAAABu;
constexpr uint32_t kInv5Bits = 0x3E4CCCCDu;
constexpr uint32_t kInv7Bits = 0x3E124925u;
constexpr uint32_t kInv9Bits = 0x3DE38E39u;

__host__ __device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__device__ __forceinline__ float unit_uniform(uint64_t bits) {
  return __fmul_rn(__int2float_rn(static_cast<int>(bits >> 40) - (1 << 23)), 0x1p-23f);
}

__device__ __forceinline__ float unit_normal(uint64_t bits) {
  int t = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) t += 2 * static_cast<int>((bits >> (16 * j)) & 0xFFFFu) - 65535;
  return __fmul_rn(__int2float_rn(t), __uint_as_float(kNormalScaleBits));
}

// ln of a positive normal finite x: the same operation sequence as deltakit_ref::init::ln_f32.
__device__ __forceinline__ float dk_init_ln(float x) {
  const uint32_t b = __float_as_uint(x);
  int e = static_cast<int>((b >> 23) & 0xFFu) - 127;
  float m = __uint_as_float((b & 0x007FFFFFu) | 0x3F800000u);
  if (m > __uint_as_float(kSqrt2Bits)) {
    m = __fmul_rn(m, 0.5f);
    e += 1;
  }
  const float s = __fdiv_rn(__fsub_rn(m, 1.0f), __fadd_rn(m, 1.0f));
  const float s2 = __fmul_rn(s, s);
  float p = __fmaf_rn(s2, __uint_as_float(kInv9Bits), __uint_as_float(kInv7Bits));
  p = __fmaf_rn(s2, p, __uint_as_float(kInv5Bits));
  p = __fmaf_rn(s2, p, __uint_as_float(kInv3Bits));
  const float r = __fmul_rn(s2, p);
  const float two_s = __fadd_rn(s, s);
  const float ln_m = __fmaf_rn(two_s, r, two_s);
  return __fmaf_rn(__int2float_rn(e), __uint_as_float(kLn2Bits), ln_m);
}

template <int Dist>
__device__ __forceinline__ float draw(uint64_t state, float scale, float offset) {
  if constexpr (Dist == DK_INIT_CONSTANT) {
    return offset;
  } else if constexpr (Dist == DK_INIT_UNIFORM) {
    return __fmaf_rn(scale, unit_uniform(mix64(state)), offset);
  } else if constexpr (Dist == DK_INIT_NORMAL) {
    return __fmaf_rn(scale, unit_normal(mix64(state)), offset);
  } else {
    return dk_init_ln(__fmaf_rn(scale, unit_uniform(mix64(state)), offset));
  }
}

template <int Dist>
__global__ void __launch_bounds__(256) init_dummy_kernel(__nv_bfloat16* __restrict__ out,
                                                         int64_t rows, int64_t cols, int64_t base,
                                                         int64_t ld, uint64_t key, float scale,
                                                         float offset) {
  const int64_t groups = (cols + 7) / 8;
  const int64_t gstride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    __nv_bfloat16* row = out + r * cols;
    const uint64_t row_index = static_cast<uint64_t>(base + r * ld);
    for (int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < groups;
         g += gstride) {
      const int64_t c0 = g * 8;
      // splitmix64 state of element i is key + (i + 1) * GAMMA (wrapping).
      uint64_t state = key + (row_index + static_cast<uint64_t>(c0) + 1) * kGamma;
      __nv_bfloat16* dst = row + c0;
      if (c0 + 8 <= cols && (reinterpret_cast<uintptr_t>(dst) & 15) == 0) {
        __align__(16) __nv_bfloat16 v[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          v[j] = __float2bfloat16_rn(draw<Dist>(state, scale, offset));
          state += kGamma;
        }
        *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(v);
      } else {
        const int64_t n = cols - c0 < 8 ? cols - c0 : 8;
        for (int64_t j = 0; j < n; ++j) {
          dst[j] = __float2bfloat16_rn(draw<Dist>(state, scale, offset));
          state += kGamma;
        }
      }
    }
  }
}

// The same checks as deltakit_ref::init::{validate, DummyRegion::validate}.
bool valid(const DkInitDummyParams* p) {
  if (p->rows < 0 || p->cols < 0 || p->base < 0 || p->ld < 0) return false;
  if (p->rows > 1 && p->ld < p->cols) return false;
  if (p->rows > 0 && p->cols > 0) {
    // base + (rows - 1) * ld + cols <= INT64_MAX, without overflow.
    const __int128 last = static_cast<__int128>(p->rows - 1) * p->ld + p->base + p->cols;
    if (last > static_cast<__int128>(INT64_MAX)) return false;
  }
  if (!isfinite(p->scale) || !isfinite(p->offset)) return false;
  const double o = p->offset, s = fabs(static_cast<double>(p->scale));
  double reach;
  switch (p->dist) {
    case DK_INIT_CONSTANT: reach = 0.0; break;
    case DK_INIT_UNIFORM:
    case DK_INIT_LOG_UNIFORM: reach = s; break;
    case DK_INIT_NORMAL: reach = 3.5 * s; break;
    default: return false;
  }
  if (fabs(o) + reach > static_cast<double>(FLT_MAX) / 2.0) return false;
  if (p->dist == DK_INIT_LOG_UNIFORM && o - s < static_cast<double>(FLT_MIN)) return false;
  return true;
}

template <int Dist>
dk_status launch(const DkInitDummyParams* p, dk_stream_t stream) {
  const uint64_t key = mix64(p->seed + mix64(p->tensor_id + kGamma));
  const int threads = 256;
  const int64_t groups = (p->cols + 7) / 8;
  const int64_t by = p->rows < 1024 ? p->rows : 1024;
  int64_t bx = (groups + threads - 1) / threads;
  const int64_t bx_cap = 4096 / by > 1 ? 4096 / by : 1;  // ~4 waves of 256-thread blocks on H200
  if (bx > bx_cap) bx = bx_cap;
  init_dummy_kernel<Dist><<<dim3(static_cast<unsigned>(bx), static_cast<unsigned>(by)), threads, 0,
                            stream>>>(reinterpret_cast<__nv_bfloat16*>(p->out), p->rows, p->cols,
                                      p->base, p->ld, key, p->scale, p->offset);
  return dk::launch_status();
}

}  // namespace

extern "C" dk_status dk_init_dummy(const DkInitDummyParams* p, dk_stream_t stream) {
  if (p == nullptr || !valid(p)) return DK_ERR_INVALID_ARGUMENT;
  if (p->rows == 0 || p->cols == 0) return DK_OK;
  if (p->out == 0 || p->out % 2 != 0) return DK_ERR_INVALID_ARGUMENT;
  switch (p->dist) {
    case DK_INIT_CONSTANT: return launch<DK_INIT_CONSTANT>(p, stream);
    case DK_INIT_UNIFORM: return launch<DK_INIT_UNIFORM>(p, stream);
    case DK_INIT_NORMAL: return launch<DK_INIT_NORMAL>(p, stream);
    case DK_INIT_LOG_UNIFORM: return launch<DK_INIT_LOG_UNIFORM>(p, stream);
    default: return DK_ERR_INVALID_ARGUMENT;
  }
}
