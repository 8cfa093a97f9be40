// Minimal two-role shared-memory hand-off under compute-sanitizer racecheck (issue 15: do the fused prefill's /
// the sm90 state pass's reported hazards come from the tool's model of split arrive / wait barriers?).
// Warps 4-7 write a 64 x 64 f32 tile of stage c % 2, then signal; warps 0-3 wait, read the tile, then release it.
// mode 0: named barriers, producer bar.arrive FULL / consumer bar.sync FULL, consumer bar.arrive EMPTY / producer
//         bar.sync EMPTY (the fused kernel's hand-off);
// mode 1: the same with bar.sync on every side (variant 9's FULL);
// mode 2: mbarrier arrive / try_wait.parity on both barriers (the sm90 state pass's pattern without cp.async);
// mode 3: __syncthreads between the phases (no overlap; the control).
// Build: nvcc -arch=sm_90a -O2 -o racecheck_probe tools/tune/racecheck_probe.cu
// Run:   compute-sanitizer --tool racecheck ./racecheck_probe <mode>   (prints the checksum; expected 0 hazards)
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

__device__ __forceinline__ void bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id, int n) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void mbar_init(unsigned long long* b, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"((unsigned)__cvta_generic_to_shared(b)), "r"(count)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned long long* b) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}" ::"r"(
                   (unsigned)__cvta_generic_to_shared(b))
               : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned long long* b, unsigned parity) {
  asm volatile(
      "{\n.reg .pred p;\nW:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra W;\n}" ::"r"(
          (unsigned)__cvta_generic_to_shared(b)),
      "r"(parity)
      : "memory");
}

__global__ void probe(int mode, int chunks, float* out) {
  __shared__ float tile[2][64 * 64];
  __shared__ unsigned long long full[2], empty[2];
  const int tid = threadIdx.x, warp = tid >> 5;
  if (tid == 0) {
    for (int i = 0; i < 2; ++i) {
      mbar_init(&full[i], 128);
      mbar_init(&empty[i], 128);
    }
  }
  __syncthreads();
  float acc = 0.f;
  for (int c = 0; c < chunks; ++c) {
    const int st = c & 1;
    if (mode == 3) {
      if (warp >= 4)
        for (int i = tid - 128; i < 4096; i += 128) tile[st][i] = float(c * 4096 + i);
      __syncthreads();
      if (warp < 4)
        for (int i = tid; i < 4096; i += 128) acc += tile[st][(i * 7) & 4095];
      __syncthreads();
      continue;
    }
    if (warp >= 4) {  // producer
      if (c >= 2) {
        if (mode == 2) mbar_wait(&empty[st], ((c >> 1) - 1) & 1);
        else bar_sync(3 + st, 256);
      }
      for (int i = tid - 128; i < 4096; i += 128) tile[st][i] = float(c * 4096 + i);
      if (mode == 0) bar_arrive(1 + st, 256);
      else if (mode == 1) bar_sync(1 + st, 256);
      else mbar_arrive(&full[st]);
    } else {  // consumer
      if (mode == 2) mbar_wait(&full[st], (c >> 1) & 1);
      else bar_sync(1 + st, 256);
      for (int i = tid; i < 4096; i += 128) acc += tile[st][(i * 7) & 4095];  // other threads' elements
      if (c + 2 < chunks) {
        if (mode == 2) mbar_arrive(&empty[st]);
        else bar_arrive(3 + st, 256);
      }
    }
  }
  if (warp < 4) atomicAdd(out, acc);
}

int main(int argc, char** argv) {
  const int mode = argc > 1 ? atoi(argv[1]) : 0;
  const int chunks = 8;
  float* d = nullptr;
  cudaMalloc(&d, sizeof(float));
  cudaMemset(d, 0, sizeof(float));
  probe<<<2, 256>>>(mode, chunks, d);
  float h = 0.f;
  const cudaError_t e = cudaMemcpy(&h, d, sizeof(float), cudaMemcpyDeviceToHost);
  double ref = 0.0;  // 2 CTAs x sum over chunks and elements
  for (int c = 0; c < chunks; ++c)
    for (int i = 0; i < 4096; ++i) ref += 2.0 * double(c * 4096 + ((i * 7) & 4095));
  printf("mode %d: %s checksum %.6e (expected %.6e)\n", mode, cudaGetErrorString(e), double(h), ref);
  return e == cudaSuccess ? 0 : 1;
}
