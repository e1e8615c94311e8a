"""`gc_paused()`: the cyclic garbage collector paused inside a block (restored only if it was
enabled). Its users: a CUDA graph capture (graphs/runner.py: a collection there may free a
dead graph, illegal while a stream captures), the trace reader (analysis/trace_io.py:
no collection passes over the millions of objects a JSON parse makes), and, collected once
before (`collect=True`), timed benchmark runs and the lifetime tests (an engine that needed
the collector would stay alive).
`import_on_bare_thread(name)`: an import whose module leaves a frame in a reference cycle
(torch._dynamo: torch.fx.wrap keeps its own frame in a local) pins every frame of the
importing stack until the collector runs; torch imports it lazily on the first meta-device op
or profiler trace, which happen inside Engine construction and steps, and the engine's own
frames would then keep it alive after `del eng`. Done on a thread of its own, the import pins
nothing of the caller. A leaf: no imports from the package, no torch."""
from __future__ import annotations

import contextlib
import gc
import importlib
import sys
import threading
from typing import Iterator


def import_on_bare_thread(name: str) -> None:
    """Import module `name` on a new thread (a no-op once imported); an import error is left
    for the caller's own import to report."""
    if name in sys.modules:
        return

    def run() -> None:
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    t = threading.Thread(target=run, name=f"mtplab-import-{name}")
    t.start()
    t.join()


@contextlib.contextmanager
def gc_paused(collect: bool = False) -> Iterator[None]:
    """`collect`: one collection first, so that nothing the block did not make is left for
    the collector (timed runs, lifetime tests that must see what `del` frees by itself)."""
    if collect:
        gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
