"""Import SGLang (the pinned `sglang-ref` extra, requirements/sglang-ref.txt) on a CPU machine,
for the differential tests. Test harness only: nothing here is part of mtplab.

SGLang's import chain pulls `torchvision` (a CUDA build is the only one published for this
torch), so a stand-in package answers `import torchvision...` with objects that raise when
used; transformers is imported first so it records torchvision as absent. SGLang 0.5.17
registers configs (e.g. `qwen3_asr`) that newer transformers already ship; registering them
again is allowed here. `torch.compile` wrappers inside SGLang's helpers run eagerly
(TORCHDYNAMO_DISABLE), and Triton kernels run in the interpreter (tests/conftest.py).
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import sys
import types

import pytest

SKIP_REASON = "sglang is not installed (pip install --no-deps -r requirements/sglang-ref.txt)"


class _Unavailable:
    """Any torchvision attribute: raises when called, so a real use cannot pass silently."""

    def __init__(self, name: str):
        self._name = name

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._name} needs torchvision, which the CPU test harness stubs.")

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Unavailable(f"{self._name}.{name}")


class _TorchvisionStandIn(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name == "torchvision" or name.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []

        def __getattr__(attr, _prefix=spec.name):
            if attr.startswith("__"):
                raise AttributeError(attr)
            return _Unavailable(f"{_prefix}.{attr}")

        module.__getattr__ = __getattr__
        return module

    def exec_module(self, module):
        pass


_LOADED: dict[str, types.ModuleType] = {}


def _prepare_import() -> None:
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
    os.environ.setdefault("TRITON_INTERPRET", "1")
    import transformers  # noqa: F401  (records torchvision as absent before the stand-in)
    from transformers import AutoConfig

    if not any(isinstance(f, _TorchvisionStandIn) for f in sys.meta_path):
        try:
            import torchvision  # noqa: F401
        except Exception:
            sys.modules.pop("torchvision", None)
            sys.meta_path.insert(0, _TorchvisionStandIn())
    if not getattr(AutoConfig.register, "_mtplab_tolerant", False):
        real = AutoConfig.register

        def register(model_type, config, exist_ok=False):
            return real(model_type, config, exist_ok=True)

        register._mtplab_tolerant = True
        AutoConfig.register = staticmethod(register)


def installed() -> bool:
    """SGLang's distribution is installed (a folder named `sglang` on sys.path is not SGLang)."""
    try:
        importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def sglang_module(name: str) -> types.ModuleType:
    """Import `name` from SGLang, or skip the calling test with one line when it is absent."""
    if not installed():
        pytest.skip(SKIP_REASON)
    if name not in _LOADED:
        _prepare_import()
        _LOADED[name] = importlib.import_module(name)
    return _LOADED[name]
