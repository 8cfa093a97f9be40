/* Runtime for the generated Triton AOT launchers: loads a kernel's cubin once per CUDA context
 * (picking the image that matches the context's device) and caches the CUfunction per context.
 * Driver entry points come from the CUDA runtime (cudaGetDriverEntryPointByVersion), so nothing
 * links against libcuda at build time. */
#ifndef DK_TRITON_RUNTIME_H
#define DK_TRITON_RUNTIME_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "deltakit.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Most CUDA contexts one kernel can be loaded into at once (one per GPU in a TP process). */
#define DK_TR_MAX_CONTEXTS 64

/** One compiled image of a kernel for one architecture. */
typedef struct dk_tr_image {
  int sm;                    /* compute capability major*10+minor, e.g. 90 */
  int arch_specific;         /* 1 for an `a` target (sm_90a): runs only on exactly `sm` */
  const char *symbol;        /* kernel symbol inside the cubin */
  const unsigned char *data; /* cubin bytes */
  size_t size;
  unsigned shared;           /* dynamic shared memory bytes */
  unsigned num_warps;        /* block = 32 * num_warps threads */
} dk_tr_image;

typedef struct dk_tr_slot {
  unsigned long long ctx_id; /* cuCtxGetId: unique for the process lifetime (handles get reused) */
  void *ctx;  /* CUcontext */
  void *mod;  /* CUmodule */
  void *func; /* CUfunction */
  const dk_tr_image *image;
} dk_tr_slot;

/** A kernel specialization with its per-context cache. Zero-initialize `cache`, `num_cached`.
 * The cache is keyed by context id, so a context destroyed and replaced by a new one at the same
 * handle value never reuses a stale module. When full it overwrites round-robin (`next`): a live
 * context that loses its entry just loads the module again. */
typedef struct dk_tr_kernel {
  const char *name; /* specialization name, for diagnostics */
  const dk_tr_image *images;
  int num_images;
  pthread_mutex_t lock;
  int num_cached;
  int next;
  dk_tr_slot cache[DK_TR_MAX_CONTEXTS];
} dk_tr_kernel;

/** Launch `k` on `stream` (CUstream) with a grid; `args` holds one pointer per kernel parameter,
 * hidden scratch parameters included. Loads the module into the stream's context on first use. */
dk_status dk_tr_launch(dk_tr_kernel *k, dk_stream_t stream, uint32_t gx, uint32_t gy, uint32_t gz,
                       void **args);

#ifdef __cplusplus
}
#endif

#endif
