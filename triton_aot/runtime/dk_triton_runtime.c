/* See dk_triton_runtime.h. Plain C11; compiled by the host C compiler through the cc crate. */
#include "dk_triton_runtime.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <string.h>

typedef CUresult (*pfn_cuStreamGetCtx)(CUstream, CUcontext *);
typedef CUresult (*pfn_cuCtxGetCurrent)(CUcontext *);
typedef CUresult (*pfn_cuCtxGetId)(CUcontext, unsigned long long *);
typedef CUresult (*pfn_cuCtxPushCurrent)(CUcontext);
typedef CUresult (*pfn_cuCtxPopCurrent)(CUcontext *);
typedef CUresult (*pfn_cuCtxGetDevice)(CUdevice *);
typedef CUresult (*pfn_cuDeviceGetAttribute)(int *, CUdevice_attribute, CUdevice);
typedef CUresult (*pfn_cuModuleLoadData)(CUmodule *, const void *);
typedef CUresult (*pfn_cuModuleGetFunction)(CUfunction *, CUmodule, const char *);
typedef CUresult (*pfn_cuFuncSetAttribute)(CUfunction, CUfunction_attribute, int);
typedef CUresult (*pfn_cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                                       unsigned, unsigned, CUstream, void **, void **);

static struct {
  pfn_cuStreamGetCtx stream_get_ctx;
  pfn_cuCtxGetCurrent ctx_get_current;
  pfn_cuCtxGetId ctx_get_id;
  pfn_cuCtxPushCurrent ctx_push;
  pfn_cuCtxPopCurrent ctx_pop;
  pfn_cuCtxGetDevice ctx_get_device;
  pfn_cuDeviceGetAttribute device_get_attribute;
  pfn_cuModuleLoadData module_load_data;
  pfn_cuModuleGetFunction module_get_function;
  pfn_cuFuncSetAttribute func_set_attribute;
  pfn_cuLaunchKernel launch_kernel;
  int status; /* 0 = ok, else the cudaError_t / CUresult that failed */
} g_drv;
static pthread_once_t g_drv_once = PTHREAD_ONCE_INIT;

static int load_one(const char *sym, void **out) {
  enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSuccess;
  cudaError_t e = cudaGetDriverEntryPointByVersion(sym, out, 12000, cudaEnableDefault, &q);
  if (e != cudaSuccess) return (int)e;
  if (q != cudaDriverEntryPointSuccess || *out == NULL) return (int)cudaErrorSymbolNotFound;
  return 0;
}

static void drv_init(void) {
  int s = 0;
  if (!s) s = load_one("cuStreamGetCtx", (void **)&g_drv.stream_get_ctx);
  if (!s) s = load_one("cuCtxGetCurrent", (void **)&g_drv.ctx_get_current);
  if (!s) s = load_one("cuCtxGetId", (void **)&g_drv.ctx_get_id);
  if (!s) s = load_one("cuCtxPushCurrent", (void **)&g_drv.ctx_push);
  if (!s) s = load_one("cuCtxPopCurrent", (void **)&g_drv.ctx_pop);
  if (!s) s = load_one("cuCtxGetDevice", (void **)&g_drv.ctx_get_device);
  if (!s) s = load_one("cuDeviceGetAttribute", (void **)&g_drv.device_get_attribute);
  if (!s) s = load_one("cuModuleLoadData", (void **)&g_drv.module_load_data);
  if (!s) s = load_one("cuModuleGetFunction", (void **)&g_drv.module_get_function);
  if (!s) s = load_one("cuFuncSetAttribute", (void **)&g_drv.func_set_attribute);
  if (!s) s = load_one("cuLaunchKernel", (void **)&g_drv.launch_kernel);
  g_drv.status = s;
}

/* Records a CUDA error for dk_last_cuda_error (defined in csrc/common/status.cu). */
extern void dk_record_cuda_error(int e);

static dk_status fail(int e) {
  dk_record_cuda_error(e);
  return DK_ERR_CUDA;
}

static const dk_tr_image *pick_image(const dk_tr_kernel *k, int sm) {
  const dk_tr_image *best = NULL;
  for (int i = 0; i < k->num_images; ++i) {
    const dk_tr_image *im = &k->images[i];
    if (im->sm == sm) return im;
    /* A non-arch-specific cubin runs on later minors of the same major. */
    if (!im->arch_specific && im->sm / 10 == sm / 10 && im->sm < sm && (!best || im->sm > best->sm))
      best = im;
  }
  return best;
}

/* Loads k into ctx (which the caller made current). Caller holds k->lock. */
static dk_status load_into(dk_tr_kernel *k, CUcontext ctx, unsigned long long ctx_id, dk_tr_slot **out) {
  CUdevice dev;
  CUresult r = g_drv.ctx_get_device(&dev);
  if (r != CUDA_SUCCESS) return fail((int)r);
  int major = 0, minor = 0;
  if ((r = g_drv.device_get_attribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)))
    return fail((int)r);
  if ((r = g_drv.device_get_attribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)))
    return fail((int)r);
  const dk_tr_image *im = pick_image(k, major * 10 + minor);
  if (!im) return DK_ERR_NO_KERNEL_IMAGE;
  CUmodule mod;
  if ((r = g_drv.module_load_data(&mod, im->data))) return fail((int)r);
  CUfunction fn;
  if ((r = g_drv.module_get_function(&fn, mod, im->symbol))) return fail((int)r);
  if (im->shared > 48 * 1024) {
    r = g_drv.func_set_attribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)im->shared);
    if (r) return fail((int)r);
  }
  dk_tr_slot *slot;
  if (k->num_cached < DK_TR_MAX_CONTEXTS) {
    slot = &k->cache[k->num_cached++];
  } else {
    slot = &k->cache[k->next];
    k->next = (k->next + 1) % DK_TR_MAX_CONTEXTS;
  }
  slot->ctx_id = ctx_id;
  slot->ctx = ctx;
  slot->mod = mod;
  slot->func = fn;
  slot->image = im;
  *out = slot;
  return DK_OK;
}

dk_status dk_tr_launch(dk_tr_kernel *k, dk_stream_t stream, uint32_t gx, uint32_t gy, uint32_t gz,
                       void **args) {
  pthread_once(&g_drv_once, drv_init);
  if (g_drv.status) return fail(g_drv.status);
  if (gx == 0 || gy == 0 || gz == 0) return DK_OK; /* empty grid: nothing to do */
  CUstream s = (CUstream)stream;
  CUcontext ctx = NULL, cur = NULL;
  CUresult r = g_drv.stream_get_ctx(s, &ctx);
  if (r) return fail((int)r);
  if ((r = g_drv.ctx_get_current(&cur))) return fail((int)r);
  int pushed = 0;
  if (cur != ctx) {
    if ((r = g_drv.ctx_push(ctx))) return fail((int)r);
    pushed = 1;
  }
  dk_status st = DK_OK;
  unsigned long long ctx_id = 0;
  if ((r = g_drv.ctx_get_id(ctx, &ctx_id))) st = fail((int)r);
  dk_tr_slot *slot = NULL;
  CUfunction fn = NULL;
  const dk_tr_image *im = NULL;
  if (st == DK_OK) {
    pthread_mutex_lock(&k->lock);
    for (int i = 0; i < k->num_cached; ++i) {
      if (k->cache[i].ctx_id == ctx_id) {
        slot = &k->cache[i];
        break;
      }
    }
    if (!slot) st = load_into(k, ctx, ctx_id, &slot);
    if (st == DK_OK) { /* copy under the lock: the slot may be recycled once it is released */
      fn = (CUfunction)slot->func;
      im = slot->image;
    }
    pthread_mutex_unlock(&k->lock);
  }
  if (st == DK_OK) {
    r = g_drv.launch_kernel(fn, gx, gy, gz, 32u * im->num_warps, 1, 1, im->shared, s, args, NULL);
    if (r) st = fail((int)r);
  }
  if (pushed) {
    CUcontext popped;
    g_drv.ctx_pop(&popped);
  }
  return st;
}
