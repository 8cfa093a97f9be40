//! `gdr.chunk_prefill` (Triton AOT, `triton_aot/gdr/chunk_prefill.py`): chunkwise (chunk 64,
//! WY / UT form) gated delta rule prefill over a varlen batch, with fused or precomputed gating,
//! in-kernel q/k L2 norm and q scale, reading / writing the f32 state pool in place.
//! CPU twins: `deltakit_ref::gdr::{chunk_prefill, recurrent_prefill, gating}`.
//!
//! On a compute-capability 9.0 device with an sm_90a build, `K = 128` and `V` a multiple of 64 and
//! at least 128 run the split pipeline by default ([`PrefillPipeline::Split`]: the two Triton
//! chunk-map launches, then a CUDA local pass and a CUDA wgmma state kernel that also writes the
//! output). Elsewhere one call enqueues seven Triton kernels (see the kernel file's docstring):
//! chunk offsets per sequence, the chunk -> sequence map (both computed on the device from
//! `cu_seqlens`, so nothing depends on host copies of device data), three per-chunk WY passes
//! (gating + `A = beta K K^T` decay; the unit-lower-triangular inverse `Tm = (I + A)^-1`; `W`,
//! `U`), the sequential state pass (one program per sequence, value head and 32 value columns) and
//! the output pass. Head dims below the tuned 64 (`K` in {16, 32}, `V` in {16, 32}) run the tuned
//! tile shapes with the padding rows / columns masked (loaded as 0, never stored). The Triton
//! `K = V = 128` path has pipeline variants ([`pipeline_selected`], `DELTAKIT_GDR_PREFILL`): by
//! default W is stored as bf16 hi / lo planes between the W/U and state passes and the W/U pass is
//! split over grid z (W and U in separate programs); `f32w` runs the round-1 entries (same
//! products throughout).
//! All scratch lives in the caller's workspace
//! ([`workspace_bytes`]): the call allocates nothing and is CUDA-graph safe.

use cudarc::driver::{CudaStream, CudaView, DevicePtr, DevicePtrMut};
use half::bf16;

use super::{DecodeStrides, GdrDims, GdrOptions};
use crate::error::{Error, Result};
use crate::ffi;
use crate::launch::{bind, check, raw_stream, same_context};
use crate::ops::validate;

const OP: &str = "gdr.chunk_prefill";

/// Chunk size (tokens) of the chunkwise algorithm; chunks restart at every sequence start.
pub const CHUNK: usize = 64;
/// Value columns per program of the state pass (manifest `BV` of every `gdr_chunk_state_*`;
/// grid z is `ceil(V / STATE_BV)`, one padded program for `V = 16`).
const STATE_BV: usize = 32;
/// Value columns per program of the output pass (manifest `BV` of every `gdr_chunk_out_*` but
/// `(128, 128)`; grid z is `ceil(V / BV)`, one padded program for `V` in {16, 32}).
const OUT_BV: usize = 64;
/// Output-pass value columns of the `(K, V) = (128, 128)` entry: one program per (chunk, head)
/// computes `Q K^T` once instead of twice (-5% of the whole call on an H200, 2026-12-01).
const OUT_BV_WIDE: usize = 128;
/// State-pass value columns of the `(128, 128)` W-split entries (`gdr_chunk_state_k128v128_ws_bv*`):
/// [`STATE_BV_NARROW`] when `N * H_v <= STATE_NARROW_MAX_ROWS` (its `N * H_v * 8` programs then fit
/// one wave of two programs per SM on a 132-SM H100 / H200), else [`STATE_BV`].
const STATE_BV_NARROW: usize = 16;
/// See [`STATE_BV_NARROW`].
const STATE_NARROW_MAX_ROWS: usize = 33;
/// Chunk ids per program of `gdr_chunk_map` (manifest `BLOCK`).
const MAP_BLOCK: usize = 128;
/// Alignment of every workspace region, bytes.
const WS_ALIGN: usize = 256;

/// Token strides of `q`, `k`, `v` (and `a`, `b` for fused gating), in elements; `None` =
/// contiguous. Same type as [`super::decode`]'s: lets the inputs be column views of one packed
/// buffer (e.g. the conv1d output). `q`/`k`/`v` strides must be multiples of 16 elements.
pub type ChunkPrefillStrides = DecodeStrides;

/// How the per-token decay `g` and write strength `beta` are given.
#[derive(Debug)]
pub enum Gating<'a> {
    /// Precomputed f32 `g` (log-decay, must be `<= 0`) and `beta`, both contiguous `[T, H_v]`.
    Precomputed {
        /// Log-decay `[T, H_v]`.
        g: CudaView<'a, f32>,
        /// Write strength `[T, H_v]`.
        beta: CudaView<'a, f32>,
    },
    /// Fused (Qwen3.5): `g = -exp(a_log) * softplus(a + dt_bias)`, `beta = sigmoid(b)` in f32,
    /// from bf16 `a`, `b` `[T, H_v]` (token stride `strides.ab`) and f32 `a_log`, `dt_bias`
    /// `[H_v]`.
    Fused {
        /// Decay projection `[T, H_v]`.
        a: CudaView<'a, bf16>,
        /// Beta projection `[T, H_v]`.
        b: CudaView<'a, bf16>,
        /// `A_log [H_v]`.
        a_log: CudaView<'a, f32>,
        /// `dt_bias [H_v]`.
        dt_bias: CudaView<'a, f32>,
    },
}

/// Where each live sequence's initial state comes from.
#[derive(Debug)]
pub enum InitialState<'a> {
    /// Every sequence starts from zeros (the slot is only written).
    Zeros,
    /// Every sequence reads its slot.
    FromSlots,
    /// Per sequence, on the device: i32 `[N]`, non-zero = read the slot, 0 = start from zeros
    /// (vLLM's `has_initial_state`).
    PerSequence(CudaView<'a, i32>),
}

/// The device inputs of [`chunk_prefill`] (`N` sequences, `T` packed tokens).
#[derive(Debug)]
pub struct ChunkPrefillInputs<'a> {
    /// Queries bf16 `[T, H_k, K]` (token stride `strides.q`).
    pub q: CudaView<'a, bf16>,
    /// Keys bf16 `[T, H_k, K]` (token stride `strides.k`).
    pub k: CudaView<'a, bf16>,
    /// Values bf16 `[T, H_v, V]` (token stride `strides.v`).
    pub v: CudaView<'a, bf16>,
    /// Decay and write strength.
    pub gating: Gating<'a>,
    /// i32 `[N + 1]`: 0, non-decreasing, last = `T` (sequence `i` = tokens `cu[i]..cu[i+1]`).
    pub cu_seqlens: CudaView<'a, i32>,
    /// i32 `[N]`: state-pool slot of each sequence; `-1` = padding sequence.
    pub slots: CudaView<'a, i32>,
    /// Initial-state policy.
    pub initial_state: InitialState<'a>,
}

/// Byte offsets of the workspace regions.
#[derive(Clone, Copy, Debug)]
struct Layout {
    nt: usize,
    coff: usize,
    cseq: usize,
    gcum: usize,
    beta: usize,
    a: usize,
    w: usize,
    u: usize,
    h: usize,
    /// i32 flags of the split pipeline's overlap variant (bit 512): `nt * H_v` image-ready flags,
    /// then one abort flag per state CTA (`N * H_v * ceil(V / 64)`); zeroed by the call itself.
    flags: usize,
    total: usize,
}

fn layout(dims: GdrDims, total_tokens: usize, num_seqs: usize) -> Option<Layout> {
    let nt = (total_tokens / CHUNK).checked_add(num_seqs)?;
    let mut at = 0usize;
    let mut region = |bytes: Option<usize>| -> Option<usize> {
        let start = at;
        at = at.checked_add(bytes?)?.checked_next_multiple_of(WS_ALIGN)?;
        Some(start)
    };
    let th = total_tokens.checked_mul(dims.h_v)?;
    let coff = region(num_seqs.checked_add(1)?.checked_mul(4))?;
    let cseq = region(nt.checked_mul(4))?;
    let gcum = region(th.checked_mul(4))?;
    let beta = region(th.checked_mul(4))?;
    let a = region(th.checked_mul(CHUNK)?.checked_mul(4))?;
    let w = region(th.checked_mul(dims.k)?.checked_mul(4))?;
    let u = region(th.checked_mul(dims.v)?.checked_mul(4))?;
    let h = region(nt.checked_mul(dims.state_per_slot())?.checked_mul(2))?;
    let state_ctas = num_seqs.checked_mul(dims.h_v)?.checked_mul(dims.v.div_ceil(64))?;
    let flags = region(nt.checked_mul(dims.h_v)?.checked_add(state_ctas)?.checked_mul(4))?;
    Some(Layout { nt, coff, cseq, gcum, beta, a, w, u, h, flags, total: at })
}

/// Workspace bytes [`chunk_prefill`] needs for `total_tokens` packed tokens in `num_seqs`
/// sequences (any split). Dominated by W/U (f32 `[T, H_v, K + V]`), Tm (f32 `[T, H_v, 64]`) and
/// the per-chunk states (bf16 `[T/64 + N, H_v, K, V]`): ~ `T * H_v * (4 (K + V + 66) + K V / 32)`
/// bytes: 677 MiB for `T = 8192, H_v = 48, K = V = 128` (3.5 GiB for `T = 65536, H_v = 32`).
/// Size it once for the largest batch the engine runs (the size is monotone in both counts) and
/// reuse it.
///
/// # Panics
/// Never for sizes that fit in memory; returns `usize::MAX` if the computation overflows.
#[must_use]
pub fn workspace_bytes(dims: GdrDims, total_tokens: usize, num_seqs: usize) -> usize {
    layout(dims, total_tokens, num_seqs).map_or(usize::MAX, |l| l.total)
}

type KktFn = unsafe extern "C" fn(
    ffi::dk_stream_t,
    u32,
    u32,
    u32,
    u64,
    u64,
    u64,
    u64,
    u64,
    u64,
    u64,
    u64,
    u64,
    u64,
    u64,
    u64,
    u64,
    u64,
    i64,
    i64,
    i32,
    i32,
    i64,
    i64,
    i32,
    i32,
) -> ffi::dk_status;
type WuFn = unsafe extern "C" fn(
    ffi::dk_stream_t,
    u32,
    u32,
    u32,
    u64,
    u64,
    u64,
    u64,
    u64,
    u64,
    u64,
    u64,
    u64,
    u64,
    u64,
    i64,
    i64,
    i32,
    i32,
    i64,
    i64,
    i32,
) -> ffi::dk_status;
type StateFn = unsafe extern "C" fn(
    ffi::dk_stream_t,
    u32,
    u32,
    u32,
    u64,
    u64,
    u64,
    u64,
    u64,
    u64,
    u64,
    u64,
    u64,
    u64,
    i64,
    i64,
    i32,
    i32,
    i64,
    i32,
    i32,
) -> ffi::dk_status;
type OutFn = unsafe extern "C" fn(
    ffi::dk_stream_t,
    u32,
    u32,
    u32,
    u64,
    u64,
    u64,
    u64,
    u64,
    u64,
    u64,
    u64,
    u64,
    u64,
    i64,
    i64,
    i32,
    i32,
    i64,
    i64,
    i32,
    f32,
) -> ffi::dk_status;

/// The `(K, V) = (128, 128)` pipeline variants (issue 15 round 2): the W/U pass storing W as
/// bf16 hi / lo planes (`wu`), the same split over grid z (`wu_splitz`: W and U in separate
/// programs; and `wu_f32_splitz`, f32 W), and the state pass reading the planes at `BV = 32` /
/// `BV = 16`.
#[derive(Clone, Copy)]
struct WsplitKernels {
    wu: WuFn,
    wu_splitz: WuFn,
    wu_f32_splitz: WuFn,
    state_bv32: StateFn,
    state_bv16: StateFn,
}

/// Which pipeline [`chunk_prefill`] runs ([`pipeline_selected`]). The CUDA pipelines
/// ([`PrefillPipeline::Split`]) take `K = 128`, `V` a multiple of 64 and at least 128 on sm_90a;
/// the Triton variants apply to `K = V = 128`; every other head dim pair runs
/// [`PrefillPipeline::F32W`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrefillPipeline {
    /// Round 1: f32 W and U between the W/U and state passes, one W/U program per (chunk, head)
    /// (`DELTAKIT_GDR_PREFILL=f32w`; what every other head-dim pair runs).
    F32W,
    /// W as bf16 hi / lo planes (same bytes, same three bf16 products in the state pass).
    Wsplit,
    /// f32 W, the W/U pass split over grid z (W and U in separate programs).
    Splitz,
    /// W planes and the W/U pass split over grid z (the default).
    WsplitSplitz,
    /// [`PrefillPipeline::WsplitSplitz`] with the sm_90a CUDA state pass
    /// (`csrc/gdr/chunk_prefill_sm90.cu`: persistent, warp-specialized, wgmma;
    /// `DELTAKIT_GDR_PREFILL=sm90`, opt-in). Same products and rounding points as the Triton state
    /// pass up to the f32 summation order. H200, 2026-12-01: passes the chunk-prefill GPU tests and
    /// compute-sanitizer memcheck; racecheck reports 4 hazards (the producer's cp.async writes of
    /// the W / K ring vs the consumer's shared-memory reads), not explained yet: the minimal probe
    /// `tools/tune/racecheck_probe.cu` reports none for an mbarrier hand-off without cp.async (mode
    /// 2). State pass alone 0.91x the Triton one's time at 27B TP1 but 1.13x at TP2 (1.12x at 9B
    /// 1 x 65536), so it stays opt-in. A device that is not compute capability 9.0 or a build without
    /// an sm_90a image (`DELTAKIT_CUDA_ARCHS` lacking `90a`) runs [`PrefillPipeline::WsplitSplitz`]
    /// instead, decided before anything is enqueued.
    Sm90State,
    /// The default (`DELTAKIT_GDR_PREFILL=split` or unset): the arithmetic of session 4's
    /// one-kernel `fused` pipeline (removed in session 5: slower at every measured shape,
    /// docs/benchmarks/2026-12-01-gdr-prefill-s5.md) in two sm_90a launches
    /// (`csrc/gdr/chunk_prefill_fused_sm90.cu`). After the Triton chunk-offset / chunk-map
    /// launches, a local pass (grid chunks x value heads, 3 CTAs per SM) computes each chunk's
    /// gating, norms, `Q K^T`, `(I + A)^-1` and `Tb` once per head into the workspace's
    /// per-chunk-state region (26,880 bytes per chunk and head), then the state kernel (grid
    /// sequences x value heads x `V / 64`) runs only the state-dependent products on wgmma (A = the
    /// state / corrections from registers, B = K / Q / `Tb` / `P` tiles from shared memory), four
    /// warps copying each chunk's inputs and local results into a 3-stage ring. `K = 128`, `V` a
    /// multiple of 64 and at least 128 on a compute-capability 9.0 device with an sm_90a image;
    /// otherwise [`PrefillPipeline::WsplitSplitz`] (Triton), decided before anything is enqueued.
    /// H200, 2026-12-01: every chunk-prefill GPU test and memcheck pass; 0.531 / 0.417 / 2.455 /
    /// 3.514 ms at 27B TP1 / TP2 1 x 8192, 9B 8 x 8192 / 1 x 65536 (Triton 1.304 / 0.793 / 7.202 /
    /// 7.612, FlashInfer 0.393 / 0.232 / 1.008 / 1.657).
    Split,
}

/// The pipeline [`chunk_prefill`] runs, from `DELTAKIT_GDR_PREFILL` (read once per process):
/// `f32w`, `wsplit`, `splitz`, `wsplit_splitz`, `sm90`, `split` select
/// [`PrefillPipeline`]'s variants; unset or anything else runs the default
/// ([`PrefillPipeline::Split`], which falls back to [`PrefillPipeline::WsplitSplitz`] where it
/// cannot run). The Triton variants compute the same products (bit-identical outputs and states
/// on an H200, 2026-12-01); they differ in launches and bytes. The CUDA pipelines compute the
/// same chunkwise form with their own product order and splits (same tolerances;
/// `tools/dev_fused_plan.py`). H200, AOT cubins, 27B TP1 1 x 8192: f32w 1.480 ms, wsplit 1.415,
/// splitz 1.370, wsplit_splitz 1.306 (TP2 0.879 / 0.855 / 0.823 / 0.804 ms); split 0.531 (TP2
/// 0.417).
#[must_use]
pub fn pipeline_selected() -> PrefillPipeline {
    static CHOICE: std::sync::OnceLock<PrefillPipeline> = std::sync::OnceLock::new();
    *CHOICE.get_or_init(|| {
        match std::env::var("DELTAKIT_GDR_PREFILL")
            .unwrap_or_default()
            .to_ascii_lowercase()
            .as_str()
        {
            "f32w" => PrefillPipeline::F32W,
            "wsplit" => PrefillPipeline::Wsplit,
            "splitz" => PrefillPipeline::Splitz,
            "wsplit_splitz" => PrefillPipeline::WsplitSplitz,
            "sm90" => PrefillPipeline::Sm90State,
            "split" => PrefillPipeline::Split,
            _ => DEFAULT_PIPELINE,
        }
    })
}

/// `DELTAKIT_GDR_SPLIT_VARIANT` (read once per process; measurements only): the split pipeline's
/// kernel variant (`csrc/gdr/chunk_prefill_fused_sm90.h`: 0 = the mma.sync state kernel, 2 =
/// clock64 phase profiles, 4 = local pass only, 8 = state kernel only (4 and 8 give wrong results
/// and exist to time the two launches apart), 16 = the state kernel on wgmma, 32 = its loaders keep
/// two chunks in flight, 1 = MUFU exp for the local pass's decay factors, 64 = the local pass per
/// (chunk, key head) over that key head's value heads, 128 = the wgmma state kernel's shorter
/// chain (one N = 128 product for X and S Q^T), 256 = no bf16 lo-part products in the state
/// kernel (below the contract's precision: measurement only), 512 = the local pass overlapped
/// with the state kernel (state kernel first, the local pass as its programmatic dependent on the
/// free SMs, per-(chunk, value head) ready flags, bounded spin + fix-up launch; only where
/// `N * H_v * V / 64 <= SMs - 16` and a cost model expects a gain, else as without 512; session
/// 7: 0.367 / 3.071 ms at 27B TP2 / 9B 1 x 65536 vs 209's 0.388 / 3.223), 1024 (with 512) = force the overlap's fix-up path, 2048 (with 512 or 4096) =
/// skip the cost model, 4096 (on 209: 4305, on 721: 4817) = context parallelism for few
/// sequence-heads (three segments per sequence; pass 1 = segment 0 next to segment 1's transition
/// and zero-start end state, an f32 scan, pass 3 = segments 1 and 2; only `K = V = 128`,
/// `2 N H_v <= SMs` and a gain model, else 209 (4817: else 721); 6353 = 4305 without that model
/// (still only where the W / U regions hold its records and 4 N H_v K V f32 states, about
/// T > 256 N tokens at K = V = 128; else 209);
/// session 7), 8192 (on 209: 8401; on 721 / 2769 / 3793: 8913 / 10961 / 11985; on 152: 8344) =
/// the pair state CTA: two state warpgroups per CTA covering both 64-column halves of 128 value
/// columns (shared K / Q / image stages, two stages, setmaxnreg 232 / 40; `V % 128 == 0`, else as
/// without 8192; with 4096 only as 12497 = 4305 where its gain model says so, else 8401 where a
/// wave model says the pair's state waves cost less, else 209; session 7: tests and sanitizers
/// pass under 6353 and 8401; session 8: 19/19 tests and memcheck under 12497), 16384 (on 209:
/// 16593, on 12497: 28881; session 8) = the local pass at 4 CTAs / SM (128 registers, 53,504 B
/// shared memory; same arithmetic); 5, 17, 18, 24, 48,
/// 50, 56, 80-85, 144, 146, 152, 208-210, 408, 465, 721, 1745, 2769, 3793, 4305, 4817, 6353,
/// 8344, 8401, 8913, 10961, 11985, 12497, 16593, 28881 combine them; 32977 = 209 whose state
/// warps release stages with `bar.sync` instead of `bar.arrive` (a racecheck diagnostic, slower,
/// same results); 65745 = 209 whose state warps release stages through one mbarrier per stage
/// (arrive / parity wait) instead of the named barrier (opt-in; the form compute-sanitizer
/// racecheck orders); 94417 = 28881 with that mbarrier release in every state kernel its routes
/// take (single CTA, pair CTA, both context-parallel passes; the default in session 9 before
/// 225489); 159953 / 225489 = 28881 / 94417 with the local pass on wgmma
/// (`csrc/gdr/chunk_local_wgmma_sm90.cu`: SS-wgmma K K^T / Q K^T, 2 x 2 blocked (I + A)^-1, the
/// same stage image; 225489 the default in session 9); 487633 = 225489 + 262144 (session 10: the
/// local pass's decays below its diagonal blocks as a row times a column factor, the gating of
/// every value head on warps 2-3, Tb stored by 32-row items, the inverse's phases at <= 2
/// products per warp), 1011921 / 1536209 = 487633 + 524288 (the epilogue -> diagonal-inverse
/// hand-off by a warp barrier) / + 1048576 (the stage image copied out by TMA bulk copies),
/// 2060497 = both (session 10), 4157649 = 2060497 + 2097152 (the default from session 10's end
/// check: the state kernels' output tile stored through `stmatrix .trans`, same values); session 11
/// (opt-in, on 2060497, 4157649 or 71266513): + 4194304 (the local pass's key / query norms from
/// diag(K K^T) / diag(Q Q^T) on the tensor cores), + 8388608 (its 16 x 16 diagonal inverses by one
/// column per lane with float4 row loads), both = + 12582912; state kernel (opt-in, session 11):
/// 20934865 = 4157649 + 16777216 (the staged output tile's global stores deferred to the next
/// chunk, under its X / S Q^T product), 54489297 = 20934865 + 33554432 (and that product as two
/// groups, the second half of S split into bf16 hi / lo under the first), 71266513 = 4157649 +
/// 67108864 (the deferred store on the pair route only), 104820945 = 71266513 + 33554432 (and
/// the two X groups on the single / context-parallel routes only), same values; 83849425 =
/// 71266513 + 12582912 the default from session 11's end check to session 12's; state kernel
/// (session 12): + 134217728 (the pair state CTA's two warpgroups take turns on the tensor pipe), +
/// 536870912 (the stage image by one TMA bulk copy), both, on 71266513 or 83849425 (218067153 /
/// 620720337 / 754938065 on 83849425; 205484241 = 71266513 + 134217728; 620720337 the default
/// from session 12's end check to session 13), same values; +
/// 268435456 instead of 536870912 (352284881 / 486502609: the pair's loaders copy nothing, a
/// measurement with WRONG results); state kernel (session 13): + 1073741824 on a variant with
/// 536870912 (1694462161 = 620720337 + 1073741824, the default since session 13: the K / Q / V
/// tiles of every full 64-token chunk by tensor-map TMA, the maps encoded per call; where a map
/// cannot be encoded the same variant without the bit runs; 1828679889 = 1694462161 + 134217728:
/// and the pair state CTA's ping-pong, opt-in: H200 2026-12-02 within noise of 1694462161 at 9B
/// 8 x 8192), same values; any other
/// value fails the call with [`Error::Shape`] naming `DELTAKIT_GDR_SPLIT_VARIANT` before anything
/// is enqueued). Unset or empty: [`SPLIT_VARIANT`]. Text that is not an integer is
/// `Err(the text)`: the calls where the split pipeline runs fail with that error (a measurement
/// must never run another variant than the one it names). Where the split pipeline does not run
/// (other head dims or device, or `DELTAKIT_GDR_PREFILL` selecting another pipeline) the value is
/// ignored, with a note on stderr once per process. A measurement variant whose results are not
/// the gated delta rule's (bits 4 / 8 / 268435456: wrong output and wrong state written to the
/// slots; 256: below the contract's precision) prints a warning on stderr when it is read.
fn split_variant_override() -> &'static std::result::Result<Option<i32>, String> {
    static V: std::sync::OnceLock<std::result::Result<Option<i32>, String>> =
        std::sync::OnceLock::new();
    V.get_or_init(|| {
        let raw = std::env::var_os("DELTAKIT_GDR_SPLIT_VARIANT");
        let v = parse_split_variant(raw.as_deref().map(|s| s.to_string_lossy()).as_deref());
        if let Ok(Some(n)) = v {
            if let Some(what) = split_variant_measurement_only(n) {
                eprintln!(
                    "deltakit: {OP}: DELTAKIT_GDR_SPLIT_VARIANT={n} is a measurement variant: {what}"
                );
            }
        }
        v
    })
}

/// Why split variant `v` is for measurements only (`None`: its results are the gated delta
/// rule's within the contract's tolerance). Bits 4 / 8 run one of the two launches alone, 268435456
/// leaves the pair CTA's stages unloaded: the output and the state written back to the slots are
/// wrong. Bit 256 drops the bf16 lo-part products: below the contract's precision.
fn split_variant_measurement_only(v: i32) -> Option<&'static str> {
    if v & (4 | 8 | 268_435_456) != 0 {
        Some("its output AND the state it writes back to the slots are WRONG (timing only)")
    } else if v & 256 != 0 {
        Some("its results are below the contract's precision (no bf16 lo-part products)")
    } else {
        None
    }
}

/// `DELTAKIT_GDR_SPLIT_VARIANT`'s text: `None` / blank = no override; an integer; else
/// `Err(text)`.
fn parse_split_variant(raw: Option<&str>) -> std::result::Result<Option<i32>, String> {
    match raw.map(str::trim) {
        None | Some("") => Ok(None),
        Some(t) => t.parse().map(Some).map_err(|_| t.to_string()),
    }
}

/// The error of a `DELTAKIT_GDR_SPLIT_VARIANT` value the split pipeline does not have.
fn split_variant_error(got: impl std::fmt::Display) -> Error {
    Error::shape(
        OP,
        "DELTAKIT_GDR_SPLIT_VARIANT",
        format!(
            "unset or a variant of the split pipeline (README env table; default {SPLIT_VARIANT})"
        ),
        got,
    )
}

/// Why the split pipeline does not run for head dims `(k, v)` (its check refused the device,
/// the build or the dims).
fn split_not_run(k: usize, v: usize) -> String {
    format!(
        "the split pipeline needs K = 128, V a multiple of 64 and >= 128, a compute-capability 9.0 \
         device and an sm_90a build (K = {k}, V = {v} here: the Triton pipeline runs)"
    )
}

/// Once per process: `DELTAKIT_GDR_SPLIT_VARIANT` is set but the split pipeline does not run.
fn note_split_variant_ignored(why: &str) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        eprintln!(
            "deltakit: {OP}: DELTAKIT_GDR_SPLIT_VARIANT is set but ignored: {why} (printed once)"
        );
    });
}

/// The pipeline of [`pipeline_selected`] when `DELTAKIT_GDR_PREFILL` selects none: the fastest at
/// every measured shape (27B TP1 / TP2 1 x 8192, 9B 8 x 8192 / 1 x 65536; H200, 2026-12-01).
const DEFAULT_PIPELINE: PrefillPipeline = PrefillPipeline::Split;

/// The Triton pipeline the sm_90a pipelines fall back to where their kernels cannot run (a device
/// that is not compute capability 9.0, a build without an sm_90a image, unsupported head dims);
/// the default before 2026-12-01's session 5.
const TRITON_PIPELINE: PrefillPipeline = PrefillPipeline::WsplitSplitz;

/// The split pipeline's kernel variant unless `DELTAKIT_GDR_SPLIT_VARIANT` says otherwise:
/// 83849425 (session 11's end check) = 71266513 with the local pass's two session-11 forms (bits
/// 4194304 | 8388608 of `csrc/gdr/chunk_local_wgmma_sm90.cu`: key norms from diag(K K^T) of the
/// wgmma accumulators and query norms by ldmatrix + mma.sync; the 16 x 16 diagonal inverses by
/// one column per lane; local pass 47.6 -> 44.1 M instructions at 27B TP1). H200 2026-12-02, end
/// check (two interleaved passes, means): 0.3969 / 0.3037 / 1.5475 / 2.2707 ms vs 71266513 0.3997 /
/// 0.3052 / 1.5642 / 2.2855 at 27B TP1 / TP2 1 x 8192, 9B 8 x 8192 / 1 x 65536 (-0.7 / -0.5 / -1.1
/// / -0.6%, faster in both passes everywhere); GPU tests 20/20 under it, memcheck 0 and racecheck
/// 0 on the pair / context-parallel routing test (`docs/benchmarks/2026-12-02-end-check-s11.md`;
/// the local-pass bits alone: memcheck / racecheck 0 on five tests,
/// `docs/benchmarks/2026-12-02-gdr-local-s11.md`). 71266513 (session 11, gdr-state) = 4157649
/// with the pair state CTA's output store off its
/// chain (bit 67108864: on the pair route only, the staged O tile's 16-byte global row stores run
/// in the next chunk under its X / S Q^T wgmma group, the last chunk's after the loop; the single
/// CTA and the context-parallel passes are 4157649's kernels, where the same deferral measured
/// +3.2% at 27B TP1: their chunk tail ends in the S group, not the store). H200 2026-12-02, same
/// call (three interleaved passes): 0.3994 / 0.3057 / 1.6045 / 2.3275 ms vs 4157649 0.3997 /
/// 0.3051 / 1.6371 / 2.3265 at 27B TP1 / TP2 1 x 8192, 9B 8 x 8192 / 1 x 65536 (-2.0% at the pair
/// shape, the others the same kernels); GPU tests 20/20 under it, memcheck 0 and racecheck 0 on
/// the pair kernel (`docs/benchmarks/2026-12-02-gdr-state-s11.md`). 4157649
/// (session 10's end check) = 2060497 with the state kernels' output tile written to the staging
/// buffer by four `stmatrix .trans` instead of 32 two-byte shared stores (bit 2097152 of
/// `split_wg_kernel`, every route: single, pair, context parallel; same values). H200 2026-12-02,
/// same call: 0.3995 / 0.3046 / 1.6339 / 2.3387 ms vs 2060497 0.4092 / 0.3087 / 1.6653 / 2.4005 at
/// 27B TP1 / TP2 1 x 8192, 9B 8 x 8192 / 1 x 65536 (-2.4 / -1.3 / -0.9 / -2.6%), GPU tests 20/20,
/// memcheck 0 (`docs/benchmarks/2026-12-02-gdr-state-s10.md`); racecheck and the engine's GPU
/// tests in the end check (`docs/benchmarks/2026-12-02-end-check-s10.md`). 2060497
/// (session 10) = 225489 with the local pass's session-10 form (bits 262144 | 524288 | 1048576 of
/// `csrc/gdr/chunk_local_wgmma_sm90.cu`: the A / P decays below each warp's diagonal block as a
/// row factor times a column factor (no exp per element there), the gating of every value head on
/// warps 2-3 while they idle in the inverse, the inverse's phases at <= 2 products per warp, Tb
/// stored by 32-row items, the epilogue -> diagonal-inverse hand-off by a warp barrier, the stage
/// image copied out by TMA bulk copies; the same image up to f32 rounding of the decays). H200
/// 2026-12-02, same call: 0.409 / 0.309 / 1.642 / 2.370 ms vs 225489 0.430 / 0.321 / 1.718 /
/// 2.463 at 27B TP1 / TP2 1 x 8192, 9B 8 x 8192 / 1 x 65536 (-5.0 / -3.7 / -4.5 / -3.8%; the local
/// pass 167.1 -> 136.5 us at 27B TP1 under ncu); GPU tests 20/20 under it, memcheck 0 and
/// racecheck 0 on four chunk-prefill tests (`docs/benchmarks/2026-12-02-gdr-local-s10.md`).
/// 225489 (session 9's end check) = 94417 with the local pass on wgmma (bit 131072,
/// `csrc/gdr/chunk_local_wgmma_sm90.cu`: K K^T / Q K^T as SS-wgmma m64n64k16 once per key head,
/// (I + A)^-1 as 16 x 16 diagonal inverses and a 2 x 2 blocked form over 32 x 32 blocks; the
/// same stage image for the state kernel). H200 2026-12-02, same call: 0.428 / 0.320 / 1.752 /
/// 2.473 ms vs 94417 0.447 / 0.329 / 1.862 / 2.605 at 27B TP1 / TP2 1 x 8192, 9B 8 x 8192 / 1 x
/// 65536 (-4.1 / -2.9 / -5.8 / -5.1%); every GPU test of the library and engine (112) passed
/// under it, racecheck 0 on the long and the pair / context-parallel routing tests and on the
/// qwen-shape sweep, memcheck 0 (`docs/benchmarks/2026-12-02-end-check-s9.md`). 94417
/// (session 9) = 28881 whose state kernels release their stages through one mbarrier per stage
/// (bit 65536: the form compute-sanitizer racecheck orders; same results). H200 2026-12-02
/// (`docs/benchmarks/2026-12-02-gdr-s9.md`): 94417 0.448 / 0.331 / 1.853 / 2.616 ms vs 28881
/// 0.451 / 0.332 / 1.851 / 2.626 at the four shapes below (means of two alternated runs in one
/// call); GPU tests 20/20, memcheck
/// 0 on the whole test binary; racecheck 0 on every test it completed (16 of 18 GPU tests and
/// most of the two sweeps) where 28881 reports the named-barrier stage refill of the pair and
/// context-parallel kernels. 28881 (session 8) = per call, context parallelism (4305: three segments per sequence) where its gain
/// model says so (few sequence-heads, a unit segment of > ~26 chunks), else the pair state CTA
/// (8401: two state warpgroups per CTA) where a wave model says its state waves cost less, else
/// 209 (the local pass per (chunk, key head) with MUFU exp decays, the state kernel on wgmma with
/// the shorter chain); every path with the local pass at 4 CTAs / SM (bit 16384: same arithmetic
/// as 209's local pass). H200 2026-12-02, same call: 28881 0.448 / 0.330 / 1.838 / 2.606 ms at 27B
/// TP1 / TP2 1 x 8192, 9B 8 x 8192 / 1 x 65536 vs 209 0.475 / 0.388 / 2.109 / 3.204 (12497, the
/// same choice with 209's local pass: 0.478 / 0.347 / 1.929 / 2.696); GPU tests 19/19 and memcheck
/// clean under it; racecheck reports the stage-refill pattern of the state kernel
/// (`docs/benchmarks/2026-12-02-gdr-s8.md`) on the long-sequence test exactly as under 209.
/// 620720337 (session 12's end check) = 83849425 with the stage image (26,880 bytes per chunk and
/// value head) loaded by one `cp.async.bulk` completing on a per-stage mbarrier instead of 1,680
/// 16-byte `cp.async` (bit 536870912, every route: single, pair, context parallel; same values).
/// H200 2026-12-02, gdr-state's call 2 (two interleaved passes): 0.3928 / 0.2994 / 1.5271 /
/// 2.2813 ms vs 83849425 0.3973 / 0.3038 / 1.5763 / 2.3083 at 27B TP1 / TP2 1 x 8192, 9B 8 x 8192
/// / 1 x 65536 (-1.1 / -1.4 / -3.1 / -1.2%; pair state kernel -8.3% of its cycles under ncu), GPU
/// tests 20/20, racecheck 0 on its single, pair and context-parallel kernels
/// (`docs/benchmarks/2026-12-02-gdr-state-s12.md`); end check: 0.3912 / 0.2985 / 1.5518 / 2.3034
/// ms vs 83849425 0.3960 / 0.3032 / 1.6031 / 2.3371 (three passes, faster in each), GPU tests of
/// the library and engine 83 / 83, memcheck and racecheck 0 on every route
/// (`docs/benchmarks/2026-12-02-end-check-s12.md`).
/// 1694462161 (session 13, gdrtma) = 620720337 with the K / Q panels and V tile(s) of every full
/// 64-token chunk loaded by tensor-map TMA (`cp.async.bulk.tensor.2d`, 128-byte swizzle, 5 / 6
/// copies on the stage's mbarrier instead of 2,560 / 3,072 16-byte `cp.async`; bit 1073741824,
/// every route; the ragged last chunk keeps `cp.async`; the maps encoded per call, else the same
/// variant without the bit; same values). H200 2026-12-02, one call, A B A B: 0.3800 / 0.2865 /
/// 1.4456 / 2.1284 ms vs 620720337 0.3947 / 0.3008 / 1.4912 / 2.2630 at 27B TP1 / TP2 1 x 8192,
/// 9B 8 x 8192 / 1 x 65536 (-3.7 / -4.8 / -3.1 / -5.9%, faster in both passes; state kernel -3.5%
/// single, -6.4% pair under ncu), GPU tests 20/20 under it, memcheck and racecheck 0 on its
/// single, pair and context-parallel kernels (`docs/benchmarks/2026-12-02-gdr-state-s13.md`).
const SPLIT_VARIANT: i32 = 1_694_462_161;

/// Whether [`chunk_prefill`] stores W as bf16 hi / lo planes for `K = V = 128`
/// ([`pipeline_selected`] is [`PrefillPipeline::Wsplit`], [`PrefillPipeline::WsplitSplitz`] or
/// [`PrefillPipeline::Sm90State`]). `false` for [`PrefillPipeline::Split`], although where its
/// kernels cannot run the fallback ([`PrefillPipeline::WsplitSplitz`]) stores planes (in the
/// same workspace bytes as f32 W).
#[must_use]
pub fn wsplit_selected() -> bool {
    matches!(
        pipeline_selected(),
        PrefillPipeline::Wsplit | PrefillPipeline::WsplitSplitz | PrefillPipeline::Sm90State
    )
}

/// `DkGdrStateSm90Params` of `csrc/gdr/chunk_prefill_sm90.h` (declared here, not through bindgen:
/// the kernel is opt-in and its header is not part of `deltakit.h` yet).
#[repr(C)]
struct StateSm90Params {
    k: u64,
    w: u64,
    u: u64,
    gcum: u64,
    h: u64,
    state: u64,
    cu_seqlens: u64,
    slots: u64,
    init: u64,
    coff: u64,
    num_tokens: i64,
    num_seqs: i64,
    num_slots: i64,
    h_k: i64,
    h_v: i64,
    k_dim: i64,
    v_dim: i64,
    k_stride: i64,
    use_l2: i32,
    init_mode: i32,
}

/// `DkGdrPrefillFusedParams` of `csrc/gdr/chunk_prefill_fused_sm90.h` (declared here, not through
/// bindgen: its header is not part of `deltakit.h`): the split pipeline's arguments (the name is
/// that of the removed one-kernel `fused` pipeline).
#[repr(C)]
struct PrefillFusedParams {
    q: u64,
    k: u64,
    v: u64,
    g: u64,
    beta: u64,
    a: u64,
    b: u64,
    a_log: u64,
    dt_bias: u64,
    cu_seqlens: u64,
    slots: u64,
    init: u64,
    state: u64,
    out: u64,
    num_tokens: i64,
    num_seqs: i64,
    num_slots: i64,
    h_k: i64,
    h_v: i64,
    k_dim: i64,
    v_dim: i64,
    q_stride: i64,
    k_stride: i64,
    v_stride: i64,
    ab_stride: i64,
    use_l2: i32,
    init_mode: i32,
    fused: i32,
    scale: f32,
    variant: i32,
}

/// `DkGdrPrefillSplitWs` of `csrc/gdr/chunk_prefill_fused_sm90.h`: the split pipeline's workspace
/// regions (chunk offsets, chunk map, stage images), the chunk capacity, the overlap variant's
/// flags (i32 `[nt * H_v + N * H_v * V / 64]`, zeroed by the call) and the context-parallel
/// variant's scratch (`cp_bytes` bytes: segment records and f32 `[N, 4, H_v, K, V]` state blocks;
/// the W / U regions, which the split pipeline does not use otherwise).
#[repr(C)]
struct PrefillSplitWs {
    coff: u64,
    cseq: u64,
    img: u64,
    nt: i64,
    flags: u64,
    cp: u64,
    cp_bytes: i64,
}

extern "C" {
    /// `csrc/gdr/chunk_prefill_fused_sm90.cu`: every check of [`dk_gdr_chunk_prefill_split_sm90`]
    /// without launching (`DK_ERR_UNSUPPORTED` off sm_90 or for `K != 128`, `V % 64 != 0`,
    /// `V < 128`; `DK_ERR_NO_KERNEL_IMAGE` without an sm_90a image).
    fn dk_gdr_chunk_prefill_split_sm90_check(p: *const PrefillFusedParams) -> ffi::dk_status;
    /// `csrc/gdr/chunk_prefill_fused_sm90.cu`: the split pipeline's local pass and state kernel.
    fn dk_gdr_chunk_prefill_split_sm90(
        p: *const PrefillFusedParams,
        ws: *const PrefillSplitWs,
        stream: ffi::dk_stream_t,
    ) -> ffi::dk_status;
    /// `csrc/gdr/chunk_prefill_sm90.cu`: the state pass for sm_90a (`K = V = 128`, W planes).
    fn dk_gdr_chunk_state_sm90(
        p: *const StateSm90Params,
        stream: ffi::dk_stream_t,
    ) -> ffi::dk_status;
    /// Every check [`dk_gdr_chunk_state_sm90`] makes before it enqueues, without launching
    /// (`DK_ERR_UNSUPPORTED` off compute capability 9.0, `DK_ERR_NO_KERNEL_IMAGE` without an
    /// sm_90a image in the build).
    fn dk_gdr_chunk_state_sm90_check(p: *const StateSm90Params) -> ffi::dk_status;
}

struct Kernels {
    kkt: KktFn,
    /// `(128, 128)` only.
    wsplit: Option<WsplitKernels>,
    wu: WuFn,
    state: StateFn,
    out: OutFn,
    /// Value columns per program of `out` (manifest `BV`): [`OUT_BV_WIDE`] for `(128, 128)`,
    /// [`OUT_BV`] otherwise.
    out_bv: usize,
}

/// The compiled (K, V) specializations (triton_aot/manifest.toml): `K` in {16, 32, 64, 128} x `V`
/// in {16, 32, 64, 128} ([`super::SUPPORTED_K`] x [`super::SUPPORTED_V`]). The state / output
/// entries are compiled with [`STATE_BV`] / [`OUT_BV`] value columns per program; dims below 64
/// use padded, masked tiles (`BK = max(K, 64)`).
fn kernels(k: usize, v: usize) -> Option<Kernels> {
    let kkt: KktFn = match k {
        128 => ffi::dk_triton_gdr_chunk_kkt_k128,
        64 => ffi::dk_triton_gdr_chunk_kkt_k64,
        32 => ffi::dk_triton_gdr_chunk_kkt_k32,
        16 => ffi::dk_triton_gdr_chunk_kkt_k16,
        _ => return None,
    };
    let wsplit = ((k, v) == (128, 128)).then_some(WsplitKernels {
        wu: ffi::dk_triton_gdr_chunk_wu_k128v128_ws,
        wu_splitz: ffi::dk_triton_gdr_chunk_wu_k128v128_ws_splitz,
        wu_f32_splitz: ffi::dk_triton_gdr_chunk_wu_k128v128_splitz,
        state_bv32: ffi::dk_triton_gdr_chunk_state_k128v128_ws_bv32,
        state_bv16: ffi::dk_triton_gdr_chunk_state_k128v128_ws_bv16,
    });
    let (wu, state, out): (WuFn, StateFn, OutFn) = match (k, v) {
        (128, 128) => (
            ffi::dk_triton_gdr_chunk_wu_k128v128,
            ffi::dk_triton_gdr_chunk_state_k128v128,
            ffi::dk_triton_gdr_chunk_out_k128v128,
        ),
        (64, 64) => (
            ffi::dk_triton_gdr_chunk_wu_k64v64,
            ffi::dk_triton_gdr_chunk_state_k64v64,
            ffi::dk_triton_gdr_chunk_out_k64v64,
        ),
        (64, 128) => (
            ffi::dk_triton_gdr_chunk_wu_k64v128,
            ffi::dk_triton_gdr_chunk_state_k64v128,
            ffi::dk_triton_gdr_chunk_out_k64v128,
        ),
        (128, 64) => (
            ffi::dk_triton_gdr_chunk_wu_k128v64,
            ffi::dk_triton_gdr_chunk_state_k128v64,
            ffi::dk_triton_gdr_chunk_out_k128v64,
        ),
        // Small head dims (tiny test models): untuned entries.
        (32, 16) => (
            ffi::dk_triton_gdr_chunk_wu_k32v16,
            ffi::dk_triton_gdr_chunk_state_k32v16,
            ffi::dk_triton_gdr_chunk_out_k32v16,
        ),
        (32, 32) => (
            ffi::dk_triton_gdr_chunk_wu_k32v32,
            ffi::dk_triton_gdr_chunk_state_k32v32,
            ffi::dk_triton_gdr_chunk_out_k32v32,
        ),
        (32, 64) => (
            ffi::dk_triton_gdr_chunk_wu_k32v64,
            ffi::dk_triton_gdr_chunk_state_k32v64,
            ffi::dk_triton_gdr_chunk_out_k32v64,
        ),
        (32, 128) => (
            ffi::dk_triton_gdr_chunk_wu_k32v128,
            ffi::dk_triton_gdr_chunk_state_k32v128,
            ffi::dk_triton_gdr_chunk_out_k32v128,
        ),
        (64, 16) => (
            ffi::dk_triton_gdr_chunk_wu_k64v16,
            ffi::dk_triton_gdr_chunk_state_k64v16,
            ffi::dk_triton_gdr_chunk_out_k64v16,
        ),
        (64, 32) => (
            ffi::dk_triton_gdr_chunk_wu_k64v32,
            ffi::dk_triton_gdr_chunk_state_k64v32,
            ffi::dk_triton_gdr_chunk_out_k64v32,
        ),
        (128, 16) => (
            ffi::dk_triton_gdr_chunk_wu_k128v16,
            ffi::dk_triton_gdr_chunk_state_k128v16,
            ffi::dk_triton_gdr_chunk_out_k128v16,
        ),
        (128, 32) => (
            ffi::dk_triton_gdr_chunk_wu_k128v32,
            ffi::dk_triton_gdr_chunk_state_k128v32,
            ffi::dk_triton_gdr_chunk_out_k128v32,
        ),
        (16, 16) => (
            ffi::dk_triton_gdr_chunk_wu_k16v16,
            ffi::dk_triton_gdr_chunk_state_k16v16,
            ffi::dk_triton_gdr_chunk_out_k16v16,
        ),
        (16, 32) => (
            ffi::dk_triton_gdr_chunk_wu_k16v32,
            ffi::dk_triton_gdr_chunk_state_k16v32,
            ffi::dk_triton_gdr_chunk_out_k16v32,
        ),
        (16, 64) => (
            ffi::dk_triton_gdr_chunk_wu_k16v64,
            ffi::dk_triton_gdr_chunk_state_k16v64,
            ffi::dk_triton_gdr_chunk_out_k16v64,
        ),
        (16, 128) => (
            ffi::dk_triton_gdr_chunk_wu_k16v128,
            ffi::dk_triton_gdr_chunk_state_k16v128,
            ffi::dk_triton_gdr_chunk_out_k16v128,
        ),
        _ => return None,
    };
    let out_bv = if (k, v) == (128, 128) { OUT_BV_WIDE } else { OUT_BV };
    Some(Kernels { kkt, wsplit, wu, state, out, out_bv })
}

fn grid(arg: &'static str, n: usize) -> Result<u32> {
    u32::try_from(n).map_err(|_| Error::shape(OP, arg, "a grid size <= u32::MAX", n))
}

fn i32_of(arg: &'static str, n: usize) -> Result<i32> {
    i32::try_from(n).map_err(|_| Error::shape(OP, arg, "a size that fits in i32", n))
}

/// Host-side facts the caller may have about the device arrays (the engine fills its static
/// device buffers from host copies). When given, they are checked here before anything is
/// launched; the kernels never need them.
#[derive(Clone, Copy, Debug, Default)]
pub struct HostCopies<'a> {
    /// Host copy of `cu_seqlens` (checked: starts at 0, non-decreasing, ends at `T`).
    pub cu_seqlens: Option<&'a [i32]>,
    /// Host copy of `slots` (checked: each -1 or in `0..num_slots`, live slots distinct).
    pub slots: Option<&'a [i32]>,
}

/// Chunkwise gated delta rule prefill over a varlen batch (Triton AOT).
///
/// Mirrors HF `torch_chunk_gated_delta_rule` / FLA `chunk_gated_delta_rule` with `cu_seqlens`
/// (chunks of 64 restart at every sequence start) and equals the token recurrence
/// (`deltakit_ref::gdr::recurrent_prefill`): per token and value head `hv` (key head
/// `hv / (H_v/H_k)`), f32 state `S [K, V]`,
/// `S *= exp(g); delta = beta * (v - S^T k); S += k (x) delta; o = S^T q`, with q/k
/// L2-normalised (`x * rsqrt(sum x^2 + 1e-6)`, f32) if `opts.use_qk_l2norm` and q scaled by
/// `opts.scale` (default `K^-0.5`). Gating per [`Gating`]. At the edge of f32, `g = -inf`
/// (`exp(A_log)` overflowing; precomputed or fused) is a full decay as in the recurrence
/// (`exp(-inf) = 0`), alone or mixed with ordinary gates in a chunk; the kernels clamp every gate
/// at `-64` (so `g = NaN`, `-inf * 0` from an underflowed softplus, is a full decay too) and flush
/// decay factors `<= e^-63` to 0, keeping the chunk-local cumulative sums finite.
///
/// Shapes: `T = out.len() / (H_v V)` tokens, `N = inputs.slots.len()` sequences; inputs per
/// [`ChunkPrefillInputs`]; `state` f32 `[num_slots, H_v, K, V]` (V contiguous): each live
/// sequence reads its initial state from its slot (per [`InitialState`]) and writes its final
/// state there; `out` bf16 `[T, H_v, V]` contiguous; `workspace` at least
/// [`workspace_bytes`]`(dims, T, N)` bytes, 256-byte aligned (its contents on entry don't matter).
/// `K` in {16, 32, 64, 128}, `V` in {16, 32, 64, 128} (any combination; `K, V` in {64, 128} are the
/// tuned specializations, the smaller dims serve the tiny test models), `H_v % H_k == 0`. `q`,
/// `k`, `v`, `state`, `out` 16-byte aligned.
///
/// Slots: `-1` = padding sequence (its output rows are zeros, the pool is untouched). The
/// kernels treat any slot outside `0..num_slots` the same way and clamp `cu_seqlens` to `[0, T]`,
/// so bad device values never index outside the buffers (their results are unspecified). Two
/// live sequences sharing a slot is a caller error (a race on that slot); pass
/// [`HostCopies`] to have slots and `cu_seqlens` checked here.
///
/// # Errors
/// [`Error::Shape`] for any length, stride, alignment or workspace-size mismatch, bad host
/// copies, a non-finite `opts.scale`, or a `DELTAKIT_GDR_SPLIT_VARIANT` that is not a variant of
/// the split pipeline (when that pipeline runs); [`Error::Unsupported`] for head dims outside `K` in {16, 32, 64, 128}, `V` in
/// {16, 32, 64, 128}; [`Error::DeviceMismatch`];
/// [`Error::Launch`] / [`Error::Driver`]. Nothing is enqueued on a validation error.
#[allow(clippy::too_many_arguments, clippy::too_many_lines)]
pub fn chunk_prefill(
    stream: &CudaStream,
    dims: GdrDims,
    opts: GdrOptions,
    strides: ChunkPrefillStrides,
    inputs: &ChunkPrefillInputs<'_>,
    host: HostCopies<'_>,
    state: &mut impl DevicePtrMut<f32>,
    out: &mut impl DevicePtrMut<bf16>,
    workspace: &mut impl DevicePtrMut<u8>,
) -> Result<()> {
    let GdrDims { h_k, h_v, k: kd, v: vd } = dims;
    if h_k == 0 || h_v == 0 || kd == 0 || vd == 0 {
        return Err(Error::shape(OP, "dims", "non-zero h_k, h_v, k, v", format!("{dims:?}")));
    }
    if h_v % h_k != 0 {
        return Err(Error::shape(OP, "dims", format!("h_v a multiple of h_k = {h_k}"), h_v));
    }
    if h_v > 65_535 {
        return Err(Error::shape(OP, "dims", "h_v <= 65535 (grid y)", h_v));
    }
    let Some(kern) = kernels(kd, vd) else {
        return Err(super::unsupported_head_dims(OP, kd, vd));
    };
    let row_v = h_v * vd;
    if out.len() % row_v != 0 {
        return Err(Error::shape(OP, "out", format!("a multiple of H_v*V = {row_v}"), out.len()));
    }
    let t = out.len() / row_v;
    let n = inputs.slots.len();
    validate::len(OP, "cu_seqlens", inputs.cu_seqlens.len(), n + 1)?;
    let qs = validate::strided_len(OP, "q", inputs.q.len(), t, h_k * kd, strides.q)?;
    let ks = validate::strided_len(OP, "k", inputs.k.len(), t, h_k * kd, strides.k)?;
    let vs = validate::strided_len(OP, "v", inputs.v.len(), t, h_v * vd, strides.v)?;
    for (arg, s) in [("q", qs), ("k", ks), ("v", vs)] {
        if s % 16 != 0 {
            return Err(Error::shape(OP, arg, "a token stride that is a multiple of 16", s));
        }
    }
    let mut abs = h_v;
    match &inputs.gating {
        Gating::Precomputed { g, beta } => {
            validate::len(OP, "g", g.len(), t * h_v)?;
            validate::len(OP, "beta", beta.len(), t * h_v)?;
        }
        Gating::Fused { a, b, a_log, dt_bias } => {
            abs = validate::strided_len(OP, "a", a.len(), t, h_v, strides.ab)?;
            validate::strided_len(OP, "b", b.len(), t, h_v, strides.ab)?;
            validate::len(OP, "a_log", a_log.len(), h_v)?;
            validate::len(OP, "dt_bias", dt_bias.len(), h_v)?;
        }
    }
    if let InitialState::PerSequence(f) = &inputs.initial_state {
        validate::len(OP, "initial_state", f.len(), n)?;
    }
    let per_slot = dims.state_per_slot();
    if state.len() % per_slot != 0 || (n > 0 && state.len() == 0) {
        return Err(Error::shape(
            OP,
            "state",
            format!("a non-empty multiple of H_v*K*V = {per_slot}"),
            state.len(),
        ));
    }
    let num_slots = state.len() / per_slot;
    let lay = layout(dims, t, n)
        .ok_or_else(|| Error::shape(OP, "workspace", "a size that fits in usize", "overflow"))?;
    if workspace.len() < lay.total {
        return Err(Error::shape(
            OP,
            "workspace",
            format!("len >= {} (workspace_bytes)", lay.total),
            workspace.len(),
        ));
    }
    if let Some(cu) = host.cu_seqlens {
        validate::len(OP, "cu_seqlens_host", cu.len(), n + 1)?;
        let bad = cu.first() != Some(&0)
            || cu.last().copied() != i32::try_from(t).ok()
            || cu.windows(2).any(|w| w[1] < w[0]);
        if bad {
            return Err(Error::shape(
                OP,
                "cu_seqlens",
                format!("0, non-decreasing, last = T = {t}"),
                format!("{cu:?}"),
            ));
        }
    }
    if let Some(s) = host.slots {
        validate::slots_host(OP, s, n, num_slots)?;
    }
    let scale = super::q_scale(OP, opts, kd)?;
    let grid_nt = grid("out", lay.nt)?;
    let grid_n = grid("slots", n)?;
    let grid_map = grid("out", lay.nt.div_ceil(MAP_BLOCK))?;
    let search_iters = i32::try_from(usize::BITS - n.leading_zeros()).unwrap_or(64).max(1);

    same_context(OP, "q", stream, &inputs.q)?;
    same_context(OP, "k", stream, &inputs.k)?;
    same_context(OP, "v", stream, &inputs.v)?;
    same_context(OP, "cu_seqlens", stream, &inputs.cu_seqlens)?;
    same_context(OP, "slots", stream, &inputs.slots)?;
    match &inputs.gating {
        Gating::Precomputed { g, beta } => {
            same_context(OP, "g", stream, g)?;
            same_context(OP, "beta", stream, beta)?;
        }
        Gating::Fused { a, b, a_log, dt_bias } => {
            same_context(OP, "a", stream, a)?;
            same_context(OP, "b", stream, b)?;
            same_context(OP, "a_log", stream, a_log)?;
            same_context(OP, "dt_bias", stream, dt_bias)?;
        }
    }
    if let InitialState::PerSequence(f) = &inputs.initial_state {
        same_context(OP, "initial_state", stream, f)?;
    }
    same_context(OP, "state", stream, state)?;
    same_context(OP, "out", stream, out)?;
    same_context(OP, "workspace", stream, workspace)?;
    if n == 0 {
        return Ok(());
    }
    bind(stream)?;
    let (qp, _g1) = inputs.q.device_ptr(stream);
    let (kp, _g2) = inputs.k.device_ptr(stream);
    let (vp, _g3) = inputs.v.device_ptr(stream);
    let (cup, _g4) = inputs.cu_seqlens.device_ptr(stream);
    let (slp, _g5) = inputs.slots.device_ptr(stream);
    let (stp, _g6) = state.device_ptr_mut(stream);
    let (op, _g7) = out.device_ptr_mut(stream);
    let (wsp, _g8) = workspace.device_ptr_mut(stream);
    // Gating pointers: the unused pair are never read by the kernel; any valid address will do.
    let (fused, gp, bp, ap, bbp, alp, dtp, _gg) = match &inputs.gating {
        Gating::Precomputed { g, beta } => {
            let (gp, g1) = g.device_ptr(stream);
            let (bp, g2) = beta.device_ptr(stream);
            (0, gp, bp, vp, vp, gp, gp, [Some(g1), Some(g2), None, None])
        }
        Gating::Fused { a, b, a_log, dt_bias } => {
            let (ap, g1) = a.device_ptr(stream);
            let (bbp, g2) = b.device_ptr(stream);
            let (alp, g3) = a_log.device_ptr(stream);
            let (dtp, g4) = dt_bias.device_ptr(stream);
            (1, alp, alp, ap, bbp, alp, dtp, [Some(g1), Some(g2), Some(g3), Some(g4)])
        }
    };
    let (init_mode, initp, _gi) = match &inputs.initial_state {
        InitialState::Zeros => (0, slp, None),
        InitialState::FromSlots => (1, slp, None),
        InitialState::PerSequence(f) => {
            let (p, g) = f.device_ptr(stream);
            (2, p, Some(g))
        }
    };
    for (arg, p) in [("q", qp), ("k", kp), ("v", vp), ("state", stp), ("out", op)] {
        validate::aligned(OP, arg, p, 16)?;
    }
    validate::aligned(OP, "workspace", wsp, WS_ALIGN as u64)?;
    let ws = |off: usize| wsp + off as u64;
    let (coff, cseq, gcum, betaw) = (ws(lay.coff), ws(lay.cseq), ws(lay.gcum), ws(lay.beta));
    let (tm, w, u, h) = (ws(lay.a), ws(lay.w), ws(lay.u), ws(lay.h));
    let s = raw_stream(stream);
    let (t64, n64, nt64) = (t as i64, n as i64, lay.nt as i64);
    let (hk32, hv32) = (i32_of("dims", h_k)?, i32_of("dims", h_v)?);
    let (qs64, ks64, vs64, abs64) = (qs as i64, ks as i64, vs as i64, abs as i64);
    let l2 = i32::from(opts.use_qk_l2norm);
    let ns64 = validate::i64_of(OP, "state", num_slots)?;
    let mut pipe = pipeline_selected();
    let fused_prm = |variant: i32| PrefillFusedParams {
        q: qp,
        k: kp,
        v: vp,
        g: gp,
        beta: bp,
        a: ap,
        b: bbp,
        a_log: alp,
        dt_bias: dtp,
        cu_seqlens: cup,
        slots: slp,
        init: initp,
        state: stp,
        out: op,
        num_tokens: t64,
        num_seqs: n64,
        num_slots: ns64,
        h_k: h_k as i64,
        h_v: h_v as i64,
        k_dim: kd as i64,
        v_dim: vd as i64,
        q_stride: qs64,
        k_stride: ks64,
        v_stride: vs64,
        ab_stride: abs64,
        use_l2: l2,
        init_mode,
        fused,
        scale,
        variant,
    };
    let over = split_variant_override();
    if pipe != PrefillPipeline::Split && !matches!(over, Ok(None)) {
        note_split_variant_ignored("DELTAKIT_GDR_PREFILL selects another pipeline");
    }
    if pipe == PrefillPipeline::Split {
        // Text that is not an integer is an error only where the split pipeline runs: the
        // default's check decides, as for an unknown number below.
        let (over, garbage) = match over {
            Ok(v) => (*v, None),
            Err(t) => (None, Some(t)),
        };
        let prm = fused_prm(over.unwrap_or(SPLIT_VARIANT));
        // SAFETY: a host-side check of the parameters and the device (no launch).
        match unsafe { dk_gdr_chunk_prefill_split_sm90_check(&raw const prm) } {
            ffi::dk_status::DK_ERR_UNSUPPORTED | ffi::dk_status::DK_ERR_NO_KERNEL_IMAGE => {
                if over.is_some() || garbage.is_some() {
                    note_split_variant_ignored(&split_not_run(kd, vd));
                }
                pipe = TRITON_PIPELINE;
            }
            ffi::dk_status::DK_ERR_INVALID_ARGUMENT if over.is_some_and(|v| v != SPLIT_VARIANT) => {
                // The check refuses an unknown variant before the other arguments and the
                // device: the default's check tells which one is at fault.
                let dflt = fused_prm(SPLIT_VARIANT);
                // SAFETY: as above.
                match unsafe { dk_gdr_chunk_prefill_split_sm90_check(&raw const dflt) } {
                    // Another argument: the same failure as without the override.
                    st @ ffi::dk_status::DK_ERR_INVALID_ARGUMENT => check(OP, st)?,
                    // The split pipeline would not run here anyway: ignored, as above.
                    ffi::dk_status::DK_ERR_UNSUPPORTED | ffi::dk_status::DK_ERR_NO_KERNEL_IMAGE => {
                        note_split_variant_ignored(&split_not_run(kd, vd));
                        pipe = TRITON_PIPELINE;
                    }
                    _ => return Err(split_variant_error(over.unwrap_or(SPLIT_VARIANT))),
                }
            }
            st => {
                check(OP, st)?;
                if let Some(t) = garbage {
                    return Err(split_variant_error(format!("{t:?}")));
                }
                // The stage images live in the per-chunk-state region h (lay.nt x H_v x K x V
                // bf16 >= 26,880 bytes per chunk and head for K = 128, V >= 128: checked above).
                // The context-parallel variant (bit 4096) keeps its segment records and state
                // blocks in the W / U regions (contiguous, unused by this pipeline otherwise).
                let sws = PrefillSplitWs {
                    coff,
                    cseq,
                    img: h,
                    nt: nt64,
                    flags: ws(lay.flags),
                    cp: w,
                    cp_bytes: i64::try_from(lay.h - lay.w).unwrap_or(i64::MAX),
                };
                // SAFETY: as for the launches below (pointers live in the stream's context,
                // lengths, strides and the workspace layout checked above); the local pass bounds
                // chunk ids by nt and the state kernel clamps image indices to nt - 1.
                unsafe {
                    check(
                        OP,
                        ffi::dk_triton_gdr_chunk_offsets(s, 1, 1, 1, cup, coff, n64, t64, nt64),
                    )?;
                    check(
                        OP,
                        ffi::dk_triton_gdr_chunk_map(
                            s,
                            grid_map,
                            1,
                            1,
                            coff,
                            cseq,
                            n64,
                            nt64,
                            search_iters,
                        ),
                    )?;
                    return check(
                        OP,
                        dk_gdr_chunk_prefill_split_sm90(&raw const prm, &raw const sws, s),
                    );
                }
            }
        }
    }
    // The sm_90a state pass runs after the W/U pass: every check of its launcher is made here,
    // before anything is enqueued, so that a device or build without it (DK_ERR_UNSUPPORTED /
    // DK_ERR_NO_KERNEL_IMAGE) runs the default pipeline and any other refusal fails the call with
    // nothing enqueued.
    let sm90_prm =
        (kern.wsplit.is_some() && pipe == PrefillPipeline::Sm90State).then_some(StateSm90Params {
            k: kp,
            w,
            u,
            gcum,
            h,
            state: stp,
            cu_seqlens: cup,
            slots: slp,
            init: initp,
            coff,
            num_tokens: t64,
            num_seqs: n64,
            num_slots: ns64,
            h_k: h_k as i64,
            h_v: h_v as i64,
            k_dim: kd as i64,
            v_dim: vd as i64,
            k_stride: ks64,
            use_l2: l2,
            init_mode,
        });
    if let Some(prm) = &sm90_prm {
        // SAFETY: a host-side check of the parameters and the device (no launch, no pointer
        // dereferenced).
        match unsafe { dk_gdr_chunk_state_sm90_check(prm) } {
            ffi::dk_status::DK_ERR_UNSUPPORTED | ffi::dk_status::DK_ERR_NO_KERNEL_IMAGE => {
                pipe = TRITON_PIPELINE;
            }
            st => check(OP, st)?,
        }
    }
    // SAFETY (all launches): every pointer is a live device allocation in the stream's context
    // (checked above), sized for the shapes passed (lengths and the workspace layout checked
    // above) and borrowed until the launches are enqueued. The kernels clamp cu_seqlens to
    // [0, T], treat slots outside 0..num_slots as padding and bound chunk ids by the workspace's
    // chunk capacity, so no device value can make them index outside these buffers.
    unsafe {
        check(OP, ffi::dk_triton_gdr_chunk_offsets(s, 1, 1, 1, cup, coff, n64, t64, nt64))?;
        check(
            OP,
            ffi::dk_triton_gdr_chunk_map(s, grid_map, 1, 1, coff, cseq, n64, nt64, search_iters),
        )?;
        check(
            OP,
            (kern.kkt)(
                s, grid_nt, h_v as u32, 1, kp, gp, bp, ap, bbp, alp, dtp, cup, slp, coff, cseq,
                gcum, betaw, tm, t64, ns64, hk32, hv32, ks64, abs64, l2, fused,
            ),
        )?;
        check(
            OP,
            ffi::dk_triton_gdr_chunk_solve(
                s, grid_nt, h_v as u32, 1, tm, cup, slp, coff, cseq, t64, ns64, hv32,
            ),
        )?;
        // K = V = 128 pipelines (pipeline_selected): W planes (the w region holds bf16
        // [T, H_v, 2, K], same bytes) and / or the W/U pass over grid z (z = 0: W, z = 1: U).
        let narrow = n.saturating_mul(h_v) <= STATE_NARROW_MAX_ROWS;
        let (wu, wu_z, state_fn, state_bv) = match (kern.wsplit, pipe) {
            (
                Some(ws),
                PrefillPipeline::Wsplit
                | PrefillPipeline::WsplitSplitz
                | PrefillPipeline::Sm90State,
            ) => {
                let (wu, z) =
                    if pipe == PrefillPipeline::Wsplit { (ws.wu, 1) } else { (ws.wu_splitz, 2) };
                if narrow {
                    (wu, z, ws.state_bv16, STATE_BV_NARROW)
                } else {
                    (wu, z, ws.state_bv32, STATE_BV)
                }
            }
            (Some(ws), PrefillPipeline::Splitz) => (ws.wu_f32_splitz, 2, kern.state, STATE_BV),
            _ => (kern.wu, 1, kern.state, STATE_BV),
        };
        check(
            OP,
            wu(
                s, grid_nt, h_v as u32, wu_z, kp, vp, betaw, gcum, tm, w, u, cup, slp, coff, cseq,
                t64, ns64, hk32, hv32, ks64, vs64, l2,
            ),
        )?;
        if let (Some(prm), PrefillPipeline::Sm90State) = (&sm90_prm, pipe) {
            check(OP, dk_gdr_chunk_state_sm90(prm, s))?;
        } else {
            check(
                OP,
                state_fn(
                    s,
                    grid_n,
                    h_v as u32,
                    vd.div_ceil(state_bv) as u32,
                    kp,
                    w,
                    u,
                    gcum,
                    h,
                    stp,
                    cup,
                    slp,
                    initp,
                    coff,
                    t64,
                    ns64,
                    hk32,
                    hv32,
                    ks64,
                    l2,
                    init_mode,
                ),
            )?;
        }
        check(
            OP,
            (kern.out)(
                s,
                grid_nt,
                h_v as u32,
                vd.div_ceil(kern.out_bv) as u32,
                qp,
                kp,
                u,
                gcum,
                h,
                op,
                cup,
                slp,
                coff,
                cseq,
                t64,
                ns64,
                hk32,
                hv32,
                qs64,
                ks64,
                l2,
                scale,
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::super::{head_dims_supported, SUPPORTED_K, SUPPORTED_V};
    use super::{
        kernels, parse_split_variant, split_variant_error, split_variant_measurement_only,
        SPLIT_VARIANT,
    };
    use crate::Error;

    /// Measurement-only split variants are flagged (session-12 review: 352284881 wrote garbage
    /// into the state pool without a word), the defaults of every session and the documented
    /// opt-in forms are not.
    #[test]
    fn measurement_only_split_variants_are_flagged() {
        for v in [4, 5, 8, 24, 408, 8344, 352_284_881, 486_502_609] {
            assert!(split_variant_measurement_only(v).unwrap().contains("WRONG"), "{v}");
        }
        for v in [465, 272] {
            assert!(split_variant_measurement_only(v).unwrap().contains("precision"), "{v}");
        }
        for v in [
            209,
            721,
            6353,
            8401,
            28_881,
            94_417,
            225_489,
            2_060_497,
            4_157_649,
            71_266_513,
            83_849_425,
            205_484_241,
            218_067_153,
            620_720_337,
            754_938_065,
            1_694_462_161,
            SPLIT_VARIANT,
        ] {
            assert_eq!(split_variant_measurement_only(v), None, "{v}");
        }
    }

    /// `DELTAKIT_GDR_SPLIT_VARIANT` (session-11 review: garbage text silently ran the default,
    /// an unknown number failed with an untyped launch status): unset / blank = no override,
    /// integers parse, anything else is kept as text for the typed error, which names the
    /// variable.
    #[test]
    fn split_variant_text_is_parsed_strictly() {
        assert_eq!(parse_split_variant(None), Ok(None));
        assert_eq!(parse_split_variant(Some("  ")), Ok(None));
        assert_eq!(parse_split_variant(Some(" 209\n")), Ok(Some(209)));
        assert_eq!(parse_split_variant(Some("-1")), Ok(Some(-1)));
        for bad in ["fast", "0x10", "209a", "4_157_649", "99999999999"] {
            assert_eq!(parse_split_variant(Some(bad)), Err(bad.to_string()), "{bad}");
        }
        let e = split_variant_error("\"fast\"");
        assert!(
            matches!(&e, Error::Shape { arg: "DELTAKIT_GDR_SPLIT_VARIANT", got, .. } if got == "\"fast\""),
            "{e}"
        );
        assert!(e.to_string().contains(&SPLIT_VARIANT.to_string()), "{e}");
    }

    /// The compiled specializations are exactly the head dims [`head_dims_supported`] promises
    /// (the engine checks that predicate before loading a model).
    #[test]
    fn compiled_specializations_match_the_supported_set() {
        for k in [16, 32, 48, 64, 96, 128, 256] {
            for v in [8, 16, 32, 48, 64, 96, 128, 256] {
                assert_eq!(kernels(k, v).is_some(), head_dims_supported(k, v), "K={k} V={v}");
            }
        }
        assert!(SUPPORTED_K.iter().all(|&k| SUPPORTED_V.iter().all(|&v| kernels(k, v).is_some())));
    }

    /// The opt-in W-split entries exist for `K = V = 128` only (every other pair keeps f32 W).
    #[test]
    fn wsplit_entries_only_for_128x128() {
        for k in SUPPORTED_K {
            for v in SUPPORTED_V {
                let has = kernels(k, v).is_some_and(|kk| kk.wsplit.is_some());
                assert_eq!(has, (k, v) == (128, 128), "K={k} V={v}");
            }
        }
    }
}
