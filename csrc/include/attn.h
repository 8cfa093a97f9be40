/* attn.* : gated full attention of Qwen3.5 (prep kernel in CUDA; prefill in CUDA for sm_90a with
 * the Triton AOT kernel as the portable path; decode in CUDA for sm_90 with the Triton AOT kernels
 * as the portable path; the Triton kernels are
 * declared in the generated dk_triton.h). Included by deltakit.h. */
#ifndef DELTAKIT_ATTN_H
#define DELTAKIT_ATTN_H

/** attn.prep params: one fused pass over the q/k/v projections of a batch of tokens (prefill
 * rows and decode rows alike), mirroring the start of HF Qwen3_5Attention.forward:
 *   - split each query head's [q_h | gate_h] row (q_proj output, per-head interleaved);
 *   - q_norm / k_norm: zero-centred RMSNorm over head_dim, (1 + w), f32 (sum of squares in f64),
 *     one rounding to bf16;
 *   - partial NeoX RoPE on the first rotary_dim dims of q and k at absolute position
 *     ctx_lens[s] + (t - cu_seqlens[s]): inv_freq_i = theta^(-2i/rotary_dim) (f64 -> f32),
 *     angle = f32(pos) * inv_freq_i, c = bf16(cos), s = bf16(sin) (f64 cos/sin),
 *     x1' = bf16(bf16(x1 c) + bf16(-x2 s)), x2' = bf16(bf16(x2 c) + bf16(x1 s)); other dims untouched;
 *   - write q and gate contiguous, k and v into the paged cache.
 * Layouts: qg bf16 [T, HQ, 2*HD] rows sqg elements apart; k, v bf16 [T, HKV, HD] rows sk / sv
 * apart; q_out, gate_out bf16 [T, HQ, HD]; caches bf16 [num_pages, page_size, HKV, HD]; table i32
 * [N, max_pages]; cu_seqlens i32 [N+1]; ctx_lens i32 [N] (-1 = padding sequence: q_out and
 * gate_out rows zero, nothing written to the cache). HD in {64, 128, 256}. A table entry outside
 * [0, num_pages) skips that token's cache write (the safe wrapper rejects such tables first). */
typedef struct DkAttnPrepParams {
  uint64_t qg;
  uint64_t k;
  uint64_t v;
  uint64_t q_norm_w;
  uint64_t k_norm_w;
  uint64_t q_out;
  uint64_t gate_out;
  uint64_t k_cache;
  uint64_t v_cache;
  uint64_t cu_seqlens;
  uint64_t ctx_lens;
  uint64_t page_table;
  int64_t num_tokens;
  int64_t num_seqs;
  int64_t n_q_heads;
  int64_t n_kv_heads;
  int64_t head_dim;
  int64_t rotary_dim;
  int64_t sqg;
  int64_t sk;
  int64_t sv;
  int64_t page_size;
  int64_t max_pages;
  int64_t num_pages;
  float theta;
  float eps;
} DkAttnPrepParams;

/** attn.prep (CUDA C++). */
dk_status dk_attn_prep(const DkAttnPrepParams *p, dk_stream_t stream);

/** attn.prefill on sm_90a (CUDA C++, csrc/attn/prefill_sm90.cu): causal GQA attention of the new
 * tokens of a varlen batch over the paged KV cache, with prior context, mirroring the Triton
 * attn_prefill kernel (HF Qwen3_5Attention's sdpa(is_causal) with a cache). New token j of
 * sequence s sits at absolute position ctx_lens[s] + j and attends to cache positions
 * 0..=ctx_lens[s] + j (its own k/v already written by attn.prep); f32 online softmax, bf16 P,
 * f32 accumulation, one rounding of the output.
 * Layouts: q, out bf16 [T, HQ, HD] contiguous, 16-byte aligned; caches bf16 [num_pages,
 * page_size, HKV, HD]; cu_seqlens i32 [N+1]; ctx_lens i32 [N] (-1 = padding sequence: zero
 * rows); page_table i32 [N, max_pages]. HD in {64, 128, 256}; any GQA group; any page size.
 * max_seqlen = the longest new-token run (host value; sizes the grid). Page ids outside
 * [0, num_pages) read as zeros (the safe wrapper rejects such tables first).
 * Returns DK_ERR_NO_KERNEL_IMAGE when the device does not run sm_90a code (callers then use the
 * portable Triton kernel), DK_ERR_UNSUPPORTED for another head dim. */
typedef struct DkAttnPrefillSm90Params {
  uint64_t q;
  uint64_t k_cache;
  uint64_t v_cache;
  uint64_t out;
  uint64_t cu_seqlens;
  uint64_t ctx_lens;
  uint64_t page_table;
  int64_t num_tokens;
  int64_t num_seqs;
  int64_t max_seqlen;
  int64_t n_q_heads;
  int64_t n_kv_heads;
  int64_t head_dim;
  int64_t page_size;
  int64_t max_pages;
  int64_t num_pages;
  float scale;
  /** 0: the two consumer warpgroups issue their GEMMs freely; 1: ping-pong (they take turns,
   * one warpgroup's softmax overlapping the other's GEMMs). Same results. */
  int32_t schedule;
  /** Tile configuration at head dim 256 (ignored at 64 / 128): 0 = 64-position K/V tiles, 2
   * stages; 1 = 80-position tiles, 2 stages, P packed after the previous PV product; 2 = 64, 2
   * stages, late P; 3 = 48, 3 stages, late P; 4 = as 2 with 56 producer / 224 consumer registers;
   * 5 = as 1 with those registers; 6 = as 5, the producer loading K one tile ahead of V; 7 = as
   * 5 with the fast softmax (raw-score max, FFMA exponents, O rescale skipped when no row max
   * changed; needs scale > 0, else variant 5 runs); 8 = 6 + 7; 9 = 7 with TMA loads of the K/V
   * tiles (cp.async.bulk.tensor, 128B swizzle; page_size % 16 != 0 runs 7); 10-15 = 7 with the
   * softmax exponentials pinned under the PV product and the O rescale before the next PV issue,
   * each with its own consumer schedule (even ping-pong, odd free-running; `schedule` ignored):
   * 10/11 the producer of 7, 12/13 split K / V producer warps, 14/15 split with TMA loads
   * (page_size % 16 != 0 runs 12/13); 10-16 launch the row blocks heaviest first across kv
   * heads (LPT), 16 = 7 in that order; 17-22 the split TMA producer (odd ping-pong, even
   * free-running): 17/18 kv-head-major order, 19/20 LPT + output staged through shared memory
   * (16-byte stores), 21/22 staged, kv-head-major; 23 = 19 as a persistent kernel (one CTA per
   * SM walks the LPT block list, K/V ring, ping-pong turns and the next block's Q load carried
   * across blocks), 24 = 23 with at most 8 CTAs (test variant); 25 = 19 with Q loaded by the V
   * producer pair (two half barriers, stepped row addresses) so K tile 0 issues at once, 26 = 25
   * and 27 = 19 recording a per-block timeline (dk_attn_prefill_sm90_timeline; measurement);
   * 28 = 25 with an L2 prefetch of a later block's Q rows and stepped output addresses (slower
   * than 25 on an H200), 29 = 28 recording the timeline; 30 = 25 with stepped output
   * addresses, 31 = 30 with ctx_lens and K tile 0's page-table entries loaded at entry, 32 = 31
   * with Q loaded by all four producer warps, 33 = 32 recording the timeline, 34 = 31 with the
   * staged output rows of heads >= the first row's head (first 64 / G tokens) written by TMA
   * tensor stores, 35 = 34 recording the timeline (31-35 opt-in); 36 = 23 with each block's
   * tile loop run from a compile-time start stage (uniform wgmma descriptors; opt-in), 37 = 36
   * with at most 8 CTAs (test variant), 38 = 36 recording the timeline; 39 = 31 with Q loaded
   * by the consumer warpgroups, 40 = 39 recording the timeline, 41 = 39 with a stmatrix
   * epilogue, 42 = 31 with Q loaded by TMA (tensor maps prefetched at entry; without the K / V
   * maps, i.e. page_size % 16 != 0, 12 runs as for 30 / 31; then 31 runs for a group above 16 or
   * if the Q encoder fails), 43 = 42 recording the timeline (39-43 opt-in, session 9); 44 = 31
   * with Q by TMA from whole-token boxes issued by one lane and the partial-token rows by cp.async
   * (the barriers set up while the metadata loads; 31 runs for a group above 64 or if the Q encoder
   * fails; page_size % 16 != 0 runs 12), 45 = 44 recording the timeline, 46 = 44 with K tile 1 /
   * V tile 0 issued only once Q landed, 47 = 46 recording the timeline, 48 = 44 with every full
   * K / V tile's boxes issued by one lane with warp-uniform operands, 49 = 48 recording the
   * timeline, 50 = 48 recording the timeline with K tile 0's issuer stamped, 51 = 48 with K tile
   * 0's operands prepared at entry and its boxes issued first (correct and memcheck-clean on the
   * small cases, not timed), 52 = 51 recording the timeline (session 10); 53 = 51 with each
   * block's sequence bounds, context length and K / V tile 0's page entries taken from the launch
   * parameters (copied from the host_* arrays below at launch: no dependent global load before
   * the block's first TMA issues; without all three host arrays, or for more than 64 sequences,
   * 51 runs), 54 = 53 recording the timeline (as 52), 55 = 53 with Q's boxes and a full K tile 0
   * issued before the block's barrier sync by the two threads that set up their barriers, 56 =
   * 55 recording the timeline (as 54) (session 11; 53 / 55 correct and sanitizer-clean on an H200
   * but no faster than 48); 57 = 48 as a persistent kernel (min(row blocks, SMs) CTAs walk the
   * row-block list; K / V ring, barrier phases and ping-pong turns run on across row blocks; the
   * next row block's Q and K tile 0 load under the current one's last PV product and epilogue;
   * snake order over the list; lists of fewer than 4 row blocks per SM run 48), 58 = 57 always
   * persistent, recording the timeline (session 11, reworked in session 12; H200: correct and
   * sanitizer-clean, = 48 at varlen 8 x 2048, 4-8% slower at the 8k / 32k squares); 59 / 60 =
   * 57 / 58 with the K / V boxes' kv-head coordinate warp-uniform in the producer (session 12);
   * 61-64 = 48 / 49 / 59 / 60 with the sequence-grouped block order (groups of consecutive
   * sequences whose K / V fits 8 MiB run one after the other, 48's order inside a group; 63 runs
   * 61 below 4 row blocks per SM or for a K / V span above 4096; DELTAKIT_ATTN_SEQ_GROUP=<n>
   * sets the sequences per group; session 13).
   * The safe wrapper's default: 61 (session 13; 48 in sessions 10-12, 30 in sessions 7-9, 25 in
   * session 6).
   * Variants 1-9 need schedule 1 (else DK_ERR_UNSUPPORTED); 10-64 ignore `schedule` and, as 7,
   * need scale > 0 (else variant 5 runs); outside 0..=64:
   * DK_ERR_INVALID_ARGUMENT. Same results up to rounding. */
  int32_t variant;
  /** Optional host copies (host addresses; 0 = not given) of cu_seqlens i32 [N+1], ctx_lens i32
   * [N] and page_table i32 [N, max_pages], equal to the device arrays; read by the launcher during
   * the call (variants 53-56 copy each sequence's bounds, context length and first page entries
   * into the kernel's launch parameters; a captured graph keeps the values of capture time, as it
   * keeps max_seqlen). Other variants ignore them. */
  uint64_t host_cu_seqlens;
  uint64_t host_ctx_lens;
  uint64_t host_page_table;
} DkAttnPrefillSm90Params;

/** attn.prefill, sm_90a kernel (wgmma, warp-specialized; see csrc/attn/prefill_sm90.cu). */
dk_status dk_attn_prefill_sm90(const DkAttnPrefillSm90Params *p, dk_stream_t stream);

/** Measurement hook of the timeline variants 26 / 27 / 29 / 33 / 35 / 38 / 40 / 43 / 45 / 47 / 49 / 50 / 52 / 54 / 56 / 58:
 * copies the first `n` words
 * (12 per row block at its linear launch index, at most 16384 blocks: SM id | tiles << 32, then
 * %globaltimer ns at entry, Q ready, first QK^T done, last PV done, warpgroup 0 / 1 output
 * stored, producer done, sequence bounds + context length loaded, past the barrier-init
 * __syncthreads, warpgroup 0's first Q rows issued, K tile 0 issued; 40: field 10 = consumer
 * warpgroup 0 issued its Q rows; 43: 10 = the Q boxes issued, 7 / 8 = the Q-issuing warp past its
 * register release / before its first box; 45 / 47 / 49: 7 = the partial-token Q rows issued,
 * 8 = the bounds known (after the barrier sync of 9), 10 = the Q boxes issued; 50 / 52 / 54 / 56: as 49
 * but 7 / 8 = K tile 0's issuer past its register release / before its first box; 58: per row block
 * at its list index, 1 = consumer warpgroup 0 starts it, 9 = the Q tile released, 10 = the Q boxes
 * issued, 11 = K tile 0 issued, 7 / 8 unused; zero = not
 * recorded) of the
 * device-global timeline buffer to `host`, then zeroes the buffer and synchronizes the device.
 * Synchronize the launching stream first. */
dk_status dk_attn_prefill_sm90_timeline(uint64_t *host, int64_t n);

/** attn.decode on sm_90 (CUDA C++, csrc/attn/decode_sm90.cu): split-K decode attention over the
 * paged KV cache, mirroring the Triton attn_decode + attn_decode_merge kernels (HF
 * Qwen3_5Attention's sdpa over the cache for the newest token(s)). Row i has n_new >= 1 new tokens
 * (already written to the cache by attn.prep) at absolute positions seq_lens[i] - n_new + t; new
 * token t attends to cache positions 0..=seq_lens[i] - n_new + t (n_new > 1: speculative
 * verification, causal among the new tokens). f32 online softmax (exp2), bf16 P, f32 accumulation.
 * Layouts: q, out bf16 [num_rows * n_new, HQ, HD] contiguous (token-major, the row's n_new tokens
 * consecutive), 16-byte aligned; caches bf16 [num_pages, page_size, HKV, HD]; seq_lens i32
 * [num_rows] (-1 = padding row: zero output); page_table i32 [num_rows, max_pages].
 * (HQ / HKV) * n_new <= 16. HD in {64, 128, 256}. The context of row i is cut into num_splits
 * ranges of whole tiles; num_splits == 1 writes out directly, else each (token, head, split) writes
 * an f32 partial output to workspace [num_rows * n_new, HQ, num_splits, HD] followed by base-2
 * log-sum-exps [num_rows * n_new, HQ, num_splits] (the Triton kernels' workspace layout), and a
 * merge kernel on the same stream writes out. Page ids outside [0, num_pages) read as zeros (the
 * safe wrapper rejects such tables first). Graph-safe: nothing depends on host copies of
 * seq_lens. Returns DK_ERR_NO_KERNEL_IMAGE when the device is not compute capability 9.0 or the
 * build has no sm_90 code (callers then use the portable Triton kernels), DK_ERR_UNSUPPORTED for
 * another head dim. */
typedef struct DkAttnDecodeSm90Params {
  uint64_t q;
  uint64_t k_cache;
  uint64_t v_cache;
  uint64_t out;
  uint64_t seq_lens;
  uint64_t page_table;
  /** f32 workspace (16-byte aligned); may be 0 when num_splits == 1. */
  uint64_t workspace;
  int64_t num_rows;
  int64_t n_new;
  int64_t n_q_heads;
  int64_t n_kv_heads;
  int64_t head_dim;
  int64_t page_size;
  int64_t max_pages;
  int64_t num_pages;
  int64_t num_splits;
  float scale;
  /** Tile configuration (see decode_sm90.cu), 0..=24: 0-3 cp.async loads, 4-7 bulk-copy (TMA)
   * loads, each with its warps x shared-memory stages; 8-11 the tiles of 0-3 where 2..=8 splits
   * run as one thread-block cluster per (row, kv head) and combine through distributed shared
   * memory (no merge launch; the workspace is not written; other split counts run 0-3); 12 =
   * variant 0 recording a per-CTA timeline (dk_attn_decode_sm90_timeline; measurement); 13 = the
   * tiles of 0 where C consecutive splits (C = the largest divisor of num_splits in 2..=8 whose
   * clusters all fit at once) run as one cluster that shares their ranges dynamically
   * (16-position chunks claimed from a counter in the first CTA's shared memory, set up by each
   * launch; partials + merge as 0; no such C: 0); 14 / 15 = the tiles of 0 / 3 where all splits
   * of a (row, kv head) claim 16-position chunks of its whole context from a module-global
   * counter (one of 64 regions per launch, put back to zero by the group's last CTA; one split or
   * more than 4096 (row, kv head) pairs: 0 / 3), 16 / 17 = 14 / 15 with the first 3/4 of the
   * chunks dealt round-robin without the counter (14-17 opt-in, session 9; one stream at a
   * time: launches in flight at once on different streams may share a counter region); 18-24
   * (session 12) = strided splits (split s takes tiles s, s + S, ...; its first tiles' page
   * entries loaded at entry with seq_len) with / without the lean combine: 18 / 19 / 20 = tiles
   * of 0 / 2 / 3, 21 = 0 without the lean combine, 22 = 18 recording the timeline of 12, 23 / 24 =
   * tiles of 2 / 0 striding over the contiguous split's live split count; -1 = automatic:
   * variant 19 (one CTA per SM, <= 8 splits, hd 256), 0 (one CTA per SM otherwise) or 3, and a split
   * count <= num_splits chosen from num_rows x n_kv_heads and the SM count (the workspace layout
   * then uses that count). Ignored at head dim 64. Same results up to rounding. Tiles of one CTA
   * per SM (hd 256: 0, 2, 4, 8, 10, 18, 19, 21-24) launch as a programmatic dependent of the
   * previous kernel on the stream (reading nothing before that kernel completed). */
  int32_t variant;
} DkAttnDecodeSm90Params;

/** attn.decode, sm_90 kernel (mma.sync, cp.async pipeline; see csrc/attn/decode_sm90.cu). */
dk_status dk_attn_decode_sm90(const DkAttnDecodeSm90Params *p, dk_stream_t stream);

/** Measurement hook of decode variants 12 / 22: copies the first `n` words of the device-global
 * timeline (6 per split CTA at its linear index (x fastest), 4096 CTAs: SM id | tiles << 32, then
 * %globaltimer ns at entry, after the grid-dependency wait, Q landed, main loop done, partials
 * written; then 6 per merge block, 4096 blocks: entry, after the wait, output written) to `host`,
 * zeroes the buffer and synchronizes the device. Synchronize the launching stream first. */
dk_status dk_attn_decode_sm90_timeline(uint64_t *host, int64_t n);

#endif
