//! CUDA-graph decode and device sampling (`--features cuda`; skips without a GPU unless
//! `DELTAKIT_REQUIRE_GPU=1`). Model: the tiny-causal fixture's config with GDN head dims 64 / 64
//! (the tuned kernels), seeded dummy weights (generated on the device by `init.dummy`).
//!
//! - graph replay == eager (no graphs) for batches that straddle buckets (1..16 rows);
//! - rows joining and leaving between steps, slots and pages reused (== a fresh engine);
//! - a one-token prompt and a prompt that fills the context;
//! - device sampling == the host sampler (same seeds, same tokens);
//! - padded rows are inert: NaN in their inputs, every other slot and page bit-identical, live
//!   slots equal to an unpadded run.
//!
//! Greedy tokens are compared up to the first position where the reference's top-2 gap is under
//! `TIE` (bf16 paths may flip a near-tie); log-probabilities within `LP_TOL`.

use deltakit_engine::backend::cuda::CudaBackend;
use deltakit_engine::backend::{StepBatch, StepKind};
use deltakit_engine::config::ModelConfig;
use deltakit_engine::generate::{Engine, Event, GenOptions, Request, RowSampling, SamplingParams};
use deltakit_engine::graph::CudaDecodeRunner;
use deltakit_engine::launch::{self, GraphOptions, Source};
use deltakit_engine::model::Qwen35;
use deltakit_engine::paths::find_fixtures_dir;
use deltakit_engine::rank::{Rank, StepRunner, WantRows};
use deltakit_engine::state::CacheConfig;
use deltakit_engine::weights::DummyWeights;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const SEED: u64 = 17;
const TIE: f32 = 0.05;
const LP_TOL: f32 = 0.08;

fn cfg() -> ModelConfig {
    let dir = find_fixtures_dir().expect("tests/fixtures").join("tiny-causal");
    let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let mut root: serde_json::Value = serde_json::from_str(&text).unwrap();
    root["linear_key_head_dim"] = 64.into();
    root["linear_value_head_dim"] = 64.into();
    ModelConfig::parse(&root.to_string()).unwrap()
}

/// The GPU, serialized across this binary's tests (see `gpu_lock` in golden_common), or `None`
/// (skip) without one.
fn gpu() -> Option<std::sync::MutexGuard<'static, ()>> {
    static GPU: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let g = GPU.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    deltakit::testing::gpu_or_skip("graph_cuda").map(|_| g)
}

fn engine(seqs: usize, max_ctx: usize, graphs: bool) -> Engine {
    let cache = CacheConfig::for_sequences(seqs, max_ctx, 16);
    let g = GraphOptions { enabled: graphs, ..GraphOptions::default() };
    launch::cuda::single(&Source::Dummy(cfg(), SEED), 0, cache, false, &g).unwrap()
}

/// A plain rank (no graphs, logits to the host, host sampler).
fn host_engine(seqs: usize, max_ctx: usize) -> Engine {
    let cache = CacheConfig::for_sequences(seqs, max_ctx, 16);
    let be = CudaBackend::new(0).unwrap();
    let model = Qwen35::load(&be, &cfg(), &mut DummyWeights::new(SEED), false).unwrap();
    Engine::new(be, model, cache).unwrap()
}

/// Per request: tokens, each token's logprob, each token's top-2 gap.
type Out = Vec<(Vec<u32>, Vec<f32>, Vec<f32>)>;

fn run(e: &mut Engine, reqs: &[Request]) -> Out {
    let mut out: Out = vec![(Vec::new(), Vec::new(), Vec::new()); reqs.len()];
    e.generate(reqs, GenOptions::default(), &mut |ev| {
        if let Event::Token { req, token, logprob, topk, .. } = ev {
            let t = topk.unwrap_or_default();
            let gap = if t.len() >= 2 { t[0].1 - t[1].1 } else { f32::INFINITY };
            assert!(logprob.is_finite() && logprob <= 1e-3, "logprob {logprob}");
            out[req].0.push(token);
            out[req].1.push(logprob);
            out[req].2.push(gap);
        }
    })
    .unwrap();
    out
}

fn greedy(rng: &mut StdRng, n: usize, vocab: usize, gen: usize) -> Vec<Request> {
    (0..n)
        .map(|i| Request {
            prompt: (0..rng.gen_range(1..40)).map(|_| rng.gen_range(0..vocab as u32)).collect(),
            params: SamplingParams {
                max_tokens: gen + i % 5,
                logprobs: Some(2),
                ..SamplingParams::default()
            },
        })
        .collect()
}

/// Compare `got` with `want` up to each request's first near-tie; returns the max |dlogprob|.
fn compare(what: &str, got: &Out, want: &Out) -> f32 {
    let mut worst = 0f32;
    for (r, (g, w)) in got.iter().zip(want).enumerate() {
        for j in 0..w.0.len() {
            assert!(j < g.0.len(), "{what}: request {r} stopped at {} of {}", g.0.len(), w.0.len());
            let d = (g.1[j] - w.1[j]).abs();
            worst = worst.max(d);
            assert!(d <= LP_TOL, "{what}: request {r} token {j}: |dlogprob| {d}");
            if g.0[j] != w.0[j] {
                assert!(
                    w.2[j] < TIE,
                    "{what}: request {r} token {j}: {} vs {} (gap {})",
                    g.0[j],
                    w.0[j],
                    w.2[j]
                );
                break;
            }
            if w.2[j] < TIE {
                break;
            }
        }
    }
    worst
}

/// Graph replay equals eager decoding for batches of 1..16 rows (buckets 1, 2, 4, 8, 16, so 3,
/// 5, 13 rows run padded).
#[test]
fn graph_equals_eager_across_buckets() {
    let Some(_gpu) = gpu() else {
        return;
    };
    let vocab = cfg().vocab_size;
    let mut g = engine(16, 96, true);
    let mut e = engine(16, 96, false);
    assert!(g.backend_name().contains("graphs"), "{}", g.backend_name());
    assert!(e.backend_name().contains("eager"), "{}", e.backend_name());
    let mut rng = StdRng::seed_from_u64(rand::random());
    for n in [1usize, 2, 3, 4, 5, 8, 13, 16] {
        let reqs = greedy(&mut rng, n, vocab, 12);
        let d = compare(&format!("{n} rows"), &run(&mut g, &reqs), &run(&mut e, &reqs));
        eprintln!("graph vs eager, {n} rows: max |dlogprob| {d:.3e}");
    }
}

/// Continuous batching: 10 requests of different lengths over 4 slots join and leave between
/// decode steps; each request's tokens equal a fresh engine's (reused slots start clean).
#[test]
fn rows_join_leave_and_reuse_slots() {
    let Some(_gpu) = gpu() else {
        return;
    };
    let vocab = cfg().vocab_size;
    let mut rng = StdRng::seed_from_u64(rand::random());
    let reqs = greedy(&mut rng, 10, vocab, 3);
    let got = run(&mut engine(4, 96, true), &reqs);
    let mut want = Vec::new();
    for r in &reqs {
        want.extend(run(&mut engine(1, 96, false), std::slice::from_ref(r)));
    }
    let d = compare("join/leave", &got, &want);
    eprintln!("continuous batching vs fresh engines: max |dlogprob| {d:.3e}");
}

/// A one-token prompt, and a prompt one token short of the context (finishes by context).
#[test]
fn one_token_prompt_and_full_context() {
    let Some(_gpu) = gpu() else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(rand::random());
    let vocab = cfg().vocab_size as u32;
    let reqs = vec![
        Request {
            prompt: vec![rng.gen_range(0..vocab)],
            params: SamplingParams {
                max_tokens: 8,
                logprobs: Some(2),
                ..SamplingParams::default()
            },
        },
        Request {
            prompt: (0..47).map(|_| rng.gen_range(0..vocab)).collect(),
            params: SamplingParams {
                max_tokens: 8,
                logprobs: Some(2),
                ..SamplingParams::default()
            },
        },
    ];
    let got = run(&mut engine(2, 48, true), &reqs);
    let want = run(&mut engine(2, 48, false), &reqs);
    compare("edges", &got, &want);
    assert_eq!(want[1].0.len(), 2, "a 47-token prompt in a 48-token context yields 2 tokens");
}

/// Device sampling (temperature / top-p, seeded) draws exactly the host sampler's tokens on the
/// same logits (eager, unpadded: the same kernels as the host engine's forward).
#[test]
fn device_sampling_equals_host_sampler() {
    let Some(_gpu) = gpu() else {
        return;
    };
    let vocab = cfg().vocab_size as u32;
    let mut rng = StdRng::seed_from_u64(rand::random());
    let reqs: Vec<Request> = (0..6)
        .map(|i| Request {
            prompt: (0..rng.gen_range(2..30)).map(|_| rng.gen_range(0..vocab)).collect(),
            params: SamplingParams {
                temperature: [0.0, 0.7, 1.0, 1.3, 0.5, 2.0][i],
                top_p: [1.0, 0.9, 0.5, 1.0, 0.95, 0.8][i],
                seed: rng.gen(),
                max_tokens: 16,
                logprobs: Some(3),
                ..SamplingParams::default()
            },
        })
        .collect();
    let dev = run(&mut engine(6, 64, false), &reqs);
    let host = run(&mut host_engine(6, 64), &reqs);
    for (r, (d, h)) in dev.iter().zip(&host).enumerate() {
        assert_eq!(d.0, h.0, "request {r}: device vs host sampler");
        for (a, b) in d.1.iter().zip(&h.1) {
            assert!((a - b).abs() < 1e-3, "request {r}: logprob {a} vs {b}");
        }
    }
    // The graph path samples with the same kernels (tokens may differ only through the padded
    // batch's last-bit differences in the logits): it must produce valid, finished requests.
    let graph = run(&mut engine(6, 64, true), &reqs);
    assert!(graph.iter().zip(&reqs).all(|(g, r)| g.0.len() == r.params.max_tokens));
}

/// Padded rows read and write nothing of a live sequence: with NaN in the padded rows' inputs
/// (an out-of-range padding token, which the embedding turns into a NaN row), decoding 3 of 8
/// prefilled sequences through bucket 4 leaves every other slot's GDN state and every other
/// page of the KV cache bit-identical, gives finite outputs, and leaves the live slots equal
/// (to f32 rounding) to an unpadded eager run.
#[test]
#[allow(clippy::too_many_lines)] // one scenario: prefill, snapshot, padded decode, compare
fn padded_rows_are_inert() {
    let Some(_gpu) = gpu() else {
        return;
    };
    let c = cfg();
    let (seqs, max_ctx, page) = (8usize, 64usize, 16usize);
    let cache = CacheConfig::for_sequences(seqs, max_ctx, page);
    let mk = |graphs: bool| {
        let be = CudaBackend::new(0).unwrap();
        let model = Qwen35::load(&be, &c, &mut DummyWeights::new(SEED), false).unwrap();
        let rank = Rank::new(be, model, cache).unwrap();
        let g = GraphOptions { enabled: graphs, ..GraphOptions::default() };
        CudaDecodeRunner::new(rank, cache, &g).unwrap()
    };
    let (mut padded, mut plain) = (mk(true), mk(false));
    assert!(padded.captured_buckets().contains(&4), "{:?}", padded.captured_buckets());
    let mp = max_ctx / page;
    let mut rng = StdRng::seed_from_u64(rand::random());
    let prompts: Vec<Vec<u32>> = (0..seqs)
        .map(|_| (0..rng.gen_range(5..20)).map(|_| rng.gen_range(0..c.vocab_size as u32)).collect())
        .collect();
    // Prefill all 8 (slot i, pages i*mp..), identically on both runners.
    let mut b = StepBatch {
        kind: StepKind::Prefill,
        cu_seqlens: vec![0],
        slots: (0..seqs as i32).collect(),
        ctx_lens: vec![0; seqs],
        positions: Vec::new(),
        page_table: (0..(seqs * mp) as i32).collect(),
        max_pages: mp,
    };
    let mut ids = Vec::new();
    for p in &prompts {
        ids.extend_from_slice(p);
        b.cu_seqlens.push(ids.len() as i32);
        b.positions.extend(0..p.len() as i64);
    }
    for r in [&mut padded, &mut plain] {
        for s in 0..seqs {
            r.reset_slot(s).unwrap();
        }
        r.step(&ids, &b, &WantRows::Nothing).unwrap();
    }
    let snapshot = |r: &CudaDecodeRunner| {
        let be = r.rank().backend();
        let gdn: Vec<_> =
            r.rank().caches().gdn.iter().map(|g| be.gdn_state_to_host(g).unwrap()).collect();
        let kv: Vec<_> = r.rank().caches().kv.iter().map(|k| be.kv_to_host(k).unwrap()).collect();
        (gdn, kv)
    };
    let before = snapshot(&padded);
    padded.rank().backend().set_padding_token(c.vocab_size as u32 + 7);
    let live = [1usize, 4, 6];
    let mut lens: Vec<usize> = live.iter().map(|&s| prompts[s].len()).collect();
    let mut toks: Vec<u32> = live.iter().map(|&s| *prompts[s].last().unwrap()).collect();
    for step in 0..5 {
        let db = StepBatch {
            kind: StepKind::Decode,
            cu_seqlens: (0..=live.len() as i32).collect(),
            slots: live.iter().map(|&s| s as i32).collect(),
            ctx_lens: lens.iter().map(|&l| l as i32).collect(),
            positions: lens.iter().map(|&l| l as i64).collect(),
            page_table: live.iter().flat_map(|&s| (s * mp) as i32..((s + 1) * mp) as i32).collect(),
            max_pages: mp,
        };
        let rows: Vec<RowSampling> = live
            .iter()
            .map(|_| RowSampling { temperature: 0.0, top_p: 1.0, seed: 0, counter: step, topk: 2 })
            .collect();
        let a = padded.decode_sample(&toks, &db, &rows).unwrap();
        let p = plain.decode_sample(&toks, &db, &rows).unwrap();
        for (x, y) in a.iter().zip(&p) {
            assert!(x.logprob.is_finite() && (x.token as usize) < c.vocab_size, "{x:?}");
            assert!((x.logprob - y.logprob).abs() < LP_TOL, "{x:?} vs {y:?}");
        }
        toks = p.iter().map(|s| s.token).collect();
        for l in &mut lens {
            *l += 1;
        }
    }
    let after = snapshot(&padded);
    let unpadded = snapshot(&plain);
    let d = c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim;
    let cd = c.conv_dim() * (c.conv_kernel - 1);
    let mut live_diff = 0f32;
    for (l, ((b0, a0), u0)) in before.0.iter().zip(&after.0).zip(&unpadded.0).enumerate() {
        for s in 0..seqs {
            let (rr, cc) = (s * d..(s + 1) * d, s * cd..(s + 1) * cd);
            if live.contains(&s) {
                for (x, y) in a0.0[rr.clone()].iter().zip(&u0.0[rr]) {
                    assert!(x.is_finite());
                    live_diff = live_diff.max((x - y).abs() / y.abs().max(1e-3));
                }
            } else {
                assert!(
                    b0.0[rr.clone()] == a0.0[rr],
                    "layer {l} slot {s}: recurrent state changed"
                );
                assert!(b0.1[cc.clone()] == a0.1[cc], "layer {l} slot {s}: conv state changed");
            }
        }
    }
    let page_elems = page * c.num_key_value_heads * c.head_dim;
    for (l, (b0, a0)) in before.1.iter().zip(&after.1).enumerate() {
        for s in (0..seqs).filter(|s| !live.contains(s)) {
            let r = s * mp * page_elems..(s + 1) * mp * page_elems;
            assert!(b0.0[r.clone()] == a0.0[r.clone()], "layer {l}: K pages of seq {s} changed");
            assert!(b0.1[r.clone()] == a0.1[r], "layer {l}: V pages of seq {s} changed");
        }
    }
    eprintln!(
        "padded (bucket 4, NaN padding) vs unpadded: live GDN state max rel diff {live_diff:.3e}"
    );
    assert!(live_diff < 2e-2, "{live_diff}");
}
