"""The `process_result` stage: a step's results -> output tokens, lengths, finished requests.

    prefill  output += [sampled token]; kv_committed_len = prefill_len
    decode   output += tokens[:accept_len] (up to a stop / the length limit);
             kv_committed_len += accept_len  -- the ONE place it advances, never for a request
             that already finished (an overshoot row of the overlap loop commits nothing)
Live-request identity after processing: len(prompt) + len(output) == kv_committed_len + 1.
"""
from __future__ import annotations

from ..core import Req


def append_prefill(reqs: list[Req], toks: list) -> None:
    for r, t in zip(reqs, toks):
        if r.finished or r.kv is None:
            continue
        r.kv.kv_committed_len = r.prefill_len
        r.append_tokens([t])


def append_decode(reqs: list[Req], toks: list, lens: list, stats) -> None:
    for r, t, n in zip(reqs, toks, lens):
        if r.finished or r.kv is None:       # overshoot row: commits nothing
            stats.overshoot_rows += 1
            continue
        stats.accept_lens.append(n)
        stats.decode_tokens += r.append_tokens(t[:n])
        if not r.finished:
            r.kv.kv_committed_len += n
