//! Golden gate: the engine's log-probabilities vs HF transformers' (float32) on the tiny fixtures.
//!
//! Each fixture (`tests/fixtures/{tiny-causal,tiny-cond,tiny-tied}`) has `golden_f32.json` made by
//! `tools/make_fixtures.py`: per prompt, HF's top-20 log-probs at every prompt position, 32 greedy
//! tokens, and the top-20 after feeding each greedy token. Every arm teacher-forces the sequence
//! `prompt ++ greedy_tokens` (so one near-tie cannot cascade) and compares each row's log-probs
//! at HF's top-20 ids: max |delta| <= `TOL`, and our argmax must equal HF's wherever HF's top-2
//! gap exceeds `GAP`. The `generate` arm runs the real scheduler (greedy) and requires HF's
//! greedy tokens exactly.
//!
//! Arms: single prefill then token-by-token decode; chunked prefill (chunks of 1, 7, 64 over the
//! whole 40-odd-token sequence, 4-token KV pages; chunk 1 = every token through a decode step);
//! a batch of the three prompts (different lengths) prefilled as one varlen batch and decoded
//! together; a staggered batch (sequences joining mid-decode, mixed prefill/decode steps);
//! `generate` (the scheduler, with chunked prefill and more requests than slots).
//!
//! The arms are generic over the backend; the test modules are stamped out per fixture for the
//! CPU backend (a CUDA backend adds its engine maker and the same stamp).
//!
//! Fixture paths are found by walking up from the cwd (the GPU bundle runs tests from a copy).

use deltakit_engine::backend::cpu::CpuBackend;
use deltakit_engine::backend::Backend;
use deltakit_engine::generate::{
    cpu, Engine, GenOptions, Request, SamplingParams, SeqId, StepItem, Want,
};
use deltakit_engine::state::CacheConfig;

const FIXTURES: [&str; 3] = ["tiny-causal", "tiny-cond", "tiny-tied"];
/// Max |logprob delta| over HF's top-k (f32 engine vs f32 HF).
const TOL: f64 = 5e-4;
/// Require argmax equality where HF's top-2 gap exceeds this.
const GAP: f64 = 1e-3;

#[derive(Debug)]
struct Row {
    topk: Vec<(u32, f64)>,
    gap: f64,
}

#[derive(Debug)]
struct Case {
    prompt: Vec<u32>,
    greedy: Vec<u32>,
    /// Expected rows for the teacher-forced sequence `prompt ++ greedy`: prefill rows then
    /// decode rows (row `p` = distribution after token `p`).
    rows: Vec<Row>,
}

impl Case {
    fn sequence(&self) -> Vec<u32> {
        self.prompt.iter().chain(&self.greedy).copied().collect()
    }
}

fn fixtures_dir() -> std::path::PathBuf {
    deltakit_engine::paths::find_fixtures_dir()
        .expect("tests/fixtures not found in the cwd or its parents")
}

fn load_golden(name: &str) -> Vec<Case> {
    let path = fixtures_dir().join(name).join("golden_f32.json");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let ids = |a: &serde_json::Value| -> Vec<u32> {
        a.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
    };
    let row = |s: &serde_json::Value| Row {
        topk: s["topk"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p[0].as_u64().unwrap() as u32, p[1].as_f64().unwrap()))
            .collect(),
        gap: s["gap"].as_f64().unwrap(),
    };
    v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let mut rows: Vec<Row> = c["prefill"].as_array().unwrap().iter().map(row).collect();
            rows.extend(c["decode"].as_array().unwrap().iter().map(row));
            Case { prompt: ids(&c["prompt_ids"]), greedy: ids(&c["greedy_tokens"]), rows }
        })
        .collect()
}

/// Builds an engine for fixture `name` with `seqs` slots and `page_size`-token KV pages: one per
/// backend; every arm below is generic over it (the CUDA backend adds its own maker).
type Maker<B> = fn(&str, usize, usize) -> Engine<B>;

fn cpu_engine(name: &str, seqs: usize, page_size: usize) -> Engine<CpuBackend> {
    let cache = CacheConfig::for_sequences(seqs, 64, page_size);
    cpu::load(&fixtures_dir().join(name), cache, false).unwrap()
}

/// Running max |delta| and argmax checks of one arm.
#[derive(Default)]
struct Score {
    max_delta: f64,
    rows: usize,
    argmax_checked: usize,
    failures: Vec<String>,
}

impl Score {
    fn check(&mut self, logits: &[f32], want: &Row, what: &str) {
        let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let m = f64::from(m);
        let lse = m + logits.iter().map(|&x| (f64::from(x) - m).exp()).sum::<f64>().ln();
        for &(id, lp) in &want.topk {
            let d = (f64::from(logits[id as usize]) - lse - lp).abs();
            if d > self.max_delta {
                self.max_delta = d;
            }
            if d > TOL && self.failures.len() < 5 {
                self.failures.push(format!("{what}: token {id} logprob delta {d:.2e} > {TOL:.0e}"));
            }
        }
        if want.gap > GAP {
            self.argmax_checked += 1;
            let mut best = 0;
            for (i, &x) in logits.iter().enumerate() {
                if x > logits[best] {
                    best = i;
                }
            }
            if best as u32 != want.topk[0].0 && self.failures.len() < 5 {
                self.failures.push(format!(
                    "{what}: argmax {best} != HF {} (gap {:.3})",
                    want.topk[0].0, want.gap
                ));
            }
        }
        self.rows += 1;
    }
}

/// Feed case `c` through sequence `s` in chunks of `chunk` tokens, checking every row.
fn run_chunked<B: Backend>(e: &mut Engine<B>, s: SeqId, c: &Case, chunk: usize, sc: &mut Score) {
    let seq = c.sequence();
    let mut pos = 0;
    while pos < seq.len() {
        let end = (pos + chunk).min(seq.len());
        let out = e.step(&[StepItem { seq: s, tokens: &seq[pos..end], want: Want::All }]).unwrap();
        for (k, r) in out.rows[0].clone().enumerate() {
            sc.check(out.row(r), &c.rows[pos + k], &format!("chunk {chunk} pos {}", pos + k));
        }
        pos = end;
    }
}

fn report(fixture: &str, arm: &str, sc: &Score) {
    eprintln!(
        "golden {fixture:12} {arm:22} rows {:4}  argmax checked {:4}  max|dlogprob| {:.3e}",
        sc.rows, sc.argmax_checked, sc.max_delta
    );
    assert!(sc.failures.is_empty(), "{fixture} {arm}: {:#?}", sc.failures);
    assert!(sc.rows > 0);
}

fn arm_single_prefill_then_decode<B: Backend>(name: &str, engine: Maker<B>) {
    let cases = load_golden(name);
    let mut e = engine(name, 1, 16);
    let mut sc = Score::default();
    for c in &cases {
        let s = e.add_sequence().unwrap();
        let out = e.step(&[StepItem { seq: s, tokens: &c.prompt, want: Want::All }]).unwrap();
        for (p, r) in out.rows[0].clone().enumerate() {
            sc.check(out.row(r), &c.rows[p], &format!("prefill pos {p}"));
        }
        for (i, &t) in c.greedy.iter().enumerate() {
            let out = e.step(&[StepItem { seq: s, tokens: &[t], want: Want::Last }]).unwrap();
            sc.check(out.row(0), &c.rows[c.prompt.len() + i], &format!("decode step {i}"));
        }
        e.end_sequence(s).unwrap();
    }
    report(name, "prefill+decode", &sc);
    assert_eq!(e.num_sequences(), 0);
}

fn arm_chunked<B: Backend>(name: &str, engine: Maker<B>) {
    let cases = load_golden(name);
    for chunk in [1, 7, 64] {
        let mut e = engine(name, 1, 4);
        let mut sc = Score::default();
        for c in &cases {
            let s = e.add_sequence().unwrap();
            run_chunked(&mut e, s, c, chunk, &mut sc);
            e.end_sequence(s).unwrap();
        }
        report(name, &format!("chunked prefill {chunk}"), &sc);
    }
}

fn arm_batch<B: Backend>(name: &str, engine: Maker<B>) {
    let cases = load_golden(name);
    let mut e = engine(name, cases.len(), 16);
    let mut sc = Score::default();
    let seqs: Vec<SeqId> = cases.iter().map(|_| e.add_sequence().unwrap()).collect();
    // One varlen prefill of all prompts (different lengths).
    let items: Vec<StepItem<'_>> = cases
        .iter()
        .zip(&seqs)
        .map(|(c, &s)| StepItem { seq: s, tokens: &c.prompt, want: Want::All })
        .collect();
    let out = e.step(&items).unwrap();
    for (ci, c) in cases.iter().enumerate() {
        for (p, r) in out.rows[ci].clone().enumerate() {
            sc.check(out.row(r), &c.rows[p], &format!("case {ci} prefill pos {p}"));
        }
    }
    // Batched decode: every row in one step.
    for i in 0..cases[0].greedy.len() {
        let toks: Vec<[u32; 1]> = cases.iter().map(|c| [c.greedy[i]]).collect();
        let items: Vec<StepItem<'_>> = seqs
            .iter()
            .zip(&toks)
            .map(|(&s, t)| StepItem { seq: s, tokens: t, want: Want::Last })
            .collect();
        let out = e.step(&items).unwrap();
        for (ci, c) in cases.iter().enumerate() {
            let r = out.rows[ci].start;
            sc.check(out.row(r), &c.rows[c.prompt.len() + i], &format!("case {ci} decode {i}"));
        }
    }
    report(name, "batch prefill+decode", &sc);
}

/// Sequences join at different times: step `k` feeds sequence `j` (started at step `3j`) its
/// next 1..=3 tokens, so prefill chunks and single tokens of different sequences share steps.
fn arm_staggered<B: Backend>(name: &str, engine: Maker<B>) {
    let cases = load_golden(name);
    let mut e = engine(name, cases.len(), 8);
    let mut sc = Score::default();
    let seqs: Vec<Vec<u32>> = cases.iter().map(Case::sequence).collect();
    let mut ids: Vec<Option<SeqId>> = vec![None; cases.len()];
    let mut pos = vec![0usize; cases.len()];
    let mut step = 0usize;
    while pos.iter().zip(&seqs).any(|(p, s)| *p < s.len()) {
        let mut items = Vec::new();
        let mut owners = Vec::new();
        for j in 0..cases.len() {
            if step < 3 * j || pos[j] >= seqs[j].len() {
                continue;
            }
            let s = *ids[j].get_or_insert_with(|| e.add_sequence().unwrap());
            let n = 1 + (step + j) % 3;
            let end = (pos[j] + n).min(seqs[j].len());
            items.push(StepItem { seq: s, tokens: &seqs[j][pos[j]..end], want: Want::All });
            owners.push((j, pos[j]));
            pos[j] = end;
        }
        if !items.is_empty() {
            let out = e.step(&items).unwrap();
            for (k, &(j, p0)) in owners.iter().enumerate() {
                for (o, r) in out.rows[k].clone().enumerate() {
                    sc.check(
                        out.row(r),
                        &cases[j].rows[p0 + o],
                        &format!("seq {j} pos {}", p0 + o),
                    );
                }
            }
        }
        for j in 0..cases.len() {
            if pos[j] >= seqs[j].len() {
                if let Some(s) = ids[j].take() {
                    e.end_sequence(s).unwrap();
                }
            }
        }
        step += 1;
    }
    report(name, "staggered batch", &sc);
}

fn arm_generate<B: Backend>(name: &str, engine: Maker<B>) {
    let cases = load_golden(name);
    let mut e = engine(name, 2, 16); // 3 requests, 2 slots: the third waits for a free slot
    let reqs: Vec<Request> = cases
        .iter()
        .map(|c| Request {
            prompt: c.prompt.clone(),
            params: SamplingParams { max_tokens: c.greedy.len(), ..SamplingParams::default() },
        })
        .collect();
    let (out, stats) = e
        .generate(&reqs, GenOptions { prefill_chunk: 5, max_step_tokens: 64 }, &mut |_| {})
        .unwrap();
    for (c, o) in cases.iter().zip(&out) {
        assert_eq!(o.tokens, c.greedy, "{name}: generate() greedy tokens differ from HF's");
    }
    assert_eq!(e.num_sequences(), 0);
    assert!(stats.decode_steps > 0 && stats.prefill_steps > 0);
    eprintln!(
        "golden {name:12} {:22} greedy tokens identical ({} requests)",
        "generate",
        out.len()
    );
}

macro_rules! golden_tests {
    ($($fx:ident => $name:literal),*) => {$(
        mod $fx {
            use super::cpu_engine as mk;
            #[test]
            fn single_prefill_then_decode() { super::arm_single_prefill_then_decode($name, mk) }
            #[test]
            fn chunked_prefill() { super::arm_chunked($name, mk) }
            #[test]
            fn batch_varlen_prefill_and_decode() { super::arm_batch($name, mk) }
            #[test]
            fn staggered_batch() { super::arm_staggered($name, mk) }
            #[test]
            fn generate_greedy() { super::arm_generate($name, mk) }
        }
    )*};
}

golden_tests!(tiny_causal => "tiny-causal", tiny_cond => "tiny-cond", tiny_tied => "tiny-tied");

#[test]
fn fixture_list_is_complete() {
    for f in FIXTURES {
        assert!(fixtures_dir().join(f).join("golden_f32.json").is_file(), "{f}");
    }
}
