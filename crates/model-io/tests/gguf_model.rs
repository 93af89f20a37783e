//! GGUF models against the Hugging Face checkpoints they were converted from by llama.cpp's
//! convert_hf_to_gguf.py: every tensor (after undoing the converter's changes), the config, and the
//! tokenizer's ids on a varied corpus.

use std::path::{Path, PathBuf};

use model_io::Checkpoint;

/// Compares every tensor of `gguf` with `hf`'s: `exact` requires equal bits except where the
/// converter's transform is lossy (A_log: ln(-(-exp(x))) within 4 ulp-ish, 1e-6 relative).
pub fn assert_same_tensors(hf: &Checkpoint, gguf: &Checkpoint, norm_tol: f32) {
    let mut names: Vec<&str> = hf.tensors.names().collect();
    names.sort();
    for name in names {
        let shape = hf.tensors.shape(name).unwrap().to_vec();
        let want = hf.tensors.load_f32(name, &shape).unwrap();
        let got = gguf
            .tensors
            .load_f32(name, &shape)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let tol = if name.ends_with("A_log") {
            1e-6
        } else if name.contains("norm") && !name.contains("linear_attn") {
            norm_tol
        } else {
            0.0
        };
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            let ok = if tol == 0.0 {
                a.to_bits() == b.to_bits()
            } else {
                (a - b).abs() <= tol * b.abs().max(1.0)
            };
            assert!(ok, "{name}[{i}]: gguf {a} vs hf {b}");
        }
    }
}

fn testbed_gguf() -> PathBuf {
    PathBuf::from(std::env::var("TESTBED_GGUF").expect("TESTBED_GGUF"))
}

#[test]
#[ignore = "exploratory"]
fn testbed_tensors() {
    let hf = Checkpoint::open(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/testbed"))
        .unwrap();
    let g = Checkpoint::open(&testbed_gguf()).unwrap();
    let mut a = format!("{:?}", hf.config);
    let b = format!("{:?}", g.config);
    a = a.replace("testbed", "");
    println!("{a}\n{b}");
    assert_same_tensors(&hf, &g, 1.2e-7);
}
