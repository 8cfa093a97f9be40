//! Tiny hand-checked cases, error handling ("nothing written on error"), and the MLP / sampling
//! helpers.
// Exact float comparisons are deliberate here (bit-identity invariants, hand-computed values).
#![allow(clippy::float_cmp, clippy::too_many_lines, clippy::needless_range_loop)]

mod common;

use common::{check, rel_err64, rng, uniform};
use deltakit_ref::attn::{self, AttnDims, KvDims, PageTable, RopeParams};
use deltakit_ref::conv1d::{self, ConvDims};
use deltakit_ref::gdr::{self, GdrDims, GdrInputs, GdrOptions};
use deltakit_ref::{mlp, norm, sample, RefError, Varlen};
use half::bf16;
use proptest::prelude::*;

fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

#[test]
fn gdr_one_token_by_hand() {
    // K = V = 2, S0 = [[1, 2], [3, 4]] (rows over K), g = ln 0.5, beta = 0.5, k = e0, q = e1, v = 1.
    // S = 0.5 S0 = [[.5, 1], [1.5, 2]]; S^T k = [.5, 1]; delta = .5 ([1, 1] - [.5, 1]) = [.25, 0];
    // S += k (x) delta -> [[.75, 1], [1.5, 2]]; o = S^T q = [1.5, 2].
    let d = GdrDims { h_k: 1, h_v: 1, k: 2, v: 2 };
    let inp = GdrInputs {
        q: &[0.0f32, 1.0],
        k: &[1.0, 0.0],
        v: &[1.0, 1.0],
        g: &[0.5f32.ln()],
        beta: &[0.5],
    };
    let opts = GdrOptions { use_qk_l2norm: false, scale: Some(1.0) };
    let mut st = vec![1.0f32, 2.0, 3.0, 4.0];
    let mut out = vec![0f32; 2];
    gdr::recurrent_prefill(&inp, d, Varlen::new(&[0, 1], &[0]), opts, &mut st, &mut out).unwrap();
    assert_eq!(out, [1.5, 2.0]);
    assert_eq!(st, [0.75, 1.0, 1.5, 2.0]);
    let mut st = vec![1.0f32, 2.0, 3.0, 4.0];
    gdr::chunk_prefill(&inp, d, Varlen::new(&[0, 1], &[0]), opts, 16, &mut st, &mut out).unwrap();
    assert!(rel_err64(&out, &[1.5, 2.0]) < 1e-7 && rel_err64(&st, &[0.75, 1.0, 1.5, 2.0]) < 1e-7);
    let mut st = vec![1.0f32, 2.0, 3.0, 4.0];
    gdr::decode(&inp, d, &[0], opts, &mut st, &mut out).unwrap();
    assert_eq!(out, [1.5, 2.0]);
    // Padding row: zero output, state untouched.
    let mut st = vec![1.0f32, 2.0, 3.0, 4.0];
    let mut out = vec![f32::NAN; 2];
    gdr::decode(&inp, d, &[-1], opts, &mut st, &mut out).unwrap();
    assert_eq!((out, st), (vec![0.0, 0.0], vec![1.0, 2.0, 3.0, 4.0]));
}

#[test]
fn gdr_full_decay_by_hand() {
    // g = -inf (exp(A_log) overflowing) is a full decay: exp(-inf) = 0. K = V = 2, no L2 norm,
    // scale 1, beta 0.5, k = e0, v = [1, 1], S0 = [[1, 2], [3, 4]].
    // Token 0: g = ln 0.5, q = e1 -> S = [[.75, 1], [1.5, 2]], o = [1.5, 2] (gdr_one_token_by_hand).
    // Token 1: g = -inf, q = [1, 1] -> S = 0; S^T k = 0; delta = .5 [1, 1]; S = [[.5, .5], [0, 0]];
    // o = S^T q = [.5, .5].
    let d = GdrDims { h_k: 1, h_v: 1, k: 2, v: 2 };
    let inp = GdrInputs {
        q: &[0.0f32, 1.0, 1.0, 1.0],
        k: &[1.0, 0.0, 1.0, 0.0],
        v: &[1.0, 1.0, 1.0, 1.0],
        g: &[0.5f32.ln(), f32::NEG_INFINITY],
        beta: &[0.5, 0.5],
    };
    let opts = GdrOptions { use_qk_l2norm: false, scale: Some(1.0) };
    let (want_o, want_s) = ([1.5f32, 2.0, 0.5, 0.5], [0.5f32, 0.5, 0.0, 0.0]);
    let (want_o64, want_s64) = (want_o.map(f64::from), want_s.map(f64::from));
    let mut st = vec![1.0f32, 2.0, 3.0, 4.0];
    let mut out = vec![f32::NAN; 4];
    gdr::recurrent_prefill(&inp, d, Varlen::new(&[0, 2], &[0]), opts, &mut st, &mut out).unwrap();
    assert_eq!((out.clone(), st.clone()), (want_o.to_vec(), want_s.to_vec()));
    for chunk in gdr::CHUNK_SIZES {
        let mut st = vec![1.0f32, 2.0, 3.0, 4.0];
        let mut out = vec![f32::NAN; 4];
        gdr::chunk_prefill(&inp, d, Varlen::new(&[0, 2], &[0]), opts, chunk, &mut st, &mut out)
            .unwrap();
        assert!(
            rel_err64(&out, &want_o64) < 1e-7 && rel_err64(&st, &want_s64) < 1e-7,
            "chunk {chunk}: {out:?} {st:?}"
        );
    }
    // Decode of token 1 alone from S = [[.75, 1], [1.5, 2]].
    let one = GdrInputs {
        q: &inp.q[2..],
        k: &inp.k[2..],
        v: &inp.v[2..],
        g: &inp.g[1..],
        beta: &inp.beta[1..],
    };
    let mut st = vec![0.75f32, 1.0, 1.5, 2.0];
    let mut out = vec![f32::NAN; 2];
    gdr::decode(&one, d, &[0], opts, &mut st, &mut out).unwrap();
    assert_eq!((out, st), (vec![0.5, 0.5], want_s.to_vec()));
    // The gating gives -inf when exp(A_log) overflows (A_log = 100, softplus(1) > 0).
    let (mut g, mut beta) = (vec![0f32; 1], vec![0f32; 1]);
    gdr::gating(&[1.0], &[0.0], &[100.0], &[0.0], &mut g, &mut beta).unwrap();
    assert_eq!(g[0], f32::NEG_INFINITY);
}

#[test]
fn gating_by_hand() {
    let (mut g, mut beta) = (vec![0f32; 3], vec![0f32; 3]);
    // H_v = 1: a + dt_bias in {0, 100, -100}; A_log = 0 (exp = 1).
    gdr::gating(&[0.5, 100.5, -99.5], &[0.0, 50.0, -50.0], &[0.0], &[-0.5], &mut g, &mut beta)
        .unwrap();
    assert!((g[0] + 2f32.ln()).abs() < 1e-7);
    assert_eq!(g[1], -100.0);
    assert!(g[2] < 0.0 && g[2] > -1e-40 || g[2] == 0.0, "{}", g[2]);
    assert_eq!(beta[0], 0.5);
    assert_eq!(beta[1], 1.0);
    assert!(beta[2] > 0.0 && beta[2] < 1e-21);
    assert_eq!(gdr::softplus(1000.0), 1000.0);
    assert!(gdr::softplus(-100.0) > 0.0 && gdr::softplus(-100.0).is_finite());
    assert_eq!(gdr::sigmoid(-1000.0), 0.0);
}

#[test]
fn conv_w2_by_hand() {
    // conv_dim 1, weight [0.5, 2] (tap 1 = newest), bias 0.1, state [3], x = [1, -1].
    let cd = ConvDims { conv_dim: 1, width: 2 };
    let mut st = vec![3.0f32];
    let mut out = vec![0f32; 2];
    conv1d::prefill(
        &[1.0, -1.0],
        &[0.5, 2.0],
        Some(&[0.1]),
        cd,
        Varlen::new(&[0, 2], &[0]),
        &mut st,
        &mut out,
    )
    .unwrap();
    assert!(rel_err64(&out, &[silu(3.6), silu(-1.4)]) < 1e-7);
    assert_eq!(st, [-1.0]);
    // Without initial state the history is zeros.
    let mut st = vec![3.0f32];
    let vl = Varlen { cu_seqlens: &[0, 2], slots: &[0], has_initial_state: Some(&[false]) };
    conv1d::prefill(&[1.0, -1.0], &[0.5, 2.0], Some(&[0.1]), cd, vl, &mut st, &mut out).unwrap();
    assert!(rel_err64(&out, &[silu(2.1), silu(-1.4)]) < 1e-7);
    // Update padding row: zeros, state untouched.
    let mut st = vec![3.0f32];
    let mut out = vec![f32::NAN; 1];
    conv1d::update(&[1.0], &[0.5, 2.0], None, cd, 1, &[-1], &mut st, &mut out).unwrap();
    assert_eq!((out[0], st[0]), (0.0, 3.0));
}

#[test]
fn rope_position_zero_is_identity() {
    let p = RopeParams { head_dim: 8, rotary_dim: 4, theta: 10_000.0 };
    let x0: Vec<f32> = (0..16).map(|i| i as f32 * 0.37 - 2.0).collect();
    let mut x = x0.clone();
    attn::rope_neox(&mut x, 2, &[0], p).unwrap();
    assert_eq!(x, x0);
    let xb0: Vec<bf16> = x0.iter().map(|&v| bf16::from_f32(v)).collect();
    let mut xb = xb0.clone();
    attn::rope_neox(&mut xb, 2, &[0], p).unwrap();
    assert_eq!(xb, xb0);
}

#[test]
fn rms_of_constant_vector() {
    // x = c everywhere: x_hat = c / sqrt(c^2 + eps); with w = 0 the (1 + w) norm gives that.
    let x = vec![3.0f32; 8];
    let mut y = vec![0f32; 8];
    norm::rms_norm(&x, &[0.0; 8], 1e-6, &mut y).unwrap();
    let e = 3.0 / (9.0f64 + 1e-6).sqrt();
    assert!(y.iter().all(|&v| (f64::from(v) - e).abs() < 1e-7));
    norm::rms_norm(&x, &[1.0; 8], 1e-6, &mut y).unwrap();
    assert!(y.iter().all(|&v| (f64::from(v) - 2.0 * e).abs() < 1e-6));
}

#[test]
fn matmul_embedding_sampling_by_hand() {
    // [[1, 2], [3, 4]] x W^T with W = [[1, 0], [0, 1], [1, 1]].
    let mut y = vec![0f32; 6];
    mlp::matmul(&[1.0f32, 2.0, 3.0, 4.0], &[1.0, 0.0, 0.0, 1.0, 1.0, 1.0], 2, 3, &mut y).unwrap();
    assert_eq!(y, [1.0, 2.0, 3.0, 3.0, 4.0, 7.0]);
    let mut e = vec![0f32; 4];
    mlp::embedding(&[2, 0], &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], 2, &mut e).unwrap();
    assert_eq!(e, [5.0, 6.0, 1.0, 2.0]);
    let mut am = vec![9u32; 2];
    sample::argmax(&[1.0f32, 3.0, 3.0, 0.0, f32::NEG_INFINITY, -1.0, -1.0, -5.0], 4, &mut am)
        .unwrap();
    assert_eq!(am, [1, 1]);
    let tk = sample::topk_logprobs(&[1.0f32, 3.0, 3.0, 0.0], 4, 3).unwrap();
    let ids: Vec<u32> = tk[0].iter().map(|p| p.0).collect();
    assert_eq!(ids, [1, 2, 0]);
    let lse = (1f64.exp() + 2.0 * 3f64.exp() + 1.0).ln();
    assert!((f64::from(tk[0][0].1) - (3.0 - lse)).abs() < 1e-6);
    assert!((f64::from(tk[0][2].1) - (1.0 - lse)).abs() < 1e-6);
    let mut o = vec![0f32; 2];
    mlp::silu_and_mul(&[1.0f32, 2.0, 3.0, 4.0], 2, &mut o).unwrap();
    assert!(rel_err64(&o, &[silu(1.0) * 3.0, silu(2.0) * 4.0]) < 1e-7);
}

#[test]
fn matmul_vs_f64() {
    let strat = (1usize..20, 1usize..70, 1usize..30, any::<u64>());
    check("mlp.matmul_vs_f64_rel_to_sum_abs_terms", 64, 1e-6, strat, |(m, k, n, seed)| {
        let mut r = rng(seed);
        let x = uniform(&mut r, m * k, 1.0);
        let w = uniform(&mut r, n * k, 1.0);
        let mut y = vec![f32::NAN; m * n];
        mlp::matmul(&x, &w, k, n, &mut y).unwrap();
        let mut reference = vec![0f64; m * n];
        let mut mag = 0f64;
        for i in 0..m {
            for j in 0..n {
                let terms = (0..k).map(|l| f64::from(x[i * k + l]) * f64::from(w[j * k + l]));
                reference[i * n + j] = terms.clone().sum();
                mag += terms.map(f64::abs).sum::<f64>().powi(2);
            }
        }
        // Error relative to ||sum |x w| || (f32 accumulation bound; cancellation-safe).
        if y.iter().any(|v| !v.is_finite()) {
            return f64::INFINITY;
        }
        let num: f64 = y.iter().zip(&reference).map(|(&a, r)| (f64::from(a) - r).powi(2)).sum();
        num.sqrt() / mag.sqrt()
    });
}

#[test]
fn topk_logprobs_vs_f64() {
    let strat = (1usize..4, 1usize..300, 0usize..8, any::<u64>());
    check("sample.topk_logprobs_vs_f64", 96, 1e-6, strat, |(n, vocab, k, seed)| {
        let k = k.min(vocab);
        let mut r = rng(seed);
        let logits = uniform(&mut r, n * vocab, 20.0);
        let tk = sample::topk_logprobs(&logits, vocab, k).unwrap();
        let mut am = vec![0u32; n];
        sample::argmax(&logits, vocab, &mut am).unwrap();
        let mut got = Vec::new();
        let mut reference = Vec::new();
        for (row, (lr, a)) in logits.chunks_exact(vocab).zip(tk.iter().zip(&am)) {
            let lse = row.iter().map(|&v| f64::from(v).exp()).sum::<f64>().ln();
            let mut idx: Vec<usize> = (0..vocab).collect();
            idx.sort_by(|&i, &j| row[j].total_cmp(&row[i]).then(i.cmp(&j)));
            if k > 0 && lr[0].0 != *a {
                return f64::INFINITY;
            }
            for (p, &i) in lr.iter().zip(&idx) {
                if p.0 as usize != i {
                    return f64::INFINITY;
                }
                got.push(p.1);
                reference.push(f64::from(row[i]) - lse);
            }
        }
        // Log-probabilities can be ~0 (vocab 1): relative to max(||ref||, 1).
        let num: f64 = got.iter().zip(&reference).map(|(&g, r)| (f64::from(g) - r).powi(2)).sum();
        let den: f64 = reference.iter().map(|r| r * r).sum();
        if got.iter().any(|g| !g.is_finite()) {
            return f64::INFINITY;
        }
        num.sqrt() / den.sqrt().max(1.0)
    });
}

#[test]
fn errors_name_argument_and_write_nothing() {
    let d = GdrDims { h_k: 1, h_v: 2, k: 2, v: 3 };
    let q = vec![0.5f32; 2 * 2];
    let v = vec![0.5f32; 2 * 6];
    let g = vec![-0.1f32; 4];
    let inp = GdrInputs { q: &q, k: &q, v: &v, g: &g, beta: &g };
    let o = GdrOptions::default();
    let st0 = vec![7.0f32; 2 * d.state_per_slot()];
    let run = |cu: &[i32], slots: &[i32], chunk: usize| {
        let mut st = st0.clone();
        let mut out = vec![-3.0f32; 12];
        let r = if chunk == 0 {
            gdr::recurrent_prefill(&inp, d, Varlen::new(cu, slots), o, &mut st, &mut out)
        } else {
            gdr::chunk_prefill(&inp, d, Varlen::new(cu, slots), o, chunk, &mut st, &mut out)
        };
        assert!(st == st0 && out.iter().all(|&x| x == -3.0), "wrote on error {r:?}");
        r.unwrap_err()
    };
    assert!(matches!(run(&[0, 1, 2], &[0, 0], 0), RefError::Invalid { what: "slots", .. }));
    assert!(matches!(run(&[0, 1, 2], &[0, 2], 0), RefError::Invalid { what: "slots", .. }));
    assert!(matches!(run(&[0, 2, 1], &[0, 1], 0), RefError::Invalid { what: "cu_seqlens", .. }));
    assert!(matches!(run(&[1, 2], &[0], 0), RefError::Invalid { what: "cu_seqlens", .. }));
    assert!(matches!(run(&[0, 1], &[0], 0), RefError::Shape { what: "cu_seqlens", .. }));
    assert!(matches!(run(&[0, 1, 2], &[0], 0), RefError::Shape { what: "slots", .. }));
    assert!(matches!(run(&[0, 2], &[0], 8), RefError::Unsupported { what: "chunk_size", .. }));
    let gp = vec![0.1f32; 4];
    let mut st = st0.clone();
    let mut out = vec![0f32; 12];
    let e = gdr::chunk_prefill(
        &GdrInputs { g: &gp, ..inp },
        d,
        Varlen::new(&[0, 2], &[0]),
        o,
        16,
        &mut st,
        &mut out,
    );
    assert!(matches!(e, Err(RefError::Invalid { what: "g", .. })));
    let bad = GdrDims { h_k: 2, h_v: 3, k: 2, v: 3 };
    let e = gdr::recurrent_prefill(&inp, bad, Varlen::new(&[0, 2], &[0]), o, &mut st, &mut out);
    assert!(matches!(e, Err(RefError::Shape { what: "dims.h_v", .. })));
    // Error messages name the op.
    assert!(run(&[0, 1, 2], &[0, 0], 0).to_string().starts_with("gdr.recurrent_prefill"));

    // conv width 5, wrong bias length.
    let mut cst = vec![1.0f32; 8];
    let mut out = vec![0f32; 2];
    let e = conv1d::prefill(
        &[1.0, 2.0],
        &[0.0; 10],
        None,
        ConvDims { conv_dim: 2, width: 5 },
        Varlen::new(&[0, 1], &[0]),
        &mut cst,
        &mut out,
    );
    assert!(matches!(e, Err(RefError::Unsupported { what: "dims.width", .. })));
    let e = conv1d::update(
        &[1.0, 2.0],
        &[0.0; 8],
        Some(&[0.0]),
        ConvDims { conv_dim: 2, width: 4 },
        1,
        &[0],
        &mut cst[..6],
        &mut out,
    );
    assert!(matches!(e, Err(RefError::Shape { what: "bias", .. })));
    assert!(out == [0.0, 0.0] && cst.iter().all(|&x| x == 1.0));

    // Attention: page id out of range, duplicate cache rows, decode seq_len 0.
    let kvd = KvDims { page_size: 2, n_kv_heads: 1, head_dim: 2 };
    let (mut kc, mut vc) = (vec![0f32; 8], vec![0f32; 8]);
    let e = attn::write_kv(
        &[1.0f32; 2],
        &[1.0; 2],
        &[0, 1],
        &[0],
        PageTable { table: &[5], max_pages: 1 },
        kvd,
        &mut kc,
        &mut vc,
    );
    assert!(matches!(e, Err(RefError::Invalid { what: "page_table", .. })));
    let e = attn::write_kv(
        &[1.0f32; 4],
        &[1.0; 4],
        &[0, 1, 2],
        &[0, 0],
        PageTable { table: &[1, 1], max_pages: 1 },
        kvd,
        &mut kc,
        &mut vc,
    );
    assert!(matches!(e, Err(RefError::Invalid { what: "page_table", .. })));
    assert!(kc.iter().all(|&x| x == 0.0));
    let ad = AttnDims { n_q_heads: 1, n_kv_heads: 1, head_dim: 2 };
    let mut o2 = vec![0f32; 2];
    let e = attn::decode_paged(
        &[1.0f32; 2],
        &kc,
        &vc,
        &[0],
        PageTable { table: &[0], max_pages: 1 },
        2,
        ad,
        None,
        &mut o2,
    );
    assert!(matches!(e, Err(RefError::Invalid { what: "seq_lens", .. })));
    let e = attn::rope_neox(
        &mut [0f32; 4],
        1,
        &[0],
        RopeParams { head_dim: 4, rotary_dim: 3, theta: 1e4 },
    );
    assert!(matches!(e, Err(RefError::Invalid { what: "params.rotary_dim", .. })));

    // MLP / sampling.
    let e = mlp::embedding(&[3], &[0f32; 6], 2, &mut [0f32; 2]);
    assert!(matches!(e, Err(RefError::Invalid { what: "ids", .. })));
    let e = sample::argmax(&[0f32, f32::NAN], 2, &mut [0u32; 1]);
    assert!(matches!(e, Err(RefError::Invalid { what: "logits", .. })));
    let e = mlp::matmul(&[0f32; 6], &[0f32; 4], 3, 2, &mut [0f32; 4]);
    assert!(matches!(e, Err(RefError::Shape { what: "w", .. })));
    let e = norm::rms_norm(&[0f32; 5], &[0f32; 2], 1e-6, &mut [0f32; 5]);
    assert!(matches!(e, Err(RefError::Shape { what: "x", .. })));
}

#[test]
fn bf16_single_rounding_ops_equal_rounded_f32() {
    // Ops whose only bf16 rounding is at the output: the bf16 result must be exactly
    // bf16(f32 result on the widened inputs).
    let strat = (1usize..40, any::<u64>());
    check("dtype.bf16_eq_round_f32_single_rounding_ops", 64, 0.0, strat, |(t, seed)| {
        let mut r = rng(seed);
        let b = |v: Vec<f32>| -> (Vec<bf16>, Vec<f32>) {
            let vb: Vec<bf16> = v.iter().map(|&e| bf16::from_f32(e)).collect();
            let vf = vb.iter().map(|e| e.to_f32()).collect();
            (vb, vf)
        };
        let same =
            |xb: &[bf16], xf: &[f32]| xb.iter().zip(xf).all(|(p, &q)| *p == bf16::from_f32(q));
        // GDR recurrent.
        let d = GdrDims { h_k: 1, h_v: 2, k: 8, v: 4 };
        let (qb, qf) = b(uniform(&mut r, t * 8, 1.0));
        let (kb, kf) = b(uniform(&mut r, t * 8, 1.0));
        let (vb, vf) = b(uniform(&mut r, t * 8, 1.0));
        let g: Vec<f32> = uniform(&mut r, t * 2, 1.0).iter().map(|x| -x.abs()).collect();
        let beta: Vec<f32> = uniform(&mut r, t * 2, 1.0).iter().map(|x| x.abs()).collect();
        let st0 = uniform(&mut r, d.state_per_slot(), 1.0);
        let cu = [0, t as i32];
        let (mut s1, mut s2) = (st0.clone(), st0);
        let mut ob = vec![bf16::ZERO; t * 8];
        let mut of = vec![0f32; t * 8];
        let ib = GdrInputs { q: &qb, k: &kb, v: &vb, g: &g, beta: &beta };
        let ifl = GdrInputs { q: &qf, k: &kf, v: &vf, g: &g, beta: &beta };
        let o = GdrOptions::default();
        gdr::recurrent_prefill(&ib, d, Varlen::new(&cu, &[0]), o, &mut s1, &mut ob).unwrap();
        gdr::recurrent_prefill(&ifl, d, Varlen::new(&cu, &[0]), o, &mut s2, &mut of).unwrap();
        let mut ok = same(&ob, &of) && s1 == s2;
        // Conv prefill (state in bf16 holds raw inputs: exact).
        let cd = ConvDims { conv_dim: 8, width: 4 };
        let (wb, wf) = b(uniform(&mut r, 32, 1.0));
        let (cb, cf) = b(uniform(&mut r, 24, 1.0));
        let (mut cb2, mut cf2) = (cb.clone(), cf.clone());
        let mut cob = vec![bf16::ZERO; t * 8];
        let mut cof = vec![0f32; t * 8];
        conv1d::prefill(&qb, &wb, None, cd, Varlen::new(&cu, &[0]), &mut cb2, &mut cob).unwrap();
        conv1d::prefill(&qf, &wf, None, cd, Varlen::new(&cu, &[0]), &mut cf2, &mut cof).unwrap();
        ok &= same(&cob, &cof) && same(&cb2, &cf2);
        // Attention and matmul.
        let ad = AttnDims { n_q_heads: 2, n_kv_heads: 1, head_dim: 4 };
        let mut aob = vec![bf16::ZERO; t * 8];
        let mut aof = vec![0f32; t * 8];
        attn::prefill_contiguous(&qb, &kb[..t * 4], &vb[..t * 4], &cu, &cu, ad, None, &mut aob)
            .unwrap();
        attn::prefill_contiguous(&qf, &kf[..t * 4], &vf[..t * 4], &cu, &cu, ad, None, &mut aof)
            .unwrap();
        ok &= same(&aob, &aof);
        let mut mb = vec![bf16::ZERO; t * 3];
        let mut mf = vec![0f32; t * 3];
        let (mwb, mwf) = b(uniform(&mut r, 24, 1.0));
        mlp::matmul(&qb, &mwb, 8, 3, &mut mb).unwrap();
        mlp::matmul(&qf, &mwf, 8, 3, &mut mf).unwrap();
        ok &= same(&mb, &mf);
        if ok {
            0.0
        } else {
            f64::INFINITY
        }
    });
}
