//! `gdr.chunk_prefill`: the chunkwise (WY / UT-transform) form of the gated delta rule.
//!
//! Within a chunk of `L <= C` tokens starting from state `S0`, with `c_t` the cumulative log-decay
//! from the chunk start through token `t` (non-increasing because `g <= 0`), the recurrence
//! unrolls to `S_t = e^{c_t} S0 + sum_{s<=t} e^{c_t - c_s} k_s d_s^T`, where the per-token
//! corrections `d_t = beta_t (v_t - e^{c_t} S0^T k_t - sum_{s<t} e^{c_t - c_s} (k_t.k_s) d_s)`.
//! Stacking them: `(I + A) D = beta V - diag(beta e^c) K S0` with the strictly lower
//! `A[t,s] = beta_t (k_t.k_s) e^{c_t - c_s}`. With `Tm = (I + A)^-1` (unit lower triangular, by
//! forward substitution): `U = Tm (beta V)`, `W = Tm (beta e^c K)`, `D = U - W S0`; outputs
//! `o_t = e^{c_t} S0^T q_t + sum_{s<=t} e^{c_t - c_s} (q_t.k_s) d_s` and the carried state
//! `S_L = e^{c_{L-1}} S0 + sum_s e^{c_{L-1} - c_s} k_s d_s^T`.
//! Only exponents `c_t - c_s` with `s <= t` (<= 0) and `c_t` (<= 0) are ever exponentiated, so
//! extreme decays underflow to 0 instead of overflowing. The pairwise exponents `c_t - c_s` are
//! summed directly over `g_{s+1..=t}` (sums of same-sign terms, accurate to a few ulps relative)
//! instead of being formed as differences of the cumulative sums: after a huge decay (say
//! `g = -1e10`) the cumulative sum is large and its difference loses every small `g` that follows
//! (absolute error ~ ulp(|c|)), which a chunked kernel differencing f32 cumsums has to live with.

use super::{prepare_qk, validate_io, GdrDims, GdrInputs, GdrOptions};
use crate::varlen::Seq;
use crate::{Elem, RefError, Result, Varlen};

/// The chunk sizes [`chunk_prefill`] accepts.
pub const CHUNK_SIZES: [usize; 3] = [16, 32, 64];

/// Scratch buffers for one chunk (f64).
struct Scratch {
    qc: Vec<f64>,
    kc: Vec<f64>,
    vc: Vec<f64>,
    bc: Vec<f64>,
    gc: Vec<f64>,
    a: Vec<f64>,
    /// `ed[t * C + s] = exp(g_{s+1} + .. + g_t)` for `s <= t`.
    ed: Vec<f64>,
    tm: Vec<f64>,
    u: Vec<f64>,
    w: Vec<f64>,
    dl: Vec<f64>,
    s_new: Vec<f64>,
}

impl Scratch {
    fn new(c: usize, kd: usize, vd: usize) -> Self {
        Self {
            qc: vec![0.0; c * kd],
            kc: vec![0.0; c * kd],
            vc: vec![0.0; c * vd],
            bc: vec![0.0; c],
            gc: vec![0.0; c],
            a: vec![0.0; c * c],
            ed: vec![0.0; c * c],
            tm: vec![0.0; c * c],
            u: vec![0.0; c * vd],
            w: vec![0.0; c * kd],
            dl: vec![0.0; c * vd],
            s_new: vec![0.0; kd * vd],
        }
    }
}

fn dot64(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Process one chunk of `l` tokens (already gathered into `sc`); updates `s0` in place and writes
/// outputs `[l, V]` into `o` (f64).
fn chunk(
    sc: &mut Scratch,
    s0: &mut [f64],
    l: usize,
    c: usize,
    kd: usize,
    vd: usize,
    o: &mut [f64],
) {
    // Pairwise decays exp(sum g over (s, t]) (same-sign sums), then the cumulative log-decay.
    for s in 0..l {
        let mut acc = 0f64;
        sc.ed[s * c + s] = 1.0;
        for t in s + 1..l {
            acc += sc.gc[t];
            sc.ed[t * c + s] = acc.exp();
        }
    }
    for t in 1..l {
        sc.gc[t] += sc.gc[t - 1];
    }
    // A (strictly lower) and Tm = (I + A)^-1 by forward substitution.
    for t in 0..l {
        for s in 0..t {
            let kk = dot64(&sc.kc[t * kd..(t + 1) * kd], &sc.kc[s * kd..(s + 1) * kd]);
            sc.a[t * c + s] = sc.bc[t] * kk * sc.ed[t * c + s];
        }
    }
    for i in 0..l {
        for j in 0..i {
            let mut acc = 0.0;
            for m in j..i {
                acc += sc.a[i * c + m] * sc.tm[m * c + j];
            }
            sc.tm[i * c + j] = -acc;
        }
        sc.tm[i * c + i] = 1.0;
    }
    // U = Tm (beta V), W = Tm (beta e^c K).
    for t in 0..l {
        let (u, w) = (&mut sc.u[t * vd..(t + 1) * vd], &mut sc.w[t * kd..(t + 1) * kd]);
        u.fill(0.0);
        w.fill(0.0);
        for s in 0..=t {
            let ts = sc.tm[t * c + s] * sc.bc[s];
            let tsw = ts * sc.gc[s].exp();
            for (x, &y) in u.iter_mut().zip(&sc.vc[s * vd..(s + 1) * vd]) {
                *x += ts * y;
            }
            for (x, &y) in w.iter_mut().zip(&sc.kc[s * kd..(s + 1) * kd]) {
                *x += tsw * y;
            }
        }
    }
    // D = U - W S0.
    for t in 0..l {
        let d = &mut sc.dl[t * vd..(t + 1) * vd];
        d.copy_from_slice(&sc.u[t * vd..(t + 1) * vd]);
        for (i, &wi) in sc.w[t * kd..(t + 1) * kd].iter().enumerate() {
            for (x, &sij) in d.iter_mut().zip(&s0[i * vd..(i + 1) * vd]) {
                *x -= wi * sij;
            }
        }
    }
    // Outputs.
    for t in 0..l {
        let ot = &mut o[t * vd..(t + 1) * vd];
        ot.fill(0.0);
        let qt = &sc.qc[t * kd..(t + 1) * kd];
        let dec = sc.gc[t].exp();
        for (i, &qi) in qt.iter().enumerate() {
            let f = dec * qi;
            for (x, &sij) in ot.iter_mut().zip(&s0[i * vd..(i + 1) * vd]) {
                *x += f * sij;
            }
        }
        for s in 0..=t {
            let f = dot64(qt, &sc.kc[s * kd..(s + 1) * kd]) * sc.ed[t * c + s];
            for (x, &y) in ot.iter_mut().zip(&sc.dl[s * vd..(s + 1) * vd]) {
                *x += f * y;
            }
        }
    }
    // Carried state.
    let dec = sc.gc[l - 1].exp();
    for (x, &y) in sc.s_new.iter_mut().zip(s0.iter()) {
        *x = dec * y;
    }
    for s in 0..l {
        let f = sc.ed[(l - 1) * c + s];
        for (i, &ki) in sc.kc[s * kd..(s + 1) * kd].iter().enumerate() {
            let fk = f * ki;
            for (x, &y) in
                sc.s_new[i * vd..(i + 1) * vd].iter_mut().zip(&sc.dl[s * vd..(s + 1) * vd])
            {
                *x += fk * y;
            }
        }
    }
    s0.copy_from_slice(&sc.s_new);
}

/// Gated delta rule in chunkwise WY / UT-transform form, chunk size `chunk_size` in
/// [`CHUNK_SIZES`]: same interface and results (to f32 rounding) as [`super::recurrent_prefill`].
///
/// Mirrors HF `torch_chunk_gated_delta_rule` / FLA `chunk_gated_delta_rule` (the prefill path of
/// `Qwen3_5GatedDeltaNet`), but with chunks restarted at every sequence boundary of the varlen
/// batch (as FLA's `cu_seqlens` mode). The algorithm is in the module docs; it runs in f64 inside
/// each sequence (state carried across chunks in f64), reads the f32 initial state from the slot,
/// writes the final state as f32 and rounds outputs to `T` once.
///
/// Shapes and state semantics: as [`super::recurrent_prefill`]. `g` must be `<= 0` (what
/// [`super::gating`] produces); `g == 0`, very negative `g` (e.g. -100) and `g = -inf` (full
/// decay: every pairwise factor spanning it is `exp(-inf) = 0`) are exact / finite.
///
/// # Errors
/// As [`super::recurrent_prefill`], plus [`RefError::Unsupported`] for a chunk size outside
/// [`CHUNK_SIZES`] and [`RefError::Invalid`] for a `g` that is positive or NaN or a non-finite
/// `beta` (live sequences).
pub fn chunk_prefill<T: Elem>(
    inp: &GdrInputs<'_, T>,
    dims: GdrDims,
    varlen: Varlen<'_>,
    opts: GdrOptions,
    chunk_size: usize,
    state: &mut [f32],
    out: &mut [T],
) -> Result<()> {
    const OP: &str = "gdr.chunk_prefill";
    if !CHUNK_SIZES.contains(&chunk_size) {
        return Err(RefError::Unsupported {
            op: OP,
            what: "chunk_size",
            got: chunk_size.to_string(),
            supported: "16, 32, 64",
        });
    }
    let (t, num_slots) = validate_io(OP, inp, dims, state.len(), out.len())?;
    let seqs = varlen.validate(OP, t, num_slots)?;
    super::check_g_and_opts(OP, inp.g, inp.beta, &seqs, dims.h_v, opts)?;
    let (q, k) = prepare_qk(inp, dims, opts);
    run(&seqs, &q, &k, inp, dims, chunk_size, state, out);
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn run<T: Elem>(
    seqs: &[Seq],
    q: &[f32],
    k: &[f32],
    inp: &GdrInputs<'_, T>,
    d: GdrDims,
    c: usize,
    state: &mut [f32],
    out: &mut [T],
) {
    let (hk, hv_n, kd, vd) = (d.h_k, d.h_v, d.k, d.v);
    let group = hv_n / hk;
    let per_slot = d.state_per_slot();
    // Scratch is sized from the dims alone: allocate it only once a live sequence (whose slot
    // holds `H_v K V` f32 in memory) shows that they fit (as the recurrence).
    let live = |n: usize| if seqs.iter().any(|s| s.slot.is_some()) { n } else { 0 };
    let mut sc = Scratch::new(c, live(kd), live(vd));
    let mut s0 = vec![0f64; live(kd * vd)];
    let mut o = vec![0f64; c * live(vd)];
    for seq in seqs {
        let Some(slot) = seq.slot else {
            out[seq.start * hv_n * vd..(seq.start + seq.len) * hv_n * vd].fill(T::from_f32(0.0));
            continue;
        };
        for h in 0..hv_n {
            let kh = h / group;
            let st = &mut state[slot * per_slot + h * kd * vd..slot * per_slot + (h + 1) * kd * vd];
            for (x, &y) in s0.iter_mut().zip(st.iter()) {
                *x = if seq.init { f64::from(y) } else { 0.0 };
            }
            let mut c0 = 0;
            while c0 < seq.len {
                let l = c.min(seq.len - c0);
                for j in 0..l {
                    let tok = seq.start + c0 + j;
                    let qk_off = (tok * hk + kh) * kd;
                    let v_off = (tok * hv_n + h) * vd;
                    for (x, &y) in
                        sc.qc[j * kd..(j + 1) * kd].iter_mut().zip(&q[qk_off..qk_off + kd])
                    {
                        *x = f64::from(y);
                    }
                    for (x, &y) in
                        sc.kc[j * kd..(j + 1) * kd].iter_mut().zip(&k[qk_off..qk_off + kd])
                    {
                        *x = f64::from(y);
                    }
                    for (x, y) in
                        sc.vc[j * vd..(j + 1) * vd].iter_mut().zip(&inp.v[v_off..v_off + vd])
                    {
                        *x = f64::from(y.to_f32());
                    }
                    sc.bc[j] = f64::from(inp.beta[tok * hv_n + h]);
                    sc.gc[j] = f64::from(inp.g[tok * hv_n + h]);
                }
                chunk(&mut sc, &mut s0, l, c, kd, vd, &mut o);
                for j in 0..l {
                    let v_off = ((seq.start + c0 + j) * hv_n + h) * vd;
                    for (x, &y) in out[v_off..v_off + vd].iter_mut().zip(&o[j * vd..(j + 1) * vd]) {
                        *x = T::from_f32(y as f32);
                    }
                }
                c0 += l;
            }
            for (x, &y) in st.iter_mut().zip(&s0) {
                *x = y as f32;
            }
        }
    }
}
