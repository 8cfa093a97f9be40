/* init.* : device-side initialisation (issue 13). Included by deltakit.h. */
#ifndef DELTAKIT_INIT_H
#define DELTAKIT_INIT_H

/** Distribution of init.dummy (definition: deltakit_ref::init; the kernel computes the same bits).
 * x is the unit variate of element index i drawn from splitmix64(seed, tensor_id, i). */
typedef enum DkInitDist {
  /** every element = offset (no hash drawn) */
  DK_INIT_CONSTANT = 0,
  /** fma(scale, x, offset), x uniform in [-1, 1) on a 24-bit grid */
  DK_INIT_UNIFORM = 1,
  /** fma(scale, x, offset), x Irwin-Hall of four 16-bit uniforms scaled to mean 0, std 1 */
  DK_INIT_NORMAL = 2,
  /** ln(fma(scale, x, offset)) with x uniform and a fixed-operation f32 ln; needs
   * offset - |scale| >= FLT_MIN */
  DK_INIT_LOG_UNIFORM = 3
} DkInitDist;

/** init.dummy params: out[r, c] = bf16(value(base + r * ld + c)) for r < rows, c < cols, where
 * value(i) is a pure function of (seed, tensor_id, dist, scale, offset, i): element i of the full
 * (unsharded) tensor, so a shard written with its base / ld equals the slice of the whole.
 * out bf16 [rows, cols] contiguous (2-byte aligned; 16-byte aligned rows take 16-byte stores).
 * Indices are int64: rows, cols >= 0, base >= 0, ld >= cols when rows > 1, and
 * base + (rows - 1) * ld + cols <= INT64_MAX. */
typedef struct DkInitDummyParams {
  /** bf16 [rows, cols] */
  uint64_t out;
  int64_t rows;
  int64_t cols;
  /** full-tensor index of out[0, 0] */
  int64_t base;
  /** full-tensor index distance between rows */
  int64_t ld;
  uint64_t seed;
  uint64_t tensor_id;
  /** a DkInitDist value */
  int32_t dist;
  float scale;
  float offset;
} DkInitDummyParams;

/** init.dummy (CUDA C++, csrc/init/dummy.cu). DK_ERR_INVALID_ARGUMENT for a null / misaligned
 * out with elements to write, negative sizes, overlapping rows, an index past INT64_MAX, an
 * unknown dist, non-finite scale / offset, values that would overflow f32, or a LogUniform range
 * reaching below FLT_MIN. Writes nothing on error. */
dk_status dk_init_dummy(const DkInitDummyParams *p, dk_stream_t stream);

#endif
