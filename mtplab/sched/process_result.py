"""The `process_result` stage: a step's results -> output tokens, lengths, finished requests.

    prefill  output += [sampled token]; kv_committed_len = prefill_len -- for a request whose
             final chunk this step fed (an earlier chunk's token is not a result)
    decode   output += tokens[:accept_len] (up to a stop / the length limit);
             kv_committed_len += accept_len  -- the ONE place it advances, never for a request
             that already finished (an overshoot row of the overlap loop commits nothing)
A decode step is processed as arrays over its lanes (sched/rows.py): which lanes are live,
how many tokens each keeps (the first stop id, the length limit), which finish, the lengths
advanced; per request only the append of its kept tokens and its arrival time remain.
Live-request identity after processing: len(prompt) + len(output) == kv_committed_len + 1.
A token NONFINITE_TOKEN (the target's forward was not finite: kernels/sampling.py
finite_rows, flag_nonfinite) raises NonFiniteLogitsError for its request: one comparison per
request (decode: one array comparison per step).
"""
from __future__ import annotations

import time
from typing import Optional

import numpy as np

from ..core import NONFINITE_TOKEN, Req
from ..errors import NonFiniteLogitsError
from .rows import Batch, HostRows


def _nonfinite(r: Req, where: str) -> NonFiniteLogitsError:
    return NonFiniteLogitsError(f"the target's forward is not finite for request {r.rid} at "
                                f"its {where} (a NaN or an inf in its logits, or a hidden "
                                f"state too large for the final norm)", r.rid,
                                tuple(r.fill_ids()))


def append_prefill(reqs: list[Req], toks: np.ndarray, host: HostRows,
                   final: Optional[list] = None) -> list[Req]:
    """-> the requests the prefill token finished (`final`: per request, did this step
    feed its final chunk; an earlier chunk's token is not a result)."""
    done = []
    for i, (r, t) in enumerate(zip(reqs, toks.tolist())):
        if r.finished or r.kv is None or (final is not None and not final[i]):
            continue
        if t == NONFINITE_TOKEN:
            raise _nonfinite(r, "prefill")
        r.kv.kv_committed_len = r.prefill_len
        r.append_tokens([t])
        host.out_len[r.kv.row] = len(r.output_ids)
        if r.finished:
            done.append(r)
    return done


def append_decode(batch: Batch, toks: np.ndarray, lens: np.ndarray, host: HostRows,
                  committed: np.ndarray, stats, step: int = -1, drafted: int = 0) -> list[Req]:
    """Lane i of `batch` keeps toks[i, :lens[i]] up to its first stop id or its length limit;
    -> the requests that finished. The common step (every lane live, no stop id in the
    batch) is a dozen array operations; the rest only where a lane needs it. The live lanes'
    accept lengths, context positions (committed KV before this verify) and the step's
    acceptance (`step`: the iteration that launched it; `drafted`: draft tokens each lane
    proposed) go to `stats` from the arrays read back already (no device read)."""
    rows, rids, reqs = batch.rows, batch.rids, batch.reqs
    rid = host.rid[rows]
    live = None if (rid == rids).all() else rid == rids
    bad = toks[:, 0] == NONFINITE_TOKEN
    if live is not None:
        bad &= live
    if bad.any():
        r = reqs[int(bad.argmax())]
        raise _nonfinite(r, f"decode step {len(r.output_ids)}")
    room = host.max_new[rows] - host.out_len[rows]
    kept = np.minimum(lens, room)
    stop = None
    if batch.has_stops:
        E = toks.shape[1]
        hit = (toks[:, :, None] == batch.stops[:, None, :]).any(-1) & \
            (np.arange(E) < kept[:, None])
        stop = hit.any(1)
        kept = np.where(stop, hit.argmax(1) + 1, kept)
    done = kept >= room
    if stop is not None:
        done |= stop
    if live is not None:                  # overshoot lanes (finished, aborted) keep nothing
        done &= live
        kept = np.where(live, kept, 0)
        stats.overshoot_rows += len(reqs) - int(live.sum())
        lv, ctx = lens[live], committed[rows[live]]
    else:
        lv, ctx = lens, committed[rows]
    stats.accept_lens.extend(lv.tolist())
    stats.accept_ctx.extend(ctx.tolist())
    stats.draft_tokens.extend([drafted] * lv.size)
    stats.verify_steps.append((step, lv.size, int(lv.sum()) - lv.size, drafted * lv.size))
    host.out_len[rows] += kept
    adv = ~done if live is None else live & ~done
    committed[rows[adv]] += lens[adv]
    stats.decode_tokens += int(kept.sum())
    now, tl, kl = time.perf_counter(), toks.tolist(), kept.tolist()
    for i in (range(len(reqs)) if live is None else np.flatnonzero(live).tolist()):
        r, k = reqs[i], kl[i]
        r.output_ids += tl[i][:k]
        r.arrivals.append((now, k))
    if not done.any():
        return []
    finished = []
    for i in np.flatnonzero(done).tolist():
        r = reqs[i]
        r.finished_reason = "stop" if stop is not None and stop[i] else "length"
        finished.append(r)
    return finished
