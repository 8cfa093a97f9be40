//! Property tests of the gated delta rule (recurrent, chunked, decode) and its pipeline with the
//! causal conv1d: chunked == recurrent, split invariance, varlen isolation, extreme gates, head
//! mapping, K != V, L2 norm of tiny q/k, and precision against an f64 recurrence.
// Exact float comparisons are deliberate here (bit-identity invariants, hand-computed values).
#![allow(clippy::float_cmp, clippy::too_many_lines, clippy::needless_range_loop)]

mod common;

use common::{check, check_multi, max_err, rel_err, rel_err64, rng, uniform, uniform_in};
use deltakit_ref::conv1d::{self, ConvDims};
use deltakit_ref::gdr::{self, GdrDims, GdrInputs, GdrOptions};
use deltakit_ref::Varlen;
use proptest::prelude::*;
use rand::seq::SliceRandom;
use rand::Rng;

/// Random GDR inputs for `t` tokens and a state pool of `slots` slots.
#[derive(Clone, Debug)]
struct Data {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
    state: Vec<f32>,
}

impl Data {
    fn new(d: GdrDims, t: usize, slots: usize, seed: u64) -> Self {
        let mut r = rng(seed);
        let q = uniform(&mut r, t * d.h_k * d.k, 1.0);
        let k = uniform(&mut r, t * d.h_k * d.k, 1.0);
        let v = uniform(&mut r, t * d.h_v * d.v, 1.0);
        let a = uniform(&mut r, t * d.h_v, 3.0);
        let b = uniform(&mut r, t * d.h_v, 3.0);
        let a_log = uniform_in(&mut r, d.h_v, -2.0, 1.0);
        let dt_bias = uniform(&mut r, d.h_v, 1.0);
        let (mut g, mut beta) = (vec![0.0; t * d.h_v], vec![0.0; t * d.h_v]);
        gdr::gating(&a, &b, &a_log, &dt_bias, &mut g, &mut beta).unwrap();
        let state = uniform(&mut r, slots * d.state_per_slot(), 0.5);
        Self { q, k, v, g, beta, state }
    }
    fn inputs(&self) -> GdrInputs<'_, f32> {
        GdrInputs { q: &self.q, k: &self.k, v: &self.v, g: &self.g, beta: &self.beta }
    }
}

/// Independent f64 recurrence (HF `torch_recurrent_gated_delta_rule` semantics), explicit
/// `S[i][j]` indexing with i over K and j over V. Returns (out `[T, H_v, V]`, state pool, mag)
/// where `mag[t, h, j] = sum_i |S_t[i][j]| |q_t[i]|` is the cancellation-free scale of the output
/// dot product (see [`out_err`]).
fn ref_f64(
    data: &Data,
    d: GdrDims,
    cu: &[i32],
    slots: &[i32],
    opts: GdrOptions,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (kd, vd) = (d.k, d.v);
    let group = d.h_v / d.h_k;
    let per = d.state_per_slot();
    let mut out = vec![0f64; data.v.len()];
    let mut mag = vec![0f64; data.v.len()];
    let mut pool: Vec<f64> = data.state.iter().map(|&x| f64::from(x)).collect();
    let scale = opts.scale.map_or(1.0 / (kd as f64).sqrt(), f64::from);
    let norm = |x: &[f32]| -> Vec<f64> {
        let x: Vec<f64> = x.iter().map(|&e| f64::from(e)).collect();
        if opts.use_qk_l2norm {
            let ss: f64 = x.iter().map(|e| e * e).sum();
            let inv = 1.0 / (ss + 1e-6).sqrt();
            x.iter().map(|e| e * inv).collect()
        } else {
            x
        }
    };
    for (n, w) in cu.windows(2).enumerate() {
        if slots[n] < 0 {
            continue;
        }
        let slot = slots[n] as usize;
        for h in 0..d.h_v {
            let kh = h / group;
            let s = &mut pool[slot * per + h * kd * vd..slot * per + (h + 1) * kd * vd];
            for t in w[0] as usize..w[1] as usize {
                let off = (t * d.h_k + kh) * kd;
                let q: Vec<f64> = norm(&data.q[off..off + kd]).iter().map(|e| e * scale).collect();
                let k = norm(&data.k[off..off + kd]);
                let g = f64::from(data.g[t * d.h_v + h]).exp();
                let beta = f64::from(data.beta[t * d.h_v + h]);
                for e in s.iter_mut() {
                    *e *= g;
                }
                for j in 0..vd {
                    let mut kv = 0.0;
                    for i in 0..kd {
                        kv += s[i * vd + j] * k[i];
                    }
                    let delta = beta * (f64::from(data.v[(t * d.h_v + h) * vd + j]) - kv);
                    for i in 0..kd {
                        s[i * vd + j] += k[i] * delta;
                    }
                    let (mut o, mut m) = (0.0, 0.0);
                    for i in 0..kd {
                        o += s[i * vd + j] * q[i];
                        m += (s[i * vd + j] * q[i]).abs();
                    }
                    out[(t * d.h_v + h) * vd + j] = o;
                    mag[(t * d.h_v + h) * vd + j] = m;
                }
            }
        }
    }
    (out, pool, mag)
}

/// Output error `||out - reference|| / ||mag||` with `mag = sum_i |S[i][j] q[i]|` per element:
/// relative to the size of the terms of `o = S^T q`, so a near-cancelling `q . k` (e.g. one
/// token after a -100 decay) cannot inflate it. Infinite on NaN/inf.
fn out_err(out: &[f32], reference: &[f64], mag: &[f64]) -> f64 {
    if out.iter().any(|x| !x.is_finite()) {
        return f64::INFINITY;
    }
    let num: f64 = out.iter().zip(reference).map(|(&o, r)| (f64::from(o) - r).powi(2)).sum();
    let den: f64 = mag.iter().map(|m| m * m).sum();
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}

fn widen(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&e| f64::from(e)).collect()
}

/// Split `t` tokens into `n` sequences (some possibly empty) deterministically from `seed`.
fn split_cu(t: usize, n: usize, seed: u64) -> Vec<i32> {
    let mut r = rng(seed ^ 0x5eed);
    let mut cuts: Vec<usize> = (0..n - 1).map(|_| r.gen_range(0..=t)).collect();
    cuts.sort_unstable();
    let mut cu = vec![0i32];
    cu.extend(cuts.iter().map(|&c| c as i32));
    cu.push(t as i32);
    cu
}

fn run_rec(data: &Data, d: GdrDims, vl: Varlen<'_>, o: GdrOptions) -> (Vec<f32>, Vec<f32>) {
    let mut st = data.state.clone();
    let mut out = vec![f32::NAN; data.v.len()];
    gdr::recurrent_prefill(&data.inputs(), d, vl, o, &mut st, &mut out).unwrap();
    (out, st)
}

fn run_chunk(
    data: &Data,
    d: GdrDims,
    vl: Varlen<'_>,
    o: GdrOptions,
    c: usize,
) -> (Vec<f32>, Vec<f32>) {
    let mut st = data.state.clone();
    let mut out = vec![f32::NAN; data.v.len()];
    gdr::chunk_prefill(&data.inputs(), d, vl, o, c, &mut st, &mut out).unwrap();
    (out, st)
}

fn dims_strategy() -> impl Strategy<Value = GdrDims> {
    (1usize..=2, 1usize..=3, 4usize..=16, 4usize..=16).prop_map(|(h_k, grp, k, v)| GdrDims {
        h_k,
        h_v: h_k * grp,
        k,
        v,
    })
}

#[test]
fn chunked_equals_recurrent() {
    let strat = (
        dims_strategy(),
        prop::sample::select(vec![16usize, 32, 64]),
        0usize..6,
        1usize..150,
        1usize..=3,
        any::<u64>(),
    );
    let names = [("gdr.chunked_eq_recurrent.out", 1e-5), ("gdr.chunked_eq_recurrent.state", 1e-5)];
    check_multi(&names, 192, strat, |(d, c, tsel, trand, nseq, seed)| {
        let t = [1, c - 1, c, c + 1, 3 * c + 5, trand][tsel];
        let data = Data::new(d, t, 4, seed);
        let cu = split_cu(t, nseq, seed);
        let slots: Vec<i32> = [2, 0, 3][..nseq].to_vec();
        let vl = Varlen::new(&cu, &slots);
        let o = GdrOptions::default();
        let (ro, rs) = run_rec(&data, d, vl, o);
        let (co, cs) = run_chunk(&data, d, vl, o, c);
        let (_, _, mag) = ref_f64(&data, d, &cu, &slots, o);
        vec![out_err(&co, &widen(&ro), &mag), rel_err(&cs, &rs)]
    });
}

/// A mini GDR layer: conv1d prefill/update on `x [T, 2 H_k K + H_v V]`, split into q, k, v, then
/// the GDR. `mode`: 0 = chunked prefill (chunk 16), 1 = decode token by token.
struct Layer {
    d: GdrDims,
    cd: ConvDims,
    weight: Vec<f32>,
    bias: Vec<f32>,
    x: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
}

impl Layer {
    fn conv_dim(d: GdrDims) -> usize {
        2 * d.h_k * d.k + d.h_v * d.v
    }
    /// Run tokens `t0..t1` (one sequence in `slot`), chunked prefill or token-by-token decode.
    /// Returns the GDR output of those tokens.
    fn run(
        &self,
        t0: usize,
        t1: usize,
        slot: i32,
        decode: bool,
        st: &mut [f32],
        cst: &mut [f32],
    ) -> Vec<f32> {
        let (d, cd) = (self.d, self.cd.conv_dim);
        let n = t1 - t0;
        let x = &self.x[t0 * cd..t1 * cd];
        let mut c = vec![f32::NAN; n * cd];
        let cu = [0, n as i32];
        if decode {
            for i in 0..n {
                conv1d::update(
                    &x[i * cd..(i + 1) * cd],
                    &self.weight,
                    Some(&self.bias),
                    self.cd,
                    1,
                    &[slot],
                    cst,
                    &mut c[i * cd..(i + 1) * cd],
                )
                .unwrap();
            }
        } else {
            conv1d::prefill(
                x,
                &self.weight,
                Some(&self.bias),
                self.cd,
                Varlen::new(&cu, &[slot]),
                cst,
                &mut c,
            )
            .unwrap();
        }
        let qk = d.h_k * d.k;
        let vw = d.h_v * d.v;
        let mut q = Vec::new();
        let mut k = Vec::new();
        let mut v = Vec::new();
        for row in c.chunks_exact(cd) {
            q.extend_from_slice(&row[..qk]);
            k.extend_from_slice(&row[qk..2 * qk]);
            v.extend_from_slice(&row[2 * qk..]);
        }
        let g = &self.g[t0 * d.h_v..t1 * d.h_v];
        let beta = &self.beta[t0 * d.h_v..t1 * d.h_v];
        let inp = GdrInputs { q: &q, k: &k, v: &v, g, beta };
        let mut out = vec![f32::NAN; n * vw];
        let o = GdrOptions::default();
        if decode {
            for i in 0..n {
                let one = GdrInputs {
                    q: &q[i * qk..(i + 1) * qk],
                    k: &k[i * qk..(i + 1) * qk],
                    v: &v[i * vw..(i + 1) * vw],
                    g: &g[i * d.h_v..(i + 1) * d.h_v],
                    beta: &beta[i * d.h_v..(i + 1) * d.h_v],
                };
                gdr::decode(&one, d, &[slot], o, st, &mut out[i * vw..(i + 1) * vw]).unwrap();
            }
        } else {
            gdr::chunk_prefill(&inp, d, Varlen::new(&cu, &[slot]), o, 16, st, &mut out).unwrap();
        }
        out
    }
}

#[test]
fn split_prefill_equals_whole_and_decode() {
    let strat =
        (dims_strategy(), 2usize..=4, 0usize..4, 0usize..3, 1usize..40, 1usize..40, any::<u64>());
    let names = [
        ("gdr+conv.split_prefill_eq_whole.out", 1e-5),
        ("gdr+conv.split_prefill_eq_whole.gdr_state", 1e-5),
        ("gdr+conv.split_prefill_eq_whole.conv_state", 0.0),
        ("gdr+conv.decode_eq_whole.out", 1e-5),
        ("gdr+conv.decode_eq_whole.gdr_state", 1e-5),
        ("gdr+conv.decode_eq_whole.conv_state", 0.0),
    ];
    check_multi(&names, 128, strat, |(d, w, s1, s2, r1, r2, seed)| {
        let t1 = [1, 2, w - 1, r1][s1].max(1);
        let t2 = [1, 2, r2][s2];
        let t = t1 + t2;
        let mut r = rng(seed);
        let cdim = Layer::conv_dim(d);
        let cd = ConvDims { conv_dim: cdim, width: w };
        let (a, b) = (uniform(&mut r, t * d.h_v, 3.0), uniform(&mut r, t * d.h_v, 3.0));
        let (a_log, dt) = (uniform(&mut r, d.h_v, 1.0), uniform(&mut r, d.h_v, 1.0));
        let (mut g, mut beta) = (vec![0.0; t * d.h_v], vec![0.0; t * d.h_v]);
        gdr::gating(&a, &b, &a_log, &dt, &mut g, &mut beta).unwrap();
        let layer = Layer {
            d,
            cd,
            weight: uniform(&mut r, cdim * w, 0.7),
            bias: uniform(&mut r, cdim, 0.3),
            x: uniform(&mut r, t * cdim, 1.0),
            g,
            beta,
        };
        let slots = 3;
        let st0 = uniform(&mut r, slots * d.state_per_slot(), 0.5);
        let cst0 = uniform(&mut r, slots * cdim * (w - 1), 1.0);
        let slot = r.gen_range(0..slots as i32);
        // Whole.
        let (mut st_a, mut cst_a) = (st0.clone(), cst0.clone());
        let out_a = layer.run(0, t, slot, false, &mut st_a, &mut cst_a);
        // Split.
        let (mut st_b, mut cst_b) = (st0.clone(), cst0.clone());
        let mut out_b = layer.run(0, t1, slot, false, &mut st_b, &mut cst_b);
        out_b.extend(layer.run(t1, t, slot, false, &mut st_b, &mut cst_b));
        // Token by token.
        let (mut st_c, mut cst_c) = (st0, cst0);
        let out_c = layer.run(0, t, slot, true, &mut st_c, &mut cst_c);
        vec![
            rel_err(&out_b, &out_a),
            rel_err(&st_b, &st_a),
            rel_err(&cst_b, &cst_a),
            rel_err(&out_c, &out_a),
            rel_err(&st_c, &st_a),
            rel_err(&cst_c, &cst_a),
        ]
    });
}

#[test]
fn varlen_isolation() {
    let strat = (dims_strategy(), 2usize..=4, 1usize..60, any::<u64>());
    check("gdr+conv.varlen_isolation", 96, 0.0, strat, |(d, nseq, t, seed)| {
        let nslots = 6;
        let data = Data::new(d, t, nslots, seed);
        let cu = split_cu(t, nseq, seed);
        let mut r = rng(seed ^ 0x07);
        let mut perm: Vec<i32> = (0..nslots as i32).collect();
        perm.shuffle(&mut r);
        let mut slots: Vec<i32> = perm[..nseq].to_vec();
        slots[r.gen_range(0..nseq)] = -1; // one padding sequence
        let init: Vec<bool> = (0..nseq).map(|_| r.gen_bool(0.7)).collect();
        let vl = Varlen { cu_seqlens: &cu, slots: &slots, has_initial_state: Some(&init) };
        let o = GdrOptions::default();
        let mut errs = Vec::new();
        for chunked in [false, true] {
            let (po, ps) =
                if chunked { run_chunk(&data, d, vl, o, 16) } else { run_rec(&data, d, vl, o) };
            // Each sequence alone on a fresh copy of the pool.
            let mut so = vec![f32::NAN; po.len()];
            let mut ss = data.state.clone();
            let vw = d.h_v * d.v;
            for i in 0..nseq {
                let (a, b) = (cu[i] as usize, cu[i + 1] as usize);
                let sub = Data {
                    q: data.q[a * d.h_k * d.k..b * d.h_k * d.k].to_vec(),
                    k: data.k[a * d.h_k * d.k..b * d.h_k * d.k].to_vec(),
                    v: data.v[a * vw..b * vw].to_vec(),
                    g: data.g[a * d.h_v..b * d.h_v].to_vec(),
                    beta: data.beta[a * d.h_v..b * d.h_v].to_vec(),
                    state: ss.clone(),
                };
                let cu1 = [0, (b - a) as i32];
                let vl1 = Varlen {
                    cu_seqlens: &cu1,
                    slots: &slots[i..=i],
                    has_initial_state: Some(&init[i..=i]),
                };
                let (o1, s1) =
                    if chunked { run_chunk(&sub, d, vl1, o, 16) } else { run_rec(&sub, d, vl1, o) };
                so[a * vw..b * vw].copy_from_slice(&o1);
                ss = s1;
                if slots[i] == -1 && o1.iter().any(|&x| x != 0.0) {
                    return f64::INFINITY;
                }
            }
            errs.push(rel_err(&po, &so));
            // Bit-exact state (including untouched padding / unused slots).
            errs.push(if ps == ss { 0.0 } else { rel_err(&ps, &ss).max(f64::MIN_POSITIVE) });
            // Slots not used by any live sequence are untouched.
            let per = d.state_per_slot();
            for s in 0..nslots {
                if !slots.contains(&(s as i32))
                    && ps[s * per..(s + 1) * per] != data.state[s * per..(s + 1) * per]
                {
                    return f64::INFINITY;
                }
            }
        }
        // Conv prefill isolation too.
        let cdim = 5;
        let cd = ConvDims { conv_dim: cdim, width: 4 };
        let x = uniform(&mut r, t * cdim, 1.0);
        let w = uniform(&mut r, cdim * 4, 1.0);
        let cst0 = uniform(&mut r, nslots * cdim * 3, 1.0);
        let mut cst = cst0.clone();
        let mut out = vec![f32::NAN; t * cdim];
        conv1d::prefill(&x, &w, None, cd, vl, &mut cst, &mut out).unwrap();
        let mut cst2 = cst0;
        let mut out2 = vec![f32::NAN; t * cdim];
        for i in 0..nseq {
            let (a, b) = (cu[i] as usize, cu[i + 1] as usize);
            let cu1 = [0, (b - a) as i32];
            let vl1 = Varlen {
                cu_seqlens: &cu1,
                slots: &slots[i..=i],
                has_initial_state: Some(&init[i..=i]),
            };
            conv1d::prefill(
                &x[a * cdim..b * cdim],
                &w,
                None,
                cd,
                vl1,
                &mut cst2,
                &mut out2[a * cdim..b * cdim],
            )
            .unwrap();
        }
        errs.push(if out == out2 && cst == cst2 { 0.0 } else { f64::INFINITY });
        max_err(&errs)
    });
}

#[test]
fn gates_zero_and_extreme() {
    let strat = (
        dims_strategy(),
        0usize..6,
        1usize..100,
        prop::sample::select(vec![16usize, 64]),
        any::<u64>(),
    );
    let names = [
        ("gdr.gates_zero_extreme.chunked_eq_recurrent", 1e-5),
        ("gdr.gates_zero_extreme.recurrent_vs_f64", 1e-5),
        ("gdr.gates_zero_extreme.chunked_vs_f64", 1e-5),
    ];
    check_multi(&names, 160, strat, |(d, mode, t, c, seed)| {
        let mut data = Data::new(d, t, 2, seed);
        let mut r = rng(seed ^ 0x0b);
        match mode {
            0 => data.g.fill(0.0),
            1 => {
                for (i, g) in data.g.iter_mut().enumerate() {
                    if (i / d.h_v) % 2 == 0 {
                        *g = 0.0;
                    }
                }
            }
            2 => {
                for g in &mut data.g {
                    *g = if r.gen_bool(0.3) { -100.0 } else { r.gen_range(-100.0..0.0) };
                }
            }
            3 => {
                // A_log large with a + dt_bias very negative, and some very positive.
                let a = uniform_in(&mut r, t * d.h_v, -60.0, 30.0);
                let b = uniform(&mut r, t * d.h_v, 20.0);
                let a_log = uniform_in(&mut r, d.h_v, 5.0, 20.0);
                let dt = uniform(&mut r, d.h_v, 5.0);
                gdr::gating(&a, &b, &a_log, &dt, &mut data.g, &mut data.beta).unwrap();
            }
            4 => {
                // Mixture of exact zeros and -100 per token.
                for g in &mut data.g {
                    *g = if r.gen_bool(0.5) { 0.0 } else { -100.0 };
                }
            }
            _ => {
                // A huge decay followed by tiny ones: the cumulative log-decay becomes ~-1e10 and
                // the small decays after it must not be lost (pairwise sums, not cumsum diffs).
                for g in &mut data.g {
                    *g = if r.gen_bool(0.1) { -1e10 } else { r.gen_range(-1e-3..0.0) };
                }
                for b in &mut data.beta {
                    *b = if r.gen_bool(0.5) { 1.0 - 1e-6 } else { *b };
                }
            }
        }
        if data.g.iter().any(|g| !g.is_finite()) {
            return vec![f64::INFINITY; 3];
        }
        let cu = [0, t as i32];
        let vl = Varlen::new(&cu, &[1]);
        let o = GdrOptions::default();
        let (ro, rs) = run_rec(&data, d, vl, o);
        let (co, cs) = run_chunk(&data, d, vl, o, c);
        let (fo, fs, mag) = ref_f64(&data, d, &cu, &[1], o);
        vec![
            max_err(&[out_err(&co, &widen(&ro), &mag), rel_err(&cs, &rs)]),
            max_err(&[out_err(&ro, &fo, &mag), rel_err64(&rs, &fs)]),
            max_err(&[out_err(&co, &fo, &mag), rel_err64(&cs, &fs)]),
        ]
    });
}

#[test]
fn head_mapping_and_k_ne_v() {
    let strat = (1usize..=2, 1usize..=3, 0usize..3, 1usize..80, any::<u64>());
    let names = [
        ("gdr.head_mapping_k_ne_v.recurrent_vs_f64", 1e-5),
        ("gdr.head_mapping_k_ne_v.chunked_vs_f64", 1e-5),
        ("gdr.head_mapping_k_ne_v.eq_explicit_repeat_interleave", 0.0),
    ];
    check_multi(&names, 128, strat, |(h_k, grp, kv, t, seed)| {
        let (k, v) = [(32, 16), (16, 8), (8, 12)][kv];
        let d = GdrDims { h_k, h_v: h_k * grp, k, v };
        let data = Data::new(d, t, 2, seed);
        let cu = [0, t as i32];
        let vl = Varlen::new(&cu, &[0]);
        let o = GdrOptions::default();
        let (ro, rs) = run_rec(&data, d, vl, o);
        let (co, cs) = run_chunk(&data, d, vl, o, 32);
        let (fo, fs, mag) = ref_f64(&data, d, &cu, &[0], o);
        // Explicit repeat_interleave of q/k to H_v heads, run with H_k = H_v.
        let de = GdrDims { h_k: d.h_v, ..d };
        let mut ex = data.clone();
        ex.q.clear();
        ex.k.clear();
        for tok in 0..t {
            for h in 0..d.h_v {
                let off = (tok * h_k + h / grp) * k;
                ex.q.extend_from_slice(&data.q[off..off + k]);
                ex.k.extend_from_slice(&data.k[off..off + k]);
            }
        }
        let (eo, es) = run_rec(&ex, de, vl, o);
        vec![
            max_err(&[out_err(&ro, &fo, &mag), rel_err64(&rs, &fs)]),
            max_err(&[out_err(&co, &fo, &mag), rel_err64(&cs, &fs)]),
            max_err(&[rel_err(&eo, &ro), rel_err(&es, &rs)]),
        ]
    });
}

#[test]
fn l2norm_tiny_qk() {
    for (mag, name) in [
        (1.0f32, "gdr.l2norm_qk_mag_1"),
        (1e-2, "gdr.l2norm_qk_mag_1e-2"),
        (1e-3, "gdr.l2norm_qk_mag_1e-3"),
        (1e-4, "gdr.l2norm_qk_mag_1e-4"),
    ] {
        let strat = (dims_strategy(), 1usize..70, any::<u64>());
        check(name, 48, 1e-5, strat, |(d, t, seed)| {
            let mut data = Data::new(d, t, 1, seed);
            for x in data.q.iter_mut().chain(data.k.iter_mut()) {
                *x *= mag;
            }
            let cu = [0, t as i32];
            let vl = Varlen::new(&cu, &[0]);
            let o = GdrOptions::default();
            let (ro, rs) = run_rec(&data, d, vl, o);
            let (co, cs) = run_chunk(&data, d, vl, o, 16);
            let (fo, fs, mag) = ref_f64(&data, d, &cu, &[0], o);
            // The l2norm op itself against f64.
            let mut qn = vec![f32::NAN; data.q.len()];
            gdr::l2norm(&data.q, d.k, gdr::L2NORM_EPS, &mut qn).unwrap();
            let qn64: Vec<f64> = data
                .q
                .chunks_exact(d.k)
                .flat_map(|row| {
                    let ss: f64 = row.iter().map(|&x| f64::from(x).powi(2)).sum();
                    let inv = 1.0 / (ss + 1e-6).sqrt();
                    row.iter().map(move |&x| f64::from(x) * inv)
                })
                .collect();
            max_err(&[
                rel_err64(&qn, &qn64),
                out_err(&ro, &fo, &mag),
                rel_err64(&rs, &fs),
                out_err(&co, &fo, &mag),
                rel_err64(&cs, &fs),
            ])
        });
    }
}

#[test]
fn precision_512_steps_vs_f64() {
    let strat = (prop::sample::select(vec![(32usize, 32usize), (32, 16), (16, 32)]), any::<u64>());
    let names =
        [("gdr.precision_512_vs_f64.recurrent", 1e-5), ("gdr.precision_512_vs_f64.chunked", 1e-5)];
    check_multi(&names, 8, strat, |((k, v), seed)| {
        let d = GdrDims { h_k: 1, h_v: 2, k, v };
        let t = 512;
        let data = Data::new(d, t, 1, seed);
        let cu = [0, t as i32];
        let vl = Varlen::new(&cu, &[0]);
        let o = GdrOptions::default();
        let (ro, rs) = run_rec(&data, d, vl, o);
        let (co, cs) = run_chunk(&data, d, vl, o, 64);
        let (fo, fs, mag) = ref_f64(&data, d, &cu, &[0], o);
        let rec = max_err(&[out_err(&ro, &fo, &mag), rel_err64(&rs, &fs)]);
        let chk = max_err(&[out_err(&co, &fo, &mag), rel_err64(&cs, &fs)]);
        println!("  512 steps K={k} V={v}: recurrent(f32 state) {rec:.3e}, chunked(f64) {chk:.3e}");
        vec![rec, chk]
    });
}

#[test]
fn options_no_l2norm_and_custom_scale() {
    let strat = (dims_strategy(), 1usize..50, any::<u64>());
    check("gdr.options_no_l2norm_scale", 64, 1e-5, strat, |(d, t, seed)| {
        let mut data = Data::new(d, t, 1, seed);
        // Without the L2 norm keep k small so the recurrence stays contractive.
        for x in &mut data.k {
            *x *= 0.5 / (d.k as f32).sqrt();
        }
        let cu = [0, t as i32];
        let vl = Varlen::new(&cu, &[0]);
        let o = GdrOptions { use_qk_l2norm: false, scale: Some(0.37) };
        let (ro, rs) = run_rec(&data, d, vl, o);
        let (co, cs) = run_chunk(&data, d, vl, o, 16);
        let (fo, fs, mag) = ref_f64(&data, d, &cu, &[0], o);
        max_err(&[
            out_err(&ro, &fo, &mag),
            rel_err64(&rs, &fs),
            out_err(&co, &widen(&ro), &mag),
            rel_err(&cs, &rs),
        ])
    });
}
