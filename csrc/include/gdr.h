/* gdr.* : gated delta rule kernels (CUDA C++ part). Included by deltakit.h. */
#ifndef DELTAKIT_GDR_H
#define DELTAKIT_GDR_H

/** gdr.decode params: recurrent gated-delta-rule decode over N rows of T >= 1 tokens each.
 *
 * Row i continues the sequence whose state lives in slot slots[i]; its T tokens are rows
 * i*T .. i*T+T-1 of the token-major inputs and are processed in order (state carried; T > 1 is
 * speculative verification). slots[i] == -1 (or any value outside [0, num_slots)) is a padding
 * row: zero output, no state read or written. Live slots must be distinct (not checked here).
 *
 * Per token and value head hv (key head hv / (h_v / h_k)), all in f32:
 *   g = -exp(a_log[hv]) * softplus(a + dt_bias[hv]) (torch softplus, threshold 20),
 *   beta = sigmoid(b), q,k optionally L2-normalised (x * rsqrt(sum x^2 + 1e-6)), q *= scale,
 *   S *= exp(g); delta = beta * (v - S^T k); S += k (x) delta; o = S^T q.
 * Layouts (element strides; the last dim of every tensor is contiguous):
 *   q, k  bf16 [N*T, h_k, k_dim], token stride q_stride / k_stride (>= h_k*k_dim);
 *   v     bf16 [N*T, h_v, v_dim], token stride v_stride (>= h_v*v_dim);
 *   a, b  bf16 [N*T, h_v], token stride ab_stride (>= h_v) — a and b share it;
 *   a_log, dt_bias f32 [h_v]; slots i32 [N];
 *   state f32 [num_slots, h_v, k_dim, v_dim] (v contiguous), updated in place;
 *   out   bf16 [N*T, h_v, v_dim], contiguous.
 * g = -inf or NaN (exp(a_log) overflowing, times a softplus that underflowed) and g <= -64 decay
 * the state fully (factor 0).
 * Supported: k_dim in {16, 32, 64, 128}, v_dim in {16, 32, 64, 128}; h_v % h_k == 0; q, k, v, state, out 16-byte aligned (a, b,
 * a_log, dt_bias, slots naturally aligned); q/k/v token strides multiples of 8 elements, ab_stride
 * any. */
typedef struct DkGdrDecodeParams {
  uint64_t q;
  uint64_t k;
  uint64_t v;
  uint64_t a;
  uint64_t b;
  uint64_t a_log;
  uint64_t dt_bias;
  uint64_t slots;
  uint64_t state;
  uint64_t out;
  int64_t n;
  int64_t t;
  int64_t h_k;
  int64_t h_v;
  int64_t k_dim;
  int64_t v_dim;
  int64_t num_slots;
  int64_t q_stride;
  int64_t k_stride;
  int64_t v_stride;
  int64_t ab_stride;
  /** Multiplier applied to q after the optional L2 norm (K^-0.5 for Qwen3.5). */
  float scale;
  /** Non-zero: L2-normalise q and k over k_dim. */
  int32_t use_qk_l2norm;
} DkGdrDecodeParams;

/** gdr.decode (CUDA C++). DK_ERR_INVALID_ARGUMENT for negative sizes, null or misaligned pointers,
 * bad strides or h_v % h_k != 0; DK_ERR_UNSUPPORTED for head dims outside those. */
dk_status dk_gdr_decode(const DkGdrDecodeParams *p, dk_stream_t stream);

#endif
