//! Shared argument validation. Every helper returns an error naming the op and argument.

use crate::{RefError, Result};

/// `got == expected` for a slice length.
pub(crate) fn len(op: &'static str, what: &'static str, got: usize, expected: usize) -> Result<()> {
    if got == expected {
        Ok(())
    } else {
        Err(RefError::Shape {
            op,
            what,
            expected: format!("length {expected}"),
            got: format!("length {got}"),
        })
    }
}

/// A scalar parameter must be finite (not NaN, not +-inf).
pub(crate) fn finite(op: &'static str, what: &'static str, v: f32) -> Result<()> {
    if v.is_finite() {
        Ok(())
    } else {
        Err(RefError::Invalid { op, what, msg: format!("must be finite, got {v}") })
    }
}

/// A dimension must be non-zero.
pub(crate) fn nonzero(op: &'static str, what: &'static str, v: usize) -> Result<()> {
    if v == 0 {
        Err(RefError::Shape { op, what, expected: "> 0".into(), got: "0".into() })
    } else {
        Ok(())
    }
}

/// Checked product of dimensions.
pub(crate) fn prod(op: &'static str, what: &'static str, dims: &[usize]) -> Result<usize> {
    dims.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d)).ok_or_else(|| RefError::Invalid {
        op,
        what,
        msg: format!("size {dims:?} overflows usize"),
    })
}

/// `total % unit == 0` (unit > 0): returns `total / unit`, the row count.
pub(crate) fn rows(
    op: &'static str,
    what: &'static str,
    total: usize,
    unit: usize,
) -> Result<usize> {
    nonzero(op, what, unit)?;
    if total % unit == 0 {
        Ok(total / unit)
    } else {
        Err(RefError::Shape {
            op,
            what,
            expected: format!("a multiple of {unit}"),
            got: format!("length {total}"),
        })
    }
}

/// Validate `cu_seqlens` (`[N+1]`, starts at 0, non-decreasing, last == `total`) and return
/// `(start, len)` per sequence.
pub(crate) fn cu_seqlens(
    op: &'static str,
    what: &'static str,
    cu: &[i32],
    total: usize,
) -> Result<Vec<(usize, usize)>> {
    if cu.is_empty() {
        return Err(RefError::Shape {
            op,
            what,
            expected: "length N+1 >= 1".into(),
            got: "length 0".into(),
        });
    }
    if cu[0] != 0 {
        return Err(RefError::Invalid { op, what, msg: format!("must start at 0, got {}", cu[0]) });
    }
    for (i, w) in cu.windows(2).enumerate() {
        if w[1] < w[0] {
            return Err(RefError::Invalid {
                op,
                what,
                msg: format!("must be non-decreasing: [{i}]={} > [{}]={}", w[0], i + 1, w[1]),
            });
        }
    }
    let last = cu[cu.len() - 1];
    if usize::try_from(last).ok() != Some(total) {
        return Err(RefError::Shape {
            op,
            what,
            expected: format!("last element == total tokens {total}"),
            got: format!("{last}"),
        });
    }
    Ok(cu.windows(2).map(|w| (w[0] as usize, (w[1] - w[0]) as usize)).collect())
}

/// Validate slot indices: length `n`, each `-1` or in `0..num_slots`, live ones distinct.
pub(crate) fn slots(
    op: &'static str,
    what: &'static str,
    slots: &[i32],
    n: usize,
    num_slots: usize,
) -> Result<Vec<Option<usize>>> {
    len(op, what, slots.len(), n)?;
    let mut seen = vec![usize::MAX; num_slots];
    let mut out = Vec::with_capacity(n);
    for (i, &s) in slots.iter().enumerate() {
        if s == -1 {
            out.push(None);
            continue;
        }
        let Some(su) = usize::try_from(s).ok().filter(|&u| u < num_slots) else {
            return Err(RefError::Invalid {
                op,
                what,
                msg: format!("[{i}] = {s} is neither -1 nor in 0..{num_slots}"),
            });
        };
        if seen[su] != usize::MAX {
            return Err(RefError::Invalid {
                op,
                what,
                msg: format!("slot {s} used by rows {} and {i}", seen[su]),
            });
        }
        seen[su] = i;
        out.push(Some(su));
    }
    Ok(out)
}

/// Numerically stable `1 / (1 + exp(-x))` in f32.
pub(crate) fn sigmoid(x: f32) -> f32 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

/// `x * sigmoid(x)` in f32.
pub(crate) fn silu(x: f32) -> f32 {
    x * sigmoid(x)
}

/// f64-accumulated dot product of two f32 slices.
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| f64::from(x) * f64::from(y)).sum()
}
