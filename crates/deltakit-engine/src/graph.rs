//! CUDA-graph decode (feature `cuda`): one rank's decode steps replayed from graphs captured per
//! batch bucket, over static buffers, with sampling on the device.
//!
//! What this module owns: the bucket list, the start-up capture, and the choice between replay
//! and eager per step. [`CudaDecodeRunner`] wraps a [`Rank`] on a [`CudaBackend`] and implements
//! [`StepRunner`]; prefill steps go straight to the rank.
//!
//! # Start-up
//! Buckets are [`crate::capacity::capture_buckets`] of [`crate::capacity::DEFAULT_BUCKETS`]
//! (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128) for the engine's slot count: every bucket below the
//! one holding `max_seqs`, and that one. For each bucket, largest first, and each sampling mode
//! ([`SampleMode::Greedy`], [`SampleMode::TopP`]): the bucket's static buffers are created
//! ([`CudaBackend::ensure_static`]: token ids, slots, context lengths, page table, sequence
//! lengths, sampling parameters; sampled ids, top-[`STATIC_TOPK`] lists and a logits copy), one
//! step runs **eagerly** on all-padding inputs (it loads every kernel module, sizes every
//! workspace and, under TP, runs every collective of the bucket's message sizes once — NCCL
//! connects lazily and a first collective inside a capture would wedge); then, in a second pass
//! over all buckets (no capture runs between warm-ups, and captures execute no collective), the
//! same step is **captured** (thread-local capture mode) and instantiated. Activations are allocated
//! inside the capture (`cuMemAllocAsync` becomes a graph memory node), so the graph owns them at
//! fixed addresses. Padding rows (token 0, slot -1, context -1, no pages) read and write nothing
//! of a live sequence: the GDN kernels skip slot -1, `attn.prep` writes no KV for context -1,
//! `attn.decode` returns zeros for sequence length -1.
//!
//! # Serving
//! A decode step of `n` rows replays the smallest bucket `>= n` after copying its inputs into
//! the bucket's static buffers ([`CudaBackend::stage_decode`]); the padded rows' outputs are
//! never read. Runs eagerly instead (same kernels, same static buffers, unpadded) when graphs are
//! off (`--no-graphs`), when capture failed (a warning is printed once, never wrong output), when
//! a row asks for more than [`STATIC_TOPK`] log-probabilities (then the logits come to the host),
//! or when `n` exceeds every bucket. Graphs are dropped before the rank (and so before its
//! communicator).

use std::collections::HashMap;

use deltakit::cudarc::driver::CudaGraph;

use crate::backend::cuda::{CudaBackend, SampleMode, OP_FAMILIES, STATIC_TOPK};
use crate::backend::{StepBatch, StepKind};
use crate::capacity::{capture_buckets, graph_bucket};
use crate::config::ModelConfig;
use crate::error::{EngineError, Result};
pub use crate::launch::GraphOptions;
use crate::model::LogitsRows;
use crate::rank::{Rank, RankReport, StepRunner, WantRows};
use crate::sampling::{RowSampling, Sampled};
use crate::state::CacheConfig;

/// `DELTAKIT_NCU_REPLAY=N` (a profiling aid): the `N`-th graph replay of the process runs between
/// `cuProfilerStart` and `cuProfilerStop`, so `ncu --profile-from-start off --graph-profiling node`
/// profiles exactly one decode step's kernels. Returns whether this replay is that one (the caller
/// stops the profiler after it).
fn ncu_window() -> bool {
    use std::sync::atomic::{AtomicU64, Ordering};
    static WANT: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let Some(want) = *WANT
        .get_or_init(|| std::env::var("DELTAKIT_NCU_REPLAY").ok().and_then(|v| v.parse().ok()))
    else {
        return false;
    };
    if COUNT.fetch_add(1, Ordering::Relaxed) + 1 != want {
        return false;
    }
    // SAFETY: plain driver call on this thread's bound context.
    let _ = unsafe { deltakit::cudarc::driver::sys::cuProfilerStart() };
    true
}

/// `DELTAKIT_REPLAY_TIMING=1` (a profiling aid): each graph replay is bracketed by CUDA events
/// and the runner prints, when dropped, the replays' mean GPU time (first event to last kernel).
/// Its difference to the wall time per decode step (`deltakit bench` prints that) is the host
/// turnaround between steps (token read-back, scheduling, input staging, launch).
fn replay_timing_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("DELTAKIT_REPLAY_TIMING").is_ok_and(|v| v == "1"))
}

/// Accumulated replay timing (see [`replay_timing_on`]).
#[derive(Default)]
struct ReplayTiming {
    events: Option<(deltakit::cudarc::driver::CudaEvent, deltakit::cudarc::driver::CudaEvent)>,
    gpu_ms: f64,
    replays: u64,
}

impl std::fmt::Debug for ReplayTiming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplayTiming").field("replays", &self.replays).finish_non_exhaustive()
    }
}

/// The sampling mode a decode step needs: greedy when every row is greedy (the kernels'
/// definition: temperature NaN, `<= 0` or too small to invert).
fn mode_of(rows: &[RowSampling]) -> SampleMode {
    if rows.iter().all(|r| deltakit_ref::sample::inverse_temperature(r.temperature).is_none()) {
        SampleMode::Greedy
    } else {
        SampleMode::TopP
    }
}

/// One CUDA rank with decode graphs (see the module docs). Field order: graphs drop first.
pub struct CudaDecodeRunner {
    graphs: HashMap<(usize, SampleMode), CudaGraph>,
    rank: Rank<CudaBackend>,
    buckets: Vec<usize>,
    enabled: bool,
    max_pages: usize,
    max_context: usize,
    vocab_local: usize,
    /// Why graphs were turned off at start-up, if they were.
    disabled_reason: Option<String>,
    /// Op timing on: decode runs eagerly.
    profiling: bool,
    /// `DELTAKIT_REPLAY_TIMING=1` only.
    timing: ReplayTiming,
}

impl Drop for CudaDecodeRunner {
    fn drop(&mut self) {
        let t = &self.timing;
        if t.replays > 0 {
            eprintln!(
                "replay timing: {} replays, GPU {:.3} ms per replay (events)",
                t.replays,
                t.gpu_ms / t.replays as f64
            );
        }
    }
}

impl CudaDecodeRunner {
    /// Wrap `rank` (pools sized by `cache`) and, if `opts.enabled`, capture every bucket's
    /// graphs now. A capture failure turns graphs off with a warning on stderr (the engine then
    /// serves eagerly); errors of the eager warm-up steps are returned.
    ///
    /// # Errors
    /// Device errors of the warm-up steps.
    pub fn new(rank: Rank<CudaBackend>, cache: CacheConfig, opts: &GraphOptions) -> Result<Self> {
        let cfg = rank.model().config();
        let tp = rank.model().plan().tp;
        let mut r = Self {
            graphs: HashMap::new(),
            buckets: capture_buckets(&opts.buckets, cache.max_seqs),
            enabled: opts.enabled,
            max_pages: cache.max_context.div_ceil(cache.page_size).max(1),
            max_context: cache.max_context,
            vocab_local: cfg.vocab_size / tp.max(1),
            disabled_reason: None,
            timing: ReplayTiming::default(),
            profiling: false,
            rank,
        };
        if r.enabled {
            r.capture_all()?;
        }
        Ok(r)
    }

    /// The wrapped rank.
    #[must_use]
    pub fn rank(&self) -> &Rank<CudaBackend> {
        &self.rank
    }

    /// Buckets with captured graphs (empty when graphs are off).
    #[must_use]
    pub fn captured_buckets(&self) -> Vec<usize> {
        let mut v: Vec<usize> = self.graphs.keys().map(|k| k.0).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Why graphs are off, if they were turned off by a failed capture.
    #[must_use]
    pub fn disabled_reason(&self) -> Option<&str> {
        self.disabled_reason.as_deref()
    }

    fn padding_step(rows: usize) -> (Vec<u32>, StepBatch, Vec<RowSampling>) {
        let batch = StepBatch {
            kind: StepKind::Decode,
            cu_seqlens: (0..=rows as i32).collect(),
            slots: vec![-1; rows],
            ctx_lens: vec![-1; rows],
            positions: vec![0; rows],
            page_table: vec![-1; rows],
            max_pages: 1,
        };
        let s = RowSampling { temperature: 0.0, top_p: 1.0, seed: 0, counter: 0, topk: 0 };
        (vec![0; rows], batch, vec![s; rows])
    }

    /// Forward the staged (padded) step and sample into the bucket's static outputs.
    fn forward_and_sample(
        &mut self,
        ids: &[u32],
        batch: &StepBatch,
        mode: SampleMode,
    ) -> Result<()> {
        let logits = self.rank.forward_device(ids, batch, LogitsRows::All)?;
        self.rank.backend().sample_static(&logits, mode)
    }

    /// Two passes: every bucket's eager warm-up first (so workspaces reach their final size and,
    /// under TP, every collective a rank will ever replay has run once on all ranks), then every
    /// capture (which executes no collective: a rank whose capture fails serves eagerly without
    /// leaving its peers waiting).
    fn capture_all(&mut self) -> Result<()> {
        let buckets: Vec<usize> = self.buckets.iter().rev().copied().collect();
        let modes = [SampleMode::Greedy, SampleMode::TopP];
        for &b in &buckets {
            let be = self.rank.backend();
            be.ensure_static(b, self.max_pages, self.max_context, self.vocab_local, false)?;
            for mode in modes {
                let (ids, batch, rows) = Self::padding_step(b);
                let (pids, pb) = self.rank.backend().stage_decode(b, &ids, &batch, &rows)?;
                self.forward_and_sample(&pids, &pb, mode)?;
                self.rank.backend().stream().synchronize().map_err(|e| EngineError::Backend {
                    backend: "cuda",
                    msg: format!("warm-up of bucket {b}: {e}"),
                })?;
            }
        }
        for &b in &buckets {
            for mode in modes {
                let (ids, batch, rows) = Self::padding_step(b);
                let (pids, pb) = self.rank.backend().stage_decode(b, &ids, &batch, &rows)?;
                match self.capture(b, &pids, &pb, mode) {
                    Ok(g) => {
                        self.graphs.insert((b, mode), g);
                    }
                    Err(e) => {
                        let why = format!("capture of bucket {b} ({mode:?}) failed: {e}");
                        eprintln!("warning: CUDA graphs disabled, decoding eagerly: {why}");
                        self.graphs.clear();
                        self.enabled = false;
                        self.disabled_reason = Some(why);
                        return self.rank.backend().unstage();
                    }
                }
            }
        }
        self.rank.backend().unstage()
    }

    fn capture(
        &mut self,
        b: usize,
        ids: &[u32],
        batch: &StepBatch,
        mode: SampleMode,
    ) -> Result<CudaGraph> {
        self.rank.backend().begin_capture()?;
        let body = self.forward_and_sample(ids, batch, mode);
        // Always end the capture, so the stream leaves capture mode even after an error.
        let graph = self.rank.backend().end_capture();
        body?;
        let g = graph?.ok_or_else(|| EngineError::Backend {
            backend: "cuda",
            msg: format!("bucket {b}: empty capture"),
        })?;
        g.upload().map_err(|e| EngineError::Backend { backend: "cuda", msg: e.to_string() })?;
        Ok(g)
    }
}

impl StepRunner for CudaDecodeRunner {
    fn step(&mut self, ids: &[u32], batch: &StepBatch, rows: &WantRows) -> Result<Vec<f32>> {
        self.rank.backend().unstage()?;
        self.rank.step(ids, batch, rows)
    }

    fn decode_sample(
        &mut self,
        ids: &[u32],
        batch: &StepBatch,
        rows: &[RowSampling],
    ) -> Result<Vec<Sampled>> {
        let n = rows.len();
        if rows.iter().any(|r| r.topk > STATIC_TOPK) || batch.max_pages > self.max_pages {
            // Long top-K lists: logits to the host, sampled there (same semantics).
            self.rank.backend().unstage()?;
            return self.rank.decode_sample(ids, batch, rows);
        }
        let mode = mode_of(rows);
        let bucket = if self.enabled { graph_bucket(&self.buckets, n) } else { n };
        let be = self.rank.backend();
        // Without graphs the step runs unpadded: one set of static buffers, sized for `n`.
        be.ensure_static(
            bucket,
            self.max_pages,
            self.max_context,
            self.vocab_local,
            !self.enabled,
        )?;
        let (pids, pb) = be.stage_decode(bucket, ids, batch, rows)?;
        let res = match self.graphs.get(&(bucket, mode)) {
            Some(g) if self.enabled && !self.profiling => {
                let ncu = ncu_window();
                let timed = replay_timing_on();
                if timed && self.timing.events.is_none() {
                    let ctx = be.stream().context();
                    // Timing events (cudarc's default flags disable timing).
                    let f = Some(deltakit::cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
                    if let (Ok(a), Ok(b)) = (ctx.new_event(f), ctx.new_event(f)) {
                        self.timing.events = Some((a, b));
                    }
                }
                if let Some((a, _)) = self.timing.events.as_ref().filter(|_| timed) {
                    let _ = a.record(be.stream());
                }
                let r = g.launch().map_err(|e| EngineError::Backend {
                    backend: "cuda",
                    msg: format!("graph replay of bucket {bucket}: {e}"),
                });
                if let Some((a, b)) = self.timing.events.as_ref().filter(|_| timed) {
                    if b.record(be.stream()).is_ok() {
                        if let Ok(ms) = a.elapsed_ms(b) {
                            self.timing.gpu_ms += f64::from(ms);
                            self.timing.replays += 1;
                        }
                    }
                }
                if ncu {
                    // SAFETY: plain driver call on this thread's bound context.
                    let _ = unsafe { deltakit::cudarc::driver::sys::cuProfilerStop() };
                }
                r
            }
            _ => self.forward_and_sample(&pids, &pb, mode),
        };
        let out = res.and_then(|()| self.rank.backend().read_static(rows, mode));
        self.rank.backend().unstage()?;
        out
    }

    fn reset_slot(&mut self, slot: usize) -> Result<()> {
        self.rank.reset_slot(slot)
    }

    fn profile(&mut self, on: Option<bool>) -> Result<Option<Vec<(&'static str, f64)>>> {
        if let Some(on) = on {
            self.profiling = on;
            self.rank.backend().set_profiling(on);
            return Ok(Some(Vec::new()));
        }
        let ms = self.rank.backend().take_profile()?;
        Ok(Some(OP_FAMILIES.iter().copied().zip(ms).collect()))
    }

    fn config(&self) -> &ModelConfig {
        self.rank.config()
    }

    fn name(&self) -> String {
        let g = if self.enabled && !self.graphs.is_empty() { "graphs" } else { "eager" };
        format!("{} ({g})", self.rank.name())
    }

    fn reports(&self) -> Vec<RankReport> {
        self.rank.reports()
    }
}
