//! The tensor-parallel executor: one thread per rank, each owning what is bound to its device
//! (CUDA context, stream, cuBLASLt handle, communicator, weights shard, state pools), driven by
//! commands over channels. It implements [`StepRunner`] for the whole group, so the scheduler
//! ([`crate::generate::Engine`]) is the same for one device and for `tp` ranks.
//!
//! # What it guarantees
//! - **Every step starts on all ranks together**: the command is sent to every rank before any
//!   reply is awaited; ranks meet in the communicator's collectives.
//! - **Fail closed.** A rank that returns an error or panics during a step, a rank thread that
//!   died, or a step that does not finish within the watchdog's time ([`ExecutorOptions::
//!   step_timeout`], default 300 s) **poisons** the executor: the communicator is aborted (so
//!   ranks blocked in a collective return instead of waiting forever — `ncclCommAbort` for NCCL),
//!   the step returns [`EngineError::Rank`] naming the first failing rank (or the watchdog), and
//!   every later call returns the same error without running anything. A poisoned engine must
//!   be rebuilt; the states of the sequences it was running are lost (they may be partially
//!   updated on some ranks, and are never reported as a successful step).
//! - **Shutdown** (drop) sends every rank a stop command; a rank drops its pools and weights
//!   before its backend's communicator. Threads of a healthy executor are joined; threads of a
//!   poisoned one are detached (a rank stuck outside a collective cannot be interrupted).
//!
//! The factory passed to [`Executor::start`] runs *inside* each rank thread: that is where a
//! CUDA context is bound and `ncclCommInitRank` is called (it blocks until all ranks call it).
//!
//! A rank's runner may also stand for a rank in another process: with one process per rank
//! ([`crate::dist`]), rank 0's executor holds [`crate::dist::control::RemoteRank`] proxies for
//! the other ranks (the guarantees above then span processes: an abort shuts the proxies'
//! connections down), and every other process runs its own rank behind an executor of one.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::backend::StepBatch;
use crate::comm::AbortHandle;
use crate::config::ModelConfig;
use crate::error::{EngineError, Result};
use crate::rank::{RankReport, StepRunner, WantRows};
use crate::sampling::{RowSampling, Sampled};

/// Executor settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExecutorOptions {
    /// A step (or start-up) that takes longer than this aborts the communicator and poisons the
    /// executor.
    pub step_timeout: Duration,
}

impl Default for ExecutorOptions {
    fn default() -> Self {
        Self { step_timeout: Duration::from_secs(300) }
    }
}

/// What a rank thread builds for itself: its [`StepRunner`] (usually a [`crate::rank::Rank`])
/// and its communicator's abort handle.
pub struct RankWorker {
    /// The rank's runner.
    pub runner: Box<dyn StepRunner>,
    /// Abort handle of the rank's communicator.
    pub abort: Option<Arc<dyn AbortHandle>>,
}

/// Builds rank `r`'s worker inside its thread.
pub type RankFactory = Arc<dyn Fn(usize) -> Result<RankWorker> + Send + Sync>;

enum Cmd {
    Step { ids: Arc<Vec<u32>>, batch: Arc<StepBatch>, rows: Arc<WantRows> },
    Decode { ids: Arc<Vec<u32>>, batch: Arc<StepBatch>, rows: Arc<Vec<RowSampling>> },
    Reset(usize),
    Stop,
}

/// What a rank sends back (rank 0's results; other ranks send [`Out::Nothing`]).
enum Out {
    Nothing,
    Logits(Vec<f32>),
    Sampled(Vec<Sampled>),
}

struct Reply {
    rank: usize,
    result: Result<Out>,
}

/// What a rank reports once built: config, backend name, memory, abort handle.
type ReadyInfo = (ModelConfig, String, Vec<RankReport>, Option<Arc<dyn AbortHandle>>);

struct Ready {
    rank: usize,
    result: Result<ReadyInfo>,
}

/// `tp` rank threads running one model (see the module docs).
pub struct Executor {
    tp: usize,
    opts: ExecutorOptions,
    cmds: Vec<Sender<Cmd>>,
    replies: Receiver<Reply>,
    threads: Vec<JoinHandle<()>>,
    aborts: Vec<Arc<dyn AbortHandle>>,
    cfg: ModelConfig,
    name: String,
    reports: Vec<RankReport>,
    poisoned: Option<EngineError>,
}

/// `e` as a [`EngineError::Rank`] of `rank` (kept as is when it already names its rank), its
/// message prefixed by `prefix`.
fn rank_error(rank: usize, e: EngineError, prefix: &str) -> EngineError {
    match e {
        e @ EngineError::Rank { .. } => e,
        e => EngineError::Rank { rank, msg: format!("{prefix}{e}") },
    }
}

/// A copy of a rank error (`EngineError` is not `Clone`: it can hold an `io::Error`).
fn clone_rank_error(e: &EngineError) -> EngineError {
    match e {
        EngineError::Rank { rank, msg } => EngineError::Rank { rank: *rank, msg: msg.clone() },
        other => EngineError::Rank { rank: usize::MAX, msg: other.to_string() },
    }
}

/// `now + d`, saturating at ~100 years (a huge `--step-timeout` means "no watchdog").
fn deadline_after(d: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(d)
        .or_else(|| now.checked_add(Duration::from_secs(100 * 365 * 86_400)))
        .unwrap_or(now)
}

fn panic_msg(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".into())
}

fn rank_loop(rank: usize, worker: RankWorker, cmds: &Receiver<Cmd>, replies: &Sender<Reply>) {
    let mut runner = worker.runner;
    while let Ok(cmd) = cmds.recv() {
        let run = |f: &mut dyn FnMut() -> Result<Out>| -> Result<Out> {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| {
                Err(EngineError::Rank { rank, msg: format!("panicked: {}", panic_msg(&*p)) })
            })
        };
        let result = match cmd {
            Cmd::Stop => break,
            Cmd::Step { ids, batch, rows } => run(&mut || {
                let v = runner.step(&ids, &batch, &rows)?;
                Ok(if rank == 0 { Out::Logits(v) } else { Out::Nothing })
            }),
            Cmd::Decode { ids, batch, rows } => run(&mut || {
                let v = runner.decode_sample(&ids, &batch, &rows)?;
                Ok(if rank == 0 { Out::Sampled(v) } else { Out::Nothing })
            }),
            Cmd::Reset(slot) => run(&mut || runner.reset_slot(slot).map(|()| Out::Nothing)),
        };
        if replies.send(Reply { rank, result }).is_err() {
            break;
        }
    }
    // `runner` drops here, in this thread: pools and weights, then the communicator.
}

impl Executor {
    /// Start `tp` rank threads, each calling `factory(rank)`; waits until every rank is ready
    /// (at most `opts.step_timeout`).
    ///
    /// # Errors
    /// [`EngineError::Config`] for `tp == 0`; the first rank's start-up error; a timeout
    /// ([`EngineError::Rank`]) when a rank does not come up in time (the others are aborted).
    pub fn start(tp: usize, factory: &RankFactory, opts: ExecutorOptions) -> Result<Self> {
        if tp == 0 {
            return Err(EngineError::Config("tp must be >= 1".into()));
        }
        let (reply_tx, replies) = mpsc::channel::<Reply>();
        let (ready_tx, ready_rx) = mpsc::channel::<Ready>();
        let mut cmds = Vec::with_capacity(tp);
        let mut threads = Vec::with_capacity(tp);
        for rank in 0..tp {
            let (tx, rx) = mpsc::channel::<Cmd>();
            cmds.push(tx);
            let (factory, reply_tx, ready_tx) =
                (factory.clone(), reply_tx.clone(), ready_tx.clone());
            let h = std::thread::Builder::new()
                .name(format!("deltakit-rank-{rank}"))
                .spawn(move || {
                    let built =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| factory(rank)))
                            .unwrap_or_else(|p| {
                                Err(EngineError::Rank {
                                    rank,
                                    msg: format!("panicked at start-up: {}", panic_msg(&*p)),
                                })
                            });
                    match built {
                        Ok(worker) => {
                            let info = (
                                worker.runner.config().clone(),
                                worker.runner.name(),
                                worker.runner.reports(),
                                worker.abort.clone(),
                            );
                            if ready_tx.send(Ready { rank, result: Ok(info) }).is_ok() {
                                drop(ready_tx);
                                rank_loop(rank, worker, &rx, &reply_tx);
                            }
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Ready { rank, result: Err(e) });
                        }
                    }
                })
                .map_err(|e| EngineError::Rank {
                    rank,
                    msg: format!("cannot spawn thread: {e}"),
                })?;
            threads.push(h);
        }
        drop(ready_tx);
        let deadline = deadline_after(opts.step_timeout);
        let mut infos: Vec<Option<(ModelConfig, String, Vec<RankReport>)>> = vec![None; tp];
        let mut aborts = Vec::new();
        let mut first_err = None;
        for _ in 0..tp {
            let left = deadline.saturating_duration_since(Instant::now());
            match ready_rx.recv_timeout(left) {
                Ok(Ready { rank, result: Ok((cfg, name, rep, abort)) }) => {
                    infos[rank] = Some((cfg, name, rep));
                    aborts.extend(abort);
                }
                Ok(Ready { rank, result: Err(e) }) => {
                    first_err.get_or_insert(rank_error(rank, e, "start-up failed: "));
                    break;
                }
                Err(_) => {
                    first_err.get_or_insert(EngineError::Rank {
                        rank: usize::MAX,
                        msg: format!(
                            "watchdog: not every rank started within {:?}",
                            opts.step_timeout
                        ),
                    });
                    break;
                }
            }
        }
        if let Some(e) = first_err {
            // Ranks that came up may be blocked in a collective of their start-up: abort, stop,
            // and detach the threads.
            for a in &aborts {
                a.abort(&e.to_string());
            }
            for tx in &cmds {
                let _ = tx.send(Cmd::Stop);
            }
            drop(threads);
            return Err(e);
        }
        let infos: Vec<_> = infos.into_iter().flatten().collect();
        let cfg = infos[0].0.clone();
        let name = if tp == 1 { infos[0].1.clone() } else { format!("{} x{tp}", infos[0].1) };
        let reports = infos.into_iter().flat_map(|i| i.2).collect();
        Ok(Self { tp, opts, cmds, replies, threads, aborts, cfg, name, reports, poisoned: None })
    }

    /// Tensor-parallel size.
    #[must_use]
    pub fn tp(&self) -> usize {
        self.tp
    }

    /// The error that poisoned the executor, if any.
    #[must_use]
    pub fn poisoned(&self) -> Option<&EngineError> {
        self.poisoned.as_ref()
    }

    /// Abort the communicator and remember the first failure (`e` is always a
    /// [`EngineError::Rank`], see [`rank_error`]).
    fn poison(&mut self, e: &EngineError) {
        let why = e.to_string();
        for a in &self.aborts {
            a.abort(&why);
        }
        if self.poisoned.is_none() {
            self.poisoned = Some(clone_rank_error(e));
        }
    }

    fn refuse(&self) -> Result<()> {
        match &self.poisoned {
            Some(EngineError::Rank { rank, msg }) => Err(EngineError::Rank {
                rank: *rank,
                msg: format!("executor poisoned by an earlier failure, refusing the step: {msg}"),
            }),
            _ => Ok(()),
        }
    }

    /// Send `make()` to every rank, then collect one reply per rank within the watchdog time.
    fn broadcast(&mut self, make: &dyn Fn() -> Cmd) -> Result<Out> {
        self.refuse()?;
        for (rank, tx) in self.cmds.iter().enumerate() {
            if tx.send(make()).is_err() {
                let e = EngineError::Rank { rank, msg: "rank thread is gone".into() };
                self.poison(&e);
                return Err(e);
            }
        }
        let deadline = deadline_after(self.opts.step_timeout);
        let mut out = None;
        let mut first_err: Option<EngineError> = None;
        let mut pending = self.tp;
        let mut answered = vec![false; self.tp];
        while pending > 0 {
            // After a failure, give the other ranks a short grace to return from the aborted
            // collective (so their error replies are not left queued), never the full timeout.
            let limit = if first_err.is_some() {
                Duration::from_secs(2).min(deadline.saturating_duration_since(Instant::now()))
            } else {
                deadline.saturating_duration_since(Instant::now())
            };
            match self.replies.recv_timeout(limit) {
                Ok(Reply { rank, result }) => {
                    pending -= 1;
                    if let Some(a) = answered.get_mut(rank) {
                        *a = true;
                    }
                    match result {
                        Ok(v) if rank == 0 => out = Some(v),
                        Ok(_) => {}
                        Err(e) => {
                            if first_err.is_none() {
                                let e = rank_error(rank, e, "");
                                self.poison(&e);
                                first_err = Some(e);
                            }
                        }
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    if first_err.is_none() {
                        let silent: Vec<String> = answered
                            .iter()
                            .enumerate()
                            .filter(|(_, &a)| !a)
                            .map(|(r, _)| r.to_string())
                            .collect();
                        let e = EngineError::Rank {
                            rank: usize::MAX,
                            msg: format!(
                                "watchdog: step did not finish within {:?} ({pending} of {} ranks \
                                 had not answered: rank {}); communicator aborted",
                                self.opts.step_timeout,
                                self.tp,
                                silent.join(", ")
                            ),
                        };
                        self.poison(&e);
                        first_err = Some(e);
                    }
                    break;
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let e =
                        EngineError::Rank { rank: usize::MAX, msg: "rank threads are gone".into() };
                    self.poison(&e);
                    first_err.get_or_insert(e);
                    break;
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => {
                out.ok_or_else(|| EngineError::Rank { rank: 0, msg: "no reply from rank 0".into() })
            }
        }
    }
}

impl StepRunner for Executor {
    fn step(&mut self, ids: &[u32], batch: &StepBatch, rows: &WantRows) -> Result<Vec<f32>> {
        let (ids, batch, rows) =
            (Arc::new(ids.to_vec()), Arc::new(batch.clone()), Arc::new(rows.clone()));
        match self.broadcast(&|| Cmd::Step {
            ids: ids.clone(),
            batch: batch.clone(),
            rows: rows.clone(),
        })? {
            Out::Logits(v) => Ok(v),
            _ => Err(EngineError::Rank { rank: 0, msg: "unexpected reply to a step".into() }),
        }
    }

    fn decode_sample(
        &mut self,
        ids: &[u32],
        batch: &StepBatch,
        rows: &[RowSampling],
    ) -> Result<Vec<Sampled>> {
        let (ids, batch, rows) =
            (Arc::new(ids.to_vec()), Arc::new(batch.clone()), Arc::new(rows.to_vec()));
        match self.broadcast(&|| Cmd::Decode {
            ids: ids.clone(),
            batch: batch.clone(),
            rows: rows.clone(),
        })? {
            Out::Sampled(v) => Ok(v),
            _ => {
                Err(EngineError::Rank { rank: 0, msg: "unexpected reply to a decode step".into() })
            }
        }
    }

    fn reset_slot(&mut self, slot: usize) -> Result<()> {
        self.broadcast(&|| Cmd::Reset(slot)).map(|_| ())
    }

    fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    fn name(&self) -> String {
        self.name.clone()
    }

    fn reports(&self) -> Vec<RankReport> {
        self.reports.clone()
    }
}

impl Drop for Executor {
    fn drop(&mut self) {
        for tx in &self.cmds {
            let _ = tx.send(Cmd::Stop);
        }
        self.cmds.clear();
        let threads = std::mem::take(&mut self.threads);
        if self.poisoned.is_none() {
            for h in threads {
                let _ = h.join();
            }
        }
        // Poisoned: a rank may be stuck outside a collective; its thread is detached.
    }
}
