//! `attn.qk_norm`: per-head zero-centred RMSNorm of q and k.

use crate::{Elem, Result};

/// Per-head q/k RMSNorm, mirroring HF `Qwen3_5Attention`'s `q_norm` / `k_norm`
/// (`Qwen3_5RMSNorm` over `head_dim`, weight `(1 + w)`, f32 compute, one rounding), applied before
/// RoPE. Same math as [`crate::norm::rms_norm`] with `D = head_dim`.
///
/// Shapes: `x`, `out`: `[T, H, hd]`; `w`: `[hd]`.
///
/// # Errors
/// [`crate::RefError::Shape`] if `hd == 0`, `x.len() % hd != 0` or `out.len() != x.len()`;
/// [`crate::RefError::Invalid`] for an `eps` that is not finite and `> 0`.
pub fn qk_norm<T: Elem>(x: &[T], w: &[T], eps: f32, out: &mut [T]) -> Result<()> {
    crate::norm::rms_norm_op("attn.qk_norm", x, w, eps, out)
}
