"""Bubble meter: the GPU stamps its own time at stage boundaries; per step, the device time
not covered by any stage is the bubble. No profiler, no host sync per step.

    stage span (eager)      stamp kernel (begin) ... the stage's work ... stamp kernel (end)
    stage graph (captured)  [stamp begin, the stage's kernels, stamp end] in one replay
                            (a graph of several stages: stamps at each stage boundary)
    self-stamped kernel     one kernel doing the stage's work between its own two stamps
                            (the `d2h` copies on CUDA: kernels/stamp.py stamped_copy)
    step span               names the step; every stamp issued inside it belongs to it
Each stamp writes (code, %globaltimer ns) into a device ring (kernels/stamp.py); the ring is
read back once per `generate` (`collect`, after the engine's end-of-call synchronize), or
earlier with one synchronize when half the ring is pending. Records are matched to the host's
issue log lane by lane (one lane = one stream; a stream claims slots in issue order), so a
graph's stamps, whose code is fixed at capture, get their step from the replay that issued
them. Only device lanes are stamped (`forward`, `copy`); `host` spans (schedule, prepare,
sync, process_result) are not GPU work. On CPU the same ring is written by `stamp_ref` with
host `perf_counter_ns` times: a stage's interval is then its host execution time.

Per step (device timeline, as the trace analyser defines it, docs/design.md "Bubbles"):
    end[k]    = end of step k's last stage interval (running maximum over steps)
    window k  = (end[k-1], end[k]]      the first step starts at its first stamp
    wall_us   = window length           busy_us = union of ALL stage intervals (any step,
    bubble_us = wall_us - busy_us       any lane) inside the window: overlap counted once
A bubble thus belongs to the step whose work it delayed (a host sleep between steps k and
k+1 lands in step k+1).
    launch_lead_us = end of step k's own last stage interval - the host's issue of step k+1's
                 forward work (`mark_launch`, just before the worker's forward is issued), on
                 the device clock (mtplab/health.py: > 0 is run-ahead); NaN for a step with no
                 next launch in its generate (`cut`). The host's perf_counter is put on the
                 device clock by an offset measured at each `collect`: the least (stamp time -
                 host time just before its launch) over a few stamps on an idle GPU, which is
                 late by at most one launch latency (a few µs), so a lead reads that much short
                 and an overlap-off step (the host waited for the results) never reads > 0. On
                 CPU the stamps are host times: a lead there is host time between two stages
                 (the engine reports no run-ahead there: no device to run ahead of).
    draft_us   = union of step k's own draft-stage intervals (stages.DRAFT_STAGES);
    draft_share = draft_us / busy_us: the draft's share of the step's GPU busy time

What it cannot see (measure it against the profiler: benchmarks/bench_meter.py):

    GPU  |[b verify-graph: k1  k2 ... k9 e]|      |[b publish e]|
                           ^^ idle between kernels inside one stage counts as busy here
              ^ the stamp kernels' own time counts as busy
                                            ^^^^^^ idle between stages: the meter's bubble
    - idle inside one stage (between the kernels of a graph or an eager stage: launch gaps
      of an eager stage, dependency stalls inside a graph) is covered by the stage interval;
    - GPU work issued outside every device-lane stage (e.g. the schedule stream's input
      H2D in `prepare`) is not covered, so it counts as bubble;
    - a stage interval starts when the stream reaches its begin stamp, which includes any
      wait of that stream (an event wait before the stage's first kernel).
Frames: `frame()` one row per step (step, name, start_us, wall_us, busy_us, bubble_us,
bubble_frac, n_stages); `stages_frame()` one row per stage interval (step, stage, lane,
start_us, end_us, dur_us). Times are µs since the meter's first stamp (device clock).
"""
from __future__ import annotations

import time
from typing import NamedTuple, Optional

import numpy as np
import pandas as pd
import torch

from ..health import RUN_AHEAD_KEYS, launch_leads, run_ahead
from ..kernels.stamp import StampLauncher, stamp_ref
from ..stages import DRAFT_STAGES, STAGES, STEP_RE

LANES = ("forward", "copy")         # stamped lanes; "host" spans are never stamped
_STAGE_ID = {s: i + 1 for i, s in enumerate(STAGES)}      # 1-based: codes are never 0 or 1
_STAGE_OF = {i: s for s, i in _STAGE_ID.items()}
_LANE_ID = {lane: i for i, lane in enumerate(LANES)}
_CODE_BITS = 16                     # a collected log entry = step << 16 | code
STEP_COLUMNS = ["step", "name", "start_us", "wall_us", "busy_us", "bubble_us", "bubble_frac",
                "n_stages", "launch_lead_us", "draft_us", "draft_share"]
STAGE_COLUMNS = ["step", "stage", "lane", "start_us", "end_us", "dur_us"]


_CAL_STAMPS = 8                     # stamps per clock-offset measurement
_HANDOVER = 1 << 12                 # a begin stamp that also ends the lane's open stage
MAX_LAUNCH_STAMPS = 8               # stamps one launch may log as one entry (`launch_codes`)


class KernelStamp(NamedTuple):
    """A self-stamping kernel's stamps: `args` it takes, `codes` the log entry after it."""
    args: tuple                     # (ring, count, begin code, end code)
    codes: tuple                    # (begin code, end code)


def stamp_code(stage: str, lane: str, end: bool, handover: bool = False) -> int:
    """code = handover << 12 | lane << 8 | stage id << 1 | end (stage ids from
    mtplab/stages.py). A handover stamp begins `stage` and ends the stage open on its lane
    at the same instant: inside a graph one stage's last kernel is followed by the next
    stage's first with no host in between, so one stamp marks both (graphs/runner.py)."""
    if stage not in _STAGE_ID:
        raise ValueError(f"{stage!r} is not a stage name of docs/design.md (mtplab/stages.py).")
    if lane not in _LANE_ID:
        raise ValueError(f"lane {lane!r} is not stamped; use one of {LANES}.")
    if handover and end:
        raise ValueError("a handover stamp begins a stage; it cannot also be an end stamp.")
    return handover * _HANDOVER | _LANE_ID[lane] << 8 | _STAGE_ID[stage] << 1 | int(end)


def launch_codes(codes: tuple) -> tuple:
    """`codes` checked as one launch's log entry (`log(codes)` after each launch)."""
    if not 1 <= len(codes) <= MAX_LAUNCH_STAMPS:
        raise ValueError(f"one launch logs 1 to {MAX_LAUNCH_STAMPS} stamps, got {len(codes)}; "
                         "split the graph into more segments.")
    return tuple(codes)


class _StampSpan:
    """An eager stage on a device lane: one stamp at each boundary (stateless, cached)."""

    __slots__ = ("meter", "begin", "end")

    def __init__(self, meter: "BubbleMeter", begin: int, end: int):
        self.meter, self.begin, self.end = meter, begin, end

    def __enter__(self):
        self.meter.stamp(self.begin)
        return self

    def __exit__(self, *exc):
        self.meter.stamp(self.end)
        return False


class _StepSpan:
    """The step span: opens the meter's next step (stateless, cached per name). Its enter
    is the meter's whole per-step host cost: a length test, a counter, one log append."""

    __slots__ = ("meter", "name")

    def __init__(self, meter: "BubbleMeter", name: str):
        self.meter, self.name = meter, name

    def __enter__(self):
        m = self.meter
        if len(m._log) >= m._drain_at:           # read before the ring could wrap
            m.drains += 1
            m.collect(calibrate=False)
        m.step += 1
        m.log(self.name)
        return self

    def __exit__(self, *exc):
        return False


class _Null:
    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_NULL = _Null()


class BubbleMeter:
    """Device stamps at stage boundaries -> per-step wall, stage intervals and bubble."""

    stamp_code = staticmethod(stamp_code)     # graphs/runner.py codes its captured stamps
    launch_codes = staticmethod(launch_codes)

    def __init__(self, device: torch.device, capacity: int = 1 << 16):
        if capacity < 4 or capacity & (capacity - 1):
            raise ValueError(f"meter capacity must be a power of two >= 4, got {capacity}.")
        self.cuda = torch.device(device).type == "cuda"
        self.capacity = capacity
        self.ring = torch.zeros(capacity, 2, dtype=torch.long, device=device)
        self.count = torch.zeros(1, dtype=torch.int32, device=device)
        # compiled and loaded now, never during a graph capture
        self._launch = StampLauncher(self.ring, self.count) if self.cuda else None
        # the clock offset's stamps: a ring of their own (never in the issue log)
        self._cal = None
        if self.cuda:
            cal_ring = torch.zeros(_CAL_STAMPS, 2, dtype=torch.long, device=device)
            cal_count = torch.zeros(1, dtype=torch.int32, device=device)
            self._cal = (cal_ring, cal_count, StampLauncher(cal_ring, cal_count))
        self._offset_ns = 0 if not self.cuda else None    # device ns - host perf_counter ns
        self._launches: list = []           # (step, host ns) by `mark_launch`, not collected
        self._launch_dev: dict = {}         # step -> its launch on the device clock (ns)
        self._cuts: set = set()             # steps whose next launch is not in their run
        # CPU: stamp_ref on numpy views of the same memory (no torch op per stamp)
        self._host = (self.ring.numpy(), self.count.numpy()) if not self.cuda else None
        self.step = -1                      # the open step (-1: none yet)
        self.names: list[str] = []          # step -> step span name (filled by collect)
        self.drains = 0                     # synchronizing reads forced by a half-full ring
        # The issue log, in issue order; `log` is its bound append (one C call per launch):
        #   "step[...]"   a step marker: the next step begins (its name)
        #   (c0, c1, ..)  one launch's stamps (a graph replay, a self-stamping kernel)
        #   c             one eager stamp
        # Entries belong to the step of the last marker before them. The list is cleared in
        # place, never rebound (`log` stays valid).
        self._log: list = []
        self.log = self._log.append
        self._log_step = -1                 # the step of entries before any marker
        # drain before the ring could wrap: every entry holds at most MAX_LAUNCH_STAMPS
        self._drain_at = max(1, capacity // (2 * MAX_LAUNCH_STAMPS))
        self._read = 0                      # ring records consumed so far
        self._t0_ns: Optional[int] = None
        self._spans: dict = {}              # lane -> {name: span}
        self._step_spans: dict = {}         # step span name -> _StepSpan
        self._kernel_stamps: dict = {}      # (stage, lane) -> KernelStamp
        self._rows: list[tuple] = []        # (step, stage, lane, start_ns, end_ns)

    def close(self) -> None:
        """Drop the span caches (each cached span holds the meter: a cycle, broken here), the
        log and the launcher; the ring goes with the meter."""
        self._spans.clear()
        self._step_spans.clear()
        self._kernel_stamps.clear()
        self._log.clear()
        self._launch = None
        self._cal = None

    # -- issue (hot path) ------------------------------------------------------------------
    def span(self, name: str, lane: str, graphed: bool = False):
        """The meter's context manager for a stage span: stamps for an eager device-lane
        stage, nothing for host spans and graphed stages (their graph, or the stage's
        self-stamping kernel, carries the stamps). A step span is `step_span`."""
        if graphed or lane not in _LANE_ID:
            return _NULL
        by_name = self._spans.get(lane)         # two str-keyed lookups: no key tuple per call
        if by_name is None:
            by_name = self._spans[lane] = {}
        sp = by_name.get(name)
        if sp is None:
            sp = by_name[name] = _StampSpan(self, stamp_code(name, lane, False),
                                            stamp_code(name, lane, True))
        return sp

    def step_span(self, name: str) -> "_StepSpan":
        """The step span `name` (step[decode bs=N] ...): entering it opens the next step."""
        sp = self._step_spans.get(name)
        if sp is None:
            if not STEP_RE.match(name):
                raise ValueError(f"{name!r} is not a step span name (step[decode bs=N]).")
            sp = self._step_spans[name] = _StepSpan(self, name)
        return sp

    def stamp(self, code: int) -> None:
        """One stamp on the current stream, logged for the current step."""
        if self.cuda:
            self._launch(code)
        else:
            stamp_ref(*self._host, code, time.perf_counter_ns())
        self.log(code)

    def kernel_stamp(self, stage: str, lane: str) -> KernelStamp:
        """A stage whose one kernel stamps itself (kernels/stamp.py `stamped_copy`): `.args`
        for the kernel (ring, count, begin code, end code); `log(.codes)` once launched."""
        key = (stage, lane)
        st = self._kernel_stamps.get(key)
        if st is None:
            b, e = stamp_code(stage, lane, False), stamp_code(stage, lane, True)
            st = self._kernel_stamps[key] = KernelStamp((self.ring, self.count, b, e), (b, e))
        return st

    def mark_launch(self) -> None:
        """The host is about to issue the open step's forward work: its launch time (the
        first mark of a step counts). One clock read and one append, no device work."""
        self._launches.append((self.step, time.perf_counter_ns()))

    def cut(self) -> None:
        """The open step is the last of its run (a generate): the next launch is not its
        successor's, so it gets no launch lead."""
        self._cuts.add(self.step)

    def device_stamp(self, code: int) -> None:
        """A stamp with no log entry: inside a CUDA graph being captured (`log` at replay)."""
        self._launch(code)

    def begin_step(self, name: str) -> None:
        """Open the next step (what entering its step span does)."""
        self.step_span(name).__enter__()

    # -- read back ---------------------------------------------------------------------------
    def collect(self, calibrate: bool = True) -> None:
        """Read the ring (one synchronize) and turn its records into stage intervals; the
        launch marks go onto the device clock (`calibrate`: the offset measured afresh; a
        drain mid-run reuses the last one)."""
        if self.cuda:
            torch.cuda.synchronize(self.ring.device)
            if self._launches and (calibrate or self._offset_ns is None):
                self._offset_ns = self._clock_offset()
        for st, ns in self._launches:
            self._launch_dev.setdefault(st, ns + self._offset_ns)
        self._launches.clear()
        n = int(self.count[0])
        new = n - self._read
        log, step, names = [], self._log_step, self.names
        for x in self._log:
            t = type(x)
            if t is tuple:                          # one launch's codes
                log.extend(step << _CODE_BITS | c for c in x)
            elif t is str:                          # a step marker
                step += 1
                names.append(x)
            else:                                   # an eager stamp's code
                log.append(step << _CODE_BITS | x)
        if new != len(log):
            raise RuntimeError(f"bubble meter: {new} stamps reached the ring but "
                               f"{len(log)} were issued; a stamp ran outside the meter's "
                               "log (e.g. a graph captured with stamps replayed by hand).")
        if new > self.capacity:
            raise RuntimeError(f"bubble meter: {new} stamps since the last read overflowed the "
                               f"ring of {self.capacity}; construct it with a larger capacity.")
        self._log.clear()
        self._log_step = step
        if new == 0:
            return
        slots = (self._read + torch.arange(new)) & (self.capacity - 1)
        rec = self.ring.cpu().numpy()[slots.numpy()]
        log = np.asarray(log, dtype=np.int64)
        self._read = n                      # consumed: an error below leaves the meter usable
        if log.min() < 0:
            raise RuntimeError("bubble meter: a stamp was issued before the first step span; "
                               "stamps belong to a step (open one with Spans.step).")
        self._rows += _pair(log >> _CODE_BITS, log & ((1 << _CODE_BITS) - 1), rec[:, 0], rec[:, 1])
        if self._t0_ns is None and self._rows:
            self._t0_ns = min(r[3] for r in self._rows)

    def _clock_offset(self) -> int:
        """device ns - host perf_counter ns: the least (stamp time - host time just before
        its launch) over _CAL_STAMPS stamps, each launched on an idle GPU (late by at most
        one launch latency)."""
        ring, count, launch = self._cal
        count.zero_()
        torch.cuda.synchronize(ring.device)
        host = []
        for _ in range(_CAL_STAMPS):
            host.append(time.perf_counter_ns())
            launch(2)
            torch.cuda.synchronize(ring.device)
        dev = ring[:, 1].cpu().numpy()
        return int(min(int(d) - h for d, h in zip(dev.tolist(), host)))

    # -- tables ------------------------------------------------------------------------------
    def stages_frame(self, first_step: int = 0) -> pd.DataFrame:
        """One row per stage interval (collected so far) of the steps >= first_step."""
        rows = self._rows
        if first_step > 0:       # rows are in step order: spans nest inside their step span
            k = next((i for i in range(len(rows) - 1, -1, -1) if rows[i][0] < first_step), -1)
            rows = rows[k + 1:]
        df = pd.DataFrame(rows, columns=["step", "stage", "lane", "start_ns", "end_ns"])
        t0 = self._t0_ns or 0
        out = pd.DataFrame({"step": df["step"].astype(np.int64), "stage": df["stage"],
                            "lane": df["lane"], "start_us": (df["start_ns"] - t0) / 1e3,
                            "end_us": (df["end_ns"] - t0) / 1e3}, columns=STAGE_COLUMNS)
        out["dur_us"] = out["end_us"] - out["start_us"]
        return out

    def frame(self, first_step: int = 0) -> pd.DataFrame:
        """One row per step with stage intervals (module docstring for every column), of the
        steps >= first_step (the window of the first one starts where step first_step-1 ends)."""
        st = self.stages_frame(max(0, first_step - 1))
        if st.empty:
            return pd.DataFrame({c: [] for c in STEP_COLUMNS})
        s, e, k = (st["start_us"].to_numpy(), st["end_us"].to_numpy(),
                   st["step"].to_numpy())
        steps = np.unique(k)
        last = np.full(steps.size, -np.inf)
        np.maximum.at(last, np.searchsorted(steps, k), e)
        lo = float(s[k == steps[0]].min())
        bounds = np.maximum.accumulate(np.maximum(last, lo))
        starts = np.concatenate(([lo], bounds[:-1]))
        us, ue = _union(s, e)
        busy = _covered(us, ue, bounds) - _covered(us, ue, starts)
        wall = bounds - starts
        with np.errstate(invalid="ignore", divide="ignore"):
            frac = np.where(wall > 0, (wall - busy) / np.where(wall > 0, wall, 1.0), np.nan)
        t0 = self._t0_ns or 0
        nxt = np.array([np.nan if int(i) in self._cuts else
                        (self._launch_dev.get(int(i) + 1, np.nan) - t0) / 1e3 for i in steps])
        draft = _own_union(st[st["stage"].isin(DRAFT_STAGES)], steps)
        with np.errstate(invalid="ignore", divide="ignore"):
            dshare = np.where(busy > 0, draft / np.where(busy > 0, busy, 1.0), np.nan)
        df = pd.DataFrame({
            "step": steps.astype(np.int64), "name": [self.names[i] for i in steps],
            "start_us": starts, "wall_us": wall, "busy_us": busy,
            "bubble_us": np.maximum(wall - busy, 0.0), "bubble_frac": frac,
            "n_stages": np.bincount(np.searchsorted(steps, k), minlength=steps.size),
            "launch_lead_us": launch_leads(last, nxt), "draft_us": draft,
            "draft_share": dshare},
            columns=STEP_COLUMNS)
        return df[df["step"] >= first_step].reset_index(drop=True)

    def summary(self, first_step: int = 0, decode_only: bool = True) -> dict:
        """bubble_frac (bubble / wall), bubble_us_per_step, draft_busy_frac (draft / busy)
        and the run-ahead figures (health.RUN_AHEAD_KEYS) over the steps >= first_step
        (decode steps only by default: the steady state)."""
        df = self.frame(first_step)
        if decode_only:
            df = df[df["name"].str.startswith("step[decode")]
        wall = float(df["wall_us"].sum())
        busy = float(df["busy_us"].sum())
        nan = float("nan")
        return {"bubble_frac": float(df["bubble_us"].sum()) / wall if wall > 0 else nan,
                "bubble_us_per_step": float(df["bubble_us"].mean()) if len(df) else nan,
                "meter_wall_us_per_step": float(df["wall_us"].mean()) if len(df) else nan,
                "meter_steps": int(len(df)),
                "draft_busy_frac": float(df["draft_us"].sum()) / busy if busy > 0 else nan,
                **run_ahead(df["launch_lead_us"])}


METER_KEYS = ("bubble_frac", "bubble_us_per_step", "meter_wall_us_per_step", "meter_steps",
              "meter_tok_per_s", "draft_busy_frac", *RUN_AHEAD_KEYS)


def meter_throughput(summary: dict, decode_tokens: int) -> float:
    """Decode tokens over the meter's decode-step windows summed: the decode phase on the
    device's own timeline, so every host delay between steps counts (an on_step hook, the
    generate loop), which `decode_tok_per_s` (the scheduler's iteration times) leaves out."""
    wall = summary["meter_wall_us_per_step"] * summary["meter_steps"]
    return decode_tokens / wall * 1e6 if wall > 0 else float("nan")


def meter_figures(stats: dict) -> dict:
    """The meter's figures of an `Engine.stats()` (NaN / 0 when the meter was off): the
    headline `bubble_frac` of sweeps and `mtplab bench` (the profiled one is
    `bubble_frac_profiled`)."""
    nan = float("nan")
    return {k: stats.get(k, 0 if k in ("meter_steps", "run_ahead_steps") else nan)
            for k in METER_KEYS}


def _pair(step: np.ndarray, code: np.ndarray, dev_code: np.ndarray,
          dev_ns: np.ndarray) -> list[tuple]:
    """Match ring records to the issue log lane by lane, then pair begin/end stamps (spans
    on one lane nest) -> (step, stage, lane, start_ns, end_ns) per stage interval."""
    ns = np.empty(code.size, np.int64)
    lane_of, dev_lane = (code >> 8) & 0xF, (dev_code >> 8) & 0xF
    for lid in np.unique(lane_of).tolist():
        h = np.flatnonzero(lane_of == lid)
        d = np.flatnonzero(dev_lane == lid)
        if h.size != d.size or not np.array_equal(code[h], dev_code[d]):
            raise RuntimeError(f"bubble meter: the stamps of lane {LANES[lid]!r} reached the "
                               "ring in another order than they were issued (a lane ran on "
                               "more than one stream).")
        ns[h] = dev_ns[d]
    rows, open_ = [], {}
    for st, c, t in zip(step.tolist(), code.tolist(), ns.tolist()):
        lane, stage = (c >> 8) & 0xF, (c >> 1) & 0x7F
        stack = open_.setdefault(lane, [])
        if c & _HANDOVER:        # ends the open stage, then begins `stage`, at one instant
            if not stack:
                raise RuntimeError(f"bubble meter: a handover to {_STAGE_OF[stage]!r} with no "
                                   "stage open on its lane.")
            s0, prev, t0 = stack.pop()
            rows.append((s0, _STAGE_OF[prev], LANES[lane], t0, t))
        if not c & 1:
            stack.append((st, stage, t))
            continue
        if not stack or stack[-1][1] != stage:
            raise RuntimeError(f"bubble meter: an end stamp of {_STAGE_OF[stage]!r} without its "
                               "begin on its lane (spans must nest).")
        s0, _, t0 = stack.pop()
        rows.append((s0, _STAGE_OF[stage], LANES[lane], t0, t))
    return rows


def _own_union(st: pd.DataFrame, steps: np.ndarray) -> np.ndarray:
    """Per step of `steps`: the length of the union of its own intervals in `st` (each
    step's intervals shifted by step x the time range, so no two steps' intervals merge)."""
    out = np.zeros(steps.size)
    if st.empty:
        return out
    s, e = st["start_us"].to_numpy(), st["end_us"].to_numpy()
    span = float(e.max() - s.min()) + 1.0
    shift = st["step"].to_numpy().astype(float) * span
    us, ue = _union(s - s.min() + shift, e - s.min() + shift)
    own = np.floor(us / span).astype(np.int64)
    i = np.searchsorted(steps, own)
    ok = (i < steps.size) & (steps[np.clip(i, 0, steps.size - 1)] == own)
    np.add.at(out, i[ok], (ue - us)[ok])
    return out


def _union(s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted disjoint union of intervals (touching ones merge)."""
    o = np.lexsort((e, s))
    s, e = s[o], e[o]
    run = np.maximum.accumulate(e)
    new = np.ones(s.size, bool)
    new[1:] = s[1:] > run[:-1]
    idx = np.flatnonzero(new)
    return s[idx], run[np.append(idx[1:] - 1, s.size - 1)]


def _covered(us: np.ndarray, ue: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Length of the union (us, ue) inside (-inf, t], for each t."""
    cum = np.concatenate(([0.0], np.cumsum(ue - us)))
    k = np.searchsorted(us, t, side="right")
    j = np.clip(k - 1, 0, None)
    part = np.where(k > 0, np.clip(np.minimum(t, ue[j]) - us[j], 0.0, None), 0.0)
    return np.where(k > 0, cum[j], 0.0) + part
