//! `attn.decode`: single-query attention per row over the paged cache.

use super::paged::{KvDims, PageTable};
use super::{attend, AttnDims};
use crate::{check, Elem, RefError, Result};

/// Decode attention: row `i`'s single query (at absolute position `seq_lens[i] - 1`) attends to
/// cache positions `0..seq_lens[i]` of its sequence (the new token's k/v already written), as
/// vLLM's paged decode / HF `Qwen3_5Attention` with one new token. Same numerics as
/// [`super::prefill_paged`]; equal to the last row of a prefill over the same context.
/// `seq_lens[i] == -1`: padding row, zero output.
///
/// Shapes: `q`, `out`: `[N, H_q, hd]`; caches `[num_pages, page_size, H_kv, hd]`; `seq_lens`:
/// `i32 [N]`; `pages.table`: `i32 [N, max_pages]`.
///
/// # Errors
/// [`RefError::Shape`] for length / head mismatches; [`RefError::Invalid`] for a `seq_lens` entry
/// that is 0 or < -1, bad page ids, or a non-finite `scale`.
#[allow(clippy::too_many_arguments)]
pub fn decode_paged<T: Elem>(
    q: &[T],
    k_cache: &[T],
    v_cache: &[T],
    seq_lens: &[i32],
    pages: PageTable<'_>,
    page_size: usize,
    dims: AttnDims,
    scale: Option<f32>,
    out: &mut [T],
) -> Result<()> {
    const OP: &str = "attn.decode";
    dims.validate(OP)?;
    let kv = KvDims { page_size, n_kv_heads: dims.n_kv_heads, head_dim: dims.head_dim };
    let num_pages = kv.num_pages(OP, "k_cache", k_cache.len())?;
    check::len(OP, "v_cache", v_cache.len(), k_cache.len())?;
    let hd = dims.head_dim;
    let n = check::rows(OP, "q", q.len(), check::prod(OP, "q", &[dims.n_q_heads, hd])?)?;
    check::len(OP, "out", out.len(), q.len())?;
    check::len(OP, "seq_lens", seq_lens.len(), n)?;
    pages.validate(OP, n)?;
    for (i, &l) in seq_lens.iter().enumerate() {
        if l == -1 {
            continue;
        }
        if l <= 0 {
            return Err(RefError::Invalid {
                op: OP,
                what: "seq_lens",
                msg: format!("[{i}] = {l}; expected -1 (padding) or >= 1"),
            });
        }
        pages.check_seq(OP, i, l as usize, page_size, num_pages)?;
    }
    let scale = super::softmax_scale(OP, scale, hd)?;
    let group = dims.n_q_heads / dims.n_kv_heads;
    // Scratch rows of `hd`, allocated only when a query row (of at least `hd` elements in
    // memory) exists: an absurd head dim with no tokens must not abort on the allocation.
    let sd = hd.min(q.len());
    let (mut scores, mut acc, mut qf) = (Vec::new(), vec![0f64; sd], vec![0f32; sd]);
    for (i, &l) in seq_lens.iter().enumerate() {
        let row = &mut out[i * dims.n_q_heads * hd..(i + 1) * dims.n_q_heads * hd];
        if l == -1 {
            row.fill(T::from_f32(0.0));
            continue;
        }
        for h in 0..dims.n_q_heads {
            let kvh = h / group;
            let qo = (i * dims.n_q_heads + h) * hd;
            for (d, s) in qf.iter_mut().zip(&q[qo..qo + hd]) {
                *d = s.to_f32();
            }
            let at = |p: usize| {
                let (pg, r) = pages.locate(i, p, page_size);
                kv.offset(pg, r) + kvh * hd
            };
            attend(
                &qf,
                l as usize,
                |p| &k_cache[at(p)..at(p) + hd],
                |p| &v_cache[at(p)..at(p) + hd],
                scale,
                &mut scores,
                &mut acc,
            );
            for (d, &a) in row[h * hd..(h + 1) * hd].iter_mut().zip(&acc) {
                *d = T::from_f32(a as f32);
            }
        }
    }
    Ok(())
}
