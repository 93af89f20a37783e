//! Bad input, bounded: mutated GGUF and safetensors files must give errors, never panics, and never
//! allocate what the file cannot justify (a count near 2^64 that were trusted would abort the process
//! on allocation, failing the test run).
//!
//! Mutations (deterministic, seeded): every truncation of the header plus a sample of the data;
//! single-bit flips at random header offsets; and u64 values near the limits (`u64::MAX`, `2^63`,
//! `2^32`, the file length, ...) written over every offset of the first bytes of the header, where the
//! counts, string lengths, types, extents and offsets live. A mutated file that still opens is used in
//! full (every tensor loaded, the tokenizer built) and must not panic either.
//!
//! A cargo-fuzz target over the same entry points (`gguf::reader::parse`, `TensorStore::open_files`)
//! is future work; this test is the bounded version that runs in CI.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

use model_io::gguf::{reader, types, GgufSet};
use model_io::{Checkpoint, TensorStore};

/// splitmix64: a deterministic stream for the mutation positions.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// The mutated images of `file` whose header ends at `header_len`.
fn mutations(file: &[u8], header_len: usize, seed: u64, flips: usize) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let len = file.len();
    for cut in (0..header_len.min(len)).chain((header_len..len).step_by((len / 64).max(1))) {
        out.push((format!("truncated to {cut}"), file[..cut].to_vec()));
    }
    let mut rng = Rng(seed);
    for _ in 0..flips {
        let at = rng.below(header_len);
        let bit = rng.below(8);
        let mut m = file.to_vec();
        m[at] ^= 1 << bit;
        out.push((format!("bit {bit} of byte {at} flipped"), m));
    }
    let values = [
        u64::MAX,
        u64::MAX - 7,
        1 << 63,
        (1 << 32) + 1,
        u32::MAX as u64,
        len as u64,
        len as u64 + 1,
    ];
    for at in 0..header_len.min(320).saturating_sub(8) {
        for v in values {
            let mut m = file.to_vec();
            m[at..at + 8].copy_from_slice(&v.to_le_bytes());
            out.push((format!("u64 {v:#x} written at byte {at}"), m));
        }
    }
    out
}

fn no_panic<T>(what: &str, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| panic!("panicked on: {what}"))
}

/// Parses `image`; when it parses, dequantizes every tensor of a supported type.
fn parse_and_use(image: &[u8]) -> bool {
    match reader::parse(image) {
        Err(reason) => {
            assert!(!reason.is_empty());
            false
        }
        Ok(parsed) => {
            for t in &parsed.tensors {
                let bytes = &image[t.begin..t.end];
                let mut out = vec![0f32; t.numel()];
                let result = types::dequantize(t.ggml_type, bytes, &mut out);
                assert_eq!(result.is_ok(), t.ggml_type.is_supported(), "{}", t.name);
            }
            true
        }
    }
}

fn gguf_header_len(image: &[u8]) -> usize {
    reader::parse(image).unwrap().data_start
}

#[test]
fn mutated_gguf_headers_are_errors_not_panics() {
    for (seed, rel, flips) in [
        (1, "gguf/blocks.gguf", 3000),
        (2, "gguf/split-00001-of-00003.gguf", 3000),
        (3, "gguf/qwen3_5.gguf", 1000),
    ] {
        let file = std::fs::read(testdata::fixture(rel)).unwrap();
        let header = gguf_header_len(&file);
        let cases = mutations(&file, header, seed, flips);
        let mut errors = 0;
        for (what, image) in &cases {
            if !no_panic(&format!("{rel}: {what}"), || parse_and_use(image)) {
                errors += 1;
            }
        }
        // Sanity: the mutations do hit the validation (most are errors).
        assert!(
            errors * 2 > cases.len(),
            "{rel}: only {errors} of {} mutations were errors",
            cases.len()
        );
    }
}

/// A whole model through `Checkpoint::open` (config, names, tokenizer) on mutated copies of the
/// committed GGUF fixture: fewer cases, each written to a file.
#[test]
fn mutated_gguf_models_are_errors_not_panics() {
    let file = std::fs::read(testdata::fixture("gguf/qwen3_5.gguf")).unwrap();
    let header = gguf_header_len(&file);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    let mut rng = Rng(4);
    let cases = mutations(&file, header, 5, 400);
    for i in 0..400 {
        let (what, image) = &cases[rng.below(cases.len())];
        std::fs::write(&path, image).unwrap();
        no_panic(&format!("case {i}: {what}"), || {
            if let Ok(ck) = Checkpoint::open(&path) {
                for name in ck.tensors.names() {
                    if let Ok(shape) = ck.tensors.shape(name) {
                        let _ = ck.tensors.load_f32(name, shape);
                        let _ = ck.tensors.raw(name);
                    }
                }
                let _ = ck.tokenizer();
            }
        });
    }
}

#[test]
fn gguf_errors_name_the_file_and_field() {
    let file = std::fs::read(testdata::fixture("gguf/blocks.gguf")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let check = |image: &[u8], expect: &str| {
        let path = dir.path().join("bad.gguf");
        std::fs::write(&path, image).unwrap();
        let err = GgufSet::open(&path).unwrap_err().to_string();
        assert!(err.contains("bad.gguf") && err.contains(expect), "{err}");
    };
    check(b"GGUX\x03\0\0\0", "bad magic");
    let mut v = file.clone();
    v[4] = 9;
    check(&v, "version 9");
    check(&file[..file.len() - 32], "runs past the end of the file"); // the last tensor, Q2_K
    let mut v = file.clone();
    v[16..24].copy_from_slice(&u64::MAX.to_le_bytes()); // metadata count
    check(&v, "metadata count");
    let mut v = file.clone();
    v[24..32].copy_from_slice(&(u64::MAX - 1).to_le_bytes()); // first key's length
    check(&v, "metadata key #0: length");
}

/// A small safetensors file: F32, BF16 and F16 tensors.
fn small_safetensors() -> Vec<u8> {
    use safetensors::tensor::{serialize, TensorView};
    use safetensors::Dtype;
    let a: Vec<u8> = (0..24u8).collect();
    let b: Vec<u8> = (0..12u8).collect();
    let c: Vec<u8> = (0..8u8).collect();
    let tensors = vec![
        (
            "a.weight",
            TensorView::new(Dtype::F32, vec![2, 3], &a).unwrap(),
        ),
        (
            "b.weight",
            TensorView::new(Dtype::BF16, vec![6], &b).unwrap(),
        ),
        (
            "c.weight",
            TensorView::new(Dtype::F16, vec![2, 2], &c).unwrap(),
        ),
    ];
    serialize(tensors, None).unwrap()
}

#[test]
fn mutated_safetensors_headers_are_errors_not_panics() {
    let file = small_safetensors();
    let header = 8 + u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    let cases = mutations(&file, header, 6, 1500);
    let mut errors = 0;
    for (what, image) in &cases {
        std::fs::write(&path, image).unwrap();
        let opened = no_panic(what, || {
            let store = TensorStore::open_files(dir.path(), std::slice::from_ref(&path));
            if let Ok(store) = &store {
                for name in store.names() {
                    let shape = store.shape(name).unwrap().to_vec();
                    let _ = store.load_f32(name, &shape);
                    let _ = store.raw(name);
                }
            }
            store.is_ok()
        });
        errors += usize::from(!opened);
    }
    assert!(
        errors * 2 > cases.len(),
        "only {errors} of {} mutations were errors",
        cases.len()
    );
    let mut huge = file.clone();
    huge[..8].copy_from_slice(&(u64::MAX - 3).to_le_bytes());
    std::fs::write(&path, &huge).unwrap();
    let err = TensorStore::open_files(Path::new("."), &[path])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("model.safetensors") && err.contains("header length"),
        "{err}"
    );
}
