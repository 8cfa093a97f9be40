//! `conv1d.prefill` and `conv1d.update` (CUDA C++, `csrc/conv1d/`): causal depthwise conv1d +
//! SiLU of the GDR layers with a conv state pool. CPU twins: `deltakit_ref::conv1d::{prefill,
//! update}`.

use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut};
use half::bf16;

use crate::error::{Error, Result};
use crate::ffi;
use crate::launch::{bind, check, raw_stream, same_context};
use crate::ops::validate;

/// Conv dims: channels and kernel width.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvDims {
    /// Channels (`2 * H_k * K + H_v * V` for a GDR layer).
    pub conv_dim: usize,
    /// Kernel width `W` in `2..=4`.
    pub width: usize,
}

/// Host copies of a varlen batch's device metadata, checked by [`prefill`] before launching.
#[derive(Clone, Copy, Debug)]
pub struct VarlenHost<'a> {
    /// Copy of `cu_seqlens` (`[N+1]`, starts at 0, non-decreasing, last == T).
    pub cu_seqlens: &'a [i32],
    /// Copy of `slots` (`[N]`, each -1 or in `0..num_slots`, live ones distinct).
    pub slots: &'a [i32],
}

fn check_dims(op: &'static str, d: ConvDims) -> Result<()> {
    if !(2..=4).contains(&d.width) {
        return Err(Error::Unsupported {
            op,
            what: format!("width {} (supported: 2, 3, 4)", d.width),
        });
    }
    if d.conv_dim == 0 {
        return Err(Error::shape(op, "dims.conv_dim", "> 0", 0));
    }
    Ok(())
}

fn check_state(op: &'static str, d: ConvDims, len: usize, n: usize) -> Result<usize> {
    let per_slot = validate::product(op, "dims.conv_dim", &[d.conv_dim, d.width - 1])?;
    if len % per_slot != 0 || (n > 0 && len == 0) {
        return Err(Error::shape(
            op,
            "conv_state",
            format!("a non-empty multiple of conv_dim*(W-1) = {per_slot}"),
            len,
        ));
    }
    Ok(len / per_slot)
}

/// Varlen causal depthwise conv1d + SiLU, reading each sequence's initial history from its conv
/// state slot and writing the final history back (HF `causal_conv1d_fn` with initial states).
///
/// `out[t, c] = silu(bias[c] + sum_w weight[c, w] * xe[t - (W-1) + w])` over the input extended
/// by the slot's `W-1` stored inputs (zeros where `has_initial_state[i] == 0`). Afterwards the slot
/// holds the last `W-1` inputs of history + sequence. Slot -1: padding (zero output, state
/// untouched); the kernels treat any device slot outside `0..num_slots` the same way and clamp
/// `cu_seqlens` to `0..=T`, so bad device values never cause out-of-bounds accesses. Pass `host`
/// to have `cu_seqlens` and `slots` fully validated here.
///
/// Shapes (bf16 unless noted): `x` `[T, conv_dim]` (token stride `x_stride`, default conv_dim);
/// `out` `[T, conv_dim]` contiguous (T = `out.len() / conv_dim`); `weight` `[conv_dim, W]`; `bias`
/// `[conv_dim]`; `cu_seqlens` i32 `[N+1]`; `slots` i32 `[N]`; `has_initial_state` u8 `[N]`
/// (`None` = every sequence reads its slot); `conv_state` `[num_slots, conv_dim, W-1]`.
///
/// # Errors
/// [`Error::Shape`] for length mismatches and bad host metadata; [`Error::Unsupported`] for `W`
/// outside `2..=4`; [`Error::DeviceMismatch`]; [`Error::Launch`] / [`Error::Driver`].
#[allow(clippy::too_many_arguments)]
pub fn prefill<B: DevicePtr<bf16>, H: DevicePtr<u8>>(
    stream: &CudaStream,
    dims: ConvDims,
    x: &impl DevicePtr<bf16>,
    x_stride: Option<usize>,
    weight: &impl DevicePtr<bf16>,
    bias: Option<&B>,
    cu_seqlens: &impl DevicePtr<i32>,
    slots: &impl DevicePtr<i32>,
    has_initial_state: Option<&H>,
    host: Option<VarlenHost<'_>>,
    conv_state: &mut impl DevicePtrMut<bf16>,
    out: &mut impl DevicePtrMut<bf16>,
) -> Result<()> {
    const OP: &str = "conv1d.prefill";
    check_dims(OP, dims)?;
    let cd = dims.conv_dim;
    if out.len() % cd != 0 {
        return Err(Error::shape(OP, "out", format!("a multiple of conv_dim = {cd}"), out.len()));
    }
    let t = out.len() / cd;
    let xs = validate::strided_len(OP, "x", x.len(), t, cd, x_stride)?;
    validate::len(OP, "weight", weight.len(), validate::product(OP, "weight", &[cd, dims.width])?)?;
    if let Some(b) = bias {
        validate::len(OP, "bias", b.len(), cd)?;
    }
    let n = slots.len();
    if n == 0 {
        return Err(Error::shape(OP, "slots", "at least one sequence", 0));
    }
    validate::len(OP, "cu_seqlens", cu_seqlens.len(), n + 1)?;
    if let Some(h) = has_initial_state {
        validate::len(OP, "has_initial_state", h.len(), n)?;
    }
    let num_slots = check_state(OP, dims, conv_state.len(), n)?;
    if let Some(h) = host {
        validate::len(OP, "host.cu_seqlens", h.cu_seqlens.len(), n + 1)?;
        let cu = h.cu_seqlens;
        let ok = cu[0] == 0
            && cu.windows(2).all(|w| w[0] <= w[1])
            && usize::try_from(cu[n]).is_ok_and(|l| l == t);
        if !ok {
            return Err(Error::shape(
                OP,
                "cu_seqlens",
                format!("0, non-decreasing, last == T = {t}"),
                format!("{cu:?}"),
            ));
        }
        validate::slots_host(OP, h.slots, n, num_slots)?;
    }
    same_context(OP, "x", stream, x)?;
    same_context(OP, "weight", stream, weight)?;
    if let Some(b) = bias {
        same_context(OP, "bias", stream, b)?;
    }
    same_context(OP, "cu_seqlens", stream, cu_seqlens)?;
    same_context(OP, "slots", stream, slots)?;
    if let Some(h) = has_initial_state {
        same_context(OP, "has_initial_state", stream, h)?;
    }
    same_context(OP, "conv_state", stream, conv_state)?;
    same_context(OP, "out", stream, out)?;
    bind(stream)?;
    let (xp, _g1) = x.device_ptr(stream);
    let (wp, _g2) = weight.device_ptr(stream);
    let bias_ptr = bias.map(|b| b.device_ptr(stream));
    let (cp, _g3) = cu_seqlens.device_ptr(stream);
    let (sp, _g4) = slots.device_ptr(stream);
    let his_ptr = has_initial_state.map(|h| h.device_ptr(stream));
    let (stp, _g5) = conv_state.device_ptr_mut(stream);
    let (op, _g6) = out.device_ptr_mut(stream);
    let params = ffi::DkConv1dPrefillParams {
        x: xp,
        weight: wp,
        bias: bias_ptr.as_ref().map_or(0, |p| p.0),
        cu_seqlens: cp,
        slots: sp,
        has_initial_state: his_ptr.as_ref().map_or(0, |p| p.0),
        conv_state: stp,
        out: op,
        num_tokens: validate::i64_of(OP, "out", t)?,
        num_seqs: validate::i64_of(OP, "slots", n)?,
        conv_dim: validate::i64_of(OP, "dims.conv_dim", cd)?,
        width: dims.width as i64,
        num_slots: validate::i64_of(OP, "conv_state", num_slots)?,
        x_stride: validate::i64_of(OP, "x_stride", xs)?,
    };
    // SAFETY: live device buffers of the checked lengths in the stream's context, borrowed until
    // the launch is enqueued; the kernels clamp cu_seqlens and skip out-of-range slots.
    check(OP, unsafe { ffi::dk_conv1d_prefill(&raw const params, raw_stream(stream)) })
}

/// Decode step of the causal conv1d + SiLU: `N = slots.len()` rows of `tokens_per_row = S >= 1`
/// new tokens each, row `i` continuing the sequence in conv state slot `slots[i]`; afterwards the
/// slot holds the last `W-1` inputs (HF `causal_conv1d_update` with `conv_state_indices`).
///
/// Shapes (bf16 unless noted): `x` `[N*S, conv_dim]` (token stride `x_stride`, default
/// conv_dim); `out` `[N*S, conv_dim]` contiguous; `weight` `[conv_dim, W]`; `bias` `[conv_dim]`;
/// `slots` i32 `[N]` (device; -1 = padding: zero output, state untouched; any value outside
/// `0..num_slots` is treated as padding by the kernel); `slots_host`: optional host copy checked
/// here (range, distinct live slots); `conv_state` `[num_slots, conv_dim, W-1]`.
///
/// # Errors
/// As [`prefill`].
#[allow(clippy::too_many_arguments)]
pub fn update<B: DevicePtr<bf16>>(
    stream: &CudaStream,
    dims: ConvDims,
    tokens_per_row: usize,
    x: &impl DevicePtr<bf16>,
    x_stride: Option<usize>,
    weight: &impl DevicePtr<bf16>,
    bias: Option<&B>,
    slots: &impl DevicePtr<i32>,
    slots_host: Option<&[i32]>,
    conv_state: &mut impl DevicePtrMut<bf16>,
    out: &mut impl DevicePtrMut<bf16>,
) -> Result<()> {
    const OP: &str = "conv1d.update";
    check_dims(OP, dims)?;
    if tokens_per_row == 0 {
        return Err(Error::shape(OP, "tokens_per_row", ">= 1", 0));
    }
    let cd = dims.conv_dim;
    let n = slots.len();
    let rows = validate::product(OP, "tokens_per_row", &[n, tokens_per_row])?;
    validate::len(OP, "out", out.len(), validate::product(OP, "out", &[rows, cd])?)?;
    let xs = validate::strided_len(OP, "x", x.len(), rows, cd, x_stride)?;
    validate::len(OP, "weight", weight.len(), validate::product(OP, "weight", &[cd, dims.width])?)?;
    if let Some(b) = bias {
        validate::len(OP, "bias", b.len(), cd)?;
    }
    let num_slots = check_state(OP, dims, conv_state.len(), n)?;
    if let Some(h) = slots_host {
        validate::slots_host(OP, h, n, num_slots)?;
    }
    same_context(OP, "x", stream, x)?;
    same_context(OP, "weight", stream, weight)?;
    if let Some(b) = bias {
        same_context(OP, "bias", stream, b)?;
    }
    same_context(OP, "slots", stream, slots)?;
    same_context(OP, "conv_state", stream, conv_state)?;
    same_context(OP, "out", stream, out)?;
    if n == 0 {
        return Ok(());
    }
    bind(stream)?;
    let (xp, _g1) = x.device_ptr(stream);
    let (wp, _g2) = weight.device_ptr(stream);
    let bias_ptr = bias.map(|b| b.device_ptr(stream));
    let (sp, _g4) = slots.device_ptr(stream);
    let (stp, _g5) = conv_state.device_ptr_mut(stream);
    let (op, _g6) = out.device_ptr_mut(stream);
    let params = ffi::DkConv1dUpdateParams {
        x: xp,
        weight: wp,
        bias: bias_ptr.as_ref().map_or(0, |p| p.0),
        slots: sp,
        conv_state: stp,
        out: op,
        n: validate::i64_of(OP, "slots", n)?,
        s: validate::i64_of(OP, "tokens_per_row", tokens_per_row)?,
        conv_dim: validate::i64_of(OP, "dims.conv_dim", cd)?,
        width: dims.width as i64,
        num_slots: validate::i64_of(OP, "conv_state", num_slots)?,
        x_stride: validate::i64_of(OP, "x_stride", xs)?,
    };
    // SAFETY: as in `prefill`; the kernel skips out-of-range slots.
    check(OP, unsafe { ffi::dk_conv1d_update(&raw const params, raw_stream(stream)) })
}
