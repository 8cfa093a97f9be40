//! The engine: sequences over the state pools, forward steps, and the generation scheduler.
//!
//! Two layers:
//! - [`Engine::step`]: one forward over a set of sequences, each contributing some new tokens
//!   (a varlen prefill batch, or one token per row for a batched decode step), returning the
//!   logits rows asked for. Sequences are opened with [`Engine::add_sequence`] (a state slot,
//!   zeroed) and closed with [`Engine::end_sequence`] (slot and KV pages back to the pools).
//!   Tests drive this directly (teacher forcing).
//! - [`Engine::generate`]: the scheduler. All prompts are prefilled as varlen batches, long
//!   prompts in chunks of [`GenOptions::prefill_chunk`] tokens with state carried; then every
//!   running sequence decodes in one batched step per token. Greedy or seeded temperature /
//!   top-p sampling, stop tokens, max tokens, a streaming callback, and timing.

use std::collections::HashMap;
use std::ops::Range;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;

use crate::backend::{Backend, StepBatch, StepKind};
use crate::error::{EngineError, Result};
use crate::model::{LogitsRows, ModelCaches, Qwen35};
use crate::state::{CacheConfig, SeqState, StatePool};

/// Handle of a sequence open in an [`Engine`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u64);

/// Which logits rows a [`StepItem`] wants back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    /// None (a middle chunk of a long prompt).
    Nothing,
    /// The row of the last new token (next-token distribution).
    Last,
    /// Every new token's row (prompt log-probabilities).
    All,
}

/// One sequence's share of a forward step.
#[derive(Clone, Copy, Debug)]
pub struct StepItem<'a> {
    /// The sequence.
    pub seq: SeqId,
    /// Its new tokens (at least one).
    pub tokens: &'a [u32],
    /// Which logits rows to return.
    pub want: Want,
}

/// Logits of a step, on the host: `data` is `[rows, vocab]`; item `i`'s rows are `rows[i]`.
#[derive(Clone, Debug, PartialEq)]
pub struct StepLogits {
    /// Vocabulary size (row length).
    pub vocab: usize,
    /// Row-major logits.
    pub data: Vec<f32>,
    /// Row range of each item (empty for [`Want::Nothing`]).
    pub rows: Vec<Range<usize>>,
}

impl StepLogits {
    /// Row `r` of the logits.
    #[must_use]
    pub fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.vocab..(r + 1) * self.vocab]
    }
}

/// A model on a backend with its state pools: the unit that runs forward steps.
pub struct Engine<B: Backend> {
    be: B,
    model: Qwen35<B>,
    caches: ModelCaches<B>,
    pool: StatePool,
    seqs: HashMap<SeqId, SeqState>,
    next_id: u64,
}

impl<B: Backend> Engine<B> {
    /// An engine for `model` with pools sized by `cache` (allocated on the backend now).
    ///
    /// # Errors
    /// [`EngineError::Capacity`] for zero sizes; backend allocation errors.
    pub fn new(be: B, model: Qwen35<B>, cache: CacheConfig) -> Result<Self> {
        let pool = StatePool::new(cache)?;
        let caches = model.new_caches(&be, cache.max_seqs, cache.num_pages, cache.page_size)?;
        Ok(Self { be, model, caches, pool, seqs: HashMap::new(), next_id: 0 })
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.be
    }

    /// The backend's name (`cpu`, `cuda:0`).
    pub fn backend_name(&self) -> String {
        self.be.name()
    }

    /// The model.
    pub fn model(&self) -> &Qwen35<B> {
        &self.model
    }

    /// The pool configuration.
    #[must_use]
    pub fn cache_config(&self) -> CacheConfig {
        self.pool.config()
    }

    /// Open a sequence: take a state slot and zero it in every GDN layer.
    ///
    /// # Errors
    /// [`EngineError::Capacity`] if all slots are in use.
    pub fn add_sequence(&mut self) -> Result<SeqId> {
        let st = self.pool.start()?;
        for g in &mut self.caches.gdn {
            if let Err(e) = self.be.reset_gdn_slot(g, st.slot) {
                self.pool.free(st);
                return Err(e);
            }
        }
        let id = SeqId(self.next_id);
        self.next_id += 1;
        self.seqs.insert(id, st);
        Ok(id)
    }

    /// Close a sequence: its slot and KV pages go back to the pools.
    ///
    /// # Errors
    /// [`EngineError::Request`] for an unknown id.
    pub fn end_sequence(&mut self, id: SeqId) -> Result<()> {
        let st = self
            .seqs
            .remove(&id)
            .ok_or_else(|| EngineError::Request(format!("unknown sequence {id:?}")))?;
        self.pool.free(st);
        Ok(())
    }

    /// Tokens processed so far by sequence `id`.
    #[must_use]
    pub fn seq_len(&self, id: SeqId) -> Option<usize> {
        self.seqs.get(&id).map(|s| s.len)
    }

    /// Open sequences.
    #[must_use]
    pub fn num_sequences(&self) -> usize {
        self.seqs.len()
    }

    /// One forward step over `items` (distinct open sequences, each with >= 1 new token).
    /// Decode kernels are used when every item has exactly one token and a non-empty history;
    /// otherwise the step is a varlen prefill (chunked GDR, attention with prior context).
    ///
    /// If the forward itself fails, the touched sequences' states are unspecified: end them.
    ///
    /// # Errors
    /// [`EngineError::Request`] for unknown/duplicate sequences, empty items, bad token ids or a
    /// sequence growing past the maximum context; [`EngineError::Capacity`] if the KV pages run
    /// out (nothing is run then); backend errors.
    pub fn step(&mut self, items: &[StepItem<'_>]) -> Result<StepLogits> {
        if items.is_empty() {
            return Err(EngineError::Request("empty step".into()));
        }
        let mut seen = std::collections::HashSet::new();
        for it in items {
            if !seen.insert(it.seq) {
                return Err(EngineError::Request(format!("sequence {:?} twice in a step", it.seq)));
            }
            if it.tokens.is_empty() {
                return Err(EngineError::Request(format!(
                    "sequence {:?} has no new tokens",
                    it.seq
                )));
            }
            let st = self
                .seqs
                .get(&it.seq)
                .ok_or_else(|| EngineError::Request(format!("unknown sequence {:?}", it.seq)))?;
            let max = self.pool.config().max_context;
            if st.len + it.tokens.len() > max {
                return Err(EngineError::Request(format!(
                    "sequence {:?} would reach {} tokens, past the maximum context of {max}",
                    it.seq,
                    st.len + it.tokens.len()
                )));
            }
        }
        for it in items {
            let st = self
                .seqs
                .get_mut(&it.seq)
                .ok_or_else(|| EngineError::Request(format!("unknown sequence {:?}", it.seq)))?;
            let total = st.len + it.tokens.len();
            self.pool.reserve(st, total)?;
        }
        let decode = items.iter().all(|it| it.tokens.len() == 1 && self.seqs[&it.seq].len > 0);
        let max_pages = items.iter().map(|it| self.seqs[&it.seq].pages.len()).max().unwrap_or(1);
        let max_pages = max_pages.max(1);
        let mut batch = StepBatch {
            kind: if decode { StepKind::Decode } else { StepKind::Prefill },
            cu_seqlens: vec![0],
            slots: Vec::with_capacity(items.len()),
            ctx_lens: Vec::with_capacity(items.len()),
            positions: Vec::new(),
            page_table: vec![-1; items.len() * max_pages],
            max_pages,
        };
        let mut ids = Vec::new();
        let mut want_rows = Vec::new();
        let mut ranges = Vec::with_capacity(items.len());
        for (i, it) in items.iter().enumerate() {
            let st = &self.seqs[&it.seq];
            let start = ids.len();
            ids.extend_from_slice(it.tokens);
            batch.cu_seqlens.push(ids.len() as i32);
            batch.slots.push(st.slot as i32);
            batch.ctx_lens.push(st.len as i32);
            batch.positions.extend((st.len..st.len + it.tokens.len()).map(|p| p as i64));
            batch.page_table[i * max_pages..i * max_pages + st.pages.len()]
                .copy_from_slice(&st.pages);
            let r0 = want_rows.len();
            match it.want {
                Want::Nothing => {}
                Want::Last => want_rows.push(ids.len() - 1),
                Want::All => want_rows.extend(start..ids.len()),
            }
            ranges.push(r0..want_rows.len());
        }
        let page_size = self.pool.config().page_size;
        let vocab = self.model.config().vocab_size;
        let data = if want_rows.is_empty() {
            // Still run the layers (state update); skip the LM head.
            self.model.forward(
                &self.be,
                &ids,
                &batch,
                &mut self.caches,
                LogitsRows::Rows(&[]),
                page_size,
            )?;
            Vec::new()
        } else {
            let rows = if want_rows.len() == ids.len() {
                LogitsRows::All
            } else {
                LogitsRows::Rows(&want_rows)
            };
            let t =
                self.model.forward(&self.be, &ids, &batch, &mut self.caches, rows, page_size)?;
            self.be.to_host(&t)?
        };
        for it in items {
            if let Some(st) = self.seqs.get_mut(&it.seq) {
                st.len += it.tokens.len();
            }
        }
        Ok(StepLogits { vocab, data, rows: ranges })
    }
}

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

/// One generation request.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    /// Prompt token ids (non-empty).
    pub prompt: Vec<u32>,
    /// Sampling parameters.
    pub params: SamplingParams,
}

/// Scheduler options.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GenOptions {
    /// Most prompt tokens of one sequence per prefill step (longer prompts are chunked).
    pub prefill_chunk: usize,
    /// Most tokens of one prefill step across sequences.
    pub max_step_tokens: usize,
}

impl Default for GenOptions {
    fn default() -> Self {
        Self { prefill_chunk: 2048, max_step_tokens: 8192 }
    }
}

/// Why a request stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token was generated.
    Stop,
    /// `max_tokens` reached.
    Length,
    /// The sequence reached the maximum context.
    Context,
}

/// Top-k `(token id, log-probability)` pairs, best first.
pub type TopK = Vec<(u32, f32)>;

/// Streaming events of [`Engine::generate`].
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// The distribution after prompt token `pos` (only with `prompt_logprobs`).
    Prompt {
        /// Request index.
        req: usize,
        /// Prompt position.
        pos: usize,
        /// The prompt token at `pos`.
        token: u32,
        /// Top-k of the next-token distribution after it.
        topk: TopK,
    },
    /// A generated token.
    Token {
        /// Request index.
        req: usize,
        /// Index among the request's generated tokens.
        index: usize,
        /// The token.
        token: u32,
        /// Its log-probability under the model (temperature 1).
        logprob: f32,
        /// Top-k of the distribution it was drawn from (with `logprobs`).
        topk: Option<TopK>,
    },
    /// A request finished.
    Finished {
        /// Request index.
        req: usize,
        /// Why.
        reason: FinishReason,
    },
}

/// A finished request.
#[derive(Clone, Debug, PartialEq)]
pub struct Completion {
    /// Generated tokens.
    pub tokens: Vec<u32>,
    /// Why it stopped.
    pub reason: FinishReason,
    /// Time from the start of [`Engine::generate`] to its first token.
    pub ttft: Duration,
}

/// Timing of a [`Engine::generate`] call.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GenStats {
    /// Prompt tokens processed.
    pub prefill_tokens: usize,
    /// Time in prefill steps (including sampling the first tokens).
    pub prefill_time: Duration,
    /// Prefill steps.
    pub prefill_steps: usize,
    /// Tokens produced by decode steps (rows summed over steps).
    pub decode_tokens: usize,
    /// Time in decode steps.
    pub decode_time: Duration,
    /// Decode steps.
    pub decode_steps: usize,
    /// Wall time of the whole call.
    pub total_time: Duration,
    /// Mean time to first token over the requests.
    pub mean_ttft: Duration,
}

fn per_sec(n: usize, d: Duration) -> f64 {
    let s = d.as_secs_f64();
    if s > 0.0 {
        n as f64 / s
    } else {
        0.0
    }
}

impl GenStats {
    /// Prompt tokens per second of prefill.
    #[must_use]
    pub fn prefill_tok_s(&self) -> f64 {
        per_sec(self.prefill_tokens, self.prefill_time)
    }
    /// Generated tokens per second of decode (all rows).
    #[must_use]
    pub fn decode_tok_s(&self) -> f64 {
        per_sec(self.decode_tokens, self.decode_time)
    }
    /// Mean latency of one decode step.
    #[must_use]
    pub fn decode_step_latency(&self) -> Duration {
        if self.decode_steps == 0 {
            Duration::ZERO
        } else {
            self.decode_time / self.decode_steps as u32
        }
    }
    /// One-line summary.
    #[must_use]
    pub fn summary(&self) -> String {
        format!(
            "prefill: {} tok in {:.3}s ({:.1} tok/s) | decode: {} tok in {} steps, {:.3}s \
             ({:.1} tok/s, {:.2} ms/step) | ttft {:.1} ms | total {:.3}s",
            self.prefill_tokens,
            self.prefill_time.as_secs_f64(),
            self.prefill_tok_s(),
            self.decode_tokens,
            self.decode_steps,
            self.decode_time.as_secs_f64(),
            self.decode_tok_s(),
            self.decode_step_latency().as_secs_f64() * 1e3,
            self.mean_ttft.as_secs_f64() * 1e3,
            self.total_time.as_secs_f64()
        )
    }
}

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
struct Pick {
    token: u32,
    logprob: f32,
    topk: Option<TopK>,
}

impl Pick {
    /// Sample `row` per `params` ([`sample_token`]) and gather its top-K if requested.
    fn new(row: &[f32], params: &SamplingParams, rng: &mut StdRng) -> Result<Self> {
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

/// Per-request scheduler state.
struct Running {
    seq: Option<SeqId>,
    prefilled: usize,
    out: Vec<u32>,
    rng: StdRng,
    done: Option<FinishReason>,
    ttft: Duration,
}

impl<B: Backend> Engine<B> {
    /// Run `requests` to completion: varlen (chunked) prefill, then batched decode of every
    /// running sequence per step. Requests beyond the free slots wait until one finishes.
    /// `on_event` sees prompt log-probabilities, every token as it is produced, and finishes.
    ///
    /// # Errors
    /// [`EngineError::Request`] for an empty prompt, a prompt longer than the maximum context, a
    /// token outside the vocabulary, a logprob `K` larger than the vocabulary, or invalid
    /// sampling parameters ([`SamplingParams::validate`]);
    /// [`EngineError::Capacity`] if the KV pages run out; backend errors. Sequences are closed
    /// on every exit path.
    pub fn generate(
        &mut self,
        requests: &[Request],
        opts: GenOptions,
        on_event: &mut dyn FnMut(Event),
    ) -> Result<(Vec<Completion>, GenStats)> {
        let vocab = self.model.config().vocab_size;
        let max_ctx = self.pool.config().max_context;
        for (i, r) in requests.iter().enumerate() {
            if let Err(EngineError::Request(m)) = r.params.validate() {
                return Err(EngineError::Request(format!("request {i}: {m}")));
            }
            if r.prompt.is_empty() {
                return Err(EngineError::Request(format!("request {i}: empty prompt")));
            }
            if r.prompt.len() > max_ctx {
                return Err(EngineError::Request(format!(
                    "request {i}: prompt of {} tokens exceeds the maximum context of {max_ctx}",
                    r.prompt.len()
                )));
            }
            if let Some(&t) = r.prompt.iter().find(|&&t| t as usize >= vocab) {
                return Err(EngineError::Request(format!(
                    "request {i}: token id {t} is outside the vocabulary (size {vocab})"
                )));
            }
            if r.params.logprobs.is_some_and(|k| k > vocab) {
                return Err(EngineError::Request(format!(
                    "request {i}: --logprobs {} exceeds the vocabulary ({vocab})",
                    r.params.logprobs.unwrap_or(0)
                )));
            }
        }
        let mut run: Vec<Running> = requests
            .iter()
            .map(|r| Running {
                seq: None,
                prefilled: 0,
                out: Vec::new(),
                rng: StdRng::seed_from_u64(r.params.seed),
                done: if r.params.max_tokens == 0 { Some(FinishReason::Length) } else { None },
                ttft: Duration::ZERO,
            })
            .collect();
        let res = self.schedule(requests, opts, &mut run, on_event);
        for r in &mut run {
            if let Some(s) = r.seq.take() {
                let _ = self.end_sequence(s);
            }
        }
        let mut stats = res?;
        let completions: Vec<Completion> = run
            .into_iter()
            .map(|r| Completion {
                tokens: r.out,
                reason: r.done.unwrap_or(FinishReason::Length),
                ttft: r.ttft,
            })
            .collect();
        if !completions.is_empty() {
            stats.mean_ttft =
                completions.iter().map(|c| c.ttft).sum::<Duration>() / completions.len() as u32;
        }
        Ok((completions, stats))
    }

    /// Emit the sampled token ([`Pick`]), record it, and decide whether the request is done.
    fn accept(
        r: &mut Running,
        req: &Request,
        i: usize,
        pick: Pick,
        seq_len: usize,
        max_ctx: usize,
        on_event: &mut dyn FnMut(Event),
    ) {
        let Pick { token: tok, logprob: lp, topk } = pick;
        on_event(Event::Token { req: i, index: r.out.len(), token: tok, logprob: lp, topk });
        r.out.push(tok);
        r.done = if req.params.stop_tokens.contains(&tok) {
            Some(FinishReason::Stop)
        } else if r.out.len() >= req.params.max_tokens {
            Some(FinishReason::Length)
        } else if seq_len + 1 > max_ctx {
            Some(FinishReason::Context)
        } else {
            None
        };
        if let Some(reason) = r.done {
            on_event(Event::Finished { req: i, reason });
        }
    }

    #[allow(clippy::too_many_lines)]
    fn schedule(
        &mut self,
        requests: &[Request],
        opts: GenOptions,
        run: &mut [Running],
        on_event: &mut dyn FnMut(Event),
    ) -> Result<GenStats> {
        let t0 = Instant::now();
        let mut stats = GenStats::default();
        let max_ctx = self.pool.config().max_context;
        let chunk = opts.prefill_chunk.max(1);
        loop {
            // Close finished sequences, admit waiting requests into free slots.
            for r in run.iter_mut() {
                if r.done.is_some() {
                    if let Some(s) = r.seq.take() {
                        self.end_sequence(s)?;
                    }
                }
            }
            for r in run.iter_mut() {
                if r.done.is_none()
                    && r.seq.is_none()
                    && r.prefilled == 0
                    && self.pool.free_slots() > 0
                {
                    r.seq = Some(self.add_sequence()?);
                }
            }
            let pending: Vec<usize> = (0..run.len())
                .filter(|&i| {
                    run[i].seq.is_some()
                        && run[i].done.is_none()
                        && run[i].prefilled < requests[i].prompt.len()
                })
                .collect();
            if !pending.is_empty() {
                // One varlen prefill step over every pending prompt (chunked, within budget).
                let ts = Instant::now();
                let mut items = Vec::new();
                let mut budget = opts.max_step_tokens.max(1);
                for &i in &pending {
                    if budget == 0 {
                        break;
                    }
                    let p = &requests[i].prompt;
                    let n = (p.len() - run[i].prefilled).min(chunk).min(budget);
                    budget -= n;
                    let end = run[i].prefilled + n;
                    let want = if requests[i].params.prompt_logprobs {
                        Want::All
                    } else if end == p.len() {
                        Want::Last
                    } else {
                        Want::Nothing
                    };
                    let seq = run[i].seq.ok_or_else(|| EngineError::Request("no seq".into()))?;
                    items.push((i, StepItem { seq, tokens: &p[run[i].prefilled..end], want }));
                }
                let step_items: Vec<StepItem<'_>> = items.iter().map(|x| x.1).collect();
                let logits = self.step(&step_items)?;
                for (j, (i, it)) in items.iter().enumerate() {
                    let i = *i;
                    let start = run[i].prefilled;
                    run[i].prefilled += it.tokens.len();
                    stats.prefill_tokens += it.tokens.len();
                    let rows = logits.rows[j].clone();
                    if it.want == Want::All {
                        let k = requests[i].params.logprobs.unwrap_or(1);
                        for (o, r) in rows.clone().enumerate() {
                            on_event(Event::Prompt {
                                req: i,
                                pos: start + o,
                                token: it.tokens[o],
                                topk: topk_logprobs(logits.row(r), k)?,
                            });
                        }
                    }
                    if run[i].prefilled == requests[i].prompt.len() {
                        let last = rows.end - 1;
                        let seq_len = run[i].prefilled;
                        run[i].ttft = t0.elapsed();
                        let pick =
                            Pick::new(logits.row(last), &requests[i].params, &mut run[i].rng)?;
                        Self::accept(
                            &mut run[i],
                            &requests[i],
                            i,
                            pick,
                            seq_len,
                            max_ctx,
                            on_event,
                        );
                    }
                }
                stats.prefill_steps += 1;
                stats.prefill_time += ts.elapsed();
                continue;
            }
            let active: Vec<usize> =
                (0..run.len()).filter(|&i| run[i].seq.is_some() && run[i].done.is_none()).collect();
            if active.is_empty() {
                if run.iter().all(|r| r.done.is_some()) {
                    break;
                }
                if self.pool.free_slots() == 0 {
                    return Err(EngineError::Capacity("no free sequence slot".into()));
                }
                continue;
            }
            // One batched decode step over every running sequence.
            let ts = Instant::now();
            let toks: Vec<[u32; 1]> =
                active.iter().map(|&i| [*run[i].out.last().unwrap_or(&0)]).collect();
            let mut items = Vec::with_capacity(active.len());
            for (k, &i) in active.iter().enumerate() {
                let seq = run[i].seq.ok_or_else(|| EngineError::Request("no seq".into()))?;
                items.push(StepItem { seq, tokens: &toks[k], want: Want::Last });
            }
            let logits = self.step(&items)?;
            // Sample every row in parallel (each request owns its RNG, so the draws do not
            // depend on the thread count), then emit the events in row order.
            let picks: Vec<Result<Pick>> = {
                let rngs: Vec<&mut StdRng> = run
                    .iter_mut()
                    .enumerate()
                    .filter(|(i, _)| active.binary_search(i).is_ok())
                    .map(|(_, r)| &mut r.rng)
                    .collect();
                rngs.into_par_iter()
                    .zip(active.par_iter())
                    .enumerate()
                    .map(|(k, (rng, &i))| {
                        Pick::new(logits.row(logits.rows[k].start), &requests[i].params, rng)
                    })
                    .collect()
            };
            for ((k, &i), pick) in active.iter().enumerate().zip(picks) {
                let seq_len = self.seq_len(items[k].seq).unwrap_or(0);
                Self::accept(&mut run[i], &requests[i], i, pick?, seq_len, max_ctx, on_event);
            }
            stats.decode_tokens += active.len();
            stats.decode_steps += 1;
            stats.decode_time += ts.elapsed();
        }
        stats.total_time = t0.elapsed();
        Ok(stats)
    }
}

/// Build a CPU engine for a model directory or config: convenience for the CLI and tests.
pub mod cpu {
    use std::path::Path;

    use deltakit_ref::Elem;

    use super::Engine;
    use crate::backend::cpu::{Cpu, CpuBackend};
    use crate::config::ModelConfig;
    use crate::error::Result;
    use crate::model::Qwen35;
    use crate::state::CacheConfig;
    use crate::weights::{DummyWeights, SafetensorsWeights};

    /// Load `dir` (config.json + safetensors) onto the f32 CPU backend.
    ///
    /// # Errors
    /// Config, weights and allocation errors.
    pub fn load(dir: &Path, cache: CacheConfig, progress: bool) -> Result<Engine<CpuBackend>> {
        load_as::<f32>(dir, cache, progress)
    }

    /// Load `dir` onto the CPU backend with activation dtype `T` (`f32` or `bf16`).
    ///
    /// # Errors
    /// Config, weights and allocation errors.
    pub fn load_as<T: Elem>(
        dir: &Path,
        cache: CacheConfig,
        progress: bool,
    ) -> Result<Engine<Cpu<T>>> {
        let cfg = ModelConfig::from_path(dir)?;
        let mut src = SafetensorsWeights::open(dir)?;
        let model = Qwen35::load(&Cpu::<T>::new(), &cfg, &mut src, progress)?;
        Engine::new(Cpu::new(), model, cache)
    }

    /// Seeded dummy weights for `cfg` on the f32 CPU backend.
    ///
    /// # Errors
    /// Allocation errors.
    pub fn dummy(cfg: &ModelConfig, seed: u64, cache: CacheConfig) -> Result<Engine<CpuBackend>> {
        let model = Qwen35::load(&CpuBackend::new(), cfg, &mut DummyWeights::new(seed), false)?;
        Engine::new(CpuBackend::new(), model, cache)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
