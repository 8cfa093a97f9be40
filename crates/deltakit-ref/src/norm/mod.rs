//! RMS norms of Qwen3.5: the zero-centred `(1 + w)` RMSNorm (input/post-attention/final norms and
//! attention q/k norms) and the gated RMSNorm of the GDR output (plain `w`).

mod rms;
mod rms_gated;

pub(crate) use rms::rms_norm_op;
pub use rms::{fused_add_rms_norm, rms_norm};
pub use rms_gated::rms_norm_gated;

/// `eps` must be finite and `> 0`, as HF's `Qwen3_5RMSNorm` / `Qwen3NextRMSNormGated` (and the
/// engine's `rms_norm_eps` check) take it: a negative one can make `mean(x^2) + eps` negative
/// (NaN), and `0` turns an all-zero row into `0 * rsqrt(0) = NaN`.
pub(crate) fn check_eps(op: &'static str, eps: f32) -> crate::Result<()> {
    if eps.is_finite() && eps > 0.0 {
        Ok(())
    } else {
        Err(crate::RefError::Invalid {
            op,
            what: "eps",
            msg: format!("must be finite and > 0, got {eps}"),
        })
    }
}

/// `1 / sqrt(mean(x^2) + eps)` of one row in f32 (sum of squares accumulated in f64, the mean
/// rounded to f32, as torch's f32 `pow(2).mean()` then `rsqrt`).
pub(crate) fn inv_rms(x: &[f32], eps: f32) -> f32 {
    let ms = (crate::check::dot(x, x) / x.len() as f64) as f32;
    1.0 / (ms + eps).sqrt()
}
