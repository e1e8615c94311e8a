"""`mtplab bench`: the standard comparisons, each a grid file run by the sweep, as ratio tables.

    mtplab bench                                   # every group, GPU, 3 interleaved repeats
    mtplab bench --groups drafts overlap --bs 1 8  # some groups, some batch sizes
    mtplab bench --groups my_grid.yaml             # any grid file with arms and a repeat axis
    mtplab bench --smoke                           # every group for a few steps (CPU is fine)
    mtplab bench --dir traces/bench/x              # resume into / re-render an existing run
    mtplab bench --groups regime --quick --budget-s 500    # the reduced ladder, in a budget
    mtplab bench --groups regime --only layers=16 batch_size=8   # a subset of its rungs

A group is a grid file of a study, mtplab/studies/<question>/<group>.yaml (GROUPS): `arms` are
the settings compared side by side, the other axes (batch size, model, draft ...) are the rows'
grid points, and the outermost axis `repeat: [0, 1, 2]` repeats the whole group, so the arms
interleave (A B C, A B C, ...). Every cell runs in its own process through mtplab.sweep
(`measure`: a warm-up generate, the timed generate, a generate with the event timeline, then
profiled generates); results go to <dir>/<group>/results.parquet and the run resumes where it
stopped.

The table (`table`), one row per grid point and arm, from results.parquet alone:
    tok/s            decode tok/s, min / median / max over the repeats
    vs baseline      median tok/s / the median tok/s of the first arm at the same grid point
    verdict (noise)  `faster` / `slower` when that ratio is beyond 1 ± the repeats' noise,
                     `within the noise`, or `no verdict: one repeat` (the notebooks' rule,
                     sweep/effects.py ratio_verdict); the noise in parentheses
    TPOT, step ms    TPOT p50 / p90 and the decode step p50 of the timed generate (medians)
    accept len       tokens committed per verify, bonus included (1 without a draft)
    bubble %         the bubble meter's device bubble fraction of the unprofiled timed
                     generate (instrument/meter.py; on CPU cells the meter runs on the host
                     clock and the header says so: sweep/metrics.py meter_name), then in
                     parentheses the profiled decode steps' cause split (the causes of
                     analysis/causes.py in their order, shares of the profiled step time;
                     the profiler's per-launch cost inflates host time)
    bound ms         the bubble-free step time: device busy time per profiled decode step
    achieved         bound / the unprofiled decode step p50 (1 - achieved: the unprofiled
                     bubble estimate)
    stage sum ms     the summed GPU intervals of the stage spans per decode step (event
                     timeline): the other estimate of the bound, an over-estimate (a pair
                     also spans the dispatch before its stage's first kernel)
    draft ms / launches   the draft stages' GPU time (draft.seed + draft) and the CUDA launch
                     calls inside them, per decode step
    kernels/step     GPU activities per profiled decode step, median (sweep/metrics.py)
    kernels/layer    GPU activities per decoder layer of the target forward: the block of
                     kernel names the profiled verify repeats once per layer
                     (kernels_per_layer, sweep/metrics.py; "-" on CPU)
    mem floor        the bytes a decode step reads (weights actually read + the KV of the
                     mean step's context; mtplab/models/floor.py) / the HBM copy bandwidth
                     measured by this command, per token (/ accept length)
    floor ms (KV)    the same floor per step, and in parentheses its KV term
    floor/step       floor ms / step ms (1.0 = the step runs at the HBM floor)
    step vs base     step ms / the first arm's step ms at the same grid point (a spec step
                     over the target step when the first arm is target-only)
A group file may carry two keys of its own: `quick`, a reduced variant (`grid`, `exclude`,
`arms`, `base` replacing the group's) that `--quick` runs, and `report: regime`, which prints
the regime report (`regime_report`: the regime table of mtplab/studies/regime/ladder.py, each
effect's crossover, and the what-if predictor against the measured ratios, studies/whatif/check.py)
instead of the ratio table. An arm with `zero_bubble: each_off` stands for one arm per
zero-bubble sub-knob, that one off and the others on (zero_bubble.py leave_one_out), so a new
sub-knob is measured without an edit to the group file. `--only AXIS=V,...` keeps those values
of an axis (a subset of rungs), `--budget-s S` starts no cell that could not end within S
seconds of the start (sweep/executors.py LocalExecutor); the cells left are named and the same
`--dir` resumes.
A group file with `runner: schedule` (the `schedule` group) is run in one process by
mtplab/studies/spec_schedule/runner.py, not by the sweep: the break-even surface of speculation over
(batch size, num_steps, topk) with off included, the best spec_schedule for the model and GPU
written as YAML the knob loads, and its gain over the best static setting on a workload whose
batch varies (--quick, --repeats, --bs, --budget-s and --dir apply; --only does not), into
<dir>/schedule/ (results.json, grid.yaml); `mtplab report spec_schedule --from <dir>/schedule`
writes its dated report.
A group whose cells measure host stages (`host_stages: true`, the `host` group) prints the
host-stage table instead (`host_table`), one row per grid point and arm, medians over the
repeats: host µs per decode step (mean; p50: the median step) and of each stage (schedule,
prepare, each segment's launch, d2h, sync, process_result; mtplab/sweep/host.py), the loop's
own Python between them, the whole step, replays / copy_ / other aten ops per step, and the
step against its replay floor (replays per step x one replay's host µs, measured in the cell's
process).
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Optional

import pandas as pd
import yaml

from ..analysis.causes import CAUSES
from ..fmt import readable

STUDIES = Path(__file__).resolve().parent
# group -> the study folder holding its grid file <group>.yaml
GROUPS = {"drafts": "drafts", "overlap": "overlap", "fold_seed": "fold_seed",
          "page_topk": "page_topk", "shape": "drafts", "graphs": "decode_floor",
          "context": "long_context", "host": "host_path", "moe": "moe", "regime": "regime",
          "schedule": "spec_schedule"}
BENCH_KEYS = ("quick", "report")    # a group file's own keys, not the sweep's (module doc)
EACH_OFF = "each_off"               # an arm's zero_bubble: one arm per sub-knob (module doc)
REPEAT = "repeat"
# --smoke: every arm of every group for a few steps, one repeat (a CPU check of the path).
SMOKE_BASE = dict(prompt_len_tokens=32, output_len_tokens=6, warmup_output_len_tokens=2,
                  profile_active=3)
SMOKE_MODEL = "random-tiny"           # stands in for every model but tiny-code
SHORT = {"batch_size": "bs"}
SMOKE_RATIO = "vs baseline (path check)"
SMOKE_NOTE = ("--smoke: every arm ran a few tokens once, to check the path; its figures and "
              "ratios are not results (run without --smoke, on the GPU, for those)")


# -- grids -------------------------------------------------------------------------------------
def _axes(doc: dict, quick: bool) -> set:
    """The axes a group file runs (its `quick` variant's with --quick)."""
    g = ((doc.get("quick") or {}).get("grid") if quick else None) or doc.get("grid") or {}
    return set(g) | {REPEAT}


def grid_doc(group: str) -> dict:
    """The grid file of a group name (mtplab/studies/<question>/<group>.yaml) or a path."""
    from ..errors import ConfigError
    from ..yamlfile import read_yaml
    path = (Path(group) if group.endswith((".yaml", ".yml"))
            else STUDIES / GROUPS.get(group, "-") / f"{group}.yaml")
    if not path.is_file():
        raise ConfigError(f"no bench group {group!r}: use one of {list(GROUPS)} or a grid file.")
    doc = read_yaml(path, f"grid file {path}")
    if not isinstance(doc, dict) or not doc.get("arms"):
        raise ConfigError(f"{path} has no `arms`: a bench group compares arms side by side.")
    for d in (doc, doc.get("quick") or {}):
        if d.get("arms"):
            d["arms"] = [a for arm in d["arms"] for a in _each_off(arm)]
    return doc


def _each_off(arm: dict) -> list[dict]:
    """The arms an arm of a group file stands for: itself, or with `zero_bubble: each_off`
    one per sub-knob (zero_bubble.py leave_one_out)."""
    if not isinstance(arm, dict) or arm.get("zero_bubble") != EACH_OFF:
        return [arm]
    from ..zero_bubble import leave_one_out
    rest = {k: v for k, v in arm.items() if k != "zero_bubble"}
    return [{**rest, **subs} for subs in leave_one_out()]


def effective_doc(doc: dict, *, smoke: bool, repeats: Optional[int], bs: Optional[list],
                  device: str, quick: bool = False, only: Optional[dict] = None) -> dict:
    """The grid doc with the command line applied (--quick, repeats, batch sizes, device,
    --only, --smoke); the group file's own keys (BENCH_KEYS) are taken out."""
    from ..errors import ConfigError
    doc = json.loads(json.dumps(doc))                   # a deep copy
    own_keys = {k: doc.pop(k, None) for k in BENCH_KEYS}
    variant = own_keys["quick"]
    if quick:
        if variant is None:
            raise ConfigError("--quick: this group has no `quick` variant; run it without "
                              "--quick (or with --only AXIS=VALUES for a subset).")
        doc.update({k: v for k, v in variant.items() if k in ("grid", "exclude", "arms",
                                                                "base")})
    base, axes = doc.setdefault("base", {}), doc.setdefault("grid", {})
    own = axes.pop(REPEAT, [0])
    n = repeats or (1 if smoke else len(own))
    doc["grid"] = {REPEAT: list(range(n)), **axes}      # outermost: interleaved repeats
    if device != "auto":
        base["device"] = device
    if bs:
        doc["grid"]["batch_size"] = list(bs)
    for k, vals in (only or {}).items():
        axis = doc["grid"].get(k)
        if axis is None:
            raise ConfigError(f"--only {k}=...: {k!r} is not an axis of this group; use one of "
                              f"{list(doc['grid'])}.")
        keep = [v for v in axis if v in vals]
        if not keep:
            raise ConfigError(f"--only {k}={','.join(map(str, vals))}: none of these is on the "
                              f"axis {axis}.")
        doc["grid"][k] = keep
    if smoke:
        base.update(SMOKE_BASE)
        if "batch_size" in doc["grid"] and not bs:
            doc["grid"]["batch_size"] = doc["grid"]["batch_size"][:1]
        if base.get("model", SMOKE_MODEL) not in ("tiny-code", SMOKE_MODEL):
            base["model"] = SMOKE_MODEL
            base.pop("layers", None)
        if "model" in doc["grid"]:
            doc["grid"]["model"] = [SMOKE_MODEL]
            doc["grid"].pop("layers", None)
        for k in ("prompt_len_tokens", "context_len"):   # the context group's long prompts
            doc["grid"].pop(k, None)
            doc["base"].pop(k, None)
        base["prompt_len_tokens"] = SMOKE_BASE["prompt_len_tokens"]
    return doc


def parse_only(items: list[str]) -> dict:
    """`--only layers=4,16 batch_size=8` -> {"layers": [4, 16], "batch_size": [8]} (values
    read as YAML scalars: null, numbers, booleans, strings)."""
    from ..errors import ConfigError
    from ..yamlfile import load_yaml
    out: dict = {}
    for it in items:
        k, eq, v = it.partition("=")
        if not eq or not k or not v:
            raise ConfigError(f"--only {it!r}: write AXIS=VALUE[,VALUE...], e.g. layers=4,16.")
        out[k] = [load_yaml(x, f"--only {it!r}", empty_ok=True) for x in v.split(",")]
    return out


def group_cells(name: str, doc: dict) -> list:
    """A group's cells, refused (ConfigError) when not one of them can run."""
    from ..errors import ConfigError
    from ..sweep import grid_from_dict

    cells = grid_from_dict(doc).cells()
    if cells and all(c.dropped for c in cells):
        raise ConfigError(f"group {name}: every cell is dropped ({cells[0].dropped}); fix the "
                          "settings so that some cell can run.")
    return cells


def run_group(doc: dict, cells: list, out: Path, timeout_s: Optional[float],
              progress: bool = True, deadline: Optional[float] = None) -> pd.DataFrame:
    """Run (or resume) one group's cells, none started past `deadline` (time.monotonic()),
    its progress bar labelled with the group (the folder's name); return its results table
    (`not_started`: cells the budget left out)."""
    from ..atomic import atomic_write_text
    from ..sweep import grid_from_dict, run_sweep
    from ..sweep.executors import LocalExecutor

    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "grid.yaml", yaml.safe_dump(doc, sort_keys=False))
    ex = LocalExecutor(deadline)
    df = run_sweep(cells, out, timeout_s=timeout_s or grid_from_dict(doc).timeout_s,
                   progress=progress, executor=ex, label=f"bench {out.name}")
    if "cell_id" not in df:            # no cell ran (the budget spent before the first)
        df = pd.DataFrame({"cell_id": pd.Series(dtype=str), "status": pd.Series(dtype=str)})
    df = df[df["cell_id"].isin({c.cell_id for c in cells})]    # not older runs' cells
    df.attrs["not_started"] = ex.not_started
    return df


# -- the table ---------------------------------------------------------------------------------
def _fmt(x: Optional[float], spec: str, scale: float = 1.0) -> str:
    return "-" if x is None or x != x else format(x * scale, spec)


def _med(rows: pd.DataFrame, col: str) -> Optional[float]:
    if col not in rows:
        return None
    xs = [float(x) for x in rows[col] if x is not None and x == x]
    return statistics.median(xs) if xs else None


def arm_label(arm: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in arm.items()) or "(base)"


def _cells(df: pd.DataFrame, doc: dict):
    """(grid, arms, point axes, {(grid point, arm index): [records]}, grid points in order)."""
    from ..sweep import grid_from_dict

    grid = grid_from_dict(doc)
    arms = grid.arms or [{}]
    point_axes = [a for a in grid.axes if a != REPEAT]
    # A cell's settings as written (settings_json) name its grid point and arm exactly:
    # Grid.points() lists base + point + arm with the arms innermost.
    where = {json.dumps(s, sort_keys=True, default=str):
             (tuple(s.get(a) for a in point_axes), i % len(arms))
             for i, s in enumerate(grid.points())}
    cells: dict[tuple, list[dict]] = {}
    for rec in df.to_dict("records"):
        if str(rec.get("error", "")).startswith("excluded by the grid file"):
            continue
        if rec["settings_json"] in where:            # not a cell of this grid: left out
            cells.setdefault(where[rec["settings_json"]], []).append(rec)
    return grid, arms, point_axes, cells, list(dict.fromkeys(p for p, _ in cells))


HOST_COLUMNS = ("schedule", "prepare", "resolve", "draft_seed", "draft", "tree", "verify",
                "accept", "commit", "draft_extend", "d2h", "sync", "process_result")


def host_table(df: pd.DataFrame, doc: dict) -> str:
    """The host-stage table of a group whose cells ran with `host_stages` (module doc); a
    stage no arm of the group spends time in is left out."""
    _, arms, point_axes, cells, points = _cells(df, doc)
    ok = {k: [r for r in v if r["status"] == "ok"] for k, v in cells.items()}
    stages = [s for s in HOST_COLUMNS
              if any((_med(pd.DataFrame(v), f"host_{s}_us") or 0) > 0 for v in ok.values() if v)]
    head = ([SHORT.get(a, a) for a in point_axes] + ["arm", "n", "step µs", "p50 µs"] +
            [f"{s.replace('_seed', '.seed')} µs" for s in stages] +
            ["loop µs", "replays", "copy_", "other ops", "floor µs", "step / floor"])
    out = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for pt in points:
        for i, arm in enumerate(arms):
            recs = ok.get((pt, i))
            if not recs:
                continue
            d = pd.DataFrame(recs)
            step, floor = _med(d, "host_step_us"), _med(d, "host_floor_us")
            out.append("| " + " | ".join(
                [str(v) for v in pt] + [arm_label(arm), str(len(d)), _fmt(step, ".0f"),
                                        _fmt(_med(d, "host_step_p50_us"), ".0f")] +
                [_fmt(_med(d, f"host_{s}_us"), ".1f") for s in stages] +
                [_fmt(_med(d, "host_loop_us"), ".1f"),
                 _fmt(_med(d, "host_replays_per_step"), ".2f"),
                 _fmt(_med(d, "host_copies_per_step"), ".2f"),
                 _fmt(_med(d, "host_ops_per_step"), ".2f"), _fmt(floor, ".1f"),
                 "-" if not floor or not step or floor != floor else f"{step / floor:.1f}x"])
                + " |")
    return "\n".join(out)


# CPU stand-in for the ladder (notebook 08 on a machine without a GPU): the path, not the map
CPU_ARMS = (
    {"draft": "none", "overlap": False},
    {"draft": "none", "overlap": True, "zero_bubble": True},
    {"draft": "none", "overlap": True, "zero_bubble": True, "host_delay_us": 1000},
    {"draft": "frozen_kv_mtp", "simulate_accept_len": 3.0, "fold_seed": True,
     "overlap": False},
    {"draft": "frozen_kv_mtp", "simulate_accept_len": 3.0, "fold_seed": True,
     "overlap": True, "zero_bubble": True},
)


def regime_doc(*, on_gpu: bool, device: str, ladder: str = "quick", repeats: int = 3,
               only: Optional[dict] = None, cpu_rungs: tuple = (("random-tiny", 1),),
               cpu_output_len_tokens: int = 24) -> dict:
    """The grid of notebook 08: the regime bench group (its `quick` variant or the whole
    ladder, `only` some axis values) on a GPU; on a CPU, `cpu_rungs` ((model, batch size),
    ...) with CPU_ARMS at short outputs."""
    from ..errors import ConfigError

    if ladder not in ("quick", "full"):
        raise ConfigError(f"ladder={ladder!r}: use 'quick' (three rungs) or 'full'.")
    doc = effective_doc(grid_doc("regime"), smoke=False, repeats=repeats, bs=None,
                        device=device, quick=on_gpu and ladder == "quick",
                        only=only if on_gpu else None)
    if on_gpu:
        return doc
    base = {**doc["base"], "output_len_tokens": cpu_output_len_tokens,
            "warmup_output_len_tokens": 2, "prompt_len_tokens": 32}
    return {"base": base, "arms": [dict(a) for a in CPU_ARMS],
            "grid": {"repeat": list(range(repeats)),
                     "model": list(dict.fromkeys(m for m, _ in cpu_rungs)),
                     "batch_size": list(dict.fromkeys(b for _, b in cpu_rungs))},
            "exclude": [{"model": m, "batch_size": b} for m in {m for m, _ in cpu_rungs}
                        for b in {b for _, b in cpu_rungs} if (m, b) not in set(cpu_rungs)]}


def _suspect_cells(df: pd.DataFrame) -> list[str]:
    """One line naming the cells whose host clock and meter disagree (studies/effects.py)."""
    from .effects import CLOCKS_LIMIT, clock_ratios, suspect
    d = df.reset_index(drop=True)
    bad = [(d.at[i, "cell_id"], x) for i, x in clock_ratios(d).items() if suspect(x)]
    if not bad:
        return []
    return [f"suspect: {len(bad)} cell(s) whose decode tok/s on the host clock is beyond "
            f"{CLOCKS_LIMIT}x the meter's either way (no planted delay), as when the host reads "
            "results the GPU has not written yet: " +
            ", ".join(f"{c} {x:.2f}x" for c, x in bad)]


def regime_report(df: pd.DataFrame, doc: dict, out: Optional[Path] = None) -> str:
    """The regime group's report: the regime table (x = GPU / host time per step, each
    effect's ratio; studies/regime/ladder.py), each effect's crossover, and the what-if predictor
    against the measured ratios (studies/whatif/check.py); with `out` (the group's sweep
    folder) also regime.png, regime_table.csv and whatif_validation.csv there."""
    from .regime import ladder as regime
    from .whatif import check as whatif_check
    from ..sweep.metrics import meter_name
    t = regime.regime_table(df, sweep_dir=out)
    v = whatif_check.validate(df, regime.validation_pairs(), label=regime.arm_label,
                              sweep_dir=out, flips=True)
    meter = meter_name(df["cfg.device"]) if "cfg.device" in df else "meter"
    if out is not None and len(t):
        from ..atomic import atomic_path
        regime.plot_regime(t, path=out / "regime.png", meter=meter)
        for name, frame in (("regime_table.csv", t), ("whatif_validation.csv", v)):
            with atomic_path(out / name) as tmp:
                frame.to_csv(tmp, index=False)
    lines = [regime.table_md(t, meter), "", "crossovers:"]
    lines += [f"- {s}" for s in regime.crossovers(t)["sentence"]]
    lines += ["", "what-if predictor vs measured (meter_tok_per_s ratios; error = predicted / "
              "measured - 1, judged where the effect exceeds the noise):",
              whatif_check.table_md(v), "", whatif_check.summary(v), "",
              "the predictor's error per direction (each arm to each knob it can flip, both "
              "ways):", whatif_check.direction_md(v)]
    lines += _suspect_cells(df)
    walls = pd.to_numeric(df.loc[df["status"] == "ok", "cell_wall_s"], errors="coerce")
    if len(walls.dropna()):
        lines.append(f"cells: {len(walls)} ok, median {walls.median():.0f} s, total "
                     f"{walls.sum():.0f} s")
    return "\n".join(lines)


def table(df: pd.DataFrame, doc: dict, bw: Optional[float] = None, smoke: bool = False,
          report: Optional[str] = None, out: Optional[Path] = None) -> str:
    """The markdown ratio table of one group from its results frame (see the module doc).
    Rows follow the grid's order; a grid point's baseline is its first arm. With `smoke` the
    ratio column says what it is: a check of the path, not a result."""
    if (doc.get("base") or {}).get("host_stages"):
        return host_table(df, doc)
    if report == "regime":
        return regime_report(df, doc, out)
    from ..sweep.metrics import meter_name

    _, arms, point_axes, cells, points = _cells(df, doc)
    meter = meter_name(df["cfg.device"]) if "cfg.device" in df else "meter"
    head = ([SHORT.get(a, a) for a in point_axes] +
            ["arm", "n", "tok/s (min/med/max)", SMOKE_RATIO if smoke else "vs baseline",
             "verdict (noise)", "TPOT p50 / p90 ms", "step ms",
             "accept len", f"bubble % {meter} (profiled: {'/'.join(CAUSES)})", "bound ms",
             "achieved",
             "stage sum ms", "draft ms / launches", "kernels/step", "kernels/layer",
             "mem floor ms/tok", "floor ms (KV)", "floor/step", "step vs base"])
    out = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for pt in points:
        base = base_step = None
        for i, arm in enumerate(arms):
            recs = cells.get((pt, i))
            if not recs:
                continue
            lead = [str(v) for v in pt] + [arm_label(arm)]
            ok = pd.DataFrame([r for r in recs if r["status"] == "ok"])
            if ok.empty:
                why = "; ".join(dict.fromkeys(f"{r['status']}: {r['error']}" for r in recs))
                out.append("| " + " | ".join(lead + ["0", why])
                           + " |" * (len(head) - len(lead) - 1))
                continue
            tps = [float(x) for x in ok["decode_tok_per_s"]]
            med = statistics.median(tps)
            busy, step = _med(ok, "device_busy_step_ms"), _med(ok, "decode_step_time_p50_ms")
            if i == 0:
                base, base_step, base_tps = med, step, tps
            acc = _med(ok, "accept_len") or 1.0
            bub = _med(ok, "bubble_frac")
            causes = "-" if _med(ok, "bubble_frac_profiled") is None else "/".join(
                _fmt(_med(ok, f"bubble_{c}_frac") or 0.0, ".1f", 100)
                for c in CAUSES)
            seed, draft = _med(ok, "stage_draft.seed_ms"), _med(ok, "stage_draft_ms")
            dms = None if seed is None and draft is None else (seed or 0.0) + (draft or 0.0)
            wb, kvb = _med(ok, "weight_bytes_per_step"), _med(ok, "kv_bytes_per_step") or 0.0
            floor_step = (wb + kvb) / bw * 1e3 if bw and wb else None
            floor = floor_step / acc if floor_step else None
            out.append("| " + " | ".join(lead + [
                str(len(ok)),
                " / ".join(readable(x) for x in (min(tps), med, max(tps))),
                "-" if not base else f"{med / base:.2f}x",
                "-" if i == 0 or not base else _verdict(tps, base_tps),
                f"{_fmt(_med(ok, 'tpot_p50_ms'), '.2f')} / {_fmt(_med(ok, 'tpot_p90_ms'), '.2f')}",
                _fmt(step, ".2f"), f"{acc:.2f}",
                f"{_fmt(bub, '.1f', 100)} ({causes})",
                _fmt(busy, ".3f"),
                "-" if not busy or not step else f"{busy / step:.0%}",
                _fmt(_med(ok, "stage_sum_gpu_ms"), ".3f"),
                f"{_fmt(dms, '.3f')} / {_fmt(_med(ok, 'draft_launches_per_step'), '.1f')}",
                _fmt(_med(ok, "kernels_per_step"), ".0f"),
                _fmt(_med(ok, "kernels_per_layer"), ".4g"),
                _fmt(floor, ".4f"),
                "-" if floor_step is None else f"{floor_step:.3f} ({kvb / bw * 1e3:.3f})",
                "-" if floor_step is None or not step else f"{floor_step / step:.2f}",
                "-" if not base_step or not step else f"{step / base_step:.2f}x"]) + " |")
    return "\n".join(out)


def _verdict(tps: list[float], base: list[float]) -> str:
    """The arm's tok/s against its baseline's, judged as the notebooks judge it
    (sweep/effects.py ratio_verdict): `faster` / `slower` beyond the repeats' noise, `within
    the noise`, or no verdict from one repeat; the noise in parentheses."""
    from .effects import NO_VERDICT, ratio_verdict
    v, noise = ratio_verdict(tps, base)
    if v == NO_VERDICT:
        return v
    return f"{'within the noise' if v == 'nothing' else v} (±{noise:.0%})"


def closing_line(frames: dict[str, pd.DataFrame], root: Path) -> str:
    """One line over every group's cells: how many ok / failed / dropped / not started."""
    counts = {"ok": 0, "failed": 0, "dropped": 0}
    for f in frames.values():
        st = f["status"].value_counts() if "status" in f else {}
        for k in counts:
            counts[k] += int(st.get(k, 0))
    left = sum(f.attrs.get("not_started", 0) or 0 for f in frames.values())
    return (f"{len(frames)} group(s) ({', '.join(frames)}): "
            + ", ".join(f"{n} {k}" for k, n in counts.items())
            + (f", {left} not started" if left else "")
            + f"; results: {root}/<group>/results.parquet")


def header(frames: dict[str, pd.DataFrame], smoke: bool, bw: Optional[float]) -> str:
    ok = pd.concat([f[f["status"] == "ok"] for f in frames.values()] or [pd.DataFrame()])
    pick = (lambda c: ", ".join(sorted(set(map(str, ok[c].dropna())))) or "?") \
        if len(ok) else (lambda c: "?")
    return (f"mtplab bench {'--smoke ' if smoke else ''}on {pick('device_name')}; commit "
            f"{pick('git_commit')}; {time.strftime('%Y-%m-%d')}; HBM copy "
            f"bandwidth {'-' if bw is None else f'{bw / 1e9:.0f} GB/s'}"
            + (f"\n{SMOKE_NOTE}" if smoke else ""))


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


# -- command line ------------------------------------------------------------------------------
def main_bench(argv=None) -> int:
    from ..errors import ConfigError
    from ..flags import (FlagParser, device_name, out_dir, out_file, positive_int,
                           positive_number)

    ap = FlagParser(prog="mtplab bench", description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true",
                    help="every arm for a few steps (CPU ok): checks the path, its ratios are "
                         "no result")
    ap.add_argument("--groups", nargs="+", default=list(GROUPS),
                    help=f"group names {list(GROUPS)} or grid files (default: every group)")
    ap.add_argument("--repeats", type=positive_int, default=None,
                    help="interleaved repeats (default: the grid's repeat axis; 1 with --smoke)")
    ap.add_argument("--bs", nargs="+", type=positive_int, default=None,
                    help="batch sizes (the grid's)")
    ap.add_argument("--device", type=device_name, default="auto",
                    help="auto | cpu | cuda | cuda:N (default: auto)")
    ap.add_argument("--timeout", type=positive_number, default=None,
                    help="per-cell seconds (grid's)")
    ap.add_argument("--dir", default=None, type=out_dir,
                    help="sweep folder, one subfolder per group (default traces/bench/<time>); "
                         "an existing one resumes: done cells are not run again")
    ap.add_argument("--out", default=None, type=out_file,
                    help="also write the markdown tables here")
    ap.add_argument("--quick", action="store_true",
                    help="each group's reduced variant (its grid file's `quick`: the regime "
                         "group's three rungs, host-bound to GPU-bound)")
    ap.add_argument("--only", nargs="+", default=[], metavar="AXIS=V,...",
                    help="keep only these values of grid axes, e.g. --only layers=16 "
                         "batch_size=8 (a subset of rungs)")
    ap.add_argument("--budget-s", type=positive_number, default=None, metavar="S",
                    help="start no cell after S seconds (one that would not finish in time "
                         "neither); finished cells are kept and the same --dir resumes")
    ap.add_argument("--no-progress", dest="progress", action="store_false")
    a = ap.parse(argv)
    if isinstance(a, int):
        return a
    root = Path(a.dir or Path("traces") / "bench" / time.strftime("%Y%m%d-%H%M%S"))
    deadline = time.monotonic() + a.budget_s if a.budget_s else None
    try:
        raw = {Path(g).stem: grid_doc(g) for g in a.groups}
        only = parse_only(a.only)
        docs = {g: effective_doc(d, smoke=a.smoke, repeats=a.repeats, bs=a.bs, device=a.device,
                                 quick=a.quick, only={k: v for k, v in only.items()
                                                      if k in _axes(d, a.quick)})
                for g, d in raw.items() if not d.get("runner")}
        unused = [k for k in only if not any(k in _axes(d, a.quick) for d in raw.values())]
        if unused:
            raise ConfigError(f"--only {unused[0]}=...: no group runs an axis {unused[0]!r}.")
        cells = {g: group_cells(g, doc) for g, doc in docs.items()}
    except ConfigError as e:
        print(f"mtplab bench: error: {e}", file=sys.stderr)
        return 2
    own: dict[str, str] = {}
    try:
        frames = {g: run_group(doc, cells[g], root / g, a.timeout, a.progress, deadline)
                  for g, doc in docs.items()}
    except KeyboardInterrupt:             # the running cell is already killed (sweep/process.py)
        print(f"mtplab bench: interrupted; finished cells are kept under {root}, and "
              f"`--dir {root}` resumes.", file=sys.stderr)
        return 130
    for g, d in raw.items():        # groups with a runner of their own (module doc)
        if d.get("runner") == "schedule":
            from .spec_schedule.runner import run_group as run_schedule
            body = run_schedule(d, root / g, device=a.device, smoke=a.smoke, quick=a.quick,
                                repeats=a.repeats, bs=a.bs, deadline=deadline)
            own[g] = (f"### {g}\n\n{body}\n\nresults: {root / g}/results.json, grid.yaml, "
                      f"surface.png; the dated report: mtplab report spec_schedule --from "
                      f"{root / g}")
    if a.budget_s and not own and not any((f["status"] == "ok").any() for f in frames.values()):
        left = sum(f.attrs.get("not_started", 0) for f in frames.values())
        cut = sum(int((f["status"] != "ok").sum()) for f in frames.values())
        print(f"mtplab bench: error: the budget (--budget-s {a.budget_s:g}) ran out before any "
              f"cell finished ({left} not started, {cut} cut short); give a budget longer "
              f"than one cell (up to its timeout_s), and `--dir {root}` resumes.",
              file=sys.stderr)
        return 2
    bw = hbm_bandwidth() if a.device != "cpu" else None
    parts = [header(frames, a.smoke, bw)] + list(own.values())
    for g in docs:
        body = table(frames[g], docs[g], bw, smoke=a.smoke, report=raw[g].get("report"),
                     out=root / g)
        left = frames[g].attrs.get("not_started")
        if left:
            body += f"\n\nbudget: {left} cell(s) not started; `--dir {root}` resumes them"
        parts.append(f"### {g} (repeats {len(docs[g]['grid'][REPEAT])})\n\n{body}")
    text = "\n\n".join(parts)
    text += "\n\n" + closing_line(frames, root)
    print(text)
    if a.out:
        from ..atomic import atomic_write_text
        atomic_write_text(a.out, text + "\n")
    failed = [g for g, f in frames.items() if len(f) and (f["status"] == "failed").any()]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main_bench())
