//! Criterion benches of the memory-bound decoder pieces at Qwen3.5-27B shapes: `mlp.silu_and_mul`,
//! `sample.argmax`, `sample.topk_logprobs` (k = 20) and `sample.top_p` (vocab 248320), and
//! `attn.prep` (24 q / 4 kv heads, hd 256, rotary 64, page 16).
//! Throughput is the bytes each op must move (inputs read once, outputs written once).
#![allow(missing_docs)] // criterion_group!/criterion_main! generate undocumented public items
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use deltakit::cudarc::driver::{CudaSlice, CudaStream};
use deltakit::ops::attn::{self, AttnDims, PagedKv, Rope, SeqBatch};
use deltakit::ops::{mlp, sample};
use half::bf16;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Deterministic non-constant bf16 values in [-scale, scale] (never zeros or constants).
fn noise(s: &Arc<CudaStream>, n: usize, seed: u32, scale: f32) -> CudaSlice<bf16> {
    let v: Vec<bf16> = (0..n)
        .map(|i| {
            let h = (i as u32).wrapping_mul(2_654_435_761) ^ seed.wrapping_mul(0x9E37_79B9);
            let h = h ^ (h >> 15);
            bf16::from_f32(((h % 20_001) as f32 / 10_000.0 - 1.0) * scale)
        })
        .collect();
    s.clone_htod(&v).unwrap()
}

fn time(s: &Arc<CudaStream>, iters: u64, mut f: impl FnMut()) -> Duration {
    f();
    s.synchronize().unwrap();
    let t = Instant::now();
    for _ in 0..iters {
        f();
    }
    s.synchronize().unwrap();
    t.elapsed()
}

/// `sample.topk_logprobs` (k = 20) and `sample.top_p` at the Qwen3.5 vocabulary. Throughput is
/// the bf16 logits read once (the kernels re-read each row from L2 in later passes).
fn sampling(c: &mut Criterion, s: &Arc<CudaStream>) {
    let vocab = 248_320usize;
    let mut g = c.benchmark_group("topk_logprobs");
    let k = 20usize;
    for rows in [1usize, 16, 64] {
        let logits = noise(s, rows * vocab, 8, 20.0);
        let mut ids = s.alloc_zeros::<i32>(rows * k).unwrap();
        let mut lps = s.alloc_zeros::<f32>(rows * k).unwrap();
        g.throughput(Throughput::Bytes((rows * vocab * 2) as u64));
        g.bench_with_input(BenchmarkId::new("vocab248320_k20", rows), &rows, |b, _| {
            b.iter_custom(|n| {
                time(s, n, || {
                    sample::topk_logprobs(s, &logits, vocab, k, &mut ids, &mut lps).unwrap();
                })
            });
        });
    }
    g.finish();
    let mut g = c.benchmark_group("top_p");
    for rows in [1usize, 16, 64] {
        let logits = noise(s, rows * vocab, 9, 20.0);
        let temperature = s.clone_htod(&vec![0.8f32; rows]).unwrap();
        let top_p = s.clone_htod(&vec![0.95f32; rows]).unwrap();
        let seed = s.clone_htod(&(0..rows as u64).map(|r| r * 7 + 1).collect::<Vec<_>>()).unwrap();
        let counter = s.clone_htod(&vec![3u64; rows]).unwrap();
        let mut ids = s.alloc_zeros::<i32>(rows).unwrap();
        g.throughput(Throughput::Bytes((rows * vocab * 2) as u64));
        g.bench_with_input(BenchmarkId::new("vocab248320_t0.8_p0.95", rows), &rows, |b, _| {
            b.iter_custom(|n| {
                time(s, n, || {
                    sample::top_p(
                        s,
                        &logits,
                        vocab,
                        &temperature,
                        &top_p,
                        &seed,
                        &counter,
                        &mut ids,
                    )
                    .unwrap();
                })
            });
        });
    }
    g.finish();
}

fn benches(c: &mut Criterion) {
    let Some(ctx) = deltakit::testing::gpu_or_skip("benches/elementwise") else { return };
    let s = ctx.new_stream().unwrap();
    let mut g = c.benchmark_group("silu_and_mul");
    let inter = 17_408usize;
    for rows in [1usize, 64, 8192] {
        let x = noise(&s, rows * 2 * inter, 1, 4.0);
        let mut out = s.alloc_zeros::<bf16>(rows * inter).unwrap();
        g.throughput(Throughput::Bytes((rows * 3 * inter * 2) as u64));
        g.bench_with_input(BenchmarkId::new("27b", rows), &rows, |b, _| {
            b.iter_custom(|n| time(&s, n, || mlp::silu_and_mul(&s, &x, inter, &mut out).unwrap()));
        });
    }
    g.finish();
    let mut g = c.benchmark_group("argmax");
    let vocab = 248_320usize;
    for rows in [1usize, 64] {
        let logits = noise(&s, rows * vocab, 2, 20.0);
        let mut ids = s.alloc_zeros::<i32>(rows).unwrap();
        g.throughput(Throughput::Bytes((rows * vocab * 2) as u64));
        g.bench_with_input(BenchmarkId::new("vocab248320", rows), &rows, |b, _| {
            b.iter_custom(|n| {
                time(&s, n, || sample::argmax(&s, &logits, vocab, &mut ids).unwrap())
            });
        });
    }
    g.finish();
    sampling(c, &s);
    let mut g = c.benchmark_group("attn_prep");
    let dims = AttnDims { n_q_heads: 24, n_kv_heads: 4, head_dim: 256 };
    let rope = Rope { rotary_dim: 64, theta: 1.0e7 };
    for t in [64usize, 8192] {
        let pages = t.div_ceil(16);
        let kv = PagedKv { page_size: 16, num_pages: pages, max_pages: pages };
        let (cu, ctxl) = (vec![0i32, t as i32], vec![0i32]);
        let table: Vec<i32> = (0..pages as i32).rev().collect();
        let (dcu, dctx, dtab) = (
            s.clone_htod(&cu).unwrap(),
            s.clone_htod(&ctxl).unwrap(),
            s.clone_htod(&table).unwrap(),
        );
        let batch = SeqBatch {
            cu_seqlens: &dcu,
            ctx_lens: &dctx,
            page_table: &dtab,
            host_cu_seqlens: &cu,
            host_ctx_lens: &ctxl,
            host_page_table: &table,
        };
        let qg = noise(&s, t * 24 * 2 * 256, 3, 2.0);
        let (k, v) = (noise(&s, t * 4 * 256, 4, 2.0), noise(&s, t * 4 * 256, 5, 2.0));
        let (qw, kw) = (noise(&s, 256, 6, 0.3), noise(&s, 256, 7, 0.3));
        let mut kc = s.alloc_zeros::<bf16>(pages * 16 * 4 * 256).unwrap();
        let mut vc = s.alloc_zeros::<bf16>(pages * 16 * 4 * 256).unwrap();
        let mut q = s.alloc_zeros::<bf16>(t * 24 * 256).unwrap();
        let mut gate = s.alloc_zeros::<bf16>(t * 24 * 256).unwrap();
        // Read q|gate, k, v; write q, gate, k, v (bf16).
        g.throughput(Throughput::Bytes((2 * t * (24 * 2 * 256 + 2 * 4 * 256) * 2) as u64));
        g.bench_with_input(BenchmarkId::new("27b_tp1", t), &t, |b, _| {
            b.iter_custom(|n| {
                time(&s, n, || {
                    attn::prep(
                        &s,
                        (&qg, None),
                        (&k, None),
                        (&v, None),
                        &qw,
                        &kw,
                        1e-6,
                        rope,
                        dims,
                        kv,
                        &batch,
                        &mut kc,
                        &mut vc,
                        &mut q,
                        &mut gate,
                    )
                    .unwrap();
                })
            });
        });
    }
    g.finish();
}

criterion_group! {
    name = elementwise_benches;
    config = Criterion::default().measurement_time(Duration::from_secs(1)).warm_up_time(Duration::from_millis(300)).sample_size(20);
    targets = benches
}
criterion_main!(elementwise_benches);
