/* deltakit C ABI: the one header bindgen reads.
 *
 * Every launcher takes a plain-data params struct (device pointers as raw addresses, sizes and
 * strides as int64) by const pointer plus a stream, enqueues its work and returns a dk_status.
 * Launchers never throw, abort or synchronize; they reject configurations they do not support with
 * a status. The stream type is CUDA's `struct CUstream_st *` (CUstream == cudaStream_t), declared
 * here opaquely so the header needs no CUDA include.
 */
#ifndef DELTAKIT_H
#define DELTAKIT_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CUstream_st *dk_stream_t;

/** Status returned by every launcher. */
typedef enum dk_status {
  DK_OK = 0,
  /** An argument is outside what the kernel supports (size, alignment, null pointer). */
  DK_ERR_INVALID_ARGUMENT = 1,
  /** The configuration is valid but has no compiled specialization (dtype, head dim, arch). */
  DK_ERR_UNSUPPORTED = 2,
  /** The CUDA runtime or driver reported an error while launching or loading. */
  DK_ERR_CUDA = 3,
  /** No kernel image in this build matches the device's compute capability. */
  DK_ERR_NO_KERNEL_IMAGE = 4
} dk_status;

/** Last CUDA error code seen by a launcher that returned DK_ERR_CUDA on this thread (0 if none). */
int dk_last_cuda_error(void);

#include "smoke.h"
#include "gdr.h"
#include "conv1d.h"
#include "norm.h"
#include "mlp.h"
#include "attn.h"
#include "sample.h"
#include "init.h"

#ifdef __cplusplus
}
#endif

#endif /* DELTAKIT_H */
