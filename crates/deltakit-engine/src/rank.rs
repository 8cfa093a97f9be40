//! One rank of a (possibly tensor-parallel) model: what a forward step needs that is local to a
//! device — the backend (with its communicator), the model shard and the state pools — behind
//! the object-safe [`StepRunner`] trait that the scheduler ([`crate::generate::Engine`]) drives.
//!
//! Data flows one way: config -> [`crate::shard::ShardPlan`] -> [`Rank`] (this module) -> layer
//! ([`crate::model::Qwen35`]) -> op ([`Backend`]). A [`Rank`] run in the caller's thread is the
//! single-device engine; [`crate::executor::Executor`] runs one per thread and implements
//! [`StepRunner`] for the whole group.
//!
//! The scheduler owns slot and page assignment for all ranks (the same slot index and page ids
//! on every rank: a rank's pools hold its own heads of every sequence), so a rank only executes.

use std::sync::Arc;

use crate::backend::{Backend, StepBatch};
use crate::comm::AbortHandle;
use crate::config::ModelConfig;
use crate::error::{EngineError, Result};
use crate::model::{LogitsRows, ModelCaches, Qwen35};
use crate::sampling::{sample_rows, RowSampling, Sampled};
use crate::state::CacheConfig;

/// Which logits rows a step returns (owned, so it can cross to rank threads).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WantRows {
    /// None: the layers run (state update), the LM head does not.
    Nothing,
    /// Every new token's row.
    All,
    /// These token rows, in order.
    Rows(Vec<usize>),
}

/// Memory a rank holds, for `bench` and the tensor-parallel tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankReport {
    /// Rank index.
    pub rank: usize,
    /// Backend name (`cpu`, `cuda:3`).
    pub device: String,
    /// Bytes of the weights this rank holds (its shards + replicated tensors).
    pub weight_bytes: u64,
    /// Bytes of this rank's state pools: GDN recurrent (f32) + conv state and the paged KV cache.
    pub state_bytes: u64,
    /// State bytes of one sequence slot at full context on this rank (GDN slot + its KV pages).
    pub state_bytes_per_seq: u64,
    /// Largest host tensor this rank's loader materialized, bytes (f32 staging).
    pub peak_host_staging_bytes: u64,
}

/// Fault injection for the tensor-parallel fault tests: what a rank does at a given layer of a
/// step. Not for production use.
#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// Return an error before running this layer.
    ErrorAt {
        /// Layer index.
        layer: usize,
    },
    /// Panic before running this layer.
    PanicAt {
        /// Layer index.
        layer: usize,
    },
    /// Sleep this long before running this layer (never reaching the layer's collective in time).
    StallAt {
        /// Layer index.
        layer: usize,
        /// How long.
        dur: std::time::Duration,
    },
    /// `fault`, only in the rank's forward step number `step` (0-based: the first prefill is
    /// step 0), so that a fault can hit mid-decode.
    AtStep {
        /// Forward step index.
        step: usize,
        /// The fault of that step.
        fault: Box<Fault>,
    },
}

/// Run the injected fault of layer `layer` of forward step `step`, if any.
fn fault_hook(fault: Option<&Fault>, layer: usize, step: usize) -> Result<()> {
    match fault {
        Some(Fault::AtStep { step: s, fault }) if *s == step => {
            fault_hook(Some(fault), layer, step)
        }
        Some(Fault::ErrorAt { layer: l }) if *l == layer => Err(EngineError::Backend {
            backend: "fault",
            msg: format!("injected error at layer {layer}"),
        }),
        Some(Fault::PanicAt { layer: l }) if *l == layer => {
            panic!("injected panic at layer {layer}")
        }
        Some(Fault::StallAt { layer: l, dur }) if *l == layer => {
            std::thread::sleep(*dur);
            Ok(())
        }
        _ => Ok(()),
    }
}

/// What the scheduler asks of the ranks, one call per step for the whole group.
pub trait StepRunner {
    /// One forward step (see [`Qwen35::forward`]); returns the requested logits rows on the host,
    /// f32 `[rows, vocab]` (the whole vocabulary, gathered across ranks), empty for
    /// [`WantRows::Nothing`].
    ///
    /// # Errors
    /// Backend, communicator and rank errors; after an error the touched sequences' states are
    /// unspecified.
    fn step(&mut self, ids: &[u32], batch: &StepBatch, rows: &WantRows) -> Result<Vec<f32>>;

    /// One decode step (one new token per row) that samples row `i` per `rows[i]` and returns
    /// only the sampled tokens, log-probabilities and requested top-K lists. The default runs
    /// [`StepRunner::step`] and samples the logits rows on the host ([`sample_rows`]); device
    /// runners sample on the device with the same semantics.
    ///
    /// # Errors
    /// As [`StepRunner::step`]; [`EngineError::Request`] for a NaN logit row.
    fn decode_sample(
        &mut self,
        ids: &[u32],
        batch: &StepBatch,
        rows: &[RowSampling],
    ) -> Result<Vec<Sampled>> {
        let logits = self.step(ids, batch, &WantRows::All)?;
        sample_rows(&logits, self.config().vocab_size, rows)
    }

    /// Per-op-family GPU timing of decode steps (`deltakit bench --breakdown`): `Some(on)` turns
    /// it on (decode then runs eagerly, CUDA events around every op) or off; `None` only reads.
    /// Returns `(family, milliseconds)` accumulated since the previous call, or `None` where the
    /// runner cannot time ops (the CPU backend, the multi-rank executor).
    ///
    /// # Errors
    /// Device errors.
    fn profile(&mut self, on: Option<bool>) -> Result<Option<Vec<(&'static str, f64)>>> {
        let _ = on;
        Ok(None)
    }

    /// Zero GDN state slot `slot` on every rank (a new sequence starts from zero state).
    ///
    /// # Errors
    /// Backend / rank errors.
    fn reset_slot(&mut self, slot: usize) -> Result<()>;

    /// The (global) model config.
    fn config(&self) -> &ModelConfig;

    /// Backend name, with the TP size when > 1 (`cpu`, `cuda:0`, `cpu x2`).
    fn name(&self) -> String;

    /// Per-rank memory reports, in rank order.
    fn reports(&self) -> Vec<RankReport>;
}

/// One rank: backend, model shard and state pools (fields drop in this order: pools and weights
/// before the backend, whose communicator goes last).
pub struct Rank<B: Backend> {
    caches: ModelCaches<B>,
    model: Qwen35<B>,
    be: B,
    page_size: usize,
    report: RankReport,
    fault: Option<Fault>,
    /// Forward steps run so far (for [`Fault::AtStep`]).
    steps: usize,
}

impl<B: Backend> Rank<B> {
    /// A rank for `model` (its shard, loaded on `be`) with pools sized by `cache` (allocated now,
    /// at the rank's local head counts).
    ///
    /// # Errors
    /// [`EngineError::Capacity`] for bad cache sizes ([`CacheConfig::validate`]);
    /// backend allocation errors.
    pub fn new(be: B, model: Qwen35<B>, cache: CacheConfig) -> Result<Self> {
        cache.validate()?;
        let caches = model.new_caches(&be, cache.max_seqs, cache.num_pages, cache.page_size)?;
        let local = model.plan().local_config(model.config());
        let elem = be.elem_bytes();
        let one = CacheConfig::for_sequences(1, cache.max_context, cache.page_size);
        let report = RankReport {
            rank: model.plan().rank,
            device: be.name(),
            weight_bytes: model.local_params() as u64 * elem as u64,
            state_bytes: cache.memory_bytes(&local, elem),
            state_bytes_per_seq: one.memory_bytes(&local, elem),
            peak_host_staging_bytes: model.peak_staging_bytes(),
        };
        Ok(Self { caches, model, be, page_size: cache.page_size, report, fault: None, steps: 0 })
    }

    /// Inject a fault into every later step (fault tests only).
    pub fn set_fault(&mut self, fault: Option<Fault>) {
        self.fault = fault;
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.be
    }

    /// The model shard.
    pub fn model(&self) -> &Qwen35<B> {
        &self.model
    }

    /// The rank's state pools (tests inspect them).
    pub fn caches(&self) -> &ModelCaches<B> {
        &self.caches
    }

    /// One forward step returning the LM head output on the backend (this rank's vocabulary
    /// slice, `[rows, vocab / tp]`) instead of gathering it to the host; the fault hook applies.
    ///
    /// # Errors
    /// As [`StepRunner::step`].
    pub fn forward_device(
        &mut self,
        ids: &[u32],
        batch: &StepBatch,
        rows: LogitsRows<'_>,
    ) -> Result<B::Tensor> {
        let fault = self.fault.clone();
        let step = self.steps;
        self.steps += 1;
        let mut hook = |layer: usize| fault_hook(fault.as_ref(), layer, step);
        self.model.forward_with(
            &self.be,
            ids,
            batch,
            &mut self.caches,
            rows,
            self.page_size,
            &mut hook,
        )
    }

    /// The communicator's abort handle, if the backend has one.
    pub fn abort_handle(&self) -> Option<Arc<dyn AbortHandle>> {
        self.be.abort_handle()
    }
}

impl<B: Backend> StepRunner for Rank<B> {
    fn step(&mut self, ids: &[u32], batch: &StepBatch, rows: &WantRows) -> Result<Vec<f32>> {
        let sel = match rows {
            WantRows::Nothing => LogitsRows::Rows(&[]),
            WantRows::All => LogitsRows::All,
            WantRows::Rows(r) => LogitsRows::Rows(r),
        };
        let t = self.forward_device(ids, batch, sel)?;
        if *rows == WantRows::Nothing {
            return Ok(Vec::new());
        }
        self.be.gather_cols_to_host(&t)
    }

    /// As the trait's default, except that ranks other than 0 only run the step (its all-gather
    /// included) and skip the host sampling, whose result only rank 0 reports.
    fn decode_sample(
        &mut self,
        ids: &[u32],
        batch: &StepBatch,
        rows: &[RowSampling],
    ) -> Result<Vec<Sampled>> {
        let logits = self.step(ids, batch, &WantRows::All)?;
        if self.model.plan().rank != 0 {
            return Ok(Vec::new());
        }
        sample_rows(&logits, self.config().vocab_size, rows)
    }

    fn reset_slot(&mut self, slot: usize) -> Result<()> {
        for g in &mut self.caches.gdn {
            self.be.reset_gdn_slot(g, slot)?;
        }
        Ok(())
    }

    fn config(&self) -> &ModelConfig {
        self.model.config()
    }

    fn name(&self) -> String {
        self.be.name()
    }

    fn reports(&self) -> Vec<RankReport> {
        vec![self.report.clone()]
    }
}
