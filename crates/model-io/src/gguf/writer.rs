//! Writing GGUF files (version 3): metadata, then the tensor infos, then each tensor's bytes at the
//! file's alignment, as llama.cpp's `gguf_write_to_file` lays them out; [`rewrite`] copies a file with
//! some tensors replaced (re-quantized copies of fixtures for tests).
//!
//! Invariant: what [`write`] writes, [`super::reader::parse`] reads back to the same metadata, tensor
//! infos and bytes (the writer's test).

use std::io::Write;
use std::path::Path;

use super::reader::{parse, MetaValue, TensorInfo};
use super::types::GgmlType;

/// A tensor to write: ggml extents (innermost first) and its stored bytes.
pub struct OutTensor<'a> {
    pub name: &'a str,
    pub extents: &'a [usize],
    pub ggml_type: GgmlType,
    pub data: &'a [u8],
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

fn type_id(v: &MetaValue) -> u32 {
    match v {
        MetaValue::U8(_) => 0,
        MetaValue::I8(_) => 1,
        MetaValue::U16(_) => 2,
        MetaValue::I16(_) => 3,
        MetaValue::U32(_) => 4,
        MetaValue::I32(_) => 5,
        MetaValue::F32(_) => 6,
        MetaValue::Bool(_) => 7,
        MetaValue::String(_) => 8,
        MetaValue::Array(_) => 9,
        MetaValue::U64(_) => 10,
        MetaValue::I64(_) => 11,
        MetaValue::F64(_) => 12,
    }
}

fn put_value(out: &mut Vec<u8>, v: &MetaValue) {
    match v {
        MetaValue::U8(x) => out.push(*x),
        MetaValue::I8(x) => out.extend(x.to_le_bytes()),
        MetaValue::U16(x) => out.extend(x.to_le_bytes()),
        MetaValue::I16(x) => out.extend(x.to_le_bytes()),
        MetaValue::U32(x) => out.extend(x.to_le_bytes()),
        MetaValue::I32(x) => out.extend(x.to_le_bytes()),
        MetaValue::F32(x) => out.extend(x.to_le_bytes()),
        MetaValue::Bool(x) => out.push(*x as u8),
        MetaValue::String(s) => put_str(out, s),
        MetaValue::Array(items) => {
            // An empty array is written as an array of u8 (its element type is not recorded).
            out.extend(items.first().map_or(0, type_id).to_le_bytes());
            out.extend((items.len() as u64).to_le_bytes());
            items.iter().for_each(|i| put_value(out, i));
        }
        MetaValue::U64(x) => out.extend(x.to_le_bytes()),
        MetaValue::I64(x) => out.extend(x.to_le_bytes()),
        MetaValue::F64(x) => out.extend(x.to_le_bytes()),
    }
}

/// Writes a GGUF v3 file. `metadata` should hold `general.alignment` when `alignment` is not 32.
pub fn write(
    path: &Path,
    metadata: &[(String, MetaValue)],
    tensors: &[OutTensor<'_>],
    alignment: usize,
) -> std::io::Result<()> {
    let mut header = b"GGUF".to_vec();
    header.extend(3u32.to_le_bytes());
    header.extend((tensors.len() as u64).to_le_bytes());
    header.extend((metadata.len() as u64).to_le_bytes());
    for (key, value) in metadata {
        put_str(&mut header, key);
        header.extend(type_id(value).to_le_bytes());
        put_value(&mut header, value);
    }
    let mut data = Vec::new();
    for t in tensors {
        put_str(&mut header, t.name);
        header.extend((t.extents.len() as u32).to_le_bytes());
        t.extents
            .iter()
            .for_each(|e| header.extend((*e as u64).to_le_bytes()));
        header.extend(t.ggml_type.id().to_le_bytes());
        header.extend((data.len() as u64).to_le_bytes());
        data.extend_from_slice(t.data);
        data.resize(data.len().next_multiple_of(alignment), 0);
    }
    header.resize(header.len().next_multiple_of(alignment), 0);
    let mut out = std::fs::File::create(path)?;
    out.write_all(&header)?;
    out.write_all(&data)
}

/// Copies the GGUF file `src` to `dst`, each tensor replaced by what `replace` returns for it (its info
/// and stored bytes) or kept; returns how many were replaced. An error names the file.
pub fn rewrite(
    src: &Path,
    dst: &Path,
    mut replace: impl FnMut(&TensorInfo, &[u8]) -> Option<(GgmlType, Vec<u8>)>,
) -> Result<usize, String> {
    let file = std::fs::read(src).map_err(|e| format!("{}: {e}", src.display()))?;
    let parsed = parse(&file).map_err(|e| format!("{}: {e}", src.display()))?;
    let replaced: Vec<Option<(GgmlType, Vec<u8>)>> = parsed
        .tensors
        .iter()
        .map(|t| replace(t, &file[t.begin..t.end]))
        .collect();
    let tensors: Vec<OutTensor<'_>> = parsed
        .tensors
        .iter()
        .zip(&replaced)
        .map(|(t, r)| OutTensor {
            name: &t.name,
            extents: &t.extents,
            ggml_type: r.as_ref().map_or(t.ggml_type, |r| r.0),
            data: r.as_ref().map_or(&file[t.begin..t.end], |r| &r.1),
        })
        .collect();
    write(dst, &parsed.metadata, &tensors, parsed.alignment as usize)
        .map_err(|e| format!("{}: {e}", dst.display()))?;
    Ok(replaced.iter().filter(|r| r.is_some()).count())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_files_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.gguf");
        let meta = vec![
            (
                "general.architecture".to_string(),
                MetaValue::String("x".into()),
            ),
            ("x.n".to_string(), MetaValue::U32(7)),
            (
                "x.list".to_string(),
                MetaValue::Array(vec![MetaValue::I32(-1), MetaValue::I32(2)]),
            ),
        ];
        let a: Vec<u8> = (0..24).collect();
        let b: Vec<u8> = (0..34).collect();
        let tensors = [
            OutTensor {
                name: "a",
                extents: &[3, 2],
                ggml_type: GgmlType::F32,
                data: &a,
            },
            OutTensor {
                name: "b",
                extents: &[32],
                ggml_type: GgmlType::from_id(8).unwrap(),
                data: &b,
            },
        ];
        write(&path, &meta, &tensors, 32).unwrap();
        let file = std::fs::read(&path).unwrap();
        let p = parse(&file).unwrap();
        assert_eq!(p.metadata, meta);
        assert_eq!(p.tensors.len(), 2);
        assert_eq!(p.tensors[0].extents, vec![3, 2]);
        assert_eq!(&file[p.tensors[0].begin..p.tensors[0].end], &a[..]);
        assert_eq!(p.tensors[1].ggml_type.id(), 8);
        assert_eq!(&file[p.tensors[1].begin..p.tensors[1].end], &b[..]);
        assert_eq!(p.tensors[1].begin % 32, 0);
    }
}
