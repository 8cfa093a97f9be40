/* norm.* : RMS norms of Qwen3.5. Included by deltakit.h. */
#ifndef DELTAKIT_NORM_H
#define DELTAKIT_NORM_H

/** norm.rms / norm.fused_add_rms params (zero-centred RMSNorm, HF Qwen3_5RMSNorm):
 *   rms:           out = bf16(x * rsqrt(mean(x^2) + eps) * (1 + w))            (f32 math)
 *   fused_add_rms: residual = bf16(residual + x) (in place); out = rms(residual)
 * x, out, residual bf16 [rows, d] contiguous; w bf16 [d]. residual is ignored by dk_norm_rms. */
typedef struct DkRmsNormParams {
  uint64_t x;
  uint64_t residual;
  uint64_t w;
  uint64_t out;
  int64_t rows;
  int64_t d;
  float eps;
} DkRmsNormParams;

/** norm.rms (CUDA C++). */
dk_status dk_norm_rms(const DkRmsNormParams *p, dk_stream_t stream);
/** norm.fused_add_rms (CUDA C++). */
dk_status dk_norm_fused_add_rms(const DkRmsNormParams *p, dk_stream_t stream);

/** norm.rms_gated params (HF Qwen3_5RMSNormGated), per row of d elements:
 *   n = bf16(x * rsqrt(mean(x^2) + eps)); y = bf16(w * n) (plain w); out = bf16(y * silu(z)).
 * x, z, out bf16 [rows, d] contiguous (rows = T * H_v, d = V); w bf16 [d]. */
typedef struct DkRmsNormGatedParams {
  uint64_t x;
  uint64_t z;
  uint64_t w;
  uint64_t out;
  int64_t rows;
  int64_t d;
  float eps;
  /** 0: z contiguous `[rows, d]`. Else z's token rows are `z_token_stride` elements apart, each
   *  holding `z_heads` rows of `d` (rows = T * z_heads): z as a column view of a merged
   *  projection. */
  int64_t z_token_stride;
  int64_t z_heads;
} DkRmsNormGatedParams;

/** norm.rms_gated (CUDA C++). */
dk_status dk_norm_rms_gated(const DkRmsNormGatedParams *p, dk_stream_t stream);

#endif
