//! GPU test: `norm.rms`, `norm.fused_add_rms`, `norm.rms_gated` (CUDA C++) vs
//! `deltakit_ref::norm::{rms_norm, fused_add_rms_norm, rms_norm_gated}`: D in {24, 64, 128, 1000,
//! 2048, 4104, 5120, 12288} (every vector-path thread mapping) and 7, 1030 (scalar path), rows 1 ..
//! 12288; bad arguments.
mod common;

use std::sync::Arc;

use deltakit::cudarc::driver::CudaStream;
use deltakit::ops::norm::{fused_add_rms, rms, rms_gated};
use deltakit::testing::{gpu_or_skip, rel_err};
use deltakit_ref::norm as rnorm;
use half::bf16;
use rand::rngs::StdRng;
use rand::Rng;

const EPS: f32 = 1e-6;

fn bf16_vec(rng: &mut StdRng, n: usize, scale: f32) -> Vec<bf16> {
    (0..n).map(|_| bf16::from_f32(rng.gen_range(-1.0f32..1.0) * scale)).collect()
}

fn to_f32(x: &[bf16]) -> Vec<f32> {
    x.iter().map(|v| v.to_f32()).collect()
}

/// Fraction of elements that differ from the reference (bit-level) and the rel err.
fn compare(got: &[bf16], want: &[bf16]) -> (f64, f64) {
    let diff = got.iter().zip(want).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
    (rel_err(&to_f32(got), &to_f32(want)), diff as f64 / want.len().max(1) as f64)
}

const SHAPES: &[(usize, usize)] = &[
    (1, 128),
    (37, 128),
    (300, 64),
    (5, 2048),
    (64, 2048),
    (3, 5120),
    (33, 5120),
    (2, 4104),
    (9, 1000),
    (4, 7),
    (2, 12288),
    (3, 1030),
    (5, 24),
];

fn shapes() -> Vec<(usize, usize)> {
    SHAPES.to_vec()
}

#[test]
fn rms_matches_reference() {
    let Some(ctx) = gpu_or_skip("rms_matches_reference") else { return };
    let stream = ctx.default_stream();
    let (mut worst, mut worst_frac) = (0f64, 0f64);
    for (id, (rows, d)) in shapes().into_iter().enumerate() {
        let (mut rng, seed) = common::rng(id as u64);
        let x = bf16_vec(&mut rng, rows * d, 4.0);
        let w = bf16_vec(&mut rng, d, 0.5);
        let mut want = vec![bf16::ZERO; rows * d];
        rnorm::rms_norm(&x, &w, EPS, &mut want).unwrap();
        let (dx, dw) = (stream.clone_htod(&x).unwrap(), stream.clone_htod(&w).unwrap());
        let mut dout = stream.clone_htod(&vec![bf16::NAN; rows * d]).unwrap();
        rms(&stream, &dx, &dw, EPS, &mut dout).unwrap();
        let (err, frac) = compare(&stream.clone_dtoh(&dout).unwrap(), &want);
        assert!(err <= 1e-2, "rows={rows} d={d} seed={seed}: rel err {err}");
        worst = worst.max(err);
        worst_frac = worst_frac.max(frac);
    }
    println!(
        "MAXERR norm.rms: out {worst:.3e}, max fraction of elements not bit-equal {worst_frac:.3e}"
    );
}

#[test]
fn fused_add_rms_matches_reference() {
    let Some(ctx) = gpu_or_skip("fused_add_rms_matches_reference") else { return };
    let stream = ctx.default_stream();
    let (mut worst, mut worst_frac) = (0f64, 0f64);
    for (id, (rows, d)) in shapes().into_iter().enumerate() {
        let (mut rng, seed) = common::rng(100 + id as u64);
        let x = bf16_vec(&mut rng, rows * d, 2.0);
        let r0 = bf16_vec(&mut rng, rows * d, 8.0);
        let w = bf16_vec(&mut rng, d, 0.5);
        let mut want = vec![bf16::ZERO; rows * d];
        let mut want_r = r0.clone();
        rnorm::fused_add_rms_norm(&x, &mut want_r, &w, EPS, &mut want).unwrap();
        let (dx, dw) = (stream.clone_htod(&x).unwrap(), stream.clone_htod(&w).unwrap());
        let mut dr = stream.clone_htod(&r0).unwrap();
        let mut dout = stream.clone_htod(&vec![bf16::NAN; rows * d]).unwrap();
        fused_add_rms(&stream, &dx, &mut dr, &dw, EPS, &mut dout).unwrap();
        let got_r = stream.clone_dtoh(&dr).unwrap();
        assert!(
            got_r.iter().zip(&want_r).all(|(a, b)| a.to_bits() == b.to_bits()),
            "rows={rows} d={d} seed={seed}: residual not bit-exact"
        );
        let (err, frac) = compare(&stream.clone_dtoh(&dout).unwrap(), &want);
        assert!(err <= 1e-2, "rows={rows} d={d} seed={seed}: rel err {err}");
        worst = worst.max(err);
        worst_frac = worst_frac.max(frac);
    }
    println!("MAXERR norm.fused_add_rms: out {worst:.3e} (residual bit-exact), max fraction not bit-equal {worst_frac:.3e}");
}

#[test]
fn rms_gated_matches_reference() {
    let Some(ctx) = gpu_or_skip("rms_gated_matches_reference") else { return };
    let stream = ctx.default_stream();
    let (mut worst, mut worst_frac) = (0f64, 0f64);
    // rows = T * H_v; d = V.
    for (id, (rows, d)) in
        [(48usize, 128usize), (7 * 24, 128), (256 * 48, 128), (12, 64), (5, 256), (3, 72), (2, 5)]
            .into_iter()
            .enumerate()
    {
        let (mut rng, seed) = common::rng(200 + id as u64);
        let x = bf16_vec(&mut rng, rows * d, 3.0);
        let z = bf16_vec(&mut rng, rows * d, 6.0);
        let w = bf16_vec(&mut rng, d, 1.5);
        let mut want = vec![bf16::ZERO; rows * d];
        rnorm::rms_norm_gated(&x, &z, &w, EPS, &mut want).unwrap();
        let dx = stream.clone_htod(&x).unwrap();
        let dz = stream.clone_htod(&z).unwrap();
        let dw = stream.clone_htod(&w).unwrap();
        let mut dout = stream.clone_htod(&vec![bf16::NAN; rows * d]).unwrap();
        rms_gated(&stream, &dx, &dz, &dw, EPS, &mut dout).unwrap();
        let (err, frac) = compare(&stream.clone_dtoh(&dout).unwrap(), &want);
        assert!(err <= 1e-2, "rows={rows} d={d} seed={seed}: rel err {err}");
        worst = worst.max(err);
        worst_frac = worst_frac.max(frac);
    }
    println!("MAXERR norm.rms_gated: out {worst:.3e}, max fraction not bit-equal {worst_frac:.3e}");
}

fn shape_arg(r: deltakit::Result<()>) -> &'static str {
    match r {
        Err(deltakit::Error::Shape { arg, .. }) => arg,
        other => panic!("expected Error::Shape, got {other:?}"),
    }
}

#[test]
fn norms_reject_bad_arguments() {
    let Some(ctx) = gpu_or_skip("norms_reject_bad_arguments") else { return };
    let stream: Arc<CudaStream> = ctx.default_stream();
    let x = stream.clone_htod(&vec![bf16::ONE; 4 * 64]).unwrap();
    let w = stream.clone_htod(&vec![bf16::ONE; 64]).unwrap();
    let w_bad = stream.clone_htod(&vec![bf16::ONE; 60]).unwrap();
    let mut out = stream.clone_htod(&vec![bf16::NAN; 4 * 64]).unwrap();
    let mut short = stream.clone_htod(&vec![bf16::NAN; 4 * 64 - 1]).unwrap();
    let r0 = vec![bf16::ONE; 4 * 64];
    let mut res = stream.clone_htod(&r0).unwrap();
    let mut res_short = stream.clone_htod(&r0[1..]).unwrap();
    let empty = stream.alloc_zeros::<bf16>(0).unwrap();
    assert_eq!(shape_arg(rms(&stream, &x, &w_bad, EPS, &mut out)), "x");
    assert_eq!(shape_arg(rms(&stream, &x, &empty, EPS, &mut out)), "w");
    assert_eq!(shape_arg(rms(&stream, &x, &w, EPS, &mut short)), "out");
    assert_eq!(shape_arg(rms(&stream, &x, &w, -1.0, &mut out)), "eps");
    assert_eq!(shape_arg(rms(&stream, &x, &w, f32::NAN, &mut out)), "eps");
    assert_eq!(shape_arg(rms(&stream, &x, &w, 0.0, &mut out)), "eps"); // HF: a positive float
    assert_eq!(
        shape_arg(fused_add_rms(&stream, &x, &mut res_short, &w, EPS, &mut out)),
        "residual"
    );
    assert_eq!(shape_arg(fused_add_rms(&stream, &x, &mut res, &w, EPS, &mut short)), "out");
    assert_eq!(shape_arg(fused_add_rms(&stream, &x, &mut res, &w_bad, EPS, &mut out)), "x");
    assert_eq!(shape_arg(rms_gated(&stream, &x, &x.slice(1..), &w, EPS, &mut out)), "z");
    assert_eq!(shape_arg(rms_gated(&stream, &x, &x, &w, EPS, &mut short)), "out");
    assert_eq!(shape_arg(rms_gated(&stream, &x, &x, &w_bad, EPS, &mut out)), "x");
    assert!(stream.clone_dtoh(&out).unwrap().iter().all(|v| v.is_nan()), "out written on error");
    assert!(stream.clone_dtoh(&short).unwrap().iter().all(|v| v.is_nan()), "out written on error");
    assert_eq!(stream.clone_dtoh(&res).unwrap(), r0, "residual written on error");
}

/// `rms_gated_strided`: z as the `in_proj_z` column view of the engine's merged decode projection
/// `[qkv | z | b | a]` (token rows of `pc` elements, `H_v` rows of `V` each at column `off`), vs
/// the reference on the same z gathered contiguously; plus the stride/heads argument errors.
#[test]
fn rms_gated_strided_z_matches_reference() {
    use deltakit::ops::norm::rms_gated_strided;
    let Some(ctx) = gpu_or_skip("rms_gated_strided_z_matches_reference") else { return };
    let stream = ctx.default_stream();
    // (tokens, H_v, V, column offset of z, extra columns after z); 9B: off = conv_dim 8192.
    for (id, (t, hv, d, off, tail)) in [
        (1usize, 32usize, 128usize, 8192usize, 64usize),
        (16, 32, 128, 8192, 64),
        (7, 6, 128, 2304, 12),
        (5, 4, 64, 40, 8), // offset not a multiple of 8 elements: scalar path
        (3, 2, 16, 48, 4),
    ]
    .into_iter()
    .enumerate()
    {
        let (mut rng, seed) = common::rng(300 + id as u64);
        let pc = off + hv * d + tail;
        let proj = bf16_vec(&mut rng, t * pc, 6.0);
        let x = bf16_vec(&mut rng, t * hv * d, 3.0);
        let w = bf16_vec(&mut rng, d, 1.5);
        let z: Vec<bf16> = (0..t)
            .flat_map(|i| proj[i * pc + off..i * pc + off + hv * d].iter().copied())
            .collect();
        let mut want = vec![bf16::ZERO; t * hv * d];
        rnorm::rms_norm_gated(&x, &z, &w, EPS, &mut want).unwrap();
        let dp = stream.clone_htod(&proj).unwrap();
        let dx = stream.clone_htod(&x).unwrap();
        let dw = stream.clone_htod(&w).unwrap();
        let mut dout = stream.clone_htod(&vec![bf16::NAN; t * hv * d]).unwrap();
        let zv = dp.slice(off..);
        rms_gated_strided(&stream, &dx, (&zv, Some((pc, hv))), &dw, EPS, &mut dout).unwrap();
        let (err, _) = compare(&stream.clone_dtoh(&dout).unwrap(), &want);
        assert!(err <= 1e-2, "t={t} hv={hv} d={d} off={off} seed={seed}: rel err {err}");
        // Bad strided arguments: typed errors naming the argument, output untouched.
        let mut poison = stream.clone_htod(&vec![bf16::NAN; t * hv * d]).unwrap();
        let bad = [
            (Some((pc, 0)), "z heads"),
            (Some((hv * d - 1, hv)), "z token stride"),
            (Some((2 * pc, hv)), "z"),
        ];
        for (zs, arg) in bad {
            if arg == "z" && t == 1 {
                continue; // one token reads a single row: any stride fits
            }
            assert_eq!(
                shape_arg(rms_gated_strided(&stream, &dx, (&zv, zs), &dw, EPS, &mut poison)),
                arg
            );
        }
        let r =
            rms_gated_strided(&stream, &dx, (&zv, Some((pc, t * hv + 1))), &dw, EPS, &mut poison);
        assert_eq!(shape_arg(r), "z heads", "heads not dividing the rows");
        assert!(
            stream.clone_dtoh(&poison).unwrap().iter().all(|v| v.is_nan()),
            "out written on error"
        );
    }
}
