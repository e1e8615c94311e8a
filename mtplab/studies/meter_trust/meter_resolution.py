"""Stamp resolution (back-to-back stamp kernels on a backlogged stream), the host cost of one
eager stamp, and the GPU's wake-up latency after the host was idle for d (part `resolution`)."""
from __future__ import annotations

import statistics
import time

import numpy as np

from mtplab.nogc import gc_paused

from .meter_common import spin_us


def resolution(rows: list, n: int = 2000, data: dict | None = None) -> None:
    """`data` (given) gets the part's figures under "resolution" (and "wake")."""
    import torch
    from mtplab.instrument.meter import BubbleMeter
    m = BubbleMeter(torch.device("cuda"), capacity=4096)
    code = m.stamp_code("verify", "forward", False)
    torch.cuda._sleep(1000)
    m.device_stamp(code)                 # compile + load outside the measurement
    torch.cuda.synchronize()
    start = int(m.count[0])
    torch.cuda._sleep(50_000_000)        # the stamps below queue behind it: back to back
    for _ in range(n):
        m.device_stamp(code)
    torch.cuda.synchronize()
    slots = (start + np.arange(n)) & (m.capacity - 1)
    ns = m.ring.cpu().numpy()[slots, 1]
    d = np.diff(ns)
    nz = d[d > 0]
    rows += ["", f"Stamp resolution ({n} back-to-back stamp kernels on a backlogged stream): "
             f"min nonzero delta {nz.min() if nz.size else float('nan'):.0f} ns, median delta "
             f"{np.median(d):.0f} ns, {100 * (d == 0).mean():.1f}% of deltas 0 (same timer "
             f"tick), distinct ticks {np.unique(ns).size}."]
    # host cost of one eager stamp: an idle stream (the GPU keeps up, so no launch waits for
    # a slot in a full launch queue), 200 stamps per timing, median of 5
    per = []
    for _ in range(5):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(200):
            m.stamp(code)
        per.append((time.perf_counter() - t) / 200 * 1e6)
    torch.cuda.synchronize()
    rows += [f"Host cost of one eager stamp (idle stream): {statistics.median(per):.2f} µs per "
             f"launch (launch path: "
             f"{'direct compiled launcher' if m._launch.direct else 'Triton JIT'})."]
    if data is not None:
        data["resolution"] = {
            "n": n, "min_nonzero_ns": float(nz.min()) if nz.size else None,
            "median_delta_ns": float(np.median(d)), "zero_frac": float((d == 0).mean()),
            "ticks": int(np.unique(ns).size), "eager_stamp_us": [float(x) for x in per],
            "launch": "direct compiled launcher" if m._launch.direct else "Triton JIT"}
    wake_latency(rows, m, code, data=data)


def wake_latency(rows: list, m, code: int, reps: int = 40, data: dict | None = None) -> None:
    """Stamp A, host busy-waits d, then stamp B (a kernel, or a replay of a graph holding one
    stamp): the device gap B - A minus the host gap = how much later than its launch B
    starts after d of idle. Its rise with d is real GPU idle a planted delay adds beyond d.
    `data` (given) gets every repeat's µs per kind and d under "wake"."""
    import torch
    g = torch.cuda.CUDAGraph()
    with gc_paused(), torch.cuda.graph(g):
        m.device_stamp(code)
    torch.cuda.synchronize()
    ds = (0.0, 0.2, 1.0, 5.0)
    rows += ["", f"Wake-up latency: device gap minus host gap between two stamps launched "
             f"d apart, GPU idle in between (median [p10, p90] over {reps}, interleaved):", "",
             "| second stamp | " + " | ".join(f"d = {d:g} ms" for d in ds) + " |",
             "|---" * (len(ds) + 1) + "|"]
    for kind in ("kernel", "graph replay"):
        extra = {d: [] for d in ds}
        for _ in range(reps):
            for d in ds:
                torch.cuda.synchronize()
                n0 = int(m.count[0])
                m.device_stamp(code)
                ta = time.perf_counter_ns()
                spin_us(d * 1e3)
                tb = time.perf_counter_ns()
                if kind == "kernel":
                    m.device_stamp(code)
                else:
                    g.replay()
                torch.cuda.synchronize()
                r = m.ring.cpu().numpy()
                gap = r[(n0 + 1) & (m.capacity - 1), 1] - r[n0 & (m.capacity - 1), 1]
                extra[d].append((gap - (tb - ta)) / 1e3)
        if data is not None:
            data.setdefault("wake", []).extend(
                {"kind": kind, "d_ms": d, "us": [float(x) for x in v]}
                for d, v in extra.items())
        rows.append(f"| {kind} | " + " | ".join(
            f"{np.median(v):.1f} [{np.percentile(v, 10):.0f}, {np.percentile(v, 90):.0f}] µs"
            for v in extra.values()) + " |")
