//! Sampling helpers: `sample.argmax` (greedy), `sample.topk_logprobs` and `sample.top_p` (seeded
//! temperature / nucleus sampling with integer-exact, order-independent arithmetic; see
//! [`top_p_sample`]).

use crate::{check, Elem, RefError, Result};

fn validate<T: Elem>(op: &'static str, logits: &[T], vocab: usize) -> Result<usize> {
    let n = check::rows(op, "logits", logits.len(), vocab)?;
    if let Some(i) = logits.iter().position(|x| x.to_f32().is_nan()) {
        return Err(RefError::Invalid {
            op,
            what: "logits",
            msg: format!("NaN at row {} column {}", i / vocab, i % vocab),
        });
    }
    Ok(n)
}

/// Greedy sampling: per row the index of the largest logit, ties to the lowest index (as
/// `torch.argmax` on CPU). `+inf`/`-inf` are ordinary values; NaN is an error.
///
/// Shapes: `logits`: `[N, vocab]`; `out`: `u32 [N]`.
///
/// # Errors
/// [`RefError::Shape`] for `vocab == 0` or length mismatches; [`RefError::Invalid`] for a NaN.
pub fn argmax<T: Elem>(logits: &[T], vocab: usize, out: &mut [u32]) -> Result<()> {
    const OP: &str = "sample.argmax";
    let n = validate(OP, logits, vocab)?;
    check::len(OP, "out", out.len(), n)?;
    for (o, row) in out.iter_mut().zip(logits.chunks_exact(vocab)) {
        let mut best = 0usize;
        let mut bv = row[0].to_f32();
        for (j, x) in row.iter().enumerate().skip(1) {
            let x = x.to_f32();
            if x > bv {
                best = j;
                bv = x;
            }
        }
        *o = best as u32;
    }
    Ok(())
}

/// Top-k log-probabilities per row: `log_softmax` in f64 (max-subtracted log-sum-exp), returning
/// the `k` largest as `(token id, logprob as f32)` sorted by logprob descending, ties by lower id
/// (HF generation's `output_logprobs` with `torch.topk` on `log_softmax`, with a deterministic
/// tie order).
///
/// Shapes: `logits`: `[N, vocab]`; returns `N` vectors of length `k`.
///
/// # Errors
/// [`RefError::Shape`] for `vocab == 0` or a bad length; [`RefError::Invalid`] for `k > vocab`,
/// a NaN or `+inf` logit, or a row whose logits are all `-inf` (no distribution: the log-sum-exp
/// would be NaN); `-inf` elsewhere is an ordinary masked token (log-probability `-inf`).
pub fn topk_logprobs<T: Elem>(
    logits: &[T],
    vocab: usize,
    k: usize,
) -> Result<Vec<Vec<(u32, f32)>>> {
    const OP: &str = "sample.topk_logprobs";
    validate(OP, logits, vocab)?;
    if k > vocab {
        return Err(RefError::Invalid { op: OP, what: "k", msg: format!("{k} > vocab {vocab}") });
    }
    if let Some(i) = logits.iter().position(|x| x.to_f32() == f32::INFINITY) {
        return Err(RefError::Invalid {
            op: OP,
            what: "logits",
            msg: format!("+inf at row {} column {}", i / vocab, i % vocab),
        });
    }
    if let Some(r) = logits
        .chunks_exact(vocab)
        .position(|row| row.iter().all(|x| x.to_f32() == f32::NEG_INFINITY))
    {
        return Err(RefError::Invalid {
            op: OP,
            what: "logits",
            msg: format!("row {r} is all -inf (no finite logit)"),
        });
    }
    Ok(logits
        .chunks_exact(vocab)
        .map(|row| {
            let x: Vec<f64> = row.iter().map(|e| f64::from(e.to_f32())).collect();
            let m = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let lse = m + x.iter().map(|&v| (v - m).exp()).sum::<f64>().ln();
            let mut idx: Vec<usize> = (0..vocab).collect();
            idx.sort_by(|&a, &b| x[b].total_cmp(&x[a]).then(a.cmp(&b)));
            idx.truncate(k);
            idx.into_iter().map(|i| (i as u32, (x[i] - lse) as f32)).collect()
        })
        .collect())
}

/// The SplitMix64 output function of state `z` (Steele, Lea & Flood, "Fast splittable
/// pseudorandom number generators", 2014): `z += 0x9E3779B97F4A7C15`, then two xor-shift-multiply
/// rounds and a final xor-shift. A bijection on `u64`.
#[must_use]
pub fn splitmix64(z: u64) -> u64 {
    let mut z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The counter-based random bits of draw `(seed, counter)`:
/// `splitmix64(seed ^ splitmix64(counter))`. For a fixed seed, distinct counters give distinct
/// bits (both steps are bijections). The GPU kernel computes the same function.
#[must_use]
pub fn draw_bits(seed: u64, counter: u64) -> u64 {
    splitmix64(seed ^ splitmix64(counter))
}

/// The uniform number of draw `(seed, counter)`: `(draw_bits(seed, counter) >> 11) * 2^-53`, an
/// f64 in `[0, 1)` on the 2^-53 grid (exact).
#[must_use]
pub fn uniform(seed: u64, counter: u64) -> f64 {
    (draw_bits(seed, counter) >> 11) as f64 * (1.0 / 9_007_199_254_740_992.0)
}

// f32 constants of the fixed-point weight, as bit patterns (the CUDA kernel spells the same values
// as hex-float literals, so both sides use identical constants).
const LOG2E: u32 = 0x3FB8_AA3B; // log2(e)
const LN2_HI: u32 = 0x3F31_8000; // 0.693359375 (ln 2, high part)
const LN2_LO: u32 = 0xB95E_8083; // ln 2 - LN2_HI
const ROUND_MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23: x + MAGIC - MAGIC rounds |x| < 2^22 to an integer (RNE)
/// Taylor coefficients 1/k! for k = 7 down to 2 (c1 = c0 = 1).
const EXP_POLY: [u32; 6] =
    [0x3950_0D01, 0x3AB6_0B61, 0x3C08_8889, 0x3D2A_AAAB, 0x3E2A_AAAB, 0x3F00_0000];

/// Fixed-point weight of one logit, `q = floor(2^32 * exp(e))` with `e = d * inv_t` and
/// `d = (x == m) ? 0 : x - m` (f32, round to nearest; `x == m` makes an infinite maximum weigh 1),
/// where `exp` is this exact f32 recipe (so the CPU and the GPU produce identical bits):
/// - `e < -23` (or NaN) -> `q = 0` (`2^32 exp(-23) < 1`);
/// - `n = fma(e, log2e, 1.5*2^23) - 1.5*2^23` (round to nearest even), `r = fma(-n, ln2_lo,
///   fma(-n, ln2_hi, e))`, `p` = degree-7 Taylor polynomial of `exp(r)` by Horner with fma;
/// - `q = (u64) trunc(p * 2^(n + 32))` (an exact power-of-two scaling, `n` in `-33..=0`).
///
/// `q(m) = 2^32` exactly; `q` is within ~1e-7 relative of `2^32 exp(e)` otherwise.
#[must_use]
#[allow(clippy::float_cmp)] // exact: `x == m` is the definition (and makes `inf - inf` weigh 1)
pub fn weight(x: f32, m: f32, inv_t: f32) -> u64 {
    let d = if x == m { 0.0 } else { x - m };
    let e = d * inv_t;
    if e.is_nan() || e < -23.0 {
        return 0;
    }
    let n = e.mul_add(f32::from_bits(LOG2E), ROUND_MAGIC) - ROUND_MAGIC;
    let r = (-n).mul_add(f32::from_bits(LN2_HI), e);
    let r = (-n).mul_add(f32::from_bits(LN2_LO), r);
    let mut p = f32::from_bits(EXP_POLY[0]);
    for c in &EXP_POLY[1..] {
        p = p.mul_add(r, f32::from_bits(*c));
    }
    p = p.mul_add(r, 1.0);
    p = p.mul_add(r, 1.0);
    let scale = f32::from_bits(((n as i32 + 32 + 127) as u32) << 23);
    (p * scale) as u64
}

/// The inverse temperature the sampler uses, or `None` for greedy decoding: temperature NaN or
/// `<= 0`, or so small that `1 / T` overflows f32, is greedy; otherwise `inv_t = max(1 / T,
/// f32::MIN_POSITIVE)` in f32 (so `T = +inf` is a uniform draw over the finite logits).
#[must_use]
pub fn inverse_temperature(temperature: f32) -> Option<f32> {
    if temperature.is_nan() || temperature <= 0.0 {
        return None;
    }
    let inv = 1.0 / temperature;
    if inv.is_infinite() {
        None
    } else {
        Some(inv.max(f32::MIN_POSITIVE))
    }
}

/// The nucleus mass the sampler uses: `top_p` in `(0, 1]` as given; anything else (NaN, `<= 0`,
/// `> 1`) is 1 (no truncation).
#[must_use]
pub fn effective_top_p(top_p: f32) -> f32 {
    if top_p > 0.0 && top_p <= 1.0 {
        top_p
    } else {
        1.0
    }
}

/// How [`top_p_sample`] chose one row's token (see [`top_p_trace`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopPTrace {
    /// The sampled token.
    pub id: u32,
    /// `true` when the row was decoded greedily (see [`inverse_temperature`]); the mass fields
    /// below are then 0 and `kept` is empty.
    pub greedy: bool,
    /// `W`: the sum of the fixed-point weights ([`weight`]) of the whole row.
    pub total_mass: u64,
    /// `need = clamp(trunc(f64(top_p) * f64(W)), 1, W)`.
    pub need: u64,
    /// Bits (`f32::to_bits`) of the smallest kept logit value (the threshold key).
    pub threshold_bits: u32,
    /// Kept tokens `(id, weight)` in index order: every token whose logit is `>=` the threshold in
    /// the total order (`f32::total_cmp`), ties at the threshold all kept.
    pub kept: Vec<(u32, u64)>,
    /// `M`: the kept mass (sum of `kept` weights).
    pub kept_mass: u64,
    /// `min(trunc(uniform * f64(M)), M - 1)`.
    pub target: u64,
    /// Distance from `target` to the nearer end of the picked token's interval `[lo, hi)` of
    /// inclusive prefix sums, `min(target - lo, hi - 1 - target)`: 0 means a one-unit change of
    /// any weight could change the pick.
    pub margin: u64,
}

/// Seeded temperature / top-p (nucleus) sampling of one row; see [`top_p_sample`] for the exact
/// definition. Returns the decision with its intermediate quantities.
///
/// # Errors
/// [`RefError::Shape`] for an empty row; [`RefError::Invalid`] for a NaN logit.
pub fn top_p_trace<T: Elem>(
    row: &[T],
    temperature: f32,
    top_p: f32,
    seed: u64,
    counter: u64,
) -> Result<TopPTrace> {
    const OP: &str = "sample.top_p";
    validate(OP, row, row.len())?;
    let x: Vec<f32> = row.iter().map(|v| v.to_f32()).collect();
    // First maximum (ties -> lowest index, `-0 == +0`), as `argmax`.
    let mut best = 0usize;
    for (j, &v) in x.iter().enumerate().skip(1) {
        if v > x[best] {
            best = j;
        }
    }
    let m = x[best];
    let mut t = TopPTrace {
        id: best as u32,
        greedy: true,
        total_mass: 0,
        need: 0,
        threshold_bits: m.to_bits(),
        kept: Vec::new(),
        kept_mass: 0,
        target: 0,
        margin: 0,
    };
    let Some(inv_t) = inverse_temperature(temperature) else { return Ok(t) };
    t.greedy = false;
    let q: Vec<u64> = x.iter().map(|&v| weight(v, m, inv_t)).collect();
    t.total_mass = q.iter().sum();
    let p = effective_top_p(top_p);
    t.need = ((f64::from(p) * t.total_mass as f64) as u64).min(t.total_mass).max(1);
    // Walk the distinct values from the top (total order) until the suffix mass reaches `need`.
    let mut idx: Vec<usize> = (0..x.len()).collect();
    idx.sort_by(|&a, &b| x[b].total_cmp(&x[a]).then(a.cmp(&b)));
    let mut acc = 0u64;
    let mut threshold = x[idx[0]];
    for &i in &idx {
        if x[i].total_cmp(&threshold).is_ne() && acc >= t.need {
            break;
        }
        threshold = x[i];
        acc += q[i];
    }
    t.threshold_bits = threshold.to_bits();
    t.kept = (0..x.len())
        .filter(|&j| x[j].total_cmp(&threshold).is_ge())
        .map(|j| (j as u32, q[j]))
        .collect();
    t.kept_mass = acc;
    if t.kept_mass == 0 {
        return Ok(t); // unreachable (the maximum weighs 2^32); argmax, as the kernel
    }
    let u = uniform(seed, counter);
    t.target = ((u * t.kept_mass as f64) as u64).min(t.kept_mass - 1);
    let mut lo = 0u64;
    for &(j, w) in &t.kept {
        if lo + w > t.target {
            t.id = j;
            t.margin = (t.target - lo).min(lo + w - 1 - t.target);
            break;
        }
        lo += w;
    }
    Ok(t)
}

/// Seeded temperature / top-p (nucleus) sampling, defined with integer arithmetic so that the
/// result is exact, independent of summation order, and equal on CPU and GPU (the `sample.top_p`
/// kernel computes the same numbers). Per row `r` with `x = logits[r]`:
/// 1. Greedy (the [`argmax`] token, ties to the lowest id) when [`inverse_temperature`] of
///    `temperature[r]` is `None` (NaN, `<= 0`, or `1/T` overflowing f32).
/// 2. `m = max x`; fixed-point weights `q_j = weight(x_j, m, 1/T)` ([`weight`]: `~2^32 *
///    exp((x_j - m) / T)`, truncated); `W = sum q_j` (u64).
/// 3. `p = effective_top_p(top_p[r])` (outside `(0, 1]` -> 1); `need = clamp(trunc(f64(p) *
///    f64(W)), 1, W)`. The threshold is the largest logit value `v` (total order, i.e. the bf16 key)
///    such that the mass of the tokens with `x_j >= v` is `>= need`; all those tokens are kept
///    (ties at the threshold are all kept), with mass `M`.
/// 4. `u = uniform(seed[r], counter[r])` ([`uniform`]), `target = min(trunc(u * f64(M)), M - 1)`;
///    the sample is the first kept token in index order whose inclusive prefix sum of kept
///    weights exceeds `target`.
///
/// The draw depends only on `(seed, counter)` and the row's logits, never on the row's position
/// or the batch. `+inf` logits share all the mass; an all `-inf` row is uniform.
///
/// Shapes: `logits`: `[N, vocab]`; `temperature`, `top_p`: `f32 [N]`; `seed`, `counter`:
/// `u64 [N]`; `out`: `u32 [N]`.
///
/// # Errors
/// [`RefError::Shape`] for `vocab == 0` or a length mismatch; [`RefError::Invalid`] for a NaN
/// logit (the GPU kernel writes -1 there).
pub fn top_p_sample<T: Elem>(
    logits: &[T],
    vocab: usize,
    temperature: &[f32],
    top_p: &[f32],
    seed: &[u64],
    counter: &[u64],
    out: &mut [u32],
) -> Result<()> {
    const OP: &str = "sample.top_p";
    let n = validate(OP, logits, vocab)?;
    check::len(OP, "temperature", temperature.len(), n)?;
    check::len(OP, "top_p", top_p.len(), n)?;
    check::len(OP, "seed", seed.len(), n)?;
    check::len(OP, "counter", counter.len(), n)?;
    check::len(OP, "out", out.len(), n)?;
    for (r, row) in logits.chunks_exact(vocab).enumerate() {
        out[r] = top_p_trace(row, temperature[r], top_p[r], seed[r], counter[r])?.id;
    }
    Ok(())
}
