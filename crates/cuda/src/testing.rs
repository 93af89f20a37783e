//! Test support: a copy of a checkpoint with every matrix (2-D tensor) rounded to bf16 as the backend
//! uploads it, other tensors unchanged. The CPU engine run on that copy computes, in f32, exactly the
//! function the bf16 GPU path computes (up to summation order), so the bf16 path can be checked against
//! an independent engine at an f32 tolerance instead of a loose bf16 one.

use std::path::Path;

use model_io::{Checkpoint, DType};
use safetensors::tensor::TensorView;

use crate::error::CudaError;
use crate::weights::{convert_into, WDtype};

fn io(path: &Path) -> impl Fn(std::io::Error) -> CudaError + '_ {
    move |source| CudaError::Cache {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes `dst/model.safetensors` (matrices rounded to bf16) and copies config.json and
/// generation_config.json from `ck`.
pub fn write_bf16_matrix_copy(ck: &Checkpoint, dst: &Path) -> Result<(), CudaError> {
    std::fs::create_dir_all(dst).map_err(io(dst))?;
    let mut tensors: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for name in ck.tensors.names() {
        let (dtype, shape, bytes) = ck.tensors.raw(name)?;
        let (st_dtype, data) = if shape.len() == 2 {
            let mut out = Vec::new();
            convert_into(dtype, bytes, WDtype::Bf16, &mut out);
            (safetensors::Dtype::BF16, out)
        } else {
            let d = match dtype {
                DType::F32 => safetensors::Dtype::F32,
                DType::BF16 => safetensors::Dtype::BF16,
                DType::F16 => safetensors::Dtype::F16,
            };
            (d, bytes.to_vec())
        };
        tensors.push((name.to_string(), st_dtype, shape.to_vec(), data));
    }
    let mut views = Vec::with_capacity(tensors.len());
    for (name, dtype, shape, data) in &tensors {
        let view =
            TensorView::new(*dtype, shape.clone(), data).map_err(|e| CudaError::Unsupported {
                what: format!("writing tensor {name}: {e}"),
            })?;
        views.push((name.clone(), view));
    }
    let file = dst.join("model.safetensors");
    safetensors::tensor::serialize_to_file(views, None, &file).map_err(|e| {
        CudaError::Unsupported {
            what: format!("writing {}: {e}", file.display()),
        }
    })?;
    for f in ["config.json", "generation_config.json"] {
        let src = ck.dir.join(f);
        if src.is_file() {
            std::fs::copy(&src, dst.join(f)).map_err(io(&src))?;
        }
    }
    Ok(())
}
