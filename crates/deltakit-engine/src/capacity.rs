//! Capacity planning: the largest decode batch every rank can hold, from its free device memory.
//!
//! Per rank and per candidate batch `b` (sequences running at once), the memory a serving
//! engine needs is ([`RankBudget::usage`]):
//!
//! ```text
//! weights + fixed workspaces
//!   + KV pages:     kv_page_bytes * (b * ceil(max_context / page_size) + reserved_kv_pages)
//!   + state slots:  state_slot_bytes * b                       (GDN recurrent f32 + conv state)
//!   + activations:  activation_row_bytes * rows(b)             (static decode-step buffers)
//!   + graph reserve: sum over the captured buckets c of (graph_bytes_per_bucket
//!                                                        + graph_row_bytes * c)
//! ```
//!
//! where, with CUDA graphs on, the buckets captured for a batch of `b` are every bucket below
//! `bucket(b)` plus `bucket(b)` itself ([`capture_buckets`]), `bucket(b)` being the smallest
//! bucket `>= b` ([`bucket_for`]), and `rows(b) = bucket(b)` (padding rows run too); with graphs
//! off (no buckets) `rows(b) = b` and the reserve is 0.
//!
//! **The reserve belongs to the candidate.** [`plan`] searches `b` downwards from the requested
//! maximum and, for each candidate, computes the reserve for *that candidate's* bucket — never
//! the requested maximum's bucket. A tight budget therefore still yields the largest batch that
//! fits (sizing the reserve for bucket 128 when only 20 sequences fit would refuse batches that
//! fit, or all of them). Every term is non-decreasing in `b`, so "the largest `b` that fits" is
//! well defined and found by bisection, equal to the linear downward scan (a property test
//! checks this against brute force).
//!
//! **Ranks.** All ranks run the same batch: the plan's batch is the minimum over ranks of each
//! rank's own maximum. [`rank_bytes`] derives a rank's byte counts from the model config, the
//! cache shape and `tp`, with the same sharding rules as [`crate::shard`]: GDN value heads,
//! attention q heads, the MLP intermediate size and the LM head's vocabulary are divided by `tp`;
//! GDN key heads and attention kv heads are divided by `tp` when it divides them, else (when
//! `tp` is a multiple of them) each rank keeps one, replicated; the embedding and every norm
//! weight are replicated.
//!
//! All byte counts are `u64` bytes; sums are carried in `u128` with saturation, so no input
//! overflows (an absurd size simply does not fit).

use crate::config::{LayerType, ModelConfig};
use crate::error::EngineError;
use crate::state::CacheConfig;

/// Default CUDA-graph batch buckets (capped by capacity with [`capture_buckets`]).
pub const DEFAULT_BUCKETS: [usize; 11] = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128];

/// Bytes of a bf16 element.
const BF16: u64 = 2;
/// Bytes of an f32 element.
const F32: u64 = 4;

/// Why a capacity plan could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CapacityError {
    /// Not even one sequence fits on `rank`: at batch 1 it needs `needed` bytes but has `free`.
    #[error(
        "rank {rank}: not even one sequence fits: batch 1 needs {needed} bytes ({breakdown}), \
         {free} bytes are free: short by {shortfall} bytes"
    )]
    NoFit {
        /// The rank that cannot hold one sequence (the first such rank).
        rank: usize,
        /// Bytes batch 1 needs on that rank.
        needed: u64,
        /// Free bytes of that rank.
        free: u64,
        /// `needed - free`.
        shortfall: u64,
        /// What batch 1 needs, term by term.
        breakdown: MemoryBreakdown,
    },
    /// An argument is out of range (`requested_max_batch` 0, `page_size` 0, no ranks, buckets
    /// not strictly ascending or containing 0, ...).
    #[error("capacity plan: argument `{arg}`: expected {expected}, got {got}")]
    Invalid {
        /// The argument at fault.
        arg: &'static str,
        /// What is accepted.
        expected: String,
        /// What was given.
        got: String,
    },
    /// `tp` does not divide a head count / size of the model (and the count is not a divisor of
    /// `tp` where replication is allowed).
    #[error("capacity plan: {what} = {value} cannot be split over tp = {tp}")]
    Indivisible {
        /// The config quantity.
        what: &'static str,
        /// Its value.
        value: usize,
        /// The tensor-parallel degree.
        tp: usize,
    },
}

impl From<CapacityError> for EngineError {
    fn from(e: CapacityError) -> Self {
        EngineError::Capacity(e.to_string())
    }
}

fn invalid(
    arg: &'static str,
    expected: impl Into<String>,
    got: &dyn std::fmt::Display,
) -> CapacityError {
    CapacityError::Invalid { arg, expected: expected.into(), got: got.to_string() }
}

/// What one rank has and what each of its sequences and batch rows costs. All sizes in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RankBudget {
    /// Device memory this rank may use for the engine, in bytes: free memory after the CUDA
    /// context, libraries (cuBLASLt, NCCL) and any safety margin, before weights are loaded.
    pub free_bytes: u64,
    /// Bytes of this rank's weight shard (bf16 tensors, replicated ones included).
    pub weight_bytes: u64,
    /// Bytes of one KV-cache page on this rank, summed over every full-attention layer (K and V:
    /// `2 * page_size * local_kv_heads * head_dim * 2` bytes per layer in bf16).
    pub kv_page_bytes: u64,
    /// Tokens per KV page (> 0).
    pub page_size: usize,
    /// Longest sequence (prompt + generated tokens) every running sequence may reach (> 0):
    /// each sequence is given `ceil(max_context / page_size)` pages.
    pub max_context: usize,
    /// KV pages outside every sequence (e.g. 1: the padding page the padded rows of a graph
    /// bucket point at).
    pub reserved_kv_pages: u64,
    /// Bytes of one GDN state slot on this rank, summed over every GDN layer: the f32 recurrent
    /// state `[H_v/tp, K, V]` plus the bf16 conv state `[conv_dim/tp, W-1]`.
    pub state_slot_bytes: u64,
    /// Bytes of the decode step's activations and workspaces per batch row (every static buffer
    /// whose size is proportional to the rows of a step, logits included).
    pub activation_row_bytes: u64,
    /// Bytes of workspaces independent of the batch (prefill-chunk activations and the
    /// `gdr.chunk_prefill` workspace, the split-K part of `attn.decode`'s workspace, ...).
    pub fixed_workspace_bytes: u64,
    /// Bytes each captured CUDA graph costs beyond its rows (graph objects, private pool slack).
    pub graph_bytes_per_bucket: u64,
    /// Bytes per row of each captured bucket (its static inputs: token id, position, slot, page
    /// table row, sequence length, sampled id).
    pub graph_row_bytes: u64,
}

/// Per-term memory of one rank at one batch, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct MemoryBreakdown {
    /// Weight shard.
    pub weights: u64,
    /// KV pages (`num_pages * kv_page_bytes`).
    pub kv_cache: u64,
    /// GDN state slots (`batch * state_slot_bytes`).
    pub state_slots: u64,
    /// Decode-step activations for `rows(batch)` rows.
    pub activations: u64,
    /// Batch-independent workspaces.
    pub fixed_workspaces: u64,
    /// CUDA-graph reserve of every captured bucket.
    pub graph_reserve: u64,
    /// Sum of the above (saturating).
    pub total: u64,
}

impl std::fmt::Display for MemoryBreakdown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "weights {} + KV {} + state slots {} + activations {} + fixed workspaces {} + graph \
             reserve {}",
            self.weights,
            self.kv_cache,
            self.state_slots,
            self.activations,
            self.fixed_workspaces,
            self.graph_reserve
        )
    }
}

/// One rank's part of a [`CapacityPlan`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankPlan {
    /// The largest batch this rank alone could hold (`<=` the requested maximum).
    pub own_max_batch: usize,
    /// Memory this rank uses at the plan's batch.
    pub breakdown: MemoryBreakdown,
    /// `free_bytes - breakdown.total` at the plan's batch.
    pub headroom_bytes: u64,
}

/// The result of [`plan`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapacityPlan {
    /// Effective maximum batch: the minimum over ranks of each rank's maximum (>= 1).
    pub max_batch: usize,
    /// Buckets to capture for `max_batch` (empty with graphs off): [`capture_buckets`].
    pub buckets: Vec<usize>,
    /// GDN state slots to allocate (`max_batch`).
    pub num_slots: usize,
    /// KV pages to allocate per rank: `max_batch * pages_per_seq + reserved_kv_pages` (of the
    /// first rank; every rank of one model has the same page shape).
    pub num_pages: u64,
    /// Per-rank breakdown at `max_batch`, in rank order.
    pub ranks: Vec<RankPlan>,
}

impl CapacityPlan {
    /// The engine's pool sizes for this plan: `max_batch` slots, `num_pages` pages of
    /// `page_size` tokens, sequences of up to `max_context` tokens.
    ///
    /// # Errors
    /// [`CapacityError::Invalid`] if `num_pages` does not fit a `usize`.
    pub fn cache_config(
        &self,
        page_size: usize,
        max_context: usize,
    ) -> Result<CacheConfig, CapacityError> {
        let num_pages = usize::try_from(self.num_pages)
            .map_err(|_| invalid("num_pages", "a usize", &self.num_pages))?;
        Ok(CacheConfig { max_seqs: self.max_batch, num_pages, page_size, max_context })
    }
}

/// The smallest bucket `>= n`, or `None` if `n` is above the largest bucket. `buckets` must be
/// ascending (as [`DEFAULT_BUCKETS`]).
#[must_use]
pub fn bucket_for(buckets: &[usize], n: usize) -> Option<usize> {
    buckets.iter().copied().find(|&c| c >= n)
}

/// The bucket a batch of `n` rows runs in: [`bucket_for`], or `n` itself when `n` is above every
/// bucket (it is then captured at exactly `n`).
#[must_use]
pub fn graph_bucket(buckets: &[usize], n: usize) -> usize {
    bucket_for(buckets, n).unwrap_or(n)
}

/// The buckets captured for an effective maximum batch `max_batch`: every bucket below
/// [`graph_bucket`]`(max_batch)` and that bucket itself. E.g. 40 with [`DEFAULT_BUCKETS`] gives
/// `1, 2, 4, 8, 16, 24, 32, 48`; 200 gives the defaults and 200. Empty for `max_batch == 0`.
#[must_use]
pub fn capture_buckets(buckets: &[usize], max_batch: usize) -> Vec<usize> {
    if max_batch == 0 {
        return Vec::new();
    }
    let top = graph_bucket(buckets, max_batch);
    let mut v: Vec<usize> = buckets.iter().copied().filter(|&c| c < top).collect();
    v.push(top);
    v
}

fn sat(x: u128) -> u64 {
    u64::try_from(x).unwrap_or(u64::MAX)
}

impl RankBudget {
    /// KV pages one sequence of `max_context` tokens needs: `ceil(max_context / page_size)`
    /// (0 if `page_size` is 0; [`plan`] rejects that).
    #[must_use]
    pub fn pages_per_seq(&self) -> u64 {
        if self.page_size == 0 {
            return 0;
        }
        self.max_context.div_ceil(self.page_size) as u64
    }

    /// Memory this rank needs at batch `batch` with graph buckets `buckets` (empty: graphs off),
    /// term by term (formula in the module docs). Non-decreasing in `batch`.
    #[must_use]
    pub fn usage(&self, batch: usize, buckets: &[usize]) -> MemoryBreakdown {
        let b = batch as u128;
        let (rows, reserve) = if buckets.is_empty() || batch == 0 {
            (b, 0u128)
        } else {
            let caps = capture_buckets(buckets, batch);
            let reserve = caps.iter().fold(0u128, |acc, &c| {
                acc.saturating_add(
                    u128::from(self.graph_bytes_per_bucket)
                        .saturating_add(u128::from(self.graph_row_bytes).saturating_mul(c as u128)),
                )
            });
            (graph_bucket(buckets, batch) as u128, reserve)
        };
        let pages = b
            .saturating_mul(u128::from(self.pages_per_seq()))
            .saturating_add(u128::from(self.reserved_kv_pages));
        let weights = u128::from(self.weight_bytes);
        let kv = pages.saturating_mul(u128::from(self.kv_page_bytes));
        let state = b.saturating_mul(u128::from(self.state_slot_bytes));
        let act = rows.saturating_mul(u128::from(self.activation_row_bytes));
        let fixed = u128::from(self.fixed_workspace_bytes);
        let total =
            [kv, state, act, fixed, reserve].iter().fold(weights, |acc, &x| acc.saturating_add(x));
        MemoryBreakdown {
            weights: sat(weights),
            kv_cache: sat(kv),
            state_slots: sat(state),
            activations: sat(act),
            fixed_workspaces: sat(fixed),
            graph_reserve: sat(reserve),
            total: sat(total),
        }
    }

    /// Whether batch `batch` fits: `usage(batch).total <= free_bytes` (a saturated total never
    /// fits unless everything is `u64::MAX`, which [`plan`] cannot be given meaningfully).
    #[must_use]
    pub fn fits(&self, batch: usize, buckets: &[usize]) -> bool {
        let u = self.usage(batch, buckets);
        u.total < u64::MAX && u.total <= self.free_bytes
    }

    /// The largest `b` in `1..=requested` that fits, or 0 if batch 1 does not. Bisection over the
    /// non-decreasing usage; each probe computes the graph reserve for the probe's own bucket.
    #[must_use]
    pub fn max_batch(&self, requested: usize, buckets: &[usize]) -> usize {
        if requested == 0 || !self.fits(1, buckets) {
            return 0;
        }
        // Invariant: lo fits, hi + 1 does not (or hi == requested).
        let (mut lo, mut hi) = (1usize, requested);
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if self.fits(mid, buckets) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo
    }
}

fn check_buckets(buckets: &[usize]) -> Result<(), CapacityError> {
    if buckets.first() == Some(&0) || buckets.windows(2).any(|w| w[0] >= w[1]) {
        return Err(invalid("buckets", "strictly ascending sizes >= 1", &format!("{buckets:?}")));
    }
    Ok(())
}

/// Plan the effective maximum batch over `ranks` for at most `requested_max_batch` sequences,
/// with CUDA-graph `buckets` (e.g. [`DEFAULT_BUCKETS`]; empty = graphs off).
///
/// Each rank's maximum is the largest `b <= requested_max_batch` whose [`RankBudget::usage`] —
/// with the graph reserve of `b`'s own bucket — fits its `free_bytes`; the plan's batch is the
/// minimum over ranks.
///
/// # Errors
/// [`CapacityError::Invalid`] for `requested_max_batch == 0`, no ranks, a rank with `page_size`
/// or `max_context` 0, ranks with different page shapes, or buckets that are not strictly
/// ascending sizes >= 1; [`CapacityError::NoFit`] (naming the rank and the shortfall in bytes)
/// when some rank cannot hold even one sequence.
pub fn plan(
    ranks: &[RankBudget],
    requested_max_batch: usize,
    buckets: &[usize],
) -> Result<CapacityPlan, CapacityError> {
    if requested_max_batch == 0 {
        return Err(invalid("requested_max_batch", ">= 1", &0));
    }
    let Some(first) = ranks.first() else {
        return Err(invalid("ranks", "at least one rank", &0));
    };
    check_buckets(buckets)?;
    for r in ranks {
        if r.page_size == 0 {
            return Err(invalid("page_size", ">= 1", &0));
        }
        if r.max_context == 0 {
            return Err(invalid("max_context", ">= 1", &0));
        }
        if r.pages_per_seq() != first.pages_per_seq()
            || r.reserved_kv_pages != first.reserved_kv_pages
        {
            return Err(invalid(
                "ranks",
                format!(
                    "the same page shape on every rank ({} pages per sequence + {} reserved)",
                    first.pages_per_seq(),
                    first.reserved_kv_pages
                ),
                &format!("{} + {}", r.pages_per_seq(), r.reserved_kv_pages),
            ));
        }
    }
    let mut own = Vec::with_capacity(ranks.len());
    for (i, r) in ranks.iter().enumerate() {
        let m = r.max_batch(requested_max_batch, buckets);
        if m == 0 {
            let breakdown = r.usage(1, buckets);
            return Err(CapacityError::NoFit {
                rank: i,
                needed: breakdown.total,
                free: r.free_bytes,
                shortfall: breakdown.total.saturating_sub(r.free_bytes),
                breakdown,
            });
        }
        own.push(m);
    }
    let max_batch = own.iter().copied().min().unwrap_or(0);
    let rank_plans = ranks
        .iter()
        .zip(&own)
        .map(|(r, &m)| {
            let breakdown = r.usage(max_batch, buckets);
            RankPlan {
                own_max_batch: m,
                breakdown,
                headroom_bytes: r.free_bytes.saturating_sub(breakdown.total),
            }
        })
        .collect();
    let buckets_out =
        if buckets.is_empty() { Vec::new() } else { capture_buckets(buckets, max_batch) };
    Ok(CapacityPlan {
        max_batch,
        buckets: buckets_out,
        num_slots: max_batch,
        num_pages: (max_batch as u64)
            .saturating_mul(first.pages_per_seq())
            .saturating_add(first.reserved_kv_pages),
        ranks: rank_plans,
    })
}

/// A rank's model-derived byte counts ([`rank_bytes`]); combine with the free memory and the
/// graph costs into a [`RankBudget`] with [`RankBytes::budget`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RankBytes {
    /// Parameters held by the rank (replicated ones included).
    pub params: u64,
    /// `params * 2` (bf16 weights).
    pub weight_bytes: u64,
    /// One KV page over every attention layer (bf16 K and V).
    pub kv_page_bytes: u64,
    /// One GDN slot over every GDN layer (f32 recurrent + bf16 conv `[conv_dim/tp, W-1]`).
    pub state_slot_bytes: u64,
    /// Decode-step activations per row (estimate, see [`rank_bytes`]).
    pub activation_row_bytes: u64,
    /// Batch-independent workspaces (estimate, see [`rank_bytes`]).
    pub fixed_workspace_bytes: u64,
}

impl RankBytes {
    /// The [`RankBudget`] of a rank with `free_bytes` free, these byte counts, the cache shape
    /// of `cache` (`page_size`, `max_context`; its `max_seqs` / `num_pages` are what the plan
    /// decides and are ignored), one reserved padding page, and the given per-bucket / per-row
    /// graph costs (bytes).
    #[must_use]
    pub fn budget(
        &self,
        free_bytes: u64,
        cache: &CacheConfig,
        graph_bytes_per_bucket: u64,
        graph_row_bytes: u64,
    ) -> RankBudget {
        RankBudget {
            free_bytes,
            weight_bytes: self.weight_bytes,
            kv_page_bytes: self.kv_page_bytes,
            page_size: cache.page_size,
            max_context: cache.max_context,
            reserved_kv_pages: 1,
            state_slot_bytes: self.state_slot_bytes,
            activation_row_bytes: self.activation_row_bytes,
            fixed_workspace_bytes: self.fixed_workspace_bytes,
            graph_bytes_per_bucket,
            graph_row_bytes,
        }
    }
}

/// Bytes of one row of a bucket's static decode inputs, for [`RankBudget::graph_row_bytes`]:
/// six i32 per row (token id, position, slot, context length, sequence length, sampled id) plus
/// the row's page-table entries (`pages_per_seq` i32).
#[must_use]
pub fn static_input_row_bytes(pages_per_seq: u64) -> u64 {
    4 * (6 + pages_per_seq)
}

/// Heads of a grouped layer one rank keeps: `(big / tp, small / tp)` when `tp` divides `small`,
/// else `(big / tp, 1)` when `tp` is a multiple of `small` (the small head is replicated).
fn split_heads(
    big: usize,
    small: usize,
    tp: usize,
    what_big: &'static str,
    what_small: &'static str,
) -> Result<(usize, usize), CapacityError> {
    if big % tp != 0 {
        return Err(CapacityError::Indivisible { what: what_big, value: big, tp });
    }
    if small % tp == 0 {
        Ok((big / tp, small / tp))
    } else if tp % small == 0 {
        Ok((big / tp, 1))
    } else {
        Err(CapacityError::Indivisible { what: what_small, value: small, tp })
    }
}

/// Bytes of `gdr.chunk_prefill`'s workspace for `tokens` tokens of one sequence on a rank with
/// `hv` value heads (an upper bound of `deltakit::ops::gdr::chunk_prefill::workspace_bytes`'
/// layout: i32 chunk offsets / chunk map, f32 g/beta/Tm/W/U per token and head, bf16 per-chunk
/// states, i32 ready / abort flags of the split pipeline (one per chunk and head, one per state
/// CTA), and up to 255 bytes of alignment after each of its 9 regions).
fn gdr_chunk_workspace_bytes(tokens: u64, hv: u64, k: u64, v: u64) -> u64 {
    let th = tokens * hv;
    let chunks = tokens / 64 + 1;
    let index = (2 + chunks) * 4;
    let flags = (chunks * hv + hv * v.div_ceil(64)) * 4;
    index + th * F32 * (2 + 64 + k + v) + chunks * hv * k * v * BF16 + flags + 9 * 256
}

/// Byte counts of one rank of a `tp`-way tensor-parallel Qwen3.5 model with KV pages of
/// `cache.page_size` tokens and prefill chunks of `prefill_chunk` tokens (pure; the same on
/// every rank; `cache`'s other fields are not read).
///
/// - **Weights** (bf16): the embedding `[vocab, D]` and every norm weight replicated; the LM
///   head `[vocab/tp, D]` (none when embeddings are tied: the rank slices the replicated
///   table); per GDN layer `in_proj_qkv [conv_dim_r, D]`, `in_proj_z [H_v_r V, D]`,
///   `in_proj_b`/`in_proj_a [H_v_r, D]`, `conv1d [conv_dim_r, W]`, `A_log`, `dt_bias [H_v_r]`,
///   `out_proj [D, H_v_r V]`, with `conv_dim_r = 2 H_k_r K + H_v_r V`; per attention layer
///   `q_proj [2 H_q_r hd, D]`, `k_proj`/`v_proj [H_kv_r hd, D]`, `o_proj [D, H_q_r hd]`; per
///   layer the MLP `[I/tp, D]` x 2 + `[D, I/tp]`. (The f32 copies the CUDA backend keeps of
///   one-row weights, a few hundred KB, are not counted: leave them to the free-memory margin.)
/// - **KV page**: `attention_layers * 2 * page_size * H_kv_r * hd * 2` bytes.
/// - **State slot**: `gdn_layers * (H_v_r K V * 4 + conv_dim_r (W - 1) * 2)` bytes.
/// - **Activations per row** (an upper estimate: every distinct bf16 buffer of one layer of each
///   kind, reused across layers): residual + normed hidden + each projection output, the conv
///   and GDR outputs, the attention q / gate / output, the MLP `gate|up` and product, the
///   `vocab/tp` logits, and `attn.decode`'s split-K f32 partials for one split
///   (`H_q_r (hd + 1) * 4`).
/// - **Fixed workspaces**: the activations of a `prefill_chunk`-token prefill step (the same
///   per-token estimate) + `gdr.chunk_prefill`'s workspace for that chunk + `attn.decode`'s
///   split-K partials of the ~2 waves of programs `decode_splits` aims for
///   (`ceil(264 / H_kv_r) * H_q_r (hd + 1) * 4`).
///
/// # Errors
/// [`CapacityError::Invalid`] for `tp` or `page_size` 0; [`CapacityError::Indivisible`] when
/// `tp` does not divide the GDN value heads, attention q heads, intermediate size or
/// vocabulary, or neither divides nor is a multiple of the key / kv head count.
pub fn rank_bytes(
    cfg: &ModelConfig,
    cache: &CacheConfig,
    prefill_chunk: usize,
    tp: usize,
) -> Result<RankBytes, CapacityError> {
    let page_size = cache.page_size;
    if tp == 0 {
        return Err(invalid("tp", ">= 1", &0));
    }
    if page_size == 0 {
        return Err(invalid("page_size", ">= 1", &0));
    }
    let (hv, hk) = split_heads(
        cfg.linear_num_value_heads,
        cfg.linear_num_key_heads,
        tp,
        "linear_num_value_heads",
        "linear_num_key_heads",
    )?;
    let (hq, hkv) = split_heads(
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        tp,
        "num_attention_heads",
        "num_key_value_heads",
    )?;
    if cfg.intermediate_size % tp != 0 {
        return Err(CapacityError::Indivisible {
            what: "intermediate_size",
            value: cfg.intermediate_size,
            tp,
        });
    }
    if cfg.vocab_size % tp != 0 {
        return Err(CapacityError::Indivisible { what: "vocab_size", value: cfg.vocab_size, tp });
    }
    let u = |x: usize| x as u64;
    let (d, inter, vocab) = (u(cfg.hidden_size), u(cfg.intermediate_size / tp), u(cfg.vocab_size));
    let vocab_r = vocab / u(tp);
    let (k, v, w) = (u(cfg.linear_key_head_dim), u(cfg.linear_value_head_dim), u(cfg.conv_kernel));
    let (hv, hk, hq, hkv) = (u(hv), u(hk), u(hq), u(hkv));
    let hd = u(cfg.head_dim);
    let conv_r = 2 * hk * k + hv * v;
    let vd_r = hv * v;
    let (n_attn, n_gdn) = (u(cfg.num_attention_layers()), u(cfg.num_linear_layers()));

    // Parameters.
    let mut params = vocab * d + d; // embedding + final norm
    if !cfg.tie_word_embeddings {
        params += vocab_r * d;
    }
    for t in &cfg.layer_types {
        params += 2 * d + 3 * d * inter;
        params += match t {
            LayerType::LinearAttention => {
                conv_r * d + vd_r * d + 2 * hv * d + conv_r * w + 2 * hv + v + d * vd_r
            }
            LayerType::FullAttention => 2 * hq * hd * d + 2 * hkv * hd * d + d * hq * hd + 2 * hd,
        };
    }

    let kv_page_bytes = n_attn * 2 * u(page_size) * hkv * hd * BF16;
    let state_slot_bytes = n_gdn * (hv * k * v * F32 + conv_r * (w - 1) * BF16);

    // Activations per row (bf16 elements), one layer of each kind + logits.
    let common = 2 * d + d; // residual, normed, mixer/MLP output before the residual add
    let gdn = if n_gdn > 0 { conv_r * 2 + vd_r * 3 + 2 * hv } else { 0 };
    let attn = if n_attn > 0 { 2 * hq * hd + 2 * hkv * hd + 4 * hq * hd } else { 0 };
    let mlp = 2 * inter + inter;
    let per_token = (common + gdn + attn + mlp + vocab_r) * BF16;
    let split_row = if n_attn > 0 { hq * (hd + 1) * F32 } else { 0 };
    let activation_row_bytes = per_token + split_row;

    let chunk = u(prefill_chunk);
    let prefill_ws = if n_gdn > 0 { gdr_chunk_workspace_bytes(chunk, hv, k, v) } else { 0 };
    let split_fixed = if n_attn > 0 { 264u64.div_ceil(hkv) * split_row } else { 0 };
    let fixed_workspace_bytes = chunk * per_token + prefill_ws + split_fixed;

    Ok(RankBytes {
        params,
        weight_bytes: params * BF16,
        kv_page_bytes,
        state_slot_bytes,
        activation_row_bytes,
        fixed_workspace_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paths::find_fixtures_dir;
    use proptest::prelude::*;

    /// The capacity mirror of `gdr.chunk_prefill`'s workspace never under-counts the kernel
    /// crate's own layout (one sequence, the prefill-chunk sizes and head shapes the engine uses),
    /// and over-counts by at most a few KB.
    #[cfg(feature = "cuda")]
    #[test]
    fn gdr_chunk_workspace_mirror_bounds_the_kernel_layout() {
        use deltakit::ops::gdr::chunk_prefill::workspace_bytes;
        use deltakit::ops::gdr::GdrDims;
        for tokens in [1usize, 63, 64, 65, 512, 2048, 8192] {
            for (h_k, h_v, k, v) in
                [(16, 48, 128, 128), (8, 24, 128, 128), (16, 32, 128, 128), (2, 4, 64, 32)]
            {
                let real = workspace_bytes(GdrDims { h_k, h_v, k, v }, tokens, 1) as u64;
                let mirror =
                    gdr_chunk_workspace_bytes(tokens as u64, h_v as u64, k as u64, v as u64);
                assert!(
                    mirror >= real && mirror - real <= 4096,
                    "{tokens} {h_v} {k} {v}: {mirror} vs {real}"
                );
            }
        }
    }

    fn budget(free: u64) -> RankBudget {
        RankBudget {
            free_bytes: free,
            weight_bytes: 1000,
            kv_page_bytes: 10,
            page_size: 16,
            max_context: 100, // 7 pages per sequence
            reserved_kv_pages: 1,
            state_slot_bytes: 50,
            activation_row_bytes: 20,
            fixed_workspace_bytes: 100,
            graph_bytes_per_bucket: 30,
            graph_row_bytes: 4,
        }
    }

    #[test]
    fn buckets() {
        let b = &DEFAULT_BUCKETS;
        assert_eq!(bucket_for(b, 1), Some(1));
        assert_eq!(bucket_for(b, 3), Some(4));
        assert_eq!(bucket_for(b, 5), Some(8));
        assert_eq!(bucket_for(b, 17), Some(24));
        assert_eq!(bucket_for(b, 128), Some(128));
        assert_eq!(bucket_for(b, 129), None);
        assert_eq!(graph_bucket(b, 129), 129);
        assert_eq!(capture_buckets(b, 40), vec![1, 2, 4, 8, 16, 24, 32, 48]);
        assert_eq!(capture_buckets(b, 1), vec![1]);
        assert_eq!(capture_buckets(b, 200).last(), Some(&200));
        assert_eq!(capture_buckets(b, 200).len(), 12);
        assert!(capture_buckets(b, 0).is_empty());
    }

    #[test]
    fn usage_by_hand() {
        let r = budget(0);
        // batch 5 -> bucket 8; captured 1, 2, 4, 8.
        let u = r.usage(5, &DEFAULT_BUCKETS);
        assert_eq!(u.weights, 1000);
        assert_eq!(u.kv_cache, (5 * 7 + 1) * 10);
        assert_eq!(u.state_slots, 5 * 50);
        assert_eq!(u.activations, 8 * 20);
        assert_eq!(u.fixed_workspaces, 100);
        assert_eq!(u.graph_reserve, 4 * 30 + 4 * (1 + 2 + 4 + 8));
        assert_eq!(u.total, 1000 + 360 + 250 + 160 + 100 + 180);
        // Graphs off: rows = batch, no reserve.
        let u = r.usage(5, &[]);
        assert_eq!((u.activations, u.graph_reserve), (100, 0));
    }

    /// The reserve is sized from the candidate's bucket: a budget that holds 20 sequences but
    /// not the 128-row graph reserve still plans 20 (or what fits with bucket 24's reserve).
    #[test]
    fn tight_budget_uses_candidate_bucket() {
        let mut r = budget(0);
        r.graph_row_bytes = 1000; // bucket 128's reserve alone would be ~420k
        let need_20 = r.usage(20, &DEFAULT_BUCKETS).total;
        let need_21 = r.usage(21, &DEFAULT_BUCKETS).total;
        assert_eq!(need_20, need_21 - 7 * 10 - 50, "20 and 21 share bucket 24");
        r.free_bytes = need_20;
        let p = plan(&[r], 128, &DEFAULT_BUCKETS).unwrap();
        assert_eq!(p.max_batch, 20);
        assert_eq!(p.buckets, vec![1, 2, 4, 8, 16, 24]);
        assert_eq!(p.num_pages, 20 * 7 + 1);
        assert_eq!(p.ranks[0].headroom_bytes, 0);
        // Sizing from the requested maximum's bucket would have refused every batch.
        assert!(r.usage(1, &DEFAULT_BUCKETS).total + 1000 * 128 > r.free_bytes);
    }

    #[test]
    fn no_fit_names_the_shortfall() {
        let r = budget(10);
        let e = plan(&[budget(1 << 30), r], 8, &DEFAULT_BUCKETS).unwrap_err();
        let need = r.usage(1, &DEFAULT_BUCKETS).total;
        assert_eq!(
            e,
            CapacityError::NoFit {
                rank: 1,
                needed: need,
                free: 10,
                shortfall: need - 10,
                breakdown: r.usage(1, &DEFAULT_BUCKETS),
            }
        );
        let msg = EngineError::from(e).to_string();
        assert!(
            msg.contains("rank 1") && msg.contains(&format!("short by {}", need - 10)),
            "{msg}"
        );
    }

    #[test]
    fn invalid_arguments() {
        let r = budget(1 << 20);
        assert!(matches!(
            plan(&[r], 0, &DEFAULT_BUCKETS),
            Err(CapacityError::Invalid { arg: "requested_max_batch", .. })
        ));
        assert!(matches!(
            plan(&[], 4, &DEFAULT_BUCKETS),
            Err(CapacityError::Invalid { arg: "ranks", .. })
        ));
        assert!(matches!(
            plan(&[r], 4, &[1, 4, 2]),
            Err(CapacityError::Invalid { arg: "buckets", .. })
        ));
        assert!(matches!(plan(&[r], 4, &[0, 1]), Err(CapacityError::Invalid { .. })));
        let mut z = r;
        z.page_size = 0;
        assert!(matches!(
            plan(&[z], 4, &DEFAULT_BUCKETS),
            Err(CapacityError::Invalid { arg: "page_size", .. })
        ));
        let mut other = r;
        other.max_context = 1000;
        assert!(matches!(
            plan(&[r, other], 4, &DEFAULT_BUCKETS),
            Err(CapacityError::Invalid { arg: "ranks", .. })
        ));
    }

    #[test]
    fn saturating_sizes_never_fit() {
        let mut r = budget(u64::MAX - 1);
        r.kv_page_bytes = u64::MAX / 2;
        r.max_context = usize::MAX;
        r.page_size = 1;
        assert_eq!(r.max_batch(1 << 40, &DEFAULT_BUCKETS), 0);
    }

    fn small_budget() -> impl Strategy<Value = RankBudget> {
        (
            0u64..20_000,
            (0u64..500, 0u64..20, 1usize..8, 1usize..40, 0u64..3),
            (0u64..100, 0u64..60, 0u64..300),
            (0u64..80, 0u64..10),
        )
            .prop_map(|(free, (wt, kvp, ps, ctx, rsv), (st, act, fixed), (gb, gr))| {
                RankBudget {
                    free_bytes: free,
                    weight_bytes: wt,
                    kv_page_bytes: kvp,
                    page_size: ps,
                    max_context: ctx,
                    reserved_kv_pages: rsv,
                    state_slot_bytes: st,
                    activation_row_bytes: act,
                    fixed_workspace_bytes: fixed,
                    graph_bytes_per_bucket: gb,
                    graph_row_bytes: gr,
                }
            })
    }

    fn bucket_list() -> impl Strategy<Value = Vec<usize>> {
        prop_oneof![
            Just(Vec::new()),
            Just(DEFAULT_BUCKETS.to_vec()),
            proptest::collection::btree_set(1usize..80, 1..6)
                .prop_map(|s| s.into_iter().collect::<Vec<_>>()),
        ]
    }

    /// The linear scan downwards from the requested maximum, each candidate with its own
    /// bucket's reserve: the definition `plan` must equal.
    fn brute_force(r: &RankBudget, requested: usize, buckets: &[usize]) -> usize {
        (1..=requested).rev().find(|&b| r.usage(b, buckets).total <= r.free_bytes).unwrap_or(0)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn equals_brute_force(r in small_budget(), req in 1usize..150, bk in bucket_list()) {
            prop_assert_eq!(r.max_batch(req, &bk), brute_force(&r, req, &bk));
        }

        #[test]
        fn positive_iff_one_fits_and_within_budget(
            r in small_budget(), req in 1usize..150, bk in bucket_list()
        ) {
            let one_fits = r.usage(1, &bk).total <= r.free_bytes;
            match plan(&[r], req, &bk) {
                Ok(p) => {
                    prop_assert!(one_fits);
                    prop_assert!(p.max_batch >= 1 && p.max_batch <= req);
                    prop_assert!(p.ranks[0].breakdown.total <= r.free_bytes);
                    prop_assert_eq!(p.ranks[0].breakdown, r.usage(p.max_batch, &bk));
                    // Maximal: one more sequence does not fit (or the request caps it).
                    prop_assert!(
                        p.max_batch == req || r.usage(p.max_batch + 1, &bk).total > r.free_bytes
                    );
                }
                Err(CapacityError::NoFit { rank, needed, free, shortfall, .. }) => {
                    prop_assert!(!one_fits);
                    prop_assert_eq!(rank, 0);
                    prop_assert_eq!(shortfall, needed - free);
                }
                Err(e) => prop_assert!(false, "unexpected error {e}"),
            }
        }

        #[test]
        fn monotone_in_budget(
            r in small_budget(), extra in 0u64..5_000, req in 1usize..150, bk in bucket_list()
        ) {
            let mut more = r;
            more.free_bytes += extra;
            prop_assert!(more.max_batch(req, &bk) >= r.max_batch(req, &bk));
        }

        #[test]
        fn minimum_over_ranks(
            rs in proptest::collection::vec(small_budget(), 1..5),
            req in 1usize..150,
            bk in bucket_list(),
        ) {
            // Same page shape on every rank (plan requires it).
            let rs: Vec<RankBudget> = rs
                .iter()
                .map(|r| RankBudget {
                    page_size: rs[0].page_size,
                    max_context: rs[0].max_context,
                    reserved_kv_pages: rs[0].reserved_kv_pages,
                    ..*r
                })
                .collect();
            let own: Vec<usize> = rs.iter().map(|r| brute_force(r, req, &bk)).collect();
            match plan(&rs, req, &bk) {
                Ok(p) => {
                    prop_assert_eq!(p.max_batch, *own.iter().min().unwrap());
                    for (rp, (r, o)) in p.ranks.iter().zip(rs.iter().zip(&own)) {
                        prop_assert_eq!(rp.own_max_batch, *o);
                        prop_assert!(rp.breakdown.total <= r.free_bytes);
                    }
                }
                Err(CapacityError::NoFit { rank, .. }) => {
                    prop_assert_eq!(own.iter().position(|&o| o == 0), Some(rank));
                }
                Err(e) => prop_assert!(false, "unexpected error {e}"),
            }
        }
    }

    #[test]
    fn static_inputs() {
        assert_eq!(static_input_row_bytes(0), 24);
        assert_eq!(static_input_row_bytes(budget(0).pages_per_seq()), 4 * (6 + 7));
    }

    fn cache(page_size: usize) -> CacheConfig {
        CacheConfig::for_sequences(1, 8192, page_size)
    }

    fn real_config(name: &str) -> ModelConfig {
        let dir = find_fixtures_dir().unwrap().parent().unwrap().join("configs").join(name);
        ModelConfig::from_path(&dir).unwrap()
    }

    /// Qwen3.5-9B: D 4096, I 12288, vocab 248320, 32 layers (24 GDN, 8 attention), GDN H_k 16,
    /// H_v 32, K = V = 128, W 4; attention H_q 16, H_kv 4, hd 256; untied LM head.
    #[test]
    fn qwen35_9b_by_hand() {
        let c = real_config("qwen3.5-9b");
        // tp = 1. GDN layer: conv_dim 2*16*128 + 32*128 = 8192.
        let gdn = 8192 * 4096 + 4096 * 4096 + 2 * 32 * 4096 + 8192 * 4 + 2 * 32 + 128 + 4096 * 4096;
        let attn = 2 * 16 * 256 * 4096 + 2 * 4 * 256 * 4096 + 4096 * 16 * 256 + 2 * 256;
        let layer = 2 * 4096 + 3 * 4096 * 12288;
        let params: u64 = 248_320 * 4096 * 2 + 4096 + 32 * layer + 24 * gdn + 8 * attn;
        assert_eq!(params, c.num_parameters() as u64);
        let b = rank_bytes(&c, &cache(16), 2048, 1).unwrap();
        assert_eq!(b.params, params);
        assert_eq!(b.weight_bytes, 2 * params);
        assert_eq!(b.kv_page_bytes, 8 * 2 * 16 * 4 * 256 * 2); // 512 KiB
        assert_eq!(b.state_slot_bytes, 24 * (32 * 128 * 128 * 4 + 8192 * 3 * 2)); // ~48.6 MB

        // tp = 2: heads, I and vocab halved; embedding and norms replicated.
        let gdn2 =
            4096 * 4096 + 2048 * 4096 + 2 * 16 * 4096 + 4096 * 4 + 2 * 16 + 128 + 4096 * 2048;
        let attn2 = 2 * 8 * 256 * 4096 + 2 * 2 * 256 * 4096 + 4096 * 8 * 256 + 2 * 256;
        let layer2 = 2 * 4096 + 3 * 4096 * 6144;
        let params2: u64 =
            248_320 * 4096 + 124_160 * 4096 + 4096 + 32 * layer2 + 24 * gdn2 + 8 * attn2;
        let b2 = rank_bytes(&c, &cache(16), 2048, 2).unwrap();
        assert_eq!(b2.params, params2);
        assert_eq!(b2.kv_page_bytes, 8 * 2 * 16 * 2 * 256 * 2);
        assert_eq!(b2.state_slot_bytes, 24 * (16 * 128 * 128 * 4 + 4096 * 3 * 2));

        // tp = 8 > H_kv = 4: one kv head per rank (replicated twice); H_k = 16 still divides.
        let b8 = rank_bytes(&c, &cache(16), 2048, 8).unwrap();
        assert_eq!(b8.kv_page_bytes, 8 * 2 * 16 * 256 * 2);
        assert_eq!(b8.state_slot_bytes, 24 * (4 * 128 * 128 * 4 + (2 * 2 * 128 + 512) * 3 * 2));
    }

    /// Qwen3.5-27B: D 5120, I 17408, 64 layers (48 GDN, 16 attention), GDN H_k 16, H_v 48;
    /// attention H_q 24, H_kv 4, hd 256.
    #[test]
    fn qwen35_27b_by_hand() {
        let c = real_config("qwen3.5-27b");
        let conv = 2 * 16 * 128 + 48 * 128; // 10240
        let gdn = conv * 5120 + 6144 * 5120 + 2 * 48 * 5120 + conv * 4 + 2 * 48 + 128 + 5120 * 6144;
        let attn = 2 * 24 * 256 * 5120 + 2 * 4 * 256 * 5120 + 5120 * 24 * 256 + 2 * 256;
        let layer = 2 * 5120 + 3 * 5120 * 17408;
        let params: u64 = 248_320 * 5120 * 2 + 5120 + 64 * layer + 48 * gdn + 16 * attn;
        assert_eq!(params, c.num_parameters() as u64);
        let b = rank_bytes(&c, &cache(16), 2048, 1).unwrap();
        assert_eq!(b.params, params);
        assert_eq!(b.kv_page_bytes, 16 * 2 * 16 * 4 * 256 * 2);
        assert_eq!(b.state_slot_bytes, 48 * (48 * 128 * 128 * 4 + 10240 * 3 * 2));

        // tp = 4: H_v 12, H_k 4, H_q 6, H_kv 1, I 4352, vocab 62080.
        let conv4 = 2 * 4 * 128 + 12 * 128; // 2560
        let gdn4 =
            conv4 * 5120 + 1536 * 5120 + 2 * 12 * 5120 + conv4 * 4 + 2 * 12 + 128 + 5120 * 1536;
        let attn4 = 2 * 6 * 256 * 5120 + 2 * 256 * 5120 + 5120 * 6 * 256 + 2 * 256;
        let layer4 = 2 * 5120 + 3 * 5120 * 4352;
        let params4: u64 =
            248_320 * 5120 + 62_080 * 5120 + 5120 + 64 * layer4 + 48 * gdn4 + 16 * attn4;
        let b4 = rank_bytes(&c, &cache(32), 2048, 4).unwrap();
        assert_eq!(b4.params, params4);
        assert_eq!(b4.kv_page_bytes, 16 * 2 * 32 * 256 * 2);
        assert_eq!(b4.state_slot_bytes, 48 * (12 * 128 * 128 * 4 + conv4 * 3 * 2));

        // Indivisible: 24 q heads over tp = 16; 48 value heads over tp = 5.
        assert_eq!(
            rank_bytes(&c, &cache(16), 2048, 16),
            Err(CapacityError::Indivisible { what: "num_attention_heads", value: 24, tp: 16 })
        );
        assert!(matches!(
            rank_bytes(&c, &cache(16), 2048, 5),
            Err(CapacityError::Indivisible { what: "linear_num_value_heads", .. })
        ));
    }

    /// The activation / workspace estimates, by hand on the 9B at tp = 1, and an end-to-end
    /// plan on an H200-sized budget.
    #[test]
    fn activations_and_plan_9b() {
        let c = real_config("qwen3.5-9b");
        let b = rank_bytes(&c, &cache(16), 2048, 1).unwrap();
        let per_token = (3 * 4096 // residual, normed, pre-add output
            + (2 * 8192 + 3 * 4096 + 2 * 32) // GDN
            + (2 * 16 * 256 + 2 * 4 * 256 + 4 * 16 * 256) // attention
            + 3 * 12288 // MLP
            + 248_320)
            * 2;
        let split_row = 16 * 257 * 4;
        assert_eq!(b.activation_row_bytes, per_token + split_row);
        // Chunk offsets / map (2 + 33 i32), g/beta/Tm/W/U, 33 per-chunk states, the split
        // pipeline's flags (33 x 32 ready + 32 x 2 state-CTA aborts), 9 x 256 alignment.
        let gdr_ws = (2 + 33) * 4
            + 2048 * 32 * 4 * (2 + 64 + 256)
            + 33 * 32 * 128 * 128 * 2
            + (33 * 32 + 32 * 2) * 4
            + 9 * 256;
        assert_eq!(b.fixed_workspace_bytes, 2048 * per_token + gdr_ws + 66 * split_row);

        // 140 GB free, 8k context: weights ~19.3 GB, 256 MiB of KV + 48.6 MB of state per
        // sequence: ~390 sequences.
        let r = b.budget(140_000_000_000, &cache(16), 1 << 20, 64);
        let p = plan(&[r], 4096, &DEFAULT_BUCKETS).unwrap();
        let cc = p.cache_config(16, 8192).unwrap();
        assert_eq!((cc.max_seqs, cc.num_pages), (p.max_batch, p.max_batch * 512 + 1));
        assert!(p.max_batch > 128 && p.max_batch < 4096, "{}", p.max_batch);
        assert!(p.ranks[0].breakdown.total <= r.free_bytes);
        assert!(!r.fits(p.max_batch + 1, &DEFAULT_BUCKETS));
        assert_eq!(p.buckets.last(), Some(&p.max_batch), "above 128 the top bucket is the batch");
    }
}
