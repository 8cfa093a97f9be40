//! Causal depthwise conv1d + SiLU of the GDR layers (`Qwen3_5GatedDeltaNet.conv1d`).
//!
//! Layouts: input/output `[T, conv_dim]` token-major; `weight` `[conv_dim, W]` (HF
//! `conv1d.weight` is `[conv_dim, 1, W]`: drop the middle dim), tap `W-1` multiplies the newest
//! token; optional `bias` `[conv_dim]`; conv state pool `[num_slots, conv_dim, W-1]`, each channel's
//! `W-1` most recent inputs oldest first. Compute is f32 (bias + taps accumulated in f32 in tap
//! order, SiLU in f32), output rounded to `T` once, as the `causal_conv1d` CUDA kernels do. The
//! state holds raw inputs, so it is exact in the input dtype.

mod prefill;
mod update;

pub use prefill::prefill;
pub use update::update;

use crate::varlen::Seq;
use crate::{check, Elem, RefError, Result};

/// Conv dims: channels and kernel width.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvDims {
    /// Channels (`2 * H_k * K + H_v * V` for a GDR layer).
    pub conv_dim: usize,
    /// Kernel width `W` in `2..=4`.
    pub width: usize,
}

/// Validate dims, weight, bias and `x`/`out`; return (tokens, num_slots).
fn validate<T: Elem>(
    op: &'static str,
    x_len: usize,
    weight: &[T],
    bias: Option<&[T]>,
    d: ConvDims,
    state_len: usize,
    out_len: usize,
) -> Result<(usize, usize)> {
    if !(2..=4).contains(&d.width) {
        return Err(RefError::Unsupported {
            op,
            what: "dims.width",
            got: d.width.to_string(),
            supported: "2, 3, 4",
        });
    }
    check::nonzero(op, "dims.conv_dim", d.conv_dim)?;
    check::len(op, "weight", weight.len(), check::prod(op, "weight", &[d.conv_dim, d.width])?)?;
    if let Some(b) = bias {
        check::len(op, "bias", b.len(), d.conv_dim)?;
    }
    let t = check::rows(op, "x", x_len, d.conv_dim)?;
    check::len(op, "out", out_len, x_len)?;
    let per_slot = check::prod(op, "conv_state", &[d.conv_dim, d.width - 1])?;
    let slots = check::rows(op, "conv_state", state_len, per_slot)?;
    Ok((t, slots))
}

/// Run validated sequences (shared by prefill and update).
fn run<T: Elem>(
    seqs: &[Seq],
    x: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    d: ConvDims,
    state: &mut [T],
    out: &mut [T],
) {
    let (cd, w) = (d.conv_dim, d.width);
    let hist_len = w - 1;
    let per_slot = cd * hist_len;
    // Per channel: history (W-1 oldest first) followed by the sequence's inputs.
    let mut ext: Vec<f32> = Vec::new();
    let mut wc = vec![0f32; w];
    for seq in seqs {
        let Some(slot) = seq.slot else {
            out[seq.start * cd..(seq.start + seq.len) * cd].fill(T::from_f32(0.0));
            continue;
        };
        let st = &mut state[slot * per_slot..(slot + 1) * per_slot];
        for c in 0..cd {
            ext.clear();
            let hist = &st[c * hist_len..(c + 1) * hist_len];
            if seq.init {
                ext.extend(hist.iter().map(|e| e.to_f32()));
            } else {
                ext.resize(hist_len, 0.0);
            }
            ext.extend((seq.start..seq.start + seq.len).map(|t| x[t * cd + c].to_f32()));
            for (d, s) in wc.iter_mut().zip(&weight[c * w..(c + 1) * w]) {
                *d = s.to_f32();
            }
            let b = bias.map_or(0.0, |b| b[c].to_f32());
            for j in 0..seq.len {
                let mut acc = b;
                for (tap, &wt) in wc.iter().enumerate() {
                    acc += wt * ext[j + tap];
                }
                out[(seq.start + j) * cd + c] = T::from_f32(check::silu(acc));
            }
            let tail = &ext[ext.len() - hist_len..];
            for (dst, &v) in st[c * hist_len..(c + 1) * hist_len].iter_mut().zip(tail) {
                *dst = T::from_f32(v);
            }
        }
    }
}
