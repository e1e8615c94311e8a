"""Greedy speculative output == target-only output over the spec grid, KV invariants clean.

Two weight settings per cell: random drafts (almost nothing accepted: the zero-accept path)
and "agreeable" drafts (tests/helpers.make_agreeable: mean accept length >= 2, so the
multi-accept, full-accept and topk>1 compaction paths run)."""
import itertools

import pytest

from mtplab import Engine, RunConfig
from tests.helpers import assert_live_identity, make_agreeable, random_prompts

PROMPTS = random_prompts(5, [1, 6, 23, 61, 140], 320, seed=11)
MAX_NEW = [17, 9, 24, 5, 12]


def run(cfg: RunConfig, agreeable: bool):
    eng = Engine(cfg)
    if agreeable:
        make_agreeable(eng)
    reqs = [eng.add_request(p, m, ignore_eos=True) for p, m in zip(PROMPTS, MAX_NEW)]
    while not eng.idle:
        eng.step()
        assert_live_identity(eng)
    eng.check_invariants()
    assert eng.allocator.free_pages == eng.allocator.total_pages
    acc = eng.scheduler.stats.accept_lens
    return [r.output_ids for r in reqs], (sum(acc) / len(acc) if acc else 1.0)


_REF = {}


def reference(agreeable: bool):
    """Target-only greedy output (independent of page size; checked in test_engine_greedy)."""
    if agreeable not in _REF:
        _REF[agreeable] = run(RunConfig(model="random-tiny", max_running_requests=3),
                              agreeable)[0]
    return _REF[agreeable]


def draft_tokens_choices(S, K):
    if K == 1:
        return [S + 1]
    return sorted({max(K, 2), S * K + 1})


GRID = [(d, P, K, S, D, fold)
        for d, P, K, S in itertools.product(["frozen_kv_mtp", "eagle"], [1, 4, 16, 64],
                                            [1, 2, 4, 8], [1, 2, 3, 5])
        for D in draft_tokens_choices(S, K)
        for fold in ([False, True] if d == "frozen_kv_mtp" else [False])]


def fast(d, P, K, S, D, fold) -> bool:
    """The default set: page 1 and 16 x topk 1 and 4 at S = 3, every D; the rest is `slow`."""
    return P in (1, 16) and K in (1, 4) and S == 3


@pytest.mark.parametrize("draft,P,K,S,D,fold",
                         [g if fast(*g) else pytest.param(*g, marks=pytest.mark.slow)
                          for g in GRID])
def test_lossless_grid(draft, P, K, S, D, fold):
    cfg = dict(model="random-tiny", draft=draft, page_size=P, topk=K, num_steps=S,
               num_draft_tokens=D, fold_seed=fold, max_running_requests=3,
               debug_invariants=True)
    for agreeable in (False, True):
        out, acc = run(RunConfig(**cfg), agreeable)
        assert out == reference(agreeable), (agreeable, acc)
        if agreeable and S >= 2 and D >= 3:
            assert acc >= 2.0, acc
