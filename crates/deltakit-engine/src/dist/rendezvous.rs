//! The TCP rendezvous of the one-process-per-rank launch (see [`crate::dist`]).
//!
//! Rank 0 listens on `HOST:PORT` (so `HOST` must be an address of rank 0's machine; use the
//! address the other nodes reach it by). Every other rank connects, retrying until the
//! deadline (`--rendezvous-timeout`), and sends a hello: protocol magic and version, its rank,
//! the world size, the most sequences it can hold, and its [`Fingerprint`]. Rank 0 waits until
//! every rank arrived (or the deadline), then checks: the world sizes are equal, no rank joined
//! twice or is out of range, and every fingerprint equals rank 0's field by field. Any failure
//! is sent to every rank that joined, and returned on rank 0, as the same [`DistError`]
//! (naming the rank, the field, expected and actual; or the ranks that did not arrive). Each
//! accepted connection's first frame is read in a thread of its own (at most 10 s, and never
//! past the deadline), so a silent stray connection (a port scanner) cannot delay the real
//! ranks. A rank waits at most `--rendezvous-timeout` (+1 s) after its hello for rank 0's answer
//! (a listener that is not a deltakit rank 0 fails with `timed out waiting for rank 0's
//! reply`). Duplicate ranks: a rank that joins twice before every rank arrived fails the group
//! (`rank 1 joined twice`); a duplicate hello during the data phase is refused with the same
//! error while the group goes on; once the rendezvous is over nothing listens, so a later
//! duplicate cannot connect and fails with [`DistError::Unreachable`] after its own timeout (the
//! running group is not disturbed). The deadlines saturate (a huge timeout means no limit). On
//! success rank 0 sends a welcome: a random session id, the agreed capacity (the minimum over
//! ranks) and the NCCL unique id it made (CUDA). Every rank then opens its data connection
//! (tagged with the session id); rank 0 waits for all of them (same deadline length).
//!
//! The result, a [`Group`], holds one control and one data connection between rank 0 and every
//! other rank ([`crate::dist::control`] and [`crate::dist::tcp_comm`] use them).

use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::tcp_comm::TcpComm;
use super::wire::{read_frame, write_frame, Dec, Enc};
use super::{DistError, Fingerprint};
use crate::error::Result;

/// `"DKRV"`: the first field of every hello, so that a stray connection is told apart.
const MAGIC: u32 = 0x5652_4b44;
/// Version of the frames of [`crate::dist`]; ranks of different versions refuse each other.
pub const PROTOCOL: u32 = 1;

const HELLO: u8 = 1;
const DATA_HELLO: u8 = 2;
const WELCOME: u8 = 3;
const REJECT: u8 = 4;

/// How long rank 0 waits for the first frame of an accepted connection.
const FIRST_FRAME: Duration = Duration::from_secs(10);

/// What a rank brings to the rendezvous.
#[derive(Clone, Debug)]
pub struct RendezvousOptions {
    /// `HOST:PORT` of rank 0 (rank 0 listens there, the others connect).
    pub addr: String,
    /// This process's rank, `0..world`.
    pub rank: usize,
    /// The number of ranks (processes).
    pub world: usize,
    /// Deadline for every rank to arrive (rank 0) or to reach rank 0 (others); each phase
    /// (hellos, data connections) gets it once.
    pub timeout: Duration,
    /// What every rank must agree on (compared with rank 0's).
    pub fingerprint: Fingerprint,
    /// Rank 0 only: bytes handed to every rank (the NCCL unique id on CUDA; `None` on the CPU).
    pub nccl_id: Option<Vec<u8>>,
    /// The most sequences this rank can hold (its capacity plan; `u64::MAX` for no limit). The
    /// group agrees on the minimum ([`Group::capacity`]).
    pub capacity: u64,
}

/// The outcome of a rendezvous: this rank's connections to the group.
#[derive(Debug)]
pub struct Group {
    /// This rank.
    pub rank: usize,
    /// The number of ranks.
    pub world: usize,
    /// Random id of this run, chosen by rank 0.
    pub session: u64,
    /// The bytes rank 0 handed out (the NCCL unique id), if any.
    pub nccl_id: Option<Vec<u8>>,
    /// The minimum of every rank's [`RendezvousOptions::capacity`].
    pub capacity: u64,
    /// `HOST:PORT` of rank 0.
    pub addr: String,
    /// Rank 0: control connections to ranks `1..world` in rank order; others: `[rank 0]`.
    control: Vec<TcpStream>,
    /// The same for the data connections (taken by [`Group::tcp_comm`]).
    data: Vec<TcpStream>,
}

impl Group {
    /// The CPU communicator over this group's data connections (once; later calls fail).
    ///
    /// # Errors
    /// [`crate::EngineError::Comm`] when the connections were already taken.
    pub fn tcp_comm(&mut self) -> Result<TcpComm> {
        if self.world > 1 && self.data.is_empty() {
            return Err(crate::EngineError::Comm("data connections already taken".into()));
        }
        TcpComm::new(self.rank, self.world, std::mem::take(&mut self.data))
    }

    /// The control connections (rank 0: to ranks `1..world` in order; others: `[rank 0]`).
    pub(crate) fn take_control(&mut self) -> Vec<TcpStream> {
        std::mem::take(&mut self.control)
    }
}

fn proto(msg: impl std::fmt::Display) -> DistError {
    DistError::Protocol(msg.to_string())
}

/// Join the group described by `opts` (see the module docs).
///
/// # Errors
/// [`DistError::Bind`] (rank 0 cannot listen), [`DistError::Unreachable`] (rank 0 did not
/// answer in time), [`DistError::Missing`], [`DistError::DuplicateRank`],
/// [`DistError::RankOutOfRange`], [`DistError::Mismatch`] (on every rank that joined),
/// [`DistError::Protocol`] for broken connections and foreign frames, [`DistError::Usage`] for
/// `rank >= world`.
pub fn rendezvous(opts: &RendezvousOptions) -> std::result::Result<Group, DistError> {
    if opts.world == 0 || opts.rank >= opts.world {
        return Err(DistError::Usage(format!(
            "rank {} is outside world size {}",
            opts.rank, opts.world
        )));
    }
    if opts.rank == 0 {
        root(opts)
    } else {
        leaf(opts)
    }
}

/// A hello's contents.
struct Hello {
    rank: usize,
    world: usize,
    capacity: u64,
    fingerprint: Fingerprint,
}

fn encode_hello(opts: &RendezvousOptions) -> Vec<u8> {
    let mut e = Enc::tag(HELLO);
    e.u32(MAGIC).u32(PROTOCOL).usize(opts.rank).usize(opts.world).u64(opts.capacity);
    opts.fingerprint.encode(&mut e);
    e.0
}

/// `Ok(None)`: not this protocol (stray connection); `Err`: this protocol, wrong version.
fn decode_hello(frame: &[u8]) -> std::result::Result<Option<Hello>, DistError> {
    let mut d = Dec::new(frame);
    let head = (|| -> std::result::Result<(u8, u32, u32), String> {
        Ok((d.u8("tag")?, d.u32("magic")?, d.u32("protocol")?))
    })();
    let Ok((HELLO, MAGIC, version)) = head else {
        return Ok(None);
    };
    let (rank, world) = (d.usize("rank").map_err(proto)?, d.usize("world").map_err(proto)?);
    if version != PROTOCOL {
        return Err(DistError::Mismatch {
            rank,
            field: "protocol version".into(),
            expected: PROTOCOL.to_string(),
            actual: version.to_string(),
        });
    }
    let capacity = d.u64("capacity").map_err(proto)?;
    let fingerprint = Fingerprint::decode(&mut d).map_err(proto)?;
    Ok(Some(Hello { rank, world, capacity, fingerprint }))
}

/// `now + d`, saturating far in the future (a huge `--rendezvous-timeout` means "no limit",
/// not an overflow panic).
#[must_use]
pub fn deadline_after(d: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(d)
        .or_else(|| now.checked_add(Duration::from_secs(100 * 365 * 86_400)))
        .unwrap_or(now)
}

/// Rank 0's listener: every accepted connection's first frame is read in a thread of its own
/// (bounded by [`FIRST_FRAME`] and the phase's deadline), so a silent stray connection (a port
/// scanner) cannot delay the real ranks.
struct Acceptor {
    listener: TcpListener,
    tx: std::sync::mpsc::Sender<(TcpStream, Vec<u8>)>,
    rx: std::sync::mpsc::Receiver<(TcpStream, Vec<u8>)>,
}

impl Acceptor {
    fn new(listener: TcpListener) -> Self {
        let (tx, rx) = std::sync::mpsc::channel();
        Self { listener, tx, rx }
    }

    /// The next connection with its first frame before `deadline`; `Ok(None)` at the deadline.
    /// Connections that fail before their first frame are skipped.
    fn next(
        &self,
        deadline: Instant,
    ) -> std::result::Result<Option<(TcpStream, Vec<u8>)>, DistError> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            loop {
                match self.listener.accept() {
                    Ok((s, _)) => self.read_first(s, left),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        return Err(proto(format!(
                            "accept on {}: {e}",
                            deadline_note(&self.listener)
                        )))
                    }
                }
            }
            if let Ok(c) = self.rx.recv_timeout(left.min(Duration::from_millis(5))) {
                return Ok(Some(c));
            }
        }
    }

    fn read_first(&self, s: TcpStream, left: Duration) {
        let tx = self.tx.clone();
        let _ =
            std::thread::Builder::new().name("deltakit-rendezvous-hello".into()).spawn(move || {
                let prepared =
                    s.set_nonblocking(false).and_then(|()| s.set_nodelay(true)).and_then(|()| {
                        s.set_read_timeout(Some(
                            FIRST_FRAME.min(left).max(Duration::from_millis(1)),
                        ))
                    });
                if prepared.is_err() {
                    return;
                }
                if let Ok(f) = read_frame(&s) {
                    let _ = s.set_read_timeout(None);
                    let _ = tx.send((s, f));
                }
            });
    }
}

fn deadline_note(l: &TcpListener) -> String {
    l.local_addr().map_or_else(|_| "the listener".into(), |a| a.to_string())
}

fn reject_all(conns: &[(usize, TcpStream)], err: &DistError) {
    let mut e = Enc::tag(REJECT);
    err.encode(&mut e);
    for (_, s) in conns {
        let _ = write_frame(s, &e.0);
    }
}

#[allow(clippy::too_many_lines)] // the two phases read best in sequence
fn root(opts: &RendezvousOptions) -> std::result::Result<Group, DistError> {
    let listener = TcpListener::bind(&opts.addr)
        .map_err(|e| DistError::Bind { addr: opts.addr.clone(), msg: e.to_string() })?;
    listener
        .set_nonblocking(true)
        .map_err(|e| DistError::Bind { addr: opts.addr.clone(), msg: e.to_string() })?;
    let acceptor = Acceptor::new(listener);
    let world = opts.world;
    // Control phase: every other rank's hello.
    let deadline = deadline_after(opts.timeout);
    let mut joined: Vec<(usize, TcpStream)> = Vec::new();
    let mut capacity = opts.capacity;
    let mut first_err: Option<DistError> = None;
    while joined.len() < world - 1 {
        let Some((s, frame)) = acceptor.next(deadline)? else {
            break;
        };
        let hello = match decode_hello(&frame) {
            Ok(Some(h)) => h,
            Ok(None) => continue, // not a deltakit rank: drop the connection
            Err(e) => {
                first_err.get_or_insert(e);
                continue;
            }
        };
        let err = if hello.rank == 0 || hello.rank >= world {
            Some(DistError::RankOutOfRange { rank: hello.rank, world })
        } else if joined.iter().any(|(r, _)| *r == hello.rank) {
            Some(DistError::DuplicateRank { rank: hello.rank })
        } else if hello.world != world {
            Some(DistError::Mismatch {
                rank: hello.rank,
                field: "world size".into(),
                expected: world.to_string(),
                actual: hello.world.to_string(),
            })
        } else {
            opts.fingerprint.first_difference(&hello.fingerprint).map(
                |(field, expected, actual)| DistError::Mismatch {
                    rank: hello.rank,
                    field,
                    expected,
                    actual,
                },
            )
        };
        match err {
            // A connection that cannot be part of the group is answered and dropped.
            Some(e @ (DistError::RankOutOfRange { .. } | DistError::DuplicateRank { .. })) => {
                reject_all(&[(hello.rank, s)], &e);
                first_err.get_or_insert(e);
            }
            Some(e) => {
                first_err.get_or_insert(e);
                joined.push((hello.rank, s));
            }
            None => {
                capacity = capacity.min(hello.capacity);
                joined.push((hello.rank, s));
            }
        }
    }
    if first_err.is_none() && joined.len() < world - 1 {
        let missing: Vec<usize> =
            (1..world).filter(|r| !joined.iter().any(|(j, _)| j == r)).collect();
        first_err = Some(DistError::Missing {
            addr: opts.addr.clone(),
            missing,
            world,
            timeout: opts.timeout,
        });
    }
    if let Some(e) = first_err {
        reject_all(&joined, &e);
        return Err(e);
    }
    joined.sort_by_key(|(r, _)| *r);
    let session = rand::random::<u64>() | 1;
    let mut w = Enc::tag(WELCOME);
    w.u64(session).u64(capacity).bytes(opts.nccl_id.as_deref().unwrap_or(&[]));
    for (r, s) in &joined {
        write_frame(s, &w.0).map_err(|e| proto(format!("welcome to rank {r}: {e}")))?;
    }
    // Data phase: one connection per rank, tagged with the session.
    let deadline = deadline_after(opts.timeout);
    let mut data: Vec<Option<TcpStream>> = (0..world).map(|_| None).collect();
    let mut have = 0;
    while have < world - 1 {
        let Some((s, frame)) = acceptor.next(deadline)? else {
            let missing: Vec<usize> = (1..world).filter(|&r| data[r].is_none()).collect();
            let e = DistError::Missing {
                addr: opts.addr.clone(),
                missing,
                world,
                timeout: opts.timeout,
            };
            reject_all(&joined, &e);
            return Err(e);
        };
        let mut d = Dec::new(&frame);
        let parsed = (|| -> std::result::Result<(u8, u32, u32, usize, u64), String> {
            Ok((
                d.u8("tag")?,
                d.u32("magic")?,
                d.u32("protocol")?,
                d.usize("rank")?,
                d.u64("session")?,
            ))
        })();
        match parsed {
            Ok((DATA_HELLO, MAGIC, PROTOCOL, r, sess)) if sess == session && r > 0 && r < world => {
                if data[r].is_none() {
                    have += 1;
                }
                data[r] = Some(s);
            }
            _ => {
                // A late hello for a rank that already joined: refuse it (the group goes on).
                if let Ok(Some(h)) = decode_hello(&frame) {
                    let e = if h.rank == 0 || h.rank >= world {
                        DistError::RankOutOfRange { rank: h.rank, world }
                    } else {
                        DistError::DuplicateRank { rank: h.rank }
                    };
                    reject_all(&[(h.rank, s)], &e);
                }
                // Otherwise a stale or foreign connection: dropped.
            }
        }
    }
    Ok(Group {
        rank: 0,
        world,
        session,
        nccl_id: opts.nccl_id.clone(),
        capacity,
        addr: opts.addr.clone(),
        control: joined.into_iter().map(|(_, s)| s).collect(),
        data: data.into_iter().flatten().collect(),
    })
}

/// Connect to `addr` before `deadline`, retrying every 50 ms (rank 0 may start later).
fn connect(
    opts: &RendezvousOptions,
    deadline: Instant,
) -> std::result::Result<TcpStream, DistError> {
    let mut last = String::from("not tried");
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(DistError::Unreachable {
                rank: opts.rank,
                addr: opts.addr.clone(),
                timeout: opts.timeout,
                last,
            });
        }
        match opts.addr.to_socket_addrs() {
            Ok(addrs) => {
                for a in addrs {
                    let t = left.min(Duration::from_secs(2)).max(Duration::from_millis(10));
                    match TcpStream::connect_timeout(&a, t) {
                        Ok(s) => {
                            s.set_nodelay(true).map_err(|e| proto(format!("nodelay: {e}")))?;
                            return Ok(s);
                        }
                        Err(e) => last = format!("{a}: {e}"),
                    }
                }
            }
            Err(e) => last = format!("resolving {}: {e}", opts.addr),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn leaf(opts: &RendezvousOptions) -> std::result::Result<Group, DistError> {
    let deadline = deadline_after(opts.timeout);
    let ctl = connect(opts, deadline)?;
    write_frame(&ctl, &encode_hello(opts))
        .map_err(|e| proto(format!("sending the hello to rank 0 at {}: {e}", opts.addr)))?;
    // Rank 0 started before our hello reached it, so it answers by the end of its deadline:
    // at most `timeout` from now (plus a little slack).
    let reply_wait = opts.timeout.saturating_add(Duration::from_secs(1));
    ctl.set_read_timeout(Some(reply_wait)).map_err(|e| proto(format!("read timeout: {e}")))?;
    let frame = read_frame(&ctl).map_err(|e| {
        if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) {
            proto(format!(
                "rank {}: timed out waiting for rank 0's reply at {} (waited {:.1}s after the \
                 hello; is a deltakit rank 0 listening there?)",
                opts.rank,
                opts.addr,
                reply_wait.as_secs_f64()
            ))
        } else {
            proto(format!(
                "no answer from rank 0 at {} to rank {}'s hello: {}",
                opts.addr,
                opts.rank,
                super::wire::io_text(&e)
            ))
        }
    })?;
    let mut d = Dec::new(&frame);
    let (session, capacity, nccl_id) = match d.u8("tag").map_err(proto)? {
        WELCOME => (
            d.u64("session").map_err(proto)?,
            d.u64("capacity").map_err(proto)?,
            d.bytes("nccl id").map_err(proto)?,
        ),
        REJECT => return Err(DistError::decode(&mut d).map_err(proto)?),
        t => return Err(proto(format!("rank 0 answered with frame tag {t}"))),
    };
    let data_deadline = deadline_after(opts.timeout);
    let data = connect(opts, data_deadline)?;
    let mut e = Enc::tag(DATA_HELLO);
    e.u32(MAGIC).u32(PROTOCOL).usize(opts.rank).u64(session);
    write_frame(&data, &e.0).map_err(|e| proto(format!("data hello to rank 0: {e}")))?;
    ctl.set_read_timeout(None).map_err(|e| proto(format!("read timeout: {e}")))?;
    Ok(Group {
        rank: opts.rank,
        world: opts.world,
        session,
        nccl_id: if nccl_id.is_empty() { None } else { Some(nccl_id) },
        capacity,
        addr: opts.addr.clone(),
        control: vec![ctl],
        data: vec![data],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free_addr() -> String {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        format!("127.0.0.1:{}", l.local_addr().unwrap().port())
    }

    fn opts(addr: &str, rank: usize, world: usize, fp: Fingerprint) -> RendezvousOptions {
        RendezvousOptions {
            addr: addr.into(),
            rank,
            world,
            timeout: Duration::from_secs(10),
            fingerprint: fp,
            nccl_id: (rank == 0).then(|| vec![7u8; 128]),
            capacity: 100 - rank as u64,
        }
    }

    fn fp() -> Fingerprint {
        Fingerprint::new().field("tp", 4).field("dtype", "f32")
    }

    /// Ranks started in any order (rank 0 last) join; every rank gets the session, the id of
    /// rank 0 and the minimum capacity; the data connections carry a working communicator.
    #[test]
    fn tp_rendezvous_joins_in_any_order_and_hands_out_the_id() {
        for world in [1usize, 2, 4] {
            let addr = free_addr();
            let groups: Vec<Group> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..world)
                    .rev()
                    .map(|r| {
                        let o = opts(&addr, r, world, fp());
                        let h = s.spawn(move || rendezvous(&o));
                        std::thread::sleep(Duration::from_millis(20));
                        h
                    })
                    .collect();
                let mut g: Vec<Group> =
                    hs.into_iter().map(|h| h.join().unwrap().unwrap()).collect();
                g.sort_by_key(|g| g.rank);
                g
            });
            for g in &groups {
                assert_eq!(g.session, groups[0].session);
                assert_eq!(g.nccl_id.as_deref(), Some(&[7u8; 128][..]));
                assert_eq!(g.capacity, 101 - world as u64);
                assert_eq!(g.world, world);
            }
            let comms: Vec<TcpComm> =
                groups.into_iter().map(|mut g| g.tcp_comm().unwrap()).collect();
            let sums: Vec<Vec<f32>> = std::thread::scope(|s| {
                let hs: Vec<_> = comms
                    .iter()
                    .map(|c| s.spawn(move || c.all_reduce_f32(vec![c.rank() as f32, 1.0]).unwrap()))
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let w = world as f32;
            for x in sums {
                assert_eq!(x, vec![w * (w - 1.0) / 2.0, w]);
            }
        }
    }

    /// A fingerprint mismatch is the same typed error on every rank, naming the rank, the field,
    /// rank 0's value and the rank's.
    #[test]
    fn tp_rendezvous_mismatch_is_a_typed_error_on_every_rank() {
        let addr = free_addr();
        let res: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..3)
                .map(|r| {
                    let f = if r == 2 {
                        Fingerprint::new().field("tp", 4).field("dtype", "bf16")
                    } else {
                        fp()
                    };
                    let o = opts(&addr, r, 3, f);
                    s.spawn(move || rendezvous(&o))
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let want = DistError::Mismatch {
            rank: 2,
            field: "dtype".into(),
            expected: "f32".into(),
            actual: "bf16".into(),
        };
        for r in res {
            assert_eq!(r.unwrap_err(), want);
        }
        assert!(want.to_string().contains("expected f32, got bf16"));
    }

    /// World sizes that differ, a rank claimed twice and a rank out of range are refused.
    #[test]
    fn tp_rendezvous_refuses_bad_worlds_and_ranks() {
        let addr = free_addr();
        let res: Vec<_> = std::thread::scope(|s| {
            let a = opts(&addr, 0, 2, fp());
            let mut b = opts(&addr, 1, 3, fp());
            b.timeout = Duration::from_secs(3);
            let h0 = s.spawn(move || rendezvous(&a));
            let h1 = s.spawn(move || rendezvous(&b));
            vec![h0.join().unwrap(), h1.join().unwrap()]
        });
        for r in res {
            match r.unwrap_err() {
                DistError::Mismatch { rank: 1, field, expected, actual } => {
                    assert_eq!(
                        (field.as_str(), expected.as_str(), actual.as_str()),
                        ("world size", "2", "3")
                    );
                }
                e => panic!("{e}"),
            }
        }
        let addr = free_addr();
        let res: Vec<_> = std::thread::scope(|s| {
            let mut a = opts(&addr, 0, 3, fp());
            a.timeout = Duration::from_secs(2);
            let h0 = s.spawn(move || rendezvous(&a));
            std::thread::sleep(Duration::from_millis(30));
            let hs: Vec<_> = (0..2)
                .map(|_| {
                    let b = opts(&addr, 1, 3, fp());
                    s.spawn(move || rendezvous(&b))
                })
                .collect();
            let mut v = vec![h0.join().unwrap()];
            v.extend(hs.into_iter().map(|h| h.join().unwrap()));
            v
        });
        for r in res {
            assert_eq!(r.unwrap_err(), DistError::DuplicateRank { rank: 1 });
        }
    }

    /// A rank that never arrives: rank 0 fails after the timeout naming it, and so does every
    /// rank that did arrive; a rank with no rank 0 fails with `Unreachable`.
    #[test]
    fn tp_rendezvous_missing_rank_times_out_naming_it() {
        let addr = free_addr();
        let t0 = Instant::now();
        let res: Vec<_> = std::thread::scope(|s| {
            let mut a = opts(&addr, 0, 4, fp());
            a.timeout = Duration::from_millis(800);
            let h0 = s.spawn(move || rendezvous(&a));
            std::thread::sleep(Duration::from_millis(20));
            let b = opts(&addr, 2, 4, fp());
            let h2 = s.spawn(move || rendezvous(&b));
            vec![h0.join().unwrap(), h2.join().unwrap()]
        });
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
        for r in res {
            let e = r.unwrap_err();
            assert!(
                matches!(&e, DistError::Missing { missing, world: 4, .. } if *missing == vec![1, 3]),
                "{e}"
            );
            assert!(e.to_string().contains("ranks [1, 3]"), "{e}");
        }
        let mut b = opts(&free_addr(), 1, 2, fp());
        b.timeout = Duration::from_millis(300);
        let e = rendezvous(&b).unwrap_err();
        assert!(matches!(e, DistError::Unreachable { rank: 1, .. }), "{e}");
    }

    /// Garbage on the port does not disturb the rendezvous.
    #[test]
    fn tp_rendezvous_ignores_stray_connections() {
        use std::io::Write;
        let addr = free_addr();
        let groups: Vec<_> = std::thread::scope(|s| {
            let a = opts(&addr, 0, 2, fp());
            let h0 = s.spawn(move || rendezvous(&a));
            std::thread::sleep(Duration::from_millis(30));
            let mut junk = TcpStream::connect(&addr).unwrap();
            junk.write_all(b"\x05\x00\x00\x00GET /").unwrap();
            drop(junk);
            let b = opts(&addr, 1, 2, fp());
            let h1 = s.spawn(move || rendezvous(&b));
            vec![h0.join().unwrap(), h1.join().unwrap()]
        });
        assert!(groups.iter().all(std::result::Result::is_ok));
    }

    /// A silent stray connection (a port scanner) does not delay the real ranks.
    #[test]
    fn tp_rendezvous_silent_connection_does_not_stall() {
        let addr = free_addr();
        let t0 = Instant::now();
        let groups: Vec<_> = std::thread::scope(|s| {
            let a = opts(&addr, 0, 2, fp());
            let h0 = s.spawn(move || rendezvous(&a));
            std::thread::sleep(Duration::from_millis(30));
            let idle = TcpStream::connect(&addr).unwrap();
            std::thread::sleep(Duration::from_millis(30));
            let b = opts(&addr, 1, 2, fp());
            let h1 = s.spawn(move || rendezvous(&b));
            let g = vec![h0.join().unwrap(), h1.join().unwrap()];
            drop(idle);
            g
        });
        assert!(groups.iter().all(std::result::Result::is_ok));
        assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    }

    /// A huge timeout saturates (no overflow panic).
    #[test]
    fn tp_rendezvous_huge_timeout_saturates() {
        let addr = free_addr();
        let groups: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|r| {
                    let mut o = opts(&addr, r, 2, fp());
                    o.timeout = Duration::from_secs(u64::MAX);
                    let h = s.spawn(move || rendezvous(&o));
                    std::thread::sleep(Duration::from_millis(30));
                    h
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(groups.iter().all(std::result::Result::is_ok));
        assert!(deadline_after(Duration::MAX) > Instant::now());
    }

    /// A listener that accepts and never answers: the rank fails within its timeout naming the
    /// missing reply (not a raw OS error).
    #[test]
    fn tp_rendezvous_foreign_listener_times_out_clearly() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let mut b = opts(&addr, 1, 2, fp());
        b.timeout = Duration::from_millis(500);
        let t0 = Instant::now();
        let e = rendezvous(&b).unwrap_err();
        assert!(e.to_string().contains("timed out waiting for rank 0's reply"), "{e}");
        assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
        drop(l);
    }
}
