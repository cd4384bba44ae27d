#!/usr/bin/env python3
# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
"""The language-model example's corpus: the King James Bible from Debian, as byte tokens.

    python3 examples/05_lm/corpus.py [--out DIR] [--force]

Writes DIR (default build/datasets/kjv) with

  kjv.txt      the whole text, one verse per line, a blank line between chapters
  train.bin    the training split, one byte per token (the text's bytes: all ASCII)
  val.bin      the validation split, the same encoding
  meta.json    sizes, the split rule, the SHA-256 of each file and of the source text

and prints DIR on the last line. A second run finds meta.json, checks the files against it and
writes nothing (--force rebuilds).

Where the text comes from: Debian's `bible-kjv-text` (section doc, 2.4 MB as a package)
holds the Authorized Version, public domain, 31,102 verses, 4.3 MB of ASCII English prose, in
the compressed format of the `bible` program; `bible-kjv` (which depends on it) is that
program, and `bible -l100000 gen1:1-rev22:21` prints every verse, unwrapped. Both are
installed with apt-get when `bible` is missing (root needed; otherwise this script says which
command to run). It is the largest single English prose text in Debian's main archive that
needs nothing but the package manager and is the same on every machine: a fixed text, no
download at run time.

The split is by chapter and deterministic: of the 1,189 chapters in canonical order, every
20th (indices 19, 39, ...: 59 chapters, about 5 % of the bytes) is validation, the rest
training. Interleaving keeps both splits drawn from every book. The text is re-formatted from
the program's listing: the "Book N" heading lines and the verse numbers are dropped, each verse
is one line, chapters end with a blank line. Tokens are bytes (vocabulary 256, of which the
text uses 63), so bits per character is nats per token / ln 2.
"""

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
DEFAULT_OUT = ROOT / "build" / "datasets" / "kjv"
VALIDATION_EVERY = 20
# What `bible gen1:1-rev22:21` must give: a check that the package is the text we describe.
EXPECTED_CHAPTERS = 1189
EXPECTED_VERSES = 31102
FORMAT = 1


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def ensure_bible_program():
    """The path of `bible`, installing Debian's bible-kjv (and bible-kjv-text) if missing."""
    path = shutil.which("bible") or ("/usr/bin/bible" if os.path.exists("/usr/bin/bible") else None)
    if path:
        return path
    if os.geteuid() != 0:
        raise SystemExit("corpus.py: the `bible` program is missing; install it with "
                         "`sudo apt-get install bible-kjv` (it brings bible-kjv-text, the text)")
    print("corpus.py: installing bible-kjv with apt-get", file=sys.stderr, flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "--no-install-recommends", "bible-kjv"]
    if subprocess.run(cmd, env=env, stdout=sys.stderr).returncode != 0:
        subprocess.run(["apt-get", "update"], env=env, stdout=sys.stderr, check=False)
        if subprocess.run(cmd, env=env, stdout=sys.stderr).returncode != 0:
            raise SystemExit("corpus.py: apt-get install bible-kjv failed (output above)")
    path = shutil.which("bible") or "/usr/bin/bible"
    if not os.path.exists(path):
        raise SystemExit("corpus.py: bible-kjv is installed but there is no `bible` program")
    return path


def read_chapters(bible):
    """[(heading, [verse text, ...]), ...] in canonical order, from the `bible` program."""
    out = subprocess.run([bible, "-l100000", "gen1:1-rev22:21"], check=True,
                         stdout=subprocess.PIPE, env=dict(os.environ, COLUMNS="100000")).stdout
    chapters = []
    verse = re.compile(r"^\s+(\d+) (.*)$")
    for line in out.decode("ascii").splitlines():
        if not line.strip():
            continue
        m = verse.match(line)
        if m:
            if not chapters:
                raise SystemExit("corpus.py: `bible` printed a verse before any chapter heading")
            chapters[-1][1].append(m.group(2).strip())
        else:
            chapters.append((line.strip(), []))
    verses = sum(len(v) for _, v in chapters)
    if len(chapters) != EXPECTED_CHAPTERS or verses != EXPECTED_VERSES:
        raise SystemExit("corpus.py: `bible` printed %d chapters and %d verses; expected %d and "
                         "%d (a different bible-kjv-text?)" % (len(chapters), verses,
                                                              EXPECTED_CHAPTERS, EXPECTED_VERSES))
    return chapters, sha256(out)


def build(out_dir):
    chapters, source_sha = read_chapters(ensure_bible_program())
    text, train, val = [], [], []
    for i, (_, verses) in enumerate(chapters):
        block = ("\n".join(verses) + "\n\n").encode("ascii")
        text.append(block)
        (val if i % VALIDATION_EVERY == VALIDATION_EVERY - 1 else train).append(block)
    files = {"kjv.txt": b"".join(text), "train.bin": b"".join(train), "val.bin": b"".join(val)}
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        tmp = out_dir / (name + ".tmp")
        tmp.write_bytes(data)
        tmp.replace(out_dir / name)
    meta = {
        "format": FORMAT,
        "corpus": "King James Bible (Debian bible-kjv-text, read with bible-kjv's `bible`)",
        "source_sha256": source_sha,
        "chapters": len(chapters),
        "verses": sum(len(v) for _, v in chapters),
        "split": "chapter i (0-based, canonical order) is validation when i %% %d == %d"
                 % (VALIDATION_EVERY, VALIDATION_EVERY - 1),
        "validation_chapters": len(chapters) // VALIDATION_EVERY,
        "tokens": "bytes (vocabulary 256)",
        "vocabulary_used": len(set(files["kjv.txt"])),
        "bytes": {k: len(v) for k, v in files.items()},
        "sha256": {k: sha256(v) for k, v in files.items()},
    }
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def cached(out_dir):
    """meta.json when every file it names is there with its recorded hash, else None."""
    try:
        meta = json.loads((out_dir / "meta.json").read_text())
        if meta.get("format") != FORMAT:
            return None
        for name, digest in meta["sha256"].items():
            if sha256((out_dir / name).read_bytes()) != digest:
                return None
        return meta
    except (OSError, ValueError, KeyError, TypeError):
        return None


def prepare(out_dir=DEFAULT_OUT, force=False):
    """The corpus directory, built when missing or stale; returns (dir, meta)."""
    out_dir = Path(out_dir)
    meta = None if force else cached(out_dir)
    if meta is None:
        meta = build(out_dir)
    return out_dir, meta


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="output directory (%(default)s)")
    parser.add_argument("--force", action="store_true", help="rebuild even when cached")
    args = parser.parse_args(argv)
    out_dir, meta = prepare(args.out, args.force)
    print("corpus.py: %s: %d training and %d validation bytes (%d chapters, every %dth held "
          "out), %d distinct byte values" % (meta["corpus"], meta["bytes"]["train.bin"],
                                             meta["bytes"]["val.bin"], meta["chapters"],
                                             VALIDATION_EVERY, meta["vocabulary_used"]),
          file=sys.stderr)
    print(out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
