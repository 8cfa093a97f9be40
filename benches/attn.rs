//! Criterion benches of `attn.prefill` and `attn.decode` at Qwen3.5-27B full-attention shapes
//! (TP1: 24 q / 4 kv heads, hd 256; TP2: 12 / 2). Prefill throughput is reported as elements =
//! causal FLOPs (2 * 2 * H_q * T * T * hd / 2): criterion's "elem/s" is FLOP/s. Decode throughput
//! is bytes of K and V read (2 * rows * ctx * H_kv * hd * 2 B).
#![allow(missing_docs)] // criterion_group!/criterion_main! generate undocumented public items
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use deltakit::cudarc::driver::{CudaSlice, CudaStream};
use deltakit::ops::attn::{self, AttnDims, PagedKv, SeqBatch};
use half::bf16;
use std::sync::Arc;
use std::time::{Duration, Instant};

const PAGE: usize = 16;

fn filled(s: &Arc<CudaStream>, n: usize, seed: u32) -> CudaSlice<bf16> {
    // Deterministic non-constant values (never zeros).
    let v: Vec<bf16> = (0..n)
        .map(|i| {
            bf16::from_f32(
                (((i as u32).wrapping_mul(2_654_435_761) ^ seed) % 2001) as f32 / 1000.0 - 1.0,
            )
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

fn benches(c: &mut Criterion) {
    let Some(ctx) = deltakit::testing::gpu_or_skip("benches/attn") else { return };
    let s = ctx.new_stream().unwrap();
    let mut g = c.benchmark_group("attn_prefill");
    for (name, hq, hkv) in [("27b_tp1", 24usize, 4usize), ("27b_tp2", 12, 2)] {
        let dims = AttnDims { n_q_heads: hq, n_kv_heads: hkv, head_dim: 256 };
        for t in [2048usize, 8192] {
            let pages = t.div_ceil(PAGE);
            let kv = PagedKv { page_size: PAGE, num_pages: pages, max_pages: pages };
            let cu = vec![0i32, t as i32];
            let ctxl = vec![0i32];
            let table: Vec<i32> = (0..pages as i32).rev().collect(); // scattered order
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
            let q = filled(&s, t * hq * 256, 1);
            let kc = filled(&s, pages * PAGE * hkv * 256, 2);
            let vc = filled(&s, pages * PAGE * hkv * 256, 3);
            let mut out = s.alloc_zeros::<bf16>(t * hq * 256).unwrap();
            g.throughput(Throughput::Elements((2 * hq * t * t * 256) as u64));
            g.bench_with_input(BenchmarkId::new(name, t), &t, |b, _| {
                b.iter_custom(|n| {
                    time(&s, n, || {
                        attn::prefill(&s, &q, &kc, &vc, dims, kv, &batch, None, &mut out).unwrap();
                    })
                });
            });
        }
    }
    g.finish();
    let mut g = c.benchmark_group("attn_decode");
    let dims = AttnDims { n_q_heads: 24, n_kv_heads: 4, head_dim: 256 };
    for ctxlen in [4096usize, 32_768] {
        for rows in [1usize, 16, 64] {
            let per = ctxlen.div_ceil(PAGE);
            let kv = PagedKv { page_size: PAGE, num_pages: rows * per, max_pages: per };
            let table: Vec<i32> = (0..(rows * per) as i32).collect();
            let lens = vec![ctxlen as i32; rows];
            let (dlens, dtab) = (s.clone_htod(&lens).unwrap(), s.clone_htod(&table).unwrap());
            let q = filled(&s, rows * 24 * 256, 4);
            let kc = filled(&s, rows * per * PAGE * 4 * 256, 5);
            let vc = filled(&s, rows * per * PAGE * 4 * 256, 6);
            let splits = attn::decode_splits(rows, dims, ctxlen);
            let mut ws =
                s.alloc_zeros::<f32>(attn::decode_workspace_len(rows, dims, splits)).unwrap();
            let mut out = s.alloc_zeros::<bf16>(rows * 24 * 256).unwrap();
            g.throughput(Throughput::Bytes((2 * rows * ctxlen * 4 * 256 * 2) as u64));
            g.bench_with_input(
                BenchmarkId::new(format!("27b_tp1_ctx{ctxlen}"), rows),
                &rows,
                |b, _| {
                    b.iter_custom(|n| {
                        time(&s, n, || {
                            attn::decode(
                                &s,
                                &q,
                                &kc,
                                &vc,
                                dims,
                                kv,
                                (&dlens, &lens),
                                (&dtab, &table),
                                None,
                                splits,
                                &mut ws,
                                &mut out,
                            )
                            .unwrap();
                        })
                    });
                },
            );
        }
    }
    g.finish();
}

criterion_group! {
    name = attn_benches;
    config = Criterion::default().measurement_time(Duration::from_secs(1)).warm_up_time(Duration::from_millis(300)).sample_size(20);
    targets = benches
}
criterion_main!(attn_benches);
