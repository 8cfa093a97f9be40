//! `gdr.decode` (CUDA C++, `csrc/gdr/decode.cu`): recurrent gated-delta-rule decode with fused
//! gating, q/k L2 norm and q scale, updating the f32 state pool in place.
//! CPU twin: `deltakit_ref::gdr::{gating, decode, recurrent_prefill}`.

use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut};
use half::bf16;

use super::{GdrDims, GdrOptions};
use crate::error::{Error, Result};
use crate::ffi;
use crate::launch::{bind, check, raw_stream, same_context};
use crate::ops::validate;

const OP: &str = "gdr.decode";

/// Token (row) strides, in elements, of the decode inputs; `None` = contiguous.
///
/// Lets `q`, `k`, `v` be column views of one packed buffer (e.g. the conv1d output
/// `[T, 2*H_k*K + H_v*V]`) without a copy. `q`/`k`/`v` strides must be multiples of 8 elements.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecodeStrides {
    /// Stride between tokens of `q` (default `H_k * K`).
    pub q: Option<usize>,
    /// Stride between tokens of `k` (default `H_k * K`).
    pub k: Option<usize>,
    /// Stride between tokens of `v` (default `H_v * V`).
    pub v: Option<usize>,
    /// Stride between tokens of `a` and `b` (default `H_v`).
    pub ab: Option<usize>,
}

/// Gated delta rule decode: `N = slots.len()` rows of `tokens_per_row = T >= 1` new tokens each.
///
/// Row `i` continues the sequence whose state is slot `slots[i]` of the pool; its tokens are rows
/// `i*T .. i*T+T-1` of the inputs, processed in order with the state carried (T > 1: speculative
/// verification). Per token and value head `hv` (key head `hv / (H_v/H_k)`), in f32:
/// `g = -exp(a_log) * softplus(a + dt_bias)`, `beta = sigmoid(b)`, q/k L2-normalised if
/// `opts.use_qk_l2norm`, `q *= scale` (`K^-0.5` by default),
/// `S *= exp(g); delta = beta * (v - S^T k); S += k (x) delta; o = S^T q`. At the edge of f32,
/// `g = -inf` (`exp(a_log)` overflowing) is a full decay (`exp(-inf) = 0`, as the recurrence
/// says); so are `g = NaN` (`-inf * 0` when the softplus underflows too) and `g <= -64`.
///
/// Shapes (bf16 unless noted): `q`, `k` `[N*T, H_k, K]`; `v` `[N*T, H_v, V]`; `a`, `b`
/// `[N*T, H_v]` (token strides per `strides`); `a_log`, `dt_bias` f32 `[H_v]`; `slots` i32 `[N]`
/// (device); `state` f32 `[num_slots, H_v, K, V]` (V contiguous), updated in place; `out`
/// `[N*T, H_v, V]` contiguous. `K` in {16, 32, 64, 128}, `V` in {16, 32, 64, 128} (any combination;
/// [`super::SUPPORTED_K`], [`super::SUPPORTED_V`]): the tuned tile configurations serve
/// `K, V` in {64, 128}, the smaller dims (tiny test models) one simple 16-column tile.
/// `q`, `k`, `v`, `state`, `out` 16-byte aligned.
///
/// Kernels (`csrc/gdr/decode.cu`): by default a one-shot register-tile kernel, the tile chosen by
/// the number of (row, head) pairs; for `K = V = 128`, `T = 1` and >= 384 (row, head) pairs a
/// one-shot kernel whose 64-column tile lands in shared memory (`cp.async`) and is streamed from
/// there by 4 warps (more state in flight per SM; 1.6-3% faster than the register tiles on an
/// H200). For `K = V = 128` (every `T`)
/// the default kernels load a row's first-token inputs before its slot and compute the gating
/// (`exp`, `softplus`, `sigmoid`) and the q/k norms (`rsqrt`) with the hardware approximations
/// (relative error ~1e-6 in f32, well below the bf16 output rounding); other head dims use the
/// exact kernel (tiled by pairs for `T = 1` only). `DELTAKIT_GDR_DECODE` (read once per process;
/// for tests and measurements) selects instead: `reg` (the exact kernel with the earlier dispatch:
/// `T > 1` always 16-column tiles), `reg_exact` (the default's tiles, exact gating math, `K = V =
/// 128`), `reg_pre` / `reg_bv128` / `reg_pre_bv128` / `reg_fg` (measurement variants, `K = V =
/// 128`: the exact first-input-ahead kernel with the earlier dispatch / the whole-head tile for
/// every call / whole-head tiles for `T > 1` from 256 pairs, exact or approximate), `reg_tiles`
/// (the default without its shared-memory route), `sl_bv64_nw1` / `sl_bv64_nw2` / `sl_bv64_nw4` (the
/// shared-memory tile, 1 / 2 / 4 warps, for every `K = V = 128` call; 4 warps is the default's
/// `T = 1` tile from 384 pairs, 2 warps the one before 2026-12-02), `slc_bv64_nw4` (the
/// shared-memory tile taking a row's tokens in chunks of 4: one pass over the tile computes every
/// token's `S^T k` / `S^T q`, a small per-column substitution the deltas and outputs, one more
/// pass the update; for every `K = V = 128` call; the default for `T = 4` from 384 pairs and `T = 8`
/// from 3,072 pairs, where it measured 1.1-1.25x faster than the register tiles on an H200; sm_90
/// only: its 49.4 KB of static shared memory exceed older archs' 48 KB, where the register tiles
/// run instead),
/// or `tma_bv64_nw4_s3` / `tma_bv64_nw4_s2` /
/// `tma_bv128_nw8_s2` / `tma_bv32_nw2_s4`: a persistent kernel whose CTAs stream the state tiles
/// into shared memory with bulk copies (TMA) two or three items ahead, for `K, V` in {64, 128}
/// (passes the same tests; 1.2-1.5x slower on an H200). Unset or any other value: the default. The
/// paths differ only in f32 rounding (summation order of the `K`-reductions, approximate gating).
///
/// Slots: `-1` = padding row (zero output, no state read or written). The kernel treats any
/// device slot outside `0..num_slots` the same way, so it never touches memory outside the pool
/// even for bad slot values. Pass `slots_host` (a host copy of `slots`, which the engine has when
/// it fills its static slot buffer) to have every slot checked here: out of range or repeated live
/// slots then fail with [`Error::Shape`] before anything is launched.
///
/// Programmatic dependent launch (PDL, sm_90a images only): the default's small-batch route
/// (`K = V = 128`, fewer than 128 (row, head) pairs, any `T`: 27B TP1 `N <= 2`, TP2 `N <= 5`) is
/// launched with the programmatic-stream-serialization attribute, so it may start while the
/// kernel before it on `stream` still runs when that kernel triggers early (`conv1d.update`
/// does, at entry). The kernel reads only `slots` and `state` before `griddepcontrol.wait` (which
/// returns once the previous kernel has completed and its writes are visible); `q`, `k`, `v`,
/// `a`, `b`, `a_log`, `dt_bias` and every write (`out`, `state`) come after it. **Contract:** the
/// kernel immediately before this call on `stream` must not write `state` or `slots` if it
/// triggers early (`griddepcontrol.launch_dependents` before those writes); kernels that do not
/// trigger (the default) and copies are always safe. True in the engine: `slots` is a host copy,
/// the pool is written only by the gdr kernels, and neither `gdr.decode` nor the chunk prefill's
/// last kernel triggers early. Kill switch: `DELTAKIT_GDR_DECODE_NO_PDL=1` (read once per
/// process) launches the plain kernel. H200 (session 10, 20 calls in a CUDA graph behind an
/// early-triggering kernel, 27B `N = 1`): 2.94 / 2.01 us at TP1 / TP2 vs 3.69 / 3.20 plain.
///
/// # Errors
/// [`Error::Shape`] for any length, stride or alignment mismatch, bad `slots_host` or a
/// non-finite `opts.scale`; [`Error::Unsupported`] for head dims outside `K` in {16, 32, 64, 128}, `V` in {16, 32, 64, 128};
/// [`Error::DeviceMismatch`];
/// [`Error::Launch`] / [`Error::Driver`]. Nothing is enqueued on error.
#[allow(clippy::too_many_arguments)]
pub fn decode(
    stream: &CudaStream,
    dims: GdrDims,
    tokens_per_row: usize,
    opts: GdrOptions,
    strides: DecodeStrides,
    q: &impl DevicePtr<bf16>,
    k: &impl DevicePtr<bf16>,
    v: &impl DevicePtr<bf16>,
    a: &impl DevicePtr<bf16>,
    b: &impl DevicePtr<bf16>,
    a_log: &impl DevicePtr<f32>,
    dt_bias: &impl DevicePtr<f32>,
    slots: &impl DevicePtr<i32>,
    slots_host: Option<&[i32]>,
    state: &mut impl DevicePtrMut<f32>,
    out: &mut impl DevicePtrMut<bf16>,
) -> Result<()> {
    let GdrDims { h_k, h_v, k: kd, v: vd } = dims;
    if h_k == 0 || h_v == 0 || kd == 0 || vd == 0 {
        return Err(Error::shape(OP, "dims", "non-zero h_k, h_v, k, v", format!("{dims:?}")));
    }
    if h_v % h_k != 0 {
        return Err(Error::shape(OP, "dims", format!("h_v a multiple of h_k = {h_k}"), h_v));
    }
    if !super::head_dims_supported(kd, vd) {
        return Err(super::unsupported_head_dims(OP, kd, vd));
    }
    if tokens_per_row == 0 {
        return Err(Error::shape(OP, "tokens_per_row", ">= 1", 0));
    }
    let n = slots.len();
    let rows = validate::product(OP, "tokens_per_row", &[n, tokens_per_row])?;
    let qk_row = validate::product(OP, "dims", &[h_k, kd])?;
    let v_row = validate::product(OP, "dims", &[h_v, vd])?;
    validate::product(OP, "dims", &[v_row, kd])?; // H_v * K * V (the state per slot) fits
    let qs = validate::strided_len(OP, "q", q.len(), rows, qk_row, strides.q)?;
    let ks = validate::strided_len(OP, "k", k.len(), rows, qk_row, strides.k)?;
    let vs = validate::strided_len(OP, "v", v.len(), rows, v_row, strides.v)?;
    for (arg, s) in [("q", qs), ("k", ks), ("v", vs)] {
        if s % 8 != 0 {
            return Err(Error::shape(OP, arg, "a token stride that is a multiple of 8", s));
        }
    }
    let abs = validate::strided_len(OP, "a", a.len(), rows, h_v, strides.ab)?;
    validate::strided_len(OP, "b", b.len(), rows, h_v, strides.ab)?;
    validate::len(OP, "a_log", a_log.len(), h_v)?;
    validate::len(OP, "dt_bias", dt_bias.len(), h_v)?;
    validate::len(OP, "out", out.len(), validate::product(OP, "out", &[rows, v_row])?)?;
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
    if let Some(h) = slots_host {
        validate::slots_host(OP, h, n, num_slots)?;
    }
    let scale = super::q_scale(OP, opts, kd)?;
    same_context(OP, "q", stream, q)?;
    same_context(OP, "k", stream, k)?;
    same_context(OP, "v", stream, v)?;
    same_context(OP, "a", stream, a)?;
    same_context(OP, "b", stream, b)?;
    same_context(OP, "a_log", stream, a_log)?;
    same_context(OP, "dt_bias", stream, dt_bias)?;
    same_context(OP, "slots", stream, slots)?;
    same_context(OP, "state", stream, state)?;
    same_context(OP, "out", stream, out)?;
    if n == 0 {
        return Ok(());
    }
    bind(stream)?;
    let (qp, _g1) = q.device_ptr(stream);
    let (kp, _g2) = k.device_ptr(stream);
    let (vp, _g3) = v.device_ptr(stream);
    let (ap, _g4) = a.device_ptr(stream);
    let (bp, _g5) = b.device_ptr(stream);
    let (alp, _g6) = a_log.device_ptr(stream);
    let (dtp, _g7) = dt_bias.device_ptr(stream);
    let (sp, _g8) = slots.device_ptr(stream);
    let (stp, _g9) = state.device_ptr_mut(stream);
    let (op, _g10) = out.device_ptr_mut(stream);
    for (arg, p) in [("q", qp), ("k", kp), ("v", vp), ("state", stp), ("out", op)] {
        validate::aligned(OP, arg, p, 16)?;
    }
    validate::aligned(OP, "a", ap, 2)?;
    validate::aligned(OP, "b", bp, 2)?;
    let params = ffi::DkGdrDecodeParams {
        q: qp,
        k: kp,
        v: vp,
        a: ap,
        b: bp,
        a_log: alp,
        dt_bias: dtp,
        slots: sp,
        state: stp,
        out: op,
        n: validate::i64_of(OP, "slots", n)?,
        t: validate::i64_of(OP, "tokens_per_row", tokens_per_row)?,
        h_k: h_k as i64,
        h_v: h_v as i64,
        k_dim: kd as i64,
        v_dim: vd as i64,
        num_slots: validate::i64_of(OP, "state", num_slots)?,
        q_stride: qs as i64,
        k_stride: ks as i64,
        v_stride: vs as i64,
        ab_stride: abs as i64,
        scale,
        use_qk_l2norm: i32::from(opts.use_qk_l2norm),
    };
    // SAFETY: every pointer is a live device allocation in the stream's context (checked above),
    // sized for the shapes in `params` (lengths checked above) and borrowed until the launch is
    // enqueued; the kernel only touches slots in 0..num_slots.
    check(OP, unsafe { ffi::dk_gdr_decode(&raw const params, raw_stream(stream)) })
}
