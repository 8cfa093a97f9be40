//! Criterion benches of `norm.rms`, `norm.fused_add_rms` (hidden 5120, Qwen3.5-27B) and
//! `norm.rms_gated` (rows = T * 48 value heads, V = 128) on the GPU. Throughput = bytes read +
//! written (bf16).
#![allow(missing_docs)] // criterion_group!/criterion_main! generate undocumented public items
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use deltakit::ops::norm::{fused_add_rms, rms, rms_gated};
use half::bf16;
use std::time::{Duration, Instant};

fn benches(c: &mut Criterion) {
    let Some(ctx) = deltakit::testing::gpu_or_skip("benches/norm") else { return };
    let stream = ctx.default_stream();
    let mut g = c.benchmark_group("norm");
    let d = 5120usize;
    let w = stream.clone_htod(&vec![bf16::from_f32(0.1); d]).unwrap();
    for rows in [1usize, 64, 256, 8192] {
        let x = stream.clone_htod(&vec![bf16::from_f32(0.5); rows * d]).unwrap();
        let mut res = stream.clone_htod(&vec![bf16::from_f32(0.25); rows * d]).unwrap();
        let mut out = stream.alloc_zeros::<bf16>(rows * d).unwrap();
        g.throughput(Throughput::Bytes((rows * d * 2 * 2) as u64));
        g.bench_with_input(BenchmarkId::new("rms_d5120", format!("rows{rows}")), &rows, |b, _| {
            b.iter_custom(|iters| {
                stream.synchronize().unwrap();
                let t = Instant::now();
                for _ in 0..iters {
                    rms(&stream, &x, &w, 1e-6, &mut out).unwrap();
                }
                stream.synchronize().unwrap();
                t.elapsed()
            });
        });
        g.throughput(Throughput::Bytes((rows * d * 2 * 4) as u64));
        g.bench_with_input(
            BenchmarkId::new("fused_add_rms_d5120", format!("rows{rows}")),
            &rows,
            |b, _| {
                b.iter_custom(|iters| {
                    stream.synchronize().unwrap();
                    let t = Instant::now();
                    for _ in 0..iters {
                        fused_add_rms(&stream, &x, &mut res, &w, 1e-6, &mut out).unwrap();
                    }
                    stream.synchronize().unwrap();
                    t.elapsed()
                });
            },
        );
    }
    let v = 128usize;
    let wg = stream.clone_htod(&vec![bf16::from_f32(1.0); v]).unwrap();
    for t in [1usize, 64, 256, 4096] {
        let rows = t * 48;
        let x = stream.clone_htod(&vec![bf16::from_f32(0.5); rows * v]).unwrap();
        let z = stream.clone_htod(&vec![bf16::from_f32(0.3); rows * v]).unwrap();
        let mut out = stream.alloc_zeros::<bf16>(rows * v).unwrap();
        g.throughput(Throughput::Bytes((rows * v * 2 * 3) as u64));
        g.bench_with_input(BenchmarkId::new("rms_gated_48x128", format!("t{t}")), &t, |b, _| {
            b.iter_custom(|iters| {
                stream.synchronize().unwrap();
                let t0 = Instant::now();
                for _ in 0..iters {
                    rms_gated(&stream, &x, &z, &wg, 1e-6, &mut out).unwrap();
                }
                stream.synchronize().unwrap();
                t0.elapsed()
            });
        });
    }
    g.finish();
}

criterion_group! {
    name = norm;
    config = Criterion::default().measurement_time(Duration::from_secs(1)).warm_up_time(Duration::from_millis(300)).sample_size(20);
    targets = benches
}
criterion_main!(norm);
