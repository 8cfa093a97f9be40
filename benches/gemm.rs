//! Criterion bench of `gemm.linear` (cuBLASLt bf16) at Qwen3.5-9B/27B linear-layer shapes.
//! Throughput is reported as elements = FLOPs (2*M*N*K) per call: criterion's "elem/s" is FLOP/s.
#![allow(missing_docs)] // criterion_group!/criterion_main! generate undocumented public items
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use deltakit::ops::gemm::Gemm;
use half::bf16;
use std::time::{Duration, Instant};

/// Deterministic pseudo-random bf16 values in [-scale, scale]: never constant data (a GEMM on
/// constant or zero inputs draws less power and runs faster than on real weights).
fn noise(n: usize, seed: u32, scale: f32) -> Vec<bf16> {
    (0..n)
        .map(|i| {
            let h = (i as u32).wrapping_mul(2_654_435_761) ^ seed.wrapping_mul(0x9E37_79B9);
            let h = h ^ (h >> 15);
            bf16::from_f32(((h % 20_001) as f32 / 10_000.0 - 1.0) * scale)
        })
        .collect()
}

fn benches(c: &mut Criterion) {
    let Some(ctx) = deltakit::testing::gpu_or_skip("benches/gemm") else { return };
    let stream = ctx.new_stream().unwrap();
    let gemm = Gemm::new(stream.clone()).unwrap();
    // (name, N, K): out_features x in_features
    let layers = [
        ("27b.mlp_gate_up", 2 * 17408, 5120),
        ("27b.mlp_down", 5120, 17408),
        ("27b.gdn_in_qkvz", 2 * 16 * 128 + 2 * 48 * 128, 5120),
        ("9b.mlp_gate_up", 2 * 12288, 4096),
        ("9b.mlp_down", 4096, 12288),
    ];
    let mut g = c.benchmark_group("gemm");
    for (name, n, k) in layers {
        let w = stream.clone_htod(&noise(n * k, 1, 0.02)).unwrap();
        for m in [1usize, 16, 64, 8192] {
            let x = stream.clone_htod(&noise(m * k, 2, 1.0)).unwrap();
            let mut out = stream.alloc_zeros::<bf16>(m * n).unwrap();
            g.throughput(Throughput::Elements((2 * m * n * k) as u64));
            g.bench_with_input(BenchmarkId::new(name, m), &m, |b, &m| {
                b.iter_custom(|iters| {
                    gemm.linear(&x, &w, &mut out, m, n, k, false).unwrap();
                    stream.synchronize().unwrap();
                    let t = Instant::now();
                    for _ in 0..iters {
                        gemm.linear(&x, &w, &mut out, m, n, k, false).unwrap();
                    }
                    stream.synchronize().unwrap();
                    t.elapsed()
                });
            });
        }
    }
    g.finish();
}

criterion_group! {
    name = gemm;
    config = Criterion::default().measurement_time(Duration::from_secs(1)).warm_up_time(Duration::from_millis(300)).sample_size(20);
    targets = benches
}
criterion_main!(gemm);
