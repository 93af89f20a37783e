//! One GGUF file (v2/v3), memory-mapped and validated in full at open.
//!
//! Layout (little-endian): magic `GGUF`, `u32` version, `u64` tensor count, `u64` metadata count;
//! metadata entries (`string` key, `u32` value type, value); tensor infos (`string` name, `u32` number
//! of dimensions, that many `u64` extents innermost first, `u32` ggml type, `u64` offset); padding to
//! `general.alignment` (default 32); the data section. A `string` is a `u64` byte length + UTF-8
//! bytes; an array is a `u32` element type, a `u64` count and the elements. Tensor offsets are
//! relative to the data section and multiples of the alignment.
//!
//! Algorithm: a bounds-checked cursor over the mapped bytes. Before allocating for a count or a
//! length read from the file, the count is checked against the bytes that remain (each element
//! needs at least its minimum encoded size), so a hostile count near 2^64 fails before any
//! allocation; arrays may nest at most [`MAX_ARRAY_DEPTH`] deep and hold at most
//! [`MAX_ARRAY_ELEMENTS`] elements in all. Each tensor's byte size is computed
//! with checked arithmetic from its extents and block layout; its range must lie inside the file
//! and no two ranges may overlap.
//!
//! Invariant: every [`TensorInfo`] of an opened [`GgufFile`] has `begin..end` inside the mapped
//! file, `end - begin` equal to the byte size of its extents in its type (known block layout, row
//! length a multiple of the block), and no overlap with another tensor's range. Nothing here panics
//! on file contents; every error names the file and the field or tensor.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use super::types::GgmlType;
use crate::LoadError;

/// The default `general.alignment`.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Arrays of arrays deeper than this are rejected (the format allows nesting; real files use none).
pub const MAX_ARRAY_DEPTH: usize = 8;
/// llama.cpp's limit on tensor dimensions.
pub const MAX_DIMS: u32 = 4;
/// Most metadata array elements in one file, all arrays together. An element takes one byte of the
/// file but ~32 of memory, so this bounds the amplification (a real vocabulary has ~3 arrays of
/// ~150-260k entries).
pub const MAX_ARRAY_ELEMENTS: usize = 1 << 23;

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<MetaValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl MetaValue {
    /// The GGUF type name, for messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            MetaValue::U8(_) => "uint8",
            MetaValue::I8(_) => "int8",
            MetaValue::U16(_) => "uint16",
            MetaValue::I16(_) => "int16",
            MetaValue::U32(_) => "uint32",
            MetaValue::I32(_) => "int32",
            MetaValue::F32(_) => "float32",
            MetaValue::Bool(_) => "bool",
            MetaValue::String(_) => "string",
            MetaValue::Array(_) => "array",
            MetaValue::U64(_) => "uint64",
            MetaValue::I64(_) => "int64",
            MetaValue::F64(_) => "float64",
        }
    }

    /// Any integer type as u64 (negative values are `None`).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::U64(v) => Some(v),
            MetaValue::I8(v) => u64::try_from(v).ok(),
            MetaValue::I16(v) => u64::try_from(v).ok(),
            MetaValue::I32(v) => u64::try_from(v).ok(),
            MetaValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer type as i64 (u64 above `i64::MAX` is `None`).
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            MetaValue::I8(v) => Some(v.into()),
            MetaValue::I16(v) => Some(v.into()),
            MetaValue::I32(v) => Some(v.into()),
            MetaValue::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    /// Any float or integer type as f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v.into()),
            MetaValue::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// One tensor's description and location.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub name: String,
    /// GGUF order: innermost (contiguous) extent first, e.g. `[in, out]` for a `[out, in]` matrix.
    pub extents: Vec<usize>,
    pub ggml_type: GgmlType,
    /// Absolute byte range in the file.
    pub begin: usize,
    pub end: usize,
}

impl TensorInfo {
    /// The row-major shape, outermost first (`[out, in]` for a matrix), as safetensors has it.
    pub fn shape(&self) -> Vec<usize> {
        self.extents.iter().rev().copied().collect()
    }

    pub fn numel(&self) -> usize {
        // Cannot overflow: validated at open.
        self.extents.iter().product()
    }
}

/// One opened GGUF file.
#[derive(Debug)]
pub struct GgufFile {
    pub path: PathBuf,
    pub version: u32,
    pub alignment: u64,
    /// Metadata in file order.
    pub metadata: Vec<(String, MetaValue)>,
    /// Tensors in file order.
    pub tensors: Vec<TensorInfo>,
    /// Absolute offset of the data section.
    pub data_start: usize,
    mmap: Mmap,
}

impl GgufFile {
    /// Maps and validates `path`.
    pub fn open(path: &Path) -> Result<Self, LoadError> {
        let file =
            File::open(path).map_err(|e| LoadError::from_io(path.to_path_buf(), e, "GGUF file"))?;
        // SAFETY: read-only map; as for safetensors we rely on the file not being truncated or
        // rewritten while open. Every offset into it is validated against the length seen here.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| LoadError::Io {
            path: path.to_path_buf(),
            source: e,
        })?;
        let parsed = parse(&mmap).map_err(|reason| LoadError::Gguf {
            path: path.to_path_buf(),
            reason,
        })?;
        Ok(GgufFile {
            path: path.to_path_buf(),
            version: parsed.version,
            alignment: parsed.alignment,
            metadata: parsed.metadata,
            tensors: parsed.tensors,
            data_start: parsed.data_start,
            mmap,
        })
    }

    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// The path, the map and the tensors, for a store that keeps the map.
    pub(crate) fn into_parts(self) -> (PathBuf, Mmap, Vec<TensorInfo>) {
        (self.path, self.mmap, self.tensors)
    }

    /// The stored bytes of `tensor` (one of `self.tensors`).
    pub fn bytes(&self, tensor: &TensorInfo) -> Result<&[u8], LoadError> {
        // Always Some by the invariant; the error arm keeps this panic-free regardless.
        self.mmap
            .get(tensor.begin..tensor.end)
            .ok_or_else(|| LoadError::Gguf {
                path: self.path.clone(),
                reason: format!(
                    "tensor `{}`: bytes {}..{} lie outside the file",
                    tensor.name, tensor.begin, tensor.end
                ),
            })
    }
}

/// What [`parse`] reads from a file image.
#[derive(Debug)]
pub struct Parsed {
    pub version: u32,
    pub alignment: u64,
    pub metadata: Vec<(String, MetaValue)>,
    pub tensors: Vec<TensorInfo>,
    pub data_start: usize,
}

/// Parses and validates a whole GGUF file image. The error names the field or tensor.
pub fn parse(file: &[u8]) -> Result<Parsed, String> {
    let mut c = Cursor {
        file,
        pos: 0,
        array_elements: 0,
    };
    let magic = c.bytes(4, "magic")?;
    if magic != b"GGUF" {
        return Err(format!(
            "bad magic {magic:02x?} (expected \"GGUF\"): not a GGUF file"
        ));
    }
    let version = c.u32("version")?;
    if !(2..=3).contains(&version) {
        return Err(format!(
            "unsupported GGUF version {version} (versions 2 and 3 are read; a big-endian file reads as a huge version)"
        ));
    }
    let tensor_count = c.u64("tensor count")?;
    let kv_count = c.u64("metadata count")?;
    // A key needs >= 8 bytes (length) + 4 (type) + 1 (smallest value); a tensor info >= 8 + 4 + 4 + 8.
    let kv_count = c.count_fits(kv_count, 13, "metadata count")?;
    let tensor_count = c.count_fits(tensor_count, 24, "tensor count")?;

    let mut metadata: Vec<(String, MetaValue)> = Vec::with_capacity(kv_count);
    let mut seen: HashMap<String, ()> = HashMap::with_capacity(kv_count);
    for i in 0..kv_count {
        let key = c.string(&format!("metadata key #{i}"))?;
        let value_type = c.u32(&format!("type of metadata `{key}`"))?;
        let value = c.value(value_type, &key, 0)?;
        if seen.insert(key.clone(), ()).is_some() {
            return Err(format!("metadata key `{key}` appears twice"));
        }
        metadata.push((key, value));
    }
    let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some((_, MetaValue::U32(a))) if a.is_power_of_two() => u64::from(*a),
        Some((_, v)) => {
            return Err(format!(
                "metadata `general.alignment` must be a uint32 power of two, found {} {v:?}",
                v.type_name()
            ))
        }
    };

    struct RawInfo {
        name: String,
        extents: Vec<usize>,
        ggml_type: GgmlType,
        offset: u64,
    }
    let mut infos: Vec<RawInfo> = Vec::with_capacity(tensor_count);
    let mut names: HashMap<String, ()> = HashMap::with_capacity(tensor_count);
    for i in 0..tensor_count {
        let name = c.string(&format!("name of tensor #{i}"))?;
        let n_dims = c.u32(&format!("tensor `{name}`: number of dimensions"))?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(format!(
                "tensor `{name}`: {n_dims} dimensions (1 to {MAX_DIMS} are valid)"
            ));
        }
        let mut extents = Vec::with_capacity(n_dims as usize);
        for d in 0..n_dims {
            let e = c.u64(&format!("tensor `{name}`: extent {d}"))?;
            let e = usize::try_from(e)
                .map_err(|_| format!("tensor `{name}`: extent {d} = {e} does not fit in memory"))?;
            extents.push(e);
        }
        let type_id = c.u32(&format!("tensor `{name}`: type"))?;
        let ggml_type = GgmlType::from_id(type_id)
            .ok_or_else(|| format!("tensor `{name}`: unknown ggml type id {type_id}"))?;
        let offset = c.u64(&format!("tensor `{name}`: offset"))?;
        if names.insert(name.clone(), ()).is_some() {
            return Err(format!("tensor `{name}` appears twice"));
        }
        infos.push(RawInfo {
            name,
            extents,
            ggml_type,
            offset,
        });
    }

    let data_start = align_up(c.pos as u64, alignment)
        .and_then(|d| usize::try_from(d).ok())
        .ok_or_else(|| "data section offset overflows".to_string())?;
    if data_start > file.len() && tensor_count > 0 {
        return Err(format!(
            "data section would start at byte {data_start}, past the end of the file ({} bytes; truncated?)",
            file.len()
        ));
    }

    let mut tensors = Vec::with_capacity(infos.len());
    for info in infos {
        let name = &info.name;
        let size = info.ggml_type.byte_size(&info.extents).map_err(|reason| {
            format!(
                "tensor `{name}` ({} {:?}): {reason}",
                info.ggml_type.name(),
                info.extents
            )
        })?;
        if !info.offset.is_multiple_of(alignment) {
            return Err(format!(
                "tensor `{name}`: offset {} is not a multiple of the alignment {alignment}",
                info.offset
            ));
        }
        let begin = usize::try_from(info.offset)
            .ok()
            .and_then(|o| o.checked_add(data_start));
        let end = begin.and_then(|b| b.checked_add(size));
        let (begin, end) = match (begin, end) {
            (Some(b), Some(e)) if e <= file.len() => (b, e),
            _ => {
                return Err(format!(
                    "tensor `{name}`: data at offset {} + {size} bytes runs past the end of the file ({} bytes; truncated?)",
                    info.offset,
                    file.len().saturating_sub(data_start)
                ))
            }
        };
        tensors.push(TensorInfo {
            name: info.name,
            extents: info.extents,
            ggml_type: info.ggml_type,
            begin,
            end,
        });
    }
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by_key(|&i| (tensors[i].begin, tensors[i].end));
    for pair in order.windows(2) {
        let (a, b) = (&tensors[pair[0]], &tensors[pair[1]]);
        if b.begin < a.end {
            return Err(format!(
                "tensor `{}` (bytes {}..{}) overlaps tensor `{}` (bytes {}..{})",
                b.name, b.begin, b.end, a.name, a.begin, a.end
            ));
        }
    }
    Ok(Parsed {
        version,
        alignment,
        metadata,
        tensors,
        data_start,
    })
}

fn align_up(x: u64, alignment: u64) -> Option<u64> {
    x.checked_add(alignment - 1)
        .map(|v| v / alignment * alignment)
}

/// A bounds-checked reader over the file image.
struct Cursor<'a> {
    file: &'a [u8],
    pos: usize,
    /// Array elements read so far (bounded by [`MAX_ARRAY_ELEMENTS`]).
    array_elements: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.file.len().saturating_sub(self.pos)
    }

    fn bytes(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.file.len());
        match end.and_then(|e| self.file.get(self.pos..e).map(|s| (e, s))) {
            Some((e, s)) => {
                self.pos = e;
                Ok(s)
            }
            None => Err(format!(
                "{what}: needs {n} bytes at offset {} but the file has {} (truncated?)",
                self.pos,
                self.file.len()
            )),
        }
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], String> {
        let b = self.bytes(N, what)?;
        b.try_into().map_err(|_| format!("{what}: short read"))
    }

    fn u32(&mut self, what: &str) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// `count` elements of at least `min_size` bytes each must fit in what remains.
    fn count_fits(&self, count: u64, min_size: u64, what: &str) -> Result<usize, String> {
        let fits = count
            .checked_mul(min_size)
            .is_some_and(|need| need <= self.remaining() as u64);
        if !fits {
            return Err(format!(
                "{what} {count} cannot fit in the {} bytes that remain (corrupt or hostile count)",
                self.remaining()
            ));
        }
        usize::try_from(count).map_err(|_| format!("{what} {count} does not fit in memory"))
    }

    fn string(&mut self, what: &str) -> Result<String, String> {
        let len = self.u64(&format!("{what}: length"))?;
        let len = self.count_fits(len, 1, &format!("{what}: length"))?;
        let bytes = self.bytes(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| format!("{what}: not valid UTF-8"))
    }

    /// Minimum encoded size of one value of `value_type` (for count checks), if the type is known.
    fn min_size(value_type: u32) -> Option<u64> {
        Some(match value_type {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            8 => 8,
            9 => 12,
            10..=12 => 8,
            _ => return None,
        })
    }

    fn value(&mut self, value_type: u32, key: &str, depth: usize) -> Result<MetaValue, String> {
        let what = || format!("metadata `{key}`");
        Ok(match value_type {
            0 => MetaValue::U8(u8::from_le_bytes(self.array(&what())?)),
            1 => MetaValue::I8(i8::from_le_bytes(self.array(&what())?)),
            2 => MetaValue::U16(u16::from_le_bytes(self.array(&what())?)),
            3 => MetaValue::I16(i16::from_le_bytes(self.array(&what())?)),
            4 => MetaValue::U32(u32::from_le_bytes(self.array(&what())?)),
            5 => MetaValue::I32(i32::from_le_bytes(self.array(&what())?)),
            6 => MetaValue::F32(f32::from_le_bytes(self.array(&what())?)),
            7 => match self.array::<1>(&what())?[0] {
                0 => MetaValue::Bool(false),
                1 => MetaValue::Bool(true),
                b => {
                    return Err(format!(
                        "metadata `{key}`: bool byte {b} is neither 0 nor 1"
                    ))
                }
            },
            8 => MetaValue::String(self.string(&what())?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(format!(
                        "metadata `{key}`: arrays nested deeper than {MAX_ARRAY_DEPTH}"
                    ));
                }
                let element_type = self.u32(&format!("metadata `{key}`: array element type"))?;
                let min = Self::min_size(element_type).ok_or_else(|| {
                    format!("metadata `{key}`: unknown array element type {element_type}")
                })?;
                let count = self.u64(&format!("metadata `{key}`: array length"))?;
                let count =
                    self.count_fits(count, min, &format!("metadata `{key}`: array length"))?;
                self.array_elements = self.array_elements.saturating_add(count);
                if self.array_elements > MAX_ARRAY_ELEMENTS {
                    return Err(format!(
                        "metadata `{key}`: more than {MAX_ARRAY_ELEMENTS} array elements in the file"
                    ));
                }
                let mut items = Vec::with_capacity(count);
                for _ in 0..count {
                    items.push(self.value(element_type, key, depth + 1)?);
                }
                MetaValue::Array(items)
            }
            10 => MetaValue::U64(u64::from_le_bytes(self.array(&what())?)),
            11 => MetaValue::I64(i64::from_le_bytes(self.array(&what())?)),
            12 => MetaValue::F64(f64::from_le_bytes(self.array(&what())?)),
            other => return Err(format!("metadata `{key}`: unknown value type {other}")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GGUF image with no tensors and one `uint8` array of `n` elements under key `a`.
    fn with_u8_array(n: usize) -> Vec<u8> {
        let mut f = b"GGUF".to_vec();
        f.extend(3u32.to_le_bytes());
        f.extend(0u64.to_le_bytes()); // tensors
        f.extend(1u64.to_le_bytes()); // metadata
        f.extend(1u64.to_le_bytes());
        f.push(b'a');
        f.extend(9u32.to_le_bytes()); // array
        f.extend(0u32.to_le_bytes()); // of uint8
        f.extend((n as u64).to_le_bytes());
        f.resize(f.len() + n, 7);
        f
    }

    #[test]
    fn array_elements_are_bounded_in_all() {
        let ok = parse(&with_u8_array(1000)).unwrap();
        assert_eq!(ok.metadata[0].1.as_array().map(<[_]>::len), Some(1000));
        let err = parse(&with_u8_array(MAX_ARRAY_ELEMENTS + 1)).unwrap_err();
        assert!(err.contains("array elements"), "{err}");
    }
}
