"""Exact figures of the decode step, where the draft is built so that they are known:

- a draft that IS the target (make_agreeable with eps=0: the target is the bigram the draft
  computes) has every draft token accepted: accept_len == num_steps + 1 on every verify;
- EAGLE's draft KV layout (holey at topk > 1, page > 1: speculative/draft_kv.py) is a matter
  of where entries live, never of what the draft sees: with its attention on, the draft
  proposes the same candidates at every page size, and the output is the target's."""
import pytest
import torch

from mtplab import Engine, RunConfig
from tests.helpers import make_agreeable, random_prompts, reference_outputs

PROMPTS = random_prompts(4, [1, 9, 21, 50], 320, seed=5)
MAX_NEW = [23, 14, 19, 30]


def run(eng):
    reqs = [eng.add_request(p, m, ignore_eos=True) for p, m in zip(PROMPTS, MAX_NEW)]
    while not eng.idle:
        eng.step()
    return [r.output_ids for r in reqs]


@pytest.mark.parametrize("cfg", [
    dict(draft="frozen_kv_mtp", fold_seed=False),
    dict(draft="frozen_kv_mtp", fold_seed=True, overlap=True),
    dict(draft="eagle", page_size=16),
    dict(draft="eagle", overlap=True, zero_bubble=True),
], ids=lambda c: "-".join(f"{v}" for v in c.values()))
def test_a_draft_that_is_the_target_is_accepted_whole_on_every_verify(cfg):
    S = 3
    eng = Engine(RunConfig(model="random-tiny", num_steps=S, topk=1, num_draft_tokens=S + 1,
                           max_running_requests=4, debug_invariants=True, **cfg))
    make_agreeable(eng, eps=0.0)
    out = run(eng)
    acc = eng.scheduler.stats.accept_lens
    assert len(acc) >= 20 and set(acc) == {S + 1}, sorted(set(acc))
    assert out == reference_outputs(eng.model, PROMPTS, MAX_NEW)


def eagle_candidates(page_size: int, agreeable: bool):
    """(outputs, accept lengths, every draft step's candidate tokens) of an EAGLE run at
    topk 4 with the draft's attention on."""
    eng = Engine(RunConfig(model="random-tiny", draft="eagle", page_size=page_size, topk=4,
                           num_steps=3, num_draft_tokens=8, max_running_requests=4,
                           debug_invariants=True))
    if agreeable:
        make_agreeable(eng, draft_attention=0.5)
    dw, seen = eng.worker.draft_worker, []
    steps = dw.steps

    def recorded(*args, **kwargs):
        out = steps(*args, **kwargs)
        seen.append(torch.cat([c.tokens for c in out], 1).tolist())
        return out
    dw.steps = recorded
    out = run(eng)
    return out, eng.scheduler.stats.accept_lens, seen, eng.model


@pytest.mark.parametrize("agreeable", [False, True], ids=["random", "agreeable"])
def test_eagle_drafts_the_same_candidates_at_every_page_size(agreeable):
    ref = eagle_candidates(1, agreeable)              # page 1: the linear layout
    assert ref[0] == reference_outputs(ref[3], PROMPTS, MAX_NEW)
    if agreeable:
        assert sum(ref[1]) / len(ref[1]) >= 1.5, "the draft hardly agrees: nothing tested"
    for P in (4, 16):
        out, acc, cands, _ = eagle_candidates(P, agreeable)
        assert out == ref[0], P
        assert cands == ref[2], f"page {P}: the draft saw other KV than at page 1"
        assert acc == ref[1], P
