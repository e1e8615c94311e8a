"""`gc_paused()`: the cyclic garbage collector paused inside a block (restored only if it was
enabled). Two users: a CUDA graph capture (graphs/runner.py: a collection there may free a
dead graph, illegal while a stream captures) and the trace reader (analysis/trace_io.py:
no collection passes over the millions of objects a JSON parse makes). A leaf: no imports
from the package, no torch."""
from __future__ import annotations

import contextlib
import gc
from typing import Iterator


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
