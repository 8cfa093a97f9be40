//! The one error type of the reference kernels.

/// Error returned by every reference op. Nothing is written when an op returns an error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RefError {
    /// A slice length or dimension does not match the shape the other arguments imply.
    #[error("{op}: bad shape of `{what}`: expected {expected}, got {got}")]
    Shape {
        /// Op id, `<family>.<op>`.
        op: &'static str,
        /// The argument (or derived dimension) at fault.
        what: &'static str,
        /// What the other arguments imply.
        expected: String,
        /// What was passed.
        got: String,
    },
    /// A value is out of its domain (slot out of range, duplicate slot, non-monotone
    /// `cu_seqlens`, token id past the vocabulary, positive log-decay, ...).
    #[error("{op}: invalid `{what}`: {msg}")]
    Invalid {
        /// Op id, `<family>.<op>`.
        op: &'static str,
        /// The argument at fault.
        what: &'static str,
        /// What is wrong, with the offending index and value.
        msg: String,
    },
    /// A parameter is valid in general but not supported by this op (e.g. conv width 5).
    #[error("{op}: unsupported `{what}` = {got} (supported: {supported})")]
    Unsupported {
        /// Op id, `<family>.<op>`.
        op: &'static str,
        /// The parameter.
        what: &'static str,
        /// The value passed.
        got: String,
        /// The supported values.
        supported: &'static str,
    },
}

/// Result alias of the reference ops.
pub type Result<T> = std::result::Result<T, RefError>;
