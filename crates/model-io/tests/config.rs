//! config.json parsing: transformers 5.17 defaults and rules, and errors naming file and field.

mod common;

use common::{message_naming, qwen3_config, write};
use model_io::{Family, LayerKind, LoadError, ModelConfig};
use serde_json::{json, Value};

use LayerKind::{FullAttention as F, LinearAttention as L};

/// Writes `config` as config.json in a temp dir and parses it.
fn load(config: &Value) -> Result<ModelConfig, LoadError> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    write(&path, &config.to_string());
    ModelConfig::from_json_file(&path)
}

fn qwen3_5_config() -> Value {
    json!({
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_text",
        "vocab_size": 32,
        "hidden_size": 16,
        "intermediate_size": 24,
        "num_hidden_layers": 8,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8
    })
}

fn qwen3_next_config() -> Value {
    json!({
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next",
        "vocab_size": 32,
        "hidden_size": 16,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16
    })
}

fn set(mut v: Value, key: &str, value: Value) -> Value {
    v.as_object_mut().unwrap().insert(key.to_string(), value);
    v
}

fn remove(mut v: Value, key: &str) -> Value {
    v.as_object_mut().unwrap().remove(key);
    v
}

#[test]
fn qwen3_absent_fields_take_transformers_defaults() {
    let c = load(&qwen3_config()).unwrap();
    assert_eq!(c.family, Family::Qwen3);
    assert_eq!(c.architecture, "Qwen3ForCausalLM");
    assert_eq!(
        (c.vocab_size, c.hidden_size, c.intermediate_size),
        (32, 16, 24)
    );
    assert_eq!(
        (c.num_attention_heads, c.num_key_value_heads, c.head_dim),
        (4, 2, 8)
    );
    assert_eq!(c.rms_norm_eps, 1e-6);
    assert_eq!(c.rope_theta, 10_000.0);
    assert_eq!(c.partial_rotary_factor, 1.0);
    assert_eq!(c.rotary_dim(), 8);
    assert_eq!(c.max_position_embeddings, 32768);
    assert!(!c.tie_word_embeddings && !c.attention_bias && !c.attn_output_gate);
    assert_eq!(c.layer_types, vec![F, F]);
    assert!(c.linear.is_none() && c.moe.is_none());
    assert_eq!(c.mtp_num_hidden_layers, 0);
    assert_eq!(c.tensor_prefix, "model.");
    assert_eq!(c.eos_token_ids, vec![7]);
    assert_eq!(c.gqa_group_size(), 2);
}

#[test]
fn qwen3_head_dim_defaults_to_128_not_hidden_over_heads() {
    // Qwen3Config's dataclass default is 128; hidden/heads (4) would be a different model.
    let c = load(&set(
        remove(qwen3_config(), "head_dim"),
        "hidden_size",
        json!(16),
    ))
    .unwrap();
    assert_eq!(c.head_dim, 128);
}

#[test]
fn qwen3_null_kv_heads_means_one_per_attention_head() {
    let c = load(&set(qwen3_config(), "num_key_value_heads", Value::Null)).unwrap();
    assert_eq!(c.num_key_value_heads, 4);
}

#[test]
fn qwen3_rope_ignores_partial_rotary_factor() {
    // transformers' Qwen3 RoPE rotates the whole head whatever partial_rotary_factor says.
    let c = load(&set(qwen3_config(), "partial_rotary_factor", json!(0.5))).unwrap();
    assert_eq!(c.rotary_dim(), 8);
}

#[test]
fn eos_token_id_may_be_int_list_or_null() {
    assert_eq!(
        load(&set(qwen3_config(), "eos_token_id", json!([3, 9])))
            .unwrap()
            .eos_token_ids,
        vec![3, 9]
    );
    assert!(load(&set(qwen3_config(), "eos_token_id", Value::Null))
        .unwrap()
        .eos_token_ids
        .is_empty());
}

#[test]
fn rope_theta_from_new_rope_parameters_old_top_level_and_legacy_rope_scaling() {
    let new = set(
        qwen3_config(),
        "rope_parameters",
        json!({"rope_type": "default", "rope_theta": 1e6}),
    );
    assert_eq!(load(&new).unwrap().rope_theta, 1e6);
    let old = set(qwen3_config(), "rope_theta", json!(5e5));
    assert_eq!(load(&old).unwrap().rope_theta, 5e5);
    let legacy = set(
        qwen3_config(),
        "rope_scaling",
        json!({"type": "default", "rope_theta": 2e5}),
    );
    assert_eq!(load(&legacy).unwrap().rope_theta, 2e5);
    // rope_parameters wins over a stale top-level value, like convert_rope_params_to_dict.
    let both = set(new, "rope_theta", json!(3.0));
    assert_eq!(load(&both).unwrap().rope_theta, 1e6);
    // Per-layer-type form: full attention's entry applies.
    let per_layer = set(
        qwen3_5_config(),
        "rope_parameters",
        json!({"full_attention": {"rope_type": "default", "rope_theta": 7e4, "partial_rotary_factor": 0.5}}),
    );
    let c = load(&per_layer).unwrap();
    assert_eq!((c.rope_theta, c.rotary_dim()), (7e4, 4));
}

#[test]
fn non_default_rope_type_is_refused_by_name() {
    let cfg = set(
        qwen3_config(),
        "rope_parameters",
        json!({"rope_type": "yarn", "factor": 4.0}),
    );
    let err = load(&cfg).unwrap_err();
    let msg = message_naming(&err, "config.json");
    assert!(
        matches!(err, LoadError::Unsupported { ref field, .. } if field == "rope_parameters.rope_type"),
        "{msg}"
    );
    assert!(msg.contains("yarn"), "{msg}");
}

#[test]
fn qwen3_sliding_window_layers_are_refused_but_an_unused_window_is_not() {
    let sliding = set(
        set(qwen3_config(), "use_sliding_window", json!(true)),
        "max_window_layers",
        json!(1),
    );
    let err = load(&sliding).unwrap_err();
    assert!(
        matches!(err, LoadError::Unsupported { ref field, .. } if field == "use_sliding_window"),
        "{err}"
    );
    // max_window_layers >= num_hidden_layers: no layer slides.
    let unused = set(
        set(qwen3_config(), "use_sliding_window", json!(true)),
        "max_window_layers",
        json!(2),
    );
    assert_eq!(load(&unused).unwrap().layer_types, vec![F, F]);
}

#[test]
fn qwen3_5_layer_pattern_follows_full_attention_interval() {
    let c = load(&qwen3_5_config()).unwrap();
    assert_eq!(c.family, Family::Qwen35);
    assert_eq!(c.layer_types, vec![L, L, L, F, L, L, L, F]);
    let c = load(&set(qwen3_5_config(), "full_attention_interval", json!(2))).unwrap();
    assert_eq!(c.layer_types, vec![L, F, L, F, L, F, L, F]);
}

#[test]
fn qwen3_5_explicit_layer_types_including_legacy_names() {
    let types = json!([
        "linear_attention",
        "full_attention",
        "mamba",
        "attention",
        "linear_attention",
        "linear_attention",
        "linear_attention",
        "full_attention"
    ]);
    let c = load(&set(qwen3_5_config(), "layer_types", types)).unwrap();
    assert_eq!(c.layer_types, vec![L, F, L, F, L, L, L, F]);
}

#[test]
fn qwen3_5_defaults_gate_partial_rope_and_linear_sizes() {
    let c = load(&remove(qwen3_5_config(), "head_dim")).unwrap();
    assert!(c.attn_output_gate);
    assert_eq!(c.head_dim, 256);
    assert_eq!(c.partial_rotary_factor, 0.25);
    assert_eq!(c.rotary_dim(), 64);
    let lin = c.linear.unwrap();
    assert_eq!(
        (
            lin.num_key_heads,
            lin.num_value_heads,
            lin.key_head_dim,
            lin.value_head_dim,
            lin.conv_kernel
        ),
        (16, 32, 128, 128, 4)
    );
    assert!(c.moe.is_none());
}

#[test]
fn qwen3_5_partial_rotary_factor_old_top_level_form() {
    let c = load(&set(qwen3_5_config(), "partial_rotary_factor", json!(0.5))).unwrap();
    assert_eq!(c.rotary_dim(), 4);
}

#[test]
fn qwen3_5_conditional_generation_reads_text_config() {
    let cfg = json!({
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "tie_word_embeddings": true,
        "eos_token_id": 5,
        "text_config": set(set(remove(qwen3_5_config(), "architectures"), "model_type", json!("qwen3_5_text")), "eos_token_id", json!([4, 5])),
        "vision_config": {"depth": 1, "hidden_size": 8}
    });
    let c = load(&cfg).unwrap();
    assert_eq!(c.family, Family::Qwen35);
    assert_eq!(c.tensor_prefix, "model.language_model.");
    assert_eq!(c.hidden_size, 16);
    assert!(c.tie_word_embeddings);
    assert_eq!(c.eos_token_ids, vec![4, 5]);

    let broken = json!({"architectures": ["Qwen3_5ForConditionalGeneration"], "text_config": remove(qwen3_5_config(), "hidden_size")});
    let err = load(&broken).unwrap_err();
    assert!(
        matches!(err, LoadError::MissingField { ref field, .. } if field == "text_config.hidden_size"),
        "{err}"
    );
    let no_text = json!({"architectures": ["Qwen3_5ForConditionalGeneration"]});
    assert!(
        matches!(load(&no_text).unwrap_err(), LoadError::MissingField { ref field, .. } if field == "text_config")
    );
}

#[test]
fn qwen3_next_moe_defaults_and_sparse_step_rule() {
    let c = load(&qwen3_next_config()).unwrap();
    assert_eq!(c.family, Family::Qwen3Next);
    assert_eq!(c.layer_types, vec![L, L, L, F]);
    assert_eq!(c.intermediate_size, 5632);
    let moe = c.moe.clone().unwrap();
    assert_eq!(
        (
            moe.num_experts,
            moe.num_experts_per_tok,
            moe.moe_intermediate_size,
            moe.shared_expert_intermediate_size
        ),
        (512, 10, 512, 512)
    );
    assert!(moe.norm_topk_prob);
    assert!((0..4).all(|i| c.is_moe_layer(i)));

    let cfg = set(
        set(
            set(qwen3_next_config(), "num_hidden_layers", json!(8)),
            "decoder_sparse_step",
            json!(2),
        ),
        "mlp_only_layers",
        json!([3]),
    );
    let c = load(&cfg).unwrap();
    // (i + 1) % 2 == 0 -> 1, 3, 5, 7; layer 3 is forced dense.
    let moe_layers: Vec<usize> = (0..8).filter(|&i| c.is_moe_layer(i)).collect();
    assert_eq!(moe_layers, vec![1, 5, 7]);
}

#[test]
fn qwen3_next_without_experts_is_dense() {
    let c = load(&set(qwen3_next_config(), "num_experts", json!(0))).unwrap();
    assert!(c.moe.is_none());
    assert!(!c.is_moe_layer(0));
}

#[test]
fn qwen3_5_moe_has_moe_in_every_layer() {
    let cfg = set(
        set(
            remove(qwen3_5_config(), "intermediate_size"),
            "architectures",
            json!(["Qwen3_5MoeForCausalLM"]),
        ),
        "model_type",
        json!("qwen3_5_moe_text"),
    );
    let c = load(&cfg).unwrap();
    assert_eq!(c.family, Family::Qwen35);
    assert_eq!(c.intermediate_size, 0);
    let moe = c.moe.clone().unwrap();
    assert_eq!(
        (
            moe.num_experts,
            moe.num_experts_per_tok,
            moe.decoder_sparse_step
        ),
        (256, 8, 1)
    );
    assert!((0..8).all(|i| c.is_moe_layer(i)));
}

#[test]
fn model_type_alone_selects_the_architecture() {
    let c = load(&remove(qwen3_next_config(), "architectures")).unwrap();
    assert_eq!(c.architecture, "Qwen3NextForCausalLM");
}

#[test]
fn unknown_architecture_is_refused_by_name() {
    let err = load(&set(
        qwen3_config(),
        "architectures",
        json!(["LlamaForCausalLM"]),
    ))
    .unwrap_err();
    let msg = message_naming(&err, "config.json");
    assert!(
        matches!(err, LoadError::UnknownArchitecture { .. }),
        "{msg}"
    );
    assert!(msg.contains("LlamaForCausalLM"), "{msg}");
    let err = load(&json!({"model_type": "llama", "hidden_size": 4})).unwrap_err();
    assert!(err.to_string().contains("llama"), "{err}");
}

#[test]
fn model_type_of_another_family_is_an_error() {
    let err = load(&set(qwen3_config(), "model_type", json!("qwen3_next"))).unwrap_err();
    assert!(
        matches!(err, LoadError::InvalidValue { ref field, .. } if field == "model_type"),
        "{err}"
    );
}

#[test]
fn missing_required_field_is_named() {
    for field in [
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
    ] {
        let err = load(&remove(qwen3_config(), field)).unwrap_err();
        let msg = message_naming(&err, "config.json");
        assert!(
            matches!(err, LoadError::MissingField { field: ref f, .. } if f == field),
            "{msg}"
        );
    }
    let err = load(&json!({"hidden_size": 4})).unwrap_err();
    assert!(
        matches!(err, LoadError::MissingField { ref field, .. } if field == "architectures"),
        "{err}"
    );
}

#[test]
fn field_of_wrong_type_is_named() {
    let cases = [
        ("hidden_size", json!("64")),
        ("hidden_size", json!(-4)),
        ("hidden_size", json!(16.5)),
        ("rms_norm_eps", json!("1e-6")),
        ("tie_word_embeddings", json!(1)),
        ("layer_types", json!("full_attention")),
        ("eos_token_id", json!(["x"])),
        ("architectures", json!("Qwen3ForCausalLM")),
        ("rope_parameters", json!([1])),
    ];
    for (field, value) in cases {
        let err = load(&set(qwen3_config(), field, value.clone())).unwrap_err();
        let msg = message_naming(&err, "config.json");
        assert!(
            matches!(err, LoadError::WrongType { field: ref f, .. } if f == field),
            "{field}={value}: {msg}"
        );
    }
    let err = load(&set(
        qwen3_config(),
        "rope_parameters",
        json!({"rope_theta": "big"}),
    ))
    .unwrap_err();
    assert!(
        matches!(err, LoadError::WrongType { ref field, .. } if field == "rope_parameters.rope_theta"),
        "{err}"
    );
}

#[test]
fn impossible_values_are_named() {
    let cases = [
        (
            set(qwen3_config(), "num_key_value_heads", json!(3)),
            "num_key_value_heads",
        ),
        (set(qwen3_config(), "hidden_size", json!(0)), "hidden_size"),
        (
            set(qwen3_config(), "rms_norm_eps", json!(-1.0)),
            "rms_norm_eps",
        ),
        (
            set(qwen3_5_config(), "partial_rotary_factor", json!(1.5)),
            "partial_rotary_factor",
        ),
        (
            set(qwen3_5_config(), "partial_rotary_factor", json!(0.0)),
            "partial_rotary_factor",
        ),
        (
            set(qwen3_5_config(), "full_attention_interval", json!(0)),
            "full_attention_interval",
        ),
        (
            set(qwen3_5_config(), "layer_types", json!(["full_attention"])),
            "layer_types",
        ),
        (
            set(qwen3_5_config(), "linear_num_value_heads", json!(3)),
            "linear_num_value_heads",
        ),
        (
            set(qwen3_next_config(), "decoder_sparse_step", json!(0)),
            "decoder_sparse_step",
        ),
        (
            set(qwen3_next_config(), "num_experts_per_tok", json!(600)),
            "num_experts_per_tok",
        ),
    ];
    for (cfg, field) in cases {
        let err = load(&cfg).unwrap_err();
        let msg = message_naming(&err, "config.json");
        assert!(
            matches!(err, LoadError::InvalidValue { field: ref f, .. } if f == field),
            "{field}: {msg}"
        );
    }
}

#[test]
fn rotary_dim_truncates_like_python_int() {
    // int(8 * 0.3) = int(2.4) = 2.
    let c = load(&set(qwen3_5_config(), "partial_rotary_factor", json!(0.3))).unwrap();
    assert_eq!(c.rotary_dim(), 2);
}

#[test]
fn odd_rotary_dim_is_refused() {
    // head_dim 8 x 0.125 = 1 rotary dim: rotate-half needs an even count.
    let err = load(&set(
        qwen3_5_config(),
        "partial_rotary_factor",
        json!(0.125),
    ))
    .unwrap_err();
    assert!(
        matches!(err, LoadError::InvalidValue { ref field, .. } if field == "partial_rotary_factor"),
        "{err}"
    );
}

#[test]
fn malformed_json_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    write(&path, "{\"architectures\": [\"Qwen3ForCausalLM\"");
    let err = ModelConfig::from_json_file(&path).unwrap_err();
    message_naming(&err, "config.json");
    assert!(matches!(err, LoadError::Json { .. }), "{err}");
    write(&path, "[1, 2]");
    assert!(matches!(
        ModelConfig::from_json_file(&path).unwrap_err(),
        LoadError::Json { .. }
    ));
}

#[test]
fn missing_config_file_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let err = ModelConfig::from_json_file(&dir.path().join("config.json")).unwrap_err();
    message_naming(&err, "config.json");
    assert!(matches!(err, LoadError::MissingFile { .. }), "{err}");
}

#[test]
fn an_absurd_context_is_refused_by_name() {
    for bad in [json!(0), json!(1u64 << 62)] {
        let cfg = set(qwen3_config(), "max_position_embeddings", bad.clone());
        let err = load(&cfg).unwrap_err();
        let msg = message_naming(&err, "config.json");
        assert!(msg.contains("max_position_embeddings"), "{bad}: {msg}");
    }
    let cfg = set(qwen3_config(), "max_position_embeddings", json!(262144));
    assert_eq!(load(&cfg).unwrap().max_position_embeddings, 262144);
}

/// A Qwen3-30B-A3B-shaped config.json, shrunk (the released file's fields, `num_experts` spelling).
fn qwen3_moe_config() -> Value {
    json!({
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "vocab_size": 32,
        "hidden_size": 16,
        "intermediate_size": 48,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 12,
        "norm_topk_prob": true,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "use_sliding_window": false,
        "sliding_window": null,
        "max_window_layers": 4,
        "rope_theta": 1000000.0
    })
}

#[test]
fn qwen3_moe_reads_the_released_fields() {
    let c = load(&qwen3_moe_config()).unwrap();
    assert_eq!(c.family, Family::Qwen3Moe);
    assert_eq!(c.architecture, "Qwen3MoeForCausalLM");
    assert_eq!(c.layer_types, vec![F; 4]);
    assert!(!c.attn_output_gate && c.linear.is_none());
    assert_eq!((c.rope_theta, c.rotary_dim()), (1e6, 8));
    let moe = c.moe.clone().unwrap();
    assert_eq!(
        (
            moe.num_experts,
            moe.num_experts_per_tok,
            moe.moe_intermediate_size,
            moe.shared_expert_intermediate_size
        ),
        (8, 2, 12, 0)
    );
    assert!(moe.norm_topk_prob);
    assert!((0..4).all(|i| c.is_moe_layer(i)));
    // model_type alone selects it too.
    let c = load(&remove(qwen3_moe_config(), "architectures")).unwrap();
    assert_eq!(c.family, Family::Qwen3Moe);
}

#[test]
fn qwen3_moe_absent_fields_take_transformers_defaults() {
    let mut cfg = qwen3_moe_config();
    for key in [
        "head_dim",
        "num_key_value_heads",
        "num_experts",
        "num_experts_per_tok",
        "moe_intermediate_size",
        "norm_topk_prob",
        "decoder_sparse_step",
        "mlp_only_layers",
        "intermediate_size",
        "rope_theta",
    ] {
        cfg = remove(cfg, key);
    }
    let c = load(&cfg).unwrap();
    // Qwen3MoeAttention: head_dim = hidden_size // num_attention_heads when the config has none.
    assert_eq!((c.head_dim, c.num_key_value_heads), (4, 4));
    assert_eq!(c.rope_theta, 10_000.0);
    assert_eq!(c.intermediate_size, 6144, "unused: every layer is MoE");
    let moe = c.moe.clone().unwrap();
    assert_eq!(
        (
            moe.num_experts,
            moe.num_experts_per_tok,
            moe.moe_intermediate_size,
            moe.decoder_sparse_step
        ),
        (128, 8, 768, 1)
    );
    assert!(
        !moe.norm_topk_prob,
        "Qwen3MoeConfig defaults norm_topk_prob to false"
    );
    assert!(moe.mlp_only_layers.is_empty());
    // A null list is transformers' `None` -> [].
    let c = load(&set(qwen3_moe_config(), "mlp_only_layers", Value::Null)).unwrap();
    assert!(c.moe.unwrap().mlp_only_layers.is_empty());
}

#[test]
fn qwen3_moe_num_local_experts_is_num_experts() {
    // transformers 5 saves the alias (its attribute_map) instead of num_experts.
    let cfg = set(
        remove(qwen3_moe_config(), "num_experts"),
        "num_local_experts",
        json!(6),
    );
    assert_eq!(load(&cfg).unwrap().moe.unwrap().num_experts, 6);
    let same = set(qwen3_moe_config(), "num_local_experts", json!(8));
    assert_eq!(load(&same).unwrap().moe.unwrap().num_experts, 8);
    let both = set(qwen3_moe_config(), "num_local_experts", json!(6));
    let err = load(&both).unwrap_err();
    let msg = message_naming(&err, "config.json");
    assert!(
        matches!(err, LoadError::InvalidValue { ref field, .. } if field == "num_local_experts"),
        "{msg}"
    );
    assert!(msg.contains("num_experts = 8"), "{msg}");
}

#[test]
fn qwen3_moe_dense_layers_follow_the_sparse_step_rule_and_need_their_width() {
    let cfg = set(
        set(qwen3_moe_config(), "decoder_sparse_step", json!(2)),
        "mlp_only_layers",
        json!([3]),
    );
    let c = load(&cfg).unwrap();
    let moe_layers: Vec<usize> = (0..4).filter(|&i| c.is_moe_layer(i)).collect();
    assert_eq!(moe_layers, vec![1]);
    assert_eq!(c.intermediate_size, 48);
    // Dense layers without intermediate_size: named, not the class default of some other model.
    let err = load(&remove(cfg.clone(), "intermediate_size")).unwrap_err();
    assert!(
        matches!(err, LoadError::MissingField { ref field, .. } if field == "intermediate_size"),
        "{err}"
    );
    let err = load(&set(cfg, "intermediate_size", json!(0))).unwrap_err();
    assert!(
        matches!(err, LoadError::InvalidValue { ref field, .. } if field == "intermediate_size"),
        "{err}"
    );
    // No experts: every layer dense (transformers' rule needs num_experts > 0).
    let c = load(&set(qwen3_moe_config(), "num_experts", json!(0))).unwrap();
    assert!(c.moe.is_none() && !c.is_moe_layer(0));
}

#[test]
fn qwen3_moe_bad_values_are_named() {
    let cases = [
        (
            set(qwen3_moe_config(), "num_experts_per_tok", json!(9)),
            "num_experts_per_tok",
        ),
        (
            set(qwen3_moe_config(), "num_experts_per_tok", json!(0)),
            "num_experts_per_tok",
        ),
        (
            set(qwen3_moe_config(), "moe_intermediate_size", json!(0)),
            "moe_intermediate_size",
        ),
        (
            set(qwen3_moe_config(), "decoder_sparse_step", json!(0)),
            "decoder_sparse_step",
        ),
    ];
    for (cfg, field) in cases {
        let err = load(&cfg).unwrap_err();
        let msg = message_naming(&err, "config.json");
        assert!(
            matches!(err, LoadError::InvalidValue { field: ref f, .. } if f == field),
            "{field}: {msg}"
        );
    }
    let err = load(&set(qwen3_moe_config(), "norm_topk_prob", json!("yes"))).unwrap_err();
    assert!(
        matches!(err, LoadError::WrongType { ref field, .. } if field == "norm_topk_prob"),
        "{err}"
    );
    let err = load(&set(qwen3_moe_config(), "mlp_only_layers", json!([1, -1]))).unwrap_err();
    assert!(
        matches!(err, LoadError::WrongType { ref field, .. } if field == "mlp_only_layers"),
        "{err}"
    );
    let err = load(&set(qwen3_moe_config(), "model_type", json!("qwen3"))).unwrap_err();
    assert!(
        matches!(err, LoadError::InvalidValue { ref field, .. } if field == "model_type"),
        "{err}"
    );
}

#[test]
fn qwen3_moe_sliding_window_is_refused_unless_unused() {
    // Qwen3-MoE slides every layer when use_sliding_window is set and the window is not null.
    let sliding = set(qwen3_moe_config(), "use_sliding_window", json!(true));
    let c = load(&sliding).unwrap();
    assert_eq!(c.layer_types, vec![F; 4], "a null window slides nothing");
    // An explicit window, or none at all (the class default, 4096).
    for window in [Some(json!(4096)), None] {
        let cfg = match window {
            None => remove(sliding.clone(), "sliding_window"),
            Some(w) => set(sliding.clone(), "sliding_window", w),
        };
        let err = load(&cfg).unwrap_err();
        assert!(
            matches!(err, LoadError::Unsupported { ref field, .. } if field == "use_sliding_window"),
            "{err}"
        );
        assert!(err.to_string().contains("4096"), "{err}");
    }
}
