"""The MoE speculation study in one process: one engine per model, routing and arm measures
every batch size (studies/batch_levels.py: its largest batch prefilled once, then shrunk level
by level), instead of one sweep process per cell. Writes the study's dated report (question
`moe`, moe_spec.py's render) into --out-dir:

    DIR/moe/<YYYY-MM-DD>_<device>_<commit>.{json,md}      (DIR default docs/results)

    python -m benchmarks.bench_moe_spec [--out-dir DIR] [--routings uniform zipf:1.2]
        [--models gemma4-26b-a4b-like@30 gemma4-31b-like@60] [--arms 0 1 2 3 4]
        [--batches 1 2 4 8 16 32 64] [--steps-per-level 24] [--windows 3] [--budget-s 520]

The grid is moe_spec.yaml's: its models, routings (zipf only on a model with experts), arms
(by index; 0, target-only, always runs) and base settings (overlap + zero_bubble, CUDA graphs,
page 16, 64-token random prompts). A cell's rows are its windows of steady steps: each one's
decode tok/s (tokens out per iteration / the window's p50 iteration) is one repeat of the
study's rows. Per MoE model, routing and K, an experts pass (the engine again with
moe_stats, EXPERT_STEPS steps per level) records the distinct experts per layer each verify
touches at every bs beside uniform routing's expectation. A run at a stamp (date, device,
commit) that already has a report adds its rows to it, so several runs of one commit on one
device build one report. The commit is MTP_GIT_COMMIT where set, else this checkout's HEAD; a
tree with uncommitted changes is refused before anything runs.
"""
from __future__ import annotations

import argparse
import gc
import shlex
import sys
import traceback
from dataclasses import replace
from pathlib import Path

import torch
import yaml

from mtplab import Engine, RunConfig
from mtplab.errors import ConfigError
from mtplab.models.zoo import model_config
from mtplab.studies import reports as R
from mtplab.studies.run_cells import TimeBox
from mtplab.studies.batch_levels import (level_prompts, request_tokens, run_levels,
                                         steady_cells, time_levels, tokens_per_step)
from mtplab.studies.bench import arm_label
from mtplab.studies.group import BUBBLE, VALUE
from mtplab.studies.moe import QUESTION, moe_spec, render

GRID = yaml.safe_load(moe_spec.GRID.read_text())
UNIFORM = moe_spec.UNIFORM
EXPERT_STEPS = 6             # decode steps per bs level of an experts pass
METHOD = ("one engine per model, routing and arm, its largest batch prefilled once and shrunk "
          "level by level (bench_moe_spec); each repeat a window of steady decode steps at "
          "that bs")


def arms(indices: list[int]) -> list[dict]:
    """moe_spec.yaml's arms at these indices, target-only (0) first."""
    grid_arms = GRID["arms"]
    bad = [i for i in indices if not 0 <= i < len(grid_arms)]
    if bad:
        raise ConfigError(f"--arms {bad[0]}: moe_spec.yaml has arms 0-{len(grid_arms) - 1}.")
    return [grid_arms[i] for i in sorted({0, *indices})]


def config(model: str, routing: str, arm: dict, tokens: list[int], device: str,
           dtype: str) -> RunConfig:
    """The engine for requests of `tokens` new tokens each (request_tokens): as many lanes,
    a context for the longest, and KV for what they all hold at once at most (each its
    prompt, its tokens, a decode reserve and a part-filled page), not lanes x the longest
    (several times more, as the batch shrinks level by level)."""
    base = GRID["base"]
    prompt = int(base["prompt_len_tokens"])
    kw = {k: base[k] for k in ("overlap", "zero_bubble", "page_size")}
    if routing != UNIFORM:
        kw["moe_routing"] = routing
    B = len(tokens)
    return RunConfig(model=model, max_running_requests=B, context_len=prompt + max(tokens) + 16,
                     max_total_tokens=sum(tokens) + B * (prompt + 32 + int(base["page_size"])),
                     cuda_graph_max_bs=B, device=device, dtype=dtype, **kw, **arm)


class Run(TimeBox):
    def __init__(self, doc: dict, a):
        super().__init__(a.budget_s)
        self.doc, self.a = doc, a

    def engine(self, model: str, routing: str, arm: dict) -> None:
        """One engine's cells: a row per window at every batch size with enough steady
        steps (run_levels frees the engine however the run ends)."""
        a = self.a
        key = {"model": model, "routing": routing, "arm": arm_label(arm)}
        batches = sorted(a.batches)
        B = batches[-1]
        per = tokens_per_step(arm)
        cfg = config(model, routing, arm, request_tokens(batches, B, a.steps_per_level, per),
                     a.device, a.dtype)
        steps, build_s, _ = run_levels(cfg, batches, a.steps_per_level, per,
                                       int(GRID["base"]["prompt_len_tokens"]), seed=B)
        got = steady_cells(steps, batches, a.windows)
        for bs, (ms, toks, _) in sorted(got.items()):
            for w, m in enumerate(ms):
                self.doc["rows"].append({"point": {"model": model, "moe_routing": routing,
                                                   "batch_size": bs},
                                         "arm": key["arm"], "repeat": w,
                                         VALUE: toks / (m / 1e3), BUBBLE: None})
        missing = [bs for bs in batches if bs not in got]
        self.doc["engines"].append({**key, "status": "ok", "build_s": round(build_s, 1),
                                    "steps": len(steps), "missing_bs": missing})
        print(f"{model} {routing} {key['arm']}: built in {build_s:.0f} s; "
              + ", ".join(f"bs {bs} {toks / (sorted(ms)[len(ms) // 2] / 1e3):.0f} tok/s"
                          for bs, (ms, toks, _) in sorted(got.items())), flush=True)
        k = int(arm.get("num_steps") or 0)
        if self.doc["experts"][model] and not any(
                (e["model"], e["routing"], e["k"]) == (model, routing, k)
                for e in self.doc["experts_per_verify"]):
            for bs, (n, measured, uniform) in sorted(experts_pass(cfg, batches, per).items()):
                self.doc["experts_per_verify"].append(
                    {"model": model, "routing": routing, "k": k, "bs": bs,
                     "experts": measured, "uniform": uniform, "verifies": n})

    def cell(self, model: str, routing: str, arm: dict) -> None:
        """engine() under the time box; a failure is recorded, never raised."""
        key = {"model": model, "routing": routing, "arm": arm_label(arm)}
        if self.left() < self.a.reserve_s:
            self.doc["engines"].append({**key, "status": "skipped",
                                        "reason": f"time box ({self.left():.0f} s left)"})
            return
        try:
            self.engine(model, routing, arm)
        except Exception as e:        # one engine failing must not hide the others
            traceback.print_exc()
            msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
            if any(x["status"] == "ok" and all(x[k] == v for k, v in key.items())
                   for x in self.doc["engines"]):         # timed; its experts pass failed
                self.doc.setdefault("experts_errors", []).append({**key, "reason": msg})
            else:
                self.doc["engines"].append({**key, "status": "error", "reason": msg})


def experts_pass(cfg: RunConfig, batches: list[int], per: float) -> dict:
    """{bs: (verifies, distinct experts per MoE layer per verify, the uniform expectation at
    its tokens)}: the arm's engine again with moe_stats on (its recorder adds kernels to every
    MoE layer, so the timed run goes without), EXPERT_STEPS decode steps at each level."""
    B = cfg.max_running_requests
    by: dict[int, list] = {}
    try:
        with Engine(replace(cfg, moe_stats=True)) as eng:
            time_levels(eng, level_prompts(eng, B, int(GRID["base"]["prompt_len_tokens"]), B),
                        request_tokens(batches, B, EXPERT_STEPS, per))
            for lanes, measured, uniform in eng.verify_experts():
                by.setdefault(lanes, []).append((measured, uniform))
    finally:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return {bs: (len(v), sum(m for m, _ in v) / len(v), sum(u for _, u in v) / len(v))
            for bs, v in by.items() if bs in batches}


def merge(old: dict, new: dict) -> dict:
    """`new` with what `old` (a report of the same stamp) measured that `new` did not measure
    again: one report per stamp covers every call's engines. An engine `new` skipped or lost
    keeps `old`'s rows and record where `old` measured it."""
    def key(e: dict) -> tuple:
        return e["model"], e["routing"], e["arm"]

    ran = {key(e) for e in new["engines"] if e["status"] == "ok"}
    rows = [r for r in old["rows"]
            if (r["point"]["model"], r["point"]["moe_routing"], r["arm"]) not in ran]
    measured = {(e["model"], e["routing"], e["k"]) for e in new.get("experts_per_verify", [])}
    experts = [e for e in old.get("experts_per_verify", [])
               if (e["model"], e["routing"], e["k"]) not in measured]
    engines = {key(e): e for e in old["engines"]}
    for e in new["engines"]:
        if e["status"] == "ok" or engines.get(key(e), {}).get("status") != "ok":
            engines[key(e)] = e
    labels = list(dict.fromkeys(old["arms"] + new["arms"]))
    arm_keys = {k["arm"]: k for k in old["arm_keys"] + new["arm_keys"]}
    command = new["command"] if old["command"] == new["command"] else \
        f"{old['command']}; {new['command']}"
    return {**new, "rows": rows + new["rows"], "engines": list(engines.values()),
            "arms": labels, "arm_keys": [arm_keys[a] for a in labels],
            "experts": dict(sorted({**old["experts"], **new["experts"]}.items())),
            "experts_per_verify": experts + new.get("experts_per_verify", []),
            "experts_errors": [e for e in old.get("experts_errors", [])
                               if key(e) not in ran] + new.get("experts_errors", []),
            "command": command}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_moe_spec",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", default=str(R.RESULTS),
                    help="the results folder: the report goes into DIR/moe/ (default "
                         "%(default)s)")
    ap.add_argument("--models", nargs="+", default=list(GRID["grid"]["model"]))
    ap.add_argument("--routings", nargs="+", default=list(GRID["grid"]["moe_routing"]))
    ap.add_argument("--arms", type=int, nargs="+", default=list(range(len(GRID["arms"]))),
                    help="indices of moe_spec.yaml's arms (0, target-only, always runs)")
    ap.add_argument("--batches", type=int, nargs="+",
                    default=list(GRID["grid"]["batch_size"]))
    ap.add_argument("--steps-per-level", type=int, default=24)
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--budget-s", type=float, default=520.0)
    ap.add_argument("--reserve-s", type=float, default=60.0,
                    help="an engine starts only with this much of the budget left")
    ap.add_argument("--note", default="", help="a sentence the report carries above its answer")
    return ap


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    a = parser().parse_args(argv)
    try:
        chosen = arms(a.arms)
        experts = {m: int(model_config(m).num_experts or 0) for m in sorted(a.models)}
    except (ConfigError, ValueError, KeyError) as e:
        print(f"bench_moe_spec: {e}", file=sys.stderr)
        return 2
    if a.device == "cuda" and not torch.cuda.is_available():
        print("bench_moe_spec needs a CUDA device (or --device cpu).", file=sys.stderr)
        return 2
    commit = R.checkout_commit("bench_moe_spec")          # refused before anything runs
    if commit is None:
        return 2
    labels = [arm_label(x) for x in chosen]
    doc = {"question": QUESTION, "group": moe_spec.STUDY, "study": moe_spec.STUDY,
           "method": METHOD, "arms": labels,
           "arm_keys": [{"arm": arm_label(x), "draft": x.get("draft", "none"),
                         "k": x.get("num_steps")} for x in chosen],
           "experts": experts, "rows": [], "engines": [], "experts_per_verify": [],
           "batches": sorted(a.batches), "steps_per_level": a.steps_per_level,
           "windows": a.windows}
    run = Run(doc, a)
    for model in a.models:
        for routing in (a.routings if experts[model] else [UNIFORM]):
            for arm in chosen:
                run.cell(model, routing, arm)
    doc = R.measured_here(doc, device=a.device, commit=commit, note=a.note,
                          command=shlex.join(["python", "-m", "benchmarks.bench_moe_spec",
                                              *argv]))
    path = R.write_merged(doc, render, Path(a.out_dir), merge)
    print(path.read_text(), flush=True)
    print(f"report: {path} (results: {path.with_suffix('.json').name})", flush=True)
    return 0
