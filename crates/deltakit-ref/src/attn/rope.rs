//! `attn.rope`: partial NeoX-style rotary position embedding.

use crate::{check, Elem, RefError, Result};

/// RoPE parameters (HF `rope_parameters`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeParams {
    /// Head dim `hd`.
    pub head_dim: usize,
    /// Rotated leading dims: `head_dim * partial_rotary_factor`; even, `0 < rotary_dim <= hd`.
    pub rotary_dim: usize,
    /// `rope_theta`.
    pub theta: f32,
}

/// Partial NeoX RoPE in place, mirroring HF `Qwen3_5TextRotaryEmbedding` (default rope type) +
/// `apply_rotary_pos_emb` with partial rotary: for `i < rotary_dim/2`,
/// `inv_freq_i = theta^(-2i / rotary_dim)` (f32), `angle = f32(pos) * inv_freq_i` (f32),
/// `c = T(cos angle)`, `s = T(sin angle)` and, with `x1 = x[i]`, `x2 = x[i + rotary_dim/2]`:
/// `x[i] = T(T(x1 c) + T(-x2 s))`, `x[i + rotary_dim/2] = T(T(x2 c) + T(x1 s))` (the rounding of
/// HF's bf16 `q * cos + rotate_half(q) * sin`; exact f32 math for `T = f32`). Dims
/// `>= rotary_dim` are untouched (bit-identical). Apply to q and k separately.
///
/// Deviations from HF, both documented and deliberate: `inv_freq` is computed in f64 and rounded
/// once (HF's f32 `base ** (arange / dim)` can differ by 1 ulp, which moves the angle by up to
/// ~1e-2 rad near position 2^18); and the interleaved MRoPE of `Qwen3_5TextRotaryEmbedding`
/// (`mrope_section`) equals this plain RoPE only when the three position axes are equal, i.e. for
/// text-only input, which is what the engine feeds.
///
/// Shapes: `x`: `[T, H, hd]`; `positions`: `[T]` (absolute token positions, `0 <= pos < 2^24` so
/// that `f32(pos)` is exact).
///
/// # Errors
/// [`RefError::Shape`] for length mismatches or `hd == 0`; [`RefError::Invalid`] for a
/// `rotary_dim` that is 0, odd or `> hd`, a non-finite or non-positive `theta`, or a position
/// outside `0..2^24`.
pub fn rope_neox<T: Elem>(
    x: &mut [T],
    n_heads: usize,
    positions: &[i64],
    p: RopeParams,
) -> Result<()> {
    const OP: &str = "attn.rope";
    check::nonzero(OP, "n_heads", n_heads)?;
    check::nonzero(OP, "params.head_dim", p.head_dim)?;
    if p.rotary_dim == 0 || p.rotary_dim % 2 != 0 || p.rotary_dim > p.head_dim {
        return Err(RefError::Invalid {
            op: OP,
            what: "params.rotary_dim",
            msg: format!("must be even and in 2..={}, got {}", p.head_dim, p.rotary_dim),
        });
    }
    if !(p.theta.is_finite() && p.theta > 0.0) {
        return Err(RefError::Invalid {
            op: OP,
            what: "params.theta",
            msg: format!("must be finite and > 0, got {}", p.theta),
        });
    }
    let row = check::prod(OP, "x", &[n_heads, p.head_dim])?;
    let t = check::rows(OP, "x", x.len(), row)?;
    check::len(OP, "positions", positions.len(), t)?;
    if let Some((i, &pos)) = positions.iter().enumerate().find(|(_, &q)| !(0..1 << 24).contains(&q))
    {
        return Err(RefError::Invalid {
            op: OP,
            what: "positions",
            msg: format!("[{i}] = {pos} outside 0..2^24"),
        });
    }
    if t == 0 {
        // Nothing to rotate (and no table of `rotary_dim / 2` frequencies to allocate for a
        // head dim that no token shows fits in memory).
        return Ok(());
    }
    let half = p.rotary_dim / 2;
    let inv_freq: Vec<f32> = (0..half)
        .map(|i| (1.0 / f64::from(p.theta).powf((2 * i) as f64 / p.rotary_dim as f64)) as f32)
        .collect();
    let mut cs = vec![(0f32, 0f32); half];
    for (tok, &pos) in positions.iter().enumerate() {
        for (c, &f) in cs.iter_mut().zip(&inv_freq) {
            let ang = f64::from(pos as f32 * f);
            *c = (T::round(ang.cos() as f32), T::round(ang.sin() as f32));
        }
        for head in x[tok * row..(tok + 1) * row].chunks_exact_mut(p.head_dim) {
            for (i, &(c, s)) in cs.iter().enumerate() {
                let x1 = head[i].to_f32();
                let x2 = head[i + half].to_f32();
                head[i] = T::from_f32(T::round(x1 * c) + T::round(-x2 * s));
                head[i + half] = T::from_f32(T::round(x2 * c) + T::round(x1 * s));
            }
        }
    }
    Ok(())
}
