// norm.rms_gated: gated RMSNorm per value head (HF Qwen3_5RMSNormGated), per row of d = V:
// n = bf16(x * rsqrt(mean(x^2) + eps)); y = bf16(w * n) (plain w); out = bf16(y * silu(z)).
// CPU twin: deltakit_ref::norm::rms_norm_gated. Layout and thread mapping: see common.cuh
// (rows = T * H_v; a warp per row for V <= 1024). z may be a strided column view of a merged
// projection (z_token_stride / z_heads below).
#include "common.cuh"

extern "C" dk_status dk_norm_rms_gated(const DkRmsNormGatedParams* p, dk_stream_t stream) {
  if (p == nullptr) return DK_ERR_INVALID_ARGUMENT;
  dk_norm::Args a{};
  a.x = reinterpret_cast<const __nv_bfloat16*>(p->x);
  a.z = reinterpret_cast<const __nv_bfloat16*>(p->z);
  a.w = reinterpret_cast<const __nv_bfloat16*>(p->w);
  a.out = reinterpret_cast<__nv_bfloat16*>(p->out);
  a.rows = p->rows;
  a.d = p->d;
  a.eps = p->eps;
  // z_token_stride 0: z is contiguous like x.
  a.z_heads = p->z_token_stride == 0 ? 1 : p->z_heads;
  a.z_token_stride = p->z_token_stride == 0 ? p->d : p->z_token_stride;
  return dk_norm::launch<dk_norm::kGated>(a, stream);
}
