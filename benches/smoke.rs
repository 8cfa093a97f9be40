//! Criterion benches of the smoke ops (GPU): achieved GB/s at sizes far beyond L2.
#![allow(missing_docs)] // criterion_group!/criterion_main! generate undocumented public items
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use deltakit::ops::smoke::{axpy_bf16, vadd_f32};
use half::bf16;
use std::time::{Duration, Instant};

fn benches(c: &mut Criterion) {
    let Some(ctx) = deltakit::testing::gpu_or_skip("benches/smoke") else { return };
    let stream = ctx.default_stream();
    let n = 64usize << 20; // 64 Mi elements: 128 MiB bf16, 256 MiB f32 per vector
    let x = stream.clone_htod(&vec![bf16::from_f32(0.5); n]).unwrap();
    let mut y = stream.clone_htod(&vec![bf16::from_f32(0.25); n]).unwrap();
    let mut g = c.benchmark_group("smoke");
    // axpy: read x, read y, write y.
    g.throughput(Throughput::Bytes((3 * 2 * n) as u64));
    g.bench_function("axpy_bf16/64Mi", |bch| {
        bch.iter_custom(|iters| {
            stream.synchronize().unwrap();
            let t = Instant::now();
            for _ in 0..iters {
                axpy_bf16(&stream, 1e-3, &x, &mut y).unwrap();
            }
            stream.synchronize().unwrap();
            t.elapsed()
        });
    });
    let a = stream.clone_htod(&vec![1.0f32; n]).unwrap();
    let b = stream.clone_htod(&vec![2.0f32; n]).unwrap();
    let mut o = stream.alloc_zeros::<f32>(n).unwrap();
    g.throughput(Throughput::Bytes((3 * 4 * n) as u64));
    g.bench_function("vadd_f32/64Mi", |bch| {
        bch.iter_custom(|iters| {
            stream.synchronize().unwrap();
            let t = Instant::now();
            for _ in 0..iters {
                vadd_f32(&stream, &a, &b, &mut o).unwrap();
            }
            stream.synchronize().unwrap();
            t.elapsed()
        });
    });
    g.finish();
}

criterion_group! {
    name = smoke;
    config = Criterion::default().measurement_time(Duration::from_secs(2)).warm_up_time(Duration::from_millis(500));
    targets = benches
}
criterion_main!(smoke);
