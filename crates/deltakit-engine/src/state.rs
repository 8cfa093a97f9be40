//! Per-sequence state bookkeeping: GDN state slots and paged KV-cache pages.
//!
//! A running sequence owns one slot index (the same index in every GDN layer's recurrent and conv
//! pools) and a list of KV pages (the same page ids in every attention layer's cache). Both come
//! from free lists sized at start-up and go back when the sequence ends. The memory itself is
//! owned by the backend ([`crate::backend::Backend::GdnState`] / `KvCache`); this module only
//! hands out indices, so it is the same for every backend.

use crate::config::ModelConfig;
use crate::error::{EngineError, Result};

/// Capacity of the state pools.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheConfig {
    /// Sequences that can run at once (GDN state slots).
    pub max_seqs: usize,
    /// KV-cache pages shared by all sequences.
    pub num_pages: usize,
    /// Tokens per page.
    pub page_size: usize,
    /// Longest sequence (prompt + generated) accepted.
    pub max_context: usize,
}

impl CacheConfig {
    /// Pools for `max_seqs` sequences of up to `max_context` tokens each (every sequence can
    /// reach the limit at once). A `page_size` of 0 gives 0 pages (no panic); [`StatePool::new`]
    /// (and the backends' cache allocation) then reject the configuration with a typed error.
    #[must_use]
    pub fn for_sequences(max_seqs: usize, max_context: usize, page_size: usize) -> Self {
        Self {
            max_seqs,
            num_pages: if page_size == 0 {
                0
            } else {
                max_seqs.saturating_mul(max_context.div_ceil(page_size))
            },
            page_size,
            max_context,
        }
    }

    /// Bytes the state pools of model `cfg` take (an estimate for memory checks before they are
    /// allocated): the KV pages of every full-attention layer (K and V, `[num_pages, page_size,
    /// H_kv, head_dim]`, `elem` bytes each) plus, per slot and GDN layer, the f32 recurrent state
    /// `[H_v, K, V]` and the conv state `[conv_dim, conv_kernel]` (`elem` bytes). Saturates at
    /// `u64::MAX` instead of overflowing.
    #[must_use]
    pub fn memory_bytes(&self, cfg: &ModelConfig, elem: usize) -> u64 {
        let mul = |xs: &[usize]| xs.iter().fold(1u64, |acc, &x| acc.saturating_mul(x as u64));
        let kv = mul(&[
            cfg.num_attention_layers(),
            self.num_pages,
            self.page_size,
            2 * cfg.num_key_value_heads * cfg.head_dim,
            elem,
        ]);
        let per_slot = mul(&[
            cfg.linear_num_value_heads,
            cfg.linear_key_head_dim,
            cfg.linear_value_head_dim,
            4,
        ])
        .saturating_add(mul(&[cfg.conv_dim(), cfg.conv_kernel, elem]));
        kv.saturating_add(mul(&[cfg.num_linear_layers(), self.max_seqs]).saturating_mul(per_slot))
    }

    /// Pages needed for `tokens` tokens (`usize::MAX`, never available, for a `page_size` of 0,
    /// instead of a division by zero).
    #[must_use]
    pub fn pages_for(&self, tokens: usize) -> usize {
        if self.page_size == 0 {
            return usize::MAX;
        }
        tokens.div_ceil(self.page_size)
    }
}

/// A running sequence's resources.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeqState {
    /// GDN state slot.
    pub slot: usize,
    /// KV pages in position order.
    pub pages: Vec<i32>,
    /// Tokens already processed (in the caches / state).
    pub len: usize,
}

/// Free lists of slots and pages.
#[derive(Clone, Debug)]
pub struct StatePool {
    cfg: CacheConfig,
    free_slots: Vec<usize>,
    free_pages: Vec<i32>,
}

impl StatePool {
    /// A pool with every slot and page free.
    ///
    /// # Errors
    /// [`EngineError::Capacity`] if a size (`max_seqs`, `num_pages`, `page_size`,
    /// `max_context`) is zero or the page count or `max_context` does not fit an `i32` (the
    /// kernels' page ids, context lengths and `cu_seqlens` are i32).
    pub fn new(cfg: CacheConfig) -> Result<Self> {
        // num_pages = 0 (session 11): refused here, not at the first reserve ("KV cache exhausted")
        // or the first attention call.
        if cfg.max_seqs == 0 || cfg.num_pages == 0 || cfg.page_size == 0 || cfg.max_context == 0 {
            return Err(EngineError::Capacity(format!(
                "cache sizes (max_seqs, num_pages, page_size, max_context) must be > 0: {cfg:?}"
            )));
        }
        let np = i32::try_from(cfg.num_pages)
            .map_err(|_| EngineError::Capacity(format!("{} pages overflow i32", cfg.num_pages)))?;
        if i32::try_from(cfg.max_context).is_err() {
            return Err(EngineError::Capacity(format!(
                "max_context {} overflows i32 (context lengths are i32 in the kernels)",
                cfg.max_context
            )));
        }
        // Pop from the back: hand out low indices first.
        Ok(Self {
            cfg,
            free_slots: (0..cfg.max_seqs).rev().collect(),
            free_pages: (0..np).rev().collect(),
        })
    }

    /// The pool's configuration.
    #[must_use]
    pub fn config(&self) -> CacheConfig {
        self.cfg
    }

    /// Free slots.
    #[must_use]
    pub fn free_slots(&self) -> usize {
        self.free_slots.len()
    }

    /// Free pages.
    #[must_use]
    pub fn free_pages(&self) -> usize {
        self.free_pages.len()
    }

    /// Start a sequence: take a slot (no pages yet).
    ///
    /// # Errors
    /// [`EngineError::Capacity`] if every slot is in use.
    pub fn start(&mut self) -> Result<SeqState> {
        let slot = self.free_slots.pop().ok_or_else(|| {
            EngineError::Capacity(format!(
                "all {} sequence slots are in use (raise the batch capacity)",
                self.cfg.max_seqs
            ))
        })?;
        Ok(SeqState { slot, pages: Vec::new(), len: 0 })
    }

    /// Make sure `seq` has pages for `tokens` tokens in total; all-or-nothing.
    ///
    /// # Errors
    /// [`EngineError::Request`] past `max_context`; [`EngineError::Capacity`] if the pool has too
    /// few free pages (nothing is taken then).
    pub fn reserve(&mut self, seq: &mut SeqState, tokens: usize) -> Result<()> {
        if tokens > self.cfg.max_context {
            return Err(EngineError::Request(format!(
                "sequence of {tokens} tokens exceeds the maximum context of {} tokens",
                self.cfg.max_context
            )));
        }
        let need = self.cfg.pages_for(tokens).saturating_sub(seq.pages.len());
        if need > self.free_pages.len() {
            return Err(EngineError::Capacity(format!(
                "KV cache exhausted: need {need} more pages, {} free of {}",
                self.free_pages.len(),
                self.cfg.num_pages
            )));
        }
        let at = self.free_pages.len() - need;
        seq.pages.extend(self.free_pages.drain(at..).rev());
        Ok(())
    }

    /// End a sequence: return its slot and pages.
    pub fn free(&mut self, seq: SeqState) {
        self.free_pages.extend(seq.pages.into_iter().rev());
        self.free_slots.push(seq.slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_page_size_is_an_error_not_a_panic() {
        let c = CacheConfig::for_sequences(1, 16, 0);
        assert_eq!(c.num_pages, 0);
        assert!(StatePool::new(c).is_err());
        assert_eq!(c.pages_for(5), usize::MAX); // no division by zero
    }

    /// Session 11: zero pages (with every other size > 0) is refused at construction, naming
    /// the field, instead of at the first reserve.
    #[test]
    fn zero_pages_is_an_error_at_construction() {
        let c = CacheConfig { max_seqs: 2, num_pages: 0, page_size: 16, max_context: 64 };
        let e = StatePool::new(c).unwrap_err();
        assert!(matches!(&e, EngineError::Capacity(m) if m.contains("num_pages")), "{e}");
        for c in [
            CacheConfig { max_seqs: 0, ..c },
            CacheConfig { page_size: 0, num_pages: 4, ..c },
            CacheConfig { max_context: 0, num_pages: 4, ..c },
        ] {
            assert!(matches!(StatePool::new(c), Err(EngineError::Capacity(_))), "{c:?}");
        }
        assert!(StatePool::new(CacheConfig { num_pages: 1, ..c }).is_ok());
        // A context past i32 would be truncated into the kernels' i32 ctx_lens.
        let big = CacheConfig { num_pages: 1, max_context: 1 << 31, ..c };
        let e = StatePool::new(big).unwrap_err();
        assert!(matches!(&e, EngineError::Capacity(m) if m.contains("max_context")), "{e}");
    }

    #[test]
    fn slots_and_pages_round_trip() {
        let mut p = StatePool::new(CacheConfig::for_sequences(2, 40, 16)).unwrap();
        assert_eq!(p.free_pages(), 6);
        let mut a = p.start().unwrap();
        let mut b = p.start().unwrap();
        assert_ne!(a.slot, b.slot);
        assert!(p.start().is_err());
        p.reserve(&mut a, 17).unwrap();
        assert_eq!(a.pages.len(), 2);
        p.reserve(&mut a, 32).unwrap();
        assert_eq!(a.pages.len(), 2);
        p.reserve(&mut b, 40).unwrap();
        assert_eq!(p.free_pages(), 1);
        let e = p.reserve(&mut a, 41).unwrap_err().to_string();
        assert!(e.contains("maximum context"), "{e}");
        p.free(a);
        assert_eq!((p.free_pages(), p.free_slots()), (3, 1));
        p.free(b);
        assert_eq!((p.free_pages(), p.free_slots()), (6, 2));
    }

    #[test]
    fn exhaustion_is_all_or_nothing() {
        let cfg = CacheConfig { max_seqs: 2, num_pages: 3, page_size: 4, max_context: 100 };
        let mut p = StatePool::new(cfg).unwrap();
        let mut a = p.start().unwrap();
        assert!(p.reserve(&mut a, 13).is_err());
        assert!(a.pages.is_empty());
        assert_eq!(p.free_pages(), 3);
    }
}
