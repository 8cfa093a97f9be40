//! GPU test: `smoke.vadd` (Triton AOT) vs `deltakit_ref::smoke::vadd_f32`, including use from two
//! threads and (when present) a second GPU, which exercises the per-context module cache.
mod common;

use deltakit::ops::smoke::vadd_f32;
use deltakit::testing::{gpu_or_skip, rel_err};

fn run_case(ctx: &std::sync::Arc<deltakit::cudarc::driver::CudaContext>, case: u64, n: usize) {
    let stream = ctx.new_stream().unwrap();
    let (mut rng, seed) = common::rng(case);
    let a = common::randn_f32(&mut rng, n);
    let b = common::randn_f32(&mut rng, n);
    let mut expect = vec![0.0; n];
    deltakit_ref::smoke::vadd_f32(&a, &b, &mut expect).unwrap();
    let da = stream.clone_htod(&a).unwrap();
    let db = stream.clone_htod(&b).unwrap();
    let mut out = stream.clone_htod(&vec![f32::NAN; n]).unwrap(); // poisoned
    vadd_f32(&stream, &da, &db, &mut out).unwrap();
    let got = stream.clone_dtoh(&out).unwrap();
    let err = rel_err(&got, &expect);
    assert!(err == 0.0, "n={n} seed={seed} ordinal={}: rel err {err}", ctx.ordinal());
}

#[test]
fn vadd_matches_reference() {
    let Some(ctx) = gpu_or_skip("vadd_matches_reference") else { return };
    for (case, n) in [1usize, 1023, 1024, 1025, 3 << 20].into_iter().enumerate() {
        run_case(&ctx, case as u64, n);
    }
}

#[test]
fn vadd_from_threads_and_devices() {
    let Some(ctx0) = gpu_or_skip("vadd_from_threads_and_devices") else { return };
    let count = deltakit::cudarc::driver::CudaContext::device_count().unwrap_or(1).max(1) as usize;
    let mut ctxs = vec![ctx0];
    for i in 1..count.min(4) {
        ctxs.push(deltakit::cudarc::driver::CudaContext::new(i).unwrap());
    }
    std::thread::scope(|s| {
        for (i, ctx) in ctxs.iter().enumerate() {
            for t in 0..2u64 {
                s.spawn(move || run_case(ctx, 100 + i as u64 * 10 + t, 5000 + i * 7));
            }
        }
    });
}

#[test]
fn vadd_rejects_bad_arguments() {
    let Some(ctx) = gpu_or_skip("vadd_rejects_bad_arguments") else { return };
    let stream = ctx.default_stream();
    let a = stream.clone_htod(&[1.0f32; 64]).unwrap();
    let mut out = stream.clone_htod(&[f32::NAN; 64]).unwrap();
    let short = stream.clone_htod(&[1.0f32; 63]).unwrap();
    let e = vadd_f32(&stream, &a, &short, &mut out).unwrap_err();
    assert!(matches!(e, deltakit::Error::Shape { arg: "b", .. }), "{e}");
    // A view starting one element in is 4-byte aligned only.
    let e = vadd_f32(&stream, &a.slice(1..), &a.slice(1..), &mut out.slice_mut(1..)).unwrap_err();
    assert!(matches!(e, deltakit::Error::Shape { arg: "a", .. }), "{e}");
    assert!(stream.clone_dtoh(&out).unwrap().iter().all(|x| x.is_nan()), "written on error path");
}
