"""`mtplab analyze` and `mtplab plot`: the trace analyser's command line (never imports torch).

    mtplab analyze TRACE [--json] [--out DIR] [--skip-steps N]
    mtplab plot TRACE [--steps a:b] [--out FILE]

TRACE is a `.json` / `.json.gz` Kineto trace, or a folder holding exactly one
(`*.pt.trace.json[.gz]` preferred). Bad input prints one line on stderr and exits with 2.
A reader that closes the pipe early (`| head`) ends the output quietly (exit 0).
Also runnable as `python -m mtplab.analysis.cli analyze|plot ...`.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import orjson

from .trace_io import CONSECUTIVE_KERNEL_DELAY_US, DEFAULT_WINDOW_US, TraceError, load_trace

if TYPE_CHECKING:
    from .bubbles import Analysis

# pandas (through .bubbles) is imported only once a trace has loaded: usage errors and bad
# traces answer without it (python -X importtime -m mtplab.cli analyze ...)

EXIT_BAD_INPUT = 2
DEFAULT_PLOT_STEPS = 20
JSON_STEP_KEYS = ("step", "start_us", "dur_us", "busy_us", "bubble_us", "bubble_frac")
JSON_GAP_KEYS = ("step", "start_us", "gap_us", "cause", "before", "after")
JSON_STREAM_KEYS = ("stream", "busy_us", "idle_us", "idle_host_wait_us", "idle_kernel_wait_us",
                    "idle_other_us")


class _UsageError(Exception):
    """Bad command-line input detected after argument parsing."""


def resolve_trace(arg: str) -> Path:
    """The trace file named by `arg`: the file itself, or the single trace inside a folder."""
    p = Path(arg)
    if not p.is_dir():
        return p
    for pattern in ("*.pt.trace.json", "*.pt.trace.json.gz"), ("*.json", "*.json.gz"):
        found = sorted(f for pat in pattern for f in p.glob(pat)
                       if f.is_file() and f.name not in ("manifest.json", "summary.json"))
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            names = ", ".join(f.name for f in found[:5])
            raise _UsageError(f"{p} holds {len(found)} traces ({names}{', ...' if len(found) > 5 else ''}); "
                              "pass one of them")
    raise _UsageError(f"{p} holds no .json or .json.gz trace; pass a trace file")


def _parser_analyze() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="mtplab analyze", description=(
        "Per-step GPU bubbles of a Kineto trace: device-level gaps with one cause each "
        "(sync, host_prep, launch, other) and per-stream idle time. Definitions: "
        "help(mtplab.analysis.bubbles)."))
    ap.add_argument("trace", help="a .json/.json.gz Kineto trace, or a folder holding one")
    ap.add_argument("--json", action="store_true",
                    help="print one JSON object (steps, gaps, streams, summary) on stdout")
    ap.add_argument("--out", metavar="DIR",
                    help="write steps.parquet, gaps.parquet, streams.parquet, summary.json here")
    ap.add_argument("--skip-steps", type=int, default=0, metavar="N",
                    help="leave out the first N steps (warm-up, graph capture); default 0")
    ap.add_argument("--device", type=int, default=None,
                    help="GPU index to analyse (default: the one with the most activity)")
    ap.add_argument("--kernel-delay-us", type=float, default=CONSECUTIVE_KERNEL_DELAY_US,
                    help="HTA kernel-wait threshold for stream gaps, µs (default %(default)s)")
    ap.add_argument("--window-us", type=float, default=DEFAULT_WINDOW_US,
                    help="window length when the trace has no step spans (default %(default)s)")
    return ap


def _parser_plot() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="mtplab plot", description=(
        "Draw the bubble timeline (host lane, one lane per GPU stream, stage spans, kernels, "
        "bubbles hatched red) of a Kineto trace."))
    ap.add_argument("trace", help="a .json/.json.gz Kineto trace, or a folder holding one")
    ap.add_argument("--steps", metavar="A:B", default=None,
                    help="inclusive range of step numbers to draw, e.g. 10:20, 10: or :20 "
                         f"(default: all steps, or {DEFAULT_PLOT_STEPS} from the middle of "
                         "the trace when it has more)")
    ap.add_argument("--out", metavar="FILE", default=None,
                    help="output .png/.svg/.pdf (default: timeline.png beside the trace)")
    ap.add_argument("--device", type=int, default=None, help="GPU index (default: busiest)")
    return ap


def _parse(ap: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace | int:
    try:
        return ap.parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error (2): argparse already printed
        return int(e.code or 0)


def _fail(prog: str, msg: str) -> int:
    print(f"{prog}: error: {msg}", file=sys.stderr)
    return EXIT_BAD_INPUT


def main_analyze(argv: Sequence[str] | None = None) -> int:
    """`mtplab analyze`: returns the exit code (0 ok, 2 bad input)."""
    ns = _parse(_parser_analyze(), argv)
    if isinstance(ns, int):
        return ns
    try:
        if ns.skip_steps < 0:
            raise _UsageError(f"--skip-steps must be >= 0, got {ns.skip_steps}")
        path = resolve_trace(ns.trace)
        tr = load_trace(path)
        from .bubbles import analyze, write_analysis
        res = analyze(tr, skip_steps=ns.skip_steps, device=ns.device,
                      consecutive_kernel_delay_us=ns.kernel_delay_us, window_us=ns.window_us)
        if ns.out:
            write_analysis(res, ns.out)
    except (TraceError, _UsageError, ValueError, OSError) as e:
        return _fail("mtplab analyze", str(e))
    if ns.json:
        _emit(orjson.dumps(to_json(res), option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
    else:
        _emit((format_report(res, path) + "\n").encode())
    return 0


def _emit(data: bytes) -> None:
    """Write to stdout; a reader that went away (`| head`) is not an error: the rest of the
    output is dropped and stdout points at /dev/null so the exit flush stays quiet."""
    try:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _check_out(out: Path) -> None:
    """Fail before the work, naming the user's path, when `out` cannot be written."""
    if out.is_dir():
        raise _UsageError(f"--out {out} is a folder; pass a file name ending in .png, .svg or .pdf")
    parent = next((q for q in out.parents if q.exists()), None)
    if parent is not None and not parent.is_dir():
        raise _UsageError(f"--out {out}: {parent} is a file, not a folder; pass a path in a folder")
    if parent is not None and not os.access(parent, os.W_OK):
        raise _UsageError(f"--out {out}: the folder {parent} is not writable; pass another path")


def main_plot(argv: Sequence[str] | None = None) -> int:
    """`mtplab plot`: returns the exit code (0 ok, 2 bad input)."""
    ns = _parse(_parser_plot(), argv)
    if isinstance(ns, int):
        return ns
    try:
        path = resolve_trace(ns.trace)
        steps = _step_range(ns.steps)
        out = Path(ns.out) if ns.out else path.parent / "timeline.png"
        _check_out(out)
        tr = load_trace(path)
        from .bubbles import analyze
        from .plots import plot_timeline  # matplotlib only on this path

        res = analyze(tr, device=ns.device)
        have = res.steps["step"]
        if steps is not None:
            lo, hi = steps
            steps = (int(have.min()) if lo is None else lo, int(have.max()) if hi is None else hi)
        elif len(have) > DEFAULT_PLOT_STEPS:
            mid = int(have.iloc[(len(have) - DEFAULT_PLOT_STEPS) // 2])
            steps = (mid, mid + DEFAULT_PLOT_STEPS - 1)
            print(f"mtplab plot: drawing steps {steps[0]}:{steps[1]} of {len(have)} "
                  "(--steps A:B for others)", file=sys.stderr)
        try:
            plot_timeline(tr, res, steps=steps, path=out)
        except OSError as e:       # the error names the temporary file: name the user's path
            raise _UsageError(f"cannot write the plot to {out} ({e.strerror or e}); check the "
                              "path and its folder") from None
    except (TraceError, _UsageError, ValueError, OSError) as e:
        return _fail("mtplab plot", str(e))
    _emit(f"{out}\n".encode())
    return 0


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


def format_report(res: "Analysis", path: Path, max_rows: int = 20) -> str:
    """A short human-readable table of the analysis."""
    from .bubbles import CAUSES
    sm = res.summary
    frac = sm["bubble_frac"]
    lines = [f"trace   {path}",
             f"steps   {sm['n_steps']} from {sm['step_source']}"
             + (f", first {sm['skip_steps']} skipped" if sm["skip_steps"] else "")
             + (f", device {sm['device']}" if sm["device"] is not None else ""),
             f"wall    {sm['wall_us']:.1f} us   busy {sm['busy_us']:.1f} us   bubble "
             f"{sm['bubble_us']:.1f} us ({'n/a' if math.isnan(frac) else f'{frac:.1%}'}) "
             f"in {sm['n_gaps']} gaps",
             "causes  " + "   ".join(f"{c} {sm[f'bubble_{c}_us']:.1f} us" for c in CAUSES)]
    st = res.steps
    if len(st):
        lines.append("")
        lines.append(f"{'step':>6} {'name':<24} {'dur_us':>10} {'busy_us':>10} {'bubble_us':>10} "
                     f"{'bubble%':>8} {'gaps':>5}")
        for r in st.head(max_rows).itertuples():
            pct = "n/a" if math.isnan(r.bubble_frac) else f"{r.bubble_frac:.1%}"
            lines.append(f"{r.step:>6} {r.name[:24]:<24} {r.dur_us:>10.1f} {r.busy_us:>10.1f} "
                         f"{r.bubble_us:>10.1f} {pct:>8} {r.n_gaps:>5}")
        if len(st) > max_rows:
            lines.append(f"{'':>6} ... {len(st) - max_rows} more steps (--json or --out for all)")
    if len(res.streams):
        lines.append("")
        lines.append(f"{'stream':>6} {'busy_us':>10} {'idle_us':>10} {'host_wait':>10} "
                     f"{'kernel_wait':>11} {'other':>10}")
        for r in res.streams.itertuples():
            lines.append(f"{r.stream:>6} {r.busy_us:>10.1f} {r.idle_us:>10.1f} "
                         f"{r.idle_host_wait_us:>10.1f} {r.idle_kernel_wait_us:>11.1f} "
                         f"{r.idle_other_us:>10.1f}")
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
