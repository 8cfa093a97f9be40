//! CPU reference kernels for deltakit: the oracle every GPU kernel is tested against.
//!
//! Pure safe Rust on host slices. Semantics follow HF transformers' Qwen3.5 / Qwen3-Next modeling
//! code; layouts follow the project's design contract (token-major `[T, features]`, state pool `[slots, H_v, K, V]`).
//!
//! # Conventions shared by every op
//! - One module per op family, one function per op id `<family>.<op>` (e.g. `gdr.chunk_prefill` is
//!   [`gdr::chunk_prefill`]).
//! - Activations are generic over [`Elem`] (`f32` or [`half::bf16`]). Compute is f32 with f64
//!   accumulation of long sums; a value is rounded to the activation dtype exactly where HF rounds
//!   it in that dtype (each docstring says where). With `T = f32` every rounding is the identity.
//! - Outputs are caller-allocated slices. Every function validates all lengths, shapes, slot indices
//!   and `cu_seqlens` first and returns [`RefError`] naming the argument; on error nothing is
//!   written. No function panics on bad input.
//! - Slot index `-1` marks a padding sequence / row: its outputs are zero and no state is touched.
//!   Slots out of range, and the same slot used by two live sequences, are errors.
//!
//! # Ops (op id -> function)
//! | op id | function | HF / upstream semantics mirrored |
//! |---|---|---|
//! | `gdr.gating` | [`gdr::gating`] | `Qwen3_5GatedDeltaNet.forward` (`g`, `beta`) |
//! | `gdr.l2norm` | [`gdr::l2norm`] | `l2norm` (`use_qk_l2norm_in_kernel`) |
//! | `gdr.recurrent_prefill` | [`gdr::recurrent_prefill`] | `torch_recurrent_gated_delta_rule` |
//! | `gdr.chunk_prefill` | [`gdr::chunk_prefill`] | `torch_chunk_gated_delta_rule` / FLA `chunk_gated_delta_rule` |
//! | `gdr.decode` | [`gdr::decode`] | FLA `fused_recurrent_gated_delta_rule` (one token per row) |
//! | `conv1d.prefill` | [`conv1d::prefill`] | `causal_conv1d_fn(.., activation="silu")` with initial states |
//! | `conv1d.update` | [`conv1d::update`] | `torch_causal_conv1d_update` / `causal_conv1d_update` |
//! | `norm.rms` | [`norm::rms_norm`] | `Qwen3_5RMSNorm` (`1 + w`) |
//! | `norm.fused_add_rms` | [`norm::fused_add_rms_norm`] | residual add + `Qwen3_5RMSNorm` |
//! | `norm.rms_gated` | [`norm::rms_norm_gated`] | `Qwen3_5RMSNormGated` (plain `w`, `silu(z)`) |
//! | `attn.split_q_gate` | [`attn::split_q_gate`] | `Qwen3_5Attention`: `q_proj(..).view(.., 2 hd).chunk(2)` |
//! | `attn.qk_norm` | [`attn::qk_norm`] | `Qwen3_5Attention.q_norm` / `k_norm` |
//! | `attn.rope` | [`attn::rope_neox`] | `Qwen3_5TextRotaryEmbedding` + partial `apply_rotary_pos_emb` |
//! | `attn.write_kv` | [`attn::write_kv`] | KV cache update (vLLM `reshape_and_cache` layout) |
//! | `attn.prefill` | [`attn::prefill_paged`] | causal GQA sdpa/flash with prior context |
//! | `attn.prefill_contiguous` | [`attn::prefill_contiguous`] | `flash_attn_varlen_func(causal=True)` |
//! | `attn.decode` | [`attn::decode_paged`] | paged decode attention |
//! | `attn.output_gate` | [`attn::output_gate`] | `attn_output * torch.sigmoid(gate)` |
//! | `mlp.silu_and_mul` | [`mlp::silu_and_mul`] | `Qwen3_5MLP`: `act_fn(gate) * up` |
//! | `mlp.matmul` | [`mlp::matmul`] | `nn.Linear` (no bias), `x W^T` |
//! | `mlp.embedding` | [`mlp::embedding`] | `nn.Embedding` |
//! | `sample.argmax` | [`sample::argmax`] | greedy `argmax` (ties -> lowest id) |
//! | `sample.topk_logprobs` | [`sample::topk_logprobs`] | `log_softmax` + top-k (ties -> lower id) |
//! | `sample.top_p` | [`sample::top_p_sample`] | seeded temperature / top-p sampling (integer-exact nucleus) |
//! | `init.dummy` | [`init::dummy`] | seeded dummy weights (counter-based splitmix64; no HF counterpart) |
#![forbid(unsafe_code)]

pub mod attn;
mod check;
pub mod conv1d;
pub mod dtype;
pub mod error;
pub mod gdr;
pub mod init;
pub mod mlp;
pub mod norm;
pub mod sample;
pub mod smoke;
mod varlen;

pub use dtype::Elem;
pub use error::{RefError, Result};
pub use varlen::Varlen;
