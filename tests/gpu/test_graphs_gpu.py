"""CUDA graph capture (graphs/runner.py) on CUDA: no garbage collection can run inside a
capture (one there may free a dead engine's graph, which is illegal while a stream captures
and invalidates the capture: the order-dependent failures this guards against)."""
import gc

import pytest
import torch

from mtplab.graphs.runner import GraphRunner

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("enabled", [True, False])
def test_the_collector_is_paused_inside_every_capture_and_restored(enabled):
    seen = []

    def fn(rows):
        if torch.cuda.is_current_stream_capturing():
            seen.append(gc.isenabled())
        return (rows.float() * 2).sin()
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        r = GraphRunner(fn, dict(rows=torch.zeros(8, dtype=torch.long, device="cuda")),
                        dict(rows=0), [1, 8])
        r.capture()
        assert seen == [False, False]                 # one capture per bucket
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()
    rows = torch.arange(5, device="cuda")
    torch.testing.assert_close(r.run(dict(rows=rows)), (rows.float() * 2).sin())
