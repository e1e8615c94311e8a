"""Future map: next-iteration inputs passed on the device, one row per req_to_token row, so
the host never waits for iteration k before launching k+1 (SGLang's FutureMap, keyed by row).

    seq_lens   [R+1]     kv_committed_len after the last forward      (publish)
    bonus      [R+1]     next input token (the verify bonus / sampled token)   (stash)
    hidden     [R+1, H]  frozen: seed hidden; eagle: draft hidden            (stash)
    topk_logp/topk_index [R+1, K]   eagle step-0 candidates                  (stash)
    pre_*      [R+1, C]  draft candidates pre-executed for the next round (zb_draft_preexec;
                         C = 0 until the spec worker holds them: `hold_predrafts`; a
                         worker of fewer candidates, a schedule bucket's, writes and reads
                         the first columns)
Row 0 mirrors the padding row of graph-padded lanes.

    publish(rows, new_seq_lens)  forward stream, between verify/commit and seed/draft extend
    resolve_seq_lens(rows)       gathers the lengths: on the forward stream, where stream
                                 order suffices
    stash(rows, x) / gather(rows)  next draft inputs (stream order suffices)
    publish_ready                an event the worker records right after each publish
                                 (`mark_published`; after the replay of the graph that
                                 published), only while the host reads lengths (`host_reads`:
                                 overlap with zb_device_seq_lens off, set by the scheduler):
                                 `host_seq_lens` waits on it on the schedule stream, then
                                 reads (SGLang's resolve_seq_lens_cpu)
Inside a captured segment each of these is one self-stamping kernel (kernels/move_rows.py):
    resolve_into(rows, fields, stamp)  every gather of the step, into the graphs' inputs
    write(rows, mark, ...)             a segment's tail: publish and/or stash (eager: `mark`
                                       begins each stage, then the ops above)
Filtering or merging batches moves only row indices; no data moves. A row freed at k and
reused by a new request while k's overshoot step is in flight is safe: the new owner's
publish/stash come later in forward-stream order and win.

Debug mode (`poison=True`): buffers start at -1 and every resolve/gather checks that it reads
a fresh publish (>= 0) and writes -1 back (consume-once); a stale read raises.
"""
from __future__ import annotations

import torch

from ..core import DraftInputs
from ..device import current_cuda_stream
from ..kernels.move_rows import RowMove, move_rows_triton


class FutureMapError(RuntimeError):
    pass


class FutureMap:
    def __init__(self, num_rows: int, hidden_size: int, topk: int, dtype: torch.dtype,
                 device, *, with_topk: bool, num_candidates: int = 0, poison: bool = False):
        R = num_rows + 1
        dev = device.torch_device
        fill = -1 if poison else 0
        self.poison = poison
        self.seq_lens = torch.full((R,), fill, dtype=torch.long, device=dev)
        self.bonus = torch.full((R,), fill, dtype=torch.long, device=dev)
        self.hidden = torch.zeros(R, hidden_size, dtype=dtype, device=dev)
        self.topk_logp = torch.zeros(R, topk, device=dev) if with_topk else None
        self.topk_index = torch.zeros(R, topk, dtype=torch.long, device=dev) if with_topk else None
        self.hold_predrafts(num_candidates)
        self.publish_ready = device.new_event()
        self.host_reads = True      # the host reads published lengths (zb_device_seq_lens off)
        # the cached current stream (Event.record() without one builds a Stream per call)
        self._current_stream = current_cuda_stream if device.is_cuda else lambda: None

    def hold_predrafts(self, num_candidates: int) -> None:
        """Room for `num_candidates` pre-drafted candidates per row (before any capture
        reads the fields)."""
        R, C, dev = self.seq_lens.shape[0], num_candidates, self.seq_lens.device
        self.pre_scores = torch.zeros(R, C, device=dev)
        self.pre_tokens = torch.zeros(R, C, dtype=torch.long, device=dev)
        self.pre_parents = torch.zeros(R, C, dtype=torch.long, device=dev)

    # -- lengths ---------------------------------------------------------------------------
    def publish(self, rows: torch.Tensor, new_seq_lens: torch.Tensor) -> None:
        self.publish_rows(rows, new_seq_lens)
        self.mark_published()

    def publish_rows(self, rows: torch.Tensor, new_seq_lens: torch.Tensor) -> None:
        """The device half of publish (graph-capturable)."""
        self.seq_lens[rows] = new_seq_lens.long()

    def mark_published(self) -> None:
        """The host half of a publish: `publish_ready` after the work queued so far (never
        captured: after the replay of a graph that published); recorded only where a host
        read waits on it (`host_reads`)."""
        if self.host_reads:
            self.publish_ready.record(self._current_stream())

    def resolve_seq_lens(self, rows: torch.Tensor) -> torch.Tensor:
        s = self.seq_lens[rows]
        if self.poison:
            self._consume(self.seq_lens, rows, s, "seq_lens")
        return s

    def host_seq_lens(self, rows: torch.Tensor, stream=None) -> list[int]:
        """The lengths on the host (zb_device_seq_lens off): `stream` (the current one)
        waits on `publish_ready` (the last publish's), then a sync on the read."""
        if stream is not None:
            stream.wait_event(self.publish_ready)
        return self.seq_lens[rows].tolist()

    def resolve_into(self, rows: torch.Tensor, fields: list[tuple], stamp=None) -> None:
        """A captured resolve: dst <- field[rows] + add for every (dst, field name, pad, add),
        `pad` on graph-padding lanes (row 0: they must read what GraphRunner pads them with,
        not what padding lanes last wrote into row 0); one kernel carrying resolve's stamps
        (`stamp`: its graph's `mark.carry("resolve")`)."""
        move_rows_triton(rows, [RowMove(d, _cols(getattr(self, f), d), pad, add)
                                for d, f, pad, add in fields], True, 0, stamp)

    def write(self, rows: torch.Tensor, mark, seq_lens: torch.Tensor | None = None,
              inputs: DraftInputs | None = None, predraft: tuple | None = None) -> None:
        """A segment's tail: publish `seq_lens`, then stash `inputs` or the pre-drafted
        candidates, `mark(stage)` beginning each; in a captured graph (`mark.captured`) one
        kernel carrying their stamps. The host half of a publish, `mark_published`, is the
        caller's: after the segment, or after the replay of its graph."""
        pub = [RowMove(self.seq_lens, seq_lens)] if seq_lens is not None else []
        stash = self._stash_moves(inputs, predraft)
        if mark.captured:
            names = ("publish",) * bool(pub) + ("stash",) * bool(stash)
            # the kernel reads a 2-D field's columns contiguously (a 1-D one by its stride)
            moves = [RowMove(m.dst, m.src.contiguous() if m.src.dim() == 2 else m.src)
                     for m in pub + stash]
            move_rows_triton(rows, moves, False, len(pub) if pub and stash else 0,
                             mark.carry(*names))
            return
        for name, moves in (("publish", pub), ("stash", stash)):
            if moves:
                mark(name)
                _scatter(rows, moves)

    def _stash_moves(self, x: DraftInputs | None, predraft: tuple | None) -> list[RowMove]:
        """The fields stash writes, as row moves: the next draft inputs `x` (bonus, hidden
        when both have one, the top-k when both have it), or the pre-drafted candidates."""
        if predraft is not None:
            return [RowMove(_cols(b, v), v) for b, v in zip((self.pre_scores, self.pre_tokens,
                                                             self.pre_parents), predraft)]
        if x is None:
            return []
        moves = [RowMove(self.bonus, x.bonus)]
        if x.hidden is not None and self.hidden.shape[1]:
            moves.append(RowMove(self.hidden, x.hidden))
        if self.topk_logp is not None and x.topk_logp is not None:
            moves += [RowMove(self.topk_logp, x.topk_logp),
                      RowMove(self.topk_index, x.topk_index)]
        return moves

    # -- draft inputs -----------------------------------------------------------------------
    def stash(self, rows: torch.Tensor, x: DraftInputs) -> None:
        _scatter(rows, self._stash_moves(x, None))

    def gather(self, rows: torch.Tensor) -> DraftInputs:
        bonus = self.bonus[rows]
        if self.poison:
            self._consume(self.bonus, rows, bonus, "bonus")
        if self.topk_logp is None:
            return DraftInputs(bonus, self.hidden[rows])
        return DraftInputs(bonus, self.hidden[rows], self.topk_logp[rows], self.topk_index[rows])

    def gather_predraft(self, rows, num_candidates: int):
        C = num_candidates
        return (self.pre_scores[rows, :C], self.pre_tokens[rows, :C],
                self.pre_parents[rows, :C])

    def _consume(self, buf: torch.Tensor, rows: torch.Tensor, vals: torch.Tensor,
                 name: str) -> None:
        """Debug: every value read must come from a fresh publish/stash; then poison it."""
        real = rows > 0                       # row 0: graph padding, never published
        if bool(((vals < 0) & real).any()):   # a host sync: debug mode only
            stale = rows[(vals < 0) & real].tolist()
            raise FutureMapError(f"resolve of {name} for rows {stale} without a fresh publish "
                                 "(consume-once violated).")
        buf[rows[real]] = -1


def _cols(field: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A 2-D field's first columns as wide as `like` (a view: rows keep their stride)."""
    if field.dim() == 2 and like.dim() == 2 and field.shape[1] != like.shape[1]:
        return field[:, :like.shape[1]]
    return field


def _scatter(rows: torch.Tensor, moves: list[RowMove]) -> None:
    """The eager ops of a scatter: dst[rows] = src, cast to dst's dtype."""
    for m in moves:
        m.dst[rows] = m.src.to(m.dst.dtype)
