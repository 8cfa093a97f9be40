// attn.decode for sm_90 (Hopper): paged split-K decode attention, one or a few new tokens per row
// (T >= 1; T > 1 = speculative verification, causal among the row's new tokens). CPU twin:
// deltakit_ref::attn::decode_paged (T = 1) / prefill_paged (T > 1, the new tokens over their
// context); the portable path is the Triton kernel in triton_aot/attn/attention.py (T = 1).
//
// Work split. One CTA = one (row, kv head, context split). The G = HQ / HKV query heads of the kv
// head and the T new tokens of the row are packed into the M = 16 rows of an mma.sync m16n8k16
// tile (packed row r = t * G + g; G * T <= 16): each K/V byte of the split is read from DRAM once
// and used by every query head of its group. The split covers whole BN-position tiles
// [lo, hi) of the context (BN = 16 * WARPS), like the Triton kernel's split rule; the strided
// variants 18-24 (session 12) give split s of S the tiles s, s + S, s + 2S, ... instead (23 / 24:
// striding over the live split count of the contiguous rule), so a split's first page entries can
// be looked up at entry.
//
// Memory pipeline (the point of this kernel: decode is a pure KV-cache read). Each warp owns the 16
// positions [16w, 16w + 16) of every tile, loads them and consumes them (no CTA barrier per tile):
// its lanes issue 16-byte cp.async copies (cp.async.cg, L1 bypass) of whole K and V rows STAGES - 1
// tiles ahead of the one being consumed; each row is one page lookup (any page size; done by one
// lane a tile ahead and shared by shuffle) and HD * 2 contiguous bytes in the cache
// ([num_pages, page_size, HKV, HD]). Rows land in shared memory as HD/8
// 16-byte chunks with the chunk index XOR-ed by row % 8, so the ldmatrix reads below are free of
// bank conflicts. At HD 256, variant 0: 3 stages x 64 positions x (K + V) = 192 KB, two tiles
// (128 KB) in flight per SM while the third is consumed.
//
// Compute (negligible next to the loads: 16 FLOP per KV byte at G = 16). Warp w takes the 16
// positions [16w, 16w + 16) of every tile: S = Q K^T with mma.sync m16n8k16 bf16 (Q from shared
// memory by ldmatrix.x4, K by ldmatrix.x4: rows = positions, 16-byte chunks = head dims), f32
// online softmax in exp2 units (per-warp running max and sum), P rounded to bf16 in registers as
// the A operand of O += P V (V by ldmatrix.x4.trans). At the end the WARPS partial results of the
// CTA are combined through shared memory by log-sum-exp; with one split the CTA writes the bf16
// output, else f32 partial outputs (normalized) and base-2 log-sum-exps to the caller's
// workspace, combined by decode_merge_kernel (one block per (token, head); launched as a
// programmatic dependent so its launch latency hides behind the split kernel's tail).
//
// Masks: positions >= the split end read zeros and score -inf; with T > 1, new token t (absolute
// position seq_len - T + t) sees positions <= its own. Empty splits and padding rows
// (seq_len <= 0) write a -inf log-sum-exp and zero partials (zero bf16 output with one split).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>

#include "../common/launch.cuh"

// The body needs sm_80 instructions (cp.async, ldmatrix, mma.sync bf16); it is dispatched on
// compute capability 9.0 only (the launcher checks the loaded binary), tuned for the H200.
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 800)
#define DK_ATTN_DEC_BODY 1
#endif

namespace dk {
namespace attn_dec {

// Tile configurations (DkAttnDecodeSm90Params::variant): WARPS warps (BN = 16 * WARPS positions
// per tile), STAGES shared-memory stages. HD 256: 0 = 4 warps x 3 stages (200 KB, 1 CTA/SM);
// 1 = 2 warps x 3 stages (104 KB, 2 CTAs/SM); 2 = 4 x 2 (136 KB); 3 = 2 x 2 (72 KB, 3 CTAs/SM).
// HD 128: 0 = 4 x 4 (132 KB); 1 = 2 x 6 (100 KB); 2 = 4 x 3; 3 = 2 x 4. HD 64: one configuration,
// 4 x 6 (98 KB).
// Variants 4-7 (BULK, sm_90 only): the same tiles loaded by the bulk-copy engine instead of
// cp.async: one cp.async.bulk (TMA, 1D) per K or V row issued by one lane (lane j: K row j, lane
// 16 + j: V row j of the warp's 16 positions), completion counted in bytes on a per-warp, per-stage
// mbarrier; rows padded to HD * 2 + 16 bytes (conflict-free ldmatrix without the XOR swizzle).
// HD 256: 4 = 4 warps x 3 stages (211 KB); 5 = 2 x 3 (109 KB, 2 CTAs/SM); 6 = 2 x 2 (74 KB, 3
// CTAs/SM); 7 = 1 x 6 (107 KB, 2 CTAs/SM). HD 128: 4 = 4 x 4; 5 = 2 x 6; 6 = 4 x 3; 7 = 2 x 4.
// Variants 8-11 (session 5, CLUSTER): the tiles of 0-3, but with 2..8 splits the splits of a
// (row, kv head) form one thread-block cluster and combine their partial results through
// distributed shared memory at the end (CTA k of the cluster writes the output rows' column
// slice k): no f32 partials in the workspace and no merge launch. Other split counts run 0-3.
// Variant 12 (session 6, measurement): variant 0 recording a per-CTA timeline (kTl below).
// Variant 13 (session 8, DYN): the tiles of 0, but C consecutive splits of a (row, kv head) form
// one thread-block cluster (C = the largest divisor of the split count in 2..8 whose clusters all
// fit on the device at once, cudaOccupancyMaxActiveClusters) that shares the union of their static
// ranges dynamically: each warp claims the next 16-position chunk from a counter in the shared
// memory of the cluster's CTA 0 (atom.shared::cluster, zeroed by that CTA behind a cluster barrier
// in every launch: no global state, nothing to reset, graph-safe, workspace unchanged), so the
// CTAs of a cluster end together whatever each SM's bandwidth (static ranges: the step ends with
// the slowest split). Partials + merge as variant 0 (the log-sum-exp merge is order-independent;
// which positions a split summed varies from run to run). No such C (or one split): variant 0.
// Variants 14 / 15 (session 9, GDYN): the tiles of 0 / 3 where ALL splits of a (row, kv head)
// share its whole context range dynamically through a counter in global memory (no cluster: the
// splits run on any SMs, so a split on a slow SM simply claims fewer chunks and the splits of a
// (row, kv head) end together). The counters are module globals (zero at load) in one of
// kGdynRegions regions (the launcher takes the next region per launch, so launches in flight on
// different streams use different counters); every CTA counts itself done after its last claim
// and the group's last CTA puts both words back to zero: each launch leaves its counters as it
// found them (graph-safe, no workspace, nothing to reset; a launch that dies mid-way leaves the
// context unusable anyway). More than kGdynGroups (row, kv head) pairs or one split: 0 / 3.
// H200, session 9 call 1: correct, but 7-10% SLOWER than 0 / 3 at the same split counts (a global
// atomic per 16-position chunk and warp, its result needed one tile later).
// Variants 16 / 17 (session 9, HYB): 14 / 15 with a static prefix: the first P = 3/4 of the
// group's chunks (rounded down to a multiple of the group's warps W = splits x WARPS) are dealt
// out round-robin without atomics (warp g of the group takes chunks g, g + W, ...), only the
// rest is claimed from the counter (P + the counter value): the atomics move to the last quarter,
// which still absorbs +-25% of per-SM rate differences (session 8: min / max split loop 26.9 /
// 33.1 us at TP2 4k / 16). H200, session 9 call 2: correct, sanitizer-clean, still 5-6% slower
// than 0 / 3 (TP2 4k / 16: 16 s4 40.0 vs 0 s4 37.7 us; 17 s9 42.4 vs 3 s9 40.4). Not promoted;
// why the static-prefix form loses too (round-robin chunks instead of a contiguous range per
// split? the tail's atomics when every warp reaches it together?) is not measured.
// Variants 18-21 (session 12, ST = strided splits, LE = lean combine): split s of S takes the
// tiles s, s + S, s + 2S, ... of the context instead of one contiguous range, so the positions of
// its first STAGES tiles do not depend on seq_len: their page-table entries are loaded right at
// entry, together with seq_len (bounded by the table row, max_pages * page_size; positions >=
// seq_len are dropped once it lands) -- one dependent L2 round trip less before the first K/V
// copies (the contiguous split's first position needs seq_len). Tile counts per split as before
// (equal +-1); the log-sum-exp merge is order-independent. LE: the end-of-CTA combine writes
// only the accumulator rows < G * T to shared memory (at G * T <= 8 the second half of the
// m16 tile is padding: half the stores). 18 = tiles of 0 + ST + LE, 19 = tiles of 2 + ST + LE,
// 20 = tiles of 3 + ST + LE, 21 = tiles of 0 + ST (no LE: attribution), 22 = 18 recording the
// timeline of variant 12 (measurement; hd 256 only, 0 at hd 128).
// H200, session 12: correct, sanitizer-clean; 18 vs 0 -0.7% at TP2 4k / 16 rows, -0.3..-3% at most
// shapes, but +16% at TP2 4k / 1 row (62 splits of 64 tiles: the contiguous split leaves 30 of
// them empty, the strided one makes all 62 live -> twice the partials and merge work).
// Variants 23 / 24 (session 12, STE): ST with the contiguous split's live split count: per =
// ceil(tiles / S), L = ceil(tiles / per) splits take tiles s, s + L, ... (splits >= L empty, as
// with contiguous ranges); only tile 0's page-table entries (position s * BN, independent of
// seq_len) are loaded at entry, the other stages' after seq_len. 23 = tiles of 2 + STE + LE,
// 24 = tiles of 0 + STE + LE.
constexpr int kVariants = 25;
template <int VAR>
constexpr bool kSt = VAR >= 18 && VAR <= 24;
template <int VAR>
constexpr bool kSte = VAR == 23 || VAR == 24;
template <int VAR>
constexpr bool kLe = (VAR >= 18 && VAR <= 20) || VAR >= 22;
template <int VAR>
constexpr bool kDyn = VAR >= 13 && VAR <= 17;
template <int VAR>
constexpr bool kGdyn = VAR >= 14 && VAR <= 17;
template <int VAR>
constexpr bool kHyb = VAR == 16 || VAR == 17;
constexpr int kGdynRegions = 64;
constexpr int kGdynGroups = 4096;
// GDYN counters: region r, group g (= row * HKV + kv head): words 2 g (claims), 2 g + 1 (done).
__device__ unsigned int g_dec_gdyn[kGdynRegions * kGdynGroups * 2];
// Tile configuration of a variant (13 / 14 / 16 / 18 / 21 / 22 / 24 use the tiles of 0, 19 / 23 those of 2, 15 / 17 /
// 20 those of 3).
template <int VAR>
constexpr int kTileOf =
    (VAR == 13 || VAR == 14 || VAR == 16 || VAR == 18 || VAR == 21 || VAR == 22 || VAR == 24)
        ? 0
        : ((VAR == 15 || VAR == 17 || VAR == 20) ? 3 : ((VAR == 19 || VAR == 23) ? 2 : VAR));
template <int VAR>
constexpr bool kCluster = VAR >= 8 && VAR < 12;
template <int VAR>
constexpr bool kTl = VAR == 12 || VAR == 22;
// Timeline of variant 12 (dk_attn_decode_sm90_timeline): kDecTlFields words per split CTA at its
// linear index (x fastest; at most kDecTlCtas): 0 = SM id | tiles << 32, then %globaltimer ns at
// entry, after griddepcontrol.wait, Q landed, main loop done, partials written; after them one
// kDecTlFields record per merge block (at most kDecTlCtas): entry, after the wait, output written.
constexpr int kDecTlCtas = 4096;
constexpr int kDecTlFields = 6;
__device__ unsigned long long g_decode_tl[2 * kDecTlCtas * kDecTlFields];
template <int HD, int VAR>
struct Cfg;
template <int VAR>
struct Cfg<256, VAR> {
  static constexpr int V = kTileOf<VAR>;
  static constexpr bool BULK = V >= 4 && V < 8;
  static constexpr int WARPS = V == 7 ? 1 : ((V % 4 == 1 || V % 4 == 3 || V == 6) ? 2 : 4);
  static constexpr int STAGES = V == 7 ? 6 : ((V % 4 <= 1) ? 3 : 2);
};
template <int VAR>
struct Cfg<128, VAR> {
  static constexpr int V = kTileOf<VAR>;
  static constexpr bool BULK = V >= 4 && V < 8;
  static constexpr int WARPS = (V % 4 == 1 || V % 4 == 3) ? 2 : 4;
  static constexpr int STAGES = V % 4 == 0 ? 4 : (V % 4 == 1 ? 6 : (V % 4 == 2 ? 3 : 4));
};
template <int VAR>
struct Cfg<64, VAR> {
  static constexpr bool BULK = false;
  static constexpr int WARPS = 4;
  static constexpr int STAGES = 6;
};

// Shared-memory row pitch: HD * 2 bytes XOR-swizzled (cp.async), HD * 2 + 16 padded (BULK).
template <int HD, int VAR>
__host__ __device__ constexpr int row_pitch() {
  return Cfg<HD, VAR>::BULK ? HD * 2 + 16 : HD * 2;
}
template <int HD, int VAR>
__host__ __device__ constexpr size_t pipe_bytes() {
  return size_t(16) * row_pitch<HD, VAR>() +
         size_t(Cfg<HD, VAR>::STAGES) * 2 * (16 * Cfg<HD, VAR>::WARPS) * row_pitch<HD, VAR>();
}
// Row stride (floats) of the end-of-CTA combine buffer: HD + 8, so the 8 accumulator rows of a
// warp's float2 stores fall on different banks (a stride of HD put all of them on one bank: an
// 8-way conflict on 64 stores per thread; session 6).
template <int HD>
__host__ __device__ constexpr int obuf_stride() {
  return HD + 8;
}
// DYN: claimed chunk starts a warp keeps (>= STAGES + 1: the tile consumed, STAGES - 1 in
// flight, one looked up); a power of two.
constexpr int kDynRing = 8;
template <int HD, int VAR>
constexpr size_t smem_bytes() {
  // Q [16] rows + STAGES x (K, V) tiles of BN rows (+ the BULK mbarriers after them); the
  // end-of-CTA combine (WARPS x 16 x HD f32 + 2 x WARPS x 16 f32) reuses the pipeline bytes.
  constexpr size_t pipe = pipe_bytes<HD, VAR>();
  constexpr size_t comb = size_t(Cfg<HD, VAR>::WARPS) * 16 * (obuf_stride<HD>() + 2) * 4;
  static_assert(comb <= pipe, "the combine buffer stays clear of the mbarriers");
  // CLUSTER: the CTA's normalized rows [16][HD] f32 and their log-sum-exps [16] after it.
  static_assert(!kCluster<VAR> || comb + 16 * (HD + 1) * 4 <= pipe, "cluster result buffer");
  // DYN: after the pipeline bytes, the cluster's chunk counter (16 bytes, used in CTA 0) and each
  // warp's ring of kDynRing claimed chunk starts.
  return pipe + (Cfg<HD, VAR>::BULK ? 8 * Cfg<HD, VAR>::STAGES * Cfg<HD, VAR>::WARPS : 0) +
         (kDyn<VAR> ? 16 + 4 * kDynRing * Cfg<HD, VAR>::WARPS : 0);
}
static_assert(smem_bytes<256, 0>() <= 227 * 1024, "fits the opt-in shared memory");
static_assert(smem_bytes<256, 1>() <= 113 * 1024, "two CTAs per SM");
static_assert(smem_bytes<256, 4>() <= 227 * 1024, "fits the opt-in shared memory");
static_assert(smem_bytes<256, 5>() <= 113 * 1024, "two CTAs per SM");
static_assert(smem_bytes<256, 6>() <= 75 * 1024, "three CTAs per SM");
static_assert(smem_bytes<256, 7>() <= 113 * 1024, "two CTAs per SM");
static_assert(smem_bytes<128, 0>() <= 227 * 1024, "fits");
static_assert(smem_bytes<128, 1>() <= 113 * 1024, "two CTAs per SM");
static_assert(smem_bytes<128, 4>() <= 227 * 1024, "fits");
static_assert(smem_bytes<64, 0>() <= 227 * 1024, "fits");
static_assert(smem_bytes<256, 13>() <= 227 * 1024, "fits the opt-in shared memory");
static_assert(smem_bytes<128, 13>() <= 227 * 1024, "fits");
static_assert(Cfg<256, 13>::STAGES + 1 <= kDynRing && Cfg<128, 13>::STAGES + 1 <= kDynRing, "ring");
static_assert(Cfg<256, 15>::STAGES + 1 <= kDynRing && Cfg<128, 15>::STAGES + 1 <= kDynRing, "ring");
static_assert(smem_bytes<256, 15>() <= 75 * 1024, "15: three CTAs per SM as 3");

struct Args {
  const __nv_bfloat16* q;
  const __nv_bfloat16* k;
  const __nv_bfloat16* v;
  __nv_bfloat16* out;
  const int* seq_lens;
  const int* table;
  float* po;    // [N * T, HQ, S, HD] (num_splits > 1)
  float* plse;  // [N * T, HQ, S]
  int n_new;    // T
  int hq;
  int hkv;
  int group;  // G
  int page_size;
  int max_pages;
  int num_pages;
  int splits;
  int dyn_c;  // DYN: splits per cluster (a divisor of splits, 2..8); GDYN: = splits
  int dyn_region;  // GDYN: the counter region of this launch
  float scale_log2;  // scale * log2(e)
};

#ifdef DK_ATTN_DEC_BODY
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16-byte copy global -> shared; src_bytes = 0 writes zeros and reads nothing.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// d += a * b, m16n8k16, bf16 inputs, f32 accumulators.
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#if __CUDA_ARCH__ >= 900
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred P1;\n"
      "DK_DEC_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
      "@P1 bra DK_DEC_DONE;\n"
      "bra DK_DEC_WAIT;\n"
      "DK_DEC_DONE:\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
// One bulk copy global -> shared (the TMA engine), completion as bytes on `bar`.
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, uint32_t bytes,
                                          uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
#else
// The BULK variants are sm_90 only (the launcher runs sm_90 code only): stubs for other archs.
__device__ __forceinline__ void mbar_init(uint32_t, uint32_t) {}
__device__ __forceinline__ void mbar_wait(uint32_t, uint32_t) {}
#endif
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
#endif

#ifdef DK_ATTN_DEC_BODY
__device__ __forceinline__ unsigned long long dec_gtimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}
#endif

template <int HD, int VAR>
__global__ void __launch_bounds__(Cfg<HD, VAR>::WARPS * 32, 1) decode_kernel(const Args a) {
#ifdef DK_ATTN_DEC_BODY
  constexpr bool TL = kTl<VAR>;
  unsigned long long tl_entry = 0;
  if constexpr (TL) tl_entry = dec_gtimer();
  const uint32_t tl_lin = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
  auto tl_put = [&](int f, unsigned long long v) {
    if constexpr (TL) {
      if (threadIdx.x == 0 && tl_lin < uint32_t(kDecTlCtas)) {
        g_decode_tl[size_t(tl_lin) * kDecTlFields + f] = v;
      }
    }
  };
  constexpr int WARPS = Cfg<HD, VAR>::WARPS;
  constexpr int STAGES = Cfg<HD, VAR>::STAGES;
  constexpr int NT = WARPS * 32;
  constexpr int BN = 16 * WARPS;
  constexpr bool BULK = Cfg<HD, VAR>::BULK;
  constexpr int CH = HD / 8;  // 16-byte chunks per row
  constexpr int ROW_B = row_pitch<HD, VAR>();  // shared-memory row pitch
  constexpr int TILE_B = BN * ROW_B;
  static_assert(CH >= 8 && CH <= 32, "thread -> chunk mapping");
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t s_q = smem_u32(smem);
  const uint32_t s_kv = s_q + 16 * ROW_B;  // stage st: K at s_kv + 2 st TILE_B, V + TILE_B
  // BULK: mbarrier of (warp, stage) after the pipeline bytes.
  const uint32_t s_bar = s_q + uint32_t(pipe_bytes<HD, VAR>());
  // 16-byte chunk c of row r: XOR-swizzled (cp.async) or plain in a padded row (BULK).
  auto chunk_addr = [](uint32_t base, int r, int c) -> uint32_t {
    return base + r * ROW_B + ((BULK ? c : (c ^ (r & 7))) << 4);
  };

#if __CUDA_ARCH__ >= 900
  // The merge kernel (launched with programmatic stream serialization) may start its blocks once
  // every CTA of this grid is running; it waits for this grid's completion before reading.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  // This grid may itself be launched as a programmatic dependent of the previous kernel on the
  // stream (session 5, the one-CTA-per-SM tiles): its CTAs may then start while that kernel
  // finishes; nothing global is read before that kernel completed and its writes are visible
  // (without the launch attribute this wait returns at once).
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
  if constexpr (TL) {
    tl_put(1, tl_entry);
    tl_put(2, dec_gtimer());
  }
  const int n = blockIdx.x;
  const int kvh = blockIdx.y;
  const int split = blockIdx.z;
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int T = a.n_new;
  const int G = a.group;
  const int rows_m = G * T;
  const int seq_len = a.seq_lens[n];
  // ST: the page-table entries of this split's first STAGES tiles (tiles split + st * S), loaded
  // before seq_len is used (the loads go out together); positions past the table row are skipped
  // here, those >= seq_len dropped below once seq_len is known.
  constexpr bool ST = kSt<VAR>;
  constexpr bool STE = kSte<VAR>;
  // Stages looked up at entry (STE: tile 0 only; its stride needs seq_len).
  constexpr int EARLY = ST ? (STE ? 1 : Cfg<HD, VAR>::STAGES) : 1;
  [[maybe_unused]] int st_pages[EARLY];
  [[maybe_unused]] int st_slots[EARLY];
  if constexpr (ST) {
    const int* table_row = a.table + int64_t(n) * a.max_pages;
    const int ps = a.page_size;
    const int64_t cap = int64_t(a.max_pages) * ps;
#pragma unroll
    for (int st = 0; st < EARLY; ++st) {
      const int64_t p64 = (int64_t(split) + int64_t(st) * a.splits) * BN + warp * 16 + (lane & 15);
      st_pages[st] = -1;
      st_slots[st] = 0;
      if (lane < 16 && p64 < cap) {
        const int pos = int(p64);
        const int pi = pos / ps;
        st_slots[st] = pos - pi * ps;
        st_pages[st] = __ldg(table_row + pi);
      }
    }
  }
  constexpr bool DYN = kDyn<VAR>;
  [[maybe_unused]] constexpr bool GDYN = kGdyn<VAR>;
  int lo = 0;
  int hi = 0;
  if constexpr (ST) {
    hi = seq_len > 0 ? seq_len : 0;  // ST: every split spans the whole context, strided
  } else if (seq_len > 0) {
    const int tiles = (seq_len + BN - 1) / BN;
    const int per = (tiles + a.splits - 1) / a.splits;
    // DYN: the cluster of splits [C g, C g + C) shares the union of their static ranges, claimed
    // chunk by chunk (ntiles below: 1 = has work).
    const int first = DYN ? split - split % a.dyn_c : split;
    const int cnt = DYN ? a.dyn_c : 1;
    lo = min(first * per * BN, seq_len);
    hi = min(lo + cnt * per * BN, seq_len);
  }
  // ST: tiles split, split + S, ... below ceil(seq_len / BN).
  // STE: the stride is the contiguous split's live split count L (splits >= L empty).
  [[maybe_unused]] int ste_l = 1;
  if constexpr (STE) {
    const int tiles = (hi + BN - 1) / BN;
    const int per = (tiles + a.splits - 1) / a.splits;
    ste_l = per > 0 ? (tiles + per - 1) / per : 1;
  }
  // ST / STE: this split's tiles among the ceil(hi / BN) of the context, every stride-th from tile
  // `split` (stride S, or L under STE, where splits >= L have none).
  const int ctx_tiles = (hi + BN - 1) / BN;
  const int stride = STE ? ste_l : a.splits;
  const int ntiles = ST ? (ctx_tiles > split && (!STE || split < ste_l) ? (ctx_tiles - split + stride - 1) / stride : 0)
                        : (hi > lo ? (DYN ? 1 : (hi - lo + BN - 1) / BN) : 0);
  // ST: first position of this split's tile i (int64: S * BN may be large), clamped to hi so that
  // a look-ahead past the last tile stays in int range and loads nothing.
  [[maybe_unused]] auto st_tile0 = [&](int i) -> int {
    const int64_t p = (int64_t(split) + int64_t(i) * stride) * BN;
    return p < int64_t(hi) ? int(p) : hi;
  };
  if constexpr (TL) {
    uint32_t sm;
    asm volatile("mov.u32 %0, %%smid;\n" : "=r"(sm));
    tl_put(0, sm | (static_cast<unsigned long long>(ntiles) << 32));
  }
  const int64_t q_tok0 = int64_t(n) * T;  // first new-token row of this row
  // Packed row r -> (t, head) -> the q/out row (q_tok0 + t) * HQ + kvh * G + g.
  auto qrow = [&](int r) -> int64_t {
    return (q_tok0 + r / G) * a.hq + int64_t(kvh) * G + r % G;
  };

  // Q: 16 packed rows, rows >= G * T zero (its own cp.async group, waited for by the whole CTA).
  for (int i = tid; i < 16 * CH; i += NT) {
    const int r = i / CH;
    const int c = i % CH;
    const bool ok = r < rows_m && ntiles > 0;
    const __nv_bfloat16* src = ok ? a.q + qrow(r) * HD + c * 8 : a.q;
    cp_async_16(chunk_addr(s_q, r, c), src, ok ? 16u : 0u);
  }
  cp_async_commit();
  // DYN: the chunk counter of this (row, kv head) lives in the shared memory of the cluster's CTA
  // 0 (zeroed there, then a cluster barrier before any claim); each warp's ring of claimed chunk
  // starts in its own CTA. Chunks are 16 positions: chunk c = [16 c, 16 c + 16).
  [[maybe_unused]] const uint32_t s_dyn = s_q + uint32_t(pipe_bytes<HD, VAR>());
  int* dyn_ring = reinterpret_cast<int*>(smem + pipe_bytes<HD, VAR>() + 16) + warp * kDynRing;
  [[maybe_unused]] uint32_t dyn_ctr = 0;  // the counter's shared::cluster address
  const uint32_t dyn_chunks = hi > lo ? uint32_t(hi - lo + 15) / 16u : 0u;
  // GDYN: this (row, kv head)'s claim and done words in the launch's region.
  [[maybe_unused]] unsigned int* gdyn_ctr =
      g_dec_gdyn + 2 * (size_t(a.dyn_region) * kGdynGroups + size_t(n) * a.hkv + kvh);
  // HYB: the static prefix (P chunks, a multiple of the group's W warps) and this warp's next
  // static chunk (lane 0's count k: chunk k W + g).
  [[maybe_unused]] const uint32_t hyb_w = uint32_t(a.splits) * uint32_t(WARPS);
  [[maybe_unused]] const uint32_t hyb_p = (dyn_chunks * 3u / 4u) / hyb_w * hyb_w;
  [[maybe_unused]] const uint32_t hyb_g = uint32_t(split) * uint32_t(WARPS) + uint32_t(warp);
  [[maybe_unused]] uint32_t hyb_k = 0;
#if __CUDA_ARCH__ >= 900
  if constexpr (DYN && !GDYN) {
    uint32_t rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
    if (rank == 0 && tid == 0) {
      asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(s_dyn), "r"(0u) : "memory");
    }
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::
                     : "memory");
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(dyn_ctr) : "r"(s_dyn), "r"(0));
  }
#endif
  // DYN: lane 0 claims the next chunk (the raw counter value, in lane 0 only) ...
  auto dyn_claim = [&]() -> uint32_t {
    uint32_t c = 0;
#if __CUDA_ARCH__ >= 900
    if (lane == 0) {
      if constexpr (kHyb<VAR>) {
        if (hyb_k * hyb_w < hyb_p) {
          c = hyb_k * hyb_w + hyb_g;
          ++hyb_k;
        } else {
          asm volatile("atom.relaxed.gpu.global.add.u32 %0, [%1], 1;\n"
                       : "=r"(c)
                       : "l"(gdyn_ctr)
                       : "memory");
          c += hyb_p;
        }
      } else if constexpr (GDYN) {
        asm volatile("atom.relaxed.gpu.global.add.u32 %0, [%1], 1;\n"
                     : "=r"(c)
                     : "l"(gdyn_ctr)
                     : "memory");
      } else {
        asm volatile("atom.shared::cluster.add.u32 %0, [%1], 1;\n" : "=r"(c) : "r"(dyn_ctr) : "memory");
      }
    }
#endif
    return c;
  };
  // ... and the warp turns it into the chunk's first position (hi = none left).
  auto dyn_start = [&](uint32_t raw) -> int {
    const uint32_t c = __shfl_sync(0xffffffffu, raw, 0);
    return c < dyn_chunks ? lo + int(c) * 16 : hi;
  };
  // Each warp loads exactly the 16 positions of every tile it consumes ([16 w, 16 w + 16)), so the
  // warps of a CTA run decoupled (per-warp waits, __syncwarp; no CTA barrier per tile). Lane j < 16
  // looks up the page of position j of the warp's slice one tile ahead (pf_page / pf_slot, the
  // load in flight while the current tile is consumed); the copies take the cache row by shuffle.
  const int* table_row = a.table + int64_t(n) * a.max_pages;
  const int ps = a.page_size;
  int pf_page = -1;
  int pf_slot = 0;
  // `start`: the first of the warp's 16 positions (static: tile start + 16 warp).
  auto prefetch = [&](int start) {
    const int pos = start + (lane & 15);
    pf_page = -1;
    pf_slot = 0;
    if ((BULK || lane < 16) && pos < hi) {
      const int pi = pos / ps;
      pf_slot = pos - pi * ps;
      pf_page = __ldg(table_row + pi);
    }
  };
  constexpr int LPR = 32 / CH < 1 ? 1 : 32 / CH;  // rows a warp covers per copy instruction
  constexpr int KPASS = 16 / LPR;                 // copy instructions per tensor per tile
  static_assert(CH <= 32 || CH % 32 == 0, "chunk mapping");
  auto issue = [&](int stage) {
    const int cr = (pf_page >= 0 && pf_page < a.num_pages) ? pf_page * ps + pf_slot : -1;
    const uint32_t sk = s_kv + stage * 2 * TILE_B;
#pragma unroll
    for (int k = 0; k < KPASS; ++k) {
      const int sub = lane / CH + k * LPR;  // CH <= 32 here (HD <= 256)
      const int crow = __shfl_sync(0xffffffffu, cr, sub);
      const int c = lane % CH;
      const int r = warp * 16 + sub;
      const bool ok = crow >= 0;
      const int64_t off = ok ? (int64_t(crow) * a.hkv + kvh) * HD + c * 8 : int64_t(0);
      const uint32_t dst = chunk_addr(sk, r, c);
      cp_async_16(dst, a.k + off, ok ? 16u : 0u);
      cp_async_16(dst + TILE_B, a.v + off, ok ? 16u : 0u);
    }
  };
#if __CUDA_ARCH__ >= 900
  // BULK: lane j < 16 copies K row j of the warp's slice, lane 16 + j V row j (HD * 2 bytes each);
  // lane 0 announces the bytes on the (warp, stage) mbarrier. Rows past the split end are not
  // copied (their scores are masked; their V rows hold earlier, finite values, zero at first).
  auto issue_bulk = [&](int stage) {
    const bool ok = pf_page >= 0 && pf_page < a.num_pages;
    const unsigned rows = __ballot_sync(0xffffffffu, ok) & 0xffffu;
    const uint32_t bar = s_bar + 8 * (warp * STAGES + stage);
    __syncwarp();
    fence_proxy_async();  // the warp's earlier ldmatrix reads of this stage before the overwrite
    if (lane == 0) mbar_arrive_expect_tx(bar, uint32_t(__popc(rows)) * 2u * uint32_t(HD * 2));
    if (ok) {
      const int64_t crow = int64_t(pf_page) * ps + pf_slot;
      const __nv_bfloat16* src = (lane < 16 ? a.k : a.v) + (crow * a.hkv + kvh) * HD;
      const uint32_t dst = s_kv + stage * 2 * TILE_B + (lane < 16 ? 0 : TILE_B) +
                           (warp * 16 + (lane & 15)) * ROW_B;
      bulk_copy(dst, src, HD * 2, bar);
    }
  };
#else
  auto issue_bulk = [&](int) {};
#endif
  if constexpr (BULK) {
#if __CUDA_ARCH__ >= 900
    if (lane == 0) {
      for (int st = 0; st < STAGES; ++st) mbar_init(s_bar + 8 * (warp * STAGES + st), 1);
    }
    // Zero V rows once: a partial last tile leaves rows uncopied, and P = 0 times a NaN bit
    // pattern would poison the output.
    for (int i = tid; i < STAGES * TILE_B / 16; i += NT) {
      const int st = i / (TILE_B / 16);
      const int j = i % (TILE_B / 16);
      *reinterpret_cast<uint4*>(smem + (s_kv - s_q) + st * 2 * TILE_B + TILE_B + j * 16) =
          make_uint4(0u, 0u, 0u, 0u);
    }
    fence_proxy_async();
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    __syncthreads();
#endif
  }
  // The page lookups of the first STAGES tiles all in flight together (one table latency before
  // the first copies instead of one per prologue tile), then the copies of the first STAGES - 1.
  int pf_pages[STAGES];
  int pf_slots[STAGES];
  int pf_starts[STAGES];
#pragma unroll
  for (int st = 0; st < STAGES; ++st) {
    if constexpr (DYN) {
      pf_starts[st] = dyn_start(dyn_claim());
      if (lane == 0) dyn_ring[st] = pf_starts[st];
    } else if constexpr (ST) {
      pf_starts[st] = st_tile0(st) + warp * 16;
    } else {
      pf_starts[st] = lo + st * BN + warp * 16;
    }
    if constexpr (ST) {
      if (st < EARLY) {
        // Looked up at entry; positions >= seq_len dropped now.
        const bool in = int64_t(split + int64_t(st) * a.splits) * BN + warp * 16 + (lane & 15) < int64_t(hi);
        pf_pages[st] = in ? st_pages[st] : -1;
        pf_slots[st] = st_slots[st];
      } else {
        prefetch(pf_starts[st]);  // STE: stages >= 1 after seq_len
        pf_pages[st] = pf_page;
        pf_slots[st] = pf_slot;
      }
    } else {
      prefetch(pf_starts[st]);
      pf_pages[st] = pf_page;
      pf_slots[st] = pf_slot;
    }
  }
#pragma unroll
  for (int st = 0; st < STAGES - 1; ++st) {
    if (DYN ? pf_starts[st] < hi : st < ntiles) {
      pf_page = pf_pages[st];
      pf_slot = pf_slots[st];
      if constexpr (BULK) {
        issue_bulk(st);
      } else {
        issue(st);
      }
    }
    if constexpr (!BULK) cp_async_commit();  // group 1 + st; empty groups keep the count uniform
  }
  pf_page = pf_pages[STAGES - 1];  // the lookup of tile STAGES - 1, issued first in the loop
  pf_slot = pf_slots[STAGES - 1];
  int pf_start = pf_starts[STAGES - 1];
  // DYN: the claim of tile STAGES in flight (lane 0; its result is first used an iteration later).
  uint32_t dyn_next = 0;
  if constexpr (DYN) dyn_next = dyn_claim();
  if constexpr (BULK) {
    cp_async_wait<0>();
  } else {
    cp_async_wait<STAGES - 1>();
  }
  __syncthreads();  // Q landed for every thread
  if constexpr (TL) tl_put(3, dec_gtimer());

  // Per-lane ldmatrix addresses (byte offsets inside a Q / K / V tile; chunk XOR-ed per kk).
  const int g8 = lane & 7;
  const int mi = lane >> 3;
  // Q (A operand): matrices (rows 0-7, k lo), (rows 8-15, k lo), (rows 0-7, k hi), (8-15, hi).
  const int q_r = g8 + (mi & 1) * 8;
  const uint32_t q_base = s_q + q_r * ROW_B;
  const int q_x = BULK ? 0 : q_r & 7;
  const int q_c = mi >> 1;
  // K (B operand, non-transposed): matrices (n-tile 0, k lo), (0, hi), (1, lo), (1, hi).
  const int k_r = warp * 16 + (mi >> 1) * 8 + g8;
  const uint32_t k_off = k_r * ROW_B;
  const int k_x = BULK ? 0 : k_r & 7;
  const int k_c = mi & 1;
  // V (B operand, transposed): matrices (pos 0-7, dims 8j..), (pos 8-15, 8j..), (0-7, 8j+8..),
  // (8-15, 8j+8..).
  const int v_r = warp * 16 + (mi & 1) * 8 + g8;
  const uint32_t v_off = v_r * ROW_B;
  const int v_x = BULK ? 0 : v_r & 7;
  const int v_c = mi >> 1;

  const int qd = lane & 3;   // quad lane: columns 2 qd, 2 qd + 1 of each n8 tile
  const int r0 = lane >> 2;  // accumulator rows r0 and r0 + 8
  // Causal limit of packed rows r0 / r0 + 8 (T > 1): new token t sees positions <= seq_len - T + t.
  const int lim0 = seq_len - T + (r0 < rows_m ? r0 / G : 0);
  const int lim1 = seq_len - T + (r0 + 8 < rows_m ? (r0 + 8) / G : 0);
  float m_run[2] = {-INFINITY, -INFINITY};
  float l_run[2] = {0.f, 0.f};
  float acc[HD / 8][4];
#pragma unroll
  for (int j = 0; j < HD / 8; ++j) {
    acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  }

  for (int it = 0; DYN || it < ntiles; ++it) {
    int ws0 = 0;  // DYN: the first of the warp's 16 positions in this tile
    if constexpr (DYN) {
      cp_async_wait<STAGES - 2>();
      __syncwarp();  // the chunk of tile `it` landed; the ring slot of tile it - 1 is free
      ws0 = dyn_ring[it & (kDynRing - 1)];
      if (ws0 >= hi) break;  // claims are increasing per warp: no later chunk either
      if (pf_start < hi) {
        issue((it + STAGES - 1) % STAGES);
        pf_start = dyn_start(dyn_next);  // tile it + STAGES
        if (lane == 0) dyn_ring[(it + STAGES) & (kDynRing - 1)] = pf_start;
        prefetch(pf_start);
        dyn_next = dyn_claim();  // tile it + STAGES + 1
      }
      cp_async_commit();
    } else if constexpr (BULK) {
      mbar_wait(s_bar + 8 * (warp * STAGES + it % STAGES), uint32_t(it / STAGES) & 1u);
      if (it + STAGES - 1 < ntiles) {
        issue_bulk((it + STAGES - 1) % STAGES);
        prefetch(lo + (it + STAGES) * BN + warp * 16);
      }
    } else {
      cp_async_wait<STAGES - 2>();
      __syncwarp();  // the warp's slice of tile `it` landed; its slice of stage (it-1) % S is free
      if (it + STAGES - 1 < ntiles) {
        issue((it + STAGES - 1) % STAGES);
        prefetch(ST ? st_tile0(it + STAGES) + warp * 16 : lo + (it + STAGES) * BN + warp * 16);
      }
      cp_async_commit();
    }
    const uint32_t sk = s_kv + (it % STAGES) * 2 * TILE_B;
    const uint32_t sv = sk + TILE_B;
    const int tile0 = ST ? st_tile0(it) : lo + it * BN;
    // S = Q K^T over the warp's 16 positions (two n8 tiles).
    float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      uint32_t qa[4];
      uint32_t kb[4];
      ldsm_x4(qa, q_base + (((2 * kk + q_c) ^ q_x) << 4));
      ldsm_x4(kb, sk + k_off + (((2 * kk + k_c) ^ k_x) << 4));
      mma_16816(s[0], qa, kb[0], kb[1]);
      mma_16816(s[1], qa, kb[2], kb[3]);
    }
    // Scale to exp2 units and mask.
    const int pbase = (DYN ? ws0 : tile0 + warp * 16) + 2 * qd;
    const bool need_mask = DYN ? ws0 + 16 > hi || ws0 + 16 > seq_len - T + 1
                               : tile0 + BN > hi || tile0 + BN > seq_len - T + 1;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[nt][e] * a.scale_log2;
        if (need_mask) {
          const int pos = pbase + nt * 8 + (e & 1);
          const int lim = e < 2 ? lim0 : lim1;
          if (pos >= hi || pos > lim) x = -INFINITY;
        }
        s[nt][e] = x;
      }
    }
    // Online softmax per accumulator row (h = 0: row r0, h = 1: row r0 + 8).
    float alpha[2];
    bool grew = false;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = fmaxf(fmaxf(s[0][2 * h], s[0][2 * h + 1]), fmaxf(s[1][2 * h], s[1][2 * h + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m_run[h], mx);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;
      alpha[h] = fast_exp2(m_run[h] - m_use);
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        s[nt][2 * h] = fast_exp2(s[nt][2 * h] - m_use);
        s[nt][2 * h + 1] = fast_exp2(s[nt][2 * h + 1] - m_use);
        sum += s[nt][2 * h] + s[nt][2 * h + 1];
      }
      l_run[h] = l_run[h] * alpha[h] + sum;
      grew |= m_new != m_run[h];
      m_run[h] = m_new;
    }
    uint32_t pa[4];
    pa[0] = pack_bf16(s[0][0], s[0][1]);
    pa[1] = pack_bf16(s[0][2], s[0][3]);
    pa[2] = pack_bf16(s[1][0], s[1][1]);
    pa[3] = pack_bf16(s[1][2], s[1][3]);
    // O rescale only when a running max of the warp changed (rare after the first tiles).
    if (__any_sync(0xffffffffu, grew)) {
#pragma unroll
      for (int j = 0; j < HD / 8; ++j) {
        acc[j][0] *= alpha[0];
        acc[j][1] *= alpha[0];
        acc[j][2] *= alpha[1];
        acc[j][3] *= alpha[1];
      }
    }
    // O += P V: two n8 tiles of head dims per ldmatrix.x4.trans.
#pragma unroll
    for (int j2 = 0; j2 < HD / 16; ++j2) {
      uint32_t vb[4];
      ldsm_x4_t(vb, sv + v_off + (((2 * j2 + v_c) ^ v_x) << 4));
      mma_16816(acc[2 * j2], pa, vb[0], vb[1]);
      mma_16816(acc[2 * j2 + 1], pa, vb[2], vb[3]);
    }
  }
  cp_async_wait<0>();
#if __CUDA_ARCH__ >= 900
  // DYN: no more claims from this CTA; CTA 0's counter stays alive until every CTA arrived (the
  // wait at the end).
  if constexpr (DYN && !GDYN) asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
  // GDYN: every claim of this warp performed before the CTA counts itself done (below).
  if constexpr (GDYN) {
    if (lane == 0) __threadfence();
  }
#endif
  __syncthreads();  // every warp done with the pipeline bytes: reuse them for the combine
#if __CUDA_ARCH__ >= 900
  if constexpr (GDYN) {
    // The group's last CTA (all others done: no claim of this launch is left) puts the claim and
    // done words back to zero for the next launch that takes this region.
    if (tid == 0) {
      const unsigned int old = atomicAdd(gdyn_ctr + 1, 1u);
      if (old == unsigned(a.splits) - 1u) {
        __threadfence();
        atomicExch(gdyn_ctr, 0u);
        atomicExch(gdyn_ctr + 1, 0u);
      }
    }
  }
#endif
  if constexpr (TL) tl_put(4, dec_gtimer());

  // Combine the warps' partial results: M = max_w m_w, L = sum_w l_w 2^(m_w - M).
  float* red_m = reinterpret_cast<float*>(smem);  // [WARPS][16]
  float* red_l = red_m + WARPS * 16;               // [WARPS][16]
  float* obuf = red_l + WARPS * 16;                // [WARPS][16][OBS]
  constexpr int OBS = obuf_stride<HD>();
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 1);
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 2);
  }
  if (qd == 0) {
    red_m[warp * 16 + r0] = m_run[0];
    red_m[warp * 16 + r0 + 8] = m_run[1];
    red_l[warp * 16 + r0] = l_run[0];
    red_l[warp * 16 + r0 + 8] = l_run[1];
  }
  __syncthreads();
  auto row_max = [&](int r) {
    float m = -INFINITY;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) m = fmaxf(m, red_m[w * 16 + r]);
    return m;
  };
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    // LE: rows >= G * T are padding (never read below): rows 8..15 skipped by the whole warp when
    // G * T <= 8, the others per lane.
    if constexpr (kLe<VAR>) {
      if (8 * h >= rows_m) continue;
    }
    const float big = row_max(r0 + 8 * h);
    const float f = m_run[h] == -INFINITY ? 0.f : fast_exp2(m_run[h] - big);
    float* dst = obuf + (warp * 16 + r0 + 8 * h) * OBS + 2 * qd;
    if (!kLe<VAR> || r0 + 8 * h < rows_m) {
#pragma unroll
      for (int j = 0; j < HD / 8; ++j) {
        *reinterpret_cast<float2*>(dst + 8 * j) = make_float2(acc[j][2 * h] * f, acc[j][2 * h + 1] * f);
      }
    }
  }
  __syncthreads();
  const bool direct = a.splits == 1;
  // CLUSTER (2..8 splits): this CTA's normalized rows and log-sum-exps stay in shared memory.
  constexpr bool CL = kCluster<VAR>;
  float* cres_o = red_m + WARPS * 16 * (OBS + 2);  // [16][HD]
  float* cres_lse = cres_o + 16 * HD;              // [16]
  for (int i = tid; i < rows_m * (HD / 4); i += NT) {
    const int r = i / (HD / 4);
    const int c4 = i % (HD / 4);
    const float big = row_max(r);
    float tot = 0.f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) {
      const float mw = red_m[w * 16 + r];
      tot += mw == -INFINITY ? 0.f : red_l[w * 16 + r] * fast_exp2(mw - big);
    }
    float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int w = 0; w < WARPS; ++w) {
      const float4 x = *reinterpret_cast<const float4*>(obuf + (w * 16 + r) * OBS + 4 * c4);
      o.x += x.x;
      o.y += x.y;
      o.z += x.z;
      o.w += x.w;
    }
    const float inv = tot > 0.f ? 1.f / tot : 0.f;
    o.x *= inv;
    o.y *= inv;
    o.z *= inv;
    o.w *= inv;
    const int64_t orow = qrow(r);
    if (direct) {
      uint2 pk;
      pk.x = pack_bf16(o.x, o.y);
      pk.y = pack_bf16(o.z, o.w);
      *reinterpret_cast<uint2*>(a.out + orow * HD + 4 * c4) = pk;
    } else if (CL) {
      *reinterpret_cast<float4*>(cres_o + r * HD + 4 * c4) = o;
      if (c4 == 0) cres_lse[r] = tot > 0.f ? big + log2f(tot) : -INFINITY;
    } else {
      const int64_t part = orow * a.splits + split;
      *reinterpret_cast<float4*>(a.po + part * HD + 4 * c4) = o;
      if (c4 == 0) a.plse[part] = tot > 0.f ? big + log2f(tot) : -INFINITY;
    }
  }
  if constexpr (TL) {
    __syncthreads();
    tl_put(5, dec_gtimer());
  }
#if __CUDA_ARCH__ >= 900
  if constexpr (CL) {
    if (!direct) {
      // The cluster's CTAs are the splits of this (row, kv head) (cluster dims 1 x 1 x splits):
      // after a cluster barrier CTA k combines column slice k of every row from all of them
      // through distributed shared memory (the merge kernel's math), then a second barrier keeps
      // every CTA's buffers alive until the others finished reading them.
      asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::
                       : "memory");
      uint32_t rank;
      asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
      const int S = a.splits;
      const uint32_t lse_local = smem_u32(cres_lse);
      const uint32_t o_local = smem_u32(cres_o);
      auto remote = [](uint32_t addr, int cta) {
        uint32_t r;
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(cta));
        return r;
      };
      for (int i = int(rank) * NT + tid; i < rows_m * (HD / 4); i += S * NT) {
        const int r = i / (HD / 4);
        const int c4 = i % (HD / 4);
        float lse[8];
        float big = -INFINITY;
#pragma unroll
        for (int sp = 0; sp < 8; ++sp) {
          lse[sp] = -INFINITY;
          if (sp < S) {
            asm volatile("ld.shared::cluster.f32 %0, [%1];\n"
                         : "=f"(lse[sp])
                         : "r"(remote(lse_local + uint32_t(r) * 4u, sp))
                         : "memory");
          }
          big = fmaxf(big, lse[sp]);
        }
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
        float wsum = 0.f;
#pragma unroll
        for (int sp = 0; sp < 8; ++sp) {
          if (sp < S && lse[sp] != -INFINITY) {
            const float wgt = exp2f(lse[sp] - big);
            float4 x;
            asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                         : "=f"(x.x), "=f"(x.y), "=f"(x.z), "=f"(x.w)
                         : "r"(remote(o_local + uint32_t(r * HD + 4 * c4) * 4u, sp))
                         : "memory");
            acc.x += wgt * x.x;
            acc.y += wgt * x.y;
            acc.z += wgt * x.z;
            acc.w += wgt * x.w;
            wsum += wgt;
          }
        }
        const float inv = wsum > 0.f ? 1.f / wsum : 0.f;
        uint2 pk;
        pk.x = pack_bf16(acc.x * inv, acc.y * inv);
        pk.y = pack_bf16(acc.z * inv, acc.w * inv);
        *reinterpret_cast<uint2*>(a.out + qrow(r) * HD + 4 * c4) = pk;
      }
      asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::
                       : "memory");
    }
  }
  if constexpr (DYN && !GDYN) asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#endif
#endif  // DK_ATTN_DEC_BODY
}

// Combines the splits of one (token, head): out = sum_s 2^(lse_s - M) o_s / sum_s 2^(lse_s - M)
// over the splits with a finite lse (none: zero output, the padding rows). HD / 4 threads.
template <int HD, bool TL = false>
__global__ void __launch_bounds__(HD / 4) decode_merge_kernel(const float* __restrict__ po,
                                                             const float* __restrict__ plse,
                                                             __nv_bfloat16* __restrict__ out,
                                                             int splits) {
#ifdef DK_ATTN_DEC_BODY
  unsigned long long* tl = g_decode_tl + size_t(kDecTlCtas + blockIdx.x) * kDecTlFields;
  const bool tl_on = TL && threadIdx.x == 0 && blockIdx.x < unsigned(kDecTlCtas);
  if (tl_on) tl[0] = dec_gtimer();
#if __CUDA_ARCH__ >= 900
  // Launched as a programmatic dependent of decode_kernel: wait until it completed and its
  // partials are visible. The next decode call (itself a programmatic dependent) may launch its
  // CTAs as soon as every merge block runs; it waits for this grid's completion before reading.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
  if (tl_on) tl[1] = dec_gtimer();
  const int64_t row = blockIdx.x;  // (token, head)
  const float* lse = plse + row * splits;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  float wsum = 0.f;
  constexpr int kUpTo = 8;
  if (splits <= kUpTo) {
    // Every log-sum-exp and partial row loaded before any is used: one round trip, not two.
    float l[kUpTo];
    float4 x[kUpTo];
    float big = -INFINITY;
#pragma unroll
    for (int s = 0; s < kUpTo; ++s) {
      if (s < splits) {
        l[s] = lse[s];
        x[s] = *reinterpret_cast<const float4*>(po + (row * splits + s) * HD + 4 * threadIdx.x);
        big = fmaxf(big, l[s]);
      }
    }
#pragma unroll
    for (int s = 0; s < kUpTo; ++s) {
      if (s < splits && l[s] != -INFINITY) {
        const float w = exp2f(l[s] - big);
        acc.x += w * x[s].x;
        acc.y += w * x[s].y;
        acc.z += w * x[s].z;
        acc.w += w * x[s].w;
        wsum += w;
      }
    }
    const float inv = wsum > 0.f ? 1.f / wsum : 0.f;
    uint2 pk;
    pk.x = pack_bf16(acc.x * inv, acc.y * inv);
    pk.y = pack_bf16(acc.z * inv, acc.w * inv);
    *reinterpret_cast<uint2*>(out + row * HD + 4 * threadIdx.x) = pk;
    if (tl_on) tl[2] = dec_gtimer();
    return;
  }
  float big = -INFINITY;
  for (int s = 0; s < splits; ++s) big = fmaxf(big, lse[s]);
  for (int s = 0; s < splits; ++s) {
    const float l = lse[s];
    if (l == -INFINITY) continue;
    const float w = exp2f(l - big);
    const float4 x = *reinterpret_cast<const float4*>(po + (row * splits + s) * HD + 4 * threadIdx.x);
    acc.x += w * x.x;
    acc.y += w * x.y;
    acc.z += w * x.z;
    acc.w += w * x.w;
    wsum += w;
  }
  const float inv = wsum > 0.f ? 1.f / wsum : 0.f;
  uint2 pk;
  pk.x = pack_bf16(acc.x * inv, acc.y * inv);
  pk.y = pack_bf16(acc.z * inv, acc.w * inv);
  *reinterpret_cast<uint2*>(out + row * HD + 4 * threadIdx.x) = pk;
  if (tl_on) tl[2] = dec_gtimer();
#endif
}

// Whether the kernels run from sm_90 code on the current device (not a JIT of a lower arch's
// PTX, whose body is empty). Cached per device.
template <int HD, int VAR>
dk_status prepare(int dev) {
  static std::atomic<int> state[64];  // 0 unknown, 1 ready, 2 unsupported (zero-initialized)
  if (dev < 0 || dev >= 64) return DK_ERR_NO_KERNEL_IMAGE;
  if (state[dev].load(std::memory_order_acquire) == 0) {
    cudaFuncAttributes attr;
    cudaFuncAttributes mattr;
    if (cudaFuncGetAttributes(&attr, decode_kernel<HD, VAR>) != cudaSuccess ||
        cudaFuncGetAttributes(&mattr, decode_merge_kernel<HD>) != cudaSuccess) {
      (void)cudaGetLastError();
      state[dev] = 2;
    } else if (attr.binaryVersion != 90 || attr.ptxVersion < 80) {
      state[dev] = 2;
    } else if (cudaFuncSetAttribute(decode_kernel<HD, VAR>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(smem_bytes<HD, VAR>())) != cudaSuccess) {
      (void)cudaGetLastError();
      state[dev] = 2;
    } else {
      state[dev] = 1;
    }
  }
  return state[dev].load(std::memory_order_acquire) == 1 ? DK_OK : DK_ERR_NO_KERNEL_IMAGE;
}

// DYN: how many clusters of `c` CTAs (along z) of decode_kernel<HD, VAR> the device `dev` runs at
// once (cudaOccupancyMaxActiveClusters; 0 if unknown). Cached per device and c; call after
// prepare<HD, VAR>(dev) (the shared-memory attribute).
template <int HD, int VAR>
int max_clusters(int dev, int c) {
  static std::atomic<int> cache[64][9];  // value + 1; 0 = not queried (zero-initialized)
  if (dev < 0 || dev >= 64 || c < 1 || c > 8) return 0;
  int v = cache[dev][c].load(std::memory_order_relaxed);
  if (v == 0) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(1, 1, unsigned(c));
    cfg.blockDim = dim3(Cfg<HD, VAR>::WARPS * 32);
    cfg.dynamicSmemBytes = smem_bytes<HD, VAR>();
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = 1;
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = unsigned(c);
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    int n = 0;
    if (cudaOccupancyMaxActiveClusters(&n, decode_kernel<HD, VAR>, &cfg) != cudaSuccess) {
      (void)cudaGetLastError();
      n = 0;
    }
    v = n + 1;
    cache[dev][c].store(v, std::memory_order_relaxed);
  }
  return v - 1;
}

// GDYN: the counter region of the next launch (one ticket for every head dim and variant, so
// launches in flight together on different streams take different regions).
inline int gdyn_region() {
  static std::atomic<unsigned> ticket{0};
  return int(ticket.fetch_add(1u, std::memory_order_relaxed) % unsigned(kGdynRegions));
}

template <int HD, int VAR>
dk_status launch(const DkAttnDecodeSm90Params& p, cudaStream_t stream) {
  if constexpr (kCluster<VAR>) {
    // Clusters of at most 8 CTAs (the portable limit): more splits run the plain tiles.
    if (p.num_splits > 8) return launch<HD, VAR - 8>(p, stream);
  }
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    set_last_cuda_error(static_cast<int>(cudaGetLastError()));
    return DK_ERR_CUDA;
  }
  int dyn_c = 0;
  int dyn_region = 0;
  if constexpr (kGdyn<VAR>) {
    // All splits of a (row, kv head) share its range; one split or more (row, kv head) pairs
    // than a region holds: the static ranges of the same tiles.
    if (p.num_splits < 2 || p.num_rows * p.n_kv_heads > kGdynGroups) {
      return launch<HD, kTileOf<VAR>>(p, stream);
    }
    dyn_region = gdyn_region();
    dyn_c = int(p.num_splits);
  } else if constexpr (kDyn<VAR>) {
    // The largest divisor C of the split count in 2..8 whose clusters of C CTAs all fit on the
    // device at once (clusters stay inside a GPC: at one 200 KB CTA per SM, 32 clusters of 4
    // did not fit an H200 in session 5); none (or one split): the static ranges of the same tiles.
    if (p.num_splits >= 2) {
      const dk_status st = prepare<HD, VAR>(dev);
      if (st != DK_OK) return st;
      const int64_t ctas = p.num_rows * p.n_kv_heads * p.num_splits;
      for (int c = 8; c >= 2 && dyn_c == 0; --c) {
        if (p.num_splits % c == 0 && ctas / c <= int64_t(max_clusters<HD, VAR>(dev, c))) dyn_c = c;
      }
    }
    // DELTAKIT_DECODE_DYN_LOG=1 (device runs): which path each launch took.
    static const bool log = dk::env_flag("DELTAKIT_DECODE_DYN_LOG");
    if (log) {
      std::fprintf(stderr, "attn.decode v13 hd %d: %lld CTAs, %lld splits -> clusters of %d (max clusters c=2..8:", HD,
                   static_cast<long long>(p.num_rows * p.n_kv_heads * p.num_splits),
                   static_cast<long long>(p.num_splits), dyn_c);
      for (int c = 2; c <= 8; ++c) std::fprintf(stderr, " %d", p.num_splits >= 2 ? max_clusters<HD, VAR>(dev, c) : -1);
      std::fprintf(stderr, ")\n");
    }
    if (dyn_c == 0) return launch<HD, kTileOf<VAR>>(p, stream);
  }
  const dk_status st = prepare<HD, VAR>(dev);
  if (st != DK_OK) return st;
  Args a;
  a.q = reinterpret_cast<const __nv_bfloat16*>(p.q);
  a.k = reinterpret_cast<const __nv_bfloat16*>(p.k_cache);
  a.v = reinterpret_cast<const __nv_bfloat16*>(p.v_cache);
  a.out = reinterpret_cast<__nv_bfloat16*>(p.out);
  a.seq_lens = reinterpret_cast<const int*>(p.seq_lens);
  a.table = reinterpret_cast<const int*>(p.page_table);
  const int64_t tok = p.num_rows * p.n_new;
  a.po = reinterpret_cast<float*>(p.workspace);
  a.plse = p.workspace == 0 ? nullptr : a.po + tok * p.n_q_heads * p.num_splits * HD;
  a.n_new = int(p.n_new);
  a.hq = int(p.n_q_heads);
  a.hkv = int(p.n_kv_heads);
  a.group = int(p.n_q_heads / p.n_kv_heads);
  a.page_size = int(p.page_size);
  a.max_pages = int(p.max_pages);
  a.num_pages = int(p.num_pages);
  a.splits = int(p.num_splits);
  a.dyn_c = dyn_c;
  a.dyn_region = dyn_region;
  a.scale_log2 = p.scale * 1.4426950408889634f;
  // Programmatic dependent of the previous kernel on the stream (its launch and CTA setup
  // overlap that kernel's tail; the kernel waits in griddepcontrol.wait before reading) -- only
  // for the tiles that fit one CTA per SM: with room for two or three, CTAs launched early sat
  // next to the previous call's CTAs and the grid ended unevenly spread (H200, session 5:
  // variant 3 at 256 CTAs 307 us instead of 245, back-to-back calls). For the CLUSTER variants
  // with 2..8 splits, one cluster per (row, kv head).
  constexpr bool kPdl = smem_bytes<HD, VAR>() > 114 * 1024;
  const bool cluster = kCluster<VAR> && p.num_splits > 1;
  const bool cluster_launch = cluster || (kDyn<VAR> && !kGdyn<VAR>);  // DYN: clusters of dyn_c
  {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(unsigned(p.num_rows), unsigned(p.n_kv_heads), unsigned(p.num_splits));
    cfg.blockDim = dim3(Cfg<HD, VAR>::WARPS * 32);
    cfg.dynamicSmemBytes = smem_bytes<HD, VAR>();
    cfg.stream = stream;
    cudaLaunchAttribute attr[2];
    unsigned na = 0;
    if (kPdl) {
      attr[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr[na].val.programmaticStreamSerializationAllowed = 1;
      ++na;
    }
    if (cluster_launch) {
      attr[na].id = cudaLaunchAttributeClusterDimension;
      attr[na].val.clusterDim.x = 1;
      attr[na].val.clusterDim.y = 1;
      attr[na].val.clusterDim.z = unsigned(kDyn<VAR> ? dyn_c : p.num_splits);
      ++na;
    }
    cfg.attrs = attr;
    cfg.numAttrs = na;
    const cudaError_t e = cudaLaunchKernelEx(&cfg, decode_kernel<HD, VAR>, a);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      set_last_cuda_error(static_cast<int>(e));
      return DK_ERR_CUDA;
    }
  }
  if (p.num_splits == 1 || cluster) return DK_OK;
  // Programmatic dependent launch: the merge grid's launch overlaps the tail of the split
  // kernel (it waits in griddepcontrol.wait); also inside CUDA graphs.
  const cudaError_t e =
      dk::launch_pdl(decode_merge_kernel<HD, kTl<VAR>>, dim3(unsigned(tok * p.n_q_heads)), dim3(HD / 4), 0, stream,
                     static_cast<const float*>(a.po), static_cast<const float*>(a.plse), a.out, a.splits);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    set_last_cuda_error(static_cast<int>(e));
    return DK_ERR_CUDA;
  }
  return DK_OK;
}

// Automatic configuration (variant -1): the split count s <= num_splits whose CTA count
// W * s (W = rows x kv heads) spreads most evenly over the SMs (CTAs / (ceil(CTAs / SMs) * SMs),
// the smallest s within 0.04 of the best), then variant 0 (4 warps x 3 stages, the most bytes in
// flight per CTA) when that is at most one CTA per SM (19 since session 12 when also s <= 8 at hd 256), else
// variant 3 (2 warps x 2 stages, three CTAs per SM). From the H200 sweep of 2026-12-01: e.g. 27B TP1 16 rows -> 2 splits of variant 0
// (128 CTAs), 64 rows -> 1 split of variant 3 (256 CTAs), 1 row -> 32-33 splits of variant 0.
// Depends only on rows, kv heads, num_splits, the head dim and the SM count: fixed per CUDA-graph bucket.
struct Pick {
  int variant;
  int64_t splits;
};
inline Pick auto_config(int64_t rows, int64_t hkv, int64_t max_splits, int sms, int head_dim) {
  const int64_t w = rows * hkv;
  auto balance = [&](int64_t ctas) {
    const int64_t waves = (ctas + sms - 1) / sms;
    return double(ctas) / double(waves * sms);
  };
  const int64_t cap = max_splits < 4 * int64_t(sms) ? max_splits : 4 * int64_t(sms);
  double best = 0.0;
  for (int64_t s = 1; s <= cap; ++s) best = balance(w * s) > best ? balance(w * s) : best;
  int64_t pick = 1;
  for (int64_t s = 1; s <= cap; ++s) {
    if (balance(w * s) >= best - 0.04) {
      pick = s;
      break;
    }
  }
  // Session 12: at one CTA per SM and <= 8 splits (rows >= 16 at 27B) variant 19 (tiles of 2,
  // strided splits with every stage's page entries looked up at entry, lean combine): H200, two
  // calls, 0.6-1.5% faster than 0 at the six such shapes of the issue's sweep (at <= 8 splits the
  // merge loads every partial anyway, so all splits being live costs nothing); with more splits
  // (rows 1) 0 stays, and at hd 128 (19 measured at hd 256 only; 0 has a fourth stage there) too.
  // Else 3.
  const bool strided = pick <= 8 && head_dim == 256;
  return Pick{(w * pick + sms - 1) / sms <= 1 ? (strided ? 19 : 0) : 3, pick};
}

// Multiprocessor count of `dev`, cached (0 if unknown).
inline int sm_count(int dev) {
  static std::atomic<int> cache[64];
  if (dev < 0 || dev >= 64) return 0;
  int v = cache[dev].load(std::memory_order_relaxed);
  if (v == 0) {
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    cache[dev].store(v, std::memory_order_relaxed);
  }
  return v;
}

}  // namespace attn_dec
}  // namespace dk

extern "C" dk_status dk_attn_decode_sm90(const DkAttnDecodeSm90Params* p, dk_stream_t stream) {
  if (p == nullptr) return DK_ERR_INVALID_ARGUMENT;
  if (p->n_kv_heads <= 0 || p->n_q_heads <= 0 || p->n_q_heads % p->n_kv_heads != 0 ||
      p->n_kv_heads > 65535 || p->num_rows <= 0 || p->num_rows > 0x7fffffffLL || p->n_new <= 0 ||
      (p->n_q_heads / p->n_kv_heads) * p->n_new > 16 || p->page_size <= 0 ||
      p->max_pages <= 0 || p->num_pages <= 0 || p->num_pages > 0x7fffffffLL ||
      p->num_splits <= 0 || p->num_splits > 65535 || p->variant < -1 ||
      p->variant >= dk::attn_dec::kVariants) {
    return DK_ERR_INVALID_ARGUMENT;
  }
  // Positions and cache row indices are 32-bit inside the kernel.
  if (p->max_pages * p->page_size > 0x7fffffffLL || p->num_pages * p->page_size > 0x7fffffffLL) {
    return DK_ERR_INVALID_ARGUMENT;
  }
  for (uint64_t ptr : {p->q, p->k_cache, p->v_cache, p->out}) {
    if (ptr == 0 || ptr % 16 != 0) return DK_ERR_INVALID_ARGUMENT;
  }
  if (p->seq_lens == 0 || p->page_table == 0) return DK_ERR_INVALID_ARGUMENT;
  if (p->num_splits > 1 && (p->workspace == 0 || p->workspace % 16 != 0)) {
    return DK_ERR_INVALID_ARGUMENT;
  }
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  namespace d = dk::attn_dec;
  DkAttnDecodeSm90Params cfg = *p;
  if (cfg.variant == -1) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) {
      dk::set_last_cuda_error(static_cast<int>(cudaGetLastError()));
      return DK_ERR_CUDA;
    }
    const int sms = d::sm_count(dev);
    const d::Pick pick =
        d::auto_config(cfg.num_rows, cfg.n_kv_heads, cfg.num_splits, sms > 0 ? sms : 132, cfg.head_dim);
    cfg.variant = pick.variant;
    cfg.num_splits = pick.splits;  // <= num_splits: the workspace holds it
  }
  p = &cfg;
  switch (p->head_dim) {
    case 64:  // one tile configuration: `variant` ignored
      return d::launch<64, 0>(*p, s);
    case 128:
      switch (p->variant) {
        case 0:
          return d::launch<128, 0>(*p, s);
        case 1:
          return d::launch<128, 1>(*p, s);
        case 2:
          return d::launch<128, 2>(*p, s);
        case 3:
          return d::launch<128, 3>(*p, s);
        case 4:
          return d::launch<128, 4>(*p, s);
        case 5:
          return d::launch<128, 5>(*p, s);
        case 6:
          return d::launch<128, 6>(*p, s);
        case 7:
          return d::launch<128, 7>(*p, s);
        case 8:
          return d::launch<128, 8>(*p, s);
        case 9:
          return d::launch<128, 9>(*p, s);
        case 10:
          return d::launch<128, 10>(*p, s);
        case 11:
          return d::launch<128, 11>(*p, s);
        case 13:
          return d::launch<128, 13>(*p, s);
        case 14:
          return d::launch<128, 14>(*p, s);
        case 15:
          return d::launch<128, 15>(*p, s);
        case 16:
          return d::launch<128, 16>(*p, s);
        case 17:
          return d::launch<128, 17>(*p, s);
        case 18:
          return d::launch<128, 18>(*p, s);
        case 19:
          return d::launch<128, 19>(*p, s);
        case 20:
          return d::launch<128, 20>(*p, s);
        case 21:
          return d::launch<128, 21>(*p, s);
        case 23:
          return d::launch<128, 23>(*p, s);
        case 24:
          return d::launch<128, 24>(*p, s);
        default:  // 12 / 22: the timeline variants are built at head dim 256 only
          return d::launch<128, 0>(*p, s);
      }
    case 256:
      switch (p->variant) {
        case 0:
          return d::launch<256, 0>(*p, s);
        case 1:
          return d::launch<256, 1>(*p, s);
        case 2:
          return d::launch<256, 2>(*p, s);
        case 3:
          return d::launch<256, 3>(*p, s);
        case 4:
          return d::launch<256, 4>(*p, s);
        case 5:
          return d::launch<256, 5>(*p, s);
        case 6:
          return d::launch<256, 6>(*p, s);
        case 7:
          return d::launch<256, 7>(*p, s);
        case 8:
          return d::launch<256, 8>(*p, s);
        case 9:
          return d::launch<256, 9>(*p, s);
        case 10:
          return d::launch<256, 10>(*p, s);
        case 11:
          return d::launch<256, 11>(*p, s);
        case 13:
          return d::launch<256, 13>(*p, s);
        case 14:
          return d::launch<256, 14>(*p, s);
        case 15:
          return d::launch<256, 15>(*p, s);
        case 16:
          return d::launch<256, 16>(*p, s);
        case 17:
          return d::launch<256, 17>(*p, s);
        case 18:
          return d::launch<256, 18>(*p, s);
        case 19:
          return d::launch<256, 19>(*p, s);
        case 20:
          return d::launch<256, 20>(*p, s);
        case 21:
          return d::launch<256, 21>(*p, s);
        case 23:
          return d::launch<256, 23>(*p, s);
        case 24:
          return d::launch<256, 24>(*p, s);
        case 22:
          return d::launch<256, 22>(*p, s);
        default:
          return d::launch<256, 12>(*p, s);
      }
    default:
      return DK_ERR_UNSUPPORTED;
  }
}

extern "C" dk_status dk_attn_decode_sm90_timeline(uint64_t* host, int64_t n) {
  namespace d = dk::attn_dec;
  constexpr int64_t kWords = 2 * int64_t(d::kDecTlCtas) * d::kDecTlFields;
  return dk::read_and_clear_device_words(d::g_decode_tl, kWords, host, n);
}
