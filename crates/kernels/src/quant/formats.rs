//! The block formats of quantized weight rows (ggml's layouts, as GGUF files store them), and their
//! scalar decoding into the form every quantized kernel computes with.
//!
//! A row is decoded in *chunks* of 256 elements (a k-quant super-block, or eight 32-element blocks) of four
//! 64-element *steps*. A chunk's scales come out together ([`decode_chunk`]: `v[16]`, per 32-element
//! sub-block j a scale `v[j]` and, for formats with a minimum, an additive term `v[8 + j]`; Q6_K has 16
//! scales of 16 elements); a step gives 64 unsigned integers `u` ([`decode_step`]), one byte each, so that
//! the weight is `w = a · (u - o) + b` for the format's integer offset `o` (a power of two, or 0), `a` the
//! element's scale and `b` its term. This is exactly ggml's `dequantize_row_*` arithmetic: `d · (q - 8)`,
//! `d · q + m`, `(d · sc) · q - dmin · m`, `(d · sc) · (q - 32)`, with `a`, `b` computed by the same float
//! operations, so [`dequantize_row`] gives ggml's bits. A format whose blocks are 32 elements long covers a
//! step with two blocks (the second absent at the end of a row of an odd number of blocks: then `u` is 0
//! there), and its last chunk may hold fewer than eight blocks (the scales of the others are 0).
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
/// Steps per chunk: a k-quant super-block, or eight 32-element blocks, whose scales are decoded together.
pub(crate) const CHUNK_STEPS: usize = 4;

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

#[inline(always)]
pub(crate) fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

/// The scales of chunk `ch` (elements `256 ch .. 256 ch + 256`: a k-quant super-block, or eight 32-element
/// blocks): `v[j]` = `a` of sub-block j (32 elements; Q6_K: 16 elements, j < 16) and, for formats with a
/// minimum, `v[8 + j]` = `b` of sub-block j. Blocks past the row's end give 0.
pub(crate) fn decode_chunk(
    format: QuantFormat,
    row: &[u8],
    k: usize,
    ch: usize,
    v: &mut [f32; 16],
) {
    v.fill(0.0);
    let bb = format.block_bytes();
    if format.block_len() == 32 {
        let first = 8 * ch;
        for j in 0..(k / 32).saturating_sub(first).min(8) {
            let blk = &row[(first + j) * bb..(first + j + 1) * bb];
            v[j] = f16_at(blk, 0);
            if format.has_min() {
                v[8 + j] = f16_at(blk, 2);
            }
        }
        return;
    }
    let blk = &row[ch * bb..(ch + 1) * bb];
    match format {
        QuantFormat::Q4K | QuantFormat::Q5K => {
            let (d, dmin) = (f16_at(blk, 0), -f16_at(blk, 2));
            let sm = scales_mins_k4(blk[4..16].try_into().expect("12 bytes"));
            for j in 0..8 {
                v[j] = d * sm[j] as f32;
                v[8 + j] = dmin * sm[8 + j] as f32; // = -(dmin · m): negation is exact
            }
        }
        QuantFormat::Q6K => {
            let d = f16_at(blk, 208);
            for (j, v) in v.iter_mut().enumerate() {
                *v = d * (blk[192 + j] as i8) as f32;
            }
        }
        _ => unreachable!("decode_chunk: {format:?} has 32-element blocks"),
    }
}

/// The 8 6-bit scales and 8 6-bit mins of a Q4_K / Q5_K super-block's 12 packed bytes, as
/// `[sc0..sc8, m0..m8]` (ggml's `get_scale_min_k4` for j = 0..8, four at a time as llama.cpp does).
#[inline(always)]
pub(crate) fn scales_mins_k4(q: &[u8; 12]) -> [u8; 16] {
    let w = |i: usize| u32::from_le_bytes([q[4 * i], q[4 * i + 1], q[4 * i + 2], q[4 * i + 3]]);
    let (u0, u1, u2) = (w(0), w(1), w(2));
    let (m6, m4, m2) = (0x3F3F_3F3F, 0x0F0F_0F0F, 0x0303_0303);
    let words = [
        u0 & m6,
        (u2 & m4) | (((u0 >> 6) & m2) << 4),
        u1 & m6,
        ((u2 >> 4) & m4) | (((u1 >> 6) & m2) << 4),
    ];
    let mut out = [0u8; 16];
    for (o, w) in out.chunks_exact_mut(4).zip(words) {
        o.copy_from_slice(&w.to_le_bytes());
    }
    out
}

/// The `v` index (of [`decode_chunk`]) of the scale of lane `l` (elements 4l..4l+4) of step `c` (0..4) of
/// a chunk.
#[inline(always)]
pub(crate) fn lane_scale(format: QuantFormat, c: usize, l: usize) -> usize {
    if format == QuantFormat::Q6K {
        4 * c + l / 4
    } else {
        2 * c + l / 8
    }
}

/// The unsigned weights `u` of step `s` (elements `64 s .. 64 s + 64`; 0 past the row's end).
pub(crate) fn decode_step(format: QuantFormat, row: &[u8], k: usize, s: usize, u: &mut [u8; STEP]) {
    let bb = format.block_bytes();
    if format.block_len() == 32 {
        for half in 0..2 {
            let block = 2 * s + half;
            let u = &mut u[32 * half..32 * half + 32];
            if block >= k / 32 {
                u.fill(0);
            } else {
                decode_block32(format, &row[block * bb..(block + 1) * bb], u);
            }
        }
        return;
    }
    let (blk, c) = (&row[s / 4 * bb..(s / 4 + 1) * bb], s % 4); // super-block, step within it
    match format {
        QuantFormat::Q4K | QuantFormat::Q5K => {
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
                u[l] = lo;
                u[l + 32] = hi;
            }
        }
        QuantFormat::Q6K => {
            let (h, shift) = (c / 2, 4 * (c % 2) as u32); // 128-element half, nibble of it
            let ql = &blk[64 * h..64 * h + 64];
            let qh = &blk[128 + 32 * h..128 + 32 * h + 32];
            for l in 0..32 {
                u[l] = ((ql[l] >> shift) & 0xF) | (((qh[l] >> shift) & 3) << 4);
                u[l + 32] = ((ql[l + 32] >> shift) & 0xF) | (((qh[l] >> (shift + 2)) & 3) << 4);
            }
        }
        _ => unreachable!("decode_step: {format:?} has 32-element blocks"),
    }
}

/// The unsigned weights of a 32-element block into `u[32]`.
fn decode_block32(format: QuantFormat, blk: &[u8], u: &mut [u8]) {
    match format {
        QuantFormat::Q8_0 => {
            for (u, &q) in u.iter_mut().zip(&blk[2..34]) {
                *u = q ^ 0x80; // (q as i8) + 128
            }
        }
        QuantFormat::Q4_0 | QuantFormat::Q4_1 => {
            let at = if format == QuantFormat::Q4_0 { 2 } else { 4 };
            for (j, &q) in blk[at..at + 16].iter().enumerate() {
                u[j] = q & 0xF;
                u[j + 16] = q >> 4;
            }
        }
        QuantFormat::Q5_0 | QuantFormat::Q5_1 => {
            let at = if format == QuantFormat::Q5_0 { 2 } else { 4 };
            let qh = u32::from_le_bytes([blk[at], blk[at + 1], blk[at + 2], blk[at + 3]]);
            for (j, &q) in blk[at + 4..at + 20].iter().enumerate() {
                u[j] = (q & 0xF) | ((((qh >> j) & 1) as u8) << 4);
                u[j + 16] = (q >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
            }
        }
        _ => unreachable!("decode_block32: {format:?} has 256-element blocks"),
    }
}

/// Dequantizes row `row` ([`QuantFormat::row_bytes`]`(k)` bytes) into `out[k]`: ggml's values, bit for bit
/// (`w = a · (u - o)`, plus `b` for formats with a minimum: the same float operations as ggml's).
pub fn dequantize_row(format: QuantFormat, row: &[u8], k: usize, out: &mut [f32]) {
    let o = format.offset();
    let (mut v, mut u) = ([0f32; 16], [0u8; STEP]);
    for s in 0..k.div_ceil(STEP) {
        let c = s % 4;
        if c == 0 {
            decode_chunk(format, row, k, s / 4, &mut v);
        }
        decode_step(format, row, k, s, &mut u);
        let end = (STEP * s + STEP).min(k);
        for (e, w) in out[STEP * s..end].iter_mut().enumerate() {
            let a = v[lane_scale(format, c, e / 4)];
            let q = (u[e] as i32 - o) as f32;
            *w = if format.has_min() {
                a * q + v[8 + 2 * c + e / 32]
            } else {
                a * q
            };
        }
    }
}
