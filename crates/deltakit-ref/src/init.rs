//! `init.dummy`: seeded dummy weights from a counter-based hash, bit for bit as the CUDA kernel.
//!
//! Every element is a pure function of `(seed, tensor_id, index)`, where `index` is the
//! element's row-major position in the *full* (unsharded) tensor: no generator state, so any
//! piece of a tensor (a tensor-parallel shard, a block filled by another thread, a single
//! element) can be computed alone and equals the same elements of the whole.
//!
//! # Definition (the CUDA kernel `csrc/init/dummy.cu` computes the same bits)
//! ```text
//! mix(z)      = splitmix64 finalizer: z ^= z >> 30; z *= 0xBF58476D1CE4E5B9;
//!                                     z ^= z >> 27; z *= 0x94D049BB133111EB; z ^ (z >> 31)
//! key         = mix(seed + mix(tensor_id + GAMMA))                 (wrapping u64, GAMMA = 0x9E3779B97F4A7C15)
//! bits(i)     = mix(key + (i + 1) * GAMMA)                          (the splitmix64 stream of `key`)
//! uniform x   = ((bits >> 40) - 2^23) * 2^-23                       exact f32 in [-1, 1), 24 bits
//! normal-ish x = sum_{j<4} (2 * ((bits >> 16 j) & 0xFFFF) - 65535) * (sqrt(3) * 2^-17)
//!                (Irwin-Hall of four 16-bit uniforms: mean 0, std 1, |x| <= 3.47; one f32 rounding)
//! value       = Constant:   offset
//!               Uniform:    fma(scale, x_uniform, offset)           in [offset - |scale|, offset + |scale|]
//!               Normal:     fma(scale, x_normal, offset)            mean offset, std |scale|
//!               LogUniform: ln(fma(scale, x_uniform, offset))       with `ln` below
//! out         = bf16(value), round to nearest even
//! ```
//! `ln` is a fixed sequence of IEEE f32 operations (no library `logf`, whose last bits differ
//! between libm and CUDA): `x = m 2^e` with `m` in `[sqrt(1/2), sqrt(2)]`, `s = (m - 1) / (m +
//! 1)`, `ln m = 2 s (1 + s^2/3 + s^4/5 + s^6/7 + s^8/9)` by Horner with fused multiply-adds,
//! `ln x = fma(e, ln 2, ln m)`: within a few f32 ulps of the true logarithm, far below bf16's
//! rounding. Every f32 operation is a single IEEE operation (Rust never contracts `a * b + c`;
//! the kernel uses `__fmul_rn` / `__fadd_rn` / `__fdiv_rn` / `__fmaf_rn`), so the two sides agree
//! bit for bit.
//!
//! The inits of `deltakit-engine`'s `--load-format dummy` map onto these four distributions
//! (linear layers `Uniform` with std `1/sqrt(fan_in)`, norm weights `Constant`, `A_log`
//! `LogUniform(1, 16)`, ...); see `deltakit_engine::dummy_init`.

use half::bf16;

use crate::{RefError, Result};

const OP: &str = "init.dummy";

/// splitmix64's increment (the golden ratio in 64-bit fixed point).
pub const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// `sqrt(3) * 2^-17` in f32 (bits `0x375DB3D7`): the normal-ish scale.
const NORMAL_SCALE_BITS: u32 = 0x375D_B3D7;
/// `sqrt(2)` in f32.
const SQRT2_BITS: u32 = 0x3FB5_04F3;
/// `ln 2` in f32.
const LN2_BITS: u32 = 0x3F31_7218;
/// `1/3`, `1/5`, `1/7`, `1/9` in f32.
const INV3_BITS: u32 = 0x3EAA_AAAB;
const INV5_BITS: u32 = 0x3E4C_CCCD;
const INV7_BITS: u32 = 0x3E12_4925;
const INV9_BITS: u32 = 0x3DE3_8E39;

/// The distribution of [`DummyInit`]; `x` is the unit variate (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DummyDist {
    /// Every element is `offset` (no hash drawn).
    Constant,
    /// `fma(scale, x, offset)`, `x` uniform in `[-1, 1)` (24-bit grid).
    Uniform,
    /// `fma(scale, x, offset)`, `x` Irwin-Hall(4) normalised to mean 0, std 1.
    Normal,
    /// `ln(fma(scale, x, offset))`, `x` uniform in `[-1, 1)`: a log-uniform draw such as
    /// `A_log = ln(U(1, 16))` (`offset` 8.5, `scale` 7.5). Requires `offset - |scale|` >= the
    /// smallest normal f32.
    LogUniform,
}

/// Parameters of one `init.dummy` tensor fill. Values: see the module docs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DummyInit {
    /// Base seed (the same for every tensor of a model).
    pub seed: u64,
    /// Tensor identity (e.g. a hash of the checkpoint tensor name).
    pub tensor_id: u64,
    /// Distribution.
    pub dist: DummyDist,
    /// Scale of the unit variate (finite).
    pub scale: f32,
    /// Offset (finite).
    pub offset: f32,
}

/// The splitmix64 finalizer (Steele, Lea, Flood 2014; the output function of `SplittableRandom`).
#[must_use]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The stream key of a tensor: `mix(seed + mix(tensor_id + GAMMA))`.
#[must_use]
pub fn stream_key(seed: u64, tensor_id: u64) -> u64 {
    mix64(seed.wrapping_add(mix64(tensor_id.wrapping_add(GAMMA))))
}

/// The 64 random bits of element `index`: `mix(key + (index + 1) * GAMMA)`.
#[must_use]
pub fn element_bits(key: u64, index: u64) -> u64 {
    mix64(key.wrapping_add(index.wrapping_add(1).wrapping_mul(GAMMA)))
}

/// Uniform variate in `[-1, 1)` from the top 24 bits (exact).
#[must_use]
pub fn unit_uniform(bits: u64) -> f32 {
    ((bits >> 40) as i32 - (1 << 23)) as f32 * f32::from_bits(0x3400_0000) // 2^-23
}

/// Normal-ish variate (Irwin-Hall of the four 16-bit lanes), mean 0, std 1.
#[must_use]
pub fn unit_normal(bits: u64) -> f32 {
    let t: i32 = (0..4).map(|j| 2 * ((bits >> (16 * j)) & 0xFFFF) as i32 - 65_535).sum();
    t as f32 * f32::from_bits(NORMAL_SCALE_BITS)
}

/// The natural logarithm of a positive normal finite `x`, as a fixed sequence of IEEE f32
/// operations (module docs); the CUDA kernel's `dk_init_ln` computes the same bits.
#[must_use]
pub fn ln_f32(x: f32) -> f32 {
    let b = x.to_bits();
    let mut e = ((b >> 23) & 0xFF) as i32 - 127;
    let mut m = f32::from_bits((b & 0x007F_FFFF) | 0x3F80_0000); // [1, 2)
    if m > f32::from_bits(SQRT2_BITS) {
        m *= 0.5;
        e += 1;
    }
    let s = (m - 1.0) / (m + 1.0);
    let s2 = s * s;
    let mut p = s2.mul_add(f32::from_bits(INV9_BITS), f32::from_bits(INV7_BITS));
    p = s2.mul_add(p, f32::from_bits(INV5_BITS));
    p = s2.mul_add(p, f32::from_bits(INV3_BITS));
    let r = s2 * p;
    let two_s = s + s;
    let ln_m = two_s.mul_add(r, two_s);
    (e as f32).mul_add(f32::from_bits(LN2_BITS), ln_m)
}

/// The f32 value (before the bf16 rounding) of element `index`, `key = stream_key(..)`.
#[must_use]
pub fn value_f32(p: &DummyInit, key: u64, index: u64) -> f32 {
    match p.dist {
        DummyDist::Constant => p.offset,
        DummyDist::Uniform => p.scale.mul_add(unit_uniform(element_bits(key, index)), p.offset),
        DummyDist::Normal => p.scale.mul_add(unit_normal(element_bits(key, index)), p.offset),
        DummyDist::LogUniform => {
            ln_f32(p.scale.mul_add(unit_uniform(element_bits(key, index)), p.offset))
        }
    }
}

/// Element `index` of the full tensor, rounded to bf16 (RNE).
#[must_use]
pub fn value(p: &DummyInit, index: u64) -> bf16 {
    bf16::from_f32(value_f32(p, stream_key(p.seed, p.tensor_id), index))
}

/// Checks `p` (finite scale / offset; no overflow to infinity; LogUniform's argument stays a
/// positive normal f32).
///
/// # Errors
/// [`RefError::Invalid`] naming `scale` or `offset`.
pub fn validate(p: &DummyInit) -> Result<()> {
    let bad = |what: &'static str, msg: String| Err(RefError::Invalid { op: OP, what, msg });
    if !p.offset.is_finite() {
        return bad("offset", format!("{} (expected finite)", p.offset));
    }
    if !p.scale.is_finite() {
        return bad("scale", format!("{} (expected finite)", p.scale));
    }
    let (o, s) = (f64::from(p.offset), f64::from(p.scale).abs());
    // Largest |x|: 1 (uniform), 262140 * sqrt(3) 2^-17 < 3.47 (normal).
    let reach = match p.dist {
        DummyDist::Constant => 0.0,
        DummyDist::Uniform | DummyDist::LogUniform => s,
        DummyDist::Normal => 3.5 * s,
    };
    if o.abs() + reach > f64::from(f32::MAX) / 2.0 {
        return bad("scale", format!("offset {o} +- {reach} would overflow f32"));
    }
    if p.dist == DummyDist::LogUniform && o - s < f64::from(f32::MIN_POSITIVE) {
        return bad(
            "offset",
            format!("LogUniform needs offset - |scale| >= {:e}, got {}", f32::MIN_POSITIVE, o - s),
        );
    }
    Ok(())
}

/// A rectangular piece of the full tensor: `rows` rows of `cols` elements, element `(r, c)` at
/// full-tensor index `base + r * ld + c`. A contiguous range is `rows = 1`, `cols = len`; a
/// tensor-parallel column shard of a `[R, C]` tensor is `base = c0`, `ld = C`, `rows = R`,
/// `cols = c1 - c0`; a row shard is contiguous (`base = r0 * C`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DummyRegion {
    /// Full-tensor index of element `(0, 0)`.
    pub base: u64,
    /// Full-tensor index distance between rows (`>= cols` when `rows > 1`).
    pub ld: u64,
    /// Rows of the piece.
    pub rows: u64,
    /// Columns of the piece.
    pub cols: u64,
}

impl DummyRegion {
    /// The contiguous range `start .. start + len`.
    #[must_use]
    pub fn contiguous(start: u64, len: u64) -> Self {
        Self { base: start, ld: len, rows: 1, cols: len }
    }

    /// Elements of the piece (`rows * cols`), or `None` on overflow.
    #[must_use]
    pub fn len(&self) -> Option<u64> {
        self.rows.checked_mul(self.cols)
    }

    /// Whether the piece has no element.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.rows == 0 || self.cols == 0
    }

    /// Checks that every full-tensor index fits an `i64` (the kernel's index type) and that rows
    /// do not overlap.
    ///
    /// # Errors
    /// [`RefError::Invalid`] naming `region`.
    pub fn validate(&self) -> Result<()> {
        let bad = |msg: String| Err(RefError::Invalid { op: OP, what: "region", msg });
        if self.rows > 1 && self.ld < self.cols {
            return bad(format!("ld {} < cols {} (rows would overlap)", self.ld, self.cols));
        }
        if self.is_empty() {
            return Ok(());
        }
        let last = (self.rows - 1)
            .checked_mul(self.ld)
            .and_then(|x| x.checked_add(self.base))
            .and_then(|x| x.checked_add(self.cols));
        match last {
            Some(end) if i64::try_from(end).is_ok() => Ok(()),
            _ => bad(format!("{self:?} reaches past index 2^63")),
        }
    }
}

/// `init.dummy`: fill `out` (`[rows, cols]` row-major bf16) with the elements of `region` of the
/// tensor described by `p` (module docs). CPU twin of `deltakit::ops::init::dummy`.
///
/// # Errors
/// [`RefError::Shape`] if `out.len() != rows * cols`; [`RefError::Invalid`] as [`validate`] and
/// [`DummyRegion::validate`]. Nothing is written on error.
pub fn dummy(p: &DummyInit, region: DummyRegion, out: &mut [bf16]) -> Result<()> {
    validate(p)?;
    region.validate()?;
    let n = region.len().and_then(|n| usize::try_from(n).ok());
    if n != Some(out.len()) {
        return Err(RefError::Shape {
            op: OP,
            what: "out",
            expected: format!("length {} x {}", region.rows, region.cols),
            got: format!("length {}", out.len()),
        });
    }
    if out.is_empty() {
        return Ok(());
    }
    let key = stream_key(p.seed, p.tensor_id);
    let cols = region.cols as usize;
    for (r, row) in out.chunks_exact_mut(cols).enumerate() {
        let start = region.base + r as u64 * region.ld;
        for (c, o) in row.iter_mut().enumerate() {
            *o = bf16::from_f32(value_f32(p, key, start + c as u64));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn init(dist: DummyDist, scale: f32, offset: f32) -> DummyInit {
        DummyInit { seed: 7, tensor_id: 11, dist, scale, offset }
    }

    /// splitmix64 with seed 0 (Vigna's reference `next()`: state += GAMMA, then mix): the
    /// published first output 0xE220A8397B1DCDAF.
    #[test]
    fn splitmix64_reference_value() {
        assert_eq!(element_bits(0, 0), 0xE220_A839_7B1D_CDAF);
    }

    #[test]
    fn ln_matches_f64() {
        let mut worst = 0f64;
        let mut x = f32::MIN_POSITIVE;
        while x < 1e30 {
            for m in [1.0f32, 1.1, 1.3, 1.414, 1.4143, 1.7, 1.99] {
                let v = x * m;
                let want = f64::from(v).ln();
                let got = f64::from(ln_f32(v));
                let ulp = f64::from(f32::EPSILON) * want.abs().max(1e-3);
                worst = worst.max((got - want).abs() / ulp);
            }
            x *= 3.7;
        }
        assert!(worst < 4.0, "ln_f32 error {worst} ulps");
        assert_eq!(ln_f32(1.0).to_bits(), 0);
    }

    #[test]
    fn distributions_have_their_moments() {
        let n = 200_000usize;
        for (dist, mean, std) in
            [(DummyDist::Uniform, 0.25, 2.0 / 3f64.sqrt()), (DummyDist::Normal, 0.25, 2.0)]
        {
            let p = init(dist, 2.0, 0.25);
            let mut out = vec![bf16::ZERO; n];
            dummy(&p, DummyRegion::contiguous(0, n as u64), &mut out).unwrap();
            let v: Vec<f64> = out.iter().map(|x| f64::from(x.to_f32())).collect();
            let m = v.iter().sum::<f64>() / n as f64;
            let s = (v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / n as f64).sqrt();
            assert!((m - mean).abs() < 0.02, "{dist:?} mean {m}");
            assert!((s - std).abs() / std < 0.01, "{dist:?} std {s}");
            if dist == DummyDist::Uniform {
                assert!(v.iter().all(|&x| (-1.75..=2.25).contains(&x)));
            }
        }
        let p = init(DummyDist::LogUniform, 7.5, 8.5);
        let mut out = vec![bf16::ZERO; 10_000];
        dummy(&p, DummyRegion::contiguous(0, 10_000), &mut out).unwrap();
        assert!(out.iter().all(|x| (0.0..=16f32.ln() + 0.02).contains(&x.to_f32())));
        let p = init(DummyDist::Constant, 3.0, -1.5);
        let mut out = vec![bf16::ZERO; 5];
        dummy(&p, DummyRegion::contiguous(9, 5), &mut out).unwrap();
        assert!(out.iter().all(|x| *x == bf16::from_f32(-1.5)));
    }

    /// A shard (row or column piece) equals the same elements of the full tensor; different
    /// tensor ids / seeds give different values.
    #[test]
    fn pieces_equal_the_whole() {
        let p = init(DummyDist::Uniform, 0.1, 0.0);
        let (r, c) = (7u64, 13u64);
        let mut full = vec![bf16::ZERO; 91];
        dummy(&p, DummyRegion::contiguous(0, r * c), &mut full).unwrap();
        let mut col = vec![bf16::ZERO; 7 * 4];
        dummy(&p, DummyRegion { base: 5, ld: c, rows: r, cols: 4 }, &mut col).unwrap();
        for i in 0..7 {
            assert_eq!(&col[i * 4..i * 4 + 4], &full[i * 13 + 5..i * 13 + 9]);
        }
        assert_eq!(value(&p, 40), full[40]);
        let mut other = full.clone();
        dummy(&DummyInit { tensor_id: 12, ..p }, DummyRegion::contiguous(0, 91), &mut other)
            .unwrap();
        assert_ne!(other, full);
    }

    #[test]
    fn rejects_bad_arguments_without_writing() {
        let mut out = vec![bf16::ONE; 4];
        let reg = DummyRegion::contiguous(0, 4);
        for (p, what) in [
            (init(DummyDist::Uniform, f32::NAN, 0.0), "scale"),
            (init(DummyDist::Uniform, 1.0, f32::INFINITY), "offset"),
            (init(DummyDist::Normal, 1e38, 0.0), "scale"),
            (init(DummyDist::LogUniform, 1.0, 1.0), "offset"),
        ] {
            let e = dummy(&p, reg, &mut out).unwrap_err();
            assert!(matches!(e, RefError::Invalid { what: w, .. } if w == what), "{e}");
        }
        let p = init(DummyDist::Uniform, 1.0, 0.0);
        assert!(matches!(
            dummy(&p, DummyRegion::contiguous(0, 5), &mut out),
            Err(RefError::Shape { what: "out", .. })
        ));
        let e = dummy(&p, DummyRegion { base: 0, ld: 1, rows: 2, cols: 2 }, &mut out);
        assert!(matches!(e, Err(RefError::Invalid { what: "region", .. })));
        let e = dummy(&p, DummyRegion::contiguous(u64::MAX - 2, 4), &mut out);
        assert!(matches!(e, Err(RefError::Invalid { what: "region", .. })));
        assert!(out.iter().all(|x| *x == bf16::ONE));
    }
}
