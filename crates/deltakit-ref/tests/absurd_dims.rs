//! Absurd dimensions with zero tokens (session-11 review): every op must answer with its typed
//! error or an empty result, never a capacity-overflow panic or an allocation abort (scratch
//! sized from a dimension alone, before any token proves that the dimension fits in memory).

use deltakit_ref::attn::{
    decode_paged, prefill_contiguous, prefill_paged, rope_neox, AttnDims, PageTable, RopeParams,
};
use deltakit_ref::gdr::{chunk_prefill, decode, recurrent_prefill, GdrDims, GdrInputs, GdrOptions};
use deltakit_ref::{RefError, Varlen};

/// 2^40 x 2^20 f32 state elements per head: the scratch of one head alone would be 4 PiB.
const HUGE_GDR: GdrDims = GdrDims { h_k: 1, h_v: 1, k: 1 << 40, v: 1 << 20 };

fn empty_gdr() -> (Vec<f32>, Vec<f32>) {
    (Vec::new(), Vec::new())
}

#[test]
fn gdr_ops_with_absurd_head_dims_and_no_tokens_do_not_allocate() {
    let (x, g) = empty_gdr();
    let inp = GdrInputs { q: &x, k: &x, v: &x, g: &g, beta: &g };
    let o = GdrOptions::default();
    let (mut st, mut out) = (Vec::<f32>::new(), Vec::<f32>::new());
    // No sequences at all: nothing to do.
    recurrent_prefill(&inp, HUGE_GDR, Varlen::new(&[0], &[]), o, &mut st, &mut out).unwrap();
    chunk_prefill(&inp, HUGE_GDR, Varlen::new(&[0], &[]), o, 64, &mut st, &mut out).unwrap();
    decode(&inp, HUGE_GDR, &[], o, &mut st, &mut out).unwrap();
    // Padding sequences of zero tokens: still nothing to compute.
    recurrent_prefill(&inp, HUGE_GDR, Varlen::new(&[0, 0, 0], &[-1, -1]), o, &mut st, &mut out)
        .unwrap();
    chunk_prefill(&inp, HUGE_GDR, Varlen::new(&[0, 0], &[-1]), o, 16, &mut st, &mut out).unwrap();
    // A live sequence needs a slot, and a slot of these dims does not fit in memory: the empty
    // pool has none, so slot 0 is out of range (a typed error, not an allocation).
    let e = recurrent_prefill(&inp, HUGE_GDR, Varlen::new(&[0, 0], &[0]), o, &mut st, &mut out)
        .unwrap_err();
    assert!(matches!(e, RefError::Invalid { what: "slots", .. }), "{e}");
    // Products that overflow usize are typed errors naming the argument.
    let over = GdrDims { h_k: 1, h_v: 1 << 32, k: 1 << 32, v: 1 };
    let e = decode(&inp, over, &[], o, &mut st, &mut out).unwrap_err();
    assert!(matches!(e, RefError::Invalid { what: "v" | "state", .. }), "{e}");
}

#[test]
fn attention_with_an_absurd_head_dim_and_no_tokens_does_not_allocate() {
    // hd = 2^61: an f64 scratch row of hd elements is 2^64 bytes (capacity overflow).
    let dims = AttnDims { n_q_heads: 1, n_kv_heads: 1, head_dim: 1 << 61 };
    let none: [f32; 0] = [];
    let mut out: Vec<f32> = Vec::new();
    let pages = PageTable { table: &[], max_pages: 1 };
    prefill_paged(&none, &none, &none, &[0], &[], pages, 1, dims, None, &mut out).unwrap();
    decode_paged(&none, &none, &none, &[], pages, 1, dims, None, &mut out).unwrap();
    prefill_contiguous(&none, &none, &none, &[0], &[0], dims, None, &mut out).unwrap();
    // Overflowing head products are typed errors.
    let over = AttnDims { n_q_heads: 1 << 4, n_kv_heads: 1, head_dim: 1 << 61 };
    let e = decode_paged(&none, &none, &none, &[], pages, 1, over, None, &mut out).unwrap_err();
    assert!(matches!(e, RefError::Invalid { what: "q", .. }), "{e}");
}

#[test]
fn rope_with_an_absurd_head_dim_and_no_tokens_does_not_allocate() {
    let p = RopeParams { head_dim: 1 << 62, rotary_dim: 1 << 62, theta: 1e4 };
    let mut x: Vec<f32> = Vec::new();
    rope_neox(&mut x, 1, &[], p).unwrap();
    let e = rope_neox(&mut x, 4, &[], p).unwrap_err();
    assert!(matches!(e, RefError::Invalid { what: "x", .. }), "{e}");
}
