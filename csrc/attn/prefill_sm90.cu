// attn.prefill for sm_90a (Hopper): causal GQA attention over the paged KV cache with prior
// context and varlen batches, FlashAttention-3 style. CPU twin: deltakit_ref::attn::prefill_paged;
// the portable path is the Triton kernel in triton_aot/attn/attention.py (same semantics).
//
// Work split. One CTA = one block of BM = 128 "packed rows" of one sequence and one kv head: the
// G = HQ / HKV query heads of a kv head are packed into the M dimension (row r of a sequence is
// token r / G, query head kvh * G + r % G), so every K/V tile is read once per GQA group. Grid:
// (N * max_m_blocks, HKV); the heaviest (last) row blocks of a sequence launch first.
//
// Warp specialization (384 threads): warpgroup 0 is the producer (setmaxnreg down to 40 regs; 56
// in the hd-256 variants 4-8): it gathers Q and then K/V tiles of BN cache positions with 16-byte
// cp.async from the paged cache (any page size: one page lookup per position and tile),
// zero-filling rows past the causal end, into 128-byte-swizzled shared memory, and signals full
// mbarriers (cp.async.mbarrier.arrive). Warpgroups 1 and 2 are consumers (setmaxnreg up to 232;
// 224 in variants 4-8) of 64 rows each: S = Q K^T with wgmma m64nBNk16 (both operands from shared
// memory, K-major), online softmax in f32 (exp2, the row max and sum per thread-quad), P packed to
// bf16 in registers, O += P V with wgmma
// m64nHDk16 (A from registers, V MN-major from shared memory). The QK^T of tile j+1 is issued
// before the PV of tile j and its softmax runs while the PV product is in flight (intra-warpgroup
// overlap). The K half of a stage goes back to the producer (its own empty mbarrier) as soon as
// its QK^T product completed, the V half after its PV product, so the next K tile loads a whole
// iteration ahead. With schedule 1 ("ping-pong", named barriers 1 and 2) the two consumer
// warpgroups take turns issuing their GEMMs, one's softmax overlapping the other's GEMMs.
// Tiles wholly before the block's first query position run without a mask; the rest (the
// diagonal) mask positions past each row's own position.
// The producer computes each K/V row's cache offset once per tile (one lane per row, shared with
// the lanes copying that row by shuffles, fetched one tile ahead) and reuses it for V.
//
// Shared memory per CTA (HD 256, variant 0): Q 64 KB + 2 stages x (K 32 KB + V 32 KB) = 192 KB;
// the other hd-256 tile variants (BN 80 / BN 48 x 3 stages, see Cfg) use 224 / 208 KB (226 KB
// with the ordered-softmax scratch). The wrapper's default at hd 256 was variant 19
// (src/ops/attn.rs SM90_DEFAULT_VARIANT): BN 80, late P, 56/224 registers, FAST + ORDERED
// softmax, the SPLIT producer with TMA loads of full K/V tiles, the LPT block order and the
// STAGED output, ping-pong (measured on an H200: docs/benchmarks/2026-12-01-attn-s4.md; the
// description above is the cp.async producer of variants 0-8); since session 6 the default is
// variant 25 = 19 with Q loaded by the V producer pair (QV below; 2026-12-01-attn-s6.md); since
// session 7 variant 30 = 25 with stepped output row addresses (2026-12-01-attn-s7.md); since
// session 10 variant 48 = 30 + EARLY with Q by TMA from whole-token boxes issued by one lane and
// every full K / V tile's boxes issued by one lane with uniform operands (2026-12-02-attn-s10.md).
// Every operand tile is stored as HD/64 column blocks of [rows][64] bf16 (128 bytes per row, the
// 16-byte chunk index XOR-ed with row % 8: the hardware's 128-byte swizzle, blocks 1024-aligned).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <cuda.h>  // CUtensorMap and its enums (the encoder is fetched from the driver at run time)

#include <atomic>
#include <type_traits>

#include "../common/launch.cuh"
#include "sm90_wgmma.cuh"

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DK_ATTN_SM90A 1
#endif

namespace dk {
namespace attn_sm90 {

constexpr int kThreads = 384;
constexpr int kBM = 128;

// Tile configurations (VAR, DkAttnPrefillSm90Params::variant; head dim 256 only, the smaller head
// dims have one): BN cache positions per K/V tile, STAGES K/V stages, LATE_P whether the
// probabilities are exponentiated in place in the score registers and packed to bf16 only after
// the previous PV product completed (FlashAttention-3's order: one P register set instead of two,
// which is what lets BN = 80 fit in 232 registers) instead of packed during the softmax.
//   0: BN 64, 2 stages, early P (192 KB of shared memory);   1: BN 80, 2 stages, late P (224 KB);
//   2: BN 64, 2 stages, late P (192 KB);                      3: BN 48, 3 stages, late P (208 KB);
//   4: as 2 with 56 registers for the producer and 224 for the consumers (no producer spills);
//   5: as 1 with the registers of 4;
//   6: as 5 with the producer loading K one tile ahead of V (order K0 K1 V0 K2 V1 ..., REORDER: the
//      next K tile no longer waits behind the release of the V stage, which comes later);
//   7: as 5 with FAST softmax (max of the raw scores, one FFMA per score for scale and shift;
//      the 128-register O rescale skipped when no row max of the warp changed; scale > 0 only);
//   8: as 5 with both;
//   9: as 7 with the K/V tiles loaded by the tensor-memory accelerator (TMA): the producer's
//      thread 0 issues cp.async.bulk.tensor (3-D descriptors of the caches as [rows][HKV][HD],
//      box 16 positions x 64 dims, 128B swizzle: exactly the tile layout the wgmma descriptors
//      read) per 16-position page run and 64-dim column block, completion counted in bytes on the
//      stage's full mbarrier; the last (partial) tile of a block and page sizes not a multiple of
//      16 keep the cp.async path (zero fill past the causal end). Correct on an H200 but 13%
//      slower than 7 (session 3: the page lookups sat between the empty wait and the loads).
//  10-15 (session 4, all as 7 plus): ORDERED softmax -- the exponentials of tile j+1 are pinned
//      before the wait for the PV product of tile j (ptxas had sunk all 40 MUFU.EX2 below that
//      WARPGROUP.DEPBAR: the softmax ran after the PV product instead of under it) and the O
//      rescale moves from after that wait to just before the next PV issue (under the QK^T
//      product), so only the bf16 packing of P sits between a PV completion and the next issue;
//      PP (own schedule, the `schedule` argument is ignored): even ids ping-pong, odd ids
//      free-running (FlashAttention-3's choice at head dim 256);
//      10/11: producer as 7;  12/13: SPLIT producer -- warps 0-1 copy K tiles, warps 2-3 V
//      tiles, each pair on its own (a K tile never waits behind a V release); 14/15: SPLIT with
//      TMA loads of the full tiles (one elected lane per pair issues them; page rows looked up
//      one tile ahead), the consumers skip the proxy fence on those tiles.
//      All of 10-15 also use the LPT block order: the linear block index walks the row blocks
//      heaviest first across *all* sequences and kv heads (kv head fastest), instead of every
//      row block of kv head 0 before kv head 1 (whose heaviest blocks then start in a later wave:
//      a long tail at T = 2k with 4 kv heads).
//  16: 7 with the LPT block order alone.
//  17-22: the split TMA producer of 14/15 (all ORDERED) with, odd = ping-pong / even =
//      free-running: 17/18 the kv-head-major block order of 0-9 (no LPT); 19/20 LPT and the
//      STAGED epilogue: each consumer warpgroup writes its normalized bf16 O rows into its own
//      (no longer read) half of the Q tile in shared memory, then stores them with coalesced
//      16-byte stores (one 512-byte row per warp instruction) instead of 64 scattered 4-byte
//      stores per thread; 21/22 STAGED in the kv-head-major order.
//  23/24 (session 5): PERSISTENT -- variant 19's pipeline in prefill_persist_kernel: one CTA per
//      SM (24: at most 8 CTAs, a test variant) walks the LPT block list, the K/V ring, its
//      mbarrier phases and the ping-pong turns run on across blocks, and each producer pair loads
//      the next block's Q half (prefetched into L2) as soon as its consumer warpgroup released it.
//      H200: correct, but 7-10% slower than 19 at 8k/32k (its wgmma descriptors went through
//      R2UR: the ring position in the stage index), equal on varlen.
//  (25-27, removed after session 5, code in commit 2f9f0d1, numbers in
//      docs/benchmarks/2026-12-01-attn-s5.md: 23 with PHANTOM stages -- an odd block's producers
//      publish one empty stage so every block starts at stage 0, tile loop unrolled by two -- and
//      OVERLAP of a block's direct output with the next block's first QK^T; on an H200 still
//      55-75 R2UR per tile, 176-192 B spills, varlen 8 x 2048 at 0.88x / 0.62x variant 19.)
// PROD_REGS / CONS_REGS: the setmaxnreg targets (128 * PROD + 256 * CONS <= 64K registers).
//  36 (session 7, round 2): 23 whose consumers run each block's tile loop from a compile-time
//      start stage: the block body is instantiated for ring stage 0 and 1 and picked by the
//      parity of the tiles before it (a branch between blocks, no wgmma in flight there), so
//      the K/V stage of tile j is (S0 + j) % 2 of the block's own loop counter, not of the ring
//      position carried through the block loop: the wgmma descriptors stay uniform as in the
//      one-block-per-CTA kernels (23 took them through R2UR: 7-10% slower at 8k/32k).
//      37 = 36 with at most 8 CTAs (a test variant, as 24); 38 = 36 recording the timeline
//      (fields 0-7 per block at its LPT index; 1 = consumer warpgroup 0 starts the block, i.e.
//      after the previous block's epilogue and this block's metadata; 7 = 1; producer K pair,
//      session 8: 8 = block started, 9 = Q half 0 free, 10 = Q half 0 issued, 11 = K tile 0
//      issued).
//  39 (session 9): 31 (= 30 + EARLY) + QC -- each consumer warpgroup loads its own 64 Q rows
//      (16 coalesced 16-byte cp.async per thread, one 512-byte row per warp instruction, row
//      addresses stepped), waits for them (cp.async.wait_all, proxy fence, its named barrier) and
//      starts; the producer's V pair issues V tile 0 at once. Why: in 30 one V-pair warp issues
//      64 cp.async per lane for a warpgroup's half (1.6 us on the H200 timeline, session 8) and
//      its traffic sits in front of the K pair's page-table load and K tile 0 TMA (K0 issued
//      1.3-1.4 us after the barrier init); the consumers are idle until Q landed anyway.
//      40 = 39 + TL (measurement: field 10 = consumer warpgroup 0's Q rows issued).
//  41 (session 9) = 39 + STM: the staged epilogue writes the bf16 O rows into the Q half with
//      stmatrix.x4 (16 per thread, one 16-byte row segment of an 8 x 8 matrix per lane, the
//      accumulator fragment being stmatrix's layout) instead of 64 4-byte st.shared per thread.
//  42 (session 9) = 31 + TQ: Q by TMA. Three descriptors of q as (HD, HQ, T): box 64 x G x NT
//      tokens (NT = (128 - (G - 1)) / G: the most whole tokens that always fit after a partial
//      first one), 64 x G x 1 (one token) and 64 x 1 x 1 (one row). The K pair's second warp
//      (otherwise idle but for its arrivals) announces 64 KB on the Q barrier and its lanes issue
//      the block's boxes (per 64-dim column block): one row box per row of the partial first
//      token (heads h0..G-1), one NT-token box, one more token box when 128 - first leaves
//      NT + 1 whole tokens, one row box per row of the partial last token -- at most 32 items.
//      Rows past the sequence load the next tokens' (finite, never stored) or zeros past T.
//      Thread 0 prefetches all five tensor maps at entry (30 prefetches K/V's after the barrier
//      init: K tile 0 issued 1.5-1.7 us after it on the H200 timeline, session 9 call 1).
//      Session 9 call 1: Q by cp.async takes 1.6-1.8 us to issue and ~1.1-1.4 to land whether
//      one warp or eight issue it (39/40), so the copy engine, not the issuing warp, is the limit.
//      43 = 42 + TL (field 10 = the Q boxes issued; fields 7 / 8 = the Q-issuing warp past
//      its setmaxnreg / right before its first box: not the producer end / bounds of the other
//      TL variants).
//      H200, session 9: 39-43 correct in every test, memcheck / racecheck clean (so TMA's 128B
//      swizzle follows the shared-memory address: row boxes at any 128-byte row work); 39 / 41
//      = 30 within 1%, 42 1-2% slower. 43's timeline: the Q boxes are issued 1.2-1.4 us after
//      the barrier init (K tile 0 1.4-1.5 us, with every tensor map prefetched at entry) and land
//      ~1.3 us later: Q wait 3.9 us as 30's. Call 3 (43's fields 7 / 8): barrier -> past the
//      setmaxnreg 0.06 us, -> before the first box 0.19, -> boxes issued 0.83 (p50; mean 1.0): the
//      UTMALDG takes uniform operands, so the warp's up to 22 items x 4 boxes issue one lane at a
//      time (BRA.U.ANY loop) -- the many row boxes of G = 6 cost the time. Next: the <= 2 (G - 1)
//      partial-token rows by cp.async (lanes) and only the whole-token boxes by TMA (4-8 UTMALDG);
//      K tile 0 (5 page runs x 4 boxes, issued the same way) shows the same ~1.2 us.
//  44 (session 10) = 31 + TQW: Q by TMA with the whole-token boxes only (4 or 8 UTMALDG: the
//      qa box of NT tokens and, when 128 - first leaves NT + 1 whole tokens, the one-token qb
//      box, per 64-dim column block), issued by lane 0 of the K pair's second warp with the
//      expect-tx of their bytes; the <= 2 (G - 1) rows of a partial first / last token by
//      cp.async from the V pair's second warp (32 cp.async arrivals on the same Q barrier; the
//      consumers fence the proxy after the wait). The barriers are initialized and synced
//      while the block's metadata loads are in flight (before the bounds, not after).
//      Why: 43's timeline (session 9 call 3) -- each UTMALDG in a per-lane loop costs ~20-40
//      cycles, 0.83 us p50 to issue G = 6's ~10 items x 4 boxes. Any G up to 64 (no box per
//      lane); above 64, or without the encoder, 31. 45 = 44 + TL (field 7 = the partial rows
//      issued, 8 = the bounds known (thread 0, after the barrier sync of field 9), 10 = the Q
//      boxes issued, 11 = K tile 0 issued).
//  46 (session 10) = 44 + DEFER: K tile 1 and V tile 0 (and so V tile 1) are issued only once
//      the Q barrier completed (each pair waits for it before that tile), so at a row block's
//      start the SM fetches Q + K tile 0 (104 KB at G = 6's 128 rows) instead of Q + 2 K + 2 V
//      tiles (224 KB). Why: in every Q path measured (30, 39/40, 42/43) Q landed ~2.5-3.2 us
//      after the barrier init however fast it was issued (1.6 us by cp.async, 0.8-1.4 by TMA
//      boxes): the block's first loads share the SM's fill bandwidth. 47 = 46 + TL (fields as 45).
//  48 (session 10) = 44 + KU: a full K / V tile's BN / 16 x HD / 64 boxes issued by lane 0 of
//      the pair's first warp with warp-uniform operands (redux.sync.max of the tile address,
//      the barrier, the pair and each 16-position group's cache row), instead of one lane per
//      group in ptxas's per-lane ELECT loop (5 iterations per box, 5 R2UR each). Why: 45's
//      timeline (session 10 call 1) -- K tile 0 issued 1.4 us after the bounds (Q's 8 boxes:
//      0.6 us), so the first QK^T waited for K0 (first QK 0.93 vs 30's 0.64 us) and took back
//      most of the Q wait saved (3.7 -> 3.1 us). 49 = 48 + TL (fields as 45).
//      H200, session 10: 44-49 correct in every test (44 / 46 / 48 in every prefill test loop),
//      memcheck / racecheck clean. 44 = 30 within +-1% (Q wait -0.5 us per row block, first QK^T
//      +0.3 us: K tile 0 still issued ~1.4 us after the bounds); 46 0.5-7.7% slower (the deferred
//      K1 / V0 stall the first iterations; Q lands only 0.1-0.25 us sooner: not fill-bound);
//      48 faster than 30 at 10 of 11 shapes in the same call (varlen 863 vs 878 us, 8k / 32k /
//      chunked -1.1..-2.4%; 27B TP1 2k +0.2%, in a recheck -1.1%) -- but K tile 0 was issued only
//      0.16 us sooner: the gain is the steady loop (2.19-2.27 vs 2.31-2.42 us per tile: the K / V
//      pairs' per-lane issue loops no longer take issue slots next to the consumers). The
//      DEFAULT since session 10 (src/ops/attn.rs SM90_DEFAULT_VARIANT).
//  50 (session 10) = 48 + TL whose fields 7 / 8 stamp K tile 0's issuer (the K pair's first
//      warp) past its setmaxnreg / right before its first box (the others as 45; measurement:
//      where the ~1.3 us between the bounds and K tile 0's issue go). H200 call 4: bounds ->
//      past setmaxnreg 0.05 us, -> before the first K0 box 0.64 (warp 0's prologue: index math,
//      page math, REDUX), -> the 20 boxes issued 0.64 (~30 ns per UTMALDG).
//  51 (session 10, prepared, NOT run on a GPU) = 48 + KE: K tile 0's cache rows computed from
//      the EARLY page entries and made uniform (redux) in warp 0 before the barrier sync, and a
//      full K tile 0 issued by warp 0 right after its setmaxnreg (expect-tx + 20 boxes, the
//      other 31 lanes' arrivals), before the TQW index math; the loop skips warp 0's share of
//      tile 0. Expected: K0 issued ~0.6 us sooner, the first QK^T no longer waiting for K0
//      (-0.3..-0.4 us per row block). 52 = 51 + TL (fields as 50).
//  53 (session 11) = 51 + BV: the block's cu_seqlens pair, ctx_lens entry and the page entries
//      of tile 0's 16-position groups come from the launch parameters (Args::bv_*, filled by the
//      launcher from the host copies; <= kBvSeqs sequences, else 51 runs): no dependent global
//      load before the Q boxes and K tile 0 issue (session 10's timeline: the bounds came ~1.0 us
//      after entry, Q issued ~0.5 us and K tile 0 ~1.3 us after them). V tile 0's entries too.
//      54 = 53 + TL (fields as 52). H200 (session 11, call 1): correct, sanitizer-clean, but
//      the Q boxes / K tile 0 issued no sooner (the metadata loads were already hidden behind the
//      barrier setup and its __syncthreads at 0.58 us; the producer then needs ~0.5 us to get past
//      the sync, index math and setmaxnreg, Q's 8 boxes go out at 1.8 us, K0's 20 at 2.2 us).
//  55 (session 11) = 53 + EI: the two issuing threads set up their own barriers and issue before
//      the block's __syncthreads -- thread 96 the Q barrier + Q's whole-token boxes, thread 0 the
//      K / V barriers + a full K tile 0 (page entries from the launch parameters) -- so Q and K0
//      leave ~0.2-0.5 / ~1.0 us after entry instead of 1.8 / 2.2 us. 56 = 55 + TL (fields as 54).
//      H200 (session 11, call 2; the default switched to 55 for the call): correct in every test,
//      memcheck / racecheck clean, but no faster (varlen 8 x 2048 880 vs 48's 880 us b2b, 873 vs
//      871 db; the other shapes within +-1.5%): K0's first box left at 0.64 us, but one thread's
//      20 boxes took until 1.79 us (~57 ns each at block start) and held the sync there; Q's boxes
//      left at 1.06 us yet landed at 3.49 us (49: issued 1.70, landed 3.10-3.23); the first QK^T
//      done at 4.13-4.19 vs 4.19-4.32. The block start is bound by the TMA issue and the memory
//      system's answer to ~200 KB of first loads, not by when the software issues them.
//  57 (session 11, prepared, NOT run on a GPU) = 48 as a PERSISTENT kernel written afresh
//      (prefill_pk_kernel): min(row blocks, SMs) CTAs walk the LPT list round robin; the K / V
//      ring, all mbarrier phases and the ping-pong turns run on across row blocks; the consumers
//      release the Q tile after their last QK^T of a row block, so the next row block's Q boxes /
//      partial rows and its K tile 0 load under the last PV product and the epilogue (the epilogue
//      stores O from the accumulators, not through the Q tile). The consumers' block loop is
//      instantiated per start stage (36's S0T) so the stage of tile j is (S0 + j) % 2 of the
//      block's own counter. Why: session 11's timelines -- a row block spends ~4 us from entry to
//      its first QK^T (Q lands 3.1-3.5 us after entry whatever the issue order) and ~2.5 us in
//      its epilogue with nothing overlapping them; predicted -5..-9% at varlen 8 x 2048. The
//      row block's fate and tile count are made warp-uniform (redux.sync) before the branches
//      around the body: without it ptxas kept the stage and descriptors in vector registers (84
//      R2UR per tile, 80 B spills). nvcc 13.0: 168 registers, 0 spills, steady loop 650 / 657
//      instructions, 21 HGMMA, 32 / 34 R2UR (48: 653 / 21 / 34).
//      58 = 57 + TL (fields in prefill_pk_kernel's comment).
//      Session 12, first H200 run of that form: correct, memcheck / racecheck clean, but 8-50%
//      slower than 48 (varlen 947 vs 839 us): the Q wait + first QK^T were hidden (-3.4 us per
//      row block) but the 4-byte O stores doubled the epilogue (5.3 vs 2.5 us), warpgroup 0's
//      next row block waited for warpgroup 1's epilogue (loop +1.2 us per row block), the next
//      row block's metadata loads were serial (+1 us), and round robin over a heaviest-first
//      list gave CTA c the c-th heaviest entry of every round (tail +4% at varlen, +28-70% at
//      2k in a list-scheduling model). Session-12 form: snake order over the rounds, the next
//      row block's metadata loaded under the current one, O by 16-byte stores after a 4 x 4
//      word transpose inside each quad (2 shfl.xor butterflies), and warpgroup 1's last
//      hand-over of a row block opening warpgroup 0's first turn of the next; 57 runs 48 for
//      lists of fewer than 4 row blocks per CTA. On an H200 (docs/benchmarks/
//      2026-12-02-attn-prefill-s12.md): correct, memcheck / racecheck clean; per row block Q
//      wait 0.13 vs 3.2 us, epilogue 2.0 vs 2.6, SM-finish spread 16 vs 9 us (58 vs 49), but the
//      K / V tile loop 6-10% slower per tile than 48's with the same loop SASS (ncu: tensor pipe
//      73 vs 79% active, more turn and K-full waits): varlen 8 x 2048 = 48, 8k / 32k +4..+8%.
//  59 / 60 (session 12, attnpk2) = 57 / 58 with the K / V boxes' kv-head coordinate made
//      warp-uniform (KVU: one more redux.sync beside the tile / barrier / row operands). Why:
//      in 57 the coordinate comes out of the row-block decode in a vector register, so ptxas
//      put an R2UR inside each of the 20 boxes' elect loops, right before its UTMALDG (45 R2UR
//      in a tile's issue path vs 48's 8): a serial R2UR -> UTMALDG chain per K and V tile,
//      landing on the consumers' K-full wait (the 2-stage ring at BN 80 has about one turn of
//      slack). nvcc 13.0: 11 R2UR, none in the elect loops, 240 instructions (48: 239), 168
//      registers, 0 spills; the consumer code is 57's. On an H200 (same call, docs/benchmarks/
//      2026-12-02-attn-prefill-s12.md): correct, memcheck / racecheck clean; loop per tile vs
//      49: 8k +1.7% (58: +6.3%), varlen +3.1% (58: +6.1%); bench 59 vs 48: varlen -3.0% b2b /
//      -2.5% do_bench, 8k / 32k squares +0.4..+3.5% (opt-in).
//  61-64 (session 13, attnpk3) = 48 / 49 / 59 / 60 with the sequence-grouped LPT order (SG,
//      sg_decode; group size: seq_group_of). Why: 48's order runs the heaviest row blocks of
//      every (sequence, kv head) pair together, so at varlen 8 x 2048 (27B TP1, 64 MB of K / V)
//      every wave streamed the batch's K / V from DRAM (ncu: L2 hit rate 66%, 956 MB read for
//      265 MB of Q + K / V). 63 runs 61 below 4 row blocks per CTA or for a K / V span above
//      kPkMaxSeqlen; 62 / 64 = the timeline forms. On an H200 (docs/benchmarks/
//      2026-12-02-attn-prefill-s13.md): correct in every test, memcheck / racecheck clean; 61 vs
//      48 at varlen: L2 hit 88.5%, DRAM 270 MB, -6.4% back to back / -5.1% do_bench, the other
//      shapes within noise (same order): 61 is the default since session 13. 63 = 59 at 48's
//      order but 0.4-4.5% slower than 59 with SG: the PK list's static snake assignment balances
//      a heaviest-first list, not SG's sawtooth one (list-scheduling model: +5 / +16 / +11% over
//      the mean at sg 4 / 2 / 1 vs +0.1% at 48's order); SG in PK needs dynamic row-block
//      fetching. 64's timeline loop at 8k (+9% over 60, same order there) is unexplained.
// Dispatched: 0-64.
constexpr int kVariants = 65;
// BV variants: most sequences whose metadata travels in the launch parameters, and the page
// entries per sequence (tile 0's 16-position groups at BN 80).
constexpr int kBvSeqs = 64;
constexpr int kBvGroups = 5;
// SPLIT+TMA variants: skip the consumers' proxy fence on TMA-loaded tiles (false: always fence).
constexpr bool kSkipTmaFence = true;
template <int HD, int VAR>
struct Cfg;
template <int VAR>
struct Cfg<256, VAR> {
  // 61-64 (SG): 48 / 49 / 59 / 60 with the sequence-grouped LPT order; every other flag is
  // the base variant's.
  static constexpr int B = VAR == 61 ? 48 : VAR == 62 ? 49 : VAR == 63 ? 59 : VAR == 64 ? 60 : VAR;
  static constexpr bool SG = VAR >= 61 && VAR <= 64;
  static constexpr int BN = (B == 1 || B >= 5) ? 80 : (B == 3 ? 48 : 64);
  static constexpr int STAGES = B == 3 ? 3 : 2;
  static constexpr bool LATE_P = B != 0;
  static constexpr int PROD_REGS = B >= 4 ? 56 : 40;
  static constexpr int CONS_REGS = B >= 4 ? 224 : 232;
  static constexpr bool REORDER = B == 6 || B == 8;
  static constexpr bool FAST = B == 7 || B == 8 || B >= 9;
  static constexpr bool TMA = B == 9 || B == 14 || B == 15 || B >= 17;
  static constexpr bool ORDERED = (B >= 10 && B <= 15) || B >= 17;
  static constexpr bool SPLIT = (B >= 12 && B <= 15) || B >= 17;
  // Variants >= 10 carry their own schedule: 10-15 even = ping-pong, 17-22 odd = ping-pong.
  static constexpr bool PP = B < 10 || B == 16 ||
                            (B <= 15 ? B % 2 == 0 : (B >= 23 || B % 2 == 1));
  static constexpr bool LPT = (B >= 10 && B <= 16) || B == 19 || B == 20 || B >= 23;
  static constexpr bool STAGED = B >= 19;
  // 23/24: the persistent kernel (prefill_persist_kernel); 24 at most 8 CTAs (a test variant).
  // 36 (session 7, round 2): 23 with a compile-time start stage per block (S0T below); 37 = 36
  // with at most 8 CTAs (as 24: many blocks per CTA in the small / sanitizer cases).
  // 38 = 36 recording the per-block timeline (TL; measurement).
  static constexpr bool PERSIST = B == 23 || B == 24 || (B >= 36 && B <= 38);
  static constexpr bool CAP8 = B == 24 || B == 37;
  // 25-27 (session 6; the ids of session 5's removed PHANTOM / OVERLAP variants reused), all
  // variant 19 plus -- 25/26: QV -- Q loaded by the V producer pair (warp 2: the rows of consumer
  // warpgroup 0, warp 3: those of warpgroup 1, each half on its own mbarrier, row addresses
  // stepped instead of divided), so the K pair issues K tile 0 at once; tensor maps prefetched;
  // output row addresses by 32-bit division. 26/27: TL -- a per-block %globaltimer timeline
  // (measurement variants: 27 = 19 + TL, 26 = 25 + TL; dk_attn_prefill_sm90_timeline).
  // 28: 25 + PF -- the K pair's second warp prefetches into L2 the Q rows of the row block
  // launched gridDim-resident blocks later (launch index + SM count: roughly the block that starts
  // when this one ends), and the output rows are addressed by stepping (no division per row).
  // 29 = 28 + TL (measurement).
  // 30-33 (session 6, round 2; on an H200 in session 7 30 became the default, 31-33 no faster):
  // 30 = 25 + STEP -- the stepped output row addresses of 28 without its prefetch. 31 = 30 + EARLY -- ctx_lens[seq] is loaded
  // together with the cu_seqlens pair (not after the block-exists test: one dependent global
  // load less before anything else), and the K pair's first warp loads the page-table entries
  // of K tile 0 at entry (before the barrier init), so K tile 0's TMA needs no table load after
  // the __syncthreads. 32 = 31 + Q4 -- Q loaded by all four producer warps, 32 rows each (the
  // V pair's warps first, the K pair's after issuing K tile 0; 64 arrivals per Q barrier).
  // 33 = 32 + TL (measurement; every TL variant records the Q-path stamps, fields 8-11).
  // 34 = 31 + OST -- each consumer warpgroup's staged O rows leave by TMA tensor stores (one
  // thread issues one box per 64-dim column block over out viewed as (HD, G, HKV, T), box
  // 64 x G x 1 x 64/G at the first row's head hh0 and token: the rows of heads >= hh0 of the
  // first 64/G tokens), the other rows and warpgroups with rows past the sequence by the
  // threads' stores as 30. (Session 6's second box at the negative head hh0 - G raised an
  // illegal instruction on an H200, session 7; removed.) 35 = 34 + TL (measurement).
  static constexpr bool QV = B == 25 || B == 26 || B == 28 || B == 29 ||
                            (B >= 30 && B <= 35) || (B >= 39 && B <= 60);
  // 39-41: QV's layout and epilogue, but Q loaded by the consumer warpgroups (QC).
  static constexpr bool QC = B >= 39 && B <= 41;
  // 41: the staged epilogue's shared-memory writes by stmatrix.
  static constexpr bool STM = B == 41;
  // 42 / 43: Q by TMA (one barrier for the 128 rows), tensor maps prefetched at entry.
  static constexpr bool TQ = B >= 42 && B <= 60;
  // 44-52: TQ with the whole-token boxes only, issued by one lane (TQW; see kVariants).
  static constexpr bool TQW = B >= 44 && B <= 60;
  // 46 / 47: TQW + DEFER -- K tile 1 and V tile 0 are issued only once Q has landed.
  static constexpr bool DEFER = B == 46 || B == 47;
  // 48 / 49: TQW + KU -- a full K / V tile's boxes issued by one lane with uniform operands.
  static constexpr bool KU = B >= 48 && B <= 60;
  // 50 / 52: TL whose fields 7 / 8 stamp the K pair's first warp (K tile 0's issuer).
  static constexpr bool KTL = B == 50 || B == 52 || B == 54 || B == 56;
  // 51 / 52: KE -- K tile 0's operands prepared at entry, its boxes issued first thing.
  static constexpr bool KE = B >= 51 && B <= 56;
  // 53-56: BV -- the block's metadata from the launch parameters (see kVariants).
  static constexpr bool BV = B >= 53 && B <= 56;
  // 55 / 56: EI -- Q and K tile 0 issued before the block's __syncthreads (see kVariants).
  static constexpr bool EI = B == 55 || B == 56;
  static constexpr bool TL = B == 26 || B == 27 || B == 29 || B == 33 || B == 35 ||
                            B == 38 || B == 40 || B == 43 || B == 45 || B == 47 ||
                            B == 49 || B == 50 || B == 52 || B == 54 || B == 56 ||
                            B == 58 || B == 60;
  // 57 / 58: PK -- 48 as a persistent kernel (prefill_pk_kernel; see kVariants).
  static constexpr bool PK = B >= 57 && B <= 60;
  // 59 / 60: KVU -- 57 / 58 with the K / V boxes' kv-head coordinate made warp-uniform
  // (redux.sync) next to the other TMA operands (see kVariants).
  static constexpr bool KVU = B == 59 || B == 60;
  static constexpr bool PF = B == 28 || B == 29;
  static constexpr bool STEP = PF || B >= 30;
  static constexpr bool EARLY = B >= 31;
  static constexpr bool Q4 = B == 32 || B == 33;
  static constexpr bool OST = B == 34 || B == 35;
  // The same tiles in the kv-head-major order (LPT grids above 2^31 blocks; 10-13, 16 -> 7).
  static constexpr int NO_LPT = B == 14                ? 17
                                : B == 15              ? 18
                                : B == 19 || B >= 23 ? 21
                                : B == 20              ? 22
                                : B >= 10              ? 7
                                                         : B;
};
template <int VAR>
struct Cfg<128, VAR> {
  static constexpr int BN = 128;
  static constexpr int STAGES = 2;
  static constexpr bool LATE_P = false;
  static constexpr int PROD_REGS = 40;
  static constexpr int CONS_REGS = 232;
  static constexpr bool REORDER = false;
  static constexpr bool FAST = false;
  static constexpr bool TMA = false;
  static constexpr bool ORDERED = false;
  static constexpr bool SPLIT = false;
  static constexpr bool PP = true;
  static constexpr bool LPT = false;
  static constexpr bool STAGED = false;
  static constexpr bool PERSIST = false;
  static constexpr bool CAP8 = false;
  static constexpr bool QV = false;
  static constexpr bool QC = false;
  static constexpr bool STM = false;
  static constexpr bool TQ = false;
  static constexpr bool TQW = false;
  static constexpr bool DEFER = false;
  static constexpr bool KU = false;
  static constexpr bool KTL = false;
  static constexpr bool KE = false;
  static constexpr bool BV = false;
  static constexpr bool EI = false;
  static constexpr bool PK = false;
  static constexpr bool TL = false;
  static constexpr bool PF = false;
  static constexpr bool STEP = false;
  static constexpr bool EARLY = false;
  static constexpr bool Q4 = false;
  static constexpr bool OST = false;
  static constexpr bool SG = false;
  static constexpr int NO_LPT = VAR;
};
template <int VAR>
struct Cfg<64, VAR> {
  static constexpr int BN = 128;
  static constexpr int STAGES = 2;
  static constexpr bool LATE_P = false;
  static constexpr int PROD_REGS = 40;
  static constexpr int CONS_REGS = 232;
  static constexpr bool REORDER = false;
  static constexpr bool FAST = false;
  static constexpr bool TMA = false;
  static constexpr bool ORDERED = false;
  static constexpr bool SPLIT = false;
  static constexpr bool PP = true;
  static constexpr bool LPT = false;
  static constexpr bool STAGED = false;
  static constexpr bool PERSIST = false;
  static constexpr bool CAP8 = false;
  static constexpr bool QV = false;
  static constexpr bool QC = false;
  static constexpr bool STM = false;
  static constexpr bool TQ = false;
  static constexpr bool TQW = false;
  static constexpr bool DEFER = false;
  static constexpr bool KU = false;
  static constexpr bool KTL = false;
  static constexpr bool KE = false;
  static constexpr bool BV = false;
  static constexpr bool EI = false;
  static constexpr bool PK = false;
  static constexpr bool TL = false;
  static constexpr bool PF = false;
  static constexpr bool STEP = false;
  static constexpr bool EARLY = false;
  static constexpr bool Q4 = false;
  static constexpr bool OST = false;
  static constexpr bool SG = false;
  static constexpr int NO_LPT = VAR;
};

// ORDERED variants add a 4-byte scratch word per consumer thread (the softmax order point).
template <int HD, int VAR>
constexpr size_t smem_bytes() {
  return size_t(kBM) * HD * 2 +
         size_t(Cfg<HD, VAR>::STAGES) * 2 * Cfg<HD, VAR>::BN * HD * 2 +
         8 * (1 + 4 * Cfg<HD, VAR>::STAGES + (Cfg<HD, VAR>::PERSIST ? 3 : 0) +
              (Cfg<HD, VAR>::QV ? 1 : 0)) +
         1024 +
         (Cfg<HD, VAR>::ORDERED ? 16 + 4 * 256 : 0);
}
static_assert(smem_bytes<256, 1>() <= 227 * 1024, "BN 80 fits the 227 KB opt-in limit");
static_assert(smem_bytes<256, 5>() == smem_bytes<256, 1>());
static_assert(smem_bytes<256, 3>() <= 227 * 1024, "3 stages of BN 48 fit");
static_assert(smem_bytes<256, 15>() <= 227 * 1024, "BN 80 + the order-point scratch fit");
static_assert(smem_bytes<256, 23>() <= 227 * 1024, "+ the persistent kernel's Q barriers fit");
static_assert(smem_bytes<256, 26>() <= 227 * 1024, "+ the second Q barrier fits");
static_assert(smem_bytes<256, 36>() <= 227 * 1024, "36: the persistent kernel's layout");
static_assert(smem_bytes<256, 57>() <= 227 * 1024, "57: PK, Q-empty barrier in QV's slot");

struct Args {
  DkAttnPrefillSm90Params p;
  int64_t max_m_blocks;
  int group;
  // SG variants (61-64): sequences per group of the sequence-grouped LPT order (>= 1; the
  // launcher's choice, see launch). In the padding before tmap_k: no other field moves.
  uint32_t seq_group;
  // Variant 9 (TMA): descriptors of the K and V caches as bf16 [num_pages * page_size][HKV][HD]
  // (dims innermost first: HD, HKV, rows), box 64 x 1 x 16, 128B swizzle. Unused otherwise.
  CUtensorMap tmap_k;
  CUtensorMap tmap_v;
  // Persistent variants (23, 24): row blocks in the LPT list (num_seqs * max_m_blocks * HKV).
  uint32_t total_blocks;
  // PF variants (28): how many launch indices ahead the Q prefetch looks (the SM count).
  uint32_t pf_ahead;
  // OST variants (34, 35): descriptor of `out` as bf16 (HD, G, HKV, T) (dims innermost first),
  // box 64 x G x 1 x 64/G, 128B swizzle. Unused otherwise.
  CUtensorMap tmap_o;
  // TQ variants (42, 43): descriptors of q as bf16 (HD, HQ, T) (dims innermost first), boxes
  // 64 x G x q_nt, 64 x G x 1 and 64 x 1 x 1, 128B swizzle. Unused otherwise.
  CUtensorMap tmap_qa;
  CUtensorMap tmap_qb;
  CUtensorMap tmap_qr;
  uint32_t q_nt;
  // BV variants (53, 54): cu_seqlens[0..=N], ctx_lens[0..N] and page_table[s][16 g / page_size]
  // (g < kBvGroups; -1 where that page index is >= max_pages) of the N <= kBvSeqs sequences,
  // copied from the host arrays at launch. Unused otherwise.
  int32_t bv_cu[kBvSeqs + 1];
  int32_t bv_ctx[kBvSeqs];
  int32_t bv_pg0[kBvSeqs][kBvGroups];
};
static_assert(sizeof(Args) <= 4096, "the launch parameters stay within the classic 4 KB");

#ifdef DK_ATTN_SM90A
// SG variants (61-64): the sequence-grouped LPT order. The launch index (or the persistent
// list's entry) walks groups of a.seq_group consecutive sequences one after the other (the
// last group holds the rest), and inside a group 48's LPT order: row block heaviest first, then
// the group's sequence, kv head fastest. Why: the plain LPT order runs the heaviest row blocks
// of every sequence and kv head together, so a batch whose K / V (all sequences, all kv heads)
// is larger than L2 streams it from DRAM again for every wave of row blocks (varlen 8 x 2048 at
// 27B TP1: 64 MB of K / V, L2 hit rate 66% vs 93% at the 8k square, ncu session 12); a group's
// K / V stays in L2 while its row blocks run. One group = the whole batch is 48's order.
// 32-bit: the launcher keeps the list below 2^31 entries.
__device__ __forceinline__ void sg_decode(uint32_t lin, const Args& a, uint32_t& seq,
                                          uint32_t& kvh, uint32_t& mbi) {
  const uint32_t hkv = uint32_t(a.p.n_kv_heads);
  const uint32_t nseq = uint32_t(a.p.num_seqs);
  const uint32_t sg = a.seq_group;
  const uint32_t per_seq = uint32_t(a.max_m_blocks) * hkv;
  const uint32_t g = lin / (sg * per_seq);
  const uint32_t r = lin - g * (sg * per_seq);
  const uint32_t s0 = g * sg;
  const uint32_t ng = min(sg, nseq - s0);
  const uint32_t rest = r / hkv;
  kvh = r - rest * hkv;
  const uint32_t mi = rest / ng;
  seq = s0 + (rest - mi * ng);
  mbi = mi;
}
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
  asm volatile(
      "{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(bar)
      : "memory");
}
// Arrive on `bar` once every cp.async this thread issued so far has landed.
__device__ __forceinline__ void cp_async_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// 16-byte copy global -> shared; src_bytes = 0 writes zeros and reads nothing.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
// One TMA tile load (3-D descriptor in kernel-parameter space), completion as bytes on `bar`.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                            int c2, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], "
      "[%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}
// Q's whole tokens of a row block by TMA, from one lane (TQW's issuer and EI's thread 96): nf whole tokens from
// token tok1 into the Q tile's rows first.. (128-byte rows per 64-column block of kBM rows), head row h1 = kv head x G
// of the [T, H_q, HD] query tensor; the first map covers q_nt tokens, the second the one more when nf > q_nt. Arms
// `bar` with the boxes' bytes first.
template <int HD>
__device__ __forceinline__ void issue_q_whole_tokens(const CUtensorMap* map_a, const CUtensorMap* map_b, int nt,
                                                     uint32_t sq, uint32_t bar, int first, int nf, int G, int h1,
                                                     int tok1) {
  mbar_arrive_expect_tx(bar, uint32_t(nf * G) * HD * 2);
  const uint32_t d0 = sq + uint32_t(first) * 128u;
#pragma unroll
  for (int cblk = 0; cblk < HD / 64; ++cblk) {
    tma_load_3d(d0 + uint32_t(cblk * kBM * 128), map_a, cblk * 64, h1, tok1, bar);
  }
  if (nf > nt) {
    const uint32_t d1 = d0 + uint32_t(nt * G) * 128u;
#pragma unroll
    for (int cblk = 0; cblk < HD / 64; ++cblk) {
      tma_load_3d(d1 + uint32_t(cblk * kBM * 128), map_b, cblk * 64, h1, tok1 + nt, bar);
    }
  }
}
// TMA tensor store of one box from shared memory (bulk async-group; wait with bulk_wait_read).
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, uint32_t src, int c0, int c1,
                                             int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group"
      " [%0, {%2, %3, %4, %5}], [%1];\n" ::
          "l"(reinterpret_cast<uint64_t>(map)),
      "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_regs(uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}
// Shared-memory matrix descriptor, 128-byte swizzle.
__device__ __forceinline__ uint64_t make_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t((lbo & 0x3FFFF) >> 4) << 16) |
         (uint64_t((sbo & 0x3FFFF) >> 4) << 32) | (uint64_t(1) << 62);
}
// 2^x (MUFU.EX2; -inf -> 0).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

template <int N>
__device__ __forceinline__ void qk_gemm(float (&s)[N], uint64_t dq, uint64_t dk);
template <>
__device__ __forceinline__ void qk_gemm<24>(float (&s)[24], uint64_t dq, uint64_t dk) {
  sm90::wgmma_ss_m64n48k16(s, dq, dk, 0);
}
template <>
__device__ __forceinline__ void qk_gemm<32>(float (&s)[32], uint64_t dq, uint64_t dk) {
  sm90::wgmma_ss_m64n64k16(s, dq, dk, 0);
}
template <>
__device__ __forceinline__ void qk_gemm<40>(float (&s)[40], uint64_t dq, uint64_t dk) {
  sm90::wgmma_ss_m64n80k16(s, dq, dk, 0);
}
template <>
__device__ __forceinline__ void qk_gemm<64>(float (&s)[64], uint64_t dq, uint64_t dk) {
  sm90::wgmma_ss_m64n128k16(s, dq, dk, 0);
}
template <int N>
__device__ __forceinline__ void qk_gemm_acc(float (&s)[N], uint64_t dq, uint64_t dk);
template <>
__device__ __forceinline__ void qk_gemm_acc<24>(float (&s)[24], uint64_t dq, uint64_t dk) {
  sm90::wgmma_ss_m64n48k16(s, dq, dk, 1);
}
template <>
__device__ __forceinline__ void qk_gemm_acc<32>(float (&s)[32], uint64_t dq, uint64_t dk) {
  sm90::wgmma_ss_m64n64k16(s, dq, dk, 1);
}
template <>
__device__ __forceinline__ void qk_gemm_acc<40>(float (&s)[40], uint64_t dq, uint64_t dk) {
  sm90::wgmma_ss_m64n80k16(s, dq, dk, 1);
}
template <>
__device__ __forceinline__ void qk_gemm_acc<64>(float (&s)[64], uint64_t dq, uint64_t dk) {
  sm90::wgmma_ss_m64n128k16(s, dq, dk, 1);
}
template <int N>
__device__ __forceinline__ void pv_gemm(float (&o)[N], const uint32_t* a, uint64_t dv);
template <>
__device__ __forceinline__ void pv_gemm<32>(float (&o)[32], const uint32_t* a, uint64_t dv) {
  sm90::wgmma_rs_m64n64k16_tb(o, a, dv);
}
template <>
__device__ __forceinline__ void pv_gemm<64>(float (&o)[64], const uint32_t* a, uint64_t dv) {
  sm90::wgmma_rs_m64n128k16_tb(o, a, dv);
}
template <>
__device__ __forceinline__ void pv_gemm<128>(float (&o)[128], const uint32_t* a, uint64_t dv) {
  sm90::wgmma_rs_m64n256k16_tb(o, a, dv);
}

// Copies `rows` rows of HD bf16 (row i from src(i), or zeros where src(i) is null) into a
// swizzled tile at `tile` (HD/64 column blocks of rows x 128 bytes), by the 128 producer threads.
// `valid` is any global address (the zero-fill copies name it but read nothing).
template <int HD, int ROWS, class Src>
__device__ __forceinline__ void load_tile(uint32_t tile, int t, const void* valid, Src src) {
  constexpr int CPR = HD / 8;       // 16-byte chunks per row
  constexpr int RSTEP = 128 / CPR;  // rows per pass of the warpgroup
  const int c = t % CPR;
  const uint32_t cb = uint32_t(c / 8) * (ROWS * 128);
  const uint32_t cw = uint32_t(c % 8);
#pragma unroll 4
  for (int r = t / CPR; r < ROWS; r += RSTEP) {
    const __nv_bfloat16* row = src(r);
    const uint32_t dst = tile + cb + uint32_t(r) * 128 + ((cw ^ uint32_t(r & 7)) << 4);
    cp_async_16(dst, row ? static_cast<const void*>(row + c * 8) : valid, row ? 16u : 0u);
  }
}
#endif  // DK_ATTN_SM90A

// TL variants (26, 27, 29, 33, 35): per-block timeline, kTlFields words per block at its linear
// launch index (blocks >= kTlBlocks are not recorded): 0 = SM id | n_tiles << 32, 1 = entry,
// 2 = consumer warpgroup 0 has its Q rows, 3 = its first QK^T done, 4 = its last PV done, 5 = its
// output stored, 6 = warpgroup 1's output stored, 7 = the producer's thread 0 done issuing; the
// Q path (session 6, round 2): 8 = thread 0 has cu_seqlens and ctx_lens (before the barrier init),
// 9 = thread 0 past the __syncthreads after the barrier init, 10 = the warp loading warpgroup 0's
// first Q rows done issuing them, 11 = K tile 0 issued (%globaltimer ns). Read and cleared by
// dk_attn_prefill_sm90_timeline.
constexpr int kTlBlocks = 16384;
constexpr int kTlFields = 12;
__device__ unsigned long long g_prefill_tl[kTlBlocks * kTlFields];
#ifdef DK_ATTN_SM90A
__device__ __forceinline__ unsigned long long gtimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}
__device__ __forceinline__ unsigned long long sm_id() {
  uint32_t v;
  asm volatile("mov.u32 %0, %%smid;\n" : "=r"(v));
  return v;
}
#endif

// PP: "ping-pong" ordering of the two consumer warpgroups (named barriers 1 and 2): a
// warpgroup issues its GEMMs of an iteration only after the other one issued its own, so one
// warpgroup's softmax runs while the other's GEMMs use the tensor cores.
template <int HD, bool PP, int VAR>
__global__ void __launch_bounds__(kThreads, 1) prefill_kernel(const __grid_constant__ Args a) {
#ifdef DK_ATTN_SM90A
  constexpr int BN = Cfg<HD, VAR>::BN;
  constexpr int ST = Cfg<HD, VAR>::STAGES;
  constexpr bool LATE_P = Cfg<HD, VAR>::LATE_P;
  constexpr bool REORDER = Cfg<HD, VAR>::REORDER;
  constexpr bool FAST = Cfg<HD, VAR>::FAST;
  constexpr bool ORDERED = Cfg<HD, VAR>::ORDERED;
  constexpr bool SPLIT = Cfg<HD, VAR>::SPLIT;
  constexpr bool TMA = Cfg<HD, VAR>::TMA;
  static_assert(!SPLIT || HD == 256, "the split producer maps one 512-byte row per warp pass");
  static_assert(128 * Cfg<HD, VAR>::PROD_REGS + 256 * Cfg<HD, VAR>::CONS_REGS <= 65536);
  constexpr bool QV = Cfg<HD, VAR>::QV;
  constexpr bool QC = Cfg<HD, VAR>::QC;
  constexpr bool TL = Cfg<HD, VAR>::TL;
  static_assert(!QV || SPLIT, "QV: Q is loaded by the split producer's V pair");
  static_assert(!QC || (QV && !Cfg<HD, VAR>::Q4), "QC: QV's layout, one Q path");
  constexpr uint32_t TILE = uint32_t(BN) * HD * 2;
  unsigned long long t_entry = 0;
  if constexpr (TL) t_entry = gtimer();
  const uint32_t tl_lin = blockIdx.y * gridDim.x + blockIdx.x;
  auto tl_put = [&](int f, unsigned long long v) {
    if constexpr (TL) {
      if (tl_lin < uint32_t(kTlBlocks)) g_prefill_tl[size_t(tl_lin) * kTlFields + f] = v;
    }
  };
  const DkAttnPrefillSm90Params& p = a.p;
  const int G = a.group;
  const int tid = threadIdx.x;
  constexpr bool TQ = Cfg<HD, VAR>::TQ;
  constexpr bool TQW = Cfg<HD, VAR>::TQW;
  if constexpr (TQW) {
    // TQW: the barriers are set up first, by the V pair's second warp (its metadata is needed
    // last: the partial Q rows), so the other warps' metadata loads go out at once and the
    // setup is done while they are in flight (a block that turns out empty or padding returns
    // after the sync below). One Q barrier: 1 expect-tx arrival + the 32 cp.async arrivals of
    // the partial-row warp. (EI: set up by the two issuing threads below instead.)
    if (tid == 96 && !Cfg<HD, VAR>::EI) {
      extern __shared__ uint8_t smem_raw[];
      const uint32_t b0 = ((smem_u32(smem_raw) + 1023u) & ~1023u) + uint32_t(kBM) * HD * 2 +
                          2u * ST * TILE;
      mbar_init(b0, 33);
      for (int s = 0; s < ST; ++s) {
        mbar_init(b0 + 8u * uint32_t(1 + s), 64);
        mbar_init(b0 + 8u * uint32_t(1 + ST + s), 64);
        mbar_init(b0 + 8u * uint32_t(1 + 2 * ST + s), 256);
        mbar_init(b0 + 8u * uint32_t(1 + 3 * ST + s), 256);
      }
      asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    // The four tensor maps this block uses (K, V, the two whole-token Q boxes).
    if (tid == 0) {
      asm volatile(
          "prefetch.tensormap [%0];\nprefetch.tensormap [%1];\nprefetch.tensormap [%2];\n"
          "prefetch.tensormap [%3];\n" ::"l"(reinterpret_cast<uint64_t>(&a.tmap_k)),
          "l"(reinterpret_cast<uint64_t>(&a.tmap_v)), "l"(reinterpret_cast<uint64_t>(&a.tmap_qa)),
          "l"(reinterpret_cast<uint64_t>(&a.tmap_qb))
          : "memory");
    }
  } else if constexpr (TQ) {
    // Every tensor map this block uses, fetched while the block's metadata loads.
    if (tid == 0) {
      asm volatile(
          "prefetch.tensormap [%0];\nprefetch.tensormap [%1];\nprefetch.tensormap [%2];\n"
          "prefetch.tensormap [%3];\nprefetch.tensormap [%4];\n" ::"l"(
              reinterpret_cast<uint64_t>(&a.tmap_k)),
          "l"(reinterpret_cast<uint64_t>(&a.tmap_v)), "l"(reinterpret_cast<uint64_t>(&a.tmap_qa)),
          "l"(reinterpret_cast<uint64_t>(&a.tmap_qb)), "l"(reinterpret_cast<uint64_t>(&a.tmap_qr))
          : "memory");
    }
  }
  int64_t seq, mb, kvh;
  if constexpr (Cfg<HD, VAR>::SG) {
    uint32_t sq, kh, mi;
    sg_decode(blockIdx.y * gridDim.x + blockIdx.x, a, sq, kh, mi);
    seq = sq;
    kvh = kh;
    mb = a.max_m_blocks - 1 - int64_t(mi);
  } else if constexpr (Cfg<HD, VAR>::LPT) {
    // Launch order (x fastest) -> row block (heaviest first), sequence, kv head (fastest).
    // 32-bit: the launcher keeps gridDim.x * gridDim.y below 2^31 for these variants.
    const uint32_t lin = blockIdx.y * gridDim.x + blockIdx.x;
    const uint32_t rest = lin / uint32_t(p.n_kv_heads);
    kvh = lin - rest * uint32_t(p.n_kv_heads);
    seq = rest % uint32_t(p.num_seqs);
    mb = a.max_m_blocks - 1 - rest / uint32_t(p.num_seqs);
  } else {
    seq = int64_t(blockIdx.x) / a.max_m_blocks;
    mb = a.max_m_blocks - 1 - int64_t(blockIdx.x) % a.max_m_blocks;
    kvh = blockIdx.y;
  }
  const int* cu = reinterpret_cast<const int*>(p.cu_seqlens);
  const int64_t T = p.num_tokens;
  constexpr bool EARLY = Cfg<HD, VAR>::EARLY;
  // EARLY: ctx_lens[seq] (seq < num_seqs for every block) next to the cu_seqlens pair, and the
  // page-table entries of K tile 0's 16-position groups (lane < BN / 16 of warp 0, entries
  // inside the sequence's table row only) -- three independent loads in flight together.
  int ctx_early = 0;
  int page0_early = -1;
  constexpr bool BV = Cfg<HD, VAR>::BV;
  static_assert(!BV || BN / 16 == kBvGroups, "BV: one page entry per 16-position group of tile 0");
  if constexpr (BV) {
    // BV: from the launch parameters (seq < num_seqs <= kBvSeqs for every block).
    ctx_early = a.bv_ctx[seq];
    if (tid < BN / 16) page0_early = a.bv_pg0[seq][tid];
  } else if constexpr (EARLY) {
    ctx_early = __ldg(reinterpret_cast<const int*>(p.ctx_lens) + seq);
    if (tid < BN / 16) {
      const int pg = (16 * tid) / int(p.page_size);
      if (pg < p.max_pages) {
        page0_early = __ldg(reinterpret_cast<const int*>(p.page_table) + seq * p.max_pages + pg);
      }
    }
  }
  // TQW: the cu_seqlens pair is loaded before the barrier setup below (a plain load would stay
  // behind its __syncthreads).
  int cu_lo = 0, cu_hi = 0;
  if constexpr (BV) {
    cu_lo = a.bv_cu[seq];
    cu_hi = a.bv_cu[seq + 1];
  } else if constexpr (TQW) {
    cu_lo = __ldg(cu + seq);
    cu_hi = __ldg(cu + seq + 1);
  }
  // KE: K tile 0's cache row per 16-position group from the EARLY page entries (as crow_of(0)
  // for a full tile), made warp-uniform in warp 0 while the metadata loads are in flight.
  uint32_t k0row[BN / 16] = {};
  if constexpr (Cfg<HD, VAR>::KE && !Cfg<HD, VAR>::EI) {
    if (tid < 32) {
      const int ps0 = int(p.page_size);
      const int np0 = int(min(p.num_pages, int64_t(0x7fffffff)));
      const int oob = int(min(p.num_pages * p.page_size, int64_t(0x7fffffff)));
      const int c0 =
          (page0_early >= 0 && page0_early < np0) ? page0_early * ps0 + (16 * tid) % ps0 : oob;
#pragma unroll
      for (int g = 0; g < BN / 16; ++g) {
        k0row[g] = __reduce_max_sync(0xffffffffu, tid == g ? uint32_t(c0) : 0u);
      }
    }
  }
  if constexpr (Cfg<HD, VAR>::EI) {
    // EI: everything below comes from the launch parameters (BV), so the block's fate and its
    // first loads are known here. Thread 96 sets up the Q barrier and issues Q's whole-token
    // boxes (as TQW's issuer after the sync), thread 0 the K / V barriers and a full K tile 0
    // (as KE's); each thread only touches barriers it initialized itself until the sync below.
    // A block that returns after the sync (no rows / padding) issues nothing here.
    extern __shared__ uint8_t smem_raw[];
    const uint32_t eq = (smem_u32(smem_raw) + 1023u) & ~1023u;
    const uint32_t ekv = eq + uint32_t(kBM) * HD * 2;
    const uint32_t eb = ekv + 2u * ST * TILE;
    const int64_t ebos = min(max(int64_t(cu_lo), int64_t(0)), T);
    const int64_t eeos = min(max(int64_t(cu_hi), ebos), T);
    const int64_t erows = (eeos - ebos) * G;
    const int64_t em0 = mb * kBM;
    const bool live = em0 < erows && ctx_early >= 0;
    if (tid == 96) {
      mbar_init(eb, 33);
      asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
      fence_proxy_async();
      if (live) {
        const int64_t t0 = em0 / G;
        const int h0 = int(em0 - t0 * G);
        const int first = h0 == 0 ? 0 : G - h0;
        const int nf = (kBM - first) / G;
        const int tok1 = int(ebos + t0) + (h0 > 0 ? 1 : 0);
        issue_q_whole_tokens<HD>(&a.tmap_qa, &a.tmap_qb, int(a.q_nt), eq, eb, first, nf, G,
                                 int(kvh) * G, tok1);
        if (TL) tl_put(10, gtimer());
      }
    } else if (tid == 0) {
      for (int s = 0; s < ST; ++s) {
        mbar_init(eb + 8u * uint32_t(1 + s), 64);
        mbar_init(eb + 8u * uint32_t(1 + ST + s), 64);
        mbar_init(eb + 8u * uint32_t(1 + 2 * ST + s), 256);
        mbar_init(eb + 8u * uint32_t(1 + 3 * ST + s), 256);
      }
      asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
      fence_proxy_async();
      const int etok_hi = live ? int(min(em0 + kBM - 1, erows - 1) / G) : 0;
      if (live && BN <= ctx_early + etok_hi + 1) {
        const uint32_t fb0 = eb + 8u;  // full_k(0)
        const int ps0 = int(p.page_size);
        const int np0 = int(min(p.num_pages, int64_t(0x7fffffff)));
        const int oob = int(min(p.num_pages * p.page_size, int64_t(0x7fffffff)));
        mbar_arrive_expect_tx(fb0, TILE);
        if (TL) tl_put(8, gtimer());
#pragma unroll
        for (int g = 0; g < BN / 16; ++g) {
          const int pg = a.bv_pg0[seq][g];
          const int crow = (pg >= 0 && pg < np0) ? pg * ps0 + (16 * g) % ps0 : oob;
#pragma unroll
          for (int cblk = 0; cblk < HD / 64; ++cblk) {
            tma_load_3d(ekv + uint32_t(cblk * BN * 128 + g * 16 * 128), &a.tmap_k, cblk * 64,
                        int(kvh), crow, fb0);
          }
        }
        if (TL) tl_put(11, gtimer());
      }
    }
  }
  if constexpr (TQW) {
    __syncthreads();  // the barriers set up at entry (thread 96; EI: threads 96 and 0)
    if (TL && tid == 0) tl_put(9, gtimer());
  }
  const int64_t bos = min(max(int64_t(TQW ? cu_lo : cu[seq]), int64_t(0)), T);
  const int64_t eos = min(max(int64_t(TQW ? cu_hi : cu[seq + 1]), bos), T);
  const int64_t rows_total = (eos - bos) * G;
  const int64_t m0 = mb * kBM;
  if (m0 >= rows_total) return;
  const int ctx = EARLY ? ctx_early : reinterpret_cast<const int*>(p.ctx_lens)[seq];
  const int64_t HQ = p.n_q_heads;
  const __nv_bfloat16* q = reinterpret_cast<const __nv_bfloat16*>(p.q);
  __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(p.out);
  auto row_off = [&](int64_t vr) {  // element offset of packed row vr in q / out
    const int64_t tok = vr / G;
    const int64_t hh = vr - tok * G;
    return ((bos + tok) * HQ + kvh * G + hh) * HD;
  };
  if (ctx < 0) {  // padding sequence: zero output rows
    const int64_t rows = min(int64_t(kBM), rows_total - m0);
    for (int64_t i = tid; i < rows * (HD / 8); i += kThreads) {
      const int64_t r = i / (HD / 8);
      const int64_t c = i - r * (HD / 8);
      *reinterpret_cast<uint4*>(out + row_off(m0 + r) + c * 8) = make_uint4(0, 0, 0, 0);
    }
    return;
  }
  const int tok_lo = int(m0 / G);
  const int tok_hi = int(min(m0 + kBM - 1, rows_total - 1) / G);
  const int kv_end = ctx + tok_hi + 1;
  const int n_tiles = (kv_end + BN - 1) / BN;
  const int n_full = (ctx + tok_lo + 1) / BN;
  if (TL && tid == 0) {
    tl_put(0, sm_id() | (static_cast<unsigned long long>(n_tiles) << 32));
    tl_put(1, t_entry);
    // (43: field 8 = the Q issuer before its first box, below; 45: the bounds known, after the
    // barrier sync of field 9.)
    if (!TQ || (TQW && !Cfg<HD, VAR>::KTL)) tl_put(8, gtimer());
  }

  extern __shared__ uint8_t smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sQ = base;
  const uint32_t sKV = sQ + uint32_t(kBM) * HD * 2;  // stage s: K at +2s TILE, V at +(2s+1) TILE
  const uint32_t bars = sKV + 2 * ST * TILE;
  const uint32_t barQ = bars;
  // ORDERED: one scratch word per consumer thread (written, never read).
  // QV: Q rows 64-127 (consumer warpgroup 1) on their own barrier after the K/V ones.
  const uint32_t barQ1 = bars + 8u * uint32_t(1 + 4 * ST);
  const uint32_t scratch = (bars + 8u * uint32_t(1 + 4 * ST + (QV ? 1 : 0)) + 15u) & ~15u;
  auto full_k = [&](int s) { return bars + 8u * uint32_t(1 + s); };
  auto full_v = [&](int s) { return bars + 8u * uint32_t(1 + ST + s); };
  auto empty_k = [&](int s) { return bars + 8u * uint32_t(1 + 2 * ST + s); };
  auto empty_v = [&](int s) { return bars + 8u * uint32_t(1 + 3 * ST + s); };
  if (!TQW && tid == 0) {
    // QV: one warp per Q barrier (Q4: two, 32 rows each).
    mbar_init(barQ, TQ ? 1 : (QV ? (Cfg<HD, VAR>::Q4 ? 64 : 32) : 128));
    if (QV) mbar_init(barQ1, Cfg<HD, VAR>::Q4 ? 64 : 32);
    for (int s = 0; s < ST; ++s) {
      // SPLIT: the two warps of a K (V) pair arrive on the K (V) barriers.
      mbar_init(full_k(s), SPLIT ? 64 : 128);
      mbar_init(full_v(s), SPLIT ? 64 : 128);
      mbar_init(empty_k(s), 256);
      mbar_init(empty_v(s), 256);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  if constexpr (!TQW) {
    __syncthreads();
    if (TL && tid == 0) tl_put(9, gtimer());
  }

  if (tid < 128) {
    // ---------------- producer warpgroup ----------------
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Cfg<HD, VAR>::PROD_REGS));
    // 43: field 7 = the Q-issuing warp (warp 1) past its register release.
    if (TL && TQ && !TQW && tid == 32) tl_put(7, gtimer());
    // 50 / 52: field 7 = K tile 0's issuer (warp 0) past its register release.
    if (TL && Cfg<HD, VAR>::KTL && tid == 0) tl_put(7, gtimer());
    if constexpr (Cfg<HD, VAR>::KE) {
      // KE: a full K tile 0 issued by warp 0 before anything else (its 32 arrivals, lane 0's
      // with the expect-tx); the loop below skips warp 0's share of tile 0.
      if (tid < 32 && BN <= kv_end) {
        const uint32_t fb0 = full_k(0);
        if (tid == 0 && Cfg<HD, VAR>::EI) {
          // EI: thread 0 issued K tile 0 (with the expect-tx) before the sync.
        } else if (tid == 0) {
          mbar_arrive_expect_tx(fb0, TILE);
          if (TL) tl_put(8, gtimer());
#pragma unroll
          for (int g = 0; g < BN / 16; ++g) {
#pragma unroll
            for (int cblk = 0; cblk < HD / 64; ++cblk) {
              tma_load_3d(sKV + uint32_t(cblk * BN * 128 + g * 16 * 128), &a.tmap_k, cblk * 64,
                          int(kvh), int(k0row[g]), fb0);
            }
          }
          if (TL) tl_put(11, gtimer());
        } else {
          mbar_arrive(fb0);
        }
      }
    }
    if constexpr (!QV) {
      load_tile<HD, kBM>(sQ, tid, q, [&](int r) -> const __nv_bfloat16* {
        const int64_t vr = m0 + r;
        return vr < rows_total ? q + row_off(vr) : nullptr;
      });
      cp_async_arrive(barQ);
    } else if (tid == 0) {
      // The K/V tensor maps' first use below would fetch them on the critical path.
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&a.tmap_k))
                   : "memory");
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&a.tmap_v))
                   : "memory");
    }
    const int* table = reinterpret_cast<const int*>(p.page_table) + seq * p.max_pages;
    const __nv_bfloat16* kc = reinterpret_cast<const __nv_bfloat16*>(p.k_cache);
    const __nv_bfloat16* vc = reinterpret_cast<const __nv_bfloat16*>(p.v_cache);
    const int ps = int(p.page_size);
    const int hkv = int(p.n_kv_heads);
    const int num_pages = int(min(p.num_pages, int64_t(0x7fffffff)));
    // Thread mapping of a tile copy: CPR 16-byte chunks per row, RPW rows per warp and pass.
    // Lane L of warp w owns the cache offset of the warp's L-th row (pass L / RPW, row
    // pass * 4 * RPW + w * RPW + L % RPW): one page lookup per row and tile, shared through
    // shuffles by the lanes that copy the row, reused for K and V, and fetched one tile ahead.
    constexpr int CPR = HD / 8;
    constexpr int RPW = 32 / CPR;
    constexpr int PASSES = BN / (4 * RPW);
    static_assert(PASSES * RPW <= 32, "one row offset per lane");
    const int lane = tid % 32;
    const int warp = tid / 32;
    const int c = lane % CPR;
    const uint32_t cw = uint32_t(c % 8);
    const uint32_t cb = uint32_t(c / 8) * uint32_t(BN * 128);
    auto row_offset = [&](int j) -> int64_t {  // element offset of this lane's row; -1 = zeros
      if (lane >= PASSES * RPW) return -1;
      const int r = (lane / RPW) * 4 * RPW + warp * RPW + lane % RPW;
      const int pos = j * BN + r;
      if (pos >= kv_end) return -1;
      const int page = __ldg(table + pos / ps);
      if (page < 0 || page >= num_pages) return -1;
      return ((int64_t(page) * ps + pos % ps) * hkv + kvh) * HD;
    };
    // Copies the K (kv = 0) or V (kv = 1) rows of tile j, whose row offsets are `off`.
    auto copy_tile = [&](int j, int kv, int64_t off) {
      const int s = j % ST;
      // K of tile j - ST is free once its QK^T product completed, V once its PV product did.
      if (j >= ST) mbar_wait(kv == 0 ? empty_k(s) : empty_v(s), uint32_t((j / ST) - 1) & 1u);
      if constexpr (Cfg<HD, VAR>::TMA) {
        // A whole tile of real positions (the launcher guarantees page_size % 16 == 0, so each
        // 16-position run lies in one page): thread 0 issues BN / 16 x HD / 64 TMA loads and
        // announces TILE bytes; the other 127 producer threads only arrive.
        if ((j + 1) * BN <= kv_end) {
          const uint32_t fb = kv == 0 ? full_k(s) : full_v(s);
          if (tid == 0) {
            const int total_rows = int(min(p.num_pages * p.page_size, int64_t(0x7fffffff)));
            int crow[BN / 16];
#pragma unroll
            for (int g = 0; g < BN / 16; ++g) {
              const int pos = j * BN + 16 * g;
              const int page = __ldg(table + pos / ps);
              // Out-of-range page ids load zeros (a fully out-of-bounds box).
              crow[g] = (page >= 0 && page < num_pages) ? page * ps + pos % ps : total_rows;
            }
            mbar_arrive_expect_tx(fb, TILE);
            const CUtensorMap* map = kv == 0 ? &a.tmap_k : &a.tmap_v;
            const uint32_t tile = sKV + uint32_t(2 * s + kv) * TILE;
#pragma unroll
            for (int g = 0; g < BN / 16; ++g) {
#pragma unroll
              for (int cblk = 0; cblk < HD / 64; ++cblk) {
                tma_load_3d(tile + uint32_t(cblk * BN * 128 + g * 16 * 128), map, cblk * 64,
                            int(kvh), crow[g], fb);
              }
            }
          } else {
            mbar_arrive(fb);
          }
          return;
        }
      }
      const __nv_bfloat16* cache = kv == 0 ? kc : vc;
      const uint32_t tile = sKV + uint32_t(2 * s + kv) * TILE + cb;
#pragma unroll 4
      for (int pass = 0; pass < PASSES; ++pass) {
        const int64_t o = __shfl_sync(0xffffffffu, off, pass * RPW + lane / CPR);
        const int r = pass * 4 * RPW + warp * RPW + lane / CPR;
        const uint32_t dst = tile + uint32_t(r) * 128 + ((cw ^ uint32_t(r & 7)) << 4);
        cp_async_16(dst, o >= 0 ? static_cast<const void*>(cache + o + c * 8) : cache,
                    o >= 0 ? 16u : 0u);
      }
      cp_async_arrive(kv == 0 ? full_k(s) : full_v(s));
    };
    if constexpr (SPLIT) {
      // Warps 0-1 copy every K tile, warps 2-3 every V tile, each pair at its own pace (its
      // own empty barriers). A warp copies one 512-byte row per pass (lane = 16-byte chunk),
      // rows pass * 2 + (warp & 1); lane L keeps the row offsets of passes L and L + 32 (one
      // page lookup per row and tile, fetched one tile ahead). TMA: lanes 0..BN/16-1 of each
      // warp keep the cache row of 16-position group `lane` instead, and lane 0 of the pair's
      // first warp issues the loads of a full tile.
      constexpr int NP = BN / 2;
      const int kv = warp >> 1;
      const int wig = warp & 1;
      const __nv_bfloat16* cache = kv == 0 ? kc : vc;
      auto off_of = [&](int j, int pass) -> int64_t {
        if (pass >= NP) return -1;
        const int pos = j * BN + pass * 2 + wig;
        if (pos >= kv_end) return -1;
        const int page = __ldg(table + pos / ps);
        if (page < 0 || page >= num_pages) return -1;
        return ((int64_t(page) * ps + pos % ps) * hkv + kvh) * HD;
      };
      auto crow_of = [&](int j) -> int {  // cache row of group `lane` of a full tile j
        if (!TMA || lane >= BN / 16 || (j + 1) * BN > kv_end) return 0;
        const int pos = j * BN + 16 * lane;
        // EARLY: warp 0's entries of tile 0 were loaded at entry (BV: every warp's, from the
        // launch parameters).
        const int page = (BV && j == 0)                               ? a.bv_pg0[seq][lane]
                         : (Cfg<HD, VAR>::EARLY && j == 0 && warp == 0) ? page0_early
                                                                        : __ldg(table + pos / ps);
        return (page >= 0 && page < num_pages)
                   ? page * ps + pos % ps
                   : int(min(p.num_pages * p.page_size, int64_t(0x7fffffff)));  // zeros
      };
      constexpr bool tma_ok = TMA;
      // TMA: only a partial last tile takes the cp.async path; its offsets are looked up on
      // the spot (no offsets carried through the loop: the producer has 56 registers).
      // QV: Q by the V pair before its first V tile (needed only after the first QK^T and
      // softmax): warp 2 the 64 rows of consumer warpgroup 0, warp 3 those of warpgroup 1 (Q4:
      // their first 32 rows; the K pair's warps 0 / 1 the other 32 after issuing K tile 0),
      // lane = 16-byte chunk; row addresses stepped (one division per warp), rows past the
      // sequence zero-filled. The K pair meanwhile issues K tile 0.
      constexpr int QROWS = Cfg<HD, VAR>::Q4 ? 32 : 64;
      auto load_q = [&](int r0) {
        const int64_t v0 = m0 + r0;
        const int64_t tok0 = v0 / G;
        int hh = int(v0 - tok0 * G);
        const __nv_bfloat16* rowp = q + ((bos + tok0) * HQ + kvh * G + hh) * HD + lane * 8;
        const int64_t jump = (HQ - G + 1) * HD;  // head G-1 of a token -> head 0 of the next
        const int64_t valid_rows = rows_total - v0;
        const uint32_t cbq = sQ + uint32_t(lane / 8) * uint32_t(kBM * 128);
        const uint32_t cwq = uint32_t(lane % 8);
#pragma unroll 4
        for (int i = 0; i < QROWS; ++i) {
          const int r = r0 + i;
          const bool ok = i < valid_rows;
          cp_async_16(cbq + uint32_t(r) * 128u + ((cwq ^ uint32_t(r & 7)) << 4),
                      ok ? static_cast<const void*>(rowp) : q, ok ? 16u : 0u);
          if (++hh == G) {
            hh = 0;
            rowp += jump;
          } else {
            rowp += HD;
          }
        }
        cp_async_arrive(wig == 0 ? barQ : barQ1);
      };
      if constexpr (TQW) {
        // TQW: the whole tokens of the block's 128 rows by TMA from one lane of the K pair's
        // second warp (4 or 8 boxes: NT tokens, one more token when 128 - first leaves NT + 1),
        // the <= 2 (G - 1) rows of the partial first / last token by cp.async from the V pair's
        // second warp (one 512-byte row per instruction, lane = 16-byte chunk; rows past the
        // sequence zero-filled), both on the one Q barrier. No per-lane box loop: any G.
        const int64_t t0 = m0 / G;
        const int h0 = int(m0 - t0 * G);
        const int first = h0 == 0 ? 0 : G - h0;
        const int nf = (kBM - first) / G;  // whole tokens after the first: nt or nt + 1
        const int tok1 = int(bos + t0) + (h0 > 0 ? 1 : 0);  // first whole token
        if (!Cfg<HD, VAR>::EI && kv == 0 && wig == 1) {  // (EI: thread 96 issued them)
          if (lane == 0) {
            issue_q_whole_tokens<HD>(&a.tmap_qa, &a.tmap_qb, int(a.q_nt), sQ, barQ, first, nf, G,
                                     int(kvh) * G, tok1);
            if (TL) tl_put(10, gtimer());
          }
        } else if (kv == 1 && wig == 1) {
          const int tail = kBM - first - nf * G;
          const uint32_t cbq = sQ + uint32_t(lane / 8) * uint32_t(kBM * 128);
          const uint32_t cwq = uint32_t(lane % 8);
          const __nv_bfloat16* qa0 = q + ((int64_t(bos + t0) * HQ) + kvh * G + h0) * HD + lane * 8;
          const __nv_bfloat16* qb0 = q + (int64_t(tok1 + nf) * HQ + kvh * G) * HD + lane * 8;
#pragma unroll 1
          for (int i = 0; i < first + tail; ++i) {
            const bool lo = i < first;
            const int r = lo ? i : nf * G + i;
            const bool ok = m0 + r < rows_total;
            const __nv_bfloat16* src = lo ? qa0 + int64_t(i) * HD : qb0 + int64_t(i - first) * HD;
            cp_async_16(cbq + uint32_t(r) * 128u + ((cwq ^ uint32_t(r & 7)) << 4),
                        ok ? static_cast<const void*>(src) : q, ok ? 16u : 0u);
          }
          cp_async_arrive(barQ);
          if (TL && !Cfg<HD, VAR>::KTL && lane == 0) tl_put(7, gtimer());
        }
      } else if constexpr (TQ) {
        if (kv == 0 && wig == 1) {
          // TQ: the block's 128 rows by TMA (see Cfg); lane i issues item i's HD / 64 boxes.
          const int64_t t0 = m0 / G;
          const int h0 = int(m0 - t0 * G);
          const int first = h0 == 0 ? 0 : G - h0;
          const int nt = int(a.q_nt);
          const int nf = (kBM - first) / G;  // whole tokens after the first: nt or nt + 1
          const int nb = nf > nt ? 1 : 0;
          const int tail = kBM - first - nf * G;
          const int tok1 = int(bos + t0) + (h0 > 0 ? 1 : 0);  // first whole token
          if (lane == 0) mbar_arrive_expect_tx(barQ, uint32_t(kBM) * HD * 2);
          __syncwarp();
          if (TL && lane == 0) tl_put(8, gtimer());  // 43: before the first box
          const int l = lane;
          if (l < first + 1 + nb + tail) {
            const CUtensorMap* map;
            int head, tok, row;
            if (l < first) {
              map = &a.tmap_qr;
              head = int(kvh) * G + h0 + l;
              tok = tok1 - 1;
              row = l;
            } else if (l == first) {
              map = &a.tmap_qa;
              head = int(kvh) * G;
              tok = tok1;
              row = first;
            } else if (l < first + 1 + nb) {
              map = &a.tmap_qb;
              head = int(kvh) * G;
              tok = tok1 + nt;
              row = first + nt * G;
            } else {
              const int j = l - first - 1 - nb;
              map = &a.tmap_qr;
              head = int(kvh) * G + j;
              tok = tok1 + nf;
              row = first + nf * G + j;
            }
#pragma unroll
            for (int cblk = 0; cblk < HD / 64; ++cblk) {
              tma_load_3d(sQ + uint32_t(cblk * kBM * 128 + row * 128), map, cblk * 64, head, tok,
                          barQ);
            }
          }
          if (TL && lane == 0) tl_put(10, gtimer());
        }
      }
      if constexpr (QV && !QC && !TQ) {
        if (kv == 1) {
          load_q(wig * 64);
          if (TL && wig == 0 && lane == 0) tl_put(10, gtimer());
        }
      }
      int64_t oa = -1, ob = -1;
      int crow = 0;
      if (!tma_ok) {
        oa = off_of(0, lane);
        ob = off_of(0, lane + 32);
      }
      crow = crow_of(0);
#pragma unroll 1
      for (int j = 0; j < n_tiles; ++j) {
        const int s = j % ST;
        const uint32_t fb = kv == 0 ? full_k(s) : full_v(s);
        if (j >= ST) mbar_wait(kv == 0 ? empty_k(s) : empty_v(s), uint32_t((j / ST) - 1) & 1u);
        // DEFER: only Q and K tile 0 load until Q has landed (the first QK^T needs nothing else).
        if (Cfg<HD, VAR>::DEFER && j == 1 - kv) mbar_wait(barQ, 0);
        const bool full_tile = (j + 1) * BN <= kv_end;
        if (Cfg<HD, VAR>::KE && j == 0 && kv == 0 && wig == 0 && full_tile) {
          // KE: warp 0's share of K tile 0 was issued before the loop.
        } else if (tma_ok && full_tile) {
          // Lane 0 of the pair's first warp announces the tile's bytes (its arrival), then
          // lanes 0..BN/16-1 of that warp each load their 16-position group (HD/64 boxes);
          // the other 63 threads of the pair arrive.
          if (wig == 0 && lane == 0) {
            mbar_arrive_expect_tx(fb, TILE);
          } else {
            mbar_arrive(fb);
          }
          if (Cfg<HD, VAR>::KU && wig == 0) {
            // KU: the operands made warp-uniform (redux.sync writes a uniform register), so
            // lane 0 issues the HD / 64 x BN / 16 boxes with no per-lane loop and no R2UR.
            const uint32_t tile_u =
                __reduce_max_sync(0xffffffffu, sKV + uint32_t(2 * s + kv) * TILE);
            const uint32_t fb_u = __reduce_max_sync(0xffffffffu, fb);
            const uint32_t kv_u = __reduce_max_sync(0xffffffffu, uint32_t(kv));
            uint32_t cr[BN / 16];
#pragma unroll
            for (int g = 0; g < BN / 16; ++g) {
              cr[g] = __reduce_max_sync(0xffffffffu, lane == g ? uint32_t(crow) : 0u);
            }
            if (lane == 0) {
              // 50: field 8 = right before K tile 0's first box (operands ready).
              if (TL && Cfg<HD, VAR>::KTL && j == 0 && kv_u == 0) tl_put(8, gtimer());
              const CUtensorMap* map = kv_u == 0 ? &a.tmap_k : &a.tmap_v;
#pragma unroll
              for (int g = 0; g < BN / 16; ++g) {
#pragma unroll
                for (int cblk = 0; cblk < HD / 64; ++cblk) {
                  tma_load_3d(tile_u + uint32_t(cblk * BN * 128 + g * 16 * 128), map, cblk * 64,
                              int(kvh), int(cr[g]), fb_u);
                }
              }
            }
          } else if (wig == 0) {
            __syncwarp();
            if (lane < BN / 16) {
              const uint32_t tile =
                  sKV + uint32_t(2 * s + kv) * TILE + uint32_t(lane) * (16u * 128u);
              const CUtensorMap* map = kv == 0 ? &a.tmap_k : &a.tmap_v;
#pragma unroll
              for (int cblk = 0; cblk < HD / 64; ++cblk) {
                tma_load_3d(tile + uint32_t(cblk * BN * 128), map, cblk * 64, int(kvh), crow, fb);
              }
            }
          }
        } else {
          if constexpr (tma_ok) {
            oa = off_of(j, lane);
            ob = off_of(j, lane + 32);
          }
          const uint32_t tile = sKV + uint32_t(2 * s + kv) * TILE + cb;
          // (TMA: the rare partial tile, unrolled less: the producer has 56 registers.)
          constexpr int UNR = TMA ? 1 : 4;
#pragma unroll UNR
          for (int pass = 0; pass < 32; ++pass) {
            const int64_t o = __shfl_sync(0xffffffffu, oa, pass);
            const int r = pass * 2 + wig;
            const uint32_t dst = tile + uint32_t(r) * 128 + ((cw ^ uint32_t(r & 7)) << 4);
            cp_async_16(dst, o >= 0 ? static_cast<const void*>(cache + o + c * 8) : cache,
                        o >= 0 ? 16u : 0u);
          }
#pragma unroll UNR
          for (int pass = 32; pass < NP; ++pass) {
            const int64_t o = __shfl_sync(0xffffffffu, ob, pass - 32);
            const int r = pass * 2 + wig;
            const uint32_t dst = tile + uint32_t(r) * 128 + ((cw ^ uint32_t(r & 7)) << 4);
            cp_async_16(dst, o >= 0 ? static_cast<const void*>(cache + o + c * 8) : cache,
                        o >= 0 ? 16u : 0u);
          }
          cp_async_arrive(fb);
        }
        if (j == 0 && kv == 0) {
          if (TL && !Cfg<HD, VAR>::KE && wig == 0 && lane == 0) tl_put(11, gtimer());
          if constexpr (Cfg<HD, VAR>::Q4) load_q(wig * 64 + QROWS);
        }
        if constexpr (Cfg<HD, VAR>::PF) {
          // After this warp's arrivals on the first tiles (its loads are off the K pipeline's
          // critical path): L2 prefetch of the Q rows (whole tokens, the group's G heads are
          // contiguous) of the block pf_ahead launch indices later, LPT order as above.
          if (kv == 0 && wig == 1 && j == min(1, n_tiles - 1)) {
            const uint32_t lin2 = tl_lin + a.pf_ahead;
            const uint32_t hkv2 = uint32_t(p.n_kv_heads);
            const uint32_t nseq = uint32_t(p.num_seqs);
            const uint32_t rest = lin2 / hkv2;
            const uint32_t mbr = rest / nseq;
            if (mbr < uint32_t(a.max_m_blocks)) {
              const int64_t kvh2 = int64_t(lin2 - rest * hkv2);
              const int64_t seq2 = int64_t(rest - mbr * nseq);
              const int64_t mb2 = a.max_m_blocks - 1 - int64_t(mbr);
              const int64_t b2 = min(max(int64_t(__ldg(cu + seq2)), int64_t(0)), T);
              const int64_t e2 = min(max(int64_t(__ldg(cu + seq2 + 1)), b2), T);
              const int64_t r2 = (e2 - b2) * G;
              const int64_t m2 = mb2 * kBM;
              if (m2 < r2) {
                const int64_t t_lo = m2 / G;
                const int64_t t_hi = min(m2 + kBM - 1, r2 - 1) / G;
                for (int64_t t = t_lo + lane; t <= t_hi; t += 32) {
                  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(
                                   q + ((b2 + t) * HQ + kvh2 * G) * HD),
                               "r"(uint32_t(G * HD * 2))
                               : "memory");
                }
              }
            }
          }
        }
        if (j + 1 < n_tiles) {
          if constexpr (tma_ok) {
            crow = crow_of(j + 1);
          } else {
            oa = off_of(j + 1, lane);
            ob = off_of(j + 1, lane + 32);
          }
        }
      }
    } else if constexpr (REORDER) {
      // K0, K1, V0, K2, V1, ..., V(n-1): the consumers' order (QK^T of tile j+1 is issued before
      // the PV of tile j), so a free K stage is refilled without waiting for the V release before
      // it. One copy site (code size and registers): step 2t+1 copies K(t+1), step 2t+2 V(t).
      int64_t off_v = row_offset(0);                    // offsets of the next V tile
      int64_t off_k = off_v;                            // offsets of the next K tile
      int64_t off_h = 0;                                // offsets of the last K tile (its V later)
#pragma unroll 1
      for (int step = 0; step < 2 * n_tiles; ++step) {
        const bool last = step == 2 * n_tiles - 1;
        const bool is_k = !last && (step == 0 || (step & 1));
        const int j = is_k ? (step + 1) / 2 : (last ? n_tiles - 1 : step / 2 - 1);
        copy_tile(j, is_k ? 0 : 1, is_k ? off_k : off_v);
        if (is_k) {
          off_h = off_k;
          if (j + 1 < n_tiles) off_k = row_offset(j + 1);
        } else {
          off_v = off_h;
        }
      }
    } else {
      int64_t off = row_offset(0);
#pragma unroll 1
      for (int j = 0; j < n_tiles; ++j) {
        copy_tile(j, 0, off);
        copy_tile(j, 1, off);
        if (j + 1 < n_tiles) off = row_offset(j + 1);
      }
    }
    if (TL && !TQ && tid == 0) tl_put(7, gtimer());
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    return;
  }

  // ---------------- consumer warpgroups ----------------
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Cfg<HD, VAR>::CONS_REGS));
  const int ct = tid - 128;
  const int w = ct / 128;
  const int lane = tid % 32;
  const int warp = (ct % 128) / 32;
  const int r_lo = w * 64 + warp * 16 + lane / 4;  // this thread's rows: r_lo and r_lo + 8
  const int64_t vr0 = m0 + r_lo;
  const int64_t vr1 = vr0 + 8;
  const int qpos0 = ctx + int(min(vr0, rows_total - 1) / G);
  const int qpos1 = ctx + int(min(vr1, rows_total - 1) / G);
  const float cl2 = p.scale * 1.4426950408889634f;

  constexpr int NS = BN / 2;  // score accumulators per thread
  constexpr int NO = HD / 2;  // output accumulators per thread
  float o[NO];
#pragma unroll
  for (int i = 0; i < NO; ++i) o[i] = 0.f;
  float s[NS];
  uint32_t pa[NS / 2];
  uint32_t pn[NS / 2];
  float m_0 = -INFINITY, m_1 = -INFINITY, l_0 = 0.f, l_1 = 0.f;

  const uint64_t dq = make_desc(sQ + uint32_t(w) * 64 * 128, 16, 1024);
  auto issue_qk = [&](int j) {
    const int st = j % ST;
    mbar_wait(full_k(st), uint32_t(j / ST) & 1u);
    // Tiles written by cp.async (generic proxy) need the proxy fence before wgmma reads them;
    // TMA tiles (SPLIT variants: every full tile) do not.
    if (!(SPLIT && TMA && kSkipTmaFence) || (j + 1) * BN > kv_end) fence_proxy_async();
    const uint64_t dk = make_desc(sKV + uint32_t(2 * st) * TILE, 16, 1024);
    // Opaque copy of the Q descriptor: recomputing its 16 column offsets here costs a few
    // integer adds; hoisted out of the loop they cost 32 registers (spilled at BN 80).
    uint64_t dqv = dq;
    asm volatile("" : "+l"(dqv));
    wgmma_fence();
#pragma unroll
    for (int kc = 0; kc < HD / 16; ++kc) {
      const uint64_t oq = uint64_t(((kc / 4) * kBM * 128 + (kc % 4) * 32) >> 4);
      const uint64_t ok = uint64_t(((kc / 4) * BN * 128 + (kc % 4) * 32) >> 4);
      if (kc == 0) {
        qk_gemm<NS>(s, dqv + oq, dk + ok);
      } else {
        qk_gemm_acc<NS>(s, dqv + oq, dk + ok);
      }
    }
    wgmma_commit();
  };
  auto issue_pv = [&](int j) {
    const int st = j % ST;
    mbar_wait(full_v(st), uint32_t(j / ST) & 1u);
    if (!(SPLIT && TMA && kSkipTmaFence) || (j + 1) * BN > kv_end) fence_proxy_async();
    const uint64_t dv = make_desc(sKV + uint32_t(2 * st + 1) * TILE, BN * 128, 1024);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      pv_gemm<NO>(o, &pa[4 * kk], dv + uint64_t((kk * 16 * 128) >> 4));
    }
    wgmma_commit();
  };
  // Scales, masks and exponentiates the score tile j in `s` into `pn`; returns the row maxima
  // (log2 domain) and partial row sums through the references.
  auto softmax = [&](int j, float& mn0, float& mn1, float& ls0, float& ls1) {
    const bool masked = j >= n_full;
    const int col0 = j * BN + 2 * (lane % 4);
    // FAST: the max runs over the raw scores (scale > 0: the same maximum after scaling) and
    // each exponent is one FFMA, s * scale - max.
    float mx0 = FAST ? -INFINITY : mn0, mx1 = FAST ? -INFINITY : mn1;
#pragma unroll
    for (int i = 0; i < NS / 4; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = FAST ? s[4 * i + e] : s[4 * i + e] * cl2;
        if (masked) {
          const int pos = col0 + 8 * i + (e & 1);
          if (pos > (e < 2 ? qpos0 : qpos1)) x = -INFINITY;
        }
        s[4 * i + e] = x;
      }
      mx0 = fmaxf(mx0, fmaxf(s[4 * i], s[4 * i + 1]));
      mx1 = fmaxf(mx1, fmaxf(s[4 * i + 2], s[4 * i + 3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    if constexpr (FAST) {
      mx0 = fmaxf(mn0, mx0 * cl2);
      mx1 = fmaxf(mn1, mx1 * cl2);
    }
    mn0 = mx0;
    mn1 = mx1;
    float a0 = 0.f, a1 = 0.f;
#pragma unroll
    for (int i = 0; i < NS / 4; ++i) {
      float p0, p1, p2, p3;
      if constexpr (FAST) {
        p0 = fast_exp2(fmaf(s[4 * i], cl2, -mx0));
        p1 = fast_exp2(fmaf(s[4 * i + 1], cl2, -mx0));
        p2 = fast_exp2(fmaf(s[4 * i + 2], cl2, -mx1));
        p3 = fast_exp2(fmaf(s[4 * i + 3], cl2, -mx1));
      } else {
        p0 = fast_exp2(s[4 * i] - mx0);
        p1 = fast_exp2(s[4 * i + 1] - mx0);
        p2 = fast_exp2(s[4 * i + 2] - mx1);
        p3 = fast_exp2(s[4 * i + 3] - mx1);
      }
      a0 += p0 + p1;
      a1 += p2 + p3;
      if constexpr (LATE_P) {
        s[4 * i] = p0;
        s[4 * i + 1] = p1;
        s[4 * i + 2] = p2;
        s[4 * i + 3] = p3;
      } else {
        pn[2 * i] = pack_bf16(p0, p1);
        pn[2 * i + 1] = pack_bf16(p2, p3);
      }
    }
    ls0 = a0;
    ls1 = a1;
  };

  // The P operand of the next PV product: from `pn` (early P) or packed from `s` (late P; only
  // once the previous PV product, which reads `pa`, completed).
  auto take_p = [&]() {
#pragma unroll
    for (int i = 0; i < NS / 2; ++i) {
      if constexpr (LATE_P) {
        pa[i] = pack_bf16(s[2 * i], s[2 * i + 1]);
      } else {
        pa[i] = pn[i];
      }
    }
  };

  // ORDERED: O *= alpha of the rows (skipped when no row of the warp changed its max), applied
  // right before the next PV issue.
  auto rescale_o = [&](float x0, float x1) {
    if (__any_sync(0xffffffffu, x0 != 1.f || x1 != 1.f)) {
#pragma unroll
      for (int i = 0; i < NO / 4; ++i) {
        o[4 * i] *= x0;
        o[4 * i + 1] *= x0;
        o[4 * i + 2] *= x1;
        o[4 * i + 3] *= x1;
      }
    }
  };
  // ORDERED: a shared-memory store of a value that depends on every exponential of the tile,
  // placed before the PV wait: ptxas does not sink a shared store below a WARPGROUP.DEPBAR, so
  // the MUFU.EX2 stay above it (under the PV product).
  const uint32_t my_scratch = scratch + uint32_t(ct) * 4u;
  auto order_point = [&](float x) {
    if constexpr (ORDERED) {
      asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(my_scratch), "f"(x) : "memory");
    }
  };
  float pal0 = 1.f, pal1 = 1.f;  // ORDERED: the pending O rescale of the next PV product

  // (QV: warpgroup 1 opens warpgroup 0's first turn before waiting for its own Q rows.)
  if (QV && w == 1) asm volatile("bar.arrive 1, 256;\n" ::: "memory");
  if constexpr (QC) {
    // QC: this warpgroup's 64 rows, warp `warp` rows warp + 4 i (one 512-byte row per
    // instruction, lane = 16-byte chunk), addresses stepped as in the STEP epilogue; rows past
    // the sequence zero-filled. Then every thread's copies landed (wait_all), made visible to
    // the async proxy (wgmma reads Q through it), and the warpgroup syncs on its named barrier.
    const int t = ct % 128;
    const int cq = t % 32;
    const int64_t vq = m0 + w * 64 + t / 32;
    int64_t tq = vq / G;
    int hq = int(vq - tq * G);
    const int q4 = 4 / G;
    const int r4 = 4 - q4 * G;
    const uint32_t cbq = sQ + uint32_t(cq / 8) * uint32_t(kBM * 128);
    const uint32_t cwq = uint32_t(cq % 8);
#pragma unroll 4
    for (int rr = t / 32; rr < 64; rr += 4) {
      const int r = w * 64 + rr;
      const bool ok = m0 + r < rows_total;
      const __nv_bfloat16* src = q + ((bos + tq) * HQ + kvh * G + hq) * HD + cq * 8;
      cp_async_16(cbq + uint32_t(r) * 128u + ((cwq ^ uint32_t(r & 7)) << 4),
                  ok ? static_cast<const void*>(src) : q, ok ? 16u : 0u);
      tq += q4;
      hq += r4;
      if (hq >= G) {
        hq -= G;
        ++tq;
      }
    }
    if (TL && ct == 0) tl_put(10, gtimer());
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    fence_proxy_async();
    if (w == 0) {
      asm volatile("bar.sync 3, 128;\n" ::: "memory");
    } else {
      asm volatile("bar.sync 4, 128;\n" ::: "memory");
    }
  } else {
    mbar_wait((QV && !TQ && w == 1) ? barQ1 : barQ, 0);
    // TQW: the partial-token rows came by cp.async (generic proxy); wgmma reads Q through the
    // async proxy.
    if constexpr (Cfg<HD, VAR>::TQW) fence_proxy_async();
  }
  if (TL && ct == 0) tl_put(2, gtimer());
  // Ping-pong: warpgroup w waits on barrier 1 + w before issuing, then lets the other one go.
  // Warpgroup 1 opens warpgroup 0's first turn and skips its own last hand-over, so every
  // barrier sees as many arrivals as waits.
  auto turn_wait = [&]() {
    if constexpr (PP) {
      if (w == 0) {
        asm volatile("bar.sync 1, 256;\n" ::: "memory");
      } else {
        asm volatile("bar.sync 2, 256;\n" ::: "memory");
      }
    }
  };
  auto turn_pass = [&]() {
    if constexpr (PP) {
      if (w == 0) {
        asm volatile("bar.arrive 2, 256;\n" ::: "memory");
      } else {
        asm volatile("bar.arrive 1, 256;\n" ::: "memory");
      }
    }
  };
  if (!QV && w == 1) turn_pass();
  turn_wait();
  issue_qk(0);
  turn_pass();
  wgmma_wait<0>();
  fence_regs(s);
  if (TL && ct == 0) tl_put(3, gtimer());
  mbar_arrive(empty_k(0));
  {
    float mn0 = m_0, mn1 = m_1, ls0, ls1;
    softmax(0, mn0, mn1, ls0, ls1);
    m_0 = mn0;
    m_1 = mn1;
    l_0 = ls0;
    l_1 = ls1;
    take_p();
  }
  // Steady state: QK^T of tile j+1 and PV of tile j in flight together; softmax of j+1 overlaps
  // the PV product. The last tile runs its PV product alone.
  for (int j = 0; j + 1 < n_tiles; ++j) {
    turn_wait();
    issue_qk(j + 1);
    if constexpr (ORDERED) rescale_o(pal0, pal1);
    issue_pv(j);
    turn_pass();
    float mn0 = m_0, mn1 = m_1, ls0, ls1;
    wgmma_wait<1>();
    fence_regs(s);
    mbar_arrive(empty_k((j + 1) % ST));
    softmax(j + 1, mn0, mn1, ls0, ls1);
    if constexpr (ORDERED) {
      pal0 = m_0 == mn0 ? 1.f : fast_exp2(m_0 - mn0);
      pal1 = m_1 == mn1 ? 1.f : fast_exp2(m_1 - mn1);
      l_0 = l_0 * pal0 + ls0;
      l_1 = l_1 * pal1 + ls1;
      m_0 = mn0;
      m_1 = mn1;
      order_point(l_0 + l_1);
      wgmma_wait<0>();
      fence_regs(o);
      fence_regs(pa);
      mbar_arrive(empty_v(j % ST));
      take_p();
      continue;
    }
    wgmma_wait<0>();
    fence_regs(o);
    fence_regs(pa);
    mbar_arrive(empty_v(j % ST));
    // FAST: an unchanged row max gives exactly 1 (no rescale); the warp skips the 128
    // multiplies when none of its 16 rows changed.
    const float al0 = (FAST && m_0 == mn0) ? 1.f : fast_exp2(m_0 - mn0);
    const float al1 = (FAST && m_1 == mn1) ? 1.f : fast_exp2(m_1 - mn1);
    if (!FAST || __any_sync(0xffffffffu, al0 != 1.f || al1 != 1.f)) {
#pragma unroll
      for (int i = 0; i < NO / 4; ++i) {
        o[4 * i] *= al0;
        o[4 * i + 1] *= al0;
        o[4 * i + 2] *= al1;
        o[4 * i + 3] *= al1;
      }
    }
    l_0 = l_0 * al0 + ls0;
    l_1 = l_1 * al1 + ls1;
    m_0 = mn0;
    m_1 = mn1;
    take_p();
  }
  turn_wait();
  if constexpr (ORDERED) rescale_o(pal0, pal1);
  issue_pv(n_tiles - 1);
  if (w == 0) turn_pass();
  wgmma_wait<0>();
  fence_regs(o);
  if (TL && ct == 0) tl_put(4, gtimer());
  mbar_arrive(empty_v((n_tiles - 1) % ST));
  l_0 += __shfl_xor_sync(0xffffffffu, l_0, 1);
  l_0 += __shfl_xor_sync(0xffffffffu, l_0, 2);
  l_1 += __shfl_xor_sync(0xffffffffu, l_1, 1);
  l_1 += __shfl_xor_sync(0xffffffffu, l_1, 2);
  const float inv0 = l_0 > 0.f ? 1.f / l_0 : 0.f;
  const float inv1 = l_1 > 0.f ? 1.f / l_1 : 0.f;
  const int cq = 2 * (lane % 4);
  if constexpr (Cfg<HD, VAR>::STAGED) {
    // This warpgroup's QK^T products are complete (its last wgmma wait above), so its 64 rows
    // of the Q tile are free: stage the bf16 O rows there in the same 128B-swizzled layout
    // (conflict-free 4-byte stores), then copy them out as 16-byte chunks, one 512-byte row per
    // warp and pass. Named barrier 3 + w syncs the warpgroup's 128 threads.
    const int rr0 = warp * 16 + lane / 4;  // row within the warpgroup's 64 (and rr0 + 8)
    // = sQ + w * 64 * 128, read back from the Q descriptor's address field (live anyway): keeping
    // sQ itself live through the loop cost a register and spills.
    const uint32_t wq = uint32_t(dq & 0x3FFFu) << 4;
    if constexpr (Cfg<HD, VAR>::STM) {
      // Column groups i, i + 1 (8 columns each) of the warp's 16 rows = four 8 x 8 matrices:
      // (rows 0-7, i), (rows 8-15, i), (rows 0-7, i + 1), (rows 8-15, i + 1); lane l gives the
      // address of row l % 8 of matrix l / 8 (one 16-byte chunk of the swizzled row).
      const int smi = lane / 8;
      const int srow = warp * 16 + (smi & 1) * 8 + lane % 8;
      const uint32_t srow_a = wq + uint32_t(srow) * 128u;
      const uint32_t sx = uint32_t(srow & 7);
#pragma unroll
      for (int i = 0; i < NO / 4; i += 2) {
        const int grp = i + (smi >> 1);
        const uint32_t addr = srow_a + uint32_t(grp / 8) * uint32_t(kBM * 128) +
                              ((uint32_t(grp % 8) ^ sx) << 4);
        asm volatile(
            "stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
            "r"(pack_bf16(o[4 * i] * inv0, o[4 * i + 1] * inv0)),
            "r"(pack_bf16(o[4 * i + 2] * inv1, o[4 * i + 3] * inv1)),
            "r"(pack_bf16(o[4 * i + 4] * inv0, o[4 * i + 5] * inv0)),
            "r"(pack_bf16(o[4 * i + 6] * inv1, o[4 * i + 7] * inv1)));
      }
    }
#pragma unroll
    for (int i = 0; i < (Cfg<HD, VAR>::STM ? 0 : NO / 4); ++i) {
      const int col = 8 * i + cq;
      const uint32_t blk = wq + uint32_t(col / 64) * uint32_t(kBM * 128);
      const uint32_t ch = uint32_t((col % 64) / 8);
      const uint32_t in16 = uint32_t(col % 8) * 2u;
      const uint32_t a0 = blk + uint32_t(rr0) * 128u + ((ch ^ uint32_t(rr0 & 7)) << 4) + in16;
      const uint32_t a1 =
          blk + uint32_t(rr0 + 8) * 128u + ((ch ^ uint32_t((rr0 + 8) & 7)) << 4) + in16;
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(a0),
                   "r"(pack_bf16(o[4 * i] * inv0, o[4 * i + 1] * inv0)));
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(a1),
                   "r"(pack_bf16(o[4 * i + 2] * inv1, o[4 * i + 3] * inv1)));
    }
    constexpr bool OST = Cfg<HD, VAR>::OST;
    static_assert(!OST || Cfg<HD, VAR>::STEP, "OST skips its box rows in the stepped loop");
    // OST: the staged rows are read by the async proxy (TMA store) after the barrier.
    if constexpr (OST) fence_proxy_async();
    if (w == 0) {
      asm volatile("bar.sync 3, 128;\n" ::: "memory");
    } else {
      asm volatile("bar.sync 4, 128;\n" ::: "memory");
    }
    const int t = ct % 128;
    const int c = t % 32;  // 16-byte chunk of the row
    // OST: one TMA box per column block, issued by the warpgroup's thread 0, at (head hh0 of
    // the first row, its token), box G heads x 64 / G tokens: its in-bounds lines are the rows
    // of heads >= hh0 of the first 64 / G tokens (staged line t' G + h' = row t' G + h'); the
    // threads store the other rows (heads < hh0, or past those tokens). Only when all 64 rows
    // lie in the sequence (the tensor map's token bound is T, not eos). Session 7: session 6's
    // second box (the heads below hh0 one token later, at the negative head coordinate hh0 - G)
    // raised CUDA_ERROR_ILLEGAL_INSTRUCTION on an H200 (memcheck: that UTMASTG, not the first
    // box's): a tensor store takes no negative coordinate.
    bool ost_on = false;
    int ost_h0 = 0;
    int64_t ost_t0 = 0;
    if constexpr (OST) {
      const int64_t v0 = m0 + w * 64;
      ost_t0 = v0 / G;
      ost_h0 = int(v0 - ost_t0 * G);
      ost_on = v0 + 64 <= rows_total;
      if (ost_on && t == 0) {
        const int ta = int(bos + ost_t0);
#pragma unroll
        for (int cb = 0; cb < HD / 64; ++cb) {
          const uint32_t src = wq + uint32_t(cb) * uint32_t(kBM * 128);
          tma_store_4d(&a.tmap_o, src, cb * 64, ost_h0, int(kvh), ta);
        }
        asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
      }
    }
    // QV: token and head of this thread's first output row m0 + w * 64 + t / 32.
    int64_t tb = 0;
    int hb = 0;
    // STEP: rows 4 apart -> the token advances by q4 and the head by r4 (with a carry).
    const int q4 = Cfg<HD, VAR>::STEP ? 4 / G : 0;
    const int r4 = Cfg<HD, VAR>::STEP ? 4 - q4 * G : 0;
    if constexpr (QV) {
      const int64_t vb = m0 + w * 64 + t / 32;
      tb = vb / G;
      hb = int(vb - tb * G);
    }
#pragma unroll 4
    for (int rr = t / 32; rr < 64; rr += 4) {
      const int64_t vr = vr0 - r_lo + w * 64 + rr;  // = m0 + w * 64 + rr (vr0 is live anyway)
      // OST: rows of the TMA box are not stored again (warp-uniform: one row per warp).
      if (OST && ost_on && hb >= ost_h0 && tb - ost_t0 < 64 / G) {
        tb += q4;
        hb += r4;
        if (hb >= G) {
          hb -= G;
          ++tb;
        }
        continue;
      }
      const uint32_t src = wq + uint32_t(c / 8) * uint32_t(kBM * 128) + uint32_t(rr) * 128u +
                           ((uint32_t(c % 8) ^ uint32_t(rr & 7)) << 4);
      uint4 v;
      asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                   : "r"(src)
                   : "memory");
      if constexpr (Cfg<HD, VAR>::STEP) {
        const int64_t off = ((bos + tb) * HQ + kvh * G + hb) * HD;
        if (vr < rows_total) *reinterpret_cast<uint4*>(out + off + c * 8) = v;
        tb += q4;
        hb += r4;
        if (hb >= G) {
          hb -= G;
          ++tb;
        }
      } else if constexpr (QV) {
        // Row vr = vb + (rr - t / 32): one 32-bit division per row (row_off divides in 64 bits).
        const uint32_t x = uint32_t(hb) + uint32_t(rr - t / 32);
        const uint32_t dt = x / uint32_t(G);
        const int64_t off = ((bos + tb + dt) * HQ + kvh * G + int(x - dt * uint32_t(G))) * HD;
        if (vr < rows_total) *reinterpret_cast<uint4*>(out + off + c * 8) = v;
      } else {
        if (vr < rows_total) *reinterpret_cast<uint4*>(out + row_off(vr) + c * 8) = v;
      }
    }
    if constexpr (OST) {
      // The staged rows must stay until the TMA has read them (the CTA's exit frees them).
      if (ost_on && t == 0) asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
    }
    if (TL && (ct == 0 || ct == 128)) tl_put(ct == 0 ? 5 : 6, gtimer());
    return;
  }
  if (vr0 < rows_total) {
    __nv_bfloat16* dst = out + row_off(vr0) + cq;
#pragma unroll
    for (int i = 0; i < NO / 4; ++i) {
      *reinterpret_cast<uint32_t*>(dst + 8 * i) = pack_bf16(o[4 * i] * inv0, o[4 * i + 1] * inv0);
    }
  }
  if (vr1 < rows_total) {
    __nv_bfloat16* dst = out + row_off(vr1) + cq;
#pragma unroll
    for (int i = 0; i < NO / 4; ++i) {
      *reinterpret_cast<uint32_t*>(dst + 8 * i) =
          pack_bf16(o[4 * i + 2] * inv1, o[4 * i + 3] * inv1);
    }
  }
#elif defined(__CUDA_ARCH__)
  __trap();  // never launched without an sm_90a image (prepare); fail loudly if it is
#endif  // DK_ATTN_SM90A
}

// Persistent variants 23 / 24 (head dim 256): the tiles, producer, softmax, schedule and staged
// output of variant 19, but min(blocks, SMs) CTAs (24: at most 8, a test variant that gives every
// CTA many blocks) each walk the LPT block list in a snake order (CTA c takes entry k * P + c in
// even rounds k, k * P + P - 1 - c in odd ones; P = gridDim.x), so the per-block costs of a
// launched CTA (launch, barrier init, Q and first K/V tiles loaded before any GEMM, the output
// written with nothing else in flight) overlap with the neighbouring blocks:
// - the K/V stage ring and its mbarrier phases run on across blocks (global tile count), so the
//   producer pairs load the next block's first tiles while the consumers finish the current one;
// - the K pair loads Q half 0 (the 64 rows of consumer warpgroup 0) and the V pair Q half 1 after
//   their block's first two tiles, once that warpgroup released the half (full_q / empty_q
//   mbarriers: the half also stages the warpgroup's output rows); the K pair's warp 0 prefetches
//   the block's Q rows into L2 (bulk prefetch per token) when it starts the block's tiles;
// - the ping-pong turns run on across blocks (warpgroup 1 opens once, warpgroup 0 closes once).
// Padding sequences' rows are zeroed by the consumers; empty entries are skipped by every role.
// 36 (S0T): the same protocol; only the consumers' stage arithmetic differs. Session 5's 23 lost
// 7-10% at 8k/32k because inside the block loop ptxas kept the tile counter (and so the ring
// stage (gt + j) % 2) in a vector register and every K/V wgmma descriptor went through R2UR
// (82 per tile vs 34 in 19; 784 instructions per tile vs 653, 4 LDL in the loop). 36 picks the
// block body by the parity of the tiles before it (two instantiations, S0 = 0 / 1; the branch
// sits between blocks, where no wgmma is in flight) and unrolls the steady loop by two with an
// exit test before each step, so each copy's stages are constants; the stage addresses are
// opaque to NVVM (else it hoisted all 16 K descriptors of each copy out of the loop: spills).
// nvcc 13.0 (tools/attn_sass.sh 36): steady loop 661 / 681 instructions and 38 / 36 R2UR per
// tile in the two copies (30: 653 / 34), no local memory in it; 120 B of spill stores at block
// transitions (23: 100 B). On an H200 (session 8, call 1) correct and sanitizer-clean but 5-12%
// slower than 30: its loop ran 4-9% slower per tile (ptxas built all 16 Q descriptors, moved
// from a vector register to uniform ones, between the K wait and the first QK^T product: ~100
// instructions on every tile's critical path; 30 interleaves them with the products), and a
// block started 2.0 us after the previous one's output (the metadata chain) vs 0.23 us
// between launched CTAs. Since then (session 8, round 2) 36-38 rebuild the Q half's address
// from the window and a warp-broadcast offset (uniform: 615 / 640 instructions, 4.5 / 6 R2UR
// per tile) and load each block's metadata one block ahead (MP in block_of); 168 B of spill
// stores at block transitions, none in the loop. 38 also stamps the producer's side (fields 8-11).
// H200, session 8 call 2: correct and sanitizer-clean, the loop at 30's rate (varlen 2.44 vs 2.45
// us per tile), still 4-8% slower than 30 overall: WG0 starts the next block 3.1 us after its
// output (not the metadata: prefetched; the transition's spill reloads and the warps' spread),
// its Q half is free 1.3 us after that, the K pair then needs 4.2-4.5 us to issue the 64 Q rows
// by cp.async (30's V warp: 1.6 us at a fresh CTA; here next to the other warpgroup's last PV /
// epilogue and the next tiles' TMA), the epilogue 3.3 us (30: 2.9). What a persistent kernel
// must do next: TMA (or earlier) Q loads and no staging through the Q half, few transition spills.
#ifdef DK_ATTN_SM90A
__device__ __forceinline__ void prefetch_l2(const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes) : "memory");
}
#endif
template <int VAR>
__global__ void __launch_bounds__(kThreads, 1)
    prefill_persist_kernel(const __grid_constant__ Args a) {
#ifdef DK_ATTN_SM90A
  constexpr int HD = 256;
  using C = Cfg<HD, VAR>;
  constexpr int BN = C::BN;
  constexpr int ST = C::STAGES;
  static_assert(C::PERSIST && C::SPLIT && C::TMA && C::FAST && C::ORDERED && C::LATE_P &&
                    C::STAGED && C::PP,
                "the persistent kernel is variant 19's pipeline");
  static_assert(128 * C::PROD_REGS + 256 * C::CONS_REGS <= 65536);
  constexpr uint32_t TILE = uint32_t(BN) * HD * 2;
  const DkAttnPrefillSm90Params& p = a.p;
  const int G = a.group;
  const uint32_t NB = a.total_blocks;
  const uint32_t NP = gridDim.x;
  const uint32_t cta = blockIdx.x;
  const uint32_t HKV = uint32_t(p.n_kv_heads);
  const uint32_t NSEQ = uint32_t(p.num_seqs);
  const int MMB = int(a.max_m_blocks);
  const int T = int(p.num_tokens);  // the launcher keeps num_tokens * G below 2^31
  const int64_t HQ = p.n_q_heads;
  const int* cu = reinterpret_cast<const int*>(p.cu_seqlens);
  const int* ctxs = reinterpret_cast<const int*>(p.ctx_lens);
  const __nv_bfloat16* q = reinterpret_cast<const __nv_bfloat16*>(p.q);
  __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(p.out);
  const int tid = threadIdx.x;

  // Entry k of this CTA's walk: 0 past the end, 1 nothing to do, 2 padding rows, 3 a block.
  int seq = 0, kvh = 0, m0 = 0, rows_total = 0, bos = 0, ctx = 0;
  uint32_t blin = 0;  // the block's LPT index (TL records)
  // MP (36-38): the three metadata words of entry k (cu_seqlens pair, ctx_lens of its sequence)
  // loaded together one block ahead (`meta_of(k + 1)` when block k starts), so a block starts
  // without a dependent global load chain after the previous block's epilogue.
  constexpr bool MP = VAR >= 36 && VAR <= 38;
  struct Meta {
    int c0 = 0, c1 = 0, cx = 0;
  };
  auto seq_of = [&](uint32_t k, uint32_t& lin) -> bool {
    const uint32_t base = k * NP;
    if (base >= NB) return false;
    lin = base + ((k & 1u) ? NP - 1u - cta : cta);
    return lin < NB;
  };
  auto meta_of = [&](uint32_t k) -> Meta {
    Meta m;
    uint32_t lin = 0;
    if (MP && seq_of(k, lin)) {
      const int sq = int((lin / HKV) % NSEQ);
      m.c0 = cu[sq];
      m.c1 = cu[sq + 1];
      m.cx = ctxs[sq];
    }
    return m;
  };
  auto block_of = [&](uint32_t k, const Meta& mt) -> int {
    const uint32_t base = k * NP;
    if (base >= NB) return 0;
    const uint32_t lin = base + ((k & 1u) ? NP - 1u - cta : cta);
    if (lin >= NB) return 1;
    blin = lin;
    const uint32_t rest = lin / HKV;
    kvh = int(lin - rest * HKV);
    seq = int(rest % NSEQ);
    m0 = (MMB - 1 - int(rest / NSEQ)) * kBM;
    // Loaded values broadcast from lane 0: warp-uniform for the compiler, so the block loop's
    // branches and trip counts, and the loop counters and ring stages in them, stay in uniform
    // registers (else every wgmma descriptor of the consumers goes through R2UR).
    bos = __shfl_sync(0xffffffffu, min(max(MP ? mt.c0 : cu[seq], 0), T), 0);
    const int eos = __shfl_sync(0xffffffffu, min(max(MP ? mt.c1 : cu[seq + 1], bos), T), 0);
    rows_total = (eos - bos) * G;
    if (m0 >= rows_total) return 1;
    ctx = __shfl_sync(0xffffffffu, MP ? mt.cx : ctxs[seq], 0);
    return ctx < 0 ? 2 : 3;
  };
  // Element offset of packed row (token tok, head hh of the group) in q / out.
  auto qo_off = [&](int tok, int hh) -> int64_t {
    return ((int64_t(bos) + tok) * HQ + int64_t(kvh) * G + hh) * HD;
  };

  extern __shared__ uint8_t smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sQ = base;
  const uint32_t sKV = sQ + uint32_t(kBM) * HD * 2;  // stage s: K at +2s TILE, V at +(2s+1) TILE
  const uint32_t bars = sKV + 2 * ST * TILE;
  auto full_k = [&](int s) { return bars + 8u * uint32_t(s); };
  auto full_v = [&](int s) { return bars + 8u * uint32_t(ST + s); };
  auto empty_k = [&](int s) { return bars + 8u * uint32_t(2 * ST + s); };
  auto empty_v = [&](int s) { return bars + 8u * uint32_t(3 * ST + s); };
  auto full_q = [&](int h) { return bars + 8u * uint32_t(4 * ST + h); };
  auto empty_q = [&](int h) { return bars + 8u * uint32_t(4 * ST + 2 + h); };
  if (tid == 0) {
    for (int s = 0; s < ST; ++s) {
      mbar_init(full_k(s), 64);
      mbar_init(full_v(s), 64);
      mbar_init(empty_k(s), 256);
      mbar_init(empty_v(s), 256);
    }
    for (int h = 0; h < 2; ++h) {
      mbar_init(full_q(h), 64);    // the loading pair's cp.async arrivals
      mbar_init(empty_q(h), 128);  // the warpgroup's threads, after their output reads
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (tid < 128) {
    // ---------------- producer warpgroup: K pair (warps 0-1), V pair (warps 2-3) ----------------
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(C::PROD_REGS));
    const int lane = tid % 32;
    const int warp = tid / 32;
    const int kv = warp >> 1;  // 0: K tiles and Q half 0; 1: V tiles and Q half 1
    const int wig = warp & 1;
    const __nv_bfloat16* cache =
        reinterpret_cast<const __nv_bfloat16*>(kv == 0 ? p.k_cache : p.v_cache);
    const CUtensorMap* map = kv == 0 ? &a.tmap_k : &a.tmap_v;
    const int ps = int(p.page_size);
    const int hkv = int(p.n_kv_heads);
    const int num_pages = int(min(p.num_pages, int64_t(0x7fffffff)));
    const int oob_row = int(min(p.num_pages * p.page_size, int64_t(0x7fffffff)));
    const uint32_t cw = uint32_t(lane % 8);
    const uint32_t cbk = uint32_t(lane / 8) * uint32_t(BN * 128);   // column block in a K/V tile
    const uint32_t cbq = uint32_t(lane / 8) * uint32_t(kBM * 128);  // column block in the Q tile
    uint32_t gt = 0;  // tiles of earlier blocks (the ring position)
    uint32_t nq = 0;  // blocks so far (the Q barriers' phase)
    Meta mnext = meta_of(0);
#pragma unroll 1
    for (uint32_t k = 0;; ++k) {
      const Meta mcur = mnext;
      const int kind = block_of(k, mcur);
      if (kind == 0) break;
      mnext = meta_of(k + 1);
      if (kind != 3) continue;
      // 38: the producer's side of the block (K pair, half 0): 8 = block started, 9 = Q half 0
      // free (empty_q passed), 10 = its Q rows issued, 11 = K tile 0 issued.
      auto tlp = [&](int f) {
        if constexpr (C::TL) {
          if (kv == 0 && wig == 0 && lane == 0 && blin < uint32_t(kTlBlocks)) {
            g_prefill_tl[size_t(blin) * kTlFields + f] = gtimer();
          }
        }
      };
      tlp(8);
      const int tok_lo = m0 / G;
      const int tok_hi = min(m0 + kBM - 1, rows_total - 1) / G;
      const int kv_end = ctx + tok_hi + 1;
      const int n_tiles = (kv_end + BN - 1) / BN;
      const int* table = reinterpret_cast<const int*>(p.page_table) + int64_t(seq) * p.max_pages;
      if (warp == 0) {
        // The block's Q rows into L2 (one contiguous run of G heads per token), so the Q load
        // below reads L2 when the warpgroup releases its half.
        for (int t = tok_lo + lane; t <= tok_hi; t += 32) prefetch_l2(q + qo_off(t, 0), G * HD * 2);
      }
      auto off_of = [&](int j, int pass) -> int64_t {
        if (pass >= BN / 2) return -1;
        const int pos = j * BN + pass * 2 + wig;
        if (pos >= kv_end) return -1;
        const int page = __ldg(table + pos / ps);
        if (page < 0 || page >= num_pages) return -1;
        return ((int64_t(page) * ps + pos % ps) * hkv + kvh) * HD;
      };
      auto crow_of = [&](int j) -> int {  // cache row of 16-position group `lane` of full tile j
        if (lane >= BN / 16 || (j + 1) * BN > kv_end) return 0;
        const int pos = j * BN + 16 * lane;
        const int page = __ldg(table + pos / ps);
        return (page >= 0 && page < num_pages) ? page * ps + pos % ps : oob_row;  // OOB: zeros
      };
      // Q half `kv` (rows 64 kv .. 64 kv + 63 of the block): one 512-byte row per warp and pass
      // (lane = 16-byte chunk), rows 2 pass + wig; (token, head) stepped, not divided, per row.
      auto load_q = [&]() {
        if (nq > 0) mbar_wait(empty_q(kv), (nq - 1u) & 1u);
        tlp(9);
        int vr = m0 + kv * 64 + wig;
        int tok = vr / G;
        int hh = vr - tok * G;
#pragma unroll 1
        for (int pass = 0; pass < 32; ++pass) {
          const int rr = kv * 64 + 2 * pass + wig;
          const bool ok = vr < rows_total;
          const __nv_bfloat16* src = ok ? q + qo_off(tok, hh) + lane * 8 : q;
          cp_async_16(sQ + cbq + uint32_t(rr) * 128u + ((cw ^ uint32_t(rr & 7)) << 4), src,
                      ok ? 16u : 0u);
          vr += 2;
          hh += 2;
          while (hh >= G) {
            hh -= G;
            ++tok;
          }
        }
        cp_async_arrive(full_q(kv));
        tlp(10);
      };
      const int qat = min(ST, n_tiles);
      int crow = crow_of(0);
#pragma unroll 1
      for (int j = 0; j < n_tiles; ++j) {
        if (j == qat) load_q();
        const uint32_t g = gt + uint32_t(j);
        const int s = int(g % ST);
        const uint32_t fb = kv == 0 ? full_k(s) : full_v(s);
        if (g >= ST) mbar_wait(kv == 0 ? empty_k(s) : empty_v(s), ((g / ST) - 1u) & 1u);
        if ((j + 1) * BN <= kv_end) {
          // Full tile: TMA (lanes 0..BN/16-1 of the pair's first warp, lane 0 announces the
          // bytes); the other 63 threads of the pair arrive.
          if (wig == 0 && lane == 0) {
            mbar_arrive_expect_tx(fb, TILE);
          } else {
            mbar_arrive(fb);
          }
          if (wig == 0) {
            __syncwarp();
            if (lane < BN / 16) {
              const uint32_t tile =
                  sKV + uint32_t(2 * s + kv) * TILE + uint32_t(lane) * (16u * 128u);
#pragma unroll
              for (int cblk = 0; cblk < HD / 64; ++cblk) {
                tma_load_3d(tile + uint32_t(cblk * BN * 128), map, cblk * 64, kvh, crow, fb);
              }
            }
          }
        } else {
          // The partial last tile: cp.async, zeros past the causal end.
          const int64_t oa = off_of(j, lane);
          const int64_t ob = off_of(j, lane + 32);
          const uint32_t tile = sKV + uint32_t(2 * s + kv) * TILE + cbk;
#pragma unroll 1
          for (int pass = 0; pass < BN / 2; ++pass) {
            const int64_t o = __shfl_sync(0xffffffffu, pass < 32 ? oa : ob, pass & 31);
            const int r = pass * 2 + wig;
            const uint32_t dst = tile + uint32_t(r) * 128 + ((cw ^ uint32_t(r & 7)) << 4);
            cp_async_16(dst, o >= 0 ? static_cast<const void*>(cache + o + lane * 8) : cache,
                        o >= 0 ? 16u : 0u);
          }
          cp_async_arrive(fb);
        }
        if (j == 0) tlp(11);
        if (j + 1 < n_tiles) crow = crow_of(j + 1);
      }
      if (qat == n_tiles) load_q();
      gt += uint32_t(n_tiles);
      ++nq;
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    return;
  }

  // ---------------- consumer warpgroups ----------------
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(C::CONS_REGS));
  const int ct = tid - 128;
  const int w = ct / 128;
  const int lane = tid % 32;
  const int warp = (ct % 128) / 32;
  const int r_lo = w * 64 + warp * 16 + lane / 4;  // this thread's rows: r_lo and r_lo + 8
  const float cl2 = p.scale * 1.4426950408889634f;
  constexpr int NS = BN / 2;  // score accumulators per thread
  constexpr int NO = HD / 2;  // output accumulators per thread
  const uint64_t dq = make_desc(sQ + uint32_t(w) * 64 * 128, 16, 1024);
  // 36: this warpgroup's Q half offset, broadcast from lane 0 (warp-uniform for ptxas).
  const uint32_t wq_u = __shfl_sync(0xffffffffu, uint32_t(w) * 64u * 128u, 0);
  // The order point's scratch word, rebuilt from the Q descriptor's address (live anyway) where
  // it is used: kept in a register through the block loop it was spilled.
  constexpr uint32_t kScratchOff =
      (uint32_t(kBM) * HD * 2 + 2 * ST * TILE + 8u * uint32_t(4 * ST + 4) + 15u) & ~15u;
  auto my_scratch = [&]() {
    return (uint32_t(dq & 0x3FFFu) << 4) - uint32_t(w) * (64u * 128u) + kScratchOff +
           uint32_t(ct) * 4u;
  };
  auto turn_wait = [&]() {
    if (w == 0) {
      asm volatile("bar.sync 1, 256;\n" ::: "memory");
    } else {
      asm volatile("bar.sync 2, 256;\n" ::: "memory");
    }
  };
  auto turn_pass = [&]() {
    if (w == 0) {
      asm volatile("bar.arrive 2, 256;\n" ::: "memory");
    } else {
      asm volatile("bar.arrive 1, 256;\n" ::: "memory");
    }
  };
  // Padding sequence: zero the block's output rows (a fixed trip count, stores predicated).
  auto zero_rows = [&]() {
    const int total = min(kBM, rows_total - m0) * (HD / 8);
#pragma unroll 1
    for (int i0 = 0; i0 < kBM * (HD / 8); i0 += 256) {
      const int i = i0 + ct;
      const int vr = m0 + i / (HD / 8);
      const int tok = int(uint32_t(vr) / uint32_t(G));
      if (i < total) {
        *reinterpret_cast<uint4*>(out + qo_off(tok, vr - tok * G) + (i % (HD / 8)) * 8) =
            make_uint4(0, 0, 0, 0);
      }
    }
  };
  // Warpgroup 1 opens warpgroup 0's first turn once; every block then hands the turn over after
  // each issue (also the last), and warpgroup 0 takes the one left over at the end.
  if (w == 1) turn_pass();
  uint32_t gt = 0;
  uint32_t nq = 0;
  // 36: the block body per compile-time start stage (see run_block).
  constexpr bool S0T = VAR == 36 || VAR == 37 || VAR == 38;
  constexpr bool TL = C::TL;
  auto tl_put = [&](int f, unsigned long long v) {
    if constexpr (TL) {
      if (blin < uint32_t(kTlBlocks)) g_prefill_tl[size_t(blin) * kTlFields + f] = v;
    }
  };
  static_assert(!S0T || ST == 2, "two start stages");
  Meta mnext = meta_of(0);
#pragma unroll 1
  for (uint32_t k = 0;; ++k) {
    const Meta mcur = mnext;
    const int kind = block_of(k, mcur);
    if (kind == 0) break;
    mnext = meta_of(k + 1);
    if (kind == 1) continue;
    if (kind == 2) {  // padding sequence: zero output rows
      zero_rows();
      continue;
    }
    // The block's body; S0T (36): instantiated per start stage S0 = gt % ST (ST = 2), so the
    // stage of tile j is (S0 + j) % ST from the block's own loop counter (uniform descriptors).
    auto run_block = [&](auto s0c) {
    constexpr uint32_t S0 = decltype(s0c)::value;
    auto stage_of = [&](int j) -> int {
      return S0T ? int((S0 + uint32_t(j)) % ST) : int((gt + uint32_t(j)) % ST);
    };
    const int tok_lo = m0 / G;
    const int tok_hi = min(m0 + kBM - 1, rows_total - 1) / G;
    const int kv_end = ctx + tok_hi + 1;
    const int n_tiles = (kv_end + BN - 1) / BN;
    const int n_full = (ctx + tok_lo + 1) / BN;
    const int vr0 = m0 + r_lo;
    const int qpos0 = ctx + min(vr0, rows_total - 1) / G;
    const int qpos1 = ctx + min(vr0 + 8, rows_total - 1) / G;

    float o[NO];
#pragma unroll
    for (int i = 0; i < NO; ++i) o[i] = 0.f;
    float s[NS];
    uint32_t pa[NS / 2];
    float m_0 = -INFINITY, m_1 = -INFINITY, l_0 = 0.f, l_1 = 0.f;
    float pal0 = 1.f, pal1 = 1.f;  // the pending O rescale of the next PV product

    // `st` = stage_of(j); S0T passes it as a compile-time value of the unrolled loop below.
    auto issue_qk = [&](int j, int st) {
      const uint32_t g = gt + uint32_t(j);
      mbar_wait(full_k(st), (g / ST) & 1u);
      if ((j + 1) * BN > kv_end) fence_proxy_async();  // cp.async (partial) tile
      // The stage address rebuilt from the shared-memory window here (a uniform value): kept
      // from the kernel's start through the block loop it lived in a vector register and every
      // wgmma descriptor went through R2UR.
      const uint32_t kv0 = ((smem_u32(smem_raw) + 1023u) & ~1023u) + uint32_t(kBM) * HD * 2;
      uint32_t kb = kv0 + uint32_t(2 * st) * TILE;
      // S0T: opaque stage address (as the Q descriptor's copy): with constant stages, NVVM
      // hoisted the 16 K descriptors of each unrolled copy out of the loop (spilled).
      if constexpr (S0T) asm volatile("" : "+r"(kb));
      const uint64_t dk = make_desc(kb, 16, 1024);
      uint64_t dqv = dq;
      if constexpr (S0T) {
        // S0T: the Q half's address rebuilt from the window and the warp-broadcast half offset
        // (uniform values, as the K stage address): the 16 Q descriptors stay on the uniform
        // datapath. (From `dq`, a vector register, ptxas built all 16 with moves to uniform
        // registers between the K wait and the first product: ~100 instructions per tile.)
        uint32_t qb = ((smem_u32(smem_raw) + 1023u) & ~1023u) + wq_u;
        asm volatile("" : "+r"(qb));
        dqv = make_desc(qb, 16, 1024);
      } else {
        asm volatile("" : "+l"(dqv));
      }
      wgmma_fence();
#pragma unroll
      for (int kc = 0; kc < HD / 16; ++kc) {
        const uint64_t oq = uint64_t(((kc / 4) * kBM * 128 + (kc % 4) * 32) >> 4);
        const uint64_t ok = uint64_t(((kc / 4) * BN * 128 + (kc % 4) * 32) >> 4);
        if (kc == 0) {
          qk_gemm<NS>(s, dqv + oq, dk + ok);
        } else {
          qk_gemm_acc<NS>(s, dqv + oq, dk + ok);
        }
      }
      wgmma_commit();
    };
    auto issue_pv = [&](int j, int st) {
      const uint32_t g = gt + uint32_t(j);
      mbar_wait(full_v(st), (g / ST) & 1u);
      if ((j + 1) * BN > kv_end) fence_proxy_async();
      const uint32_t kv0 = ((smem_u32(smem_raw) + 1023u) & ~1023u) + uint32_t(kBM) * HD * 2;
      uint32_t vb = kv0 + uint32_t(2 * st + 1) * TILE;
      if constexpr (S0T) asm volatile("" : "+r"(vb));
      const uint64_t dv = make_desc(vb, BN * 128, 1024);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        pv_gemm<NO>(o, &pa[4 * kk], dv + uint64_t((kk * 16 * 128) >> 4));
      }
      wgmma_commit();
    };
    // FAST softmax of variant 19: max over the raw scores, one FFMA per exponent.
    auto softmax = [&](int j, float& mn0, float& mn1, float& ls0, float& ls1) {
      const bool masked = j >= n_full;
      const int col0 = j * BN + 2 * (lane % 4);
      float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
      for (int i = 0; i < NS / 4; ++i) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float x = s[4 * i + e];
          if (masked) {
            const int pos = col0 + 8 * i + (e & 1);
            if (pos > (e < 2 ? qpos0 : qpos1)) x = -INFINITY;
          }
          s[4 * i + e] = x;
        }
        mx0 = fmaxf(mx0, fmaxf(s[4 * i], s[4 * i + 1]));
        mx1 = fmaxf(mx1, fmaxf(s[4 * i + 2], s[4 * i + 3]));
      }
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
      mx0 = fmaxf(mn0, mx0 * cl2);
      mx1 = fmaxf(mn1, mx1 * cl2);
      mn0 = mx0;
      mn1 = mx1;
      float a0 = 0.f, a1 = 0.f;
#pragma unroll
      for (int i = 0; i < NS / 4; ++i) {
        const float p0 = fast_exp2(fmaf(s[4 * i], cl2, -mx0));
        const float p1 = fast_exp2(fmaf(s[4 * i + 1], cl2, -mx0));
        const float p2 = fast_exp2(fmaf(s[4 * i + 2], cl2, -mx1));
        const float p3 = fast_exp2(fmaf(s[4 * i + 3], cl2, -mx1));
        a0 += p0 + p1;
        a1 += p2 + p3;
        s[4 * i] = p0;
        s[4 * i + 1] = p1;
        s[4 * i + 2] = p2;
        s[4 * i + 3] = p3;
      }
      ls0 = a0;
      ls1 = a1;
    };
    auto take_p = [&]() {
#pragma unroll
      for (int i = 0; i < NS / 2; ++i) pa[i] = pack_bf16(s[2 * i], s[2 * i + 1]);
    };
    auto rescale_o = [&](float x0, float x1) {
      if (__any_sync(0xffffffffu, x0 != 1.f || x1 != 1.f)) {
#pragma unroll
        for (int i = 0; i < NO / 4; ++i) {
          o[4 * i] *= x0;
          o[4 * i + 1] *= x0;
          o[4 * i + 2] *= x1;
          o[4 * i + 3] *= x1;
        }
      }
    };

    if (TL && ct == 0) {
      const unsigned long long t = gtimer();
      tl_put(0, sm_id() | (static_cast<unsigned long long>(n_tiles) << 32));
      tl_put(1, t);
      tl_put(7, t);
    }
    // This warpgroup's Q half of the block (loaded by one producer pair, cp.async: fence).
    mbar_wait(full_q(w), nq & 1u);
    if (TL && ct == 0) tl_put(2, gtimer());
    fence_proxy_async();
    turn_wait();
    issue_qk(0, stage_of(0));
    turn_pass();
    wgmma_wait<0>();
    fence_regs(s);
    if (TL && ct == 0) tl_put(3, gtimer());
    mbar_arrive(empty_k(stage_of(0)));
    {
      float mn0 = m_0, mn1 = m_1, ls0, ls1;
      softmax(0, mn0, mn1, ls0, ls1);
      m_0 = mn0;
      m_1 = mn1;
      l_0 = ls0;
      l_1 = ls1;
      take_p();
    }
    // One step: QK^T of tile j + 1 (stage sn) and PV of tile j (stage sc) in flight together.
    auto step = [&](int j, int sn, int sc) {
      turn_wait();
      issue_qk(j + 1, sn);
      rescale_o(pal0, pal1);
      issue_pv(j, sc);
      turn_pass();
      float mn0 = m_0, mn1 = m_1, ls0, ls1;
      wgmma_wait<1>();
      fence_regs(s);
      mbar_arrive(empty_k(sn));
      softmax(j + 1, mn0, mn1, ls0, ls1);
      pal0 = m_0 == mn0 ? 1.f : fast_exp2(m_0 - mn0);
      pal1 = m_1 == mn1 ? 1.f : fast_exp2(m_1 - mn1);
      l_0 = l_0 * pal0 + ls0;
      l_1 = l_1 * pal1 + ls1;
      m_0 = mn0;
      m_1 = mn1;
      // Order point (ORDERED): keeps the exponentials above the PV wait.
      asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(my_scratch()), "f"(l_0 + l_1) : "memory");
      wgmma_wait<0>();
      fence_regs(o);
      fence_regs(pa);
      mbar_arrive(empty_v(sc));
      take_p();
    };
    if constexpr (S0T) {
      // Unrolled by two with an exit test before each step: each copy's stages are constants
      // (S0 + 1, S0, then S0, S0 + 1 mod 2) and every exit leaves no wgmma in flight. (A plain
      // loop keeps j -- and with it the stage -- in a vector register inside the block loop.)
      int j = 0;
#pragma unroll 1
      for (;;) {
        if (j + 1 >= n_tiles) break;
        step(j, int((S0 + 1) % ST), int(S0));
        ++j;
        if (j + 1 >= n_tiles) break;
        step(j, int(S0), int((S0 + 1) % ST));
        ++j;
      }
    } else {
#pragma unroll 1
      for (int j = 0; j + 1 < n_tiles; ++j) step(j, stage_of(j + 1), stage_of(j));
    }
    turn_wait();
    rescale_o(pal0, pal1);
    issue_pv(n_tiles - 1, stage_of(n_tiles - 1));
    turn_pass();
    wgmma_wait<0>();
    fence_regs(o);
    if (TL && ct == 0) tl_put(4, gtimer());
    mbar_arrive(empty_v(stage_of(n_tiles - 1)));
    l_0 += __shfl_xor_sync(0xffffffffu, l_0, 1);
    l_0 += __shfl_xor_sync(0xffffffffu, l_0, 2);
    l_1 += __shfl_xor_sync(0xffffffffu, l_1, 1);
    l_1 += __shfl_xor_sync(0xffffffffu, l_1, 2);
    const float inv0 = l_0 > 0.f ? 1.f / l_0 : 0.f;
    const float inv1 = l_1 > 0.f ? 1.f / l_1 : 0.f;
    const int cq = 2 * (lane % 4);
    // STAGED output through this warpgroup's Q half (its QK^T products are complete), as 19.
    const int rr0 = warp * 16 + lane / 4;
    const uint32_t wq = uint32_t(dq & 0x3FFFu) << 4;
#pragma unroll
    for (int i = 0; i < NO / 4; ++i) {
      const int col = 8 * i + cq;
      const uint32_t blk = wq + uint32_t(col / 64) * uint32_t(kBM * 128);
      const uint32_t ch = uint32_t((col % 64) / 8);
      const uint32_t in16 = uint32_t(col % 8) * 2u;
      const uint32_t a0 = blk + uint32_t(rr0) * 128u + ((ch ^ uint32_t(rr0 & 7)) << 4) + in16;
      const uint32_t a1 =
          blk + uint32_t(rr0 + 8) * 128u + ((ch ^ uint32_t((rr0 + 8) & 7)) << 4) + in16;
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(a0),
                   "r"(pack_bf16(o[4 * i] * inv0, o[4 * i + 1] * inv0)));
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(a1),
                   "r"(pack_bf16(o[4 * i + 2] * inv1, o[4 * i + 3] * inv1)));
    }
    if (w == 0) {
      asm volatile("bar.sync 3, 128;\n" ::: "memory");
    } else {
      asm volatile("bar.sync 4, 128;\n" ::: "memory");
    }
    {
      const int t = ct % 128;
      const int c = t % 32;  // 16-byte chunk of the row
      // S0T: the output rows' (token, head) stepped (rows 4 apart: token += 4 / G, head +=
      // 4 % G with a carry), as 30's STEP, instead of a division per row.
      int tb = 0, hb = 0;
      if constexpr (S0T) {
        const int vb = m0 + w * 64 + t / 32;
        tb = int(uint32_t(vb) / uint32_t(G));
        hb = vb - tb * G;
      }
      const int q4 = S0T ? 4 / G : 0;
      const int r4 = S0T ? 4 - q4 * G : 0;
#pragma unroll 4
      for (int i = 0; i < 16; ++i) {
        // (No data-dependent loop in here: a loop whose trip count the compiler cannot prove
        // warp-uniform inside the block loop took the whole loop off the uniform datapath.)
        const int rr = t / 32 + 4 * i;
        const int vr = m0 + w * 64 + rr;
        const uint32_t src = wq + uint32_t(c / 8) * uint32_t(kBM * 128) + uint32_t(rr) * 128u +
                             ((uint32_t(c % 8) ^ uint32_t(rr & 7)) << 4);
        uint4 v;
        asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "r"(src)
                     : "memory");
        if constexpr (S0T) {
          if (vr < rows_total) *reinterpret_cast<uint4*>(out + qo_off(tb, hb) + c * 8) = v;
          tb += q4;
          hb += r4;
          if (hb >= G) {
            hb -= G;
            ++tb;
          }
        } else {
          const int tok = int(uint32_t(vr) / uint32_t(G));
          if (vr < rows_total) {
            *reinterpret_cast<uint4*>(out + qo_off(tok, vr - tok * G) + c * 8) = v;
          }
        }
      }
    }
    if (TL && (ct == 0 || ct == 128)) tl_put(ct == 0 ? 5 : 6, gtimer());
    // The half is free for the next block's Q (this thread's reads above are complete).
    mbar_arrive(empty_q(w));
    gt += uint32_t(n_tiles);
    ++nq;
    };
    // (Between blocks every wgmma group of this warpgroup is complete: the branch merges with
    // none in flight.)
    if (S0T && (gt % ST) != 0) {
      run_block(std::integral_constant<uint32_t, 1>{});
    } else {
      run_block(std::integral_constant<uint32_t, 0>{});
    }
  }
  if (w == 0) turn_wait();
#elif defined(__CUDA_ARCH__)
  __trap();  // never launched without an sm_90a image (prepare); fail loudly if it is
#endif  // DK_ATTN_SM90A
}

// Whether `kernel` runs from sm_90a code on the current device: SASS (or PTX) built for 9.0
// features, not a JIT of a lower arch's PTX (whose body is empty). Cached per device.
// PK variants 57 / 58 (session 11; first run and reworked in session 12): variant 48's tiles,
// producer and softmax in a PERSISTENT kernel written afresh (not 23 / 36): min(row blocks,
// SMs) CTAs (DELTAKIT_ATTN_PK_CTAS caps it for tests), CTA c walks the LPT row-block list (the
// order of 48's launch index: heaviest row blocks first, kv head fastest) in snake order: entry
// c of even rounds of gridDim.x entries, gridDim.x - 1 - c of odd ones (lin_of), and
// everything runs on across its work tiles:
// the K / V ring and its mbarrier phases (tile g of the CTA: stage g % 2, phase (g / 2) & 1),
// the Q barrier (phase = the CTA's live row blocks so far, & 1), the consumers' ping-pong turns.
// The one Q tile is released by the consumers (a Q-empty barrier, 256 arrivals) right after
// their LAST QK^T of a row block completed, so the producer's Q boxes (K pair's second warp,
// TQW) and partial rows (V pair's second warp) for the next row block go out while the
// consumers still run the last PV product and the epilogue; K tile 0 of the next row block is
// issued as soon as its ring stage is free (no wait on Q). The epilogue therefore writes O
// straight from the accumulators (16-byte stores after a word transpose inside each quad),
// never through the Q tile. The consumers' stage index stays of 48's form: the row block's loop runs from a
// compile-time start stage S0 (the parity of the CTA's tiles so far; both bodies instantiated,
// picked by a branch between row blocks: 36's S0T), so the stage of tile j is (S0 + j) % 2 of the
// block's own loop counter, and with the row block's fate and tile count made warp-uniform
// (redux.sync) the wgmma descriptors stay in uniform registers (as 48's). 58 = 57 + TL (per
// row block at its LPT index: 0 = SM id | n_tiles << 32, 1 = consumer warpgroup 0 starts the
// row block, 2 = its Q landed, 3 = its first QK^T done, 4 = its last PV done, 5 / 6 = warpgroup
// 0 / 1 output stored, 9 = the Q tile released by warpgroup 0, 10 = the Q boxes issued, 11 =
// K tile 0 issued).
template <int VAR>
__global__ void __launch_bounds__(kThreads, 1) prefill_pk_kernel(const __grid_constant__ Args a) {
#ifdef DK_ATTN_SM90A
  constexpr int HD = 256;
  using C = Cfg<HD, VAR>;
  constexpr int BN = C::BN;
  constexpr int ST = C::STAGES;
  constexpr bool TL = C::TL;
  static_assert(C::PK && ST == 2 && C::LATE_P && C::FAST && C::ORDERED && C::TMA && C::PP,
                "PK: variant 48's configuration");
  constexpr uint32_t TILE = uint32_t(BN) * HD * 2;
  auto tl_put = [&](uint32_t item, int f, unsigned long long v) {
    if constexpr (TL) {
      if (item < uint32_t(kTlBlocks)) g_prefill_tl[size_t(item) * kTlFields + f] = v;
    }
  };
  const DkAttnPrefillSm90Params& p = a.p;
  const int G = a.group;
  const int tid = threadIdx.x;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sQ = base;
  const uint32_t sKV = sQ + uint32_t(kBM) * HD * 2;  // stage s: K at +2s TILE, V at +(2s+1) TILE
  const uint32_t bars = sKV + 2 * ST * TILE;
  const uint32_t barQ = bars;
  const uint32_t barQE = bars + 8u * uint32_t(1 + 4 * ST);  // QV's second Q barrier slot
  // (The ORDERED scratch words follow the barriers; the consumers derive them in their body.)
  auto full_k = [&](int s) { return bars + 8u * uint32_t(1 + s); };
  auto full_v = [&](int s) { return bars + 8u * uint32_t(1 + ST + s); };
  auto empty_k = [&](int s) { return bars + 8u * uint32_t(1 + 2 * ST + s); };
  auto empty_v = [&](int s) { return bars + 8u * uint32_t(1 + 3 * ST + s); };
  if (tid == 0) {
    // Q: 1 expect-tx arrival + the 32 cp.async arrivals of the partial-row warp; Q empty: the
    // 256 consumer threads after their last QK^T of a row block.
    mbar_init(barQ, 33);
    mbar_init(barQE, 256);
    for (int s = 0; s < ST; ++s) {
      mbar_init(full_k(s), 64);
      mbar_init(full_v(s), 64);
      mbar_init(empty_k(s), 256);
      mbar_init(empty_v(s), 256);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    asm volatile(
        "prefetch.tensormap [%0];\nprefetch.tensormap [%1];\nprefetch.tensormap [%2];\n"
        "prefetch.tensormap [%3];\n" ::"l"(reinterpret_cast<uint64_t>(&a.tmap_k)),
        "l"(reinterpret_cast<uint64_t>(&a.tmap_v)), "l"(reinterpret_cast<uint64_t>(&a.tmap_qa)),
        "l"(reinterpret_cast<uint64_t>(&a.tmap_qb))
        : "memory");
  }
  __syncthreads();

  const int* cu = reinterpret_cast<const int*>(p.cu_seqlens);
  const int64_t T = p.num_tokens;
  const int64_t HQ = p.n_q_heads;
  const __nv_bfloat16* q = reinterpret_cast<const __nv_bfloat16*>(p.q);
  __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(p.out);
  const uint32_t n_items = a.total_blocks;
  const uint32_t hkv_u = uint32_t(p.n_kv_heads);
  const uint32_t nseq_u = uint32_t(p.num_seqs);
  // A work tile (row block) of the LPT list: 0 = no rows (skipped by every role), 1 = padding
  // sequence (the consumers zero its rows), 2 = live.
  struct Item {
    int64_t seq, kvh, bos, rows_total, m0;
    int ctx, kv_end, n_tiles, n_full, state;
  };
  // The row block's sequence metadata (cu_seqlens pair, context length): loaded apart from the
  // decoding so the consumers can load the next row block's under the current one.
  struct Raw {
    int cu_lo, cu_hi, ctx;
  };
  auto raw_of = [&](uint32_t lin) {
    uint32_t seq;
    if constexpr (C::SG) {
      uint32_t kh, mi;
      sg_decode(lin, a, seq, kh, mi);
    } else {
      seq = (lin / hkv_u) % nseq_u;
    }
    Raw r;
    r.cu_lo = __ldg(cu + seq);
    r.cu_hi = __ldg(cu + seq + 1);
    r.ctx = __ldg(reinterpret_cast<const int*>(p.ctx_lens) + seq);
    return r;
  };
  auto decode = [&](uint32_t lin, const Raw& r) {
    Item it;
    int64_t mb;
    if constexpr (C::SG) {
      uint32_t sq, kh, mi;
      sg_decode(lin, a, sq, kh, mi);
      it.kvh = int64_t(kh);
      it.seq = int64_t(sq);
      mb = a.max_m_blocks - 1 - int64_t(mi);
    } else {
      const uint32_t rest = lin / hkv_u;
      it.kvh = int64_t(lin - rest * hkv_u);
      it.seq = int64_t(rest % nseq_u);
      mb = a.max_m_blocks - 1 - int64_t(rest / nseq_u);
    }
    const int cu_lo = r.cu_lo;
    const int cu_hi = r.cu_hi;
    it.ctx = r.ctx;
    it.bos = min(max(int64_t(cu_lo), int64_t(0)), T);
    const int64_t eos = min(max(int64_t(cu_hi), it.bos), T);
    it.rows_total = (eos - it.bos) * G;
    it.m0 = mb * kBM;
    it.kv_end = 0;
    it.n_tiles = 0;
    it.n_full = 0;
    if (it.m0 >= it.rows_total) {
      it.state = 0;
    } else if (it.ctx < 0) {
      it.state = 1;
    } else {
      it.state = 2;
      const int tok_lo = int(it.m0 / G);
      const int tok_hi = int(min(it.m0 + kBM - 1, it.rows_total - 1) / G);
      it.kv_end = it.ctx + tok_hi + 1;
      it.n_tiles = (it.kv_end + BN - 1) / BN;
      it.n_full = (it.ctx + tok_lo + 1) / BN;
    }
    return it;
  };
  auto item_of = [&](uint32_t lin) { return decode(lin, raw_of(lin)); };
  // The CTA's k-th row block of the LPT list: snake order over the rounds of gridDim.x entries
  // (CTA c takes entry c of even rounds and gridDim.x - 1 - c of odd ones), so that no CTA takes
  // the heaviest entry of every round (the plain round robin's systematic imbalance: +4% of the
  // mean at varlen 8 x 2048, +8% at 8k, +28-70% at 2k in a list-scheduling model; snake order is
  // within 0.3% of greedy there except the 2k shapes' own granularity).
  auto lin_of = [&](uint32_t k) {
    return k * gridDim.x + ((k & 1u) ? gridDim.x - 1u - blockIdx.x : blockIdx.x);
  };

  if (tid < 128) {
    // ---------------- producer warpgroup ----------------
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(C::PROD_REGS));
    const __nv_bfloat16* kc = reinterpret_cast<const __nv_bfloat16*>(p.k_cache);
    const __nv_bfloat16* vc = reinterpret_cast<const __nv_bfloat16*>(p.v_cache);
    const int ps = int(p.page_size);
    const int hkv = int(p.n_kv_heads);
    const int num_pages = int(min(p.num_pages, int64_t(0x7fffffff)));
    const int lane = tid % 32;
    const int warp = tid / 32;
    constexpr int CPR = HD / 8;
    const int c = lane % CPR;
    const uint32_t cw = uint32_t(c % 8);
    const uint32_t cb = uint32_t(c / 8) * uint32_t(BN * 128);
    constexpr int NP = BN / 2;
    const int kv = warp >> 1;
    const int wig = warp & 1;
    const __nv_bfloat16* cache = kv == 0 ? kc : vc;
    uint32_t g0 = 0;  // the CTA's K / V tiles before this row block
    uint32_t qi = 0;  // the CTA's live row blocks before this one
#pragma unroll 1
    for (uint32_t k = 0; k * gridDim.x < n_items; ++k) {
      const uint32_t lin = lin_of(k);
      if (lin >= n_items) break;  // (only in the last round)
      const Item it = item_of(lin);
      if (it.state != 2) continue;
      const int64_t kvh = it.kvh;
      const int kv_end = it.kv_end;
      const int n_tiles = it.n_tiles;
      const int* table = reinterpret_cast<const int*>(p.page_table) + it.seq * p.max_pages;
      auto off_of = [&](int j, int pass) -> int64_t {
        if (pass >= NP) return -1;
        const int pos = j * BN + pass * 2 + wig;
        if (pos >= kv_end) return -1;
        const int page = __ldg(table + pos / ps);
        if (page < 0 || page >= num_pages) return -1;
        return ((int64_t(page) * ps + pos % ps) * hkv + kvh) * HD;
      };
      auto crow_of = [&](int j) -> int {  // cache row of group `lane` of a full tile j
        if (lane >= BN / 16 || (j + 1) * BN > kv_end) return 0;
        const int pos = j * BN + 16 * lane;
        const int page = __ldg(table + pos / ps);
        return (page >= 0 && page < num_pages)
                   ? page * ps + pos % ps
                   : int(min(p.num_pages * p.page_size, int64_t(0x7fffffff)));  // zeros
      };
      // Q (TQW): the Q tile is free once the consumers' last QK^T of the previous live row
      // block completed (barQE); then the whole-token boxes from lane 0 of warp 1 and the
      // partial-token rows by cp.async from warp 3, both on barQ.
      const int64_t m0 = it.m0;
      const int64_t t0 = m0 / G;
      const int h0 = int(m0 - t0 * G);
      const int first = h0 == 0 ? 0 : G - h0;
      const int nf = (kBM - first) / G;
      const int tok1 = int(it.bos + t0) + (h0 > 0 ? 1 : 0);
      if (kv == 0 && wig == 1) {
        if (lane == 0) {
          if (qi > 0) mbar_wait(barQE, (qi - 1) & 1u);
          issue_q_whole_tokens<HD>(&a.tmap_qa, &a.tmap_qb, int(a.q_nt), sQ, barQ, first, nf, G,
                                   int(kvh) * G, tok1);
          if (TL) tl_put(lin, 10, gtimer());
        }
      } else if (kv == 1 && wig == 1) {
        if (qi > 0) mbar_wait(barQE, (qi - 1) & 1u);
        const int tail = kBM - first - nf * G;
        const uint32_t cbq = sQ + uint32_t(lane / 8) * uint32_t(kBM * 128);
        const uint32_t cwq = uint32_t(lane % 8);
        const __nv_bfloat16* qa0 = q + ((int64_t(it.bos + t0) * HQ) + kvh * G + h0) * HD + lane * 8;
        const __nv_bfloat16* qb0 = q + (int64_t(tok1 + nf) * HQ + kvh * G) * HD + lane * 8;
#pragma unroll 1
        for (int i = 0; i < first + tail; ++i) {
          const bool lo = i < first;
          const int r = lo ? i : nf * G + i;
          const bool ok = m0 + r < it.rows_total;
          const __nv_bfloat16* src = lo ? qa0 + int64_t(i) * HD : qb0 + int64_t(i - first) * HD;
          cp_async_16(cbq + uint32_t(r) * 128u + ((cwq ^ uint32_t(r & 7)) << 4),
                      ok ? static_cast<const void*>(src) : q, ok ? 16u : 0u);
        }
        cp_async_arrive(barQ);
      }
      int crow = crow_of(0);
#pragma unroll 1
      for (int j = 0; j < n_tiles; ++j) {
        const uint32_t g = g0 + uint32_t(j);
        const int s = int(g % ST);
        const uint32_t fb = kv == 0 ? full_k(s) : full_v(s);
        if (g >= ST) mbar_wait(kv == 0 ? empty_k(s) : empty_v(s), ((g / ST) - 1) & 1u);
        if ((j + 1) * BN <= kv_end) {
          // KU: lane 0 of the pair's first warp issues the full tile's boxes with uniform
          // operands; the other 63 threads of the pair arrive.
          if (wig == 0 && lane == 0) {
            mbar_arrive_expect_tx(fb, TILE);
          } else {
            mbar_arrive(fb);
          }
          if (wig == 0) {
            const uint32_t tile_u =
                __reduce_max_sync(0xffffffffu, sKV + uint32_t(2 * s + kv) * TILE);
            const uint32_t fb_u = __reduce_max_sync(0xffffffffu, fb);
            const uint32_t kv_u = __reduce_max_sync(0xffffffffu, uint32_t(kv));
            // KVU: the kv-head coordinate too (57 / 58 keep it in a vector register, which
            // ptxas moves to a uniform one by an R2UR inside each of the 20 boxes' issue).
            const uint32_t kvh_b =
                C::KVU ? __reduce_max_sync(0xffffffffu, uint32_t(kvh)) : uint32_t(kvh);
            uint32_t cr[BN / 16];
#pragma unroll
            for (int gg = 0; gg < BN / 16; ++gg) {
              cr[gg] = __reduce_max_sync(0xffffffffu, lane == gg ? uint32_t(crow) : 0u);
            }
            if (lane == 0) {
              const CUtensorMap* map = kv_u == 0 ? &a.tmap_k : &a.tmap_v;
#pragma unroll
              for (int gg = 0; gg < BN / 16; ++gg) {
#pragma unroll
                for (int cblk = 0; cblk < HD / 64; ++cblk) {
                  tma_load_3d(tile_u + uint32_t(cblk * BN * 128 + gg * 16 * 128), map, cblk * 64,
                              int(kvh_b), int(cr[gg]), fb_u);
                }
              }
              if (TL && j == 0 && kv_u == 0) tl_put(lin, 11, gtimer());
            }
          }
        } else {
          // The partial last tile by cp.async (zero fill past the causal end).
          const int64_t oa = off_of(j, lane);
          const int64_t ob = off_of(j, lane + 32);
          const uint32_t tile = sKV + uint32_t(2 * s + kv) * TILE + cb;
#pragma unroll 1
          for (int pass = 0; pass < 32; ++pass) {
            const int64_t o = __shfl_sync(0xffffffffu, oa, pass);
            const int r = pass * 2 + wig;
            const uint32_t dst = tile + uint32_t(r) * 128 + ((cw ^ uint32_t(r & 7)) << 4);
            cp_async_16(dst, o >= 0 ? static_cast<const void*>(cache + o + c * 8) : cache,
                        o >= 0 ? 16u : 0u);
          }
#pragma unroll 1
          for (int pass = 32; pass < NP; ++pass) {
            const int64_t o = __shfl_sync(0xffffffffu, ob, pass - 32);
            const int r = pass * 2 + wig;
            const uint32_t dst = tile + uint32_t(r) * 128 + ((cw ^ uint32_t(r & 7)) << 4);
            cp_async_16(dst, o >= 0 ? static_cast<const void*>(cache + o + c * 8) : cache,
                        o >= 0 ? 16u : 0u);
          }
          cp_async_arrive(fb);
        }
        if (j + 1 < n_tiles) crow = crow_of(j + 1);
      }
      g0 += uint32_t(n_tiles);
      ++qi;
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    return;
  }

  // ---------------- consumer warpgroups ----------------
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(C::CONS_REGS));
  const int ct = tid - 128;
  const int w = ct / 128;
  const int lane = tid % 32;
  const int warp = (ct % 128) / 32;
  const int r_lo = w * 64 + warp * 16 + lane / 4;  // this thread's rows: r_lo and r_lo + 8
  const float cl2 = p.scale * 1.4426950408889634f;
  constexpr int NS = BN / 2;  // score accumulators per thread
  constexpr int NO = HD / 2;  // output accumulators per thread
  auto turn_wait = [&]() {
    if (w == 0) {
      asm volatile("bar.sync 1, 256;\n" ::: "memory");
    } else {
      asm volatile("bar.sync 2, 256;\n" ::: "memory");
    }
  };
  auto turn_pass = [&]() {
    if (w == 0) {
      asm volatile("bar.arrive 2, 256;\n" ::: "memory");
    } else {
      asm volatile("bar.arrive 1, 256;\n" ::: "memory");
    }
  };
  // One live row block from ring stage S0 (= the CTA's tiles so far, mod 2); gb = that count
  // (the mbarrier phases), qi = the CTA's live row blocks so far (the Q phase).
  auto block = [&](auto s0c, const Item& it, uint32_t lin, uint32_t gb, uint32_t qi) {
    constexpr int S0 = decltype(s0c)::value;
    // The shared-memory addresses re-derived per row block (a few uniform instructions), not
    // carried through the row-block loop.
    const uint32_t ub = (smem_u32(smem_raw) + 1023u) & ~1023u;
    const uint32_t usKV = ub + uint32_t(kBM) * HD * 2;
    const uint32_t ubars = usKV + 2 * ST * TILE;
    auto ufull_k = [&](int st) { return ubars + 8u * uint32_t(1 + st); };
    auto ufull_v = [&](int st) { return ubars + 8u * uint32_t(1 + ST + st); };
    auto uempty_k = [&](int st) { return ubars + 8u * uint32_t(1 + 2 * ST + st); };
    auto uempty_v = [&](int st) { return ubars + 8u * uint32_t(1 + 3 * ST + st); };
    const uint64_t dq = make_desc(ub + uint32_t(w) * 64 * 128, 16, 1024);
    const uint32_t my_scratch =
        ((ubars + 8u * uint32_t(2 + 4 * ST) + 15u) & ~15u) + uint32_t(ct) * 4u;
    const int64_t kvh = it.kvh;
    const int64_t bos = it.bos;
    const int64_t rows_total = it.rows_total;
    const int64_t m0 = it.m0;
    const int n_tiles = it.n_tiles;
    const int n_full = it.n_full;
    const int kv_end = it.kv_end;
    const int64_t vr0 = m0 + r_lo;
    const int64_t vr1 = vr0 + 8;
    const int qpos0 = it.ctx + int(min(vr0, rows_total - 1) / G);
    const int qpos1 = it.ctx + int(min(vr1, rows_total - 1) / G);
    float o[NO];
#pragma unroll
    for (int i = 0; i < NO; ++i) o[i] = 0.f;
    float s[NS];
    uint32_t pa[NS / 2];
    float m_0 = -INFINITY, m_1 = -INFINITY, l_0 = 0.f, l_1 = 0.f;
    // Stage of the block's tile j: (S0 + j) % ST from the block's own loop counter; phase from
    // the CTA's tile count.
    auto issue_qk = [&](int j) {
      const int st = (S0 + j) % ST;
      mbar_wait(ufull_k(st), ((gb + uint32_t(j)) / ST) & 1u);
      if ((j + 1) * BN > kv_end) fence_proxy_async();  // the cp.async partial tile
      const uint64_t dk = make_desc(usKV + uint32_t(2 * st) * TILE, 16, 1024);
      uint64_t dqv = dq;
      asm volatile("" : "+l"(dqv));
      wgmma_fence();
#pragma unroll
      for (int kc = 0; kc < HD / 16; ++kc) {
        const uint64_t oq = uint64_t(((kc / 4) * kBM * 128 + (kc % 4) * 32) >> 4);
        const uint64_t ok = uint64_t(((kc / 4) * BN * 128 + (kc % 4) * 32) >> 4);
        if (kc == 0) {
          qk_gemm<NS>(s, dqv + oq, dk + ok);
        } else {
          qk_gemm_acc<NS>(s, dqv + oq, dk + ok);
        }
      }
      wgmma_commit();
    };
    auto issue_pv = [&](int j) {
      const int st = (S0 + j) % ST;
      mbar_wait(ufull_v(st), ((gb + uint32_t(j)) / ST) & 1u);
      if ((j + 1) * BN > kv_end) fence_proxy_async();
      const uint64_t dv = make_desc(usKV + uint32_t(2 * st + 1) * TILE, BN * 128, 1024);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        pv_gemm<NO>(o, &pa[4 * kk], dv + uint64_t((kk * 16 * 128) >> 4));
      }
      wgmma_commit();
    };
    // FAST softmax, late P (48's): max over the raw scores, one FFMA per exponent.
    auto softmax = [&](int j, float& mn0, float& mn1, float& ls0, float& ls1) {
      const bool masked = j >= n_full;
      const int col0 = j * BN + 2 * (lane % 4);
      float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
      for (int i = 0; i < NS / 4; ++i) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float x = s[4 * i + e];
          if (masked) {
            const int pos = col0 + 8 * i + (e & 1);
            if (pos > (e < 2 ? qpos0 : qpos1)) x = -INFINITY;
          }
          s[4 * i + e] = x;
        }
        mx0 = fmaxf(mx0, fmaxf(s[4 * i], s[4 * i + 1]));
        mx1 = fmaxf(mx1, fmaxf(s[4 * i + 2], s[4 * i + 3]));
      }
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
      mx0 = fmaxf(mn0, mx0 * cl2);
      mx1 = fmaxf(mn1, mx1 * cl2);
      mn0 = mx0;
      mn1 = mx1;
      float a0 = 0.f, a1 = 0.f;
#pragma unroll
      for (int i = 0; i < NS / 4; ++i) {
        const float p0 = fast_exp2(fmaf(s[4 * i], cl2, -mx0));
        const float p1 = fast_exp2(fmaf(s[4 * i + 1], cl2, -mx0));
        const float p2 = fast_exp2(fmaf(s[4 * i + 2], cl2, -mx1));
        const float p3 = fast_exp2(fmaf(s[4 * i + 3], cl2, -mx1));
        a0 += p0 + p1;
        a1 += p2 + p3;
        s[4 * i] = p0;
        s[4 * i + 1] = p1;
        s[4 * i + 2] = p2;
        s[4 * i + 3] = p3;
      }
      ls0 = a0;
      ls1 = a1;
    };
    auto take_p = [&]() {
#pragma unroll
      for (int i = 0; i < NS / 2; ++i) pa[i] = pack_bf16(s[2 * i], s[2 * i + 1]);
    };
    auto rescale_o = [&](float x0, float x1) {
      if (__any_sync(0xffffffffu, x0 != 1.f || x1 != 1.f)) {
#pragma unroll
        for (int i = 0; i < NO / 4; ++i) {
          o[4 * i] *= x0;
          o[4 * i + 1] *= x0;
          o[4 * i + 2] *= x1;
          o[4 * i + 3] *= x1;
        }
      }
    };
    float pal0 = 1.f, pal1 = 1.f;
    if (TL && ct == 0) {
      tl_put(lin, 0, sm_id() | (static_cast<unsigned long long>(n_tiles) << 32));
      tl_put(lin, 1, gtimer());
    }
    // Turns: warpgroup 1 opens warpgroup 0's first turn of the CTA's first live row block; in
    // every row block both hand their last turn over (warpgroup 1's last hand-over opens
    // warpgroup 0's first turn of the next row block, so that warpgroup 0's first QK^T runs under
    // warpgroup 1's last PV product and epilogue; the one after the CTA's last row block is
    // taken by warpgroup 0 after the loop): every named-barrier phase sees 128 + 128 threads.
    if (w == 1 && qi == 0) turn_pass();
    mbar_wait(ubars, qi & 1u);
    fence_proxy_async();  // the partial-token rows came by cp.async (generic proxy)
    if (TL && ct == 0) tl_put(lin, 2, gtimer());
    turn_wait();
    issue_qk(0);
    turn_pass();
    wgmma_wait<0>();
    fence_regs(s);
    if (TL && ct == 0) tl_put(lin, 3, gtimer());
    mbar_arrive(uempty_k(S0 % ST));
    {
      float mn0 = m_0, mn1 = m_1, ls0, ls1;
      softmax(0, mn0, mn1, ls0, ls1);
      m_0 = mn0;
      m_1 = mn1;
      l_0 = ls0;
      l_1 = ls1;
      take_p();
    }
    for (int j = 0; j + 1 < n_tiles; ++j) {
      turn_wait();
      issue_qk(j + 1);
      rescale_o(pal0, pal1);
      issue_pv(j);
      turn_pass();
      float mn0 = m_0, mn1 = m_1, ls0, ls1;
      wgmma_wait<1>();
      fence_regs(s);
      mbar_arrive(uempty_k((S0 + j + 1) % ST));
      softmax(j + 1, mn0, mn1, ls0, ls1);
      pal0 = m_0 == mn0 ? 1.f : fast_exp2(m_0 - mn0);
      pal1 = m_1 == mn1 ? 1.f : fast_exp2(m_1 - mn1);
      l_0 = l_0 * pal0 + ls0;
      l_1 = l_1 * pal1 + ls1;
      m_0 = mn0;
      m_1 = mn1;
      asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(my_scratch), "f"(l_0 + l_1) : "memory");
      wgmma_wait<0>();
      fence_regs(o);
      fence_regs(pa);
      mbar_arrive(uempty_v((S0 + j) % ST));
      take_p();
    }
    // Every QK^T of the row block completed (the waits above): the Q tile is free for the next
    // row block's loads while this one's last PV product and epilogue run.
    mbar_arrive(ubars + 8u * uint32_t(1 + 4 * ST));
    if (TL && ct == 0) tl_put(lin, 9, gtimer());
    turn_wait();
    rescale_o(pal0, pal1);
    issue_pv(n_tiles - 1);
    turn_pass();
    wgmma_wait<0>();
    fence_regs(o);
    if (TL && ct == 0) tl_put(lin, 4, gtimer());
    mbar_arrive(uempty_v((S0 + n_tiles - 1) % ST));
    l_0 += __shfl_xor_sync(0xffffffffu, l_0, 1);
    l_0 += __shfl_xor_sync(0xffffffffu, l_0, 2);
    l_1 += __shfl_xor_sync(0xffffffffu, l_1, 1);
    l_1 += __shfl_xor_sync(0xffffffffu, l_1, 2);
    const float inv0 = l_0 > 0.f ? 1.f / l_0 : 0.f;
    const float inv1 = l_1 > 0.f ? 1.f / l_1 : 0.f;
    auto row_off = [&](int64_t vr) {  // element offset of packed row vr in out
      const int64_t tok = vr / G;
      const int64_t hh = vr - tok * G;
      return ((bos + tok) * HQ + kvh * G + hh) * HD;
    };
    // O straight from the accumulators (the Q tile already holds the next row block's rows),
    // as 16-byte stores: lane q of a quad holds columns 8 i + 2 q, + 1 of its rows (one 4-byte
    // word per i); a 4 x 4 word transpose inside the quad per 4 consecutive i (two shfl.xor
    // butterflies: 2 x 2 blocks over lane bit 1, then words over lane bit 0) leaves lane q with
    // columns 8 (4 kb + q) .. + 7 of its row = 16 contiguous bytes (a quad: 64 bytes of a row).
    const uint32_t qb0 = uint32_t(lane) & 1u;
    const uint32_t qb1 = (uint32_t(lane) >> 1) & 1u;
    auto transpose4 = [&](uint32_t (&wd)[4]) {
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        const uint32_t snd = qb1 ? wd[x] : wd[x + 2];
        const uint32_t rcv = __shfl_xor_sync(0xffffffffu, snd, 2);
        if (qb1) {
          wd[x] = rcv;
        } else {
          wd[x + 2] = rcv;
        }
      }
#pragma unroll
      for (int x = 0; x < 4; x += 2) {
        const uint32_t snd = qb0 ? wd[x] : wd[x + 1];
        const uint32_t rcv = __shfl_xor_sync(0xffffffffu, snd, 1);
        if (qb0) {
          wd[x] = rcv;
        } else {
          wd[x + 1] = rcv;
        }
      }
    };
    const int q4 = lane % 4;
    __nv_bfloat16* dst0 = out + row_off(min(vr0, rows_total - 1)) + 8 * q4;
    __nv_bfloat16* dst1 = out + row_off(min(vr1, rows_total - 1)) + 8 * q4;
#pragma unroll
    for (int kb = 0; kb < NO / 16; ++kb) {
      uint32_t w0[4], w1[4];
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        const int i = 4 * kb + jj;
        w0[jj] = pack_bf16(o[4 * i] * inv0, o[4 * i + 1] * inv0);
        w1[jj] = pack_bf16(o[4 * i + 2] * inv1, o[4 * i + 3] * inv1);
      }
      transpose4(w0);
      transpose4(w1);
      if (vr0 < rows_total) {
        *reinterpret_cast<uint4*>(dst0 + 32 * kb) = make_uint4(w0[0], w0[1], w0[2], w0[3]);
      }
      if (vr1 < rows_total) {
        *reinterpret_cast<uint4*>(dst1 + 32 * kb) = make_uint4(w1[0], w1[1], w1[2], w1[3]);
      }
    }
    if (TL && (ct == 0 || ct == 128)) tl_put(lin, ct == 0 ? 5 : 6, gtimer());
  };
  uint32_t g0 = 0;
  uint32_t qi = 0;
  // The next row block's metadata is loaded before the current one runs (its latency hidden).
  Raw nx = raw_of(lin_of(0));
#pragma unroll 1
  for (uint32_t k = 0; k * gridDim.x < n_items; ++k) {
    const uint32_t lin = lin_of(k);
    if (lin >= n_items) break;  // (only in the last round)
    const Raw cur = nx;
    {
      const uint32_t nl = lin_of(k + 1);
      if (nl < n_items) nx = raw_of(nl);
    }
    Item it = decode(lin, cur);
    // The row block's fate and tile count made warp-uniform (redux.sync writes a uniform
    // register): ptxas then sees uniform branches around the block body and keeps its loop
    // counter, the ring stage and the wgmma descriptors in uniform registers (as in 48).
    it.state = int(__reduce_max_sync(0xffffffffu, uint32_t(it.state)));
    it.n_tiles = int(__reduce_max_sync(0xffffffffu, uint32_t(it.n_tiles)));
    if (it.state == 0) continue;
    if (it.state == 1) {  // padding sequence: zero output rows
      const int64_t rows = min(int64_t(kBM), it.rows_total - it.m0);
      // (opaque: nothing of this rare loop is hoisted out of the row-block loop.)
      int cti = ct;
      asm volatile("" : "+r"(cti));
#pragma unroll 1
      for (int64_t i = cti; i < rows * (HD / 8); i += 256) {
        const int64_t r = i / (HD / 8);
        const int64_t cc = i - r * (HD / 8);
        const int64_t vr = it.m0 + r;
        const int64_t tok = vr / G;
        const int64_t off = ((it.bos + tok) * HQ + it.kvh * G + (vr - tok * G)) * HD;
        *reinterpret_cast<uint4*>(out + off + cc * 8) = make_uint4(0, 0, 0, 0);
      }
      continue;
    }
    if (g0 & 1u) {
      block(std::integral_constant<int, 1>{}, it, lin, g0, qi);
    } else {
      block(std::integral_constant<int, 0>{}, it, lin, g0, qi);
    }
    g0 += uint32_t(it.n_tiles);
    ++qi;
  }
  // Warpgroup 1's hand-over after the CTA's last live row block.
  if (w == 0 && qi > 0) turn_wait();
#elif defined(__CUDA_ARCH__)
  __trap();  // never launched without an sm_90a image (prepare); fail loudly if it is
#endif  // DK_ATTN_SM90A
}

// The kernel of a (head dim, schedule, variant): the persistent one for 23 / 24, PK for 57 / 58.
template <int HD, bool PP, int VAR>
constexpr void (*kernel_fn())(const Args) {
  if constexpr (Cfg<HD, VAR>::PERSIST) {
    return prefill_persist_kernel<VAR>;
  } else if constexpr (Cfg<HD, VAR>::PK) {
    return prefill_pk_kernel<VAR>;
  } else {
    return prefill_kernel<HD, PP, VAR>;
  }
}
template <int HD, bool PP, int VAR>
dk_status prepare(int dev) {
  static std::atomic<int> state[64];  // 0 unknown, 1 ready, 2 unsupported (zero-initialized)
  if (dev < 0 || dev >= 64) return DK_ERR_NO_KERNEL_IMAGE;
  if (state[dev].load(std::memory_order_acquire) == 0) {
    cudaFuncAttributes attr;
    if (cudaFuncGetAttributes(&attr, kernel_fn<HD, PP, VAR>()) != cudaSuccess) {
      (void)cudaGetLastError();
      state[dev] = 2;
    } else if (attr.binaryVersion != 90 || attr.ptxVersion < 90 || !sm90a_image(dev)) {
      // An sm_90 (not 90a) image also reports 9.0 but has the kernel body compiled out.
      state[dev] = 2;
    } else if (cudaFuncSetAttribute(kernel_fn<HD, PP, VAR>(),
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

// cuTensorMapEncodeTiled from the driver (cudart's entry-point query: no libcuda link).
using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                   const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                   const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                   CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
inline EncodeTiledFn encode_tiled() {
  static std::atomic<EncodeTiledFn> fn{nullptr};
  EncodeTiledFn f = fn.load(std::memory_order_acquire);
  if (f == nullptr) {
    void* raw = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &raw, 12000, cudaEnableDefault,
                                         &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess && raw != nullptr) {
      f = reinterpret_cast<EncodeTiledFn>(raw);
      fn.store(f, std::memory_order_release);
    } else {
      (void)cudaGetLastError();
    }
  }
  return f;
}
// TMA descriptor of a cache: bf16 [rows][hkv][hd] viewed innermost-first as (hd, hkv, rows), box
// 64 dims x 1 head x 16 positions, 128B swizzle (the layout of one column block of a tile).
inline bool encode_cache_map(CUtensorMap* m, uint64_t cache, int64_t hd, int64_t hkv,
                             int64_t rows) {
  const EncodeTiledFn f = encode_tiled();
  if (f == nullptr || rows <= 0 || rows > 0x7fffffffLL) return false;
  const cuuint64_t dims[3] = {cuuint64_t(hd), cuuint64_t(hkv), cuuint64_t(rows)};
  const cuuint64_t strides[2] = {cuuint64_t(hd * 2), cuuint64_t(hkv * hd * 2)};
  const cuuint32_t box[3] = {64, 1, 16};
  const cuuint32_t elem[3] = {1, 1, 1};
  return f(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, reinterpret_cast<void*>(cache), dims, strides,
           box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
           CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// TMA descriptor of `out` for the OST variants: bf16 [T][HQ][HD] viewed innermost-first as
// (hd, g, hkv, t) (the q heads of kv head h are h * g .. h * g + g - 1), box 64 dims x g heads x
// 1 x 64 / g tokens, 128B swizzle (the staged output layout: one column block of 64 rows).
inline bool encode_out_map(CUtensorMap* m, uint64_t out, int64_t hd, int64_t g, int64_t hkv,
                           int64_t t) {
  const EncodeTiledFn f = encode_tiled();
  if (f == nullptr || g <= 0 || g > 64 || t <= 0 || t > 0x7fffffffLL) return false;
  const cuuint64_t dims[4] = {cuuint64_t(hd), cuuint64_t(g), cuuint64_t(hkv), cuuint64_t(t)};
  const cuuint64_t strides[3] = {cuuint64_t(hd * 2), cuuint64_t(g * hd * 2),
                                 cuuint64_t(hkv * g * hd * 2)};
  const cuuint32_t box[4] = {64, cuuint32_t(g), 1, cuuint32_t(64 / g)};
  const cuuint32_t elem[4] = {1, 1, 1, 1};
  return f(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, reinterpret_cast<void*>(out), dims, strides,
           box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
           CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// TMA descriptor of `q` for the TQ variants: bf16 [T][HQ][HD] viewed innermost-first as
// (hd, hq, t), box 64 dims x `heads` x `toks`, 128B swizzle (the Q tile layout).
inline bool encode_q_map(CUtensorMap* m, uint64_t q, int64_t hd, int64_t hq, int64_t t,
                         int64_t heads, int64_t toks) {
  const EncodeTiledFn f = encode_tiled();
  if (f == nullptr || heads <= 0 || heads > hq || heads > 256 || toks <= 0 || toks > 256 ||
      t <= 0 || t > 0x7fffffffLL || hq > 0x7fffffffLL) {
    return false;
  }
  const cuuint64_t dims[3] = {cuuint64_t(hd), cuuint64_t(hq), cuuint64_t(t)};
  const cuuint64_t strides[2] = {cuuint64_t(hd * 2), cuuint64_t(hq * hd * 2)};
  const cuuint32_t box[3] = {64, cuuint32_t(heads), cuuint32_t(toks)};
  const cuuint32_t elem[3] = {1, 1, 1};
  return f(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, reinterpret_cast<void*>(q), dims, strides, box,
           elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
           CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
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

// SG variants (61-64): sequences per group of the sequence-grouped LPT order (sg_decode). The
// K / V of a group (kv_span_of positions per sequence, all kv heads, K and V) within
// kSgBudget bytes, so it stays in L2 while the group's row blocks run, but at least
// kSgMinWaves waves of row-block slots per group (the heaviest row blocks of the last group
// start early enough to end with the rest), at most the batch (= 48's order).
// DELTAKIT_ATTN_SEQ_GROUP=<n> (diagnostic, read once per process) sets n instead. H200, 27B TP1
// varlen 8 x 2048 (8 MiB of K / V per sequence), 61 with sg = 8 (= 48's order) / 4 / 2 / 1: 871 /
// 846 / 832 / 808 us back to back (docs/benchmarks/2026-12-02-attn-prefill-s13.md): the smallest
// groups won, hence 8 MiB and one wave.
constexpr int64_t kSgBudget = int64_t(8) << 20;
// 63: the longest K / V span (kv_span_of) the persistent form runs (see launch).
constexpr int64_t kPkMaxSeqlen = 4096;
constexpr int64_t kSgMinWaves = 1;
// The longest K / V span of a sequence (new tokens + prior context) as far as the host knows:
// max_seqlen plus the largest host_ctx_lens entry where the caller passed that array (the
// launch parameters carry no other host copy of ctx_lens).
inline int64_t kv_span_of(const DkAttnPrefillSm90Params& p) {
  int64_t ctx = 0;
  if (p.host_ctx_lens != 0) {
    const int* h = reinterpret_cast<const int*>(p.host_ctx_lens);
    for (int64_t i = 0; i < p.num_seqs; ++i) ctx = h[i] > ctx ? int64_t(h[i]) : ctx;
  }
  return p.max_seqlen + ctx;
}
inline uint32_t seq_group_of(const DkAttnPrefillSm90Params& p, int64_t max_m_blocks, int sms) {
  static const int64_t forced = [] {
    const char* e = getenv("DELTAKIT_ATTN_SEQ_GROUP");
    const long v = e != nullptr ? strtol(e, nullptr, 10) : 0;
    return int64_t(v > 0 ? v : 0);
  }();
  const int64_t n = p.num_seqs;
  int64_t sg = forced;
  if (sg == 0) {
    const int64_t kv_seq = p.n_kv_heads * kv_span_of(p) * p.head_dim * 4;  // K + V, bf16
    sg = kSgBudget / (kv_seq > 0 ? kv_seq : 1);
    const int64_t per_seq = max_m_blocks * p.n_kv_heads;
    const int64_t want = kSgMinWaves * int64_t(sms > 0 ? sms : 132);
    const int64_t min_sg = (want + per_seq - 1) / (per_seq > 0 ? per_seq : 1);
    if (sg < min_sg) sg = min_sg;
  }
  if (sg < 1) sg = 1;
  if (sg > n) sg = n;
  return uint32_t(sg);
}

template <int HD, bool PP, int VAR>
dk_status launch(const DkAttnPrefillSm90Params& p, cudaStream_t stream) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    set_last_cuda_error(static_cast<int>(cudaGetLastError()));
    return DK_ERR_CUDA;
  }
  const dk_status st = prepare<HD, PP, VAR>(dev);
  if (st != DK_OK) return st;
  Args a;
  a.p = p;
  a.group = int(p.n_q_heads / p.n_kv_heads);
  if constexpr (Cfg<HD, VAR>::TMA) {
    // Page runs of 16 positions must not cross pages; else (or without the encoder) the same
    // tiles with cp.async (variant 7).
    const int64_t rows = p.num_pages * p.page_size;
    if (p.page_size % 16 != 0 ||
        !encode_cache_map(&a.tmap_k, p.k_cache, HD, p.n_kv_heads, rows) ||
        !encode_cache_map(&a.tmap_v, p.v_cache, HD, p.n_kv_heads, rows)) {
      // 9 -> 7, split TMA variants -> 12 / 13 (the split cp.async producer, same schedule).
      constexpr int FB = VAR == 9 ? 7 : (Cfg<HD, VAR>::PP ? 12 : 13);
      return launch<HD, PP, FB>(p, stream);
    }
  }
  if constexpr (Cfg<HD, VAR>::TQW) {
    // 44-52: one lane issues the whole-token boxes, the partial rows go by cp.async (no bound
    // on G from the lanes). A whole token must fit after a partial first one (NT >= 1: G <= 64)
    // and the encoder must be there; else the same tiles with Q by cp.async (31).
    const int64_t g = a.group;
    if (g > 64) return launch<HD, PP, 31>(p, stream);
    a.q_nt = uint32_t((kBM - (g - 1)) / g);
    if (!encode_q_map(&a.tmap_qa, p.q, HD, p.n_q_heads, p.num_tokens, g, a.q_nt) ||
        !encode_q_map(&a.tmap_qb, p.q, HD, p.n_q_heads, p.num_tokens, g, 1)) {
      return launch<HD, PP, 31>(p, stream);
    }
  } else if constexpr (Cfg<HD, VAR>::TQ) {
    // Without the encoder, or for a group above 16: the same tiles with Q by cp.async (31). A row
    // block takes up to first + 1 + nb + tail <= 2 G items, one per lane of the issuing warp, so
    // G > 16 could leave boxes unissued and the Q barrier waiting forever.
    const int64_t g = a.group;
    if (g > 16) return launch<HD, PP, 31>(p, stream);
    a.q_nt = uint32_t((kBM - (g - 1)) / g);
    if (!encode_q_map(&a.tmap_qa, p.q, HD, p.n_q_heads, p.num_tokens, g, a.q_nt) ||
        !encode_q_map(&a.tmap_qb, p.q, HD, p.n_q_heads, p.num_tokens, g, 1) ||
        !encode_q_map(&a.tmap_qr, p.q, HD, p.n_q_heads, p.num_tokens, 1, 1)) {
      return launch<HD, PP, 31>(p, stream);
    }
  }
  if constexpr (Cfg<HD, VAR>::OST) {
    // Without the encoder (or a group above 64): the same kernel with the threads' stores (31).
    if (!encode_out_map(&a.tmap_o, p.out, HD, a.group, p.n_kv_heads, p.num_tokens)) {
      return launch<HD, PP, 31>(p, stream);
    }
  }
  if constexpr (Cfg<HD, VAR>::BV) {
    // Without the three host arrays (or for more sequences than the parameters hold): the same
    // kernel reading its metadata from the device arrays (51 / 52).
    constexpr int FB = Cfg<HD, VAR>::TL ? 52 : 51;
    if (p.host_cu_seqlens == 0 || p.host_ctx_lens == 0 || p.host_page_table == 0 ||
        p.num_seqs > kBvSeqs) {
      return launch<HD, PP, FB>(p, stream);
    }
    const int* hcu = reinterpret_cast<const int*>(p.host_cu_seqlens);
    const int* hctx = reinterpret_cast<const int*>(p.host_ctx_lens);
    const int* hpt = reinterpret_cast<const int*>(p.host_page_table);
    const int n = int(p.num_seqs);
    for (int i = 0; i <= n; ++i) a.bv_cu[i] = hcu[i];
    for (int i = 0; i < n; ++i) {
      a.bv_ctx[i] = hctx[i];
      for (int g = 0; g < kBvGroups; ++g) {
        const int64_t pg = (16 * g) / p.page_size;
        a.bv_pg0[i][g] = pg < p.max_pages ? hpt[int64_t(i) * p.max_pages + pg] : -1;
      }
    }
  }
  a.max_m_blocks = ceil_div(p.max_seqlen * a.group, kBM);
  {
    const int sms = sm_count(dev);
    a.pf_ahead = uint32_t(sms > 0 ? sms : 132);
  }
  const int64_t gx = p.num_seqs * a.max_m_blocks;
  if (gx <= 0 || gx > 0x7fffffffLL || p.n_kv_heads > 65535) return DK_ERR_INVALID_ARGUMENT;
  a.seq_group = 1;
  if constexpr (Cfg<HD, VAR>::SG) {
    // 32-bit list (sg_decode); else the base variant's order (48 / 59 fall back as they do).
    if (gx * p.n_kv_heads > 0x7fffffffLL) {
      constexpr int FB = Cfg<HD, VAR>::B;
      return launch<HD, PP, FB>(p, stream);
    }
    a.seq_group = seq_group_of(p, a.max_m_blocks, sm_count(dev));
  }
  if constexpr (Cfg<HD, VAR>::PK) {
    // 57 / 58: one CTA per SM (fewer for fewer row blocks) walking the LPT list; a list beyond
    // 31 bits runs 48 (which then takes its kv-head-major order).
    const int64_t nb = gx * p.n_kv_heads;
    if (nb > 0x7fffffffLL) return launch<HD, true, 48>(p, stream);
    const int sms = sm_count(dev);
    int64_t cap = sms > 0 ? sms : 132;
    a.total_blocks = uint32_t(nb);
    // DELTAKIT_ATTN_PK_CTAS=<n> (diagnostic, read once per process): n CTAs at most (fewer than
    // the SMs: the small test cases walk several row blocks per CTA; more: a CTA per row block,
    // the persistent code without persistence).
    static const int64_t pk_ctas = [] {
      const char* e = getenv("DELTAKIT_ATTN_PK_CTAS");
      const long v = e != nullptr ? strtol(e, nullptr, 10) : 0;
      return int64_t(v > 0 ? v : 0);
    }();
    if (pk_ctas > 0) cap = pk_ctas;  // (above the SM count: CTAs with fewer row blocks each)
    // 57 / 59: lists of fewer than 4 row blocks (launch slots, live or not) per CTA run 48, whose
    // hardware-scheduled grid balances a few blocks per SM better than a static list, and
    // where the hidden block start (~3.4 us per row block) is a small share. 58 / 60 (timeline
    // form) always runs persistent.
    if ((VAR == 57 || VAR == 59) && nb < 4 * cap) return launch<HD, true, 48>(p, stream);
    // 63 (the SG form of 59) also runs 61 for K / V spans above kPkMaxSeqlen: there a row
    // block's K / V tile loop, which runs 1.7-3.1% slower per tile in the PK code than in 48's
    // (session 12), outweighs the hidden row-block start (59 vs 48: varlen 8 x 2048 -3.0%,
    // 8k / 32k squares +0.4..+3.5%). 64 (timeline form) always runs persistent.
    if (VAR == 63 && (nb < 4 * cap || kv_span_of(p) > kPkMaxSeqlen)) {
      return launch<HD, true, 61>(p, stream);
    }
    const unsigned ctas = unsigned(nb < cap ? nb : cap);
    kernel_fn<HD, PP, VAR>()<<<ctas, kThreads, smem_bytes<HD, VAR>(), stream>>>(a);
    return launch_status();
  } else if constexpr (Cfg<HD, VAR>::PERSIST) {
    // 32-bit block list and packed rows; else variant 19 (same tiles, one CTA per block).
    const int64_t nb = gx * p.n_kv_heads;
    if (nb > 0x40000000LL || p.num_tokens * a.group > 0x7fffffffLL) {
      return launch<HD, true, 19>(p, stream);
    }
    a.total_blocks = uint32_t(nb);
    const int sms = sm_count(dev);
    const int64_t cap = Cfg<HD, VAR>::CAP8 ? 8 : (sms > 0 ? sms : 132);
    const unsigned ctas = unsigned(nb < cap ? nb : cap);
    kernel_fn<HD, PP, VAR>()<<<ctas, kThreads, smem_bytes<HD, VAR>(), stream>>>(a);
    return launch_status();
  } else {
    // LPT variants index the whole grid in 32 bits; larger grids take the kv-head-major order.
    if constexpr (Cfg<HD, VAR>::LPT) {
      constexpr int NL = Cfg<HD, VAR>::NO_LPT;
      if (gx * p.n_kv_heads > 0x7fffffffLL) return launch<HD, Cfg<HD, NL>::PP, NL>(p, stream);
    }
    prefill_kernel<HD, PP, VAR><<<dim3(unsigned(gx), unsigned(p.n_kv_heads)), kThreads,
                             smem_bytes<HD, VAR>(), stream>>>(a);
    return launch_status();
  }
}

}  // namespace attn_sm90
}  // namespace dk

extern "C" dk_status dk_attn_prefill_sm90(const DkAttnPrefillSm90Params* p, dk_stream_t stream) {
  if (p == nullptr) return DK_ERR_INVALID_ARGUMENT;
  if (p->n_kv_heads <= 0 || p->n_q_heads <= 0 || p->n_q_heads % p->n_kv_heads != 0 ||
      p->num_seqs <= 0 || p->max_seqlen <= 0 || p->page_size <= 0 || p->max_pages <= 0 ||
      p->num_pages <= 0 || p->num_tokens <= 0 || p->max_seqlen > p->num_tokens ||
      p->schedule < 0 || p->schedule > 1 || p->variant < 0 ||
      p->variant >= dk::attn_sm90::kVariants) {
    return DK_ERR_INVALID_ARGUMENT;
  }
  // Positions are 32-bit inside the kernel.
  if (p->max_pages * p->page_size > 0x7fffffffLL) return DK_ERR_INVALID_ARGUMENT;
  for (uint64_t ptr : {p->q, p->k_cache, p->v_cache, p->out}) {
    if (ptr == 0 || ptr % 16 != 0) return DK_ERR_INVALID_ARGUMENT;
  }
  if (p->cu_seqlens == 0 || p->ctx_lens == 0 || p->page_table == 0) {
    return DK_ERR_INVALID_ARGUMENT;
  }
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  const bool pp = p->schedule == 1;
  namespace a = dk::attn_sm90;
  switch (p->head_dim) {
    case 64:  // one tile configuration: `variant` ignored
      return pp ? a::launch<64, true, 0>(*p, s) : a::launch<64, false, 0>(*p, s);
    case 128:
      return pp ? a::launch<128, true, 0>(*p, s) : a::launch<128, false, 0>(*p, s);
    case 256:
      switch (p->variant) {
        case 0:
          return pp ? a::launch<256, true, 0>(*p, s) : a::launch<256, false, 0>(*p, s);
        // Variants 1-8 are built with the ping-pong schedule only.
        case 1:
          return pp ? a::launch<256, true, 1>(*p, s) : DK_ERR_UNSUPPORTED;
        case 2:
          return pp ? a::launch<256, true, 2>(*p, s) : DK_ERR_UNSUPPORTED;
        case 3:
          return pp ? a::launch<256, true, 3>(*p, s) : DK_ERR_UNSUPPORTED;
        case 4:
          return pp ? a::launch<256, true, 4>(*p, s) : DK_ERR_UNSUPPORTED;
        case 5:
          return pp ? a::launch<256, true, 5>(*p, s) : DK_ERR_UNSUPPORTED;
        case 6:
          return pp ? a::launch<256, true, 6>(*p, s) : DK_ERR_UNSUPPORTED;
        // FAST softmax needs scale > 0 (max of the raw scores): else the same tiles without it.
        case 7:
          if (!pp) return DK_ERR_UNSUPPORTED;
          return p->scale > 0.f ? a::launch<256, true, 7>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 9:
          if (!pp) return DK_ERR_UNSUPPORTED;
          return p->scale > 0.f ? a::launch<256, true, 9>(*p, s) : a::launch<256, true, 5>(*p, s);
        // Variants 10-15 carry their own schedule (`schedule` ignored); FAST softmax as 7.
        case 10:
          return p->scale > 0.f ? a::launch<256, true, 10>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 11:
          return p->scale > 0.f ? a::launch<256, false, 11>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 12:
          return p->scale > 0.f ? a::launch<256, true, 12>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 13:
          return p->scale > 0.f ? a::launch<256, false, 13>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 14:
          return p->scale > 0.f ? a::launch<256, true, 14>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 15:
          return p->scale > 0.f ? a::launch<256, false, 15>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 16:
          return p->scale > 0.f ? a::launch<256, true, 16>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 17:
          return p->scale > 0.f ? a::launch<256, true, 17>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 18:
          return p->scale > 0.f ? a::launch<256, false, 18>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 19:
          return p->scale > 0.f ? a::launch<256, true, 19>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 20:
          return p->scale > 0.f ? a::launch<256, false, 20>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 21:
          return p->scale > 0.f ? a::launch<256, true, 21>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 22:
          return p->scale > 0.f ? a::launch<256, false, 22>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 23:
          return p->scale > 0.f ? a::launch<256, true, 23>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 24:
          return p->scale > 0.f ? a::launch<256, true, 24>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 25:
          return p->scale > 0.f ? a::launch<256, true, 25>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 26:
          return p->scale > 0.f ? a::launch<256, true, 26>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 27:
          return p->scale > 0.f ? a::launch<256, true, 27>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 28:
          return p->scale > 0.f ? a::launch<256, true, 28>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 29:
          return p->scale > 0.f ? a::launch<256, true, 29>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 30:
          return p->scale > 0.f ? a::launch<256, true, 30>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 31:
          return p->scale > 0.f ? a::launch<256, true, 31>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 32:
          return p->scale > 0.f ? a::launch<256, true, 32>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 33:
          return p->scale > 0.f ? a::launch<256, true, 33>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 34:
          return p->scale > 0.f ? a::launch<256, true, 34>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 35:
          return p->scale > 0.f ? a::launch<256, true, 35>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 36:
          return p->scale > 0.f ? a::launch<256, true, 36>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 37:
          return p->scale > 0.f ? a::launch<256, true, 37>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 38:
          return p->scale > 0.f ? a::launch<256, true, 38>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 39:
          return p->scale > 0.f ? a::launch<256, true, 39>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 40:
          return p->scale > 0.f ? a::launch<256, true, 40>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 41:
          return p->scale > 0.f ? a::launch<256, true, 41>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 42:
          return p->scale > 0.f ? a::launch<256, true, 42>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 43:
          return p->scale > 0.f ? a::launch<256, true, 43>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 44:
          return p->scale > 0.f ? a::launch<256, true, 44>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 45:
          return p->scale > 0.f ? a::launch<256, true, 45>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 46:
          return p->scale > 0.f ? a::launch<256, true, 46>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 47:
          return p->scale > 0.f ? a::launch<256, true, 47>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 48:
          return p->scale > 0.f ? a::launch<256, true, 48>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 49:
          return p->scale > 0.f ? a::launch<256, true, 49>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 50:
          return p->scale > 0.f ? a::launch<256, true, 50>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 51:
          return p->scale > 0.f ? a::launch<256, true, 51>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 52:
          return p->scale > 0.f ? a::launch<256, true, 52>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 53:
          return p->scale > 0.f ? a::launch<256, true, 53>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 54:
          return p->scale > 0.f ? a::launch<256, true, 54>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 55:
          return p->scale > 0.f ? a::launch<256, true, 55>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 56:
          return p->scale > 0.f ? a::launch<256, true, 56>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 57:
          return p->scale > 0.f ? a::launch<256, true, 57>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 58:
          return p->scale > 0.f ? a::launch<256, true, 58>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 59:
          return p->scale > 0.f ? a::launch<256, true, 59>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 60:
          return p->scale > 0.f ? a::launch<256, true, 60>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 61:
          return p->scale > 0.f ? a::launch<256, true, 61>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 62:
          return p->scale > 0.f ? a::launch<256, true, 62>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 63:
          return p->scale > 0.f ? a::launch<256, true, 63>(*p, s) : a::launch<256, true, 5>(*p, s);
        case 64:
          return p->scale > 0.f ? a::launch<256, true, 64>(*p, s) : a::launch<256, true, 5>(*p, s);

        case 8:
          if (!pp) return DK_ERR_UNSUPPORTED;
          return p->scale > 0.f ? a::launch<256, true, 8>(*p, s) : a::launch<256, true, 6>(*p, s);
        default:
          return DK_ERR_INVALID_ARGUMENT;
      }
    default:
      return DK_ERR_UNSUPPORTED;
  }
}

extern "C" dk_status dk_attn_prefill_sm90_timeline(uint64_t* host, int64_t n) {
  namespace a = dk::attn_sm90;
  constexpr int64_t kWords = int64_t(a::kTlBlocks) * a::kTlFields;
  return dk::read_and_clear_device_words(a::g_prefill_tl, kWords, host, n);
}
