/* gdr.chunk_prefill split pipeline, sm_90a: the chunk-local pass on wgmma (csrc/gdr/chunk_local_wgmma_sm90.cu; variant
 * bit 131072 of dk_gdr_chunk_prefill_split_sm90, session 9; with bits 262144 | 524288 | 1048576 in the default
 * 2060497, session 10). Declared here for the split
 * pipeline's launchers, not through bindgen. */
#ifndef DELTAKIT_GDR_CHUNK_LOCAL_WGMMA_SM90_H
#define DELTAKIT_GDR_CHUNK_LOCAL_WGMMA_SM90_H
#include <cuda_runtime.h>

#include "chunk_prefill_fused_sm90.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Enqueues the local pass of the split pipeline on `stream`: grid (ws->nt, H_k), 128 threads, one CTA per (chunk id,
 * key head) looping over that key head's H_v / H_k value heads; writes the same 26,880-byte stage image per (chunk id,
 * value head) as split_local_kernel (Tb hi / lo, P bf16 [64][64] 128-byte-swizzled rows, then the f32 [9][64] vectors)
 * into ws->img. K K^T and Q K^T are SS-wgmma m64n64k16 (once per key head); (I + A)^-1 is a 2 x 2 blocked inverse of
 * 32 x 32 blocks over 16 x 16 diagonal inverses (products as bf16 hi / lo triples, ~2^-16 relative, as the mma.sync
 * pass); decay factors with MUFU exp (variant bit 1). p->variant bit 262144 (session 10, 487633): the kernel's
 * session-10 form (factored decays below the diagonal blocks, gating on warps 2-3, Tb by 32-row items; same image up
 * to f32 rounding of the decays); with it, bit 524288 (1011921): the epilogue -> diagonal-inverse hand-off by a warp
 * barrier; bit 1048576 (1536209): the image copied out by TMA bulk copies (thread 0), not the threads' stores; both
 * (2060497): the library default since session 10. Session 11 (on 2060497 / 4157649 only): bit 4194304 the key norms
 * from diag(K K^T) of the wgmma accumulators and the query norms from diag(Q Q^T) per warp on mma.sync (instead of a
 * pass over the tiles), the first wgmma step with scale-d 0; bit 8388608 the 16 x 16 diagonal inverses row-oriented
 * (float4 A-row loads, one column per lane). Preconditions as dk_gdr_chunk_prefill_split_sm90 (checked there:
 * K = 128, workspace regions, alignments). Returns DK_ERR_CUDA (dk_last_cuda_error) if the launch fails. */
dk_status dk_gdr_split_local_wgmma_sm90(const DkGdrPrefillFusedParams *p, const DkGdrPrefillSplitWs *ws,
                                        cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
