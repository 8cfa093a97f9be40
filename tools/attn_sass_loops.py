#!/usr/bin/env python3
"""Per-loop SASS counts of one kernel (cuobjdump -sass -fun output): for every backward branch whose
body holds HGMMA, the instructions, HGMMA, R2UR, LDL and STL inside it (tools/attn_sass.sh)."""
import re, sys

ins = []
for l in open(sys.argv[1]):
    m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);", l)
    if m: ins.append((int(m.group(1), 16), m.group(2)))
for i, (a, t) in enumerate(ins):
    m = re.search(r"BRA (?:`\(\.L_x_\d+\)|)?(0x[0-9a-f]+)", t)
    if not m or "BRA.DIV" in t: continue
    tgt = int(m.group(1), 16)
    if tgt >= a: continue
    body = [x for x in ins if tgt <= x[0] <= a]
    h = sum("HGMMA" in x[1] for x in body)
    if h == 0: continue
    c = lambda k: sum(k in x[1] for x in body)
    print(f"loop {tgt:#x}-{a:#x}: instr {len(body)} HGMMA {h} R2UR {c('R2UR')} LDL {c('LDL')} STL {c('STL')}")
