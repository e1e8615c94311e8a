"""Shared test helpers (not a test module)."""
from __future__ import annotations

import functools
import gzip
import random
import weakref
from pathlib import Path

import orjson

from mtplab.models.reference import dense_greedy


def random_prompts(n: int, lens: list[int], vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(lens[i % len(lens)])] for i in range(n)]


def reference_outputs(model, prompts, max_new_tokens) -> list[list[int]]:
    """Target-only greedy by the dense no-cache oracle (ignore_eos semantics)."""
    return [dense_greedy(model, p, m) for p, m in zip(prompts, max_new_tokens)]


def assert_live_identity(engine) -> None:
    """len(prompt) + len(output_ids) == kv_committed_len + 1 for every live request (past
    its prefill: a chunked prefill under way has no output yet)."""
    for r in engine.scheduler.running:
        if r.prefilled < r.prefill_len:
            continue
        assert len(r.prompt_ids) + len(r.output_ids) == r.kv.kv_committed_len + 1, r.rid


class EngineWatch:
    """Checks every Engine built while installed: `check_invariants()` when it is closed
    (close(), the end of its `with` block, `del`) and, for one still open, at `verify()`
    (tests/conftest.py: the end of every test). An engine a test builds and never checks is
    checked anyway; a failure is kept and raised by `verify()`, naming the engine."""

    def __init__(self):
        self.open: weakref.WeakSet = weakref.WeakSet()     # built, not yet closed or checked
        self.failures: list[str] = []
        self._undo = None

    def install(self, engine_cls) -> None:
        init, close = engine_cls.__init__, engine_cls.close
        watch = self

        @functools.wraps(init)
        def watched_init(eng, *a, **kw):
            init(eng, *a, **kw)
            watch.open.add(eng)        # only a complete build: a partial one frees itself

        @functools.wraps(close)
        def watched_close(eng):
            if eng in watch.open:
                watch.open.discard(eng)
                watch.check(eng, "at close")
            close(eng)

        engine_cls.__init__, engine_cls.close = watched_init, watched_close
        self._undo = (engine_cls, init, close)

    def uninstall(self) -> None:
        if self._undo is not None:
            cls, cls.__init__, cls.close = self._undo
            self._undo = None

    def check(self, eng, when: str) -> None:
        if eng.__dict__.get("_closed", True):
            return
        try:
            eng.check_invariants()
        except Exception as e:                       # noqa: BLE001 -- kept, raised by verify
            self.open.discard(eng)                   # blamed once
            self.failures.append(f"Engine(model={eng.cfg.model!r}, draft={eng.cfg.draft!r}, "
                                 f"overlap={eng.cfg.overlap}) {when}: "
                                 f"{type(e).__name__}: {e}")

    def forget(self) -> None:
        """Stop watching every engine seen so far and drop their failures (a test that
        breaks an engine on purpose)."""
        self.open = weakref.WeakSet()
        self.failures = []

    def verify(self) -> None:
        """Check every engine still open (it stays watched: a module-scoped engine is
        checked after every test that may have used it), then raise an AssertionError
        listing every failed check since the last verify or forget."""
        for eng in list(self.open):
            self.check(eng, "at the end of the test")
        failures, self.failures = self.failures, []
        if failures:
            raise AssertionError("check_invariants() failed for an Engine this test built:\n"
                                 + "\n".join(failures))


ENGINES = EngineWatch()       # installed for the whole run by tests/conftest.py


def record_drafts(engine) -> list:
    """Wrap the engine's draft worker so every drafted token (each step's candidates, in
    order) is appended to the list returned."""
    drafted = []
    real = engine.worker.draft_worker.steps

    def spy(*a, **k):
        out = real(*a, **k)
        drafted.extend(t for c in out for t in c.tokens.flatten().tolist())
        return out
    engine.worker.draft_worker.steps = spy
    return drafted


def make_agreeable(engine, eps: float = 0.05, draft_attention: float = 0.0) -> None:
    """Turn the engine's target into a near-bigram model (attention and MLP outputs scaled by
    `eps`) and its draft into the exact bigram lm_head(norm(embed(token))), so drafts agree
    with the target most of the time but not always (always with eps=0: the target is that
    bigram). `draft_attention` scales the draft's attention output (0: off, the draft is
    the bigram whatever its KV holds; > 0: its KV layout shows in its tokens). Same seed +
    same call = same weights."""
    import torch
    t = engine.model
    H = t.config.hidden_size
    with torch.no_grad():
        for layer in t.model.layers:
            layer.self_attn.o_proj.weight.mul_(eps)
            for name, p in layer.mlp.named_parameters():      # dense or MoE (every expert's)
                if "down_proj" in name:
                    p.mul_(eps)
        d = engine.draft_model
        if d is None:
            return
        eye = torch.eye(H, dtype=t.lm_head.weight.dtype, device=t.lm_head.weight.device)
        if hasattr(d, "embed_tokens"):             # Gemma-4 assistant: own head, width Ha
            Ha = d.acfg.hidden_size                # a bigram on the first Ha features
            d.pre_projection.weight.zero_()
            d.pre_projection.weight[:, :Ha] = eye[:Ha, :Ha] / d.embed_scale
            d.post_projection.weight.copy_(eye[:, :Ha])
            d.embed_tokens.weight.copy_(t.lm_head.weight[:, :Ha])
            for layer in d.layers:
                layer.self_attn.o_proj.weight.mul_(draft_attention)
                layer.mlp.down_proj.weight.zero_()
            d.norm.weight.copy_(t.model.norm.weight[:Ha])
            return
        if hasattr(d, "pre_projection"):           # Frozen-KV assistant
            d.pre_projection.weight.zero_()
            d.pre_projection.weight[:, :H] = eye / d.embed_scale
            d.post_projection.weight.copy_(eye)
            layers = d.layers
        else:                                      # EAGLE draft
            d.fc.weight.zero_()
            d.fc.weight[:, :H] = eye
            layers = [d.layer]
        for layer in layers:
            layer.self_attn.o_proj.weight.mul_(draft_attention)
            layer.mlp.down_proj.weight.zero_()
        d.norm.weight.copy_(t.model.norm.weight)


def assert_drawn_png(path, min_share: float = 0.002) -> None:
    """`path` is a PNG with marks drawn on it: readable, of a figure's size, and at least
    `min_share` of its pixels in colour (every mtplab figure draws coloured bars, spans or
    curves; a blank canvas or bare axes, black and grey only, fail)."""
    import matplotlib.image as mpimg
    img = mpimg.imread(path)
    assert img.ndim == 3 and min(img.shape[:2]) >= 200, img.shape
    rgb = img[..., :3]
    share = float(((rgb.max(-1) - rgb.min(-1)) > 0.15).mean())
    assert share >= min_share, f"{path}: {share:.2%} of the pixels in colour: nothing drawn"


def assert_drawn_svg(path, min_paths: int = 20) -> None:
    """`path` is an SVG with a drawing on it: XML with at least `min_paths` path elements."""
    import xml.etree.ElementTree as ET
    root = ET.parse(path).getroot()
    n = sum(1 for e in root.iter() if e.tag.endswith("path"))
    assert n >= min_paths, f"{path}: {n} paths: a blank figure"


# ------------------------------------------------------------------ synthetic Kineto traces

BASE = 4463232744698.19  # a real Kineto-sized µs origin with a fractional part


class Synth:
    """Builds a Kineto-shaped trace: host spans, launch calls, GPU activity, GPU-lane
    annotations."""

    def __init__(self, base: float = BASE, pid: int = 4242, tid: int = 4242, device: int = 0):
        self.base, self.pid, self.tid, self.device = base, pid, tid, device
        self.events: list[dict] = [
            {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": "python"}},
            {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans",
             "tid": "PyTorch Profiler", "ts": base, "dur": 1e6},
        ]
        self.corr = 100
        self.activities: list[dict] = []

    def t(self, x: float) -> float:
        return self.base + x

    def host(self, name: str, x: float, dur: float, cat: str = "user_annotation") -> dict:
        ev = {"ph": "X", "cat": cat, "name": name, "pid": self.pid, "tid": self.tid,
              "ts": self.t(x), "dur": dur, "args": {}}
        self.events.append(ev)
        return ev

    def launch(self, x: float, name: str = "cudaLaunchKernel", dur: float = 2.0,
               tid: int | None = None) -> int:
        self.corr += 1
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": self.pid,
                            "tid": self.tid if tid is None else tid, "ts": self.t(x), "dur": dur,
                            "args": {"correlation": self.corr, "cbid": 211}})
        return self.corr

    def gpu(self, corr: int, x: float, dur: float, stream: int = 7, cat: str = "kernel",
            name: str = "kern") -> dict:
        ev = {"ph": "X", "cat": cat, "name": name, "pid": self.device, "tid": stream,
              "ts": self.t(x), "dur": dur,
              "args": {"device": self.device, "stream": stream, "correlation": corr,
                       "context": 1}}
        self.events.append(ev)
        self.activities.append(ev)
        return ev

    def gpu_ann(self, name: str, x: float, dur: float, stream: int = 7) -> None:
        self.events.append({"ph": "X", "cat": "gpu_user_annotation", "name": name,
                            "pid": self.device, "tid": stream, "ts": self.t(x), "dur": dur,
                            "args": {"External id": 1}})

    def doc(self) -> dict:
        return {"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 1},
                "deviceProperties": [], "traceEvents": self.events,
                "displayTimeUnit": "ms", "baseTimeNanoseconds": 1}

    def write(self, path: Path, gz: bool = False) -> Path:
        data = orjson.dumps(self.doc())
        path.write_bytes(gzip.compress(data) if gz else data)
        return path


def overlap_trace(path: Path, delay: float) -> Path:
    """A synthetic overlap run written to `path`: four 10 µs host steps, each launching one
    45 µs kernel 1 µs into its span. Back to back (delay 0) the kernels run at 5..50,
    50..95, 95..140, 140..185 against launches at 11, 21, 31: leads 39, 74, 109 µs, all
    ahead; with a host delay of `delay` = 100 µs after every step, launches at 111, 221, 331
    against ends at 50, 160, 270: leads -61 µs each, none ahead."""
    s = Synth()
    gpu_free = 0.0
    for k in range(4):
        t = k * (10 + delay)
        s.host("step[decode bs=1]", t, 10)
        start = max(t + 5, gpu_free)
        s.gpu(s.launch(t + 1), start, 45)
        gpu_free = start + 45
    return s.write(path)


def plain_pytorch_trace(steps: int = 4, ops: int = 12, *, planted: str | None = None) -> Synth:
    """A plain-PyTorch-shaped trace (no mtplab spans): ProfilerStep#N, each step a few
    python_function frames around aten ops; every op launches one short kernel, so the GPU
    waits on the host between kernels (work issued late while the host runs Python/aten).
    `planted`: one extra kernel per step, 21.5 µs after the step's last one, issued by a thread
    with no host event ("untraced": host:untraced) or with no launch call in the trace
    ("unlaunched": another process issued it, the one kind of gap left `other`)."""
    s = Synth()
    t = 0.0
    for k in range(steps):
        step0 = t
        for _ in range(ops):
            s.host("nn.Module: Linear", t + 1, 38, cat="python_function")
            s.host("aten::linear", t + 4, 30, cat="cpu_op")
            corr = s.launch(t + 20)
            s.gpu(corr, t + 26, 6.5)
            t += 40.0                      # 2 µs of Python between ops with no event
        if planted == "untraced":
            s.gpu(s.launch(t + 10, tid=777), t + 14, 3.0)
            t += 20.0
        elif planted == "unlaunched":
            s.gpu(10_000 + k, t + 14, 3.0)
            t += 20.0
        s.host(f"ProfilerStep#{k}", step0, t - step0)
    return s


def event_timeline_frame(n_steps: int = 4):
    """An event-timeline table (the columns of timeline.parquet): per step a host step span,
    `schedule` on the host, `verify` on forward and `d2h` on copy; host clocks only."""
    import pandas as pd
    rows = []
    for step in range(n_steps):
        t = 1000.0 * step
        rows += [(step, "step[decode bs=2]", "host", t, t + 900),
                 (step, "schedule", "host", t, t + 100),
                 (step, "verify", "forward", t + 200, t + 700),
                 (step, "d2h", "copy", t + 700, t + 750)]
    df = pd.DataFrame(rows, columns=["step", "stage", "stream", "host_start_us", "host_end_us"])
    return df.assign(gpu_start_us=float("nan"), gpu_end_us=float("nan"))


def _triton_language_state() -> list:
    """(namespace, a copy of its attributes) for every triton.language namespace the Triton
    interpreter patches while it runs a kernel (triton/runtime/interpreter.py `_patch_lang`)."""
    try:
        import triton.language as tl
    except ImportError:
        return []
    spaces = (tl, tl.core, tl.tensor, tl.math, tl.core.tensor_descriptor_base, tl.condition,
              tl.dtype)
    return [(ns, dict(vars(ns))) for ns in spaces]


# Taken when this module is first imported: tests/conftest.py imports it before any test runs,
# so before any kernel is interpreted.
_PRISTINE_TL = _triton_language_state()


def restore_triton_language() -> int:
    """Put back every triton.language attribute the interpreter left patched; returns how many.
    The interpreter patches triton.language in place around each kernel it runs, but a jit
    helper called outside a kernel (Triton 3.9: InterpretedFunction.__call__) patches it and
    never restores it; a compile afterwards then emits its IR through the interpreter's builder
    and fails (`'value' object has no attribute 'dtype'`)."""
    fixed = 0
    for ns, saved in _PRISTINE_TL:
        for name, value in saved.items():
            if vars(ns).get(name) is not value:
                setattr(ns, name, value)
                fixed += 1
    return fixed


def sm90_ptx(monkeypatch, kernel, signature: dict, constexprs: dict, num_warps: int = 4,
             do_not_specialize=()) -> str:
    """PTX of a @triton.jit kernel compiled ahead of time for an H100 (sm_90), always compiled
    afresh (an empty Triton cache: a cached kernel would skip the code generator under test).
    Under TRITON_INTERPRET=1 the kernel and the jit helpers it calls (and theirs) are
    interpreted functions: each is swapped for a JITFunction of its Python source for the
    compile, and triton.language is first restored from whatever the interpreter left
    patched. Skips only where this Triton install has no CUDA backend."""
    import tempfile

    import pytest
    triton = pytest.importorskip("triton")
    from triton.backends import backends
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    from mtplab.lazy_triton import LazyKernel
    if "nvidia" not in backends:
        pytest.skip(f"this Triton install ({triton.__version__}) has no CUDA backend.")
    if isinstance(kernel, LazyKernel):       # binds mtplab's kernel modules (lazy_triton.py)
        kernel = kernel.real()
    restore_triton_language()

    def as_jit(f, seen):
        g = f.fn.__globals__
        for name in f.fn.__code__.co_names:
            h = g.get(name)
            if hasattr(h, "fn") and callable(h.fn) and (id(g), name) not in seen:
                seen.add((id(g), name))          # per module: helpers are imported across
                monkeypatch.setitem(g, name, JITFunction(h.fn))
                as_jit(h, seen)
    as_jit(kernel, set())
    jit = JITFunction(kernel.fn, do_not_specialize=list(do_not_specialize))
    sig = dict(signature, **{k: "constexpr" for k in constexprs})
    with tempfile.TemporaryDirectory() as cache:
        monkeypatch.setenv("TRITON_CACHE_DIR", cache)
        return triton.compile(ASTSource(fn=jit, signature=sig, constexprs=constexprs),
                              target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": num_warps}).asm["ptx"]


def pin_four_experts_per_layer(model) -> None:
    """A router with zero weights and a bias that lifts 4 of 16 experts (a different 4 per MoE
    layer): every token of layer i goes to experts (i + 3j) % 16, j < 4."""
    import torch

    from mtplab.models.moe import moe_layers
    with torch.no_grad():
        for i, m in enumerate(moe_layers(model)):
            m.gate.weight.zero_()
            m.gate.bias.zero_()
            m.gate.bias[[(i + 3 * j) % 16 for j in range(4)]] = 10.0
