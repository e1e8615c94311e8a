"""The decode GEMM plan (RunConfig `decode_gemm`): for each weight shape of a model's GEMM
sites (models/linear.py), cuBLAS or the skinny Triton GEMM (kernels/gemv.py), whichever
measures faster on this device, side by side, before any graph is captured.

    sites     every (module, site, weight) of the models            `sites()`
    shapes    the sites grouped by (N, K, dtype, RoPE heads): a site whose output is RoPE'd
              and written to the KV cache (`site_rope`, the "qkv" site) is timed with that
              epilogue: cuBLAS then the RoPE kernel, against the skinny GEMM with it fused
              (kernels/qkv_rope.py) at each CANDIDATES launch it `fits`
    per shape device µs per call at each M in PLAN_ROWS, cuBLAS and every CANDIDATES
              launch: REPS passes over the shape's weights in turn captured in one CUDA graph
              (as a decode step runs them: no host launch cost), the median of TRIALS replays
              (at least ROTATE_BYTES of distinct weights, copies where the model has fewer,
              up to ROTATE_MAX: what a decode step reads comes from HBM, not L2) `measure()`
    choice    the launch with the least µs summed over PLAN_ROWS, where cuBLAS's sum is at
              least MARGIN times it; cuBLAS otherwise                          `choose()`
    apply     module.gemv = {site: launch} for the sites whose shape chose Triton

A choice is cached per (device, N, K, dtype, RoPE heads) for the process: engines built
later, on the same device, take the same kernels (tokens of two engines compare kernel for
kernel). The plan applies on CUDA to 16-bit weights outside deterministic mode;
`decode_gemm="cublas"`, a CPU, fp32 or deterministic run leave every site on F.linear
(`clear()`).
"""
from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, replace
from typing import Callable, Iterable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..device import graph_us
from ..kernels.fused_ops import rope_qkv_cache
from ..kernels.gemv import GemvConfig, PLAN_MAX_M, _gemv_triton
from ..kernels.qkv_rope import RopeShape, _qkv_rope_triton, fits
from .linear import NO_PLAN, GemmSites

logger = logging.getLogger("mtplab")

DECODE_GEMMS = ("auto", "cublas")      # RunConfig.decode_gemm (= config.py DECODE_GEMMS)
PLAN_ROWS = (1, PLAN_MAX_M)
# the last four for narrow weights (N = 2816 gives 88 tiles of 32 rows on 132 SMs): three
# split K (at N = 2816: 32 rows x 2 slices, 176 programs; 16 x 3, 528; 32 x 3, 264), and the
# first launch at 8 warps
CANDIDATES = (GemvConfig(32, 256, 1, 4, 4), GemvConfig(64, 128, 1, 4, 4),
              GemvConfig(16, 256, 1, 4, 4), GemvConfig(64, 256, 1, 8, 3),
              GemvConfig(32, 256, 2, 4, 4), GemvConfig(16, 256, 3, 4, 4),
              GemvConfig(32, 128, 3, 4, 4), GemvConfig(32, 256, 1, 8, 4))
MARGIN = 1.02           # Triton must beat cuBLAS by this much: a tie keeps cuBLAS
ROTATE_BYTES = 256 << 20
ROTATE_MAX = 64         # weights in a rotation at most (a small model's stay in L2 anyway)
TRIALS = 5              # graph replays timed
REPS = 2                # passes over the rotation a graph holds


@dataclass(frozen=True)
class Choice:
    """One weight shape's measurement and decision (µs summed over PLAN_ROWS)."""
    n: int
    k: int
    dtype: str
    rope: Optional[RopeShape]        # the RoPE epilogue both arms ran (None: a plain GEMM)
    sites: int                       # sites of this shape in the models planned
    cublas_us: float
    triton_us: float                 # the fastest candidate's
    launch: Optional[GemvConfig]     # None: cuBLAS

    def row(self) -> dict:
        """The engine's row: `epilogue` "rope" where both arms ran the RoPE epilogue."""
        d = asdict(self)
        del d["rope"]
        d["epilogue"] = None if self.rope is None else "rope"
        d["launch"] = None if self.launch is None else label(self.launch)
        return d


def label(c: GemvConfig) -> str:
    return f"{c.block_n}x{c.block_k} s{c.split_k} w{c.num_warps} st{c.num_stages}"


Site = tuple[GemmSites, str, torch.Tensor]
Measure = Callable[[list[torch.Tensor], Optional[RopeShape]], dict[Optional[GemvConfig], float]]
_CACHE: dict[tuple, Choice] = {}


def sites(*models: nn.Module) -> list[Site]:
    """Every GEMM site of the models, each module once."""
    seen, out = set(), []
    for model in models:
        for m in model.modules():
            if isinstance(m, GemmSites) and id(m) not in seen:
                seen.add(id(m))
                out += [(m, name, w) for name, w in m.gemm_sites().items()]
    return out


def choose(us: dict[Optional[GemvConfig], float]) -> tuple[Optional[GemvConfig], float]:
    """(the launch, its µs) from {None (cuBLAS) or a launch: µs}: the fastest launch where
    cuBLAS takes at least MARGIN times as long, else (None, the fastest launch's µs; NaN
    when no launch ran)."""
    launches = {c: t for c, t in us.items() if c is not None}
    if not launches:
        return None, float("nan")
    best = min(launches, key=launches.get)
    return (best if us[None] >= MARGIN * launches[best] else None), launches[best]


def _rotation(weights: list[torch.Tensor]) -> list[torch.Tensor]:
    """Distinct weights of one shape totalling at least ROTATE_BYTES, copies added up to
    ROTATE_MAX weights in all."""
    uniq = list({w.data_ptr(): w for w in weights}.values())
    nbytes = uniq[0].numel() * uniq[0].element_size()
    out = list(uniq)
    while len(out) * nbytes < ROTATE_BYTES and len(out) < ROTATE_MAX:
        out.append(uniq[len(out) % len(uniq)].clone())
    return out


def _arms(rope: Optional[RopeShape], w: torch.Tensor) -> dict:
    """{None (cuBLAS) or a launch: fn(x, w)}: the plain GEMMs, or with `rope` cuBLAS then the
    RoPE kernel beside the fused kernel at each launch that fits, on stand-in operands (a
    cos/sin table, positions and cache slots for up to PLAN_MAX_M rows: their values do not
    change the time)."""
    if rope is None:
        arms: dict = {None: F.linear}
        arms.update({c: (lambda x, w, c=c: _gemv_triton(x, w, c)) for c in CANDIDATES})
        return arms
    dev, d, nkv = w.device, rope.head_dim, max(rope.nkv, 1)
    table = torch.rand(2 * PLAN_MAX_M, d, device=dev)
    kc, vc = (torch.zeros(2 * PLAN_MAX_M, nkv, d, device=dev, dtype=w.dtype) for _ in "kv")
    idx = torch.arange(PLAN_MAX_M, device=dev)
    ops = (rope.nq, rope.nkv, kc, vc)

    def rows(x):                          # positions, cos, sin for x's rows
        return idx[:x.shape[0]] + PLAN_MAX_M, table, table

    def cublas(x, w):
        return rope_qkv_cache(F.linear(x, w), *rows(x), *ops, idx[:x.shape[0]])
    arms = {None: cublas}
    arms.update({c: (lambda x, w, c=c: _qkv_rope_triton(x, w, c, *rows(x), *ops,
                                                         idx[:x.shape[0]]))
                 for c in CANDIDATES if fits(c, rope)})
    return arms


def measure(weights: list[torch.Tensor],
            rope: Optional[RopeShape] = None) -> dict[Optional[GemvConfig], float]:
    """µs per call summed over PLAN_ROWS, per arm (None: cuBLAS), on the weights' device
    (module doc; with `rope`, each arm with the RoPE epilogue). CUDA only. A launch this
    device cannot compile or run (shared memory, an older architecture) is left out, logged
    once; out of memory is raised (`plan`)."""
    ws = _rotation(weights)
    n, k = ws[0].shape
    arms = _arms(rope, ws[0])
    total = dict.fromkeys(arms, 0.0)
    gen = torch.Generator(device=ws[0].device).manual_seed(0)
    for m in PLAN_ROWS:
        x = torch.randn(m, k, generator=gen, device=ws[0].device, dtype=ws[0].dtype)
        for a, fn in list(arms.items()):
            try:
                us = graph_us(lambda fn=fn, x=x: [fn(x, w) for w in ws], reps=REPS,
                              replays=TRIALS)
            except torch.OutOfMemoryError:
                raise
            except Exception as e:
                if a is None:
                    raise
                logger.warning("decode GEMM plan: launch %s fails on [%d, %d] (%s: %s); it "
                               "is left out.", label(a), n, k, type(e).__name__,
                               str(e).splitlines()[0] if str(e) else "")
                del arms[a], total[a]
                continue
            total[a] += us / len(ws)
    return total


def _key(m: GemmSites, site: str, w: torch.Tensor) -> tuple:
    return (str(w.device), w.device.index, *w.shape, str(w.dtype).removeprefix("torch."),
            m.site_rope(site))


def plan(*models: nn.Module, measure: Measure = measure) -> list[Choice]:
    """Measure (or take from the cache) every site shape of the models, set each module's
    `gemv` to the launches chosen, and return the choices, one per shape. A shape whose
    measurement runs out of device memory stays on cuBLAS (not cached)."""
    found = sites(*models)
    groups: dict[tuple, list[Site]] = {}
    for s in found:
        groups.setdefault(_key(*s), []).append(s)
    choices, launch = [], {}
    for key, group in groups.items():
        c = _CACHE.get(key)
        if c is None:
            try:
                us = measure([w for _, _, w in group], key[-1])
            except torch.OutOfMemoryError:
                c = Choice(*key[2:], 0, float("nan"), float("nan"), None)
            else:
                best, t = choose(us)
                c = _CACHE[key] = Choice(*key[2:], 0, us[None], t, best)
        choices.append(replace(c, sites=len(group)))
        launch[key] = c.launch
    per_module: dict[int, tuple[GemmSites, dict]] = {}
    for m, name, w in found:
        _, mine = per_module.setdefault(id(m), (m, {}))
        chosen = launch[_key(m, name, w)]
        if chosen is not None:
            mine[name] = chosen
    for m, mine in per_module.values():
        m.gemv = mine or NO_PLAN
    return choices


def clear(*models: nn.Module) -> None:
    """Every site back on cuBLAS."""
    for m, _, _ in sites(*models):
        m.gemv = NO_PLAN


def applies(mode: str, device: torch.device, dtype: torch.dtype, deterministic: bool) -> bool:
    """Whether a run's GEMM sites are planned (module doc)."""
    return (mode == "auto" and device.type == "cuda" and not deterministic
            and dtype in (torch.bfloat16, torch.float16))


def apply(mode: str, models: Iterable[nn.Module], device: torch.device, dtype: torch.dtype,
          deterministic: bool) -> list[dict]:
    """The engine's entry: plan the models where `applies`, else clear them; the choices as
    rows (Engine.gemm_plan)."""
    models = list(models)
    if not applies(mode, device, dtype, deterministic):
        clear(*models)
        return []
    return [c.row() for c in plan(*models)]
