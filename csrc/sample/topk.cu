// sample.topk_logprobs: per row the k (<= 256) largest logits of a bf16 vocabulary as
// (id, logit - logsumexp(row)), sorted by logit descending, ties by lower id
// (torch.topk(torch.log_softmax(logits.float(), -1), k) with a deterministic tie order; the CPU twin
// is deltakit_ref::sample::topk_logprobs).
//
// Layout: logits bf16 [rows, vocab] contiguous; ids i32 [rows, k]; logprobs f32 [rows, k].
// Thread mapping: one CTA of 1024 threads per row (or, with a workspace and few rows, per (row,
// vocabulary slice) plus a merge CTA per row: see SplitWs), three passes over the row (the row
// stays in L2 after the first):
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

// Split mode (vocab-parallel; rows x splits CTAs): CTA (r, s) runs the three passes over the slice
// [s * slice, min(vocab, (s + 1) * slice)) of row r and writes its k candidates sorted by (key
// desc, id asc) and its (max, sum of exp(x - max)) to the workspace; topk_merge_kernel merges the
// splits' sorted lists per row and forms logsumexp from the partial sums. Requires k <= every
// slice's length.
struct SplitWs {
  uint32_t* key;  // [rows, splits, k]
  int32_t* id;    // [rows, splits, k]
  float2* ms;     // [rows, splits]: (max, sum); max = NaN flags a NaN in the slice
  int64_t slice;
};

// A NaN row (or the unreachable selection failure): ids -1 and NaN logprobs in all k slots; in
// split mode the slice's (max, sum) = (NaN, 0) instead, which the merge turns into the same.
__device__ __forceinline__ void poison(bool split, int t, int k, int32_t* out_ids, float* out_lp, float2* ms) {
  if (split) {
    if (t == 0) *ms = make_float2(__int_as_float(0x7fffffff), 0.0f);
    return;
  }
  for (int i = t; i < k; i += kThreads) {
    out_ids[i] = -1;
    out_lp[i] = __int_as_float(0x7fffffff);
  }
}

template <bool SPLIT>
__global__ void __launch_bounds__(kThreads, 1)
    topk_kernel(const uint16_t* __restrict__ logits, int32_t* __restrict__ ids, float* __restrict__ logprobs,
                int64_t vocab, int k, SplitWs ws) {
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
  const int64_t lo = SPLIT ? static_cast<int64_t>(blockIdx.y) * ws.slice : 0;
  const int64_t n = SPLIT ? min(ws.slice, vocab - lo) : vocab;
  const uint16_t* row = logits + r * vocab + lo;
  const int64_t wrow = SPLIT ? r * gridDim.y + blockIdx.y : 0;  // workspace row of this CTA
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
  for_each_tile(row, n, [&](int64_t, const uint32_t* v, int cnt) {
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
    poison(SPLIT, t, k, out_ids, out_lp, ws.ms + wrow);
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
  for_each_tile(row, n, [&](int64_t, const uint32_t* v, int cnt) {
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
  if (hb < 0 || lb < 0) {  // unreachable for 1 <= k <= n without NaN; never read out of bounds
    poison(SPLIT, t, k, out_ids, out_lp, ws.ms + wrow);
    return;
  }
  const uint32_t thr = (static_cast<uint32_t>(hb) << 8) | static_cast<uint32_t>(lb);
  const uint32_t n_gt = above1 + sel_above2;            // elements with key > thr, < k
  const uint32_t need_eq = static_cast<uint32_t>(k) - n_gt;  // >= 1 of the key == thr ones

  // Pass 3: collect the candidates.
  for_each_tile(row, n, [&](int64_t first, const uint32_t* v, int cnt) {
    first += lo;
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

  // Rank sort of the k candidates by (key desc, id asc); (key, id) pairs are distinct. Split
  // mode writes the slice's sorted list (the merge takes heads of sorted lists) and its partials.
  if (t < k) {
    const uint32_t key = cand_key[t];
    const int32_t id = cand_id[t];
    int rank = 0;
    for (int j = 0; j < k; ++j) {
      const uint32_t kj = cand_key[j];
      rank += (kj > key || (kj == key && cand_id[j] < id)) ? 1 : 0;
    }
    if constexpr (SPLIT) {
      ws.key[wrow * k + rank] = key;
      ws.id[wrow * k + rank] = id;
    } else {
      out_ids[rank] = id;
      out_lp[rank] = bf16_bits_to_float(bits_of_key(key)) - lse;
    }
  }
  if constexpr (SPLIT) {
    if (t == 0) ws.ms[wrow] = make_float2(m, s);
  }
}

// Merge of the split kernel's partials, one warp per row (splits <= 32: lane l owns slice l).
// logsumexp = M + log(sum_l s_l exp(m_l - M)), M = max_l m_l, reduced with a fixed shuffle tree
// (a NaN slice poisons the row as in the single-CTA kernel); then k rounds of a warp arg-max over
// the heads of the slices' sorted lists by (key desc, id asc): the winner's lane advances.
constexpr int kMergeThreads = 32;

__global__ void __launch_bounds__(kMergeThreads)
    topk_merge_kernel(int32_t* __restrict__ ids, float* __restrict__ logprobs, int k, int splits, SplitWs ws) {
  const int64_t r = blockIdx.x;
  const int l = threadIdx.x;
  int32_t* out_ids = ids + r * k;
  float* out_lp = logprobs + r * k;
  const bool live = l < splits;
  const float2 p = live ? ws.ms[r * splits + l] : make_float2(-INFINITY, 0.0f);
  int nan = live && isnan(p.x);
  float m = nan ? -INFINITY : p.x;
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) {
    nan |= __shfl_xor_sync(0xffffffffu, nan, off);
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  }
  if (nan) {
    for (int i = l; i < k; i += kMergeThreads) {
      out_ids[i] = -1;
      out_lp[i] = __int_as_float(0x7fffffff);
    }
    return;
  }
  float sum = live ? p.y * __expf(p.x - m) : 0.0f;
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  const float lse = m + logf(sum);
  const uint32_t* key = ws.key + (r * splits + l) * k;
  const int32_t* id = ws.id + (r * splits + l) * k;
  int head = 0;
  for (int i = 0; i < k; ++i) {
    // (valid, key, -id) of this lane's head, as one 64-bit value: larger is better. Ids are
    // >= 0 and < 2^31, so -id fits the low 32 bits as (2^31 - 1 - id).
    const bool has = live && head < k;
    uint64_t v = has ? (uint64_t{1} << 63) | (static_cast<uint64_t>(key[head]) << 31) |
                           static_cast<uint64_t>(0x7fffffffu - static_cast<uint32_t>(id[head]))
                     : 0;
    uint64_t best = v;
#pragma unroll
    for (int off = 16; off >= 1; off >>= 1) {
      const uint64_t o = __shfl_xor_sync(0xffffffffu, best, off);
      best = o > best ? o : best;
    }
    if (has && v == best) {  // exactly one lane: (key, id) pairs are distinct
      out_ids[i] = id[head];
      out_lp[i] = bf16_bits_to_float(bits_of_key(key[head])) - lse;
      ++head;
    }
  }
}

// Splits for a call: enough CTAs to cover the SMs about twice, slices of at least kMinSlice and
// at least k elements, at most DK_TOPK_MAX_SPLITS; 1 when the workspace is too small or k is too
// large for the merge's rank sort.
constexpr int64_t kMinSlice = 4096;

int64_t choose_splits(const DkTopkLogprobsParams* p, int sms) {
  if (p->workspace == 0 || p->k > DK_TOPK_SPLIT_MAX_K) return 1;
  static_assert(DK_TOPK_MAX_SPLITS <= 32, "the merge keeps one slice per lane");
  int64_t s = dk::ceil_div(static_cast<int64_t>(2 * sms), p->rows);
  const int64_t by_len = p->vocab / (kMinSlice > p->k ? kMinSlice : p->k);
  if (s > by_len) s = by_len;
  if (s > DK_TOPK_MAX_SPLITS) s = DK_TOPK_MAX_SPLITS;
  while (s > 1) {
    const int64_t slice = dk::ceil_div(p->vocab, s);
    const int64_t last = p->vocab - (s - 1) * slice;
    if (last >= p->k && dk_topk_workspace_bytes(p->rows, s, p->k) <= p->workspace_bytes) break;
    --s;
  }
  return s < 1 ? 1 : s;
}

}  // namespace

extern "C" int64_t dk_topk_workspace_bytes(int64_t rows, int64_t splits, int64_t k) {
  // key u32 + id i32 per candidate, then (max, sum) per (row, split), each region 16-byte aligned.
  const int64_t cand = dk::ceil_div(rows * splits * k * 4, static_cast<int64_t>(16)) * 16;
  return 2 * cand + rows * splits * 8;
}

extern "C" dk_status dk_sample_topk_logprobs(const DkTopkLogprobsParams* p, dk_stream_t stream) {
  if (p == nullptr || p->rows < 0 || p->vocab <= 0 || p->vocab > INT32_MAX) return DK_ERR_INVALID_ARGUMENT;
  if (p->k < 1 || p->k > kMaxK || p->k > p->vocab) return DK_ERR_INVALID_ARGUMENT;
  if (p->rows == 0) return DK_OK;
  if (p->rows > 0x7fffffff || p->logits == 0 || p->ids == 0 || p->logprobs == 0) return DK_ERR_INVALID_ARGUMENT;
  if (p->logits % 2 != 0 || p->ids % 4 != 0 || p->logprobs % 4 != 0) return DK_ERR_INVALID_ARGUMENT;
  if (p->workspace != 0 && (p->workspace % 16 != 0 || p->workspace_bytes < 0)) return DK_ERR_INVALID_ARGUMENT;
  int dev = 0, sms = 132;
  if (cudaGetDevice(&dev) == cudaSuccess) cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  const int64_t splits = choose_splits(p, sms);
  const auto* logits = reinterpret_cast<const uint16_t*>(p->logits);
  auto* ids = reinterpret_cast<int32_t*>(p->ids);
  auto* lp = reinterpret_cast<float*>(p->logprobs);
  const int k = static_cast<int>(p->k);
  if (splits <= 1) {
    topk_kernel<false><<<static_cast<unsigned>(p->rows), kThreads, 0, stream>>>(logits, ids, lp, p->vocab, k,
                                                                                 SplitWs{});
    return dk::launch_status();
  }
  SplitWs ws{};
  const int64_t cand = dk::ceil_div(p->rows * splits * p->k * 4, static_cast<int64_t>(16)) * 16;
  ws.key = reinterpret_cast<uint32_t*>(p->workspace);
  ws.id = reinterpret_cast<int32_t*>(p->workspace + cand);
  ws.ms = reinterpret_cast<float2*>(p->workspace + 2 * cand);
  ws.slice = dk::ceil_div(p->vocab, splits);
  const dim3 grid(static_cast<unsigned>(p->rows), static_cast<unsigned>(splits));
  topk_kernel<true><<<grid, kThreads, 0, stream>>>(logits, ids, lp, p->vocab, k, ws);
  const dk_status st = dk::launch_status();
  if (st != DK_OK) return st;
  topk_merge_kernel<<<static_cast<unsigned>(p->rows), kMergeThreads, 0, stream>>>(ids, lp, k,
                                                                                  static_cast<int>(splits), ws);
  return dk::launch_status();
}
