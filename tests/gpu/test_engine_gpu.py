"""Engine on CUDA: graph replay == eager, Triton == torch attention, fp32 == dense reference."""
import pytest
import torch

from mtplab import Engine, RunConfig
from tests.helpers import random_prompts, reference_outputs

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

PROMPT_LENS = [1, 9, 40, 130]


def gen(**kw):
    eng = Engine(RunConfig(device="cuda", context_len=512, **kw))
    prompts = random_prompts(kw.pop("n", 11), PROMPT_LENS, eng.model.config.vocab_size, seed=5)
    out = eng.generate(prompts, max_new_tokens=24, ignore_eos=True)
    eng.check_invariants()
    return eng, prompts, out


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("model", ["random-tiny", "random-tiny-swa"])
def test_graph_replay_equals_eager(dtype, model):
    # 11 requests with max_running 11 -> buckets 16 (padded lanes) then smaller ones.
    _, _, eager = gen(model=model, dtype=dtype, cuda_graphs=False, page_size=16)
    _, _, graph = gen(model=model, dtype=dtype, cuda_graphs=True, page_size=16)
    assert graph == eager


@pytest.mark.parametrize("page_size", [1, 16])
def test_triton_equals_torch_backend_and_dense_reference_fp32(page_size):
    eng, prompts, tri = gen(dtype="float32", attention_backend="triton", page_size=page_size)
    _, _, ref = gen(dtype="float32", attention_backend="torch", page_size=page_size)
    assert tri == ref
    assert tri == reference_outputs(eng.model, prompts, [24] * len(prompts))
