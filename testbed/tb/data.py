"""Token streams for training and evaluation.

Each category's documents are tokenized, each followed by `<|endoftext|>`, and concatenated into one
train stream and one validation stream (split by tb/docs.is_validation). Training batches are random
windows of seq_len + 1 tokens drawn from the train streams with fixed category weights (windows may
cross document boundaries, as in ordinary LM pretraining). Python documents are read from the running
interpreter's own standard library and site-packages (sources and versions recorded by
`python_documents`), de-duplicated by content; carried categories come from corpus/*.jsonl.xz.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import lzma
import os
import sys
import sysconfig
import time

import numpy as np
import torch

from .docs import is_validation, read_jsonl_xz

MAX_PY_FILE_BYTES = 200_000


def python_roots() -> list[tuple[str, str]]:
    roots = [("stdlib", sysconfig.get_paths()["stdlib"])]
    for p in sorted(set(sys.path)):
        if p.endswith("site-packages") and os.path.isdir(p):
            roots.append(("site-packages", p))
    return roots


def top_level_versions() -> dict[str, str]:
    out = {}
    for dist in md.distributions():
        name, ver = dist.metadata["Name"], dist.version
        tops = set()
        for f in dist.files or []:
            first = str(f).split("/")[0]
            if first and not first.startswith("..") and not first.endswith((".dist-info", ".egg-info", ".pth")):
                tops.add(first[:-3] if first.endswith(".py") else first)
        for t in sorted(tops) or [name.replace("-", "_").lower()]:
            out.setdefault(t, f"{name}=={ver}")
    return out


def python_documents(max_chars: int, per_package_chars: int):
    """Yield (doc, provenance) for .py files of the interpreter's stdlib and site-packages."""
    versions = top_level_versions()
    seen, used, per_pkg = set(), 0, {}
    prov: dict[str, dict] = {}
    for kind, root in python_roots():
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            rel_dir = os.path.relpath(dirpath, root)
            if kind == "stdlib" and rel_dir.split(os.sep)[0] in ("site-packages", "dist-packages"):
                dirnames[:] = []
                continue
            pkg = "stdlib" if kind == "stdlib" else rel_dir.split(os.sep)[0]
            if pkg == ".":
                pkg = "(top-level modules)"
            for fn in sorted(filenames):
                if not fn.endswith(".py"):
                    continue
                path = os.path.join(dirpath, fn)
                try:
                    if os.path.getsize(path) > MAX_PY_FILE_BYTES:
                        continue
                    with open(path, "rb") as f:
                        raw = f.read()
                except OSError:
                    continue
                digest = hashlib.sha1(raw).digest()
                if digest in seen or len(raw) < 64:
                    continue
                if per_pkg.get(pkg, 0) >= per_package_chars:
                    continue
                seen.add(digest)
                text = raw.decode("utf-8", errors="replace")
                per_pkg[pkg] = per_pkg.get(pkg, 0) + len(text)
                used += len(text)
                entry = prov.setdefault(pkg, {"files": 0, "chars": 0,
                                              "dist": versions.get(pkg, sys.version.split()[0] if pkg == "stdlib" else "?")})
                entry["files"] += 1
                entry["chars"] += len(text)
                rel = os.path.relpath(path, root)
                yield {"id": f"py:{kind}:{rel}", "cat": "python", "src": pkg, "text": text}, prov
                if used >= max_chars:
                    return


def tokenize_docs(tokenizer, docs, eos_id: int, batch_docs: int = 512):
    """docs: iterable of dicts. Returns (train tokens, val tokens, val doc count, train doc count)."""
    train, val = [], []
    n_train = n_val = 0
    buf = []

    def flush():
        nonlocal n_train, n_val
        if not buf:
            return
        encs = tokenizer.encode_batch([d["text"] for d in buf], add_special_tokens=False)
        for d, e in zip(buf, encs):
            ids = np.asarray(e.ids + [eos_id], dtype=np.uint16)
            if is_validation(d["id"]):
                val.append(ids)
                n_val += 1
            else:
                train.append(ids)
                n_train += 1
        buf.clear()

    for d in docs:
        buf.append(d)
        if len(buf) >= batch_docs:
            flush()
    flush()
    cat = lambda xs: np.concatenate(xs) if xs else np.zeros(0, dtype=np.uint16)  # noqa: E731
    return cat(train), cat(val), n_train, n_val


def pretokenize(tokenizer, corpus_dir: str, tokens_dir: str, eos_id: int, log=print) -> None:
    """Tokenize the carried categories once, off the device: {cat}.{train,val}.u16.xz + stats.json."""
    os.makedirs(tokens_dir, exist_ok=True)
    stats = {}
    for cat in ("rust", "c", "prose"):
        t0 = time.time()
        tr, va, ntr, nva = tokenize_docs(tokenizer, read_jsonl_xz(os.path.join(corpus_dir, f"{cat}.jsonl.xz")), eos_id)
        for split, arr in (("train", tr), ("val", va)):
            with lzma.open(os.path.join(tokens_dir, f"{cat}.{split}.u16.xz"), "wb", preset=6) as f:
                f.write(arr.astype("<u2").tobytes())
        stats[cat] = dict(train_docs=ntr, val_docs=nva, train_tokens=int(tr.size), val_tokens=int(va.size))
        log(f"pretokenize {cat}: {stats[cat]} in {time.time() - t0:.0f}s")
    with open(os.path.join(tokens_dir, "stats.json"), "w") as f:
        json.dump(stats, f, indent=1)


def load_streams(tokenizer, corpus_dir: str, eos_id: int, py_max_chars: int, py_per_package: int,
                 carried_max_docs: int | None = None, log=print, tokens_dir: str | None = None):
    """Returns ({cat: train np.uint16}, {cat: val np.uint16}, stats dict). Carried categories come from
    tokens_dir (pretokenized) when it holds them, else from corpus_dir's documents."""
    train, val, stats = {}, {}, {}
    for cat in ("rust", "c", "prose"):
        t0 = time.time()
        if tokens_dir and os.path.exists(os.path.join(tokens_dir, f"{cat}.train.u16.xz")):
            with open(os.path.join(tokens_dir, "stats.json")) as f:
                stats[cat] = json.load(f)[cat]
            for split, dst in (("train", train), ("val", val)):
                with lzma.open(os.path.join(tokens_dir, f"{cat}.{split}.u16.xz"), "rb") as f:
                    dst[cat] = np.frombuffer(f.read(), dtype="<u2").astype(np.uint16)
            stats[cat]["seconds"] = round(time.time() - t0, 1)
            log(f"data {cat} (pretokenized): {stats[cat]}")
            continue
        docs = read_jsonl_xz(os.path.join(corpus_dir, f"{cat}.jsonl.xz"))
        if carried_max_docs is not None:
            docs = (d for i, d in zip(range(carried_max_docs), docs))
        chars = 0

        def counted(it):
            nonlocal chars
            for d in it:
                chars += len(d["text"])
                yield d

        tr, va, ntr, nva = tokenize_docs(tokenizer, counted(docs), eos_id)
        train[cat], val[cat] = tr, va
        stats[cat] = dict(train_docs=ntr, val_docs=nva, chars=chars, train_tokens=int(tr.size),
                          val_tokens=int(va.size), seconds=round(time.time() - t0, 1))
        log(f"data {cat}: {stats[cat]}")
    t0 = time.time()
    prov_holder = {}
    chars = 0

    def py_docs():
        nonlocal chars
        for d, prov in python_documents(py_max_chars, py_per_package):
            prov_holder["prov"] = prov
            chars += len(d["text"])
            yield d

    tr, va, ntr, nva = tokenize_docs(tokenizer, py_docs(), eos_id)
    train["python"], val["python"] = tr, va
    stats["python"] = dict(train_docs=ntr, val_docs=nva, chars=chars, train_tokens=int(tr.size),
                           val_tokens=int(va.size), seconds=round(time.time() - t0, 1),
                           roots=python_roots(), packages=prov_holder.get("prov", {}))
    log(f"data python: { {k: v for k, v in stats['python'].items() if k != 'packages'} }")
    return train, val, stats


class Sampler:
    """Random training windows from per-category GPU token streams, mixed by fixed weights."""

    def __init__(self, train: dict[str, np.ndarray], weights: dict[str, float], device, seed: int = 0):
        self.cats = [c for c in weights if train.get(c) is not None and train[c].size > 10_000]
        w = torch.tensor([weights[c] for c in self.cats], dtype=torch.float64)
        self.probs = w / w.sum()
        self.streams = [torch.from_numpy(train[c].astype(np.int32)).to(device) for c in self.cats]
        self.gen = torch.Generator().manual_seed(seed)
        self.device = device

    def batch(self, batch: int, length: int) -> torch.Tensor:
        """[batch, length] int64 token windows."""
        cat_idx = torch.multinomial(self.probs, batch, replacement=True, generator=self.gen)
        rows = []
        for ci, stream in enumerate(self.streams):
            n = int((cat_idx == ci).sum())
            if n == 0:
                continue
            starts = torch.randint(0, stream.numel() - length - 1, (n,), generator=self.gen)
            idx = starts[:, None].to(self.device) + torch.arange(length, device=self.device)[None]
            rows.append(stream[idx])
        out = torch.cat(rows, dim=0)
        return out[torch.randperm(batch, generator=self.gen).to(self.device)].long()


def val_windows(stream: np.ndarray, length: int, max_windows: int) -> torch.Tensor:
    """Non-overlapping [n, length] windows from the start of a validation stream."""
    n = min(stream.size // length, max_windows)
    return torch.from_numpy(stream[: n * length].astype(np.int64)).view(n, length)


if __name__ == "__main__":  # python -m tb.data: pretokenize the carried corpus
    from tokenizers import Tokenizer

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    tok = Tokenizer.from_file(os.path.join(here, "..", "models", "testbed", "tokenizer.json"))
    pretokenize(tok, os.path.join(here, "data", "corpus"), os.path.join(here, "data", "tokens"), eos_id=0)
