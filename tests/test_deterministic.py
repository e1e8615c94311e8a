"""RunConfig.deterministic on CPU: the knob's validation, the engine's scope (batch-invariant
aten kernels inside generate only), greedy spec == target-only and a request alone == the
same request in a batch, every kernel under the Triton interpreter (TRITON_INTERPRET=1, see
conftest.py). Bit-level batch invariance of each kernel: tests/test_deterministic_kernels.py;
the bf16 grid on the GPU: tests/gpu/test_deterministic_gpu.py.
"""
from __future__ import annotations

import pytest
import torch

from mtplab import Engine, RunConfig
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
