"""`mtplab analyze` and `mtplab plot`: the trace analyser's command line (never imports torch).

    mtplab analyze TRACE|--example [--json] [--out DIR] [--skip-steps N]
    mtplab plot PATH|--example [--steps a:b] [--out FILE]

TRACE is a `.json` / `.json.gz` Kineto trace, or a folder holding exactly one
(`*.pt.trace.json[.gz]` preferred). `plot` also takes an event timeline (`timeline.parquet`)
or a run folder, and draws what there is: bubbles where the trace has a GPU, host lanes and
stage spans otherwise. `--example` opens the H100 run shipped with mtplab (analysis/example.py).
The first step is left out as warm-up when the trace has more than two (`WARMUP_STEPS`,
`bubbles.analyze_run`): `plot`, the demo and notebook 05 use the same rule, and `plot` prints
the same bubble line as `analyze`. Times print in µs, ms or s by magnitude, the unit in the header.
Bad input prints one line on stderr and exits with 2.
A reader that closes the pipe early (`| head`) ends the output quietly (exit 0).
Also runnable as `python -m mtplab.analysis.cli analyze|plot ...`.
"""
from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import orjson

from ..flags import FlagParser, nonneg_number, positive_number
from ..validate import check_out_file
from .causes import cause_help, cause_split
from .example import EXAMPLE_TRACE
from .trace_io import (
    CONSECUTIVE_KERNEL_DELAY_US,
    DEFAULT_WINDOW_US,
    GPU_ACTIVITY_CATS,
    WARMUP_STEPS,
    Trace,
    TraceError,
    load_trace,
)

if TYPE_CHECKING:
    from .bubbles import Analysis

# pandas (through .bubbles) is imported only once a trace has loaded: usage errors and bad
# traces answer without it (python -X importtime -m mtplab.cli analyze ...)

EXIT_BAD_INPUT = 2
DEFAULT_PLOT_STEPS = 20
MAX_WINDOWS = 1_000_000      # --window-us may cut a trace into at most this many windows
TIMELINE_COLUMNS = ("step", "stage", "stream", "host_start_us", "host_end_us")
JSON_STEP_KEYS = ("step", "name", "start_us", "dur_us", "busy_us", "bubble_us", "bubble_frac",
                  "launch_lead_us")
JSON_GAP_KEYS = ("step", "start_us", "gap_us", "cause", "before", "after")
JSON_STREAM_KEYS = ("stream", "busy_us", "idle_us", "idle_host_wait_us", "idle_kernel_wait_us",
                    "idle_other_us")


class _UsageError(Exception):
    """Bad command-line input detected after argument parsing."""


# a run folder's own JSON files (mtplab run --out DIR, a sweep cell): never its trace
RUN_JSON = ("manifest.json", "summary.json", "health.json", "results.json", "whatif.json")
METER_STAGES = "meter_stages.parquet"
EXAMPLE_PLOT = Path("traces") / "example" / "timeline.png"     # `plot --example` without --out


def resolve_trace(arg: str) -> Path:
    """The trace file named by `arg`: the file itself, or the single trace inside a folder."""
    p = Path(arg)
    if not p.is_dir():
        return p
    found = _find_trace(p)
    if found is None:
        if (p / "manifest.json").is_file():
            raise _UsageError(f"{p} is a run folder without a Kineto trace; record the run with "
                              f"--profile true (mtplab run) for one, or draw what it holds with "
                              f"mtplab plot {p}")
        raise _UsageError(f"{p} holds no .json or .json.gz trace; pass a trace file")
    return found


def _find_trace(p: Path) -> Path | None:
    """The single trace in folder `p`, None when it holds none."""
    for pattern in ("*.pt.trace.json", "*.pt.trace.json.gz"), ("*.json", "*.json.gz"):
        found = sorted(f for pat in pattern for f in p.glob(pat)
                       if f.is_file() and f.name not in RUN_JSON)
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            names = ", ".join(f.name for f in found[:5])
            more = ", ..." if len(found) > 5 else ""
            raise _UsageError(f"{p} holds {len(found)} traces ({names}{more}); pass one of them")
    return None


def _parser_analyze() -> FlagParser:
    ap = FlagParser(prog="mtplab analyze", description=(
        "Per-step GPU bubbles of a Kineto trace: device-level gaps with one cause each, the "
        f"first that applies: {cause_help()}; and per-stream idle time. Definitions: "
        "help(mtplab.analysis.causes), help(mtplab.analysis.bubbles)."))
    ap.add_argument("trace", nargs="?",
                    help="a .json/.json.gz Kineto trace, or a folder holding one")
    ap.add_argument("--example", action="store_true",
                    help="analyse the H100 example run shipped with mtplab")
    ap.add_argument("--json", action="store_true",
                    help="print one JSON object (steps, gaps, streams, summary; times in µs) "
                         "on stdout")
    ap.add_argument("--out", metavar="DIR",
                    help="write steps.parquet, gaps.parquet, streams.parquet, summary.json here")
    ap.add_argument("--skip-steps", type=int, default=None, metavar="N",
                    help=f"leave out the first N steps (default: {WARMUP_STEPS} as warm-up when "
                         f"the trace has more than {WARMUP_STEPS + 1}, else 0)")
    ap.add_argument("--device", type=int, default=None,
                    help="GPU index to analyse (default: the one with the most activity)")
    ap.add_argument("--kernel-delay-us", type=nonneg_number, default=CONSECUTIVE_KERNEL_DELAY_US,
                    help="HTA kernel-wait threshold for stream gaps, µs (default %(default)s)")
    ap.add_argument("--window-us", type=positive_number, default=DEFAULT_WINDOW_US,
                    help="window length when the trace has no step spans (default %(default)s)")
    return ap


def _parser_plot() -> FlagParser:
    ap = FlagParser(prog="mtplab plot", description=(
        "Draw the timeline of a run: host lanes with their stage spans and, where the trace "
        "has a GPU, one lane per GPU stream with kernels and the bubbles coloured by cause; "
        "a trace without GPU lanes (a CPU run) has no device bubble to draw."))
    ap.add_argument("path", nargs="?", help="a run folder, a .json/.json.gz Kineto trace, or "
                    "an event timeline .parquet")
    ap.add_argument("--example", action="store_true",
                    help="draw the H100 example run shipped with mtplab (real GPU bubbles)")
    ap.add_argument("--steps", metavar="A:B", default=None,
                    help="inclusive range of step numbers to draw, e.g. 10:20, 10: or :20 "
                         f"(default: all steps, or {DEFAULT_PLOT_STEPS} from the middle of "
                         "the run when it has more)")
    ap.add_argument("--out", metavar="FILE", default=None,
                    help="output .png/.svg/.pdf (default: timeline.png beside the input; "
                         f"{EXAMPLE_PLOT} with --example); the last line printed names it")
    ap.add_argument("--device", type=int, default=None, help="GPU index (default: busiest)")
    return ap


def _fail(prog: str, msg: str) -> int:
    print(f"{prog}: error: {msg}", file=sys.stderr)
    return EXIT_BAD_INPUT


def _input(arg: str | None, example: bool, what: str) -> str:
    if example and arg is not None:
        raise _UsageError(f"give {what} or --example, not both")
    if example:
        return str(EXAMPLE_TRACE)
    if arg is None:
        raise _UsageError(f"give {what}, or --example for the H100 run shipped with mtplab")
    return arg


def main_analyze(argv: Sequence[str] | None = None) -> int:
    """`mtplab analyze`: returns the exit code (0 ok, 2 bad input)."""
    ns = _parser_analyze().parse(argv)
    if isinstance(ns, int):
        return ns
    try:
        if ns.skip_steps is not None and ns.skip_steps < 0:
            raise _UsageError(f"--skip-steps must be >= 0, got {ns.skip_steps}")
        path = resolve_trace(_input(ns.trace, ns.example, "a trace"))
        tr = load_trace(path)
        _check_windows(tr, ns.window_us)
        from .bubbles import analyze_run, write_analysis
        res = analyze_run(tr, skip_steps=ns.skip_steps, device=ns.device,
                          consecutive_kernel_delay_us=ns.kernel_delay_us, window_us=ns.window_us)
        if ns.out:
            write_analysis(res, ns.out)
    except (TraceError, _UsageError, ValueError, OSError) as e:
        return _fail("mtplab analyze", str(e))
    if ns.json:
        _emit(orjson.dumps(to_json(res), option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
    else:
        _emit((format_report(res, path, default_skip=ns.skip_steps is None) + "\n").encode())
    return 0


def _emit(data: bytes) -> None:
    """Write to stdout; a reader that went away (`| head`) is not an error: the rest of the
    output is dropped and stdout points at /dev/null so the exit flush stays quiet."""
    try:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _check_windows(tr: Trace, window_us: float) -> None:
    """Fixed windows (traces without step spans) are arrays of the trace's span / window_us."""
    span = float(tr.end.max() - tr.ts.min()) if len(tr) else 0.0
    if span / window_us > MAX_WINDOWS:
        raise _UsageError(f"--window-us {window_us:g} cuts this trace's {span:,.0f} µs into more "
                          f"than {MAX_WINDOWS:,} windows; give at least "
                          f"{span / MAX_WINDOWS:.3g} µs")


def main_plot(argv: Sequence[str] | None = None) -> int:
    """`mtplab plot`: returns the exit code (0 ok, 2 bad input)."""
    ns = _parser_plot().parse(argv)
    if isinstance(ns, int):
        return ns
    try:
        arg = Path(_input(ns.path, ns.example, "a run folder, a trace or a timeline .parquet"))
        steps = _step_range(ns.steps)
        out = (Path(ns.out) if ns.out else EXAMPLE_PLOT if ns.example
               else (arg if arg.is_dir() else arg.parent) / "timeline.png")
        if out == EXAMPLE_PLOT:       # the default's own folder, made on first use
            out.parent.mkdir(parents=True, exist_ok=True)
        check_out_file(out, "--out")
        fig = plot_source(arg, steps=steps, device=ns.device, path=out)
    except (TraceError, _UsageError, ValueError, OSError) as e:
        return _fail("mtplab plot", str(e))
    res = getattr(fig, "analysis", None)
    _emit(((wall_line(res.summary) + "\n") if res is not None else "").encode()
          + f"{out}\n".encode())
    return 0


def plot_source(arg: str | Path, *, steps: tuple[int | None, int | None] | None = None,
                device: int | None = None, path: str | Path | None = None):
    """Draw what `arg` holds (see `_plot_input`) and return the matplotlib Figure: the bubble
    timeline of a GPU trace, the host lanes of a CPU trace, or an event timeline's lanes."""
    src = _plot_input(Path(arg))
    from .bubbles import analyze_run
    from .plots import plot_event_timeline, plot_timeline  # matplotlib only on this path

    try:
        if isinstance(src, Path):
            df = _read_timeline(src)
            rng = _pick_steps(sorted(int(v) for v in df["step"].unique()), steps)
            return plot_event_timeline(df, steps=rng, path=path, title=src.name,
                                       alarms=_alarm_steps(src.parent))
        res = analyze_run(src, device=device)      # the warm-up rule of `mtplab analyze`
        fig = plot_timeline(src, res, steps=_pick_steps(res.steps["step"].tolist(), steps),
                            path=path)
        fig.analysis = res           # what the figure shows, for the caller's summary line
        return fig
    except OSError as e:       # the error names the temporary file: name the user's path
        raise _UsageError(f"cannot write the plot to {path} ({e.strerror or e}); check the "
                          "path and its folder") from None


def _plot_input(p: Path) -> Trace | Path:
    """What to draw for `p`: a .parquet file is an event timeline (its Path), another file a
    trace (loaded). In a run folder: its trace when the trace has a GPU, else its
    timeline.parquet (host spans of every step) when present, else the CPU trace."""
    if p.suffix == ".parquet":
        return p
    if not p.is_dir():
        return load_trace(p)
    trace, timeline = _find_trace(p), p / "timeline.parquet"
    if trace is None and not timeline.is_file():
        if (p / METER_STAGES).is_file():
            return p / METER_STAGES
        raise _UsageError(f"{p} holds no Kineto trace (.json/.json.gz), no timeline.parquet and "
                          f"no {METER_STAGES}; pass a run folder written with profile=True, "
                          "event_timeline=True or bubble_meter=True")
    if trace is None:
        return timeline
    tr = load_trace(trace)
    if timeline.is_file() and not tr.cat_mask(*GPU_ACTIVITY_CATS).any():
        return timeline
    return tr


def _alarm_steps(run_dir: Path) -> list:
    """The acceptance alarm's stretches a run folder's health.json records (Engine.finish),
    [] without one."""
    p = run_dir / "health.json"
    if not p.is_file():
        return []
    try:
        return orjson.loads(p.read_bytes()).get("accept_alarm_steps", [])
    except orjson.JSONDecodeError as e:
        raise _UsageError(f"{p} is not JSON ({e}); delete it or re-run the engine") from None


def _read_timeline(path: Path):
    import pandas as pd
    try:
        df = pd.read_parquet(path)
    except (OSError, ValueError) as e:
        raise _UsageError(f"{path} is not a readable parquet file ({e})") from None
    if path.name == METER_STAGES:
        df = _meter_as_timeline(df, path)
    missing = [c for c in TIMELINE_COLUMNS if c not in df.columns]
    if missing:
        raise _UsageError(f"{path} is not an event timeline: it lacks columns {missing} "
                          f"(has {list(df.columns)[:8]})")
    for c in ("gpu_start_us", "gpu_end_us"):
        if c not in df.columns:
            df[c] = float("nan")
    return df


def _meter_as_timeline(df, path: Path):
    """The bubble meter's stage intervals (step, stage, lane, start_us, end_us) as timeline
    lanes: one per lane, on the meter's clock (the GPU's on CUDA, the host's on CPU: the run
    folder's manifest says which)."""
    missing = [c for c in ("step", "stage", "lane", "start_us", "end_us") if c not in df.columns]
    if missing:
        raise _UsageError(f"{path} is not a bubble meter's stage table: it lacks columns "
                          f"{missing}")
    try:
        man = orjson.loads((path.parent / "manifest.json").read_bytes())
        device = str((man.get("config") or {}).get("device", ""))
    except (OSError, orjson.JSONDecodeError, AttributeError):
        device = ""
    nan = float("nan")
    gpu = device.startswith("cuda")
    out = df.rename(columns={"lane": "stream"})[["step", "stage", "stream"]].copy()
    out["host_start_us"] = nan if gpu else df["start_us"]
    out["host_end_us"] = nan if gpu else df["end_us"]
    out["gpu_start_us"] = df["start_us"] if gpu else nan
    out["gpu_end_us"] = df["end_us"] if gpu else nan
    return out


def _pick_steps(have: list[int], steps: tuple[int | None, int | None] | None
                ) -> tuple[int, int] | None:
    """The inclusive step range to draw: `--steps` with open ends filled in, else all steps or
    DEFAULT_PLOT_STEPS from the middle (said on stderr)."""
    if not have:
        raise _UsageError("the run has no steps to draw")
    if steps is not None:
        lo, hi = steps
        return (have[0] if lo is None else lo, have[-1] if hi is None else hi)
    if len(have) <= DEFAULT_PLOT_STEPS:
        return None
    mid = have[(len(have) - DEFAULT_PLOT_STEPS) // 2]
    print(f"mtplab plot: drawing steps {mid}:{mid + DEFAULT_PLOT_STEPS - 1} of {len(have)} "
          "(--steps A:B for others)", file=sys.stderr)
    return mid, mid + DEFAULT_PLOT_STEPS - 1


def _step_range(text: str | None) -> tuple[int | None, int | None] | None:
    if text is None:
        return None
    lo, sep, hi = text.partition(":")
    try:
        if not sep:
            raise ValueError
        a = int(lo) if lo.strip() else None
        b = int(hi) if hi.strip() else None
    except ValueError:
        raise _UsageError(f"--steps takes A:B (inclusive step numbers, either may be empty), "
                          f"got {text!r}") from None
    if a is not None and b is not None and b < a:
        raise _UsageError(f"--steps {text}: the end is before the start")
    return a, b


def to_json(res: "Analysis") -> dict[str, Any]:
    """The `--json` object: steps, gaps (device bubbles), streams, summary (NaN becomes null)."""
    gaps = res.device_gaps
    return {
        "steps": _records(res.steps, JSON_STEP_KEYS),
        "gaps": _records(gaps, JSON_GAP_KEYS),
        "streams": _records(res.streams, JSON_STREAM_KEYS),
        "summary": res.summary,
    }


def _records(df, keys: Sequence[str]) -> list[dict[str, Any]]:
    """`df[keys].to_dict("records")` with plain Python values, column-wise (pandas' row-wise
    boxing took most of `--json`'s time on large traces); NaN stays a float (JSON null)."""
    cols = [df[k].to_numpy().tolist() for k in keys]
    return [dict(zip(keys, row)) for row in zip(*cols)]


def time_unit(values_us) -> tuple[str, float]:
    """(unit, µs per unit) for a column of µs values: µs below 1 ms, ms below 10 s, else s."""
    finite = [abs(float(v)) for v in values_us if v == v]
    top = max(finite, default=0.0)
    return ("us", 1.0) if top < 1e3 else ("ms", 1e3) if top < 1e7 else ("s", 1e6)


def _t(v_us: float, scale: float) -> str:
    return f"{v_us / scale:.1f}" if scale == 1.0 else f"{v_us / scale:.3f}"


def wall_line(sm: dict[str, Any]) -> str:
    """The summary's wall / busy / bubble line, printed alike by `analyze` and `plot`."""
    u, sc = time_unit([sm["wall_us"]])
    frac = sm["bubble_frac"]
    if sm.get("device") is None:     # a CPU trace: busy is the host's time inside ops
        share = sm["busy_us"] / sm["wall_us"] if sm["wall_us"] > 0 else float("nan")
        return (f"wall    {_t(sm['wall_us'], sc)} {u}   host in ops {_t(sm['busy_us'], sc)} {u} "
                f"({'n/a' if math.isnan(share) else f'{share:.1%}'})   no GPU: no device bubbles")
    return (f"wall    {_t(sm['wall_us'], sc)} {u}   busy {_t(sm['busy_us'], sc)} {u}   bubble "
            f"{_t(sm['bubble_us'], sc)} {u} ({'n/a' if math.isnan(frac) else f'{frac:.1%}'}) "
            f"in {sm['n_gaps']} gaps")


def run_ahead_line(sm: dict[str, Any]) -> str:
    """The summary's run-ahead line: the share of steps whose next launch came before their
    GPU work ended, and the launch lead's percentiles (bubbles.py "Run-ahead")."""
    if not sm.get("run_ahead_steps"):
        return "ahead   n/a (no step with a next launch: needs step spans and GPU activity)"
    u, sc = time_unit([sm["launch_lead_p10_us"], sm["launch_lead_p90_us"]])
    return (f"ahead   {sm['run_ahead_frac']:.1%} of {sm['run_ahead_steps']} steps launched the "
            f"next before their GPU work ended; launch lead p10 / p50 / p90 "
            f"{_t(sm['launch_lead_p10_us'], sc)} / {_t(sm['launch_lead_p50_us'], sc)} / "
            f"{_t(sm['launch_lead_p90_us'], sc)} {u}")


def format_report(res: "Analysis", path: Path, max_rows: int = 20,
                  default_skip: bool = False) -> str:
    """A short human-readable table of the analysis, times in the unit their size calls for."""
    sm = res.summary
    k = sm["skip_steps"]
    if k:
        skipped = (f", first {k} skipped as warm-up (default; --skip-steps 0 keeps it)"
                   if default_skip else f", first {k} skipped (--skip-steps {k})")
    else:
        skipped = ", no step skipped" + (
            f" (warm-up is skipped only when there are more than {WARMUP_STEPS + 1})"
            if default_skip else "")
    u, sc = time_unit([sm["wall_us"]])
    lines = [f"trace   {path}",
             f"steps   {sm['n_steps']} from {sm['step_source']}{skipped}"
             + (f", device {sm['device']}" if sm["device"] is not None else ""),
             wall_line(sm)]
    if sm["device"] is not None:         # a CPU trace has no bubble to split
        lines.append("causes  " + "   ".join(f"{c} {_t(us, sc)} {u}"
                                            for c, us in cause_split(sm).items()))
    lines.append(run_ahead_line(sm))
    st = res.steps
    if len(st):
        rows = st.head(max_rows)
        u, sc = time_unit(rows["dur_us"])
        lines.append("")
        lines.append(f"{'step':>6} {'name':<24} {'dur_' + u:>10} {'busy_' + u:>10} "
                     f"{'bubble_' + u:>10} {'bubble%':>8} {'gaps':>5} {'lead_' + u:>10}")
        for r in rows.itertuples():
            pct = "n/a" if math.isnan(r.bubble_frac) else f"{r.bubble_frac:.1%}"
            lead = "n/a" if math.isnan(r.launch_lead_us) else _t(r.launch_lead_us, sc)
            lines.append(f"{r.step:>6} {r.name[:24]:<24} {_t(r.dur_us, sc):>10} "
                         f"{_t(r.busy_us, sc):>10} {_t(r.bubble_us, sc):>10} {pct:>8} "
                         f"{r.n_gaps:>5} {lead:>10}")
        if len(st) > max_rows:
            lines.append(f"{'':>6} ... {len(st) - max_rows} more steps (--json or --out for all)")
    if len(res.streams):
        sr = res.streams
        u, sc = time_unit(list(sr["busy_us"]) + list(sr["idle_us"]))
        lines.append("")
        lines.append(f"{'stream':>6} {'busy_' + u:>10} {'idle_' + u:>10} {'host_wait_' + u:>12} "
                     f"{'kernel_wait_' + u:>14} {'other_' + u:>10}")
        for r in sr.itertuples():
            lines.append(f"{r.stream:>6} {_t(r.busy_us, sc):>10} {_t(r.idle_us, sc):>10} "
                         f"{_t(r.idle_host_wait_us, sc):>12} {_t(r.idle_kernel_wait_us, sc):>14} "
                         f"{_t(r.idle_other_us, sc):>10}")
    lines += [f"note    {n}" for n in sm["notes"]]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m mtplab.analysis.cli analyze|plot ...`."""
    args = list(sys.argv[1:] if argv is None else argv)
    commands = {"analyze": main_analyze, "plot": main_plot}
    if not args or args[0] not in commands:
        print("usage: python -m mtplab.analysis.cli {analyze,plot} TRACE [options]",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    return commands[args[0]](args[1:])


if __name__ == "__main__":
    sys.exit(main())
