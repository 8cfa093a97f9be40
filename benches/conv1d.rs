//! Criterion benches of `conv1d.update` (decode, S = 1) and `conv1d.prefill` (varlen) on the GPU
//! at the Qwen3.5-27B per-rank conv_dim (TP1: 2*16*128 + 48*128 = 10240; TP2: 5120), W = 4.
//! Throughput = bytes of x read + out written + conv state read/written (+ weight).
#![allow(missing_docs)] // criterion_group!/criterion_main! generate undocumented public items
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use deltakit::cudarc::driver::CudaSlice;
use deltakit::ops::conv1d::{prefill, update, ConvDims};
use half::bf16;
use std::time::{Duration, Instant};

fn benches(c: &mut Criterion) {
    let Some(ctx) = deltakit::testing::gpu_or_skip("benches/conv1d") else { return };
    let stream = ctx.default_stream();
    let mut g = c.benchmark_group("conv1d");
    let none_b: Option<&CudaSlice<bf16>> = None;
    let none_h: Option<&CudaSlice<u8>> = None;
    for conv_dim in [10240usize, 5120] {
        let d = ConvDims { conv_dim, width: 4 };
        let weight = stream.clone_htod(&vec![bf16::from_f32(0.1); conv_dim * 4]).unwrap();
        let slots_n = 256;
        let mut state = stream.alloc_zeros::<bf16>(slots_n * conv_dim * 3).unwrap();
        let slots: Vec<i32> = (0..slots_n as i32).collect();
        let dslots = stream.clone_htod(&slots).unwrap();
        for n in [1usize, 64, 256] {
            let x = stream.clone_htod(&vec![bf16::from_f32(0.5); n * conv_dim]).unwrap();
            let mut out = stream.alloc_zeros::<bf16>(n * conv_dim).unwrap();
            g.throughput(Throughput::Bytes((n * conv_dim * 2 * (2 + 2 * 3)) as u64));
            g.bench_with_input(
                BenchmarkId::new(format!("update_cd{conv_dim}"), format!("batch{n}")),
                &n,
                |b, &n| {
                    b.iter_custom(|iters| {
                        stream.synchronize().unwrap();
                        let t = Instant::now();
                        for _ in 0..iters {
                            update(
                                &stream,
                                d,
                                1,
                                &x,
                                None,
                                &weight,
                                none_b,
                                &dslots.slice(..n),
                                None,
                                &mut state,
                                &mut out,
                            )
                            .unwrap();
                        }
                        stream.synchronize().unwrap();
                        t.elapsed()
                    });
                },
            );
        }
        // Prefill: 8 sequences of 1024 tokens.
        let (nseq, len) = (8usize, 1024usize);
        let t_tot = nseq * len;
        let x = stream.clone_htod(&vec![bf16::from_f32(0.5); t_tot * conv_dim]).unwrap();
        let mut out = stream.alloc_zeros::<bf16>(t_tot * conv_dim).unwrap();
        let cu: Vec<i32> = (0..=nseq).map(|i| (i * len) as i32).collect();
        let dcu = stream.clone_htod(&cu).unwrap();
        g.throughput(Throughput::Bytes((t_tot * conv_dim * 2 * 2) as u64));
        g.bench_function(BenchmarkId::new(format!("prefill_cd{conv_dim}"), "8x1024"), |b| {
            b.iter_custom(|iters| {
                stream.synchronize().unwrap();
                let t = Instant::now();
                for _ in 0..iters {
                    prefill(
                        &stream,
                        d,
                        &x,
                        None,
                        &weight,
                        none_b,
                        &dcu,
                        &dslots.slice(..nseq),
                        none_h,
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
    g.finish();
}

criterion_group! {
    name = conv1d;
    config = Criterion::default().measurement_time(Duration::from_secs(1)).warm_up_time(Duration::from_millis(300)).sample_size(20);
    targets = benches
}
criterion_main!(conv1d);
