//! `init.dummy` (`csrc/init/dummy.cu`): seeded dummy weights generated on the device, bit for bit
//! as the CPU twin `deltakit_ref::init::dummy`.
//!
//! Every element is a pure function of `(seed, tensor_id, full-tensor index)` (splitmix64 of a
//! per-tensor key and the element's counter, mapped to a unit variate, `fma(scale, x, offset)`,
//! and `ln` for [`DummyDist::LogUniform`], rounded to bf16; exact definition in
//! `deltakit_ref::init`). A shard written with its [`DummyRegion`] therefore equals the same
//! slice of the full tensor, on any device, for any tensor-parallel degree.

use cudarc::driver::{CudaStream, DevicePtrMut};
use half::bf16;

use crate::error::{Error, Result};
use crate::ffi;
use crate::launch::{bind, check, raw_stream, same_context};
use crate::ops::validate;

const OP: &str = "init.dummy";

/// Distribution of [`DummyInit`] (`x`: the unit variate of an element).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DummyDist {
    /// Every element is `offset`.
    Constant,
    /// `fma(scale, x, offset)`, `x` uniform in `[-1, 1)` on a 24-bit grid.
    Uniform,
    /// `fma(scale, x, offset)`, `x` Irwin-Hall of four 16-bit uniforms, mean 0, std 1,
    /// `|x| < 3.47`.
    Normal,
    /// `ln(fma(scale, x, offset))`, `x` uniform: e.g. `A_log = ln(U(1, 16))` is `offset` 8.5,
    /// `scale` 7.5. Needs `offset - |scale| >= f32::MIN_POSITIVE`.
    LogUniform,
}

/// Parameters of one tensor's fill.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DummyInit {
    /// Base seed (one per model).
    pub seed: u64,
    /// Tensor identity (e.g. a hash of the checkpoint tensor name).
    pub tensor_id: u64,
    /// Distribution.
    pub dist: DummyDist,
    /// Scale of the unit variate (finite).
    pub scale: f32,
    /// Offset (finite).
    pub offset: f32,
}

/// A rectangular piece of the full tensor: `rows x cols` elements, `(r, c)` at full-tensor
/// index `base + r * ld + c` (a contiguous range: [`DummyRegion::contiguous`]; a column shard of
/// a `[R, C]` tensor: `base = c0, ld = C, rows = R, cols = c1 - c0`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DummyRegion {
    /// Full-tensor index of element `(0, 0)`.
    pub base: u64,
    /// Index distance between rows (`>= cols` when `rows > 1`).
    pub ld: u64,
    /// Rows.
    pub rows: u64,
    /// Columns.
    pub cols: u64,
}

impl DummyRegion {
    /// The contiguous range `start .. start + len` of the full tensor.
    #[must_use]
    pub fn contiguous(start: u64, len: u64) -> Self {
        Self { base: start, ld: len, rows: 1, cols: len }
    }
}

fn to_i64(arg: &'static str, v: u64) -> Result<i64> {
    i64::try_from(v).map_err(|_| Error::shape(OP, arg, "a value <= i64::MAX", v))
}

/// `init.dummy`: writes the elements of `region` of the tensor `p` into `out` (bf16
/// `[rows, cols]`, row-major, contiguous), enqueued on `stream`. Bitwise equal to
/// `deltakit_ref::init::dummy` with the same arguments. Safe inside a CUDA-graph capture (no
/// allocation, no synchronisation).
///
/// # Errors
/// [`Error::Shape`] naming `out` (length not `rows * cols`), `region` (overlapping rows, an index
/// past `i64::MAX`), `scale` or `offset` (non-finite, values overflowing f32, a `LogUniform`
/// range reaching below `f32::MIN_POSITIVE`); nothing is written then.
/// [`Error::DeviceMismatch`]; [`Error::Launch`] / [`Error::Driver`].
pub fn dummy(
    stream: &CudaStream,
    p: &DummyInit,
    region: DummyRegion,
    out: &mut impl DevicePtrMut<bf16>,
) -> Result<()> {
    // Region: lengths, row overlap, 64-bit index range.
    let n = region.rows.checked_mul(region.cols).and_then(|n| usize::try_from(n).ok());
    match n {
        Some(n) => validate::len(OP, "out", out.len(), n)?,
        None => return Err(Error::shape(OP, "region", "rows * cols fitting usize", region.rows)),
    }
    if region.rows > 1 && region.ld < region.cols {
        return Err(Error::shape(OP, "region", format!("ld >= cols = {}", region.cols), region.ld));
    }
    if region.rows > 0 && region.cols > 0 {
        let end = (region.rows - 1)
            .checked_mul(region.ld)
            .and_then(|x| x.checked_add(region.base))
            .and_then(|x| x.checked_add(region.cols));
        if end.is_none_or(|e| i64::try_from(e).is_err()) {
            return Err(Error::shape(OP, "region", "indices below 2^63", format!("{region:?}")));
        }
    }
    // Values: finite, no overflow, LogUniform's argument a positive normal f32.
    if !p.offset.is_finite() {
        return Err(Error::shape(OP, "offset", "a finite value", p.offset));
    }
    if !p.scale.is_finite() {
        return Err(Error::shape(OP, "scale", "a finite value", p.scale));
    }
    let (o, s) = (f64::from(p.offset), f64::from(p.scale).abs());
    let reach = match p.dist {
        DummyDist::Constant => 0.0,
        DummyDist::Uniform | DummyDist::LogUniform => s,
        DummyDist::Normal => 3.5 * s,
    };
    if o.abs() + reach > f64::from(f32::MAX) / 2.0 {
        return Err(Error::shape(OP, "scale", "|offset| + reach * |scale| < f32::MAX / 2", s));
    }
    if p.dist == DummyDist::LogUniform && o - s < f64::from(f32::MIN_POSITIVE) {
        return Err(Error::shape(
            OP,
            "offset",
            format!("offset - |scale| >= {:e} (LogUniform)", f32::MIN_POSITIVE),
            o - s,
        ));
    }
    same_context(OP, "out", stream, out)?;
    if out.len() == 0 {
        return Ok(());
    }
    bind(stream)?;
    let (op, _g) = out.device_ptr_mut(stream);
    let dist = match p.dist {
        DummyDist::Constant => ffi::DkInitDist_DK_INIT_CONSTANT,
        DummyDist::Uniform => ffi::DkInitDist_DK_INIT_UNIFORM,
        DummyDist::Normal => ffi::DkInitDist_DK_INIT_NORMAL,
        DummyDist::LogUniform => ffi::DkInitDist_DK_INIT_LOG_UNIFORM,
    };
    let params = ffi::DkInitDummyParams {
        out: op,
        rows: to_i64("region", region.rows)?,
        cols: to_i64("region", region.cols)?,
        base: to_i64("region", region.base)?,
        ld: to_i64("region", region.ld)?,
        seed: p.seed,
        tensor_id: p.tensor_id,
        dist: dist as i32, // 0..=3, from the C enum
        scale: p.scale,
        offset: p.offset,
    };
    // SAFETY: `out` is a live device buffer of rows * cols bf16 in the stream's context (checked
    // above), held by the borrow until the launch is enqueued; the launcher re-validates.
    check(OP, unsafe { ffi::dk_init_dummy(&raw const params, raw_stream(stream)) })
}
