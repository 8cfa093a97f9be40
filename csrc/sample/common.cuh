// Shared pieces of the one-CTA-per-row sample.* kernels (topk.cu, top_p.cu): bf16 order keys,
// the row walk in index-ordered tiles, block reductions and scans, and the 256-bin suffix select
// of the two-level radix select. Everything here is deterministic (integer atomics or fixed
// reduction trees), so results never depend on thread scheduling.
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

#include "../common/launch.cuh"

namespace dk_sample {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;  // == 32: one warp can scan/reduce the warp partials
constexpr int kVec = 8;                // bf16 per 16-byte load
constexpr int kBins = 256;             // radix digit: 8 bits of the 16-bit key

// Order-preserving 16-bit key of bf16 bits: a larger key is a larger value in the total order
// -NaN < -inf < ... < -0 < +0 < ... < +inf < +NaN (f32::total_cmp of the widened value).
__device__ __forceinline__ uint32_t key16(uint32_t b) { return (b & 0x8000u) ? (~b & 0xFFFFu) : (b | 0x8000u); }
// Inverse of key16.
__device__ __forceinline__ uint32_t bits_of_key(uint32_t k) { return (k & 0x8000u) ? (k & 0x7FFFu) : (~k & 0xFFFFu); }
__device__ __forceinline__ bool is_nan_bits(uint32_t b) { return (b & 0x7FFFu) > 0x7F80u; }
__device__ __forceinline__ float bf16_bits_to_float(uint32_t b) { return __uint_as_float(b << 16); }

// Walks a row of n bf16 values in block-uniform tiles, in index order: a head of up to 7 elements
// (up to the first 16-byte boundary, one per thread), body tiles in which thread t holds the 8
// consecutive elements of one 16-byte load, and a tail of up to 7 elements (one per thread). Every
// thread calls f(first, v, cnt) for every tile, with cnt = 0 when it holds nothing (so f may
// synchronize the block); v[0..cnt) are the bits of elements first .. first + cnt - 1. Within a
// thread and across tiles, indices increase; within a tile, they increase with the thread id.
template <class F>
__device__ __forceinline__ void for_each_tile(const uint16_t* __restrict__ row, int64_t n, F&& f) {
  const int t = threadIdx.x;
  const uintptr_t addr = reinterpret_cast<uintptr_t>(row);
  int64_t head = static_cast<int64_t>(((16u - (addr & 15u)) & 15u) / 2u);
  if (head > n) head = n;
  uint32_t v[kVec];
  if (head > 0) {
    const int cnt = t < head ? 1 : 0;
    if (cnt) v[0] = row[t];
    f(static_cast<int64_t>(t), v, cnt);
  }
  const int64_t nvec = (n - head) / kVec;
  const uint4* body = reinterpret_cast<const uint4*>(row + head);
  for (int64_t base = 0; base < nvec; base += kThreads) {
    const int64_t i = base + t;
    int cnt = 0;
    if (i < nvec) {
      const uint4 u = __ldg(body + i);
      v[0] = u.x & 0xFFFFu;
      v[1] = u.x >> 16;
      v[2] = u.y & 0xFFFFu;
      v[3] = u.y >> 16;
      v[4] = u.z & 0xFFFFu;
      v[5] = u.z >> 16;
      v[6] = u.w & 0xFFFFu;
      v[7] = u.w >> 16;
      cnt = kVec;
    }
    f(head + i * kVec, v, cnt);
  }
  const int64_t tail0 = head + nvec * kVec;
  const int64_t tail = n - tail0;
  if (tail > 0) {
    const int cnt = t < tail ? 1 : 0;
    if (cnt) v[0] = row[tail0 + t];
    f(tail0 + t, v, cnt);
  }
}

template <class T>
__device__ __forceinline__ T warp_incl_scan(T v) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const T o = __shfl_up_sync(0xffffffffu, v, off);
    if (lane >= off) v += o;
  }
  return v;
}

// Exclusive prefix sum of v over the block in thread order; *total = the block sum (same in every
// thread). ws: shared scratch of kWarps + 1 elements. Every thread must call; synchronizes the
// block (also on exit, so ws may be reused right away).
template <class T>
__device__ __forceinline__ T block_excl_scan(T v, T* ws, T* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const T inc = warp_incl_scan(v);
  if (lane == 31) ws[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    const T w = ws[lane];
    const T wi = warp_incl_scan(w);
    ws[lane] = wi - w;
    if (lane == 31) ws[kWarps] = wi;
  }
  __syncthreads();
  const T out = ws[warp] + inc - v;
  *total = ws[kWarps];
  __syncthreads();
  return out;
}

// Block sum of v (fixed tree, deterministic for integers; floats in a fixed order). ws: kWarps + 1.
template <class T>
__device__ __forceinline__ T block_sum(T v, T* ws) {
  T total;
  block_excl_scan(v, ws, &total);
  return total;
}

// Block maximum of a float (NaN-free input). ws: kWarps + 1 floats.
__device__ __forceinline__ float block_max(float v, float* ws) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  if (lane == 0) ws[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float w = ws[lane];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) w = fmaxf(w, __shfl_xor_sync(0xffffffffu, w, off));
    if (lane == 0) ws[kWarps] = w;
  }
  __syncthreads();
  const float out = ws[kWarps];
  __syncthreads();
  return out;
}

// Lane-private histogram copies: copy c of bin b at hist[b * Copies + c], written by lanes with
// lane % Copies == c, so one warp's atomics never collide on an address (and, for Copies == 32
// of u32, never on a bank); sum_copies folds them into bins[kBins].
template <class T, int Copies>
__device__ __forceinline__ void hist_clear(T* hist) {
  for (int i = threadIdx.x; i < kBins * Copies; i += kThreads) hist[i] = 0;
}

template <class T, int Copies>
__device__ __forceinline__ void hist_add(T* hist, uint32_t bin, T v) {
  atomicAdd(hist + bin * Copies + (threadIdx.x % Copies), v);
}

// Every thread must call: it first synchronizes the block, so all hist_add atomics have landed
// before the copies are read (a caller cannot forget the barrier).
template <class T, int Copies>
__device__ __forceinline__ void sum_copies(const T* hist, T* bins) {
  __syncthreads();
  const int t = threadIdx.x;
  if (t < kBins) {
    T s = 0;
#pragma unroll 8
    for (int c = 0; c < Copies; ++c) s += hist[t * Copies + ((c + t) % Copies)];  // rotated: fewer bank conflicts
    bins[t] = s;
  }
}

// Suffix select over bins[kBins] (shared): finds the largest bin b with sum_{c >= b} bins[c] >= need
// (1 <= need <= sum of all bins) and writes *bin = b, *above = sum_{c > b} bins[c]. *bin stays -1
// if no bin qualifies (need out of range). ws: shared scratch of kBins / 32 elements. Every thread
// must call; synchronizes the block before and after.
template <class T>
__device__ __forceinline__ void select_bin(const T* bins, T need, T* ws, int* bin, T* above) {
  const int t = threadIdx.x;
  if (t == 0) *bin = -1;
  __syncthreads();  // bins complete, *bin reset
  T c = 0, incl = 0;
  if (t < kBins) {  // warps 0..7, whole warps
    c = bins[kBins - 1 - t];
    incl = warp_incl_scan(c);
    if ((t & 31) == 31) ws[t >> 5] = incl;
  }
  __syncthreads();
  if (t < kBins) {
    for (int w = 0; w < (t >> 5); ++w) incl += ws[w];
    const T excl = incl - c;
    if (incl >= need && excl < need) {  // exactly one thread: incl is non-decreasing in t
      *bin = kBins - 1 - t;
      *above = excl;
    }
  }
  __syncthreads();
}

}  // namespace dk_sample
