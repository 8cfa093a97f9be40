//! Shared test helpers: relative error, seeded random inputs, and a proptest driver that records
//! the largest error each invariant observed (`INVARIANT <name> max_rel_err=<x>` with
//! `--nocapture`).
#![allow(dead_code, missing_docs)]

use std::cell::Cell;
use std::fmt::Debug;

use proptest::strategy::Strategy;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// `||out - reference|| / ||reference||` in f64; infinite if `out` has a NaN/inf or the lengths
/// differ, so NaN never passes a `<= tol` check. A zero reference gives the absolute norm.
pub fn rel_err(out: &[f32], reference: &[f32]) -> f64 {
    if out.len() != reference.len() || out.iter().any(|x| !x.is_finite()) {
        return f64::INFINITY;
    }
    let mut num = 0f64;
    let mut den = 0f64;
    for (&o, &r) in out.iter().zip(reference) {
        num += (f64::from(o) - f64::from(r)).powi(2);
        den += f64::from(r).powi(2);
    }
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}

/// As [`rel_err`] against an f64 reference.
pub fn rel_err64(out: &[f32], reference: &[f64]) -> f64 {
    if out.len() != reference.len() || out.iter().any(|x| !x.is_finite()) {
        return f64::INFINITY;
    }
    let mut num = 0f64;
    let mut den = 0f64;
    for (&o, &r) in out.iter().zip(reference) {
        num += (f64::from(o) - r).powi(2);
        den += r.powi(2);
    }
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}

/// Maximum of several errors, NaN-propagating (NaN -> infinity).
pub fn max_err(errs: &[f64]) -> f64 {
    errs.iter().fold(0f64, |m, &e| if e.is_nan() { f64::INFINITY } else { m.max(e) })
}

pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// `n` values uniform in `[-scale, scale)` (never all zeros).
pub fn uniform(r: &mut StdRng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| r.gen_range(-scale..scale)).collect()
}

/// `n` values uniform in `[lo, hi)`.
pub fn uniform_in(r: &mut StdRng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| r.gen_range(lo..hi)).collect()
}

/// Case-count multiplier from `DELTAKIT_REF_PROPTEST_SCALE` (default 1) for long soak runs.
pub fn scaled(cases: u32) -> u32 {
    let k = std::env::var("DELTAKIT_REF_PROPTEST_SCALE").ok().and_then(|v| v.parse::<u32>().ok());
    cases.saturating_mul(k.unwrap_or(1).max(1))
}

/// Run `cases` (times [`scaled`]) proptest cases of `strategy`; each case returns its error, which must be finite and
/// `<= tol`. Prints `INVARIANT <name> max_rel_err=<x>` at the end.
pub fn check<S>(name: &str, cases: u32, tol: f64, strategy: S, f: impl Fn(S::Value) -> f64)
where
    S: Strategy,
    S::Value: Debug,
{
    let max = Cell::new(0f64);
    let mut runner = TestRunner::new(Config {
        cases: scaled(cases),
        failure_persistence: None,
        ..Config::default()
    });
    let res = runner.run(&strategy, |v| {
        let e = f(v);
        if e.is_nan() || e > tol {
            return Err(TestCaseError::fail(format!("{name}: error {e:e} > tol {tol:e}")));
        }
        max.set(max.get().max(e));
        Ok(())
    });
    if let Err(e) = res {
        panic!("{name}: {e}");
    }
    println!(
        "INVARIANT {name} max_rel_err={:.3e} (tol {tol:.1e}, {} cases)",
        max.get(),
        scaled(cases)
    );
}

/// Print a record for a deterministic (non-proptest) invariant and assert it.
pub fn record(name: &str, err: f64, tol: f64) {
    assert!(err <= tol, "{name}: error {err:e} > tol {tol:e}");
    println!("INVARIANT {name} max_rel_err={err:.3e} (tol {tol:.1e})");
}

/// As [`check`] (cases also [`scaled`]) with several named errors per case, each with its own tolerance; prints one
/// `INVARIANT` line per name.
pub fn check_multi<S>(
    names: &[(&str, f64)],
    cases: u32,
    strategy: S,
    f: impl Fn(S::Value) -> Vec<f64>,
) where
    S: Strategy,
    S::Value: Debug,
{
    let maxes: Vec<Cell<f64>> = names.iter().map(|_| Cell::new(0f64)).collect();
    let mut runner = TestRunner::new(Config {
        cases: scaled(cases),
        failure_persistence: None,
        ..Config::default()
    });
    let res = runner.run(&strategy, |v| {
        let errs = f(v);
        assert_eq!(errs.len(), names.len(), "one error per name");
        for ((&(name, tol), &e), m) in names.iter().zip(&errs).zip(&maxes) {
            if e.is_nan() || e > tol {
                return Err(TestCaseError::fail(format!("{name}: error {e:e} > tol {tol:e}")));
            }
            m.set(m.get().max(e));
        }
        Ok(())
    });
    if let Err(e) = res {
        panic!("{e}");
    }
    for (&(name, tol), m) in names.iter().zip(&maxes) {
        println!(
            "INVARIANT {name} max_rel_err={:.3e} (tol {tol:.1e}, {} cases)",
            m.get(),
            scaled(cases)
        );
    }
}
