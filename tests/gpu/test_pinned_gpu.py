"""Pinned staging/read-back rings and graph-runner staging on the GPU."""
import pytest
import torch

from mtplab.device import PinnedRing, resolve_device
from mtplab.graphs.runner import GraphRunner

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_h2d_ring_wraps_without_corrupting_in_flight_copies():
    dev = resolve_device("cuda")
    ring = PinnedRing(slab_bytes=1024, slabs=3)
    object.__setattr__(dev, "_staging", ring)          # a tiny ring: wraps every few calls
    side = torch.cuda.Stream()
    outs, want = [], []
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)                   # copies queue behind a busy stream
        for i in range(200):
            vals = list(range(i, i + 1 + i % 90))
            outs.append(dev.h2d(vals, torch.long))
            want.append(vals)
    torch.cuda.synchronize()
    assert all(o.tolist() == w for o, w in zip(outs, want))
    assert ring.waits > 0                               # wrapped onto slabs still in flight


def test_readback_and_large_requests():
    dev = resolve_device("cuda")
    x = torch.arange(10, device="cuda")
    h = dev.empty_pinned(x.shape, x.dtype)
    assert h.is_pinned()
    h.copy_(x, non_blocking=True)
    torch.cuda.synchronize()
    assert h.tolist() == list(range(10))
    big = PinnedRing(slab_bytes=64, slabs=2).take((100,), torch.long)   # > slab: fresh buffer
    assert big.is_pinned() and big.shape == (100,)


def test_graph_runner_staged_inputs_and_views():
    st = dict(a=torch.zeros(8, device="cuda", dtype=torch.long),
              b=torch.zeros(8, device="cuda", dtype=torch.long))
    r = GraphRunner(lambda a, b: a * 10 + b, st, dict(a=0, b=0), [4, 8])
    r.capture()
    a = r.stage("a", torch.arange(3, device="cuda"))
    assert a.data_ptr() == st["a"].data_ptr() and st["a"][3:4].tolist() == [0]
    out = r.run(dict(a=a, b=torch.ones(3, dtype=torch.long, device="cuda")))
    assert out.tolist() == [1, 11, 21]
    kept = out.clone()
    r.run(dict(a=torch.full((3,), 5, device="cuda"), b=torch.tensor([5, 1, 2], device="cuda")))
    assert out.tolist() == [55, 51, 52] and kept.tolist() == [1, 11, 21]   # a view: replaced


def test_graph_runner_copies_every_input_but_its_own_staged_view():
    st = dict(a=torch.zeros(4, device="cuda", dtype=torch.long),
              b=torch.zeros(4, device="cuda", dtype=torch.long))
    r = GraphRunner(lambda a, b: a * 10 + b, st, dict(a=0, b=0), [4])
    r.capture()
    a = r.stage("a", torch.tensor([1, 2], device="cuda"))       # static["a"][:2]
    assert r.run(dict(a=a, b=torch.tensor([3, 4], device="cuda"))).tolist() == [13, 24]
    st["a"][:2] = 7                                     # the staged view is read in place...
    assert r.run(dict(a=a, b=torch.tensor([0, 0], device="cuda"))).tolist() == [70, 70]
    a2 = torch.tensor([5, 6], device="cuda")            # ...any other tensor is copied in
    assert r.run(dict(a=a2, b=torch.tensor([0, 0], device="cuda"))).tolist() == [50, 60]
    assert st["a"][:2].tolist() == [5, 6]
