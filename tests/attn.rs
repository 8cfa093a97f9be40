//! GPU tests of the attention ops vs deltakit-ref: `attn.prep` (q/gate split, q/k norm, partial
//! RoPE, paged KV write), `attn.prefill` (causal GQA over the paged cache, prior context) and
//! `attn.decode` (split-K).
mod common;

use deltakit::cudarc::driver::{CudaSlice, CudaStream};
use deltakit::ops::attn::{self, AttnDims, DecodeKernel, PagedKv, PrefillKernel, Rope, SeqBatch};
use deltakit::testing::{gpu_or_skip, rel_err};
use deltakit_ref::attn as r;
use half::bf16;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;
use std::sync::Arc;

use common::{to_bf16 as bf, to_f32 as f};

/// A random batch: per sequence (new tokens, prior context or -1), pages shuffled over the pool.
struct Batch {
    cu: Vec<i32>,
    ctx: Vec<i32>,
    table: Vec<i32>,
    kv: PagedKv,
}

fn make_batch(rng: &mut StdRng, seqs: &[(usize, i32)], page_size: usize, spare: usize) -> Batch {
    let mut cu = vec![0i32];
    for &(len, _) in seqs {
        cu.push(cu.last().unwrap() + len as i32);
    }
    let ctx: Vec<i32> = seqs.iter().map(|&(_, c)| c).collect();
    let need: Vec<usize> =
        seqs.iter().map(|&(len, c)| (c.max(0) as usize + len).div_ceil(page_size).max(1)).collect();
    let max_pages = *need.iter().max().unwrap();
    let num_pages = need.iter().sum::<usize>() + spare;
    let mut ids: Vec<i32> = (0..num_pages as i32).collect();
    ids.shuffle(rng);
    let mut it = ids.into_iter();
    let mut table = vec![-1i32; seqs.len() * max_pages];
    for (i, &n) in need.iter().enumerate() {
        for j in 0..n {
            table[i * max_pages + j] = it.next().unwrap();
        }
    }
    Batch { cu, ctx, table, kv: PagedKv { page_size, num_pages, max_pages } }
}

struct Dev {
    cu: CudaSlice<i32>,
    ctx: CudaSlice<i32>,
    table: CudaSlice<i32>,
}

impl Batch {
    fn upload(&self, s: &Arc<CudaStream>) -> Dev {
        Dev {
            cu: s.clone_htod(&self.cu).unwrap(),
            ctx: s.clone_htod(&self.ctx).unwrap(),
            table: s.clone_htod(&self.table).unwrap(),
        }
    }
    fn view<'a>(&'a self, d: &'a Dev) -> SeqBatch<'a, CudaSlice<i32>> {
        SeqBatch {
            cu_seqlens: &d.cu,
            ctx_lens: &d.ctx,
            page_table: &d.table,
            host_cu_seqlens: &self.cu,
            host_ctx_lens: &self.ctx,
            host_page_table: &self.table,
        }
    }
    fn pages(&self) -> r::PageTable<'_> {
        r::PageTable { table: &self.table, max_pages: self.kv.max_pages }
    }
}

#[test]
#[allow(clippy::too_many_lines)] // one end-to-end case: reference pipeline, GPU run, checks
fn prep_is_bit_exact_with_reference() {
    let Some(ctx) = gpu_or_skip("prep_is_bit_exact_with_reference") else { return };
    let s = ctx.new_stream().unwrap();
    // (H_q, H_kv, hd, rotary_dim): Qwen3.5-27B / 9B per-rank shapes and the fixtures' shape.
    for (case, &(hq, hkv, hd, rot)) in
        [(24usize, 4usize, 256usize, 64usize), (12, 2, 256, 64), (16, 4, 128, 32), (4, 2, 64, 16)]
            .iter()
            .enumerate()
    {
        let (mut rng, seed) = common::rng(case as u64);
        // Absolute positions {0, 1, 17, 1000, 32767} appear as first tokens; one padding sequence.
        let seqs = [(3usize, 0i32), (2, 1), (5, 17), (1, 1000), (1, 32767), (4, -1), (9, 0)];
        let b = make_batch(&mut rng, &seqs, 16, 3);
        let t = *b.cu.last().unwrap() as usize;
        let eps = 1e-6f32;
        let theta = 1.0e7f32;
        let qg = bf(&common::randn_f32(&mut rng, t * hq * 2 * hd)
            .iter()
            .map(|x| x * 3.0)
            .collect::<Vec<_>>());
        let kx = bf(&common::randn_f32(&mut rng, t * hkv * hd));
        let vx = bf(&common::randn_f32(&mut rng, t * hkv * hd));
        let qw = bf(&common::randn_f32(&mut rng, hd).iter().map(|x| x * 0.3).collect::<Vec<_>>());
        let kw = bf(&common::randn_f32(&mut rng, hd).iter().map(|x| x * 0.3).collect::<Vec<_>>());
        let cache_len = b.kv.num_pages * b.kv.page_size * hkv * hd;
        let kc0 = bf(&common::randn_f32(&mut rng, cache_len));
        let vc0 = bf(&common::randn_f32(&mut rng, cache_len));
        // Reference: split, norm, rope at positions ctx + j, write_kv.
        let mut q = vec![bf16::ZERO; t * hq * hd];
        let mut gate = vec![bf16::ZERO; t * hq * hd];
        r::split_q_gate(&qg, hq, hd, &mut q, &mut gate).unwrap();
        let mut qn = vec![bf16::ZERO; q.len()];
        r::qk_norm(&q, &qw, eps, &mut qn).unwrap();
        let mut kn = vec![bf16::ZERO; kx.len()];
        r::qk_norm(&kx, &kw, eps, &mut kn).unwrap();
        let mut pos = vec![0i64; t];
        for (i, &(len, c)) in seqs.iter().enumerate() {
            for j in 0..len {
                pos[b.cu[i] as usize + j] = i64::from(c.max(0)) + j as i64;
            }
        }
        let rp = r::RopeParams { head_dim: hd, rotary_dim: rot, theta };
        let qn_norope = qn.clone();
        r::rope_neox(&mut qn, hq, &pos, rp).unwrap();
        r::rope_neox(&mut kn, hkv, &pos, rp).unwrap();
        let (mut kc_ref, mut vc_ref) = (kc0.clone(), vc0.clone());
        let kvd = r::KvDims { page_size: b.kv.page_size, n_kv_heads: hkv, head_dim: hd };
        r::write_kv(&kn, &vx, &b.cu, &b.ctx, b.pages(), kvd, &mut kc_ref, &mut vc_ref).unwrap();
        // GPU
        let d = b.upload(&s);
        let (dqg, dk, dv) =
            (s.clone_htod(&qg).unwrap(), s.clone_htod(&kx).unwrap(), s.clone_htod(&vx).unwrap());
        let (dqw, dkw) = (s.clone_htod(&qw).unwrap(), s.clone_htod(&kw).unwrap());
        let (mut dkc, mut dvc) = (s.clone_htod(&kc0).unwrap(), s.clone_htod(&vc0).unwrap());
        let mut dq = s.clone_htod(&vec![bf16::NAN; t * hq * hd]).unwrap();
        let mut dgate = s.clone_htod(&vec![bf16::NAN; t * hq * hd]).unwrap();
        let dims = AttnDims { n_q_heads: hq, n_kv_heads: hkv, head_dim: hd };
        attn::prep(
            &s,
            (&dqg, None),
            (&dk, None),
            (&dv, None),
            &dqw,
            &dkw,
            eps,
            Rope { rotary_dim: rot, theta },
            dims,
            b.kv,
            &b.view(&d),
            &mut dkc,
            &mut dvc,
            &mut dq,
            &mut dgate,
        )
        .unwrap();
        let (gq, gg) = (s.clone_dtoh(&dq).unwrap(), s.clone_dtoh(&dgate).unwrap());
        let (gkc, gvc) = (s.clone_dtoh(&dkc).unwrap(), s.clone_dtoh(&dvc).unwrap());
        let row = hq * hd;
        for (i, &(len, c)) in seqs.iter().enumerate() {
            let range = b.cu[i] as usize * row..(b.cu[i] as usize + len) * row;
            if c < 0 {
                assert!(gq[range.clone()].iter().all(|x| x.to_f32() == 0.0), "padding q not zero");
                assert!(gg[range].iter().all(|x| x.to_f32() == 0.0), "padding gate not zero");
                continue;
            }
            assert_eq!(
                gg[range.clone()],
                gate[range.clone()],
                "case {case} seed {seed}: gate seq {i}"
            );
            for (j, (a, e)) in gq[range.clone()].iter().zip(&qn[range.clone()]).enumerate() {
                assert!(
                    a.to_bits() == e.to_bits(),
                    "case {case} seed {seed}: q seq {i} elem {j}: {a} vs {e} (pos {})",
                    pos[range.start / row + j / row]
                );
            }
            // Dims past rotary_dim are the normed values, bit for bit.
            for (j, a) in gq[range.clone()].iter().enumerate() {
                if j % hd >= rot {
                    assert_eq!(a.to_bits(), qn_norope[range.start + j].to_bits());
                }
            }
        }
        assert!(
            gkc == kc_ref,
            "case {case} seed {seed}: k cache differs (or a canary row changed)"
        );
        assert!(
            gvc == vc_ref,
            "case {case} seed {seed}: v cache differs (or a canary row changed)"
        );
    }
}

fn ref_prefill(b: &Batch, q: &[bf16], kc: &[bf16], vc: &[bf16], dims: AttnDims) -> Vec<f32> {
    let mut out = vec![bf16::ZERO; q.len()];
    let rd = r::AttnDims {
        n_q_heads: dims.n_q_heads,
        n_kv_heads: dims.n_kv_heads,
        head_dim: dims.head_dim,
    };
    r::prefill_paged(q, kc, vc, &b.cu, &b.ctx, b.pages(), b.kv.page_size, rd, None, &mut out)
        .unwrap();
    f(&out)
}

#[test]
fn prefill_matches_reference_for_gqa_groups_and_prior_context() {
    let Some(ctx) = gpu_or_skip("prefill_matches_reference_for_gqa_groups_and_prior_context")
    else {
        return;
    };
    let s = ctx.new_stream().unwrap();
    let mut worst = 0f64;
    let mut case = 0u64;
    for &hd in &[128usize, 256] {
        for &(hq, hkv) in &[(4usize, 4usize), (8, 4), (6, 2), (8, 2), (12, 2), (16, 2)] {
            case += 1;
            let (mut rng, seed) = common::rng(100 + case);
            let n = rng.gen_range(1..=4);
            let seqs: Vec<(usize, i32)> = (0..n)
                .map(|_| {
                    let len = *[1usize, 7, 63, 64, 65, 130].choose(&mut rng).unwrap();
                    let c = *[0i32, 0, 5, 200, -1].choose(&mut rng).unwrap();
                    (len, c)
                })
                .collect();
            let page_size = *[1usize, 16, 64].choose(&mut rng).unwrap();
            let b = make_batch(&mut rng, &seqs, page_size, 5);
            let t = *b.cu.last().unwrap() as usize;
            let dims = AttnDims { n_q_heads: hq, n_kv_heads: hkv, head_dim: hd };
            let q = bf(&common::randn_f32(&mut rng, t * hq * hd));
            let cl = b.kv.num_pages * page_size * hkv * hd;
            let kc = bf(&common::randn_f32(&mut rng, cl));
            let vc = bf(&common::randn_f32(&mut rng, cl));
            let expect = ref_prefill(&b, &q, &kc, &vc, dims);
            let d = b.upload(&s);
            let (dq, dkc, dvc) =
                (s.clone_htod(&q).unwrap(), s.clone_htod(&kc).unwrap(), s.clone_htod(&vc).unwrap());
            let mut out = s.clone_htod(&vec![bf16::NAN; t * hq * hd]).unwrap();
            attn::prefill(&s, &dq, &dkc, &dvc, dims, b.kv, &b.view(&d), None, &mut out).unwrap();
            let got = f(&s.clone_dtoh(&out).unwrap());
            let err = rel_err(&got, &expect);
            worst = worst.max(err);
            assert!(
                err <= 1e-2,
                "hd={hd} {hq}/{hkv} seqs={seqs:?} ps={page_size} seed={seed}: rel err {err}"
            );
            for (i, &(len, c)) in seqs.iter().enumerate() {
                if c < 0 {
                    let r0 = b.cu[i] as usize * hq * hd;
                    assert!(
                        got[r0..r0 + len * hq * hd].iter().all(|&x| x == 0.0),
                        "padding row not zero"
                    );
                }
            }
        }
    }
    eprintln!("INVARIANT attn.prefill vs ref max_rel_err={worst:.2e}");
}

/// The reference over one (sequence, kv head, query chunk) per task, on all CPU cores: new
/// tokens `a..b` of a sequence with prior context `c` are the sequence `(b - a, c + a)` over the
/// same pages, and kv head `h` with its `G` query heads is a problem of its own.
fn ref_prefill_par(b: &Batch, q: &[bf16], kc: &[bf16], vc: &[bf16], dims: AttnDims) -> Vec<f32> {
    const CHUNK: usize = 128;
    let (hq, hkv, hd) = (dims.n_q_heads, dims.n_kv_heads, dims.head_dim);
    let g = hq / hkv;
    let ps = b.kv.page_size;
    let rows = b.kv.num_pages * ps;
    // Per kv head caches [num_pages, page_size, 1, hd].
    let split = |c: &[bf16]| -> Vec<Vec<bf16>> {
        (0..hkv)
            .map(|h| {
                (0..rows)
                    .flat_map(|r| &c[(r * hkv + h) * hd..(r * hkv + h + 1) * hd])
                    .copied()
                    .collect()
            })
            .collect()
    };
    let (kh, vh) = (split(kc), split(vc));
    let mut tasks = Vec::new();
    for i in 0..b.ctx.len() {
        let len = (b.cu[i + 1] - b.cu[i]) as usize;
        if b.ctx[i] < 0 {
            continue;
        }
        for h in 0..hkv {
            for a in (0..len).step_by(CHUNK) {
                tasks.push((i, h, a, (a + CHUNK).min(len)));
            }
        }
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results = std::sync::Mutex::new(Vec::new());
    let threads = std::thread::available_parallelism().map_or(4, std::num::NonZero::get);
    std::thread::scope(|sc| {
        for _ in 0..threads {
            sc.spawn(|| loop {
                let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(&(i, h, a, e)) = tasks.get(k) else { break };
                let n = e - a;
                let t0 = b.cu[i] as usize + a;
                let mut qs = Vec::with_capacity(n * g * hd);
                for t in t0..t0 + n {
                    qs.extend_from_slice(&q[(t * hq + h * g) * hd..(t * hq + (h + 1) * g) * hd]);
                }
                let table = &b.table[i * b.kv.max_pages..(i + 1) * b.kv.max_pages];
                let mut o = vec![bf16::ZERO; qs.len()];
                let rd = r::AttnDims { n_q_heads: g, n_kv_heads: 1, head_dim: hd };
                r::prefill_paged(
                    &qs,
                    &kh[h],
                    &vh[h],
                    &[0, n as i32],
                    &[b.ctx[i] + a as i32],
                    r::PageTable { table, max_pages: b.kv.max_pages },
                    ps,
                    rd,
                    None,
                    &mut o,
                )
                .unwrap();
                results.lock().unwrap().push((t0, h, o));
            });
        }
    });
    let mut out = vec![0f32; q.len()];
    for (t0, h, o) in results.into_inner().unwrap() {
        let n = o.len() / (g * hd);
        for j in 0..n {
            let dst = ((t0 + j) * hq + h * g) * hd;
            for (d, x) in out[dst..dst + g * hd].iter_mut().zip(&o[j * g * hd..(j + 1) * g * hd]) {
                *d = x.to_f32();
            }
        }
    }
    out
}

/// Largest relative error of one `hd`-row (catches a wrong row that the global norm would hide).
fn worst_row_err(got: &[f32], expect: &[f32], hd: usize) -> f64 {
    got.chunks(hd).zip(expect.chunks(hd)).map(|(a, e)| rel_err(a, e)).fold(0.0, f64::max)
}

/// (sequences as (new tokens, prior context or -1), page size, dims)
type PrefillCase = (&'static [(usize, i32)], usize, AttnDims);

/// Runs both prefill kernels on one random case and checks each against the reference: the
/// default kernel list (and its env overrides), or `only` when given.
fn check_prefill_case(
    s: &Arc<CudaStream>,
    rng: &mut StdRng,
    seed: u64,
    seqs: &[(usize, i32)],
    page_size: usize,
    dims: AttnDims,
    only: Option<&[PrefillKernel]>,
) -> f64 {
    let (hq, hkv, hd) = (dims.n_q_heads, dims.n_kv_heads, dims.head_dim);
    let b = make_batch(rng, seqs, page_size, 3);
    let t = *b.cu.last().unwrap() as usize;
    // q x 8 (exact in bf16): peaked softmax, so a mask error on one position shows.
    let q = bf(&common::randn_f32(rng, t * hq * hd).iter().map(|x| x * 8.0).collect::<Vec<_>>());
    let cl = b.kv.num_pages * page_size * hkv * hd;
    let kc = bf(&common::randn_f32(rng, cl));
    let vc = bf(&common::randn_f32(rng, cl));
    let expect = ref_prefill_par(&b, &q, &kc, &vc, dims);
    let d = b.upload(s);
    let (dq, dkc, dvc) =
        (s.clone_htod(&q).unwrap(), s.clone_htod(&kc).unwrap(), s.clone_htod(&vc).unwrap());
    let mut worst = 0f64;
    // DELTAKIT_TEST_SKIP_PINGPONG=1 leaves the ping-pong schedule out (device-run triage).
    let skip_pp = std::env::var("DELTAKIT_TEST_SKIP_PINGPONG").is_ok_and(|v| v == "1");
    // Every hd-256 tile variant of the sm90 kernel (at hd 64 / 128 they run the one config).
    let mut kernels = vec![PrefillKernel::Auto, PrefillKernel::Sm90PingPong, PrefillKernel::Triton];
    if hd == 256 {
        // (36 / 37 passed every test and both sanitizers on an H200 in session 8; 38, the
        // timeline form, only the small cases and the sanitizers: through the list below.)
        kernels.extend((0..=37).map(PrefillKernel::Sm90Variant));
        // Session 9: 41 (Q by the consumer warpgroups + stmatrix epilogue; 39 = 41 without the
        // stmatrix) and 42 (Q by TMA, row boxes at any row) passed every test and both
        // sanitizers on an H200 (opt-in, no faster than 30).
        kernels.extend([41, 42].map(PrefillKernel::Sm90Variant));
        // Session 10: 44 (Q from whole-token TMA boxes issued by one lane, partial-token rows by
        // cp.async) and 46 (44 + K tile 1 / V tile 0 deferred until Q landed) passed every test
        // and both sanitizers on an H200 (opt-in; 48, the default since session 10, is Auto).
        kernels.extend([44, 46].map(PrefillKernel::Sm90Variant));
        // Session 13: 61 (48 + the sequence-grouped block order) is Auto; 48, the default of
        // sessions 10-12 and 61's fallback for lists beyond 31 bits, stays in the loop.
        kernels.push(PrefillKernel::Sm90Variant(48));
    }
    // DELTAKIT_TEST_PREFILL_VARIANTS=7,10,11: the default kernel and these tile variants only
    // (the sanitizer runs of new variants).
    if let Ok(list) = std::env::var("DELTAKIT_TEST_PREFILL_VARIANTS") {
        kernels = vec![PrefillKernel::Auto];
        if hd == 256 {
            kernels.extend(
                list.split(',')
                    .filter_map(|v| v.trim().parse().ok())
                    .map(PrefillKernel::Sm90Variant),
            );
        }
    }
    // DELTAKIT_TEST_PREFILL_DEFAULT_ONLY=1: the default kernel alone (the sanitizer runs).
    if std::env::var("DELTAKIT_TEST_PREFILL_DEFAULT_ONLY").is_ok_and(|v| v == "1") {
        kernels = vec![PrefillKernel::Auto];
    }
    if let Some(only) = only {
        kernels = only.to_vec();
    }
    for kernel in kernels {
        if skip_pp && matches!(kernel, PrefillKernel::Sm90PingPong | PrefillKernel::Sm90Variant(_))
        {
            continue;
        }
        let mut out = s.clone_htod(&vec![bf16::NAN; t * hq * hd]).unwrap();
        attn::prefill_with(kernel, s, &dq, &dkc, &dvc, dims, b.kv, &b.view(&d), None, &mut out)
            .unwrap();
        let got = f(&s.clone_dtoh(&out).unwrap());
        let err = rel_err(&got, &expect);
        let row = worst_row_err(&got, &expect, hd);
        worst = worst.max(err);
        let lens: Vec<_> = seqs.iter().map(|x| x.0).collect();
        let ctxs: Vec<_> = seqs.iter().map(|x| x.1).collect();
        assert!(
            err <= 1e-2 && row <= 5e-2,
            "{kernel:?} hd={hd} {hq}/{hkv} lens={lens:?} ctx={ctxs:?} ps={page_size} \
             seed={seed}: rel err {err}, worst row {row}"
        );
        for (i, &(len, c)) in seqs.iter().enumerate() {
            if c < 0 {
                let r0 = b.cu[i] as usize * hq * hd;
                assert!(
                    got[r0..r0 + len * hq * hd].iter().all(|&x| x == 0.0),
                    "{kernel:?}: padding row not zero"
                );
            }
        }
    }
    worst
}

#[test]
fn prefill_kernels_match_reference_for_every_group_size_page_size_and_prior_context() {
    let Some(ctx) = gpu_or_skip("prefill_kernels_match_reference_for_every_group_size") else {
        return;
    };
    let s = ctx.new_stream().unwrap();
    let mut worst = 0f64;
    let mut case = 0u64;
    for &hd in &[256usize, 128, 64] {
        for &g in &[1usize, 2, 3, 4, 6, 8, 12, 16] {
            case += 1;
            let (mut rng, seed) = common::rng(400 + case);
            let hkv = if g <= 8 { 2 } else { 1 };
            let page_size = [1usize, 16, 64][case as usize % 3];
            let n = rng.gen_range(1..=3);
            let mut seqs: Vec<(usize, i32)> = (0..n)
                .map(|_| {
                    let c = *[0i32, 1, 63, 4095, -1].choose(&mut rng).unwrap();
                    let lens: &[usize] =
                        if c == 4095 { &[1, 7, 65] } else { &[1, 7, 63, 64, 65, 130, 257, 600] };
                    (*lens.choose(&mut rng).unwrap(), c)
                })
                .collect();
            // Every case has one live sequence.
            seqs.push((
                *[5usize, 129, 300].choose(&mut rng).unwrap(),
                [0i32, 1, 63][case as usize % 3],
            ));
            seqs.shuffle(&mut rng);
            let dims = AttnDims { n_q_heads: g * hkv, n_kv_heads: hkv, head_dim: hd };
            worst = worst.max(check_prefill_case(&s, &mut rng, seed, &seqs, page_size, dims, None));
        }
    }
    eprintln!("INVARIANT attn.prefill (sm90 + triton) group sweep max_rel_err={worst:.2e}");
}

/// Groups above 16 (past the list): the Q-by-TMA variants 42 / 43 hand one Q box per lane
/// of one warp (up to 2 G boxes per row block), so for G > 16 their launcher runs variant 31
/// instead (session 9 review: G = 24 left boxes unissued and the Q barrier waiting). 44 (session
/// 10: whole-token boxes from one lane, partial-token rows by cp.async) and 48 (44 + uniform K / V
/// box issue) run themselves at G 17 / 24 / 33 / 48 / 64 (up to 2 (G - 1) cp.async rows per
/// block; from G = 33 a row block holds at most 3 tokens and the second box starts past its
/// first row). 42, 44, 48, 31 and the default must finish and match the reference (hd 256; the
/// default alone at hd 128).
#[test]
fn prefill_q_by_tma_variants_take_groups_above_16() {
    let Some(ctx) = gpu_or_skip("prefill_q_by_tma_variants_take_groups_above_16") else {
        return;
    };
    let s = ctx.new_stream().unwrap();
    let only = [
        PrefillKernel::Sm90Variant(42),
        PrefillKernel::Sm90Variant(44),
        PrefillKernel::Sm90Variant(48),
        PrefillKernel::Sm90Variant(31),
        PrefillKernel::Auto,
    ];
    let cases = [(17usize, 256usize), (24, 256), (33, 256), (48, 256), (64, 256), (24, 128)];
    for (case, &(g, hd)) in cases.iter().enumerate() {
        let (mut rng, seed) = common::rng(480 + case as u64);
        let seqs = [(rng.gen_range(60..200), 0i32), (rng.gen_range(1..40), 63), (7, -1)];
        let dims = AttnDims { n_q_heads: g, n_kv_heads: 1, head_dim: hd };
        let only = if hd == 256 { &only[..] } else { &only[only.len() - 1..] };
        check_prefill_case(&s, &mut rng, seed, &seqs, 16, dims, Some(only));
    }
}

/// Small cases of both kernels for the compute-sanitizer runs (memcheck, racecheck): every head
/// dim, page sizes 1 / 16 / 64, prior context, a padding sequence, a partial last row block.
#[test]
fn prefill_kernels_small_cases_for_sanitizer() {
    let Some(ctx) = gpu_or_skip("prefill_kernels_small_cases_for_sanitizer") else { return };
    let s = ctx.new_stream().unwrap();
    let cases: [PrefillCase; 3] = [
        (
            &[(65, 63), (3, -1), (130, 0)],
            16,
            AttnDims { n_q_heads: 6, n_kv_heads: 1, head_dim: 256 },
        ),
        (&[(7, 1), (200, 0)], 1, AttnDims { n_q_heads: 6, n_kv_heads: 2, head_dim: 128 }),
        (&[(129, 4), (1, 0)], 64, AttnDims { n_q_heads: 16, n_kv_heads: 1, head_dim: 64 }),
    ];
    for (i, (seqs, ps, dims)) in cases.iter().enumerate() {
        let (mut rng, seed) = common::rng(600 + i as u64);
        check_prefill_case(&s, &mut rng, seed, seqs, *ps, *dims, None);
    }
}

#[test]
fn prefill_kernels_match_reference_on_varlen_mixes_long_sequences_and_single_tokens() {
    let Some(ctx) = gpu_or_skip("prefill_kernels_match_reference_on_varlen_mixes") else {
        return;
    };
    let s = ctx.new_stream().unwrap();
    let mut worst = 0f64;
    let cases: [PrefillCase; 5] = [
        // Varlen mix of lengths 1..5000 with prior contexts and a padding sequence (27B TP1 group).
        (
            &[(1, 0), (5000, 0), (17, 4095), (2048, 63), (333, 1), (9, -1), (1, 0), (4095, 0)],
            16,
            AttnDims { n_q_heads: 6, n_kv_heads: 1, head_dim: 256 },
        ),
        // T = 1 sequences with and without context (decode-like rows through prefill).
        (&[(1, 0)], 16, AttnDims { n_q_heads: 24, n_kv_heads: 4, head_dim: 256 }),
        (
            &[(1, 4095), (1, 1), (1, -1)],
            1,
            AttnDims { n_q_heads: 24, n_kv_heads: 4, head_dim: 256 },
        ),
        // One 16k sequence.
        (&[(16384, 0)], 64, AttnDims { n_q_heads: 2, n_kv_heads: 1, head_dim: 128 }),
        // Chunked prefill: 512 new tokens over 16k of prior context (27B TP2 group).
        (&[(512, 16000)], 16, AttnDims { n_q_heads: 6, n_kv_heads: 1, head_dim: 256 }),
    ];
    for (i, (seqs, ps, dims)) in cases.iter().enumerate() {
        let (mut rng, seed) = common::rng(500 + i as u64);
        worst = worst.max(check_prefill_case(&s, &mut rng, seed, seqs, *ps, *dims, None));
    }
    eprintln!("INVARIANT attn.prefill (sm90 + triton) varlen/long max_rel_err={worst:.2e}");
}

#[test]
fn decode_matches_reference_and_last_prefill_row_including_32k_split_k() {
    let Some(ctx) =
        gpu_or_skip("decode_matches_reference_and_last_prefill_row_including_32k_split_k")
    else {
        return;
    };
    let s = ctx.new_stream().unwrap();
    let mut worst = 0f64;
    for (case, &(hq, hkv, hd, long)) in [
        (24usize, 4usize, 256usize, false),
        (6, 2, 128, false),
        (16, 1, 128, false),
        (24, 4, 256, true),
    ]
    .iter()
    .enumerate()
    {
        let (mut rng, seed) = common::rng(200 + case as u64);
        let dims = AttnDims { n_q_heads: hq, n_kv_heads: hkv, head_dim: hd };
        // Decode rows as one-token sequences: seq_len = ctx + 1; one padding row.
        let lens: Vec<i32> =
            if long { vec![32_768, 40_000] } else { vec![1, 17, 300, 1000, -1, 64] };
        let seqs: Vec<(usize, i32)> =
            lens.iter().map(|&l| (1usize, if l < 0 { -1 } else { l - 1 })).collect();
        let b = make_batch(&mut rng, &seqs, 16, 2);
        let n = seqs.len();
        let q = bf(&common::randn_f32(&mut rng, n * hq * hd));
        let cl = b.kv.num_pages * 16 * hkv * hd;
        let kc = bf(&common::randn_f32(&mut rng, cl));
        let vc = bf(&common::randn_f32(&mut rng, cl));
        let mut expect = vec![bf16::ZERO; q.len()];
        let rd = r::AttnDims { n_q_heads: hq, n_kv_heads: hkv, head_dim: hd };
        r::decode_paged(&q, &kc, &vc, &lens, b.pages(), 16, rd, None, &mut expect).unwrap();
        let expect = f(&expect);
        let d = b.upload(&s);
        let (dq, dkc, dvc) =
            (s.clone_htod(&q).unwrap(), s.clone_htod(&kc).unwrap(), s.clone_htod(&vc).unwrap());
        let dlens = s.clone_htod(&lens).unwrap();
        // The GPU prefill over the same one-token batch: decode must equal it.
        let mut pre = s.clone_htod(&vec![bf16::NAN; q.len()]).unwrap();
        attn::prefill(&s, &dq, &dkc, &dvc, dims, b.kv, &b.view(&d), None, &mut pre).unwrap();
        let pre = f(&s.clone_dtoh(&pre).unwrap());
        let max_ctx = lens.iter().copied().max().unwrap() as usize;
        for splits in [
            1usize,
            3,
            attn::decode_splits(n, dims, max_ctx),
            attn::decode_splits_long_context(n, dims, max_ctx),
        ] {
            let mut ws = s.alloc_zeros::<f32>(attn::decode_workspace_len(n, dims, splits)).unwrap();
            let mut out = s.clone_htod(&vec![bf16::NAN; q.len()]).unwrap();
            attn::decode(
                &s,
                &dq,
                &dkc,
                &dvc,
                dims,
                b.kv,
                (&dlens, &lens),
                (&d.table, &b.table),
                None,
                splits,
                &mut ws,
                &mut out,
            )
            .unwrap();
            let got = f(&s.clone_dtoh(&out).unwrap());
            let err = rel_err(&got, &expect);
            let err_pre = rel_err(&got, &pre);
            worst = worst.max(err);
            assert!(err <= 1e-2, "case {case} splits {splits} seed {seed}: rel err vs ref {err}");
            assert!(
                err_pre <= 1e-2,
                "case {case} splits {splits} seed {seed}: rel err vs prefill {err_pre}"
            );
            for (i, &l) in lens.iter().enumerate() {
                if l < 0 {
                    assert!(
                        got[i * hq * hd..(i + 1) * hq * hd].iter().all(|&x| x == 0.0),
                        "padding row"
                    );
                }
            }
        }
    }
    eprintln!("INVARIANT attn.decode vs ref max_rel_err={worst:.2e}");
}

/// The reference for decode rows, one row per task on all CPU cores: `decode_paged` for one new
/// token per row, `prefill_paged` of the row's `t_new` tokens over `seq_len - t_new` cached ones
/// otherwise (the multi-token contract). Padding rows stay zero.
fn ref_decode_par(
    b: &Batch,
    q: &[bf16],
    kc: &[bf16],
    vc: &[bf16],
    lens: &[i32],
    dims: AttnDims,
    t_new: usize,
) -> Vec<f32> {
    let (hq, hd) = (dims.n_q_heads, dims.head_dim);
    let per_row = t_new * hq * hd;
    let rd = r::AttnDims { n_q_heads: hq, n_kv_heads: dims.n_kv_heads, head_dim: hd };
    let mp = b.kv.max_pages;
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results = std::sync::Mutex::new(Vec::new());
    let threads = std::thread::available_parallelism().map_or(4, std::num::NonZero::get);
    std::thread::scope(|sc| {
        for _ in 0..threads {
            sc.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(&l) = lens.get(i) else { break };
                if l < 0 {
                    continue;
                }
                let qs = &q[i * per_row..(i + 1) * per_row];
                let pages = r::PageTable { table: &b.table[i * mp..(i + 1) * mp], max_pages: mp };
                let mut o = vec![bf16::ZERO; per_row];
                if t_new == 1 {
                    r::decode_paged(qs, kc, vc, &[l], pages, b.kv.page_size, rd, None, &mut o)
                        .unwrap();
                } else {
                    let cu = [0, t_new as i32];
                    let ctx = [l - t_new as i32];
                    r::prefill_paged(
                        qs,
                        kc,
                        vc,
                        &cu,
                        &ctx,
                        pages,
                        b.kv.page_size,
                        rd,
                        None,
                        &mut o,
                    )
                    .unwrap();
                }
                results.lock().unwrap().push((i, o));
            });
        }
    });
    let mut out = vec![0f32; lens.len() * per_row];
    for (i, o) in results.into_inner().unwrap() {
        for (d, x) in out[i * per_row..(i + 1) * per_row].iter_mut().zip(&o) {
            *d = x.to_f32();
        }
    }
    out
}

/// Runs every decode kernel (the sm_90 default and tile variants 0-3, and Triton for one new
/// token per row) at several split counts on one random case (rows of context `lens`, -1 =
/// padding) and checks each against the reference: NaN-poisoned outputs and workspace, relative
/// error <= 1e-2 overall and <= 5e-2 per hd-row, padding rows exactly zero.
#[allow(clippy::too_many_arguments, clippy::too_many_lines)]
fn check_decode_case(
    s: &Arc<CudaStream>,
    rng: &mut StdRng,
    seed: u64,
    lens: &[i32],
    page_size: usize,
    dims: AttnDims,
    t_new: usize,
    extra_splits: &[usize],
) -> f64 {
    let (hq, hkv, hd) = (dims.n_q_heads, dims.n_kv_heads, dims.head_dim);
    let seqs: Vec<(usize, i32)> =
        lens.iter().map(|&l| (t_new, if l < 0 { -1 } else { l - t_new as i32 })).collect();
    let b = make_batch(rng, &seqs, page_size, 2);
    let n = lens.len();
    let tokens = n * t_new;
    // q x 4 (exact in bf16): a peaked softmax, so a wrong position or split merge shows.
    let q =
        bf(&common::randn_f32(rng, tokens * hq * hd).iter().map(|x| x * 4.0).collect::<Vec<_>>());
    let cl = b.kv.num_pages * page_size * hkv * hd;
    let kc = bf(&common::randn_f32(rng, cl));
    let vc = bf(&common::randn_f32(rng, cl));
    let expect = ref_decode_par(&b, &q, &kc, &vc, lens, dims, t_new);
    let (dq, dkc, dvc) =
        (s.clone_htod(&q).unwrap(), s.clone_htod(&kc).unwrap(), s.clone_htod(&vc).unwrap());
    let dlens = s.clone_htod(lens).unwrap();
    let dtab = s.clone_htod(&b.table).unwrap();
    let max_ctx = lens.iter().copied().max().unwrap().max(1) as usize;
    let mut splits = vec![
        1usize,
        3,
        attn::decode_splits(n, dims, max_ctx),
        attn::decode_splits_long_context(n, dims, max_ctx),
    ];
    splits.extend_from_slice(extra_splits);
    splits.dedup();
    let mut kernels = vec![DecodeKernel::Auto];
    // DELTAKIT_TEST_DECODE_VARIANTS=<max>: sm90 variants 0..=max only (device-run triage), or a
    // comma list of variants (the sanitizer runs of new variants).
    let var_env = std::env::var("DELTAKIT_TEST_DECODE_VARIANTS").unwrap_or_default();
    if var_env.contains(',') {
        kernels.extend(
            var_env.split(',').filter_map(|v| v.trim().parse().ok()).map(DecodeKernel::Sm90Variant),
        );
    } else {
        let max_var = var_env.trim().parse::<u8>().unwrap_or(11);
        kernels.extend((0..=max_var).map(DecodeKernel::Sm90Variant));
        if var_env.trim().is_empty() {
            // 13 (dynamic split chunks in clusters): every decode test, memcheck and racecheck
            // passed on an H200 (session 8); opt-in (slower than 0), tested by default. 16 / 17
            // (static prefix + chunks claimed from a global counter) and 14 / 15 (all claimed)
            // likewise in session 9.
            kernels.extend([13, 14, 15, 16, 17].map(DecodeKernel::Sm90Variant));
            // 18-21, 23, 24 (strided splits, lean combine): every decode test, memcheck and
            // racecheck passed on an H200 (session 12; 19 is Auto's pick at <= 8 splits, hd 256).
            kernels.extend([18, 19, 20, 21, 23, 24].map(DecodeKernel::Sm90Variant));
        }
    }
    if t_new == 1 {
        kernels.push(DecodeKernel::Triton);
    }
    let mut worst = 0f64;
    for &sp in &splits {
        let wl = attn::decode_workspace_len(tokens, dims, sp);
        let mut ws = s.clone_htod(&vec![f32::NAN; wl]).unwrap();
        for &kernel in &kernels {
            if hd == 64 && matches!(kernel, DecodeKernel::Sm90Variant(v) if v > 0) {
                continue; // one configuration at hd 64
            }
            let mut out = s.clone_htod(&vec![bf16::NAN; tokens * hq * hd]).unwrap();
            if t_new == 1 {
                attn::decode_with(
                    kernel,
                    s,
                    &dq,
                    &dkc,
                    &dvc,
                    dims,
                    b.kv,
                    (&dlens, lens),
                    (&dtab, &b.table),
                    None,
                    sp,
                    &mut ws,
                    &mut out,
                )
                .unwrap();
            } else {
                if kernel == DecodeKernel::Triton {
                    continue; // no portable multi-token kernel
                }
                attn::decode_multi_token_with(
                    kernel,
                    s,
                    &dq,
                    &dkc,
                    &dvc,
                    dims,
                    b.kv,
                    (&dlens, lens),
                    (&dtab, &b.table),
                    t_new,
                    None,
                    sp,
                    &mut ws,
                    &mut out,
                )
                .unwrap();
            }
            let got = f(&s.clone_dtoh(&out).unwrap());
            let err = rel_err(&got, &expect);
            let row = worst_row_err(&got, &expect, hd);
            worst = worst.max(err);
            assert!(
                err <= 1e-2 && row <= 5e-2,
                "{kernel:?} hd={hd} {hq}/{hkv} T={t_new} lens={lens:?} ps={page_size} \
                 splits={sp} seed={seed}: rel err {err}, worst row {row}"
            );
            for (i, &l) in lens.iter().enumerate() {
                if l < 0 {
                    let w = t_new * hq * hd;
                    assert!(
                        got[i * w..(i + 1) * w].iter().all(|&x| x == 0.0),
                        "{kernel:?} splits={sp}: padding row {i} not zero"
                    );
                }
            }
        }
    }
    worst
}

#[test]
fn decode_kernels_match_reference_for_every_group_context_and_page_size() {
    let Some(ctx) = gpu_or_skip("decode_kernels_match_reference_for_every_group_context") else {
        return;
    };
    let s = ctx.new_stream().unwrap();
    let mut worst = 0f64;
    for g in 1usize..=16 {
        let (mut rng, seed) = common::rng(700 + g as u64);
        let hd = if g % 2 == 0 { 256 } else { 128 };
        let hkv = if g <= 8 { 2 } else { 1 };
        let page_size = [1usize, 16, 64][g % 3];
        // Contexts 1, 17, 4096 and a padding row everywhere; 32768 in every other case; 131072
        // at the 27B group (6) and the largest (16).
        let mut lens = vec![1i32, 17, 4096, -1];
        if g % 2 == 1 {
            lens.push(32_768);
        }
        if g == 6 || g == 16 {
            lens.push(131_072);
        }
        lens.shuffle(&mut rng);
        let dims = AttnDims { n_q_heads: g * hkv, n_kv_heads: hkv, head_dim: hd };
        let err = check_decode_case(&s, &mut rng, seed, &lens, page_size, dims, 1, &[200]);
        worst = worst.max(err);
    }
    eprintln!("INVARIANT attn.decode (sm90 + triton) group/context sweep max_rel_err={worst:.2e}");
}

#[test]
fn decode_multi_token_rows_match_prefill_reference() {
    let Some(ctx) = gpu_or_skip("decode_multi_token_rows_match_prefill_reference") else {
        return;
    };
    let s = ctx.new_stream().unwrap();
    let mut worst = 0f64;
    // (group, hkv, hd, T, page size): G * T <= 16.
    for (case, &(g, hkv, hd, t, ps)) in [
        (6usize, 4usize, 256usize, 2usize, 16usize),
        (4, 2, 256, 4, 1),
        (1, 2, 128, 16, 64),
        (3, 2, 128, 5, 16),
        (8, 1, 64, 2, 16),
    ]
    .iter()
    .enumerate()
    {
        let (mut rng, seed) = common::rng(800 + case as u64);
        let mut lens = vec![t as i32, t as i32 + 1, 17, 4096, -1, 33_000];
        lens.shuffle(&mut rng);
        let dims = AttnDims { n_q_heads: g * hkv, n_kv_heads: hkv, head_dim: hd };
        worst = worst.max(check_decode_case(&s, &mut rng, seed, &lens, ps, dims, t, &[]));
    }
    eprintln!("INVARIANT attn.decode multi-token max_rel_err={worst:.2e}");
}

/// Small decode cases for the compute-sanitizer runs: hd 256 / 128 / 64, page sizes 1 / 16 / 64,
/// a padding row, several splits (empty ones included), one and several new tokens per row.
#[test]
fn decode_kernels_small_cases_for_sanitizer() {
    let Some(ctx) = gpu_or_skip("decode_kernels_small_cases_for_sanitizer") else { return };
    let s = ctx.new_stream().unwrap();
    let cases: [(&[i32], usize, AttnDims, usize); 4] = [
        (&[1, 17, 300, -1], 16, AttnDims { n_q_heads: 6, n_kv_heads: 1, head_dim: 256 }, 1),
        (&[130, -1, 5], 1, AttnDims { n_q_heads: 16, n_kv_heads: 1, head_dim: 128 }, 1),
        (&[70, 3], 64, AttnDims { n_q_heads: 8, n_kv_heads: 2, head_dim: 64 }, 1),
        (&[3, 200, -1], 16, AttnDims { n_q_heads: 8, n_kv_heads: 2, head_dim: 256 }, 3),
    ];
    for (i, (lens, ps, dims, t)) in cases.iter().enumerate() {
        let (mut rng, seed) = common::rng(900 + i as u64);
        // (12 splits: clusters of 6 for variant 13, the second one empty at these contexts.)
        check_decode_case(&s, &mut rng, seed, lens, *ps, *dims, *t, &[12]);
    }
}

#[test]
fn attention_rejects_bad_metadata() {
    let Some(ctx) = gpu_or_skip("attention_rejects_bad_metadata") else { return };
    let s = ctx.new_stream().unwrap();
    let (mut rng, _) = common::rng(300);
    let mut b = make_batch(&mut rng, &[(4, 0), (3, 2)], 4, 0);
    let dims = AttnDims { n_q_heads: 4, n_kv_heads: 2, head_dim: 128 };
    let t = 7;
    let q = s.clone_htod(&vec![bf16::ONE; t * 4 * 128]).unwrap();
    let cl = b.kv.num_pages * 4 * 2 * 128;
    let kc = s.clone_htod(&vec![bf16::ONE; cl]).unwrap();
    let mut out = s.clone_htod(&vec![bf16::NAN; t * 4 * 128]).unwrap();
    // A page id out of range (sequence 1's first page: a page it uses).
    let orig = b.table[b.kv.max_pages];
    b.table[b.kv.max_pages] = b.kv.num_pages as i32;
    let d = b.upload(&s);
    let e = attn::prefill(&s, &q, &kc, &kc, dims, b.kv, &b.view(&d), None, &mut out).unwrap_err();
    assert!(matches!(e, deltakit::Error::Shape { arg: "page_table", .. }), "{e}");
    // Decreasing cu_seqlens that still end at T.
    b.table[b.kv.max_pages] = orig;
    b.cu[1] = 8;
    let d = b.upload(&s);
    let e = attn::prefill(&s, &q, &kc, &kc, dims, b.kv, &b.view(&d), None, &mut out).unwrap_err();
    assert!(matches!(e, deltakit::Error::Shape { arg: "cu_seqlens", .. }), "{e}");
    // Unsupported head dim.
    let e = attn::prefill(
        &s,
        &q,
        &kc,
        &kc,
        AttnDims { head_dim: 96, ..dims },
        b.kv,
        &b.view(&d),
        None,
        &mut out,
    )
    .unwrap_err();
    assert!(matches!(e, deltakit::Error::Unsupported { .. }), "{e}");
    // A tile variant the sm90 kernel does not have.
    b.cu[1] = 4;
    let d = b.upload(&s);
    let e = attn::prefill_with(
        PrefillKernel::Sm90Variant(99),
        &s,
        &q,
        &kc,
        &kc,
        dims,
        b.kv,
        &b.view(&d),
        None,
        &mut out,
    )
    .unwrap_err();
    assert!(matches!(e, deltakit::Error::Shape { arg: "kernel", .. }), "{e}");
    assert!(s.clone_dtoh(&out).unwrap().iter().all(|x| x.is_nan()), "written on error");
}

#[test]
fn decode_rejects_bad_arguments() {
    let Some(ctx) = gpu_or_skip("decode_rejects_bad_arguments") else { return };
    let s = ctx.new_stream().unwrap();
    let (mut rng, _) = common::rng(310);
    let lens = vec![5i32, 3];
    let b = make_batch(&mut rng, &[(2, 3), (2, 1)], 4, 0);
    let dims = AttnDims { n_q_heads: 4, n_kv_heads: 2, head_dim: 128 };
    let q = s.clone_htod(&vec![bf16::ONE; 4 * 4 * 128]).unwrap();
    let cl = b.kv.num_pages * 4 * 2 * 128;
    let kc = s.clone_htod(&vec![bf16::ONE; cl]).unwrap();
    let dl = s.clone_htod(&lens).unwrap();
    let dt = s.clone_htod(&b.table).unwrap();
    let mut ws = s.alloc_zeros::<f32>(attn::decode_workspace_len(4, dims, 2)).unwrap();
    let mut out = s.clone_htod(&vec![bf16::NAN; 4 * 4 * 128]).unwrap();
    let mut out1 = s.clone_htod(&vec![bf16::NAN; 2 * 4 * 128]).unwrap();
    let q1 = s.clone_htod(&vec![bf16::ONE; 2 * 4 * 128]).unwrap();
    // A tile variant the sm90 decode kernel does not have.
    let e = attn::decode_with(
        DecodeKernel::Sm90Variant(25),
        &s,
        &q1,
        &kc,
        &kc,
        dims,
        b.kv,
        (&dl, &lens),
        (&dt, &b.table),
        None,
        2,
        &mut ws,
        &mut out1,
    )
    .unwrap_err();
    assert!(matches!(e, deltakit::Error::Shape { arg: "kernel", .. }), "{e}");
    // G * T > 16 (group 2 x 9 tokens).
    let e = attn::decode_multi_token(
        &s,
        &q,
        &kc,
        &kc,
        dims,
        b.kv,
        (&dl, &lens),
        (&dt, &b.table),
        9,
        None,
        2,
        &mut ws,
        &mut out,
    )
    .unwrap_err();
    assert!(matches!(e, deltakit::Error::Shape { arg: "tokens_per_row", .. }), "{e}");
    // A row shorter than its new tokens.
    let short = vec![5i32, 1];
    let e = attn::decode_multi_token(
        &s,
        &q,
        &kc,
        &kc,
        dims,
        b.kv,
        (&dl, &short),
        (&dt, &b.table),
        2,
        None,
        2,
        &mut ws,
        &mut out,
    )
    .unwrap_err();
    assert!(matches!(e, deltakit::Error::Shape { arg: "seq_lens", .. }), "{e}");
    // No portable multi-token kernel.
    let e = attn::decode_multi_token_with(
        DecodeKernel::Triton,
        &s,
        &q,
        &kc,
        &kc,
        dims,
        b.kv,
        (&dl, &lens),
        (&dt, &b.table),
        2,
        None,
        2,
        &mut ws,
        &mut out,
    )
    .unwrap_err();
    assert!(matches!(e, deltakit::Error::Unsupported { .. }), "{e}");
    assert!(s.clone_dtoh(&out).unwrap().iter().all(|x| x.is_nan()), "written on error");
    assert!(s.clone_dtoh(&out1).unwrap().iter().all(|x| x.is_nan()), "written on error");
}

#[test]
fn decode_split_heuristics_stay_in_their_workspace_bounds() {
    for &(hq, hkv) in &[(24usize, 4usize), (12, 2), (16, 1), (4, 4)] {
        let dims = AttnDims { n_q_heads: hq, n_kv_heads: hkv, head_dim: 256 };
        for rows in [1usize, 2, 7, 16, 64, 300] {
            for ctx in [1usize, 17, 64, 65, 4096, 32_768, 131_072] {
                let s = attn::decode_splits(rows, dims, ctx);
                assert!((1..=128).contains(&s) && (s == 1 || s <= ctx.div_ceil(64)));
                // The engine's capacity plan: one split per row + ceil(264 / H_kv) programs.
                assert!(rows * s <= rows + 264usize.div_ceil(hkv), "{rows} x {s} splits");
                let l = attn::decode_splits_long_context(rows, dims, ctx);
                assert!(l >= s && l <= 128 && (l == 1 || l <= ctx.div_ceil(64)));
                assert!(l >= ctx.div_ceil(1024).min(128), "{l} splits for {ctx}");
            }
        }
    }
}
