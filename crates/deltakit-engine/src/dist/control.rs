//! The control plane of the one-process-per-rank launch: rank 0's scheduler drives the other
//! processes' ranks through the existing [`Executor`] / [`StepRunner`] abstraction.
//!
//! - On rank 0, [`start_group`] starts an [`Executor`] of `world` rank threads: rank 0's thread
//!   builds the local rank; rank `r`'s thread holds a [`RemoteRank`], a [`StepRunner`] that
//!   sends each command (the step's token ids and [`StepBatch`]: positions, slots, context
//!   lengths, page table; the logits rows or sampling rows; a slot reset; shutdown) over the
//!   control connection to rank `r`'s process and waits for its reply (ok, or the error as
//!   text). The executor is unchanged: it sends every command to all ranks before awaiting any
//!   reply, poisons itself on the first error, and its watchdog aborts every rank's abort
//!   handle — for a [`RemoteRank`] that shuts its control connection down, which the remote
//!   process sees as the end of the run.
//! - Rank 0 writes a heartbeat frame on every control connection every [`HEARTBEAT_EVERY`]
//!   (a background thread; the writes share a lock with the commands), so it keeps flowing
//!   while rank 0 loads, computes a long step or sits between steps. At the end of the process
//!   (after the engine is dropped) rank 0's `main` calls [`finish`], which sends the final
//!   shutdown carrying the run's outcome: ok, or `failed: <reason>` (rank 0 failed after the
//!   rendezvous: a bad prompt, an unwritable output file, ...), which fails every other rank too.
//! - On every other rank, [`serve`] builds the local rank behind an executor of one (so that a
//!   panic, an error and the watchdog are handled exactly as in-process), replies `ready` (with
//!   its memory report) or the start-up error, then executes commands until `shutdown` (ok:
//!   `Ok(())`; rank 0's failure: an error naming it). A step error is replied and ends the
//!   process's loop with that error (its executor is poisoned). The end of the control
//!   connection without `shutdown` (rank 0 died or gave up), or no frame at all (not even a
//!   heartbeat) for [`silence_limit`] (max of `--step-timeout` and three heartbeats: rank 0 is
//!   stopped or unreachable), aborts the local communicator (so a rank blocked in a collective
//!   returns) and fails.
//!
//! Replies carry no data: rank 0's thread is the one that returns logits / samples (ranks other
//! than 0 only run the step, their collectives included).

use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::rendezvous::Group;
use super::wire::{io_text, read_frame, write_frame, Dec, Enc};
use crate::backend::{StepBatch, StepKind};
use crate::comm::AbortHandle;
use crate::config::ModelConfig;
use crate::error::{EngineError, Result};
use crate::executor::{Executor, ExecutorOptions, RankFactory, RankWorker};
use crate::rank::{RankReport, StepRunner, WantRows};
use crate::sampling::{RowSampling, Sampled};

const READY: u8 = 20;
const STEP: u8 = 21;
const DECODE: u8 = 22;
const RESET: u8 = 23;
const SHUTDOWN: u8 = 24;
const REPLY: u8 = 25;
const HEARTBEAT: u8 = 26;

/// How often rank 0 sends a heartbeat frame on every control connection (from a background
/// thread, so it keeps flowing while rank 0 computes a long step or loads).
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);

/// How long a rank other than 0 waits for any frame (a command or a heartbeat) from rank 0
/// before it gives up: the step timeout, and at least three heartbeats.
#[must_use]
pub fn silence_limit(step_timeout: Duration) -> Duration {
    step_timeout.max(HEARTBEAT_EVERY * 3)
}

/// The write half of a control connection: commands, heartbeats and the final shutdown are
/// written under its lock, so frames never interleave.
type Writer = Arc<Mutex<TcpStream>>;

/// Rank 0's control connections that are still owed a final shutdown frame: registered when a
/// remote rank reported ready, heartbeated by [`heartbeat_thread`], and told the run's outcome
/// by [`finish`] (a proxy dropped while unhealthy removes its connection and shuts it).
static LINKS: Mutex<Vec<Writer>> = Mutex::new(Vec::new());

fn links() -> std::sync::MutexGuard<'static, Vec<Writer>> {
    LINKS.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn lock(w: &Writer) -> std::sync::MutexGuard<'_, TcpStream> {
    w.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Start (once per process) the thread that writes a heartbeat on every registered control
/// connection every [`HEARTBEAT_EVERY`].
fn heartbeat_thread() {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        let _ = std::thread::Builder::new().name("deltakit-heartbeat".into()).spawn(|| loop {
            std::thread::sleep(HEARTBEAT_EVERY);
            let ws: Vec<Writer> = links().clone();
            for w in ws {
                let _ = write_frame(&lock(&w), &[HEARTBEAT]);
            }
        });
    });
}

/// Rank 0, at the end of the process: tell every rank process still connected how the run
/// ended (`Ok`: they exit 0; `Err(reason)`: they exit non-zero with `rank 0 failed: reason`),
/// then close the connections. Call it after the engine is dropped and before exiting; a rank 0
/// that exits without calling it (a crash) just closes the connections, which the other ranks
/// also treat as a failure. Does nothing in a process that is not rank 0 of a group.
pub fn finish(outcome: std::result::Result<(), &str>) {
    let ws: Vec<Writer> = std::mem::take(&mut *links());
    let mut e = Enc::tag(SHUTDOWN);
    encode_result(&mut e, outcome);
    for w in ws {
        let s = lock(&w);
        let _ = s.set_write_timeout(Some(Duration::from_secs(1)));
        let _ = write_frame(&s, &e.0);
        let _ = s.shutdown(Shutdown::Write);
    }
}

/// Builds this process's rank (its backend, communicator, shard and pools) inside the rank
/// thread of the executor; the rank's global index is known to the closure.
pub type LocalFactory = Arc<dyn Fn() -> Result<RankWorker> + Send + Sync>;

fn encode_batch(e: &mut Enc, ids: &[u32], b: &StepBatch) {
    e.u32s(ids);
    e.u8(match b.kind {
        StepKind::Prefill => 0,
        StepKind::Decode => 1,
    });
    e.i32s(&b.cu_seqlens).i32s(&b.slots).i32s(&b.ctx_lens).i64s(&b.positions);
    e.i32s(&b.page_table).usize(b.max_pages);
}

fn decode_batch(d: &mut Dec<'_>) -> std::result::Result<(Vec<u32>, StepBatch), String> {
    let ids = d.u32s("token ids")?;
    let kind = match d.u8("step kind")? {
        0 => StepKind::Prefill,
        1 => StepKind::Decode,
        k => return Err(format!("step kind {k}")),
    };
    let batch = StepBatch {
        kind,
        cu_seqlens: d.i32s("cu_seqlens")?,
        slots: d.i32s("slots")?,
        ctx_lens: d.i32s("ctx_lens")?,
        positions: d.i64s("positions")?,
        page_table: d.i32s("page_table")?,
        max_pages: d.usize("max_pages")?,
    };
    Ok((ids, batch))
}

fn encode_rows(e: &mut Enc, rows: &WantRows) {
    match rows {
        WantRows::Nothing => {
            e.u8(0);
        }
        WantRows::All => {
            e.u8(1);
        }
        WantRows::Rows(r) => {
            e.u8(2).usizes(r);
        }
    }
}

fn decode_rows(d: &mut Dec<'_>) -> std::result::Result<WantRows, String> {
    Ok(match d.u8("rows kind")? {
        0 => WantRows::Nothing,
        1 => WantRows::All,
        2 => WantRows::Rows(d.usizes("rows")?),
        k => return Err(format!("rows kind {k}")),
    })
}

fn encode_sampling(e: &mut Enc, rows: &[RowSampling]) {
    e.usize(rows.len());
    for r in rows {
        e.f32(r.temperature).f32(r.top_p).u64(r.seed).u64(r.counter).usize(r.topk);
    }
}

fn decode_sampling(d: &mut Dec<'_>) -> std::result::Result<Vec<RowSampling>, String> {
    let n = d.usize("sampling rows")?;
    if n > 1 << 24 {
        return Err(format!("{n} sampling rows"));
    }
    (0..n)
        .map(|_| {
            Ok(RowSampling {
                temperature: d.f32("temperature")?,
                top_p: d.f32("top_p")?,
                seed: d.u64("seed")?,
                counter: d.u64("counter")?,
                topk: d.usize("topk")?,
            })
        })
        .collect()
}

fn encode_result(e: &mut Enc, r: std::result::Result<(), &str>) {
    match r {
        Ok(()) => {
            e.u8(1);
        }
        Err(msg) => {
            e.u8(0).str(msg);
        }
    }
}

fn encode_report(e: &mut Enc, r: &RankReport) {
    e.usize(r.rank).str(&r.device).u64(r.weight_bytes).u64(r.state_bytes);
    e.u64(r.state_bytes_per_seq).u64(r.peak_host_staging_bytes);
}

fn decode_report(d: &mut Dec<'_>) -> std::result::Result<RankReport, String> {
    Ok(RankReport {
        rank: d.usize("rank")?,
        device: d.str("device")?,
        weight_bytes: d.u64("weight bytes")?,
        state_bytes: d.u64("state bytes")?,
        state_bytes_per_seq: d.u64("state bytes per seq")?,
        peak_host_staging_bytes: d.u64("staging bytes")?,
    })
}

/// Shuts a [`RemoteRank`]'s control connection down (the remote process sees the end of the
/// run and fails; this process's thread blocked on the reply returns).
#[derive(Debug)]
struct LinkAbort {
    stream: TcpStream,
    reason: Mutex<Option<String>>,
}

impl LinkAbort {
    fn reason(&self) -> Option<String> {
        self.reason.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

impl AbortHandle for LinkAbort {
    fn abort(&self, reason: &str) {
        let mut r = self.reason.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if r.is_none() {
            *r = Some(reason.to_string());
        }
        drop(r);
        let _ = self.stream.shutdown(Shutdown::Both);
    }

    fn is_aborted(&self) -> bool {
        self.reason().is_some()
    }
}

/// Rank 0's proxy of another process's rank (see the module docs): a [`StepRunner`] whose
/// steps run in that process.
pub struct RemoteRank {
    rank: usize,
    /// The read half (replies).
    stream: TcpStream,
    /// The write half (commands), shared with the heartbeat and [`finish`].
    writer: Writer,
    cfg: ModelConfig,
    name: String,
    reports: Vec<RankReport>,
    link: Arc<LinkAbort>,
    /// Set once the whole group started: only then does dropping this proxy tell the remote
    /// process to shut down cleanly (otherwise the connection just ends: the remote fails).
    healthy: Arc<AtomicBool>,
}

impl std::fmt::Debug for RemoteRank {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteRank").field("rank", &self.rank).finish_non_exhaustive()
    }
}

impl RemoteRank {
    /// Wait (at most `timeout`) for rank `rank`'s process to report that its rank is built, over
    /// its control connection `stream`.
    ///
    /// # Errors
    /// [`EngineError::Rank`] naming `rank`: its start-up error, a lost connection or the
    /// timeout.
    pub fn wait_ready(
        rank: usize,
        stream: TcpStream,
        cfg: ModelConfig,
        timeout: Duration,
        healthy: Arc<AtomicBool>,
    ) -> Result<Self> {
        let err = |msg: String| EngineError::Rank { rank, msg };
        stream
            .set_read_timeout(Some(timeout.max(Duration::from_millis(1))))
            .map_err(|e| err(format!("control connection: {e}")))?;
        let frame = read_frame(&stream).map_err(|e| {
            err(format!(
                "no start-up report within {:.0}s ({}): the process failed, exited or is still \
                 loading",
                timeout.as_secs_f64(),
                io_text(&e)
            ))
        })?;
        stream.set_read_timeout(None).map_err(|e| err(format!("control connection: {e}")))?;
        let mut d = Dec::new(&frame);
        let parsed = (|| -> std::result::Result<std::result::Result<_, String>, String> {
            if d.u8("tag")? != READY {
                return Err("expected a start-up report".into());
            }
            if d.u8("ok")? == 0 {
                return Ok(Err(d.str("error")?));
            }
            let name = d.str("name")?;
            let n = d.usize("reports")?;
            let reports = (0..n.min(64))
                .map(|_| decode_report(&mut d))
                .collect::<std::result::Result<_, _>>()?;
            Ok(Ok((name, reports)))
        })();
        let (name, reports) = match parsed {
            Ok(Ok(v)) => v,
            Ok(Err(msg)) => return Err(err(format!("start-up failed: {msg}"))),
            Err(msg) => return Err(err(format!("malformed start-up report: {msg}"))),
        };
        let link = Arc::new(LinkAbort {
            stream: stream.try_clone().map_err(|e| err(format!("control connection: {e}")))?,
            reason: Mutex::new(None),
        });
        // A stalled remote process whose socket buffer is full must not block the heartbeat
        // (and the other connections' heartbeats) forever.
        stream
            .set_write_timeout(Some(timeout.max(Duration::from_secs(10))))
            .map_err(|e| err(format!("control connection: {e}")))?;
        let writer: Writer = Arc::new(Mutex::new(
            stream.try_clone().map_err(|e| err(format!("control connection: {e}")))?,
        ));
        links().push(writer.clone());
        heartbeat_thread();
        Ok(Self { rank, stream, writer, cfg, name, reports, link, healthy })
    }

    /// The handle that shuts this proxy's control connection down.
    #[must_use]
    pub fn abort_handle(&self) -> Arc<dyn AbortHandle> {
        self.link.clone()
    }

    /// Send one command and wait for its reply.
    fn call(&mut self, payload: &[u8]) -> Result<()> {
        let rank = self.rank;
        if let Some(why) = self.link.reason() {
            return Err(EngineError::Rank {
                rank,
                msg: format!("control connection aborted: {why}"),
            });
        }
        let lost = |e: std::io::Error, link: &LinkAbort| EngineError::Rank {
            rank,
            msg: match link.reason() {
                Some(why) => format!("control connection aborted: {why}"),
                None => format!(
                    "control connection lost ({}): the rank's process exited or was killed",
                    io_text(&e)
                ),
            },
        };
        write_frame(&lock(&self.writer), payload).map_err(|e| lost(e, &self.link))?;
        let frame = read_frame(&self.stream).map_err(|e| lost(e, &self.link))?;
        let mut d = Dec::new(&frame);
        let parsed = (|| -> std::result::Result<std::result::Result<(), String>, String> {
            if d.u8("tag")? != REPLY {
                return Err("expected a reply".into());
            }
            Ok(if d.u8("ok")? == 1 { Ok(()) } else { Err(d.str("error")?) })
        })();
        match parsed {
            Ok(Ok(())) => Ok(()),
            Ok(Err(msg)) => Err(EngineError::Rank { rank, msg }),
            Err(msg) => Err(EngineError::Rank { rank, msg: format!("malformed reply: {msg}") }),
        }
    }
}

impl StepRunner for RemoteRank {
    /// Runs the step on the remote rank; returns no logits (rank 0's thread returns them).
    fn step(&mut self, ids: &[u32], batch: &StepBatch, rows: &WantRows) -> Result<Vec<f32>> {
        let mut e = Enc::tag(STEP);
        encode_batch(&mut e, ids, batch);
        encode_rows(&mut e, rows);
        self.call(&e.0)?;
        Ok(Vec::new())
    }

    /// Runs the decode step on the remote rank; returns no samples (rank 0 samples).
    fn decode_sample(
        &mut self,
        ids: &[u32],
        batch: &StepBatch,
        rows: &[RowSampling],
    ) -> Result<Vec<Sampled>> {
        let mut e = Enc::tag(DECODE);
        encode_batch(&mut e, ids, batch);
        encode_sampling(&mut e, rows);
        self.call(&e.0)?;
        Ok(Vec::new())
    }

    fn reset_slot(&mut self, slot: usize) -> Result<()> {
        let mut e = Enc::tag(RESET);
        e.usize(slot);
        self.call(&e.0)
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

impl Drop for RemoteRank {
    /// A healthy group leaves the connection registered: [`finish`] tells the remote process
    /// how the whole run ended (rank 0 may still fail after its engine is dropped). Otherwise
    /// the connection is closed now (the remote process fails).
    fn drop(&mut self) {
        if self.healthy.load(Ordering::SeqCst) && !self.link.is_aborted() {
            return;
        }
        links().retain(|w| !Arc::ptr_eq(w, &self.writer));
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

/// Start this process's part of `group` (see the module docs): on rank 0 an [`Executor`] over
/// the local rank and a [`RemoteRank`] per other rank, returned for the scheduler; on every
/// other rank, serve rank 0's commands until it shuts the group down, then `Ok(None)`.
///
/// `local` builds this process's rank (inside the rank thread); `opts.step_timeout` bounds the
/// start-up (every rank ready) and each step, on every process.
///
/// # Errors
/// Rank 0: the executor's start-up errors (a remote rank's start-up error names that rank).
/// Other ranks: [`serve`]'s errors.
pub fn start_group(
    mut group: Group,
    cfg: &ModelConfig,
    local: LocalFactory,
    opts: ExecutorOptions,
) -> Result<Option<Executor>> {
    let control = group.take_control();
    if group.rank != 0 {
        let stream = control
            .into_iter()
            .next()
            .ok_or_else(|| EngineError::Comm("no control connection to rank 0".into()))?;
        serve(group.rank, &stream, &local, opts)?;
        return Ok(None);
    }
    let healthy = Arc::new(AtomicBool::new(false));
    let links: Arc<Mutex<Vec<Option<TcpStream>>>> =
        Arc::new(Mutex::new(std::iter::once(None).chain(control.into_iter().map(Some)).collect()));
    let (cfg, h) = (cfg.clone(), healthy.clone());
    let factory: RankFactory = Arc::new(move |rank| {
        if rank == 0 {
            return local();
        }
        let stream = links
            .lock()
            .map_err(|_| EngineError::Comm("control connection list poisoned".into()))?
            .get_mut(rank)
            .and_then(Option::take)
            .ok_or_else(|| EngineError::Rank { rank, msg: "no control connection".into() })?;
        let remote =
            RemoteRank::wait_ready(rank, stream, cfg.clone(), opts.step_timeout, h.clone())?;
        let abort = Some(remote.abort_handle());
        Ok(RankWorker { runner: Box::new(remote), abort })
    });
    let ex = Executor::start(group.world, &factory, opts)?;
    healthy.store(true, Ordering::SeqCst);
    Ok(Some(ex))
}

/// `e` as the text a remote rank replies with: the local executor (a group of one) labels its
/// only rank 0 or itself; the label is dropped (rank 0 names the remote rank).
fn remote_text(e: &EngineError) -> String {
    match e {
        EngineError::Rank { rank: 0, msg } => msg.clone(),
        EngineError::Rank { rank: usize::MAX, msg } => format!("(its own executor) {msg}"),
        other => other.to_string(),
    }
}

/// One command or the end of the control connection, from the reader thread.
enum Event {
    Frame(Vec<u8>),
    Closed(String),
}

/// Run one command frame on `ex`: `Ok(None)` for shutdown, `Ok(Some(result))` for a step /
/// decode / reset, `Err` for a malformed frame.
fn execute(ex: &mut Executor, frame: &[u8]) -> std::result::Result<Option<Result<()>>, String> {
    let mut d = Dec::new(frame);
    Ok(Some(match d.u8("tag")? {
        STEP => {
            let (ids, batch) = decode_batch(&mut d)?;
            let rows = decode_rows(&mut d)?;
            ex.step(&ids, &batch, &rows).map(|_| ())
        }
        DECODE => {
            let (ids, batch) = decode_batch(&mut d)?;
            let rows = decode_sampling(&mut d)?;
            ex.decode_sample(&ids, &batch, &rows).map(|_| ())
        }
        RESET => ex.reset_slot(d.usize("slot")?),
        SHUTDOWN => {
            if d.u8("outcome")? == 1 {
                return Ok(None);
            }
            let why = d.str("reason")?;
            Err(EngineError::Comm(format!("rank 0 failed after the rendezvous: {why}")))
        }
        t => return Err(format!("unknown command tag {t}")),
    }))
}

/// Read `control` in a thread, forwarding frames; at the end of the connection (without a
/// shutdown command) fire the local communicator's abort (so a rank blocked in a collective
/// returns) and report it.
fn spawn_reader(
    rank: usize,
    control: &TcpStream,
    abort: Arc<Mutex<Option<Arc<dyn AbortHandle>>>>,
    silence: Duration,
) -> Result<mpsc::Receiver<Event>> {
    let (tx, rx) = mpsc::channel::<Event>();
    let reader = control
        .try_clone()
        .map_err(|e| EngineError::Comm(format!("rank {rank}: control connection: {e}")))?;
    reader
        .set_read_timeout(Some(silence))
        .map_err(|e| EngineError::Comm(format!("rank {rank}: control connection: {e}")))?;
    std::thread::Builder::new()
        .name(format!("deltakit-control-{rank}"))
        .spawn(move || loop {
            match read_frame(&reader) {
                Ok(f) if f.first() == Some(&HEARTBEAT) => {}
                Ok(f) => {
                    let shutdown = f.first() == Some(&SHUTDOWN);
                    if tx.send(Event::Frame(f)).is_err() || shutdown {
                        return;
                    }
                }
                Err(e) => {
                    let why = if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) {
                        format!(
                            "rank {rank}: no message from rank 0 within {:.0}s (no heartbeat \
                             either): rank 0 is stalled or unreachable; aborting",
                            silence.as_secs_f64()
                        )
                    } else {
                        format!(
                            "rank {rank}: the control connection to rank 0 ended ({}): rank 0 \
                             exited, failed or aborted the group",
                            io_text(&e)
                        )
                    };
                    if let Some(a) = abort.lock().ok().and_then(|a| a.clone()) {
                        a.abort(&why);
                    }
                    let _ = tx.send(Event::Closed(why));
                    return;
                }
            }
        })
        .map_err(|e| EngineError::Comm(format!("rank {rank}: cannot spawn a thread: {e}")))?;
    Ok(rx)
}

/// Serve rank 0's commands as rank `rank` over `control` (see the module docs): build the
/// local rank with `local` (reporting ready or the start-up error), then run steps until
/// `shutdown`.
///
/// # Errors
/// The start-up error; the first step error (also replied to rank 0); [`EngineError::Comm`]
/// when the control connection ends without `shutdown` or carries a malformed command.
pub fn serve(
    rank: usize,
    control: &TcpStream,
    local: &LocalFactory,
    opts: ExecutorOptions,
) -> Result<()> {
    let abort: Arc<Mutex<Option<Arc<dyn AbortHandle>>>> = Arc::new(Mutex::new(None));
    let (slot, build) = (abort.clone(), local.clone());
    let factory: RankFactory = Arc::new(move |_| {
        let w = build()?;
        if let Ok(mut s) = slot.lock() {
            s.clone_from(&w.abort);
        }
        Ok(w)
    });
    let reply = |payload: &[u8]| {
        write_frame(control, payload).map_err(|e| {
            EngineError::Comm(format!("rank {rank}: writing to rank 0's control connection: {e}"))
        })
    };
    let silence = silence_limit(opts.step_timeout);
    let mut ex = match Executor::start(1, &factory, opts) {
        Ok(ex) => ex,
        Err(e) => {
            let mut m = Enc::tag(READY);
            m.u8(0).str(&remote_text(&e));
            let _ = reply(&m.0);
            return Err(e);
        }
    };
    let mut m = Enc::tag(READY);
    m.u8(1).str(&ex.name());
    let reports = ex.reports();
    m.usize(reports.len());
    for r in &reports {
        encode_report(&mut m, r);
    }
    reply(&m.0)?;
    let rx = spawn_reader(rank, control, abort, silence)?;
    loop {
        let frame = match rx.recv() {
            Ok(Event::Frame(f)) => f,
            Ok(Event::Closed(why)) => return Err(EngineError::Comm(why)),
            Err(_) => return Err(EngineError::Comm(format!("rank {rank}: control reader gone"))),
        };
        let shutdown = frame.first() == Some(&SHUTDOWN);
        let result = match execute(&mut ex, &frame) {
            Ok(None) => return Ok(()),
            Ok(Some(Err(e))) if shutdown => return Err(e),
            Ok(Some(r)) => r,
            Err(msg) => {
                let e = EngineError::Comm(format!("rank {rank}: malformed command: {msg}"));
                let mut m = Enc::tag(REPLY);
                encode_result(&mut m, Err(&e.to_string()));
                let _ = reply(&m.0);
                return Err(e);
            }
        };
        let mut m = Enc::tag(REPLY);
        match &result {
            Ok(()) => encode_result(&mut m, Ok(())),
            Err(e) => encode_result(&mut m, Err(&remote_text(e))),
        }
        let sent = reply(&m.0);
        if let Err(e) = result {
            return Err(EngineError::Rank { rank, msg: remote_text(&e) });
        }
        sent?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_round_trip() {
        let b = StepBatch {
            kind: StepKind::Decode,
            cu_seqlens: vec![0, 1, 2],
            slots: vec![3, -1],
            ctx_lens: vec![5, 6],
            positions: vec![5, 6],
            page_table: vec![0, 1, -1, 2],
            max_pages: 2,
        };
        let rows = vec![RowSampling { temperature: 0.5, top_p: 0.9, seed: 7, counter: 2, topk: 3 }];
        let mut e = Enc::tag(DECODE);
        encode_batch(&mut e, &[9, 10], &b);
        encode_sampling(&mut e, &rows);
        encode_rows(&mut e, &WantRows::Rows(vec![1, 4]));
        let mut d = Dec::new(&e.0);
        assert_eq!(d.u8("tag").unwrap(), DECODE);
        let (ids, b2) = decode_batch(&mut d).unwrap();
        assert_eq!((ids, b2), (vec![9, 10], b));
        assert_eq!(decode_sampling(&mut d).unwrap(), rows);
        assert_eq!(decode_rows(&mut d).unwrap(), WantRows::Rows(vec![1, 4]));
        assert!(d.is_done());
    }

    /// A rank other than 0 keeps waiting while rank 0's heartbeat flows (longer than its
    /// silence limit), and gives up with a clear error once rank 0 goes silent.
    #[test]
    fn tp_control_heartbeat_keeps_followers_alive_and_silence_fails_them() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let root = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (follower, _) = l.accept().unwrap();
        let writer: Writer = Arc::new(Mutex::new(root.try_clone().unwrap()));
        links().push(writer.clone());
        heartbeat_thread();
        let silence = HEARTBEAT_EVERY * 3;
        let rx = spawn_reader(1, &follower, Arc::new(Mutex::new(None)), silence).unwrap();
        // Rank 0 "computes" for longer than the silence limit: only heartbeats flow.
        assert!(rx.recv_timeout(silence + HEARTBEAT_EVERY * 2).is_err(), "tripped while alive");
        // Rank 0 stalls (no heartbeat): the follower fails within the silence limit.
        links().retain(|w| !Arc::ptr_eq(w, &writer));
        let t0 = std::time::Instant::now();
        match rx.recv_timeout(silence * 2) {
            Ok(Event::Closed(why)) => {
                assert!(why.contains("no message from rank 0 within 3s"), "{why}");
            }
            _ => panic!("no silence error"),
        }
        assert!(t0.elapsed() <= silence + HEARTBEAT_EVERY * 2, "{:?}", t0.elapsed());
        drop(root);
    }

    /// The final shutdown carries rank 0's outcome: a failure fails the other ranks.
    #[test]
    fn tp_control_shutdown_carries_rank0_failure() {
        let mut e = Enc::tag(SHUTDOWN);
        encode_result(&mut e, Err("token id 99999 is outside the vocabulary"));
        let mut d = Dec::new(&e.0);
        assert_eq!(d.u8("tag").unwrap(), SHUTDOWN);
        assert_eq!(d.u8("ok").unwrap(), 0);
        assert!(d.str("why").unwrap().contains("99999"));
    }
}
