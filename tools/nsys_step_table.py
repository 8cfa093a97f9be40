#!/usr/bin/env python3
"""Per-decode-step kernel time from an nsys `cuda_gpu_trace` CSV (graph nodes traced).

usage: nsys_step_table.py TRACE.csv LABEL

A step starts at each `embedding` kernel (the first op of every forward); the last 48 steps are
taken as the steady decode steps. Per step: wall span, time with no kernel running (idle), and
kernel time summed by family (GEMM = cuBLAS / cuBLASLt kernels, prefetch = mem.l2_prefetch,
other = every deltakit kernel). Then the GEMM kernels' mean duration per (name, grid).
"""
import csv
import sys
from collections import defaultdict


def family(name):
    n = name.lower()
    if "l2_prefetch" in n:
        return "prefetch"
    if any(k in n for k in ("gemm", "xmma", "cutlass", "gemv", "splitk", "cublas")):
        return "gemm"
    return "other"


def main():
    path, label = sys.argv[1], sys.argv[2]
    rows = []
    with open(path, newline="") as fh:
        for r in csv.DictReader(fh):
            name = r.get("Name") or r.get("Kernel Name") or ""
            if not r.get("Duration (ns)") or not name or r.get("GrdX", "") == "":
                continue  # memcpy / memset rows
            grid = f'{r.get("GrdX")}x{r.get("GrdY")}x{r.get("GrdZ")}'
            rows.append((int(r["Start (ns)"]), int(r["Duration (ns)"]), name, grid))
    rows.sort()
    starts = [i for i, r in enumerate(rows) if "embedding" in r[2].lower()]
    if len(starts) < 3:
        print(f"{label}: {len(starts)} steps found in {path}")
        return
    steps = list(zip(starts[:-1], starts[1:]))[-48:]
    tot = defaultdict(float)
    span_sum = idle_sum = 0.0
    per_gemm = defaultdict(lambda: [0, 0.0])
    for a, b in steps:
        seg = rows[a:b]
        span = rows[b][0] - seg[0][0]
        span_sum += span
        busy_end = seg[0][0]
        idle = 0
        for s, d, name, grid in seg:
            if s > busy_end:
                idle += s - busy_end
            busy_end = max(busy_end, s + d)
            fam = family(name)
            tot[fam] += d
            if fam == "gemm":
                g = per_gemm[(name[:60], grid)]
                g[0] += 1
                g[1] += d
        idle += max(0, rows[b][0] - busy_end)
        idle_sum += idle
    n = len(steps)
    print(f"== {label}: {n} steps | span {span_sum / n / 1e3:.1f} us | idle {idle_sum / n / 1e3:.1f} us | "
          + " | ".join(f"{k} {v / n / 1e3:.1f} us" for k, v in sorted(tot.items())))
    top = sorted(per_gemm.items(), key=lambda kv: -kv[1][1])[:8]
    for (name, grid), (cnt, d) in top:
        print(f"   gemm {cnt / n:5.1f}/step  mean {d / cnt / 1e3:6.2f} us  {grid:>12}  {name}")


if __name__ == "__main__":
    main()
