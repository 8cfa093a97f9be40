// Thread-local record of the last CUDA error a launcher saw (for Error::Launch on the Rust side).
#include <atomic>

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

// Never launched: its static shared memory exists only in an sm_90a device image (compiled with
// the 9.0 architecture-specific features), so cudaFuncGetAttributes on it tells whether the image
// the runtime picked for this library on the current device is one (an sm_90 or lower-arch SASS,
// or a JIT of lower-arch PTX, compiles the sm_90a kernel bodies out). Every .cu of the library is
// built for the same DELTAKIT_CUDA_ARCHS, so the answer holds for all of them.
namespace {
constexpr int kProbeWords = 1024;  // 4 KB: far above the 1 KB a driver may reserve per block
__global__ void sm90a_probe_kernel(int* out) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __shared__ int mark[kProbeWords];
  mark[threadIdx.x % kProbeWords] = int(threadIdx.x);
  __syncthreads();
  out[threadIdx.x] = mark[(threadIdx.x + 1) % kProbeWords];
#endif
}
}  // namespace

namespace dk {
bool sm90a_image(int dev) {
  static std::atomic<int> state[64];  // 0 unknown, 1 sm_90a image, 2 none (zero-initialized)
  if (dev < 0 || dev >= 64) return false;
  if (state[dev].load(std::memory_order_acquire) == 0) {
    cudaFuncAttributes attr;
    if (cudaFuncGetAttributes(&attr, sm90a_probe_kernel) != cudaSuccess) {
      (void)cudaGetLastError();
      state[dev] = 2;
    } else {
      state[dev] = attr.binaryVersion == 90 && attr.sharedSizeBytes >= kProbeWords * sizeof(int) ? 1 : 2;
    }
  }
  return state[dev].load(std::memory_order_acquire) == 1;
}
}  // namespace dk
