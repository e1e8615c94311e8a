"""A Jupyter kernelspec for *this* interpreter, so papermill runs notebooks in the same
environment as the caller (a fresh CI machine may have no usable `python3` kernelspec, or one
whose `python` on PATH is another interpreter)."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from ..atomic import atomic_write_text

KERNEL_NAME = "mtplab-python"


def local_kernel(root: str | Path, name: str = KERNEL_NAME,
                 env: dict[str, str] | None = None) -> tuple[str, dict[str, str]]:
    """Write `<root>/kernels/<name>/kernel.json` running `sys.executable -m ipykernel_launcher`;
    return (kernel name, `env` (default os.environ) with JUPYTER_PATH finding it first)."""
    spec_dir = Path(root) / "kernels" / name
    spec_dir.mkdir(parents=True, exist_ok=True)
    spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": f"mtplab ({sys.executable})", "language": "python",
            "metadata": {"debugger": False}}
    atomic_write_text(spec_dir / "kernel.json", json.dumps(spec, indent=1))
    env = dict(os.environ if env is None else env)
    env["JUPYTER_PATH"] = os.pathsep.join(p for p in (str(Path(root).resolve()),
                                                      env.get("JUPYTER_PATH", "")) if p)
    return name, env
