#!/usr/bin/env python3
"""Summarise an ncu raw-page CSV of one decode step (tools/engine_device_run.sh ncugraph).

Input: `ncu --csv --page raw --metrics gpu__time_duration.sum,dram__bytes_read.sum,
dram__bytes_write.sum` over one graph replay with `--graph-profiling node` (every kernel node
profiled alone, caches flushed before each). Prints the kernels by family (count, summed
duration, DRAM bytes, achieved bandwidth) and the slowest kernels. The summed durations are what
the step's kernels cost when run alone; the replay's wall time minus that sum is the price of the
boundaries between them (launch, ramp-up and tail of each node).

    python3 tools/ncu_step_table.py ncugraph.csv
"""
import csv
import io
import re
import sys
from collections import defaultdict

SCALE = {
    "nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6,  # -> microseconds
    "ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6,
    "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9,
}

FAMILIES = [
    ("gemm", r"nvjet|gemm|gemv|cutlass|xmma|splitKreduce|cublas"),
    ("gdr", r"gdr"),
    ("conv1d", r"conv1d|conv_"),
    ("norm", r"norm"),
    ("attention", r"attn|attention"),
    ("sampling", r"sample|argmax|topk|top_p"),
    ("elementwise", r"silu|swiglu|elementwise|gate|embed|gather"),
]


def family(name):
    for fam, pat in FAMILIES:
        if re.search(pat, name, re.IGNORECASE):
            return fam
    return "other"


def main(path):
    text = open(path, encoding="utf-8", errors="replace").read()
    # ncu prefixes its own log lines (==PROF== ...) before the CSV.
    lines = [l for l in text.splitlines() if l.startswith('"')]
    if len(lines) < 3:
        print("ncu step table: no kernel rows in", path)
        return 1
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    head, units, data = rows[0], rows[1], rows[2:]
    col = {h: i for i, h in enumerate(head)}
    name_col = col.get("Kernel Name", col.get("Function Name"))
    t_col = col["gpu__time_duration.sum"]
    r_col = col.get("dram__bytes_read.sum")
    w_col = col.get("dram__bytes_write.sum")

    def val(row, c):
        if c is None:
            return 0.0
        try:
            return float(row[c].replace(",", "")) * SCALE.get(units[c], 1.0)
        except ValueError:
            return 0.0

    fam = defaultdict(lambda: [0, 0.0, 0.0])
    kernels = []
    for row in data:
        if len(row) <= t_col:
            continue
        name = row[name_col]
        us, rb, wb = val(row, t_col), val(row, r_col), val(row, w_col)
        f = fam[family(name)]
        f[0] += 1
        f[1] += us
        f[2] += rb + wb
        kernels.append((us, rb + wb, name))
    total_us = sum(f[1] for f in fam.values())
    total_b = sum(f[2] for f in fam.values())
    print("ncu step table (one graph replay, every kernel alone, caches flushed)")
    print(f"{'family':<12} {'kernels':>7} {'us':>9} {'share':>6} {'MB':>9} {'TB/s':>6}")
    for k, (n, us, b) in sorted(fam.items(), key=lambda kv: -kv[1][1]):
        tbs = b / (us * 1e-6) / 1e12 if us > 0 else 0.0
        print(f"{k:<12} {n:>7} {us:>9.1f} {us / total_us:>6.1%} {b / 1e6:>9.1f} {tbs:>6.2f}")
    print(f"{'total':<12} {len(kernels):>7} {total_us:>9.1f} {'':>6} {total_b / 1e6:>9.1f} "
          f"{total_b / (total_us * 1e-6) / 1e12:>6.2f}")
    # GEMMs by size class: the small ones pay ramp-up / tail the most.
    print("gemm kernels by DRAM bytes (MB class): count, us, TB/s")
    cls = defaultdict(lambda: [0, 0.0, 0.0])
    for us, b, name in kernels:
        if family(name) == "gemm":
            c = cls[round(b / 1e6 / 8) * 8]
            c[0] += 1
            c[1] += us
            c[2] += b
    for mb, (n, us, b) in sorted(cls.items()):
        print(f"  ~{mb:>5} MB x {n:>3}: {us:>8.1f} us  {b / (us * 1e-6) / 1e12:5.2f} TB/s")
    print("slowest 12 kernels: us, MB, TB/s, name")
    for us, b, name in sorted(kernels, reverse=True)[:12]:
        print(f"  {us:8.1f} {b / 1e6:8.1f} {b / (us * 1e-6) / 1e12:5.2f}  {name[:90]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
