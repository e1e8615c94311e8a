"""`mtplab bench`: the standard arms, one process per arm, interleaved, as a ratio table.

    groups (each a list of arms compared side by side; ratios against the group's first arm)
      drafts     target-only vs frozen_kv_mtp vs eagle         tiny-code, greedy, bs 1/8/32
      overlap    overlap off vs on vs on+zero_bubble           tiny-code, target-only and frozen
      fold_seed  fold_seed off vs on (CUDA graphs)             tiny-code, frozen, bs 1/32
      page_topk  page_size 1/16/64 x topk 1/4                  tiny-code, frozen, bs 8
      shape      a shape preset, simulated acceptance 2.0/3.0  frozen vs target-only, bs 1/8
Each arm process (one engine): warm-up generate, a timed generate with the event timeline on
(tok/s, TPOT, step time, accept length; the profiler is attached but held in its `wait`
phase, `ProfilerSession.held`), then profiled generates analysed for the device bubble fraction and its causes
(steady state: the first profiled step skipped).
Each arm process times TIMED_RUNS generates (the event timeline sampling every 8th step);
repeats run the arms of a group in interleaved order (A B C A B C ...). tok/s is reported as
min/median/max over every timed generate of every repeat, the other figures as medians.

Bubble-free bound of an arm: its decode step time with zero device bubbles = the device busy
time per step (union of kernels/memcpy in the profiled steps; kernel durations are not
inflated by the profiler); achieved = bound / the unprofiled decode step time (p50 of the timed
run). "stage sum" is the other estimate of the bound: the sum of the stages' GPU intervals from
the event timeline (event pairs also span the launch latency before a stage's first kernel, so
it over-estimates). The bubble % column is the bubble meter's (instrument/meter.py) over the
unprofiled timed runs; the cause split in parentheses is the profiled run's (shares of its
step time; `bubble_frac_profiled` in the JSON), whose per-launch cost inflates host time.
Memory floor: weight bytes read per decode step (target once for verify + the draft S times)
/ measured HBM bandwidth (a large device copy), per token = per step / accept length.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Optional

GROUPS = ("drafts", "overlap", "fold_seed", "page_topk", "shape")
TIMED_RUNS = 5                                        # timed generates per arm process
BEST = dict(overlap=True, zero_bubble=True)          # the engine's fastest loop


@dataclass
class Arm:
    group: str
    name: str
    bs: int
    cfg: dict
    new_tokens: int = 128
    prompt_len: int = 256                              # bytes of held-out stdlib code

    def key(self) -> str:
        return f"{self.group}/{self.name}/bs{self.bs}"


def arms(smoke: bool, groups: tuple = GROUPS, bss: Optional[list] = None) -> list[Arm]:
    bss = bss or ([1] if smoke else [1, 8, 32])
    model = "tiny-code"
    out = []
    if "drafts" in groups:
        for bs in bss:
            out += [Arm("drafts", "target-only", bs, dict(model=model, **BEST)),
                    Arm("drafts", "frozen_kv_mtp", bs, dict(model=model, draft="frozen_kv_mtp",
                                                             fold_seed=True, **BEST)),
                    Arm("drafts", "eagle", bs, dict(model=model, draft="eagle", **BEST))]
    if "overlap" in groups:
        for draft in ("none", "frozen_kv_mtp"):
            d = dict(model=model, draft=draft) | (dict(fold_seed=True) if draft != "none" else {})
            for bs in bss:
                out += [Arm("overlap", f"{draft} off", bs, dict(d, overlap=False)),
                        Arm("overlap", f"{draft} on", bs, dict(d, overlap=True)),
                        Arm("overlap", f"{draft} on+zb", bs, dict(d, **BEST))]
    if "fold_seed" in groups:
        for bs in sorted({bss[0], bss[-1]}):
            for fold in (False, True):
                out.append(Arm("fold_seed", f"fold_seed={fold}", bs,
                               dict(model=model, draft="frozen_kv_mtp", fold_seed=fold, **BEST)))
    if "page_topk" in groups:
        bs = bss[min(1, len(bss) - 1)]
        for P in (1, 16, 64):
            for K in (1, 4):
                out.append(Arm("page_topk", f"P={P} K={K}", bs,
                               dict(model=model, draft="frozen_kv_mtp", fold_seed=True,
                                    page_size=P, topk=K, num_draft_tokens=None if K == 1 else 8,
                                    **BEST)))
    if "shape" in groups:
        shape = dict(model="random-tiny") if smoke else dict(model="llama3-8b-like", layers=4)
        for bs in bss[:2]:
            out.append(Arm("shape", "target-only", bs, dict(shape, **BEST), prompt_len=64))
            for acc in (2.0, 3.0):
                out.append(Arm("shape", f"frozen acc={acc}", bs,
                               dict(shape, draft="frozen_kv_mtp", fold_seed=True,
                                    simulate_accept_len=acc, **BEST), prompt_len=64))
    return out


# -- one arm, in its own process -------------------------------------------------------------
def run_arm(arm: Arm, device: str, smoke: bool) -> dict:
    import torch

    from .config import RunConfig
    from .engine import Engine
    from .models.corpus import heldout_snippets
    from .analysis.bubbles import analyze
    from .instrument.meter import METER_KEYS

    new = 6 if smoke else arm.new_tokens
    ctx = 1024
    t = {"start": time.perf_counter()}
    with tempfile.TemporaryDirectory() as d:
        # One engine: the profiler is started before graph capture but is held in its `wait`
        # phase (not collecting) through the warm-up and the timed runs; the generates after
        # them are the profiled ones.
        n_timed = 1 if smoke else TIMED_RUNS
        cfg = RunConfig(device=device, max_running_requests=max(arm.bs, 1), context_len=ctx,
                        event_timeline=True, event_timeline_every=1 if smoke else 8,
                        profile=True, profile_wait=1, profile_warmup=2,
                        profile_active=3 if smoke else 12, trace_dir=d, run_name="arm",
                        bubble_meter=True, **arm.cfg)
        eng = Engine(cfg)
        t["init"] = time.perf_counter()
        V = eng.model.config.vocab_size
        if cfg.model == "tiny-code":
            prompts = [eng.tokenizer.encode(t) for t in heldout_snippets(arm.bs, arm.prompt_len)]
        else:
            g = torch.Generator().manual_seed(arm.bs)
            prompts = torch.randint(3, V, (arm.bs, arm.prompt_len), generator=g).tolist()
        runs = []
        with eng.profiler.held():
            eng.generate(prompts, max_new_tokens=min(8, new), ignore_eos=True)   # warm-up
            t["warm"] = time.perf_counter()
            for _ in range(n_timed):                                             # timed
                eng.generate(prompts, max_new_tokens=new, ignore_eos=True)
                runs.append(eng.stats())
        t["timed"] = time.perf_counter()
        eng.check_invariants()
        tl = eng.timeline_frame()
        res = dict(key=arm.key(), group=arm.group, name=arm.name, bs=arm.bs,
                   manifest=cfg.manifest(), host_syncs=runs[-1].get("host_syncs"),
                   decode_tok_per_s_runs=[r["decode_tok_per_s"] for r in runs])
        for k in ("tok_per_s", "decode_tok_per_s", "tpot_p50_ms", "tpot_p90_ms",
                  "step_time_p50_ms", "decode_step_p50_ms", "accept_len"):
            res[k] = med(runs, k)
        res["accept_len"] = res["accept_len"] or 1.0
        res.update({k: med(runs, k) for k in METER_KEYS})       # the headline bubble_frac
        dev = tl[(tl["stream"] != "host") & ~tl["stage"].str.startswith("step[")]
        if dev["gpu_start_us"].notna().any():
            per = (dev["gpu_end_us"] - dev["gpu_start_us"]).groupby(dev["step"]).sum()
            res["stage_sum_us_per_step"] = float(per.iloc[len(per) // 4:].median())
        while not eng.profiler.done:
            eng.generate(prompts, max_new_tokens=new, ignore_eos=True)           # profiled
        files = eng.finish()
        t["profiled"] = time.perf_counter()
        if "trace0" in files:
            a = analyze(files["trace0"], skip_steps=1 if not smoke else 0)
            s = a.summary
            res.update(bubble_frac_profiled=s.get("bubble_frac"), n_profiled_steps=s.get("n_steps"))
            steps = a.steps
            dec = steps[steps["name"].str.startswith("step[decode")] if len(steps) else steps
            if len(dec):
                res["busy_us_per_step"] = float(dec["busy_us"].median())
                res["step_us_profiled"] = float(dec["dur_us"].median())
                for c in ("sync", "host_prep", "launch", "host", "other"):
                    col = f"bubble_{c}_us"
                    if col in dec:
                        res[f"bubble_{c}_frac"] = float(dec[col].sum() / dec["dur_us"].sum())
        res["weight_bytes_per_step"] = weight_bytes(eng)
    t["analysed"] = time.perf_counter()
    names = list(t)                       # seconds per phase of this arm's process
    res["phase_s"] = {b: round(t[b] - t[a], 2) for a, b in zip(names, names[1:])}
    return res


def weight_bytes(eng) -> int:
    n = sum(p.numel() * p.element_size() for p in eng.model.parameters())
    if eng.draft_model is not None:
        d = sum(p.numel() * p.element_size() for p in eng.draft_model.parameters())
        n += d * eng.cfg.num_steps
    return n


def hbm_bandwidth() -> Optional[float]:
    """Bytes/s of a 1 GiB device-to-device copy (read + write), None without CUDA."""
    import torch
    if not torch.cuda.is_available():
        return None
    x = torch.empty(1 << 28, dtype=torch.float32, device="cuda")
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        y.copy_(x)
    torch.cuda.synchronize()
    return 2 * x.numel() * 4 * 10 / (time.perf_counter() - t)


# -- driver ------------------------------------------------------------------------------------
def spawn(arm: Arm, device: str, smoke: bool, timeout: float) -> dict:
    cmd = [sys.executable, "-m", "mtplab.bench", "--_arm", json.dumps(arm.__dict__),
           "--device", device] + (["--smoke"] if smoke else [])
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return dict(key=arm.key(), error=f"timed out after {timeout:.0f} s")
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        return dict(key=arm.key(), error=(p.stderr.strip().splitlines() or ["no output"])[-1])
    return json.loads(lines[-1])


def spread(xs: list) -> str:
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    return f"{min(xs):.4g} / {statistics.median(xs):.4g} / {max(xs):.4g}"


def med(rows: list, k: str) -> Optional[float]:
    xs = [r[k] for r in rows if r.get(k) is not None]
    return statistics.median(xs) if xs else None


def table(results: dict, all_arms: list, bw: Optional[float]) -> str:
    out = []
    for g in dict.fromkeys(a.group for a in all_arms):
        g_arms = [a for a in all_arms if a.group == g]
        out += [f"### {g}", "", "| arm | bs | tok/s (min/med/max) | vs first | TPOT p50 / p90 ms | "
                "step ms | accept len | bubble % meter (profiled: sync/host_prep/launch/host/"
                "other) | "
                "bound ms | achieved | stage sum ms | mem floor ms/tok |", "|---" * 12 + "|"]
        base = {}
        for a in g_arms:
            rows = [r for r in results.get(a.key(), []) if "error" not in r]
            if not rows:
                errs = [r.get("error") for r in results.get(a.key(), [])]
                out.append(f"| {a.name} | {a.bs} | failed: {errs[:1]} |" + " |" * 9)
                continue
            tps = med(rows, "decode_tok_per_s")
            base.setdefault(a.bs, tps)
            bub = med(rows, "bubble_frac")
            bub = None if bub is None or bub != bub else bub            # NaN: no device lanes
            causes = "/".join(f"{100 * (med(rows, f'bubble_{c}_frac') or 0):.1f}"
                              for c in ("sync", "host_prep", "launch", "host", "other"))
            busy = med(rows, "busy_us_per_step") or None                # 0: CPU run
            step = 1e3 * med(rows, "decode_step_p50_ms")                 # unprofiled run
            ssum = med(rows, "stage_sum_us_per_step")
            acc = med(rows, "accept_len") or 1.0
            floor = (med(rows, "weight_bytes_per_step") / bw * 1e3 / acc) if bw else None
            out.append(
                f"| {a.name} | {a.bs} | "
                f"{spread([x for r in rows for x in r['decode_tok_per_s_runs']])} | "
                f"{tps / base[a.bs]:.2f}x | {med(rows, 'tpot_p50_ms'):.2f} / "
                f"{med(rows, 'tpot_p90_ms'):.2f} | {med(rows, 'decode_step_p50_ms'):.2f} | "
                f"{acc:.2f} | {'-' if bub is None else f'{100 * bub:.1f}'} ({causes}) | "
                f"{'-' if busy is None else f'{busy / 1e3:.3f}'} | "
                f"{'-' if not busy or not step else f'{busy / step:.0%}'} | "
                f"{'-' if not ssum else f'{ssum / 1e3:.3f}'} | "
                f"{'-' if floor is None else f'{floor:.4f}'} |")
        out.append("")
    return "\n".join(out)


def main_bench(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="mtplab bench", description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="every arm for a few steps (CPU ok)")
    ap.add_argument("--groups", nargs="+", default=list(GROUPS), choices=GROUPS)
    ap.add_argument("--repeats", type=int, default=None, help="default 3 (1 with --smoke)")
    ap.add_argument("--bs", nargs="+", type=int, default=None, help="batch sizes (1 8 32)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--out", default=None, help="write the markdown table (and .json) here")
    ap.add_argument("--_arm", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a._arm:                                      # child process: one arm
        print(json.dumps(run_arm(Arm(**json.loads(a._arm)), a.device, a.smoke), default=str))
        return 0
    reps = a.repeats or (1 if a.smoke else 3)
    todo = arms(a.smoke, tuple(a.groups), a.bs)
    results: dict = {}
    from tqdm.auto import tqdm
    bar = tqdm(total=reps * len(todo), desc="bench arms")
    for g in dict.fromkeys(x.group for x in todo):
        for _ in range(reps):                        # interleaved: A B C, A B C, ...
            for arm in (x for x in todo if x.group == g):
                results.setdefault(arm.key(), []).append(spawn(arm, a.device, a.smoke, a.timeout))
                bar.update(1)
    bar.close()
    bw = hbm_bandwidth() if a.device != "cpu" else None
    header = (f"mtplab bench {'--smoke ' if a.smoke else ''}on {a.device}; "
              f"{time.strftime('%Y-%m-%d')}; repeats {reps}; HBM copy bandwidth "
              f"{'-' if bw is None else f'{bw / 1e9:.0f} GB/s'}")
    text = header + "\n\n" + table(results, todo, bw)
    print(text)
    if a.out:
        from .atomic import atomic_write_text
        atomic_write_text(a.out, text + "\n")
        atomic_write_text(os.path.splitext(a.out)[0] + ".json",
                          json.dumps(results, indent=1, default=str))
    failed = [k for k, rs in results.items() if all("error" in r for r in rs)]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main_bench())
