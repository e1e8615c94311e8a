"""The `process_result` stage: a step's results -> output tokens, lengths, finished requests.

    prefill  output += [sampled token]; kv_committed_len = prefill_len -- for a request whose
             final chunk this step fed (an earlier chunk's token is not a result)
    decode   output += tokens[:accept_len] (up to a stop / the length limit);
             kv_committed_len += accept_len  -- the ONE place it advances, never for a request
             that already finished (an overshoot row of the overlap loop commits nothing)
Live-request identity after processing: len(prompt) + len(output) == kv_committed_len + 1.
A token NONFINITE_TOKEN (the target's forward was not finite: kernels/sampling.py
finite_rows, flag_nonfinite) raises NonFiniteLogitsError for its request: one comparison per
request.
"""
from __future__ import annotations

from typing import Optional

from ..core import NONFINITE_TOKEN, Req
from ..errors import NonFiniteLogitsError


def _nonfinite(r: Req, where: str) -> NonFiniteLogitsError:
    return NonFiniteLogitsError(f"the target's forward is not finite for request {r.rid} at "
                                f"its {where} (a NaN or an inf in its logits, or a hidden "
                                f"state too large for the final norm)", r.rid,
                                tuple(r.fill_ids()))


def append_prefill(reqs: list[Req], toks: list, final: Optional[list] = None) -> None:
    for i, (r, t) in enumerate(zip(reqs, toks)):
        if r.finished or r.kv is None or (final is not None and not final[i]):
            continue
        if t == NONFINITE_TOKEN:
            raise _nonfinite(r, "prefill")
        r.kv.kv_committed_len = r.prefill_len
        r.append_tokens([t])


def append_decode(reqs: list[Req], toks: list, lens: list, stats) -> None:
    for r, t, n in zip(reqs, toks, lens):
        if r.finished or r.kv is None:       # overshoot row: commits nothing
            stats.overshoot_rows += 1
            continue
        if t[0] == NONFINITE_TOKEN:
            raise _nonfinite(r, f"decode step {len(r.output_ids)}")
        stats.accept_lens.append(n)
        stats.decode_tokens += r.append_tokens(t[:n])
        if not r.finished:
            r.kv.kv_committed_len += n
