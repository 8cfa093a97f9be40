// gdr.chunk_prefill for sm_90a, first piece (issue 15): the STATE PASS as a persistent
// warp-specialized CUDA kernel with the state resident on chip across chunks and W / K consumed
// from shared memory by wgmma. Not the library's default: exported as
// dk_gdr_chunk_state_sm90 for the same-process harness (tools/bench_anchors_gdr.py --sm90-state,
// through .gpu-gdr/libdk_gdr_bench.so), which checks it against the Triton state pass
// (gdr_chunk_state_k128v128_ws_bv32) on the same inputs, and opt-in in the library
// (DELTAKIT_GDR_PREFILL=sm90). Design note: docs/gdr-chunk-prefill-sm90.md.
//
// Contract: the Triton state pass of triton_aot/gdr/chunk_prefill.py with W as bf16 hi / lo planes
// (WSPLIT = 1), K = V = 128, after the kkt / solve / W/U passes filled the workspace. Per
// (sequence, value head hv, BV = 64 value columns), with S the f32 state tile [K, BV]:
//   for each 64-token chunk j of the sequence (tokens t0 .. min(t0 + 64, eos)):
//     h[c0 + j, hv, :, cols] = bf16(S)                                 (per-chunk states, output pass)
//     D = U_j - W_j S        W_j = W_hi + W_lo (bf16 planes), S = S_hi + S_lo: the three products
//                            W_hi S_hi + (W_hi S_lo + W_lo S_hi) (as _mm_ff, PREC 4)
//     u[rows, hv, cols] = D                                            (overwrites U in place)
//     S = e^{g_last} S + K_j^T (D * dec[:, None]),  dec[t] = e^{g_last - gc[t]} * rn_k[t]
//                            (K raw bf16, exact; D * dec split into bf16 hi + lo: two products)
//   slot state read (init_mode 1 / per-sequence flag 2) or zeros (0); final S written back.
// Same products and rounding points as the Triton kernel up to the f32 summation order inside the
// tensor cores (the Triton kernel's dots are wgmma too).
//
// Layout of the work (one CTA per (sequence, head, 64 value columns); 256 threads):
//   warpgroup 0 = producer: cp.async copies of chunk j+1's W hi / lo planes and K rows (64 x 128
//     bf16 each, 128-byte-swizzled 64-column panels) into a 2-stage ring, signalled through
//     mbarriers (cp.async.mbarrier.arrive), while the consumer works on chunk j;
//   warpgroup 1 = consumer: holds S [128, 64] f32 in registers (two m64 accumulator tiles, 64
//     registers), per chunk: S -> bf16 hi / lo in shared memory (MN-major B operand) + h store,
//     D = W S as 24 wgmma m64n64k16 (A = W planes K-major, B = S MN-major), D = U - D with U read
//     straight into the accumulator layout, D stored, D * dec -> bf16 hi / lo in shared memory,
//     S = e^{g_last} S + K^T D' as 16 wgmma m64n64k16 (A = K^T: the K tile MN-major, B = D'
//     MN-major), then the stage goes back to the producer.
// Shared memory: 2 x (W hi + W lo + K = 48 KB) + S hi / lo 32 KB + D' hi / lo 16 KB + 0.5 KB.
// Variants (template VAR; dk_gdr_chunk_state_sm90_variant): 0 = the above (measured on an H200: matches the Triton
// state pass, 507 vs 560 us at 27B TP1); 1 = the producer also copies each chunk's U tile and gates into the stage
// (+17 KB a stage), so the consumer's U / gate reads are shared-memory reads after the D products instead of global
// loads at the chunk start (compiled: 0 spills with a 56-register producer; not yet run on a GPU); 2 = two consumer
// warpgroups per CTA (384 threads, grid (N, H_v, 1)), one per 64-column value half, sharing the W / K ring (compiled:
// 0 spills, 40 HGMMA per chunk per consumer; not yet run on a GPU).
#include <cuda_bf16.h>
#include <stdint.h>

#include <atomic>

#include "../common/launch.cuh"
#include "chunk_prefill_sm90.h"

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DK_GDR_SM90A 1
#endif

namespace dk {
namespace gdr_sm90 {

constexpr int kK = 128;         // key head dim
constexpr int kV = 128;         // value head dim
constexpr int kBV = 64;         // value columns per CTA
constexpr int kBT = 64;         // tokens per chunk
constexpr int kStages = 2;      // W / K ring depth
constexpr int kThreads = 256;   // producer warpgroup + consumer warpgroup (VAR 0 / 1)
constexpr float kGFloor = 64.f;  // gates clamped at -64 by the kkt pass; factors <= e^-63 flush to 0

// Shared-memory plan (byte offsets from a 1024-aligned base). VAR (variant): 0 = U and the gates read by the consumer
// from global memory at the chunk start (the measured v0); 1 = the producer also copies the chunk's U tile (f32 [64,
// 64], rows of 256 bytes, 16-byte chunks XOR-swizzled by row) and gates (f32 [64]) into the stage, a chunk ahead.
constexpr uint32_t kPanel = kBT * 128;               // one 64-row x 64-column bf16 panel: 8 KB
constexpr uint32_t kTileWK = 2 * kPanel;             // a 64 x 128 bf16 tile (W hi, W lo or K): 16 KB
constexpr uint32_t kTileU = kBT * kBV * 4;           // U tile f32 [64, 64]: 16 KB (VAR 1)
// VAR 2: two consumer warpgroups per CTA, one per 64-column half of the head's value columns (grid (N, H_v, 1),
// 384 threads): both read the same W / K tiles of the ring (loaded once for the head instead of once per half), each
// keeps its own S / D' / rn tiles, and the two chains interleave on the SM's schedulers (two warps a scheduler).
template <int VAR>
struct Plan {
  static constexpr int kConsumers = VAR == 2 ? 2 : 1;
  static constexpr int kThreadsV = 128 * (1 + kConsumers);
  static constexpr uint32_t kStageBytes = 3 * kTileWK + (VAR == 1 ? kTileU + 1024 : 0);  // + gates (256 B, padded)
  static constexpr uint32_t kOffU = 3 * kTileWK;                 // within a stage (VAR 1)
  static constexpr uint32_t kOffG = 3 * kTileWK + kTileU;        // within a stage (VAR 1)
  static constexpr uint32_t kOffS = kStages * kStageBytes;       // S hi, S lo: 128 rows x 128 B each (16 KB)
  static constexpr uint32_t kOffD = kOffS + 2 * kK * 128;        // D' hi, D' lo: 64 rows x 128 B each (8 KB)
  static constexpr uint32_t kOffRn = kOffD + 2 * kBT * 128;      // rn_k [64] f32
  static constexpr uint32_t kConsBytes = 2 * kK * 128 + 2 * kBT * 128 + 1024;  // S, D', rn of one consumer (VAR 2)
  static constexpr uint32_t kOffBar = kOffS + kConsumers * kConsBytes;  // full[kStages], empty[kStages] mbarriers
  static constexpr uint32_t kSmemBytes = kOffBar + 2 * kStages * 8 + 1024;  // + alignment slack
};
static_assert(Plan<1>::kSmemBytes <= 227 * 1024 && Plan<2>::kSmemBytes <= 227 * 1024, "shared memory");

struct Args {
  DkGdrStateSm90Params p;
};

#ifdef DK_GDR_SM90A
__device__ __forceinline__ uint32_t smem_u32(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred P1;\n"
      "LAB_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
      "@P1 bra DONE;\n"
      "bra LAB_WAIT;\n"
      "DONE:\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void cp_async_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// 16-byte copy global -> shared; src_bytes = 0 writes zeros and reads nothing.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Consumer-warpgroup barrier (named barrier 1 or 2: one per consumer warpgroup, 128 threads).
__device__ __forceinline__ void consumer_sync(int id) {
  if (id == 1) {
    asm volatile("bar.sync 1, 128;\n" ::: "memory");
  } else {
    asm volatile("bar.sync 2, 128;\n" ::: "memory");
  }
}
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

// Shared-memory matrix descriptor, 128-byte swizzle (tile bases 1024-aligned).
__device__ __forceinline__ uint64_t make_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t((lbo & 0x3FFFF) >> 4) << 16) |
         (uint64_t((sbo & 0x3FFFF) >> 4) << 32) | (uint64_t(1) << 62);
}

// D[64 x 64] (+)= A[64 x 16] B[16 x 64], bf16 in, f32 accumulate, both from shared memory.
// TA = 0: A K-major (rows of A contiguous along K); TA = 1: A MN-major (transposed). B MN-major.
template <int TA>
__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[32], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
      "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, %35, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(scale_d), "n"(TA));
}

// Byte offset of element (row, col) of a 128-byte-swizzled panel (rows of 64 bf16).
__device__ __forceinline__ uint32_t swz(uint32_t row, uint32_t col) {
  return row * 128 + ((((col * 2) >> 4) ^ (row & 7)) << 4) + ((col * 2) & 15);
}
__device__ __forceinline__ void st_shared_u32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ uint4 ld_shared_v4(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
// (hi, lo) bf16 split of two f32 values, packed: hi + lo = x to ~2^-17 relative (as Triton's _split).
__device__ __forceinline__ void split2(float a, float b, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  const float2 hf = __bfloat1622float2(h);
  const __nv_bfloat162 l = __floats2bfloat162_rn(a - hf.x, b - hf.y);
  hi = *reinterpret_cast<const uint32_t*>(&h);
  lo = *reinterpret_cast<const uint32_t*>(&l);
}
// exp(x) for a decay exponent x <= 0, flushed to 0 at or below -(G_FLOOR - 1) and for NaN (Triton _dexp).
__device__ __forceinline__ float dexp(float x) { return x > 1.f - kGFloor ? __expf(x) : 0.f; }
#endif  // DK_GDR_SM90A

template <int VAR>
__global__ void __launch_bounds__(Plan<VAR>::kThreadsV, 1) state_kernel(const __grid_constant__ Args a) {
#ifdef DK_GDR_SM90A
  using L = Plan<VAR>;
  const DkGdrStateSm90Params& p = a.p;
  const int64_t seq = blockIdx.x;
  const int64_t hv = blockIdx.y;
  const int vb = blockIdx.z;
  const int64_t slot = reinterpret_cast<const int32_t*>(p.slots)[seq];
  if (slot < 0 || slot >= p.num_slots) return;  // padding sequence: nothing to do (the output pass zeroes it)
  const int* cu = reinterpret_cast<const int*>(p.cu_seqlens);
  const int64_t T = p.num_tokens;
  const int64_t bos = min(max(int64_t(cu[seq]), int64_t(0)), T);
  const int64_t eos = min(max(int64_t(cu[seq + 1]), bos), T);
  const int64_t c0 = reinterpret_cast<const int*>(p.coff)[seq];
  const int64_t nc = int64_t(reinterpret_cast<const int*>(p.coff)[seq + 1]) - c0;
  const int64_t HV = p.h_v;
  const int64_t hk = hv / (HV / p.h_k);
  const int tid = threadIdx.x;
  const int wg = tid / 128;
  const int t128 = tid % 128;

  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t bar_full = base + L::kOffBar;            // + 8 * stage
  const uint32_t bar_empty = base + L::kOffBar + 8 * kStages;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(bar_full + 8 * s, 128);  // the 128 producer threads' cp.async arrivals
      mbar_init(bar_empty + 8 * s, L::kConsumers);  // one arrival per consumer warpgroup
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  const __nv_bfloat16* kp = reinterpret_cast<const __nv_bfloat16*>(p.k);
  const __nv_bfloat16* wp = reinterpret_cast<const __nv_bfloat16*>(p.w);
  if (wg == 0) {
    // ---------------- producer: W hi / lo planes and K rows of chunk j into stage j % kStages.
    // (VAR 2: 128 * 40 + 256 * 232 registers = 64512 of the SM's 65536.)
    if constexpr (VAR != 1) {  // VAR 2 needs 40: 128 * 40 + 256 * 232 = 64512 registers of 65536
      asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    } else {  // the U / gate copies' addresses: 40 registers spill
      asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n");
    }
    const int c16 = t128 % 16;  // 16-byte column chunk of a 256-byte row (128 bf16)
    const int r0 = t128 / 16;   // first row; rows r0, r0 + 8, ..
    for (int64_t j = 0; j < nc; ++j) {
      const int st = int(j % kStages);
      if (j >= kStages) mbar_wait(bar_empty + 8 * st, uint32_t((j / kStages - 1) & 1));
      const uint32_t sb = base + uint32_t(st) * L::kStageBytes;
      const int64_t t0 = bos + j * kBT;
#pragma unroll 2
      for (int r = r0; r < kBT; r += 8) {
        const int64_t tok = t0 + r;
        const bool live = tok < eos;
        const int64_t tc = live ? tok : bos;  // any valid address for the zero-fill copies
        const uint32_t off = uint32_t(c16 / 8) * kPanel + swz(uint32_t(r), uint32_t((c16 % 8) * 8));
        const __nv_bfloat16* wrow = wp + (tc * HV + hv) * (2 * kK);
        cp_async_16(sb + off, wrow + c16 * 8, live ? 16u : 0u);                      // W hi
        cp_async_16(sb + kTileWK + off, wrow + kK + c16 * 8, live ? 16u : 0u);       // W lo
        cp_async_16(sb + 2 * kTileWK + off, kp + tc * p.k_stride + hk * kK + c16 * 8, live ? 16u : 0u);  // K
        if constexpr (VAR == 1) {  // U row r: 64 f32 = 16 chunks of 16 bytes, chunk c16 at (c16 ^ (r & 7))
          const float* urow = reinterpret_cast<const float*>(p.u) + (tc * HV + hv) * kV + int64_t(vb) * kBV;
          cp_async_16(sb + L::kOffU + uint32_t(r) * 256 + ((uint32_t(c16) ^ uint32_t(r & 7)) << 4), urow + c16 * 4,
                      live ? 16u : 0u);
        }
      }
      if constexpr (VAR == 1) {  // gates of the chunk: 64 f32, 16 chunks (gcum [T, H_v]: one strided value per token)
        if (t128 < kBT) {
          const int64_t tok = t0 + t128;
          const float* gsrc = reinterpret_cast<const float*>(p.gcum) + (tok < eos ? tok : bos) * HV + hv;
          asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(sb + L::kOffG + 4u * uint32_t(t128)),
                       "l"(gsrc), "r"(tok < eos ? 4u : 0u)
                       : "memory");
        }
      }
      cp_async_arrive(bar_full + 8 * st);
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    return;
  }

  // ---------------- consumer (warpgroup 1; VAR 2: warpgroups 1 and 2, value columns 64 (wg - 1) ..)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
  const int cons = VAR == 2 ? wg - 1 : 0;
  const int bar_id = 1 + cons;
  const int w = t128 / 32;  // warp of the warpgroup: accumulator rows 16 w .. 16 w + 15
  const int l = t128 % 32;
  const int ra = 16 * w + l / 4;   // accumulator rows ra and ra + 8 (of each m64 tile)
  const int cb = 2 * (l % 4);      // accumulator columns 8 i + cb, + 1 (i = 0..7)
  const float* gcum = reinterpret_cast<const float*>(p.gcum);
  float* up = reinterpret_cast<float*>(p.u);
  __nv_bfloat16* hp = reinterpret_cast<__nv_bfloat16*>(p.h);
  float* sp = reinterpret_cast<float*>(p.state);
  const int64_t col0 = int64_t(VAR == 2 ? cons : vb) * kBV;
  // S [128, 64]: tile m (k rows 64 m ..) element (ra (+8), 8 i + cb (+1)) at s[m][4 i + {0, 1, 2, 3}]
  // = (ra, c), (ra, c + 1), (ra + 8, c), (ra + 8, c + 1) (the wgmma accumulator fragment).
  float s[2][32];
  bool read = p.init_mode == 1;
  if (p.init_mode == 2) read = reinterpret_cast<const int32_t*>(p.init)[seq] != 0;
  const float* s_slot = sp + (slot * HV + hv) * (kK * kV) + col0;
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int row = 64 * m + ra + 8 * hh;
        float2 v = make_float2(0.f, 0.f);
        if (read) v = *reinterpret_cast<const float2*>(s_slot + int64_t(row) * kV + 8 * i + cb);
        s[m][4 * i + 2 * hh] = v.x;
        s[m][4 * i + 2 * hh + 1] = v.y;
      }
  const uint32_t cbase = base + uint32_t(cons) * L::kConsBytes;  // this consumer's S / D' / rn tiles
  const uint32_t sS_hi = cbase + L::kOffS, sS_lo = sS_hi + kK * 128;
  const uint32_t sD_hi = cbase + L::kOffD, sD_lo = sD_hi + kBT * 128;
  const uint32_t sRn = cbase + L::kOffRn;
  for (int64_t j = 0; j < nc; ++j) {
    const int st = int(j % kStages);
    const int64_t t0 = bos + j * kBT;
    const uint32_t sb = base + uint32_t(st) * L::kStageBytes;
    // (1) S -> bf16 hi / lo (MN-major B tiles: rows k, 64 value columns) + h = bf16(S) = S_hi.
    __nv_bfloat16* hrow = hp + ((c0 + j) * HV + hv) * (kK * kV) + col0;
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const uint32_t row = uint32_t(64 * m + ra + 8 * hh);
          uint32_t hi, lo;
          split2(s[m][4 * i + 2 * hh], s[m][4 * i + 2 * hh + 1], hi, lo);
          st_shared_u32(sS_hi + swz(row, uint32_t(8 * i + cb)), hi);
          st_shared_u32(sS_lo + swz(row, uint32_t(8 * i + cb)), lo);
          *reinterpret_cast<uint32_t*>(hrow + int64_t(row) * kV + 8 * i + cb) = hi;
        }
    // Gates of this chunk's rows (token rows ra, ra + 8 of the D tile), g_last, U (VAR 0: from global, issued
    // early; VAR 1: from the stage, after the full wait).
    const int64_t tl = min(t0 + kBT - 1, eos - 1);
    float g_last, gc[2], u[32];
    bool live[2];
    if constexpr (VAR != 1) {  // VAR 0 and 2: U and gates from global memory
      g_last = gcum[tl * HV + hv];
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int64_t tok = t0 + ra + 8 * hh;
        live[hh] = tok < eos;
        gc[hh] = live[hh] ? gcum[tok * HV + hv] : 0.f;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          float2 v = make_float2(0.f, 0.f);
          if (live[hh]) v = *reinterpret_cast<const float2*>(up + (tok * HV + hv) * kV + col0 + 8 * i + cb);
          u[4 * i + 2 * hh] = v.x;
          u[4 * i + 2 * hh + 1] = v.y;
        }
      }
    }
    fence_proxy_async();  // S tiles written by this warpgroup -> visible to the tensor cores
    consumer_sync(bar_id);
    mbar_wait(bar_full + 8 * st, uint32_t((j / kStages) & 1));
    fence_proxy_async();  // the cp.async-written W / K tiles -> the tensor cores (as attn.prefill does)
    // (2) D = W_hi S_hi + W_hi S_lo + W_lo S_hi: A = W planes (K-major panels), B = S (MN-major).
    float d[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) d[i] = 0.f;
    wgmma_fence();
#pragma unroll
    for (int kc = 0; kc < kK / 16; ++kc) {
      const uint32_t oa = uint32_t(kc / 4) * kPanel + uint32_t(kc % 4) * 32;
      const uint32_t ob = uint32_t(kc) * 16 * 128;
      const uint64_t dwh = make_desc(sb + oa, 16, 1024);
      const uint64_t dwl = make_desc(sb + kTileWK + oa, 16, 1024);
      wgmma_m64n64k16<0>(d, dwh, make_desc(sS_hi + ob, kK * 128, 1024), 1);
      wgmma_m64n64k16<0>(d, dwh, make_desc(sS_lo + ob, kK * 128, 1024), 1);
      wgmma_m64n64k16<0>(d, dwl, make_desc(sS_hi + ob, kK * 128, 1024), 1);
    }
    wgmma_commit();
    // L2-norm factors of the chunk's keys from the K tile (2 threads a row) while the products run.
    {
      const int r = t128 / 2, half = t128 % 2;
      const uint32_t kt = sb + 2 * kTileWK + uint32_t(half) * kPanel;
      float ss = 0.f;
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        const uint4 raw = ld_shared_v4(kt + uint32_t(r) * 128 + ((uint32_t(c) ^ uint32_t(r & 7)) << 4));
        const __nv_bfloat162* h2 = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float2 f = __bfloat1622float2(h2[e]);
          ss = fmaf(f.x, f.x, ss);
          ss = fmaf(f.y, f.y, ss);
        }
      }
      ss += __shfl_xor_sync(0xffffffffu, ss, 1);
      const float rn = p.use_l2 ? rsqrtf(ss + 1e-6f) : 1.f;
      if (half == 0) asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(sRn + 4u * uint32_t(r)), "f"(rn) : "memory");
    }
    wgmma_wait<0>();
    fence_regs(d);
    if constexpr (VAR == 1) {  // from the stage (zero-filled rows past the end): shared-memory latency only
      asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(g_last) : "r"(sb + L::kOffG + 4u * uint32_t(tl - t0)));
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int row = ra + 8 * hh;
        live[hh] = t0 + row < eos;
        float g;
        asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(g) : "r"(sb + L::kOffG + 4u * uint32_t(row)));
        gc[hh] = live[hh] ? g : 0.f;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const uint32_t c = uint32_t(8 * i + cb) * 4;  // byte in the 256-byte row
          asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n"
                       : "=f"(u[4 * i + 2 * hh]), "=f"(u[4 * i + 2 * hh + 1])
                       : "r"(sb + L::kOffU + uint32_t(row) * 256 + (((c >> 4) ^ uint32_t(row & 7)) << 4) + (c & 15)));
        }
      }
    }
    consumer_sync(bar_id);  // rn visible
    // (3) D = U - W S, stored over U; D' = D * dec -> bf16 hi / lo tiles (MN-major B: rows t).
    const float eg = dexp(g_last);
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int row = ra + 8 * hh;
      float rn;
      asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(rn) : "r"(sRn + 4u * uint32_t(row)));
      const float dec = live[hh] ? dexp(g_last - gc[hh]) * rn : 0.f;
      const int64_t tok = t0 + row;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float d0 = u[4 * i + 2 * hh] - d[4 * i + 2 * hh];
        const float d1 = u[4 * i + 2 * hh + 1] - d[4 * i + 2 * hh + 1];
        if (live[hh]) *reinterpret_cast<float2*>(up + (tok * HV + hv) * kV + col0 + 8 * i + cb) = make_float2(d0, d1);
        uint32_t hi, lo;
        split2(d0 * dec, d1 * dec, hi, lo);
        st_shared_u32(sD_hi + swz(uint32_t(row), uint32_t(8 * i + cb)), hi);
        st_shared_u32(sD_lo + swz(uint32_t(row), uint32_t(8 * i + cb)), lo);
      }
    }
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int i = 0; i < 32; ++i) s[m][i] *= eg;
    fence_proxy_async();
    consumer_sync(bar_id);
    // (4) S += K^T D'_hi + K^T D'_lo: A = K^T (the K tile's 64-column panel m, MN-major), B = D'.
    wgmma_fence();
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      const uint32_t ka = sb + 2 * kTileWK + uint32_t(m) * kPanel;
#pragma unroll
      for (int kk = 0; kk < kBT / 16; ++kk) {
        const uint32_t o = uint32_t(kk) * 16 * 128;
        const uint64_t dk = make_desc(ka + o, kPanel, 1024);
        wgmma_m64n64k16<1>(s[m], dk, make_desc(sD_hi + o, kBT * 128, 1024), 1);
        wgmma_m64n64k16<1>(s[m], dk, make_desc(sD_lo + o, kBT * 128, 1024), 1);
      }
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(s[0]);
    fence_regs(s[1]);
    if (t128 == 0) mbar_arrive(bar_empty + 8 * st);  // W / K of this stage consumed
  }
  // Final state back to the slot.
  float* s_out = sp + (slot * HV + hv) * (kK * kV) + col0;
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int row = 64 * m + ra + 8 * hh;
        *reinterpret_cast<float2*>(s_out + int64_t(row) * kV + 8 * i + cb) =
            make_float2(s[m][4 * i + 2 * hh], s[m][4 * i + 2 * hh + 1]);
      }
#elif defined(__CUDA_ARCH__)
  __trap();  // an image without sm_90a features: never silently skip the work (the launcher refuses first)
#endif  // DK_GDR_SM90A
}

}  // namespace gdr_sm90
}  // namespace dk

namespace {
// Whether the library's device image on `dev` has the sm_90a kernel bodies (dk::sm90a_image, csrc/common/status.cu:
// one never-launched probe kernel; every .cu is built for the same archs). Cached per device there.
dk_status sm90a_image(int dev) { return dk::sm90a_image(dev) ? DK_OK : DK_ERR_NO_KERNEL_IMAGE; }

// Everything launch_state checks before it enqueues: DK_OK when the state pass can be launched with *p.
dk_status check_state(const DkGdrStateSm90Params* p, int variant) {
  using namespace dk::gdr_sm90;
  if (p == nullptr) return DK_ERR_INVALID_ARGUMENT;
  if (p->k_dim != kK || p->v_dim != kV) return DK_ERR_UNSUPPORTED;
  if (p->num_seqs < 0 || p->h_k < 1 || p->h_v < 1 || p->h_v % p->h_k != 0 || p->num_slots < 0 || p->num_tokens < 0)
    return DK_ERR_INVALID_ARGUMENT;
  if (variant < 0 || variant > 2) return DK_ERR_INVALID_ARGUMENT;
  if (p->num_seqs == 0) return DK_OK;
  if (p->num_seqs > 0x7fffffffLL || p->h_v > 65535) return DK_ERR_INVALID_ARGUMENT;
  if (p->k % 16 || p->w % 16 || p->u % 16 || p->h % 16 || p->state % 16 || p->k_stride % 8) return DK_ERR_INVALID_ARGUMENT;
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return DK_ERR_CUDA;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  if (major != 9 || minor != 0) return DK_ERR_UNSUPPORTED;
  return sm90a_image(dev);
}

dk_status launch_state(const DkGdrStateSm90Params* p, int variant, dk_stream_t stream) {
  using namespace dk::gdr_sm90;
  const dk_status st = check_state(p, variant);
  if (st != DK_OK || p->num_seqs == 0) return st;
  Args a{*p};
  dim3 grid(static_cast<unsigned>(p->num_seqs), static_cast<unsigned>(p->h_v), kV / kBV);
  auto* s = static_cast<cudaStream_t>(stream);
  // Per call (the attribute is per device; a host-side call, no launch): > 48 KB of dynamic shared memory.
  if (variant == 0) {
    if (cudaFuncSetAttribute(state_kernel<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Plan<0>::kSmemBytes)) !=
        cudaSuccess)
      return dk::launch_status();
    state_kernel<0><<<grid, kThreads, Plan<0>::kSmemBytes, s>>>(a);
  } else if (variant == 1) {
    if (cudaFuncSetAttribute(state_kernel<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Plan<1>::kSmemBytes)) !=
        cudaSuccess)
      return dk::launch_status();
    state_kernel<1><<<grid, kThreads, Plan<1>::kSmemBytes, s>>>(a);
  } else {
    if (cudaFuncSetAttribute(state_kernel<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Plan<2>::kSmemBytes)) !=
        cudaSuccess)
      return dk::launch_status();
    const dim3 grid2(static_cast<unsigned>(p->num_seqs), static_cast<unsigned>(p->h_v), 1);
    state_kernel<2><<<grid2, Plan<2>::kThreadsV, Plan<2>::kSmemBytes, s>>>(a);
  }
  return dk::launch_status();
}
}  // namespace

extern "C" dk_status dk_gdr_chunk_state_sm90(const DkGdrStateSm90Params* p, dk_stream_t stream) {
  return launch_state(p, 0, stream);
}

extern "C" dk_status dk_gdr_chunk_state_sm90_check(const DkGdrStateSm90Params* p) { return check_state(p, 0); }

extern "C" dk_status dk_gdr_chunk_state_sm90_variant(const DkGdrStateSm90Params* p, int variant, dk_stream_t stream) {
  return launch_state(p, variant, stream);
}
