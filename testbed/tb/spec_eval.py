"""Acceptance of the MTP head and the DFlash drafter at temperature 0, measured in PyTorch.

At temperature 0 speculative decoding commits exactly the target's greedy continuation, so the loop can
be simulated on a precomputed sequence S = prompt + greedy continuation: a round starts at the index p
of the last committed token (the target has processed S[0..p-1]); the drafter proposes S[p+1..p+k]
from what it may see at that point; `accepted` = length of the matching prefix; the next round starts at
p + accepted + 1. Target features come from one causal forward over S (the same values an incremental
verify produces, up to rounding). Only rounds whose k proposals all lie inside S are counted, so every
round contributes to every position. Reported per position i: P(first i proposals accepted) and
P(proposal i accepted | first i-1 accepted); tokens per verify = mean(accepted + 1).

MTP chaining: proposal 1 is the MTP output at position p-1 from (h_{p-1}, S[p]) with its KV cache of
committed pairs (positions 0..p-2); proposal j >= 2 is the MTP at position p+j-2 from (o_{j-1}, d_{j-1}),
o = the previous step's post-mtp.norm output, attending to committed positions 0..p-1 and the chain.
"""

from __future__ import annotations

import torch

from .model import attend, rope_cos_sin, run_target, text_position_ids


@torch.no_grad()
def greedy_continue(model, prompts: torch.Tensor, new_tokens: int, batch: int) -> torch.Tensor:
    """prompts [N,P] -> [N, P+new_tokens], greedy, with the model's own cache (transformers generate)."""
    outs = []
    for i in range(0, prompts.shape[0], batch):
        x = prompts[i:i + batch]
        y = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                           do_sample=False, pad_token_id=0, eos_token_id=None, use_cache=True)
        outs.append(y)
    return torch.cat(outs, dim=0)


class Tally:
    def __init__(self, k: int):
        self.k = k
        self.rounds = 0
        self.accepted_total = 0
        self.reached = [0] * k
        self.accepted = [0] * k

    def add(self, acc: torch.Tensor) -> None:
        for a in acc.tolist():
            self.rounds += 1
            self.accepted_total += a
            for i in range(self.k):
                if a >= i:
                    self.reached[i] += 1
                if a >= i + 1:
                    self.accepted[i] += 1

    def summary(self) -> dict:
        r = max(self.rounds, 1)
        return {
            "drafts_per_round": self.k,
            "rounds": self.rounds,
            "tokens_per_verify": round(1 + self.accepted_total / r, 4),
            "p_accept_through_position": [round(a / r, 4) for a in self.accepted],
            "p_accept_position_given_previous": [round(a / max(n, 1), 4) for a, n in zip(self.accepted, self.reached)],
        }


def match_length(proposals: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    return (proposals == truth).long().cumprod(dim=1).sum(dim=1)


@torch.no_grad()
def simulate_mtp(model, mtp, seq: torch.Tensor, start: int, k: int) -> dict:
    """seq [N,L] = prompt (start tokens) + greedy continuation. Returns Tally summary."""
    n, length = seq.shape
    dev = seq.device
    hidden, _ = run_target(model, seq)  # [N,L,H]
    embed = model.model.embed_tokens
    w = model.lm_head.weight
    pos = text_position_ids(n, length - 1, device=dev)
    cos, sin = model.model.rotary_emb(hidden, pos)  # [N,L-1,r]
    u = mtp.fuse(embed(seq[:, 1:]), hidden[:, :-1])  # row t: (x_{t+1}, h_t) at position t
    q, kk, vv, gate = mtp.layer_qkv(u, cos, sin)
    o_tf = mtp.layer_finish(u, attend(q, kk, vv, causal=True), gate)  # [N,L-1,H]
    tally = Tally(k)
    p = torch.full((n,), start, device=dev, dtype=torch.long)
    rows = torch.arange(n, device=dev)
    while True:
        active = rows[p + k <= length - 1]
        if active.numel() == 0:
            break
        pa = p[active]
        o = o_tf[active, pa - 1]  # [A,H]
        d = (o @ w.T).argmax(-1)
        props = [d]
        chain_k, chain_v = [], []
        key_pos = torch.arange(length - 1, device=dev)
        for j in range(2, k + 1):
            qpos = (pa + j - 2)[:, None]  # [A,1]
            uj = mtp.fuse(embed(d)[:, None], o[:, None])  # [A,1,H]
            c, s = model.model.rotary_emb(uj, qpos[None].expand(3, -1, -1))
            qj, kj, vj, gj = mtp.layer_qkv(uj, c, s)
            chain_k.append(kj)
            chain_v.append(vj)
            keys = torch.cat([kk[active]] + chain_k, dim=2)
            vals = torch.cat([vv[active]] + chain_v, dim=2)
            ctx_ok = key_pos[None, :] < pa[:, None]  # committed positions 0..p-1
            chain_ok = torch.ones(active.numel(), len(chain_k), dtype=torch.bool, device=dev)
            mask = torch.cat([ctx_ok, chain_ok], dim=1)[:, None, None, :]
            o = mtp.layer_finish(uj, attend(qj, keys, vals, mask=mask), gj)[:, 0]
            d = (o @ w.T).argmax(-1)
            props.append(d)
        proposals = torch.stack(props, dim=1)  # [A,k]
        truth = seq[active[:, None], pa[:, None] + torch.arange(1, k + 1, device=dev)[None]]
        acc = match_length(proposals, truth)
        tally.add(acc)
        p[active] = pa + acc + 1
    return tally.summary()


@torch.no_grad()
def simulate_dflash(model, drafter, seq: torch.Tensor, start: int) -> dict:
    n, length = seq.shape
    dev = seq.device
    blk = drafter.block_size
    _, taps = run_target(model, seq, drafter.target_layer_ids)
    ctx = drafter.context(taps)  # [N,L,H]
    ctx_kv = drafter.context_kv(ctx, torch.arange(length, device=dev)[None].expand(n, -1))
    embed = model.model.embed_tokens
    w = model.lm_head.weight
    tally = Tally(blk - 1)
    p = torch.full((n,), start, device=dev, dtype=torch.long)
    rows = torch.arange(n, device=dev)
    offs = torch.arange(blk, device=dev)
    while True:
        active = rows[p + blk - 1 <= length - 1]
        if active.numel() == 0:
            break
        pa = p[active]
        ids = torch.full((active.numel(), blk), drafter.mask_token_id, device=dev, dtype=torch.long)
        ids[:, 0] = seq[active, pa]
        ctx_ok = torch.arange(length, device=dev)[None, :] < pa[:, None]  # [A,L]
        mask = torch.cat([ctx_ok[:, None, :].expand(-1, blk, -1),
                          torch.ones(active.numel(), blk, blk, dtype=torch.bool, device=dev)], dim=2)[:, None]
        kv = [(k[active], v[active]) for k, v in ctx_kv]
        out = drafter(embed(ids), pa[:, None] + offs[None], kv, mask)
        proposals = (out[:, 1:] @ w.T).argmax(-1)  # [A,blk-1]
        truth = seq[active[:, None], pa[:, None] + offs[None, 1:]]
        acc = match_length(proposals, truth)
        tally.add(acc)
        p[active] = pa + acc + 1
    return tally.summary()


def distinct_ngram_ratio(seq: torch.Tensor, start: int, n: int = 4) -> float:
    """Share of distinct n-grams among the continuation's n-grams (1.0 = no repetition)."""
    total = distinct = 0
    for row in seq[:, start:].tolist():
        grams = [tuple(row[i:i + n]) for i in range(len(row) - n + 1)]
        total += len(grams)
        distinct += len(set(grams))
    return round(distinct / max(total, 1), 4)


__all__ = ["greedy_continue", "simulate_mtp", "simulate_dflash", "distinct_ngram_ratio", "rope_cos_sin"]
