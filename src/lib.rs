//! deltakit: kernels for Qwen3.5 / Qwen3-Next hybrid models (Gated DeltaNet layers, gated full
//! attention), built ahead of time from CUDA C++ (`csrc/`) and Triton (`triton_aot/`) into one
//! linked library, with checked FFI and safe wrappers.
//!
//! Layers (one-way dependencies): C ABI (`csrc/include/deltakit.h`) -> `ffi` (bindgen) ->
//! `ops` (safe wrappers that validate and return [`Error`]; both modules exist with feature
//! `cuda`) -> the engine crate.
//!
//! Without feature `cuda` only the error type is built, so the workspace builds anywhere. The CPU
//! twin of every kernel lives in the `deltakit-ref` crate.

pub mod error;
pub use error::{Error, Result};

#[cfg(feature = "cuda")]
pub mod ffi;
#[cfg(feature = "cuda")]
mod launch;
#[cfg(feature = "cuda")]
pub mod ops;
#[cfg(feature = "cuda")]
pub mod testing;

#[cfg(feature = "cuda")]
pub use cudarc;
#[cfg(feature = "cuda")]
pub use launch::try_context;
