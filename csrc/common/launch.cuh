// Shared launcher helpers: status mapping and the thread-local last CUDA error.
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../include/deltakit.h"

namespace dk {

// Records `e` as this thread's last CUDA error (read back with dk_last_cuda_error).
void set_last_cuda_error(int e);

// Whether the device image of this library that runs on device `dev` was compiled with the sm_90a
// features (see csrc/common/status.cu): the sm_90a-only kernels' launchers check it and return
// DK_ERR_NO_KERNEL_IMAGE otherwise, since an sm_90 image has their bodies compiled out. Cached.
bool sm90a_image(int dev);

// Maps the launch result of the kernel just enqueued to a status.
inline dk_status launch_status() {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    set_last_cuda_error(static_cast<int>(e));
    return DK_ERR_CUDA;
  }
  return DK_OK;
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Whether the diagnostic environment switch `name` is on: set to exactly "1" (any other value, or unset, is off).
// Call sites read it once per process: `static const bool on = dk::env_flag("DELTAKIT_...");`.
inline bool env_flag(const char* name) {
  const char* e = getenv(name);
  return e != nullptr && strcmp(e, "1") == 0;
}

// Launches `kernel<<<grid, block, smem, s>>>(args...)` as a programmatic dependent of the work before
// it on `s` (PDL, cudaLaunchAttributeProgrammaticStreamSerialization: it may start while that work
// drains and orders itself with griddepcontrol.wait); also valid inside CUDA graph capture.
template <typename... Params, typename... Args>
inline cudaError_t launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                              Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, args...);
}

// Measurement aids (the kernels' per-block timelines): copies the first min(n, total) uint64
// words of the __device__ array `symbol` (`total` words long) to `host`, zeroes the whole array
// and waits for the device. `symbol` is the array itself (as for cudaGetSymbolAddress), so this
// header function is instantiated in the translation unit that defines it.
inline dk_status read_and_clear_device_words(const void* symbol, int64_t total, uint64_t* host,
                                              int64_t n) {
  if (host == nullptr || n < 0) return DK_ERR_INVALID_ARGUMENT;
  const int64_t words = n < total ? n : total;
  void* dev = nullptr;
  cudaError_t e = cudaGetSymbolAddress(&dev, symbol);
  if (e == cudaSuccess && words > 0) {
    e = cudaMemcpy(host, dev, size_t(words) * 8, cudaMemcpyDeviceToHost);
  }
  if (e == cudaSuccess) e = cudaMemset(dev, 0, size_t(total) * 8);
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    set_last_cuda_error(static_cast<int>(e));
    return DK_ERR_CUDA;
  }
  return DK_OK;
}

}  // namespace dk
