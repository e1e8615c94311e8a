"""Does mtplab decode as fast as SGLang, and does it show SGLang's bubbles? One harness drives
both engines on the same workload: SGLang 0.5.17 through its offline `sglang.Engine` (token
ids in, no HTTP, no tokenizer) and mtplab through `Engine.generate`, each in a worker process
of its own (peer_worker.py), side by side on one GPU.

    python -m benchmarks.bench_peer_sglang --out DIR [--shapes ...] [--bs 1 8 32]
        [--drafts target eagle frozen eagle-k4p16 frozen-k4p16] [--overlap on off]
        [--pairs SHAPE:DRAFT ...] [--repeats 3] [--deadline-s S] [--profile-steps 20]
        [--out-dir RESULTS] [--dry-run] [--table-only]

Like for like (peer_plan.py holds the knobs): the same prompts (token ids, sent to
both), the same output length with ignore_eos, the same batch (all bs requests submitted at
once; max_running_requests = cuda_graph_max_bs = the group's largest bs), random weights of
the same config (config-only directories), the same simulated acceptance
(SGLANG_SIMULATE_ACC_LEN with match-expected; simulate_accept_len), triton attention and CUDA
graphs on both, SGLang's prefix cache off (mtplab has none), no profiler or meter in the timed
runs. Per group (shape, draft, overlap) each side starts once; SGLang's worker is a process of
its own because SGLang reads its environment when its modules are imported, which also keeps a
crash to that worker.

Per cell (bs), after a warm-up of each engine (excluded):

    repeat r = 0..R-1, the arms' order alternating (mtplab first on even r, SGLang first on odd):
        arm: generate(prompts_r, 1 token)  -> t1      (the prefill: TTFT)
             generate(prompts_r, n tokens) -> tn, tokens, decode steps, accept length
    tok/s   = bs * n / tn                    ratio = mtplab tok/s / SGLang tok/s of the same r
    TPOT    = (tn - t1) / (n - 1)            (every request of the batch runs start to end)
    step    = (tn - t1) / decode steps       (a verify step, or a decode step without a draft)
    then each engine's profiled run of the same workload (mtplab: a second engine with the
    bubble meter and the profiler; SGLang: start_profile for --profile-steps steps), its
    trace analysed by mtplab's analyser (`mtplab analyze TRACE` shows the same).

Figures: the median over repeats (min-max beside the ratio). A cell SGLang (or mtplab) cannot
run records that engine's own message (the last exception line of its log). Each finished
cell is written at once, atomically, into DIR/results.json; a second run with the same DIR and
workload skips the cells already there (resume). --deadline-s: no group or cell starts unless
the time left allows it, and one running past the deadline is stopped (its workers killed)
and left for the next run; the table is written from what finished. DIR/table.md holds the
tables; DIR/logs/ each worker's output; DIR/traces/ the profiled traces and their analysis.
Each profiled trace's figures include its run-ahead (the share of steps whose next launch
came before the step's GPU work ended, the launch lead p10 / p50 / p90), for both engines.

`--out-dir RESULTS` also writes the dated report of question `peers` from the finished cells
(mtplab/studies/peers `render`): RESULTS/peers/<YYYY-MM-DD>_<device>_<commit>.{md,json}, the
date the newest cell's, the commit the one every cell ran at (MTP_GIT_COMMIT on a copied
tree). With `--table-only` it writes it from a results.json brought back from the GPU.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import re
import select
import shlex
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional, Protocol

import numpy as np

from mtplab.atomic import atomic_write_text
from mtplab.errors import ConfigError
from mtplab.health import RUN_AHEAD_KEYS

from .. import peers as study
from .. import reports as R
from . import peer_plan as plan_mod
from .peer_plan import (BATCH_SIZES, DRAFTS, OVERLAP, SHAPES, Cell, Group, Workload,
                        mtplab_knobs, prompts, sglang_launch)

SIDES = ("mtplab", "sglang")
WORKER = "mtplab.studies.peers.peer_worker"      # the worker process's module (python -m)
REPO = Path(__file__).resolve().parents[3]       # the workers' folder: the checkout's root
DONE = ("ok", "failed")          # a cell in results.json with one of these is not run again
EXC_LINE = re.compile(r"^\s*(?:[\w.]+\.)?\w*(?:Error|Exception|Exit|Interrupt)\b.*")


class Deadline(Exception):
    """The time given to the run is spent."""


class ArmError(Exception):
    """An engine answered with an error; `message` is its own (from its log where it has one)."""

    def __init__(self, side: str, message: str):
        super().__init__(f"{side}: {message}")
        self.side, self.message = side, message


class Arm(Protocol):
    side: str

    def request(self, msg: dict, timeout: float) -> dict: ...
    def close(self) -> None: ...
    def kill(self) -> None: ...


# ------------------------------------------------------------------ the worker processes
def log_message(log: Path, error: str, since: int = 0) -> str:
    """The engine's own message for `error`: SGLang's scheduler prints its traceback into the
    log and the caller sees only "Initialization failed", so the last exception line the log
    got after byte `since` that is not `error` itself comes first, `error` in brackets."""
    try:
        with open(log, "rb") as f:
            f.seek(since)
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return error
    inner = [ln.strip() for ln in lines if EXC_LINE.match(ln) and ln.strip() != error]
    return f"{inner[-1]} [{error}]" if inner else error


class WorkerArm:
    """An engine in a worker process started in its own session: killing the session ends
    SGLang's scheduler and detokenizer processes with it."""

    def __init__(self, side: str, config: dict, env: dict, log: Path, worker: str = ""):
        self.side, self.log = side, log
        log.parent.mkdir(parents=True, exist_ok=True)
        r_child, w_parent = os.pipe()
        r_parent, w_child = os.pipe()
        cmd = [sys.executable, "-m", WORKER, "--side", worker or side,
               "--config", json.dumps(config), "--rfd", str(r_child), "--wfd", str(w_child)]
        with open(log, "ab") as f:
            self.proc = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT,
                                         pass_fds=(r_child, w_child), start_new_session=True,
                                         cwd=REPO)
        os.close(r_child), os.close(w_child)
        self.wfd, self.rfd, self.buf = w_parent, r_parent, b""

    def request(self, msg: dict, timeout: float) -> dict:
        data = (json.dumps(msg) + "\n").encode()
        since = self.log.stat().st_size if self.log.exists() else 0
        try:
            while data:
                data = data[os.write(self.wfd, data):]
        except BrokenPipeError:
            raise ArmError(self.side, log_message(self.log, "the worker exited", since)) \
                from None
        t_end = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = t_end - time.monotonic()
            if left <= 0:
                raise Deadline(f"{self.side} did not answer {msg['op']!r} in time")
            ready, _, _ = select.select([self.rfd], [], [], left)
            if not ready:
                continue
            chunk = os.read(self.rfd, 1 << 16)
            if not chunk:
                self.proc.wait()
                raise ArmError(self.side, log_message(
                    self.log, f"the worker exited with code {self.proc.returncode}", since))
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        ans = json.loads(line)
        if not ans.pop("ok"):
            raise ArmError(self.side, log_message(self.log, ans["error"], since))
        return ans

    def close(self, timeout: float = 120.0) -> None:
        """Ask the worker to close its engine; kill its session if it does not in time."""
        if self.proc.poll() is None:
            try:
                self.request({"op": "close"}, timeout)
                self.proc.wait(timeout=30)
            except (ArmError, Deadline, subprocess.TimeoutExpired, OSError):
                pass
        self.kill()

    def kill(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                break
            for _ in range(50):
                if self.proc.poll() is not None:
                    break
                time.sleep(0.1)
        for fd in (self.wfd, self.rfd):
            if fd is not None:
                os.close(fd)
        self.wfd = self.rfd = None


# ------------------------------------------------------------------ figures
def trace_figures(trace: Optional[str]) -> dict:
    """Bubble fraction and causes of a trace by mtplab's analyser (what `mtplab analyze TRACE`
    prints), with its run-ahead (health.RUN_AHEAD_KEYS: the share of steps whose next launch
    came before the step's GPU work ended, the launch lead p10 / p50 / p90 in µs, the steps
    with a lead), its tables written beside it in analysis/."""
    if not trace:
        return {"trace": None, "note": "no trace was written"}
    from mtplab.analysis.bubbles import analyze_run, write_analysis
    from mtplab.analysis.causes import cause_split
    from mtplab.analysis.trace_io import TraceError

    try:
        res = analyze_run(trace)
    except (TraceError, ValueError, OSError) as e:
        return {"trace": trace, "note": f"the analyser could not read it: {e}"}
    write_analysis(res, Path(trace).parent / "analysis")
    s = res.summary
    bubble = s["bubble_us"] or float("nan")
    top = sorted(s["bubble_by_cause_us"].items(), key=lambda kv: -kv[1])[:3]
    return {"trace": trace, "bubble_frac": s["bubble_frac"], "steps": s["n_steps"],
            **{k: s[k] for k in RUN_AHEAD_KEYS},
            "causes": {k: v / bubble for k, v in cause_split(s).items()},
            "top": [[k, v / bubble] for k, v in top]}


def arm_figures(reps: list[dict], new_tokens: int) -> dict:
    """One engine's figures over the repeats (module docstring), medians and spreads."""
    tok_s = [sum(r["tokens"]) / r["wall_s"] for r in reps]
    tpot = [(r["wall_s"] - r["ttft_s"]) / (new_tokens - 1) for r in reps]
    step = [(r["wall_s"] - r["ttft_s"]) / r["decode_steps"] for r in reps]
    acc = [r["accept_len"] for r in reps if r.get("accept_len") is not None]
    return {"tok_s": float(np.median(tok_s)), "tok_s_min": min(tok_s), "tok_s_max": max(tok_s),
            "tok_s_repeats": tok_s, "ttft_ms": 1e3 * float(np.median([r["ttft_s"] for r in reps])),
            "tpot_p50_ms": 1e3 * float(np.median(tpot)), "step_ms": 1e3 * float(np.median(step)),
            "decode_steps": int(np.median([r["decode_steps"] for r in reps])),
            "accept_len": float(np.mean(acc)) if acc else None}


def ratio_figures(reps: list[dict]) -> dict:
    """mtplab / SGLang tok/s of each repeat (both arms of one repeat ran back to back)."""
    r = [(sum(x["mtplab"]["tokens"]) / x["mtplab"]["wall_s"])
         / (sum(x["sglang"]["tokens"]) / x["sglang"]["wall_s"]) for x in reps]
    return {"median": float(np.median(r)), "min": min(r), "max": max(r), "repeats": r}


def check_tokens(cell: Cell, side: str, res: dict, new_tokens: int) -> None:
    """ignore_eos: every request ends with exactly new_tokens tokens."""
    if res["tokens"] != [new_tokens] * cell.bs:
        raise ArmError(side, f"produced {res['tokens']} tokens, not {new_tokens} for each of "
                             f"the {cell.bs} requests: the workloads would differ")


# ------------------------------------------------------------------ one cell
def measure_cell(cell: Cell, arms: dict, wl: Workload, vocab: int, left: Callable[[], float],
                 trace_root: Optional[Path]) -> dict:
    """Warm-up, the interleaved repeats and the profiled runs of one cell (module docstring);
    raises Deadline, ArmError."""
    def ask(side, msg):
        return arms[side].request(msg, max(0.0, left()))

    warm = prompts(cell, -1, wl, vocab)
    for side in SIDES:
        ask(side, {"op": "run", "prompts": warm, "new_tokens": wl.warmup_tokens})
        ask(side, {"op": "run", "prompts": warm, "new_tokens": 1})
    reps, order = [], []
    for r in range(wl.repeats):
        ps = prompts(cell, r, wl, vocab)
        sides = SIDES if r % 2 == 0 else SIDES[::-1]
        order.append(list(sides))
        rep = {"prompts_sha1": hashlib.sha1(json.dumps(ps).encode()).hexdigest()[:12]}
        for side in sides:
            first = ask(side, {"op": "run", "prompts": ps, "new_tokens": 1})
            res = ask(side, {"op": "run", "prompts": ps, "new_tokens": wl.new_tokens})
            check_tokens(cell, side, res, wl.new_tokens)
            rep[side] = {**res, "ttft_s": first["wall_s"]}
        reps.append(rep)
    rec = {"order": order, "repeats": reps, "ratio": ratio_figures(reps),
           **{side: arm_figures([x[side] for x in reps], wl.new_tokens) for side in SIDES}}
    rec["profile"] = {}
    if wl.profile_steps and trace_root is not None:
        ps = prompts(cell, 0, wl, vocab)
        for side in SIDES:
            d = trace_root / cell.cell_id.replace("|", "_").replace("@", "-") / side
            p = ask(side, {"op": "profile", "prompts": ps, "new_tokens": wl.new_tokens,
                           "warmup_tokens": wl.warmup_tokens, "dir": str(d.resolve()),
                           "steps": wl.profile_steps})
            rec["profile"][side] = {**trace_figures(p["trace"]), "meter": p["meter"]}
    return rec


# ------------------------------------------------------------------ the run
@dataclasses.dataclass
class Results:
    """DIR/results.json: the workload and every finished cell, rewritten atomically per cell."""
    path: Path
    workload: dict
    cells: dict

    @classmethod
    def open(cls, path: Path, wl: Workload) -> "Results":
        want = dataclasses.asdict(wl)
        if path.is_file():
            doc = json.loads(path.read_text())
            if doc["workload"] != want:
                raise ValueError(f"{path} holds cells of another workload ({doc['workload']}, "
                                 f"this run: {want}); pass another --out or the same workload.")
            return cls(path, want, doc["cells"])
        return cls(path, want, {})

    def put(self, cell_id: str, rec: dict) -> None:
        self.cells[cell_id] = rec
        atomic_write_text(self.path, json.dumps({"workload": self.workload,
                                                 "cells": self.cells}, indent=1))


def _cell_base(cell: Cell, g: Group, launch, knobs: dict) -> dict:
    """The settings part of a cell's record. The commit: MTP_GIT_COMMIT where set (a copy
    sent to a GPU machine), else the checkout's (mtplab.provenance.git_commit)."""
    from mtplab.provenance import git_commit
    return {"cell": cell.cell_id, "shape": cell.shape, "draft": cell.draft,
            "overlap": cell.overlap, "bs": cell.bs, "max_running_requests": g.max_bs,
            "mtplab_knobs": knobs, "sglang_argv": None if launch is None else list(launch.argv),
            "sglang_env": None if launch is None else launch.env,
            "git_commit": git_commit(),
            "date": datetime.now(timezone.utc).isoformat()}


def missing(results: Results, groups: list[Group], retry_failed: bool = False) -> list[str]:
    """Ids of the groups' cells not finished in `results` (with `retry_failed`, the failed
    ones too), in run order."""
    done = ("ok",) if retry_failed else DONE
    return [c.cell_id for g in groups for c in g.cells()
            if results.cells.get(c.cell_id, {}).get("status") not in done]


def run_groups(groups: list[Group], wl: Workload, results: Results, start_arm, vocab_of,
               deadline_s: float, group_reserve_s: float, trace_root: Optional[Path],
               models: Path, mem_fraction: float, say=print,
               clock: Callable[[], float] = time.monotonic, retry_failed: bool = False) -> None:
    """Run every cell not finished in `results`, group by group, until the deadline.
    `start_arm(side, group, launch, knobs) -> Arm` starts one engine's worker."""
    t_end = clock() + deadline_s
    left = lambda: t_end - clock()  # noqa: E731
    first_costs: list[float] = []      # per group so far: engine starts + its first cell
    for g in groups:
        todo = missing(results, [g], retry_failed)
        if not todo:
            continue
        todo = [c for c in g.cells() if c.cell_id in todo]
        need = max([group_reserve_s, *first_costs])
        if left() < need:
            say(f"deadline: {left():.0f} s left, a group needs {need:.0f} s; stopping")
            return
        knobs = mtplab_knobs(g, wl)
        try:
            launch = sglang_launch(g, wl, models, mem_fraction)
        except ValueError as e:            # ConfigError: a knob SGLang has no equivalent for
            for c in todo:
                results.put(c.cell_id, {**_cell_base(c, g, None, knobs), "status": "failed",
                                        "failed_side": "sglang", "message": str(e)})
            continue
        arms: dict = {}
        engines: dict = {}
        t_group = clock()
        try:
            for side in ("sglang", "mtplab"):   # SGLang first: it sizes its pool from free memory
                arms[side] = start_arm(side, g, launch, knobs)
                engines[side] = arms[side].request({"op": "start"}, max(0.0, left()))["info"]
            say(f"{g.name}: engines up in {clock() - t_group:.0f} s")
            durations: list[float] = []
            for c in todo:
                if durations and left() < 1.5 * max(durations):
                    raise Deadline(f"{left():.0f} s left, a cell takes ~{max(durations):.0f} s")
                t0 = clock()
                try:
                    rec = measure_cell(c, arms, wl, vocab_of(c), left, trace_root)
                    rec.update(status="ok", failed_side=None, message=None)
                except ArmError as e:
                    rec = {"status": "failed", "failed_side": e.side, "message": e.message}
                except (Deadline, KeyboardInterrupt):
                    raise
                except Exception as e:  # noqa: BLE001 -- a harness bug: this cell, not the run
                    rec = {"status": "failed", "failed_side": "harness",
                           "message": f"{type(e).__name__}: {e}"}
                durations.append(clock() - t0)
                rec.update(seconds=durations[-1], engines=engines)
                if len(durations) == 1:
                    first_costs.append(clock() - t_group)
                results.put(c.cell_id, {**_cell_base(c, g, launch, knobs), **rec})
                say(cell_line(results.cells[c.cell_id]))
                if rec["status"] != "ok":
                    break        # the engine that failed may be gone: the next group
        except ArmError as e:    # an engine did not start: its own message, for every cell
            for c in todo:
                results.put(c.cell_id, {**_cell_base(c, g, launch, knobs), "status": "failed",
                                        "failed_side": e.side, "message": e.message})
            say(f"{g.name}: {e.side} did not start: {e.message}")
        except Deadline as e:
            say(f"deadline: {e}; stopping (the cell that ran is left for the next run)")
            for a in arms.values():
                a.kill()
            return
        finally:
            for a in arms.values():
                a.close()


# ------------------------------------------------------------------ tables
def _f(x, spec=".1f") -> str:
    return "-" if x is None or (isinstance(x, float) and np.isnan(x)) else format(x, spec)


def _top(p: Optional[dict]) -> str:
    if not p or p.get("bubble_frac") is None:
        return "-"
    return ", ".join(f"{k} {v:.0%}" for k, v in p["top"]) or "none"


def cell_line(rec: dict) -> str:
    if rec["status"] != "ok":
        return f"{rec['cell']}: {rec['failed_side']} failed: {rec['message']}"
    m, s, r = rec["mtplab"], rec["sglang"], rec["ratio"]
    return (f"{rec['cell']}: tok/s mtplab {m['tok_s']:.0f} SGLang {s['tok_s']:.0f} ratio "
            f"{r['median']:.2f} [{r['min']:.2f}-{r['max']:.2f}]")


CELL_HEADER = ("| shape | draft | overlap | bs | tok/s mtplab | tok/s SGLang | mtplab / SGLang "
               "[min-max] | TPOT p50 ms m / S | step ms m / S | accept len m / S | bubble mtplab "
               "meter / trace | bubble SGLang trace | top causes mtplab | top causes SGLang | "
               "run-ahead m / S trace (lead p50 µs) |")


def cell_table(cells: list[dict]) -> str:
    rows = [CELL_HEADER, "|" + "---|" * 15]
    for c in cells:
        head = f"| {c['shape']} | {c['draft']} | {c['overlap']} | {c['bs']} |"
        if c["status"] != "ok":
            who = {"sglang": "SGLang", "mtplab": "mtplab"}.get(c["failed_side"], "the harness")
            rows.append(f"{head} {who} cannot run this cell: {c['message']} |" + " |" * 10)
            continue
        m, s, r, p = c["mtplab"], c["sglang"], c["ratio"], c.get("profile", {})
        pm, ps = p.get("mtplab", {}), p.get("sglang", {})
        meter = (pm.get("meter") or {}).get("bubble_frac")
        rows.append(
            f"{head} {_f(m['tok_s'], '.0f')} | {_f(s['tok_s'], '.0f')} | "
            f"{r['median']:.2f}x [{r['min']:.2f}-{r['max']:.2f}] | "
            f"{_f(m['tpot_p50_ms'], '.2f')} / {_f(s['tpot_p50_ms'], '.2f')} | "
            f"{_f(m['step_ms'], '.2f')} / {_f(s['step_ms'], '.2f')} | "
            f"{_f(m['accept_len'], '.2f')} / {_f(s['accept_len'], '.2f')} | "
            f"{_f(meter, '.1%')} / {_f(pm.get('bubble_frac'), '.1%')} | "
            f"{_f(ps.get('bubble_frac'), '.1%')} | {_top(pm)} | {_top(ps)} | "
            f"{_f(pm.get('run_ahead_frac'), '.0%')} ({_f(pm.get('launch_lead_p50_us'), '+.0f')})"
            f" / {_f(ps.get('run_ahead_frac'), '.0%')} ({_f(ps.get('launch_lead_p50_us'), '+.0f')})"
            " |")
    return "\n".join(rows)


def overlap_table(cells: list[dict]) -> str:
    """Overlap on / off tok/s per engine, where both arms ran: the same direction in both
    engines, unless one moves less than its noise (the larger relative min-max spread of the
    two arms' repeats)."""
    by = {(c["shape"], c["draft"], c["bs"], c["overlap"]): c for c in cells if c["status"] == "ok"}
    rows = ["| shape | draft | bs | on / off mtplab | on / off SGLang | same direction |",
            "|---|---|---|---|---|---|"]
    for (shape, draft, bs, ov), on in by.items():
        off = by.get((shape, draft, bs, "off"))
        if ov != "on" or off is None:
            continue
        moves = {}
        for side in SIDES:
            a, b = on[side], off[side]
            ratio = a["tok_s"] / b["tok_s"]
            noise = max((x["tok_s_max"] - x["tok_s_min"]) / x["tok_s"] for x in (a, b))
            moves[side] = (ratio, 0 if abs(ratio - 1) <= noise else (1 if ratio > 1 else -1))
        (rm, dm), (rs, ds) = moves["mtplab"], moves["sglang"]
        same = agreement(dm, ds)
        rows.append(f"| {shape} | {draft} | {bs} | {rm:.2f}x | {rs:.2f}x | {same} |")
    return "\n".join(rows)


def agreement(dm: int, ds: int) -> str:
    """Whether two directions (+1 faster, -1 slower, 0 within noise) agree."""
    if dm == ds == 0:
        return "both within noise"
    if 0 in (dm, ds):
        return f"{'mtplab' if dm == 0 else 'SGLang'} within noise"
    return "yes" if dm == ds else "no"


def tables(results: Results, groups: list[Group]) -> str:
    order = [c.cell_id for g in groups for c in g.cells()]
    cells = [results.cells[i] for i in order if i in results.cells]
    wl = results.workload
    head = (f"{len(cells)} of {len(order)} cells; each: bs prompts of {wl['prompt_len']} random "
            f"token ids, {wl['new_tokens']} new tokens (ignore_eos), simulated acceptance "
            f"{wl['accept_len']} (spec arms), {wl['repeats']} interleaved repeats, medians")
    return "\n\n".join([head, cell_table(cells), overlap_table(cells)])


# ------------------------------------------------------------------ command line
def worker_env(side: str, launch) -> dict:
    """The worker's environment: SGLang's own variables exactly as the adapter sets them (the
    SGLANG_SIMULATE_* of a group without a draft removed)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_SIMULATE_")}
    if side == "sglang":
        env.update(launch.env)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_peer_sglang",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="results.json, table.md, logs/, traces/, models/")
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES))
    ap.add_argument("--bs", nargs="+", type=int, default=list(BATCH_SIZES))
    ap.add_argument("--drafts", nargs="+", default=list(DRAFTS), choices=list(DRAFTS))
    ap.add_argument("--overlap", nargs="+", default=list(OVERLAP), choices=list(OVERLAP))
    ap.add_argument("--pairs", nargs="+", metavar="SHAPE:DRAFT",
                    help="these (shape, draft) pairs in this order instead of --shapes x "
                         "--drafts, each with every --overlap and --bs")
    ap.add_argument("--repeats", type=int, default=Workload.repeats)
    ap.add_argument("--prompt-len", type=int, default=Workload.prompt_len)
    ap.add_argument("--new-tokens", type=int, default=Workload.new_tokens)
    ap.add_argument("--accept-len", type=float, default=Workload.accept_len)
    ap.add_argument("--warmup-tokens", type=int, default=Workload.warmup_tokens)
    ap.add_argument("--profile-steps", type=int, default=Workload.profile_steps,
                    help="steps of each profiled trace; 0: no traces")
    ap.add_argument("--deadline-s", type=float, default=float("inf"),
                    help="stop starting work this long after the start; write what finished")
    ap.add_argument("--group-reserve-s", type=float, default=90.0,
                    help="start a group only with this much time left (its engines' start)")
    ap.add_argument("--mem-fraction", type=float, default=0.3,
                    help="SGLang's --mem-fraction-static (mtplab's engines share the GPU)")
    ap.add_argument("--retry-failed", action="store_true",
                    help="run again the cells results.json holds as failed")
    ap.add_argument("--table-only", action="store_true",
                    help="write the tables of the grid from results.json; run nothing")
    ap.add_argument("--reanalyze", action="store_true",
                    help="with --table-only: read each finished cell's traces again from "
                         "OUT/traces/ (a device run's peer_traces.tgz unpacked there) with this "
                         "checkout's analyser, and save the figures into results.json")
    ap.add_argument("--out-dir", default=None, metavar="DIR",
                    help="also write the dated report of question `peers` from the finished "
                         "cells into DIR/peers/ (docs/results: the repository's); with cells to "
                         "run, a tree with uncommitted changes is refused before anything runs")
    ap.add_argument("--note", default="", help="a sentence the report carries above its answer")
    ap.add_argument("--dry-run", action="store_true",
                    help="write the model directories, print each group's two configurations")
    return ap


def check_args(a) -> Optional[str]:
    """One sentence for bad input, else None."""
    for name in ("repeats", "prompt_len", "warmup_tokens"):
        if getattr(a, name) < 1:
            return f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}."
    if a.new_tokens < 2:
        return (f"--new-tokens must be >= 2 (TPOT needs a token after the first), "
                f"got {a.new_tokens}.")
    if a.profile_steps < 0:
        return f"--profile-steps must be >= 0, got {a.profile_steps}."
    if not 0 < a.mem_fraction < 1:
        return f"--mem-fraction must lie in (0, 1), got {a.mem_fraction}."
    if a.deadline_s <= 0:
        return f"--deadline-s must be > 0, got {a.deadline_s}."
    bad = [p for p in a.pairs or () if not all(p.rpartition(":")[::2])]
    if bad:
        return f"--pairs takes SHAPE:DRAFT (e.g. llama3-8b-like@8:eagle), got {bad[0]!r}."
    if a.reanalyze and not a.table_only:
        return "--reanalyze reads returned traces: give it with --table-only."
    return None


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    a = build_parser().parse_args(argv)
    err = check_args(a)
    if err is None and a.out_dir is not None and not (a.table_only or a.dry_run):
        from mtplab.provenance import git_commit
        try:                                # a report names one commit: refused before a run
            R.report_commit(git_commit())
        except ConfigError as e:
            err = str(e)
    pairs = None if a.pairs is None else [p.rpartition(":")[::2] for p in a.pairs]
    try:
        groups = [] if err else plan_mod.plan(a.shapes, a.drafts, a.overlap, a.bs, pairs)
    except ValueError as e:
        err = str(e)
    if err:
        print(f"bench_peer_sglang: error: {err}", file=sys.stderr)
        return 2
    wl = Workload(prompt_len=a.prompt_len, new_tokens=a.new_tokens, accept_len=a.accept_len,
                  repeats=a.repeats, warmup_tokens=a.warmup_tokens, profile_steps=a.profile_steps)
    out = Path(a.out)
    models = out / "models"
    try:
        results = Results.open(out / "results.json", wl)
        plan_mod.write_model_dirs(models, groups)
    except ValueError as e:
        print(f"bench_peer_sglang: error: {e}", file=sys.stderr)
        return 2
    skipped = plan_mod.left_out(a.shapes, a.drafts, pairs)
    if a.dry_run:
        for s, d, why in skipped:
            print(f"# left out: {s}|{d}: {why}")
        for g in groups:
            print(f"# {g.name} (bs {list(g.bs)})\nmtplab: {json.dumps(mtplab_knobs(g, wl))}")
            try:
                launch = sglang_launch(g, wl, models, a.mem_fraction)
            except ValueError as e:
                print(f"sglang: refused: {e}")
                continue
            env = " ".join(f"{k}={v}" for k, v in sorted(launch.env.items()))
            print(f"sglang: {env + ' ' if env else ''}sglang.Engine(server_args="
                  f"prepare_server_args({list(launch.argv)!r}))")
        return 0
    if a.table_only:
        if a.reanalyze:
            print(f"re-read {reanalyze(results, out / 'traces')} traces under {out / 'traces'}")
        return write_tables(results, groups, out, skipped) or write_report(results, groups, a,
                                                                             argv)
    vocabs = {}

    def vocab_of(c: Cell) -> int:         # one target directory per shape
        if c.shape not in vocabs:
            vocabs[c.shape] = plan_mod.vocab_size(models, c.shape, c.draft)
        return vocabs[c.shape]

    def start_arm(side, g, launch, knobs):
        config = {"knobs": knobs} if side == "mtplab" else {"argv": list(launch.argv)}
        return WorkerArm(side, config, worker_env(side, launch),
                         out / "logs" / f"{g.name}.{side}.log")

    def stop(signum, frame):        # the caller's timeout: stop like at the deadline
        raise Deadline(f"stopped by signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    try:
        run_groups(groups, wl, results, start_arm, vocab_of, a.deadline_s, a.group_reserve_s,
                   out / "traces", models, a.mem_fraction, retry_failed=a.retry_failed)
    except Deadline as e:           # between groups: nothing was running
        print(f"deadline: {e}")
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return write_tables(results, groups, out, skipped) or write_report(results, groups, a, argv)


def reanalyze(results: Results, traces: Path) -> int:
    """Each finished cell's trace figures read again, by this checkout's analyser, from the
    same trace under `traces` (a cell's trace path past its `/traces/`); the meter's figures
    and the recorded trace path stay. Saves results.json; returns the traces read."""
    n = 0
    for cell_id, rec in results.cells.items():
        for fig in (rec.get("profile") or {}).values():
            path = (fig or {}).get("trace") or ""
            local = traces / path.split("/traces/", 1)[1] if "/traces/" in path else None
            if local is None or not local.is_file():
                continue
            new = trace_figures(str(local))
            fig.update({k: v for k, v in new.items() if k != "trace"})
            n += 1
        results.put(cell_id, rec)
    return n


def write_report(results: Results, groups: list[Group], a, argv: list) -> int:
    """With --out-dir: the dated report of question `peers` (mtplab/studies/peers) from the
    grid's finished cells, DIR/peers/<date>_<device>_<commit>.{md,json}."""
    if a.out_dir is None:
        return 0
    order = [c.cell_id for g in groups for c in g.cells()]
    try:
        doc = study.results_doc([results.cells[i] for i in order if i in results.cells],
                                workload=results.workload, note=a.note,
                                command=shlex.join(["python", "-m",
                                                    "benchmarks.bench_peer_sglang", *argv]))
    except ConfigError as e:
        print(f"bench_peer_sglang: no report: {e}", file=sys.stderr)
        return 2
    path = R.write(doc, study.render, Path(a.out_dir))
    print(f"wrote {path} and its results {path.with_suffix('.json').name}")
    return 0


def write_tables(results: Results, groups: list[Group], out: Path,
                 skipped: list[tuple[str, str, str]] = ()) -> int:
    """OUT/table.md (and stdout): the grid's tables, the cells not run yet and the pairs left
    out of the grid (peer_plan.left_out: shape, draft, reason)."""
    text = tables(results, groups)
    undone = missing(results, groups)
    if undone:
        text += f"\n\nnot run yet ({len(undone)}): " + ", ".join(undone)
    if skipped:
        text += (f"\n\nleft out ({len(skipped)}, not like for like in SGLang 0.5.17): "
                 + "; ".join(f"{s}|{d}: {why}" for s, d, why in skipped))
    atomic_write_text(out / "table.md", text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
