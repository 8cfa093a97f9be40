//! `norm.rms` and `norm.fused_add_rms`: zero-centred RMSNorm `x * rsqrt(mean(x^2) + eps) * (1 + w)`.

use crate::{check, Elem, Result};

fn validate(op: &'static str, x: usize, w: usize, out: usize, eps: f32) -> Result<()> {
    super::check_eps(op, eps)?;
    check::rows(op, "x", x, w)?;
    check::len(op, "out", out, x)
}

fn norm_rows<T: Elem>(x: &[f32], w: &[T], eps: f32, out: &mut [T]) {
    let d = w.len();
    let w1: Vec<f32> = w.iter().map(|e| 1.0 + e.to_f32()).collect();
    for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let inv = super::inv_rms(xr, eps);
        for ((o, &xi), &wi) in or.iter_mut().zip(xr).zip(&w1) {
            *o = T::from_f32(xi * inv * wi);
        }
    }
}

/// Zero-centred RMSNorm over the last dim, mirroring HF `Qwen3_5RMSNorm.forward` (Gemma-style):
/// in f32, `y = x * rsqrt(mean(x^2) + eps) * (1 + w)`, rounded to `T` once at the end. A zero
/// weight is the identity scale (unlike [`super::rms_norm_gated`], which multiplies by plain `w`).
///
/// Shapes: `x`, `out`: `[rows, D]` with `D = w.len()`; `w`: `[D]`.
///
/// # Errors
/// [`crate::RefError::Shape`] if `D == 0`, `x.len() % D != 0` or `out.len() != x.len()`;
/// [`crate::RefError::Invalid`] for an `eps` that is not finite and `> 0` (HF: a positive float).
pub fn rms_norm<T: Elem>(x: &[T], w: &[T], eps: f32, out: &mut [T]) -> Result<()> {
    rms_norm_op("norm.rms", x, w, eps, out)
}

/// [`rms_norm`] reporting errors under `op`.
pub(crate) fn rms_norm_op<T: Elem>(
    op: &'static str,
    x: &[T],
    w: &[T],
    eps: f32,
    out: &mut [T],
) -> Result<()> {
    validate(op, x.len(), w.len(), out.len(), eps)?;
    let xf: Vec<f32> = x.iter().map(|e| e.to_f32()).collect();
    norm_rows(&xf, w, eps, out);
    Ok(())
}

/// Residual add then zero-centred RMSNorm, mirroring a Qwen3.5 decoder layer's
/// `residual + hidden_states` followed by the next `Qwen3_5RMSNorm` (vLLM `fused_add_rms_norm`):
/// `residual = T(residual + x)` (rounded to `T` as HF's bf16 add does), then
/// `out = rms_norm(residual)`. `residual` is updated in place (the new residual stream).
///
/// Shapes: `x`, `residual`, `out`: `[rows, D]`; `w`: `[D]`.
///
/// # Errors
/// As [`rms_norm`]; also `residual.len() != x.len()`.
pub fn fused_add_rms_norm<T: Elem>(
    x: &[T],
    residual: &mut [T],
    w: &[T],
    eps: f32,
    out: &mut [T],
) -> Result<()> {
    const OP: &str = "norm.fused_add_rms";
    validate(OP, x.len(), w.len(), out.len(), eps)?;
    check::len(OP, "residual", residual.len(), x.len())?;
    for (r, &xi) in residual.iter_mut().zip(x) {
        *r = T::from_f32(r.to_f32() + xi.to_f32());
    }
    let rf: Vec<f32> = residual.iter().map(|e| e.to_f32()).collect();
    norm_rows(&rf, w, eps, out);
    Ok(())
}
