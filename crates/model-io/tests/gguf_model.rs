//! GGUF models against the Hugging Face checkpoints llama.cpp's convert_hf_to_gguf.py made them from:
//! every tensor (after undoing the converter's changes), the config, and the tokenizer's ids on a
//! varied corpus. The qwen3_5 GGUF is committed (fixtures/gguf/qwen3_5.gguf.zst); the others are
//! converted at test time where the converter is installed (`testdata::gguf_tools`).

use std::path::{Path, PathBuf};

use model_io::Checkpoint;
use testdata::gguf_tools::converted;

/// Every tensor of `hf` must be in `gguf` with the same shape and bits, except where the converter's
/// change is lossy: zero-centred norm weights are stored as `s = fl(1 + w)`, and `s - 1` is within
/// 2^-24 of `w` (the family adds the 1 back, getting `s` exactly); `A_log` is stored as
/// `A = -exp(A_log)` and read back as `ln(-A)`, within 1e-6 relative.
fn assert_same_tensors(hf: &Checkpoint, gguf: &Checkpoint) {
    let mut names: Vec<&str> = hf.tensors.names().collect();
    names.sort();
    for name in names {
        let shape = hf.tensors.shape(name).unwrap().to_vec();
        let want = hf.tensors.load_f32(name, &shape).unwrap();
        let got = gguf
            .tensors
            .load_f32(name, &shape)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let zero_centred_norm = hf.config.family.zero_centred_norms()
            && name.contains("norm")
            && !name.contains("linear_attn");
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            let ok = if name.ends_with("A_log") {
                (a - b).abs() <= 1e-6 * b.abs().max(1.0)
            } else if zero_centred_norm {
                (a - b).abs() <= 6e-8
            } else {
                a.to_bits() == b.to_bits()
            };
            assert!(ok, "{name}[{i}]: gguf {a} vs hf {b}");
        }
    }
}

fn assert_same_config(hf: &Checkpoint, gguf: &Checkpoint) {
    let (a, b) = (&hf.config, &gguf.config);
    assert_eq!(a.architecture, b.architecture);
    assert_eq!(a.family, b.family);
    assert_eq!(
        (
            a.vocab_size,
            a.hidden_size,
            a.intermediate_size,
            a.num_hidden_layers
        ),
        (
            b.vocab_size,
            b.hidden_size,
            b.intermediate_size,
            b.num_hidden_layers
        )
    );
    assert_eq!(
        (a.num_attention_heads, a.num_key_value_heads, a.head_dim),
        (b.num_attention_heads, b.num_key_value_heads, b.head_dim)
    );
    assert_eq!(
        (a.rms_norm_eps, a.rope_theta),
        (b.rms_norm_eps, b.rope_theta)
    );
    assert_eq!(a.partial_rotary_factor, b.partial_rotary_factor);
    assert_eq!(a.max_position_embeddings, b.max_position_embeddings);
    assert_eq!(a.tie_word_embeddings, b.tie_word_embeddings);
    assert_eq!(a.attn_output_gate, b.attn_output_gate);
    assert_eq!(a.layer_types, b.layer_types);
    assert_eq!(a.linear, b.linear);
    assert_eq!(a.moe, b.moe);
    assert_eq!(a.mtp_num_hidden_layers, b.mtp_num_hidden_layers);
    assert_eq!(hf.has_mtp, gguf.has_mtp);
}

#[test]
fn qwen3_5_fixture_gguf_equals_the_checkpoint_it_was_made_from() {
    let hf = Checkpoint::open(&testdata::fixture("qwen3_5")).unwrap();
    let gguf = Checkpoint::open(&testdata::fixture("gguf/qwen3_5.gguf")).unwrap();
    assert_same_config(&hf, &gguf);
    assert!(gguf.has_mtp, "the nextn block maps to mtp.*");
    assert_same_tensors(&hf, &gguf);
    // The fixture was converted without a vocabulary: asking for the tokenizer names the file.
    let err = gguf.tokenizer().unwrap_err().to_string();
    assert!(
        err.contains("qwen3_5.gguf") && err.contains("tokenizer"),
        "{err}"
    );
}

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel)
}

/// The tokenizer test corpus (fixtures/tokenizers/qwen3/cases.json) plus code and markup.
fn corpus() -> Vec<String> {
    let cases = std::fs::read_to_string(testdata::fixture("tokenizers/qwen3/cases.json")).unwrap();
    let cases: serde_json::Value = serde_json::from_str(&cases).unwrap();
    let mut texts: Vec<String> = cases["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["text"].as_str().unwrap().to_string())
        .collect();
    texts.push(std::fs::read_to_string(repo("crates/model-io/src/gguf/reader.rs")).unwrap());
    texts.push(std::fs::read_to_string(repo("README.md")).unwrap());
    texts.push("fn main() {\n\tprintln!(\"{}\", 0x1F_u8 as char);\r\n}\n\n\n   \u{a0}x".into());
    texts
}

/// `dir` converted at test time (`args` to the converter), opened beside the checkpoint.
fn converted_pair(dir: &Path, name: &str, args: &[&str]) -> (Checkpoint, Checkpoint) {
    let path = converted(dir, name, args);
    let hf = Checkpoint::open(dir).unwrap();
    let gguf = Checkpoint::open(&path).unwrap();
    assert_same_config(&hf, &gguf);
    (hf, gguf)
}

fn assert_same_tokenizer(hf: &Checkpoint, gguf: &Checkpoint) {
    let a = hf.tokenizer().unwrap();
    let b = gguf.tokenizer().unwrap();
    for text in corpus() {
        for special in [false, true] {
            let x = a.encode(text.as_str(), special).unwrap();
            let y = b.encode(text.as_str(), special).unwrap();
            assert_eq!(x.get_ids(), y.get_ids(), "ids differ on {text:?}");
        }
        let ids = a.encode(text.as_str(), false).unwrap().get_ids().to_vec();
        assert_eq!(
            a.decode(&ids, false).unwrap(),
            b.decode(&ids, false).unwrap()
        );
    }
    let sorted = |mut v: Vec<u32>| {
        v.sort();
        v
    };
    assert_eq!(sorted(hf.eos_token_ids()), sorted(gguf.eos_token_ids()));
}

#[test]
#[ignore = "needs llama.cpp's converter: set TURBOSPARK_LLAMA_CPP and TURBOSPARK_GGUF_PYTHON (tools/fixtures/README.md)"]
fn testbed_gguf_equals_the_testbed() {
    let (hf, gguf) = converted_pair(
        &repo("models/testbed"),
        "testbed-f32.gguf",
        &["--outtype", "f32"],
    );
    assert_same_tensors(&hf, &gguf);
    assert_same_tokenizer(&hf, &gguf);
    assert_eq!(hf.chat_template, gguf.chat_template);
}

#[test]
#[ignore = "needs llama.cpp's converter: set TURBOSPARK_LLAMA_CPP and TURBOSPARK_GGUF_PYTHON (tools/fixtures/README.md)"]
fn real_qwen3_vocabulary_from_gguf_gives_the_same_ids() {
    let dir = testdata::fixture("qwen3_realtok");
    let (hf, gguf) = converted_pair(&dir, "qwen3_realtok-f32.gguf", &["--outtype", "f32"]);
    assert_same_tensors(&hf, &gguf);
    assert_same_tokenizer(&hf, &gguf);
    assert_eq!(hf.chat_template, gguf.chat_template);
}

#[test]
#[ignore = "needs llama.cpp's converter: set TURBOSPARK_LLAMA_CPP and TURBOSPARK_GGUF_PYTHON (tools/fixtures/README.md)"]
fn qwen3_fixture_gguf_equals_the_checkpoint() {
    let dir = testdata::fixture("qwen3");
    let (hf, gguf) = converted_pair(&dir, "qwen3-f32.gguf", &["--outtype", "f32", "--no-vocab"]);
    assert_same_tensors(&hf, &gguf);
}

#[test]
#[ignore = "needs llama.cpp's converter: set TURBOSPARK_LLAMA_CPP and TURBOSPARK_GGUF_PYTHON (tools/fixtures/README.md)"]
fn q8_0_testbed_dequantizes_within_one_quantization_step() {
    let (hf, gguf) = converted_pair(
        &repo("models/testbed"),
        "testbed-q8_0.gguf",
        &["--outtype", "q8_0"],
    );
    let mut quantized = 0;
    for name in hf.tensors.names() {
        let shape = hf.tensors.shape(name).unwrap().to_vec();
        let want = hf.tensors.load_f32(name, &shape).unwrap();
        let got = gguf.tensors.load_f32(name, &shape).unwrap();
        if gguf.tensors.stored_dtype_name(name).unwrap() != "Q8_0" {
            continue;
        }
        quantized += 1;
        // Q8_0 rounds each block of 32 to d * round(x / d), d = max|x| / 127 stored as f16. Blocks
        // run along rows in GGUF order (for `out_proj`, columns reordered), so bound each element by
        // its whole row's largest step: half a step plus the f16 rounding of d (2^-11) times 127.
        let row_len = *shape.last().unwrap();
        for (row_want, row_got) in want.chunks(row_len).zip(got.chunks(row_len)) {
            let step = row_want.iter().fold(0f32, |m, x| m.max(x.abs())) / 127.0;
            for (a, b) in row_got.iter().zip(row_want) {
                assert!(
                    (a - b).abs() <= 0.57 * step,
                    "{name}: {a} vs {b} (step {step})"
                );
            }
        }
    }
    assert!(quantized > 10, "only {quantized} tensors were Q8_0");
}

#[test]
#[ignore = "needs llama.cpp's converter: set TURBOSPARK_LLAMA_CPP and TURBOSPARK_GGUF_PYTHON (tools/fixtures/README.md)"]
fn qwen35_moe_gguf_equals_the_checkpoint() {
    let dir = testdata::gguf_tools::tiny_qwen35_moe();
    let (hf, gguf) = converted_pair(
        &dir,
        "qwen35moe-f32.gguf",
        &["--outtype", "f32", "--no-vocab", "--no-mtp"],
    );
    assert!(gguf.config.moe.is_some());
    assert_same_tensors(&hf, &gguf);
}

/// `qwen3moe`: every expert of every layer back under its per-expert name, bit for bit (the bf16
/// checkpoint widened to f32 by the converter and by us alike), and the MoE config as the checkpoint's
/// (which, like the released models, renormalises its top-k: the GGUF does not record it).
#[test]
#[ignore = "needs llama.cpp's converter: set TURBOSPARK_LLAMA_CPP and TURBOSPARK_GGUF_PYTHON (tools/fixtures/README.md)"]
fn qwen3_moe_gguf_equals_the_checkpoint() {
    let dir = testdata::fixture("qwen3_moe");
    let args = ["--outtype", "f32", "--no-vocab"];
    let (hf, gguf) = converted_pair(&dir, "qwen3_moe-f32.gguf", &args);
    assert_eq!(gguf.config.family, model_io::Family::Qwen3Moe);
    assert!(gguf.config.moe.as_ref().is_some_and(|m| m.norm_topk_prob));
    assert_eq!(
        gguf.tensors.names().count(),
        hf.tensors.names().count(),
        "the same tensors, no more"
    );
    assert_same_tensors(&hf, &gguf);
}

#[test]
#[ignore = "needs llama.cpp's converter: set TURBOSPARK_LLAMA_CPP and TURBOSPARK_GGUF_PYTHON (tools/fixtures/README.md)"]
fn qwen3_next_gguf_equals_the_checkpoint() {
    let dir = testdata::fixture("qwen3_next");
    let args = ["--outtype", "f32", "--no-vocab"];
    let (hf, gguf) = converted_pair(&dir, "qwen3_next-f32.gguf", &args);
    assert!(gguf.has_mtp);
    assert_same_tensors_split_fused(&hf, &gguf);
}

/// Qwen3-Next checkpoints store the GDN projections fused and head-grouped (`in_proj_qkvz`,
/// `in_proj_ba`); the GGUF holds them split as Qwen3.5 names them. Compare through the family's own
/// regrouping: the split tensors must equal the fused ones row for row.
fn assert_same_tensors_split_fused(hf: &Checkpoint, gguf: &Checkpoint) {
    let l = hf.config.linear.clone().unwrap();
    let (hk, hv, dk, dv) = (
        l.num_key_heads,
        l.num_value_heads,
        l.key_head_dim,
        l.value_head_dim,
    );
    let r = hv / hk;
    let h = hf.config.hidden_size;
    let load = |ck: &Checkpoint, name: &str| {
        let shape = ck.tensors.shape(name).unwrap().to_vec();
        ck.tensors.load_f32(name, &shape).unwrap()
    };
    for name in hf.tensors.names() {
        if let Some(prefix) = name.strip_suffix("in_proj_qkvz.weight") {
            let qkvz = load(hf, name);
            let qkv = load(gguf, &format!("{prefix}in_proj_qkv.weight"));
            let z = load(gguf, &format!("{prefix}in_proj_z.weight"));
            let group = 2 * dk + 2 * r * dv;
            for g in 0..hk {
                let row = |i: usize| &qkvz[(g * group + i) * h..(g * group + i + 1) * h];
                for i in 0..dk {
                    assert_eq!(row(i), &qkv[(g * dk + i) * h..][..h], "{name} q");
                    assert_eq!(
                        row(dk + i),
                        &qkv[((hk + g) * dk + i) * h..][..h],
                        "{name} k"
                    );
                }
                for i in 0..r * dv {
                    let v_row = 2 * hk * dk + g * r * dv + i;
                    assert_eq!(row(2 * dk + i), &qkv[v_row * h..][..h], "{name} v");
                    assert_eq!(
                        row(2 * dk + r * dv + i),
                        &z[(g * r * dv + i) * h..][..h],
                        "{name} z"
                    );
                }
            }
        } else if let Some(prefix) = name.strip_suffix("in_proj_ba.weight") {
            let ba = load(hf, name);
            let b = load(gguf, &format!("{prefix}in_proj_b.weight"));
            let a = load(gguf, &format!("{prefix}in_proj_a.weight"));
            for g in 0..hk {
                for i in 0..r {
                    assert_eq!(&ba[(g * 2 * r + i) * h..][..h], &b[(g * r + i) * h..][..h]);
                    assert_eq!(
                        &ba[(g * 2 * r + r + i) * h..][..h],
                        &a[(g * r + i) * h..][..h]
                    );
                }
            }
        }
    }
    // Everything else is compared as for the other families.
    let mut names: Vec<&str> = hf
        .tensors
        .names()
        .filter(|n| !n.contains("in_proj_"))
        .collect();
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
            6e-8
        } else {
            0.0
        };
        for (a, b) in got.iter().zip(&want) {
            assert!(
                (a - b).abs() <= tol * b.abs().max(1.0),
                "{name}: {a} vs {b}"
            );
        }
    }
}

/// The testbed as llama.cpp's quantizer writes Q4_K_M (Q4_K / Q6_K where rows allow, Q5_0 / Q8_0 /
/// F32 fallbacks for 384-wide rows): every tensor dequantizes bit for bit as the `gguf` package does,
/// and the dequantized model stays close to the checkpoint (relative RMS error per tensor, which a
/// wrong layout or reordering would push to ~1.4).
#[test]
#[ignore = "needs llama.cpp's converter and llama-quantize: set TURBOSPARK_LLAMA_CPP, TURBOSPARK_GGUF_PYTHON, TURBOSPARK_LLAMA_QUANTIZE (tools/fixtures/README.md)"]
fn q4_k_m_testbed_dequantizes_as_gguf_py_does() {
    use model_io::gguf::GgufSet;
    let dir = repo("models/testbed");
    let f32_path = converted(&dir, "testbed-f32.gguf", &["--outtype", "f32"]);
    let path = testdata::gguf_tools::quantized(&f32_path, "testbed-q4_k_m.gguf", "Q4_K_M");
    let set = GgufSet::open(&path).unwrap();
    let mut types = std::collections::BTreeSet::new();
    for (name, want) in testdata::gguf_tools::gguf_py_dequantized(&path) {
        let got = set.load_f32(&name).unwrap();
        assert_eq!(got.len(), want.len(), "{name}");
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "{name}[{i}]: {a} vs {b}");
        }
        types.insert(set.tensor(&name).unwrap().1.ggml_type.name());
    }
    assert!(
        types.contains("Q4_K") && types.contains("Q6_K"),
        "{types:?}"
    );
    let hf = Checkpoint::open(&dir).unwrap();
    let gguf = Checkpoint::open(&path).unwrap();
    assert_same_config(&hf, &gguf);
    for name in hf.tensors.names() {
        let shape = hf.tensors.shape(name).unwrap().to_vec();
        let want = hf.tensors.load_f32(name, &shape).unwrap();
        let got = gguf.tensors.load_f32(name, &shape).unwrap();
        let err: f64 = got
            .iter()
            .zip(&want)
            .map(|(a, b)| f64::from(a - b).powi(2))
            .sum();
        let norm: f64 = want.iter().map(|b| f64::from(*b).powi(2)).sum();
        let rel = (err / norm.max(1e-30)).sqrt();
        assert!(rel < 0.2, "{name}: relative RMS error {rel:.3}");
    }
}
