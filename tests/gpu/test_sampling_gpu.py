"""Position-keyed sampling on CUDA with graphs: speculative temperature sampling draws the
target-only tokens (fp32), with or without retraction; simulated acceptance (a captured
accept graph keyed by position) keeps its mean."""
import pytest
import torch

from mtplab import Engine, RunConfig
from tests.helpers import random_prompts

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

PROMPTS = random_prompts(8, [12, 20, 30], 256, seed=5)
KW = dict(max_new_tokens=32, temperature=0.8, seed=11, ignore_eos=True)


def engine(draft, **kw):
    return Engine(RunConfig(model="tiny-code", draft=draft, device="cuda", dtype="float32",
                            page_size=4, context_len=96, max_running_requests=8, **kw))


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("draft", ["frozen_kv_mtp", "eagle"])
def test_spec_sampling_matches_target_only_under_retraction(draft, overlap):
    want = engine("none", overlap=overlap).generate(PROMPTS, **KW)
    tight = engine(draft, overlap=overlap, max_total_tokens=2 * 104)
    got = tight.generate(PROMPTS, **KW)
    assert tight.stats()["retractions"] > 0
    tight.check_invariants()
    same = sum(a == b for a, b in zip(got, want))
    assert same == len(PROMPTS), f"{same}/{len(PROMPTS)} identical"


def test_simulated_accept_graph_keeps_the_mean():
    eng = Engine(RunConfig(model="random-tiny", draft="frozen_kv_mtp", device="cuda",
                           num_steps=3, simulate_accept_len=2.5, max_running_requests=32))
    eng.generate(random_prompts(32, [16], 320, seed=1), max_new_tokens=64, ignore_eos=True)
    eng.check_invariants()
    assert abs(eng.stats()["accept_len"] - 2.5) < 0.1, eng.stats()["accept_len"]
