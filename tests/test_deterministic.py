"""RunConfig.deterministic on CPU: the knob's validation, the engine's scope (batch-invariant
aten kernels inside generate only), greedy spec == target-only and a request alone == the
same request in a batch, every kernel under the Triton interpreter (TRITON_INTERPRET=1, see
conftest.py). Bit-level batch invariance of each kernel:
tests/kernels/test_deterministic_kernels.py; the bf16 grid on the GPU:
tests/gpu/test_deterministic_gpu.py.
"""
from __future__ import annotations

import pytest
import torch

from mtplab import Engine, RunConfig, lazy_triton
from mtplab.config import ConfigError
from mtplab.kernels import batch_invariant as bi
from mtplab.lossless import divergence, first_divergence
from tests.helpers import make_agreeable, random_prompts

PROMPTS = random_prompts(3, [2, 5, 3], 320, seed=7)
NEW = 6


def test_knob_validation(monkeypatch):
    with pytest.raises(ConfigError, match="attention_backend='triton'"):
        RunConfig(device="cpu", deterministic=True, attention_backend="torch")
    assert RunConfig(device="cpu", deterministic=True).attention_backend == "triton"
    assert RunConfig(device="cpu").attention_backend == "torch"
    # as in a fresh process: no kernel bound to a mode yet (the tests run before may have)
    monkeypatch.setattr(lazy_triton, "_bound", None)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ConfigError, match="TRITON_INTERPRET=1"):
        RunConfig(device="cpu", deterministic=True)


def test_divergence_counts_requests_and_first_positions():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2
    assert divergence([[1, 2], [3, 4], [5]], [[1, 2], [3, 9], [6]]) == (2, [None, 1, 0])
    with pytest.raises(ValueError, match="same requests"):
        divergence([[1]], [])


def run(prompts, **kw):
    eng = Engine(RunConfig(model="random-tiny", context_len=64, max_running_requests=4,
                           deterministic=True, **kw))
    make_agreeable(eng)
    assert not bi.is_active()                        # only inside generate / graph capture
    out = eng.generate(prompts, max_new_tokens=NEW, ignore_eos=True)
    assert not bi.is_active()
    eng.check_invariants()
    return eng, out


@pytest.mark.slow
def test_spec_equals_target_only_and_alone_equals_batched():
    _, want = run(PROMPTS)
    _, alone = run(PROMPTS[1:2])
    assert alone == want[1:2]
    eng, got = run(PROMPTS, draft="frozen_kv_mtp")
    assert got == want and eng.stats()["accept_len"] > 1.0
    _, got = run(PROMPTS, draft="eagle", topk=2, num_draft_tokens=4, page_size=4, overlap=True)
    assert got == want
    _, alone = run(PROMPTS[2:], draft="eagle", topk=2, num_draft_tokens=4, page_size=4)
    assert alone == want[2:]


def test_engine_scope_uses_the_batch_invariant_kernels(monkeypatch):
    """Inside generate every target matmul goes through batch_invariant.matmul."""
    calls = []
    real = bi.matmul
    monkeypatch.setattr(bi, "matmul", lambda a, b, config=None: calls.append(a.shape[0]) or
                        real(a, b, config))
    eng, out = run(PROMPTS[:1])
    assert len(out[0]) == NEW and calls
    assert torch.equal(torch.ones(2, 2) @ torch.ones(2, 2), torch.full((2, 2), 2.0))


def test_sweep_check_lossless_columns(tmp_path):
    """check_lossless: the measured prompts re-run target-only; fp32 spec == target-only."""
    from mtplab.sweep.grid import Workload
    from mtplab.sweep.measure import measure

    cfg = RunConfig(model="random-tiny", draft="frozen_kv_mtp", max_running_requests=2,
                    trace_dir=str(tmp_path), run_name="cell")
    row = measure(cfg, Workload(batch_size=2, output_len_tokens=6, warmup_output_len_tokens=0,
                                check_lossless=True))
    assert row["diverging_requests"] == 0 and row["first_divergence_tokens"] == "[]"
    plain = measure(cfg, Workload(batch_size=2, output_len_tokens=4, warmup_output_len_tokens=0))
    assert "diverging_requests" not in plain
    with pytest.raises(ConfigError, match="greedy"):
        Workload(check_lossless=True, temperature=0.7)


@pytest.mark.slow
def test_target_logits_same_bits_alone_batched_and_in_a_tree():
    """The model level: random-tiny's logits for a token are bit-identical decoded in a batch
    of 5, decoded alone, and as nodes 0 and 1 of a tree verify (chain of 3) beside another
    lane: every op of the forward is batch-invariant in the scope."""
    from functools import partial

    from mtplab.kernels.attn_meta import AttnMeta
    from mtplab.kernels.triton_attention import paged_attention_triton
    from mtplab.models.zoo import build_target

    model = build_target("random-tiny", 0)[0].eval()
    mc = model.config
    attn = partial(paged_attention_triton, deterministic=True)
    W, lens = 16, torch.tensor([3, 6, 4, 5, 2])
    table = torch.arange(5 * W, dtype=torch.int32).view(5, W)
    shape = (mc.num_hidden_layers, 5 * W, mc.num_key_value_heads, mc.head_dim)
    kv = (torch.zeros(shape), torch.zeros(shape))
    gen = torch.Generator().manual_seed(0)

    def forward(kv, rows, ids, positions, q_lens, kv_lens, tree=None):
        rows, q_lens = torch.tensor(rows), torch.tensor(q_lens)
        cu_q = torch.cat([torch.zeros(1, dtype=torch.long), q_lens.cumsum(0)])
        out_loc = table[torch.repeat_interleave(rows, q_lens), positions].long()
        meta = AttnMeta(table, rows, torch.as_tensor(kv_lens), q_lens, cu_q, positions,
                        int(q_lens.max()), W, tree)
        return model(ids, positions, kv[0], kv[1], out_loc, meta, attn)[1]

    with torch.no_grad(), bi.batch_invariant_mode("cpu"):
        prompt = torch.randint(3, mc.vocab_size, (int(lens.sum()),), generator=gen)
        forward(kv, range(5), prompt, torch.cat([torch.arange(n) for n in lens]), lens.tolist(),
                lens)
        tok = torch.randint(3, mc.vocab_size, (2, 5), generator=gen)      # two decode steps
        clone = lambda: (kv[0].clone(), kv[1].clone())                    # noqa: E731
        batch_kv = clone()
        batch = [forward(batch_kv, range(5), tok[s], lens + s, [1] * 5, lens + s + 1)
                 for s in range(2)]
        alone = forward(clone(), [2], tok[0, 2:3], lens[2:3], [1], lens[2:3] + 1)
        chain = torch.tril(torch.ones(3, 3, dtype=torch.bool))
        ids = torch.stack([tok[0], tok[1], torch.full((5,), 9)], 1)[[0, 2]].reshape(-1)
        pos = (lens[[0, 2], None] + torch.arange(3)).reshape(-1)
        tree = forward(clone(), [0, 2], ids, pos, [3, 3], lens[[0, 2]] + 3,
                       chain.expand(2, 3, 3).contiguous()).view(2, 3, -1)
    assert torch.equal(alone[0], batch[0][2])
    for s in range(2):
        assert torch.equal(tree[:, s], batch[s][[0, 2]]), f"tree node {s} != decode step {s}"
