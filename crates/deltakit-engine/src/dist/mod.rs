//! One process per rank: the tensor-parallel ranks of one model run as separate `deltakit`
//! processes, on one host or several, instead of threads of one process.
//!
//! What this module owns, in the order a run goes through it:
//! - [`spec`]: which launch a command line asks for, from the flags (`--nnodes`, `--node-rank`,
//!   `--nproc-per-node`, `--rendezvous HOST:PORT`, `--tp`) and the torchrun-style environment
//!   (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`): one process with
//!   in-process ranks, this process is one rank, or this process starts its node's ranks as child
//!   processes ([`spawn`]) and waits for them;
//! - [`rendezvous`]: rank 0 listens on `HOST:PORT`, the other ranks connect (with retries until
//!   a deadline); a handshake checks the world size, that every rank joined once, and a
//!   [`Fingerprint`] of what every rank must agree on (model config, tp, dtype, cache, weight
//!   source: the dummy seed, or [`weights_identity`] of the checkpoint); rank 0 hands out a session id, the NCCL unique id (CUDA) and the agreed capacity.
//!   The result is a [`rendezvous::Group`]: a control connection and a data connection between
//!   rank 0 and every other rank;
//! - [`tcp_comm`]: the CPU backend's communicator across processes over the data connections
//!   (all-reduce sum and all-gather through rank 0, summed in rank order: bit-identical to the
//!   in-process [`crate::comm::CpuComm`]). It is the CPU stand-in for NCCL, as `CpuComm` is; on
//!   CUDA the data plane is NCCL initialised from the id of the rendezvous;
//! - [`control`]: the control plane. The scheduler ([`crate::generate::Engine`]) lives on rank
//!   0 and drives an [`crate::executor::Executor`] whose rank 0 is local and whose other ranks are
//!   [`control::RemoteRank`] proxies that forward each step's batch description over the control
//!   connection; every other process runs [`control::serve`]: its local rank behind an
//!   executor of one, replying ok or a typed error per step.
//!
//! # Failure
//! Every process has a watchdog (`--step-timeout`, the executor's) and every connection is
//! watched: a rank that dies closes its connections, so the collective or the control reply
//! that waits on it fails at once; a rank that stops answering trips rank 0's watchdog. Either
//! way rank 0's executor aborts its communicator and shuts its connections, which ends the step
//! on every other process with an error, and every process exits non-zero. A process whose
//! control connection to rank 0 ends without a shutdown command (rank 0 died or gave up) aborts
//! its communicator and exits non-zero; so does one that hears nothing from rank 0 (not even its
//! one-second heartbeat) for max(`--step-timeout`, 3 s) (rank 0 stopped or unreachable). Rank 0
//! failing after the rendezvous (a bad prompt, an unwritable output) sends that failure in its
//! final shutdown: every process exits non-zero. A rank missing at the rendezvous makes rank 0
//! fail after `--rendezvous-timeout` naming the ranks that did not arrive.
//!
//! # Trust
//! The rendezvous has no authentication: run it on a trusted network (as torchrun's and NCCL's
//! bootstrap). Garbage on the port is refused by the handshake's magic and length checks.

pub mod control;
pub mod rendezvous;
pub mod spawn;
pub mod spec;
pub mod tcp_comm;
pub mod wire;

use std::time::Duration;

use wire::{Dec, Enc};

/// Error of the launch, the rendezvous and the handshake. Each variant names what a user can
/// act on: the flag or environment variable, the rank, the field and both values.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DistError {
    /// An environment variable has a value that cannot be used.
    #[error("environment variable {var}={value:?}: {msg}")]
    Env {
        /// The variable (`RANK`, `WORLD_SIZE`, ...).
        var: String,
        /// Its value.
        value: String,
        /// What is wrong with it.
        msg: String,
    },
    /// A flag and an environment variable (or two flags) give different values for the same
    /// thing; nothing is guessed.
    #[error("{flag} conflicts with {other}")]
    Conflict {
        /// The flag and what it implies (`--nnodes 2 x --nproc-per-node 2 = world size 4`).
        flag: String,
        /// The other source and its value (`WORLD_SIZE=3`).
        other: String,
    },
    /// A required setting is missing or a value is out of range.
    #[error("{0}")]
    Usage(String),
    /// Rank 0 could not listen on the rendezvous address.
    #[error("rendezvous: rank 0 cannot listen on {addr}: {msg}")]
    Bind {
        /// `HOST:PORT`.
        addr: String,
        /// The OS error.
        msg: String,
    },
    /// A rank could not reach rank 0 before the rendezvous deadline.
    #[error("rendezvous: rank {rank} could not reach rank 0 at {addr} within {}: {last}", secs(*timeout))]
    Unreachable {
        /// This rank.
        rank: usize,
        /// `HOST:PORT`.
        addr: String,
        /// The deadline.
        timeout: Duration,
        /// The last connection error.
        last: String,
    },
    /// Ranks that did not join before the deadline (rank 0's view, sent to every rank that did).
    #[error(
        "rendezvous at {addr}: ranks {missing:?} of world size {world} did not arrive within {} \
         (were they started, with the same --rendezvous / MASTER_ADDR:MASTER_PORT?)",
        secs(*timeout)
    )]
    Missing {
        /// `HOST:PORT`.
        addr: String,
        /// The ranks that did not arrive (or did not open their data connection), ascending.
        missing: Vec<usize>,
        /// The world size.
        world: usize,
        /// The deadline.
        timeout: Duration,
    },
    /// Two processes claimed the same rank.
    #[error("rendezvous: rank {rank} joined twice (each process needs its own RANK)")]
    DuplicateRank {
        /// The rank.
        rank: usize,
    },
    /// A process claimed a rank outside the world.
    #[error("rendezvous: a process joined as rank {rank}, outside world size {world}")]
    RankOutOfRange {
        /// The claimed rank.
        rank: usize,
        /// Rank 0's world size.
        world: usize,
    },
    /// A rank does not agree with rank 0 on a field of the handshake (world size, model config,
    /// tp, dtype, cache, weight source, ...): expected is rank 0's value.
    #[error(
        "rendezvous: rank {rank} differs from rank 0 in {field}: expected {expected}, got {actual}"
    )]
    Mismatch {
        /// The rank that differs.
        rank: usize,
        /// The field.
        field: String,
        /// Rank 0's value.
        expected: String,
        /// The rank's value.
        actual: String,
    },
    /// A connection broke or spoke something else than this protocol during the rendezvous.
    #[error("rendezvous: {0}")]
    Protocol(String),
    /// Local ranks started by `--nproc-per-node` failed.
    #[error("{}", failed_children(failures))]
    ChildFailed {
        /// `(local rank, global rank, how it ended)` of every process that failed.
        failures: Vec<(usize, usize, String)>,
    },
}

fn failed_children(f: &[(usize, usize, String)]) -> String {
    let parts: Vec<String> =
        f.iter().map(|(l, r, s)| format!("local rank {l} (rank {r}) {s}")).collect();
    format!("{} of the local rank processes failed: {}", f.len(), parts.join("; "))
}

/// `1.5s`.
fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

impl From<DistError> for crate::error::EngineError {
    fn from(e: DistError) -> Self {
        crate::error::EngineError::Comm(e.to_string())
    }
}

impl DistError {
    /// The error as a frame payload (rank 0 sends it to every rank it rejects, which decodes
    /// the same variant with [`DistError::decode`]).
    pub(crate) fn encode(&self, e: &mut Enc) {
        match self {
            DistError::Mismatch { rank, field, expected, actual } => {
                e.u8(1).usize(*rank).str(field).str(expected).str(actual);
            }
            DistError::Missing { addr, missing, world, timeout } => {
                e.u8(2).str(addr).usizes(missing).usize(*world).u64(timeout.as_millis() as u64);
            }
            DistError::DuplicateRank { rank } => {
                e.u8(3).usize(*rank);
            }
            DistError::RankOutOfRange { rank, world } => {
                e.u8(4).usize(*rank).usize(*world);
            }
            other => {
                e.u8(0).str(&other.to_string());
            }
        }
    }

    /// Decode [`DistError::encode`]'s payload.
    pub(crate) fn decode(d: &mut Dec<'_>) -> Result<Self, String> {
        Ok(match d.u8("error kind")? {
            1 => DistError::Mismatch {
                rank: d.usize("rank")?,
                field: d.str("field")?,
                expected: d.str("expected")?,
                actual: d.str("actual")?,
            },
            2 => DistError::Missing {
                addr: d.str("addr")?,
                missing: d.usizes("missing")?,
                world: d.usize("world")?,
                timeout: Duration::from_millis(d.u64("timeout")?),
            },
            3 => DistError::DuplicateRank { rank: d.usize("rank")? },
            4 => DistError::RankOutOfRange { rank: d.usize("rank")?, world: d.usize("world")? },
            _ => DistError::Protocol(format!("rank 0 refused this rank: {}", d.str("message")?)),
        })
    }
}

/// What every rank must agree on before loading anything: named fields with printable values
/// (a value may be a hash plus a summary, e.g. the model config's). The handshake compares each
/// rank's fingerprint with rank 0's field by field and fails with [`DistError::Mismatch`]
/// naming the first field that differs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fingerprint(pub Vec<(String, String)>);

impl Fingerprint {
    /// An empty fingerprint.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Add field `name` with `value`.
    #[must_use]
    pub fn field(mut self, name: &str, value: impl std::fmt::Display) -> Self {
        self.0.push((name.to_string(), value.to_string()));
        self
    }

    /// The first field where `other` differs from `self` (rank 0's): `(field, expected,
    /// actual)`; a field only one side has reads `<absent>` on the other.
    #[must_use]
    pub fn first_difference(&self, other: &Fingerprint) -> Option<(String, String, String)> {
        let find = |fp: &Fingerprint, name: &str| {
            fp.0.iter().find(|(n, _)| n == name).map_or("<absent>".to_string(), |(_, v)| v.clone())
        };
        for (name, want) in &self.0 {
            let got = find(other, name);
            if &got != want {
                return Some((name.clone(), want.clone(), got));
            }
        }
        other
            .0
            .iter()
            .find(|(n, _)| !self.0.iter().any(|(m, _)| m == n))
            .map(|(n, v)| (n.clone(), "<absent>".to_string(), v.clone()))
    }

    /// A model config as a fingerprint value: a stable hash of every field, with the shapes a
    /// user recognises.
    #[must_use]
    pub fn model_value(cfg: &crate::config::ModelConfig) -> String {
        format!(
            "{:016x} ({} layers, hidden {}, vocab {})",
            wire::fnv1a(format!("{cfg:?}").as_bytes()),
            cfg.num_layers,
            cfg.hidden_size,
            cfg.vocab_size
        )
    }

    pub(crate) fn encode(&self, e: &mut Enc) {
        e.usize(self.0.len());
        for (n, v) in &self.0 {
            e.str(n).str(v);
        }
    }

    pub(crate) fn decode(d: &mut Dec<'_>) -> Result<Self, String> {
        let n = d.usize("fingerprint fields")?;
        if n > 1024 {
            return Err(format!("fingerprint with {n} fields"));
        }
        let mut f = Vec::with_capacity(n);
        for _ in 0..n {
            f.push((d.str("field name")?, d.str("field value")?));
        }
        Ok(Self(f))
    }
}

/// A cheap identity of a checkpoint directory, for the handshake: every `*.safetensors` file's
/// name and size and a hash of its JSON header (tensor names, dtypes, shapes, offsets and
/// metadata), hashed together. Two checkpoints of the same config with different files or
/// headers differ; the tensor bytes are not read (a checkpoint whose data alone differs, with
/// identical headers and sizes, is not told apart).
///
/// # Errors
/// The directory or a file cannot be read, or a header length is implausible.
pub fn weights_identity(dir: &std::path::Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    let mut all = Enc::default();
    let mut total = 0u64;
    for f in &files {
        let mut file = std::fs::File::open(f)?;
        let size = file.metadata()?.len();
        let mut len = [0u8; 8];
        file.read_exact(&mut len)?;
        let n = u64::from_le_bytes(len);
        if n > 100 << 20 || n > size {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{}: safetensors header length {n}", f.display()),
            ));
        }
        let mut header = vec![0u8; n as usize];
        file.read_exact(&mut header)?;
        let name = f.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        all.str(&name).u64(size).u64(wire::fnv1a(&header));
        total = total.saturating_add(size);
    }
    Ok(format!("{:016x} ({} safetensors files, {total} bytes)", wire::fnv1a(&all.0), files.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprint_names_the_first_differing_field() {
        let a = Fingerprint::new().field("tp", 2).field("dtype", "f32");
        assert_eq!(a.first_difference(&a.clone()), None);
        let b = Fingerprint::new().field("tp", 2).field("dtype", "bf16");
        assert_eq!(a.first_difference(&b), Some(("dtype".into(), "f32".into(), "bf16".into())));
        let c = Fingerprint::new().field("tp", 2);
        assert_eq!(a.first_difference(&c).unwrap().2, "<absent>");
        let d = a.clone().field("extra", 1);
        assert_eq!(
            a.first_difference(&d).unwrap(),
            ("extra".into(), "<absent>".into(), "1".into())
        );
    }

    #[test]
    fn errors_round_trip_through_frames() {
        for err in [
            DistError::Mismatch {
                rank: 3,
                field: "dtype".into(),
                expected: "f32".into(),
                actual: "bf16".into(),
            },
            DistError::Missing {
                addr: "h:1".into(),
                missing: vec![1, 3],
                world: 4,
                timeout: Duration::from_millis(1500),
            },
            DistError::DuplicateRank { rank: 2 },
            DistError::RankOutOfRange { rank: 9, world: 4 },
        ] {
            let mut e = Enc::default();
            err.encode(&mut e);
            assert_eq!(DistError::decode(&mut Dec::new(&e.0)).unwrap(), err);
        }
        let mut e = Enc::default();
        DistError::Protocol("x".into()).encode(&mut e);
        let back = DistError::decode(&mut Dec::new(&e.0)).unwrap().to_string();
        assert!(back.contains('x'), "{back}");
    }
}
