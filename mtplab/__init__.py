"""mtplab: a workbench for spec-v2 speculative decoding with MTP drafts.

    from mtplab import Engine, RunConfig, ConfigError, ModelLoadError
"""
from .version import __version__

__all__ = ["Engine", "RunConfig", "ConfigError", "ModelLoadError", "__version__"]


def __getattr__(name):
    # Lazy so that `mtplab analyze` (profiling only) never imports torch.
    if name == "Engine":
        from .engine import Engine
        return Engine
    if name == "RunConfig":
        from .config import RunConfig
        return RunConfig
    if name in ("ConfigError", "ModelLoadError"):
        from . import errors                  # torch-free leaf
        return getattr(errors, name)
    raise AttributeError(name)
