// Tuning sweep for gdr.decode tile configurations (not part of the library build: build.rs only
// compiles csrc/). Build: nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a
//   -Icsrc/include -o gdr_decode_tune tools/tune/gdr_decode_tune.cu csrc/common/status.cu
// Run on the GPU host: ./gdr_decode_tune  -> one line per (shape, batch, T, config): us, GB/s of
// state traffic (H_v*K*V*4 bytes read + written per row), and the max |diff| of out/state against
// the first configuration. Slots rotate through a large pool so each launch is L2-cold.
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cmath>

#include "../../csrc/gdr/decode.cu"

using namespace gdr_decode_impl;

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e_), __LINE__); exit(1);} } while (0)

typedef dk_status (*LaunchFn)(const Args&, bool, cudaStream_t);
struct Cfg { const char* name; LaunchFn fn; };


int main() {
  const int K = 128, V = 128;
  Cfg cfgs[] = {
      {"bv32_nw4", launch_cfg<128, 128, 32, 4>},
      {"bv16_nw1", launch_cfg<128, 128, 16, 1>},
      {"bv16_nw1_ld2", launch_cfg<128, 128, 16, 1, 2>},
      {"bv32_nw2", launch_cfg<128, 128, 32, 2>},
      {"bv32_nw2_ld1", launch_cfg<128, 128, 32, 2, 1>},
      {"bv32_nw2_ld2", launch_cfg<128, 128, 32, 2, 2>},
      {"bv64_nw2", launch_cfg<128, 128, 64, 2>},
      {"bv64_nw2_ld1", launch_cfg<128, 128, 64, 2, 1>},
      {"bv64_nw2_ld2", launch_cfg<128, 128, 64, 2, 2>},
      {"bv64_nw2_ld3", launch_cfg<128, 128, 64, 2, 3>},
      {"bv64_nw2_st1", launch_cfg<128, 128, 64, 2, 0, 1>},
      {"bv64_nw2_ld1_st1", launch_cfg<128, 128, 64, 2, 1, 1>},
      {"bv64_nw4", launch_cfg<128, 128, 64, 4>},
      {"bv64_nw4_ld2", launch_cfg<128, 128, 64, 4, 2>},
      {"bv128_nw4", launch_cfg<128, 128, 128, 4>},
      {"bv128_nw4_ld2", launch_cfg<128, 128, 128, 4, 2>},
      {"bv128_nw8_ld2", launch_cfg<128, 128, 128, 8, 2>},
      {"bv32_nw4_ld2", launch_cfg<128, 128, 32, 4, 2>},
      {"bv32_nw4_ld2_m4", launch_cfg<128, 128, 32, 4, 2, 0, 4>},
  };
  const int ncfg = sizeof(cfgs) / sizeof(cfgs[0]);
  struct Shape { int hk, hv; } shapes[] = {{16, 48}, {8, 24}};
  const int batches[] = {1, 16, 64, 256};
  const int ts[] = {1, 4};
  cudaStream_t stream;
  CK(cudaStreamCreate(&stream));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (auto sh : shapes) {
    const int64_t per_slot = (int64_t)sh.hv * K * V;
    const int64_t pool = 1024;  // 3 GiB at 16/48: every launch streams cold slots
    float* state;
    CK(cudaMalloc(&state, pool * per_slot * 4));
    {
      std::vector<float> h(per_slot * 8);
      for (size_t i = 0; i < h.size(); ++i) h[i] = (float)((i * 2654435761u) % 2001) / 1000.f - 1.f;
      for (int64_t s = 0; s < pool; s += 8) CK(cudaMemcpy(state + s * per_slot, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
    }
    float* state_ref;
    CK(cudaMalloc(&state_ref, 256 * per_slot * 4));
    for (int T : ts) {
      for (int B : batches) {
        if (T > 1 && B > 64) continue;
        const int64_t rows = (int64_t)B * T;
        std::vector<__nv_bfloat16> hq(rows * sh.hk * K), hv_(rows * sh.hv * V), hab(rows * sh.hv);
        for (size_t i = 0; i < hq.size(); ++i) hq[i] = __float2bfloat16((float)((i * 7919) % 201) / 100.f - 1.f);
        for (size_t i = 0; i < hv_.size(); ++i) hv_[i] = __float2bfloat16((float)((i * 104729) % 201) / 100.f - 1.f);
        for (size_t i = 0; i < hab.size(); ++i) hab[i] = __float2bfloat16((float)((i * 31) % 41) / 10.f - 2.f);
        __nv_bfloat16 *q, *k, *v, *a, *b, *out, *out_ref;
        float *alog, *dtb;
        int32_t* slots;
        CK(cudaMalloc(&q, hq.size() * 2)); CK(cudaMalloc(&k, hq.size() * 2)); CK(cudaMalloc(&v, hv_.size() * 2));
        CK(cudaMalloc(&a, hab.size() * 2)); CK(cudaMalloc(&b, hab.size() * 2));
        CK(cudaMalloc(&out, hv_.size() * 2)); CK(cudaMalloc(&out_ref, hv_.size() * 2));
        CK(cudaMalloc(&alog, sh.hv * 4)); CK(cudaMalloc(&dtb, sh.hv * 4));
        CK(cudaMalloc(&slots, (pool + B) * 4));
        CK(cudaMemcpy(q, hq.data(), hq.size() * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(k, hq.data(), hq.size() * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(v, hv_.data(), hv_.size() * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(a, hab.data(), hab.size() * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(b, hab.data(), hab.size() * 2, cudaMemcpyHostToDevice));
        std::vector<float> hal(sh.hv, -0.5f), hdt(sh.hv, 0.25f);
        CK(cudaMemcpy(alog, hal.data(), sh.hv * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dtb, hdt.data(), sh.hv * 4, cudaMemcpyHostToDevice));
        std::vector<int32_t> hs(pool + B);
        for (int64_t i = 0; i < pool + B; ++i) hs[i] = (int32_t)((i * 389) % pool);  // 389 coprime to 1024
        CK(cudaMemcpy(slots, hs.data(), hs.size() * 4, cudaMemcpyHostToDevice));
        Args args{};
        args.q = q; args.k = k; args.v = v; args.a = a; args.b = b; args.a_log = alog; args.dt_bias = dtb;
        args.state = state; args.out = out; args.n = B; args.t = T; args.h_k = sh.hk; args.h_v = sh.hv;
        args.num_slots = pool; args.q_stride = sh.hk * K; args.k_stride = sh.hk * K; args.v_stride = sh.hv * V;
        args.ab_stride = sh.hv; args.scale = 1.f / sqrtf((float)K);
        std::vector<float> st_first(B * per_slot), st_cur(B * per_slot);
        std::vector<__nv_bfloat16> o_first(hv_.size()), o_cur(hv_.size());
        for (int c = 0; c < ncfg; ++c) {
          // correctness vs config 0: same initial states (copy of slots 0.. via fixed set)
          args.slots = slots;  // slots hs[0..B]
          if (c == 0) {
            for (int r = 0; r < B; ++r) CK(cudaMemcpy(state_ref + (int64_t)r * per_slot, state + (int64_t)hs[r] * per_slot, per_slot * 4, cudaMemcpyDeviceToDevice));
          } else {
            for (int r = 0; r < B; ++r) CK(cudaMemcpy(state + (int64_t)hs[r] * per_slot, state_ref + (int64_t)r * per_slot, per_slot * 4, cudaMemcpyDeviceToDevice));
          }
          if (cfgs[c].fn(args, true, stream) != DK_OK) { printf("launch failed %s\n", cfgs[c].name); exit(1); }
          CK(cudaStreamSynchronize(stream));
          for (int r = 0; r < B; ++r) CK(cudaMemcpy(st_cur.data() + (int64_t)r * per_slot, state + (int64_t)hs[r] * per_slot, per_slot * 4, cudaMemcpyDeviceToHost));
          CK(cudaMemcpy(o_cur.data(), out, o_cur.size() * 2, cudaMemcpyDeviceToHost));
          double dmax_s = 0, dmax_o = 0;
          if (c == 0) { st_first = st_cur; o_first = o_cur; }
          else {
            for (size_t i = 0; i < st_cur.size(); ++i) dmax_s = fmax(dmax_s, fabs(st_cur[i] - st_first[i]));
            for (size_t i = 0; i < o_cur.size(); ++i) dmax_o = fmax(dmax_o, fabs(__bfloat162float(o_cur[i]) - __bfloat162float(o_first[i])));
          }
          // restore the state so the next config starts from the same initial state
          for (int r = 0; r < B; ++r) CK(cudaMemcpy(state + (int64_t)hs[r] * per_slot, state_ref + (int64_t)r * per_slot, per_slot * 4, cudaMemcpyDeviceToDevice));
          // timing: rotate the slot window through the pool
          const int iters = 50;
          for (int w = 0; w < 5; ++w) { args.slots = slots + (w * B) % pool; cfgs[c].fn(args, true, stream); }
          CK(cudaEventRecord(e0, stream));
          for (int it = 0; it < iters; ++it) { args.slots = slots + ((it + 5) * (int64_t)B) % pool; cfgs[c].fn(args, true, stream); }
          CK(cudaEventRecord(e1, stream));
          CK(cudaEventSynchronize(e1));
          float ms;
          CK(cudaEventElapsedTime(&ms, e0, e1));
          const double us = ms * 1000.0 / iters;
          const double bytes = 2.0 * B * per_slot * 4;
          printf("hk=%d hv=%d B=%d T=%d %-10s %9.2f us %8.1f GB/s  maxdiff out %.3g state %.3g\n", sh.hk, sh.hv, B, T,
                 cfgs[c].name, us, bytes / us / 1e3, dmax_o, dmax_s);
          // restore again for the next config
          for (int r = 0; r < B; ++r) CK(cudaMemcpy(state + (int64_t)hs[r] * per_slot, state_ref + (int64_t)r * per_slot, per_slot * 4, cudaMemcpyDeviceToDevice));
        }
        cudaFree(q); cudaFree(k); cudaFree(v); cudaFree(a); cudaFree(b); cudaFree(out); cudaFree(out_ref);
        cudaFree(alog); cudaFree(dtb); cudaFree(slots);
      }
    }
    cudaFree(state); cudaFree(state_ref);
  }
  CK(cudaGetLastError());
  printf("done\n");
  return 0;
}
