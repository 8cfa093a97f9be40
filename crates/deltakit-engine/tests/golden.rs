//! Golden gate: the engine's log-probabilities vs HF transformers' (float32) on the tiny fixtures.
//!
//! Each fixture (`tests/fixtures/{tiny-causal,tiny-cond,tiny-tied}`) has `golden_f32.json` made by
//! `tools/make_fixtures.py`: per prompt, HF's top-20 log-probs at every prompt position, 32 greedy
//! tokens, and the top-20 after feeding each greedy token. Every arm teacher-forces the sequence
//! `prompt ++ greedy_tokens` (so one near-tie cannot cascade) and compares each row's log-probs
//! at HF's top-20 ids: max |delta| <= `TOL.logprob`, and our argmax must equal HF's wherever HF's
//! top-2 gap exceeds `TOL.gap`. The `generate` arm runs the real scheduler (greedy) and requires HF's
//! greedy tokens exactly.
//!
//! Arms: single prefill then token-by-token decode; chunked prefill (chunks of 1, 7, 64 over the
//! whole 40-odd-token sequence, 4-token KV pages; chunk 1 = every token through a decode step);
//! a batch of the three prompts (different lengths) prefilled as one varlen batch and decoded
//! together; a staggered batch (sequences joining mid-decode, mixed prefill/decode steps);
//! `generate` (the scheduler, with chunked prefill and more requests than slots).
//!
//! The arms are generic over the backend and live in `golden_common/mod.rs`, shared with
//! `golden_cuda.rs` (the CUDA backend's gate); the test modules are stamped out per fixture here.
//!
//! Fixture paths are found by walking up from the cwd (the GPU bundle runs tests from a copy).

mod golden_common;

use deltakit_engine::generate::{cpu, Engine};
use deltakit_engine::launch::{Source, TpOptions};
use deltakit_engine::state::CacheConfig;
use golden_common::{fixtures_dir, load_golden, Tol, FIXTURES};

/// Max |logprob delta| over HF's top-k (f32 engine vs f32 HF); argmax equality where HF's top-2
/// gap exceeds 1e-3; `generate` reproduces HF's greedy tokens exactly.
const TOL: Tol = Tol { logprob: 5e-4, mean_logprob: 5e-4, gap: 1e-3, exact_greedy: true };

fn cpu_engine(name: &str, seqs: usize, page_size: usize) -> Engine {
    let cache = CacheConfig::for_sequences(seqs, 64, page_size);
    cpu::load(&fixtures_dir().join(name), cache, false).unwrap()
}

/// The same fixture over `tp` in-process CPU ranks (f32).
fn cpu_tp_engine(name: &str, tp: usize, seqs: usize, page_size: usize) -> Engine {
    let cache = CacheConfig::for_sequences(seqs, 64, page_size);
    let src = Source::Dir(fixtures_dir().join(name));
    cpu::tensor_parallel::<f32>(src, tp, cache, &TpOptions::default()).unwrap()
}

macro_rules! golden_tests {
    ($($fx:ident => $name:literal),*) => {$(
        mod $fx {
            use super::golden_common as g;
            fn run(arm: fn(&str, &[g::Case], g::Tol, g::Maker<'_>)) {
                let cases = g::load_golden($name, "golden_f32.json");
                let mk = |seqs, page| super::cpu_engine($name, seqs, page);
                arm(&format!("golden {}", $name), &cases, super::TOL, &mk);
            }
            /// The same arm with the model split over two CPU ranks (TP = 2).
            fn run_tp2(arm: fn(&str, &[g::Case], g::Tol, g::Maker<'_>)) {
                let cases = g::load_golden($name, "golden_f32.json");
                let mk = |seqs, page| super::cpu_tp_engine($name, 2, seqs, page);
                arm(&format!("golden {} tp2", $name), &cases, super::TOL, &mk);
            }
            #[test]
            fn single_prefill_then_decode() { run(g::arm_single_prefill_then_decode) }
            #[test]
            fn chunked_prefill() { run(g::arm_chunked) }
            #[test]
            fn batch_varlen_prefill_and_decode() { run(g::arm_batch) }
            #[test]
            fn staggered_batch() { run(g::arm_staggered) }
            #[test]
            fn generate_greedy() { run(g::arm_generate) }
            #[test]
            fn tp2_single_prefill_then_decode() { run_tp2(g::arm_single_prefill_then_decode) }
            #[test]
            fn tp2_chunked_prefill() { run_tp2(g::arm_chunked) }
            #[test]
            fn tp2_batch_varlen_prefill_and_decode() { run_tp2(g::arm_batch) }
            #[test]
            fn tp2_staggered_batch() { run_tp2(g::arm_staggered) }
            #[test]
            fn tp2_generate_greedy() { run_tp2(g::arm_generate) }
        }
    )*};
}

golden_tests!(
    tiny_causal => "tiny-causal",
    tiny_cond => "tiny-cond",
    tiny_tied => "tiny-tied",
    tiny_trained => "tiny-trained"
);

#[test]
fn fixture_list_is_complete() {
    for f in FIXTURES {
        assert!(fixtures_dir().join(f).join("golden_f32.json").is_file(), "{f}");
        assert!(load_golden(f, "golden_f32.json").len() >= 3, "{f}");
    }
}
