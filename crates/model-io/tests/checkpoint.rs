//! Checkpoint directories: generation defaults, EOS union, chat template lookup, drafter detection,
//! tensor-prefix detection, and the tokenizer (a hand-built Qwen-style byte-level BPE).

mod common;

use common::{checkpoint_dir, f32_tensor, message_naming, qwen3_config, write};
use model_io::{Checkpoint, LoadError};
use serde_json::json;

fn minimal() -> tempfile::TempDir {
    checkpoint_dir(
        &qwen3_config(),
        &[f32_tensor("model.embed_tokens.weight", &[2, 3], &[0.0; 6])],
    )
}

#[test]
fn minimal_checkpoint_opens_with_defaults_for_absent_files() {
    let dir = minimal();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    assert_eq!(ckpt.config.hidden_size, 16);
    assert_eq!(ckpt.generation, Default::default());
    assert_eq!(ckpt.chat_template, None);
    assert!(!ckpt.has_mtp && !ckpt.has_dflash);
    assert_eq!(ckpt.eos_token_ids(), vec![7]);
    assert_eq!(ckpt.parameter_count(), 6);
    assert_eq!(ckpt.name("norm.weight"), "model.norm.weight");
}

#[test]
fn missing_config_json_is_named() {
    let dir = tempfile::tempdir().unwrap();
    common::write_safetensors(
        &dir.path().join("model.safetensors"),
        &[f32_tensor("a", &[1], &[0.0])],
    );
    let err = Checkpoint::open(dir.path()).unwrap_err();
    message_naming(&err, "config.json");
    assert!(matches!(err, LoadError::MissingFile { .. }), "{err}");
    let err = Checkpoint::open(&dir.path().join("no-such-dir")).unwrap_err();
    message_naming(&err, "no-such-dir");
}

#[test]
fn broken_weights_fail_the_open() {
    let dir = minimal();
    std::fs::write(
        dir.path().join("model.safetensors"),
        [8, 0, 0, 0, 0, 0, 0, 0, b'{'],
    )
    .unwrap();
    let err = Checkpoint::open(dir.path()).unwrap_err();
    message_naming(&err, "model.safetensors");
}

#[test]
fn generation_config_fields_and_eos_union() {
    let dir = minimal();
    write(
        &dir.path().join("generation_config.json"),
        r#"{"bos_token_id": 1, "pad_token_id": 0, "eos_token_id": [2, 7], "do_sample": true,
            "temperature": 0.6, "top_k": 20, "top_p": 0.95, "min_p": 0.0, "repetition_penalty": 1.05,
            "max_new_tokens": 128, "transformers_version": "5.17.0"}"#,
    );
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let g = &ckpt.generation;
    assert_eq!(
        (g.bos_token_id, g.pad_token_id, g.do_sample),
        (Some(1), Some(0), Some(true))
    );
    assert_eq!(
        (g.temperature, g.top_k, g.top_p, g.min_p),
        (Some(0.6), Some(20), Some(0.95), Some(0.0))
    );
    assert_eq!(
        (g.repetition_penalty, g.max_new_tokens),
        (Some(1.05), Some(128))
    );
    // generation_config's order first, config.json's 7 already present.
    assert_eq!(ckpt.eos_token_ids(), vec![2, 7]);

    write(
        &dir.path().join("config.json"),
        &serde_json::to_string(&{
            let mut c = qwen3_config();
            c["eos_token_id"] = json!(9);
            c
        })
        .unwrap(),
    );
    write(
        &dir.path().join("generation_config.json"),
        r#"{"eos_token_id": 2}"#,
    );
    assert_eq!(
        Checkpoint::open(dir.path()).unwrap().eos_token_ids(),
        vec![2, 9]
    );
}

#[test]
fn generation_config_field_of_wrong_type_is_named() {
    let dir = minimal();
    write(
        &dir.path().join("generation_config.json"),
        r#"{"temperature": "hot"}"#,
    );
    let err = Checkpoint::open(dir.path()).unwrap_err();
    message_naming(&err, "generation_config.json");
    assert!(
        matches!(err, LoadError::WrongType { ref field, .. } if field == "temperature"),
        "{err}"
    );
    write(
        &dir.path().join("generation_config.json"),
        r#"{"eos_token_id": -1}"#,
    );
    let err = Checkpoint::open(dir.path()).unwrap_err();
    assert!(
        matches!(err, LoadError::WrongType { ref field, .. } if field == "eos_token_id"),
        "{err}"
    );
}

#[test]
fn chat_template_lookup_order() {
    let dir = minimal();
    write(
        &dir.path().join("tokenizer_config.json"),
        r#"{"chat_template": "from-tokenizer-config"}"#,
    );
    assert_eq!(
        Checkpoint::open(dir.path())
            .unwrap()
            .chat_template
            .as_deref(),
        Some("from-tokenizer-config")
    );
    write(
        &dir.path().join("tokenizer_config.json"),
        r#"{"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}"#,
    );
    assert_eq!(
        Checkpoint::open(dir.path())
            .unwrap()
            .chat_template
            .as_deref(),
        Some("D")
    );
    write(&dir.path().join("chat_template.jinja"), "from-jinja");
    assert_eq!(
        Checkpoint::open(dir.path())
            .unwrap()
            .chat_template
            .as_deref(),
        Some("from-jinja")
    );
}

#[test]
fn chat_template_of_wrong_type_is_named() {
    let dir = minimal();
    write(
        &dir.path().join("tokenizer_config.json"),
        r#"{"chat_template": 3}"#,
    );
    let err = Checkpoint::open(dir.path()).unwrap_err();
    message_naming(&err, "tokenizer_config.json");
    assert!(
        matches!(err, LoadError::WrongType { ref field, .. } if field == "chat_template"),
        "{err}"
    );
}

#[test]
fn drafters_are_detected() {
    let dir = checkpoint_dir(
        &qwen3_config(),
        &[
            f32_tensor("model.embed_tokens.weight", &[1], &[0.0]),
            f32_tensor("mtp.fc.weight", &[2, 2], &[0.0; 4]),
        ],
    );
    write(&dir.path().join("dflash").join("config.json"), "{}");
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    assert!(ckpt.has_mtp && ckpt.has_dflash);
    assert_eq!(ckpt.parameter_count(), 5);
}

fn qwen3_5_text() -> serde_json::Value {
    json!({"architectures": ["Qwen3_5ForCausalLM"], "vocab_size": 4, "hidden_size": 8, "intermediate_size": 8,
           "num_hidden_layers": 4, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8})
}

#[test]
fn tensor_prefix_follows_the_tensors() {
    // A Qwen3_5ForCausalLM config over ConditionalGeneration-layout tensors (transformers strips
    // `language_model.` when loading): the tensors decide.
    let dir = checkpoint_dir(
        &qwen3_5_text(),
        &[f32_tensor(
            "model.language_model.embed_tokens.weight",
            &[1],
            &[0.0],
        )],
    );
    assert_eq!(
        Checkpoint::open(dir.path()).unwrap().config.tensor_prefix,
        "model.language_model."
    );
    let composite = json!({"architectures": ["Qwen3_5ForConditionalGeneration"], "text_config": qwen3_5_text()});
    let dir = checkpoint_dir(
        &composite,
        &[f32_tensor("model.embed_tokens.weight", &[1], &[0.0])],
    );
    assert_eq!(
        Checkpoint::open(dir.path()).unwrap().config.tensor_prefix,
        "model."
    );
    let dir = checkpoint_dir(&composite, &[f32_tensor("other", &[1], &[0.0])]);
    assert_eq!(
        Checkpoint::open(dir.path()).unwrap().config.tensor_prefix,
        "model.language_model."
    );
}

/// A Qwen2/Qwen3-style tokenizer.json in miniature: NFC, the Qwen split regex (with its `(?!\S)`
/// look-ahead, which needs fancy-regex or onig), byte-level mapping, BPE with hand-written merges,
/// and `<|im_end|>` as a special added token.
const QWEN_STYLE_TOKENIZER: &str = r#"{
  "version": "1.0",
  "truncation": null,
  "padding": null,
  "added_tokens": [
    {"id": 17, "content": "<|im_end|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}
  ],
  "normalizer": {"type": "NFC"},
  "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}, "behavior": "Isolated", "invert": false},
    {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}
  ]},
  "post_processor": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
  "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
  "model": {
    "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": "", "end_of_word_suffix": "",
    "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
    "vocab": {"H": 0, "e": 1, "l": 2, "o": 3, "Ġ": 4, "w": 5, "r": 6, "d": 7,
              "He": 8, "ll": 9, "Hell": 10, "Hello": 11, "Ġw": 12, "or": 13, "Ġwor": 14, "ld": 15, "Ġworld": 16},
    "merges": ["H e", "l l", "He ll", "Hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld"]
  }
}"#;

#[test]
fn qwen_style_byte_level_bpe_tokenizer_loads_and_encodes() {
    let dir = minimal();
    write(&dir.path().join("tokenizer.json"), QWEN_STYLE_TOKENIZER);
    let tok = Checkpoint::open(dir.path()).unwrap().tokenizer().unwrap();
    // Split gives "Hello", " " (the look-ahead leaves the last space to the word), " world";
    // byte-level maps ' ' to 'Ġ'; the merges build Hello / Ġworld.
    let enc = tok.encode("Hello  world<|im_end|>", false).unwrap();
    assert_eq!(enc.get_ids(), [11, 4, 16, 17]);
    assert_eq!(
        tok.decode(&[11, 4, 16, 17], false).unwrap(),
        "Hello  world<|im_end|>"
    );
    assert_eq!(tok.decode(&[11, 4, 16, 17], true).unwrap(), "Hello  world");
}

#[test]
fn missing_or_unreadable_tokenizer_json_is_named() {
    let dir = minimal();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let err = ckpt.tokenizer().unwrap_err();
    message_naming(&err, "tokenizer.json");
    assert!(matches!(err, LoadError::MissingFile { .. }), "{err}");
    for broken in ["{not json", r#"{"model": {"type": "Nope"}}"#] {
        write(&dir.path().join("tokenizer.json"), broken);
        let err = ckpt.tokenizer().unwrap_err();
        message_naming(&err, "tokenizer.json");
        assert!(matches!(err, LoadError::Tokenizer { .. }), "{err}");
    }
}
