"""Training loops (time-budgeted) and held-out evaluation.

pretrain: the target on mixed text windows with next-token cross-entropy; the MTP head alongside it on
the same forward, next-next-token cross-entropy, with the trunk's hidden states, the embedding and the
tied lm_head detached, so the MTP loss never changes the target (the target's numbers are the target's
alone). The learning rate follows the elapsed fraction of the time budget (warm-up, cosine to 10%).

train_drafters: the target frozen; on sequences of (training prompt + the target's greedy continuation)
the DFlash drafter learns, at random anchors p in the continuation, to predict S[p+1..p+B-1] (the
target's greedy continuation) with position weights exp(-(i-1)/gamma); the MTP head is fine-tuned on the
same sequences (labels = greedy tokens). One frozen target forward feeds both.
"""

from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F

from .model import cosine_lr, dflash_train_mask, run_target, text_position_ids


def _param_groups(params, weight_decay):
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def make_optimizer(params, lr, weight_decay=0.1):
    params = [p for p in params if p.requires_grad]
    fused = all(p.is_cuda for p in params)
    return torch.optim.AdamW(_param_groups(params, weight_decay), lr=lr, betas=(0.9, 0.95), eps=1e-8,
                             fused=fused)


def lm_losses(model, mtp, x: torch.Tensor):
    """x [B,T+1]. Returns (target CE, MTP CE) as scalars."""
    inp = x[:, :-1]
    b, t = inp.shape
    hidden = model.model(input_ids=inp, use_cache=False).last_hidden_state  # [B,T,H]
    logits = model.lm_head(hidden)
    loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
    if mtp is None:
        return loss, None
    emb_next = model.model.embed_tokens(x[:, 1:-1]).detach()  # x_{t+1}, t = 0..T-2
    cos, sin = model.model.rotary_emb(hidden, text_position_ids(b, t - 1, device=x.device))
    o = mtp(emb_next, hidden[:, :-1].detach(), cos, sin)
    mlogits = F.linear(o, model.lm_head.weight.detach())
    mloss = F.cross_entropy(mlogits.float().reshape(-1, mlogits.shape[-1]), x[:, 2:].reshape(-1))
    return loss, mloss


def pretrain(model, mtp, sampler, seq_len, batch, seconds, lr, log, warmup_frac=0.03, log_every=25):
    params = list(model.parameters()) + list(mtp.parameters())
    opt = make_optimizer(params, lr)
    model.train()
    mtp.train()
    t0 = time.time()
    step = tokens = 0
    hist = []
    while True:
        elapsed = time.time() - t0
        if elapsed >= seconds:
            break
        cur_lr = cosine_lr(elapsed / seconds, lr, warmup_frac)
        for g in opt.param_groups:
            g["lr"] = cur_lr
        x = sampler.batch(batch, seq_len + 1)
        with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16):
            loss, mloss = lm_losses(model, mtp, x)
        opt.zero_grad(set_to_none=True)
        (loss + mloss).backward()
        gnorm = torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        tokens += batch * seq_len
        if step % log_every == 0 or step == 1:
            lv, mv = loss.item(), mloss.item()
            el = time.time() - t0
            hist.append({"step": step, "s": round(el, 1), "loss": round(lv, 4), "mtp_loss": round(mv, 4),
                         "lr": cur_lr, "tok_per_s": round(tokens / el)})
            log(f"pretrain step {step} t={el:.0f}s loss={lv:.4f} mtp={mv:.4f} gnorm={float(gnorm):.2f} "
                f"lr={cur_lr:.2e} tok/s={tokens / el:,.0f}")
    wall = time.time() - t0
    return {"steps": step, "tokens": tokens, "seconds": round(wall, 1), "tokens_per_s": round(tokens / wall),
            "batch": batch, "seq_len": seq_len, "peak_lr": lr, "history": hist}


def dflash_losses(model, drafter, seqs, start, anchors_per_seq, gamma, gen):
    """seqs [B,L]: prompt (start tokens) + greedy continuation. Returns (DFlash CE, per-row acc, taps, hidden)."""
    b, length = seqs.shape
    dev = seqs.device
    blk = drafter.block_size
    with torch.no_grad():
        hidden, taps = run_target(model, seqs, drafter.target_layer_ids)
    lo, hi = start - 1, length - blk  # anchors inside the continuation (the anchor may be the last prompt token)
    anchors = torch.randint(lo, hi + 1, (b, anchors_per_seq), generator=gen).to(dev)  # [B,A]
    anchors, _ = anchors.sort(dim=1)
    offs = torch.arange(blk, device=dev)
    pos = (anchors[..., None] + offs).reshape(b, -1)  # [B,A*blk]
    ids = torch.full_like(pos, drafter.mask_token_id)
    ids.view(b, anchors_per_seq, blk)[..., 0] = torch.gather(seqs, 1, anchors)
    labels = torch.gather(seqs, 1, pos.clamp(max=length - 1)).view(b, anchors_per_seq, blk)[..., 1:]
    ctx = drafter.context({k: v.detach() for k, v in taps.items()})
    ctx_kv = drafter.context_kv(ctx, torch.arange(length, device=dev)[None].expand(b, -1))
    mask = dflash_train_mask(anchors, length, blk)
    emb = model.model.embed_tokens(ids).detach()
    out = drafter(emb, pos, ctx_kv, mask).view(b, anchors_per_seq, blk, -1)[:, :, 1:]  # [B,A,blk-1,H]
    logits = F.linear(out, model.lm_head.weight.detach()).float()
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
    ce = ce.view(b, anchors_per_seq, blk - 1)
    w = torch.exp(-torch.arange(blk - 1, device=dev, dtype=torch.float32) / gamma)
    loss = (ce * w).sum(-1).mean() / w.sum()
    acc = (logits.argmax(-1) == labels).float().mean(dim=(0, 1))
    return loss, acc, hidden


def mtp_greedy_loss(model, mtp, seqs, hidden, start):
    b, length = seqs.shape
    emb_next = model.model.embed_tokens(seqs[:, 1:-1]).detach()
    cos, sin = model.model.rotary_emb(hidden, text_position_ids(b, length - 2, device=seqs.device))
    o = mtp(emb_next, hidden[:, :-2].detach(), cos, sin)  # rows t = 0..L-3 predict x_{t+2}
    logits = F.linear(o, model.lm_head.weight.detach()).float()
    first = max(start - 2, 0)  # labels x_{t+2} inside the continuation
    lg = logits[:, first:]
    return F.cross_entropy(lg.reshape(-1, lg.shape[-1]), seqs[:, first + 2:].reshape(-1))


def train_drafters(model, mtp, drafter, pool, start, batch, seconds, lr, log, anchors_per_seq=16, gamma=4.0,
                   mtp_lr=None, seed=0, text_sampler=None, text_batch=32, text_len=256):
    """pool [N,L] generated sequences (on device). With text_sampler, the MTP loss is the mean of its loss
    on the greedy pool and on real text windows (so it keeps its real-text skill)."""
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    drafter.train()
    mtp.train()
    opt = make_optimizer(drafter.parameters(), lr)
    opt_m = make_optimizer(mtp.parameters(), mtp_lr or lr * 0.3)
    gen = torch.Generator().manual_seed(seed)
    t0 = time.time()
    step = 0
    hist = []
    n = pool.shape[0]
    while True:
        elapsed = time.time() - t0
        if elapsed >= seconds:
            break
        frac = elapsed / seconds
        for g in opt.param_groups:
            g["lr"] = cosine_lr(frac, lr, 0.05)
        for g in opt_m.param_groups:
            g["lr"] = cosine_lr(frac, mtp_lr or lr * 0.3, 0.05)
        idx = torch.randint(0, n, (batch,), generator=gen).to(pool.device)
        seqs = pool[idx]
        with torch.autocast(device_type=seqs.device.type, dtype=torch.bfloat16):
            dloss, acc, hidden = dflash_losses(model, drafter, seqs, start, anchors_per_seq, gamma, gen)
            mloss = mtp_greedy_loss(model, mtp, seqs, hidden, start)
            if text_sampler is not None:
                x = text_sampler.batch(text_batch, text_len + 1)
                with torch.no_grad():
                    h_text, _ = run_target(model, x)
                mloss = 0.5 * (mloss + mtp_greedy_loss(model, mtp, x, h_text, 2))
        opt.zero_grad(set_to_none=True)
        opt_m.zero_grad(set_to_none=True)
        (dloss + mloss).backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        torch.nn.utils.clip_grad_norm_(mtp.parameters(), 1.0)
        opt.step()
        opt_m.step()
        step += 1
        if step % 25 == 0 or step == 1:
            el = time.time() - t0
            accs = [round(a, 3) for a in acc.tolist()]
            hist.append({"step": step, "s": round(el, 1), "dflash_loss": round(dloss.item(), 4),
                         "mtp_loss": round(mloss.item(), 4), "row_acc": accs})
            log(f"drafters step {step} t={el:.0f}s dflash={dloss.item():.4f} mtp={mloss.item():.4f} acc={accs}")
    return {"steps": step, "seconds": round(time.time() - t0, 1), "batch": batch,
            "anchors_per_seq": anchors_per_seq, "gamma": gamma, "peak_lr": lr, "history": hist}


@torch.no_grad()
def evaluate_lm(model, mtp, windows: torch.Tensor, token_bytes: torch.Tensor, batch: int) -> dict:
    """windows [n,T] held-out tokens. Next-token CE/accuracy/bits-per-byte; MTP next-next-token CE/acc."""
    model.eval()
    mtp.eval()
    dev = token_bytes.device
    ce_sum = correct = count = byte_sum = 0.0
    mce_sum = mcorrect = mcount = 0.0
    for i in range(0, windows.shape[0], batch):
        x = windows[i:i + batch].to(dev)
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16):
            b, t = x.shape
            hidden = model.model(input_ids=x, use_cache=False).last_hidden_state
            logits = model.lm_head(hidden[:, :-1]).float()
            labels = x[:, 1:]
            ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="sum")
            emb_next = model.model.embed_tokens(x[:, 1:-1])
            cos, sin = model.model.rotary_emb(hidden, text_position_ids(b, t - 2, device=dev))
            o = mtp(emb_next, hidden[:, :-2], cos, sin)
            mlogits = model.lm_head(o).float()
            mlabels = x[:, 2:]
            mce = F.cross_entropy(mlogits.reshape(-1, mlogits.shape[-1]), mlabels.reshape(-1), reduction="sum")
        ce_sum += ce.item()
        correct += (logits.argmax(-1) == labels).sum().item()
        count += labels.numel()
        byte_sum += token_bytes[labels].sum().item()
        mce_sum += mce.item()
        mcorrect += (mlogits.argmax(-1) == mlabels).sum().item()
        mcount += mlabels.numel()
    loss = ce_sum / max(count, 1)
    return {"tokens": int(count), "loss": round(loss, 4), "perplexity": round(math.exp(loss), 3),
            "top1_acc": round(correct / max(count, 1), 4),
            "bits_per_byte": round(ce_sum / math.log(2) / max(byte_sum, 1), 4),
            "bytes_per_token": round(byte_sum / max(count, 1), 3),
            "mtp_loss": round(mce_sum / max(mcount, 1), 4), "mtp_top1_acc": round(mcorrect / max(mcount, 1), 4)}
