//! Host-side sampling of a logits row — greedy argmax, seeded temperature / top-p (nucleus)
//! sampling, top-K log-probabilities — with exactly the semantics of the `sample.*` device
//! kernels, so a request gives the same tokens on every backend: the token is
//! `deltakit_ref::sample::top_p_trace` (greedy = argmax with ties to the lowest id for
//! `temperature = 0`; otherwise the integer-exact nucleus draw of HF `TemperatureLogitsWarper` +
//! `TopPLogitsWarper` + multinomial, seeded by the request's `seed` and `counter` = the index of
//! the token among the request's generated tokens), its log-probability is `log_softmax(row)` in
//! f64 at temperature 1, and the top-K list is `deltakit_ref::sample::topk_logprobs`.

use crate::error::{EngineError, Result};

/// Sampling and stopping parameters of one request.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// `0`: greedy (argmax, ties to the lowest id). Otherwise logits are divided by it. Finite
    /// and `>= 0` ([`SamplingParams::validate`]).
    pub temperature: f32,
    /// Nucleus sampling: keep the smallest set of top tokens with probability mass `>= top_p`
    /// (1.0 = all).
    pub top_p: f32,
    /// Seed of this request's sampler: generated token `i` is drawn with `(seed, counter = i)`,
    /// so sampling is reproducible per request and independent of batching and backend.
    pub seed: u64,
    /// Generated tokens at most; `>= 1` (as the CLI's `--max-tokens`, vLLM's and the OpenAI
    /// API's `max_tokens`).
    pub max_tokens: usize,
    /// Generation stops after producing one of these (the stop token is part of the output).
    pub stop_tokens: Vec<u32>,
    /// Return the top-K log-probabilities of each generated token's distribution: `Some(K)` with
    /// `K >= 1` (`None` = no top-K lists on generated tokens; every generated token carries its
    /// own log-probability either way, so `Some(0)` would ask for nothing and is refused).
    pub logprobs: Option<usize>,
    /// Also return a top-K list for every prompt position (the distribution after that token):
    /// K = `logprobs`, or 1 with `logprobs: None` (a prompt position has no log-probability of
    /// its own, so its list is never empty).
    pub prompt_logprobs: bool,
}

impl SamplingParams {
    /// Check the parameters: `temperature` finite and `>= 0`, `top_p` in `(0, 1]` (not NaN),
    /// `max_tokens >= 1`, `logprobs` `None` or `Some(K >= 1)` (the upper bound, the vocabulary,
    /// is checked by [`crate::generate::Engine::generate`]).
    ///
    /// `max_tokens = 0` is refused (session 11; before, it finished the request at once with no
    /// token, no `Finished` event and none of its `prompt_logprobs`), as the CLI's
    /// `--max-tokens`, `eval-mc`, vLLM and the OpenAI API do.
    ///
    /// # Errors
    /// [`EngineError::Request`] naming the bad parameter.
    pub fn validate(&self) -> Result<()> {
        if self.max_tokens == 0 {
            return Err(EngineError::Request(
                "max_tokens 0 must be >= 1 (the number of tokens to generate)".into(),
            ));
        }
        if self.logprobs == Some(0) {
            return Err(EngineError::Request(
                "logprobs Some(0) must be None (no top-K lists) or Some(K >= 1)".into(),
            ));
        }
        check_temperature_top_p(self.temperature, self.top_p)
    }
}

/// The one check of a sampler's `temperature` (finite, `>= 0`) and `top_p` (in `(0, 1]`, not
/// NaN), shared by [`SamplingParams::validate`] and [`RowSampling::validate`].
fn check_temperature_top_p(temperature: f32, top_p: f32) -> Result<()> {
    if !(temperature.is_finite() && temperature >= 0.0) {
        return Err(EngineError::Request(format!(
            "temperature {temperature} must be a finite number >= 0 (0 = greedy)"
        )));
    }
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(EngineError::Request(format!(
            "top_p {top_p} must be in (0, 1] (1 = no nucleus cut)"
        )));
    }
    Ok(())
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

/// One decode row's sampling request (device or host): see the module docs. Its `temperature`
/// and `top_p` obey the rules of [`SamplingParams`] ([`RowSampling::validate`]).
#[derive(Clone, Debug, PartialEq)]
pub struct RowSampling {
    /// Finite and `>= 0`; `0`: greedy.
    pub temperature: f32,
    /// Nucleus mass in `(0, 1]` (not NaN).
    pub top_p: f32,
    /// The request's seed.
    pub seed: u64,
    /// Index of the token being drawn among the request's generated tokens.
    pub counter: u64,
    /// Top-K log-probabilities wanted (0: none).
    pub topk: usize,
}

impl RowSampling {
    /// The row for a request with `params` drawing its generated token number `counter`.
    #[must_use]
    pub fn of(params: &SamplingParams, counter: u64) -> Self {
        Self {
            temperature: params.temperature,
            top_p: params.top_p,
            seed: params.seed,
            counter,
            topk: params.logprobs.unwrap_or(0),
        }
    }

    /// Check `temperature` and `top_p` with the rules of [`SamplingParams::validate`] (the
    /// same check: a NaN temperature would sample greedily, an infinite one uniformly, and a
    /// `top_p` of 0, NaN or outside `(0, 1]` would act as 1). `topk` is checked against the
    /// vocabulary by its users ([`sample_row`], [`crate::generate::Engine::decode_sample`]).
    ///
    /// # Errors
    /// [`EngineError::Request`] naming `temperature` or `top_p` with its value.
    pub fn validate(&self) -> Result<()> {
        check_temperature_top_p(self.temperature, self.top_p)
    }
}

/// A sampled token with its log-probability (temperature 1) and the requested top-K.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampled {
    /// The token.
    pub token: u32,
    /// `log_softmax(logits)[token]`.
    pub logprob: f32,
    /// Top-K `(id, logprob)` of the row (empty when not requested).
    pub topk: TopK,
}

/// `log(sum_j exp(row_j))` in f64, max-subtracted.
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

/// Draw the next token from a logits row for a request with `p`, as its generated token number
/// `counter` (see the module docs). Returns `(token, logprob)` with the log-probability under
/// the unscaled distribution.
///
/// # Errors
/// [`EngineError::Request`] for a NaN logit, an empty row, or a temperature / top_p that
/// [`SamplingParams::validate`] refuses.
pub fn sample_token(row: &[f32], p: &SamplingParams, counter: u64) -> Result<(u32, f32)> {
    let s = sample_row(row, &RowSampling { topk: 0, ..RowSampling::of(p, counter) })?;
    Ok((s.token, s.logprob))
}

/// Sample one row per `s` (the host twin of the device decode sampler).
///
/// # Errors
/// [`EngineError::Request`] for a bad `temperature` / `top_p` ([`RowSampling::validate`]), a
/// NaN logit, an empty row, or `s.topk` larger than the row.
pub fn sample_row(row: &[f32], s: &RowSampling) -> Result<Sampled> {
    s.validate()?;
    if row.is_empty() || row.iter().any(|x| x.is_nan()) {
        return Err(EngineError::Request("logits row is empty or has NaN".into()));
    }
    let tok = deltakit_ref::sample::top_p_trace(row, s.temperature, s.top_p, s.seed, s.counter)
        .map_err(|e| EngineError::Request(e.to_string()))?
        .id;
    let lse = log_sum_exp(row);
    let topk = if s.topk > 0 { topk_logprobs(row, s.topk)? } else { Vec::new() };
    Ok(Sampled { token: tok, logprob: (f64::from(row[tok as usize]) - lse) as f32, topk })
}

/// Sample decode logits `[rows, vocab]` on the host, row `i` per `rows[i]` ([`sample_row`]),
/// rows in parallel.
///
/// # Errors
/// [`EngineError::Request`] if `vocab` is 0 or `logits` is not `rows.len() * vocab` long, or
/// as [`sample_row`].
pub fn sample_rows(logits: &[f32], vocab: usize, rows: &[RowSampling]) -> Result<Vec<Sampled>> {
    use rayon::prelude::*;
    if vocab == 0 {
        return Err(EngineError::Request("decode_sample: vocab must be >= 1, got 0".into()));
    }
    if rows.len().checked_mul(vocab) != Some(logits.len()) {
        return Err(EngineError::Request(format!(
            "decode_sample: {} logits for {} rows of {vocab}",
            logits.len(),
            rows.len()
        )));
    }
    logits.par_chunks(vocab).zip(rows.par_iter()).map(|(r, s)| sample_row(r, s)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Greedy is the argmax (ties to the lowest id); seeded draws are reproducible, depend on
    /// the counter, respect the nucleus, and equal `deltakit_ref::sample::top_p_sample` (the
    /// device kernel's bitwise twin).
    #[test]
    fn greedy_and_seeded_sampling() {
        let row = [0.0f32, 3.0, 1.0, 3.0];
        let p = SamplingParams::default();
        assert_eq!(sample_token(&row, &p, 0).unwrap().0, 1);
        // p(1) = p(3) ~ 0.42: top_p 0.4 keeps both tied tokens (ties at the threshold are kept).
        let p = SamplingParams { temperature: 1.0, top_p: 0.4, ..SamplingParams::default() };
        for c in 0..20 {
            let t = sample_token(&row, &p, c).unwrap().0;
            assert!(t == 1 || t == 3, "{t}");
        }
        let p =
            SamplingParams { temperature: 1.0, top_p: 1.0, seed: 9, ..SamplingParams::default() };
        let draw = |seed| {
            let p = SamplingParams { seed, ..p.clone() };
            (0..50).map(|c| sample_token(&row, &p, c).unwrap().0).collect::<Vec<_>>()
        };
        assert_eq!(draw(3), draw(3));
        assert_ne!(draw(3), draw(4));
        assert!(draw(3).contains(&3) && draw(3).contains(&1));
        let mut want = [0u32];
        for c in 0..50u64 {
            deltakit_ref::sample::top_p_sample(&row, 4, &[1.0], &[1.0], &[3], &[c], &mut want)
                .unwrap();
            assert_eq!(
                sample_token(&row, &SamplingParams { seed: 3, ..p.clone() }, c).unwrap().0,
                want[0]
            );
        }
        assert!(sample_token(&[f32::NAN], &p, 0).is_err());
        let s = sample_row(&row, &RowSampling { topk: 2, ..RowSampling::of(&p, 0) }).unwrap();
        assert_eq!(s.topk.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 3]);
        let lse = log_sum_exp(&row);
        assert!((f64::from(s.logprob) - (f64::from(row[s.token as usize]) - lse)).abs() < 1e-6);
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
        // Session 11: max_tokens = 0 and logprobs = Some(0) are typed errors naming the field.
        let e = SamplingParams { max_tokens: 0, ..ok.clone() }.validate().unwrap_err();
        assert!(matches!(&e, EngineError::Request(m) if m.contains("max_tokens")), "{e}");
        let e = SamplingParams { logprobs: Some(0), ..ok.clone() }.validate().unwrap_err();
        assert!(matches!(&e, EngineError::Request(m) if m.contains("logprobs")), "{e}");
        assert!(SamplingParams { max_tokens: 1, logprobs: Some(1), ..ok }.validate().is_ok());
    }

    /// Session 11 (robust2): decode rows obey SamplingParams' rules (top_p 0 / NaN / -1 / 2
    /// acted as 1, a NaN temperature was greedy, an infinite one sampled); vocab 0 in
    /// sample_rows is a typed error (par_chunks(0) panicked).
    #[test]
    fn rows_are_validated_like_params() {
        let row = [0.0f32, 3.0, 1.0];
        let ok = RowSampling { temperature: 0.7, top_p: 0.9, seed: 1, counter: 0, topk: 1 };
        assert!(ok.validate().is_ok() && sample_row(&row, &ok).is_ok());
        let bad_t = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -1.0];
        let bad_p = [0.0f32, f32::NAN, -1.0, 2.0, f32::INFINITY];
        let cases = bad_t
            .iter()
            .map(|&t| ("temperature", RowSampling { temperature: t, ..ok.clone() }))
            .chain(bad_p.iter().map(|&p| ("top_p", RowSampling { top_p: p, ..ok.clone() })));
        for (name, r) in cases {
            let e = r.validate().unwrap_err();
            assert!(matches!(&e, EngineError::Request(m) if m.starts_with(name)), "{r:?}: {e}");
            // The same check as SamplingParams::validate (one message).
            let p = SamplingParams {
                temperature: r.temperature,
                top_p: r.top_p,
                ..SamplingParams::default()
            };
            assert_eq!(p.validate().unwrap_err().to_string(), e.to_string());
            let e = sample_row(&row, &r).unwrap_err();
            assert!(matches!(&e, EngineError::Request(m) if m.starts_with(name)), "{r:?}: {e}");
            let e = sample_rows(&row, 3, std::slice::from_ref(&r)).unwrap_err();
            assert!(matches!(&e, EngineError::Request(m) if m.starts_with(name)), "{r:?}: {e}");
        }
        for rows in [&[][..], std::slice::from_ref(&ok)] {
            let e = sample_rows(&[], 0, rows).unwrap_err();
            assert!(matches!(&e, EngineError::Request(m) if m.contains("vocab")), "{e}");
        }
        assert!(sample_rows(&[], 3, &[]).unwrap().is_empty());
        // rows x vocab wrapping to 0 (2 x 2^63): a length error, not Ok with no samples.
        let e = sample_rows(&[], usize::MAX / 2 + 1, &[ok.clone(), ok]).unwrap_err();
        assert!(matches!(&e, EngineError::Request(m) if m.contains("logits for 2 rows")), "{e}");
    }
}
