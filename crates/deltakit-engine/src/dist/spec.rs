//! Which launch a command line asks for: the flags `--nnodes`, `--node-rank`,
//! `--nproc-per-node`, `--rendezvous HOST:PORT`, `--tp`, and the torchrun-style environment
//! variables `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`.
//!
//! Rules ([`resolve`]):
//! - None of the four launch flags and neither `RANK` nor `WORLD_SIZE` set: one process, `--tp`
//!   in-process ranks ([`Launch::InProcess`]; the other variables are ignored).
//! - World size = `nnodes x nproc-per-node` (flags; `--nnodes` defaults to 1, and without
//!   `--nproc-per-node` to the world size over the nodes), else `WORLD_SIZE`, else `--tp`; it
//!   is the tensor-parallel size.
//! - A value given both by a flag and by the environment must agree: `--nnodes x
//!   --nproc-per-node` with `WORLD_SIZE`, `--rendezvous` with `MASTER_ADDR:MASTER_PORT`,
//!   `--node-rank x --nproc-per-node + LOCAL_RANK` with `RANK`, and `--tp` with the world
//!   size. A disagreement is [`DistError::Conflict`] naming both; nothing is guessed.
//! - `RANK` set: this process is that rank ([`Launch::Rank`]); `LOCAL_RANK` (default `RANK`
//!   modulo the processes per node) picks its GPU.
//! - `RANK` not set: with `--nproc-per-node N > 1`, this process starts its node's `N` ranks as
//!   child processes of the same binary ([`Launch::Spawn`], [`super::spawn`]) — ranks
//!   `node_rank x N ..` — and waits for them; with one process per node it is rank
//!   `--node-rank` itself. `WORLD_SIZE` without `RANK` is refused (which rank would this be?).
//! - The rendezvous address is required for several nodes; on one node the spawner picks a
//!   free port on 127.0.0.1 when none is given. Rank 0 listens on it (see
//!   [`super::rendezvous`]).

use super::DistError;

/// The launch flags of `generate`, `bench` and `eval-mc` (all optional).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LaunchFlags {
    /// `--nnodes`: machines taking part.
    pub nnodes: Option<usize>,
    /// `--node-rank`: this machine's index, `0..nnodes`.
    pub node_rank: Option<usize>,
    /// `--nproc-per-node`: rank processes per machine.
    pub nproc_per_node: Option<usize>,
    /// `--rendezvous HOST:PORT`: where rank 0 listens.
    pub rendezvous: Option<String>,
    /// `--tp`: tensor-parallel size.
    pub tp: Option<usize>,
}

/// The torchrun-style environment variables (raw values; `None` when unset).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LaunchEnv {
    /// `RANK`: global rank of this process.
    pub rank: Option<String>,
    /// `WORLD_SIZE`: number of rank processes.
    pub world_size: Option<String>,
    /// `LOCAL_RANK`: rank within this machine (selects the GPU).
    pub local_rank: Option<String>,
    /// `MASTER_ADDR`: rank 0's host.
    pub master_addr: Option<String>,
    /// `MASTER_PORT`: rank 0's port.
    pub master_port: Option<String>,
}

impl LaunchEnv {
    /// The variables of this process's environment.
    #[must_use]
    pub fn from_process() -> Self {
        let get = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Self {
            rank: get("RANK"),
            world_size: get("WORLD_SIZE"),
            local_rank: get("LOCAL_RANK"),
            master_addr: get("MASTER_ADDR"),
            master_port: get("MASTER_PORT"),
        }
    }
}

/// One rank process's place in the group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankSpec {
    /// Global rank, `0..world`.
    pub rank: usize,
    /// Number of ranks (= tensor-parallel size).
    pub world: usize,
    /// Rank within its machine (selects the GPU: `--devices[local_rank]`, or the `--device`
    /// ordinal + `local_rank`).
    pub local_rank: usize,
    /// `HOST:PORT` of rank 0.
    pub rendezvous: String,
}

/// The node launcher's plan: start `nproc` rank processes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpawnSpec {
    /// Rank processes to start on this machine.
    pub nproc: usize,
    /// This machine's index (its ranks are `node_rank * nproc ..`).
    pub node_rank: usize,
    /// Number of ranks in total.
    pub world: usize,
    /// `HOST:PORT` of rank 0 (`None`: one machine, pick a free local port).
    pub rendezvous: Option<String>,
}

/// What the command line asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Launch {
    /// One process; `tp` ranks as threads (the in-process executor).
    InProcess {
        /// Tensor-parallel size.
        tp: usize,
    },
    /// This process is one rank of several processes.
    Rank(RankSpec),
    /// This process starts its machine's rank processes and waits for them.
    Spawn(SpawnSpec),
}

fn env_usize(var: &str, v: Option<&String>) -> Result<Option<usize>, DistError> {
    v.map(|s| {
        s.trim().parse::<usize>().map_err(|e| DistError::Env {
            var: var.into(),
            value: s.clone(),
            msg: format!("expected a non-negative integer ({e})"),
        })
    })
    .transpose()
}

/// Split `HOST:PORT` (IPv6 as `[::1]:PORT`) into host and port.
///
/// # Errors
/// [`DistError::Usage`] when there is no `:PORT` or the port is not a number.
pub fn split_host_port(addr: &str) -> Result<(String, u16), DistError> {
    let bad =
        |msg: &str| DistError::Usage(format!("--rendezvous {addr:?}: {msg} (expected HOST:PORT)"));
    let (host, port) = addr.rsplit_once(':').ok_or_else(|| bad("no port"))?;
    let port = port.parse::<u16>().map_err(|_| bad("the port is not a number in 1..=65535"))?;
    if port == 0 {
        return Err(bad("port 0 is not a fixed port: every rank must know rank 0's port"));
    }
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(bad("no host"));
    }
    Ok((host.to_string(), port))
}

/// `host:port`, bracketing IPv6 hosts.
#[must_use]
pub fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Resolve `flags` and `env` into a [`Launch`] (rules in the module docs).
///
/// # Errors
/// [`DistError::Env`] for a variable that is not a number; [`DistError::Conflict`] when a flag
/// and a variable (or `--tp` and the world) disagree; [`DistError::Usage`] for zero sizes, an
/// index out of range, a missing rendezvous address, or `WORLD_SIZE` without `RANK`.
#[allow(clippy::too_many_lines)] // one rule after the other, as the module docs list them
pub fn resolve(flags: &LaunchFlags, env: &LaunchEnv) -> Result<Launch, DistError> {
    let any_flag = flags.nnodes.is_some()
        || flags.node_rank.is_some()
        || flags.nproc_per_node.is_some()
        || flags.rendezvous.is_some();
    let env_rank = env_usize("RANK", env.rank.as_ref())?;
    let env_world = env_usize("WORLD_SIZE", env.world_size.as_ref())?;
    let env_local = env_usize("LOCAL_RANK", env.local_rank.as_ref())?;
    if !any_flag && env_rank.is_none() && env_world.is_none() {
        return Ok(Launch::InProcess { tp: flags.tp.unwrap_or(1) });
    }
    for (name, v) in [("--nnodes", flags.nnodes), ("--nproc-per-node", flags.nproc_per_node)] {
        if v == Some(0) {
            return Err(DistError::Usage(format!("{name} must be >= 1")));
        }
    }
    let nnodes = flags.nnodes.unwrap_or(1);
    // World size: flags, then WORLD_SIZE, then --tp.
    let flag_world = match flags.nproc_per_node {
        Some(p) => {
            let w = nnodes.checked_mul(p).ok_or_else(|| {
                DistError::Usage(format!(
                    "--nnodes {nnodes} x --nproc-per-node {p} overflows the world size"
                ))
            })?;
            Some((w, format!("--nnodes {nnodes} x --nproc-per-node {p} = world size {w}")))
        }
        None => None,
    };
    let world = match (&flag_world, env_world) {
        (Some((w, f)), Some(e)) if *w != e => {
            return Err(DistError::Conflict { flag: f.clone(), other: format!("WORLD_SIZE={e}") })
        }
        (Some((w, _)), _) => *w,
        (None, Some(e)) => e,
        (None, None) => flags.tp.unwrap_or(nnodes),
    };
    if world == 0 {
        return Err(DistError::Usage("the world size must be >= 1 (WORLD_SIZE=0)".into()));
    }
    if let Some(tp) = flags.tp {
        if tp != world {
            let source = match (&flag_world, env_world) {
                (Some((_, f)), _) => f.clone(),
                (None, Some(e)) => format!("WORLD_SIZE={e}"),
                (None, None) => format!("--nnodes {nnodes}"),
            };
            return Err(DistError::Conflict { flag: format!("--tp {tp}"), other: source });
        }
    }
    if world % nnodes != 0 {
        return Err(DistError::Usage(format!(
            "world size {world} is not a multiple of --nnodes {nnodes}"
        )));
    }
    let nproc = flags.nproc_per_node.unwrap_or(world / nnodes);
    // Rendezvous: --rendezvous, or MASTER_ADDR:MASTER_PORT.
    let env_addr = match (&env.master_addr, &env.master_port) {
        (Some(a), Some(p)) => {
            let port =
                p.trim().parse::<u16>().ok().filter(|&p| p != 0).ok_or_else(|| DistError::Env {
                    var: "MASTER_PORT".into(),
                    value: p.clone(),
                    msg: "expected a port number in 1..=65535".into(),
                })?;
            Some(join_host_port(a.trim().trim_start_matches('[').trim_end_matches(']'), port))
        }
        (Some(a), None) => {
            return Err(DistError::Env {
                var: "MASTER_PORT".into(),
                value: String::new(),
                msg: format!("unset while MASTER_ADDR={a} is set"),
            })
        }
        (None, Some(p)) => {
            return Err(DistError::Env {
                var: "MASTER_ADDR".into(),
                value: String::new(),
                msg: format!("unset while MASTER_PORT={p} is set"),
            })
        }
        (None, None) => None,
    };
    let rendezvous = match (&flags.rendezvous, env_addr) {
        (Some(f), Some(e)) => {
            let (fh, fp) = split_host_port(f)?;
            if join_host_port(&fh, fp) != e {
                return Err(DistError::Conflict {
                    flag: format!("--rendezvous {f}"),
                    other: format!(
                        "MASTER_ADDR={} MASTER_PORT={}",
                        env.master_addr.as_deref().unwrap_or_default(),
                        env.master_port.as_deref().unwrap_or_default()
                    ),
                });
            }
            Some(e)
        }
        (Some(f), None) => {
            let (h, p) = split_host_port(f)?;
            Some(join_host_port(&h, p))
        }
        (None, e) => e,
    };
    if let Some(nr) = flags.node_rank {
        if nr >= nnodes {
            return Err(DistError::Usage(format!(
                "--node-rank {nr} is outside --nnodes {nnodes} (0..{nnodes})"
            )));
        }
    }
    if let Some(rank) = env_rank {
        if rank >= world {
            return Err(DistError::Env {
                var: "RANK".into(),
                value: rank.to_string(),
                msg: format!("outside world size {world}"),
            });
        }
        let local_rank = env_local.unwrap_or(rank % nproc);
        if local_rank >= nproc {
            return Err(DistError::Env {
                var: "LOCAL_RANK".into(),
                value: local_rank.to_string(),
                msg: format!("outside the {nproc} processes per node"),
            });
        }
        if let Some(nr) = flags.node_rank {
            if nr * nproc + local_rank != rank {
                return Err(DistError::Conflict {
                    flag: format!(
                        "--node-rank {nr} x --nproc-per-node {nproc} + LOCAL_RANK {local_rank} = \
                         rank {}",
                        nr * nproc + local_rank
                    ),
                    other: format!("RANK={rank}"),
                });
            }
        }
        if world == 1 {
            return Ok(Launch::InProcess { tp: 1 });
        }
        let rendezvous = rendezvous.ok_or_else(|| {
            DistError::Usage(
                "one process per rank needs rank 0's address: --rendezvous HOST:PORT, or \
                 MASTER_ADDR and MASTER_PORT"
                    .into(),
            )
        })?;
        return Ok(Launch::Rank(RankSpec { rank, world, local_rank, rendezvous }));
    }
    if env_world.is_some() && flags.nproc_per_node.is_none() {
        return Err(DistError::Usage(format!(
            "WORLD_SIZE={world} is set but RANK is not: set RANK (and LOCAL_RANK) for each \
             process, or use --nproc-per-node N to start this node's ranks"
        )));
    }
    let node_rank = flags.node_rank.unwrap_or(0);
    if world == 1 {
        return Ok(Launch::InProcess { tp: 1 });
    }
    if nnodes > 1 && rendezvous.is_none() {
        return Err(DistError::Usage(format!(
            "--nnodes {nnodes} needs rank 0's address: --rendezvous HOST:PORT (the same on every \
             node), or MASTER_ADDR and MASTER_PORT"
        )));
    }
    if nproc > 1 {
        return Ok(Launch::Spawn(SpawnSpec { nproc, node_rank, world, rendezvous }));
    }
    let rendezvous = rendezvous.ok_or_else(|| {
        DistError::Usage("one process per rank needs --rendezvous HOST:PORT".into())
    })?;
    Ok(Launch::Rank(RankSpec { rank: node_rank, world, local_rank: 0, rendezvous }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> LaunchEnv {
        let mut e = LaunchEnv::default();
        for (k, v) in pairs {
            let v = Some((*v).to_string());
            match *k {
                "RANK" => e.rank = v,
                "WORLD_SIZE" => e.world_size = v,
                "LOCAL_RANK" => e.local_rank = v,
                "MASTER_ADDR" => e.master_addr = v,
                "MASTER_PORT" => e.master_port = v,
                _ => unreachable!(),
            }
        }
        e
    }

    #[test]
    fn tp_launch_in_process_by_default() {
        let f = LaunchFlags { tp: Some(2), ..LaunchFlags::default() };
        assert_eq!(
            resolve(&f, &env(&[("MASTER_ADDR", "x")])).unwrap(),
            Launch::InProcess { tp: 2 }
        );
        assert_eq!(
            resolve(&LaunchFlags::default(), &LaunchEnv::default()).unwrap(),
            Launch::InProcess { tp: 1 }
        );
    }

    #[test]
    fn tp_launch_torchrun_env() {
        let e = env(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "29500"),
        ]);
        assert_eq!(
            resolve(&LaunchFlags::default(), &e).unwrap(),
            Launch::Rank(RankSpec {
                rank: 3,
                world: 4,
                local_rank: 1,
                rendezvous: "10.0.0.1:29500".into()
            })
        );
        // The same with consistent flags (what the spawner's children see).
        let f = LaunchFlags {
            nnodes: Some(2),
            node_rank: Some(1),
            nproc_per_node: Some(2),
            rendezvous: Some("10.0.0.1:29500".into()),
            tp: Some(4),
        };
        assert!(matches!(resolve(&f, &e).unwrap(), Launch::Rank(RankSpec { rank: 3, .. })));
        let e = env(&[("RANK", "x")]);
        assert!(
            matches!(resolve(&LaunchFlags::default(), &e), Err(DistError::Env { var, .. }) if var == "RANK")
        );
    }

    #[test]
    fn world_size_overflow_is_an_error() {
        // Review of session 6: nnodes x nproc wrapped around in release builds (a world of 2
        // from --nnodes 2 --nproc-per-node 2^63 + 1, then a panic in the spawner).
        for (n, p) in [(2usize, (1usize << 63) + 1), (4, 1 << 62), (3, usize::MAX / 3 + 1)] {
            let f = LaunchFlags {
                nnodes: Some(n),
                nproc_per_node: Some(p),
                rendezvous: Some("127.0.0.1:29500".into()),
                ..LaunchFlags::default()
            };
            let e = resolve(&f, &LaunchEnv::default()).unwrap_err().to_string();
            assert!(e.contains("overflows the world size") && e.contains(&p.to_string()), "{e}");
        }
    }

    #[test]
    fn tp_launch_conflicts_name_both_sources() {
        let base =
            env(&[("RANK", "1"), ("WORLD_SIZE", "3"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "1")]);
        let f = LaunchFlags { nproc_per_node: Some(2), ..LaunchFlags::default() };
        let e = resolve(&f, &base).unwrap_err().to_string();
        assert!(e.contains("--nproc-per-node 2") && e.contains("WORLD_SIZE=3"), "{e}");
        let f = LaunchFlags { rendezvous: Some("other:1".into()), ..LaunchFlags::default() };
        let e = resolve(&f, &base).unwrap_err().to_string();
        assert!(e.contains("--rendezvous other:1") && e.contains("MASTER_ADDR=h"), "{e}");
        let f = LaunchFlags { tp: Some(2), ..LaunchFlags::default() };
        let e = resolve(&f, &base).unwrap_err().to_string();
        assert!(e.contains("--tp 2") && e.contains("WORLD_SIZE=3"), "{e}");
        let f = LaunchFlags {
            node_rank: Some(1),
            nnodes: Some(3),
            nproc_per_node: Some(1),
            ..LaunchFlags::default()
        };
        assert!(resolve(&f, &base).is_ok());
        let f = LaunchFlags {
            node_rank: Some(2),
            nnodes: Some(3),
            nproc_per_node: Some(1),
            ..LaunchFlags::default()
        };
        let e = resolve(&f, &base).unwrap_err().to_string();
        assert!(e.contains("--node-rank 2") && e.contains("RANK=1"), "{e}");
        let e = resolve(&LaunchFlags::default(), &env(&[("RANK", "0"), ("WORLD_SIZE", "2")]))
            .unwrap_err();
        assert!(e.to_string().contains("--rendezvous"), "{e}");
        let e = resolve(&LaunchFlags::default(), &env(&[("WORLD_SIZE", "2")])).unwrap_err();
        assert!(e.to_string().contains("RANK is not"), "{e}");
    }

    #[test]
    fn tp_launch_spawn_and_one_process_per_node() {
        let f = LaunchFlags { nproc_per_node: Some(4), ..LaunchFlags::default() };
        assert_eq!(
            resolve(&f, &LaunchEnv::default()).unwrap(),
            Launch::Spawn(SpawnSpec { nproc: 4, node_rank: 0, world: 4, rendezvous: None })
        );
        let f = LaunchFlags { nnodes: Some(2), nproc_per_node: Some(4), ..LaunchFlags::default() };
        assert!(resolve(&f, &LaunchEnv::default())
            .unwrap_err()
            .to_string()
            .contains("--rendezvous"));
        let f = LaunchFlags {
            nnodes: Some(2),
            node_rank: Some(1),
            nproc_per_node: Some(1),
            rendezvous: Some("[::1]:5000".into()),
            tp: None,
        };
        assert_eq!(
            resolve(&f, &LaunchEnv::default()).unwrap(),
            Launch::Rank(RankSpec {
                rank: 1,
                world: 2,
                local_rank: 0,
                rendezvous: "[::1]:5000".into()
            })
        );
        let f = LaunchFlags {
            nnodes: Some(2),
            node_rank: Some(2),
            nproc_per_node: Some(1),
            rendezvous: Some("h:1".into()),
            tp: None,
        };
        assert!(resolve(&f, &LaunchEnv::default()).is_err());
        assert_eq!(split_host_port("[::1]:80").unwrap(), ("::1".into(), 80));
        assert!(split_host_port("host").is_err());
        let e = split_host_port("host:0").unwrap_err().to_string();
        assert!(e.contains("port 0"), "{e}");
    }
}
