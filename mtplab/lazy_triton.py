"""Triton, imported at a kernel's first use: CPU runs (torch references) never import it, and
an install without Triton runs everything but the kernels.

    from ..lazy_triton import tl, triton     # in a kernel module, instead of `import triton`
    @triton.jit(do_not_specialize=["n"])     # a LazyKernel: nothing is imported
    def _k(X, n, BLOCK: tl.constexpr): ...   # (annotations stay strings: __future__)
    _NEG = tl.constexpr(-1e30)               # a LazyConstexpr

    first use of a kernel (`_k[grid](...)`, `_k.fn`, ...) or of `triton.X` / `tl.X`
    (`triton.cdiv(...)` in a launcher)
      -> import triton, then bind: in every loaded mtplab module each global that is a lazy
         object becomes the real one (triton, triton.language, tl.constexpr(v), and
         triton.jit(fn, **options): a JITFunction, or an InterpretedFunction under
         TRITON_INTERPRET=1), so kernel bodies see real Triton and later launches cost nothing
         extra. A lazy object held elsewhere (a test's import) forwards to the real one.

The kernels are bound in one mode for the life of the process: TRITON_INTERPRET must be set
(or not) before the first kernel runs; `interpreting()` refuses a change after that in one
sentence. Imports nothing of mtplab and not torch (a leaf).
"""
from __future__ import annotations

import importlib.util
import os
import sys
from typing import Optional

_bound: Optional[bool] = None       # TRITON_INTERPRET when the kernels were bound; None: not yet
_found: Optional[bool] = None       # the triton package is installed (looked up once)
INSTALL = "pip install 'triton>=3.6,<3.10'"


class TritonMissingError(ImportError):
    """A Triton kernel was asked for and the triton package is not installed."""


class TritonModeError(RuntimeError):
    """TRITON_INTERPRET changed after the kernels were bound in the other mode."""


def available() -> bool:
    """The triton package is installed (looked up once, without importing it)."""
    global _found
    if _found is None:
        _found = "triton" in sys.modules or importlib.util.find_spec("triton") is not None
    return _found


def _env_interpret() -> bool:
    # Triton's own reading of the variable (knobs: getenv_bool)
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "on")


def interpreting() -> bool:
    """Whether mtplab's kernels run under the Triton interpreter (TRITON_INTERPRET=1); raises
    TritonModeError when the variable changed after the kernels were bound."""
    now = _env_interpret()
    if _bound is not None and _bound != now:
        raise TritonModeError(
            f"TRITON_INTERPRET was {'set' if now else 'unset'} after mtplab's Triton kernels "
            f"were loaded {'without' if now else 'under'} the interpreter; the mode is fixed "
            "when the first kernel runs, so set it (or not) before that, best before starting "
            "Python.")
    return now


def _import():
    """triton, imported, with every loaded kernel module bound (see the module map)."""
    global _bound
    if not available():
        raise TritonMissingError(
            "this needs the Triton kernels and the triton package is not installed: "
            f"{INSTALL} (a CUDA build of torch brings it), or on CPU use "
            "attention_backend='torch' and deterministic=False.")
    mode = interpreting()
    import triton
    import triton.language
    _bound = mode
    for name, mod in list(sys.modules.items()):
        if (name == "mtplab" or name.startswith("mtplab.")) and name != __name__ \
                and mod is not None:
            g = vars(mod)
            for key, value in list(g.items()):
                if isinstance(value, _Lazy):
                    g[key] = value.make(triton)
    return triton


class _Lazy:
    """A stand-in that `_import` replaces in module globals by `make(triton)`; any other
    use goes to the real object."""

    def make(self, triton):
        raise NotImplementedError

    def real(self):
        return self.make(_import())

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.real(), name)


class LazyKernel(_Lazy):
    """`triton.jit(fn, **options)`, made when Triton is imported; `.fn` is the function."""

    def __init__(self, fn, options: dict):
        self.fn, self.options, self._real = fn, options, None

    def make(self, triton):
        if self._real is None:
            self._real = triton.jit(self.fn, **self.options)
        return self._real

    def real(self):
        return self._real if self._real is not None else super().real()

    def __getitem__(self, grid):
        return self.real()[grid]

    def __call__(self, *args, **kwargs):
        return self.real()(*args, **kwargs)


class LazyConstexpr(_Lazy):
    def __init__(self, value):
        self.value, self._real = value, None

    def make(self, triton):
        if self._real is None:
            self._real = triton.language.constexpr(self.value)
        return self._real


class _Module(_Lazy):
    """`triton` or `triton.language`: `jit` and `constexpr` make lazy objects; any other
    attribute imports Triton."""

    def __init__(self, language: bool):
        self.language = language

    def make(self, triton):
        return triton.language if self.language else triton

    def jit(self, fn=None, **options):
        if fn is None:
            return lambda f: LazyKernel(f, options)
        return LazyKernel(fn, options)

    def constexpr(self, value):
        return LazyConstexpr(value)


triton = _Module(language=False)
tl = _Module(language=True)
