"""The example GPU run shipped with mtplab, so a machine without a GPU can see real bubbles.

A Kineto trace recorded by mtplab on an H100 (NVIDIA H100 80GB HBM3, torch 2.11, 2026-11-24):
the mtplab side of the peer run in docs/peers.md ("H100, 2026-11-24: EAGLE at
llama3-8b-like@8, bs 8"): llama3-8b-like@8 in bf16, EAGLE draft (3 steps, topk 1, simulated
accept length 2.5), overlap on (zero_bubble off), per-stage CUDA graphs, Triton attention,
decode at batch 8. The shipped file is the first 11 decode steps of its 20-step profiler
window (`cut_steps`); each kept step's figures equal those of the whole trace. With the
default warm-up skip, 10 steps are analysed. Beside it, its analysis as `mtplab analyze --out`
writes it (steps/gaps/streams.parquet, summary.json). Opened by `mtplab plot --example`,
`mtplab analyze --example` and notebook 05.

    python -m mtplab.analysis.example                   rewrite the analysis files (after an
                                                        analyser change)
    python -m mtplab.analysis.example --cut RAW [N]     cut the first N (default 11) decode
                                                        steps of trace RAW into the example
"""
from __future__ import annotations

import argparse
import gzip
from pathlib import Path

import orjson

EXAMPLE_DIR = Path(__file__).resolve().parents[1] / "examples_data" / "h100_eagle_overlap"
EXAMPLE_TRACE = EXAMPLE_DIR / "h100_eagle_overlap.pt.trace.json.gz"
EXAMPLE_STEPS = 11
# GPU-lane categories: kept when the host events kept launched them (correlation) or, for
# device-side annotations, opened them (External id); `ac2g` are the launch -> kernel arrows.
_LANE_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "cuda_sync", "ac2g"}


def cut_steps(raw: Path, dst: Path, n_steps: int) -> Path:
    """Write to `dst` the first `n_steps` step spans (`step[...]`) of Kineto trace `raw`:

        host   every event from the first kept step's start to the last one's end, and the
               annotations overlapping that window, whole (ProfilerStep#N)
        GPU    the kernels, copies and memsets those host events launched (correlation), the
               device-side annotations of the kept annotations (External id), their flows
        meta   every metadata event and the document's top-level keys
    Nothing is moved or made up, so the kept steps analyse as in the whole trace."""
    doc = orjson.loads(gzip.decompress(Path(raw).read_bytes()))
    ev = doc["traceEvents"]
    steps = sorted((e for e in ev if e.get("cat") == "user_annotation"
                    and e.get("name", "").startswith("step[")), key=lambda e: e["ts"])
    if len(steps) < n_steps:
        raise ValueError(f"{raw} has {len(steps)} step spans, fewer than the {n_steps} asked; "
                         "ask for fewer steps or record a longer profiler window.")
    t0, t1 = steps[0]["ts"], steps[n_steps - 1]["ts"] + steps[n_steps - 1]["dur"]
    host = [e for e in ev if e.get("ph") == "X" and e.get("cat") not in _LANE_CATS | {"Trace"}
            and (t0 <= e["ts"] <= t1 or (e.get("cat") == "user_annotation"
                                         and e["ts"] < t1 and e["ts"] + e["dur"] > t0))]
    corr = {e["args"]["correlation"] for e in host if "correlation" in (e.get("args") or {})}
    ext = {e["args"]["External id"] for e in host
           if e.get("cat") == "user_annotation" and "External id" in (e.get("args") or {})}
    lane = [e for e in ev if e.get("ph") == "X" and e.get("cat") in _LANE_CATS - {"ac2g"}
            and ((e.get("args") or {}).get("correlation") in corr
                 or (e.get("cat") == "gpu_user_annotation"
                     and (e.get("args") or {}).get("External id") in ext))]
    flows = [e for e in ev if e.get("cat") == "ac2g" and e.get("id") in corr]
    doc["traceEvents"] = [e for e in ev if e.get("ph") == "M"] + host + lane + flows
    Path(dst).write_bytes(gzip.compress(orjson.dumps(doc), compresslevel=9))
    return Path(dst)


def write_example_analysis(out_dir: Path = EXAMPLE_DIR) -> None:
    """(Re)compute the shipped analysis files of the example trace into `out_dir`."""
    from .bubbles import analyze_run, write_analysis

    write_analysis(analyze_run(EXAMPLE_TRACE), out_dir)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mtplab.analysis.example",
                                 description="rewrite the shipped example's analysis files")
    ap.add_argument("--cut", nargs="+", metavar=("RAW", "N"),
                    help=f"first cut the first N (default {EXAMPLE_STEPS}) decode steps of "
                         "trace RAW into the example")
    a = ap.parse_args(argv)
    if a.cut:
        if len(a.cut) > 2:
            ap.error("--cut takes RAW and at most one step count")
        EXAMPLE_DIR.mkdir(parents=True, exist_ok=True)
        cut_steps(Path(a.cut[0]), EXAMPLE_TRACE,
                  int(a.cut[1]) if len(a.cut) == 2 else EXAMPLE_STEPS)
    write_example_analysis()
    print(f"wrote the analysis of {EXAMPLE_TRACE.name} to {EXAMPLE_DIR}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
