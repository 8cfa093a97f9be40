#!/usr/bin/env python3
"""Per-field p50 / mean of attn.prefill timeline records relative to the block entry (field 1).

    python3 tools/attn_tl_fields.py tl_<shape>_v<variant>.txt ...

Each line of a timeline file holds 12 integers (benches/attn.rs write_timeline; fields in
src/ops/attn.rs prefill_sm90_timeline): 0 = SM id | tiles << 32, 1 = entry, 2-11 %globaltimer ns.
Prints, per file, every stamped field's time after the entry (us), so variant-specific fields
(43 / 45 / 50 redefine 7 / 8 / 10) can be read without dev_attn_check.py's fixed phase names."""
import sys

for path in sys.argv[1:]:
    recs = [[int(x) for x in line.split()] for line in open(path)]
    recs = [r for r in recs if len(r) == 12 and r[1] and all(r[2:7])]
    if not recs:
        print(f"{path}: no complete records")
        continue
    out = []
    for f in range(2, 12):
        v = sorted((r[f] - r[1]) / 1e3 for r in recs if r[f])
        if v:
            out.append(f"f{f} p50 {v[len(v) // 2]:.2f} mean {sum(v) / len(v):.2f}")
    print(f"{path.split('/')[-1]} ({len(recs)} blocks): " + "; ".join(out))
