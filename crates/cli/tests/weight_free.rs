//! The weight-free drafters, `--drafter ngram` (prompt lookup) and `--drafter suffix`, end to end
//! through the `turbospark` binary: each serves a checkpoint without drafter weights, writes what
//! sequential decoding writes, copies a prompt that repeats itself on the embedded testbed (its
//! proposals are accepted), has rows in `bench`, and refuses a block beyond its range naming it;
//! `auto` on such a checkpoint is the suffix drafter; `--ngram-min/--ngram-max` change what prompt
//! lookup matches, and options out of range are errors naming the flag.

use std::path::Path;
use std::process::{Command, Output};

fn testbed() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/testbed")
        .display()
        .to_string()
}

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_turbospark"))
        .args(args)
        .env_remove("TURBOSPARK_MODEL")
        .env_remove("TURBOSPARK_EMBEDDED_MODEL")
        .output()
        .expect("spawn turbospark")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn expect_success(o: &Output) -> String {
    assert!(o.status.success(), "exit {:?}: {}", o.status, stderr(o));
    String::from_utf8(o.stdout.clone()).unwrap()
}

/// `accepted/round=X` of a `--stats` speculative line.
fn accepted_per_round(err: &str) -> f64 {
    err.split_whitespace()
        .find_map(|w| w.strip_prefix("accepted/round="))
        .unwrap_or_else(|| panic!("no accepted/round in {err}"))
        .parse()
        .unwrap()
}

fn generate_equals_sequential_on_a_checkpoint_without_drafters(drafter: &str) {
    let model = testdata::fixture("qwen3_realtok").display().to_string();
    let prompt = "one two three one two three one two";
    let generate = |speculative: &str| {
        run(&[
            "generate",
            "--model",
            &model,
            "--max-tokens",
            "24",
            "--speculative",
            speculative,
            "--drafter",
            drafter,
            "--stats",
            prompt,
        ])
    };
    let sequential = expect_success(&generate("off"));
    for speculative in ["1", "3", "16", "auto"] {
        let o = generate(speculative);
        assert_eq!(
            expect_success(&o),
            sequential,
            "{drafter} --speculative {speculative}"
        );
        let err = stderr(&o);
        // A named drafter is used as named, with no warning that speculation is off.
        assert!(err.contains(&format!("stats ({drafter}, block ")), "{err}");
        assert!(!err.contains("warning:"), "{err}");
    }
    let o = run(&[
        "generate",
        "--model",
        &model,
        "--speculative",
        "17",
        "--drafter",
        drafter,
        "hi",
    ]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("--speculative 17") && err.contains(drafter) && err.contains("1..=16"),
        "{err}"
    );
}

#[test]
fn ngram_generate_equals_sequential_on_a_checkpoint_without_drafters() {
    generate_equals_sequential_on_a_checkpoint_without_drafters("ngram");
}

#[test]
fn suffix_generate_equals_sequential_on_a_checkpoint_without_drafters() {
    generate_equals_sequential_on_a_checkpoint_without_drafters("suffix");
}

/// With no drafter flag, a checkpoint without drafter weights speculates with the suffix drafter
/// (`auto`), and writes what sequential decoding writes.
#[test]
fn auto_is_the_suffix_drafter_on_a_checkpoint_without_drafter_weights() {
    let model = testdata::fixture("qwen3_realtok").display().to_string();
    let prompt = "one two three one two three one two";
    let generate = |flags: &[&str]| {
        let mut args = vec![
            "generate",
            "--model",
            &model,
            "--max-tokens",
            "24",
            "--stats",
        ];
        args.extend_from_slice(flags);
        args.push(prompt);
        run(&args)
    };
    let sequential = expect_success(&generate(&["--speculative", "off"]));
    let o = generate(&[]);
    assert_eq!(expect_success(&o), sequential);
    let err = stderr(&o);
    assert!(err.contains("stats (suffix, block 8 (auto"), "{err}");
    assert!(!err.contains("warning:"), "{err}");
}

/// `--ngram-min/--ngram-max` reach the drafter: n-grams of 16 tokens never match a history of at most
/// 20, so nothing is proposed where the default sizes copy; the text stays the sequential one.
#[test]
fn ngram_sizes_change_what_prompt_lookup_matches() {
    let model = testdata::fixture("qwen3_realtok").display().to_string();
    let generate = |sizes: &[&str]| {
        let mut args = vec![
            "generate",
            "--model",
            &model,
            "--max-tokens",
            "12",
            "--speculative",
            "3",
            "--drafter",
            "ngram",
            "--stats",
        ];
        args.extend_from_slice(sizes);
        args.push("one two three one two three one two");
        let o = run(&args);
        (expect_success(&o), accepted_per_round(&stderr(&o)))
    };
    let (default_text, default_accepted) = generate(&[]);
    let (text, accepted) = generate(&["--ngram-min", "16", "--ngram-max", "16"]);
    assert_eq!(text, default_text);
    assert!(
        default_accepted > 0.0 && accepted == 0.0,
        "default sizes {default_accepted}, 16..=16 {accepted} accepted a round"
    );
}

#[test]
fn drafter_options_out_of_range_are_errors_naming_the_flag() {
    let cases: [(&[&str], &str); 5] = [
        (&["--ngram-min", "0"], "--ngram-min"),
        (&["--ngram-max", "65"], "--ngram-max"),
        (&["--ngram-min", "5", "--ngram-max", "4"], "--ngram-min"),
        (&["--suffix-memory", "10"], "--suffix-memory"),
        (&["--suffix-memory", "lots"], "--suffix-memory"),
    ];
    for command in ["generate", "bench"] {
        for (flags, named) in cases {
            let mut args = vec![command, "--model", "/nonexistent", "--drafter", "suffix"];
            args.extend_from_slice(flags);
            if command == "generate" {
                args.push("hi");
            }
            let o = run(&args);
            assert!(!o.status.success(), "{args:?}");
            let err = stderr(&o);
            assert!(err.contains(named), "{args:?}: {err}");
        }
    }
}

#[test]
fn ngram_copies_a_repeated_prompt_on_the_testbed() {
    copies_a_repeated_prompt_on_the_testbed("ngram");
}

#[test]
fn suffix_copies_a_repeated_prompt_on_the_testbed() {
    copies_a_repeated_prompt_on_the_testbed("suffix");
}

fn copies_a_repeated_prompt_on_the_testbed(drafter: &str) {
    let model = testbed();
    let prompt = "def add(a, b):\n    return a + b\n\ndef mul(a, b):\n    return a * b\n\n\
                  def add(a, b):\n    return a + b\n\ndef mul(a, b):\n";
    let generate = |speculative: &str| {
        run(&[
            "generate",
            "--model",
            &model,
            "--threads",
            "2",
            "--max-tokens",
            "32",
            "--speculative",
            speculative,
            "--drafter",
            drafter,
            "--stats",
            prompt,
        ])
    };
    let sequential = expect_success(&generate("off"));
    let o = generate("4");
    assert_eq!(expect_success(&o), sequential);
    let err = stderr(&o);
    assert!(
        err.contains(&format!("stats ({drafter}, block 4)")),
        "{err}"
    );
    let accepted = accepted_per_round(&err);
    assert!(accepted > 1.0, "the copy was not accepted: {err}");
}

#[test]
fn bench_has_weight_free_rows_on_a_checkpoint_without_drafters() {
    let model = testdata::fixture("qwen3").display().to_string();
    for drafter in ["ngram", "suffix"] {
        let out = expect_success(&run(&[
            "bench",
            "--model",
            &model,
            "--threads-list",
            "1",
            "--runs",
            "2",
            "--prompt-tokens",
            "8",
            "--gen-tokens",
            "12",
            "--speculative",
            "2,auto",
            "--drafter",
            drafter,
        ]));
        for label in ["2", "auto"] {
            let label = format!("{drafter} {label}");
            let row = out
                .lines()
                .find(|l| l.trim_start().starts_with(&label))
                .unwrap_or_else(|| panic!("no {label} row: {out}"));
            assert!(row.trim_end().ends_with("yes"), "{row}");
        }
    }
    // Not named: `auto` on a checkpoint without drafter weights is the suffix drafter.
    let out = expect_success(&run(&[
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
        "4",
    ]));
    assert!(
        out.contains("speculative (") && out.contains("suffix 4"),
        "{out}"
    );
    assert!(!out.contains("ngram"), "{out}");
}

/// `bench --workload` runs the comparison once per shipped prompt, on the testbed's tokenizer, and each
/// weight-free drafter copies the copy-edit file (more than one token accepted a round at block 4).
#[test]
fn bench_runs_each_named_workload() {
    for drafter in ["ngram", "suffix"] {
        bench_runs_each_named_workload_with(drafter);
    }
}

fn bench_runs_each_named_workload_with(drafter: &str) {
    let out = expect_success(&run(&[
        "bench",
        "--threads-list",
        "1",
        "--runs",
        "1",
        "--prompt-tokens",
        "8",
        "--gen-tokens",
        "64",
        "--speculative",
        "4",
        "--drafter",
        drafter,
        "--workload",
        "copy-edit,free",
    ]));
    let copy = out
        .find("workload copy-edit:")
        .unwrap_or_else(|| panic!("{out}"));
    let free = out
        .find("workload free:")
        .unwrap_or_else(|| panic!("{out}"));
    assert!(copy < free, "{out}");
    let row = out[copy..free]
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{drafter} 4")))
        .unwrap_or_else(|| panic!("no {drafter} 4 row: {out}"));
    let accepted: f64 = row.split('|').nth(3).unwrap().trim().parse().unwrap();
    assert!(accepted > 1.0, "{row}");
    assert!(row.trim_end().ends_with("yes"), "{row}");
}
