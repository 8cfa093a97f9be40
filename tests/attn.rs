//! GPU tests of the attention ops vs deltakit-ref: `attn.prep` (q/gate split, q/k norm, partial
//! RoPE, paged KV write), `attn.prefill` (causal GQA over the paged cache, prior context) and
//! `attn.decode` (split-K).
mod common;

use deltakit::cudarc::driver::{CudaSlice, CudaStream};
use deltakit::ops::attn::{self, AttnDims, PagedKv, Rope, SeqBatch};
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
        for splits in [1usize, 3, attn::decode_splits(n, dims, max_ctx)] {
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
    assert!(s.clone_dtoh(&out).unwrap().iter().all(|x| x.is_nan()), "written on error");
}
