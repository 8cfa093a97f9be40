// gdr.chunk_prefill for sm_90a, the "split" pipeline (DELTAKIT_GDR_PREFILL=split, the default on sm_90a for K = 128,
// V % 64 == 0, V >= 128): a chunk-local pass and a state kernel per (sequence, value head, 64 value columns) with the
// f32 state resident in registers. The file keeps its session-4 name: it first held the whole prefill as ONE fused
// kernel (fused_kernel, DELTAKIT_GDR_PREFILL=fused / fused_v0), removed in session 5 once the split pipeline measured
// faster at every benchmark shape (docs/benchmarks/2026-12-01-gdr-prefill-s5.md, docs/gdr-chunk-prefill-sm90.md); the
// split kernels reuse its local and state-side code. The algorithm and its operand precisions are emulated on the CPU
// by tools/dev_fused_plan.py against a float64 token recurrence.
//
// Algorithm (value columns transposed: the CTA holds S^T [BV = 64, K = 128]; per chunk, rows t / s = tokens):
//   gating (precomputed or fused, clamped at -64), gc = chunk-local inclusive cumsum, rn = q / k L2-norm factors;
//   A   = beta_t rn_t rn_s e^{gc_t - gc_s} (k_t . k_s)  (s < t)     K raw bf16 (exact), f32 accumulate
//   Tm  = (I + A)^-1: 16 x 16 diagonal blocks by f32 forward substitution, off-diagonal blocks
//         Tm_ij = -D_i sum_m A_im Tm_mj as bf16 hi / lo products (three; ~2^-16)
//   Tb  = Tm diag(beta) -> bf16 hi / lo;   P = rn_q scale rn_k e^{gc_t - gc_s} (q_t . k_s) (s <= t) -> bf16
//   X^T = S^T K^T                    (S^T as bf16 hi + lo: two products)
//   E^T = V^T - X^T diag(e^{gc} rn_k)                       (= (beta-less) V - W S folded: W = Tb diag(e^gc rn) K)
//   v^T = E^T Tb^T                   (E hi / lo x Tb hi / lo: three products)         v = U - W S of the WY form
//   O^T = (S_hi^T Q^T) diag(rn_q scale e^{gc}) + v_hi^T P^T
//   S^T = e^{g_last} S^T + (v^T diag(e^{g_last - gc} rn_k)) K      (hi / lo of the scaled v: two products)
// The fused kernel ran both halves in one CTA: warps 4-7 ("local") computed the chunk-local part (gating, norms, A, P,
// Tm, Tb) into a stage while warps 0-3 ("state", 16 value columns each, S^T 16 x 128 f32 = 64 registers a thread) ran
// the state-dependent part of the previous chunk; the split kernels below keep that stage layout.
// split_local_kernel / split_state_kernel: mma.sync m16n8k16 bf16 -> f32 with ldmatrix operands (accumulator ->
// A-operand reuse keeps S, E, v in registers); split_wg_kernel: the state side on wgmma.
#include <cuda.h>  // CUtensorMap and its enums (kTma; the encoder is fetched from the driver at run time)
#include <cuda_bf16.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <atomic>
#include <type_traits>

#include "../common/launch.cuh"
#include "chunk_prefill_fused_sm90.h"
#include "chunk_local_wgmma_sm90.h"

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DK_GDR_FUSED_SM90A 1
#endif

namespace dk {
namespace gdr_fused {

constexpr int kK = 128;   // key head dim
constexpr int kBV = 64;   // value columns per CTA
constexpr int kThreads = 256;

// Shared memory (bytes). Input buffer of a chunk: K, Q bf16 [64][128] (256-byte rows), V tile bf16 [64][64]
// (128-byte rows). Stage of a chunk (local -> state warps): Tb hi / lo, P bf16 [64][64] (128-byte rows), then f32 [64]
// vectors. 16-byte chunks XOR-swizzled by (row & 7).
enum Vec { kGpart = 0, kBeta, kGc, kRnk, kRnq, kXsc, kQsc, kKdec, kMisc, kNumVec };
constexpr uint32_t kInBytes = 40960;                    // K 16 KB + Q 16 KB + V 8 KB
constexpr uint32_t kRVec = 24576;                       // vectors within a stage rest
constexpr uint32_t kStRest = kRVec + kNumVec * 256;     // 26880
constexpr int kLd = 72;
constexpr int kLdX = 24;
static_assert(kStRest % 128 == 0 && kInBytes % 128 == 0, "alignment");

// Device-only constants; the front end reports the ones only templates use as unreferenced (#177).
#pragma nv_diag_suppress 177
#ifdef __CUDA_ARCH__
constexpr int kC = 64;  // chunk tokens
constexpr float kGFloor = 64.f;
constexpr uint32_t kOK = 0;       // within an input buffer
constexpr uint32_t kOQ = 16384;
constexpr uint32_t kOV = 32768;
constexpr uint32_t kOTh = 0;      // within a stage rest
constexpr uint32_t kOTl = 8192;
constexpr uint32_t kOP = 16384;
static_assert(kOP + 8192 == kRVec, "stage layout");
#endif

#ifdef DK_GDR_FUSED_SM90A
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void bar_sync(int id, int n) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int n) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n) : "memory");
}
// mbarrier helpers (the state kernel's mbarrier stage release, VAR & 65536): init with an arrival count, arrive
// (release, CTA scope), wait for a phase's parity (acquire, CTA scope).
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait_parity(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\nDK_MBW:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra DK_MBW;\n}" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// The state kernel's image by one bulk copy (VAR & 536870912): expect_tx on the stage's mbarrier, then the copy.
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
// kTma (VAR & 1073741824): one 64 x 64 bf16 box (128-byte rows, 128-byte swizzle) of a 2-D tensor map at (c0 columns,
// c1 rows) into shared memory, completing on the stage's mbarrier (complete_tx).
__device__ __forceinline__ void tma_2d(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
      ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, uint32_t bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }
__device__ __forceinline__ void ldsm4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm4t(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// The same mma as a non-volatile asm (VAR & 16): a pure register operation the compiler may schedule freely between
// the (volatile, ordered) ldmatrix loads.
__device__ __forceinline__ void mma_nv(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// stmatrix .trans of four 8 x 8 b16 matrices (x4): lane l gives the row address of matrix l / 8, row l % 8; r[m] holds the
// thread's (row lane / 4, columns 2 (lane % 4), +1) pair of matrix m, stored transposed (memory row j = column j).
__device__ __forceinline__ void stsm4t(uint32_t addr, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1,%2,%3,%4};" ::"r"(addr), "r"(r[0]), "r"(r[1]),
               "r"(r[2]), "r"(r[3])
               : "memory");
}
__device__ __forceinline__ uint32_t pack_bf(float x, float y) {
  __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
  return *reinterpret_cast<uint32_t*>(&h);
}
// (x, y) -> bf16 hi pair and lo pair with hi + lo = (x, y) to ~2^-17.
__device__ __forceinline__ void split2(float x, float y, uint32_t& hi, uint32_t& lo) {
  __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
  float2 hf = __bfloat1622float2(h);
  __nv_bfloat162 l = __floats2bfloat162_rn(x - hf.x, y - hf.y);
  hi = *reinterpret_cast<uint32_t*>(&h);
  lo = *reinterpret_cast<uint32_t*>(&l);
}
__device__ __forceinline__ float2 unpack_bf(uint32_t u) {
  return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&u));
}
// exp(x) of a decay exponent x <= 0, flushed to 0 at or below -(kGFloor - 1) and for NaN (Triton _dexp).
// FAST: MUFU ex2 (__expf, ~2 ulp), as Triton's tl.exp; else the libdevice expf.
template <bool FAST = false>
__device__ __forceinline__ float dexp(float x) {
  if constexpr (FAST) {
    return x > 1.f - kGFloor ? __expf(x) : 0.f;
  } else {
    return x > 1.f - kGFloor ? expf(x) : 0.f;
  }
}


// ldmatrix lane addresses. Tiles are row-major with `rb` bytes a row, 16-byte chunks swizzled by (row & 7).
__device__ __forceinline__ uint32_t swz(uint32_t base, int row, int col, int rb) {
  return base + uint32_t(row * rb) + (uint32_t(((col >> 3) ^ (row & 7))) << 4);
}
// B operand (n-tiles n0, n0 + 8; k0 .. k0 + 15) from a tile stored [n][k].
__device__ __forceinline__ uint32_t a_b_nk(uint32_t base, int n0, int k0, int rb, int lane) {
  return swz(base, n0 + ((lane >> 4) << 3) + (lane & 7), k0 + (((lane >> 3) & 1) << 3), rb);
}
// A operand (rows m0 .. m0 + 15, k0 .. k0 + 15) from a tile stored [m][k].
__device__ __forceinline__ uint32_t a_a_mk(uint32_t base, int m0, int k0, int rb, int lane) {
  return swz(base, m0 + (((lane >> 3) & 1) << 3) + (lane & 7), k0 + ((lane >> 4) << 3), rb);
}
// B operand (n-tiles n0, n0 + 8; k0 .. k0 + 15) from a tile stored [k][n] (.trans).
__device__ __forceinline__ uint32_t a_b_kn(uint32_t base, int k0, int n0, int rb, int lane) {
  return swz(base, k0 + (((lane >> 3) & 1) << 3) + (lane & 7), n0 + ((lane >> 4) << 3), rb);
}
// A operand (rows m0 .. m0 + 15, k0 .. k0 + 15) from a tile stored [k][m] (.trans).
__device__ __forceinline__ uint32_t a_a_km(uint32_t base, int k0, int m0, int rb, int lane) {
  return swz(base, k0 + ((lane >> 4) << 3) + (lane & 7), m0 + (((lane >> 3) & 1) << 3), rb);
}

// acc[2][4] (16 x 16) += A (f32 16 x 16: the lane's fragment x0..x3, rows g / g + 8, columns 2q / 2q + 8) x B (f32,
// [16][ldb] stored [k][n]) as three bf16 products.
__device__ __forceinline__ void mm16_f32_frag(float (&acc)[2][4], const float2 x0, const float2 x1, const float2 x2,
                                              const float2 x3, const float* B, int ldb, int lane) {
  const int g = lane >> 2, q = lane & 3;
  uint32_t ah[4], al[4];
  split2(x0.x, x0.y, ah[0], al[0]);
  split2(x1.x, x1.y, ah[1], al[1]);
  split2(x2.x, x2.y, ah[2], al[2]);
  split2(x3.x, x3.y, ah[3], al[3]);
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
    const int n = 8 * nt + g;
    uint32_t bh0, bl0, bh1, bl1;
    split2(B[(2 * q) * ldb + n], B[(2 * q + 1) * ldb + n], bh0, bl0);
    split2(B[(2 * q + 8) * ldb + n], B[(2 * q + 9) * ldb + n], bh1, bl1);
    mma(acc[nt], ah, bh0, bh1);
    mma(acc[nt], ah, bl0, bl1);
    mma(acc[nt], al, bh0, bh1);
  }
}
// acc[2][4] (16 x 16) += A (f32, [16][lda], row-major) x B (f32, [16][ldb] stored [k][n]) as three bf16 products.
__device__ __forceinline__ void mm16_f32(float (&acc)[2][4], const float* A, int lda, const float* B, int ldb, int lane) {
  const int g = lane >> 2, q = lane & 3;
  const float2 x0 = *reinterpret_cast<const float2*>(A + g * lda + 2 * q);
  const float2 x1 = *reinterpret_cast<const float2*>(A + (g + 8) * lda + 2 * q);
  const float2 x2 = *reinterpret_cast<const float2*>(A + g * lda + 2 * q + 8);
  const float2 x3 = *reinterpret_cast<const float2*>(A + (g + 8) * lda + 2 * q + 8);
  mm16_f32_frag(acc, x0, x1, x2, x3, B, ldb, lane);
}
// Local pass at 4 CTAs / SM (variant bit 16384): f32 A [64][64] without padding, its 8-float column groups
// XOR-swizzled by (row & 3) (float2 accesses of rows g = 0..3 per half-warp hit four distinct 8-bank groups).
__device__ __forceinline__ int a4_idx(int row, int col) { return row * 64 + (col ^ ((row & 3) << 3)); }
// mm16_f32 with A = the 16 x 16 block at (r0, c0) of the swizzled A (r0, c0 multiples of 16).
__device__ __forceinline__ void mm16_f32_a4(float (&acc)[2][4], const float* A4, int r0, int c0, const float* B, int ldb,
                                            int lane) {
  const int g = lane >> 2, q = lane & 3;
  const float2 x0 = *reinterpret_cast<const float2*>(A4 + a4_idx(r0 + g, c0 + 2 * q));
  const float2 x1 = *reinterpret_cast<const float2*>(A4 + a4_idx(r0 + g + 8, c0 + 2 * q));
  const float2 x2 = *reinterpret_cast<const float2*>(A4 + a4_idx(r0 + g, c0 + 2 * q + 8));
  const float2 x3 = *reinterpret_cast<const float2*>(A4 + a4_idx(r0 + g + 8, c0 + 2 * q + 8));
  mm16_f32_frag(acc, x0, x1, x2, x3, B, ldb, lane);
}
#endif  // DK_GDR_FUSED_SM90A

// ----------------------------------------------------------------------------------------------------------------
// Split pipeline (DELTAKIT_GDR_PREFILL=split, session 5): the chunk-local part off the sequential chain.
//   1. split_local_kernel, grid (NT, H_v), 128 threads, 3 CTAs / SM: per (chunk id, value head) the fused kernel's
//      local code (gating, norms, A = K K^T, P = Q K^T, Tm = (I + A)^-1, Tb hi / lo), computed once per head, written
//      to the workspace as the chunk's 26,880-byte stage image (the bytes the fused kernel's local warps leave in a
//      stage rest: Tb hi, Tb lo, P, the f32 vectors).
//   2. split_state_kernel, grid (N, H_v, V / 64), 256 threads: warps 0-3 = the fused kernel's state side (variant 17
//      scheduling), warps 4-7 only copy chunk c's K / Q / V tile and image into a 3-stage ring (cp.async).
// Chunk ids: coff / cseq of the Triton chunk_offsets / chunk_map kernels (the library's workspace regions).
#ifdef __CUDA_ARCH__
constexpr uint32_t kLpVec = 32768;                 // local pass: vectors after the K / Q input [0, 32768)
constexpr uint32_t kLpA = kLpVec + kNumVec * 256;  // f32 A [64][72]
constexpr uint32_t kLpT = kLpA + 64 * kLd * 4;     // f32 Tm [64][72]
constexpr uint32_t kLpX = 24576;                   // 4 x f32 [16][24] level scratch over Q rows 32..63 (dead by then)
constexpr int kSpFull = 1;                         // + stage (state kernel)
constexpr int kSpEmpty = 4;                        // + stage
constexpr int kOvlLd = 7;                          // overlap: the 128 loader threads agree on a chunk's verdict
constexpr int kPpTurn = 8;                         // + warpgroup: the pair ping-pong's turn barriers (state kernel)
constexpr int kPpFull1 = 10;                       // + stage: the pair ping-pong's FULL barrier of warpgroup 1
static_assert(kLpX + 4 * 16 * kLdX * 4 <= 32768 && kOP + 8192 <= kLpX, "local pass aliasing");
#endif
constexpr uint32_t kLpSmem = 32768 + kNumVec * 256 + 2 * 64 * kLd * 4;  // 71,936: 3 CTAs / SM
// Variant bit 16384 (session 8): A (f32 [64][64], swizzled: a4_idx) in the image's Tb hi / lo bytes [0, 16384) over the
// dead K tile (A lives from the epilogue to the last level, Tb is written after it), Tm in A's old place: 4 CTAs / SM.
constexpr uint32_t kLp4Smem = 32768 + kNumVec * 256 + 64 * kLd * 4;     // 53,504
static_assert(4 * (kLp4Smem + 1024) <= 233472, "local pass at 4 CTAs / SM");
template <int LV>
constexpr uint32_t lp_smem() { return (LV & 16384) != 0 ? kLp4Smem : kLpSmem; }
constexpr int kSpNs = 3;                                              // state kernel stages
constexpr uint32_t kSpStage = kInBytes + kStRest;                     // 67,840
constexpr uint32_t kSpOO = kSpNs * kSpStage;                          // output staging, 4 x bf16 [64][16]
constexpr uint32_t kSpSmem = kSpOO + 4 * 64 * 32;                     // 211,712
static_assert(kSpSmem <= 232448 && 3 * (kLpSmem + 1024) <= 233472, "split shared memory plan");

struct SplitArgs {
  DkGdrPrefillFusedParams p;
  DkGdrPrefillSplitWs w;
  int fix;  // overlap (bit 512) only: 1 = the fix-up launch of the state kernel (launch_overlap); 2 = the overlapped
            // launch with every loader "timing out" at once (variant bit 1024: a test of the fix-up path)
  const struct CpSeg* cps;  // context parallelism (bit 4096) only: the state kernel's segment records (launch_cp)
};
// SplitArgs + the tensor maps of variant bit 1073741824 (kTma, session 13): 2-D maps of q / k ([T rows][H_k K
// columns], row stride q_stride / k_stride) and v ([T][H_v V], v_stride), bf16, box 64 x 64, 128-byte swizzle
// (encode_rows_map). The launchers carry this; only the kTma instances of split_wg_kernel take it as their parameter
// (WgArgs), every other kernel gets the SplitArgs slice, so their parameter layout (and code) is unchanged.
struct SplitLaunch : SplitArgs {
  CUtensorMap tm_q, tm_k, tm_v;
};
template <int VAR>
using WgArgs = typename std::conditional<(VAR & 1073741824) != 0, SplitLaunch, SplitArgs>::type;
// Context parallelism (variant bit 4096, launch_cp): one record per state-kernel grid row (blockIdx.x) instead of a
// sequence: tokens [bos, eos) (64-token aligned from the sequence start), the chunk id of its first chunk, the state
// blocks f32 [H_v, K, V] it starts from (nullptr: zeros, or the identity with kCpIdent) and ends in (nullptr: not
// stored), flags.
struct CpSeg {
  int64_t bos, eos, chunk0;
  const float* in;
  float* out;
  int32_t flags, pad;
};
constexpr int kCpLive = 1;   // else a padding row range: zero output rows (unless kCpNoOut), no state
constexpr int kCpIdent = 2;  // initial state I (K = V): the segment's transition M (with kCpVZero)
constexpr int kCpVZero = 4;  // v = 0 (the V tiles zero-filled)
constexpr int kCpNoOut = 8;  // no output rows (pass 1)
// Overlap (variant bit 512) flag helpers: ld.acquire.gpu / st.release.gpu on the workspace flags, %globaltimer (ns).
__device__ __forceinline__ int ld_acquire_gpu(const int* f) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(f) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_gpu(int* f, int v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(f), "r"(v) : "memory");
}
__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
constexpr uint64_t kOvlSpinNs = 200000000ull;  // 200 ms: the bounded spin of the overlap's image loader
__device__ int g_split_prof_printed;
__device__ int g_split_local_printed;

// Local pass. VAR bits: 1 = MUFU exp (__expf) for the decay factors, 2 = clock64 phase profile (one CTA: chunk id 64,
// grid row 0), 64 = one CTA per (chunk id, KEY head) looping over the H_v / H_k value heads of that key head (grid
// (NT, H_k)): the K / Q tiles, their norms and the raw K K^T / Q K^T products are computed once and reused by every
// value head (only the gating, the decay epilogue, (I + A)^-1 and Tb depend on the value head); without 64 the grid is
// (NT, H_v), one value head per CTA (session 5).
template <int VAR>
__global__ void __launch_bounds__(128, (VAR & 16384) != 0 ? 4 : 3) split_local_kernel(const SplitArgs args) {
#ifdef DK_GDR_FUSED_SM90A
  constexpr bool kFast = (VAR & 1) != 0, kProf = (VAR & 2) != 0, kHk = (VAR & 64) != 0, kOvl = (VAR & 512) != 0;
  static_assert(!kOvl || (kHk && !kProf), "the overlap local pass is the per-key-head one, unprofiled");
  // kL4 (VAR & 16384): 4 CTAs / SM (128 registers, kLp4Smem): A swizzled over the dead K tile, Tm in A's old place.
  constexpr bool kL4 = (VAR & 16384) != 0;
  static_assert(!kL4 || !kOvl, "the overlap's local pass does not fit 128 registers");
  // kOvl: a persistent 1-D grid (launch_split sizes it to the SMs the state kernel leaves free) walking the items
  // (chunk id, key head) chunk-major, so that early chunks are ready first; a release flag per (chunk id, value head)
  // after each image; griddepcontrol.wait at the end (see launch_split: the memory-ordering / no-hang argument).
  const int64_t n_items = kOvl ? int64_t(args.w.nt) * args.p.h_k : 1;
  for (int64_t item = kOvl ? int64_t(blockIdx.x) : 0; item < n_items; item += kOvl ? int64_t(gridDim.x) : 1) {
  long long tp = 0, ph[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#define DK_LMARK(i)                  \
  if constexpr (kProf) {             \
    const long long now = clock64(); \
    ph[i] += now - tp;               \
    tp = now;                        \
  }
  if constexpr (kProf) tp = clock64();
  const long long tstart = tp;
  const DkGdrPrefillFusedParams& p = args.p;
  extern __shared__ __align__(128) unsigned char smem[];
  const int lt = threadIdx.x, lw = lt >> 5, lane = lt & 31;
  const int g = lane >> 2, q = lane & 3;
  const int64_t pc = kOvl ? item / p.h_k : int64_t(blockIdx.x);  // chunk id
  const int64_t HV = p.h_v, T = p.num_tokens;
  const int ratio = int(HV / p.h_k);
  const int hk = kOvl ? int(item % p.h_k) : kHk ? int(blockIdx.y) : int(blockIdx.y) / ratio;
  const int hv0 = kHk ? hk * ratio : int(blockIdx.y);
  const int nh = kHk ? ratio : 1;  // value heads of this CTA: hv0 .. hv0 + nh - 1
  const int seq = reinterpret_cast<const int*>(args.w.cseq)[pc];
  if (seq < 0) continue;
  const int64_t slot = reinterpret_cast<const int*>(p.slots)[seq];
  if (!(slot >= 0 && slot < p.num_slots)) continue;  // padding: the state kernel reads no image
  const int* cu = reinterpret_cast<const int*>(p.cu_seqlens);
  int64_t bos = cu[seq], eos = cu[seq + 1];
  bos = bos < 0 ? 0 : (bos > T ? T : bos);
  eos = eos < bos ? bos : (eos > T ? T : eos);
  const int64_t t0 = bos + (pc - reinterpret_cast<const int*>(args.w.coff)[seq]) * kC;
  if (t0 >= eos || t0 < bos) continue;
  const int n = int(eos - t0 < kC ? eos - t0 : kC);
  const uint32_t sbase = smem_u32(smem);
  const __nv_bfloat16* kp = reinterpret_cast<const __nv_bfloat16*>(p.k);
  const __nv_bfloat16* qp = reinterpret_cast<const __nv_bfloat16*>(p.q);
  float* vec = reinterpret_cast<float*>(smem + kLpVec);
  float* sA = reinterpret_cast<float*>(smem + (kL4 ? 0u : kLpA));
  float* sT = reinterpret_cast<float*>(smem + (kL4 ? kLpA : kLpT));
  float* sX = reinterpret_cast<float*>(smem + kLpX) + lw * 16 * kLdX;
  unsigned char* stg = smem;  // the image: Tb hi [0, 8192), Tb lo, P [16384, 24576) over the dead K / Q tiles
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int idx = lt + 128 * i, row = idx >> 4, ch = idx & 15;
    const int rr = row < n ? row : 0;
    const uint32_t bytes = row < n ? 16u : 0u;
    const uint32_t off = uint32_t(row * 256) + (uint32_t((ch ^ (row & 7))) << 4);
    cp_async16(sbase + kOK + off, kp + (t0 + rr) * p.k_stride + hk * kK + ch * 8, bytes);
    cp_async16(sbase + kOQ + off, qp + (t0 + rr) * p.q_stride + hk * kK + ch * 8, bytes);
  }
  cp_async_commit();
  // Gate inputs of row lt (threads lt < 64) for value head hv: raw a / b (fused) or g / beta, loaded one head ahead.
  const bool grow = lt < n;
  const int64_t gt = t0 + (lt < 64 ? lt : 0);
  float ra = 0.f, rb = 0.f, ral = 0.f, rdt = 0.f;
  auto gate_load = [&](int hv) {
    if (lt < 64 && grow) {
      if (p.fused) {
        ral = reinterpret_cast<const float*>(p.a_log)[hv];
        rdt = reinterpret_cast<const float*>(p.dt_bias)[hv];
        ra = __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(p.a)[gt * p.ab_stride + hv]);
        rb = __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(p.b)[gt * p.ab_stride + hv]);
      } else {
        ra = reinterpret_cast<const float*>(p.g)[gt * HV + hv];
        rb = reinterpret_cast<const float*>(p.beta)[gt * HV + hv];
      }
    }
  };
  auto gate_scan = [&]() {  // gating of row lt + inclusive scan per warp (warps 0, 1)
    float gg = 0.f, be = 0.f;
    if (grow) {
      if (p.fused) {
        const float a_log_e = -expf(ral);
        const float x = ra + rdt;
        const float e = expf(fminf(x, 20.f));
        const float one_e = 1.f + e;
        const float lp = one_e == 1.f ? e : logf(one_e) * (e / (one_e == 1.f ? 1.f : one_e - 1.f));
        const float sp = x > 20.f ? x : lp;
        gg = a_log_e * sp;
        be = 1.f / (1.f + expf(-rb));
      } else {
        gg = ra;
        be = rb;
      }
      gg = gg > -kGFloor ? gg : -kGFloor;
    }
    float sc = gg;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const float y = __shfl_up_sync(0xffffffffu, sc, o);
      if (lane >= o) sc += y;
    }
    vec[kGpart * 64 + lt] = sc;
    vec[kBeta * 64 + lt] = be;
  };
  gate_load(hv0);
  if (lt < 64) gate_scan();
  DK_LMARK(0)
  cp_async_wait_all();
  __syncthreads();
  DK_LMARK(1)
  {  // norms (value-head independent): lt < 64 key row lt, else query row lt - 64
    const int row = lt & 63;
    const unsigned char* tile = smem + (lt < 64 ? kOK : kOQ) + row * 256;
    float pss[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int ch = 0; ch < 16; ++ch) {
      const uint4 u = *reinterpret_cast<const uint4*>(tile + 16 * ch);
      const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 f = unpack_bf(w[j]);
        pss[j] = fmaf(f.y, f.y, fmaf(f.x, f.x, pss[j]));
      }
    }
    const float ss = (pss[0] + pss[1]) + (pss[2] + pss[3]);
    const float rn = p.use_l2 ? rsqrtf(ss + 1e-6f) : 1.f;
    if (lt < 64)
      vec[kRnk * 64 + row] = rn;
    else
      vec[kRnq * 64 + row] = rn * p.scale;
  }
  DK_LMARK(2)
  // Raw A = K K^T and P = Q K^T for rows 16 lw .. 16 lw + 15 (column tiles up to the diagonal), kept in registers
  // for every value head of the CTA.
  float a[8][4], pp[8][4];
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) a[i][j] = pp[i][j] = 0.f;
  const int m0 = 16 * lw;
#pragma unroll
  for (int kb = 0; kb < 8; ++kb) {
    uint32_t ka[4], qa[4];
    ldsm4(a_a_mk(sbase + kOK, m0, 16 * kb, 256, lane), ka);
    ldsm4(a_a_mk(sbase + kOQ, m0, 16 * kb, 256, lane), qa);
    uint32_t bb[4][4];
#pragma unroll
    for (int np = 0; np < 4; ++np)
      if (np <= lw) ldsm4(a_b_nk(sbase + kOK, 16 * np, 16 * kb, 256, lane), bb[np]);
#pragma unroll
    for (int np = 0; np < 4; ++np)
      if (np <= lw) {
        mma_nv(a[2 * np], ka, bb[np][0], bb[np][1]);
        mma_nv(a[2 * np + 1], ka, bb[np][2], bb[np][3]);
      }
#pragma unroll
    for (int np = 0; np < 4; ++np)
      if (np <= lw) {
        mma_nv(pp[2 * np], qa, bb[np][0], bb[np][1]);
        mma_nv(pp[2 * np + 1], qa, bb[np][2], bb[np][3]);
      }
  }
  __syncthreads();  // every warp's K / Q reads done (P overwrites Q rows 0..31); the norms and gates are visible
  DK_LMARK(3)
#pragma unroll 1
  for (int j = 0; j < nh; ++j) {
    const int hv = hv0 + j;
    if (j > 0) {  // this head's gates (loaded during the previous head), then the next head's loads
      if (lt < 64) gate_scan();
      __syncthreads();
    }
    if (j + 1 < nh) gate_load(hv + 1);
    {  // per-row decay factors of head hv: lt < 64 key row lt, else query row lt - 64
      const int row = lt & 63;
      const float gc = vec[kGpart * 64 + row] + (row >= 32 ? vec[kGpart * 64 + 31] : 0.f);
      const float glast = vec[kGpart * 64 + 63] + vec[kGpart * 64 + 31];
      const bool valid = row < n;
      if (lt < 64) {
        const float rn = vec[kRnk * 64 + row];
        vec[kGc * 64 + row] = gc;
        vec[kXsc * 64 + row] = valid ? dexp<kFast>(gc) * rn : 0.f;
        vec[kKdec * 64 + row] = valid ? dexp<kFast>(glast - gc) * rn : 0.f;
        if (row == 0) vec[kMisc * 64] = dexp<kFast>(glast);
      } else {
        vec[kQsc * 64 + row] = valid ? vec[kRnq * 64 + row] * dexp<kFast>(gc) : 0.f;
      }
    }
    __syncthreads();
    DK_LMARK(4)
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // A / P epilogue: decays, beta, norms; A -> sA (f32), P -> the image (bf16)
      const int t = m0 + g + 8 * h;
      const float bt = vec[kBeta * 64 + t] * vec[kRnk * 64 + t];
      const float rq = vec[kRnq * 64 + t];
      const float gct = vec[kGc * 64 + t];
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        const int s = 8 * nt + 2 * q;
        float av[2], pv[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float rks = vec[kRnk * 64 + s + e];
          const float dx = (s + e <= t) ? dexp<kFast>(gct - vec[kGc * 64 + s + e]) : 0.f;
          av[e] = (s + e < t) ? a[nt][2 * h + e] * bt * rks * dx : 0.f;
          pv[e] = (s + e <= t) ? pp[nt][2 * h + e] * rq * rks * dx : 0.f;
        }
        *reinterpret_cast<float2*>(sA + (kL4 ? a4_idx(t, s) : t * kLd + s)) = make_float2(av[0], av[1]);
        *reinterpret_cast<uint32_t*>(stg + kOP + t * 128 + (((s >> 3) ^ (t & 7)) << 4) + (s & 7) * 2) =
            pack_bf(pv[0], pv[1]);
      }
    }
    __syncthreads();
    DK_LMARK(5)
    {  // diagonal blocks: warp lw inverts block lw (lane c < 16 owns column c)
      const int cidx = lane & 15;
      const float* Ab = sA + (kL4 ? 0 : (16 * lw) * kLd + 16 * lw);
      float col[16];
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        float x = (i == cidx) ? 1.f : 0.f;
#pragma unroll
        for (int m = 0; m < i; ++m) x -= Ab[kL4 ? a4_idx(16 * lw + i, 16 * lw + m) : i * kLd + m] * col[m];
        col[i] = x;
      }
      if (lane < 16) {
#pragma unroll
        for (int i = 0; i < 16; ++i) sT[(16 * lw + i) * kLd + 16 * lw + cidx] = col[i];
      }
    }
    __syncthreads();
#pragma unroll 1
    for (int lvl = 1; lvl < 4; ++lvl) {  // Tm_ij = -D_i sum_{j <= m < i} A_im Tm_mj, i - j = lvl
      const int jj = lw, i = lw + lvl;
      if (i < 4) {
        float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
        for (int m = jj; m < i; ++m) {
          if constexpr (kL4)
            mm16_f32_a4(acc, sA, 16 * i, 16 * m, sT + (16 * m) * kLd + 16 * jj, kLd, lane);
          else
            mm16_f32(acc, sA + (16 * i) * kLd + 16 * m, kLd, sT + (16 * m) * kLd + 16 * jj, kLd, lane);
        }
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          sX[g * kLdX + 8 * nt + 2 * q] = acc[nt][0];
          sX[g * kLdX + 8 * nt + 2 * q + 1] = acc[nt][1];
          sX[(g + 8) * kLdX + 8 * nt + 2 * q] = acc[nt][2];
          sX[(g + 8) * kLdX + 8 * nt + 2 * q + 1] = acc[nt][3];
        }
        __syncwarp();
        float r[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
        mm16_f32(r, sT + (16 * i) * kLd + 16 * i, kLd, sX, kLdX, lane);
        float* dst = sT + (16 * i) * kLd + 16 * jj;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          *reinterpret_cast<float2*>(dst + g * kLd + 8 * nt + 2 * q) = make_float2(-r[nt][0], -r[nt][1]);
          *reinterpret_cast<float2*>(dst + (g + 8) * kLd + 8 * nt + 2 * q) = make_float2(-r[nt][2], -r[nt][3]);
        }
        __syncwarp();
      }
      __syncthreads();
    }
    DK_LMARK(6)
    // Tb = Tm diag(beta) (lower triangle incl. the diagonal) -> bf16 hi / lo tiles of the image.
#pragma unroll
    for (int it = 0; it < 4; ++it) {
      const int idx = lt + 128 * it, t = idx >> 3, ch = idx & 7, s0 = ch * 8;
      const float4 u0 = *reinterpret_cast<const float4*>(sT + t * kLd + s0);
      const float4 u1 = *reinterpret_cast<const float4*>(sT + t * kLd + s0 + 4);
      const float x[8] = {u0.x, u0.y, u0.z, u0.w, u1.x, u1.y, u1.z, u1.w};
      uint32_t hi[4], lo[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int s = s0 + 2 * e;
        const float y0 = s <= t ? x[2 * e] * vec[kBeta * 64 + s] : 0.f;
        const float y1 = s + 1 <= t ? x[2 * e + 1] * vec[kBeta * 64 + s + 1] : 0.f;
        split2(y0, y1, hi[e], lo[e]);
      }
      const uint32_t off = uint32_t(t * 128) + (uint32_t((ch ^ (t & 7))) << 4);
      *reinterpret_cast<uint4*>(stg + kOTh + off) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
      *reinterpret_cast<uint4*>(stg + kOTl + off) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
    }
    __syncthreads();
    uint4* img = reinterpret_cast<uint4*>(args.w.img + uint64_t(pc * HV + hv) * kStRest);
    for (int idx = lt; idx < int(kStRest / 16); idx += 128) {
      const uint32_t b = uint32_t(idx) * 16u;
      img[idx] = *reinterpret_cast<const uint4*>(b < kRVec ? smem + b : smem + kLpVec + (b - kRVec));
    }
    if constexpr (kOvl) {  // publish image (pc, hv): every thread's stores, barrier, one gpu-scope release store
      __syncthreads();  // also: the copy-out read the image / vectors the next head or item overwrites
      if (lt == 0) st_release_gpu(reinterpret_cast<int*>(args.w.flags) + (pc * HV + hv), 1);
    } else if (j + 1 < nh) {
      __syncthreads();  // the copy-out read the image and the vectors the next head overwrites
    }
    DK_LMARK(7)
  }
  if constexpr (kProf) {  // one CTA (chunk id 64, grid row 0): cycles of each phase, summed over its value heads
    if (pc == 64 && blockIdx.y == 0 && lt == 0 && atomicAdd(&g_split_local_printed, 1) == 0)
      printf("split-local-prof var %d chunk 64 heads %d cycles: issue+gates %lld cp_wait %lld norms %lld kkt %lld "
             "factors %lld epilogue %lld inverse+levels %lld tb+copy_out %lld total %lld\n",
             VAR, nh, ph[0], ph[1], ph[2], ph[3], ph[4], ph[5], ph[6], ph[7], clock64() - tstart);
  }
  }  // items
  // Overlap: this grid is the programmatic dependent of the state kernel; wait for it (and its memory) before
  // exiting, so that the completion of this launch implies the state kernel's (the fix-up launch reads its flags).
  if constexpr (kOvl) asm volatile("griddepcontrol.wait;" ::: "memory");
#undef DK_LMARK
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}

template <int VAR>
__global__ void __launch_bounds__(kThreads, 1) split_state_kernel(const SplitArgs args) {
#ifdef DK_GDR_FUSED_SM90A
  constexpr bool kProf = (VAR & 2) != 0, kSched = true;
  long long tp = 0, ph[10] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
#define DK_MARK(i)                  \
  if constexpr (kProf) {            \
    const long long now = clock64(); \
    ph[i] += now - tp;              \
    tp = now;                       \
  }
  const DkGdrPrefillFusedParams& p = args.p;
  extern __shared__ __align__(128) unsigned char smem[];
  const int tid = threadIdx.x;
  const int warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, q = lane & 3;
  const int64_t seq = blockIdx.x;
  const int hv = blockIdx.y;
  const int col0 = blockIdx.z * kBV;
  const int64_t HV = p.h_v, V = p.v_dim, T = p.num_tokens;
  const int hk = int(hv / (HV / p.h_k));
  const int* cu = reinterpret_cast<const int*>(p.cu_seqlens);
  int64_t bos = cu[seq], eos = cu[seq + 1];
  bos = bos < 0 ? 0 : (bos > T ? T : bos);
  eos = eos < bos ? bos : (eos > T ? T : eos);
  const int64_t slot = reinterpret_cast<const int*>(p.slots)[seq];
  const bool live = slot >= 0 && slot < p.num_slots;
  __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(p.out);
  if (!live) {  // padding sequence: zero output rows, state untouched
    const int64_t chunks = (eos - bos) * (kBV / 8);
    for (int64_t i = tid; i < chunks; i += kThreads) {
      const int64_t t = bos + i / (kBV / 8);
      const int ch = int(i % (kBV / 8));
      *reinterpret_cast<uint4*>(out + (t * HV + hv) * V + col0 + 8 * ch) = make_uint4(0, 0, 0, 0);
    }
    return;
  }
  const int64_t nc = (eos - bos + kC - 1) / kC;
  const uint32_t sbase = smem_u32(smem);
  if (warp >= 4) {  // loaders: chunk c's K / Q / V tile and image into stage c % 3
    const int lt = tid - 128;
    const __nv_bfloat16* kp = reinterpret_cast<const __nv_bfloat16*>(p.k);
    const __nv_bfloat16* qp = reinterpret_cast<const __nv_bfloat16*>(p.q);
    const __nv_bfloat16* vp = reinterpret_cast<const __nv_bfloat16*>(p.v);
    const int64_t cbase = reinterpret_cast<const int*>(args.w.coff)[seq];
    for (int64_t c = 0; c < nc; ++c) {
      const int st = int(c % kSpNs);
      if (c >= kSpNs) bar_sync(kSpEmpty + st, 256);
      const uint32_t sin = sbase + st * kSpStage;
      const int64_t t0 = bos + c * kC;
      const int n = int(eos - t0 < kC ? eos - t0 : kC);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int idx = lt + 128 * i, row = idx >> 4, ch = idx & 15;
        const int rr = row < n ? row : 0;
        const uint32_t bytes = row < n ? 16u : 0u;
        const uint32_t off = uint32_t(row * 256) + (uint32_t((ch ^ (row & 7))) << 4);
        cp_async16(sin + kOK + off, kp + (t0 + rr) * p.k_stride + hk * kK + ch * 8, bytes);
        cp_async16(sin + kOQ + off, qp + (t0 + rr) * p.q_stride + hk * kK + ch * 8, bytes);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int idx = lt + 128 * i, row = idx >> 3, ch = idx & 7;
        const int rr = row < n ? row : 0;
        const uint32_t off = uint32_t(row * 128) + (uint32_t((ch ^ (row & 7))) << 4);
        cp_async16(sin + kOV + off, vp + (t0 + rr) * p.v_stride + hv * V + col0 + ch * 8, row < n ? 16u : 0u);
      }
      int64_t pi = cbase + c;
      pi = pi < args.w.nt ? pi : args.w.nt - 1;  // only for cu_seqlens the offsets pass clamped
      const unsigned char* src = reinterpret_cast<const unsigned char*>(args.w.img) + uint64_t(pi * HV + hv) * kStRest;
      for (int idx = lt; idx < int(kStRest / 16); idx += 128)
        cp_async16(sin + kInBytes + 16u * idx, src + 16 * idx, 16u);
      cp_async_commit();
      cp_async_wait_all();
      bar_arrive(kSpFull + st, 256);
    }
    return;
  }

  // ------------------------------------------------------------------- state warps: S^T rows 16 sw .. 16 sw + 15
  const int sw = warp;
  float s[16][4];
  float* sp = reinterpret_cast<float*>(p.state) + (slot * HV + hv) * (int64_t(kK) * V) + col0;
  bool read = p.init_mode == 1;
  if (p.init_mode == 2) read = reinterpret_cast<const int*>(p.init)[seq] != 0;
#pragma unroll
  for (int nt = 0; nt < 16; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int k = 8 * nt + 2 * q + (i & 1), v = 16 * sw + g + 8 * (i >> 1);
      s[nt][i] = read ? sp[int64_t(k) * V + v] : 0.f;
    }
  unsigned char* so = smem + kSpOO + sw * 2048;
  if constexpr (kProf) tp = clock64();
  const long long tstart = tp;
  for (int64_t c = 0; c < nc; ++c) {
    const int st = int(c % kSpNs);
    const unsigned char* stg = smem + st * kSpStage + kInBytes;
    const uint32_t sstg = sbase + st * kSpStage + kInBytes;
    const uint32_t sin = sbase + st * kSpStage;
    const float* vec = reinterpret_cast<const float*>(stg + kRVec);
    const int64_t t0 = bos + c * kC;
    const int n = int(eos - t0 < kC ? eos - t0 : kC);
    bar_sync(kSpFull + st, 256);
    DK_MARK(0)
    float x[8][4], o[8][4];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) x[i][j] = o[i][j] = 0.f;
    // X^T = S^T K^T (S hi + lo), O^T = S_hi^T Q^T.
#pragma unroll
    for (int kb = 0; kb < 8; ++kb) {
      uint32_t ah[4], al[4];
      split2(s[2 * kb][0], s[2 * kb][1], ah[0], al[0]);
      split2(s[2 * kb][2], s[2 * kb][3], ah[1], al[1]);
      split2(s[2 * kb + 1][0], s[2 * kb + 1][1], ah[2], al[2]);
      split2(s[2 * kb + 1][2], s[2 * kb + 1][3], ah[3], al[3]);
      if constexpr (kSched) {
        uint32_t bk[4][4], bq[4][4];
#pragma unroll
        for (int np = 0; np < 4; ++np) ldsm4(a_b_nk(sin + kOK, 16 * np, 16 * kb, 256, lane), bk[np]);
#pragma unroll
        for (int np = 0; np < 4; ++np) ldsm4(a_b_nk(sin + kOQ, 16 * np, 16 * kb, 256, lane), bq[np]);
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          mma_nv(x[2 * np], ah, bk[np][0], bk[np][1]);
          mma_nv(x[2 * np + 1], ah, bk[np][2], bk[np][3]);
        }
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          mma_nv(o[2 * np], ah, bq[np][0], bq[np][1]);
          mma_nv(o[2 * np + 1], ah, bq[np][2], bq[np][3]);
        }
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          mma_nv(x[2 * np], al, bk[np][0], bk[np][1]);
          mma_nv(x[2 * np + 1], al, bk[np][2], bk[np][3]);
        }
      } else {
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          uint32_t b[4];
          ldsm4(a_b_nk(sin + kOK, 16 * np, 16 * kb, 256, lane), b);
          mma(x[2 * np], ah, b[0], b[1]);
          mma(x[2 * np + 1], ah, b[2], b[3]);
          mma(x[2 * np], al, b[0], b[1]);
          mma(x[2 * np + 1], al, b[2], b[3]);
          ldsm4(a_b_nk(sin + kOQ, 16 * np, 16 * kb, 256, lane), b);
          mma(o[2 * np], ah, b[0], b[1]);
          mma(o[2 * np + 1], ah, b[2], b[3]);
        }
      }
    }
    DK_MARK(1)
    // E^T = V^T - X^T diag(xsc) (in x).
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) {
      uint32_t vr[4];
      ldsm4t(a_a_km(sin + kOV, 16 * kb, 16 * sw, 128, lane), vr);
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int nt = 2 * kb + hh;
        const float2 xs = *reinterpret_cast<const float2*>(vec + kXsc * 64 + 8 * nt + 2 * q);
        const float2 v0 = unpack_bf(vr[2 * hh]), v1 = unpack_bf(vr[2 * hh + 1]);
        x[nt][0] = v0.x - x[nt][0] * xs.x;
        x[nt][1] = v0.y - x[nt][1] * xs.y;
        x[nt][2] = v1.x - x[nt][2] * xs.x;
        x[nt][3] = v1.y - x[nt][3] * xs.y;
      }
    }
    DK_MARK(2)
    // v^T = E^T Tb^T (three products; Tb lower triangular: s-block kb <= t-block np).
    float vn[8][4];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) vn[i][j] = 0.f;
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) {
      uint32_t eh[4], el[4];
      split2(x[2 * kb][0], x[2 * kb][1], eh[0], el[0]);
      split2(x[2 * kb][2], x[2 * kb][3], eh[1], el[1]);
      split2(x[2 * kb + 1][0], x[2 * kb + 1][1], eh[2], el[2]);
      split2(x[2 * kb + 1][2], x[2 * kb + 1][3], eh[3], el[3]);
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        if (kb <= np) {
          uint32_t th[4], tl[4];
          ldsm4(a_b_nk(sstg + kOTh, 16 * np, 16 * kb, 128, lane), th);
          ldsm4(a_b_nk(sstg + kOTl, 16 * np, 16 * kb, 128, lane), tl);
          mma(vn[2 * np], eh, th[0], th[1]);
          mma(vn[2 * np + 1], eh, th[2], th[3]);
          mma(vn[2 * np], eh, tl[0], tl[1]);
          mma(vn[2 * np + 1], eh, tl[2], tl[3]);
          mma(vn[2 * np], el, th[0], th[1]);
          mma(vn[2 * np + 1], el, th[2], th[3]);
        }
      }
    }
    DK_MARK(3)
    // O^T = O^T diag(qsc) + v_hi^T P^T.
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      const float2 qs = *reinterpret_cast<const float2*>(vec + kQsc * 64 + 8 * nt + 2 * q);
      o[nt][0] *= qs.x;
      o[nt][1] *= qs.y;
      o[nt][2] *= qs.x;
      o[nt][3] *= qs.y;
    }
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) {
      uint32_t a[4];
      a[0] = pack_bf(vn[2 * kb][0], vn[2 * kb][1]);
      a[1] = pack_bf(vn[2 * kb][2], vn[2 * kb][3]);
      a[2] = pack_bf(vn[2 * kb + 1][0], vn[2 * kb + 1][1]);
      a[3] = pack_bf(vn[2 * kb + 1][2], vn[2 * kb + 1][3]);
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        if (kb <= np) {
          uint32_t b[4];
          ldsm4(a_b_nk(sstg + kOP, 16 * np, 16 * kb, 128, lane), b);
          mma(o[2 * np], a, b[0], b[1]);
          mma(o[2 * np + 1], a, b[2], b[3]);
        }
      }
    }
    DK_MARK(4)
    // Output: stage [64 t][16 v] bf16 per warp, then 16-byte rows to global.
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      const int t = 8 * nt + 2 * q;
      __nv_bfloat16* r0 = reinterpret_cast<__nv_bfloat16*>(so + t * 32);
      __nv_bfloat16* r1 = reinterpret_cast<__nv_bfloat16*>(so + (t + 1) * 32);
      r0[g] = __float2bfloat16_rn(o[nt][0]);
      r1[g] = __float2bfloat16_rn(o[nt][1]);
      r0[g + 8] = __float2bfloat16_rn(o[nt][2]);
      r1[g + 8] = __float2bfloat16_rn(o[nt][3]);
    }
    __syncwarp();
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int idx = lane + 32 * i, row = idx >> 1, half = idx & 1;
      if (row < n)
        *reinterpret_cast<uint4*>(out + ((t0 + row) * HV + hv) * V + col0 + 16 * sw + 8 * half) =
            *reinterpret_cast<const uint4*>(so + row * 32 + half * 16);
    }
    __syncwarp();
    DK_MARK(5)
    // S^T = e^{g_last} S^T + (v^T diag(kdec)) K  (two products).
    const float gl = vec[kMisc * 64];
#pragma unroll
    for (int nt = 0; nt < 16; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) s[nt][i] *= gl;
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) {
      uint32_t wh[4], wl[4];
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int nt = 2 * kb + hh;
        const float2 kd = *reinterpret_cast<const float2*>(vec + kKdec * 64 + 8 * nt + 2 * q);
        split2(vn[nt][0] * kd.x, vn[nt][1] * kd.y, wh[2 * hh], wl[2 * hh]);
        split2(vn[nt][2] * kd.x, vn[nt][3] * kd.y, wh[2 * hh + 1], wl[2 * hh + 1]);
      }
      if constexpr (kSched) {
        uint32_t bb[8][4];
#pragma unroll
        for (int np = 0; np < 8; ++np) ldsm4t(a_b_kn(sin + kOK, 16 * kb, 16 * np, 256, lane), bb[np]);
#pragma unroll
        for (int np = 0; np < 8; ++np) {
          mma_nv(s[2 * np], wh, bb[np][0], bb[np][1]);
          mma_nv(s[2 * np + 1], wh, bb[np][2], bb[np][3]);
        }
#pragma unroll
        for (int np = 0; np < 8; ++np) {
          mma_nv(s[2 * np], wl, bb[np][0], bb[np][1]);
          mma_nv(s[2 * np + 1], wl, bb[np][2], bb[np][3]);
        }
      } else {
#pragma unroll
        for (int np = 0; np < 8; ++np) {
          uint32_t b[4];
          ldsm4t(a_b_kn(sin + kOK, 16 * kb, 16 * np, 256, lane), b);
          mma(s[2 * np], wh, b[0], b[1]);
          mma(s[2 * np + 1], wh, b[2], b[3]);
          mma(s[2 * np], wl, b[0], b[1]);
          mma(s[2 * np + 1], wl, b[2], b[3]);
        }
      }
    }
    if (c + kSpNs < nc) bar_arrive(kSpEmpty + st, 256);
    DK_MARK(6)
  }
  if constexpr (kProf) {
    if (blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && tid == 0 && nc >= 64 &&
        atomicAdd(&g_split_prof_printed, 1) == 0)
      printf("split-prof state nc=%lld cycles/chunk: wait_full %lld X+QS %lld E %lld v %lld O %lld store %lld "
             "S_update %lld total %lld\n",
             (long long)nc, ph[0] / nc, ph[1] / nc, ph[2] / nc, ph[3] / nc, ph[4] / nc, ph[5] / nc, ph[6] / nc,
             (clock64() - tstart) / nc);
  }
#undef DK_MARK
#pragma unroll
  for (int nt = 0; nt < 16; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int k = 8 * nt + 2 * q + (i & 1), v = 16 * sw + g + 8 * (i >> 1);
      sp[int64_t(k) * V + v] = s[nt][i];
    }
#elif defined(__CUDA_ARCH__)
  __trap();
#endif  // DK_GDR_FUSED_SM90A
}

// Split pipeline, state kernel on wgmma (variant bit 16, session 5; compiled, not yet run on a GPU). Same roles and
// products as split_state_kernel, but every state-side product is an asynchronous warpgroup MMA with the A operand
// from registers (the S^T / E^T / v^T accumulators split to bf16 fragments, the layout of mma.sync's A fragment) and
// the B operand from shared memory through 128-byte-swizzle descriptors: X^T = S^T K^T and S_hi^T Q^T (24 x
// m64n64k16, K / Q tiles K-major as two 64-column panels), v^T = E^T Tb^T (12), O^T += v_hi^T P^T (4), S^T +=
// (v^T diag(kdec)) K (16, the K panels MN-major). Stage tiles are 1024-aligned (stage stride 67 KB).
#ifdef DK_GDR_FUSED_SM90A
__device__ __forceinline__ uint64_t wg_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t((lbo & 0x3FFFF) >> 4) << 16) |
         (uint64_t((sbo & 0x3FFFF) >> 4) << 32) | (uint64_t(1) << 62);
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void fence_acc(float (&r)[8][4]) {
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+f"(r[i][j])::"memory");
}
__device__ __forceinline__ void fence_frag(uint32_t (&r)[4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[j])::"memory");
}
// D[64 x 64] (+)= A[64 x 16] B[16 x 64]: A bf16 from registers (warp w: rows 16 w .. 16 w + 15, mma.sync A-fragment
// layout), B from shared memory (TB = 0: K-major, TB = 1: MN-major), f32 accumulate in d (mma.sync C layout per n8).
template <int TB>
__device__ __forceinline__ void wg_rs(float (&d)[8][4], const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %38, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
      "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, %37;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),
        "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),
        "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),
        "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(TB), "r"(1));
}
// D[64 x 128] += A[64 x 16] B[16 x 128]: as wg_rs with N = 128, B K-major; accumulator n8 tiles 0..7 in d0, 8..15 in d1.
__device__ __forceinline__ void wg_rs128(float (&d0)[8][4], float (&d1)[8][4], const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
      : "+f"(d0[0][0]), "+f"(d0[0][1]), "+f"(d0[0][2]), "+f"(d0[0][3]), "+f"(d0[1][0]), "+f"(d0[1][1]), "+f"(d0[1][2]), "+f"(d0[1][3]), "+f"(d0[2][0]), "+f"(d0[2][1]), "+f"(d0[2][2]), "+f"(d0[2][3]), "+f"(d0[3][0]), "+f"(d0[3][1]), "+f"(d0[3][2]), "+f"(d0[3][3]), "+f"(d0[4][0]), "+f"(d0[4][1]), "+f"(d0[4][2]), "+f"(d0[4][3]), "+f"(d0[5][0]), "+f"(d0[5][1]), "+f"(d0[5][2]), "+f"(d0[5][3]), "+f"(d0[6][0]), "+f"(d0[6][1]), "+f"(d0[6][2]), "+f"(d0[6][3]), "+f"(d0[7][0]), "+f"(d0[7][1]), "+f"(d0[7][2]), "+f"(d0[7][3]), "+f"(d1[0][0]), "+f"(d1[0][1]), "+f"(d1[0][2]), "+f"(d1[0][3]), "+f"(d1[1][0]), "+f"(d1[1][1]), "+f"(d1[1][2]), "+f"(d1[1][3]), "+f"(d1[2][0]), "+f"(d1[2][1]), "+f"(d1[2][2]), "+f"(d1[2][3]), "+f"(d1[3][0]), "+f"(d1[3][1]), "+f"(d1[3][2]), "+f"(d1[3][3]), "+f"(d1[4][0]), "+f"(d1[4][1]), "+f"(d1[4][2]), "+f"(d1[4][3]), "+f"(d1[5][0]), "+f"(d1[5][1]), "+f"(d1[5][2]), "+f"(d1[5][3]), "+f"(d1[6][0]), "+f"(d1[6][1]), "+f"(d1[6][2]), "+f"(d1[6][3]), "+f"(d1[7][0]), "+f"(d1[7][1]), "+f"(d1[7][2]), "+f"(d1[7][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
#endif
constexpr uint32_t kWgStage = 67 * 1024;                    // [K panels 16 KB | Q panels 16 KB | V 8 KB | image]
constexpr uint32_t kWgOO = kSpNs * kWgStage;                // output staging, 4 x bf16 [64][16]
constexpr uint32_t kWgSmem = kWgOO + 4 * 64 * 32 + 1024;    // + alignment slack: 215,040
static_assert(kInBytes + kStRest <= kWgStage && kWgSmem <= 232448, "wgmma split shared memory plan");
// Pair variant (bit 8192): one CTA per (sequence, value head, 128 value columns) = two state warpgroups (warps 0-3: columns
// 0..63, warps 4-7: 64..127 of the block) sharing each chunk's K / Q panels and image, loaders = warps 8-11. Stage [K
// panels 16 KB | Q panels 16 KB | V tile of warpgroup 0 8 KB | of warpgroup 1 8 KB | image]; two stages (three do not
// fit beside the 16 KB output staging); setmaxnreg: 232 registers for the state warpgroups, 40 for the loaders.
constexpr uint32_t kWg2In = 49152;                          // K 16 KB + Q 16 KB + 2 x V 8 KB
constexpr uint32_t kWg2Stage = 75 * 1024;                   // 76,800 >= 49,152 + 26,880
constexpr int kWg2Ns = 2;
constexpr uint32_t kWg2OO = kWg2Ns * kWg2Stage;             // output staging, 8 x bf16 [64][16]
constexpr uint32_t kWg2Smem = kWg2OO + 8 * 64 * 32 + 1024;  // + alignment slack: 171,008
static_assert(kWg2In + kStRest <= kWg2Stage && kWg2Smem <= 232448, "pair split shared memory plan");

__device__ long long g_split_wg_prof[9];
__global__ void split_wg_prof_print() {
  if (g_split_prof_printed == 1 && g_split_wg_prof[8] > 0) {
    const long long* h = g_split_wg_prof;
    printf("split-wg-prof state nc=%lld cycles/chunk: wait_full %lld X+QS %lld E %lld v %lld O-issue+S-issue %lld "
           "store %lld S_wait %lld total %lld\n",
           h[8], h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]);
    g_split_prof_printed = 2;
  }
}

template <int VAR>
__global__ void __launch_bounds__((VAR & 8192) != 0 ? 384 : kThreads, 1)
    split_wg_kernel(const __grid_constant__ WgArgs<VAR> args) {
#ifdef DK_GDR_FUSED_SM90A
  constexpr bool kProf = (VAR & 2) != 0, kAhead = (VAR & 32) != 0, kChain = (VAR & 128) != 0;
  // kPair (VAR & 8192): two state warpgroups per CTA (both 64-column halves of 128 value columns), see kWg2Stage.
  constexpr bool kPair = (VAR & 8192) != 0;
  static_assert(!kPair || (kChain && (VAR & (2 | 32 | 4096)) == 0), "pair: chain variant, plain or overlap launch");
  constexpr int kNT = kPair ? 384 : kThreads;     // threads
  constexpr int kSW = kPair ? 8 : 4;              // state warps (loaders: warps kSW .. kSW + 3)
  constexpr int kNs = kPair ? kWg2Ns : kSpNs;     // stages
  constexpr uint32_t kStg = kPair ? kWg2Stage : kWgStage, kIn = kPair ? kWg2In : kInBytes;
  constexpr uint32_t kOO = kPair ? kWg2OO : kWgOO;
  constexpr int kCols = kPair ? 2 * kBV : kBV;    // value columns per CTA
  // kLo: the bf16 lo-part products (S_lo K^T, E_hi Tb_lo, E_lo Tb_hi, (v kdec)_lo K); without them (VAR & 256, a
  // measurement of the tensor work's share only: below the contract's precision) one bf16 product each.
  constexpr bool kLo = (VAR & 256) == 0;
  // kSyncEmpty (VAR & 32768, a racecheck diagnostic only; session 8): the state warps release a stage with bar.sync
  // instead of bar.arrive on its "empty" barrier (they then also wait for the loaders to reach it: slower, same
  // results). The ordering is the same in the PTX memory model. H200 2026-12-02: racecheck reports the same stage-refill
  // sites (V^T ldmatrix vs the loaders' V-tile cp.async) under it as under 209, so the report is not about bar.arrive.
  constexpr bool kSyncEmpty = (VAR & 32768) != 0;
  static_assert(!kSyncEmpty || (VAR & (512 | 4096 | 8192 | 32)) == 0, "sync-empty diagnostic: plain single CTA only");
  // kMbarEmpty (VAR & 65536; session 8 on the plain single CTA, session 9 also on the pair CTA and the context-parallel
  // passes): the stage release through one mbarrier per stage instead of the named "empty" barrier: every state thread
  // (32 kSW) arrives (release) after its last read of the stage, the loaders wait for the phase's parity (acquire)
  // before refilling it. The same ordering as bar.arrive / bar.sync in the PTX memory model; written because
  // compute-sanitizer racecheck orders mbarrier hand-offs but reports hazards on correct named-barrier ones
  // (tools/tune/racecheck_probe.cu, session 4; H200 session 8: 65745 racecheck 0 where 209 reported the stage refill).
  // Not with the overlap (512: its loaders may stop early) nor two chunks in flight (32) nor the bar.sync diagnostic.
  constexpr bool kMbarEmpty = (VAR & 65536) != 0;
  static_assert(!kMbarEmpty || (VAR & (512 | 32 | 32768)) == 0, "mbarrier release: plain, pair or context-parallel");
  // kStsmO (VAR & 2097152; session 10, opt-in, gdr-state): the output tile leaves the O^T accumulators by stmatrix .trans
  // (16 bf16 pairs + 4 STSM per thread instead of 32 single-value packs + 32 2-byte stores into the warp's [64 t][16 v]
  // staging), and the 16-byte global row stores step one precomputed pointer. Same staging layout and values. H200
  // (2026-12-02, in 4157649): tests 20/20, memcheck 0 (racecheck not run); 27B TP1 / TP2 / 9B 8x8192 / 9B 1x65536
  // -2.4 / -1.3 / -0.9 / -2.6% vs 2060497 in the same call (docs/benchmarks/2026-12-02-gdr-state-s10.md).
  constexpr bool kStsmO = (VAR & 2097152) != 0;
  // kDeferO (VAR & 16777216; session 11, opt-in, gdr-state): the output store's global half off the chain. Chunk c's
  // tile is staged by stmatrix (kStsmO) as before, but its 16-byte row stores (LDS.128 + STG.128) run in chunk c + 1
  // after the X / S Q^T group is issued, under that group's wait (the tensor pipe busy, the chain idle); the last
  // chunk's rows after the loop. The staging is per warp, reused only by the same warp's next stmatrix (ordered by
  // __syncwarp). Every chunk but the last is full (n = 64), so the deferred rows need no bounds but the last's.
  constexpr bool kDeferO = (VAR & 16777216) != 0;
  static_assert(!kDeferO || (kStsmO && kChain && (VAR & 512) == 0), "deferred store: stmatrix staging, chain form");
  // kS2G (VAR & 33554432; session 11, opt-in, gdr-state; with kStsmO): the X / S Q^T product as two commit groups.
  // Only s0 (S^T columns k 0..63) is split before the products start; X kb 0..3 (panel 0) are issued, then s1 is split
  // into the A fragments of kb 4..7 while those run on the tensor pipe, then kb 4..7 follow into the same accumulators
  // (same products, same order of the k16 steps per accumulator). (A form with the S update itself as two groups and
  // s0's split under S1 was serialized by ptxas (C7514): wgmma groups in flight across the loop's back edge.)
  constexpr bool kS2G = (VAR & 33554432) != 0;
  static_assert(!kS2G || (kStsmO && kChain && (VAR & 512) == 0 && !kProf), "two X groups: chain form, unprofiled");
  // kPP (VAR & 134217728; session 12, opt-in, gdr-state; the pair CTA only): ping-pong of the two state warpgroups on
  // the tensor pipe. Without it both warpgroups bar.sync one FULL barrier per chunk (384 threads) and so run in
  // lockstep: their X groups interleave on each SMSP's in-order tensor pipe and end together, then both run their
  // CUDA-core phases (E, va / (v kdec) split, output staging, S split) at once while the pipe idles. With it: (1) each
  // warpgroup has its own FULL barrier per stage (warpgroup 0: kSpFull + stage, 1: kPpFull1 + stage; 256 threads, the
  // loaders arrive on both), so the warpgroups drift apart (by < 2 chunks: the stage release still needs both);
  // (2) the wgmma groups take turns: warpgroup w bar.syncs kPpTurn + w before the wgmma.fence of each of its three
  // groups (X / S Q^T; v; O + S update) and bar.arrives kPpTurn + 1 - w after the group's commit, so the pipe runs
  // X0 X1 v0 v1 OS0 OS1 X0' ... and one warpgroup's CUDA-core phase issues while the other's group runs. Warpgroup 1
  // arrives once on kPpTurn before its loop, warpgroup 0 syncs once more after its loop (the counts balance). The turn
  // barriers order only issue; no data passes between the warpgroups (each has its own V tile, staging, state).
  constexpr bool kPP = (VAR & 134217728) != 0;
  static_assert(!kPP || (kPair && kChain && kMbarEmpty && !kS2G && (VAR & 512) == 0 && !kProf),
                "ping-pong: pair CTA, chain form, mbarrier release, no overlap, unprofiled");
  // kNoLd (VAR & 268435456; session 12, a MEASUREMENT ONLY, WRONG results; pair CTA): the loaders issue no copies (they
  // still arrive on the FULL barriers), so the state warps run on whatever the stages hold: the chain without loads.
  constexpr bool kNoLd = (VAR & 268435456) != 0;
  static_assert(!kNoLd || (kPair && kMbarEmpty && (VAR & 512) == 0), "no-load diagnostic: pair CTA");
  // kImgBulk (VAR & 536870912; session 12, opt-in, gdr-state): the stage image (26,880 contiguous bytes per chunk and
  // value head) arrives by ONE bulk copy (TMA, 1-D) issued by loader thread 0 on a per-stage mbarrier (expect_tx)
  // instead of 1,680 16-byte cp.async; the state warps wait on that mbarrier's phase (acquire) after their FULL barrier
  // (which still covers the K / Q / V cp.async). The mbarrier of stage st completes phase c / kNs for chunk c; the
  // loaders re-arm it only after the stage's release, i.e. after every state thread saw the phase.
  constexpr bool kImgBulk = (VAR & 536870912) != 0;
  static_assert(!kImgBulk || (kMbarEmpty && !kAhead && (VAR & 512) == 0 && !kNoLd), "bulk image: mbarrier release");
  // kTma (VAR & 1073741824; session 13, opt-in, gdrtma; with kImgBulk): the K / Q panels and the V tile(s) of every FULL
  // chunk (n = 64 rows) by tensor-map TMA (args.tm_q / tm_k / tm_v: 64 x 64 bf16 boxes with the 128-byte swizzle,
  // which is exactly the panels' XOR-by-(row & 7) layout on the 1024-aligned stage): loader thread 0 adds their bytes
  // (32 KB + 8 / 16 KB) to the image's expect_tx on the stage's mbarrier and issues 5 (single, CP) / 6 (pair) copies
  // instead of 2,560 / 3,072 16-byte cp.async. The ragged last chunk of a sequence or segment (n < 64) keeps the
  // cp.async path (rows >= n zero-filled exactly as before: a box would read the next sequence's rows), as does a
  // context-parallel v = 0 record's V tile (zero-filled). Row coordinates are token indices (int32: the host encodes
  // the maps only for T < 2^31; the byte offsets come from the maps' 64-bit strides). In the library default since
  // session 13 (1694462161): H200 -3.7 / -4.8 / -3.1 / -5.9% at 27B TP1 / TP2 / 9B 8 x 8192 / 9B 1 x 65536 vs
  // 620720337 in one call, state kernel -3.5% single / -6.4% pair (ncu); docs/benchmarks/2026-12-02-gdr-state-s13.md.
  constexpr bool kTma = (VAR & 1073741824) != 0;
  // With kPP (session 13, gdrpp, opt-in: 1828679889): both warpgroups wait the stage's image mbarrier phase after their
  // own FULL barrier; the loaders re-arm it only after both released the stage, as with the bulk image alone.
  static_assert(!kTma || (kImgBulk && kChain), "tensor-map loads: with the bulk image, chain form");
  __shared__ __align__(8) unsigned long long s_img[kSpNs];
  __shared__ __align__(8) unsigned long long s_empty[kSpNs];
  // kOvl (VAR & 512): this kernel runs BEFORE / alongside the local pass (launch_split): the loaders wait for each
  // image's ready flag (bounded spin; on timeout the CTA aborts without writing the state and the fix-up launch,
  // args.fix = 1, reruns it after the local pass).
  constexpr bool kOvl = (VAR & 512) != 0;
  static_assert(!kOvl || !kAhead, "overlap: one chunk in flight per loader step");
  // kCp (VAR & 4096): context parallelism (launch_cp): blockIdx.x indexes args.cps (a segment: token range, first
  // chunk id, initial / final state blocks, identity start, v = 0, no output rows) instead of a sequence.
  constexpr bool kCp = (VAR & 4096) != 0;
  static_assert(!kCp || !kOvl, "context parallelism: not with the overlap");
  // s_ovl[0], [1]: the loaders' verdict per chunk parity (thread 0 -> barrier -> all); s_ovl[2 + stage]: "the loaders
  // stopped at the chunk of this stage", set before their arrival on its full barrier. Per stage, so that the state
  // warps (up to two chunks behind, on other stages) all read 0 until they reach that chunk: one uniform break.
  __shared__ int s_ovl[2 + kSpNs];
  if constexpr (kOvl) {
    const int64_t cta = (int64_t(blockIdx.x) * gridDim.y + blockIdx.y) * gridDim.z + blockIdx.z;
    const int* abort_flag = reinterpret_cast<const int*>(args.w.flags) + (args.w.nt * args.p.h_v + cta);
    if (args.fix == 1) {  // fix-up launch: only the CTAs whose overlapped run aborted
      if (*reinterpret_cast<const volatile int*>(abort_flag) == 0) return;
    } else {
      asm volatile("griddepcontrol.launch_dependents;" ::: "memory");  // the local pass may start now
    }
    if (threadIdx.x < 2 + kSpNs) s_ovl[threadIdx.x] = 0;
    __syncthreads();
  }
  // kChain: K / Q panels interleaved [K p0 | Q p0 | K p1 | Q p1] (X and S Q^T as one N = 128 product per k16 step),
  // the V^T tile read under the X group, S / O scaling under the v group.
  constexpr uint32_t kPan = kChain ? 16384u : 8192u, kQo = kChain ? 8192u : kOQ;
  long long tp = 0, ph[10] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
#define DK_MARK(i)                  \
  if constexpr (kProf) {            \
    const long long now = clock64(); \
    ph[i] += now - tp;              \
    tp = now;                       \
  }
  const DkGdrPrefillFusedParams& p = args.p;
  extern __shared__ __align__(128) unsigned char smem[];
  const int tid = threadIdx.x;
  const int warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, q = lane & 3;
  // kCp: grid (V / 64, H_v, records): the records are the slowest grid dimension, so that CTAs beyond the first wave
  // are the last records' (pass 1: segment 1's D runs, the shortest).
  const int64_t seq = kCp ? blockIdx.z : blockIdx.x;
  const int hv = blockIdx.y;
  const int colb = (kCp ? blockIdx.x : blockIdx.z) * kCols;  // the CTA's first value column
  const int64_t HV = p.h_v, V = p.v_dim, T = p.num_tokens;
  const int hk = int(hv / (HV / p.h_k));
  int64_t bos, eos, slot = 0;
  bool live;
  int cpf = 0;  // kCp: the record's flags
  if constexpr (kCp) {
    bos = args.cps[seq].bos;
    eos = args.cps[seq].eos;
    cpf = args.cps[seq].flags;
    live = (cpf & kCpLive) != 0;
  } else {
    const int* cu = reinterpret_cast<const int*>(p.cu_seqlens);
    bos = cu[seq];
    eos = cu[seq + 1];
    bos = bos < 0 ? 0 : (bos > T ? T : bos);
    eos = eos < bos ? bos : (eos > T ? T : eos);
    slot = reinterpret_cast<const int*>(p.slots)[seq];
    live = slot >= 0 && slot < p.num_slots;
  }
  const bool store_out = !kCp || (cpf & kCpNoOut) == 0;
  __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(p.out);
  if (!live) {  // padding sequence: zero output rows, state untouched
    if (!store_out) return;
    const int64_t chunks = (eos - bos) * (kCols / 8);
    for (int64_t i = tid; i < chunks; i += kNT) {
      const int64_t t = bos + i / (kCols / 8);
      const int ch = int(i % (kCols / 8));
      *reinterpret_cast<uint4*>(out + (t * HV + hv) * V + colb + 8 * ch) = make_uint4(0, 0, 0, 0);
    }
    return;
  }
  const int64_t nc = (eos - bos + kC - 1) / kC;
  if constexpr (kMbarEmpty) {  // every thread of the CTA passes here (the padding return above is CTA-uniform)
    if (tid < kNs) mbar_init(smem_u32(&s_empty[tid]), 32 * kSW);
    if constexpr (kImgBulk) {
      if (tid < kNs) mbar_init(smem_u32(&s_img[tid]), 1);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    __syncthreads();
  }
  const uint32_t sbase = smem_u32(smem);
  const uint32_t abase = (sbase + 1023u) & ~1023u;  // 1024-aligned stage tiles (128-byte swizzle atoms)
  unsigned char* asmem = smem + (abase - sbase);
  if (warp >= kSW) {  // loaders: chunk c's K / Q panels, V tile(s) and image into stage c % kNs
    if constexpr (kPair) asm volatile("setmaxnreg.dec.sync.aligned.u32 40;" ::: "memory");
    const int lt = tid - 32 * kSW;
    const __nv_bfloat16* kp = reinterpret_cast<const __nv_bfloat16*>(p.k);
    const __nv_bfloat16* qp = reinterpret_cast<const __nv_bfloat16*>(p.q);
    const __nv_bfloat16* vp = reinterpret_cast<const __nv_bfloat16*>(p.v);
    const int64_t cbase = kCp ? args.cps[seq].chunk0 : int64_t(reinterpret_cast<const int*>(args.w.coff)[seq]);
    const bool vzero = kCp && (cpf & kCpVZero) != 0;
    if constexpr (kTma) {
      if (lt == 0)
        asm volatile("prefetch.tensormap [%0];\nprefetch.tensormap [%1];\nprefetch.tensormap [%2];\n"
                     ::"l"(reinterpret_cast<uint64_t>(&args.tm_k)), "l"(reinterpret_cast<uint64_t>(&args.tm_q)),
                     "l"(reinterpret_cast<uint64_t>(&args.tm_v))
                     : "memory");
    }
    for (int64_t c = 0; c < nc; ++c) {
      const int st = int(c % kNs);
      if (c >= kNs) {
        if constexpr (kMbarEmpty)
          mbar_wait_parity(smem_u32(&s_empty[st]), uint32_t(c / kNs - 1) & 1u);  // chunk c - kNs released
        else
          bar_sync(kSpEmpty + st, 32 * (kSW + 4));
      }
      const uint32_t sin = abase + st * kStg;
      const int64_t t0 = bos + c * kC;
      const int n = int(eos - t0 < kC ? eos - t0 : kC);
      // kTma: a full chunk's K / Q panels (and V tiles unless v = 0) come by TMA below, the ragged tail's by cp.async
      [[maybe_unused]] const bool tfull = kTma && n == kC;
      if constexpr (!kNoLd) {  // (kNoLd: no copies)
        if (!tfull) {
#pragma unroll(kPair ? 2 : 8)
          for (int i = 0; i < 8; ++i) {
            const int idx = lt + 128 * i, row = idx >> 4, ch = idx & 15;
            const int rr = row < n ? row : 0;
            const uint32_t bytes = row < n ? 16u : 0u;
            const uint32_t off =
                uint32_t(ch >> 3) * kPan + uint32_t(row * 128) + (uint32_t(((ch & 7) ^ (row & 7))) << 4);
            cp_async16(sin + kOK + off, kp + (t0 + rr) * p.k_stride + hk * kK + ch * 8, bytes);
            cp_async16(sin + kQo + off, qp + (t0 + rr) * p.q_stride + hk * kK + ch * 8, bytes);
          }
        }
        if (!tfull || vzero) {
          if constexpr (kPair) {  // two V tiles (the warpgroups' 64-column halves), each laid out as the single one
#pragma unroll 2
            for (int i = 0; i < 8; ++i) {
              const int idx = lt + 128 * i, row = idx >> 4, ch = idx & 15;
              const int rr = row < n ? row : 0;
              const uint32_t off =
                  uint32_t(ch >> 3) * 8192u + uint32_t(row * 128) + (uint32_t(((ch & 7) ^ (row & 7))) << 4);
              cp_async16(sin + kOV + off, vp + (t0 + rr) * p.v_stride + hv * V + colb + ch * 8, row < n ? 16u : 0u);
            }
          } else {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const int idx = lt + 128 * i, row = idx >> 3, ch = idx & 7;
              const int rr = row < n ? row : 0;
              const uint32_t off = uint32_t(row * 128) + (uint32_t((ch ^ (row & 7))) << 4);
              cp_async16(sin + kOV + off, vp + (t0 + rr) * p.v_stride + hv * V + colb + ch * 8,
                         row < n && !vzero ? 16u : 0u);
            }
          }
        }
      }
      int64_t pi = cbase + c;
      pi = pi < args.w.nt ? pi : args.w.nt - 1;  // only for cu_seqlens the offsets pass clamped
      if constexpr (kOvl) {
        if (args.fix != 1) {  // image (pi, hv) ready? thread 0 spins (bounded), the loaders agree through a barrier
          const int* rf = reinterpret_cast<const int*>(args.w.flags) + (pi * HV + hv);
          volatile int* verdict = s_ovl + (c & 1);  // thread 0 is at most one barrier ahead of the others
          if (lt == 0) {
            bool ok = args.fix == 0 && ld_acquire_gpu(rf) != 0;
            if (!ok && args.fix == 0) {
              const uint64_t ts = global_ns();
              while (!(ok = ld_acquire_gpu(rf) != 0) && global_ns() - ts < kOvlSpinNs) __nanosleep(256);
            }
            *verdict = ok ? 0 : 1;
            if (!ok) s_ovl[2 + st] = 1;
          }
          bar_sync(kOvlLd, 128);
          if (*verdict != 0) {  // timed out: drain this stage's copies, release the consumers, stop
            cp_async_wait_all();
            bar_arrive(kSpFull + st, 32 * (kSW + 4));
            return;
          }
          (void)ld_acquire_gpu(rf);  // this thread's own acquire (sees 1: read-read coherence after thread 0)
        }
      }
      const unsigned char* src = reinterpret_cast<const unsigned char*>(args.w.img) + uint64_t(pi * HV + hv) * kStRest;
      if constexpr (kImgBulk) {
        if (lt == 0) {
          const uint32_t bar = smem_u32(&s_img[st]);
          if constexpr (kTma) {
            if (tfull) {  // + the K / Q panels and V tile(s) of this full chunk: 5 / 6 boxes of 8 KB
              mbar_expect_tx(bar, kStRest + 32768u + (vzero ? 0u : (kPair ? 16384u : 8192u)));
              const int r0 = int(t0), ck = hk * kK;
              tma_2d(sin + kOK, &args.tm_k, ck, r0, bar);
              tma_2d(sin + kOK + kPan, &args.tm_k, ck + 64, r0, bar);
              tma_2d(sin + kQo, &args.tm_q, ck, r0, bar);
              tma_2d(sin + kQo + kPan, &args.tm_q, ck + 64, r0, bar);
              if (!vzero) {
                const int cv = int(hv * V + colb);
                tma_2d(sin + kOV, &args.tm_v, cv, r0, bar);
                if constexpr (kPair) tma_2d(sin + kOV + 8192u, &args.tm_v, cv + 64, r0, bar);
              }
            } else {
              mbar_expect_tx(bar, kStRest);
            }
          } else {
            mbar_expect_tx(bar, kStRest);
          }
          bulk_g2s(sin + kIn, src, kStRest, bar);
        }
      } else if constexpr (!kNoLd) {
        for (int idx = lt; idx < int(kStRest / 16); idx += 128)
          cp_async16(sin + kIn + 16u * idx, src + 16 * idx, 16u);
      }
      cp_async_commit();
      if constexpr (kAhead) {  // two chunks in flight: chunk c - 1's copies landed -> its stage is full
        if (c >= 1) {
          asm volatile("cp.async.wait_group 1;" ::: "memory");
          bar_arrive(kSpFull + int((c - 1) % kSpNs), 256);
        }
      } else {
        cp_async_wait_all();
        if constexpr (kPP) {  // one FULL barrier per state warpgroup
          bar_arrive(kSpFull + st, 256);
          bar_arrive(kPpFull1 + st, 256);
        } else {
          bar_arrive(kSpFull + st, 32 * (kSW + 4));
        }
      }
    }
    if constexpr (kAhead) {
      if (nc >= 1) {
        cp_async_wait_all();
        bar_arrive(kSpFull + int((nc - 1) % kSpNs), 256);
      }
    }
    return;
  }

  // ------------------------------------------------------------------- state warpgroup: S^T rows 16 sw .. 16 sw + 15
  if constexpr (kPair) asm volatile("setmaxnreg.inc.sync.aligned.u32 232;" ::: "memory");
  const int sw = kPair ? (warp & 3) : warp;
  const int col0 = colb + (kPair ? (warp >> 2) * kBV : 0);  // this warpgroup's 64 value columns
  const uint32_t kOVw = kOV + (kPair ? uint32_t(warp >> 2) * 8192u : 0u);  // its V tile in the stage
  [[maybe_unused]] const int wgi = kPair ? (warp >> 2) : 0;  // the state warpgroup (kPP)
  float s0[8][4], s1[8][4];  // S^T columns k 0..63 (panel 0) and 64..127 (panel 1)
#define DK_S(nt, i) ((nt) < 8 ? s0[(nt) & 7][i] : s1[(nt) & 7][i])
  float* sp = reinterpret_cast<float*>(p.state) + (slot * HV + hv) * (int64_t(kK) * V) + col0;
  bool read = p.init_mode == 1;
  bool ident = false;  // kCp: the identity initial state
  if constexpr (kCp) {
    const float* in = args.cps[seq].in;
    read = in != nullptr;
    ident = (cpf & kCpIdent) != 0;
    if (read) sp = const_cast<float*>(in) + hv * (int64_t(kK) * V) + col0;
  } else {
    if (p.init_mode == 2) read = reinterpret_cast<const int*>(p.init)[seq] != 0;
  }
#pragma unroll
  for (int nt = 0; nt < 16; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int k = 8 * nt + 2 * q + (i & 1), v = 16 * sw + g + 8 * (i >> 1);
      DK_S(nt, i) = read ? sp[int64_t(k) * V + v] : (ident && k == col0 + v ? 1.f : 0.f);
    }
  unsigned char* so = asmem + kOO + warp * 2048;
  // The warp's staged [64 t][16 v] tile -> output rows tb + row (row < nn): 16 bytes a lane, 4 rows of 16 apart.
  auto store_staged = [&](int64_t tb, int nn, bool on) {
    const int64_t rs = HV * V;  // elements between consecutive tokens' rows
    __nv_bfloat16* ob = out + ((tb + (lane >> 1)) * HV + hv) * V + col0 + 16 * sw + 8 * (lane & 1);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = (lane >> 1) + 16 * i;
      if (row < nn && on)
        *reinterpret_cast<uint4*>(ob + int64_t(16 * i) * rs) =
            *reinterpret_cast<const uint4*>(so + row * 32 + (lane & 1) * 16);
    }
  };
  // the state warps' stage release of chunk cc (after its last read of the stage)
  auto release = [&](int64_t cc) {
    if (cc + kNs < nc) {
      const int rst = int(cc % kNs);
      if constexpr (kSyncEmpty)
        bar_sync(kSpEmpty + rst, 32 * (kSW + 4));
      else if constexpr (kMbarEmpty)
        mbar_arrive(smem_u32(&s_empty[rst]));
      else
        bar_arrive(kSpEmpty + rst, 32 * (kSW + 4));
    }
  };
  if constexpr (kPP) {  // warpgroup 0 takes the first turn
    if (wgi == 1) bar_arrive(kPpTurn, 256);
  }
  if constexpr (kProf) tp = clock64();
  bool aborted = false;  // overlap: the loaders stopped (s_ovl[2 + stage])
  const long long tstart = tp;
  for (int64_t c = 0; c < nc; ++c) {
    const int st = int(c % kNs);
    const unsigned char* stg = asmem + st * kStg + kIn;
    const uint32_t sstg = abase + st * kStg + kIn;
    const uint32_t sin = abase + st * kStg;
    const float* vec = reinterpret_cast<const float*>(stg + kRVec);
    const int64_t t0 = bos + c * kC;
    const int n = int(eos - t0 < kC ? eos - t0 : kC);
    uint32_t ah[8][4], al[8][4];
#pragma unroll
    for (int kb = 0; kb < (kS2G ? 4 : 8); ++kb) {
      split2(DK_S(2 * kb, 0), DK_S(2 * kb, 1), ah[kb][0], al[kb][0]);
      split2(DK_S(2 * kb, 2), DK_S(2 * kb, 3), ah[kb][1], al[kb][1]);
      split2(DK_S(2 * kb + 1, 0), DK_S(2 * kb + 1, 1), ah[kb][2], al[kb][2]);
      split2(DK_S(2 * kb + 1, 2), DK_S(2 * kb + 1, 3), ah[kb][3], al[kb][3]);
    }
    float x[8][4], o[8][4];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) x[i][j] = o[i][j] = 0.f;
    if constexpr (kPP)
      bar_sync((wgi != 0 ? kPpFull1 : kSpFull) + st, 256);
    else
      bar_sync(kSpFull + st, 32 * (kSW + 4));
    if constexpr (kOvl) {
      if (*reinterpret_cast<volatile int*>(s_ovl + 2 + st) != 0) {  // the loaders stopped here: no state store below
        aborted = true;
        break;
      }
    }
    if constexpr (kImgBulk) mbar_wait_parity(smem_u32(&s_img[st]), uint32_t(c / kNs) & 1u);  // the image landed
    fence_proxy_async_smem();  // the cp.async-written tiles -> the tensor cores' async proxy
    DK_MARK(0)
    // X^T = S^T K^T (S hi + lo), O^T = S_hi^T Q^T: B = K / Q rows (K-major, panel kb / 4, 32 bytes a k16 step).
    // Every A fragment and accumulator is pinned (volatile register fences) before wgmma.fence, so that none is
    // defined between the fence and the products (ptxas would insert a warpgroup.arrive and serialize them).
#pragma unroll
    for (int kb = 0; kb < (kS2G ? 4 : 8); ++kb) {
      fence_frag(ah[kb]);
      fence_frag(al[kb]);
    }
    fence_acc(x);
    fence_acc(o);
    if constexpr (kPP) bar_sync(kPpTurn + wgi, 256);  // this warpgroup's turn on the tensor pipe
    wg_fence();
    uint32_t vr[4][4];
    if constexpr (kS2G) {
#pragma unroll
      for (int kb = 0; kb < 4; ++kb) {  // X kb 0..3 (panel 0) from s0
        const uint64_t dkq = wg_desc(sin + kOK + uint32_t(kb & 3) * 32u, 16, 1024);
        wg_rs128(x, o, ah[kb], dkq);
        if constexpr (kLo) wg_rs<0>(x, al[kb], dkq);
      }
      wg_commit();
      fence_acc(s1);  // pinned after the commit (else the compiler hoists the split above the first group)
#pragma unroll
      for (int kb = 4; kb < 8; ++kb) {  // s1's split under the first group
        split2(DK_S(2 * kb, 0), DK_S(2 * kb, 1), ah[kb][0], al[kb][0]);
        split2(DK_S(2 * kb, 2), DK_S(2 * kb, 3), ah[kb][1], al[kb][1]);
        split2(DK_S(2 * kb + 1, 0), DK_S(2 * kb + 1, 1), ah[kb][2], al[kb][2]);
        split2(DK_S(2 * kb + 1, 2), DK_S(2 * kb + 1, 3), ah[kb][3], al[kb][3]);
        fence_frag(ah[kb]);
        fence_frag(al[kb]);
      }
      wg_fence();
#pragma unroll
      for (int kb = 4; kb < 8; ++kb) {  // X kb 4..7 (panel 1) from s1, into the same accumulators
        const uint64_t dkq = wg_desc(sin + kOK + kPan + uint32_t(kb & 3) * 32u, 16, 1024);
        wg_rs128(x, o, ah[kb], dkq);
        if constexpr (kLo) wg_rs<0>(x, al[kb], dkq);
      }
      wg_commit();
#pragma unroll
      for (int kb = 0; kb < 4; ++kb) ldsm4t(a_a_km(sin + kOVw, 16 * kb, 16 * sw, 128, lane), vr[kb]);
      if constexpr (kDeferO) {
        if (c > 0) store_staged(t0 - kC, kC, store_out);  // chunk c - 1's rows under the X group
        __syncwarp();
      }
    } else if constexpr (kChain) {
#pragma unroll
      for (int kb = 0; kb < 8; ++kb) {  // B rows 0..63 = K, 64..127 = Q of panel kb / 4
        const uint64_t dkq = wg_desc(sin + kOK + uint32_t(kb >> 2) * kPan + uint32_t(kb & 3) * 32u, 16, 1024);
        wg_rs128(x, o, ah[kb], dkq);
        if constexpr (kLo) wg_rs<0>(x, al[kb], dkq);
      }
      wg_commit();
      if constexpr (kPP) bar_arrive(kPpTurn + 1 - wgi, 256);  // the other warpgroup's turn
#pragma unroll
      for (int kb = 0; kb < 4; ++kb) ldsm4t(a_a_km(sin + kOVw, 16 * kb, 16 * sw, 128, lane), vr[kb]);
      if constexpr (kDeferO) {  // chunk c - 1's rows (full: n = 64) under the X group; then the staging is free
        if (c > 0) store_staged(t0 - kC, kC, store_out);
        __syncwarp();
      }
    } else {
#pragma unroll
      for (int kb = 0; kb < 8; ++kb) {
        const uint32_t ok = uint32_t(kb >> 2) * 8192u + uint32_t(kb & 3) * 32u;
        const uint64_t dk = wg_desc(sin + kOK + ok, 16, 1024), dq = wg_desc(sin + kOQ + ok, 16, 1024);
        wg_rs<0>(x, ah[kb], dk);
        wg_rs<0>(o, ah[kb], dq);
        wg_rs<0>(x, al[kb], dk);
      }
      wg_commit();
    }
    wg_wait<0>();
    fence_acc(x);
    fence_acc(o);
#pragma unroll
    for (int kb = 0; kb < 8; ++kb) {
      fence_frag(ah[kb]);
      fence_frag(al[kb]);
    }
    DK_MARK(1)
    // E^T = V^T - X^T diag(xsc) (in x).
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) {
      if constexpr (!kChain) ldsm4t(a_a_km(sin + kOVw, 16 * kb, 16 * sw, 128, lane), vr[kb]);
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int nt = 2 * kb + hh;
        const float2 xs = *reinterpret_cast<const float2*>(vec + kXsc * 64 + 8 * nt + 2 * q);
        const float2 v0 = unpack_bf(vr[kb][2 * hh]), v1 = unpack_bf(vr[kb][2 * hh + 1]);
        x[nt][0] = v0.x - x[nt][0] * xs.x;
        x[nt][1] = v0.y - x[nt][1] * xs.y;
        x[nt][2] = v1.x - x[nt][2] * xs.x;
        x[nt][3] = v1.y - x[nt][3] * xs.y;
      }
    }
    DK_MARK(2)
    // v^T = E^T Tb^T (E hi / lo x Tb hi / lo: three products; B = Tb rows t, K-major over s).
    float vn[8][4];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) vn[i][j] = 0.f;
    uint32_t eh[4][4], el[4][4];
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) {
      split2(x[2 * kb][0], x[2 * kb][1], eh[kb][0], el[kb][0]);
      split2(x[2 * kb][2], x[2 * kb][3], eh[kb][1], el[kb][1]);
      split2(x[2 * kb + 1][0], x[2 * kb + 1][1], eh[kb][2], el[kb][2]);
      split2(x[2 * kb + 1][2], x[2 * kb + 1][3], eh[kb][3], el[kb][3]);
      fence_frag(eh[kb]);
      fence_frag(el[kb]);
    }
    fence_acc(vn);
    if constexpr (kPP) bar_sync(kPpTurn + wgi, 256);
    wg_fence();
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) {
      const uint64_t dth = wg_desc(sstg + kOTh + 32u * kb, 16, 1024), dtl = wg_desc(sstg + kOTl + 32u * kb, 16, 1024);
      wg_rs<0>(vn, eh[kb], dth);
      if constexpr (kLo) {
        wg_rs<0>(vn, eh[kb], dtl);
        wg_rs<0>(vn, el[kb], dth);
      }
    }
    wg_commit();
    if constexpr (kPP) bar_arrive(kPpTurn + 1 - wgi, 256);
    const float gl = vec[kMisc * 64];
    // kS2G: the S update accumulates s1's half into u1 (= e^{g_last} s1), copied back to s1 by a CUDA-core add after
    // the S wait: ptxas tracks "defined by GMMA" per PTX register, and s1 is read under the next chunk's first X group
    // (C7517 / C7518: a wait injected there, every wgmma serialized, when the S update wrote s1 itself).
    float u1[8][4];
    float(&s1w)[8][4] = kS2G ? u1 : s1;
    if constexpr (kChain) {  // under the v group: O^T diag(qsc), e^{g_last} S^T (neither is an operand of it)
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        const float2 qs = *reinterpret_cast<const float2*>(vec + kQsc * 64 + 8 * nt + 2 * q);
        o[nt][0] *= qs.x;
        o[nt][1] *= qs.y;
        o[nt][2] *= qs.x;
        o[nt][3] *= qs.y;
      }
#pragma unroll
      for (int nt = 0; nt < 16; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          if (kS2G && nt >= 8)
            u1[nt & 7][i] = s1[nt & 7][i] * gl;
          else
            DK_S(nt, i) *= gl;
        }
      fence_acc(o);  // pinned here, before the wait (else the compiler sinks the scaling below it)
      fence_acc(s0);
      fence_acc(s1w);
    }
    wg_wait<0>();
    fence_acc(vn);
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) {
      fence_frag(eh[kb]);
      fence_frag(el[kb]);
    }
    DK_MARK(3)
    // O^T = O^T diag(qsc) + v_hi^T P^T (B = P rows t, K-major over s), issued; then the S update behind it.
    if constexpr (!kChain) {
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        const float2 qs = *reinterpret_cast<const float2*>(vec + kQsc * 64 + 8 * nt + 2 * q);
        o[nt][0] *= qs.x;
        o[nt][1] *= qs.y;
        o[nt][2] *= qs.x;
        o[nt][3] *= qs.y;
      }
    }
    uint32_t va[4][4], wh[4][4], wl[4][4];
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) {
      va[kb][0] = pack_bf(vn[2 * kb][0], vn[2 * kb][1]);
      va[kb][1] = pack_bf(vn[2 * kb][2], vn[2 * kb][3]);
      va[kb][2] = pack_bf(vn[2 * kb + 1][0], vn[2 * kb + 1][1]);
      va[kb][3] = pack_bf(vn[2 * kb + 1][2], vn[2 * kb + 1][3]);
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int nt = 2 * kb + hh;
        const float2 kd = *reinterpret_cast<const float2*>(vec + kKdec * 64 + 8 * nt + 2 * q);
        split2(vn[nt][0] * kd.x, vn[nt][1] * kd.y, wh[kb][2 * hh], wl[kb][2 * hh]);
        split2(vn[nt][2] * kd.x, vn[nt][3] * kd.y, wh[kb][2 * hh + 1], wl[kb][2 * hh + 1]);
      }
    }
    if constexpr (!kChain) {
#pragma unroll
      for (int nt = 0; nt < 16; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) DK_S(nt, i) *= gl;
    }
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) {
      fence_frag(va[kb]);
      fence_frag(wh[kb]);
      fence_frag(wl[kb]);
    }
    fence_acc(o);
    fence_acc(s0);
    fence_acc(s1w);
    if constexpr (kPP) bar_sync(kPpTurn + wgi, 256);
    wg_fence();
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) wg_rs<0>(o, va[kb], wg_desc(sstg + kOP + 32u * kb, 16, 1024));
    wg_commit();
    // S^T += (v^T diag(kdec)) K (hi + lo): B = the K panels MN-major (rows t = the k16 step, 2 KB each).
    {
#pragma unroll
      for (int kb = 0; kb < 4; ++kb) {
        const uint64_t d0 = wg_desc(sin + kOK + 2048u * kb, 8192, 1024);
        const uint64_t d1 = wg_desc(sin + kOK + kPan + 2048u * kb, 8192, 1024);
        wg_rs<1>(s0, wh[kb], d0);
        wg_rs<1>(s1w, wh[kb], d1);
        if constexpr (kLo) {
          wg_rs<1>(s0, wl[kb], d0);
          wg_rs<1>(s1w, wl[kb], d1);
        }
      }
      wg_commit();
      if constexpr (kPP) bar_arrive(kPpTurn + 1 - wgi, 256);
      wg_wait<1>();  // the O group (committed first) is done; the S update may still run
    }
    fence_acc(o);
#pragma unroll
    for (int kb = 0; kb < 4; ++kb) fence_frag(va[kb]);
    DK_MARK(4)
    // Output: stage [64 t][16 v] bf16 per warp, then 16-byte rows to global.
    if constexpr (kStsmO) {
      // matrices (nt, h): fragment rows v = 8 h + g, columns t = 8 nt + 2 q, +1 -> stored transposed at row t, 8 v's
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t r[4];
        r[0] = pack_bf(o[2 * np][0], o[2 * np][1]);
        r[1] = pack_bf(o[2 * np][2], o[2 * np][3]);
        r[2] = pack_bf(o[2 * np + 1][0], o[2 * np + 1][1]);
        r[3] = pack_bf(o[2 * np + 1][2], o[2 * np + 1][3]);
        const int mi = lane >> 3;
        stsm4t(smem_u32(so) + uint32_t((16 * np + 8 * (mi >> 1) + (lane & 7)) * 32 + (mi & 1) * 16), r);
      }
      __syncwarp();
      if constexpr (!kDeferO) store_staged(t0, n, store_out);
    } else {
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        const int t = 8 * nt + 2 * q;
        __nv_bfloat16* r0 = reinterpret_cast<__nv_bfloat16*>(so + t * 32);
        __nv_bfloat16* r1 = reinterpret_cast<__nv_bfloat16*>(so + (t + 1) * 32);
        r0[g] = __float2bfloat16_rn(o[nt][0]);
        r1[g] = __float2bfloat16_rn(o[nt][1]);
        r0[g + 8] = __float2bfloat16_rn(o[nt][2]);
        r1[g + 8] = __float2bfloat16_rn(o[nt][3]);
      }
      __syncwarp();
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int idx = lane + 32 * i, row = idx >> 1, half = idx & 1;
        if (row < n && store_out)
          *reinterpret_cast<uint4*>(out + ((t0 + row) * HV + hv) * V + col0 + 16 * sw + 8 * half) =
              *reinterpret_cast<const uint4*>(so + row * 32 + half * 16);
      }
    }
    __syncwarp();
    DK_MARK(5)
    {
      wg_wait<0>();
      fence_acc(s0);
      fence_acc(s1w);
      if constexpr (kS2G) {  // s1 = u1 + 0 (-0 -> +0 only): s1 defined by a CUDA-core instruction (see u1)
#pragma unroll
        for (int i = 0; i < 8; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) asm volatile("add.f32 %0, %1, 0f00000000;" : "=f"(s1[i][j]) : "f"(u1[i][j]));
      }
#pragma unroll
      for (int kb = 0; kb < 4; ++kb) {
        fence_frag(wh[kb]);
        fence_frag(wl[kb]);
      }
      release(c);
    }
    DK_MARK(6)
  }
  if constexpr (kProf) {  // no printf here: a call would serialize every wgmma (ptxas C7510); split_wg_prof_print
    if (blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && tid == 0 && nc >= 64 &&
        atomicAdd(&g_split_prof_printed, 1) == 0) {
#pragma unroll
      for (int i = 0; i < 7; ++i) g_split_wg_prof[i] = ph[i] / nc;
      g_split_wg_prof[7] = (clock64() - tstart) / nc;
      g_split_wg_prof[8] = nc;
    }
  }
#undef DK_MARK
  if constexpr (kPP) {  // warpgroup 1's arrival after its last group
    if (wgi == 0) bar_sync(kPpTurn, 256);
  }
  if constexpr (kDeferO) {  // the last chunk's staged rows (its stmatrix and __syncwarp ran in the loop)
    if (nc > 0) {
      const int64_t tl = bos + (nc - 1) * kC;
      store_staged(tl, int(eos - tl), store_out);
    }
  }
  if constexpr (kOvl) {
    if (aborted) {  // state untouched, the fix-up launch reruns this CTA
      if (tid == 0) {
        const int64_t cta = (int64_t(blockIdx.x) * gridDim.y + blockIdx.y) * gridDim.z + blockIdx.z;
        reinterpret_cast<int*>(args.w.flags)[args.w.nt * args.p.h_v + cta] = 1;
      }
      return;
    }
  }
  if constexpr (kCp) {  // the record's final state block (nullptr: not stored)
    float* o = args.cps[seq].out;
    if (o == nullptr) return;
    sp = o + hv * (int64_t(kK) * V) + col0;
  }
#pragma unroll
  for (int nt = 0; nt < 16; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int k = 8 * nt + 2 * q + (i & 1), v = 16 * sw + g + 8 * (i >> 1);
      sp[int64_t(k) * V + v] = DK_S(nt, i);
    }
#undef DK_S
#elif defined(__CUDA_ARCH__)
  __trap();
#endif  // DK_GDR_FUSED_SM90A
}

// Context parallelism (variant bit 4096, launch_cp): each sequence's chunks split into three segments at chunk
// boundaries c1 <= c2 (weights w0 : 1 : 1 of its chunk count). Pass 1 (state kernel on rec[0, 3N)): segment 0 from
// the sequence's initial state (its final outputs, end state S1 -> block A), and for segment 1 its transition M (start
// I, v = 0, no outputs -> block M) and its zero-start end state D (no outputs -> block D); the scan S2 = M S1 + D
// (f32, block B); pass 3 (state kernel on rec[3N, 5N)): segments 1 and 2 from S1 / S2, the last one ending in the
// sequence's slot. State blocks: scratch f32 [N][4: A, M, D, B][H_v][K][V]. Needs K = V.
__global__ void cp_plan_kernel(const SplitArgs a, CpSeg* rec, float* scratch, int w0) {
#ifdef DK_GDR_FUSED_SM90A
  const DkGdrPrefillFusedParams& p = a.p;
  const int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, N = p.num_seqs, T = p.num_tokens;
  if (n >= N) return;
  const int* cu = reinterpret_cast<const int*>(p.cu_seqlens);
  int64_t bos = cu[n], eos = cu[n + 1];
  bos = bos < 0 ? 0 : (bos > T ? T : bos);
  eos = eos < bos ? bos : (eos > T ? T : eos);
  const int64_t slot = reinterpret_cast<const int*>(p.slots)[n];
  const bool live = slot >= 0 && slot < p.num_slots;
  bool read = p.init_mode == 1;
  if (p.init_mode == 2) read = reinterpret_cast<const int*>(p.init)[n] != 0;
  const int64_t nc = (eos - bos + 63) / 64, wsum = int64_t(w0) + 2;
  const int64_t c1 = nc * w0 / wsum, c2 = nc * (w0 + 1) / wsum;
  const int64_t b1 = bos + 64 * c1 < eos ? bos + 64 * c1 : eos, b2 = bos + 64 * c2 < eos ? bos + 64 * c2 : eos;
  const int64_t ch0 = reinterpret_cast<const int*>(a.w.coff)[n];
  const int64_t per = p.h_v * p.k_dim * p.v_dim;
  float* blk = scratch + n * 4 * per;
  float* real = reinterpret_cast<float*>(p.state) + (live ? slot : 0) * per;
  CpSeg* r1 = rec;
  CpSeg* r2 = rec + 3 * N;
  if (live) {
    r1[n] = CpSeg{bos, b1, ch0, read ? real : nullptr, blk, kCpLive, 0};
    r1[N + n] = CpSeg{b1, b2, ch0 + c1, nullptr, blk + per, kCpLive | kCpIdent | kCpVZero | kCpNoOut, 0};
    r1[2 * N + n] = CpSeg{b1, b2, ch0 + c1, nullptr, blk + 2 * per, kCpLive | kCpNoOut, 0};
    r2[n] = CpSeg{b1, b2, ch0 + c1, blk, nullptr, kCpLive, 0};
    r2[N + n] = CpSeg{b2, eos, ch0 + c2, blk + 3 * per, real, kCpLive, 0};
  } else {  // padding: pass 1 zeroes the whole row range, the other records are empty
    r1[n] = CpSeg{bos, eos, ch0, nullptr, nullptr, 0, 0};
    r1[N + n] = r1[2 * N + n] = r2[n] = r2[N + n] = CpSeg{bos, bos, ch0, nullptr, nullptr, kCpNoOut, 0};
  }
#endif
}

// S2 = M S1 + D for one (sequence, value head, 64 value columns, 32 rows): f32 FMA (K = V = 128; 0.5 MFLOP per CTA,
// grid (N, H_v, V / 64 x 4)). M's 32 rows and S1's 64 columns staged in shared memory (48 KB), 8 independent
// accumulators per thread. (Session 7's first form, one CTA per 64 columns with one serial FMA chain of 4096 and M
// read through L1 per FMA, is what the H200 run measured; this one is not yet run on a GPU.)
__global__ void __launch_bounds__(256) cp_scan_kernel(const SplitArgs a, const CpSeg* rec) {
#ifdef DK_GDR_FUSED_SM90A
  constexpr int kRows = 32;
  __shared__ float sa[kK][kBV];    // S1 [K, 64 columns]
  __shared__ float sm[kRows][kK];  // M rows r0 .. r0 + 31
  const DkGdrPrefillFusedParams& p = a.p;
  const int64_t n = blockIdx.x, N = p.num_seqs, V = p.v_dim;
  if ((rec[n].flags & kCpLive) == 0) return;
  const int cb = int(blockIdx.z) >> 2, r0 = (int(blockIdx.z) & 3) * kRows;
  const int64_t head = blockIdx.y * (int64_t(kK) * V), hoff = head + int64_t(cb) * kBV;
  const float* A = rec[n].out + hoff;
  const float* M = rec[N + n].out + head + int64_t(r0) * V;
  const float* D = rec[2 * N + n].out + hoff + int64_t(r0) * V;
  float* B = const_cast<float*>(rec[3 * N + N + n].in) + hoff + int64_t(r0) * V;
  const int tid = threadIdx.x, j = tid & 63, rr = tid >> 6;
#pragma unroll 8
  for (int i = tid; i < kK * kBV; i += 256) sa[i >> 6][i & 63] = __ldg(A + int64_t(i >> 6) * V + (i & 63));
#pragma unroll 8
  for (int i = tid; i < kRows * kK; i += 256) sm[i >> 7][i & 127] = __ldg(M + int64_t(i >> 7) * V + (i & 127));
  __syncthreads();
  float acc[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i] = __ldg(D + int64_t(rr + 4 * i) * V + j);
#pragma unroll 4
  for (int c = 0; c < kK; ++c) {
    const float x = sa[c][j];
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] = fmaf(sm[rr + 4 * i][c], x, acc[i]);
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) B[int64_t(rr + 4 * i) * V + j] = acc[i];
#endif
}

}  // namespace gdr_fused
}  // namespace dk

namespace {
// Whether the library's device image on `dev` has the sm_90a kernel bodies (dk::sm90a_image, csrc/common/status.cu:
// one never-launched probe kernel; every .cu is built for the same archs). Cached per device there.
dk_status sm90a_image(int dev) { return dk::sm90a_image(dev) ? DK_OK : DK_ERR_NO_KERNEL_IMAGE; }

template <int VAR>
dk_status launch_split(const dk::gdr_fused::SplitLaunch& a, cudaStream_t s);

// DELTAKIT_GDR_ROUTE_LOG=1 (a test diagnostic, read once per process; session 9): one stderr line per wgmma state-kernel
// launch of launch_split / launch_cp naming the route, the kernel's template variant and its grid, so that a test or
// sanitizer run can show which state kernels a variant really took (a forced variant can fall back silently).
bool route_log_on() {
  static const bool on = dk::env_flag("DELTAKIT_GDR_ROUTE_LOG");
  return on;
}
void route_log(const char* route, int sv, dim3 g) {
  if (route_log_on())
    fprintf(stderr, "dk gdr route: %s split_wg_kernel<%d> grid (%u, %u, %u)\n", route, sv, g.x, g.y, g.z);
}

// Overlap of the local pass with the state kernel (variant bit 512, session 6; compiled, NOT yet run on a GPU).
// Launch order on `s`: (1) cudaMemsetAsync of the flags (nt x H_v ready flags, then one abort flag per state CTA);
// (2) the state kernel (grid (N, H_v, V / 64) = C CTAs, 1 per SM), whose CTAs execute griddepcontrol.launch_dependents
// first thing; (3) the local pass as its programmatic dependent (cudaLaunchAttributeProgrammaticStreamSerialization),
// a persistent 1-D grid of 3 x (SMs - C) CTAs walking (chunk id, key head) chunk-major, each CTA ending in
// griddepcontrol.wait; (4) the state kernel again with fix = 1: only CTAs whose flag says "aborted" run (others exit).
// Used only when C <= SMs - 16 and a cost model (session-6 H200 numbers of variant 209: the local pass ~4.0 SM-us
// per (chunk id, value head), the state chain ~2.3 us per chunk) says max(local pass on the SMs - C free SMs, state
// chain of the average sequence) + 5 us < local pass on all SMs + state chain; else the plain variant VAR - 512.
// Variant bit 2048 skips the cost model (not the C <= SMs - 16 rule): a measurement of the model.
// Memory ordering (image (pc, hv) written by local CTA L, read by state CTA S's loaders with cp.async.cg):
//   L: every thread's st.global of the image -> __syncthreads() -> thread 0 st.release.gpu flag = 1. The barrier
//      (CTA-scope synchronization) puts every thread's image stores before thread 0's release in causality order,
//      and a release is cumulative: it orders all writes in causality order before it (the pattern of CUTLASS's
//      generic barrier: __syncthreads, then one red.release.gpu); SASS: MEMBAR.ALL.GPU + STG.E.STRONG.GPU.
//   S: loader thread 0 ld.acquire.gpu flag == 1 -> synchronizes-with L's release: L's image stores happen-before
//      everything thread 0 does after; bar.sync(kOvlLd, 128) -> every loader thread then does its own ld.acquire.gpu
//      of the flag, which must return 1 (the flag only goes 0 -> 1 within a call; a read after thread 0's read in
//      causality order cannot see an older value: coherence), so each thread's own acquire orders its later
//      cp.async.cg reads of the image after L's stores (cp.async.cg reads at L2, no stale L1 line). The flags are
//      zeroed by (1), stream-ordered before (2) and hence before (3) ((3) starts after (2) started).
// No hang: (2) has C <= SMs - 16 CTAs at 1 CTA / SM (215 KB shared memory), all resident at once; (3) starts only
//   after every CTA of (2) executed launch_dependents, i.e. is resident. The state CTAs' shared memory leaves no room
//   for a local CTA on their SMs, so (3) runs on the other SMs; its CTAs depend on nothing but the inputs until their
//   final griddepcontrol.wait, which waits for (2) only. (2)'s loaders spin at most kOvlSpinNs (200 ms, %globaltimer)
//   per image; on timeout the CTA stops without writing the state (the final store is after the chunk loop; output
//   rows already written are recomputed identically) and sets its abort flag; (4), stream-ordered after (3) (whose
//   completion implies (2)'s through griddepcontrol.wait), reruns exactly those CTAs without waiting on any flag.
//   So every path terminates: if PDL is not honoured (compute-sanitizer serializing, an old driver: (3) starts only
//   after (2) completed), every state CTA times out once (200 ms) and (4) computes the call (correct, slow); if other
//   work holds SMs, (3) still progresses when it leaves; malformed cu_seqlens (clamped chunk ids whose flag never
//   comes) time out into the same path.
template <int VAR>
dk_status launch_overlap(const dk::gdr_fused::SplitLaunch& a, cudaStream_t s) {
  using namespace dk::gdr_fused;
  const DkGdrPrefillFusedParams& p = a.p;
  constexpr int LV = VAR & (67 | 512), SV = VAR & (434 | 512 | 8192);
  static_assert((VAR & (64 | 16)) == (64 | 16) && (VAR & (2 | 4 | 8 | 32)) == 0, "overlap: wgmma + per-key-head");
  constexpr bool kPair = (VAR & 8192) != 0;  // the pair state CTA (128 value columns): V % 128 == 0 only
  if constexpr (kPair) {
    if (p.v_dim % (2 * kBV) != 0) return launch_overlap<(VAR & ~8192)>(a, s);
  }
  constexpr int kCols = kPair ? 2 * kBV : kBV;
  constexpr uint32_t smem = kPair ? kWg2Smem : kWgSmem;
  constexpr int nthr = kPair ? 384 : kThreads;
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) !=
      cudaSuccess)
    return dk::launch_status();
  const int64_t nstate = p.num_seqs * p.h_v * (p.v_dim / kCols);
  if (nstate > int64_t(sms) - 16) return launch_split<(VAR & ~512)>(a, s);
  if ((p.variant & 2048) == 0) {  // cost model, in ns (SM-ns for the local pass)
    const double local_work = 4000.0 * double(a.w.nt) * double(p.h_v);
    const double state = 2300.0 * double((p.num_tokens / (p.num_seqs > 0 ? p.num_seqs : 1) + 63) / 64);  // chunks
    const double serial = local_work / sms + state;
    const double free_sms = double(sms - nstate);
    const double overlap = (local_work / free_sms > state ? local_work / free_sms : state) + 5000.0;
    if (!(overlap < serial)) return launch_split<(VAR & ~512)>(a, s);
  }
  const size_t flag_bytes = size_t(a.w.nt * p.h_v + nstate) * sizeof(int);
  if (cudaMemsetAsync(reinterpret_cast<void*>(a.w.flags), 0, flag_bytes, s) != cudaSuccess) return dk::launch_status();
  if (cudaFuncSetAttribute(split_wg_kernel<SV>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)) !=
          cudaSuccess ||
      cudaFuncSetAttribute(split_local_kernel<LV>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kLpSmem)) !=
          cudaSuccess)
    return dk::launch_status();
  const dim3 grid(static_cast<unsigned>(p.num_seqs), static_cast<unsigned>(p.h_v), static_cast<unsigned>(p.v_dim / kCols));
  SplitArgs run = a;  // run.fix: 0, or 2 (variant bit 1024: force the fix-up path)
  split_wg_kernel<SV><<<grid, nthr, smem, s>>>(run);
  if (const dk_status st = dk::launch_status(); st != DK_OK) return st;
  const int64_t items = a.w.nt * p.h_k;
  const int64_t lgrid = items < 3 * (int64_t(sms) - nstate) ? items : 3 * (int64_t(sms) - nstate);
  if (dk::launch_pdl(split_local_kernel<LV>, dim3(static_cast<unsigned>(lgrid)), dim3(128), kLpSmem, s, run) !=
      cudaSuccess)
    return dk::launch_status();
  SplitArgs fix = a;
  fix.fix = 1;
  split_wg_kernel<SV><<<grid, nthr, smem, s>>>(fix);
  return dk::launch_status();
}

// Context parallelism (variant bit 4096; session 7): the local pass as in VAR & 1023, then (launch order on s) the
// plan kernel (segment records + state blocks in ws->cp), pass 1 = the state kernel over 3N records (segment 0 from
// the initial state; segment 1's transition M and zero-start end state D), the scan S2 = M S1 + D, pass 3 = the state
// kernel over 2N records (segments 1 and 2 from S1 / S2). Segment weights w0 : 1 : 1 with w0 = ceil(2C / (SMs - C))
// rounds of pass 1's M / D CTAs next to segment 0's C = N H_v V / 64 (1 CTA / SM): the chain (w0 + 2) L -> (w0 + 1) L
// per sequence (state-kernel grid (V / 64, H_v, records): seg-0 records first, so that the CTAs past the first wave
// are D runs, which end by the time segment 0 does). Used where K = V = 128, the workspace's cp region holds the records and 4 N H_v K V f32 states,
// 2C <= SMs (pass 3 in one wave) and the average sequence has >= 16 chunks; else VAR & 1023 (without the model: bit
// 2048, still only K = V = 128 with the region). VAR with 512 (4817 = 721 + 4096): where CP is not used, the overlap
// (launch_overlap, its own model) instead of 209.
template <int VAR>
dk_status launch_cp(const dk::gdr_fused::SplitLaunch& a, cudaStream_t s) {
  using namespace dk::gdr_fused;
  // BASE: 209, or 721 (the overlap); L4: the local pass at 4 CTAs / SM (bit 16384, on 209 only)
  // MB: the mbarrier stage release (bit 65536, on 28881 only: 94417) in every state kernel this launch takes
  // SO: the stmatrix output store (bit 2097152, session 10 opt-in) in every state kernel this launch takes
  // + the deferred output store (bit 16777216) / two X groups (33554432) (session 11 opt-in), likewise; PD (bits
  // 67108864, session 11, 134217728 and 268435456, session 12): read by launch_split only (the pair route's own
  // forms); the bulk image (bit 536870912, session 12) and the tensor-map K / Q / V loads (bit 1073741824, session
  // 13) in every state kernel, as SO
  constexpr int BASE = VAR & 1023, L4 = VAR & 16384, MB = VAR & 65536, LV = VAR & (67 | 16384),
                SO = VAR & (2097152 | 16777216 | 33554432 | 536870912 | 1073741824),
                PD = VAR & (67108864 | 134217728 | 268435456),
                SV = (VAR & 434) | 4096 | MB | SO;
  static_assert((VAR & (64 | 16)) == (64 | 16) && (VAR & (2 | 4 | 8 | 32)) == 0, "cp: wgmma + per-key-head");
  const DkGdrPrefillFusedParams& p = a.p;
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) !=
      cudaSuccess)
    return dk::launch_status();
  const int64_t N = p.num_seqs, C = N * p.h_v * (p.v_dim / kBV), per = p.h_v * p.k_dim * p.v_dim;
  const int64_t rec_bytes = (5 * N * int64_t(sizeof(CpSeg)) + 255) / 256 * 256;
  const uint64_t cp = (a.w.cp + 255) / 256 * 256;
  bool ok = p.v_dim == kK && a.w.cp != 0 && 3 * N <= 65535 &&
            a.w.cp_bytes >= int64_t(cp - a.w.cp) + rec_bytes + 4 * N * per * int64_t(sizeof(float));
  int w0 = 1;
  if (C < sms) w0 = int((2 * C + (sms - C) - 1) / (sms - C));
  if ((p.variant & 2048) == 0) {
    // Gain model: the chain shortens by one unit segment b = chunks / (w0 + 2) at ~2.3 us per chunk, against a
    // fixed cost of the three passes (plan, pass-1 stragglers, scan, two more launches) of ~30-70 us on the H200
    // once the scan ran on 4x the CTAs (session 7 round 2: 27B TP2 1 x 8192, b = 32: 0.388 -> 0.345 ms; 9B 1 x 65536,
    // b = 256: 3.223 -> 2.701 ms; with the first scan ~170-230 us: 0.485 / 2.842). So: b > ~26 chunks.
    const double b = double((p.num_tokens / (N > 0 ? N : 1) + 63) / 64) / double(w0 + 2);
    ok = ok && 2 * C <= sms && w0 <= 4 && 2300.0 * b > 60000.0;
  }
  if (!ok) {
    if constexpr ((VAR & 8192) != 0) {  // 12497: the pair state CTA where its state waves are the cheaper ones
      // Wave model (session 7 round 2, H200): the single-warpgroup state CTA (1 / SM) ~2.3 us per chunk, the pair CTA
      // (1 / SM, 128 value columns) ~3.96 us per chunk (9B 8 x 8192, C = 512: 4 waves x 128 x 2.3 = 1.18 ms measured
      // 1.209; 2 pair waves measured 1.014 ms). The pair wherever its waves cost 3% less: 9B 8 x 8192 (2.097 ->
      // 1.933 ms); not at C <= SMs (27B TP1 1 x 8192: 0.475 -> 0.683).
      const int64_t w1 = (C + sms - 1) / sms, w2 = (C + 2 * sms - 1) / (2 * sms);
      if (p.v_dim % (2 * kBV) == 0 && 3960.0 * double(w2) < 0.97 * 2300.0 * double(w1))
        return launch_split<8192 | BASE | L4 | MB | SO | PD>(a, s);
    }
    return launch_split<BASE | L4 | MB | SO>(a, s);
  }
  if (w0 < 1) w0 = 1;
  if (cudaFuncSetAttribute(split_local_kernel<LV>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           int(lp_smem<LV>())) != cudaSuccess ||
      cudaFuncSetAttribute(split_wg_kernel<SV>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kWgSmem)) !=
          cudaSuccess)
    return dk::launch_status();
  if ((p.variant & 131072) != 0 && a.w.nt > 0) {  // the local pass on wgmma (159953, read at run time; session 9)
    if (const dk_status st = dk_gdr_split_local_wgmma_sm90(&p, &a.w, s); st != DK_OK) return st;
  } else if (a.w.nt > 0) {
    split_local_kernel<LV><<<dim3(static_cast<unsigned>(a.w.nt), static_cast<unsigned>(p.h_k)), 128, lp_smem<LV>(),
                             s>>>(a);
    if (const dk_status st = dk::launch_status(); st != DK_OK) return st;
  }
  CpSeg* rec = reinterpret_cast<CpSeg*>(cp);
  float* scratch = reinterpret_cast<float*>(cp + uint64_t(rec_bytes));
  cp_plan_kernel<<<static_cast<unsigned>((N + 127) / 128), 128, 0, s>>>(a, rec, scratch, w0);
  if (const dk_status st = dk::launch_status(); st != DK_OK) return st;
  const unsigned hv = static_cast<unsigned>(p.h_v), vb = static_cast<unsigned>(p.v_dim / kBV);
  SplitLaunch a1 = a;
  a1.cps = rec;
  route_log("cp pass 1", SV, dim3(vb, hv, static_cast<unsigned>(3 * N)));
  split_wg_kernel<SV><<<dim3(vb, hv, static_cast<unsigned>(3 * N)), kThreads, kWgSmem, s>>>(a1);
  if (const dk_status st = dk::launch_status(); st != DK_OK) return st;
  cp_scan_kernel<<<dim3(static_cast<unsigned>(N), hv, 4 * vb), 256, 0, s>>>(a, rec);
  if (const dk_status st = dk::launch_status(); st != DK_OK) return st;
  SplitLaunch a2 = a;
  a2.cps = rec + 3 * N;
  route_log("cp pass 3", SV, dim3(vb, hv, static_cast<unsigned>(2 * N)));
  split_wg_kernel<SV><<<dim3(vb, hv, static_cast<unsigned>(2 * N)), kThreads, kWgSmem, s>>>(a2);
  return dk::launch_status();
}

template <int VAR>
dk_status launch_split(const dk::gdr_fused::SplitLaunch& a, cudaStream_t s) {
  using namespace dk::gdr_fused;
  if constexpr ((VAR & 512) != 0) {
    return launch_overlap<VAR>(a, s);
  } else {
  const DkGdrPrefillFusedParams& p = a.p;
  // the bits each kernel reads (1, 2, 64, 16384 / 2, 16, 32, 128, 256, 8192)
  constexpr bool kPair = (VAR & 8192) != 0;  // two state warpgroups per CTA (128 value columns): V % 128 == 0 only
  // bit 67108864 (session 11, with 2097152): the pair state CTA takes the deferred output store (16777216) and not
  // the two X groups (33554432); the single CTA ignores it. Bit 134217728 (session 12): the pair state CTA's two
  // warpgroups ping-pong on the tensor pipe (split_wg_kernel kPP), 268435456 (session 12) its loaders copy nothing
  // (kNoLd, a measurement); the single CTA ignores both. Bit 536870912 (session 12): the bulk image (kImgBulk)
  // (and the tensor-map K / Q / V loads, kTma), bit 1073741824 (session 13), on every route
  constexpr int SV0 = VAR & (434 | 8192 | 32768 | 65536 | 2097152 | 16777216 | 33554432 | 536870912 | 1073741824);
  constexpr int LV = VAR & (67 | 16384),
                SV1 = kPair && (VAR & 67108864) != 0 ? ((SV0 & ~33554432) | 16777216) : SV0,
                SV = SV1 | (kPair ? VAR & (134217728 | 268435456) : 0);
  if constexpr (kPair) {
    if (p.v_dim % (2 * kBV) != 0) return launch_split<(VAR & ~(8192 | 67108864 | 134217728 | 268435456))>(a, s);
  }
  if ((VAR & 8) == 0 && (LV & 64) != 0 && (p.variant & 131072) != 0 && a.w.nt > 0) {  // wgmma local pass (159953)
    if (const dk_status st = dk_gdr_split_local_wgmma_sm90(&p, &a.w, s); st != DK_OK) return st;
  } else if ((VAR & 8) == 0 && a.w.nt > 0) {
    if (cudaFuncSetAttribute(split_local_kernel<LV>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             int(lp_smem<LV>())) != cudaSuccess)
      return dk::launch_status();
    const unsigned rows = static_cast<unsigned>((LV & 64) != 0 ? p.h_k : p.h_v);
    split_local_kernel<LV><<<dim3(static_cast<unsigned>(a.w.nt), rows), 128, lp_smem<LV>(), s>>>(a);
    if (const dk_status st = dk::launch_status(); st != DK_OK) return st;
  }
  if ((VAR & 4) != 0) return DK_OK;
  const dim3 grid(static_cast<unsigned>(p.num_seqs), static_cast<unsigned>(p.h_v),
                  static_cast<unsigned>(p.v_dim / (kPair ? 2 * kBV : kBV)));
  if constexpr ((SV & 16) != 0) {
    constexpr uint32_t smem = kPair ? kWg2Smem : kWgSmem;
    if (cudaFuncSetAttribute(split_wg_kernel<SV>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)) !=
        cudaSuccess)
      return dk::launch_status();
    route_log(kPair ? "pair" : "single", SV, grid);
    split_wg_kernel<SV><<<grid, kPair ? 384 : kThreads, smem, s>>>(a);
    if constexpr ((SV & 2) != 0) split_wg_prof_print<<<1, 1, 0, s>>>();
  } else {
    if (cudaFuncSetAttribute(split_state_kernel<SV>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSpSmem)) !=
        cudaSuccess)
      return dk::launch_status();
    split_state_kernel<SV><<<grid, kThreads, kSpSmem, s>>>(a);
  }
  return dk::launch_status();
  }
}
}  // namespace

namespace {
// cuTensorMapEncodeTiled from the driver through cudart's entry-point query (no libcuda link; the approach of
// csrc/attn/prefill_sm90.cu's encode_tiled). nullptr where the driver does not have it.
using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
EncodeTiledFn gdr_encode_tiled() {
  static std::atomic<EncodeTiledFn> fn{nullptr};
  EncodeTiledFn f = fn.load(std::memory_order_acquire);
  if (f == nullptr) {
    void* raw = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &raw, 12000, cudaEnableDefault, &q) ==
            cudaSuccess &&
        q == cudaDriverEntryPointSuccess && raw != nullptr) {
      f = reinterpret_cast<EncodeTiledFn>(raw);
      fn.store(f, std::memory_order_release);
    } else {
      (void)cudaGetLastError();
    }
  }
  return f;
}
// The split state kernel's tensor map of a bf16 [rows][cols] view with a row stride of `stride` elements (q / k:
// rows = T, cols = H_k K; v: cols = H_v V), box 64 columns x 64 rows, 128-byte swizzle (the K / Q panels' and the V
// tile's layout), L2 promotion 256 B. false (the caller then keeps the cp.async loads) where the encoder is missing or
// the view does not fit a map: rows >= 2^31 (the kernel's row coordinate is an int32 token index), cols not a multiple
// of 64 or >= 2^31, a stride below the row or not a multiple of 8 elements (16 bytes), a byte stride >= 2^40, a base
// not 16-aligned.
bool encode_rows_map(CUtensorMap* m, uint64_t base, int64_t cols, int64_t rows, int64_t stride) {
  const EncodeTiledFn f = gdr_encode_tiled();
  if (f == nullptr || base == 0 || base % 16 != 0 || rows <= 0 || rows > 0x7fffffffLL || cols < 64 || cols % 64 != 0 ||
      cols > 0x7fffffffLL || stride < cols || stride % 8 != 0 || stride > (int64_t(1) << 38))
    return false;
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(stride) * 2u};
  const cuuint32_t box[2] = {64, 64};
  const cuuint32_t elem[2] = {1, 1};
  return f(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, reinterpret_cast<void*>(base), dims, strides, box, elem,
           CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
           CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}
// The variants dk_gdr_chunk_prefill_split_sm90 dispatches (exactly its switch below), so that the check refuses every
// other one before the caller enqueues anything (session 8: 8192 / 12496 / 4112 / 9937 passed the old bit rules and
// were refused only by the dispatch, after the caller's chunk_offsets / chunk_map launches).
bool split_variant_known(int v) {
  // session 11 (gdr-local): bits 4194304 / 8388608 select forms of the wgmma local pass (read in
  // chunk_local_wgmma_sm90.cu), on 2060497, 4157649, 71266513 (gdr-state) or 205484241 (gdr-state, session 12) only
  // session 12 (gdr-state): bit 268435456 (the pair's loaders copy nothing: a measurement, WRONG results) or
  // 536870912 (the state kernels' image by one bulk copy), not both, on 71266513 or 205484241 (+ 12582912 or not)
  // session 13 (gdrtma): bit 1073741824 (the tensor-map K / Q / V loads) only with 536870912; with the ping-pong
  // 134217728 too since gdrpp (1828679889 = 1694462161 + 134217728, opt-in)
  if ((v & (268435456 | 536870912 | 1073741824)) != 0) {
    if ((v & 268435456) != 0 && (v & 536870912) != 0) return false;
    if ((v & 1073741824) != 0 && (v & 536870912) == 0) return false;
    const int b = v & ~(12582912 | 268435456 | 536870912 | 1073741824);
    return b == 71266513 || b == 205484241;
  }
  if ((v & 12582912) != 0) {
    const int b = v & ~12582912;
    return b == 2060497 || b == 4157649 || b == 71266513 || b == 205484241;
  }
  if (v == 159953 || v == 225489) return true;  // 28881 / 94417 with the local pass on wgmma (bit 131072; session 9)
  // 225489 + 262144: the wgmma local pass's session-10 form; + 524288 (no epilogue barrier) / + 1048576 (bulk copy-out)
  if (v == 487633 || v == 1011921 || v == 1536209 || v == 2060497) return true;  // session 10
  if (v == 4157649) return true;  // 2060497 + 2097152 (the stmatrix output store; session 10, opt-in)
  if (v == 20934865) return true;  // 4157649 + 16777216 (the output store's global half deferred; session 11, opt-in)
  if (v == 54489297) return true;  // 20934865 + 33554432 (and the X product as two commit groups; session 11, opt-in)
  // 4157649 + 67108864 (the pair route with the deferred store) and + 33554432 (the single / CP with two X groups)
  if (v == 71266513 || v == 104820945) return true;  // session 11, opt-in
  if (v == 205484241) return true;  // 71266513 + 134217728 (the pair CTA's warpgroups ping-pong; session 12, opt-in)
  switch (v) {
    case 0: case 2: case 4: case 5: case 8: case 16: case 17: case 18: case 24: case 48: case 50: case 56:
    case 80: case 81: case 82: case 83: case 84: case 85: case 144: case 146: case 152: case 208: case 209: case 210:
    case 408: case 465:
    case 721: case 1745: case 2769: case 3793:                       // the overlap (512): + 1024 fix-up, + 2048 no model
    case 4305: case 4817: case 6353:                                 // context parallelism (4096) on 209 / 721 / forced
    case 8344: case 8401: case 8913: case 10961: case 11985: case 12497:  // the pair state CTA (8192)
    case 16593: case 28881:                                          // the local pass at 4 CTAs / SM (16384)
    case 32977:                                                      // 209 with bar.sync releases (racecheck only)
    case 65745:                                                      // 209 with mbarrier releases (opt-in)
    case 94417:                                                      // 28881 with mbarrier releases (session 9)
      return true;
    default:
      return false;
  }
}
dk_status split_check(const DkGdrPrefillFusedParams* p) {
  using namespace dk::gdr_fused;
  if (p == nullptr) return DK_ERR_INVALID_ARGUMENT;
  if (p->k_dim != kK || p->v_dim <= 0 || p->v_dim % kBV != 0 || p->k_dim * p->v_dim * 2 < int64_t(kStRest))
    return DK_ERR_UNSUPPORTED;
  if (!split_variant_known(p->variant)) return DK_ERR_INVALID_ARGUMENT;
  if (p->num_seqs < 0 || p->h_k < 1 || p->h_v < 1 || p->h_v % p->h_k != 0 || p->num_slots < 0 || p->num_tokens < 0)
    return DK_ERR_INVALID_ARGUMENT;
  if (p->num_seqs > 0x7fffffffLL || p->h_v > 65535 || p->v_dim / kBV > 65535) return DK_ERR_INVALID_ARGUMENT;
  if (p->q % 16 || p->k % 16 || p->v % 16 || p->out % 16 || p->state % 16 || p->q_stride % 8 || p->k_stride % 8 ||
      p->v_stride % 8)
    return DK_ERR_INVALID_ARGUMENT;
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return DK_ERR_CUDA;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  if (major != 9 || minor != 0) return DK_ERR_UNSUPPORTED;
  return sm90a_image(dev);  // DK_ERR_NO_KERNEL_IMAGE without the sm_90a bodies
}
}  // namespace

extern "C" dk_status dk_gdr_chunk_prefill_split_sm90_check(const DkGdrPrefillFusedParams* p) { return split_check(p); }

extern "C" dk_status dk_gdr_chunk_prefill_split_sm90(const DkGdrPrefillFusedParams* p, const DkGdrPrefillSplitWs* ws,
                                                     dk_stream_t stream) {
  using namespace dk::gdr_fused;
  if (const dk_status st = split_check(p); st != DK_OK) return st;
  if (ws == nullptr || ws->coff == 0 || ws->cseq == 0 || ws->img == 0 || ws->img % 128 || ws->nt < 0 ||
      ws->nt > 0x7fffffffLL || (p->num_seqs > 0 && ws->nt < 1))
    return DK_ERR_INVALID_ARGUMENT;
  if (p->num_seqs == 0) return DK_OK;
  if ((p->variant & 512) != 0 && (ws->flags == 0 || ws->flags % 4)) return DK_ERR_INVALID_ARGUMENT;
  SplitLaunch a{};
  static_cast<SplitArgs&>(a) = SplitArgs{*p, *ws, (p->variant & 1024) != 0 ? 2 : 0, nullptr};
  auto* s = static_cast<cudaStream_t>(stream);
  // 159953 = 28881 + 131072 (session 9): 28881's routes with the local pass on wgmma (chunk_local_wgmma_sm90.cu;
  // launch_cp / launch_split read the bit from p.variant at run time: same template instances as 28881)
  if ((p->variant & (268435456 | 536870912)) != 0) {  // session 12 (checked above; the local-pass bits at run time)
    constexpr int kB = 94417 | 2097152 | 67108864;  // 71266513's routes
    // (every bit this branch adds masked: session 13's call 2 compared without 1073741824 and ran the wrong kernels)
    const bool pp = (p->variant & ~(12582912 | 268435456 | 536870912 | 1073741824)) == 205484241;
    if ((p->variant & 268435456) != 0)
      return pp ? launch_cp<kB | 134217728 | 268435456>(a, s) : launch_cp<kB | 268435456>(a, s);
    // session 13 (gdrtma): + 1073741824, the K / Q / V tiles of full chunks by tensor-map TMA (split_wg_kernel kTma):
    // the maps are encoded here, per call, from the views; where one cannot be encoded (no driver entry point, T >=
    // 2^31, an odd stride) the call runs the same variant without the bit (the cp.async loads: same values)
    // gdrpp (session 13): with the ping-pong (1828679889) the pair state CTA's kPP + kTma instance
    if ((p->variant & 1073741824) != 0) {
      if (encode_rows_map(&a.tm_q, p->q, p->h_k * p->k_dim, p->num_tokens, p->q_stride) &&
          encode_rows_map(&a.tm_k, p->k, p->h_k * p->k_dim, p->num_tokens, p->k_stride) &&
          encode_rows_map(&a.tm_v, p->v, p->h_v * p->v_dim, p->num_tokens, p->v_stride))
        return pp ? launch_cp<kB | 134217728 | 536870912 | 1073741824>(a, s)
                  : launch_cp<kB | 536870912 | 1073741824>(a, s);
    }
    return pp ? launch_cp<kB | 134217728 | 536870912>(a, s) : launch_cp<kB | 536870912>(a, s);
  }
  if ((p->variant & 12582912) != 0) {  // session 11: the local pass's bits 4194304 / 8388608 (checked above)
    if ((p->variant & ~12582912) == 2060497) return launch_cp<94417>(a, s);
    if ((p->variant & ~12582912) == 71266513) return launch_cp<94417 | 2097152 | 67108864>(a, s);
    if ((p->variant & ~12582912) == 205484241) return launch_cp<94417 | 2097152 | 67108864 | 134217728>(a, s);
    return launch_cp<94417 | 2097152>(a, s);  // on 4157649
  }
  if (p->variant == 159953) return launch_cp<28881>(a, s);
  if (p->variant == 225489) return launch_cp<94417>(a, s);  // = 94417 + 131072: the library default in session 9
  // 487633 = 225489 + 262144 (session 10): the same routes; dk_gdr_split_local_wgmma_sm90 reads bit 262144 at run time
  // (factored decays below the diagonal blocks, gating on warps 2-3 during phase 3, Tb stores by 32-row items)
  // (+ 524288: the epilogue -> diagonal inverse hand-off by a warp barrier; + 1048576: the image copied out by TMA bulk
  // copies; 1011921 / 1536209 / 2060497, read there too; 2060497 = all three: the library default since session 10)
  if (p->variant == 487633 || p->variant == 1011921 || p->variant == 1536209 || p->variant == 2060497)
    return launch_cp<94417>(a, s);
  // 4157649 = 2060497 + 2097152 (session 10, opt-in, gdr-state): the same routes with the state kernels' output tile
  // stored through stmatrix .trans (split_wg_kernel kStsmO)
  if (p->variant == 4157649) return launch_cp<94417 | 2097152>(a, s);
  // 20934865 = 4157649 + 16777216 (session 11, opt-in, gdr-state): the same routes with the staged output tile's
  // global stores deferred to the next chunk's X group (split_wg_kernel kDeferO)
  if (p->variant == 20934865) return launch_cp<94417 | 2097152 | 16777216>(a, s);
  // 54489297 = 20934865 + 33554432 (session 11, opt-in, gdr-state): and the S update as two commit groups, the next
  // chunk's X product split in two behind them (split_wg_kernel kS2G)
  if (p->variant == 54489297) return launch_cp<94417 | 2097152 | 16777216 | 33554432>(a, s);
  // 71266513 = 4157649 + 67108864 (session 11, opt-in, gdr-state): the deferred output store on the pair route only
  // (its tail ends in the store, the single CTA's in the S group); 104820945 = 71266513 + 33554432: and the single /
  // context-parallel state kernels with the two X groups (not the pair: bit 67108864 drops it there)
  if (p->variant == 71266513) return launch_cp<94417 | 2097152 | 67108864>(a, s);
  if (p->variant == 104820945) return launch_cp<94417 | 2097152 | 67108864 | 33554432>(a, s);
  // 205484241 = 71266513 + 134217728 (session 12, opt-in, gdr-state): and the pair state CTA's two warpgroups take
  // turns on the tensor pipe (split_wg_kernel kPP; single / context-parallel kernels unchanged); 218067153 = it +
  // 12582912 (the local-pass forms, above)
  if (p->variant == 205484241) return launch_cp<94417 | 2097152 | 67108864 | 134217728>(a, s);
  if (p->variant == 32977) return launch_split<32977>(a, s);  // racecheck diagnostic (kSyncEmpty), session 8
  if (p->variant == 65745) return launch_split<65745>(a, s);  // mbarrier stage release (kMbarEmpty), session 8
  if ((p->variant & 16384) != 0) {  // the local pass at 4 CTAs / SM (session 8): on 209 (16593), on 12497 (28881); 94417
    switch (p->variant) {
      case 16593: return launch_split<16593>(a, s);
      case 28881: return launch_cp<28881>(a, s);
      case 94417: return launch_cp<94417>(a, s);  // 28881 with the mbarrier stage release in every state kernel
      default: return DK_ERR_INVALID_ARGUMENT;
    }
  }
  if ((p->variant & 8192) != 0) {  // the pair state CTA (session 7 round 2, opt-in): on 209 (8401), on the overlap
    switch (p->variant) {          // 721 / 2769 / 3793 (8913 / 10961 / 11985), its state kernel alone (8344);
      case 12497: return launch_cp<12497>(a, s);  // 12497: CP where its model says so, else the pair, else 209
      case 8344: return launch_split<8344>(a, s);
      case 8401: return launch_split<8401>(a, s);
      case 8913: return launch_split<8913>(a, s);
      case 10961: return launch_split<10961>(a, s);
      case 11985: return launch_split<11985>(a, s);
      default: return DK_ERR_INVALID_ARGUMENT;
    }
  }
  if ((p->variant & 4096) != 0) {  // context parallelism: on 209 (4305), or on 721 (4817: else the overlap)
    if ((p->variant & 1023) == 209) return launch_cp<4096 | 209>(a, s);
    if ((p->variant & 1023) == 721) return launch_cp<4096 | 721>(a, s);
    return DK_ERR_INVALID_ARGUMENT;
  }
  switch (p->variant & 1023) {
    case 0: return launch_split<0>(a, s);
    case 2: return launch_split<2>(a, s);
    case 4: return launch_split<4>(a, s);
    case 5: return launch_split<5>(a, s);
    case 8: return launch_split<8>(a, s);
    case 16: return launch_split<16>(a, s);
    case 17: return launch_split<17>(a, s);
    case 18: return launch_split<18>(a, s);
    case 24: return launch_split<24>(a, s);
    case 48: return launch_split<48>(a, s);
    case 50: return launch_split<50>(a, s);
    case 56: return launch_split<56>(a, s);
    case 80: return launch_split<80>(a, s);
    case 81: return launch_split<81>(a, s);
    case 82: return launch_split<82>(a, s);
    case 83: return launch_split<83>(a, s);
    case 84: return launch_split<84>(a, s);
    case 85: return launch_split<85>(a, s);
    case 144: return launch_split<144>(a, s);
    case 146: return launch_split<146>(a, s);
    case 152: return launch_split<152>(a, s);
    case 208: return launch_split<208>(a, s);
    case 209: return launch_split<209>(a, s);
    case 210: return launch_split<210>(a, s);
    case 408: return launch_split<408>(a, s);
    case 465: return launch_split<465>(a, s);
    case 721: return launch_split<721>(a, s);
    default: return DK_ERR_INVALID_ARGUMENT;  // the instantiated variants are the cases above
  }
}
