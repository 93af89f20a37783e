"""f32 reference outputs of the exported model, computed by transformers from the exported bf16 files.

The Rust parity test loads the same files: prompt ids, the target's logits for the last positions, a
32-token greedy continuation, the MTP head's teacher-forced logits for its last rows and the DFlash
drafter's logits for one block anchored at the last prompt token. Everything is computed in float32
(weights upcast from bf16, TF32 off), with the eager attention path.
"""

from __future__ import annotations

import json
import os

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import Qwen3_5ForCausalLM

from .model import DFlashDrafter, MtpHead, attend, run_target, text_position_ids

REFERENCE_PROMPT = (
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    a, b = 0, 1\n"
    "    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n"
    "Call me Ishmael. Some years ago, never mind how long precisely, I thought I would"
)
LAST_ROWS = 4
GREEDY_TOKENS = 32


def load_mtp(model_dir: str, cfg) -> MtpHead:
    with open(os.path.join(model_dir, "model.safetensors.index.json")) as f:
        index = json.load(f)
    state = {}
    for name, fname in index["weight_map"].items():
        if name.startswith("mtp."):
            with safe_open(os.path.join(model_dir, fname), "pt") as sf:
                state[name[len("mtp."):]] = sf.get_tensor(name).float()
    mtp = MtpHead(cfg)
    mtp.load_state_dict(state, strict=True)
    return mtp


def load_dflash(dflash_dir: str) -> DFlashDrafter:
    with open(os.path.join(dflash_dir, "config.json")) as f:
        c = json.load(f)
    d = DFlashDrafter(c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["num_attention_heads"],
                      c["num_key_value_heads"], c["head_dim"], c["dflash_config"]["target_layer_ids"],
                      c["block_size"], c["dflash_config"]["mask_token_id"], c["rope_theta"], c["rms_norm_eps"])
    with safe_open(os.path.join(dflash_dir, "model.safetensors"), "pt") as sf:
        state = {k: sf.get_tensor(k).float() for k in sf.keys()}
    d.load_state_dict(state, strict=True)
    return d


@torch.no_grad()
def make_reference(model_dir: str, tokenizer, device, out_dir: str) -> dict:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model, info = Qwen3_5ForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager",
                                                     output_loading_info=True)
    model = model.to(device).eval()
    mtp = load_mtp(model_dir, model.config).to(device).eval()
    drafter = load_dflash(os.path.join(model_dir, "dflash")).to(device).eval()

    ids = tokenizer.encode(REFERENCE_PROMPT, add_special_tokens=False).ids
    x = torch.tensor([ids], device=device)
    t = x.shape[1]
    logits = model(input_ids=x).logits[0].float()  # [T,V]
    greedy = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=GREEDY_TOKENS,
                            min_new_tokens=GREEDY_TOKENS, do_sample=False, pad_token_id=0, eos_token_id=None)
    greedy = greedy[0, t:].tolist()

    hidden, taps = run_target(model, x, drafter.target_layer_ids)
    cos, sin = model.model.rotary_emb(hidden, text_position_ids(1, t - 1, device=device))
    o = mtp(model.model.embed_tokens(x[:, 1:]), hidden[:, :-1], cos, sin)  # rows t = 0..T-2
    mtp_logits = model.lm_head(o)[0].float()  # row t predicts x_{t+2}

    blk = drafter.block_size
    anchor = t - 1
    ctx = drafter.context({k: v[:, :anchor] for k, v in taps.items()})  # context positions 0..T-2
    ctx_kv = drafter.context_kv(ctx, torch.arange(anchor, device=device)[None])
    block_ids = torch.full((1, blk), drafter.mask_token_id, device=device)
    block_ids[0, 0] = x[0, anchor]
    mask = torch.ones(1, 1, blk, anchor + blk, dtype=torch.bool, device=device)
    out = drafter(model.model.embed_tokens(block_ids), anchor + torch.arange(blk, device=device)[None], ctx_kv, mask)
    dflash_logits = model.lm_head(out)[0].float()  # [blk,V]; rows 1.. are proposals for x_{T}, x_{T+1}, ...

    tensors = {
        "prompt_ids": torch.tensor(ids, dtype=torch.int64),
        "target_logits_last": logits[-LAST_ROWS:].contiguous().cpu(),
        "mtp_logits_last": mtp_logits[-LAST_ROWS:].contiguous().cpu(),
        "dflash_block_logits": dflash_logits.contiguous().cpu(),
        "greedy_ids": torch.tensor(greedy, dtype=torch.int64),
    }
    save_file(tensors, os.path.join(out_dir, "reference.safetensors"), metadata={"format": "pt"})
    desc = {
        "prompt": REFERENCE_PROMPT,
        "prompt_ids": ids,
        "prompt_len": t,
        "dtype": "float32 compute, weights upcast from the exported bf16 files; eager attention; TF32 off",
        "target_logits_last": {"rows": list(range(t - LAST_ROWS, t)),
                               "meaning": "row r = logits for token r+1 given prompt tokens 0..r",
                               "argmax": logits[-LAST_ROWS:].argmax(-1).tolist()},
        "mtp_logits_last": {"rows": list(range(t - 1 - LAST_ROWS, t - 1)),
                            "meaning": "row r: MTP at position r from (embed(x_{r+1}), final-norm h_r), teacher-forced "
                                       "over rows 0..r (its own KV cache), logits for x_{r+2}",
                            "argmax": mtp_logits[-LAST_ROWS:].argmax(-1).tolist()},
        "dflash_block_logits": {"anchor_position": anchor,
                                "meaning": "block [x_anchor, mask x (B-1)] at positions anchor..anchor+B-1, "
                                           "context = target layer taps at positions 0..anchor-1; row i>=1 "
                                           "proposes token anchor+i",
                                "argmax": dflash_logits.argmax(-1).tolist()},
        "greedy_ids": greedy,
        "greedy_text": tokenizer.decode(greedy, skip_special_tokens=False),
        "loading_info": {k: sorted(v) if isinstance(v, (list, set)) else str(v) for k, v in info.items()},
    }
    with open(os.path.join(out_dir, "reference.json"), "w") as f:
        json.dump(desc, f, indent=1)
        f.write("\n")
    torch.backends.cuda.matmul.allow_tf32 = True
    return desc


__all__ = ["make_reference", "load_mtp", "load_dflash", "attend"]
