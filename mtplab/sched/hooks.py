"""The per-step callbacks the scheduler runs after every engine step: the user's `on_step`
hooks, in the order added, then the profiler's step boundary.

    hooks = StepHooks(profiler)            # owned by the engine, called by its scheduler
    handle = hooks.add(fn)                 # fn(step_index); step_index counts from 0
    handle.remove()                        # True once, then False

StepHooks holds no reference to the engine, so the scheduler holding it makes no reference
cycle (an engine is freed by `del`). A hook that raises is removed and its error re-raised
once as StepHookError naming it: the step fails as any error inside a step does (its requests
are aborted, their KV freed) and later steps run without the hook.
"""
from __future__ import annotations

from typing import Callable


class StepHookError(RuntimeError):
    """An on_step hook raised; it has been removed."""


class HookHandle:
    """Removes one hook (`remove()`: True if it was still there)."""

    __slots__ = ("_fns", "_key")

    def __init__(self, fns: dict, key: int):
        self._fns, self._key = fns, key

    def remove(self) -> bool:
        return self._fns.pop(self._key, None) is not None


class StepHooks:
    def __init__(self, profiler=None):
        self._fns: dict[int, Callable[[int], object]] = {}    # key -> hook, in order added
        self._next_key = 0
        self.steps = 0                      # engine steps so far
        self.profiler = profiler            # its step() ends each step (None: no profiler)

    def add(self, fn: Callable[[int], object]) -> HookHandle:
        if not callable(fn):
            raise TypeError(f"on_step takes a callable fn(step_index); got a "
                            f"{type(fn).__name__}.")
        key, self._next_key = self._next_key, self._next_key + 1
        self._fns[key] = fn
        return HookHandle(self._fns, key)

    def __call__(self) -> None:
        i, self.steps = self.steps, self.steps + 1
        if self._fns:
            for key, fn in list(self._fns.items()):
                try:
                    fn(i)
                except Exception as e:
                    self._fns.pop(key, None)
                    raise StepHookError(
                        f"the on_step hook {_name(fn)} raised {type(e).__name__} at step {i}"
                        f"{': ' + str(e) if str(e) else ''}; it is removed, so later steps run "
                        "without it (fix it and add it again).") from e
        if self.profiler is not None:
            self.profiler.step()


def _name(fn) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


__all__ = ["HookHandle", "StepHookError", "StepHooks"]
