"""What every part of the meter's validation shares: the workload (tiny-code frozen, the
overlap modes, the planted-delay regimes), its prompts, PASS/MISS, planted host waits (an
exact spin, a sleep whose last SLACK_US is spun). Timed runs pause the collector with
mtplab.nogc.gc_paused(collect=True)."""
from __future__ import annotations

import time

from mtplab.models.corpus import heldout_snippets

BASE = dict(model="tiny-code", draft="frozen_kv_mtp", fold_seed=True, context_len=1024)
OVERLAP = {"off": dict(overlap=False), "on+zb": dict(overlap=True, zero_bubble=True)}
DELAYS_MS = (0.2, 1.0, 5.0)
# planted-delay regimes: (config, batch size, decode tokens per generate)
REGIMES = {
    "host-bound": (BASE, 1, 192),
    "gpu-bound": (dict(model="llama3-8b-like@16", draft="none", context_len=1024), 8, 64),
}


def prompts(eng, n, nbytes=256):
    return [eng.tokenizer.encode(t) for t in heldout_snippets(n, nbytes)]


def sig(xs) -> list[float]:
    """Measurements as the results file keeps them: floats to 6 significant digits."""
    return [float(f"{float(x):.6g}") for x in xs]


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def spin_us(us: float, since_ns: int | None = None) -> None:
    """Busy-wait until `us` after `since_ns` (perf_counter_ns; None: now): the planted host
    time is exact (a sleep overshoots by the timer slack)."""
    t = time.perf_counter_ns() if since_ns is None else since_ns
    while time.perf_counter_ns() - t < us * 1e3:
        pass


SLACK_US = 100.0     # a sleep's overshoot this machine's timer slack allows (spun instead)


def sleep_us(us: float) -> None:
    """The planted delay: sleep (the CPU is given up, as a real per-step hook's wait does),
    the last SLACK_US spun so that the planted time is d, not d plus the timer's overshoot."""
    t = time.perf_counter_ns()
    if us > SLACK_US:
        time.sleep((us - SLACK_US) * 1e-6)
    spin_us(us, t)
