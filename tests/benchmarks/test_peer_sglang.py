"""The peer harness (mtplab/studies/peers/side_by_side.py), mtplab and SGLang side by side:
the knobs each engine gets (SGLang's side through SGLang's own parser and model config, where
installed), the workload both see, the interleaving / ratio / resume / deadline logic against
stand-in engines, the worker processes (a stand-in engine in a real worker), and the refusals.
No GPU."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from mtplab.studies.peers import side_by_side as peer
from mtplab.studies.peers import peer_plan
from mtplab.studies.peers.peer_plan import Cell, Workload, plan
from tests.sglang_fixtures import sglang_module
from tests.helpers import overlap_trace

WL = Workload(prompt_len=16, new_tokens=9, repeats=3, warmup_tokens=4, profile_steps=0)
GEMMA = "gemma4-31b-like@6"            # the Frozen-KV cells' shape (Gemma's 5:1 pattern)


def shape_of(draft: str) -> str:
    """A shape each draft runs on like for like (peer_plan.pair_problem)."""
    return GEMMA if peer_plan.frozen(draft) else "random-medium"


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    pytest.importorskip("transformers", reason="the Gemma-4 directories need transformers")
    root = tmp_path_factory.mktemp("models")
    peer_plan.write_model_dirs(root, plan(["random-medium", GEMMA], list(peer_plan.DRAFTS),
                                          ["on"], [1]))
    return root


# ------------------------------------------------------------------ what each engine gets
@pytest.mark.parametrize("draft", list(peer_plan.DRAFTS))
@pytest.mark.parametrize("overlap", ["on", "off"])
def test_both_engines_get_the_same_knobs_by_sglangs_parser(models, draft, overlap):
    """The SGLang arguments of a group, parsed by SGLang's own prepare_server_args (device cpu:
    0.5.17's checks for cuda ask the GPU for its memory), say what mtplab's RunConfig says."""
    sa = sglang_module("sglang.srt.server_args")
    g = plan([shape_of(draft)], [draft], [overlap], [1, 8, 32])[0]
    launch = peer_plan.sglang_launch(g, WL, models, 0.3)
    knobs = peer_plan.mtplab_knobs(g, WL)
    argv = list(launch.argv)
    argv[argv.index("--device") + 1] = "cpu"
    a = sa.prepare_server_args(argv)
    spec = knobs["draft"] != "none"
    algo = {"none": None, "eagle": "EAGLE", "frozen_kv_mtp": "FROZEN_KV_MTP"}[knobs["draft"]]
    assert a.speculative_algorithm == algo
    if spec:
        assert (a.speculative_num_steps, a.speculative_eagle_topk,
                a.speculative_num_draft_tokens) == (knobs["num_steps"], knobs["topk"],
                                                    knobs["num_draft_tokens"])
        assert float(launch.env["SGLANG_SIMULATE_ACC_LEN"]) == knobs["simulate_accept_len"]
        assert launch.env["SGLANG_SIMULATE_ACC_METHOD"] == "match-expected"
    else:
        assert launch.env == {}
    assert a.page_size == knobs["page_size"] and a.random_seed == knobs["seed"]
    assert a.max_running_requests == knobs["max_running_requests"] == 32
    assert a.cuda_graph_max_bs_decode == knobs["cuda_graph_max_bs"] == 32
    # the graphs captured: exactly the sizes the cells run (decode bs, prefill bs * prompt)
    assert a.cuda_graph_config.decode.bs == [1, 8, 32]
    assert a.cuda_graph_config.prefill.bs == [WL.prompt_len * b for b in (1, 8, 32)]
    assert ("--disable-overlap-schedule" in argv) == (not knobs["overlap"])
    if not knobs["overlap"]:       # (on CPU SGLang itself turns overlap off for spec decoding)
        assert a.disable_overlap_schedule
    assert a.attention_backend == knobs["attention_backend"] == "triton"
    assert knobs["cuda_graphs"] and "--cuda-graph-backend-decode" not in argv
    assert a.skip_tokenizer_init and a.disable_radix_cache
    assert a.load_format == "dummy" and (not spec or a.speculative_draft_load_format == "dummy")
    assert (a.sampling_backend, a.grammar_backend) == ("pytorch", "none")


def sglang_configs(g, models):
    """SGLang's ServerArgs and the ModelConfigs of the target and the draft of group `g`, by
    SGLang's own parser (device cpu: 0.5.17's checks for cuda ask the GPU for its memory)."""
    sa = sglang_module("sglang.srt.server_args")
    mc = sglang_module("sglang.srt.configs.model_config")
    argv = list(peer_plan.sglang_launch(g, WL, models, 0.3).argv)
    argv[argv.index("--device") + 1] = "cpu"
    a = sa.prepare_server_args(argv)
    t = mc.ModelConfig.from_server_args(a)
    d = None if a.speculative_draft_model_path is None else mc.ModelConfig.from_server_args(
        a, model_path=a.speculative_draft_model_path, is_draft_model=True)
    return a, t, d


def sglang_kv_configurator(a, t, window):
    """SGLang's own KV-cache configurator for the target (what the scheduler runs at start,
    after loading the weights): SimpleNamespace stands in for the parallel state, the model for
    nothing (the configurator reads only the configs)."""
    import types

    import torch
    kvm = sglang_module("sglang.srt.mem_cache.kv_cache_configurator")
    si = sglang_module("sglang.srt.speculative.spec_info")
    aux = sglang_module("sglang.srt.model_executor.model_runner_components.spec_aux_hidden_state")
    return kvm.KVCacheConfigurator(
        device="cpu", gpu_id=0, ps=types.SimpleNamespace(attn_dp_size=1, pp_size=1),
        pp_group=None, model=None, model_config=t, server_args=a, kv_cache_dtype=torch.bfloat16,
        kv_cache_dtype_str="auto", model_dtype=t.dtype, page_size=a.page_size,
        sliding_window_size=window,
        spec_algorithm=si.SpeculativeAlgorithm.from_string(a.speculative_algorithm),
        is_draft_worker=False, post_capture_kv_active=False,
        spec_aux_config=aux.SpecAuxHiddenStateConfig(), is_hybrid_swa=t.is_hybrid_swa,
        is_hybrid_swa_compress=t.is_hybrid_swa_compress, use_mla_backend=False, layer_info=None,
        forward_stream=None, req_to_token_pool=None, token_to_kv_pool_allocator=None,
        memory_pool_config=None)


def sglang_target_pool(a, t, window):
    """The configurator sizing the target's pool in 8 GiB."""
    pc = sglang_module("sglang.srt.model_executor.pool_configurator")
    rc = sglang_module("sglang.srt.runtime_context")
    kvc = sglang_kv_configurator(a, t, window)
    with rc.get_parallel().override(attn_tp_size=1):
        return pc.create_memory_pool_configurator(kvc).calculate_pool_sizes(8 << 30, a.page_size)


def sglang_hybrid_pool(a, t, window, full_tokens: int, swa_tokens: int):
    """The configurator building the target's hybrid sliding-window KV pool (on CPU, the
    server args published as the scheduler publishes them, then cleared)."""
    rc = sglang_module("sglang.srt.runtime_context")
    mp = sglang_module("sglang.srt.mem_cache.memory_pool")
    kvc = sglang_kv_configurator(a, t, window)
    rc.publish(a, role="test")
    try:
        with rc.get_parallel().override(attn_tp_size=1):
            return kvc._build_hybrid_swa_kv_pool(full_max_total_num_tokens=full_tokens,
                                                 swa_max_total_num_tokens=swa_tokens,
                                                 mha_pool_class=mp.MHATokenToKVPool)
    finally:
        rc.reset_context()


def sglang_assistant_layers(mtp, t, d, target_layers: int, n: int) -> list[int]:
    """The target layer each of the assistant's `n` layers reads, by SGLang's own Frozen-KV
    layer map (`mtp`: sglang.srt.models.gemma4_mtp; t, d: the target's and draft's configs)."""
    import types
    layers = [types.SimpleNamespace(self_attn=types.SimpleNamespace(is_kv_shared_layer=False))
              for _ in range(target_layers)]
    ctx = mtp.Gemma4AssistantForCausalLM.build_frozen_kv_mtp_context(
        types.SimpleNamespace(config=d.hf_config),
        types.SimpleNamespace(config=t.hf_config, model=types.SimpleNamespace(layers=layers)),
        None)
    return [ctx.physical_layer_ids[i] for i in range(n)]


@pytest.mark.parametrize("draft", ["eagle", "target"])
def test_sglang_loads_the_llama_shape_mtplab_builds(models, draft):
    """SGLang's ModelConfig of the Llama target (and EAGLE draft) against mtplab's preset."""
    from mtplab.models.zoo import model_config
    g = plan(["random-medium"], [draft], ["off"], [1])[0]
    a, t, d = sglang_configs(g, models)
    c = model_config("random-medium")
    assert (t.hidden_size, t.num_hidden_layers, t.num_attention_heads, t.get_total_num_kv_heads(),
            t.head_dim, t.vocab_size) == (c.hidden_size, c.num_hidden_layers,
                                          c.num_attention_heads, c.num_key_value_heads,
                                          c.head_dim, c.vocab_size)
    assert t.hf_text_config.intermediate_size == c.intermediate_size
    assert str(t.dtype) == f"torch.{peer_plan.mtplab_knobs(g, WL)['dtype']}"
    assert not t.is_hybrid_swa
    if draft == "eagle":
        assert d.hf_config.architectures == ["LlamaForCausalLMEagle"]
        assert d.hidden_size == c.hidden_size and d.num_hidden_layers == 1
    else:
        assert d is None


@pytest.mark.parametrize("draft", ["frozen", "target", "frozen-k4p16"])
def test_sglang_loads_and_sizes_the_gemma_shape_mtplab_builds(models, draft):
    """The Gemma-4 directories through SGLang's own parser, ModelConfig, Frozen-KV layer map
    and KV-pool configurator: the layer types, window, heads and sizes of mtplab's preset, the
    assistant's layers reading the target layers mtplab's read, and a pool SGLang can size
    (its hybrid sliding-window pool asserts at least one sliding layer)."""
    import types

    from mtplab.models.zoo import assistant_config, model_config
    g4 = sglang_module("sglang.srt.models.gemma4_causal")
    mtp = sglang_module("sglang.srt.models.gemma4_mtp")
    g = plan([GEMMA], [draft], ["on"], [8])[0]
    a, t, d = sglang_configs(g, models)
    c = model_config(GEMMA)
    assert t.hf_config.architectures == ["Gemma4ForCausalLM"]
    assert (t.hidden_size, t.num_hidden_layers, t.num_attention_heads, t.vocab_size) == (
        c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.vocab_size)
    assert t.hf_text_config.intermediate_size == c.intermediate_size
    assert list(t.hf_text_config.layer_types) == list(c.layer_types)
    full = [i for i, x in enumerate(c.layer_types) if x == "full_attention"]
    assert (t.swa_attention_layer_ids, t.full_attention_layer_ids) == (
        [i for i in range(c.num_hidden_layers) if i not in full], full)
    # both layer types: mtplab's one head_dim and KV-head count (SGLang: base = full, swa_*)
    assert (t.head_dim, t.swa_head_dim, t.get_num_kv_heads(1), t.get_swa_num_kv_heads(1)) == (
        c.head_dim, c.head_dim, c.num_key_value_heads, c.num_key_value_heads)
    window = g4.Gemma4ForCausalLM.get_attention_sliding_window_size(
        types.SimpleNamespace(config=t.hf_text_config))
    assert window + 1 == c.sliding_window       # SGLang's exclusive bound, mtplab's window
    pool = sglang_target_pool(a, t, window)
    assert pool.full_max_total_num_tokens > 8 * WL.context_len
    assert pool.swa_max_total_num_tokens > 8 * (c.sliding_window + 1)
    # ... and builds: its Gemma-4 pool reads the sliding layers' KV heads by SGLang's name
    # (swa_num_key_value_heads; the H100 run that lacked it died here), one pool per layer type
    # of mtplab's heads and head_dim
    kv = sglang_hybrid_pool(a, t, window, full_tokens=64, swa_tokens=32)
    sliding = c.num_hidden_layers - len(full)
    assert (len(kv.full_kv_pool.k_buffer), len(kv.swa_kv_pool.k_buffer)) == (len(full), sliding)
    for buf in (kv.full_kv_pool.k_buffer[0], kv.swa_kv_pool.k_buffer[0]):
        assert tuple(buf.shape[1:]) == (c.num_key_value_heads, c.head_dim)
    if draft == "target":
        assert d is None
        return
    ac = assistant_config(c)
    assert d.hf_config.architectures == ["Gemma4AssistantForCausalLM"]
    assert (d.hidden_size, d.hf_text_config.intermediate_size) == (ac.hidden_size,
                                                                   ac.intermediate_size)
    assert sglang_assistant_layers(mtp, t, d, c.num_hidden_layers, ac.num_layers) == \
        ac.kv_layers


def test_sglang_maps_the_gemma4_assistant_kind_as_mtplab_builds_it(tmp_path):
    """`draft=gemma4_assistant` directories: SGLang's layer map sends its three sliding layers
    to the target's last sliding layer and its full one to the last full layer, as mtplab's
    Gemma-4 assistant reads them, at its width and FFN."""
    from mtplab.draft_kinds import DRAFT_KINDS
    from mtplab.models.zoo import model_config
    from mtplab.sglang.models import write_gemma4_frozen_dirs
    pytest.importorskip("transformers", reason="the Gemma-4 directories need transformers")
    mtp = sglang_module("sglang.srt.models.gemma4_mtp")
    g = plan([GEMMA], ["frozen"], ["on"], [8])[0]
    target, _ = peer_plan.model_dirs(tmp_path, GEMMA, "frozen")
    write_gemma4_frozen_dirs(target.parent, model=GEMMA, draft="gemma4_assistant")
    _, t, d = sglang_configs(g, tmp_path)
    c = model_config(GEMMA)
    ac = DRAFT_KINDS["gemma4_assistant"].assistant_config(c)
    assert ac.kv_layers == [4, 4, 4, 5]
    assert (d.hidden_size, d.num_hidden_layers, d.hf_text_config.intermediate_size) == (
        ac.hidden_size, ac.num_layers, ac.intermediate_size)
    assert sglang_assistant_layers(mtp, t, d, c.num_hidden_layers, ac.num_layers) == \
        ac.kv_layers
    with pytest.raises(ValueError, match="'eagle' is not a Frozen-KV draft"):
        write_gemma4_frozen_dirs(tmp_path / "x", model=GEMMA, draft="eagle")


def test_sglang_refuses_a_gemma4_target_without_sliding_layers(models, tmp_path):
    """The check above has teeth: the same target with every layer full attention (what the
    directories held before: the first H100 run's 'Hybrid SWA model must have at least one
    SWA layer') fails SGLang's pool configurator; the grid leaves such a pair out."""
    import shutil
    g = plan([GEMMA], ["frozen"], ["on"], [8])[0]
    shutil.copytree(models, tmp_path / "m")
    target, _ = peer_plan.model_dirs(tmp_path / "m", GEMMA, "frozen")
    doc = json.loads((target / "config.json").read_text())
    doc["layer_types"] = ["full_attention"] * doc["num_hidden_layers"]
    (target / "config.json").write_text(json.dumps(doc))
    a, t, _ = sglang_configs(g, tmp_path / "m")
    with pytest.raises(AssertionError, match="at least one SWA layer"):
        sglang_target_pool(a, t, doc["sliding_window"] - 1)
    why = peer_plan.pair_problem("llama3-8b-like@8", "frozen")
    assert "Hybrid SWA model must have at least one SWA layer" in why
    assert "gemma4-31b-like@6" in why


def test_both_engines_get_the_same_prompts():
    """The prompts of a cell: fixed by shape, bs and repeat (the same for every draft and
    overlap arm), fresh per repeat, bs of them, in [VOCAB_FLOOR, vocab)."""
    a = peer_plan.prompts(Cell("s", "eagle", "on", 8), 0, WL, 100)
    assert a == peer_plan.prompts(Cell("s", "frozen", "off", 8), 0, WL, 100)
    assert a != peer_plan.prompts(Cell("s", "eagle", "on", 8), 1, WL, 100)
    assert len(a) == 8 and {len(p) for p in a} == {WL.prompt_len}
    assert min(map(min, a)) >= peer_plan.VOCAB_FLOOR and max(map(max, a)) < 100


def test_a_group_serves_every_bs_at_its_largest():
    gs = plan(["random-medium", "llama3-8b-like@8"], ["target", "eagle"], ["on", "off"],
              [8, 1, 32, 8])
    assert len(gs) == 8 and gs[0].bs == (8, 1, 32) and gs[0].max_bs == 32
    assert [(g.shape, g.draft, g.overlap) for g in gs[:3]] == [
        ("random-medium", "target", "on"), ("random-medium", "target", "off"),
        ("random-medium", "eagle", "on")]
    assert [c.bs for c in gs[0].cells()] == [8, 1, 32]
    assert all(peer_plan.group_knobs(g, WL)["max_running_requests"] == 32 for g in gs)
    with pytest.raises(ValueError, match="unknown draft 'medusa'"):
        plan(["random-medium"], ["medusa"], ["on"], [1])
    with pytest.raises(ValueError, match="unknown overlap"):
        plan(["random-medium"], ["eagle"], ["yes"], [1])


def test_pairs_run_in_the_order_given():
    """--pairs: (shape, draft) pairs in their own order (not shape-major), each with every
    overlap; a pair SGLang cannot run like for like is left out with its reason."""
    pairs = [("llama3-8b-like@32", "eagle"), (GEMMA, "frozen"), ("random-medium", "eagle"),
             ("llama3-8b-like@32", "frozen"), (GEMMA, "frozen")]
    gs = plan([], [], ["on", "off"], [8, 32], pairs)
    assert [(g.shape, g.draft, g.overlap) for g in gs] == [
        ("llama3-8b-like@32", "eagle", "on"), ("llama3-8b-like@32", "eagle", "off"),
        (GEMMA, "frozen", "on"), (GEMMA, "frozen", "off"),
        ("random-medium", "eagle", "on"), ("random-medium", "eagle", "off")]
    assert [(s, d) for s, d, _ in peer_plan.left_out(pairs=pairs)] == [
        ("llama3-8b-like@32", "frozen")]
    with pytest.raises(ValueError, match="unknown draft 'medusa'"):
        plan([], [], ["on"], [1], [("random-medium", "medusa")])


def test_the_grid_leaves_out_the_pairs_sglang_cannot_run_like_for_like():
    """Frozen-KV cells run on the Gemma-pattern shape (a Gemma-4 target SGLang sizes as hybrid
    sliding-window), EAGLE cells on full-attention shapes (SGLang's Llama target), target-only
    on both; the rest is named with its reason, and a grid of nothing but such pairs is one
    error."""
    gs = plan(["llama3-8b-like@8", GEMMA], ["eagle", "frozen", "target"], ["on"], [8])
    assert [(g.shape, g.draft) for g in gs] == [
        ("llama3-8b-like@8", "eagle"), ("llama3-8b-like@8", "target"), (GEMMA, "frozen"),
        (GEMMA, "target")]
    out = peer_plan.left_out(["llama3-8b-like@8", GEMMA], ["eagle", "frozen", "target"])
    assert [(s, d) for s, d, _ in out] == [("llama3-8b-like@8", "frozen"), (GEMMA, "eagle")]
    assert "EAGLE runs over a Llama target" in out[1][2]
    assert peer_plan.model_dirs(Path("m"), GEMMA, "target") == (
        Path("m/gemma4-31b-like-6/gemma4/target"), None)
    assert peer_plan.pair_problem("gemma4-31b-like@7", "frozen").startswith(
        "its last two layers are ['full_attention', 'full_attention']")
    with pytest.raises(ValueError, match=r"no cell of this grid .*random-medium\|frozen: it has "
                                         "no sliding-window layer"):
        plan(["random-medium"], ["frozen"], ["on"], [1])
    assert set(peer_plan.SHAPES) >= {"random-medium", "llama3-8b-like@8", "llama3-8b-like@32"}
    assert any(peer_plan.pair_problem(s, "frozen") is None for s in peer_plan.SHAPES)


# ------------------------------------------------------------------ stand-in engines
class FakeArm:
    """An engine in this process: `tok_s` tokens per second (a list: one per repeat), a log of
    every request (shared `calls`), and failures on demand."""

    def __init__(self, side, calls, tok_s=(1000.0,), fail_start=None, fail_run_at=None,
                 tokens_short=False, clock=None, run_s=0.0):
        self.side, self.calls, self.tok_s = side, calls, list(tok_s)
        self.fail_start, self.fail_run_at, self.short = fail_start, fail_run_at, tokens_short
        self.clock, self.run_s = clock, run_s
        self.n_long = 0
        self.closed = self.killed = False

    def request(self, msg, timeout):
        self.calls.append((self.side, msg["op"], msg.get("new_tokens"),
                           len(msg.get("prompts", ()))))
        if self.clock is not None:
            self.clock.t += self.run_s
            if self.clock.t > self.clock.end:
                raise peer.Deadline("fake deadline")
        if msg["op"] == "start":
            if self.fail_start:
                raise peer.ArmError(self.side, self.fail_start)
            return {"info": {}}
        if msg["op"] == "profile":
            return {"trace": None, "meter": {"bubble_frac": 0.25}}
        bs, n = len(msg["prompts"]), msg["new_tokens"]
        if n > 1 and n != WL.warmup_tokens:          # a timed run
            if self.fail_run_at is not None and self.n_long == self.fail_run_at:
                raise peer.ArmError(self.side, "CUDA error: an illegal memory access")
            rate = self.tok_s[min(self.n_long, len(self.tok_s) - 1)]
            self.n_long += 1
        else:
            rate = 1000.0
        tokens = [n - (1 if self.short and n > 1 else 0)] * bs
        return {"wall_s": bs * n / rate, "tokens": tokens, "decode_steps": n - 1,
                "accept_len": 2.5}

    def close(self):
        self.closed = True

    def kill(self):
        self.killed = True


class Clock:
    def __init__(self, end=float("inf")):
        self.t, self.end = 0.0, end

    def __call__(self):
        return self.t


def run(tmp_path, groups, arms_of, wl=WL, deadline=float("inf"), clock=None, reserve=0.0):
    res = peer.Results.open(tmp_path / "results.json", wl)
    started = []

    def start_arm(side, g, launch, knobs):
        arm = arms_of(side, g)
        started.append((side, g.name))
        return arm

    peer.run_groups(groups, wl, res, start_arm, lambda c: 1000, deadline, reserve, None,
                    tmp_path / "models", 0.3, say=lambda *_: None,
                    clock=clock or Clock())
    return res, started


@pytest.fixture
def groups():
    return plan(["random-medium"], ["eagle"], ["on"], [1, 8])


def test_arms_alternate_and_the_ratio_is_taken_per_repeat(tmp_path, groups):
    calls = []
    tok = {"mtplab": [3000.0, 1000.0, 2000.0], "sglang": [1000.0, 1000.0, 1000.0]}
    res, _ = run(tmp_path, groups, lambda side, g: FakeArm(side, calls, tok[side]),
                 wl=WL)
    rec = res.cells["random-medium|eagle|overlap-on|bs1"]
    assert rec["status"] == "ok" and rec["order"] == [["mtplab", "sglang"],
                                                      ["sglang", "mtplab"],
                                                      ["mtplab", "sglang"]]
    assert rec["ratio"]["repeats"] == pytest.approx([3.0, 1.0, 2.0])
    assert rec["ratio"]["median"] == pytest.approx(2.0)
    assert (rec["ratio"]["min"], rec["ratio"]["max"]) == pytest.approx((1.0, 3.0))
    assert rec["mtplab"]["tok_s"] == pytest.approx(2000.0)
    # TPOT = (t_n - t_1) / (n - 1); step = (t_n - t_1) / decode steps (= n - 1 here)
    m = rec["repeats"][0]["mtplab"]
    assert m["ttft_s"] == pytest.approx(1 / 1000.0)
    assert rec["mtplab"]["tpot_p50_ms"] == pytest.approx(
        1e3 * (9 / 2000.0 - 1 / 1000.0) / 8)
    timed = [c for c in calls if c[1] == "run" and c[2] == WL.new_tokens]
    # repeat by repeat, each arm's prefill-only run comes right before its timed run
    runs = [c for c in calls if c[1] == "run"][4:]            # after both warm-ups
    assert [c[2] for c in runs[:4]] == [1, WL.new_tokens, 1, WL.new_tokens]
    assert [c[0] for c in timed[:6]] == ["mtplab", "sglang", "sglang", "mtplab", "mtplab",
                                         "sglang"]


def test_one_engine_start_serves_every_bs_and_warmup_is_not_timed(tmp_path, groups):
    calls = []
    res, started = run(tmp_path, groups, lambda side, g: FakeArm(side, calls))
    assert started == [("sglang", groups[0].name), ("mtplab", groups[0].name)]  # SGLang first
    assert sorted(res.cells) == ["random-medium|eagle|overlap-on|bs1",
                                 "random-medium|eagle|overlap-on|bs8"]
    assert all(r["max_running_requests"] == 8 for r in res.cells.values())
    first = [c for c in calls if c[1] == "run"][:4]
    assert [c[2] for c in first] == [WL.warmup_tokens, 1, WL.warmup_tokens, 1]


def test_a_finished_cell_is_written_at_once_and_skipped_on_resume(tmp_path, groups):
    calls = []
    clock = Clock(end=80.0)
    # every request costs 2 s of the fake clock: the starts and the first cell (16 requests)
    # end at 36 s; the second cell would take as long, more than the 44 s left allow
    res, _ = run(tmp_path, groups,
                 lambda side, g: FakeArm(side, calls, clock=clock, run_s=2.0),
                 deadline=80.0, clock=clock)
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert list(on_disk["cells"]) == ["random-medium|eagle|overlap-on|bs1"]
    assert peer.missing(res, groups) == ["random-medium|eagle|overlap-on|bs8"]
    calls.clear()
    res2, started = run(tmp_path, groups, lambda side, g: FakeArm(side, calls))
    assert len(started) == 2 and peer.missing(res2, groups) == []
    assert {c[3] for c in calls if c[1] == "run"} == {8}          # only the missing cell ran
    assert res2.cells["random-medium|eagle|overlap-on|bs1"] == on_disk["cells"][
        "random-medium|eagle|overlap-on|bs1"]                     # untouched


def test_the_deadline_kills_the_engines_and_starts_no_group(tmp_path):
    gs = plan(["random-medium"], ["eagle", "target"], ["on"], [1])
    arms = []

    def mk(side, g):
        arms.append(FakeArm(side, [], clock=clock, run_s=10.0))
        return arms[-1]

    clock = Clock(end=45.0)
    res, started = run(tmp_path, gs, mk, deadline=45.0, clock=clock, reserve=5.0)
    assert res.cells == {} and len(started) == 2          # the second group never started
    assert all(a.killed for a in arms)
    assert peer.missing(res, gs) == [c.cell_id for g in gs for c in g.cells()]


def test_no_group_starts_without_the_time_its_predecessors_took(tmp_path):
    """The first group (two starts, 4 warm-up and 12 timed requests at 1 s each: 18 s) fits;
    12 s remain, more than the 5 s reserve but less than the first group took: the second
    group is not started."""
    gs = plan(["random-medium"], ["eagle", "target"], ["on"], [1])
    clock = Clock()
    res, started = run(tmp_path, gs, lambda side, g: FakeArm(side, [], clock=clock, run_s=1.0),
                       deadline=30.0, clock=clock, reserve=5.0)
    assert list(res.cells) == ["random-medium|eagle|overlap-on|bs1"] and len(started) == 2


def test_an_engine_that_cannot_start_says_so_for_every_cell(tmp_path, groups):
    msg = "ValueError: speculative_eagle_topk > 1 is not supported with page_size > 1"
    calls = []
    res, started = run(tmp_path, groups, lambda side, g: FakeArm(
        side, calls, fail_start=msg if side == "sglang" else None))
    assert started == [("sglang", groups[0].name)]         # mtplab was not started
    for rec in res.cells.values():
        assert (rec["status"], rec["failed_side"], rec["message"]) == ("failed", "sglang", msg)
    table = peer.cell_table(list(res.cells.values()))
    assert f"SGLang cannot run this cell: {msg}" in table
    assert all(ln.count("|") == 16 for ln in table.splitlines() if ln.startswith("| random"))
    _, again = run(tmp_path, groups, lambda side, g: FakeArm(side, calls))
    assert again == []                                  # a failed cell is finished ...
    res = peer.Results.open(tmp_path / "results.json", WL)
    peer.run_groups(groups, WL, res, lambda side, g, la, kn: FakeArm(side, calls),
                    lambda c: 1000, float("inf"), 0.0, None, tmp_path / "models", 0.3,
                    say=lambda *_: None, retry_failed=True)
    assert {r["status"] for r in res.cells.values()} == {"ok"}    # ... unless retried


def test_unequal_outputs_fail_the_cell(tmp_path, groups):
    res, _ = run(tmp_path, groups, lambda side, g: FakeArm(side, [],
                                                            tokens_short=side == "sglang"))
    rec = res.cells["random-medium|eagle|overlap-on|bs1"]
    assert rec["status"] == "failed" and rec["failed_side"] == "sglang"
    assert "not 9 for each of the 1 requests" in rec["message"]
    assert "random-medium|eagle|overlap-on|bs8" not in res.cells     # the group stopped there


def test_a_run_failure_is_recorded_with_the_engines_message(tmp_path, groups):
    res, _ = run(tmp_path, groups, lambda side, g: FakeArm(
        side, [], fail_run_at=1 if side == "mtplab" else None))
    rec = res.cells["random-medium|eagle|overlap-on|bs1"]
    assert rec["failed_side"] == "mtplab" and "illegal memory access" in rec["message"]


def test_table_only_reads_results_and_starts_nothing(tmp_path, groups, capsys, monkeypatch):
    run(tmp_path / "o", groups[:1], lambda side, g: FakeArm(side, []))
    monkeypatch.setattr(peer, "WorkerArm", None)          # any engine start would fail
    monkeypatch.setattr(peer_plan, "write_model_dirs", lambda *a: None)
    assert peer.main(["--out", str(tmp_path / "o"), "--shapes", "random-medium", "--drafts",
                      "eagle", "target", "--overlap", "on", "--bs", "1", "8", "--repeats", "3",
                      "--prompt-len", "16", "--new-tokens", "9", "--warmup-tokens", "4",
                      "--profile-steps", "0", "--table-only"]) == 0
    out = capsys.readouterr().out
    assert "| random-medium | eagle | on | 1 | 1000 |" in out
    assert "not run yet (2): random-medium|target|overlap-on|bs1, random-medium|target|" \
           "overlap-on|bs8" in out
    assert (tmp_path / "o" / "table.md").read_text().strip() == out.strip()


def test_resume_refuses_another_workload(tmp_path, groups):
    run(tmp_path, groups, lambda side, g: FakeArm(side, []))
    with pytest.raises(ValueError, match="holds cells of another workload"):
        peer.Results.open(tmp_path / "results.json", Workload(new_tokens=64))


def test_tables_show_both_engines_and_the_overlap_direction(tmp_path):
    gs = plan(["random-medium"], ["eagle"], ["on", "off"], [1])
    tok = {("on", "mtplab"): 1200.0, ("off", "mtplab"): 1000.0,
           ("on", "sglang"): 800.0, ("off", "sglang"): 1000.0}
    res, _ = run(tmp_path, gs, lambda side, g: FakeArm(side, [], [tok[(g.overlap, side)]]))
    text = peer.tables(res, gs)
    assert "| random-medium | eagle | on | 1 | 1200 | 800 | 1.50x [1.50-1.50] |" in text
    assert "| random-medium | eagle | 1 | 1.20x | 0.80x | no |" in text
    assert peer.agreement(1, 1) == "yes" and peer.agreement(0, -1) == "mtplab within noise"
    assert peer.agreement(0, 0) == "both within noise"


def test_profiled_traces_are_analysed(tmp_path, groups):
    """Each engine's profiled trace goes through mtplab's analyser (bubble, top causes)."""
    from tests.sglang_ref.test_sglang_adapter import sglang_steps_trace

    class Traced(FakeArm):
        def request(self, msg, timeout):
            if msg["op"] == "profile":
                d = Path(msg["dir"])
                d.mkdir(parents=True)
                return {"trace": str(sglang_steps_trace(d / "x.trace.json.gz")), "meter": {}}
            return super().request(msg, timeout)

    wl = Workload(prompt_len=16, new_tokens=9, repeats=1, warmup_tokens=4, profile_steps=5)
    res = peer.Results.open(tmp_path / "results.json", wl)
    peer.run_groups(groups[:1], wl, res, lambda side, g, la, kn: Traced(side, []),
                    lambda c: 1000, float("inf"), 0.0, tmp_path / "traces",
                    tmp_path / "models", 0.3, say=lambda *_: None)
    p = res.cells["random-medium|eagle|overlap-on|bs1"]["profile"]
    for side in ("mtplab", "sglang"):
        assert 0 < p[side]["bubble_frac"] < 1 and p[side]["top"]
        assert (Path(p[side]["trace"]).parent / "analysis" / "summary.json").is_file()


# ------------------------------------------------------------------ real worker processes
def worker(tmp_path, **config) -> peer.WorkerArm:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                        os.environ.get("PYTHONPATH", "")])}
    return peer.WorkerArm("sglang", config, env, tmp_path / "logs" / "w.log",
                          worker="tests.peer_fakes:FakeSide")


def test_a_worker_process_answers_and_closes(tmp_path):
    w = worker(tmp_path, tok_s=500.0)
    try:
        assert w.request({"op": "start"}, 60)["info"] == {"engine": "fake"}
        r = w.request({"op": "run", "prompts": [[1, 2]] * 4, "new_tokens": 5}, 60)
        assert r["tokens"] == [5] * 4 and r["wall_s"] == pytest.approx(20 / 500.0)
    finally:
        w.close()
    assert w.proc.returncode == 0


def test_a_worker_that_cannot_start_gives_its_engines_own_message(tmp_path):
    w = worker(tmp_path, fail_start="topk > 1 with page_size > 1 is not supported")
    try:
        with pytest.raises(peer.ArmError) as e:
            w.request({"op": "start"}, 60)
    finally:
        w.close()
    assert e.value.message == ("ValueError: topk > 1 with page_size > 1 is not supported "
                               "[RuntimeError: Initialization failed. Please see the error "
                               "messages above.]")


def test_a_hanging_worker_is_killed_at_the_deadline(tmp_path):
    w = worker(tmp_path, hang_op="run")
    try:
        w.request({"op": "start"}, 60)
        with pytest.raises(peer.Deadline):
            w.request({"op": "run", "prompts": [[1]], "new_tokens": 2}, 1.0)
    finally:
        w.kill()
    assert w.proc.poll() is not None


# ------------------------------------------------------------------ the command line
@pytest.mark.parametrize("argv,message", [
    (["--shapes", "no-such-shape"], "unknown model 'no-such-shape'"),
    (["--bs", "0"], "batch sizes must be >= 1"),
    (["--new-tokens", "1"], "--new-tokens must be >= 2"),
    (["--mem-fraction", "1.5"], "--mem-fraction must lie in (0, 1)"),
    (["--deadline-s", "0"], "--deadline-s must be > 0"),
    (["--pairs", "random-medium"], "--pairs takes SHAPE:DRAFT"),
    (["--pairs", "random-medium:medusa"], "unknown draft 'medusa'"),
])
def test_bad_arguments_are_one_line(tmp_path, capsys, argv, message):
    assert peer.main(["--out", str(tmp_path / "o"), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "o" / "results.json").exists()


def test_an_unknown_draft_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as e:
        peer.main(["--out", "x", "--drafts", "medusa"])
    assert e.value.code == 2 and "invalid choice: 'medusa'" in capsys.readouterr().err


def test_dry_run_prints_both_configurations(tmp_path, capsys):
    pytest.importorskip("transformers", reason="the Gemma-4 directories need transformers")
    assert peer.main(["--out", str(tmp_path / "o"), "--dry-run", "--shapes", "random-medium",
                      GEMMA, "--drafts", "eagle", "frozen", "--overlap", "off", "--bs", "1",
                      "8"]) == 0
    out = capsys.readouterr().out
    assert out.count("\nmtplab: ") == 2 and out.count("\nsglang: ") == 2
    assert "SGLANG_SIMULATE_ACC_LEN=2.5" in out and "'--disable-overlap-schedule'" in out
    assert "# left out: random-medium|frozen: it has no sliding-window layer" in out
    assert "# left out: gemma4-31b-like@6|eagle: " in out
    assert (tmp_path / "o" / "models" / "gemma4-31b-like-6" / "gemma4" / "assistant" /
            "config.json").is_file()
    assert peer.main(["--out", str(tmp_path / "p"), "--dry-run", "--pairs", f"{GEMMA}:eagle",
                      "random-medium:target", "--overlap", "on", "--bs", "1"]) == 0
    out = capsys.readouterr().out
    assert out.count("\nmtplab: ") == 1 and "# random-medium_target_overlap-on" in out
    assert "# left out: gemma4-31b-like@6|eagle: " in out


def test_the_harness_runs_as_a_module(tmp_path):
    """`python -m benchmarks.bench_peer_sglang --help` from a fresh process."""
    import subprocess
    r = subprocess.run([sys.executable, "-m", "benchmarks.bench_peer_sglang", "--help"],
                       capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).resolve().parents[2])
    assert r.returncode == 0 and "--deadline-s" in r.stdout


@pytest.mark.slow
def test_a_cell_with_mtplab_engines_in_real_workers(tmp_path):
    """measure_cell end to end with mtplab's worker side in both seats (random-tiny on CPU):
    the protocol, the timed runs, the profiled engine and its trace through the analyser."""
    knobs = dict(model="random-tiny", draft="eagle", num_steps=3, topk=1, num_draft_tokens=4,
                 simulate_accept_len=2.5, max_running_requests=2, context_len=64,
                 device="cpu", cuda_graphs=False, attention_backend="torch", dtype="float32")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                        os.environ.get("PYTHONPATH", "")])}
    arms = {side: peer.WorkerArm(side, {"knobs": knobs}, env, tmp_path / f"{side}.log",
                                 worker="mtplab") for side in peer.SIDES}
    wl = Workload(prompt_len=8, new_tokens=5, repeats=2, warmup_tokens=3, profile_steps=2)
    try:
        for a in arms.values():
            assert a.request({"op": "start"}, 300)["info"]["engine"] == "mtplab"
        rec = peer.measure_cell(Cell("random-tiny", "eagle", "on", 2), arms, wl, 300,
                                lambda: 600.0, tmp_path / "traces")
    finally:
        for a in arms.values():
            a.close()
    assert [a.proc.returncode for a in arms.values()] == [0, 0]
    for side in peer.SIDES:
        r = rec["repeats"][0][side]
        assert r["tokens"] == [5, 5] and r["decode_steps"] >= 1 and r["ttft_s"] > 0
        assert rec[side]["accept_len"] >= 1
        p = rec["profile"][side]
        assert p["trace"].endswith(".pt.trace.json.gz") and p["steps"] >= 1
        assert p["meter"]["meter_steps"] >= 1


def test_a_harness_error_fails_its_cell_not_the_run(tmp_path, groups):
    """A reply the harness cannot read (here: no wall time) fails that cell with the error;
    the next group still runs."""
    class Broken(FakeArm):
        def request(self, msg, timeout):
            ans = super().request(msg, timeout)
            return {k: v for k, v in ans.items() if k != "wall_s"}

    gs = plan(["random-medium"], ["eagle", "target"], ["on"], [1])
    res, started = run(tmp_path, gs, lambda side, g: (Broken if g.draft == "eagle" else FakeArm)(
        side, []))
    bad, good = res.cells["random-medium|eagle|overlap-on|bs1"], \
        res.cells["random-medium|target|overlap-on|bs1"]
    assert (bad["status"], bad["failed_side"]) == ("failed", "harness")
    assert bad["message"] == "KeyError: 'wall_s'" and good["status"] == "ok"
    assert "the harness cannot run this cell: KeyError" in peer.cell_table([bad])


def test_the_profiled_engine_is_freed_to_the_driver(monkeypatch, tmp_path):
    """After a cell's profiled run the second engine is gone and torch's cached blocks go back
    to the driver: the next cell's profiled engine checks the device's free memory beside the
    timed engine (an H100 cell at bs 32 failed that check with the previous engine's memory
    still cached)."""
    import weakref

    import torch

    import mtplab
    from mtplab.studies.peers.peer_worker import MtplabSide

    built, at_release = [], []

    class Recorded(mtplab.Engine):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            built.append(weakref.ref(self))

    monkeypatch.setattr(mtplab, "Engine", Recorded)
    monkeypatch.setattr(torch.cuda, "empty_cache",
                        lambda: at_release.append([r() is None for r in built]))
    side = MtplabSide({"knobs": dict(model="random-tiny", draft="eagle", num_steps=3, topk=1,
                                     num_draft_tokens=4, simulate_accept_len=2.5,
                                     max_running_requests=2, context_len=64, device="cpu",
                                     cuda_graphs=False, attention_backend="torch",
                                     dtype="float32")})
    side.start()
    try:
        side.profile([[5, 6, 7, 8]] * 2, 4, 2, str(tmp_path / "t"), 2)
    finally:
        side.close()
    assert at_release == [[False, True]]     # the timed engine alive, the profiled one gone


# ------------------------------------------------------------------ run-ahead and the report
@pytest.mark.parametrize("delay,want", [
    (0.0, dict(run_ahead_frac=1.0, launch_lead_p10_us=77.5, launch_lead_p50_us=91.5,
               launch_lead_p90_us=105.5, run_ahead_steps=2)),
    (100.0, dict(run_ahead_frac=0.0, launch_lead_p10_us=-61.0, launch_lead_p50_us=-61.0,
                 launch_lead_p90_us=-61.0, run_ahead_steps=2))])
def test_a_traces_run_ahead_is_the_analysers(tmp_path, delay, want):
    """As `mtplab analyze TRACE` reads it: its warm-up rule drops the first step, so the leads
    are 74 and 109 µs (back to back) and their percentiles numpy's linear rule's: p10 is
    74 + 0.1 * 35, p50 91.5, p90 74 + 0.9 * 35."""
    fig = peer.trace_figures(str(overlap_trace(tmp_path / "t.pt.trace.json", delay)))
    assert {k: fig[k] for k in want} == pytest.approx(want)


class KnownLeads(FakeArm):
    """A stand-in whose profiled trace has known leads: mtplab's runs ahead, SGLang's is
    held back by a host delay."""

    def request(self, msg, timeout):
        if msg["op"] == "start":
            return {"info": {"engine": self.side, "device": "NVIDIA H200", "torch": "2.11.0"}}
        if msg["op"] == "profile":
            d = Path(msg["dir"])
            d.mkdir(parents=True)
            trace = overlap_trace(d / "x.pt.trace.json",
                                      0.0 if self.side == "mtplab" else 100.0)
            return {"trace": str(trace), "meter": {"bubble_frac": 0.25}}
        return super().request(msg, timeout)


def known_leads_run(tmp_path, groups):
    """A grid run of groups[:1] with KnownLeads stand-ins (mtplab 2000 then 2100 tok/s,
    SGLang 1000) into tmp_path/o: (that folder, its Results)."""
    wl = Workload(prompt_len=16, new_tokens=9, repeats=2, warmup_tokens=4, profile_steps=5)
    out = tmp_path / "o"
    out.mkdir()
    res = peer.Results.open(out / "results.json", wl)
    tok = {"mtplab": [2000.0, 2100.0], "sglang": [1000.0, 1000.0]}
    peer.run_groups(groups[:1], wl, res, lambda side, g, la, kn: KnownLeads(side, [], tok[side]),
                    lambda c: 1000, float("inf"), 0.0, out / "traces", tmp_path / "models",
                    0.3, say=lambda *_: None)
    return out, res


def test_the_report_shows_each_engines_run_ahead(tmp_path, groups, monkeypatch, capsys):
    """A grid run with stand-ins (mtplab 2000 then 2100 tok/s, SGLang 1000), then --table-only
    --out-dir: the dated report of `peers` with the ratio, its noise and verdict and each
    engine's run-ahead, which `mtplab report peers` regenerates byte for byte."""
    from mtplab.studies import peers
    from mtplab.studies import reports as R
    from mtplab.studies.cli import main_report

    monkeypatch.setenv("MTP_GIT_COMMIT", "abc1234def")
    out, res = known_leads_run(tmp_path, groups)
    rec = res.cells["random-medium|eagle|overlap-on|bs1"]["profile"]
    assert rec["mtplab"]["launch_lead_p50_us"] == pytest.approx(91.5)
    assert rec["sglang"]["run_ahead_frac"] == 0.0
    monkeypatch.setattr(peer, "WorkerArm", None)          # any engine start would fail
    monkeypatch.setattr(peer_plan, "write_model_dirs", lambda *a: None)
    root = tmp_path / "results"
    argv = ["--out", str(out), "--shapes", "random-medium", "--drafts", "eagle", "--overlap",
            "on", "--bs", "1", "8", "--repeats", "2", "--prompt-len", "16", "--new-tokens", "9",
            "--warmup-tokens", "4", "--profile-steps", "5", "--table-only",
            "--out-dir", str(root)]
    assert peer.main(argv) == 0
    md = next((root / "peers").glob("*_h200_abc1234.md"))
    text = md.read_text()
    # bs 1: ratios 2.0 and 2.1 (median 2.05); noise: mtplab's (2100 - 2000) / 2050 = 4.9%
    assert ("| random-medium | eagle | on | 1 | 2050 | 1000 | 2.050x ±4.9%, pays | ") in text
    assert "| 100% (+78 / +92 / +106 µs) | 0% (-61 / -61 / -61 µs) |" in text
    answer = R.answer_line(md)
    # bs 8 runs after bs 1: the stand-in's last rate, 2100, in both repeats (noise the floor)
    assert answer.startswith("mtplab decodes at 2.05x to 2.10x SGLang's tok/s over 2 cells "
                             "(lowest 2.050x ±4.9%, pays, highest 2.100x ±2.0%, pays)")
    assert "faster in 2, slower in 0, within the noise in 0" in answer
    assert "SGLang's traces run ahead on 0% to 0% of their steps" in answer
    assert R.regenerate("peers", peers.render, root, check=True) == []
    assert main_report(["peers", "--root", str(root)]) == 0          # the index's row
    assert f"[{md.name}](peers/{md.name})" in (root / R.INDEX).read_text()


def test_a_tree_with_changes_is_refused_before_a_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MTP_GIT_COMMIT", "abc1234-dirty")
    monkeypatch.setattr(peer, "WorkerArm", None)          # any engine start would fail
    assert peer.main(["--out", str(tmp_path / "o"), "--shapes", "random-medium", "--drafts",
                      "eagle", "--out-dir", str(tmp_path / "r")]) == 2
    assert "one commit of a clean tree" in capsys.readouterr().err
    assert not (tmp_path / "o").exists() and not (tmp_path / "r").exists()


def test_reanalyze_reads_the_returned_traces_again(tmp_path, groups, monkeypatch, capsys):
    """--table-only --reanalyze: each cell's trace figures come again from OUT/traces/ by this
    checkout's analyser (a device run's traces, its recorded paths on the device), the meter's
    figures and the recorded path stay, and results.json keeps them."""
    out, res = known_leads_run(tmp_path, groups)
    cell = "random-medium|eagle|overlap-on|bs1"
    doc = json.loads((out / "results.json").read_text())
    sgl = doc["cells"][cell]["profile"]["sglang"]
    device_path = "/tmp/sgl/peer/traces/" + sgl["trace"].split("/traces/", 1)[1]
    sgl.update(trace=device_path, run_ahead_frac=0.5, launch_lead_p50_us=-3000.0)  # stale
    (out / "results.json").write_text(json.dumps(doc))
    monkeypatch.setattr(peer, "WorkerArm", None)          # any engine start would fail
    monkeypatch.setattr(peer_plan, "write_model_dirs", lambda *a: None)
    argv = ["--out", str(out), "--shapes", "random-medium", "--drafts", "eagle", "--overlap",
            "on", "--bs", "1", "8", "--repeats", "2", "--prompt-len", "16", "--new-tokens", "9",
            "--warmup-tokens", "4", "--profile-steps", "5", "--table-only", "--reanalyze"]
    assert peer.main(argv) == 0
    assert "re-read 4 traces" in capsys.readouterr().out
    got = json.loads((out / "results.json").read_text())["cells"][cell]["profile"]["sglang"]
    assert got["trace"] == device_path and got["meter"] == {"bubble_frac": 0.25}
    assert got["run_ahead_frac"] == 0.0 and got["launch_lead_p50_us"] == pytest.approx(-61.0)
    assert peer.main(argv[:-2] + ["--reanalyze"]) == 2       # without --table-only: refused
