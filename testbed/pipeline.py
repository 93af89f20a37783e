"""The whole testbed recipe in one time-budgeted run (made for one `device` call on the H200).

Stages: tokenize the corpus -> pretrain target + MTP -> held-out evaluation -> export (bf16 shards to
$OUT, so a later stage's failure loses nothing) -> greedy continuations of training prompts -> DFlash +
MTP training on them with the target frozen -> acceptance simulation on held-out prompts -> samples ->
final export + f32 reference -> results.json. Every stage's deadline derives from --total-s, so the run
ends inside the device's 10-minute command limit. `--smoke` runs a tiny configuration on the CPU.
"""

from __future__ import annotations

import time

START = time.time()

import argparse  # noqa: E402
import json
import os
import shutil
import sys
import tarfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import torch  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

from tb import data as tbdata  # noqa: E402
from tb.export import dir_bytes, export_dflash, export_target  # noqa: E402
from tb.model import DFlashDrafter, MtpHead, make_target, make_target_config, param_count  # noqa: E402
from tb.reference import load_mtp, make_reference  # noqa: E402
from tb.spec_eval import distinct_ngram_ratio, greedy_continue, simulate_dflash, simulate_mtp  # noqa: E402
from tb.train import evaluate_lm, lm_losses, pretrain, train_drafters  # noqa: E402

MIX = {"python": 0.30, "rust": 0.15, "c": 0.10, "prose": 0.45}
SAMPLE_PROMPTS = [
    "import os\nimport sys\n\n\ndef main(argv):\n",
    "fn parse_header(input: &[u8]) -> Result<Header, Error> {\n",
    "It was a bright cold day in April, and the old sailor",
]
SMOKE_CONFIG = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=2,
                    num_key_value_heads=1, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
                    linear_key_head_dim=16, linear_value_head_dim=16)


class Run:
    def __init__(self, out: str):
        self.t0 = START
        self.out = out
        self.results: dict = {}

    def log(self, msg: str) -> None:
        print(f"[{time.time() - self.t0:6.1f}s] {msg}", flush=True)

    def save(self) -> None:
        self.results["wall_s"] = round(time.time() - self.t0, 1)
        with open(os.path.join(self.out, "results.json"), "w") as f:
            json.dump(self.results, f, indent=1)

    def left(self, total: float) -> float:
        return total - (time.time() - self.t0)


def token_byte_table(tok: Tokenizer, device) -> torch.Tensor:
    vocab = tok.get_vocab()
    special = {t.content for t in tok.get_added_tokens_decoder().values()}
    table = torch.zeros(len(vocab), dtype=torch.float64)
    for s, i in vocab.items():
        table[i] = 0 if s in special else len(s)  # byte-level alphabet: one char per byte
    return table.to(device)


def autotune_batch(model, mtp, sampler, seq_len, candidates, log):
    best, best_rate, rates = candidates[0], 0.0, {}
    for b in candidates:
        try:
            for i in range(2):
                if i == 1:
                    torch.cuda.synchronize()
                    t = time.time()
                x = sampler.batch(b, seq_len + 1)
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss, mloss = lm_losses(model, mtp, x)
                (loss + mloss).backward()
            torch.cuda.synchronize()
            rate = b * seq_len / (time.time() - t)
        except torch.OutOfMemoryError:
            rate = 0.0
        model.zero_grad(set_to_none=True)
        mtp.zero_grad(set_to_none=True)
        rates[b] = round(rate)
        log(f"autotune batch {b}: {rate:,.0f} tok/s")
        if rate > best_rate * 1.05:
            best, best_rate = b, rate
    torch.cuda.empty_cache()
    return best, rates


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", os.path.join(HERE, "out")))
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--total-s", type=float, default=575, help="seconds from process start")
    ap.add_argument("--reserve-s", type=float, default=195, help="time kept for everything after pretraining")
    ap.add_argument("--gen-s", type=float, default=22)
    ap.add_argument("--draft-s", type=float, default=110)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--batch", type=int, default=64, help="0 = autotune among 32/64/128")
    ap.add_argument("--draft-lr", type=float, default=1.5e-3)
    ap.add_argument("--resume", default=None, help="exported target dir: skip pretraining")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    run = Run(args.out)
    log = run.log
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    import transformers

    run.results["env"] = {"torch": torch.__version__, "transformers": transformers.__version__,
                          "python": sys.version.split()[0], "device": torch.cuda.get_device_name() if dev.type == "cuda"
                          else "cpu", "smoke": args.smoke}
    log(f"env {run.results['env']}")

    model_dir = os.path.join(ROOT, "models", "testbed")
    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    smoke = args.smoke
    train, val, stats = tbdata.load_streams(
        tok, os.path.join(HERE, "data", "corpus"), eos_id=0,
        py_max_chars=2_000_000 if smoke else 90_000_000, py_per_package=500_000 if smoke else 3_000_000,
        carried_max_docs=150 if smoke else None, log=log,
        tokens_dir=None if smoke else os.path.join(HERE, "data", "tokens"))
    run.results["data"] = stats
    run.save()

    if args.resume:  # a previous run's exported target + MTP (bf16 shards, config, index)
        from transformers import Qwen3_5ForCausalLM

        model = Qwen3_5ForCausalLM.from_pretrained(args.resume, dtype=torch.float32,
                                                   attn_implementation="sdpa").to(dev)
        cfg = model.config
        mtp = load_mtp(args.resume, cfg).to(dev)
        log(f"resumed target and MTP from {args.resume}")
    else:
        cfg = make_target_config(**(SMOKE_CONFIG if smoke else {}))
        model = make_target(cfg).to(dev)
        mtp = MtpHead(cfg).to(dev)
    run.results["params"] = {"target": param_count(model), "target_without_embedding": param_count(model)
                             - model.model.embed_tokens.weight.numel(), "mtp": param_count(mtp)}
    log(f"params {run.results['params']}")
    sampler = tbdata.Sampler(train, MIX, dev)
    seq_len = 256 if smoke else 1024

    if args.resume:
        run.results["pretrain"] = {"resumed_from": args.resume}
    else:
        if dev.type != "cuda":
            batch = 4
        elif args.batch:
            batch = args.batch
        else:
            batch, rates = autotune_batch(model, mtp, sampler, seq_len, [32, 64, 128], log)
            run.results["autotune_tok_per_s"] = rates
        pre_s = run.left(args.total_s) - args.reserve_s if not smoke else 20
        log(f"pretrain batch={batch} seq={seq_len} for {pre_s:.0f}s")
        run.results["pretrain"] = pretrain(model, mtp, sampler, seq_len, batch, pre_s, args.lr, log)
        run.save()

    # ---- held-out evaluation of the target (and the jointly trained MTP) ----
    table = token_byte_table(tok, dev)
    n_win = 8 if smoke else 96
    run.results["val_pretrain"] = {}
    for cat in ("python", "rust", "c", "prose"):
        w = tbdata.val_windows(val[cat], seq_len, n_win)
        run.results["val_pretrain"][cat] = evaluate_lm(model, mtp, w, table, 16)
        log(f"val {cat}: {run.results['val_pretrain'][cat]}")
    export_dir = os.path.join(HERE, "out", "model")
    shutil.rmtree(export_dir, ignore_errors=True)
    run.results["export_pretrain"] = export_target(model, mtp, cfg, export_dir)
    copy_shards(export_dir, args.out)
    run.save()
    write_bundle(export_dir, args.out, ("config.json", "generation_config.json", "model.safetensors.index.json"))

    # ---- held-out prompts and the target's greedy continuations (fixed from here on) ----
    model.eval()
    groups = {"code": ["python", "rust", "c"], "prose": ["prose"]}
    n_prompts = 4 if smoke else 48
    plen, new = (32, 32) if smoke else (128, 128)
    heldout = {}
    for group, cats in groups.items():
        per = max(n_prompts // len(cats), 1)
        prompts = torch.cat([tbdata.val_windows(val[c], plen, 10_000)[::7][:per] for c in cats]).to(dev)
        heldout[group] = greedy_continue(model, prompts, new, 256)
    run.results["acceptance_mtp_joint"] = {
        group: {f"mtp_k{k}": simulate_mtp(model, mtp, seqs, plen, k) for k in (1, 2, 3)}
        for group, seqs in heldout.items()}
    log(f"acceptance of the jointly trained MTP: {json.dumps(run.results['acceptance_mtp_joint'])}")
    run.save()

    # ---- greedy continuations of training prompts: the drafters' training data ----
    gen_p, gen_new = (16, 48) if smoke else (128, 128)
    gen_batch = 8 if smoke else 1024
    pool, t_gen = [], time.time()
    while time.time() - t_gen < (5 if smoke else args.gen_s) and len(pool) < 16:
        prompts = sampler.batch(gen_batch, gen_p)
        pool.append(greedy_continue(model, prompts, gen_new, gen_batch))
    pool = torch.cat(pool)
    run.results["drafter_data"] = {"sequences": pool.shape[0], "prompt_tokens": gen_p, "new_tokens": gen_new,
                                   "seconds": round(time.time() - t_gen, 1),
                                   "distinct_4gram_ratio": distinct_ngram_ratio(pool[:512], gen_p)}
    log(f"drafter data {run.results['drafter_data']}")

    drafter = DFlashDrafter(cfg.hidden_size, cfg.intermediate_size, layers=3, heads=cfg.num_attention_heads,
                            kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
                            target_layer_ids=[1, 2, 3] if smoke else [1, 3, 5], block_size=8, mask_token_id=3,
                            rope_theta=cfg.rope_parameters["rope_theta"]).to(dev)
    run.results["params"]["dflash"] = param_count(drafter)
    draft_s = 15 if smoke else min(args.draft_s, run.left(args.total_s) - 75)
    run.results["drafters"] = train_drafters(model, mtp, drafter, pool, gen_p, 4 if smoke else 128, draft_s,
                                             args.draft_lr, log, anchors_per_seq=4 if smoke else 16,
                                             text_sampler=sampler, text_batch=4 if smoke else 32,
                                             text_len=64 if smoke else 256)
    run.save()

    # ---- acceptance on held-out prompts ----
    model.eval(), mtp.eval(), drafter.eval()
    spec = {}
    for group, seqs in heldout.items():
        res = {"prompts": seqs.shape[0], "prompt_tokens": plen, "new_tokens": new,
               "distinct_4gram_ratio": distinct_ngram_ratio(seqs, plen)}
        # same precision as the greedy continuation (f32 weights, TF32 matmuls), so ties break alike
        res["dflash_block8"] = simulate_dflash(model, drafter, seqs, plen)
        for k in (1, 2, 3, 4):
            res[f"mtp_k{k}"] = simulate_mtp(model, mtp, seqs, plen, k)
        spec[group] = res
        log(f"acceptance {group}: {json.dumps(res)}")
    run.results["acceptance"] = spec
    run.results["val_final_mtp"] = {}
    for cat in ("python", "rust", "c", "prose"):
        w = tbdata.val_windows(val[cat], seq_len, 8 if smoke else 32)
        r = evaluate_lm(model, mtp, w, table, 16)
        run.results["val_final_mtp"][cat] = {"mtp_loss": r["mtp_loss"], "mtp_top1_acc": r["mtp_top1_acc"]}
    run.save()

    # ---- samples ----
    samples = []
    for text in SAMPLE_PROMPTS:
        ids = torch.tensor([tok.encode(text, add_special_tokens=False).ids], device=dev)
        outp = greedy_continue(model, ids, 64, 1)
        samples.append({"prompt": text, "greedy_continuation": tok.decode(outp[0, ids.shape[1]:].tolist(),
                                                                          skip_special_tokens=False)})
    run.results["samples"] = samples
    for s in samples:
        log(f"sample {json.dumps(s)}")

    # ---- final export and reference ----
    run.results["export"] = export_target(model, mtp, cfg, export_dir)
    run.results["export_dflash"] = export_dflash(drafter, cfg, os.path.join(export_dir, "dflash"))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(model_dir, f), os.path.join(export_dir, f))
    copy_shards(export_dir, args.out)
    shutil.copy(os.path.join(export_dir, "dflash", "model.safetensors"), os.path.join(args.out, "dflash.safetensors"))
    ref = make_reference(export_dir, tok, dev, export_dir)
    run.results["reference_loading_info"] = ref["loading_info"]
    run.results["export_total_bytes"] = dir_bytes(export_dir)
    log(f"export {dir_bytes(export_dir)} bytes; reference greedy: {ref['greedy_text']!r}")
    run.save()
    write_bundle(export_dir, args.out, ("config.json", "generation_config.json", "model.safetensors.index.json",
                                        "reference.json", "reference.safetensors", "dflash/config.json"))
    log("done")


def write_bundle(export_dir: str, out: str, names) -> None:
    """The small files, in one tar (the device returns at most 8 files)."""
    with tarfile.open(os.path.join(out, "bundle.tar"), "w") as tar:
        for name in names:
            tar.add(os.path.join(export_dir, name), arcname=name)
        tar.add(os.path.join(out, "results.json"), arcname="results.json")


def copy_shards(export_dir: str, out: str) -> None:
    dst = os.path.join(out, "model")
    shutil.rmtree(dst, ignore_errors=True)
    os.makedirs(dst)
    for f in os.listdir(export_dir):
        if f.startswith("model-") and f.endswith(".safetensors"):
            shutil.copy(os.path.join(export_dir, f), os.path.join(dst, f))


if __name__ == "__main__":
    main()
