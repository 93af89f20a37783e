//! The committed transformers-written fixtures (fixtures/, made by tools/fixtures): every config
//! value as transformers saved it, every tensor's shape as the config implies, the real Qwen3
//! tokenizer against transformers' token ids, and the bf16 decode of a real file.

use std::path::PathBuf;

use model_io::{Checkpoint, DType, Family, LayerKind, LoadError, ModelConfig, TensorStore};

use LayerKind::{FullAttention as F, LinearAttention as L};

fn fixture(name: &str) -> PathBuf {
    testdata::fixture(name)
}

/// Every tensor of the checkpoint decodes as f32 at its stored shape, with finite values.
fn load_every_tensor(ckpt: &Checkpoint) {
    for name in ckpt.tensors.names() {
        let shape = ckpt.tensors.shape(name).unwrap().to_vec();
        let values = ckpt.tensors.load_f32(name, &shape).unwrap();
        assert_eq!(values.len(), shape.iter().product::<usize>(), "{name}");
        assert!(values.iter().all(|v| v.is_finite()), "{name}");
    }
}

/// Shapes of one full-attention layer as transformers builds it from `c`.
fn check_attention_shapes(ckpt: &Checkpoint, layer: usize) {
    let c = &ckpt.config;
    let q_rows = c.num_attention_heads * c.head_dim * if c.attn_output_gate { 2 } else { 1 };
    let kv_rows = c.num_key_value_heads * c.head_dim;
    let p = |s: &str| ckpt.name(&format!("layers.{layer}.self_attn.{s}"));
    assert_eq!(
        ckpt.tensors.shape(&p("q_proj.weight")).unwrap(),
        [q_rows, c.hidden_size]
    );
    assert_eq!(
        ckpt.tensors.shape(&p("k_proj.weight")).unwrap(),
        [kv_rows, c.hidden_size]
    );
    assert_eq!(
        ckpt.tensors.shape(&p("o_proj.weight")).unwrap(),
        [c.hidden_size, c.num_attention_heads * c.head_dim]
    );
    assert_eq!(
        ckpt.tensors.shape(&p("q_norm.weight")).unwrap(),
        [c.head_dim]
    );
}

fn assert_tiny_common(c: &ModelConfig) {
    assert_eq!(
        (c.vocab_size, c.hidden_size, c.intermediate_size),
        (512, 64, 128)
    );
    assert_eq!(
        (
            c.num_hidden_layers,
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim
        ),
        (4, 4, 2, 16)
    );
    assert_eq!(
        (c.rms_norm_eps, c.rope_theta, c.max_position_embeddings),
        (1e-6, 10_000.0, 4096)
    );
    assert!(!c.attention_bias);
    assert!(c.eos_token_ids.is_empty());
}

#[test]
fn qwen3_fixture() {
    let ckpt = Checkpoint::open(&fixture("qwen3")).unwrap();
    let c = &ckpt.config;
    assert_eq!(
        (c.family, c.architecture.as_str()),
        (Family::Qwen3, "Qwen3ForCausalLM")
    );
    assert_tiny_common(c);
    assert_eq!((c.partial_rotary_factor, c.rotary_dim()), (1.0, 16));
    assert!(!c.tie_word_embeddings && !c.attn_output_gate);
    assert_eq!(c.layer_types, vec![F; 4]);
    assert!(c.linear.is_none() && c.moe.is_none());
    assert_eq!(
        (c.mtp_num_hidden_layers, c.tensor_prefix.as_str()),
        (0, "model.")
    );
    assert!(!ckpt.has_mtp && !ckpt.has_dflash);
    assert!(ckpt.tensors.contains("lm_head.weight"));
    (0..4).for_each(|l| check_attention_shapes(&ckpt, l));
    load_every_tensor(&ckpt);
}

#[test]
fn qwen3_5_sharded_fixture() {
    let ckpt = Checkpoint::open(&fixture("qwen3_5")).unwrap();
    assert_eq!(ckpt.tensors.shard_paths().count(), 3);
    let c = &ckpt.config;
    assert_eq!(
        (c.family, c.architecture.as_str()),
        (Family::Qwen35, "Qwen3_5ForCausalLM")
    );
    assert_tiny_common(c);
    assert_eq!((c.partial_rotary_factor, c.rotary_dim()), (0.25, 4));
    assert!(c.tie_word_embeddings && c.attn_output_gate);
    assert_eq!(c.layer_types, vec![L, L, L, F]);
    let lin = c.linear.clone().unwrap();
    assert_eq!(
        (
            lin.num_key_heads,
            lin.num_value_heads,
            lin.key_head_dim,
            lin.value_head_dim,
            lin.conv_kernel
        ),
        (2, 4, 16, 16, 4)
    );
    assert!(c.moe.is_none());
    assert_eq!(
        (c.mtp_num_hidden_layers, c.tensor_prefix.as_str()),
        (1, "model.")
    );
    assert!(ckpt.has_mtp);
    // in_proj_qkv rows = 2 * Hk * dk + Hv * dv; the index's metadata counts every stored element.
    let qkv = 2 * lin.num_key_heads * lin.key_head_dim + lin.num_value_heads * lin.value_head_dim;
    assert_eq!(
        ckpt.tensors
            .shape(&ckpt.name("layers.0.linear_attn.in_proj_qkv.weight"))
            .unwrap(),
        [qkv, 64]
    );
    assert_eq!(ckpt.parameter_count(), 249_864);
    check_attention_shapes(&ckpt, 3);
    load_every_tensor(&ckpt);
}

#[test]
fn qwen3_5_conditional_generation_fixture() {
    let ckpt = Checkpoint::open(&fixture("qwen3_5_vl")).unwrap();
    let c = &ckpt.config;
    assert_eq!(
        (c.family, c.architecture.as_str()),
        (Family::Qwen35, "Qwen3_5ForConditionalGeneration")
    );
    assert_tiny_common(c);
    assert_eq!(c.tensor_prefix, "model.language_model.");
    assert!(c.tie_word_embeddings);
    assert_eq!(c.layer_types, vec![L, L, L, F]);
    assert_eq!(c.rotary_dim(), 4);
    assert!(ckpt.has_mtp);
    // Same text model as qwen3_5 (the fixture derives from it).
    let text_only = Checkpoint::open(&fixture("qwen3_5")).unwrap();
    assert_eq!(
        ModelConfig {
            architecture: String::new(),
            tensor_prefix: String::new(),
            ..c.clone()
        },
        ModelConfig {
            architecture: String::new(),
            tensor_prefix: String::new(),
            ..text_only.config.clone()
        }
    );
    check_attention_shapes(&ckpt, 3);
    load_every_tensor(&ckpt);
}

#[test]
fn qwen3_next_fixture() {
    let ckpt = Checkpoint::open(&fixture("qwen3_next")).unwrap();
    let c = &ckpt.config;
    assert_eq!(
        (c.family, c.architecture.as_str()),
        (Family::Qwen3Next, "Qwen3NextForCausalLM")
    );
    assert_tiny_common(c);
    assert_eq!(c.rotary_dim(), 4);
    assert!(!c.tie_word_embeddings && c.attn_output_gate);
    assert_eq!(c.layer_types, vec![L, L, L, F]);
    let moe = c.moe.clone().unwrap();
    assert_eq!(
        (
            moe.num_experts,
            moe.num_experts_per_tok,
            moe.moe_intermediate_size,
            moe.shared_expert_intermediate_size
        ),
        (4, 2, 32, 48)
    );
    assert!(moe.norm_topk_prob && moe.mlp_only_layers.is_empty() && moe.decoder_sparse_step == 1);
    assert!((0..4).all(|l| c.is_moe_layer(l)));
    assert!(ckpt.has_mtp && c.mtp_num_hidden_layers == 1);
    let gate = ckpt.name("layers.0.mlp.gate.weight");
    assert_eq!(
        ckpt.tensors.shape(&gate).unwrap(),
        [moe.num_experts, c.hidden_size]
    );
    check_attention_shapes(&ckpt, 3);
    load_every_tensor(&ckpt);
}

/// Qwen3-MoE as released: every layer MoE, renormalised top-k, no shared expert; transformers 5 writes
/// the expert count as `num_local_experts` and the experts per expert; bf16 weights.
#[test]
fn qwen3_moe_fixture() {
    let ckpt = Checkpoint::open(&fixture("qwen3_moe")).unwrap();
    let c = &ckpt.config;
    assert_eq!(
        (c.family, c.architecture.as_str()),
        (Family::Qwen3Moe, "Qwen3MoeForCausalLM")
    );
    assert_eq!(
        (
            c.vocab_size,
            c.hidden_size,
            c.num_hidden_layers,
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim
        ),
        (128, 32, 3, 4, 2, 16)
    );
    assert_eq!(c.rotary_dim(), 16, "Qwen3 attention rotates the whole head");
    assert!(!c.tie_word_embeddings && !c.attn_output_gate && !c.attention_bias);
    assert_eq!(c.layer_types, vec![F; 3]);
    assert!(c.linear.is_none() && !ckpt.has_mtp);
    let moe = c.moe.clone().unwrap();
    assert_eq!(
        (
            moe.num_experts,
            moe.num_experts_per_tok,
            moe.moe_intermediate_size,
            moe.shared_expert_intermediate_size
        ),
        (8, 2, 16, 0)
    );
    assert!(moe.norm_topk_prob && moe.mlp_only_layers.is_empty() && moe.decoder_sparse_step == 1);
    assert!((0..3).all(|l| c.is_moe_layer(l)));
    let expert = ckpt.name("layers.2.mlp.experts.7.down_proj.weight");
    assert_eq!(ckpt.tensors.shape(&expert).unwrap(), [32, 16]);
    assert_eq!(ckpt.tensors.dtype(&expert).unwrap(), DType::BF16);
    assert!(ckpt
        .tensors
        .shape(&ckpt.name("layers.0.mlp.gate_proj.weight"))
        .is_err());
    check_attention_shapes(&ckpt, 2);
    load_every_tensor(&ckpt);
}

/// Dense and MoE layers mixed (`decoder_sparse_step` 2, `mlp_only_layers` [3]), transformers' default
/// `norm_topk_prob` (false) and no `head_dim` in config.json (hidden / heads).
#[test]
fn qwen3_moe_mixed_fixture() {
    let ckpt = Checkpoint::open(&fixture("qwen3_moe_mixed")).unwrap();
    let c = &ckpt.config;
    assert_eq!(c.family, Family::Qwen3Moe);
    assert_eq!((c.head_dim, c.intermediate_size), (8, 48));
    let moe = c.moe.clone().unwrap();
    assert!(!moe.norm_topk_prob);
    assert_eq!(
        (
            moe.num_experts_per_tok,
            moe.decoder_sparse_step,
            moe.mlp_only_layers.clone()
        ),
        (3, 2, vec![3])
    );
    let moe_layers: Vec<usize> = (0..4).filter(|&l| c.is_moe_layer(l)).collect();
    assert_eq!(moe_layers, [1]);
    for layer in [0, 2, 3] {
        let up = ckpt.name(&format!("layers.{layer}.mlp.up_proj.weight"));
        assert_eq!(ckpt.tensors.shape(&up).unwrap(), [48, 32]);
    }
    let gate = ckpt.name("layers.1.mlp.gate.weight");
    assert_eq!(ckpt.tensors.shape(&gate).unwrap(), [8, 32]);
    check_attention_shapes(&ckpt, 0);
    load_every_tensor(&ckpt);
}

#[test]
fn qwen3_real_tokenizer_matches_transformers_ids() {
    let dir = fixture("qwen3_realtok");
    let ckpt = Checkpoint::open(&dir).unwrap();
    let c = &ckpt.config;
    assert_eq!(
        (c.vocab_size, c.rope_theta, c.num_key_value_heads),
        (151_936, 1e6, 1)
    );
    assert!(c.tie_word_embeddings);
    assert_eq!(ckpt.eos_token_ids(), vec![151_645, 151_643]);
    let g = &ckpt.generation;
    assert_eq!(
        (g.temperature, g.top_k, g.top_p, g.do_sample),
        (Some(0.6), Some(20), Some(0.95), Some(true))
    );
    assert!(ckpt
        .chat_template
        .as_deref()
        .unwrap()
        .contains("<|im_start|>"));

    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let prompt = reference["prompt_text"].as_str().unwrap();
    let expected: Vec<u32> = reference["prompt_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let tok = ckpt.tokenizer().unwrap();
    assert_eq!(tok.encode(prompt, false).unwrap().get_ids(), expected);
    assert_eq!(tok.decode(&expected, false).unwrap(), prompt);
}

#[test]
fn real_bf16_file_decodes_to_hand_computed_values() {
    let ckpt = Checkpoint::open(&fixture("qwen3_realtok")).unwrap();
    assert_eq!(
        ckpt.tensors.dtype("model.norm.weight").unwrap(),
        DType::BF16
    );
    let norm = ckpt.tensors.load_f32("model.norm.weight", &[16]).unwrap();
    // Stored bits 0x3F76, 0x3F5A, 0x3F85: 2^-1 * (1 + 118/128), 2^-1 * (1 + 90/128), 1 + 5/128.
    assert_eq!(norm[..3], [0.9609375, 0.8515625, 1.0390625]);
    let err = ckpt
        .tensors
        .load_f32("model.norm.weight", &[8, 2])
        .unwrap_err();
    assert!(matches!(err, LoadError::ShapeMismatch { .. }), "{err}");
}

#[test]
fn real_reference_file_with_integer_tensors_opens_but_refuses_them_as_weights() {
    let dir = fixture("qwen3_realtok");
    let store = TensorStore::open_files(&dir, &[dir.join("reference.safetensors")]).unwrap();
    assert_eq!(store.stored_dtype_name("prompt_ids").unwrap(), "I64");
    let err = store.load_f32("prompt_ids", &[89]).unwrap_err();
    assert!(matches!(err, LoadError::UnsupportedDtype { .. }), "{err}");
    assert!(err.to_string().contains("reference.safetensors"), "{err}");
    assert_eq!(store.dtype("logits_last").unwrap(), DType::F32);
}
