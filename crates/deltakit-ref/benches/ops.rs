//! Criterion benches of every reference op at a small CPU shape (one group per op id).
//! Run: `cargo bench -p deltakit-ref` (add a filter such as `gdr.` to run one family).
#![allow(missing_docs)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use deltakit_ref::attn::{self, AttnDims, KvDims, PageTable, RopeParams};
use deltakit_ref::conv1d::{self, ConvDims};
use deltakit_ref::gdr::{self, GdrDims, GdrInputs, GdrOptions};
use deltakit_ref::{mlp, norm, sample, Varlen};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn rnd(n: usize, seed: u64) -> Vec<f32> {
    let mut r = StdRng::seed_from_u64(seed);
    (0..n).map(|_| r.gen_range(-1.0f32..1.0)).collect()
}

fn bytes(n_f32: usize) -> Throughput {
    Throughput::Bytes((n_f32 * 4) as u64)
}

fn bench_gdr(c: &mut Criterion) {
    // Small GDR layer: T = 128 tokens, H_k = 2, H_v = 4, K = V = 32.
    let d = GdrDims { h_k: 2, h_v: 4, k: 32, v: 32 };
    let t = 128;
    let q = rnd(t * d.h_k * d.k, 1);
    let k = rnd(t * d.h_k * d.k, 2);
    let v = rnd(t * d.h_v * d.v, 3);
    let a = rnd(t * d.h_v, 4);
    let b = rnd(t * d.h_v, 5);
    let (mut g, mut beta) = (vec![0f32; t * d.h_v], vec![0f32; t * d.h_v]);
    let (a_log, dt) = (rnd(d.h_v, 6), rnd(d.h_v, 7));
    let mut grp = c.benchmark_group("gdr.gating");
    grp.throughput(bytes(4 * t * d.h_v));
    grp.bench_function("T128_Hv4", |bn| {
        bn.iter(|| gdr::gating(black_box(&a), &b, &a_log, &dt, &mut g, &mut beta).unwrap());
    });
    grp.finish();
    let mut qn = vec![0f32; q.len()];
    let mut grp = c.benchmark_group("gdr.l2norm");
    grp.throughput(bytes(2 * q.len()));
    grp.bench_function("T128_Hk2_K32", |bn| {
        bn.iter(|| gdr::l2norm(black_box(&q), d.k, gdr::L2NORM_EPS, &mut qn).unwrap());
    });
    grp.finish();
    let inp = GdrInputs { q: &q, k: &k, v: &v, g: &g, beta: &beta };
    let mut state = rnd(2 * d.state_per_slot(), 8);
    let mut out = vec![0f32; v.len()];
    let cu = [0, t as i32];
    let o = GdrOptions::default();
    let io = q.len() * 2 + v.len() * 2 + 2 * g.len() + 2 * d.state_per_slot();
    let mut grp = c.benchmark_group("gdr.recurrent_prefill");
    grp.throughput(bytes(io));
    grp.bench_function("T128_Hk2_Hv4_K32_V32", |bn| {
        bn.iter(|| {
            gdr::recurrent_prefill(
                black_box(&inp),
                d,
                Varlen::new(&cu, &[1]),
                o,
                &mut state,
                &mut out,
            )
            .unwrap();
        });
    });
    grp.finish();
    let mut grp = c.benchmark_group("gdr.chunk_prefill");
    grp.throughput(bytes(io));
    grp.bench_function("T128_Hk2_Hv4_K32_V32_C64", |bn| {
        bn.iter(|| {
            gdr::chunk_prefill(
                black_box(&inp),
                d,
                Varlen::new(&cu, &[1]),
                o,
                64,
                &mut state,
                &mut out,
            )
            .unwrap();
        });
    });
    grp.finish();
    // Decode: 8 rows.
    let n = 8;
    let dinp = GdrInputs {
        q: &q[..n * d.h_k * d.k],
        k: &k[..n * d.h_k * d.k],
        v: &v[..n * d.h_v * d.v],
        g: &g[..n * d.h_v],
        beta: &beta[..n * d.h_v],
    };
    let mut dstate = rnd(n * d.state_per_slot(), 9);
    let slots: Vec<i32> = (0..n as i32).collect();
    let mut dout = vec![0f32; n * d.h_v * d.v];
    let mut grp = c.benchmark_group("gdr.decode");
    grp.throughput(bytes(2 * dstate.len()));
    grp.bench_function("N8_Hk2_Hv4_K32_V32", |bn| {
        bn.iter(|| gdr::decode(black_box(&dinp), d, &slots, o, &mut dstate, &mut dout).unwrap());
    });
    grp.finish();
}

fn bench_conv(c: &mut Criterion) {
    let cd = ConvDims { conv_dim: 256, width: 4 };
    let t = 128;
    let x = rnd(t * cd.conv_dim, 1);
    let w = rnd(cd.conv_dim * 4, 2);
    let b = rnd(cd.conv_dim, 3);
    let mut st = rnd(8 * cd.conv_dim * 3, 4);
    let mut out = vec![0f32; x.len()];
    let cu = [0, t as i32];
    let mut grp = c.benchmark_group("conv1d.prefill");
    grp.throughput(bytes(2 * x.len()));
    grp.bench_function("T128_C256_W4", |bn| {
        bn.iter(|| {
            conv1d::prefill(
                black_box(&x),
                &w,
                Some(&b),
                cd,
                Varlen::new(&cu, &[0]),
                &mut st,
                &mut out,
            )
            .unwrap();
        });
    });
    grp.finish();
    let slots: Vec<i32> = (0..8).collect();
    let mut grp = c.benchmark_group("conv1d.update");
    grp.throughput(bytes(2 * 8 * cd.conv_dim + st.len() * 2));
    grp.bench_function("N8_S1_C256_W4", |bn| {
        bn.iter(|| {
            conv1d::update(
                black_box(&x[..8 * cd.conv_dim]),
                &w,
                Some(&b),
                cd,
                1,
                &slots,
                &mut st,
                &mut out[..8 * cd.conv_dim],
            )
            .unwrap();
        });
    });
    grp.finish();
}

fn bench_norm(c: &mut Criterion) {
    let (t, dm) = (64, 512);
    let x = rnd(t * dm, 1);
    let w = rnd(dm, 2);
    let z = rnd(t * dm, 3);
    let mut out = vec![0f32; x.len()];
    let mut res = rnd(t * dm, 4);
    let mut grp = c.benchmark_group("norm.rms");
    grp.throughput(bytes(2 * x.len()));
    grp.bench_function("T64_D512", |bn| {
        bn.iter(|| norm::rms_norm(black_box(&x), &w, 1e-6, &mut out).unwrap());
    });
    grp.finish();
    let mut grp = c.benchmark_group("norm.fused_add_rms");
    grp.throughput(bytes(4 * x.len()));
    grp.bench_function("T64_D512", |bn| {
        bn.iter(|| norm::fused_add_rms_norm(black_box(&x), &mut res, &w, 1e-6, &mut out).unwrap());
    });
    grp.finish();
    let wv = rnd(64, 5);
    let mut grp = c.benchmark_group("norm.rms_gated");
    grp.throughput(bytes(3 * x.len()));
    grp.bench_function("rows512_V64", |bn| {
        bn.iter(|| norm::rms_norm_gated(black_box(&x), &z, &wv, 1e-6, &mut out).unwrap());
    });
    grp.finish();
}

fn bench_attn(c: &mut Criterion) {
    let d = AttnDims { n_q_heads: 4, n_kv_heads: 2, head_dim: 64 };
    let t = 64;
    let qrow = d.n_q_heads * d.head_dim;
    let krow = d.n_kv_heads * d.head_dim;
    let mut qx = rnd(t * qrow, 1);
    let pos: Vec<i64> = (0..t as i64).collect();
    let rp = RopeParams { head_dim: 64, rotary_dim: 16, theta: 1e7 };
    let mut grp = c.benchmark_group("attn.rope");
    grp.throughput(bytes(2 * qx.len()));
    grp.bench_function("T64_H4_hd64_rot16", |bn| {
        bn.iter(|| attn::rope_neox(black_box(&mut qx), d.n_q_heads, &pos, rp).unwrap());
    });
    grp.finish();
    let wq = rnd(64, 2);
    let mut qn = vec![0f32; qx.len()];
    let mut grp = c.benchmark_group("attn.qk_norm");
    grp.throughput(bytes(2 * qx.len()));
    grp.bench_function("T64_H4_hd64", |bn| {
        bn.iter(|| attn::qk_norm(black_box(&qx), &wq, 1e-6, &mut qn).unwrap());
    });
    grp.finish();
    let qp = rnd(t * 2 * qrow, 3);
    let (mut q, mut gate) = (vec![0f32; t * qrow], vec![0f32; t * qrow]);
    let mut grp = c.benchmark_group("attn.split_q_gate");
    grp.throughput(bytes(2 * qp.len()));
    grp.bench_function("T64_H4_hd64", |bn| {
        bn.iter(|| {
            attn::split_q_gate(black_box(&qp), d.n_q_heads, d.head_dim, &mut q, &mut gate).unwrap();
        });
    });
    grp.finish();
    let mut og = vec![0f32; q.len()];
    let mut grp = c.benchmark_group("attn.output_gate");
    grp.throughput(bytes(3 * q.len()));
    grp.bench_function("T64_H4_hd64", |bn| {
        bn.iter(|| attn::output_gate(black_box(&q), &gate, &mut og).unwrap());
    });
    grp.finish();
    // Paged cache: 2 sequences, 64 context + 32 new tokens each, page size 16.
    let (ps, ctx, new) = (16usize, 64usize, 32usize);
    let max_pages = (ctx + new).div_ceil(ps);
    let num_pages = 2 * max_pages;
    let table: Vec<i32> = (0..num_pages as i32).rev().collect();
    let pages = PageTable { table: &table, max_pages };
    let kvd = KvDims { page_size: ps, n_kv_heads: d.n_kv_heads, head_dim: d.head_dim };
    let mut kc = rnd(num_pages * ps * krow, 4);
    let mut vc = rnd(num_pages * ps * krow, 5);
    let kn = rnd(2 * new * krow, 6);
    let vn = rnd(2 * new * krow, 7);
    let cu = [0, new as i32, 2 * new as i32];
    let ctxs = [ctx as i32, ctx as i32];
    let mut grp = c.benchmark_group("attn.write_kv");
    grp.throughput(bytes(4 * kn.len()));
    grp.bench_function("N2_new32_ps16", |bn| {
        bn.iter(|| {
            attn::write_kv(black_box(&kn), &vn, &cu, &ctxs, pages, kvd, &mut kc, &mut vc).unwrap();
        });
    });
    grp.finish();
    let qq = rnd(2 * new * qrow, 8);
    let mut out = vec![0f32; qq.len()];
    let mut grp = c.benchmark_group("attn.prefill");
    grp.throughput(bytes(2 * qq.len() + 2 * 2 * (ctx + new) * krow));
    grp.bench_function("N2_ctx64_new32_H4_Hkv2_hd64", |bn| {
        bn.iter(|| {
            attn::prefill_paged(black_box(&qq), &kc, &vc, &cu, &ctxs, pages, ps, d, None, &mut out)
                .unwrap();
        });
    });
    grp.finish();
    let kall = rnd(2 * (ctx + new) * krow, 9);
    let vall = rnd(2 * (ctx + new) * krow, 10);
    let cuk = [0, (ctx + new) as i32, 2 * (ctx + new) as i32];
    let mut grp = c.benchmark_group("attn.prefill_contiguous");
    grp.throughput(bytes(2 * qq.len() + 2 * kall.len()));
    grp.bench_function("N2_ctx64_new32_H4_Hkv2_hd64", |bn| {
        bn.iter(|| {
            attn::prefill_contiguous(black_box(&qq), &kall, &vall, &cu, &cuk, d, None, &mut out)
                .unwrap();
        });
    });
    grp.finish();
    let qd = rnd(2 * qrow, 11);
    let mut od = vec![0f32; qd.len()];
    let sl = [(ctx + new) as i32, (ctx + new) as i32];
    let mut grp = c.benchmark_group("attn.decode");
    grp.throughput(bytes(2 * 2 * (ctx + new) * krow));
    grp.bench_function("N2_len96_H4_Hkv2_hd64", |bn| {
        bn.iter(|| {
            attn::decode_paged(black_box(&qd), &kc, &vc, &sl, pages, ps, d, None, &mut od).unwrap();
        });
    });
    grp.finish();
}

fn bench_mlp_sample(c: &mut Criterion) {
    let (t, hidden, inter, vocab) = (16usize, 256usize, 512usize, 4096usize);
    let x = rnd(t * 2 * inter, 1);
    let mut h = vec![0f32; t * inter];
    let mut grp = c.benchmark_group("mlp.silu_and_mul");
    grp.throughput(bytes(3 * t * inter));
    grp.bench_function("T16_I512", |bn| {
        bn.iter(|| mlp::silu_and_mul(black_box(&x), inter, &mut h).unwrap());
    });
    grp.finish();
    let a = rnd(t * hidden, 2);
    let w = rnd(inter * hidden, 3);
    let mut y = vec![0f32; t * inter];
    let mut grp = c.benchmark_group("mlp.matmul");
    grp.throughput(Throughput::Elements((2 * t * hidden * inter) as u64));
    grp.bench_function("M16_K256_N512", |bn| {
        bn.iter(|| mlp::matmul(black_box(&a), &w, hidden, inter, &mut y).unwrap());
    });
    grp.finish();
    let table = rnd(vocab * hidden, 4);
    let ids: Vec<i32> = (0..t as i32).map(|i| i * 97 % vocab as i32).collect();
    let mut e = vec![0f32; t * hidden];
    let mut grp = c.benchmark_group("mlp.embedding");
    grp.throughput(bytes(2 * t * hidden));
    grp.bench_function("T16_D256_V4096", |bn| {
        bn.iter(|| mlp::embedding(black_box(&ids), &table, hidden, &mut e).unwrap());
    });
    grp.finish();
    let logits = rnd(4 * vocab, 5);
    let mut am = vec![0u32; 4];
    let mut grp = c.benchmark_group("sample.argmax");
    grp.throughput(bytes(logits.len()));
    grp.bench_function("N4_V4096", |bn| {
        bn.iter(|| sample::argmax(black_box(&logits), vocab, &mut am).unwrap());
    });
    grp.finish();
    let mut grp = c.benchmark_group("sample.topk_logprobs");
    grp.throughput(bytes(logits.len()));
    grp.bench_function("N4_V4096_k20", |bn| {
        bn.iter(|| sample::topk_logprobs(black_box(&logits), vocab, 20).unwrap());
    });
    grp.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(20)
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench_gdr, bench_conv, bench_norm, bench_attn, bench_mlp_sample
}
criterion_main!(benches);
