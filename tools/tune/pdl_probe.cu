// Probe (standalone; not part of the library): what a kernel boundary costs inside a CUDA graph on
// this GPU, with and without programmatic dependent launch (PDL), and how fast a plain streaming
// kernel reads a decode GEMM's weight bytes in such a chain. A chain of N dependent kernels is
// captured into a graph; replay time / N = per-kernel cost.
// Build: .toolchain/cuda/bin/nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -o pdl_probe \
//          tools/tune/pdl_probe.cu -L.toolchain/cuda/lib -lcudart_static   (run on the GPU host)
#include <cstdio>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); return 1; } } while (0)

template <bool PDL>
__global__ void tiny(float* p, int n) {
  if (PDL) asm volatile("griddepcontrol.wait;" ::: "memory");
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] += 1.0f;
  if (PDL) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// A memory-bound kernel (reads `bytes`), like a small GEMM's weight stream.
template <bool PDL>
__global__ void stream_read(const float4* w, size_t n4, float* out) {
  if (PDL) asm volatile("griddepcontrol.wait;" ::: "memory");
  float acc = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4; i += (size_t)gridDim.x * blockDim.x) {
    float4 v = __ldcs(w + i);
    acc += v.x + v.y + v.z + v.w;
  }
  if (acc == 12345.f) out[0] = acc;
  if (PDL) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

template <bool PDL, typename K, typename... A>
cudaError_t launch(K k, int grid, int block, cudaStream_t s, A... a) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid; cfg.blockDim = block; cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr; cfg.numAttrs = PDL ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, k, a...);
}

template <bool PDL>
float run(cudaStream_t s, float* p, const float4* w, float* out, int n, int grid, int mix, size_t wbytes) {
  cudaGraph_t g; cudaGraphExec_t ge;
  cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
  for (int i = 0; i < n; i++) {
    if (mix && i % mix == 0) launch<PDL>(stream_read<PDL>, 132 * 4, 512, s, w, wbytes / 16, out);
    else launch<PDL>(tiny<PDL>, grid, 128, s, p, grid * 128);
  }
  cudaStreamEndCapture(s, &g);
  cudaGraphInstantiate(&ge, g, 0);
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  for (int w0 = 0; w0 < 3; w0++) cudaGraphLaunch(ge, s);
  cudaEventRecord(a, s);
  const int reps = 20;
  for (int r = 0; r < reps; r++) cudaGraphLaunch(ge, s);
  cudaEventRecord(b, s);
  cudaEventSynchronize(b);
  float ms; cudaEventElapsedTime(&ms, a, b);
  cudaGraphExecDestroy(ge); cudaGraphDestroy(g);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) printf("error %s\n", cudaGetErrorString(e));
  return ms * 1e3f / reps;
}

int main() {
  cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  float *p, *out; float4* w;
  size_t wbytes = 32u << 20;
  CK(cudaMalloc(&p, 132 * 128 * 4)); CK(cudaMemset(p, 0, 132 * 128 * 4));
  CK(cudaMalloc(&out, 4));
  CK(cudaMalloc(&w, 256u << 20)); CK(cudaMemset(w, 0, 256u << 20));
  const int n = 256;
  printf("| chain | plain us/kernel | PDL us/kernel |\n|---|---|---|\n");
  for (int grid : {1, 32, 132}) {
    float t0 = run<false>(s, p, w, out, n, grid, 0, wbytes), t1 = run<true>(s, p, w, out, n, grid, 0, wbytes);
    printf("| %d tiny kernels, grid %d | %.2f | %.2f |\n", n, grid, t0 / n, t1 / n);
  }
  for (size_t mb : {32, 100}) {
    wbytes = mb << 20;
    // 1 streaming kernel (reading mb MiB) + 3 tiny kernels, repeated: time per group
    float t0 = run<false>(s, p, w, out, n, 1, 4, wbytes), t1 = run<true>(s, p, w, out, n, 1, 4, wbytes);
    float ts = run<false>(s, p, w, out, n / 4, 1, 1, wbytes);  // streaming kernels alone
    printf("| read %zu MiB + 3 tiny (per group) | %.2f | %.2f | (read alone %.2f us = %.2f TB/s)\n", mb, t0 / (n / 4), t1 / (n / 4),
           ts / (n / 4), (double)wbytes / (ts / (n / 4)) / 1e6);
  }
  return 0;
}
