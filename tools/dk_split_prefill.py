"""deltakit's default gdr.chunk_prefill on sm_90a (the split pipeline) from Python, through ctypes.

Shared by tools/gdr_anchor_accuracy.py and tools/bench_anchors_gdr.py (--dk-split-lib). The library is a .so of
csrc/gdr/chunk_prefill_fused_sm90.cu + chunk_local_wgmma_sm90.cu + csrc/common/status.cu built with build.rs's nvcc
flags (docs/benchmarks/2026-12-02-gdr-anchor-s10.md has the command); the launches are those of
src/ops/gdr/chunk_prefill.rs for the Split pipeline (DEFAULT_PIPELINE):
  1. the Triton kernels gdr_chunk_offsets / gdr_chunk_map of triton_aot/gdr/chunk_prefill.py, JIT-compiled with the
     manifest's constexprs / warps / stages (the source of the library's AOT cubins);
  2. dk_gdr_chunk_prefill_split_sm90(params, workspace regions, stream).
Workspace regions as the library's layout(): img = the per-chunk state region (nt H_v K V bf16), cp = the W and U
regions (lay.h - lay.w bytes: the context-parallel scratch), flags (the overlap variant's, zeroed by the call).
Gating precomputed (fused = 0: g log-space decay, beta f32 [T, H_v]), q/k L2 norm in the kernel, scale K^-0.5, the
initial state from the slots, the state pool f32 [P, H_v, K, V] updated in place. Requires torch (CUDA) and triton.
"""
import ctypes
import importlib.util
import re
import tomllib
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
CHUNK = 64  # src/ops/gdr/chunk_prefill.rs CHUNK
WS_ALIGN = 256  # src/ops/gdr/chunk_prefill.rs WS_ALIGN (region alignment; only the region sizes matter here)


def _library_default_variant() -> int:
    """The library default: `const SPLIT_VARIANT: i32 = ...;` of src/ops/gdr/chunk_prefill.rs (read, not copied)."""
    src = (ROOT / "src/ops/gdr/chunk_prefill.rs").read_text()
    m = re.search(r"const SPLIT_VARIANT: i32 = ([0-9_]+);", src)
    if m is None:
        raise RuntimeError("src/ops/gdr/chunk_prefill.rs: `const SPLIT_VARIANT: i32 = ...;` not found")
    return int(m.group(1).replace("_", ""))


SPLIT_VARIANT = _library_default_variant()  # src/ops/gdr/chunk_prefill.rs SPLIT_VARIANT (the library default)


class FusedParams(ctypes.Structure):
    """csrc/gdr/chunk_prefill_fused_sm90.h DkGdrPrefillFusedParams."""
    _fields_ = [(n, ctypes.c_uint64) for n in ("q", "k", "v", "g", "beta", "a", "b", "a_log", "dt_bias", "cu_seqlens",
                                               "slots", "init", "state", "out")] + \
        [(n, ctypes.c_int64) for n in ("num_tokens", "num_seqs", "num_slots", "h_k", "h_v", "k_dim", "v_dim",
                                       "q_stride", "k_stride", "v_stride", "ab_stride")] + \
        [("use_l2", ctypes.c_int32), ("init_mode", ctypes.c_int32), ("fused", ctypes.c_int32),
         ("scale", ctypes.c_float), ("variant", ctypes.c_int32)]


class SplitWs(ctypes.Structure):
    """csrc/gdr/chunk_prefill_fused_sm90.h DkGdrPrefillSplitWs."""
    _fields_ = [("coff", ctypes.c_uint64), ("cseq", ctypes.c_uint64), ("img", ctypes.c_uint64), ("nt", ctypes.c_int64),
                ("flags", ctypes.c_uint64), ("cp", ctypes.c_uint64), ("cp_bytes", ctypes.c_int64)]


def _al(b):
    return (b + WS_ALIGN - 1) // WS_ALIGN * WS_ALIGN


class DkSplitPrefill:
    """The split pipeline of one .so; make() binds one problem's buffers and returns the launch callable."""

    def __init__(self, path):
        self.lib = ctypes.CDLL(str(path))
        self.lib.dk_gdr_chunk_prefill_split_sm90.argtypes = [ctypes.POINTER(FusedParams), ctypes.POINTER(SplitWs),
                                                             ctypes.c_void_p]
        self.lib.dk_gdr_chunk_prefill_split_sm90_check.argtypes = [ctypes.POINTER(FusedParams)]
        spec = importlib.util.spec_from_file_location("dk_chunk_prefill", ROOT / "triton_aot/gdr/chunk_prefill.py")
        self.cp = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(self.cp)
        self.ents = {e["name"]: e for e in tomllib.loads((ROOT / "triton_aot/manifest.toml").read_text())["kernel"]}

    def _opt(self, nm):
        e = self.ents[nm]
        return dict(num_warps=e["num_warps"], num_stages=e["num_stages"], **e.get("constexprs", {}))

    def make(self, q, k, v, g, beta, cu32, slots, pool, out, h_k, h_v, variant=SPLIT_VARIANT):
        """q, k bf16 [T, H_k, 128]; v bf16 [T, H_v, 128]; g, beta f32 [T, H_v]; cu32 i32 [N + 1]; slots i32 [N];
        pool f32 [P, H_v, 128, 128] (in place); out bf16 [T, H_v, 128]. All contiguous on one CUDA device. Returns a
        callable that enqueues the pipeline on torch's current stream (buffers kept alive by it); raises on a
        status other than DK_OK (the _check first: a variant the dispatch does not have is refused here)."""
        kd = vd = 128
        t, n = q.shape[0], slots.shape[0]
        nt = t // CHUNK + n
        th = t * h_v
        dev = q.device
        coff = torch.empty(n + 1, device=dev, dtype=torch.int32)
        cseq = torch.empty(nt, device=dev, dtype=torch.int32)
        img = torch.empty(nt * h_v * kd * vd * 2, device=dev, dtype=torch.uint8)
        cp_bytes = _al(th * kd * 4) + _al(th * vd * 4)
        cpbuf = torch.empty(cp_bytes, device=dev, dtype=torch.uint8)
        flags = torch.zeros(nt * h_v + n * h_v * (vd // 64), device=dev, dtype=torch.int32)
        # a, b, a_log, dt_bias: unused with fused = 0 (any live address, as the library passes)
        prm = FusedParams(q.data_ptr(), k.data_ptr(), v.data_ptr(), g.data_ptr(), beta.data_ptr(), q.data_ptr(),
                          q.data_ptr(), g.data_ptr(), g.data_ptr(), cu32.data_ptr(), slots.data_ptr(), slots.data_ptr(),
                          pool.data_ptr(), out.data_ptr(), t, n, pool.shape[0], h_k, h_v, kd, vd, h_k * kd, h_k * kd,
                          h_v * vd, h_v, 1, 1, 0, kd ** -0.5, variant)
        ws = SplitWs(coff.data_ptr(), cseq.data_ptr(), img.data_ptr(), nt, flags.data_ptr(), cpbuf.data_ptr(), cp_bytes)
        st = self.lib.dk_gdr_chunk_prefill_split_sm90_check(ctypes.byref(prm))
        if st != 0:
            raise RuntimeError(f"dk_gdr_chunk_prefill_split_sm90_check variant {variant}: status {st}")
        iters = max(1, int(n).bit_length())
        oo, om = self._opt("gdr_chunk_offsets"), self._opt("gdr_chunk_map")
        cp, lib = self.cp, self.lib

        def call():
            cp.gdr_chunk_offsets_kernel[(1,)](cu32, coff, n, t, nt, **oo)
            cp.gdr_chunk_map_kernel[((nt + 127) // 128,)](coff, cseq, n, nt, iters, **om)
            st_ = lib.dk_gdr_chunk_prefill_split_sm90(ctypes.byref(prm), ctypes.byref(ws),
                                                      ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
            if st_ != 0:
                raise RuntimeError(f"dk_gdr_chunk_prefill_split_sm90 variant {variant}: status {st_}")
        call.keep = (coff, cseq, img, cpbuf, flags, prm, ws, q, k, v, g, beta, cu32, slots, pool, out)
        return call
