//! Shared helpers for the GPU integration tests.
#![allow(dead_code)]

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A fresh RNG per case, seeded from the case index and a per-process salt printed on failure.
pub fn rng(case: u64) -> (StdRng, u64) {
    let salt = std::env::var("DELTAKIT_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::thread_rng().gen::<u64>());
    let seed = salt ^ case.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (StdRng::seed_from_u64(seed), seed)
}

/// Uniform values in [-1, 1) excluding exact zero.
pub fn randn_f32(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let x: f32 = rng.gen_range(-1.0..1.0);
            if x == 0.0 {
                0.5
            } else {
                x
            }
        })
        .collect()
}

/// Rounds f32 values to bf16 (RNE).
pub fn to_bf16(v: &[f32]) -> Vec<half::bf16> {
    v.iter().copied().map(half::bf16::from_f32).collect()
}

/// Widens bf16 values to f32 (exact).
pub fn to_f32(v: &[half::bf16]) -> Vec<f32> {
    v.iter().map(|x| x.to_f32()).collect()
}
