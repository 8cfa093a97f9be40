/* conv1d.* : causal depthwise conv1d + SiLU of the GDR layers. Included by deltakit.h. */
#ifndef DELTAKIT_CONV1D_H
#define DELTAKIT_CONV1D_H

/** conv1d.prefill params: varlen causal depthwise conv1d + SiLU with per-sequence conv state.
 *
 * out[t, c] = silu(bias[c] + sum_{w<W} weight[c, w] * xe[t - (W-1) + w]) where xe is the
 * sequence's input preceded by its W-1 history inputs (the slot's conv state, or zeros when
 * has_initial_state[i] == 0). Afterwards the slot holds the last W-1 inputs of history + sequence
 * (oldest first). Sequence i is tokens cu_seqlens[i] .. cu_seqlens[i+1]; slots[i] == -1 (or any
 * value outside [0, num_slots)) = padding: zero output, state untouched. Live slots distinct.
 * Layouts: x bf16 [T, conv_dim] (token stride x_stride >= conv_dim); out bf16 [T, conv_dim]
 * contiguous; weight bf16 [conv_dim, W]; bias bf16 [conv_dim] or 0; cu_seqlens i32 [N+1] (0 ..
 * T, non-decreasing); slots i32 [N]; has_initial_state u8 [N] or 0 (= all 1);
 * conv_state bf16 [num_slots, conv_dim, W-1]. W in 2..=4.
 * Two kernels on the stream: outputs (reads the old state only), then the final states (each
 * (sequence, channel) reads its old history and writes its new one in the same thread). */
typedef struct DkConv1dPrefillParams {
  uint64_t x;
  uint64_t weight;
  uint64_t bias;
  uint64_t cu_seqlens;
  uint64_t slots;
  uint64_t has_initial_state;
  uint64_t conv_state;
  uint64_t out;
  int64_t num_tokens;
  int64_t num_seqs;
  int64_t conv_dim;
  int64_t width;
  int64_t num_slots;
  int64_t x_stride;
} DkConv1dPrefillParams;

/** conv1d.prefill (CUDA C++). The kernels never read cu_seqlens values outside [0, num_tokens]
 * as token indices (they are clamped); callers must still pass valid cu_seqlens. */
dk_status dk_conv1d_prefill(const DkConv1dPrefillParams *p, dk_stream_t stream);

/** conv1d.update params: decode step of N rows with S >= 1 new tokens each.
 * x bf16 [N*S, conv_dim] (token stride x_stride >= conv_dim); out bf16 [N*S, conv_dim]
 * contiguous; weight, bias, conv_state as for prefill; slots i32 [N] (-1 or out of range =
 * padding: zero output, state untouched). */
typedef struct DkConv1dUpdateParams {
  uint64_t x;
  uint64_t weight;
  uint64_t bias;
  uint64_t slots;
  uint64_t conv_state;
  uint64_t out;
  int64_t n;
  int64_t s;
  int64_t conv_dim;
  int64_t width;
  int64_t num_slots;
  int64_t x_stride;
} DkConv1dUpdateParams;

/** conv1d.update (CUDA C++). */
dk_status dk_conv1d_update(const DkConv1dUpdateParams *p, dk_stream_t stream);

#endif
