//! deltakit engine: Qwen3.5 dense hybrid models (Gated DeltaNet + gated full attention) on one
//! device, over a backend trait (the CPU reference, and with feature `cuda` the CUDA backend).
//!
//! Modules, in dependency order:
//! - [`config`]: HF `config.json` parsing (`Qwen3_5ForCausalLM`, `Qwen3_5ForConditionalGeneration`);
//! - [`weights`]: safetensors via mmap (single / sharded), dtype conversion, dummy weights;
//! - [`tokenizer`]: HF `tokenizer.json`;
//! - [`backend`]: the [`backend::Backend`] trait, the CPU implementation and (feature `cuda`) the
//!   CUDA one;
//! - [`state`]: state-slot and KV-page pools;
//! - [`model`]: the Qwen3.5 decoder written once over the backend;
//! - [`generate`]: the engine (forward steps over sequences) and the generation scheduler;
//! - [`eval`]: multiple-choice evaluation (prompts, answer extraction, accuracy with a CI);
//! - [`paths`]: finding the bundled tiny model at run time.

pub mod backend;
pub mod config;
pub mod error;
pub mod eval;
pub mod generate;
pub mod model;
pub mod paths;
pub mod state;
pub mod tokenizer;
pub mod weights;

pub use error::{EngineError, Result};
