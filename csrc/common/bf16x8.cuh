// Eight bf16 values <-> eight f32 through one 16-byte access (uint4), for the memory-bound kernels
// (norm.*, conv1d.*, the elementwise ops). Callers guarantee 16-byte alignment of `p`.
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

namespace dk {

__device__ __forceinline__ void unpack_bf16x8(const uint4& raw, float (&f)[8]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 v = __bfloat1622float2(h[j]);
    f[2 * j] = v.x;
    f[2 * j + 1] = v.y;
  }
}

// The 16-byte value is copied to a local first: binding the reference straight to global memory
// lets nvcc split the access into 16-bit pair loads (ld.global.v2.u16) instead of one v4 load.
__device__ __forceinline__ void load_bf16x8(const __nv_bfloat16* p, float (&f)[8]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  unpack_bf16x8(raw, f);
}

__device__ __forceinline__ void store_bf16x8(__nv_bfloat16* p, const float (&f)[8]) {
  uint4 raw;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
  for (int j = 0; j < 4; ++j) h[j] = __floats2bfloat162_rn(f[2 * j], f[2 * j + 1]);
  *reinterpret_cast<uint4*>(p) = raw;
}

}  // namespace dk
