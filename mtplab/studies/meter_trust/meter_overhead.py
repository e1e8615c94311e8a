"""Decode tok/s meter on vs off, engines built and run interleaved (part `overhead`), its
table row, and `--pool`: the rows of saved --raw runs pooled (no GPU)."""
from __future__ import annotations

import time
from contextlib import contextmanager
from statistics import harmonic_mean as hmean

import numpy as np

from mtplab import Engine, RunConfig
from mtplab.atomic import atomic_path
from mtplab.nogc import gc_paused

from .meter_common import BASE, OVERLAP, prompts, sig, verdict
from .meter_stats import OVERHEAD_PCT, arm_rate, engine_spread, over_engines, overhead_ci


@contextmanager
def unstamped_graphs():
    """Engines built inside capture their segment graphs without the meter's stamps; the rest
    of the meter (step spans, the d2h kernel's stamps, prefill's eager stamps) stays on. The
    overhead arm built so isolates what the graphs' stamps cost (their device time plus the
    replay's log entry)."""
    from mtplab.graphs import runner
    init = runner.GraphRunner.__init__

    def plain(self, *a, **k):
        init(self, *a, **{**k, "meter": None})
    runner.GraphRunner.__init__ = plain
    try:
        yield
    finally:
        runner.GraphRunner.__init__ = init


def _engine(bs: int, meter: bool, graph_stamps: bool = True):
    """An overhead arm's engine (tiny-code frozen, overlap + zero_bubble, bs requests); with
    the meter on, `graph_stamps=False` captures its graphs without the meter's stamps."""
    cfg = RunConfig(**BASE, **OVERLAP["on+zb"], bubble_meter=meter, max_running_requests=bs)
    if graph_stamps:
        return Engine(cfg)
    with unstamped_graphs():
        return Engine(cfg)


def _rotate(engs: dict, ps, reps: int, tokens: int,
            seconds: float | None = None) -> tuple[dict, dict]:
    """Every engine generates `tokens` per prompt once per repeat, the order rotating each
    repeat, GC off -> (decode tok/s, median decode step ms) per engine, arrays over repeats.
    `seconds`: no repeat after the first starts after this long (the repeats done are
    returned)."""
    names = list(engs)
    rates = {n: [] for n in names}
    p50 = {n: [] for n in names}
    t0 = time.perf_counter()
    with gc_paused(collect=True):
        for i in range(reps):
            if i and seconds is not None and time.perf_counter() - t0 > seconds:
                break
            k = i % len(names)
            for n in names[k:] + names[:k]:
                engs[n].generate(ps, max_new_tokens=tokens, ignore_eos=True)
                st = engs[n].stats()
                rates[n].append(st["decode_tok_per_s"])
                p50[n].append(st["decode_step_p50_ms"])
    return ({n: np.array(v) for n, v in rates.items()},
            {n: np.array(v) for n, v in p50.items()})


OVERHEAD_HEADER = ["| bs | meter off (median tok/s) | meter on (median tok/s) | eager stamps / "
                   "step | overhead [95% CI] | pooled | from median step time [95% CI] | "
                   "engine spread off, on | over engines [95% CI] | of which graph stamps / "
                   "rest | target | verdict |",
                   "|---|---|---|---|---|---|---|---|---|---|---|---|"]
OVERHEAD_ARMS = ("off", "on", "unstamped")      # "unstamped" only with --split


def overhead_row(bs: int, r: dict, p50: dict, per_arm: int, per_step: float | None,
                 runs: list | None = None) -> str:
    """The overhead table's row from every engine's decode tok/s (`r`) and median decode
    step ms (`p50`) per repeat, keyed "<arm> <i>" (the arms of OVERHEAD_ARMS; without the
    "unstamped" ones the split cell reads "-"); `per_step` eager stamps per step (None: not
    counted); `runs`: for a pool, each saved run's own `r` (its engines are other engines
    than another run's; the over-engines cell keeps them apart)."""
    k, rng = per_arm, np.random.default_rng(0)
    arms = [a for a in OVERHEAD_ARMS if f"{a} 0" in r]
    rate = {a: arm_rate(r, a, k) for a in arms}
    step = {a: arm_rate(p50, a, k) for a in arms}

    def ov(x, y):
        return 100 * (1 - float(np.median(rate[x] / rate[y])))
    total, lo, hi = overhead_ci(rate["on"] / rate["off"], rng)
    # the same ratio from each generate's median step time (every arm decodes the same
    # tokens in the same steps): a host stall in a few steps moves the mean, not this
    step_ov, slo, shi = overhead_ci(step["off"] / step["on"], rng)
    # every generate decodes the same tokens: the pooled rate is the harmonic mean
    pooled = 100 * (1 - hmean(np.concatenate([r[f"on {i}"] for i in range(k)]))
                    / hmean(np.concatenate([r[f"off {i}"] for i in range(k)])))
    split_cell = (f"{ov('on', 'unstamped'):.2f}% / {ov('unstamped', 'off'):.2f}%"
                  if "unstamped" in arms else "-")
    return (f"| {bs} | {np.median(rate['off']):.0f} | {np.median(rate['on']):.0f} | "
            f"{'-' if per_step is None else f'{per_step:.1f}'} | "
            f"{total:.2f}% [{lo:.2f}, {hi:.2f}] | {pooled:.2f}% | "
            f"{step_ov:.2f}% [{slo:.2f}, {shi:.2f}] | "
            f"{engine_spread(r, 'off', k):.2f}%, {engine_spread(r, 'on', k):.2f}% | "
            f"{over_engines(runs or [r], k)} | {split_cell} | "
            f"≤ {OVERHEAD_PCT:g}% | {verdict(total <= OVERHEAD_PCT)} |")


def overhead(rows: list, reps: int = 5000, tokens: int = 128, raw: str | None = None,
             sizes: tuple = (1, 32), per_arm: int = 3, split_arm: bool = False,
             seconds: float | None = 420.0, data: dict | None = None) -> None:
    """Decode tok/s meter on vs off, interleaved (the order rotates every repeat). An engine's
    own state (its graphs, their memory, its place in the build order) can move its tok/s by
    as much as the meter, so each arm has `per_arm` engines, built interleaved (off 0, on 0,
    unstamped 0, off 1, ...), and an arm's rate per repeat is the geometric mean of its
    engines; the engine spread per arm is reported beside it. The verdict reads the median
    of the per-repeat on/off ratios (paired: neighbouring runs share the machine's state,
    and the machine's speed drifts by several % within a second, so short generates and
    two arms keep a pair close in time), with a bootstrap 95% interval; the pooled ratio is
    all decode tokens over all decode time of each arm. `split_arm` adds a third arm, the
    meter on with unstamped graphs, which splits the overhead into the graphs' stamps (on
    vs unstamped) and the rest of the meter (unstamped vs off). `seconds`: per batch size,
    no repeat after the first starts after this long (None: `reps` of them). `raw`: an .npz
    path for every engine's decode tok/s and median step time per repeat, the eager stamps
    per step and the tokens per generate (repeat i starts the rotation at engine i mod the
    engine count, in build order); `--pool` reads such files back. `data` (given) gets
    every engine's decode tok/s per repeat under "overhead" (the report's results)."""
    k = per_arm
    arms = OVERHEAD_ARMS if split_arm else OVERHEAD_ARMS[:2]
    count = (f"{reps} interleaved repeats" if seconds is None else
             f"interleaved repeats for {seconds:.0f} s (at most {reps})")
    rows += ["", f"Meter overhead (tiny-code frozen, fold_seed, overlap + zero_bubble, decode "
             f"tok/s of {tokens}-token generates, {count} per batch size, GC off, "
             f"{k} engines per arm built interleaved, an arm's rate = the geometric mean of "
             "its engines; overhead = 1 - median of the per-repeat on/off ratios [bootstrap "
             "95% interval]; pooled = 1 - ratio of the arms' total decode tok/s; from median "
             "step time = the same from each generate's median decode step time; engine "
             "spread = (largest - smallest) / median of one arm's engine medians; over "
             "engines = the engines as the sample (each engine's mean log tok/s relative to "
             "its repeat's mean, a t interval over the engines of both arms); split: "
             + ("against the arm with the meter on but its graphs unstamped" if split_arm
                else "not run (add --split)")
             + "; eager stamp launches per step counted over a generate, prefill included):",
             "", *OVERHEAD_HEADER]
    names = [f"{arm} {i}" for i in range(k) for arm in arms]      # the build order
    saved, done = {}, []
    for bs in sizes:
        engs = {n: _engine(bs, meter=not n.startswith("off"),
                           graph_stamps=not n.startswith("unstamped")) for n in names}
        ps = prompts(engs["off 0"], bs)
        for e in engs.values():
            e.generate(ps, max_new_tokens=16, ignore_eos=True)
        m, eager = engs["on 0"].meter, [0]
        stamp = m.stamp

        def counting(code, eager=eager, stamp=stamp):
            eager[0] += 1
            stamp(code)
        m.stamp = counting
        s0 = m.step
        engs["on 0"].generate(ps, max_new_tokens=64, ignore_eos=True)
        per_step = eager[0] / max(1, m.step - s0)
        del m.stamp
        r, p50 = _rotate(engs, ps, reps, tokens, seconds)
        saved.update({f"bs{bs} {n}": v for n, v in r.items()})
        saved.update({f"bs{bs} {n} step_p50_ms": v for n, v in p50.items()})
        saved[f"bs{bs} eager_per_step"] = np.array(per_step)
        saved[f"bs{bs} tokens"] = np.array(tokens)
        if raw:                                  # after each bs: a later failure keeps it
            with atomic_path(raw) as tmp, open(tmp, "wb") as f:
                np.savez(f, **saved)
        if data is not None:
            data.setdefault("overhead", []).append(
                {"bs": bs, "tokens": tokens, "per_arm": k, "eager_per_step": per_step,
                 "rates": {n: sig(v) for n, v in r.items()}})
        rows.append(overhead_row(bs, r, p50, k, per_step))
        done.append(f"bs {bs}: {len(r['off 0'])}")
        del engs
    rows += ["", f"Repeats run: {', '.join(done)}."]


def pool(rows: list, paths: list) -> None:
    """The overhead rows of several saved runs (`--raw` files of this layout) pooled: each
    engine's repeats concatenated across the files, per batch size found in all of them.
    The files must agree in arms, engines per arm and tokens per generate."""
    runs = []
    for path in paths:
        try:
            runs.append(dict(np.load(path)))
        except (OSError, ValueError) as e:
            raise SystemExit(f"--pool {path}: cannot read it as a --raw .npz ({e}).") from None
    sizes = sorted({int(key.split()[0][2:]) for key in runs[0] if key.endswith(" off 0")})
    if not sizes or not all(f"bs{bs} off 0" in z and f"bs{bs} on 0" in z
                            for z in runs for bs in sizes):
        raise SystemExit("--pool: every file must be a --raw of the overhead part (keys "
                         "'bs<N> off 0', 'bs<N> on 0', ...), with the same batch sizes.")
    rows += ["", f"Meter overhead pooled over {len(paths)} saved runs ({', '.join(paths)}; each "
             "engine's repeats concatenated; columns as in the overhead part):", "",
             *OVERHEAD_HEADER]
    for bs in sizes:
        def layout(z, bs=bs):   # (arms, engines per arm, tokens per generate)
            arms = tuple(a for a in OVERHEAD_ARMS if f"bs{bs} {a} 0" in z)
            k = sum(1 for key in z if key.startswith(f"bs{bs} off ")
                    and not key.endswith("step_p50_ms"))
            return arms, k, int(z.get(f"bs{bs} tokens", 256))     # no key: saved at 256
        first = layout(runs[0])
        for path, z in zip(paths, runs):
            if layout(z) != first:
                raise SystemExit(
                    f"--pool: bs {bs}: {path} differs from {paths[0]} in its layout (arms, "
                    f"engines per arm, tokens per generate: {layout(z)} vs {first}); pool runs "
                    "of one --overhead-engines, --overhead-tokens and --split setting.")
        arms, k, _ = first
        keys = [f"{a} {i}" for a in arms for i in range(k)]
        own = [{key: z[f"bs{bs} {key}"] for key in keys} for z in runs]     # per run
        r = {key: np.concatenate([o[key] for o in own]) for key in keys}
        p50 = {key: np.concatenate([z[f"bs{bs} {key} step_p50_ms"] for z in runs])
               for key in keys}
        eager = [float(z[f"bs{bs} eager_per_step"]) for z in runs
                 if f"bs{bs} eager_per_step" in z]          # (runs saved before 2026-11-23)
        rows.append(overhead_row(bs, r, p50, k, float(np.mean(eager)) if eager else None, own))
