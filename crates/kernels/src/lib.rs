//! f32 CPU kernels for the Qwen3 / Qwen3.5 / Qwen3-Next forward passes.
//!
//! All buffers are row-major f32 slices; shapes are given in each function's doc (`[n, heads, head_dim]`).
//! Numerics follow transformers' reference implementation (see each module's doc for the exact order of
//! operations). Work is split over the rayon pool that is current when a kernel is called: the model's own
//! pool (`turbospark::Model` runs every entry point inside it), else rayon's global pool. Wide SIMD is
//! chosen at run time ([`simd_path`]): the binary is built for the baseline target and is safe to carry to
//! other machines.
//!
//! Shape errors are programmer errors here (the callers are our own code): a buffer shorter than its shape
//! panics with a message naming the kernel and the buffer, before anything is read or written.

#[cfg(target_arch = "x86_64")]
mod amx;
mod attention;
mod conv;
mod elementwise;
mod fp8;
mod gdn;
mod linear;
#[cfg(target_arch = "x86_64")]
mod matmul_avx512;
#[cfg(target_arch = "x86_64")]
mod matvec_avx512;
mod norm;
mod quant;
mod rope;
mod simd;

#[cfg(test)]
mod tests;

pub use attention::attention;
pub use conv::causal_conv1d_silu;
pub use elementwise::{
    add_inplace, argmax, sigmoid, silu, silu_inplace, silu_mul, softmax_inplace, softplus,
};
pub use fp8::{e4m3_from_f32, e4m3_value, linear_fp8, linear_fp8_rows, Fp8Matrix};
#[doc(hidden)]
pub use fp8::{fp8_simd_paths, linear_fp8_path};
pub use gdn::{gdn_chunked, gdn_recurrent, GDN_CHUNK};
pub use linear::{
    linear, linear_acc, linear_acc_bf16, linear_bf16, linear_bf16_matrix, linear_bf16_matrix_rows,
    Bf16Matrix, MATVEC_MAX_ROWS,
};
#[doc(hidden)]
pub use linear::{linear_gemm, linear_matvec};
pub use norm::{l2_normalize_rows, rms_norm, rms_norm_inplace};
pub use quant::{
    dequantize_row, linear_quant, linear_quant_rows, quant_simd_path, QuantFormat, QuantMatrix,
};
#[doc(hidden)]
pub use quant::{linear_quant_path, linear_quant_portable, quant_simd_paths};
pub use quant::{quantize_matrix, quantize_row};
pub use rope::{rope, rope_inv_freq, rope_with_inv_freq};
pub use simd::simd_path;
