//! `--device cpu|cuda|auto` end to end, as a user runs the binary. CI has no GPU, so: `cuda` must be one
//! `error: --device cuda: ...` line (no panic, exit 1) on every subcommand that loads a model; `auto`
//! must run on the CPU without a word and produce the CPU's output; `cuda-emulated` (the CUDA backend's
//! host emulation) runs generate through the GPU code path, where speculative decoding must commit the
//! sequential stream. On a machine with a GPU these run as without one (`TURBOSPARK_CUDA_DRIVER=none`).

use std::io::Write;
use std::process::{Command, Output, Stdio};

fn fixture(name: &str) -> String {
    testdata::fixture(name).display().to_string()
}

fn run_with(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_turbospark"))
        .args(args)
        .env_remove("TURBOSPARK_MODEL")
        .env("TURBOSPARK_CUDA_DRIVER", "none")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn turbospark");
    let mut pipe = child.stdin.take().unwrap();
    pipe.write_all(stdin.as_bytes()).unwrap();
    drop(pipe);
    child.wait_with_output().unwrap()
}

fn run(args: &[&str]) -> Output {
    run_with(args, "")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8(bytes.to_vec()).unwrap()
}

fn success(o: &Output) -> (String, String) {
    assert!(
        o.status.success(),
        "exit {:?}: {}",
        o.status,
        text(&o.stderr)
    );
    (text(&o.stdout), text(&o.stderr))
}

#[test]
fn device_cuda_without_a_gpu_is_one_error_line() {
    let model = fixture("qwen3_realtok");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("text.txt");
    std::fs::write(
        &file,
        "one two three four five six seven eight nine ten ".repeat(4),
    )
    .unwrap();
    let file = file.display().to_string();
    for (args, stdin) in [
        (
            vec!["generate", "--model", &model, "--device", "cuda", "hi"],
            "",
        ),
        (vec!["chat", "--model", &model, "--device", "cuda"], "hi\n"),
        (
            vec![
                "perplexity",
                "--model",
                &model,
                "--device",
                "cuda",
                "--ctx",
                "8",
                &file,
            ],
            "",
        ),
        (
            vec![
                "bench", "--model", &model, "--device", "cuda", "--runs", "1",
            ],
            "",
        ),
    ] {
        let o = run_with(&args, stdin);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 1, "{args:?}: one line, got {err}");
        assert!(
            lines[0].starts_with("error: --device cuda: ") && lines[0].contains("CUDA"),
            "{args:?}: {err}"
        );
        assert!(text(&o.stdout).is_empty(), "{args:?}: nothing generated");
    }
}

#[test]
fn device_auto_without_a_gpu_runs_on_the_cpu_silently() {
    let model = fixture("qwen3_realtok");
    let prompt = "The quick brown fox";
    let args = |device: &'static str| {
        vec![
            "generate",
            "--model",
            model.as_str(),
            "--max-tokens",
            "12",
            "--device",
            device,
            prompt,
        ]
    };
    let (cpu_out, cpu_err) = success(&run(&args("cpu")));
    let (auto_out, auto_err) = success(&run(&args("auto")));
    let no_flag = ["generate", "--model", &model, "--max-tokens", "12", prompt];
    let (default_out, default_err) = success(&run(&no_flag));
    let mut stats = args("auto");
    stats.insert(1, "--stats");
    let (_, stats_err) = success(&run(&stats));
    assert!(stats_err.contains("device: cpu"), "{stats_err}");
    assert!(!cpu_out.trim().is_empty());
    assert_eq!(auto_out, cpu_out, "auto runs the CPU engine");
    assert_eq!(default_out, cpu_out, "auto is the default");
    // Silent: the same stderr as `--device cpu` (its speculation warning included), no `note:` line.
    assert_eq!(auto_err, cpu_err);
    assert_eq!(default_err, cpu_err);
    assert!(
        !auto_err.contains("note:") && !auto_err.contains("device"),
        "{auto_err}"
    );
    assert!(stats_err.lines().any(|l| l == "device: cpu"), "{stats_err}");
}

#[test]
fn unknown_device_is_a_flag_error() {
    let o = run(&["generate", "--device", "tpu", "hi"]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--device") && err.contains("cpu, cuda or auto"),
        "{err}"
    );
}

/// A copy of `fixtures/qwen3_5` (MTP head) with a word-level tokenizer: token `i` is the word `w{i}`.
fn qwen3_5_with_words() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let src = testdata::fixture("qwen3_5");
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        if !name.starts_with("reference") {
            std::fs::copy(&path, dir.path().join(name)).unwrap();
        }
    }
    let vocab: serde_json::Map<String, serde_json::Value> = (0..512)
        .map(|i| (format!("w{i}"), serde_json::json!(i)))
        .collect();
    let tokenizer = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "w0"}
    });
    std::fs::write(dir.path().join("tokenizer.json"), tokenizer.to_string()).unwrap();
    dir
}

/// The GPU code path end to end: MTP speculative generate on the emulated device prints the sequential
/// device stream for every block, reports the device and the rounds.
#[test]
fn speculative_generate_on_the_emulated_gpu_equals_sequential() {
    let dir = qwen3_5_with_words();
    let model = dir.path().to_str().unwrap();
    let prompt = "w17 w201 w5 w77 w310 w42 w9 w128 w3 w64";
    let generate = |speculative: &str| {
        let o = run(&[
            "generate",
            "--model",
            model,
            "--device",
            "cuda-emulated",
            "--max-tokens",
            "24",
            "--speculative",
            speculative,
            "--stats",
            prompt,
        ]);
        success(&o)
    };
    let (sequential, err) = generate("off");
    assert_eq!(sequential.split_whitespace().count(), 24, "{sequential}");
    assert!(
        err.lines().any(|l| l == "device: cuda (host emulation)"),
        "{err}"
    );
    for block in ["1", "2", "4"] {
        let (out, err) = generate(block);
        assert_eq!(out, sequential, "--speculative {block}");
        assert!(
            err.contains(&format!("stats (mtp, block {block})")),
            "{err}"
        );
        assert!(err.contains("speculative: rounds="), "{err}");
    }
}
