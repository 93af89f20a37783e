"""The testbed's three networks: the Qwen3.5 target, its MTP head, and the DFlash drafter.

Target: transformers' `Qwen3_5ForCausalLM` (GDN + gated attention, 3:1), run through `run_target`, which
returns the final-norm hidden states and the outputs of chosen decoder layers (forward hooks).

MTP head (`mtp.*`, Qwen3.5 / Qwen3-Next convention, the one vLLM's qwen3_next_mtp.py runs):
    u_t   = fc(cat[pre_fc_norm_embedding(embed(x_{t+1})), pre_fc_norm_hidden(h_t)])   # [.., 2H] -> [.., H]
    o_t   = norm(DecoderLayer_full_attention(u_t; RoPE position t, causal over the MTP's own positions))
    logits(x_{t+2}) = lm_head(o_t)
h_t is the target's hidden state AFTER its final norm; all norms are Qwen3.5's zero-centred RMSNorm
(x_hat * (1 + w)); the layer is a target full-attention decoder layer (gated attention, q/k norm, partial
RoPE). Chained drafting feeds o_t (post mtp.norm) back as the next step's h.

DFlash drafter (z-lab's architecture, re-implemented): Qwen3-style layers (plain RMSNorm x_hat * w, full
RoPE, no attention gate). Context features c_j = hidden_norm(fc(cat[taps_l(j) for l in target_layer_ids]))
for committed positions j < p; the block is [x_p, mask * (B-1)] at positions p..p+B-1, embedded with the
target's embed_tokens; each layer's keys/values = its k_proj/v_proj of [context; block] (k_norm, RoPE at
their positions); the block attends to all context keys and, non-causally, to the whole block; output via
`norm` and the target's lm_head; proposal i = argmax of block row i (i = 1..B-1).
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import (
    Qwen3_5DecoderLayer,
    Qwen3_5RMSNorm,
    apply_rotary_pos_emb,
)

# ---------------------------------------------------------------------------------------------------
# Target
# ---------------------------------------------------------------------------------------------------

TARGET_CONFIG = dict(
    vocab_size=8192,
    hidden_size=384,
    intermediate_size=1024,
    num_hidden_layers=8,
    num_attention_heads=6,
    num_key_value_heads=2,
    head_dim=64,
    linear_num_key_heads=4,
    linear_num_value_heads=8,
    linear_key_head_dim=48,
    linear_value_head_dim=48,
    linear_conv_kernel_dim=4,
    max_position_embeddings=2048,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    rope_parameters={
        "rope_type": "default",
        "rope_theta": 10_000_000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [3, 3, 2],  # 16 rotary dims = 8 frequencies; text-only: all sections equal
        "mrope_interleaved": True,
    },
    bos_token_id=None,
    eos_token_id=0,
    pad_token_id=0,
)


def make_target_config(**overrides) -> Qwen3_5TextConfig:
    kw = copy.deepcopy(TARGET_CONFIG)
    kw.update(overrides)
    cfg = Qwen3_5TextConfig(**kw)
    cfg.mtp_num_hidden_layers = 1
    return cfg


def make_target(cfg: Qwen3_5TextConfig) -> Qwen3_5ForCausalLM:
    cfg._attn_implementation = "sdpa"
    return Qwen3_5ForCausalLM(cfg)


def text_position_ids(batch: int, length: int, start: int = 0, device=None) -> torch.Tensor:
    """[3, batch, length] positions, the shape Qwen3.5's (m)RoPE module takes for text."""
    pos = torch.arange(start, start + length, device=device)
    return pos.view(1, 1, -1).expand(3, batch, -1)


def run_target(model: Qwen3_5ForCausalLM, input_ids: torch.Tensor, tap_layers=()):
    """Full forward without cache. Returns (final-norm hidden [B,T,H], {layer: output [B,T,H]})."""
    taps: dict[int, torch.Tensor] = {}
    handles = []
    for layer_id in tap_layers:
        def hook(_mod, _inp, out, layer_id=layer_id):
            taps[layer_id] = out[0] if isinstance(out, tuple) else out
        handles.append(model.model.layers[layer_id].register_forward_hook(hook))
    try:
        hidden = model.model(input_ids=input_ids, use_cache=False).last_hidden_state
    finally:
        for h in handles:
            h.remove()
    return hidden, taps


# ---------------------------------------------------------------------------------------------------
# MTP head
# ---------------------------------------------------------------------------------------------------


def gated_attention_qkv(attn, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Qwen3.5 gated attention up to RoPE. x [B,T,H] (already input-normed).
    Returns q [B,h,T,d], k [B,kv,T,d], v [B,kv,T,d], gate [B,T,h*d]."""
    b, t, _ = x.shape
    d = attn.head_dim
    q, gate = torch.chunk(attn.q_proj(x).view(b, t, -1, d * 2), 2, dim=-1)
    gate = gate.reshape(b, t, -1)
    q = attn.q_norm(q).transpose(1, 2)
    k = attn.k_norm(attn.k_proj(x).view(b, t, -1, d)).transpose(1, 2)
    v = attn.v_proj(x).view(b, t, -1, d).transpose(1, 2)
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    return q, k, v, gate


def attend(q, k, v, mask=None, causal=False):
    """SDPA with grouped KV heads. q [B,h,Tq,d], k/v [B,kv,Tk,d], mask bool [B,1|h,Tq,Tk] (True = attend)."""
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None)


class MtpHead(nn.Module):
    """Qwen3.5 MTP module with one full-attention layer; parameter names are the checkpoint's `mtp.*`."""

    def __init__(self, cfg: Qwen3_5TextConfig):
        super().__init__()
        h = cfg.hidden_size
        layer_cfg = copy.deepcopy(cfg)
        layer_cfg.layer_types = ["full_attention"]
        layer_cfg.num_hidden_layers = 1
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.pre_fc_norm_embedding = Qwen3_5RMSNorm(h, eps=cfg.rms_norm_eps)
        self.pre_fc_norm_hidden = Qwen3_5RMSNorm(h, eps=cfg.rms_norm_eps)
        self.layers = nn.ModuleList([Qwen3_5DecoderLayer(layer_cfg, 0)])
        self.norm = Qwen3_5RMSNorm(h, eps=cfg.rms_norm_eps)
        std = cfg.initializer_range
        for mod in self.modules():
            if isinstance(mod, nn.Linear):
                nn.init.normal_(mod.weight, std=std)

    def fuse(self, emb_next: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.cat([self.pre_fc_norm_embedding(emb_next), self.pre_fc_norm_hidden(hidden)], -1))

    def layer_qkv(self, u, cos, sin):
        layer = self.layers[0]
        return gated_attention_qkv(layer.self_attn, layer.input_layernorm(u), cos, sin)

    def layer_finish(self, u, attn_out, gate):
        """Residual + gate + o_proj + MLP + final norm. attn_out [B,h,T,d]."""
        layer = self.layers[0]
        b, _, t, _ = attn_out.shape
        a = attn_out.transpose(1, 2).reshape(b, t, -1) * torch.sigmoid(gate)
        x = u + layer.self_attn.o_proj(a)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.norm(x)

    def forward(self, emb_next, hidden, cos, sin):
        """Teacher-forced: row t takes (embed(x_{t+1}), h_t) at position t; causal. Returns o [B,T,H]."""
        u = self.fuse(emb_next, hidden)
        q, k, v, gate = self.layer_qkv(u, cos, sin)
        return self.layer_finish(u, attend(q, k, v, causal=True), gate)


# ---------------------------------------------------------------------------------------------------
# DFlash drafter
# ---------------------------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    """Qwen3 RMSNorm: x_hat * w (weight starts at 1), computed in f32."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * xf.to(x.dtype)) if x.dtype != torch.float32 else self.weight * xf


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float):
    """positions [B,T] -> cos, sin [B,T,head_dim] (full rotary, rotate-half layout)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    freqs = positions.float()[..., None] * inv
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def rotate(x, cos, sin):
    """x [B,h,T,d], cos/sin [B,T,d]."""
    cos, sin = cos[:, None].to(x.dtype), sin[:, None].to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class DFlashLayer(nn.Module):
    def __init__(self, hidden: int, inter: int, heads: int, kv_heads: int, head_dim: int, eps: float):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.input_layernorm = RMSNorm(hidden, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        attn = nn.Module()
        attn.q_proj = nn.Linear(hidden, heads * head_dim, bias=False)
        attn.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        attn.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        attn.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)
        attn.q_norm = RMSNorm(head_dim, eps)
        attn.k_norm = RMSNorm(head_dim, eps)
        self.self_attn = attn
        mlp = nn.Module()
        mlp.gate_proj = nn.Linear(hidden, inter, bias=False)
        mlp.up_proj = nn.Linear(hidden, inter, bias=False)
        mlp.down_proj = nn.Linear(inter, hidden, bias=False)
        self.mlp = mlp

    def kv(self, x, cos, sin):
        """x [B,T,H] -> k (normed, rotated), v: [B,kv,T,d]."""
        b, t, _ = x.shape
        a = self.self_attn
        k = a.k_norm(a.k_proj(x).view(b, t, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = a.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        return rotate(k, cos, sin), v

    def forward(self, x, ctx_k, ctx_v, cos, sin, mask):
        """x [B,Q,H] block rows; ctx_k/ctx_v [B,kv,C,d] this layer's context keys/values;
        mask bool [B,1,Q,C+Q] over [context; block] keys."""
        b, qn, _ = x.shape
        a = self.self_attn
        xn = self.input_layernorm(x)
        q = a.q_norm(a.q_proj(xn).view(b, qn, self.heads, self.head_dim)).transpose(1, 2)
        q = rotate(q, cos, sin)
        k_blk, v_blk = self.kv(xn, cos, sin)
        k = torch.cat([ctx_k, k_blk], dim=2)
        v = torch.cat([ctx_v, v_blk], dim=2)
        o = attend(q, k, v, mask=mask).transpose(1, 2).reshape(b, qn, -1)
        x = x + a.o_proj(o)
        m = self.mlp
        h = self.post_attention_layernorm(x)
        return x + m.down_proj(F.silu(m.gate_proj(h)) * m.up_proj(h))


class DFlashDrafter(nn.Module):
    def __init__(self, hidden, inter, layers, heads, kv_heads, head_dim, target_layer_ids, block_size,
                 mask_token_id, rope_theta, eps=1e-6):
        super().__init__()
        self.target_layer_ids = list(target_layer_ids)
        self.block_size = block_size
        self.mask_token_id = mask_token_id
        self.rope_theta = rope_theta
        self.head_dim = head_dim
        self.layers = nn.ModuleList(
            [DFlashLayer(hidden, inter, heads, kv_heads, head_dim, eps) for _ in range(layers)])
        self.fc = nn.Linear(len(self.target_layer_ids) * hidden, hidden, bias=False)
        self.hidden_norm = RMSNorm(hidden, eps)
        self.norm = RMSNorm(hidden, eps)
        for mod in self.modules():
            if isinstance(mod, nn.Linear):
                nn.init.normal_(mod.weight, std=0.02)
        self.config = dict(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                           num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                           rms_norm_eps=eps)

    def context(self, taps: dict[int, torch.Tensor]) -> torch.Tensor:
        """taps {layer: [B,C,H]} -> context features [B,C,H]."""
        return self.hidden_norm(self.fc(torch.cat([taps[i] for i in self.target_layer_ids], dim=-1)))

    def context_kv(self, ctx: torch.Tensor, ctx_pos: torch.Tensor):
        """Per layer (k, v) of the context features at their positions ctx_pos [B,C]."""
        cos, sin = rope_cos_sin(ctx_pos, self.head_dim, self.rope_theta)
        return [layer.kv(ctx, cos, sin) for layer in self.layers]

    def forward(self, block_emb, block_pos, ctx_kv, mask):
        """block_emb [B,Q,H] (target embeddings of the block tokens), block_pos [B,Q], ctx_kv from
        context_kv, mask bool [B,1,Q,C+Q]. Returns normed hidden [B,Q,H] (apply the target lm_head)."""
        cos, sin = rope_cos_sin(block_pos, self.head_dim, self.rope_theta)
        x = block_emb
        for layer, (k, v) in zip(self.layers, ctx_kv):
            x = layer(x, k, v, cos, sin, mask)
        return self.norm(x)


def dflash_train_mask(anchors: torch.Tensor, ctx_len: int, block: int) -> torch.Tensor:
    """anchors [B,A] (anchor positions). Query rows are A blocks of `block` rows; keys are the C=ctx_len
    context positions then the A*block rows. Row of block a attends context j < anchor_a and every row of
    block a. Returns bool [B,1,A*block, ctx_len + A*block]."""
    b, a = anchors.shape
    dev = anchors.device
    q_block = torch.arange(a, device=dev).repeat_interleave(block)  # [A*block]
    ctx_ok = torch.arange(ctx_len, device=dev)[None, None, :] < anchors[:, q_block][..., None]  # [B,Q,C]
    blk_ok = (q_block[:, None] == q_block[None, :]).expand(b, -1, -1)  # [B,Q,Q]
    return torch.cat([ctx_ok, blk_ok], dim=-1)[:, None]


def param_count(mod: nn.Module) -> int:
    return sum(p.numel() for p in mod.parameters())


def cosine_lr(frac: float, peak: float, warmup_frac: float, floor: float = 0.1) -> float:
    if frac < warmup_frac:
        return peak * max(frac / warmup_frac, 0.01)
    x = min((frac - warmup_frac) / max(1 - warmup_frac, 1e-9), 1.0)
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * x)))
