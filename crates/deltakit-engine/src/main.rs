//! `deltakit` command-line tool: `generate` (text or token ids; streaming, JSONL logprobs),
//! `bench` (dummy weights at real sizes), `eval-mc` (multiple-choice accuracy with a 95% CI),
//! `info` (build and device report).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use deltakit_engine::backend::cpu::Cpu;
#[cfg(feature = "cuda")]
use deltakit_engine::backend::cuda::CudaBackend;
use deltakit_engine::config::ModelConfig;
use deltakit_engine::dist::rendezvous::{rendezvous, RendezvousOptions};
use deltakit_engine::dist::spawn::spawn_local_ranks;
use deltakit_engine::dist::spec::{resolve, Launch, LaunchEnv, LaunchFlags, RankSpec};
use deltakit_engine::dist::Fingerprint;
use deltakit_engine::eval::{
    self, EvalError, EvalOptions, ItemResult, Observer, Summary, Template,
};
use deltakit_engine::executor::ExecutorOptions;
use deltakit_engine::generate::{Engine, Event, GenOptions, Request, SamplingParams};
use deltakit_engine::launch::{self, GraphOptions, Source, TpOptions};
use deltakit_engine::model::Qwen35;
use deltakit_engine::paths::bundled_model_dir;
use deltakit_engine::rank::Fault;
use deltakit_engine::shard::ShardPlan;
use deltakit_engine::state::CacheConfig;
use deltakit_engine::tokenizer::{parse_token_ids, StreamDecoder, Tokenizer};
use deltakit_engine::weights::SafetensorsWeights;
use deltakit_engine::EngineError;
use deltakit_ref::Elem;
use half::bf16;
use indicatif::{ProgressBar, ProgressStyle};

#[derive(Parser)]
#[command(name = "deltakit", version, about = "Gated DeltaNet / Qwen3.5 kernels and engine")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// The commands. Each takes `allow_negative_numbers`, so that a negative number reaches the
// value's parser (which names the flag and the range) rather than being taken for an unknown
// flag.
#[derive(Subcommand)]
enum Command {
    /// Print what this build contains and which devices it can use.
    Info,
    /// Generate text from prompts (default model: the bundled tiny Qwen3.5).
    #[command(allow_negative_numbers = true)]
    Generate(GenerateArgs),
    /// Throughput benchmark with dummy weights from a config alone.
    #[command(allow_negative_numbers = true)]
    Bench(BenchArgs),
    /// Multiple-choice evaluation over a JSONL file: per-item results and accuracy with a 95%
    /// Wilson interval.
    #[command(allow_negative_numbers = true)]
    EvalMc(EvalMcArgs),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum LoadFormat {
    /// safetensors from the model directory.
    Auto,
    /// Seeded random weights of the right shapes (no checkpoint needed).
    Dummy,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Dtype {
    /// f32 weights and activations (matches HF float32).
    F32,
    /// bf16 weights and activations, HF's bf16 rounding emulated.
    Bf16,
}

#[derive(Args)]
struct ModelArgs {
    /// Device: `cpu` or `cuda:N`.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Activation dtype of the CPU backend.
    #[arg(long, value_enum, default_value = "f32")]
    dtype: Dtype,
    /// Weight source.
    #[arg(long, value_enum, default_value = "auto")]
    load_format: LoadFormat,
    /// Seed of the dummy weights (with --load-format dummy only; default 0).
    #[arg(long)]
    weight_seed: Option<u64>,
    /// KV-cache page size in tokens (1..=4096).
    #[arg(long, default_value_t = 16, value_parser = page_size_arg)]
    page_size: usize,
    /// Most prompt tokens of one sequence per prefill step (>= 1; longer prompts are chunked).
    #[arg(long, default_value_t = 2048, value_parser = positive_arg)]
    prefill_chunk: usize,
    /// Tensor-parallel ranks (default 1; one thread per rank; on the CPU an in-process
    /// communicator, on CUDA NCCL with one GPU per rank). With one process per rank it is the
    /// world size and may be left out.
    #[arg(long, value_parser = positive_arg)]
    tp: Option<usize>,
    /// GPU ordinals of the ranks, comma-separated (default: N, N+1, ... from --device cuda:N).
    #[arg(long, value_delimiter = ',')]
    devices: Option<Vec<usize>>,
    /// Seconds a tensor-parallel step (or the ranks' start-up: loading, graph capture) may take
    /// before the watchdog aborts the communicator and the run fails.
    #[arg(long, default_value_t = 300, value_parser = positive_arg)]
    step_timeout: usize,
    /// CUDA: decode eagerly instead of replaying CUDA graphs captured per batch bucket.
    #[arg(long)]
    no_graphs: bool,
    /// One process per rank: machines taking part (default 1). World size = nnodes x
    /// nproc-per-node = tp.
    #[arg(long, value_parser = positive_arg)]
    nnodes: Option<usize>,
    /// One process per rank: this machine's index, 0..nnodes (default 0).
    #[arg(long)]
    node_rank: Option<usize>,
    /// One process per rank: rank processes per machine. Without RANK in the environment this
    /// command starts them (children of this binary, ranks node-rank x N ..) and waits for them;
    /// rank 0's output is the output.
    #[arg(long, value_parser = positive_arg)]
    nproc_per_node: Option<usize>,
    /// One process per rank: where rank 0 listens (an address of rank 0's machine). Also from
    /// MASTER_ADDR and MASTER_PORT; default on one machine: a free port on 127.0.0.1.
    #[arg(long, value_name = "HOST:PORT")]
    rendezvous: Option<String>,
    /// One process per rank: seconds to wait for every rank at the rendezvous.
    #[arg(long, default_value_t = 60, value_parser = positive_arg)]
    rendezvous_timeout: usize,
    /// Fault injection for the fault tests: RANK:error:LAYER, RANK:panic:LAYER or
    /// RANK:stall:LAYER:MILLISECONDS, optionally @STEP (only in forward step STEP, 0-based).
    #[arg(long, hide = true)]
    inject_fault: Option<String>,
}

impl ModelArgs {
    /// The dummy weights' seed (`--weight-seed`, default 0).
    fn seed(&self) -> u64 {
        self.weight_seed.unwrap_or(0)
    }
}

#[derive(Args)]
struct GenerateArgs {
    /// Model directory (config.json, *.safetensors, tokenizer.json). Default: the bundled tiny
    /// model (tests/fixtures/tiny-trained, or $DELTAKIT_MODEL_DIR).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Prompt text; repeat for a batch.
    #[arg(long)]
    prompt: Vec<String>,
    /// Prompt as comma-separated token ids (instead of text); repeat for a batch.
    #[arg(long)]
    token_ids: Vec<String>,
    /// Tokens to generate per prompt.
    #[arg(long, default_value_t = 32)]
    max_tokens: usize,
    /// Sampling temperature (0 = greedy; finite, >= 0).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    temperature: f32,
    /// Nucleus sampling mass, in (0, 1].
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    top_p: f32,
    /// Sampling seed (prompt i uses seed + i).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Extra stop token ids (comma-separated), besides the config's eos_token_id.
    #[arg(long)]
    stop_token_ids: Option<String>,
    /// Do not stop at the config's eos_token_id.
    #[arg(long)]
    ignore_eos: bool,
    /// Return the top-K log-probabilities of every prompt position and generated token (with
    /// --json; K >= 1; --json without it gives K = 1). A prompt record `pos = i` holds the
    /// next-token distribution AFTER prompt token i
    /// (what the model predicts for position i + 1), not the log-probability of token i itself;
    /// a generated token's record holds the distribution it was drawn from.
    #[arg(long)]
    logprobs: Option<usize>,
    /// JSON lines output (one object per prompt position and generated token).
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    common: ModelArgs,
}

#[derive(Args)]
struct BenchArgs {
    /// A model directory with config.json, or a config JSON file.
    #[arg(long)]
    config: PathBuf,
    /// Sequences decoded together.
    #[arg(long, default_value_t = 1, value_parser = positive_arg)]
    batch: usize,
    /// Prompt tokens per sequence (random ids).
    #[arg(long, default_value_t = 128, value_parser = positive_arg)]
    prompt_len: usize,
    /// Generated tokens per sequence.
    #[arg(long, default_value_t = 32, value_parser = positive_arg)]
    gen_len: usize,
    /// After the run, time up to 16 more decode steps (gen-len - 1) eagerly with CUDA events around every op and
    /// print the step's time by op family (GEMM, GDN, attention, norms/elementwise, sampling,
    /// collectives) and the host gap (CUDA backend, one device).
    #[arg(long)]
    breakdown: bool,
    #[command(flatten)]
    common: ModelArgs,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum TemplateArg {
    /// Plain text ending in "Answer:" (base and instruction models).
    Plain,
    /// The same question as one ChatML user turn (Qwen chat models).
    Chatml,
}

#[derive(Args)]
struct EvalMcArgs {
    /// Model directory (config.json, *.safetensors, tokenizer.json). Default: the bundled tiny
    /// model (tests/fixtures/tiny-trained, or $DELTAKIT_MODEL_DIR).
    #[arg(long)]
    model: Option<PathBuf>,
    /// JSONL items: {"id", "question", "options": [4..10 strings], "answer": "B" | "answer_index": 1}.
    #[arg(long)]
    data: PathBuf,
    /// Token budget per item (with --rerun-truncated: the new, larger budget).
    #[arg(long, default_value_t = 64, value_parser = positive_arg)]
    max_tokens: usize,
    /// Sequences generated together.
    #[arg(long, default_value_t = 8, value_parser = positive_arg)]
    batch: usize,
    /// Prompt template.
    #[arg(long, value_enum, default_value = "plain")]
    template: TemplateArg,
    /// Per-item results (JSONL). Default: eval_mc_results.jsonl, or with --rerun-truncated the
    /// RESULTS file itself. Written to OUT.partial while running and renamed over OUT at the
    /// end, so a failed run leaves OUT as it was. Must not be the --data file.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Regenerate only the items of RESULTS.jsonl with truncated=true, with --max-tokens (larger
    /// than their previous budget), and merge them into the results.
    #[arg(long, value_name = "RESULTS.jsonl")]
    rerun_truncated: Option<PathBuf>,
    /// Evaluate only the first N items of the data file (not with --rerun-truncated).
    #[arg(long, value_parser = positive_arg)]
    limit: Option<usize>,
    #[command(flatten)]
    common: ModelArgs,
}

/// Runs the command; an error is printed as anyhow's `Error: ...` report in one write (the rank
/// processes of `--nproc-per-node` share stderr: their reports must not interleave).
fn main() -> std::process::ExitCode {
    let result = run();
    // The reader of our stdout went away (`... | head`): not an error of ours, on rank 0 of one
    // process per rank either (the other ranks must not report a failure for it).
    let broken_pipe = result.as_ref().err().is_some_and(|e| {
        e.chain().any(|c| {
            c.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
        })
    });
    // Rank 0 of one process per rank: tell the other rank processes how the run ended (a
    // failure after the rendezvous must fail them too).
    let failure = result.as_ref().err().filter(|_| !broken_pipe).map(report);
    deltakit_engine::dist::control::finish(failure.as_deref().map_or(Ok(()), Err));
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(_) if broken_pipe => std::process::ExitCode::SUCCESS,
        Err(e) => {
            let _ =
                std::io::stderr().lock().write_all(format!("Error: {}\n", report(&e)).as_bytes());
            std::process::ExitCode::FAILURE
        }
    }
}

/// An error and its causes on one line, `outer: cause: ...`, leaving out a cause whose text
/// the line already holds (errors that print their source), and never a backtrace
/// (RUST_BACKTRACE is for panics, not for a user's bad argument).
fn report(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for c in e.chain() {
        let m = c.to_string();
        if out.contains(&m) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&m);
    }
    out
}

fn run() -> Result<()> {
    let cli = Cli::parse();
    deltakit_engine::dist::spawn::watch_launcher();
    let common = match &cli.command {
        Command::Info => None,
        Command::Generate(a) => Some((&a.common, a.model.clone())),
        Command::Bench(a) => Some((&a.common, Some(a.config.clone()))),
        Command::EvalMc(a) => Some((&a.common, a.model.clone())),
    };
    if let Some((c, model)) = common {
        if let Launch::Spawn(spec) = launch_of(c)? {
            // Refuse bad arguments and a world size the model cannot be split over here, once,
            // instead of in every rank process.
            if let Command::Generate(a) = &cli.command {
                generate_inputs(a)?;
            }
            let model = match model {
                Some(m) => m,
                None => bundled_model_dir()?,
            };
            let cfg = ModelConfig::from_path(&model)
                .with_context(|| format!("model {}", model.display()))?;
            ShardPlan::check(&cfg, spec.world)?;
            // The children fail on their own within the watchdog's time after a failure;
            // stragglers are killed a little later.
            let grace = Duration::from_secs((c.step_timeout as u64).saturating_add(5));
            spawn_local_ranks(&spec, grace)?;
            return Ok(());
        }
    }
    match cli.command {
        Command::Info => info(),
        Command::Generate(a) => generate(&a),
        Command::Bench(a) => bench(&a),
        Command::EvalMc(a) => eval_mc(&a),
    }
}

/// clap parser of `--page-size`: an integer in `1..=4096` (tokens per KV-cache page).
fn page_size_arg(s: &str) -> std::result::Result<usize, String> {
    match s.parse::<usize>() {
        Ok(v) if (1..=4096).contains(&v) => Ok(v),
        Ok(v) => Err(format!("expected 1..=4096 tokens per page, got {v}")),
        Err(e) => Err(format!("expected an integer in 1..=4096, got {s:?} ({e})")),
    }
}

/// The message of a request error without its "request:" prefix (the flag name replaces it).
fn request_msg(e: EngineError) -> String {
    match e {
        EngineError::Request(m) => m,
        e => e.to_string(),
    }
}

/// clap parser of a count that must be at least 1.
fn positive_arg(s: &str) -> std::result::Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("expected an integer >= 1, got 0".into()),
        Ok(v) => Ok(v),
        Err(e) => Err(format!("expected an integer >= 1, got {s:?} ({e})")),
    }
}

/// Check the device string for the CPU loader (`cuda:N` is routed to the CUDA loader first when
/// the CUDA backend is built).
fn check_device(device: &str) -> Result<()> {
    match device {
        "cpu" => Ok(()),
        d if d == "cuda" || d.starts_with("cuda:") => bail!(
            "device {d}: this build has no CUDA backend (rebuild with `--features cuda`); use \
             --device cpu"
        ),
        d => bail!("unknown device {d:?} (expected cpu or cuda:N)"),
    }
}

/// `Some(ordinal)` for `cuda` / `cuda:N`, `None` for `cpu`; an error for anything else.
#[cfg(feature = "cuda")]
fn cuda_device(device: &str) -> Result<Option<usize>> {
    match device {
        "cpu" => Ok(None),
        d => match CudaBackend::parse_device(d) {
            Some(n) => Ok(Some(n)),
            None => bail!("unknown device {d:?} (expected cpu or cuda:N)"),
        },
    }
}

/// Refuse CPU loads whose weights (`elem` bytes each) and state pools cannot fit in memory, with
/// a clear message (`tp` in-process ranks each hold a copy of the embedding). Counted: the
/// weights, the loader's f32 staging copy of the largest tensor
/// (the `vocab x hidden` embedding / LM head; 4 GB at Qwen3.5-9B) and the KV / GDN state pools of
/// `cache` ([`CacheConfig::memory_bytes`]).
fn check_cpu_memory(cfg: &ModelConfig, elem: usize, cache: &CacheConfig, tp: usize) -> Result<()> {
    // Every rank (thread) stages and keeps its own copy of the replicated embedding.
    let table = (cfg.vocab_size as u64) * (cfg.hidden_size as u64);
    let staging = table * 4 * tp as u64;
    let replicas = table * elem as u64 * (tp as u64).saturating_sub(1);
    let weights = cfg.num_parameters() as u64 * elem as u64 + staging + replicas;
    let pools = cache.memory_bytes(cfg, elem);
    let bytes = weights.saturating_add(pools);
    let avail_kib = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        m.lines()
            .find(|l| l.starts_with("MemAvailable:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
    });
    if let Some(kib) = avail_kib {
        if bytes > kib * 1024 {
            bail!(
                "the CPU backend needs {:.1} GB: {elem}-byte weights, {:.1} GB for {:.2} B \
                 parameters (with the loader's f32 staging of the largest tensor), and {:.1} GB \
                 of KV / GDN state for {} sequences of up to {} tokens (fewer sequences: --batch \
                 or prompts; or shorter lengths), but only {:.1} GB of memory is available",
                bytes as f64 / 1e9,
                weights as f64 / 1e9,
                cfg.num_parameters() as f64 / 1e9,
                pools as f64 / 1e9,
                cache.max_seqs,
                cache.max_context,
                (kib * 1024) as f64 / 1e9
            );
        }
    }
    Ok(())
}

/// The launch `common`'s flags and this process's environment ask for
/// ([`deltakit_engine::dist::spec`]).
fn launch_of(common: &ModelArgs) -> Result<Launch> {
    let flags = LaunchFlags {
        nnodes: common.nnodes,
        node_rank: common.node_rank,
        nproc_per_node: common.nproc_per_node,
        rendezvous: common.rendezvous.clone(),
        tp: common.tp,
    };
    Ok(resolve(&flags, &LaunchEnv::from_process())?)
}

/// `--inject-fault RANK:KIND:LAYER[:MS][@STEP]` (hidden; the fault tests use it).
fn parse_fault(s: &str) -> Result<(usize, Fault)> {
    let bad = || {
        anyhow::anyhow!("--inject-fault {s:?}: expected RANK:error|panic:LAYER[@STEP] or RANK:stall:LAYER:MS[@STEP]")
    };
    let (body, step) = match s.split_once('@') {
        Some((b, st)) => (b, Some(st.parse::<usize>().map_err(|_| bad())?)),
        None => (s, None),
    };
    let parts: Vec<&str> = body.split(':').collect();
    let num = |i: usize| parts.get(i).and_then(|p| p.parse::<usize>().ok()).ok_or_else(bad);
    let (rank, layer) = (num(0)?, num(2)?);
    let fault = match (parts.get(1).copied(), parts.len()) {
        (Some("error"), 3) => Fault::ErrorAt { layer },
        (Some("panic"), 3) => Fault::PanicAt { layer },
        (Some("stall"), 4) => Fault::StallAt { layer, dur: Duration::from_millis(num(3)? as u64) },
        _ => return Err(bad()),
    };
    Ok((
        rank,
        match step {
            Some(step) => Fault::AtStep { step, fault: Box::new(fault) },
            None => fault,
        },
    ))
}

/// Load a model per `common`: the device (`cpu` / `cuda:N`), `--tp` / `--devices`, one process
/// per rank, the weight source and the CPU dtype. Indivisible tensor-parallel counts and (CUDA)
/// unsupported shapes are refused before any weight is read; the cache is sized by `cache` from
/// the config. `None`: this process was a rank other than 0 and served rank 0 until it finished.
fn load(
    dir_or_json: &Path,
    common: &ModelArgs,
    cache: impl FnOnce(&ModelConfig) -> Result<CacheConfig>,
) -> Result<Option<Engine>> {
    let cfg = ModelConfig::from_path(dir_or_json)?;
    let launch = launch_of(common)?;
    let tp = match &launch {
        Launch::InProcess { tp } => *tp,
        Launch::Rank(r) => r.world,
        Launch::Spawn(_) => bail!("internal: the node launcher reached the loader"),
    };
    ShardPlan::check(&cfg, tp)?;
    if common.weight_seed.is_some() && common.load_format != LoadFormat::Dummy {
        bail!("--weight-seed seeds dummy weights: add --load-format dummy (or drop it)");
    }
    if common.no_graphs && !common.device.starts_with("cuda") {
        eprintln!(
            "note: --no-graphs has no effect on --device {} (CUDA graphs are a GPU feature)",
            common.device
        );
    }
    let src = match common.load_format {
        LoadFormat::Auto => {
            SafetensorsWeights::open(dir_or_json)
                .with_context(|| format!("loading weights from {}", dir_or_json.display()))?;
            Source::Dir(dir_or_json.to_path_buf())
        }
        LoadFormat::Dummy => Source::Dummy(cfg.clone(), common.seed()),
    };
    let progress = cfg.num_parameters() > 50_000_000;
    let graphs = GraphOptions { enabled: !common.no_graphs, ..GraphOptions::default() };
    let opts = TpOptions {
        graphs: graphs.clone(),
        executor: ExecutorOptions {
            step_timeout: std::time::Duration::from_secs(common.step_timeout as u64),
        },
        fault: common.inject_fault.as_deref().map(parse_fault).transpose()?,
        progress,
    };
    if let Launch::Rank(spec) = &launch {
        let cache = cache(&cfg)?;
        return load_rank(&cfg, &src, common, spec, cache, &opts)
            .with_context(|| format!("rank {} of {}", spec.rank, spec.world));
    }
    #[cfg(feature = "cuda")]
    if let Some(ord) = cuda_device(&common.device)? {
        let cache = cache(&cfg)?;
        let devices = common.devices.clone().unwrap_or_else(|| (ord..ord + tp).collect());
        if devices.len() != tp {
            bail!("--devices lists {} GPUs for --tp {}", devices.len(), tp);
        }
        if tp == 1 && common.devices.is_none() {
            return Ok(Some(launch::cuda::single(&src, ord, cache, progress, &graphs)?));
        }
        return Ok(Some(launch::cuda::tensor_parallel(src, &devices, cache, &opts)?));
    }
    check_device(&common.device)?;
    if common.devices.is_some() {
        bail!("--devices names GPU ordinals; on --device cpu use --tp alone");
    }
    let cache = cache(&cfg)?;
    let elem = match common.dtype {
        Dtype::F32 => 4,
        Dtype::Bf16 => 2,
    };
    check_cpu_memory(&cfg, elem, &cache, tp)?;
    Ok(Some(match (common.dtype, tp) {
        (Dtype::F32, 1) => load_cpu::<f32>(&cfg, &src, cache, progress)?,
        (Dtype::Bf16, 1) => load_cpu::<bf16>(&cfg, &src, cache, progress)?,
        (Dtype::F32, tp) => launch::cpu::tensor_parallel::<f32>(src, tp, cache, &opts)?,
        (Dtype::Bf16, tp) => launch::cpu::tensor_parallel::<bf16>(src, tp, cache, &opts)?,
    }))
}

/// What every rank must agree on before loading (compared with rank 0's at the rendezvous).
fn fingerprint(
    cfg: &ModelConfig,
    common: &ModelArgs,
    world: usize,
    backend: &str,
    cache: &CacheConfig,
    weights: &str,
) -> Fingerprint {
    Fingerprint::new()
        .field("deltakit version", env!("CARGO_PKG_VERSION"))
        .field("model config", Fingerprint::model_value(cfg))
        .field("tp", world)
        .field("backend", backend)
        .field("dtype", format!("{:?}", common.dtype).to_lowercase())
        .field(
            // The cache is sized from the prompts, --max-tokens, --batch and --max-context: every
            // rank must be started with the same ones (the field name says so in the error).
            "cache (same prompts / --max-tokens / --batch on every rank)",
            format!(
                "{} sequences x {} tokens, page {}, {} pages",
                cache.max_seqs, cache.max_context, cache.page_size, cache.num_pages
            ),
        )
        .field("weights", weights)
        .field("graphs", if backend == "cpu" || common.no_graphs { "off" } else { "on" })
}

/// This process as rank `spec.rank` of one process per rank: the rendezvous, then the rank
/// (rank 0: the engine; others: serve rank 0, then `None`).
fn load_rank(
    cfg: &ModelConfig,
    src: &Source,
    common: &ModelArgs,
    spec: &RankSpec,
    cache: CacheConfig,
    opts: &TpOptions,
) -> Result<Option<Engine>> {
    let weights = match src {
        Source::Dir(d) => format!(
            "checkpoint {}",
            deltakit_engine::dist::weights_identity(d)
                .with_context(|| format!("reading the checkpoint headers in {}", d.display()))?
        ),
        Source::Dummy(..) => format!("dummy, seed {}", common.seed()),
    };
    let ropts = |backend: &str, nccl_id: Option<Vec<u8>>, capacity: u64| RendezvousOptions {
        addr: spec.rendezvous.clone(),
        rank: spec.rank,
        world: spec.world,
        timeout: Duration::from_secs(common.rendezvous_timeout as u64),
        fingerprint: fingerprint(cfg, common, spec.world, backend, &cache, &weights),
        nccl_id,
        capacity,
    };
    #[cfg(feature = "cuda")]
    if let Some(ord) = cuda_device(&common.device)? {
        let device = match &common.devices {
            Some(d) => *d.get(spec.local_rank).with_context(|| {
                format!("--devices lists {} GPUs, LOCAL_RANK is {}", d.len(), spec.local_rank)
            })?,
            None => ord + spec.local_rank,
        };
        let planned = launch::cuda::plan_cache(cfg, cache, &[device], &opts.graphs)?;
        let id = if spec.rank == 0 {
            Some(deltakit_engine::comm::nccl::NcclId::new()?.to_bytes())
        } else {
            None
        };
        let group = rendezvous(&ropts("cuda", id, planned.max_seqs as u64))?;
        let agreed = usize::try_from(group.capacity).unwrap_or(usize::MAX);
        let cache = if agreed < cache.max_seqs {
            CacheConfig::for_sequences(agreed, cache.max_context, cache.page_size)
        } else {
            cache
        };
        return Ok(launch::cuda::one_process_per_rank(src, device, group, cache, opts)?);
    }
    check_device(&common.device)?;
    if common.devices.is_some() {
        bail!("--devices names GPU ordinals; on --device cpu leave it out");
    }
    let elem = match common.dtype {
        Dtype::F32 => 4,
        Dtype::Bf16 => 2,
    };
    check_cpu_memory(cfg, elem, &cache, 1)?;
    let group = rendezvous(&ropts("cpu", None, u64::MAX))?;
    Ok(match common.dtype {
        Dtype::F32 => launch::cpu::one_process_per_rank::<f32>(src, group, cache, opts)?,
        Dtype::Bf16 => launch::cpu::one_process_per_rank::<bf16>(src, group, cache, opts)?,
    })
}

/// A single-device CPU engine with activation dtype `T`.
fn load_cpu<T: Elem + 'static>(
    cfg: &ModelConfig,
    src: &Source,
    cache: CacheConfig,
    progress: bool,
) -> Result<Engine> {
    let model = Qwen35::load(&Cpu::<T>::new(), cfg, src.open()?.as_mut(), progress)?;
    Ok(Engine::new(Cpu::<T>::new(), model, cache)?)
}

/// `bench`'s memory report: per-rank weight and state bytes, and the process's peak resident
/// memory (all ranks of a process together).
fn print_rank_memory(engine: &Engine) {
    for r in engine.rank_reports() {
        println!(
            "rank {} on {}: weights {:.3} GB, state pools {:.3} GB ({:.3} MB per sequence at full \
             context), loader peak host staging {:.3} GB",
            r.rank,
            r.device,
            r.weight_bytes as f64 / 1e9,
            r.state_bytes as f64 / 1e9,
            r.state_bytes_per_seq as f64 / 1e6,
            r.peak_host_staging_bytes as f64 / 1e9,
        );
    }
    let hwm = std::fs::read_to_string("/proc/self/status").ok().and_then(|s| {
        s.lines()
            .find(|l| l.starts_with("VmHWM:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
    });
    if let Some(kib) = hwm {
        println!("process peak resident host memory: {:.3} GB", kib as f64 * 1024.0 / 1e9);
    }
}

fn cache_for(cfg: &ModelConfig, seqs: usize, max_len: usize, page_size: usize) -> CacheConfig {
    let max_context = max_len.min(cfg.max_position_embeddings).max(1);
    CacheConfig::for_sequences(seqs.max(1), max_context, page_size.max(1))
}

/// What `generate` reads and checks before any weight is loaded: the model directory, its
/// tokenizer (if any), the prompts as token ids and the stop ids. The node launcher runs it
/// too, so that a bad argument is reported once rather than by every rank process.
struct GenInputs {
    dir: PathBuf,
    tok: Option<Tokenizer>,
    prompts: Vec<(String, Vec<u32>)>,
    stop: Vec<u32>,
}

fn generate_inputs(a: &GenerateArgs) -> Result<GenInputs> {
    let dir = match &a.model {
        Some(d) => d.clone(),
        None => bundled_model_dir()?,
    };
    if !dir.exists() {
        bail!("--model {}: no such file or directory", dir.display());
    }
    let cfg = ModelConfig::from_path(&dir).with_context(|| format!("--model {}", dir.display()))?;
    let vocab = cfg.vocab_size;
    let tok_path = if dir.is_dir() {
        dir.join("tokenizer.json")
    } else {
        dir.with_file_name("tokenizer.json")
    };
    let tok = if tok_path.is_file() { Some(Tokenizer::from_path(&tok_path)?) } else { None };
    let mut prompts: Vec<(String, Vec<u32>)> = Vec::new();
    for (i, p) in a.prompt.iter().enumerate() {
        let t = tok.as_ref().with_context(|| {
            format!("--prompt needs {} (or use --token-ids)", tok_path.display())
        })?;
        let ids = t.encode(p)?;
        if ids.is_empty() {
            bail!("--prompt #{i} ({p:?}) encodes to no tokens: give a non-empty prompt");
        }
        if let Some(bad) = ids.iter().find(|&&t| t as usize >= vocab) {
            bail!("--prompt #{i}: the tokenizer gave id {bad}, outside the model's vocabulary (size {vocab})");
        }
        prompts.push((p.clone(), ids));
    }
    for s in &a.token_ids {
        let ids =
            parse_token_ids(s).map_err(|e| anyhow::anyhow!("--token-ids: {}", request_msg(e)))?;
        if let Some(bad) = ids.iter().find(|&&t| t as usize >= vocab) {
            bail!("--token-ids: token id {bad} is outside the vocabulary (size {vocab})");
        }
        let text = tok.as_ref().and_then(|t| t.decode(&ids).ok()).unwrap_or_default();
        prompts.push((text, ids));
    }
    if prompts.is_empty() {
        bail!("give a prompt: --prompt TEXT or --token-ids 1,2,3");
    }
    if a.max_tokens == 0 {
        bail!("--max-tokens must be > 0");
    }
    // Sampling parameters are checked before any model is loaded (the engine checks them too).
    let sampling =
        SamplingParams { temperature: a.temperature, top_p: a.top_p, ..SamplingParams::default() };
    if let Err(EngineError::Request(m)) = sampling.validate() {
        bail!("{m}");
    }
    // Session 11: 0 is checked first, and its message says what leaving the flag out does
    // (--json alone prints top-1 lists; without --json there are no lists).
    if a.logprobs == Some(0) {
        bail!(
            "--logprobs 0 must be >= 1 (leave it out: --json alone prints top-1 lists, \
             without --json none are printed)"
        );
    }
    if a.logprobs.is_some() && !a.json {
        bail!("--logprobs K prints JSON lines: add --json");
    }
    if let Some(k) = a.logprobs.filter(|&k| k > vocab) {
        bail!("--logprobs {k} exceeds the vocabulary (size {vocab})");
    }
    let mut stop = if a.ignore_eos { Vec::new() } else { cfg.eos_token_ids.clone() };
    if let Some(s) = &a.stop_token_ids {
        let ids = parse_token_ids(s)
            .map_err(|e| anyhow::anyhow!("--stop-token-ids: {}", request_msg(e)))?;
        if let Some(bad) = ids.iter().find(|&&t| t as usize >= vocab) {
            bail!("--stop-token-ids: token id {bad} is outside the vocabulary (size {vocab})");
        }
        stop.extend(ids);
    }
    Ok(GenInputs { dir, tok, prompts, stop })
}

fn generate(a: &GenerateArgs) -> Result<()> {
    let GenInputs { dir, tok, prompts, stop } = generate_inputs(a)?;
    let longest = prompts.iter().map(|p| p.1.len()).max().unwrap_or(0);
    let t_load = Instant::now();
    let cache = |cfg: &ModelConfig| {
        Ok(cache_for(cfg, prompts.len(), longest.saturating_add(a.max_tokens), a.common.page_size))
    };
    let Some(engine) = load(&dir, &a.common, cache)? else {
        return Ok(());
    };
    run_generate(a, &dir, tok.as_ref(), &prompts, &stop, engine, t_load)
}

/// The backend-generic part of `generate`: requests, streaming / JSONL output, timing.
#[allow(clippy::too_many_lines)]
fn run_generate(
    a: &GenerateArgs,
    dir: &Path,
    tok: Option<&Tokenizer>,
    prompts: &[(String, Vec<u32>)],
    stop: &[u32],
    mut engine: Engine,
    t_load: Instant,
) -> Result<()> {
    let load_s = t_load.elapsed().as_secs_f64();
    let cfg = engine.config().clone();
    let requests: Vec<Request> = prompts
        .iter()
        .enumerate()
        .map(|(i, (_, ids))| Request {
            prompt: ids.clone(),
            params: SamplingParams {
                temperature: a.temperature,
                top_p: a.top_p,
                seed: a.seed.wrapping_add(i as u64),
                max_tokens: a.max_tokens,
                stop_tokens: stop.to_vec(),
                logprobs: a.logprobs.or(if a.json { Some(1) } else { None }),
                prompt_logprobs: a.json,
            },
        })
        .collect();
    // Checked here too (the engine does) so that nothing is printed for a failing run.
    let max_ctx = engine.cache_config().max_context;
    for (i, (_, ids)) in prompts.iter().enumerate() {
        if ids.len() > max_ctx {
            bail!(
                "prompt {i}: {} tokens exceed the maximum context of {max_ctx} tokens (the \
                 model's max_position_embeddings is {})",
                ids.len(),
                cfg.max_position_embeddings
            );
        }
    }
    let stream = !a.json && prompts.len() == 1;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if stream {
        write!(out, "{}", prompts[0].0)?;
        out.flush()?;
    }
    let mut decoders = vec![StreamDecoder::new(); prompts.len()];
    let mut io_err: Option<std::io::Error> = None;
    let piece = |id: u32| tok.and_then(|t| t.decode(&[id]).ok()).unwrap_or_default();
    let topk_json = |v: &[(u32, f32)]| -> serde_json::Value {
        v.iter().map(|(i, l)| serde_json::json!({"id": i, "logprob": l})).collect()
    };
    let mut on_event = |ev: Event| {
        let res = match &ev {
            Event::Prompt { req, pos, token, topk } if a.json => writeln!(
                out,
                "{}",
                serde_json::json!({"request": req, "kind": "prompt", "pos": pos, "token": token,
                    "text": piece(*token), "top_logprobs": topk_json(topk)})
            ),
            Event::Token { req, index, token, logprob, topk } if a.json => writeln!(
                out,
                "{}",
                serde_json::json!({"request": req, "kind": "token", "index": index,
                    "token": token, "text": piece(*token), "logprob": logprob,
                    "top_logprobs": topk.as_deref().map(topk_json)})
            ),
            Event::Token { req, token, .. } if stream => {
                let text = tok
                    .and_then(|t| decoders[*req].push(t, *token).ok())
                    .unwrap_or_else(|| format!(" {token}"));
                write!(out, "{text}").and_then(|()| out.flush())
            }
            Event::Finished { req, reason } if a.json => writeln!(
                out,
                "{}",
                serde_json::json!({"request": req, "kind": "finished", "reason": format!("{reason:?}")})
            ),
            _ => Ok(()),
        };
        if let Err(e) = res {
            io_err.get_or_insert(e);
        }
    };
    let opts = GenOptions { prefill_chunk: a.common.prefill_chunk, ..GenOptions::default() };
    let (completions, stats) = engine.generate(&requests, opts, &mut on_event)?;
    if let Some(e) = io_err {
        return Err(e.into());
    }
    if stream {
        if let Some(t) = tok {
            write!(out, "{}", decoders[0].finish(t)?)?;
        }
        writeln!(out)?;
    } else if !a.json {
        for (i, c) in completions.iter().enumerate() {
            let text = match tok {
                Some(t) => t.decode(&c.tokens)?,
                None => format!("{:?}", c.tokens),
            };
            writeln!(out, "[{i}] {}{text}", prompts[i].0)?;
        }
    }
    if !a.json {
        // JSON output carries the reason per request; in text mode say it when the context, not
        // --max-tokens or a stop token, ended a request.
        for (i, c) in completions.iter().enumerate() {
            if c.reason == deltakit_engine::generate::FinishReason::Context {
                eprintln!(
                    "note: request {i} stopped at the maximum context after {} new tokens \
                     (fewer than --max-tokens)",
                    c.tokens.len()
                );
            }
        }
    }
    eprintln!(
        "model {} ({} layers, {:.2} M params) on {} | load {load_s:.2}s",
        dir.display(),
        cfg.num_layers,
        cfg.num_parameters() as f64 / 1e6,
        engine.backend_name()
    );
    eprintln!("{}", stats.summary());
    Ok(())
}

fn bench(a: &BenchArgs) -> Result<()> {
    if a.common.load_format != LoadFormat::Dummy {
        bail!("bench runs with --load-format dummy (weights from the config alone)");
    }
    ModelConfig::from_path(&a.config).context("--config")?;
    let t_load = Instant::now();
    // Lengths against the model before any weight or prompt is allocated (a huge --prompt-len
    // would otherwise fail only when the random prompts are built).
    let cache = |cfg: &ModelConfig| {
        let total =
            a.prompt_len.checked_add(a.gen_len).filter(|&n| n <= cfg.max_position_embeddings);
        let Some(total) = total else {
            bail!(
                "--prompt-len {} + --gen-len {} exceeds the model's max_position_embeddings {}",
                a.prompt_len,
                a.gen_len,
                cfg.max_position_embeddings
            );
        };
        Ok(cache_for(cfg, a.batch, total, a.common.page_size))
    };
    let Some(engine) = load(&a.config, &a.common, cache)? else {
        return Ok(());
    };
    run_bench(a, engine, t_load)
}

/// The backend-generic part of `bench`.
fn run_bench(a: &BenchArgs, mut engine: Engine, t_load: Instant) -> Result<()> {
    let load_s = t_load.elapsed().as_secs_f64();
    if a.breakdown && engine.profile(None)?.is_none() {
        bail!("--breakdown needs the CUDA backend on one device (no --tp / --devices)");
    }
    let cfg = engine.config().clone();
    let mut rng = StdRng::seed_from_u64(a.common.seed() ^ 0x5eed);
    let requests: Vec<Request> = (0..a.batch)
        .map(|i| Request {
            prompt: (0..a.prompt_len).map(|_| rng.gen_range(0..cfg.vocab_size as u32)).collect(),
            params: SamplingParams {
                max_tokens: a.gen_len,
                seed: i as u64,
                ..SamplingParams::default()
            },
        })
        .collect();
    let opts = GenOptions { prefill_chunk: a.common.prefill_chunk, ..GenOptions::default() };
    // Warm-up (not timed): the same prompts with 2 new tokens, so that module loads, cuBLASLt
    // plan creation and the skinny-GEMM autotune of the decode shapes happen before timing (a
    // graph engine did that for decode at capture; this makes eager and graph runs comparable).
    let warm: Vec<Request> = requests
        .iter()
        .map(|r| Request {
            prompt: r.prompt.clone(),
            params: SamplingParams { max_tokens: 2.min(a.gen_len), ..r.params.clone() },
        })
        .collect();
    engine.generate(&warm, opts, &mut |_| {})?;
    let (_, stats) = engine.generate(&requests, opts, &mut |_| {})?;
    println!(
        "bench {} | {:.3} B params, {} layers | device {} | batch {} prompt {} gen {} | load {load_s:.2}s",
        a.config.display(),
        cfg.num_parameters() as f64 / 1e9,
        cfg.num_layers,
        engine.backend_name(),
        a.batch,
        a.prompt_len,
        a.gen_len
    );
    println!(
        "prefill: {:.1} tok/s ({} tok, {:.3}s) | decode: {:.1} tok/s, {:.3} ms/step ({} steps) | ttft {:.1} ms",
        stats.prefill_tok_s(),
        stats.prefill_tokens,
        stats.prefill_time.as_secs_f64(),
        stats.decode_tok_s(),
        stats.decode_step_latency().as_secs_f64() * 1e3,
        stats.decode_steps,
        stats.mean_ttft.as_secs_f64() * 1e3
    );
    print_rank_memory(&engine);
    if a.breakdown {
        breakdown(a, &mut engine, &requests)?;
    }
    Ok(())
}

/// `bench --breakdown`: prefill the bench's prompts again, then time up to 16 eager decode steps
/// with per-op CUDA events; prints ms per step by op family and the host gap (wall time per step
/// minus the GPU time of the ops).
fn breakdown(a: &BenchArgs, engine: &mut Engine, requests: &[Request]) -> Result<()> {
    use deltakit_engine::generate::{RowSampling, StepItem, Want};
    if engine.profile(None)?.is_none() {
        bail!("--breakdown needs the CUDA backend on one device (no --tp / --devices)");
    }
    let seqs: Vec<_> = requests.iter().map(|_| engine.add_sequence()).collect::<Result<_, _>>()?;
    let items: Vec<StepItem<'_>> = seqs
        .iter()
        .zip(requests)
        .map(|(&seq, r)| StepItem { seq, tokens: &r.prompt, want: Want::Last })
        .collect();
    engine.step(&items)?;
    let steps = a.gen_len.saturating_sub(1).clamp(1, 16);
    let rows: Vec<RowSampling> = (0..seqs.len())
        .map(|_| RowSampling { temperature: 0.0, top_p: 1.0, seed: 0, counter: 0, topk: 0 })
        .collect();
    let mut toks: Vec<[u32; 1]> = requests.iter().map(|r| [r.prompt[0]]).collect();
    engine.profile(Some(true))?;
    let t0 = Instant::now();
    for _ in 0..steps {
        let items: Vec<StepItem<'_>> = seqs
            .iter()
            .zip(&toks)
            .map(|(&seq, t)| StepItem { seq, tokens: t, want: Want::Last })
            .collect();
        let out = engine.decode_sample(&items, &rows)?;
        toks = out.iter().map(|s| [s.token]).collect();
    }
    let wall = t0.elapsed().as_secs_f64() * 1e3 / steps as f64;
    let fams = engine.profile(None)?.unwrap_or_default();
    engine.profile(Some(false))?;
    for s in seqs {
        engine.end_sequence(s)?;
    }
    let gpu: f64 = fams.iter().map(|f| f.1).sum::<f64>() / steps as f64;
    println!("breakdown (eager decode, batch {}, {steps} steps, CUDA events per op):", a.batch);
    for (name, ms) in &fams {
        let per = ms / steps as f64;
        println!("  {name:<18} {per:8.3} ms/step  {:5.1}%", 100.0 * per / wall);
    }
    println!(
        "  {:<18} {:8.3} ms/step  {:5.1}%   (wall {wall:.3} ms/step)",
        "host gaps",
        wall - gpu,
        100.0 * (wall - gpu) / wall
    );
    Ok(())
}

/// Progress bar and streaming of results to the output file.
struct EvalProgress {
    bar: ProgressBar,
    out: Option<(PathBuf, std::io::BufWriter<std::fs::File>)>,
    /// Results written to `out` so far.
    written: usize,
}

impl Observer for EvalProgress {
    fn sequence_finished(&mut self) {
        self.bar.inc(1);
    }

    fn item_done(&mut self, r: &ItemResult) -> std::result::Result<(), EvalError> {
        if let Some((path, f)) = &mut self.out {
            let io = |source| EvalError::Io { path: path.clone(), source };
            writeln!(f, "{}", eval::report::to_line(r)?).map_err(io)?;
            f.flush().map_err(io)?;
            self.written += 1;
        }
        Ok(())
    }
}

fn eval_mc(a: &EvalMcArgs) -> Result<()> {
    if a.limit.is_some() && a.rerun_truncated.is_some() {
        bail!("--limit cannot be combined with --rerun-truncated");
    }
    let dir = match &a.model {
        Some(d) => d.clone(),
        None => bundled_model_dir()?,
    };
    if !dir.is_dir() {
        bail!("--model {}: not a model directory", dir.display());
    }
    let tok = Tokenizer::from_path(&dir.join("tokenizer.json"))?;
    let mut items = eval::load_jsonl(&a.data).context("--data")?;
    if let Some(n) = a.limit {
        items.truncate(n);
    }
    let template = match a.template {
        TemplateArg::Plain => Template::Plain,
        TemplateArg::Chatml => Template::Chatml,
    };
    let previous = a
        .rerun_truncated
        .as_deref()
        .map(eval::report::read_results)
        .transpose()
        .context("--rerun-truncated")?;
    let todo = match &previous {
        Some(prev) => eval::select_truncated(&items, prev, a.max_tokens)?,
        None => items.clone(),
    };
    let out = match (&a.out, &a.rerun_truncated) {
        (Some(o), _) => o.clone(),
        (None, Some(r)) => r.clone(),
        (None, None) => PathBuf::from("eval_mc_results.jsonl"),
    };
    if same_file(&out, &a.data) {
        bail!(
            "--out {} is the --data file: refusing to overwrite the data with results",
            out.display()
        );
    }
    let prompts = eval::encode_prompts(&tok, &todo, template)?;
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(1);
    let t0 = Instant::now();
    let cache = |cfg: &ModelConfig| {
        // Never more slots than items to run.
        let slots = a.batch.min(prompts.len().max(1));
        Ok(cache_for(cfg, slots, longest.saturating_add(a.max_tokens), a.common.page_size))
    };
    let job = EvalJob {
        a,
        dir: &dir,
        tok: &tok,
        todo: &todo,
        prompts: &prompts,
        template,
        previous,
        out: &out,
    };
    let Some(engine) = load(&dir, &a.common, cache)? else {
        return Ok(());
    };
    run_eval(&job, engine, t0)
}

/// Whether `a` and `b` name the same file (canonical paths; for a file that does not exist yet,
/// its canonical parent directory and name).
fn same_file(a: &Path, b: &Path) -> bool {
    fn canon(p: &Path) -> Option<PathBuf> {
        std::fs::canonicalize(p).ok().or_else(|| {
            let parent = match p.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => Path::new("."),
            };
            Some(std::fs::canonicalize(parent).ok()?.join(p.file_name()?))
        })
    }
    match (canon(a), canon(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// `OUT.partial`: where results stream while a run is in progress.
fn partial_path(out: &Path) -> PathBuf {
    let mut name = out.file_name().map(std::ffi::OsStr::to_os_string).unwrap_or_default();
    name.push(".partial");
    out.with_file_name(name)
}

/// Everything `run_eval` needs besides the engine.
struct EvalJob<'a> {
    a: &'a EvalMcArgs,
    dir: &'a Path,
    tok: &'a Tokenizer,
    todo: &'a [eval::McItem],
    prompts: &'a [Vec<u32>],
    template: Template,
    previous: Option<Vec<ItemResult>>,
    out: &'a Path,
}

/// The backend-generic part of `eval-mc`: generation with a progress bar, results, summary.
fn run_eval(job: &EvalJob<'_>, mut engine: Engine, t0: Instant) -> Result<()> {
    let a = job.a;
    let cfg = engine.config().clone();
    let opts = EvalOptions {
        max_tokens: a.max_tokens,
        batch: a.batch,
        template: job.template,
        stop_tokens: eval::stop_tokens(job.tok, &cfg.eos_token_ids, job.template),
        gen: GenOptions { prefill_chunk: a.common.prefill_chunk, ..GenOptions::default() },
    };
    let bar = ProgressBar::new(job.todo.len() as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{bar:40} {pos}/{len} items [{elapsed_precise} < {eta}] {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    // A fresh run streams to OUT.partial (OUT itself is only replaced at the end, by a rename).
    let partial = partial_path(job.out);
    let stream_to = if job.previous.is_none() {
        let f = std::fs::File::create(&partial)
            .with_context(|| format!("creating {}", partial.display()))?;
        Some((partial.clone(), std::io::BufWriter::new(f)))
    } else {
        None
    };
    let mut obs = EvalProgress { bar, out: stream_to, written: 0 };
    let fresh = match eval::evaluate(&mut engine, job.tok, job.todo, job.prompts, &opts, &mut obs) {
        Ok(f) => f,
        Err(e) => {
            obs.bar.finish_and_clear();
            if obs.out.take().is_some() {
                if obs.written == 0 {
                    let _ = std::fs::remove_file(&partial);
                } else {
                    eprintln!(
                        "{} results of the failed run are in {} ({} is unchanged)",
                        obs.written,
                        partial.display(),
                        job.out.display()
                    );
                }
            }
            return Err(e.into());
        }
    };
    obs.bar.finish_and_clear();
    if let Some((p, f)) = obs.out.take() {
        let file = f.into_inner().map_err(std::io::IntoInnerError::into_error)?;
        file.sync_all().with_context(|| format!("writing {}", p.display()))?;
        std::fs::rename(&p, job.out)
            .with_context(|| format!("renaming {} to {}", p.display(), job.out.display()))?;
    }
    let results = if let Some(prev) = &job.previous {
        let merged = eval::merge(prev.clone(), fresh);
        eval::report::write_results(job.out, &merged)?;
        merged
    } else {
        fresh
    };
    let summary = Summary::of(&results);
    let what = if job.previous.is_some() {
        format!("reran {} truncated item(s) with max_tokens {}", job.todo.len(), a.max_tokens)
    } else {
        format!("max_tokens {}", a.max_tokens)
    };
    eprintln!(
        "eval-mc {} | model {} on {} | {} | {:.2}s",
        a.data.display(),
        job.dir.display(),
        engine.backend_name(),
        what,
        t0.elapsed().as_secs_f64()
    );
    let methods: Vec<String> =
        eval::report::method_counts(&results).iter().map(|(m, n)| format!("{m} {n}")).collect();
    println!("{summary}");
    println!("extraction: {}", methods.join(", "));
    println!("results: {}", job.out.display());
    Ok(())
}

// Fallible only with feature `cuda` (device queries).
#[cfg_attr(not(feature = "cuda"), allow(clippy::unnecessary_wraps))]
fn info() -> Result<()> {
    // Written with `?` (not println!): a closed pipe (`deltakit info | head -1`) ends the
    // command quietly instead of panicking.
    let mut o = std::io::stdout().lock();
    writeln!(o, "deltakit {}", env!("CARGO_PKG_VERSION"))?;
    writeln!(o, "cpu reference backend: yes (deltakit-ref)")?;
    #[cfg(feature = "cuda")]
    {
        writeln!(
            o,
            "cuda backend: built (engine on one GPU, bf16: cuBLASLt GEMM, gdr.chunk_prefill / \
             gdr.decode, conv1d, attn.prep / prefill / decode, norms; --device cuda:N)"
        )?;
        match deltakit::try_context(0) {
            Some(_) => {
                let n = deltakit::cudarc::driver::CudaContext::device_count()?;
                writeln!(o, "cuda devices: {n}")?;
                for i in 0..usize::try_from(n).unwrap_or(0) {
                    if let Some(ctx) = deltakit::try_context(i) {
                        let (maj, min) = ctx.compute_capability()?;
                        writeln!(o, "  cuda:{i}: {} (sm_{maj}{min})", ctx.name()?)?;
                    }
                }
            }
            None => writeln!(o, "cuda devices: none usable on this machine")?,
        }
        match deltakit_engine::comm::nccl::loaded() {
            Ok(v) => writeln!(o, "nccl: loaded (version code {v}); --tp N runs one GPU per rank")?,
            Err(e) => writeln!(o, "nccl: not available ({e}); --tp > 1 on CUDA will fail")?,
        }
    }
    #[cfg(not(feature = "cuda"))]
    writeln!(o, "cuda backend: not built (rebuild with `--features cuda`); nccl: not built")?;
    writeln!(o, "tensor parallel: --tp N (cpu: in-process communicator; cuda: NCCL)")?;
    writeln!(
        o,
        "one process per rank: --nproc-per-node N [--nnodes M --node-rank K --rendezvous \
         HOST:PORT], or RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT (cpu: TCP \
         communicator; cuda: NCCL with the id handed out at the rendezvous)"
    )?;
    writeln!(
        o,
        "engine: Qwen3.5 dense (GDN + gated attention), backends: cpu{}",
        if cfg!(feature = "cuda") { ", cuda" } else { " (cuda: rebuild with --features cuda)" }
    )?;
    match bundled_model_dir() {
        Ok(d) => writeln!(o, "bundled model: {}", d.display())?,
        Err(_) => writeln!(o, "bundled model: not found from here")?,
    }
    // Prove the CPU path end to end on a tiny op.
    let (x, y) = ([1.0f32, 2.0, 3.0], [0.5f32, 0.25, 0.125]);
    let mut out = [0.0f32; 3];
    deltakit_ref::smoke::vadd_f32(&x, &y, &mut out)?;
    writeln!(o, "cpu smoke.vadd([1,2,3],[0.5,0.25,0.125]) = {out:?}")?;
    Ok(())
}
