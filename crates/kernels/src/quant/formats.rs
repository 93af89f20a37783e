//! The block formats of quantized weight rows (ggml's layouts, as GGUF files store them), and their
//! scalar decoding into the form every quantized kernel computes with.
//!
//! Every format decodes a 64-element *step* of a row into 64 unsigned integers `u` (one byte each) and,
//! per lane of 4 elements (16 lanes a step), a scale `a` and an additive term `b`, so that the weight is
//! `w = a · (u - o) + b` for the format's integer offset `o` (a power of two, or 0). This is exactly
//! ggml's `dequantize_row_*` arithmetic: `d · (q - 8)`, `d · q + m`, `(d · sc) · q - dmin · m`,
//! `(d · sc) · (q - 32)`, with `a`, `b` computed by the same float operations, so [`dequantize_row`]
//! gives ggml's bits. A format whose blocks are 32 elements long covers a step with two blocks (the second
//! absent at the end of a row of an odd number of blocks: then `u`, `a`, `b` are 0 there).
//!
//! Invariant: decoding never reads outside the row's `row_bytes(k)` bytes.

use half::f16;

/// A quantized weight format (ggml's block layouts).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuantFormat {
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q4K,
    Q5K,
    Q6K,
}

/// Elements a step covers: one 64-byte vector of unsigned weights.
pub(crate) const STEP: usize = 64;
/// Lanes of 4 elements per step (the i32 lanes of an AVX-512 dot product).
pub(crate) const LANES: usize = 16;

impl QuantFormat {
    pub const ALL: [QuantFormat; 8] = [
        QuantFormat::Q4_0,
        QuantFormat::Q4_1,
        QuantFormat::Q5_0,
        QuantFormat::Q5_1,
        QuantFormat::Q8_0,
        QuantFormat::Q4K,
        QuantFormat::Q5K,
        QuantFormat::Q6K,
    ];

    /// ggml's name ("Q4_K", ...).
    pub fn name(self) -> &'static str {
        match self {
            QuantFormat::Q4_0 => "Q4_0",
            QuantFormat::Q4_1 => "Q4_1",
            QuantFormat::Q5_0 => "Q5_0",
            QuantFormat::Q5_1 => "Q5_1",
            QuantFormat::Q8_0 => "Q8_0",
            QuantFormat::Q4K => "Q4_K",
            QuantFormat::Q5K => "Q5_K",
            QuantFormat::Q6K => "Q6_K",
        }
    }

    /// The format of ggml's name, if it is one of ours.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.name() == name)
    }

    /// Elements per block.
    pub fn block_len(self) -> usize {
        match self {
            QuantFormat::Q4K | QuantFormat::Q5K | QuantFormat::Q6K => 256,
            _ => 32,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            QuantFormat::Q4_0 => 18,
            QuantFormat::Q4_1 => 20,
            QuantFormat::Q5_0 => 22,
            QuantFormat::Q5_1 => 24,
            QuantFormat::Q8_0 => 34,
            QuantFormat::Q4K => 144,
            QuantFormat::Q5K => 176,
            QuantFormat::Q6K => 210,
        }
    }

    /// Bytes of a row of `k` elements (`k` a multiple of [`QuantFormat::block_len`]).
    pub fn row_bytes(self, k: usize) -> usize {
        k / self.block_len() * self.block_bytes()
    }

    /// The integer offset `o` of `w = a · (u - o) + b`.
    pub(crate) fn offset(self) -> i32 {
        match self {
            QuantFormat::Q4_0 => 8,
            QuantFormat::Q5_0 => 16,
            QuantFormat::Q8_0 => 128,
            QuantFormat::Q6K => 32,
            QuantFormat::Q4_1 | QuantFormat::Q5_1 | QuantFormat::Q4K | QuantFormat::Q5K => 0,
        }
    }

    /// Whether the format has the additive term `b` (a block minimum).
    pub(crate) fn has_min(self) -> bool {
        matches!(
            self,
            QuantFormat::Q4_1 | QuantFormat::Q5_1 | QuantFormat::Q4K | QuantFormat::Q5K
        )
    }
}

/// One decoded step: `w[e] = a[e / 4] · (u[e] - o) + b[e / 4]`.
pub(crate) struct Step {
    pub u: [u8; STEP],
    pub a: [f32; LANES],
    pub b: [f32; LANES],
}

impl Step {
    pub(crate) fn zero() -> Self {
        Step {
            u: [0; STEP],
            a: [0.0; LANES],
            b: [0.0; LANES],
        }
    }
}

#[inline(always)]
pub(crate) fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

/// The 6-bit scale and min `j` (0..8) of a Q4_K / Q5_K super-block's 12 packed bytes (ggml's
/// `get_scale_min_k4`).
#[inline(always)]
pub(crate) fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Decodes step `s` (elements `64 s .. 64 s + 64`) of a row of `format` into `out`.
pub(crate) fn decode_step(format: QuantFormat, row: &[u8], k: usize, s: usize, out: &mut Step) {
    match format.block_len() {
        32 => {
            let blocks = k / 32;
            for half in 0..2 {
                let block = 2 * s + half;
                let (u, lanes) = (
                    &mut out.u[32 * half..32 * half + 32],
                    8 * half..8 * half + 8,
                );
                if block >= blocks {
                    u.fill(0);
                    out.a[lanes.clone()].fill(0.0);
                    out.b[lanes].fill(0.0);
                    continue;
                }
                let bb = format.block_bytes();
                let (a, b) = decode_block32(format, &row[block * bb..(block + 1) * bb], u);
                out.a[lanes.clone()].fill(a);
                out.b[lanes].fill(b);
            }
        }
        _ => {
            let (block, c) = (s / 4, s % 4); // super-block, step within it
            let bb = format.block_bytes();
            decode_k_step(format, &row[block * bb..(block + 1) * bb], c, out);
        }
    }
}

/// A 32-element block into `u[32]`; returns (a, b).
fn decode_block32(format: QuantFormat, blk: &[u8], u: &mut [u8]) -> (f32, f32) {
    let d = f16_at(blk, 0);
    match format {
        QuantFormat::Q8_0 => {
            for (u, &q) in u.iter_mut().zip(&blk[2..34]) {
                *u = q ^ 0x80; // (q as i8) + 128
            }
            (d, 0.0)
        }
        QuantFormat::Q4_0 | QuantFormat::Q4_1 => {
            let qs = if format == QuantFormat::Q4_0 {
                &blk[2..18]
            } else {
                &blk[4..20]
            };
            for j in 0..16 {
                u[j] = qs[j] & 0xF;
                u[j + 16] = qs[j] >> 4;
            }
            let b = if format == QuantFormat::Q4_1 {
                f16_at(blk, 2)
            } else {
                0.0
            };
            (d, b)
        }
        QuantFormat::Q5_0 | QuantFormat::Q5_1 => {
            let (b, at) = if format == QuantFormat::Q5_1 {
                (f16_at(blk, 2), 4)
            } else {
                (0.0, 2)
            };
            let qh = u32::from_le_bytes([blk[at], blk[at + 1], blk[at + 2], blk[at + 3]]);
            let qs = &blk[at + 4..at + 20];
            for j in 0..16 {
                u[j] = (qs[j] & 0xF) | ((((qh >> j) & 1) as u8) << 4);
                u[j + 16] = (qs[j] >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
            }
            (d, b)
        }
        _ => unreachable!("decode_block32: {format:?} has 256-element blocks"),
    }
}

/// Step `c` (0..4) of a k-quant super-block.
fn decode_k_step(format: QuantFormat, blk: &[u8], c: usize, out: &mut Step) {
    match format {
        QuantFormat::Q4K | QuantFormat::Q5K => {
            let (d, dmin) = (f16_at(blk, 0), f16_at(blk, 2));
            let scales = &blk[4..16];
            let (qh, qs) = if format == QuantFormat::Q5K {
                (Some(&blk[16..48]), &blk[48..176])
            } else {
                (None, &blk[16..144])
            };
            let ql = &qs[32 * c..32 * c + 32];
            for l in 0..32 {
                let (mut lo, mut hi) = (ql[l] & 0xF, ql[l] >> 4);
                if let Some(qh) = qh {
                    lo |= ((qh[l] >> (2 * c)) & 1) << 4;
                    hi |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
                }
                out.u[l] = lo;
                out.u[l + 32] = hi;
            }
            for half in 0..2 {
                let (sc, m) = scale_min_k4(2 * c + half, scales);
                let (a, b) = (d * sc as f32, -(dmin * m as f32));
                out.a[8 * half..8 * half + 8].fill(a);
                out.b[8 * half..8 * half + 8].fill(b);
            }
        }
        QuantFormat::Q6K => {
            let (h, odd) = (c / 2, c % 2 == 1); // 128-element half, upper 64 of it
            let ql = &blk[64 * h..64 * h + 64];
            let qh = &blk[128 + 32 * h..128 + 32 * h + 32];
            let sc = &blk[192..208];
            let d = f16_at(blk, 208);
            for l in 0..32 {
                let (q0, q1) = if odd {
                    (
                        (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4),
                        (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4),
                    )
                } else {
                    (
                        (ql[l] & 0xF) | ((qh[l] & 3) << 4),
                        (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4),
                    )
                };
                out.u[l] = q0;
                out.u[l + 32] = q1;
            }
            for g in 0..4 {
                let a = d * (sc[4 * c + g] as i8) as f32;
                out.a[4 * g..4 * g + 4].fill(a);
            }
            out.b.fill(0.0);
        }
        _ => unreachable!("decode_k_step: {format:?} has 32-element blocks"),
    }
}

/// Dequantizes row `row` ([`QuantFormat::row_bytes`]`(k)` bytes) into `out[k]`: ggml's values, bit for bit.
pub fn dequantize_row(format: QuantFormat, row: &[u8], k: usize, out: &mut [f32]) {
    let o = format.offset();
    let mut step = Step::zero();
    for s in 0..k.div_ceil(STEP) {
        decode_step(format, row, k, s, &mut step);
        let end = (STEP * s + STEP).min(k);
        for (e, w) in out[STEP * s..end].iter_mut().enumerate() {
            let lane = e / 4;
            let q = step.u[e] as i32 - o;
            *w = if format.has_min() {
                step.a[lane] * q as f32 + step.b[lane]
            } else {
                step.a[lane] * q as f32
            };
        }
    }
}
