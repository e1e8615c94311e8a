"""The hot-path stream helpers of mtplab/device.py against torch's own."""
import pytest
import torch

from mtplab.device import current_cuda_stream, resolve_device

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_current_cuda_stream_follows_torch():
    assert current_cuda_stream() == torch.cuda.current_stream()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        assert current_cuda_stream() == s == torch.cuda.current_stream()
        assert current_cuda_stream() is current_cuda_stream()      # cached object
    assert current_cuda_stream() == torch.cuda.current_stream()


def test_device_stream_sets_and_restores_nested():
    dev = resolve_device("cuda")
    base = torch.cuda.current_stream()
    a, b = dev.new_stream(), dev.new_stream()
    with dev.stream(a):
        assert torch.cuda.current_stream() == a
        with dev.stream(b):
            assert torch.cuda.current_stream() == b == current_cuda_stream()
        assert torch.cuda.current_stream() == a
        with pytest.raises(RuntimeError):
            with dev.stream(b):
                raise RuntimeError("restored on error too")
        assert torch.cuda.current_stream() == a
    assert torch.cuda.current_stream() == base


def test_work_and_events_land_on_the_stream_made_current():
    """A sleep queued on `a` through Device.stream holds an event recorded there, not one on
    the default stream."""
    dev = resolve_device("cuda")
    a = dev.new_stream()
    ev_a, ev_0 = torch.cuda.Event(), torch.cuda.Event()
    with dev.stream(a):
        torch.cuda._sleep(100_000_000)
        ev_a.record(current_cuda_stream())
    ev_0.record(current_cuda_stream())
    ev_0.synchronize()
    assert not ev_a.query()              # still behind the sleep on `a`
    a.synchronize()
    assert ev_a.query()
