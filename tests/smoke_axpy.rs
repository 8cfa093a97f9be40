//! GPU test: `smoke.axpy` (CUDA C++) vs `deltakit_ref::smoke::axpy_bf16`.
mod common;

use deltakit::ops::smoke::axpy_bf16;
use deltakit::testing::{gpu_or_skip, rel_err};
use half::bf16;

#[test]
fn axpy_matches_reference_bitwise() {
    let Some(ctx) = gpu_or_skip("axpy_matches_reference_bitwise") else { return };
    let stream = ctx.default_stream();
    // Odd lengths exercise the scalar tail; offsets exercise the unaligned path.
    for (case, &(n, offset)) in
        [(1usize, 0usize), (7, 0), (8, 0), (4099, 0), (1 << 20, 0), (1000, 1), (65_541, 3)]
            .iter()
            .enumerate()
    {
        let (mut rng, seed) = common::rng(case as u64);
        let x: Vec<bf16> =
            common::randn_f32(&mut rng, n + offset).into_iter().map(bf16::from_f32).collect();
        let y0: Vec<bf16> =
            common::randn_f32(&mut rng, n + offset).into_iter().map(bf16::from_f32).collect();
        let alpha = 0.75f32 + case as f32 * 0.1;
        let mut expect = y0[offset..].to_vec();
        deltakit_ref::smoke::axpy_bf16(alpha, &x[offset..], &mut expect).unwrap();

        let dx = stream.clone_htod(&x).unwrap();
        let mut dy = stream.clone_htod(&y0).unwrap();
        axpy_bf16(&stream, alpha, &dx.slice(offset..), &mut dy.slice_mut(offset..)).unwrap();
        let got = stream.clone_dtoh(&dy).unwrap();
        assert_eq!(&got[..offset], &y0[..offset], "n={n} offset={offset}: wrote before the view");
        let got_f: Vec<f32> = got[offset..].iter().map(|v| v.to_f32()).collect();
        let exp_f: Vec<f32> = expect.iter().map(|v| v.to_f32()).collect();
        let err = rel_err(&got_f, &exp_f);
        assert!(
            err == 0.0,
            "n={n} offset={offset} seed={seed}: rel err {err} (expected bit-exact)"
        );
    }
}

#[test]
fn axpy_rejects_length_mismatch() {
    let Some(ctx) = gpu_or_skip("axpy_rejects_length_mismatch") else { return };
    let stream = ctx.default_stream();
    let x = stream.clone_htod(&[bf16::ONE; 8]).unwrap();
    let mut y = stream.clone_htod(&[bf16::ONE; 9]).unwrap();
    let err = axpy_bf16(&stream, 1.0, &x, &mut y).unwrap_err();
    assert!(matches!(err, deltakit::Error::Shape { arg: "y", .. }), "{err}");
    assert_eq!(stream.clone_dtoh(&y).unwrap(), vec![bf16::ONE; 9], "y written on error path");
}
