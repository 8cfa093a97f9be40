// norm.rms and norm.fused_add_rms: zero-centred RMSNorm (HF Qwen3_5RMSNorm)
// out = bf16(x * rsqrt(mean(x^2) + eps) * (1 + w)), and the residual-add variant
// residual = bf16(residual + x); out = rms(residual). CPU twins: deltakit_ref::norm::{rms_norm,
// fused_add_rms_norm}. Layout and thread mapping: see common.cuh.
#include "common.cuh"

extern "C" dk_status dk_norm_rms(const DkRmsNormParams* p, dk_stream_t stream) {
  if (p == nullptr) return DK_ERR_INVALID_ARGUMENT;
  dk_norm::Args a{};
  a.x = reinterpret_cast<const __nv_bfloat16*>(p->x);
  a.w = reinterpret_cast<const __nv_bfloat16*>(p->w);
  a.out = reinterpret_cast<__nv_bfloat16*>(p->out);
  a.rows = p->rows;
  a.d = p->d;
  a.eps = p->eps;
  return dk_norm::launch<dk_norm::kRms>(a, stream);
}

extern "C" dk_status dk_norm_fused_add_rms(const DkRmsNormParams* p, dk_stream_t stream) {
  if (p == nullptr) return DK_ERR_INVALID_ARGUMENT;
  dk_norm::Args a{};
  a.x = reinterpret_cast<const __nv_bfloat16*>(p->x);
  a.residual = reinterpret_cast<__nv_bfloat16*>(p->residual);
  a.w = reinterpret_cast<const __nv_bfloat16*>(p->w);
  a.out = reinterpret_cast<__nv_bfloat16*>(p->out);
  a.rows = p->rows;
  a.d = p->d;
  a.eps = p->eps;
  return dk_norm::launch<dk_norm::kFusedAdd>(a, stream);
}
