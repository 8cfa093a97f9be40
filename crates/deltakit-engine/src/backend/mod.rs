//! The backend trait: the model's ops on backend-owned tensors.
//!
//! The Qwen3.5 model ([`crate::model::Qwen35`]) is written once over [`Backend`]. A backend owns
//! its tensors (weights and activations), the per-layer state pools (GDN recurrent + conv state)
//! and the paged KV caches; the engine owns the bookkeeping (which sequence has which slot and
//! pages, see [`crate::state`]) and passes it down as a [`StepBatch`] of plain host arrays —
//! exactly what a GPU backend copies into its static device buffers.
//!
//! Granularity: one method per model op (embedding, linear, RMSNorm, fused add + RMSNorm,
//! SwiGLU, the whole GDN token mixer after its projections, the whole attention core after its
//! projections, row gather for the LM head). The CPU backend ([`cpu::CpuBackend`]) runs
//! `deltakit-ref`; the CUDA backend (`cuda::CudaBackend`, feature `cuda`) implements the same
//! trait with deltakit kernels + cuBLASLt.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;

use crate::error::Result;
use crate::weights::HostTensor;

/// Dims of a GDN layer (HF `Qwen3_5GatedDeltaNet`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GdnDims {
    /// Key/query heads `H_k`.
    pub h_k: usize,
    /// Value heads `H_v` (a multiple of `H_k`).
    pub h_v: usize,
    /// Key head dim `K`.
    pub k: usize,
    /// Value head dim `V`.
    pub v: usize,
    /// Conv kernel width `W`.
    pub conv_kernel: usize,
    /// Gated-RMSNorm epsilon.
    pub eps: f32,
}

impl GdnDims {
    /// Conv channels `2 H_k K + H_v V` (order `q | k | v`).
    #[must_use]
    pub fn conv_dim(&self) -> usize {
        2 * self.h_k * self.k + self.h_v * self.v
    }
}

/// Dims of a gated full-attention layer (HF `Qwen3_5Attention`) and its paged KV cache.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttnDims {
    /// Query heads `H_q`.
    pub n_q_heads: usize,
    /// KV heads `H_kv`.
    pub n_kv_heads: usize,
    /// Head dim `hd`.
    pub head_dim: usize,
    /// Rotated leading dims of each head (partial NeoX RoPE).
    pub rotary_dim: usize,
    /// `rope_theta`.
    pub rope_theta: f32,
    /// q/k RMSNorm epsilon.
    pub eps: f32,
    /// Tokens per KV-cache page.
    pub page_size: usize,
}

impl AttnDims {
    /// Elements of one of a paged KV cache's two planes (K or V): `num_pages x page_size x H_kv x
    /// hd`, or `None` when the product overflows `usize` or is zero (an empty cache). Both
    /// backends size their caches with it.
    #[must_use]
    pub fn kv_cache_elems(&self, num_pages: usize) -> Option<usize> {
        [self.page_size, self.n_kv_heads, self.head_dim]
            .iter()
            .try_fold(num_pages, |acc, &x| acc.checked_mul(x))
            .filter(|&n| n > 0)
    }
}

/// Whether a step runs prefill kernels (varlen, any tokens per sequence) or decode kernels
/// (exactly one token per row, continuing a sequence).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepKind {
    /// Varlen prefill (chunked GDR, conv over the sequence, causal attention with prior context).
    Prefill,
    /// One token per row (recurrent GDR step, conv update, paged decode attention).
    Decode,
}

/// One forward step's batch description, on the host: a varlen batch of `N` sequences over `T`
/// new tokens (decode: `T = N`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepBatch {
    /// Prefill or decode kernels.
    pub kind: StepKind,
    /// `i32 [N+1]` cumulative new-token counts.
    pub cu_seqlens: Vec<i32>,
    /// `i32 [N]` GDN state slot of each sequence.
    pub slots: Vec<i32>,
    /// `i32 [N]` tokens of each sequence already in its caches / state before this step.
    pub ctx_lens: Vec<i32>,
    /// `i64 [T]` absolute position of every new token.
    pub positions: Vec<i64>,
    /// `i32 [N, max_pages]` KV pages of each sequence (unused entries -1).
    pub page_table: Vec<i32>,
    /// Row length of `page_table`.
    pub max_pages: usize,
}

impl StepBatch {
    /// Number of sequences `N`.
    #[must_use]
    pub fn num_seqs(&self) -> usize {
        self.slots.len()
    }
    /// Number of new tokens `T`.
    #[must_use]
    pub fn num_tokens(&self) -> usize {
        self.positions.len()
    }
}

/// Weights of a GDN token mixer that the backend's [`Backend::gdn_mix`] consumes (the input
/// projections and `out_proj` are applied by the model through [`Backend::linear`]).
#[derive(Debug)]
pub struct GdnMixWeights<T> {
    /// `conv1d.weight` `[conv_dim, W]`.
    pub conv_w: T,
    /// `A_log` `[H_v]`.
    pub a_log: T,
    /// `dt_bias` `[H_v]`.
    pub dt_bias: T,
    /// Gated RMSNorm weight `[V]` (plain `w`).
    pub norm_w: T,
}

/// Weights of an attention core that [`Backend::attention`] consumes.
#[derive(Debug)]
pub struct AttnCoreWeights<T> {
    /// `q_norm.weight` `[hd]` (zero-centred, `1 + w`).
    pub q_norm: T,
    /// `k_norm.weight` `[hd]`.
    pub k_norm: T,
}

/// A compute backend: tensors, state pools and the model's ops.
///
/// Tensors are 2-D (`[rows, cols]`, row-major) from the model's point of view; a 1-D weight is
/// `[1, n]`. Every op allocates its output (a GPU backend uses a caching allocator) and returns
/// [`crate::EngineError::Backend`] on a shape mismatch instead of panicking.
pub trait Backend {
    /// A tensor owned by the backend (weights and activations).
    type Tensor;
    /// One GDN layer's state pools: recurrent `[slots, H_v, K, V]` (f32) and conv
    /// `[slots, conv_dim, W-1]`.
    type GdnState;
    /// One attention layer's paged KV cache: K and V, each `[pages, page_size, H_kv, hd]`.
    type KvCache;

    /// Short backend name (`"cpu"`, `"cuda:0"`).
    fn name(&self) -> String;

    /// Copy a host tensor to the backend as `[rows, cols]` (`rows` = product of all dims but
    /// the last; a 1-D tensor is one row). The backend may convert (e.g. to bf16 on a GPU).
    ///
    /// # Errors
    /// On allocation failure.
    fn upload(&self, t: &HostTensor) -> Result<Self::Tensor>;

    /// Copy a tensor back to the host as f32, row-major.
    ///
    /// # Errors
    /// On a device error.
    fn to_host(&self, t: &Self::Tensor) -> Result<Vec<f32>>;

    /// `[rows, cols]` of a tensor.
    fn shape(&self, t: &Self::Tensor) -> (usize, usize);

    /// Allocate one GDN layer's state pools for `num_slots` sequences, zeroed.
    ///
    /// # Errors
    /// On allocation failure.
    fn new_gdn_state(&self, dims: GdnDims, num_slots: usize) -> Result<Self::GdnState>;

    /// Zero slot `slot` of a GDN state (a new sequence starts from zero state).
    ///
    /// # Errors
    /// If `slot` is out of range.
    fn reset_gdn_slot(&self, state: &mut Self::GdnState, slot: usize) -> Result<()>;

    /// Allocate one attention layer's KV cache of `num_pages` pages.
    ///
    /// # Errors
    /// On allocation failure.
    fn new_kv_cache(&self, dims: AttnDims, num_pages: usize) -> Result<Self::KvCache>;

    /// Embedding gather (HF `embed_tokens`): `out[t] = table[ids[t]]`, `[T, D]`.
    ///
    /// # Errors
    /// For an id outside the table.
    fn embedding(&self, ids: &[u32], table: &Self::Tensor) -> Result<Self::Tensor>;

    /// `x W^T` (HF `nn.Linear` without bias): `x` `[M, K]`, `w` `[N, K]` -> `[M, N]`.
    ///
    /// # Errors
    /// On a shape mismatch.
    fn linear(&self, x: &Self::Tensor, w: &Self::Tensor) -> Result<Self::Tensor>;

    /// Zero-centred RMSNorm (HF `Qwen3_5RMSNorm`): `x * rsqrt(mean(x^2) + eps) * (1 + w)`.
    ///
    /// # Errors
    /// On a shape mismatch.
    fn rms_norm(&self, x: &Self::Tensor, w: &Self::Tensor, eps: f32) -> Result<Self::Tensor>;

    /// Residual add then RMSNorm: `residual += x`; returns `rms_norm(residual)` (the decoder
    /// layer's `residual + hidden_states` followed by the next norm).
    ///
    /// # Errors
    /// On a shape mismatch.
    fn add_rms_norm(
        &self,
        x: &Self::Tensor,
        residual: &mut Self::Tensor,
        w: &Self::Tensor,
        eps: f32,
    ) -> Result<Self::Tensor>;

    /// SwiGLU on a merged `[gate | up]` projection: `[T, 2I]` -> `silu(gate) * up` `[T, I]`
    /// (HF `Qwen3_5MLP`).
    ///
    /// # Errors
    /// On a shape mismatch.
    fn silu_and_mul(&self, x: &Self::Tensor) -> Result<Self::Tensor>;

    /// The GDN token mixer between the input projections and `out_proj`
    /// (HF `Qwen3_5GatedDeltaNet.forward`): `proj` is the merged projection `[T, conv_dim +
    /// H_v V + 2 H_v]` = `[in_proj_qkv | in_proj_z | in_proj_b | in_proj_a]` (one GEMM over
    /// load-time concatenated weights); causal conv1d + SiLU over its `qkv` columns (carrying
    /// each sequence's conv state), split into `q | k | v`, gating `g = -exp(A_log) softplus(a +
    /// dt_bias)`, `beta = sigmoid(b)`, the gated delta rule with L2-normalised q/k (carrying the
    /// recurrent state in the sequence's slot), then the gated RMSNorm per value head with the
    /// `z` columns. Returns `[T, H_v V]`.
    ///
    /// # Errors
    /// On a shape mismatch or bad slot.
    #[allow(clippy::too_many_arguments)]
    fn gdn_mix(
        &self,
        proj: &Self::Tensor,
        w: &GdnMixWeights<Self::Tensor>,
        dims: GdnDims,
        batch: &StepBatch,
        state: &mut Self::GdnState,
    ) -> Result<Self::Tensor>;

    /// The gated attention core between the projections and `o_proj` (HF
    /// `Qwen3_5Attention.forward`): `qkv` is the merged projection `[T, H_q 2hd + 2 H_kv hd]` =
    /// `[q_proj | k_proj | v_proj]` (per-head `[q | gate]` in the `q_proj` columns); q/k
    /// RMSNorm, partial NeoX RoPE at `batch.positions`, write k/v into the paged cache, causal
    /// GQA attention over each sequence's context, `* sigmoid(gate)`. Returns `[T, H_q hd]`.
    ///
    /// # Errors
    /// On a shape mismatch or bad page table.
    fn attention(
        &self,
        qkv: &Self::Tensor,
        w: &AttnCoreWeights<Self::Tensor>,
        dims: AttnDims,
        batch: &StepBatch,
        cache: &mut Self::KvCache,
    ) -> Result<Self::Tensor>;

    /// Gather rows: `out[i] = x[rows[i]]`.
    ///
    /// # Errors
    /// For a row out of range.
    fn gather_rows(&self, x: &Self::Tensor, rows: &[usize]) -> Result<Self::Tensor>;

    /// Concatenate weights along rows (`[a_rows + b_rows, cols]`), used at load time to merge
    /// projections that share an input (MLP `gate | up`).
    ///
    /// # Errors
    /// If the column counts differ.
    fn concat_rows(&self, a: &Self::Tensor, b: &Self::Tensor) -> Result<Self::Tensor>;

    /// A seeded dummy weight (`--load-format dummy`): the `runs` (a shard's element runs of the
    /// full tensor) of the tensor `p` describes, as a `local_shape` tensor. The default generates
    /// it on the host ([`crate::dummy_init::fill_host`]) and uploads it; the CUDA backend
    /// generates it on the device, bit for bit equal.
    ///
    /// # Errors
    /// Parameter and allocation errors.
    fn dummy(
        &self,
        local_shape: &[usize],
        p: &deltakit_ref::init::DummyInit,
        runs: &[std::ops::Range<usize>],
    ) -> Result<Self::Tensor> {
        let data = crate::dummy_init::fill_host(p, runs)?;
        self.upload(&HostTensor { shape: local_shape.to_vec(), data })
    }

    /// Ranks of the backend's tensor-parallel group (1 without a communicator).
    fn tp_size(&self) -> usize {
        1
    }

    /// Bytes per element of weights and activations (`f32`: 4, `bf16`: 2).
    fn elem_bytes(&self) -> usize;

    /// The communicator's abort handle (`None` without a communicator).
    fn abort_handle(&self) -> Option<std::sync::Arc<dyn crate::comm::AbortHandle>> {
        None
    }

    /// Sum `t` over the tensor-parallel group, in place (the all-reduce after a row-parallel
    /// layer: `out_proj`, `o_proj`, `down_proj`). Identity without a communicator.
    ///
    /// # Errors
    /// [`crate::EngineError::Comm`] if the collective fails or the group was aborted.
    fn all_reduce_sum(&self, t: &mut Self::Tensor) -> Result<()>;

    /// All-gather a vocab-parallel logits tensor to the host: every rank holds `[rows, cols]`
    /// (its vocabulary slice); returns f32 `[rows, tp * cols]` row-major with rank `r`'s columns
    /// at `r * cols..`. Without a communicator this is [`Backend::to_host`].
    ///
    /// # Errors
    /// [`crate::EngineError::Comm`] if the collective fails; device errors.
    fn gather_cols_to_host(&self, t: &Self::Tensor) -> Result<Vec<f32>>;
}

/// Rearrange an all-gathered `[world, rows, cols]` buffer into `[rows, world * cols]`.
#[must_use]
pub fn interleave_gathered(g: &[f32], world: usize, rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0f32; g.len()];
    for r in 0..world {
        for i in 0..rows {
            let src = &g[(r * rows + i) * cols..(r * rows + i + 1) * cols];
            out[i * world * cols + r * cols..i * world * cols + (r + 1) * cols]
                .copy_from_slice(src);
        }
    }
    out
}
