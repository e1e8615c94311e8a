"""On CUDA: a graph-captured target-only decode step launches no fill kernel (the attention
output of full lanes is not zeroed first; tests/kernels/test_decode_fills.py counts the ops on
CPU). Counted in a Kineto trace of three decode steps: torch's fill kernels (FillFunctor,
zero_); a library's own memsets (cuBLAS workspaces) are not the engine's."""
import re

import pytest
import torch

from mtplab import Engine, RunConfig
from mtplab.studies.long_context.floor_runner import ordered_activities
from tests.helpers import random_prompts

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

FILL = re.compile(r"fill|zero", re.I)


@pytest.mark.parametrize("bs", [1, 8])
def test_a_graph_captured_decode_step_launches_no_fill(bs):
    kw = dict(device="cuda", model="llama3-8b-like@4", dtype="bfloat16", context_len=512,
              page_size=16, overlap=True, zero_bubble=True, max_running_requests=bs)
    eng = Engine(RunConfig(**kw))
    for p in random_prompts(bs, [40], eng.model.config.vocab_size, seed=bs):
        eng.add_request(p, 40, ignore_eos=True)
    d0 = eng.scheduler.stats.decode_steps
    while eng.scheduler.stats.decode_steps - d0 < 4:        # the prefills, then decodes
        eng.step()
    acts = ordered_activities(lambda: [eng.step() for _ in range(3)])
    layers = eng.model.config.num_hidden_layers
    if len(acts) < 3 * layers:
        pytest.skip(f"the profiler saw {len(acts)} GPU activities in 3 graph replays")
    fills = [n for n, _ in acts if FILL.search(n)]
    assert fills == [], fills
    while not eng.idle:
        eng.step()
    eng.check_invariants()
    eng.close()
