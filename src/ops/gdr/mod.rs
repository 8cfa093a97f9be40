//! `gdr.*`: gated delta rule kernels (the linear-attention core of Qwen3.5 / Qwen3-Next
//! `Qwen3_5GatedDeltaNet` layers). CPU twins: `deltakit_ref::gdr`.

pub mod chunk_prefill;
pub mod decode;

pub use decode::{decode, DecodeStrides};

use crate::error::Error;

/// Key head dims `K` that [`decode`] and [`chunk_prefill::chunk_prefill`] are built for. 64 and
/// 128 are the tuned sizes (Qwen3.5 / Qwen3-Next use 128); 16 and 32 serve the tiny test models.
pub const SUPPORTED_K: [usize; 4] = [16, 32, 64, 128];
/// Value head dims `V` that [`decode`] and [`chunk_prefill::chunk_prefill`] are built for (any
/// combination with [`SUPPORTED_K`]). 64 and 128 are the tuned sizes; 16 and 32 serve the tiny
/// test models.
pub const SUPPORTED_V: [usize; 4] = [16, 32, 64, 128];

/// Whether [`decode`] and [`chunk_prefill::chunk_prefill`] are built for head dims `(k, v)`, i.e.
/// a GDR layer with them runs on the GPU end to end: `k` in [`SUPPORTED_K`], `v` in
/// [`SUPPORTED_V`] (`K < 64` and `V < 64` run the tuned tile shapes, padded and masked).
#[must_use]
pub fn head_dims_supported(k: usize, v: usize) -> bool {
    SUPPORTED_K.contains(&k) && SUPPORTED_V.contains(&v)
}

/// The q scale of [`decode`] / [`chunk_prefill::chunk_prefill`]: `opts.scale`, or `K^-0.5`.
/// A non-finite `opts.scale` is [`Error::Shape`] naming `opts.scale` (as the reference ops:
/// NaN / inf would silently poison every output and state).
fn q_scale(op: &'static str, opts: GdrOptions, k: usize) -> crate::error::Result<f32> {
    match opts.scale {
        Some(s) if !s.is_finite() => Err(Error::shape(op, "opts.scale", "finite", s)),
        Some(s) => Ok(s),
        None => Ok(1.0 / (k as f32).sqrt()),
    }
}

/// The [`Error::Unsupported`] of [`decode`] / [`chunk_prefill::chunk_prefill`] for head dims
/// outside their built set.
fn unsupported_head_dims(op: &'static str, k: usize, v: usize) -> Error {
    Error::Unsupported {
        op,
        what: format!(
            "head dims K = {k}, V = {v} (supported: K in {SUPPORTED_K:?}, V in {SUPPORTED_V:?})"
        ),
    }
}

/// Head counts and head dims of a GDR layer (per rank).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GdrDims {
    /// Number of key (and query) heads `H_k`.
    pub h_k: usize,
    /// Number of value heads `H_v`; a multiple of `h_k`.
    pub h_v: usize,
    /// Key head dim `K`.
    pub k: usize,
    /// Value head dim `V` (may differ from `K`).
    pub v: usize,
}

impl GdrDims {
    /// Elements of one slot of the state pool: `H_v * K * V` (saturating at `usize::MAX` for
    /// dims whose product overflows: no state of that size fits in memory, and the ops reject
    /// such dims with [`Error::Shape`]).
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Session-11 review: the GPU GDR ops took a NaN / inf `opts.scale` (the reference ops reject
    /// it); now both do, naming the argument.
    #[test]
    #[allow(clippy::float_cmp)] // exact: 1/sqrt(64) and a passed-through value
    fn non_finite_scale_is_a_shape_error() {
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let opts = GdrOptions { scale: Some(bad), ..GdrOptions::default() };
            let e = q_scale("gdr.decode", opts, 128).unwrap_err();
            assert!(matches!(e, Error::Shape { arg: "opts.scale", .. }), "{bad}: {e}");
        }
        assert_eq!(q_scale("gdr.decode", GdrOptions::default(), 64).unwrap(), 0.125);
        let opts = GdrOptions { scale: Some(0.5), ..GdrOptions::default() };
        assert_eq!(q_scale("gdr.decode", opts, 64).unwrap(), 0.5);
    }

    /// `state_per_slot` saturates instead of wrapping (or panicking in debug builds).
    #[test]
    fn state_per_slot_saturates() {
        let d = GdrDims { h_k: 1, h_v: 1 << 40, k: 1 << 20, v: 1 << 20 };
        assert_eq!(d.state_per_slot(), usize::MAX);
        assert_eq!(GdrDims { h_k: 2, h_v: 4, k: 16, v: 32 }.state_per_slot(), 2048);
    }
}
