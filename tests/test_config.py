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


def test_git_commit_is_the_checkout_holding_the_package_not_an_enclosing_one(tmp_path,
                                                                           monkeypatch):
    """A copy of the tree inside another repository (a device's carried `.dev_x` folder) must
    not report that repository's HEAD; MTP_GIT_COMMIT, where set, names the copy's commit."""
    import subprocess

    from mtplab.config import git_commit

    def git(*args, cwd=tmp_path):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd,
                       check=True, capture_output=True)
    git("init", "-q")
    (tmp_path / "mtplab").mkdir()
    (tmp_path / "mtplab" / "config.py").write_text("x = 1\n")
    copy = tmp_path / "copy" / "mtplab"
    copy.mkdir(parents=True)
    (copy / "config.py").write_text("x = 1\n")
    git("add", "mtplab/config.py")
    git("commit", "-q", "-m", "one")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True,
                          text=True).stdout.strip()
    monkeypatch.delenv("MTP_GIT_COMMIT", raising=False)
    assert git_commit(tmp_path / "mtplab" / "config.py") == head
    (tmp_path / "mtplab" / "config.py").write_text("x = 2\n")
    assert git_commit(tmp_path / "mtplab" / "config.py") == head + "-dirty"
    assert git_commit(copy / "config.py") is None               # the enclosing repo's HEAD
    monkeypatch.setenv("MTP_GIT_COMMIT", "abc1234")
    assert git_commit(copy / "config.py") == "abc1234"
    # ... and over a checkout of its own at another HEAD (a device's copy of the tree)
    assert git_commit(tmp_path / "mtplab" / "config.py") == "abc1234"
