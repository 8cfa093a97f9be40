//! CUDA backend: bf16 tensors on one GPU, ops from the deltakit kernels and cuBLASLt.
//!
//! [`CudaBackend`] implements [`Backend`] with the same structure as the CPU backend
//! ([`super::cpu`]), op for op:
//!
//! | trait op | kernels |
//! | --- | --- |
//! | `embedding` | `mlp.embedding` (ids uploaded per call) |
//! | `linear` | `gemm.linear` ([`Gemm`], cuBLASLt, one handle on the backend's stream) |
//! | `rms_norm`, `add_rms_norm` | `norm.rms`, `norm.fused_add_rms` |
//! | `silu_and_mul` | `mlp.silu_and_mul` |
//! | `gdn_mix` prefill | `conv1d.prefill` -> `gdr.chunk_prefill` (fused gating) -> `norm.rms_gated` |
//! | `gdn_mix` decode | `conv1d.update` -> `gdr.decode` (fused gating) -> `norm.rms_gated` |
//! | `attention` prefill | `attn.prep` -> `attn.prefill` -> `attn.output_gate` |
//! | `attention` decode | `attn.prep` -> `attn.decode` (split-K) -> `attn.output_gate` |
//! | `gather_rows`, `concat_rows` | device-to-device copies |
//!
//! The q/k/v inputs of the GDR kernels are strided column views of the conv output (no split
//! copies); the attention gate is written contiguous by `attn.prep`.
//!
//! # Tensors and device state
//! - Weights and activations: bf16 [`CudaSlice`]s, row-major `[rows, cols]`. A one-row tensor
//!   (`A_log`, `dt_bias`, the norm weights) also keeps an f32 copy of the host values: the GDR
//!   kernels take `A_log` / `dt_bias` in f32, unrounded.
//! - GDN state ([`CudaGdnState`]): recurrent pool f32 `[slots, H_v, K, V]`, conv pool bf16
//!   `[slots, conv_dim, W-1]`, one pair per linear-attention layer, zeroed at allocation;
//!   [`Backend::reset_gdn_slot`] zeroes one slot (a `memset` on a slice of each pool).
//! - KV cache ([`CudaKvCache`]): bf16 `[num_pages, page_size, H_kv, hd]` for K and V per
//!   attention layer.
//!
//! # Per-step uploads
//! The engine's scheduler builds the batch metadata on the host ([`StepBatch`]: `cu_seqlens`,
//! `slots`, `ctx_lens`, page table). The first layer that needs it in a step uploads it
//! (`cu_seqlens`, `slots`, `ctx_lens`, the page table and, for decode, `seq_lens = ctx_lens + 1`)
//! into small device buffers; every later layer of the same step sees an equal `StepBatch` and
//! reuses them (one comparison of host vectors per layer). The host copies are passed to the
//! wrappers, which validate slots, `cu_seqlens` and page ids before every launch. Scratch
//! workspaces (`gdr.chunk_prefill`'s, `attn.decode`'s split-K partials) grow on demand and are
//! reused by every layer.
//!
//! # Streams and cudarc event tracking
//! The backend enqueues everything on one stream of its own (`ctx.new_stream()`, not the legacy
//! default stream, so CUDA-graph capture can be added later). cudarc's event tracking (a
//! read/write `CUevent` per slice, recorded on every use so that slices can cross streams) is
//! **disabled** right after the context is created ([`CudaBackend::new`]): with a single stream,
//! stream order already orders every use and every free (`cuMemFreeAsync` on the same stream), so
//! the events would only add two event records per kernel argument, and recording events is not
//! allowed inside a CUDA-graph capture of another stream. The invariant this relies on: no
//! slice of this backend is used on another stream. The test helper context
//! ([`CudaBackend::from_context`]) disables it the same way.
//!
//! # Sampling on the device
//! Decode steps sample on the GPU ([`CudaBackend::sample_static`]: `sample.topk_logprobs` and,
//! for temperature / top-p rows, `sample.top_p`, inside the step's CUDA graph); only the chosen
//! ids, their log-probabilities and the requested top-K lists are copied back
//! ([`CudaBackend::read_static`]). At TP > 1 the vocab-parallel logits are all-gathered and
//! sampled on the host with the same semantics ([`crate::sampling::sample_rows`]). Prefill steps
//! copy only the requested logits rows to the host ([`Backend::to_host`]).
//!
//! # Supported shapes
//! GDR head dims `K, V` in {16, 32, 64, 128} (`deltakit::ops::gdr::head_dims_supported`:
//! `gdr.chunk_prefill` and `gdr.decode`); attention head dims 64, 128, 256 with GQA groups <= 16
//! in decode; conv width 2..=4. [`CudaBackend::check_model`]
//! rejects anything else with [`EngineError::Unsupported`] before weights are loaded (and
//! [`Backend::new_gdn_state`] / [`Backend::new_kv_cache`] check again), so an unsupported model
//! never produces output.

use std::sync::{Arc, Mutex, MutexGuard};

use deltakit::cudarc::driver::{CudaContext, CudaSlice, CudaStream, CudaView, CudaViewMut};
use deltakit::ops::attn::{self, PagedKv, Rope, SeqBatch};
use deltakit::ops::conv1d::{self, ConvDims, VarlenHost};
use deltakit::ops::gdr::chunk_prefill::{
    self, ChunkPrefillInputs, ChunkPrefillStrides, Gating, HostCopies, InitialState,
};
use deltakit::ops::gdr::{self, DecodeStrides, GdrDims, GdrOptions};
use deltakit::ops::gemm::Gemm;
use deltakit::ops::{mlp, norm, sample};
use half::bf16;

use super::{AttnCoreWeights, AttnDims, Backend, GdnDims, GdnMixWeights, StepBatch, StepKind};
use crate::comm::nccl::NcclComm;
use crate::comm::{AbortHandle, Communicator};
use crate::config::ModelConfig;
use crate::error::{EngineError, Result};
use crate::sampling::{RowSampling, Sampled};
use crate::weights::HostTensor;

const BACKEND: &str = "cuda";

fn err(msg: String) -> EngineError {
    EngineError::Backend { backend: BACKEND, msg }
}

/// Kernel-library errors: unsupported configurations stay [`EngineError::Unsupported`], the rest
/// become [`EngineError::Backend`].
fn dk(e: deltakit::Error) -> EngineError {
    match e {
        deltakit::Error::Unsupported { op, what } => {
            EngineError::Unsupported { backend: BACKEND, what: format!("{op}: {what}") }
        }
        e => err(e.to_string()),
    }
}

fn drv(e: deltakit::cudarc::driver::DriverError) -> EngineError {
    err(format!("CUDA driver: {e}"))
}

fn unsupported(what: String) -> EngineError {
    EngineError::Unsupported { backend: BACKEND, what }
}

/// Allocates `len` elements (at least one, so empty tensors have a valid buffer) without
/// initialising them.
///
/// # Safety
/// The caller writes every element it later reads (each op's kernel writes its whole output).
unsafe fn alloc_uninit<T: deltakit::cudarc::driver::DeviceRepr>(
    stream: &Arc<CudaStream>,
    len: usize,
) -> Result<CudaSlice<T>> {
    // SAFETY: forwarded to the caller.
    unsafe { stream.alloc::<T>(len.max(1)) }.map_err(drv)
}

/// A device tensor `[rows, cols]`, bf16, row-major.
#[derive(Debug)]
pub struct CudaTensor {
    buf: CudaSlice<bf16>,
    /// f32 copy of a one-row tensor's host values (`A_log`, `dt_bias`, norm weights).
    f32_copy: Option<CudaSlice<f32>>,
    rows: usize,
    cols: usize,
}

impl CudaTensor {
    fn len(&self) -> usize {
        self.rows * self.cols
    }

    /// The tensor's elements (the buffer may be longer: empty tensors own one element).
    fn v(&self) -> CudaView<'_, bf16> {
        self.buf.slice(..self.len())
    }

    fn vm(&mut self) -> CudaViewMut<'_, bf16> {
        let n = self.len();
        self.buf.slice_mut(..n)
    }

    /// The f32 copy of a one-row weight.
    fn f32_view(&self, what: &str) -> Result<CudaView<'_, f32>> {
        self.f32_copy
            .as_ref()
            .map(|b| b.slice(..self.len()))
            .ok_or_else(|| err(format!("`{what}` has no f32 copy (not a one-row weight)")))
    }
}

/// One GDN layer's state pools on the device.
#[derive(Debug)]
pub struct CudaGdnState {
    /// f32 `[slots, H_v, K, V]`.
    recurrent: CudaSlice<f32>,
    /// bf16 `[slots, conv_dim, W-1]`.
    conv: CudaSlice<bf16>,
    dims: GdnDims,
    num_slots: usize,
}

/// One attention layer's paged KV cache on the device: bf16 `[pages, page_size, H_kv, hd]` each.
#[derive(Debug)]
pub struct CudaKvCache {
    k: CudaSlice<bf16>,
    v: CudaSlice<bf16>,
    num_pages: usize,
    dims: AttnDims,
}

/// A step's batch metadata on the device (uploaded once per distinct [`StepBatch`]).
#[derive(Debug)]
struct DeviceBatch {
    cu_seqlens: CudaSlice<i32>,
    slots: CudaSlice<i32>,
    ctx_lens: CudaSlice<i32>,
    page_table: CudaSlice<i32>,
    /// Decode: `ctx_lens + 1` (host copy alongside).
    seq_lens: CudaSlice<i32>,
    seq_lens_host: Vec<i32>,
}

/// Reused device buffers: the current step's metadata, the kernels' workspaces, and the static
/// decode buffers of every batch bucket.
#[derive(Debug, Default)]
struct Scratch {
    batch: Option<(StepBatch, DeviceBatch)>,
    gdr_ws: Option<CudaSlice<u8>>,
    attn_ws: Option<CudaSlice<f32>>,
    /// Attention workspaces replaced by a larger one: kept alive, because CUDA graphs captured
    /// earlier may still read them (never freed before the backend).
    retired_attn_ws: Vec<CudaSlice<f32>>,
    statics: std::collections::HashMap<usize, DecodeStatic>,
    /// The bucket whose staged inputs the current step uses (see [`CudaBackend::stage_decode`]).
    active: Option<usize>,
}

/// How a decode bucket samples ([`CudaBackend::sample_static`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SampleMode {
    /// Every row greedy: `sample.topk_logprobs` alone (its top-1 is the argmax).
    Greedy,
    /// Some row samples: `sample.top_p` for the tokens, `sample.topk_logprobs` for the lists.
    TopP,
}

/// Op families of the decode-step breakdown ([`CudaBackend::set_profiling`]).
pub const OP_FAMILIES: [&str; 6] =
    ["gemm", "gdn", "attention", "norm/elementwise", "sampling", "collective"];

/// CUDA-event timing of every op, by family (eager steps only).
#[derive(Debug, Default)]
struct Profiler {
    on: bool,
    marks: Vec<(usize, deltakit::cudarc::driver::CudaEvent, deltakit::cudarc::driver::CudaEvent)>,
}

/// Top-K lists a static decode bucket computes per row (requests asking for more run eager).
pub const STATIC_TOPK: usize = 20;

/// Static decode buffers of one batch bucket: fixed device addresses for the engine's lifetime,
/// so a CUDA graph captured over them replays with new inputs copied in before each launch.
#[derive(Debug)]
struct DecodeStatic {
    max_pages: usize,
    /// Context the attention split count is sized for (the engine's maximum context).
    split_ctx: usize,
    batch: DeviceBatch,
    ids: CudaSlice<i32>,
    temperature: CudaSlice<f32>,
    top_p: CudaSlice<f32>,
    seed: CudaSlice<u64>,
    counter: CudaSlice<u64>,
    out_ids: CudaSlice<i32>,
    topk_ids: CudaSlice<i32>,
    topk_lp: CudaSlice<f32>,
    /// `sample.topk_logprobs`'s split workspace (few rows over many SMs).
    topk_ws: CudaSlice<u8>,
    /// `[rows, vocab_local]` copy of the LM head output (read after a replay).
    logits: CudaSlice<bf16>,
    /// TP > 1: `[tp, rows, vocab_local]` all-gathered logits.
    gathered: Option<CudaSlice<bf16>>,
    /// Host copies of what is staged now: token ids and the padded batch.
    staged: Option<(Vec<u32>, StepBatch)>,
}

/// The CUDA backend on one GPU (see the module docs).
pub struct CudaBackend {
    ordinal: usize,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    gemm: Gemm,
    scratch: Mutex<Scratch>,
    /// Token id of padded decode rows ([`CudaBackend::set_padding_token`]).
    padding_token: std::sync::atomic::AtomicU32,
    prof: Mutex<Profiler>,
    /// Tensor-parallel communicator (last: dropped after every buffer above).
    comm: Option<NcclComm>,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend").field("ordinal", &self.ordinal).finish_non_exhaustive()
    }
}

impl CudaBackend {
    /// The backend on GPU `ordinal`: a fresh context handle with cudarc's event tracking
    /// disabled, one stream, one cuBLASLt handle.
    ///
    /// # Errors
    /// [`EngineError::Device`] if no CUDA driver or no such device is usable; backend errors if
    /// the stream or cuBLASLt cannot be created.
    pub fn new(ordinal: usize) -> Result<Self> {
        let ctx = deltakit::try_context(ordinal).ok_or_else(|| {
            EngineError::Device(format!(
                "cuda:{ordinal}: no usable CUDA device (no driver, or no such device)"
            ))
        })?;
        Self::from_context(ctx, ordinal)
    }

    /// The backend on an existing context (e.g. from `deltakit::testing::gpu_or_skip`). Disables
    /// cudarc's event tracking on it: slices created on this context afterwards carry no events,
    /// so the caller must not use them on another stream.
    ///
    /// # Errors
    /// Backend errors if the stream or cuBLASLt cannot be created.
    pub fn from_context(ctx: Arc<CudaContext>, ordinal: usize) -> Result<Self> {
        // SAFETY: every slice this backend creates is used on `stream` only (module docs), so
        // stream order synchronises all uses and frees.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(drv)?;
        let gemm = Gemm::new(stream.clone()).map_err(dk)?;
        Ok(Self {
            ordinal,
            ctx,
            stream,
            gemm,
            scratch: Mutex::new(Scratch::default()),
            padding_token: 0.into(),
            prof: Mutex::default(),
            comm: None,
        })
    }

    /// Make this backend a rank of a tensor-parallel group: the row-parallel outputs are summed
    /// and the logits gathered through `comm` (NCCL on this backend's stream).
    pub fn set_comm(&mut self, comm: NcclComm) {
        self.comm = Some(comm);
    }

    /// Parses `cuda` / `cuda:N` into the ordinal, `None` for any other device string.
    #[must_use]
    pub fn parse_device(device: &str) -> Option<usize> {
        match device {
            "cuda" => Some(0),
            d => d.strip_prefix("cuda:").and_then(|n| n.parse().ok()),
        }
    }

    /// The CUDA context.
    #[must_use]
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream every op is enqueued on.
    #[must_use]
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Checks that the kernels support `cfg`'s shapes (run before loading weights).
    ///
    /// # Errors
    /// [`EngineError::Unsupported`] naming the first unsupported dimension: GDR head dims
    /// `K`, `V` outside {16, 32, 64, 128} (`deltakit::ops::gdr::head_dims_supported`), attention
    /// head dim outside {64, 128, 256}, a decode GQA group
    /// over 16, conv width outside 2..=4, an odd or oversized rotary dim.
    pub fn check_model(cfg: &ModelConfig) -> Result<()> {
        check_gdn(GdnDims {
            h_k: cfg.linear_num_key_heads,
            h_v: cfg.linear_num_value_heads,
            k: cfg.linear_key_head_dim,
            v: cfg.linear_value_head_dim,
            conv_kernel: cfg.conv_kernel,
            eps: cfg.rms_norm_eps,
        })?;
        check_attn(AttnDims {
            n_q_heads: cfg.num_attention_heads,
            n_kv_heads: cfg.num_key_value_heads,
            head_dim: cfg.head_dim,
            rotary_dim: cfg.rope.rotary_dim,
            rope_theta: cfg.rope.theta as f32,
            eps: cfg.rms_norm_eps,
            page_size: 1,
        })
    }

    /// Greedy sampling on the device (`sample.argmax`): the argmax id of every logits row, ties to
    /// the lowest id.
    ///
    /// # Errors
    /// [`EngineError::Backend`] for a row containing a NaN (the kernel returns -1 there) or a
    /// device error.
    pub fn argmax(&self, logits: &CudaTensor) -> Result<Vec<u32>> {
        let mut ids = alloc_ids(&self.stream, logits.rows)?;
        let mut idv = ids.slice_mut(..logits.rows);
        sample::argmax(&self.stream, &logits.v(), logits.cols, &mut idv).map_err(dk)?;
        let host = self.stream.clone_dtoh(&idv).map_err(drv)?;
        self.stream.synchronize().map_err(drv)?;
        host.iter()
            .map(|&i| u32::try_from(i).map_err(|_| err("argmax: logits row has a NaN".into())))
            .collect()
    }

    fn lock(&self) -> Result<MutexGuard<'_, Scratch>> {
        self.scratch.lock().map_err(|_| err("scratch mutex poisoned by an earlier panic".into()))
    }

    /// A new tensor of `rows x cols` whose contents the caller's kernel writes entirely.
    fn output(&self, rows: usize, cols: usize) -> Result<CudaTensor> {
        // SAFETY: every caller launches a kernel that writes all `rows * cols` elements.
        let buf = unsafe { alloc_uninit::<bf16>(&self.stream, rows * cols) }?;
        Ok(CudaTensor { buf, f32_copy: None, rows, cols })
    }

    /// The device copy of `batch`: the active bucket's static buffers when `batch` is what was
    /// staged there ([`CudaBackend::stage_decode`]), else `cached` (uploaded only when it
    /// changed).
    fn upload_batch<'s>(
        &self,
        cached: &'s mut Option<(StepBatch, DeviceBatch)>,
        statics: &'s std::collections::HashMap<usize, DecodeStatic>,
        active: Option<usize>,
        batch: &StepBatch,
    ) -> Result<&'s DeviceBatch> {
        if let Some(st) = active.and_then(|b| statics.get(&b)) {
            if matches!(&st.staged, Some((_, b)) if b == batch) {
                return Ok(&st.batch);
            }
        }
        let fresh = matches!(cached, Some((b, _)) if b == batch);
        if !fresh {
            let up = |v: &[i32]| -> Result<CudaSlice<i32>> {
                if v.is_empty() {
                    return Err(err("empty batch metadata".into()));
                }
                self.stream.clone_htod(v).map_err(drv)
            };
            let seq_lens_host = seq_lens_of(&batch.ctx_lens);
            let dev = DeviceBatch {
                cu_seqlens: up(&batch.cu_seqlens)?,
                slots: up(&batch.slots)?,
                ctx_lens: up(&batch.ctx_lens)?,
                page_table: up(&batch.page_table)?,
                seq_lens: up(&seq_lens_host)?,
                seq_lens_host,
            };
            *cached = Some((batch.clone(), dev));
        }
        cached.as_ref().map(|(_, d)| d).ok_or_else(|| err("batch upload failed".into()))
    }

    /// Create the static decode buffers of a `rows`-row bucket (no-op if they exist): page
    /// tables `max_pages` wide, attention splits sized for `split_ctx` tokens, logits of
    /// `vocab_local` columns. With `exclusive`, every other bucket's buffers are freed first
    /// (eager decoding without graphs keeps one, sized for the current batch).
    ///
    /// # Errors
    /// Allocation errors.
    pub fn ensure_static(
        &self,
        rows: usize,
        max_pages: usize,
        split_ctx: usize,
        vocab_local: usize,
        exclusive: bool,
    ) -> Result<()> {
        let mut g = self.lock()?;
        if exclusive {
            g.statics.retain(|&r, _| r == rows);
        }
        if g.statics.get(&rows).is_some_and(|s| s.max_pages == max_pages) {
            return Ok(());
        }
        let s = &self.stream;
        let z32 = |n: usize| s.alloc_zeros::<i32>(n.max(1)).map_err(drv);
        let tp = self.tp_size();
        let st = DecodeStatic {
            max_pages,
            split_ctx: split_ctx.max(1),
            batch: DeviceBatch {
                cu_seqlens: z32(rows + 1)?,
                slots: z32(rows)?,
                ctx_lens: z32(rows)?,
                page_table: z32(rows * max_pages)?,
                seq_lens: z32(rows)?,
                seq_lens_host: vec![-1; rows],
            },
            ids: z32(rows)?,
            temperature: s.alloc_zeros::<f32>(rows).map_err(drv)?,
            top_p: s.alloc_zeros::<f32>(rows).map_err(drv)?,
            seed: s.alloc_zeros::<u64>(rows).map_err(drv)?,
            counter: s.alloc_zeros::<u64>(rows).map_err(drv)?,
            out_ids: z32(rows)?,
            topk_ids: z32(rows * STATIC_TOPK)?,
            topk_lp: s.alloc_zeros::<f32>(rows * STATIC_TOPK).map_err(drv)?,
            topk_ws: s
                .alloc_zeros::<u8>(sample::topk_workspace_bytes(rows, STATIC_TOPK).max(16))
                .map_err(drv)?,
            logits: s.alloc_zeros::<bf16>(rows * vocab_local).map_err(drv)?,
            gathered: if tp > 1 {
                Some(s.alloc_zeros::<bf16>(tp * rows * vocab_local).map_err(drv)?)
            } else {
                None
            },
            staged: None,
        };
        g.statics.insert(rows, st);
        Ok(())
    }

    /// Copy a decode step's inputs into bucket `rows`'s static buffers and make it the active
    /// bucket: `ids` / `batch` / `sampling` cover `n <= rows` live rows; rows `n..rows` are
    /// padding (token 0, slot -1, context -1, no pages, greedy), which read and write nothing of
    /// a live sequence. Returns the padded host `(ids, batch)` the forward must be called with
    /// (the backend recognizes it and uses the static buffers instead of uploading).
    ///
    /// # Errors
    /// [`EngineError::Backend`] if the bucket does not exist, `n > rows`, the batch is not a
    /// decode batch, or a page table row is wider than the bucket's; device errors.
    pub fn stage_decode(
        &self,
        rows: usize,
        ids: &[u32],
        batch: &StepBatch,
        sampling: &[RowSampling],
    ) -> Result<(Vec<u32>, StepBatch)> {
        let mut g = self.lock()?;
        let st = g
            .statics
            .get_mut(&rows)
            .ok_or_else(|| err(format!("stage_decode: no static bucket of {rows} rows")))?;
        let n = batch.num_seqs();
        if n > rows || ids.len() != n || sampling.len() != n || batch.kind != StepKind::Decode {
            return Err(err(format!(
                "stage_decode: {n} rows ({} ids, {} sampling, {:?}) for a bucket of {rows}",
                ids.len(),
                sampling.len(),
                batch.kind
            )));
        }
        if batch.max_pages > st.max_pages {
            return Err(err(format!(
                "stage_decode: page table {} wide, bucket holds {}",
                batch.max_pages, st.max_pages
            )));
        }
        let mp = st.max_pages;
        let mut pb = StepBatch {
            kind: StepKind::Decode,
            cu_seqlens: (0..=rows as i32).collect(),
            slots: vec![-1; rows],
            ctx_lens: vec![-1; rows],
            positions: vec![0; rows],
            page_table: vec![-1; rows * mp],
            max_pages: mp,
        };
        pb.slots[..n].copy_from_slice(&batch.slots);
        pb.ctx_lens[..n].copy_from_slice(&batch.ctx_lens);
        pb.positions[..n].copy_from_slice(&batch.positions);
        for i in 0..n {
            pb.page_table[i * mp..i * mp + batch.max_pages]
                .copy_from_slice(&batch.page_table[i * batch.max_pages..(i + 1) * batch.max_pages]);
        }
        let mut pids = vec![0u32; rows];
        pids[..n].copy_from_slice(ids);
        let s = &self.stream;
        let seq_lens = seq_lens_of(&pb.ctx_lens);
        // The device copy's padded rows carry the padding token (0, or a test's poison id).
        let pad_id = self.padding_token.load(std::sync::atomic::Ordering::Relaxed) as i32;
        let ids32: Vec<i32> =
            pids.iter().enumerate().map(|(i, &t)| if i < n { t as i32 } else { pad_id }).collect();
        s.memcpy_htod(&pb.cu_seqlens, &mut st.batch.cu_seqlens).map_err(drv)?;
        s.memcpy_htod(&pb.slots, &mut st.batch.slots).map_err(drv)?;
        s.memcpy_htod(&pb.ctx_lens, &mut st.batch.ctx_lens).map_err(drv)?;
        s.memcpy_htod(&pb.page_table, &mut st.batch.page_table).map_err(drv)?;
        s.memcpy_htod(&seq_lens, &mut st.batch.seq_lens).map_err(drv)?;
        s.memcpy_htod(&ids32, &mut st.ids).map_err(drv)?;
        let pad = |v: Vec<f32>, fill: f32| -> Vec<f32> {
            let mut v = v;
            v.resize(rows, fill);
            v
        };
        let t = pad(sampling.iter().map(|r| r.temperature).collect(), 0.0);
        let p = pad(sampling.iter().map(|r| r.top_p).collect(), 1.0);
        let mut seed: Vec<u64> = sampling.iter().map(|r| r.seed).collect();
        let mut counter: Vec<u64> = sampling.iter().map(|r| r.counter).collect();
        seed.resize(rows, 0);
        counter.resize(rows, 0);
        s.memcpy_htod(&t, &mut st.temperature).map_err(drv)?;
        s.memcpy_htod(&p, &mut st.top_p).map_err(drv)?;
        s.memcpy_htod(&seed, &mut st.seed).map_err(drv)?;
        s.memcpy_htod(&counter, &mut st.counter).map_err(drv)?;
        st.batch.seq_lens_host = seq_lens;
        st.staged = Some((pids.clone(), pb.clone()));
        g.active = Some(rows);
        Ok((pids, pb))
    }

    /// Turn per-op CUDA-event timing on or off (eager steps; events cannot be timed inside a
    /// graph). Each op then records a start and an end event on the stream.
    pub fn set_profiling(&self, on: bool) {
        if let Ok(mut p) = self.prof.lock() {
            p.on = on;
            p.marks.clear();
        }
    }

    /// Milliseconds of GPU time per op family ([`OP_FAMILIES`]) since the last call (waits for
    /// the stream), and clears the marks.
    ///
    /// # Errors
    /// Device errors.
    pub fn take_profile(&self) -> Result<[f64; 6]> {
        self.stream.synchronize().map_err(drv)?;
        let mut p = self.prof.lock().map_err(|_| err("profiler mutex poisoned".into()))?;
        let mut out = [0f64; 6];
        for (fam, a, b) in p.marks.drain(..) {
            out[fam] += f64::from(a.elapsed_ms(&b).map_err(drv)?);
        }
        Ok(out)
    }

    /// Run `f` (which enqueues one op) between two timing events when profiling is on.
    fn timed<T>(&self, fam: usize, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let on = self.prof.lock().is_ok_and(|p| p.on);
        if !on {
            return f();
        }
        let flags = Some(deltakit::cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let a = self.ctx.new_event(flags).map_err(drv)?;
        a.record(&self.stream).map_err(drv)?;
        let r = f()?;
        let b = self.ctx.new_event(flags).map_err(drv)?;
        b.record(&self.stream).map_err(drv)?;
        if let Ok(mut p) = self.prof.lock() {
            p.marks.push((fam, a, b));
        }
        Ok(r)
    }

    /// Token id the padded rows of a bucket carry on the device (default 0; the host-side batch
    /// always says 0). Tests set an out-of-range id, which `mlp.embedding` turns into a NaN row,
    /// to show that padded rows cannot reach live ones.
    pub fn set_padding_token(&self, id: u32) {
        self.padding_token.store(id, std::sync::atomic::Ordering::Relaxed);
    }

    /// A GDN state's pools on the host: recurrent f32 `[slots, H_v, K, V]` and conv state
    /// `[slots, conv_dim, W-1]` widened to f32 (tests compare them bit for bit).
    ///
    /// # Errors
    /// Device errors.
    pub fn gdn_state_to_host(&self, st: &CudaGdnState) -> Result<(Vec<f32>, Vec<f32>)> {
        let r = self.stream.clone_dtoh(&st.recurrent).map_err(drv)?;
        let c = self.stream.clone_dtoh(&st.conv).map_err(drv)?;
        self.stream.synchronize().map_err(drv)?;
        Ok((r, c.iter().map(|x| x.to_f32()).collect()))
    }

    /// A KV cache on the host, widened to f32: K and V `[pages, page_size, H_kv, hd]`.
    ///
    /// # Errors
    /// Device errors.
    pub fn kv_to_host(&self, kv: &CudaKvCache) -> Result<(Vec<f32>, Vec<f32>)> {
        let k = self.stream.clone_dtoh(&kv.k).map_err(drv)?;
        let v = self.stream.clone_dtoh(&kv.v).map_err(drv)?;
        self.stream.synchronize().map_err(drv)?;
        Ok((k.iter().map(|x| x.to_f32()).collect(), v.iter().map(|x| x.to_f32()).collect()))
    }

    /// Stop using the active bucket's static inputs (prefill and unstaged steps upload).
    ///
    /// # Errors
    /// If the scratch lock is poisoned.
    pub fn unstage(&self) -> Result<()> {
        self.lock()?.active = None;
        Ok(())
    }

    /// Sample the active bucket from `logits` (`[rows, vocab_local]`, the LM head output of the
    /// staged step), entirely on the device and into the bucket's static outputs: a copy of the
    /// logits; at TP = 1 the tokens (`sample.top_p` for [`SampleMode::TopP`], else the top-1 of)
    /// `sample.topk_logprobs` with `k` = [`STATIC_TOPK`]; at TP > 1 the all-gather of the logits
    /// slices (sampled on the host by [`CudaBackend::read_static`]). Allocates nothing, so it
    /// can be captured.
    ///
    /// # Errors
    /// Shape or device errors; no active bucket.
    pub fn sample_static(&self, logits: &CudaTensor, mode: SampleMode) -> Result<()> {
        self.timed(4, || {
            let mut g = self.lock()?;
            let rows = g.active.ok_or_else(|| err("sample_static: no active bucket".into()))?;
            let st =
                g.statics.get_mut(&rows).ok_or_else(|| err("sample_static: no bucket".into()))?;
            if logits.rows != rows || logits.len() != st.logits.len() {
                return Err(err(format!(
                    "sample_static: logits [{}, {}] for a bucket of {rows} rows ({} values)",
                    logits.rows,
                    logits.cols,
                    st.logits.len()
                )));
            }
            let s = &self.stream;
            s.memcpy_dtod(&logits.v(), &mut st.logits).map_err(drv)?;
            if let (Some(c), Some(gat)) = (&self.comm, st.gathered.as_mut()) {
                return c.all_gather(&st.logits, gat);
            }
            let vocab = logits.cols;
            let k = STATIC_TOPK.min(vocab);
            let (mut ti, mut tl) =
                (st.topk_ids.slice_mut(..rows * k), st.topk_lp.slice_mut(..rows * k));
            sample::topk_logprobs_ws(
                s,
                &st.logits,
                vocab,
                k,
                &mut ti,
                &mut tl,
                Some(&mut st.topk_ws),
            )
            .map_err(dk)?;
            if mode == SampleMode::TopP {
                sample::top_p(
                    s,
                    &st.logits,
                    vocab,
                    &st.temperature,
                    &st.top_p,
                    &st.seed,
                    &st.counter,
                    &mut st.out_ids,
                )
                .map_err(dk)?;
            }
            Ok(())
        })
    }

    /// Read the active bucket's sampled outputs for its first `sampling.len()` rows (waits for
    /// the stream): tokens, log-probabilities (temperature 1) and the requested top-K lists.
    /// At TP > 1 the gathered logits are copied back and sampled on the host with the same
    /// semantics ([`crate::sampling::sample_row`]).
    ///
    /// # Errors
    /// Device errors; a NaN logits row (the kernels write id -1).
    pub fn read_static(&self, sampling: &[RowSampling], mode: SampleMode) -> Result<Vec<Sampled>> {
        let g = self.lock()?;
        let rows = g.active.ok_or_else(|| err("read_static: no active bucket".into()))?;
        let st = g.statics.get(&rows).ok_or_else(|| err("read_static: no bucket".into()))?;
        let n = sampling.len();
        let s = &self.stream;
        let vocab_local = st.logits.len() / rows.max(1);
        if let Some(gat) = &st.gathered {
            let host = s.clone_dtoh(gat).map_err(drv)?;
            s.synchronize().map_err(drv)?;
            let tp = self.tp_size();
            let f: Vec<f32> = host.iter().map(|x| x.to_f32()).collect();
            let full = super::interleave_gathered(&f, tp, rows, vocab_local);
            let vocab = tp * vocab_local;
            return crate::sampling::sample_rows(&full[..n * vocab], vocab, sampling);
        }
        let vocab = vocab_local;
        let k = STATIC_TOPK.min(vocab);
        let ti = s.clone_dtoh(&st.topk_ids.slice(..rows * k)).map_err(drv)?;
        let tl = s.clone_dtoh(&st.topk_lp.slice(..rows * k)).map_err(drv)?;
        let ids = if mode == SampleMode::TopP {
            Some(s.clone_dtoh(&st.out_ids).map_err(drv)?)
        } else {
            None
        };
        s.synchronize().map_err(drv)?;
        let mut out = Vec::with_capacity(n);
        for (i, r) in sampling.iter().enumerate() {
            let row_ids = &ti[i * k..(i + 1) * k];
            let row_lp = &tl[i * k..(i + 1) * k];
            let tok = ids.as_ref().map_or(row_ids[0], |v| v[i]);
            let tok = u32::try_from(tok)
                .map_err(|_| err(format!("decode sampling: logits row {i} has a NaN")))?;
            let logprob = if let Some(j) = row_ids.iter().position(|&t| t as u32 == tok) {
                row_lp[j]
            } else {
                // Outside the top-K: logprob = (x_tok - x_top1) + logprob_top1.
                let (a, b) = (i * vocab + tok as usize, i * vocab + row_ids[0] as usize);
                let xt = s.clone_dtoh(&st.logits.slice(a..=a)).map_err(drv)?;
                let x1 = s.clone_dtoh(&st.logits.slice(b..=b)).map_err(drv)?;
                s.synchronize().map_err(drv)?;
                (xt[0].to_f32() - x1[0].to_f32()) + row_lp[0]
            };
            let topk = row_ids[..r.topk.min(k)]
                .iter()
                .zip(&row_lp[..r.topk.min(k)])
                .map(|(&t, &l)| (t as u32, l))
                .collect();
            out.push(Sampled { token: tok, logprob, topk });
        }
        Ok(out)
    }

    /// Start capturing this backend's stream into a CUDA graph (thread-local mode: other rank
    /// threads keep working).
    ///
    /// # Errors
    /// Driver errors.
    pub fn begin_capture(&self) -> Result<()> {
        self.stream
            .begin_capture(
                deltakit::cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
            .map_err(drv)
    }

    /// End the capture and instantiate the graph (`None` if nothing was captured).
    ///
    /// # Errors
    /// Driver errors (e.g. an operation that cannot be captured invalidated the capture).
    pub fn end_capture(&self) -> Result<Option<deltakit::cudarc::driver::CudaGraph>> {
        self.stream
            .end_capture(deltakit::cudarc::driver::sys::CUgraphInstantiate_flags(0))
            .map_err(drv)
    }
}

/// Attention sequence lengths of a decode batch: `ctx + 1`, or -1 for a padding row (`ctx < 0`).
fn seq_lens_of(ctx_lens: &[i32]) -> Vec<i32> {
    ctx_lens.iter().map(|&c| if c < 0 { -1 } else { c + 1 }).collect()
}

fn alloc_ids(stream: &Arc<CudaStream>, n: usize) -> Result<CudaSlice<i32>> {
    // SAFETY: `sample.argmax` writes one id per row before the copy back.
    unsafe { alloc_uninit::<i32>(stream, n) }
}

fn check_gdn(d: GdnDims) -> Result<()> {
    if !deltakit::ops::gdr::head_dims_supported(d.k, d.v) {
        return Err(unsupported(format!(
            "GDN head dims K = {}, V = {}: gdr.chunk_prefill and gdr.decode are built for K in \
             {:?}, V in {:?}",
            d.k,
            d.v,
            deltakit::ops::gdr::SUPPORTED_K,
            deltakit::ops::gdr::SUPPORTED_V
        )));
    }
    if d.h_k == 0 || d.h_v % d.h_k != 0 {
        return Err(unsupported(format!(
            "GDN heads H_k = {}, H_v = {} (H_v must be a multiple of H_k)",
            d.h_k, d.h_v
        )));
    }
    if !(2..=4).contains(&d.conv_kernel) {
        return Err(unsupported(format!("conv kernel width {} (supported: 2..=4)", d.conv_kernel)));
    }
    Ok(())
}

fn check_attn(d: AttnDims) -> Result<()> {
    if !matches!(d.head_dim, 64 | 128 | 256) {
        return Err(unsupported(format!(
            "attention head_dim {} (kernels built for 64, 128, 256)",
            d.head_dim
        )));
    }
    if d.n_kv_heads == 0 || d.n_q_heads % d.n_kv_heads != 0 {
        return Err(unsupported(format!(
            "attention heads H_q = {}, H_kv = {} (H_q must be a multiple of H_kv)",
            d.n_q_heads, d.n_kv_heads
        )));
    }
    if d.n_q_heads / d.n_kv_heads > attn::DECODE_MAX_GROUP {
        return Err(unsupported(format!(
            "GQA group {} > {} (attn.decode)",
            d.n_q_heads / d.n_kv_heads,
            attn::DECODE_MAX_GROUP
        )));
    }
    if d.rotary_dim == 0 || d.rotary_dim % 2 != 0 || d.rotary_dim > d.head_dim {
        return Err(unsupported(format!(
            "rotary dim {} (must be even, in 2..={})",
            d.rotary_dim, d.head_dim
        )));
    }
    Ok(())
}

fn check_cols(op: &str, what: &str, t: &CudaTensor, cols: usize) -> Result<()> {
    if t.cols == cols {
        Ok(())
    } else {
        Err(err(format!("{op}: `{what}` has {} columns, expected {cols}", t.cols)))
    }
}

fn check_rows(op: &str, what: &str, t: &CudaTensor, rows: usize) -> Result<()> {
    if t.rows == rows {
        Ok(())
    } else {
        Err(err(format!("{op}: `{what}` has {} rows, expected {rows}", t.rows)))
    }
}

/// Grows `ws` to at least `len` elements (contents unspecified) and returns it.
/// `ws`, grown to at least `len` elements. A replaced buffer goes to `retired` when given
/// (graphs captured over it stay valid), else it is freed.
fn grow<'w, T: deltakit::cudarc::driver::DeviceRepr>(
    stream: &Arc<CudaStream>,
    ws: &'w mut Option<CudaSlice<T>>,
    len: usize,
    retired: Option<&mut Vec<CudaSlice<T>>>,
) -> Result<&'w mut CudaSlice<T>> {
    if ws.as_ref().is_none_or(|w| w.len() < len) {
        if let (Some(old), Some(keep)) = (ws.take(), retired) {
            keep.push(old);
        }
        *ws = None;
        // SAFETY: workspaces are scratch whose contents on entry don't matter to the kernels.
        *ws = Some(unsafe { alloc_uninit::<T>(stream, len) }?);
    }
    ws.as_mut().ok_or_else(|| err("workspace allocation failed".into()))
}

impl Backend for CudaBackend {
    type Tensor = CudaTensor;
    type GdnState = CudaGdnState;
    type KvCache = CudaKvCache;

    fn name(&self) -> String {
        format!("cuda:{}", self.ordinal)
    }

    fn upload(&self, t: &HostTensor) -> Result<CudaTensor> {
        let cols = t.shape.last().copied().unwrap_or(1);
        let rows = t.data.len().checked_div(cols).unwrap_or(0);
        if rows * cols != t.data.len() {
            return Err(err(format!(
                "upload: {} elements do not fill shape {:?}",
                t.data.len(),
                t.shape
            )));
        }
        let host: Vec<bf16> = t.data.iter().map(|&x| bf16::from_f32(x)).collect();
        let mut buf = alloc_for_upload(&self.stream, host.len())?;
        if !host.is_empty() {
            self.stream.memcpy_htod(&host, &mut buf).map_err(drv)?;
        }
        let f32_copy = if rows == 1 && !t.data.is_empty() {
            Some(self.stream.clone_htod(&t.data).map_err(drv)?)
        } else {
            None
        };
        Ok(CudaTensor { buf, f32_copy, rows, cols })
    }

    fn to_host(&self, t: &CudaTensor) -> Result<Vec<f32>> {
        if t.len() == 0 {
            return Ok(Vec::new());
        }
        let host = self.stream.clone_dtoh(&t.v()).map_err(drv)?;
        self.stream.synchronize().map_err(drv)?;
        Ok(host.iter().map(|x| x.to_f32()).collect())
    }

    fn shape(&self, t: &CudaTensor) -> (usize, usize) {
        (t.rows, t.cols)
    }

    fn new_gdn_state(&self, dims: GdnDims, num_slots: usize) -> Result<CudaGdnState> {
        check_gdn(dims)?;
        if num_slots == 0 {
            return Err(err("new_gdn_state: zero slots".into()));
        }
        let rec = num_slots * dims.h_v * dims.k * dims.v;
        let conv = num_slots * dims.conv_dim() * (dims.conv_kernel - 1);
        Ok(CudaGdnState {
            recurrent: self.stream.alloc_zeros::<f32>(rec).map_err(drv)?,
            conv: self.stream.alloc_zeros::<bf16>(conv).map_err(drv)?,
            dims,
            num_slots,
        })
    }

    fn reset_gdn_slot(&self, state: &mut CudaGdnState, slot: usize) -> Result<()> {
        if slot >= state.num_slots {
            return Err(err(format!("reset_gdn_slot: slot {slot} >= {}", state.num_slots)));
        }
        let d = state.dims;
        let r = d.h_v * d.k * d.v;
        let c = d.conv_dim() * (d.conv_kernel - 1);
        let mut rv = state.recurrent.slice_mut(slot * r..(slot + 1) * r);
        self.stream.memset_zeros(&mut rv).map_err(drv)?;
        let mut cv = state.conv.slice_mut(slot * c..(slot + 1) * c);
        self.stream.memset_zeros(&mut cv).map_err(drv)
    }

    fn new_kv_cache(&self, dims: AttnDims, num_pages: usize) -> Result<CudaKvCache> {
        check_attn(dims)?;
        let n = dims.kv_cache_elems(num_pages).ok_or_else(|| {
            err(format!("new_kv_cache: empty or oversized cache ({num_pages} pages, {dims:?})"))
        })?;
        Ok(CudaKvCache {
            k: self.stream.alloc_zeros::<bf16>(n).map_err(drv)?,
            v: self.stream.alloc_zeros::<bf16>(n).map_err(drv)?,
            num_pages,
            dims,
        })
    }

    fn embedding(&self, ids: &[u32], table: &CudaTensor) -> Result<CudaTensor> {
        self.timed(3, || {
            if let Some(&bad) = ids.iter().find(|&&i| i as usize >= table.rows) {
                return Err(err(format!("embedding: id {bad} >= vocab {}", table.rows)));
            }
            let mut out = self.output(ids.len(), table.cols)?;
            if ids.is_empty() {
                return Ok(out);
            }
            {
                let g = self.lock()?;
                if let Some(st) = g.active.and_then(|b| g.statics.get(&b)) {
                    if matches!(&st.staged, Some((staged, _)) if staged == ids) {
                        mlp::embedding(
                            &self.stream,
                            &st.ids,
                            &table.v(),
                            table.rows,
                            &mut out.vm(),
                        )
                        .map_err(dk)?;
                        return Ok(out);
                    }
                }
            }
            let ids: Vec<i32> = ids.iter().map(|&i| i as i32).collect();
            let dids = self.stream.clone_htod(&ids).map_err(drv)?;
            mlp::embedding(&self.stream, &dids, &table.v(), table.rows, &mut out.vm())
                .map_err(dk)?;
            Ok(out)
        })
    }

    fn linear(&self, x: &CudaTensor, w: &CudaTensor) -> Result<CudaTensor> {
        self.timed(0, || {
            check_cols("linear", "w", w, x.cols)?;
            let mut out = self.output(x.rows, w.rows)?;
            if x.rows > 0 {
                self.gemm
                    .linear(&x.v(), &w.v(), &mut out.vm(), x.rows, w.rows, x.cols, false)
                    .map_err(dk)?;
            }
            Ok(out)
        })
    }

    fn rms_norm(&self, x: &CudaTensor, w: &CudaTensor, eps: f32) -> Result<CudaTensor> {
        self.timed(3, || {
            check_cols("rms_norm", "w", w, x.cols)?;
            let mut out = self.output(x.rows, x.cols)?;
            norm::rms(&self.stream, &x.v(), &w.v(), eps, &mut out.vm()).map_err(dk)?;
            Ok(out)
        })
    }

    fn add_rms_norm(
        &self,
        x: &CudaTensor,
        residual: &mut CudaTensor,
        w: &CudaTensor,
        eps: f32,
    ) -> Result<CudaTensor> {
        self.timed(3, || {
            check_cols("add_rms_norm", "residual", residual, x.cols)?;
            check_rows("add_rms_norm", "residual", residual, x.rows)?;
            check_cols("add_rms_norm", "w", w, x.cols)?;
            let mut out = self.output(x.rows, x.cols)?;
            norm::fused_add_rms(
                &self.stream,
                &x.v(),
                &mut residual.vm(),
                &w.v(),
                eps,
                &mut out.vm(),
            )
            .map_err(dk)?;
            Ok(out)
        })
    }

    fn silu_and_mul(&self, x: &CudaTensor) -> Result<CudaTensor> {
        self.timed(3, || {
            if x.cols % 2 != 0 || x.cols == 0 {
                return Err(err(format!("silu_and_mul: odd or zero column count {}", x.cols)));
            }
            let inter = x.cols / 2;
            let mut out = self.output(x.rows, inter)?;
            mlp::silu_and_mul(&self.stream, &x.v(), inter, &mut out.vm()).map_err(dk)?;
            Ok(out)
        })
    }

    #[allow(clippy::too_many_lines)] // two kernel paths (prefill / decode), validated inline
    fn gdn_mix(
        &self,
        proj: &CudaTensor,
        w: &GdnMixWeights<CudaTensor>,
        dims: GdnDims,
        batch: &StepBatch,
        state: &mut CudaGdnState,
    ) -> Result<CudaTensor> {
        self.timed(1, || {
            const OP: &str = "gdn_mix";
            let t = batch.num_tokens();
            let cd = dims.conv_dim();
            // proj = [qkv | z | b | a], row stride pc: read through strided views, no split copies.
            let vd = dims.h_v * dims.v;
            let pc = cd + vd + 2 * dims.h_v;
            check_cols(OP, "proj", proj, pc)?;
            check_rows(OP, "proj", proj, t)?;
            check_cols(OP, "conv_w", &w.conv_w, dims.conv_kernel)?;
            check_rows(OP, "conv_w", &w.conv_w, cd)?;
            if state.dims != dims {
                return Err(err(format!(
                    "{OP}: state dims {:?} != layer dims {dims:?}",
                    state.dims
                )));
            }
            check_gdn(dims)?;
            let mut out = self.output(t, vd)?;
            if t == 0 {
                return Ok(out);
            }
            let mut guard = self.lock()?;
            let Scratch { batch: cached, gdr_ws, statics, active, .. } = &mut *guard;
            let db = self.upload_batch(cached, statics, *active, batch)?;
            let s = &self.stream;

            // Causal conv1d + SiLU over qkv, carrying each sequence's conv state.
            let cdims = ConvDims { conv_dim: cd, width: dims.conv_kernel };
            let mut conv_out = self.output(t, cd)?;
            match batch.kind {
                StepKind::Prefill => conv1d::prefill(
                    s,
                    cdims,
                    &proj.v(),
                    Some(pc),
                    &w.conv_w.v(),
                    None::<&CudaSlice<bf16>>,
                    &db.cu_seqlens,
                    &db.slots,
                    None::<&CudaSlice<u8>>,
                    Some(VarlenHost { cu_seqlens: &batch.cu_seqlens, slots: &batch.slots }),
                    &mut state.conv,
                    &mut conv_out.vm(),
                ),
                StepKind::Decode => conv1d::update(
                    s,
                    cdims,
                    1,
                    &proj.v(),
                    Some(pc),
                    &w.conv_w.v(),
                    None::<&CudaSlice<bf16>>,
                    &db.slots,
                    Some(&batch.slots),
                    &mut state.conv,
                    &mut conv_out.vm(),
                ),
            }
            .map_err(dk)?;

            // q | k | v as strided column views of the conv output (HF `torch.split`), no copies.
            let kd = dims.h_k * dims.k;
            let cv = conv_out.v();
            let (q, k, v) = (cv.slice(..), cv.slice(kd..), cv.slice(2 * kd..));
            let strides = DecodeStrides { q: Some(cd), k: Some(cd), v: Some(cd), ab: Some(pc) };
            let pv = proj.v();
            let (b_view, a_view) = (pv.slice(cd + vd..), pv.slice(cd + vd + dims.h_v..));
            let gd = GdrDims { h_k: dims.h_k, h_v: dims.h_v, k: dims.k, v: dims.v };
            let opts = GdrOptions::default();
            let (a_log, dt_bias) = (w.a_log.f32_view("A_log")?, w.dt_bias.f32_view("dt_bias")?);
            let mut o = self.output(t, vd)?;
            match batch.kind {
                StepKind::Prefill => {
                    let n = batch.num_seqs();
                    let ws = grow(s, gdr_ws, chunk_prefill::workspace_bytes(gd, t, n), None)?;
                    let inputs = ChunkPrefillInputs {
                        q,
                        k,
                        v,
                        gating: Gating::Fused { a: a_view, b: b_view, a_log, dt_bias },
                        cu_seqlens: db.cu_seqlens.slice(..),
                        slots: db.slots.slice(..),
                        initial_state: InitialState::FromSlots,
                    };
                    let host = HostCopies {
                        cu_seqlens: Some(&batch.cu_seqlens),
                        slots: Some(&batch.slots),
                    };
                    let strides: ChunkPrefillStrides = strides;
                    chunk_prefill::chunk_prefill(
                        s,
                        gd,
                        opts,
                        strides,
                        &inputs,
                        host,
                        &mut state.recurrent,
                        &mut o.vm(),
                        ws,
                    )
                    .map_err(dk)?;
                }
                StepKind::Decode => gdr::decode(
                    s,
                    gd,
                    1,
                    opts,
                    strides,
                    &q,
                    &k,
                    &v,
                    &a_view,
                    &b_view,
                    &a_log,
                    &dt_bias,
                    &db.slots,
                    Some(&batch.slots),
                    &mut state.recurrent,
                    &mut o.vm(),
                )
                .map_err(dk)?,
            }
            // Gated RMSNorm per value head: rows [T * H_v, V].
            check_cols(OP, "norm_w", &w.norm_w, dims.v)?;
            let z = (&pv.slice(cd..), Some((pc, dims.h_v)));
            norm::rms_gated_strided(s, &o.v(), z, &w.norm_w.v(), dims.eps, &mut out.vm())
                .map_err(dk)?;
            Ok(out)
        })
    }

    #[allow(clippy::too_many_lines)] // prefill / decode paths over one prologue
    fn attention(
        &self,
        qkv: &CudaTensor,
        w: &AttnCoreWeights<CudaTensor>,
        dims: AttnDims,
        batch: &StepBatch,
        cache: &mut CudaKvCache,
    ) -> Result<CudaTensor> {
        self.timed(2, || {
            const OP: &str = "attention";
            let t = batch.num_tokens();
            let (hq, hkv, hd) = (dims.n_q_heads, dims.n_kv_heads, dims.head_dim);
            // qkv = [q_proj | k | v], row stride pc: strided views into attn.prep.
            let (qd, kvd) = (hq * 2 * hd, hkv * hd);
            let pc = qd + 2 * kvd;
            check_cols(OP, "qkv", qkv, pc)?;
            check_rows(OP, "qkv", qkv, t)?;
            if cache.dims != dims {
                return Err(err(format!(
                    "{OP}: cache dims {:?} != layer dims {dims:?}",
                    cache.dims
                )));
            }
            let mut out = self.output(t, hq * hd)?;
            if t == 0 {
                return Ok(out);
            }
            let mut guard = self.lock()?;
            let split_ctx = {
                let g = &*guard;
                g.active.and_then(|b| g.statics.get(&b)).map(|s| s.split_ctx)
            };
            let Scratch { batch: cached, attn_ws, retired_attn_ws, statics, active, .. } =
                &mut *guard;
            let db = self.upload_batch(cached, statics, *active, batch)?;
            let s = &self.stream;
            let ad = attn::AttnDims { n_q_heads: hq, n_kv_heads: hkv, head_dim: hd };
            let kv = PagedKv {
                page_size: dims.page_size,
                num_pages: cache.num_pages,
                max_pages: batch.max_pages,
            };
            let sb = SeqBatch {
                cu_seqlens: &db.cu_seqlens,
                ctx_lens: &db.ctx_lens,
                page_table: &db.page_table,
                host_cu_seqlens: &batch.cu_seqlens,
                host_ctx_lens: &batch.ctx_lens,
                host_page_table: &batch.page_table,
            };
            // Split [q | gate], q/k RMSNorm, partial RoPE at ctx_lens + j, k/v into the paged cache.
            let mut q = self.output(t, hq * hd)?;
            let mut gate = self.output(t, hq * hd)?;
            let pv = qkv.v();
            attn::prep(
                s,
                (&pv, Some(pc)),
                (&pv.slice(qd..), Some(pc)),
                (&pv.slice(qd + kvd..), Some(pc)),
                &w.q_norm.v(),
                &w.k_norm.v(),
                dims.eps,
                Rope { rotary_dim: dims.rotary_dim, theta: dims.rope_theta },
                ad,
                kv,
                &sb,
                &mut cache.k,
                &mut cache.v,
                &mut q.vm(),
                &mut gate.vm(),
            )
            .map_err(dk)?;
            let mut o = self.output(t, hq * hd)?;
            match batch.kind {
                StepKind::Prefill => {
                    attn::prefill(s, &q.v(), &cache.k, &cache.v, ad, kv, &sb, None, &mut o.vm())
                        .map_err(dk)?;
                }
                StepKind::Decode => {
                    let n = batch.num_seqs();
                    let max_ctx = split_ctx.unwrap_or_else(|| {
                        db.seq_lens_host.iter().copied().max().unwrap_or(1).max(1) as usize
                    });
                    let splits = attn::decode_splits(n, ad, max_ctx);
                    let ws = grow(
                        s,
                        attn_ws,
                        attn::decode_workspace_len(n, ad, splits),
                        Some(retired_attn_ws),
                    )?;
                    attn::decode(
                        s,
                        &q.v(),
                        &cache.k,
                        &cache.v,
                        ad,
                        kv,
                        (&db.seq_lens, &db.seq_lens_host),
                        (&db.page_table, &batch.page_table),
                        None,
                        splits,
                        ws,
                        &mut o.vm(),
                    )
                    .map_err(dk)?;
                }
            }
            attn::output_gate(s, &o.v(), &gate.v(), hq * hd, None, &mut out.vm()).map_err(dk)?;
            Ok(out)
        })
    }

    fn gather_rows(&self, x: &CudaTensor, rows: &[usize]) -> Result<CudaTensor> {
        self.timed(3, || {
            let mut out = self.output(rows.len(), x.cols)?;
            let c = x.cols;
            for (i, &r) in rows.iter().enumerate() {
                if r >= x.rows {
                    return Err(err(format!("gather_rows: row {r} >= {}", x.rows)));
                }
                let src = x.buf.slice(r * c..(r + 1) * c);
                let mut dst = out.buf.slice_mut(i * c..(i + 1) * c);
                self.stream.memcpy_dtod(&src, &mut dst).map_err(drv)?;
            }
            Ok(out)
        })
    }

    fn concat_rows(&self, a: &CudaTensor, b: &CudaTensor) -> Result<CudaTensor> {
        check_cols("concat_rows", "b", b, a.cols)?;
        let mut out = self.output(a.rows + b.rows, a.cols)?;
        let (na, nb) = (a.len(), b.len());
        if na > 0 {
            let mut dst = out.buf.slice_mut(..na);
            self.stream.memcpy_dtod(&a.v(), &mut dst).map_err(drv)?;
        }
        if nb > 0 {
            let mut dst = out.buf.slice_mut(na..na + nb);
            self.stream.memcpy_dtod(&b.v(), &mut dst).map_err(drv)?;
        }
        Ok(out)
    }

    fn tp_size(&self) -> usize {
        self.comm.as_ref().map_or(1, Communicator::<CudaSlice<bf16>>::world_size)
    }

    fn dummy(
        &self,
        local_shape: &[usize],
        p: &deltakit_ref::init::DummyInit,
        runs: &[std::ops::Range<usize>],
    ) -> Result<CudaTensor> {
        let cols = local_shape.last().copied().unwrap_or(1);
        let n: usize = local_shape.iter().product();
        let rows = n.checked_div(cols).unwrap_or(0);
        if rows <= 1 {
            // One-row weights keep an f32 copy: generate on the host (identical values).
            let data = crate::dummy_init::fill_host(p, runs)?;
            return self.upload(&HostTensor { shape: local_shape.to_vec(), data });
        }
        // SAFETY: `fill_device` writes all `n` elements (the shard's runs) before any read.
        let mut buf = unsafe { alloc_uninit::<bf16>(&self.stream, n) }?;
        crate::dummy_init::fill_device(&self.stream, p, runs, &mut buf)?;
        Ok(CudaTensor { buf, f32_copy: None, rows, cols })
    }

    fn elem_bytes(&self) -> usize {
        2
    }

    fn abort_handle(&self) -> Option<Arc<dyn AbortHandle>> {
        self.comm.as_ref().map(|c| Communicator::<CudaSlice<bf16>>::abort_handle(c))
    }

    fn all_reduce_sum(&self, t: &mut CudaTensor) -> Result<()> {
        self.timed(5, || match &self.comm {
            Some(c) if t.len() > 0 => {
                if t.buf.len() != t.len() {
                    return Err(err("all_reduce_sum: tensor buffer is padded".into()));
                }
                c.all_reduce_sum(&mut t.buf)
            }
            _ => Ok(()),
        })
    }

    fn gather_cols_to_host(&self, t: &CudaTensor) -> Result<Vec<f32>> {
        let Some(c) = &self.comm else {
            return self.to_host(t);
        };
        let w = Communicator::<CudaSlice<bf16>>::world_size(c);
        if t.len() == 0 {
            return Ok(Vec::new());
        }
        if t.buf.len() != t.len() {
            return Err(err("gather_cols_to_host: tensor buffer is padded".into()));
        }
        // SAFETY: the all-gather writes all `w * len` elements before the copy back.
        let mut recv = unsafe { alloc_uninit::<bf16>(&self.stream, w * t.len()) }?;
        c.all_gather(&t.buf, &mut recv)?;
        let host = self.stream.clone_dtoh(&recv).map_err(drv)?;
        self.stream.synchronize().map_err(drv)?;
        let g: Vec<f32> = host.iter().map(|x| x.to_f32()).collect();
        Ok(super::interleave_gathered(&g, w, t.rows, t.cols))
    }
}

fn alloc_for_upload(stream: &Arc<CudaStream>, n: usize) -> Result<CudaSlice<bf16>> {
    // SAFETY: `upload` copies all `n` host elements into it right after.
    unsafe { alloc_uninit::<bf16>(stream, n) }
}
