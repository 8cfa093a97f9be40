// norm.rms_gated with a forced configuration for tools/bench_anchors_gdr.py --streaming: cfg 0 = the library's
// dispatch, 1 = z prefetched in pass 1 (PREZ, csrc/norm/common.cuh), 2 = the generic kernel (16 lanes per row,
// the dispatch before rms_gated_d128_kernel), 3 / 4 / 5 / 6 = rms_gated_d128_kernel with U = 1 / 2 / 4 / 8 rows per
// lane group (d = 128 only). Also exports the library's own dk_norm_rms_gated. Built into
// .gpu-gdr/libdk_gdr_bench.so by tools/tune/gdr_bundle.sh; not part of the library.
#include "../../csrc/norm/rms_gated.cu"

extern "C" dk_status dk_tune_norm_rms_gated_cfg(const DkRmsNormGatedParams* p, int cfg, dk_stream_t stream) {
  if (p == nullptr || cfg < 0 || cfg > 6) return DK_ERR_INVALID_ARGUMENT;
  if (cfg == 0) return dk_norm_rms_gated(p, stream);
  dk_norm::Args a{};
  a.x = reinterpret_cast<const __nv_bfloat16*>(p->x);
  a.z = reinterpret_cast<const __nv_bfloat16*>(p->z);
  a.w = reinterpret_cast<const __nv_bfloat16*>(p->w);
  a.out = reinterpret_cast<__nv_bfloat16*>(p->out);
  a.rows = p->rows;
  a.d = p->d;
  a.eps = p->eps;
  a.z_heads = p->z_token_stride == 0 ? 1 : p->z_heads;
  a.z_token_stride = p->z_token_stride == 0 ? p->d : p->z_token_stride;
  auto* s = static_cast<cudaStream_t>(stream);
  if (cfg == 1) return dk_norm::launch<dk_norm::kGated, true>(a, s);
  if (cfg == 2) return dk_norm::launch<dk_norm::kGated>(a, s, false);
  if (a.d != 128 || a.rows < 1) return DK_ERR_UNSUPPORTED;  // the d128 kernel, unvalidated otherwise
  if (cfg == 3) return dk_norm::launch_gated_d128<1>(a, s);
  if (cfg == 4) return dk_norm::launch_gated_d128<2>(a, s);
  if (cfg == 5) return dk_norm::launch_gated_d128<4>(a, s);
  return dk_norm::launch_gated_d128<8>(a, s);
}
