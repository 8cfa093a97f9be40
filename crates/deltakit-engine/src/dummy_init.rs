//! `--load-format dummy` weights through the `init.dummy` op: one definition for the CPU (the
//! twin `deltakit_ref::init`) and the device (`deltakit::ops::init::dummy`), bit for bit.
//!
//! [`params`] maps a checkpoint tensor (name, shape, [`Init`]) and the model seed to the op's
//! parameters; element `i` of the tensor is then a pure function of `(seed, name, i)`, so a
//! tensor-parallel rank generates exactly its rows / columns ([`regions_from_runs`] turns the
//! element runs of a shard into the op's rectangular regions) and gets the TP=1 values.
//!
//! | [`Init`] | distribution | scale | offset |
//! | --- | --- | --- | --- |
//! | `Linear` (fan_in = last dim) | uniform | `sqrt(3) / sqrt(fan_in)` (std `1/sqrt(fan_in)`) | 0 |
//! | `Embedding` | uniform | `sqrt(3)` (std 1) | 0 |
//! | `Constant(c)` | constant | 0 | `c` |
//! | `Uniform(lo, hi)` | uniform on `[lo, hi)` | `(hi - lo) / 2` | `(lo + hi) / 2` |
//! | `LogUniform(lo, hi)` | `ln` of uniform on `[lo, hi)` | `(hi - lo) / 2` | `(lo + hi) / 2` |
//!
//! The tensor id is the FNV-1a hash of the full checkpoint name (with its `model.` /
//! `model.language_model.` prefix), so the two architectures' dummy weights differ, as do two
//! tensors of one model.

use std::ops::Range;

use deltakit_ref::init::{self as twin, DummyDist, DummyInit, DummyRegion};
use half::bf16;
use rayon::prelude::*;

use crate::error::{EngineError, Result};
use crate::weights::Init;

/// FNV-1a (64-bit) of a tensor name: the op's `tensor_id`.
#[must_use]
pub fn tensor_id(name: &str) -> u64 {
    name.bytes()
        .fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// The `init.dummy` parameters of tensor `name` of full shape `shape` initialised as `init`,
/// for model seed `seed` (table in the module docs).
///
/// # Errors
/// [`EngineError::Weights`] naming the tensor if the parameters are out of the op's domain
/// (non-finite, a `LogUniform` range reaching 0 or below, `hi < lo`).
pub fn params(name: &str, shape: &[usize], init: Init, seed: u64) -> Result<DummyInit> {
    let (dist, scale, offset) = match init {
        Init::Linear => {
            let fan_in = shape.last().copied().unwrap_or(1).max(1) as f32;
            (DummyDist::Uniform, 3f32.sqrt() / fan_in.sqrt(), 0.0)
        }
        Init::Embedding => (DummyDist::Uniform, 3f32.sqrt(), 0.0),
        Init::Constant(c) => (DummyDist::Constant, 0.0, c),
        Init::Uniform(lo, hi) | Init::LogUniform(lo, hi) => {
            if hi.partial_cmp(&lo) == Some(std::cmp::Ordering::Less) {
                return Err(EngineError::Weights(format!(
                    "tensor `{name}`: dummy init range [{lo}, {hi}) is empty"
                )));
            }
            let dist = if matches!(init, Init::Uniform(..)) {
                DummyDist::Uniform
            } else {
                DummyDist::LogUniform
            };
            (dist, (hi - lo) / 2.0, f32::midpoint(lo, hi))
        }
    };
    let p = DummyInit { seed, tensor_id: tensor_id(name), dist, scale, offset };
    twin::validate(&p)
        .map_err(|e| EngineError::Weights(format!("tensor `{name}`: dummy init {init:?}: {e}")))?;
    Ok(p)
}

/// One rectangular piece of a shard: `region` of the full tensor, written at element `offset`
/// of the shard's row-major output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Element offset in the output buffer.
    pub offset: usize,
    /// The full-tensor elements ([`DummyRegion`]: `rows x cols` at `base + r * ld + c`).
    pub region: DummyRegion,
}

/// Groups the element runs of a shard (in output order; e.g. the engine's `Part::runs`) into
/// rectangular [`Piece`]s: consecutive runs of equal length at a constant stride become one
/// 2-D region (a column shard of `R` rows is one piece), any other run its own piece. Empty runs
/// are skipped. Expanding the pieces gives back exactly the runs' indices in order.
#[must_use]
pub fn regions_from_runs(runs: &[Range<usize>]) -> Vec<Piece> {
    let mut out: Vec<Piece> = Vec::new();
    let mut offset = 0usize;
    for r in runs.iter().filter(|r| !r.is_empty()) {
        let len = (r.end - r.start) as u64;
        let start = r.start as u64;
        if let Some(last) = out.last_mut() {
            let reg = &mut last.region;
            let next = reg.base + reg.rows * reg.ld;
            let stride_ok = if reg.rows == 1 {
                start >= reg.base + reg.cols // first extension fixes ld
            } else {
                start == next
            };
            if reg.cols == len && stride_ok {
                if reg.rows == 1 {
                    reg.ld = start - reg.base;
                }
                reg.rows += 1;
                offset += r.len();
                continue;
            }
        }
        out.push(Piece { offset, region: DummyRegion::contiguous(start, len) });
        offset += r.len();
    }
    out
}

/// Elements per parallel work item of [`fill_host`].
const BLOCK: usize = 1 << 16;

/// The CPU path: the shard of the tensor `p` selected by `runs` (full-tensor element ranges in
/// output order), as f32 values that are exactly the bf16 values the device op writes. Filled in
/// parallel (rayon); the values do not depend on the thread count.
///
/// # Errors
/// [`EngineError::Weights`] if `p` is out of the op's domain or an index passes 2^63.
pub fn fill_host(p: &DummyInit, runs: &[Range<usize>]) -> Result<Vec<f32>> {
    twin::validate(p).map_err(|e| EngineError::Weights(e.to_string()))?;
    let total: usize = runs.iter().map(ExactSizeIterator::len).sum();
    let mut out = vec![0f32; total];
    let mut rest = out.as_mut_slice();
    let mut jobs = Vec::new();
    for r in runs {
        let (head, tail) = rest.split_at_mut(r.len());
        for (b, chunk) in head.chunks_mut(BLOCK).enumerate() {
            jobs.push((r.start + b * BLOCK, chunk));
        }
        rest = tail;
    }
    jobs.into_par_iter().try_for_each(|(start, dst)| -> Result<()> {
        let mut tmp = vec![bf16::ZERO; dst.len()];
        twin::dummy(p, DummyRegion::contiguous(start as u64, dst.len() as u64), &mut tmp)
            .map_err(|e| EngineError::Weights(e.to_string()))?;
        for (d, t) in dst.iter_mut().zip(&tmp) {
            *d = t.to_f32();
        }
        Ok(())
    })?;
    Ok(out)
}

/// The device path: writes the shard selected by `runs` (as [`fill_host`]) into the first
/// `sum(runs.len())` elements of `out` (bf16; a longer buffer keeps its tail, e.g. the one
/// element an empty tensor owns) with `init.dummy`, one launch per [`Piece`], enqueued on
/// `stream`. Bitwise equal to [`fill_host`].
///
/// # Errors
/// [`EngineError::Weights`] if `out` is shorter than the shard; the op's errors (domain,
/// launch) as [`EngineError::Backend`].
#[cfg(feature = "cuda")]
pub fn fill_device(
    stream: &deltakit::cudarc::driver::CudaStream,
    p: &DummyInit,
    runs: &[Range<usize>],
    out: &mut deltakit::cudarc::driver::CudaSlice<bf16>,
) -> Result<()> {
    use deltakit::ops::init as op;
    let total: usize = runs.iter().map(ExactSizeIterator::len).sum();
    if out.len() < total {
        return Err(EngineError::Weights(format!(
            "dummy fill: output has {} elements, the shard {total}",
            out.len()
        )));
    }
    let dp = device_params(p);
    for piece in regions_from_runs(runs) {
        let r = piece.region;
        let n = (r.rows * r.cols) as usize;
        let region = op::DummyRegion { base: r.base, ld: r.ld, rows: r.rows, cols: r.cols };
        op::dummy(stream, &dp, region, &mut out.slice_mut(piece.offset..piece.offset + n))
            .map_err(|e| EngineError::Backend { backend: "cuda", msg: e.to_string() })?;
    }
    Ok(())
}

/// The device op's parameters for the twin's `p` (same fields).
#[cfg(feature = "cuda")]
#[must_use]
pub fn device_params(p: &DummyInit) -> deltakit::ops::init::DummyInit {
    use deltakit::ops::init::DummyDist as D;
    deltakit::ops::init::DummyInit {
        seed: p.seed,
        tensor_id: p.tensor_id,
        dist: match p.dist {
            DummyDist::Constant => D::Constant,
            DummyDist::Uniform => D::Uniform,
            DummyDist::Normal => D::Normal,
            DummyDist::LogUniform => D::LogUniform,
        },
        scale: p.scale,
        offset: p.offset,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ModelConfig;
    use crate::paths::find_fixtures_dir;
    use crate::weights::expected_tensors;

    #[test]
    fn params_by_hand() {
        let p =
            params("model.layers.0.mlp.up_proj.weight", &[12288, 4096], Init::Linear, 5).unwrap();
        assert_eq!(p.dist, DummyDist::Uniform);
        assert!((p.scale - 3f32.sqrt() / 64.0).abs() < 1e-9 && p.offset == 0.0);
        assert_eq!((p.seed, p.tensor_id), (5, tensor_id("model.layers.0.mlp.up_proj.weight")));
        let p = params("e", &[10, 4], Init::Embedding, 0).unwrap();
        assert_eq!((p.dist, p.scale.to_bits()), (DummyDist::Uniform, 3f32.sqrt().to_bits()));
        let p = params("a", &[48], Init::LogUniform(1.0, 16.0), 0).unwrap();
        assert_eq!((p.dist, p.scale, p.offset), (DummyDist::LogUniform, 7.5, 8.5));
        let p = params("d", &[48], Init::Uniform(-0.5, 0.5), 0).unwrap();
        assert_eq!((p.dist, p.scale, p.offset), (DummyDist::Uniform, 0.5, 0.0));
        let p = params("n", &[48], Init::Constant(1.0), 0).unwrap();
        assert_eq!((p.dist, p.scale, p.offset), (DummyDist::Constant, 0.0, 1.0));
        assert_ne!(tensor_id("a"), tensor_id("b"));
        // FNV-1a test vector: "a" -> 0xaf63dc4c8601ec8c.
        assert_eq!(tensor_id("a"), 0xaf63_dc4c_8601_ec8c);
        let e = params("bad", &[4], Init::LogUniform(-1.0, 2.0), 0).unwrap_err().to_string();
        assert!(e.contains("`bad`"), "{e}");
        assert!(params("bad", &[4], Init::Uniform(2.0, 1.0), 0).is_err());
        assert!(params("bad", &[4], Init::Constant(f32::NAN), 0).is_err());
    }

    /// Every tensor of the bundled configs maps to valid parameters, and values stay in the
    /// init's range.
    #[test]
    fn every_tensor_of_real_configs_is_valid() {
        let dir = find_fixtures_dir().unwrap();
        for path in [
            dir.join("tiny-causal"),
            dir.join("tiny-cond"),
            dir.parent().unwrap().join("configs/qwen3.5-9b"),
            dir.parent().unwrap().join("configs/qwen3.5-27b"),
        ] {
            let cfg = ModelConfig::from_path(&path).unwrap();
            for (name, shape, init) in expected_tensors(&cfg) {
                let p = params(&name, &shape, init, 1).unwrap();
                let n = shape.iter().product::<usize>().min(4096);
                let v = fill_host(&p, std::slice::from_ref(&(0..n))).unwrap();
                let (lo, hi) = match init {
                    Init::Linear => {
                        let a = 3f32.sqrt() / (*shape.last().unwrap() as f32).sqrt();
                        (-a, a)
                    }
                    Init::Embedding => (-3f32.sqrt(), 3f32.sqrt()),
                    Init::Constant(c) => (c, c),
                    Init::Uniform(lo, hi) => (lo, hi),
                    Init::LogUniform(lo, hi) => (lo.ln(), hi.ln()),
                };
                let slack = 0.01 * hi.abs().max(lo.abs()) + 1e-6;
                assert!(
                    v.iter().all(|x| *x >= lo - slack && *x <= hi + slack),
                    "{name} {init:?}: values outside [{lo}, {hi}]"
                );
                if !matches!(init, Init::Constant(_)) && n > 16 {
                    assert!(
                        v.iter().any(|x| x.to_bits() != v[0].to_bits()),
                        "{name}: constant values"
                    );
                }
            }
        }
    }

    fn expand(pieces: &[Piece]) -> Vec<usize> {
        let mut v = Vec::new();
        for p in pieces {
            assert_eq!(p.offset, v.len());
            let r = p.region;
            for i in 0..r.rows {
                v.extend((0..r.cols).map(|c| (r.base + i * r.ld + c) as usize));
            }
        }
        v
    }

    #[test]
    fn regions_reproduce_runs() {
        let cases: Vec<Vec<Range<usize>>> = vec![
            vec![0..30],
            (0..6).map(|i| i * 5 + 1..i * 5 + 4).collect(), // column shard
            vec![20..30, 0..5],                             // row ranges (GDN qkv stitch)
            vec![0..0, 3..7, 7..7, 10..14, 17..21, 30..31], // empties, then a stride change
            vec![],
        ];
        for runs in cases {
            let want: Vec<usize> = runs.iter().flat_map(Clone::clone).collect();
            let pieces = regions_from_runs(&runs);
            assert_eq!(expand(&pieces), want, "{runs:?}");
        }
        let cols: Vec<Range<usize>> = (0..6).map(|i| i * 5 + 1..i * 5 + 4).collect();
        assert_eq!(regions_from_runs(&cols).len(), 1, "a column shard is one launch");
    }

    /// The device path writes exactly the host path's values (full tensors, a column shard, a
    /// row-range stitch, `A_log`'s log-uniform, a constant norm), output poisoned first. Runs on
    /// a GPU host (the `--features cuda` build of this crate's unit tests, e.g. through
    /// `tools/gpu-bundle`); skips elsewhere unless `DELTAKIT_REQUIRE_GPU=1`.
    #[cfg(feature = "cuda")]
    #[test]
    #[allow(clippy::type_complexity, clippy::single_range_in_vec_init)] // a table of cases
    fn device_equals_host() {
        let Some(ctx) = deltakit::testing::gpu_or_skip("dummy_init::device_equals_host") else {
            return;
        };
        let stream = ctx.default_stream();
        let cols: Vec<Range<usize>> = (0..64).map(|i| i * 4096 + 1024..i * 4096 + 2048).collect();
        let cases: Vec<(&str, Vec<usize>, Init, Vec<Range<usize>>)> = vec![
            ("model.layers.0.mlp.down_proj.weight", vec![64, 4096], Init::Linear, cols),
            ("model.embed_tokens.weight", vec![1001, 33], Init::Embedding, vec![0..1001 * 33]),
            ("model.layers.0.linear_attn.in_proj_qkv.weight", vec![96, 40], Init::Linear, {
                vec![8 * 40..16 * 40, 40 * 40..48 * 40, 72 * 40..84 * 40]
            }),
            (
                "model.layers.0.linear_attn.A_log",
                vec![48],
                Init::LogUniform(1.0, 16.0),
                vec![0..48],
            ),
            (
                "model.layers.0.linear_attn.dt_bias",
                vec![48],
                Init::Uniform(-0.5, 0.5),
                vec![12..24],
            ),
            ("model.norm.weight", vec![77], Init::Constant(1.0), vec![0..77]),
        ];
        for (name, shape, init, runs) in cases {
            let p = params(name, &shape, init, 0x5eed).unwrap();
            let host = fill_host(&p, &runs).unwrap();
            let mut out = stream.clone_htod(&vec![bf16::from_bits(0xFFFF); host.len()]).unwrap();
            fill_device(&stream, &p, &runs, &mut out).unwrap();
            let got = stream.clone_dtoh(&out).unwrap();
            let got: Vec<u32> = got.iter().map(|x| x.to_f32().to_bits()).collect();
            let want: Vec<u32> = host.iter().map(|x| x.to_bits()).collect();
            assert_eq!(got, want, "{name}: device != host");
        }
    }

    /// A shard filled through its runs equals the slice of the whole tensor.
    #[test]
    fn host_shards_equal_slices() {
        let p = params("w", &[12, 10], Init::Linear, 9).unwrap();
        let full = fill_host(&p, std::slice::from_ref(&(0..120))).unwrap();
        let cols: Vec<Range<usize>> = (0..12).map(|i| i * 10 + 4..i * 10 + 9).collect();
        let shard = fill_host(&p, &cols).unwrap();
        let want: Vec<f32> = cols.iter().flat_map(|r| full[r.clone()].iter().copied()).collect();
        assert_eq!(shard, want);
        // Large enough to use several parallel blocks.
        let big = fill_host(&p, std::slice::from_ref(&(0..3 * BLOCK + 7))).unwrap();
        let again = fill_host(&p, std::slice::from_ref(&(5..3 * BLOCK + 7))).unwrap();
        assert_eq!(&big[5..], &again[..]);
    }
}
