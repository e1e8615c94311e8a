import pytest
import torch

from mtplab import RunConfig
from mtplab.config import ConfigError

BAD = [
    (dict(page_size=3), "not a power of two"),
    (dict(page_size=0), "positive integer"),
    (dict(topk=4, num_steps=3, num_draft_tokens=2), "topk=4 is larger than num_draft_tokens=2"),
    (dict(model="no-such-model"), "unknown model 'no-such-model'"),
    (dict(draft="medusa"), "draft='medusa' is unknown"),
    (dict(dtype="int8"), "dtype='int8' is unknown"),
    (dict(attention_backend="flash"), "attention_backend='flash' is unknown"),
    (dict(context_len=100_000), "exceeds the model's max_position_embeddings"),
    (dict(max_total_tokens=10, context_len=64), "cannot hold even one request"),
    (dict(zero_bubble=True, zb_async_d2h=False), "contradicts it"),
    (dict(zb_draft_preexec=True), "needs a draft"),
    (dict(fold_seed=True, draft="eagle"), "needs draft='frozen_kv_mtp'"),
    (dict(draft="eagle", simulate_accept_len=9.0), "must lie in"),
]


@pytest.mark.parametrize("kw,msg", BAD)
def test_bad_config_raises_one_clear_sentence(kw, msg):
    with pytest.raises(ConfigError, match=msg):
        RunConfig(**kw)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_cuda_without_gpu():
    with pytest.raises(ConfigError, match="no CUDA GPU is visible"):
        RunConfig(device="cuda")
    with pytest.raises(ConfigError, match="cuda_graphs=True needs a CUDA device"):
        RunConfig(device="cpu", cuda_graphs=True)


def test_resolution_and_manifest():
    cfg = RunConfig()
    m = cfg.manifest()
    c = m["config"]
    assert c["device"] in ("cpu", "cuda:0")
    assert c["dtype"] in ("float32", "bfloat16") and c["attention_backend"] in ("torch", "triton")
    assert c["context_len"] == 2048 and c["num_draft_tokens"] == 4
    assert c["max_total_tokens"] == cfg.max_running_requests * cfg.row_width
    assert m["versions"]["torch"] == torch.__version__
    assert m["derived"]["reserve_per_decode"] == 2
    assert "git_commit" in m and m["device_name"]
    # the manifest reconstructs the same config
    assert RunConfig(**c) == cfg
