//! GPU test: `gdr.chunk_prefill` (Triton AOT) vs the token recurrence
//! `deltakit_ref::gdr::recurrent_prefill` (+ `deltakit_ref::gdr::gating` for the fused path).
//!
//! Every case: fresh random inputs, output and workspace poisoned (NaN / 0xFF) before the run,
//! `rel_err` of the bf16 output <= 1e-2 and of the final f32 state <= 1e-3, canary slots around
//! the live ones bit-identical, padding sequences (slot -1) exact zeros. Each case prints its
//! errors (`grep '^case'` for the maxima). Head dims: the tuned K, V in {64, 128} and the small
//! dims of the tiny test models (K in {16, 32}, V in {16, 32}; every combination with K in
//! {16, 32, 64, 128}, V in {16, 32, 64, 128}). Gates at the edge of f32 (`g = -inf` from
//! `exp(A_log)` overflowing, softplus underflowing to 0), heads per rank 1..64, a ragged batch
//! repeated 100 times under a timeout (5 under `DELTAKIT_SANITIZE=1`), the default split
//! variant's pair and context-parallel routes (cases sized for its models), and a sequence whose
//! `[T, H_v, V]` tensors pass 2^31 elements (int64 offsets); strided q / k / v views (of one packed
//! buffer; of NaN-padded buffers at 16-byte offsets on every state-kernel route).
mod common;

use std::sync::{Arc, OnceLock};

use deltakit::cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use deltakit::ops::gdr::chunk_prefill::{
    chunk_prefill, workspace_bytes, ChunkPrefillInputs, ChunkPrefillStrides, Gating, HostCopies,
    InitialState,
};
use deltakit::ops::gdr::{GdrDims, GdrOptions};
use deltakit::testing::{gpu_or_skip, rel_err};

use half::bf16;
use rand::rngs::StdRng;
use rand::Rng;

const OUT_TOL: f64 = 1e-2;

/// One CUDA context for the whole test binary. Dropping the last `Arc<CudaContext>` releases the
/// primary context; a later test then gets a new context that can reuse the old handle value, and
/// the Triton launcher's per-context module cache (keyed by that handle) would hand out a stale
/// CUfunction (CUDA_ERROR_INVALID_HANDLE, seen with `--test-threads 1` under compute-sanitizer).
fn gpu(test: &str) -> Option<Arc<CudaContext>> {
    static CTX: OnceLock<Option<Arc<CudaContext>>> = OnceLock::new();
    let ctx = CTX.get_or_init(|| gpu_or_skip("gdr_chunk_prefill")).clone();
    if ctx.is_none() {
        eprintln!("SKIP {test}");
    }
    ctx
}
const STATE_TOL: f64 = 1e-3;

#[derive(Clone, Debug)]
enum Init {
    Zeros,
    FromSlots,
    PerSeq(Vec<bool>),
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum GMode {
    Random,
    Zero,
    Extreme,
    /// 25% of the gates `-inf` (full decay), mixed with ordinary ones, plus one whole chunk of
    /// `-inf` (tokens 64..128) when a case is longer.
    NegInf,
}

#[derive(Clone, Debug)]
struct Case {
    name: String,
    dims: GdrDims,
    lens: Vec<usize>,
    slots: Vec<i32>,
    num_slots: usize,
    init: Init,
    fused: bool,
    opts: GdrOptions,
    gmode: GMode,
    qk_scale: f32,
    /// Fused gating at the edge of f32 (see [`edge_gating`]).
    edge: bool,
}

impl Case {
    fn new(name: &str, dims: (usize, usize, usize, usize), lens: &[usize]) -> Self {
        let n = lens.len();
        Self {
            name: name.to_string(),
            dims: GdrDims { h_k: dims.0, h_v: dims.1, k: dims.2, v: dims.3 },
            lens: lens.to_vec(),
            // Live slots 1, 3, 5, ..: slots 0, 2, 4, .. are canaries.
            slots: (0..n).map(|i| 2 * i as i32 + 1).collect(),
            num_slots: 2 * n + 1,
            init: Init::FromSlots,
            fused: true,
            opts: GdrOptions::default(),
            gmode: GMode::Random,
            qk_scale: 1.0,
            edge: false,
        }
    }
    fn t(&self) -> usize {
        self.lens.iter().sum()
    }
    fn cu(&self) -> Vec<i32> {
        let mut cu = vec![0i32];
        for l in &self.lens {
            cu.push(cu.last().unwrap() + *l as i32);
        }
        cu
    }
}

/// Host inputs of one case.
#[derive(Clone)]
struct Data {
    q: Vec<bf16>,
    k: Vec<bf16>,
    v: Vec<bf16>,
    a: Vec<bf16>,
    b: Vec<bf16>,
    a_log: Vec<f32>,
    dt_bias: Vec<f32>,
    /// What the kernel gets on the precomputed path, and what the reference always uses.
    g: Vec<f32>,
    beta: Vec<f32>,
    state0: Vec<f32>,
}

fn bf(rng: &mut StdRng, n: usize, scale: f32) -> Vec<bf16> {
    common::randn_f32(rng, n).into_iter().map(|x| bf16::from_f32(x * scale)).collect()
}

fn make_data(c: &Case, rng: &mut StdRng) -> Data {
    let d = c.dims;
    let t = c.t();
    let q = bf(rng, t * d.h_k * d.k, c.qk_scale);
    let k = bf(rng, t * d.h_k * d.k, c.qk_scale);
    let v = bf(rng, t * d.h_v * d.v, 1.0);
    let mut a = bf(rng, t * d.h_v, 3.0);
    let b = bf(rng, t * d.h_v, 3.0);
    let mut a_log = common::randn_f32(rng, d.h_v);
    let mut dt_bias = common::randn_f32(rng, d.h_v);
    if c.edge {
        edge_gating(rng, d.h_v, &mut a, &mut a_log, &mut dt_bias);
    }
    let (g, beta) = if c.fused || c.edge {
        let af: Vec<f32> = a.iter().map(|x| x.to_f32()).collect();
        let bfl: Vec<f32> = b.iter().map(|x| x.to_f32()).collect();
        let (mut g, mut beta) = (vec![0f32; t * d.h_v], vec![0f32; t * d.h_v]);
        deltakit_ref::gdr::gating(&af, &bfl, &a_log, &dt_bias, &mut g, &mut beta).unwrap();
        (g, beta)
    } else {
        let g = (0..t * d.h_v)
            .map(|_| match c.gmode {
                GMode::Random => -rng.gen_range(0.0f32..0.5),
                GMode::Zero => 0.0,
                GMode::Extreme => {
                    if rng.gen_bool(0.3) {
                        -100.0
                    } else {
                        -rng.gen_range(0.0f32..0.5)
                    }
                }
                GMode::NegInf => {
                    if rng.gen_bool(0.25) {
                        f32::NEG_INFINITY
                    } else {
                        -rng.gen_range(0.0f32..0.5)
                    }
                }
            })
            .collect::<Vec<f32>>();
        let mut g = g;
        if c.gmode == GMode::NegInf && t > 128 {
            g[64 * d.h_v..128 * d.h_v].fill(f32::NEG_INFINITY);
        }
        let beta = (0..t * d.h_v).map(|_| rng.gen_range(0.0f32..1.0)).collect();
        (g, beta)
    };
    let state0 = common::randn_f32(rng, c.num_slots * d.state_per_slot());
    Data { q, k, v, a, b, a_log, dt_bias, g, beta, state0 }
}

/// Gating at the edge of f32, per token of a `[T, H_v]` `a`: value head 0 gets `A_log = 87.5`
/// (`exp(A_log)` ~ 1e38) and `dt_bias = 0`, and its `a` is, per token, in [4, 10] (softplus > 3.4:
/// `g` overflows to `-inf`, a full decay), in [-87, -86] (softplus ~ e^a, still a normal f32:
/// ordinary gates g ~ -1.6 .. -4.5) or as drawn (g ~ -1e38): all three mixed in every chunk. The
/// other heads get `a = -300` on 30% of the tokens (softplus underflows to 0: `g = -0`, no decay).
/// A head never combines both (that would be `-inf * 0 = NaN`, as in HF). With `fused = false`
/// the kernel gets the host gating of these values (so `g = -inf` on the precomputed path too).
fn edge_gating(rng: &mut StdRng, h_v: usize, a: &mut [bf16], a_log: &mut [f32], dt: &mut [f32]) {
    a_log[0] = 87.5;
    dt[0] = 0.0;
    for (i, x) in a.iter_mut().enumerate() {
        let u: f32 = rng.gen_range(0.0..1.0);
        if i % h_v == 0 {
            if u < 0.3 {
                *x = bf16::from_f32(rng.gen_range(4.0f32..10.0));
            } else if u < 0.7 {
                *x = bf16::from_f32(rng.gen_range(-87.0f32..-86.0));
            }
        } else if u < 0.3 {
            *x = bf16::from_f32(-300.0);
        }
    }
}

fn reference(c: &Case, x: &Data) -> (Vec<f32>, Vec<f32>) {
    let d = c.dims;
    let rd = deltakit_ref::gdr::GdrDims { h_k: d.h_k, h_v: d.h_v, k: d.k, v: d.v };
    let ro =
        deltakit_ref::gdr::GdrOptions { use_qk_l2norm: c.opts.use_qk_l2norm, scale: c.opts.scale };
    let cu = c.cu();
    let flags: Vec<bool> = match &c.init {
        Init::Zeros => vec![false; c.lens.len()],
        Init::FromSlots => vec![true; c.lens.len()],
        Init::PerSeq(f) => f.clone(),
    };
    let varlen =
        deltakit_ref::Varlen { cu_seqlens: &cu, slots: &c.slots, has_initial_state: Some(&flags) };
    let inp = deltakit_ref::gdr::GdrInputs { q: &x.q, k: &x.k, v: &x.v, g: &x.g, beta: &x.beta };
    let mut state = x.state0.clone();
    let mut out = vec![bf16::ZERO; c.t() * d.h_v * d.v];
    deltakit_ref::gdr::recurrent_prefill(&inp, rd, varlen, ro, &mut state, &mut out).unwrap();
    (out.iter().map(|v| v.to_f32()).collect(), state)
}

struct Gpu {
    stream: Arc<CudaStream>,
}

impl Gpu {
    fn new(ctx: &Arc<CudaContext>) -> Self {
        Self { stream: ctx.new_stream().unwrap() }
    }
    fn up<T: deltakit::cudarc::driver::DeviceRepr>(&self, x: &[T]) -> CudaSlice<T> {
        self.stream.clone_htod(x).unwrap()
    }

    /// Runs the kernel on `state` (device) and returns (out, state after).
    fn run(&self, c: &Case, x: &Data, state: &mut CudaSlice<f32>) -> Vec<f32> {
        let d = c.dims;
        let t = c.t();
        let (q, k, v) = (self.up(&x.q), self.up(&x.k), self.up(&x.v));
        let (a, b, al, dt) = (self.up(&x.a), self.up(&x.b), self.up(&x.a_log), self.up(&x.dt_bias));
        let (g, beta) = (self.up(&x.g), self.up(&x.beta));
        let cu = self.up(&c.cu());
        let slots = self.up(&c.slots);
        let flags: Vec<i32> = match &c.init {
            Init::PerSeq(f) => f.iter().map(|&b| i32::from(b)).collect(),
            _ => vec![0; c.lens.len()],
        };
        let flags_d = self.up(&flags);
        let mut out = self.up(&vec![bf16::NAN; t * d.h_v * d.v]);
        let mut ws = self.up(&vec![0xFFu8; workspace_bytes(d, t, c.lens.len())]);
        let gating = if c.fused {
            Gating::Fused {
                a: a.as_view(),
                b: b.as_view(),
                a_log: al.as_view(),
                dt_bias: dt.as_view(),
            }
        } else {
            Gating::Precomputed { g: g.as_view(), beta: beta.as_view() }
        };
        let initial_state = match &c.init {
            Init::Zeros => InitialState::Zeros,
            Init::FromSlots => InitialState::FromSlots,
            Init::PerSeq(_) => InitialState::PerSequence(flags_d.as_view()),
        };
        let inputs = ChunkPrefillInputs {
            q: q.as_view(),
            k: k.as_view(),
            v: v.as_view(),
            gating,
            cu_seqlens: cu.as_view(),
            slots: slots.as_view(),
            initial_state,
        };
        let cu_h = c.cu();
        let host = HostCopies { cu_seqlens: Some(&cu_h), slots: Some(&c.slots) };
        chunk_prefill(
            &self.stream,
            d,
            c.opts,
            ChunkPrefillStrides::default(),
            &inputs,
            host,
            state,
            &mut out,
            &mut ws,
        )
        .unwrap();
        self.stream.clone_dtoh(&out).unwrap().iter().map(|v| v.to_f32()).collect()
    }
}

/// Compares GPU vs reference, canaries and padding rows. Returns (out err, state err).
fn check(
    c: &Case,
    x: &Data,
    got_o: &[f32],
    got_s: &[f32],
    ref_o: &[f32],
    ref_s: &[f32],
    seed: u64,
) -> (f64, f64) {
    let d = c.dims;
    let per = d.state_per_slot();
    let eo = rel_err(got_o, ref_o);
    let live: Vec<usize> = c.slots.iter().filter(|&&s| s >= 0).map(|&s| s as usize).collect();
    let mut gs = Vec::new();
    let mut rs = Vec::new();
    for slot in 0..c.num_slots {
        let (g, r) = (&got_s[slot * per..(slot + 1) * per], &ref_s[slot * per..(slot + 1) * per]);
        if live.contains(&slot) {
            gs.extend_from_slice(g);
            rs.extend_from_slice(r);
        } else {
            let s0 = &x.state0[slot * per..(slot + 1) * per];
            assert!(
                g.iter().zip(s0).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{}: canary slot {slot} changed (seed {seed})",
                c.name
            );
        }
    }
    let es = if gs.is_empty() { 0.0 } else { rel_err(&gs, &rs) };
    let cu = c.cu();
    for (i, &s) in c.slots.iter().enumerate() {
        if s < 0 {
            let rows = &got_o[cu[i] as usize * d.h_v * d.v..cu[i + 1] as usize * d.h_v * d.v];
            assert!(
                rows.iter().all(|&v| v == 0.0),
                "{}: padding seq {i} not zero (seed {seed})",
                c.name
            );
        }
    }
    println!("case {:40} T={:5} out_err {eo:.3e} state_err {es:.3e}", c.name, c.t());
    assert!(eo <= OUT_TOL, "{}: out rel err {eo} > {OUT_TOL} (seed {seed})", c.name);
    assert!(es <= STATE_TOL, "{}: state rel err {es} > {STATE_TOL} (seed {seed})", c.name);
    (eo, es)
}

/// A case's inputs, seed and reference (out, state).
type Prepared = (Data, u64, (Vec<f32>, Vec<f32>));

/// Runs cases: CPU references in parallel threads, then the GPU runs.
fn run_cases(ctx: &Arc<CudaContext>, base: u64, cases: &[Case]) {
    let prepared: Vec<Prepared> = std::thread::scope(|s| {
        let hs: Vec<_> = cases
            .iter()
            .enumerate()
            .map(|(i, c)| {
                s.spawn(move || {
                    let (mut rng, seed) = common::rng(base + i as u64);
                    let x = make_data(c, &mut rng);
                    let r = reference(c, &x);
                    (x, seed, r)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let gpu = Gpu::new(ctx);
    for (c, (x, seed, (ro, rs))) in cases.iter().zip(&prepared) {
        let mut st = gpu.up(&x.state0);
        let o = gpu.run(c, x, &mut st);
        let s = gpu.stream.clone_dtoh(&st).unwrap();
        check(c, x, &o, &s, ro, rs, *seed);
    }
}

#[test]
fn qwen_shapes_vs_recurrence() {
    let Some(ctx) = gpu("qwen_shapes_vs_recurrence") else { return };
    let mut cases = Vec::new();
    for (hk, hv) in [(16, 32), (16, 48), (8, 24), (4, 12)] {
        for t in [1usize, 63, 64, 65, 1000, 4097] {
            cases.push(Case::new(&format!("qwen {hk}/{hv} K=V=128"), (hk, hv, 128, 128), &[t]));
        }
    }
    run_cases(&ctx, 1000, &cases);
}

#[test]
fn varlen_initial_states_padding_and_flags() {
    let Some(ctx) = gpu("varlen_initial_states_padding_and_flags") else { return };
    let lens = [1usize, 64, 0, 65, 63, 130, 7, 200];
    let mut c = Case::new("varlen pad + per-seq init", (2, 6, 128, 128), &lens);
    c.slots = vec![3, 0, 5, -1, 8, -1, 1, 10];
    c.num_slots = 12;
    c.init = Init::PerSeq(vec![true, false, true, true, false, true, true, true]);
    let mut z = Case::new("varlen no initial state", (2, 4, 128, 128), &[100, 64, 1]);
    z.init = Init::Zeros;
    let mut p = Case::new("varlen precomputed gating", (4, 8, 128, 128), &[65, 129, 3]);
    p.fused = false;
    run_cases(&ctx, 2000, &[c, z, p]);
}

/// Long varlen sequences next to empty, single-token and padding ones, with per-sequence initial
/// state flags: large enough (T > ~256 N tokens) that the context-parallel split variants
/// (`DELTAKIT_GDR_SPLIT_VARIANT=6353`, forced) find their scratch in the workspace's W / U
/// regions and really run the three passes (the other varlen cases are too small for that and
/// run 209 under 6353). Under the default it is one more varlen case.
#[test]
fn varlen_long_sequences_context_parallel() {
    let Some(ctx) = gpu("varlen_long_sequences_context_parallel") else { return };
    let lens = [700usize, 0, 1, 1300, 33, 520];
    let mut c = Case::new("varlen long + empty + padding", (2, 4, 128, 128), &lens);
    c.slots = vec![3, 0, 5, 1, -1, 8];
    c.num_slots = 10;
    c.init = Init::PerSeq(vec![true, true, false, true, true, false]);
    run_cases(&ctx, 2100, &[c]);
}

/// Cases sized so that the default split variant's own models (csrc/gdr/chunk_prefill_fused_sm90.cu,
/// `launch_cp`, on a 132-SM H200) route them through the pair state CTA (elsewhere only the
/// ragged x100 batch takes it) and through context parallelism (no other case under the
/// default): (1) 3 sequences x 32 value heads = 192 state CTAs of 64 columns (132 < 192 <= 264:
/// two single waves vs one pair wave -> the pair), with a padding sequence and per-sequence
/// initial states; (2) 2 sequences x 4
/// value heads of 84 chunks on average (16 CTAs, 28 chunks per segment -> the three CP passes).
/// Each has chunks enough to refill every stage of the state kernel's ring many times (the
/// racecheck subject). `DELTAKIT_GDR_ROUTE_LOG=1` prints the state kernels each call launched.
#[test]
fn default_routes_pair_and_context_parallel() {
    let Some(ctx) = gpu("default_routes_pair_and_context_parallel") else { return };
    let mut pair = Case::new("pair route (3 x 32 heads)", (16, 32, 128, 128), &[300, 40, 257]);
    pair.slots = vec![3, -1, 1];
    pair.num_slots = 5;
    pair.init = Init::PerSeq(vec![true, true, false]);
    let mut cp = Case::new("context-parallel route (2 x 4 heads)", (2, 4, 128, 128), &[6000, 4700]);
    cp.init = Init::PerSeq(vec![true, false]);
    run_cases(&ctx, 2200, &[pair, cp]);
}

#[test]
fn varlen_equals_each_sequence_alone() {
    let Some(ctx) = gpu("varlen_equals_each_sequence_alone") else { return };
    let gpu = Gpu::new(&ctx);
    let lens = [70usize, 1, 128, 5];
    let c = Case::new("batch", (2, 4, 128, 128), &lens);
    let (mut rng, seed) = common::rng(3000);
    let x = make_data(&c, &mut rng);
    let mut st = gpu.up(&x.state0);
    let batch_o = gpu.run(&c, &x, &mut st);
    let batch_s = gpu.stream.clone_dtoh(&st).unwrap();
    let d = c.dims;
    let cu = c.cu();
    let (qk, vr, hr) = (d.h_k * d.k, d.h_v * d.v, d.h_v);
    let mut st1 = gpu.up(&x.state0);
    for (i, &l) in lens.iter().enumerate() {
        let (s0, s1) = (cu[i] as usize, cu[i + 1] as usize);
        let mut one = c.clone();
        one.lens = vec![l];
        one.slots = vec![c.slots[i]];
        let xi = Data {
            q: x.q[s0 * qk..s1 * qk].to_vec(),
            k: x.k[s0 * qk..s1 * qk].to_vec(),
            v: x.v[s0 * vr..s1 * vr].to_vec(),
            a: x.a[s0 * hr..s1 * hr].to_vec(),
            b: x.b[s0 * hr..s1 * hr].to_vec(),
            g: x.g[s0 * hr..s1 * hr].to_vec(),
            beta: x.beta[s0 * hr..s1 * hr].to_vec(),
            ..x.clone()
        };
        let o = gpu.run(&one, &xi, &mut st1);
        let e = rel_err(&o, &batch_o[s0 * vr..s1 * vr]);
        assert!(e <= 1e-6, "seq {i}: alone vs batch out rel err {e} (seed {seed})");
    }
    let alone_s = gpu.stream.clone_dtoh(&st1).unwrap();
    let e = rel_err(&alone_s, &batch_s);
    println!("case varlen == alone: out/state identical (state rel err {e:.3e})");
    assert!(e <= 1e-6, "alone vs batch state rel err {e} (seed {seed})");
}

#[test]
fn head_dims_and_group_ratios() {
    let Some(ctx) = gpu("head_dims_and_group_ratios") else { return };
    let mut cases = Vec::new();
    for (k, v) in [(64, 128), (128, 64), (64, 64), (128, 128)] {
        for grp in [1usize, 2, 3] {
            let mut c =
                Case::new(&format!("K={k} V={v} Hv/Hk={grp}"), (2, 2 * grp, k, v), &[150, 40]);
            c.fused = grp != 2;
            cases.push(c);
        }
    }
    run_cases(&ctx, 4000, &cases);
}

/// (K, V) with K = 32 or V in {16, 32}: the untuned small-dim specializations (tiny test models
/// first).
const SMALL_KV: [(usize, usize); 8] =
    [(32, 32), (32, 16), (64, 16), (128, 32), (32, 64), (32, 128), (64, 32), (128, 16)];

#[test]
fn small_head_dims_and_group_ratios() {
    let Some(ctx) = gpu("small_head_dims_and_group_ratios") else { return };
    let mut cases = Vec::new();
    for (k, v) in SMALL_KV {
        for grp in [1usize, 2, 3] {
            let mut c =
                Case::new(&format!("K={k} V={v} Hv/Hk={grp}"), (2, 2 * grp, k, v), &[150, 40]);
            c.fused = grp != 2;
            cases.push(c);
        }
    }
    run_cases(&ctx, 10_000, &cases);
}

#[test]
fn small_head_dims_varlen_padding_gates() {
    let Some(ctx) = gpu("small_head_dims_varlen_padding_gates") else { return };
    let lens = [1usize, 64, 0, 65, 63, 130, 7, 200];
    let mut cases = Vec::new();
    // tiny-cond (2/6, K=32, V=16) and tiny-causal (2/4, K=V=32) layer shapes.
    for (hk, hv, k, v) in [(2, 6, 32, 16), (2, 4, 32, 32), (1, 3, 64, 16), (2, 2, 128, 32)] {
        let mut c =
            Case::new(&format!("varlen pad+flags {hk}/{hv} K={k} V={v}"), (hk, hv, k, v), &lens);
        c.slots = vec![3, 0, 5, -1, 8, -1, 1, 10];
        c.num_slots = 12;
        c.init = Init::PerSeq(vec![true, false, true, true, false, true, true, true]);
        cases.push(c);
        let mut z = Case::new(
            &format!("no initial state {hk}/{hv} K={k} V={v}"),
            (hk, hv, k, v),
            &[100, 64, 1],
        );
        z.init = Init::Zeros;
        cases.push(z);
        let mut one =
            Case::new(&format!("T=1..65 {hk}/{hv} K={k} V={v}"), (hk, hv, k, v), &[1, 63, 64, 65]);
        one.fused = false;
        cases.push(one);
    }
    for (k, v) in [(32, 16), (32, 32)] {
        let mut zero = Case::new(&format!("g == 0 K={k} V={v}"), (2, 4, k, v), &[130, 64]);
        zero.fused = false;
        zero.gmode = GMode::Zero;
        let mut ext = Case::new(&format!("g extreme (-100) K={k} V={v}"), (2, 4, k, v), &[130, 64]);
        ext.fused = false;
        ext.gmode = GMode::Extreme;
        let mut tiny = Case::new(&format!("tiny q/k (1e-4) K={k} V={v}"), (2, 4, k, v), &[100]);
        tiny.qk_scale = 1e-4;
        let mut nol2 = Case::new(&format!("no l2norm, scale 0.3 K={k} V={v}"), (1, 2, k, v), &[90]);
        nol2.opts = GdrOptions { use_qk_l2norm: false, scale: Some(0.3) };
        nol2.qk_scale = 0.1;
        cases.extend([zero, ext, tiny, nol2]);
    }
    run_cases(&ctx, 11_000, &cases);
}

#[test]
fn gates_and_l2norm_edge_cases() {
    let Some(ctx) = gpu("gates_and_l2norm_edge_cases") else { return };
    let mut zero = Case::new("g == 0", (2, 4, 128, 128), &[130, 64]);
    zero.fused = false;
    zero.gmode = GMode::Zero;
    let mut ext = Case::new("g extreme (-100)", (2, 4, 128, 128), &[130, 64]);
    ext.fused = false;
    ext.gmode = GMode::Extreme;
    let mut tiny = Case::new("tiny q/k (1e-4) l2norm", (2, 4, 128, 128), &[100]);
    tiny.qk_scale = 1e-4;
    let mut nol2 = Case::new("no l2norm, scale 0.3", (1, 2, 64, 64), &[90]);
    nol2.opts = GdrOptions { use_qk_l2norm: false, scale: Some(0.3) };
    nol2.qk_scale = 0.1;
    run_cases(&ctx, 5000, &[zero, ext, tiny, nol2]);
}

#[test]
fn gates_at_the_edge_of_f32() {
    // g = -inf (full decay) alone and mixed with ordinary gates in one chunk, precomputed and
    // fused (exp(A_log) overflowing; softplus underflowing to 0 on the other heads).
    let Some(ctx) = gpu("gates_at_the_edge_of_f32") else { return };
    let mut cases = Vec::new();
    for (hk, hv, k, v) in [(2, 4, 128, 128), (2, 6, 64, 128), (1, 3, 16, 32), (2, 6, 32, 16)] {
        let dims = (hk, hv, k, v);
        let lens = [200usize, 1, 64, 30];
        let mut ni = Case::new(&format!("g -inf mixed (precomputed) {dims:?}"), dims, &lens);
        ni.fused = false;
        ni.gmode = GMode::NegInf;
        let mut ef = Case::new(&format!("g edge (fused) {dims:?}"), dims, &[200, 65]);
        ef.edge = true;
        let mut ep = Case::new(&format!("g edge (precomputed) {dims:?}"), dims, &[200, 65]);
        ep.edge = true;
        ep.fused = false;
        cases.extend([ni, ef, ep]);
    }
    run_cases(&ctx, 12_000, &cases);
}

#[test]
fn k16_every_v_and_group_ratio() {
    let Some(ctx) = gpu("k16_every_v_and_group_ratio") else { return };
    let mut cases = Vec::new();
    for v in [16, 32, 64, 128] {
        for grp in [1usize, 2, 3] {
            let mut c = Case::new(
                &format!("K=16 V={v} Hv/Hk={grp} varlen"),
                (2, 2 * grp, 16, v),
                &[150, 1, 0, 64, 40],
            );
            c.slots = vec![1, 3, -1, 5, 7];
            c.num_slots = 9;
            c.init = Init::PerSeq(vec![true, false, true, true, false]);
            c.fused = grp != 2;
            cases.push(c);
        }
    }
    run_cases(&ctx, 13_000, &cases);
}

#[test]
fn heads_per_rank_sweep() {
    // H_v per rank in {1, 2, 4, 6, 8, 16, 32, 64} (H_k = H_v / 2 where even) at T in
    // {64, 512, 4096}.
    let Some(ctx) = gpu("heads_per_rank_sweep") else { return };
    let mut cases = Vec::new();
    for hv in [1usize, 2, 4, 6, 8, 16, 32, 64] {
        let hk = if hv % 2 == 0 { hv / 2 } else { hv };
        for t in [64usize, 512, 4096] {
            let mut c = Case::new(&format!("H_v={hv} H_k={hk} T={t}"), (hk, hv, 128, 128), &[t]);
            c.fused = hv % 4 != 2;
            cases.push(c);
        }
    }
    run_cases(&ctx, 14_000, &cases);
}

#[test]
fn ragged_varlen_repeated_100_times_is_identical() {
    // A ragged batch with per-sequence initial states and padding, run 100 times from the same
    // inputs on a worker thread under a timeout: no hang, bit-identical output and state each time
    // (5 times under `DELTAKIT_SANITIZE=1`: the sanitizers' subject is the kernels, not the repeats).
    let Some(ctx) = gpu("ragged_varlen_repeated_100_times_is_identical") else { return };
    let reps = if std::env::var("DELTAKIT_SANITIZE").is_ok_and(|v| v == "1") { 5 } else { 100 };
    let mut c = Case::new("ragged x100", (4, 12, 128, 128), &[1, 300, 0, 64, 65, 7, 129, 2]);
    c.slots = vec![3, 0, 5, -1, 8, 10, 1, 12];
    c.num_slots = 14;
    c.init = Init::PerSeq(vec![true, false, true, true, false, true, true, false]);
    let (mut rng, seed) = common::rng(15_000);
    let x = make_data(&c, &mut rng);
    let (ro, rs) = reference(&c, &x);
    let (tx, rx) = std::sync::mpsc::channel();
    let (cw, xw) = (c.clone(), x.clone());
    std::thread::spawn(move || {
        let gpu = Gpu::new(&ctx);
        let mut first: Option<(Vec<f32>, Vec<f32>)> = None;
        for i in 0..reps {
            let mut st = gpu.up(&xw.state0);
            let o = gpu.run(&cw, &xw, &mut st);
            let s = gpu.stream.clone_dtoh(&st).unwrap();
            match &first {
                None => first = Some((o, s)),
                Some((o0, s0)) => {
                    let same = o.iter().zip(o0).all(|(a, b)| a.to_bits() == b.to_bits())
                        && s.iter().zip(s0).all(|(a, b)| a.to_bits() == b.to_bits());
                    if !same {
                        tx.send(Err(format!("run {i} differs from run 0"))).ok();
                        return;
                    }
                }
            }
        }
        tx.send(Ok(first.unwrap())).ok();
    });
    let r = rx
        .recv_timeout(std::time::Duration::from_secs(300))
        .unwrap_or_else(|_| panic!("{reps} runs did not finish in 300 s (hang?) (seed {seed})"));
    let (o, s) = r.unwrap_or_else(|e| panic!("{e} (seed {seed})"));
    check(&c, &x, &o, &s, &ro, &rs, seed);
    println!("case ragged x100: {reps} runs bit-identical");
}

/// Tiles `block` (fresh random values) to `n` elements: the bulk of a huge tensor.
fn tiled(block: &[bf16], n: usize) -> Vec<bf16> {
    block.iter().copied().cycle().take(n).collect()
}

#[test]
#[allow(clippy::too_many_lines)]
fn long_sequence_int64_offsets() {
    // One sequence whose [T, H_v, V] tensors (v, out, U) pass 2^31 elements: T * H_v * V =
    // 266_305 * 64 * 128 ~ 2.18e9. Every gate at token r = T - 300 is -inf (a full decay), so the
    // state and outputs from r on depend only on tokens r.. : the recurrence over those 300 tokens
    // is the oracle (all of them lie past element 2^31 of v / out); the first 100 tokens are
    // checked against the recurrence from the initial state; every output must be finite.
    let Some(ctx) = gpu("long_sequence_int64_offsets") else { return };
    let gpu = Gpu::new(&ctx);
    let (hk, hv, kd, vd) = (16usize, 64usize, 128usize, 128usize);
    let t = 266_305usize;
    assert!(t * hv * vd > 1 << 31);
    let tail = 300usize;
    let r = t - tail;
    let head = 100usize;
    let (mut rng, seed) = common::rng(16_000);
    let qk_block = bf(&mut rng, 1 << 20, 1.0);
    let v_block = bf(&mut rng, (1 << 22) + 7, 1.0);
    let mut q = tiled(&qk_block, t * hk * kd);
    let mut k = tiled(&qk_block[1000..], t * hk * kd);
    let mut v = tiled(&v_block, t * hv * vd);
    // Fresh values in the checked windows.
    for (a, b) in [(0, head), (r, t)] {
        q[a * hk * kd..b * hk * kd].copy_from_slice(&bf(&mut rng, (b - a) * hk * kd, 1.0));
        k[a * hk * kd..b * hk * kd].copy_from_slice(&bf(&mut rng, (b - a) * hk * kd, 1.0));
        v[a * hv * vd..b * hv * vd].copy_from_slice(&bf(&mut rng, (b - a) * hv * vd, 1.0));
    }
    let frac = |i: usize, m: usize| (i * m % 1000) as f32 / 1000.0;
    let mut g: Vec<f32> = (0..t * hv).map(|i| -0.05 - 0.4 * frac(i, 7919)).collect();
    let beta: Vec<f32> = (0..t * hv).map(|i| 0.1 + 0.8 * frac(i, 104_729)).collect();
    g[r * hv..(r + 1) * hv].fill(f32::NEG_INFINITY);
    let state0 = common::randn_f32(&mut rng, hv * kd * vd);
    let d = GdrDims { h_k: hk, h_v: hv, k: kd, v: vd };
    let (qd, kdv, vdv) = (gpu.up(&q), gpu.up(&k), gpu.up(&v));
    let (gd, bd) = (gpu.up(&g), gpu.up(&beta));
    let cu_h = [0i32, i32::try_from(t).unwrap()];
    let (cu, slots) = (gpu.up(&cu_h), gpu.up(&[0i32]));
    let mut st = gpu.up(&state0);
    let mut out = gpu.up(&vec![bf16::NAN; t * hv * vd]);
    let mut ws = gpu.stream.alloc_zeros::<u8>(workspace_bytes(d, t, 1)).unwrap();
    let inputs = ChunkPrefillInputs {
        q: qd.as_view(),
        k: kdv.as_view(),
        v: vdv.as_view(),
        gating: Gating::Precomputed { g: gd.as_view(), beta: bd.as_view() },
        cu_seqlens: cu.as_view(),
        slots: slots.as_view(),
        initial_state: InitialState::FromSlots,
    };
    let host = HostCopies { cu_seqlens: Some(&cu_h), slots: Some(&[0]) };
    chunk_prefill(
        &gpu.stream,
        d,
        GdrOptions::default(),
        ChunkPrefillStrides::default(),
        &inputs,
        host,
        &mut st,
        &mut out,
        &mut ws,
    )
    .unwrap();
    let o = gpu.stream.clone_dtoh(&out).unwrap();
    let s = gpu.stream.clone_dtoh(&st).unwrap();
    let bad = o.iter().position(|x| !x.is_finite());
    assert!(bad.is_none(), "non-finite output at element {bad:?} (seed {seed})");
    let rd = deltakit_ref::gdr::GdrDims { h_k: hk, h_v: hv, k: kd, v: vd };
    let ro = deltakit_ref::gdr::GdrOptions::default();
    let window = |a: usize, b: usize| {
        let inp = deltakit_ref::gdr::GdrInputs {
            q: &q[a * hk * kd..b * hk * kd],
            k: &k[a * hk * kd..b * hk * kd],
            v: &v[a * hv * vd..b * hv * vd],
            g: &g[a * hv..b * hv],
            beta: &beta[a * hv..b * hv],
        };
        let mut rs = state0.clone();
        let mut rout = vec![bf16::ZERO; (b - a) * hv * vd];
        let cu = [0i32, i32::try_from(b - a).unwrap()];
        let vl = deltakit_ref::Varlen::new(&cu, &[0]);
        deltakit_ref::gdr::recurrent_prefill(&inp, rd, vl, ro, &mut rs, &mut rout).unwrap();
        (common::to_f32(&rout), rs)
    };
    let (h_o, _) = window(0, head);
    let e_head = rel_err(&common::to_f32(&o[..head * hv * vd]), &h_o);
    let (t_o, t_s) = window(r, t);
    let e_tail = rel_err(&common::to_f32(&o[r * hv * vd..]), &t_o);
    let e_state = rel_err(&s, &t_s);
    println!(
        "case long T={t} H_v={hv}: head out {e_head:.3e} tail out {e_tail:.3e} state {e_state:.3e}"
    );
    assert!(e_head <= OUT_TOL && e_tail <= OUT_TOL, "out errs {e_head} {e_tail} (seed {seed})");
    assert!(e_state <= STATE_TOL, "state err {e_state} (seed {seed})");
}

#[test]
fn precomputed_equals_fused_gating() {
    let Some(ctx) = gpu("precomputed_equals_fused_gating") else { return };
    let gpu = Gpu::new(&ctx);
    let c = Case::new("fused", (4, 12, 128, 128), &[300, 20]);
    let (mut rng, seed) = common::rng(6000);
    let x = make_data(&c, &mut rng); // g/beta = host gating of the same a/b
    let mut pre = c.clone();
    pre.fused = false;
    let (mut s1, mut s2) = (gpu.up(&x.state0), gpu.up(&x.state0));
    let o1 = gpu.run(&c, &x, &mut s1);
    let o2 = gpu.run(&pre, &x, &mut s2);
    let (s1, s2) = (gpu.stream.clone_dtoh(&s1).unwrap(), gpu.stream.clone_dtoh(&s2).unwrap());
    let (eo, es) = (rel_err(&o1, &o2), rel_err(&s1, &s2));
    println!("case precomputed vs fused: out {eo:.3e} state {es:.3e}");
    assert!(eo <= 1e-2 && es <= 1e-4, "fused vs precomputed: out {eo} state {es} (seed {seed})");
    let (ro, rs) = reference(&c, &x);
    check(&c, &x, &o1, &s1, &ro, &rs, seed);
}

#[test]
fn split_prefill_equals_whole() {
    let Some(ctx) = gpu("split_prefill_equals_whole") else { return };
    let gpu = Gpu::new(&ctx);
    let (t1, t2) = (100usize, 77usize);
    let c = Case::new("whole", (2, 6, 128, 128), &[t1 + t2]);
    let (mut rng, seed) = common::rng(7000);
    let x = make_data(&c, &mut rng);
    let mut sw = gpu.up(&x.state0);
    let ow = gpu.run(&c, &x, &mut sw);
    let d = c.dims;
    let (qk, vr, hr) = (d.h_k * d.k, d.h_v * d.v, d.h_v);
    let part = |s0: usize, s1: usize| Data {
        q: x.q[s0 * qk..s1 * qk].to_vec(),
        k: x.k[s0 * qk..s1 * qk].to_vec(),
        v: x.v[s0 * vr..s1 * vr].to_vec(),
        a: x.a[s0 * hr..s1 * hr].to_vec(),
        b: x.b[s0 * hr..s1 * hr].to_vec(),
        g: x.g[s0 * hr..s1 * hr].to_vec(),
        beta: x.beta[s0 * hr..s1 * hr].to_vec(),
        ..x.clone()
    };
    let mut ss = gpu.up(&x.state0);
    let mut c1 = c.clone();
    c1.lens = vec![t1];
    let o1 = gpu.run(&c1, &part(0, t1), &mut ss);
    let mut c2 = c.clone();
    c2.lens = vec![t2];
    let o2 = gpu.run(&c2, &part(t1, t1 + t2), &mut ss);
    let split_o: Vec<f32> = o1.into_iter().chain(o2).collect();
    let (sw, ss) = (gpu.stream.clone_dtoh(&sw).unwrap(), gpu.stream.clone_dtoh(&ss).unwrap());
    let (eo, es) = (rel_err(&split_o, &ow), rel_err(&ss, &sw));
    println!("case split {t1}+{t2} vs whole: out {eo:.3e} state {es:.3e}");
    assert!(eo <= 1e-2 && es <= 1e-3, "split vs whole: out {eo} state {es} (seed {seed})");
}

#[test]
fn strided_qkv_views_of_a_packed_buffer() {
    let Some(ctx) = gpu("strided_qkv_views_of_a_packed_buffer") else { return };
    let gpu = Gpu::new(&ctx);
    strided_case(&gpu, (2, 4, 128, 128), 8000);
    // tiny-cond's layer (K = 32, V = 16; v starts 2*H_k*K = 128 elements into each row) and
    // tiny-tied's (1/2, K = V = 32).
    strided_case(&gpu, (2, 6, 32, 16), 8001);
    strided_case(&gpu, (1, 2, 32, 32), 8002);
}

fn strided_case(gpu: &Gpu, dims: (usize, usize, usize, usize), case: u64) {
    let mut c = Case::new(&format!("strided q/k/v {dims:?}"), dims, &[150]);
    c.fused = false;
    let (mut rng, seed) = common::rng(case);
    let x = make_data(&c, &mut rng);
    let d = c.dims;
    let t = c.t();
    let (qk, vr) = (d.h_k * d.k, d.h_v * d.v);
    let row = 2 * qk + vr;
    let mut packed = vec![bf16::ZERO; t * row];
    for i in 0..t {
        packed[i * row..i * row + qk].copy_from_slice(&x.q[i * qk..(i + 1) * qk]);
        packed[i * row + qk..i * row + 2 * qk].copy_from_slice(&x.k[i * qk..(i + 1) * qk]);
        packed[i * row + 2 * qk..(i + 1) * row].copy_from_slice(&x.v[i * vr..(i + 1) * vr]);
    }
    let p = gpu.up(&packed);
    let (g, beta) = (gpu.up(&x.g), gpu.up(&x.beta));
    let (cu, slots) = (gpu.up(&c.cu()), gpu.up(&c.slots));
    let mut st = gpu.up(&x.state0);
    let mut out = gpu.up(&vec![bf16::NAN; t * vr]);
    let mut ws = gpu.up(&vec![0u8; workspace_bytes(d, t, 1)]);
    let inputs = ChunkPrefillInputs {
        q: p.slice(0..(t - 1) * row + qk),
        k: p.slice(qk..(t - 1) * row + 2 * qk),
        v: p.slice(2 * qk..t * row),
        gating: Gating::Precomputed { g: g.as_view(), beta: beta.as_view() },
        cu_seqlens: cu.as_view(),
        slots: slots.as_view(),
        initial_state: InitialState::FromSlots,
    };
    let strides = ChunkPrefillStrides { q: Some(row), k: Some(row), v: Some(row), ab: None };
    chunk_prefill(
        &gpu.stream,
        d,
        c.opts,
        strides,
        &inputs,
        HostCopies::default(),
        &mut st,
        &mut out,
        &mut ws,
    )
    .unwrap();
    let o: Vec<f32> = gpu.stream.clone_dtoh(&out).unwrap().iter().map(|v| v.to_f32()).collect();
    let s = gpu.stream.clone_dtoh(&st).unwrap();
    let (ro, rs) = reference(&c, &x);
    check(&c, &x, &o, &s, &ro, &rs, seed);
}

/// (H_k, H_v, K, V), sequence lengths, fused gating.
type StridedCase = ((usize, usize, usize, usize), &'static [usize], bool);

/// The tensor-map K / Q / V loads of the default split variant (1694462161, session 13) on views
/// a map takes only through its base address and token stride: q, k and v each in its own buffer
/// at a 16-byte (not 128-byte) offset, with three different token strides (multiples of 16
/// elements, not of 64), everything outside the views NaN (a box reaching past a view's columns
/// or rows would read it); varlen lengths so that full chunks start at odd token rows, an empty
/// sequence, T = 1; cases sized for the single, pair and context-parallel state kernels (see
/// [`default_routes_pair_and_context_parallel`]; `DELTAKIT_GDR_ROUTE_LOG=1` prints the route)
/// and H_v / H_k = 3. Fused gating on two cases, precomputed on the others.
#[test]
fn strided_unaligned_views_on_every_route() {
    let Some(ctx) = gpu("strided_unaligned_views_on_every_route") else { return };
    let gpu = Gpu::new(&ctx);
    let cases: [StridedCase; 5] = [
        ((2, 4, 128, 128), &[1, 63, 64, 65, 130, 7, 200, 0], true),
        ((16, 32, 128, 128), &[300, 40, 257], false),
        ((2, 4, 128, 128), &[6000, 4700], false),
        ((2, 6, 128, 128), &[129, 3, 190], true),
        ((4, 8, 128, 128), &[1], false),
    ];
    for (i, (dims, lens, fused)) in cases.into_iter().enumerate() {
        let mut c = Case::new(&format!("strided unaligned {dims:?} x{}", lens.len()), dims, lens);
        c.fused = fused;
        let (mut rng, seed) = common::rng(8100 + i as u64);
        let x = make_data(&c, &mut rng);
        let (o, s) = run_strided(&gpu, &c, &x);
        let (ro, rs) = reference(&c, &x);
        check(&c, &x, &o, &s, &ro, &rs, seed);
    }
}

/// `rows` rows of `row` elements of `x` at element offset `off` of a NaN buffer, token stride
/// `stride`.
fn nan_padded(x: &[bf16], rows: usize, row: usize, stride: usize, off: usize) -> Vec<bf16> {
    let mut b = vec![bf16::NAN; off + (rows - 1) * stride + row + 24];
    for i in 0..rows {
        b[off + i * stride..off + i * stride + row].copy_from_slice(&x[i * row..(i + 1) * row]);
    }
    b
}

/// [`Gpu::run`] with q / k / v as strided views at 16-byte offsets of NaN-padded buffers
/// (offsets 8 / 24 / 40 elements, strides row + 16 / + 48 / + 80). Returns (out, state after).
fn run_strided(gpu: &Gpu, c: &Case, x: &Data) -> (Vec<f32>, Vec<f32>) {
    let d = c.dims;
    let t = c.t();
    let (qk, vr) = (d.h_k * d.k, d.h_v * d.v);
    let (oq, ok, ov) = (8usize, 24usize, 40usize);
    let (sq, sk, sv) = (qk + 16, qk + 48, vr + 80);
    let qb = gpu.up(&nan_padded(&x.q, t, qk, sq, oq));
    let kb = gpu.up(&nan_padded(&x.k, t, qk, sk, ok));
    let vb = gpu.up(&nan_padded(&x.v, t, vr, sv, ov));
    let (a, b, al, dt) = (gpu.up(&x.a), gpu.up(&x.b), gpu.up(&x.a_log), gpu.up(&x.dt_bias));
    let (g, beta) = (gpu.up(&x.g), gpu.up(&x.beta));
    let (cu, slots) = (gpu.up(&c.cu()), gpu.up(&c.slots));
    let mut st = gpu.up(&x.state0);
    let mut out = gpu.up(&vec![bf16::NAN; t * vr]);
    let mut ws = gpu.up(&vec![0xFFu8; workspace_bytes(d, t, c.lens.len())]);
    let gating = if c.fused {
        Gating::Fused { a: a.as_view(), b: b.as_view(), a_log: al.as_view(), dt_bias: dt.as_view() }
    } else {
        Gating::Precomputed { g: g.as_view(), beta: beta.as_view() }
    };
    let inputs = ChunkPrefillInputs {
        q: qb.slice(oq..oq + (t - 1) * sq + qk),
        k: kb.slice(ok..ok + (t - 1) * sk + qk),
        v: vb.slice(ov..ov + (t - 1) * sv + vr),
        gating,
        cu_seqlens: cu.as_view(),
        slots: slots.as_view(),
        initial_state: InitialState::FromSlots,
    };
    let strides = ChunkPrefillStrides { q: Some(sq), k: Some(sk), v: Some(sv), ab: None };
    let cu_h = c.cu();
    let host = HostCopies { cu_seqlens: Some(&cu_h), slots: Some(&c.slots) };
    chunk_prefill(&gpu.stream, d, c.opts, strides, &inputs, host, &mut st, &mut out, &mut ws)
        .unwrap();
    let o: Vec<f32> = gpu.stream.clone_dtoh(&out).unwrap().iter().map(|v| v.to_f32()).collect();
    (o, gpu.stream.clone_dtoh(&st).unwrap())
}

#[test]
#[allow(clippy::too_many_lines)]
fn rejects_bad_arguments() {
    let Some(ctx) = gpu("rejects_bad_arguments") else { return };
    let gpu = Gpu::new(&ctx);
    let d = GdrDims { h_k: 2, h_v: 4, k: 128, v: 128 };
    let t = 10;
    let q = gpu.up(&vec![bf16::ONE; t * 2 * 128]);
    let v = gpu.up(&vec![bf16::ONE; t * 4 * 128]);
    let g = gpu.up(&vec![0f32; t * 4]);
    let cu = gpu.up(&[0i32, 10]);
    let slots = gpu.up(&[0i32]);
    let mut st = gpu.up(&vec![0f32; d.state_per_slot()]);
    let mut out = gpu.up(&vec![bf16::NAN; t * 4 * 128]);
    let mut ws = gpu.up(&vec![0u8; workspace_bytes(d, t, 1)]);
    let opts = GdrOptions::default();
    let s = ChunkPrefillStrides::default();
    let h = HostCopies::default();
    let short = gpu.up(&vec![bf16::ONE; t * 2 * 128 - 1]);
    let e = chunk_prefill(
        &gpu.stream,
        d,
        opts,
        s,
        &inputs_of(&short, &q, &v, &g, &cu, &slots),
        h,
        &mut st,
        &mut out,
        &mut ws,
    )
    .unwrap_err();
    assert!(matches!(e, deltakit::Error::Shape { arg: "q", .. }), "{e}");
    for (kd, vd) in [(96, 128), (8, 128), (128, 8), (256, 128)] {
        let bad = GdrDims { h_k: 2, h_v: 4, k: kd, v: vd };
        let e = chunk_prefill(
            &gpu.stream,
            bad,
            opts,
            s,
            &inputs_of(&q, &q, &v, &g, &cu, &slots),
            h,
            &mut st,
            &mut out,
            &mut ws,
        )
        .unwrap_err();
        assert!(matches!(e, deltakit::Error::Unsupported { .. }), "K={kd} V={vd}: {e}");
    }
    let bad = GdrDims { h_k: 3, h_v: 4, k: 128, v: 128 };
    let e = chunk_prefill(
        &gpu.stream,
        bad,
        opts,
        s,
        &inputs_of(&q, &q, &v, &g, &cu, &slots),
        h,
        &mut st,
        &mut out,
        &mut ws,
    )
    .unwrap_err();
    assert!(matches!(e, deltakit::Error::Shape { arg: "dims", .. }), "{e}");
    let mut small = gpu.up(&vec![0u8; workspace_bytes(d, t, 1) - 1]);
    let e = chunk_prefill(
        &gpu.stream,
        d,
        opts,
        s,
        &inputs_of(&q, &q, &v, &g, &cu, &slots),
        h,
        &mut st,
        &mut out,
        &mut small,
    )
    .unwrap_err();
    assert!(matches!(e, deltakit::Error::Shape { arg: "workspace", .. }), "{e}");
    let hs = HostCopies { cu_seqlens: None, slots: Some(&[1]) };
    let e = chunk_prefill(
        &gpu.stream,
        d,
        opts,
        s,
        &inputs_of(&q, &q, &v, &g, &cu, &slots),
        hs,
        &mut st,
        &mut out,
        &mut ws,
    )
    .unwrap_err();
    assert!(matches!(e, deltakit::Error::Shape { arg: "slots", .. }), "{e}");
    let hc = HostCopies { cu_seqlens: Some(&[0, 9]), slots: None };
    let e = chunk_prefill(
        &gpu.stream,
        d,
        opts,
        s,
        &inputs_of(&q, &q, &v, &g, &cu, &slots),
        hc,
        &mut st,
        &mut out,
        &mut ws,
    )
    .unwrap_err();
    assert!(matches!(e, deltakit::Error::Shape { arg: "cu_seqlens", .. }), "{e}");
    let bs = ChunkPrefillStrides { q: Some(2 * 128 + 8), ..s };
    let wide = gpu.up(&vec![bf16::ONE; t * (2 * 128 + 8)]);
    let e = chunk_prefill(
        &gpu.stream,
        d,
        opts,
        bs,
        &inputs_of(&wide, &q, &v, &g, &cu, &slots),
        h,
        &mut st,
        &mut out,
        &mut ws,
    )
    .unwrap_err();
    assert!(matches!(e, deltakit::Error::Shape { arg: "q", .. }), "{e}");
    assert!(
        gpu.stream.clone_dtoh(&out).unwrap().iter().all(|x| x.is_nan()),
        "written on error path"
    );
}

#[test]
fn bad_device_slots_and_cu_seqlens_stay_in_bounds() {
    // Out-of-range device slots behave as padding; garbage cu_seqlens are clamped (results
    // unspecified, but nothing outside the buffers is touched: run this under memcheck).
    let Some(ctx) = gpu("bad_device_slots_and_cu_seqlens_stay_in_bounds") else { return };
    let gpu = Gpu::new(&ctx);
    let mut c = Case::new("oob slot", (2, 4, 64, 64), &[70, 30]);
    c.slots = vec![1, 99];
    c.num_slots = 3;
    let (mut rng, _) = common::rng(9000);
    let x = make_data(&c, &mut rng);
    let mut st = gpu.up(&x.state0);
    let cu_bad = [0i32, 1000, -5];
    let d = c.dims;
    let t = c.t();
    let (q, k, v) = (gpu.up(&x.q), gpu.up(&x.k), gpu.up(&x.v));
    let (g, beta) = (gpu.up(&x.g), gpu.up(&x.beta));
    let (cu, slots) = (gpu.up(&cu_bad), gpu.up(&c.slots));
    let mut out = gpu.up(&vec![bf16::NAN; t * d.h_v * d.v]);
    let mut ws = gpu.up(&vec![0u8; workspace_bytes(d, t, 2)]);
    let inputs = ChunkPrefillInputs {
        q: q.as_view(),
        k: k.as_view(),
        v: v.as_view(),
        gating: Gating::Precomputed { g: g.as_view(), beta: beta.as_view() },
        cu_seqlens: cu.as_view(),
        slots: slots.as_view(),
        initial_state: InitialState::FromSlots,
    };
    chunk_prefill(
        &gpu.stream,
        d,
        c.opts,
        ChunkPrefillStrides::default(),
        &inputs,
        HostCopies::default(),
        &mut st,
        &mut out,
        &mut ws,
    )
    .unwrap();
    gpu.stream.synchronize().unwrap();
    let s = gpu.stream.clone_dtoh(&st).unwrap();
    let per = d.state_per_slot();
    assert_eq!(&s[..per], &x.state0[..per], "canary slot 0 changed");
    assert_eq!(&s[2 * per..], &x.state0[2 * per..], "canary slot 2 changed");
}

fn inputs_of<'a>(
    q: &'a CudaSlice<bf16>,
    k: &'a CudaSlice<bf16>,
    v: &'a CudaSlice<bf16>,
    g: &'a CudaSlice<f32>,
    cu: &'a CudaSlice<i32>,
    slots: &'a CudaSlice<i32>,
) -> ChunkPrefillInputs<'a> {
    ChunkPrefillInputs {
        q: q.as_view(),
        k: k.as_view(),
        v: v.as_view(),
        gating: Gating::Precomputed { g: g.as_view(), beta: g.as_view() },
        cu_seqlens: cu.as_view(),
        slots: slots.as_view(),
        initial_state: InitialState::FromSlots,
    }
}

/// Segment bounds of the context-parallel variant (4096), as `cp_plan_kernel` in
/// `csrc/gdr/chunk_prefill_fused_sm90.cu` computes them: chunk ids `c1 <= c2` of a sequence of
/// `nc` chunks split with weights `w0 : 1 : 1`.
fn cp_bounds(nc: usize, w0: usize) -> (usize, usize) {
    (nc * w0 / (w0 + 2), nc * (w0 + 1) / (w0 + 2))
}

/// CPU model of the context-parallel variant (bit 4096, `launch_cp`), no GPU: every live sequence
/// in three chunk-aligned segments; pass 1 = segment 0 from the sequence's initial state (its
/// outputs, end state `S1`), segment 1's transition `M` (start `I`, `v = 0`) and its zero-start
/// end state `D`; the scan `S2 = M S1 + D` (the transition multiplies the `[K, V]` state from the
/// left, the contract's orientation); pass 3 = segments 1 and 2 from `S1` / `S2`. Each pass is
/// `deltakit_ref::gdr::recurrent_prefill` on the segment's tokens; the outputs and final states
/// must equal one `recurrent_prefill` of the whole batch up to f32 rounding. Varlen with empty,
/// one-chunk and partial segments, padding, per-sequence initial states, `g = -inf` mixed in.
#[test]
fn context_parallel_three_passes_model() {
    // Ordinary gates (the transitions carry the state across segments) and 25% g = -inf (a full
    // decay inside a segment zeroes its transition: S2 = D exactly).
    let runs =
        [(1usize, GMode::Random), (2, GMode::Random), (3, GMode::Random), (2, GMode::NegInf)];
    for (i, (w0, gmode)) in runs.into_iter().enumerate() {
        let (mut rng, seed) = common::rng(9100 + i as u64);
        let lens = [1usize, 64, 0, 65, 700, 130, 1000, 200, 63, 129];
        let mut c = Case::new("cp model", (2, 4, 32, 32), &lens);
        c.slots = vec![3, 0, 5, -1, 8, -1, 1, 10, 12, 2];
        c.num_slots = 13;
        c.init = Init::PerSeq(vec![true, false, true, true, false, true, true, true, false, true]);
        c.fused = false;
        c.gmode = gmode;
        let x = make_data(&c, &mut rng);
        let (ref_o, ref_s) = reference(&c, &x);
        let d = c.dims;
        let (hk, hv, kd, vd) = (d.h_k, d.h_v, d.k, d.v);
        let per = d.state_per_slot();
        let rd = deltakit_ref::gdr::GdrDims { h_k: hk, h_v: hv, k: kd, v: vd };
        let ro = deltakit_ref::gdr::GdrOptions {
            use_qk_l2norm: c.opts.use_qk_l2norm,
            scale: c.opts.scale,
        };
        // One segment [t0, t1) from `init`: (output rows, end state).
        let run = |t0: usize, t1: usize, init: &[f32], vzero: bool| -> (Vec<f32>, Vec<f32>) {
            let n = t1 - t0;
            let zeros = vec![bf16::ZERO; n * hv * vd];
            let inp = deltakit_ref::gdr::GdrInputs {
                q: &x.q[t0 * hk * kd..t1 * hk * kd],
                k: &x.k[t0 * hk * kd..t1 * hk * kd],
                v: if vzero { &zeros } else { &x.v[t0 * hv * vd..t1 * hv * vd] },
                g: &x.g[t0 * hv..t1 * hv],
                beta: &x.beta[t0 * hv..t1 * hv],
            };
            let cu = [0i32, n as i32];
            let varlen = deltakit_ref::Varlen {
                cu_seqlens: &cu,
                slots: &[0],
                has_initial_state: Some(&[true]),
            };
            let mut st = init.to_vec();
            let mut out = vec![bf16::ZERO; n * hv * vd];
            deltakit_ref::gdr::recurrent_prefill(&inp, rd, varlen, ro, &mut st, &mut out).unwrap();
            (out.iter().map(|v| v.to_f32()).collect(), st)
        };
        let mut ident = vec![0f32; per];
        for h in 0..hv {
            for r in 0..kd {
                ident[h * kd * vd + r * vd + r] = 1.0;
            }
        }
        let flags = match &c.init {
            Init::PerSeq(f) => f.clone(),
            _ => unreachable!(),
        };
        let cu = c.cu();
        let mut got_o = vec![0f32; ref_o.len()];
        let (mut gs, mut rs) = (Vec::new(), Vec::new());
        for (n, &slot) in c.slots.iter().enumerate() {
            if slot < 0 {
                continue;
            }
            let (bos, eos) = (cu[n] as usize, cu[n + 1] as usize);
            let (c1, c2) = cp_bounds((eos - bos).div_ceil(64), w0);
            let (b1, b2) = ((bos + 64 * c1).min(eos), (bos + 64 * c2).min(eos));
            let s = slot as usize;
            let s0 =
                if flags[n] { x.state0[s * per..(s + 1) * per].to_vec() } else { vec![0f32; per] };
            // Pass 1.
            let (o0, s1) = run(bos, b1, &s0, false);
            let (_, m) = run(b1, b2, &ident, true);
            let (_, dd) = run(b1, b2, &vec![0f32; per], false);
            // Scan: S2 = M S1 + D per value head (M [K, K] held as a [K, V] state, K = V).
            let mut s2 = vec![0f32; per];
            for h in 0..hv {
                let o = h * kd * vd;
                for r in 0..kd {
                    for j in 0..vd {
                        let mut acc = f64::from(dd[o + r * vd + j]);
                        for cc in 0..kd {
                            acc += f64::from(m[o + r * vd + cc]) * f64::from(s1[o + cc * vd + j]);
                        }
                        s2[o + r * vd + j] = acc as f32;
                    }
                }
            }
            // Pass 3.
            let (o1, _) = run(b1, b2, &s1, false);
            let (o2, s3) = run(b2, eos, &s2, false);
            let row = hv * vd;
            got_o[bos * row..b1 * row].copy_from_slice(&o0);
            got_o[b1 * row..b2 * row].copy_from_slice(&o1);
            got_o[b2 * row..eos * row].copy_from_slice(&o2);
            gs.extend_from_slice(&s3);
            rs.extend_from_slice(&ref_s[s * per..(s + 1) * per]);
        }
        let (eo, es) = (rel_err(&got_o, &ref_o), rel_err(&gs, &rs));
        println!(
            "case cp model w0={w0} {gmode:?} out_err {eo:.3e} state_err {es:.3e} (seed {seed})"
        );
        assert!(eo <= 1e-4, "cp model w0={w0}: out rel err {eo} (seed {seed})");
        assert!(es <= 1e-5, "cp model w0={w0}: state rel err {es} (seed {seed})");
    }
}
