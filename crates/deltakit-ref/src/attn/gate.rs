//! `attn.split_q_gate` and `attn.output_gate`: the gated-attention q/gate handling.

use crate::{check, Elem, Result};

/// Split the q projection into query and gate, mirroring the start of HF
/// `Qwen3_5Attention.forward` (`q_proj(x).view(.., H_q, 2 hd)` then `chunk(2, dim=-1)`): each head's
/// `2 hd` row is `[q_h | gate_h]` (per-head interleaved, not `[all q | all gate]`).
///
/// Shapes: `q_proj`: `[T, H_q, 2 hd]`; `q`, `gate`: `[T, H_q, hd]`. Exact copies (no rounding).
///
/// # Errors
/// [`crate::RefError::Shape`] if a dim is 0 or a length disagrees.
pub fn split_q_gate<T: Elem>(
    q_proj: &[T],
    n_heads: usize,
    head_dim: usize,
    q: &mut [T],
    gate: &mut [T],
) -> Result<()> {
    const OP: &str = "attn.split_q_gate";
    check::nonzero(OP, "n_heads", n_heads)?;
    let row = check::prod(OP, "q_proj", &[n_heads, 2, head_dim])?;
    let t = check::rows(OP, "q_proj", q_proj.len(), row)?;
    check::len(OP, "q", q.len(), t * n_heads * head_dim)?;
    check::len(OP, "gate", gate.len(), t * n_heads * head_dim)?;
    for (i, src) in q_proj.chunks_exact(2 * head_dim).enumerate() {
        q[i * head_dim..(i + 1) * head_dim].copy_from_slice(&src[..head_dim]);
        gate[i * head_dim..(i + 1) * head_dim].copy_from_slice(&src[head_dim..]);
    }
    Ok(())
}

/// Output gate, mirroring HF `Qwen3_5Attention.forward`'s `attn_output * torch.sigmoid(gate)` in
/// the model dtype: `out = T(attn * T(sigmoid(gate)))` (sigmoid in f32).
///
/// Shapes: `attn`, `gate`, `out`: `[T, H_q * hd]` (any equal lengths).
///
/// # Errors
/// [`crate::RefError::Shape`] if the lengths differ.
pub fn output_gate<T: Elem>(attn: &[T], gate: &[T], out: &mut [T]) -> Result<()> {
    const OP: &str = "attn.output_gate";
    check::len(OP, "gate", gate.len(), attn.len())?;
    check::len(OP, "out", out.len(), attn.len())?;
    for ((o, a), g) in out.iter_mut().zip(attn).zip(gate) {
        let s = T::round(check::sigmoid(g.to_f32()));
        *o = T::from_f32(a.to_f32() * s);
    }
    Ok(())
}
