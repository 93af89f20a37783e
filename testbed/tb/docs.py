"""Documents of the testbed corpus: the record format and the train/validation split.

A document is one JSON line `{"id", "cat", "src", "text"}`; `cat` is one of CATEGORIES. The split is a
pure function of the document id (SHA-1 of the id, bucket 0 of 50 = validation), so the split is the
same here and on the GPU machine, whatever order the files are read in, and never trains on the 2%
held out. Invariant: `is_validation(id)` depends on nothing but `id`.
"""

from __future__ import annotations

import hashlib
import json
import lzma
from collections.abc import Iterator

CATEGORIES = ("python", "rust", "c", "prose")
CODE_CATEGORIES = ("python", "rust", "c")
VALIDATION_BUCKETS = 50  # 1 of 50 buckets = 2% of documents


def is_validation(doc_id: str) -> bool:
    digest = hashlib.sha1(doc_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "little") % VALIDATION_BUCKETS == 0


def read_jsonl_xz(path: str) -> Iterator[dict]:
    with lzma.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)


def chunk_text(text: str, target_chars: int) -> list[str]:
    """Split a long text at paragraph boundaries into pieces of about `target_chars` characters."""
    if len(text) <= target_chars:
        return [text]
    pieces, current, size = [], [], 0
    for para in text.split("\n\n"):
        current.append(para)
        size += len(para) + 2
        if size >= target_chars:
            pieces.append("\n\n".join(current))
            current, size = [], 0
    if current:
        pieces.append("\n\n".join(current))
    return [p for p in pieces if p.strip()]
