//! GPU test: `conv1d.update` (CUDA C++) vs `deltakit_ref::conv1d::update`: W in {2,3,4}, S in
//! {1,2,3} new tokens per row, padding rows (-1 and out-of-range device slots), canary slots,
//! bias on/off, strided input; bad arguments.
mod common;

use std::sync::Arc;

use deltakit::cudarc::driver::{CudaSlice, CudaStream};
use deltakit::ops::conv1d::{update, ConvDims};
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

#[allow(clippy::too_many_arguments)]
fn run(
    stream: &Arc<CudaStream>,
    id: u64,
    d: ConvDims,
    n: usize,
    s: usize,
    pad: &[usize],
    dev_pad: i32,
    bias: bool,
    x_pad: usize,
) -> f64 {
    let (mut rng, seed) = common::rng(id);
    let cd = d.conv_dim;
    let num_slots = n + 3;
    let mut pool: Vec<i32> = (0..num_slots as i32).collect();
    pool.shuffle(&mut rng);
    let mut slots = pool[..n].to_vec();
    for &p in pad {
        slots[p] = -1;
    }
    let rows = n * s;
    let x = bf16_vec(&mut rng, rows * cd);
    let weight = bf16_vec(&mut rng, cd * d.width);
    let b = bf16_vec(&mut rng, cd);
    let per_slot = cd * (d.width - 1);
    let state0 = bf16_vec(&mut rng, num_slots * per_slot);
    let mut ref_state = state0.clone();
    let mut ref_out = vec![bf16::ZERO; rows * cd];
    rconv::update(
        &x,
        &weight,
        bias.then_some(&b[..]),
        rconv::ConvDims { conv_dim: cd, width: d.width },
        s,
        &slots,
        &mut ref_state,
        &mut ref_out,
    )
    .unwrap();
    let xs = cd + x_pad;
    let mut xp = vec![bf16::from_f32(7.0); rows * xs];
    for r in 0..rows {
        xp[r * xs..r * xs + cd].copy_from_slice(&x[r * cd..(r + 1) * cd]);
    }
    let dev_slots: Vec<i32> = slots.iter().map(|&v| if v == -1 { dev_pad } else { v }).collect();
    let dx = stream.clone_htod(&xp).unwrap();
    let dw = stream.clone_htod(&weight).unwrap();
    let db = stream.clone_htod(&b).unwrap();
    let dslots = stream.clone_htod(&dev_slots).unwrap();
    let mut dstate = stream.clone_htod(&state0).unwrap();
    let mut dout = stream.clone_htod(&vec![bf16::NAN; rows * cd]).unwrap();
    update(
        stream,
        d,
        s,
        &dx,
        (x_pad > 0).then_some(xs),
        &dw,
        bias.then_some(&db),
        &dslots,
        (dev_pad == -1).then_some(&slots[..]),
        &mut dstate,
        &mut dout,
    )
    .unwrap();
    let out = stream.clone_dtoh(&dout).unwrap();
    let state = stream.clone_dtoh(&dstate).unwrap();
    let ctx = format!("{d:?} n={n} s={s} pad={pad:?} dev_pad={dev_pad} bias={bias} seed={seed}");
    let err = rel_err(&to_f32(&out), &to_f32(&ref_out));
    assert!(err <= 1e-2, "{ctx}: out rel err {err}");
    for &p in pad {
        assert!(
            out[p * s * cd..(p + 1) * s * cd].iter().all(|v| v.to_bits() == 0),
            "{ctx}: pad row {p}"
        );
    }
    // State = raw inputs: bit-exact vs the reference on every slot (canaries unchanged).
    assert!(bits_eq(&state, &ref_state), "{ctx}: conv state");
    err
}

#[test]
fn update_matches_reference() {
    let Some(ctx) = gpu_or_skip("update_matches_reference") else { return };
    let stream = ctx.default_stream();
    let mut worst = 0f64;
    let mut id = 0;
    for width in [2usize, 3, 4] {
        for s in [1usize, 2, 3] {
            for (conv_dim, n) in [(300usize, 7usize), (10240, 5)] {
                id += 1;
                let bias = id % 2 == 0;
                worst = worst.max(run(
                    &stream,
                    id,
                    ConvDims { conv_dim, width },
                    n,
                    s,
                    &[2],
                    -1,
                    bias,
                    0,
                ));
            }
        }
    }
    println!("MAXERR conv1d.update: out {worst:.3e} (state bit-exact)");
}

#[test]
fn update_padding_rows() {
    let Some(ctx) = gpu_or_skip("update_padding_rows") else { return };
    let stream = ctx.default_stream();
    let d = ConvDims { conv_dim: 200, width: 4 };
    run(&stream, 50, d, 6, 2, &[0, 3, 5], -1, true, 0);
    run(&stream, 51, d, 4, 1, &[0, 1, 2, 3], -1, true, 0);
    // Device slots out of range without a host copy: treated as padding by the kernel.
    run(&stream, 52, d, 5, 3, &[1, 4], 1_000_000, false, 0);
    run(&stream, 53, d, 5, 1, &[2], i32::MIN, false, 0);
    // Strided input.
    run(&stream, 54, d, 5, 2, &[3], -1, true, 24);
}

#[test]
fn update_rejects_bad_arguments() {
    let Some(ctx) = gpu_or_skip("update_rejects_bad_arguments") else { return };
    let stream = ctx.default_stream();
    let d = ConvDims { conv_dim: 64, width: 3 };
    let (mut rng, _) = common::rng(70);
    let (n, s) = (3usize, 2usize);
    let x = stream.clone_htod(&bf16_vec(&mut rng, n * s * 64)).unwrap();
    let w = stream.clone_htod(&bf16_vec(&mut rng, 64 * 3)).unwrap();
    let dslots = stream.clone_htod(&[0i32, 1, 2]).unwrap();
    let state0 = bf16_vec(&mut rng, 3 * 64 * 2);
    let mut state = stream.clone_htod(&state0).unwrap();
    let mut bad_state = stream.clone_htod(&state0[1..]).unwrap();
    let mut out = stream.clone_htod(&vec![bf16::NAN; n * s * 64]).unwrap();
    let bias = stream.clone_htod(&bf16_vec(&mut rng, 65)).unwrap();
    let nb: Option<&CudaSlice<bf16>> = None;
    let arg = |r: deltakit::Result<()>| match r {
        Err(deltakit::Error::Shape { arg, .. }) => arg,
        other => panic!("expected Error::Shape, got {other:?}"),
    };
    macro_rules! call {
        ($d:expr, $s:expr, $x:expr, $w:expr, $b:expr, $host:expr, $st:expr) => {
            update(&stream, $d, $s, $x, None, $w, $b, &dslots, $host, $st, &mut out)
        };
    }
    assert_eq!(arg(call!(d, 3, &x, &w, nb, None, &mut state)), "out");
    assert_eq!(arg(call!(d, 0, &x, &w, nb, None, &mut state)), "tokens_per_row");
    assert_eq!(arg(call!(d, s, &x.slice(1..), &w, nb, None, &mut state)), "x");
    assert_eq!(arg(call!(d, s, &x, &w.slice(2..), nb, None, &mut state)), "weight");
    assert_eq!(arg(call!(d, s, &x, &w, Some(&bias), None, &mut state)), "bias");
    assert_eq!(arg(call!(d, s, &x, &w, nb, Some(&[0, 1, 3]), &mut state)), "slots");
    assert_eq!(arg(call!(d, s, &x, &w, nb, Some(&[0, 1, 1]), &mut state)), "slots");
    assert_eq!(arg(call!(d, s, &x, &w, nb, Some(&[0, 1]), &mut state)), "slots_host");
    assert_eq!(arg(call!(d, s, &x, &w, nb, None, &mut bad_state)), "conv_state");
    let e = call!(ConvDims { width: 1, ..d }, s, &x, &w, nb, None, &mut state);
    assert!(matches!(e, Err(deltakit::Error::Unsupported { .. })), "{e:?}");
    assert!(stream.clone_dtoh(&out).unwrap().iter().all(|v| v.is_nan()), "out written on error");
    assert!(bits_eq(&stream.clone_dtoh(&state).unwrap(), &state0), "state written on error");
}
