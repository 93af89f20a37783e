//! Fine-grained FP8 checkpoints (Qwen's `*-FP8` releases; transformers' `FineGrainedFP8Config`, vLLM's
//! block-quantized FP8): config.json's `quantization_config` says `quant_method: "fp8"`, `fmt: "e4m3"`,
//! `activation_scheme: "dynamic"`, `weight_block_size: [128, 128]`; each quantized weight is stored
//! `F8_E4M3` [rows, cols] next to `<weight>_scale_inv` [⌈rows / 128⌉, ⌈cols / 128⌉] (f32, bf16 or f16),
//! and `W[i, j] = e4m3(Wq[i, j]) · scale_inv[i / 128, j / 128]`. Modules left unquantized
//! (`modules_to_not_convert` / `ignored_layers`) are stored in a float dtype and read as any other tensor,
//! so honouring the list is reading what the file holds.
//!
//! [`apply`] runs at open: it validates the config and marks every FP8 weight with its scale tensor
//! (checked: present, float, the block grid's shape). The weights are then served dequantized to f32
//! (`load_f32`, `raw`: every path works) and as blocks for the kernels ([`TensorStore::fp8`]).
//!
//! Invariant: an FP8 weight's dequantized value is the same f32 everywhere (e4m3 → f32 is exact; one
//! f32 product by the block's scale).

use std::path::Path;
use std::sync::OnceLock;

use safetensors::Dtype;
use serde_json::Value;

use crate::tensors::{Entry, Stored, TensorStore};
use crate::LoadError;

/// An FP8 weight matrix [rows, cols] in its blocks ([`TensorStore::fp8`]).
#[derive(Debug, Clone)]
pub struct Fp8Tensor {
    pub rows: usize,
    pub cols: usize,
    /// Elements per scale block, [rows, cols].
    pub block: [usize; 2],
    /// e4m3 bytes, row-major [rows, cols].
    pub data: Vec<u8>,
    /// f32 [⌈rows / block[0]⌉, ⌈cols / block[1]⌉].
    pub scales: Vec<f32>,
}

impl Fp8Tensor {
    /// The weights as f32 [rows, cols].
    pub fn dequantize(&self) -> Vec<f32> {
        let grid_cols = self.cols.div_ceil(self.block[1]);
        let mut out = Vec::with_capacity(self.rows * self.cols);
        for (i, row) in self.data.chunks_exact(self.cols.max(1)).enumerate() {
            let scales = &self.scales[i / self.block[0] * grid_cols..];
            out.extend(
                row.iter()
                    .enumerate()
                    .map(|(j, &q)| e4m3_to_f32(q) * scales[j / self.block[1]]),
            );
        }
        out
    }
}

/// An e4m3 (`float8_e4m3fn`: bias 7, no infinities, NaN = S.1111.111) byte as f32, exactly.
pub fn e4m3_to_f32(q: u8) -> f32 {
    let (sign, e, m) = (q >> 7, (q >> 3) & 0xF, q & 7);
    let magnitude = if e == 0 && m != 0 {
        m as f32 * (1.0 / 512.0) // subnormal: m · 2^-9
    } else if e == 0xF && m == 7 {
        f32::NAN
    } else if e == 0 {
        0.0
    } else {
        f32::from_bits(((e as u32 + 120) << 23) | ((m as u32) << 20))
    };
    if sign == 1 {
        -magnitude
    } else {
        magnitude
    }
}

fn unsupported(path: &Path, field: &str, reason: String) -> LoadError {
    LoadError::Unsupported {
        path: path.to_path_buf(),
        field: field.to_string(),
        reason,
    }
}

/// Reads `quantization_config` from config.json at `config_path` and marks the FP8 weights of `store`.
/// Without that config an `F8_E4M3` tensor is an error naming it; an unknown `quant_method`, a format
/// other than e4m3, static activation scales or a block size the kernels do not take are errors naming
/// the field.
pub(crate) fn apply(config_path: &Path, store: &mut TensorStore) -> Result<(), LoadError> {
    let root = crate::json::read_object(config_path, "config")?;
    let fp8_names: Vec<String> = store
        .entries
        .iter()
        .filter(|(_, e)| matches!(e.stored, Stored::Safetensors(Dtype::F8_E4M3)))
        .map(|(n, _)| n.clone())
        .collect();
    let Some(qc) = root.get("quantization_config") else {
        if let Some(name) = fp8_names.iter().min() {
            return Err(unsupported(
                config_path,
                "quantization_config",
                format!("tensor `{name}` is F8_E4M3, but config.json has no quantization_config saying how it is scaled"),
            ));
        }
        return Ok(());
    };
    let field = |k: &str| qc.get(k);
    let method = field("quant_method").and_then(Value::as_str).unwrap_or("");
    if method != "fp8" {
        return Err(unsupported(
            config_path,
            "quantization_config.quant_method",
            format!("{method:?} is not supported (fine-grained \"fp8\" is; GGUF files are read as such)"),
        ));
    }
    if let Some(fmt) = field("fmt").filter(|v| !v.is_null()) {
        if fmt.as_str() != Some("e4m3") {
            return Err(unsupported(
                config_path,
                "quantization_config.fmt",
                format!("{fmt} is not supported (e4m3 is)"),
            ));
        }
    }
    if let Some(scheme) = field("activation_scheme").filter(|v| !v.is_null()) {
        if scheme.as_str() != Some("dynamic") {
            return Err(unsupported(
                config_path,
                "quantization_config.activation_scheme",
                format!(
                    "{scheme} is not supported (\"dynamic\" is: activations are not pre-scaled)"
                ),
            ));
        }
    }
    let block = match field("weight_block_size") {
        Some(Value::Array(v)) if v.len() == 2 => {
            let dims: Vec<usize> = v
                .iter()
                .filter_map(Value::as_u64)
                .map(|d| d as usize)
                .collect();
            match dims[..] {
                [r, c] if r > 0 && c > 0 && c % 16 == 0 => [r, c],
                _ => {
                    return Err(unsupported(
                        config_path,
                        "quantization_config.weight_block_size",
                        format!("{v:?}: the kernels take positive [rows, cols] blocks with cols a multiple of 16 (Qwen's are [128, 128])"),
                    ))
                }
            }
        }
        other => {
            return Err(unsupported(
                config_path,
                "quantization_config.weight_block_size",
                format!(
                "{}: per-tensor FP8 scales are not supported; fine-grained [rows, cols] blocks are",
                other.map_or("absent".to_string(), |v| v.to_string())
            ),
            ))
        }
    };
    for name in fp8_names {
        mark(store, &name, block)?;
    }
    Ok(())
}

/// Marks FP8 weight `name` with its scale tensor, after checking the scale.
fn mark(store: &mut TensorStore, name: &str, block: [usize; 2]) -> Result<(), LoadError> {
    let entry = store.entry(name)?;
    let path = store.shard_path(entry).to_path_buf();
    let [rows, cols] = entry.shape[..] else {
        return Err(LoadError::Unsupported {
            path,
            field: name.to_string(),
            reason: format!(
                "an F8_E4M3 tensor of shape {:?}: FP8 weights are matrices",
                entry.shape
            ),
        });
    };
    let scale = match name.strip_suffix(".weight") {
        Some(stem) => format!("{stem}.weight_scale_inv"),
        None => format!("{name}_scale_inv"),
    };
    let s = store.entry(&scale)?;
    let expected = vec![rows.div_ceil(block[0]), cols.div_ceil(block[1])];
    if s.shape != expected {
        return Err(LoadError::ShapeMismatch {
            path: store.shard_path(s).to_path_buf(),
            tensor: scale,
            expected,
            found: s.shape.clone(),
        });
    }
    store.dtype(&scale)?; // a float dtype, or an error naming the scale tensor
    let entry: &mut Entry = store.entries.get_mut(name).expect("looked up above");
    entry.stored = Stored::Fp8 {
        scale,
        block,
        converted: OnceLock::new(),
    };
    Ok(())
}

impl TensorStore {
    /// An FP8 weight matrix `name` of shape `expected` in its e4m3 bytes and block scales; None for any
    /// other tensor. An error names the tensor when its shape is not `expected`.
    pub fn fp8(&self, name: &str, expected: [usize; 2]) -> Result<Option<Fp8Tensor>, LoadError> {
        let entry = self.entry(name)?;
        if !matches!(entry.stored, Stored::Fp8 { .. }) {
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
        self.fp8_blocks(name, entry).map(Some)
    }

    /// The blocks of an entry marked FP8.
    pub(crate) fn fp8_blocks(&self, name: &str, entry: &Entry) -> Result<Fp8Tensor, LoadError> {
        let Stored::Fp8 { scale, block, .. } = &entry.stored else {
            return Err(LoadError::Unsupported {
                path: self.shard_path(entry).to_path_buf(),
                field: name.to_string(),
                reason: "not an FP8 weight".into(),
            });
        };
        let [rows, cols] = entry.shape[..] else {
            unreachable!("mark() accepts matrices only")
        };
        let grid = [rows.div_ceil(block[0]), cols.div_ceil(block[1])];
        let scales = self.load_f32(scale, &grid)?;
        let data = self.bytes(entry)?.to_vec();
        if data.len() != rows * cols {
            return Err(LoadError::Safetensors {
                path: self.shard_path(entry).to_path_buf(),
                reason: format!(
                    "tensor `{name}`: {} bytes for F8_E4M3 [{rows}, {cols}]",
                    data.len()
                ),
            });
        }
        Ok(Fp8Tensor {
            rows,
            cols,
            block: *block,
            data,
            scales,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_codes_decode_as_torch_does() {
        // torch.tensor([...]).view(torch.float8_e4m3fn).float(): 0x38 = 1, 0x7E = 448, 0x01 = 2^-9,
        // 0x08 = 2^-6 (smallest normal), 0xB0 = -0.5, 0x7F = NaN.
        assert_eq!(e4m3_to_f32(0x38), 1.0);
        assert_eq!(e4m3_to_f32(0x7E), 448.0);
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
        assert_eq!(e4m3_to_f32(0x08), 2f32.powi(-6));
        assert_eq!(e4m3_to_f32(0xB0), -0.5);
        assert!(e4m3_to_f32(0x7F).is_nan());
        assert_eq!(e4m3_to_f32(0x80), -0.0);
    }
}
