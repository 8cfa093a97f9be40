//! Golden gate of the CUDA backend (`--features cuda`; skips without a GPU unless
//! `DELTAKIT_REQUIRE_GPU=1`): the same arms as `golden.rs` (single prefill + decode, chunked
//! prefill 1/7/64, varlen batch, staggered batch, the `generate` scheduler), on the CUDA backend.
//!
//! # What can be gated, and against what
//! - **HF fixtures** (`tests/fixtures/tiny-*`, GDN head dims `K = 32`, `V = 32` / `16`), per
//!   fixture (`fixture_tests!`): every arm of the CUDA backend against HF's f32 goldens (the
//!   independent oracle) and against HF's bf16 goldens (tolerance by the triangle inequality:
//!   the f32 gate's plus HF bf16's own distance from the f32 engine, measured in the test). Each
//!   gate bounds the max |delta logprob| and the mean over rows of each row's max |delta| (these
//!   random tiny models amplify bf16 noise at a few ill-conditioned rows, so the max alone is
//!   loose; the mean catches systematic error). Sized from the bf16 CPU backend vs HF f32
//!   (`cpu_bf16_calibration`, no GPU; numbers beside `fixture_tests!`). Head dims outside the
//!   kernels' set are refused with `EngineError::Unsupported`
//!   ([`unsupported_head_dims_are_refused`]).
//! - **Synthetic models at supported shapes** (the real gate): each fixture's config with its
//!   GDN head dims changed to (K, V) = (64, 64), (64, 128), (128, 64) (K != V both ways; GQA
//!   ratios 2 and 3; tied and untied LM heads; 8 and 4 layers), with seeded dummy weights
//!   (bf16-representable, so every backend sees the same weights). The expected rows are the f32
//!   CPU engine's (teacher-forced on its own greedy tokens: 3 prompts of 9 / 23 / 37 random ids
//!   plus 24 greedy tokens). Tolerance: the bf16 GPU path rounds activations to bf16
//!   at every op boundary, stores the KV cache and conv state in bf16, and its chunked GDR keeps
//!   per-chunk states in bf16; its log-probabilities therefore differ from f32 by bf16 noise, of
//!   the size the bf16 CPU backend (HF's rounding points emulated) shows on the same models — the
//!   `cpu_bf16_calibration` tests run the same arms on it (no GPU needed), print that noise and
//!   hold it under half the CUDA tolerance. The CUDA tolerance per model is about 3x that measured
//!   noise (0.5 / 0.25 / 1.4, see `synthetic_tests!`); argmax must agree wherever the f32 top-2 gap
//!   exceeds 0.1, and `generate` must reproduce the f32 greedy tokens up to a divergence at a
//!   near-tie (gap <= 0.1).
//!
//! Every arm prints its max |delta logprob| and argmax counts, for the closing notes.

mod golden_common;

use deltakit_engine::backend::cpu::CpuBf16Backend;
use deltakit_engine::backend::cuda::CudaBackend;
use deltakit_engine::config::ModelConfig;
use deltakit_engine::generate::{cpu, Engine, GenOptions, Request, SamplingParams, StepItem, Want};
use deltakit_engine::launch::{self, Source, TpOptions};
use deltakit_engine::model::Qwen35;
use deltakit_engine::state::CacheConfig;
use deltakit_engine::weights::{DummyWeights, SafetensorsWeights};
use deltakit_engine::EngineError;
use golden_common::{all_arms, fixtures_dir, load_golden, row_of, Case, Tol};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Synthetic models: bf16 GPU path vs the f32 CPU engine; `logprob` is per model (the macro
/// below), about 3x the bf16 CPU backend's measured max |delta| on that model (see the module
/// docs).
const fn syn_tol(logprob: f64, mean_logprob: f64) -> Tol {
    Tol { logprob, mean_logprob, gap: 0.1, exact_greedy: false }
}
/// HF fixtures: max and mean-row-max |delta logprob| per fixture (the macro below); argmax
/// checked where the expected top-2 gap exceeds 1.0.
const fn fixture_tol(logprob: f64, mean_logprob: f64) -> Tol {
    Tol { logprob, mean_logprob, gap: 1.0, exact_greedy: false }
}
/// Seed of the synthetic models' dummy weights.
const WEIGHT_SEED: u64 = 7;
/// Longest sequence of every arm (prompt + greedy).
const MAX_CONTEXT: usize = 64;

fn cache(seqs: usize, page_size: usize) -> CacheConfig {
    CacheConfig::for_sequences(seqs, MAX_CONTEXT, page_size)
}

/// Fixture `base`'s config with GDN head dims `(k, v)` (in `text_config` for the conditional
/// checkpoint's config).
fn synthetic_config(base: &str, k: usize, v: usize) -> ModelConfig {
    let text = std::fs::read_to_string(fixtures_dir().join(base).join("config.json")).unwrap();
    let mut root: serde_json::Value = serde_json::from_str(&text).unwrap();
    let target =
        if root.get("text_config").is_some() { &mut root["text_config"] } else { &mut root };
    target["linear_key_head_dim"] = k.into();
    target["linear_value_head_dim"] = v.into();
    ModelConfig::parse(&root.to_string()).unwrap()
}

fn cpu_f32_engine(cfg: &ModelConfig, seqs: usize, page: usize) -> Engine {
    cpu::dummy(cfg, WEIGHT_SEED, cache(seqs, page)).unwrap()
}

fn cpu_bf16_engine(cfg: &ModelConfig, seqs: usize, page: usize) -> Engine {
    let be = CpuBf16Backend::new();
    let model = Qwen35::load(&be, cfg, &mut DummyWeights::new(WEIGHT_SEED), false).unwrap();
    Engine::new(be, model, cache(seqs, page)).unwrap()
}

fn cuda_engine(
    ctx: &std::sync::Arc<deltakit::cudarc::driver::CudaContext>,
    cfg: &ModelConfig,
    seqs: usize,
    page: usize,
) -> Engine {
    CudaBackend::check_model(cfg).unwrap();
    let be = CudaBackend::from_context(ctx.clone(), 0).unwrap();
    let model = Qwen35::load(&be, cfg, &mut DummyWeights::new(WEIGHT_SEED), false).unwrap();
    Engine::new(be, model, cache(seqs, page)).unwrap()
}

/// Expected rows from the f32 CPU engine `e`: for each prompt, its greedy continuation of
/// `gen` tokens, then the top-20 rows of `prompt ++ greedy` teacher-forced in one prefill.
fn cases_from(e: &mut Engine, prompts: &[Vec<u32>], gen: usize) -> Vec<Case> {
    prompts
        .iter()
        .map(|p| {
            let greedy = if gen == 0 {
                Vec::new()
            } else {
                let req = Request {
                    prompt: p.clone(),
                    params: SamplingParams { max_tokens: gen, ..SamplingParams::default() },
                };
                let (out, _) = e.generate(&[req], GenOptions::default(), &mut |_| {}).unwrap();
                out[0].tokens.clone()
            };
            let seq: Vec<u32> = p.iter().chain(&greedy).copied().collect();
            let s = e.add_sequence().unwrap();
            let out = e.step(&[StepItem { seq: s, tokens: &seq, want: Want::All }]).unwrap();
            e.end_sequence(s).unwrap();
            let rows = out.rows[0].clone().map(|r| row_of(out.row(r), 20)).collect();
            Case { prompt: p.clone(), greedy, rows }
        })
        .collect()
}

/// The synthetic model's config and its f32 CPU cases (3 prompts of 9 / 23 / 37 seeded random
/// ids, 24 greedy tokens each).
fn synthetic(base: &str, k: usize, v: usize) -> (ModelConfig, Vec<Case>) {
    let cfg = synthetic_config(base, k, v);
    let mut rng = StdRng::seed_from_u64(0x601d ^ (k * 1000 + v) as u64);
    let prompts: Vec<Vec<u32>> = [9usize, 23, 37]
        .iter()
        .map(|&n| (0..n).map(|_| rng.gen_range(0..cfg.vocab_size as u32)).collect())
        .collect();
    let mut e = cpu_f32_engine(&cfg, 1, 16);
    let cases = cases_from(&mut e, &prompts, 24);
    (cfg, cases)
}

macro_rules! synthetic_tests {
    ($($m:ident => ($base:literal, $k:literal, $v:literal, $tol:literal, $mean:literal)),*) => {$(
        mod $m {
            use super::*;
            fn gate(backend: &str) -> String {
                format!("{}-k{}v{} {backend}", $base, $k, $v)
            }
            /// The bf16 CPU backend on the same arms, at half the CUDA tolerance: the measured
            /// bf16 noise the tolerance is sized from (no GPU needed). Fails if the noise grows
            /// (e.g. the dummy init changed) so the CUDA tolerance would stop meaning anything.
            #[test]
            fn cpu_bf16_calibration() {
                let (cfg, cases) = synthetic($base, $k, $v);
                let mk = |seqs, page| cpu_bf16_engine(&cfg, seqs, page);
                all_arms(&gate("cpu-bf16"), &cases, syn_tol($tol / 2.0, $mean / 2.0), &mk);
            }
            /// The CUDA backend vs the f32 CPU engine.
            #[test]
            fn cuda_vs_cpu_f32() {
                let _gpu = golden_common::gpu_lock();
                let Some(ctx) = deltakit::testing::gpu_or_skip(&gate("cuda")) else { return };
                let (cfg, cases) = synthetic($base, $k, $v);
                let mk = |seqs, page| cuda_engine(&ctx, &cfg, seqs, page);
                all_arms(&gate("cuda"), &cases, syn_tol($tol, $mean), &mk);
            }
        }
    )*};
}

// Measured bf16 CPU noise (max |delta logprob| over the f32 top-20, every arm; 2026-11-29):
// 0.133 (k64v64), 0.075 (k64v128), 0.457 (k128v64: the tied 64-wide embedding of std 1 gives
// logits of std ~8, so bf16 noise is larger in absolute terms; its top-2 gaps are wide: all 141
// rows pass the argmax check). No argmax mismatch at gap > 0.1 on any of them.
// First H200 run (2026-11-30), CUDA vs f32 on k64v64: 0.23 / 0.24 / 0.21 (single prefill + decode,
// chunked 1, chunked 7) and 0.43 at one row of the chunked-64 arm (the whole <= 61-token sequence
// through one gdr.chunk_prefill chunk; no argmax mismatch): its tolerance is 0.5 (~4x the CPU bf16
// noise), the others keep ~3x. Mean over rows of each row's max |delta| (CPU bf16, 2026-11-30):
// 0.045 / 0.023 / 0.214; its tolerance is ~3x that.
synthetic_tests!(
    syn_k64v64 => ("tiny-causal", 64, 64, 0.5, 0.15),
    syn_k64v128 => ("tiny-cond", 64, 128, 0.25, 0.075),
    syn_k128v64 => ("tiny-tied", 128, 64, 1.4, 0.6)
);

/// An HF fixture's engine on backend `be`, weights from its safetensors.
fn fixture_engine<B: deltakit_engine::backend::Backend + 'static>(
    be: B,
    name: &str,
    seqs: usize,
    page: usize,
) -> Engine {
    let dir = fixtures_dir().join(name);
    let cfg = ModelConfig::from_path(&dir).unwrap();
    let mut src = SafetensorsWeights::open(&dir).unwrap();
    let model = Qwen35::load(&be, &cfg, &mut src, false).unwrap();
    Engine::new(be, model, cache(seqs, page)).unwrap()
}

/// How far HF's bf16 goldens of fixture `name` are from the f32 truth: max |delta logprob| of
/// the f32 CPU engine (equal to HF f32 to 5e-4, `golden.rs`) teacher-forced on HF bf16's
/// sequences, against HF bf16's rows: `(max, mean row max)`.
fn hf_bf16_offset(name: &str) -> (f64, f64) {
    let hf_bf16 = load_golden(name, "golden_bf16.json");
    let mut e = cpu::load(&fixtures_dir().join(name), cache(1, 16), false).unwrap();
    golden_common::delta_teacher_forced(&mut e, &hf_bf16)
}

macro_rules! fixture_tests {
    ($($m:ident => ($name:literal, $tol:literal, $mean:literal)),*) => {$(
        mod $m {
            use super::*;
            /// The bf16 CPU backend (HF's rounding points emulated) vs HF f32 on every arm, at
            /// the CUDA tolerance / 1.5: the bf16 noise the tolerance is sized from (no GPU).
            /// Fails if that noise grows so that the CUDA tolerance would stop meaning anything.
            #[test]
            fn cpu_bf16_calibration() {
                let hf_f32 = load_golden($name, "golden_f32.json");
                let mk = |seqs, page| fixture_engine(CpuBf16Backend::new(), $name, seqs, page);
                let gate = format!("{} cpu-bf16 vs HF f32", $name);
                all_arms(&gate, &hf_f32, fixture_tol($tol / 1.5, $mean / 1.5), &mk);
            }
            /// The CUDA backend vs HF f32 (the independent oracle), every arm.
            #[test]
            fn cuda_vs_hf_f32() {
                let _gpu = golden_common::gpu_lock();
                let Some(ctx) = deltakit::testing::gpu_or_skip(&format!("golden_cuda {}", $name))
                else {
                    return;
                };
                let cfg = ModelConfig::from_path(&fixtures_dir().join($name)).unwrap();
                CudaBackend::check_model(&cfg).unwrap();
                let hf_f32 = load_golden($name, "golden_f32.json");
                let mk = |seqs, page| {
                    let be = CudaBackend::from_context(ctx.clone(), 0).unwrap();
                    fixture_engine(be, $name, seqs, page)
                };
                let gate = format!("{} cuda vs HF f32", $name);
                all_arms(&gate, &hf_f32, fixture_tol($tol, $mean), &mk);
            }
            /// The CUDA backend vs HF bf16, every arm. Tolerance: the f32 gate's plus HF bf16's
            /// own measured distance from f32 ([`hf_bf16_offset`]) — a triangle-inequality
            /// heuristic, not a strict bound (that distance is measured on HF bf16's own greedy
            /// sequences and top-k ids, the f32 gate on HF f32's).
            #[test]
            fn cuda_vs_hf_bf16() {
                let _gpu = golden_common::gpu_lock();
                let Some(ctx) = deltakit::testing::gpu_or_skip(&format!("golden_cuda {}", $name))
                else {
                    return;
                };
                let (off_max, off_mean) = hf_bf16_offset($name);
                eprintln!(
                    "{}: HF bf16 goldens vs the f32 engine: max|dlogprob| {off_max:.3}, mean row \
                     max {off_mean:.3}",
                    $name
                );
                let hf_bf16 = load_golden($name, "golden_bf16.json");
                let mk = |seqs, page| {
                    let be = CudaBackend::from_context(ctx.clone(), 0).unwrap();
                    fixture_engine(be, $name, seqs, page)
                };
                let gate = format!("{} cuda vs HF bf16", $name);
                let tol = fixture_tol($tol + off_max, $mean + off_mean);
                all_arms(&gate, &hf_bf16, tol, &mk);
            }
            /// Tensor parallelism on one GPU: TP = 1 through the executor (a rank thread) and
            /// the NCCL communicator (a one-rank communicator) passes the same HF f32 gate, and
            /// its log-probabilities equal the single-device engine's (same kernels; the
            /// one-rank all-reduce and all-gather must not change a bit).
            #[test]
            fn cuda_tp1_executor_nccl() {
                let _gpu = golden_common::gpu_lock();
                let Some(ctx) = deltakit::testing::gpu_or_skip(&format!("golden_cuda {}", $name))
                else {
                    return;
                };
                let dir = fixtures_dir().join($name);
                let opts = TpOptions::default();
                let mk = |seqs, page| tp_engine(&dir, &[0], seqs, page, &opts);
                let hf_f32 = load_golden($name, "golden_f32.json");
                let gate = format!("{} cuda tp1 executor+nccl vs HF f32", $name);
                all_arms(&gate, &hf_f32, fixture_tol($tol, $mean), &mk);
                let prompts: Vec<Vec<u32>> = hf_f32.iter().map(|c| c.prompt.clone()).collect();
                let mut single =
                    fixture_engine(CudaBackend::from_context(ctx.clone(), 0).unwrap(), $name, 1, 16);
                let expected = cases_from(&mut single, &prompts, 16);
                let (max, mean) = golden_common::delta_teacher_forced(&mut mk(1, 16), &expected);
                eprintln!("{}: tp1 executor+nccl vs single device: max {max:.2e} mean {mean:.2e}", $name);
                assert!(max <= 1e-6, "{}: executor differs from the single-device engine: {max}", $name);
            }
            /// Tensor parallelism over several GPUs (issue 16; in-process rank threads, NCCL):
            /// at TP = 2, 4 and 8 where the host has that many GPUs, the fixture's head counts
            /// divide (else the refusal naming the count, as on the CPU) — graphs on and off —
            /// every arm passes the same HF f32 gate as one GPU. A host with fewer GPUs skips
            /// with a message; `DELTAKIT_REQUIRE_GPUS=N` turns a skip below N GPUs into a
            /// failure (the multi-GPU device script sets it).
            #[test]
            fn cuda_tp_multi_gpu() {
                let _gpu = golden_common::gpu_lock();
                let Some(_ctx) = deltakit::testing::gpu_or_skip(&format!("golden_cuda {}", $name))
                else {
                    return;
                };
                let dir = fixtures_dir().join($name);
                let cfg = ModelConfig::from_path(&dir).unwrap();
                let hf_f32 = load_golden($name, "golden_f32.json");
                for tp in [2usize, 4, 8] {
                    if !gpus_or_skip(tp, &format!("golden_cuda {} tp {tp}", $name)) {
                        continue;
                    }
                    let devices: Vec<usize> = (0..tp).collect();
                    if let Err(want) = deltakit_engine::shard::ShardPlan::check(&cfg, tp) {
                        let src = Source::Dir(dir.clone());
                        let Err(got) = launch::cuda::tensor_parallel(src, &devices, cache(1, 16), &TpOptions::default())
                        else {
                            panic!("{} tp {tp}: accepted although {want}", $name);
                        };
                        assert_eq!(got.to_string(), want.to_string());
                        continue;
                    }
                    for graphs in [true, false] {
                        let mut opts = TpOptions::default();
                        opts.graphs.enabled = graphs;
                        let mk = |seqs, page| tp_engine(&dir, &devices, seqs, page, &opts);
                        let gate = format!("{} cuda tp{tp} (graphs {graphs}) vs HF f32", $name);
                        all_arms(&gate, &hf_f32, fixture_tol($tol, $mean), &mk);
                    }
                }
            }
        }
    )*};
}

/// A fixture model (`dir`) served by the tensor-parallel executor over `devices` (one rank
/// thread per GPU, NCCL), cache for `seqs` sequences with KV pages of `page` tokens.
fn tp_engine(
    dir: &std::path::Path,
    devices: &[usize],
    seqs: usize,
    page: usize,
    opts: &TpOptions,
) -> Engine {
    let src = Source::Dir(dir.to_path_buf());
    launch::cuda::tensor_parallel(src, devices, cache(seqs, page), opts).unwrap()
}

/// Whether the host has at least `n` CUDA devices; prints a skip line otherwise, or panics when
/// `DELTAKIT_REQUIRE_GPUS` asks for at least `n`.
fn gpus_or_skip(n: usize, what: &str) -> bool {
    let have = deltakit::cudarc::driver::CudaContext::device_count().map_or(0, |c| c as usize);
    if have >= n {
        return true;
    }
    let required: usize =
        std::env::var("DELTAKIT_REQUIRE_GPUS").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    assert!(
        required < n,
        "{what}: needs {n} GPUs, the host has {have} (DELTAKIT_REQUIRE_GPUS={required})"
    );
    eprintln!("{what}: skipped, needs {n} GPUs, the host has {have}");
    false
}

// The bf16 CPU backend vs HF f32 over every arm (`cpu_bf16_calibration`, 2026-11-30), max /
// mean row max |delta logprob|: tiny-causal 1.78 / 0.241 (the max is one ill-conditioned row,
// prompt 1 position 3, where HF's own bf16 happens to land near f32 and ours does not; the next
// rows recover), tiny-cond 0.56 / 0.099, tiny-tied 0.74 / 0.227. The max tolerances are ~1.7x
// those (3x would say nothing on these chaotic models) and are the weak part of the gate; the
// mean tolerances (~2x) are what catch a systematic error. First H200 run (2026-11-30), CUDA vs
// HF f32, worst arm: 2.34 / 0.288, 0.66 / 0.116, 0.61 / 0.238 — the tiny-causal max is within
// 1.28x of its tolerance (the same ill-conditioned row; the staggered-batch arm's GEMM shapes
// round differently), the means within 1.0-1.2x of the CPU bf16 backend's.
// tiny-trained (the trained bundled model, 2026-12-01): the bf16 CPU backend vs HF f32, every
// arm, max / mean row max 0.197 / 0.045 (vs HF bf16: 0.156 / 0.055; HF bf16 itself vs the f32
// engine: 0.123 / 0.044); its tolerances are ~3x that noise and 5x / 3.3x tighter than
// tiny-causal's.
fixture_tests!(
    fx_tiny_causal => ("tiny-causal", 3.0, 0.5),
    fx_tiny_cond => ("tiny-cond", 1.0, 0.2),
    fx_tiny_tied => ("tiny-tied", 1.3, 0.45),
    fx_tiny_trained => ("tiny-trained", 0.6, 0.15)
);

/// GDN head dims outside the kernels' built set (K = 96, V = 48) are refused with
/// `EngineError::Unsupported`, host-side and (with a GPU) at `Engine::new`, never run.
#[test]
fn unsupported_head_dims_are_refused() {
    let cfg = synthetic_config("tiny-causal", 96, 48);
    match CudaBackend::check_model(&cfg) {
        Err(EngineError::Unsupported { what, .. }) => {
            assert!(what.contains("K = 96"), "{what}");
        }
        other => panic!("expected Unsupported, got {other:?}"),
    }
    if let Some(ctx) = deltakit::try_context(0) {
        let be = CudaBackend::from_context(ctx, 0).unwrap();
        let model = Qwen35::load(&be, &cfg, &mut DummyWeights::new(WEIGHT_SEED), false).unwrap();
        match Engine::new(be, model, cache(1, 16)) {
            Err(EngineError::Unsupported { .. }) => {}
            Err(e) => panic!("expected Unsupported, got {e}"),
            Ok(_) => panic!("the CUDA backend accepted K = 96, V = 48"),
        }
    }
}

/// `CudaBackend::argmax` (`sample.argmax`, the scheduler's future greedy fast path) against the
/// host argmax of the same bf16 logits, ties to the lowest id.
#[test]
fn device_argmax_matches_host() {
    use deltakit_engine::backend::Backend;
    let _gpu = golden_common::gpu_lock();
    let Some(ctx) = deltakit::testing::gpu_or_skip("golden_cuda device_argmax") else { return };
    let be = CudaBackend::from_context(ctx, 0).unwrap();
    let (rows, vocab) = (5usize, 1000usize);
    let mut rng = StdRng::seed_from_u64(3);
    let mut data: Vec<f32> = (0..rows * vocab)
        .map(|_| half::bf16::from_f32(rng.gen_range(-4.0f32..4.0)).to_f32())
        .collect();
    data[2 * vocab + 17] = 9.0; // a tie: the lower id wins
    data[2 * vocab + 900] = 9.0;
    let t = be
        .upload(&deltakit_engine::weights::HostTensor {
            shape: vec![rows, vocab],
            data: data.clone(),
        })
        .unwrap();
    let want: Vec<u32> = data
        .chunks_exact(vocab)
        .map(|r| {
            let mut best = 0;
            for (i, &x) in r.iter().enumerate() {
                if x > r[best] {
                    best = i;
                }
            }
            best as u32
        })
        .collect();
    assert_eq!(be.argmax(&t).unwrap(), want);
    assert_eq!(want[2], 17);
}

/// Requests of `generate` for the prompts of `cases`: greedy, as many tokens as the goldens have.
fn greedy_requests(cases: &[Case]) -> Vec<Request> {
    cases
        .iter()
        .map(|c| Request {
            prompt: c.prompt.clone(),
            params: SamplingParams { max_tokens: c.greedy.len(), ..SamplingParams::default() },
        })
        .collect()
}

/// Per case, how many of `generate`'s tokens equal the expected greedy tokens from the start.
fn greedy_agreed(out: &[deltakit_engine::generate::Completion], cases: &[Case]) -> Vec<usize> {
    out.iter()
        .zip(cases)
        .map(|(o, c)| o.tokens.iter().zip(&c.greedy).take_while(|(a, b)| a == b).count())
        .collect()
}

/// `tiny-trained` (the trained bundled model: peaked distributions, so bf16 rounding rarely
/// flips a greedy token): the bf16 CPU backend (HF's rounding points emulated, no GPU) through
/// `generate` reproduces all 32 of HF bf16's greedy tokens on at least 8 of the 10 prompts
/// (measured 2026-12-01: 9 of 10, the other diverges at token 12; HF's own bf16 keeps its f32
/// greedy tokens for all 32 on only 5 of 10).
#[test]
fn tiny_trained_cpu_bf16_greedy_matches_hf_bf16() {
    let cases = load_golden("tiny-trained", "golden_bf16.json");
    let mut e = fixture_engine(CpuBf16Backend::new(), "tiny-trained", 2, 16);
    let (out, _) =
        e.generate(&greedy_requests(&cases), GenOptions::default(), &mut |_| {}).unwrap();
    let agreed = greedy_agreed(&out, &cases);
    let full = agreed.iter().filter(|&&n| n == DECODE_STEPS).count();
    eprintln!("tiny-trained cpu-bf16 vs HF bf16 greedy: prefix agreed {agreed:?}, full on {full}");
    assert!(full >= 8, "tiny-trained cpu-bf16: full greedy agreement on {full} of 10: {agreed:?}");
}

/// The CUDA backend on `tiny-trained` through `generate`: all 32 of HF bf16's greedy tokens on
/// at least 6 of the 10 prompts (most of them; the rest diverge at a near-tie, which the arms
/// of `fixture_tests!` check).
#[test]
fn tiny_trained_cuda_greedy_matches_hf_bf16() {
    let _gpu = golden_common::gpu_lock();
    let Some(ctx) = deltakit::testing::gpu_or_skip("golden_cuda tiny-trained greedy") else {
        return;
    };
    let cases = load_golden("tiny-trained", "golden_bf16.json");
    let be = CudaBackend::from_context(ctx, 0).unwrap();
    let mut e = fixture_engine(be, "tiny-trained", 2, 16);
    let (out, _) =
        e.generate(&greedy_requests(&cases), GenOptions::default(), &mut |_| {}).unwrap();
    let agreed = greedy_agreed(&out, &cases);
    let full = agreed.iter().filter(|&&n| n == DECODE_STEPS).count();
    eprintln!("tiny-trained cuda vs HF bf16 greedy: prefix agreed {agreed:?}, full on {full}");
    assert!(full >= 6, "tiny-trained cuda: full greedy agreement on {full} of 10: {agreed:?}");
}

/// Greedy tokens per prompt in the goldens of `tools/make_fixtures.py`.
const DECODE_STEPS: usize = 32;
