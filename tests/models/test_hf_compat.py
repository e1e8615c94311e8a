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


LLAMA3_SCALING = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


def test_llama3_rope_frequencies_match_transformers():
    from transformers import LlamaConfig as HFConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from mtplab.models.llama import rope_inv_freq
    hf_cfg = HFConfig(hidden_size=1024, num_attention_heads=8, num_hidden_layers=1,
                      max_position_embeddings=131072,
                      rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": 8192},
                      rope_theta=500000.0)
    want, _ = ROPE_INIT_FUNCTIONS["llama3"](hf_cfg, "cpu")
    got = rope_inv_freq(128, 500000.0, {"rope_type": "llama3", "factor": 8.0,
                                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                        "original_max_position_embeddings": 8192})
    torch.testing.assert_close(got, want.float(), rtol=1e-6, atol=0)
    plain = rope_inv_freq(128, 500000.0)
    assert (got < plain).any() and (got == plain).any()   # low frequencies stretched only


def _scaled_dir(tmp_path, legacy: bool):
    """random-tiny saved, its config.json given Llama 3.1 RoPE scaling (the hub's
    rope_scaling, or transformers 5's rope_parameters with the theta inside)."""
    Engine(RunConfig(model="random-tiny", seed=3)).save_target(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    if legacy:
        cfg["rope_scaling"] = dict(LLAMA3_SCALING)
    else:
        cfg["rope_parameters"] = {**LLAMA3_SCALING, "rope_theta": cfg.pop("rope_theta")}
        cfg.pop("rope_scaling", None)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


@pytest.mark.parametrize("legacy", [True, False])
def test_llama31_rope_scaling_survives_loading_and_matches_transformers(tmp_path, legacy):
    d = _scaled_dir(tmp_path / "src", legacy)
    eng = Engine(RunConfig(model=str(d), page_size=4))
    assert eng.model.config.rope_scaling == LLAMA3_SCALING
    assert eng.model.config.rope_theta == 10000.0
    hf = transformers.AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32).eval()
    prompt = [1] + list(range(40, 150))          # positions past the original 64
    ours = eng.generate([prompt], max_new_tokens=8, ignore_eos=True)[0]
    assert hf_greedy(hf, prompt, 8) == ours
    plain = Engine(RunConfig(model="random-tiny", seed=3, page_size=4))
    assert not torch.equal(eng.model.rope.cos, plain.model.rope.cos)   # the scaling is in force
    eng.save_target(tmp_path / "again")                # and written back
    assert LlamaLoad(tmp_path / "again").rope_scaling == LLAMA3_SCALING


def test_unknown_rope_scaling_is_one_clear_error(tmp_path):
    d = _scaled_dir(tmp_path, legacy=True)
    cfg = json.loads((d / "config.json").read_text())
    cfg["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0}
    (d / "config.json").write_text(json.dumps(cfg))
    from mtplab.errors import ModelLoadError
    with pytest.raises(ModelLoadError, match="rope_scaling type 'yarn' is not implemented"):
        LlamaLoad(d)


def LlamaLoad(d):
    from mtplab.models.llama_config import LlamaConfig
    return LlamaConfig.load(d)


def test_llama31_preset_has_128k_positions_and_its_scaling():
    from mtplab.models.zoo import model_config
    c = model_config("llama3.1-8b-like@2")
    assert c.max_position_embeddings == 131072 and c.rope_scaling["rope_type"] == "llama3"
    assert c.rope_scaling["original_max_position_embeddings"] == 8192
