"""Gemma-4's global layers at their own head_dim and KV-head count (LlamaConfig.attn_shape):
the KV pool holds one tensor per layer when shapes differ, the attention kernels take
head_dim 512 (split, extend, tree, deterministic: against the torch reference under the
interpreter), the engine equals the dense no-cache oracle and spec equals target-only for every
draft kind, the checkpoint round-trips, and the memory estimate and the floor count each
layer's own KV shape."""
from __future__ import annotations

import json

import pytest
import torch

from mtplab import Engine, RunConfig
from mtplab.draft_kinds import DRAFT_KINDS
from mtplab.models import zoo
from mtplab.models.floor import kv_entry_bytes, step_bytes
from mtplab.models.memory import estimate_memory, target_params
from tests.helpers import make_agreeable, random_prompts, reference_outputs
from tests.kernels.test_triton_attention import check, make_case

PRESET = "random-tiny-gemma4"


def test_shapes_per_layer_type_and_the_kv_pool():
    c = zoo.model_config(PRESET)
    assert [c.attn_shape(i) for i in range(4)] == [(2, 32)] * 3 + [(2, 64)]
    full = zoo.model_config("gemma4-26b-a4b-like@30")
    assert {full.attn_shape(i) for i in range(30)} == {(8, 256), (2, 512)}
    assert full.attn_shape(5) == (2, 512) and full.attn_shape(4) == (8, 256)
    eng = Engine(RunConfig(model=PRESET, max_running_requests=2))
    assert [tuple(k.shape[1:]) for k in eng.kv_cache.k] == [(2, 32)] * 3 + [(2, 64)]
    a = eng.model.model.layers[3].self_attn
    assert (a.nkv, a.d) == (2, 64) and eng.model.rope_of(3).cos.shape[-1] == 64
    assert sum(p.numel() for p in eng.model.parameters()) == target_params(c)
    uniform = Engine(RunConfig(model="random-tiny-swa", max_running_requests=2))
    assert isinstance(uniform.kv_cache.k, torch.Tensor)           # one stacked tensor


@pytest.mark.parametrize("case,window", [
    (dict(q_lens=[1, 1], kv_lens=[37, 70], Hq=8, Hkv=2), 0),            # decode (split)
    (dict(q_lens=[1], kv_lens=[90], Hq=8, Hkv=1), 16),                  # decode, windowed
    (dict(q_lens=[5, 3], kv_lens=[40, 20], Hq=8, Hkv=1), 0),            # short extend
    (dict(q_lens=[40, 2], kv_lens=[60, 9], Hq=8, Hkv=1), 0),            # extend kernel
    (dict(q_lens=[4, 4], kv_lens=[30, 44], Hq=4, Hkv=1, tree=True), 0),  # tree verify
])
def test_attention_kernels_at_head_dim_512(case, window):
    check(make_case(d=512, **case), window)


def test_engine_equals_the_dense_oracle_and_spec_is_lossless():
    prompts = random_prompts(4, [5, 9, 3, 40], 320, seed=3)
    base = dict(model=PRESET, max_running_requests=4)
    eng = Engine(RunConfig(**base))
    want = reference_outputs(eng.model, prompts, [10] * 4)
    assert eng.generate(prompts, 10, ignore_eos=True) == want
    make_agreeable(eng)
    want = eng.generate(prompts, 12, ignore_eos=True)
    eng.check_invariants()
    for kind in DRAFT_KINDS:
        spec = Engine(RunConfig(draft=kind, topk=2, page_size=4, fold_seed=kind != "eagle",
                                overlap=True, **base))
        make_agreeable(spec)
        assert spec.generate(prompts, 12, ignore_eos=True) == want, kind
        spec.check_invariants()
    g4 = Engine(RunConfig(draft="gemma4_assistant", **base)).draft_model
    assert [layer.self_attn.d for layer in g4.layers] == [32, 32, 32, 64]


@pytest.mark.slow
def test_triton_backend_and_deterministic_mode_with_mixed_head_dims():
    prompts = random_prompts(3, [4, 20, 7], 320, seed=5)
    out = {}
    for name, kw in (("torch", {}), ("triton", dict(attention_backend="triton")),
                     ("det", dict(deterministic=True)),
                     ("det-spec", dict(deterministic=True, draft="gemma4_assistant", topk=2))):
        eng = Engine(RunConfig(model=PRESET, max_running_requests=3, context_len=128, **kw))
        make_agreeable(eng)
        out[name] = eng.generate(prompts, 8, ignore_eos=True)
        eng.check_invariants()
    assert out["torch"] == out["triton"] == out["det"] == out["det-spec"]


def test_checkpoint_round_trips_mtplab_only(tmp_path):
    src = Engine(RunConfig(model=PRESET, seed=4))
    src.save_target(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["model_type"] == "mtplab_moe"
    assert (cfg["global_head_dim"], cfg["num_global_key_value_heads"]) == (64, 2)
    eng = Engine(RunConfig(model=str(tmp_path)))
    p = [[1, 9, 10, 11]]
    assert eng.generate(p, 8, ignore_eos=True) == src.generate(p, 8, ignore_eos=True)


def test_memory_and_floor_count_each_layers_kv_shape():
    c = zoo.model_config(PRESET)
    assert [kv_entry_bytes(c, 4, i) for i in range(4)] == [2 * 32 * 2 * 4] * 3 + [2 * 64 * 2 * 4]
    got = step_bytes(c, dtype_bytes=4, bs=1, context=100).target_kv
    assert got == 3 * (16 + 1) * 512 + (100 + 1) * 1024
    cfg = RunConfig(model=PRESET, draft="eagle", max_running_requests=2)
    est = estimate_memory(cfg)
    slots = est.kv_slots
    assert est.kv_bytes == slots * (3 * 512 + 1024 + 1024)    # + EAGLE's pool: the last layer's
