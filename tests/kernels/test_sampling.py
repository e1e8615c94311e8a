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


# -- the Triton kernels (TRITON_INTERPRET=1 on CPU) against their torch references ----------
def test_position_uniform_kernel_is_the_reference_bit_for_bit():
    """The kernel's 32-bit hash equals counter_uniform's int64-masked ops, seeds and positions
    past 2^32 and 2^31 included (both take them mod 2^32), in both streams."""
    from mtplab.kernels.sampling import _position_uniform_triton, position_uniform_ref
    seeds = torch.tensor([3, 3, 9, 2**32 - 1, 12345678901, 0], dtype=torch.long)
    first = torch.tensor([10, 12, 10, 2**31 + 5, 7, 2**33 + 1])
    for stream in (0, SIMULATE):
        for n in (1, 4, 33):
            got = _position_uniform_triton(seeds, first, n, stream)
            want = position_uniform_ref(seeds, first, n, stream)
            assert got.dtype == torch.float64 and torch.equal(got, want), (stream, n)
    # int32 inputs (the engine's seq_lens) read the same
    got = _position_uniform_triton(seeds.int(), first.int(), 3, SIMULATE)
    assert torch.equal(got, position_uniform_ref(seeds.int(), first.int(), 3, SIMULATE))


@pytest.mark.filterwarnings("ignore:overflow encountered")
@pytest.mark.parametrize("rows,nodes,vocab", [(1, 4, 5000), (5, 2, 7), (3, 1, 4097)])
def test_finite_rows_kernel_matches_the_reference(rows, nodes, vocab):
    """Row chunks over several programs (split > 1) and one (split 1): each planted
    non-finite logit, and a hidden state whose fp32 sum of squares overflows while each of
    its squares is finite, flag their row and no other."""
    from mtplab.kernels.sampling import _finite_rows_triton, finite_rows_ref
    g = torch.Generator().manual_seed(rows * vocab)
    logits = torch.randn(rows * nodes, vocab, generator=g)
    hidden = torch.randn(rows * nodes, 64, generator=g).to(torch.bfloat16)
    want_ok = [True] * rows
    plants = [(float("nan"), 0), (float("inf"), -1), (float("-inf"), vocab // 2)]
    for r, (v, col) in zip(range(1, rows), plants):
        logits[r * nodes + nodes - 1, col] = v
        want_ok[r] = False
    if rows >= 3:
        hidden[(rows - 1) * nodes] = 3e18          # 64 squares of 9e36: the sum overflows
        want_ok[rows - 1] = False
    got = _finite_rows_triton(logits, hidden, rows)
    assert got.dtype == torch.bool and got.tolist() == want_ok
    assert torch.equal(got, finite_rows_ref(logits, hidden, rows))
