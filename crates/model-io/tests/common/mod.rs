//! Helpers shared by the integration tests: tiny checkpoints written into temp dirs.
#![allow(dead_code)] // each test binary uses a subset

use std::path::Path;

use model_io::LoadError;
use safetensors::tensor::TensorView;
use safetensors::Dtype;

/// One tensor to serialize: name, dtype, shape, little-endian bytes.
pub struct T {
    pub name: &'static str,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub bytes: Vec<u8>,
}

pub fn f32_tensor(name: &'static str, shape: &[usize], values: &[f32]) -> T {
    T {
        name,
        dtype: Dtype::F32,
        shape: shape.to_vec(),
        bytes: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

/// Writes `tensors` with the safetensors crate's serializer (the reference writer).
pub fn write_safetensors(path: &Path, tensors: &[T]) {
    let views: Vec<(&str, TensorView<'_>)> = tensors
        .iter()
        .map(|t| {
            (
                t.name,
                TensorView::new(t.dtype, t.shape.clone(), &t.bytes).unwrap(),
            )
        })
        .collect();
    let bytes = safetensors::serialize(views, None).unwrap();
    std::fs::write(path, bytes).unwrap();
}

/// A safetensors file image from a literal header and data section, for malformed files.
pub fn raw_safetensors(header: &str, data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

pub fn write(path: &Path, text: &str) {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(path, text).unwrap();
}

/// A minimal valid Qwen3 config.json body (4 heads of 8, 2 layers).
pub fn qwen3_config() -> serde_json::Value {
    serde_json::json!({
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": 32,
        "hidden_size": 16,
        "intermediate_size": 24,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "eos_token_id": 7
    })
}

/// A checkpoint dir with `config` and one small `model.safetensors`.
pub fn checkpoint_dir(config: &serde_json::Value, tensors: &[T]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write(&dir.path().join("config.json"), &config.to_string());
    write_safetensors(&dir.path().join("model.safetensors"), tensors);
    dir
}

/// The error's message, asserting that it names `file` (the file's name, not the whole path).
pub fn message_naming(err: &LoadError, file: &str) -> String {
    let msg = err.to_string();
    assert!(msg.contains(file), "error should name `{file}`: {msg}");
    msg
}
