/* sample.topk_logprobs and sample.top_p: per-row selection over a bf16 vocabulary (248320 for
 * Qwen3.5). Included by deltakit.h. (sample.argmax's params live in mlp.h.) */
#ifndef DELTAKIT_SAMPLE_H
#define DELTAKIT_SAMPLE_H

/** Largest k of sample.topk_logprobs. */
#define DK_TOPK_MAX 256

/** sample.topk_logprobs params (torch.topk(torch.log_softmax(logits.float(), -1), k)):
 * per row the k largest logits as (id, logit - logsumexp(row)), sorted by logit descending, ties
 * by lower id (order of the bf16 total order: -0 < +0). logsumexp in f32 (max-subtracted).
 * logits bf16 [rows, vocab] contiguous; ids i32 [rows, k]; logprobs f32 [rows, k].
 * 1 <= k <= min(DK_TOPK_MAX, vocab). A row holding a NaN gets ids -1 and logprobs NaN. */
typedef struct DkTopkLogprobsParams {
  uint64_t logits;
  uint64_t ids;
  uint64_t logprobs;
  int64_t rows;
  int64_t vocab;
  int64_t k;
  /** Optional device workspace (0: none; else 16-byte aligned) of workspace_bytes: with one, few
   *  rows and k <= DK_TOPK_SPLIT_MAX_K, each row is split over up to DK_TOPK_MAX_SPLITS CTAs by
   *  vocabulary slice and merged by a second kernel (same ids; logprobs equal up to f32 rounding
   *  of the logsumexp). Size it with dk_topk_workspace_bytes(rows, DK_TOPK_MAX_SPLITS, k). */
  uint64_t workspace;
  int64_t workspace_bytes;
} DkTopkLogprobsParams;

/** Most vocabulary slices per row of the split top-k. */
#define DK_TOPK_MAX_SPLITS 32
/** Largest k the split top-k takes (its merge ranks splits * k candidates per row). */
#define DK_TOPK_SPLIT_MAX_K 64

/** Workspace bytes of the split top-k for `rows` rows, `splits` slices and `k`. */
int64_t dk_topk_workspace_bytes(int64_t rows, int64_t splits, int64_t k);

/** sample.topk_logprobs (CUDA C++, csrc/sample/topk.cu). */
dk_status dk_sample_topk_logprobs(const DkTopkLogprobsParams *p, dk_stream_t stream);

/** sample.top_p params: seeded temperature / nucleus sampling with integer-exact masses
 * (definition: deltakit_ref::sample::top_p_sample; the kernel computes the same bits).
 * logits bf16 [rows, vocab] contiguous; per-row device arrays temperature f32 [rows],
 * top_p f32 [rows], seed u64 [rows], counter u64 [rows]; ids i32 [rows].
 * temperature NaN / <= 0 / 1/T overflowing f32 -> greedy (argmax, ties to the lowest id);
 * top_p outside (0, 1] -> 1. The draw depends only on (seed, counter) and the row's logits.
 * A row holding a NaN gets id -1. */
typedef struct DkTopPParams {
  uint64_t logits;
  uint64_t temperature;
  uint64_t top_p;
  uint64_t seed;
  uint64_t counter;
  uint64_t ids;
  int64_t rows;
  int64_t vocab;
} DkTopPParams;

/** sample.top_p (CUDA C++, csrc/sample/top_p.cu). */
dk_status dk_sample_top_p(const DkTopPParams *p, dk_stream_t stream);

#endif
