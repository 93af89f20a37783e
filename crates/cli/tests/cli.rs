//! End-to-end tests of the `turbospark` binary: each runs the built executable as a user would and
//! checks its exit status, stdout and stderr. References are independent of our code where one
//! exists: transformers' greedy continuation of the real-tokenizer fixture (reference.json), the
//! documented perplexity window arithmetic, the fixtures' known architecture.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn fixture(name: &str) -> String {
    testdata::fixture(name).display().to_string()
}

/// Runs the binary with `args` (no TURBOSPARK_MODEL or TURBOSPARK_EMBEDDED_MODEL inherited) and
/// optional stdin.
fn run_with(args: &[&str], stdin: Option<&str>, env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_turbospark"));
    cmd.args(args)
        .env_remove("TURBOSPARK_MODEL")
        .env_remove("TURBOSPARK_EMBEDDED_MODEL")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn turbospark");
    let mut pipe = child.stdin.take().unwrap();
    pipe.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
    drop(pipe);
    child.wait_with_output().unwrap()
}

fn run(args: &[&str]) -> Output {
    run_with(args, None, &[])
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}

/// A failed run: non-zero exit, an `error:` line, no panic. Returns stderr.
fn expect_error(o: &Output) -> String {
    let err = stderr(o);
    assert!(
        !o.status.success(),
        "expected failure; stdout {}",
        stdout(o)
    );
    assert!(err.contains("error:"), "no error line: {err}");
    assert!(!err.contains("panicked"), "panic: {err}");
    err
}

fn expect_success(o: &Output) -> String {
    assert!(
        o.status.success(),
        "exit {:?}; stderr: {}",
        o.status,
        stderr(o)
    );
    stdout(o)
}

/// The value after `key:` on its line of `info` output.
fn info_field(text: &str, key: &str) -> String {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .unwrap_or_else(|| panic!("no {key} line in {text}"))
        .trim()
        .to_string()
}

/// transformers' prompt and greedy continuation for `fixtures/qwen3_realtok`.
fn realtok_reference() -> (String, Vec<u32>) {
    let json = std::fs::read_to_string(testdata::fixture("qwen3_realtok/reference.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    let prompt = json["prompt_text"].as_str().unwrap().to_string();
    let greedy = json["greedy_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    (prompt, greedy)
}

fn realtok_decode(ids: &[u32]) -> String {
    let checkpoint =
        turbospark::model_io::Checkpoint::open(Path::new(&fixture("qwen3_realtok"))).unwrap();
    checkpoint.tokenizer().unwrap().decode(ids, true).unwrap()
}

#[test]
fn bad_model_dir_is_one_error_line_naming_the_path() {
    let o = run(&["generate", "--model", "/nonexistent/turbospark-model", "hi"]);
    let err = expect_error(&o);
    assert!(err.contains("/nonexistent/turbospark-model"), "{err}");
    let o = run(&["info", "/nonexistent/turbospark-model"]);
    assert!(expect_error(&o).contains("/nonexistent/turbospark-model"));
}

#[test]
fn model_env_var_overrides_the_default() {
    let o = run_with(
        &["generate", "hi"],
        None,
        &[("TURBOSPARK_MODEL", "/nonexistent/from-env")],
    );
    assert!(expect_error(&o).contains("/nonexistent/from-env"));
}

#[test]
fn the_embedded_model_is_the_default_and_its_absence_a_clear_error() {
    // Present (the repository's testbed): commands without --model run on it.
    let text = stdout(&run(&["info"]));
    assert!(text.contains("models/testbed"), "{text}");
    // Absent (moved away with TURBOSPARK_EMBEDDED_MODEL): one error naming where it was looked for
    // and how to pass a model.
    let missing = std::env::temp_dir().join(format!("turbospark-no-model-{}", std::process::id()));
    let missing = missing.display().to_string();
    for args in [&["generate", "hi"][..], &["info"][..]] {
        let err = expect_error(&run_with(
            args,
            None,
            &[("TURBOSPARK_EMBEDDED_MODEL", &missing)],
        ));
        assert!(
            err.contains(&missing) && err.contains("--model") && err.contains("TURBOSPARK_MODEL"),
            "{err}"
        );
    }
}

#[test]
fn bad_flag_values_name_the_flag() {
    let err = expect_error(&run(&["generate", "--speculative", "bogus", "hi"]));
    assert!(err.contains("--speculative"), "{err}");
    let err = expect_error(&run(&["generate", "--drafter", "eagle", "hi"]));
    assert!(err.contains("--drafter"), "{err}");
    let realtok = fixture("qwen3_realtok");
    let err = expect_error(&run(&[
        "generate",
        "--model",
        &realtok,
        "--max-tokens",
        "0",
        "hi",
    ]));
    assert!(err.contains("max_tokens"), "{err}");
    let err = expect_error(&run(&[
        "generate",
        "--model",
        &realtok,
        "--temperature",
        "-1",
        "hi",
    ]));
    assert!(err.contains("temperature"), "{err}");
}

#[test]
fn info_reports_family_layers_and_drafters() {
    let out = expect_success(&run(&["info", &fixture("qwen3_5")]));
    assert!(info_field(&out, "family").starts_with("Qwen3.5"), "{out}");
    assert!(info_field(&out, "MTP head").starts_with("yes"), "{out}");
    assert_eq!(info_field(&out, "layers"), "4: 3 linear : 1 full (LLLF)");
    assert_eq!(info_field(&out, "weights dtype"), "f32");
    assert_eq!(info_field(&out, "tokenizer"), "no");
    // Negative control: the dense fixture has no head.
    let out = expect_success(&run(&["info", &fixture("qwen3")]));
    assert!(info_field(&out, "family").starts_with("Qwen3 "), "{out}");
    assert_eq!(info_field(&out, "MTP head"), "no");
    assert_eq!(info_field(&out, "DFlash drafter"), "no");
    // The testbed's DFlash drafter, as its config states it.
    let testbed = repo().join("models/testbed").display().to_string();
    let out = expect_success(&run(&["info", &testbed]));
    assert_eq!(
        info_field(&out, "DFlash drafter"),
        "yes (dflash/: 3 layer(s), block 8, taps of layers [1, 3, 5])"
    );
    let out = expect_success(&run(&["info", &fixture("qwen3_realtok")]));
    assert_eq!(info_field(&out, "weights dtype"), "bf16");
    assert_eq!(info_field(&out, "chat template"), "yes");
    // An FP8 checkpoint's e4m3 matrices, named as such (not as the f32 they dequantize to).
    let out = expect_success(&run(&["info", &fixture("qwen3_5_fp8")]));
    assert_eq!(
        info_field(&out, "weights dtype"),
        "mixed (bf16 ×42, fp8 e4m3 blocks ×20 tensors)"
    );
}

#[test]
fn info_names_qwen3_moe_and_its_experts() {
    let out = expect_success(&run(&["info", &fixture("qwen3_moe")]));
    assert_eq!(
        info_field(&out, "architecture"),
        "Qwen3MoeForCausalLM",
        "{out}"
    );
    assert!(info_field(&out, "family").starts_with("Qwen3-MoE"), "{out}");
    assert_eq!(
        info_field(&out, "MoE"),
        "8 experts, top 2 (renormalised), expert width 16, shared expert none, on 3 of 3 layers"
    );
    assert_eq!(info_field(&out, "layers"), "3: 3 full attention");
    assert_eq!(info_field(&out, "weights dtype"), "bf16");
    let out = expect_success(&run(&["info", &fixture("qwen3_moe_mixed")]));
    assert_eq!(
        info_field(&out, "MoE"),
        "8 experts, top 3, expert width 16, shared expert none, on 1 of 4 layers"
    );
}

#[test]
fn greedy_generate_matches_transformers_and_repeats() {
    let (prompt, greedy) = realtok_reference();
    let model = fixture("qwen3_realtok");
    let args = [
        "generate",
        "--model",
        &model,
        "--max-tokens",
        "8",
        "--speculative",
        "off",
        &prompt,
    ];
    let first = expect_success(&run(&args));
    assert_eq!(first, format!("{}\n", realtok_decode(&greedy[..8])));
    assert_eq!(expect_success(&run(&args)), first);
    // The prompt from stdin gives the same continuation.
    let piped = run_with(&args[..args.len() - 1], Some(&prompt), &[]);
    assert_eq!(expect_success(&piped), first);
}

#[test]
fn sampled_generate_is_deterministic_for_a_seed() {
    let model = fixture("qwen3_realtok");
    let args = |seed: &'static str| {
        run(&[
            "generate",
            "--model",
            &model,
            "--max-tokens",
            "8",
            "--temperature",
            "1.0",
            "--seed",
            seed,
            "The weather today",
        ])
    };
    let a = expect_success(&args("11"));
    assert!(!a.trim_end().is_empty());
    assert_eq!(expect_success(&args("11")), a);
    // The seed matters: 8 draws at temperature 1 over 151936 tokens collide with negligible odds.
    assert_ne!(expect_success(&args("12")), a);
}

#[test]
fn stop_string_truncates_the_output() {
    let (prompt, greedy) = realtok_reference();
    let full = realtok_decode(&greedy[..8]);
    let head = realtok_decode(&greedy[..3]);
    let stop = realtok_decode(&greedy[3..5]);
    assert!(full.starts_with(&format!("{head}{stop}")) && !stop.is_empty());
    let model = fixture("qwen3_realtok");
    let o = run(&[
        "generate",
        "--model",
        &model,
        "--max-tokens",
        "8",
        "--speculative",
        "off",
        "--stop",
        &stop,
        "--stats",
        &prompt,
    ]);
    assert_eq!(expect_success(&o), format!("{head}\n"));
    assert!(stderr(&o).contains("stop string 0"), "{}", stderr(&o));
}

#[test]
fn named_speculation_without_a_head_is_refused() {
    for name in ["qwen3", "qwen3_realtok"] {
        let model = fixture(name);
        let err = expect_error(&run(&[
            "generate",
            "--model",
            &model,
            "--speculative",
            "2",
            "hi",
        ]));
        assert!(
            err.contains("--speculative 2") && err.contains("MTP head"),
            "{err}"
        );
    }
}

#[test]
fn auto_speculation_without_a_head_runs_the_suffix_drafter() {
    let model = fixture("qwen3_realtok");
    let o = run(&[
        "generate",
        "--model",
        &model,
        "--max-tokens",
        "4",
        "--stats",
        "hi",
    ]);
    expect_success(&o);
    let err = stderr(&o);
    assert!(
        !err.contains("warning:") && err.contains("stats (suffix, block 8 (auto"),
        "{err}"
    );
}

#[test]
fn speculation_on_qwen3_5_needs_its_missing_tokenizer_for_text() {
    // qwen3_5 has an MTP head but no tokenizer.json: the speculative plan passes, loading fails.
    let model = fixture("qwen3_5");
    let err = expect_error(&run(&[
        "generate",
        "--model",
        &model,
        "--speculative",
        "2",
        "hi",
    ]));
    assert!(err.contains("tokenizer.json"), "{err}");
}

#[test]
fn bench_acceptance_profiles_set_what_is_accepted() {
    // A random dense checkpoint with no drafter at all: the profile drafter needs none.
    let model = fixture("qwen3");
    let bench = |profile: &str, cost: &str| {
        run(&[
            "bench",
            "--model",
            &model,
            "--threads-list",
            "1",
            "--runs",
            "1",
            "--prompt-tokens",
            "8",
            "--gen-tokens",
            "24",
            "--speculative",
            "2,3",
            "--acceptance",
            profile,
            "--draft-cost",
            cost,
        ])
    };
    let row = |out: &str, block: &str| -> Vec<String> {
        let line = out
            .lines()
            .find(|l| l.split('|').next().map(str::trim) == Some(block))
            .unwrap_or_else(|| panic!("no block {block} row: {out}"));
        line.split('|').map(|c| c.trim().to_string()).collect()
    };
    // Every proposal corrupted: none accepted, and the output is still the sequential one.
    let out = expect_success(&bench("geometric:0", "free"));
    for block in ["2", "3"] {
        let cols = row(&out, block);
        assert_eq!(cols[3], "0.00 (exp 0.00)", "{out}");
        assert_eq!(cols[8], "yes", "{out}");
    }
    // Every proposal right: each round accepts the whole block but for the budget's last one.
    let out = expect_success(&bench("oracle", "free"));
    let cols = row(&out, "3");
    assert!(cols[3].ends_with("(exp 3.00)"), "{out}");
    let accepted: f64 = cols[3].split(' ').next().unwrap().parse().unwrap();
    assert!(accepted > 2.4, "{out}");
    assert_eq!(cols[4], "4.00x", "{out}");
    assert_eq!(cols[8], "yes", "{out}");
    // A drafter's cost needs that drafter.
    let err = expect_error(&bench("oracle", "mtp"));
    assert!(err.contains("--draft-cost mtp"), "{err}");
    let err = expect_error(&bench("1.5", "free"));
    assert!(err.contains("--acceptance"), "{err}");
}

#[test]
fn bench_compares_mtp_with_sequential_on_qwen3_5() {
    let model = fixture("qwen3_5");
    let o = run(&[
        "bench",
        "--model",
        &model,
        "--threads-list",
        "1",
        "--runs",
        "1",
        "--prompt-tokens",
        "16",
        "--gen-tokens",
        "12",
        "--speculative",
        "1,2",
    ]);
    let out = expect_success(&o);
    assert!(out.contains("prefill tok/s"), "{out}");
    for block in ["mtp 1", "mtp 2"] {
        let row = out
            .lines()
            .find(|l| l.trim_start().starts_with(block))
            .unwrap_or_else(|| panic!("no {block} row: {out}"));
        // Greedy speculative decoding is lossless: the tokens equal the sequential ones.
        assert!(row.trim_end().ends_with("yes"), "{row}");
    }
    // No head on the dense fixture: a named block is refused.
    let err = expect_error(&run(&[
        "bench",
        "--model",
        &fixture("qwen3"),
        "--speculative",
        "2",
    ]));
    assert!(err.contains("MTP head"), "{err}");
}

#[test]
fn bench_compares_every_drafter_of_the_testbed() {
    // The testbed carries both drafters: one table, the DFlash rows after the MTP ones, all lossless.
    let model = repo().join("models/testbed").display().to_string();
    let o = run(&[
        "bench",
        "--model",
        &model,
        "--threads-list",
        "1",
        "--runs",
        "1",
        "--prompt-tokens",
        "8",
        "--gen-tokens",
        "10",
        "--speculative",
        "2,auto",
    ]);
    let out = expect_success(&o);
    for label in ["mtp 2", "mtp auto", "dflash 2", "dflash auto"] {
        let row = out
            .lines()
            .find(|l| l.trim_start().starts_with(label))
            .unwrap_or_else(|| panic!("no {label} row: {out}"));
        assert!(row.trim_end().ends_with("yes"), "{row}");
    }
    let only = expect_success(&run(&[
        "bench",
        "--model",
        &model,
        "--threads-list",
        "1",
        "--runs",
        "1",
        "--prompt-tokens",
        "8",
        "--gen-tokens",
        "6",
        "--speculative",
        "3",
        "--drafter",
        "dflash",
    ]));
    assert!(
        only.contains("dflash 3") && !only.contains("mtp 3"),
        "{only}"
    );
    // A synth shape with a random DFlash drafter (never accepted: it measures a round's cost), on a dense
    // and a hybrid target: still lossless.
    for shape in ["tiny-dense", "tiny-hybrid"] {
        let out = expect_success(&run(&[
            "bench",
            "--shape",
            shape,
            "--dflash",
            "--threads-list",
            "1",
            "--runs",
            "1",
            "--prompt-tokens",
            "8",
            "--gen-tokens",
            "8",
            "--speculative",
            "3",
            "--drafter",
            "dflash",
        ]));
        let row = out
            .lines()
            .find(|l| l.trim_start().starts_with("dflash 3"))
            .unwrap_or_else(|| panic!("{shape}: no dflash row: {out}"));
        assert!(row.trim_end().ends_with("yes"), "{shape}: {row}");
    }
    let err = expect_error(&run(&["bench", "--model", &model, "--dflash"]));
    assert!(err.contains("--shape"), "{err}");
    // A block beyond what the DFlash drafter was trained for (block_size 8: 7 proposals) is refused.
    let err = expect_error(&run(&[
        "bench",
        "--model",
        &model,
        "--speculative",
        "9",
        "--drafter",
        "dflash",
    ]));
    assert!(err.contains("dflash") && err.contains("1..=7"), "{err}");
}

#[test]
fn perplexity_scores_the_documented_windows() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("text.txt");
    let text = "The quick brown fox jumps over the lazy dog. ".repeat(12);
    std::fs::write(&file, &text).unwrap();
    let checkpoint =
        turbospark::model_io::Checkpoint::open(Path::new(&fixture("qwen3_realtok"))).unwrap();
    let n = checkpoint
        .tokenizer()
        .unwrap()
        .encode(text.as_str(), false)
        .unwrap()
        .len();
    let ctx = 32;
    let windows = (n - ctx) / ctx + 1;
    let scored = windows * (ctx - 1 - ctx / 2); // llama.cpp: rows ctx/2 ..= ctx-2
    let model = fixture("qwen3_realtok");
    let o = run(&[
        "perplexity",
        "--model",
        &model,
        "--ctx",
        "32",
        file.to_str().unwrap(),
    ]);
    let out = expect_success(&o);
    let last = out.lines().last().unwrap();
    let rest = last
        .strip_prefix("perplexity: ")
        .unwrap_or_else(|| panic!("{out}"));
    let (ppl, tokens) = rest.split_once(" over ").unwrap();
    let ppl: f64 = ppl.parse().unwrap();
    assert!(ppl.is_finite() && ppl > 1.0, "{ppl}");
    assert_eq!(tokens, format!("{scored} tokens"));
    assert_eq!(out.lines().filter(|l| l.starts_with('[')).count(), windows);
}

#[test]
fn chat_reuses_the_previous_turns() {
    let model = fixture("qwen3_realtok");
    let o = run_with(
        &[
            "chat",
            "--model",
            &model,
            "--max-tokens",
            "4",
            "--speculative",
            "off",
            "--stats",
        ],
        Some("Hello there\nAnd again\n/reset\nFresh start\n"),
        &[],
    );
    expect_success(&o);
    let reused: Vec<usize> = stderr(&o)
        .lines()
        .filter_map(|l| l.split_once("(reused ").map(|(_, r)| r))
        .map(|r| r.split(')').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(reused.len(), 3, "{}", stderr(&o));
    assert_eq!(reused[0], 0);
    assert!(reused[1] > 0, "second turn reused nothing: {reused:?}");
    assert_eq!(reused[2], 0, "/reset must start from an empty state");
}

#[test]
fn synth_then_info() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("tiny");
    let out_dir = out_dir.to_str().unwrap();
    expect_success(&run(&[
        "synth",
        "--shape",
        "tiny-hybrid",
        "--out",
        out_dir,
        "--seed",
        "3",
    ]));
    let info = expect_success(&run(&["info", out_dir]));
    assert!(info_field(&info, "family").starts_with("Qwen3.5"), "{info}");
    assert_eq!(info_field(&info, "weights dtype"), "bf16");
    assert!(info_field(&info, "MTP head").starts_with("yes"), "{info}");
    let err = expect_error(&run(&["synth", "--shape", "nope", "--out", out_dir]));
    assert!(
        err.contains("tiny-hybrid"),
        "known shapes are listed: {err}"
    );
}

#[test]
fn chat_flag_renders_the_qwen3_template() {
    let model = fixture("qwen3_realtok");
    let common = [
        "generate",
        "--model",
        &model,
        "--max-tokens",
        "6",
        "--speculative",
        "off",
    ];
    let with_template = |extra: &[&str]| {
        let mut args = common.to_vec();
        args.extend_from_slice(extra);
        expect_success(&run(&args))
    };
    // Qwen3's format, written by hand from its template (fixtures/chat/qwen3_rendered*.txt).
    let rendered = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(
        with_template(&["--chat", "--system", "Be brief.", "Name a colour."]),
        with_template(&[rendered])
    );
    let no_think = format!("{rendered}<think>\n\n</think>\n\n");
    assert_eq!(
        with_template(&[
            "--chat",
            "--no-think",
            "--system",
            "Be brief.",
            "Name a colour."
        ]),
        with_template(&[&no_think])
    );
    // The same checkpoint without tokenizer_config.json (so without a template) refuses --chat.
    let dir = tempfile::tempdir().unwrap();
    for file in [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
    ] {
        std::fs::copy(
            testdata::fixture("qwen3_realtok").join(file),
            dir.path().join(file),
        )
        .unwrap();
    }
    let bare = dir.path().to_str().unwrap();
    expect_success(&run(&[
        "generate",
        "--model",
        bare,
        "--max-tokens",
        "2",
        "hi",
    ]));
    let err = expect_error(&run(&["generate", "--model", bare, "--chat", "hi"]));
    assert!(
        err.contains("--chat") && err.contains("chat template"),
        "{err}"
    );
    let err = expect_error(&run_with(&["chat", "--model", bare], Some("hi\n"), &[]));
    assert!(err.contains("chat template"), "{err}");
}

/// Sends SIGINT to a running child.
fn interrupt(child: &std::process::Child) {
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
fn ctrl_c_cancels_the_reply_not_the_chat_and_twice_at_the_prompt_exits() {
    use std::io::{BufRead, BufReader, Read};
    use std::sync::mpsc;
    let model = fixture("qwen3_realtok");
    let mut child = Command::new(env!("CARGO_BIN_EXE_turbospark"))
        .args([
            "chat",
            "--model",
            &model,
            "--max-tokens",
            "30000",
            "--speculative",
            "off",
            "--stats",
        ])
        .env_remove("TURBOSPARK_MODEL")
        .env_remove("TURBOSPARK_EMBEDDED_MODEL")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let (tx, rx) = mpsc::channel::<String>();
    let err_tx = tx.clone();
    let stderr_pipe = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr_pipe).lines() {
            let _ = err_tx.send(format!("stderr: {}", line.unwrap_or_default()));
        }
    });
    let mut stdout_pipe = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        let mut buf = [0u8; 256];
        while let Ok(n) = stdout_pipe.read(&mut buf) {
            if n == 0 {
                break;
            }
            let _ = tx.send("stdout".to_string());
        }
    });
    let wait_for = |what: &str| loop {
        // A guard against hanging forever, not a timing assertion.
        let msg = rx
            .recv_timeout(std::time::Duration::from_secs(600))
            .expect("the chat ended early or stopped responding");
        if msg.contains(what) {
            return msg;
        }
    };
    // A 30000-token reply is streaming: interrupt it once.
    stdin.write_all(b"Tell me a long story\n").unwrap();
    wait_for("stdout");
    interrupt(&child);
    wait_for("[reply cancelled]");
    let stats = wait_for("stats");
    assert!(stats.contains("cancelled"), "{stats}");
    // The chat is back at its prompt (the stats line follows the reply's end): the first Ctrl-C
    // there only hints, the second exits with 130.
    interrupt(&child);
    wait_for("Ctrl-C again");
    interrupt(&child);
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
}

/// A copy of `fixtures/qwen3_5` (MTP head, vocab 512, no tokenizer of its own) with a word-level
/// tokenizer whose token `i` is the word `w{i}`, so text prompts map to known ids.
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

fn reference_ids(name: &str, key: &str) -> Vec<u32> {
    let path = testdata::fixture(name).join("reference.json");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    json[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

fn words(ids: &[u32]) -> String {
    ids.iter()
        .map(|i| format!("w{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn speculative_generate_matches_transformers_greedy_and_reports_acceptance() {
    let dir = qwen3_5_with_words();
    let model = dir.path().to_str().unwrap();
    let prompt = words(&reference_ids("qwen3_5", "prompt_ids"));
    let expected = words(&reference_ids("qwen3_5", "greedy_ids")[..16]);
    for speculative in ["off", "1", "2", "4"] {
        let o = run(&[
            "generate",
            "--model",
            model,
            "--max-tokens",
            "16",
            "--speculative",
            speculative,
            "--stats",
            &prompt,
        ]);
        let out = expect_success(&o);
        assert_eq!(out.trim(), expected, "--speculative {speculative}");
        let err = stderr(&o);
        if speculative == "off" {
            assert!(
                err.contains("stats (sequential)") && !err.contains("speculative:"),
                "{err}"
            );
        } else {
            assert!(
                err.contains(&format!("stats (mtp, block {speculative})")),
                "{err}"
            );
            assert!(err.contains("speculative: rounds="), "{err}");
            assert!(err.contains("accepted/reached per position: 1: "), "{err}");
        }
    }
    // Beyond the MTP head's range: refused, naming the range.
    let err = expect_error(&run(&[
        "generate",
        "--model",
        model,
        "--speculative",
        "99",
        "w1",
    ]));
    assert!(
        err.contains("--speculative 99") && err.contains("1..="),
        "{err}"
    );
}
