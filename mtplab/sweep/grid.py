"""Grid files and cells: what a sweep runs.

A grid file (YAML) names settings; each setting is a `RunConfig` field, a `Workload` field, or
(notebook sweeps only) a notebook parameter:

    out: traces/sweeps/overlap      # output folder (`mtplab sweep --out` wins)
    timeout_s: 600                  # per-cell limit, seconds
    base:                           # shared by every cell
      model: random-tiny
      draft: frozen_kv_mtp
      simulate_accept_len: 2.5
    arms:                           # optional list of setting groups, crossed with the grid
      - {overlap: false}
      - {overlap: true}
    grid:                           # axes: the cartesian product, in file order
      batch_size: [1, 4, 16]
    exclude:                        # optional: a cell matching every key of an entry is dropped
      - {batch_size: 16, overlap: false}

A cell's settings are `base` ⊕ one grid point ⊕ one arm (later wins; cells that resolve to the
same id are run once). A `timeout_s` among a cell's settings overrides the file's for that cell
(it is not part of the cell id: re-running with a longer limit resumes the same cell). Validity:
the RunConfig is constructed here, in the parent; a `ConfigError` (or a workload that does not
fit the config) makes the cell *dropped*, with the one-sentence reason recorded. `batch_size` is
the concurrency: the default `max_running_requests` of the cell (an explicit value wins).

The cell id is a 12-hex-digit SHA-1 of the resolved settings (`asdict(RunConfig)` after
defaults and 'auto' are resolved, minus the output location, plus the workload and notebook
parameters), so the same cell gets the same id on every re-run and done cells are skipped.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ..config import RunConfig
from ..errors import ConfigError
from ..validate import check_fields, check_finite, check_min, is_real
from ..yamlfile import read_yaml

GRID_KEYS = ("out", "timeout_s", "base", "arms", "grid", "exclude")
# The most cells one grid file may expand to (axes' product x arms), checked before expanding.
MAX_CELLS = 100_000
# Resolved RunConfig fields that say where a cell writes, not what it runs: not hashed.
LOCATION_FIELDS = ("trace_dir", "run_name")


@dataclass(frozen=True)
class Workload:
    """What a cell feeds the engine. Field names are also the results-table column names.

    batch_size              concurrency: requests in flight (default max_running_requests)
    num_requests            requests in the measured generate (None -> batch_size); all are
                            queued at once, the scheduler keeps batch_size running
    prompt_len_tokens       tokens per prompt (random ids, seeded by the config seed)
    output_len_tokens       new tokens per request (ignore_eos: every request runs to the limit)
    warmup_output_len_tokens  new tokens of the warm-up generate before the measured one
                            (batch_size requests; 0 = none); warm-up steps are in no figure
    temperature             0 = greedy
    prompts                 "random" (token ids seeded by the config seed) or "code" (held-out
                            stdlib code through the model's tokenizer: real acceptance)
    repeat                  index of a repeated measurement: a `repeat: [0, 1, 2]` axis makes
                            distinct cells of the same run, interleaved in the grid's order
    check_lossless          also run the measured workload target-only (greedy) and count the
                            requests whose spec output diverges (mtplab/lossless.py)
    step_profile            also run the workload once with a StepClock: the host spans per
                            decode step beside the meter's stages, for `mtplab whatif`
                            (host_steps.parquet, whatif.json; sweep/step_profile.py)
    host_delay_us           a host delay planted after every engine step (a busy-wait in
                            on_step), in every generate of the cell
    host_stages             also measure the host µs per stage of a decode step and what the
                            host issues per step (replays, copies; mtplab/sweep/host.py)
    fail                    fault injection: the cell's process raises before building the
                            engine (the cell is `failed`)
    sleep_s                 fault injection: the cell's process sleeps this long first (with a
                            small timeout_s: a cell that times out; a slow cell to kill)
    """

    batch_size: int = 4
    num_requests: int | None = None
    prompt_len_tokens: int = 32
    output_len_tokens: int = 32
    warmup_output_len_tokens: int = 4
    temperature: float = 0.0
    prompts: str = "random"
    repeat: int = 0
    check_lossless: bool = False
    host_stages: bool = False
    step_profile: bool = False
    host_delay_us: float = 0.0
    fail: bool = False
    sleep_s: float = 0.0

    def __post_init__(self):
        check_fields(self)               # YAML types: `fail: "no"` is a string, not False
        check_finite(self, ("temperature", "sleep_s", "host_delay_us"))
        check_min(self, {"batch_size": 1, "prompt_len_tokens": 1, "output_len_tokens": 1,
                         "num_requests": 1, "warmup_output_len_tokens": 0, "repeat": 0,
                         "temperature": 0, "sleep_s": 0, "host_delay_us": 0})
        if self.prompts not in ("random", "code"):
            raise ConfigError(f"prompts must be 'random' or 'code', got {self.prompts!r}.")
        if self.check_lossless and self.temperature != 0:
            raise ConfigError("check_lossless compares greedy outputs; set temperature to 0.")

    @property
    def requests(self) -> int:
        return self.num_requests or self.batch_size

    def check_fits(self, cfg: RunConfig) -> None:
        """Raise ConfigError when a request of this workload cannot run under `cfg`."""
        need = self.prompt_len_tokens + max(self.output_len_tokens, self.warmup_output_len_tokens)
        if need > cfg.context_len:
            raise ConfigError(f"prompt_len_tokens + output_len_tokens = {need} exceeds "
                              f"context_len={cfg.context_len}; raise context_len or shorten.")

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]


@dataclass(frozen=True)
class Cell:
    """One point of the grid. `dropped` holds the reason when the settings are invalid (then
    `config` / `workload` may be None)."""

    cell_id: str
    settings: dict[str, Any]                 # as written: base ⊕ arm ⊕ grid point
    config: RunConfig | None = None       # resolved, trace_dir/run_name set by the runner
    workload: Workload | None = None
    params: dict[str, Any] = field(default_factory=dict)   # notebook-only parameters
    dropped: str | None = None
    timeout_s: float | None = None        # this cell's limit (None: the sweep's)


@dataclass(frozen=True)
class Grid:
    base: dict[str, Any]
    arms: list[dict[str, Any]]
    axes: dict[str, list[Any]]
    exclude: list[dict[str, Any]] = field(default_factory=list)
    out: str | None = None
    timeout_s: float = 600.0

    def points(self) -> list[dict[str, Any]]:
        """Every cell's settings, in order: the axes in file order (last fastest), arms
        innermost, so the arms of one grid point run side by side."""
        names = list(self.axes)
        combos = itertools.product(*(self.axes[n] for n in names))
        grid_points = [dict(zip(names, c)) for c in combos]
        return [{**self.base, **pt, **arm} for pt in grid_points for arm in (self.arms or [{}])]

    def cells(self, *, notebook: str | None = None) -> list[Cell]:
        """The cells, once each (first occurrence of an id wins). Points that differ only in
        timeout_s are one cell (the limit is not hashed), so that is refused, not collapsed."""
        cells: dict[str, Cell] = {}
        for s in self.points():
            c = make_cell(s, notebook=notebook, exclude=self.exclude)
            first = cells.setdefault(c.cell_id, c)
            if first.timeout_s != c.timeout_s:
                raise ConfigError(
                    f"{first.settings} and {c.settings} differ only in timeout_s, so they are "
                    f"one cell ({c.cell_id}): a limit is not a setting; give them one "
                    "timeout_s (top level or base).")
        return list(cells.values())


def load_grid(path: str | Path, overrides: dict[str, Any] | None = None) -> Grid:
    """Read a grid file (yamlfile.read_yaml: one safe loader, one sentence per problem);
    `overrides` (e.g. from `--set key=value`) update `base`."""
    return grid_from_dict(read_yaml(path, f"grid file {path}"), overrides)


def grid_from_dict(doc: dict[str, Any], overrides: dict[str, Any] | None = None) -> Grid:
    """Check a grid file's structure; every problem is one ConfigError sentence."""
    if not isinstance(doc, dict):
        raise ConfigError("a grid file is a mapping with keys base, arms, grid, exclude, out, "
                          "timeout_s.")
    unknown = sorted(set(doc) - set(GRID_KEYS))
    if unknown:
        raise ConfigError(f"unknown grid-file keys {unknown}; use {list(GRID_KEYS)}.")
    base = doc.get("base") or {}
    if not isinstance(base, dict):
        raise ConfigError(f"base must be a mapping of settings (key: value), got {base!r}.")
    axes = doc.get("grid") or {}
    if not isinstance(axes, dict):
        raise ConfigError(f"grid must be a mapping of axes (setting: [values]), got {axes!r}.")
    for k, v in axes.items():
        if not isinstance(v, list) or not v:
            raise ConfigError(f"grid axis {k!r} must be a non-empty list of values, got {v!r}.")
    arms = doc.get("arms") or []
    if not isinstance(arms, list) or not all(isinstance(a, dict) for a in arms):
        raise ConfigError("arms must be a list of mappings (each a group of settings).")
    exclude = doc.get("exclude") or []
    if not isinstance(exclude, list) or not all(isinstance(e, dict) and e for e in exclude):
        raise ConfigError(f"exclude must be a list of non-empty mappings (settings a dropped "
                          f"cell matches), got {exclude!r}.")
    out = doc.get("out")
    if out is not None and not isinstance(out, str):
        raise ConfigError(f"out must be a folder path, got {out!r}.")
    n = math.prod(len(v) for v in axes.values()) * max(1, len(arms))
    if n > MAX_CELLS:
        sizes = " x ".join([str(len(v)) for v in axes.values()] +
                           ([f"{len(arms)} arms"] if arms else []))
        raise ConfigError(f"the grid expands to {n:,} cells ({sizes}), more than the limit of "
                          f"{MAX_CELLS:,} cells per grid file; split it or shorten its axes.")
    return Grid(base={**base, **(overrides or {})}, arms=arms, axes=axes, exclude=exclude,
                out=out, timeout_s=check_timeout(doc.get("timeout_s", 600.0)))


def check_timeout(v: Any) -> float:
    """A timeout in seconds: a positive number (ConfigError otherwise)."""
    if not is_real(v) or not 0 < v < math.inf:
        raise ConfigError(f"timeout_s must be a positive number of seconds, got {v!r}.")
    return float(v)


def make_cell(settings: dict[str, Any], *, notebook: str | None = None,
              exclude: list[dict[str, Any]] | None = None) -> Cell:
    """Resolve one cell's settings; invalid settings give a dropped cell with the reason.

    Without a notebook every key must be a RunConfig or Workload field; with one, other keys
    are notebook parameters."""
    cfg_names, wl_names = set(RunConfig.field_names()), set(Workload.field_names())
    timeout_s = settings.get("timeout_s")
    kw = {k: v for k, v in settings.items() if k != "timeout_s"}
    cfg_kw = {k: v for k, v in kw.items() if k in cfg_names}
    wl_kw = {k: v for k, v in kw.items() if k in wl_names}
    params = {k: v for k, v in kw.items() if k not in cfg_names | wl_names}
    nb = Path(notebook).name if notebook else None
    raw_id = _hash({"settings": kw, "notebook": nb})
    for rule in exclude or []:
        if all(k in settings and settings[k] == v for k, v in rule.items()):
            return Cell(raw_id, settings, params=params,
                        dropped=f"excluded by the grid file: {rule}")
    if notebook is None and params.get("backend") == "sglang":   # mtplab/sglang/sweep.py
        from ..sglang.sweep import check_params
        reason = check_params(params)
        if reason:
            return Cell(raw_id, settings, params=params, dropped=reason)
    elif params and notebook is None:
        return Cell(raw_id, settings, params=params, dropped=(
            f"unknown settings {sorted(params)}: not RunConfig or workload fields (notebook "
            "parameters need --notebook)."))
    try:
        if timeout_s is not None:
            timeout_s = check_timeout(timeout_s)
        workload = Workload(**wl_kw)
        cfg_kw.setdefault("max_running_requests", workload.batch_size)
        cfg_kw.setdefault("event_timeline", True)
        cfg = RunConfig(**cfg_kw)
        workload.check_fits(cfg)
        if notebook is None and params.get("backend") == "sglang":
            from ..sglang.sweep import check_cell
            check_cell(cfg, params)
    except (ConfigError, TypeError) as e:
        return Cell(raw_id, settings, params=params, dropped=str(e))
    resolved = {k: v for k, v in asdict(cfg).items() if k not in LOCATION_FIELDS}
    cid = _hash({"config": resolved, "workload": asdict(workload), "params": params,
                 "notebook": nb})
    return Cell(cid, settings, config=cfg, workload=workload, params=params, timeout_s=timeout_s)


def place(cfg: RunConfig, trace_dir: Path, run_name: str) -> RunConfig:
    """The config with its output location set (the location is not part of the cell id)."""
    return replace(cfg, trace_dir=str(trace_dir), run_name=run_name)


def _hash(obj: Any) -> str:
    blob = json.dumps(obj, sort_keys=True, default=repr).encode()
    return hashlib.sha1(blob).hexdigest()[:12]
