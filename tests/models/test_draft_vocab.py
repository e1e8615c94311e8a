"""draft_vocab (models/draft_vocab.py): the forms and their validation, the hot set and the
balanced clusters, each head against the full head's logits, and greedy spec == target-only
with a reduced head for every draft kind (fp32), drafted tokens always inside a hot set."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mtplab import Engine, RunConfig
from mtplab.config import ConfigError
from mtplab.draft_kinds import DRAFT_KINDS, DraftVocab, parse_draft_vocab
from mtplab.models.draft_vocab import VocabHead, cluster_tokens, escape_share, hot_ids
from tests.helpers import make_agreeable, random_prompts, record_drafts


def test_forms_and_validation():
    assert parse_draft_vocab("full") == DraftVocab("full")
    assert parse_draft_vocab("hot:4096") == DraftVocab("hot", size=4096)
    assert parse_draft_vocab("centroids:2048/32") == DraftVocab("centroids", clusters=2048,
                                                                top=32)
    for bad in ("hot", "hot:0", "hot:x", "centroids:16", "centroids:0/2", "top:5", "full:3"):
        with pytest.raises(ValueError, match="hot:<N>"):
            parse_draft_vocab(bad)
    with pytest.raises(ConfigError, match="needs a draft"):
        RunConfig(model="random-tiny", draft_vocab="hot:64")
    with pytest.raises(ConfigError, match=r"\[topk=4"):
        RunConfig(model="random-tiny", draft="eagle", topk=4, draft_vocab="hot:3")
    with pytest.raises(ConfigError, match="power of two"):
        RunConfig(model="random-tiny", draft="eagle", draft_vocab="centroids:6/2")
    with pytest.raises(ConfigError, match="k\\*V/C >= topk"):
        RunConfig(model="random-tiny", draft="eagle", topk=8, num_draft_tokens=9,
                  draft_vocab="centroids:64/1")


def test_hot_set_is_the_most_frequent_ids():
    counts = torch.tensor([5, 9, 0, 9, 1, 7])
    assert hot_ids(counts, 3).tolist() == [1, 3, 5]         # ties: the lower id first
    assert hot_ids(counts, 4).tolist() == [0, 1, 3, 5]


def test_heads_score_like_the_full_head():
    g = torch.Generator().manual_seed(0)
    W, s = torch.randn(64, 16, generator=g), torch.randn(5, 16, generator=g)
    full = F.linear(s, W)
    hot = VocabHead(parse_draft_vocab("hot:10"), W, torch.arange(64))
    assert torch.allclose(hot(s, W), full[:, hot.vocab_ids])
    members, cent = cluster_tokens(W, 8)
    assert members.shape == (8, 8) and sorted(members.flatten().tolist()) == list(range(64))
    head = VocabHead(parse_draft_vocab("centroids:8/3"), W)
    out = head(s, W)
    kept = out > torch.finfo(out.dtype).min
    assert (kept.sum(-1) == 24).all()                        # 3 clusters of 8 tokens per row
    assert torch.allclose(out[kept], full[kept], atol=1e-5)
    W2 = W * 2                                               # a hot copy follows its weight
    with torch.no_grad():
        W.mul_(2)
    assert torch.allclose(hot(s, W), F.linear(s, W2)[:, hot.vocab_ids])
    assert escape_share([[1, 2], [3]], torch.tensor([1, 3])) == pytest.approx(1 / 3)
    assert escape_share([[1, 2]], None) == 0.0


@pytest.mark.parametrize("draft", sorted(DRAFT_KINDS))
@pytest.mark.parametrize("vocab", ["hot:160", "centroids:16/6"])
def test_spec_with_a_reduced_head_equals_target_only(draft, vocab):
    prompts = random_prompts(4, [5, 9, 3, 12], 320, seed=3)

    def run(**kw):
        eng = Engine(RunConfig(model="random-tiny-swa", max_running_requests=4, **kw))
        make_agreeable(eng)
        return eng, eng.generate(prompts, 12, ignore_eos=True)

    _, want = run()
    eng, got = run(draft=draft, draft_vocab=vocab, topk=2)
    assert got == want and eng.stats()["accept_len"] > 1.1
    eng.check_invariants()
    if vocab.startswith("hot"):
        ids = eng.draft_model.vocab_ids
        assert ids.numel() == 160
        drafted = record_drafts(eng)
        eng.generate(prompts[:2], 6, ignore_eos=True)
        assert drafted and set(drafted) <= set(ids.tolist())


def test_floor_counts_the_head_rows_a_draft_reads():
    from mtplab.models.floor import engine_step_bytes
    full = Engine(RunConfig(model="random-tiny-swa", draft="gemma4_assistant"))
    hot = Engine(RunConfig(model="random-tiny-swa", draft="gemma4_assistant",
                           draft_vocab="hot:64"))
    a, b = (engine_step_bytes(e, 1, 16) for e in (full, hot))
    Ha, S = full.draft_model.acfg.hidden_size, full.cfg.num_steps
    assert a.draft_weights - b.draft_weights == S * (320 - 64) * Ha * 4   # own head, fp32
    shared = Engine(RunConfig(model="random-tiny-swa", draft="frozen_kv_mtp"))
    c = engine_step_bytes(shared, 1, 16)
    assert c.draft_weights > S * 320 * 128 * 4                 # the target's head, width H


def test_sglang_adapter_passes_a_token_map_where_the_worker_takes_one(tmp_path):
    from mtplab.sglang.args import ServerSpec, server_launch
    from mtplab.sglang.models import write_token_map
    path = write_token_map(tmp_path / "hot.pt", [7, 3, 9])
    assert torch.load(path, weights_only=True) == [7, 3, 9]
    spec = ServerSpec(model_path="t", draft_model_path="d", token_map=str(path))
    cfg = RunConfig(model="random-tiny", draft="eagle", draft_vocab="hot:64", device="cpu")
    argv = server_launch(cfg, spec).argv
    assert argv[argv.index("--speculative-token-map") + 1] == str(path)
    with pytest.raises(ConfigError, match="needs the hot ids as a file"):
        server_launch(cfg, ServerSpec(model_path="t", draft_model_path="d"))
    frozen = RunConfig(model="random-tiny", draft="frozen_kv_mtp", fold_seed=True,
                       draft_vocab="hot:64", device="cpu")
    with pytest.raises(ConfigError, match="FROZEN_KV_MTP worker takes no"):
        server_launch(frozen, spec)
    cent = RunConfig(model="random-tiny", draft="eagle", draft_vocab="centroids:16/2",
                     device="cpu")
    with pytest.raises(ConfigError, match="use_ordered_embeddings"):
        server_launch(cent, spec)
