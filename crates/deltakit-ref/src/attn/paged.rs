//! `attn.write_kv`: the paged KV cache and its page table.

use crate::{check, Elem, RefError, Result};

/// Geometry of the paged KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvDims {
    /// Tokens per page.
    pub page_size: usize,
    /// KV heads `H_kv`.
    pub n_kv_heads: usize,
    /// Head dim `hd`.
    pub head_dim: usize,
}

impl KvDims {
    /// Validate and return the number of pages a cache slice of `len` elements holds.
    pub(crate) fn num_pages(
        &self,
        op: &'static str,
        what: &'static str,
        len: usize,
    ) -> Result<usize> {
        check::nonzero(op, "page_size", self.page_size)?;
        let per = check::prod(op, what, &[self.page_size, self.n_kv_heads, self.head_dim])?;
        check::rows(op, what, len, per)
    }
    /// Element offset of `(page, row)` (head 0).
    pub(crate) fn offset(&self, page: usize, row: usize) -> usize {
        (page * self.page_size + row) * self.n_kv_heads * self.head_dim
    }
}

/// Page table of a batch: `table` is `i32 [N, max_pages]` (row `i` lists sequence `i`'s pages in
/// order; entries past the pages a sequence uses are ignored and may be -1).
#[derive(Clone, Copy, Debug)]
pub struct PageTable<'a> {
    /// `i32 [N, max_pages]`, row-major.
    pub table: &'a [i32],
    /// Row length.
    pub max_pages: usize,
}

impl PageTable<'_> {
    /// Validate the table shape for `n` sequences.
    pub(crate) fn validate(&self, op: &'static str, n: usize) -> Result<()> {
        check::nonzero(op, "page_table.max_pages", self.max_pages)?;
        let need = check::prod(op, "page_table.max_pages", &[n, self.max_pages])?;
        check::len(op, "page_table.table", self.table.len(), need)
    }
    /// Check that sequence `i` has valid pages for positions `0..tokens`.
    pub(crate) fn check_seq(
        &self,
        op: &'static str,
        i: usize,
        tokens: usize,
        page_size: usize,
        num_pages: usize,
    ) -> Result<()> {
        let need = tokens.div_ceil(page_size);
        if need > self.max_pages {
            return Err(RefError::Invalid {
                op,
                what: "page_table",
                msg: format!(
                    "sequence {i} needs {need} pages for {tokens} tokens but max_pages = {}",
                    self.max_pages
                ),
            });
        }
        for (j, &p) in self.table[i * self.max_pages..i * self.max_pages + need].iter().enumerate()
        {
            if usize::try_from(p).map_or(true, |u| u >= num_pages) {
                return Err(RefError::Invalid {
                    op,
                    what: "page_table",
                    msg: format!("[{i}][{j}] = {p} is not a page in 0..{num_pages}"),
                });
            }
        }
        Ok(())
    }
    /// Cache (page, row) of position `pos` of sequence `i` (after [`Self::check_seq`]).
    pub(crate) fn locate(&self, i: usize, pos: usize, page_size: usize) -> (usize, usize) {
        (self.table[i * self.max_pages + pos / page_size] as usize, pos % page_size)
    }
}

/// Validate `ctx_lens` (`[N]`, each -1 = padding or >= 0).
pub(crate) fn check_ctx_lens(
    op: &'static str,
    what: &'static str,
    c: &[i32],
    n: usize,
) -> Result<()> {
    check::len(op, what, c.len(), n)?;
    if let Some((i, &v)) = c.iter().enumerate().find(|(_, &v)| v < -1) {
        return Err(RefError::Invalid {
            op,
            what,
            msg: format!("[{i}] = {v}; expected -1 or >= 0"),
        });
    }
    Ok(())
}

/// Write new keys and values into the paged cache (vLLM `reshape_and_cache`-style; HF keeps a
/// contiguous cache and `torch.cat`s, which is the same content): token `j` of sequence `i` goes
/// to absolute position `ctx_lens[i] + j`. Sequences with `ctx_lens[i] == -1` are padding and
/// write nothing. Exact copies.
///
/// Shapes: `k`, `v`: `[T_new, H_kv, hd]`; `cu_seqlens`: `i32 [N+1]` over `T_new`; `ctx_lens`:
/// `i32 [N]`; `pages.table`: `i32 [N, max_pages]`; `k_cache`, `v_cache`:
/// `[num_pages, page_size, H_kv, hd]`.
///
/// # Errors
/// [`RefError::Shape`] for length mismatches; [`RefError::Invalid`] for bad `cu_seqlens`,
/// `ctx_lens`, a page id out of range, a sequence needing more than `max_pages` pages, or two
/// tokens of the batch mapping to the same cache row.
#[allow(clippy::too_many_arguments)]
pub fn write_kv<T: Elem>(
    k: &[T],
    v: &[T],
    cu_seqlens: &[i32],
    ctx_lens: &[i32],
    pages: PageTable<'_>,
    dims: KvDims,
    k_cache: &mut [T],
    v_cache: &mut [T],
) -> Result<()> {
    const OP: &str = "attn.write_kv";
    let num_pages = dims.num_pages(OP, "k_cache", k_cache.len())?;
    check::len(OP, "v_cache", v_cache.len(), k_cache.len())?;
    let row = check::prod(OP, "k", &[dims.n_kv_heads, dims.head_dim])?;
    let t = check::rows(OP, "k", k.len(), row)?;
    check::len(OP, "v", v.len(), k.len())?;
    let seqs = check::cu_seqlens(OP, "cu_seqlens", cu_seqlens, t)?;
    check_ctx_lens(OP, "ctx_lens", ctx_lens, seqs.len())?;
    pages.validate(OP, seqs.len())?;
    let mut used = vec![false; num_pages * dims.page_size];
    for (i, &(_, len)) in seqs.iter().enumerate() {
        let Ok(ctx) = usize::try_from(ctx_lens[i]) else { continue };
        pages.check_seq(OP, i, ctx + len, dims.page_size, num_pages)?;
        for pos in ctx..ctx + len {
            let (p, r) = pages.locate(i, pos, dims.page_size);
            let cell = &mut used[p * dims.page_size + r];
            if *cell {
                return Err(RefError::Invalid {
                    op: OP,
                    what: "page_table",
                    msg: format!(
                        "cache page {p} row {r} written twice (sequence {i}, position {pos})"
                    ),
                });
            }
            *cell = true;
        }
    }
    for (i, &(start, len)) in seqs.iter().enumerate() {
        let Ok(ctx) = usize::try_from(ctx_lens[i]) else { continue };
        for j in 0..len {
            let (p, r) = pages.locate(i, ctx + j, dims.page_size);
            let dst = dims.offset(p, r);
            let src = (start + j) * row;
            k_cache[dst..dst + row].copy_from_slice(&k[src..src + row]);
            v_cache[dst..dst + row].copy_from_slice(&v[src..src + row]);
        }
    }
    Ok(())
}
