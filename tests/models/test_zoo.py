"""Model zoo: the shipped `tiny-code` preset (loads, lossless spec, real acceptance, loads in
transformers), the training script's smoke run, and the shape presets + memory estimate."""
import json

import pytest
import torch

from mtplab import Engine, RunConfig
from mtplab.models import zoo
from mtplab.models.corpus import code_snippets, is_heldout, list_files, stdlib_root
from mtplab.draft_kinds import DRAFT_KINDS
from mtplab.models.memory import (InsufficientMemoryError, check_memory, draft_params,
                                  estimate_memory, target_params)

TINY = zoo.TRAINED["tiny-code"]
PROMPTS = ["def fibonacci(n):\n", "import os\nimport sys\n\n\ndef main(argv):\n",
           "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push"]
MAX_NEW = [40, 24, 32]


def tiny_engine(**kw) -> Engine:
    return Engine(RunConfig(model="tiny-code", max_running_requests=4, **kw))


@pytest.fixture(scope="module")
def reference():
    eng = tiny_engine()
    return [eng.generate([p], m, ignore_eos=True)[0] for p, m in zip(PROMPTS, MAX_NEW)]


def test_tiny_code_ships_and_loads():
    for sub in ("target/config.json", "target/model.safetensors", "assistant/config.json",
                "assistant/model.safetensors", "eagle/config.json", "eagle/model.safetensors",
                "tokenizer.json", "manifest.json"):
        assert (TINY / sub).is_file(), sub
    size = sum(f.stat().st_size for f in TINY.rglob("*.safetensors"))
    assert size <= 16_000_000
    tok = json.loads((TINY / "tokenizer.json").read_text())
    assert (tok["pad_token_id"], tok["bos_token_id"], tok["eos_token_id"]) == (0, 1, 2)
    assert "tiny-code" in zoo.known_models()
    eng = tiny_engine(draft="frozen_kv_mtp")
    assert eng.model.config.vocab_size == tok["vocab_size"]
    # the trained drafts are loaded (not the random init of the same shapes)
    a_rand = DRAFT_KINDS["frozen_kv_mtp"].build(zoo.LlamaForCausalLM(eng.model.config), 0)
    assert not torch.equal(eng.draft_model.pre_projection.weight,
                           a_rand.pre_projection.weight)


def test_generates_recognisable_python(reference):
    tok = zoo.ByteTokenizer()
    texts = [tok.decode(r) for r in reference]
    assert texts[0].startswith("    ")                        # the body of the def is indented
    assert all(t.isascii() and t.replace("\n", "").isprintable() for t in texts), texts
    joined = "".join(texts)
    found = [k for k in ("#", "self", "def ", "return", "import", '"""', "__all__", "if ", " = ")
             if k in joined]
    assert len(found) >= 2, texts


@pytest.mark.parametrize("draft", ["frozen_kv_mtp", "eagle"])
@pytest.mark.parametrize("topk,page", [(1, 1), (1, 16), (4, 1), (4, 16)])
def test_spec_greedy_equals_target(reference, draft, topk, page):
    eng = tiny_engine(draft=draft, topk=topk, page_size=page)
    out = eng.generate(PROMPTS, max_new_tokens=max(MAX_NEW), ignore_eos=True)
    eng.check_invariants()
    assert [o[:m] for o, m in zip(out, MAX_NEW)] == reference
    assert eng.allocator.free_pages == eng.allocator.total_pages


def test_accept_length_on_heldout_prompts():
    """Regression guard on 3 held-out stdlib snippets (benchmarks/bench_acceptance.py has the
    full table)."""
    root = stdlib_root()
    prompts = code_snippets(root, [f for f in list_files(root) if is_heldout(f)], 3, 300)
    eng = tiny_engine(draft="frozen_kv_mtp", num_steps=3)
    eng.generate(prompts, max_new_tokens=64, ignore_eos=True)
    eng.check_invariants()
    assert eng.stats()["accept_len"] >= 2.0


def test_transformers_loads_target_with_same_greedy_tokens(reference):
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoModelForCausalLM.from_pretrained(TINY / "target",
                                                           torch_dtype=torch.float32).eval()
    tok = zoo.ByteTokenizer()
    for p, m, want in zip(PROMPTS, MAX_NEW, reference):
        ids = torch.tensor([tok.encode(p)])
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=m,
                          do_sample=False, eos_token_id=None, pad_token_id=0)
        assert out[0, ids.shape[1]:].tolist() == want


def test_training_smoke(tmp_path, monkeypatch):
    from mtplab.models import train
    cfg = train.parse_args(["--out", str(tmp_path), "--layers", "1", "--hidden", "32",
                            "--ffn", "64", "--heads", "2", "--kv-heads", "1", "--seq-len", "32",
                            "--batch", "2", "--max-steps", "3", "--target-seconds", "0",
                            "--assistant-seconds", "0", "--eagle-seconds", "0",
                            "--max-files", "12", "--eval-tokens", "200", "--warmup-steps", "1",
                            "--max-positions", "128", "--device", "cpu"])
    manifest = train.run(cfg)
    assert manifest["complete"] and manifest["stages"]["eagle"]["steps"] == 3
    assert manifest["heldout"]["target_bits_per_byte"] > 0
    monkeypatch.setitem(zoo.TRAINED, "smoke", tmp_path)
    eng = Engine(RunConfig(model="smoke", draft="eagle", max_running_requests=2))
    ref = Engine(RunConfig(model="smoke", max_running_requests=2))
    assert eng.generate(["x = 1\n"], 8, ignore_eos=True) == ref.generate(["x = 1\n"], 8,
                                                                           ignore_eos=True)
    eng.check_invariants()


def test_eagle_training_mask_is_the_draft_time_view():
    from mtplab.models.train import eagle_mask
    m = eagle_mask(6, 2, "cpu")           # step 2, row i: step-0 keys j <= i-2, step-1 key at
    i = 4                                 # i-1, step-2 key at i
    assert m[i, :6].tolist() == [True, True, True, False, False, False]
    assert m[i, 6:12].nonzero().flatten().tolist() == [3]
    assert m[i, 12:].nonzero().flatten().tolist() == [4]


@pytest.mark.parametrize("name,layers", [("gemma4-26b-a4b-like", 6), ("gemma4-31b-like", 12),
                                         ("llama3-8b-like", 2)])
def test_shape_presets_and_depth(name, layers):
    model = zoo.with_layers(name, layers)
    cfg = zoo.model_config(model)
    assert cfg.num_hidden_layers == layers
    assert cfg.layer_types[-1] == "full_attention"
    if name.startswith("gemma"):
        assert cfg.layer_types[:6] == ["sliding_attention"] * 5 + ["full_attention"]
        assert cfg.sliding_window == 1024
    acfg = zoo.assistant_config(cfg)
    assert acfg.num_layers == (2 if name.startswith("gemma") else 1)
    rc = RunConfig(model=model, draft="eagle", simulate_accept_len=2.5, max_running_requests=2,
                   context_len=2048)
    est = estimate_memory(rc)
    assert est.weights_bytes == (target_params(cfg) + draft_params(cfg, "eagle")) * 4
    with pytest.raises(ValueError, match="layers"):
        zoo.with_layers(name, 10_000)


def _narrow_shape(monkeypatch) -> None:
    """Register a narrow stand-in shape preset, "narrow-like", for this test only."""
    shape = zoo.ShapePreset("narrow-like", dict(
        vocab_size=320, hidden_size=64, intermediate_size=128, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
        tie_word_embeddings=True), 6, 12, True, "test stand-in")
    monkeypatch.setitem(zoo.SHAPES, "narrow-like", shape)


def test_shape_preset_pipeline_at_small_width(monkeypatch):
    """The real presets' embeddings alone are GBs, so the build path (seeded init, Gemma
    pattern, tied embedding, depth suffix, engine with simulated acceptance) runs on a
    narrow stand-in."""
    _narrow_shape(monkeypatch)
    model, _ = zoo.build_target("narrow-like@7", seed=0)
    assert sum(p.numel() for p in model.parameters()) == target_params(model.config)
    assert model.config.layer_types[5:] == ["full_attention", "full_attention"]
    eng = Engine(RunConfig(model="narrow-like@7", draft="frozen_kv_mtp", max_running_requests=2,
                           simulate_accept_len=2.5))
    assert len(eng.generate([[1, 5, 6]], 12, ignore_eos=True)[0]) == 12
    eng.check_invariants()
    eng.check_invariants()
    with pytest.raises(ValueError, match="fixed depth"):
        zoo.with_layers("random-tiny", 2)


def test_memory_check_prints_and_rejects_impossible_size():
    rc = RunConfig(model="gemma4-31b-like@60", draft="frozen_kv_mtp", max_running_requests=64,
                   context_len=32768, simulate_accept_len=2.0)
    lines = []
    with pytest.raises(InsufficientMemoryError, match=r"needs about .* GiB .* only 80.00 GiB"):
        check_memory(rc, free_bytes=80 << 30, log=lines.append)
    assert lines and lines[0].startswith("memory estimate for gemma4-31b-like@60")
    small = RunConfig(model="random-tiny", max_running_requests=2)
    assert check_memory(small, log=lines.append).device_bytes < 1 << 30


def test_memory_estimate_names_the_sliding_layers_full_storage():
    """gemma4-31b-like@12: ten sliding layers of twelve hold every entry (stored in full);
    the estimate says so and what a window-only pool would hold."""
    from mtplab.models.memory import estimate_memory
    rc = RunConfig(model="gemma4-31b-like@12", max_running_requests=8, context_len=32768,
                   dtype="bfloat16")
    est = estimate_memory(rc)
    entry = 16 * 256 * 2 * 2
    assert est.kv_bytes == 12 * est.kv_slots * entry
    assert est.kv_sliding_bytes == 10 * est.kv_slots * entry
    assert est.kv_window_only_bytes == 10 * 8 * (1024 + 1) * entry
    assert "sliding layers 40.01 of it, stored in full -- 1.25 for their windows only" \
        in est.describe()
    assert "sliding" not in estimate_memory(RunConfig(model="random-tiny")).describe()


def test_random_tiny_unchanged():
    model, _ = zoo.build_target("random-tiny", 0)
    assert not hasattr(model, "trained_dir") or model.trained_dir is None
    want = torch.tensor([-1.493876, 2.005404, 0.058486, 0.058926])
    assert torch.allclose(model.model.embed_tokens.weight[3, :4], want, atol=1e-5)


def test_shape_preset_device_build_path_matches_the_cpu_build(monkeypatch):
    """The on-device build (meta device -> empty storage in the run dtype -> seeded init where
    the weights live) exercised on the CPU: there it draws from the same CPU generator, so the
    weights, the tied embedding and the RoPE tables equal a plain CPU build's; the drafts are
    initialised where the target was."""
    _narrow_shape(monkeypatch)
    want, _ = zoo.build_target("narrow-like@3", seed=4)
    monkeypatch.setattr(zoo, "_on_device", lambda device, dtype: True)
    got, _ = zoo.build_target("narrow-like@3", seed=4, device="cpu", dtype=torch.float32)
    assert got.lm_head.weight is got.model.embed_tokens.weight
    sd_w, sd_g = want.state_dict(), got.state_dict()
    assert sd_w.keys() == sd_g.keys() and all(torch.equal(sd_w[k], sd_g[k]) for k in sd_w)
    assert torch.equal(got.rope.cos, want.rope.cos) and torch.equal(got.rope.sin, want.rope.sin)
    for a, b in ((k.build(want, 4), k.build(got, 4)) for k in DRAFT_KINDS.values()):
        assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(),
                                                      b.state_dict().values()))


def test_cuda_free_memory_counts_what_a_closed_engine_left_in_torchs_cache(monkeypatch):
    """device_free_bytes: blocks torch's caching allocator holds with no tensor in them go
    back to the device before free memory is read (a second engine in one process fits where
    the first, closed, did)."""
    from mtplab.models import memory
    state = {"free": 10, "cached": 50}

    def empty_cache():
        state["free"], state["cached"] = state["free"] + state["cached"], 0
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d: 60 + state["cached"])
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d: 60)
    monkeypatch.setattr(torch.cuda, "empty_cache", empty_cache)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d: (state["free"], 200))
    assert memory.device_free_bytes("cuda") == 60
    assert memory.device_free_bytes("cuda") == 60        # nothing cached: read as it is
