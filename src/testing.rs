//! Helpers for GPU tests and benches: device discovery with skip-or-fail, error metrics.

use std::sync::Arc;

use cudarc::driver::CudaContext;

/// Environment variable that turns a missing GPU into a test failure instead of a skip.
pub const REQUIRE_GPU_ENV: &str = "DELTAKIT_REQUIRE_GPU";

/// Returns GPU 0's context, or `None` after printing why the caller should skip.
///
/// # Panics
/// When no GPU is usable and `DELTAKIT_REQUIRE_GPU=1`: a GPU run must not pass by skipping.
#[must_use]
pub fn gpu_or_skip(test: &str) -> Option<Arc<CudaContext>> {
    if let Some(ctx) = crate::try_context(0) {
        return Some(ctx);
    }
    let required = std::env::var(REQUIRE_GPU_ENV).is_ok_and(|v| v == "1");
    assert!(!required, "{test}: no usable CUDA device and {REQUIRE_GPU_ENV}=1");
    eprintln!(
        "SKIP {test}: no usable CUDA device (set {REQUIRE_GPU_ENV}=1 to make this a failure)"
    );
    None
}

/// `||out - ref|| / ||ref||` in f64; `f64::INFINITY` if `out` has a NaN/inf or lengths differ,
/// so NaN never passes a `<= tol` check.
#[must_use]
pub fn rel_err(out: &[f32], reference: &[f32]) -> f64 {
    if out.len() != reference.len() || out.iter().any(|x| !x.is_finite()) {
        return f64::INFINITY;
    }
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (o, r) in out.iter().zip(reference) {
        let d = f64::from(*o) - f64::from(*r);
        num += d * d;
        den += f64::from(*r) * f64::from(*r);
    }
    if den == 0.0 {
        return if num == 0.0 { 0.0 } else { f64::INFINITY };
    }
    (num / den).sqrt()
}
