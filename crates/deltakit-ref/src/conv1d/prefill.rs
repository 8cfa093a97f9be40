//! `conv1d.prefill`: causal depthwise conv1d + SiLU over a varlen batch.

use super::{run, validate, ConvDims};
use crate::{Elem, Result, Varlen};

/// Causal depthwise conv1d with SiLU over a varlen batch, carrying per-sequence conv state.
///
/// Mirrors HF `causal_conv1d_fn(x, weight, bias, activation="silu")` as used by
/// `Qwen3_5GatedDeltaNet` in prefill, extended (like the `causal_conv1d_fn` `initial_states` /
/// vLLM `cache_indices` variant) with an initial state: sequence `i` sees its slot's `W-1` stored
/// inputs (or zeros, per `varlen.has_initial_state`) before its first token, so
/// `out[t, c] = silu(bias[c] + sum_w weight[c, w] * x_ext[t + w])` over the history-extended
/// input. Afterwards the slot holds the last `W-1` inputs of history + sequence (so a sequence
/// shorter than `W-1` keeps part of the old history). Padding sequences (slot -1): zero output, no
/// state change.
///
/// Shapes: `x`, `out`: `[T, conv_dim]`; `weight`: `[conv_dim, W]`; `bias`: `[conv_dim]`;
/// `conv_state`: `[num_slots, conv_dim, W-1]`.
///
/// # Errors
/// [`crate::RefError::Unsupported`] for `W` outside `2..=4`; [`crate::RefError::Shape`] for
/// length mismatches; [`crate::RefError::Invalid`] for bad `cu_seqlens` / slots.
pub fn prefill<T: Elem>(
    x: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    dims: ConvDims,
    varlen: Varlen<'_>,
    conv_state: &mut [T],
    out: &mut [T],
) -> Result<()> {
    const OP: &str = "conv1d.prefill";
    let (t, num_slots) = validate(OP, x.len(), weight, bias, dims, conv_state.len(), out.len())?;
    let seqs = varlen.validate(OP, t, num_slots)?;
    run(&seqs, x, weight, bias, dims, conv_state, out);
    Ok(())
}
