"""Long context on CUDA: greedy spec == target-only token for token with prompts of 12k and
20k tokens (the split-KV kernel's many-part plans for decode, tree verify and the draft's
kv_shared steps, also through a 4096-entry draft_kv_window, CUDA graphs captured at a
20k-entry row), in fp32 and in bf16 with deterministic mode; chunked prefill changes no
token (the others prefill whole prompts).

llama3.1-8b-like@1 (random weights, Llama 3.1 RoPE scaling) made agreeable
(tests/helpers.make_agreeable: the drafts agree with the target often, so multi-node trees are
verified and partly rejected)."""
from __future__ import annotations

import pytest
import torch

from mtplab import Engine, RunConfig
from tests.helpers import make_agreeable, random_prompts

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

LENS = [12000, 20000]
NEW = 24
PROMPTS = random_prompts(len(LENS), LENS, 128256, seed=3)


def gen(numerics: str, **kw):
    dtype, det = {"fp32": ("float32", False), "det": ("bfloat16", True)}[numerics]
    eng = Engine(RunConfig(model="llama3.1-8b-like@1", device="cuda", dtype=dtype,
                           deterministic=det, page_size=16, max_running_requests=2,
                           context_len=max(LENS) + NEW + 32,
                           max_total_tokens=sum(LENS) + 4 * (NEW + 128), overlap=True,
                           zero_bubble=True, **{"chunked_prefill_size": None, **kw}))
    make_agreeable(eng, eps=0.2)
    out = eng.generate(PROMPTS, max_new_tokens=NEW, ignore_eos=True)
    eng.check_invariants()
    return eng, out


@pytest.fixture(scope="module", params=["fp32", "det"])
def target(request):
    return request.param, gen(request.param)[1]


@pytest.mark.parametrize("draft,topk,D,window", [("frozen_kv_mtp", 1, None, 0),
                                                 ("frozen_kv_mtp", 4, 8, 0),
                                                 ("frozen_kv_mtp", 4, 8, 4096),
                                                 ("eagle", 1, None, 0)])
def test_greedy_spec_equals_target_only_at_long_context(target, draft, topk, D, window):
    numerics, want = target
    eng, got = gen(numerics, draft=draft, topk=topk, num_draft_tokens=D,
                   fold_seed=draft == "frozen_kv_mtp", draft_kv_window=window)
    assert got == want
    assert eng.stats()["accept_len"] > 1.2          # trees were verified, not only roots


def test_chunked_prefill_changes_no_token(target):
    numerics, want = target
    eng, got = gen(numerics, chunked_prefill_size=4096, draft="eagle")
    assert got == want
    assert eng.stats()["prefill_steps"] >= sum(-(-n // 4096) for n in LENS)
