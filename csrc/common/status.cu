// Thread-local record of the last CUDA error a launcher saw (for Error::Launch on the Rust side).
#include "launch.cuh"

namespace {
thread_local int g_last_cuda_error = 0;
}

namespace dk {
void set_last_cuda_error(int e) { g_last_cuda_error = e; }
}  // namespace dk

// Also used by the C runtime of the Triton launchers (triton_aot/runtime).
extern "C" void dk_record_cuda_error(int e) { g_last_cuda_error = e; }

extern "C" int dk_last_cuda_error(void) { return g_last_cuda_error; }
