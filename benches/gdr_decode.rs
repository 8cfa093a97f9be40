//! Criterion bench of `gdr.decode` (GPU) at the Qwen3.5-27B per-rank shapes (TP1: H_k/H_v =
//! 16/48, TP2: 8/24; K = V = 128), T = 1, batch 1/16/64/256. Throughput = state bytes read +
//! written (`2 * N * H_v * K * V * 4`); criterion prints it in GiB/s (x 1.0737 = GB/s). Each
//! iteration uses a different window of slots of a 1024-slot pool (3 GiB at TP1), so the state
//! streams from HBM as in a real decode step, not from L2.
#![allow(missing_docs)] // criterion_group!/criterion_main! generate undocumented public items
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use deltakit::ops::gdr::{decode, DecodeStrides, GdrDims, GdrOptions};
use half::bf16;
use std::time::{Duration, Instant};

const POOL: usize = 1024;

fn benches(c: &mut Criterion) {
    let Some(ctx) = deltakit::testing::gpu_or_skip("benches/gdr_decode") else { return };
    let stream = ctx.default_stream();
    let mut g = c.benchmark_group("gdr_decode");
    for (name, h_k, h_v) in [("27b_tp1_16x48", 16usize, 48usize), ("27b_tp2_8x24", 8, 24)] {
        let d = GdrDims { h_k, h_v, k: 128, v: 128 };
        let per_slot = d.state_per_slot();
        let mut state = stream.alloc_zeros::<f32>(POOL * per_slot).unwrap();
        // Slot permutation (stride 389 is coprime to 1024), repeated so any window is in range.
        let perm: Vec<i32> = (0..2 * POOL).map(|i| ((i * 389) % POOL) as i32).collect();
        let slots = stream.clone_htod(&perm).unwrap();
        let a_log = stream.clone_htod(&vec![-0.5f32; h_v]).unwrap();
        let dt_bias = stream.clone_htod(&vec![0.25f32; h_v]).unwrap();
        for n in [1usize, 16, 64, 256] {
            let rows = n;
            let fill =
                |len: usize, x: f32| stream.clone_htod(&vec![bf16::from_f32(x); len]).unwrap();
            let q = fill(rows * h_k * 128, 0.1);
            let k = fill(rows * h_k * 128, 0.05);
            let v = fill(rows * h_v * 128, 0.2);
            let a = fill(rows * h_v, 0.5);
            let b = fill(rows * h_v, -0.5);
            let mut out = stream.alloc_zeros::<bf16>(rows * h_v * 128).unwrap();
            g.throughput(Throughput::Bytes((2 * n * per_slot * 4) as u64));
            g.bench_with_input(BenchmarkId::new(name, format!("batch{n}")), &n, |bch, &n| {
                let mut window = 0usize;
                bch.iter_custom(|iters| {
                    stream.synchronize().unwrap();
                    let t = Instant::now();
                    for _ in 0..iters {
                        window = (window + n) % POOL;
                        decode(
                            &stream,
                            d,
                            1,
                            GdrOptions::default(),
                            DecodeStrides::default(),
                            &q,
                            &k,
                            &v,
                            &a,
                            &b,
                            &a_log,
                            &dt_bias,
                            &slots.slice(window..window + n),
                            None,
                            &mut state,
                            &mut out,
                        )
                        .unwrap();
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
    name = gdr;
    config = Criterion::default().measurement_time(Duration::from_secs(2)).warm_up_time(Duration::from_millis(300)).sample_size(30);
    targets = benches
}
criterion_main!(gdr);
