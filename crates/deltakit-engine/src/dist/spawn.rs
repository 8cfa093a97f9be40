//! The node launcher (`--nproc-per-node N` without `RANK` in the environment): start this
//! machine's `N` rank processes as children of the same binary with the same arguments, each
//! with the torchrun-style environment of its rank (`RANK`, `LOCAL_RANK`, `WORLD_SIZE`,
//! `LOCAL_WORLD_SIZE`, `GROUP_RANK`, `MASTER_ADDR`, `MASTER_PORT`), and wait for them.
//!
//! The children inherit stdout and stderr: rank 0's output is the command's output (the other
//! ranks print nothing to stdout). Their stdin is a pipe from the launcher that is never
//! written, and [`LAUNCHER_PIPE`] is set: a child sees the pipe end when the launcher is gone
//! (killed) and exits non-zero ([`watch_launcher`]), so no rank outlives its launcher. When a
//! child fails, the others normally fail
//! within the watchdog's time on their own (their group is aborted); any still running
//! `grace` later are killed. The launcher fails ([`DistError::ChildFailed`]) when any child
//! did not exit with status 0.

use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::spec::{join_host_port, split_host_port, SpawnSpec};
use super::DistError;

/// Environment variable set on the children: their stdin is the launcher's watch pipe.
pub const LAUNCHER_PIPE: &str = "DELTAKIT_LAUNCHER_PIPE";

/// In a child of the node launcher ([`LAUNCHER_PIPE`] set), watch stdin in a thread and end the
/// process with status 1 when it closes (the launcher is gone); elsewhere do nothing.
pub fn watch_launcher() {
    if std::env::var_os(LAUNCHER_PIPE).is_none() {
        return;
    }
    let _ = std::thread::Builder::new().name("deltakit-launcher-watch".into()).spawn(|| {
        let mut buf = [0u8; 64];
        loop {
            match std::io::stdin().read(&mut buf) {
                Ok(0) => break,
                Err(e) if e.kind() != std::io::ErrorKind::Interrupted => break,
                _ => {}
            }
        }
        let _ = std::io::stderr()
            .lock()
            .write_all(b"Error: the node launcher (--nproc-per-node) is gone; this rank exits\n");
        std::process::exit(1);
    });
}

/// Start `spec.nproc` copies of this process as ranks `spec.node_rank * nproc + i` and wait for
/// them (see the module docs). Returns the rendezvous address used.
///
/// # Errors
/// [`DistError::Usage`] when the executable or a free port cannot be found or a child cannot be
/// started (already started children are killed); [`DistError::ChildFailed`] naming every
/// child that failed and how.
pub fn spawn_local_ranks(spec: &SpawnSpec, grace: Duration) -> Result<String, DistError> {
    let exe = std::env::current_exe().map_err(|e| {
        DistError::Usage(format!("cannot find this executable to start the ranks: {e}"))
    })?;
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let addr = if let Some(a) = &spec.rendezvous {
        a.clone()
    } else {
        let l = std::net::TcpListener::bind("127.0.0.1:0")
            .map_err(|e| DistError::Usage(format!("no free local port for the rendezvous: {e}")))?;
        let port = l
            .local_addr()
            .map_err(|e| DistError::Usage(format!("no free local port: {e}")))?
            .port();
        join_host_port("127.0.0.1", port)
    };
    let (host, port) = split_host_port(&addr)?;
    let mut children: Vec<(usize, usize, Child)> = Vec::with_capacity(spec.nproc);
    for local in 0..spec.nproc {
        let rank = spec.node_rank * spec.nproc + local;
        let child = Command::new(&exe)
            .args(&args)
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", local.to_string())
            .env("WORLD_SIZE", spec.world.to_string())
            .env("LOCAL_WORLD_SIZE", spec.nproc.to_string())
            .env("GROUP_RANK", spec.node_rank.to_string())
            .env("MASTER_ADDR", &host)
            .env("MASTER_PORT", port.to_string())
            .env(LAUNCHER_PIPE, "1")
            .stdin(Stdio::piped())
            .spawn();
        match child {
            Ok(c) => children.push((local, rank, c)),
            Err(e) => {
                for (_, _, mut c) in children {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                return Err(DistError::Usage(format!(
                    "cannot start local rank {local} ({}): {e}",
                    exe.display()
                )));
            }
        }
    }
    wait_all(children, grace)?;
    Ok(addr)
}

/// Wait for every child; after the first failure, kill those still running `grace` later.
fn wait_all(mut running: Vec<(usize, usize, Child)>, grace: Duration) -> Result<(), DistError> {
    let mut failures: Vec<(usize, usize, String)> = Vec::new();
    let mut first_failure: Option<Instant> = None;
    while !running.is_empty() {
        let mut i = 0;
        while i < running.len() {
            match running[i].2.try_wait() {
                Ok(Some(status)) => {
                    let (local, rank, _) = running.swap_remove(i);
                    if !status.success() {
                        failures.push((local, rank, format!("exited with {status}")));
                        first_failure.get_or_insert_with(Instant::now);
                    }
                }
                Ok(None) => i += 1,
                Err(e) => {
                    let (local, rank, mut c) = running.swap_remove(i);
                    let _ = c.kill();
                    let _ = c.wait();
                    failures.push((local, rank, format!("could not be waited for ({e})")));
                    first_failure.get_or_insert_with(Instant::now);
                }
            }
        }
        if first_failure.is_some_and(|t| t.elapsed() >= grace) {
            for (local, rank, mut c) in running.drain(..) {
                let _ = c.kill();
                let _ = c.wait();
                failures.push((
                    local,
                    rank,
                    format!("was killed {:.0}s after the first failure", grace.as_secs_f64()),
                ));
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if failures.is_empty() {
        Ok(())
    } else {
        failures.sort_by_key(|f| f.0);
        Err(DistError::ChildFailed { failures })
    }
}
