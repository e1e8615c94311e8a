"""A decode step issues no fill: the attention output of lanes that each hold max_q tokens
(AttnMeta.full_lanes: decode, verify, draft steps) is written whole by the kernels, so it is
not zeroed first (one fill kernel per layer per step under CUDA graphs otherwise), and the
target-only step's one-query-per-lane lengths are a slice of a buffer, not a fill. Counted
with OpCounter on the eager decode forward (what a CUDA graph captures), CPU through the
Triton interpreter."""
from __future__ import annotations

import pytest
import torch

from mtplab import Engine, RunConfig
from mtplab.instrument.hostclock import OpCounter
from mtplab.kernels import triton_attention as ta
from mtplab.kernels.attn_meta import AttnBoundError, AttnMeta, check_bounds
from mtplab.studies.run_cells import _NoMarks

# scalar_tensor: a Python number where an op takes a tensor (torch.where(c, x, -1)), put on
# the device by a fill kernel on CUDA
FILLS = ("fill_", "zero_", "zeros", "ones", "full", "new_zeros", "new_ones", "new_full",
         "zeros_like", "ones_like", "full_like", "scalar_tensor")


def fills(counter: OpCounter) -> dict:
    return {k: v for k, v in counter.ops.items() if k in FILLS}


@pytest.mark.parametrize("fused", [False, True])
def test_a_target_only_decode_step_issues_no_fill(fused):
    eng = Engine(RunConfig(model="random-tiny", attention_backend="triton", page_size=16,
                           context_len=256, fused=fused))
    eng.generate([[5, 6, 7, 8, 9, 10]], max_new_tokens=2, ignore_eos=True)
    call = eng.target_worker.plan(False, True)[-1]          # greedy target-only decode
    fn = call.make(call, 64)
    B = 2
    args = dict(input_ids=torch.tensor([5, 7]), rows=torch.tensor([0, 1]),
                kv_lens=torch.tensor([8, 3]), mark=_NoMarks())
    with torch.no_grad(), OpCounter() as oc:
        report, accepted = fn(**args)
    assert fills(oc) == {}, "a decode step issues fills again"
    assert report.shape == (B, 1) and accepted.tolist() == [1] * B
    eng.check_invariants()
    eng.close()


def test_a_whole_target_only_engine_step_issues_no_fill():
    """Every stage of a greedy target-only decode iteration (overlap + zero_bubble: resolve,
    forward, publish, stash, the host's side): no fill op."""
    eng = Engine(RunConfig(model="random-tiny", attention_backend="triton", page_size=16,
                           context_len=256, overlap=True, zero_bubble=True,
                           max_running_requests=2))
    for p in ([5, 6, 7, 8, 9, 10], [3, 4, 5]):
        eng.add_request(p, max_new_tokens=24, ignore_eos=True)
    for _ in range(6):                                      # the prefills, then decodes
        eng.step()
    before = eng.scheduler.stats.decode_steps
    with torch.no_grad(), OpCounter() as oc:
        for _ in range(3):
            eng.step()
    assert eng.scheduler.stats.decode_steps - before == 3
    assert fills(oc) == {}
    while not eng.idle:
        eng.step()
    eng.check_invariants()
    eng.close()


def _decode_case(B: int, kv: int, Hq=4, Hkv=2, d=16, page=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    N = B * kv + page
    k = torch.randn(N, Hkv, d, generator=g)
    v = torch.randn(N, Hkv, d, generator=g)
    q = torch.randn(B, Hq, d, generator=g)
    table = torch.randperm(N, generator=g)[:B * kv].view(B, kv).to(torch.int32)
    kv_lens = torch.tensor([kv - b for b in range(B)])
    return q, k, v, table, kv_lens


@pytest.mark.parametrize("num_splits", [1, 3])
def test_full_lanes_attention_equals_the_zeroed_one(num_splits):
    B, kv = 3, 20
    q, k, v, table, kv_lens = _decode_case(B, kv)

    def run(full: bool):
        meta = AttnMeta(table, torch.arange(B), kv_lens, torch.ones(B, dtype=torch.long),
                        torch.arange(B + 1), kv_lens - 1, 1, kv, full_lanes=full)
        return ta.paged_attention_triton(q, k, v, meta, 0.25, num_splits=num_splits)

    assert torch.equal(run(True), run(False))


def test_full_lanes_with_a_short_lane_is_refused_by_the_bounds_check():
    B, kv = 3, 20
    _, _, _, table, kv_lens = _decode_case(B, kv)
    meta = AttnMeta(table, torch.arange(B), kv_lens, torch.tensor([1, 0, 1]),
                    torch.tensor([0, 1, 1, 2]), kv_lens - 1, 1, kv, full_lanes=True)
    with pytest.raises(AttnBoundError, match="full_lanes"):
        check_bounds(meta)
    check_bounds(AttnMeta(table, torch.arange(B), kv_lens, torch.ones(B, dtype=torch.long),
                          torch.arange(B + 1), kv_lens - 1, 1, kv, full_lanes=True))


@pytest.mark.parametrize("draft", [
    dict(draft="frozen_kv_mtp", fold_seed=True, num_steps=3, topk=1),
    pytest.param(dict(draft="frozen_kv_mtp", num_steps=2, topk=2, num_draft_tokens=4),
                 marks=pytest.mark.slow),
    pytest.param(dict(draft="eagle", num_steps=2, topk=1), marks=pytest.mark.slow),
])
def test_greedy_spec_over_unzeroed_attention_equals_target_only(draft):
    """The verify, Frozen-KV and EAGLE draft steps run the split kernel over lanes it writes
    whole (full_lanes): fp32 greedy output == target-only, token for token."""
    prompts = [[5, 9, 2, 7, 11, 3, 8], [4, 4, 6, 1, 9, 12, 30, 2, 5, 7, 19]]
    base = dict(model="random-tiny", attention_backend="triton", page_size=4,
                context_len=96, max_running_requests=2)
    outs = []
    for extra in ({}, draft):
        eng = Engine(RunConfig(**base, **extra))
        outs.append(eng.generate(prompts, max_new_tokens=12, ignore_eos=True))
        eng.check_invariants()
        eng.close()
    assert outs[1] == outs[0]
