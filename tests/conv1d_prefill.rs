//! GPU test: `conv1d.prefill` (CUDA C++) vs `deltakit_ref::conv1d::prefill`: varlen batches with
//! sequences of length 0, 1, 2, W-1, W, 100, 1000, padding sequences, `has_initial_state`, bias
//! on/off, canary slots, strided input; split invariance on the GPU; bad arguments.
mod common;

use std::sync::Arc;

use deltakit::cudarc::driver::{CudaSlice, CudaStream};
use deltakit::ops::conv1d::{prefill, ConvDims, VarlenHost};
use deltakit::testing::{gpu_or_skip, rel_err};
use deltakit_ref::conv1d as rconv;
use half::bf16;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;

fn bf16_vec(rng: &mut StdRng, n: usize) -> Vec<bf16> {
    (0..n).map(|_| bf16::from_f32(rng.gen_range(-1.0f32..1.0))).collect()
}

fn to_f32(x: &[bf16]) -> Vec<f32> {
    x.iter().map(|v| v.to_f32()).collect()
}

fn bits_eq(a: &[bf16], b: &[bf16]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

struct Case {
    lens: Vec<usize>,
    /// Sequences that are padding (slot -1).
    pad: Vec<usize>,
    /// Sequences that start from zeros.
    no_init: Vec<usize>,
    bias: bool,
    x_pad: usize,
}

/// Runs one case on GPU and reference; checks exactness of state/canaries and returns the out
/// error (and the max |diff| of out in units of bf16 values).
fn run(stream: &Arc<CudaStream>, case_id: u64, d: ConvDims, c: &Case) -> f64 {
    let (mut rng, seed) = common::rng(case_id);
    let n = c.lens.len();
    let t: usize = c.lens.iter().sum();
    let cd = d.conv_dim;
    let mut cu = vec![0i32];
    for &l in &c.lens {
        cu.push(cu.last().unwrap() + l as i32);
    }
    let num_slots = n + 3;
    let mut pool: Vec<i32> = (0..num_slots as i32).collect();
    pool.shuffle(&mut rng);
    let mut slots = pool[..n].to_vec();
    for &p in &c.pad {
        slots[p] = -1;
    }
    let his: Vec<bool> = (0..n).map(|i| !c.no_init.contains(&i)).collect();
    let his_u8: Vec<u8> = his.iter().map(|&b| u8::from(b)).collect();
    let x = bf16_vec(&mut rng, t * cd);
    let weight = bf16_vec(&mut rng, cd * d.width);
    let bias = bf16_vec(&mut rng, cd);
    let per_slot = cd * (d.width - 1);
    let state0 = bf16_vec(&mut rng, num_slots * per_slot);

    let mut ref_state = state0.clone();
    let mut ref_out = vec![bf16::ZERO; t * cd];
    let varlen =
        deltakit_ref::Varlen { cu_seqlens: &cu, slots: &slots, has_initial_state: Some(&his) };
    rconv::prefill(
        &x,
        &weight,
        c.bias.then_some(&bias[..]),
        rconv::ConvDims { conv_dim: cd, width: d.width },
        varlen,
        &mut ref_state,
        &mut ref_out,
    )
    .unwrap();

    // x with a row stride of cd + x_pad.
    let xs = cd + c.x_pad;
    let mut xp = vec![bf16::from_f32(7.0); t * xs];
    for r in 0..t {
        xp[r * xs..r * xs + cd].copy_from_slice(&x[r * cd..(r + 1) * cd]);
    }
    let dx = stream.clone_htod(&xp).unwrap();
    let dw = stream.clone_htod(&weight).unwrap();
    let db = stream.clone_htod(&bias).unwrap();
    let dcu = stream.clone_htod(&cu).unwrap();
    let dslots = stream.clone_htod(&slots).unwrap();
    let dhis = stream.clone_htod(&his_u8).unwrap();
    let mut dstate = stream.clone_htod(&state0).unwrap();
    let mut dout = stream.clone_htod(&vec![bf16::NAN; t * cd]).unwrap();
    prefill(
        stream,
        d,
        &dx,
        (c.x_pad > 0).then_some(xs),
        &dw,
        c.bias.then_some(&db),
        &dcu,
        &dslots,
        Some(&dhis),
        Some(VarlenHost { cu_seqlens: &cu, slots: &slots }),
        &mut dstate,
        &mut dout,
    )
    .unwrap();
    let out = stream.clone_dtoh(&dout).unwrap();
    let state = stream.clone_dtoh(&dstate).unwrap();
    let ctx = format!(
        "{d:?} lens={:?} pad={:?} no_init={:?} bias={} seed={seed}",
        c.lens, c.pad, c.no_init, c.bias
    );
    let err = rel_err(&to_f32(&out), &to_f32(&ref_out));
    assert!(err <= 1e-2, "{ctx}: out rel err {err}");
    for (i, &s) in slots.iter().enumerate() {
        if s == -1 {
            let r = cu[i] as usize * cd..cu[i + 1] as usize * cd;
            assert!(out[r].iter().all(|v| v.to_bits() == 0), "{ctx}: padding seq {i} not zero");
        }
    }
    // The state holds raw bf16 inputs: it must match the reference bit for bit (all slots, so
    // canaries and padding sequences' slots are checked unchanged too).
    assert!(bits_eq(&state, &ref_state), "{ctx}: conv state differs from the reference");
    assert!(
        (0..num_slots).filter(|s| !slots.contains(&(*s as i32))).all(|s| bits_eq(
            &state[s * per_slot..(s + 1) * per_slot],
            &state0[s * per_slot..(s + 1) * per_slot]
        )),
        "{ctx}: canary changed"
    );
    err
}

#[test]
fn prefill_varlen_matches_reference() {
    let Some(ctx) = gpu_or_skip("prefill_varlen_matches_reference") else { return };
    let stream = ctx.default_stream();
    let mut worst = 0f64;
    let mut id = 0;
    for width in [2usize, 3, 4] {
        for conv_dim in [300usize, 128] {
            for bias in [true, false] {
                id += 1;
                let lens = vec![1, 2, width - 1, width, 100, 0, 1000, 3];
                let c = Case { lens, pad: vec![2, 7], no_init: vec![1, 3, 5], bias, x_pad: 0 };
                worst = worst.max(run(&stream, id, ConvDims { conv_dim, width }, &c));
            }
        }
    }
    // Qwen3.5-27B TP2 conv_dim (2*8*128 + 24*128), strided input (packed projection output).
    let c = Case {
        lens: vec![1, 2, 3, 4, 100, 300],
        pad: vec![1],
        no_init: vec![4],
        bias: false,
        x_pad: 16,
    };
    worst = worst.max(run(&stream, 99, ConvDims { conv_dim: 5120, width: 4 }, &c));
    println!("MAXERR conv1d.prefill varlen: out {worst:.3e} (state bit-exact)");
}

/// Prefill of the whole sequences == prefill of the first T1 tokens then of the rest (carrying
/// the conv state), on the GPU, for several split points.
#[test]
fn prefill_split_invariance() {
    let Some(ctx) = gpu_or_skip("prefill_split_invariance") else { return };
    let stream = ctx.default_stream();
    for width in [2usize, 3, 4] {
        let d = ConvDims { conv_dim: 260, width };
        let (mut rng, seed) = common::rng(200 + width as u64);
        let total = 40usize;
        let x = bf16_vec(&mut rng, total * d.conv_dim);
        let weight = stream.clone_htod(&bf16_vec(&mut rng, d.conv_dim * width)).unwrap();
        let bias = stream.clone_htod(&bf16_vec(&mut rng, d.conv_dim)).unwrap();
        let state0 = bf16_vec(&mut rng, 2 * d.conv_dim * (width - 1));
        let slots = stream.clone_htod(&[1i32]).unwrap();
        let run = |xs: &[bf16], state: &mut CudaSlice<bf16>, init: bool| -> Vec<bf16> {
            let t = xs.len() / d.conv_dim;
            let cu = [0i32, t as i32];
            let dcu = stream.clone_htod(&cu).unwrap();
            let dx = stream.clone_htod(xs).unwrap();
            let his = stream.clone_htod(&[u8::from(init)]).unwrap();
            let mut out = stream.clone_htod(&vec![bf16::NAN; xs.len()]).unwrap();
            prefill(
                &stream,
                d,
                &dx,
                None,
                &weight,
                Some(&bias),
                &dcu,
                &slots,
                Some(&his),
                Some(VarlenHost { cu_seqlens: &cu, slots: &[1] }),
                state,
                &mut out,
            )
            .unwrap();
            stream.clone_dtoh(&out).unwrap()
        };
        for init in [true, false] {
            let mut whole_state = stream.clone_htod(&state0).unwrap();
            let whole = run(&x, &mut whole_state, init);
            for t1 in [1usize, 2, width - 1, width, 17, 39] {
                let mut st = stream.clone_htod(&state0).unwrap();
                let mut got = run(&x[..t1 * d.conv_dim], &mut st, init);
                got.extend(run(&x[t1 * d.conv_dim..], &mut st, true));
                assert!(bits_eq(&got, &whole), "W={width} t1={t1} init={init} seed={seed}: out");
                assert!(
                    bits_eq(
                        &stream.clone_dtoh(&st).unwrap(),
                        &stream.clone_dtoh(&whole_state).unwrap()
                    ),
                    "W={width} t1={t1} init={init} seed={seed}: state"
                );
            }
        }
    }
}

#[test]
fn prefill_rejects_bad_arguments() {
    let Some(ctx) = gpu_or_skip("prefill_rejects_bad_arguments") else { return };
    let stream = ctx.default_stream();
    let d = ConvDims { conv_dim: 64, width: 4 };
    let (mut rng, _) = common::rng(300);
    let t = 10usize;
    let x = stream.clone_htod(&bf16_vec(&mut rng, t * 64)).unwrap();
    let w = stream.clone_htod(&bf16_vec(&mut rng, 64 * 4)).unwrap();
    let bias = stream.clone_htod(&bf16_vec(&mut rng, 63)).unwrap();
    let dcu = stream.clone_htod(&[0i32, 4, 10]).unwrap();
    let dslots = stream.clone_htod(&[0i32, 1]).unwrap();
    let state0 = bf16_vec(&mut rng, 2 * 64 * 3);
    let mut state = stream.clone_htod(&state0).unwrap();
    let mut out = stream.clone_htod(&vec![bf16::NAN; t * 64]).unwrap();
    let mut short_out = stream.clone_htod(&vec![bf16::NAN; t * 64 - 1]).unwrap();
    let mut bad_state = stream.clone_htod(&state0[1..]).unwrap();
    let his = stream.clone_htod(&[1u8]).unwrap();
    let nb: Option<&CudaSlice<bf16>> = None;
    let nh: Option<&CudaSlice<u8>> = None;
    let arg = |r: deltakit::Result<()>| match r {
        Err(deltakit::Error::Shape { arg, .. }) => arg,
        other => panic!("expected Error::Shape, got {other:?}"),
    };
    macro_rules! call {
        ($d:expr, $x:expr, $w:expr, $b:expr, $cu:expr, $h:expr, $host:expr, $st:expr, $o:expr) => {
            prefill(&stream, $d, $x, None, $w, $b, $cu, &dslots, $h, $host, $st, $o)
        };
    }
    assert_eq!(arg(call!(d, &x, &w, nb, &dcu, nh, None, &mut state, &mut short_out)), "out");
    assert_eq!(arg(call!(d, &x.slice(1..), &w, nb, &dcu, nh, None, &mut state, &mut out)), "x");
    assert_eq!(
        arg(call!(d, &x, &w.slice(1..), nb, &dcu, nh, None, &mut state, &mut out)),
        "weight"
    );
    assert_eq!(arg(call!(d, &x, &w, Some(&bias), &dcu, nh, None, &mut state, &mut out)), "bias");
    let e = call!(d, &x, &w, nb, &dcu.slice(1..), nh, None, &mut state, &mut out);
    assert_eq!(arg(e), "cu_seqlens");
    let e = call!(d, &x, &w, nb, &dcu, Some(&his), None, &mut state, &mut out);
    assert_eq!(arg(e), "has_initial_state");
    let e = call!(d, &x, &w, nb, &dcu, nh, None, &mut bad_state, &mut out);
    assert_eq!(arg(e), "conv_state");
    let cases: [(&[i32], &[i32], &str); 5] = [
        (&[1, 4, 10], &[0, 1], "cu_seqlens"),
        (&[0, 6, 4], &[0, 1], "cu_seqlens"),
        (&[0, 4, 9], &[0, 1], "cu_seqlens"),
        (&[0, 4, 10], &[0, 2], "slots"),
        (&[0, 4, 10], &[1, 1], "slots"),
    ];
    for (cu, slots, what) in cases {
        let host = Some(VarlenHost { cu_seqlens: cu, slots });
        assert_eq!(arg(call!(d, &x, &w, nb, &dcu, nh, host, &mut state, &mut out)), what);
    }
    let e = call!(ConvDims { width: 5, ..d }, &x, &w, nb, &dcu, nh, None, &mut state, &mut out);
    assert!(matches!(e, Err(deltakit::Error::Unsupported { .. })), "{e:?}");
    assert!(stream.clone_dtoh(&out).unwrap().iter().all(|v| v.is_nan()), "out written on error");
    assert!(bits_eq(&stream.clone_dtoh(&state).unwrap(), &state0), "state written on error");
}
