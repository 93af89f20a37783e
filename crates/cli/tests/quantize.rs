//! `--quantize`: the embedded testbed (bf16) quantized at load runs on the quantized kernels,
//! speculating exactly (greedy with MTP == greedy sequential, both quantized), close to bf16; bad
//! uses are one error line naming the flag.

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

fn testbed() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/testbed")
}

fn generate(extra: &[&str], prompt: &str) -> String {
    let model = testbed();
    let mut args = vec!["generate", "--device", "cpu", "--max-tokens", "48"];
    args.extend(["--model", model.to_str().unwrap()]);
    args.extend_from_slice(extra);
    args.push(prompt);
    let o = run(&args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn quantized_testbed_speculates_exactly() {
    for q in ["q8_0", "q4_k", "fp8"] {
        for prompt in ["fn main() {", "The history of the"] {
            let plain = generate(&["--quantize", q, "--speculative", "off"], prompt);
            assert!(plain.len() > prompt.len(), "{q}: {plain:?}");
            for spec in [
                &["--drafter", "mtp", "--speculative", "3"][..],
                &["--speculative", "auto"],
            ] {
                let mut args = vec!["--quantize", q];
                args.extend_from_slice(spec);
                assert_eq!(generate(&args, prompt), plain, "{q} {spec:?}");
            }
        }
    }
}

#[test]
fn bad_quantize_requests_are_one_error_line() {
    let model = testbed();
    let model = model.to_str().unwrap();
    let cases: [(&[&str], &str); 2] = [
        (
            &["generate", "--model", model, "--quantize", "q3_k", "hi"],
            "--quantize",
        ),
        (
            &[
                "bench",
                "--model",
                model,
                "--quantize",
                "fp16",
                "--gen-tokens",
                "4",
            ],
            "--quantize",
        ),
    ];
    for (args, expect) in cases {
        let o = run(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?}");
        assert!(err.contains(expect) && !err.contains("panicked"), "{err}");
    }
}
