//! The one error type of the deltakit kernel library.

/// Why a deltakit call failed. Every variant names the op (its `<family>.<op>` id).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An argument has the wrong length, shape, stride, alignment or value.
    #[error("{op}: argument `{arg}`: expected {expected}, got {got}")]
    Shape {
        /// Op id, e.g. `smoke.axpy`.
        op: &'static str,
        /// The argument at fault.
        arg: &'static str,
        /// What the op needs.
        expected: String,
        /// What it was given.
        got: String,
    },
    /// A valid configuration this build has no kernel for (head dim, arch, dtype).
    #[error("{op}: unsupported: {what}")]
    Unsupported {
        /// Op id.
        op: &'static str,
        /// The unsupported configuration.
        what: String,
    },
    /// Buffers and stream belong to different CUDA contexts (devices).
    #[error("{op}: argument `{arg}` lives on another CUDA context than the stream")]
    DeviceMismatch {
        /// Op id.
        op: &'static str,
        /// The argument at fault.
        arg: &'static str,
    },
    /// A launcher returned a failure status.
    #[error("{op}: launch failed with {status} (CUDA error code {cuda_error})")]
    Launch {
        /// Op id.
        op: &'static str,
        /// The launcher's status name (`DK_ERR_*`).
        status: &'static str,
        /// The CUDA runtime/driver error code behind it (0 if none).
        cuda_error: i32,
    },
    /// An error from the CUDA driver through cudarc.
    #[cfg(feature = "cuda")]
    #[error("CUDA driver: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Shorthand for [`Error::Shape`].
    pub fn shape(
        op: &'static str,
        arg: &'static str,
        expected: impl std::fmt::Display,
        got: impl std::fmt::Display,
    ) -> Self {
        Self::Shape { op, arg, expected: expected.to_string(), got: got.to_string() }
    }
}
