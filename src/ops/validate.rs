//! Argument checks shared by the wrappers of `gdr.decode`, `conv1d.*` and `norm.*`.

use crate::error::{Error, Result};

/// `got == expected` for a buffer length.
pub(crate) fn len(op: &'static str, arg: &'static str, got: usize, expected: usize) -> Result<()> {
    if got == expected {
        Ok(())
    } else {
        Err(Error::shape(op, arg, format!("len {expected}"), got))
    }
}

/// The product of `factors` (element counts), or [`Error::Shape`] naming `arg` if it does not fit
/// in `usize` (absurd sizes must fail the checks, not wrap past them in release builds).
pub(crate) fn product(op: &'static str, arg: &'static str, factors: &[usize]) -> Result<usize> {
    factors.iter().try_fold(1usize, |acc, &f| acc.checked_mul(f)).ok_or_else(|| {
        let f: Vec<String> = factors.iter().map(ToString::to_string).collect();
        Error::shape(op, arg, "a size that fits in usize", f.join(" x "))
    })
}

/// A strided `[rows, row_len]` view with `stride` elements between rows: the buffer must hold
/// `(rows - 1) * stride + row_len` elements (exactly `rows * row_len` when contiguous).
pub(crate) fn strided_len(
    op: &'static str,
    arg: &'static str,
    got: usize,
    rows: usize,
    row_len: usize,
    stride: Option<usize>,
) -> Result<usize> {
    match stride {
        None => {
            len(op, arg, got, product(op, arg, &[rows, row_len])?)?;
            Ok(row_len)
        }
        Some(s) => {
            if s < row_len {
                return Err(Error::shape(op, arg, format!("row stride >= {row_len}"), s));
            }
            let need = if rows == 0 {
                0
            } else {
                product(op, arg, &[rows - 1, s])?.checked_add(row_len).ok_or_else(|| {
                    Error::shape(
                        op,
                        arg,
                        "a size that fits in usize",
                        format!("({rows} - 1) x {s} + {row_len}"),
                    )
                })?
            };
            if got < need {
                return Err(Error::shape(
                    op,
                    arg,
                    format!("len >= {need} ({rows} rows of {row_len}, stride {s})"),
                    got,
                ));
            }
            Ok(s)
        }
    }
}

/// Device address `p` must be a multiple of `align` bytes.
pub(crate) fn aligned(op: &'static str, arg: &'static str, p: u64, align: u64) -> Result<()> {
    if p % align == 0 {
        Ok(())
    } else {
        Err(Error::shape(op, arg, format!("a {align}-byte aligned address"), format!("{p:#x}")))
    }
}

/// Host copy of device slot indices: length `n`, each `-1` or in `0..num_slots`, live ones distinct.
pub(crate) fn slots_host(
    op: &'static str,
    slots: &[i32],
    n: usize,
    num_slots: usize,
) -> Result<()> {
    len(op, "slots_host", slots.len(), n)?;
    let mut seen = std::collections::HashSet::with_capacity(n);
    for (i, &s) in slots.iter().enumerate() {
        if s == -1 {
            continue;
        }
        if s < 0 || s as usize >= num_slots {
            return Err(Error::shape(
                op,
                "slots",
                format!("each slot -1 or in 0..{num_slots}"),
                format!("slots[{i}] = {s}"),
            ));
        }
        if !seen.insert(s) {
            return Err(Error::shape(
                op,
                "slots",
                "distinct live slots",
                format!("slot {s} repeated at row {i}"),
            ));
        }
    }
    Ok(())
}

/// An RMS-norm `eps` (HF `Qwen3_5RMSNorm` / `Qwen3NextRMSNormGated`: a positive float; the
/// engine's `rms_norm_eps` check): finite and `> 0`. A negative one can make `mean(x^2) + eps`
/// negative and `0` turns an all-zero row into `0 * rsqrt(0) = NaN`: both silent NaN outputs.
pub(crate) fn eps(op: &'static str, eps: f32) -> Result<()> {
    if eps.is_finite() && eps > 0.0 {
        Ok(())
    } else {
        Err(Error::shape(op, "eps", "finite and > 0", eps))
    }
}

/// Converts a size to the C ABI's `int64_t`.
pub(crate) fn i64_of(op: &'static str, arg: &'static str, v: usize) -> Result<i64> {
    i64::try_from(v).map_err(|_| Error::shape(op, arg, "a size that fits in i64", v))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Absurd sizes fail the checks with a typed error instead of wrapping past them (release
    /// builds do not trap on overflow).
    #[test]
    fn sizes_that_overflow_usize_are_shape_errors() {
        assert!(matches!(
            product("op", "x", &[1 << 40, 1 << 40]),
            Err(Error::Shape { arg: "x", .. })
        ));
        assert_eq!(product("op", "x", &[3, 5, 7]).unwrap(), 105);
        // 2^62 rows of 128: the product wraps to 0 in release builds.
        assert!(strided_len("op", "q", 0, 1usize << 62, 128, None).is_err());
        // (3 - 1) rows x a stride of 2^63 - 8 + 128 wraps below a 128-element buffer.
        assert!(strided_len("op", "q", 128, 3, 128, Some((1usize << 63) - 8)).is_err());
        assert!(strided_len("op", "q", usize::MAX, 2, 8, Some(usize::MAX - 4)).is_err());
        assert_eq!(strided_len("op", "q", 24, 2, 8, Some(16)).unwrap(), 16);
        assert!(strided_len("op", "q", 23, 2, 8, Some(16)).is_err());
    }

    /// `eps` of the RMS norms (norm.rms / norm.fused_add_rms / norm.rms_gated / attn.prep's q/k
    /// norm): finite and > 0, as HF and the engine's config check take it (session-11 review:
    /// 0 was accepted and gives NaN on an all-zero row).
    #[test]
    fn eps_must_be_finite_and_positive() {
        for bad in [0.0f32, -0.0, -1e-6, f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let e = eps("norm.rms", bad).unwrap_err();
            assert!(matches!(e, Error::Shape { arg: "eps", .. }), "{bad}: {e}");
        }
        for ok in [1e-6f32, f32::MIN_POSITIVE, 1e-45] {
            eps("norm.rms", ok).unwrap();
        }
    }
}
