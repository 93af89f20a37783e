//! The GGUF reader on the fixtures of tools/fixtures/gguf_fixtures.py: every metadata value type,
//! a split set, and dequantization of each supported block type bit for bit against the `gguf`
//! Python package's numpy reference (`ref.<TYPE>` tensors written beside `q.<TYPE>`).

use model_io::gguf::{GgmlType, GgufSet, MetaValue};
use model_io::LoadError;

fn blocks() -> GgufSet {
    GgufSet::open(&testdata::fixture("gguf/blocks.gguf")).unwrap()
}

#[test]
fn metadata_of_every_value_type() {
    let set = blocks();
    let part = &set.parts[0];
    assert_eq!(part.version, 3);
    assert_eq!(part.alignment, 32);
    let get = |k: &str| set.get(k).unwrap_or_else(|| panic!("{k} missing")).clone();
    assert_eq!(
        get("general.architecture"),
        MetaValue::String("blocks".into())
    );
    assert_eq!(get("test.u8"), MetaValue::U8(200));
    assert_eq!(get("test.i8"), MetaValue::I8(-100));
    assert_eq!(get("test.u16"), MetaValue::U16(60000));
    assert_eq!(get("test.i16"), MetaValue::I16(-30000));
    assert_eq!(get("test.u32"), MetaValue::U32(4_000_000_000));
    assert_eq!(get("test.i32"), MetaValue::I32(-2_000_000_000));
    assert_eq!(get("test.f32"), MetaValue::F32(0.25));
    assert_eq!(get("test.bool"), MetaValue::Bool(true));
    assert_eq!(get("test.string"), MetaValue::String("héllo ✓".into()));
    assert_eq!(get("test.u64"), MetaValue::U64((1 << 63) + 5));
    assert_eq!(get("test.i64"), MetaValue::I64(-(1 << 62)));
    assert_eq!(get("test.f64"), MetaValue::F64(-1.5e300));
    let ints = get("test.array_i32");
    let ints: Vec<i64> = ints
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    assert_eq!(ints, [1, -2, 3]);
    let strs = get("test.array_str");
    let strs: Vec<&str> = strs
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(strs, ["a", "", "ü"]);
    let nested = get("test.array_nested");
    let lens: Vec<usize> = nested
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_array().unwrap().len())
        .collect();
    assert_eq!(lens, [2, 1]);
}

#[test]
fn dequantization_equals_the_gguf_package_bit_for_bit() {
    let set = blocks();
    let mut checked = Vec::new();
    for (_, info) in set.tensors() {
        let Some(ty) = info.name.strip_prefix("q.") else {
            continue;
        };
        if !info.ggml_type.is_supported() {
            continue;
        }
        assert_eq!(info.ggml_type.name(), ty);
        assert_eq!(info.shape(), [2, 512]);
        let ours = set.load_f32(&info.name).unwrap();
        let reference = set.load_f32(&format!("ref.{ty}")).unwrap();
        assert_eq!(ours.len(), reference.len());
        for (i, (a, b)) in ours.iter().zip(&reference).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "{ty} element {i}: {a} vs {b}");
        }
        checked.push(info.ggml_type);
    }
    checked.sort();
    use GgmlType::*;
    let mut want = vec![F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4K, Q5K, Q6K];
    want.sort();
    assert_eq!(checked, want);
}

#[test]
fn unsupported_type_is_an_error_naming_tensor_and_type() {
    let set = blocks();
    let err = set.load_f32("q.Q2_K").unwrap_err();
    assert!(
        matches!(err, LoadError::UnsupportedGgmlType { .. }),
        "{err}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("blocks.gguf") && msg.contains("`q.Q2_K`") && msg.contains("Q2_K"),
        "{msg}"
    );
}

#[test]
fn split_set_opens_from_its_first_part() {
    let dir = testdata::fixture("gguf");
    let set = GgufSet::open(&dir.join("split-00001-of-00003.gguf")).unwrap();
    assert_eq!(set.parts.len(), 3);
    for i in 0..5 {
        let t = set.load_f32(&format!("t.{i}")).unwrap();
        assert_eq!(t, vec![i as f32; 96]);
    }
    // A later part is not a model on its own.
    let err = GgufSet::open(&dir.join("split-00002-of-00003.gguf")).unwrap_err();
    assert!(err.to_string().contains("first part"), "{err}");
    // A missing part is named.
    let tmp = tempfile::tempdir().unwrap();
    for n in [1, 2] {
        let name = format!("split-0000{n}-of-00003.gguf");
        std::fs::copy(dir.join(&name), tmp.path().join(&name)).unwrap();
    }
    let err = GgufSet::open(&tmp.path().join("split-00001-of-00003.gguf")).unwrap_err();
    assert!(
        err.to_string().contains("split-00003-of-00003.gguf"),
        "{err}"
    );
}
