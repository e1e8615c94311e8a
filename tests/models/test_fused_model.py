"""The fused decoder path on CPU (torch references of the fused ops): same greedy tokens as
the unfused engine in fp32 for target-only and both drafts; Hugging Face parameter names and
saved checkpoints unchanged; the `fused` knob really switches paths."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from mtplab import Engine, RunConfig
from mtplab.kernels import fused_ops
from mtplab.models import zoo
from tests.helpers import random_prompts

PROMPTS = random_prompts(3, [5, 17, 40], 320, seed=1)


def generate(**kw):
    eng = Engine(RunConfig(page_size=4, max_running_requests=4, **kw))
    out = eng.generate(PROMPTS, 16, ignore_eos=True)
    eng.check_invariants()
    return eng, out


def test_fused_knob_resolves_and_switches_paths(monkeypatch):
    assert RunConfig(device="cpu").fused is False
    calls = []
    real = fused_ops.silu_mul
    monkeypatch.setattr("mtplab.models.mlp.silu_mul", lambda gu: calls.append(1) or real(gu))
    unfused, _ = generate(model="random-tiny", fused=False)
    assert not unfused.model.fused and not calls
    fused, _ = generate(model="random-tiny", fused=True)
    assert fused.model.fused and calls
    attn = fused.model.model.layers[0].self_attn
    assert attn.q_proj.weight.untyped_storage().data_ptr() == \
        attn.qkv_weight.untyped_storage().data_ptr()


@pytest.mark.parametrize("model,draft,topk", [
    ("random-tiny", "none", 1), ("random-tiny-swa", "none", 1),
    ("tiny-code", "frozen_kv_mtp", 1), ("tiny-code", "eagle", 1),
    pytest.param("tiny-code", "frozen_kv_mtp", 4, marks=pytest.mark.slow),
    pytest.param("random-tiny-swa", "eagle", 2, marks=pytest.mark.slow)])
def test_fused_greedy_equals_unfused_fp32(model, draft, topk):
    _, want = generate(model=model, draft=draft, topk=topk, fused=False)
    eng, got = generate(model=model, draft=draft, topk=topk, fused=True)
    assert got == want
    if draft != "none":
        assert eng.draft_model.fused


def test_fused_forward_logits_match_unfused():
    model, _ = zoo.build_target("random-tiny", 0)
    T = 7
    ids = torch.arange(3, 3 + T)
    pos = torch.arange(T)
    from mtplab.kernels.attention_ref import paged_attention_ref
    from mtplab.kernels.attn_meta import AttnMeta
    cfg = model.config
    meta = AttnMeta(torch.arange(16)[None].int(), torch.zeros(1, dtype=torch.long),
                    torch.tensor([T]), torch.tensor([T]), torch.tensor([0, T]), pos, T, T)
    outs = []
    for fused in (False, True):
        kv = [torch.zeros(cfg.num_hidden_layers, 16, cfg.num_key_value_heads, cfg.head_dim)
              for _ in range(2)]
        with torch.no_grad():
            h, logits = model.set_fused(fused)(ids, pos, *kv, pos, meta, paged_attention_ref,
                                               logits_idx=torch.tensor([T - 1]))
        outs.append((h, logits, kv))
    (h0, l0, kv0), (h1, l1, kv1) = outs
    torch.testing.assert_close(h1, h0, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(l1, l0, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(kv1[0], kv0[0], atol=1e-6, rtol=1e-6)


def test_fused_model_keeps_hf_names_and_saves_the_same_checkpoint(tmp_path):
    eng = Engine(RunConfig(model="random-tiny", fused=False))
    names = sorted(eng.model.state_dict())
    eng.save_target(tmp_path / "a")
    eng.model.set_fused(True)
    assert sorted(eng.model.state_dict()) == names
    assert not any("qkv" in n or "gate_up" in n for n, _ in eng.model.named_parameters())
    eng.save_target(tmp_path / "b")
    a = load_file(str(tmp_path / "a" / "model.safetensors"))
    b = load_file(str(tmp_path / "b" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_fused_views_survive_load_state_dict_and_to():
    model, _ = zoo.build_target("random-tiny", 0)
    model.set_fused(True)
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    sd["model.layers.1.self_attn.k_proj.weight"].fill_(0.5)
    sd["model.layers.1.mlp.up_proj.weight"].fill_(-0.25)
    model.load_state_dict(sd)
    attn, mlp = model.model.layers[1].self_attn, model.model.layers[1].mlp
    q, k = attn.q_proj.weight.shape[0], attn.k_proj.weight.shape[0]
    assert (attn.qkv_weight[q:q + k] == 0.5).all()
    assert (mlp.gate_up_weight[mlp.gate_proj.weight.shape[0]:] == -0.25).all()
    fused = attn.qkv_weight
    model.set_fused(True)
    assert attn.qkv_weight is fused             # re-fusing keeps the tensor graphs read
    model.to(torch.float64)
    assert attn.qkv_weight.dtype == torch.float64
    assert attn.k_proj.weight.untyped_storage().data_ptr() == \
        attn.qkv_weight.untyped_storage().data_ptr()
    assert (attn.qkv_weight[q:q + k] == 0.5).all()


def test_transformers_loads_a_checkpoint_saved_from_a_fused_engine(tmp_path):
    transformers = pytest.importorskip("transformers")
    eng = Engine(RunConfig(model="random-tiny", fused=True))
    eng.save_target(tmp_path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path,
                                                           torch_dtype=torch.float32).eval()
    ids = torch.tensor([[5, 9, 33, 7]])
    out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8,
                      do_sample=False, eos_token_id=None, pad_token_id=0)
    want = eng.generate([ids[0].tolist()], 8, ignore_eos=True)[0]
    assert out[0, 4:].tolist() == want
