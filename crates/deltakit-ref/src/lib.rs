//! CPU reference kernels for deltakit: the oracle every GPU kernel is tested against.
//!
//! Pure safe Rust on host slices. Semantics follow HF transformers' Qwen3.5 / Qwen3-Next modeling
//! code; layouts follow `DESIGN.md` (token-major `[T, features]`, state pool `[slots, H_v, K, V]`).
#![forbid(unsafe_code)]

pub mod smoke;
