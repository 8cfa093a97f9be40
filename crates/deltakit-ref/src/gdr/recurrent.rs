//! `gdr.recurrent_prefill` and `gdr.decode`: the token-by-token gated delta rule.

use super::{prepare_qk, validate_io, GdrDims, GdrInputs, GdrOptions};
use crate::varlen::Seq;
use crate::{Elem, Result, Varlen};

/// One recurrence step on one head. `s`: f32 `[K, V]`; `q`, `k`: `[K]`; `v`, `o`: `[V]`;
/// `acc`: f64 scratch `[V]`. Products in f32, the K-long sums in f64.
#[allow(clippy::too_many_arguments)]
fn step(
    s: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: f32,
    beta: f32,
    o: &mut [f32],
    acc: &mut [f64],
) {
    let vd = v.len();
    let decay = g.exp();
    for e in s.iter_mut() {
        *e *= decay;
    }
    acc.fill(0.0);
    for (row, &ki) in s.chunks_exact(vd).zip(k) {
        for (a, &sij) in acc.iter_mut().zip(row) {
            *a += f64::from(sij) * f64::from(ki);
        }
    }
    // acc now holds S^T k; reuse it for delta (f32).
    for (a, &vj) in acc.iter_mut().zip(v) {
        *a = f64::from(beta * (vj - *a as f32));
    }
    for (row, &ki) in s.chunks_exact_mut(vd).zip(k) {
        for (sij, &dj) in row.iter_mut().zip(acc.iter()) {
            *sij += ki * dj as f32;
        }
    }
    acc.fill(0.0);
    for (row, &qi) in s.chunks_exact(vd).zip(q) {
        for (a, &sij) in acc.iter_mut().zip(row) {
            *a += f64::from(sij) * f64::from(qi);
        }
    }
    for (oj, &a) in o.iter_mut().zip(acc.iter()) {
        *oj = a as f32;
    }
}

/// Run the recurrence over validated sequences. `q`, `k` are prepared f32 `[T, H_k, K]`.
fn run<T: Elem>(
    seqs: &[Seq],
    q: &[f32],
    k: &[f32],
    inp: &GdrInputs<'_, T>,
    d: GdrDims,
    state: &mut [f32],
    out: &mut [T],
) {
    let (hk, hv_n, kd, vd) = (d.h_k, d.h_v, d.k, d.v);
    let group = hv_n / hk;
    let per_slot = d.state_per_slot();
    // Scratch is sized from the dims alone: allocate it only once a live sequence (whose slot
    // holds `H_v K V` f32 in memory) shows that they fit; a batch of padding sequences (or none)
    // with absurd dims must not abort on the allocation.
    let live = |n: usize| if seqs.iter().any(|s| s.slot.is_some()) { n } else { 0 };
    let mut s = vec![0f32; live(kd * vd)];
    let mut o = vec![0f32; live(vd)];
    let mut vrow = vec![0f32; live(vd)];
    let mut acc = vec![0f64; live(vd)];
    for seq in seqs {
        let out_seq = &mut out[seq.start * hv_n * vd..(seq.start + seq.len) * hv_n * vd];
        let Some(slot) = seq.slot else {
            out_seq.fill(T::from_f32(0.0));
            continue;
        };
        for h in 0..hv_n {
            let kh = h / group;
            let st = &mut state[slot * per_slot + h * kd * vd..slot * per_slot + (h + 1) * kd * vd];
            if seq.init {
                s.copy_from_slice(st);
            } else {
                s.fill(0.0);
            }
            for t in seq.start..seq.start + seq.len {
                let qk_off = (t * hk + kh) * kd;
                let v_off = (t * hv_n + h) * vd;
                for (dst, src) in vrow.iter_mut().zip(&inp.v[v_off..v_off + vd]) {
                    *dst = src.to_f32();
                }
                step(
                    &mut s,
                    &q[qk_off..qk_off + kd],
                    &k[qk_off..qk_off + kd],
                    &vrow,
                    inp.g[t * hv_n + h],
                    inp.beta[t * hv_n + h],
                    &mut o,
                    &mut acc,
                );
                for (dst, &x) in out[v_off..v_off + vd].iter_mut().zip(&o) {
                    *dst = T::from_f32(x);
                }
            }
            st.copy_from_slice(&s);
        }
    }
}

/// Gated delta rule, token by token over a varlen batch: the oracle of every GDR kernel.
///
/// Mirrors HF `torch_recurrent_gated_delta_rule` (and FLA `fused_recurrent_gated_delta_rule`
/// with `cu_seqlens`), with Qwen3.5's `use_qk_l2norm_in_kernel=True` as the default option.
///
/// Per token and value head `h` (key head `h / (H_v/H_k)`), f32 state `S [K, V]`:
/// `S *= exp(g); delta = beta * (v - S^T k); S += k (x) delta; o = S^T q`. Products are f32, the
/// K-long sums f64; `q`/`k` are L2-normalised (if enabled) and `q` scaled as [`GdrOptions`] says.
///
/// Shapes: see [`GdrInputs`]; `state`: f32 `[num_slots, H_v, K, V]` (num_slots =
/// `state.len() / (H_v K V)`); `out`: `[T, H_v, V]`, rounded to `T` once. Each live sequence reads
/// its initial state from its slot (or zeros, per `varlen.has_initial_state`) and writes its final
/// state there; padding sequences (slot -1) get zero output and leave the pool untouched.
///
/// # Errors
/// [`crate::RefError::Shape`] on any length / dim mismatch (including `H_v % H_k != 0` and a state
/// pool that is not a whole number of slots); [`crate::RefError::Invalid`] for bad `cu_seqlens` or
/// slots, a `g` of a live sequence that is positive or NaN (`-inf` is a full decay), a
/// non-finite `beta` of a live sequence, or a non-finite `opts.scale`.
/// Nothing is written on error.
pub fn recurrent_prefill<T: Elem>(
    inp: &GdrInputs<'_, T>,
    dims: GdrDims,
    varlen: Varlen<'_>,
    opts: GdrOptions,
    state: &mut [f32],
    out: &mut [T],
) -> Result<()> {
    const OP: &str = "gdr.recurrent_prefill";
    let (t, num_slots) = validate_io(OP, inp, dims, state.len(), out.len())?;
    let seqs = varlen.validate(OP, t, num_slots)?;
    super::check_g_and_opts(OP, inp.g, inp.beta, &seqs, dims.h_v, opts)?;
    let (q, k) = prepare_qk(inp, dims, opts);
    run(&seqs, &q, &k, inp, dims, state, out);
    Ok(())
}

/// Gated delta rule decode: one new token per row, row `i` continuing the sequence in slot
/// `slots[i]` (`-1` = padding row: zero output, no state change).
///
/// Same math as [`recurrent_prefill`] with `cu_seqlens = [0, 1, .., N]`; mirrors FLA
/// `fused_recurrent_gated_delta_rule` in decode (vLLM `fused_sigmoid_gating_delta_rule_update`
/// minus the fused gating). Shapes: inputs `[N, ..]` as in [`GdrInputs`], `slots`: `i32 [N]`,
/// `state`: f32 `[num_slots, H_v, K, V]`, `out`: `[N, H_v, V]`.
///
/// # Errors
/// As [`recurrent_prefill`]; `slots.len()` must equal the row count.
pub fn decode<T: Elem>(
    inp: &GdrInputs<'_, T>,
    dims: GdrDims,
    slots: &[i32],
    opts: GdrOptions,
    state: &mut [f32],
    out: &mut [T],
) -> Result<()> {
    const OP: &str = "gdr.decode";
    let (n, num_slots) = validate_io(OP, inp, dims, state.len(), out.len())?;
    let sl = crate::check::slots(OP, "slots", slots, n, num_slots)?;
    let seqs: Vec<Seq> = sl
        .into_iter()
        .enumerate()
        .map(|(i, slot)| Seq { start: i, len: 1, slot, init: true })
        .collect();
    super::check_g_and_opts(OP, inp.g, inp.beta, &seqs, dims.h_v, opts)?;
    let (q, k) = prepare_qk(inp, dims, opts);
    run(&seqs, &q, &k, inp, dims, state, out);
    Ok(())
}
