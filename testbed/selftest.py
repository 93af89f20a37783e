"""CPU checks of the testbed code against independent references (run before spending device time).

1. MtpHead.forward equals transformers' own Qwen3_5DecoderLayer.forward (+ mtp.norm) on the fused input.
2. simulate_mtp's chained step equals re-running the MTP causally over the sequence of its inputs.
3. The DFlash batched training forward (many anchors, one mask) equals one block at a time with the
   context cut to positions < anchor.
4. Tally / match_length on hand-made proposals.
5. greedy_continue (transformers generate, with cache) equals an argmax loop without cache.
6. Exported files load with Qwen3_5ForCausalLM.from_pretrained (no missing/unexpected keys) and give the
   logits of the in-memory model with bf16-rounded weights.
"""

from __future__ import annotations

import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from transformers import Qwen3_5ForCausalLM  # noqa: E402

from tb.export import export_dflash, export_target  # noqa: E402
from tb.model import (DFlashDrafter, MtpHead, attend, dflash_train_mask, make_target, make_target_config,  # noqa: E402
                      run_target, text_position_ids)
from tb.reference import load_dflash, load_mtp  # noqa: E402
from tb.spec_eval import Tally, greedy_continue, match_length  # noqa: E402

torch.manual_seed(0)
SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1,
             head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
             linear_value_head_dim=16, vocab_size=97, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                                       "partial_rotary_factor": 0.25})


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def randomize(mod):
    with torch.no_grad():
        for n, p in mod.named_parameters():
            if "norm" in n:
                p.add_(0.1 * torch.randn_like(p))


def main():
    cfg = make_target_config(**SMALL)
    model = make_target(cfg).eval()
    mtp = MtpHead(cfg).eval()
    randomize(model), randomize(mtp)
    b, t = 2, 37
    x = torch.randint(4, 97, (b, t))

    # 1. MTP forward vs transformers' decoder layer
    with torch.no_grad():
        hidden, _ = run_target(model, x)
        emb = model.model.embed_tokens(x[:, 1:])
        cos, sin = model.model.rotary_emb(hidden, text_position_ids(b, t - 1))
        ours = mtp(emb, hidden[:, :-1], cos, sin)
        u = mtp.fuse(emb, hidden[:, :-1])
        ref = mtp.norm(mtp.layers[0](u, position_embeddings=(cos, sin), attention_mask=None))
    print("1 mtp vs Qwen3_5DecoderLayer rel err", rel(ours, ref))
    assert rel(ours, ref) < 1e-5

    # 2. chained MTP step vs causal re-run over the chain inputs (p = 20, three steps)
    p = 20
    with torch.no_grad():
        w = model.lm_head.weight
        o_prev = ours[:, p - 1]
        d = (o_prev @ w.T).argmax(-1)
        us = [u[:, :p]]
        q, kk, vv, gate = mtp.layer_qkv(u, cos, sin)
        chain_k, chain_v = [], []
        for j in range(2, 5):
            qpos = torch.full((b, 1), p + j - 2)
            uj = mtp.fuse(model.model.embed_tokens(d)[:, None], o_prev[:, None])
            c, s = model.model.rotary_emb(uj, qpos[None].expand(3, -1, -1))
            qj, kj, vj, gj = mtp.layer_qkv(uj, c, s)
            chain_k.append(kj), chain_v.append(vj)
            keys = torch.cat([kk[:, :, :p]] + chain_k, dim=2)
            vals = torch.cat([vv[:, :, :p]] + chain_v, dim=2)
            o_step = mtp.layer_finish(uj, attend(qj, keys, vals), gj)[:, 0]
            us.append(uj)
            useq = torch.cat(us, dim=1)
            c2, s2 = model.model.rotary_emb(useq, text_position_ids(b, useq.shape[1]))
            qa, ka, va, ga = mtp.layer_qkv(useq, c2, s2)
            o_full = mtp.layer_finish(useq, attend(qa, ka, va, causal=True), ga)[:, -1]
            print(f"2 chained step {j} rel err", rel(o_step, o_full))
            assert rel(o_step, o_full) < 1e-5
            o_prev, d = o_step, (o_step @ w.T).argmax(-1)

    # 3. DFlash batched anchors vs one block at a time
    dr = DFlashDrafter(64, 128, 2, 2, 1, 32, [0, 2], 4, 3, 10000.0).eval()
    randomize(dr)
    with torch.no_grad():
        _, taps = run_target(model, x, dr.target_layer_ids)
        ctx = dr.context(taps)
        anchors = torch.tensor([[5, 9, 30], [12, 13, 20]])
        blk = dr.block_size
        pos = (anchors[..., None] + torch.arange(blk)).reshape(b, -1)
        ids = torch.full_like(pos, 3)
        ids.view(b, 3, blk)[..., 0] = torch.gather(x, 1, anchors)
        kv = dr.context_kv(ctx, torch.arange(t)[None].expand(b, -1))
        batched = dr(model.model.embed_tokens(ids), pos, kv, dflash_train_mask(anchors, t, blk))
        for bi in range(b):
            for ai in range(3):
                a = anchors[bi, ai].item()
                kv1 = dr.context_kv(ctx[bi:bi + 1, :a], torch.arange(a)[None])
                ids1 = ids.view(b, 3, blk)[bi:bi + 1, ai]
                one = dr(model.model.embed_tokens(ids1), (a + torch.arange(blk))[None], kv1,
                         torch.ones(1, 1, blk, a + blk, dtype=torch.bool))
                err = rel(batched.view(b, 3, blk, -1)[bi, ai], one[0])
                assert err < 1e-5, err
    print("3 dflash batched anchors == single blocks")

    # 4. tally
    props = torch.tensor([[1, 2, 3], [1, 9, 3], [7, 2, 3]])
    truth = torch.tensor([[1, 2, 3], [1, 2, 3], [1, 2, 3]])
    acc = match_length(props, truth)
    assert acc.tolist() == [3, 1, 0]
    tl = Tally(3)
    tl.add(acc)
    s = tl.summary()
    assert s["tokens_per_verify"] == round(1 + 4 / 3, 4)
    assert s["p_accept_through_position"] == [round(2 / 3, 4), round(1 / 3, 4), round(1 / 3, 4)]
    assert s["p_accept_position_given_previous"] == [round(2 / 3, 4), 0.5, 1.0]
    print("4 tally ok", s)

    # 5. generate with cache == argmax loop without cache
    with torch.no_grad():
        g = greedy_continue(model, x[:, :10], 12, 2)
        y = x[:, :10]
        for _ in range(12):
            nxt = model(input_ids=y).logits[:, -1].argmax(-1, keepdim=True)
            y = torch.cat([y, nxt], dim=1)
    assert torch.equal(g, y), (g, y)
    print("5 generate == uncached argmax loop")

    # 6. export / load
    with tempfile.TemporaryDirectory() as d:
        export_target(model, mtp, cfg, d)
        export_dflash(dr, cfg, os.path.join(d, "dflash"))
        loaded, info = Qwen3_5ForCausalLM.from_pretrained(d, dtype=torch.float32, output_loading_info=True)
        assert not info["missing_keys"] and not info["unexpected_keys"], info
        ref_model = make_target(cfg).eval()
        ref_model.load_state_dict({k: v.to(torch.bfloat16).float() for k, v in model.state_dict().items()})
        with torch.no_grad():
            a = loaded(input_ids=x).logits
            r = ref_model(input_ids=x).logits
        print("6 loaded vs bf16-rounded in-memory rel err", rel(a, r))
        assert rel(a, r) < 1e-5
        m2 = load_mtp(d, cfg)
        d2 = load_dflash(os.path.join(d, "dflash"))
        for k, v in mtp.state_dict().items():
            assert torch.equal(m2.state_dict()[k], v.to(torch.bfloat16).float()), k
        for k, v in dr.state_dict().items():
            assert torch.equal(d2.state_dict()[k], v.to(torch.bfloat16).float()), k
        print("6 mtp / dflash round trip ok;", sorted(os.listdir(d)))
    print("selftest passed")


if __name__ == "__main__":
    main()
