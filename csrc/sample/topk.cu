// sample.topk_logprobs: per row the k (<= 256) largest logits of a bf16 vocabulary as
// (id, logit - logsumexp(row)), sorted by logit descending, ties by lower id
// (torch.topk(torch.log_softmax(logits.float(), -1), k) with a deterministic tie order; the CPU twin
// is deltakit_ref::sample::topk_logprobs).
//
// Layout: logits bf16 [rows, vocab] contiguous; ids i32 [rows, k]; logprobs f32 [rows, k].
// Thread mapping: one CTA of 1024 threads per row, three passes over the row (the row stays in L2
// after the first):
//   1. NaN flag, row max, and a histogram of the high byte of the 16-bit order key (key16) of
//      every element (lane-private shared-memory copies, integer atomics: deterministic);
//      a suffix scan picks the high byte hb of the k-th largest key.
//   2. sum of exp(x - max) in f32 (fixed reduction tree), and the low-byte histogram of the
//      elements whose high byte is hb; a second suffix scan gives the exact threshold key T of the
//      k-th largest element and the number g < k of elements with key > T.
//   3. collect: every element with key > T (shared atomic slot; order irrelevant) plus the
//      k - g lowest-index elements with key == T (ordered compaction: per tile a block prefix sum
//      of the per-thread tie counts, tiles in index order).
// The k candidates are then ranked in shared memory by (key desc, id asc) (rank sort, k^2
// comparisons) and written with logprob = x - (max + log(sum)). A NaN anywhere in the row writes
// ids -1 and logprobs NaN for the whole row (the reference returns an error there).
#include "common.cuh"

namespace {

using namespace dk_sample;

constexpr int kMaxK = DK_TOPK_MAX;
constexpr int kCopies = 32;  // u32 histogram copies (32 KiB)

__global__ void __launch_bounds__(kThreads, 1)
    topk_kernel(const uint16_t* __restrict__ logits, int32_t* __restrict__ ids, float* __restrict__ logprobs,
                int64_t vocab, int k) {
  __shared__ uint32_t hist[kBins * kCopies];
  __shared__ uint32_t bins[kBins];
  __shared__ uint32_t scan_ws[kWarps + 1];
  __shared__ float red_ws[kWarps + 1];
  __shared__ uint32_t sel_ws[kBins / 32];
  __shared__ int sel_bin1, sel_bin2;
  __shared__ uint32_t sel_above1, sel_above2;
  __shared__ uint32_t cand_key[kMaxK];
  __shared__ int32_t cand_id[kMaxK];
  __shared__ uint32_t gt_slot, eq_base;

  const int t = threadIdx.x;
  const int64_t r = blockIdx.x;
  const uint16_t* row = logits + r * vocab;
  int32_t* out_ids = ids + r * k;
  float* out_lp = logprobs + r * k;

  hist_clear<uint32_t, kCopies>(hist);
  if (t == 0) {
    gt_slot = 0;
    eq_base = 0;
  }
  __syncthreads();

  // Pass 1: NaN flag, max, high-byte histogram.
  float mx = -INFINITY;
  int nan = 0;
  for_each_tile(row, vocab, [&](int64_t, const uint32_t* v, int cnt) {
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      if (e < cnt) {
        const uint32_t b = v[e];
        if (is_nan_bits(b)) {
          nan = 1;
        } else {
          mx = fmaxf(mx, bf16_bits_to_float(b));
        }
        hist_add<uint32_t, kCopies>(hist, key16(b) >> 8, 1u);
      }
    }
  });
  if (__syncthreads_or(nan)) {
    for (int i = t; i < k; i += kThreads) {
      out_ids[i] = -1;
      out_lp[i] = __int_as_float(0x7fffffff);
    }
    return;
  }
  const float m = block_max(mx, red_ws);
  sum_copies<uint32_t, kCopies>(hist, bins);
  select_bin<uint32_t>(bins, static_cast<uint32_t>(k), sel_ws, &sel_bin1, &sel_above1);
  const int hb = sel_bin1;
  const uint32_t above1 = sel_above1;
  hist_clear<uint32_t, kCopies>(hist);
  __syncthreads();

  // Pass 2: sum of exp(x - m); low-byte histogram inside high byte hb.
  float s = 0.0f;
  for_each_tile(row, vocab, [&](int64_t, const uint32_t* v, int cnt) {
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      if (e < cnt) {
        const uint32_t b = v[e];
        s += __expf(bf16_bits_to_float(b) - m);
        const uint32_t key = key16(b);
        if (static_cast<int>(key >> 8) == hb) hist_add<uint32_t, kCopies>(hist, key & 0xFFu, 1u);
      }
    }
  });
  s = block_sum(s, red_ws);
  const float lse = m + logf(s);
  sum_copies<uint32_t, kCopies>(hist, bins);
  select_bin<uint32_t>(bins, static_cast<uint32_t>(k) - above1, sel_ws, &sel_bin2, &sel_above2);
  const int lb = sel_bin2;
  if (hb < 0 || lb < 0) {  // unreachable for 1 <= k <= vocab without NaN; never read out of bounds
    for (int i = t; i < k; i += kThreads) {
      out_ids[i] = -1;
      out_lp[i] = __int_as_float(0x7fffffff);
    }
    return;
  }
  const uint32_t thr = (static_cast<uint32_t>(hb) << 8) | static_cast<uint32_t>(lb);
  const uint32_t n_gt = above1 + sel_above2;            // elements with key > thr, < k
  const uint32_t need_eq = static_cast<uint32_t>(k) - n_gt;  // >= 1 of the key == thr ones

  // Pass 3: collect the candidates.
  for_each_tile(row, vocab, [&](int64_t first, const uint32_t* v, int cnt) {
    uint32_t my_eq = 0;
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      if (e < cnt) {
        const uint32_t key = key16(v[e]);
        if (key > thr) {
          const uint32_t slot = atomicAdd(&gt_slot, 1u);
          if (slot < n_gt) {  // always (n_gt elements have key > thr); guards shared memory
            cand_key[slot] = key;
            cand_id[slot] = static_cast<int32_t>(first + e);
          }
        } else if (key == thr) {
          ++my_eq;
        }
      }
    }
    if (eq_base < need_eq) {  // block-uniform: eq_base changes only between the barriers below
      uint32_t tile_eq;
      uint32_t pos = eq_base + block_excl_scan(my_eq, scan_ws, &tile_eq);
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        if (e < cnt && key16(v[e]) == thr) {
          if (pos < need_eq) {
            cand_key[n_gt + pos] = thr;
            cand_id[n_gt + pos] = static_cast<int32_t>(first + e);
          }
          ++pos;
        }
      }
      __syncthreads();  // every thread has read eq_base
      if (t == 0) eq_base += tile_eq;
      __syncthreads();
    }
  });
  __syncthreads();

  // Rank sort of the k candidates by (key desc, id asc); (key, id) pairs are distinct.
  if (t < k) {
    const uint32_t key = cand_key[t];
    const int32_t id = cand_id[t];
    int rank = 0;
    for (int j = 0; j < k; ++j) {
      const uint32_t kj = cand_key[j];
      rank += (kj > key || (kj == key && cand_id[j] < id)) ? 1 : 0;
    }
    out_ids[rank] = id;
    out_lp[rank] = bf16_bits_to_float(bits_of_key(key)) - lse;
  }
}

}  // namespace

extern "C" dk_status dk_sample_topk_logprobs(const DkTopkLogprobsParams* p, dk_stream_t stream) {
  if (p == nullptr || p->rows < 0 || p->vocab <= 0 || p->vocab > INT32_MAX) return DK_ERR_INVALID_ARGUMENT;
  if (p->k < 1 || p->k > kMaxK || p->k > p->vocab) return DK_ERR_INVALID_ARGUMENT;
  if (p->rows == 0) return DK_OK;
  if (p->rows > 0x7fffffff || p->logits == 0 || p->ids == 0 || p->logprobs == 0) return DK_ERR_INVALID_ARGUMENT;
  if (p->logits % 2 != 0 || p->ids % 4 != 0 || p->logprobs % 4 != 0) return DK_ERR_INVALID_ARGUMENT;
  topk_kernel<<<static_cast<unsigned>(p->rows), kThreads, 0, stream>>>(
      reinterpret_cast<const uint16_t*>(p->logits), reinterpret_cast<int32_t*>(p->ids),
      reinterpret_cast<float*>(p->logprobs), p->vocab, static_cast<int>(p->k));
  return dk::launch_status();
}
