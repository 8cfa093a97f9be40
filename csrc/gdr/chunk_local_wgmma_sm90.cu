// gdr.chunk_prefill split pipeline, sm_90a: the chunk-local pass on wgmma (variant bit 131072, session 9; session 10's
// form local_wgmma_kernel<7> (bits 262144 | 524288 | 1048576) in the default 2060497, <0> in 225489; see
// chunk_local_wgmma_sm90.h). Same job and output as split_local_kernel<64 | 1 | 16384> in
// chunk_prefill_fused_sm90.cu
// (one CTA per (chunk id, key head), 128 threads = one warpgroup, 4 CTAs / SM, the per-value-head stage image):
//   gating (fused or precomputed, clamped at -64), gc = chunk-local inclusive cumsum, rn = q / k L2-norm factors;
//   A  = beta_t rn_t rn_s e^{gc_t - gc_s} (k_t . k_s)  (s < t),  P = rn_q scale rn_k e^{gc_t - gc_s} (q_t . k_s) (s <= t)
//   Tm = (I + A)^-1,  Tb = Tm diag(beta) -> bf16 hi / lo,  P -> bf16.
// What differs from the mma.sync pass:
//   - K K^T and Q K^T: 16 SS-wgmma m64n64k16 per key head (K / Q tiles as two 64-column panels, 128-byte swizzle, the
//     accumulators in the mma.sync C layout per n8 tile: the A / P epilogue is the same code);
//   - (I + A)^-1: the 16 x 16 diagonal inverses (f32 forward substitution, A rows read as float4), then the 2 x 2 blocked
//     form over 32 x 32 blocks, T21 = -T22 A21 T11, scheduled over the 4 warps in 3 barrier phases (serial depth 5
//     bf16-triple 16 x 16 products instead of the level scheme's 9):
//       phase 1: T10 = -D1 (A10 D0) | T32 = -D3 (A32 D2) | X21 = A21 D1, T21 = -D2 X21, W20 = A20 D0 | X31 = A31 D1,
//                W30 = A30 D0
//       phase 2: T31 = -(T32 X21 + D3 X31) | X20 = W20 + A21 T10, T20 = -D2 X20 | X30 = W30 + A31 T10
//       phase 3: T30 = -(T32 X20 + D3 X30)
//     (D_i = T_ii; same products as the levels up to association, each a bf16 hi / lo triple, ~2^-16 relative);
//     kL bit 1 (session 10) schedules phases 1 / 2 at <= 2 products per warp (serial depth 5):
//       phase 1: T10 | T32 | X21, T21 | X31, W20
//       phase 2: X20 = W20 + A21 T10, T20 | T31 | X30 = A30 D0 + A31 T10
// H200 (2026-12-02, ncu, 27B TP1 1 x 8192): <0> 167.1 us, <1> 153.2, <7> 136.5 (47.6 M instructions vs 56.7 M).
// Session 11 (on kL 7 only): kL bit 8 (variant bit 4194304) the norms on the tensor cores, kL bit 16 (8388608) the
// diagonal inverses row-oriented; see the kernel's comments.
#include <cuda_bf16.h>
#include <stdint.h>

#include "../common/launch.cuh"
#include "chunk_local_wgmma_sm90.h"

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DK_GDR_LW_SM90A 1
#endif

namespace dk {
namespace gdr_lw {

constexpr int kK = 128;  // key head dim
enum Vec { kGpart = 0, kBeta, kGc, kRnk, kRnq, kXsc, kQsc, kKdec, kMisc, kNumVec };
constexpr uint32_t kRVec = 24576;                    // image: Tb hi [0, 8192), Tb lo, P [16384, 24576), vectors
constexpr uint32_t kStRest = kRVec + kNumVec * 256;  // 26,880 bytes per (chunk id, value head)
constexpr uint32_t kVec = 32768;                     // f32 vectors [9][64]
constexpr uint32_t kTm = kVec + kNumVec * 256;       // f32 Tm [64][72]
constexpr int kLd = 72;
constexpr int kLdX = 24;
constexpr uint32_t kX = 24576;                       // 4 x f32 [16][24] per-warp scratch over Q's second 64-column panel (dead after Q K^T)
constexpr uint32_t kSmem = kTm + 64 * kLd * 4;       // 53,504
constexpr uint32_t kSmemAlloc = kSmem + 1024;        // + the slack to align the base to 1024 (128-byte swizzle atoms)
// Variant bit 262144 (session 10): column decay vectors C_I [4][64] (rows I = 1..3) and the next value head's gating
// buffer [2][64] (g cumsum per warp, beta) in the 2 KB between the warps' scratch and the vectors (Q's second panel,
// dead after Q K^T).
constexpr uint32_t kCf = kX + 4 * 16 * kLdX * 4;     // 30,720
constexpr uint32_t kGb = kCf + 4 * 64 * 4;           // 31,744
static_assert(kGb + 2 * 64 * 4 <= kVec && kRVec <= kX, "local pass aliasing");
static_assert(4 * (kSmemAlloc + 1024) <= 233472, "4 CTAs / SM");

#pragma nv_diag_suppress 177
#ifdef DK_GDR_LW_SM90A
constexpr int kC = 64;
constexpr float kGFloor = 64.f;
constexpr uint32_t kOK = 0;  // K tile: panels [2][64 rows][128 B] (dims 0..63 | 64..127), 16-byte chunks ^ (row & 7)
constexpr uint32_t kOQ = 16384;
constexpr uint32_t kOTh = 0, kOTl = 8192, kOP = 16384;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, uint32_t bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// Four 8 x 8 bf16 matrices from shared memory (lane l gives the row address of matrix l / 8, row l % 8).
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
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
// exp(x) of a decay exponent x <= 0 (MUFU ex2), flushed to 0 at or below -(kGFloor - 1) and for NaN. Branch-free:
// ex2.approx.ftz of the clamped argument times log2(e) -- the value of __expf (ex2.approx of x log2(e)) wherever it is
// kept (e^-63 is far above the denormal range, so the ftz form and __expf's denormal fix-up agree bit for bit).
__device__ __forceinline__ float dexp(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(fmaxf(x, 1.f - kGFloor) * 1.4426950408889634f));
  return x > 1.f - kGFloor ? y : 0.f;
}

// f32 A [64][64] without padding, 8-float column groups XOR-swizzled by (row & 3) (as the mma.sync pass's bit 16384).
// Rows 0..31, columns 32..63 (A's upper blocks (0, 2), (0, 3), (1, 2), (1, 3)) are never read as A: the inverse keeps
// its 16 x 16 intermediates X21, X31, X20, X30 there (blocks s = 0..3 at rows 16 (s >> 1), columns 32 + 16 (s & 1)).
__device__ __forceinline__ int a4_idx(int row, int col) { return row * 64 + (col ^ ((row & 3) << 3)); }

// A-operand fragment (rows r0 + g, r0 + g + 8; columns c0 + 2q (+1), c0 + 2q + 8 (+1)) of a 16 x 16 f32 block.
struct Frag {
  float2 x0, x1, x2, x3;
};
__device__ __forceinline__ Frag frag_a4(const float* A4, int r0, int c0, int lane) {
  const int g = lane >> 2, q = lane & 3;
  Frag f;
  f.x0 = *reinterpret_cast<const float2*>(A4 + a4_idx(r0 + g, c0 + 2 * q));
  f.x1 = *reinterpret_cast<const float2*>(A4 + a4_idx(r0 + g + 8, c0 + 2 * q));
  f.x2 = *reinterpret_cast<const float2*>(A4 + a4_idx(r0 + g, c0 + 2 * q + 8));
  f.x3 = *reinterpret_cast<const float2*>(A4 + a4_idx(r0 + g + 8, c0 + 2 * q + 8));
  return f;
}
__device__ __forceinline__ Frag frag_ld(const float* A, int lda, int lane) {
  const int g = lane >> 2, q = lane & 3;
  Frag f;
  f.x0 = *reinterpret_cast<const float2*>(A + g * lda + 2 * q);
  f.x1 = *reinterpret_cast<const float2*>(A + (g + 8) * lda + 2 * q);
  f.x2 = *reinterpret_cast<const float2*>(A + g * lda + 2 * q + 8);
  f.x3 = *reinterpret_cast<const float2*>(A + (g + 8) * lda + 2 * q + 8);
  return f;
}
// acc[2][4] (16 x 16, mma.sync C layout) += F (f32 fragment) x B (f32 16 x 16, element (k, n) = b(k, n)) as three bf16
// products (hi hi, hi lo, lo hi).
template <class FB>
__device__ __forceinline__ void mm16(float (&acc)[2][4], const Frag& f, FB b, int lane) {
  const int g = lane >> 2, q = lane & 3;
  uint32_t ah[4], al[4];
  split2(f.x0.x, f.x0.y, ah[0], al[0]);
  split2(f.x1.x, f.x1.y, ah[1], al[1]);
  split2(f.x2.x, f.x2.y, ah[2], al[2]);
  split2(f.x3.x, f.x3.y, ah[3], al[3]);
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
    const int n = 8 * nt + g;
    uint32_t bh0, bl0, bh1, bl1;
    split2(b(2 * q, n), b(2 * q + 1, n), bh0, bl0);
    split2(b(2 * q + 8, n), b(2 * q + 9, n), bh1, bl1);
    mma(acc[nt], ah, bh0, bh1);
    mma(acc[nt], ah, bl0, bl1);
    mma(acc[nt], al, bh0, bh1);
  }
}
// The n8 tile n0 .. n0 + 7 of mm16 only: acc[4] (16 x 8) += F x B[:, n0 .. n0 + 7].
template <class FB>
__device__ __forceinline__ void mm8(float (&acc)[4], const Frag& f, FB b, int n0, int lane) {
  const int g = lane >> 2, q = lane & 3;
  uint32_t ah[4], al[4];
  split2(f.x0.x, f.x0.y, ah[0], al[0]);
  split2(f.x1.x, f.x1.y, ah[1], al[1]);
  split2(f.x2.x, f.x2.y, ah[2], al[2]);
  split2(f.x3.x, f.x3.y, ah[3], al[3]);
  const int n = n0 + g;
  uint32_t bh0, bl0, bh1, bl1;
  split2(b(2 * q, n), b(2 * q + 1, n), bh0, bl0);
  split2(b(2 * q + 8, n), b(2 * q + 9, n), bh1, bl1);
  mma(acc, ah, bh0, bh1);
  mma(acc, ah, bl0, bl1);
  mma(acc, al, bh0, bh1);
}
// Stores s * acc (16 x 16) at dst (row-major, ld floats) or into a swizzled A-array block.
__device__ __forceinline__ void st_ld(float* dst, int ld, const float (&acc)[2][4], float s, int lane) {
  const int g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
    *reinterpret_cast<float2*>(dst + g * ld + 8 * nt + 2 * q) = make_float2(s * acc[nt][0], s * acc[nt][1]);
    *reinterpret_cast<float2*>(dst + (g + 8) * ld + 8 * nt + 2 * q) = make_float2(s * acc[nt][2], s * acc[nt][3]);
  }
}
__device__ __forceinline__ void st_a4(float* A4, int r0, int c0, const float (&acc)[2][4], int lane) {
  const int g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
    *reinterpret_cast<float2*>(A4 + a4_idx(r0 + g, c0 + 8 * nt + 2 * q)) = make_float2(acc[nt][0], acc[nt][1]);
    *reinterpret_cast<float2*>(A4 + a4_idx(r0 + g + 8, c0 + 8 * nt + 2 * q)) = make_float2(acc[nt][2], acc[nt][3]);
  }
}
__device__ __forceinline__ void ld_acc(float (&acc)[2][4], const float* src, int ld, int lane) {
  const int g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
    const float2 u = *reinterpret_cast<const float2*>(src + g * ld + 8 * nt + 2 * q);
    const float2 v = *reinterpret_cast<const float2*>(src + (g + 8) * ld + 8 * nt + 2 * q);
    acc[nt][0] = u.x;
    acc[nt][1] = u.y;
    acc[nt][2] = v.x;
    acc[nt][3] = v.y;
  }
}
__device__ __forceinline__ void zero(float (&acc)[2][4]) {
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.f;
}

// wgmma (SS, both operands K-major in shared memory through 128-byte-swizzle descriptors).
__device__ __forceinline__ uint64_t wg_desc(uint32_t addr) {  // LBO 16 (unused: swizzled K-major), SBO 1024
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
__device__ __forceinline__ void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Bulk copy (TMA, no tensor map) of `bytes` (multiple of 16) from shared memory to global memory (both 16-aligned).
__device__ __forceinline__ void bulk_s2g(void* gdst, uint32_t ssrc, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(gdst), "r"(ssrc), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void bulk_wait_read() {  // <= N bulk groups of this thread still reading shared memory
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void fence_acc(float (&r)[8][4]) {
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+f"(r[i][j])::"memory");
}
// D[64 x 64] += A[64 x 16] B[64 x 16]^T (bf16, f32 accumulate; d in the mma.sync C layout per n8 tile).
// accum 0: D = A B^T (the accumulators' previous values are not read).
__device__ __forceinline__ void wg_ss(float (&d)[8][4], uint64_t da, uint64_t db, int accum = 1) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
      "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),
        "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),
        "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),
        "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "l"(da), "l"(db), "r"(accum));
}
#endif  // DK_GDR_LW_SM90A

// kV2 (variant bit 262144, session 10): (1) the A / P tiles below each warp's diagonal block take their decay as a
// row factor e^{gc_t - gc_16I} times a column factor e^{gc_16I - gc_s} (I = the warp's row block; both exponents <= 0
// as gc is non-increasing), so those elements cost 4 FMUL instead of a MUFU exp, its clamp and the masks; (2) warps 2-3
// do the gating (loads, softplus / sigmoid, per-warp scan) of every value head, the next head's during phase 3 of the
// inverse (where they are idle) into a buffer, which removes the per-head gating barrier and warps 0-1's serial gating.
// kL bit 2 (with bit 1; variant bit 524288, session 10): the epilogue -> diagonal inverse hand-off by __syncwarp (each
// warp inverts the diagonal block it wrote) instead of a CTA barrier.
// kL bit 8 (on kL 7; variant bit 4194304, session 11): the key norms are read off diag(K K^T) in the wgmma
// accumulators and the query norms computed as diag(Q_lw Q_lw^T) of each warp's 16 rows by ldmatrix + mma.sync (f32
// sums of the exact bf16 squares, as the pass over the tiles they replace, in another order); the first k16 step of
// the wgmma overwrites the accumulators (scale-d 0).
// kL bit 16 (on kL 7; variant bit 8388608, session 11): the diagonal inverses by one column per lane (lanes < 16),
// row i of A's block read as float4 broadcasts, two partial sums per row: no shuffles or per-term lane selects.
// kL bit 4 (with bit 1; variant bit 1048576, session 10): the image leaves shared memory by two bulk copies (TMA) that
// thread 0 issues instead of the 128 threads' LDS / ST loop: P and the vectors right after the epilogue (both final
// there), Tb after its stores; the reads are waited for before the next head's decay step (P / vectors) and before its
// epilogue (Tb), and before the CTA exits.
template <int kL>
__global__ void __launch_bounds__(128, 4) local_wgmma_kernel(const DkGdrPrefillFusedParams p,
                                                             const DkGdrPrefillSplitWs w) {
  constexpr bool kV2 = (kL & 1) != 0;
  constexpr bool kBulk = (kL & 4) != 0;
  constexpr bool kNoEpiBar = (kL & 2) != 0;
  constexpr bool kMmaNorm = (kL & 8) != 0;
  constexpr bool kInvRow = (kL & 16) != 0;
  static_assert(!kBulk || kV2, "the bulk copy-out relies on kV2's vectors being final after the decay step");
  static_assert(!kNoEpiBar || kV2, "variant bit 524288 is on 262144 only");
#ifdef DK_GDR_LW_SM90A
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem =
      smem_raw + ((1024u - (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) & 1023u)) & 1023u);
  const int lt = threadIdx.x, lw = lt >> 5, lane = lt & 31;
  const int g = lane >> 2, q = lane & 3;
  const int64_t pc = int64_t(blockIdx.x);  // chunk id
  const int64_t HV = p.h_v, T = p.num_tokens;
  const int ratio = int(HV / p.h_k);
  const int hk = int(blockIdx.y);
  const int hv0 = hk * ratio;
  const int seq = reinterpret_cast<const int*>(w.cseq)[pc];
  if (seq < 0) return;
  const int64_t slot = reinterpret_cast<const int*>(p.slots)[seq];
  if (!(slot >= 0 && slot < p.num_slots)) return;  // padding: the state kernel reads no image
  const int* cu = reinterpret_cast<const int*>(p.cu_seqlens);
  int64_t bos = cu[seq], eos = cu[seq + 1];
  bos = bos < 0 ? 0 : (bos > T ? T : bos);
  eos = eos < bos ? bos : (eos > T ? T : eos);
  const int64_t t0 = bos + (pc - reinterpret_cast<const int*>(w.coff)[seq]) * kC;
  if (t0 >= eos || t0 < bos) return;
  const int n = int(eos - t0 < kC ? eos - t0 : kC);
  const uint32_t sbase = smem_u32(smem);
  const __nv_bfloat16* kp = reinterpret_cast<const __nv_bfloat16*>(p.k);
  const __nv_bfloat16* qp = reinterpret_cast<const __nv_bfloat16*>(p.q);
  float* vec = reinterpret_cast<float*>(smem + kVec);
  float* sA = reinterpret_cast<float*>(smem);  // swizzled f32 A over the dead K tile / the Tb hi / lo bytes
  float* sT = reinterpret_cast<float*>(smem + kTm);
  float* sX = reinterpret_cast<float*>(smem + kX) + lw * 16 * kLdX;
  float* cf = reinterpret_cast<float*>(smem + kCf);  // kV2: C_I[s] = e^{gc_16I - gc_s} rk_s at cf[64 I + s], s < 16 I
  float* gbuf = reinterpret_cast<float*>(smem + kGb);  // kV2: the next head's g cumsum per warp [64], beta [64]
  unsigned char* stg = smem;
#pragma unroll
  for (int i = 0; i < 8; ++i) {  // K / Q rows (zero-filled past n) into the two 64-column panels
    const int idx = lt + 128 * i, row = idx >> 4, ch = idx & 15;
    const int rr = row < n ? row : 0;
    const uint32_t bytes = row < n ? 16u : 0u;
    const uint32_t off = uint32_t(ch >> 3) * 8192u + uint32_t(row * 128) + (uint32_t(((ch & 7) ^ (row & 7))) << 4);
    cp_async16(sbase + kOK + off, kp + (t0 + rr) * p.k_stride + hk * kK + ch * 8, bytes);
    cp_async16(sbase + kOQ + off, qp + (t0 + rr) * p.q_stride + hk * kK + ch * 8, bytes);
  }
  cp_async_commit();
  // Gate inputs of row lt & 63 (threads lt < 64; kV2: lt >= 64) for value head hv: raw a / b (fused) or g / beta,
  // loaded one head ahead.
  const bool gthr = kV2 ? lt >= 64 : lt < 64;
  const int grw = kV2 ? lt - 64 : lt;  // the gating row of a gating thread
  const bool grow = grw < n;
  float ra = 0.f, rb = 0.f, ral = 0.f, rdt = 0.f;
  auto gate_load = [&](int hv) {
    if (gthr && grow) {
      const int64_t gt = t0 + grw;
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
  auto gate_scan = [&](float* dst) {  // gating of row lt & 63 + inclusive scan per warp (warps 0, 1; kV2: 2, 3)
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
    dst[grw] = sc;  // dst = vec (kGpart 0, kBeta 1) or gbuf: same [2][64] layout
    dst[64 + grw] = be;
  };
  static_assert(kGpart == 0 && kBeta == 1, "gate_scan's destination layout");
  gate_load(hv0);
  if (gthr) gate_scan(vec);
  cp_async_wait_all();
  fence_proxy_async_smem();  // this thread's cp.async-written tile bytes -> the tensor cores' async proxy
  __syncthreads();
  if (kMmaNorm) {  // query norms: warp lw's 16 rows, diag(Q_lw Q_lw^T) by 8 ldmatrix + 16 mma.sync (see kL bit 8)
    const int mi = lane >> 3, r = 16 * lw + (lane & 7) + 8 * (mi & 1);
    const uint32_t rowb = sbase + kOQ + uint32_t(r * 128);
    float d[2][4];
    zero(d);
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) {
      const int ch = 2 * ks + (mi >> 1);  // 16-byte chunk of the row: panel ch >> 3, swizzled (ch & 7) ^ (r & 7)
      uint32_t f[4];
      ldsm_x4(f, rowb + uint32_t(ch >> 3) * 8192u + (uint32_t((ch & 7) ^ (r & 7)) << 4));
      mma(d[0], f, f[0], f[2]);  // columns = rows g of the block: B fragment = the A fragment's rows g
      mma(d[1], f, f[1], f[3]);  // rows g + 8
    }
    if (q == (g >> 1)) {  // this lane holds (g, g) and (g + 8, g + 8)
      const float s0 = (g & 1) ? d[0][1] : d[0][0], s1 = (g & 1) ? d[1][3] : d[1][2];
      vec[kRnq * 64 + 16 * lw + g] = (p.use_l2 ? rsqrtf(s0 + 1e-6f) : 1.f) * p.scale;
      vec[kRnq * 64 + 16 * lw + g + 8] = (p.use_l2 ? rsqrtf(s1 + 1e-6f) : 1.f) * p.scale;
    }
  } else {  // norms (value-head independent): lt < 64 key row lt, else query row lt - 64
    const int row = lt & 63;
    const unsigned char* tile = smem + (lt < 64 ? kOK : kOQ) + row * 128;
    float pss[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int ch = 0; ch < 16; ++ch) {
      const uint4 u =
          *reinterpret_cast<const uint4*>(tile + (ch >> 3) * 8192 + (((ch & 7) ^ (row & 7)) << 4));
      const uint32_t wv[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 f = unpack_bf(wv[j]);
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
  // Raw A = K K^T and P = Q K^T (64 x 64 each, f32; warp lw holds rows 16 lw .. 16 lw + 15), kept in registers for
  // every value head of the CTA: 2 x 8 SS-wgmma over the two 64-column panels (k16 step kb: panel kb / 4, 32 bytes).
  // kL bit 8: the first k16 step overwrites (scale-d 0) instead of zeroing 64 registers first, and the descriptors are
  // one base + the step's offset (the 14-bit address field does not carry: the tiles end below 2^18 bytes).
  float a[8][4], pp[8][4];
  if (!kMmaNorm) {
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) a[i][j] = pp[i][j] = 0.f;
  }
  fence_acc(a);
  fence_acc(pp);
  wg_fence();
  const uint64_t dk0 = wg_desc(sbase + kOK), dq0 = wg_desc(sbase + kOQ);
#pragma unroll
  for (int kb = 0; kb < 8; ++kb) {
    const uint32_t ok = uint32_t(kb >> 2) * 8192u + uint32_t(kb & 3) * 32u;
    if (kMmaNorm) {
      const uint64_t dk = dk0 + (ok >> 4), dq = dq0 + (ok >> 4);
      wg_ss(a, dk, dk, kb > 0);
      wg_ss(pp, dq, dk, kb > 0);
    } else {
      const uint64_t dk = wg_desc(sbase + kOK + ok), dq = wg_desc(sbase + kOQ + ok);
      wg_ss(a, dk, dk);
      wg_ss(pp, dq, dk);
    }
  }
  wg_commit();
  wg_wait0();
  fence_acc(a);
  fence_acc(pp);
  if (kMmaNorm && q == (g >> 1)) {  // key norms from diag(K K^T): (t, t) of rows t = 16 lw + g (+ 8) is a[2 lw (+ 1)]
    float e0, e1, e2, e3;  // (a switch on the warp, not a loop: ptxas would index a[] dynamically through the stack)
    switch (lw) {
      case 0: e0 = a[0][0], e1 = a[0][1], e2 = a[1][2], e3 = a[1][3]; break;
      case 1: e0 = a[2][0], e1 = a[2][1], e2 = a[3][2], e3 = a[3][3]; break;
      case 2: e0 = a[4][0], e1 = a[4][1], e2 = a[5][2], e3 = a[5][3]; break;
      default: e0 = a[6][0], e1 = a[6][1], e2 = a[7][2], e3 = a[7][3]; break;
    }
    const float s0 = (g & 1) ? e1 : e0, s1 = (g & 1) ? e3 : e2;
    vec[kRnk * 64 + 16 * lw + g] = p.use_l2 ? rsqrtf(s0 + 1e-6f) : 1.f;
    vec[kRnk * 64 + 16 * lw + g + 8] = p.use_l2 ? rsqrtf(s1 + 1e-6f) : 1.f;
  }
  __syncthreads();  // every warp's products and K / Q reads done (A / P overwrite the tiles); norms, gates visible
  const int m0 = 16 * lw;
#pragma unroll 1
  for (int j = 0; j < ratio; ++j) {
    const int hv = hv0 + j;
    if (!kV2 && j > 0) {  // this head's gates (loaded during the previous head), then the next head's loads
      if (lt < 64) gate_scan(vec);
      __syncthreads();
    }
    if (j + 1 < ratio) gate_load(hv + 1);
    {  // per-row decay factors of head hv: lt < 64 key row lt, else query row lt - 64
      const int row = lt & 63;
      const float* gsrc = (kV2 && j > 0) ? gbuf : vec;  // kV2: head j > 0's gating is in the buffer (phase 3)
      const float gp = gsrc[row];
      const float gc = gp + (row >= 32 ? gsrc[31] : 0.f);
      const float glast = gsrc[63] + gsrc[31];
      const bool valid = row < n;
      if (lt < 64) {
        if (kV2 && j > 0) {
          vec[kGpart * 64 + row] = gp;
          vec[kBeta * 64 + row] = gsrc[64 + row];
        }
        const float rn = vec[kRnk * 64 + row];
        vec[kGc * 64 + row] = gc;
        vec[kXsc * 64 + row] = valid ? dexp(gc) * rn : 0.f;
        vec[kKdec * 64 + row] = valid ? dexp(glast - gc) * rn : 0.f;
        if (row == 0) vec[kMisc * 64] = dexp(glast);
      } else {
        vec[kQsc * 64 + row] = valid ? vec[kRnq * 64 + row] * dexp(gc) : 0.f;
        if (kV2) {  // column factors of the tiles below the diagonal blocks: C_I[s], s = row < 16 I
          const float rk = vec[kRnk * 64 + row];
#pragma unroll
          for (int I = 1; I < 4; ++I)
            if (row < 16 * I) cf[64 * I + row] = dexp(gsrc[16 * I] + (I >= 2 ? gsrc[31] : 0.f) - gc) * rk;
        }
      }
    }
    if (kBulk && j > 0 && lt == 0) bulk_wait_read<0>();  // the previous head's Tb copy read (the epilogue overwrites)
    __syncthreads();
    {  // A / P epilogue: decays, beta, norms; A -> sA (f32), P -> the image (bf16). Rows t_h = m0 + g + 8 h of the
       // warp; the column vectors of an n8 tile loaded once for both rows (same products in the same order as before)
      float bt[2], rq[2], gct[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int t = m0 + g + 8 * h;
        bt[h] = vec[kBeta * 64 + t] * vec[kRnk * 64 + t];
        rq[h] = vec[kRnq * 64 + t];
        gct[h] = vec[kGc * 64 + t];
      }
      float at[2], ptf[2];  // kV2: row factors of the tiles below the diagonal block (rows of block lw, pivot 16 lw)
      if (kV2) {
        const float gb = vec[kGc * 64 + m0];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float r = dexp(gct[h] - gb);
          at[h] = bt[h] * r;
          ptf[h] = rq[h] * r;
        }
      }
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        const int s = 8 * nt + 2 * q;
        uint32_t* pdst[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int t = m0 + g + 8 * h;
          pdst[h] = reinterpret_cast<uint32_t*>(stg + kOP + t * 128 + (((s >> 3) ^ (t & 7)) << 4) + (s & 7) * 2);
        }
        if (nt > 2 * lw + 1) {  // above the warp's diagonal block (warp-uniform): P zero, A never read
          *pdst[0] = 0u;
          *pdst[1] = 0u;
          continue;
        }
        if (kV2 && nt < 2 * lw) {  // below the diagonal block: every s < t; decay = row factor x column factor
          const float2 c2 = *reinterpret_cast<const float2*>(cf + 64 * lw + s);
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int t = m0 + g + 8 * h;
            *reinterpret_cast<float2*>(sA + a4_idx(t, s)) =
                make_float2(a[nt][2 * h] * at[h] * c2.x, a[nt][2 * h + 1] * at[h] * c2.y);
            *pdst[h] = pack_bf(pp[nt][2 * h] * ptf[h] * c2.x, pp[nt][2 * h + 1] * ptf[h] * c2.y);
          }
          continue;
        }
        const float2 rk2 = *reinterpret_cast<const float2*>(vec + kRnk * 64 + s);
        const float2 gs2 = *reinterpret_cast<const float2*>(vec + kGc * 64 + s);
        const float rks[2] = {rk2.x, rk2.y}, gcs[2] = {gs2.x, gs2.y};
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int t = m0 + g + 8 * h;
          float av[2], pv[2];
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float dx = (s + e <= t) ? dexp(gct[h] - gcs[e]) : 0.f;
            av[e] = (s + e < t) ? a[nt][2 * h + e] * bt[h] * rks[e] * dx : 0.f;
            pv[e] = (s + e <= t) ? pp[nt][2 * h + e] * rq[h] * rks[e] * dx : 0.f;
          }
          *reinterpret_cast<float2*>(sA + a4_idx(t, s)) = make_float2(av[0], av[1]);
          *pdst[h] = pack_bf(pv[0], pv[1]);
        }
      }
    }
    if (kBulk) fence_proxy_async_smem();  // P (here) and the vectors (decay step) -> the bulk copy's async proxy
    // kL bit 2: the diagonal inverse of warp lw reads only A's block (lw, lw), which warp lw itself wrote above, and
    // writes only Tm's block (lw, lw): a warp barrier is enough, and no warp waits for the slowest one's epilogue.
    if (kNoEpiBar)
      __syncwarp();
    else
      __syncthreads();
    if (kBulk && !kNoEpiBar && lt == 0) {  // P and the vectors are final: their copy runs under the inverse
      unsigned char* const img_g = reinterpret_cast<unsigned char*>(w.img + uint64_t(pc * HV + hv) * kStRest);
      bulk_s2g(img_g + kOP, sbase + kOP, kRVec - kOP);
      bulk_s2g(img_g + kRVec, sbase + kVec, kStRest - kRVec);
      bulk_commit();
    }
    if (kInvRow) {  // kL bit 16: D_lw column c = lane & 15 by forward substitution, row i of A's block read as float4s
      // (broadcast; 8-column groups stay contiguous under the swizzle), the terms m < i in two partial sums (m & 2);
      // no shuffles, no per-term lane select. Lanes c + 16 repeat lane c's work; lanes < 16 store.
      const int cidx = lane & 15;
      const int r0 = 16 * lw;
      float col[16];
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        float x0 = 0.f, x1 = 0.f;
        // row i's loads wait for row i - 2's result (else ptxas hoists all 36 float4 loads and spills)
        int arow = (r0 + i) * 64;
        if (i >= 2) asm volatile("" : "+r"(arow) : "f"(col[i - 2]));
#pragma unroll
        for (int m = 0; m < i; m += 4) {
          const float4 l = *reinterpret_cast<const float4*>(sA + arow + ((r0 + m) ^ ((i & 3) << 3)));
          x0 = fmaf(l.x, col[m], x0);
          if (m + 1 < i) x0 = fmaf(l.y, col[m + 1], x0);
          if (m + 2 < i) x1 = fmaf(l.z, col[m + 2], x1);
          if (m + 3 < i) x1 = fmaf(l.w, col[m + 3], x1);
        }
        col[i] = ((i == cidx) ? 1.f : 0.f) - (x0 + x1);
      }
      if (lane < 16) {
#pragma unroll
        for (int i = 0; i < 16; ++i) sT[(r0 + i) * kLd + r0 + cidx] = col[i];
      }
    } else {  // diagonal blocks D_lw = (I + A_{lw,lw})^-1: warp lw, lanes c and c + 16 own column c (forward substitution;
       // lane half hf sums the terms m = hf (mod 2), one shuffle per row adds the halves)
      const int cidx = lane & 15, hf = lane >> 4;
      const int r0 = 16 * lw;
      float col[16];
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        float x = 0.f;
#pragma unroll
        for (int m = 0; m < i; m += 2)
          if (m + hf < i) x -= sA[a4_idx(r0 + i, r0 + m + hf)] * (hf ? col[m + 1] : col[m]);
        if (i > 0) x += __shfl_xor_sync(0xffffffffu, x, 16);
        col[i] = ((i == cidx) ? 1.f : 0.f) + x;
      }
      if (lane < 16) {
#pragma unroll
        for (int i = 0; i < 16; ++i) sT[(r0 + i) * kLd + r0 + cidx] = col[i];
      }
    }
    __syncthreads();
    if (kBulk && kNoEpiBar && lt == 0) {  // (every warp's P stores and fence are before the barrier above)
      unsigned char* const img_g = reinterpret_cast<unsigned char*>(w.img + uint64_t(pc * HV + hv) * kStRest);
      bulk_s2g(img_g + kOP, sbase + kOP, kRVec - kOP);
      bulk_s2g(img_g + kRVec, sbase + kVec, kStRest - kRVec);
      bulk_commit();
    }
    // Blocked off-diagonal part (see the file comment). Accessors: B operand from Tm (ld 72), the warp's scratch
    // (ld 24) or an intermediate block s of the swizzled A array.
    auto bT = [&](int bi, int bj) {
      const float* base = sT + (16 * bi) * kLd + 16 * bj;
      return [base](int k, int nn) { return base[k * kLd + nn]; };
    };
    auto bS = [&](int sblk) {
      const int r0 = 16 * (sblk >> 1), c0 = 32 + 16 * (sblk & 1);
      const float* A4 = sA;
      return [A4, r0, c0](int k, int nn) { return A4[a4_idx(r0 + k, c0 + nn)]; };
    };
    const auto bX = [&](int k, int nn) { return sX[k * kLdX + nn]; };
    auto fT = [&](int bi, int bj) { return frag_ld(sT + (16 * bi) * kLd + 16 * bj, kLd, lane); };
    float acc[2][4];
    if (kV2) {  // phases 1 / 2 at <= 2 products per warp (serial depth 5 instead of 6; same products and sums)
      // Phase 1
      if (lw <= 1) {  // T10 = -D1 (A10 D0) | T32 = -D3 (A32 D2)
        const int i = 1 + 2 * lw, jb = 2 * lw;
        zero(acc);
        mm16(acc, frag_a4(sA, 16 * i, 16 * jb, lane), bT(jb, jb), lane);
        st_ld(sX, kLdX, acc, 1.f, lane);
        __syncwarp();
        zero(acc);
        mm16(acc, fT(i, i), bX, lane);
        st_ld(sT + (16 * i) * kLd + 16 * jb, kLd, acc, -1.f, lane);
      } else if (lw == 2) {  // X21 = A21 D1 -> block 0, T21 = -D2 X21
        zero(acc);
        mm16(acc, frag_a4(sA, 32, 16, lane), bT(1, 1), lane);
        st_a4(sA, 0, 32, acc, lane);
        __syncwarp();
        zero(acc);
        mm16(acc, fT(2, 2), bS(0), lane);
        st_ld(sT + 32 * kLd + 16, kLd, acc, -1.f, lane);
      } else {  // X31 = A31 D1 -> block 1; W20 = A20 D0 (-> this warp's scratch)
        zero(acc);
        mm16(acc, frag_a4(sA, 48, 16, lane), bT(1, 1), lane);
        st_a4(sA, 0, 48, acc, lane);
        zero(acc);
        mm16(acc, frag_a4(sA, 32, 0, lane), bT(0, 0), lane);
        st_ld(sX, kLdX, acc, 1.f, lane);
      }
      __syncthreads();
      // Phase 2
      if (lw == 0) {  // X20 = W20 (warp 3's scratch) + A21 T10 -> block 2, T20 = -D2 X20
        ld_acc(acc, sX + 3 * 16 * kLdX, kLdX, lane);
        mm16(acc, frag_a4(sA, 32, 16, lane), bT(1, 0), lane);
        st_a4(sA, 16, 32, acc, lane);
        __syncwarp();
        zero(acc);
        mm16(acc, fT(2, 2), bS(2), lane);
        st_ld(sT + 32 * kLd, kLd, acc, -1.f, lane);
      } else if (lw == 1) {  // T31 = -(T32 X21 + D3 X31)
        zero(acc);
        mm16(acc, fT(3, 2), bS(0), lane);
        mm16(acc, fT(3, 3), bS(1), lane);
        st_ld(sT + 48 * kLd + 16, kLd, acc, -1.f, lane);
      } else if (lw == 2) {  // X30 = A30 D0 + A31 T10 -> block 3
        zero(acc);
        mm16(acc, frag_a4(sA, 48, 0, lane), bT(0, 0), lane);
        mm16(acc, frag_a4(sA, 48, 16, lane), bT(1, 0), lane);
        st_a4(sA, 16, 48, acc, lane);
      }
      __syncthreads();
    } else {
      // Phase 1
      if (lw <= 1) {  // T10 = -D1 (A10 D0) | T32 = -D3 (A32 D2)
        const int i = 1 + 2 * lw, jb = 2 * lw;
        zero(acc);
        mm16(acc, frag_a4(sA, 16 * i, 16 * jb, lane), bT(jb, jb), lane);
        st_ld(sX, kLdX, acc, 1.f, lane);
        __syncwarp();
        zero(acc);
        mm16(acc, fT(i, i), bX, lane);
        st_ld(sT + (16 * i) * kLd + 16 * jb, kLd, acc, -1.f, lane);
      } else if (lw == 2) {  // X21 = A21 D1 -> block 0, T21 = -D2 X21; W20 = A20 D0 (-> scratch)
        zero(acc);
        mm16(acc, frag_a4(sA, 32, 16, lane), bT(1, 1), lane);
        st_a4(sA, 0, 32, acc, lane);
        zero(acc);
        mm16(acc, frag_a4(sA, 32, 0, lane), bT(0, 0), lane);
        st_ld(sX, kLdX, acc, 1.f, lane);
        __syncwarp();
        zero(acc);
        mm16(acc, fT(2, 2), bS(0), lane);
        st_ld(sT + 32 * kLd + 16, kLd, acc, -1.f, lane);
      } else {  // X31 = A31 D1 -> block 1; W30 = A30 D0 (-> scratch)
        zero(acc);
        mm16(acc, frag_a4(sA, 48, 16, lane), bT(1, 1), lane);
        st_a4(sA, 0, 48, acc, lane);
        zero(acc);
        mm16(acc, frag_a4(sA, 48, 0, lane), bT(0, 0), lane);
        st_ld(sX, kLdX, acc, 1.f, lane);
      }
      __syncthreads();
      // Phase 2
      if (lw == 0) {  // T31 = -(T32 X21 + D3 X31)
        zero(acc);
        mm16(acc, fT(3, 2), bS(0), lane);
        mm16(acc, fT(3, 3), bS(1), lane);
        st_ld(sT + 48 * kLd + 16, kLd, acc, -1.f, lane);
      } else if (lw == 2) {  // X20 = W20 + A21 T10 -> block 2, T20 = -D2 X20
        ld_acc(acc, sX, kLdX, lane);
        mm16(acc, frag_a4(sA, 32, 16, lane), bT(1, 0), lane);
        st_a4(sA, 16, 32, acc, lane);
        __syncwarp();
        zero(acc);
        mm16(acc, fT(2, 2), bS(2), lane);
        st_ld(sT + 32 * kLd, kLd, acc, -1.f, lane);
      } else if (lw == 3) {  // X30 = W30 + A31 T10 -> block 3
        ld_acc(acc, sX, kLdX, lane);
        mm16(acc, frag_a4(sA, 48, 16, lane), bT(1, 0), lane);
        st_a4(sA, 16, 48, acc, lane);
      }
      __syncthreads();
    }
    // Phase 3: T30 = -(T32 X20 + D3 X30), its 8-column halves on warps 0 / 1
    if (lw <= 1) {
      float acc1[4] = {0.f, 0.f, 0.f, 0.f};
      mm8(acc1, fT(3, 2), bS(2), 8 * lw, lane);
      mm8(acc1, fT(3, 3), bS(3), 8 * lw, lane);
      float* dst = sT + 48 * kLd + 8 * lw;
      *reinterpret_cast<float2*>(dst + g * kLd + 2 * q) = make_float2(-acc1[0], -acc1[1]);
      *reinterpret_cast<float2*>(dst + (g + 8) * kLd + 2 * q) = make_float2(-acc1[2], -acc1[3]);
    } else if (kV2 && j + 1 < ratio) {  // warps 2-3 (idle here): the next head's gating into the buffer
      gate_scan(gbuf);
    }
    __syncthreads();
    // Tb = Tm diag(beta) (lower triangle incl. the diagonal) -> bf16 hi / lo tiles of the image.
    // kV2: warp lw stores the 32-row x 8-column items (rows 32, chunk lw), (rows 32, chunk lw + 4), (rows 0, chunk lw)
    // with the products and (rows 0, chunk lw + 4) as zeros (above the diagonal: s >= 32 > t), instead of 4 rows x 8
    // chunks per iteration (where the zero chunks are lane-divergent and cost the full path).
    if (kV2) {
      const int t = lane, ch = lw + 4;
      const uint32_t off = uint32_t(t * 128) + (uint32_t((ch ^ (t & 7))) << 4);
      *reinterpret_cast<uint4*>(stg + kOTh + off) = make_uint4(0u, 0u, 0u, 0u);
      *reinterpret_cast<uint4*>(stg + kOTl + off) = make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int it = 0; it < (kV2 ? 3 : 4); ++it) {
      const int idx = lt + 128 * it;
      const int t = kV2 ? (it < 2 ? 32 : 0) + lane : idx >> 3;
      const int ch = kV2 ? lw + (it == 1 ? 4 : 0) : idx & 7;
      const int s0 = ch * 8;
      const float4 u0 = *reinterpret_cast<const float4*>(sT + t * kLd + s0);
      const float4 u1 = *reinterpret_cast<const float4*>(sT + t * kLd + s0 + 4);
      const float x[8] = {u0.x, u0.y, u0.z, u0.w, u1.x, u1.y, u1.z, u1.w};
      const float4 b0 = *reinterpret_cast<const float4*>(vec + kBeta * 64 + s0);
      const float4 b1 = *reinterpret_cast<const float4*>(vec + kBeta * 64 + s0 + 4);
      const float bb[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
      uint32_t hi[4], lo[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int s = s0 + 2 * e;
        const float y0 = s <= t ? x[2 * e] * bb[2 * e] : 0.f;
        const float y1 = s + 1 <= t ? x[2 * e + 1] * bb[2 * e + 1] : 0.f;
        split2(y0, y1, hi[e], lo[e]);
      }
      const uint32_t off = uint32_t(t * 128) + (uint32_t((ch ^ (t & 7))) << 4);
      *reinterpret_cast<uint4*>(stg + kOTh + off) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
      *reinterpret_cast<uint4*>(stg + kOTl + off) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
    }
    if (kBulk) fence_proxy_async_smem();  // Tb -> the bulk copy's async proxy
    __syncthreads();
    if (kBulk) {
      if (lt == 0) {
        unsigned char* const img_g = reinterpret_cast<unsigned char*>(w.img + uint64_t(pc * HV + hv) * kStRest);
        bulk_s2g(img_g + kOTh, sbase + kOTh, kOP - kOTh);  // Tb hi / lo
        bulk_commit();
        bulk_wait_read<1>();  // P / vectors read (the next head's decay step overwrites the vectors)
      }
    } else {
      uint4* img = reinterpret_cast<uint4*>(w.img + uint64_t(pc * HV + hv) * kStRest);
      for (int idx = lt; idx < int(kStRest / 16); idx += 128) {
        const uint32_t b = uint32_t(idx) * 16u;
        img[idx] = *reinterpret_cast<const uint4*>(b < kRVec ? smem + b : smem + kVec + (b - kRVec));
      }
    }
    if (j + 1 < ratio) __syncthreads();  // the copy-out read the image and the vectors the next head overwrites
  }
  if (kBulk && lt == 0) bulk_wait_read<0>();  // shared memory stays the CTA's until the last copy has read it
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}

}  // namespace gdr_lw
}  // namespace dk

extern "C" dk_status dk_gdr_split_local_wgmma_sm90(const DkGdrPrefillFusedParams* p, const DkGdrPrefillSplitWs* ws,
                                                   cudaStream_t stream) {
  using namespace dk::gdr_lw;
  if (p == nullptr || ws == nullptr) return DK_ERR_INVALID_ARGUMENT;
  if (p->k_dim != kK || p->h_k < 1 || p->h_v % p->h_k != 0 || p->h_k > 65535 || ws->nt > 0x7fffffffLL)
    return DK_ERR_INVALID_ARGUMENT;
  if (ws->nt <= 0) return DK_OK;
  static_assert(kSmemAlloc <= 232448, "shared memory");
  // session 10's forms (see the kernel's comments): bit 262144 -> kL 1; with it, bits 524288 (no epilogue barrier)
  // -> kL | 2 and 1048576 (bulk copy-out) -> kL | 4
  const bool v2 = (p->variant & 262144) != 0;
  // session 11 (on the full session-10 form kL 7 only): bit 4194304 (norms on the tensor cores) -> kL | 8, bit 8388608
  // -> kL | 16
  int kl = v2 ? 1 | ((p->variant & 524288) != 0 ? 2 : 0) | ((p->variant & 1048576) != 0 ? 4 : 0) : 0;
  if (kl == 7) kl |= ((p->variant & 4194304) != 0 ? 8 : 0) | ((p->variant & 8388608) != 0 ? 16 : 0);
  auto* const kern = kl == 31  ? local_wgmma_kernel<31>
                     : kl == 23 ? local_wgmma_kernel<23>
                     : kl == 15 ? local_wgmma_kernel<15>
                     : kl == 7 ? local_wgmma_kernel<7>
                     : kl == 5 ? local_wgmma_kernel<5>
                     : kl == 3 ? local_wgmma_kernel<3>
                     : kl == 1 ? local_wgmma_kernel<1>
                               : local_wgmma_kernel<0>;
  if (cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmemAlloc)) != cudaSuccess)
    return dk::launch_status();
  kern<<<dim3(static_cast<unsigned>(ws->nt), static_cast<unsigned>(p->h_k)), 128, kSmemAlloc, stream>>>(*p, *ws);
  return dk::launch_status();
}
