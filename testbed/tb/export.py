"""Export in the Hugging Face layout, and the f32 reference for the Rust parity test.

models/testbed/: config.json (transformers' Qwen3_5TextConfig, model_type qwen3_5_text, plus
mtp_num_hidden_layers = 1), bf16 safetensors shards of at most 16 MiB holding the target (`model.*`,
lm_head tied to the embedding so not stored) and the MTP head (`mtp.*`), model.safetensors.index.json,
generation_config.json, the tokenizer files; dflash/: config.json (z-lab's DFlashDraftModel fields) and
model.safetensors (bf16, drafter tensors only: it shares the target's embed_tokens and lm_head).
"""

from __future__ import annotations

import json
import os

import torch
from safetensors.torch import save_file

SHARD_BYTES = 16 * 1024 * 1024 - 64 * 1024  # under 16 MiB with the header


def _shard(tensors: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    shards, cur, size = [], {}, 0
    for name in sorted(tensors):
        t = tensors[name]
        nbytes = t.numel() * t.element_size()
        if nbytes > SHARD_BYTES:
            raise ValueError(f"tensor {name} ({nbytes} bytes) does not fit one shard")
        if cur and size + nbytes > SHARD_BYTES:
            shards.append(cur)
            cur, size = {}, 0
        cur[name] = t
        size += nbytes
    if cur:
        shards.append(cur)
    return shards


def target_tensors(model, mtp) -> dict[str, torch.Tensor]:
    out = {}
    for name, t in model.state_dict().items():
        if name == "lm_head.weight":
            continue  # tied to model.embed_tokens.weight
        out[name] = t.detach().to(torch.bfloat16).contiguous().cpu()
    for name, t in mtp.state_dict().items():
        out[f"mtp.{name}"] = t.detach().to(torch.bfloat16).contiguous().cpu()
    return out


def export_target(model, mtp, cfg, out_dir: str) -> dict:
    os.makedirs(out_dir, exist_ok=True)
    for f in os.listdir(out_dir):
        if f.startswith("model-") and f.endswith(".safetensors"):
            os.remove(os.path.join(out_dir, f))
    tensors = target_tensors(model, mtp)
    shards = _shard(tensors)
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, os.path.join(out_dir, fname), metadata={"format": "pt"})
        for name, t in shard.items():
            weight_map[name] = fname
            total += t.numel() * t.element_size()
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2, sort_keys=True)
        f.write("\n")
    cfg_dict = cfg.to_diff_dict()  # what save_pretrained writes
    cfg_dict["architectures"] = ["Qwen3_5ForCausalLM"]
    cfg_dict["mtp_num_hidden_layers"] = 1
    cfg_dict["dtype"] = "bfloat16"
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg_dict, f, indent=2, sort_keys=True)
        f.write("\n")
    gen = {"bos_token_id": None, "eos_token_id": [0, 2], "pad_token_id": 0, "do_sample": False,
           "max_new_tokens": 256}
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2, sort_keys=True)
        f.write("\n")
    return {"shards": len(shards), "bytes": total, "tensors": len(tensors)}


def export_dflash(drafter, target_cfg, out_dir: str) -> dict:
    os.makedirs(out_dir, exist_ok=True)
    tensors = {n: t.detach().to(torch.bfloat16).contiguous().cpu() for n, t in drafter.state_dict().items()}
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    c = drafter.config
    cfg = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "block_size": drafter.block_size,
        "dflash_config": {"mask_token_id": drafter.mask_token_id, "target_layer_ids": drafter.target_layer_ids},
        "num_target_layers": target_cfg.num_hidden_layers,
        "hidden_size": c["hidden_size"],
        "intermediate_size": c["intermediate_size"],
        "num_hidden_layers": c["num_hidden_layers"],
        "num_attention_heads": c["num_attention_heads"],
        "num_key_value_heads": c["num_key_value_heads"],
        "head_dim": c["head_dim"],
        "rms_norm_eps": c["rms_norm_eps"],
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "rope_theta": drafter.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": drafter.rope_theta},
        "rope_scaling": None,
        "max_position_embeddings": target_cfg.max_position_embeddings,
        "max_window_layers": c["num_hidden_layers"],
        "layer_types": ["full_attention"] * c["num_hidden_layers"],
        "sliding_window": None,
        "use_sliding_window": False,
        "vocab_size": target_cfg.vocab_size,
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
        "initializer_range": 0.02,
        "use_cache": True,
    }
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    return {"bytes": sum(t.numel() * t.element_size() for t in tensors.values()), "tensors": len(tensors)}


def dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
