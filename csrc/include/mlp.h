/* mlp.* and the elementwise pieces of the decoder: SwiGLU, embedding gather, output gate.
 * Included by deltakit.h. */
#ifndef DELTAKIT_MLP_H
#define DELTAKIT_MLP_H

/** mlp.silu_and_mul params (HF Qwen3_5MLP act_fn(gate) * up on a merged [gate | up] projection):
 *   out[t, i] = bf16(bf16(silu(x[t, i])) * x[t, inter + i])      (silu in f32)
 * x bf16 [rows, 2*inter] contiguous, out bf16 [rows, inter]. */
typedef struct DkSiluMulParams {
  uint64_t x;
  uint64_t out;
  int64_t rows;
  int64_t inter;
} DkSiluMulParams;

/** mlp.silu_and_mul (CUDA C++). */
dk_status dk_mlp_silu_and_mul(const DkSiluMulParams *p, dk_stream_t stream);

/** mlp.embedding params (torch.nn.Embedding): out[t] = table[ids[t]] (exact copy).
 * ids i32 [rows]; table bf16 [vocab, d]; out bf16 [rows, d]. An id outside 0..vocab writes a
 * row of NaN (loud, never a silent wrong row) and reads nothing. */
typedef struct DkEmbeddingParams {
  uint64_t ids;
  uint64_t table;
  uint64_t out;
  int64_t rows;
  int64_t vocab;
  int64_t d;
} DkEmbeddingParams;

/** mlp.embedding (CUDA C++). */
dk_status dk_mlp_embedding(const DkEmbeddingParams *p, dk_stream_t stream);

/** attn.output_gate params (HF Qwen3_5Attention: attn_output * sigmoid(gate)):
 *   out = bf16(attn * bf16(sigmoid(gate)))      (sigmoid in f32)
 * attn, out bf16 [rows, width] contiguous; gate bf16 rows of `width` with row stride
 * gate_stride elements (gate_stride = width when contiguous). out may alias attn. */
typedef struct DkOutputGateParams {
  uint64_t attn;
  uint64_t gate;
  uint64_t out;
  int64_t rows;
  int64_t width;
  int64_t gate_stride;
} DkOutputGateParams;

/** attn.output_gate (CUDA C++). */
dk_status dk_attn_output_gate(const DkOutputGateParams *p, dk_stream_t stream);

/** sample.argmax params: ids[r] = argmax_j logits[r, j] (ties -> lowest j; a row holding a NaN
 * gets -1). logits bf16 [rows, vocab] contiguous; ids i32 [rows]. One CTA per row. */
typedef struct DkArgmaxParams {
  uint64_t logits;
  uint64_t ids;
  int64_t rows;
  int64_t vocab;
} DkArgmaxParams;

/** sample.argmax (CUDA C++). */
dk_status dk_sample_argmax(const DkArgmaxParams *p, dk_stream_t stream);

#endif
