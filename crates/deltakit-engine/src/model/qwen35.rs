//! The Qwen3.5 dense decoder, written once over [`Backend`].
//!
//! Mirrors HF `Qwen3_5TextModel` + `Qwen3_5ForCausalLM.lm_head`:
//! `h = embed_tokens(ids)`; per layer `h = h + mixer(input_layernorm(h))`,
//! `h = h + mlp(post_attention_layernorm(h))` where the mixer is `Qwen3_5GatedDeltaNet`
//! (`linear_attention`) or `Qwen3_5Attention` (`full_attention`) and the MLP is SwiGLU
//! (`down(silu(gate(x)) * up(x))`); then `norm(h)` and the LM head (`lm_head.weight`, or the
//! embedding table when `tie_word_embeddings`). Residual adds are fused with the following norm
//! ([`Backend::add_rms_norm`]). Projections that share an input are merged by rows at load time
//! and run as one GEMM: GDN `[in_proj_qkv | in_proj_z | in_proj_b | in_proj_a]`, attention
//! `[q_proj | k_proj | v_proj]`, MLP `[gate_proj | up_proj]` (at decode the two small `b` / `a`
//! GEMMs and the separate `k` / `v` GEMMs were launch-bound, and a 4096-wide `z` GEMM reads its
//! weights slower than the merged one).
//!
//! Under tensor parallelism ([`Qwen35::load_shard`]) each rank holds its shard
//! ([`crate::shard::ShardPlan`]) and runs the same forward at its local head counts: the outputs
//! of the row-parallel layers (`out_proj`, `o_proj`, `down_proj`) are summed over the ranks
//! ([`Backend::all_reduce_sum`]) before the residual add, and the LM head produces this rank's
//! vocabulary slice of the logits (gathered by [`Backend::gather_cols_to_host`]).

use std::collections::HashMap;

use indicatif::{ProgressBar, ProgressStyle};

use crate::backend::{AttnCoreWeights, AttnDims, Backend, GdnDims, GdnMixWeights, StepBatch};
use crate::config::{LayerType, ModelConfig};
use crate::error::{EngineError, Result};
use crate::shard::{Part, ShardPlan};
use crate::weights::{expected_tensors, WeightSource};

/// Token mixer weights of one layer.
#[derive(Debug)]
enum Mixer<T> {
    /// Gated DeltaNet; `in_proj` = `[in_proj_qkv | in_proj_z | in_proj_b | in_proj_a]` merged by
    /// rows (one GEMM); `state` indexes the model's GDN state list.
    Gdn { in_proj: T, mix: GdnMixWeights<T>, out_proj: T, state: usize },
    /// Gated attention; `qkv_proj` = `[q_proj | k_proj | v_proj]` merged by rows (one GEMM);
    /// `cache` indexes the model's KV-cache list.
    Attn { qkv_proj: T, o_proj: T, core: AttnCoreWeights<T>, cache: usize },
}

/// One decoder layer's weights.
#[derive(Debug)]
struct Layer<T> {
    input_norm: T,
    post_norm: T,
    mixer: Mixer<T>,
    /// MLP `gate_proj | up_proj` merged by rows: `[2I, D]`.
    gate_up: T,
    down: T,
}

/// Per-layer state of the model on a backend: one GDN state per linear-attention layer and one
/// KV cache per full-attention layer, each sized for the engine's pools.
pub struct ModelCaches<B: Backend> {
    /// GDN states, in layer order.
    pub gdn: Vec<B::GdnState>,
    /// KV caches, in layer order.
    pub kv: Vec<B::KvCache>,
}

/// A loaded Qwen3.5 text model (or one rank's shard of it) on backend `B`.
pub struct Qwen35<B: Backend> {
    cfg: ModelConfig,
    /// This rank's dims ([`ShardPlan::local_config`]; equal to `cfg` at TP = 1).
    local: ModelConfig,
    plan: ShardPlan,
    embed: B::Tensor,
    layers: Vec<Layer<B::Tensor>>,
    final_norm: B::Tensor,
    /// `None`: tied to `embed` (TP = 1 only; a sharded tied head is its own vocabulary slice).
    lm_head: Option<B::Tensor>,
    /// Bytes of the weights this rank holds (element count x the backend's element size is the
    /// caller's business: this is the element count).
    params: usize,
    /// Largest host tensor the loader materialized (f32 bytes).
    peak_staging: u64,
}

/// What logits a forward step returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitsRows<'a> {
    /// Every new token's row (`[T, vocab]`).
    All,
    /// The listed token rows only (e.g. the last token of each sequence).
    Rows(&'a [usize]),
}

impl<B: Backend> Qwen35<B> {
    /// Load the model for `cfg` from `src` onto backend `be`. Shows a progress bar on stderr when
    /// `progress` is set (the CLI sets it for large checkpoints).
    ///
    /// # Errors
    /// [`EngineError::Weights`] naming a missing or mis-shaped tensor; backend errors on upload.
    pub fn load(
        be: &B,
        cfg: &ModelConfig,
        src: &mut dyn WeightSource,
        progress: bool,
    ) -> Result<Self> {
        Self::load_shard(be, cfg, &ShardPlan::new(cfg, 1, 0)?, src, progress)
    }

    /// Load rank `plan.rank`'s shard of the model (see [`ShardPlan`]): every tensor is read
    /// through [`WeightSource::get_part`], so a rank never materializes rows or columns it does
    /// not keep (replicated tensors are read whole).
    ///
    /// # Errors
    /// As [`Qwen35::load`].
    #[allow(clippy::too_many_lines)]
    pub fn load_shard(
        be: &B,
        cfg: &ModelConfig,
        plan: &ShardPlan,
        src: &mut dyn WeightSource,
        progress: bool,
    ) -> Result<Self> {
        let expected = expected_tensors(cfg);
        let total: u64 = expected.iter().map(|(_, s, _)| s.iter().product::<usize>() as u64).sum();
        let bar = if progress {
            let b = ProgressBar::new(total);
            b.set_style(
                ProgressStyle::with_template(
                    "loading {msg} [{bar:40}] {percent}% ({human_pos}/{human_len} params, {eta})",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
            );
            b.set_message(format!("{} tensors", expected.len()));
            b
        } else {
            ProgressBar::hidden()
        };
        let mut t: HashMap<String, B::Tensor> = HashMap::with_capacity(expected.len());
        let mut params = 0usize;
        let mut peak_staging = 0u64;
        let seed = src.dummy_seed();
        // One shard of one checkpoint tensor onto the backend: seeded dummy weights are generated
        // where they live (on the device for CUDA), checkpoint parts read from the source.
        let mut load_part = |name: &str, shape: &[usize], part: &Part, init| -> Result<B::Tensor> {
            if let Some(seed) = seed {
                let local = part.local_shape(name, shape)?;
                params += local.iter().product::<usize>();
                let p = crate::dummy_init::params(name, shape, init, seed)?;
                return be.dummy(&local, &p, &part.runs(shape));
            }
            let host = src.get_part(name, shape, part, init)?;
            params += host.data.len();
            peak_staging = peak_staging.max(host.data.len() as u64 * 4);
            be.upload(&host)
        };
        for (name, shape, init) in &expected {
            let tensor = load_part(name, shape, &plan.part(cfg, name)?, *init)?;
            t.insert(name.clone(), tensor);
            bar.inc(shape.iter().product::<usize>() as u64);
        }
        // A tied LM head under TP: this rank's vocabulary rows of the embedding, uploaded on
        // their own (the embedding itself stays replicated).
        let tied_shard = if cfg.tie_word_embeddings && plan.tp > 1 {
            let name = format!("{}embed_tokens.weight", cfg.arch.weight_prefix());
            let shape = [cfg.vocab_size, cfg.hidden_size];
            let init = crate::weights::Init::Embedding;
            Some(load_part(&name, &shape, &plan.lm_head_part(), init)?)
        } else {
            None
        };
        bar.finish_and_clear();
        let mut take = |name: String| -> Result<B::Tensor> {
            t.remove(&name).ok_or_else(|| EngineError::Weights(format!("tensor `{name}` missing")))
        };
        let p = cfg.arch.weight_prefix();
        let embed = take(format!("{p}embed_tokens.weight"))?;
        let (mut n_gdn, mut n_attn) = (0, 0);
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for (i, lt) in cfg.layer_types.iter().enumerate() {
            let l = format!("{p}layers.{i}.");
            let mixer = match lt {
                LayerType::LinearAttention => {
                    let a = format!("{l}linear_attn.");
                    n_gdn += 1;
                    let qkv = take(format!("{a}in_proj_qkv.weight"))?;
                    let z = take(format!("{a}in_proj_z.weight"))?;
                    let b = take(format!("{a}in_proj_b.weight"))?;
                    let ab = be.concat_rows(&b, &take(format!("{a}in_proj_a.weight"))?)?;
                    let zab = be.concat_rows(&z, &ab)?;
                    Mixer::Gdn {
                        in_proj: be.concat_rows(&qkv, &zab)?,
                        mix: GdnMixWeights {
                            conv_w: take(format!("{a}conv1d.weight"))?,
                            a_log: take(format!("{a}A_log"))?,
                            dt_bias: take(format!("{a}dt_bias"))?,
                            norm_w: take(format!("{a}norm.weight"))?,
                        },
                        out_proj: take(format!("{a}out_proj.weight"))?,
                        state: n_gdn - 1,
                    }
                }
                LayerType::FullAttention => {
                    let a = format!("{l}self_attn.");
                    n_attn += 1;
                    let q = take(format!("{a}q_proj.weight"))?;
                    let kv = be.concat_rows(
                        &take(format!("{a}k_proj.weight"))?,
                        &take(format!("{a}v_proj.weight"))?,
                    )?;
                    Mixer::Attn {
                        qkv_proj: be.concat_rows(&q, &kv)?,
                        o_proj: take(format!("{a}o_proj.weight"))?,
                        core: AttnCoreWeights {
                            q_norm: take(format!("{a}q_norm.weight"))?,
                            k_norm: take(format!("{a}k_norm.weight"))?,
                        },
                        cache: n_attn - 1,
                    }
                }
            };
            let gate = take(format!("{l}mlp.gate_proj.weight"))?;
            let up = take(format!("{l}mlp.up_proj.weight"))?;
            layers.push(Layer {
                input_norm: take(format!("{l}input_layernorm.weight"))?,
                post_norm: take(format!("{l}post_attention_layernorm.weight"))?,
                mixer,
                gate_up: be.concat_rows(&gate, &up)?,
                down: take(format!("{l}mlp.down_proj.weight"))?,
            });
        }
        let final_norm = take(format!("{p}norm.weight"))?;
        let lm_head =
            if cfg.tie_word_embeddings { tied_shard } else { Some(take("lm_head.weight".into())?) };
        Ok(Self {
            cfg: cfg.clone(),
            local: plan.local_config(cfg),
            plan: plan.clone(),
            embed,
            layers,
            final_norm,
            lm_head,
            params,
            peak_staging,
        })
    }

    /// Largest host tensor (f32 bytes) the loader materialized for this rank.
    #[must_use]
    pub fn peak_staging_bytes(&self) -> u64 {
        self.peak_staging
    }

    /// This rank's shard plan (rank 0 of 1 for an unsharded model).
    #[must_use]
    pub fn plan(&self) -> &ShardPlan {
        &self.plan
    }

    /// Elements of the weights this rank holds (its shard plus the replicated tensors).
    #[must_use]
    pub fn local_params(&self) -> usize {
        self.params
    }

    /// The model's configuration.
    #[must_use]
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// GDN dims of this model's linear-attention layers (this rank's head counts).
    #[must_use]
    pub fn gdn_dims(&self) -> GdnDims {
        let c = &self.local;
        GdnDims {
            h_k: c.linear_num_key_heads,
            h_v: c.linear_num_value_heads,
            k: c.linear_key_head_dim,
            v: c.linear_value_head_dim,
            conv_kernel: c.conv_kernel,
            eps: c.rms_norm_eps,
        }
    }

    /// Attention dims of this model's full-attention layers with `page_size`-token KV pages
    /// (this rank's head counts).
    #[must_use]
    pub fn attn_dims(&self, page_size: usize) -> AttnDims {
        let c = &self.local;
        AttnDims {
            n_q_heads: c.num_attention_heads,
            n_kv_heads: c.num_key_value_heads,
            head_dim: c.head_dim,
            rotary_dim: c.rope.rotary_dim,
            rope_theta: c.rope.theta as f32,
            eps: c.rms_norm_eps,
            page_size,
        }
    }

    /// Allocate the per-layer states for `num_slots` sequences and `num_pages` KV pages.
    ///
    /// # Errors
    /// Backend allocation errors.
    pub fn new_caches(
        &self,
        be: &B,
        num_slots: usize,
        num_pages: usize,
        page_size: usize,
    ) -> Result<ModelCaches<B>> {
        let gdn = (0..self.cfg.num_linear_layers())
            .map(|_| be.new_gdn_state(self.gdn_dims(), num_slots))
            .collect::<Result<Vec<_>>>()?;
        let kv = (0..self.cfg.num_attention_layers())
            .map(|_| be.new_kv_cache(self.attn_dims(page_size), num_pages))
            .collect::<Result<Vec<_>>>()?;
        Ok(ModelCaches { gdn, kv })
    }

    /// One forward step over the batch's new tokens `ids` (`[T]`, packed as `batch.cu_seqlens`
    /// says), updating every layer's state / cache, returning logits `[rows, vocab / tp]` (this
    /// rank's vocabulary slice; the whole row at TP = 1) for the requested rows.
    ///
    /// # Errors
    /// [`EngineError::Request`] for a token id outside the vocabulary or an id count that does
    /// not match the batch; backend errors.
    pub fn forward(
        &self,
        be: &B,
        ids: &[u32],
        batch: &StepBatch,
        caches: &mut ModelCaches<B>,
        rows: LogitsRows<'_>,
        page_size: usize,
    ) -> Result<B::Tensor> {
        self.forward_with(be, ids, batch, caches, rows, page_size, &mut |_| Ok(()))
    }

    /// [`Qwen35::forward`] with `before_layer(i)` called before layer `i` runs (fault injection
    /// in the tensor-parallel tests; an error from it ends the step).
    ///
    /// # Errors
    /// As [`Qwen35::forward`], and whatever `before_layer` returns.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_with(
        &self,
        be: &B,
        ids: &[u32],
        batch: &StepBatch,
        caches: &mut ModelCaches<B>,
        rows: LogitsRows<'_>,
        page_size: usize,
        before_layer: &mut dyn FnMut(usize) -> Result<()>,
    ) -> Result<B::Tensor> {
        if ids.len() != batch.num_tokens() {
            return Err(EngineError::Request(format!(
                "{} token ids for a batch of {} tokens",
                ids.len(),
                batch.num_tokens()
            )));
        }
        if let Some(&bad) = ids.iter().find(|&&i| i as usize >= self.cfg.vocab_size) {
            return Err(EngineError::Request(format!(
                "token id {bad} is outside the vocabulary (size {})",
                self.cfg.vocab_size
            )));
        }
        let eps = self.cfg.rms_norm_eps;
        let (gd, ad) = (self.gdn_dims(), self.attn_dims(page_size));
        let mut residual = be.embedding(ids, &self.embed)?;
        let Some(first) = self.layers.first() else {
            return Err(EngineError::Config("model has no layers".into()));
        };
        let mut x = be.rms_norm(&residual, &first.input_norm, eps)?;
        for (i, layer) in self.layers.iter().enumerate() {
            before_layer(i)?;
            let mixed = match &layer.mixer {
                Mixer::Gdn { in_proj, mix, out_proj, state } => {
                    let proj = be.linear(&x, in_proj)?;
                    let st = caches.gdn.get_mut(*state).ok_or_else(|| {
                        EngineError::Config(format!("no GDN state for layer {i}"))
                    })?;
                    let o = be.gdn_mix(&proj, mix, gd, batch, st)?;
                    let mut out = be.linear(&o, out_proj)?;
                    be.all_reduce_sum(&mut out)?;
                    out
                }
                Mixer::Attn { qkv_proj, o_proj, core, cache } => {
                    let qkv = be.linear(&x, qkv_proj)?;
                    let kv = caches
                        .kv
                        .get_mut(*cache)
                        .ok_or_else(|| EngineError::Config(format!("no KV cache for layer {i}")))?;
                    let o = be.attention(&qkv, core, ad, batch, kv)?;
                    let mut out = be.linear(&o, o_proj)?;
                    be.all_reduce_sum(&mut out)?;
                    out
                }
            };
            let h = be.add_rms_norm(&mixed, &mut residual, &layer.post_norm, eps)?;
            let act = be.silu_and_mul(&be.linear(&h, &layer.gate_up)?)?;
            let mut mlp = be.linear(&act, &layer.down)?;
            be.all_reduce_sum(&mut mlp)?;
            let next_norm = self.layers.get(i + 1).map_or(&self.final_norm, |l| &l.input_norm);
            x = be.add_rms_norm(&mlp, &mut residual, next_norm, eps)?;
        }
        let x = match rows {
            LogitsRows::All => x,
            LogitsRows::Rows(r) => be.gather_rows(&x, r)?,
        };
        be.linear(&x, self.lm_head.as_ref().unwrap_or(&self.embed))
    }
}
