/* smoke.* : the pipeline smoke ops (issue 2). Included by deltakit.h. */
#ifndef DELTAKIT_SMOKE_H
#define DELTAKIT_SMOKE_H

/** smoke.axpy params: y[i] = bf16(alpha * x[i] + y[i]) for i < n; x, y bf16 [n], contiguous. */
typedef struct DkAxpyParams {
  /** const bf16 [n] */
  uint64_t x;
  /** bf16 [n], updated in place */
  uint64_t y;
  int64_t n;
  float alpha;
} DkAxpyParams;

/** smoke.axpy (CUDA C++). Returns DK_ERR_INVALID_ARGUMENT for n < 0 or a null pointer with n > 0. */
dk_status dk_smoke_axpy_bf16(const DkAxpyParams *p, dk_stream_t stream);

#endif
