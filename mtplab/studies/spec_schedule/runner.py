"""`mtplab bench --groups schedule`: the break-even surface of speculation over batch size, the
best batch-aware schedule for a model and GPU, and its gain over the best static setting.

Per model of the group file (mtplab/studies/spec_schedule/schedule.yaml), in one process (an
engine per setting serves every batch size, so the sweep's process per cell is not needed):

    1. surface    for each setting s of `arms` (off, (num_steps, topk) ...): one engine with
                  spec_schedule {max_running_requests: s} (s at every batch size), then for
                  each batch size: a warm-up generate, `repeats` timed generates
                  -> decode tok/s [bs x s]; the same engine then runs the varying workload
                  `repeats` times -> the static setting's workload tok/s
    2. schedule   per batch size of the grid the setting of highest median tok/s, unless it
                  beats the best static setting (of 1's workload) there by no more than
                  `min_gain` (then the static one: a switch costs a step without its
                  pre-drafted candidates, and a small surface margin does not pay for it);
                  the bucket of grid point b holds the batch sizes above the previous point
                  up to b; equal neighbours merge -> <dir>/<model>.schedule.yaml (the knob
                  loads it)
    3. gain       the schedule's engine and the best static setting's (highest median
                  workload tok/s in 1) side by side: the workload alternately on each,
                  `repeats` rounds -> per round schedule / static (the report: their median,
                  its noise the larger spread of the two engines' rounds, max / min - 1)
The workload: `waves` of requests with output lengths drawn uniformly from `output_len`, the
next wave submitted once at most `refill_at` requests are live, so the running batch falls
and rises through the buckets; tok/s = output tokens / wall from the first submit to idle.
Acceptance is simulated: every draft position accepted with probability `accept_rate`
(simulate_accept_rates), so a setting of S steps accepts 1 + r + ... + r^S tokens per verify.
Results go to <dir>/results.json after every finished unit (a setting of a model, a gain),
each model's device and the commits its units ran at beside them, and the group as it ran
(models, settings, batch sizes, repeats ...) to <dir>/grid.yaml; the same --dir resumes, and no
unit starts that the deadline (--budget-s) would cut (its estimate: the longest unit so far).
The printed report is the study's per-model sections (mtplab/studies/spec_schedule,
`model_section`); `mtplab report spec_schedule --from <dir>` writes the dated report.
"""
from __future__ import annotations

import json
import random
import statistics
import time
from pathlib import Path
from typing import Optional

import yaml

from ... import spec_schedule as ss
from ...atomic import atomic_path, atomic_write_text
from . import GRID, RESULTS, model_section, models_of

SMOKE = dict(batch_sizes=[1, 2], arms=["off", [1, 1]], repeats=1,
             surface={"prompt_len": 8, "output_len": 6, "warmup": 2},
             workload={"waves": [2, 1], "refill_at": 1, "prompt_len": 8, "output_len": [2, 6]})


def _label(m: dict) -> str:
    return m["model"] + (f"@{m['layers']}" if m.get("layers") else "")


def _setting(a) -> ss.Setting:
    return ss.OFF if a in (ss.OFF, False) else tuple(a)


def _name(s: ss.Setting) -> str:
    return ss.OFF if s == ss.OFF else f"{s[0]}x{s[1]}"


class _Group:
    def __init__(self, doc: dict, out: Path, *, device: str, smoke: bool, quick: bool,
                 repeats: Optional[int], bs: Optional[list], deadline: Optional[float]):
        d = dict(doc)
        if quick:
            d.update(doc.get("quick") or {})
        if smoke:
            d.update(SMOKE)
            d["models"] = [dict(model="random-tiny", draft=m.get("draft", "frozen_kv_mtp"))
                           for m in doc["models"][:1]]
        self.models = d["models"]
        self.arms = [_setting(a) for a in d["arms"]]
        self.bs = list(bs or d["batch_sizes"])
        self.repeats = repeats or (1 if smoke else d.get("repeats", 3))
        self.rate = float(d.get("accept_rate", 0.8))
        self.min_gain = float(d.get("min_gain", 0.0))
        self.maxrun = max(self.bs)          # the engines' max_running_requests
        self.base = dict(d.get("base") or {})
        if device != "auto":
            self.base["device"] = device
        self.surface, self.workload = d["surface"], d["workload"]
        self.out, self.deadline = out, deadline
        self.path = out / RESULTS
        self.res = json.loads(self.path.read_text()) if self.path.is_file() else {}
        self.longest = 0.0
        self.left: list[str] = []

    # -- bookkeeping ----------------------------------------------------------------------
    def _save(self) -> None:
        atomic_write_text(self.path, json.dumps(self.res, indent=1))

    def grid(self) -> dict:
        """The group as it runs (the report's `group`): model labels, settings, batch sizes,
        repeats, acceptance, min_gain, max_running_requests, the surface and workload."""
        return {"models": [_label(m) for m in self.models],
                "arms": [_name(s) for s in self.arms], "batch_sizes": self.bs,
                "repeats": self.repeats, "accept_rate": self.rate, "min_gain": self.min_gain,
                "max_running_requests": self.maxrun, "surface": dict(self.surface),
                "workload": dict(self.workload)}

    @staticmethod
    def _stamp(r: dict, eng) -> None:
        """The device and the commit a unit of model `r` ran on (a report names one)."""
        from ...provenance import git_commit
        r.setdefault("device", eng.device.name)
        commit = git_commit() or ""
        if commit not in r.setdefault("commits", []):
            r["commits"].append(commit)

    def _may_start(self, unit: str) -> bool:
        if self.deadline is not None and time.monotonic() + self.longest > self.deadline:
            self.left.append(unit)
            return False
        return True

    def _timed(self, fn) -> None:
        t = time.monotonic()
        fn()
        self.longest = max(self.longest, time.monotonic() - t)

    # -- engines and workloads ------------------------------------------------------------
    def _engine(self, m: dict, sched: dict):
        from ...engine import Engine
        from ...config import RunConfig
        S = max([s[0] for s in self.arms if s != ss.OFF] or [1])
        K = max([s[1] for s in self.arms if s != ss.OFF] or [1])
        kw = dict(self.base, **m)
        need = self.surface["prompt_len"] + max(self.surface["output_len"],
                                                max(self.workload["output_len"])) + 16
        kw["context_len"] = kw.get("context_len") or max(need, 64)
        cfg = RunConfig(**kw, num_steps=S, topk=K, max_running_requests=self.maxrun,
                        simulate_accept_rates=(self.rate,) * S, spec_schedule=sched)
        return Engine(cfg)

    @staticmethod
    def _prompts(eng, n: int, length: int, seed: int) -> list[list[int]]:
        rng = random.Random(seed)
        V = eng.model.config.vocab_size
        return [[rng.randrange(3, V) for _ in range(length)] for _ in range(n)]

    def _surface_point(self, eng, bs: int) -> list[float]:
        s = self.surface
        prompts = self._prompts(eng, bs, s["prompt_len"], bs)
        eng.generate(prompts, s["warmup"], ignore_eos=True)
        out = []
        for _ in range(self.repeats):
            eng.generate(prompts, s["output_len"], ignore_eos=True)
            out.append(eng.stats()["decode_tok_per_s"])
        return out

    def _workload(self, eng, seed: int = 0) -> float:
        """One run of the varying workload (module doc) -> output tok/s."""
        w = self.workload
        rng = random.Random(seed)
        lo, hi = w["output_len"]
        waves = [[(p, rng.randint(lo, hi)) for p in self._prompts(eng, n, w["prompt_len"],
                                                                   1000 + i)]
                 for i, n in enumerate(w["waves"])]
        eng.device.synchronize()
        t0 = time.perf_counter()
        reqs: list = []
        while waves or not eng.idle:
            if waves and sum(not r.finished for r in reqs) <= w["refill_at"]:
                reqs += [eng.add_request(p, n, ignore_eos=True) for p, n in waves.pop(0)]
            eng.step()
        eng.device.synchronize()
        return sum(len(r.output_ids) for r in reqs) / (time.perf_counter() - t0)

    # -- the three phases -------------------------------------------------------------------
    def run_model(self, m: dict) -> None:
        label = _label(m)
        r = self.res.setdefault(label, {"surface": {}, "workload": {}})
        for s in self.arms:
            n = _name(s)
            if n in r["workload"] or not self._may_start(f"{label} {n}"):
                continue

            def unit(s=s, n=n):
                eng = self._engine(m, {self.maxrun: s})
                try:
                    r["surface"][n] = {str(b): self._surface_point(eng, b) for b in self.bs}
                    self._workload(eng)                     # warm-up
                    r["workload"][n] = [self._workload(eng) for _ in range(self.repeats)]
                    self._stamp(r, eng)
                finally:
                    eng.close()
                self._save()
            self._timed(unit)
        if len(r["workload"]) < len(self.arms):
            return
        sched = self.best_schedule(r)
        r["schedule"] = ss.text(sched)
        self._write_schedule(label, sched, r)
        if "gain" in r or not self._may_start(f"{label} gain"):
            return
        self._timed(lambda: self._gain(m, r, sched))

    def best_schedule(self, r: dict) -> dict:
        """Per grid batch size the setting of highest median tok/s, or the best static
        setting where that one is within min_gain of it (module doc); neighbours merged; the
        last bucket is max_running_requests."""
        def med(s, b):
            return statistics.median(r["surface"][_name(s)][str(b)])
        wl = r.get("workload") or {}
        static = next((a for a in self.arms if wl and _name(a) == max(
            wl, key=lambda n: statistics.median(wl[n]))), None)
        best = {}
        for b in self.bs:
            top = max(self.arms, key=lambda s: med(s, b))
            keep = static is not None and med(top, b) <= med(static, b) * (1 + self.min_gain)
            best[b] = static if keep else top
        out: dict = {}
        for b in sorted(best):
            if out and out[max(out)] == best[b]:
                del out[max(out)]
            out[b] = best[b]
        last = max(out)
        out[self.maxrun] = out.pop(last)
        return out

    def _write_schedule(self, label: str, sched: dict, r: dict) -> None:
        from ...provenance import git_commit
        meta = {"model": label, "device": r.get("device", "?"), "commit": git_commit(),
                "date": time.strftime("%Y-%m-%d"), "measured by": "mtplab bench --groups "
                f"schedule (simulated per-position acceptance {self.rate}, "
                f"max_running_requests {self.maxrun})"}
        path = self.out / f"{label.replace('@', '_at_')}.schedule.yaml"
        atomic_write_text(path, ss.to_yaml(sched, meta))
        r["schedule_file"] = str(path)

    def _gain(self, m: dict, r: dict, sched: dict) -> None:
        """The schedule's engine and the best static setting's on the workload, alternating
        rounds; on a device that holds one engine of the model, one engine after the other
        (`order` says which). Every engine built is closed however the unit ends."""
        from ...models.memory import InsufficientMemoryError
        static = max(r["workload"], key=lambda n: statistics.median(r["workload"][n]))
        s = next(a for a in self.arms if _name(a) == static)
        settings = {"static": {self.maxrun: s}, "schedule": sched}
        runs: dict = {k: [] for k in settings}
        engs: dict = {}
        try:
            try:
                for k, sc in settings.items():
                    engs[k] = self._engine(m, sc)
                order = "alternating"
            except InsufficientMemoryError:
                if not engs:
                    raise
                order = "one after the other"
            if order == "alternating":
                for e in engs.values():
                    self._workload(e)                       # warm-up
                for _ in range(self.repeats):
                    for k, e in engs.items():
                        runs[k].append(self._workload(e, seed=0))
                self._stamp(r, engs["schedule"])
            else:
                for k, sc in settings.items():
                    if k not in engs:
                        engs[k] = self._engine(m, sc)
                    e = engs[k]
                    self._workload(e)                       # warm-up
                    runs[k] = [self._workload(e, seed=0) for _ in range(self.repeats)]
                    self._stamp(r, e)
                    engs.pop(k).close()
        finally:
            for e in engs.values():
                e.close()
        r["gain"] = {"static_setting": static, "schedule_text": ss.text(sched), **runs,
                     "ratios": [a / b for a, b in zip(runs["schedule"], runs["static"])],
                     "order": order}
        self._save()

    # -- the report -----------------------------------------------------------------------
    def report(self) -> str:
        """The run's markdown: per model the study's section (spec_schedule.model_section),
        the schedule file, and the units the budget left."""
        from ...provenance import git_commit
        doc = {"group": self.grid(), "models": models_of(self.grid(), self.res)}
        parts = [f"commit {git_commit()}; simulated per-position acceptance {self.rate}; "
                 f"min_gain {self.min_gain:.0%}; {self.repeats} repeat(s); decode tok/s "
                 "medians (vs off: / the off arm, ± the noise, the verdict)"]
        for m in doc["models"]:
            parts.append("\n".join(model_section(doc, m, level=4)))    # under bench's ###
            f = self.res.get(m["model"], {}).get("schedule_file")
            if f:
                parts.append(f"schedule file: {f}")
        if self.left:
            parts.append(f"budget: not started: {', '.join(self.left)}; the same --dir "
                         "resumes them")
        return "\n\n".join(parts)

    def plot(self) -> None:
        """surface.png: tok/s vs off over batch size, one line per setting, per model."""
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        done = [m for m in self.models if self.res.get(_label(m), {}).get("surface")]
        if not done:
            return
        fig, axes = plt.subplots(1, len(done), figsize=(5 * len(done), 3.6), squeeze=False)
        for ax, m in zip(axes[0], done):
            r = self.res[_label(m)]
            off = r["surface"].get(ss.OFF)
            for n, pts in r["surface"].items():
                ys = [statistics.median(pts[str(b)]) /
                      (statistics.median(off[str(b)]) if off else 1.0) for b in self.bs]
                ax.plot(self.bs, ys, marker="o", label=n)
            ax.axhline(1.0, color="grey", lw=0.8)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("batch size")
            ax.set_ylabel("decode tok/s / off" if off else "decode tok/s")
            ax.set_title(_label(m))
            ax.legend(fontsize=7)
        fig.tight_layout()
        with atomic_path(self.out / "surface.png") as tmp:
            fig.savefig(tmp, format="png", dpi=110)
        plt.close(fig)


def run_group(doc: dict, out: Path, *, device: str = "auto", smoke: bool = False,
              quick: bool = False, repeats: Optional[int] = None, bs: Optional[list] = None,
              deadline: Optional[float] = None) -> str:
    """Run (or resume) the schedule group into `out` (`quick`: the file's `quick` keys);
    -> its markdown report."""
    out.mkdir(parents=True, exist_ok=True)
    g = _Group(doc, out, device=device, smoke=smoke, quick=quick, repeats=repeats, bs=bs,
               deadline=deadline)
    atomic_write_text(out / GRID, yaml.safe_dump(g.grid(), sort_keys=False))
    for m in g.models:
        g.run_model(m)
    g.plot()
    return g.report()
