//! `mlp.silu_and_mul`, `mlp.embedding` (CUDA C++, `csrc/mlp/elementwise.cu`).
//! CPU twins: `deltakit_ref::mlp::{silu_and_mul, embedding}`.

use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut};
use half::bf16;

use crate::error::{Error, Result};
use crate::ffi;
use crate::launch::{bind, check, raw_stream, same_context};
use crate::ops::validate;

/// SwiGLU on a merged `[gate | up]` projection (HF `Qwen3_5MLP`: `act_fn(gate_proj(x)) *
/// up_proj(x)`): `out[t, i] = bf16(bf16(silu(x[t, i])) * x[t, inter + i])`, silu in f32.
///
/// Shapes: `x` bf16 `[rows, 2 * inter]`; `out` bf16 `[rows, inter]`.
///
/// # Errors
/// [`Error::Shape`] if `inter == 0` or a length disagrees; [`Error::DeviceMismatch`];
/// [`Error::Launch`] / [`Error::Driver`].
pub fn silu_and_mul(
    stream: &CudaStream,
    x: &impl DevicePtr<bf16>,
    inter: usize,
    out: &mut impl DevicePtrMut<bf16>,
) -> Result<()> {
    const OP: &str = "mlp.silu_and_mul";
    let rows = silu_rows(x.len(), inter)?;
    validate::len(OP, "out", out.len(), rows * inter)?;
    same_context(OP, "x", stream, x)?;
    same_context(OP, "out", stream, out)?;
    if rows == 0 {
        return Ok(());
    }
    bind(stream)?;
    let (xp, _g1) = x.device_ptr(stream);
    let (op, _g2) = out.device_ptr_mut(stream);
    let params = ffi::DkSiluMulParams {
        x: xp,
        out: op,
        rows: validate::i64_of(OP, "x", rows)?,
        inter: validate::i64_of(OP, "inter", inter)?,
    };
    // SAFETY: live device buffers of the checked lengths in the stream's context.
    check(OP, unsafe { ffi::dk_mlp_silu_and_mul(&raw const params, raw_stream(stream)) })
}

/// Rows of [`silu_and_mul`]'s `x` (`[rows, 2 * inter]`, `inter > 0`). `2 * inter` is checked:
/// wrapped (to 0 for `inter = 2^63`) it made the length check divide by zero.
fn silu_rows(x_len: usize, inter: usize) -> Result<usize> {
    const OP: &str = "mlp.silu_and_mul";
    if inter == 0 {
        return Err(Error::shape(OP, "inter", "> 0", 0));
    }
    let x_row = validate::product(OP, "inter", &[2, inter])?;
    if x_len % x_row != 0 {
        return Err(Error::shape(OP, "x", format!("a multiple of 2 * inter = {x_row}"), x_len));
    }
    Ok(x_len / x_row)
}

/// Embedding gather (`torch.nn.Embedding`, HF `embed_tokens`): `out[t] = table[ids[t]]`, exact.
///
/// Shapes: `ids` i32 `[rows]` (device: in decode they come from the sampler); `table` bf16
/// `[vocab, d]` with `d = table.len() / vocab`; `out` bf16 `[rows, d]`. The ids are not copied
/// to the host: an id outside `0..vocab` makes its output row NaN (never a silent wrong row).
///
/// # Errors
/// [`Error::Shape`] if `vocab == 0`, `table.len()` is not a multiple of `vocab`, or
/// `out.len() != rows * d`; [`Error::DeviceMismatch`]; [`Error::Launch`] / [`Error::Driver`].
pub fn embedding(
    stream: &CudaStream,
    ids: &impl DevicePtr<i32>,
    table: &impl DevicePtr<bf16>,
    vocab: usize,
    out: &mut impl DevicePtrMut<bf16>,
) -> Result<()> {
    const OP: &str = "mlp.embedding";
    if vocab == 0 || table.len() % vocab != 0 || table.len() == 0 {
        return Err(Error::shape(
            OP,
            "table",
            format!("a non-empty multiple of vocab = {vocab}"),
            table.len(),
        ));
    }
    let d = table.len() / vocab;
    let rows = ids.len();
    validate::len(OP, "out", out.len(), validate::product(OP, "out", &[rows, d])?)?;
    same_context(OP, "ids", stream, ids)?;
    same_context(OP, "table", stream, table)?;
    same_context(OP, "out", stream, out)?;
    if rows == 0 {
        return Ok(());
    }
    bind(stream)?;
    let (ip, _g1) = ids.device_ptr(stream);
    let (tp, _g2) = table.device_ptr(stream);
    let (op, _g3) = out.device_ptr_mut(stream);
    let params = ffi::DkEmbeddingParams {
        ids: ip,
        table: tp,
        out: op,
        rows: validate::i64_of(OP, "ids", rows)?,
        vocab: validate::i64_of(OP, "vocab", vocab)?,
        d: validate::i64_of(OP, "table", d)?,
    };
    // SAFETY: live device buffers of the checked lengths; the kernel bounds-checks every id.
    check(OP, unsafe { ffi::dk_mlp_embedding(&raw const params, raw_stream(stream)) })
}

#[cfg(test)]
mod tests {
    use super::silu_rows;
    use crate::Error;

    /// Session-11 overflow audit: `inter = 2^63` wrapped `2 * inter` to 0 and the length check
    /// panicked (division by zero); now a typed error naming `inter`.
    #[test]
    fn silu_and_mul_rows_are_checked() {
        let e = silu_rows(0, 1 << 63).unwrap_err();
        assert!(matches!(e, Error::Shape { arg: "inter", .. }), "{e}");
        let e = silu_rows(8, 0).unwrap_err();
        assert!(matches!(e, Error::Shape { arg: "inter", .. }), "{e}");
        let e = silu_rows(10, 4).unwrap_err();
        assert!(matches!(e, Error::Shape { arg: "x", .. }), "{e}");
        assert_eq!(silu_rows(24, 4).unwrap(), 3);
    }
}
