//! MLP pieces: `mlp.silu_and_mul`, `mlp.matmul`, `mlp.embedding`.

use std::borrow::Cow;

use ndarray::linalg::general_mat_mul;
use ndarray::{ArrayView2, ArrayViewMut2};

use crate::{check, Elem, RefError, Result};

/// SwiGLU activation, mirroring HF `Qwen3_5MLP`'s `act_fn(gate_proj(x)) * up_proj(x)` on the
/// merged `[gate | up]` projection (vLLM `SiluAndMul`): per row, `out = T(T(silu(gate)) * up)`
/// (HF rounds the activation and the product in the model dtype; SiLU in f32).
///
/// Shapes: `x`: `[T, 2 I]`, each row `[gate (I) | up (I)]`; `out`: `[T, I]` with `I = inter`.
///
/// # Errors
/// [`RefError::Shape`] if `inter == 0` or the lengths disagree.
pub fn silu_and_mul<T: Elem>(x: &[T], inter: usize, out: &mut [T]) -> Result<()> {
    const OP: &str = "mlp.silu_and_mul";
    let t = check::rows(OP, "x", x.len(), check::prod(OP, "x", &[2, inter])?)?;
    check::len(OP, "out", out.len(), t * inter)?;
    for (xr, or) in x.chunks_exact(2 * inter).zip(out.chunks_exact_mut(inter)) {
        let (g, u) = xr.split_at(inter);
        for ((o, gi), ui) in or.iter_mut().zip(g).zip(u) {
            let a = T::round(check::silu(gi.to_f32()));
            *o = T::from_f32(a * ui.to_f32());
        }
    }
    Ok(())
}

fn widen<T: Elem>(x: &[T]) -> Cow<'_, [f32]> {
    T::as_f32_slice(x)
        .map_or_else(|| Cow::Owned(x.iter().map(|e| e.to_f32()).collect()), Cow::Borrowed)
}

/// Linear layer without bias, `out = x W^T`, mirroring `torch.nn.Linear` (HF `*_proj`) with the
/// torch weight layout. f32 inputs and f32 accumulation through the `matrixmultiply` sgemm (via
/// `ndarray`), like a bf16 cuBLAS GEMM with f32 accumulate; output rounded to `T` once.
///
/// Shapes: `x`: `[M, K]`; `w`: `[N, K]` (row-major, torch `Linear.weight`); `out`: `[M, N]`.
///
/// # Errors
/// [`RefError::Shape`] if `K` or `N` is 0 or the lengths disagree.
pub fn matmul<T: Elem>(x: &[T], w: &[T], k: usize, n: usize, out: &mut [T]) -> Result<()> {
    const OP: &str = "mlp.matmul";
    check::nonzero(OP, "n", n)?;
    let m = check::rows(OP, "x", x.len(), k)?;
    check::len(OP, "w", w.len(), check::prod(OP, "w", &[n, k])?)?;
    check::len(OP, "out", out.len(), check::prod(OP, "out", &[m, n])?)?;
    let (xf, wf) = (widen(x), widen(w));
    let shape_err =
        |e: ndarray::ShapeError| RefError::Invalid { op: OP, what: "x", msg: e.to_string() };
    let xa = ArrayView2::from_shape((m, k), &xf[..]).map_err(shape_err)?;
    let wa = ArrayView2::from_shape((n, k), &wf[..]).map_err(shape_err)?;
    let mut y = vec![0f32; m * n];
    {
        let mut ya = ArrayViewMut2::from_shape((m, n), &mut y[..]).map_err(shape_err)?;
        general_mat_mul(1.0, &xa, &wa.t(), 0.0, &mut ya);
    }
    for (o, &v) in out.iter_mut().zip(&y) {
        *o = T::from_f32(v);
    }
    Ok(())
}

/// Embedding gather, mirroring `torch.nn.Embedding` (HF `embed_tokens`): `out[t] = table[ids[t]]`
/// (exact copy).
///
/// Shapes: `ids`: `i32 [T]`; `table`: `[vocab, D]`; `out`: `[T, D]`.
///
/// # Errors
/// [`RefError::Shape`] for length mismatches or `D == 0`; [`RefError::Invalid`] for an id outside
/// `0..vocab`.
pub fn embedding<T: Elem>(ids: &[i32], table: &[T], d: usize, out: &mut [T]) -> Result<()> {
    const OP: &str = "mlp.embedding";
    let vocab = check::rows(OP, "table", table.len(), d)?;
    check::len(OP, "out", out.len(), check::prod(OP, "out", &[ids.len(), d])?)?;
    if let Some((i, &id)) =
        ids.iter().enumerate().find(|(_, &id)| usize::try_from(id).map_or(true, |u| u >= vocab))
    {
        return Err(RefError::Invalid {
            op: OP,
            what: "ids",
            msg: format!("[{i}] = {id} outside 0..{vocab}"),
        });
    }
    for (o, &id) in out.chunks_exact_mut(d).zip(ids) {
        let id = id as usize;
        o.copy_from_slice(&table[id * d..(id + 1) * d]);
    }
    Ok(())
}
