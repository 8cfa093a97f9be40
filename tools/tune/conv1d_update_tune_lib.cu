// conv1d.update with a forced configuration (cfg as csrc/conv1d/update.cu's Cfg: 0 = the library's
// dispatch, 1 = scalar thread per channel, 2 = 8 channels per thread), for tools/bench_anchors_gdr.py
// --streaming. Also exports the library's own dk_conv1d_update. Built into .gpu-gdr/libdk_gdr_bench.so by
// tools/tune/gdr_bundle.sh; not part of the library build.
#include "../../csrc/conv1d/update.cu"

extern "C" dk_status dk_tune_conv1d_update_cfg(const DkConv1dUpdateParams* p, int cfg, dk_stream_t stream) {
  return update_cfg(p, stream, cfg);
}
