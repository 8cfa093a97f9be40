//! Activation element types and the bf16 rounding helpers.
//!
//! Reference ops are generic over [`Elem`]: `f32` (no rounding anywhere) and [`bf16`] (round to
//! nearest even at the points where HF transformers' bf16 forward rounds). Compute is always f32.

use half::bf16;

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::bf16 {}
}

/// An activation element type: `f32` or [`bf16`]. Sealed.
pub trait Elem:
    Copy + Default + Send + Sync + std::fmt::Debug + PartialEq + 'static + sealed::Sealed
{
    /// Short dtype name (`"f32"`, `"bf16"`).
    const NAME: &'static str;
    /// Widen to f32 (exact).
    fn to_f32(self) -> f32;
    /// Narrow from f32 (round to nearest even for bf16; identity for f32).
    fn from_f32(x: f32) -> Self;
    /// Round an f32 through this dtype and back: `from_f32(x).to_f32()`.
    #[must_use]
    fn round(x: f32) -> f32 {
        Self::from_f32(x).to_f32()
    }
    /// View a slice as f32 without copying when `Self` is f32 (`None` for bf16).
    fn as_f32_slice(x: &[Self]) -> Option<&[f32]>;
}

impl Elem for f32 {
    const NAME: &'static str = "f32";
    #[inline]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline]
    fn from_f32(x: f32) -> Self {
        x
    }
    fn as_f32_slice(x: &[Self]) -> Option<&[f32]> {
        Some(x)
    }
}

impl Elem for bf16 {
    const NAME: &'static str = "bf16";
    #[inline]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    #[inline]
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
    fn as_f32_slice(_: &[Self]) -> Option<&[f32]> {
        None
    }
}

/// Round `x` to the nearest bf16 (ties to even) and back to f32.
#[must_use]
pub fn round_bf16(x: f32) -> f32 {
    bf16::from_f32(x).to_f32()
}

/// Widen a slice to a new f32 vector.
#[must_use]
pub fn to_f32_vec<T: Elem>(x: &[T]) -> Vec<f32> {
    x.iter().map(|&e| e.to_f32()).collect()
}

/// Narrow an f32 slice to a new vector of `T` (rounding for bf16).
#[must_use]
pub fn from_f32_vec<T: Elem>(x: &[f32]) -> Vec<T> {
    x.iter().map(|&e| T::from_f32(e)).collect()
}
