//! `gemm.linear`: bf16 linear layers through cuBLASLt (cudarc), f32 accumulate, bf16 out, with the
//! algorithm chosen once per shape and alignment and cached per handle.
//!
//! CPU twin: `deltakit_ref::mlp::matmul`. Mirrors `torch.nn.Linear` without bias (HF `*_proj`).

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use cudarc::cublas::result as legacy;
use cudarc::cublas::sys as legacy_sys;
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

/// One way to run a plan's GEMM: a cuBLASLt algorithm, or the legacy cuBLAS `cublasGemmEx` with
/// its default algorithm (cuBLAS's own dispatch, which has skinny-shape kernels of its own). The
/// legacy form is only ever a tuning candidate, kept where it is timed faster.
#[derive(Clone, Copy)]
enum Algo {
    Lt(sys::cublasLtMatmulAlgo_t),
    Legacy,
}

/// Descriptors and the chosen algorithm for one shape; destroyed with the handle.
struct Plan {
    desc: sys::cublasLtMatmulDesc_t,
    a: sys::cublasLtMatrixLayout_t,
    b: sys::cublasLtMatrixLayout_t,
    c: sys::cublasLtMatrixLayout_t,
    algo: Algo,
    /// Further candidates (the heuristic's, best first, then split-K variants and the legacy
    /// form), timed on first use for skinny shapes.
    candidates: Vec<Algo>,
    /// The plan's `(M, N, K)` (for the tuning log).
    m: usize,
    n: usize,
    k: usize,
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

/// While tuning, the weights are timed in rotation over copies that together span at least this
/// many bytes (at most [`TUNE_MAX_COPIES`] copies), so that every timed launch reads its weights
/// from DRAM as a decode step does: a step streams every layer's weights once, so they are never
/// in L2, while back-to-back launches of one 32 MB weight would hit the H200's 50 MB L2. (An
/// earlier form flushed L2 with a memset between launches; its dirty lines were written back
/// during the timed launch and skewed the choice: ncu, 2026-12-01.)
pub const TUNE_ROTATE_BYTES: usize = 256 << 20;

/// Most weight copies in the tuning rotation.
pub const TUNE_MAX_COPIES: usize = 8;

/// Timed passes over the rotation per candidate (after one warm-up pass).
pub const TUNE_REPS: usize = 3;

/// Heuristic candidates whose split-K variants are also timed (see `Gemm::split_k_variants`).
pub const SPLIT_K_BASES: usize = 4;

/// `CUBLASLT_ALGO_CONFIG_SPLITK_NUM` values tried on each of those candidates.
pub const SPLIT_K_VALUES: &[i32] = &[2, 4, 8, 16];

/// `DELTAKIT_GEMM_TUNE_LOG=1`: print every tuned shape's candidate times to stderr (a profiling
/// aid; the library prints nothing otherwise).
fn tune_log() -> bool {
    static S: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *S.get_or_init(|| std::env::var("DELTAKIT_GEMM_TUNE_LOG").is_ok_and(|v| v == "1"))
}

/// A candidate's description for the tuning log: cuBLASLt's `(algorithm id, tile id, split-K
/// count)`, or the legacy form.
fn algo_name(algo: &Algo) -> String {
    match algo {
        Algo::Lt(a) => {
            let [id, tile, split] = algo_config(a);
            format!("algo {id} tile {tile} split-k {split}")
        }
        Algo::Legacy => "legacy cublasGemmEx".to_string(),
    }
}

/// `(algorithm id, tile id, split-K count)` of a cuBLASLt algorithm.
fn algo_config(algo: &sys::cublasLtMatmulAlgo_t) -> [i32; 3] {
    use sys::cublasLtMatmulAlgoConfigAttributes_t as A;
    [
        A::CUBLASLT_ALGO_CONFIG_ID,
        A::CUBLASLT_ALGO_CONFIG_TILE_ID,
        A::CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
    ]
    .map(|attr| {
        let mut v = 0i32;
        let mut written = 0usize;
        // SAFETY: reads one plain-data attribute of a valid algorithm into a 4-byte buffer.
        let _ = unsafe {
            sys::cublasLtMatmulAlgoConfigGetAttribute(
                algo,
                attr,
                (&raw mut v).cast(),
                std::mem::size_of::<i32>(),
                &raw mut written,
            )
        };
        v
    })
}

/// How the tuner times a candidate (`DELTAKIT_GEMM_TUNE`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum TuneMode {
    /// Default: each launch timed alone between its own pair of CUDA events, over the rotation of
    /// weight copies; the median launch wins. Events between launches keep one GEMM from
    /// overlapping the next (cuBLAS kernels may launch their successors early), as in a decode
    /// step, where each GEMM follows a norm or an elementwise kernel.
    Single,
    /// `stream`: back-to-back launches over the rotation, one event pair around all of them
    /// (mean). Kept for A/B measurements (the default before 2026-12-01, session 4).
    Stream,
    /// `hot`: back-to-back launches of the real weights (L2-resident for weights under 50 MB;
    /// the behaviour before the rotation existed), mean.
    Hot,
}

/// Tuning settings read once from the environment: `(candidates, mode, legacy)`.
/// `DELTAKIT_GEMM_TUNE=single|stream|hot` picks the [`TuneMode`] (default single);
/// `DELTAKIT_GEMM_LEGACY=0` leaves the legacy `cublasGemmEx` candidate out.
fn tune_settings() -> (usize, TuneMode, bool) {
    static S: std::sync::OnceLock<(usize, TuneMode, bool)> = std::sync::OnceLock::new();
    *S.get_or_init(|| {
        let n = std::env::var("DELTAKIT_GEMM_TUNE_CANDIDATES")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .map_or(TUNE_CANDIDATES, |n| n.clamp(1, 64));
        let mode = match std::env::var("DELTAKIT_GEMM_TUNE").as_deref() {
            Ok("hot") => TuneMode::Hot,
            Ok("stream") => TuneMode::Stream,
            _ => TuneMode::Single,
        };
        let legacy = std::env::var("DELTAKIT_GEMM_LEGACY").map_or(true, |v| v != "0");
        (n, mode, legacy)
    })
}

/// A legacy cuBLAS handle on the [`Gemm`]'s stream, sharing its workspace (both enqueue on the
/// same stream, so their uses of it are ordered).
struct LegacyHandle(legacy_sys::cublasHandle_t);

impl Drop for LegacyHandle {
    fn drop(&mut self) {
        // SAFETY: created in `Gemm::legacy_handle`, destroyed once.
        unsafe {
            let _ = legacy::destroy_handle(self.0);
        }
    }
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
/// Create one per stream (the engine: one per rank). Calls are enqueued on that stream. The
/// first call of a shape creates its plan; for skinny shapes (`M <=` [`TUNE_MAX_M`], not
/// `accumulate`) it also tunes: it allocates a temporary rotation of weight copies (up to
/// [`TUNE_ROTATE_BYTES`]), times every candidate on the stream and synchronises with it. So
/// make one warm-up call per shape before capturing a CUDA graph: a shape first seen during
/// capture keeps the heuristic's first choice, and is not tuned later.
///
/// Runtime switches (read once per process; profiling and A/B aids):
/// - `DELTAKIT_GEMM_TUNE=single|stream|hot`: how candidates are timed (default `single`: each
///   launch alone between its own CUDA events, median over the weight-copy rotation; `stream`:
///   back-to-back launches over the rotation, mean; `hot`: back-to-back launches of the real
///   weights, mean). Other values mean `single`.
/// - `DELTAKIT_GEMM_TUNE_CANDIDATES=N` (1..=64, default [`TUNE_CANDIDATES`]; 1 = no tuning).
/// - `DELTAKIT_GEMM_LEGACY=0`: leave the legacy `cublasGemmEx` candidate out.
/// - `DELTAKIT_GEMM_TUNE_LOG=1`: print every candidate's time and the choice per shape to stderr.
pub struct Gemm {
    handle: sys::cublasLtHandle_t,
    stream: Arc<CudaStream>,
    /// Created on the first tuning that wants the legacy candidate; `None` inside if cuBLAS
    /// could not be loaded (the candidate is then skipped). Declared before the workspace so
    /// that it is destroyed first.
    legacy: std::sync::OnceLock<Option<LegacyHandle>>,
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
        // cudarc's dynamic loading panics on a missing library; ask first.
        // SAFETY: only tries to load the library.
        if !unsafe { sys::is_culib_present() } {
            return Err(Error::Unsupported {
                op: OP,
                what: "libcublasLt could not be loaded".into(),
            });
        }
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
        Ok(Self {
            handle,
            stream,
            legacy: std::sync::OnceLock::new(),
            workspace,
            plans: Mutex::new(HashMap::new()),
        })
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
            m: key.m,
            n: key.n,
            k: key.k,
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
        plan.algo = Algo::Lt(heur[0].algo);
        plan.candidates = heur.iter().map(|h| Algo::Lt(h.algo)).collect();
        if plan.candidates.len() > 1 {
            let extra = self.split_k_variants(&plan, &heur);
            plan.candidates.extend(extra);
            if tune_settings().2 && !key.accumulate {
                plan.candidates.push(Algo::Legacy);
            }
        }
        Ok(plan)
    }

    /// The legacy cuBLAS handle on this stream with the shared workspace, created on first use;
    /// `None` if cuBLAS cannot be loaded or configured.
    fn legacy_handle(&self) -> Option<legacy_sys::cublasHandle_t> {
        self.legacy
            .get_or_init(|| {
                // cudarc's dynamic loading panics on a missing library; ask first.
                // SAFETY: only tries to load the library.
                if !unsafe { legacy_sys::is_culib_present() } {
                    return None;
                }
                let h = legacy::create_handle().ok()?;
                let handle = LegacyHandle(h);
                let (wsp, _g) = self.workspace.device_ptr(&self.stream);
                // SAFETY: valid handle; the stream and the workspace outlive it (fields of
                // `self`, dropped after it); the workspace is only used on this stream.
                let ok = unsafe {
                    legacy::set_stream(h, self.stream.cu_stream().cast()).is_ok()
                        && legacy_sys::cublasSetWorkspace_v2(h, wsp as *mut c_void, WORKSPACE_BYTES)
                            == legacy_sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS
                };
                ok.then_some(handle)
            })
            .as_ref()
            .map(|h| h.0)
    }

    /// Split-K variants of the heuristic's first [`SPLIT_K_BASES`] candidates: the same algorithm
    /// and tile with `CUBLASLT_ALGO_CONFIG_SPLITK_NUM` in [`SPLIT_K_VALUES`], kept where
    /// `cublasLtMatmulAlgoCheck` accepts them within the handle's workspace. A decode GEMM (M of a
    /// few rows) has too few output tiles to fill 132 SMs without splitting K; the heuristic's own
    /// list for `1 x 4096 x 4096` offered no split-K choice faster than 1.4 TB/s (ncu,
    /// 2026-12-01), while a split-K form of the same shape read at 2.8 TB/s in an earlier run.
    fn split_k_variants(
        &self,
        plan: &Plan,
        heur: &[sys::cublasLtMatmulHeuristicResult_t],
    ) -> Vec<Algo> {
        let mut out = Vec::new();
        for h in heur.iter().take(SPLIT_K_BASES) {
            for &split in SPLIT_K_VALUES {
                let mut algo = h.algo;
                // SAFETY: `algo` is a plain-data copy of an algorithm cuBLASLt returned; the
                // attribute buffer lives across the call; the check only reads the descriptors.
                let ok = unsafe {
                    let set = sys::cublasLtMatmulAlgoConfigSetAttribute(
                        &raw mut algo,
                        sys::cublasLtMatmulAlgoConfigAttributes_t::CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
                        (&raw const split).cast(),
                        std::mem::size_of::<i32>(),
                    );
                    let mut res: sys::cublasLtMatmulHeuristicResult_t = std::mem::zeroed();
                    set == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS
                        && sys::cublasLtMatmulAlgoCheck(
                            self.handle,
                            plan.desc,
                            plan.a,
                            plan.b,
                            plan.c,
                            plan.c,
                            &raw const algo,
                            &raw mut res,
                        ) == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS
                        && res.workspaceSize <= WORKSPACE_BYTES
                };
                if ok {
                    out.push(Algo::Lt(algo));
                }
            }
        }
        out
    }

    /// Time `plan`'s candidates on the call's operands (`out` is overwritten; `accumulate` plans
    /// have a single candidate) and keep the fastest (see [`TuneMode`]): one warm-up pass, then
    /// [`TUNE_REPS`] timed passes over a rotation of weight copies spanning [`TUNE_ROTATE_BYTES`]
    /// (see there; the copies live only while tuning, and without memory for them the real
    /// weights are timed back to back). Never while the stream is being captured into a graph.
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
        let mode = tune_settings().1;
        let w_bytes = plan.n * plan.k * std::mem::size_of::<bf16>();
        let copies = if mode == TuneMode::Hot {
            1
        } else {
            TUNE_ROTATE_BYTES.div_ceil(w_bytes).clamp(1, TUNE_MAX_COPIES)
        };
        // Freed when tuning ends. An allocation failure only shortens the rotation.
        let scratch =
            if copies > 1 { stream.alloc_zeros::<u8>((copies - 1) * w_bytes).ok() } else { None };
        let mut wptrs = vec![wp];
        if let Some(sc) = scratch.as_ref() {
            let (base, _g) = sc.device_ptr(stream);
            for i in 0..copies - 1 {
                let dst = base + (i * w_bytes) as u64;
                // SAFETY: `dst` spans w_bytes inside `sc`; `wp` is the caller's live weight of
                // w_bytes; both on this handle's stream.
                unsafe {
                    cudarc::driver::result::memcpy_dtod_async(dst, wp, w_bytes, stream.cu_stream())
                }?;
                wptrs.push(dst);
            }
        }
        let reps = if mode == TuneMode::Hot { 5 } else { TUNE_REPS };
        let ctx = stream.context();
        let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        // One event pair per timed launch (single mode), reused across candidates.
        let launches = reps * wptrs.len();
        let mut events = Vec::with_capacity(if mode == TuneMode::Single { launches } else { 1 });
        for _ in 0..events.capacity() {
            events.push((ctx.new_event(flags)?, ctx.new_event(flags)?));
        }
        let mut best = (f32::INFINITY, plan.algo);
        for algo in plan.candidates.clone() {
            let launch = |w: u64| -> Result<()> {
                // SAFETY: as in `linear` (same operands and layouts; `w` is the weight or a copy
                // of it), with another algorithm cuBLAS itself proposed.
                unsafe { self.matmul(plan, &algo, xp, w, op, wsp, 0.0) }
            };
            // Warm-up pass; a candidate that fails to launch is skipped.
            if wptrs.iter().try_for_each(|&w| launch(w)).is_err() {
                continue;
            }
            let us = if mode == TuneMode::Single {
                for (i, (a, b)) in events.iter().enumerate() {
                    a.record(stream)?;
                    launch(wptrs[i % wptrs.len()])?;
                    b.record(stream)?;
                }
                let mut t = events
                    .iter()
                    .map(|(a, b)| a.elapsed_ms(b).map(|ms| ms * 1e3))
                    .collect::<std::result::Result<Vec<f32>, _>>()?;
                t.sort_by(f32::total_cmp);
                t[t.len() / 2]
            } else {
                let (a, b) = &events[0];
                a.record(stream)?;
                for i in 0..launches {
                    launch(wptrs[i % wptrs.len()])?;
                }
                b.record(stream)?;
                a.elapsed_ms(b)? * 1e3 / launches as f32
            };
            if tune_log() {
                eprintln!(
                    "gemm tune M={} N={} K={} ({mode:?}): {}: {us:.1} us",
                    plan.m,
                    plan.n,
                    plan.k,
                    algo_name(&algo)
                );
            }
            if us < best.0 {
                best = (us, algo);
            }
        }
        drop(scratch);
        if tune_log() {
            eprintln!(
                "gemm tuned M={} N={} K={} ({mode:?}): {} at {:.1} us",
                plan.m,
                plan.n,
                plan.k,
                algo_name(&best.1),
                best.0
            );
        }
        plan.algo = best.1;
        plan.candidates.clear();
        Ok(())
    }

    /// One GEMM of `plan`'s shape with `algo`: `out = x w^T + beta * out`.
    ///
    /// # Safety
    /// `xp`, `wp`, `op` point to live buffers of the plan's extents in this handle's context,
    /// `wsp` to the handle's workspace.
    #[allow(clippy::too_many_arguments)]
    unsafe fn matmul(
        &self,
        plan: &Plan,
        algo: &Algo,
        xp: u64,
        wp: u64,
        op: u64,
        wsp: u64,
        beta: f32,
    ) -> Result<()> {
        let alpha = 1.0f32;
        let lt_algo = match algo {
            Algo::Lt(a) => a,
            Algo::Legacy => {
                let h = self.legacy_handle().ok_or_else(|| Error::Unsupported {
                    op: OP,
                    what: "cuBLAS (legacy) could not be loaded".into(),
                })?;
                let dim = |v: usize| v as i32; // checked <= i32::MAX in `linear`
                let ty = legacy_sys::cudaDataType::CUDA_R_16BF;
                // Column-major view as in `make_plan`: out^T[N, M] = w^T (N x K, w stored K x N
                // column-major, transposed) * x^T (K x M).
                // SAFETY: forwarded to the caller; the legacy handle enqueues on this stream.
                return unsafe {
                    legacy::gemm_ex(
                        h,
                        legacy_sys::cublasOperation_t::CUBLAS_OP_T,
                        legacy_sys::cublasOperation_t::CUBLAS_OP_N,
                        dim(plan.n),
                        dim(plan.m),
                        dim(plan.k),
                        (&raw const alpha).cast(),
                        wp as *const c_void,
                        ty,
                        dim(plan.k),
                        xp as *const c_void,
                        ty,
                        dim(plan.k),
                        (&raw const beta).cast(),
                        op as *mut c_void,
                        ty,
                        dim(plan.n),
                        legacy_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                        legacy_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DFALT,
                    )
                }
                .map_err(|e| Error::Unsupported { op: OP, what: format!("cublasGemmEx: {e:?}") });
            }
        };
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
                lt_algo,
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
        self.linear_impl(x, w, out, m, n, k, accumulate, false)
    }

    /// [`Gemm::linear`] forced through the legacy `cublasGemmEx` candidate (no tuning), so
    /// that tests cover that path whatever the tuner picks. Same contract and errors, plus
    /// [`Error::Unsupported`] if cuBLAS cannot be loaded.
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    pub fn linear_legacy(
        &self,
        x: &impl DevicePtr<bf16>,
        w: &impl DevicePtr<bf16>,
        out: &mut impl DevicePtrMut<bf16>,
        m: usize,
        n: usize,
        k: usize,
        accumulate: bool,
    ) -> Result<()> {
        self.linear_impl(x, w, out, m, n, k, accumulate, true)
    }

    #[allow(clippy::too_many_arguments)]
    fn linear_impl(
        &self,
        x: &impl DevicePtr<bf16>,
        w: &impl DevicePtr<bf16>,
        out: &mut impl DevicePtrMut<bf16>,
        m: usize,
        n: usize,
        k: usize,
        accumulate: bool,
        force_legacy: bool,
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
            std::collections::hash_map::Entry::Vacant(e) => e.insert(self.make_plan(key)?),
        };
        // Tunes on the first non-legacy call of the shape (a no-op once tuned: `tune` empties
        // the candidate list), also when a forced-legacy call created the plan, or when the first
        // call came during a graph capture (no tuning inside a capture).
        if !force_legacy {
            self.tune(plan, xp, wp, op, wsp)?;
        }
        let beta = if accumulate { 1.0f32 } else { 0.0 };
        if force_legacy {
            // SAFETY: as below.
            return unsafe { self.matmul(plan, &Algo::Legacy, xp, wp, op, wsp, beta) };
        }
        // SAFETY: live device buffers of the checked lengths in this handle's context; the plan's
        // layouts describe exactly those extents.
        unsafe { self.matmul(plan, &plan.algo, xp, wp, op, wsp, beta) }
    }
}
