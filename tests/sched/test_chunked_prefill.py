"""Chunked prefill (`chunked_prefill_size`): a prompt longer than the chunk is prefilled in
several forwards over its earlier chunks' KV, and nothing else changes -- the same greedy
tokens as whole-prompt prefill and as the dense reference, for target-only and both drafts,
overlap on and off; the KV invariants hold between chunks; an abort mid-prefill frees all."""
import pytest

from mtplab import Engine, RunConfig
from mtplab.errors import ConfigError
from tests.helpers import assert_live_identity, random_prompts, reference_outputs

LENS = [3, 29, 64, 17]
NEW = 10


def run(chunk, **kw):
    eng = Engine(RunConfig(model="random-tiny-swa", page_size=4, max_running_requests=2,
                           chunked_prefill_size=chunk, debug_invariants=True, **kw))
    prompts = random_prompts(len(LENS), LENS, eng.model.config.vocab_size, seed=11)
    out = eng.generate(prompts, max_new_tokens=NEW, ignore_eos=True)
    eng.check_invariants()
    return eng, prompts, out


def test_chunks_match_whole_prompts_and_the_dense_reference():
    eng, prompts, out = run(7)
    assert out == reference_outputs(eng.model, prompts, [NEW] * len(prompts))
    # two requests share a budget of 7 tokens per prefill forward: every token fed once
    assert eng.stats()["prefill_steps"] >= -(-sum(LENS) // 7)
    assert run(None)[2] == out


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("draft,topk", [("frozen_kv_mtp", 1), ("frozen_kv_mtp", 2),
                                        ("eagle", 1), ("eagle", 2)])
def test_spec_with_chunked_prefill_equals_target_only(draft, topk, overlap):
    want = run(None, overlap=overlap)[2]
    eng, _, got = run(5, overlap=overlap, draft=draft, topk=topk)
    assert got == want


def test_a_request_is_not_decoded_before_its_last_chunk():
    eng = Engine(RunConfig(model="random-tiny", chunked_prefill_size=8))
    req = eng.add_request(list(range(5, 45)), max_new_tokens=3, ignore_eos=True)
    kinds = []
    while not eng.idle:
        before = eng.scheduler.stats.prefill_steps
        eng.step()
        kinds.append("prefill" if eng.scheduler.stats.prefill_steps > before else "decode")
        assert_live_identity(eng)
        if kinds[-1] == "prefill" and req.prefilled < req.prefill_len:
            assert req.output_ids == [] and req.kv.kv_committed_len == 0
    assert kinds == ["prefill"] * 5 + ["decode"] * 2
    eng.check_invariants()


def test_abort_mid_prefill_frees_everything():
    eng = Engine(RunConfig(model="random-tiny", chunked_prefill_size=4, overlap=True))
    req = eng.add_request(list(range(5, 30)), max_new_tokens=4, ignore_eos=True)
    eng.step()
    eng.step()
    assert 0 < req.prefilled < req.prefill_len
    assert eng.abort(req.rid)
    while not eng.idle:
        eng.step()
    assert req.finished_reason == "abort"
    eng.check_invariants()


def test_chunk_size_must_be_positive():
    with pytest.raises(ConfigError, match="chunked_prefill_size"):
        RunConfig(chunked_prefill_size=0)


def test_eagle_draft_kv_after_chunks_equals_whole_prefill():
    """The draft extend of a non-final chunk ends at the next chunk's first token (not the
    sampled one): the draft KV of every prompt position is what a whole prefill writes."""
    import torch
    pools = []
    for chunk in (None, 6):
        eng = Engine(RunConfig(model="random-tiny", draft="eagle", chunked_prefill_size=chunk))
        eng.generate([list(range(7, 40))], max_new_tokens=1, ignore_eos=True)
        pools.append(eng.worker.draft_worker.kv.k.clone())
    torch.testing.assert_close(pools[1], pools[0], atol=1e-5, rtol=1e-5)
