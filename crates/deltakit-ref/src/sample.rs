//! Sampling helpers: `sample.argmax` (greedy) and `sample.topk_logprobs`.

use crate::{check, Elem, RefError, Result};

fn validate<T: Elem>(op: &'static str, logits: &[T], vocab: usize) -> Result<usize> {
    let n = check::rows(op, "logits", logits.len(), vocab)?;
    if let Some(i) = logits.iter().position(|x| x.to_f32().is_nan()) {
        return Err(RefError::Invalid {
            op,
            what: "logits",
            msg: format!("NaN at row {} column {}", i / vocab, i % vocab),
        });
    }
    Ok(n)
}

/// Greedy sampling: per row the index of the largest logit, ties to the lowest index (as
/// `torch.argmax` on CPU). `+inf`/`-inf` are ordinary values; NaN is an error.
///
/// Shapes: `logits`: `[N, vocab]`; `out`: `u32 [N]`.
///
/// # Errors
/// [`RefError::Shape`] for `vocab == 0` or length mismatches; [`RefError::Invalid`] for a NaN.
pub fn argmax<T: Elem>(logits: &[T], vocab: usize, out: &mut [u32]) -> Result<()> {
    const OP: &str = "sample.argmax";
    let n = validate(OP, logits, vocab)?;
    check::len(OP, "out", out.len(), n)?;
    for (o, row) in out.iter_mut().zip(logits.chunks_exact(vocab)) {
        let mut best = 0usize;
        let mut bv = row[0].to_f32();
        for (j, x) in row.iter().enumerate().skip(1) {
            let x = x.to_f32();
            if x > bv {
                best = j;
                bv = x;
            }
        }
        *o = best as u32;
    }
    Ok(())
}

/// Top-k log-probabilities per row: `log_softmax` in f64 (max-subtracted log-sum-exp), returning
/// the `k` largest as `(token id, logprob as f32)` sorted by logprob descending, ties by lower id
/// (HF generation's `output_logprobs` with `torch.topk` on `log_softmax`, with a deterministic
/// tie order).
///
/// Shapes: `logits`: `[N, vocab]`; returns `N` vectors of length `k`.
///
/// # Errors
/// [`RefError::Shape`] for `vocab == 0` or a bad length; [`RefError::Invalid`] for `k > vocab`
/// or a NaN logit.
pub fn topk_logprobs<T: Elem>(
    logits: &[T],
    vocab: usize,
    k: usize,
) -> Result<Vec<Vec<(u32, f32)>>> {
    const OP: &str = "sample.topk_logprobs";
    validate(OP, logits, vocab)?;
    if k > vocab {
        return Err(RefError::Invalid { op: OP, what: "k", msg: format!("{k} > vocab {vocab}") });
    }
    Ok(logits
        .chunks_exact(vocab)
        .map(|row| {
            let x: Vec<f64> = row.iter().map(|e| f64::from(e.to_f32())).collect();
            let m = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let lse = m + x.iter().map(|&v| (v - m).exp()).sum::<f64>().ln();
            let mut idx: Vec<usize> = (0..vocab).collect();
            idx.sort_by(|&a, &b| x[b].total_cmp(&x[a]).then(a.cmp(&b)));
            idx.truncate(k);
            idx.into_iter().map(|i| (i as u32, (x[i] - lse) as f32)).collect()
        })
        .collect())
}
