//! The `turbospark` binary on GGUF files: `info` (each tensor type's share), errors on bad files, and
//! — where llama.cpp's converter is installed — the testbed converted to GGUF generating exactly what
//! the testbed does, with and without MTP speculation from the file's nextn layers, and `--chat` from
//! the file's template.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_turbospark"))
        .args(args)
        .env_remove("TURBOSPARK_MODEL")
        .env_remove("TURBOSPARK_EMBEDDED_MODEL")
        .output()
        .expect("spawn turbospark")
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn info_reports_a_gguf_model_and_its_tensor_types() {
    let path = testdata::fixture("gguf/qwen3_5.gguf");
    let o = run(&["info", path.to_str().unwrap()]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("Qwen3_5ForCausalLM"), "{out}");
    assert!(out.contains("GGUF types:     F32 100.0%"), "{out}");
    assert!(out.contains("MTP head:       yes"), "{out}");
    assert!(out.contains("tokenizer:      no"), "{out}");
}

#[test]
fn bad_gguf_files_are_one_error_line() {
    let dir = tempfile::tempdir().unwrap();
    let blocks = std::fs::read(testdata::fixture("gguf/blocks.gguf")).unwrap();
    let cases: [(&str, Vec<u8>, &str); 3] = [
        ("truncated.gguf", blocks[..100].to_vec(), "truncated"),
        ("magic.gguf", b"GGML\x03\0\0\0".to_vec(), "bad magic"),
        (
            "arch.gguf",
            blocks.clone(),
            "unsupported architecture `blocks`",
        ),
    ];
    for (name, bytes, expect) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        let o = run(&[
            "generate",
            "--device",
            "cpu",
            "--model",
            path.to_str().unwrap(),
            "hi",
        ]);
        let (_, err) = text(&o);
        assert!(!o.status.success());
        assert!(
            err.contains("error:") && err.contains(name) && err.contains(expect),
            "{err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
}

fn testbed() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/testbed")
}

fn generate(model: &Path, extra: &[&str]) -> String {
    let mut args = vec![
        "generate",
        "--device",
        "cpu",
        "--max-tokens",
        "64",
        "--model",
    ];
    args.push(model.to_str().unwrap());
    args.extend_from_slice(extra);
    let o = run(&args);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    out
}

#[test]
#[ignore = "needs llama.cpp's converter: set TURBOSPARK_LLAMA_CPP and TURBOSPARK_GGUF_PYTHON (tools/fixtures/README.md)"]
fn testbed_gguf_generates_what_the_testbed_does() {
    let gguf =
        testdata::gguf_tools::converted(&testbed(), "testbed-f32.gguf", &["--outtype", "f32"]);
    for prompt in ["fn main() {", "The history of the"] {
        let want = generate(&testbed(), &["--speculative", "off", prompt]);
        assert_eq!(generate(&gguf, &["--speculative", "off", prompt]), want);
        assert_eq!(
            generate(&gguf, &["--drafter", "mtp", "--speculative", "3", prompt]),
            want
        );
        assert_eq!(generate(&gguf, &["--speculative", "auto", prompt]), want);
    }
    let want = generate(&testbed(), &["--chat", "Write a haiku."]);
    assert_eq!(generate(&gguf, &["--chat", "Write a haiku."]), want);
}

#[test]
#[ignore = "needs llama.cpp's converter and llama-quantize: set TURBOSPARK_LLAMA_CPP, TURBOSPARK_GGUF_PYTHON, TURBOSPARK_LLAMA_QUANTIZE (tools/fixtures/README.md)"]
fn q4_k_m_testbed_speculates_exactly() {
    use testdata::gguf_tools::{converted, quantized};
    let f32_path = converted(&testbed(), "testbed-f32.gguf", &["--outtype", "f32"]);
    let gguf = quantized(&f32_path, "testbed-q4_k_m.gguf", "Q4_K_M");
    let o = run(&["info", gguf.to_str().unwrap()]);
    let (out, _) = text(&o);
    assert!(out.contains("Q4_K") && out.contains("Q6_K"), "{out}");
    for prompt in ["fn main() {", "The history of the"] {
        let plain = generate(&gguf, &["--speculative", "off", prompt]);
        assert_eq!(
            generate(&gguf, &["--drafter", "mtp", "--speculative", "3", prompt]),
            plain
        );
        assert_eq!(generate(&gguf, &["--speculative", "auto", prompt]), plain);
    }
}
