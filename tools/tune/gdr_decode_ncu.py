#!/usr/bin/env python3
"""Short text of an ncu raw-page CSV (tools/tune/gdr_decode_call.sh step ncu): per profiled kernel, the DRAM / L2 /
occupancy / stall metrics side by side; with --instances (CSV with --print-metric-instances values on stdin) the
PM-sampling series (pmsampling:* metrics: DRAM throughput etc. over the kernel's duration), downsampled to <= 40
points. Standard library only.

    python3 tools/tune/gdr_decode_ncu.py raw.csv
    ncu --import r.ncu-rep --page raw --csv --print-metric-instances values | python3 tools/tune/gdr_decode_ncu.py --instances
"""
import csv
import sys

KEEP = ("gpu__time_duration.sum", "dram__throughput.avg.pct_of_peak_sustained_elapsed", "dram__bytes_read.sum",
        "dram__bytes_write.sum", "dram__bytes_read.sum.per_second", "dram__bytes_write.sum.per_second",
        "lts__t_sector_hit_rate.pct", "lts__t_sectors_op_read.sum", "lts__t_sectors_op_write.sum",
        "sm__warps_active.avg.pct_of_peak_sustained_active", "sm__maximum_warps_per_active_cycle_pct",
        "launch__registers_per_thread", "launch__grid_size", "launch__block_size", "launch__occupancy_limit_registers",
        "launch__occupancy_limit_shared_mem", "launch__occupancy_limit_blocks", "launch__waves_per_multiprocessor",
        "launch__cluster_dim_x", "sm__throughput.avg.pct_of_peak_sustained_elapsed",
        "lts__throughput.avg.pct_of_peak_sustained_elapsed", "l1tex__throughput.avg.pct_of_peak_sustained_active",
        "smsp__average_warp_latency_issue_stalled_long_scoreboard", "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_membar_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_drain_per_issue_active.ratio",
        "smsp__issue_active.avg.pct_of_peak_sustained_active", "dram__cycles_active.avg.pct_of_peak_sustained_elapsed",
        "smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio",
        "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio",
        "sm__warps_active.avg.per_cycle_active", "launch__shared_mem_per_block_static",
        "launch__occupancy_per_block_size", "sm__ctas_launched.sum", "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum",
        "lts__t_sectors_srcunit_tex_op_read.sum", "lts__t_sectors_srcunit_tex_op_write.sum")


def rows_of(lines):
    rd = list(csv.reader(lines))
    if len(rd) < 3:
        return [], []
    head = rd[0]
    return head, [r for r in rd[1:] if len(r) == len(head) and r[0].strip() != ""]  # the units row has no ID


def short(name):
    n = name.split("(")[0]
    return n[:90]


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--instances":
        head, rows = rows_of(sys.stdin.read().splitlines())
        kcol = head.index("Kernel Name") if "Kernel Name" in head else None
        pm = [i for i, h in enumerate(head) if h.startswith("pmsampling:")]
        print(f"pmsampling columns: {len(pm)}")
        for r in rows:
            print(f"== {short(r[kcol]) if kcol is not None else '?'}")
            for i in pm:
                h = head[i]
                if not any(x in h for x in ("dram", "gpu__time", "sm__warps", "lts__t", "sm__cycles")):
                    continue
                vals = [v for v in r[i].replace(",", ";").split(";") if v.strip()]
                try:
                    f = [float(v) for v in vals]
                except ValueError:
                    print(f"  {h}: {r[i][:120]}")
                    continue
                step = max(1, len(f) // 40)
                ds = [sum(f[j:j + step]) / len(f[j:j + step]) for j in range(0, len(f), step)]
                print(f"  {h} (n={len(f)}, step {step}): " + " ".join(f"{x:.3g}" for x in ds))
        return
    with open(sys.argv[1], newline="") as fh:
        head, rows = rows_of(fh.read().splitlines())
    if not rows:
        print("no kernels in the ncu report")
        return
    kcol = head.index("Kernel Name") if "Kernel Name" in head else None
    cols = [i for i, h in enumerate(head) if h in KEEP]
    print("| metric | " + " | ".join(short(r[kcol])[:40] if kcol is not None else "?" for r in rows) + " |")
    for i in cols:
        print(f"| {head[i]} | " + " | ".join(r[i] for r in rows) + " |")


if __name__ == "__main__":
    main()
