// Shared launcher helpers: status mapping and the thread-local last CUDA error.
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

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

}  // namespace dk
