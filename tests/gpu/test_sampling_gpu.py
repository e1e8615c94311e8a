"""Position-keyed sampling on CUDA with graphs: speculative temperature sampling draws the
target-only tokens (fp32), with or without retraction; simulated acceptance (a captured
accept graph keyed by position) keeps its mean."""
import pytest
import torch

from mtplab import Engine, RunConfig
from mtplab.kernels import fused_ops
from tests.helpers import random_prompts

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

PROMPTS = random_prompts(8, [12, 20, 30], 256, seed=5)
KW = dict(max_new_tokens=32, temperature=0.8, seed=11, ignore_eos=True)


def engine(draft, **kw):
    return Engine(RunConfig(model="tiny-code", draft=draft, device="cuda", dtype="float32",
                            page_size=4, context_len=96, max_running_requests=8, **kw))


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("draft", ["frozen_kv_mtp", "eagle"])
def test_spec_sampling_matches_target_only_under_retraction(draft, overlap):
    want = engine("none", overlap=overlap).generate(PROMPTS, **KW)
    tight = engine(draft, overlap=overlap, max_total_tokens=2 * 104)
    got = tight.generate(PROMPTS, **KW)
    assert tight.stats()["retractions"] > 0
    tight.check_invariants()
    same = sum(a == b for a, b in zip(got, want))
    assert same == len(PROMPTS), f"{same}/{len(PROMPTS)} identical"


def test_simulated_accept_graph_keeps_the_mean():
    eng = Engine(RunConfig(model="random-tiny", draft="frozen_kv_mtp", device="cuda",
                           num_steps=3, simulate_accept_len=2.5, max_running_requests=32))
    eng.generate(random_prompts(32, [16], 320, seed=1), max_new_tokens=64, ignore_eos=True)
    eng.check_invariants()
    assert abs(eng.stats()["accept_len"] - 2.5) < 0.1, eng.stats()["accept_len"]


def test_position_uniform_kernel_is_the_reference_on_cuda():
    from mtplab.kernels.sampling import SIMULATE, position_uniform, position_uniform_ref
    seeds = torch.tensor([3, 3, 9, 2**32 - 1, 12345678901], device="cuda")
    first = torch.tensor([10, 12, 10, 2**31 + 5, 7], device="cuda")
    for stream in (0, SIMULATE):
        for pos in (first, (first % 4096).int()):       # int64, and int32 as seq_lens are
            got = position_uniform(seeds, pos, 5, stream)
            assert torch.equal(got, position_uniform_ref(seeds, pos, 5, stream))
    assert "position_uniform" not in fused_ops._failed        # the kernel ran, not the ref


@pytest.mark.parametrize("rows,nodes", [(1, 1), (1, 4), (8, 4), (64, 1)])
def test_finite_rows_kernel_is_the_reference_on_cuda_and_in_a_graph(rows, nodes):
    """A 128k vocabulary (the row split over programs), planted NaN / inf logits and an
    overflowing hidden sum of squares; the kernel captured in a graph reads new values."""
    from mtplab.kernels.sampling import finite_rows, finite_rows_ref
    g = torch.Generator(device="cuda").manual_seed(rows)
    logits = torch.randn(rows * nodes, 128256, device="cuda", generator=g)
    hidden = torch.randn(rows * nodes, 4096, device="cuda", generator=g).bfloat16()
    got = finite_rows(logits, hidden, rows)
    assert got.all() and torch.equal(got, finite_rows_ref(logits, hidden, rows))
    logits[-1, 128255] = float("nan")
    logits[0, 77] = float("-inf")
    hidden[(rows - 1) * nodes] = 1e18              # 4096 squares of 1e36 overflow fp32
    want = finite_rows_ref(logits, hidden, rows)
    assert not want[0] and not want[-1]
    assert torch.equal(finite_rows(logits, hidden, rows), want)
    logits.normal_(generator=g)
    hidden.normal_(generator=g)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = finite_rows(logits, hidden, rows)
    logits[rows * nodes // 2, 5] = float("inf")
    graph.replay()
    assert torch.equal(out, finite_rows_ref(logits, hidden, rows))
    assert not out[rows // 2]
    assert "finite_rows" not in fused_ops._failed             # the kernel ran, not the ref
