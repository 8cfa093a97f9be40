//! Host-side sampling of a logits row: greedy argmax, seeded temperature / top-p (nucleus)
//! sampling, and top-K log-probabilities (the CPU twins of the `sample.*` device kernels'
//! semantics; HF `generate`'s `TopPLogitsWarper` + multinomial draw, and `log_softmax`).

use rand::rngs::StdRng;
use rand::Rng;

use crate::error::{EngineError, Result};

/// Sampling and stopping parameters of one request.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// `<= 0`: greedy (argmax, ties to the lowest id). Otherwise logits are divided by it.
    pub temperature: f32,
    /// Nucleus sampling: keep the smallest set of top tokens with probability mass `>= top_p`
    /// (1.0 = all).
    pub top_p: f32,
    /// Seed of this request's sampler (sampling is reproducible per request).
    pub seed: u64,
    /// Generated tokens at most.
    pub max_tokens: usize,
    /// Generation stops after producing one of these (the stop token is part of the output).
    pub stop_tokens: Vec<u32>,
    /// Return the top-K log-probabilities of each generated token's distribution.
    pub logprobs: Option<usize>,
    /// Also return them for every prompt position (the distribution after that token).
    pub prompt_logprobs: bool,
}

impl SamplingParams {
    /// Check the parameters: `temperature` finite and `>= 0`, `top_p` in `(0, 1]` (not NaN).
    /// `max_tokens = 0` is allowed here (the request finishes at once, with no token); the CLI
    /// refuses it.
    ///
    /// # Errors
    /// [`EngineError::Request`] naming the bad parameter.
    pub fn validate(&self) -> Result<()> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(EngineError::Request(format!(
                "temperature {} must be a finite number >= 0 (0 = greedy)",
                self.temperature
            )));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(EngineError::Request(format!(
                "top_p {} must be in (0, 1] (1 = no nucleus cut)",
                self.top_p
            )));
        }
        Ok(())
    }
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_p: 1.0,
            seed: 0,
            max_tokens: 32,
            stop_tokens: Vec::new(),
            logprobs: None,
            prompt_logprobs: false,
        }
    }
}

/// Top-k `(token id, log-probability)` pairs, best first.
pub type TopK = Vec<(u32, f32)>;

/// Log-softmax in f64 of one logits row, returned as f64 log-probabilities.
/// `log(sum_j exp(row_j))` in f64, max-subtracted: `log_softmax(row)_j = row_j - lse`.
fn log_sum_exp(row: &[f32]) -> f64 {
    let m = f64::from(row.iter().copied().fold(f32::NEG_INFINITY, f32::max));
    m + row.iter().map(|&x| (f64::from(x) - m).exp()).sum::<f64>().ln()
}

/// Top-`k` log-probabilities of a logits row (ties to the lower id).
///
/// # Errors
/// [`EngineError::Request`] for `k` larger than the vocabulary or a NaN logit.
pub fn topk_logprobs(row: &[f32], k: usize) -> Result<TopK> {
    let mut v = deltakit_ref::sample::topk_logprobs(row, row.len(), k)
        .map_err(|e| EngineError::Request(e.to_string()))?;
    Ok(v.pop().unwrap_or_default())
}

/// Pick the next token from a logits row: greedy for `temperature <= 0`, else sampling from
/// `softmax(logits / temperature)` restricted to the top-p nucleus. Returns `(token, logprob)`
/// with the log-probability under the unscaled distribution.
///
/// # Errors
/// [`EngineError::Request`] for a NaN logit or an empty row.
pub fn sample_token(row: &[f32], p: &SamplingParams, rng: &mut StdRng) -> Result<(u32, f32)> {
    if row.is_empty() || row.iter().any(|x| x.is_nan()) {
        return Err(EngineError::Request("logits row is empty or has NaN".into()));
    }
    let lse = log_sum_exp(row);
    let tok = if p.temperature <= 0.0 {
        let mut best = 0;
        for (i, &x) in row.iter().enumerate() {
            if x > row[best] {
                best = i;
            }
        }
        best
    } else {
        let t = f64::from(p.temperature);
        let scaled: Vec<f64> = row.iter().map(|&x| f64::from(x) / t).collect();
        let m = scaled.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let mut probs: Vec<(usize, f64)> =
            scaled.iter().enumerate().map(|(i, &x)| (i, (x - m).exp())).collect();
        let z: f64 = probs.iter().map(|p| p.1).sum();
        let top_p = f64::from(p.top_p.clamp(0.0, 1.0));
        if top_p < 1.0 {
            let keep = nucleus(&mut probs, z, top_p);
            probs.truncate(keep.max(1));
        }
        let mass: f64 = probs.iter().map(|p| p.1).sum();
        let mut u = rng.gen::<f64>() * mass;
        let mut pick = probs[probs.len() - 1].0;
        for &(i, pr) in &probs {
            if u < pr {
                pick = i;
                break;
            }
            u -= pr;
        }
        pick
    };
    Ok((tok as u32, (f64::from(row[tok]) - lse) as f32))
}

/// The sampled token of one logits row, with its log-probability and the optional top-K.
pub(crate) struct Pick {
    pub(crate) token: u32,
    pub(crate) logprob: f32,
    pub(crate) topk: Option<TopK>,
}

impl Pick {
    /// Sample `row` per `params` ([`sample_token`]) and gather its top-K if requested.
    pub(crate) fn new(row: &[f32], params: &SamplingParams, rng: &mut StdRng) -> Result<Self> {
        let (token, logprob) = sample_token(row, params, rng)?;
        let topk = params.logprobs.map(|k| topk_logprobs(row, k)).transpose()?;
        Ok(Self { token, logprob, topk })
    }
}

/// Order `probs` (`(id, weight)`, weights summing to `z`) so that its first `n` entries are the
/// top-p nucleus sorted by weight descending, ties to the lower id, and return `n`: the smallest
/// prefix with mass `>= top_p * z` (all entries if rounding never gets there). Only candidate
/// prefixes are sorted (1024 entries, then 8x more), not the whole 248k-entry vocabulary.
fn nucleus(probs: &mut [(usize, f64)], z: f64, top_p: f64) -> usize {
    let cmp = |a: &(usize, f64), b: &(usize, f64)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    let len = probs.len();
    let mut n = len.min(1024);
    loop {
        if n < len {
            probs.select_nth_unstable_by(n - 1, cmp);
        }
        probs[..n].sort_by(cmp);
        let mut cum = 0.0;
        for (i, pr) in probs[..n].iter().enumerate() {
            cum += pr.1 / z;
            if cum >= top_p {
                return i + 1;
            }
        }
        if n == len {
            return len;
        }
        n = len.min(n * 8);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    /// `nucleus` (partial selection) == the prefix of a full sort, over vocab sizes around its
    /// 1024 / 8192 candidate steps, peaked and flat distributions, and ties.
    #[test]
    fn nucleus_equals_full_sort_prefix() {
        let mut rng = StdRng::seed_from_u64(5);
        for &len in &[1usize, 7, 1023, 1024, 1025, 9000, 70_000] {
            for &(spread, top_p) in &[(0.5f64, 0.9f64), (8.0, 0.5), (30.0, 0.99), (0.0, 0.7)] {
                let w: Vec<(usize, f64)> = (0..len)
                    .map(|i| (i, (rng.gen_range(-1.0..1.0) * spread).exp()))
                    .map(|(i, x)| (i, if i % 5 == 0 { 1.0 } else { x })) // forced ties
                    .collect();
                let z: f64 = w.iter().map(|p| p.1).sum();
                let mut full = w.clone();
                full.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
                let mut cum = 0.0;
                let mut keep = len;
                for (i, pr) in full.iter().enumerate() {
                    cum += pr.1 / z;
                    if cum >= top_p {
                        keep = i + 1;
                        break;
                    }
                }
                let mut part = w.clone();
                let n = nucleus(&mut part, z, top_p);
                assert_eq!(n, keep, "len {len} spread {spread} top_p {top_p}");
                assert_eq!(part[..n], full[..keep], "len {len} spread {spread} top_p {top_p}");
            }
        }
    }

    #[test]
    fn greedy_and_seeded_sampling() {
        let row = [0.0f32, 3.0, 1.0, 3.0];
        let mut rng = StdRng::seed_from_u64(1);
        let p = SamplingParams::default();
        assert_eq!(sample_token(&row, &p, &mut rng).unwrap().0, 1);
        // p(1) = p(3) ~ 0.42: top_p 0.4 keeps only the first of them (ties by lower id).
        let p = SamplingParams { temperature: 1.0, top_p: 0.4, ..SamplingParams::default() };
        for _ in 0..20 {
            assert_eq!(sample_token(&row, &p, &mut rng).unwrap().0, 1);
        }
        let p =
            SamplingParams { temperature: 1.0, top_p: 1.0, seed: 9, ..SamplingParams::default() };
        let draw = |seed| {
            let mut r = StdRng::seed_from_u64(seed);
            (0..50).map(|_| sample_token(&row, &p, &mut r).unwrap().0).collect::<Vec<_>>()
        };
        assert_eq!(draw(3), draw(3));
        assert!(draw(3).contains(&3) && draw(3).contains(&1));
        assert!(sample_token(&[f32::NAN], &p, &mut rng).is_err());
    }

    /// Review finding 18: sampling parameters are validated by the library.
    #[test]
    fn sampling_params_are_validated() {
        let ok = SamplingParams { temperature: 0.7, top_p: 0.9, ..SamplingParams::default() };
        assert!(ok.validate().is_ok() && SamplingParams::default().validate().is_ok());
        for t in [-0.1f32, f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let e = SamplingParams { temperature: t, ..ok.clone() }.validate().unwrap_err();
            assert!(e.to_string().contains("temperature"), "{t}: {e}");
        }
        for p in [0.0f32, -0.5, 1.01, f32::NAN, f32::INFINITY] {
            let e = SamplingParams { top_p: p, ..ok.clone() }.validate().unwrap_err();
            assert!(e.to_string().contains("top_p"), "{p}: {e}");
        }
    }
}
