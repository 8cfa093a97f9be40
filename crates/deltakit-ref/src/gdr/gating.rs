//! `gdr.gating`: decay and write strength from the `a`/`b` projections.

use crate::{check, Result};

/// Numerically stable softplus `ln(1 + e^x)` in f32, as `torch.nn.functional.softplus` (beta 1,
/// threshold 20: returns `x` for `x > 20`). Finite for every finite input.
#[must_use]
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// Numerically stable logistic sigmoid `1 / (1 + e^-x)` in f32 (`torch.sigmoid`).
#[must_use]
pub fn sigmoid(x: f32) -> f32 {
    check::sigmoid(x)
}

/// GDR gating, mirroring HF `Qwen3_5GatedDeltaNet.forward`:
/// `g = -exp(A_log) * softplus(a + dt_bias)` and `beta = sigmoid(b)`, all in f32.
///
/// Shapes: `a`, `b`, `g`, `beta`: f32 `[T, H_v]` (token-major); `a_log`, `dt_bias`: f32 `[H_v]`
/// with `H_v = a_log.len()`. bf16 inputs are widened by the caller (HF casts `a` to f32 first).
/// For a bf16 model HF computes `beta = b.sigmoid()` in bf16: round `beta` to bf16 afterwards
/// (e.g. [`crate::dtype::round_bf16`]) to mirror it; `g` stays f32 as in HF.
/// `g <= 0` or NaN: overflow can give `-inf` (large `A_log`), which the GDR ops take as a full
/// decay (`exp(-inf) = 0`), or NaN (`-inf * 0` when `softplus` also underflows to 0), exactly as
/// HF's formula does; the GDR ops reject a NaN `g`.
///
/// # Errors
/// [`crate::RefError::Shape`] if `H_v == 0` or any length disagrees with `[T, H_v]` / `[H_v]`.
pub fn gating(
    a: &[f32],
    b: &[f32],
    a_log: &[f32],
    dt_bias: &[f32],
    g: &mut [f32],
    beta: &mut [f32],
) -> Result<()> {
    const OP: &str = "gdr.gating";
    let h_v = a_log.len();
    check::nonzero(OP, "a_log", h_v)?;
    check::len(OP, "dt_bias", dt_bias.len(), h_v)?;
    let t = check::rows(OP, "a", a.len(), h_v)?;
    check::len(OP, "b", b.len(), t * h_v)?;
    check::len(OP, "g", g.len(), t * h_v)?;
    check::len(OP, "beta", beta.len(), t * h_v)?;
    for (i, (gi, &ai)) in g.iter_mut().zip(a).enumerate() {
        let h = i % h_v;
        *gi = -a_log[h].exp() * softplus(ai + dt_bias[h]);
    }
    for (bo, &bi) in beta.iter_mut().zip(b) {
        *bo = sigmoid(bi);
    }
    Ok(())
}
