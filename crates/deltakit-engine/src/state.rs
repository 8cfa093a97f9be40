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

    /// Check the sizes: every one `> 0` and `<= i32::MAX` (the kernels' slot indices, page ids,
    /// page size and context lengths are i32). [`StatePool::new`], `Rank::new` and every
    /// builder of [`crate::launch`] (CPU `load_as` / `dummy`, the CUDA cache plan, the multi-rank
    /// builders) call it before any rank loads weights.
    ///
    /// # Errors
    /// [`EngineError::Capacity`] naming the first bad size, with its value and the bound.
    pub fn validate(&self) -> Result<()> {
        let sizes = [
            ("max_seqs", self.max_seqs, "slot indices are i32 in the kernels"),
            ("num_pages", self.num_pages, "page ids are i32 in the kernels"),
            ("page_size", self.page_size, "the page size is i32 in the kernels"),
            ("max_context", self.max_context, "context lengths are i32 in the kernels"),
        ];
        for (name, v, why) in sizes {
            if v == 0 {
                return Err(EngineError::Capacity(format!("cache size {name} must be > 0, got 0")));
            }
            if i32::try_from(v).is_err() {
                return Err(EngineError::Capacity(format!(
                    "cache size {name} must be <= {} ({why}), got {v}",
                    i32::MAX
                )));
            }
        }
        Ok(())
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

/// Free lists of slots and pages. Built lazily (O(1) at construction, whatever the sizes): an
/// index is handed out from the returned ones first (last returned first), then the untouched
/// ones in ascending order.
#[derive(Clone, Debug)]
pub struct StatePool {
    cfg: CacheConfig,
    free_slots: FreeList<usize>,
    free_pages: FreeList<i32>,
}

/// A stack of returned indices on top of the never-used range `fresh` (low indices first).
#[derive(Clone, Debug)]
struct FreeList<T> {
    returned: Vec<T>,
    fresh: std::ops::Range<T>,
}

impl<T: Copy + Default> FreeList<T>
where
    std::ops::Range<T>: ExactSizeIterator<Item = T>,
{
    fn new(n: T) -> Self {
        Self { returned: Vec::new(), fresh: T::default()..n }
    }

    /// Returns indices: the last one given is handed out first.
    fn give_back(&mut self, ids: impl IntoIterator<Item = T>) {
        self.returned.extend(ids);
    }

    fn len(&self) -> usize {
        self.returned.len() + self.fresh.len()
    }

    fn pop(&mut self) -> Option<T> {
        self.returned.pop().or_else(|| self.fresh.next())
    }
}

impl StatePool {
    /// A pool with every slot and page free (no per-index memory is allocated up front).
    ///
    /// # Errors
    /// [`EngineError::Capacity`] as [`CacheConfig::validate`]: a size (`max_seqs`, `num_pages`,
    /// `page_size`, `max_context`) is zero or does not fit an `i32` (the kernels' slot indices,
    /// page ids, page size, context lengths and `cu_seqlens` are i32).
    pub fn new(cfg: CacheConfig) -> Result<Self> {
        // num_pages = 0 (session 11): refused here, not at the first reserve ("KV cache
        // exhausted") or the first attention call; max_seqs past i32 (session 11): the free list
        // panicked with "capacity overflow" at usize::MAX and slots reach the kernels as i32.
        cfg.validate()?;
        let np = i32::try_from(cfg.num_pages)
            .map_err(|_| EngineError::Capacity(format!("{} pages overflow i32", cfg.num_pages)))?;
        Ok(Self { cfg, free_slots: FreeList::new(cfg.max_seqs), free_pages: FreeList::new(np) })
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
        seq.pages.extend((0..need).filter_map(|_| self.free_pages.pop()));
        Ok(())
    }

    /// End a sequence: return its slot and pages.
    pub fn free(&mut self, seq: SeqState) {
        self.free_pages.give_back(seq.pages.into_iter().rev());
        self.free_slots.give_back([seq.slot]);
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

    /// Session 11 (robust2): max_seqs past i32 (slots reach the kernels as i32) is a Capacity
    /// error naming it (usize::MAX panicked with "capacity overflow"); i32::MAX itself builds
    /// at once (the free lists are lazy).
    #[test]
    fn huge_max_seqs_is_an_error_naming_it() {
        let c = CacheConfig { max_seqs: usize::MAX, num_pages: 1, page_size: 16, max_context: 16 };
        for max_seqs in [usize::MAX, 1 << 31] {
            let e = StatePool::new(CacheConfig { max_seqs, ..c }).unwrap_err();
            assert!(
                matches!(&e, EngineError::Capacity(m) if m.contains("max_seqs")
                    && m.contains(&max_seqs.to_string()) && m.contains("2147483647")),
                "{e}"
            );
            assert_eq!(
                CacheConfig { max_seqs, ..c }.validate().unwrap_err().to_string(),
                e.to_string()
            );
        }
        for (name, c) in [
            ("num_pages", CacheConfig { max_seqs: 1, num_pages: 1 << 31, ..c }),
            ("page_size", CacheConfig { max_seqs: 1, page_size: usize::MAX, ..c }),
            ("num_pages", CacheConfig { max_seqs: 1, num_pages: 0, ..c }),
            ("page_size", CacheConfig { max_seqs: 1, page_size: 0, ..c }),
            ("max_context", CacheConfig { max_seqs: 1, max_context: 0, ..c }),
            ("max_seqs", CacheConfig { max_seqs: 0, ..c }),
        ] {
            let e = StatePool::new(c).unwrap_err();
            assert!(matches!(&e, EngineError::Capacity(m) if m.contains(name)), "{name}: {e}");
        }
        let max = i32::MAX as usize;
        let mut p = StatePool::new(CacheConfig { max_seqs: max, num_pages: max, ..c }).unwrap();
        assert_eq!((p.free_slots(), p.free_pages()), (max, max));
        let mut a = p.start().unwrap();
        p.reserve(&mut a, 16).unwrap();
        assert_eq!((a.slot, a.pages.as_slice()), (0, &[0][..]));
        assert_eq!((p.free_slots(), p.free_pages()), (max - 1, max - 1));
    }

    /// The lazy free lists hand out indices as the eager stacks did: low ones first, the last
    /// returned first, a sequence's pages in its order.
    #[test]
    fn free_list_order() {
        let mut p = StatePool::new(CacheConfig::for_sequences(3, 16, 4)).unwrap();
        let (mut a, mut b) = (p.start().unwrap(), p.start().unwrap());
        p.reserve(&mut a, 8).unwrap();
        p.reserve(&mut b, 4).unwrap();
        assert_eq!((a.slot, a.pages.clone(), b.slot, b.pages.clone()), (0, vec![0, 1], 1, vec![2]));
        p.free(a);
        let mut c = p.start().unwrap();
        p.reserve(&mut c, 16).unwrap();
        assert_eq!((c.slot, c.pages), (0, vec![0, 1, 3, 4]));
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
