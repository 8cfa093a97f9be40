//! Gated full attention of Qwen3.5 (`Qwen3_5Attention`): the q/gate split, q/k RMSNorm, partial
//! NeoX RoPE, the paged KV cache, causal GQA prefill attention with prior context, decode
//! attention, and the sigmoid output gate.
//!
//! Layouts: q `[T, H_q, hd]`; k, v `[T, H_kv, hd]`; query head `h` uses kv head
//! `h / (H_q / H_kv)`. Paged KV cache: `k_cache` and `v_cache` each `[num_pages, page_size, H_kv,
//! hd]` (num_pages = `len / (page_size H_kv hd)`); absolute token position `p` of sequence `i`
//! lives in page `page_table[i * max_pages + p / page_size]`, row `p % page_size`.

mod decode;
mod gate;
mod paged;
mod prefill;
mod qk_norm;
mod rope;

pub use decode::decode_paged;
pub use gate::{output_gate, split_q_gate};
pub use paged::{write_kv, KvDims, PageTable};
pub use prefill::{prefill_contiguous, prefill_paged};
pub use qk_norm::qk_norm;
pub use rope::{rope_neox, RopeParams};

/// The softmax scale: `scale`, or `1 / sqrt(head_dim)` when `None`.
///
/// # Errors
/// [`crate::RefError::Invalid`] for a non-finite `scale` (NaN / inf would make every score NaN).
pub(crate) fn softmax_scale(op: &'static str, scale: Option<f32>, hd: usize) -> crate::Result<f32> {
    match scale {
        Some(s) => crate::check::finite(op, "scale", s).map(|()| s),
        None => Ok(1.0 / (hd as f32).sqrt()),
    }
}

use crate::{check, Elem, RefError, Result};

/// Head counts and head dim of an attention layer (per rank).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnDims {
    /// Query heads `H_q`; a multiple of `n_kv_heads`.
    pub n_q_heads: usize,
    /// Key/value heads `H_kv`.
    pub n_kv_heads: usize,
    /// Head dim `hd`.
    pub head_dim: usize,
}

impl AttnDims {
    fn validate(&self, op: &'static str) -> Result<()> {
        check::nonzero(op, "dims.n_q_heads", self.n_q_heads)?;
        check::nonzero(op, "dims.n_kv_heads", self.n_kv_heads)?;
        check::nonzero(op, "dims.head_dim", self.head_dim)?;
        if self.n_q_heads % self.n_kv_heads != 0 {
            return Err(RefError::Shape {
                op,
                what: "dims.n_q_heads",
                expected: format!("a multiple of n_kv_heads = {}", self.n_kv_heads),
                got: self.n_q_heads.to_string(),
            });
        }
        Ok(())
    }
}

/// Softmax attention of one query over `n` keys: scores `(q.k_j)` (f64 sum, rounded to f32) times
/// `scale` in f32, f32 softmax with max subtraction (normaliser summed in f64), output
/// accumulated in f64. `key(j)` / `val(j)` give row j of the head's keys / values.
fn attend<'a, T: Elem>(
    q: &[f32],
    n: usize,
    key: impl Fn(usize) -> &'a [T],
    val: impl Fn(usize) -> &'a [T],
    scale: f32,
    scores: &mut Vec<f32>,
    acc: &mut [f64],
) {
    scores.clear();
    for j in 0..n {
        let d: f64 = q.iter().zip(key(j)).map(|(&a, b)| f64::from(a) * f64::from(b.to_f32())).sum();
        scores.push(d as f32 * scale);
    }
    let m = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut denom = 0f64;
    acc.fill(0.0);
    for (j, s) in scores.iter_mut().enumerate() {
        let p = (*s - m).exp();
        *s = p;
        denom += f64::from(p);
        for (a, v) in acc.iter_mut().zip(val(j)) {
            *a += f64::from(p) * f64::from(v.to_f32());
        }
    }
    for a in acc.iter_mut() {
        *a /= denom;
    }
}
