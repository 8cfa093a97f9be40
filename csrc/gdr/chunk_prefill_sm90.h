/* gdr.chunk_prefill for sm_90a (csrc/gdr/chunk_prefill_sm90.cu), first piece: the state pass as a
 * persistent warp-specialized CUDA kernel. Opt-in in the library (DELTAKIT_GDR_PREFILL=sm90,
 * src/ops/gdr/chunk_prefill.rs; declared there, not in deltakit.h / bindgen); also called by the harness
 * (tools/bench_anchors_gdr.py) through .gpu-gdr/libdk_gdr_bench.so. */
#ifndef DELTAKIT_GDR_CHUNK_PREFILL_SM90_H
#define DELTAKIT_GDR_CHUNK_PREFILL_SM90_H
#include "../include/deltakit.h"

#ifdef __cplusplus
extern "C" {
#endif

/** State pass of gdr.chunk_prefill (W-split workspace), K = V = 128, as gdr_chunk_state_kernel of
 * triton_aot/gdr/chunk_prefill.py with WSPLIT = 1: k bf16 [T, H_k, K] (token stride k_stride), w bf16
 * [T, H_v, 2, K] (hi / lo planes), u f32 [T, H_v, V] (U in, D out), gcum f32 [T, H_v], h bf16
 * [NT, H_v, K, V] (out), state f32 [num_slots, H_v, K, V] (in place), cu_seqlens i32 [N + 1], slots i32
 * [N], init i32 [N] (init_mode 2), coff i32 [N + 1] (first chunk id of each sequence). init_mode: 0 zeros,
 * 1 from slots, 2 per-sequence flags. */
typedef struct DkGdrStateSm90Params {
  uint64_t k, w, u, gcum, h, state, cu_seqlens, slots, init, coff;
  int64_t num_tokens, num_seqs, num_slots, h_k, h_v, k_dim, v_dim, k_stride;
  int32_t use_l2, init_mode;
} DkGdrStateSm90Params;

/** Launches the state pass on `stream`. Nothing enqueued on an error: DK_ERR_UNSUPPORTED on a device that is not
 * compute capability 9.0 or for K, V != 128; DK_ERR_NO_KERNEL_IMAGE when this build has no sm_90a image of the
 * kernel for the device (DELTAKIT_CUDA_ARCHS without 90a: the sm_90 / lower-arch bodies are compiled out). */
dk_status dk_gdr_chunk_state_sm90(const DkGdrStateSm90Params *p, dk_stream_t stream);
/** Every check dk_gdr_chunk_state_sm90 makes before it enqueues, without launching (same statuses; DK_OK = the
 * launch can only fail in the CUDA launch itself): lets a caller pick another pipeline before enqueuing anything. */
dk_status dk_gdr_chunk_state_sm90_check(const DkGdrStateSm90Params *p);
/** The same with a kernel variant (harness): 0 = dk_gdr_chunk_state_sm90 (U and gates read from global memory by
 * the consumer, the measured v0); 1 = U and gates copied into the ring by the producer a chunk ahead (compiled,
 * 0 spills, not yet run on a GPU); 2 = two consumer warpgroups per CTA sharing the W / K ring, one per 64 value
 * columns (grid (N, H_v, 1); not yet run on a GPU). */
dk_status dk_gdr_chunk_state_sm90_variant(const DkGdrStateSm90Params *p, int variant, dk_stream_t stream);

#ifdef __cplusplus
}
#endif
#endif
