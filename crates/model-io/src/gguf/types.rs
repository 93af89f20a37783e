//! ggml tensor types: their block layouts, and the scalar reference dequantization to f32.
//!
//! A row of `n` elements of a block type is `n / block_len` consecutive blocks of `block_bytes`
//! each; a row length that is not a multiple of the block length is invalid. Dequantization follows
//! ggml-quants.c `dequantize_row_*` element for element, with the float operations in the same order
//! (`d * q`, `d * q + m`, `(d * sc) * q - dmin * m`), so results are bit-identical to ggml's and to
//! the `gguf` Python package's numpy reference (checked by the fixture test). Rust does not contract
//! `a * b + c` into an FMA, so the rounding is that of the separate operations, as in the references.
//!
//! Invariant: [`GgmlType::byte_size`] is the exact stored size of a tensor (checked arithmetic), and
//! [`dequantize`] writes exactly `bytes.len() / block_bytes * block_len` values or returns an error;
//! it never panics on any byte content.

use half::{bf16, f16};

/// The ggml types a GGUF tensor may have (ids as in ggml.h).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    IQ2XXS,
    IQ2XS,
    IQ3XXS,
    IQ1S,
    IQ4NL,
    IQ3S,
    IQ2S,
    IQ4XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
    NVFP4,
    Q1_0,
}

/// Elements of a k-quant super-block.
const QK_K: usize = 256;

/// (type, id, name, elements per block, bytes per block), from ggml.h / gguf-py's GGML_QUANT_SIZES.
const TABLE: [(GgmlType, u32, &str, usize, usize); 34] = [
    (GgmlType::F32, 0, "F32", 1, 4),
    (GgmlType::F16, 1, "F16", 1, 2),
    (GgmlType::Q4_0, 2, "Q4_0", 32, 18),
    (GgmlType::Q4_1, 3, "Q4_1", 32, 20),
    (GgmlType::Q5_0, 6, "Q5_0", 32, 22),
    (GgmlType::Q5_1, 7, "Q5_1", 32, 24),
    (GgmlType::Q8_0, 8, "Q8_0", 32, 34),
    (GgmlType::Q8_1, 9, "Q8_1", 32, 40),
    (GgmlType::Q2K, 10, "Q2_K", QK_K, 84),
    (GgmlType::Q3K, 11, "Q3_K", QK_K, 110),
    (GgmlType::Q4K, 12, "Q4_K", QK_K, 144),
    (GgmlType::Q5K, 13, "Q5_K", QK_K, 176),
    (GgmlType::Q6K, 14, "Q6_K", QK_K, 210),
    (GgmlType::Q8K, 15, "Q8_K", QK_K, 292),
    (GgmlType::IQ2XXS, 16, "IQ2_XXS", QK_K, 66),
    (GgmlType::IQ2XS, 17, "IQ2_XS", QK_K, 74),
    (GgmlType::IQ3XXS, 18, "IQ3_XXS", QK_K, 98),
    (GgmlType::IQ1S, 19, "IQ1_S", QK_K, 50),
    (GgmlType::IQ4NL, 20, "IQ4_NL", 32, 18),
    (GgmlType::IQ3S, 21, "IQ3_S", QK_K, 110),
    (GgmlType::IQ2S, 22, "IQ2_S", QK_K, 82),
    (GgmlType::IQ4XS, 23, "IQ4_XS", QK_K, 136),
    (GgmlType::I8, 24, "I8", 1, 1),
    (GgmlType::I16, 25, "I16", 1, 2),
    (GgmlType::I32, 26, "I32", 1, 4),
    (GgmlType::I64, 27, "I64", 1, 8),
    (GgmlType::F64, 28, "F64", 1, 8),
    (GgmlType::IQ1M, 29, "IQ1_M", QK_K, 56),
    (GgmlType::BF16, 30, "BF16", 1, 2),
    (GgmlType::TQ1_0, 34, "TQ1_0", QK_K, 54),
    (GgmlType::TQ2_0, 35, "TQ2_0", QK_K, 66),
    (GgmlType::MXFP4, 39, "MXFP4", 32, 17),
    (GgmlType::NVFP4, 40, "NVFP4", 64, 36),
    (GgmlType::Q1_0, 41, "Q1_0", 128, 18),
];

/// The types [`dequantize`] converts.
pub const DEQUANTIZED_TYPES: &str =
    "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K";

impl GgmlType {
    pub fn from_id(id: u32) -> Option<Self> {
        TABLE.iter().find(|row| row.1 == id).map(|row| row.0)
    }

    fn row(self) -> &'static (GgmlType, u32, &'static str, usize, usize) {
        // Every variant has a row (the table is exhaustive; `table_is_exhaustive` checks it).
        TABLE.iter().find(|row| row.0 == self).unwrap_or(&TABLE[0])
    }

    pub fn id(self) -> u32 {
        self.row().1
    }

    /// The ggml name ("Q4_K", "BF16", ...).
    pub fn name(self) -> &'static str {
        self.row().2
    }

    /// Elements per block.
    pub fn block_len(self) -> usize {
        self.row().3
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        self.row().4
    }

    /// Whether [`dequantize`] converts this type.
    pub fn is_supported(self) -> bool {
        use GgmlType::*;
        matches!(
            self,
            F32 | F16 | BF16 | Q8_0 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q4K | Q5K | Q6K
        )
    }

    /// Stored bytes of a tensor with `extents` (innermost first). Errors: a row length that is not a
    /// multiple of the block length, or a size that overflows.
    pub fn byte_size(self, extents: &[usize]) -> Result<usize, String> {
        let row_len = extents.first().copied().unwrap_or(1);
        if !row_len.is_multiple_of(self.block_len()) {
            return Err(format!(
                "row length {row_len} is not a multiple of the {}-element block of {}",
                self.block_len(),
                self.name()
            ));
        }
        extents
            .iter()
            .try_fold(1usize, |acc, &e| acc.checked_mul(e))
            .and_then(|numel| (numel / self.block_len()).checked_mul(self.block_bytes()))
            .ok_or_else(|| "size overflows".to_string())
    }
}

/// Dequantizes `bytes` (whole blocks of `ty`) into `out`, which must hold exactly the elements.
pub fn dequantize(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<(), String> {
    let (len, size) = (ty.block_len(), ty.block_bytes());
    if !bytes.len().is_multiple_of(size) || bytes.len() / size * len != out.len() {
        return Err(format!(
            "{} bytes of {} do not hold {} elements",
            bytes.len(),
            ty.name(),
            out.len()
        ));
    }
    let blocks = bytes.chunks_exact(size).zip(out.chunks_exact_mut(len));
    match ty {
        GgmlType::F32 => {
            blocks.for_each(|(b, y)| y[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        }
        GgmlType::F16 => blocks.for_each(|(b, y)| y[0] = half_at(b, 0)),
        GgmlType::BF16 => blocks
            .for_each(|(b, y)| y[0] = bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()),
        GgmlType::Q8_0 => blocks.for_each(|(b, y)| q8_0(b, y)),
        GgmlType::Q4_0 => blocks.for_each(|(b, y)| q4_0(b, y)),
        GgmlType::Q4_1 => blocks.for_each(|(b, y)| q4_1(b, y)),
        GgmlType::Q5_0 => blocks.for_each(|(b, y)| q5_0(b, y)),
        GgmlType::Q5_1 => blocks.for_each(|(b, y)| q5_1(b, y)),
        GgmlType::Q4K => blocks.for_each(|(b, y)| q4_k(b, y)),
        GgmlType::Q5K => blocks.for_each(|(b, y)| q5_k(b, y)),
        GgmlType::Q6K => blocks.for_each(|(b, y)| q6_k(b, y)),
        other => {
            return Err(format!(
                "ggml type {} cannot be dequantized yet (supported: {DEQUANTIZED_TYPES})",
                other.name()
            ))
        }
    }
    Ok(())
}

// The block functions below take one whole block `b` (`block_bytes` long) and its `block_len`
// outputs `y`; `dequantize` guarantees both lengths, so the fixed indices are in bounds.

/// The f16 at `b[at..at + 2]` as f32.
fn half_at(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// Q8_0: f16 scale d, 32 x i8. y = q * d.
fn q8_0(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    for (yi, &q) in y.iter_mut().zip(&b[2..34]) {
        *yi = f32::from(q as i8) * d;
    }
}

/// Q4_0: d, 16 bytes of nibbles (low nibbles are elements 0..16, high 16..32). y = (q - 8) * d.
fn q4_0(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    for j in 0..16 {
        let q = b[2 + j];
        y[j] = f32::from((q & 0x0F) as i8 - 8) * d;
        y[j + 16] = f32::from((q >> 4) as i8 - 8) * d;
    }
}

/// Q4_1: d, m, nibbles. y = q * d + m.
fn q4_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (half_at(b, 0), half_at(b, 2));
    for j in 0..16 {
        let q = b[4 + j];
        y[j] = f32::from(q & 0x0F) * d + m;
        y[j + 16] = f32::from(q >> 4) * d + m;
    }
}

/// The 5th bits of a Q5 block (`u32` little-endian: bit j belongs to element j).
fn fifth_bits(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Q5_0: d, qh (u32), nibbles. y = (q | h << 4) - 16) * d.
fn q5_0(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    let qh = fifth_bits(b, 2);
    for j in 0..16 {
        let q = b[6 + j];
        let h0 = ((qh >> j) & 1) as u8;
        let h1 = ((qh >> (j + 16)) & 1) as u8;
        y[j] = f32::from(((q & 0x0F) | (h0 << 4)) as i8 - 16) * d;
        y[j + 16] = f32::from(((q >> 4) | (h1 << 4)) as i8 - 16) * d;
    }
}

/// Q5_1: d, m, qh, nibbles. y = (q | h << 4) * d + m.
fn q5_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (half_at(b, 0), half_at(b, 2));
    let qh = fifth_bits(b, 4);
    for j in 0..16 {
        let q = b[8 + j];
        let h0 = ((qh >> j) & 1) as u8;
        let h1 = ((qh >> (j + 16)) & 1) as u8;
        y[j] = f32::from((q & 0x0F) | (h0 << 4)) * d + m;
        y[j + 16] = f32::from((q >> 4) | (h1 << 4)) * d + m;
    }
}

/// The 6-bit scale and min of sub-block `j` (0..8) from the 12 packed bytes (ggml's
/// `get_scale_min_k4`).
fn scale_min_k4(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// Q4_K: d, dmin, 12 bytes of scales/mins, 128 bytes of nibbles; 8 sub-blocks of 32.
/// y = (d * sc) * q - dmin * m.
fn q4_k(b: &[u8], y: &mut [f32]) {
    k_quant_4_or_5(&b[..16], None, &b[16..144], y);
}

/// Q5_K: d, dmin, 12 bytes of scales/mins, 32 bytes of 5th bits, 128 bytes of nibbles.
fn q5_k(b: &[u8], y: &mut [f32]) {
    k_quant_4_or_5(&b[..16], Some(&b[16..48]), &b[48..176], y);
}

/// The Q4_K / Q5_K body: `head` = d, dmin and the 12 scale bytes; `qh` the 5th bits (Q5_K: bit
/// `2i` / `2i+1` of byte l belongs to element l of sub-block `2i` / `2i+1`); `qs` the nibbles.
fn k_quant_4_or_5(head: &[u8], qh: Option<&[u8]>, qs: &[u8], y: &mut [f32]) {
    let (d, dmin) = (half_at(head, 0), half_at(head, 2));
    let scales = &head[4..16];
    for (half, (q, out)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
        let (sc1, m1) = scale_min_k4(2 * half, scales);
        let (sc2, m2) = scale_min_k4(2 * half + 1, scales);
        let (d1, min1) = (d * f32::from(sc1), dmin * f32::from(m1));
        let (d2, min2) = (d * f32::from(sc2), dmin * f32::from(m2));
        let (bit1, bit2) = (1u8 << (2 * half), 1u8 << (2 * half + 1));
        for l in 0..32 {
            let h = qh.map_or(0, |qh| qh[l]);
            let h1 = if h & bit1 != 0 { 16 } else { 0 };
            let h2 = if h & bit2 != 0 { 16 } else { 0 };
            out[l] = d1 * f32::from((q[l] & 0x0F) + h1) - min1;
            out[l + 32] = d2 * f32::from((q[l] >> 4) + h2) - min2;
        }
    }
}

/// Q6_K: 128 bytes of low nibbles, 64 bytes of high 2-bit pairs, 16 i8 scales, d; 16 sub-blocks of
/// 16. y = (d * sc) * (q - 32).
fn q6_k(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 208);
    for n in 0..2 {
        let ql = &b[64 * n..64 * n + 64];
        let qh = &b[128 + 32 * n..128 + 32 * n + 32];
        let sc = &b[192 + 8 * n..192 + 8 * n + 8];
        let out = &mut y[128 * n..128 * n + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) as i8 - 32;
            let q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
            let scale = |k: usize| d * f32::from(sc[is + 2 * k] as i8);
            out[l] = scale(0) * f32::from(q1);
            out[l + 32] = scale(1) * f32::from(q2);
            out[l + 64] = scale(2) * f32::from(q3);
            out[l + 96] = scale(3) * f32::from(q4);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_exhaustive_and_ids_unique() {
        for (i, row) in TABLE.iter().enumerate() {
            assert_eq!(row.0.row().1, row.1);
            assert!(TABLE[i + 1..].iter().all(|r| r.1 != row.1 && r.0 != row.0));
        }
    }

    #[test]
    fn bad_row_lengths_and_overflow_are_errors() {
        assert!(GgmlType::Q4K.byte_size(&[255, 2]).is_err());
        assert_eq!(GgmlType::Q4K.byte_size(&[512, 2]), Ok(4 * 144));
        assert!(GgmlType::F32.byte_size(&[usize::MAX, 2]).is_err());
        let mut out = [0f32; 32];
        assert!(dequantize(GgmlType::Q8_0, &[0u8; 33], &mut out).is_err());
        assert!(dequantize(GgmlType::Q2K, &[0u8; 84], &mut [0f32; 256]).is_err());
    }

    #[test]
    fn q8_0_block() {
        let mut b = vec![0u8; 34];
        b[..2].copy_from_slice(&f16::from_f32(0.5).to_bits().to_le_bytes());
        b[2] = 4;
        b[3] = (-6i8) as u8;
        let mut y = [0f32; 32];
        dequantize(GgmlType::Q8_0, &b, &mut y).unwrap();
        assert_eq!(&y[..3], &[2.0, -3.0, 0.0]);
    }
}
