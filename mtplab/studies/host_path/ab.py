"""Did decode get slower or faster since COMMIT? Decode tok/s of the working tree vs an earlier
commit, each measured by its own tree's `mtplab sweep` (the one measurement procedure).

The commit is exported with `git archive` into a temporary folder; for each repeat, each tree
runs the same grid (ARMS: tiny-code, overlap + zero_bubble, CUDA graphs, profiler off) in its
own `mtplab sweep` process tree, so the trees alternate (old, new, old, new, ...) and every
cell is a fresh process. The grid uses only settings every tree with `mtplab sweep` knows
(random-token prompts), so COMMIT must have `mtplab sweep`.

    python -m benchmarks.bench_ab --commit b0a315c [--repeats 3] [--out FILE]

`--group host`: the host-stage grid of `mtplab bench --groups host`
(mtplab/studies/host_path/host.yaml, the working tree's, one repeat per sweep; `--arms 1`: its
overlap + zero_bubble arm alone) instead, compared on the host µs of a decode step
(`host_step_us`, mtplab/sweep/host.py): per draft, graph granularity, batch size and loop, the
ratio old / new (>= 1: the working tree's host is no slower), median over the alternating
sweeps. `--granularity` and `--bs` keep some of the grid's graph granularities and batch sizes.

    python -m benchmarks.bench_ab --commit 5349b33 --group host [--repeats 3] [--out FILE]
        [--arms 1] [--granularity step] [--bs 1]

One tree's host µs can differ by about 20% from one process to the next. Every sweep of both
trees runs with PYTHONHASHSEED=0 (the iteration order of a set of strings, and so the work a
step does, follows the process's string hash seed), and each ratio is printed with its 90%
bootstrap interval over the repeats (`ratio_interval`: each tree's repeats resampled, the
ratio of the resampled medians); an interval that holds 1 is within the noise.

`--budget-s S`: start a repeat only while the last repeat's time still fits before S seconds;
the table then covers the repeats that finished (its header says how many), and each sweep
prints a progress line to stderr.

`--old-tree DIR`: COMMIT's files already extracted there (a machine without the git history:
`git archive COMMIT | tar -x -C DIR` beforehand); COMMIT then only labels the table.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from mtplab.errors import ConfigError
from mtplab.studies.reports import REPO
from mtplab.studies.run_cells import emit

# Target-only spells out the zero_bubble sub-knobs that exist without a draft (the same
# resolved config): trees up to b0a315c reject zero_bubble=True without a draft
# when the sweep re-resolves the config.
ARMS = [{"draft": "none", "zb_device_seq_lens": True, "batch_size": 1},
        {"draft": "frozen_kv_mtp", "fold_seed": True, "zero_bubble": True, "batch_size": 1},
        {"draft": "frozen_kv_mtp", "fold_seed": True, "zero_bubble": True, "batch_size": 8}]
GRID = {"timeout_s": 600,
        "base": {"model": "tiny-code", "overlap": True, "context_len": 1024,
                 "prompt_len_tokens": 256, "output_len_tokens": 128,
                 "warmup_output_len_tokens": 16, "profile": False},
        "arms": ARMS}


HOST_AXES = ("cfg.draft", "cfg.graph_granularity", "batch_size", "cfg.overlap")
# Kept beside the host columns in OUT.cells.csv: the device side of the same steps (the bubble
# meter's wall and idle per step), which tells a slower host from a slower GPU.
DEVICE_COLUMNS = ("meter_wall_us_per_step", "bubble_us_per_step", "bubble_frac", "tok_per_s")
HASH_SEED = "0"                   # PYTHONHASHSEED of every sweep of both trees
LEVEL = 0.90                      # the ratio's bootstrap interval
RESAMPLES = 4000


def host_grid(tree: Path, arms: list[int] | None = None,
              granularity: list[str] | None = None, bs: list[int] | None = None) -> dict:
    """`mtplab bench --groups host`'s grid, one repeat (the sweeps alternate instead); `arms`:
    the indices of its arms to keep, `granularity` the graph granularities, `bs` the batch
    sizes (each: all when None). A batch size the grid does not hold is a ConfigError."""
    doc = yaml.safe_load((tree / "mtplab" / "studies" / "host_path" / "host.yaml").read_text())
    doc["grid"]["repeat"] = [0]
    if granularity is not None:
        doc["grid"]["graph_granularity"] = list(granularity)
    if bs is not None:
        held = doc["grid"]["batch_size"]
        lacking = [b for b in bs if b not in held]
        if lacking or not bs:
            raise ConfigError(f"--bs {' '.join(map(str, lacking))}: the host grid's batch sizes "
                              f"are {held}; give some of those.")
        doc["grid"]["batch_size"] = [b for b in held if b in bs]
    if arms is not None:
        doc["arms"] = [doc["arms"][i] for i in arms]
    return doc


def ratio_interval(num: list[float], den: list[float], level: float = LEVEL,
                   resamples: int = RESAMPLES, seed: int = 0) -> tuple[float, float]:
    """The percentile bootstrap interval (`level`) of median(num) / median(den): each side's
    repeats resampled with replacement, independently (the trees ran in separate processes),
    the ratio of the two resampled medians. Seeded: one table, one interval."""
    rng = np.random.default_rng(seed)
    n, d = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    mn = np.median(rng.choice(n, size=(resamples, n.size)), axis=1)
    md = np.median(rng.choice(d, size=(resamples, d.size)), axis=1)
    lo, hi = np.quantile(mn / md, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def ratio_cell(num: list[float], den: list[float], digits: int) -> str:
    """`median(num) / median(den)` and its bootstrap interval, as the table prints them."""
    r = statistics.median(num) / statistics.median(den)
    if min(len(num), len(den)) < 2:
        return f"{r:.{digits}f}x (one repeat)"
    lo, hi = ratio_interval(num, den)
    return f"{r:.{digits}f}x [{lo:.{digits}f}-{hi:.{digits}f}]"


def host_label(row) -> str:
    draft, gran, bs, overlap = (row[k] for k in HOST_AXES)
    loop = "overlap+zb" if str(overlap).lower() in ("true", "1") else "overlap off"
    return f"{'target-only' if draft == 'none' else 'frozen'} {gran} bs{bs} {loop}"


def label(arm: dict) -> str:
    return f"{'target-only' if arm['draft'] == 'none' else 'frozen'} bs{arm['batch_size']}"


def sweep_in(tree: Path, grid: Path, out: Path) -> pd.DataFrame:
    """Run `mtplab sweep` with `tree`'s mtplab (hash seed HASH_SEED); its results table."""
    env = dict(os.environ, PYTHONHASHSEED=HASH_SEED,
               PYTHONPATH=f"{tree}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    p = subprocess.run([sys.executable, "-m", "mtplab.cli", "sweep", str(grid), "--out",
                        str(out), "--no-progress"], cwd=tree, env=env, capture_output=True,
                       text=True)
    if p.returncode:
        raise RuntimeError(f"mtplab sweep in {tree} failed: "
                           f"{(p.stdout + p.stderr).strip().splitlines()[-1:]}")
    return pd.read_parquet(out / "results.parquet")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", required=True)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None)
    ap.add_argument("--group", choices=("decode", "host"), default="decode")
    ap.add_argument("--old-tree", default=None)
    ap.add_argument("--budget-s", type=float, default=float("inf"),
                    help="start a repeat only while the last one's time fits in this budget")
    ap.add_argument("--arms", type=int, nargs="+", default=None,
                    help="--group host: the indices of the host grid's arms to run (default all)")
    ap.add_argument("--granularity", nargs="+", choices=("stage", "step"), default=None,
                    help="--group host: the graph granularities to run (default both)")
    ap.add_argument("--bs", type=int, nargs="+", default=None, metavar="B",
                    help="--group host: the grid's batch sizes to run (default all)")
    a = ap.parse_args(argv)
    if a.group == "host":
        try:
            grid = host_grid(REPO, a.arms, a.granularity, a.bs)
        except ConfigError as e:
            print(f"bench_ab: {e}", file=sys.stderr)
            return 2
        return host_main(a, REPO, grid)
    res: dict[tuple[str, str], list[float]] = {}
    done = 0
    for r, name, df in alternating_sweeps(a, REPO, GRID):
        done = r + 1
        for arm, row in zip(ARMS, df.itertuples()):
            if row.status != "ok":
                raise RuntimeError(f"{name} {label(arm)}: {row.error}")
            res.setdefault((name, label(arm)), []).append(row.decode_tok_per_s)
    rows = [f"Decode tok/s, {a.commit} vs the working tree (tiny-code, overlap + zero_bubble, "
            f"graphs, profiler off; {done} alternating sweeps, one process per cell, "
            f"PYTHONHASHSEED={HASH_SEED}; median [min-max]; ratio = new / old [its {LEVEL:.0%} "
            "bootstrap interval over the repeats])", "",
            f"| arm | {a.commit} | working tree | ratio |", "|---|---|---|---|"]
    for arm in ARMS:
        o, n = res[(a.commit, label(arm))], res[("working tree", label(arm))]
        mo, mn = statistics.median(o), statistics.median(n)
        rows.append(f"| {label(arm)} | {mo:.0f} [{min(o):.0f}-{max(o):.0f}] | {mn:.0f} "
                    f"[{min(n):.0f}-{max(n):.0f}] | {ratio_cell(n, o, 2)} |")
    emit("\n".join(rows), a.out)
    return 0


def old_tree(a, here: Path, d: str) -> Path:
    """COMMIT's files: --old-tree, or a git archive of it under `d`."""
    if a.old_tree:
        return Path(a.old_tree).resolve()
    old = Path(d) / "old"
    old.mkdir()
    arch = subprocess.run(["git", "-C", str(here), "archive", a.commit], check=True,
                          capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(old)], input=arch, check=True)
    return old


def alternating_sweeps(a, here: Path, grid_doc: dict):
    """Yield (repeat, tree name, results table) of `grid_doc` swept by COMMIT's tree and the
    working tree in turn (old, new, old, new, ...), `a.repeats` times, in a temporary folder;
    a repeat starts only while the previous one's time fits in what is left of `a.budget_s`."""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        old = old_tree(a, here, d)
        grid = Path(d) / "grid.yaml"
        grid.write_text(yaml.safe_dump(grid_doc, sort_keys=False))
        trees = {a.commit: old, "working tree": here}
        last = 0.0
        for r in range(a.repeats):
            start = time.perf_counter()
            if start - t0 + last > a.budget_s:
                print(f"bench_ab: {r} of {a.repeats} repeats fit in --budget-s {a.budget_s:g}",
                      file=sys.stderr)
                return
            for name, tree in trees.items():
                s0 = time.perf_counter()
                df = sweep_in(tree, grid, Path(d) / f"{r}-{name.replace(' ', '_')}")
                print(f"bench_ab: repeat {r + 1}/{a.repeats}, {name}: "
                      f"{time.perf_counter() - s0:.0f} s", file=sys.stderr, flush=True)
                yield r, name, df
            last = time.perf_counter() - start


def host_main(a, here: Path, grid_doc: dict) -> int:
    """--group host (module doc): `grid_doc` run in both trees."""
    res: dict[tuple[str, str], list[float]] = {}
    order: list[str] = []
    cells: list[dict] = []            # every cell's host and DEVICE_COLUMNS, per stage
    done = 0
    for r, name, df in alternating_sweeps(a, here, grid_doc):
        done = r + 1
        for row in df.to_dict("records"):
            if row["status"] == "dropped":
                continue
            if row["status"] != "ok":
                raise RuntimeError(f"{name} {host_label(row)}: {row.get('error')}")
            key = host_label(row)
            if key not in order:
                order.append(key)
            res.setdefault((name, key), []).append(row["host_step_us"])
            cells.append({"tree": name, "repeat": r, "cell": key} |
                         {k: v for k, v in row.items()
                          if k.startswith("host_") or k in DEVICE_COLUMNS})
    rows = [f"Host µs per decode step, {a.commit} vs the working tree (`mtplab bench --groups "
            f"host`'s grid; {done} alternating sweeps, one process per cell, "
            f"PYTHONHASHSEED={HASH_SEED}; median [min-max]; ratio = old / new, >= 1: no slower "
            f"[its {LEVEL:.0%} bootstrap interval over the repeats])", "",
            f"| cell | {a.commit} | working tree | ratio |", "|---|---|---|---|"]
    for key in order:
        o, n = res[(a.commit, key)], res[("working tree", key)]
        mo, mn = statistics.median(o), statistics.median(n)
        rows.append(f"| {key} | {mo:.1f} [{min(o):.1f}-{max(o):.1f}] | {mn:.1f} "
                    f"[{min(n):.1f}-{max(n):.1f}] | {ratio_cell(o, n, 3)} |")
    emit("\n".join(rows), a.out)
    if a.out:      # the per-stage host µs beside the table: where a ratio comes from
        pd.DataFrame(cells).to_csv(Path(a.out).with_suffix(".cells.csv"), index=False)
    return 0

