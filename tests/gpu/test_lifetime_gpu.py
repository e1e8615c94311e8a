"""Engine lifetime on CUDA, with the cyclic garbage collector off: `del eng` returns
torch.cuda.memory_allocated() to its baseline (KV pool, CUDA graphs and their pools, the
future map, meter ring) for each of 10 successive engines, and 8B-sized engines
(llama3-8b-like at its full 32 layers, about 16 GB each) build one after another in one
process. Each engine's figures are printed (`pytest -s`): docs/results/health/, "Engine
lifetime".

cuBLAS keeps a workspace per stream it ran on (torch's cache, bounded by the stream pool and
shared by every engine); it is cleared before each reading so that the reading counts what
the engine owned."""
from __future__ import annotations

import time

import pytest
import torch

from mtplab import Engine, RunConfig
from mtplab.nogc import gc_paused

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

MiB = 2 ** 20
CONFIGS = [
    dict(),
    dict(overlap=True, zero_bubble=True),
    dict(cuda_graphs=False, overlap=True),
    dict(draft="frozen_kv_mtp"),
    dict(draft="frozen_kv_mtp", overlap=True, zero_bubble=True, fold_seed=True),
    dict(draft="frozen_kv_mtp", overlap=True, zero_bubble=True, bubble_meter=True),
    dict(draft="eagle", topk=2, num_draft_tokens=4, overlap=True),
    dict(draft="eagle", overlap=True, zero_bubble=True, event_timeline=True),
    dict(draft="frozen_kv_mtp", topk=4, num_draft_tokens=8, page_size=16, overlap=True),
    dict(draft="eagle", cuda_graphs=False),
]


def allocated() -> int:
    torch.cuda.synchronize()
    torch._C._cuda_clearCublasWorkspaces()
    return torch.cuda.memory_allocated()


def test_memory_returns_to_baseline_after_each_del():
    with gc_paused(collect=True):
        base = allocated()
        for i, kw in enumerate(CONFIGS):
            eng = Engine(RunConfig(model="tiny-code", device="cuda", **kw))
            eng.generate(["def f(x):", "import os\n", "class A:"], max_new_tokens=24)
            eng.check_invariants()
            held = allocated() - base
            del eng
            left = allocated() - base
            print(f"lifetime engine {i} {kw}: held {held / MiB:.1f} MiB, after del "
                  f"{left / MiB:+.3f} MiB")
            assert abs(left) <= 0.01 * held, (i, kw, held, left)


def test_six_llama3_8b_sized_engines_build_one_after_another():
    with gc_paused(collect=True):
        base = allocated()
        for i in range(6):
            t0 = time.perf_counter()
            eng = Engine(RunConfig(model="llama3-8b-like@32", device="cuda", dtype="bfloat16",
                                   cuda_graph_max_bs=1, max_running_requests=2,
                                   context_len=2048, max_total_tokens=4096))
            build_s = time.perf_counter() - t0
            eng.generate([[1, 2, 3, 4]], max_new_tokens=4, ignore_eos=True)
            eng.check_invariants()
            held = allocated() - base
            del eng
            left = allocated() - base
            print(f"lifetime llama3-8b-like@32 engine {i}: build {build_s:.1f} s, held "
                  f"{held / 2**30:.2f} GiB, after del {left / MiB:+.3f} MiB")
            assert abs(left) <= 0.01 * held, (i, held, left)
