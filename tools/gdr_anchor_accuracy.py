#!/usr/bin/env python3
"""Accuracy of the GDR chunk-prefill anchors (FlashInfer 0.7.2, FLA 0.6.0) and of deltakit against a float64 reference.

deltakit's contract (DESIGN.md "Data layouts and numerics"): ||x - ref|| / ||ref|| <= 1e-2 for bf16 outputs and <= 1e-3
for the f32 state. This script measures all three libraries on the same inputs against an independent float64 reference
of the gated delta rule, so that the prefill speed comparison can be read at (un)equal precision.

Roles (one process each; they share inputs by regenerating them from the case seed on the GPU, deterministic, and
checked by a checksum that every role stores next to its outputs):
  ref    float64 chunked form of the recurrence on the GPU in torch (exact algebra, chunk 64, triangular solve in f64;
         L2 norm x / sqrt(sum x^2 + 1e-6) and q * K^-0.5 as DESIGN.md / deltakit-ref; g = log-space decay, beta), plus a
         self-check against the token-by-token float64 recurrence on a prefix of the first case
  dk     deltakit's default sm_90a split pipeline (the library's SPLIT_VARIANT, or --variant) from a .so of HEAD's
         csrc/gdr/chunk_prefill_fused_sm90.cu + chunk_local_wgmma_sm90.cu, called through ctypes exactly as
         src/ops/gdr/chunk_prefill.rs does: the Triton chunk_offsets / chunk_map kernels of
         triton_aot/gdr/chunk_prefill.py (JIT, manifest options), then dk_gdr_chunk_prefill_split_sm90 with the
         library's workspace regions (precomputed gating, q/k L2 norm in kernel, initial state from the slots, in place)
  fi     flashinfer.gdn_prefill.chunk_gated_delta_rule (alpha = exp(g) linear, state pool [P, H_v, V, K], slots,
         in place, use_cp "auto", q/k L2 norm in kernel)
  fla    fla.ops.gated_delta_rule.chunk_gated_delta_rule (state_v_first, cu_seqlens, q/k L2 norm in kernel); triton
         autotune reduced to each kernel's first config (no autotune time; the configs change block sizes / warps,
         not the arithmetic)
  merge  relative errors of every library's (--libs) outputs and final states vs the reference; JSON + table

  python3 tools/gdr_anchor_accuracy.py --role ref --dir /tmp/acc
  python3 tools/gdr_anchor_accuracy.py --role dk --dk-lib .gpu-gdrdec/c2/libdk_gdr_prefill_head.so --dir /tmp/acc
  PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages python3 tools/gdr_anchor_accuracy.py --role fi ...
  python3 tools/gdr_anchor_accuracy.py --role merge --dir /tmp/acc --out acc.json
"""
import argparse
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
K = V = 128
CHUNK = 64

# name: (H_k, H_v, lengths, gates, keys, seed). gates "model": A_log = log U(1, 16), dt_bias = softplus^-1(dt),
# dt log-uniform in [1e-3, 1e-1], a, b ~ N(0, 1) (Qwen3-Next-style init: mostly slow decays, the state carries far);
# "tests": tests/gdr_chunk_prefill.rs make_data (a, b ~ 3 N(0, 1) bf16, A_log, dt_bias ~ N(0, 1)). keys "corr": every
# key of a key head = 0.9 u_h + 0.436 n_t (pairwise cosine ~0.8 before the L2 norm: an ill-conditioned I + A).
CASES = {
    "tp1_8k": (16, 48, [8192], "model", "rand", 11),
    "tp2_8k": (8, 24, [8192], "model", "rand", 12),
    "9b_64k": (16, 32, [65536], "model", "rand", 13),
    "9b_varlen": (16, 32, [8192, 4097, 1000, 8191, 63, 2048, 8192, 513], "model", "rand", 14),
    "tp1_8k_testgates": (16, 48, [8192], "tests", "rand", 15),
    "tp2_8k_corrk": (8, 24, [8192], "model", "corr", 16),
    "9b_8x8k": (16, 32, [8192] * 8, "model", "rand", 17),  # the benchmark's varlen shape (not in the default list)
}
DEFAULT_CASES = [c for c in CASES if c != "9b_8x8k"]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--role", required=True, choices=["ref", "dk", "fi", "fla", "merge"])
    p.add_argument("--cases", default=",".join(DEFAULT_CASES))
    p.add_argument("--variant", type=int, default=None,
                   help="dk: the split pipeline variant (default: the library's SPLIT_VARIANT)")
    p.add_argument("--tag", default="", help="dk: name of the outputs (default dk, or dk<variant> off the default)")
    p.add_argument("--libs", default="dk,fi,fla", help="merge: libraries (tags) to compare with the reference")
    p.add_argument("--dir", default="/tmp/acc")
    p.add_argument("--site", default="")
    p.add_argument("--dk-lib", default=str(ROOT / ".gpu-gdrdec/c2/libdk_gdr_prefill_head.so"))
    p.add_argument("--out", default="")
    p.add_argument("--dev", default="cuda", help="merge: where the errors are computed (cpu: beside a timed GPU run)")
    p.add_argument("--selfcheck-t", type=int, default=384, help="ref: token recurrence prefix length of the self-check")
    return p.parse_args()


ARGS = parse_args()
if ARGS.site:
    import site
    site.addsitedir(ARGS.site)
    sys.path.insert(0, ARGS.site)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, str(ROOT / "tools"))
from dk_split_prefill import SPLIT_VARIANT, DkSplitPrefill  # noqa: E402

if ARGS.variant is None:
    ARGS.variant = SPLIT_VARIANT

DEV = ARGS.dev
LIBS = [x_ for x_ in ARGS.libs.split(",") if x_]
T0 = time.time()


def log(msg):
    print(f"[{time.time() - T0:6.1f}s {ARGS.role}] {msg}", file=sys.stderr, flush=True)


def inputs(name):
    """The case's inputs (deterministic on the GPU from its seed)."""
    hk, hv, lens, gates, keys, seed = CASES[name]
    g_ = torch.Generator(device=DEV).manual_seed(seed)
    rn = lambda *s: torch.randn(*s, device=DEV, generator=g_)  # noqa: E731
    t, n = sum(lens), len(lens)
    q = rn(t, hk, K).bfloat16()
    if keys == "corr":
        u = rn(1, hk, K)
        k = (0.9 * u + 0.436 * rn(t, hk, K)).bfloat16()
    else:
        k = rn(t, hk, K).bfloat16()
    v = rn(t, hv, V).bfloat16()
    if gates == "model":
        a, b = rn(t, hv).bfloat16(), rn(t, hv).bfloat16()
        a_log = torch.log(torch.empty(hv, device=DEV).uniform_(1.0, 16.0, generator=g_))
        dt = torch.exp(torch.empty(hv, device=DEV).uniform_(math.log(1e-3), math.log(1e-1), generator=g_))
        dt_bias = dt + torch.log(-torch.expm1(-dt))  # softplus^-1(dt)
    else:
        a, b = (3.0 * rn(t, hv)).bfloat16(), (3.0 * rn(t, hv)).bfloat16()
        a_log, dt_bias = rn(hv), rn(hv)
    g = (-torch.exp(a_log) * F.softplus(a.float() + dt_bias)).contiguous()  # f32 [T, H_v], log-space decay
    beta = torch.sigmoid(b.float()).bfloat16().float().contiguous()  # bf16 model: beta in bf16 (HF), held as f32
    P = 2 * n + 1
    slots = torch.randperm(P, device=DEV, generator=g_)[:n].to(torch.int32)
    pool = rn(P, hv, K, V).contiguous()  # f32 [P, H_v, K, V] (deltakit's layout), N(0, 1) as the tests
    cu = [0]
    for L in lens:
        cu.append(cu[-1] + L)
    cu32 = torch.tensor(cu, device=DEV, dtype=torch.int32)
    ck = float(sum(x.double().abs().sum().item() for x in (q, k, v, g, beta, pool)) + slots.sum().item())
    return dict(hk=hk, hv=hv, lens=lens, t=t, n=n, q=q, k=k, v=v, g=g, beta=beta, slots=slots, pool=pool, cu=cu,
                cu32=cu32, checksum=ck)


def save(name, lib, o, s, extra=None):
    """o: [T, H_v, V]; s: final states of the N sequences [N, H_v, K, V]."""
    d = {"o": o.detach().cpu(), "s": s.detach().cpu(), **(extra or {})}
    torch.save(d, os.path.join(ARGS.dir, f"{lib}_{name}.pt"))


# ------------------------------------------------------------------------------------------ float64 reference
def l2n(x):
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def prep64(x):
    hk, hv = x["hk"], x["hv"]
    q = l2n(x["q"].double()) * K ** -0.5
    k = l2n(x["k"].double())
    rep = hv // hk  # value head h reads key head h / (H_v / H_k) (repeat_interleave)
    return (q.repeat_interleave(rep, dim=1).transpose(0, 1).contiguous(),
            k.repeat_interleave(rep, dim=1).transpose(0, 1).contiguous(),
            x["v"].double().transpose(0, 1).contiguous(), x["g"].double().t().contiguous(),
            x["beta"].double().t().contiguous())  # [H, T, *] / [H, T]


def ref_chunked(q, k, v, g, beta, s0, c=CHUNK):
    """float64 chunked gated delta rule of one sequence, heads batched. q, k [H, L, K], v [H, L, V], g, beta [H, L],
    s0 [H, K, V]. Returns o [H, L, V], s [H, K, V]. Per chunk (G = cumulative g in the chunk):
    (I + A) D = beta (V - e^G K S0), A_ts = beta_t e^{G_t - G_s} k_t.k_s (s < t); O = e^G Q S0 + (Q K^T * e^{G_t - G_s},
    s <= t) D; S = e^{G_L} S0 + (K e^{G_L - G})^T D."""
    h, L = q.shape[0], q.shape[1]
    o = torch.empty(h, L, v.shape[2], dtype=torch.float64, device=q.device)
    s = s0.clone()
    for c0 in range(0, L, c):
        c1 = min(L, c0 + c)
        qc, kc, vc, bc = q[:, c0:c1], k[:, c0:c1], v[:, c0:c1], beta[:, c0:c1]
        G = torch.cumsum(g[:, c0:c1], dim=1)
        n_ = c1 - c0
        D = G[:, :, None] - G[:, None, :]
        tri = torch.ones(n_, n_, dtype=torch.bool, device=q.device)
        strict, incl = torch.tril(tri, -1), torch.tril(tri)
        A = (bc[:, :, None] * (kc @ kc.transpose(1, 2))) * torch.exp(D.masked_fill(~strict, float("-inf")))
        eG = torch.exp(G)[:, :, None]
        rhs = bc[:, :, None] * (vc - eG * (kc @ s))
        dl = torch.linalg.solve_triangular(A, rhs, upper=False, unitriangular=True)
        M = (qc @ kc.transpose(1, 2)) * torch.exp(D.masked_fill(~incl, float("-inf")))
        o[:, c0:c1] = eG * (qc @ s) + M @ dl
        GL = G[:, -1]
        s = torch.exp(GL)[:, None, None] * s + (kc * torch.exp(GL[:, None] - G)[:, :, None]).transpose(1, 2) @ dl
    return o, s


def ref_token(q, k, v, g, beta, s0):
    """float64 token-by-token recurrence (DESIGN.md): S *= e^g; d = beta (v - S^T k); S += k d^T; o = S^T q."""
    s = s0.clone()
    o = torch.empty(q.shape[0], q.shape[1], v.shape[2], dtype=torch.float64, device=q.device)
    for t in range(q.shape[1]):
        s = s * torch.exp(g[:, t])[:, None, None]
        d = beta[:, t, None] * (v[:, t] - torch.einsum("hk,hkv->hv", k[:, t], s))
        s = s + k[:, t, :, None] * d[:, None, :]
        o[:, t] = torch.einsum("hk,hkv->hv", q[:, t], s)
    return o, s


def rel(a, b):
    a, b = a.double().reshape(-1), b.double().reshape(-1)
    if not torch.isfinite(a).all():
        return float("nan")
    return (torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b).clamp_min(1e-300)).item()


def role_ref(names):
    meta = {}
    for i, name in enumerate(names):
        t1 = time.time()
        x = inputs(name)
        q, k, v, g, beta = prep64(x)
        o = torch.empty(x["t"], x["hv"], V, dtype=torch.float32)
        ss = []
        for j in range(x["n"]):
            a, e = x["cu"][j], x["cu"][j + 1]
            s0 = x["pool"][x["slots"][j].long()].double()
            if i == 0 and j == 0 and ARGS.selfcheck_t:
                L = min(ARGS.selfcheck_t, e - a)
                oc, sc = ref_chunked(q[:, a:a + L], k[:, a:a + L], v[:, a:a + L], g[:, a:a + L], beta[:, a:a + L], s0)
                ot, st = ref_token(q[:, a:a + L], k[:, a:a + L], v[:, a:a + L], g[:, a:a + L], beta[:, a:a + L], s0)
                meta["selfcheck"] = {"case": name, "tokens": L, "relerr_o_chunked_vs_token": rel(oc, ot),
                                     "relerr_s_chunked_vs_token": rel(sc, st)}
                log(f"self-check {meta['selfcheck']}")
            oj, sj = ref_chunked(q[:, a:e], k[:, a:e], v[:, a:e], g[:, a:e], beta[:, a:e], s0)
            o[a:e] = oj.transpose(0, 1).float().cpu()
            ss.append(sj)
        s = torch.stack(ss)
        save(name, "ref", o, s, {"checksum": x["checksum"]})
        meta[name] = {"s": round(time.time() - t1, 2), "o_rms": o.pow(2).mean().sqrt().item(),
                      "s_rms": s.pow(2).mean().sqrt().item(), "g_mean": x["g"].mean().item(),
                      "g_median": x["g"].median().item(), "beta_mean": x["beta"].mean().item()}
        log(f"{name}: {meta[name]}")
        del x, q, k, v, g, beta
        torch.cuda.empty_cache()
    return meta


# ------------------------------------------------------------------------------------------ deltakit (ctypes)
def dk_call(dk, x, pool, o, variant):
    return dk.make(x["q"], x["k"], x["v"], x["g"], x["beta"], x["cu32"], x["slots"], pool, o, x["hk"], x["hv"], variant)


def role_dk(names):
    dk = DkSplitPrefill(ARGS.dk_lib)
    tag = ARGS.tag or ("dk" if ARGS.variant == SPLIT_VARIANT else f"dk{ARGS.variant}")
    meta = {}
    for name in names:
        x = inputs(name)
        pool = x["pool"].clone()
        o = torch.full((x["t"], x["hv"], V), float("nan"), device=DEV, dtype=torch.bfloat16)
        dk_call(dk, x, pool, o, ARGS.variant)()
        torch.cuda.synchronize()
        save(name, tag, o, pool[x["slots"].long()], {"checksum": x["checksum"]})
        # canary slots untouched (as the tests check)
        live = torch.zeros(pool.shape[0], dtype=torch.bool, device=DEV)
        live[x["slots"].long()] = True
        meta[name] = {"variant": ARGS.variant, "canaries_intact": bool(torch.equal(pool[~live], x["pool"][~live]))}
        log(f"{name}: {tag} done {meta[name]}")
        del x, pool, o
        torch.cuda.empty_cache()
    return meta


# ------------------------------------------------------------------------------------------ anchors
def role_fi(names):
    import flashinfer.gdn_prefill as fip
    fi = fip.chunk_gated_delta_rule
    meta = {}
    for name in names:
        x = inputs(name)
        pool = x["pool"].transpose(-1, -2).contiguous()  # [P, H_v, V, K]
        o = torch.full((x["t"], x["hv"], V), float("nan"), device=DEV, dtype=torch.bfloat16)
        alpha = x["g"].exp().contiguous()
        t1 = time.time()
        fi(x["q"], x["k"], x["v"], alpha, x["beta"], None, initial_state=pool, output_final_state=True,
           cu_seqlens=x["cu32"], use_qk_l2norm_in_kernel=True, output=o, output_state=pool, state_indices=x["slots"],
           max_seqlen=max(x["lens"]), use_cp="auto")
        torch.cuda.synchronize()
        meta[name] = {"first_call_s": round(time.time() - t1, 1)}
        save(name, "fi", o, pool[x["slots"].long()].transpose(-1, -2), {"checksum": x["checksum"]})
        log(f"{name}: {meta[name]}")
        del x, pool, o
        torch.cuda.empty_cache()
    return meta


def role_fla(names):
    import triton.runtime.autotuner as at
    orig_init = at.Autotuner.__init__

    def first_config(self, fn, arg_names, configs=None, *a, **kw):  # one config: no autotune (time), same arithmetic
        if configs is None:
            configs = kw.pop("configs")
        orig_init(self, fn, arg_names, list(configs)[:1], *a, **kw)
    at.Autotuner.__init__ = first_config  # FLA's fla_cache_autotune (CachedAutotuner) and triton.autotune both
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla
    meta = {}
    for name in names:
        x = inputs(name)
        h0 = x["pool"][x["slots"].long()].transpose(-1, -2).contiguous()  # [N, H_v, V, K]
        t1 = time.time()
        o, ht = fla(x["q"][None], x["k"][None], x["v"][None], x["g"][None], x["beta"].bfloat16()[None],
                    initial_state=h0, output_final_state=True, cu_seqlens=x["cu32"].long(),
                    cu_seqlens_cpu=torch.tensor(x["cu"]), use_qk_l2norm_in_kernel=True, state_v_first=True)
        torch.cuda.synchronize()
        meta[name] = {"first_call_s": round(time.time() - t1, 1)}
        save(name, "fla", o[0], ht.transpose(-1, -2), {"checksum": x["checksum"]})
        log(f"{name}: {meta[name]}")
        del x, h0, o, ht
        torch.cuda.empty_cache()
    return meta


# ------------------------------------------------------------------------------------------ merge
def role_merge(names):
    rows = []
    metas = {}
    for p in sorted(Path(ARGS.dir).glob("meta_*.json")):
        metas[p.stem[5:]] = json.load(open(p))
    for name in names:
        p = os.path.join(ARGS.dir, f"ref_{name}.pt")
        if not os.path.exists(p):
            rows.append({"case": name, "error": "no reference"})
            continue
        ref = torch.load(p)
        ro, rs = ref["o"].to(DEV), ref["s"].to(DEV)
        hk, hv, lens, gates, keys, _ = CASES[name]
        row = {"case": name, "H_k/H_v": f"{hk}/{hv}", "lens": lens if len(lens) > 1 else lens[0], "gates": gates,
               "keys": keys}
        outs = {}
        for lib in LIBS:
            p = os.path.join(ARGS.dir, f"{lib}_{name}.pt")
            if not os.path.exists(p):
                row[lib] = None
                continue
            d = torch.load(p)
            o, s = d["o"].to(DEV), d["s"].to(DEV)
            outs[lib] = (o, s)
            same = abs(d.get("checksum", 0.0) - ref["checksum"]) <= 1e-9 * abs(ref["checksum"])
            row[lib] = {"o": rel(o, ro), "s": rel(s, rs), "same_inputs": same}
            # error of the last 1024 tokens (where the state error has accumulated) and the worst sequence's state
            row[lib]["o_tail"] = rel(o[-1024:], ro[-1024:])
            if len(lens) > 1:
                row[lib]["s_worst_seq"] = max(rel(s[i], rs[i]) for i in range(len(lens)))
        # the bf16 rounding floor of the output: the reference rounded to bf16
        row["o_bf16_floor"] = rel(ro.bfloat16(), ro)
        if "fi" in outs and "fla" in outs:
            row["fi_vs_fla"] = {"o": rel(outs["fi"][0], outs["fla"][0]), "s": rel(outs["fi"][1], outs["fla"][1])}
        rows.append(row)
        del ref, ro, rs, outs
        torch.cuda.empty_cache()
    res = {"meta": metas, "rows": rows, "contract": {"o": 1e-2, "s": 1e-3}}
    if ARGS.out:
        json.dump(res, open(ARGS.out, "w"), indent=1)
    f = lambda r, lib, kk: "-" if not r.get(lib) else f"{r[lib][kk]:.2e}"  # noqa: E731
    names_ = {"dk": "dk", "fi": "FI", "fla": "FLA"}
    print("| case | H_k/H_v | gates / keys | " + " | ".join(f"{names_.get(lib, lib)} out | {names_.get(lib, lib)} state"
                                                     for lib in LIBS) + " | bf16 floor |")
    print("| --- " * (4 + 2 * len(LIBS)) + "|")
    for r in rows:
        if "error" in r:
            print(f"| {r['case']} | {r['error']} |")
            continue
        print(f"| {r['case']} | {r['H_k/H_v']} | {r['gates']} / {r['keys']} | " +
              " | ".join(f"{f(r, lib, 'o')} | {f(r, lib, 's')}" for lib in LIBS) + f" | {r['o_bf16_floor']:.2e} |")
    bad = [(r["case"], lib) for r in rows for lib in LIBS if r.get(lib) and not r[lib]["same_inputs"]]
    if bad:
        print(f"INPUT CHECKSUM MISMATCH (not the reference's inputs): {bad}")
    sc = metas.get("ref", {}).get("selfcheck")
    if sc:
        print(f"reference self-check (f64 chunked vs f64 token recurrence, {sc['case']} first {sc['tokens']} tokens): "
              f"out {sc['relerr_o_chunked_vs_token']:.1e} state {sc['relerr_s_chunked_vs_token']:.1e}")
    return res


def main():
    os.makedirs(ARGS.dir, exist_ok=True)
    names = [c for c in ARGS.cases.split(",") if c]
    torch.set_grad_enabled(False)
    fn = {"ref": role_ref, "dk": role_dk, "fi": role_fi, "fla": role_fla, "merge": role_merge}[ARGS.role]
    base = ARGS.tag or (f"dk{ARGS.variant}" if ARGS.role == "dk" and ARGS.variant != SPLIT_VARIANT else ARGS.role)
    tag = base if names == DEFAULT_CASES else base + "_" + "_".join(names)
    try:
        meta = fn(names)
        if ARGS.role != "merge":
            json.dump(meta, open(os.path.join(ARGS.dir, f"meta_{tag}.json"), "w"), indent=1)
    except Exception:  # noqa: BLE001
        log(traceback.format_exc()[-3000:])
        sys.exit(1)
    log("done")


if __name__ == "__main__":
    main()
