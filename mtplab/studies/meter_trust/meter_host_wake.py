"""How much slower the host's next piece of work is right after it was away for d (part
`host-wake`; runs on CPU too)."""
from __future__ import annotations

import time

import numpy as np

from mtplab.nogc import gc_paused

from .meter_common import DELAYS_MS, sleep_us, spin_us


def host_wake(rows: list, reps: int = 150, device: str = "cuda",
              data: dict | None = None) -> None:
    """How much slower is the host's next piece of work after it was away for d (the planted
    hook's sleep, or a busy-wait)? Works, each timed on the host right after the wait, the
    d arms interleaved: `python` walks 15k of 150k small dicts (no CUDA call, about the
    engine's host step in length), `launch x6` issues six small tensor ops on `device`
    without waiting, `launch x6 + sync` then synchronizes. The rise over d = 0 is host time
    a planted delay adds to the next step beyond d (no target; explains the planted rows).
    `data` (given) gets every repeat's µs per work, wait and d under "host_wake"."""
    import torch
    objs = [{"a": i, "b": str(i)} for i in range(150_000)]
    x = torch.ones(256, device=device)

    def python():
        s = 0
        for o in objs[::10]:
            s += o["a"]

    def launch():
        y = x
        for _ in range(6):
            y = y + 1

    def launch_sync():
        launch()
        if x.is_cuda:
            torch.cuda.synchronize()
    ds = (0.0, *DELAYS_MS)
    rows += ["", f"Host work right after a wait of d (median µs over {reps}, the d arms "
             "interleaved, GC off; + the rise over d = 0):", "",
             "| work | wait | " + " | ".join(f"d = {d:g} ms" for d in ds) + " |",
             "|---|---" + "|---" * len(ds) + "|"]
    with gc_paused(collect=True):
        for name, work in (("python", python), ("launch x6", launch),
                           ("launch x6 + sync", launch_sync)):
            for _ in range(20):
                work()
            launch_sync()
            for wait_name, wait in (("sleep", sleep_us), ("spin", spin_us)):
                took = {d: [] for d in ds}
                for _ in range(reps):
                    for d in ds:
                        wait(d * 1e3)
                        t = time.perf_counter_ns()
                        work()
                        took[d].append((time.perf_counter_ns() - t) / 1e3)
                    launch_sync()                   # a launch arm's queue drained per repeat
                if data is not None:
                    data.setdefault("host_wake", []).extend(
                        {"work": name, "wait": wait_name, "d_ms": d,
                         "us": [round(x, 3) for x in v]} for d, v in took.items())
                base = float(np.median(took[0.0]))
                rows.append(f"| {name} | {wait_name} | {base:.1f} | " + " | ".join(
                    f"{np.median(took[d]):.1f} ({np.median(took[d]) - base:+.1f})"
                    for d in ds[1:]) + " |")
