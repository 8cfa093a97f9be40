//! The CPU backend's communicator between ranks in separate processes: the CPU stand-in for
//! NCCL across processes, as [`crate::comm::CpuComm`]'s in-process group is within one process.
//! [`crate::comm::CpuComm::over_tcp`] wraps it so that the CPU backend uses it unchanged.
//!
//! Topology: a star through rank 0 over the rendezvous's data connections (one TCP connection
//! between rank 0 and every other rank, `TCP_NODELAY`). A collective: every rank other than 0
//! sends its contribution (widened to f32, as `CpuComm` does) to rank 0; rank 0 reads them in
//! rank order, checks that every rank is in the same collective (kind, sequence number, length),
//! computes the result — the sum in rank order `0, 1, ...` with the same expression as
//! `CpuComm` ([`crate::comm::sum_in_rank_order`]), or the concatenation for an all-gather —
//! and sends it back; every rank rounds the f32 result to its element type. So results are
//! bit-identical to the in-process `CpuComm` of the same world size, on every rank.
//!
//! Failure: a connection that breaks (a process died) or an [`AbortHandle::abort`] (which shuts
//! every connection down, so that a rank blocked reading returns at once) aborts the group for
//! good; every later collective returns [`EngineError::Comm`]. Ranks in a collective with a
//! different kind or length get an error frame from rank 0 and all return an error (the group
//! stays usable, as `CpuComm`'s does). There is no timeout of its own: the executor's watchdog
//! aborts a collective that waits too long.
//!
//! Traffic is `O(world x n)` f32 through rank 0 per collective: a test and development path,
//! not a fast one.

use std::net::{Shutdown, TcpStream};
use std::sync::{Arc, Mutex, MutexGuard};

use super::wire::{io_text, read_frame, write_frame, Dec, Enc};
use crate::comm::{sum_in_rank_order, AbortHandle};
use crate::error::{EngineError, Result};

const CONTRIB: u8 = 1;
const RESULT: u8 = 2;
const ERROR: u8 = 3;

/// The kind of a collective, checked by rank 0 to be the same on every rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    AllReduce = 1,
    AllGather = 2,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::AllReduce => "all_reduce",
            Op::AllGather => "all_gather",
        }
    }
}

fn comm_err(msg: String) -> EngineError {
    EngineError::Comm(msg)
}

/// Shared by a [`TcpComm`] and its abort handles: the reason of the abort and clones of the
/// connections to shut down.
#[derive(Debug)]
struct Abort {
    reason: Mutex<Option<String>>,
    streams: Vec<TcpStream>,
}

impl Abort {
    fn reason(&self) -> Option<String> {
        self.reason.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

impl AbortHandle for Abort {
    fn abort(&self, reason: &str) {
        let mut r = self.reason.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if r.is_none() {
            *r = Some(reason.to_string());
        }
        drop(r);
        for s in &self.streams {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    fn is_aborted(&self) -> bool {
        self.reason().is_some()
    }
}

/// One rank's end of a TCP communicator group (see the module docs).
#[derive(Debug)]
pub struct TcpComm {
    rank: usize,
    world: usize,
    /// Rank 0: the connections to ranks `1..world`, in rank order. Other ranks: `[rank 0]`.
    links: Vec<TcpStream>,
    abort: Arc<Abort>,
    /// Collectives issued so far; held for the duration of one collective (frames of two
    /// collectives must not interleave).
    seq: Mutex<u64>,
}

impl TcpComm {
    /// Rank `rank` of `world` over `links` (rank 0: one connection per other rank, in rank
    /// order; another rank: its connection to rank 0), as the rendezvous made them.
    ///
    /// # Errors
    /// [`EngineError::Comm`] for a wrong number of links or a socket that cannot be cloned.
    pub fn new(rank: usize, world: usize, links: Vec<TcpStream>) -> Result<Self> {
        let want = match (world, rank) {
            (1, 0) => 0,
            (_, 0) => world - 1,
            (w, r) if r < w => 1,
            _ => return Err(comm_err(format!("tcp communicator: rank {rank} >= world {world}"))),
        };
        if links.len() != want {
            return Err(comm_err(format!(
                "tcp communicator: rank {rank} of {world} needs {want} connections, got {}",
                links.len()
            )));
        }
        let streams = links
            .iter()
            .map(TcpStream::try_clone)
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(|e| comm_err(format!("tcp communicator: cloning a socket: {e}")))?;
        Ok(Self {
            rank,
            world,
            links,
            abort: Arc::new(Abort { reason: Mutex::new(None), streams }),
            seq: Mutex::new(0),
        })
    }

    /// This rank.
    #[must_use]
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks in the group.
    #[must_use]
    pub fn world_size(&self) -> usize {
        self.world
    }

    /// The group's abort handle (shuts this rank's connections down; the other ranks see the
    /// connections end and abort too).
    #[must_use]
    pub fn abort_handle(&self) -> Arc<dyn AbortHandle> {
        self.abort.clone()
    }

    /// Sum `mine` over the ranks in rank order; returns the f32 sums (every rank the same bits).
    ///
    /// # Errors
    /// [`EngineError::Comm`]: aborted group, lost connection, or a rank with another length.
    pub fn all_reduce_f32(&self, mine: Vec<f32>) -> Result<Vec<f32>> {
        if self.world == 1 {
            return Ok(mine);
        }
        self.collective(Op::AllReduce, mine)
    }

    /// Every rank's `mine` concatenated in rank order.
    ///
    /// # Errors
    /// [`EngineError::Comm`]: aborted group, lost connection, or a rank with another length.
    pub fn all_gather_f32(&self, mine: Vec<f32>) -> Result<Vec<f32>> {
        if self.world == 1 {
            return Ok(mine);
        }
        self.collective(Op::AllGather, mine)
    }

    fn lock_seq(&self) -> MutexGuard<'_, u64> {
        self.seq.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn aborted_err(&self) -> Option<EngineError> {
        self.abort.reason().map(|why| comm_err(format!("communicator aborted: {why}")))
    }

    /// A broken connection: abort the group (so every other rank's wait ends) and report it.
    fn lost(&self, peer: usize, op: Op, seq: u64, e: &std::io::Error) -> EngineError {
        if let Some(err) = self.aborted_err() {
            return err;
        }
        let msg = format!(
            "rank {}: connection to rank {peer} lost in {} #{seq} ({}): rank {peer} exited, was \
             killed, or aborted",
            self.rank,
            op.name(),
            io_text(e)
        );
        self.abort.abort(&msg);
        comm_err(msg)
    }

    fn collective(&self, op: Op, mine: Vec<f32>) -> Result<Vec<f32>> {
        let mut seq = self.lock_seq();
        if let Some(e) = self.aborted_err() {
            return Err(e);
        }
        *seq += 1;
        let s = *seq;
        if self.rank == 0 {
            self.root(op, s, mine)
        } else {
            self.leaf(op, s, &mine)
        }
    }

    fn root(&self, op: Op, seq: u64, mine: Vec<f32>) -> Result<Vec<f32>> {
        let n = mine.len();
        let mut all = Vec::with_capacity(self.world);
        all.push(mine);
        let mut bad: Option<String> = None;
        for (i, link) in self.links.iter().enumerate() {
            let peer = i + 1;
            let frame = read_frame(link).map_err(|e| self.lost(peer, op, seq, &e))?;
            let parsed = (|| -> std::result::Result<(u8, u8, u64, Vec<f32>), String> {
                let mut d = Dec::new(&frame);
                Ok((d.u8("tag")?, d.u8("op")?, d.u64("seq")?, d.f32s("data")?))
            })();
            match parsed {
                Ok((CONTRIB, o, sq, data)) if o == op as u8 && sq == seq && data.len() == n => {
                    all.push(data);
                }
                Ok((CONTRIB, o, sq, data)) => {
                    bad.get_or_insert(format!(
                        "rank {peer} is in collective #{sq} (kind {o}, {} elements) while rank 0 \
                         is in {} #{seq} ({n} elements)",
                        data.len(),
                        op.name()
                    ));
                    all.push(data);
                }
                Ok((tag, ..)) => {
                    let msg = format!("rank {peer} sent frame tag {tag} instead of a contribution");
                    self.abort.abort(&msg);
                    return Err(comm_err(msg));
                }
                Err(e) => {
                    let msg = format!("rank {peer}: malformed collective frame: {e}");
                    self.abort.abort(&msg);
                    return Err(comm_err(msg));
                }
            }
        }
        let (reply, out) = if let Some(msg) = bad {
            let mut e = Enc::tag(ERROR);
            e.str(&msg);
            (e, Err(comm_err(format!("collective with mismatched ranks: {msg}"))))
        } else {
            let out = match op {
                Op::AllReduce => sum_in_rank_order(&all),
                Op::AllGather => all.concat(),
            };
            let mut e = Enc::tag(RESULT);
            e.u64(seq).f32s(&out);
            (e, Ok(out))
        };
        for (i, link) in self.links.iter().enumerate() {
            write_frame(link, &reply.0).map_err(|e| self.lost(i + 1, op, seq, &e))?;
        }
        out
    }

    fn leaf(&self, op: Op, seq: u64, mine: &[f32]) -> Result<Vec<f32>> {
        let root = &self.links[0];
        let mut e = Enc::tag(CONTRIB);
        e.u8(op as u8).u64(seq).f32s(mine);
        write_frame(root, &e.0).map_err(|e| self.lost(0, op, seq, &e))?;
        let frame = read_frame(root).map_err(|e| self.lost(0, op, seq, &e))?;
        let mut d = Dec::new(&frame);
        let parsed = (|| -> std::result::Result<Result<Vec<f32>>, String> {
            match d.u8("tag")? {
                RESULT => {
                    let sq = d.u64("seq")?;
                    if sq != seq {
                        return Err(format!("result of collective #{sq}, expected #{seq}"));
                    }
                    Ok(Ok(d.f32s("data")?))
                }
                ERROR => Ok(Err(comm_err(format!(
                    "collective with mismatched ranks: {}",
                    d.str("message")?
                )))),
                tag => Err(format!("frame tag {tag} instead of a result")),
            }
        })();
        parsed.unwrap_or_else(|msg| {
            let msg = format!("rank {}: from rank 0: {msg}", self.rank);
            self.abort.abort(&msg);
            Err(comm_err(msg))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::{Communicator, CpuComm};
    use half::bf16;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use std::net::TcpListener;

    /// `world` TCP communicators over loopback connections (a star through rank 0).
    pub(crate) fn loopback(world: usize) -> Vec<TcpComm> {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let mut leaves = Vec::new();
        let mut root_links = Vec::new();
        for _ in 1..world {
            let c = TcpStream::connect(addr).unwrap();
            let (s, _) = l.accept().unwrap();
            c.set_nodelay(true).unwrap();
            s.set_nodelay(true).unwrap();
            leaves.push(c);
            root_links.push(s);
        }
        let mut out = vec![TcpComm::new(0, world, root_links).unwrap()];
        for (i, c) in leaves.into_iter().enumerate() {
            out.push(TcpComm::new(i + 1, world, vec![c]).unwrap());
        }
        out
    }

    /// Run `f(rank, comm)` on every rank of both groups in threads; results per rank.
    fn on_ranks<C: Sync, R: Send>(comms: &[C], f: impl Fn(usize, &C) -> R + Sync) -> Vec<R> {
        std::thread::scope(|s| {
            let f = &f;
            let hs: Vec<_> =
                comms.iter().enumerate().map(|(r, c)| s.spawn(move || f(r, c))).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    /// Over random inputs (odd lengths, empty, world 1/2/3/4/8), the TCP communicator's
    /// all-reduce and all-gather equal the in-process `CpuComm`'s bit for bit, on every rank, in
    /// f32 and bf16.
    #[test]
    fn tp_tcp_comm_is_bit_identical_to_cpu_comm() {
        let seed = rand::random::<u64>();
        let mut rng = StdRng::seed_from_u64(seed);
        for world in [1usize, 2, 3, 4, 8] {
            let tcp: Vec<CpuComm> = loopback(world).into_iter().map(CpuComm::over_tcp).collect();
            let local = CpuComm::group(world);
            for len in [0usize, 1, 7, 33, 1001] {
                let inputs: Vec<Vec<f32>> = (0..world)
                    .map(|_| {
                        (0..len).map(|_| rng.gen_range(-1e3f32..1e3) * rng.gen::<f32>()).collect()
                    })
                    .collect();
                let run = |comms: &[CpuComm]| {
                    on_ranks(comms, |r, c| {
                        let mut buf = inputs[r].clone();
                        Communicator::<[f32]>::all_reduce_sum(c, &mut buf[..]).unwrap();
                        let mut g = vec![f32::NAN; len * world];
                        Communicator::<[f32]>::all_gather(c, &inputs[r][..], &mut g[..]).unwrap();
                        let mut hb: Vec<bf16> =
                            inputs[r].iter().map(|&x| bf16::from_f32(x)).collect();
                        Communicator::<[bf16]>::all_reduce_sum(c, &mut hb[..]).unwrap();
                        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        (bits(&buf), bits(&g), hb.iter().map(|x| x.to_bits()).collect::<Vec<_>>())
                    })
                };
                let (a, b) = (run(&tcp), run(&local));
                assert_eq!(a, b, "world {world} len {len} seed {seed}");
                for r in &a {
                    assert_eq!(r, &a[0], "every rank the same bits");
                }
            }
        }
    }

    #[test]
    fn tp_tcp_mismatched_lengths_fail_on_every_rank_and_the_group_survives() {
        let comms: Vec<CpuComm> = loopback(3).into_iter().map(CpuComm::over_tcp).collect();
        let r = on_ranks(&comms, |r, c| {
            let mut b = vec![1.0f32; 2 + usize::from(r == 2)];
            Communicator::<[f32]>::all_reduce_sum(c, &mut b[..])
        });
        assert!(r.iter().all(Result::is_err), "{r:?}");
        let r = on_ranks(&comms, |r, c| {
            let mut b = vec![r as f32; 2];
            Communicator::<[f32]>::all_reduce_sum(c, &mut b[..]).map(|()| b)
        });
        for x in r {
            assert_eq!(x.unwrap(), vec![3.0, 3.0]);
        }
    }

    /// A rank that dies (its end dropped) fails the next collective on every other rank at
    /// once, and the failure sticks; an abort wakes a rank blocked in a collective.
    #[test]
    fn tp_tcp_lost_rank_and_abort_end_collectives() {
        let mut comms = loopback(3);
        drop(comms.pop()); // rank 2 dies
        let t0 = std::time::Instant::now();
        let r = on_ranks(&comms, |_, c| c.all_reduce_f32(vec![1.0]));
        assert!(t0.elapsed() < std::time::Duration::from_secs(2));
        for e in &r {
            let msg = e.as_ref().unwrap_err().to_string();
            assert!(msg.contains("rank 2") || msg.contains("aborted"), "{msg}");
        }
        assert!(comms[1].all_reduce_f32(vec![1.0]).is_err());

        let comms = loopback(2);
        let h = comms[0].abort_handle();
        let r = std::thread::scope(|s| {
            let t = s.spawn(|| comms[1].all_reduce_f32(vec![1.0]));
            std::thread::sleep(std::time::Duration::from_millis(50));
            h.abort("test abort");
            t.join().unwrap()
        });
        assert!(r.is_err());
        let msg = comms[0].all_gather_f32(vec![1.0]).unwrap_err().to_string();
        assert!(msg.contains("test abort"), "{msg}");
    }
}
