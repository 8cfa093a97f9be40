//! Collectives between the ranks of a tensor-parallel model: the [`Communicator`] trait, an
//! in-process CPU implementation ([`CpuComm`], threads + a condition variable) that the CPU
//! backend uses so that tensor parallelism runs and is tested without GPUs — also across
//! processes, over TCP ([`CpuComm::over_tcp`], [`crate::dist::tcp_comm`]) — and (feature `cuda`)
//! `nccl::NcclComm` over NCCL through cudarc.
//!
//! What this module owns: the rank/world identity of a communicator, the two collectives the
//! model needs (sum all-reduce in place, all-gather), and **abort**: every communicator hands out
//! an [`AbortHandle`] that another thread (the executor's watchdog, or the thread that saw a rank
//! fail) can fire to make every rank blocked in — or later entering — a collective return
//! [`EngineError::Comm`] instead of waiting forever. An aborted communicator stays aborted.
//!
//! Numerics of [`CpuComm`]: contributions are widened to f32 and summed in rank order (0, 1, ...)
//! once, then rounded to the element type, so every rank gets bit-identical results (NCCL's ring
//! all-reduce sums in another order; results agree to rounding).

use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use deltakit_ref::Elem;

use crate::error::{EngineError, Result};

/// Fires a communicator's abort from any thread (see the module docs).
pub trait AbortHandle: Send + Sync {
    /// Abort: collectives in flight or started later on any rank return an error. Idempotent.
    fn abort(&self, reason: &str);
    /// Whether the communicator was aborted.
    fn is_aborted(&self) -> bool;
}

/// A rank's view of its group's collectives over buffers of type `Buf` (`[T]` on the CPU, a
/// device slice for NCCL).
pub trait Communicator<Buf: ?Sized>: Send {
    /// This rank.
    fn rank(&self) -> usize;
    /// Ranks in the group.
    fn world_size(&self) -> usize;
    /// Sum `buf` over all ranks, in place; every rank passes a buffer of the same length.
    ///
    /// # Errors
    /// [`EngineError::Comm`] if the group was aborted or the lengths differ.
    fn all_reduce_sum(&self, buf: &mut Buf) -> Result<()>;
    /// Concatenate every rank's `send` in rank order into `recv` (`world_size * send.len()`).
    ///
    /// # Errors
    /// [`EngineError::Comm`] if the group was aborted or a length is wrong.
    fn all_gather(&self, send: &Buf, recv: &mut Buf) -> Result<()>;
    /// The group's abort handle.
    fn abort_handle(&self) -> Arc<dyn AbortHandle>;
}

fn comm_err(msg: String) -> EngineError {
    EngineError::Comm(msg)
}

#[derive(Debug, Default)]
struct Round {
    /// Collectives completed so far.
    done: u64,
    /// Contributions of the collective in progress, per rank.
    contrib: Vec<Option<Vec<f32>>>,
    arrived: usize,
    /// The result of collective `done - 1` (every contribution, in rank order).
    result: Arc<Vec<Vec<f32>>>,
    aborted: Option<String>,
}

#[derive(Debug)]
struct Shared {
    world: usize,
    round: Mutex<Round>,
    cv: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Round> {
        // A panic while holding the lock cannot leave `Round` inconsistent in a way that matters
        // more than the abort that follows it: recover the guard.
        self.round.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl AbortHandle for Shared {
    fn abort(&self, reason: &str) {
        let mut r = self.lock();
        if r.aborted.is_none() {
            r.aborted = Some(reason.to_string());
        }
        drop(r);
        self.cv.notify_all();
    }

    fn is_aborted(&self) -> bool {
        self.lock().aborted.is_some()
    }
}

/// The sum over ranks of every element, in rank order (`all[0][i] + all[1][i] + ...`, f32):
/// the one reduction expression of the CPU communicators, so that the in-process group and the
/// TCP group ([`crate::dist::tcp_comm`]) give the same bits.
#[must_use]
pub fn sum_in_rank_order(all: &[Vec<f32>]) -> Vec<f32> {
    let n = all.first().map_or(0, Vec::len);
    (0..n).map(|i| all.iter().map(|c| c[i]).sum()).collect()
}

/// CPU communicator of one rank: in-process (one per rank thread, made together by
/// [`CpuComm::group`]), or across processes over TCP ([`CpuComm::over_tcp`], the
/// one-process-per-rank launch). Both reduce with [`sum_in_rank_order`].
#[derive(Debug, Clone)]
pub struct CpuComm {
    rank: usize,
    inner: Inner,
}

/// Where a [`CpuComm`]'s collectives go.
#[derive(Debug, Clone)]
enum Inner {
    /// Rank threads of one process.
    Local(Arc<Shared>),
    /// Ranks in separate processes.
    Tcp(Arc<crate::dist::tcp_comm::TcpComm>),
}

impl CpuComm {
    /// `world` communicators of one group, rank `i` at index `i`.
    #[must_use]
    pub fn group(world: usize) -> Vec<CpuComm> {
        let shared = Arc::new(Shared {
            world,
            round: Mutex::new(Round { contrib: vec![None; world], ..Round::default() }),
            cv: Condvar::new(),
        });
        (0..world).map(|rank| CpuComm { rank, inner: Inner::Local(shared.clone()) }).collect()
    }

    /// This process's rank of a group of processes, over the TCP connections of the rendezvous
    /// (bit-identical results to [`CpuComm::group`] of the same size).
    #[must_use]
    pub fn over_tcp(tcp: crate::dist::tcp_comm::TcpComm) -> CpuComm {
        CpuComm { rank: tcp.rank(), inner: Inner::Tcp(Arc::new(tcp)) }
    }

    fn world(&self) -> usize {
        match &self.inner {
            Inner::Local(s) => s.world,
            Inner::Tcp(t) => t.world_size(),
        }
    }

    /// Contribute `mine`; return every rank's contribution of this collective, in rank order
    /// (in-process group).
    fn exchange(&self, s: &Shared, mine: Vec<f32>) -> Result<Arc<Vec<Vec<f32>>>> {
        let mut r = s.lock();
        if let Some(why) = &r.aborted {
            return Err(comm_err(format!("communicator aborted: {why}")));
        }
        let round = r.done;
        r.contrib[self.rank] = Some(mine);
        r.arrived += 1;
        if r.arrived == s.world {
            let all: Vec<Vec<f32>> =
                r.contrib.iter_mut().map(|c| c.take().unwrap_or_default()).collect();
            r.result = Arc::new(all);
            r.arrived = 0;
            r.done += 1;
            s.cv.notify_all();
        } else {
            while r.done == round && r.aborted.is_none() {
                r = s.cv.wait(r).unwrap_or_else(std::sync::PoisonError::into_inner);
            }
            if r.done == round {
                let why = r.aborted.clone().unwrap_or_default();
                return Err(comm_err(format!("communicator aborted: {why}")));
            }
        }
        // `result` is replaced only when the next collective completes, which needs this rank's
        // contribution: it still holds this collective's result.
        let res = r.result.clone();
        let n = res.first().map_or(0, Vec::len);
        if res.iter().any(|c| c.len() != n) {
            return Err(comm_err(format!(
                "collective with mismatched lengths: {:?}",
                res.iter().map(Vec::len).collect::<Vec<_>>()
            )));
        }
        Ok(res)
    }
}

impl<T: Elem> Communicator<[T]> for CpuComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world()
    }

    fn all_reduce_sum(&self, buf: &mut [T]) -> Result<()> {
        if self.world() == 1 {
            return Ok(());
        }
        let mine: Vec<f32> = buf.iter().map(|x| x.to_f32()).collect();
        let sums = match &self.inner {
            Inner::Local(s) => sum_in_rank_order(&self.exchange(s, mine)?),
            Inner::Tcp(t) => t.all_reduce_f32(mine)?,
        };
        if sums.len() != buf.len() {
            return Err(comm_err(format!(
                "all_reduce: {} sums for a buffer of {}",
                sums.len(),
                buf.len()
            )));
        }
        for (out, s) in buf.iter_mut().zip(sums) {
            *out = T::from_f32(s);
        }
        Ok(())
    }

    fn all_gather(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let w = self.world();
        if recv.len() != w * send.len() {
            return Err(comm_err(format!(
                "all_gather: recv has {} elements, expected {} x {}",
                recv.len(),
                w,
                send.len()
            )));
        }
        let mine: Vec<f32> = send.iter().map(|x| x.to_f32()).collect();
        let all: Vec<f32> = match &self.inner {
            Inner::Local(s) => self.exchange(s, mine)?.concat(),
            Inner::Tcp(t) => t.all_gather_f32(mine)?,
        };
        if all.len() != recv.len() {
            return Err(comm_err(format!(
                "all_gather: {} gathered elements for {}",
                all.len(),
                recv.len()
            )));
        }
        for (o, x) in recv.iter_mut().zip(all) {
            *o = T::from_f32(x);
        }
        Ok(())
    }

    fn abort_handle(&self) -> Arc<dyn AbortHandle> {
        match &self.inner {
            Inner::Local(s) => s.clone(),
            Inner::Tcp(t) => t.abort_handle(),
        }
    }
}

/// NCCL through cudarc (feature `cuda`).
#[cfg(feature = "cuda")]
pub mod nccl {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    use deltakit::cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
    use deltakit::cudarc::nccl::{result, sys};
    use half::bf16;

    use super::{comm_err, AbortHandle, Communicator};
    use crate::error::Result;

    /// The group's unique id, made once (by rank 0's process) and handed to every rank.
    #[derive(Clone, Copy)]
    pub struct NcclId(sys::ncclUniqueId);

    impl std::fmt::Debug for NcclId {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("NcclId(..)")
        }
    }

    impl NcclId {
        /// Size of the id on the wire, bytes (`ncclUniqueId`: 128).
        pub const BYTES: usize = 128;

        /// The id's bytes, to hand to the other ranks' processes (the rendezvous sends them).
        #[must_use]
        pub fn to_bytes(&self) -> Vec<u8> {
            self.0.internal.iter().map(|&c| c as u8).collect()
        }

        /// The id made by rank 0 from its [`NcclId::to_bytes`].
        ///
        /// # Errors
        /// [`crate::EngineError::Comm`] when `b` is not [`NcclId::BYTES`] long.
        pub fn from_bytes(b: &[u8]) -> Result<Self> {
            if b.len() != Self::BYTES {
                return Err(comm_err(format!(
                    "NCCL unique id of {} bytes, expected {}",
                    b.len(),
                    Self::BYTES
                )));
            }
            let mut id = sys::ncclUniqueId { internal: [0; 128] };
            for (d, &s) in id.internal.iter_mut().zip(b) {
                *d = s as std::ffi::c_char;
            }
            Ok(Self(id))
        }

        /// A fresh unique id (`ncclGetUniqueId`).
        ///
        /// # Errors
        /// [`crate::EngineError::Comm`] if NCCL cannot be loaded or fails.
        pub fn new() -> Result<Self> {
            loaded()?;
            result::get_uniqueid()
                .map(Self)
                .map_err(|e| comm_err(format!("ncclGetUniqueId: {e:?}")))
        }
    }

    /// Whether the NCCL library can be loaded (`deltakit info` reports it), with its version.
    ///
    /// # Errors
    /// [`crate::EngineError::Comm`] naming why not.
    pub fn loaded() -> Result<i32> {
        // cudarc's dynamic loader panics when the library is missing: contain it.
        std::panic::catch_unwind(result::get_nccl_version)
            .map_err(|_| comm_err("libnccl could not be loaded".into()))?
            .map_err(|e| comm_err(format!("ncclGetVersion: {e:?}")))
    }

    /// The raw communicator shared between its rank thread and the abort handle.
    struct Raw {
        comm: Mutex<sys::ncclComm_t>,
        /// The same handle, readable without the lock (abort after the bounded wait).
        handle: usize,
        aborted: AtomicBool,
        reason: Mutex<Option<String>>,
    }

    // SAFETY: an `ncclComm_t` may be used from another thread as long as calls on it are not
    // concurrent, except `ncclCommAbort`, which NCCL documents as the way to unblock a
    // communicator from another thread. Collectives hold the mutex while they enqueue; abort
    // takes it too (with a bounded wait, see `abort`).
    unsafe impl Send for Raw {}
    // SAFETY: as above.
    unsafe impl Sync for Raw {}

    impl AbortHandle for Raw {
        fn abort(&self, reason: &str) {
            if self.aborted.swap(true, Ordering::SeqCst) {
                return;
            }
            if let Ok(mut r) = self.reason.lock() {
                *r = Some(reason.to_string());
            }
            // Collectives hold `comm`'s mutex while they enqueue (never while the stream runs), so
            // the communicator is not freed under an enqueue in progress. An enqueue that never
            // returns must not block the watchdog: after 2 s, abort without the lock.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
            let guard = loop {
                match self.comm.try_lock() {
                    Ok(g) => break Some(g),
                    Err(std::sync::TryLockError::Poisoned(p)) => break Some(p.into_inner()),
                    Err(std::sync::TryLockError::WouldBlock)
                        if std::time::Instant::now() < deadline =>
                    {
                        std::thread::sleep(std::time::Duration::from_millis(1));
                    }
                    Err(std::sync::TryLockError::WouldBlock) => break None,
                }
            };
            let c = match &guard {
                Some(g) => **g,
                None => self.handle as sys::ncclComm_t,
            };
            // SAFETY: `c` is a live communicator (destroyed only in `Drop`, which skips aborted
            // ones); ncclCommAbort may be called from another thread.
            let _ = unsafe { result::comm_abort(c) };
        }

        fn is_aborted(&self) -> bool {
            self.aborted.load(Ordering::SeqCst)
        }
    }

    /// One rank's NCCL communicator; collectives are enqueued on the rank's stream (the
    /// backend's), bf16 sum in place.
    pub struct NcclComm {
        raw: Arc<Raw>,
        stream: Arc<CudaStream>,
        rank: usize,
        world: usize,
    }

    impl std::fmt::Debug for NcclComm {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("NcclComm")
                .field("rank", &self.rank)
                .field("world", &self.world)
                .finish_non_exhaustive()
        }
    }

    impl NcclComm {
        /// `ncclCommInitRank` for `rank` of `world` on `stream`'s device. Call it inside the
        /// rank's thread after its CUDA context is bound; it blocks until every rank has called
        /// it (NCCL's rendezvous).
        ///
        /// # Errors
        /// [`crate::EngineError::Comm`] if NCCL fails.
        pub fn from_rank(
            stream: Arc<CudaStream>,
            rank: usize,
            world: usize,
            id: NcclId,
        ) -> Result<Self> {
            stream
                .context()
                .bind_to_thread()
                .map_err(|e| comm_err(format!("bind context: {e}")))?;
            let mut comm = std::mem::MaybeUninit::uninit();
            let (w, r) = (i32::try_from(world), i32::try_from(rank));
            let (Ok(w), Ok(r)) = (w, r) else {
                return Err(comm_err(format!("rank {rank} / world {world} overflow i32")));
            };
            // SAFETY: `comm` is written by a successful ncclCommInitRank before it is read.
            let comm = unsafe {
                result::comm_init_rank(comm.as_mut_ptr(), w, id.0, r).map_err(|e| {
                    comm_err(format!("ncclCommInitRank rank {rank}/{world}: {e:?}"))
                })?;
                comm.assume_init()
            };
            let raw = Arc::new(Raw {
                handle: comm as usize,
                comm: Mutex::new(comm),
                aborted: AtomicBool::new(false),
                reason: Mutex::new(None),
            });
            Ok(Self { raw, stream, rank, world })
        }

        /// The communicator, locked for the duration of one enqueue (see `Raw::abort`).
        fn live(&self) -> Result<std::sync::MutexGuard<'_, sys::ncclComm_t>> {
            let g = self.raw.comm.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if self.raw.is_aborted() {
                drop(g);
                let why = self.raw.reason.lock().ok().and_then(|r| r.clone()).unwrap_or_default();
                return Err(comm_err(format!("communicator aborted: {why}")));
            }
            Ok(g)
        }
    }

    impl Drop for NcclComm {
        fn drop(&mut self) {
            if !self.raw.aborted.swap(true, Ordering::SeqCst) {
                let c = *self.raw.comm.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                // SAFETY: the communicator is live and no collective is in flight on this
                // thread; after this nothing uses it (the abort handle sees `aborted`).
                let _ = unsafe { result::comm_destroy(c) };
            }
        }
    }

    impl Communicator<CudaSlice<bf16>> for NcclComm {
        fn rank(&self) -> usize {
            self.rank
        }

        fn world_size(&self) -> usize {
            self.world
        }

        fn all_reduce_sum(&self, buf: &mut CudaSlice<bf16>) -> Result<()> {
            let g = self.live()?;
            let c = *g;
            let n = buf.len();
            let (p, _rec) = buf.device_ptr_mut(&self.stream);
            // SAFETY: `p` points to `n` bf16 on this rank's device; the collective runs on the
            // stream that orders every other use of the buffer.
            unsafe {
                result::all_reduce(
                    p as *const _,
                    p as *mut _,
                    n,
                    sys::ncclDataType_t::ncclBfloat16,
                    sys::ncclRedOp_t::ncclSum,
                    c,
                    self.stream.cu_stream().cast(),
                )
            }
            .map(|_| ())
            .map_err(|e| comm_err(format!("ncclAllReduce ({n} bf16): {e:?}")))
        }

        fn all_gather(&self, send: &CudaSlice<bf16>, recv: &mut CudaSlice<bf16>) -> Result<()> {
            let g = self.live()?;
            let c = *g;
            let n = send.len();
            if recv.len() != n * self.world {
                return Err(comm_err(format!(
                    "all_gather: recv has {} elements, expected {} x {n}",
                    recv.len(),
                    self.world
                )));
            }
            let (s, _rs) = send.device_ptr(&self.stream);
            let (r, _rr) = recv.device_ptr_mut(&self.stream);
            // SAFETY: `s` holds `n` and `r` `world * n` bf16 on this device, ordered by the
            // stream.
            unsafe {
                result::all_gather(
                    s as *const _,
                    r as *mut _,
                    n,
                    sys::ncclDataType_t::ncclBfloat16,
                    c,
                    self.stream.cu_stream().cast(),
                )
            }
            .map(|_| ())
            .map_err(|e| comm_err(format!("ncclAllGather ({n} bf16): {e:?}")))
        }

        fn abort_handle(&self) -> Arc<dyn AbortHandle> {
            self.raw.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tp_cpu_all_reduce_and_gather_over_threads() {
        for world in [1usize, 2, 3, 4] {
            let comms = CpuComm::group(world);
            let outs: Vec<(Vec<f32>, Vec<f32>)> = std::thread::scope(|s| {
                let hs: Vec<_> = comms
                    .iter()
                    .map(|c| {
                        s.spawn(move || {
                            let mut out = (Vec::new(), Vec::new());
                            for round in 0..50 {
                                let r = c.rank as f32;
                                let mut buf = vec![r + round as f32, 2.0 * r, 1.0];
                                Communicator::<[f32]>::all_reduce_sum(c, &mut buf).unwrap();
                                let mut g = vec![0.0f32; 2 * world];
                                Communicator::<[f32]>::all_gather(c, &[r, -r], &mut g).unwrap();
                                out = (buf, g);
                            }
                            out
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let w = world as f32;
            let sum_r = w * (w - 1.0) / 2.0;
            for (buf, g) in &outs {
                assert_eq!(buf, &vec![sum_r + 49.0 * w, 2.0 * sum_r, w]);
                let want: Vec<f32> = (0..world).flat_map(|r| [r as f32, -(r as f32)]).collect();
                assert_eq!(g, &want);
            }
        }
    }

    #[test]
    fn tp_abort_wakes_a_waiting_rank_and_sticks() {
        let comms = CpuComm::group(2);
        let h = Communicator::<[f32]>::abort_handle(&comms[0]);
        let c1 = comms[1].clone();
        let t = std::thread::spawn(move || {
            let mut b = vec![1.0f32];
            Communicator::<[f32]>::all_reduce_sum(&c1, &mut b)
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        h.abort("test");
        let e = t.join().unwrap().unwrap_err().to_string();
        assert!(e.contains("aborted: test"), "{e}");
        assert!(h.is_aborted());
        let mut b = vec![1.0f32];
        assert!(Communicator::<[f32]>::all_reduce_sum(&comms[0], &mut b).is_err());
    }

    #[test]
    fn tp_mismatched_lengths_are_an_error() {
        let comms = CpuComm::group(2);
        let r: Vec<Result<()>> = std::thread::scope(|s| {
            let hs: Vec<_> = comms
                .iter()
                .map(|c| {
                    s.spawn(move || {
                        let mut b = vec![1.0f32; 1 + c.rank];
                        Communicator::<[f32]>::all_reduce_sum(c, &mut b)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(r.iter().all(Result::is_err));
    }
}
