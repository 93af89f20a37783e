//! Memory-mapped safetensors shards behind one name -> tensor map.
//!
//! Layout of a safetensors file: `u64` little-endian header length `n`, `n` bytes of JSON header
//! (`{name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}`), then the data
//! section; offsets are relative to the data section.
//!
//! Algorithm: at open, every shard is mmapped and its header parsed and validated in full; tensor
//! bytes are only touched when a tensor is loaded. Validation (same rules as the reference
//! `safetensors` loader, but with messages that name the tensor): header length within the file and
//! under 100 MB; known dtype; `end - begin == numel * dtype size` (checked arithmetic); every range
//! inside the data section; ranges sorted by offset tile the data section exactly (no overlap, no
//! gap, no trailing bytes — a truncated file fails here); tensor names unique across shards.
//!
//! GGUF models ([`TensorStore::from_gguf`]) fill the same map: each entry is a GGUF tensor under the
//! Hugging Face name it was converted from, with the inverse of the converter's changes
//! (`gguf::convert`), dequantized to f32 on `load_f32` (and once, kept, on `raw`); F32/BF16/F16
//! tensors without a transform are handed out as stored, and quantized weight matrices as their ggml
//! blocks with the converter's row and column orders undone on whole rows ([`TensorStore::quantized`]).
//!
//! Invariant: every stored entry's byte range lies inside its shard's mmap, so `raw`/`load_f32`
//! slice without panicking.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use memmap2::Mmap;
use safetensors::Dtype;
use serde::Deserialize;

use crate::gguf::convert::{self, Transform};
use crate::gguf::names::{map_tensor, Layout};
use crate::gguf::{types, GgmlType, GgufSet};
use crate::LoadError;

/// The dtypes weights may be stored in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    BF16,
    F16,
}

impl DType {
    /// Bytes per element.
    pub fn size_in_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::BF16 | DType::F16 => 2,
        }
    }

    fn from_stored(dtype: Dtype) -> Option<Self> {
        match dtype {
            Dtype::F32 => Some(DType::F32),
            Dtype::BF16 => Some(DType::BF16),
            Dtype::F16 => Some(DType::F16),
            _ => None,
        }
    }
}

/// Same limit as the reference loader: a bigger header is a corrupt length, not a real header.
const MAX_HEADER_BYTES: usize = 100_000_000;

/// The ggml block types whose weight matrices the CPU kernels run without dequantizing
/// (`kernels::QuantFormat`).
pub const QUANTIZED_TYPES: [&str; 8] = [
    "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K",
];

/// A weight matrix [rows, cols] in its ggml blocks ([`TensorStore::quantized`]).
#[derive(Debug, Clone)]
pub struct QuantizedTensor {
    /// ggml's type name ("Q4_K", ...).
    pub ggml_type: &'static str,
    pub rows: usize,
    pub cols: usize,
    /// `rows` rows of blocks, in Hugging Face row order.
    pub data: Vec<u8>,
    /// When the columns are stored in another order (value heads tiled by the converter): the input
    /// element each stored column multiplies, `x_stored[c] = x[input_order[c]]`.
    pub input_order: Option<Vec<usize>>,
}

/// How a tensor is stored.
#[derive(Debug)]
pub(crate) enum Stored {
    Safetensors(Dtype),
    Gguf {
        ggml_type: GgmlType,
        /// Inverse converter steps, applied in order after dequantization.
        transforms: Vec<Transform>,
        /// f32 little-endian bytes, made by the first `raw` of a converted tensor.
        converted: OnceLock<Vec<u8>>,
    },
    /// A fine-grained FP8 weight (`F8_E4M3`) whose blocks of `block` = [rows, cols] elements scale by
    /// the tensor `scale` (`crate::fp8`).
    Fp8 {
        scale: String,
        block: [usize; 2],
        /// f32 little-endian bytes (dequantized), made by the first `raw`.
        converted: OnceLock<Vec<u8>>,
    },
}

/// One tensor's location.
#[derive(Debug)]
pub(crate) struct Entry {
    shard: usize,
    pub(crate) stored: Stored,
    /// Row-major, outermost first (the Hugging Face shape for GGUF tensors).
    pub(crate) shape: Vec<usize>,
    /// Absolute byte range in the shard file.
    begin: usize,
    end: usize,
}

#[derive(Debug)]
struct Shard {
    path: PathBuf,
    mmap: Mmap,
}

/// All tensors of a checkpoint, memory-mapped.
#[derive(Debug)]
pub struct TensorStore {
    dir: PathBuf,
    shards: Vec<Shard>,
    pub(crate) entries: HashMap<String, Entry>,
    /// Quantize the weight matrices at load (`--quantize`); the model's loader reads it.
    quantize: Option<Quantize>,
}

/// A request to quantize a bf16/f32 checkpoint's weight matrices at load, into the block formats of the
/// CPU's quantized kernels (`--quantize`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Quantize {
    /// Every weight matrix Q8_0 (8.5 bits a weight).
    Q8_0,
    /// llama.cpp's Q4_K_M mix: Q4_K matrices (4.5 bits), the LM head Q6_K; rows that do not divide into
    /// 256-blocks fall back as llama.cpp's quantizer does (Q4_K to Q5_0, Q6_K to Q8_0).
    Q4K,
    /// Fine-grained FP8 as Qwen's FP8 checkpoints: e4m3 weights with a scale per 128x128 block (8 bits
    /// a weight); the LM head and embeddings stay as stored, as in those checkpoints.
    Fp8,
}

impl Quantize {
    /// The `--quantize` value.
    pub fn name(self) -> &'static str {
        match self {
            Quantize::Q8_0 => "q8_0",
            Quantize::Q4K => "q4_k",
            Quantize::Fp8 => "fp8",
        }
    }
}

impl std::str::FromStr for Quantize {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "q8_0" => Ok(Quantize::Q8_0),
            "q4_k" | "q4_k_m" => Ok(Quantize::Q4K),
            "fp8" => Ok(Quantize::Fp8),
            _ => Err(format!("expected q8_0, q4_k or fp8 (got {s:?})")),
        }
    }
}

#[derive(Deserialize)]
struct HeaderEntry {
    dtype: String,
    shape: Vec<usize>,
    data_offsets: (usize, usize),
}

impl TensorStore {
    /// Opens `dir/model.safetensors` if present (transformers' preference), else
    /// `dir/model.safetensors.index.json` and every shard it names.
    pub fn open(dir: &Path) -> Result<Self, LoadError> {
        let single = dir.join("model.safetensors");
        let index = dir.join("model.safetensors.index.json");
        if single.is_file() {
            Self::open_files(dir, &[single])
        } else if index.is_file() {
            Self::open_index(dir, &index)
        } else {
            Err(LoadError::NoWeights {
                path: dir.to_path_buf(),
            })
        }
    }

    /// Opens the given safetensors files as one store (`dir` names the checkpoint in errors).
    pub fn open_files(dir: &Path, files: &[PathBuf]) -> Result<Self, LoadError> {
        let mut store = TensorStore {
            quantize: None,
            dir: dir.to_path_buf(),
            shards: Vec::new(),
            entries: HashMap::new(),
        };
        for file in files {
            store.add_shard(file)?;
        }
        Ok(store)
    }

    fn open_index(dir: &Path, index_path: &Path) -> Result<Self, LoadError> {
        let index = crate::json::read_object(index_path, "shard index")?;
        let index_error = |reason: String| LoadError::Index {
            path: index_path.to_path_buf(),
            reason,
        };
        let weight_map = index
            .get("weight_map")
            .ok_or_else(|| index_error("no `weight_map` object".to_string()))?
            .as_object()
            .ok_or_else(|| index_error("`weight_map` is not an object".to_string()))?;
        // Shards in first-seen order, each with one tensor it should hold (for error messages).
        let mut shard_names: Vec<(&str, &str)> = Vec::new();
        for (tensor, shard) in weight_map {
            let shard = shard
                .as_str()
                .ok_or_else(|| index_error(format!("weight_map[`{tensor}`] is not a file name")))?;
            if !is_plain_file_name(shard) {
                return Err(index_error(format!(
                    "weight_map[`{tensor}`] = `{shard}` is not a file name inside the checkpoint directory"
                )));
            }
            if !shard_names.iter().any(|(s, _)| *s == shard) {
                shard_names.push((shard, tensor));
            }
        }
        let mut files = Vec::with_capacity(shard_names.len());
        for (shard, tensor) in &shard_names {
            let file = dir.join(shard);
            if !file.is_file() {
                return Err(LoadError::MissingShard {
                    path: index_path.to_path_buf(),
                    shard: shard.to_string(),
                    tensor: tensor.to_string(),
                });
            }
            files.push(file);
        }
        let store = Self::open_files(dir, &files)?;
        // The index must describe the shards truthfully: a tensor listed under a shard that does
        // not hold it would otherwise surface later as a confusing "missing tensor".
        for (tensor, shard) in weight_map {
            let held_by = store
                .entries
                .get(tensor)
                .and_then(|e| store.shards.get(e.shard))
                .and_then(|s| s.path.file_name())
                .and_then(|n| n.to_str());
            if held_by != shard.as_str() {
                return Err(index_error(format!(
                    "tensor `{tensor}` is listed in `{}` but that shard does not hold it",
                    shard.as_str().unwrap_or_default()
                )));
            }
        }
        Ok(store)
    }

    fn add_shard(&mut self, path: &Path) -> Result<(), LoadError> {
        let file = File::open(path)
            .map_err(|e| LoadError::from_io(path.to_path_buf(), e, "safetensors shard"))?;
        let file_len = file
            .metadata()
            .map_err(|e| LoadError::Io {
                path: path.to_path_buf(),
                source: e,
            })?
            .len();
        let bad = |reason: String| LoadError::Safetensors {
            path: path.to_path_buf(),
            reason,
        };
        if file_len < 8 {
            return Err(bad(format!(
                "file is {file_len} bytes, shorter than the 8-byte header length (truncated?)"
            )));
        }
        // SAFETY: the map is read-only. Like every mmap-based weight loader we rely on the file not
        // being truncated or rewritten while the checkpoint is open; all offsets into it are
        // validated below against the length seen at map time.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| LoadError::Io {
            path: path.to_path_buf(),
            source: e,
        })?;
        let shard_index = self.shards.len();
        let entries = parse_header(&mmap).map_err(bad)?;
        for (name, mut entry) in entries {
            entry.shard = shard_index;
            if let Some(previous) = self.entries.get(&name) {
                let other = self
                    .shards
                    .get(previous.shard)
                    .map(|s| s.path.clone())
                    .unwrap_or_default();
                return Err(LoadError::DuplicateTensor {
                    path: path.to_path_buf(),
                    other,
                    tensor: name,
                });
            }
            self.entries.insert(name, entry);
        }
        self.shards.push(Shard {
            path: path.to_path_buf(),
            mmap,
        });
        Ok(())
    }

    /// The checkpoint directory this store was opened from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// All tensor names, in no particular order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The files opened, in shard order.
    pub fn shard_paths(&self) -> impl Iterator<Item = &Path> {
        self.shards.iter().map(|s| s.path.as_path())
    }

    /// The shard file holding `name`.
    pub fn path_of(&self, name: &str) -> Result<&Path, LoadError> {
        let entry = self.entry(name)?;
        Ok(self.shard_path(entry))
    }

    pub fn shape(&self, name: &str) -> Result<&[usize], LoadError> {
        Ok(&self.entry(name)?.shape)
    }

    /// The stored dtype; an error naming the tensor when it is not F32/BF16/F16.
    pub fn dtype(&self, name: &str) -> Result<DType, LoadError> {
        let entry = self.entry(name)?;
        self.weight_dtype(name, entry)
    }

    /// The stored dtype as the safetensors name ("BF16", "I64", "F8_E4M3", ...) or the ggml type name
    /// of a GGUF tensor ("Q4_K", "F32", ...), for any dtype.
    pub fn stored_dtype_name(&self, name: &str) -> Result<String, LoadError> {
        Ok(match &self.entry(name)?.stored {
            Stored::Safetensors(dtype) => format!("{dtype:?}"),
            Stored::Gguf { ggml_type, .. } => ggml_type.name().to_string(),
            Stored::Fp8 { .. } => "F8_E4M3".to_string(),
        })
    }

    /// Bytes `name` occupies in its file (a piece cut from a shared GGUF tensor, as qwen3next's
    /// `in_proj_b` / `in_proj_a` from `ssm_ba`, counts its share).
    pub fn stored_bytes(&self, name: &str) -> Result<usize, LoadError> {
        let entry = self.entry(name)?;
        let bytes = entry.end - entry.begin;
        if let Stored::Gguf { transforms, .. } = &entry.stored {
            for t in transforms {
                if let Transform::TakeGroupRows {
                    group_rows, len, ..
                } = *t
                {
                    return Ok(bytes / group_rows.max(1) * len);
                }
            }
        }
        Ok(bytes)
    }

    /// Asks the model's loader to quantize this checkpoint's weight matrices (`--quantize`). An error
    /// names a tensor when the checkpoint is already quantized (a GGUF's ggml blocks).
    pub fn set_quantize(&mut self, quantize: Option<Quantize>) -> Result<(), LoadError> {
        if let Some(q) = quantize {
            let stored = self.names().find_map(|name| {
                let ty = self.stored_dtype_name(name).ok()?;
                (QUANTIZED_TYPES.contains(&ty.as_str()) || ty == "F8_E4M3")
                    .then(|| (name.to_string(), ty))
            });
            if let Some((name, ty)) = stored {
                return Err(LoadError::Unsupported {
                    path: self.dir.clone(),
                    field: "--quantize".into(),
                    reason: format!(
                        "{} asked for a checkpoint already quantized (tensor `{name}` is {ty}): run it as stored",
                        q.name()
                    ),
                });
            }
        }
        self.quantize = quantize;
        Ok(())
    }

    /// The quantization asked for at load ([`TensorStore::set_quantize`]).
    pub fn quantize(&self) -> Option<Quantize> {
        self.quantize
    }

    /// Whether the tensors come from a GGUF file.
    pub fn is_gguf(&self) -> bool {
        self.entries
            .values()
            .any(|e| matches!(e.stored, Stored::Gguf { .. }))
    }

    /// Number of elements of `name`.
    pub fn numel(&self, name: &str) -> Result<usize, LoadError> {
        // Cannot overflow: validated at open (size in bytes fits the file).
        Ok(self.entry(name)?.shape.iter().product())
    }

    /// Loads `name` as f32 (converting BF16/F16), after checking its shape is `expected_shape`.
    pub fn load_f32(&self, name: &str, expected_shape: &[usize]) -> Result<Vec<f32>, LoadError> {
        let entry = self.entry(name)?;
        if entry.shape != expected_shape {
            return Err(LoadError::ShapeMismatch {
                path: self.shard_path(entry).to_path_buf(),
                tensor: name.to_string(),
                expected: expected_shape.to_vec(),
                found: entry.shape.clone(),
            });
        }
        let dtype = self.weight_dtype(name, entry)?;
        let bytes = self.bytes(entry)?;
        match &entry.stored {
            Stored::Safetensors(_) => Ok(convert_to_f32(dtype, bytes)),
            Stored::Gguf {
                ggml_type,
                transforms,
                ..
            } => self.convert_gguf(name, entry, *ggml_type, transforms, bytes),
            Stored::Fp8 { .. } => {
                let t = self.fp8_blocks(name, entry)?;
                Ok(t.dequantize())
            }
        }
    }

    fn convert_gguf(
        &self,
        name: &str,
        entry: &Entry,
        ggml_type: GgmlType,
        transforms: &[Transform],
        bytes: &[u8],
    ) -> Result<Vec<f32>, LoadError> {
        let bad = |reason: String| LoadError::Gguf {
            path: self.shard_path(entry).to_path_buf(),
            reason: format!("tensor `{name}`: {reason}"),
        };
        // The stored elements (more than the shape's for a `TakeGroupRows` piece).
        let stored = bytes.len() / ggml_type.block_bytes() * ggml_type.block_len();
        let mut values = vec![0f32; stored];
        types::dequantize(ggml_type, bytes, &mut values).map_err(bad)?;
        for t in transforms {
            t.apply(&mut values, &entry.shape).map_err(bad)?;
        }
        if values.len() != entry.shape.iter().product::<usize>() {
            return Err(bad(format!(
                "{} values for shape {:?}",
                values.len(),
                entry.shape
            )));
        }
        Ok(values)
    }

    /// A GGUF weight matrix `name` of shape [rows, cols] stored in a ggml block type kept quantized
    /// (`QUANTIZED_TYPES`): its block rows in Hugging Face row order; None for any other tensor (then
    /// `load_f32` / `raw` serve it). An error names the tensor when its shape is not `expected`.
    pub fn quantized(
        &self,
        name: &str,
        expected: [usize; 2],
    ) -> Result<Option<QuantizedTensor>, LoadError> {
        let entry = self.entry(name)?;
        let Stored::Gguf {
            ggml_type,
            transforms,
            ..
        } = &entry.stored
        else {
            return Ok(None);
        };
        if !QUANTIZED_TYPES.contains(&ggml_type.name()) {
            return Ok(None);
        }
        if entry.shape != expected {
            return Err(LoadError::ShapeMismatch {
                path: self.shard_path(entry).to_path_buf(),
                tensor: name.to_string(),
                expected: expected.to_vec(),
                found: entry.shape.clone(),
            });
        }
        let bad = |reason: String| LoadError::Gguf {
            path: self.shard_path(entry).to_path_buf(),
            reason: format!("tensor `{name}`: {reason}"),
        };
        let [rows, cols] = expected;
        let bytes = self.bytes(entry)?;
        let row_bytes = cols / ggml_type.block_len() * ggml_type.block_bytes();
        if cols % ggml_type.block_len() != 0 || row_bytes == 0 || bytes.len() % row_bytes != 0 {
            return Err(bad(format!(
                "{} rows of {cols} values do not divide into {}-value blocks",
                ggml_type.name(),
                ggml_type.block_len()
            )));
        }
        let stored_rows = bytes.len() / row_bytes;
        let Some(order) = convert::block_order(transforms, stored_rows, rows, cols).map_err(bad)?
        else {
            return Ok(None);
        };
        let mut data = Vec::with_capacity(rows * row_bytes);
        for &r in &order.rows {
            data.extend_from_slice(&bytes[r * row_bytes..(r + 1) * row_bytes]);
        }
        Ok(Some(QuantizedTensor {
            ggml_type: ggml_type.name(),
            rows,
            cols,
            data,
            input_order: order.columns,
        }))
    }

    /// The stored bytes (little-endian) with dtype and shape, for uploading without conversion.
    pub fn raw(&self, name: &str) -> Result<(DType, &[usize], &[u8]), LoadError> {
        let entry = self.entry(name)?;
        let dtype = self.weight_dtype(name, entry)?;
        let bytes = self.bytes(entry)?;
        match &entry.stored {
            Stored::Gguf {
                ggml_type,
                transforms,
                converted,
            } if !is_passthrough(*ggml_type, transforms) => {
                if converted.get().is_none() {
                    let values = self.convert_gguf(name, entry, *ggml_type, transforms, bytes)?;
                    let le: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                    // A concurrent caller may have set it first; both computed the same bytes.
                    let _ = converted.set(le);
                }
                let le = converted.get().map(Vec::as_slice).unwrap_or_default();
                Ok((dtype, &entry.shape, le))
            }
            Stored::Fp8 { converted, .. } => {
                if converted.get().is_none() {
                    let values = self.fp8_blocks(name, entry)?.dequantize();
                    let le: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                    let _ = converted.set(le);
                }
                let le = converted.get().map(Vec::as_slice).unwrap_or_default();
                Ok((dtype, &entry.shape, le))
            }
            _ => Ok((dtype, &entry.shape, bytes)),
        }
    }

    /// The tensors of a GGUF model under their Hugging Face names (`layout` from its metadata);
    /// tensors the name map does not know keep their GGUF names.
    pub(crate) fn from_gguf(set: GgufSet, layout: &Layout) -> Result<Self, LoadError> {
        let dir = set.path().to_path_buf();
        let mut store = TensorStore {
            quantize: None,
            dir,
            shards: Vec::new(),
            entries: HashMap::new(),
        };
        for (shard, part) in set.parts.into_iter().enumerate() {
            let (path, mmap, tensors) = part.into_parts();
            for info in tensors {
                let mut shape = info.shape();
                let pieces = match map_tensor(&info.name, layout) {
                    Some(m) if !m.expert_parts.is_empty() => {
                        split_experts(&path, &info, &m.hf_name, m.expert_parts)?
                    }
                    Some(m) if m.ba_groups.is_some() => {
                        let (groups, r) = m.ba_groups.unwrap_or_default();
                        let cols = shape.last().copied().unwrap_or(0);
                        ["b.weight", "a.weight"]
                            .iter()
                            .enumerate()
                            .map(|(k, part)| {
                                let take = Transform::TakeGroupRows {
                                    groups,
                                    group_rows: 2 * r,
                                    start: k * r,
                                    len: r,
                                };
                                let name = format!("{}{part}", m.hf_name);
                                (
                                    name,
                                    vec![take],
                                    vec![groups * r, cols],
                                    info.begin,
                                    info.end,
                                )
                            })
                            .collect()
                    }
                    Some(m) => {
                        if m.unsqueeze_1 && shape.len() == 2 {
                            shape.insert(1, 1);
                        }
                        vec![(m.hf_name, m.transforms, shape, info.begin, info.end)]
                    }
                    None => vec![(info.name.clone(), Vec::new(), shape, info.begin, info.end)],
                };
                for (name, transforms, shape, begin, end) in pieces {
                    let entry = Entry {
                        shard,
                        stored: Stored::Gguf {
                            ggml_type: info.ggml_type,
                            transforms,
                            converted: OnceLock::new(),
                        },
                        shape,
                        begin,
                        end,
                    };
                    if store.entries.insert(name.clone(), entry).is_some() {
                        return Err(LoadError::DuplicateTensor {
                            path: path.clone(),
                            other: path.clone(),
                            tensor: format!("{name} (from GGUF `{}`)", info.name),
                        });
                    }
                }
            }
            store.shards.push(Shard { path, mmap });
        }
        Ok(store)
    }

    pub(crate) fn entry(&self, name: &str) -> Result<&Entry, LoadError> {
        self.entries
            .get(name)
            .ok_or_else(|| LoadError::MissingTensor {
                path: self.dir.clone(),
                tensor: name.to_string(),
            })
    }

    pub(crate) fn shard_path(&self, entry: &Entry) -> &Path {
        self.shards
            .get(entry.shard)
            .map(|s| s.path.as_path())
            .unwrap_or(&self.dir)
    }

    fn weight_dtype(&self, name: &str, entry: &Entry) -> Result<DType, LoadError> {
        match &entry.stored {
            Stored::Safetensors(dtype) => {
                DType::from_stored(*dtype).ok_or_else(|| LoadError::UnsupportedDtype {
                    path: self.shard_path(entry).to_path_buf(),
                    tensor: name.to_string(),
                    dtype: format!("{dtype:?}"),
                })
            }
            Stored::Gguf {
                ggml_type,
                transforms,
                ..
            } => {
                if !ggml_type.is_supported() {
                    return Err(LoadError::UnsupportedGgmlType {
                        path: self.shard_path(entry).to_path_buf(),
                        tensor: name.to_string(),
                        ggml_type: ggml_type.name(),
                        supported: types::DEQUANTIZED_TYPES,
                    });
                }
                Ok(match ggml_type {
                    GgmlType::BF16 if transforms.is_empty() => DType::BF16,
                    GgmlType::F16 if transforms.is_empty() => DType::F16,
                    _ => DType::F32,
                })
            }
            // Served dequantized to f32 by `load_f32` / `raw`; the kernels take the blocks (`fp8`).
            Stored::Fp8 { .. } => Ok(DType::F32),
        }
    }

    pub(crate) fn bytes(&self, entry: &Entry) -> Result<&[u8], LoadError> {
        // Always Some by the invariant; the error arm keeps this panic-free regardless.
        self.shards
            .get(entry.shard)
            .and_then(|s| s.mmap.get(entry.begin..entry.end))
            .ok_or_else(|| LoadError::Safetensors {
                path: self.shard_path(entry).to_path_buf(),
                reason: format!(
                    "byte range {}..{} lies outside the file",
                    entry.begin, entry.end
                ),
            })
    }
}

/// One tensor of a GGUF-backed store: name, inverse transforms, shape, absolute byte range.
type Piece = (String, Vec<Transform>, Vec<usize>, usize, usize);

/// A 3-D expert tensor `[E, rows, cols]` as per-expert `[rows / parts, cols]` tensors named
/// `{prefix}{e}.{part}`. Each is a contiguous byte range: rows are whole blocks.
fn split_experts(
    path: &Path,
    info: &crate::gguf::TensorInfo,
    prefix: &str,
    parts: &[&str],
) -> Result<Vec<Piece>, LoadError> {
    let shape = info.shape();
    let bad = |reason: String| LoadError::Gguf {
        path: path.to_path_buf(),
        reason: format!("tensor `{}` {shape:?}: {reason}", info.name),
    };
    let &[experts, rows, cols] = shape.as_slice() else {
        return Err(bad("expert tensors have 3 dimensions".into()));
    };
    if experts == 0 || !rows.is_multiple_of(parts.len()) {
        return Err(bad(format!(
            "cannot split into {} parts per expert",
            parts.len()
        )));
    }
    let part_bytes = (info.end - info.begin) / experts / parts.len();
    // Empty experts are corrupt; requiring bytes also bounds the entries made by the file's size.
    if part_bytes == 0 {
        return Err(bad("experts of zero bytes".into()));
    }
    let mut out = Vec::with_capacity(experts * parts.len());
    for e in 0..experts {
        for (k, part) in parts.iter().enumerate() {
            let begin = info.begin + (e * parts.len() + k) * part_bytes;
            out.push((
                format!("{prefix}{e}.{part}"),
                Vec::new(),
                vec![rows / parts.len(), cols],
                begin,
                begin + part_bytes,
            ));
        }
    }
    Ok(out)
}

/// A GGUF tensor handed out as stored (no conversion).
fn is_passthrough(ggml_type: GgmlType, transforms: &[Transform]) -> bool {
    transforms.is_empty() && matches!(ggml_type, GgmlType::F32 | GgmlType::BF16 | GgmlType::F16)
}

/// A name in `weight_map` must stay inside the checkpoint directory.
fn is_plain_file_name(name: &str) -> bool {
    let p = Path::new(name);
    !name.is_empty()
        && p.components().count() == 1
        && matches!(p.components().next(), Some(std::path::Component::Normal(_)))
}

/// Parses and validates a whole safetensors file image; entries come back with `shard == 0`.
fn parse_header(file: &[u8]) -> Result<Vec<(String, Entry)>, String> {
    let file_len = file.len();
    let len_bytes: [u8; 8] = file
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| {
            format!("file is {file_len} bytes, shorter than the 8-byte header length")
        })?;
    let header_len = u64::from_le_bytes(len_bytes);
    let data_start = usize::try_from(header_len)
        .ok()
        .and_then(|n| n.checked_add(8))
        .filter(|&end| end <= file_len)
        .ok_or_else(|| {
            format!(
                "header length {header_len} runs past the end of the file ({file_len} bytes; truncated or not a safetensors file)"
            )
        })?;
    if data_start - 8 > MAX_HEADER_BYTES {
        return Err(format!(
            "header length {header_len} exceeds the {MAX_HEADER_BYTES}-byte limit"
        ));
    }
    let header_text = file
        .get(8..data_start)
        .and_then(|b| std::str::from_utf8(b).ok())
        .ok_or_else(|| "header is not valid UTF-8".to_string())?;
    let header: HashMap<String, serde_json::Value> = serde_json::from_str(header_text)
        .map_err(|e| format!("header is not a JSON object: {e}"))?;
    let data_len = file_len - data_start;

    let mut entries = Vec::with_capacity(header.len());
    for (name, value) in header {
        if name == "__metadata__" {
            continue;
        }
        let h: HeaderEntry = serde_json::from_value(value)
            .map_err(|e| format!("tensor `{name}`: malformed header entry: {e}"))?;
        let dtype: Dtype = serde_json::from_value(serde_json::Value::String(h.dtype.clone()))
            .map_err(|_| format!("tensor `{name}`: unknown dtype `{}`", h.dtype))?;
        let (begin, end) = h.data_offsets;
        if end < begin {
            return Err(format!(
                "tensor `{name}`: data_offsets [{begin}, {end}] end before they begin"
            ));
        }
        let nbits = h
            .shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .and_then(|numel| numel.checked_mul(dtype.bitsize()))
            .ok_or_else(|| format!("tensor `{name}`: shape {:?} overflows", h.shape))?;
        if nbits % 8 != 0 || nbits / 8 != end - begin {
            return Err(format!(
                "tensor `{name}`: shape {:?} of {dtype:?} needs {} bits but data_offsets [{begin}, {end}] span {} bytes",
                h.shape,
                nbits,
                end - begin
            ));
        }
        if end > data_len {
            return Err(format!(
                "tensor `{name}`: data_offsets [{begin}, {end}] run past the data section ({data_len} bytes; file truncated?)"
            ));
        }
        entries.push((
            name,
            Entry {
                shard: 0,
                stored: Stored::Safetensors(dtype),
                shape: h.shape,
                begin: data_start + begin,
                end: data_start + end,
            },
        ));
    }
    // Sorted by offset (then end, so zero-sized tensors sit before a tensor starting at the same
    // byte), consecutive ranges must abut exactly.
    entries.sort_by_key(|(_, e)| (e.begin, e.end));
    let mut covered = data_start;
    let mut previous: Option<&str> = None;
    for (name, e) in &entries {
        if e.begin < covered {
            return Err(format!(
                "tensor `{name}` (bytes {}..{}) overlaps tensor `{}` (ends at {})",
                e.begin - data_start,
                e.end - data_start,
                previous.unwrap_or("?"),
                covered - data_start
            ));
        }
        if e.begin > covered {
            return Err(format!(
                "gap in the data section: bytes {}..{} before tensor `{name}` belong to no tensor",
                covered - data_start,
                e.begin - data_start
            ));
        }
        covered = e.end;
        previous = Some(name);
    }
    if covered != file_len {
        return Err(format!(
            "data section has {data_len} bytes but the tensors cover {} (trailing bytes)",
            covered - data_start
        ));
    }
    Ok(entries)
}

/// Little-endian bytes of `dtype` -> f32. `bytes.len()` is a multiple of the element size by the
/// open-time validation; a ragged tail would simply be ignored.
fn convert_to_f32(dtype: DType, bytes: &[u8]) -> Vec<f32> {
    match dtype {
        DType::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        DType::BF16 => bytes
            .chunks_exact(2)
            .map(|c| half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
            .collect(),
        DType::F16 => bytes
            .chunks_exact(2)
            .map(|c| half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
            .collect(),
    }
}
