"""The health figures on a GPU (README "Health figures"): one host-bound shape (tiny-code,
bs 1) and one GPU-bound shape (llama3-8b-like@16, bs 8), each with overlap + zero_bubble,
overlap off, and overlap + zero_bubble with a host delay planted after every step longer than
the GPU step; then an MoE target (gemma4-26b-a4b-like@4, bs 8) under uniform and zipf routing
for the experts touched. Writes a dated Markdown report (date, device, commit, command,
values, noise) into docs/results/health/<YYYY-MM-DD>_<device>_<commit>.md.

    python -m benchmarks.bench_health                 # H200: about 4 minutes
    python -m benchmarks.bench_health --smoke --out-dir /tmp/h   # CPU: the path, in seconds

Each arm is one engine (bubble meter on, Frozen-KV MTP, simulated accept length 3.0): a
warm-up generate, then `--repeats` measured generates (the figures: their median; the noise:
their range), then, for the overlap arms, a profiled generate whose Kineto trace `mtplab
analyze` reads (its run-ahead beside the meter's). What the report checks:
    overlap + zb at the GPU-bound shape      run-ahead >= 0.9 (close to 1)
    a host delay longer than the GPU step    run-ahead <= 0.1 (close to 0)
    overlap off                              run-ahead == 0 (the host waits for each step)
"""
from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[1]
REPORT_DIR = REPO / "docs" / "results" / "health"
FIGURES = ("decode_tok_per_s", "meter_tok_per_s", "run_ahead_frac", "launch_lead_p10_us",
           "launch_lead_p50_us", "launch_lead_p90_us", "bubble_frac", "draft_busy_frac",
           "draft_waste_frac", "accept_len", "accept_alarm", "experts_per_verify",
           "experts_per_verify_uniform")


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
    trace: dict = field(default_factory=dict)        # the profiled generate's analysis summary

    def median(self, key: str) -> float:
        xs = [r.get(key) for r in self.repeats]
        xs = [float(x) for x in xs if x is not None and x == x]
        return statistics.median(xs) if xs else float("nan")

    def spread(self, key: str) -> float:
        xs = [float(r[key]) for r in self.repeats if r.get(key) is not None and r[key] == r[key]]
        return max(xs) - min(xs) if len(xs) > 1 else float("nan")


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
            while not eng.profiler.done:
                gen(out_len)
            files = eng.finish()
            if "trace0" in files:
                arm.trace = analyze_run(files["trace0"]).summary
    return arm


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def gpu_step_us(arm: Arm) -> float:
    """The arm's device time per decode step (the meter's wall per step less its bubble)."""
    return arm.median("meter_wall_us_per_step") - arm.median("bubble_us_per_step")


def _f(x, spec: str) -> str:
    return "-" if x is None or (isinstance(x, float) and x != x) else format(x, spec)


def _verdict(x: float, ok: bool) -> str:
    return "n/a (not measured)" if x != x else "PASS" if ok else "MISS"


def checks(arms: list[Arm]) -> list[str]:
    """The module doc's expectations, each a line with its verdict."""
    out = []
    for a in arms:
        ra = a.median("run_ahead_frac")
        if a.shape.regime == "GPU-bound" and a.name == "overlap+zb":
            out.append(f"- {a.shape.name} {a.name}: run-ahead {_f(ra, '.3f')} (close to 1: "
                       f">= 0.9) {_verdict(ra, ra >= 0.9)}")
        if a.delay_us:
            out.append(f"- {a.shape.name} {a.name} ({a.delay_us:.0f} µs > the GPU step): "
                       f"run-ahead {_f(ra, '.3f')} (close to 0: <= 0.1) "
                       f"{_verdict(ra, ra <= 0.1)}")
        if a.name == "overlap off":          # every generate, not the median
            top = max((r["run_ahead_frac"] for r in a.repeats), default=float("nan"))
            out.append(f"- {a.shape.name} {a.name}: run-ahead at most {_f(top, '.3f')} (0 by "
                       f"construction) {_verdict(top, top == 0)}")
    return out


def report(arms: list[Arm], meta: dict) -> str:
    """The Markdown report: provenance, one row per arm (medians), the noise, the checks."""
    head = [f"# Health figures, {meta['date']}", "",
            f"- device: {meta['device']}", f"- commit: {meta['commit']}",
            f"- command: `{meta['command']}`",
            f"- workload: random prompts of {meta['prompt_len']} tokens, {meta['out_len']} new "
            f"tokens per request, Frozen-KV MTP at a simulated accept length of 3.0, page 16, "
            f"bubble meter on; each figure the median of {meta['repeats']} measured generates "
            f"after a warm-up, its noise their range (max - min)", ""]
    cols = ("| shape | regime | arm | bs | decode tok/s (meter) | run-ahead (meter) | launch lead "
            "p10 / p50 / p90 µs | run-ahead (trace) | trace lead p50 µs | bubble (meter) | "
            "draft busy | draft waste | accept len | alarm | experts / verify (uniform) |")
    rows = [cols, "|" + "---|" * 15]
    for a in arms:
        t = a.trace
        rows.append(
            f"| {a.shape.name} | {a.shape.regime} | {a.name} | {a.shape.bs} | "
            f"{_f(a.median('meter_tok_per_s'), '.0f')} | {_f(a.median('run_ahead_frac'), '.3f')} | "
            f"{_f(a.median('launch_lead_p10_us'), '+.0f')} / "
            f"{_f(a.median('launch_lead_p50_us'), '+.0f')} / "
            f"{_f(a.median('launch_lead_p90_us'), '+.0f')} | "
            f"{_f(t.get('run_ahead_frac'), '.3f')} | {_f(t.get('launch_lead_p50_us'), '+.0f')} | "
            f"{_f(a.median('bubble_frac'), '.1%')} | {_f(a.median('draft_busy_frac'), '.1%')} | "
            f"{_f(a.median('draft_waste_frac'), '.1%')} | {_f(a.median('accept_len'), '.2f')} | "
            f"{any(r.get('accept_alarm') for r in a.repeats)} | "
            f"{_f(a.median('experts_per_verify'), '.1f')} "
            f"({_f(a.median('experts_per_verify_uniform'), '.1f')}) |")
    noise = ["", "Noise (range over the measured generates):", "",
             "| shape | arm | run-ahead | lead p50 µs | decode tok/s (meter) | planted delay µs |",
             "|---|---|---|---|---|---|"]
    for a in arms:
        tps = a.median("meter_tok_per_s")
        noise.append(f"| {a.shape.name} | {a.name} | {_f(a.spread('run_ahead_frac'), '.3f')} | "
                     f"{_f(a.spread('launch_lead_p50_us'), '.0f')} | "
                     f"{_f(a.spread('meter_tok_per_s') / tps if tps else float('nan'), '.1%')} | "
                     f"{a.delay_us:.0f} |")
    notes = [n for a in arms for n in {r.get("run_ahead_note") for r in a.repeats} if n]
    tail = ["", "Checks:", ""] + checks(arms)
    if notes:
        tail += ["", "Notes: " + "; ".join(sorted(set(notes)))]
    return "\n".join(head + rows + noise + tail) + "\n"


def report_path(out_dir: Path, date: str, device: str, commit: str) -> Path:
    """<out_dir>/<YYYY-MM-DD>_<device>_<commit>.md, the device as a lower-case slug."""
    slug = "".join(c if c.isalnum() else "-" for c in device.lower()).strip("-")
    return out_dir / f"{date}_{slug}_{commit[:7]}.md"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_health",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true",
                    help="CPU, random-tiny, short runs: the script's path, not its figures")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out-len", type=int, default=64, help="new tokens per request")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--out-dir", default=str(REPORT_DIR), help="where the report goes")
    ap.add_argument("--no-moe", action="store_true", help="leave out the MoE arms")
    a = ap.parse_args(argv)
    import torch

    from mtplab.atomic import atomic_write_text
    from mtplab.provenance import git_commit

    device = "cpu" if a.smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("bench_health: no GPU here; run it on the GPU host, or --smoke for the path.",
              file=sys.stderr)
        return 2
    shapes = (SMOKE,) if a.smoke else SHAPES
    prompt_len, out_len, repeats = ((8, 8, 2) if a.smoke else
                                    (a.prompt_len, a.out_len, a.repeats))
    trace_dir = Path(a.out_dir) / "traces"
    zb = dict(overlap=True, zero_bubble=True)
    arms = []
    t0 = time.perf_counter()
    for s in shapes:
        base = run_arm(Arm(s, "overlap+zb", zb), device, prompt_len, out_len, repeats,
                       not a.smoke, trace_dir)
        arms.append(base)
        arms.append(run_arm(Arm(s, "overlap off", dict(overlap=False)), device, prompt_len,
                            out_len, repeats, False, trace_dir))
        step = gpu_step_us(base)           # on CPU the meter's clock is the host's: no GPU step
        delay = max(2000.0, 2.0 * step) if device == "cuda" and step == step else 2000.0
        arms.append(run_arm(Arm(s, "overlap+zb + host delay", zb, delay), device, prompt_len,
                            out_len, repeats, not a.smoke, trace_dir))
        print(f"{s.name}: done at {time.perf_counter() - t0:.0f} s", flush=True)
    if not a.smoke and not a.no_moe:
        for routing in ("uniform", "zipf:1.2"):
            arms.append(run_arm(Arm(MOE, f"overlap+zb, {routing}",
                                    dict(zb, moe_stats=True, moe_routing=routing)),
                                device, prompt_len, out_len, repeats, False, trace_dir))
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    commit = git_commit() or "unknown"
    meta = {"date": time.strftime("%Y-%m-%d"), "device": name, "commit": commit,
            "command": "python -m benchmarks.bench_health " + " ".join(argv or sys.argv[1:]),
            "prompt_len": prompt_len, "out_len": out_len, "repeats": repeats}
    path = report_path(Path(a.out_dir), meta["date"], name, commit)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, report(arms, meta))
    print(f"wrote {path} ({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
