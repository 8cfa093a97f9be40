//! Criterion benches of `attn.prefill` and `attn.decode` at Qwen3.5-27B full-attention shapes
//! (TP1: 24 q / 4 kv heads, hd 256; TP2: 12 / 2). Prefill throughput is reported as elements =
//! causal FLOPs (2 * 2 * H_q * T * T * hd / 2): criterion's "elem/s" is FLOP/s. Decode throughput
//! is bytes of K and V read (2 * rows * ctx * H_kv * hd * 2 B).
//!
//! `DELTAKIT_BENCH_QUICK=1` skips criterion and times every shape of the issue-14 sweep once
//! (prefill hd 256: 24/4, 12/2, 16/4 at T = 2048, 8192, 32768, a varlen batch 8 x 2048 and 2048
//! new tokens over 30k of context, on the sm_90a kernel and, at 24/4, the Triton kernel; decode
//! 24/4 and 12/2 at contexts 4k and 32k, rows 1, 16, 64), printing one JSON line per shape
//! (`{"group","id","kernel","us","work","unit"}`) for `tools/bench_attn_anchors.py`;
//! `DELTAKIT_BENCH_FILTER=<substring>` keeps the prefill shapes whose id contains it (and no decode);
//! `DELTAKIT_BENCH_PART=prefill|decode` runs one half; the decode half times each sm_90 tile variant
//! and the Triton kernel at several split counts (`DELTAKIT_BENCH_DECODE_FILTER` keeps some shapes).
//! Prefill quick times are the mean of back-to-back calls over ~100 ms; the default kernel is also
//! timed under triton `do_bench`'s protocol (L2 flush before each call, median; JSON group
//! `attn_prefill_db`, `DELTAKIT_BENCH_DOBENCH=0|1|all`), the protocol of the SDPA anchor.
#![allow(missing_docs)] // criterion_group! generates undocumented public items
use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use deltakit::cudarc::driver::{CudaSlice, CudaStream};
use deltakit::ops::attn::{self, AttnDims, DecodeKernel, PagedKv, PrefillKernel, SeqBatch};
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

/// Host metadata of a prefill batch: `n` sequences of `len` new tokens over `ctx` cached ones,
/// pages in reverse order (scattered).
struct HostBatch {
    cu: Vec<i32>,
    ctx: Vec<i32>,
    table: Vec<i32>,
    kv: PagedKv,
}

fn host_batch(n: usize, len: usize, ctx: usize) -> HostBatch {
    let per = (ctx + len).div_ceil(PAGE);
    let cu = (0..=n).map(|i| (i * len) as i32).collect();
    let table = (0..(n * per) as i32).rev().collect();
    HostBatch {
        cu,
        ctx: vec![ctx as i32; n],
        table,
        kv: PagedKv { page_size: PAGE, num_pages: n * per, max_pages: per },
    }
}

/// Mean time of `f` over enough iterations to fill ~100 ms (at least 3, at most 200).
fn quick_time(s: &Arc<CudaStream>, mut f: impl FnMut()) -> f64 {
    let once = time(s, 1, &mut f).as_secs_f64();
    let iters = ((0.1 / once.max(1e-6)) as u64).clamp(3, 200);
    time(s, iters, f).as_secs_f64() / iters as f64
}

/// Median time of one call of `f` under `triton.testing.do_bench`'s protocol (what
/// `tools/bench_attn_anchors.py` times torch SDPA with): `f` once, an estimate over 5 calls each
/// after an L2 flush (a 256 MB `memset` of `flush`), `max(1, 10 ms / est)` warm-up calls back to
/// back, then `max(1, 60 ms / est)` calls, each after a flush, each timed alone by a pair of CUDA
/// events recorded between the flush and the call; the median of those times (mean of the two
/// middle ones for an even count, as torch.quantile). Warm-up 10 ms / rep 60 ms are the anchor
/// script's arguments.
fn dobench_time(
    ctx: &Arc<deltakit::cudarc::driver::CudaContext>,
    s: &Arc<CudaStream>,
    flush: &mut CudaSlice<i32>,
    mut f: impl FnMut(),
) -> f64 {
    use deltakit::cudarc::driver::sys::CUevent_flags;
    let ev = || ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).unwrap();
    f();
    s.synchronize().unwrap();
    let (e0, e1) = (ev(), ev());
    e0.record(s).unwrap();
    for _ in 0..5 {
        s.memset_zeros(flush).unwrap();
        f();
    }
    e1.record(s).unwrap();
    let est = f64::from(e0.elapsed_ms(&e1).unwrap()) / 5.0;
    let n_warmup = ((10.0 / est) as usize).max(1);
    let n_rep = ((60.0 / est) as usize).max(1);
    for _ in 0..n_warmup {
        f();
    }
    let evs: Vec<_> = (0..n_rep).map(|_| (ev(), ev())).collect();
    for (a, b) in &evs {
        s.memset_zeros(flush).unwrap();
        a.record(s).unwrap();
        f();
        b.record(s).unwrap();
    }
    s.synchronize().unwrap();
    let mut ms: Vec<f64> = evs.iter().map(|(a, b)| f64::from(a.elapsed_ms(b).unwrap())).collect();
    ms.sort_by(f64::total_cmp);
    let m = ms.len();
    let med = if m % 2 == 1 { ms[m / 2] } else { 0.5 * (ms[m / 2 - 1] + ms[m / 2]) };
    med * 1e-3
}

/// Reads the prefill timeline of `blocks` row blocks (`attn::prefill_sm90_timeline`, which also
/// clears it) and writes it to `path`: one line per block, `attn::PREFILL_TIMELINE_FIELDS`
/// space-separated `%globaltimer` words (ns).
fn write_timeline(path: &str, blocks: usize) {
    let recs = attn::prefill_sm90_timeline(blocks).unwrap();
    let mut txt = String::new();
    for r in recs.chunks(attn::PREFILL_TIMELINE_FIELDS) {
        let line: Vec<String> = r.iter().map(u64::to_string).collect();
        txt.push_str(&line.join(" "));
        txt.push('\n');
    }
    std::fs::write(path, txt).unwrap();
}

/// Bench names of the sm_90a prefill tile variants (`PrefillKernel::Sm90Variant`).
const VARIANT_NAMES: [&str; 65] = [
    "sm90v0", "sm90v1", "sm90v2", "sm90v3", "sm90v4", "sm90v5", "sm90v6", "sm90v7", "sm90v8",
    "sm90v9", "sm90v10", "sm90v11", "sm90v12", "sm90v13", "sm90v14", "sm90v15", "sm90v16",
    "sm90v17", "sm90v18", "sm90v19", "sm90v20", "sm90v21", "sm90v22", "sm90v23", "sm90v24",
    "sm90v25", "sm90v26", "sm90v27", "sm90v28", "sm90v29", "sm90v30", "sm90v31", "sm90v32",
    "sm90v33", "sm90v34", "sm90v35", "sm90v36", "sm90v37", "sm90v38", "sm90v39", "sm90v40",
    "sm90v41", "sm90v42", "sm90v43", "sm90v44", "sm90v45", "sm90v46", "sm90v47", "sm90v48",
    "sm90v49", "sm90v50", "sm90v51", "sm90v52", "sm90v53", "sm90v54", "sm90v55", "sm90v56",
    "sm90v57", "sm90v58", "sm90v59", "sm90v60", "sm90v61", "sm90v62", "sm90v63", "sm90v64",
];

fn emit(group: &str, id: &str, kernel: &str, secs: f64, work: f64, unit: &str) {
    println!(
        "{{\"group\":\"{group}\",\"id\":\"{id}\",\"kernel\":\"{kernel}\",\"us\":{:.2},\"work\":{work:.6e},\"unit\":\"{unit}\"}}",
        secs * 1e6
    );
}

#[allow(clippy::too_many_lines)] // one sweep
fn quick() {
    let Some(ctx) = deltakit::testing::gpu_or_skip("benches/attn quick") else { return };
    let s = ctx.new_stream().unwrap();
    // (name, hq, hkv, sequences, new tokens each, prior context, FLOPs)
    let mut cases: Vec<(String, usize, usize, usize, usize, usize, f64)> = Vec::new();
    for (name, hq, hkv) in [("27b_tp1", 24usize, 4usize), ("27b_tp2", 12, 2), ("9b_tp1", 16, 4)] {
        for t in [2048usize, 8192, 32_768] {
            let flops = 2.0 * 2.0 * hq as f64 * (t * t) as f64 * 256.0 / 2.0;
            cases.push((format!("{name}/{t}"), hq, hkv, 1, t, 0, flops));
        }
    }
    let f8 = 8.0 * 2.0 * 2.0 * 24.0 * (2048.0 * 2048.0) * 256.0 / 2.0;
    cases.push(("27b_tp1/varlen8x2048".into(), 24, 4, 8, 2048, 0, f8));
    // 2048 new tokens over 30k cached: each query sees 30720 + its own causal prefix.
    let fc = 2.0 * 2.0 * 24.0 * 2048.0 * (30_720.0 + 1024.5) * 256.0;
    cases.push(("27b_tp1/chunk2048_ctx30720".into(), 24, 4, 1, 2048, 30_720, fc));
    let filter = std::env::var("DELTAKIT_BENCH_FILTER").unwrap_or_default();
    let part = std::env::var("DELTAKIT_BENCH_PART").unwrap_or_default();
    for (id, hq, hkv, n, len, ctxl, flops) in &cases {
        if !id.contains(&filter) || part == "decode" {
            continue;
        }
        let dims = AttnDims { n_q_heads: *hq, n_kv_heads: *hkv, head_dim: 256 };
        let hb = host_batch(*n, *len, *ctxl);
        let (dcu, dctx, dtab) = (
            s.clone_htod(&hb.cu).unwrap(),
            s.clone_htod(&hb.ctx).unwrap(),
            s.clone_htod(&hb.table).unwrap(),
        );
        let batch = SeqBatch {
            cu_seqlens: &dcu,
            ctx_lens: &dctx,
            page_table: &dtab,
            host_cu_seqlens: &hb.cu,
            host_ctx_lens: &hb.ctx,
            host_page_table: &hb.table,
        };
        let t = n * len;
        let cache = hb.kv.num_pages * PAGE * hkv * 256;
        let q = filled(&s, t * hq * 256, 1);
        let kc = filled(&s, cache, 2);
        let vc = filled(&s, cache, 3);
        let mut out = s.alloc_zeros::<bf16>(t * hq * 256).unwrap();
        let mut kernels = vec![(PrefillKernel::Auto, "sm90")];
        if !std::env::var("DELTAKIT_TEST_SKIP_PINGPONG").is_ok_and(|v| v == "1") {
            // Tile variants besides the default (Auto: 61, session 13): 61 itself and 48 (the
            // default in sessions 10-12); 0-60 measured before (NOTES.md).
            // DELTAKIT_BENCH_PREFILL_VARIANTS=<comma list> replaces the list.
            let list =
                std::env::var("DELTAKIT_BENCH_PREFILL_VARIANTS").unwrap_or_else(|_| "61,48".into());
            for v in list.split(',').filter_map(|v| v.trim().parse::<u8>().ok()) {
                kernels.push((
                    PrefillKernel::Sm90Variant(v),
                    VARIANT_NAMES[usize::from(v) % VARIANT_NAMES.len()],
                ));
            }
        }
        // Triton at 27B TP1 up to 8k (its 32k run alone would take seconds).
        if id.starts_with("27b_tp1/") && !id.contains("32768") {
            kernels.push((PrefillKernel::Triton, "triton"));
        }
        // One untimed ~100 ms run of the default first: after the shape's setup pause the first
        // kernel timed ran 0-7% faster than the same kernel timed later (GPU clocks, session 4).
        quick_time(&s, || {
            attn::prefill_with(
                PrefillKernel::Auto,
                &s,
                &q,
                &kc,
                &vc,
                dims,
                hb.kv,
                &batch,
                None,
                &mut out,
            )
            .unwrap();
        });
        for &(k, kname) in &kernels {
            let secs = quick_time(&s, || {
                attn::prefill_with(k, &s, &q, &kc, &vc, dims, hb.kv, &batch, None, &mut out)
                    .unwrap();
            });
            emit("attn_prefill", id, kname, secs, *flops, "TFLOP/s");
        }
        // The anchor's protocol (triton do_bench: L2 flush before each call, median of single
        // calls; `dobench_time`) for the default (`DELTAKIT_BENCH_DOBENCH` unset or `1`), every
        // sm90 kernel of the sweep (`all`) or none (`0`): group attn_prefill_db, same kernel
        // names; tools/bench_attn_anchors.py puts them beside SDPA under the same protocol.
        let db = std::env::var("DELTAKIT_BENCH_DOBENCH").unwrap_or_else(|_| "1".into());
        if db != "0" {
            let mut flush = s.alloc_zeros::<i32>(64 << 20).unwrap();
            for &(k, kname) in &kernels {
                if kname == "triton" || (db != "all" && kname != "sm90") {
                    continue;
                }
                let secs = dobench_time(&ctx, &s, &mut flush, || {
                    attn::prefill_with(k, &s, &q, &kc, &vc, dims, hb.kv, &batch, None, &mut out)
                        .unwrap();
                });
                emit("attn_prefill_db", id, kname, secs, *flops, "TFLOP/s");
            }
        }
        // DELTAKIT_BENCH_TIMELINE=<dir>: one recorded launch of each timeline variant (26 = 25,
        // 33 = 32, 35 = 34; 27 = 19 and 29 = 28 measured in session 6; after 3 warm-up calls)
        // per shape named in DELTAKIT_BENCH_TIMELINE_SHAPES
        // (comma list of ids; default the varlen and 27B TP1 2k / 8k rows), its per-block
        // records written to <dir>/tl_<id>_v<variant>.txt (tools/dev_attn_check.py timeline).
        if let Ok(dir) = std::env::var("DELTAKIT_BENCH_TIMELINE") {
            let shapes = std::env::var("DELTAKIT_BENCH_TIMELINE_SHAPES")
                .unwrap_or_else(|_| "27b_tp1/varlen8x2048,27b_tp1/2048,27b_tp1/8192".into());
            if shapes.split(',').any(|x| x == id) {
                let blocks = n * (len * (hq / hkv)).div_ceil(128) * hkv;
                // DELTAKIT_BENCH_TIMELINE_VARIANTS=<comma list> replaces 26,33,35.
                let tl_list = std::env::var("DELTAKIT_BENCH_TIMELINE_VARIANTS")
                    .unwrap_or_else(|_| "26,33,35".into());
                for v in tl_list.split(',').filter_map(|v| v.trim().parse::<u8>().ok()) {
                    let mut run = || {
                        attn::prefill_with(
                            PrefillKernel::Sm90Variant(v),
                            &s,
                            &q,
                            &kc,
                            &vc,
                            dims,
                            hb.kv,
                            &batch,
                            None,
                            &mut out,
                        )
                        .unwrap();
                    };
                    for _ in 0..3 {
                        run();
                    }
                    s.synchronize().unwrap();
                    attn::prefill_sm90_timeline(0).unwrap();
                    run();
                    s.synchronize().unwrap();
                    write_timeline(&format!("{dir}/tl_{}_v{v}.txt", id.replace('/', "_")), blocks);
                    // DELTAKIT_BENCH_TIMELINE_BB=<n>: also the records of the last of n
                    // back-to-back calls (as the timed sweep runs them; every call overwrites
                    // every block's fields) -> tl_bb_<id>_v<variant>.txt, and the mean time per
                    // call of those n calls (group attn_prefill_tl, not in the anchor table).
                    let bb = std::env::var("DELTAKIT_BENCH_TIMELINE_BB")
                        .ok()
                        .and_then(|x| x.parse::<u64>().ok())
                        .unwrap_or(0);
                    if bb > 0 {
                        attn::prefill_sm90_timeline(0).unwrap();
                        let secs = time(&s, bb, &mut run).as_secs_f64() / bb as f64;
                        emit(
                            "attn_prefill_tl",
                            id,
                            VARIANT_NAMES[usize::from(v) % VARIANT_NAMES.len()],
                            secs,
                            *flops,
                            "TFLOP/s",
                        );
                        write_timeline(
                            &format!("{dir}/tl_bb_{}_v{v}.txt", id.replace('/', "_")),
                            blocks,
                        );
                    }
                }
            }
        }
    }
    if !filter.is_empty() || part == "prefill" {
        return;
    }
    // As the engine: no per-buffer event tracking (graph capture and no host events per call).
    // SAFETY: one stream uses every buffer of the decode sweep.
    unsafe { ctx.disable_event_tracking() };
    quick_decode(&s);
}

/// The split count the sm_90 decode launcher's Auto rule picks (`auto_config` in
/// csrc/attn/decode_sm90.cu, repeated here for the bench): the smallest `s <= max_splits` (and
/// <= 4 x SMs) whose `w * s` CTAs fill their waves within 0.04 of the best fill.
fn auto_pick_splits(w: usize, max_splits: usize, sms: usize) -> usize {
    let fill = |ctas: usize| ctas as f64 / (ctas.div_ceil(sms) * sms) as f64;
    let cap = max_splits.min(4 * sms);
    let best = (1..=cap).map(|s| fill(w * s)).fold(0.0, f64::max);
    (1..=cap).find(|&s| fill(w * s) >= best - 0.04).unwrap_or(1)
}

/// Mean time per call of `f` from a CUDA graph of 10 calls replayed for ~30 ms (what the engine
/// does per decode step: no host work in the timing); `None` if the capture failed.
fn graph_time(s: &Arc<CudaStream>, mut f: impl FnMut()) -> Option<f64> {
    use deltakit::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    f(); // warm up (module loads, function attributes) outside the capture
    s.synchronize().ok()?;
    s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).ok()?;
    for _ in 0..10 {
        f();
    }
    let g = s.end_capture(CUgraphInstantiate_flags(0)).ok()??;
    let once = time(s, 1, || g.launch().unwrap()).as_secs_f64();
    let iters = ((0.03 / once.max(1e-6)) as u64).clamp(3, 200);
    Some(time(s, iters, || g.launch().unwrap()).as_secs_f64() / (iters * 10) as f64)
}

/// The decode sweep of `quick`: 27B TP1 (24/4) and TP2 (12/2), hd 256, contexts 4k and 32k, rows
/// 1 / 16 / 64; every sm_90 tile variant and the Triton kernel at the `decode_splits` count and
/// around it, timed by CUDA-graph replay (kernel names `<kernel>_s<splits>`); the sm_90 default and
/// Triton at the heuristic split also timed eagerly (`_eager`: host launch overhead included).
/// `DELTAKIT_BENCH_DECODE_FILTER=<substrings, comma-separated>` keeps the shapes whose id contains
/// one of them.
#[allow(clippy::too_many_lines)] // one sweep
fn quick_decode(s: &Arc<CudaStream>) {
    let filter = std::env::var("DELTAKIT_BENCH_DECODE_FILTER").unwrap_or_default();
    for (name, hq, hkv) in [("27b_tp1", 24usize, 4usize), ("27b_tp2", 12, 2)] {
        let dims = AttnDims { n_q_heads: hq, n_kv_heads: hkv, head_dim: 256 };
        for ctxlen in [4096usize, 32_768] {
            for rows in [1usize, 16, 64] {
                let id = format!("{name}_ctx{ctxlen}/{rows}");
                // (A comma list keeps the shapes matching any of its substrings.)
                if !filter.split(',').any(|f| id.contains(f)) {
                    continue;
                }
                let per = ctxlen.div_ceil(PAGE);
                let kv = PagedKv { page_size: PAGE, num_pages: rows * per, max_pages: per };
                let table: Vec<i32> = (0..(rows * per) as i32).collect();
                let lens = vec![ctxlen as i32; rows];
                let (dlens, dtab) = (s.clone_htod(&lens).unwrap(), s.clone_htod(&table).unwrap());
                let q = filled(s, rows * hq * 256, 4);
                let kc = filled(s, rows * per * PAGE * hkv * 256, 5);
                let vc = filled(s, rows * per * PAGE * hkv * 256, 6);
                // The split heuristics, then a sweep around them (which split count reads fastest).
                let s0 = attn::decode_splits(rows, dims, ctxlen);
                let sl = attn::decode_splits_long_context(rows, dims, ctxlen);
                let mut cands = vec![s0];
                // DELTAKIT_BENCH_DECODE_CANDS=pick: the explicit variants only at the split count
                // Auto picks from s0 (the launcher's balance rule at 132 SMs), for A / B runs of
                // a new default against the old one at the same grid.
                let only_pick =
                    std::env::var("DELTAKIT_BENCH_DECODE_CANDS").is_ok_and(|v| v == "pick");
                let pick = auto_pick_splits(rows * hkv, s0, 132);
                // (2, 4, 8: one / two CTAs per SM at 16 rows, and the cluster variants' range.)
                let more: Vec<usize> =
                    if only_pick { vec![pick] } else { vec![sl, s0 / 2, 2 * s0, 4 * s0, 2, 4, 8] };
                for m in more {
                    if (1..=ctxlen.div_ceil(64).min(1024)).contains(&m) && !cands.contains(&m) {
                        cands.push(m);
                    }
                }
                let most = *cands.iter().max().unwrap();
                let mut ws =
                    s.alloc_zeros::<f32>(attn::decode_workspace_len(rows, dims, most)).unwrap();
                let mut out = s.alloc_zeros::<bf16>(rows * hq * 256).unwrap();
                let bytes = (2 * rows * ctxlen * hkv * 256 * 2) as f64;
                // DELTAKIT_BENCH_DECODE_VARIANTS=<max> (sm90 variants 0..=max, device triage) or
                // a comma list; default: the cp.async tiles 0, 2, 3 and their cluster-combine
                // twins 8, 10, 11 (the bulk-copy variants 4-7 measured slower in session 3).
                let var_env = std::env::var("DELTAKIT_BENCH_DECODE_VARIANTS")
                    .ok()
                    .filter(|v| !v.trim().is_empty())
                    .unwrap_or_else(|| "0,2,3,8,10,11".into());
                // ("a" in the list: Auto at that place, for interleaved A / B samples; a single
                // "a" is a one-entry list. An entry that is neither "a" nor a variant number
                // stops the bench with its text instead of being dropped.)
                let max_only = var_env.trim().parse::<u8>().ok().filter(|_| !var_env.contains(','));
                let mut kernels: Vec<(DecodeKernel, String)> = if let Some(max) = max_only {
                    (0..=max).map(|v| (DecodeKernel::Sm90Variant(v), format!("sm90v{v}"))).collect()
                } else {
                    var_env
                        .split(',')
                        .map(|v| match v.trim() {
                            "a" => (DecodeKernel::Auto, "sm90".to_string()),
                            t => {
                                let v = t.parse::<u8>().unwrap_or_else(|_| {
                                    panic!("DELTAKIT_BENCH_DECODE_VARIANTS: {t:?} is neither a variant number nor \"a\"")
                                });
                                (DecodeKernel::Sm90Variant(v), format!("sm90v{v}"))
                            }
                        })
                        .collect()
                };
                kernels.push((DecodeKernel::Triton, "triton".into()));
                kernels.push((DecodeKernel::Auto, "sm90".into()));
                // One decode call of this shape with `kernel` at `splits` (the sweep below and
                // the timeline variants after it).
                let mut run = |kernel: DecodeKernel, splits: usize| {
                    attn::decode_with(
                        kernel,
                        s,
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
                };
                for (kernel, kname) in &kernels {
                    let mut call = |splits: usize| run(*kernel, splits);
                    // Auto at the heuristic split only; with CANDS=pick the explicit variants
                    // at Auto's pick only (cands[1..]), else at every candidate.
                    let sweep: &[usize] = match (*kernel == DecodeKernel::Auto, only_pick) {
                        (true, _) => &cands[..1],
                        (false, true) if cands.len() > 1 => &cands[1..],
                        _ => &cands,
                    };
                    for (i, &splits) in sweep.iter().enumerate() {
                        let tag = match i {
                            0 if splits == s0 => "_heuristic",
                            _ if splits == sl => "_long",
                            _ => "",
                        };
                        if let Some(secs) = graph_time(s, || call(splits)) {
                            emit(
                                "attn_decode",
                                &id,
                                &format!("{kname}_s{splits}{tag}"),
                                secs,
                                bytes,
                                "GB/s",
                            );
                        }
                        if i == 0 && matches!(kernel, DecodeKernel::Auto | DecodeKernel::Triton) {
                            let secs = quick_time(s, || call(splits));
                            emit(
                                "attn_decode",
                                &id,
                                &format!("{kname}_s{splits}{tag}_eager"),
                                secs,
                                bytes,
                                "GB/s",
                            );
                        }
                    }
                }
                // DELTAKIT_BENCH_TIMELINE=<dir>: the per-CTA timeline of decode variant 12 (= 0)
                // at 4 splits, as the graph replays leave it (the last call of the last
                // replay), for the shapes in DELTAKIT_BENCH_TIMELINE_DECODE (default TP2 4k
                // rows 16) -> <dir>/tld_<id>_v<variant>.txt (tools/dev_attn_check.py timeline-dec).
                if let Ok(dir) = std::env::var("DELTAKIT_BENCH_TIMELINE") {
                    let shapes = std::env::var("DELTAKIT_BENCH_TIMELINE_DECODE")
                        .unwrap_or_else(|_| "27b_tp2_ctx4096/16".into());
                    if shapes.split(',').any(|x| x == id) {
                        // (The launcher's Auto split at 16 rows is 4 at TP2, 2 at TP1, below
                        // `decode_splits`; DELTAKIT_BENCH_TIMELINE_SPLITS overrides 4.)
                        let splits = std::env::var("DELTAKIT_BENCH_TIMELINE_SPLITS")
                            .ok()
                            .and_then(|v| v.parse::<usize>().ok())
                            .unwrap_or(4)
                            .min(most);
                        // DELTAKIT_BENCH_TIMELINE_DECODE_VARIANTS: the timeline variants (12 =
                        // tiles of 0, 22 = 18: strided splits + lean combine); default 12.
                        let tlvs: Vec<u8> =
                            std::env::var("DELTAKIT_BENCH_TIMELINE_DECODE_VARIANTS")
                                .unwrap_or_else(|_| "12".into())
                                .split(',')
                                .filter_map(|v| v.trim().parse().ok())
                                .collect();
                        for tlv in tlvs {
                            let _ = attn::decode_sm90_timeline(0, 0);
                            let t = graph_time(s, || run(DecodeKernel::Sm90Variant(tlv), splits));
                            if let Some(secs) = t {
                                emit(
                                    "attn_decode",
                                    &id,
                                    &format!("sm90v{tlv}_s{splits}"),
                                    secs,
                                    bytes,
                                    "GB/s",
                                );
                            }
                            s.synchronize().unwrap();
                            let ctas = rows * hkv * splits;
                            let (sp, mg) = attn::decode_sm90_timeline(ctas, rows * hq).unwrap();
                            let mut txt = String::new();
                            for (words, tail) in [(&sp, "merge\n"), (&mg, "")] {
                                for r in words.chunks(attn::DECODE_TIMELINE_FIELDS) {
                                    let line: Vec<String> = r.iter().map(u64::to_string).collect();
                                    txt.push_str(&line.join(" "));
                                    txt.push('\n');
                                }
                                txt.push_str(tail);
                            }
                            std::fs::write(
                                format!("{dir}/tld_{}_v{tlv}.txt", id.replace('/', "_")),
                                txt,
                            )
                            .unwrap();
                        }
                    }
                }
            }
        }
    }
}

criterion_group! {
    name = attn_benches;
    config = Criterion::default().measurement_time(Duration::from_secs(1)).warm_up_time(Duration::from_millis(300)).sample_size(20);
    targets = benches
}

fn main() {
    if std::env::var("DELTAKIT_BENCH_QUICK").is_ok_and(|v| v == "1") {
        quick();
        return;
    }
    attn_benches();
    Criterion::default().configure_from_args().final_summary();
}
