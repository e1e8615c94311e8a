"""The draft table (mtplab/draft_kinds.py): every row's module provides a worker whose flags
are the row's, a builder and a parameter count that agree; only the chosen kind is built; a
new kind is one module and one row (a test-only kind, tests/draft_probe.py, runs lossless)."""
import importlib

import pytest

from mtplab import Engine, RunConfig
from mtplab.config import DRAFTS
from mtplab.draft_kinds import DRAFT_KINDS, DraftSpec, draft_kind
from mtplab.models import zoo
from mtplab.models.memory import draft_params, estimate_memory, target_params
from tests.helpers import random_prompts

PROBE = DraftSpec("probe", "test-only two-layer assistant", owns_kv=False, seed_forward=True,
                  extend_forward=False, sglang_algorithm="FROZEN_KV_MTP",
                  sglang_token_map=False, module="tests.draft_probe", weights="probe")


@pytest.mark.parametrize("name", sorted(DRAFT_KINDS))
def test_each_row_names_a_module_that_agrees_with_it(name):
    kind = DRAFT_KINDS[name]
    w = kind.worker
    assert (w.owns_kv, w.seed_forward, w.extend_forward) == (
        kind.owns_kv, kind.seed_forward, kind.extend_forward)
    target = zoo.LlamaForCausalLM(zoo.model_config("random-tiny-swa"))
    model = kind.build(target, 0)
    assert sum(p.numel() for p in model.parameters()) == kind.param_count(target.config)
    assert not any(p is q for p in model.parameters() for q in target.parameters())


def test_config_cli_and_sglang_read_the_table():
    from mtplab.sglang.args import ALGORITHMS
    assert DRAFTS == ("none", *DRAFT_KINDS)
    assert ALGORITHMS == {n: k.sglang_algorithm for n, k in DRAFT_KINDS.items()}
    with pytest.raises(ValueError, match="unknown draft 'medusa'"):
        draft_kind("medusa")


def test_only_the_chosen_draft_is_built(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a draft that was not chosen was built")
    for name in DRAFT_KINDS:
        if name != "eagle":
            monkeypatch.setattr(importlib.import_module(DRAFT_KINDS[name].module), "build",
                                refuse)
    eng = Engine(RunConfig(model="random-tiny", draft="eagle", max_running_requests=2))
    assert len(eng.generate([[1, 5, 6]], 4, ignore_eos=True)[0]) == 4


def test_a_new_kind_is_one_module_and_one_row(monkeypatch):
    """tests/draft_probe.py plus its row: config accepts it, the memory estimate counts it,
    the engine builds and runs it, and greedy spec equals target-only (fp32)."""
    monkeypatch.setitem(DRAFT_KINDS, "probe", PROBE)
    cfg = RunConfig(model="random-tiny", draft="probe", topk=2, num_steps=3,
                    max_running_requests=4, fold_seed=True)
    mc = zoo.model_config("random-tiny")
    assert draft_params(mc, "probe") > 0
    assert estimate_memory(cfg).weights_bytes == (target_params(mc) + draft_params(mc, "probe")) * 4
    prompts = random_prompts(4, [5, 9, 3, 12], 320, seed=3)
    eng = Engine(cfg)
    assert len(eng.draft_model.layers) == 2
    ref = Engine(RunConfig(model="random-tiny", max_running_requests=4))
    assert eng.generate(prompts, 12, ignore_eos=True) == ref.generate(prompts, 12,
                                                                      ignore_eos=True)
    eng.check_invariants()


def test_gemma4_assistant_structure_and_lossless():
    """The third kind (speculative/draft_gemma4.py + its row): four Q-only layers, three on
    the target's layer n-2 and one on n-1, a pre-projection from 2H, its own tied head at
    width Ha < H; greedy spec == target-only (fp32), topk 2 with the seed folded."""
    from mtplab.config import ConfigError
    from tests.helpers import make_agreeable
    cfg = RunConfig(model="random-tiny-swa", draft="gemma4_assistant", topk=2, fold_seed=True,
                    max_running_requests=4, overlap=True, zero_bubble=True)
    eng = Engine(cfg)
    d, H = eng.draft_model, eng.model.config.hidden_size
    assert d.acfg.kv_layers == [2, 2, 2, 3] and len(d.layers) == 4
    assert eng.model.config.layer_types[2:] == ["full_attention", "sliding_attention"]
    assert d.pre_projection.weight.shape == (H // 2, 2 * H)
    assert d.lm_head.weight is d.embed_tokens.weight and d.lm_head.weight.shape == (320, H // 2)
    mc = zoo.model_config("random-tiny-swa")
    assert estimate_memory(cfg).weights_bytes == (target_params(mc)
                                                  + draft_params(mc, "gemma4_assistant")) * 4
    make_agreeable(eng)
    ref = Engine(RunConfig(model="random-tiny-swa", max_running_requests=4))
    make_agreeable(ref)
    prompts = random_prompts(4, [5, 9, 3, 12], 320, seed=3)
    assert eng.generate(prompts, 12, ignore_eos=True) == ref.generate(prompts, 12,
                                                                      ignore_eos=True)
    assert eng.stats()["accept_len"] > 1.2
    eng.check_invariants()
    with pytest.raises(ConfigError, match="reads 2 target layers"):
        RunConfig(model="llama3-8b-like", layers=1, draft="gemma4_assistant",
                  simulate_accept_len=2.0)
