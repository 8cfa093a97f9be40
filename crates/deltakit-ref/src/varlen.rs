//! Varlen batch description shared by the prefill ops (GDR, conv1d).

/// A packed varlen batch of `N` sequences over `T` tokens, each owning a state slot.
///
/// - `cu_seqlens`: `i32 [N+1]`, starts at 0, non-decreasing, last == `T`. Sequence `i` is tokens
///   `cu_seqlens[i]..cu_seqlens[i+1]` (empty sequences are allowed).
/// - `slots`: `i32 [N]`, the state-pool slot of each sequence: its initial state is read there and
///   its final state written back. `-1` = padding sequence (zero output, no state read or written).
///   Live slots must be distinct and `< num_slots`.
/// - `has_initial_state`: optional `bool [N]`; `false` means the sequence starts from a zero state
///   (the slot is not read but is still written). `None` = every sequence reads its slot.
#[derive(Clone, Copy, Debug)]
pub struct Varlen<'a> {
    /// `i32 [N+1]` cumulative sequence lengths.
    pub cu_seqlens: &'a [i32],
    /// `i32 [N]` slot per sequence, `-1` = padding.
    pub slots: &'a [i32],
    /// Optional `bool [N]`: read the initial state from the slot (true) or start from zeros.
    pub has_initial_state: Option<&'a [bool]>,
}

impl<'a> Varlen<'a> {
    /// A batch where every sequence reads its initial state from its slot.
    #[must_use]
    pub fn new(cu_seqlens: &'a [i32], slots: &'a [i32]) -> Self {
        Self { cu_seqlens, slots, has_initial_state: None }
    }
}

/// One validated sequence of a varlen batch.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Seq {
    pub start: usize,
    pub len: usize,
    /// `None` = padding.
    pub slot: Option<usize>,
    /// Read the initial state from the slot.
    pub init: bool,
}

impl Varlen<'_> {
    /// Validate against `total` tokens and `num_slots` slots.
    pub(crate) fn validate(
        &self,
        op: &'static str,
        total: usize,
        num_slots: usize,
    ) -> crate::Result<Vec<Seq>> {
        let ranges = crate::check::cu_seqlens(op, "cu_seqlens", self.cu_seqlens, total)?;
        let n = ranges.len();
        let slots = crate::check::slots(op, "slots", self.slots, n, num_slots)?;
        if let Some(h) = self.has_initial_state {
            crate::check::len(op, "has_initial_state", h.len(), n)?;
        }
        Ok(ranges
            .into_iter()
            .zip(slots)
            .enumerate()
            .map(|(i, ((start, len), slot))| Seq {
                start,
                len,
                slot,
                init: self.has_initial_state.is_none_or(|h| h[i]),
            })
            .collect())
    }
}
