//! Regressions from review: inputs that once panicked or were accepted inconsistently.
#![allow(clippy::float_cmp)] // "nothing written" is an exact, bitwise property

use deltakit_ref::attn::{write_kv, KvDims, PageTable};
use deltakit_ref::gdr::{chunk_prefill, decode, recurrent_prefill, GdrDims, GdrInputs, GdrOptions};
use deltakit_ref::norm::{rms_norm, rms_norm_gated};
use deltakit_ref::RefError;
use deltakit_ref::Varlen;

#[test]
fn page_table_with_overflowing_max_pages_is_an_error_not_a_panic() {
    let (k, v) = (vec![1.0f32; 3 * 2], vec![1.0f32; 3 * 2]);
    let pages = PageTable { table: &[], max_pages: 1 << 63 };
    let dims = KvDims { page_size: 2, n_kv_heads: 1, head_dim: 2 };
    let (mut kc, mut vc) = (vec![0.5f32; 8], vec![0.5f32; 8]);
    let e = write_kv(&k, &v, &[0, 1, 3], &[0, 0], pages, dims, &mut kc, &mut vc).unwrap_err();
    assert!(matches!(e, RefError::Invalid { what: "page_table.max_pages", .. }), "{e}");
    assert!(kc.iter().chain(&vc).all(|&x| x == 0.5), "written on error");
}

fn gdr_case(g: &[f32], slots: &[i32]) -> [Result<(), RefError>; 3] {
    gdr_case_beta(g, &vec![0.5f32; g.len()], slots)
}

fn gdr_case_beta(g: &[f32], beta: &[f32], slots: &[i32]) -> [Result<(), RefError>; 3] {
    let d = GdrDims { h_k: 1, h_v: 1, k: 2, v: 2 };
    let t = g.len();
    let (q, k, v) = (vec![0.5f32; t * 2], vec![0.25f32; t * 2], vec![0.75f32; t * 2]);
    let inp = GdrInputs { q: &q, k: &k, v: &v, g, beta };
    let cu: Vec<i32> = (0..=t as i32).collect();
    let mut st = vec![0.125f32; 4 * 4];
    let mut out = vec![0f32; t * 2];
    let o = GdrOptions::default();
    let r1 = recurrent_prefill(&inp, d, Varlen::new(&cu, slots), o, &mut st, &mut out);
    let r2 = chunk_prefill(&inp, d, Varlen::new(&cu, slots), o, 16, &mut st, &mut out);
    let r3 = decode(&inp, d, slots, o, &mut st, &mut out);
    [r1, r2, r3]
}

#[test]
fn gdr_paths_agree_on_which_gates_are_valid() {
    // g = -inf is valid (a full decay: exp(A_log) overflowing in the gating); see
    // hand.rs `gdr_full_decay_by_hand`.
    for bad in [0.5f32, f32::NAN, f32::INFINITY] {
        for (i, r) in gdr_case(&[-0.1, bad], &[0, 1]).into_iter().enumerate() {
            let e = r.expect_err("a bad gate of a live sequence must be rejected");
            assert!(matches!(e, RefError::Invalid { what: "g", .. }), "path {i}, g = {bad}: {e}");
        }
        // A bad gate of a padding sequence is never read: every path accepts it.
        for (i, r) in gdr_case(&[-0.1, bad], &[0, -1]).into_iter().enumerate() {
            assert!(r.is_ok(), "path {i}, padding g = {bad}: {r:?}");
        }
    }
    // Review of stop 21: a non-finite beta of a live sequence was accepted (and poisoned the
    // state); every path now rejects it before writing, padding sequences' beta is never read.
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        for (i, r) in gdr_case_beta(&[-0.1, -0.2], &[0.5, bad], &[0, 1]).into_iter().enumerate() {
            let e = r.expect_err("a non-finite beta of a live sequence must be rejected");
            assert!(matches!(e, RefError::Invalid { what: "beta", .. }), "path {i}, {bad}: {e}");
        }
        for (i, r) in gdr_case_beta(&[-0.1, -0.2], &[0.5, bad], &[0, -1]).into_iter().enumerate() {
            assert!(r.is_ok(), "path {i}, padding beta = {bad}: {r:?}");
        }
    }
    let scale_nan = GdrOptions { scale: Some(f32::NAN), ..GdrOptions::default() };
    let d = GdrDims { h_k: 1, h_v: 1, k: 2, v: 2 };
    let x = [1.0f32, 2.0];
    let inp = GdrInputs { q: &x, k: &x, v: &x, g: &[-0.5], beta: &[0.5] };
    let (mut st, mut out) = (vec![0f32; 4], vec![0f32; 2]);
    let e = decode(&inp, d, &[0], scale_nan, &mut st, &mut out).unwrap_err();
    assert!(matches!(e, RefError::Invalid { what: "opts.scale", .. }), "{e}");
}

#[test]
fn norms_reject_bad_eps() {
    let (x, w) = (vec![0f32; 4], vec![0.5f32; 4]);
    let mut out = vec![7f32; 4];
    // eps = 0 (session-11 review): HF takes a positive float; 0 gives NaN on this all-zero row.
    for eps in [-1.0f32, 0.0, -0.0, f32::NAN, f32::INFINITY] {
        let e = rms_norm(&x, &w, eps, &mut out).unwrap_err();
        assert!(matches!(e, RefError::Invalid { what: "eps", .. }), "{e}");
        let e = rms_norm_gated(&x, &x, &w, eps, &mut out).unwrap_err();
        assert!(matches!(e, RefError::Invalid { what: "eps", .. }), "{e}");
        let e = deltakit_ref::attn::qk_norm(&x, &w, eps, &mut out).unwrap_err();
        assert!(matches!(e, RefError::Invalid { what: "eps", .. }), "{e}");
        let mut res = x.clone();
        let e =
            deltakit_ref::norm::fused_add_rms_norm(&x, &mut res, &w, eps, &mut out).unwrap_err();
        assert!(matches!(e, RefError::Invalid { what: "eps", .. }), "{e}");
        let e = deltakit_ref::gdr::l2norm(&x, 4, eps, &mut out).unwrap_err();
        assert!(matches!(e, RefError::Invalid { what: "eps", .. }), "{e}");
    }
    assert!(out.iter().all(|&v| v == 7.0), "written on error");
}

#[test]
fn smoke_ops_check_lengths() {
    let mut y = vec![half::bf16::ONE; 3];
    let e = deltakit_ref::smoke::axpy_bf16(1.0, &[half::bf16::ONE], &mut y).unwrap_err();
    assert!(matches!(e, RefError::Shape { what: "y", .. }), "{e}");
    let mut out = vec![0f32; 2];
    assert!(deltakit_ref::smoke::vadd_f32(&[1.0, 2.0], &[1.0], &mut out).is_err());
    assert_eq!(out, vec![0.0, 0.0]);
}

/// Review of session 6: inputs that were accepted and gave NaN (or were checked by one op and not
/// its neighbour): a non-finite attention scale, a NaN / negative `eps` in the GDR q/k L2 norm,
/// a `+inf` logit or an all `-inf` row in the top-k log-probabilities. Nothing is written.
#[test]
fn non_finite_parameters_are_rejected_like_their_neighbours() {
    use deltakit_ref::attn::{decode_paged, prefill_contiguous, AttnDims};
    let dims = AttnDims { n_q_heads: 2, n_kv_heads: 1, head_dim: 4 };
    let q = vec![0.25f32; 2 * 4];
    let kv = vec![0.5f32; 4];
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut out = vec![7f32; 2 * 4];
        let e = prefill_contiguous(&q, &kv, &kv, &[0, 1], &[0, 1], dims, Some(bad), &mut out)
            .unwrap_err();
        assert!(matches!(e, RefError::Invalid { what: "scale", .. }), "{e}");
        let pages = PageTable { table: &[0], max_pages: 1 };
        let e = decode_paged(&q, &kv, &kv, &[1], pages, 1, dims, Some(bad), &mut out).unwrap_err();
        assert!(matches!(e, RefError::Invalid { what: "scale", .. }), "{e}");
        assert!(out.iter().all(|&v| v == 7.0), "written on error");
    }
    for eps in [f32::NAN, -1e-6, f32::INFINITY] {
        let mut out = vec![7f32; 4];
        let e = deltakit_ref::gdr::l2norm(&[1.0, 2.0, 3.0, 4.0], 4, eps, &mut out).unwrap_err();
        assert!(matches!(e, RefError::Invalid { what: "eps", .. }), "{e}");
        assert!(out.iter().all(|&v| v == 7.0), "written on error");
    }
    let topk = deltakit_ref::sample::topk_logprobs::<f32>;
    let e = topk(&[0.0, f32::INFINITY, 1.0], 3, 2).unwrap_err();
    assert!(matches!(e, RefError::Invalid { what: "logits", .. }), "{e}");
    let e = topk(&[0.0, 1.0, 2.0, f32::NEG_INFINITY, f32::NEG_INFINITY, f32::NEG_INFINITY], 3, 1)
        .unwrap_err();
    assert!(e.to_string().contains("row 1 is all -inf"), "{e}");
    // A masked (-inf) token in a row with finite logits is ordinary: log-probability -inf.
    let ok = topk(&[0.0, f32::NEG_INFINITY, 0.0], 3, 3).unwrap();
    assert_eq!(ok[0][2], (1, f32::NEG_INFINITY));
}
