"""The HBM floor's byte count (mtplab/models/floor.py): what a decode step reads, and only that."""
from __future__ import annotations

import pytest

from mtplab import Engine, RunConfig
from mtplab.models.floor import engine_step_bytes, kv_entry_bytes, module_bytes, step_bytes
from mtplab.models.memory import target_params
from mtplab.models.zoo import model_config


def test_an_untied_input_embedding_counts_only_the_rows_a_step_reads():
    c = model_config("llama3-8b-like@16")
    assert not c.tie_word_embeddings
    table = c.vocab_size * c.hidden_size * 2
    got = step_bytes(c, dtype_bytes=2, bs=4, context=0)
    # every parameter once, less the embedding table, plus bs rows of it
    assert got.target_weights == target_params(c) * 2 - table + 4 * c.hidden_size * 2
    # 9.08 GB of parameters, 8.03 GB read: the recorded 0.902 of the old floor reads 0.80
    assert got.target_weights / (target_params(c) * 2) == pytest.approx(0.885, abs=1e-3)


def test_a_tied_embedding_is_read_whole_as_the_lm_head():
    c = model_config("gemma4-31b-like@8")
    assert c.tie_word_embeddings
    got = step_bytes(c, dtype_bytes=2, bs=1, context=0)
    assert got.target_weights == target_params(c) * 2 + c.hidden_size * 2


def test_kv_grows_with_context_and_sliding_layers_stop_at_their_window():
    c = model_config("gemma4-31b-like@12")        # layers 5 and 11 full, ten sliding (1024)
    e = kv_entry_bytes(c, 2)
    short = step_bytes(c, dtype_bytes=2, bs=2, context=512).target_kv
    assert short == 2 * 12 * (512 + 1) * e
    long = step_bytes(c, dtype_bytes=2, bs=2, context=30000).target_kv
    assert long == 2 * (10 * (1024 + 1) + 2 * (30000 + 1)) * e
    full = model_config("llama3-8b-like@4")
    a = step_bytes(full, dtype_bytes=2, bs=1, context=8000).target_kv
    b = step_bytes(full, dtype_bytes=2, bs=1, context=16000).target_kv
    assert b - a == 4 * 8000 * kv_entry_bytes(full, 2)


def test_a_spec_step_adds_the_tree_and_s_draft_forwards_with_their_kv_reads():
    c = model_config("llama3-8b-like@4")
    e, head = kv_entry_bytes(c, 2), c.vocab_size * c.hidden_size * 2
    kw = dict(dtype_bytes=2, bs=2, context=1000, num_steps=3, topk=4, num_draft_tokens=8,
              draft_param_bytes=12345)
    fz = step_bytes(c, draft="frozen_kv_mtp", draft_kv_layers=[3], **kw)
    assert fz.target_kv == 4 * 2 * (1000 + 8) * e
    # the K branches read a request's prefix once per draft forward
    assert fz.draft_kv == 3 * 2 * 1000 * e
    assert fz.draft_weights == 3 * (12345 + head + 2 * 4 * c.hidden_size * 2)
    eg = step_bytes(c, draft="eagle", **kw)
    assert eg.draft_kv == 3 * 2 * 1000 * e and eg.draft_weights == fz.draft_weights
    with pytest.raises(ValueError, match="unknown draft"):
        step_bytes(c, draft="medusa", **kw)


def test_an_engine_counts_its_own_drafts_parameters():
    eng = Engine(RunConfig(model="random-tiny-swa", draft="frozen_kv_mtp", topk=2, num_steps=2,
                           device="cpu"))
    got = engine_step_bytes(eng, 3, 40.0)
    want = step_bytes(eng.model.config, dtype_bytes=4, bs=3, context=40.0,
                      draft="frozen_kv_mtp", num_steps=2, topk=2,
                      num_draft_tokens=eng.cfg.num_draft_tokens,
                      draft_param_bytes=module_bytes(eng.draft_model),
                      draft_kv_layers=eng.draft_model.acfg.kv_layers)
    assert got == want and got.draft_kv > 0
