//! GGUF: llama.cpp's single-file model format (metadata + tensors, many quantized), read directly.
//!
//! - [`reader`]: one file, memory-mapped and validated (hostile-input safe).
//! - [`types`]: ggml block types and their scalar reference dequantization to f32.
//! - [`config`]: the metadata as the config.json the Hugging Face checkpoint had.
//! - [`names`], [`convert`]: llama.cpp's tensor names and layouts back to Hugging Face's (used by
//!   `TensorStore::from_gguf`, so the families see the names and layouts they already load).
//! - [`tokenizer`]: `tokenizer.ggml.*` as a `tokenizers` BPE.
//! - [`GgufSet`]: one file or a split set `NAME-00001-of-0000N.gguf` (gguf-split's naming; each
//!   part is a complete GGUF file, `split.no` / `split.count` / `split.tensors.count` in its
//!   metadata), opened as one name -> tensor map whose metadata is the first part's.
//!
//! Invariant: an opened set has every part validated by [`reader::parse`], tensor names unique over
//! all parts, and (for a split set) every part present, numbered in order, with the tensor total
//! that `split.tensors.count` announces.

pub mod config;
pub mod convert;
pub mod names;
pub mod reader;
pub mod tokenizer;
pub mod types;
pub mod writer;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

pub use reader::{GgufFile, MetaValue, TensorInfo};
pub use types::GgmlType;

use crate::LoadError;

/// One GGUF file or a split set, as one model.
#[derive(Debug)]
pub struct GgufSet {
    pub parts: Vec<GgufFile>,
    /// Tensor name -> (part, index in that part's `tensors`).
    index: HashMap<String, (usize, usize)>,
}

impl GgufSet {
    /// Opens `path`: a single `.gguf` file, or the first part (`-00001-of-0000N.gguf`) of a split set.
    pub fn open(path: &Path) -> Result<Self, LoadError> {
        let first = GgufFile::open(path)?;
        let paths = match split_count(&first)? {
            None | Some(1) => vec![],
            Some(n) => split_part_paths(path, n)?,
        };
        let mut parts = vec![first];
        for (i, p) in paths.iter().enumerate().skip(1) {
            let part = GgufFile::open(p)?;
            let no = part.get("split.no").and_then(MetaValue::as_u64);
            if no != Some(i as u64) {
                return Err(LoadError::Gguf {
                    path: p.clone(),
                    reason: format!("metadata `split.no` is {no:?}, expected {i}"),
                });
            }
            parts.push(part);
        }
        let mut index = HashMap::new();
        for (pi, part) in parts.iter().enumerate() {
            for (ti, t) in part.tensors.iter().enumerate() {
                if let Some((other, _)) = index.insert(t.name.clone(), (pi, ti)) {
                    return Err(LoadError::DuplicateTensor {
                        path: part.path.clone(),
                        other: parts[other].path.clone(),
                        tensor: t.name.clone(),
                    });
                }
            }
        }
        if parts.len() > 1 {
            let announced = parts[0]
                .get("split.tensors.count")
                .and_then(MetaValue::as_u64);
            if announced != Some(index.len() as u64) {
                return Err(LoadError::Gguf {
                    path: parts[0].path.clone(),
                    reason: format!(
                        "metadata `split.tensors.count` is {announced:?} but the {} parts hold {} tensors",
                        parts.len(),
                        index.len()
                    ),
                });
            }
        }
        Ok(GgufSet { parts, index })
    }

    /// The first part's path (names the model in messages).
    pub fn path(&self) -> &Path {
        &self.parts[0].path
    }

    /// Metadata of the first part.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.parts[0].get(key)
    }

    /// All tensors with the part that holds each.
    pub fn tensors(&self) -> impl Iterator<Item = (&GgufFile, &TensorInfo)> {
        self.parts
            .iter()
            .flat_map(|p| p.tensors.iter().map(move |t| (p, t)))
    }

    pub fn tensor(&self, name: &str) -> Option<(&GgufFile, &TensorInfo)> {
        let &(pi, ti) = self.index.get(name)?;
        let part = self.parts.get(pi)?;
        Some((part, part.tensors.get(ti)?))
    }
}

impl GgufSet {
    /// Dequantizes tensor `name` to f32, in its stored element order (GGUF extents innermost first).
    pub fn load_f32(&self, name: &str) -> Result<Vec<f32>, LoadError> {
        let (part, info) = self.tensor(name).ok_or_else(|| LoadError::MissingTensor {
            path: self.path().to_path_buf(),
            tensor: name.to_string(),
        })?;
        dequantize_tensor(part, info)
    }
}

/// Tensor `info` of `part` as f32; an unsupported type is an error naming the tensor and the type.
pub fn dequantize_tensor(part: &GgufFile, info: &TensorInfo) -> Result<Vec<f32>, LoadError> {
    if !info.ggml_type.is_supported() {
        return Err(LoadError::UnsupportedGgmlType {
            path: part.path.clone(),
            tensor: info.name.clone(),
            ggml_type: info.ggml_type.name(),
            supported: types::DEQUANTIZED_TYPES,
        });
    }
    let bytes = part.bytes(info)?;
    let mut out = vec![0f32; info.numel()];
    types::dequantize(info.ggml_type, bytes, &mut out).map_err(|reason| LoadError::Gguf {
        path: part.path.clone(),
        reason: format!("tensor `{}`: {reason}", info.name),
    })?;
    Ok(out)
}

/// `split.count` of a file, if present (a positive integer).
fn split_count(file: &GgufFile) -> Result<Option<u64>, LoadError> {
    match file.get("split.count") {
        None => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if (1..=99_999).contains(&n) => {
                let no = file.get("split.no").and_then(MetaValue::as_u64);
                if n > 1 && no != Some(0) {
                    return Err(LoadError::Gguf {
                        path: file.path.clone(),
                        reason: format!(
                            "part {no:?} of a {n}-part split set: open the first part (-00001-of-{n:05}.gguf)"
                        ),
                    });
                }
                Ok(Some(n))
            }
            _ => Err(LoadError::Gguf {
                path: file.path.clone(),
                reason: format!("metadata `split.count` should be 1 to 99999, found {v:?}"),
            }),
        },
    }
}

/// The part paths of a split set named like `first` (`PREFIX-00001-of-0000N.gguf`).
fn split_part_paths(first: &Path, count: u64) -> Result<Vec<PathBuf>, LoadError> {
    let name = first.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let suffix = format!("-00001-of-{count:05}.gguf");
    let prefix = name.strip_suffix(&suffix).ok_or_else(|| LoadError::Gguf {
        path: first.to_path_buf(),
        reason: format!("a {count}-part split set whose first file is not named PREFIX{suffix}"),
    })?;
    let dir = first.parent().unwrap_or(Path::new("."));
    let mut paths = Vec::new();
    for i in 1..=count {
        let p = dir.join(format!("{prefix}-{i:05}-of-{count:05}.gguf"));
        if !p.is_file() {
            return Err(LoadError::MissingFile {
                path: p,
                what: "part of a split GGUF set",
            });
        }
        paths.push(p);
    }
    Ok(paths)
}

/// `path` names a GGUF model: a file ending in `.gguf`.
pub fn is_gguf_path(path: &Path) -> bool {
    path.is_file()
        && path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
}
