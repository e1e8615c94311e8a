import torch

from mtplab import Engine, RunConfig
from mtplab.kernels.sampling import counter_uniform, sample, target_probs


def test_counter_uniform_is_a_pure_function():
    s = torch.tensor([1, 2, 1]); c = torch.tensor([5, 5, 5])
    u = counter_uniform(s, c, 100)
    assert torch.equal(u[0], u[2]) and not torch.equal(u[0], u[1])
    assert ((u > 0) & (u < 1)).all()
    assert abs(float(counter_uniform(torch.arange(2000), torch.zeros(2000), 50).mean()) - 0.5) < 0.01


def test_sampling_follows_the_distribution_and_top_p():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).repeat(20000, 1)
    n = logits.shape[0]
    t = torch.full((n,), 1.0); p = torch.ones(n)
    toks = sample(logits, t, p, torch.arange(n), torch.zeros(n, dtype=torch.long))
    freq = torch.bincount(toks, minlength=4).float() / n
    assert torch.allclose(freq, torch.softmax(logits[0], -1), atol=0.015)
    # top_p=0.7 keeps tokens {0, 1} (0.64 < 0.7 <= 0.88)
    toks = sample(logits, t, torch.full((n,), 0.7), torch.arange(n), torch.zeros(n, dtype=torch.long))
    assert set(toks.tolist()) == {0, 1}
    want = target_probs(logits[:1], t[:1], torch.tensor([0.7]))[0]
    freq = torch.bincount(toks, minlength=4).float() / n
    assert torch.allclose(freq, want, atol=0.015)


def test_greedy_lanes_take_argmax():
    logits = torch.randn(8, 50)
    toks = sample(logits, torch.zeros(8), torch.ones(8), torch.arange(8), torch.zeros(8, dtype=torch.long))
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
