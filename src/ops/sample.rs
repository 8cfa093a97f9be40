//! Sampling ops over a bf16 vocabulary (248320 for Qwen3.5), one CTA per row:
//! - `sample.argmax` (`csrc/sample/argmax.cu`), CPU twin `deltakit_ref::sample::argmax`;
//! - `sample.topk_logprobs` (`csrc/sample/topk.cu`), CPU twin
//!   `deltakit_ref::sample::topk_logprobs`;
//! - `sample.top_p` (`csrc/sample/top_p.cu`), CPU twin `deltakit_ref::sample::top_p_sample`
//!   (bitwise the same tokens).

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use half::bf16;

use crate::error::{Error, Result};
use crate::ffi;
use crate::launch::{bind, check, raw_stream, same_context};
use crate::ops::validate;

/// Greedy sampling: `ids[r] = argmax_j logits[r, j]`, ties to the lowest index (as the CPU
/// reference). A row containing a NaN gets id `-1` (the reference returns an error there; the
/// device cannot, so it refuses to produce a plausible token instead).
///
/// Shapes: `logits` bf16 `[rows, vocab]`; `ids` i32 `[rows]`.
///
/// # Errors
/// [`Error::Shape`] if `vocab` is 0 or over `i32::MAX`, or a length disagrees;
/// [`Error::DeviceMismatch`]; [`Error::Launch`] / [`Error::Driver`].
pub fn argmax(
    stream: &CudaStream,
    logits: &impl DevicePtr<bf16>,
    vocab: usize,
    ids: &mut impl DevicePtrMut<i32>,
) -> Result<()> {
    const OP: &str = "sample.argmax";
    let rows = logits_rows(OP, logits.len(), vocab)?;
    validate::len(OP, "ids", ids.len(), rows)?;
    same_context(OP, "logits", stream, logits)?;
    same_context(OP, "ids", stream, ids)?;
    if rows == 0 {
        return Ok(());
    }
    bind(stream)?;
    let (lp, _g1) = logits.device_ptr(stream);
    let (ip, _g2) = ids.device_ptr_mut(stream);
    let params = ffi::DkArgmaxParams {
        logits: lp,
        ids: ip,
        rows: validate::i64_of(OP, "logits", rows)?,
        vocab: validate::i64_of(OP, "vocab", vocab)?,
    };
    // SAFETY: live device buffers of the checked lengths in the stream's context.
    check(OP, unsafe { ffi::dk_sample_argmax(&raw const params, raw_stream(stream)) })
}

/// Largest `k` of [`topk_logprobs`].
pub const TOPK_MAX: usize = 256;

/// Checks `logits` = `[rows, vocab]` (vocab in `1..=i32::MAX`, rows <= `i32::MAX`); returns rows.
fn logits_rows(op: &'static str, len: usize, vocab: usize) -> Result<usize> {
    if vocab == 0 || vocab > i32::MAX as usize || len % vocab != 0 {
        return Err(Error::shape(
            op,
            "logits",
            format!("a multiple of vocab = {vocab} (1..=i32::MAX)"),
            len,
        ));
    }
    let rows = len / vocab;
    if rows > i32::MAX as usize {
        return Err(Error::shape(op, "logits", "at most i32::MAX rows", rows));
    }
    Ok(rows)
}

/// Top-k log-probabilities per row: the `k` largest logits as `(id, logit - logsumexp(row))`,
/// sorted by logit descending, ties by lower id — `torch.topk(torch.log_softmax(logits.float(),
/// -1), k)` (HF generation's `output_logprobs`) with a deterministic tie order, the order of
/// `deltakit_ref::sample::topk_logprobs`. The ids are exact; `logsumexp` is max-subtracted in f32
/// (the reference uses f64), so logprobs agree to ~1e-6 relative. Order is the bf16 total order
/// (`-0 < +0`); `-inf` logits rank last with logprob `-inf`.
///
/// A row containing a NaN gets ids `-1` and logprobs NaN in all `k` slots (the reference returns
/// an error there). A row whose maximum is infinite gets NaN logprobs (as the reference), with
/// exact ids.
///
/// Shapes: `logits` bf16 `[rows, vocab]` contiguous; `ids` i32 `[rows, k]`; `logprobs` f32
/// `[rows, k]`. Outputs are caller-allocated (safe inside graph capture).
///
/// # Errors
/// [`Error::Shape`] if `vocab` is 0 or over `i32::MAX`, `k` is not in `1..=min(256, vocab)`, or a
/// length disagrees; [`Error::DeviceMismatch`]; [`Error::Launch`] / [`Error::Driver`].
pub fn topk_logprobs(
    stream: &CudaStream,
    logits: &impl DevicePtr<bf16>,
    vocab: usize,
    k: usize,
    ids: &mut impl DevicePtrMut<i32>,
    logprobs: &mut impl DevicePtrMut<f32>,
) -> Result<()> {
    topk_logprobs_ws(stream, logits, vocab, k, ids, logprobs, None::<&mut CudaSlice<u8>>)
}

/// Workspace bytes that let [`topk_logprobs_ws`] split each of `rows` rows over vocabulary slices
/// (for any `k <= TOPK_SPLIT_MAX_K`; larger `k` never splits and needs none).
#[must_use]
pub fn topk_workspace_bytes(rows: usize, k: usize) -> usize {
    let (r, k) = (i64::try_from(rows).unwrap_or(i64::MAX), i64::try_from(k).unwrap_or(i64::MAX));
    // SAFETY: pure arithmetic on its arguments.
    let b = unsafe { ffi::dk_topk_workspace_bytes(r, TOPK_MAX_SPLITS, k) };
    usize::try_from(b).unwrap_or(0)
}

/// Largest `k` for which [`topk_logprobs_ws`] splits rows over vocabulary slices
/// (`DK_TOPK_SPLIT_MAX_K` in `csrc/include/sample.h`).
pub const TOPK_SPLIT_MAX_K: usize = 64;

/// Most vocabulary slices per row (`DK_TOPK_MAX_SPLITS` in `csrc/include/sample.h`).
const TOPK_MAX_SPLITS: i64 = 32;

/// [`topk_logprobs`] with an optional device workspace of [`topk_workspace_bytes`]`(rows, k)`
/// bytes (caller-owned, so safe inside graph capture). With it, when the rows alone would leave
/// most SMs idle (decode: a few rows of a 248k vocabulary on one CTA each took ~120 us on an H200,
/// ncu 2026-12-01) and `k <= TOPK_SPLIT_MAX_K`, each row is split over up to 32 CTAs by
/// vocabulary slice and a second kernel merges the slices: the same ids, logprobs equal to the
/// one-CTA result up to f32 rounding of the logsumexp (the partial sums are combined in another
/// order). A smaller workspace splits less (or not at all); its contents are scratch.
///
/// # Errors
/// As [`topk_logprobs`]; [`Error::Shape`] naming `workspace` if it is not 16-byte aligned.
pub fn topk_logprobs_ws(
    stream: &CudaStream,
    logits: &impl DevicePtr<bf16>,
    vocab: usize,
    k: usize,
    ids: &mut impl DevicePtrMut<i32>,
    logprobs: &mut impl DevicePtrMut<f32>,
    workspace: Option<&mut impl DevicePtrMut<u8>>,
) -> Result<()> {
    const OP: &str = "sample.topk_logprobs";
    let rows = logits_rows(OP, logits.len(), vocab)?;
    if k == 0 || k > TOPK_MAX || k > vocab {
        return Err(Error::shape(OP, "k", format!("1..={}", TOPK_MAX.min(vocab)), k));
    }
    validate::len(OP, "ids", ids.len(), rows * k)?;
    validate::len(OP, "logprobs", logprobs.len(), rows * k)?;
    same_context(OP, "logits", stream, logits)?;
    same_context(OP, "ids", stream, ids)?;
    same_context(OP, "logprobs", stream, logprobs)?;
    if rows == 0 {
        return Ok(());
    }
    bind(stream)?;
    let (lp, _g1) = logits.device_ptr(stream);
    let (ip, _g2) = ids.device_ptr_mut(stream);
    let (op, _g3) = logprobs.device_ptr_mut(stream);
    let (wp, wlen, _g4) = match workspace {
        Some(w) => {
            same_context(OP, "workspace", stream, w)?;
            let len = w.len();
            let (p, g) = w.device_ptr_mut(stream);
            if p % 16 != 0 {
                return Err(Error::shape(OP, "workspace", "a 16-byte aligned address", p % 16));
            }
            (p, len, Some(g))
        }
        None => (0, 0, None),
    };
    let params = ffi::DkTopkLogprobsParams {
        logits: lp,
        ids: ip,
        logprobs: op,
        rows: validate::i64_of(OP, "logits", rows)?,
        vocab: validate::i64_of(OP, "vocab", vocab)?,
        k: validate::i64_of(OP, "k", k)?,
        workspace: wp,
        workspace_bytes: validate::i64_of(OP, "workspace", wlen)?,
    };
    // SAFETY: live device buffers of the checked lengths in the stream's context.
    check(OP, unsafe { ffi::dk_sample_topk_logprobs(&raw const params, raw_stream(stream)) })
}

/// Seeded temperature / top-p (nucleus) sampling, one token per row, bitwise equal to
/// `deltakit_ref::sample::top_p_sample` (which holds the full definition). In short, per row:
/// fixed-point weights `q_j ~ 2^32 exp((x_j - max) / T)` (u64, an exactly specified f32 `exp`),
/// the nucleus = all tokens whose logit is `>=` the largest threshold keeping at least
/// `trunc(top_p * sum q)` of the mass (ties at the threshold all kept), and the token at
/// `target = trunc(u * kept_mass)` of the kept tokens' prefix sums in index order, with
/// `u = (splitmix64(seed ^ splitmix64(counter)) >> 11) * 2^-53`. All mass sums are integers, so
/// the result is exact, reproducible, and independent of thread scheduling, of the row's position
/// and of the rest of the batch: the draw depends only on `(seed, counter)` (e.g. the request's
/// seed and its number of generated tokens) and the row's logits. This is the same distribution as
/// HF `TemperatureLogitsWarper` + `TopPLogitsWarper` + multinomial, up to the 2^-32 weight
/// quantization and with ties at the nucleus boundary kept.
///
/// Per-row parameters are device data, so values outside their domain have a defined meaning
/// instead of an error: `temperature` NaN, `<= 0`, or so small that `1/T` overflows f32 -> greedy
/// (the argmax, ties to the lowest id, as [`argmax`]); `temperature = +inf` -> uniform over the
/// finite logits; `top_p` NaN, `<= 0` or `> 1` -> 1 (no truncation). A row containing a NaN logit
/// gets id `-1` (the reference returns an error there).
///
/// Shapes: `logits` bf16 `[rows, vocab]` contiguous; `temperature`, `top_p` f32 `[rows]`; `seed`,
/// `counter` u64 `[rows]`; `ids` i32 `[rows]` (caller-allocated).
///
/// # Errors
/// [`Error::Shape`] if `vocab` is 0 or over `i32::MAX` or a length disagrees;
/// [`Error::DeviceMismatch`]; [`Error::Launch`] / [`Error::Driver`].
#[allow(clippy::too_many_arguments)]
pub fn top_p(
    stream: &CudaStream,
    logits: &impl DevicePtr<bf16>,
    vocab: usize,
    temperature: &impl DevicePtr<f32>,
    top_p: &impl DevicePtr<f32>,
    seed: &impl DevicePtr<u64>,
    counter: &impl DevicePtr<u64>,
    ids: &mut impl DevicePtrMut<i32>,
) -> Result<()> {
    const OP: &str = "sample.top_p";
    let rows = logits_rows(OP, logits.len(), vocab)?;
    validate::len(OP, "temperature", temperature.len(), rows)?;
    validate::len(OP, "top_p", top_p.len(), rows)?;
    validate::len(OP, "seed", seed.len(), rows)?;
    validate::len(OP, "counter", counter.len(), rows)?;
    validate::len(OP, "ids", ids.len(), rows)?;
    same_context(OP, "logits", stream, logits)?;
    same_context(OP, "temperature", stream, temperature)?;
    same_context(OP, "top_p", stream, top_p)?;
    same_context(OP, "seed", stream, seed)?;
    same_context(OP, "counter", stream, counter)?;
    same_context(OP, "ids", stream, ids)?;
    if rows == 0 {
        return Ok(());
    }
    bind(stream)?;
    let (lp, _g1) = logits.device_ptr(stream);
    let (tp, _g2) = temperature.device_ptr(stream);
    let (pp, _g3) = top_p.device_ptr(stream);
    let (sp, _g4) = seed.device_ptr(stream);
    let (cp, _g5) = counter.device_ptr(stream);
    let (ip, _g6) = ids.device_ptr_mut(stream);
    let params = ffi::DkTopPParams {
        logits: lp,
        temperature: tp,
        top_p: pp,
        seed: sp,
        counter: cp,
        ids: ip,
        rows: validate::i64_of(OP, "logits", rows)?,
        vocab: validate::i64_of(OP, "vocab", vocab)?,
    };
    // SAFETY: live device buffers of the checked lengths in the stream's context.
    check(OP, unsafe { ffi::dk_sample_top_p(&raw const params, raw_stream(stream)) })
}
