"""save_target -> transformers LlamaForCausalLM -> the same greedy tokens; and the reverse load."""
import json

import pytest
import torch

from mtplab import Engine, RunConfig

transformers = pytest.importorskip("transformers")


def hf_greedy(model, prompt, n):
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                         do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def test_save_target_loads_in_transformers_with_same_greedy_tokens(tmp_path):
    eng = Engine(RunConfig(model="random-tiny", page_size=4))
    eng.save_target(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["model_type"] == "llama"
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, torch_dtype=torch.float32)
    hf.eval()
    prompts = [[1, 5, 6, 7, 8], [1] + list(range(40, 90))]
    ours = eng.generate(prompts, max_new_tokens=12, ignore_eos=True)
    for p, o in zip(prompts, ours):
        assert hf_greedy(hf, p, 12) == o


def test_hf_directory_loads_in_mtplab(tmp_path):
    src = Engine(RunConfig(model="random-tiny", seed=7))
    src.save_target(tmp_path)
    eng = Engine(RunConfig(model=str(tmp_path), page_size=16))
    p = [[1, 9, 10, 11]]
    assert eng.generate(p, 10, ignore_eos=True) == src.generate(p, 10, ignore_eos=True)
    eng.check_invariants()


def test_swa_checkpoint_is_marked_mtplab_only(tmp_path):
    Engine(RunConfig(model="random-tiny-swa")).save_target(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["model_type"] == "mtplab_llama" and cfg["sliding_window"] == 16
    eng = Engine(RunConfig(model=str(tmp_path)))
    assert eng.model.config.has_sliding


def test_random_tiny_is_seeded_and_stable():
    a = Engine(RunConfig(model="random-tiny", seed=0)).model.state_dict()
    b = Engine(RunConfig(model="random-tiny", seed=0)).model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    # a fixed fingerprint: identical on every machine for seed 0
    w = a["model.embed_tokens.weight"]
    assert w.shape == (320, 128)
    want = torch.tensor([-1.493876, 2.005404, 0.058486, 0.058926])
    assert torch.allclose(w[3, :4], want, atol=1e-5)
