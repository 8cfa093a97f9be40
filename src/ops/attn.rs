//! `attn.output_gate` (CUDA C++, `csrc/mlp/elementwise.cu`). CPU twin:
//! `deltakit_ref::attn::output_gate`.

use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut};
use half::bf16;

use crate::error::{Error, Result};
use crate::ffi;
use crate::launch::{bind, check, raw_stream, same_context};
use crate::ops::validate;

/// Gated-attention output gate (HF `Qwen3_5Attention`: `attn_output * torch.sigmoid(gate)`):
/// `out = bf16(attn * bf16(sigmoid(gate)))`, sigmoid in f32.
///
/// Shapes: `attn`, `out` bf16 `[rows, width]` (`width = H_q * hd`); `gate` bf16 rows of `width`
/// elements `gate_stride` apart (`None` = contiguous), so the gate can be read in place from a
/// wider buffer.
///
/// # Errors
/// [`Error::Shape`] if `width == 0`, a stride is smaller than `width`, or a length disagrees;
/// [`Error::DeviceMismatch`]; [`Error::Launch`] / [`Error::Driver`].
pub fn output_gate(
    stream: &CudaStream,
    attn: &impl DevicePtr<bf16>,
    gate: &impl DevicePtr<bf16>,
    width: usize,
    gate_stride: Option<usize>,
    out: &mut impl DevicePtrMut<bf16>,
) -> Result<()> {
    const OP: &str = "attn.output_gate";
    if width == 0 || attn.len() % width != 0 {
        return Err(Error::shape(
            OP,
            "attn",
            format!("a multiple of width = {width} (> 0)"),
            attn.len(),
        ));
    }
    let rows = attn.len() / width;
    let stride = validate::strided_len(OP, "gate", gate.len(), rows, width, gate_stride)?;
    validate::len(OP, "out", out.len(), attn.len())?;
    same_context(OP, "attn", stream, attn)?;
    same_context(OP, "gate", stream, gate)?;
    same_context(OP, "out", stream, out)?;
    if rows == 0 {
        return Ok(());
    }
    bind(stream)?;
    let (ap, _g1) = attn.device_ptr(stream);
    let (gp, _g2) = gate.device_ptr(stream);
    let (op, _g3) = out.device_ptr_mut(stream);
    let params = ffi::DkOutputGateParams {
        attn: ap,
        gate: gp,
        out: op,
        rows: validate::i64_of(OP, "attn", rows)?,
        width: validate::i64_of(OP, "width", width)?,
        gate_stride: validate::i64_of(OP, "gate_stride", stride)?,
    };
    // SAFETY: live device buffers of the checked extents in the stream's context.
    check(OP, unsafe { ffi::dk_attn_output_gate(&raw const params, raw_stream(stream)) })
}

/// Head counts and head dim of an attention layer (per rank). Query head `h` reads kv head
/// `h / (n_q_heads / n_kv_heads)` (GQA; any group size).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnDims {
    /// Query heads `H_q`; a multiple of `n_kv_heads`.
    pub n_q_heads: usize,
    /// Key/value heads `H_kv`.
    pub n_kv_heads: usize,
    /// Head dim `hd`: 64, 128 or 256.
    pub head_dim: usize,
}

/// Paged KV cache geometry: `k_cache`, `v_cache` are bf16 `[num_pages, page_size, H_kv, hd]`;
/// absolute position `p` of sequence `i` lives in page `page_table[i * max_pages + p /
/// page_size]`, row `p % page_size`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PagedKv {
    /// Tokens per page (any value >= 1).
    pub page_size: usize,
    /// Pages in the cache.
    pub num_pages: usize,
    /// Row length of the page table.
    pub max_pages: usize,
}

/// A batch of sequences against the paged cache: device arrays the kernels read, and the host
/// copies of the same arrays the wrappers validate (the engine builds both; device copies live in
/// static buffers so a CUDA graph can replay with new contents).
///
/// `cu_seqlens` i32 `[N + 1]` over the new tokens; `ctx_lens` i32 `[N]` (tokens already cached;
/// -1 = padding sequence); `page_table` i32 `[N, max_pages]`.
#[derive(Clone, Copy, Debug)]
pub struct SeqBatch<'a, I> {
    /// Device `cu_seqlens`.
    pub cu_seqlens: &'a I,
    /// Device `ctx_lens`.
    pub ctx_lens: &'a I,
    /// Device page table.
    pub page_table: &'a I,
    /// Host copy of `cu_seqlens`.
    pub host_cu_seqlens: &'a [i32],
    /// Host copy of `ctx_lens`.
    pub host_ctx_lens: &'a [i32],
    /// Host copy of the page table.
    pub host_page_table: &'a [i32],
}

/// Partial RoPE configuration (HF `rope_parameters`): `rotary_dim = head_dim *
/// partial_rotary_factor` (even, <= hd), `theta = rope_theta`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rope {
    /// Rotated leading dims.
    pub rotary_dim: usize,
    /// `rope_theta`.
    pub theta: f32,
}

/// Element counts of one token's rows: `(H_q * hd, H_kv * hd)`, checked (absurd head counts
/// must fail here instead of wrapping past the length checks in release builds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Rows {
    q: usize,
    kv: usize,
}

fn check_dims(op: &'static str, d: AttnDims) -> Result<Rows> {
    if !matches!(d.head_dim, 64 | 128 | 256) {
        return Err(Error::Unsupported {
            op,
            what: format!("head_dim {} (built: 64, 128, 256)", d.head_dim),
        });
    }
    if d.n_kv_heads == 0 || d.n_q_heads == 0 || d.n_q_heads % d.n_kv_heads != 0 {
        return Err(Error::shape(
            op,
            "dims.n_q_heads",
            format!("a positive multiple of n_kv_heads = {}", d.n_kv_heads),
            d.n_q_heads,
        ));
    }
    Ok(Rows {
        q: validate::product(op, "dims.n_q_heads", &[d.n_q_heads, d.head_dim])?,
        kv: validate::product(op, "dims.n_kv_heads", &[d.n_kv_heads, d.head_dim])?,
    })
}

/// New tokens `T` of a batch: the last entry of the host `cu_seqlens` (0 if empty; the full
/// check is [`check_host`]'s). A negative last entry is an error here, before any length is
/// computed from it.
fn tokens_of(op: &'static str, cu: &[i32]) -> Result<usize> {
    let last = cu.last().copied().unwrap_or(0);
    usize::try_from(last).map_err(|_| {
        Error::shape(op, "cu_seqlens", "non-decreasing, from 0 to T >= 0", format!("{cu:?}"))
    })
}

/// Validates host metadata for `t` new tokens: `cu` (N+1), `ctx` (N), `table` (N x max_pages).
/// Returns (N, longest new-token run).
fn check_host(
    op: &'static str,
    cu: &[i32],
    ctx: &[i32],
    table: &[i32],
    kv: PagedKv,
    t: usize,
) -> Result<(usize, usize)> {
    if cu.len() < 2
        || cu[0] != 0
        || cu.windows(2).any(|w| w[1] < w[0])
        || cu[cu.len() - 1] as usize != t
    {
        return Err(Error::shape(
            op,
            "cu_seqlens",
            format!("non-decreasing, from 0 to T = {t}, at least 2 entries"),
            format!("{cu:?}"),
        ));
    }
    let n = cu.len() - 1;
    validate::len(op, "host_ctx_lens", ctx.len(), n)?;
    check_table_geometry(op, kv, n, table)?;
    let mut longest = 0usize;
    for i in 0..n {
        let len = (cu[i + 1] - cu[i]) as usize;
        longest = longest.max(len);
        let c = ctx[i];
        if c < -1 {
            return Err(Error::shape(op, "ctx_lens", "-1 or >= 0", format!("ctx_lens[{i}] = {c}")));
        }
        if c < 0 {
            continue;
        }
        check_seq_pages(op, i, c as usize + len, table, kv)?;
    }
    Ok((n, longest))
}

/// The cache geometry is non-empty and the host page table is `[n, max_pages]`.
fn check_table_geometry(op: &'static str, kv: PagedKv, n: usize, table: &[i32]) -> Result<()> {
    if kv.page_size == 0 || kv.max_pages == 0 || kv.num_pages == 0 {
        return Err(Error::shape(
            op,
            "kv",
            "page_size, max_pages, num_pages > 0",
            format!("{kv:?}"),
        ));
    }
    let need = validate::product(op, "kv.max_pages", &[n, kv.max_pages])?;
    validate::len(op, "host_page_table", table.len(), need)
}

/// Sequence `i`, holding `total` tokens, has valid page ids for all of them in its table row.
fn check_seq_pages(
    op: &'static str,
    i: usize,
    total: usize,
    table: &[i32],
    kv: PagedKv,
) -> Result<()> {
    let need = total.div_ceil(kv.page_size);
    if need > kv.max_pages {
        return Err(Error::shape(
            op,
            "page_table",
            format!("at most max_pages = {} pages per sequence", kv.max_pages),
            format!("sequence {i} needs {need} for {total} tokens"),
        ));
    }
    let row = &table[i * kv.max_pages..i * kv.max_pages + need];
    if let Some((j, &p)) =
        row.iter().enumerate().find(|(_, &p)| p < 0 || p as usize >= kv.num_pages)
    {
        return Err(Error::shape(
            op,
            "page_table",
            format!("page ids in 0..{}", kv.num_pages),
            format!("page_table[{i}][{j}] = {p}"),
        ));
    }
    Ok(())
}

/// [`check_host`] plus the device arrays' lengths.
fn check_batch<I: DevicePtr<i32>>(
    op: &'static str,
    b: &SeqBatch<'_, I>,
    kv: PagedKv,
    t: usize,
) -> Result<(usize, usize)> {
    let (n, longest) =
        check_host(op, b.host_cu_seqlens, b.host_ctx_lens, b.host_page_table, kv, t)?;
    validate::len(op, "cu_seqlens", b.cu_seqlens.len(), n + 1)?;
    validate::len(op, "ctx_lens", b.ctx_lens.len(), n)?;
    // n * max_pages fits: check_host checked the host table's length against it.
    validate::len(op, "page_table", b.page_table.len(), n * kv.max_pages)?;
    Ok((n, longest))
}

/// Elements of each cache, `num_pages * page_size * H_kv * hd` (`width` from [`check_dims`]).
fn cache_len(op: &'static str, kv: PagedKv, width: Rows) -> Result<usize> {
    kv.num_pages
        .checked_mul(kv.page_size)
        .and_then(|x| x.checked_mul(width.kv))
        .ok_or_else(|| Error::shape(op, "kv", "a cache size that fits in usize", format!("{kv:?}")))
}

/// Fused attention prologue for prefill and decode rows (HF `Qwen3_5Attention.forward` up to the
/// attention call): splits each query head's `[q_h | gate_h]`, applies q/k RMSNorm `(1 + w)`
/// over `hd`, partial NeoX RoPE at each token's absolute position `ctx_lens[s] + j`, writes q and
/// gate contiguous and k/v into the paged cache. Bit-exact with `deltakit_ref::attn::{qk_norm,
/// rope_neox, write_kv}` on the same inputs.
///
/// Shapes: `qg` bf16 `[T, H_q, 2 hd]` (rows `sqg` elements apart, `None` = contiguous); `k`, `v`
/// bf16 `[T, H_kv, hd]` (rows `sk` / `sv` apart); `q_norm_w`, `k_norm_w` bf16 `[hd]`; `q_out`,
/// `gate_out` bf16 `[T, H_q, hd]`; caches as [`PagedKv`]. Padding sequences (`ctx_lens = -1`) get
/// zero q/gate rows and write nothing to the cache.
///
/// # Errors
/// [`Error::Shape`] for any length, stride, `cu_seqlens`, `ctx_lens` or page-table problem
/// (including two tokens writing the same cache row), [`Error::Unsupported`] for a head dim
/// outside 64/128/256, [`Error::DeviceMismatch`], [`Error::Launch`] / [`Error::Driver`].
#[allow(clippy::too_many_arguments, clippy::too_many_lines)] // validation of a 15-buffer op
pub fn prep<I: DevicePtr<i32>>(
    stream: &CudaStream,
    qg: (&impl DevicePtr<bf16>, Option<usize>),
    k: (&impl DevicePtr<bf16>, Option<usize>),
    v: (&impl DevicePtr<bf16>, Option<usize>),
    q_norm_w: &impl DevicePtr<bf16>,
    k_norm_w: &impl DevicePtr<bf16>,
    eps: f32,
    rope: Rope,
    dims: AttnDims,
    kv: PagedKv,
    batch: &SeqBatch<'_, I>,
    k_cache: &mut impl DevicePtrMut<bf16>,
    v_cache: &mut impl DevicePtrMut<bf16>,
    q_out: &mut impl DevicePtrMut<bf16>,
    gate_out: &mut impl DevicePtrMut<bf16>,
) -> Result<()> {
    const OP: &str = "attn.prep";
    let width = check_dims(OP, dims)?;
    let hd = dims.head_dim;
    if rope.rotary_dim == 0 || rope.rotary_dim % 2 != 0 || rope.rotary_dim > hd {
        return Err(Error::shape(
            OP,
            "rope.rotary_dim",
            format!("even, in 2..={hd}"),
            rope.rotary_dim,
        ));
    }
    if !(rope.theta.is_finite() && rope.theta > 0.0) {
        return Err(Error::shape(OP, "rope.theta", "finite and > 0", rope.theta));
    }
    validate::eps(OP, eps)?;
    let q_row = validate::product(OP, "dims.n_q_heads", &[width.q, 2])?;
    let t = tokens_of(OP, batch.host_cu_seqlens)?;
    let sqg = validate::strided_len(OP, "qg", qg.0.len(), t, q_row, qg.1)?;
    let sk = validate::strided_len(OP, "k", k.0.len(), t, width.kv, k.1)?;
    let sv = validate::strided_len(OP, "v", v.0.len(), t, width.kv, v.1)?;
    validate::len(OP, "q_norm_w", q_norm_w.len(), hd)?;
    validate::len(OP, "k_norm_w", k_norm_w.len(), hd)?;
    let q_len = validate::product(OP, "q_out", &[t, width.q])?;
    validate::len(OP, "q_out", q_out.len(), q_len)?;
    validate::len(OP, "gate_out", gate_out.len(), q_len)?;
    let clen = cache_len(OP, kv, width)?;
    validate::len(OP, "k_cache", k_cache.len(), clen)?;
    validate::len(OP, "v_cache", v_cache.len(), clen)?;
    let (n, _) = check_batch(OP, batch, kv, t)?;
    // No two tokens of the batch may write the same cache row.
    let mut rows = std::collections::HashSet::with_capacity(t);
    for i in 0..n {
        let Ok(ctx) = usize::try_from(batch.host_ctx_lens[i]) else { continue };
        let len = (batch.host_cu_seqlens[i + 1] - batch.host_cu_seqlens[i]) as usize;
        for pos in ctx..ctx + len {
            let page = batch.host_page_table[i * kv.max_pages + pos / kv.page_size];
            if !rows.insert((page, pos % kv.page_size)) {
                return Err(Error::shape(
                    OP,
                    "page_table",
                    "distinct cache rows for every new token",
                    format!("page {page} row {} written twice (sequence {i})", pos % kv.page_size),
                ));
            }
        }
    }
    for (arg, ok) in [
        ("qg", same_context(OP, "qg", stream, qg.0)),
        ("k", same_context(OP, "k", stream, k.0)),
        ("v", same_context(OP, "v", stream, v.0)),
    ] {
        ok.map_err(|_| Error::DeviceMismatch { op: OP, arg })?;
    }
    same_context(OP, "q_norm_w", stream, q_norm_w)?;
    same_context(OP, "k_norm_w", stream, k_norm_w)?;
    same_context(OP, "cu_seqlens", stream, batch.cu_seqlens)?;
    same_context(OP, "ctx_lens", stream, batch.ctx_lens)?;
    same_context(OP, "page_table", stream, batch.page_table)?;
    same_context(OP, "k_cache", stream, k_cache)?;
    same_context(OP, "v_cache", stream, v_cache)?;
    same_context(OP, "q_out", stream, q_out)?;
    same_context(OP, "gate_out", stream, gate_out)?;
    if t == 0 {
        return Ok(());
    }
    bind(stream)?;
    let (qgp, _g1) = qg.0.device_ptr(stream);
    let (kp, _g2) = k.0.device_ptr(stream);
    let (vp, _g3) = v.0.device_ptr(stream);
    let (qwp, _g4) = q_norm_w.device_ptr(stream);
    let (kwp, _g5) = k_norm_w.device_ptr(stream);
    let (cup, _g6) = batch.cu_seqlens.device_ptr(stream);
    let (ctxp, _g7) = batch.ctx_lens.device_ptr(stream);
    let (ptp, _g8) = batch.page_table.device_ptr(stream);
    let (kcp, _g9) = k_cache.device_ptr_mut(stream);
    let (vcp, _g10) = v_cache.device_ptr_mut(stream);
    let (qop, _g11) = q_out.device_ptr_mut(stream);
    let (gop, _g12) = gate_out.device_ptr_mut(stream);
    let i64_of = |arg, x| validate::i64_of(OP, arg, x);
    let params = ffi::DkAttnPrepParams {
        qg: qgp,
        k: kp,
        v: vp,
        q_norm_w: qwp,
        k_norm_w: kwp,
        q_out: qop,
        gate_out: gop,
        k_cache: kcp,
        v_cache: vcp,
        cu_seqlens: cup,
        ctx_lens: ctxp,
        page_table: ptp,
        num_tokens: i64_of("qg", t)?,
        num_seqs: i64_of("cu_seqlens", n)?,
        n_q_heads: i64_of("dims.n_q_heads", dims.n_q_heads)?,
        n_kv_heads: i64_of("dims.n_kv_heads", dims.n_kv_heads)?,
        head_dim: i64_of("dims.head_dim", hd)?,
        rotary_dim: i64_of("rope.rotary_dim", rope.rotary_dim)?,
        sqg: i64_of("qg", sqg)?,
        sk: i64_of("k", sk)?,
        sv: i64_of("v", sv)?,
        page_size: i64_of("kv.page_size", kv.page_size)?,
        max_pages: i64_of("kv.max_pages", kv.max_pages)?,
        num_pages: i64_of("kv.num_pages", kv.num_pages)?,
        theta: rope.theta,
        eps,
    };
    // SAFETY: every buffer is a live allocation of the checked extent in the stream's context;
    // the metadata was validated on the host copies, and the kernel bounds-checks page ids again.
    check(OP, unsafe { ffi::dk_attn_prep(&raw const params, raw_stream(stream)) })
}

/// Query rows per program of the prefill kernel (the `BLOCK_M` of every `attn_prefill_hd*`
/// specialization in `triton_aot/manifest.toml`).
const PREFILL_BLOCK_M: usize = 64;

/// Which kernel [`prefill`] runs, from `DELTAKIT_ATTN_PREFILL` (read once per process):
/// `triton` forces the portable Triton kernel; anything else (or unset) picks the sm_90a CUDA
/// kernel on a device that runs it, else Triton.
#[must_use]
pub fn prefill_uses_sm90_kernel_if_possible() -> bool {
    static CHOICE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *CHOICE.get_or_init(|| {
        std::env::var("DELTAKIT_ATTN_PREFILL").map_or(true, |v| !v.eq_ignore_ascii_case("triton"))
    })
}

/// Causal GQA prefill attention over the paged cache, mirroring HF `Qwen3_5Attention`'s
/// `sdpa(is_causal)` with prior context (chunked prefill). Kernels: on a compute-capability 9.0
/// device of a build with `90a`, the CUDA C++ `dk_attn_prefill_sm90` (wgmma, warp-specialized,
/// the q heads of a GQA group packed so each K/V tile is read once per group; see
/// `csrc/attn/prefill_sm90.cu`); elsewhere, or with `DELTAKIT_ATTN_PREFILL=triton`, the Triton AOT
/// `attn_prefill_hd{64,128,256}` (same semantics). Semantics:
/// new token `j` of sequence `s` (absolute position `ctx_lens[s] + j`) attends to cache positions
/// `0..=ctx_lens[s] + j`; the new tokens' k/v must already be in the cache ([`prep`]). f32 online
/// softmax, bf16 PV product with f32 accumulation, `scale` default `hd^-0.5`. CPU twin:
/// `deltakit_ref::attn::prefill_paged`. Padding sequences give zero rows.
///
/// Shapes: `q`, `out` bf16 `[T, H_q, hd]` contiguous, 16-byte aligned; caches as [`PagedKv`].
///
/// # Errors
/// As [`prep`] (no duplicate-row check: nothing is written to the cache).
#[allow(clippy::too_many_arguments)]
pub fn prefill<I: DevicePtr<i32>>(
    stream: &CudaStream,
    q: &impl DevicePtr<bf16>,
    k_cache: &impl DevicePtr<bf16>,
    v_cache: &impl DevicePtr<bf16>,
    dims: AttnDims,
    kv: PagedKv,
    batch: &SeqBatch<'_, I>,
    scale: Option<f32>,
    out: &mut impl DevicePtrMut<bf16>,
) -> Result<()> {
    let kernel = if prefill_uses_sm90_kernel_if_possible() {
        PrefillKernel::Auto
    } else {
        PrefillKernel::Triton
    };
    prefill_with(kernel, stream, q, k_cache, v_cache, dims, kv, batch, scale, out)
}

/// Kernel choice for [`prefill_with`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrefillKernel {
    /// The sm_90a CUDA kernel where the device runs it, else Triton. At head dim 256: tile
    /// variant 48 (split TMA producer whose full K / V tiles are issued by one lane with uniform
    /// operands, Q by TMA from whole-token boxes, ping-pong, LPT block order, staged output with
    /// stepped row addresses; see [`PrefillKernel::Sm90Variant`]; 30 before session 10).
    Auto,
    /// The sm_90a CUDA kernel with the ping-pong schedule of its two consumer warpgroups (they
    /// take turns issuing GEMMs), else Triton. Same results as `Auto`.
    Sm90PingPong,
    /// The sm_90a CUDA kernel, ping-pong schedule, with an explicit tile configuration at head
    /// dim 256 (`DkAttnPrefillSm90Params::variant`; ignored at 64 / 128), else Triton. 0: 64-position
    /// K/V tiles, 2 stages; 1: 80-position tiles, 2 stages, P packed to bf16 after the previous PV
    /// product; 2: 64, 2 stages, late P; 3: 48, 3 stages, late P; 4: as 2 with 56 producer / 224
    /// consumer registers; 5: as 1 with those registers; 6: as 5 with the producer
    /// loading K one tile ahead of V; 7: as 5 with the fast softmax (raw-score max, one FFMA per
    /// exponent, O rescale skipped when no row max changed; scale > 0, else 5 runs; the default
    /// until 2026-12-01, session 4);
    /// 8: 6 + 7; 9: as 7 with the K/V tiles loaded by TMA (`cp.async.bulk.tensor`, 128B swizzle;
    /// page sizes not a multiple of 16 run 7; 13% slower than 7 on an H200). 10-15: as 7 with the
    /// softmax exponentials pinned under the PV product and the O rescale moved before the next
    /// PV issue, each with its own consumer schedule (even: ping-pong, odd: free-running); 10/11
    /// the producer of 7, 12/13 a split producer (two warps copy K tiles, two V tiles), 14/15
    /// the split producer with TMA loads (page sizes not a multiple of 16 run 12/13); 10-15 and
    /// 16 (= 7 otherwise) launch the row blocks heaviest first across all kv heads (LPT order);
    /// 17-22: the split TMA producer (odd: ping-pong, even: free-running), 17/18 in the
    /// kv-head-major order, 19/20 LPT with the output staged through shared memory (coalesced
    /// 16-byte stores; 19 was the default until session 6), 21/22 staged in the kv-head-major
    /// order; 23: 19 as a persistent kernel (one CTA per SM walks the LPT block list; the K/V
    /// ring and the ping-pong turns run on across blocks, the next block's Q half loads as soon
    /// as its consumer warpgroup released it), 24: 23 with at most 8 CTAs (a test variant: many
    /// blocks per CTA); 23 measured 0.90-0.99x variant 19 on an H200 (session 5), not the
    /// default. 25: 19 with Q loaded by the V producer pair (one mbarrier per consumer
    /// warpgroup's 64 rows, row addresses stepped, not divided), so the K pair issues K tile 0
    /// at once (the default of session 6); 26 (= 25) and 27 (= 19) record a per-block
    /// timeline ([`prefill_sm90_timeline`]; measurement variants); 28: 25 with an L2 prefetch of
    /// the Q rows of the block one SM count of launch indices later and output rows addressed by
    /// stepping; 29 = 28 recording the timeline; 30 = 25 with the output rows addressed by
    /// stepping (the default since session 7, what `Auto` runs); 31-35 (opt-in, measured no
    /// faster than 30 on an H200, session 7): 31 = 30 with the sequence's context length and
    /// K tile 0's page-table entries loaded at entry (next to the `cu_seqlens` pair), 32 = 31 with
    /// Q loaded by all four producer warps (the K pair's after issuing K tile 0), 33 = 32
    /// recording the timeline, 34 = 31 with the staged output rows of heads >= the first row's
    /// head of the first 64 / G tokens written by one TMA tensor store per 64-dim column block
    /// (the other rows by the threads), 35 = 34 recording the timeline. 36 (opt-in): 23 whose
    /// consumers run each block's tile loop from a compile-time start stage (the block body
    /// instantiated for ring stage 0 and 1, the steady loop unrolled by two), so the K/V wgmma
    /// descriptors stay uniform as in the one-block-per-CTA kernels (session 8: the Q
    /// descriptors too, and each block's metadata loaded a block ahead); on an H200 (session 8)
    /// correct and sanitizer-clean but 4-8% slower than 30 at every benchmark shape: its loop
    /// runs at 30's rate, but each block waits ~6 us after the previous one's output for its Q
    /// rows (reloaded by cp.async only once the half that staged the output is free); 37 = 36
    /// with at most 8 CTAs (a test variant: many blocks per CTA), 38 = 36 recording the timeline
    /// (fields 0-7; field 1 = the block's start in its CTA, after the previous block's epilogue;
    /// 8-11 the producer's block start, Q half free, Q issued, K tile 0 issued).
    /// 39 (session 9) = 31 (30 + EARLY) with Q loaded by the consumer warpgroups themselves
    /// (each its own 64 rows, 16 cp.async per thread, waited for with cp.async.wait_all + a
    /// proxy fence + its named barrier; the producer's V pair starts V tile 0 at once), 40 = 39
    /// recording the timeline (field 10 = consumer warpgroup 0 issued its Q rows), 41 = 39 with
    /// the staged epilogue's shared-memory writes done by `stmatrix` (16 per thread instead of 64
    /// 4-byte stores). 42 = 31 with Q loaded by TMA (three descriptors of q: boxes of whole
    /// tokens and single rows for the partial first / last token of a row block; the tensor maps
    /// prefetched at entry; a group above 16 or no tensor-map encoder: 31; without the K / V
    /// maps, i.e. a page size not a multiple of 16, first: 12, as for 30 / 31), 43 = 42 recording
    /// the timeline (field 10 = the Q boxes issued; 7 / 8 = the Q-issuing warp past its register
    /// release / before its first box). 39-43 opt-in: on an H200 (session 9) correct and sanitizer-clean, 39 / 41 within 1% of
    /// 30, 42 1-2% slower (Q still waited for ~3.9 us per row block, as in 30).
    /// 44 (session 10) = 31 with Q by TMA from whole-token boxes only (4 or 8 boxes issued by
    /// one lane; the rows of a partial first / last token by cp.async from another warp; the
    /// barriers set up while the block's metadata loads; any group up to 64, above that or
    /// without the Q encoder: 31), 45 = 44 recording the timeline (7 = the partial rows
    /// issued, 8 = the bounds known, after the barrier sync of 9, 10 = the Q boxes issued).
    /// 46 = 44 issuing K tile 1 and V tile 0 only once Q has landed (the block's first loads
    /// are Q and K tile 0 alone), 47 = 46 recording the timeline (fields as 45). 48 = 44 with
    /// each full K / V tile's boxes issued by one lane with warp-uniform operands (no per-lane
    /// issue loop), 49 = 48 recording the timeline (fields as 45), 50 = 48 recording the timeline
    /// with fields 7 / 8 = K tile 0's issuer past its register release / before its first box,
    /// 51 = 48 with K tile 0's operands prepared at entry and its boxes issued before anything
    /// else of the producer (session 10: correct and memcheck-clean on the small cases on an
    /// H200, not timed), 52 = 51 recording the timeline (fields as 50). 53 (session 11) = 51 with
    /// each row block's sequence bounds, context length and tile 0's page entries taken from the
    /// launch parameters (filled from `SeqBatch`'s host copies; more than 64 sequences: 51), 54 =
    /// 53 recording the timeline (fields as 52), 55 = 53 with Q's boxes and a full K tile 0
    /// issued before the row block's barrier sync by the two threads that set up their
    /// barriers, 56 = 55 recording the timeline (fields as 54). 53 / 55 on an H200 (session 11,
    /// docs/benchmarks/2026-12-02-attn-s11.md): correct in every test, memcheck / racecheck clean,
    /// but no faster than 48 (varlen 8 x 2048 within 1%: Q and K tile 0 land no sooner). 57
    /// (session 11, reworked in session 12) = 48 as a persistent kernel (one CTA per SM walking
    /// the heaviest-first row-block list in snake order, the K / V ring, barrier phases and
    /// ping-pong turns running on across row blocks; the next row block's Q and K tile 0 load
    /// under the current one's last PV product and epilogue, which stores O from the
    /// accumulators by 16-byte stores; lists of fewer than 4 row blocks per SM run 48), 58 = 57
    /// always persistent and recording the timeline (fields per row block at its list index: 0-6
    /// as 49, 9 = the Q tile released, 10 = the Q boxes issued, 11 = K tile 0 issued). On an
    /// H200 (session 12, docs/benchmarks/2026-12-02-attn-prefill-s12.md): correct in every test,
    /// memcheck / racecheck clean, the row-block start hidden (-3.4 us per row block), but the
    /// K / V tile loop runs 6-10% slower than 48's (same SASS loop): varlen 8 x 2048 = 48, 8k /
    /// 32k squares 4-8% slower. 59 / 60 (session 12) = 57 / 58 with the K / V boxes' kv-head
    /// coordinate made warp-uniform in the producer (57 / 58 move it to a uniform register
    /// inside each box's issue: 45 R2UR in the tile's issue path vs 48's 8); on an H200 (same
    /// document): correct in every prefill test, memcheck / racecheck clean, K / V loop per
    /// tile +1.7% / +3.1% over 48's at 8k / varlen (57: +6%), varlen 8 x 2048 -3.0% vs 48 back
    /// to back, 8k / 32k squares 0.4-3.5% slower. 61-64 (session 13) = 48 / 49 / 59 / 60 with
    /// the sequence-grouped block order (SG): row blocks walk groups of consecutive sequences
    /// one group after the other (48's heaviest-first order inside a group; the group's K / V
    /// within 8 MiB and at least one wave of row blocks; one group = the batch = 48's order, so
    /// single-sequence shapes are unchanged), so a group's K / V stays in L2 instead of every
    /// wave streaming the whole batch's K / V from DRAM (`DELTAKIT_ATTN_SEQ_GROUP=<n>` sets the
    /// sequences per group, a test / measurement aid); 62 / 64 record the timeline (as 49 /
    /// 58); 63 runs 61 below 4 row blocks per SM or for a K / V span above 4096 positions. On
    /// an H200 (docs/benchmarks/2026-12-02-attn-prefill-s13.md): correct in every test,
    /// memcheck / racecheck clean; 61 vs 48 at varlen 8 x 2048 (27B TP1): L2 hit rate 88.5 vs
    /// 65.6%, DRAM reads 270 vs 956 MB, -6.4% back to back / -5.1% do_bench (0.94x / 0.86x torch
    /// SDPA), every other shape within noise; 63 is 0.4-4.5% slower than 59 at varlen (the
    /// persistent list's static snake assignment balances a heaviest-first list, not the
    /// grouped one; not promoted). 44-64 opt-in except 61 (the default since session 13; 48 in
    /// sessions 10-12).
    /// Same results up to rounding. Values above 64 are rejected ([`crate::Error::Shape`] naming
    /// `kernel`).
    Sm90Variant(u8),
    /// The portable Triton AOT kernel.
    Triton,
}

/// The sm_90a kernel's consumer schedule argument: 1 = ping-pong, 0 = free-running (ping-pong
/// measured 1-2.5% faster at every issue-14 shape on an H200, 2026-12-01). Tile variants >= 10
/// (the defaults among them) carry their own schedule and ignore it.
const SM90_DEFAULT_SCHEDULE: i32 = 1;

/// The sm_90a kernel's default tile configuration at head dim 256 (see
/// [`PrefillKernel::Sm90Variant`]): 61 since session 13 = 48 (below) with the sequence-grouped
/// block order (groups of consecutive sequences whose K / V fits 8 MiB run one after the other,
/// 48's heaviest-first order inside each; single-sequence shapes keep 48's order). On an H200
/// (2026-12-02, session 13, docs/benchmarks/2026-12-02-attn-prefill-s13.md), in a call with it as
/// the default: every test of tests/attn.rs passed, memcheck / racecheck clean; against 48 in the
/// same call: varlen 8 x 2048 -6.4% back to back / -5.1% do_bench (0.94x / 0.86x torch SDPA),
/// the other ten shapes within -1.9..+0.7% (same order and steady loop). 48 in sessions 10-12;
/// before it 30 = 25 (19 -- 7 with the split TMA producer, the ordered
/// softmax, the LPT block order and the staged output, ping-pong -- with Q loaded by the V
/// producer pair so K tile 0 issues at once) with the output rows addressed by stepping instead
/// of a division per row. On an H200 (2026-12-01, session 7, docs/benchmarks/2026-12-01-attn-s7.md)
/// correct in every test, memcheck/racecheck clean; against 25 in the same runs: varlen 8 x 2048
/// +0.1% / +1.5%, the square shapes within -0.1..+1% (best of two samples), epilogue -0.21 us per
/// row block; 0.94-1.37x torch SDPA at the issue-14 square shapes, 0.80x on varlen, 2.1x chunked.
/// (25 was the default in session 6.) Since session 10: 48 = 30 with EARLY (ctx_lens and K tile 0's
/// page entries at entry), Q by TMA from whole-token boxes issued by one lane (partial-token rows
/// by cp.async) and every full K / V tile's boxes issued by one lane with warp-uniform operands.
/// On an H200 (2026-12-02, docs/benchmarks/2026-12-02-attn-s10.md) every prefill test passed under
/// it, memcheck / racecheck clean; against 30 in the same call (best of two, back to back):
/// varlen 8 x 2048 863 vs 878 us (-1.7%), chunked -1.7%, 8k / 32k squares -1.1..-2.3%, 2k within
/// -2.6..+0.2% (+0.2% = 0.2 us at 27B TP1 2k; a 2k recheck, best of three: -0.4..-1.5%).
const SM90_DEFAULT_VARIANT: i32 = 61;

/// Words per row block in [`prefill_sm90_timeline`].
pub const PREFILL_TIMELINE_FIELDS: usize = 12;

/// Measurement hook of the sm_90a timeline tile variants 26 / 27 / 29 / 33 / 35 / 38 / 40 / 43 / 45 /
/// 47 / 49 / 50 / 52 / 54 / 56 / 58 / 60 / 62 / 64
/// ([`PrefillKernel::Sm90Variant`]): the per-row-block records of the launches since the last
/// call, [`PREFILL_TIMELINE_FIELDS`] words per block at its linear launch index (at most 16384
/// blocks are recorded): 0 = SM id | K/V tiles << 32, then `%globaltimer` nanoseconds at entry,
/// consumer warpgroup 0 has its Q rows, its first QK^T done, its last PV done, warpgroup 0 / 1
/// output stored, the producer's thread 0 done issuing, thread 0 has the sequence bounds and
/// context length, thread 0 past the barrier-init `__syncthreads`, the warp loading warpgroup
/// 0's first Q rows done issuing them, K tile 0 issued (38, the persistent kernel: field 1 =
/// the block's start in its CTA, 7 = 1, 8-11 = the producer's block start, Q half 0 free, its Q
/// rows issued, K tile 0 issued; 40: field 10 = consumer warpgroup 0 issued its Q rows; 43: 10 =
/// the Q boxes issued, 7 / 8 = the Q-issuing warp past its register release / before its first
/// box; 45 / 47 / 49: 7 = the partial-token Q rows issued, 8 = the bounds known (after the barrier sync of
/// 9), 10 = the Q boxes issued; 50 / 52 / 54 / 56: as 49 but 7 / 8 = K tile 0's issuer past its register
/// release / before its first box; 58 / 64, the persistent kernel: see its variant; 62 as 49); all-zero records = blocks not run (or without rows). Returns the first `blocks` records and clears the device buffer (synchronizes
/// the device: synchronize the launching stream first). Not used by the library.
///
/// # Errors
/// [`Error::Launch`] from the copy (e.g. no device).
pub fn prefill_sm90_timeline(blocks: usize) -> Result<Vec<u64>> {
    const OP: &str = "attn.prefill_sm90_timeline";
    let words = blocks.min(16_384) * PREFILL_TIMELINE_FIELDS;
    let mut host = vec![0u64; words];
    // SAFETY: `host` holds `words` u64 and the call writes at most that many.
    let status = unsafe {
        ffi::dk_attn_prefill_sm90_timeline(
            host.as_mut_ptr(),
            validate::i64_of(OP, "blocks", words)?,
        )
    };
    check(OP, status)?;
    Ok(host)
}

/// The largest tile variant `dk_attn_prefill_sm90` accepts.
const SM90_MAX_VARIANT: u8 = 64;

/// [`prefill`] with an explicit kernel choice (tests and benches compare both paths in one
/// process; `DELTAKIT_ATTN_PREFILL` is not read). Same arguments, semantics and errors.
///
/// # Errors
/// As [`prefill`].
#[allow(clippy::too_many_arguments, clippy::too_many_lines)] // validation + two kernel paths
pub fn prefill_with<I: DevicePtr<i32>>(
    kernel: PrefillKernel,
    stream: &CudaStream,
    q: &impl DevicePtr<bf16>,
    k_cache: &impl DevicePtr<bf16>,
    v_cache: &impl DevicePtr<bf16>,
    dims: AttnDims,
    kv: PagedKv,
    batch: &SeqBatch<'_, I>,
    scale: Option<f32>,
    out: &mut impl DevicePtrMut<bf16>,
) -> Result<()> {
    const OP: &str = "attn.prefill";
    let width = check_dims(OP, dims)?;
    if let PrefillKernel::Sm90Variant(v) = kernel {
        if v > SM90_MAX_VARIANT {
            return Err(Error::shape(OP, "kernel", "an sm90 tile variant in 0..=64", v));
        }
    }
    let t = tokens_of(OP, batch.host_cu_seqlens)?;
    let q_len = validate::product(OP, "q", &[t, width.q])?;
    validate::len(OP, "q", q.len(), q_len)?;
    validate::len(OP, "out", out.len(), q_len)?;
    let clen = cache_len(OP, kv, width)?;
    validate::len(OP, "k_cache", k_cache.len(), clen)?;
    validate::len(OP, "v_cache", v_cache.len(), clen)?;
    let (n, longest) = check_batch(OP, batch, kv, t)?;
    let scale = scale.unwrap_or(1.0 / (dims.head_dim as f32).sqrt());
    if !scale.is_finite() {
        return Err(Error::shape(OP, "scale", "finite", scale));
    }
    same_context(OP, "q", stream, q)?;
    same_context(OP, "k_cache", stream, k_cache)?;
    same_context(OP, "v_cache", stream, v_cache)?;
    same_context(OP, "cu_seqlens", stream, batch.cu_seqlens)?;
    same_context(OP, "ctx_lens", stream, batch.ctx_lens)?;
    same_context(OP, "page_table", stream, batch.page_table)?;
    same_context(OP, "out", stream, out)?;
    if t == 0 {
        return Ok(());
    }
    let max_q_blocks = longest.div_ceil(PREFILL_BLOCK_M).max(1);
    let grid_x = u32::try_from(n * max_q_blocks).map_err(|_| {
        Error::shape(OP, "cu_seqlens", "a grid of at most u32::MAX programs", n * max_q_blocks)
    })?;
    bind(stream)?;
    let (qp, _g1) = q.device_ptr(stream);
    let (kp, _g2) = k_cache.device_ptr(stream);
    let (vp, _g3) = v_cache.device_ptr(stream);
    let (cup, _g4) = batch.cu_seqlens.device_ptr(stream);
    let (ctxp, _g5) = batch.ctx_lens.device_ptr(stream);
    let (ptp, _g6) = batch.page_table.device_ptr(stream);
    let (op, _g7) = out.device_ptr_mut(stream);
    for (arg, p) in [("q", qp), ("k_cache", kp), ("v_cache", vp), ("out", op)] {
        validate::aligned(OP, arg, p, 16)?;
    }
    let i64_of = |arg, x| validate::i64_of(OP, arg, x);
    if kernel != PrefillKernel::Triton {
        let (schedule, variant) = match kernel {
            PrefillKernel::Sm90PingPong => (1, SM90_DEFAULT_VARIANT),
            PrefillKernel::Sm90Variant(v) => (1, i32::from(v)),
            _ => (SM90_DEFAULT_SCHEDULE, SM90_DEFAULT_VARIANT),
        };
        let params = ffi::DkAttnPrefillSm90Params {
            q: qp,
            k_cache: kp,
            v_cache: vp,
            out: op,
            cu_seqlens: cup,
            ctx_lens: ctxp,
            page_table: ptp,
            num_tokens: i64_of("q", t)?,
            num_seqs: i64_of("cu_seqlens", n)?,
            max_seqlen: i64_of("cu_seqlens", longest.max(1))?,
            n_q_heads: i64_of("dims.n_q_heads", dims.n_q_heads)?,
            n_kv_heads: i64_of("dims.n_kv_heads", dims.n_kv_heads)?,
            head_dim: i64_of("dims.head_dim", dims.head_dim)?,
            page_size: i64_of("kv.page_size", kv.page_size)?,
            max_pages: i64_of("kv.max_pages", kv.max_pages)?,
            num_pages: i64_of("kv.num_pages", kv.num_pages)?,
            scale,
            schedule,
            variant,
            // Host copies (validated above, the lengths the C side reads: N + 1, N, N x
            // max_pages), read during the call by the variants that pass metadata by value.
            host_cu_seqlens: batch.host_cu_seqlens.as_ptr() as u64,
            host_ctx_lens: batch.host_ctx_lens.as_ptr() as u64,
            host_page_table: batch.host_page_table.as_ptr() as u64,
        };
        // SAFETY: live buffers of the checked extents; metadata validated on the host copies; the
        // kernel reads out-of-range page ids as zeros and clamps cu_seqlens. The host slices
        // outlive the call.
        let status = unsafe { ffi::dk_attn_prefill_sm90(&raw const params, raw_stream(stream)) };
        if status != ffi::dk_status::DK_ERR_NO_KERNEL_IMAGE {
            return check(OP, status);
        }
        // The device does not run sm_90a code (or the build lacks it): portable path below.
    }
    // The Triton grid's y extent is the query head count (CUDA: at most 65535).
    let grid_y = grid_y_of(OP, "dims.n_q_heads", dims.n_q_heads)?;
    let launch = match dims.head_dim {
        64 => ffi::dk_triton_attn_prefill_hd64,
        128 => ffi::dk_triton_attn_prefill_hd128,
        _ => ffi::dk_triton_attn_prefill_hd256,
    };
    // SAFETY: live buffers of the checked extents; metadata validated on the host copies; the
    // kernel masks out-of-range page ids and clamps cu_seqlens.
    check(OP, unsafe {
        launch(
            raw_stream(stream),
            grid_x,
            grid_y,
            1,
            qp,
            kp,
            vp,
            op,
            cup,
            ctxp,
            ptp,
            i64_of("q", t)?,
            i64_of("cu_seqlens", max_q_blocks)?,
            i64_of("kv.max_pages", kv.max_pages)?,
            i64_of("kv.num_pages", kv.num_pages)?,
            i64_of("kv.page_size", kv.page_size)?,
            i64_of("dims.n_q_heads", dims.n_q_heads)?,
            i64_of("dims.n_kv_heads", dims.n_kv_heads)?,
            scale,
        )
    })
}

/// Largest GQA group the decode specializations handle (`BLOCK_G` in the manifest).
pub const DECODE_MAX_GROUP: usize = 16;

/// f32 elements of decode workspace for `rows` rows and `num_splits` context splits: partial
/// outputs `[rows, H_q, splits, hd]` then log-sum-exps `[rows, H_q, splits]`.
/// Saturates at `usize::MAX` (never a workspace that fits) if the product overflows.
#[must_use]
pub fn decode_workspace_len(rows: usize, dims: AttnDims, num_splits: usize) -> usize {
    decode_workspace_checked(rows, dims, num_splits).unwrap_or(usize::MAX)
}

fn decode_workspace_checked(rows: usize, dims: AttnDims, num_splits: usize) -> Option<usize> {
    rows.checked_mul(dims.n_q_heads)?
        .checked_mul(num_splits)?
        .checked_mul(dims.head_dim.checked_add(1)?)
}

/// A CUDA grid's y extent (at most 65535) from a head count, or [`Error::Shape`] naming `arg`.
fn grid_y_of(op: &'static str, arg: &'static str, n: usize) -> Result<u32> {
    u32::try_from(n)
        .ok()
        .filter(|&y| y <= 65_535)
        .ok_or_else(|| Error::shape(op, arg, "<= 65535 (a CUDA grid's y extent)", n))
}

/// A split count that fills an H200 (132 SMs, ~2 waves) for `rows` rows, capped so every split
/// covers at least 64 positions of `max_ctx` (and at 128 splits): `rows * splits` stays within
/// `rows + ceil(264 / H_kv)`, the bound the engine's capacity plan reserves workspace for. Fix it
/// per CUDA-graph bucket. (The 64-position floor, from 256 before, was chosen from a split sweep
/// on an H200: rows 1 at 4k context read 1.5x faster; docs/benchmarks/2026-12-01-attn-prefill-sm90.md.)
#[must_use]
pub fn decode_splits(rows: usize, dims: AttnDims, max_ctx: usize) -> usize {
    // Saturating: a wrapped product (0 for rows = H_kv = 2^32) divided by zero below.
    let programs = rows.max(1).saturating_mul(dims.n_kv_heads.max(1));
    let want = (2 * 132usize).div_ceil(programs);
    want.clamp(1, max_ctx.div_ceil(64).clamp(1, 128))
}

/// [`decode_splits`] raised to at least one split per 1024 positions of `max_ctx`: more loads in
/// flight on long contexts (H200 sweep: 24/4 heads, 32k context, 16 / 64 rows read at 3.2 / 3.5
/// TB/s with 32-40 / 16 splits against 3.0 / 2.6 TB/s with [`decode_splits`]). Its workspace
/// ([`decode_workspace_len`]) grows with `rows * max_ctx / 1024`: size it from this function,
/// not from the `decode_splits` bound.
#[must_use]
pub fn decode_splits_long_context(rows: usize, dims: AttnDims, max_ctx: usize) -> usize {
    decode_splits(rows, dims, max_ctx)
        .max(max_ctx.div_ceil(1024))
        .clamp(1, max_ctx.div_ceil(64).clamp(1, 128))
}

/// Which kernel [`decode`] runs, from `DELTAKIT_ATTN_DECODE` (read once per process): `triton`
/// forces the portable Triton kernels; anything else (or unset) picks the sm_90 CUDA kernel on a
/// device that runs it, else Triton.
#[must_use]
pub fn decode_uses_sm90_kernel_if_possible() -> bool {
    static CHOICE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *CHOICE.get_or_init(|| {
        std::env::var("DELTAKIT_ATTN_DECODE").map_or(true, |v| !v.eq_ignore_ascii_case("triton"))
    })
}

/// Kernel choice for [`decode_with`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeKernel {
    /// The sm_90 CUDA kernel (`dk_attn_decode_sm90`) where the device runs it (compute
    /// capability 9.0 and a build with `90a`), else Triton. Its launcher picks the tile variant
    /// (19 at one CTA per SM, <= 8 splits and head dim 256, since session 12; 0 at one CTA per
    /// SM otherwise; else 3) and may use fewer context splits than `num_splits` (never more; the split
    /// count whose CTAs spread most evenly over the SMs), from rows x kv heads and the SM count
    /// only, so the choice is fixed per CUDA-graph bucket.
    Auto,
    /// The sm_90 CUDA kernel with an explicit tile configuration
    /// (`DkAttnDecodeSm90Params::variant`, ignored at head dim 64), else Triton. Each warp owns 16
    /// positions of every K/V tile. 0-3 load with cp.async (16 B per lane, XOR-swizzled rows),
    /// 4-7 with the bulk-copy engine (one `cp.async.bulk` per row, mbarrier byte counts, padded
    /// rows). hd 256: 0 = 4 warps x 3 stages; 1 = 2 x 3 (two CTAs per SM); 2 = 4 x 2; 3 = 2 x 2
    /// (three CTAs per SM); 4 = bulk 4 x 3; 5 = bulk 2 x 3; 6 = bulk 2 x 2; 7 = bulk 1 x 6. hd 128:
    /// 0 = 4 x 4; 1 = 2 x 6; 2 = 4 x 3; 3 = 2 x 4; 4-7 the same with bulk copies. 8-11: the tiles
    /// of 0-3 where, with 2..=8 splits, the splits of a (row, kv head) run as one thread-block
    /// cluster and combine their partial results through distributed shared memory (no merge
    /// launch, the workspace is not written; more splits run 0-3). 12: variant 0 recording a
    /// per-CTA timeline ([`decode_sm90_timeline`]; measurement; 0 at head dim 128). 13 (session 8,
    /// dynamic split): the tiles of 0 where C consecutive splits of a (row, kv head) (C = the
    /// largest divisor of the split count in 2..=8 whose clusters all fit on the device at once)
    /// run as one thread-block cluster and share their ranges dynamically (each warp claims the
    /// next 16-position chunk from a counter in the shared memory of the cluster's first CTA, set
    /// up anew by every launch: no state kept between launches, graph-safe, same workspace);
    /// partial results and merge as 0 (which positions a split summed varies from run to run);
    /// no such C (or one split): 0. H200, session 8: correct and sanitizer-clean, but 1-3% slower
    /// than 0 at a full wave and ~10% with few CTAs (opt-in). 14 / 15 (session 9, global dynamic
    /// split): the tiles of 0 / 3 where all splits of a (row, kv head) share its whole context
    /// dynamically, each warp claiming the next 16-position chunk from a counter in global memory
    /// (module-owned, zero at load, put back to zero by the last split CTA of every launch: no
    /// workspace change; one split or more than 4096 (row, kv head) pairs: 0 / 3). The counters
    /// form 64 regions handed out round-robin per launch (a captured graph keeps the region of
    /// its capture), so these variants are for one stream at a time: two launches in flight at
    /// once on different streams may share a region and give wrong results (measurement only);
    /// H200 (session 9): 7-10% slower than 0 / 3 (opt-in). 16 / 17: 14 / 15 with a static
    /// prefix (the first 3/4 of the chunks dealt round-robin to the group's warps without
    /// atomics, only the rest claimed): 5-6% slower than 0 / 3 (opt-in). 18-21 (session 12,
    /// strided splits): split `s` of `S` takes the tiles `s, s + S, s + 2S, ...` of the context, so
    /// the page-table entries of its first tiles are loaded at entry together with `seq_lens`
    /// (one dependent round trip less before the first K/V copies), and (18-20) the end-of-CTA
    /// combine writes only the accumulator rows below `G * T`: 18 = tiles of 0, 19 = tiles of
    /// 2, 20 = tiles of 3, 21 = tiles of 0 without the lean combine, 22 = 18 recording the
    /// timeline of 12 (measurement; 0 at head dim 128). H200 (session 12): 18 0.7% faster than 0
    /// at 27B TP2 4k / 16 rows and 0.3-3% at most shapes, but 16% slower at TP2 4k / 1 row (62
    /// splits of 64 tiles all live, where contiguous ranges leave 30 empty); 19 1.5% faster than
    /// 0 at TP2 4k / 16 (opt-in). 23 / 24: the strided split over the contiguous split's live
    /// split count (`L = ceil(tiles / ceil(tiles / S))`; only tile 0 looked up at entry) + lean
    /// combine, tiles of 2 / 0; H200 (session 12): correct and sanitizer-clean; 23 0.2-1.3%
    /// faster than 0 at the rows-16 / 64 shapes of one CTA per SM, 24 -2..+0.8% at rows 1. Auto
    /// picks 19 at one CTA per SM, <= 8 splits and head dim 256 (session 12's end check; 0.6-1.5%
    /// faster than 0 at those shapes: at <= 8 splits every split is live anyway). Same results up
    /// to rounding. Values above 24 are rejected ([`crate::Error::Shape`] naming `kernel`).
    Sm90Variant(u8),
    /// The portable Triton AOT kernels (one new token per row only).
    Triton,
}

/// The largest tile variant `dk_attn_decode_sm90` accepts.
const DECODE_SM90_MAX_VARIANT: u8 = 24;

/// Words per split CTA (and per merge block) in [`decode_sm90_timeline`].
pub const DECODE_TIMELINE_FIELDS: usize = 6;

/// Measurement hook of the sm_90 decode variants 12 / 22 ([`DecodeKernel::Sm90Variant`]): the
/// records of their launches since the last call, [`DECODE_TIMELINE_FIELDS`] words per split CTA at its
/// linear grid index (row fastest, then kv head, then split; at most 4096): 0 = SM id | tiles <<
/// 32, then `%globaltimer` nanoseconds at entry, after the grid-dependency wait, Q landed, main
/// loop done, partials written; followed by 4096 records of the merge blocks (entry, after the
/// wait, output written, 0, 0, 0). Returns the first `ctas` split records and the first
/// `merge_blocks` merge records (as two vectors) and clears the device buffer (synchronizes the
/// device: synchronize the launching stream first). Not used by the library.
///
/// # Errors
/// [`Error::Launch`] from the copy (e.g. no device).
pub fn decode_sm90_timeline(ctas: usize, merge_blocks: usize) -> Result<(Vec<u64>, Vec<u64>)> {
    const OP: &str = "attn.decode_sm90_timeline";
    const CAP: usize = 4096;
    let mut host = vec![0u64; 2 * CAP * DECODE_TIMELINE_FIELDS];
    // SAFETY: `host` holds the whole device buffer (2 x 4096 x 6 words).
    let status = unsafe {
        ffi::dk_attn_decode_sm90_timeline(
            host.as_mut_ptr(),
            validate::i64_of(OP, "ctas", host.len())?,
        )
    };
    check(OP, status)?;
    let f = DECODE_TIMELINE_FIELDS;
    let split = host[..ctas.min(CAP) * f].to_vec();
    let merge = host[CAP * f..(CAP + merge_blocks.min(CAP)) * f].to_vec();
    Ok((split, merge))
}

/// `DkAttnDecodeSm90Params::variant` of [`DecodeKernel::Auto`]: the launcher picks variant 19, 0
/// or 3 and a split count <= `num_splits` from rows x kv heads and the SM count (H200 sweeps,
/// docs/benchmarks/2026-12-01-attn-s3.md, docs/benchmarks/2026-12-02-attn-decode-s12.md).
const DECODE_SM90_AUTO_VARIANT: i32 = -1;

/// Paged decode attention, split-K ("flash decoding"): row `i`'s single query (absolute position
/// `seq_lens[i] - 1`, its k/v already in the cache) attends to positions `0..seq_lens[i]`; all
/// query heads of a kv head are processed together (group <= [`DECODE_MAX_GROUP`]), so each K/V
/// byte is read once per group; the context is cut into up to `num_splits` ranges whose partial
/// results are merged by log-sum-exp. `seq_lens[i] == -1`: padding row, zero output. Equals the
/// last row of [`prefill`] over the same context. Kernels: on a compute-capability 9.0 device of a
/// build with `90a`, the CUDA C++ `dk_attn_decode_sm90` (`csrc/attn/decode_sm90.cu`: per-warp
/// cp.async pipelines of whole K/V rows, mma.sync, f32 online softmax; its own split count <=
/// `num_splits` and tile variant, see [`DecodeKernel::Auto`]; one merge launch, programmatic
/// dependent, when more than one split runs); elsewhere, or with
/// `DELTAKIT_ATTN_DECODE=triton`, the Triton AOT `attn_decode_hd*` + `attn_decode_merge_hd*`
/// (same semantics and workspace). Mirrors HF `Qwen3_5Attention`'s `sdpa` over the cache for the
/// newest token. CPU twin: `deltakit_ref::attn::decode_paged`.
///
/// Graph-safe: the kernels read `seq_lens` and the page table from the device arrays; the host
/// copies are only validated, and `num_splits` fixes the grid (fix it per CUDA-graph bucket).
///
/// Shapes: `q`, `out` bf16 `[N, H_q, hd]`; `seq_lens` i32 `[N]` (device + host copy);
/// `page_table` i32 `[N, max_pages]` (device + host copy); `workspace` f32 of at least
/// [`decode_workspace_len`] elements (caller-provided, 16-byte aligned).
///
/// # Errors
/// [`Error::Shape`] for lengths, `seq_lens` (0 or < -1), page ids, `num_splits` (1..=1024) or a
/// short workspace; [`Error::Unsupported`] for a group over [`DECODE_MAX_GROUP`] or another head
/// dim; [`Error::DeviceMismatch`], [`Error::Launch`] / [`Error::Driver`].
#[allow(clippy::too_many_arguments)]
pub fn decode(
    stream: &CudaStream,
    q: &impl DevicePtr<bf16>,
    k_cache: &impl DevicePtr<bf16>,
    v_cache: &impl DevicePtr<bf16>,
    dims: AttnDims,
    kv: PagedKv,
    seq_lens: (&impl DevicePtr<i32>, &[i32]),
    page_table: (&impl DevicePtr<i32>, &[i32]),
    scale: Option<f32>,
    num_splits: usize,
    workspace: &mut impl DevicePtrMut<f32>,
    out: &mut impl DevicePtrMut<bf16>,
) -> Result<()> {
    let kernel = if decode_uses_sm90_kernel_if_possible() {
        DecodeKernel::Auto
    } else {
        DecodeKernel::Triton
    };
    decode_with(
        kernel, stream, q, k_cache, v_cache, dims, kv, seq_lens, page_table, scale, num_splits,
        workspace, out,
    )
}

/// [`decode`] with an explicit kernel choice (tests and benches compare the kernels in one
/// process; `DELTAKIT_ATTN_DECODE` is not read). Same arguments, semantics and errors, plus
/// [`Error::Shape`] naming `kernel` for a tile variant above 24.
///
/// # Errors
/// As [`decode`].
#[allow(clippy::too_many_arguments)]
pub fn decode_with(
    kernel: DecodeKernel,
    stream: &CudaStream,
    q: &impl DevicePtr<bf16>,
    k_cache: &impl DevicePtr<bf16>,
    v_cache: &impl DevicePtr<bf16>,
    dims: AttnDims,
    kv: PagedKv,
    seq_lens: (&impl DevicePtr<i32>, &[i32]),
    page_table: (&impl DevicePtr<i32>, &[i32]),
    scale: Option<f32>,
    num_splits: usize,
    workspace: &mut impl DevicePtrMut<f32>,
    out: &mut impl DevicePtrMut<bf16>,
) -> Result<()> {
    decode_impl(
        "attn.decode",
        kernel,
        stream,
        q,
        k_cache,
        v_cache,
        dims,
        kv,
        seq_lens,
        page_table,
        1,
        scale,
        num_splits,
        workspace,
        out,
    )
}

/// Multi-token paged decode (speculative verification): row `i` has `tokens_per_row = T` new
/// tokens at absolute positions `seq_lens[i] - T + t` (`t = 0..T`, their k/v already in the
/// cache); new token `t` attends to positions `0..=seq_lens[i] - T + t` (causal among the new
/// tokens), split-K over the context as [`decode`]. Equals [`prefill`] of the `T` tokens over a
/// prior context of `seq_lens[i] - T`. `seq_lens[i] == -1`: padding row, zero output. sm_90 CUDA
/// kernel only (`dk_attn_decode_sm90` with `n_new = T`); `T = 1` is [`decode`].
///
/// Shapes: `q`, `out` bf16 `[N * T, H_q, hd]` (the row's `T` tokens consecutive); `seq_lens` i32
/// `[N]` (each -1 or >= T); `page_table` i32 `[N, max_pages]`; `workspace` f32 of at least
/// `decode_workspace_len(N * T, dims, num_splits)` elements.
///
/// # Errors
/// As [`decode`], plus [`Error::Shape`] for `tokens_per_row` (0, or `G * T > 16`) and a
/// `seq_lens[i]` in `0..T`; [`Error::Unsupported`] when the device or build has no sm_90 kernel
/// (no portable multi-token path).
#[allow(clippy::too_many_arguments)]
pub fn decode_multi_token(
    stream: &CudaStream,
    q: &impl DevicePtr<bf16>,
    k_cache: &impl DevicePtr<bf16>,
    v_cache: &impl DevicePtr<bf16>,
    dims: AttnDims,
    kv: PagedKv,
    seq_lens: (&impl DevicePtr<i32>, &[i32]),
    page_table: (&impl DevicePtr<i32>, &[i32]),
    tokens_per_row: usize,
    scale: Option<f32>,
    num_splits: usize,
    workspace: &mut impl DevicePtrMut<f32>,
    out: &mut impl DevicePtrMut<bf16>,
) -> Result<()> {
    decode_multi_token_with(
        DecodeKernel::Auto,
        stream,
        q,
        k_cache,
        v_cache,
        dims,
        kv,
        seq_lens,
        page_table,
        tokens_per_row,
        scale,
        num_splits,
        workspace,
        out,
    )
}

/// [`decode_multi_token`] with an explicit kernel choice ([`DecodeKernel::Triton`] returns
/// [`Error::Unsupported`] for `tokens_per_row > 1`). Same arguments, semantics and errors.
///
/// # Errors
/// As [`decode_multi_token`].
#[allow(clippy::too_many_arguments)]
pub fn decode_multi_token_with(
    kernel: DecodeKernel,
    stream: &CudaStream,
    q: &impl DevicePtr<bf16>,
    k_cache: &impl DevicePtr<bf16>,
    v_cache: &impl DevicePtr<bf16>,
    dims: AttnDims,
    kv: PagedKv,
    seq_lens: (&impl DevicePtr<i32>, &[i32]),
    page_table: (&impl DevicePtr<i32>, &[i32]),
    tokens_per_row: usize,
    scale: Option<f32>,
    num_splits: usize,
    workspace: &mut impl DevicePtrMut<f32>,
    out: &mut impl DevicePtrMut<bf16>,
) -> Result<()> {
    decode_impl(
        "attn.decode_multi_token",
        kernel,
        stream,
        q,
        k_cache,
        v_cache,
        dims,
        kv,
        seq_lens,
        page_table,
        tokens_per_row,
        scale,
        num_splits,
        workspace,
        out,
    )
}

#[allow(clippy::too_many_arguments, clippy::too_many_lines)] // validation + two kernel paths
fn decode_impl(
    op: &'static str,
    kernel: DecodeKernel,
    stream: &CudaStream,
    q: &impl DevicePtr<bf16>,
    k_cache: &impl DevicePtr<bf16>,
    v_cache: &impl DevicePtr<bf16>,
    dims: AttnDims,
    kv: PagedKv,
    seq_lens: (&impl DevicePtr<i32>, &[i32]),
    page_table: (&impl DevicePtr<i32>, &[i32]),
    n_new: usize,
    scale: Option<f32>,
    num_splits: usize,
    workspace: &mut impl DevicePtrMut<f32>,
    out: &mut impl DevicePtrMut<bf16>,
) -> Result<()> {
    let width = check_dims(op, dims)?;
    let group = dims.n_q_heads / dims.n_kv_heads;
    if group > DECODE_MAX_GROUP {
        return Err(Error::Unsupported {
            op,
            what: format!("GQA group {group} > {DECODE_MAX_GROUP}"),
        });
    }
    if n_new == 0 || group * n_new > DECODE_MAX_GROUP {
        return Err(Error::shape(
            op,
            "tokens_per_row",
            format!("1..={} (GQA group {group} x tokens <= 16)", DECODE_MAX_GROUP / group),
            n_new,
        ));
    }
    if let DecodeKernel::Sm90Variant(v) = kernel {
        if v > DECODE_SM90_MAX_VARIANT {
            return Err(Error::shape(op, "kernel", "an sm90 decode variant in 0..=24", v));
        }
    }
    let n = seq_lens.1.len();
    let tokens = validate::product(op, "seq_lens", &[n, n_new])?;
    let q_len = validate::product(op, "q", &[tokens, width.q])?;
    validate::len(op, "q", q.len(), q_len)?;
    validate::len(op, "out", out.len(), q_len)?;
    validate::len(op, "seq_lens", seq_lens.0.len(), n)?;
    if !(1..=1024).contains(&num_splits) {
        return Err(Error::shape(op, "num_splits", "1..=1024", num_splits));
    }
    let need = decode_workspace_checked(tokens, dims, num_splits).ok_or_else(|| {
        Error::shape(
            op,
            "workspace",
            "a size that fits in usize",
            format!("{tokens} rows x {dims:?} x {num_splits} splits"),
        )
    })?;
    if workspace.len() < need {
        return Err(Error::shape(op, "workspace", format!("len >= {need}"), workspace.len()));
    }
    let clen = cache_len(op, kv, width)?;
    validate::len(op, "k_cache", k_cache.len(), clen)?;
    validate::len(op, "v_cache", v_cache.len(), clen)?;
    // Each live row's seq_lens[i] positions need valid pages (no host allocation per call).
    let min_len = i32::try_from(n_new).unwrap_or(i32::MAX);
    if let Some((i, &s)) =
        seq_lens.1.iter().enumerate().find(|(_, &s)| s < -1 || (s != -1 && s < min_len))
    {
        return Err(Error::shape(
            op,
            "seq_lens",
            format!("-1 or >= {min_len} (the row's new tokens)"),
            format!("seq_lens[{i}] = {s}"),
        ));
    }
    if n > 0 {
        check_table_geometry(op, kv, n, page_table.1)?;
        for (i, &s) in seq_lens.1.iter().enumerate() {
            if s > 0 {
                check_seq_pages(op, i, s as usize, page_table.1, kv)?;
            }
        }
        validate::len(op, "page_table", page_table.0.len(), n * kv.max_pages)?;
    }
    let scale = scale.unwrap_or(1.0 / (dims.head_dim as f32).sqrt());
    if !scale.is_finite() {
        return Err(Error::shape(op, "scale", "finite", scale));
    }
    same_context(op, "q", stream, q)?;
    same_context(op, "k_cache", stream, k_cache)?;
    same_context(op, "v_cache", stream, v_cache)?;
    same_context(op, "seq_lens", stream, seq_lens.0)?;
    same_context(op, "page_table", stream, page_table.0)?;
    same_context(op, "workspace", stream, workspace)?;
    same_context(op, "out", stream, out)?;
    if n == 0 {
        return Ok(());
    }
    let rows =
        u32::try_from(n).map_err(|_| Error::shape(op, "seq_lens", "at most u32::MAX rows", n))?;
    bind(stream)?;
    let (qp, _g1) = q.device_ptr(stream);
    let (kp, _g2) = k_cache.device_ptr(stream);
    let (vp, _g3) = v_cache.device_ptr(stream);
    let (slp, _g4) = seq_lens.0.device_ptr(stream);
    let (ptp, _g5) = page_table.0.device_ptr(stream);
    let (wsp, _g6) = workspace.device_ptr_mut(stream);
    let (outp, _g7) = out.device_ptr_mut(stream);
    for (arg, p) in [("q", qp), ("k_cache", kp), ("v_cache", vp), ("workspace", wsp), ("out", outp)]
    {
        validate::aligned(op, arg, p, 16)?;
    }
    let i64_of = |arg, x| validate::i64_of(op, arg, x);
    if kernel != DecodeKernel::Triton {
        let variant = match kernel {
            DecodeKernel::Sm90Variant(v) => i32::from(v),
            _ => DECODE_SM90_AUTO_VARIANT,
        };
        let params = ffi::DkAttnDecodeSm90Params {
            q: qp,
            k_cache: kp,
            v_cache: vp,
            out: outp,
            seq_lens: slp,
            page_table: ptp,
            workspace: wsp,
            num_rows: i64_of("seq_lens", n)?,
            n_new: i64_of("tokens_per_row", n_new)?,
            n_q_heads: i64_of("dims.n_q_heads", dims.n_q_heads)?,
            n_kv_heads: i64_of("dims.n_kv_heads", dims.n_kv_heads)?,
            head_dim: i64_of("dims.head_dim", dims.head_dim)?,
            page_size: i64_of("kv.page_size", kv.page_size)?,
            max_pages: i64_of("kv.max_pages", kv.max_pages)?,
            num_pages: i64_of("kv.num_pages", kv.num_pages)?,
            num_splits: i64_of("num_splits", num_splits)?,
            scale,
            variant,
        };
        // SAFETY: live buffers of the checked extents (workspace >= decode_workspace_len);
        // metadata validated on the host copies; the kernel reads out-of-range page ids as zeros.
        let status = unsafe { ffi::dk_attn_decode_sm90(&raw const params, raw_stream(stream)) };
        if status != ffi::dk_status::DK_ERR_NO_KERNEL_IMAGE {
            return check(op, status);
        }
        // The device does not run sm_90 code (or the build lacks it): portable path below.
    }
    if n_new != 1 {
        return Err(Error::Unsupported {
            op,
            what: "more than one new token per row without the sm_90 kernel".into(),
        });
    }
    // Fits: the workspace holds n * H_q * splits * (hd + 1) f32 (checked above).
    let lse_off = (n * dims.n_q_heads * num_splits * dims.head_dim * 4) as u64;
    // The Triton grids: (rows, H_kv, splits) for the partials, (rows, H_q, 1) for the merge.
    let (grid_kv, grid_q) = (
        grid_y_of(op, "dims.n_kv_heads", dims.n_kv_heads)?,
        grid_y_of(op, "dims.n_q_heads", dims.n_q_heads)?,
    );
    let (dec, merge): (DecodeFn, MergeFn) = match dims.head_dim {
        64 => (ffi::dk_triton_attn_decode_hd64, ffi::dk_triton_attn_decode_merge_hd64),
        128 => (ffi::dk_triton_attn_decode_hd128, ffi::dk_triton_attn_decode_merge_hd128),
        _ => (ffi::dk_triton_attn_decode_hd256, ffi::dk_triton_attn_decode_merge_hd256),
    };
    let hq = i64_of("dims.n_q_heads", dims.n_q_heads)?;
    let splits = i64_of("num_splits", num_splits)?;
    // SAFETY: live buffers of the checked extents (workspace >= decode_workspace_len); metadata
    // validated on the host copies; the kernel masks out-of-range page ids.
    check(op, unsafe {
        dec(
            raw_stream(stream),
            rows,
            grid_kv,
            num_splits as u32,
            qp,
            kp,
            vp,
            wsp,
            wsp + lse_off,
            slp,
            ptp,
            i64_of("kv.max_pages", kv.max_pages)?,
            i64_of("kv.num_pages", kv.num_pages)?,
            i64_of("kv.page_size", kv.page_size)?,
            hq,
            i64_of("dims.n_kv_heads", dims.n_kv_heads)?,
            splits,
            scale,
        )
    })?;
    // SAFETY: as above; reads the partials the previous launch wrote on the same stream.
    check(op, unsafe {
        merge(raw_stream(stream), rows, grid_q, 1, wsp, wsp + lse_off, outp, slp, hq, splits)
    })
}

type DecodeFn = unsafe extern "C" fn(
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
    i64,
    i64,
    i64,
    i64,
    i64,
    i64,
    f32,
) -> ffi::dk_status;
type MergeFn = unsafe extern "C" fn(
    ffi::dk_stream_t,
    u32,
    u32,
    u32,
    u64,
    u64,
    u64,
    u64,
    i64,
    i64,
) -> ffi::dk_status;

#[cfg(test)]
mod tests {
    use super::*;

    const OP: &str = "attn.decode";

    /// Session-11 overflow audit: size products of the attention checks are checked, so absurd
    /// dims are [`Error::Shape`] naming the argument instead of sizes that wrap past the length
    /// checks in release builds (and then launch kernels over buffers of the wrapped size).
    #[test]
    fn head_products_that_overflow_are_shape_errors() {
        // 2^58 heads x 64 = 2^64: wrapped to 0, a zero-length q and cache would have passed.
        let d = AttnDims { n_q_heads: 1 << 58, n_kv_heads: 1 << 58, head_dim: 64 };
        let e = check_dims(OP, d).unwrap_err();
        assert!(matches!(e, Error::Shape { arg: "dims.n_q_heads", .. }), "{e}");
        let d = AttnDims { n_q_heads: 24, n_kv_heads: 4, head_dim: 256 };
        assert_eq!(check_dims(OP, d).unwrap(), Rows { q: 24 * 256, kv: 4 * 256 });
    }

    #[test]
    fn cache_and_page_table_sizes_that_overflow_are_shape_errors() {
        let width = Rows { q: 8 * 128, kv: 2 * 128 };
        let kv = PagedKv { page_size: 1 << 20, num_pages: 1 << 40, max_pages: 1 };
        let e = cache_len(OP, kv, width).unwrap_err();
        assert!(matches!(e, Error::Shape { arg: "kv", .. }), "{e}");
        let kv = PagedKv { page_size: 16, num_pages: 4, max_pages: 1 << 63 };
        // 2 x 2^63 wraps to 0: an empty host table would have passed.
        let e = check_table_geometry(OP, kv, 2, &[]).unwrap_err();
        assert!(matches!(e, Error::Shape { arg: "kv.max_pages", .. }), "{e}");
        let kv = PagedKv { page_size: 16, num_pages: 0, max_pages: 1 };
        let e = check_table_geometry(OP, kv, 1, &[0]).unwrap_err();
        assert!(matches!(e, Error::Shape { arg: "kv", .. }), "{e}");
    }

    #[test]
    fn negative_token_count_is_a_cu_seqlens_error() {
        let e = tokens_of("attn.prefill", &[0, -5]).unwrap_err();
        assert!(matches!(e, Error::Shape { arg: "cu_seqlens", .. }), "{e}");
        assert_eq!(tokens_of("attn.prefill", &[0, 3, 7]).unwrap(), 7);
        assert_eq!(tokens_of("attn.prefill", &[]).unwrap(), 0);
    }

    #[test]
    fn decode_workspace_len_saturates_and_grids_are_bounded() {
        let d = AttnDims { n_q_heads: 1 << 30, n_kv_heads: 1, head_dim: 256 };
        assert_eq!(decode_workspace_len(1 << 30, d, 1024), usize::MAX);
        assert!(decode_workspace_checked(1 << 30, d, 1024).is_none());
        let d = AttnDims { n_q_heads: 8, n_kv_heads: 2, head_dim: 128 };
        assert_eq!(decode_workspace_len(3, d, 4), 3 * 8 * 4 * 129);
        let e = grid_y_of(OP, "dims.n_q_heads", 65_536).unwrap_err();
        assert!(matches!(e, Error::Shape { arg: "dims.n_q_heads", .. }), "{e}");
        assert_eq!(grid_y_of(OP, "dims.n_q_heads", 65_535).unwrap(), 65_535);
    }

    /// `decode_splits` with absurd rows x kv heads: the product saturates (it wrapped to 0 and
    /// divided by zero in release builds).
    #[test]
    fn decode_splits_do_not_divide_by_a_wrapped_zero() {
        let d = AttnDims { n_q_heads: 1 << 32, n_kv_heads: 1 << 32, head_dim: 128 };
        assert_eq!(decode_splits(1 << 32, d, 1 << 20), 1);
        assert_eq!(decode_splits_long_context(1 << 32, d, 1 << 20), 128);
        let d = AttnDims { n_q_heads: 16, n_kv_heads: 4, head_dim: 256 };
        assert_eq!(decode_splits(1, d, 4096), 64);
    }
}
