//! One process per rank on the CPU (issue 16): the `deltakit` binary started as separate rank
//! processes on 127.0.0.1 — by its node launcher (`--nproc-per-node N`) or by this test with
//! the torchrun-style environment (`RANK`, `WORLD_SIZE`, ...) — against the in-process `--tp`
//! run, and its failure modes: a rank missing at the rendezvous, a config mismatch, a rank
//! killed mid-decode, a rank error and a stalled rank. Every process must exit within a bound
//! (a hung process fails the test after its deadline instead of hanging CI).
//! `cargo test --release -p deltakit-engine --test multiproc`.

mod golden_common;

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use golden_common::fixtures_dir;
use rand::Rng;

/// What a finished process left.
#[derive(Debug)]
struct Done {
    status: ExitStatus,
    stdout: String,
    stderr: String,
    /// Time from the start of the wait to the exit.
    took: Duration,
}

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_deltakit"));
    // Clean launch environment: only what a test sets.
    for v in ["RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "RUST_BACKTRACE"] {
        c.env_remove(v);
    }
    c.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

/// A port that was free a moment ago.
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// Drain a pipe in a thread (so a chatty child never blocks on a full pipe).
fn drain(r: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = BufReader::new(r).read_to_string(&mut s);
        s
    })
}

/// Wait for `child` at most `limit`; a child still running then is killed and the test fails.
fn wait(mut child: Child, limit: Duration, what: &str) -> Done {
    let out = child.stdout.take().map(drain);
    let err = child.stderr.take().map(drain);
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            let e = err.map(|h| h.join().unwrap()).unwrap_or_default();
            panic!("{what}: still running after {limit:?} (killed); stderr:\n{e}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let took = t0.elapsed();
    Done {
        status,
        stdout: out.map(|h| h.join().unwrap()).unwrap_or_default(),
        stderr: err.map(|h| h.join().unwrap()).unwrap_or_default(),
        took,
    }
}

fn run(mut c: Command, limit: Duration, what: &str) -> Done {
    wait(c.spawn().unwrap(), limit, what)
}

/// `generate` arguments: greedy, JSON lines with the top-5 log-probabilities of every prompt
/// position and generated token, a small prefill chunk (chunked prefill and varlen batches).
fn gen_args(fixture: &str, prompts: &[Vec<u32>], max_tokens: usize) -> Vec<String> {
    let mut a: Vec<String> = vec![
        "generate".into(),
        "--model".into(),
        fixtures_dir().join(fixture).display().to_string(),
        "--max-tokens".into(),
        max_tokens.to_string(),
        "--json".into(),
        "--logprobs".into(),
        "5".into(),
        "--prefill-chunk".into(),
        "5".into(),
        "--ignore-eos".into(),
    ];
    for p in prompts {
        a.push("--token-ids".into());
        a.push(p.iter().map(u32::to_string).collect::<Vec<_>>().join(","));
    }
    a
}

fn random_prompts(vocab: u32) -> Vec<Vec<u32>> {
    let mut rng = rand::thread_rng();
    [1usize, 6, 13].iter().map(|&n| (0..n).map(|_| rng.gen_range(0..vocab)).collect()).collect()
}

fn rank_env(c: &mut Command, rank: usize, world: usize, port: u16) {
    c.env("RANK", rank.to_string())
        .env("WORLD_SIZE", world.to_string())
        .env("LOCAL_RANK", rank.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string());
}

const LIMIT: Duration = Duration::from_secs(30);

/// 2 and 4 rank processes started by the node launcher print exactly what the in-process
/// `--tp` run prints (greedy tokens, top-5 ids and log-probabilities, bit for bit: the TCP
/// communicator sums in rank order like the in-process one), in f32 and bf16, on random prompts
/// of three lengths decoded together.
#[test]
fn multiproc_equals_in_process_tp() {
    for (fixture, tp, dtype) in [
        ("tiny-causal", 2, "f32"),
        ("tiny-causal", 4, "f32"),
        ("tiny-trained", 2, "f32"),
        ("tiny-causal", 2, "bf16"),
    ] {
        let prompts = random_prompts(384);
        let mut args = gen_args(fixture, &prompts, 10);
        args.extend(["--dtype".into(), dtype.into()]);
        let mut inproc = bin();
        inproc.args(&args).args(["--tp", &tp.to_string()]);
        let a = run(inproc, LIMIT, "in-process");
        assert!(a.status.success(), "{fixture} tp {tp}: {}", a.stderr);
        let mut multi = bin();
        multi.args(&args).args(["--nproc-per-node", &tp.to_string()]);
        let b = run(multi, LIMIT, "launcher");
        assert!(b.status.success(), "{fixture} {tp} processes: {}", b.stderr);
        assert!(a.stdout.lines().count() > 30, "{}", a.stdout);
        assert_eq!(
            a.stdout, b.stdout,
            "{fixture} {dtype}: {tp} processes vs --tp {tp}, prompts {prompts:?}"
        );
        assert!(b.stderr.contains(&format!(" x{tp} |")), "{}", b.stderr);
        eprintln!(
            "{fixture} {dtype}: {tp} processes == --tp {tp} ({} lines), {:?} vs {:?}",
            a.stdout.lines().count(),
            b.took,
            a.took
        );
    }
}

/// The several-nodes command on one host: two node launchers (`--nnodes 2 --node-rank 0|1
/// --nproc-per-node 2 --rendezvous 127.0.0.1:PORT`), started node 1 first, make a world of 4
/// that prints what `--tp 4` prints; node 1's launcher prints nothing to stdout.
#[test]
fn multiproc_two_node_launchers_equal_in_process_tp4() {
    let prompts = random_prompts(384);
    let args = gen_args("tiny-causal", &prompts, 8);
    let mut inproc = bin();
    inproc.args(&args).args(["--tp", "4"]);
    let want = run(inproc, LIMIT, "in-process");
    assert!(want.status.success(), "{}", want.stderr);
    let addr = format!("127.0.0.1:{}", free_port());
    let nodes: Vec<Child> = [1usize, 0]
        .iter()
        .map(|&node| {
            let mut c = bin();
            c.args(&args).args(["--nnodes", "2", "--nproc-per-node", "2", "--rendezvous", &addr]);
            c.args(["--node-rank", &node.to_string()]);
            let child = c.spawn().unwrap();
            std::thread::sleep(Duration::from_millis(100));
            child
        })
        .collect();
    let done: Vec<Done> = nodes.into_iter().map(|c| wait(c, LIMIT, "node launcher")).collect();
    assert!(done.iter().all(|d| d.status.success()), "{}\n{}", done[0].stderr, done[1].stderr);
    assert!(done[0].stdout.is_empty(), "node 1 printed {:?}", done[0].stdout);
    assert_eq!(done[1].stdout, want.stdout, "prompts {prompts:?}");
}

/// The torchrun-style environment alone (no launch flags): two processes started by the test;
/// rank 0 prints the in-process output, rank 1 prints nothing to stdout; both exit 0. `bench`
/// through the launcher reports both ranks' memory.
#[test]
fn multiproc_torchrun_env_mode_and_bench() {
    let prompts = random_prompts(384);
    let args = gen_args("tiny-causal", &prompts, 8);
    let mut inproc = bin();
    inproc.args(&args).args(["--tp", "2"]);
    let want = run(inproc, LIMIT, "in-process");
    assert!(want.status.success(), "{}", want.stderr);
    let port = free_port();
    let children: Vec<Child> = [1usize, 0]
        .iter()
        .map(|&r| {
            let mut c = bin();
            c.args(&args);
            rank_env(&mut c, r, 2, port);
            c.spawn().unwrap()
        })
        .collect();
    let done: Vec<Done> = children.into_iter().map(|c| wait(c, LIMIT, "env rank")).collect();
    let (r1, r0) = (&done[0], &done[1]);
    assert!(r0.status.success() && r1.status.success(), "{}\n{}", r0.stderr, r1.stderr);
    assert_eq!(r0.stdout, want.stdout);
    assert!(r1.stdout.is_empty(), "rank 1 printed {:?}", r1.stdout);

    let mut b = bin();
    b.args(["bench", "--config"])
        .arg(fixtures_dir().join("tiny-causal"))
        .args(["--load-format", "dummy", "--batch", "2", "--prompt-len", "9", "--gen-len", "4"])
        .args(["--nproc-per-node", "2"]);
    let b = run(b, LIMIT, "bench");
    assert!(b.status.success(), "{}", b.stderr);
    assert!(
        b.stdout.contains("rank 0 on cpu") && b.stdout.contains("rank 1 on cpu"),
        "{}",
        b.stdout
    );
}

/// A rank that never arrives: rank 0 fails after `--rendezvous-timeout` naming it; a rank with
/// no rank 0 fails naming the address. Both well within bounds.
#[test]
fn multiproc_missing_rank_times_out_with_a_clear_error() {
    let args = gen_args("tiny-causal", &[vec![5, 7]], 4);
    let port = free_port();
    let mut c = bin();
    c.args(&args).args(["--rendezvous-timeout", "1"]);
    rank_env(&mut c, 0, 4, port);
    let d = run(c, Duration::from_secs(10), "lonely rank 0");
    eprintln!("rank 0 alone: exit after {:?}: {}", d.took, d.stderr.trim());
    assert!(!d.status.success());
    assert!(d.took < Duration::from_secs(5), "{:?}", d.took);
    assert!(
        d.stderr.contains("ranks [1, 2, 3] of world size 4 did not arrive within 1.0s"),
        "{}",
        d.stderr
    );
    let mut c = bin();
    c.args(&args).args(["--rendezvous-timeout", "1"]);
    rank_env(&mut c, 1, 2, free_port());
    let d = run(c, Duration::from_secs(10), "lonely rank 1");
    assert!(!d.status.success());
    assert!(d.took < Duration::from_secs(5), "{:?}", d.took);
    assert!(d.stderr.contains("could not reach rank 0 at 127.0.0.1:"), "{}", d.stderr);
}

/// Ranks that disagree (dtype, weight source) fail on every rank with the typed mismatch
/// naming the rank, the field, rank 0's value and theirs; nothing loads.
#[test]
fn multiproc_config_mismatch_is_a_typed_error_on_every_rank() {
    for (extra, max_tokens, want) in [
        (vec!["--dtype", "bf16"], 4, "rank 1 differs from rank 0 in dtype: expected f32, got bf16"),
        (vec![], 5, "rank 1 differs from rank 0 in cache (same prompts / --max-tokens / --batch on every rank): expected 1 sequences x 6 tokens"),
        (
            vec!["--load-format", "dummy", "--weight-seed", "3"],
            4,
            "rank 1 differs from rank 0 in weights: expected checkpoint ",
        ),
    ] {
        let port = free_port();
        let children: Vec<Child> = (0..2)
            .map(|r| {
                let mut c = bin();
                if r == 1 {
                    c.args(gen_args("tiny-causal", &[vec![5, 7]], max_tokens)).args(&extra);
                } else {
                    c.args(gen_args("tiny-causal", &[vec![5, 7]], 4));
                }
                rank_env(&mut c, r, 2, port);
                c.spawn().unwrap()
            })
            .collect();
        for (r, c) in children.into_iter().enumerate() {
            let d = wait(c, LIMIT, "mismatched rank");
            assert!(!d.status.success(), "rank {r}");
            assert!(d.stderr.contains(want), "rank {r}: {}", d.stderr);
            if want.contains("weights") {
                assert!(d.stderr.contains("got dummy, seed 3"), "rank {r}: {}", d.stderr);
            }
        }
    }
}

/// Four rank processes; rank `victim` stalls in forward step 4 (mid-decode) and is killed
/// there: the other three end the step with an error and exit non-zero within the watchdog time
/// (20 s here; in practice at once, on the closed connections). Rank 2 (a rank the scheduler
/// drives) and rank 0 (the scheduler: the others see their control connection end).
#[test]
fn multiproc_killed_rank_mid_decode_fails_every_process() {
    for victim in [2usize, 0] {
        let args = gen_args("tiny-causal", &[vec![5, 7, 11], vec![3]], 12);
        let port = free_port();
        let fault = format!("{victim}:stall:3:60000@4");
        let mut children: Vec<Child> = (0..4)
            .map(|r| {
                let mut c = bin();
                c.args(&args).args(["--step-timeout", "20", "--inject-fault", &fault]);
                rank_env(&mut c, r, 4, port);
                c.spawn().unwrap()
            })
            .collect();
        // Rank 0's token lines show the decode under way (steps 1-3 done, step 4 stalled).
        let (tx, rx) = mpsc::channel();
        let out = children[0].stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let t0 = Instant::now();
        let mut tokens = 0;
        while tokens < 6 {
            let line =
                rx.recv_timeout(LIMIT.saturating_sub(t0.elapsed())).expect("decode did not start");
            if line.contains("\"kind\":\"token\"") {
                tokens += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(200)); // let the group reach the stalled step
        let mut dead = children.remove(victim);
        dead.kill().unwrap();
        let _ = dead.wait();
        let t_kill = Instant::now();
        for (i, c) in children.into_iter().enumerate() {
            let r = if i < victim { i } else { i + 1 };
            let d = wait(c, Duration::from_secs(20), "survivor");
            let after = t_kill.elapsed();
            eprintln!(
                "rank {victim} killed: rank {r} exit {:?} {after:?} after the kill: {}",
                d.status.code(),
                d.stderr.lines().last().unwrap_or_default()
            );
            assert!(!d.status.success(), "rank {r} exited 0");
            assert!(after < Duration::from_secs(20), "rank {r}: {after:?}");
            if victim != 0 || r == 0 {
                continue;
            }
            assert!(d.stderr.contains("connection to rank 0"), "rank {r}: {}", d.stderr);
        }
    }
}

/// Through the node launcher: a rank error mid-decode, a panicking rank 0, and a stalled rank
/// under a 2 s watchdog all fail every process (the launcher exits non-zero naming them),
/// within the watchdog time.
#[test]
fn multiproc_rank_error_panic_and_stall_fail_every_process() {
    let args = gen_args("tiny-causal", &[vec![5, 7, 11]], 10);
    for (n, fault, timeout, want) in [
        ("2", "1:error:3@3", "20", "rank 1: backend fault: injected error at layer 3"),
        ("4", "0:panic:5@2", "20", "rank 0: panicked: injected panic at layer 5"),
        ("2", "1:stall:3:30000@3", "2", "watchdog: step did not finish within 2s"),
    ] {
        let mut c = bin();
        c.args(&args).args([
            "--nproc-per-node",
            n,
            "--inject-fault",
            fault,
            "--step-timeout",
            timeout,
        ]);
        let d = run(c, LIMIT, fault);
        eprintln!("{fault} over {n} processes: launcher exit after {:?}", d.took);
        assert!(!d.status.success(), "{fault}");
        assert!(d.stderr.contains(want), "{fault}: {}", d.stderr);
        assert!(
            d.stderr.contains(&format!("{n} of the local rank processes failed")),
            "{fault}: {}",
            d.stderr
        );
        assert!(d.took < Duration::from_secs(timeout.parse::<u64>().unwrap() + 4), "{:?}", d.took);
    }
}

/// Rank 0 failing after the rendezvous (a prompt longer than the model's context, found against
/// the loaded engine's cache; argument errors such as an out-of-vocabulary id are refused before
/// any rank starts) fails every rank, not only rank 0: rank 0's final shutdown carries the
/// failure. Through the node launcher and in the torchrun-style environment mode.
#[test]
fn multiproc_rank0_failure_after_rendezvous_fails_every_rank() {
    // tiny-causal: max_position_embeddings 4096.
    let args = gen_args("tiny-causal", &[(0..4097u32).map(|i| i % 300 + 1).collect()], 2);
    let mut c = bin();
    c.args(&args).args(["--nproc-per-node", "2"]);
    let d = run(c, LIMIT, "launcher, prompt past the context");
    assert!(!d.status.success());
    assert!(d.stderr.contains("2 of the local rank processes failed"), "{}", d.stderr);
    assert!(d.stderr.contains("rank 0 failed after the rendezvous"), "{}", d.stderr);
    let port = free_port();
    let children: Vec<Child> = (0..2)
        .map(|r| {
            let mut c = bin();
            c.args(&args);
            rank_env(&mut c, r, 2, port);
            c.spawn().unwrap()
        })
        .collect();
    for (r, c) in children.into_iter().enumerate() {
        let d = wait(c, LIMIT, "rank, prompt past the context");
        assert!(!d.status.success(), "rank {r} exited 0: {}", d.stderr);
        if r == 1 {
            assert!(d.stderr.contains("rank 0 failed after the rendezvous"), "{}", d.stderr);
            assert!(d.stderr.contains("4097 tokens exceed"), "{}", d.stderr);
        }
    }
}

/// Huge timeouts saturate instead of panicking; `--rendezvous HOST:0` is a usage error.
#[test]
fn multiproc_huge_timeouts_and_port_zero() {
    let args = gen_args("tiny-causal", &[vec![5, 7]], 2);
    let huge = u64::MAX.to_string();
    let mut c = bin();
    c.args(&args).args(["--nproc-per-node", "2", "--rendezvous-timeout", &huge]);
    c.args(["--step-timeout", &huge]);
    let d = run(c, LIMIT, "huge timeouts");
    assert!(d.status.success(), "{}", d.stderr);
    let mut c = bin();
    c.args(&args).args(["--nproc-per-node", "2", "--rendezvous", "127.0.0.1:0"]);
    let d = run(c, Duration::from_secs(10), "port 0");
    assert!(!d.status.success());
    assert!(d.stderr.contains("port 0"), "{}", d.stderr);
    assert!(d.took < Duration::from_secs(5), "{:?}", d.took);
}

/// Rank 0 stopped (SIGSTOP) mid-run: the other rank exits non-zero within its bound (the
/// silence limit on the control connection, or its own watchdog if it was in a step) instead
/// of waiting forever.
#[cfg(target_os = "linux")]
#[test]
fn multiproc_stopped_rank0_fails_the_other_ranks() {
    let args = gen_args("tiny-causal", &[vec![5, 7, 11]], 300);
    let port = free_port();
    let mut children: Vec<Child> = (0..2)
        .map(|r| {
            let mut c = bin();
            c.args(&args).args(["--step-timeout", "2"]);
            rank_env(&mut c, r, 2, port);
            c.spawn().unwrap()
        })
        .collect();
    let out = children[0].stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let t0 = Instant::now();
    loop {
        let line = rx.recv_timeout(LIMIT.saturating_sub(t0.elapsed())).expect("no decode");
        if line.contains("\"kind\":\"token\"") {
            break;
        }
    }
    let pid0 = children[0].id().to_string();
    assert!(Command::new("kill").args(["-STOP", &pid0]).status().unwrap().success());
    let t_stop = Instant::now();
    let rank1 = children.pop().unwrap();
    let d = wait(rank1, Duration::from_secs(15), "rank 1 with rank 0 stopped");
    let mut rank0 = children.pop().unwrap();
    let _ = rank0.kill();
    let _ = rank0.wait();
    eprintln!("rank 0 stopped: rank 1 exit after {:?}: {}", t_stop.elapsed(), d.stderr.trim());
    assert!(!d.status.success());
    assert!(t_stop.elapsed() < Duration::from_secs(8), "{:?}", t_stop.elapsed());
    assert!(d.stderr.contains("rank 0") || d.stderr.contains("watchdog"), "{}", d.stderr);
}

/// Two copies of a checkpoint with the same config whose safetensors headers differ are told
/// apart at the handshake (field `weights`) before anything loads.
#[test]
fn multiproc_different_checkpoints_are_a_mismatch() {
    let base = std::env::temp_dir().join(format!("deltakit-mp-weights-{}", std::process::id()));
    let (a, b) = (base.join("a"), base.join("b"));
    for d in [&a, &b] {
        std::fs::create_dir_all(d).unwrap();
        for f in ["config.json", "model.safetensors"] {
            std::fs::copy(fixtures_dir().join("tiny-trained").join(f), d.join(f)).unwrap();
        }
    }
    // Flip one byte of b's JSON header (same size: only the header hash differs).
    let st = b.join("model.safetensors");
    let mut bytes = std::fs::read(&st).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let last = 8 + n - 1;
    bytes[last] = if bytes[last] == b' ' { b'\n' } else { b' ' };
    std::fs::write(&st, bytes).unwrap();
    let port = free_port();
    let children: Vec<Child> = [&a, &b]
        .iter()
        .enumerate()
        .map(|(r, dir)| {
            let mut c = bin();
            c.args(["generate", "--model", &dir.display().to_string(), "--token-ids", "5,7"]);
            c.args(["--max-tokens", "2", "--rendezvous-timeout", "10"]);
            rank_env(&mut c, r, 2, port);
            c.spawn().unwrap()
        })
        .collect();
    for (r, c) in children.into_iter().enumerate() {
        let d = wait(c, LIMIT, "different checkpoints");
        assert!(!d.status.success(), "rank {r} exited 0");
        assert!(d.stderr.contains("rank 1 differs from rank 0 in weights"), "{}", d.stderr);
    }
    let _ = std::fs::remove_dir_all(&base);
}

/// Children of `pid` (Linux: parent pid is field 4 of /proc/PID/stat).
#[cfg(target_os = "linux")]
fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(p) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else { continue };
        // `pid (comm) state ppid ...`; comm may hold spaces: split after the last ')'.
        let rest = stat.rsplit_once(')').map_or("", |r| r.1);
        if rest.split_whitespace().nth(1).and_then(|v| v.parse::<u32>().ok()) == Some(pid) {
            out.push(p);
        }
    }
    out
}

/// Whether `pid` is still running (not gone, not a zombie).
#[cfg(target_os = "linux")]
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|r| r.1.trim_start().starts_with('Z')))
        .is_some_and(|zombie| !zombie)
}

/// A node launcher killed mid-decode takes its rank processes with it: they see their stdin
/// pipe from the launcher close and exit (no rank outlives its launcher).
#[cfg(target_os = "linux")]
#[test]
fn multiproc_killed_launcher_takes_its_ranks_down() {
    let args = gen_args("tiny-causal", &[vec![5, 7, 11]], 12);
    let mut c = bin();
    c.args(&args).args(["--nproc-per-node", "2", "--inject-fault", "1:stall:3:60000@3"]);
    let mut launcher = c.spawn().unwrap();
    let out = launcher.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let t0 = Instant::now();
    loop {
        let line = rx.recv_timeout(LIMIT.saturating_sub(t0.elapsed())).expect("no decode");
        if line.contains("\"kind\":\"token\"") {
            break;
        }
    }
    let ranks = children_of(launcher.id());
    assert_eq!(ranks.len(), 2, "{ranks:?}");
    launcher.kill().unwrap();
    let _ = launcher.wait();
    let t_kill = Instant::now();
    while ranks.iter().any(|&p| alive(p)) {
        assert!(t_kill.elapsed() < Duration::from_secs(10), "ranks outlived the launcher");
        std::thread::sleep(Duration::from_millis(10));
    }
    eprintln!("both ranks gone {:?} after the launcher was killed", t_kill.elapsed());
}

/// Review of session 6: with `--nproc-per-node`, a bad argument is reported once by the
/// launcher (no rank process starts), and a reader that closes stdout early (`... | head -c 3`)
/// ends the run successfully on every rank, as it does in one process.
#[test]
fn multiproc_argument_errors_once_and_closed_stdout() {
    let args = gen_args("tiny-causal", &[vec![5, 7, 11]], 40);
    for (bad, want) in [
        (&["--temperature", "nan"][..], "temperature"),
        (&["--token-ids", "1,99999"][..], "--token-ids: token id 99999"),
    ] {
        let mut c = bin();
        c.args(&args).args(bad).args(["--nproc-per-node", "4"]);
        let d = run(c, LIMIT, want);
        assert!(!d.status.success(), "{want}");
        assert_eq!(d.stderr.matches(want).count(), 1, "{want}: {}", d.stderr);
        assert!(!d.stderr.contains("local rank processes failed"), "{}", d.stderr);
    }
    let mut c = bin();
    c.args(&args).args(["--nproc-per-node", "2"]);
    let mut child = c.spawn().unwrap();
    let mut first = [0u8; 3];
    child.stdout.take().unwrap().read_exact(&mut first).unwrap(); // then the pipe is closed
    let d = wait(child, LIMIT, "closed stdout");
    assert!(d.status.success(), "{}", d.stderr);
    assert!(!d.stderr.contains("failed"), "{}", d.stderr);
}
