"""Where the running code comes from: the git commit of the checkout mtplab runs from, for the
manifests (config.py's run manifest, models/train.py's tiny-code manifest, the benchmarks'
result files). A leaf: imports nothing of mtplab.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Optional


def git_commit(package: Optional[Path] = None) -> Optional[str]:
    """MTP_GIT_COMMIT where set: the commit a copied tree was made from (a device's copy of a
    checkout can sit in a repository of its own whose HEAD is another commit). Else HEAD of
    the checkout mtplab runs from ("-dirty" with uncommitted changes to tracked files); only a
    checkout whose top is the folder holding the package counts: a copy of the tree inside
    another repository (a device's carried folder) would report that repository's HEAD. Else
    None. `package`: a file of the package (default this one)."""
    if os.environ.get("MTP_GIT_COMMIT"):
        return os.environ["MTP_GIT_COMMIT"]
    here = (package or Path(__file__)).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "--show-toplevel", "HEAD"], cwd=here,
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        out = None
    lines = out.stdout.split() if out is not None and out.returncode == 0 else []
    if len(lines) != 2 or Path(lines[0]).resolve() != here.parent:
        return None
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                           capture_output=True, text=True, timeout=5).stdout.strip()
    return lines[1] + ("-dirty" if dirty else "")
