"""What the GPU figure runners share (decode_floor/kernel_figures, long_context/*, bench_moe,
attention_figures): the report, the time-boxed figure loop, freeing the device between engines
and `graph_us` (mtplab/device.py), a call's device time by CUDA graph replay.

    rep = Report(budget_s)                    rep.add(figure, value, target, ok) prints a row
    run_figures(rep, [(name, fn), ...], only, reserve_s)
        each figure named in `only`, in order; one that `reserve_s` of the budget no longer
        covers is SKIPPED (a MISS row), one that raises is an ERROR row and the device is
        freed: a failing figure never hides the others
    rep.table()  -> figure | value | target | verdict, then `rep.notes` (kernel tables, ...)

and the measuring helpers: `copy_bandwidth` (the floor's bandwidth), `prompts` (random
prompts), `depth` (a target over its first n layers), `gpu_activities` (the kernels of one
call, from a profiler trace) and `decode_forward` (one eager bs-1 decode forward).
"""
from __future__ import annotations

import gc
import tempfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from mtplab.analysis.trace_io import GPU_ACTIVITY_CATS, load_trace
from mtplab.device import graph_us  # noqa: F401  (the figure runners' import)
from mtplab.studies.run_cells import TimeBox, target_decode_fn


class Report(TimeBox):
    def __init__(self, budget_s: float):
        super().__init__(budget_s)
        self.rows: list[tuple] = []
        self.notes: list[str] = []             # lines after the table

    def add(self, figure: str, value: str, target: str = "", ok: bool | None = None) -> None:
        verdict = "" if ok is None else ("PASS" if ok else "MISS")
        self.rows.append((figure, value, target, verdict))
        print(f"{figure}: {value}" + (f"  (target {target}) {verdict}" if target else ""),
              flush=True)

    def table(self) -> str:
        lines = ["| figure | value | target | verdict |", "|---|---|---|---|"]
        lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in self.rows]
        return "\n".join(lines + ([""] + self.notes if self.notes else []))


def free(*engines) -> None:
    """Close `engines`, then give the device's cached memory back (between figures)."""
    for e in engines:
        e.close()
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def run_figures(rep: Report, figures: list, only, reserve_s: float) -> None:
    """The module doc's loop over (name, fn) pairs."""
    for name, fn in figures:
        if name not in only:
            continue
        if rep.left() < reserve_s:
            rep.add(name, "SKIPPED (time box)", "", False)
            continue
        try:
            fn()
        except Exception as e:     # one figure failing must not hide the others
            rep.add(name, f"ERROR {type(e).__name__}: {str(e).splitlines()[0][:200]}", "",
                    False)
            free()


def copy_bandwidth(nbytes: int = 1 << 30, iters: int = 20) -> float:
    """Device-to-device copy, bytes read + written per second."""
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(iters):
        b.copy_(a)
    e.record()
    e.synchronize()
    bw = 2 * nbytes * iters / (s.elapsed_time(e) / 1e3)
    del a, b
    free()
    return bw


def prompts(V: int, bs: int, n: int, seed: int = 0) -> list[list[int]]:
    """bs random prompts of n tokens over ids 3..V-1 (seeded by seed + bs)."""
    g = torch.Generator().manual_seed(seed + bs)
    return torch.randint(3, V, (bs, n), generator=g).tolist()


@contextmanager
def depth(model, n: int):
    """The target forward over its first n layers only (kernel counting)."""
    layers = model.model.layers
    model.model.layers = layers[:n]
    try:
        yield
    finally:
        model.model.layers = layers


def gpu_activities(fn, cats: tuple = GPU_ACTIVITY_CATS) -> tuple[int, dict, list]:
    """(GPU activities of one call of fn, {kernel name: (count, total µs)}, their names in
    launch order) from a trace. `cats=("cpu_op",)`: the host's aten ops instead (CPU too)."""
    cuda = torch.cuda.is_available()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    acts = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    fn()
    sync()
    with tempfile.TemporaryDirectory() as d:
        with torch.profiler.profile(activities=acts) as p:
            fn()
            sync()
        path = Path(d) / "t.json"
        p.export_chrome_trace(str(path))
        tr = load_trace(path)
    sel = np.flatnonzero(tr.cat_mask(*cats))
    sel = sel[np.argsort(tr.ts[sel], kind="stable")]
    names: dict = {}
    for i in sel:
        c, t = names.get(tr.name_of(i), (0, 0.0))
        names[tr.name_of(i)] = (c + 1, t + float(tr.dur[i]))
    return len(sel), names, [tr.name_of(i) for i in sel]


def decode_forward(eng):
    """One bs-1 greedy decode forward + argmax of the target worker (its one-node verify
    segment, publish and stash of the padding row included), eager (no graph)."""
    dev = eng.device.torch_device
    z = torch.zeros(1, dtype=torch.long, device=dev)
    fn = target_decode_fn(eng, 64)
    args = dict(input_ids=z, rows=z, kv_lens=z + 1)
    return lambda: fn(**args)
