//! Uploading weights. Matrices (every `Linear` and the embedding table) go to the GPU as bf16 by default
//! (f32 / f16 checkpoints are rounded to nearest even once, at upload) or, for exactness checks, in the
//! stored precision (f32 and f16 as f32, bf16 as bf16). Small parameters (norm weights, conv taps,
//! A_log, dt_bias, RoPE frequencies) stay f32, as the CPU engine keeps them.
//!
//! Projections that read the same input are fused at upload into one row-concatenated matrix, so each is
//! one matrix-vector pass: attention [q(+gate) ; k ; v], GDN [qkv ; z ; b ; a], MLP [gate ; up].
//!
//! A `Source` is either a checkpoint (raw stored bytes, converted on the host) or a synthetic model whose
//! matrices are filled on the GPU by a hash-based generator (the 8 GB benchmark model is never written to
//! disk or sent over PCIe) with small parameters initialised as `synth` does.

use half::{bf16, f16};
use kernels::QuantFormat;
use model_io::{Checkpoint, DType};

use crate::buf::{elementwise_grid, launch, Arg, DBuf};
use crate::device::CudaDevice;
use crate::error::CudaError;

/// How matrices are stored on the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightFormat {
    /// bf16 (the fast path; f32 / f16 checkpoints are rounded once at upload).
    Bf16,
    /// As stored: bf16 stays bf16, f32 and f16 become f32 (exactness checks against the CPU engine).
    AsStored,
}

/// Element type of a matrix on the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WDtype {
    Bf16,
    F32,
    /// ggml blocks, laid out as the matrix's [`QuantLayout`] says.
    Quant,
}

impl WDtype {
    /// Bytes per element of the float types (a quantized matrix counts its bytes by its layout).
    pub fn size(self) -> usize {
        match self {
            WDtype::Bf16 => 2,
            WDtype::F32 => 4,
            WDtype::Quant => 0,
        }
    }
}

/// The block format of a run of rows of a quantized matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockFormat {
    /// ggml blocks (a GGUF file's, or `--quantize q8_0|q4_k`).
    Ggml(QuantFormat),
    /// Fine-grained FP8: e4m3 bytes, one f32 scale per [rows, cols] block, the scales `scales` bytes into
    /// the matrix's buffer, [⌈rows / block[0]⌉, ⌈cols / block[1]⌉].
    Fp8 { block: [usize; 2], scales: usize },
}

impl BlockFormat {
    /// Bytes of a row of `cols` weights (FP8 scales apart).
    pub fn row_bytes(self, cols: usize) -> usize {
        match self {
            BlockFormat::Ggml(f) => f.row_bytes(cols),
            BlockFormat::Fp8 { .. } => cols,
        }
    }

    /// Bytes of `rows` rows of `cols` weights, FP8 scales included.
    pub fn bytes(self, rows: usize, cols: usize) -> usize {
        match self {
            BlockFormat::Ggml(f) => rows * f.row_bytes(cols),
            BlockFormat::Fp8 { block, .. } => {
                rows * cols + 4 * rows.div_ceil(block[0]) * cols.div_ceil(block[1])
            }
        }
    }
}

/// One run of rows of a quantized matrix, all in one format, `offset` bytes into the buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuantPart {
    pub format: BlockFormat,
    pub rows: usize,
    pub offset: usize,
}

/// How a quantized matrix's buffer holds its rows: row runs of one format each (a fused projection of a
/// GGUF file mixes Q4_K and Q6_K parts), one after another.
pub struct QuantLayout {
    pub parts: Vec<QuantPart>,
    /// i32 [cols] when the file stores the columns in another order: `x_stored[c] = x[order[c]]`.
    pub input_order: Option<DBuf>,
}

/// A row-major [rows, cols] matrix on the GPU.
pub struct Mat {
    pub buf: DBuf,
    pub rows: usize,
    pub cols: usize,
    pub dtype: WDtype,
    /// Row blocks of up to 16 run the tensor-core GEMV (LoadOptions::tensor_core_gemv).
    pub tensor_cores: bool,
    /// The block layout of a `WDtype::Quant` matrix.
    pub quant: Option<std::sync::Arc<QuantLayout>>,
}

impl Mat {
    pub fn bytes(&self) -> usize {
        match &self.quant {
            Some(q) => q
                .parts
                .iter()
                .map(|p| p.format.bytes(p.rows, self.cols))
                .sum(),
            None => self.rows * self.cols * self.dtype.size(),
        }
    }

    /// Its first `rows` rows (at most all), the same memory (`DBuf::prefix`: the holder keeps `self`
    /// alive).
    pub(crate) fn row_prefix(&self, rows: usize) -> Mat {
        let rows = rows.min(self.rows);
        let quant = self.quant.as_ref().map(|q| {
            let mut left = rows;
            let parts = q
                .parts
                .iter()
                .filter_map(|p| {
                    let take = p.rows.min(left);
                    left -= take;
                    (take > 0).then_some(QuantPart { rows: take, ..*p })
                })
                .collect();
            let input_order = q.input_order.as_ref().map(|o| o.prefix(o.bytes));
            std::sync::Arc::new(QuantLayout { parts, input_order })
        });
        // A quantized matrix keeps its whole buffer in view (FP8 scales follow every part's rows).
        let bytes = match &quant {
            Some(_) => self.buf.bytes,
            None => rows * self.cols * self.dtype.size(),
        };
        Mat {
            buf: self.buf.prefix(bytes),
            rows,
            cols: self.cols,
            dtype: self.dtype,
            tensor_cores: self.tensor_cores,
            quant,
        }
    }
}

/// Where weights come from.
pub(crate) enum Source<'a> {
    Checkpoint(&'a Checkpoint),
    /// Synthetic weights (N(0, 0.02) matrices), deterministic in `seed`.
    Random {
        seed: u64,
        zero_centred: bool,
    },
}

/// Converts stored little-endian bytes of `dtype` to the GPU element type, appending to `out`.
pub(crate) fn convert_into(dtype: DType, bytes: &[u8], to: WDtype, out: &mut Vec<u8>) {
    let as_f32 = |b: &[u8]| -> f32 {
        match dtype {
            DType::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            DType::BF16 => bf16::from_le_bytes([b[0], b[1]]).to_f32(),
            DType::F16 => f16::from_le_bytes([b[0], b[1]]).to_f32(),
        }
    };
    let step = dtype.size_in_bytes();
    match (dtype, to) {
        (DType::BF16, WDtype::Bf16) | (DType::F32, WDtype::F32) => out.extend_from_slice(bytes),
        (_, WDtype::Bf16) => {
            for b in bytes.chunks_exact(step) {
                out.extend_from_slice(&bf16::from_f32(as_f32(b)).to_le_bytes());
            }
        }
        (_, WDtype::F32) => {
            for b in bytes.chunks_exact(step) {
                out.extend_from_slice(&as_f32(b).to_le_bytes());
            }
        }
        (_, WDtype::Quant) => unreachable!("float conversion to a block format"),
    }
}

/// The GPU element type for a stored dtype under `format`.
pub(crate) fn target_dtype(stored: DType, format: WeightFormat) -> WDtype {
    match (format, stored) {
        (WeightFormat::Bf16, _) | (WeightFormat::AsStored, DType::BF16) => WDtype::Bf16,
        (WeightFormat::AsStored, _) => WDtype::F32,
    }
}

/// SplitMix64 for host-side synthetic parameters.
struct SplitMix(u64);

impl SplitMix {
    fn uniform(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        ((z >> 40) as f32 + 0.5) / (1u64 << 24) as f32
    }
    fn normal(&mut self) -> f32 {
        let s: f32 = (0..4).map(|_| self.uniform()).sum();
        (s - 2.0) * 3.0f32.sqrt()
    }
}

/// Loads tensors from a source onto one device.
pub(crate) struct Uploader<'a> {
    pub dev: &'a CudaDevice,
    pub source: Source<'a>,
    pub format: WeightFormat,
    pub tensor_cores: bool,
    /// Counts tensors so each synthetic tensor gets its own stream of random numbers.
    pub counter: std::cell::Cell<u64>,
}

impl Uploader<'_> {
    fn next_seed(&self, seed: u64) -> u64 {
        let c = self.counter.get() + 1;
        self.counter.set(c);
        seed ^ c.wrapping_mul(0xA24B_AED4_963E_E407)
    }

    /// Row-concatenation of tensors `parts` = (full name, rows), each [rows, cols]: in ggml blocks when
    /// every part is (a GGUF file's blocks, or `--quantize`: [`Uploader::quantized`]), else as
    /// [`Uploader::matrix_float`].
    pub fn matrix(&self, parts: &[(String, usize)], cols: usize) -> Result<Mat, CudaError> {
        if let Some(m) = self.quantized(parts, cols, false)? {
            return Ok(m);
        }
        self.matrix_float(parts, cols)
    }

    /// The embedding table `name` [vocab, cols]: in blocks when the file stores it quantized (the lookup
    /// then gives ggml's values, as the CPU engine's), else as a float matrix — `--quantize` leaves the
    /// table's values alone, as the CPU engine does.
    pub fn embedding(&self, name: &str, vocab: usize, cols: usize) -> Result<Mat, CudaError> {
        let parts = [(name.to_string(), vocab)];
        if let Some(m) = self.quantized(&parts, cols, true)? {
            return Ok(m);
        }
        self.matrix_float(&parts, cols)
    }

    /// Under `--quantize`, the LM head tied to the embeddings `name`, quantized as the CPU engine's
    /// (`families::layers::Linear::tied_head`); None when the head reads the embedding table itself.
    pub fn tied_head(
        &self,
        name: &str,
        vocab: usize,
        cols: usize,
    ) -> Result<Option<Mat>, CudaError> {
        match &self.source {
            Source::Checkpoint(ck) if ck.tensors.quantize().is_some() => {
                self.quantized(&[(name.to_string(), vocab)], cols, false)
            }
            _ => Ok(None),
        }
    }

    /// The parts in ggml blocks, when each is: stored so in a GGUF file, or (unless `stored_only`)
    /// quantized now under `--quantize` by the CPU engine's rules (`families::layers::quantize`). None
    /// when any part is not, or when the file reorders the columns of a fused part (then the float path
    /// serves the whole matrix).
    fn quantized(
        &self,
        parts: &[(String, usize)],
        cols: usize,
        stored_only: bool,
    ) -> Result<Option<Mat>, CudaError> {
        let Source::Checkpoint(ck) = &self.source else {
            return Ok(None);
        };
        let mut blocks = Vec::with_capacity(parts.len());
        for (name, rows) in parts {
            let Some(b) = host_blocks(ck, name, *rows, cols, stored_only)? else {
                return Ok(None);
            };
            if b.order.is_some() && parts.len() > 1 {
                return Ok(None);
            }
            blocks.push(b);
        }
        if blocks.is_empty() {
            return Ok(None);
        }
        self.quant_mat(blocks, cols).map(Some)
    }

    /// A quantized matrix from its parts' blocks (in row order): the rows of every part, then the FP8
    /// parts' scales.
    fn quant_mat(&self, blocks: Vec<HostBlocks>, cols: usize) -> Result<Mat, CudaError> {
        let mut bytes = Vec::new();
        let mut parts = Vec::with_capacity(blocks.len());
        for b in &blocks {
            let format = match b.format {
                HostFormat::Ggml(f) => BlockFormat::Ggml(f),
                HostFormat::Fp8 { block, .. } => BlockFormat::Fp8 { block, scales: 0 },
            };
            parts.push(QuantPart {
                format,
                rows: b.rows,
                offset: bytes.len(),
            });
            bytes.extend_from_slice(&b.data);
        }
        for (p, b) in parts.iter_mut().zip(&blocks) {
            if let (BlockFormat::Fp8 { scales, .. }, HostFormat::Fp8 { scales: host, .. }) =
                (&mut p.format, &b.format)
            {
                bytes.resize(bytes.len().next_multiple_of(16), 0);
                *scales = bytes.len();
                bytes.extend(host.iter().flat_map(|s| s.to_le_bytes()));
            }
        }
        let order = blocks.into_iter().find_map(|b| b.order);
        let input_order = match order {
            Some(o) => {
                let o: Vec<i32> = o.iter().map(|&c| c as i32).collect();
                Some(DBuf::from_host(self.dev, &o)?)
            }
            None => None,
        };
        if !self.dev.is_emulated() {
            self.dev.quant_scratch()?;
        }
        Ok(Mat {
            buf: DBuf::from_host(self.dev, &bytes)?,
            rows: parts.iter().map(|p| p.rows).sum(),
            cols,
            dtype: WDtype::Quant,
            tensor_cores: false,
            quant: Some(std::sync::Arc::new(QuantLayout { parts, input_order })),
        })
    }

    /// [`Uploader::matrix`] in a float type only (bf16 or f32 as the format says; a GGUF file's blocks
    /// dequantized): what the MoE experts' kernels read.
    pub fn matrix_float(&self, parts: &[(String, usize)], cols: usize) -> Result<Mat, CudaError> {
        let rows: usize = parts.iter().map(|p| p.1).sum();
        match &self.source {
            Source::Random { seed, .. } => {
                // Synthetic weights are generated as bf16 in either format (their "stored" dtype).
                let dtype = WDtype::Bf16;
                let buf = DBuf::zeros(self.dev, rows * cols * dtype.size())?;
                let count = (rows * cols) as i64;
                if self.dev.is_emulated() {
                    let mut rng = SplitMix(self.next_seed(*seed));
                    let host: Vec<u16> = (0..rows * cols)
                        .map(|_| bf16::from_f32(rng.normal() * 0.02).to_bits())
                        .collect();
                    crate::buf::htod(self.dev, buf.ptr, &host)?;
                    return Ok(Mat {
                        buf,
                        rows,
                        cols,
                        dtype,
                        tensor_cores: self.tensor_cores,
                        quant: None,
                    });
                }
                launch(
                    self.dev,
                    "fill_normal_bf16",
                    elementwise_grid(rows * cols),
                    256,
                    &[
                        Arg::P(buf.ptr),
                        Arg::L(count),
                        Arg::U(self.next_seed(*seed)),
                        Arg::F(0.02),
                    ],
                )?;
                Ok(Mat {
                    buf,
                    rows,
                    cols,
                    dtype,
                    tensor_cores: self.tensor_cores,
                    quant: None,
                })
            }
            Source::Checkpoint(ck) => {
                let mut stored = Vec::with_capacity(parts.len());
                for (name, r) in parts {
                    stored.push(stored_matrix(ck, name, &[*r, cols])?);
                }
                let dtype = fused_dtype(stored.iter().map(|(d, _)| *d), self.format);
                let mut host = Vec::with_capacity(rows * cols * dtype.size());
                for (d, bytes) in stored {
                    convert_into(d, bytes, dtype, &mut host);
                }
                Ok(Mat {
                    buf: DBuf::from_host(self.dev, &host)?,
                    rows,
                    cols,
                    dtype,
                    tensor_cores: self.tensor_cores,
                    quant: None,
                })
            }
        }
    }

    /// A matrix assembled from row runs of stored matrices: `parts` = (full name, rows) [rows, cols],
    /// `runs` = (part index, first row, row count), concatenated in order (the Qwen3-Next GDN re-layout,
    /// `families::layers::gdn::fused_projection_runs`).
    pub fn matrix_runs(
        &self,
        parts: &[(String, usize)],
        runs: &[(usize, usize, usize)],
        cols: usize,
    ) -> Result<Mat, CudaError> {
        let rows: usize = runs.iter().map(|r| r.2).sum();
        let Source::Checkpoint(ck) = &self.source else {
            // Synthetic weights: only the assembled shape matters.
            return self.matrix(&[("runs".to_string(), rows)], cols);
        };
        let mut stored = Vec::with_capacity(parts.len());
        for (name, r) in parts {
            stored.push(stored_matrix(ck, name, &[*r, cols])?);
        }
        let dtype = fused_dtype(stored.iter().map(|(d, _)| *d), self.format);
        let mut host = Vec::with_capacity(rows * cols * dtype.size());
        for &(part, first, count) in runs {
            let bad = || CudaError::Unsupported {
                what: format!(
                    "rows {first}..{} of part {part} of {parts:?}",
                    first + count
                ),
            };
            let (d, bytes) = stored.get(part).ok_or_else(bad)?;
            let row = cols * d.size_in_bytes();
            let slice = bytes
                .get(first * row..(first + count) * row)
                .ok_or_else(bad)?;
            convert_into(*d, slice, dtype, &mut host);
        }
        Ok(Mat {
            buf: DBuf::from_host(self.dev, &host)?,
            rows,
            cols,
            dtype,
            tensor_cores: self.tensor_cores,
            quant: None,
        })
    }

    /// A stored 3-D tensor `name` [n, rows, cols] (transformers 5's fused experts) as one
    /// [n * rows, cols] matrix.
    pub fn matrix_stacked(
        &self,
        name: &str,
        n: usize,
        rows: usize,
        cols: usize,
    ) -> Result<Mat, CudaError> {
        let Source::Checkpoint(ck) = &self.source else {
            return self.matrix(&[(name.to_string(), n * rows)], cols);
        };
        let (d, bytes) = stored_matrix(ck, name, &[n, rows, cols])?;
        let dtype = target_dtype(d, self.format);
        let mut host = Vec::with_capacity(n * rows * cols * dtype.size());
        convert_into(d, bytes, dtype, &mut host);
        Ok(Mat {
            buf: DBuf::from_host(self.dev, &host)?,
            rows: n * rows,
            cols,
            dtype,
            tensor_cores: self.tensor_cores,
            quant: None,
        })
    }

    /// Columns `columns` of the matrix `name` [rows, cols], as a [rows, columns.len()] matrix (the two
    /// input halves of the MTP head's `fc`).
    pub fn matrix_columns(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
        columns: std::ops::Range<usize>,
    ) -> Result<Mat, CudaError> {
        let width = columns.len();
        let Source::Checkpoint(ck) = &self.source else {
            // Synthetic weights have no stored whole to slice: the slice's shape is all that matters.
            return self.matrix(&[(name.to_string(), rows)], width);
        };
        if columns.end > cols {
            return Err(CudaError::Unsupported {
                what: format!("columns {columns:?} of {name} with {cols} columns"),
            });
        }
        if let Some(HostBlocks {
            format: HostFormat::Ggml(format),
            data,
            order: None,
            ..
        }) = host_blocks(ck, name, rows, cols, false)?
        {
            let block = format.block_len();
            if columns.start.is_multiple_of(block) && width.is_multiple_of(block) {
                // Whole blocks of each row: the slice is a matrix of the same format.
                let (row_bytes, first) = (format.row_bytes(cols), format.row_bytes(columns.start));
                let mut bytes = Vec::with_capacity(rows * format.row_bytes(width));
                for row in data.chunks_exact(row_bytes) {
                    bytes.extend_from_slice(&row[first..first + format.row_bytes(width)]);
                }
                let part = HostBlocks {
                    format: HostFormat::Ggml(format),
                    rows,
                    data: bytes,
                    order: None,
                };
                return self.quant_mat(vec![part], width);
            }
        }
        let (dtype, bytes) = stored_matrix(ck, name, &[rows, cols])?;
        let to = target_dtype(dtype, self.format);
        let size = dtype.size_in_bytes();
        let mut host = Vec::with_capacity(rows * width * to.size());
        for row in bytes.chunks_exact(cols * size) {
            convert_into(
                dtype,
                &row[columns.start * size..columns.end * size],
                to,
                &mut host,
            );
        }
        Ok(Mat {
            buf: DBuf::from_host(self.dev, &host)?,
            rows,
            cols: width,
            dtype: to,
            tensor_cores: self.tensor_cores,
            quant: None,
        })
    }

    /// A small f32 parameter of `shape`; `kind` says how a synthetic one is initialised.
    pub fn vector(&self, name: &str, shape: &[usize], kind: Init) -> Result<DBuf, CudaError> {
        let host = self.vector_host(name, shape, kind)?;
        DBuf::from_host(self.dev, &host)
    }

    /// The host values of [`Uploader::vector`].
    pub fn vector_host(
        &self,
        name: &str,
        shape: &[usize],
        kind: Init,
    ) -> Result<Vec<f32>, CudaError> {
        let n: usize = shape.iter().product();
        Ok(match &self.source {
            Source::Checkpoint(ck) => ck.tensors.load_f32(name, shape)?,
            Source::Random { seed, zero_centred } => {
                let mut rng = SplitMix(self.next_seed(*seed));
                (0..n)
                    .map(|_| match kind {
                        Init::Norm => {
                            if *zero_centred {
                                0.0
                            } else {
                                1.0
                            }
                        }
                        Init::One => 1.0,
                        Init::Normal(std) => rng.normal() * std,
                        Init::LogUniform(lo, hi) => (lo + (hi - lo) * rng.uniform()).ln(),
                    })
                    .collect()
            }
        })
    }
}

/// How a part's blocks are held on the host.
enum HostFormat {
    Ggml(QuantFormat),
    /// FP8 with its scales as stored (f32 [⌈rows / block[0]⌉, ⌈cols / block[1]⌉]).
    Fp8 {
        block: [usize; 2],
        scales: Vec<f32>,
    },
}

/// A matrix's blocks on the host, with the file's column order when it has one.
struct HostBlocks {
    format: HostFormat,
    rows: usize,
    data: Vec<u8>,
    order: Option<Vec<usize>>,
}

/// The blocks of matrix `name` [rows, cols] on the host: a GGUF file's ggml blocks or an FP8
/// checkpoint's, or (unless `stored_only`) quantized now under `--quantize` by the CPU engine's rules.
/// None when the matrix stays in floats (or is FP8 with rows the FP8 kernel does not take: its columns
/// a multiple of 16).
fn host_blocks(
    ck: &Checkpoint,
    name: &str,
    rows: usize,
    cols: usize,
    stored_only: bool,
) -> Result<Option<HostBlocks>, CudaError> {
    let ggml = |format, data, order| HostBlocks {
        format: HostFormat::Ggml(format),
        rows,
        data,
        order,
    };
    if let Some(q) = ck.tensors.quantized(name, [rows, cols])? {
        let format = QuantFormat::from_name(q.ggml_type).ok_or_else(|| CudaError::Unsupported {
            what: format!("tensor `{name}` in {}", q.ggml_type),
        })?;
        return Ok(Some(ggml(format, q.data, q.input_order)));
    }
    let fp8_fits = cols.is_multiple_of(16);
    if let Some(f) = ck.tensors.fp8(name, [rows, cols])? {
        return Ok(fp8_fits.then_some(HostBlocks {
            format: HostFormat::Fp8 {
                block: f.block,
                scales: f.scales,
            },
            rows,
            data: f.data,
            order: None,
        }));
    }
    let Some(quantize) = ck.tensors.quantize().filter(|_| !stored_only) else {
        return Ok(None);
    };
    if let Some(block) = families::layers::quantize::fp8_block_for(quantize, name, rows) {
        if !fp8_fits {
            return Ok(None);
        }
        let w = ck.tensors.load_f32(name, &[rows, cols])?;
        let (data, scales) = kernels::Fp8Matrix::quantize(&w, rows, cols, block).parts();
        return Ok(Some(HostBlocks {
            format: HostFormat::Fp8 { block, scales },
            rows,
            data,
            order: None,
        }));
    }
    let Some(format) = families::layers::quantize::format_for(quantize, name, rows, cols) else {
        return Ok(None);
    };
    let w = ck.tensors.load_f32(name, &[rows, cols])?;
    let m = kernels::quantize_matrix(format, &w, rows, cols);
    Ok(Some(ggml(format, m.data().to_vec(), None)))
}

/// One precision for a matrix fused from parts: f32 if any part would be f32.
fn fused_dtype(stored: impl Iterator<Item = DType>, format: WeightFormat) -> WDtype {
    stored
        .map(|d| target_dtype(d, format))
        .fold(WDtype::Bf16, |acc, d| {
            if d == WDtype::F32 {
                WDtype::F32
            } else {
                acc
            }
        })
}

/// The stored dtype and bytes of the tensor `name`, which must have shape `expected` ([rows, cols] for
/// a matrix, [n, rows, cols] for stacked experts).
fn stored_matrix<'c>(
    ck: &'c Checkpoint,
    name: &str,
    expected: &[usize],
) -> Result<(DType, &'c [u8]), CudaError> {
    let (dtype, shape, bytes) = ck.tensors.raw(name)?;
    if shape != expected {
        return Err(model_io::LoadError::ShapeMismatch {
            path: ck.tensors.path_of(name)?.to_path_buf(),
            tensor: name.to_string(),
            expected: expected.to_vec(),
            found: shape.to_vec(),
        }
        .into());
    }
    Ok((dtype, bytes))
}

/// Initialisation of a synthetic small parameter (synth's rules).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Init {
    /// An RMSNorm weight: 0 for zero-centred norms (scale 1 + 0), else 1.
    Norm,
    One,
    Normal(f32),
    LogUniform(f32, f32),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn u16s(b: &[u8]) -> Vec<u16> {
        b.chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect()
    }

    #[test]
    fn f32_to_bf16_rounds_to_nearest_even() {
        // 1 = 0x3F80; 1 + 2^-8 is a tie between 0x3F80 and 0x3F81 -> even 0x3F80;
        // 1 + 3*2^-8 is a tie between 0x3F81 and 0x3F82 -> even 0x3F82; 1 + 2^-8 + 2^-12 rounds up;
        // -2 = 0xC000.
        let v = [
            1.0,
            1.0 + 1.0 / 256.0,
            1.0 + 3.0 / 256.0,
            1.0 + 1.0 / 256.0 + 1.0 / 4096.0,
            -2.0,
        ];
        let mut out = Vec::new();
        convert_into(DType::F32, &f32_bytes(&v), WDtype::Bf16, &mut out);
        assert_eq!(u16s(&out), vec![0x3F80, 0x3F80, 0x3F82, 0x3F81, 0xC000]);
    }

    #[test]
    fn stored_precision_is_kept_or_widened_exactly() {
        // bf16 -> bf16 and f32 -> f32 copy the bytes; f16 -> f32 is exact (1.5 = 0x3E00 in f16).
        let bf = vec![0x80u8, 0x3F, 0x00, 0xC0];
        let mut out = Vec::new();
        convert_into(DType::BF16, &bf, WDtype::Bf16, &mut out);
        assert_eq!(out, bf);
        let mut out = Vec::new();
        convert_into(DType::F16, &[0x00, 0x3E], WDtype::F32, &mut out);
        assert_eq!(out, 1.5f32.to_le_bytes().to_vec());
        let mut out = Vec::new();
        convert_into(DType::BF16, &bf, WDtype::F32, &mut out);
        assert_eq!(out, f32_bytes(&[1.0, -2.0]));
    }

    #[test]
    fn weight_format_picks_the_gpu_dtype() {
        assert_eq!(target_dtype(DType::F32, WeightFormat::Bf16), WDtype::Bf16);
        assert_eq!(target_dtype(DType::F16, WeightFormat::Bf16), WDtype::Bf16);
        assert_eq!(
            target_dtype(DType::F32, WeightFormat::AsStored),
            WDtype::F32
        );
        assert_eq!(
            target_dtype(DType::F16, WeightFormat::AsStored),
            WDtype::F32
        );
        assert_eq!(
            target_dtype(DType::BF16, WeightFormat::AsStored),
            WDtype::Bf16
        );
    }
}
