"""Import probe for an SGLang server: import every module the server path needs, and report
ALL missing modules and symbols in one pass instead of stopping at the first.

    python3 scripts/sglang_probe.py                 # on the GPU machine (real CUDA)
    python3 scripts/sglang_probe.py --fake-cuda     # here, CPU: see below

How: a finder at the end of sys.meta_path sees every import that nothing else could satisfy.
An import made (directly, or through the imports above it on the stack) inside
`try: ... except (ImportError|Exception)` is left to fail as it would (the code has a
fallback; reported as optional); any other one gets a permissive stub module so the
import goes on, and is reported as REQUIRED with the file:line that asked for it (a name
missing from a package, `from pkg import name`, shows up as the module `pkg.name`). A module
whose import still fails (a wrong version, a stub used at import time) is reported with its
error, and the next module is tried. The optional ones are listed by name only.

--fake-cuda (CPU, no GPU; run it in an environment holding only what the GPU image and the
carried wheels hold): torch.cuda is faked as one sm_90 device, so SGLang takes its CUDA import
paths, sgl_kernel's compiled ops are not loaded (its Python files are), and torchvision is
stubbed if it cannot import (give the environment a torchvision dist-info so transformers
sees a version). Exit status: 0 when nothing required is missing and every module imported.
"""
from __future__ import annotations

import argparse
import ast
import importlib
import importlib.abc
import importlib.machinery
import os
import pkgutil
import sys
import traceback
import types

# What `python -m sglang.launch_server` and the offline `sglang.Engine` with EAGLE or
# FROZEN_KV_MTP (v2 workers), the triton attention backend, the pytorch sampling backend,
# --grammar-backend none, --skip-tokenizer-init, dummy weights and a Llama target +
# LlamaForCausalLMEagle draft or a Gemma-4 target + Gemma4AssistantForCausalLM import, at module
# level or when they start (scheduler / tokenizer / detokenizer processes, model runner, CUDA
# graphs, profiler).
MODULES = [
    "sglang",
    "sglang.launch_server",
    "sglang.srt.server_args",
    "sglang.srt.entrypoints.http_server",
    "sglang.srt.entrypoints.engine",
    "sglang.srt.managers.tokenizer_manager",
    "sglang.srt.managers.detokenizer_manager",
    "sglang.srt.managers.scheduler",
    "sglang.srt.managers.scheduler_components.*",
    "sglang.srt.managers.tp_worker",
    "sglang.srt.managers.schedule_batch",
    "sglang.srt.managers.schedule_policy",
    "sglang.srt.managers.overlap_utils",
    "sglang.srt.configs.model_config",
    "sglang.srt.model_executor.model_runner",
    "sglang.srt.model_executor.model_runner_components.*",
    "sglang.srt.model_executor.runner.*",
    "sglang.srt.model_executor.runner_backend.*",
    "sglang.srt.model_loader.loader",
    "sglang.srt.model_loader.weight_utils",
    "sglang.srt.models.registry",
    "sglang.srt.models.llama",
    "sglang.srt.models.llama_eagle",
    "sglang.srt.layers.attention.attention_registry",
    "sglang.srt.layers.attention.triton_backend",
    "sglang.srt.layers.sampler",
    "sglang.srt.layers.logits_processor",
    "sglang.srt.speculative.spec_info",
    "sglang.srt.speculative.draft_worker_common",
    "sglang.srt.speculative.eagle_worker_common",
    "sglang.srt.speculative.eagle_worker_v2",
    "sglang.srt.speculative.eagle_info",
    "sglang.srt.speculative.eagle_utils",
    "sglang.srt.speculative.spec_utils",
    "sglang.srt.speculative.draft_utils",
    "sglang.srt.speculative.eagle_draft_cuda_graph_runner",
    "sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner",
    "sglang.srt.speculative.frozen_kv_mtp_worker_v2",
    "sglang.srt.speculative.frozen_kv_mtp_info",
    "sglang.srt.speculative.frozen_kv_mtp_utils",
    "sglang.srt.speculative.frozen_kv_mtp_cuda_graph_runner",
    "sglang.srt.models.gemma4_causal",
    "sglang.srt.models.gemma4_mtp",
    "sglang.srt.constrained.base_grammar_backend",
    "sglang.srt.utils.hf_transformers_utils",
    "sglang.srt.utils.profile_utils",
    "sglang.srt.utils.profile_merger",
    "sgl_kernel",
]
EXTRA_FILE = os.environ.get("MTP_PROBE_MORE", "")   # more modules, one a line
ONLY_EXTRA = os.environ.get("MTP_PROBE_ONLY_MORE") == "1"   # and not MODULES (tests)
# "pkg.*" stands for every direct submodule of pkg.


_TRIES: dict[str, list] = {}


def _guarded(filename: str, lineno: int) -> bool:
    """Whether line `lineno` of `filename` sits in a try whose handlers catch ImportError, or
    in `with contextlib.suppress(ImportError)`."""
    if filename not in _TRIES:
        spans = []
        try:
            with open(filename, encoding="utf-8") as f:
                tree = ast.parse(f.read())
        except (OSError, SyntaxError, ValueError):
            tree = None
        ok = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}
        for node in ast.walk(tree) if tree is not None else ():
            if isinstance(node, ast.With) and node.body:     # with contextlib.suppress(...)
                for item in node.items:
                    c = item.context_expr
                    fn = getattr(c, "func", None)
                    if getattr(fn, "id", getattr(fn, "attr", None)) == "suppress" and {
                            getattr(a, "id", getattr(a, "attr", None)) for a in c.args} & ok:
                        spans.append((node.body[0].lineno, node.body[-1].end_lineno))
            if isinstance(node, ast.Try) and node.body:
                for h in node.handlers:
                    types_ = ([] if h.type is None else
                              h.type.elts if isinstance(h.type, ast.Tuple) else [h.type])
                    ids = {getattr(n, "id", getattr(n, "attr", None)) for n in types_}
                    if h.type is None or ids & ok:
                        spans.append((node.body[0].lineno, node.body[-1].end_lineno))
                        break
        _TRIES[filename] = spans
    return any(a <= lineno <= b for a, b in _TRIES[filename])


def _callers() -> list:
    """(file, line) of every frame outside importlib and this file, innermost first."""
    out, f = [], sys._getframe(1)
    here = os.path.abspath(__file__)
    while f is not None:
        fn = f.f_code.co_filename
        if not fn.startswith("<frozen") and "importlib" not in fn and os.path.abspath(fn) != here:
            out.append((fn, f.f_lineno))
        f = f.f_back
    return out or [("?", 0)]


def _short(fn: str) -> str:
    """A path from its package root (site-packages/x/y.py -> x/y.py)."""
    for mark in ("site-packages/", "dist-packages/", "/lib/python3"):
        if mark in fn:
            return fn.split(mark, 1)[1]
    return os.path.relpath(fn) if fn != "?" else fn


def _importing() -> bool:
    """An import statement reaches the finders through _find_and_load_unlocked;
    importlib.util.find_spec (an availability probe) does not."""
    f = sys._getframe(2)            # above Recorder.find_spec
    while f is not None and f.f_code.co_name == "_find_spec":
        f = f.f_back
    return f is not None and f.f_code.co_name == "_find_and_load_unlocked"


class _Stub(types.ModuleType):
    """A module whose every attribute is a permissive placeholder (classes can subclass it)."""

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Any


class _AnyMeta(type):
    def __getattr__(cls, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Any

    def __call__(cls, *a, **k):
        if len(a) == 1 and callable(a[0]) and not k:    # used as a decorator
            return a[0]
        return _Any

    def __getitem__(cls, item):
        return _Any

    def __or__(cls, other):
        return _Any

    __ror__ = __or__

    def __iter__(cls):
        return iter(())

    def __bool__(cls):
        return False


class _Any(metaclass=_AnyMeta):
    def __init_subclass__(cls, **kwargs):     # class X(stub.Struct, frozen=True)
        pass


class _StubLoader(importlib.abc.Loader):
    def create_module(self, spec):
        m = _Stub(spec.name)
        m.__path__ = []          # a package, so submodules resolve to stubs too
        return m

    def exec_module(self, module):
        pass


class Recorder(importlib.abc.MetaPathFinder):
    """Last on sys.meta_path: sees only imports nothing else could satisfy."""

    def __init__(self):
        self.required: dict[str, set] = {}
        self.optional: dict[str, set] = {}

    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if isinstance(sys.modules.get(top), _Stub):
            return importlib.machinery.ModuleSpec(name, _StubLoader(), is_package=True)
        if not _importing():
            return None         # importlib.util.find_spec probing: answer "absent"
        frames = _callers()
        where = f"{_short(frames[0][0])}:{frames[0][1]}"
        if any(_guarded(fn, ln) for fn, ln in frames):
            self.optional.setdefault(name, set()).add(where)
            # fail as it would: the caller has a fallback
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        self.required.setdefault(name, set()).add(where)
        return importlib.machinery.ModuleSpec(name, _StubLoader(), is_package=True)


def fake_cuda() -> None:
    """Make torch (CPU build) look like one H100 for import-time checks."""
    import torch

    class Props:
        major, minor, name, multi_processor_count = 9, 0, "NVIDIA H100 80GB HBM3", 132
        total_memory, L2_cache_size, warp_size = 80 * 2**30, 50 * 2**20, 32
        gcnArchName = ""

    torch.version.cuda = "13.0"
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 1
    torch.cuda.current_device = lambda: 0
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
    torch.cuda.get_device_properties = lambda *a, **k: Props()
    torch.cuda.get_device_name = lambda *a, **k: Props.name
    torch.cuda.is_bf16_supported = lambda *a, **k: True
    torch.cuda.mem_get_info = lambda *a, **k: (70 * 2**30, 80 * 2**30)
    torch.cuda.set_device = lambda *a, **k: None
    # sgl_kernel: its Python files import; its compiled ops cannot load without CUDA.
    ext = importlib.machinery.ExtensionFileLoader
    create, execm = ext.create_module, ext.exec_module

    def create_module(self, spec):
        if "sgl_kernel" in (spec.origin or ""):
            return _Stub(spec.name)
        return create(self, spec)

    def exec_module(self, module):
        if not isinstance(module, _Stub):
            execm(self, module)

    ext.create_module, ext.exec_module = create_module, exec_module
    # torchvision: on a CPU machine only a CUDA build exists for the torch here; stub it
    # (give the environment a torchvision dist-info so transformers sees a version).
    try:
        import torchvision  # noqa: F401
    except Exception:  # noqa: BLE001
        sys.modules.pop("torchvision", None)

        class TorchvisionStandIn(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "torchvision":
                    return importlib.machinery.ModuleSpec(name, _StubLoader(), is_package=True)
                return None

        sys.meta_path.insert(0, TorchvisionStandIn())


REPORT = ["torch", "triton", "transformers", "tokenizers", "huggingface-hub", "numpy", "sglang",
          "sglang-kernel", "flashinfer-python", "xgrammar", "apache-tvm-ffi", "cuda-bindings",
          "nvidia-ml-py", "pydantic", "fastapi", "uvicorn"]


def report() -> None:
    """Versions of what the server leans on, the GPU, and nvcc (SGLang JIT-compiles kernels)."""
    import importlib.metadata as md
    import shutil

    def ver(name):
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return "ABSENT"

    print(f"python {sys.version.split()[0]} | " + ", ".join(f"{n} {ver(n)}" for n in REPORT))
    tools = " | ".join(f"{t} {shutil.which(t) or 'not on PATH'}" for t in ("nvcc", "ninja", "c++"))
    print(f"{tools} | CUDA_HOME "
          f"{os.environ.get('CUDA_HOME', '-')} | LD_LIBRARY_PATH entries "
          f"{len(os.environ.get('LD_LIBRARY_PATH', '').split(':'))}")
    try:
        import torch
        if torch.cuda.is_available():
            sm = "".join(map(str, torch.cuda.get_device_capability(0)))
            print(f"torch {torch.__version__} cuda {torch.version.cuda}: "
                  f"{torch.cuda.get_device_name(0)} sm_{sm}")
        else:
            print(f"torch {torch.__version__}: no CUDA device")
    except Exception as e:  # noqa: BLE001
        print(f"torch: {type(e).__name__}: {e}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fake-cuda", action="store_true",
                    help="CPU emulation: torch.cuda looks like one H100, "
                         "sgl_kernel's .so not loaded")
    ap.add_argument("--list-loaded", help="write the sorted sglang/sgl_kernel modules loaded here")
    args = ap.parse_args(argv)
    rec = Recorder()
    if args.fake_cuda:
        fake_cuda()
    report()
    sys.meta_path.append(rec)
    modules = [] if ONLY_EXTRA else list(MODULES)
    if EXTRA_FILE and os.path.exists(EXTRA_FILE):
        modules += [ln.strip() for ln in open(EXTRA_FILE) if ln.strip()]
    failed = {}
    expanded = []
    for mod in modules:
        if not mod.endswith(".*"):
            expanded.append(mod)
            continue
        try:
            pkg = importlib.import_module(mod[:-2])
            expanded += [f"{mod[:-2]}.{m.name}" for m in pkgutil.iter_modules(pkg.__path__)]
        except BaseException as e:  # noqa: BLE001
            failed[mod] = f"{type(e).__name__}: {e}"
    modules = expanded
    for mod in modules:
        try:
            importlib.import_module(mod)
        except BaseException as e:  # noqa: BLE001 - a probe reports everything
            tb = [fr for fr in traceback.extract_tb(e.__traceback__)
                  if not fr.filename.startswith("<frozen")][-4:]
            failed[mod] = f"{type(e).__name__}: {e}  [" + " > ".join(
                f"{_short(fr.filename)}:{fr.lineno}" for fr in tb) + "]"
    sys.meta_path.remove(rec)
    print(f"probe: python {sys.version.split()[0]}, {len(modules)} modules")
    opt = sorted({n.split(".")[0] for n in rec.optional})   # names only: they have fallbacks
    print(f"optional missing ({len(opt)} top-level, each import has a fallback): "
          f"{' '.join(opt) or '-'}")
    tops = sorted({n.split(".")[0] for n in rec.required})
    print(f"REQUIRED missing ({len(tops)} top-level): {' '.join(tops) or '-'}")
    for n in sorted(rec.required):
        print(f"    {n}  <- {', '.join(sorted(rec.required[n])[:3])}")
    print(f"modules that failed to import ({len(failed)}):")
    for m, err in failed.items():
        print(f"    {m}: {err[:600]}")
    if args.list_loaded:
        with open(args.list_loaded, "w") as f:
            for m in sorted(sys.modules):
                if m.split(".")[0] in ("sglang", "sgl_kernel"):
                    f.write(m + "\n")
    ok = not rec.required and not failed
    print("probe: OK" if ok else "probe: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
