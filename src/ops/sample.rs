//! `sample.argmax` (CUDA C++, `csrc/sample/argmax.cu`). CPU twin: `deltakit_ref::sample::argmax`.

use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut};
use half::bf16;

use crate::error::{Error, Result};
use crate::ffi;
use crate::launch::{bind, check, raw_stream, same_context};
use crate::ops::validate;

/// Greedy sampling: `ids[r] = argmax_j logits[r, j]`, ties to the lowest index (as the CPU
/// reference). A row containing a NaN gets id `-1` (the reference returns an error there; the
/// device cannot, so it refuses to produce a plausible token instead).
///
/// Shapes: `logits` bf16 `[rows, vocab]`; `ids` i32 `[rows]`.
///
/// # Errors
/// [`Error::Shape`] if `vocab` is 0 or over `i32::MAX`, or a length disagrees;
/// [`Error::DeviceMismatch`]; [`Error::Launch`] / [`Error::Driver`].
pub fn argmax(
    stream: &CudaStream,
    logits: &impl DevicePtr<bf16>,
    vocab: usize,
    ids: &mut impl DevicePtrMut<i32>,
) -> Result<()> {
    const OP: &str = "sample.argmax";
    if vocab == 0 || vocab > i32::MAX as usize || logits.len() % vocab != 0 {
        return Err(Error::shape(
            OP,
            "logits",
            format!("a multiple of vocab = {vocab} (1..=i32::MAX)"),
            logits.len(),
        ));
    }
    let rows = logits.len() / vocab;
    validate::len(OP, "ids", ids.len(), rows)?;
    if rows > i32::MAX as usize {
        return Err(Error::shape(OP, "ids", "at most i32::MAX rows", rows));
    }
    same_context(OP, "logits", stream, logits)?;
    same_context(OP, "ids", stream, ids)?;
    if rows == 0 {
        return Ok(());
    }
    bind(stream)?;
    let (lp, _g1) = logits.device_ptr(stream);
    let (ip, _g2) = ids.device_ptr_mut(stream);
    let params = ffi::DkArgmaxParams {
        logits: lp,
        ids: ip,
        rows: validate::i64_of(OP, "logits", rows)?,
        vocab: validate::i64_of(OP, "vocab", vocab)?,
    };
    // SAFETY: live device buffers of the checked lengths in the stream's context.
    check(OP, unsafe { ffi::dk_sample_argmax(&raw const params, raw_stream(stream)) })
}
