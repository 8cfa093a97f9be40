//! deltakit engine: Qwen3.5 dense hybrid models (Gated DeltaNet + gated full attention) on one
//! device or tensor-parallel over `tp` ranks, over a backend trait (the CPU reference, and with
//! feature `cuda` the CUDA backend).
//!
//! Data flows one way: config -> shard plan -> rank -> layer -> op. Modules, in dependency order:
//! - [`config`]: HF `config.json` parsing (`Qwen3_5ForCausalLM`, `Qwen3_5ForConditionalGeneration`);
//! - [`weights`]: safetensors via mmap (single / sharded), dtype conversion, dummy weights;
//! - [`tokenizer`]: HF `tokenizer.json`;
//! - [`backend`]: the [`backend::Backend`] trait, the CPU implementation and (feature `cuda`) the
//!   CUDA one;
//! - [`shard`]: the tensor-parallel sharding plan (which rows / columns each rank keeps);
//! - [`comm`]: collectives between ranks (in-process CPU, NCCL) with abort;
//! - [`state`]: state-slot and KV-page pools;
//! - [`model`]: the Qwen3.5 decoder written once over the backend;
//! - [`rank`]: one rank's backend + model shard + pools behind the [`rank::StepRunner`] trait;
//! - [`executor`]: one thread per rank, fail-closed steps with a watchdog;
//! - [`dist`]: one process per rank (launch flags and torchrun-style environment, TCP
//!   rendezvous and handshake, the control plane from rank 0's scheduler, the CPU TCP
//!   communicator);
//! - [`sampling`]: host-side greedy / top-p sampling and top-K log-probabilities;
//! - [`generate`]: the engine (sequences, slots, forward steps) and the generation scheduler;
//! - `graph` (feature `cuda`): CUDA-graph decode buckets with device sampling;
//! - [`launch`]: building single-device and tensor-parallel engines (CPU, CUDA);
//! - [`eval`]: multiple-choice evaluation (prompts, answer extraction, accuracy with a CI);
//! - [`paths`]: finding the bundled tiny model at run time.

pub mod backend;
pub mod capacity;
pub mod comm;
pub mod config;
pub mod dist;
pub mod dummy_init;
pub mod error;
pub mod eval;
pub mod executor;
pub mod generate;
#[cfg(feature = "cuda")]
pub mod graph;
pub mod launch;
pub mod model;
pub mod paths;
pub mod rank;
pub mod sampling;
pub mod shard;
pub mod state;
pub mod tokenizer;
pub mod weights;

pub use error::{EngineError, Result};
