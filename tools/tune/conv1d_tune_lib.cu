// conv1d.prefill with a forced output-kernel configuration, for the same-process harness
// (tools/bench_anchors_gdr.py --streaming): dk_tune_conv1d_prefill_cfg(params, cfg, stream), cfg as
// csrc/conv1d/prefill.cu's Cfg (0 = the library's dispatch, 1 = scalar, 2/3/4 = 8 channels x 8/16/32
// tokens per thread, 5 = 8 x 8 with the reference's multiply + add taps, 6 / 7 = 4 channels x 8 / 16, 8 =
// 8 x 4, 9 = 4 x 8 reference taps, 10 / 11 = 4 x 8 / 4 x 16 and 12 / 13 = 8 x 8 / 8 x 16 with the channel-block-fastest
// 1-D grid). Also exports the library's own dk_conv1d_prefill. Not part of the library build; built into .gpu-gdr/libdk_gdr_bench.so by tools/tune/gdr_bundle.sh.
#include "../../csrc/conv1d/prefill.cu"

extern "C" dk_status dk_tune_conv1d_prefill_cfg(const DkConv1dPrefillParams* p, int cfg, dk_stream_t stream) {
  return prefill_cfg(p, stream, cfg);
}
