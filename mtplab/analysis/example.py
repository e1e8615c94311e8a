"""The example GPU run shipped with mtplab, so a machine without a GPU can see real bubbles.

A Kineto trace recorded by mtplab on an H100 (tiny-code, frozen_kv_mtp draft, overlap +
zero_bubble, CUDA graphs; three decode steps at batch 2) and its analysis as
`mtplab analyze --out` writes it (steps/gaps/streams.parquet, summary.json; default warm-up
skip). Opened by `mtplab plot --example`, `mtplab analyze --example` and notebook 05.
Rewrite the analysis files after an analyser change:  python -m mtplab.analysis.example
"""
from __future__ import annotations

import sys
from pathlib import Path

EXAMPLE_DIR = Path(__file__).resolve().parents[1] / "examples_data" / "h100_frozen_overlap"
EXAMPLE_TRACE = EXAMPLE_DIR / "gpu_frozen_overlap.pt.trace.json.gz"


def write_example_analysis(out_dir: Path = EXAMPLE_DIR) -> None:
    """(Re)compute the shipped analysis files of the example trace into `out_dir`."""
    from .bubbles import analyze_run, write_analysis

    write_analysis(analyze_run(EXAMPLE_TRACE), out_dir)


if __name__ == "__main__":
    write_example_analysis()
    print(f"wrote the analysis of {EXAMPLE_TRACE.name} to {EXAMPLE_DIR}")
    sys.exit(0)
