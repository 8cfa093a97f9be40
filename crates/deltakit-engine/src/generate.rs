//! The engine: sequences over the state pools, forward steps, and the generation scheduler.
//!
//! The engine owns everything that is *not* rank-local: sequence ids, slot and KV-page
//! assignment for all ranks ([`StatePool`]), batching, sampling ([`crate::sampling`]) and
//! stopping. Forward steps run on a [`StepRunner`]: one [`Rank`] in the caller's thread (a single
//! device) or a tensor-parallel [`crate::executor::Executor`] of `tp` rank threads.
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

use crate::backend::{Backend, StepBatch, StepKind};
use crate::config::ModelConfig;
use crate::error::{EngineError, Result};
use crate::model::Qwen35;
use crate::rank::{Rank, RankReport, StepRunner, WantRows};
pub use crate::sampling::{
    sample_row, sample_token, topk_logprobs, RowSampling, Sampled, SamplingParams, TopK,
};
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
    ///
    /// # Panics
    /// If `r` is not a row of `data` (as slice indexing; the rows are `self.rows`' ranges).
    #[must_use]
    pub fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.vocab..(r + 1) * self.vocab]
    }
}

/// A model with its state pools on one device or `tp` ranks: the unit that runs forward steps.
pub struct Engine {
    runner: Box<dyn StepRunner>,
    pool: StatePool,
    seqs: HashMap<SeqId, SeqState>,
    next_id: u64,
}

impl Engine {
    /// A single-device engine for `model` on `be` with pools sized by `cache` (allocated on the
    /// backend now).
    ///
    /// # Errors
    /// [`EngineError::Capacity`] for zero sizes; backend allocation errors.
    pub fn new<B: Backend + 'static>(be: B, model: Qwen35<B>, cache: CacheConfig) -> Result<Self> {
        let pool = StatePool::new(cache)?;
        let rank = Rank::new(be, model, cache)?;
        Ok(Self { runner: Box::new(rank), pool, seqs: HashMap::new(), next_id: 0 })
    }

    /// An engine over any [`StepRunner`] (e.g. a tensor-parallel
    /// [`crate::executor::Executor`]) whose ranks allocated their pools for `cache`.
    ///
    /// # Errors
    /// [`EngineError::Capacity`] for zero sizes.
    pub fn from_runner(runner: Box<dyn StepRunner>, cache: CacheConfig) -> Result<Self> {
        Ok(Self { runner, pool: StatePool::new(cache)?, seqs: HashMap::new(), next_id: 0 })
    }

    /// The backend's name (`cpu`, `cuda:0`, `cpu x2` for two ranks).
    #[must_use]
    pub fn backend_name(&self) -> String {
        self.runner.name()
    }

    /// The model's (global) configuration.
    #[must_use]
    pub fn config(&self) -> &ModelConfig {
        self.runner.config()
    }

    /// Per-op-family GPU timing of decode steps, see [`StepRunner::profile`].
    ///
    /// # Errors
    /// Device errors.
    pub fn profile(&mut self, on: Option<bool>) -> Result<Option<Vec<(&'static str, f64)>>> {
        self.runner.profile(on)
    }

    /// Per-rank weight and state memory.
    #[must_use]
    pub fn rank_reports(&self) -> Vec<RankReport> {
        self.runner.reports()
    }

    /// The pool configuration.
    #[must_use]
    pub fn cache_config(&self) -> CacheConfig {
        self.pool.config()
    }

    /// Open a sequence: take a state slot and zero it in every GDN layer (on every rank).
    ///
    /// # Errors
    /// [`EngineError::Capacity`] if all slots are in use; rank errors.
    pub fn add_sequence(&mut self) -> Result<SeqId> {
        let st = self.pool.start()?;
        if let Err(e) = self.runner.reset_slot(st.slot) {
            self.pool.free(st);
            return Err(e);
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
    /// [`EngineError::Request`] for unknown/duplicate sequences, empty items, bad token ids, a
    /// sequence growing past the maximum context or a step of more than `i32::MAX` tokens;
    /// [`EngineError::Capacity`] if the KV pages run out (nothing is run then); backend errors.
    pub fn step(&mut self, items: &[StepItem<'_>]) -> Result<StepLogits> {
        let (ids, batch, want_rows, ranges) = self.prepare(items)?;
        let vocab = self.config().vocab_size;
        let rows = if want_rows.is_empty() {
            // Still run the layers (state update); skip the LM head.
            WantRows::Nothing
        } else if want_rows.len() == ids.len() {
            WantRows::All
        } else {
            WantRows::Rows(want_rows)
        };
        let data = self.runner.step(&ids, &batch, &rows)?;
        self.advance(items);
        Ok(StepLogits { vocab, data, rows: ranges })
    }

    /// One batched decode step (every item exactly one new token on a non-empty history) that
    /// samples on the runner's device: only the chosen tokens, their log-probabilities and the
    /// requested top-K lists come back. Row `i` is sampled per `sampling[i]` (the same semantics
    /// on every backend, [`crate::sampling`]).
    ///
    /// # Errors
    /// As [`Engine::step`], and [`EngineError::Request`] if an item is not a decode row, the
    /// sampling list's length differs, a row's `temperature` / `top_p` is refused by
    /// [`RowSampling::validate`] or its `topk` exceeds the vocabulary (all checked before the
    /// step runs). A NaN logit fails after the step (the states have advanced: end
    /// those sequences).
    pub fn decode_sample(
        &mut self,
        items: &[StepItem<'_>],
        sampling: &[RowSampling],
    ) -> Result<Vec<Sampled>> {
        if sampling.len() != items.len() {
            return Err(EngineError::Request(format!(
                "{} sampling rows for {} items",
                sampling.len(),
                items.len()
            )));
        }
        // Before the forward step (session 11: a top-K past the vocabulary failed in the sampler
        // after the step had advanced the sequences' GDN state and written their KV rows).
        // Likewise a temperature / top_p that SamplingParams::validate refuses (session 11: a
        // NaN or infinite temperature or a top_p outside (0, 1] was run as greedy / top_p 1).
        let vocab = self.config().vocab_size;
        for (i, r) in sampling.iter().enumerate() {
            r.validate().map_err(|e| match e {
                EngineError::Request(m) => EngineError::Request(format!("sampling row {i}: {m}")),
                e => e,
            })?;
            if r.topk > vocab {
                return Err(EngineError::Request(format!(
                    "sampling row {i}: topk {} exceeds the vocabulary ({vocab})",
                    r.topk
                )));
            }
        }
        // Also before `prepare`, which reserves KV pages (unknown sequences: its error).
        let not_decode = |it: &StepItem<'_>| {
            it.tokens.len() != 1 || self.seqs.get(&it.seq).is_some_and(|st| st.len == 0)
        };
        if items.iter().any(not_decode) {
            return Err(EngineError::Request(
                "decode_sample needs one new token per sequence on a non-empty history".into(),
            ));
        }
        let (ids, batch, _, _) = self.prepare(items)?;
        if batch.kind != StepKind::Decode {
            return Err(EngineError::Request(
                "decode_sample needs one new token per sequence on a non-empty history".into(),
            ));
        }
        let out = self.runner.decode_sample(&ids, &batch, sampling)?;
        self.advance(items);
        Ok(out)
    }

    fn advance(&mut self, items: &[StepItem<'_>]) {
        for it in items {
            if let Some(st) = self.seqs.get_mut(&it.seq) {
                st.len += it.tokens.len();
            }
        }
    }

    /// Validate a step's items, reserve their KV pages and build the batch description:
    /// `(ids, batch, wanted rows, row range per item)`.
    #[allow(clippy::type_complexity)]
    fn prepare(
        &mut self,
        items: &[StepItem<'_>],
    ) -> Result<(Vec<u32>, StepBatch, Vec<usize>, Vec<Range<usize>>)> {
        if items.is_empty() {
            return Err(EngineError::Request("empty step".into()));
        }
        // cu_seqlens are i32 in the kernels: the step's token count must fit (each sequence's
        // does: max_context fits an i32, StatePool::new).
        let total = items.iter().try_fold(0usize, |acc, it| acc.checked_add(it.tokens.len()));
        if total.and_then(|t| i32::try_from(t).ok()).is_none() {
            return Err(EngineError::Request(format!(
                "a step of {} sequences with more than {} tokens in total (i32 cu_seqlens)",
                items.len(),
                i32::MAX
            )));
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
            let vocab = self.config().vocab_size;
            if let Some(&bad) = it.tokens.iter().find(|&&t| t as usize >= vocab) {
                return Err(EngineError::Request(format!(
                    "token id {bad} of sequence {:?} is outside the vocabulary (size {vocab})",
                    it.seq
                )));
            }
            let max = self.pool.config().max_context;
            if st.len + it.tokens.len() > max {
                return Err(EngineError::Request(format!(
                    "sequence {:?} would reach {} tokens, past the maximum context of {max}",
                    it.seq,
                    st.len + it.tokens.len()
                )));
            }
        }
        // All or nothing over the whole step (session 11: a later item's shortage used to leave
        // the earlier items holding the pages reserved for them).
        let cfg = self.pool.config();
        let need = items.iter().fold(0usize, |acc, it| {
            let st = &self.seqs[&it.seq];
            acc.saturating_add(
                cfg.pages_for(st.len + it.tokens.len()).saturating_sub(st.pages.len()),
            )
        });
        if need > self.pool.free_pages() {
            return Err(EngineError::Capacity(format!(
                "KV cache exhausted: the step needs {need} more pages, {} free of {}",
                self.pool.free_pages(),
                cfg.num_pages
            )));
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
        Ok((ids, batch, want_rows, ranges))
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
        /// Top-K of the next-token distribution after it: K = the request's `logprobs`, or 1
        /// with `logprobs: None` ([`SamplingParams::prompt_logprobs`]).
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

/// Per-request scheduler state.
struct Running {
    seq: Option<SeqId>,
    prefilled: usize,
    out: Vec<u32>,
    done: Option<FinishReason>,
    ttft: Duration,
}

impl Engine {
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
        let vocab = self.config().vocab_size;
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
                    "request {i}: logprobs = {} exceeds the vocabulary ({vocab})",
                    r.params.logprobs.unwrap_or(0)
                )));
            }
        }
        let mut run: Vec<Running> = requests
            .iter()
            .map(|_| Running {
                seq: None,
                prefilled: 0,
                out: Vec::new(),
                done: None,
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

    /// Emit the sampled token, record it, and decide whether the request is done.
    fn accept(
        r: &mut Running,
        req: &Request,
        i: usize,
        pick: Sampled,
        seq_len: usize,
        max_ctx: usize,
        on_event: &mut dyn FnMut(Event),
    ) {
        let Sampled { token: tok, logprob: lp, topk } = pick;
        let topk = req.params.logprobs.map(|_| topk);
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
                            sample_row(logits.row(last), &RowSampling::of(&requests[i].params, 0))?;
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
            // Sampling runs where the logits are (the device for CUDA ranks); only tokens,
            // their log-probabilities and requested top-K lists come back.
            let rows: Vec<RowSampling> = active
                .iter()
                .map(|&i| RowSampling::of(&requests[i].params, run[i].out.len() as u64))
                .collect();
            let picks = self.decode_sample(&items, &rows)?;
            for ((k, &i), pick) in active.iter().enumerate().zip(picks) {
                let seq_len = self.seq_len(items[k].seq).unwrap_or(0);
                Self::accept(&mut run[i], &requests[i], i, pick, seq_len, max_ctx, on_event);
            }
            stats.decode_tokens += active.len();
            stats.decode_steps += 1;
            stats.decode_time += ts.elapsed();
        }
        stats.total_time = t0.elapsed();
        Ok(stats)
    }
}

/// CPU engine builders (single device and tensor-parallel); see [`crate::launch`].
pub use crate::launch::cpu;
