"""Byte-level tokenizer used by the random presets.

    id 0 <pad>   id 1 <bos>   id 2 <eos>   ids 3..258 = bytes 0..255   (vocab_size >= 259)

`encode` returns exactly the ids the engine feeds (with <bos> first unless add_bos=False).
"""
from __future__ import annotations

from dataclasses import dataclass

PAD, BOS, EOS, BYTE0 = 0, 1, 2, 3


@dataclass(frozen=True)
class ByteTokenizer:
    vocab_size: int = 320
    pad_token_id: int = PAD
    bos_token_id: int = BOS
    eos_token_id: int = EOS

    def __post_init__(self):
        if self.vocab_size < BYTE0 + 256:
            raise ValueError(f"a byte tokenizer needs vocab_size >= {BYTE0 + 256}.")

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        ids = [b + BYTE0 for b in text.encode("utf-8")]
        return [BOS] + ids if add_bos else ids

    def decode(self, ids: list[int]) -> str:
        data = bytes(i - BYTE0 for i in ids if BYTE0 <= i < BYTE0 + 256)
        return data.decode("utf-8", errors="replace")
