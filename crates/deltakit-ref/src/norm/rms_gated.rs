//! `norm.rms_gated`: the gated RMSNorm applied per value head to the GDR output.

use crate::{check, Elem, Result};

/// Gated RMSNorm per value head, mirroring HF `Qwen3_5RMSNormGated.forward` (Qwen3-Next
/// `Qwen3NextRMSNormGated`): per row of `V` elements, in f32 `n = x * rsqrt(mean(x^2) + eps)`;
/// cast to `T`; `y = T(w * n)` (plain `w`, NOT `1 + w`; HF multiplies in the weight dtype);
/// `out = T(y * silu(f32(z)))`. With `T = f32` all casts are exact.
///
/// Shapes: `x`, `z`, `out`: `[rows, V]` (e.g. `[T, H_v, V]`, normalising each head separately);
/// `w`: `[V]`.
///
/// # Errors
/// [`crate::RefError::Shape`] if `V == 0`, `x.len() % V != 0`, or `z`/`out` differ in length
/// from `x`; [`crate::RefError::Invalid`] for an `eps` that is not finite and `> 0` (HF: a
/// positive float).
pub fn rms_norm_gated<T: Elem>(x: &[T], z: &[T], w: &[T], eps: f32, out: &mut [T]) -> Result<()> {
    const OP: &str = "norm.rms_gated";
    let v = w.len();
    super::check_eps(OP, eps)?;
    check::rows(OP, "x", x.len(), v)?;
    check::len(OP, "z", z.len(), x.len())?;
    check::len(OP, "out", out.len(), x.len())?;
    let wf: Vec<f32> = w.iter().map(|e| e.to_f32()).collect();
    let mut row = vec![0f32; v];
    for ((xr, zr), or) in x.chunks_exact(v).zip(z.chunks_exact(v)).zip(out.chunks_exact_mut(v)) {
        for (r, e) in row.iter_mut().zip(xr) {
            *r = e.to_f32();
        }
        let inv = super::inv_rms(&row, eps);
        for (((o, &xi), &zi), &wi) in or.iter_mut().zip(&row).zip(zr).zip(&wf) {
            let n = T::round(xi * inv);
            let y = T::round(wi * n);
            *o = T::from_f32(y * check::silu(zi.to_f32()));
        }
    }
    Ok(())
}
