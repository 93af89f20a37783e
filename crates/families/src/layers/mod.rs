//! Building blocks shared by every family: norms, attention, Gated DeltaNet, dense MLP and MoE.
//! Each block owns its weights (f32, PyTorch `[out, in]` layout) and runs over `n` rows at once.

pub mod attention;
pub mod ffn;
pub mod gdn;

use model_io::{LoadError, TensorStore};

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
    pub w: Vec<f32>,
    pub out_dim: usize,
    pub in_dim: usize,
}

impl Linear {
    pub fn load(
        t: &Tensors<'_>,
        name: &str,
        out_dim: usize,
        in_dim: usize,
    ) -> Result<Self, LoadError> {
        Ok(Linear {
            w: t.get(name, &[out_dim, in_dim])?,
            out_dim,
            in_dim,
        })
    }

    pub fn from_rows(w: Vec<f32>, out_dim: usize, in_dim: usize) -> Self {
        Linear { w, out_dim, in_dim }
    }

    /// x: [n, in] -> [n, out]
    pub fn forward(&self, x: &[f32], n: usize) -> Vec<f32> {
        let mut out = vec![0.0; n * self.out_dim];
        kernels::linear(x, &self.w, n, self.in_dim, self.out_dim, &mut out);
        out
    }

    pub fn params(&self) -> usize {
        self.w.len()
    }
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
