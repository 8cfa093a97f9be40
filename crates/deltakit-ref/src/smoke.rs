//! Smoke ops that prove the build pipeline (issue 2): `smoke.axpy` (CUDA) and `smoke.vadd` (Triton).

use half::bf16;

use crate::{check, Result};

/// `y[i] = bf16(alpha * f32(x[i]) + f32(y[i]))`, rounding once to bf16 (round to nearest even), as
/// the CUDA `smoke.axpy` kernel does.
///
/// Shapes: `x` and `y` are `[n]`.
///
/// # Errors
/// [`crate::RefError::Shape`] if `y.len() != x.len()` (nothing is written).
pub fn axpy_bf16(alpha: f32, x: &[bf16], y: &mut [bf16]) -> Result<()> {
    check::len("smoke.axpy", "y", y.len(), x.len())?;
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi = bf16::from_f32(alpha.mul_add(xi.to_f32(), yi.to_f32()));
    }
    Ok(())
}

/// `out[i] = a[i] + b[i]` in f32, as the Triton `smoke.vadd` kernel does. Shapes: all `[n]`.
///
/// # Errors
/// [`crate::RefError::Shape`] if `b` or `out` differs in length from `a` (nothing is written).
pub fn vadd_f32(a: &[f32], b: &[f32], out: &mut [f32]) -> Result<()> {
    check::len("smoke.vadd", "b", b.len(), a.len())?;
    check::len("smoke.vadd", "out", out.len(), a.len())?;
    for ((o, x), y) in out.iter_mut().zip(a).zip(b) {
        *o = x + y;
    }
    Ok(())
}
