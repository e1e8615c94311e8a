"""The scheduler loop's options and the rule read off them, torch-free: the scheduler
(sched/scheduler.py) runs them, the what-if predictor (analysis/whatif.py) replays them; both
read them here.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoopOptions:
    """The loop's knobs; async_d2h and device_seq_lens are the zero-bubble sub-knobs the loop
    owns (zero_bubble.py: the engine builds them from that table)."""
    overlap: bool = False
    async_d2h: bool = True         # results -> pinned buffers on the copy stream (else the host
                                   #   waits for the forward stream, then .tolist())
    device_seq_lens: bool = True   # False: the host reads resolved seq_lens each speculative
                                   #   decode under overlap (a sync)
    debug_syncs: bool = False      # list host syncs per decode step (CUDA sync debug mode)


def reads_lengths(loop, speculative: bool) -> bool:
    """Does the host read the published lengths before it prepares a decode (a sync on the
    previous verify's publish)? Only where it cannot know them: under overlap with
    device_seq_lens off, for a speculative decode, which advances each request by its accept
    length (the host learns it a step late). A target-only decode advances every request by
    one token, so the host's own lengths + lag are exact (SGLang's resolve_seq_lens_cpu
    returns at once without a draft). `loop`: LoopOptions, or what has its overlap and
    device_seq_lens (the predictor's model of the loop)."""
    return loop.overlap and not loop.device_seq_lens and speculative
