"""The process that runs one cell:  python -m mtplab.sweep.child SPEC.json [--parent PID]

SPEC.json (written by the runner): {"cell_id", "config" (resolved RunConfig fields),
"workload", "params", "settings", "notebook" (path or null), "notebook_out", "cell_dir",
"kernel_name"}. The child writes `result.json` beside the spec: {"status": "ok", ...metric
columns} or {"status": "failed", "error": "Type: message"}, and exits 0 / 1. Anything that
kills the process before that (OOM, a signal, a timeout) is reported by the runner.

With `--parent PID` (the runner always passes it) the cell dies with the process that started
it, so a `kill -9` of a sweep never leaves a cell running without its timeout:
  - Linux: PR_SET_PDEATHSIG = SIGKILL (set first thing; if PID is already gone, exit at once);
  - everywhere: a watchdog thread reads stdin, a pipe whose write end only the parent holds;
    EOF means the parent is gone, and the watchdog kills the cell's whole session (its own
    process group: notebook kernels included).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from ..atomic import atomic_write_text


def run_notebook(spec: dict[str, Any]) -> dict[str, Any]:
    """Execute the cell's notebook with papermill; the cell's settings, `out_dir` and `cell_id`
    are injected as parameters. Scalars of `<out_dir>/answer.json` become `nb.<key>` columns."""
    import papermill

    out_dir = Path(spec["cell_dir"]) / "out"
    params = {**spec["settings"], "out_dir": str(out_dir), "cell_id": spec["cell_id"]}
    papermill.execute_notebook(spec["notebook"], spec["notebook_out"], parameters=params,
                               kernel_name=spec["kernel_name"], progress_bar=False,
                               cwd=str(Path(spec["notebook"]).resolve().parent))
    row: dict[str, Any] = {"notebook_path": spec["notebook_out"]}
    answer = out_dir / "answer.json"
    if answer.is_file():
        for k, v in json.loads(answer.read_text()).items():
            if v is None or isinstance(v, (bool, int, float, str)):
                row[f"nb.{k}"] = v
    return row


PR_SET_PDEATHSIG = 1


def tie_to_parent(parent_pid: int) -> None:
    """Die when `parent_pid` dies (see the module docstring)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:           # the parent died before the tie was made
        os._exit(1)
    threading.Thread(target=_watch_stdin, name="parent-watchdog", daemon=True).start()


def _watch_stdin() -> None:
    try:
        while os.read(0, 4096):
            pass
    except OSError:
        pass
    if os.getpgid(0) == os.getpid():          # the runner's new session: take all of it
        os.killpg(0, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def run(spec: dict[str, Any]) -> dict[str, Any]:
    sleep_s = (spec.get("workload") or {}).get("sleep_s")
    if sleep_s:
        time.sleep(float(sleep_s))               # fault injection (grid.Workload.sleep_s)
    if spec.get("notebook"):
        return run_notebook(spec)
    from ..config import RunConfig
    from .grid import Workload
    if spec["params"].get("backend") == "sglang":      # a real SGLang server (mtplab.sglang)
        from ..sglang.sweep import run_cell
        w = Workload(**spec["workload"])
        return run_cell(RunConfig(**spec["config"]), w.batch_size, w.requests,
                        w.prompt_len_tokens, w.output_len_tokens, w.warmup_output_len_tokens,
                        spec["params"], Path(spec["cell_dir"]).parent / "sglang")
    from .measure import measure
    return measure(RunConfig(**spec["config"]), Workload(**spec["workload"]))


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[1] == "--parent":
        tie_to_parent(int(argv[2]))
    spec_path = Path(argv[0])
    spec = json.loads(spec_path.read_text())
    try:
        result = {"status": "ok", **run(spec)}
        code = 0
    except Exception as e:        # noqa: BLE001 -- any failure of the cell is its result
        traceback.print_exc()
        result = {"status": "failed", "error": _one_line(e)}
        code = 1
    atomic_write_text(spec_path.with_name("result.json"), json.dumps(result, default=str))
    return code


def _one_line(e: BaseException) -> str:
    """`Type: message` on one line; for a failed notebook the error raised inside it."""
    if hasattr(e, "ename") and hasattr(e, "evalue"):      # papermill.PapermillExecutionError
        name, msg = f"notebook cell {e.exec_count}: {e.ename}", str(e.evalue)
    else:
        name, msg = type(e).__name__, str(e)
    return f"{name}: {' '.join(msg.split())}"[:2000]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
