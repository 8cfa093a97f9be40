//! GPU test: `gdr.decode` (CUDA C++) vs `deltakit_ref::gdr::{gating, decode, recurrent_prefill}`.
//!
//! Each case: fresh random bf16 q/k/v/a/b, f32 A_log/dt_bias and a random f32 state pool whose
//! live slots are a random subset (the rest are canaries that must stay bit-identical); outputs
//! poisoned with NaN. Errors are `||gpu - ref|| / ||ref||`: out (bf16) <= 1e-2, state (f32) <= 1e-3.
//! `DELTAKIT_SANITIZE=1` (set for compute-sanitizer runs) drops the batch-64 cases.
//! Head dims: the tuned K, V in {64, 128} and the small dims of the tiny test models (K in
//! {16, 32}, V in {16, 32}, every combination with K in {16, 32, 64, 128}, V in {16, 32, 64,
//! 128}). Gates at the edge of f32 (g = -inf from exp(A_log) overflowing, softplus underflowing),
//! heads per rank 1..64, and one row of T = 266_305 tokens whose `[T, H_v, V]` tensors pass 2^31
//! elements (int64 offsets). The engine's decode pair `conv1d.update` -> `gdr.decode` on one stream
//! (the small-batch route is a programmatic dependent launch behind the early-triggering conv),
//! many steps back to back, eagerly and in a CUDA graph.
mod common;

use std::sync::Arc;

use deltakit::cudarc::driver::{CudaSlice, CudaStream};
use deltakit::ops::gdr::{decode, DecodeStrides, GdrDims, GdrOptions};
use deltakit::testing::{gpu_or_skip, rel_err};
use deltakit_ref::gdr as rgdr;
use half::bf16;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;

const OUT_TOL: f64 = 1e-2;
const STATE_TOL: f64 = 1e-3;

fn sanitize() -> bool {
    std::env::var("DELTAKIT_SANITIZE").is_ok_and(|v| v == "1")
}

fn bf16_vec(rng: &mut StdRng, n: usize, lo: f32, hi: f32) -> Vec<bf16> {
    (0..n).map(|_| bf16::from_f32(rng.gen_range(lo..hi))).collect()
}

fn f32_vec(rng: &mut StdRng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(lo..hi)).collect()
}

fn to_f32(x: &[bf16]) -> Vec<f32> {
    x.iter().map(|v| v.to_f32()).collect()
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Gates {
    /// a, b, A_log, dt_bias of ordinary size.
    Normal,
    /// a + dt_bias = -110: softplus underflows, g = 0 (no decay).
    Zero,
    /// a + dt_bias ~ +50 with A_log = 3: g ~ -1000, exp(g) = 0 (full reset); b = +-30.
    Huge,
    /// A_log = 12 (exp = 1.6e5), ordinary a: exp(g) = 0 or tiny.
    LargeALog,
    /// At the edge of f32: value head 0 has A_log = 87.5 (exp ~ 1e38) and dt_bias 0, its `a` per
    /// token in [4, 10] (g = -inf: full decay), in [-87, -86] (ordinary g ~ -1.6 .. -4.5) or
    /// ordinary (g ~ -1e38), mixed; other heads get a = -300 on 30% of tokens (softplus = 0,
    /// g = -0).
    Edge,
}

struct Inputs {
    q: Vec<bf16>,
    k: Vec<bf16>,
    v: Vec<bf16>,
    a: Vec<bf16>,
    b: Vec<bf16>,
    a_log: Vec<f32>,
    dt_bias: Vec<f32>,
}

fn make_inputs(rng: &mut StdRng, d: GdrDims, rows: usize, gates: Gates) -> Inputs {
    let q = bf16_vec(rng, rows * d.h_k * d.k, -1.0, 1.0);
    let k = bf16_vec(rng, rows * d.h_k * d.k, -1.0, 1.0);
    let v = bf16_vec(rng, rows * d.h_v * d.v, -1.0, 1.0);
    let (a, b, a_log, dt_bias) = match gates {
        Gates::Normal => (
            bf16_vec(rng, rows * d.h_v, -3.0, 3.0),
            bf16_vec(rng, rows * d.h_v, -3.0, 3.0),
            f32_vec(rng, d.h_v, -2.0, 1.0),
            f32_vec(rng, d.h_v, -1.0, 1.0),
        ),
        Gates::Zero => (
            vec![bf16::from_f32(-100.0); rows * d.h_v],
            bf16_vec(rng, rows * d.h_v, -3.0, 3.0),
            f32_vec(rng, d.h_v, -1.0, 1.0),
            vec![-10.0; d.h_v],
        ),
        Gates::Huge => (
            bf16_vec(rng, rows * d.h_v, 48.0, 52.0),
            (0..rows * d.h_v)
                .map(|i| bf16::from_f32(if i % 2 == 0 { 30.0 } else { -30.0 }))
                .collect(),
            vec![3.0; d.h_v],
            f32_vec(rng, d.h_v, -1.0, 1.0),
        ),
        Gates::LargeALog => (
            bf16_vec(rng, rows * d.h_v, -3.0, 3.0),
            bf16_vec(rng, rows * d.h_v, -3.0, 3.0),
            vec![12.0; d.h_v],
            f32_vec(rng, d.h_v, -1.0, 1.0),
        ),
        Gates::Edge => {
            let mut a = bf16_vec(rng, rows * d.h_v, -3.0, 3.0);
            let mut a_log = f32_vec(rng, d.h_v, -2.0, 1.0);
            let mut dt = f32_vec(rng, d.h_v, -1.0, 1.0);
            a_log[0] = 87.5;
            dt[0] = 0.0;
            for (i, x) in a.iter_mut().enumerate() {
                let u: f32 = rng.gen_range(0.0..1.0);
                if i % d.h_v == 0 {
                    if u < 0.3 {
                        *x = bf16::from_f32(rng.gen_range(4.0f32..10.0));
                    } else if u < 0.7 {
                        *x = bf16::from_f32(rng.gen_range(-87.0f32..-86.0));
                    }
                } else if u < 0.3 {
                    *x = bf16::from_f32(-300.0);
                }
            }
            (a, bf16_vec(rng, rows * d.h_v, -3.0, 3.0), a_log, dt)
        }
    };
    Inputs { q, k, v, a, b, a_log, dt_bias }
}

/// Reference: gating, then decode (T = 1) or recurrent_prefill over rows of T tokens.
fn reference(
    inp: &Inputs,
    d: GdrDims,
    t: usize,
    slots: &[i32],
    l2: bool,
    state: &mut [f32],
) -> Vec<bf16> {
    let rows = slots.len() * t;
    let mut g = vec![0f32; rows * d.h_v];
    let mut beta = vec![0f32; rows * d.h_v];
    rgdr::gating(&to_f32(&inp.a), &to_f32(&inp.b), &inp.a_log, &inp.dt_bias, &mut g, &mut beta)
        .unwrap();
    let ri = rgdr::GdrInputs { q: &inp.q, k: &inp.k, v: &inp.v, g: &g, beta: &beta };
    let rd = rgdr::GdrDims { h_k: d.h_k, h_v: d.h_v, k: d.k, v: d.v };
    let ro = rgdr::GdrOptions { use_qk_l2norm: l2, scale: None };
    let mut out = vec![bf16::ZERO; rows * d.h_v * d.v];
    if t == 1 {
        rgdr::decode(&ri, rd, slots, ro, state, &mut out).unwrap();
    } else {
        let cu: Vec<i32> = (0..=slots.len()).map(|i| (i * t) as i32).collect();
        rgdr::recurrent_prefill(
            &ri,
            rd,
            deltakit_ref::Varlen::new(&cu, slots),
            ro,
            state,
            &mut out,
        )
        .unwrap();
    }
    out
}

struct Dev {
    q: CudaSlice<bf16>,
    k: CudaSlice<bf16>,
    v: CudaSlice<bf16>,
    a: CudaSlice<bf16>,
    b: CudaSlice<bf16>,
    a_log: CudaSlice<f32>,
    dt_bias: CudaSlice<f32>,
}

fn upload(stream: &Arc<CudaStream>, inp: &Inputs) -> Dev {
    Dev {
        q: stream.clone_htod(&inp.q).unwrap(),
        k: stream.clone_htod(&inp.k).unwrap(),
        v: stream.clone_htod(&inp.v).unwrap(),
        a: stream.clone_htod(&inp.a).unwrap(),
        b: stream.clone_htod(&inp.b).unwrap(),
        a_log: stream.clone_htod(&inp.a_log).unwrap(),
        dt_bias: stream.clone_htod(&inp.dt_bias).unwrap(),
    }
}

/// Slot layout: `n` rows over a pool with canary slots; rows in `pad` get slot -1 (device slot
/// `dev_pad` for those rows, e.g. -1 or an out-of-range value).
fn slot_layout(rng: &mut StdRng, n: usize, pad: &[usize]) -> (Vec<i32>, usize) {
    let num_slots = n + n / 4 + 2;
    let mut all: Vec<i32> = (0..num_slots as i32).collect();
    all.shuffle(rng);
    let mut slots: Vec<i32> = all[..n].to_vec();
    for &p in pad {
        slots[p] = -1;
    }
    (slots, num_slots)
}

struct CaseResult {
    out_err: f64,
    state_err: f64,
}

/// Runs one case and checks everything; returns the errors.
#[allow(clippy::too_many_arguments)]
fn run_case(
    stream: &Arc<CudaStream>,
    case: u64,
    d: GdrDims,
    n: usize,
    t: usize,
    l2: bool,
    gates: Gates,
    pad: &[usize],
    dev_pad: i32,
) -> CaseResult {
    let (mut rng, seed) = common::rng(case);
    let rows = n * t;
    let mut inp = make_inputs(&mut rng, d, rows, gates);
    if !l2 {
        // Without the in-kernel L2 norm keys are expected normalised upstream: keep |k| ~ 1 so
        // the delta rule stays contractive (beta * |k|^2 < 2), as in a real model.
        for x in inp.q.iter_mut().chain(inp.k.iter_mut()) {
            *x = bf16::from_f32(x.to_f32() * 0.15);
        }
    }
    let (slots, num_slots) = slot_layout(&mut rng, n, pad);
    let per_slot = d.state_per_slot();
    let state0 = f32_vec(&mut rng, num_slots * per_slot, -1.0, 1.0);
    let mut ref_state = state0.clone();
    let ref_out = reference(&inp, d, t, &slots, l2, &mut ref_state);

    let dev = upload(stream, &inp);
    let dev_slots_host: Vec<i32> =
        slots.iter().map(|&s| if s == -1 { dev_pad } else { s }).collect();
    let dslots = stream.clone_htod(&dev_slots_host).unwrap();
    let mut dstate = stream.clone_htod(&state0).unwrap();
    let mut dout = stream.clone_htod(&vec![bf16::NAN; rows * d.h_v * d.v]).unwrap();
    let host_check = if dev_pad == -1 { Some(slots.as_slice()) } else { None };
    decode(
        stream,
        d,
        t,
        GdrOptions { use_qk_l2norm: l2, scale: None },
        DecodeStrides::default(),
        &dev.q,
        &dev.k,
        &dev.v,
        &dev.a,
        &dev.b,
        &dev.a_log,
        &dev.dt_bias,
        &dslots,
        host_check,
        &mut dstate,
        &mut dout,
    )
    .unwrap();
    let out = to_f32(&stream.clone_dtoh(&dout).unwrap());
    let state = stream.clone_dtoh(&dstate).unwrap();
    let ctx = format!("{d:?} n={n} t={t} l2={l2} gates={gates:?} pad={pad:?} seed={seed}");

    // Padding rows: exact zeros.
    for (i, &s) in slots.iter().enumerate() {
        if s == -1 {
            let o = &out[i * t * d.h_v * d.v..(i + 1) * t * d.h_v * d.v];
            assert!(o.iter().all(|&x| x.to_bits() == 0), "{ctx}: padding row {i} not zero");
        }
    }
    // Canary slots (not live): bit-identical.
    let live: Vec<usize> = slots.iter().filter(|&&s| s >= 0).map(|&s| s as usize).collect();
    for s in 0..num_slots {
        if !live.contains(&s) {
            let r = s * per_slot..(s + 1) * per_slot;
            assert!(
                state[r.clone()].iter().zip(&state0[r]).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{ctx}: canary slot {s} changed"
            );
        }
    }
    let out_err = rel_err(&out, &to_f32(&ref_out));
    let (mut got_s, mut ref_s) = (Vec::new(), Vec::new());
    for &s in &live {
        got_s.extend_from_slice(&state[s * per_slot..(s + 1) * per_slot]);
        ref_s.extend_from_slice(&ref_state[s * per_slot..(s + 1) * per_slot]);
    }
    let state_err = if live.is_empty() { 0.0 } else { rel_err(&got_s, &ref_s) };
    assert!(out_err <= OUT_TOL, "{ctx}: out rel err {out_err}");
    assert!(state_err <= STATE_TOL, "{ctx}: state rel err {state_err}");
    CaseResult { out_err, state_err }
}

fn report(name: &str, worst: (f64, f64)) {
    println!("MAXERR gdr.decode {name}: out {:.3e} state {:.3e}", worst.0, worst.1);
}

fn fold(w: &mut (f64, f64), r: &CaseResult) {
    w.0 = w.0.max(r.out_err);
    w.1 = w.1.max(r.state_err);
}

#[test]
fn decode_qwen35_shapes() {
    let Some(ctx) = gpu_or_skip("decode_qwen35_shapes") else { return };
    let stream = ctx.default_stream();
    let mut worst = (0.0, 0.0);
    let batches: &[usize] = if sanitize() { &[1, 7] } else { &[1, 7, 64] };
    let mut case = 0;
    for (h_k, h_v) in [(16, 32), (16, 48), (8, 24), (4, 12)] {
        for &n in batches {
            case += 1;
            let d = GdrDims { h_k, h_v, k: 128, v: 128 };
            let r = run_case(&stream, case, d, n, 1, true, Gates::Normal, &[], -1);
            fold(&mut worst, &r);
        }
    }
    report("qwen35 shapes (K=V=128, T=1, batch 1/7/64)", worst);
}

#[test]
fn decode_small_shapes_kv_ratio_tokens_l2() {
    let Some(ctx) = gpu_or_skip("decode_small_shapes_kv_ratio_tokens_l2") else { return };
    let stream = ctx.default_stream();
    let mut worst = (0.0, 0.0);
    let mut case = 100;
    for (k, v) in [(128, 64), (64, 128), (64, 64), (128, 128)] {
        for ratio in [1, 2, 3] {
            for t in [1, 2, 4] {
                for l2 in [true, false] {
                    case += 1;
                    let d = GdrDims { h_k: 2, h_v: 2 * ratio, k, v };
                    let r = run_case(&stream, case, d, 5, t, l2, Gates::Normal, &[], -1);
                    fold(&mut worst, &r);
                }
            }
        }
    }
    // Batches large enough for the wide-tile T = 1 configuration (>= 512 row x head x 64-column
    // tiles), for every (K, V).
    for (k, v) in [(128, 64), (64, 128), (64, 64), (128, 128)] {
        for l2 in [true, false] {
            case += 1;
            let d = GdrDims { h_k: 4, h_v: 12, k, v };
            let r = run_case(&stream, case, d, 48, 1, l2, Gates::Normal, &[3, 17], -1);
            fold(&mut worst, &r);
        }
    }
    report("K!=V, H_v/H_k 1..3, T 1/2/4, l2 on/off, both tile configs", worst);
}

/// (K, V) with K = 32 or V in {16, 32}: the untuned small-dim path (tiny test models first).
const SMALL_KV: [(usize, usize); 8] =
    [(32, 32), (32, 16), (64, 16), (128, 32), (32, 64), (32, 128), (64, 32), (128, 16)];

#[test]
fn decode_small_head_dims() {
    let Some(ctx) = gpu_or_skip("decode_small_head_dims") else { return };
    let stream = ctx.default_stream();
    let mut worst = (0.0, 0.0);
    let mut case = 800;
    for (k, v) in SMALL_KV {
        for ratio in [1, 2, 3] {
            for t in [1, 3] {
                for l2 in [true, false] {
                    case += 1;
                    let d = GdrDims { h_k: 2, h_v: 2 * ratio, k, v };
                    // Padding rows in some cases (-1 with host check, or an out-of-range device
                    // slot), canary slots in all.
                    let (pad, dev_pad): (&[usize], i32) = match ratio {
                        2 => (&[0, 3], -1),
                        3 => (&[2], 1_000_000),
                        _ => (&[], -1),
                    };
                    let r = run_case(&stream, case, d, 5, t, l2, Gates::Normal, pad, dev_pad);
                    fold(&mut worst, &r);
                }
            }
        }
    }
    // The tiny models' layer shapes (tiny-causal 2/4 K=V=32, tiny-cond 2/6 K=32 V=16, and their
    // TP2 shards), larger batches.
    let batches: &[usize] = if sanitize() { &[7] } else { &[7, 64] };
    for (h_k, h_v, k, v) in [(2, 4, 32, 32), (2, 6, 32, 16), (1, 2, 32, 32), (1, 3, 32, 16)] {
        for &n in batches {
            case += 1;
            let d = GdrDims { h_k, h_v, k, v };
            let r = run_case(&stream, case, d, n, 1, true, Gates::Normal, &[1], -1);
            fold(&mut worst, &r);
        }
    }
    // Extreme gates on the small path.
    for gates in [Gates::Zero, Gates::Huge, Gates::LargeALog] {
        for (k, v) in [(32, 16), (32, 32)] {
            case += 1;
            let d = GdrDims { h_k: 2, h_v: 6, k, v };
            let r = run_case(&stream, case, d, 4, 3, true, gates, &[], -1);
            fold(&mut worst, &r);
        }
    }
    report("small head dims (K 32/64/128 x V 16/32, K=32 x V 64/128), H_v/H_k 1..3, T 1/3", worst);
}

#[test]
fn decode_extreme_gates() {
    let Some(ctx) = gpu_or_skip("decode_extreme_gates") else { return };
    let stream = ctx.default_stream();
    let mut worst = (0.0, 0.0);
    let mut case = 300;
    for gates in [Gates::Zero, Gates::Huge, Gates::LargeALog] {
        for t in [1, 3] {
            for (k, v) in [(128, 128), (64, 128)] {
                case += 1;
                let d = GdrDims { h_k: 2, h_v: 6, k, v };
                let r = run_case(&stream, case, d, 4, t, true, gates, &[], -1);
                fold(&mut worst, &r);
            }
        }
    }
    report("extreme gates (g = 0, g = -1000, A_log = 12; beta saturated)", worst);
}

#[test]
fn decode_gates_at_the_edge_of_f32() {
    let Some(ctx) = gpu_or_skip("decode_gates_at_the_edge_of_f32") else { return };
    let stream = ctx.default_stream();
    let mut worst = (0.0, 0.0);
    let mut case = 1300;
    for (k, v) in [(128, 128), (64, 128), (16, 32), (32, 16)] {
        for (n, t) in [(4, 1), (3, 40), (80, 1)] {
            case += 1;
            let d = GdrDims { h_k: 2, h_v: 6, k, v };
            let r = run_case(&stream, case, d, n, t, true, Gates::Edge, &[1], -1);
            fold(&mut worst, &r);
        }
    }
    report("gates at the edge of f32 (g = -inf mixed, softplus underflow)", worst);
}

#[test]
fn decode_k16_every_v() {
    let Some(ctx) = gpu_or_skip("decode_k16_every_v") else { return };
    let stream = ctx.default_stream();
    let mut worst = (0.0, 0.0);
    let mut case = 1400;
    for v in [16, 32, 64, 128] {
        for ratio in [1, 2, 3] {
            for t in [1, 3] {
                case += 1;
                let d = GdrDims { h_k: 2, h_v: 2 * ratio, k: 16, v };
                let l2 = ratio != 3;
                let r = run_case(&stream, case, d, 5, t, l2, Gates::Normal, &[2], -1);
                fold(&mut worst, &r);
            }
        }
    }
    report("K = 16 x V 16/32/64/128, H_v/H_k 1..3, T 1/3", worst);
}

#[test]
fn decode_speculative_tokens() {
    // K = V = 128 with T in {3, 5, 8, 13} tokens per row (speculative verification): partial and several
    // full chunks of the chunked multi-token path (DELTAKIT_GDR_DECODE=slc_bv64_nw4, 4 tokens per chunk),
    // a padding row among them.
    let Some(ctx) = gpu_or_skip("decode_speculative_tokens") else { return };
    let stream = ctx.default_stream();
    let mut worst = (0.0, 0.0);
    let mut case = 1700;
    for t in [3usize, 5, 8, 13] {
        for l2 in [true, false] {
            case += 1;
            let d = GdrDims { h_k: 2, h_v: 6, k: 128, v: 128 };
            let r = run_case(&stream, case, d, 5, t, l2, Gates::Normal, &[2], -1);
            fold(&mut worst, &r);
        }
    }
    report("K=V=128, T 3/5/8/13 (speculative tokens), l2 on/off, padding", worst);
}

#[test]
fn decode_heads_per_rank_sweep() {
    // H_v per rank in {1, 2, 4, 6, 8, 16, 32, 64} (H_k = H_v / 2 where even), batches 1 / 16 / 64
    // (both tile configurations), and T = 4 tokens per row.
    let Some(ctx) = gpu_or_skip("decode_heads_per_rank_sweep") else { return };
    let stream = ctx.default_stream();
    let mut worst = (0.0, 0.0);
    let mut case = 1500;
    let batches: &[(usize, usize)] =
        if sanitize() { &[(1, 1), (3, 4)] } else { &[(1, 1), (16, 1), (64, 1), (16, 4)] };
    for h_v in [1usize, 2, 4, 6, 8, 16, 32, 64] {
        let h_k = if h_v % 2 == 0 { h_v / 2 } else { h_v };
        for &(n, t) in batches {
            case += 1;
            let d = GdrDims { h_k, h_v, k: 128, v: 128 };
            let r = run_case(&stream, case, d, n, t, true, Gates::Normal, &[], -1);
            fold(&mut worst, &r);
        }
    }
    report("H_v 1..64 per rank, batch 1/16/64, T 1/4", worst);
}

#[test]
fn decode_long_row_int64_offsets() {
    // One row of T = 266_305 tokens at H_v = 64, V = 128: v / out hold T * H_v * V ~ 2.18e9 > 2^31
    // elements. Every gate of token r = T - 200 is -inf (A_log = 87.5, a = 10: full decay), so
    // the state and outputs from r on depend only on tokens r..: the recurrence over them is the
    // oracle (all past element 2^31 of v / out). Every output must be finite.
    let Some(ctx) = gpu_or_skip("decode_long_row_int64_offsets") else { return };
    if sanitize() {
        return;
    }
    let stream = ctx.default_stream();
    let d = GdrDims { h_k: 16, h_v: 64, k: 128, v: 128 };
    let t = 266_305usize;
    assert!(t * d.h_v * d.v > 1 << 31);
    let r = t - 200;
    let (mut rng, seed) = common::rng(1600);
    let qk_block = bf16_vec(&mut rng, 1 << 20, -1.0, 1.0);
    let v_block = bf16_vec(&mut rng, (1 << 22) + 7, -1.0, 1.0);
    let ab_block = bf16_vec(&mut rng, (1 << 16) + 3, -3.0, 3.0);
    let tile = |b: &[bf16], n: usize| -> Vec<bf16> { b.iter().copied().cycle().take(n).collect() };
    let mut q = tile(&qk_block, t * d.h_k * d.k);
    let mut k = tile(&qk_block[777..], t * d.h_k * d.k);
    let mut v = tile(&v_block, t * d.h_v * d.v);
    let mut a = tile(&ab_block, t * d.h_v);
    let b = tile(&ab_block[99..], t * d.h_v);
    let (qk_w, v_w) = (d.h_k * d.k, d.h_v * d.v);
    q[r * qk_w..].copy_from_slice(&bf16_vec(&mut rng, (t - r) * qk_w, -1.0, 1.0));
    k[r * qk_w..].copy_from_slice(&bf16_vec(&mut rng, (t - r) * qk_w, -1.0, 1.0));
    v[r * v_w..].copy_from_slice(&bf16_vec(&mut rng, (t - r) * v_w, -1.0, 1.0));
    let a_log = vec![87.5f32; d.h_v];
    let dt_bias = vec![0f32; d.h_v];
    // Ordinary gates everywhere (a in [-87.1, -86], softplus ~ e^a still a normal f32:
    // g ~ -1.5 .. -4.5), a full decay at token r (a = 10: g = -inf).
    for (i, x) in a.iter_mut().enumerate() {
        *x = bf16::from_f32(-86.0 - 2.5 * ((i * 7919 % 1000) as f32 / 1000.0).min(0.45));
    }
    a[r * d.h_v..(r + 1) * d.h_v].fill(bf16::from_f32(10.0));
    let inp = Inputs { q, k, v, a, b, a_log, dt_bias };
    let state0 = f32_vec(&mut rng, d.state_per_slot(), -1.0, 1.0);
    let dev = upload(&stream, &inp);
    let dslots = stream.clone_htod(&[0i32]).unwrap();
    let mut dstate = stream.clone_htod(&state0).unwrap();
    let mut dout = stream.clone_htod(&vec![bf16::NAN; t * v_w]).unwrap();
    decode(
        &stream,
        d,
        t,
        GdrOptions::default(),
        DecodeStrides::default(),
        &dev.q,
        &dev.k,
        &dev.v,
        &dev.a,
        &dev.b,
        &dev.a_log,
        &dev.dt_bias,
        &dslots,
        Some(&[0]),
        &mut dstate,
        &mut dout,
    )
    .unwrap();
    let out = stream.clone_dtoh(&dout).unwrap();
    let state = stream.clone_dtoh(&dstate).unwrap();
    let bad = out.iter().position(|x| !x.is_finite());
    assert!(bad.is_none(), "non-finite output at element {bad:?} (seed {seed})");
    let tail = Inputs {
        q: inp.q[r * qk_w..].to_vec(),
        k: inp.k[r * qk_w..].to_vec(),
        v: inp.v[r * v_w..].to_vec(),
        a: inp.a[r * d.h_v..].to_vec(),
        b: inp.b[r * d.h_v..].to_vec(),
        a_log: inp.a_log.clone(),
        dt_bias: inp.dt_bias.clone(),
    };
    let mut ref_state = state0.clone();
    let ref_out = reference(&tail, d, t - r, &[0], true, &mut ref_state);
    let eo = rel_err(&to_f32(&out[r * v_w..]), &to_f32(&ref_out));
    let es = rel_err(&state, &ref_state);
    println!("MAXERR gdr.decode long row T={t}: tail out {eo:.3e} state {es:.3e}");
    assert!(eo <= OUT_TOL && es <= STATE_TOL, "long row: out {eo} state {es} (seed {seed})");
}

#[test]
fn decode_padding_rows_and_canaries() {
    let Some(ctx) = gpu_or_skip("decode_padding_rows_and_canaries") else { return };
    let stream = ctx.default_stream();
    let mut worst = (0.0, 0.0);
    let mut case = 400;
    for t in [1, 2] {
        for &(n, ref pad) in &[(9usize, vec![1usize, 4, 8]), (3, vec![0, 1, 2]), (6, vec![0])] {
            case += 1;
            let d = GdrDims { h_k: 4, h_v: 12, k: 128, v: 128 };
            let r = run_case(&stream, case, d, n, t, true, Gates::Normal, pad, -1);
            fold(&mut worst, &r);
        }
    }
    report("padding rows (-1) + canary slots", worst);
}

#[test]
fn decode_out_of_range_device_slot_is_padding() {
    // Without a host copy the wrapper cannot check device slots; the kernel must then treat
    // out-of-range values as padding and never touch memory outside the pool.
    let Some(ctx) = gpu_or_skip("decode_out_of_range_device_slot_is_padding") else { return };
    let stream = ctx.default_stream();
    let d = GdrDims { h_k: 2, h_v: 4, k: 64, v: 128 };
    for (case, bad) in [(500u64, 1_000_000i32), (501, i32::MIN), (502, -7)] {
        run_case(&stream, case, d, 5, 2, true, Gates::Normal, &[1, 3], bad);
    }
}

#[test]
fn decode_strided_inputs() {
    // q, k, v as column views of one packed conv output [rows, 2*H_k*K + H_v*V + 8]; a and b as
    // the two halves of one [rows, 2*H_v] buffer.
    let Some(ctx) = gpu_or_skip("decode_strided_inputs") else { return };
    let stream = ctx.default_stream();
    strided_case(&stream, GdrDims { h_k: 2, h_v: 6, k: 128, v: 64 }, 600, 4, 2, &[2]);
    // tiny-cond's layer (K = 32, V = 16): the v view starts 2*H_k*K = 128 elements in.
    strided_case(&stream, GdrDims { h_k: 2, h_v: 6, k: 32, v: 16 }, 601, 4, 2, &[2]);
    strided_case(&stream, GdrDims { h_k: 1, h_v: 2, k: 32, v: 32 }, 602, 4, 2, &[2]);
}

#[test]
fn decode_chunked_default_routes() {
    // The default dispatch's chunked multi-token tile (decode_slc_kernel, 4 tokens per state pass) without forcing it:
    // T = 4 from 384 (row, head) pairs (27B TP2: 16 rows x 24 heads, exactly the threshold) with padding rows and
    // strided q / k / v / a / b views; T = 8 from 3,072 pairs (27B TP1: 64 rows x 48 heads, two chunks per row)
    // with padding rows. DELTAKIT_GDR_DECODE_LOG=1 prints the route the library takes (the device call checks that
    // both say slc).
    let Some(ctx) = gpu_or_skip("decode_chunked_default_routes") else { return };
    let stream = ctx.default_stream();
    strided_case(&stream, GdrDims { h_k: 8, h_v: 24, k: 128, v: 128 }, 1800, 16, 4, &[3, 10, 15]);
    if !sanitize() {
        let d = GdrDims { h_k: 16, h_v: 48, k: 128, v: 128 };
        let r = run_case(&stream, 1801, d, 64, 8, true, Gates::Normal, &[0, 37], -1);
        report("K=V=128 T=8 default route (3,072 pairs, slc), padding", (r.out_err, r.state_err));
    }
}

fn strided_case(
    stream: &Arc<CudaStream>,
    d: GdrDims,
    case: u64,
    n: usize,
    t: usize,
    pad: &[usize],
) {
    let rows = n * t;
    let (mut rng, seed) = common::rng(case);
    let inp = make_inputs(&mut rng, d, rows, Gates::Normal);
    let (slots, num_slots) = slot_layout(&mut rng, n, pad);
    let (qk, vw) = (d.h_k * d.k, d.h_v * d.v);
    let width = 2 * qk + vw + 8;
    let mut packed = vec![bf16::ZERO; rows * width];
    let mut ab = vec![bf16::ZERO; rows * 2 * d.h_v];
    for r in 0..rows {
        packed[r * width..r * width + qk].copy_from_slice(&inp.q[r * qk..(r + 1) * qk]);
        packed[r * width + qk..r * width + 2 * qk].copy_from_slice(&inp.k[r * qk..(r + 1) * qk]);
        packed[r * width + 2 * qk..r * width + 2 * qk + vw]
            .copy_from_slice(&inp.v[r * vw..(r + 1) * vw]);
        ab[r * 2 * d.h_v..r * 2 * d.h_v + d.h_v]
            .copy_from_slice(&inp.a[r * d.h_v..(r + 1) * d.h_v]);
        ab[r * 2 * d.h_v + d.h_v..(r + 1) * 2 * d.h_v]
            .copy_from_slice(&inp.b[r * d.h_v..(r + 1) * d.h_v]);
    }
    let per_slot = d.state_per_slot();
    let state0 = f32_vec(&mut rng, num_slots * per_slot, -1.0, 1.0);
    let mut ref_state = state0.clone();
    let ref_out = reference(&inp, d, t, &slots, true, &mut ref_state);
    let dp = stream.clone_htod(&packed).unwrap();
    let dab = stream.clone_htod(&ab).unwrap();
    let dal = stream.clone_htod(&inp.a_log).unwrap();
    let ddt = stream.clone_htod(&inp.dt_bias).unwrap();
    let dslots = stream.clone_htod(&slots).unwrap();
    let mut dstate = stream.clone_htod(&state0).unwrap();
    let mut dout = stream.clone_htod(&vec![bf16::NAN; rows * vw]).unwrap();
    let strides =
        DecodeStrides { q: Some(width), k: Some(width), v: Some(width), ab: Some(2 * d.h_v) };
    decode(
        stream,
        d,
        t,
        GdrOptions::default(),
        strides,
        &dp.slice(..),
        &dp.slice(qk..),
        &dp.slice(2 * qk..),
        &dab.slice(..),
        &dab.slice(d.h_v..),
        &dal,
        &ddt,
        &dslots,
        Some(&slots),
        &mut dstate,
        &mut dout,
    )
    .unwrap();
    let out = to_f32(&stream.clone_dtoh(&dout).unwrap());
    let state = stream.clone_dtoh(&dstate).unwrap();
    for (i, &s) in slots.iter().enumerate() {
        if s == -1 {
            let o = &out[i * t * vw..(i + 1) * t * vw];
            assert!(
                o.iter().all(|&x| x.to_bits() == 0),
                "{d:?} seed={seed}: padding row {i} not zero"
            );
        }
    }
    let oe = rel_err(&out, &to_f32(&ref_out));
    let se = rel_err(&state, &ref_state);
    println!("MAXERR gdr.decode strided inputs {d:?} n={n} t={t} pad={pad:?}: out {oe:.3e} state {se:.3e}");
    assert!(oe <= OUT_TOL && se <= STATE_TOL, "{d:?} seed={seed}: out {oe} state {se}");
}

#[test]
fn decode_rejects_bad_arguments() {
    let Some(ctx) = gpu_or_skip("decode_rejects_bad_arguments") else { return };
    let stream = ctx.default_stream();
    let d = GdrDims { h_k: 2, h_v: 4, k: 64, v: 64 };
    let (n, t) = (3usize, 1usize);
    let (mut rng, _) = common::rng(700);
    let inp = make_inputs(&mut rng, d, n * t, Gates::Normal);
    let dev = upload(&stream, &inp);
    let num_slots = 4;
    let state0 = f32_vec(&mut rng, num_slots * d.state_per_slot(), -1.0, 1.0);
    let mut dstate = stream.clone_htod(&state0).unwrap();
    let mut dout = stream.clone_htod(&vec![bf16::NAN; n * d.h_v * d.v]).unwrap();
    let slots = vec![0i32, 2, 3];
    let dslots = stream.clone_htod(&slots).unwrap();
    let short = stream.clone_htod(&inp.q[1..]).unwrap();
    let opts = GdrOptions::default();
    let st = DecodeStrides::default();

    macro_rules! call {
        ($d:expr, $t:expr, $st:expr, $q:expr, $a_log:expr, $host:expr, $state:expr, $out:expr) => {
            decode(
                &stream,
                $d,
                $t,
                opts,
                $st,
                $q,
                &dev.k,
                &dev.v,
                &dev.a,
                &dev.b,
                $a_log,
                &dev.dt_bias,
                &dslots,
                $host,
                $state,
                $out,
            )
        };
    }
    let shape_arg = |e: deltakit::Error| match e {
        deltakit::Error::Shape { arg, .. } => arg,
        other => panic!("expected Error::Shape, got {other}"),
    };
    // Wrong q length.
    let e = call!(d, t, st, &short, &dev.a_log, Some(&slots[..]), &mut dstate, &mut dout);
    assert_eq!(shape_arg(e.unwrap_err()), "q");
    // Wrong out length.
    let mut short_out = stream.clone_htod(&vec![bf16::NAN; n * d.h_v * d.v - 1]).unwrap();
    let e = call!(d, t, st, &dev.q, &dev.a_log, None, &mut dstate, &mut short_out);
    assert_eq!(shape_arg(e.unwrap_err()), "out");
    // a_log of the wrong length.
    let e = call!(d, t, st, &dev.q, &dev.dt_bias.slice(1..), None, &mut dstate, &mut dout);
    assert_eq!(shape_arg(e.unwrap_err()), "a_log");
    // State pool not a whole number of slots.
    let mut bad_state = stream.clone_htod(&state0[1..]).unwrap();
    let e = call!(d, t, st, &dev.q, &dev.a_log, None, &mut bad_state, &mut dout);
    assert_eq!(shape_arg(e.unwrap_err()), "state");
    // Out-of-range and duplicate slots (host copy).
    let e = call!(d, t, st, &dev.q, &dev.a_log, Some(&[0, 4, 1][..]), &mut dstate, &mut dout);
    assert_eq!(shape_arg(e.unwrap_err()), "slots");
    let e = call!(d, t, st, &dev.q, &dev.a_log, Some(&[0, 2, 0][..]), &mut dstate, &mut dout);
    assert_eq!(shape_arg(e.unwrap_err()), "slots");
    let e = call!(d, t, st, &dev.q, &dev.a_log, Some(&[0, 2][..]), &mut dstate, &mut dout);
    assert_eq!(shape_arg(e.unwrap_err()), "slots_host");
    // tokens_per_row = 0 and a token count that does not match.
    let e = call!(d, 0, st, &dev.q, &dev.a_log, None, &mut dstate, &mut dout);
    assert_eq!(shape_arg(e.unwrap_err()), "tokens_per_row");
    let e = call!(d, 2, st, &dev.q, &dev.a_log, None, &mut dstate, &mut dout);
    assert_eq!(shape_arg(e.unwrap_err()), "q");
    // H_v not a multiple of H_k; unsupported head dim.
    let e = call!(GdrDims { h_k: 3, ..d }, t, st, &dev.q, &dev.a_log, None, &mut dstate, &mut dout);
    assert_eq!(shape_arg(e.unwrap_err()), "dims");
    for bad in [GdrDims { k: 96, ..d }, GdrDims { k: 8, ..d }, GdrDims { v: 8, ..d }] {
        let e = call!(bad, t, st, &dev.q, &dev.a_log, None, &mut dstate, &mut dout);
        assert!(matches!(e, Err(deltakit::Error::Unsupported { .. })), "{bad:?}: {e:?}");
    }
    // Misaligned q (view starting one element in) with an explicit stride.
    let st2 = DecodeStrides { q: Some(d.h_k * d.k), ..st };
    let e = call!(d, t, st2, &dev.q.slice(1..), &dev.a_log, None, &mut dstate, &mut dout);
    assert_eq!(shape_arg(e.unwrap_err()), "q");
    // Stride not a multiple of 8.
    let st3 = DecodeStrides { v: Some(d.h_v * d.v + 4), ..st };
    let e = call!(d, t, st3, &dev.q, &dev.a_log, None, &mut dstate, &mut dout);
    assert_eq!(shape_arg(e.unwrap_err()), "v");

    assert!(stream.clone_dtoh(&dout).unwrap().iter().all(|x| x.is_nan()), "out written on error");
    let s = stream.clone_dtoh(&dstate).unwrap();
    assert!(s.iter().zip(&state0).all(|(a, b)| a.to_bits() == b.to_bits()), "state written");
}

/// One step's host data of the PDL pair: conv input rows and the gate inputs.
struct PairStep {
    x: Vec<bf16>,
    a: Vec<bf16>,
    b: Vec<bf16>,
}

/// `steps` decode steps of `conv1d.update` (W = 4, writing the packed q / k / v of fresh random
/// inputs into a NaN-poisoned per-step buffer) followed immediately by `gdr.decode` reading them
/// (strided views) on the same stream, with both state pools carried across steps; eagerly or
/// captured in one CUDA graph. `conv1d.update` triggers its dependents at entry and the small-batch
/// `gdr.decode` route (< 128 (row, head) pairs, K = V = 128) is a programmatic dependent launch, so
/// this checks the placement of its `griddepcontrol.wait`: a read of q / k / v / a / b before it
/// would see NaN or the previous step. Returns the worst out / state errors vs deltakit-ref.
#[allow(clippy::too_many_lines, clippy::too_many_arguments)] // one pipeline, checked end to end
fn pdl_pair_case(
    stream: &Arc<CudaStream>,
    case: u64,
    d: GdrDims,
    n: usize,
    t: usize,
    steps: usize,
    pad: &[usize],
    graph: bool,
) -> CaseResult {
    use deltakit::ops::conv1d::{update, ConvDims};
    use deltakit_ref::conv1d as rconv;
    let (mut rng, seed) = common::rng(case);
    let rows = n * t;
    let (qk, vw) = (d.h_k * d.k, d.h_v * d.v);
    let cd = 2 * qk + vw;
    let cdims = ConvDims { conv_dim: cd, width: 4 };
    let (slots, num_slots) = slot_layout(&mut rng, n, pad);
    let weight = bf16_vec(&mut rng, cd * 4, -0.6, 0.6);
    let bias = bf16_vec(&mut rng, cd, -0.2, 0.2);
    let a_log = f32_vec(&mut rng, d.h_v, -2.0, 1.0);
    let dt_bias = f32_vec(&mut rng, d.h_v, -1.0, 1.0);
    let cstate0 = bf16_vec(&mut rng, num_slots * cd * 3, -1.0, 1.0);
    let per_slot = d.state_per_slot();
    let state0 = f32_vec(&mut rng, num_slots * per_slot, -1.0, 1.0);
    let host: Vec<PairStep> = (0..steps)
        .map(|_| PairStep {
            x: bf16_vec(&mut rng, rows * cd, -2.0, 2.0),
            a: bf16_vec(&mut rng, rows * d.h_v, -3.0, 3.0),
            b: bf16_vec(&mut rng, rows * d.h_v, -3.0, 3.0),
        })
        .collect();

    // Reference: conv1d.update then gdr.decode per step, both pools carried.
    let (mut ref_cstate, mut ref_state) = (cstate0.clone(), state0.clone());
    let mut ref_outs = Vec::with_capacity(steps * rows * vw);
    for st in &host {
        let mut qkv = vec![bf16::ZERO; rows * cd];
        let rd = rconv::ConvDims { conv_dim: cd, width: 4 };
        rconv::update(&st.x, &weight, Some(&bias[..]), rd, t, &slots, &mut ref_cstate, &mut qkv)
            .unwrap();
        let split = |lo: usize, w: usize| -> Vec<bf16> {
            (0..rows).flat_map(|r| qkv[r * cd + lo..r * cd + lo + w].to_vec()).collect()
        };
        let inp = Inputs {
            q: split(0, qk),
            k: split(qk, qk),
            v: split(2 * qk, vw),
            a: st.a.clone(),
            b: st.b.clone(),
            a_log: a_log.clone(),
            dt_bias: dt_bias.clone(),
        };
        ref_outs.extend(reference(&inp, d, t, &slots, true, &mut ref_state));
    }

    // Device buffers: every step's inputs uploaded ahead, every step's conv output and decode
    // output poisoned with NaN.
    let xs: Vec<bf16> = host.iter().flat_map(|s| s.x.iter().copied()).collect();
    let as_: Vec<bf16> = host.iter().flat_map(|s| s.a.iter().copied()).collect();
    let bs: Vec<bf16> = host.iter().flat_map(|s| s.b.iter().copied()).collect();
    let dx = stream.clone_htod(&xs).unwrap();
    let da = stream.clone_htod(&as_).unwrap();
    let db = stream.clone_htod(&bs).unwrap();
    let dw = stream.clone_htod(&weight).unwrap();
    let dbias = stream.clone_htod(&bias).unwrap();
    let dal = stream.clone_htod(&a_log).unwrap();
    let ddt = stream.clone_htod(&dt_bias).unwrap();
    let dslots = stream.clone_htod(&slots).unwrap();
    let mut dcstate = stream.clone_htod(&cstate0).unwrap();
    let mut dstate = stream.clone_htod(&state0).unwrap();
    let mut dqkv = stream.clone_htod(&vec![bf16::NAN; steps * rows * cd]).unwrap();
    let mut dout = stream.clone_htod(&vec![bf16::NAN; steps * rows * vw]).unwrap();
    stream.synchronize().unwrap();

    let strides = DecodeStrides { q: Some(cd), k: Some(cd), v: Some(cd), ab: None };
    let mut enqueue = |i: usize| {
        let (xr, qr) = (i * rows * cd..(i + 1) * rows * cd, i * rows * cd..(i + 1) * rows * cd);
        update(
            stream,
            cdims,
            t,
            &dx.slice(xr),
            None,
            &dw,
            Some(&dbias),
            &dslots,
            None,
            &mut dcstate,
            &mut dqkv.slice_mut(qr.clone()),
        )
        .unwrap();
        let qkv = dqkv.slice(qr);
        let abr = i * rows * d.h_v..(i + 1) * rows * d.h_v;
        decode(
            stream,
            d,
            t,
            GdrOptions::default(),
            strides,
            &qkv.slice(..),
            &qkv.slice(qk..),
            &qkv.slice(2 * qk..),
            &da.slice(abr.clone()),
            &db.slice(abr),
            &dal,
            &ddt,
            &dslots,
            None,
            &mut dstate,
            &mut dout.slice_mut(i * rows * vw..(i + 1) * rows * vw),
        )
        .unwrap();
    };
    if graph {
        use deltakit::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
        stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
        for i in 0..steps {
            enqueue(i);
        }
        let g = stream.end_capture(CUgraphInstantiate_flags(0)).unwrap().unwrap();
        g.launch().unwrap();
        stream.synchronize().unwrap(); // the graph outlives its replay
    } else {
        for i in 0..steps {
            enqueue(i);
        }
    }
    let out = to_f32(&stream.clone_dtoh(&dout).unwrap());
    let state = stream.clone_dtoh(&dstate).unwrap();
    let ctx = format!("{d:?} n={n} t={t} steps={steps} pad={pad:?} graph={graph} seed={seed}");
    let step_w = rows * vw;
    let mut out_err = 0f64;
    for i in 0..steps {
        let e = rel_err(
            &out[i * step_w..(i + 1) * step_w],
            &to_f32(&ref_outs[i * step_w..(i + 1) * step_w]),
        );
        assert!(e <= OUT_TOL, "{ctx}: step {i} out rel err {e}");
        out_err = out_err.max(e);
    }
    for (r, &s) in slots.iter().enumerate() {
        if s == -1 {
            let o = &out[r * t * vw..(r + 1) * t * vw];
            assert!(o.iter().all(|&x| x.to_bits() == 0), "{ctx}: padding row {r} not zero");
        }
    }
    let live: Vec<usize> = slots.iter().filter(|&&s| s >= 0).map(|&s| s as usize).collect();
    let (mut got_s, mut ref_s) = (Vec::new(), Vec::new());
    for s in 0..num_slots {
        let r = s * per_slot..(s + 1) * per_slot;
        if live.contains(&s) {
            got_s.extend_from_slice(&state[r.clone()]);
            ref_s.extend_from_slice(&ref_state[r]);
        } else {
            assert!(
                state[r.clone()].iter().zip(&state0[r]).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{ctx}: canary slot {s} changed"
            );
        }
    }
    let state_err = rel_err(&got_s, &ref_s);
    assert!(state_err <= STATE_TOL, "{ctx}: state rel err {state_err}");
    CaseResult { out_err, state_err }
}

/// The engine's decode pair conv1d.update -> gdr.decode (programmatic dependent launch on the
/// small-batch route; `DELTAKIT_GDR_DECODE_NO_PDL=1` runs the same checks on the plain kernel):
/// 27B TP1 / TP2 / 9B-like head counts at the batches the PDL route serves (and one past it),
/// T = 1 and 2, a padding row, many steps back to back on one stream, then once in a CUDA graph.
#[test]
fn decode_pdl_pair_behind_conv1d_update() {
    let Some(ctx) = gpu_or_skip("decode_pdl_pair_behind_conv1d_update") else { return };
    // SAFETY: every buffer of this test is used on `stream` only (its own stream, as the engine's;
    // no event records between the pair's kernels).
    unsafe { ctx.disable_event_tracking() };
    let stream = ctx.new_stream().unwrap();
    let steps = if sanitize() { 6 } else { 40 };
    let mut worst = (0.0, 0.0);
    let mut case = 9000;
    let cases: &[(usize, usize, usize, usize, &[usize])] = &[
        (16, 48, 1, 1, &[]),
        (16, 48, 2, 1, &[1]),
        (8, 24, 1, 1, &[]),
        (8, 24, 5, 1, &[3]),
        (16, 32, 3, 1, &[]),
        (16, 48, 1, 2, &[]),
        (8, 24, 6, 1, &[]),
    ];
    for &(h_k, h_v, n, t, pad) in cases {
        let d = GdrDims { h_k, h_v, k: 128, v: 128 };
        for graph in [false, true] {
            case += 1;
            let r = pdl_pair_case(&stream, case, d, n, t, steps, pad, graph);
            fold(&mut worst, &r);
        }
    }
    report("PDL pair behind conv1d.update (27B TP1 / TP2, 9B; eager + graph)", worst);
}
