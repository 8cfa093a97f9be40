//! GPU tests: `mlp.silu_and_mul`, `mlp.embedding`, `attn.output_gate`, `sample.argmax` vs
//! deltakit-ref (bit-exact: same f32 math and rounding points).
mod common;

use deltakit::ops::{attn, mlp, sample};
use deltakit::testing::{gpu_or_skip, rel_err};
use half::bf16;

use common::{to_bf16 as bf, to_f32 as f};

#[test]
fn silu_and_mul_matches_reference() {
    let Some(ctx) = gpu_or_skip("silu_and_mul_matches_reference") else { return };
    let stream = ctx.default_stream();
    for (case, &(rows, inter)) in
        [(1usize, 17408usize), (7, 128), (64, 12288), (3, 1)].iter().enumerate()
    {
        let (mut rng, seed) = common::rng(case as u64);
        let x: Vec<bf16> = bf(&common::randn_f32(&mut rng, rows * 2 * inter)
            .iter()
            .map(|v| v * 6.0)
            .collect::<Vec<_>>());
        let mut expect = vec![bf16::ZERO; rows * inter];
        deltakit_ref::mlp::silu_and_mul(&x, inter, &mut expect).unwrap();
        let dx = stream.clone_htod(&x).unwrap();
        let mut out = stream.clone_htod(&vec![bf16::NAN; rows * inter]).unwrap();
        mlp::silu_and_mul(&stream, &dx, inter, &mut out).unwrap();
        let got = stream.clone_dtoh(&out).unwrap();
        let err = rel_err(&f(&got), &f(&expect));
        // __expf vs f32 exp may differ in the last ulp before the bf16 rounding.
        assert!(err <= 1e-2, "rows={rows} inter={inter} seed={seed}: rel err {err}");
        eprintln!("silu_and_mul rows={rows} inter={inter}: rel err {err:.2e}");
    }
}

#[test]
fn embedding_matches_reference_and_poisons_bad_ids() {
    let Some(ctx) = gpu_or_skip("embedding_matches_reference_and_poisons_bad_ids") else { return };
    let stream = ctx.default_stream();
    let (mut rng, seed) = common::rng(11);
    let (vocab, d) = (1000usize, 320usize);
    let table = bf(&common::randn_f32(&mut rng, vocab * d));
    let ids: Vec<i32> = (0..37).map(|i| ((i * 7919 + 13) % vocab) as i32).collect();
    let mut expect = vec![bf16::ZERO; ids.len() * d];
    deltakit_ref::mlp::embedding(&ids, &table, d, &mut expect).unwrap();
    let dt = stream.clone_htod(&table).unwrap();
    let di = stream.clone_htod(&ids).unwrap();
    let mut out = stream.clone_htod(&vec![bf16::NAN; ids.len() * d]).unwrap();
    mlp::embedding(&stream, &di, &dt, vocab, &mut out).unwrap();
    assert_eq!(stream.clone_dtoh(&out).unwrap(), expect, "seed={seed}");
    // Out-of-range ids give NaN rows, the others stay exact.
    let bad = vec![5i32, -1, vocab as i32, 7];
    let db = stream.clone_htod(&bad).unwrap();
    let mut out = stream.clone_htod(&vec![bf16::ZERO; bad.len() * d]).unwrap();
    mlp::embedding(&stream, &db, &dt, vocab, &mut out).unwrap();
    let got = stream.clone_dtoh(&out).unwrap();
    assert_eq!(&got[..d], &table[5 * d..6 * d]);
    assert!(got[d..3 * d].iter().all(|v| v.is_nan()));
    assert_eq!(&got[3 * d..], &table[7 * d..8 * d]);
}

#[test]
fn output_gate_matches_reference_with_strided_gate() {
    let Some(ctx) = gpu_or_skip("output_gate_matches_reference_with_strided_gate") else { return };
    let stream = ctx.default_stream();
    let (mut rng, seed) = common::rng(12);
    let (rows, width, stride) = (19usize, 24 * 256usize, 2 * 24 * 256usize);
    let attn_v = bf(&common::randn_f32(&mut rng, rows * width));
    let gate_wide: Vec<bf16> =
        bf(&common::randn_f32(&mut rng, rows * stride).iter().map(|v| v * 8.0).collect::<Vec<_>>());
    let gate: Vec<bf16> = gate_wide.chunks(stride).flat_map(|r| r[..width].to_vec()).collect();
    let mut expect = vec![bf16::ZERO; rows * width];
    deltakit_ref::attn::output_gate(&attn_v, &gate, &mut expect).unwrap();
    let da = stream.clone_htod(&attn_v).unwrap();
    let dg = stream.clone_htod(&gate_wide).unwrap();
    let mut out = stream.clone_htod(&vec![bf16::NAN; rows * width]).unwrap();
    attn::output_gate(&stream, &da, &dg, width, Some(stride), &mut out).unwrap();
    let err = rel_err(&f(&stream.clone_dtoh(&out).unwrap()), &f(&expect));
    assert!(err <= 1e-2, "seed={seed}: rel err {err}");
    let e = attn::output_gate(&stream, &da, &dg, width, Some(width - 1), &mut out).unwrap_err();
    assert!(matches!(e, deltakit::Error::Shape { arg: "gate", .. }), "{e}");
}

#[test]
fn argmax_matches_reference_at_qwen_vocab() {
    let Some(ctx) = gpu_or_skip("argmax_matches_reference_at_qwen_vocab") else { return };
    let stream = ctx.default_stream();
    let vocab = 248_320usize;
    for (case, rows) in [1usize, 5, 64].into_iter().enumerate() {
        let (mut rng, seed) = common::rng(20 + case as u64);
        let mut logits = bf(&common::randn_f32(&mut rng, rows * vocab)
            .iter()
            .map(|v| v * 10.0)
            .collect::<Vec<_>>());
        // Exact ties: plant the row maximum twice; the lower index must win.
        for r in 0..rows {
            let (i, j) = ((r * 7919) % vocab, (r * 7919 + 100_000) % vocab);
            let (lo, hi) = (i.min(j), i.max(j));
            logits[r * vocab + lo] = bf16::from_f32(1000.0);
            logits[r * vocab + hi] = bf16::from_f32(1000.0);
        }
        let mut expect = vec![0u32; rows];
        deltakit_ref::sample::argmax(&logits, vocab, &mut expect).unwrap();
        let dl = stream.clone_htod(&logits).unwrap();
        let mut ids = stream.clone_htod(&vec![-7i32; rows]).unwrap();
        sample::argmax(&stream, &dl, vocab, &mut ids).unwrap();
        let got = stream.clone_dtoh(&ids).unwrap();
        let expect: Vec<i32> = expect.iter().map(|&v| v as i32).collect();
        assert_eq!(got, expect, "rows={rows} seed={seed}");
    }
    // A NaN row yields -1; its neighbour is unaffected.
    let mut logits = vec![bf16::ONE; 2 * 1000];
    logits[1500] = bf16::NAN;
    logits[3] = bf16::from_f32(2.0);
    let dl = stream.clone_htod(&logits).unwrap();
    let mut ids = stream.clone_htod(&[9i32, 9]).unwrap();
    sample::argmax(&stream, &dl, 1000, &mut ids).unwrap();
    assert_eq!(stream.clone_dtoh(&ids).unwrap(), vec![3, -1]);
}
