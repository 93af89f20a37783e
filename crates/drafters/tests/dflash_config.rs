//! DFlash `config.json` parsing: z-lab's field lookup (`dflash_config` first, then top level, with its
//! defaults) and refusals that name the file and the field.

use drafters::dflash::DflashConfig;
use serde_json::{json, Value};
use std::path::PathBuf;

/// The testbed drafter's config (models/testbed/dflash/config.json), trimmed to what matters.
fn base() -> Value {
    json!({
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "block_size": 8,
        "dflash_config": {"mask_token_id": 3, "target_layer_ids": [1, 3, 5]},
        "hidden_size": 384,
        "intermediate_size": 1024,
        "num_hidden_layers": 3,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000000.0,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0},
        "layer_types": ["full_attention", "full_attention", "full_attention"],
        "num_target_layers": 8,
        "vocab_size": 8192
    })
}

fn parse(name: &str, v: &Value) -> Result<DflashConfig, String> {
    let dir = std::env::temp_dir().join(format!("dflash_config_{}_{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path: PathBuf = dir.join("config.json");
    std::fs::write(&path, v.to_string()).unwrap();
    let r = DflashConfig::from_json_file(&path).map_err(|e| e.to_string());
    std::fs::remove_dir_all(&dir).unwrap();
    r
}

fn edit(f: impl FnOnce(&mut serde_json::Map<String, Value>)) -> Value {
    let mut v = base();
    f(v.as_object_mut().unwrap());
    v
}

#[test]
fn testbed_config_reads_every_field() {
    let c = parse("base", &base()).unwrap();
    assert_eq!(c.block_size, 8);
    assert_eq!(c.mask_token_id, 3);
    assert_eq!(c.target_layer_ids, vec![1, 3, 5]);
    assert_eq!(c.num_target_layers, Some(8));
    assert_eq!(
        (
            c.hidden_size,
            c.intermediate_size,
            c.num_hidden_layers,
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim
        ),
        (384, 1024, 3, 6, 2, 64)
    );
    assert_eq!(c.rope_theta, 1e7);
    assert_eq!(c.rms_norm_eps, 1e-6);
    assert_eq!(
        (
            c.input_embedding_scale,
            c.output_multiplier,
            c.final_logit_softcapping
        ),
        (1.0, 1.0, None)
    );
}

#[test]
fn dflash_config_fields_win_and_defaults_apply() {
    let v = edit(|o| {
        o.remove("block_size");
        o.remove("head_dim");
        o.remove("rope_parameters");
        o.remove("rope_theta");
        o.insert("mask_token_id".into(), json!(99));
        o.insert(
            "dflash_config".into(),
            json!({"mask_token_id": 5, "target_layer_ids": [0], "output_multiplier": 0.5,
                   "final_logit_softcapping": 30.0, "input_embedding_scale": 2.0}),
        );
    });
    let c = parse("defaults", &v).unwrap();
    assert_eq!(c.block_size, 16, "z-lab's default block");
    assert_eq!(c.head_dim, 128, "Qwen3Config's default, not hidden / heads");
    assert_eq!(c.rope_theta, 10_000.0);
    assert_eq!(c.mask_token_id, 5, "dflash_config wins over the top level");
    assert_eq!(c.target_layer_ids, vec![0]);
    assert_eq!(c.output_multiplier, 0.5);
    assert_eq!(c.final_logit_softcapping, Some(30.0));
    assert_eq!(c.input_embedding_scale, 2.0);
}

#[test]
fn unsupported_or_broken_configs_name_the_field() {
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "dflash2",
            edit(|o| {
                o.insert("architectures".into(), json!(["DFlash2DraftModel"]));
            }),
            "architectures",
        ),
        (
            "sliding",
            edit(|o| {
                o.insert(
                    "layer_types".into(),
                    json!(["full_attention", "sliding_attention", "full_attention"]),
                );
            }),
            "layer_types",
        ),
        (
            "causal",
            edit(|o| {
                o.insert("is_causal".into(), json!(true));
            }),
            "is_causal",
        ),
        (
            "yarn",
            edit(|o| {
                o.insert(
                    "rope_parameters".into(),
                    json!({"rope_type": "yarn", "factor": 4.0}),
                );
            }),
            "rope_parameters",
        ),
        (
            "no_layers",
            edit(|o| {
                o.insert("dflash_config".into(), json!({"mask_token_id": 3}));
            }),
            "target_layer_ids",
        ),
        (
            "no_mask",
            edit(|o| {
                o.insert("dflash_config".into(), json!({"target_layer_ids": [1]}));
            }),
            "mask_token_id",
        ),
        (
            "bad_layers",
            edit(|o| {
                o.insert(
                    "dflash_config".into(),
                    json!({"mask_token_id": 3, "target_layer_ids": "1,3"}),
                );
            }),
            "dflash_config.target_layer_ids",
        ),
        (
            "block1",
            edit(|o| {
                o.insert("block_size".into(), json!(1));
            }),
            "block_size",
        ),
        (
            "gqa",
            edit(|o| {
                o.insert("num_key_value_heads".into(), json!(4));
            }),
            "num_key_value_heads",
        ),
        (
            "zero_kv_heads",
            edit(|o| {
                o.insert("num_key_value_heads".into(), json!(0));
            }),
            "num_key_value_heads",
        ),
        (
            "no_hidden",
            edit(|o| {
                o.remove("hidden_size");
            }),
            "hidden_size",
        ),
    ];
    for (name, v, field) in cases {
        let err = parse(name, &v).expect_err(name);
        assert!(
            err.contains("config.json") && err.contains(field),
            "{name}: {err}"
        );
    }
}
