//! Checkpoint weights: safetensors (mmap, single file or sharded) and seeded dummy weights.
//!
//! A [`WeightSource`] hands out host tensors as f32 by name (bf16 / f16 / f32 sources are
//! converted); the model loader asks for exactly the tensors of the text model, checks each
//! shape, and uploads it to the backend. Tensors it never asks for (vision tower `model.visual.*`,
//! MTP head `mtp.*`) are skipped without being read.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use memmap2::Mmap;
use safetensors::tensor::Metadata;
use safetensors::{Dtype, SafeTensors};

use crate::config::ModelConfig;
use crate::error::{EngineError, Result};
use crate::shard::Part;

/// A host tensor: f32 data, row-major, with its shape.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    /// Shape, outermost first (torch order).
    pub shape: Vec<usize>,
    /// Row-major f32 elements (`shape.iter().product()` of them).
    pub data: Vec<f32>,
}

/// How a [`WeightSource`] initialises a tensor it synthesises ([`DummyWeights`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// Uniform with the standard deviation `1/sqrt(fan_in)` (fan_in = last dim): linear layers.
    Linear,
    /// Standard normal-scale values (std 1): the embedding table.
    Embedding,
    /// All `value` (norm weights: 0 for the `(1 + w)` norms, 1 for the gated norm).
    Constant(f32),
    /// Uniform in `[lo, hi)`.
    Uniform(f32, f32),
    /// `ln(uniform(lo, hi))`: `A_log`.
    LogUniform(f32, f32),
}

/// A provider of named f32 host tensors.
pub trait WeightSource {
    /// Fetch tensor `name`, which must have exactly `shape`; `init` says how a synthetic source
    /// fills it (checkpoint sources ignore it).
    ///
    /// # Errors
    /// [`EngineError::Weights`] naming the tensor if it is missing, has another shape, or an
    /// unsupported dtype.
    fn get(&mut self, name: &str, shape: &[usize], init: Init) -> Result<HostTensor>;

    /// Fetch the part `part` (a tensor-parallel shard, [`Part`]) of tensor `name`, whose full
    /// shape is `shape`; the result has the part's local shape ([`Part::local_shape`]). The
    /// default fetches the whole tensor and slices it; checkpoint and dummy sources override it
    /// to read / generate only the selected elements.
    ///
    /// # Errors
    /// As [`WeightSource::get`], and [`EngineError::Weights`] for a part outside the shape.
    fn get_part(
        &mut self,
        name: &str,
        shape: &[usize],
        part: &Part,
        init: Init,
    ) -> Result<HostTensor> {
        let local = part.local_shape(name, shape)?;
        let full = self.get(name, shape, init)?;
        Ok(HostTensor { shape: local, data: part.slice(name, shape, &full.data)? })
    }

    /// Whether tensor `name` exists (synthetic sources: always true).
    fn contains(&self, name: &str) -> bool;

    /// `Some(seed)` for seeded dummy weights ([`DummyWeights`]): a backend may then generate
    /// each tensor where it lives (`Backend::dummy`) with the same values.
    fn dummy_seed(&self) -> Option<u64> {
        None
    }

    /// Total bytes of the source (for the progress bar), if known.
    fn total_bytes(&self) -> Option<u64> {
        None
    }
}

/// Safetensors checkpoint, memory-mapped: `model.safetensors`, or the shards listed in
/// `model.safetensors.index.json` (`weight_map`: tensor name -> shard file).
pub struct SafetensorsWeights {
    /// (path, map, header length, parsed header) per file.
    files: Vec<(PathBuf, Mmap, usize, Metadata)>,
    /// tensor name -> index into `files`.
    index: HashMap<String, usize>,
}

impl std::fmt::Debug for SafetensorsWeights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SafetensorsWeights")
            .field("files", &self.files.iter().map(|f| &f.0).collect::<Vec<_>>())
            .field("tensors", &self.index.len())
            .finish()
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> EngineError + '_ {
    move |source| EngineError::Io { path: path.to_path_buf(), source }
}

impl SafetensorsWeights {
    /// Open the checkpoint in `dir`: `model.safetensors.index.json` if present, else
    /// `model.safetensors`, else every `*.safetensors` file in the directory.
    ///
    /// # Errors
    /// [`EngineError::Io`] for unreadable files; [`EngineError::Weights`] for a malformed index or
    /// safetensors header, or a directory without safetensors files.
    pub fn open(dir: &Path) -> Result<Self> {
        let index_path = dir.join("model.safetensors.index.json");
        let mut names: Vec<PathBuf> = if index_path.is_file() {
            let text = std::fs::read_to_string(&index_path).map_err(io_err(&index_path))?;
            let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
                EngineError::Weights(format!("{}: invalid JSON: {e}", index_path.display()))
            })?;
            let map = v.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| {
                EngineError::Weights(format!("{}: no `weight_map` object", index_path.display()))
            })?;
            let mut files: Vec<PathBuf> =
                map.values().filter_map(|f| f.as_str()).map(|f| dir.join(f)).collect();
            files.sort();
            files.dedup();
            files
        } else if dir.join("model.safetensors").is_file() {
            vec![dir.join("model.safetensors")]
        } else {
            let rd = std::fs::read_dir(dir).map_err(io_err(dir))?;
            rd.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
                .collect()
        };
        names.sort();
        if names.is_empty() {
            return Err(EngineError::Weights(format!(
                "{}: no model.safetensors, model.safetensors.index.json or *.safetensors",
                dir.display()
            )));
        }
        let mut files = Vec::with_capacity(names.len());
        let mut index = HashMap::new();
        for (i, path) in names.into_iter().enumerate() {
            let file = File::open(&path).map_err(io_err(&path))?;
            // SAFETY: the checkpoint file is opened read-only and treated as immutable for the
            // lifetime of the map; like every mmap-based loader we rely on nobody truncating or
            // rewriting the file while the engine is loading it.
            let map = unsafe { Mmap::map(&file) }.map_err(io_err(&path))?;
            let (n, meta) = SafeTensors::read_metadata(&map).map_err(|e| {
                EngineError::Weights(format!("{}: bad safetensors file: {e}", path.display()))
            })?;
            for name in meta.tensors().keys() {
                index.insert(name.clone(), i);
            }
            files.push((path, map, n, meta));
        }
        Ok(Self { files, index })
    }

    /// Number of tensors in the checkpoint.
    #[must_use]
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether the checkpoint has no tensors.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }
}

/// Convert little-endian raw tensor bytes of `dtype` to f32.
///
/// # Errors
/// [`EngineError::Weights`] for dtypes other than BF16, F16, F32 (naming `name`).
pub fn to_f32(name: &str, dtype: Dtype, bytes: &[u8]) -> Result<Vec<f32>> {
    Ok(match dtype {
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|b| bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
            .collect(),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|b| f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
            .collect(),
        Dtype::F32 => {
            bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
        }
        other => {
            return Err(EngineError::Weights(format!(
                "tensor `{name}` has unsupported dtype {other:?} (supported: BF16, F16, F32)"
            )))
        }
    })
}

/// Whether `got` matches `want`, allowing size-1 dims to be dropped (HF `conv1d.weight` is
/// `[C, 1, W]` where the kernel wants `[C, W]`).
fn shape_matches(got: &[usize], want: &[usize]) -> bool {
    let squeeze = |s: &[usize]| s.iter().copied().filter(|&d| d != 1).collect::<Vec<_>>();
    got == want || squeeze(got) == squeeze(want)
}

impl SafetensorsWeights {
    /// The raw bytes, dtype and stored shape of tensor `name`, checked against `shape`.
    fn raw(&self, name: &str, shape: &[usize]) -> Result<(&[u8], Dtype)> {
        let &fi = self.index.get(name).ok_or_else(|| {
            EngineError::Weights(format!(
                "missing tensor `{name}` (expected shape {shape:?}) in {}",
                self.files.iter().map(|f| f.0.display().to_string()).collect::<Vec<_>>().join(", ")
            ))
        })?;
        let (path, map, n, meta) = &self.files[fi];
        let info = meta.info(name).ok_or_else(|| {
            EngineError::Weights(format!("tensor `{name}` not in its file's header"))
        })?;
        if !shape_matches(&info.shape, shape) {
            return Err(EngineError::Weights(format!(
                "tensor `{name}` has shape {:?}, expected {shape:?}",
                info.shape
            )));
        }
        let (start, end) = info.data_offsets;
        let bytes = map.get(8 + n + start..8 + n + end).ok_or_else(|| {
            EngineError::Weights(format!(
                "tensor `{name}`: data offsets {start}..{end} past the end of {}",
                path.display()
            ))
        })?;
        let want_bytes = shape.iter().product::<usize>() * info.dtype.bitsize() / 8;
        if bytes.len() != want_bytes {
            return Err(EngineError::Weights(format!(
                "tensor `{name}` has {} bytes of data, expected {want_bytes}",
                bytes.len()
            )));
        }
        Ok((bytes, info.dtype))
    }
}

impl WeightSource for SafetensorsWeights {
    fn get(&mut self, name: &str, shape: &[usize], _init: Init) -> Result<HostTensor> {
        let (bytes, dtype) = self.raw(name, shape)?;
        let data = to_f32(name, dtype, bytes)?;
        Ok(HostTensor { shape: shape.to_vec(), data })
    }

    /// Reads only the selected element runs from the mapped file: a rank never converts (or
    /// touches the pages of) rows / columns it does not keep.
    fn get_part(
        &mut self,
        name: &str,
        shape: &[usize],
        part: &Part,
        _init: Init,
    ) -> Result<HostTensor> {
        let local = part.local_shape(name, shape)?;
        let (bytes, dtype) = self.raw(name, shape)?;
        let width = dtype.bitsize() / 8;
        let mut data = Vec::with_capacity(local.iter().product());
        for r in part.runs(shape) {
            data.extend(to_f32(name, dtype, &bytes[r.start * width..r.end * width])?);
        }
        Ok(HostTensor { shape: local, data })
    }

    fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    fn total_bytes(&self) -> Option<u64> {
        Some(self.files.iter().map(|f| f.1.len() as u64).sum())
    }
}

/// Seeded random weights of the right shapes and sane scales for a config alone
/// (`--load-format dummy`): benchmarks at real sizes without a checkpoint.
///
/// Element `i` of tensor `name` is a pure function of `(seed, name, i)` (the `init.dummy` op's
/// counter-based hash, [`crate::dummy_init`]), so the values do not depend on load order, thread
/// count, sharding or backend: a tensor-parallel rank generates exactly its own rows / columns
/// and gets the same values as the TP=1 model, and the CUDA backend generates them on the device
/// bit for bit equal to the CPU's. Scales: linear layers uniform with std `1/sqrt(fan_in)`, embeddings
/// std 1, `(1 + w)` norms 0, the gated norm 1, `A_log = ln(U(1, 16))`, `dt_bias`
/// `U(-0.5, 0.5)`, conv taps `U(-0.5, 0.5)` (as `tools/make_fixtures.py`); every value is rounded
/// through bf16 like a real checkpoint, so CPU and GPU backends see the same weights.
#[derive(Clone, Debug)]
pub struct DummyWeights {
    seed: u64,
}

impl DummyWeights {
    /// A dummy source with base seed `seed`.
    #[must_use]
    pub fn new(seed: u64) -> Self {
        Self { seed }
    }

    fn fill(
        &self,
        name: &str,
        shape: &[usize],
        runs: &[std::ops::Range<usize>],
        init: Init,
    ) -> Result<Vec<f32>> {
        crate::dummy_init::fill_host(
            &crate::dummy_init::params(name, shape, init, self.seed)?,
            runs,
        )
    }

    /// The model seed.
    #[must_use]
    pub fn seed(&self) -> u64 {
        self.seed
    }
}

impl WeightSource for DummyWeights {
    fn get(&mut self, name: &str, shape: &[usize], init: Init) -> Result<HostTensor> {
        self.get_part(name, shape, &Part::Full, init)
    }

    fn get_part(
        &mut self,
        name: &str,
        shape: &[usize],
        part: &Part,
        init: Init,
    ) -> Result<HostTensor> {
        let local = part.local_shape(name, shape)?;
        let data = self.fill(name, shape, &part.runs(shape), init)?;
        Ok(HostTensor { shape: local, data })
    }

    fn contains(&self, _name: &str) -> bool {
        true
    }

    fn dummy_seed(&self) -> Option<u64> {
        Some(self.seed)
    }
}

/// Expected tensors of a config: `(name, shape, init)` in load order. Names carry the
/// architecture's prefix (`model.` or `model.language_model.`); the LM head is `lm_head.weight`
/// unless embeddings are tied.
#[must_use]
pub fn expected_tensors(cfg: &ModelConfig) -> Vec<(String, Vec<usize>, Init)> {
    use crate::config::LayerType;
    let p = cfg.arch.weight_prefix();
    let (d, inter) = (cfg.hidden_size, cfg.intermediate_size);
    let mut v = vec![(format!("{p}embed_tokens.weight"), vec![cfg.vocab_size, d], Init::Embedding)];
    for (i, t) in cfg.layer_types.iter().enumerate() {
        let l = format!("{p}layers.{i}.");
        v.push((format!("{l}input_layernorm.weight"), vec![d], Init::Constant(0.0)));
        match t {
            LayerType::LinearAttention => {
                let a = format!("{l}linear_attn.");
                let (hv, vd) = (cfg.linear_num_value_heads, cfg.linear_value_dim());
                v.push((format!("{a}in_proj_qkv.weight"), vec![cfg.conv_dim(), d], Init::Linear));
                v.push((format!("{a}in_proj_z.weight"), vec![vd, d], Init::Linear));
                v.push((format!("{a}in_proj_b.weight"), vec![hv, d], Init::Linear));
                v.push((format!("{a}in_proj_a.weight"), vec![hv, d], Init::Linear));
                v.push((
                    format!("{a}conv1d.weight"),
                    vec![cfg.conv_dim(), 1, cfg.conv_kernel],
                    Init::Uniform(-0.5, 0.5),
                ));
                v.push((format!("{a}A_log"), vec![hv], Init::LogUniform(1.0, 16.0)));
                v.push((format!("{a}dt_bias"), vec![hv], Init::Uniform(-0.5, 0.5)));
                v.push((
                    format!("{a}norm.weight"),
                    vec![cfg.linear_value_head_dim],
                    Init::Constant(1.0),
                ));
                v.push((format!("{a}out_proj.weight"), vec![d, vd], Init::Linear));
            }
            LayerType::FullAttention => {
                let a = format!("{l}self_attn.");
                let (hd, hq, hkv) =
                    (cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads);
                v.push((format!("{a}q_proj.weight"), vec![hq * hd * 2, d], Init::Linear));
                v.push((format!("{a}k_proj.weight"), vec![hkv * hd, d], Init::Linear));
                v.push((format!("{a}v_proj.weight"), vec![hkv * hd, d], Init::Linear));
                v.push((format!("{a}o_proj.weight"), vec![d, hq * hd], Init::Linear));
                v.push((format!("{a}q_norm.weight"), vec![hd], Init::Constant(0.0)));
                v.push((format!("{a}k_norm.weight"), vec![hd], Init::Constant(0.0)));
            }
        }
        v.push((format!("{l}post_attention_layernorm.weight"), vec![d], Init::Constant(0.0)));
        v.push((format!("{l}mlp.gate_proj.weight"), vec![inter, d], Init::Linear));
        v.push((format!("{l}mlp.up_proj.weight"), vec![inter, d], Init::Linear));
        v.push((format!("{l}mlp.down_proj.weight"), vec![d, inter], Init::Linear));
    }
    v.push((format!("{p}norm.weight"), vec![d], Init::Constant(0.0)));
    if !cfg.tie_word_embeddings {
        v.push(("lm_head.weight".into(), vec![cfg.vocab_size, d], Init::Linear));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions() {
        let b = bf16::from_f32(1.5).to_bits().to_le_bytes();
        assert_eq!(to_f32("x", Dtype::BF16, &b).unwrap(), vec![1.5]);
        let h = f16::from_f32(-2.25).to_bits().to_le_bytes();
        assert_eq!(to_f32("x", Dtype::F16, &h).unwrap(), vec![-2.25]);
        assert_eq!(to_f32("x", Dtype::F32, &3.0f32.to_le_bytes()).unwrap(), vec![3.0]);
        let e = to_f32("blk.w", Dtype::I64, &[0; 8]).unwrap_err().to_string();
        assert!(e.contains("blk.w") && e.contains("I64"), "{e}");
    }

    #[test]
    fn shapes() {
        assert!(shape_matches(&[8, 1, 4], &[8, 1, 4]));
        assert!(shape_matches(&[8, 4], &[8, 1, 4]));
        assert!(!shape_matches(&[4, 8], &[8, 4]));
    }

    #[test]
    fn dummy_is_seeded() {
        let mut a = DummyWeights::new(7);
        let mut b = DummyWeights::new(7);
        let x = a.get("w", &[4, 16], Init::Linear).unwrap();
        let y = b.get("w", &[4, 16], Init::Linear).unwrap();
        assert_eq!(x, y);
        let z = a.get("w2", &[4, 16], Init::Linear).unwrap();
        assert_ne!(x.data, z.data);
        assert!(x.data.iter().all(|v| v.abs() <= 3f32.sqrt() / 4.0 + 1e-3));
        // Roughly uniform: mean ~0, std ~1/sqrt(fan_in).
        let big = a.get("w3", &[64, 256], Init::Linear).unwrap().data;
        let mean = big.iter().sum::<f32>() / big.len() as f32;
        let std = (big.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / big.len() as f32).sqrt();
        assert!(mean.abs() < 3e-3 && (std - 1.0 / 16.0).abs() < 2e-3, "{mean} {std}");
    }

    /// A part of a dummy or checkpoint tensor equals the same slice of the whole tensor.
    #[test]
    fn parts_equal_slices_of_the_whole() {
        let shape = [6usize, 5];
        let parts =
            [Part::Full, Part::Rows(vec![4..6, 0..1]), Part::Cols(1..4), Part::Rows(vec![])];
        let mut d = DummyWeights::new(3);
        let whole = d.get("t", &shape, Init::Linear).unwrap();
        for p in &parts {
            let got = d.get_part("t", &shape, p, Init::Linear).unwrap();
            assert_eq!(got.data, p.slice("t", &shape, &whole.data).unwrap(), "{p:?}");
            assert_eq!(got.shape, p.local_shape("t", &shape).unwrap());
        }
    }
}
