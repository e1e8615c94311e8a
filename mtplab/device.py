"""One small device abstraction: streams, events and pinned memory that degrade to
synchronous no-ops on CPU, so the same engine code path runs in CI and on a GPU.

    Device("cuda") -> real streams/events, pinned host buffers, CUDA graphs allowed
    Device("cpu")  -> NullStream/NullEvent: every wait/record/synchronize is a no-op
                      (CPU ops are already executed in program order)
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch


class NullEvent:
    """CPU stand-in for torch.cuda.Event: work is already done when it is recorded."""

    def record(self, stream=None) -> None:
        pass

    def wait(self, stream=None) -> None:
        pass

    def synchronize(self) -> None:
        pass


class NullStream:
    """CPU stand-in for torch.cuda.Stream."""

    def wait_stream(self, other) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def synchronize(self) -> None:
        pass


@dataclass(frozen=True)
class Device:
    torch_device: torch.device

    @property
    def is_cuda(self) -> bool:
        return self.torch_device.type == "cuda"

    @property
    def name(self) -> str:
        if self.is_cuda:
            return torch.cuda.get_device_name(self.torch_device)
        import platform
        return f"cpu ({platform.processor() or platform.machine()})"

    def new_stream(self):
        return torch.cuda.Stream(self.torch_device) if self.is_cuda else NullStream()

    def current_stream(self):
        return torch.cuda.current_stream(self.torch_device) if self.is_cuda else NullStream()

    def stream(self, s):
        """Context manager making `s` current (no-op on CPU)."""
        return torch.cuda.stream(s) if self.is_cuda else contextlib.nullcontext()

    def new_event(self, timing: bool = False):
        return torch.cuda.Event(enable_timing=timing) if self.is_cuda else NullEvent()

    def synchronize(self) -> None:
        if self.is_cuda:
            torch.cuda.synchronize(self.torch_device)

    def h2d(self, data, dtype) -> torch.Tensor:
        """A host list as a device tensor without a host sync: staged in pinned memory and
        copied non-blocking on the current stream (`torch.tensor(x, device="cuda")` would be
        a synchronous copy that waits for the stream's queued work)."""
        t = torch.tensor(data, dtype=dtype)
        if not self.is_cuda:
            return t
        return t.pin_memory().to(self.torch_device, non_blocking=True)

    def empty_pinned(self, shape, dtype) -> torch.Tensor:
        """Host buffer for async D2H copies (pinned on CUDA, plain on CPU)."""
        return torch.empty(shape, dtype=dtype, pin_memory=self.is_cuda)


def resolve_device(name: str) -> Device:
    """'auto' picks cuda when present. Raises one clear sentence for an unusable device."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"device={name!r} was requested but no CUDA GPU is visible to torch "
            f"(torch {torch.__version__}); use device='cpu' or 'auto'.")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device={name!r} is not supported; use 'cpu', 'cuda' or 'auto'.")
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return Device(dev)
