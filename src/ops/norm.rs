//! `norm.rms`, `norm.fused_add_rms`, `norm.rms_gated` (CUDA C++, `csrc/norm/`): the RMS norms of
//! Qwen3.5. CPU twins: `deltakit_ref::norm::{rms_norm, fused_add_rms_norm, rms_norm_gated}`.

use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut};
use half::bf16;

use crate::error::{Error, Result};
use crate::ffi;
use crate::launch::{bind, check, raw_stream, same_context};
use crate::ops::validate;

fn rows_of(op: &'static str, x_len: usize, d: usize) -> Result<usize> {
    if d == 0 {
        return Err(Error::shape(op, "w", "len > 0", 0));
    }
    if x_len % d != 0 {
        return Err(Error::shape(op, "x", format!("a multiple of d = w.len() = {d}"), x_len));
    }
    Ok(x_len / d)
}

/// Zero-centred RMSNorm over rows of `d = w.len()` (HF `Qwen3_5RMSNorm`):
/// `out = bf16(x * rsqrt(mean(x^2) + eps) * (1 + w))` in f32.
///
/// Shapes: `x`, `out` bf16 `[rows, d]` contiguous; `w` bf16 `[d]`.
///
/// # Errors
/// [`Error::Shape`] on length mismatch or an `eps` that is not finite and > 0;
/// [`Error::DeviceMismatch`];
/// [`Error::Launch`] / [`Error::Driver`].
pub fn rms(
    stream: &CudaStream,
    x: &impl DevicePtr<bf16>,
    w: &impl DevicePtr<bf16>,
    eps: f32,
    out: &mut impl DevicePtrMut<bf16>,
) -> Result<()> {
    const OP: &str = "norm.rms";
    let d = w.len();
    let rows = rows_of(OP, x.len(), d)?;
    validate::len(OP, "out", out.len(), x.len())?;
    validate::eps(OP, eps)?;
    same_context(OP, "x", stream, x)?;
    same_context(OP, "w", stream, w)?;
    same_context(OP, "out", stream, out)?;
    if rows == 0 {
        return Ok(());
    }
    bind(stream)?;
    let (xp, _g1) = x.device_ptr(stream);
    let (wp, _g2) = w.device_ptr(stream);
    let (op, _g3) = out.device_ptr_mut(stream);
    let params = ffi::DkRmsNormParams {
        x: xp,
        residual: 0,
        w: wp,
        out: op,
        rows: validate::i64_of(OP, "x", rows)?,
        d: validate::i64_of(OP, "w", d)?,
        eps,
    };
    // SAFETY: live device buffers of the checked lengths in the stream's context.
    check(OP, unsafe { ffi::dk_norm_rms(&raw const params, raw_stream(stream)) })
}

/// Residual add then zero-centred RMSNorm (vLLM `fused_add_rms_norm`):
/// `residual = bf16(residual + x)` (in place, the new residual stream), `out = rms(residual)`.
///
/// Shapes: `x`, `residual`, `out` bf16 `[rows, d]` contiguous; `w` bf16 `[d]`.
///
/// # Errors
/// As [`rms`]; also `residual.len() != x.len()`.
pub fn fused_add_rms(
    stream: &CudaStream,
    x: &impl DevicePtr<bf16>,
    residual: &mut impl DevicePtrMut<bf16>,
    w: &impl DevicePtr<bf16>,
    eps: f32,
    out: &mut impl DevicePtrMut<bf16>,
) -> Result<()> {
    const OP: &str = "norm.fused_add_rms";
    let d = w.len();
    let rows = rows_of(OP, x.len(), d)?;
    validate::len(OP, "residual", residual.len(), x.len())?;
    validate::len(OP, "out", out.len(), x.len())?;
    validate::eps(OP, eps)?;
    same_context(OP, "x", stream, x)?;
    same_context(OP, "residual", stream, residual)?;
    same_context(OP, "w", stream, w)?;
    same_context(OP, "out", stream, out)?;
    if rows == 0 {
        return Ok(());
    }
    bind(stream)?;
    let (xp, _g1) = x.device_ptr(stream);
    let (rp, _g2) = residual.device_ptr_mut(stream);
    let (wp, _g3) = w.device_ptr(stream);
    let (op, _g4) = out.device_ptr_mut(stream);
    let params = ffi::DkRmsNormParams {
        x: xp,
        residual: rp,
        w: wp,
        out: op,
        rows: validate::i64_of(OP, "x", rows)?,
        d: validate::i64_of(OP, "w", d)?,
        eps,
    };
    // SAFETY: live device buffers of the checked lengths in the stream's context.
    check(OP, unsafe { ffi::dk_norm_fused_add_rms(&raw const params, raw_stream(stream)) })
}

/// Gated RMSNorm per value head (HF `Qwen3_5RMSNormGated`), per row of `d = w.len()` (= V):
/// `n = bf16(x * rsqrt(mean(x^2) + eps))`, `y = bf16(w * n)` (plain `w`, not `1 + w`),
/// `out = bf16(y * silu(z))`, all products in f32.
///
/// Shapes: `x`, `z`, `out` bf16 `[rows, d]` contiguous (`[T, H_v, V]`); `w` bf16 `[d]`.
///
/// # Errors
/// As [`rms`]; also `z.len() != x.len()`.
pub fn rms_gated(
    stream: &CudaStream,
    x: &impl DevicePtr<bf16>,
    z: &impl DevicePtr<bf16>,
    w: &impl DevicePtr<bf16>,
    eps: f32,
    out: &mut impl DevicePtrMut<bf16>,
) -> Result<()> {
    rms_gated_strided(stream, x, (z, None), w, eps, out)
}

/// [`rms_gated`] with `z` as a strided column view of a merged projection: `z = (view, Some((
/// token_stride, heads)))` reads token `t`'s `heads` rows of `d` at `t * token_stride` (the
/// engine's `[in_proj_qkv | in_proj_z | in_proj_b | in_proj_a]` decode GEMM output, `heads =
/// H_v`); `None` is contiguous `[rows, d]`. `x` and `out` stay contiguous `[T * heads, d]`.
///
/// # Errors
/// As [`rms`]; `heads` of 0 or not dividing the row count, `token_stride < heads * d`, or a `z`
/// view shorter than its last row ([`Error::Shape`] naming `z`).
pub fn rms_gated_strided(
    stream: &CudaStream,
    x: &impl DevicePtr<bf16>,
    z: (&impl DevicePtr<bf16>, Option<(usize, usize)>),
    w: &impl DevicePtr<bf16>,
    eps: f32,
    out: &mut impl DevicePtrMut<bf16>,
) -> Result<()> {
    const OP: &str = "norm.rms_gated";
    let d = w.len();
    let rows = rows_of(OP, x.len(), d)?;
    let (z, zs) = z;
    let (z_token_stride, z_heads) = match zs {
        None => {
            validate::len(OP, "z", z.len(), x.len())?;
            (0, 1)
        }
        Some((stride, heads)) => {
            if heads == 0 || rows % heads != 0 {
                return Err(Error::shape(
                    OP,
                    "z heads",
                    format!("a divisor of {rows} rows"),
                    heads,
                ));
            }
            if stride < heads * d {
                return Err(Error::shape(
                    OP,
                    "z token stride",
                    format!(">= heads * d = {}", heads * d),
                    stride,
                ));
            }
            let tokens = rows / heads;
            // z must hold (tokens - 1) * stride + heads * d elements (checked arithmetic).
            validate::strided_len(OP, "z", z.len(), tokens, heads * d, Some(stride))?;
            (stride, heads)
        }
    };
    validate::len(OP, "out", out.len(), x.len())?;
    validate::eps(OP, eps)?;
    same_context(OP, "x", stream, x)?;
    same_context(OP, "z", stream, z)?;
    same_context(OP, "w", stream, w)?;
    same_context(OP, "out", stream, out)?;
    if rows == 0 {
        return Ok(());
    }
    bind(stream)?;
    let (xp, _g1) = x.device_ptr(stream);
    let (zp, _g2) = z.device_ptr(stream);
    let (wp, _g3) = w.device_ptr(stream);
    let (op, _g4) = out.device_ptr_mut(stream);
    let params = ffi::DkRmsNormGatedParams {
        x: xp,
        z: zp,
        w: wp,
        out: op,
        rows: validate::i64_of(OP, "x", rows)?,
        d: validate::i64_of(OP, "w", d)?,
        eps,
        z_token_stride: validate::i64_of(OP, "z token stride", z_token_stride)?,
        z_heads: validate::i64_of(OP, "z heads", z_heads)?,
    };
    // SAFETY: live device buffers of the checked lengths (z: up to its last strided row) in the
    // stream's context.
    check(OP, unsafe { ffi::dk_norm_rms_gated(&raw const params, raw_stream(stream)) })
}
