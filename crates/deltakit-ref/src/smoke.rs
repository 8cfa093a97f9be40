//! Smoke ops that prove the build pipeline (issue 2): `smoke.axpy` (CUDA) and `smoke.vadd` (Triton).

use half::bf16;

/// `y[i] = bf16(alpha * f32(x[i]) + f32(y[i]))`, rounding once to bf16 (round to nearest even), as
/// the CUDA `smoke.axpy` kernel does.
///
/// Shapes: `x` and `y` are `[n]`. Panics never; extra elements of the longer slice are ignored
/// only if the lengths differ, so callers must pass equal lengths (the GPU wrapper checks it).
pub fn axpy_bf16(alpha: f32, x: &[bf16], y: &mut [bf16]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi = bf16::from_f32(alpha.mul_add(xi.to_f32(), yi.to_f32()));
    }
}

/// `out[i] = a[i] + b[i]` in f32, as the Triton `smoke.vadd` kernel does. Shapes: all `[n]`.
pub fn vadd_f32(a: &[f32], b: &[f32], out: &mut [f32]) {
    for ((o, x), y) in out.iter_mut().zip(a).zip(b) {
        *o = x + y;
    }
}
