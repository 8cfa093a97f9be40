//! Tests of `sample.top_p` (seeded temperature / nucleus sampling): the fixed-point weight vs
//! `exp`, the counter-based uniform, greedy forms == argmax, nucleus minimality with boundary ties,
//! determinism and batch independence, empirical frequencies vs the nucleus probabilities
//! (chi-square), defined behaviour of out-of-domain parameters, and argument errors.
// Exact float comparisons are deliberate (bit-identity, hand-set values).
#![allow(clippy::float_cmp)]

mod common;

use common::{check, rng, uniform};
use deltakit_ref::sample::{self, top_p_sample, top_p_trace, weight};
use deltakit_ref::RefError;
use half::bf16;
use proptest::prelude::*;
use rand::Rng;

const ONE: u64 = 1 << 32;

#[test]
fn splitmix64_and_uniform_by_hand() {
    // First output of the SplitMix64 generator seeded with 0 (Vigna's reference implementation).
    assert_eq!(sample::splitmix64(0), 0xE220_A839_7B1D_CDAF);
    assert_eq!(sample::draw_bits(7, 3), sample::splitmix64(7 ^ sample::splitmix64(3)));
    let u: Vec<f64> = (0..100_000u64).map(|c| sample::uniform(42, c)).collect();
    assert!(u.iter().all(|&x| (0.0..1.0).contains(&x)));
    let mean = u.iter().sum::<f64>() / u.len() as f64;
    assert!((mean - 0.5).abs() < 0.005, "mean {mean}");
    // Ten equal bins, chi-square with 9 degrees of freedom (P(> 40) ~ 1e-5).
    let mut bins = [0f64; 10];
    for &x in &u {
        bins[(x * 10.0) as usize] += 1.0;
    }
    let chi2: f64 = bins.iter().map(|&o| (o - 10_000.0).powi(2) / 10_000.0).sum();
    assert!(chi2 < 40.0, "chi2 {chi2}");
    // Distinct counters, distinct bits (a bijection for a fixed seed).
    let mut bits: Vec<u64> = (0..10_000u64).map(|c| sample::draw_bits(5, c)).collect();
    bits.sort_unstable();
    bits.dedup();
    assert_eq!(bits.len(), 10_000);
}

#[test]
fn weight_is_fixed_point_exp() {
    assert_eq!(weight(3.0, 3.0, 1.0), ONE);
    assert_eq!(weight(f32::INFINITY, f32::INFINITY, 0.5), ONE);
    assert_eq!(weight(f32::NEG_INFINITY, 0.0, 1.0), 0);
    assert_eq!(weight(-24.0, 0.0, 1.0), 0);
    assert_eq!(weight(1.0, f32::INFINITY, 1.0), 0);
    let mut max_rel = 0f64;
    for i in 0..=230_000 {
        let e = -(i as f32) * 1e-4; // [-23, 0]
        let q = weight(e, 0.0, 1.0);
        let exact = (f64::from(e)).exp() * ONE as f64;
        // Truncation costs < 1 unit; the f32 recipe ~1e-7 relative.
        let err = (q as f64 - exact).abs() - 1.0;
        max_rel = max_rel.max(err / exact);
    }
    println!("INVARIANT sample.weight_vs_exp max_rel_err={max_rel:.3e} (tol 5.0e-7)");
    assert!(max_rel <= 5e-7, "{max_rel}");
}

#[test]
fn out_of_domain_parameters_have_defined_meaning() {
    assert_eq!(sample::inverse_temperature(0.0), None);
    assert_eq!(sample::inverse_temperature(-1.0), None);
    assert_eq!(sample::inverse_temperature(f32::NAN), None);
    assert_eq!(sample::inverse_temperature(1e-39), None); // 1/T overflows f32
    assert_eq!(sample::inverse_temperature(0.5), Some(2.0));
    assert_eq!(sample::inverse_temperature(f32::INFINITY), Some(f32::MIN_POSITIVE));
    for p in [0.0f32, -0.5, 1.5, f32::NAN, f32::INFINITY] {
        assert_eq!(sample::effective_top_p(p), 1.0);
    }
    assert_eq!(sample::effective_top_p(0.25), 0.25);
    // T = +inf: uniform over the finite logits; -inf never drawn.
    let row = [1.0f32, f32::NEG_INFINITY, -30.0, 7.0];
    let t = top_p_trace(&row, f32::INFINITY, 1.0, 1, 2).unwrap();
    assert_eq!(t.kept.iter().filter(|k| k.1 == ONE).count(), 3);
    assert!(t.kept.iter().all(|&(j, q)| (j == 1) == (q == 0)));
    // +inf logits share all the mass.
    let row = [1.0f32, f32::INFINITY, 2.0, f32::INFINITY];
    for c in 0..50 {
        let t = top_p_trace(&row, 1.0, 1.0, 3, c).unwrap();
        assert!(t.id == 1 || t.id == 3, "{t:?}");
    }
    // An all -inf row is uniform.
    let t = top_p_trace(&[f32::NEG_INFINITY; 4], 1.0, 1.0, 3, 4).unwrap();
    assert_eq!(t.total_mass, 4 * ONE);
}

#[test]
fn greedy_forms_equal_argmax() {
    let mut r = rng(1);
    for _ in 0..20 {
        let (n, vocab) = (3usize, r.gen_range(1..200usize));
        let x = uniform(&mut r, n * vocab, 5.0);
        let mut am = vec![0u32; n];
        sample::argmax(&x, vocab, &mut am).unwrap();
        for t in [0.0f32, -2.0, f32::NAN, 1e-40] {
            let mut out = vec![u32::MAX; n];
            top_p_sample(&x, vocab, &[t; 3], &[0.7; 3], &[1, 2, 3], &[4, 5, 6], &mut out).unwrap();
            assert_eq!(out, am, "T={t}");
        }
    }
}

#[test]
fn tiny_top_p_keeps_only_the_max_key_group() {
    let mut r = rng(2);
    let mut row = uniform(&mut r, 100, 4.0);
    for j in [10usize, 40, 77] {
        row[j] = 9.0;
    }
    let mut seen = [0usize; 100];
    for c in 0..300 {
        let t = top_p_trace(&row, 0.7, 1e-6, 11, c).unwrap();
        assert_eq!(t.kept, vec![(10, ONE), (40, ONE), (77, ONE)]);
        seen[t.id as usize] += 1;
    }
    assert!(seen[10] > 50 && seen[40] > 50 && seen[77] > 50, "{:?}", &seen[..]);
    assert_eq!(seen[10] + seen[40] + seen[77], 300);
}

#[test]
fn nucleus_is_minimal_with_boundary_ties_kept() {
    let strat = (1usize..400, 0.05f32..4.0, 0.0f32..1.0, 1u32..4, any::<u64>());
    check("sample.top_p_nucleus_minimal", 256, 0.0, strat, |(vocab, temp, p, dups, seed)| {
        let mut r = rng(seed);
        // Coarse values (many exact ties) in bf16.
        let row: Vec<bf16> = (0..vocab)
            .map(|_| bf16::from_f32((r.gen_range(-8i32..8) * dups as i32) as f32 * 0.25))
            .collect();
        let t = top_p_trace(&row, temp, p, seed, 0).unwrap();
        let thr = f32::from_bits(t.threshold_bits);
        let x: Vec<f32> = row.iter().map(|v| v.to_f32()).collect();
        let inv = sample::inverse_temperature(temp).unwrap();
        let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let above: u64 = (0..vocab)
            .filter(|&j| x[j].total_cmp(&thr).is_gt())
            .map(|j| weight(x[j], m, inv))
            .sum();
        let kept_ok = t.kept.len() == x.iter().filter(|v| v.total_cmp(&thr).is_ge()).count();
        let ok = t.kept_mass >= t.need
            && above < t.need
            && kept_ok
            && t.kept_mass == t.kept.iter().map(|k| k.1).sum::<u64>()
            && t.target < t.kept_mass
            && t.kept.iter().any(|k| k.0 == t.id)
            && t.need >= 1
            && t.need <= t.total_mass;
        if ok {
            0.0
        } else {
            f64::INFINITY
        }
    });
}

#[test]
fn deterministic_and_independent_of_batch() {
    let mut r = rng(3);
    let (n, vocab) = (6usize, 333usize);
    let x: Vec<bf16> = uniform(&mut r, n * vocab, 6.0).into_iter().map(bf16::from_f32).collect();
    let temps = [1.0f32, 0.5, 0.0, 2.0, 1.0, 0.9];
    let tops = [0.9f32, 1.0, 0.5, 0.3, 2.0, 0.99];
    let seeds: Vec<u64> = (0..n).map(|_| r.gen()).collect();
    let counters: Vec<u64> = (0..n as u64).map(|i| i * 1000).collect();
    let mut a = vec![0u32; n];
    let mut b = vec![1u32; n];
    top_p_sample(&x, vocab, &temps, &tops, &seeds, &counters, &mut a).unwrap();
    top_p_sample(&x, vocab, &temps, &tops, &seeds, &counters, &mut b).unwrap();
    assert_eq!(a, b);
    // Reversed batch order: each row keeps its token.
    let xr: Vec<bf16> = x.chunks_exact(vocab).rev().flatten().copied().collect();
    let rev = |v: &[f32]| v.iter().rev().copied().collect::<Vec<_>>();
    let revu = |v: &[u64]| v.iter().rev().copied().collect::<Vec<_>>();
    let mut c = vec![0u32; n];
    top_p_sample(&xr, vocab, &rev(&temps), &rev(&tops), &revu(&seeds), &revu(&counters), &mut c)
        .unwrap();
    c.reverse();
    assert_eq!(a, c);
    // bf16 logits and their f32 widening give the same draws.
    let xf: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
    let mut d = vec![0u32; n];
    top_p_sample(&xf, vocab, &temps, &tops, &seeds, &counters, &mut d).unwrap();
    assert_eq!(a, d);
}

#[test]
fn empirical_frequencies_match_nucleus_probabilities() {
    let row: Vec<f32> = vec![2.0, 1.5, 1.5, 0.3, -0.7, 2.4, 0.0, -3.0, 1.0, 0.9, -1.2, 1.7];
    let (temp, top_p, seed, n) = (0.7f32, 0.9f32, 0xDEAD_BEEF_u64, 40_000u64);
    let t0 = top_p_trace(&row, temp, top_p, seed, 0).unwrap();
    // Nucleus by hand: softmax(x / T) sorted, smallest top set reaching 0.9 (ties kept).
    let z: f64 = row.iter().map(|&v| (f64::from(v) / f64::from(temp)).exp()).sum();
    let mut order: Vec<usize> = (0..row.len()).collect();
    order.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
    let (mut acc, mut cut) = (0f64, f32::INFINITY);
    for &j in &order {
        if acc >= 0.9 && row[j] < cut {
            break;
        }
        acc += (f64::from(row[j]) / f64::from(temp)).exp() / z;
        cut = row[j];
    }
    let kept: Vec<u32> = (0..row.len() as u32).filter(|&j| row[j as usize] >= cut).collect();
    assert_eq!(t0.kept.iter().map(|k| k.0).collect::<Vec<_>>(), kept);
    let mut counts = vec![0f64; row.len()];
    for c in 0..n {
        counts[top_p_trace(&row, temp, top_p, seed, c).unwrap().id as usize] += 1.0;
    }
    let mut chi2 = 0f64;
    for &(j, q) in &t0.kept {
        let e = q as f64 / t0.kept_mass as f64 * n as f64;
        chi2 += (counts[j as usize] - e).powi(2) / e;
    }
    let df = (t0.kept.len() - 1) as f64;
    let outside: f64 =
        (0..row.len() as u32).filter(|j| !kept.contains(j)).map(|j| counts[j as usize]).sum();
    println!("INVARIANT sample.top_p_chi2 chi2={chi2:.2} df={df}");
    assert_eq!(outside, 0.0);
    assert!(chi2 < df + 6.0 * (2.0 * df).sqrt() + 6.0, "chi2 {chi2} df {df}");
}

#[test]
fn top_p_rejects_bad_arguments() {
    let x = [0.5f32; 8];
    let (t2, u2) = ([1.0f32; 2], [1u64; 2]);
    let mut o2 = [0u32; 2];
    let e = top_p_sample(&x, 0, &t2, &t2, &u2, &u2, &mut o2);
    assert!(matches!(e, Err(RefError::Shape { what: "logits", .. })), "{e:?}");
    let e = top_p_sample(&x, 3, &t2, &t2, &u2, &u2, &mut o2);
    assert!(matches!(e, Err(RefError::Shape { what: "logits", .. })), "{e:?}");
    let e = top_p_sample(&x, 4, &[1.0], &t2, &u2, &u2, &mut o2);
    assert!(matches!(e, Err(RefError::Shape { what: "temperature", .. })), "{e:?}");
    let e = top_p_sample(&x, 4, &t2, &[1.0; 3], &u2, &u2, &mut o2);
    assert!(matches!(e, Err(RefError::Shape { what: "top_p", .. })), "{e:?}");
    let e = top_p_sample(&x, 4, &t2, &t2, &[1], &u2, &mut o2);
    assert!(matches!(e, Err(RefError::Shape { what: "seed", .. })), "{e:?}");
    let e = top_p_sample(&x, 4, &t2, &t2, &u2, &[1], &mut o2);
    assert!(matches!(e, Err(RefError::Shape { what: "counter", .. })), "{e:?}");
    let e = top_p_sample(&x, 4, &t2, &t2, &u2, &u2, &mut [0u32; 3]);
    assert!(matches!(e, Err(RefError::Shape { what: "out", .. })), "{e:?}");
    let mut xn = x;
    xn[5] = f32::NAN;
    let e = top_p_sample(&xn, 4, &t2, &t2, &u2, &u2, &mut o2);
    assert!(matches!(e, Err(RefError::Invalid { what: "logits", .. })), "{e:?}");
    assert_eq!(o2, [0, 0], "nothing written on error");
    let e = top_p_trace::<f32>(&[], 1.0, 1.0, 0, 0);
    assert!(matches!(e, Err(RefError::Shape { what: "logits", .. })), "{e:?}");
}
