//! Gated delta rule ("GDR"), the linear-attention core of Qwen3.5 / Qwen3-Next
//! `Qwen3_5GatedDeltaNet` layers.
//!
//! Layouts (token-major, `T` packed tokens): `q`, `k` `[T, H_k, K]`; `v` `[T, H_v, V]`;
//! `g`, `beta` f32 `[T, H_v]`; output `[T, H_v, V]`; state pool f32 `[num_slots, H_v, K, V]`
//! (V contiguous). Value head `hv` reads key head `hv / (H_v / H_k)` (HF `repeat_interleave`).
//!
//! Recurrence per token and value head, f32 state `S [K, V]`:
//! `S *= exp(g); delta = beta * (v - S^T k); S += k (x) delta; o = S^T q`, with `q`, `k`
//! optionally L2-normalised and `q` scaled (see [`GdrOptions`]).

mod chunked;
mod gating;
mod l2norm;
mod recurrent;

pub use chunked::{chunk_prefill, CHUNK_SIZES};
pub use gating::{gating, sigmoid, softplus};
pub use l2norm::{l2norm, L2NORM_EPS};
pub use recurrent::{decode, recurrent_prefill};

use crate::{check, Elem, Result};

/// Head counts and head dims of a GDR layer (per rank).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GdrDims {
    /// Number of key (and query) heads `H_k`.
    pub h_k: usize,
    /// Number of value heads `H_v`; must be a multiple of `h_k`.
    pub h_v: usize,
    /// Key head dim `K`.
    pub k: usize,
    /// Value head dim `V` (may differ from `K`).
    pub v: usize,
}

impl GdrDims {
    /// Elements of one slot of the state pool: `H_v * K * V` (saturating at `usize::MAX` for
    /// dims whose product overflows, as the GPU crate's `GdrDims`: no state of that size fits in
    /// memory, and the ops reject such dims with a typed error naming `state`).
    #[must_use]
    pub fn state_per_slot(&self) -> usize {
        self.h_v.saturating_mul(self.k).saturating_mul(self.v)
    }
}

/// Options of the GDR ops (HF `use_qk_l2norm_in_kernel`, FLA `scale`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GdrOptions {
    /// L2-normalise q and k over K (`x * rsqrt(sum x^2 + 1e-6)`, f32) before use.
    pub use_qk_l2norm: bool,
    /// Multiplier applied to q after the L2 norm; `None` = `K^-0.5`.
    pub scale: Option<f32>,
}

impl Default for GdrOptions {
    /// `use_qk_l2norm = true`, `scale = None` (K^-0.5): what Qwen3.5 uses.
    fn default() -> Self {
        Self { use_qk_l2norm: true, scale: None }
    }
}

/// Per-token inputs of a GDR op.
///
/// `q`, `k`: `[T, H_k, K]`; `v`: `[T, H_v, V]` (dtype `T`: f32 or bf16, widened to f32);
/// `g` (log-decay, from [`gating`]) and `beta` (from [`gating`]): f32 `[T, H_v]`.
///
/// The ops check `g` and `beta` (the gate parameters) for values the recurrence does not define;
/// `q`, `k`, `v` are activations and are not scanned: a NaN / inf there propagates into the
/// output and the sequence's state, as in the GPU kernels.
#[derive(Clone, Copy, Debug)]
pub struct GdrInputs<'a, T> {
    /// Queries `[T, H_k, K]`.
    pub q: &'a [T],
    /// Keys `[T, H_k, K]`.
    pub k: &'a [T],
    /// Values `[T, H_v, V]`.
    pub v: &'a [T],
    /// Log-decay `g <= 0` (`-inf` = full decay), f32 `[T, H_v]`.
    pub g: &'a [f32],
    /// Write strength `beta`, f32 `[T, H_v]`.
    pub beta: &'a [f32],
}

/// `g` must be `<= 0` (not NaN, not positive) on every token of a live sequence (padding
/// sequences' tokens are never read, so they are not checked); `g = -inf` is accepted: it is what
/// [`gating`] gives when `exp(A_log)` overflows, and the recurrence defines it as a full decay
/// (`exp(-inf) = 0`). `beta` must be finite on the same tokens (NaN / inf would poison the
/// state). `opts.scale` must be finite. Shared by every GDR op so they accept and reject the same
/// inputs.
fn check_g_and_opts(
    op: &'static str,
    g: &[f32],
    beta: &[f32],
    seqs: &[crate::varlen::Seq],
    h_v: usize,
    opts: GdrOptions,
) -> Result<()> {
    if let Some(s) = opts.scale {
        crate::check::finite(op, "opts.scale", s)?;
    }
    for seq in seqs.iter().filter(|s| s.slot.is_some()) {
        let range = seq.start * h_v..(seq.start + seq.len) * h_v;
        // Rejects NaN and positive gates; -inf (a full decay) passes.
        if let Some((i, &gi)) =
            g[range.clone()].iter().enumerate().find(|(_, g)| g.is_nan() || **g > 0.0)
        {
            return Err(crate::RefError::Invalid {
                op,
                what: "g",
                msg: format!(
                    "log-decay must be <= 0 (-inf allowed), got g[{}] = {gi}",
                    range.start + i
                ),
            });
        }
        if let Some((i, &bi)) = beta[range.clone()].iter().enumerate().find(|(_, b)| !b.is_finite())
        {
            return Err(crate::RefError::Invalid {
                op,
                what: "beta",
                msg: format!("must be finite, got beta[{}] = {bi}", range.start + i),
            });
        }
    }
    Ok(())
}

/// Validate dims and input lengths; return the token count `T` and the slot count of `state`.
fn validate_io<T: Elem>(
    op: &'static str,
    inp: &GdrInputs<'_, T>,
    d: GdrDims,
    state_len: usize,
    out_len: usize,
) -> Result<(usize, usize)> {
    check::nonzero(op, "dims.h_k", d.h_k)?;
    check::nonzero(op, "dims.h_v", d.h_v)?;
    check::nonzero(op, "dims.k", d.k)?;
    check::nonzero(op, "dims.v", d.v)?;
    if d.h_v % d.h_k != 0 {
        return Err(crate::RefError::Shape {
            op,
            what: "dims.h_v",
            expected: format!("a multiple of h_k = {}", d.h_k),
            got: d.h_v.to_string(),
        });
    }
    let qk_row = check::prod(op, "q", &[d.h_k, d.k])?;
    let v_row = check::prod(op, "v", &[d.h_v, d.v])?;
    let t = check::rows(op, "q", inp.q.len(), qk_row)?;
    check::len(op, "k", inp.k.len(), t * qk_row)?;
    check::len(op, "v", inp.v.len(), check::prod(op, "v", &[t, v_row])?)?;
    check::len(op, "g", inp.g.len(), t * d.h_v)?;
    check::len(op, "beta", inp.beta.len(), t * d.h_v)?;
    check::len(op, "out", out_len, t * v_row)?;
    let per_slot = check::prod(op, "state", &[d.h_v, d.k, d.v])?;
    let slots = check::rows(op, "state", state_len, per_slot)?;
    Ok((t, slots))
}

/// Prepared f32 q (normalised, scaled) and k (normalised), `[T, H_k, K]` each.
fn prepare_qk<T: Elem>(
    inp: &GdrInputs<'_, T>,
    d: GdrDims,
    opts: GdrOptions,
) -> (Vec<f32>, Vec<f32>) {
    let mut q: Vec<f32> = inp.q.iter().map(|x| x.to_f32()).collect();
    let mut k: Vec<f32> = inp.k.iter().map(|x| x.to_f32()).collect();
    if opts.use_qk_l2norm {
        for row in q.chunks_exact_mut(d.k).chain(k.chunks_exact_mut(d.k)) {
            l2norm::l2norm_row(row, L2NORM_EPS);
        }
    }
    let scale = opts.scale.unwrap_or_else(|| 1.0 / (d.k as f32).sqrt());
    for x in &mut q {
        *x *= scale;
    }
    (q, k)
}

#[cfg(test)]
mod tests {
    use super::GdrDims;

    /// Session 11 (robust2): `state_per_slot` saturates instead of wrapping (release) or
    /// panicking (debug), as the GPU crate's version.
    #[test]
    fn state_per_slot_saturates() {
        let d = GdrDims { h_k: 1, h_v: 1 << 40, k: 1 << 20, v: 1 << 20 };
        assert_eq!(d.state_per_slot(), usize::MAX);
        let d = GdrDims { h_k: 1, h_v: usize::MAX, k: 2, v: 1 };
        assert_eq!(d.state_per_slot(), usize::MAX);
        assert_eq!(GdrDims { h_k: 2, h_v: 4, k: 16, v: 32 }.state_per_slot(), 2048);
    }
}
