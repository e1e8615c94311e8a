"""The health figures on a GPU (README "Health figures"): one host-bound shape (tiny-code,
bs 1) and one GPU-bound shape (llama3-8b-like@16, bs 8), each with overlap + zero_bubble,
overlap off, and overlap + zero_bubble with a host delay planted after every step longer than
the GPU step; then an MoE target (gemma4-26b-a4b-like@4, bs 8) under uniform and zipf routing
for the experts touched. Writes the dated report of question `health` (the study's
__init__.py: the results file and the Markdown rendered from it) into the results folder
--out-dir; its entry point is benchmarks/bench_health.py:

    DIR/health/<YYYY-MM-DD>_<device>_<commit>.{json,md}     (DIR default docs/results)

    python -m benchmarks.bench_health                 # H200: about 4 minutes
    python -m benchmarks.bench_health --smoke --out-dir /tmp/h   # CPU: the path, in seconds

The commit is MTP_GIT_COMMIT where set (a device's copy of a checkout), else this checkout's
HEAD; a tree with uncommitted changes is refused before anything runs (a report names one
commit). `mtplab report health` renders the report again from its results file.

Each arm is one engine (bubble meter on, Frozen-KV MTP, simulated accept length 3.0): a
warm-up generate, then `--repeats` measured generates (the figures: their median; the noise:
their range), then, for the overlap arms, a profiled generate whose Kineto trace `mtplab
analyze` reads (its run-ahead beside the meter's), and the meter read over the same profiled
steps (what the profiler itself does to the run). What the report checks
(mtplab/studies/health `checks`):
    overlap + zb at the GPU-bound shape      run-ahead >= 0.9 (close to 1)
    a host delay longer than the GPU step    run-ahead <= 0.1 (close to 0)
    overlap off                              run-ahead == 0 (the host waits for each step)
"""
from __future__ import annotations

import argparse
import functools
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from mtplab.studies import health
from mtplab.studies import reports as R


@dataclass(frozen=True)
class Shape:
    name: str
    model: str
    layers: Optional[int]
    bs: int
    regime: str                        # host-bound | GPU-bound | MoE


@dataclass
class Arm:
    shape: Shape
    name: str
    knobs: dict
    delay_us: float = 0.0
    repeats: list = field(default_factory=list)      # stats() of each measured generate
    trace: dict = field(default_factory=dict)        # the profiled steps: analysis summary + meter

    def median(self, key: str) -> float:
        xs = [r.get(key) for r in self.repeats]
        xs = [float(x) for x in xs if x is not None and x == x]
        return statistics.median(xs) if xs else float("nan")

    def record(self) -> dict:
        """The arm in the results file (mtplab/studies/health `arm_record`)."""
        s = self.shape
        return health.arm_record(shape=s.name, model=s.model, layers=s.layers, bs=s.bs,
                                 regime=s.regime, arm=self.name, delay_us=self.delay_us,
                                 repeats=self.repeats, trace=self.trace)


SHAPES = (Shape("tiny-code", "tiny-code", None, 1, "host-bound"),
          Shape("llama3-8b-like@16", "llama3-8b-like", 16, 8, "GPU-bound"))
MOE = Shape("gemma4-26b-a4b-like@4", "gemma4-26b-a4b-like", 4, 8, "MoE")
SMOKE = Shape("random-tiny", "random-tiny", None, 2, "CPU smoke")


def run_arm(arm: Arm, device: str, prompt_len: int, out_len: int, repeats: int,
            profile: bool, trace_dir: Path) -> Arm:
    """Build the arm's engine, warm it up, measure `repeats` generates, profile one more."""
    from mtplab import Engine, RunConfig
    from mtplab.analysis.bubbles import analyze_run
    from mtplab.sweep.measure import prompts, spin

    s = arm.shape
    cfg = RunConfig(model=s.model, layers=s.layers, draft="frozen_kv_mtp", device=device,
                    simulate_accept_len=3.0, page_size=16, max_running_requests=s.bs,
                    context_len=prompt_len + 4 * out_len, bubble_meter=True,
                    profile=profile, profile_wait=1, profile_warmup=1, profile_active=8,
                    trace_dir=str(trace_dir), run_name=f"{s.name}-{arm.name}".replace(" ", "_"),
                    **arm.knobs)
    with Engine(cfg) as eng:
        if arm.delay_us:
            eng.on_step(functools.partial(spin, arm.delay_us))
        V = eng.model.config.vocab_size
        ps = prompts(s.bs, prompt_len, V, 0)

        def gen(n):
            eng.generate(ps, max_new_tokens=n, ignore_eos=True)
            return eng.stats()

        held = eng.profiler.held() if eng.profiler is not None else _null()
        with held:
            gen(16)                                                   # warm-up
            arm.repeats = [gen(out_len) for _ in range(repeats)]
        eng.check_invariants()
        if eng.profiler is not None:
            window = profiled_window(eng, cfg.profile_warmup)
            while not eng.profiler.done:
                gen(out_len)
            frame = eng.meter_frame()
            files = eng.finish()
            if "trace0" in files:
                sm = analyze_run(files["trace0"]).summary
                arm.trace = {**sm, **health.traced_meter_figures(
                    frame, window[0] + sm["skip_steps"], window[-1])}
                if sm["n_steps"]:
                    arm.trace["wall_us_per_step"] = sm["wall_us"] / sm["n_steps"]
    return arm


def profiled_window(eng, warmup: int) -> list:
    """The meter steps of the profiler's active window (filled while the engine runs): a
    profiler hook notes the meter's next step when the window opens and its open step when
    the window's last step ends, so the meter can be read over the steps the trace holds."""
    p, m, window = eng.profiler, eng.meter, []
    opens, closes = p.wait + warmup - 1, p.last_step - 1     # wait >= 1: see `held`

    def mark(i: int) -> None:
        if i == opens:
            window.append(m.step + 1)
        elif i == closes:
            window.append(m.step)
    p.hooks.append(mark)
    return window


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def gpu_step_us(arm: Arm) -> float:
    """The arm's device time per decode step (the meter's wall per step less its bubble)."""
    return arm.median("meter_wall_us_per_step") - arm.median("bubble_us_per_step")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_health",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true",
                    help="CPU, random-tiny, short runs: the script's path, not its figures")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out-len", type=int, default=64, help="new tokens per request")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--out-dir", default=str(R.RESULTS),
                    help="the results folder: the report goes into DIR/health/ "
                         "(default %(default)s)")
    ap.add_argument("--no-moe", action="store_true", help="leave out the MoE arms")
    a = ap.parse_args(argv)
    import torch

    device = "cpu" if a.smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("bench_health: no GPU here; run it on the GPU host, or --smoke for the path.",
              file=sys.stderr)
        return 2
    commit = R.checkout_commit("bench_health")          # refused before anything runs
    if commit is None:
        return 2
    shapes = (SMOKE,) if a.smoke else SHAPES
    prompt_len, out_len, repeats = ((8, 8, 2) if a.smoke else
                                    (a.prompt_len, a.out_len, a.repeats))
    zb = dict(overlap=True, zero_bubble=True)
    arms = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench_health_") as traces:
        trace_dir = Path(traces)           # the profiled generates' traces: read, not kept
        for s in shapes:
            base = run_arm(Arm(s, health.ZB, zb), device, prompt_len, out_len, repeats,
                           not a.smoke, trace_dir)
            arms.append(base)
            arms.append(run_arm(Arm(s, health.OFF, dict(overlap=False)), device, prompt_len,
                                out_len, repeats, False, trace_dir))
            step = gpu_step_us(base)       # on CPU the meter's clock is the host's: no GPU step
            delay = max(2000.0, 2.0 * step) if device == "cuda" and step == step else 2000.0
            arms.append(run_arm(Arm(s, f"{health.ZB} + host delay", zb, delay), device,
                                prompt_len, out_len, repeats, not a.smoke, trace_dir))
            print(f"{s.name}: done at {time.perf_counter() - t0:.0f} s", flush=True)
        if not a.smoke and not a.no_moe:
            for routing in ("uniform", "zipf:1.2"):
                arms.append(run_arm(Arm(MOE, f"{health.ZB}, {routing}",
                                        dict(zb, moe_stats=True, moe_routing=routing)),
                                    device, prompt_len, out_len, repeats, False, trace_dir))
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    software = f"torch {torch.__version__}"
    if device == "cuda":
        import triton
        software += f"; triton {triton.__version__}"
    doc = health.results_doc(
        [arm.record() for arm in arms], date=time.strftime("%Y-%m-%d"),
        device=R.device_slug(name), device_name=name if device == "cuda" else "",
        commit=commit,
        command=shlex.join(["python", "-m", "benchmarks.bench_health", *argv]),
        prompt_len=prompt_len, out_len=out_len, repeats=repeats, software=software)
    path = R.write(doc, health.render, Path(a.out_dir))
    print(f"wrote {path} and its results {path.with_suffix('.json').name} "
          f"({time.perf_counter() - t0:.0f} s)")
    return 0

