"""KV exhaustion: more requests than fit complete correctly through waits and retractions."""
from mtplab import Engine, RunConfig
from tests.helpers import random_prompts


def test_more_requests_than_fit_complete_and_nothing_leaks():
    prompts = random_prompts(12, [5, 20, 40], 320, seed=1)
    roomy = Engine(RunConfig(model="random-tiny", page_size=4, context_len=128))
    want = roomy.generate(prompts, max_new_tokens=40, ignore_eos=True)
    # 12 requests x ~(40 prompt + 40 out) tokens, but only 3 rows' worth of KV (3 * 136).
    tight = Engine(RunConfig(model="random-tiny", page_size=4, context_len=128,
                             max_total_tokens=3 * 136, max_running_requests=8,
                             debug_invariants=True))
    got = tight.generate(prompts, max_new_tokens=40, ignore_eos=True)
    assert got == want
    st = tight.stats()
    assert st["retractions"] > 0, st
    assert st["finish_reasons"]["length"] == 12
    tight.check_invariants()
    assert tight.allocator.free_pages == tight.allocator.total_pages
