//! Criterion bench of `gdr.chunk_prefill` (Triton AOT, GPU) at Qwen3.5 per-rank prefill shapes,
//! K = V = 128, fused gating + q/k L2 norm (the Qwen3.5 path), initial state from the slots.
//!
//! Throughput is the nominal FLOP count `4 * T * H_v * K * V` set as `Throughput::Elements`, so
//! criterion's "elem/s" reads as FLOP/s (Telem/s = TFLOP/s nominal). Group `gdr_chunk_prefill`,
//! ids `<model>_<tp>_<Hk>x<Hv>/<N>x<L>` (N sequences of L tokens); tools/bench_anchors.py reads
//! them from `target/criterion/gdr_chunk_prefill/<id>/new/estimates.json`.
#![allow(missing_docs)] // criterion_group!/criterion_main! generate undocumented public items
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use deltakit::ops::gdr::chunk_prefill::{
    chunk_prefill, workspace_bytes, ChunkPrefillInputs, ChunkPrefillStrides, Gating, HostCopies,
    InitialState,
};
use deltakit::ops::gdr::{GdrDims, GdrOptions};
use half::bf16;
use std::time::{Duration, Instant};

/// (id, H_k, H_v, sequences, tokens per sequence)
const SHAPES: [(&str, usize, usize, usize, usize); 4] = [
    ("27b_tp1_16x48", 16, 48, 1, 8192),
    ("27b_tp2_8x24", 8, 24, 1, 8192),
    ("9b_16x32", 16, 32, 8, 8192),
    ("9b_16x32", 16, 32, 1, 65536),
];

/// Options of criterion's command line that take a value (skipped when looking for the filter).
const VALUED: [&str; 17] = [
    "--warm-up-time",
    "--measurement-time",
    "--sample-size",
    "--save-baseline",
    "--baseline",
    "--baseline-lenient",
    "--load-baseline",
    "--profile-time",
    "--output-format",
    "--color",
    "--noise-threshold",
    "--confidence-level",
    "--significance-level",
    "--nresamples",
    "--plotting-backend",
    "--format",
    "--logfile",
];

/// Criterion's positional filter (`--bench FILTER`) when it is a plain substring (ASCII letters, digits, `_`, `/`):
/// a shape whose id does not contain it would not run, so its inputs (up to ~1 GB, seconds per process) are not
/// built either. Anything else (a regex): `None`, every shape is built.
fn plain_filter() -> Option<String> {
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if VALUED.contains(&a.as_str()) {
            args.next();
        } else if !a.starts_with('-') {
            let plain = a.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '/');
            return plain.then_some(a);
        }
    }
    None
}

/// Deterministic, non-trivial values: a ramp over 509 distinct bf16 values, element i = ((i % 509) / 254 - 1) *
/// scale (one period converted, then copied).
fn ramp(count: usize, scale: f32) -> Vec<bf16> {
    let period: Vec<bf16> =
        (0..509).map(|i| bf16::from_f32((i as f32 / 254.0 - 1.0) * scale)).collect();
    let mut v = Vec::with_capacity(count);
    while v.len() + period.len() <= count {
        v.extend_from_slice(&period);
    }
    let rest = count - v.len();
    v.extend_from_slice(&period[..rest]);
    v
}

fn benches(c: &mut Criterion) {
    let Some(ctx) = deltakit::testing::gpu_or_skip("benches/gdr_chunk_prefill") else { return };
    let stream = ctx.default_stream();
    let filter = plain_filter();
    let mut grp = c.benchmark_group("gdr_chunk_prefill");
    for (name, h_k, h_v, n, len) in SHAPES {
        let id = format!("gdr_chunk_prefill/{name}/{n}x{len}");
        if filter.as_deref().is_some_and(|f| !id.contains(f)) {
            continue;
        }
        let d = GdrDims { h_k, h_v, k: 128, v: 128 };
        let t = n * len;
        let q = stream.clone_htod(&ramp(t * h_k * 128, 1.0)).unwrap();
        let k = stream.clone_htod(&ramp(t * h_k * 128 + 7, 1.0)).unwrap();
        let v = stream.clone_htod(&ramp(t * h_v * 128, 1.0)).unwrap();
        let a = stream.clone_htod(&ramp(t * h_v, 2.0)).unwrap();
        let b = stream.clone_htod(&ramp(t * h_v, 2.0)).unwrap();
        let a_log = stream.clone_htod(&vec![-0.5f32; h_v]).unwrap();
        let dt_bias = stream.clone_htod(&vec![0.25f32; h_v]).unwrap();
        let cu: Vec<i32> = (0..=n).map(|i| (i * len) as i32).collect();
        let cu = stream.clone_htod(&cu).unwrap();
        let slots = stream.clone_htod(&(0..n as i32).collect::<Vec<_>>()).unwrap();
        let mut state = stream.alloc_zeros::<f32>(n * d.state_per_slot()).unwrap();
        let mut out = stream.alloc_zeros::<bf16>(t * h_v * 128).unwrap();
        let mut ws = stream.alloc_zeros::<u8>(workspace_bytes(d, t, n)).unwrap();
        let inputs = ChunkPrefillInputs {
            q: q.as_view(),
            k: k.slice(0..t * h_k * 128),
            v: v.as_view(),
            gating: Gating::Fused {
                a: a.as_view(),
                b: b.as_view(),
                a_log: a_log.as_view(),
                dt_bias: dt_bias.as_view(),
            },
            cu_seqlens: cu.as_view(),
            slots: slots.as_view(),
            initial_state: InitialState::FromSlots,
        };
        let flop = 4 * t * h_v * 128 * 128;
        grp.throughput(Throughput::Elements(flop as u64));
        grp.bench_with_input(BenchmarkId::new(name, format!("{n}x{len}")), &n, |bch, _| {
            bch.iter_custom(|iters| {
                stream.synchronize().unwrap();
                let t0 = Instant::now();
                for _ in 0..iters {
                    chunk_prefill(
                        &stream,
                        d,
                        GdrOptions::default(),
                        ChunkPrefillStrides::default(),
                        &inputs,
                        HostCopies::default(),
                        &mut state,
                        &mut out,
                        &mut ws,
                    )
                    .unwrap();
                }
                stream.synchronize().unwrap();
                t0.elapsed()
            });
        });
    }
    grp.finish();
}

criterion_group! {
    name = gdr;
    config = Criterion::default().measurement_time(Duration::from_secs(1)).warm_up_time(Duration::from_millis(300)).sample_size(10);
    targets = benches
}
criterion_main!(gdr);
