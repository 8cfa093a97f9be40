//! `attn.prefill`: causal GQA attention over a varlen batch with prior context.

use super::paged::{check_ctx_lens as check_ctx, KvDims, PageTable};
use super::{attend, AttnDims};
use crate::{check, Elem, RefError, Result};

/// Causal GQA prefill attention over the paged cache (HF `Qwen3_5Attention` core with a cache,
/// i.e. `sdpa`/`flash_attention_2` with `is_causal` and prior context; vLLM
/// `flash_attn_varlen_func` with a block table).
///
/// Sequence `i` has `ctx_lens[i]` tokens already in the cache and `new_i = cu_seqlens[i+1] -
/// cu_seqlens[i]` new ones, whose keys/values must already be written at positions
/// `ctx..ctx+new_i` (see [`super::write_kv`]). New token `j` (absolute position `ctx + j`) attends
/// to cache positions `0..=ctx+j`. Query head `h` uses kv head `h / (H_q / H_kv)`. Scores and
/// softmax in f32 (`scale` default `hd^-0.5`), output rounded to `T` once. `ctx_lens[i] == -1`:
/// padding sequence, zero output.
///
/// Shapes: `q`, `out`: `[T_new, H_q, hd]`; caches: `[num_pages, page_size, H_kv, hd]`;
/// `cu_seqlens`: `i32 [N+1]`; `ctx_lens`: `i32 [N]`; `pages.table`: `i32 [N, max_pages]`.
///
/// # Errors
/// [`RefError::Shape`] for length / head mismatches; [`RefError::Invalid`] for bad
/// `cu_seqlens`, `ctx_lens`, page ids, or a non-finite `scale`.
#[allow(clippy::too_many_arguments)]
pub fn prefill_paged<T: Elem>(
    q: &[T],
    k_cache: &[T],
    v_cache: &[T],
    cu_seqlens: &[i32],
    ctx_lens: &[i32],
    pages: PageTable<'_>,
    page_size: usize,
    dims: AttnDims,
    scale: Option<f32>,
    out: &mut [T],
) -> Result<()> {
    const OP: &str = "attn.prefill";
    dims.validate(OP)?;
    let kv = KvDims { page_size, n_kv_heads: dims.n_kv_heads, head_dim: dims.head_dim };
    let num_pages = kv.num_pages(OP, "k_cache", k_cache.len())?;
    check::len(OP, "v_cache", v_cache.len(), k_cache.len())?;
    let hd = dims.head_dim;
    let t = check::rows(OP, "q", q.len(), check::prod(OP, "q", &[dims.n_q_heads, hd])?)?;
    check::len(OP, "out", out.len(), q.len())?;
    let seqs = check::cu_seqlens(OP, "cu_seqlens", cu_seqlens, t)?;
    check_ctx(OP, "ctx_lens", ctx_lens, seqs.len())?;
    pages.validate(OP, seqs.len())?;
    for (i, &(_, len)) in seqs.iter().enumerate() {
        if let Ok(ctx) = usize::try_from(ctx_lens[i]) {
            pages.check_seq(OP, i, ctx + len, page_size, num_pages)?;
        }
    }
    let scale = super::softmax_scale(OP, scale, hd)?;
    let group = dims.n_q_heads / dims.n_kv_heads;
    // Scratch rows of `hd`, allocated only when a query row (of at least `hd` elements in
    // memory) exists: an absurd head dim with no tokens must not abort on the allocation.
    let sd = hd.min(q.len());
    let (mut scores, mut acc, mut qf) = (Vec::new(), vec![0f64; sd], vec![0f32; sd]);
    for (i, &(start, len)) in seqs.iter().enumerate() {
        let Ok(ctx) = usize::try_from(ctx_lens[i]) else {
            out[start * dims.n_q_heads * hd..(start + len) * dims.n_q_heads * hd]
                .fill(T::from_f32(0.0));
            continue;
        };
        for j in 0..len {
            for h in 0..dims.n_q_heads {
                let kvh = h / group;
                let qo = ((start + j) * dims.n_q_heads + h) * hd;
                for (d, s) in qf.iter_mut().zip(&q[qo..qo + hd]) {
                    *d = s.to_f32();
                }
                let at = |p: usize| -> usize {
                    let (pg, r) = pages.locate(i, p, page_size);
                    kv.offset(pg, r) + kvh * hd
                };
                attend(
                    &qf,
                    ctx + j + 1,
                    |p| {
                        let o = at(p);
                        &k_cache[o..o + hd]
                    },
                    |p| {
                        let o = at(p);
                        &v_cache[o..o + hd]
                    },
                    scale,
                    &mut scores,
                    &mut acc,
                );
                for (d, &a) in out[qo..qo + hd].iter_mut().zip(&acc) {
                    *d = T::from_f32(a as f32);
                }
            }
        }
    }
    Ok(())
}

/// Causal GQA attention with contiguous varlen keys/values (flash-attn
/// `flash_attn_varlen_func(causal=True)`, bottom-right aligned): sequence `i` has `len_q` queries
/// and `len_k >= len_q` keys; query `j` attends keys `0..=len_k - len_q + j`. Same numerics as
/// [`prefill_paged`]; the paged kernel's oracle-of-the-oracle.
///
/// Shapes: `q`, `out`: `[T_q, H_q, hd]`; `k`, `v`: `[T_k, H_kv, hd]`; `cu_seqlens_q` over `T_q`
/// and `cu_seqlens_k` over `T_k`, both `i32 [N+1]`.
///
/// # Errors
/// [`RefError::Shape`] for length mismatches; [`RefError::Invalid`] for bad `cu_seqlens` or a
/// sequence with fewer keys than queries, or a non-finite `scale`.
#[allow(clippy::too_many_arguments)]
pub fn prefill_contiguous<T: Elem>(
    q: &[T],
    k: &[T],
    v: &[T],
    cu_seqlens_q: &[i32],
    cu_seqlens_k: &[i32],
    dims: AttnDims,
    scale: Option<f32>,
    out: &mut [T],
) -> Result<()> {
    const OP: &str = "attn.prefill_contiguous";
    dims.validate(OP)?;
    let hd = dims.head_dim;
    let tq = check::rows(OP, "q", q.len(), check::prod(OP, "q", &[dims.n_q_heads, hd])?)?;
    let tk = check::rows(OP, "k", k.len(), check::prod(OP, "k", &[dims.n_kv_heads, hd])?)?;
    check::len(OP, "v", v.len(), k.len())?;
    check::len(OP, "out", out.len(), q.len())?;
    let sq = check::cu_seqlens(OP, "cu_seqlens_q", cu_seqlens_q, tq)?;
    let sk = check::cu_seqlens(OP, "cu_seqlens_k", cu_seqlens_k, tk)?;
    check::len(OP, "cu_seqlens_k", cu_seqlens_k.len(), cu_seqlens_q.len())?;
    if let Some(i) = (0..sq.len()).find(|&i| sk[i].1 < sq[i].1) {
        return Err(RefError::Invalid {
            op: OP,
            what: "cu_seqlens_k",
            msg: format!("sequence {i} has {} keys < {} queries", sk[i].1, sq[i].1),
        });
    }
    let scale = super::softmax_scale(OP, scale, hd)?;
    let group = dims.n_q_heads / dims.n_kv_heads;
    // Scratch rows of `hd`, allocated only when a query row (of at least `hd` elements in
    // memory) exists: an absurd head dim with no tokens must not abort on the allocation.
    let sd = hd.min(q.len());
    let (mut scores, mut acc, mut qf) = (Vec::new(), vec![0f64; sd], vec![0f32; sd]);
    let krow = dims.n_kv_heads * hd;
    for (&(qs, lq), &(ks, lk)) in sq.iter().zip(&sk) {
        for j in 0..lq {
            for h in 0..dims.n_q_heads {
                let kvh = h / group;
                let qo = ((qs + j) * dims.n_q_heads + h) * hd;
                for (d, s) in qf.iter_mut().zip(&q[qo..qo + hd]) {
                    *d = s.to_f32();
                }
                let off = |p: usize| (ks + p) * krow + kvh * hd;
                attend(
                    &qf,
                    lk - lq + j + 1,
                    |p| &k[off(p)..off(p) + hd],
                    |p| &v[off(p)..off(p) + hd],
                    scale,
                    &mut scores,
                    &mut acc,
                );
                for (d, &a) in out[qo..qo + hd].iter_mut().zip(&acc) {
                    *d = T::from_f32(a as f32);
                }
            }
        }
    }
    Ok(())
}
