//! GPU tests: `sample.argmax`, `sample.topk_logprobs` and `sample.top_p` vs deltakit-ref at the
//! Qwen3.5 vocabulary (248320) and small odd vocabularies, with forced ties and `-inf` logits.
//! Ids must be identical (top_p is defined with integer-exact arithmetic that the kernel
//! reproduces bit for bit); top-k logprobs within `1e-4 * (1 + |ref|)` (f32 vs f64 logsumexp).
// Exact float comparisons are deliberate (bit-identity, infinities).
#![allow(clippy::float_cmp, clippy::too_many_lines)]
mod common;

use std::collections::HashMap;

use deltakit::ops::sample;
use deltakit::testing::gpu_or_skip;
use deltakit_ref::sample as rs;
use half::bf16;
use rand::rngs::StdRng;
use rand::Rng;

use common::to_bf16 as bf;

const QWEN_VOCAB: usize = 248_320;
const VOCABS: [usize; 5] = [1, 7, 1000, 4097, QWEN_VOCAB];

/// Fresh random logits `[rows, vocab]` (uniform in `[-scale, scale)`, never zero) with forced
/// ties: the row maximum planted again at a random position and ~10% of positions copying another
/// position's value; ~2% `-inf` (never the whole row). bf16 rounding adds many natural ties at
/// large vocabularies (only 65536 values).
fn logits_case(rng: &mut StdRng, rows: usize, vocab: usize, scale: f32) -> Vec<bf16> {
    let mut v: Vec<f32> = common::randn_f32(rng, rows * vocab).iter().map(|x| x * scale).collect();
    if vocab >= 4 {
        for row in v.chunks_exact_mut(vocab) {
            let mi = (0..vocab).fold(0, |b, j| if row[j] > row[b] { j } else { b });
            let dup = rng.gen_range(0..vocab);
            row[dup] = row[mi];
            for _ in 0..=vocab / 10 {
                let (a, b) = (rng.gen_range(0..vocab), rng.gen_range(0..vocab));
                row[b] = row[a];
            }
            for _ in 0..=vocab / 50 {
                let a = rng.gen_range(0..vocab);
                if a != mi && a != dup {
                    row[a] = f32::NEG_INFINITY;
                }
            }
        }
    }
    bf(&v)
}

#[test]
fn argmax_and_topk_logprobs_match_reference() {
    let Some(ctx) = gpu_or_skip("argmax_and_topk_logprobs_match_reference") else { return };
    let stream = ctx.default_stream();
    let mut case = 0u64;
    for vocab in VOCABS {
        for k in [1usize, 5, 20, 256] {
            if k > vocab {
                continue;
            }
            case += 1;
            let (mut rng, seed) = common::rng(100 + case);
            let rows = rng.gen_range(1..=5usize);
            let scale = [2.0f32, 10.0, 40.0][rng.gen_range(0..3)];
            let logits = logits_case(&mut rng, rows, vocab, scale);
            let expect = rs::topk_logprobs(&logits, vocab, k).unwrap();
            let mut expect_am = vec![0u32; rows];
            rs::argmax(&logits, vocab, &mut expect_am).unwrap();
            let what = format!("vocab={vocab} rows={rows} k={k} scale={scale} seed={seed}");

            let dl = stream.clone_htod(&logits).unwrap();
            let mut ids = stream.clone_htod(&vec![-7i32; rows * k]).unwrap();
            let mut lps = stream.clone_htod(&vec![f32::NAN; rows * k]).unwrap();
            sample::topk_logprobs(&stream, &dl, vocab, k, &mut ids, &mut lps).unwrap();
            let mut am = stream.clone_htod(&vec![-7i32; rows]).unwrap();
            sample::argmax(&stream, &dl, vocab, &mut am).unwrap();
            let got_ids = stream.clone_dtoh(&ids).unwrap();
            let got_lps = stream.clone_dtoh(&lps).unwrap();
            let got_am = stream.clone_dtoh(&am).unwrap();

            let mut max_err = 0f64;
            for r in 0..rows {
                assert_eq!(got_am[r], expect_am[r] as i32, "argmax row {r}: {what}");
                for (j, &(id, lp)) in expect[r].iter().enumerate() {
                    let (gi, gl) = (got_ids[r * k + j], got_lps[r * k + j]);
                    assert_eq!(gi, id as i32, "topk id row {r} slot {j}: {what}");
                    if lp == f32::NEG_INFINITY {
                        assert_eq!(gl, f32::NEG_INFINITY, "row {r} slot {j}: {what}");
                        continue;
                    }
                    let err = (f64::from(gl) - f64::from(lp)).abs() / (1.0 + f64::from(lp).abs());
                    // NaN never passes: `!(err <= tol)`.
                    assert!(err <= 1e-4, "logprob row {r} slot {j}: {gl} vs {lp} ({what})");
                    max_err = max_err.max(err);
                }
                assert_eq!(got_ids[r * k], got_am[r], "top-1 == argmax row {r}: {what}");
            }
            eprintln!("topk_logprobs {what}: max err {max_err:.2e}");
        }
    }
}

#[test]
fn topk_logprobs_nan_row_and_all_ties() {
    let Some(ctx) = gpu_or_skip("topk_logprobs_nan_row_and_all_ties") else { return };
    let stream = ctx.default_stream();
    let (mut rng, seed) = common::rng(200);
    let vocab = 4097usize;
    // Row 0: one value everywhere (every element ties: the k lowest ids); row 1: a NaN;
    // row 2: random.
    let mut logits = vec![bf16::from_f32(0.75); vocab];
    let mut nan_row = logits_case(&mut rng, 1, vocab, 5.0);
    nan_row[rng.gen_range(0..vocab)] = bf16::NAN;
    logits.extend_from_slice(&nan_row);
    logits.extend_from_slice(&logits_case(&mut rng, 1, vocab, 5.0));
    let k = 256;
    let dl = stream.clone_htod(&logits).unwrap();
    let mut ids = stream.clone_htod(&vec![-7i32; 3 * k]).unwrap();
    let mut lps = stream.clone_htod(&vec![0f32; 3 * k]).unwrap();
    sample::topk_logprobs(&stream, &dl, vocab, k, &mut ids, &mut lps).unwrap();
    let (gi, gl) = (stream.clone_dtoh(&ids).unwrap(), stream.clone_dtoh(&lps).unwrap());
    let lse = (vocab as f64).ln();
    for j in 0..k {
        assert_eq!(gi[j], j as i32, "all-ties row slot {j}, seed={seed}");
        assert!((f64::from(gl[j]) + lse).abs() <= 1e-4 * (1.0 + lse), "{} vs {}", gl[j], -lse);
    }
    assert!(gi[k..2 * k].iter().all(|&i| i == -1), "NaN row ids, seed={seed}");
    assert!(gl[k..2 * k].iter().all(|v| v.is_nan()), "NaN row logprobs, seed={seed}");
    let expect = rs::topk_logprobs(&logits[2 * vocab..], vocab, k).unwrap();
    let want: Vec<i32> = expect[0].iter().map(|p| p.0 as i32).collect();
    assert_eq!(&gi[2 * k..], &want[..], "row after the NaN row, seed={seed}");
}

/// Per-row sampling parameters of one batch (host copies).
struct Params {
    temperature: Vec<f32>,
    top_p: Vec<f32>,
    seed: Vec<u64>,
    counter: Vec<u64>,
}

impl Params {
    /// Mixed per-row parameters, including greedy and out-of-domain values.
    fn mixed(rng: &mut StdRng, rows: usize) -> Self {
        let temps = [0.0f32, 0.3, 0.7, 1.0, 1.0, 1.5, 4.0, -1.0, f32::NAN, f32::INFINITY];
        let tops = [1e-6f32, 0.1, 0.5, 0.9, 0.95, 1.0, 1.0, 1.5, 0.0, f32::NAN];
        Self {
            temperature: (0..rows).map(|_| temps[rng.gen_range(0..temps.len())]).collect(),
            top_p: (0..rows).map(|_| tops[rng.gen_range(0..tops.len())]).collect(),
            seed: (0..rows).map(|_| rng.gen()).collect(),
            counter: (0..rows).map(|_| rng.gen_range(0..100_000)).collect(),
        }
    }
}

/// Runs `sample.top_p` on the GPU (ids poisoned first).
fn gpu_top_p(
    stream: &std::sync::Arc<deltakit::cudarc::driver::CudaStream>,
    logits: &[bf16],
    vocab: usize,
    p: &Params,
) -> Vec<i32> {
    let rows = p.temperature.len();
    let dl = stream.clone_htod(logits).unwrap();
    let dt = stream.clone_htod(&p.temperature).unwrap();
    let dp = stream.clone_htod(&p.top_p).unwrap();
    let ds = stream.clone_htod(&p.seed).unwrap();
    let dc = stream.clone_htod(&p.counter).unwrap();
    let mut ids = stream.clone_htod(&vec![-7i32; rows]).unwrap();
    sample::top_p(stream, &dl, vocab, &dt, &dp, &ds, &dc, &mut ids).unwrap();
    stream.clone_dtoh(&ids).unwrap()
}

/// Asserts GPU ids == reference ids row by row, printing the reference trace on a mismatch.
fn assert_top_p_matches(logits: &[bf16], vocab: usize, p: &Params, got: &[i32], what: &str) {
    for (r, row) in logits.chunks_exact(vocab).enumerate() {
        let t =
            rs::top_p_trace(row, p.temperature[r], p.top_p[r], p.seed[r], p.counter[r]).unwrap();
        assert_eq!(
            got[r],
            t.id as i32,
            "row {r} (T={} top_p={} seed={} counter={}): greedy={} W={} need={} threshold={:#x} \
             kept={} M={} target={} margin={}; {what}",
            p.temperature[r],
            p.top_p[r],
            p.seed[r],
            p.counter[r],
            t.greedy,
            t.total_mass,
            t.need,
            t.threshold_bits,
            t.kept.len(),
            t.kept_mass,
            t.target,
            t.margin
        );
    }
}

#[test]
fn top_p_matches_reference_exactly() {
    let Some(ctx) = gpu_or_skip("top_p_matches_reference_exactly") else { return };
    let stream = ctx.default_stream();
    for (case, vocab) in VOCABS.into_iter().enumerate() {
        for scale in [2.0f32, 8.0, 30.0] {
            let (mut rng, seed) = common::rng(300 + case as u64 * 7 + scale as u64);
            let rows = rng.gen_range(1..=5usize);
            let logits = logits_case(&mut rng, rows, vocab, scale);
            let p = Params::mixed(&mut rng, rows);
            let got = gpu_top_p(&stream, &logits, vocab, &p);
            let what = format!("vocab={vocab} rows={rows} scale={scale} seed={seed}");
            assert_top_p_matches(&logits, vocab, &p, &got, &what);
            // Reproducible: a second launch gives the same ids.
            assert_eq!(gpu_top_p(&stream, &logits, vocab, &p), got, "relaunch: {what}");
            eprintln!("top_p {what}: ids {got:?}");
        }
    }
}

#[test]
fn top_p_is_independent_of_batch_and_spreads_over_counters() {
    let Some(ctx) = gpu_or_skip("top_p_is_independent_of_batch_and_spreads_over_counters") else {
        return;
    };
    let stream = ctx.default_stream();
    let (mut rng, seed) = common::rng(400);
    let vocab = QWEN_VOCAB;
    let rows = 6;
    let logits = logits_case(&mut rng, rows, vocab, 8.0);
    let mut p = Params::mixed(&mut rng, rows);
    p.temperature[0] = 0.0; // greedy row == argmax
    p.temperature[1] = 1.0;
    p.top_p[1] = 0.9;
    let batch = gpu_top_p(&stream, &logits, vocab, &p);
    assert_top_p_matches(&logits, vocab, &p, &batch, &format!("seed={seed}"));
    let dl = stream.clone_htod(&logits).unwrap();
    let mut am = stream.clone_htod(&vec![-7i32; rows]).unwrap();
    sample::argmax(&stream, &dl, vocab, &mut am).unwrap();
    assert_eq!(batch[0], stream.clone_dtoh(&am).unwrap()[0], "temperature 0 == argmax");
    // Each row alone (other position, no neighbours) draws the same token.
    for r in 0..rows {
        let one = Params {
            temperature: vec![p.temperature[r]],
            top_p: vec![p.top_p[r]],
            seed: vec![p.seed[r]],
            counter: vec![p.counter[r]],
        };
        let alone = gpu_top_p(&stream, &logits[r * vocab..(r + 1) * vocab], vocab, &one);
        assert_eq!(alone[0], batch[r], "row {r} alone vs in batch, seed={seed}");
    }
    // Different counters spread over many tokens (row 1: T = 1, top_p = 0.9 over a wide nucleus).
    let n = 64;
    let row1 = logits[vocab..2 * vocab].to_vec();
    let many: Vec<bf16> = (0..n).flat_map(|_| row1.iter().copied()).collect();
    let pc = Params {
        temperature: vec![1.0; n],
        top_p: vec![0.9; n],
        seed: vec![p.seed[1]; n],
        counter: (0..n as u64).collect(),
    };
    let ids = gpu_top_p(&stream, &many, vocab, &pc);
    assert_top_p_matches(&many, vocab, &pc, &ids, &format!("counters, seed={seed}"));
    let distinct: std::collections::HashSet<i32> = ids.iter().copied().collect();
    assert!(distinct.len() >= n / 2, "only {} distinct ids of {n}: {ids:?}", distinct.len());
}

#[test]
fn top_p_nan_row_and_all_greedy_forms() {
    let Some(ctx) = gpu_or_skip("top_p_nan_row_and_all_greedy_forms") else { return };
    let stream = ctx.default_stream();
    let (mut rng, seed) = common::rng(500);
    let vocab = 1000;
    let rows = 5;
    let mut logits = logits_case(&mut rng, rows, vocab, 4.0);
    logits[2 * vocab + rng.gen_range(0..vocab)] = bf16::NAN;
    let p = Params {
        temperature: vec![0.0, -3.0, 1.0, f32::NAN, 1e-39],
        top_p: vec![0.5; rows],
        seed: vec![1, 2, 3, 4, 5],
        counter: vec![9; rows],
    };
    let got = gpu_top_p(&stream, &logits, vocab, &p);
    assert_eq!(got[2], -1, "NaN row, seed={seed}");
    let mut am = vec![0u32; 1];
    for r in [0usize, 1, 3, 4] {
        rs::argmax(&logits[r * vocab..(r + 1) * vocab], vocab, &mut am).unwrap();
        assert_eq!(got[r], am[0] as i32, "greedy row {r}, seed={seed}");
    }
}

#[test]
fn top_p_empirical_distribution_matches_nucleus() {
    let Some(ctx) = gpu_or_skip("top_p_empirical_distribution_matches_nucleus") else { return };
    let stream = ctx.default_stream();
    let (mut rng, seed) = common::rng(600);
    let vocab = 64;
    let n = 4096usize;
    let row: Vec<bf16> = bf(&(0..vocab).map(|_| rng.gen_range(-3.0f32..3.0)).collect::<Vec<_>>());
    let (temp, top_p, s) = (0.8f32, 0.9f32, rng.gen::<u64>());
    let logits: Vec<bf16> = (0..n).flat_map(|_| row.iter().copied()).collect();
    let p = Params {
        temperature: vec![temp; n],
        top_p: vec![top_p; n],
        seed: vec![s; n],
        counter: (0..n as u64).collect(),
    };
    let got = gpu_top_p(&stream, &logits, vocab, &p);
    assert_top_p_matches(&logits, vocab, &p, &got, &format!("seed={seed}"));
    let t = rs::top_p_trace(&row, temp, top_p, s, 0).unwrap();
    let prob: HashMap<i32, f64> =
        t.kept.iter().map(|&(j, q)| (j as i32, q as f64 / t.kept_mass as f64)).collect();
    let mut counts: HashMap<i32, usize> = HashMap::new();
    for &id in &got {
        assert!(prob.contains_key(&id), "id {id} outside the nucleus, seed={seed}");
        *counts.entry(id).or_default() += 1;
    }
    let (chi2, df) = common_chi2(&prob, &counts, n);
    let bound = df as f64 + 6.0 * (2.0 * df as f64).sqrt() + 6.0;
    eprintln!("top_p empirical: {} kept, chi2 = {chi2:.1} (df {df}, bound {bound:.1})", prob.len());
    assert!(chi2 <= bound, "chi2 {chi2} > {bound} (df {df}), seed={seed}");
}

/// Pearson chi-square of observed counts vs probabilities; buckets with expected count < 5 are
/// merged into one. Returns (statistic, degrees of freedom).
fn common_chi2(prob: &HashMap<i32, f64>, counts: &HashMap<i32, usize>, n: usize) -> (f64, usize) {
    let (mut chi2, mut buckets) = (0f64, 0usize);
    let (mut small_e, mut small_o) = (0f64, 0f64);
    for (id, &pr) in prob {
        let e = pr * n as f64;
        let o = *counts.get(id).unwrap_or(&0) as f64;
        if e < 5.0 {
            small_e += e;
            small_o += o;
        } else {
            chi2 += (o - e).powi(2) / e;
            buckets += 1;
        }
    }
    if small_e > 0.0 {
        chi2 += (small_o - small_e).powi(2) / small_e.max(1.0);
        buckets += 1;
    }
    (chi2, buckets.saturating_sub(1).max(1))
}

#[test]
fn sampling_ops_reject_bad_arguments() {
    let Some(ctx) = gpu_or_skip("sampling_ops_reject_bad_arguments") else { return };
    let stream = ctx.default_stream();
    let logits = stream.clone_htod(&bf(&[0.5f32; 12])).unwrap();
    let mut ids = stream.alloc_zeros::<i32>(12).unwrap();
    let mut lps = stream.alloc_zeros::<f32>(12).unwrap();
    let shape = |e: deltakit::Error, arg: &str| {
        assert!(matches!(&e, deltakit::Error::Shape { arg: a, .. } if *a == arg), "{e}");
    };
    // topk_logprobs: vocab 0, logits not a multiple, k = 0 / 257 / > vocab, output lengths.
    let e = sample::topk_logprobs(&stream, &logits, 0, 1, &mut ids, &mut lps).unwrap_err();
    shape(e, "logits");
    let e = sample::topk_logprobs(&stream, &logits, 5, 1, &mut ids, &mut lps).unwrap_err();
    shape(e, "logits");
    let e = sample::topk_logprobs(&stream, &logits, 4, 0, &mut ids, &mut lps).unwrap_err();
    shape(e, "k");
    let e = sample::topk_logprobs(&stream, &logits, 4, 5, &mut ids, &mut lps).unwrap_err();
    shape(e, "k");
    let big = stream.clone_htod(&bf(&vec![0.5f32; 300])).unwrap();
    let mut ids300 = stream.alloc_zeros::<i32>(257).unwrap();
    let mut lps300 = stream.alloc_zeros::<f32>(257).unwrap();
    let e = sample::topk_logprobs(&stream, &big, 300, 257, &mut ids300, &mut lps300).unwrap_err();
    shape(e, "k");
    let e = sample::topk_logprobs(&stream, &logits, 4, 3, &mut ids, &mut lps).unwrap_err();
    shape(e, "ids"); // 3 rows x 3 = 9 != 12
    let mut ids9 = stream.alloc_zeros::<i32>(9).unwrap();
    let e = sample::topk_logprobs(&stream, &logits, 4, 3, &mut ids9, &mut lps).unwrap_err();
    shape(e, "logprobs");
    // top_p: vocab 0 and per-row length mismatches (3 rows of 4).
    let f3 = stream.clone_htod(&[1.0f32; 3]).unwrap();
    let f2 = stream.clone_htod(&[1.0f32; 2]).unwrap();
    let u3 = stream.clone_htod(&[1u64; 3]).unwrap();
    let u4 = stream.clone_htod(&[1u64; 4]).unwrap();
    let mut i3 = stream.alloc_zeros::<i32>(3).unwrap();
    let e = sample::top_p(&stream, &logits, 0, &f3, &f3, &u3, &u3, &mut i3).unwrap_err();
    shape(e, "logits");
    let e = sample::top_p(&stream, &logits, 4, &f2, &f3, &u3, &u3, &mut i3).unwrap_err();
    shape(e, "temperature");
    let e = sample::top_p(&stream, &logits, 4, &f3, &f2, &u3, &u3, &mut i3).unwrap_err();
    shape(e, "top_p");
    let e = sample::top_p(&stream, &logits, 4, &f3, &f3, &u4, &u3, &mut i3).unwrap_err();
    shape(e, "seed");
    let e = sample::top_p(&stream, &logits, 4, &f3, &f3, &u3, &u4, &mut i3).unwrap_err();
    shape(e, "counter");
    let e = sample::top_p(&stream, &logits, 4, &f3, &f3, &u3, &u3, &mut ids).unwrap_err();
    shape(e, "ids");
    // A buffer on another device (only with a second GPU).
    if let Some(ctx1) = deltakit::try_context(1) {
        let s1 = ctx1.default_stream();
        let other = s1.clone_htod(&bf(&[0.5f32; 12])).unwrap();
        let mut lps9 = stream.alloc_zeros::<f32>(9).unwrap();
        let e = sample::topk_logprobs(&stream, &other, 4, 3, &mut ids9, &mut lps9).unwrap_err();
        assert!(matches!(e, deltakit::Error::DeviceMismatch { arg: "logits", .. }), "{e}");
        let e = sample::top_p(&stream, &other, 4, &f3, &f3, &u3, &u3, &mut i3).unwrap_err();
        assert!(matches!(e, deltakit::Error::DeviceMismatch { arg: "logits", .. }), "{e}");
    }
}

/// `topk_logprobs_ws` (vocabulary-split rows + merge when a workspace is given and rows are few)
/// vs the reference: rows 1 / 3 / 16 / 300 (the last too many to split), k up to and past
/// `TOPK_SPLIT_MAX_K`, vocabularies whose last slice is short, an all-ties row (the k lowest ids
/// across slice borders) and a NaN row (ids -1, NaN logprobs) among normal rows.
#[test]
fn topk_logprobs_split_matches_reference() {
    let Some(ctx) = gpu_or_skip("topk_logprobs_split_matches_reference") else { return };
    let stream = ctx.default_stream();
    let mut case = 0u64;
    for (vocab, rows, k) in [
        (QWEN_VOCAB, 1usize, 20usize),
        (QWEN_VOCAB, 16, 20),
        (QWEN_VOCAB, 3, 64),
        (QWEN_VOCAB, 2, 65),
        (3 * 8192 + 5, 1, 1),
        (40_000, 300, 20),
        (9000, 4, 20),
    ] {
        case += 1;
        let (mut rng, seed) = common::rng(900 + case);
        let mut logits = logits_case(&mut rng, rows, vocab, 8.0);
        if rows >= 3 {
            logits[..vocab].fill(bf16::from_f32(0.5)); // row 0: all ties
            let at = vocab + rng.gen_range(0..vocab);
            logits[at] = bf16::NAN; // row 1: a NaN
        }
        let what = format!("vocab={vocab} rows={rows} k={k} seed={seed}");
        let dl = stream.clone_htod(&logits).unwrap();
        let mut ids = stream.clone_htod(&vec![-7i32; rows * k]).unwrap();
        let mut lps = stream.clone_htod(&vec![0.25f32; rows * k]).unwrap();
        let mut ws = stream.alloc_zeros::<u8>(sample::topk_workspace_bytes(rows, k)).unwrap();
        stream.memset_zeros(&mut ws).unwrap();
        sample::topk_logprobs_ws(&stream, &dl, vocab, k, &mut ids, &mut lps, Some(&mut ws))
            .unwrap();
        let (gi, gl) = (stream.clone_dtoh(&ids).unwrap(), stream.clone_dtoh(&lps).unwrap());
        for r in 0..rows {
            let row = &logits[r * vocab..(r + 1) * vocab];
            if row.iter().any(|v| v.is_nan()) {
                assert!(gi[r * k..(r + 1) * k].iter().all(|&i| i == -1), "NaN row ids: {what}");
                assert!(gl[r * k..(r + 1) * k].iter().all(|v| v.is_nan()), "NaN row lps: {what}");
                continue;
            }
            let expect = rs::topk_logprobs(row, vocab, k).unwrap();
            for (j, &(id, lp)) in expect[0].iter().enumerate() {
                assert_eq!(gi[r * k + j], id as i32, "id row {r} slot {j}: {what}");
                if lp == f32::NEG_INFINITY {
                    assert_eq!(gl[r * k + j], f32::NEG_INFINITY, "row {r} slot {j}: {what}");
                    continue;
                }
                let err =
                    (f64::from(gl[r * k + j]) - f64::from(lp)).abs() / (1.0 + f64::from(lp).abs());
                assert!(
                    err <= 1e-4,
                    "logprob row {r} slot {j}: {} vs {lp} ({what})",
                    gl[r * k + j]
                );
            }
        }
    }
}
