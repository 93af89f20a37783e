//! A C program compiled against `include/turbospark.h` and linked with libturbospark.so
//! (tests/c/smoke.c) streams the runtime's greedy output, reports a bad option by name and fills the
//! result: the header, the library and the C caller agree.

use std::path::{Path, PathBuf};
use std::process::Command;

use ts::{Device, GenerationConfig, Speculation};

const PROMPT: &str = "def fibonacci(n):";

fn testbed() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/testbed")
}

/// The sequential greedy continuation through the Rust front door.
fn reference(prompt_text: &str, max: usize) -> ts::GenerationResult {
    let model = ts::Model::builder(testbed())
        .device(Device::Cpu)
        .speculation(Speculation::Off)
        .build()
        .unwrap();
    let mut session = model.session().unwrap();
    session
        .generate(prompt_text, &GenerationConfig::greedy(max), |_| {})
        .unwrap()
}

/// The directory holding libturbospark.so, built by cargo for this test's profile: the library is a
/// cdylib only (the Rust crate named `turbospark` is the front door), which cargo does not build for a
/// package's tests, so the test asks for it (everything else is already built: it takes a link).
fn library_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
    let profile = profile_dir
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    let cargo_profile = if profile == "debug" { "dev" } else { &profile };
    let built = Command::new(env!("CARGO"))
        .args(["build", "-p", "capi", "--lib", "--profile", cargo_profile])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo (the CARGO of this test) runs");
    assert!(
        built.status.success(),
        "cargo build -p capi: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    assert!(
        profile_dir.join("libturbospark.so").is_file(),
        "libturbospark.so not found in {}",
        profile_dir.display()
    );
    profile_dir
}

#[test]
fn a_c_program_builds_against_the_header_and_runs() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = library_dir();
    let out = tempfile_dir().join("smoke");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let built = Command::new(&cc)
        .args(["-std=c99", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(crate_dir.join("include"))
        .arg(crate_dir.join("tests/c/smoke.c"))
        .arg("-L")
        .arg(&lib)
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .args(["-lturbospark", "-o"])
        .arg(&out)
        .output()
        .expect("a C compiler (cc)");
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let ran = Command::new(&out)
        .arg(testbed())
        .arg(PROMPT)
        .output()
        .unwrap();
    let stdout = String::from_utf8(ran.stdout).unwrap();
    assert!(
        ran.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&ran.stderr)
    );
    let want = reference(PROMPT, 24);
    let (head, result) = stdout.split_once("\n--result--\n").unwrap();
    let (bad_option, streamed) = head.split_once('\n').unwrap();
    assert!(bad_option.contains("colour"), "{bad_option}");
    assert_eq!(streamed, want.text);
    let expected = format!("{}\nlength\n24\n{}\n", want.text, want.prompt_tokens);
    assert!(result.starts_with(&expected), "{result:?} vs {expected:?}");
    assert!(result.contains("temperature"), "{result}");
}

fn tempfile_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("turbospark-capi-c-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
