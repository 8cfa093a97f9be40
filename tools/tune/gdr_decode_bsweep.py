#!/usr/bin/env python3
"""gdr.decode rows at batches / token counts that tools/bench_anchors_gdr.py does not list (its decode rows are
B 1 / 16 / 64 / 256 at T = 1 and B 16 / 64 at T > 1): the same decode_row (deltakit dispatch, FLA, the sweep
configurations, warm / cold / CUDA-graph back-to-back), at 27B TP1 (16/48) or TP2 (8/24), K = V = 128.

    python3 tools/tune/gdr_decode_bsweep.py --cases TP1:2:1,TP2:4:4 <tools/bench_anchors_gdr.py arguments>

--cases: comma-separated TP:B:T. Honours --wait-file / --barrier / --lock-file / --budget-s / --out like the
harness (tools/tune/gdr_decode_call.sh step `bsweep`, BSWEEP_CASES).
"""
import importlib.util
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
argv = sys.argv[1:]
cases = "TP1:2:1,TP1:4:1,TP1:8:1,TP2:4:1,TP2:8:1,TP1:1:4,TP1:4:4,TP2:1:4,TP2:4:4"
if "--cases" in argv:
    i = argv.index("--cases")
    cases = argv[i + 1]
    del argv[i:i + 2]
sys.argv = [str(HERE.parent / "bench_anchors_gdr.py")] + argv
spec = importlib.util.spec_from_file_location("bench_anchors_gdr", HERE.parent / "bench_anchors_gdr.py")
h = importlib.util.module_from_spec(spec)
spec.loader.exec_module(h)
A = h.ARGS

h.torch.set_grad_enabled(False)
libs = h.load_anchors()
dk = h.DkDecode(A.lib)
if A.wait_file:
    while not os.path.exists(A.wait_file):
        time.sleep(0.5)
if A.barrier:
    bdir, bn = A.barrier.rsplit(":", 1)
    os.makedirs(bdir, exist_ok=True)
    open(os.path.join(bdir, str(os.getpid())), "w").close()
    tb = time.time()
    while len(os.listdir(bdir)) < int(bn) and time.time() - tb < 300:
        time.sleep(0.5)
lock = None
if A.lock_file:
    import fcntl
    lock = open(A.lock_file, "a")
    fcntl.flock(lock, fcntl.LOCK_EX)
heads = {"TP1": (16, 48), "TP2": (8, 24)}
for c in [c for c in cases.split(",") if c]:
    tp, b, t = c.split(":")
    hk, hv = heads[tp]
    b, t = int(b), int(t)
    name = f"decode 27B-{tp} {hk}/{hv} B={b}" + ("" if t == 1 else f" T={t}")
    if h.elapsed() > A.budget_s:
        h.RES["rows"].append({"kind": "decode", "case": name, "skipped": "budget"})
        continue
    t1 = time.time()
    try:
        h.decode_row(libs, dk, name, hk, hv, b, t)
    except Exception as e:  # noqa: BLE001
        h.RES["rows"].append({"kind": "decode", "case": name, "error": h.err_text(e)})
    print(f"[{h.elapsed():6.1f}s] {name} ({time.time() - t1:.1f}s)", file=sys.stderr, flush=True)
    h.save()
h.save()
print(h.table())
