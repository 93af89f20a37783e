"""Train the testbed's byte-level BPE tokenizer (Qwen2-style pre-tokenization) on a corpus sample.

Qwen-style: NFC normalisation, Qwen2's split regex, byte-level alphabet (every byte string encodes),
no BOS, `<|endoftext|>` as end of document. Special tokens take ids 0..3: `<|endoftext|>`,
`<|im_start|>`, `<|im_end|>`, and `<|mask|>` (the DFlash mask token). Training text: training-split
documents only (tb/docs.is_validation), a fixed number of characters per category so prose and code
share the merges. Writes tokenizer.json and tokenizer_config.json (ChatML chat template).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tb.docs import is_validation, read_jsonl_xz  # noqa: E402

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
SAMPLE_CHARS = {"prose": 36_000_000, "python": 16_000_000, "rust": 12_000_000, "c": 10_000_000}


def sample_texts(paths: dict[str, str]):
    for cat, path in paths.items():
        budget = SAMPLE_CHARS[cat]
        for doc in read_jsonl_xz(path):
            if is_validation(doc["id"]):
                continue
            text = doc["text"]
            yield text
            budget -= len(text)
            if budget <= 0:
                break


def build_tokenizer(vocab_size: int, texts) -> Tokenizer:
    tok = Tokenizer(models.BPE(byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def tokenizer_config() -> dict:
    added = {
        str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                 "special": True}
        for i, t in enumerate(SPECIAL_TOKENS)
    }
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<|mask|>"],
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|endoftext|>",
        "errors": "replace",
        "mask_token": "<|mask|>",
        "model_max_length": 4096,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--data", default=os.path.join(here, "data"))
    ap.add_argument("--out", default=os.path.join(here, "..", "models", "testbed"))
    args = ap.parse_args()
    paths = {
        "prose": f"{args.data}/corpus/prose.jsonl.xz",
        "python": f"{args.data}/python_local_sample.jsonl.xz",
        "rust": f"{args.data}/corpus/rust.jsonl.xz",
        "c": f"{args.data}/corpus/c.jsonl.xz",
    }
    tok = build_tokenizer(args.vocab, sample_texts(paths))
    for i, t in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(t) == i, (t, tok.token_to_id(t))
    os.makedirs(args.out, exist_ok=True)
    tok.save(os.path.join(args.out, "tokenizer.json"))
    with open(os.path.join(args.out, "tokenizer_config.json"), "w") as f:
        json.dump(tokenizer_config(), f, indent=2)
        f.write("\n")
    print("vocab", tok.get_vocab_size())


if __name__ == "__main__":
    main()
