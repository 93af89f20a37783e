//! llama.cpp's tensor names back to Hugging Face's, per architecture, with the inverse transform.
//!
//! Names (gguf-py `tensor_mapping.py`, converter `conversion/qwen.py`, llama.cpp 0c1e570):
//! `token_embd` = `model.embed_tokens`, `output_norm` = `model.norm`, `output` = `lm_head`;
//! per block `blk.N.`: `attn_norm` = `input_layernorm`, `attn_{q,k,v}` = `self_attn.{q,k,v}_proj`,
//! `attn_output` = `self_attn.o_proj`, `attn_{q,k}_norm` = `self_attn.{q,k}_norm`, `ffn_norm`
//! (qwen3) / `post_attention_norm` (qwen35) = `post_attention_layernorm`, `ffn_{gate,up,down}` =
//! `mlp.{gate,up,down}_proj`; qwen3moe: as qwen3, with `ffn_gate_inp` = `mlp.gate` and the 3-D
//! expert tensors below (no shared expert); GDN (qwen35): `attn_qkv` = `linear_attn.in_proj_qkv`, `attn_gate` =
//! `in_proj_z`, `ssm_alpha` = `in_proj_a`, `ssm_beta` = `in_proj_b`, `ssm_a` = `A_log`, `ssm_dt.bias`
//! = `dt_bias`, `ssm_conv1d` = `conv1d`, `ssm_norm` = `norm`, `ssm_out` = `out_proj`. The MTP layers
//! are blocks `n_layer..n_layer + nextn_predict_layers`: their layer tensors are `mtp.layers.i.*`, and
//! `nextn.eh_proj` = `mtp.fc`, `nextn.enorm` = `mtp.pre_fc_norm_embedding`, `nextn.hnorm` =
//! `mtp.pre_fc_norm_hidden`, `nextn.shared_head_norm` = `mtp.norm`. MoE (qwen35moe): `ffn_gate_inp` =
//! `mlp.gate`, `ffn_{gate,up,down}_shexp` = `mlp.shared_expert.{gate,up,down}_proj`,
//! `ffn_gate_inp_shexp` = `mlp.shared_expert_gate`, and the 3-D `ffn_{gate,up,down}_exps` `[E, rows,
//! cols]` (or a fused `ffn_gate_up_exps`, gate rows first) are split per expert into
//! `mlp.experts.{e}.{gate,up,down}_proj` — each a contiguous byte range of whole rows, so whole blocks.
//! qwen3next: as qwen35moe without the value-head reordering, and `ssm_ba` (fused per key head) =
//! `in_proj_b` + `in_proj_a`.
//!
//! Invariant: [`map_tensor`] is a pure function of the name and the layout; a name it does not know
//! is `None` (the caller keeps such tensors under their GGUF names, visible but unused).

use super::convert::{HeadAxis, Transform};

/// The architectures read (`general.architecture`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    Qwen3,
    Qwen3Moe,
    Qwen35,
    Qwen35Moe,
    Qwen3Next,
}

impl Arch {
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "qwen3" => Some(Arch::Qwen3),
            "qwen3moe" => Some(Arch::Qwen3Moe),
            "qwen35" => Some(Arch::Qwen35),
            "qwen35moe" => Some(Arch::Qwen35Moe),
            "qwen3next" => Some(Arch::Qwen3Next),
            _ => None,
        }
    }

    /// Zero-centred RMSNorm weights (stored `+1` by the converter).
    fn norms_plus_one(self) -> bool {
        !matches!(self, Arch::Qwen3 | Arch::Qwen3Moe)
    }

    /// The converter tiles GDN value heads (qwen35 and qwen35moe; not qwen3next).
    fn tiles_value_heads(self) -> bool {
        matches!(self, Arch::Qwen35 | Arch::Qwen35Moe)
    }

    fn is_moe(self) -> bool {
        matches!(self, Arch::Qwen3Moe | Arch::Qwen35Moe | Arch::Qwen3Next)
    }
}

/// Sizes the name mapping depends on.
#[derive(Debug, Clone, Copy)]
pub struct Layout {
    pub arch: Arch,
    /// Decoder layers, MTP blocks excluded.
    pub n_layer: usize,
    pub nextn_layers: usize,
    /// GDN heads `(key heads, value heads, key dim, value dim)`, for qwen35.
    pub gdn: Option<(usize, usize, usize, usize)>,
}

/// A GGUF tensor as the Hugging Face checkpoint had it.
#[derive(Debug, Clone, PartialEq)]
pub struct Mapped {
    pub hf_name: String,
    /// Transforms in the order to apply them.
    pub transforms: Vec<Transform>,
    /// Insert a unit dimension at 1 (conv1d `[C, K]` -> `[C, 1, K]`).
    pub unsqueeze_1: bool,
    /// A 3-D expert tensor: `hf_name` is the prefix `...mlp.experts.`; expert `e`'s rows are split
    /// evenly into these parts, part `k` named `{hf_name}{e}.{expert_parts[k]}`.
    pub expert_parts: &'static [&'static str],
    /// qwen3next's `ssm_ba`: `(key heads, value heads per key head)`; `hf_name` is the prefix
    /// `...linear_attn.in_proj_`, the pieces `b.weight` and `a.weight` (`TakeGroupRows`).
    pub ba_groups: Option<(usize, usize)>,
}

const TOP: [(&str, &str); 3] = [
    ("token_embd.weight", "model.embed_tokens.weight"),
    ("output_norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
];

const ATTENTION: [(&str, &str); 9] = [
    ("attn_norm.weight", "input_layernorm.weight"),
    ("attn_q.weight", "self_attn.q_proj.weight"),
    ("attn_k.weight", "self_attn.k_proj.weight"),
    ("attn_v.weight", "self_attn.v_proj.weight"),
    ("attn_output.weight", "self_attn.o_proj.weight"),
    ("attn_q_norm.weight", "self_attn.q_norm.weight"),
    ("attn_k_norm.weight", "self_attn.k_norm.weight"),
    ("attn_q.bias", "self_attn.q_proj.bias"),
    ("attn_k.bias", "self_attn.k_proj.bias"),
];

const MLP: [(&str, &str); 3] = [
    ("ffn_gate.weight", "mlp.gate_proj.weight"),
    ("ffn_up.weight", "mlp.up_proj.weight"),
    ("ffn_down.weight", "mlp.down_proj.weight"),
];

const GDN: [(&str, &str); 9] = [
    ("attn_qkv.weight", "linear_attn.in_proj_qkv.weight"),
    ("attn_gate.weight", "linear_attn.in_proj_z.weight"),
    ("ssm_alpha.weight", "linear_attn.in_proj_a.weight"),
    ("ssm_beta.weight", "linear_attn.in_proj_b.weight"),
    ("ssm_a", "linear_attn.A_log"),
    ("ssm_dt.bias", "linear_attn.dt_bias"),
    ("ssm_conv1d.weight", "linear_attn.conv1d.weight"),
    ("ssm_norm.weight", "linear_attn.norm.weight"),
    ("ssm_out.weight", "linear_attn.out_proj.weight"),
];

const MOE: [(&str, &str); 5] = [
    ("ffn_gate_inp.weight", "mlp.gate.weight"),
    ("ffn_gate_inp_shexp.weight", "mlp.shared_expert_gate.weight"),
    (
        "ffn_gate_shexp.weight",
        "mlp.shared_expert.gate_proj.weight",
    ),
    ("ffn_up_shexp.weight", "mlp.shared_expert.up_proj.weight"),
    (
        "ffn_down_shexp.weight",
        "mlp.shared_expert.down_proj.weight",
    ),
];

/// 3-D expert tensors and the per-expert parts their rows split into.
const EXPERTS: [(&str, &[&str]); 4] = [
    ("ffn_gate_exps.weight", &["gate_proj.weight"]),
    ("ffn_up_exps.weight", &["up_proj.weight"]),
    ("ffn_down_exps.weight", &["down_proj.weight"]),
    (
        "ffn_gate_up_exps.weight",
        &["gate_proj.weight", "up_proj.weight"],
    ),
];

const NEXTN: [(&str, &str); 4] = [
    ("nextn.eh_proj.weight", "mtp.fc.weight"),
    ("nextn.enorm.weight", "mtp.pre_fc_norm_embedding.weight"),
    ("nextn.hnorm.weight", "mtp.pre_fc_norm_hidden.weight"),
    ("nextn.shared_head_norm.weight", "mtp.norm.weight"),
];

fn lookup(table: &[(&str, &'static str)], name: &str) -> Option<&'static str> {
    table.iter().find(|(g, _)| *g == name).map(|(_, h)| *h)
}

/// The Hugging Face name and inverse transforms of GGUF tensor `name`, or `None` when unknown.
pub fn map_tensor(name: &str, layout: &Layout) -> Option<Mapped> {
    if let Some(m) = map_experts(name, layout) {
        return Some(m);
    }
    if let Some(m) = map_fused_ba(name, layout) {
        return Some(m);
    }
    let hf_name = if let Some(hf) = lookup(&TOP, name) {
        hf.to_string()
    } else {
        let rest = name.strip_prefix("blk.")?;
        let (block, suffix) = rest.split_once('.')?;
        let block: usize = block.parse().ok()?;
        let mtp = block.checked_sub(layout.n_layer);
        if let Some(i) = mtp.filter(|&i| i < layout.nextn_layers) {
            if let Some(hf) = lookup(&NEXTN, suffix) {
                // Only the first MTP block carries the shared head in our layout.
                if i != 0 {
                    return None;
                }
                hf.to_string()
            } else {
                format!("mtp.layers.{i}.{}", layer_tensor(suffix, layout.arch)?)
            }
        } else if block < layout.n_layer {
            format!(
                "model.layers.{block}.{}",
                layer_tensor(suffix, layout.arch)?
            )
        } else {
            return None;
        }
    };
    let mut transforms = Vec::new();
    // The converter tests its own (renamed) names: every `*norm.weight` but the GDN's `ssm_norm`.
    if layout.arch.norms_plus_one()
        && name.ends_with("norm.weight")
        && !name.ends_with("ssm_norm.weight")
    {
        transforms.push(Transform::MinusOne);
    }
    if hf_name.ends_with(".A_log") {
        transforms.push(Transform::LogOfNegated);
    }
    let tiled = layout
        .gdn
        .filter(|&(hk, hv, ..)| layout.arch.tiles_value_heads() && hk != hv && hk > 0);
    if let Some((hk, hv, dk, dv)) = tiled {
        let r = hv / hk;
        let ungroup = |axis, head_dim| Transform::UngroupValueHeads {
            axis,
            key_heads: hk,
            values_per_key: r,
            head_dim,
        };
        let rows = |start| HeadAxis::Rows { start };
        let t = if hf_name.ends_with("in_proj_qkv.weight") || hf_name.ends_with("conv1d.weight") {
            Some(ungroup(rows(2 * hk * dk), dv))
        } else if hf_name.ends_with("in_proj_z.weight") {
            Some(ungroup(rows(0), dv))
        } else if hf_name.ends_with("in_proj_a.weight")
            || hf_name.ends_with("in_proj_b.weight")
            || hf_name.ends_with(".A_log")
            || hf_name.ends_with(".dt_bias")
        {
            Some(ungroup(rows(0), 1))
        } else if hf_name.ends_with("linear_attn.out_proj.weight") {
            Some(ungroup(HeadAxis::Columns, dv))
        } else {
            None
        };
        transforms.extend(t);
    }
    let unsqueeze_1 = hf_name.ends_with("linear_attn.conv1d.weight");
    Some(Mapped {
        hf_name,
        transforms,
        unsqueeze_1,
        expert_parts: &[],
        ba_groups: None,
    })
}

/// qwen3next's `blk.N.ssm_ba.weight` (decoder and MTP blocks alike).
fn map_fused_ba(name: &str, layout: &Layout) -> Option<Mapped> {
    let (hk, hv, ..) = layout.gdn.filter(|_| layout.arch == Arch::Qwen3Next)?;
    let block: usize = name
        .strip_prefix("blk.")?
        .strip_suffix(".ssm_ba.weight")?
        .parse()
        .ok()?;
    let prefix = match block.checked_sub(layout.n_layer) {
        Some(i) if i < layout.nextn_layers => format!("mtp.layers.{i}.linear_attn.in_proj_"),
        Some(_) => return None,
        None => format!("model.layers.{block}.linear_attn.in_proj_"),
    };
    if hk == 0 || !hv.is_multiple_of(hk) {
        return None;
    }
    Some(Mapped {
        hf_name: prefix,
        transforms: Vec::new(),
        unsqueeze_1: false,
        expert_parts: &[],
        ba_groups: Some((hk, hv / hk)),
    })
}

/// `blk.N.ffn_*_exps.weight` of an MoE architecture: the per-expert prefix and parts.
fn map_experts(name: &str, layout: &Layout) -> Option<Mapped> {
    if !layout.arch.is_moe() {
        return None;
    }
    let (block, suffix) = name.strip_prefix("blk.")?.split_once('.')?;
    let parts = EXPERTS.iter().find(|(g, _)| *g == suffix)?.1;
    let block: usize = block.parse().ok()?;
    let prefix = match block.checked_sub(layout.n_layer) {
        Some(i) if i < layout.nextn_layers => format!("mtp.layers.{i}.mlp.experts."),
        Some(_) => return None,
        None => format!("model.layers.{block}.mlp.experts."),
    };
    Some(Mapped {
        hf_name: prefix,
        transforms: Vec::new(),
        unsqueeze_1: false,
        expert_parts: parts,
        ba_groups: None,
    })
}

/// The per-layer part of a Hugging Face name for the per-block GGUF `suffix`.
fn layer_tensor(suffix: &str, arch: Arch) -> Option<&'static str> {
    let post_norm = match arch {
        Arch::Qwen3 | Arch::Qwen3Moe => "ffn_norm.weight",
        Arch::Qwen35 | Arch::Qwen35Moe | Arch::Qwen3Next => "post_attention_norm.weight",
    };
    if suffix == post_norm {
        return Some("post_attention_layernorm.weight");
    }
    lookup(&ATTENTION, suffix)
        .or_else(|| lookup(&MLP, suffix))
        .or_else(|| match arch {
            Arch::Qwen35 => lookup(&GDN, suffix),
            Arch::Qwen35Moe | Arch::Qwen3Next => {
                lookup(&GDN, suffix).or_else(|| lookup(&MOE, suffix))
            }
            // Only the router: qwen3moe has no shared expert and no GDN.
            Arch::Qwen3Moe => lookup(&MOE[..1], suffix),
            Arch::Qwen3 => None,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_transforms() {
        let layout = Layout {
            arch: Arch::Qwen35,
            n_layer: 8,
            nextn_layers: 1,
            gdn: Some((4, 8, 48, 48)),
        };
        let m = map_tensor("blk.8.nextn.eh_proj.weight", &layout).unwrap();
        assert_eq!(m.hf_name, "mtp.fc.weight");
        let m = map_tensor("blk.8.nextn.enorm.weight", &layout).unwrap();
        assert_eq!(m.hf_name, "mtp.pre_fc_norm_embedding.weight");
        assert_eq!(m.transforms, [Transform::MinusOne]);
        let m = map_tensor("blk.8.attn_q_norm.weight", &layout).unwrap();
        assert_eq!(m.hf_name, "mtp.layers.0.self_attn.q_norm.weight");
        assert_eq!(m.transforms, [Transform::MinusOne]);
        let m = map_tensor("blk.0.ssm_norm.weight", &layout).unwrap();
        assert!(m.transforms.is_empty());
        let m = map_tensor("blk.0.ssm_a", &layout).unwrap();
        assert_eq!(m.hf_name, "model.layers.0.linear_attn.A_log");
        assert_eq!(m.transforms.len(), 2);
        assert!(
            map_tensor("blk.0.ssm_conv1d.weight", &layout)
                .unwrap()
                .unsqueeze_1
        );
        assert!(map_tensor("blk.9.attn_q.weight", &layout).is_none());
        assert!(map_tensor("v.blk.0.attn_q.weight", &layout).is_none());
        let qwen3 = Layout {
            arch: Arch::Qwen3,
            n_layer: 2,
            nextn_layers: 0,
            gdn: None,
        };
        let moe = Layout {
            arch: Arch::Qwen35Moe,
            ..layout
        };
        let m = map_tensor("blk.2.ffn_gate_up_exps.weight", &moe).unwrap();
        assert_eq!(m.hf_name, "model.layers.2.mlp.experts.");
        assert_eq!(m.expert_parts, ["gate_proj.weight", "up_proj.weight"]);
        let m = map_tensor("blk.8.ffn_down_exps.weight", &moe).unwrap();
        assert_eq!(m.hf_name, "mtp.layers.0.mlp.experts.");
        let m = map_tensor("blk.0.ffn_gate_inp_shexp.weight", &moe).unwrap();
        assert_eq!(m.hf_name, "model.layers.0.mlp.shared_expert_gate.weight");
        assert!(map_tensor("blk.0.ffn_gate_exps.weight", &layout).is_none());
        let next = Layout {
            arch: Arch::Qwen3Next,
            ..layout
        };
        let m = map_tensor("blk.0.ssm_ba.weight", &next).unwrap();
        assert_eq!(m.hf_name, "model.layers.0.linear_attn.in_proj_");
        assert_eq!(m.ba_groups, Some((4, 2)));
        let m = map_tensor("blk.0.attn_qkv.weight", &next).unwrap();
        assert!(
            m.transforms.is_empty(),
            "qwen3next keeps grouped value heads"
        );
        let m = map_tensor("blk.1.ffn_norm.weight", &qwen3).unwrap();
        assert_eq!(m.hf_name, "model.layers.1.post_attention_layernorm.weight");
        assert!(m.transforms.is_empty());
        assert!(map_tensor("blk.1.ffn_gate_inp.weight", &qwen3).is_none());
        let qwen3moe = Layout {
            arch: Arch::Qwen3Moe,
            ..qwen3
        };
        let m = map_tensor("blk.1.ffn_gate_inp.weight", &qwen3moe).unwrap();
        assert_eq!(m.hf_name, "model.layers.1.mlp.gate.weight");
        let m = map_tensor("blk.0.ffn_up_exps.weight", &qwen3moe).unwrap();
        assert_eq!(m.hf_name, "model.layers.0.mlp.experts.");
        assert_eq!(m.expert_parts, ["up_proj.weight"]);
        let m = map_tensor("blk.1.attn_k_norm.weight", &qwen3moe).unwrap();
        assert_eq!(m.hf_name, "model.layers.1.self_attn.k_norm.weight");
        assert!(
            m.transforms.is_empty(),
            "plain RMSNorm weights are stored as is"
        );
        let m = map_tensor("blk.0.ffn_norm.weight", &qwen3moe).unwrap();
        assert_eq!(m.hf_name, "model.layers.0.post_attention_layernorm.weight");
        assert!(map_tensor("blk.0.ffn_gate_inp_shexp.weight", &qwen3moe).is_none());
        assert!(map_tensor("blk.2.ffn_gate_exps.weight", &qwen3moe).is_none());
    }
}
