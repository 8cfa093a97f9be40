/* gdr.chunk_prefill for sm_90a, the split pipeline (csrc/gdr/chunk_prefill_fused_sm90.cu; the default on sm_90a in
 * src/ops/gdr/chunk_prefill.rs, DELTAKIT_GDR_PREFILL=split); declared here, not through bindgen. The session-4 one-kernel
 * "fused" entry point (dk_gdr_chunk_prefill_fused_sm90) was removed in session 5: slower than the split pipeline at
 * every benchmark shape (docs/benchmarks/2026-12-01-gdr-prefill-s5.md). */
#ifndef DELTAKIT_GDR_CHUNK_PREFILL_FUSED_SM90_H
#define DELTAKIT_GDR_CHUNK_PREFILL_FUSED_SM90_H
#include "../include/deltakit.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Arguments of the split pipeline (gdr.chunk_prefill, K = 128, V a multiple of 64, V >= 128): q, k bf16 [T, H_k, K]
 * (token strides q_stride / k_stride, elements), v bf16 [T, H_v, V] (v_stride), gating precomputed (fused = 0: g, beta
 * f32 [T, H_v]) or fused (fused = 1: a, b bf16 [T, H_v] with token stride ab_stride, a_log, dt_bias f32 [H_v]),
 * cu_seqlens i32 [N + 1], slots i32 [N] (-1 / out of range = padding: zero output rows, state untouched), init i32 [N]
 * (init_mode 2), state f32 [num_slots, H_v, K, V] (in place), out bf16 [T, H_v, V] (contiguous). init_mode: 0 zeros,
 * 1 from slots, 2 per-sequence flags. use_l2: q / k L2 norm in f32; scale multiplies q. variant: see
 * dk_gdr_chunk_prefill_split_sm90. (The name is the removed fused kernel's; the layout is unchanged.) */
typedef struct DkGdrPrefillFusedParams {
  uint64_t q, k, v, g, beta, a, b, a_log, dt_bias, cu_seqlens, slots, init, state, out;
  int64_t num_tokens, num_seqs, num_slots, h_k, h_v, k_dim, v_dim, q_stride, k_stride, v_stride, ab_stride;
  int32_t use_l2, init_mode, fused;
  float scale;
  int32_t variant; /* dk_gdr_chunk_prefill_split_sm90 variant bits */
} DkGdrPrefillFusedParams;

/** Workspace regions of the split pipeline (DELTAKIT_GDR_PREFILL=split): coff i32 [N + 1] and cseq i32 [nt] as the
 * Triton chunk_offsets / chunk_map kernels leave them (first chunk id of each sequence, clamped to nt; sequence of
 * each chunk id, -1 = none), img: nt * H_v stage images of 26,880 bytes (128-byte aligned; the library passes its
 * per-chunk state region, K V 2 >= 26,880 bytes per chunk and head for V >= 128). */
typedef struct DkGdrPrefillSplitWs {
  uint64_t coff, cseq, img;
  int64_t nt;
  uint64_t flags; /* variant bit 512 only (else unused, may be 0): i32 [nt * H_v + N * H_v * V / 64], 4-aligned, zeroed
                   * by the call itself (cudaMemsetAsync on the stream: graph-safe) */
  uint64_t cp;      /* variant bit 4096 only (else unused, may be 0): scratch of cp_bytes bytes for the context-parallel
                     * segment records (5 N x 48 bytes) and state blocks (f32 [N, 4, H_v, K, V]); too small: no CP */
  int64_t cp_bytes;
} DkGdrPrefillSplitWs;

/** Every check dk_gdr_chunk_prefill_split_sm90 makes before it enqueues, without launching: DK_ERR_UNSUPPORTED off
 * sm_90 or for K != 128 / V % 64 != 0 / V < 128, DK_ERR_NO_KERNEL_IMAGE without an sm_90a image,
 * DK_ERR_INVALID_ARGUMENT for a variant the dispatch does not have (the list in dk_gdr_chunk_prefill_split_sm90) or bad
 * sizes / alignments. */
dk_status dk_gdr_chunk_prefill_split_sm90_check(const DkGdrPrefillFusedParams *p);

/** The split pipeline's two CUDA launches on `stream` (after the caller's chunk_offsets / chunk_map): the local pass
 * (grid (nt, H_v): one stage image per chunk and value head) and the state kernel (grid (N, H_v, V / 64)). Same
 * arguments as DkGdrPrefillFusedParams describes; DK_ERR_UNSUPPORTED / DK_ERR_NO_KERNEL_IMAGE as the _check (nothing
 * enqueued: the caller then runs the portable Triton pipeline). variant bits: 2 = clock64 phase profile of the state
 * warps (printed once per process), 4 = local pass only, 8 = state kernel only (timing splits; wrong results),
 * 16 = the state kernel with every state-side product on wgmma (split_wg_kernel; 18 = 16 + 2, 24 = 16 + 8), 32 = its
 * loaders keep two chunks in flight, 1 = MUFU exp for the local pass's decay factors, 64 = local pass per (chunk, key
 * head) looping over the key head's value heads (K / Q tiles, norms, raw K K^T / Q K^T once per key head; grid
 * (nt, H_k)), 128 = the wgmma state kernel's chain variant (X and S Q^T as one N = 128 product per k16 step over
 * interleaved K / Q panels, the V^T tile read under the X group, O / S scaling under the v group), 256 = the state
 * kernel without its bf16 lo-part products (one bf16 product each: a measurement of the tensor work's share, BELOW the
 * contract's precision). Instantiated: 0, 2, 4, 5, 8, 16, 17, 18, 24, 48, 50, 56, 80-85, 144, 146, 152, 208-210, 408,
 * 465, 721 (= 209 + 512: overlap of the local pass with the state kernel -- state kernel first, the local pass as its
 * programmatic dependent on the SMs it leaves free, per-(chunk, value head) ready flags in ws->flags, bounded spin
 * with a fix-up launch; used when N H_v V / 64 <= SMs - 16 and a cost model expects a gain, else 209; compiled, not
 * yet run on a GPU); + 1024 (1745): the same with every state CTA aborting at its first image, i.e. the fix-up launch
 * computes the call (a test of the fallback); + 2048 (2769): without the cost model; 4305 (= 209 + 4096): context
 * parallelism for few sequence-heads (three segments per sequence: pass 1 = segment 0 from the initial state next to
 * segment 1's transition M and zero-start end state D, scan S2 = M S1 + D, pass 3 = segments 1 and 2; ws->cp; only
 * K = V = 128, 2 N H_v <= SMs and a gain model (a unit segment of > ~26 chunks), else 209; session 7), 6353
 * (= 4305 + 2048): without that model (K = V = 128 and ws->cp still required), 4817 (= 721 + 4096): 4305 where its
 * model says so, else 721; 8401 (= 209 + 8192): the pair state CTA (grid (N, H_v, V / 128), 384 threads: two state
 * warpgroups for both 64-column halves sharing the K / Q / image stages, setmaxnreg 232 / 40; V % 128 == 0, else 209;
 * not with 4096 yet; session 7 round 2, not yet run on a GPU), 8913 / 10961 / 11985 (= 721 / 2769 / 3793 + 8192):
 * the overlap with the pair state CTA (N H_v V / 128 <= SMs - 16), 8344 (= 152 + 8192): its state kernel alone;
 * 12497 (= 209 + 4096 + 8192; session 7, the candidate default, not yet run as a whole): 4305 where its gain model
 * says so (few sequence-heads, a unit segment of > ~26 chunks), else 8401 where the pair CTA's state waves are
 * cheaper (a wave model: ~3.96 us per chunk per pair CTA vs ~2.3 per single CTA), else 209 (session 8: tests and
 * memcheck pass under it); + 16384 (session 8): the local pass at 4 CTAs / SM (__launch_bounds__(128, 4), 53,504 B
 * shared memory: f32 A unpadded and XOR-swizzled over the dead K tile; same arithmetic, so the same bits as without
 * it; 27B TP1 local pass 227 -> 195 us under ncu), only as 16593 (= 209 + 16384) and 28881 (= 12497 + 16384); 32977
 * (= 209 + 32768, a racecheck diagnostic): the state warps release stages with bar.sync instead of bar.arrive; 65745
 * (= 209 + 65536, opt-in): they release them through one mbarrier per stage (arrive / parity wait);
 * 159953 (= 28881 + 131072, session 9, opt-in): 28881's routes with the local pass on wgmma (SS-wgmma K K^T / Q K^T,
 * 2 x 2 blocked (I + A)^-1; csrc/gdr/chunk_local_wgmma_sm90.cu, the same stage image to ~2^-16; H200: tests and
 * memcheck pass, local pass 194 -> 167 us at 27B TP1, the four benchmark shapes 3-7% faster than 28881), 225489
 * (= 94417 + 131072): the same local pass on 94417's routes (H200 session 9 end check: every GPU test of the library
 * and engine under it, racecheck 0 and memcheck 0 on the chunk-prefill tests, 4.1 / 2.9 / 5.1 / 5.8% faster than 94417
 * at the four benchmark shapes); 487633 (= 225489 + 262144, session 10, opt-in): 225489 with the local pass's
 * session-10 form (the A / P tiles below the diagonal blocks take their decay as a row times a column factor, the
 * gating of every value head on warps 2-3 (the next head's while they idle in the inverse's last phase), Tb stored by
 * 32-row items; chunk_local_wgmma_sm90.cu), 1011921 (+ 524288: the epilogue -> diagonal-inverse hand-off by a warp
 * barrier), 1536209 (+ 1048576: the image copied out of shared memory by TMA bulk copies), 2060497 (both; the default
 * since session 10: H200 tests 20/20, memcheck 0, racecheck 0 on four chunk-prefill tests, local pass 167 -> 136 us at
 * 27B TP1, 5.0 / 3.7 / 4.5 / 3.8% faster than 225489 at the four benchmark shapes, same call); 4157649 (= 2060497 +
 * 2097152, session 10, opt-in): 2060497 whose state kernels store the output tile through stmatrix .trans (same
 * values; H200: tests 20/20, memcheck 0, 0.9-2.6% faster than 2060497 at the four benchmark shapes, same call; see
 * docs/benchmarks/2026-12-02-gdr-state-s10.md); 94417 (= 28881 +
 * 65536, session 9): 28881's routes with the mbarrier stage release in every state kernel they take (single CTA, pair
 * CTA, both context-parallel passes; same results; H200: compute-sanitizer racecheck 0 where 28881 reports the
 * named-barrier stage refill, same speed). Every other variant is DK_ERR_INVALID_ARGUMENT, from the _check too (before
 * the caller enqueues anything). Environment DELTAKIT_GDR_ROUTE_LOG=1 (diagnostic): one stderr line per state-kernel
 * launch (route, template variant, grid). The library default is 2060497 (session 10; 225489 in session 9, 94417
 * before it, 28881 in session 8, 209 before). */
dk_status dk_gdr_chunk_prefill_split_sm90(const DkGdrPrefillFusedParams *p, const DkGdrPrefillSplitWs *ws,
                                          dk_stream_t stream);

#ifdef __cplusplus
}
#endif
#endif
