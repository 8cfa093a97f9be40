//! Model definitions over the backend trait.

pub mod qwen35;

pub use qwen35::{LogitsRows, ModelCaches, Qwen35};
