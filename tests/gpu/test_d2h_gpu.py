"""The blocking d2h path (zb_async_d2h=false) under overlap on CUDA: the host reads a step's
results only after the forward stream has written them, even when that stream runs far behind
the host (sched/d2h.py: the overlap loop's forward stream is not the current stream, so a
`.tolist()` on the current one would not wait for it)."""
import pytest
import torch

from mtplab import Engine, RunConfig
from tests.helpers import random_prompts

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

BEHIND_CYCLES = 20_000_000      # ~10 ms of GPU time queued ahead of every decode


def gen(behind: bool, **kw) -> list:
    with Engine(RunConfig(device="cuda", context_len=512, model="random-tiny",
                          dtype="float32", page_size=16, **kw)) as eng:
        if behind:                  # the forward stream runs ~10 ms behind the host each step
            decode = eng.worker.decode

            def late_decode(x):
                torch.cuda._sleep(BEHIND_CYCLES)
                return decode(x)
            eng.worker.decode = late_decode
        prompts = random_prompts(4, [9, 40], eng.model.config.vocab_size, seed=3)
        out = eng.generate(prompts, max_new_tokens=12, ignore_eos=True)
        eng.check_invariants()
    return out


@pytest.mark.parametrize("draft", ["none", "frozen_kv_mtp"])
@pytest.mark.parametrize("graphs", [True, False])
def test_blocking_read_under_overlap_waits_for_a_late_forward_stream(draft, graphs):
    want = gen(False, draft=draft, overlap=False, cuda_graphs=graphs)
    for seq_lens in (False, True):      # with a host read of the lengths, and without
        got = gen(True, draft=draft, overlap=True, zb_async_d2h=False,
                  zb_device_seq_lens=seq_lens, cuda_graphs=graphs)
        assert got == want, f"zb_device_seq_lens={seq_lens}"
    assert gen(True, draft=draft, overlap=True, cuda_graphs=graphs) == want   # async d2h
