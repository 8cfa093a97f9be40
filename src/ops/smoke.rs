//! `smoke.axpy` (CUDA C++) and `smoke.vadd` (Triton AOT): the pipeline smoke ops of issue 2.
//! CPU twins: `deltakit_ref::smoke::{axpy_bf16, vadd_f32}`.

use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut};
use half::bf16;

use crate::error::{Error, Result};
use crate::ffi;
use crate::launch::{bind, check, raw_stream, same_context};

/// `y = bf16(alpha * x + y)` elementwise over bf16 vectors, f32 FMA, one rounding (RNE).
///
/// Shapes: `x`, `y` are `[n]` (any `n`, including 0; 16-byte aligned buffers take the vectorized
/// path). Enqueued on `stream`; `y` is written in place.
///
/// # Errors
/// [`Error::Shape`] if `x.len() != y.len()`; [`Error::DeviceMismatch`] if a buffer lives on another
/// context; [`Error::Launch`] / [`Error::Driver`] if CUDA fails.
pub fn axpy_bf16(
    stream: &CudaStream,
    alpha: f32,
    x: &impl DevicePtr<bf16>,
    y: &mut impl DevicePtrMut<bf16>,
) -> Result<()> {
    const OP: &str = "smoke.axpy";
    if x.len() != y.len() {
        return Err(Error::shape(OP, "y", format!("len {} (= x.len())", x.len()), y.len()));
    }
    same_context(OP, "x", stream, x)?;
    same_context(OP, "y", stream, y)?;
    bind(stream)?;
    let (xp, _gx) = x.device_ptr(stream);
    let (yp, _gy) = y.device_ptr_mut(stream);
    let params = ffi::DkAxpyParams { x: xp, y: yp, n: x.len() as i64, alpha };
    // SAFETY: pointers are live device allocations of `n` bf16 in the stream's context, held by
    // the borrows above until the launch is enqueued; the launcher validates the rest.
    check(OP, unsafe { ffi::dk_smoke_axpy_bf16(&raw const params, raw_stream(stream)) })
}

/// Block size the `smoke_vadd_f32` specialization was compiled with (triton_aot/manifest.toml).
const VADD_BLOCK: usize = 1024;

/// `out = a + b` elementwise over f32 vectors (Triton AOT kernel `smoke_vadd_f32`).
///
/// Shapes: `a`, `b`, `out` are `[n]`; all three 16-byte aligned (the specialization assumes it).
///
/// # Errors
/// [`Error::Shape`] on a length mismatch or misaligned buffer; [`Error::DeviceMismatch`],
/// [`Error::Launch`], [`Error::Driver`] as for [`axpy_bf16`].
pub fn vadd_f32(
    stream: &CudaStream,
    a: &impl DevicePtr<f32>,
    b: &impl DevicePtr<f32>,
    out: &mut impl DevicePtrMut<f32>,
) -> Result<()> {
    const OP: &str = "smoke.vadd";
    let n = a.len();
    if b.len() != n {
        return Err(Error::shape(OP, "b", format!("len {n} (= a.len())"), b.len()));
    }
    if out.len() != n {
        return Err(Error::shape(OP, "out", format!("len {n} (= a.len())"), out.len()));
    }
    let blocks = n.div_ceil(VADD_BLOCK);
    let grid_x = u32::try_from(blocks).map_err(|_| {
        Error::shape(OP, "a", format!("len <= {}", u32::MAX as usize * VADD_BLOCK), n)
    })?;
    same_context(OP, "a", stream, a)?;
    same_context(OP, "b", stream, b)?;
    same_context(OP, "out", stream, out)?;
    bind(stream)?;
    let (ap, _ga) = a.device_ptr(stream);
    let (bp, _gb) = b.device_ptr(stream);
    let (op, _go) = out.device_ptr_mut(stream);
    for (arg, p) in [("a", ap), ("b", bp), ("out", op)] {
        if p % 16 != 0 {
            return Err(Error::shape(OP, arg, "a 16-byte aligned address", format!("{p:#x}")));
        }
    }
    if n == 0 {
        return Ok(());
    }
    // SAFETY: three live device buffers of n f32 in the stream's context (checked above).
    check(OP, unsafe {
        ffi::dk_triton_smoke_vadd_f32(raw_stream(stream), grid_x, 1, 1, ap, bp, op, n as i64)
    })
}
