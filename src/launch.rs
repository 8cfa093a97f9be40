//! Helpers shared by the safe wrappers: context checks, raw pointers, status mapping.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream, DeviceSlice};

use crate::error::{Error, Result};
use crate::ffi;

/// The stream as the C ABI's `dk_stream_t` (the same `CUstream`).
pub(crate) fn raw_stream(stream: &CudaStream) -> ffi::dk_stream_t {
    stream.cu_stream().cast()
}

/// Fails with [`Error::DeviceMismatch`] unless `buf` lives in the stream's context.
pub(crate) fn same_context<T>(
    op: &'static str,
    arg: &'static str,
    stream: &CudaStream,
    buf: &impl DeviceSlice<T>,
) -> Result<()> {
    if Arc::ptr_eq(buf.stream().context(), stream.context())
        || buf.stream().context().cu_ctx() == stream.context().cu_ctx()
    {
        Ok(())
    } else {
        Err(Error::DeviceMismatch { op, arg })
    }
}

/// Makes the stream's context current on this thread (the launchers enqueue into it).
pub(crate) fn bind(stream: &CudaStream) -> Result<()> {
    stream.context().bind_to_thread()?;
    Ok(())
}

/// Maps a launcher status to `Ok` or [`Error::Launch`].
pub(crate) fn check(op: &'static str, status: ffi::dk_status) -> Result<()> {
    let name = match status {
        ffi::dk_status::DK_OK => return Ok(()),
        ffi::dk_status::DK_ERR_INVALID_ARGUMENT => "DK_ERR_INVALID_ARGUMENT",
        ffi::dk_status::DK_ERR_UNSUPPORTED => "DK_ERR_UNSUPPORTED",
        ffi::dk_status::DK_ERR_CUDA => "DK_ERR_CUDA",
        ffi::dk_status::DK_ERR_NO_KERNEL_IMAGE => "DK_ERR_NO_KERNEL_IMAGE",
        _ => "unknown status",
    };
    // SAFETY: reads a thread-local int; no preconditions.
    let cuda_error = unsafe { ffi::dk_last_cuda_error() };
    Err(Error::Launch { op, status: name, cuda_error })
}

/// Returns a context for GPU `ordinal`, or `None` when this machine has no CUDA driver or no such
/// device (the driver library is loaded dynamically; its absence is not an error here).
///
/// Used by tests and benches to skip on GPU-less hosts; see [`crate::testing`].
#[must_use]
pub fn try_context(ordinal: usize) -> Option<Arc<CudaContext>> {
    // SAFETY: only probes whether libcuda can be dlopen'ed.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return None;
    }
    CudaContext::new(ordinal).ok()
}
