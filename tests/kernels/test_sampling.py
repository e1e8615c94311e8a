import pytest
import torch

from mtplab import Engine, RunConfig
from mtplab.kernels.sampling import (SIMULATE, counter_uniform, position_uniform, sample,
                                     target_probs)
from tests.helpers import random_prompts


def test_counter_uniform_is_a_pure_function():
    s = torch.tensor([1, 2, 1])
    c = torch.tensor([5, 5, 5])
    u = counter_uniform(s, c, 100)
    assert torch.equal(u[0], u[2]) and not torch.equal(u[0], u[1])
    assert ((u > 0) & (u < 1)).all()
    mean = float(counter_uniform(torch.arange(2000), torch.zeros(2000), 50).mean())
    assert abs(mean - 0.5) < 0.01


def test_sampling_follows_the_distribution_and_top_p():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).repeat(20000, 1)
    n = logits.shape[0]
    t = torch.full((n,), 1.0)
    p = torch.ones(n)
    toks = sample(logits, t, p, torch.arange(n), torch.zeros(n, dtype=torch.long))
    freq = torch.bincount(toks, minlength=4).float() / n
    assert torch.allclose(freq, torch.softmax(logits[0], -1), atol=0.015)
    # top_p=0.7 keeps tokens {0, 1} (0.64 < 0.7 <= 0.88)
    toks = sample(logits, t, torch.full((n,), 0.7), torch.arange(n),
                  torch.zeros(n, dtype=torch.long))
    assert set(toks.tolist()) == {0, 1}
    want = target_probs(logits[:1], t[:1], torch.tensor([0.7]))[0]
    freq = torch.bincount(toks, minlength=4).float() / n
    assert torch.allclose(freq, want, atol=0.015)


def test_greedy_lanes_take_argmax():
    logits = torch.randn(8, 50)
    toks = sample(logits, torch.zeros(8), torch.ones(8), torch.arange(8),
                  torch.zeros(8, dtype=torch.long))
    assert torch.equal(toks, logits.argmax(-1))


def test_engine_sampling_is_reproducible_and_batch_independent():
    eng = Engine(RunConfig(model="random-tiny", page_size=4, max_running_requests=2))
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    a = eng.generate(prompts, max_new_tokens=10, temperature=1.0, seed=3, ignore_eos=True)
    eng2 = Engine(RunConfig(model="random-tiny", page_size=1, max_running_requests=8))
    b = eng2.generate(prompts, max_new_tokens=10, temperature=1.0, seed=3, ignore_eos=True)
    assert a == b
    c = eng.generate(prompts, max_new_tokens=10, temperature=1.0, seed=4, ignore_eos=True)
    assert c != a
    eng.check_invariants()


def _spec_engine(draft: str, **kw) -> Engine:
    return Engine(RunConfig(model="tiny-code", draft=draft, num_steps=3, page_size=4,
                            context_len=96, max_running_requests=8, device="cpu",
                            dtype="float32", **kw))


def test_position_uniform_is_keyed_by_position_not_step():
    seeds = torch.tensor([3, 3, 9])
    u = position_uniform(seeds, torch.tensor([10, 12, 10]), 4)
    assert torch.equal(u[0, 2:], u[1, :2])            # same seed, same positions 12, 13
    for k in range(4):
        one = position_uniform(seeds, torch.tensor([10 + k, 12 + k, 10 + k]), 1)[:, 0]
        assert torch.equal(u[:, k], one)
    assert not torch.equal(u[0], u[2])
    sim = position_uniform(seeds, torch.tensor([10, 12, 10]), 4, SIMULATE)
    assert not torch.isclose(sim, u).any()            # an independent stream


@pytest.mark.parametrize("draft", ["frozen_kv_mtp", "eagle"])
def test_speculative_sampling_does_not_depend_on_retraction(draft):
    """Every uniform is keyed by (request seed, the absolute position it decides): a retraction
    moves the step boundaries (the re-prefill changes the draft's inputs, hence accept lengths)
    but not the token drawn at any position -- which is the one target-only sampling draws."""
    prompts = random_prompts(8, [12, 20, 30], 256, seed=5)
    kw = dict(max_new_tokens=32, temperature=0.8, seed=11, ignore_eos=True)
    want = _spec_engine("none").generate(prompts, **kw)
    roomy = _spec_engine(draft)
    assert roomy.generate(prompts, **kw) == want
    roomy.check_invariants()
    tight = _spec_engine(draft, max_total_tokens=2 * 104)
    got = tight.generate(prompts, **kw)
    assert tight.stats()["retractions"] > 0, tight.stats()
    tight.check_invariants()
    assert got == want
