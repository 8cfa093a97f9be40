//! `conv1d.update`: the decode-time conv step for one or more new tokens per row.

use super::{run, validate, ConvDims};
use crate::varlen::Seq;
use crate::{check, Elem, Result};

/// Causal conv1d + SiLU for `S >= 1` new tokens per row, reading and updating the conv state.
///
/// Mirrors HF `torch_causal_conv1d_update` / `causal_conv1d_update(x, conv_state, weight, bias,
/// "silu", conv_state_indices)` (the decode path of `Qwen3_5GatedDeltaNet`), with a state of
/// `W-1` (not `W`) columns: row `i` continues the sequence in slot `slots[i]`; afterwards the slot
/// holds the last `W-1` inputs. Row slot -1 = padding: zero output, no state change.
///
/// Shapes: `x`, `out`: `[N, S, conv_dim]` (`S = tokens_per_row`); `weight`: `[conv_dim, W]`;
/// `bias`: `[conv_dim]`; `slots`: `i32 [N]`; `conv_state`: `[num_slots, conv_dim, W-1]`.
///
/// # Errors
/// As [`super::prefill`]; `x.len()` must be `N * S * conv_dim` with `N = slots.len()`, `S > 0`.
#[allow(clippy::too_many_arguments)]
pub fn update<T: Elem>(
    x: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    dims: ConvDims,
    tokens_per_row: usize,
    slots: &[i32],
    conv_state: &mut [T],
    out: &mut [T],
) -> Result<()> {
    const OP: &str = "conv1d.update";
    let (t, num_slots) = validate(OP, x.len(), weight, bias, dims, conv_state.len(), out.len())?;
    check::nonzero(OP, "tokens_per_row", tokens_per_row)?;
    check::len(
        OP,
        "x rows (N * tokens_per_row)",
        t,
        check::prod(OP, "x", &[slots.len(), tokens_per_row])?,
    )?;
    let sl = check::slots(OP, "slots", slots, slots.len(), num_slots)?;
    let seqs: Vec<Seq> = sl
        .into_iter()
        .enumerate()
        .map(|(i, slot)| Seq { start: i * tokens_per_row, len: tokens_per_row, slot, init: true })
        .collect();
    run(&seqs, x, weight, bias, dims, conv_state, out);
    Ok(())
}
