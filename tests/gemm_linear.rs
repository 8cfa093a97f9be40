//! GPU test: `gemm.linear` (cuBLASLt) vs `deltakit_ref::mlp::matmul`.
mod common;

use deltakit::ops::gemm::Gemm;
use deltakit::testing::{gpu_or_skip, rel_err};
use half::bf16;

use common::to_bf16;

#[test]
fn linear_matches_reference() {
    let Some(ctx) = gpu_or_skip("linear_matches_reference") else { return };
    let stream = ctx.new_stream().unwrap();
    let gemm = Gemm::new(stream.clone()).unwrap();
    // (M, N, K): decode rows, odd sizes (alignment < 16 bytes), a prefill-like tile.
    let shapes = [
        (1, 256, 64),
        (7, 96, 40),
        (16, 1000, 513),
        (33, 77, 129),
        (256, 640, 384),
        (1, 5120, 2048),
    ];
    for (case, &(m, n, k)) in shapes.iter().enumerate() {
        for accumulate in [false, true] {
            let (mut rng, seed) = common::rng(case as u64 * 2 + u64::from(accumulate));
            let x = to_bf16(&common::randn_f32(&mut rng, m * k));
            let w = to_bf16(&common::randn_f32(&mut rng, n * k));
            let c0 = to_bf16(&common::randn_f32(&mut rng, m * n));
            let mut expect = vec![bf16::ZERO; m * n];
            deltakit_ref::mlp::matmul(&x, &w, k, n, &mut expect).unwrap();
            let expect: Vec<f32> = if accumulate {
                // f32 sum of the product and the old value, one rounding (as beta = 1 does)
                let mut prod = vec![0f32; m * n];
                let xf: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
                let wf: Vec<f32> = w.iter().map(|v| v.to_f32()).collect();
                deltakit_ref::mlp::matmul(&xf, &wf, k, n, &mut prod).unwrap();
                prod.iter().zip(&c0).map(|(p, c)| bf16::from_f32(p + c.to_f32()).to_f32()).collect()
            } else {
                expect.iter().map(|v| v.to_f32()).collect()
            };
            let dx = stream.clone_htod(&x).unwrap();
            let dw = stream.clone_htod(&w).unwrap();
            let init = if accumulate { c0.clone() } else { vec![bf16::NAN; m * n] };
            // The tuned choice, then the legacy cuBLAS candidate forced (the tuner may pick it).
            for legacy in [false, true] {
                let mut dout = stream.clone_htod(&init).unwrap();
                if legacy {
                    gemm.linear_legacy(&dx, &dw, &mut dout, m, n, k, accumulate).unwrap();
                } else {
                    gemm.linear(&dx, &dw, &mut dout, m, n, k, accumulate).unwrap();
                }
                let got: Vec<f32> =
                    stream.clone_dtoh(&dout).unwrap().iter().map(|v| v.to_f32()).collect();
                let err = rel_err(&got, &expect);
                assert!(
                    err <= 1e-2,
                    "M={m} N={n} K={k} acc={accumulate} legacy={legacy} seed={seed}: rel err {err}"
                );
                eprintln!(
                    "gemm M={m} N={n} K={k} acc={accumulate} legacy={legacy}: rel err {err:.2e}"
                );
            }
        }
    }
    // One plan per (shape, accumulate, alignment); a repeat call reuses it.
    let before = gemm.cached_plans();
    let dx = stream.clone_htod(&vec![bf16::ONE; 16 * 64]).unwrap();
    let dw = stream.clone_htod(&vec![bf16::ONE; 32 * 64]).unwrap();
    let mut o = stream.alloc_zeros::<bf16>(16 * 32).unwrap();
    gemm.linear(&dx, &dw, &mut o, 16, 32, 64, false).unwrap();
    gemm.linear(&dx, &dw, &mut o, 16, 32, 64, false).unwrap();
    assert_eq!(gemm.cached_plans(), before + 1);
}

#[test]
fn linear_rejects_bad_shapes() {
    let Some(ctx) = gpu_or_skip("linear_rejects_bad_shapes") else { return };
    let stream = ctx.new_stream().unwrap();
    let gemm = Gemm::new(stream.clone()).unwrap();
    let x = stream.clone_htod(&vec![bf16::ONE; 4 * 8]).unwrap();
    let w = stream.clone_htod(&vec![bf16::ONE; 3 * 8]).unwrap();
    let mut out = stream.clone_htod(&vec![bf16::NAN; 4 * 3]).unwrap();
    let e = gemm.linear(&x, &w, &mut out, 4, 3, 9, false).unwrap_err();
    assert!(matches!(e, deltakit::Error::Shape { arg: "x", .. }), "{e}");
    let e = gemm.linear(&x, &w, &mut out, 4, 4, 8, false).unwrap_err();
    assert!(matches!(e, deltakit::Error::Shape { arg: "w", .. }), "{e}");
    let e = gemm.linear(&x, &w, &mut out, 0, 3, 8, false).unwrap_err();
    assert!(matches!(e, deltakit::Error::Shape { arg: "m", .. }), "{e}");
    assert!(stream.clone_dtoh(&out).unwrap().iter().all(|v| v.is_nan()), "written on error");
}
