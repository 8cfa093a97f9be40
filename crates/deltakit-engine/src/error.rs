//! The engine's error type.

use std::path::PathBuf;

/// Error of every engine operation: config, weights, tokenizer, state pools, model, generation.
///
/// Messages name the offending file, config field, tensor or sequence so a user can act on them.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// A file could not be read (or mapped).
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// `config.json` is malformed, has an unknown field, or describes an unsupported model.
    #[error("config: {0}")]
    Config(String),
    /// A checkpoint tensor is missing, mis-shaped, or of an unsupported dtype.
    #[error("weights: {0}")]
    Weights(String),
    /// The tokenizer could not be loaded or failed to encode / decode.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A request is invalid: bad token id, empty prompt, prompt past the context limit, ...
    #[error("request: {0}")]
    Request(String),
    /// The state pools (recurrent/conv slots or KV pages) are exhausted.
    #[error("capacity: {0}")]
    Capacity(String),
    /// A backend op failed (shape mismatch inside the model: a bug, or an unsupported config).
    #[error("backend {backend}: {msg}")]
    Backend {
        /// Backend name (`cpu`, `cuda`).
        backend: &'static str,
        /// What failed.
        msg: String,
    },
    /// The backend has no kernel for this model's shapes (e.g. GDR head dims the CUDA kernels
    /// are not built for). Raised before any output is produced (at load / state allocation).
    #[error("unsupported on {backend}: {what}")]
    Unsupported {
        /// Backend name (`cuda`).
        backend: &'static str,
        /// The unsupported configuration and what is supported.
        what: String,
    },
    /// The requested device or backend is not available in this build / on this machine.
    #[error("device: {0}")]
    Device(String),
    /// A collective between tensor-parallel ranks failed or was aborted
    /// ([`crate::comm::Communicator`]).
    #[error("communicator: {0}")]
    Comm(String),
    /// A tensor-parallel rank failed, panicked or timed out during a step; the executor is
    /// poisoned and refuses further steps ([`crate::executor::Executor`]).
    #[error("{}: {msg}", rank_label(*rank))]
    Rank {
        /// The first rank that failed (or `usize::MAX` when the watchdog fired).
        rank: usize,
        /// What happened.
        msg: String,
    },
}

/// `rank N`, or `executor` for errors not tied to one rank (the watchdog: `usize::MAX`).
fn rank_label(rank: usize) -> String {
    if rank == usize::MAX {
        "executor".into()
    } else {
        format!("rank {rank}")
    }
}

/// Result alias of the engine.
pub type Result<T> = std::result::Result<T, EngineError>;

impl From<deltakit_ref::RefError> for EngineError {
    fn from(e: deltakit_ref::RefError) -> Self {
        EngineError::Backend { backend: "cpu", msg: e.to_string() }
    }
}
