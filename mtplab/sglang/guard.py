"""python -m mtplab.sglang.guard LEASE IDLE_S -- CMD...

Runs CMD (an SGLang server) and ends it once the LEASE file has not been touched for IDLE_S
seconds, or when CMD exits. Sweep cells share one server through it (sweep.py): every cell
touches the lease, so the server lives from the first cell that needs it until IDLE_S after
the last, and no server outlives a sweep by more than that.
"""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    lease, idle_s, cmd = Path(argv[0]), float(argv[1]), argv[3:]
    proc = subprocess.Popen(cmd)

    def stop(*_):
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    while proc.poll() is None:
        try:
            idle = time.time() - lease.stat().st_mtime
        except FileNotFoundError:
            idle = idle_s + 1
        if idle > idle_s:
            stop()
        time.sleep(min(1.0, idle_s / 4))
    return proc.returncode or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
