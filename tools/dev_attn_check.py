#!/usr/bin/env python3
"""Developer harness for triton_aot/attn/attention.py on a GPU host with torch + triton (JIT):
correctness against a float64 torch reference over a random paged cache, then timings against
torch SDPA. Not part of the test suite (the Rust GPU tests are); used to iterate on the kernels.

    python3 tools/dev_attn_check.py [--bench]

Also (no torch needed): `python3 tools/dev_attn_check.py ncu-src <csv>` summarizes the source
page of an ncu report (`ncu --import r.ncu-rep --page source --csv --print-source sass`): the
SASS instructions with the most warp stall samples, and the samples per opcode.
`python3 tools/dev_attn_check.py timeline <tl_*.txt>...` summarizes the per-block timelines of the
attn.prefill timeline variants 26 / 27 / 29 (benches/attn.rs, DELTAKIT_BENCH_TIMELINE): where a row
block's time goes (launch gap after the previous block on the SM, Q wait, first QK^T, tile loop,
epilogue) in microseconds and as shares of the SMs' time; `timeline-dec <tld_*.txt>...` the same
for attn.decode variant 12 (split CTAs and merge blocks of one call, relative to the earliest
release from the grid-dependency wait).
"""
import argparse
import csv
import importlib.util
import math
import sys
from pathlib import Path


def ncu_src(path, top=45):
    """Prints the top SASS lines by warp stall samples of an ncu source-page CSV."""
    lines = open(path, errors="replace").read().splitlines()
    start = next((i for i, l in enumerate(lines) if "Source" in l and "Sampling" in l), None)
    if start is None:
        print(f"ncu-src: no source table in {path} ({len(lines)} lines)")
        print("\n".join(lines[:10]))
        return
    rows = list(csv.reader(lines[start:]))
    head, body = rows[0], [r for r in rows[1:] if len(r) == len(rows[0])]
    col = {h: i for i, h in enumerate(head)}
    src = col.get("Source", 1)
    alls = next((i for h, i in col.items() if "Sampling (All" in h), None)
    noti = next((i for h, i in col.items() if "Sampling (Not" in h), None)
    execd = next((i for h, i in col.items() if h.startswith("Instructions Executed")), None)

    def num(r, i):
        try:
            return float(r[i].replace(",", "")) if i is not None and r[i] else 0.0
        except ValueError:
            return 0.0

    total = sum(num(r, alls) for r in body) or 1.0
    print(f"ncu-src: {len(body)} SASS lines, {total:.0f} stall samples; columns: {len(head)}")
    by_op = {}
    for r in body:
        op = r[src].strip().split(" ")[0] if r[src].strip() else "?"
        if op.startswith("@"):
            op = r[src].strip().split(" ")[1] if len(r[src].split()) > 1 else op
        op = op.split(".")[0]
        by_op[op] = by_op.get(op, 0.0) + num(r, alls)
    print("samples by opcode: " + ", ".join(f"{k} {v / total:.1%}" for k, v in
                                            sorted(by_op.items(), key=lambda kv: -kv[1])[:14]))
    addr = col.get("Address", 0)
    for r in sorted(body, key=lambda r: -num(r, alls))[:top]:
        print(f"{r[addr]:>6} {num(r, alls) / total:6.2%} (not issued {num(r, noti) / total:6.2%}, "
              f"exec {num(r, execd):.3g}) {r[src].strip()[:70]}")


def timeline(path):
    """Per-block phase summary of one timeline file (8 or 12 integers per line, see attn.h)."""
    recs = []
    # The persistent timeline variant (38): fields 8-11 are the producer's stamps, not the Q
    # path of a launched CTA.
    persist = "_v38" in str(path)
    # The PK persistent timeline variants (58, 60, 64): one record per row block at its LPT index;
    # field 1 = consumer warpgroup 0 starts the row block, 9 = it released the Q tile, 10 = the Q
    # boxes issued, 11 = K tile 0 issued; 7 / 8 unused.
    pk = any(f"_v{v}" in str(path) for v in (58, 60, 64))
    for line in open(path):
        f = [int(x) for x in line.split()]
        if len(f) in (8, 12) and f[1] and all(f[1:7]):
            r = dict(sm=f[0] & 0xFFFFFFFF, n=f[0] >> 32, entry=f[1], q=f[2], qk0=f[3],
                     pv=f[4], end0=f[5], end1=f[6], prod=f[7])
            if len(f) == 12 and pk and all(f[9:12]):
                r.update(qfree=f[9], qiss=f[10], k0=f[11])
            elif len(f) == 12 and all(f[8:12]):
                if persist:  # 38: the producer K pair's side of the block (session 8)
                    r.update(pstart=f[8], qfree=f[9], qiss=f[10], k0=f[11])
                else:
                    r.update(seq=f[8], sync=f[9], qiss=f[10], k0=f[11])
            recs.append(r)
    if not recs:
        print(f"timeline {path}: no complete records")
        return
    t0 = min(r["entry"] for r in recs)
    t1 = max(max(r["end0"], r["end1"]) for r in recs)
    bad = sum(1 for r in recs if not (r["entry"] <= r["q"] <= r["qk0"] <= r["pv"] <= r["end0"]))
    by_sm = {}
    for r in recs:
        by_sm.setdefault(r["sm"], []).append(r)
    gaps, firsts = [], []
    for rs in by_sm.values():
        rs.sort(key=lambda r: r["entry"])
        firsts.append(rs[0]["entry"] - t0)
        for a, b in zip(rs, rs[1:]):
            gaps.append(b["entry"] - max(a["end0"], a["end1"], a["prod"]))
    nsm = len(by_sm)
    span = (t1 - t0) / 1e3
    ph = dict(
        q_wait=[r["q"] - r["entry"] for r in recs],
        first_qk=[r["qk0"] - r["q"] for r in recs],
        loop=[r["pv"] - r["qk0"] for r in recs],
        epilogue=[max(r["end0"], r["end1"]) - r["pv"] for r in recs],
    )
    qp = [r for r in recs if "seq" in r]
    if qp:
        # The Q path (12-field records): entry -> bounds loaded -> barriers ready -> Q issued ->
        # Q landed (field 2), and K tile 0's issue.
        ph["q:entry->bounds"] = [r["seq"] - r["entry"] for r in qp]
        ph["q:->sync"] = [r["sync"] - r["seq"] for r in qp]
        ph["q:->issued"] = [r["qiss"] - r["sync"] for r in qp]
        ph["q:->landed"] = [r["q"] - r["qiss"] for r in qp]
        ph["k0:sync->issued"] = [r["k0"] - r["sync"] for r in qp]
    pp = [r for r in recs if "pstart" in r]
    if pp:
        # 38: producer block start -> its Q half 0 free (the previous block's epilogue read
        # it) -> the Q rows issued -> landed (consumer warpgroup 0's wait passed, field 2); the
        # consumer's block start (field 1) relative to the Q half's release.
        ph["p:start->K0 issued"] = [r["k0"] - r["pstart"] for r in pp]
        ph["p:Q free->issued"] = [r["qiss"] - r["qfree"] for r in pp]
        ph["p:Q issued->landed"] = [r["q"] - r["qiss"] for r in pp]
        ph["p:Q free->cons start"] = [r["entry"] - r["qfree"] for r in pp]
    kp = [r for r in recs if "qfree" in r and "pstart" not in r]
    if kp:
        # 58: the next row block's Q issued after this CTA's previous release, and its lead.
        ph["pk:Q issued->landed"] = [r["q"] - r["qiss"] for r in kp]
        ph["pk:K0 issued->cons start"] = [r["entry"] - r["k0"] for r in kp]
        ph["pk:Q free->wg0 stored"] = [r["end0"] - r["qfree"] for r in kp]
        prev_free = []
        for rs in by_sm.values():
            for a, b in zip(rs, rs[1:]):
                if "qfree" in a and "qiss" in b:
                    prev_free.append(b["qiss"] - a["qfree"])
        if prev_free:
            ph["pk:prev Q free->issued"] = prev_free
    tiles = sum(r["n"] for r in recs)
    per_tile = sum(ph["loop"]) / max(1, sum(max(1, r["n"] - 1) for r in recs)) / 1e3
    busy = sum(max(r["end0"], r["end1"]) - r["entry"] for r in recs) / 1e3
    print(f"timeline {path}: {len(recs)} blocks on {nsm} SMs, {tiles} tiles, span {span:.1f} us, "
          f"out-of-order records {bad}")
    print(f"  SM time {nsm * span:.0f} us: blocks busy {busy:.0f} ({busy / (nsm * span):.1%}), "
          f"launch gaps {sum(gaps) / 1e3:.0f} ({sum(gaps) / 1e3 / (nsm * span):.1%}, "
          f"mean {sum(gaps) / max(1, len(gaps)):.0f} ns), start skew max {max(firsts):.0f} ns")
    for k, v in ph.items():
        v = sorted(v)
        print(f"  {k:15s} mean {sum(v) / len(v) / 1e3:7.2f} us  p50 {v[len(v) // 2] / 1e3:7.2f}  "
              f"p90 {v[int(len(v) * 0.9)] / 1e3:7.2f}  share of SM time "
              f"{sum(v) / 1e3 / (nsm * span):.1%}")
    print(f"  loop per tile after the first: {per_tile:.3f} us (2.04 us = 128 x 80 x 256 x 2 GEMMs "
          f"at 679 TFLOP/s / 132 SMs); mean tiles per block {tiles / len(recs):.1f}")
    prod = sorted(r["prod"] - r["entry"] for r in recs)
    print(f"  producer done issuing after entry: p50 {prod[len(prod) // 2] / 1e3:.2f} us; "
          f"end wg1 - end wg0 mean {sum(r['end1'] - r['end0'] for r in recs) / len(recs) / 1e3:.2f} us")
    # Tail: time from the last block start to the end, and SMs idle at the end.
    last_start = max(r["entry"] for r in recs)
    ends = sorted(max(max(r["end0"], r["end1"]) for r in rs) for rs in by_sm.values())
    print(f"  tail: last block start at {(last_start - t0) / 1e3:.1f} us; SM finish p10 / p50 / max "
          f"{(ends[len(ends) // 10] - t0) / 1e3:.1f} / {(ends[len(ends) // 2] - t0) / 1e3:.1f} / "
          f"{(ends[-1] - t0) / 1e3:.1f} us")


def timeline_dec(path):
    """Phase summary of one decode timeline file (split CTA records, 'merge', merge records)."""
    sp, mg, cur = [], [], None
    cur = sp
    for line in open(path):
        if line.strip() == "merge":
            cur = mg
            continue
        f = [int(x) for x in line.split()]
        if len(f) == 6 and f[1]:
            cur.append(f)
    if not sp:
        print(f"timeline-dec {path}: no split records")
        return
    t0 = min(r[2] for r in sp)

    def pct(v, q):
        v = sorted(v)
        return v[min(len(v) - 1, int(len(v) * q))]

    def row(name, v):
        print(f"  {name:34s} min {min(v) / 1e3:7.2f}  p50 {pct(v, 0.5) / 1e3:7.2f}  "
              f"p90 {pct(v, 0.9) / 1e3:7.2f}  max {max(v) / 1e3:7.2f} us")

    sms = len({r[0] & 0xFFFFFFFF for r in sp})
    print(f"timeline-dec {path}: {len(sp)} split CTAs on {sms} SMs, tiles/CTA "
          f"{sp[0][0] >> 32}; {len(mg)} merge blocks (times in us from the first wait release)")
    row("split entry (resident)", [r[1] - t0 for r in sp])
    row("split wait released", [r[2] - t0 for r in sp])
    row("split Q landed", [r[3] - t0 for r in sp])
    row("split loop done", [r[4] - t0 for r in sp])
    row("split partials written", [r[5] - t0 for r in sp])
    row("per CTA: Q landed - released", [r[3] - r[2] for r in sp])
    row("per CTA: loop (from Q landed)", [r[4] - r[3] for r in sp])
    row("per CTA: combine + partials", [r[5] - r[4] for r in sp])
    if mg:
        row("merge entry", [r[0] - t0 for r in mg])
        row("merge wait released", [r[1] - t0 for r in mg])
        row("merge output written", [r[2] - t0 for r in mg])
        end = max(r[2] for r in mg)
        last_split = max(r[5] for r in sp)
        print(f"  chain: first release -> last split end {(last_split - t0) / 1e3:.2f} us, "
              f"-> merge release {(min(r[1] for r in mg) - last_split) / 1e3:.2f} us later, "
              f"-> last merge end {(end - last_split) / 1e3:.2f} us after the last split end; "
              f"call total ~{(end - t0) / 1e3:.2f} us + the next call's release")


if __name__ == "__main__" and len(sys.argv) > 2 and sys.argv[1] == "timeline-dec":
    for f in sys.argv[2:]:
        timeline_dec(f)
    sys.exit(0)
if __name__ == "__main__" and len(sys.argv) > 2 and sys.argv[1] == "ncu-src":
    ncu_src(sys.argv[2])
    sys.exit(0)
if __name__ == "__main__" and len(sys.argv) > 2 and sys.argv[1] == "timeline":
    for f in sys.argv[2:]:
        timeline(f)
    sys.exit(0)

import torch  # noqa: E402
import triton  # noqa: E402

HERE = Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("attention", HERE.parent / "triton_aot/attn/attention.py")
A = importlib.util.module_from_spec(spec)
spec.loader.exec_module(A)

CFG = {128: dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2),
       256: dict(BLOCK_M=64, BLOCK_N=32, num_warps=8, num_stages=2)}
DEC = {128: dict(BLOCK_N=64, num_warps=4, num_stages=2), 256: dict(BLOCK_N=32, num_warps=4, num_stages=2)}


def make_batch(lens, ctxs, hq, hkv, hd, page_size, gen, extra_pages=7):
    dev = "cuda"
    n = len(lens)
    totals = [c + l for c, l in zip(ctxs, lens)]
    max_pages = max(1, max(math.ceil(t / page_size) for t in totals))
    need = sum(math.ceil(t / page_size) for t in totals)
    num_pages = need + extra_pages
    perm = torch.randperm(num_pages, generator=gen).tolist()
    table = torch.full((n, max_pages), -1, dtype=torch.int32)
    k_cache = torch.randn(num_pages, page_size, hkv, hd, generator=gen).to(torch.bfloat16)
    v_cache = torch.randn(num_pages, page_size, hkv, hd, generator=gen).to(torch.bfloat16)
    it = iter(perm)
    for i, t in enumerate(totals):
        for j in range(math.ceil(t / page_size)):
            table[i, j] = next(it)
    T = sum(lens)
    q = torch.randn(T, hq, hd, generator=gen).to(torch.bfloat16)
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32)
    return dict(q=q.to(dev), k=k_cache.to(dev), v=v_cache.to(dev), table=table.to(dev), cu=cu.to(dev),
                ctx=torch.tensor(ctxs, dtype=torch.int32).to(dev), max_pages=max_pages, num_pages=num_pages,
                page_size=page_size, lens=lens, ctxs=ctxs, table_cpu=table)


def gather(b, i, total):
    ps = b["page_size"]
    pos = torch.arange(total)
    pages = b["table_cpu"][i, pos // ps].long()
    rows = (pages * ps + pos % ps).to(b["k"].device)
    k = b["k"].reshape(-1, *b["k"].shape[2:])[rows]
    v = b["v"].reshape(-1, *b["v"].shape[2:])[rows]
    return k, v  # [total, hkv, hd]


def ref_prefill(b, hq, hkv, hd):
    out = torch.zeros_like(b["q"], dtype=torch.float64)
    cu = b["cu"].tolist()
    for i, (l, c) in enumerate(zip(b["lens"], b["ctxs"])):
        if c < 0 or l == 0:
            continue
        k, v = gather(b, i, c + l)
        q = b["q"][cu[i]:cu[i + 1]].double()
        g = hq // hkv
        k = k.double().repeat_interleave(g, dim=1)
        v = v.double().repeat_interleave(g, dim=1)
        s = torch.einsum("thd,shd->hts", q, k) / math.sqrt(hd)
        qpos = c + torch.arange(l, device=q.device)
        kpos = torch.arange(c + l, device=q.device)
        s = s.masked_fill(kpos[None, None, :] > qpos[None, :, None], float("-inf"))
        out[cu[i]:cu[i + 1]] = torch.einsum("hts,shd->thd", torch.softmax(s, -1), v)
    return out


def run_prefill(b, hq, hkv, hd, cfg=None):
    T = b["q"].shape[0]
    cfg = cfg or CFG[hd]
    out = torch.full_like(b["q"], float("nan"))
    maxlen = max(b["lens"]) if b["lens"] else 0
    mqb = max(1, triton.cdiv(maxlen, cfg["BLOCK_M"]))
    grid = (len(b["lens"]) * mqb, hq)
    A.attn_prefill_kernel[grid](b["q"], b["k"], b["v"], out, b["cu"], b["ctx"], b["table"], T, mqb,
                                b["max_pages"], b["num_pages"], b["page_size"], hq, hkv, 1.0 / math.sqrt(hd),
                                HD=hd, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"],
                                num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return out


def decode_bufs(n, hq, hd, seqlens, splits):
    sl = torch.tensor(seqlens, dtype=torch.int32, device="cuda")
    po = torch.empty(n, hq, splits, hd, dtype=torch.float32, device="cuda")
    plse = torch.empty(n, hq, splits, dtype=torch.float32, device="cuda")
    out = torch.full((n, hq, hd), float("nan"), dtype=torch.bfloat16, device="cuda")
    return sl, po, plse, out


def run_decode(b, hq, hkv, hd, seqlens, splits, cfg=None, bufs=None):
    n = len(seqlens)
    cfg = cfg or DEC[hd]
    sl, po, plse, out = bufs or decode_bufs(n, hq, hd, seqlens, splits)
    A.attn_decode_kernel[(n, hkv, splits)](b["qd"], b["k"], b["v"], po, plse, sl, b["table"], b["max_pages"],
                                           b["num_pages"], b["page_size"], hq, hkv, splits, 1.0 / math.sqrt(hd),
                                           HD=hd, BLOCK_N=cfg["BLOCK_N"], BLOCK_G=16,
                                           num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    A.attn_decode_merge_kernel[(n, hq)](po, plse, out, sl, hq, splits, HD=hd, BLOCK_S=16, num_warps=4)
    return out


def rel(a, b):
    a = a.double(); b = b.double()
    if not torch.isfinite(a).all():
        return float("inf")
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def check(quick=False):
    gen = torch.Generator().manual_seed(0)
    worst = 0.0
    shapes = [(24, 4, 256), (12, 2, 256), (16, 4, 128), (8, 8, 128), (6, 2, 128), (16, 1, 128)]
    for hq, hkv, hd in (shapes[::2] if quick else shapes):
        for lens, ctxs, ps in [([1], [0], 16), ([63, 64, 65], [0, 5, 100], 16), ([200, 1, 37], [0, 333, -1], 64),
                               ([513], [1000], 32), ([7, 300], [0, 0], 1)]:
            b = make_batch(lens, ctxs, hq, hkv, hd, ps, gen)
            got = run_prefill(b, hq, hkv, hd)
            ref = ref_prefill(b, hq, hkv, hd)
            e = rel(got, ref)
            # padding sequences must be exactly zero
            cu = b["cu"].tolist()
            for i, c in enumerate(ctxs):
                if c < 0:
                    assert bool((got[cu[i]:cu[i + 1]] == 0).all()), "padding not zero"
            worst = max(worst, e)
            print(f"prefill hq={hq} hkv={hkv} hd={hd} lens={lens} ctx={ctxs} ps={ps}: rel {e:.2e}")
            # decode == last row of prefill: query = last new token of each live sequence
            live = [i for i, c in enumerate(ctxs) if c >= 0 and lens[i] > 0]
            b["qd"] = torch.stack([b["q"][cu[i + 1] - 1] for i in live] + [b["q"][0]])  # + a padding row
            seqlens = [ctxs[i] + lens[i] for i in live] + [-1]
            tab = b["table"]
            b["table"] = torch.cat([tab[live], tab[:1]])
            for splits in (1, 3, 8):
                d = run_decode(b, hq, hkv, hd, seqlens, splits)
                exp = torch.stack([ref[cu[i + 1] - 1] for i in live])
                e2 = rel(d[:-1], exp)
                assert bool((d[-1] == 0).all()), "decode padding row not zero"
                worst = max(worst, e2)
                print(f"  decode splits={splits}: rel {e2:.2e}")
            b["table"] = tab
    print(f"WORST rel err {worst:.2e}")
    assert worst < 1e-2


SWEEP = {256: [dict(BLOCK_M=64, BLOCK_N=32, num_warps=8, num_stages=2), dict(BLOCK_M=64, BLOCK_N=64, num_warps=8, num_stages=2),
               dict(BLOCK_M=128, BLOCK_N=32, num_warps=8, num_stages=2), dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3),
               dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=2)],
         128: [dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2), dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=2),
               dict(BLOCK_M=128, BLOCK_N=32, num_warps=4, num_stages=3), dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=2)]}


def bench():
    gen = torch.Generator().manual_seed(1)
    print("| shape | T | cfg | triton paged TFLOP/s | SDPA TFLOP/s | ratio |")
    for hq, hkv, hd in [(24, 4, 256), (12, 2, 256), (32, 8, 128)]:
      for cfg in SWEEP[hd]:
        for T in (8192,) if cfg is not SWEEP[hd][0] or hd == 128 else (2048, 8192):
            b = make_batch([T], [0], hq, hkv, hd, 16, gen, extra_pages=0)
            flops = 4 * hq * T * T * hd / 2
            try:
                ms = triton.testing.do_bench(lambda: run_prefill(b, hq, hkv, hd, cfg), warmup=30, rep=150, return_mode="median")
                got = run_prefill(b, hq, hkv, hd, cfg)
            except Exception as e:  # out of resources
                print(f"| {hq}/{hkv} hd{hd} | {T} | {cfg} | failed: {type(e).__name__} | | |")
                continue
            k, v = gather(b, 0, T)
            qs = b["q"].transpose(0, 1)[None]
            ks = k.transpose(0, 1)[None].contiguous()
            vs = v.transpose(0, 1)[None].contiguous()
            f = lambda: torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)
            ms2 = triton.testing.do_bench(f, warmup=50, rep=300, return_mode="median")
            e = rel(got, f().transpose(1, 2)[0])
            print(f"| {hq}/{hkv} hd{hd} | {T} | {cfg} | {flops / ms / 1e9:.0f} | {flops / ms2 / 1e9:.0f} | {ms2 / ms:.2f} | err vs sdpa {e:.1e}")
    print("| decode shape | ctx | batch | splits | GB/s KV read |")
    for hq, hkv, hd in [(24, 4, 256)]:
        for ctx in (4096, 32768):
            for n in (1, 16, 64):
                b = make_batch([1] * n, [ctx - 1] * n, hq, hkv, hd, 16, gen, extra_pages=0)
                b["qd"] = b["q"]
                seqlens = [ctx] * n
                for bn, nw in ((32, 4), (64, 4), (64, 8), (128, 8)):
                    for mult in (1, 2, 4):
                        splits = max(1, min(128, (132 * mult) // (n * hkv)))
                        bufs = decode_bufs(n, hq, hd, seqlens, splits)
                        cfg = dict(BLOCK_N=bn, num_warps=nw, num_stages=2)
                        try:
                            ms = triton.testing.do_bench(lambda: run_decode(b, hq, hkv, hd, seqlens, splits, cfg, bufs),
                                                         warmup=30, rep=150, return_mode="median")
                        except Exception as e:
                            print(f"| {hq}/{hkv} hd{hd} | {ctx} | {n} | {splits} | {cfg} failed {type(e).__name__} |")
                            continue
                        byts = 2 * n * ctx * hkv * hd * 2
                        print(f"| {hq}/{hkv} hd{hd} | {ctx} | {n} | {splits} | {cfg} | {byts / ms / 1e6:.0f} | {ms*1e3:.1f} us |")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", action="store_true")
    a = ap.parse_args()
    check(quick=a.bench)
    if a.bench:
        bench()
