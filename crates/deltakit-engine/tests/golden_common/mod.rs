//! Shared machinery of the golden gates (`golden.rs`: CPU vs HF float32; `golden_cuda.rs`: the
//! CUDA backend): expected rows, scoring with a tolerance, and the arms, generic over the backend.
//!
//! A [`Case`] is a teacher-forced sequence `prompt ++ greedy` with the expected top-k
//! log-probabilities of every row (row `p` = the distribution after token `p`). Every arm feeds
//! the sequence through the engine in its own way (single prefill + decode, chunked prefill,
//! varlen batch, staggered batch, the `generate` scheduler) and scores each row: max |delta| over
//! the expected top-k ids <= `tol.logprob`, and our argmax must equal the expected one wherever
//! the expected top-2 gap exceeds `tol.gap`.

// Each test crate uses a subset.
#![allow(dead_code)]

use deltakit_engine::generate::{
    Engine, GenOptions, Request, SamplingParams, SeqId, StepItem, Want,
};

/// The fixtures of `tools/make_fixtures.py` (`tiny-trained`: the trained bundled model of
/// `tools/train_tiny.py`, goldens by `make_fixtures.py --trained`).
pub const FIXTURES: [&str; 4] = ["tiny-causal", "tiny-cond", "tiny-tied", "tiny-trained"];

/// One expected row: top-k `(id, logprob)` best first, and the top-2 gap.
#[derive(Debug, Clone)]
pub struct Row {
    pub topk: Vec<(u32, f64)>,
    pub gap: f64,
}

/// A teacher-forced sequence and its expected rows.
#[derive(Debug, Clone)]
pub struct Case {
    pub prompt: Vec<u32>,
    pub greedy: Vec<u32>,
    /// Expected rows for `prompt ++ greedy`: prefill rows then decode rows.
    pub rows: Vec<Row>,
}

impl Case {
    pub fn sequence(&self) -> Vec<u32> {
        self.prompt.iter().chain(&self.greedy).copied().collect()
    }
}

/// Tolerances of one gate.
#[derive(Debug, Clone, Copy)]
pub struct Tol {
    /// Max |logprob delta| over the expected top-k, over every row.
    pub logprob: f64,
    /// Mean over the rows of each row's max |logprob delta|: catches a systematic error that
    /// stays under `logprob` (the max is set by the worst row; on the chaotic random fixtures
    /// one ill-conditioned row can dominate it).
    pub mean_logprob: f64,
    /// Require argmax equality where the expected top-2 gap exceeds this.
    pub gap: f64,
    /// `generate` must reproduce the expected greedy tokens exactly (else: up to the first
    /// divergence, which must be at a row whose expected top-2 gap is <= `gap`).
    pub exact_greedy: bool,
}

/// Serializes the GPU tests of one test binary: CUDA-graph capture is sensitive to
/// context-wide synchronizing calls from other threads (a `cuMemFree`, an NCCL teardown) on the
/// same device, which invalidate a capture in progress; one engine per process, as in serving,
/// never sees that.
#[allow(dead_code)]
pub fn gpu_lock() -> std::sync::MutexGuard<'static, ()> {
    static GPU: std::sync::Mutex<()> = std::sync::Mutex::new(());
    GPU.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub fn fixtures_dir() -> std::path::PathBuf {
    deltakit_engine::paths::find_fixtures_dir()
        .expect("tests/fixtures not found in the cwd or its parents")
}

/// HF's goldens of fixture `name` from `file` (`golden_f32.json` or `golden_bf16.json`).
pub fn load_golden(name: &str, file: &str) -> Vec<Case> {
    let path = fixtures_dir().join(name).join(file);
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

/// Log-softmax in f64 of a logits row.
pub fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let m = f64::from(logits.iter().copied().fold(f32::NEG_INFINITY, f32::max));
    let lse = m + logits.iter().map(|&x| (f64::from(x) - m).exp()).sum::<f64>().ln();
    logits.iter().map(|&x| f64::from(x) - lse).collect()
}

/// The expected row of a logits row: top-`k` log-probs (ties to the lower id) and the top-2 gap.
pub fn row_of(logits: &[f32], k: usize) -> Row {
    let lp = log_softmax(logits);
    let mut idx: Vec<usize> = (0..lp.len()).collect();
    idx.sort_by(|&a, &b| lp[b].total_cmp(&lp[a]).then(a.cmp(&b)));
    let gap = if idx.len() > 1 { lp[idx[0]] - lp[idx[1]] } else { f64::INFINITY };
    Row { topk: idx.iter().take(k).map(|&i| (i as u32, lp[i])).collect(), gap }
}

/// Running max |delta| and argmax checks of one arm.
pub struct Score {
    pub tol: Tol,
    pub max_delta: f64,
    /// Sum over the rows of each row's max |delta| (NaN rows count as infinity).
    pub sum_row_delta: f64,
    pub rows: usize,
    pub argmax_checked: usize,
    pub argmax_mismatch: usize,
    pub failures: Vec<String>,
}

impl Score {
    pub fn new(tol: Tol) -> Self {
        Self {
            tol,
            max_delta: 0.0,
            sum_row_delta: 0.0,
            rows: 0,
            argmax_checked: 0,
            argmax_mismatch: 0,
            failures: Vec::new(),
        }
    }

    pub fn check(&mut self, logits: &[f32], want: &Row, what: &str) {
        let lp = log_softmax(logits);
        let mut row_max = 0.0f64;
        for &(id, expect) in &want.topk {
            let d = (lp[id as usize] - expect).abs();
            row_max = if d.is_nan() { f64::INFINITY } else { row_max.max(d) };
            if d.is_nan() || d > self.max_delta {
                self.max_delta = if d.is_nan() { f64::INFINITY } else { d };
            }
            if (d.is_nan() || d > self.tol.logprob) && self.failures.len() < 5 {
                self.failures.push(format!(
                    "{what}: token {id} logprob delta {d:.2e} > {:.1e}",
                    self.tol.logprob
                ));
            }
        }
        if want.gap > self.tol.gap {
            self.argmax_checked += 1;
            let mut best = 0;
            for (i, &x) in logits.iter().enumerate() {
                if x > logits[best] {
                    best = i;
                }
            }
            if best as u32 != want.topk[0].0 {
                self.argmax_mismatch += 1;
                if self.failures.len() < 5 {
                    self.failures.push(format!(
                        "{what}: argmax {best} != expected {} (gap {:.3})",
                        want.topk[0].0, want.gap
                    ));
                }
            }
        }
        self.sum_row_delta += row_max;
        self.rows += 1;
    }

    /// Mean over the rows of each row's max |delta| (0 before any row).
    pub fn mean_row_delta(&self) -> f64 {
        if self.rows == 0 {
            0.0
        } else {
            self.sum_row_delta / self.rows as f64
        }
    }
}

/// Builds an engine with `seqs` slots and `page_size`-token KV pages.
pub type Maker<'a> = &'a dyn Fn(usize, usize) -> Engine;

/// Feed case `c` through sequence `s` in chunks of `chunk` tokens, checking every row.
pub fn run_chunked(e: &mut Engine, s: SeqId, c: &Case, chunk: usize, sc: &mut Score) {
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

/// Print the arm's numbers (the closing notes cite them) and fail on any violation.
pub fn report(gate: &str, arm: &str, sc: &Score) {
    let mean = sc.mean_row_delta();
    eprintln!(
        "{gate:24} {arm:22} rows {:4}  argmax checked {:4} (mismatch {})  max|dlogprob| {:.3e} \
         (tol {:.1e})  mean row max {mean:.3e} (tol {:.1e})",
        sc.rows,
        sc.argmax_checked,
        sc.argmax_mismatch,
        sc.max_delta,
        sc.tol.logprob,
        sc.tol.mean_logprob
    );
    assert!(sc.failures.is_empty(), "{gate} {arm}: {:#?}", sc.failures);
    assert!(
        mean <= sc.tol.mean_logprob,
        "{gate} {arm}: mean row max |dlogprob| {mean:.3e} > {:.1e}",
        sc.tol.mean_logprob
    );
    assert!(sc.rows > 0);
}

pub fn arm_single_prefill_then_decode(gate: &str, cases: &[Case], tol: Tol, engine: Maker<'_>) {
    let mut e = engine(1, 16);
    let mut sc = Score::new(tol);
    for c in cases {
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
    report(gate, "prefill+decode", &sc);
    assert_eq!(e.num_sequences(), 0);
}

pub fn arm_chunked(gate: &str, cases: &[Case], tol: Tol, engine: Maker<'_>) {
    for chunk in [1, 7, 64] {
        let mut e = engine(1, 4);
        let mut sc = Score::new(tol);
        for c in cases {
            let s = e.add_sequence().unwrap();
            run_chunked(&mut e, s, c, chunk, &mut sc);
            e.end_sequence(s).unwrap();
        }
        report(gate, &format!("chunked prefill {chunk}"), &sc);
    }
}

pub fn arm_batch(gate: &str, cases: &[Case], tol: Tol, engine: Maker<'_>) {
    let mut e = engine(cases.len(), 16);
    let mut sc = Score::new(tol);
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
    report(gate, "batch prefill+decode", &sc);
}

/// Sequences join at different times: step `k` feeds sequence `j` (started at step `3j`) its
/// next 1..=3 tokens, so prefill chunks and single tokens of different sequences share steps.
pub fn arm_staggered(gate: &str, cases: &[Case], tol: Tol, engine: Maker<'_>) {
    let mut e = engine(cases.len(), 8);
    let mut sc = Score::new(tol);
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
    report(gate, "staggered batch", &sc);
}

/// The real scheduler (greedy, chunked prefill of 5, more requests than slots).
pub fn arm_generate(gate: &str, cases: &[Case], tol: Tol, engine: Maker<'_>) {
    let mut e = engine(2, 16); // 3 requests, 2 slots: the third waits for a free slot
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
    let mut agreed = Vec::with_capacity(cases.len());
    for (ci, (c, o)) in cases.iter().zip(&out).enumerate() {
        if tol.exact_greedy {
            assert_eq!(o.tokens, c.greedy, "{gate}: generate() greedy tokens differ");
            agreed.push(o.tokens.len());
            continue;
        }
        assert_eq!(o.tokens.len(), c.greedy.len(), "{gate}: request {ci} stopped early");
        // Tokens must agree until a divergence at a near-tie of the expected distribution
        // (bf16 noise may flip a near-tie; everything after it is a different sequence).
        let n = o.tokens.iter().zip(&c.greedy).take_while(|(a, b)| a == b).count();
        if n < c.greedy.len() {
            let row = &c.rows[c.prompt.len() - 1 + n];
            assert!(
                row.gap <= tol.gap,
                "{gate}: request {ci} greedy token {n} is {} but expected {} with top-2 gap \
                 {:.3} > {:.3}",
                o.tokens[n],
                c.greedy[n],
                row.gap,
                tol.gap
            );
        }
        agreed.push(n);
    }
    assert_eq!(e.num_sequences(), 0);
    assert!(stats.decode_steps > 0 && stats.prefill_steps > 0);
    eprintln!(
        "{gate:24} {:22} greedy tokens agreed (prefix per request) {agreed:?} of {}",
        "generate",
        cases[0].greedy.len()
    );
}

/// Max |delta logprob| of engine `e` against the expected rows of `cases`, each case's whole
/// sequence teacher-forced in one prefill (no tolerance: a measurement, e.g. how far HF's bf16
/// goldens are from the f32 engine): `(max, mean row max)`.
pub fn delta_teacher_forced(e: &mut Engine, cases: &[Case]) -> (f64, f64) {
    let mut sc = Score::new(Tol {
        logprob: f64::INFINITY,
        mean_logprob: f64::INFINITY,
        gap: f64::INFINITY,
        exact_greedy: false,
    });
    for c in cases {
        let s = e.add_sequence().unwrap();
        run_chunked(e, s, c, c.sequence().len(), &mut sc);
        e.end_sequence(s).unwrap();
    }
    (sc.max_delta, sc.mean_row_delta())
}

/// Every arm.
pub fn all_arms(gate: &str, cases: &[Case], tol: Tol, engine: Maker<'_>) {
    arm_single_prefill_then_decode(gate, cases, tol, engine);
    arm_chunked(gate, cases, tol, engine);
    arm_batch(gate, cases, tol, engine);
    arm_staggered(gate, cases, tol, engine);
    arm_generate(gate, cases, tol, engine);
}
