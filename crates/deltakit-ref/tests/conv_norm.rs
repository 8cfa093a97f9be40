//! Property tests of conv1d (split invariance of the conv state, update == prefill, padding) and
//! of the norms ((1 + w) vs plain w conventions, fused residual add, bf16 rounding points).
// Exact float comparisons are deliberate here (bit-identity invariants, hand-computed values).
#![allow(clippy::float_cmp, clippy::too_many_lines, clippy::needless_range_loop)]

mod common;

use common::{check, max_err, rel_err, rel_err64, rng, uniform};
use deltakit_ref::conv1d::{self, ConvDims};
use deltakit_ref::norm;
use deltakit_ref::Varlen;
use half::bf16;
use proptest::prelude::*;
use rand::Rng;

#[test]
fn conv_state_split_invariance_w4() {
    // Pieces drawn from {1, 2, 3, 5} (W-1 = 3: shorter than, equal to and longer than the state).
    let strat = (
        prop::collection::vec(prop::sample::select(vec![1usize, 2, 3, 5]), 1..8),
        1usize..12,
        any::<u64>(),
    );
    check("conv1d.split_invariance_w4", 256, 0.0, strat, |(pieces, cdim, seed)| {
        let w = 4;
        let t: usize = pieces.iter().sum();
        let mut r = rng(seed);
        let cd = ConvDims { conv_dim: cdim, width: w };
        let x = uniform(&mut r, t * cdim, 1.0);
        let wt = uniform(&mut r, cdim * w, 1.0);
        let b = uniform(&mut r, cdim, 0.5);
        let slots = 3;
        let st0 = uniform(&mut r, slots * cdim * (w - 1), 1.0);
        let slot = r.gen_range(0..slots as i32);
        let cu = [0, t as i32];
        let (mut st_a, mut out_a) = (st0.clone(), vec![f32::NAN; t * cdim]);
        conv1d::prefill(&x, &wt, Some(&b), cd, Varlen::new(&cu, &[slot]), &mut st_a, &mut out_a)
            .unwrap();
        let (mut st_b, mut out_b) = (st0.clone(), vec![f32::NAN; t * cdim]);
        let (mut st_c, mut out_c) = (st0, vec![f32::NAN; t * cdim]);
        let mut t0 = 0;
        for &p in &pieces {
            let xs = &x[t0 * cdim..(t0 + p) * cdim];
            let cu1 = [0, p as i32];
            conv1d::prefill(
                xs,
                &wt,
                Some(&b),
                cd,
                Varlen::new(&cu1, &[slot]),
                &mut st_b,
                &mut out_b[t0 * cdim..(t0 + p) * cdim],
            )
            .unwrap();
            conv1d::update(
                xs,
                &wt,
                Some(&b),
                cd,
                p,
                &[slot],
                &mut st_c,
                &mut out_c[t0 * cdim..(t0 + p) * cdim],
            )
            .unwrap();
            t0 += p;
        }
        let exact = out_a == out_b && out_a == out_c && st_a == st_b && st_a == st_c;
        if exact {
            0.0
        } else {
            max_err(&[
                rel_err(&out_b, &out_a),
                rel_err(&st_b, &st_a),
                rel_err(&out_c, &out_a),
                rel_err(&st_c, &st_a),
            ])
            .max(f64::MIN_POSITIVE)
        }
    });
}

/// f64 reference of the causal conv with history (independent formulation: explicit sum over
/// past inputs `x[t - (W-1) + w]`).
/// Returns (out, mag) where `mag = |b| + sum |w x|` bounds the f32 accumulation error.
fn conv_ref(
    x: &[f32],
    w: &[f32],
    b: &[f32],
    hist: &[f32],
    cdim: usize,
    width: usize,
) -> (Vec<f64>, Vec<f64>) {
    let t = x.len() / cdim;
    let mut out = vec![0f64; x.len()];
    let mut mag = vec![0f64; x.len()];
    for c in 0..cdim {
        for tt in 0..t {
            let mut acc = f64::from(b[c]);
            let mut m = f64::from(b[c]).abs();
            for tap in 0..width {
                let src = tt as isize - (width as isize - 1) + tap as isize;
                let xv = if src >= 0 {
                    x[src as usize * cdim + c]
                } else {
                    hist[c * (width - 1) + (width as isize - 1 + src) as usize]
                };
                acc += f64::from(w[c * width + tap]) * f64::from(xv);
                m += (f64::from(w[c * width + tap]) * f64::from(xv)).abs();
            }
            out[tt * cdim + c] = acc / (1.0 + (-acc).exp());
            mag[tt * cdim + c] = m;
        }
    }
    (out, mag)
}

#[test]
fn conv_matches_f64_and_padding() {
    let strat = (2usize..=4, 1usize..10, 1usize..20, any::<u64>());
    check(
        "conv1d.prefill_vs_f64_rel_to_sum_abs_terms",
        128,
        1e-6,
        strat,
        |(width, cdim, t, seed)| {
            let mut r = rng(seed);
            let cd = ConvDims { conv_dim: cdim, width };
            let x = uniform(&mut r, t * cdim, 1.0);
            let wt = uniform(&mut r, cdim * width, 1.0);
            let b = uniform(&mut r, cdim, 0.5);
            let st0 = uniform(&mut r, 2 * cdim * (width - 1), 1.0);
            // Two sequences over the same tokens: slot 1 live, then a padding copy.
            let x2: Vec<f32> = x.iter().chain(&x).copied().collect();
            let cu = [0, t as i32, 2 * t as i32];
            let mut st = st0.clone();
            let mut out = vec![f32::NAN; 2 * t * cdim];
            conv1d::prefill(&x2, &wt, Some(&b), cd, Varlen::new(&cu, &[1, -1]), &mut st, &mut out)
                .unwrap();
            let per = cdim * (width - 1);
            let (reference, mag) = conv_ref(&x, &wt, &b, &st0[per..2 * per], cdim, width);
            let pad_ok = out[t * cdim..].iter().all(|&v| v == 0.0) && st[..per] == st0[..per];
            if !pad_ok {
                return f64::INFINITY;
            }
            // Error relative to the magnitude of the summed terms (cancellation-safe; silu' <= 1.1).
            if out.iter().any(|v| !v.is_finite()) {
                return f64::INFINITY;
            }
            let num: f64 = out[..t * cdim]
                .iter()
                .zip(&reference)
                .map(|(&o, r)| (f64::from(o) - r).powi(2))
                .sum();
            let den: f64 = mag.iter().map(|m| m * m).sum();
            num.sqrt() / den.sqrt()
        },
    );
}

fn xhat(x: &[f32], eps: f64) -> Vec<f64> {
    let ms: f64 = x.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / x.len() as f64;
    x.iter().map(|&v| f64::from(v) / (ms + eps).sqrt()).collect()
}

#[test]
fn norm_conventions() {
    let strat = (1usize..6, 1usize..70, any::<u64>());
    check("norm.rms_and_gated_conventions", 128, 1e-6, strat, |(rows, d, seed)| {
        let mut r = rng(seed);
        let eps = 1e-6f32;
        let x = uniform(&mut r, rows * d, 2.0);
        let z = uniform(&mut r, rows * d, 3.0);
        let w = uniform(&mut r, d, 0.5);
        let (mut y, mut yg) = (vec![f32::NAN; rows * d], vec![f32::NAN; rows * d]);
        norm::rms_norm(&x, &w, eps, &mut y).unwrap();
        norm::rms_norm_gated(&x, &z, &w, eps, &mut yg).unwrap();
        let mut ref1 = Vec::new();
        let mut ref_plain = Vec::new();
        let mut refg = Vec::new();
        for (row, zr) in x.chunks_exact(d).zip(z.chunks_exact(d)) {
            let h = xhat(row, f64::from(eps));
            for j in 0..d {
                let wj = f64::from(w[j]);
                let zj = f64::from(zr[j]);
                ref1.push(h[j] * (1.0 + wj));
                ref_plain.push(h[j] * wj);
                refg.push(h[j] * wj * zj / (1.0 + (-zj).exp()));
            }
        }
        // (1 + w) and plain w must be distinguishable: the (1 + w) output is far from plain w.
        if rel_err64(&y, &ref_plain) < 0.1 {
            return f64::INFINITY;
        }
        // Zero weight: (1 + w) norm is the pure normalisation, gated is exactly zero.
        let zw = vec![0f32; d];
        let (mut y0, mut yg0) = (vec![f32::NAN; rows * d], vec![f32::NAN; rows * d]);
        norm::rms_norm(&x, &zw, eps, &mut y0).unwrap();
        norm::rms_norm_gated(&x, &z, &zw, eps, &mut yg0).unwrap();
        if yg0.iter().any(|&v| v != 0.0) {
            return f64::INFINITY;
        }
        let pure: Vec<f64> = x.chunks_exact(d).flat_map(|row| xhat(row, f64::from(eps))).collect();
        // Fused residual add.
        let resid0 = uniform(&mut r, rows * d, 2.0);
        let mut resid = resid0.clone();
        let mut yf = vec![f32::NAN; rows * d];
        norm::fused_add_rms_norm(&x, &mut resid, &w, eps, &mut yf).unwrap();
        let sum: Vec<f32> = x.iter().zip(&resid0).map(|(a, b)| a + b).collect();
        let mut yf_ref = vec![f32::NAN; rows * d];
        norm::rms_norm(&sum, &w, eps, &mut yf_ref).unwrap();
        let fused_ok = resid == sum && yf == yf_ref;
        if !fused_ok {
            return f64::INFINITY;
        }
        max_err(&[rel_err64(&y, &ref1), rel_err64(&yg, &refg), rel_err64(&y0, &pure)])
    });
}

#[test]
fn norm_bf16_rounding_points() {
    // rms_norm in bf16 rounds once (must equal bf16(f32 result) exactly); rms_norm_gated rounds
    // three times (after the norm, after `* w`, at the output), so vs f32 its error is bounded by
    // (1 + 2^-8)^3 - 1 = 1.18e-2 per element.
    let strat = (1usize..4, 1usize..64, any::<u64>());
    check("norm.bf16_vs_f32_within_bf16_ulp", 96, 1.25e-2, strat, |(rows, d, seed)| {
        let mut r = rng(seed);
        let to_b = |v: &[f32]| -> Vec<bf16> { v.iter().map(|&e| bf16::from_f32(e)).collect() };
        let x = to_b(&uniform(&mut r, rows * d, 2.0));
        let z = to_b(&uniform(&mut r, rows * d, 3.0));
        let w = to_b(&uniform(&mut r, d, 0.5));
        let xf: Vec<f32> = x.iter().map(|e| e.to_f32()).collect();
        let zf: Vec<f32> = z.iter().map(|e| e.to_f32()).collect();
        let wf: Vec<f32> = w.iter().map(|e| e.to_f32()).collect();
        let mut yb = vec![bf16::ZERO; rows * d];
        let mut yf = vec![0f32; rows * d];
        norm::rms_norm(&x, &w, 1e-6, &mut yb).unwrap();
        norm::rms_norm(&xf, &wf, 1e-6, &mut yf).unwrap();
        // One rounding: bf16 result == round(f32 result) exactly.
        let single = yb.iter().zip(&yf).all(|(b, &f)| *b == bf16::from_f32(f));
        let mut gb = vec![bf16::ZERO; rows * d];
        let mut gf = vec![0f32; rows * d];
        norm::rms_norm_gated(&x, &z, &w, 1e-6, &mut gb).unwrap();
        norm::rms_norm_gated(&xf, &zf, &wf, 1e-6, &mut gf).unwrap();
        if !single {
            return f64::INFINITY;
        }
        let gbf: Vec<f32> = gb.iter().map(|e| e.to_f32()).collect();
        rel_err(&gbf, &gf)
    });
}
