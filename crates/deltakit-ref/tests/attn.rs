//! Property tests of the attention pieces: partial RoPE, paged == contiguous attention, decode ==
//! last prefill row, GQA against an f64 reference, and the q/gate split + output gate.
// Exact float comparisons are deliberate here (bit-identity invariants, hand-computed values).
#![allow(clippy::float_cmp, clippy::too_many_lines, clippy::needless_range_loop)]

mod common;

use common::{check, check_multi, rel_err, rel_err64, rng, uniform};
use deltakit_ref::attn::{self, AttnDims, KvDims, PageTable, RopeParams};
use proptest::prelude::*;
use rand::seq::SliceRandom;
use rand::Rng;

#[test]
fn rope_pass_dims_identical_and_vs_f64() {
    let strat = (
        1usize..4,
        prop::sample::select(vec![(8usize, 2usize), (16, 4), (32, 8), (16, 16), (12, 6)]),
        1usize..10,
        any::<u64>(),
    );
    check(
        "attn.rope_vs_f64_pass_dims_bit_identical",
        128,
        1e-6,
        strat,
        |(h, (hd, rd), t, seed)| {
            let mut r = rng(seed);
            let p = RopeParams { head_dim: hd, rotary_dim: rd, theta: 10_000_000.0 };
            let x0 = uniform(&mut r, t * h * hd, 2.0);
            let pos: Vec<i64> = (0..t).map(|_| r.gen_range(0..100_000)).collect();
            let mut x = x0.clone();
            attn::rope_neox(&mut x, h, &pos, p).unwrap();
            let mut reference = vec![0f64; x.len()];
            let half = rd / 2;
            for tok in 0..t {
                for hh in 0..h {
                    let o = (tok * h + hh) * hd;
                    for d in rd..hd {
                        if x[o + d].to_bits() != x0[o + d].to_bits() {
                            return f64::INFINITY;
                        }
                        reference[o + d] = f64::from(x0[o + d]);
                    }
                    for i in 0..half {
                        let inv = 1.0 / 10_000_000f64.powf(2.0 * i as f64 / rd as f64);
                        let ang = f64::from(pos[tok] as f32 * inv as f32);
                        let (x1, x2) = (f64::from(x0[o + i]), f64::from(x0[o + i + half]));
                        reference[o + i] = x1 * ang.cos() - x2 * ang.sin();
                        reference[o + i + half] = x2 * ang.cos() + x1 * ang.sin();
                    }
                }
            }
            rel_err64(&x, &reference)
        },
    );
}

/// f64 causal GQA attention, contiguous keys, bottom-right aligned.
fn attn_ref(q: &[f32], k: &[f32], v: &[f32], lq: usize, lk: usize, d: AttnDims) -> Vec<f64> {
    let hd = d.head_dim;
    let grp = d.n_q_heads / d.n_kv_heads;
    let mut out = vec![0f64; lq * d.n_q_heads * hd];
    for j in 0..lq {
        for h in 0..d.n_q_heads {
            let qo = (j * d.n_q_heads + h) * hd;
            let n = lk - lq + j + 1;
            let s: Vec<f64> = (0..n)
                .map(|p| {
                    let ko = (p * d.n_kv_heads + h / grp) * hd;
                    (0..hd).map(|e| f64::from(q[qo + e]) * f64::from(k[ko + e])).sum::<f64>()
                        / (hd as f64).sqrt()
                })
                .collect();
            let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
            for (p, sp) in s.iter().enumerate() {
                let ko = (p * d.n_kv_heads + h / grp) * hd;
                for e in 0..hd {
                    out[qo + e] += (sp - m).exp() / z * f64::from(v[ko + e]);
                }
            }
        }
    }
    out
}

#[test]
fn paged_equals_contiguous_and_decode_equals_last_row() {
    let strat = (
        1usize..=3,
        1usize..=2,
        prop::sample::select(vec![4usize, 8, 16]),
        prop::sample::select(vec![1usize, 2, 4, 16]),
        prop::collection::vec((0usize..20, 1usize..10), 1..4),
        any::<u64>(),
    );
    let names = [
        ("attn.paged_eq_contiguous", 0.0),
        ("attn.decode_eq_last_prefill_row", 0.0),
        ("attn.prefill_gqa_vs_f64", 1e-6),
    ];
    check_multi(&names, 160, strat, |(grp, hkv, hd, ps, lens, seed)| {
        let mut r = rng(seed);
        let d = AttnDims { n_q_heads: hkv * grp, n_kv_heads: hkv, head_dim: hd };
        let kvd = KvDims { page_size: ps, n_kv_heads: hkv, head_dim: hd };
        let n = lens.len();
        let max_pages = lens.iter().map(|&(c, l)| (c + l).div_ceil(ps)).max().unwrap() + 1;
        let num_pages = n * max_pages + 3;
        let mut ids: Vec<i32> = (0..num_pages as i32).collect();
        ids.shuffle(&mut r);
        let table: Vec<i32> = ids[..n * max_pages].to_vec();
        let pages = PageTable { table: &table, max_pages };
        let row = hkv * hd;
        let mut kc = vec![f32::NAN; num_pages * ps * row];
        let mut vc = kc.clone();
        // Keys/values per sequence (context + new), queries for the new tokens.
        let (mut kall, mut vall, mut q) = (Vec::new(), Vec::new(), Vec::new());
        let (mut cu_ctx, mut cu_new, mut cu_k) = (vec![0i32], vec![0i32], vec![0i32]);
        let ctx: Vec<i32> = lens.iter().map(|&(c, _)| c as i32).collect();
        let (mut kctx, mut vctx, mut knew, mut vnew) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for &(c, l) in &lens {
            let kk = uniform(&mut r, (c + l) * row, 1.0);
            let vv = uniform(&mut r, (c + l) * row, 1.0);
            kctx.extend_from_slice(&kk[..c * row]);
            vctx.extend_from_slice(&vv[..c * row]);
            knew.extend_from_slice(&kk[c * row..]);
            vnew.extend_from_slice(&vv[c * row..]);
            kall.extend_from_slice(&kk);
            vall.extend_from_slice(&vv);
            q.extend(uniform(&mut r, l * d.n_q_heads * hd, 1.5));
            cu_ctx.push(cu_ctx.last().unwrap() + c as i32);
            cu_new.push(cu_new.last().unwrap() + l as i32);
            cu_k.push(cu_k.last().unwrap() + (c + l) as i32);
        }
        let zeros = vec![0i32; n];
        attn::write_kv(&kctx, &vctx, &cu_ctx, &zeros, pages, kvd, &mut kc, &mut vc).unwrap();
        attn::write_kv(&knew, &vnew, &cu_new, &ctx, pages, kvd, &mut kc, &mut vc).unwrap();
        let mut outp = vec![f32::NAN; q.len()];
        attn::prefill_paged(&q, &kc, &vc, &cu_new, &ctx, pages, ps, d, None, &mut outp).unwrap();
        let mut outc = vec![f32::NAN; q.len()];
        attn::prefill_contiguous(&q, &kall, &vall, &cu_new, &cu_k, d, None, &mut outc).unwrap();
        // Decode: the last new token of each sequence, plus a padding row.
        let qrow = d.n_q_heads * hd;
        let mut qd = Vec::new();
        let mut seq_lens = Vec::new();
        let mut last_rows = Vec::new();
        for (i, &(c, l)) in lens.iter().enumerate() {
            let t_last = cu_new[i + 1] as usize - 1;
            qd.extend_from_slice(&q[t_last * qrow..(t_last + 1) * qrow]);
            last_rows.extend_from_slice(&outp[t_last * qrow..(t_last + 1) * qrow]);
            seq_lens.push((c + l) as i32);
        }
        qd.extend(uniform(&mut r, qrow, 1.0));
        seq_lens.push(-1);
        let mut table_d = table.clone();
        table_d.extend(std::iter::repeat_n(-1, max_pages));
        let mut outd = vec![f32::NAN; qd.len()];
        attn::decode_paged(
            &qd,
            &kc,
            &vc,
            &seq_lens,
            PageTable { table: &table_d, max_pages },
            ps,
            d,
            None,
            &mut outd,
        )
        .unwrap();
        if outd[n * qrow..].iter().any(|&v| v != 0.0) {
            return vec![f64::INFINITY; 3];
        }
        // f64 reference per sequence.
        let mut reference = Vec::new();
        for (i, &(c, l)) in lens.iter().enumerate() {
            let (qs, ks) = (cu_new[i] as usize * qrow, cu_k[i] as usize * row);
            reference.extend(attn_ref(
                &q[qs..qs + l * qrow],
                &kall[ks..ks + (c + l) * row],
                &vall[ks..ks + (c + l) * row],
                l,
                c + l,
                d,
            ));
        }
        vec![
            rel_err(&outp, &outc),
            rel_err(&outd[..n * qrow], &last_rows),
            rel_err64(&outp, &reference),
        ]
    });
}

#[test]
fn q_gate_split_and_output_gate() {
    let strat = (1usize..5, 1usize..4, 1usize..17, any::<u64>());
    check("attn.split_q_gate_output_gate", 64, 1e-6, strat, |(t, h, hd, seed)| {
        let mut r = rng(seed);
        let qp = uniform(&mut r, t * h * 2 * hd, 3.0);
        let (mut q, mut g) = (vec![f32::NAN; t * h * hd], vec![f32::NAN; t * h * hd]);
        attn::split_q_gate(&qp, h, hd, &mut q, &mut g).unwrap();
        for i in 0..t * h {
            if q[i * hd..(i + 1) * hd] != qp[i * 2 * hd..i * 2 * hd + hd]
                || g[i * hd..(i + 1) * hd] != qp[i * 2 * hd + hd..(i + 1) * 2 * hd]
            {
                return f64::INFINITY;
            }
        }
        let a = uniform(&mut r, q.len(), 2.0);
        let mut o = vec![f32::NAN; q.len()];
        attn::output_gate(&a, &g, &mut o).unwrap();
        let reference: Vec<f64> =
            a.iter().zip(&g).map(|(&x, &y)| f64::from(x) / (1.0 + (-f64::from(y)).exp())).collect();
        rel_err64(&o, &reference)
    });
}
