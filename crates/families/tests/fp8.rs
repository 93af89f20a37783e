//! Fine-grained FP8 checkpoints (Qwen's layout; the `qwen3_5_fp8` fixture): every FP8 matrix runs on the
//! FP8 kernel (transformers parity is in parity.rs and drafters' mtp_parity.rs), verify blocks give the
//! bits of one-row steps (speculation stays exact), and bad FP8 input is one error naming the field or
//! tensor.

use std::path::Path;

use families::layers::{Linear, Tensors, Weights};
use families::Wanted;
use model_io::{Checkpoint, LoadError};

fn fixture() -> std::path::PathBuf {
    testdata::fixture("qwen3_5_fp8")
}

#[test]
fn fp8_matrices_run_on_their_blocks_and_verify_rows_equal_decode_rows() {
    let ck = Checkpoint::open(&fixture()).unwrap();
    let store = &ck.tensors;
    let t = Tensors::new(store, "");
    let names: Vec<String> = store
        .names()
        .filter(|n| store.stored_dtype_name(n).unwrap() == "F8_E4M3")
        .map(str::to_string)
        .collect();
    assert!(names.len() >= 20, "{} FP8 matrices", names.len());
    for name in &names {
        let [rows, cols] = store.shape(name).unwrap()[..] else {
            panic!("{name}: not a matrix")
        };
        let linear = Linear::load(&t, name, rows, cols).unwrap();
        assert!(
            matches!(linear.w, Weights::Fp8(_)),
            "{name}: not in FP8 blocks"
        );
    }
    let model = families::load(&ck).unwrap();
    let tokens: Vec<u32> = (0..16).map(|i| (i * 37 + 5) % 200).collect();
    let mut state = model.new_state();
    model
        .forward(&tokens[..10], 0, &mut state, &Wanted::none())
        .unwrap();
    let mut one = state.clone();
    let block = model
        .forward(&tokens[10..], 10, &mut state, &Wanted::all())
        .unwrap();
    for (i, &tok) in tokens[10..].iter().enumerate() {
        let row = model
            .forward(&[tok], 10 + i, &mut one, &Wanted::last())
            .unwrap();
        let same = row
            .logits
            .iter()
            .zip(block.row(i))
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "row {i} of the verify block");
    }
}

/// A copy of the fixture directory with config.json edited by `edit`.
fn with_config(dir: &Path, edit: impl Fn(&mut serde_json::Value)) -> std::path::PathBuf {
    let out = dir.join(format!("ck{}", std::fs::read_dir(dir).unwrap().count()));
    std::fs::create_dir_all(&out).unwrap();
    for entry in std::fs::read_dir(fixture()).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), out.join(entry.file_name())).unwrap();
    }
    let path = out.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(&path, config.to_string()).unwrap();
    out
}

/// An edit of config.json.
type Edit = dyn Fn(&mut serde_json::Value);

#[test]
fn bad_fp8_configs_and_scales_are_errors_naming_the_field_or_tensor() {
    let tmp = tempfile::tempdir().unwrap();
    let cases: [(&Edit, &str); 5] = [
        (
            &|c| c["quantization_config"]["quant_method"] = "gptq".into(),
            "quantization_config.quant_method",
        ),
        (
            &|c| c["quantization_config"]["weight_block_size"] = serde_json::json!([128, 100]),
            "quantization_config.weight_block_size",
        ),
        (
            &|c| c["quantization_config"]["fmt"] = "e5m2".into(),
            "quantization_config.fmt",
        ),
        (
            &|c| c["quantization_config"]["activation_scheme"] = "static".into(),
            "quantization_config.activation_scheme",
        ),
        (
            &|c| {
                c.as_object_mut().unwrap().remove("quantization_config");
            },
            "F8_E4M3",
        ),
    ];
    for (edit, expect) in cases {
        let dir = with_config(tmp.path(), edit);
        let err = match Checkpoint::open(&dir) {
            Ok(_) => panic!("{expect}: opened"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains(expect), "{expect}: {err}");
    }
    // A scale grid of the wrong shape (the block size says 3 x 2 blocks, not 2 x 3).
    let dir = with_config(tmp.path(), |c| {
        c["quantization_config"]["weight_block_size"] = serde_json::json!([256, 64])
    });
    match Checkpoint::open(&dir) {
        Err(LoadError::ShapeMismatch { tensor, .. }) => {
            assert!(tensor.ends_with("weight_scale_inv"), "{tensor}")
        }
        other => panic!("expected a scale shape error, got {:?}", other.err()),
    }
    // --quantize on a checkpoint already quantized.
    let mut ck = Checkpoint::open(&fixture()).unwrap();
    let err = ck
        .tensors
        .set_quantize(Some(model_io::Quantize::Q8_0))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("--quantize") && err.contains("F8_E4M3"),
        "{err}"
    );
}
