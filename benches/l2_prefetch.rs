//! What `mem.l2_prefetch` buys a batch-1 decode GEMM (`gemm.linear`, M = 1) on its own: the
//! GEMM's event-timed duration after an L2 flush (cold), after a flush and a prefetch of its
//! weight that had time to land (prefetched: bulk, bulk + evict_last, per line), and right after
//! the same GEMM (hot: whatever of the weight L2 kept). Qwen3.5-9B shapes. Prints a table
//! (median of `REPS` per cell, microseconds, and the weight's bytes over that time in TB/s).
//! Not criterion: every timed launch needs its own cache set-up between event pairs.
#![allow(missing_docs)]
use deltakit::cudarc::driver::sys::CUevent_flags;
use deltakit::ops::gemm::Gemm;
use deltakit::ops::mlp::{self, L2PrefetchMode};
use half::bf16;
use std::time::Duration;

const REPS: usize = 15;

fn noise(n: usize, seed: u32) -> Vec<bf16> {
    (0..n)
        .map(|i| {
            let h = (i as u32).wrapping_mul(2_654_435_761) ^ seed.wrapping_mul(0x9E37_79B9);
            let h = h ^ (h >> 15);
            bf16::from_f32(((h % 20_001) as f32 / 10_000.0 - 1.0) * 0.02)
        })
        .collect()
}

fn median(mut v: Vec<f32>) -> f32 {
    v.sort_by(f32::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let Some(ctx) = deltakit::testing::gpu_or_skip("benches/l2_prefetch") else { return };
    let stream = ctx.new_stream().unwrap();
    let gemm = Gemm::new(stream.clone()).unwrap();
    let mut flush = stream.alloc_zeros::<u8>(512 << 20).unwrap();
    let flags = Some(CUevent_flags::CU_EVENT_DEFAULT);
    let (e0, e1) = (ctx.new_event(flags).unwrap(), ctx.new_event(flags).unwrap());
    // (name, N, K): out_features x in_features of the 9B decode GEMMs.
    let shapes = [
        ("out_proj 4096x4096", 4096usize, 4096usize),
        ("attn qkv 10240x4096", 10240, 4096),
        ("gdn in 12352x4096", 12352, 4096),
        ("down 4096x12288", 4096, 12288),
    ];
    println!("l2_prefetch bench: M = 1, median of {REPS}, us (TB/s of weight bytes)");
    println!("| GEMM | MB | cold | bulk | bulk evict_last | lines | hot |");
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for (name, n, k) in shapes {
        let w = stream.clone_htod(&noise(n * k, 1)).unwrap();
        let x = stream.clone_htod(&noise(k, 2)).unwrap();
        let mut out = stream.alloc_zeros::<bf16>(n).unwrap();
        gemm.linear(&x, &w, &mut out, 1, n, k, false).unwrap(); // tunes this shape
        let bytes = n * k * 2;
        let pf_bytes = bytes.min(40 << 20);
        let mut cells = Vec::new();
        for case in 0..5 {
            let mut t = Vec::with_capacity(REPS);
            for _ in 0..REPS {
                stream.memset_zeros(&mut flush).unwrap();
                match case {
                    1 => mlp::l2_prefetch(&stream, &w, pf_bytes, L2PrefetchMode::Bulk, 264).unwrap(),
                    2 => mlp::l2_prefetch(&stream, &w, pf_bytes, L2PrefetchMode::BulkEvictLast, 264)
                        .unwrap(),
                    3 => mlp::l2_prefetch(&stream, &w, pf_bytes, L2PrefetchMode::Lines, 1024).unwrap(),
                    4 => gemm.linear(&x, &w, &mut out, 1, n, k, false).unwrap(),
                    _ => {}
                }
                stream.synchronize().unwrap();
                std::thread::sleep(Duration::from_micros(300)); // the prefetches land
                e0.record(&stream).unwrap();
                gemm.linear(&x, &w, &mut out, 1, n, k, false).unwrap();
                e1.record(&stream).unwrap();
                stream.synchronize().unwrap();
                t.push(e0.elapsed_ms(&e1).unwrap() * 1e3);
            }
            let us = median(t);
            cells.push(format!("{us:.1} ({:.2})", bytes as f32 / us / 1e6));
        }
        println!("| {name} | {:.0} | {} |", bytes as f64 / 1e6, cells.join(" | "));
    }
}
