//! Building blocks shared by every family: norms, attention, Gated DeltaNet, dense MLP and MoE.
//! Each block owns its weights (f32, PyTorch `[out, in]` layout) and runs over `n` rows at once.

pub mod attention;
pub mod ffn;
pub mod gdn;
pub mod quantize;

use std::borrow::Cow;

use model_io::{DType, LoadError, TensorStore};

/// RMSNorm over rows of `weight.len()`; zero-centred norms scale by `(1 + w)` (Qwen3.5 / Qwen3-Next).
#[derive(Clone, Debug)]
pub struct Norm {
    pub weight: Vec<f32>,
    pub eps: f32,
    pub zero_centred: bool,
}

impl Norm {
    pub fn load(
        t: &Tensors<'_>,
        name: &str,
        dim: usize,
        eps: f32,
        zero_centred: bool,
    ) -> Result<Self, LoadError> {
        Ok(Norm {
            weight: t.get(name, &[dim])?,
            eps,
            zero_centred,
        })
    }

    pub fn apply(&self, x: &[f32], out: &mut [f32]) {
        kernels::rms_norm(x, &self.weight, self.eps, self.zero_centred, out);
    }

    pub fn apply_inplace(&self, x: &mut [f32]) {
        kernels::rms_norm_inplace(x, &self.weight, self.eps, self.zero_centred);
    }
}

/// A linear layer `y = x · Wᵀ`, W: [out, in].
#[derive(Clone, Debug)]
pub struct Linear {
    pub w: Weights,
    pub out_dim: usize,
    pub in_dim: usize,
}

/// A weight matrix as the CPU keeps it: bf16 when the checkpoint stores bf16 (half the bytes a decode step
/// streams, laid out for AMX tiles where the CPU has them: `kernels::Bf16Matrix`), in its ggml blocks when
/// a GGUF file stores it quantized (`kernels::QuantMatrix`), f32 otherwise.
#[derive(Clone, Debug)]
pub enum Weights {
    F32(Vec<f32>),
    Bf16(kernels::Bf16Matrix),
    Quant {
        w: kernels::QuantMatrix,
        /// `x_stored[c] = x[input_order[c]]` when the file stores the columns in another order.
        input_order: Option<Vec<usize>>,
    },
    /// Fine-grained FP8 (an FP8 checkpoint's blocks, or `--quantize fp8`).
    Fp8(kernels::Fp8Matrix),
}

impl Linear {
    pub fn load(
        t: &Tensors<'_>,
        name: &str,
        out_dim: usize,
        in_dim: usize,
    ) -> Result<Self, LoadError> {
        let full = t.full_name(name);
        if let Some(q) = t.store.quantized(&full, [out_dim, in_dim])? {
            let bad = |reason: String| LoadError::Gguf {
                path: t
                    .store
                    .path_of(&full)
                    .map(|p| p.to_path_buf())
                    .unwrap_or_default(),
                reason: format!("tensor `{full}`: {reason}"),
            };
            let format = kernels::QuantFormat::from_name(q.ggml_type)
                .ok_or_else(|| bad(format!("no CPU kernel for {}", q.ggml_type)))?;
            let w = kernels::QuantMatrix::new(format, q.data, out_dim, in_dim).map_err(bad)?;
            let w = Weights::Quant {
                w,
                input_order: q.input_order,
            };
            return Ok(Linear { w, out_dim, in_dim });
        }
        if let Some(f) = t.store.fp8(&full, [out_dim, in_dim])? {
            let bad = |reason: String| LoadError::Unsupported {
                path: t.store.dir().to_path_buf(),
                field: full.clone(),
                reason,
            };
            let w = kernels::Fp8Matrix::new(&f.data, &f.scales, out_dim, in_dim, f.block)
                .map_err(bad)?;
            return Ok(Linear {
                w: Weights::Fp8(w),
                out_dim,
                in_dim,
            });
        }
        if let Some(quantize) = t.store.quantize() {
            if let Some(block) = quantize::fp8_block_for(quantize, &full, out_dim) {
                let w = t.get(name, &[out_dim, in_dim])?;
                let w = kernels::Fp8Matrix::quantize(&w, out_dim, in_dim, block);
                return Ok(Linear {
                    w: Weights::Fp8(w),
                    out_dim,
                    in_dim,
                });
            }
            if let Some(format) = quantize::format_for(quantize, &full, out_dim, in_dim) {
                let w = t.get(name, &[out_dim, in_dim])?;
                let w = kernels::quantize_matrix(format, &w, out_dim, in_dim);
                let w = Weights::Quant {
                    w,
                    input_order: None,
                };
                return Ok(Linear { w, out_dim, in_dim });
            }
        }
        let w = match t.store.dtype(&full)? {
            DType::BF16 => {
                let (_, shape, bytes) = t.store.raw(&full)?;
                if shape != [out_dim, in_dim] {
                    // The shape error names the file and tensor.
                    t.get(name, &[out_dim, in_dim])?;
                }
                let w = bytes
                    .chunks_exact(2)
                    .map(|b| half::bf16::from_le_bytes([b[0], b[1]]))
                    .collect();
                Weights::Bf16(kernels::Bf16Matrix::new(w, out_dim, in_dim))
            }
            _ => Weights::F32(t.get(name, &[out_dim, in_dim])?),
        };
        Ok(Linear { w, out_dim, in_dim })
    }

    /// The LM head of a checkpoint that ties it to the embeddings `name`: a bf16 copy when they are stored
    /// bf16 (the embedding lookup keeps its f32 rows; the head then streams half the bytes a token, with
    /// the f32 widening's bits), the ggml blocks when a GGUF stores them quantized, else None (the head
    /// reads the f32 embeddings).
    pub fn tied_head(
        t: &Tensors<'_>,
        name: &str,
        out_dim: usize,
        in_dim: usize,
    ) -> Result<Option<Self>, LoadError> {
        let full = t.full_name(name);
        let stored_quantized = t.store.quantized(&full, [out_dim, in_dim])?.is_some()
            || t.store.fp8(&full, [out_dim, in_dim])?.is_some();
        if t.store.quantize().is_some() || stored_quantized {
            return Ok(Some(Self::load(t, name, out_dim, in_dim)?));
        }
        match t.store.dtype(&full)? {
            DType::BF16 => Ok(Some(Self::load(t, name, out_dim, in_dim)?)),
            _ => Ok(None),
        }
    }

    pub fn from_rows(w: Vec<f32>, out_dim: usize, in_dim: usize) -> Self {
        Linear {
            w: Weights::F32(w),
            out_dim,
            in_dim,
        }
    }

    /// x: [n, in] -> [n, out]
    pub fn forward(&self, x: &[f32], n: usize) -> Vec<f32> {
        let mut out = vec![0.0; n * self.out_dim];
        let (k, m) = (self.in_dim, self.out_dim);
        match &self.w {
            Weights::F32(w) => kernels::linear(x, w, n, k, m, &mut out),
            Weights::Bf16(w) => kernels::linear_bf16_matrix(x, w, n, &mut out),
            Weights::Quant { w, input_order } => {
                let x = reorder(x, n, k, input_order.as_deref());
                kernels::linear_quant(&x, w, n, &mut out)
            }
            Weights::Fp8(w) => kernels::linear_fp8(x, w, n, &mut out),
        }
        out
    }

    /// Most rows one call gives the bits each row gets alone (`kernels::Bf16Matrix::batch_invariant_rows`,
    /// `kernels::QuantMatrix::batch_invariant_rows`; f32 weights: the matvec path's).
    pub fn batch_invariant_rows(&self) -> usize {
        match &self.w {
            Weights::F32(_) => kernels::MATVEC_MAX_ROWS,
            Weights::Bf16(w) => w.batch_invariant_rows(),
            Weights::Quant { w, .. } => w.batch_invariant_rows(),
            Weights::Fp8(w) => w.batch_invariant_rows(),
        }
    }

    /// Several sequences' rows, `seg[i]` rows each, concatenated: x: [Σ seg, in] -> [Σ seg, out], every
    /// row with the bits [`Linear::forward`] gives it over its own sequence's rows alone
    /// ([`run_segments`] with [`Linear::batch_invariant_rows`]).
    pub fn forward_segments(&self, x: &[f32], seg: &[usize]) -> Vec<f32> {
        run_segments(x, self.in_dim, seg, self.batch_invariant_rows(), |x, n| {
            self.forward(x, n)
        })
    }

    /// The first `rows` outputs of [`Linear::forward`] (bit for bit): x: [n, in] -> [n, rows].
    pub fn forward_rows(&self, x: &[f32], n: usize, rows: usize) -> Vec<f32> {
        let rows = rows.min(self.out_dim);
        let mut out = vec![0.0; n * rows];
        let k = self.in_dim;
        match &self.w {
            Weights::F32(w) => kernels::linear(x, &w[..rows * k], n, k, rows, &mut out),
            Weights::Bf16(w) => kernels::linear_bf16_matrix_rows(x, w, n, rows, &mut out),
            Weights::Quant { w, input_order } => {
                let x = reorder(x, n, k, input_order.as_deref());
                kernels::linear_quant_rows(&x, w, n, rows, &mut out)
            }
            Weights::Fp8(w) => kernels::linear_fp8_rows(x, w, n, rows, &mut out),
        }
        out
    }

    pub fn params(&self) -> usize {
        match &self.w {
            Weights::F32(w) => w.len(),
            Weights::Bf16(w) => w.rows() * w.cols(),
            Weights::Quant { w, .. } => w.rows() * w.cols(),
            Weights::Fp8(w) => w.rows() * w.cols(),
        }
    }
}

/// `x` [n, k] with its columns in the stored order (`x_stored[c] = x[order[c]]`), or `x` itself.
fn reorder<'a>(x: &'a [f32], n: usize, k: usize, order: Option<&[usize]>) -> Cow<'a, [f32]> {
    let Some(order) = order else {
        return Cow::Borrowed(&x[..n * k]);
    };
    let mut out = Vec::with_capacity(n * k);
    for row in x[..n * k].chunks_exact(k) {
        out.extend(order.iter().map(|&c| row[c]));
    }
    Cow::Owned(out)
}

/// Runs `f` (rows [n, k] -> [n, m] row-major) over several sequences' rows, `seg[i]` rows each,
/// concatenated in `x`, so that every row gets the bits `f` gives it over its own sequence's rows alone,
/// given a kernel that is batch-invariant up to `limit` rows per call: one call when the total fits (or
/// there is one sequence); otherwise sequences of up to `limit` rows share calls of at most `limit`
/// rows and longer ones (prefill chunks, on another path alone too) run by themselves.
pub(crate) fn run_segments(
    x: &[f32],
    k: usize,
    seg: &[usize],
    limit: usize,
    f: impl Fn(&[f32], usize) -> Vec<f32>,
) -> Vec<f32> {
    let total: usize = seg.iter().sum();
    if total <= limit || seg.len() == 1 {
        return f(&x[..total * k], total);
    }
    let mut out = Vec::new();
    let (mut from, mut pending) = (0, 0); // rows [from, from + pending) wait for one shared call
    for &n in seg {
        if pending > 0 && (n > limit || pending + n > limit) {
            out.extend(f(&x[from * k..(from + pending) * k], pending));
            from += pending;
            pending = 0;
        }
        if n > limit {
            out.extend(f(&x[from * k..(from + n) * k], n));
            from += n;
        } else {
            pending += n;
        }
    }
    if pending > 0 {
        out.extend(f(&x[from * k..(from + pending) * k], pending));
    }
    out
}

/// Tensor access under a name prefix (`model.`, `model.language_model.`, `mtp.`).
pub struct Tensors<'a> {
    pub store: &'a TensorStore,
    pub prefix: String,
}

impl<'a> Tensors<'a> {
    pub fn new(store: &'a TensorStore, prefix: impl Into<String>) -> Self {
        Tensors {
            store,
            prefix: prefix.into(),
        }
    }

    pub fn sub(&self, more: &str) -> Tensors<'a> {
        Tensors {
            store: self.store,
            prefix: format!("{}{}", self.prefix, more),
        }
    }

    pub fn full_name(&self, name: &str) -> String {
        format!("{}{}", self.prefix, name)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.store.contains(&self.full_name(name))
    }

    pub fn get(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, LoadError> {
        self.store.load_f32(&self.full_name(name), shape)
    }
}
