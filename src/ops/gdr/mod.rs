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
    /// Elements of one slot of the state pool: `H_v * K * V`.
    #[must_use]
    pub fn state_per_slot(&self) -> usize {
        self.h_v * self.k * self.v
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
