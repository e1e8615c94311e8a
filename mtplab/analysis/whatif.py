"""What-if predictor: one measured run's decode step, replayed as a dependency graph under
other settings (docs/design.md "What-if predictor"). Reads tables only.

    model = load_run(RUN_DIR)                  # manifest + meter stages + host steps
    predict(model, ["overlap=on", "host:schedule=0", "gpu:verify*0.5"])   # a DataFrame
    cause_table(model)                         # per bubble cause: tok/s back if removed

The step as the predictor sees it (one `StepModel`): the host's own work per iteration
(`schedule`, `prepare`, `process_result`, and `loop`: everything outside the stage spans,
the loop's Python and any on_step hook), and the step's launches in issue order. A launch
is one host call (a graph replay, an eager stage) that issues device work on one lane:

    Launch(stage="commit", host_us=6.1, lane="forward",
           stages=(("commit", 9.0), ("publish", 1.2), ("stash", 2.0)))

Replay of iteration k (h = host clock, F / C = the forward / copy lane free time,
L = launch latency, W = wake latency: a device event to the host's return from its wait):

    h += schedule
    overlap, a draft, not device_seq_lens:
                                   h = max(h, publish_end[k-1] + W)       (sync, in prepare)
    h += prepare
    async_d2h:                     F = max(F, d2h_end[k-1])   (results are graph buffers the
                                                               next step overwrites)
    each forward launch:           h += host_us; start = max(F + gap, h + L); its stages run
                                   back to back from start; F = their end (gap: the device
                                   idle the run shows before it even when issued in time)
    an eager launch (kernel by kernel): its kernels start while the call goes on and the
                                   last cannot end before the call has issued it:
                                   start = max(F + gap, call start + L),
                                   F = max(start + its device work, h + L)
    async_d2h:  d2h launch         h += host_us; start = max(C, F + gap, h + L); d2h_end[k] = end
    blocking:                      d2h_end[k] = F + d2h GPU time at the read (below)
    the results read (`sync`):     normal loop: step k's; overlap: step k-1's (none at k = 0)
                                   async: h = max(h, d2h_end[j] + W)
                                   blocking: h = max(h, F_now + d2h + W): the host waits
                                   for every queued forward stage (under overlap: step k's),
                                   then `.tolist()`s (sched/d2h.py)
    (before the read: h += the part of loop the run spends there, `loop_before_read_us`)
    h += process_result; h += the rest of loop               -> end of iteration k
    publish_end: the end of the launch that publishes (the host's `publish_ready` event is
    recorded after that graph's replay, or after that eager segment)
    zb_draft_preexec: the draft launch (and an unfolded seed) is issued after commit /
    draft_extend, before d2h: the next round's draft, so d2h waits for it too
    CPU (host_runs_device): a launch's device work runs inside its host call (it ends
    when the call returns), so nothing overlaps the host

The step period is the mean iteration time over the last STEADY of REPLAY_STEPS identical
iterations; a what-if's tok/s is the run's measured tok/s x base period / what-if period
(the model's own error on the run, `self_error`, is reported beside).
Host jitter: the run's host time varies from step to step (a page allocation, the OS, the
collector, another process on the CPU), and under overlap a slow step is not paid back by a
fast one: the period is the mean of max(host, GPU) per step, more than max(mean host, GPU).
A model read from a run keeps, for every host time it replays (schedule, prepare,
process_result, loop, each launch call), that time's deviation from its mean in each
measured step (`host_dev`, `Launch.host_dev`; waits excluded). The replay then runs one
iteration per measured step after JITTER_WARMUP iterations, each host time at its mean plus
its own deviation of that step, and averages over the n measured steps: on CPU, where
everything runs in series, the replay of the run is the measured steps, one by one. A
what-if changes a time in every step: `=` sets it (its noise goes with it), `*F` scales the
step's time, `+US` / `-US` shift it (never below 0).
An eager launch's device work: the meter times an eager segment from its first kernel to its
last, so where the host issued it onto an idle lane the interval is the host's pace of
issuing, not the device's work. The unfolded Frozen-KV seed is one draft step's work; where
its interval is no longer than its host call (host-paced) and the run has a draft graph of
S-1 steps, its device work is taken as one of them, and the interval stays the replay's
floor through `h + L` (a what-if that issues it onto a busy lane, zb_draft_preexec, sees it
shrink to its work).
Where `loop` runs: the host table gives the loop's time outside the stage spans per step, not
where in the iteration it falls. Some of it runs between the last launch and the results read,
in the GPU's shadow. A model read from a GPU run places there the part that makes the replay's
waits equal the run's measured waits (`loop_before_read_us`, found by `_place_loop`; 0 where
the replay already waits less than the run); the rest closes the iteration, where a planted
host delay (`on_step`) runs.
Bubble causes (analysis/causes.py names): a device-idle span of the steady window ends with
the launch latency L (`launch`); the rest is charged to what the host did meanwhile:
schedule / prepare / process_result -> `host_prep`, a wait -> `sync`, a launch call ->
`host:<stage>`, `loop` -> `host:python`. Removing a cause replays with that host time (or
latency) at zero.
The host's speed: `host:all*F` replays the run on a host F times slower (every host time,
jitter included; L and W stay). The validation (sweep/whatif_check.py) uses it to replay a
baseline at the speed its arm's host ran at, from the two runs' `process_result`, the one
stage whose code no loop setting changes (`host_speed`).
The replay's own error on the run (`self_error`) and where it comes from (`stage_errors`:
the host's waits and each device stage's time and idle before it, replayed against the
run's): `mtplab whatif` warns above SELF_ERROR_WARN and names the stage that differs most.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterable, Optional, Sequence

import pandas as pd

from ..draft_kinds import DRAFT_KINDS
from ..loop_options import LoopOptions, reads_lengths
from ..stages import HOST_PREP_STAGES as HOST_WORK
from ..zero_bubble import ZB_SUBKNOBS
from .causes import HOST_PREP as PREP_CAUSE, HOST_PYTHON, LAUNCH as LAUNCH_CAUSE, \
    SYNC as SYNC_CAUSE, host_label
from .run_folder import RunFolderError, json_object, table

REPLAY_STEPS = 64                 # iterations replayed
STEADY = 32                       # the last ones averaged (max-plus systems settle fast)
JITTER_WARMUP = 16                # iterations before the measured steps' jitter is averaged
GAP_Q = 0.1                       # a launch's device gap: this quantile over the run's steps
LOOP = "loop"                     # host time outside every stage span in an iteration
HOST_NAMES = HOST_WORK + (LOOP,)
ALL = "all"                       # host:all*F: every host time at once (the host's speed)
PYTHON_CAUSE = host_label(HOST_PYTHON)
KNOBS = ("overlap", "zero_bubble", *ZB_SUBKNOBS, "fold_seed")
SELF_ERROR_WARN = 0.10            # `mtplab whatif` warns where |self error| exceeds this
MAX_US = 1e9                      # a what-if's time: at most 1000 s
MAX_FACTOR = 1e6                  # a what-if's factor
DRAFT_LAUNCHES = ("draft.seed", "draft")
AFTER_COMMIT = ("commit", "draft_extend")

# The files of a run folder the predictor reads (written by mtplab/sweep/step_profile.py).
HOST_STEPS_FILE = "host_steps.parquet"
METER_STAGES_FILE = "meter_stages.parquet"
ANCHOR_FILE = "whatif.json"
MANIFEST_FILE = "manifest.json"


class WhatIfError(ValueError):
    """Input the predictor cannot read: a run folder, a what-if (one sentence)."""


class Unanswerable(WhatIfError):
    """A well-formed what-if this run cannot answer (one sentence): `predict` gives its row
    this note instead of a prediction."""


@dataclass(frozen=True)
class Launch:
    """One host call issuing device work on one lane (module doc)."""
    stage: str                                 # its host span: the segment's first stage
    host_us: float                             # the call's host time
    lane: str                                  # "forward" | "copy"
    stages: tuple[tuple[str, float], ...]      # (device stage, GPU µs), in run order
    eager: bool = False                        # several kernels launched one by one (their
                                               # GPU work starts while the call goes on)
    gap_us: float = 0.0                        # device idle before it on a busy lane: the
                                               # floor between back-to-back launches (GAP_Q)
    host_dev: tuple[float, ...] = ()           # per measured step: its host time - host_us
    paced_us: float = 0.0                      # eager, device work estimated: the meter's
                                               # (host-paced) interval, else 0

    @property
    def gpu_us(self) -> float:
        return sum(d for _, d in self.stages)


@dataclass(frozen=True)
class Loop(LoopOptions):
    """The loop options in force (config.py's resolved knobs): the scheduler's, and the
    worker's that change the loop's shape. A model built by hand reads its lengths on the
    host unless it says otherwise."""
    device_seq_lens: bool = False
    draft_preexec: bool = False
    fold_seed: bool = False
    host_runs_device: bool = False             # CPU: device work runs inside the host call


@dataclass(frozen=True)
class StepModel:
    """A decode step as the predictor replays it (module doc)."""
    host: dict                                 # HOST_NAMES -> host µs per iteration
    launches: tuple[Launch, ...]               # in issue order; d2h (copy lane) last
    loop: Loop
    launch_latency_us: float = 0.0             # L: a launch's return to its device start
    wake_us: float = 0.0                       # W: a device event to the host's return
    graphs: bool = False                       # stages replay as CUDA graphs
    draft: str = "none"                        # the draft kind (none: target-only)
    num_steps: int = 0                         # S, draft steps per iteration
    seed_forward: bool = False                 # the draft has a seed forward (fold_seed)
    nested: dict = field(default_factory=dict) # "stage@parent" -> (host µs, GPU µs)
    anchor_tok_s: float = math.nan             # the run's measured tok/s (meter_tok_per_s)
    measured_period_us: float = math.nan       # the run's mean iteration time (host clock)
    d2h_gpu_us: float = 0.0                    # the results' copy (blocking reads too)
    host_dev: dict = field(default_factory=dict)   # HOST_NAMES -> per measured step: its
                                                   # host time - the mean (module doc)
    measured: dict = field(default_factory=dict)   # stage_errors' keys -> the run's µs/step
    loop_before_read_us: float = 0.0           # of `loop`, the part run before the results read
    notes: tuple[str, ...] = ()                # assumptions a transform made

    def with_note(self, note: str) -> "StepModel":
        return replace(self, notes=self.notes + (note,))

    @property
    def n_steps(self) -> int:
        """Measured steps whose host deviations the replay keeps (0: identical iterations)."""
        return max([len(d) for d in self.host_dev.values()] +
                   [len(ln.host_dev) for ln in self.launches] + [0])


@dataclass
class Replay:
    period_us: float
    bubble_us: float                           # device idle per step (steady window)
    causes: dict                               # cause -> bubble µs per step
    host: list                                 # (step, name, kind, t0, t1)
    device: list                               # (step, stage, lane, t0, t1)
    window: tuple                              # (t0, t1) of the steady iterations
    steady: range = range(0)                   # their indices


# -- the replay -------------------------------------------------------------------------------
def replay(m: StepModel, steps: int = REPLAY_STEPS, steady: int = STEADY) -> Replay:
    """Run `steps` identical iterations of the dependency graph (module doc); with the
    model's per-step host deviations, one iteration per measured step after JITTER_WARMUP."""
    lp, L, W = m.loop, m.launch_latency_us, m.wake_us
    n = m.n_steps
    if n:
        steps, steady = JITTER_WARMUP + n, n
    loop = m.host.get(LOOP, 0.0)
    before = min(m.loop_before_read_us, loop)
    fwd = [x for x in m.launches if x.lane == "forward"]
    d2h = [x for x in m.launches if x.lane == "copy"]
    h = F = C = 0.0
    pub_end: list[float] = []
    d2h_end: list[float] = []
    ends: list[float] = []
    host: list = []
    dev: list = []

    def at(mean: float, dev_: tuple, k: int) -> float:
        """A host time in iteration k: its mean plus its deviation in that measured step."""
        return max(0.0, mean + dev_[k % len(dev_)]) if dev_ else mean

    def work(k: int, name: str) -> float:
        return at(m.host.get(name, 0.0), m.host_dev.get(name, ()), k)

    def host_seg(k, name, kind, dt):
        nonlocal h
        if dt > 0:
            host.append((k, name, kind, h, h + dt))
            h += dt

    def wait_until(k, t):
        nonlocal h
        if t > h:
            host.append((k, "sync", "sync", h, t))
            h = t

    def lay(k, x: Launch, t: float, end: float) -> float:
        """x's stages from t to `end` (an eager launch's host-paced idle spread over them)."""
        g = x.gpu_us
        f = (end - t) / g if g > 0 else 0.0
        for s, d in x.stages:
            dev.append((k, s, x.lane, t, t + d * f))
            t += d * f
        return end

    def run(k, x: Launch, free: float) -> float:
        """Issue launch x (its host call, then its stages); returns its end on its lane."""
        t0 = h
        if lp.host_runs_device:                    # CPU: the work ends with the call, and
            own = max(0.0, x.host_us - x.gpu_us)   # a step's deviation is in the work
            host_seg(k, x.stage, "launch", at(max(x.host_us, x.gpu_us), x.host_dev, k))
            t = max(free, min(h, t0 + own))
            return lay(k, x, t, h)
        host_seg(k, x.stage, "launch", at(x.host_us, x.host_dev, k))
        if x.eager:                                # kernels start while the call goes on
            t = max(free + x.gap_us, t0 + L)
            return lay(k, x, t, max(t + x.gpu_us, h + L))
        t = max(free + x.gap_us, h + L)            # one graph replay / one kernel
        return lay(k, x, t, t + x.gpu_us)

    names = [{s for s, _ in x.stages} for x in fwd]
    pubs = [i for i, st in enumerate(names) if "publish" in st] or \
        [i for i, st in enumerate(names) if "commit" in st]
    for k in range(steps):
        host_seg(k, "schedule", "host", work(k, "schedule"))
        if reads_lengths(lp, m.draft != "none") and k > 0 and pub_end:
            wait_until(k, pub_end[-1] + W)
        host_seg(k, "prepare", "host", work(k, "prepare"))
        if lp.async_d2h and d2h_end:
            F = max(F, d2h_end[-1])
        for i, x in enumerate(fwd):
            F = run(k, x, F)
            if i in pubs:
                pub_end.append(F)                  # publish_ready: after the launch
        if lp.async_d2h and d2h:
            end = F
            for x in d2h:
                C = end = run(k, x, max(C, F))
            d2h_end.append(end)
        else:
            d2h_end.append(math.nan)               # read at the sync, after everything queued
        j = k if not lp.overlap else k - 1
        lk = work(k, LOOP)
        b = lk * before / loop if loop > 0 else 0.0
        if j >= 0:
            if lp.async_d2h and d2h:
                ready = d2h_end[j]
            else:                                  # blocking .tolist(): all queued work first
                if m.d2h_gpu_us > 0:
                    dev.append((k, "d2h", "forward", F, F + m.d2h_gpu_us))
                F = F + m.d2h_gpu_us
                ready = F
            host_seg(k, LOOP, "host", b)
            wait_until(k, ready + (0.0 if lp.host_runs_device else W))
            host_seg(k, "process_result", "host", work(k, "process_result"))
            host_seg(k, LOOP, "host", lk - b)
        else:
            host_seg(k, LOOP, "host", lk)
        ends.append(h)
    steady = max(1, min(steady, steps - 1))
    t0, t1 = ends[-1 - steady], ends[-1]
    period = (t1 - t0) / steady
    bubble, causes = _bubbles(host, dev, (t0, t1), 0.0 if lp.host_runs_device else L)
    return Replay(period, bubble / steady, {c: v / steady for c, v in causes.items()},
                  host, dev, (t0, t1), range(steps - steady, steps))


def _union(iv: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _cause_of(name: str, kind: str) -> str:
    if kind == "sync":
        return SYNC_CAUSE
    if kind == "launch":
        return host_label(name)
    return PYTHON_CAUSE if name == LOOP else PREP_CAUSE


def _bubbles(host: list, dev: list, window: tuple, L: float) -> tuple[float, dict]:
    """Device idle inside `window` and its split by cause (module doc)."""
    t0, t1 = window
    busy = _union([(max(a, t0), min(b, t1)) for *_, a, b in dev if b > t0 and a < t1 and b > a])
    idle, cur = [], t0
    for a, b in busy:
        if a > cur:
            idle.append((cur, a))
        cur = max(cur, b)
    if cur < t1:
        idle.append((cur, t1))
    causes: dict[str, float] = {}
    total = 0.0
    for a, b in idle:
        total += b - a
        lat = min(L, b - a) if b < t1 else 0.0       # the gap ends with a launch's latency
        if lat > 0:
            causes[LAUNCH_CAUSE] = causes.get(LAUNCH_CAUSE, 0.0) + lat
        end = b - lat
        for _, name, kind, h0, h1 in host:
            o = min(end, h1) - max(a, h0)
            if o > 0:
                c = _cause_of(name, kind)
                causes[c] = causes.get(c, 0.0) + o
    return total, causes


# -- what-ifs ---------------------------------------------------------------------------------
_KNOB_RE = re.compile(r"^(?P<knob>[a-z0-9_]+)=(?P<value>on|off|true|false)$")
_STAGE_RE = re.compile(r"^(?P<side>host|gpu):(?P<stage>[a-z0-9_.]+)(?P<op>[=*+-])"
                       r"(?P<x>[0-9.eE+-]+)$")


def _on(v: str) -> bool:
    return v in ("on", "true")


def parse_whatif(text: str) -> list[tuple]:
    """`overlap=on,host:schedule=0` -> [("knob", "overlap", True), ("host", "schedule", "=",
    0.0)]: knobs (KNOBS, on/off), `host:STAGE=US | *F | +US | -US` (STAGE: a host name of
    HOST_NAMES or a launch's stage), `host:all*F` (every host time: the host F times slower),
    `gpu:STAGE=US | *F | +US | -US` (a device stage). Items apply left to right. Values are
    finite, non-negative, at most MAX_US µs or a factor of MAX_FACTOR; a knob set twice two
    ways, or zero_bubble=on beside a sub-knob off, is a contradiction (WhatIfError)."""
    out = []
    for part in [p.strip() for p in text.split(",") if p.strip()]:
        k = _KNOB_RE.match(part)
        if k:
            if k["knob"] not in KNOBS:
                raise WhatIfError(f"what-if {part!r}: {k['knob']!r} is not a knob the predictor "
                                  f"replays; use one of {', '.join(KNOBS)}.")
            out.append(("knob", k["knob"], _on(k["value"])))
            continue
        s = _STAGE_RE.match(part)
        if not s:
            raise WhatIfError(f"what-if {part!r} is not understood; write KNOB=on|off "
                              f"({', '.join(KNOBS)}), host:STAGE=US (or *F, +US, -US) or "
                              "gpu:STAGE*F (or =US, +US, -US).")
        try:
            x = float(s["x"])
        except ValueError:
            raise WhatIfError(f"what-if {part!r}: {s['x']!r} is not a number.") from None
        bound = MAX_FACTOR if s["op"] == "*" else MAX_US
        if not math.isfinite(x) or x < 0 or x > bound:
            raise WhatIfError(f"what-if {part!r}: use a finite, non-negative value of at most "
                              f"{bound:g} ({'a factor' if s['op'] == '*' else 'µs'}); "
                              "lower a time with -US.")
        out.append((s["side"], s["stage"], s["op"], x))
    if not out:
        raise WhatIfError("empty what-if; write e.g. overlap=on or host:schedule=0.")
    _check_knobs(text, [(k, on) for side, k, *rest in out if side == "knob" for on in rest])
    return out


def _check_knobs(text: str, knobs: list[tuple[str, bool]]) -> None:
    """One what-if sets each knob one way, and zero_bubble=on has every sub-knob on."""
    seen: dict[str, bool] = {}
    for k, on in knobs:
        if seen.get(k, on) != on:
            raise WhatIfError(f"what-if {text!r} sets {k} both on and off; give it once.")
        seen[k] = on
    off = [k for k in ZB_SUBKNOBS if seen.get(k) is False]
    if seen.get("zero_bubble") and off:
        raise WhatIfError(f"what-if {text!r}: zero_bubble=on turns every sub-knob on, and "
                          f"{', '.join(f'{k}=off' for k in off)} contradicts it; give the "
                          "sub-knobs one by one instead.")


def _scaled(v: float, op: str, x: float) -> float:
    return max(0.0, {"=": x, "*": v * x, "+": v + x, "-": v - x}[op])


def _scaled_steps(mean: float, dev: tuple, op: str, x: float) -> tuple[float, tuple]:
    """A host time under `op x` in every measured step (module doc): (its new mean, its new
    deviations); `=` leaves no deviation."""
    if not dev or op == "=":
        return _scaled(mean, op, x), ()
    vals = [_scaled(mean + d, op, x) for d in dev]
    mu = sum(vals) / len(vals)
    return mu, tuple(v - mu for v in vals)


def _add_dev(a: tuple, b: tuple) -> tuple:
    """Two host times' deviations, step by step, as one time's."""
    if not a or not b:
        return a or b
    return tuple(x + y for x, y in zip(a, b))


def apply(m: StepModel, text: str) -> StepModel:
    """The model under one what-if (`parse_whatif`'s grammar); WhatIfError when the run
    cannot answer it."""
    for item in parse_whatif(text):
        if item[0] == "knob":
            m = _knob(m, item[1], item[2])
        elif item[0] == "host":
            m = _host(m, *item[1:])
        else:
            m = _gpu(m, *item[1:])
    return m


def _host(m: StepModel, stage: str, op: str, x: float) -> StepModel:
    if stage == ALL:
        return _host_speed(m, op, x)
    if stage in HOST_NAMES:
        mu, dev = _scaled_steps(m.host.get(stage, 0.0), m.host_dev.get(stage, ()), op, x)
        devs = {k: v for k, v in m.host_dev.items() if k != stage}
        if dev:
            devs[stage] = dev
        return replace(m, host={**m.host, stage: mu}, host_dev=devs)
    hit = [i for i, ln in enumerate(m.launches) if ln.stage == stage]
    if not hit:
        names = sorted(set(HOST_NAMES) | {ln.stage for ln in m.launches})
        raise WhatIfError(f"host:{stage}: the run has no host time named {stage!r}; use one "
                          f"of {', '.join(names)} (or host:{ALL}*F: every one).")
    ls = list(m.launches)
    for i in hit:
        mu, dev = _scaled_steps(ls[i].host_us, ls[i].host_dev, op,
                                x / len(hit) if op in "=+-" else x)
        ls[i] = replace(ls[i], host_us=mu, host_dev=dev)
    return replace(m, launches=tuple(ls))


def _host_speed(m: StepModel, op: str, f: float) -> StepModel:
    """`host:all*F`: a host F times slower (F < 1: faster). Every host time scales by F: the
    host's own work, each launch call, the nested spans, the part of `loop` before the read
    and each step's deviation (a slower host's noise is as much slower). L and W, the
    device's latencies to and from the host, stay."""
    if op != "*":
        raise WhatIfError(f"host:{ALL}{op}: the host's speed scales with host:{ALL}*F only (F: "
                          f"how many times slower); set one stage with host:STAGE{op}US.")
    sc = lambda dev: tuple(d * f for d in dev)                  # noqa: E731
    return replace(
        m, host={k: v * f for k, v in m.host.items()},
        host_dev={k: sc(v) for k, v in m.host_dev.items()},
        launches=tuple(replace(ln, host_us=ln.host_us * f, host_dev=sc(ln.host_dev))
                       for ln in m.launches),
        nested={k: (h * f, g) for k, (h, g) in m.nested.items()},
        loop_before_read_us=m.loop_before_read_us * f)


def _gpu(m: StepModel, stage: str, op: str, x: float) -> StepModel:
    ls, hit = list(m.launches), 0
    for i, ln in enumerate(ls):
        if not any(s == stage for s, _ in ln.stages):
            continue
        hit += sum(s == stage for s, _ in ln.stages)
        new = replace(ln, stages=tuple((s, _scaled(d, op, x) if s == stage else d)
                                      for s, d in ln.stages))
        if m.loop.host_runs_device:                # CPU: the work is inside the host call
            new = replace(new, host_us=max(0.0, ln.host_us + new.gpu_us - ln.gpu_us))
        ls[i] = new
    if not hit:
        names = sorted({s for ln in m.launches for s, _ in ln.stages})
        raise WhatIfError(f"gpu:{stage}: no device stage {stage!r} in the run's steps; use one "
                          f"of {', '.join(names)}.")
    if op in "=+-" and hit > 1:
        raise WhatIfError(f"gpu:{stage}{op}{x:g}: {stage!r} runs {hit} times a step; scale it "
                          f"with gpu:{stage}*F instead.")
    return replace(m, launches=tuple(ls))


def _knob(m: StepModel, knob: str, on: bool) -> StepModel:
    lp = m.loop
    if knob == "overlap":
        return replace(m, loop=replace(lp, overlap=on))
    if knob == "zero_bubble":          # every sub-knob on, or its auto value (zero_bubble.py)
        for name, k in ZB_SUBKNOBS.items():
            m = _knob(m, name, (on or k.auto) and (k.owner != "worker" or m.draft != "none"))
        return m
    if knob == "zb_device_seq_lens":
        if not on and lp.device_seq_lens and lp.overlap:
            m = m.with_note("zb_device_seq_lens=off: the host's read of the lengths is taken as "
                            "its wait alone (its copy's own time is not in the run)")
        return replace(m, loop=replace(lp, device_seq_lens=on))
    if knob == "zb_async_d2h":
        return _async_d2h(m, on)
    if knob == "zb_draft_preexec":
        return _preexec(m, on)
    if knob == "fold_seed":
        return _fold_seed(m, on)
    raise Unanswerable(f"{knob}: the predictor has no model of this knob (analysis/whatif.py "
                      "`_knob`).")


def _async_d2h(m: StepModel, on: bool) -> StepModel:
    lp = m.loop
    if on == lp.async_d2h:
        return m
    if not on:
        ls = tuple(ln for ln in m.launches if ln.lane != "copy")
        return replace(m, launches=ls, loop=replace(lp, async_d2h=False))
    m = m.with_note("zb_async_d2h=on: the run has no d2h launch; its host call is taken as 0 µs "
                    "and its copy as the blocking read's")
    d2h = Launch("d2h", 0.0, "copy", (("d2h", m.d2h_gpu_us),))
    return replace(m, launches=m.launches + (d2h,), loop=replace(lp, async_d2h=True))


def _preexec(m: StepModel, on: bool) -> StepModel:
    lp = m.loop
    if on == lp.draft_preexec:
        return m
    if m.draft == "none":
        raise Unanswerable("zb_draft_preexec: the run is target-only; there is no draft to run "
                          "ahead.")
    drafts = [ln for ln in m.launches if ln.stage in DRAFT_LAUNCHES and ln.lane == "forward"]
    rest = [ln for ln in m.launches if ln not in drafts]
    if on:       # after the last commit / draft_extend launch
        i = max((n for n, ln in enumerate(rest) if ln.stage in AFTER_COMMIT), default=None)
        if i is None:
            raise Unanswerable("zb_draft_preexec=on: the run's step has no commit launch to "
                              "run the draft after.")
        ls = rest[:i + 1] + drafts + rest[i + 1:]
    else:        # right after resolve
        i = next((n for n, ln in enumerate(rest) if ln.stage == "resolve"), -1)
        ls = rest[:i + 1] + drafts + rest[i + 1:]
    return replace(m, launches=tuple(ls), loop=replace(lp, draft_preexec=on))


def _fold_seed(m: StepModel, on: bool) -> StepModel:
    lp = m.loop
    if not m.seed_forward:
        raise Unanswerable(f"fold_seed: the run's draft ({m.draft}) has no seed forward to fold.")
    if on == lp.fold_seed:
        return m
    ls = list(m.launches)
    seeds = [i for i, ln in enumerate(ls) if ln.stage == "draft.seed"]
    drafts = [i for i, ln in enumerate(ls) if ln.stage == "draft"]
    if on:
        if not seeds or not drafts:
            raise Unanswerable("fold_seed=on: the run's steps have no separate draft.seed launch "
                              "to fold.")
        seed, i = ls[seeds[0]], drafts[0]
        d = ls[i]
        if m.graphs:
            dgpu = dict(d.stages).get("draft", 0.0)
            if m.num_steps > 1 and dgpu > 0:
                est, how = dgpu / (m.num_steps - 1), "one of the draft graph's S-1 steps"
            else:
                est, how = seed.gpu_us, "its eager interval"
            m = m.with_note(f"fold_seed=on: the folded seed's GPU time is taken as {how} "
                            f"({est:.1f} µs); its eager launch ({seed.host_us:.1f} µs host) goes")
            stages = tuple((s, x + est if s == "draft" else x) for s, x in d.stages)
            ls[i] = replace(d, stages=stages)
        else:    # eager: the seed runs inside the draft's call, as it did before it
            stages = (("draft", seed.gpu_us + dict(d.stages).get("draft", 0.0)),) + tuple(
                (s, x) for s, x in d.stages if s != "draft")
            ls[i] = replace(d, host_us=d.host_us + seed.host_us, stages=stages,
                            host_dev=_add_dev(d.host_dev, seed.host_dev))
        del ls[seeds[0]]
        return replace(m, launches=tuple(ls), loop=replace(lp, fold_seed=True))
    nested = m.nested.get("draft.seed@draft")
    if m.graphs or nested is None or not drafts:
        raise Unanswerable("fold_seed=off: the run folded its seed into the draft graph, so the "
                          "eager seed's host time is not in it; measure an unfolded run and ask "
                          "fold_seed=on of it instead.")
    i = drafts[0]
    d = ls[i]
    h, g = nested
    ls[i] = replace(d, host_us=max(0.0, d.host_us - h),
                    stages=tuple((s, max(0.0, x - g) if s == "draft" else x) for s, x in d.stages))
    ls.insert(i, Launch("draft.seed", h, "forward", (("draft.seed", g),)))
    return replace(m, launches=tuple(ls), loop=replace(lp, fold_seed=False))


# -- predictions ------------------------------------------------------------------------------
def default_whatifs(m: StepModel) -> list[str]:
    """Every knob flipped from the run's setting, zero_bubble and each sub-knob, then each
    host time at zero and the largest device stages at half."""
    lp = m.loop
    out = [f"overlap={'off' if lp.overlap else 'on'}"]
    zb = lp.device_seq_lens and (lp.draft_preexec or m.draft == "none") and lp.async_d2h
    out.append(f"zero_bubble={'off' if zb else 'on'}")
    out.append(f"zb_async_d2h={'off' if lp.async_d2h else 'on'}")
    out.append(f"zb_device_seq_lens={'off' if lp.device_seq_lens else 'on'}")
    if m.draft != "none":
        out.append(f"zb_draft_preexec={'off' if lp.draft_preexec else 'on'}")
    if m.seed_forward:
        out.append(f"fold_seed={'off' if lp.fold_seed else 'on'}")
    out += [f"host:{n}=0" for n in HOST_NAMES if m.host.get(n, 0.0) > 0]
    out += [f"host:{s}=0" for s in dict.fromkeys(ln.stage for ln in m.launches)]
    gpu: dict[str, float] = {}
    for ln in m.launches:
        for s, d in ln.stages:
            gpu[s] = gpu.get(s, 0.0) + d
    out += [f"gpu:{s}*0.5" for s in sorted(gpu, key=gpu.get, reverse=True)[:3] if gpu[s] > 0]
    return out


def predict(m: StepModel, whatifs: Optional[Iterable[str]] = None) -> pd.DataFrame:
    """One row per what-if (default: `default_whatifs`), the run itself first:
    what, step_us, tok_s, ratio (tok/s over the run's), bubble_us, bubble_frac, note
    (why the run cannot answer it, or the assumption it took). A what-if that is not
    well-formed for this run (a name it lacks, a contradiction) raises WhatIfError."""
    base = replay(m)
    rows = [_row("(run)", m, base, base)]
    for w in (default_whatifs(m) if whatifs is None else whatifs):
        try:
            mm = apply(m, w)
        except Unanswerable as e:
            rows.append({"what": w, "step_us": math.nan, "tok_s": math.nan, "ratio": math.nan,
                         "bubble_us": math.nan, "bubble_frac": math.nan, "note": str(e)})
            continue
        rows.append(_row(w, mm, replay(mm), base, m.notes))
    return pd.DataFrame(rows, columns=["what", "step_us", "tok_s", "ratio", "bubble_us",
                                       "bubble_frac", "note"])


def _row(what: str, m: StepModel, r: Replay, base: Replay, old: tuple = ()) -> dict:
    ratio = base.period_us / r.period_us if r.period_us > 0 else math.nan
    return {"what": what, "step_us": r.period_us, "tok_s": m.anchor_tok_s * ratio,
            "ratio": ratio, "bubble_us": r.bubble_us,
            "bubble_frac": r.bubble_us / r.period_us if r.period_us > 0 else math.nan,
            "note": "; ".join(m.notes[len(old):])}


def host_speed(arm: StepModel, base: StepModel) -> float:
    """How many times slower the arm run's host ran than the baseline's: the ratio of their
    `process_result` host time per step (append the results, finish requests: the same code
    under every loop setting; NaN where either run lacks it)."""
    a, b = arm.host.get("process_result", 0.0), base.host.get("process_result", 0.0)
    return a / b if a > 0 and b > 0 else math.nan


def predicted_ratio(m: StepModel, whatif: str, base_us: Optional[float] = None) -> float:
    """tok/s under `whatif` over the run's, as the model predicts it (WhatIfError if it
    cannot); `base_us`: the run's replayed period, `replay(m).period_us`, where the caller
    has it already."""
    base = replay(m).period_us if base_us is None else base_us
    return base / replay(apply(m, whatif)).period_us


def self_error(m: StepModel, base_us: Optional[float] = None) -> float:
    """The model's step time for the run itself over the measured one, minus 1 (`base_us`
    as in predicted_ratio)."""
    base = replay(m).period_us if base_us is None else base_us
    return base / m.measured_period_us - 1.0


def cause_table(m: StepModel) -> pd.DataFrame:
    """Per bubble cause of the replayed run (analysis/causes.py names): bubble µs per step,
    and the step time, tok/s and ratio with that cause removed (module doc)."""
    base = replay(m)
    rows = []
    for c, us in sorted(base.causes.items(), key=lambda kv: -kv[1]):
        r = replay(_without(m, c))
        ratio = base.period_us / r.period_us
        rows.append({"cause": c, "bubble_us": us, "bubble_frac": us / base.period_us,
                     "step_us": r.period_us, "tok_s": m.anchor_tok_s * ratio, "ratio": ratio,
                     "removed": _removal(c)})
    return pd.DataFrame(rows, columns=["cause", "bubble_us", "bubble_frac", "step_us", "tok_s",
                                       "ratio", "removed"])


def _removal(cause: str) -> str:
    return {PREP_CAUSE: "schedule, prepare, process_result host time = 0",
            SYNC_CAUSE: "wake latency W = 0", LAUNCH_CAUSE: "launch latency L = 0",
            PYTHON_CAUSE: "loop host time = 0"}.get(cause, f"{cause.split(':', 1)[-1]} launch "
                                                          "host time = 0")


def _without(m: StepModel, cause: str) -> StepModel:
    if cause == PREP_CAUSE:
        for n in HOST_WORK:
            m = _host(m, n, "=", 0.0)
        return m
    if cause == SYNC_CAUSE:
        return replace(m, wake_us=0.0)
    if cause == LAUNCH_CAUSE:
        return replace(m, launch_latency_us=0.0)
    if cause == PYTHON_CAUSE:
        return _host(m, LOOP, "=", 0.0)
    return _host(m, cause.split(":", 1)[1], "=", 0.0)


# -- from a run's tables ----------------------------------------------------------------------
def outermost(stages: pd.DataFrame) -> pd.DataFrame:
    """The meter's stage intervals without those nested in another of the same step and lane
    (an eager `draft.step` inside `draft`)."""
    if stages.empty:
        return stages
    df = stages.sort_values(["step", "lane", "start_us", "end_us"],
                            ascending=[True, True, True, False]).reset_index(drop=True)
    keep = []
    last = None
    run_end = -math.inf
    for st, lane, e in zip(df["step"].tolist(), df["lane"].tolist(), df["end_us"].tolist()):
        if (st, lane) != last:
            last, run_end = (st, lane), -math.inf
        keep.append(e > run_end)
        run_end = max(run_end, e)
    return df[keep].reset_index(drop=True)


def _nested(stages: pd.DataFrame, top: pd.DataFrame) -> pd.DataFrame:
    """Nested intervals with their parent's stage name (`parent` column)."""
    key = ["step", "lane", "stage", "start_us", "end_us"]
    inner = stages.merge(top[key], on=key, how="left", indicator=True)
    inner = inner[inner["_merge"] == "left_only"].drop(columns="_merge")
    if inner.empty:
        return inner.assign(parent=[])
    parents = []
    for r in inner.itertuples():
        p = top[(top["step"] == r.step) & (top["lane"] == r.lane) &
                (top["start_us"] <= r.start_us) & (top["end_us"] >= r.end_us)]
        parents.append(p["stage"].iloc[0] if len(p) else "")
    return inner.assign(parent=parents)


LANE_ORDER = {"forward": 0, "copy": 1}


def _shape(top: pd.DataFrame) -> tuple[tuple, list]:
    """The steady step's stage sequence ((lane, stage), ... forward first, each lane in time
    order), the commonest among the steps, and the steps that have it."""
    top = top.assign(_lane=top["lane"].map(LANE_ORDER).fillna(2))
    top = top.sort_values(["step", "_lane", "start_us"])
    seqs = {st: tuple(zip(g["lane"], g["stage"])) for st, g in top.groupby("step", sort=True)}
    counts: dict = {}
    for q in seqs.values():
        counts[q] = counts.get(q, 0) + 1
    shape = max(counts, key=counts.get)
    return shape, [st for st, q in seqs.items() if q == shape]


def from_tables(cfg: dict, stages: pd.DataFrame, host: pd.DataFrame, *,
                anchor_tok_s: float = math.nan, latency_us: float = 0.0,
                seed_forward: bool = False, eager: Sequence[str] = (),
                jitter: bool = True) -> StepModel:
    """The StepModel of a run. `cfg`: its resolved config (the manifest's `config`);
    `stages`: the meter's stage intervals (meter_stages.parquet) covering the steps of
    `host`, the host clock's table (host_steps.parquet: one row per decode step, `step` its
    meter step, `period_us` (its first span to the next iteration's), one column per
    outermost host span name (µs), `NAME@PARENT` for nested ones); `latency_us`: L and W
    (GPU only); `seed_forward`: the draft has a seed forward; `eager`: the launches issued
    kernel by kernel (not one graph replay or one kernel); `jitter`: keep each host time's
    deviation in each step (module doc; False: identical iterations of the means)."""
    if host.empty:
        raise WhatIfError("the host-step table has no decode step; record one with "
                          "mtplab run --step-profile true (or a sweep cell with step_profile).")
    st = stages[stages["step"].isin(set(host["step"].tolist()))]
    if st.empty:
        raise WhatIfError("the meter has no stage interval in the host table's steps; the two "
                          "tables come from different generates (record them together).")
    top = outermost(st)
    shape, good = _shape(top)
    top = top[top["step"].isin(good)]
    top = top.assign(_lane=top["lane"].map(LANE_ORDER).fillna(2)).sort_values(
        ["step", "_lane", "start_us"])
    hrows = host[host["step"].isin(good)].drop_duplicates("step").sort_values("step")
    cuda = str(cfg.get("device", "cpu")).startswith("cuda")
    L = latency_us if cuda else 0.0
    host_cols = [c for c in host.columns if c not in ("step", "period_us") and "@" not in c]
    # a launch begins at a stage with a host span of its own, or where the lane changes
    heads = [i == 0 or shape[i - 1][0] != lane or (s in hrows and hrows[s].mean() > 0)
             for i, (lane, s) in enumerate(shape)]
    # a stage's time runs to the next stage's start inside one launch (gaps in a graph)
    start = top["start_us"].to_numpy().reshape(len(good), len(shape))
    end = top["end_us"].to_numpy().reshape(len(good), len(shape))
    gpu = []
    for i in range(len(shape)):
        inner = i + 1 < len(shape) and not heads[i + 1]
        gpu.append(float(((start[:, i + 1] if inner else end[:, i]) - start[:, i]).mean()))
    groups: list[list[int]] = []
    for i, h in enumerate(heads):
        if h:
            groups.append([])
        groups[-1].append(i)
    # a launch's device gap: after the stage before it (the last forward one for the copy
    # lane), in the steps where the host issued it in time: a low quantile over the steps
    gaps = [float(pd.Series(start[:, g[0]] - end[:, g[0] - 1]).quantile(GAP_Q))
            if g[0] > 0 else 0.0 for g in groups]

    def dev(v: pd.Series) -> tuple:
        """Per measured step: v less its mean (none without jitter)."""
        return tuple(float(x) for x in (v - v.mean()).tolist()) if jitter else ()

    def col(c: str) -> pd.Series:
        return hrows[c] if c in hrows else pd.Series(0.0, index=hrows.index)

    launches = [Launch(shape[g[0]][1], _mean(hrows, shape[g[0]][1]), shape[g[0]][0],
                       tuple((shape[i][1], gpu[i]) for i in g), shape[g[0]][1] in eager,
                       max(0.0, gap) if cuda else 0.0, dev(col(shape[g[0]][1])))
                for g, gap in zip(groups, gaps)]
    # a name that heads several launches: its host time split by their GPU time
    for name in {ln.stage for ln in launches}:
        idx = [i for i, ln in enumerate(launches) if ln.stage == name]
        if len(idx) > 1:
            g_all = sum(launches[i].gpu_us for i in idx)
            for i in idx:
                w = launches[i].gpu_us / g_all if g_all > 0 else 1.0 / len(idx)
                launches[i] = replace(launches[i], host_us=launches[i].host_us * w,
                                      host_dev=tuple(d * w for d in launches[i].host_dev))
    draft = str(cfg.get("draft", "none"))
    num_steps = int(cfg.get("num_steps") or 0) if draft != "none" else 0
    if cuda:
        launches = _eager_seed_work(launches, num_steps, L)
    nested = {}
    nested_cols = [c for c in host.columns if "@" in c]
    if nested_cols:
        inner = _nested(st[st["step"].isin(good)], top.drop(columns="_lane"))
        for c in nested_cols:
            name, parent = c.split("@", 1)
            g = inner[(inner["stage"] == name) & (inner["parent"] == parent)]
            per = g.groupby("step")["dur_us"].sum().reindex(good, fill_value=0.0)
            nested[c] = (_mean(hrows, c), float(per.mean()))
    period = float(hrows["period_us"].mean())
    loop_k = hrows["period_us"] - hrows[host_cols].sum(axis=1)
    prep_k = col("prepare") - col("sync@prepare")
    hw = {"schedule": _mean(hrows, "schedule"), "prepare": max(0.0, float(prep_k.mean())),
          "process_result": _mean(hrows, "process_result"),
          LOOP: max(0.0, float(loop_k.mean()))}
    host_dev = {n: d for n, d in (("schedule", dev(col("schedule"))), ("prepare", dev(prep_k)),
                                  ("process_result", dev(col("process_result"))),
                                  (LOOP, dev(loop_k))) if any(d)}
    waited = host_waits(hrows)
    copy = [ln for ln in launches if ln.lane == "copy"]
    lp = Loop(overlap=bool(cfg.get("overlap")), async_d2h=bool(cfg.get("zb_async_d2h", True)),
              device_seq_lens=bool(cfg.get("zb_device_seq_lens")),
              draft_preexec=bool(cfg.get("zb_draft_preexec")),
              fold_seed=bool(cfg.get("fold_seed")), host_runs_device=not cuda)
    m = StepModel(
        host=hw, launches=tuple(launches), loop=lp,
        launch_latency_us=L, wake_us=L, graphs=bool(cfg.get("cuda_graphs")), draft=draft,
        num_steps=num_steps, seed_forward=seed_forward, nested=nested,
        anchor_tok_s=anchor_tok_s, measured_period_us=period,
        d2h_gpu_us=copy[0].gpu_us if copy else 0.0, host_dev=host_dev,
        measured={WAITS: float(waited.mean()),
                  **_device_times(shape, good, start, end)})
    return _place_loop(m, float(waited.mean())) if cuda else m


def _eager_seed_work(launches: list, num_steps: int, L: float) -> list:
    """The unfolded seed's device work where its interval is the host's pace (module doc):
    one of the draft graph's S-1 steps, where that is less than the interval."""
    graph = [ln for ln in launches if ln.stage == "draft" and not ln.eager]
    if not graph or num_steps < 2:
        return launches
    est = dict(graph[0].stages).get("draft", 0.0) / (num_steps - 1)
    out = []
    for ln in launches:
        gpu_us = ln.gpu_us
        if ln.stage == "draft.seed" and ln.eager and 0 < est < gpu_us <= ln.host_us + L:
            ln = replace(ln, stages=tuple((s, d * est / gpu_us) for s, d in ln.stages),
                         paced_us=gpu_us)
        out.append(ln)
    return out


WAITS = "host waits (sync)"


def _position_labels(shape: Sequence[tuple[str, str]]) -> list[str]:
    """A stage name per position of the step's shape, numbered where it repeats."""
    seen: dict[str, int] = {}
    out = []
    for _, s in shape:
        seen[s] = seen.get(s, 0) + 1
        n = sum(1 for _, x in shape if x == s)
        out.append(s if n == 1 else f"{s}#{seen[s]}")
    return out


def _device_times(shape, steps, start, end) -> dict:
    """Per position of the step's shape: the meter's mean interval and the idle before it
    (from the stage before it in the step; the first, from the previous step's last forward
    stage where that step is in the table too)."""
    labels = _position_labels(shape)
    out = {}
    fwd = [i for i, (lane, _) in enumerate(shape) if lane == "forward"]
    for i, name in enumerate(labels):
        out[f"{name} (device)"] = float((end[:, i] - start[:, i]).mean())
        if i > 0:
            out[f"idle before {name}"] = float((start[:, i] - end[:, i - 1]).mean())
        elif fwd:
            prev = {s: j for j, s in enumerate(steps)}
            gaps = [start[j, 0] - end[prev[s - 1], fwd[-1]] for j, s in enumerate(steps)
                    if s - 1 in prev]
            if gaps:
                out[f"idle before {name}"] = float(sum(gaps) / len(gaps))
    return out


def stage_errors(m: StepModel, r: Optional[Replay] = None) -> pd.DataFrame:
    """The replay of the run beside the run, per measured quantity (`StepModel.measured`:
    the host's waits, each device stage's interval and the idle before it, µs per step):
    stage, measured_us, replayed_us, diff_us (replayed - measured), largest |diff| first.
    Device rows are left out where a what-if changed the step's stages."""
    r = replay(m) if r is None else r
    cols = ["stage", "measured_us", "replayed_us", "diff_us"]
    if not m.measured:
        return pd.DataFrame(columns=cols)
    ks = r.steady
    rows = [(WAITS, m.measured[WAITS],
             sum(b - a for k, _, kind, a, b in r.host if kind == "sync" and k in ks) /
             max(1, len(ks)))]
    by_step: dict[int, list] = {}
    for k, s, lane, a, b in r.device:
        by_step.setdefault(k, []).append((LANE_ORDER.get(lane, 2), a, s, b))
    seqs = {k: sorted(v) for k, v in by_step.items()}
    n = sum(1 for key in m.measured if key.endswith(" (device)"))
    if ks and all(len(seqs.get(k, ())) == n for k in ks) and len(seqs.get(ks[0] - 1, ())) == n:
        shape = [(str(o), s) for o, _, s, _ in seqs[ks[0]]]
        labels = _position_labels(shape)
        fwd = [i for i, (o, _) in enumerate(shape) if o == str(LANE_ORDER["forward"])]
        for i, name in enumerate(labels):
            dur = [seqs[k][i][3] - seqs[k][i][1] for k in ks]
            rows.append((f"{name} (device)", m.measured.get(f"{name} (device)"),
                         sum(dur) / len(dur)))
            if i > 0:
                idle = [seqs[k][i][1] - seqs[k][i - 1][3] for k in ks]
            elif fwd:
                idle = [seqs[k][0][1] - seqs[k - 1][fwd[-1]][3] for k in ks]
            else:
                continue
            rows.append((f"idle before {name}", m.measured.get(f"idle before {name}"),
                         sum(idle) / len(idle)))
    df = pd.DataFrame([(s, a, b) for s, a, b in rows if a is not None],
                      columns=cols[:3])
    df["diff_us"] = df["replayed_us"] - df["measured_us"]
    return df.reindex(df["diff_us"].abs().sort_values(ascending=False, kind="stable").index) \
        .reset_index(drop=True)


def self_check(m: StepModel, r: Optional[Replay] = None,
               warn: float = SELF_ERROR_WARN) -> tuple[float, Optional[str]]:
    """The self error and, where it exceeds `warn`, one sentence naming the stage whose
    replayed time differs most from the run's (stage_errors)."""
    r = replay(m) if r is None else r
    e = self_error(m, r.period_us)
    if not abs(e) > warn:
        return e, None
    errs = stage_errors(m, r)
    where = ""
    if len(errs):
        top = errs.iloc[0]
        where = (f"; the stage whose times differ most is {top['stage']}: replayed "
                 f"{top['replayed_us']:.1f} µs against the run's {top['measured_us']:.1f} µs "
                 "per step")
    return e, (f"warning: the replay of the run is {e:+.1%} off its measured step (more than "
               f"{warn:.0%}){where}; read the predictions with that error in mind.")


def host_waits(host: pd.DataFrame) -> pd.Series:
    """Per row of a host-step table: the host's waits (`sync` spans, nested ones too)."""
    cols = [c for c in host.columns if c == "sync" or c.startswith("sync@")]
    return host[cols].sum(axis=1) if cols else pd.Series(0.0, index=host.index)


def _place_loop(m: StepModel, waits_us: float, rounds: int = 3) -> StepModel:
    """`m` with `loop_before_read_us` set so that the replay waits `waits_us` per step, the
    run's measured waits (module doc): each µs of loop moved before the read shortens a wait
    that the read ends by one µs, so a few rounds of the difference settle it."""
    loop = m.host.get(LOOP, 0.0)
    for _ in range(rounds):
        r = replay(m)
        t0, t1 = r.window
        if t1 <= t0:
            break
        waited = sum(max(0.0, min(b, t1) - max(a, t0)) for _, _, kind, a, b in r.host
                     if kind == "sync") * r.period_us / (t1 - t0)      # per replayed step
        x = min(loop, max(0.0, m.loop_before_read_us + waited - waits_us))
        if abs(x - m.loop_before_read_us) < 0.05:
            break
        m = replace(m, loop_before_read_us=x)
    return m


def _mean(df: pd.DataFrame, col: str) -> float:
    return float(df[col].mean()) if col in df else 0.0


def load_run(run_dir: str | Path) -> StepModel:
    """The StepModel of a run folder holding manifest.json, meter_stages.parquet,
    host_steps.parquet and whatif.json (mtplab run --step-profile true, or a sweep cell with
    the workload's step_profile), each read through analysis/run_folder.py; WhatIfError (one
    sentence) for a folder, a file or a setting the predictor cannot read."""
    d = Path(run_dir)
    if not d.is_dir():
        raise WhatIfError(f"{d} is not a folder; give a run folder (mtplab run --out DIR "
                          "--step-profile true, or a sweep cell's traces/<cell_id>).")
    missing = [f for f in (MANIFEST_FILE, METER_STAGES_FILE, HOST_STEPS_FILE, ANCHOR_FILE)
               if not (d / f).is_file()]
    if missing:
        raise WhatIfError(f"{d} lacks {', '.join(missing)}; record the run with "
                          "--step-profile true (mtplab run) or step_profile: true (a sweep "
                          "cell), which writes them.")
    try:
        man = json_object(d / MANIFEST_FILE, "the run's manifest")
        anchor = json_object(d / ANCHOR_FILE, "the step profile's anchor")
        stages = table(d / METER_STAGES_FILE, ("step", "stage", "lane", "start_us", "end_us"),
                       "the bubble meter's stage table",
                       numeric=("step", "start_us", "end_us"))
        host = table(d / HOST_STEPS_FILE, ("step", "period_us"), "the host-step table")
    except RunFolderError as e:
        raise WhatIfError(str(e)) from None
    cfg = man.get("config", man)
    if not isinstance(cfg, dict):
        raise WhatIfError(f"{d / MANIFEST_FILE}: its config is a JSON {type(cfg).__name__}, not "
                          "an object; record the run again.")
    _check_config(cfg, d / MANIFEST_FILE)
    for c in ("stage", "lane"):
        if not stages[c].map(lambda v: isinstance(v, str)).all():
            raise WhatIfError(f"{d / METER_STAGES_FILE}: column {c} holds a value that is not "
                              "a name; record the run again.")
    if (stages["end_us"] < stages["start_us"]).any():
        raise WhatIfError(f"{d / METER_STAGES_FILE}: an interval ends before it starts; "
                          "record the run again.")
    if ((host.drop(columns="step") < 0).any()).any():
        raise WhatIfError(f"{d / HOST_STEPS_FILE}: a host time is negative; record the run "
                          "again.")
    stages = stages.assign(dur_us=stages["end_us"] - stages["start_us"])
    return from_tables(cfg, stages, host,
                       anchor_tok_s=_anchor_number(anchor, "meter_tok_per_s", d, math.nan),
                       latency_us=_anchor_number(anchor, "latency_us", d, 0.0),
                       seed_forward=_anchor_flag(anchor, "seed_forward", d),
                       eager=_anchor_names(anchor, "eager_launches", d))


_CFG_FLAGS = ("overlap", "fold_seed", "cuda_graphs", *ZB_SUBKNOBS)


def _check_config(cfg: dict, path: Path) -> None:
    """The settings the replay reads, each of its type (a manifest whose draft or overlap is
    nonsense is refused, not replayed)."""
    fix = "record the run again (its manifest is written by the run)"
    for k in _CFG_FLAGS:
        v = cfg.get(k)
        if v is not None and not isinstance(v, bool):
            raise WhatIfError(f"{path}: config {k} is {v!r}, not true / false; {fix}.")
    draft = cfg.get("draft", "none")
    if draft not in ("none", *DRAFT_KINDS):
        raise WhatIfError(f"{path}: config draft is {draft!r}, not a draft kind (none, "
                          f"{', '.join(DRAFT_KINDS)}); {fix}.")
    n = cfg.get("num_steps", 0)
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 0):
        raise WhatIfError(f"{path}: config num_steps is {n!r}, not a count; {fix}.")
    if not isinstance(cfg.get("device", "cpu"), str):
        raise WhatIfError(f"{path}: config device is {cfg.get('device')!r}, not a device name; "
                          f"{fix}.")


def _anchor_number(anchor: dict, key: str, d: Path, default: float) -> float:
    v = anchor.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise WhatIfError(f"{d / ANCHOR_FILE}: {key} is {v!r}, not a finite number >= 0; "
                          "record the run again.")
    return float(v)


def _anchor_flag(anchor: dict, key: str, d: Path) -> bool:
    v = anchor.get(key, False)
    if not isinstance(v, bool):
        raise WhatIfError(f"{d / ANCHOR_FILE}: {key} is {v!r}, not true / false; record the "
                          "run again.")
    return v


def _anchor_names(anchor: dict, key: str, d: Path) -> tuple:
    v = anchor.get(key, [])
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise WhatIfError(f"{d / ANCHOR_FILE}: {key} is {v!r}, not a list of stage names; "
                          "record the run again.")
    return tuple(v)


def describe(m: StepModel) -> str:
    """The model in a few lines: the loop, host times, launches (host µs | GPU µs)."""
    lp = m.loop
    knobs = " ".join(f"{k}={int(getattr(lp, k))}" for k in
                     ("overlap", "async_d2h", "device_seq_lens", "draft_preexec", "fold_seed"))
    cpu = " (CPU: device work inside host calls)" if lp.host_runs_device else ""
    lines = [f"loop: {knobs}{cpu}"
             f"; L = W = {m.launch_latency_us:.1f} µs",
             "host µs: " + ", ".join(f"{n} {m.host.get(n, 0.0):.1f}" for n in HOST_NAMES) +
             (f" (of loop {m.loop_before_read_us:.1f} before the results read)"
              if m.loop_before_read_us > 0 else "")]
    if m.n_steps:
        j = pd.Series([sum(d[k] for d in [*m.host_dev.values(), *(ln.host_dev for ln in
                                                                   m.launches)] if d)
                       for k in range(m.n_steps)])
        lines.append(f"host jitter over {len(j)} steps (each host time's own deviation, "
                     f"replayed step by step): sd {j.std():.1f} µs, p90 {j.quantile(0.9):+.1f}, "
                     f"max {j.max():+.1f}")
    for ln in m.launches:
        lines.append(f"  {ln.lane:<7} {ln.stage:<12} host {ln.host_us:8.1f} | GPU " +
                     " + ".join(f"{s} {d:.1f}" for s, d in ln.stages) +
                     (f" (after a {ln.gap_us:.1f} µs device gap)" if ln.gap_us > 0.05 else "") +
                     (f" (device work estimated; the meter's {ln.paced_us:.1f} µs interval "
                      "is the host's pace of issuing it)" if ln.paced_us else ""))
    return "\n".join(lines)


def knob_whatifs(diff: dict) -> Optional[str]:
    """The what-if that turns one resolved config into another, from the fields that differ
    (`{field: (run's, other's)}`); None when a differing field is not one the predictor
    replays."""
    parts = []
    for k, (_, b) in diff.items():
        if k in ("overlap", "fold_seed", *ZB_SUBKNOBS):
            parts.append(f"{k}={'on' if b else 'off'}")
        elif k == "zero_bubble":
            continue                        # the sub-knobs it resolves to say it
        else:
            return None
    return ",".join(parts) or None
