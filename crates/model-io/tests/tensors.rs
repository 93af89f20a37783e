//! TensorStore: values of hand-written f32 / bf16 / f16 tensors, sharded loading, and every kind of
//! malformed safetensors file or index, each an error naming the file and the problem.

mod common;

use std::path::Path;

use common::{f32_tensor, message_naming, raw_safetensors, write, write_safetensors, T};
use model_io::{DType, LoadError, TensorStore};
use safetensors::Dtype;

fn u16_bytes(bits: &[u16]) -> Vec<u8> {
    bits.iter().flat_map(|b| b.to_le_bytes()).collect()
}

fn store_with(tensors: &[T]) -> (tempfile::TempDir, TensorStore) {
    let dir = tempfile::tempdir().unwrap();
    write_safetensors(&dir.path().join("model.safetensors"), tensors);
    let store = TensorStore::open(dir.path()).unwrap();
    (dir, store)
}

/// Writes `bytes` as the checkpoint's only weights file and opens it.
fn open_bytes(bytes: &[u8]) -> LoadError {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("model.safetensors"), bytes).unwrap();
    TensorStore::open(dir.path()).unwrap_err()
}

fn safetensors_reason(err: &LoadError) -> String {
    message_naming(err, "model.safetensors");
    match err {
        LoadError::Safetensors { reason, .. } => reason.clone(),
        other => panic!("expected a safetensors error, got {other}"),
    }
}

#[test]
fn f32_tensor_round_trips() {
    let values = [1.5, -2.25, 0.0, 3.0e-3, f32::MAX, -1.0e-30];
    let (_dir, store) = store_with(&[f32_tensor("w", &[2, 3], &values)]);
    assert_eq!(store.dtype("w").unwrap(), DType::F32);
    assert_eq!(store.shape("w").unwrap(), &[2, 3]);
    assert_eq!(store.load_f32("w", &[2, 3]).unwrap(), values);
}

#[test]
fn bf16_tensor_converts_to_f32() {
    // bf16 bit patterns and their values worked out by hand:
    // 0x3F80 = 1, 0xC000 = -2, 0x3FC0 = 1.5, 0x4049 = 2 * (1 + 73/128) = 3.140625, 0x0000 = 0,
    // 0x3B80 = 2^-8.
    let bits = [0x3F80, 0xC000, 0x3FC0, 0x4049, 0x0000, 0x3B80];
    let t = T {
        name: "w",
        dtype: Dtype::BF16,
        shape: vec![3, 2],
        bytes: u16_bytes(&bits),
    };
    let (_dir, store) = store_with(&[t]);
    assert_eq!(store.dtype("w").unwrap(), DType::BF16);
    let got = store.load_f32("w", &[3, 2]).unwrap();
    assert_eq!(got, [1.0, -2.0, 1.5, 3.140625, 0.0, 0.00390625]);
}

#[test]
fn f16_tensor_converts_to_f32() {
    // 0x3C00 = 1, 0xC000 = -2, 0x3E00 = 1.5, 0x3555 = 2^-2 * (1 + 341/1024) = 0.333251953125,
    // 0x0001 = smallest subnormal 2^-24, 0x7BFF = 65504 (max).
    let bits = [0x3C00, 0xC000, 0x3E00, 0x3555, 0x0001, 0x7BFF];
    let t = T {
        name: "w",
        dtype: Dtype::F16,
        shape: vec![6],
        bytes: u16_bytes(&bits),
    };
    let (_dir, store) = store_with(&[t]);
    assert_eq!(store.dtype("w").unwrap(), DType::F16);
    let got = store.load_f32("w", &[6]).unwrap();
    assert_eq!(
        got,
        [1.0, -2.0, 1.5, 1365.0 / 4096.0, 2f32.powi(-24), 65504.0]
    );
}

#[test]
fn raw_gives_stored_bytes_dtype_and_shape() {
    let bytes = u16_bytes(&[0x3F80, 0x4000]);
    let t = T {
        name: "a.b",
        dtype: Dtype::BF16,
        shape: vec![1, 2],
        bytes: bytes.clone(),
    };
    let (_dir, store) = store_with(&[t, f32_tensor("c", &[1], &[4.0])]);
    let (dtype, shape, raw) = store.raw("a.b").unwrap();
    assert_eq!(
        (dtype, shape, raw),
        (DType::BF16, &[1usize, 2][..], &bytes[..])
    );
    let mut names: Vec<&str> = store.names().collect();
    names.sort();
    assert_eq!(names, ["a.b", "c"]);
    assert!(store.contains("c") && !store.contains("d"));
    assert_eq!(store.numel("a.b").unwrap(), 2);
}

#[test]
fn sharded_checkpoint_loads_through_the_index() {
    let dir = tempfile::tempdir().unwrap();
    write_safetensors(
        &dir.path().join("model-00001-of-00002.safetensors"),
        &[f32_tensor("a", &[2], &[1.0, 2.0])],
    );
    write_safetensors(
        &dir.path().join("model-00002-of-00002.safetensors"),
        &[
            f32_tensor("b", &[1], &[3.0]),
            f32_tensor("c", &[2, 1], &[4.0, 5.0]),
        ],
    );
    write(
        &dir.path().join("model.safetensors.index.json"),
        r#"{"metadata": {"total_size": 20}, "weight_map": {
            "a": "model-00001-of-00002.safetensors",
            "b": "model-00002-of-00002.safetensors",
            "c": "model-00002-of-00002.safetensors"}}"#,
    );
    let store = TensorStore::open(dir.path()).unwrap();
    assert_eq!(store.load_f32("a", &[2]).unwrap(), [1.0, 2.0]);
    assert_eq!(store.load_f32("b", &[1]).unwrap(), [3.0]);
    assert_eq!(store.load_f32("c", &[2, 1]).unwrap(), [4.0, 5.0]);
    assert!(store
        .path_of("c")
        .unwrap()
        .ends_with("model-00002-of-00002.safetensors"));
    assert_eq!(store.shard_paths().count(), 2);
}

#[test]
fn missing_tensor_is_named() {
    let (_dir, store) = store_with(&[f32_tensor("a", &[1], &[1.0])]);
    let err = store.load_f32("model.norm.weight", &[1]).unwrap_err();
    assert!(matches!(err, LoadError::MissingTensor { .. }), "{err}");
    assert!(err.to_string().contains("model.norm.weight"), "{err}");
    assert!(
        store.shape("nope").is_err() && store.dtype("nope").is_err() && store.raw("nope").is_err()
    );
}

#[test]
fn wrong_shape_names_tensor_file_expected_and_found() {
    let (_dir, store) = store_with(&[f32_tensor("w", &[2, 3], &[0.0; 6])]);
    let err = store.load_f32("w", &[3, 2]).unwrap_err();
    let msg = message_naming(&err, "model.safetensors");
    match err {
        LoadError::ShapeMismatch {
            tensor,
            expected,
            found,
            ..
        } => {
            assert_eq!(
                (tensor.as_str(), expected, found),
                ("w", vec![3, 2], vec![2, 3])
            );
        }
        other => panic!("{other}"),
    }
    assert!(msg.contains("[3, 2]") && msg.contains("[2, 3]"), "{msg}");
}

#[test]
fn non_float_dtypes_open_but_are_refused_as_weights() {
    let ids = T {
        name: "ids",
        dtype: Dtype::I64,
        shape: vec![2],
        bytes: vec![0; 16],
    };
    let fp8 = T {
        name: "w8",
        dtype: Dtype::F8_E4M3,
        shape: vec![4],
        bytes: vec![0; 4],
    };
    let (_dir, store) = store_with(&[ids, fp8]);
    for (name, dtype_name, shape) in [("ids", "I64", [2usize]), ("w8", "F8_E4M3", [4])] {
        assert_eq!(store.stored_dtype_name(name).unwrap(), dtype_name);
        for err in [
            store.dtype(name).unwrap_err(),
            store.load_f32(name, &shape).unwrap_err(),
            store.raw(name).unwrap_err(),
        ] {
            let msg = message_naming(&err, "model.safetensors");
            assert!(matches!(err, LoadError::UnsupportedDtype { .. }), "{msg}");
            assert!(msg.contains(name) && msg.contains(dtype_name), "{msg}");
        }
    }
}

#[test]
fn truncated_file_is_detected() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    write_safetensors(&path, &[f32_tensor("a", &[4], &[1.0, 2.0, 3.0, 4.0])]);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.truncate(bytes.len() - 4);
    let reason = safetensors_reason(&open_bytes(&bytes));
    assert!(
        reason.contains("`a`") && reason.contains("truncated"),
        "{reason}"
    );
}

#[test]
fn file_shorter_than_the_length_prefix_is_detected() {
    let reason = safetensors_reason(&open_bytes(&[1, 0, 0]));
    assert!(reason.contains("3 bytes"), "{reason}");
    let reason = safetensors_reason(&open_bytes(&[]));
    assert!(reason.contains("0 bytes"), "{reason}");
}

#[test]
fn header_length_past_the_end_of_the_file_is_detected() {
    let mut bytes = raw_safetensors("{}", &[]);
    bytes[..8].copy_from_slice(&1000u64.to_le_bytes());
    let reason = safetensors_reason(&open_bytes(&bytes));
    assert!(
        reason.contains("header length 1000") && reason.contains("past the end"),
        "{reason}"
    );
    // A length near u64::MAX must not overflow.
    bytes[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(safetensors_reason(&open_bytes(&bytes)).contains("past the end"));
}

#[test]
fn overlapping_offsets_are_detected() {
    let header = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#;
    let reason = safetensors_reason(&open_bytes(&raw_safetensors(header, &[0; 12])));
    assert!(
        reason.contains("overlaps") && reason.contains("`a`") && reason.contains("`b`"),
        "{reason}"
    );
}

#[test]
fn offsets_out_of_range_are_detected() {
    let header = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
    let reason = safetensors_reason(&open_bytes(&raw_safetensors(header, &[0; 4])));
    assert!(
        reason.contains("`a`") && reason.contains("past the data section"),
        "{reason}"
    );
    let header = r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[18446744073709551612,0]}}"#;
    assert!(safetensors_reason(&open_bytes(&raw_safetensors(header, &[0; 4]))).contains("`a`"));
}

#[test]
fn offsets_disagreeing_with_shape_are_detected() {
    let header = r#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#;
    let reason = safetensors_reason(&open_bytes(&raw_safetensors(header, &[0; 8])));
    assert!(
        reason.contains("`a`") && reason.contains("span 8 bytes"),
        "{reason}"
    );
    let header = r#"{"a":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}}"#;
    assert!(
        safetensors_reason(&open_bytes(&raw_safetensors(header, &[0; 8]))).contains("overflows")
    );
}

#[test]
fn gaps_and_trailing_bytes_are_detected() {
    let header = r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}"#;
    let reason = safetensors_reason(&open_bytes(&raw_safetensors(header, &[0; 12])));
    assert!(reason.contains("gap") && reason.contains("`b`"), "{reason}");
    let header = r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
    let reason = safetensors_reason(&open_bytes(&raw_safetensors(header, &[0; 9])));
    assert!(reason.contains("trailing"), "{reason}");
}

#[test]
fn malformed_headers_are_detected() {
    let cases = [
        ("not json", "not a JSON object"),
        (
            r#"{"a":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}}"#,
            "unknown dtype `Q4`",
        ),
        (
            r#"{"a":{"dtype":"F32","shape":"x","data_offsets":[0,4]}}"#,
            "`a`: malformed header entry",
        ),
        (
            r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}}"#,
            "end before they begin",
        ),
    ];
    for (header, expected) in cases {
        let reason = safetensors_reason(&open_bytes(&raw_safetensors(header, &[0; 4])));
        assert!(reason.contains(expected), "{header}: {reason}");
    }
    // __metadata__ is not a tensor.
    let header =
        r#"{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("model.safetensors"),
        raw_safetensors(header, &2.5f32.to_le_bytes()),
    )
    .unwrap();
    let store = TensorStore::open(dir.path()).unwrap();
    assert_eq!(store.names().collect::<Vec<_>>(), ["a"]);
    assert_eq!(store.load_f32("a", &[1]).unwrap(), [2.5]);
}

fn sharded_dir(index: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_safetensors(
        &dir.path().join("s1.safetensors"),
        &[f32_tensor("a", &[1], &[1.0])],
    );
    write_safetensors(
        &dir.path().join("s2.safetensors"),
        &[f32_tensor("b", &[1], &[2.0])],
    );
    write(&dir.path().join("model.safetensors.index.json"), index);
    dir
}

fn index_error(dir: &Path) -> LoadError {
    let err = TensorStore::open(dir).unwrap_err();
    message_naming(&err, "model.safetensors.index.json");
    err
}

#[test]
fn index_naming_a_missing_shard_is_an_error() {
    let dir = sharded_dir(r#"{"weight_map": {"a": "s1.safetensors", "b": "s3.safetensors"}}"#);
    let err = index_error(dir.path());
    match &err {
        LoadError::MissingShard { shard, tensor, .. } => {
            assert_eq!((shard.as_str(), tensor.as_str()), ("s3.safetensors", "b"))
        }
        other => panic!("{other}"),
    }
}

#[test]
fn index_disagreeing_with_its_shards_is_an_error() {
    let dir = sharded_dir(
        r#"{"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors", "c": "s2.safetensors"}}"#,
    );
    let msg = index_error(dir.path()).to_string();
    assert!(msg.contains("`b`") || msg.contains("`c`"), "{msg}");
    for bad in [
        r#"{"metadata": {}}"#,
        r#"{"weight_map": []}"#,
        r#"{"weight_map": {"a": 3}}"#,
        r#"{"weight_map": {"a": "../s1.safetensors"}}"#,
    ] {
        let dir = sharded_dir(bad);
        assert!(
            matches!(index_error(dir.path()), LoadError::Index { .. }),
            "{bad}"
        );
    }
}

#[test]
fn tensor_in_two_shards_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    write_safetensors(
        &dir.path().join("s1.safetensors"),
        &[f32_tensor("a", &[1], &[1.0])],
    );
    write_safetensors(
        &dir.path().join("s2.safetensors"),
        &[f32_tensor("a", &[1], &[2.0])],
    );
    write(
        &dir.path().join("model.safetensors.index.json"),
        r#"{"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}}"#,
    );
    let err = TensorStore::open(dir.path()).unwrap_err();
    assert!(
        matches!(err, LoadError::DuplicateTensor { ref tensor, .. } if tensor == "a"),
        "{err}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("s1.safetensors") && msg.contains("s2.safetensors"),
        "{msg}"
    );
}

#[test]
fn directory_without_weights_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let err = TensorStore::open(dir.path()).unwrap_err();
    assert!(matches!(err, LoadError::NoWeights { .. }), "{err}");
    assert!(err.to_string().contains("model.safetensors"), "{err}");
}
