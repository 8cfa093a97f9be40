//! Building engines: a model directory or config -> shard plans -> ranks (single device, an
//! [`crate::executor::Executor`] of `tp` rank threads, or one process per rank over a
//! [`crate::dist::rendezvous::Group`]) -> [`Engine`]. The CLI and the tests start here.

use crate::generate::Engine;

/// Where the weights come from.
#[derive(Clone, Debug)]
pub enum Source {
    /// A checkpoint directory (each rank maps it and reads only its shards).
    Dir(std::path::PathBuf),
    /// Seeded dummy weights for a config ([`crate::weights::DummyWeights`]).
    Dummy(crate::config::ModelConfig, u64),
}

impl Source {
    /// The model config of the source.
    ///
    /// # Errors
    /// Config errors.
    pub fn config(&self) -> crate::error::Result<crate::config::ModelConfig> {
        match self {
            Source::Dir(d) => crate::config::ModelConfig::from_path(d),
            Source::Dummy(c, _) => Ok(c.clone()),
        }
    }

    /// A fresh weight source (opened per rank).
    ///
    /// # Errors
    /// Checkpoint open errors.
    pub fn open(&self) -> crate::error::Result<Box<dyn crate::weights::WeightSource>> {
        Ok(match self {
            Source::Dir(d) => Box::new(crate::weights::SafetensorsWeights::open(d)?),
            Source::Dummy(_, seed) => Box::new(crate::weights::DummyWeights::new(*seed)),
        })
    }
}

/// CUDA-graph settings of a CUDA engine (the `graph` module, feature `cuda`; ignored on the CPU).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GraphOptions {
    /// Capture and replay decode graphs (`--no-graphs` turns them off).
    pub enabled: bool,
    /// Candidate bucket sizes, ascending.
    pub buckets: Vec<usize>,
}

impl Default for GraphOptions {
    fn default() -> Self {
        Self { enabled: true, buckets: crate::capacity::DEFAULT_BUCKETS.to_vec() }
    }
}

/// Options of the tensor-parallel builders.
#[derive(Clone, Debug, Default)]
pub struct TpOptions {
    /// CUDA graphs (CUDA builders only).
    pub graphs: GraphOptions,
    /// Executor settings (watchdog).
    pub executor: crate::executor::ExecutorOptions,
    /// Fault injection: `(rank, fault)` (fault tests only).
    pub fault: Option<(usize, crate::rank::Fault)>,
    /// Show a loading progress bar (rank 0).
    pub progress: bool,
}

/// CPU engine builders: single device ([`cpu::load`], [`cpu::dummy`]) and tensor-parallel over
/// in-process rank threads ([`cpu::tensor_parallel`]).
pub mod cpu {
    use std::path::Path;
    use std::sync::{Arc, Mutex};

    use deltakit_ref::Elem;

    use super::{Engine, Source, TpOptions};
    use crate::backend::cpu::{Cpu, CpuBackend};
    use crate::comm::{Communicator, CpuComm};
    use crate::config::ModelConfig;
    use crate::error::{EngineError, Result};
    use crate::executor::{Executor, RankFactory, RankWorker};
    use crate::model::Qwen35;
    use crate::rank::Rank;
    use crate::shard::ShardPlan;
    use crate::state::CacheConfig;
    use crate::weights::{DummyWeights, SafetensorsWeights};

    /// Load `dir` (config.json + safetensors) onto the f32 CPU backend.
    ///
    /// # Errors
    /// As [`load_as`].
    pub fn load(dir: &Path, cache: CacheConfig, progress: bool) -> Result<Engine> {
        load_as::<f32>(dir, cache, progress)
    }

    /// Load `dir` onto the CPU backend with activation dtype `T` (`f32` or `bf16`).
    ///
    /// # Errors
    /// [`EngineError::Capacity`] for bad cache sizes ([`CacheConfig::validate`], before any
    /// weight is read); config, weights and allocation errors.
    pub fn load_as<T: Elem>(dir: &Path, cache: CacheConfig, progress: bool) -> Result<Engine> {
        cache.validate()?;
        let cfg = ModelConfig::from_path(dir)?;
        let mut src = SafetensorsWeights::open(dir)?;
        let model = Qwen35::load(&Cpu::<T>::new(), &cfg, &mut src, progress)?;
        Engine::new(Cpu::<T>::new(), model, cache)
    }

    /// Seeded dummy weights for `cfg` on the f32 CPU backend.
    ///
    /// # Errors
    /// [`EngineError::Capacity`] for bad cache sizes ([`CacheConfig::validate`], before any
    /// weight is made); allocation errors.
    pub fn dummy(cfg: &ModelConfig, seed: u64, cache: CacheConfig) -> Result<Engine> {
        cache.validate()?;
        let model = Qwen35::load(&CpuBackend::new(), cfg, &mut DummyWeights::new(seed), false)?;
        Engine::new(CpuBackend::new(), model, cache)
    }

    /// A `tp`-rank CPU engine with activation dtype `T`: one thread per rank, in-process
    /// [`CpuComm`] collectives, every rank loading only its shard. The counts that must divide
    /// are checked before any thread starts.
    ///
    /// # Errors
    /// [`EngineError::Config`] naming an indivisible count; [`EngineError::Capacity`] for bad
    /// cache sizes ([`CacheConfig::validate`]; both before any thread starts); load and
    /// allocation errors of any rank.
    pub fn tensor_parallel<T: Elem + Send + 'static>(
        src: Source,
        tp: usize,
        cache: CacheConfig,
        opts: &TpOptions,
    ) -> Result<Engine> {
        // Session 11: bad sizes failed only after every rank had loaded its weights, with the
        // backend's allocation message instead of TP 1's Capacity error.
        cache.validate()?;
        let cfg = src.config()?;
        ShardPlan::check(&cfg, tp)?;
        let comms: Arc<Mutex<Vec<Option<CpuComm>>>> =
            Arc::new(Mutex::new(CpuComm::group(tp).into_iter().map(Some).collect()));
        let fault = opts.fault.clone();
        let progress = opts.progress;
        let factory: RankFactory = Arc::new(move |rank| {
            let comm = comms
                .lock()
                .map_err(|_| EngineError::Comm("communicator list poisoned".into()))?
                .get_mut(rank)
                .and_then(Option::take)
                .ok_or_else(|| EngineError::Comm(format!("no communicator for rank {rank}")))?;
            let abort = Communicator::<[T]>::abort_handle(&comm);
            let be = Cpu::<T>::with_comm(comm);
            let plan = ShardPlan::new(&cfg, tp, rank)?;
            let mut weights = src.open()?;
            let model =
                Qwen35::load_shard(&be, &cfg, &plan, weights.as_mut(), progress && rank == 0)?;
            let mut r = Rank::new(be, model, cache)?;
            r.set_fault(fault.as_ref().filter(|(fr, _)| *fr == rank).map(|(_, f)| f.clone()));
            Ok(RankWorker { runner: Box::new(r), abort: Some(abort) })
        });
        let ex = Executor::start(tp, &factory, opts.executor)?;
        Engine::from_runner(Box::new(ex), cache)
    }

    /// This process's rank of a CPU model run as one process per rank ([`crate::dist`]), with
    /// activation dtype `T`, over the TCP communicator of `group` (bit-identical to the
    /// in-process [`tensor_parallel`] engine of the same size). Rank 0 returns the engine (its
    /// scheduler drives every rank); every other rank serves rank 0's steps until the engine
    /// is dropped and returns `None` (an error if the group failed). `opts.fault` applies to the
    /// rank it names.
    ///
    /// # Errors
    /// [`EngineError::Config`] naming an indivisible count; [`EngineError::Capacity`] for bad
    /// cache sizes ([`CacheConfig::validate`], before any weight is read); load and allocation
    /// errors; any rank's start-up or step error; a lost connection.
    pub fn one_process_per_rank<T: Elem + Send + 'static>(
        src: &Source,
        mut group: crate::dist::rendezvous::Group,
        cache: CacheConfig,
        opts: &TpOptions,
    ) -> Result<Option<Engine>> {
        cache.validate()?;
        let cfg = src.config()?;
        let (rank, tp) = (group.rank, group.world);
        ShardPlan::check(&cfg, tp)?;
        let comm = Mutex::new(Some(CpuComm::over_tcp(group.tcp_comm()?)));
        let fault = opts.fault.clone().filter(|(fr, _)| *fr == rank).map(|(_, f)| f);
        let (progress, src2, cfg2) = (opts.progress && rank == 0, src.clone(), cfg.clone());
        let local: crate::dist::control::LocalFactory = Arc::new(move || {
            let comm = comm
                .lock()
                .map_err(|_| EngineError::Comm("communicator slot poisoned".into()))?
                .take()
                .ok_or_else(|| EngineError::Comm(format!("rank {rank} built twice")))?;
            let abort = Communicator::<[T]>::abort_handle(&comm);
            let be = Cpu::<T>::with_comm(comm);
            let plan = ShardPlan::new(&cfg2, tp, rank)?;
            let model = Qwen35::load_shard(&be, &cfg2, &plan, src2.open()?.as_mut(), progress)?;
            let mut r = Rank::new(be, model, cache)?;
            r.set_fault(fault.clone());
            Ok(RankWorker { runner: Box::new(r), abort: Some(abort) })
        });
        match crate::dist::control::start_group(group, &cfg, local, opts.executor)? {
            Some(ex) => Ok(Some(Engine::from_runner(Box::new(ex), cache)?)),
            None => Ok(None),
        }
    }
}

/// CUDA engine builders (feature `cuda`).
#[cfg(feature = "cuda")]
pub mod cuda {
    use std::sync::Arc;

    use super::{Engine, GraphOptions, Source, TpOptions};
    use crate::backend::cuda::CudaBackend;
    use crate::comm::nccl::{NcclComm, NcclId};
    use crate::error::{EngineError, Result};
    use crate::executor::{Executor, RankFactory, RankWorker};
    use crate::graph::CudaDecodeRunner;
    use crate::model::Qwen35;
    use crate::rank::Rank;
    use crate::shard::ShardPlan;
    use crate::state::CacheConfig;

    /// Size the pools for the free memory of `devices` (one per rank): the capacity plan
    /// ([`crate::capacity::plan`]) gives the effective maximum batch, the minimum over ranks,
    /// with each candidate's own graph-bucket reserve. Fewer slots than `cache.max_seqs` fit:
    /// a warning and a smaller cache (requests beyond it wait for a free slot); not even one
    /// sequence fits: [`EngineError::Capacity`] before any weight is loaded. Free memory is
    /// read now, less a margin of 1 GiB or 3%, whichever is larger; prefill activations are
    /// sized for 2048-token chunks (the scheduler's default).
    ///
    /// # Errors
    /// [`EngineError::Device`] for an unusable device; [`EngineError::Capacity`] as above and
    /// for bad cache sizes ([`CacheConfig::validate`]).
    pub fn plan_cache(
        cfg: &crate::config::ModelConfig,
        cache: CacheConfig,
        devices: &[usize],
        graphs: &GraphOptions,
    ) -> Result<CacheConfig> {
        use crate::capacity::{plan, rank_bytes, static_input_row_bytes};
        // The plan reads max_seqs, page_size and max_context; num_pages is derived below (a
        // request whose page count passes i32::MAX is shrunk to the batch that fits, as before),
        // and the returned config is validated whole.
        CacheConfig { num_pages: 1, ..cache }.validate()?;
        let tp = devices.len();
        let bytes = rank_bytes(cfg, &cache, 2048, tp)?;
        let pages_per_seq = cache.max_context.div_ceil(cache.page_size) as u64;
        // Static decode buffers per bucket row: inputs, sampling parameters and outputs, and the
        // bucket's copy of its logits rows (bf16, this rank's vocabulary slice).
        let row = static_input_row_bytes(pages_per_seq)
            + 40
            + 8 * crate::backend::cuda::STATIC_TOPK as u64
            // the split top-k's workspace (vocabulary slices of few rows, see sample_static).
            + deltakit::ops::sample::topk_workspace_bytes(1, crate::backend::cuda::STATIC_TOPK)
                as u64
            // the bucket's logits copy and, at TP > 1, the all-gathered [tp, rows, vocab/tp].
            + 2 * (cfg.vocab_size / tp) as u64 * if tp > 1 { 1 + tp as u64 } else { 1 };
        let per_graph = if graphs.enabled { 4 << 20 } else { 0 };
        let mut budgets = Vec::with_capacity(tp);
        for &d in devices {
            let ctx = deltakit::try_context(d)
                .ok_or_else(|| EngineError::Device(format!("cuda:{d}: no usable CUDA device")))?;
            ctx.bind_to_thread().map_err(|e| EngineError::Device(format!("cuda:{d}: {e}")))?;
            let (free, _) = deltakit::cudarc::driver::result::mem_get_info()
                .map_err(|e| EngineError::Device(format!("cuda:{d}: cuMemGetInfo: {e}")))?;
            let free = free as u64;
            let margin = (1u64 << 30).max(free / 33);
            budgets.push(bytes.budget(free.saturating_sub(margin), &cache, per_graph, row));
        }
        let buckets = if graphs.enabled { graphs.buckets.clone() } else { Vec::new() };
        let p = plan(&budgets, cache.max_seqs, &buckets)?;
        if p.max_batch < cache.max_seqs {
            eprintln!(
                "warning: capacity: {} sequences do not fit in device memory; running at most {} \
                 at once (per-rank breakdown: {})",
                cache.max_seqs, p.max_batch, p.ranks[0].breakdown
            );
            return Ok(CacheConfig::for_sequences(p.max_batch, cache.max_context, cache.page_size));
        }
        Ok(cache)
    }

    /// A single-GPU engine on `cuda:ordinal` (no executor, no communicator), with decode
    /// graphs per `graphs` ([`crate::graph::CudaDecodeRunner`]) and pools sized by the capacity
    /// plan (at most `cache.max_seqs` sequences).
    ///
    /// # Errors
    /// Unsupported shapes and [`EngineError::Capacity`] for bad cache sizes (both before any
    /// weight is read, [`plan_cache`]), device, load and allocation errors.
    pub fn single(
        src: &Source,
        ordinal: usize,
        cache: CacheConfig,
        progress: bool,
        graphs: &GraphOptions,
    ) -> Result<Engine> {
        let cfg = src.config()?;
        CudaBackend::check_model(&cfg)?;
        let cache = plan_cache(&cfg, cache, &[ordinal], graphs)?;
        let be = CudaBackend::new(ordinal)?;
        let model = Qwen35::load(&be, &cfg, src.open()?.as_mut(), progress)?;
        let runner = CudaDecodeRunner::new(Rank::new(be, model, cache)?, cache, graphs)?;
        Engine::from_runner(Box::new(runner), cache)
    }

    /// A tensor-parallel GPU engine over `devices` (rank `r` on `cuda:devices[r]`, `tp =
    /// devices.len()`), NCCL collectives; works for `tp = 1` (a one-rank communicator is valid
    /// NCCL). The NCCL unique id is made once here; each rank thread binds its context, creates
    /// its backend, calls `ncclCommInitRank`, and loads its shard.
    ///
    /// # Errors
    /// [`EngineError::Config`] for an indivisible count or an empty device list; unsupported
    /// shapes; [`EngineError::Capacity`] for bad cache sizes ([`plan_cache`], before any rank
    /// starts); NCCL, device, load and allocation errors of any rank.
    pub fn tensor_parallel(
        src: Source,
        devices: &[usize],
        cache: CacheConfig,
        opts: &TpOptions,
    ) -> Result<Engine> {
        let tp = devices.len();
        if tp == 0 {
            return Err(EngineError::Config("no CUDA devices given for the ranks".into()));
        }
        let cfg = src.config()?;
        ShardPlan::check(&cfg, tp)?;
        for r in 0..tp {
            CudaBackend::check_model(&ShardPlan::new(&cfg, tp, r)?.local_config(&cfg))?;
        }
        let cache = plan_cache(&cfg, cache, devices, &opts.graphs)?;
        let id = NcclId::new()?;
        let devices = devices.to_vec();
        let (fault, progress, graphs) = (opts.fault.clone(), opts.progress, opts.graphs.clone());
        let factory: RankFactory = Arc::new(move |rank| {
            let mut be = CudaBackend::new(devices[rank])?;
            let comm = NcclComm::from_rank(be.stream().clone(), rank, tp, id)?;
            be.set_comm(comm);
            let abort = crate::backend::Backend::abort_handle(&be);
            let plan = ShardPlan::new(&cfg, tp, rank)?;
            let model =
                Qwen35::load_shard(&be, &cfg, &plan, src.open()?.as_mut(), progress && rank == 0)?;
            let mut r = Rank::new(be, model, cache)?;
            r.set_fault(fault.as_ref().filter(|(fr, _)| *fr == rank).map(|(_, f)| f.clone()));
            let runner = CudaDecodeRunner::new(r, cache, &graphs)?;
            Ok(RankWorker { runner: Box::new(runner), abort })
        });
        let ex = Executor::start(tp, &factory, opts.executor)?;
        Engine::from_runner(Box::new(ex), cache)
    }

    /// This process's rank of a GPU model run as one process per rank ([`crate::dist`]) on
    /// `cuda:device`: NCCL initialised from the unique id rank 0 made and handed out at the
    /// rendezvous (`group.nccl_id`), decode graphs per `opts.graphs`. `cache` is the group's
    /// (every rank planned its capacity before the rendezvous, which agreed on the minimum).
    /// Rank 0 returns the engine; every other rank serves rank 0's steps and returns `None`.
    ///
    /// # Errors
    /// [`EngineError::Config`] for an indivisible count or a missing NCCL id;
    /// [`EngineError::Capacity`] for bad cache sizes ([`CacheConfig::validate`], before any
    /// weight is read); unsupported shapes; NCCL, device, load and allocation errors of any
    /// rank; a lost connection.
    pub fn one_process_per_rank(
        src: &Source,
        device: usize,
        group: crate::dist::rendezvous::Group,
        cache: CacheConfig,
        opts: &TpOptions,
    ) -> Result<Option<Engine>> {
        cache.validate()?;
        let cfg = src.config()?;
        let (rank, tp) = (group.rank, group.world);
        ShardPlan::check(&cfg, tp)?;
        CudaBackend::check_model(&ShardPlan::new(&cfg, tp, rank)?.local_config(&cfg))?;
        let id = NcclId::from_bytes(group.nccl_id.as_deref().ok_or_else(|| {
            EngineError::Config(
                "rank 0 handed out no NCCL unique id (is rank 0 on the CPU?)".into(),
            )
        })?)?;
        let fault = opts.fault.clone().filter(|(fr, _)| *fr == rank).map(|(_, f)| f);
        let (progress, graphs) = (opts.progress && rank == 0, opts.graphs.clone());
        let (src2, cfg2) = (src.clone(), cfg.clone());
        let local: crate::dist::control::LocalFactory = Arc::new(move || {
            let mut be = CudaBackend::new(device)?;
            let comm = NcclComm::from_rank(be.stream().clone(), rank, tp, id)?;
            be.set_comm(comm);
            let abort = crate::backend::Backend::abort_handle(&be);
            let plan = ShardPlan::new(&cfg2, tp, rank)?;
            let model = Qwen35::load_shard(&be, &cfg2, &plan, src2.open()?.as_mut(), progress)?;
            let mut r = Rank::new(be, model, cache)?;
            r.set_fault(fault.clone());
            let runner = CudaDecodeRunner::new(r, cache, &graphs)?;
            Ok(RankWorker { runner: Box::new(runner), abort })
        });
        match crate::dist::control::start_group(group, &cfg, local, opts.executor)? {
            Some(ex) => Ok(Some(Engine::from_runner(Box::new(ex), cache)?)),
            None => Ok(None),
        }
    }
}
