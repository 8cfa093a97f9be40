//! CPU backend: tensors on the host, ops from `deltakit-ref`, generic over the activation dtype.
//!
//! [`CpuBackend`] (`Cpu<f32>`, the default) keeps weights and activations in f32 (checkpoint bf16
//! is widened exactly at load): the whole forward is the f32 reference math and matches HF's
//! float32 forward of the same (bf16-representable) weights to f32 rounding.
//! [`CpuBf16Backend`] (`Cpu<bf16>`) stores weights and activations in bf16 and rounds where HF's
//! bf16 forward rounds (each `deltakit-ref` op documents its rounding points): the CPU oracle of a
//! bf16 GPU backend. Recurrent state is f32 in both; conv state and the KV cache use `T`.

use std::marker::PhantomData;

use deltakit_ref::{attn, conv1d, gdr, mlp, norm, Elem, Varlen};

use super::{AttnCoreWeights, AttnDims, Backend, GdnDims, GdnMixWeights, StepBatch, StepKind};
use crate::comm::{Communicator, CpuComm};
use crate::error::{EngineError, Result};
use crate::weights::HostTensor;

/// A host tensor `[rows, cols]`, row-major, of element type `T` (f32 or bf16).
#[derive(Clone, Debug, PartialEq)]
pub struct CpuTensor<T = f32> {
    /// Row-major elements.
    pub data: Vec<T>,
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
}

impl<T> CpuTensor<T> {
    fn new(data: Vec<T>, rows: usize, cols: usize) -> Self {
        debug_assert_eq!(data.len(), rows * cols);
        Self { data, rows, cols }
    }
}

/// One GDN layer's state on the CPU.
#[derive(Clone, Debug)]
pub struct CpuGdnState<T = f32> {
    /// f32 `[slots, H_v, K, V]`.
    pub recurrent: Vec<f32>,
    /// `[slots, conv_dim, W-1]` in the activation dtype (raw conv inputs: exact).
    pub conv: Vec<T>,
    dims: GdnDims,
    num_slots: usize,
}

/// One attention layer's paged KV cache on the CPU: each `[pages, page_size, H_kv, hd]`.
#[derive(Clone, Debug)]
pub struct CpuKvCache<T = f32> {
    /// Keys.
    pub k: Vec<T>,
    /// Values.
    pub v: Vec<T>,
}

/// The CPU reference backend (`deltakit-ref`) with activation dtype `T`, optionally one rank of
/// a tensor-parallel group ([`CpuComm`]).
#[derive(Clone, Debug, Default)]
pub struct Cpu<T: Elem = f32> {
    comm: Option<CpuComm>,
    _t: PhantomData<T>,
}

impl<T: Elem> Cpu<T> {
    /// The backend on its own (TP = 1).
    #[must_use]
    pub const fn new() -> Self {
        Self { comm: None, _t: PhantomData }
    }

    /// One rank of a tensor-parallel group: collectives go through `comm`.
    #[must_use]
    pub fn with_comm(comm: CpuComm) -> Self {
        Self { comm: Some(comm), _t: PhantomData }
    }
}

/// The f32 CPU backend: the default, matched against HF's float32 goldens.
pub type CpuBackend = Cpu<f32>;

/// The bf16 CPU backend: HF bf16 rounding emulated, matched against HF's bfloat16 goldens.
pub type CpuBf16Backend = Cpu<half::bf16>;

fn widen<T: Elem>(x: &[T]) -> Vec<f32> {
    x.iter().map(|e| e.to_f32()).collect()
}

fn err(msg: String) -> EngineError {
    EngineError::Backend { backend: "cpu", msg }
}

fn check_cols<T>(op: &str, what: &str, t: &CpuTensor<T>, cols: usize) -> Result<()> {
    if t.cols == cols {
        Ok(())
    } else {
        Err(err(format!("{op}: `{what}` has {} columns, expected {cols}", t.cols)))
    }
}

fn check_rows<T>(op: &str, what: &str, t: &CpuTensor<T>, rows: usize) -> Result<()> {
    if t.rows == rows {
        Ok(())
    } else {
        Err(err(format!("{op}: `{what}` has {} rows, expected {rows}", t.rows)))
    }
}

/// Split a tensor's columns into consecutive blocks of the given widths (copies).
fn split_cols<T: Copy, const N: usize>(t: &CpuTensor<T>, widths: [usize; N]) -> [CpuTensor<T>; N] {
    let mut off = 0;
    widths.map(|w| {
        let data = t
            .data
            .chunks_exact(t.cols.max(1))
            .flat_map(|r| r[off..off + w].iter().copied())
            .collect();
        off += w;
        CpuTensor::new(data, t.rows, w)
    })
}

impl<T: Elem> Cpu<T> {
    /// [`Backend::gdn_mix`] on the separate `qkv`, `z`, `b`, `a` projections.
    #[allow(clippy::too_many_arguments)]
    fn gdn_mix_parts(
        qkv: &CpuTensor<T>,
        z: &CpuTensor<T>,
        b: &CpuTensor<T>,
        a: &CpuTensor<T>,
        w: &GdnMixWeights<CpuTensor<T>>,
        dims: GdnDims,
        batch: &StepBatch,
        state: &mut CpuGdnState<T>,
    ) -> Result<CpuTensor<T>> {
        const OP: &str = "gdn_mix";
        let t = batch.num_tokens();
        let cd = dims.conv_dim();
        check_cols(OP, "qkv", qkv, cd)?;
        check_rows(OP, "qkv", qkv, t)?;
        check_cols(OP, "z", z, dims.h_v * dims.v)?;
        check_rows(OP, "z", z, t)?;
        check_cols(OP, "a", a, dims.h_v)?;
        check_cols(OP, "b", b, dims.h_v)?;
        if state.dims != dims {
            return Err(err(format!("{OP}: state dims {:?} != layer dims {dims:?}", state.dims)));
        }
        let cdims = conv1d::ConvDims { conv_dim: cd, width: dims.conv_kernel };
        let mut conv_out = vec![T::default(); qkv.data.len()];
        match batch.kind {
            StepKind::Prefill => conv1d::prefill(
                &qkv.data,
                &w.conv_w.data,
                None,
                cdims,
                Varlen::new(&batch.cu_seqlens, &batch.slots),
                &mut state.conv,
                &mut conv_out,
            )?,
            StepKind::Decode => conv1d::update(
                &qkv.data,
                &w.conv_w.data,
                None,
                cdims,
                1,
                &batch.slots,
                &mut state.conv,
                &mut conv_out,
            )?,
        }
        // Split the conv output's channels into q | k | v (HF `torch.split` on the last dim).
        let (kd, vd) = (dims.h_k * dims.k, dims.h_v * dims.v);
        let mut q = Vec::with_capacity(t * kd);
        let mut k = Vec::with_capacity(t * kd);
        let mut v = Vec::with_capacity(t * vd);
        for row in conv_out.chunks_exact(cd) {
            q.extend_from_slice(&row[..kd]);
            k.extend_from_slice(&row[kd..2 * kd]);
            v.extend_from_slice(&row[2 * kd..]);
        }
        // HF: `g` in f32 from `a.float()`; `beta = b.sigmoid()` in the model dtype.
        let mut g = vec![0.0; t * dims.h_v];
        let mut beta = vec![0.0; t * dims.h_v];
        gdr::gating(
            &widen(&a.data),
            &widen(&b.data),
            &widen(&w.a_log.data),
            &widen(&w.dt_bias.data),
            &mut g,
            &mut beta,
        )?;
        for x in &mut beta {
            *x = T::round(*x);
        }
        let inp = gdr::GdrInputs { q: &q, k: &k, v: &v, g: &g, beta: &beta };
        let gd = gdr::GdrDims { h_k: dims.h_k, h_v: dims.h_v, k: dims.k, v: dims.v };
        let mut o = vec![T::default(); t * vd];
        match batch.kind {
            StepKind::Prefill => gdr::chunk_prefill(
                &inp,
                gd,
                Varlen::new(&batch.cu_seqlens, &batch.slots),
                gdr::GdrOptions::default(),
                64,
                &mut state.recurrent,
                &mut o,
            )?,
            StepKind::Decode => gdr::decode(
                &inp,
                gd,
                &batch.slots,
                gdr::GdrOptions::default(),
                &mut state.recurrent,
                &mut o,
            )?,
        }
        let mut out = vec![T::default(); t * vd];
        norm::rms_norm_gated(&o, &z.data, &w.norm_w.data, dims.eps, &mut out)?;
        Ok(CpuTensor::new(out, t, vd))
    }

    /// [`Backend::attention`] on the separate q (`[q | gate]` per head), k, v projections.
    #[allow(clippy::too_many_arguments)]
    fn attention_parts(
        q_proj: &CpuTensor<T>,
        k: &CpuTensor<T>,
        v: &CpuTensor<T>,
        w: &AttnCoreWeights<CpuTensor<T>>,
        dims: AttnDims,
        batch: &StepBatch,
        cache: &mut CpuKvCache<T>,
    ) -> Result<CpuTensor<T>> {
        const OP: &str = "attention";
        let t = batch.num_tokens();
        let (hq, hkv, hd) = (dims.n_q_heads, dims.n_kv_heads, dims.head_dim);
        check_cols(OP, "q_proj", q_proj, hq * 2 * hd)?;
        check_rows(OP, "q_proj", q_proj, t)?;
        check_cols(OP, "k", k, hkv * hd)?;
        check_cols(OP, "v", v, hkv * hd)?;
        let mut q = vec![T::default(); t * hq * hd];
        let mut gate = vec![T::default(); t * hq * hd];
        attn::split_q_gate(&q_proj.data, hq, hd, &mut q, &mut gate)?;
        let mut qn = vec![T::default(); q.len()];
        attn::qk_norm(&q, &w.q_norm.data, dims.eps, &mut qn)?;
        let mut kn = vec![T::default(); k.data.len()];
        attn::qk_norm(&k.data, &w.k_norm.data, dims.eps, &mut kn)?;
        let rp =
            attn::RopeParams { head_dim: hd, rotary_dim: dims.rotary_dim, theta: dims.rope_theta };
        attn::rope_neox(&mut qn, hq, &batch.positions, rp)?;
        attn::rope_neox(&mut kn, hkv, &batch.positions, rp)?;
        let pages = attn::PageTable { table: &batch.page_table, max_pages: batch.max_pages };
        let kvd = attn::KvDims { page_size: dims.page_size, n_kv_heads: hkv, head_dim: hd };
        attn::write_kv(
            &kn,
            &v.data,
            &batch.cu_seqlens,
            &batch.ctx_lens,
            pages,
            kvd,
            &mut cache.k,
            &mut cache.v,
        )?;
        let ad = attn::AttnDims { n_q_heads: hq, n_kv_heads: hkv, head_dim: hd };
        let mut o = vec![T::default(); q.len()];
        match batch.kind {
            StepKind::Prefill => attn::prefill_paged(
                &qn,
                &cache.k,
                &cache.v,
                &batch.cu_seqlens,
                &batch.ctx_lens,
                pages,
                dims.page_size,
                ad,
                None,
                &mut o,
            )?,
            StepKind::Decode => {
                let seq_lens: Vec<i32> = batch.ctx_lens.iter().map(|&c| c + 1).collect();
                attn::decode_paged(
                    &qn,
                    &cache.k,
                    &cache.v,
                    &seq_lens,
                    pages,
                    dims.page_size,
                    ad,
                    None,
                    &mut o,
                )?;
            }
        }
        let mut out = vec![T::default(); o.len()];
        attn::output_gate(&o, &gate, &mut out)?;
        Ok(CpuTensor::new(out, t, hq * hd))
    }
}

impl<T: Elem> Backend for Cpu<T> {
    type Tensor = CpuTensor<T>;
    type GdnState = CpuGdnState<T>;
    type KvCache = CpuKvCache<T>;

    fn name(&self) -> String {
        if T::NAME == "f32" {
            "cpu".into()
        } else {
            format!("cpu-{}", T::NAME)
        }
    }

    fn upload(&self, t: &HostTensor) -> Result<CpuTensor<T>> {
        let cols = t.shape.last().copied().unwrap_or(1);
        let rows = t.data.len().checked_div(cols).unwrap_or(0);
        if rows * cols != t.data.len() {
            return Err(err(format!(
                "upload: {} elements do not fill shape {:?}",
                t.data.len(),
                t.shape
            )));
        }
        Ok(CpuTensor::new(t.data.iter().map(|&x| T::from_f32(x)).collect(), rows, cols))
    }

    fn to_host(&self, t: &CpuTensor<T>) -> Result<Vec<f32>> {
        Ok(widen(&t.data))
    }

    fn shape(&self, t: &CpuTensor<T>) -> (usize, usize) {
        (t.rows, t.cols)
    }

    fn new_gdn_state(&self, dims: GdnDims, num_slots: usize) -> Result<CpuGdnState<T>> {
        Ok(CpuGdnState {
            recurrent: vec![0.0; num_slots * dims.h_v * dims.k * dims.v],
            conv: vec![T::default(); num_slots * dims.conv_dim() * (dims.conv_kernel - 1)],
            dims,
            num_slots,
        })
    }

    fn reset_gdn_slot(&self, state: &mut CpuGdnState<T>, slot: usize) -> Result<()> {
        if slot >= state.num_slots {
            return Err(err(format!("reset_gdn_slot: slot {slot} >= {}", state.num_slots)));
        }
        let d = state.dims;
        let r = d.h_v * d.k * d.v;
        state.recurrent[slot * r..(slot + 1) * r].fill(0.0);
        let c = d.conv_dim() * (d.conv_kernel - 1);
        state.conv[slot * c..(slot + 1) * c].fill(T::default());
        Ok(())
    }

    fn new_kv_cache(&self, dims: AttnDims, num_pages: usize) -> Result<CpuKvCache<T>> {
        // Checked (an absurd size is an error, not a wrapped small cache) and non-empty, as the
        // CUDA backend's.
        let n = dims.kv_cache_elems(num_pages).ok_or_else(|| {
            err(format!("new_kv_cache: empty or oversized cache ({num_pages} pages, {dims:?})"))
        })?;
        Ok(CpuKvCache { k: vec![T::default(); n], v: vec![T::default(); n] })
    }

    fn embedding(&self, ids: &[u32], table: &CpuTensor<T>) -> Result<CpuTensor<T>> {
        let ids: Vec<i32> = ids.iter().map(|&i| i32::try_from(i).unwrap_or(i32::MAX)).collect();
        let mut out = vec![T::default(); ids.len() * table.cols];
        mlp::embedding(&ids, &table.data, table.cols, &mut out)?;
        Ok(CpuTensor::new(out, ids.len(), table.cols))
    }

    fn linear(&self, x: &CpuTensor<T>, w: &CpuTensor<T>) -> Result<CpuTensor<T>> {
        check_cols("linear", "w", w, x.cols)?;
        let mut out = vec![T::default(); x.rows * w.rows];
        if x.rows > 0 {
            mlp::matmul(&x.data, &w.data, x.cols, w.rows, &mut out)?;
        }
        Ok(CpuTensor::new(out, x.rows, w.rows))
    }

    fn rms_norm(&self, x: &CpuTensor<T>, w: &CpuTensor<T>, eps: f32) -> Result<CpuTensor<T>> {
        check_cols("rms_norm", "w", w, x.cols)?;
        let mut out = vec![T::default(); x.data.len()];
        norm::rms_norm(&x.data, &w.data, eps, &mut out)?;
        Ok(CpuTensor::new(out, x.rows, x.cols))
    }

    fn add_rms_norm(
        &self,
        x: &CpuTensor<T>,
        residual: &mut CpuTensor<T>,
        w: &CpuTensor<T>,
        eps: f32,
    ) -> Result<CpuTensor<T>> {
        check_cols("add_rms_norm", "residual", residual, x.cols)?;
        check_rows("add_rms_norm", "residual", residual, x.rows)?;
        check_cols("add_rms_norm", "w", w, x.cols)?;
        let mut out = vec![T::default(); x.data.len()];
        norm::fused_add_rms_norm(&x.data, &mut residual.data, &w.data, eps, &mut out)?;
        Ok(CpuTensor::new(out, x.rows, x.cols))
    }

    fn silu_and_mul(&self, x: &CpuTensor<T>) -> Result<CpuTensor<T>> {
        if x.cols % 2 != 0 {
            return Err(err(format!("silu_and_mul: odd column count {}", x.cols)));
        }
        let inter = x.cols / 2;
        let mut out = vec![T::default(); x.rows * inter];
        mlp::silu_and_mul(&x.data, inter, &mut out)?;
        Ok(CpuTensor::new(out, x.rows, inter))
    }

    fn gdn_mix(
        &self,
        proj: &CpuTensor<T>,
        w: &GdnMixWeights<CpuTensor<T>>,
        dims: GdnDims,
        batch: &StepBatch,
        state: &mut CpuGdnState<T>,
    ) -> Result<CpuTensor<T>> {
        let (cd, hv, vd) = (dims.conv_dim(), dims.h_v, dims.h_v * dims.v);
        check_cols("gdn_mix", "proj", proj, cd + vd + 2 * hv)?;
        let [qkv, z, b, a] = split_cols(proj, [cd, vd, hv, hv]);
        Self::gdn_mix_parts(&qkv, &z, &b, &a, w, dims, batch, state)
    }

    fn attention(
        &self,
        qkv: &CpuTensor<T>,
        w: &AttnCoreWeights<CpuTensor<T>>,
        dims: AttnDims,
        batch: &StepBatch,
        cache: &mut CpuKvCache<T>,
    ) -> Result<CpuTensor<T>> {
        let (qd, kvd) = (dims.n_q_heads * 2 * dims.head_dim, dims.n_kv_heads * dims.head_dim);
        check_cols("attention", "qkv", qkv, qd + 2 * kvd)?;
        let [q, k, v] = split_cols(qkv, [qd, kvd, kvd]);
        Self::attention_parts(&q, &k, &v, w, dims, batch, cache)
    }

    fn gather_rows(&self, x: &CpuTensor<T>, rows: &[usize]) -> Result<CpuTensor<T>> {
        let mut out = Vec::with_capacity(rows.len() * x.cols);
        for &r in rows {
            if r >= x.rows {
                return Err(err(format!("gather_rows: row {r} >= {}", x.rows)));
            }
            out.extend_from_slice(&x.data[r * x.cols..(r + 1) * x.cols]);
        }
        Ok(CpuTensor::new(out, rows.len(), x.cols))
    }

    fn concat_rows(&self, a: &CpuTensor<T>, b: &CpuTensor<T>) -> Result<CpuTensor<T>> {
        check_cols("concat_rows", "b", b, a.cols)?;
        let mut data = a.data.clone();
        data.extend_from_slice(&b.data);
        Ok(CpuTensor::new(data, a.rows + b.rows, a.cols))
    }

    fn tp_size(&self) -> usize {
        self.comm.as_ref().map_or(1, Communicator::<[T]>::world_size)
    }

    fn elem_bytes(&self) -> usize {
        std::mem::size_of::<T>()
    }

    fn abort_handle(&self) -> Option<std::sync::Arc<dyn crate::comm::AbortHandle>> {
        self.comm.as_ref().map(|c| Communicator::<[T]>::abort_handle(c))
    }

    fn all_reduce_sum(&self, t: &mut CpuTensor<T>) -> Result<()> {
        match &self.comm {
            Some(c) => c.all_reduce_sum(&mut t.data[..]),
            None => Ok(()),
        }
    }

    fn gather_cols_to_host(&self, t: &CpuTensor<T>) -> Result<Vec<f32>> {
        let Some(c) = &self.comm else {
            return Ok(widen(&t.data));
        };
        let w = Communicator::<[T]>::world_size(c);
        let mut g = vec![T::default(); t.data.len() * w];
        c.all_gather(&t.data[..], &mut g[..])?;
        Ok(super::interleave_gathered(&widen(&g), w, t.rows, t.cols))
    }
}
