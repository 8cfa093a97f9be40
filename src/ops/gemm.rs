//! `gemm.linear`: bf16 linear layers through cuBLASLt (cudarc), f32 accumulate, bf16 out, with the
//! algorithm chosen once per shape and alignment and cached per handle.
//!
//! CPU twin: `deltakit_ref::mlp::matmul`. Mirrors `torch.nn.Linear` without bias (HF `*_proj`).

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use half::bf16;

use crate::error::{Error, Result};
use crate::launch::same_context;

const OP: &str = "gemm.linear";

/// Workspace cuBLASLt may use per call (NVIDIA's recommendation for Hopper).
pub const WORKSPACE_BYTES: usize = 32 << 20;

fn blas(what: &'static str) -> impl Fn(lt::CublasError) -> Error {
    move |e| Error::Unsupported { op: OP, what: format!("cuBLASLt {what}: {e:?}") }
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
struct PlanKey {
    m: usize,
    n: usize,
    k: usize,
    accumulate: bool,
    /// Largest power of two (<= 16 bytes) dividing every operand address.
    align: u32,
}

/// Descriptors and the chosen algorithm for one shape; destroyed with the handle.
struct Plan {
    desc: sys::cublasLtMatmulDesc_t,
    a: sys::cublasLtMatrixLayout_t,
    b: sys::cublasLtMatrixLayout_t,
    c: sys::cublasLtMatrixLayout_t,
    algo: sys::cublasLtMatmulAlgo_t,
    /// Further heuristic candidates (best first), timed on first use for skinny shapes.
    candidates: Vec<sys::cublasLtMatmulAlgo_t>,
}

/// Shapes with at most this many rows (decode steps: one row per sequence) have their algorithm
/// chosen by timing cuBLASLt's top [`TUNE_CANDIDATES`] heuristic candidates on the first call
/// (the heuristic's first choice for `M = 1` reads the weights at ~1.6 TB/s on an H200 for
/// `4096 x 4096`, its split-K candidates at ~2.8; ncu, 2026-12-01). Larger shapes (prefill) keep
/// the heuristic's first choice.
pub const TUNE_MAX_M: usize = 256;

/// Heuristic candidates timed per skinny shape (`DELTAKIT_GEMM_TUNE_CANDIDATES` overrides it,
/// 1..=64; 1 turns tuning off).
pub const TUNE_CANDIDATES: usize = 16;

/// Bytes written between timed launches while tuning, so that every candidate reads its weights
/// from DRAM as a decode step does (a step streams every layer's weights once: they are never in
/// L2, while back-to-back launches of one 32 MB weight would hit the H200's 50 MB L2). Twice the
/// largest L2 of the supported GPUs.
pub const TUNE_FLUSH_BYTES: usize = 128 << 20;

/// Timed launches per candidate (each after an L2 flush); the candidate's time is their sum.
pub const TUNE_REPS: usize = 3;

/// Tuning settings read once from the environment: `(candidates, cold)`.
/// `DELTAKIT_GEMM_TUNE=hot` times back-to-back launches without flushing L2 (the behaviour before
/// 2026-12-01, kept for A/B measurements); anything else (or unset) flushes.
fn tune_settings() -> (usize, bool) {
    static S: std::sync::OnceLock<(usize, bool)> = std::sync::OnceLock::new();
    *S.get_or_init(|| {
        let n = std::env::var("DELTAKIT_GEMM_TUNE_CANDIDATES")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .map_or(TUNE_CANDIDATES, |n| n.clamp(1, 64));
        let cold = std::env::var("DELTAKIT_GEMM_TUNE").map_or(true, |v| v != "hot");
        (n, cold)
    })
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: each handle was created by this plan and is destroyed once, here.
        unsafe {
            let _ = lt::destroy_matrix_layout(self.a);
            let _ = lt::destroy_matrix_layout(self.b);
            let _ = lt::destroy_matrix_layout(self.c);
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

/// A cuBLASLt handle bound to one stream, with its workspace and per-shape plan cache.
///
/// Create one per stream (the engine: one per rank). Calls are enqueued on that stream; plan
/// creation (first call of a shape) does host work only, so capture a CUDA graph after a warm-up
/// call per shape.
pub struct Gemm {
    handle: sys::cublasLtHandle_t,
    stream: Arc<CudaStream>,
    workspace: CudaSlice<u8>,
    plans: Mutex<HashMap<PlanKey, Plan>>,
}

// SAFETY: the handle is only used under `&self` with the plan mutex held for plan creation, and
// cuBLASLt handles may be used from any thread bound to their context.
unsafe impl Send for Gemm {}
// SAFETY: as above.
unsafe impl Sync for Gemm {}

impl Drop for Gemm {
    fn drop(&mut self) {
        if let Ok(mut p) = self.plans.lock() {
            p.clear();
        }
        // SAFETY: created in `new`, destroyed once.
        unsafe {
            let _ = lt::destroy_handle(self.handle);
        }
    }
}

impl std::fmt::Debug for Gemm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gemm").field("plans", &self.cached_plans()).finish_non_exhaustive()
    }
}

fn align_of(ptrs: &[u64]) -> u32 {
    let mut a = 16u32;
    for &p in ptrs {
        while a > 2 && p % u64::from(a) != 0 {
            a /= 2;
        }
    }
    a
}

impl Gemm {
    /// Creates the handle and a [`WORKSPACE_BYTES`] workspace on `stream`'s device.
    ///
    /// # Errors
    /// [`Error::Driver`] if the allocation fails; [`Error::Unsupported`] if cuBLASLt cannot be
    /// loaded or initialised.
    pub fn new(stream: Arc<CudaStream>) -> Result<Self> {
        stream.context().bind_to_thread()?;
        let handle = lt::create_handle().map_err(blas("create handle"))?;
        let workspace = match stream.alloc_zeros::<u8>(WORKSPACE_BYTES) {
            Ok(w) => w,
            Err(e) => {
                // SAFETY: just created.
                unsafe {
                    let _ = lt::destroy_handle(handle);
                }
                return Err(e.into());
            }
        };
        Ok(Self { handle, stream, workspace, plans: Mutex::new(HashMap::new()) })
    }

    /// The stream this handle enqueues on.
    #[must_use]
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Number of cached (shape, alignment) plans.
    #[must_use]
    pub fn cached_plans(&self) -> usize {
        self.plans.lock().map_or(0, |p| p.len())
    }

    fn make_plan(&self, key: PlanKey) -> Result<Plan> {
        let (m, n, k) = (key.m as u64, key.n as u64, key.k as u64);
        // Row-major out[M,N] = x[M,K] w[N,K]^T is column-major out^T[N,M] = w^T... : with A = w
        // (column-major K x N, transposed), B = x (column-major K x M), C = out (column-major N x M).
        let desc = lt::create_matmul_desc(
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            sys::cudaDataType_t::CUDA_R_32F,
        )
        .map_err(blas("matmul desc"))?;
        let ty = sys::cudaDataType_t::CUDA_R_16BF;
        let mut plan = Plan {
            desc,
            a: std::ptr::null_mut(),
            b: std::ptr::null_mut(),
            c: std::ptr::null_mut(),
            // SAFETY: plain-data struct; overwritten by the heuristic below before use.
            algo: unsafe { std::mem::zeroed() },
            candidates: Vec::new(),
        };
        let trans: i32 = 1;
        // SAFETY: valid desc; the attribute buffer lives across the call.
        unsafe {
            lt::set_matmul_desc_attribute(
                desc,
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                (&raw const trans).cast::<c_void>(),
                std::mem::size_of::<i32>(),
            )
            .map_err(blas("transa"))?;
        }
        plan.a = lt::create_matrix_layout(ty, k, n, k as i64).map_err(blas("layout A"))?;
        plan.b = lt::create_matrix_layout(ty, k, m, k as i64).map_err(blas("layout B"))?;
        plan.c = lt::create_matrix_layout(ty, n, m, n as i64).map_err(blas("layout C"))?;
        let pref = lt::create_matmul_pref().map_err(blas("preference"))?;
        let ws = WORKSPACE_BYTES as u64;
        let align = key.align;
        // SAFETY: valid handles; attribute buffers live across each call; pref destroyed below.
        let heur = unsafe {
            let set =
                |attr, v: *const c_void, size| lt::set_matmul_pref_attribute(pref, attr, v, size);
            let r = set(
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&raw const ws).cast(),
                std::mem::size_of::<u64>(),
            )
            .and_then(|()| {
                [
                    sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                    sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                    sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                ]
                .into_iter()
                .try_for_each(|attr| set(attr, (&raw const align).cast(), std::mem::size_of::<u32>()))
            })
            .and_then(|()| {
                let want = if key.m <= TUNE_MAX_M && !key.accumulate { tune_settings().0 } else { 1 };
                // SAFETY: plain-data results, written by cuBLASLt for the first `count` entries.
                let mut res: Vec<sys::cublasLtMatmulHeuristicResult_t> =
                    vec![std::mem::zeroed(); want];
                let mut count = 0i32;
                sys::cublasLtMatmulAlgoGetHeuristic(
                    self.handle,
                    desc,
                    plan.a,
                    plan.b,
                    plan.c,
                    plan.c,
                    pref,
                    want as i32,
                    res.as_mut_ptr(),
                    &raw mut count,
                )
                .result()?;
                res.truncate(usize::try_from(count).unwrap_or(0));
                if res.is_empty() {
                    return Err(lt::CublasError(sys::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED));
                }
                Ok(res)
            });
            let _ = lt::destroy_matmul_pref(pref);
            r
        };
        let heur = heur.map_err(|e| Error::Unsupported {
            op: OP,
            what: format!("no cuBLASLt algorithm for M={m} N={n} K={k} align={align}: {e:?}"),
        })?;
        plan.algo = heur[0].algo;
        plan.candidates = heur.iter().map(|h| h.algo).collect();
        Ok(plan)
    }

    /// Time `plan`'s candidates on the call's operands (`out` is overwritten; `accumulate` plans
    /// have a single candidate) and keep the fastest: 2 warm-up launches, then [`TUNE_REPS`]
    /// launches each timed alone with CUDA events after a [`TUNE_FLUSH_BYTES`] memset that evicts
    /// the weights from L2 (see [`TUNE_FLUSH_BYTES`]). Never while the stream is being captured
    /// into a graph.
    #[allow(clippy::too_many_arguments)]
    fn tune(&self, plan: &mut Plan, xp: u64, wp: u64, op: u64, wsp: u64) -> Result<()> {
        if plan.candidates.len() < 2 {
            return Ok(());
        }
        let stream = &self.stream;
        if stream.capture_status()?
            != cudarc::driver::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
        {
            return Ok(());
        }
        let cold = tune_settings().1;
        // Freed when tuning ends: the flush buffer is not kept for the handle's lifetime.
        let mut flush = if cold { Some(stream.alloc_zeros::<u8>(TUNE_FLUSH_BYTES)?) } else { None };
        let ctx = stream.context();
        let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let mut best = (f32::INFINITY, plan.algo);
        for algo in plan.candidates.clone() {
            let run = |n: usize| -> Result<()> {
                for _ in 0..n {
                    // SAFETY: as in `linear` (same operands and layouts), with another algorithm
                    // cuBLASLt itself proposed for these layouts.
                    unsafe { self.matmul(plan, &algo, xp, wp, op, wsp, 0.0) }?;
                }
                Ok(())
            };
            if run(2).is_err() {
                continue; // a candidate that fails to launch is skipped
            }
            let mut ms = 0f32;
            if let Some(f) = flush.as_mut() {
                for _ in 0..TUNE_REPS {
                    stream.memset_zeros(f)?;
                    let (a, b) = (ctx.new_event(flags)?, ctx.new_event(flags)?);
                    a.record(stream)?;
                    run(1)?;
                    b.record(stream)?;
                    ms += a.elapsed_ms(&b)?;
                }
            } else {
                let (a, b) = (ctx.new_event(flags)?, ctx.new_event(flags)?);
                a.record(stream)?;
                run(5)?;
                b.record(stream)?;
                ms = a.elapsed_ms(&b)?;
            }
            if ms < best.0 {
                best = (ms, algo);
            }
        }
        plan.algo = best.1;
        plan.candidates.clear();
        Ok(())
    }

    /// One `cublasLtMatmul` of `plan`'s shape with `algo`: `out = x w^T + beta * out`.
    ///
    /// # Safety
    /// `xp`, `wp`, `op` point to live buffers of the plan's extents in this handle's context,
    /// `wsp` to the handle's workspace.
    #[allow(clippy::too_many_arguments)]
    unsafe fn matmul(
        &self,
        plan: &Plan,
        algo: &sys::cublasLtMatmulAlgo_t,
        xp: u64,
        wp: u64,
        op: u64,
        wsp: u64,
        beta: f32,
    ) -> Result<()> {
        let alpha = 1.0f32;
        // SAFETY: forwarded to the caller; C and D alias `out` (allowed, same layout).
        unsafe {
            lt::matmul(
                self.handle,
                plan.desc,
                (&raw const alpha).cast(),
                (&raw const beta).cast(),
                wp as *const c_void,
                plan.a,
                xp as *const c_void,
                plan.b,
                op as *const c_void,
                plan.c,
                op as *mut c_void,
                plan.c,
                algo,
                wsp as *mut c_void,
                WORKSPACE_BYTES,
                self.stream.cu_stream().cast(),
            )
        }
        .map_err(blas("matmul"))
    }

    /// `out[M, N] = x[M, K] @ w[N, K]^T` (row-major, torch `Linear.weight` layout), bf16 operands,
    /// f32 accumulation and scaling, one rounding to bf16. With `accumulate`, adds into `out`
    /// instead (`out += x w^T`, e.g. a residual add fused into `o_proj` / `down_proj`).
    ///
    /// # Errors
    /// [`Error::Shape`] if a length is not `M*K`, `N*K`, `M*N` or a dim is 0;
    /// [`Error::DeviceMismatch`] if a buffer lives on another context;
    /// [`Error::Unsupported`] if cuBLASLt has no algorithm or fails.
    #[allow(clippy::too_many_arguments)]
    pub fn linear(
        &self,
        x: &impl DevicePtr<bf16>,
        w: &impl DevicePtr<bf16>,
        out: &mut impl DevicePtrMut<bf16>,
        m: usize,
        n: usize,
        k: usize,
        accumulate: bool,
    ) -> Result<()> {
        for (arg, v) in [("m", m), ("n", n), ("k", k)] {
            if v == 0 || v > i32::MAX as usize {
                return Err(Error::shape(OP, arg, "1..=i32::MAX", v));
            }
        }
        let len = |a: usize, b: usize| a.saturating_mul(b);
        if x.len() != len(m, k) {
            return Err(Error::shape(OP, "x", format!("len M*K = {m}*{k}"), x.len()));
        }
        if w.len() != len(n, k) {
            return Err(Error::shape(OP, "w", format!("len N*K = {n}*{k}"), w.len()));
        }
        if out.len() != len(m, n) {
            return Err(Error::shape(OP, "out", format!("len M*N = {m}*{n}"), out.len()));
        }
        let stream = &self.stream;
        same_context(OP, "x", stream, x)?;
        same_context(OP, "w", stream, w)?;
        same_context(OP, "out", stream, out)?;
        stream.context().bind_to_thread()?;
        let (xp, _gx) = x.device_ptr(stream);
        let (wp, _gw) = w.device_ptr(stream);
        let (op, _go) = out.device_ptr_mut(stream);
        let (wsp, _gws) = self.workspace.device_ptr(stream);
        let key = PlanKey { m, n, k, accumulate, align: align_of(&[xp, wp, op]) };
        let mut plans = self.plans.lock().map_err(|_| Error::Unsupported {
            op: OP,
            what: "plan cache poisoned by a panic in another thread".into(),
        })?;
        let plan = match plans.entry(key) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let plan = e.insert(self.make_plan(key)?);
                self.tune(plan, xp, wp, op, wsp)?;
                plan
            }
        };
        let beta = if accumulate { 1.0f32 } else { 0.0 };
        // SAFETY: live device buffers of the checked lengths in this handle's context; the plan's
        // layouts describe exactly those extents.
        unsafe { self.matmul(plan, &plan.algo, xp, wp, op, wsp, beta) }
    }
}
