"""Stand-in engines for the peer harness's tests (mtplab/studies/peers/side_by_side.py): no
torch, no SGLang, no GPU. Test harness only.

FakeSide runs inside a real worker process (`--side tests.peer_fakes:FakeSide`); its config
says how it behaves: `fail_start` (print a traceback line to the log, then raise), `hang_op`
(sleep forever on that op), `tok_s` (tokens per second it pretends to decode).
"""
from __future__ import annotations

import sys
import time


class FakeSide:
    def __init__(self, config: dict):
        self.c = config
        self.runs = 0

    def start(self) -> dict:
        if self.c.get("fail_start"):
            print("Traceback (most recent call last):", file=sys.stderr)
            print(f"ValueError: {self.c['fail_start']}", file=sys.stderr, flush=True)
            raise RuntimeError("Initialization failed. Please see the error messages above.")
        return {"engine": "fake"}

    def _maybe_hang(self, op: str) -> None:
        if self.c.get("hang_op") == op:
            time.sleep(3600)

    def run(self, prompts: list, new_tokens: int) -> dict:
        self._maybe_hang("run")
        self.runs += 1
        bs = len(prompts)
        return {"wall_s": bs * new_tokens / self.c.get("tok_s", 1000.0),
                "tokens": [new_tokens] * bs, "decode_steps": max(1, new_tokens - 1),
                "accept_len": None}

    def profile(self, prompts: list, new_tokens: int, warmup_tokens: int, dir: str,
                steps: int) -> dict:
        self._maybe_hang("profile")
        return {"trace": None, "meter": {}}

    def close(self) -> None:
        pass
