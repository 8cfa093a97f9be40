//! Tensor-parallel sharding plan: which rows / columns of every checkpoint tensor rank `r` of
//! `tp` keeps, and the rank-local dims of each layer. Pure functions of (config, tp, rank).
//!
//! Megatron-style column / row parallel layers, as vLLM shards Qwen3.5:
//!
//! | tensor | split | after the matmul |
//! | --- | --- | --- |
//! | GDN `in_proj_qkv` `[2 H_k K + H_v V, D]` | rows: the rank's q slice, then its k slice, then its v slice (a *stitch* of three ranges: the checkpoint layout is `[all q \| all k \| all v]`) | — |
//! | GDN `conv1d.weight` `[conv_dim, 1, W]` | the same three channel ranges | — |
//! | GDN `in_proj_z` `[H_v V, D]`, `in_proj_b` / `in_proj_a` `[H_v, D]`, `A_log`, `dt_bias` `[H_v]` | by value head | — |
//! | GDN `norm.weight` `[V]` | replicated | — |
//! | GDN `out_proj` `[D, H_v V]` | columns, by value head | all-reduce (sum) |
//! | attention `q_proj` `[H_q 2 hd, D]` | rows, whole heads (each head's `[q \| gate]` rows stay together) | — |
//! | attention `k_proj` / `v_proj` `[H_kv hd, D]` | rows, by kv head (replicated when `tp > H_kv`) | — |
//! | attention `q_norm` / `k_norm` | replicated | — |
//! | attention `o_proj` `[D, H_q hd]` | columns, by q head | all-reduce (sum) |
//! | MLP `gate_proj` / `up_proj` `[I, D]` | rows | — |
//! | MLP `down_proj` `[D, I]` | columns | all-reduce (sum) |
//! | `lm_head` `[vocab, D]` (or the tied embedding) | rows: the rank's vocabulary slice | all-gather of the logits |
//! | `embed_tokens` `[vocab, D]`, every RMSNorm weight | replicated | — |
//!
//! **Embedding: replicated, not vocab-parallel.** The lookup reads `T` rows of the table, a few
//! kilobytes per step, so replicating it costs memory only (1.3 GB bf16 at Qwen3.5's 248k x 2560,
//! 2.5 GB at 27B's 5120: under 2% of an H200) and saves the all-reduce of `[T, D]` that a
//! vocab-parallel embedding needs on every step's critical path. The LM head, which *reads* the
//! whole table every step, is vocab-parallel: each rank computes `vocab / tp` logits columns.
//!
//! **Head groups.** Value head `hv` reads key head `hv / (H_v / H_k)` (GDN) and q head `h` reads
//! kv head `h / (H_q / H_kv)` (attention). A rank keeps a contiguous block of `H_v / tp` value
//! (q) heads and exactly the key (kv) heads they read: `H_k / tp` of them when `tp` divides
//! `H_k`, else — when `tp` is a multiple of `H_k` — the single key head its value heads share,
//! replicated on `tp / H_k` ranks. Any other combination is refused (the local head map would
//! not be a uniform group). Replicated key / kv heads mean the conv state and KV cache per rank
//! are larger than `1/tp` of TP=1 (see [`ShardPlan::replicated`]).
//!
//! Indivisible counts fail closed in [`ShardPlan::new`], before anything is loaded, with an error
//! naming the quantity, its value and `tp`.

// `Part::Rows(vec![range])` is a list with one range on purpose (the qkv stitch has three).
#![allow(clippy::single_range_in_vec_init)]

use std::ops::Range;

use crate::config::ModelConfig;
use crate::error::{EngineError, Result};

/// A head block of a grouped layer on one rank: the "big" heads (GDN value heads, attention q
/// heads) the rank computes and the "small" heads (key heads, kv heads) they read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeadBlock {
    /// Global indices of the rank's big heads.
    pub big: Range<usize>,
    /// Global indices of the small heads the rank keeps.
    pub small: Range<usize>,
    /// Whether the small heads are replicated on several ranks (`tp > small count`).
    pub replicated: bool,
}

impl HeadBlock {
    /// Split `n_big` heads grouped over `n_small` heads (`n_big % n_small == 0`) over `tp`
    /// ranks; `what_big` / `what_small` name the config fields in errors.
    ///
    /// # Errors
    /// [`EngineError::Config`] when `tp` does not divide `n_big`, or when neither `tp` divides
    /// `n_small` nor `n_small` divides `tp`.
    pub fn new(
        n_big: usize,
        n_small: usize,
        tp: usize,
        rank: usize,
        what_big: &str,
        what_small: &str,
    ) -> Result<Self> {
        if n_small == 0 || n_big % n_small != 0 {
            return Err(EngineError::Config(format!(
                "{what_big} = {n_big} is not a multiple of {what_small} = {n_small}"
            )));
        }
        if n_big % tp != 0 {
            return Err(EngineError::Config(format!(
                "{what_big} = {n_big} is not divisible by tp = {tp}"
            )));
        }
        let per = n_big / tp;
        let group = n_big / n_small;
        let big = rank * per..(rank + 1) * per;
        if n_small % tp == 0 {
            // per % group == 0 follows: per = n_big / tp = group * (n_small / tp).
            let s = n_small / tp;
            Ok(Self { big, small: rank * s..(rank + 1) * s, replicated: false })
        } else if tp % n_small == 0 {
            // Each rank's block lies inside one group (group % per == 0).
            let k = big.start / group;
            Ok(Self { big, small: k..k + 1, replicated: true })
        } else {
            Err(EngineError::Config(format!(
                "{what_small} = {n_small} is neither divisible by tp = {tp} nor a divisor of it \
                 (a rank's {what_big} would straddle groups)"
            )))
        }
    }

    /// Big heads per rank.
    #[must_use]
    pub fn n_big(&self) -> usize {
        self.big.len()
    }

    /// Small heads per rank.
    #[must_use]
    pub fn n_small(&self) -> usize {
        self.small.len()
    }
}

fn scale(r: &Range<usize>, by: usize) -> Range<usize> {
    r.start * by..r.end * by
}

fn shift(r: &Range<usize>, by: usize) -> Range<usize> {
    r.start + by..r.end + by
}

/// The part of a checkpoint tensor a rank keeps: a list of ranges along the first dim (rows;
/// for a 1-D tensor, elements), and optionally one range along the last dim (columns). Rows and
/// columns are not both split for any Qwen3.5 tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Part {
    /// The whole tensor (replicated).
    Full,
    /// These ranges of dim 0, concatenated in order.
    Rows(Vec<Range<usize>>),
    /// This range of the last dim (of a 2-D tensor).
    Cols(Range<usize>),
}

impl Part {
    /// The local shape of a tensor of `full` shape.
    ///
    /// # Errors
    /// [`EngineError::Weights`] if a range falls outside the shape.
    pub fn local_shape(&self, name: &str, full: &[usize]) -> Result<Vec<usize>> {
        let bad = || {
            EngineError::Weights(format!("tensor `{name}` {full:?}: shard {self:?} out of range"))
        };
        let mut s = full.to_vec();
        match self {
            Part::Full => {}
            Part::Rows(rs) => {
                let d0 = *full.first().ok_or_else(bad)?;
                if rs.iter().any(|r| r.start > r.end || r.end > d0) {
                    return Err(bad());
                }
                s[0] = rs.iter().map(ExactSizeIterator::len).sum();
            }
            Part::Cols(c) => {
                let last = full.len().checked_sub(1).filter(|&l| l > 0).ok_or_else(bad)?;
                if c.start > c.end || c.end > full[last] {
                    return Err(bad());
                }
                s[last] = c.len();
            }
        }
        Ok(s)
    }

    /// Apply the part to a row-major host array of `full` shape (the reference slicing used by
    /// tests and by sources that cannot read a part directly).
    ///
    /// # Errors
    /// As [`Part::local_shape`], and if `data` does not have `full`'s element count.
    pub fn slice<T: Copy>(&self, name: &str, full: &[usize], data: &[T]) -> Result<Vec<T>> {
        self.local_shape(name, full)?;
        if data.len() != full.iter().product::<usize>() {
            return Err(EngineError::Weights(format!(
                "tensor `{name}`: {} elements for shape {full:?}",
                data.len()
            )));
        }
        Ok(match self {
            Part::Full => data.to_vec(),
            Part::Rows(rs) => {
                let row: usize = full[1..].iter().product();
                rs.iter().flat_map(|r| data[r.start * row..r.end * row].iter().copied()).collect()
            }
            Part::Cols(c) => {
                let cols = full[full.len() - 1];
                data.chunks_exact(cols).flat_map(|row| row[c.clone()].iter().copied()).collect()
            }
        })
    }

    /// The runs of flat (row-major) element indices of a tensor of `full` shape that the part
    /// selects, in output order: what a loader reads from a checkpoint.
    #[must_use]
    pub fn runs(&self, full: &[usize]) -> Vec<Range<usize>> {
        let n: usize = full.iter().product();
        match self {
            Part::Full => vec![0..n],
            Part::Rows(rs) => {
                let row: usize = full[1..].iter().product();
                rs.iter().map(|r| r.start * row..r.end * row).filter(|r| !r.is_empty()).collect()
            }
            Part::Cols(c) => {
                let cols = full[full.len() - 1];
                (0..n / cols.max(1)).map(|i| i * cols + c.start..i * cols + c.end).collect()
            }
        }
    }
}

/// Rank `rank`'s share of a model under `tp`-way tensor parallelism (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardPlan {
    /// Tensor-parallel size.
    pub tp: usize,
    /// This rank.
    pub rank: usize,
    /// GDN: value heads (big) and key heads (small).
    pub gdn: HeadBlock,
    /// Attention: q heads (big) and kv heads (small).
    pub attn: HeadBlock,
    /// MLP intermediate columns.
    pub inter: Range<usize>,
    /// LM-head vocabulary rows.
    pub vocab: Range<usize>,
}

impl ShardPlan {
    /// The plan of rank `rank` of `tp` for `cfg`.
    ///
    /// # Errors
    /// [`EngineError::Config`] for `tp == 0`, `rank >= tp`, or a count that does not divide:
    /// `linear_num_value_heads`, `linear_num_key_heads`, `num_attention_heads`,
    /// `num_key_value_heads`, `intermediate_size`, `vocab_size` (each message names the field,
    /// its value and `tp`).
    pub fn new(cfg: &ModelConfig, tp: usize, rank: usize) -> Result<Self> {
        if tp == 0 {
            return Err(EngineError::Config("tp must be >= 1".into()));
        }
        if rank >= tp {
            return Err(EngineError::Config(format!("rank {rank} out of range for tp = {tp}")));
        }
        let gdn = HeadBlock::new(
            cfg.linear_num_value_heads,
            cfg.linear_num_key_heads,
            tp,
            rank,
            "linear_num_value_heads",
            "linear_num_key_heads",
        )?;
        let attn = HeadBlock::new(
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            tp,
            rank,
            "num_attention_heads",
            "num_key_value_heads",
        )?;
        let div = |what: &str, n: usize| -> Result<usize> {
            if n % tp == 0 {
                Ok(n / tp)
            } else {
                Err(EngineError::Config(format!("{what} = {n} is not divisible by tp = {tp}")))
            }
        };
        let i = div("intermediate_size", cfg.intermediate_size)?;
        let v = div("vocab_size", cfg.vocab_size)?;
        Ok(Self {
            tp,
            rank,
            gdn,
            attn,
            inter: rank * i..(rank + 1) * i,
            vocab: rank * v..(rank + 1) * v,
        })
    }

    /// Check that `cfg` can be split `tp` ways (every rank's plan exists).
    ///
    /// # Errors
    /// As [`ShardPlan::new`].
    pub fn check(cfg: &ModelConfig, tp: usize) -> Result<()> {
        (0..tp.max(1)).try_for_each(|r| Self::new(cfg, tp, r).map(|_| ()))
    }

    /// Whether some key or kv heads are replicated across ranks (state per rank then exceeds
    /// `1/tp` of TP=1 in the conv state / KV cache).
    #[must_use]
    pub fn replicated(&self) -> bool {
        self.gdn.replicated || self.attn.replicated
    }

    /// The rank-local model config: head counts, intermediate size as this rank holds them.
    /// `vocab_size` stays global (ids and the embedding are global; the LM head's local rows are
    /// [`ShardPlan::vocab`]).
    #[must_use]
    pub fn local_config(&self, cfg: &ModelConfig) -> ModelConfig {
        let mut c = cfg.clone();
        c.linear_num_value_heads = self.gdn.n_big();
        c.linear_num_key_heads = self.gdn.n_small();
        c.num_attention_heads = self.attn.n_big();
        c.num_key_value_heads = self.attn.n_small();
        c.intermediate_size = self.inter.len();
        c
    }

    /// The part of checkpoint tensor `name` (full name, any prefix) this rank keeps.
    ///
    /// # Errors
    /// [`EngineError::Weights`] for a tensor name the plan does not know.
    pub fn part(&self, cfg: &ModelConfig, name: &str) -> Result<Part> {
        let (kd, vd, hd) = (cfg.linear_key_head_dim, cfg.linear_value_head_dim, cfg.head_dim);
        let (g, a) = (&self.gdn, &self.attn);
        let stitch = || {
            let kq = scale(&g.small, kd);
            let kk = shift(&kq, cfg.linear_num_key_heads * kd);
            let v = shift(&scale(&g.big, vd), 2 * cfg.linear_num_key_heads * kd);
            Part::Rows(vec![kq, kk, v])
        };
        let suffixes: [(&str, Part); 21] = [
            ("linear_attn.in_proj_qkv.weight", stitch()),
            ("linear_attn.conv1d.weight", stitch()),
            ("linear_attn.in_proj_z.weight", Part::Rows(vec![scale(&g.big, vd)])),
            ("linear_attn.in_proj_b.weight", Part::Rows(vec![g.big.clone()])),
            ("linear_attn.in_proj_a.weight", Part::Rows(vec![g.big.clone()])),
            ("linear_attn.A_log", Part::Rows(vec![g.big.clone()])),
            ("linear_attn.dt_bias", Part::Rows(vec![g.big.clone()])),
            ("linear_attn.norm.weight", Part::Full),
            ("linear_attn.out_proj.weight", Part::Cols(scale(&g.big, vd))),
            ("self_attn.q_proj.weight", Part::Rows(vec![scale(&a.big, 2 * hd)])),
            ("self_attn.k_proj.weight", Part::Rows(vec![scale(&a.small, hd)])),
            ("self_attn.v_proj.weight", Part::Rows(vec![scale(&a.small, hd)])),
            ("self_attn.o_proj.weight", Part::Cols(scale(&a.big, hd))),
            ("self_attn.q_norm.weight", Part::Full),
            ("self_attn.k_norm.weight", Part::Full),
            ("mlp.gate_proj.weight", Part::Rows(vec![self.inter.clone()])),
            ("mlp.up_proj.weight", Part::Rows(vec![self.inter.clone()])),
            ("mlp.down_proj.weight", Part::Cols(self.inter.clone())),
            ("layernorm.weight", Part::Full), // input_ / post_attention_layernorm
            ("embed_tokens.weight", Part::Full),
            ("lm_head.weight", Part::Rows(vec![self.vocab.clone()])),
        ];
        if let Some((_, p)) = suffixes.into_iter().find(|(s, _)| name.ends_with(s)) {
            return Ok(p);
        }
        if name.ends_with("norm.weight") {
            return Ok(Part::Full); // the final norm
        }
        Err(EngineError::Weights(format!("no sharding rule for tensor `{name}`")))
    }

    /// The LM head's part of the (tied) embedding table: this rank's vocabulary rows.
    #[must_use]
    pub fn lm_head_part(&self) -> Part {
        Part::Rows(vec![self.vocab.clone()])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::expected_tensors;
    use proptest::prelude::*;

    fn cfg(hk: usize, hv: usize, hq: usize, hkv: usize, inter: usize, vocab: usize) -> ModelConfig {
        let text = format!(
            r#"{{"architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text",
            "vocab_size": {vocab}, "hidden_size": 64, "intermediate_size": {inter},
            "num_hidden_layers": 4, "num_attention_heads": {hq}, "num_key_value_heads": {hkv},
            "head_dim": 16, "linear_num_key_heads": {hk}, "linear_num_value_heads": {hv},
            "linear_key_head_dim": 8, "linear_value_head_dim": 4, "linear_conv_kernel_dim": 4,
            "rms_norm_eps": 1e-6, "max_position_embeddings": 64, "eos_token_id": 0,
            "rope_parameters": {{"rope_theta": 10000.0, "partial_rotary_factor": 0.25}},
            "tie_word_embeddings": false, "full_attention_interval": 4}}"#
        );
        ModelConfig::parse(&text).unwrap()
    }

    #[test]
    fn tp_head_blocks_split_and_replicate() {
        // 27B: 16 key / 48 value heads at tp 8: 2 key and 6 value heads per rank.
        let b = HeadBlock::new(48, 16, 8, 3, "v", "k").unwrap();
        assert_eq!((b.big, b.small, b.replicated), (18..24, 6..8, false));
        // 24 q / 4 kv at tp 8: 3 q heads per rank, kv head replicated on 2 ranks.
        let b = HeadBlock::new(24, 4, 8, 5, "q", "kv").unwrap();
        assert_eq!((b.big, b.small, b.replicated), (15..18, 2..3, true));
        let e = HeadBlock::new(6, 2, 4, 0, "v", "k").unwrap_err().to_string();
        assert!(e.contains("v = 6") && e.contains("tp = 4"), "{e}");
        let e = HeadBlock::new(12, 6, 4, 0, "v", "k").unwrap_err().to_string();
        assert!(e.contains("k = 6") && e.contains("tp = 4"), "{e}");
    }

    #[test]
    fn tp_indivisible_counts_name_the_field() {
        let c = cfg(2, 4, 4, 2, 128, 384);
        for (tp, field) in [(3, "linear_num_value_heads = 4"), (8, "linear_num_value_heads = 4")] {
            let e = ShardPlan::check(&c, tp).unwrap_err().to_string();
            assert!(e.contains(field) && e.contains(&format!("tp = {tp}")), "{e}");
        }
        let e = ShardPlan::check(&cfg(4, 8, 8, 4, 100, 384), 8).unwrap_err().to_string();
        assert!(e.contains("intermediate_size = 100"), "{e}");
        let e = ShardPlan::check(&cfg(4, 8, 8, 4, 128, 390), 4).unwrap_err().to_string();
        assert!(e.contains("vocab_size = 390"), "{e}");
        let e = ShardPlan::check(&cfg(4, 8, 6, 2, 128, 384), 4).unwrap_err().to_string();
        assert!(e.contains("num_attention_heads = 6"), "{e}");
        assert!(ShardPlan::new(&c, 0, 0).is_err() && ShardPlan::new(&c, 2, 2).is_err());
    }

    /// The q/k/v stitch of `in_proj_qkv`: rank 1 of 2 with 4 key (8-dim) and 8 value (4-dim)
    /// heads takes q rows 16..32, k rows 48..64, v rows 64+16..64+32.
    #[test]
    fn tp_qkv_stitch_by_hand() {
        let c = cfg(4, 8, 4, 2, 128, 384);
        let p = ShardPlan::new(&c, 2, 1).unwrap();
        assert_eq!(
            p.part(&c, "model.layers.0.linear_attn.in_proj_qkv.weight").unwrap(),
            Part::Rows(vec![16..32, 48..64, 80..96])
        );
        assert_eq!(
            p.part(&c, "model.layers.3.self_attn.q_proj.weight").unwrap(),
            Part::Rows(vec![64..128])
        );
        assert_eq!(
            p.part(&c, "model.layers.0.linear_attn.out_proj.weight").unwrap(),
            Part::Cols(16..32)
        );
        assert_eq!(p.part(&c, "lm_head.weight").unwrap(), Part::Rows(vec![192..384]));
        assert_eq!(p.part(&c, "model.norm.weight").unwrap(), Part::Full);
        assert!(p.part(&c, "model.layers.0.mystery").is_err());
    }

    #[test]
    fn tp_slicing_rows_and_cols() {
        let full = [4, 3];
        let data: Vec<u32> = (0..12).collect();
        let rows = Part::Rows(vec![2..3, 0..1]);
        assert_eq!(rows.slice("t", &full, &data).unwrap(), vec![6, 7, 8, 0, 1, 2]);
        assert_eq!(rows.local_shape("t", &full).unwrap(), vec![2, 3]);
        let cols = Part::Cols(1..3);
        assert_eq!(cols.slice("t", &full, &data).unwrap(), vec![1, 2, 4, 5, 7, 8, 10, 11]);
        assert_eq!(cols.runs(&full), vec![1..3, 4..6, 7..9, 10..12]);
        assert!(Part::Rows(vec![3..5]).local_shape("t", &full).is_err());
        assert!(Part::Cols(0..1).local_shape("t", &[5]).is_err());
    }

    proptest! {
        /// For any divisible config and tp: every tensor's parts over the ranks are disjoint
        /// and cover it exactly once (split tensors), or are the full tensor (replicated ones);
        /// a rank's value heads read only key heads it holds; local shapes match the local
        /// config's expected tensors.
        #[test]
        fn tp_parts_cover_and_match_local_shapes(
            hk_pow in 0u32..3, ratio in 1usize..4, q_pow in 0u32..3, group in 1usize..4,
            tp_pow in 0u32..4,
        ) {
            let (hk, hkv, tp) = (1usize << hk_pow, 1usize << q_pow, 1usize << tp_pow);
            let (hv, hq) = (hk * ratio * tp, hkv * group * tp);
            let c = cfg(hk, hv, hq, hkv, 16 * tp, 64 * tp);
            let plans: Vec<ShardPlan> = (0..tp).map(|r| ShardPlan::new(&c, tp, r).unwrap()).collect();
            for p in &plans {
                // Grouping: value head h reads key head h / (hv / hk), inside the rank's block.
                for h in p.gdn.big.clone() {
                    prop_assert!(p.gdn.small.contains(&(h / (hv / hk))));
                }
                for h in p.attn.big.clone() {
                    prop_assert!(p.attn.small.contains(&(h / (hq / hkv))));
                }
                let local = expected_tensors(&p.local_config(&c));
                let global = expected_tensors(&c);
                for ((name, full, _), (lname, lshape, _)) in global.iter().zip(&local) {
                    prop_assert_eq!(name, lname);
                    let part = p.part(&c, name).unwrap();
                    let mut got = part.local_shape(name, full).unwrap();
                    if name.ends_with("lm_head.weight") {
                        got[0] *= tp; // the local config keeps the global vocab
                    }
                    prop_assert_eq!(&got, lshape, "{}", name);
                }
            }
            for (name, full, _) in expected_tensors(&c) {
                let n: usize = full.iter().product();
                let mut hits = vec![0usize; n];
                for p in &plans {
                    for r in p.part(&c, &name).unwrap().runs(&full) {
                        r.for_each(|i| hits[i] += 1);
                    }
                }
                let replicated_heads = (name.contains("in_proj_qkv") || name.contains("conv1d"))
                    && plans[0].gdn.replicated
                    || (name.contains("k_proj") || name.contains("v_proj")) && plans[0].attn.replicated;
                match plans[0].part(&c, &name).unwrap() {
                    Part::Full => prop_assert!(hits.iter().all(|&h| h == tp), "{}", name),
                    _ if replicated_heads => prop_assert!(hits.iter().all(|&h| h >= 1), "{}", name),
                    _ => prop_assert!(hits.iter().all(|&h| h == 1), "{}", name),
                }
            }
        }
    }
}
