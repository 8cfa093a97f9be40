// mem.l2_prefetch: ask the memory system to bring a byte range into L2, and return at once.
//
// Why: a batch-1 decode step alternates DRAM-bound weight GEMMs with short latency-bound kernels
// (norms, conv1d.update, gdr.decode, attention) during which DRAM idles. The engine launches this
// on a side stream right after a GEMM, for the next GEMM's weight, so the idle time fills L2 with
// bytes the next GEMM would otherwise wait for (see docs/benchmarks/NOTES.md, session 5).
//
// Modes (DkL2PrefetchParams.mode):
//   0  cp.async.bulk.prefetch.L2 (sm_90: the copy engine fetches 32 KB pieces; no register, no
//      shared memory, nothing to wait for: the CTA exits while the fetches run)
//   1  mode 0 with an L2 evict_last cache hint (the lines outlive a streaming GEMM's own reads)
//   2  prefetch.global.L2::evict_last per 128-byte line (any arch; one instruction per line)
// Below sm_90 modes 0 / 1 run as mode 2. The range needs no alignment: it is widened to whole
// 16-byte units inside [ptr, ptr + bytes) (a partial unit at either end is skipped: a hint only).
// Nothing is written; the result is only a cache state.
#include "../common/launch.cuh"

namespace {

constexpr int kThreads = 32;
constexpr int64_t kPiece = 32 * 1024;  // bytes per bulk prefetch instruction
constexpr int64_t kLine = 128;

__global__ void __launch_bounds__(kThreads) l2_prefetch_kernel(uint64_t lo, uint64_t hi, int mode) {
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t nthreads = static_cast<int64_t>(gridDim.x) * kThreads;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (mode != 2) {
    uint64_t policy = 0;
    if (mode == 1) asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
    for (uint64_t a = lo + static_cast<uint64_t>(tid) * kPiece; a < hi; a += static_cast<uint64_t>(nthreads) * kPiece) {
      const uint32_t n = static_cast<uint32_t>(hi - a < static_cast<uint64_t>(kPiece) ? hi - a : kPiece);
      if (mode == 1) {
        asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;" ::"l"(a), "r"(n), "l"(policy)
                     : "memory");
      } else {
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a), "r"(n) : "memory");
      }
    }
    return;
  }
#endif
  (void)mode;
  for (uint64_t a = lo + static_cast<uint64_t>(tid) * kLine; a < hi; a += static_cast<uint64_t>(nthreads) * kLine) {
    asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(a) : "memory");
  }
}

}  // namespace

extern "C" dk_status dk_mem_l2_prefetch(const DkL2PrefetchParams* p, dk_stream_t stream) {
  if (p == nullptr || p->bytes < 0 || p->mode < 0 || p->mode > 2 || p->ctas <= 0 || p->ctas > 1024)
    return DK_ERR_INVALID_ARGUMENT;
  if (p->bytes == 0) return DK_OK;
  if (p->ptr == 0) return DK_ERR_INVALID_ARGUMENT;
  const uint64_t lo = (p->ptr + 15) & ~uint64_t{15};
  const uint64_t hi = (p->ptr + static_cast<uint64_t>(p->bytes)) & ~uint64_t{15};
  if (hi <= lo) return DK_OK;
  const int64_t unit = p->mode == 2 ? kLine * kThreads : kPiece * kThreads;
  const int64_t need = dk::ceil_div(static_cast<int64_t>(hi - lo), unit);
  const int grid = static_cast<int>(need < p->ctas ? need : p->ctas);
  l2_prefetch_kernel<<<grid, kThreads, 0, stream>>>(lo, hi, p->mode);
  return dk::launch_status();
}
