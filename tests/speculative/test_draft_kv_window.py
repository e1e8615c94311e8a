"""draft_kv_window (RunConfig): a draft reading the target's KV attends only the last N entries
of the context. Its validation, the window a layer reads, the drafted tokens (a window that
covers the context changes nothing, a short one changes them), greedy spec == target-only with
it (fp32), and the floor counting the draft's KV reads at the window."""
from __future__ import annotations

import pytest

from mtplab import Engine, RunConfig
from mtplab.config import ConfigError
from mtplab.models.floor import engine_step_bytes, kv_entry_bytes, step_bytes
from mtplab.models.zoo import model_config
from tests.helpers import make_agreeable, random_prompts, record_drafts

KINDS = [("frozen_kv_mtp", "random-tiny"), ("gemma4_assistant", "random-tiny-swa")]


def test_validation_names_the_problem_and_the_fix():
    RunConfig(model="random-tiny", draft="frozen_kv_mtp", draft_kv_window=64)
    with pytest.raises(ConfigError, match="must be >= 0"):
        RunConfig(model="random-tiny", draft="frozen_kv_mtp", draft_kv_window=-1)
    for bad in (2.5, "64"):
        with pytest.raises(ConfigError, match="draft_kv_window (must be|is) an integer"):
            RunConfig(model="random-tiny", draft="frozen_kv_mtp", draft_kv_window=bad)
    with pytest.raises(ConfigError, match="reads the target's KV.*draft='eagle'"):
        RunConfig(model="random-tiny", draft="eagle", draft_kv_window=64)
    with pytest.raises(ConfigError, match="leave draft_kv_window=0"):
        RunConfig(model="random-tiny", draft_kv_window=64)


def test_a_layer_reads_its_own_window_capped_at_the_draft_window():
    eng = Engine(RunConfig(model="random-tiny-swa", draft="gemma4_assistant", device="cpu"))
    m, c = eng.draft_model, eng.model.config
    own = {li: c.window_of(li) for li in m.acfg.kv_layers}
    assert sorted(set(own.values()))[0] == 0 and max(own.values()) > 4   # full and sliding
    assert {li: m.window_of(li) for li in own} == own                   # 0: the layer's own
    m.set_kv_window(4)
    assert all(m.window_of(li) == 4 for li in own)
    m.set_kv_window(10 ** 6)                    # wider than a sliding layer: its own window
    assert {li: m.window_of(li) for li in own} == {li: w or 10 ** 6 for li, w in own.items()}
    eng.close()


def _run(model: str, prompts, **kw):
    """(outputs, drafted tokens) of greedy generation; the draft's attention matters."""
    eng = Engine(RunConfig(model=model, max_running_requests=2, device="cpu", **kw))
    drafted = []
    if kw.get("draft"):
        make_agreeable(eng, draft_attention=1.0)
        drafted = record_drafts(eng)
    else:
        make_agreeable(eng)
    out = eng.generate(prompts, 10, ignore_eos=True)
    eng.check_invariants()
    eng.close()
    return out, drafted


@pytest.mark.parametrize("draft,model", KINDS)
def test_a_short_window_changes_the_drafts_and_never_the_output(draft, model):
    prompts = random_prompts(2, [70, 53], 320, seed=11)
    want, _ = _run(model, prompts)
    full, d_full = _run(model, prompts, draft=draft)
    wide, d_wide = _run(model, prompts, draft=draft, draft_kv_window=4096)
    short, d_short = _run(model, prompts, draft=draft, draft_kv_window=3)
    assert full == wide == short == want
    assert d_wide == d_full                      # a window covering the context: no change
    assert d_short != d_full                     # 3 entries of ~60: other drafts


def test_the_floor_counts_the_drafts_kv_reads_at_its_window():
    c = model_config("llama3-8b-like@4")
    e = kv_entry_bytes(c, 2)
    kw = dict(dtype_bytes=2, bs=2, context=1000, num_steps=3, topk=1, num_draft_tokens=4,
              draft="frozen_kv_mtp", draft_kv_layers=[3])
    assert step_bytes(c, **kw).draft_kv == 3 * 2 * 1000 * e
    assert step_bytes(c, draft_kv_window=100, **kw).draft_kv == 3 * 2 * 100 * e
    assert step_bytes(c, draft_kv_window=5000, **kw).draft_kv == 3 * 2 * 1000 * e
    a = step_bytes(c, draft_kv_window=100, **kw)
    assert a.target_kv == step_bytes(c, **kw).target_kv     # the target reads all of it
    eng = Engine(RunConfig(model="random-tiny", draft="frozen_kv_mtp", draft_kv_window=8,
                           device="cpu"))
    b = engine_step_bytes(eng, 1, 40.0)
    S, layers = eng.cfg.num_steps, eng.draft_model.acfg.kv_layers
    assert b.draft_kv == S * sum(8 * kv_entry_bytes(eng.model.config, 4, li) for li in layers)
    eng.close()


def test_an_sglang_run_refuses_it():
    from mtplab.sglang.args import ServerSpec, server_launch
    cfg = RunConfig(model="random-tiny", draft="frozen_kv_mtp", fold_seed=True,
                    zero_bubble=False, draft_kv_window=64, device="cpu")
    with pytest.raises(ConfigError, match="leave draft_kv_window=0 for an SGLang run"):
        server_launch(cfg, ServerSpec(model_path="t", draft_model_path="d"))
