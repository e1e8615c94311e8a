"""Greedy generate == the dense no-cache reference, across page sizes, SWA, mixed lengths and
continuous batching (requests admitted mid-decode)."""
import pytest

from mtplab import Engine, RunConfig
from tests.helpers import assert_live_identity, random_prompts, reference_outputs

LENS = [1, 2, 7, 16, 33, 64, 200]


@pytest.mark.parametrize("model", ["random-tiny", "random-tiny-swa"])
@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_greedy_matches_dense_reference(model, page_size):
    # max_running 3 < 7 prompts with different lengths: new requests are admitted while
    # earlier ones are still decoding (continuous batching).
    eng = Engine(RunConfig(model=model, page_size=page_size, max_running_requests=3,
                           debug_invariants=True))
    V = eng.model.config.vocab_size
    prompts = random_prompts(7, LENS, V, seed=page_size)
    max_new = [6 + 3 * (i % 3) for i in range(len(prompts))]
    # Requests with different max_new_tokens through one scheduler run.
    sched_reqs = [eng.add_request(p, m, ignore_eos=True) for p, m in zip(prompts, max_new)]
    admitted_mid_decode = False
    while not eng.idle:
        running_before = len(eng.scheduler.running)
        eng.step()
        assert_live_identity(eng)
        if running_before and eng.scheduler.stats.prefill_steps > 1:
            admitted_mid_decode = True
    outs = [r.output_ids for r in sched_reqs]
    assert admitted_mid_decode
    assert outs == reference_outputs(eng.model, prompts, max_new)
    eng.check_invariants()


def test_generate_api_strings_and_ids():
    eng = Engine(RunConfig(model="random-tiny", page_size=4))
    ids = eng.tokenizer.encode("def f(x):")
    a = eng.generate(["def f(x):"], max_new_tokens=8, ignore_eos=True)
    b = eng.generate([ids], max_new_tokens=8, ignore_eos=True)
    assert a == b and len(a[0]) == 8
    st = eng.stats()
    assert st["tokens"] == 8 and st["decode_steps"] == 7 and st["tok_per_s"] > 0
    eng.check_invariants()


def test_eos_and_stop_ids_end_requests():
    eng = Engine(RunConfig(model="random-tiny"))
    out = eng.generate([[5, 6, 7]], max_new_tokens=10, ignore_eos=True)[0]
    stop = out[3]
    out2 = eng.generate([[5, 6, 7]], max_new_tokens=10, stop_ids=[stop], ignore_eos=True)[0]
    assert out2 == out[: out.index(stop) + 1]
    assert eng.stats()["finish_reasons"]["stop"] == 1
    eng.check_invariants()


def test_bad_requests_raise_clear_errors():
    eng = Engine(RunConfig(model="random-tiny", context_len=64))
    with pytest.raises(ValueError, match="exceeds context_len=64"):
        eng.generate([[5] * 60], max_new_tokens=10)
    with pytest.raises(ValueError, match="token ids must lie"):
        eng.generate([[5, 999]], max_new_tokens=2)
    with pytest.raises(ValueError, match="list of prompts"):
        eng.generate("abc", max_new_tokens=2)
    eng.check_invariants()


def test_greedy_decode_steps_skip_the_sampler(monkeypatch):
    """An all-greedy decode step ends in an argmax (its own captured graph on CUDA); the
    sampler runs only for prefill and for batches with temperature > 0. Tokens are the same."""
    import mtplab.speculative.segments as seg
    import mtplab.speculative.target_worker as tw
    eng = Engine(RunConfig(model="random-tiny", max_running_requests=2))
    calls = []
    real = tw.sample

    def spy(*a, **k):
        calls.append(1)
        return real(*a, **k)
    for mod in (tw, seg):                  # prefill's sampler, the decode step's
        monkeypatch.setattr(mod, "sample", spy)
    greedy = eng.generate([[5, 6, 7], [8, 9]], max_new_tokens=6, ignore_eos=True)
    st = eng.stats()
    assert len(calls) == st["prefill_steps"] and st["decode_steps"] > 0
    calls.clear()
    eng.generate([[5, 6, 7], [8, 9]], max_new_tokens=6, ignore_eos=True, temperature=0.7)
    assert len(calls) == eng.stats()["prefill_steps"] + eng.stats()["decode_steps"]
    for mod in (tw, seg):
        monkeypatch.setattr(mod, "sample", real)
    assert Engine(RunConfig(model="random-tiny", max_running_requests=2)).generate(
        [[5, 6, 7], [8, 9]], max_new_tokens=6, ignore_eos=True) == greedy
    eng.check_invariants()
