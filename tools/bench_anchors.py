#!/usr/bin/env python3
"""Anchor benchmarks: deltakit's criterion numbers next to the field's reference implementations.

Anchors: flash-linear-attention (FLA) for the GDR kernels, torch `scaled_dot_product_attention(is_causal=True,
enable_gqa=True)` for attention prefill, `torch.matmul` for the cuBLASLt linear layers.

Runs on the GPU host (torch + triton + fla-core==0.6.0 importable, e.g. after
`python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl`
and `export PYTHONPATH=/tmp/site`). Times FLA with triton.testing.do_bench (median), reads deltakit's
numbers from criterion (`<criterion dir>/<group>/<bench id>/new/estimates.json`, median point estimate in
ns), and prints one table per anchor library, `shape | deltakit | <anchor> | ratio` (ratio = deltakit
throughput / anchor throughput, > 1 means deltakit is faster). A missing number prints "-".

  python3 tools/bench_anchors.py --criterion-dir .gpu/root/target/criterion [--only prefill|decode|attn|gemm] [--budget-s 150]

To add a row: append an Anchor in anchors() (its deltakit criterion group/id, the anchor callable builder and
the throughput unit). Units: GDR prefill = nominal TFLOP/s (4*T*H_v*K*V / time); GDR decode = state GB/s
(read + write of the f32 state, 2*N*H_v*K*V*4 bytes / time); attention prefill = causal TFLOP/s
(2*2*H_q*T*T*hd/2 / time); GEMM = 2*M*N*K / time.
"""
import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional


@dataclass
class Anchor:
    kind: str  # "prefill" | "decode" | "attn" | "gemm"
    lib: str  # anchor library: "FLA" | "torch SDPA" | "torch.matmul"
    label: str  # table row
    group: str  # criterion group
    bench_id: str  # criterion bench id (may contain '/')
    work: float  # FLOPs (prefill) or bytes (decode) per call
    unit: str  # "TFLOP/s" or "GB/s"
    build: Callable[[], Optional[Callable[[], object]]]  # builds the anchor call


def _prefill_builder(hk, hv, n, length, kd=128, vd=128):
    def build():
        import torch
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        t = n * length
        dev = "cuda"
        # FLA 0.6.0 takes q/k with H_v heads (HF repeats the key heads before calling it).
        q = torch.randn(1, t, hk, kd, device=dev, dtype=torch.bfloat16).repeat_interleave(hv // hk, dim=2)
        k = torch.randn(1, t, hk, kd, device=dev, dtype=torch.bfloat16).repeat_interleave(hv // hk, dim=2)
        v = torch.randn(1, t, hv, vd, device=dev, dtype=torch.bfloat16)
        g = -torch.rand(1, t, hv, device=dev, dtype=torch.float32) * 0.5
        beta = torch.rand(1, t, hv, device=dev, dtype=torch.bfloat16)
        h0 = torch.zeros(n, hv, kd, vd, device=dev, dtype=torch.float32)
        cu = torch.arange(0, n + 1, device=dev, dtype=torch.long) * length
        return lambda: chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                              cu_seqlens=cu, use_qk_l2norm_in_kernel=True)
    return build


def _decode_builder(hk, hv, n, kd=128, vd=128):
    def build():
        import torch
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
        dev = "cuda"
        q = torch.randn(n, 1, hv, kd, device=dev, dtype=torch.bfloat16)
        k = torch.randn(n, 1, hv, kd, device=dev, dtype=torch.bfloat16)
        v = torch.randn(n, 1, hv, vd, device=dev, dtype=torch.bfloat16)
        g = -torch.rand(n, 1, hv, device=dev, dtype=torch.float32) * 0.5
        beta = torch.rand(n, 1, hv, device=dev, dtype=torch.bfloat16)
        h0 = torch.zeros(n, hv, kd, vd, device=dev, dtype=torch.float32)
        return lambda: fused_recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                                        use_qk_l2norm_in_kernel=True)
    return build


def _sdpa_builder(hq, hkv, t, hd):
    def build():
        import torch
        import torch.nn.functional as F
        dev = "cuda"
        q = torch.randn(1, hq, t, hd, device=dev, dtype=torch.bfloat16)
        k = torch.randn(1, hkv, t, hd, device=dev, dtype=torch.bfloat16)
        v = torch.randn(1, hkv, t, hd, device=dev, dtype=torch.bfloat16)
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    return build


def _matmul_builder(m, n, k):
    def build():
        import torch
        dev = "cuda"
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02
        return lambda: torch.matmul(x, w.t())
    return build


def anchors():
    rows = []
    for name, hk, hv, n, length in [("27b_tp1_16x48", 16, 48, 1, 8192), ("27b_tp2_8x24", 8, 24, 1, 8192),
                                    ("9b_16x32", 16, 32, 8, 8192), ("9b_16x32", 16, 32, 1, 65536)]:
        rows.append(Anchor("prefill", "FLA", f"chunk_prefill {name} {n}x{length}", "gdr_chunk_prefill", f"{name}/{n}x{length}",
                           4.0 * n * length * hv * 128 * 128, "TFLOP/s", _prefill_builder(hk, hv, n, length)))
    # gdr.decode (benches/gdr_decode.rs): group gdr_decode, ids <name>/batch<N>.
    for name, hk, hv in [("27b_tp1_16x48", 16, 48), ("27b_tp2_8x24", 8, 24)]:
        for n in (1, 16, 64, 256):
            rows.append(Anchor("decode", "FLA", f"decode {name} batch {n}", "gdr_decode", f"{name}/batch{n}",
                               2.0 * n * hv * 128 * 128 * 4, "GB/s", _decode_builder(hk, hv, n)))
    # attn.prefill (benches/attn.rs): group attn_prefill, ids <name>/<T>; hd 256, one causal sequence.
    # Protocols differ here (criterion: back-to-back calls; SDPA: do_bench, L2 flush + median); the
    # like-for-like attention ratios (both protocols) come from tools/bench_attn_anchors.py.
    for name, hq, hkv in [("27b_tp1", 24, 4), ("27b_tp2", 12, 2)]:
        for t in (2048, 8192):
            rows.append(Anchor("attn", "torch SDPA", f"attn prefill {name} {hq}/{hkv} T={t}", "attn_prefill",
                               f"{name}/{t}", 2.0 * hq * t * t * 256, "TFLOP/s", _sdpa_builder(hq, hkv, t, 256)))
    # gemm.linear (benches/gemm.rs): group gemm, ids <layer>/<M>; out = x[M,K] @ w[N,K]^T.
    for name, n, k in [("27b.mlp_gate_up", 2 * 17408, 5120), ("27b.mlp_down", 5120, 17408),
                       ("27b.gdn_in_qkvz", 2 * 16 * 128 + 2 * 48 * 128, 5120), ("9b.mlp_gate_up", 2 * 12288, 4096),
                       ("9b.mlp_down", 4096, 12288)]:
        for m in (1, 16, 64, 8192):
            rows.append(Anchor("gemm", "torch.matmul", f"gemm {name} {n}x{k} M={m}", "gemm", f"{name}/{m}",
                               2.0 * m * n * k, "TFLOP/s", _matmul_builder(m, n, k)))
    return rows


def find_criterion_dir(arg):
    cands = [arg] if arg else []
    if os.environ.get("CRITERION_HOME"):
        cands.append(os.environ["CRITERION_HOME"])
    cands += ["target/criterion"] + sorted(str(p) for p in Path(".").glob(".gpu*/root/target/criterion"))
    for c in cands:
        if c and Path(c).is_dir():
            return Path(c)
    return None


def deltakit_seconds(crit, a):
    """Median time per call (s) from criterion's estimates.json, or None."""
    if crit is None:
        return None
    p = crit / a.group / a.bench_id / "new" / "estimates.json"
    if not p.is_file():
        # criterion sanitizes some characters in ids; try the flattened form too.
        p = crit / a.group / a.bench_id.replace("/", "_") / "new" / "estimates.json"
        if not p.is_file():
            return None
    est = json.loads(p.read_text())
    return est["median"]["point_estimate"] * 1e-9


def anchor_seconds(a):
    try:
        import triton.testing
        fn = a.build()
        fn()  # compile / autotune outside the timing
        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e-3
    except Exception as e:  # noqa: BLE001 - an anchor that cannot run prints "-"
        print(f"# {a.lib} {a.label}: {type(e).__name__}: {e}", file=sys.stderr)
        return None


def fmt(x, unit):
    return "-" if x is None else f"{x:.1f} {unit}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--criterion-dir", default=None)
    ap.add_argument("--only", choices=["prefill", "decode", "attn", "gemm"], default=None)
    ap.add_argument("--no-anchor", action="store_true", help="only print deltakit's numbers")
    ap.add_argument("--budget-s", type=float, default=1e9, help="stop timing anchors after this many seconds")
    args = ap.parse_args()
    crit = find_criterion_dir(args.criterion_dir)
    print(f"# criterion dir: {crit if crit else '(none found)'}")
    t_start = time.time()
    tables = {}  # anchor library -> table lines
    for a in anchors():
        if args.only and a.kind != args.only:
            continue
        scale = 1e-12 if a.unit == "TFLOP/s" else 1e-9
        dk_s = deltakit_seconds(crit, a)
        an_s = None
        if not args.no_anchor and time.time() - t_start < args.budget_s:
            an_s = anchor_seconds(a)
        dk = None if dk_s is None else a.work / dk_s * scale
        an = None if an_s is None else a.work / an_s * scale
        ratio = "-" if dk is None or an is None else f"{dk / an:.2f}"
        dk_t = "" if dk_s is None else f" ({dk_s * 1e6:.0f} us)"
        an_t = "" if an_s is None else f" ({an_s * 1e6:.0f} us)"
        lines = tables.setdefault(a.lib, [f"| shape | deltakit | {a.lib} | ratio |", "| --- | --- | --- | --- |"])
        lines.append(f"| {a.label} | {fmt(dk, a.unit)}{dk_t} | {fmt(an, a.unit)}{an_t} | {ratio} |")
        print(lines[-1], flush=True)
    for lines in tables.values():
        print()
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
