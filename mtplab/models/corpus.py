"""Training corpus: the CPython standard library's own `*.py` files, read as bytes.

File list (deterministic for a given Python build):
    root      sysconfig.get_paths()["stdlib"]
    files     every `*.py` under root, as sorted POSIX relative paths, skipping any path with a
              directory part in SKIP_DIRS (third-party packages, encoding tables) and files
              larger than MAX_FILE_BYTES (generated data such as pydoc_data/topics.py)
    split     held out iff sha256(relative path) mod 100 < HELDOUT_PERCENT: a property of the
              path alone, so a file held out under one Python version is held out under all
Token stream of a split: for each file in order, <bos> + its bytes (ByteTokenizer ids) + <eos>.
"""
from __future__ import annotations

import hashlib
import os
import platform
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from .tokenizer import BOS, BYTE0, EOS

SKIP_DIRS = frozenset({"site-packages", "dist-packages", "encodings", "__pycache__"})
MAX_FILE_BYTES = 200_000
HELDOUT_PERCENT = 5


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_heldout(relpath: str, percent: int = HELDOUT_PERCENT) -> bool:
    digest = hashlib.sha256(relpath.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % 100 < percent


def list_files(root: Path, max_file_bytes: int = MAX_FILE_BYTES) -> list[str]:
    """Sorted POSIX relative paths of the corpus files under `root` (see module docstring)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
        for name in filenames:
            p = Path(dirpath) / name
            if name.endswith(".py") and p.is_file() and p.stat().st_size <= max_file_bytes:
                out.append(p.relative_to(root).as_posix())
    return sorted(out)


def encode_files(root: Path, files: list[str]) -> torch.Tensor:
    """int16 ids: <bos> bytes <eos> per file, concatenated in list order."""
    parts = []
    for rel in files:
        raw = bytearray((root / rel).read_bytes())
        data = (torch.frombuffer(raw, dtype=torch.uint8) if raw
                else torch.zeros(0, dtype=torch.uint8))
        parts += [torch.tensor([BOS], dtype=torch.int16), data.to(torch.int16) + BYTE0,
                  torch.tensor([EOS], dtype=torch.int16)]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int16)


@dataclass
class Corpus:
    root: str
    python_version: str
    train_files: list[str]
    heldout_files: list[str]
    train: torch.Tensor          # int16 token stream
    heldout: torch.Tensor

    def summary(self) -> dict:
        return {"root": self.root, "python_version": self.python_version,
                "train_files": len(self.train_files), "heldout_files": len(self.heldout_files),
                "train_tokens": int(self.train.numel()),
                "heldout_tokens": int(self.heldout.numel()),
                "skip_dirs": sorted(SKIP_DIRS), "max_file_bytes": MAX_FILE_BYTES,
                "heldout_rule": f"sha256(relpath) mod 100 < {HELDOUT_PERCENT}",
                "heldout_file_list": self.heldout_files}


def load_corpus(root: Optional[Path] = None, max_files: Optional[int] = None) -> Corpus:
    """The stdlib corpus (or the first `max_files` files of it, for smoke tests)."""
    root = Path(root) if root is not None else stdlib_root()
    files = list_files(root)[:max_files]
    train = [f for f in files if not is_heldout(f)]
    held = [f for f in files if is_heldout(f)]
    return Corpus(str(root), platform.python_version(), train, held,
                  encode_files(root, train), encode_files(root, held))


def code_snippets(root: Path, files: list[str], n: int, nbytes: int) -> list[str]:
    """`n` prompts of about `nbytes` bytes, each from a different file (in list order, skipping
    files too short), starting at the first line boundary past 1/4 of the file."""
    out = []
    for rel in files:
        text = (root / rel).read_bytes().decode("utf-8", errors="ignore")
        if len(text) < 4 * nbytes:
            continue
        start = text.find("\n", len(text) // 4) + 1
        end = text.rfind("\n", start, start + nbytes) + 1
        if end > start:
            out.append(text[start:end])
        if len(out) == n:
            break
    return out


def heldout_snippets(n: int, nbytes: int) -> list[str]:
    """`n` prompts of about `nbytes` bytes of held-out stdlib code (code_snippets over every
    held-out file; they repeat in order when `n` exceeds them)."""
    root = stdlib_root()
    texts = code_snippets(root, [f for f in list_files(root) if is_heldout(f)], n, nbytes)
    return [texts[i % len(texts)] for i in range(n)]


def token_counts(stream: torch.Tensor, vocab_size: int) -> list[int]:
    """How often each id occurs in a token stream: the ranking a hot draft vocabulary takes
    its N most frequent tokens from (models/draft_vocab.py)."""
    return torch.bincount(stream.long(), minlength=vocab_size)[:vocab_size].tolist()
