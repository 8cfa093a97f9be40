//! `gdr.l2norm`: the q/k L2 normalisation of the gated delta rule.

use crate::{check, Result};

/// The epsilon HF / FLA use for the q/k L2 norm (`use_qk_l2norm_in_kernel`).
pub const L2NORM_EPS: f32 = 1e-6;

/// In-place `x * rsqrt(sum(x^2) + eps)` of one row; the sum accumulates in f64.
pub(crate) fn l2norm_row(x: &mut [f32], eps: f32) {
    let ss = crate::check::dot(x, x) as f32;
    let inv = 1.0 / (ss + eps).sqrt();
    for e in x {
        *e *= inv;
    }
}

/// L2 normalisation over the last dim, mirroring HF `l2norm` in `modeling_qwen3_5.py`
/// (`x * rsqrt(sum(x^2, -1) + eps)`) as the FLA kernels compute it: in f32, sum of squares
/// accumulated in f64 then rounded to f32, `eps` added in f32 (use [`L2NORM_EPS`]).
///
/// Shapes: `x`, `out`: f32 `[rows, dim]`.
///
/// # Errors
/// [`crate::RefError::Shape`] if `dim == 0`, `x.len()` is not a multiple of `dim`, or
/// `out.len() != x.len()`; [`crate::RefError::Invalid`] for an `eps` that is not finite and
/// `> 0` (as the RMS norms).
pub fn l2norm(x: &[f32], dim: usize, eps: f32, out: &mut [f32]) -> Result<()> {
    const OP: &str = "gdr.l2norm";
    check::rows(OP, "x", x.len(), dim)?;
    check::len(OP, "out", out.len(), x.len())?;
    crate::norm::check_eps(OP, eps)?;
    out.copy_from_slice(x);
    for row in out.chunks_exact_mut(dim) {
        l2norm_row(row, eps);
    }
    Ok(())
}
